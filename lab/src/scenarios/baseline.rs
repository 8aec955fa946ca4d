//! The baseline: workers on one lock server, no faults.

use std::time::Instant;

use crate::harness::{Lab, Resource};
use crate::outcomes::Outcome;

impl Lab {
    /// Workers on the fenced resource, no faults: the baseline every checker must pass.
    pub fn no_faults(&self, tag: &str, iterations: u32) -> Result<Outcome, String> {
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
