//! What a scenario run produced ([`Outcome`]: acquisitions, the violations each checker
//! found, unavailability, the final counter against the acknowledged writes) and the
//! expectations a scenario checks on it (clean checkers, positive controls, the counter,
//! availability); every expectation that fails is recorded in [`Outcome::failed`].

use std::time::Duration;

use testkit::checkers::availability;
use testkit::history::{Event, Op, Phase};

/// What one scenario produced (one round, or the sum of its rounds).
pub struct Outcome {
    pub name: String,
    pub rounds: u32,
    pub acquisitions: usize,
    /// Acquire invocations, and those that ended in an error.
    pub attempts: usize,
    pub failed_acquires: usize,
    /// The longest single acquire (invoke to completion), ns.
    pub longest_acquire_ns: u64,
    pub faults: String,
    /// Acquisitions that succeeded while a fault was active (see
    /// [`count_under_fault`](Self::count_under_fault)).
    pub under_fault: usize,
    /// Violations of C1..C6; `None`: not judged in this scenario.
    pub violations: [Option<usize>; 6],
    /// C5: lock-key writes by scripts judged / skipped (state unknown).
    pub touches: (usize, usize),
    /// C6: how long the lock took to come back after the fault (worst round), ns.
    pub recovery_ns: Option<u64>,
    /// Acknowledged writes vs the final counter (a lost update shows as counter < acked).
    pub acked: usize,
    pub counter: i64,
    /// Leases granted while another owner's lease was live (C1's overlaps).
    pub double_grants: usize,
    /// Writes the fenced resource rejected (a token lower than one it had accepted).
    pub rejected_writes: usize,
    /// Failed expectations (empty: the scenario passed).
    pub failed: Vec<String>,
    /// Checker reports, for the details below the table.
    pub details: Vec<String>,
}

impl Outcome {
    /// A failed expectation for each listed checker (1-based) that found violations.
    pub fn expect_clean(&mut self, checkers: &[usize]) {
        for &c in checkers {
            if let Some(n @ 1..) = self.violations[c - 1] {
                self.failed.push(format!("C{c} found {n} violation(s)"));
            }
        }
    }

    /// A positive control: checker `c` (1-based) must have found `what`.
    pub fn expect_detected(&mut self, c: usize, what: &str) {
        if self.violations[c - 1].unwrap_or(0) == 0 {
            self.failed
                .push(format!("positive control missed: C{c} did not flag {what}"));
        }
    }

    /// Every acknowledged increment is in the final counter (a serial history).
    pub fn expect_counter_matches(&mut self) {
        if self.acked as i64 != self.counter {
            self.failed.push(format!(
                "counter {} != {} acknowledged writes",
                self.counter, self.acked
            ));
        }
    }

    /// C6: the first acquire at or after `from_ns` comes within `bound` (`expected`:
    /// a violation fails the scenario).
    pub fn judge_availability(
        &mut self,
        h: &[Event],
        from_ns: u64,
        bound: Duration,
        expected: bool,
    ) {
        let found = availability(h, from_ns, bound);
        self.details
            .extend(found.iter().map(|v| format!("{}: {v}", self.name)));
        self.violations[5] = Some(found.len());
        if expected {
            self.expect_clean(&[6]);
        }
        self.recovery_ns = h
            .iter()
            .find(|e| e.time_ns >= from_ns && e.op == Op::Acquire && e.phase == Phase::Ok)
            .map(|e| e.time_ns - from_ns);
    }

    /// Counts the successful acquires of `h` that fall inside one of `windows`
    /// (`[from, to)` in the histories' monotonic ns): the acquisitions made while a fault
    /// was active. A fault that never heals in the round has a window up to `u64::MAX`.
    pub fn count_under_fault(&mut self, h: &[Event], windows: &[(u64, u64)]) {
        self.under_fault = h
            .iter()
            .filter(|e| e.op == Op::Acquire && e.phase == Phase::Ok)
            .filter(|e| {
                windows
                    .iter()
                    .any(|&(from, to)| (from..to).contains(&e.time_ns))
            })
            .count();
    }

    /// Adds another round of the same scenario.
    pub fn merge(&mut self, round: Outcome) {
        self.rounds += round.rounds;
        self.acquisitions += round.acquisitions;
        self.under_fault += round.under_fault;
        self.attempts += round.attempts;
        self.failed_acquires += round.failed_acquires;
        self.longest_acquire_ns = self.longest_acquire_ns.max(round.longest_acquire_ns);
        for (mine, theirs) in self.violations.iter_mut().zip(round.violations) {
            *mine = match (*mine, theirs) {
                (None, None) => None,
                (a, b) => Some(a.unwrap_or(0) + b.unwrap_or(0)),
            };
        }
        self.touches.0 += round.touches.0;
        self.touches.1 += round.touches.1;
        self.recovery_ns = self.recovery_ns.max(round.recovery_ns);
        self.acked += round.acked;
        self.counter += round.counter;
        self.double_grants += round.double_grants;
        self.rejected_writes += round.rejected_writes;
        self.failed.extend(round.failed);
        self.details.extend(round.details);
    }
}
