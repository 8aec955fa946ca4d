//! Several locks at once (`Client::lock_all`): workers whose sets of names overlap in a
//! cycle, so that taking them one by one in the callers' orders could deadlock.

use std::path::PathBuf;
use std::time::Instant;

use super::Scenario;
use crate::harness::{Lab, Resource};
use crate::outcomes::Outcome;

pub const OVERLAPPING_SETS: Scenario = Scenario {
    name: "multi-overlap",
    what: "5 workers on one Redis, fenced resources X and B, renewed leases: {X, B}, {B, C}, \
           {C, X} taken at once (lock_all), X alone, B alone",
    expected: "every checker holds on X, C1-C4 on B (each judged from the workers that \
               write it); the counters equal the acknowledged writes; no acquire gives up (the \
               cycle of sets never deadlocks)",
    run: |lab, tag, scale| lab.overlapping_sets(tag, scale.steady),
};

impl Lab {
    /// Workers whose sets overlap in a cycle: X's writers take {X, B}, {C, X} or X
    /// alone; B's take {B, C} or B alone. X and B are each judged from their writers.
    fn overlapping_sets(&self, tag: &str, iterations: u32) -> Result<Outcome, String> {
        let (x, b, c) = (tag.to_owned(), format!("{tag}-b"), format!("{tag}-c"));
        let lock = |t: &str| format!("--also=lab:{t}");
        // (the tag whose lock, resource and history it has, the other names)
        let plan: [(&str, Vec<String>); 5] = [
            (&x, vec![lock(&b)]),
            (&b, vec![lock(&c)]),
            (&c, vec![lock(&x)]),
            (&x, vec![]),
            (&b, vec![]),
        ];
        let specs: Vec<(Vec<String>, PathBuf)> = plan
            .iter()
            .zip(1..)
            .map(|((t, also), p)| {
                let (mut args, history) = self.worker_args(t, p, Resource::Fenced, iterations);
                args.extend(also.iter().cloned());
                // Renewed leases: a deadlock would last until the waits give up, where
                // fixed 500 ms leases would break it by expiring.
                args.push("--renewed".into());
                (args, history)
            })
            .collect();
        let (mut workers, histories) = self.spawn_all(specs)?;
        workers.wait_all(Instant::now() + self.timeout(iterations) * 2)?;
        let of = |t: &str| -> Vec<PathBuf> {
            plan.iter()
                .zip(&histories)
                .filter(|((pt, _), _)| *pt == t)
                .map(|(_, h)| h.clone())
                .collect()
        };
        let (mut o, _) = self.judge(&x, &of(&x), "none".into())?;
        // The MONITOR recorders follow the round's own tag: B is judged without C5.
        let (ob, _) = self.judge_unmonitored(&b, &of(&b), "none".into())?;
        o.expect_clean(&[1, 2, 3, 4, 5]);
        o.expect_counter_matches();
        let mut on_b = ob;
        on_b.expect_clean(&[1, 2, 3, 4]);
        on_b.expect_counter_matches();
        o.failed
            .extend(on_b.failed.into_iter().map(|f| format!("on B: {f}")));
        o.acquisitions += on_b.acquisitions;
        o.failed_acquires += on_b.failed_acquires;
        if o.failed_acquires > 0 {
            o.failed.push(format!(
                "{} acquire(s) gave up after waiting",
                o.failed_acquires
            ));
        }
        if o.acquisitions == 0 {
            o.failed.push("no acquisition".into());
        }
        Ok(o)
    }
}
