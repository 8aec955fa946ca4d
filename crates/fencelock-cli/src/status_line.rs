//! The line a person at a terminal sees while `run --wait` waits: who holds the lock,
//! what is left of its lease, how long fencelock has waited, its place in a fair queue,
//! the Redlock nodes that restart protection leaves out. Redrawn in place every half
//! second on stderr; nothing at all when stderr is not a terminal, with `-q`, or with
//! `--json`.

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

use fencelock::{Client, Holder, HumanDuration, LockState, LockStatus};

use crate::{exit, ops};

/// How often the line is redrawn.
const EVERY: Duration = Duration::from_millis(500);

/// The status line of one wait, on stderr.
pub(crate) struct StatusLine<'a> {
    /// `None` when nothing is shown.
    client: Option<&'a Client>,
    name: &'a str,
    /// The holder info this run waits with, by which it finds its place in a fair queue.
    info: Option<String>,
    started: Instant,
    drawn: bool,
}

impl<'a> StatusLine<'a> {
    /// A status line for a wait on `name`; shown only for a wait, on a terminal.
    pub(crate) fn new(
        client: &'a Client,
        name: &'a str,
        wait: Duration,
        info: Option<String>,
    ) -> Self {
        let show =
            !wait.is_zero() && std::io::stderr().is_terminal() && !exit::json() && !exit::quiet();
        Self {
            client: show.then_some(client),
            name,
            info,
            started: Instant::now(),
            drawn: false,
        }
    }

    /// Waits half a second, then redraws the line (never returns if nothing is shown).
    ///
    /// Cancel safe: dropping it between redraws leaves the line as it was.
    pub(crate) async fn tick(&mut self) {
        let Some(client) = self.client else {
            return std::future::pending().await;
        };
        tokio::time::sleep(EVERY).await;
        let waited = HumanDuration(self.started.elapsed());
        let what = match tokio::time::timeout(EVERY, client.inspect(self.name)).await {
            Ok(Ok(status)) => self.describe(&status),
            Ok(Err(_)) | Err(_) => "Redis not answering".to_owned(),
        };
        let mut err = std::io::stderr().lock();
        let _ = write!(
            err,
            "\r\x1b[2Kfencelock: waiting for lock {:?} ({what}), waited {waited}",
            self.name
        );
        let _ = err.flush();
        self.drawn = true;
    }

    /// What the lock's `status` says to someone waiting for it: its holder, the line,
    /// the nodes restart protection leaves out, the writers waiting.
    fn describe(&self, status: &LockStatus) -> String {
        let state = status.nodes.iter().find_map(|n| n.state.as_ref().ok());
        let protected: Vec<Duration> = status
            .nodes
            .iter()
            .filter_map(|n| n.restart_protection)
            .collect();
        let Some(state) = state else {
            return "Redis not answering".to_owned();
        };
        let mut text = holder_text(state);
        let place = self.info.as_ref().and_then(|own| {
            state
                .waiters
                .iter()
                .position(|w| w.info.as_ref() == Some(own))
        });
        match place {
            Some(i) => text.push_str(&format!(
                ", {} of {} in line",
                ordinal(i + 1),
                state.waiters.len()
            )),
            None if !state.waiters.is_empty() => {
                text.push_str(&format!(", {} in line", state.waiters.len()))
            }
            None => {}
        }
        if let Some(longest) = protected.iter().max() {
            text.push_str(&format!(
                "; restart protection leaves out {} that restarted recently, \
                 for up to {} more",
                count(protected.len(), "node", "nodes"),
                HumanDuration(*longest)
            ));
        }
        if state.writers_waiting > 0 {
            text.push_str(&format!(
                ", {} waiting",
                count(state.writers_waiting as usize, "writer", "writers")
            ));
        }
        text
    }

    /// Removes the line, if one was drawn.
    pub(crate) fn clear(&mut self) {
        if std::mem::take(&mut self.drawn) {
            let mut err = std::io::stderr().lock();
            let _ = write!(err, "\r\x1b[2K");
            let _ = err.flush();
        }
    }
}

/// Who holds the lock and for how much longer: `free`, `held by COMMAND (pid ...), lease
/// 3s left`, `all 2 permits held, ...`.
fn holder_text(state: &LockState) -> String {
    // Who, when the holder said (`run` does): " by COMMAND (pid ...)".
    let by = state
        .holder_info
        .as_deref()
        .map(|info| format!(" by {}", ops::info_text(info)))
        .unwrap_or_default();
    match &state.holder {
        None => "free".to_owned(),
        Some(Holder::Plain {
            remaining: Some(left),
        })
        | Some(Holder::Reentrant {
            remaining: Some(left),
            ..
        }) => format!("held{by}, lease {} left", HumanDuration(*left)),
        Some(Holder::Semaphore {
            permits: Some(permits),
            held,
        }) if held.len() >= *permits as usize => match held.first() {
            Some(first) => format!(
                "all {permits} permits held, the first lease ends in {}",
                HumanDuration(*first)
            ),
            None => format!("all {permits} permits held"),
        },
        Some(Holder::Readers { held }) => match held.first() {
            Some(first) => format!(
                "{}, the first lease ends in {}",
                count(held.len(), "reader", "readers"),
                HumanDuration(*first)
            ),
            None => "held by readers".to_owned(),
        },
        Some(_) => format!("held{by}"),
    }
}

/// `1st`, `2nd`, `3rd`, `4th`, ... `11th`, `21st`.
fn ordinal(n: usize) -> String {
    let suffix = match (n % 10, n % 100) {
        (_, 11..=13) => "th",
        (1, _) => "st",
        (2, _) => "nd",
        (3, _) => "rd",
        _ => "th",
    };
    format!("{n}{suffix}")
}

/// `n` and the noun, singular or plural: `1 reader`, `3 readers`.
fn count(n: usize, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

#[cfg(test)]
mod tests {
    #[test]
    fn places_read_as_people_say_them() {
        let said: Vec<String> = [1, 2, 3, 4, 11, 12, 13, 21, 22, 101, 111]
            .into_iter()
            .map(super::ordinal)
            .collect();
        assert_eq!(
            said,
            [
                "1st", "2nd", "3rd", "4th", "11th", "12th", "13th", "21st", "22nd", "101st",
                "111th"
            ]
        );
    }
}
