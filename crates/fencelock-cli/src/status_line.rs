//! The line a person at a terminal sees while `run --wait` waits: who holds the lock,
//! what is left of its lease, how long fencelock has waited, how many wait in a fair
//! queue. Redrawn in place every half second on stderr; nothing at all when stderr is
//! not a terminal, with `-q`, or with `--json`.

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

use fencelock::{Client, Holder, HumanDuration};

use crate::exit;

/// How often the line is redrawn.
const EVERY: Duration = Duration::from_millis(500);

pub(crate) struct StatusLine<'a> {
    /// `None` when nothing is shown.
    client: Option<&'a Client>,
    name: &'a str,
    started: Instant,
    drawn: bool,
}

impl<'a> StatusLine<'a> {
    /// A status line for a wait on `name`; shown only for a wait, on a terminal.
    pub(crate) fn new(client: &'a Client, name: &'a str, wait: Duration) -> Self {
        let show =
            !wait.is_zero() && std::io::stderr().is_terminal() && !exit::json() && !exit::quiet();
        Self {
            client: show.then_some(client),
            name,
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
            Ok(Ok(status)) => {
                let state = status.nodes.iter().find_map(|n| n.state.as_ref().ok());
                match state {
                    None => "Redis not answering".to_owned(),
                    Some(state) => {
                        let mut text = match &state.holder {
                            None => "free".to_owned(),
                            Some(Holder::Plain {
                                remaining: Some(left),
                            })
                            | Some(Holder::Reentrant {
                                remaining: Some(left),
                                ..
                            }) => format!("held, lease {} left", HumanDuration(*left)),
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
                            Some(_) => "held".to_owned(),
                        };
                        if !state.waiters.is_empty() {
                            text.push_str(&format!(", {} in the queue", state.waiters.len()));
                        }
                        if state.writers_waiting > 0 {
                            text.push_str(&format!(
                                ", {} waiting",
                                count(state.writers_waiting as usize, "writer", "writers")
                            ));
                        }
                        text
                    }
                }
            }
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

    /// Removes the line, if one was drawn.
    pub(crate) fn clear(&mut self) {
        if std::mem::take(&mut self.drawn) {
            let mut err = std::io::stderr().lock();
            let _ = write!(err, "\r\x1b[2K");
            let _ = err.flush();
        }
    }
}

/// `n` and the noun, singular or plural: `1 reader`, `3 readers`.
fn count(n: usize, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}
