//! The markdown report of a run, printed at its end and written to `--report FILE`
//! (docs/safety.md for the long run): the table of outcomes, what the checkers judge,
//! what each scenario does and expects, and the first violations found.

use std::thread;
use std::time::Duration;

use testkit::ServerBuild;

use crate::outcomes::Outcome;
use crate::scenarios::{Scale, Scenario};

/// `12.3 ms`, or `n/a`.
fn ms(ns: Option<u64>) -> String {
    ns.map_or_else(|| "n/a".to_owned(), |n| format!("{:.1} ms", n as f64 / 1e6))
}

/// The markdown report: one row per scenario (all rounds summed), then what each
/// scenario does and expects.
pub fn report(
    outcomes: &[Outcome],
    scenarios: &[&Scenario],
    scale: Scale,
    seed: u64,
    server: &ServerBuild,
    took: Duration,
    ok: bool,
) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let total: usize = outcomes.iter().map(|o| o.acquisitions).sum();
    let faulty = outcomes.iter().filter(|o| o.name != "no-faults");
    let in_fault_scenarios: usize = faulty.clone().map(|o| o.acquisitions).sum();
    let under_faults: usize = faulty.map(|o| o.under_fault).sum();
    let _ = writeln!(
        out,
        "# Safety lab: {} mode\n\n\
         `./scripts/lab run --{} --seed {seed}{}{}`: {} scenarios × {} round(s), {total} \
         acquisitions in {:.0} s ({in_fault_scenarios} in the scenarios with faults, \
         {under_faults} of them while a fault was active), **{}**. Machine: {}; {}.\n",
        scale.name,
        scale.name,
        if scale.name == "long" {
            " --report docs/safety.md"
        } else {
            ""
        },
        match server {
            ServerBuild::Redis7 => String::new(),
            other => format!(" --server {other}"),
        },
        outcomes.len(),
        scale.rounds,
        took.as_secs_f64(),
        if ok {
            "every expectation held"
        } else {
            "EXPECTATIONS FAILED"
        },
        machine(),
        server.version()
    );
    let _ = writeln!(
        out,
        "Workers are separate OS processes running the library (acquire, read the resource, \
         wait 0-5 ms, write with the fencing token, release; fixed 500 ms TTL unless said), \
         each writing a JSON Lines history stamped with CLOCK_MONOTONIC. The fenced \
         resource checks the token with fencelock's own checks, as a user's would: in \
         Redis `Client::fenced_write`, in PostgreSQL (the *-postgres scenarios) \
         `fencelock_check` in each write's transaction. The checkers: \
         **C1** leases of different owners never overlap (a semaphore's: never more at \
         once than its permits) and every acknowledged write lies in its writer's lease; \
         **C2** the fenced resource never accepts a lower token after \
         a higher one; **C3** no acknowledged write is lost; **C4** tokens of successful \
         acquires strictly increase; **C5** no script ever deleted or extended a lock key \
         holding another owner's token, judged from each Redis server's own `MONITOR` \
         stream (replayed, not from the scripts' replies); **C6** after a holder is killed \
         or a fault heals, the next acquire comes within one TTL + 300 ms.\n"
    );
    let _ = writeln!(
        out,
        "Beside these samples, the model checker explores every interleaving of small \
         worlds running the shipped scripts, with faults: its table is at the end \
         ([The model checker](#the-model-checker)).\n"
    );
    let _ = writeln!(
        out,
        "| scenario | acquisitions | under faults | faults injected (last round) | C1 | C2 | C3 | C4 | C5 | C6 | unavailability | expectations |"
    );
    let _ = writeln!(out, "|---|---|---|---|---|---|---|---|---|---|---|---|");
    for o in outcomes {
        let cell = |v: Option<usize>| v.map_or_else(|| "–".to_owned(), |n| n.to_string());
        let [c1, c2, c3, c4, c5, c6] = o.violations.map(cell);
        let unavailability = format!(
            "{} of {} acquires failed; longest {}{}",
            o.failed_acquires,
            o.attempts,
            ms(Some(o.longest_acquire_ns)),
            o.recovery_ns
                .map(|r| format!("; back after {} (worst round)", ms(Some(r))))
                .unwrap_or_default()
        );
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {c1} | {c2} | {c3} | {c4} | {c5} | {c6} | {unavailability} | {} |",
            o.name,
            o.acquisitions,
            o.under_fault,
            o.faults,
            if o.failed.is_empty() {
                "held".to_owned()
            } else {
                format!("FAILED: {}", o.failed.join("; "))
            }
        );
    }
    let (judged, skipped) = outcomes
        .iter()
        .fold((0, 0), |(j, s), o| (j + o.touches.0, s + o.touches.1));
    let _ = writeln!(
        out,
        "\nC1-C6: violations found, summed over the rounds (–: not judged in that \
         scenario). C5 judged {judged} script writes to lock keys ({skipped} skipped: the \
         key's state unknown, e.g. right after a node restarted). A positive control is a \
         known anomaly its checker must find on every run, or the run fails (a checker that \
         cannot fail proves nothing); every checker has one: C1 paused-worker-unfenced, \
         paused-worker-postgres-unfenced, \
         redlock-restart-unprotected, sentinel-failover, cluster-failover, evicted-lock-key, \
         clock-step-forward, cli-unsupervised and semaphore-paused-fixed, and for a \
         semaphore's permit count semaphore-permit-removed, for a read-write lock's readers \
         and writer rwlock-reader-removed and rwlock-reader-paused-fixed, C2 \
         paused-worker-unfenced and paused-worker-postgres-unfenced, C3 resource-crash, C4 counter-rewound and clock-step-back, C5 expired-holder, C6 holder-killed-long-lease. Their violations \
         are the expected non-zero counts in the table, with those the nemesis explains by \
         the faults it drew. Under faults: acquisitions made while a fault was active (from \
         its injection to its heal; a fault that never heals in the round counts to its \
         end; in the nemesis a kill or a clock step counts for one TTL). Unavailability: acquires that ended in an error (after \
         waiting up to 5 s), the longest single acquire, and for C6 the time from the kill \
         or heal to the next holder."
    );
    let fenced: Vec<&Outcome> = outcomes
        .iter()
        .filter(|o| o.double_grants > 0 || o.rejected_writes > 0)
        .collect();
    if !fenced.is_empty() {
        let _ = writeln!(
            out,
            "\n## Double grants and fence rejections\n\n\
             Double grants: leases granted while another owner's lease was live (C1's \
             overlaps; its other violations are reads and writes outside a lease). Rejected: writes the fenced resource refused for a token lower \
             than one it had accepted. Summed over the rounds.\n\n\
             | scenario | rounds | double grants | stale writes rejected | acknowledged writes |\n\
             |---|---|---|---|---|"
        );
        for o in fenced {
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {} |",
                o.name, o.rounds, o.double_grants, o.rejected_writes, o.acked
            );
        }
    }
    let _ = writeln!(
        out,
        "\n## Scenarios\n\n| scenario | what happens | expected |\n|---|---|---|"
    );
    for sc in scenarios {
        let _ = writeln!(out, "| {} | {} | {} |", sc.name, sc.what, sc.expected);
    }
    if outcomes.iter().any(|o| !o.details.is_empty()) {
        let _ = writeln!(
            out,
            "\n## Violations found (the first two of each scenario)\n"
        );
        for o in outcomes.iter().filter(|o| !o.details.is_empty()) {
            for d in o.details.iter().take(2) {
                let _ = writeln!(out, "- {d}");
            }
            if o.details.len() > 2 {
                let _ = writeln!(out, "- {}: and {} more", o.name, o.details.len() - 2);
            }
        }
    }
    let _ = writeln!(
        out,
        "\n{} in {:.1} s (seed {seed})",
        if ok { "PASS" } else { "FAIL" },
        took.as_secs_f64()
    );
    out.push_str(&model_section());
    out
}

/// The model checker's table (docs/model.md's, as this build has it), for the report
/// beside the lab's: the worlds, the states explored in each, and each control caught.
pub fn model_section() -> String {
    let table: Vec<&str> = MODEL_DOC
        .lines()
        .skip_while(|l| !l.starts_with("| world |"))
        .take_while(|l| l.starts_with('|'))
        .collect();
    format!(
        "\n## The model checker\n\n\
         Beside these samples, `./scripts/model` explores every interleaving of small worlds \
         running the shipped scripts, with faults ([model.md](model.md) says what each world \
         holds, what the properties are and what is not modelled). Its worlds, the states \
         explored in each (the quick run is the one CI makes), and each control caught:\n\n\
         {}\n",
        table.join("\n")
    )
}

/// docs/model.md, where the model checker's runs are written up.
const MODEL_DOC: &str = include_str!("../../docs/model.md");

/// `N cores, MODEL` from /proc (best effort).
fn machine() -> String {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .and_then(|l| l.split_once(':'))
        .map_or("unknown CPU", |(_, m)| m.trim());
    let cores = thread::available_parallelism().map_or(0, |n| n.get());
    format!("{cores} cores, {model}")
}

#[cfg(test)]
mod tests {
    /// docs/safety.md is written by a long run of the lab, but the model's table in it
    /// must be the one docs/model.md has now (`scripts/model --docs` copies it over).
    #[test]
    fn safety_md_has_the_model_checker_s_table_as_model_md_has_it() {
        let safety = include_str!("../../docs/safety.md");
        let section = super::model_section();
        assert!(section.contains("| world |"), "docs/model.md has no table");
        assert!(
            safety.ends_with(&section),
            "docs/safety.md must end with the model checker's section of docs/model.md: \
             run ./scripts/model --docs"
        );
    }
}
