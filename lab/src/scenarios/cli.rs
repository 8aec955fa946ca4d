//! The CLI's own faults, judged from COMMAND's history: `fencelock run` A holds the lock
//! while its COMMAND (the lab's `command`, see [`crate::command`]) writes the fenced
//! resource; A is SIGKILLed or SIGSTOPped; `fencelock run --wait` B takes the lock and
//! its COMMAND writes. Supervision must have stopped A's COMMAND before B's starts (C1).
//! Sent SIGTSTP (Ctrl-Z) instead, A keeps the lock while suspended: B is refused, and
//! A's COMMAND goes on under the lock when A resumes. The positive control: a COMMAND that escapes supervision (the work done
//! in a session of its own) goes on after fencelock A is killed, and C1 flags it.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use testkit::history::{Event, HistoryWriter, Op, Phase, monotonic_ns};

use super::{Scenario, WITHIN, has, wait_until};
use crate::command::close_history;
use crate::harness::{Lab, process_stopped, signal};
use crate::outcomes::Outcome;

pub const CLI_KILLED: Scenario = Scenario {
    name: "cli-killed",
    what: "`fencelock run --ttl 1s` A SIGKILLed while its COMMAND writes; `fencelock run \
        --wait 10s` B then takes the lock and its COMMAND writes; then C",
    expected: "A's COMMAND stopped (by its watcher) before B's COMMAND starts: C1-C5 hold; B \
        and C exit 0",
    run: |lab, tag, _| lab.cli_fault(tag, CliFault::Killed),
};

pub const CLI_STOPPED: Scenario = Scenario {
    name: "cli-stopped",
    what: "the same with A SIGSTOPped until B is done, then SIGCONTed",
    expected: "C1-C5 hold; B and C exit 0; A, resumed after its lease, exits 76 (lease lost)",
    run: |lab, tag, _| lab.cli_fault(tag, CliFault::Stopped),
};

pub const CLI_SUSPENDED: Scenario = Scenario {
    name: "cli-suspended",
    what: "A sent SIGTSTP (Ctrl-Z); `fencelock run --wait 2s` B meanwhile (twice A's \
        lease); A SIGCONTed once B is done; then C",
    expected: "A's keeper keeps the lock while A is suspended: B exits 75 and its COMMAND \
        never runs; A's COMMAND goes on under the lock and A exits 0; C1-C5 hold; C exits 0",
    run: |lab, tag, _| lab.cli_fault(tag, CliFault::Suspended),
};

pub const CLI_UNSUPERVISED: Scenario = Scenario {
    name: "cli-unsupervised",
    what: "A's COMMAND does its work in a session of its own (as a daemonizing program \
        would), out of its watcher's reach; A SIGKILLed; B takes the lock",
    expected: "**positive control**: C1 flags A's COMMAND acting beside B's; the fence \
        rejects A's COMMAND's writes after B's (C2 holds)",
    run: |lab, tag, _| lab.cli_fault(tag, CliFault::Unsupervised),
};

pub const ELECT_KILLED: Scenario = Scenario {
    name: "elect-killed",
    what: "`fencelock elect --ttl 1s` A leads and its COMMAND writes; A SIGKILLed; `fencelock \
        elect` B then campaigns, leads and its COMMAND writes and exits; then C",
    expected: "A's COMMAND stopped (by its watcher) before B's COMMAND starts, B's term \
        higher: C1-C5 hold; B and C exit 0 (COMMAND's status, after resigning)",
    run: |lab, tag, _| lab.cli_fault_as(tag, CliFault::Killed, Cli::Elect),
};

pub const ELECT_STOPPED: Scenario = Scenario {
    name: "elect-stopped",
    what: "`fencelock elect --ttl 1s` A leads and its COMMAND writes; A SIGSTOPped past its \
        lease until `fencelock elect` B has led, written and resigned, then SIGCONTed: A \
        campaigns again and leads a second term; then C",
    expected: "A's COMMAND stopped (by its watcher) at the end of A's lease, before B's \
        COMMAND starts; A's second term higher than B's: C1-C5 hold; A (after its second \
        COMMAND), B and C exit 0",
    run: |lab, tag, _| lab.cli_fault_as(tag, CliFault::Stopped, Cli::Elect),
};

/// Which subcommand the scenario runs: `run --wait`, or `elect` (which waits to lead).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cli {
    Run,
    Elect,
}

/// What happens to `fencelock run` A.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CliFault {
    Killed,
    Stopped,
    Suspended,
    Unsupervised,
}

/// The lease of both runs.
const CLI_TTL: &str = "1s";

impl Lab {
    /// One round: A holds and works, the fault, B takes over; judged from the COMMANDs'
    /// histories.
    fn cli_fault(&self, tag: &str, fault: CliFault) -> Result<Outcome, String> {
        self.cli_fault_as(tag, fault, Cli::Run)
    }

    /// [`Self::cli_fault`] with `fencelock run` or `fencelock elect` (SIGKILL or SIGSTOP:
    /// a resumed `elect` campaigns again and runs a second COMMAND, which continues A's
    /// history).
    fn cli_fault_as(&self, tag: &str, fault: CliFault, cli: Cli) -> Result<Outcome, String> {
        let fencelock = fencelock_binary()?;
        let hist_a = self.dir.join(format!("{tag}-p1.jsonl"));
        let hist_b = self.dir.join(format!("{tag}-p2.jsonl"));
        let hist_c = self.dir.join(format!("{tag}-p3.jsonl"));
        // A's COMMAND works up to 8 s (its watcher ends it sooner), escaped 3 s; B's 0.4 s.
        let iterations = if fault == CliFault::Unsupervised {
            150
        } else {
            400
        };
        let mut a = self.cli_run(&fencelock, tag, 1, &hist_a, iterations, "0s", fault, cli)?;
        let started = wait_until(tag, "A's COMMAND writes", || {
            has(&hist_a, 0, Op::Write, Phase::Ok).unwrap_or(false)
        });
        if let Err(e) = started {
            let _ = a.kill();
            let _ = a.wait();
            return Err(e);
        }
        let fault_at = monotonic_ns();
        let pid = a.id();
        match fault {
            CliFault::Killed | CliFault::Unsupervised => {
                let _ = a.kill();
            }
            CliFault::Stopped => signal(pid, libc::SIGSTOP),
            CliFault::Suspended => signal(pid, libc::SIGTSTP),
        }
        if matches!(fault, CliFault::Stopped | CliFault::Suspended) {
            wait_until(tag, "fencelock A stopped", || process_stopped(pid))?;
        }
        let b_wait = if fault == CliFault::Suspended {
            "2s"
        } else {
            "10s"
        };
        let mut b = self.cli_run(
            &fencelock,
            tag,
            2,
            &hist_b,
            20,
            b_wait,
            CliFault::Killed,
            cli,
        )?;
        let b_status = wait_exit(&mut b, WITHIN);
        let healed_at = monotonic_ns();
        if matches!(fault, CliFault::Stopped | CliFault::Suspended) {
            signal(pid, libc::SIGCONT);
        }
        let a_status = wait_exit(&mut a, WITHIN);
        if fault == CliFault::Unsupervised {
            // The escaped COMMAND ends its work on its own.
            wait_until(tag, "A's escaped COMMAND done", || {
                has(&hist_a, 0, Op::Release, Phase::Ok).unwrap_or(false)
            })?;
        }
        let closed = close_history(&hist_a)?;
        // C, once B is done: B took the lock at the instant A's key expired, which the
        // MONITOR replay cannot tell from before it (C5 skips B's renewals and release);
        // C's grant, renewals and release on a known key are judged.
        let mut c = self.cli_run(
            &fencelock,
            tag,
            3,
            &hist_c,
            20,
            "10s",
            CliFault::Killed,
            cli,
        )?;
        let c_status = wait_exit(&mut c, WITHIN);

        let faults = format!(
            "{} fencelock A while its COMMAND writes{}",
            match fault {
                CliFault::Killed => "SIGKILL",
                CliFault::Stopped => "SIGSTOP (until B is done)",
                CliFault::Suspended => "SIGTSTP (until B is done)",
                CliFault::Unsupervised => "COMMAND out of its watcher's reach; SIGKILL",
            },
            if closed {
                "; A's COMMAND stopped by its watcher"
            } else {
                ""
            }
        );
        let (mut o, h) = self.judge(tag, &[hist_a, hist_b, hist_c], faults)?;
        let windows = match fault {
            CliFault::Killed | CliFault::Unsupervised => [(fault_at, u64::MAX)],
            CliFault::Stopped | CliFault::Suspended => [(fault_at, healed_at)],
        };
        o.count_under_fault(&h, &windows);
        let b_wrote = h
            .iter()
            .any(|e| e.process == 2 && e.op == Op::Write && e.phase == Phase::Ok);
        if fault == CliFault::Suspended {
            // A kept the lock: B waited in vain, and its COMMAND never ran.
            if b_status.as_ref().ok().and_then(ExitStatus::code) != Some(75) {
                o.failed.push(format!(
                    "fencelock B while A was suspended: expected exit 75, got {b_status:?}"
                ));
            }
            if b_wrote {
                o.failed
                    .push("B's COMMAND wrote while suspended A held the lock".into());
            }
        } else {
            match b_status {
                Ok(s) if s.success() => {}
                other => o.failed.push(format!("fencelock B: {other:?}")),
            }
            if !b_wrote {
                o.failed.push("B's COMMAND wrote nothing".into());
            }
        }
        match c_status {
            Ok(s) if s.success() => {}
            other => o.failed.push(format!("fencelock C: {other:?}")),
        }
        match fault {
            CliFault::Killed => {
                o.expect_clean(&[1, 2, 3, 4, 5]);
                if !closed {
                    o.failed
                        .push("A's COMMAND ran to its end: the kill came too late".into());
                }
            }
            CliFault::Stopped if cli == Cli::Elect => {
                o.expect_clean(&[1, 2, 3, 4, 5]);
                if !a_status.as_ref().is_ok_and(ExitStatus::success) {
                    o.failed.push(format!(
                        "fencelock elect A, leading again after B: expected exit 0, got \
                         {a_status:?}"
                    ));
                }
                // A's two terms, B's between them.
                let terms = |p: u32| -> Vec<u64> {
                    h.iter()
                        .filter(|e| e.process == p && e.op == Op::Acquire && e.phase == Phase::Ok)
                        .filter_map(|e| e.token)
                        .collect()
                };
                match (terms(1).as_slice(), terms(2).as_slice()) {
                    ([first, second], [b]) if first < b && b < second => {}
                    (a, b) => o.failed.push(format!(
                        "expected A's two terms around B's: A {a:?}, B {b:?}"
                    )),
                }
            }
            CliFault::Stopped => {
                o.expect_clean(&[1, 2, 3, 4, 5]);
                if a_status.as_ref().ok().and_then(ExitStatus::code) != Some(76) {
                    o.failed.push(format!(
                        "fencelock A resumed after its lease: expected exit 76, got {a_status:?}"
                    ));
                }
            }
            CliFault::Suspended => {
                o.expect_clean(&[1, 2, 3, 4, 5]);
                if !a_status.as_ref().is_ok_and(ExitStatus::success) {
                    o.failed.push(format!(
                        "fencelock A, resumed with its lock kept: expected exit 0, got \
                         {a_status:?}"
                    ));
                }
                if closed {
                    o.failed
                        .push("A's COMMAND was stopped although A kept the lock".into());
                }
            }
            CliFault::Unsupervised => {
                o.expect_detected(1, "A's escaped COMMAND acting beside B's");
                o.expect_clean(&[2, 3, 4, 5]);
                if o.rejected_writes == 0 {
                    o.failed.push(
                        "the fence rejected none of A's escaped COMMAND's late writes".into(),
                    );
                }
            }
        }
        Ok(o)
    }

    /// Starts `fencelock run` (or `elect`) on the lock server for `tag`'s lock, with the lab's
    /// `command` as COMMAND (`iterations` writes, recorded in `history`; `Unsupervised`:
    /// escaping its watcher).
    #[allow(clippy::too_many_arguments)]
    fn cli_run(
        &self,
        fencelock: &Path,
        tag: &str,
        process: u32,
        history: &Path,
        iterations: u32,
        wait: &str,
        fault: CliFault,
        cli: Cli,
    ) -> Result<Child, String> {
        // The acquire begins now; COMMAND records its grant when it starts.
        HistoryWriter::create(history)
            .and_then(|mut w| w.append(&Event::now(process, Op::Acquire, Phase::Invoke)))
            .map_err(|e| format!("{}: {e}", history.display()))?;
        let log = std::fs::File::create(self.dir.join(format!("{tag}-p{process}.log")))
            .map_err(|e| e.to_string())?;
        let mut cmd = Command::new(fencelock);
        match cli {
            Cli::Run => cmd.args([
                "run",
                "--redis",
                &self.lock.url(),
                "--ttl",
                CLI_TTL,
                "--wait",
                wait,
            ]),
            // Campaigns until it leads.
            Cli::Elect => cmd.args(["elect", "--redis", &self.lock.url(), "--ttl", CLI_TTL]),
        };
        cmd.arg(format!("lab:{tag}"))
            .arg("--")
            .arg(&self.exe)
            .arg("command")
            .arg(format!("--process={process}"))
            .arg(format!("--resource-url={}", self.resource.url()))
            .arg(format!("--prefix=res:{tag}"))
            .arg(format!("--iterations={iterations}"))
            .arg("--again-iterations=20")
            .arg(format!("--history={}", history.display()));
        if fault == CliFault::Unsupervised {
            cmd.arg("--escape");
        }
        cmd.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", fencelock.display()))
    }
}

/// The `fencelock` binary built next to the lab (`$FENCELOCK_BIN` overrides it).
fn fencelock_binary() -> Result<PathBuf, String> {
    if let Some(bin) = std::env::var_os("FENCELOCK_BIN") {
        return Ok(bin.into());
    }
    let exe = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
    let bin = exe.with_file_name("fencelock");
    if bin.exists() {
        Ok(bin)
    } else {
        Err(format!(
            "{} not found: build it first (cargo build -p fencelock-cli, with --release for a \
             release lab), or set FENCELOCK_BIN",
            bin.display()
        ))
    }
}

/// Waits up to `within` for `child` to exit; kills it after that.
fn wait_exit(child: &mut Child, within: Duration) -> Result<ExitStatus, String> {
    let deadline = Instant::now() + within;
    loop {
        match child.try_wait().map_err(|e| e.to_string())? {
            Some(status) => return Ok(status),
            None if Instant::now() > deadline => {
                signal(child.id(), libc::SIGCONT);
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("still running after {within:?}"));
            }
            None => thread::sleep(Duration::from_millis(10)),
        }
    }
}
