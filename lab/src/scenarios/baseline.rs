//! The baseline: workers on one lock server, no faults.

use std::time::Instant;

use super::Scenario;
use crate::harness::{Lab, Resource};
use crate::outcomes::Outcome;

pub const NO_FAULTS: Scenario = Scenario {
    name: "no-faults",
    what: "3 workers on one Redis, fenced resource",
    expected: "every checker holds; the counter equals the acknowledged writes",
    run: |lab, tag, scale| lab.no_faults(tag, scale.steady),
};

impl Lab {
    /// Workers on the fenced resource, no faults: the baseline every checker must pass.
    fn no_faults(&self, tag: &str, iterations: u32) -> Result<Outcome, String> {
        let (mut workers, histories) = self.spawn_all(
            (1..=3)
                .map(|p| self.worker_args(tag, p, Resource::Fenced, iterations))
                .collect(),
        )?;
        workers.wait_all(Instant::now() + self.timeout(iterations))?;
        let (mut o, _) = self.judge(tag, &histories, "none".into())?;
        o.expect_clean(&[1, 2, 3, 4, 5]);
        o.expect_counter_matches();
        if o.acquisitions == 0 {
            o.failed.push("no acquisition".into());
        }
        Ok(o)
    }
}
