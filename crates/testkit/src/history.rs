//! The safety lab's history format: one JSON Lines file per process.
//!
//! Every worker process of the lab appends one [`Event`] per line to its own
//! file with a [`HistoryWriter`]; after the run, [`read_histories`] merges the
//! files into one history sorted by time, which the [`checkers`] then judge.
//!
//! # Time
//!
//! `time_ns` and `valid_until_ns` are nanoseconds of `CLOCK_MONOTONIC`
//! ([`monotonic_ns`]). That clock is shared by all processes on one machine
//! (it is not per process), never jumps with NTP or `date`, and so orders
//! events of different processes on the same host. Histories of different
//! machines cannot be merged this way.
//!
//! # Shape of a line
//!
//! One JSON object per line. `process`, `time_ns`, `op` and `phase` are
//! always present; every other field is omitted when it is not known (and
//! read back as absent when missing). `op` and `phase` are lower-case strings:
//!
//! ```json
//! {"process":1,"time_ns":1000,"op":"acquire","phase":"invoke"}
//! {"process":1,"time_ns":2000,"op":"acquire","phase":"ok","token":7,"owner":"a1","valid_until_ns":9000,"nodes":["127.0.0.1:7001","127.0.0.1:7002"]}
//! {"process":1,"time_ns":3000,"op":"write","phase":"invoke","token":7,"owner":"a1","value":42}
//! {"process":1,"time_ns":3500,"op":"write","phase":"ok","token":7,"owner":"a1","value":42}
//! {"process":1,"time_ns":4000,"op":"release","phase":"invoke","token":7,"owner":"a1"}
//! {"process":1,"time_ns":4200,"op":"release","phase":"ok","token":7,"owner":"a1","touched_owner":"a1"}
//! ```
//!
//! Unknown fields are ignored when reading, so the format can grow.
//!
//! # Operations and phases
//!
//! Every operation is an `invoke` line followed (usually) by one completion
//! line from the same process: `ok` (it happened), `fail` (it definitely did
//! not happen) or `info` (unknown outcome: timeout, crash, lost reply; it may
//! or may not have happened). A process runs one operation at a time. A
//! process killed mid-operation leaves an `invoke` without completion, which
//! the checkers treat like `info`.
//!
//! [`checkers`]: crate::checkers

use std::fs::{File, OpenOptions};
use std::io::{self, BufRead, BufReader, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// What an [`Event`] is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Op {
    /// Acquiring the lock. `ok` carries `token`, `owner`, `valid_until_ns`
    /// and `nodes`.
    Acquire,
    /// Releasing the lock. `invoke` ends the process's lease (it stops
    /// relying on the lock as soon as it asks to release it).
    Release,
    /// Extending (renewing) the lock. `ok` carries the new `valid_until_ns`.
    Extend,
    /// Writing `value` to the fenced resource with fencing `token`. `ok` means
    /// the resource accepted the write, `fail` that it rejected it (for
    /// example a stale token).
    Write,
    /// Reading the fenced resource; `ok` carries the `value` read.
    Read,
}

/// Where in its life an operation is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// The operation starts.
    Invoke,
    /// The operation completed and took effect.
    Ok,
    /// The operation completed and definitely did not take effect.
    Fail,
    /// Unknown outcome: the operation may or may not have taken effect.
    Info,
}

/// One line of a history: one step of one operation of one process.
///
/// Build one with [`Event::new`] (or [`Event::now`]) and the `with_*`
/// methods:
///
/// ```
/// use testkit::history::{Event, Op, Phase};
///
/// let e = Event::new(1, 2_000, Op::Acquire, Phase::Ok)
///     .with_token(7)
///     .with_owner("a1")
///     .with_valid_until(9_000)
///     .with_nodes(["127.0.0.1:7001"]);
/// let line = serde_json::to_string(&e).unwrap();
/// assert_eq!(
///     line,
///     r#"{"process":1,"time_ns":2000,"op":"acquire","phase":"ok","token":7,"owner":"a1","valid_until_ns":9000,"nodes":["127.0.0.1:7001"]}"#
/// );
/// assert_eq!(serde_json::from_str::<Event>(&line).unwrap(), e);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    /// Id of the worker process that recorded the event (unique per run).
    pub process: u32,
    /// When the event was recorded, in `CLOCK_MONOTONIC` nanoseconds
    /// ([`monotonic_ns`]).
    pub time_ns: u64,
    /// The operation.
    pub op: Op,
    /// The step of the operation.
    pub phase: Phase,
    /// Fencing token: the one granted (`acquire ok`) or the one presented
    /// (`write`, `release`, `extend`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<u64>,
    /// Owner token: the random value the lock key holds for this holder.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    /// End of the lease by the worker's monotonic clock (`acquire ok`,
    /// `extend ok`): the worker must not rely on the lock from then on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub valid_until_ns: Option<u64>,
    /// Addresses of the nodes that answered (positively) the operation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nodes: Option<Vec<String>>,
    /// Value written (`write`) or read (`read ok`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<i64>,
    /// For `release` / `extend`: the owner token the lock key held when the
    /// operation acted on it (deleted it or changed its expiry). Only the
    /// lab can observe this (an instrumented release/extend script that
    /// returns the value it found, or the lab's server-side log); absent
    /// when the operation did not act or it was not observed. If several
    /// nodes were touched and any held a foreign owner, record that one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub touched_owner: Option<String>,
    /// Error text of a `fail` or `info` completion.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// `acquire ok` of a read-write lock's read side: the lease is shared with other
    /// readers (and with no writer).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub shared: bool,
}

impl Event {
    /// An event with only the four mandatory fields set.
    pub fn new(process: u32, time_ns: u64, op: Op, phase: Phase) -> Self {
        Event {
            process,
            time_ns,
            op,
            phase,
            token: None,
            owner: None,
            valid_until_ns: None,
            nodes: None,
            value: None,
            touched_owner: None,
            error: None,
            shared: false,
        }
    }

    /// Sets [`shared`](Event::shared): a reader's lease.
    pub fn shared(mut self) -> Self {
        self.shared = true;
        self
    }

    /// [`Event::new`] stamped with [`monotonic_ns`] now.
    pub fn now(process: u32, op: Op, phase: Phase) -> Self {
        Event::new(process, monotonic_ns(), op, phase)
    }

    /// Sets [`token`](Event::token).
    pub fn with_token(mut self, token: u64) -> Self {
        self.token = Some(token);
        self
    }

    /// Sets [`owner`](Event::owner).
    pub fn with_owner(mut self, owner: impl Into<String>) -> Self {
        self.owner = Some(owner.into());
        self
    }

    /// Sets [`valid_until_ns`](Event::valid_until_ns).
    pub fn with_valid_until(mut self, valid_until_ns: u64) -> Self {
        self.valid_until_ns = Some(valid_until_ns);
        self
    }

    /// Sets [`nodes`](Event::nodes).
    pub fn with_nodes<S: Into<String>>(mut self, nodes: impl IntoIterator<Item = S>) -> Self {
        self.nodes = Some(nodes.into_iter().map(Into::into).collect());
        self
    }

    /// Sets [`value`](Event::value).
    pub fn with_value(mut self, value: i64) -> Self {
        self.value = Some(value);
        self
    }

    /// Sets [`touched_owner`](Event::touched_owner).
    pub fn with_touched_owner(mut self, owner: impl Into<String>) -> Self {
        self.touched_owner = Some(owner.into());
        self
    }

    /// Sets [`error`](Event::error).
    pub fn with_error(mut self, error: impl Into<String>) -> Self {
        self.error = Some(error.into());
        self
    }
}

/// Nanoseconds of `CLOCK_MONOTONIC`: the clock every history timestamp uses.
///
/// Shared by all processes of the machine, so timestamps taken by different
/// worker processes are comparable.
///
/// # Panics
/// If `clock_gettime` fails (it cannot for `CLOCK_MONOTONIC` on Linux).
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_MONOTONIC is a valid
    // clock id.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_MONOTONIC) failed");
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Appends [`Event`]s to one history file, one JSON line per event.
///
/// Every event is written with a single `write` call and flushed at once (the
/// file is unbuffered), so a worker killed with `SIGKILL` loses at most the
/// event it was writing; [`read_histories`] ignores such a torn last line.
#[derive(Debug)]
pub struct HistoryWriter {
    file: File,
    path: PathBuf,
}

impl HistoryWriter {
    /// Opens `path` for appending, creating it if needed.
    pub fn create(path: impl AsRef<Path>) -> io::Result<Self> {
        let path = path.as_ref().to_path_buf();
        let file = OpenOptions::new().create(true).append(true).open(&path)?;
        Ok(HistoryWriter { file, path })
    }

    /// The file this writer appends to.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Appends `event` as one line and flushes it.
    pub fn append(&mut self, event: &Event) -> io::Result<()> {
        let mut line = serde_json::to_vec(event).map_err(io::Error::other)?;
        line.push(b'\n');
        self.file.write_all(&line)?;
        self.file.flush()
    }
}

/// Reads one history file in file order.
///
/// A last line without its trailing newline that does not parse is a torn
/// write of a killed process and is ignored; any other unparsable line is an
/// [`io::ErrorKind::InvalidData`] error naming the file and line.
pub fn read_history(path: impl AsRef<Path>) -> io::Result<Vec<Event>> {
    let path = path.as_ref();
    let mut reader = BufReader::new(File::open(path)?);
    let mut events = Vec::new();
    let mut line = String::new();
    let mut number = 0;
    loop {
        line.clear();
        if reader.read_line(&mut line)? == 0 {
            return Ok(events);
        }
        number += 1;
        let complete = line.ends_with('\n');
        let text = line.trim();
        if text.is_empty() {
            continue;
        }
        match serde_json::from_str::<Event>(text) {
            Ok(event) => events.push(event),
            Err(_) if !complete => return Ok(events),
            Err(e) => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("{}:{number}: {e}", path.display()),
                ));
            }
        }
    }
}

/// Reads every history file and merges them into one history sorted by
/// `time_ns`.
///
/// The sort is stable: events with equal timestamps keep the order of
/// `paths`, then file order.
pub fn read_histories<P: AsRef<Path>>(
    paths: impl IntoIterator<Item = P>,
) -> io::Result<Vec<Event>> {
    let mut events = Vec::new();
    for path in paths {
        events.extend(read_history(path)?);
    }
    events.sort_by_key(|e| e.time_ns);
    Ok(events)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn monotonic_clock_moves_forward() {
        let a = monotonic_ns();
        let b = monotonic_ns();
        assert!(a > 0 && b >= a);
    }

    #[test]
    fn two_processes_round_trip_merged_and_sorted() {
        let dir = tempfile::tempdir().unwrap();
        let (p1, p2) = (dir.path().join("p1.jsonl"), dir.path().join("p2.jsonl"));
        let mut w1 = HistoryWriter::create(&p1).unwrap();
        let mut w2 = HistoryWriter::create(&p2).unwrap();
        assert_eq!(w1.path(), p1);

        let e = |p, t, op, ph| Event::new(p, t, op, ph);
        let p1_events = [
            e(1, 10, Op::Acquire, Phase::Invoke),
            e(1, 30, Op::Acquire, Phase::Ok)
                .with_token(1)
                .with_owner("a")
                .with_valid_until(100)
                .with_nodes(["n1", "n2"]),
            e(1, 50, Op::Write, Phase::Ok).with_token(1).with_value(5),
        ];
        let p2_events = [
            e(2, 20, Op::Acquire, Phase::Invoke),
            e(2, 30, Op::Acquire, Phase::Fail).with_error("lock held"),
            e(2, 40, Op::Read, Phase::Ok).with_value(-3),
        ];
        for ev in &p1_events {
            w1.append(ev).unwrap();
        }
        for ev in &p2_events {
            w2.append(ev).unwrap();
        }
        drop((w1, w2));

        let merged = read_histories([&p1, &p2]).unwrap();
        let order: Vec<(u32, u64)> = merged.iter().map(|e| (e.process, e.time_ns)).collect();
        // Stable on the tie at 30: p1 was listed first.
        assert_eq!(
            order,
            [(1, 10), (2, 20), (1, 30), (2, 30), (2, 40), (1, 50)]
        );
        assert_eq!(merged[2], p1_events[1]);
        assert_eq!(merged[3], p2_events[1]);

        // Appending again continues the file instead of truncating it.
        let mut again = HistoryWriter::create(&p1).unwrap();
        again.append(&e(1, 60, Op::Release, Phase::Invoke)).unwrap();
        assert_eq!(read_history(&p1).unwrap().len(), 4);
    }

    #[test]
    fn torn_last_line_is_ignored_but_garbage_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let torn = dir.path().join("torn.jsonl");
        let ok = serde_json::to_string(&Event::new(1, 1, Op::Read, Phase::Invoke)).unwrap();
        std::fs::write(&torn, format!("{ok}\n{{\"process\":1,\"ti")).unwrap();
        assert_eq!(read_history(&torn).unwrap().len(), 1);

        let bad = dir.path().join("bad.jsonl");
        std::fs::write(&bad, format!("nonsense\n{ok}\n")).unwrap();
        let err = read_history(&bad).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
        assert!(err.to_string().contains("bad.jsonl:1"), "{err}");
    }

    #[test]
    fn missing_optional_fields_and_unknown_fields_are_accepted() {
        let e: Event = serde_json::from_str(
            r#"{"process":3,"time_ns":5,"op":"extend","phase":"info","future":1}"#,
        )
        .unwrap();
        assert_eq!(e, Event::new(3, 5, Op::Extend, Phase::Info));
    }
}
