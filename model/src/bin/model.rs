//! `scripts/model`: checks every world of the catalogue and prints, for each, the
//! states explored, the depth, the time, and whether it showed what it must (every
//! property holding, or the named one violated); `--traces` prints each
//! counterexample. Exits 1 when a world did not show what it must.
//!
//! Usage: `model [--quick] [--threads N] [--traces] [--only TEXT]`

use std::process::ExitCode;

use model::catalogue::{self, Expect};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let flag = |name: &str| args.iter().any(|a| a == name);
    let value = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    if flag("--help") || flag("-h") {
        println!("usage: model [--quick] [--threads N] [--traces] [--only TEXT]");
        return ExitCode::SUCCESS;
    }
    let threads = match value("--threads").map(|t| t.parse::<usize>()) {
        None => 1,
        Some(Ok(n)) if n > 0 => n,
        Some(_) => {
            eprintln!("model: --threads takes a positive number");
            return ExitCode::from(2);
        }
    };
    let only = value("--only");
    let mut failed = 0;
    println!(
        "{:<72} {:>10} {:>6} {:>9}  result",
        "world", "states", "depth", "time"
    );
    for entry in catalogue::worlds(flag("--quick")) {
        if only
            .as_deref()
            .is_some_and(|o| !entry.world.name.contains(o))
        {
            continue;
        }
        let outcome = catalogue::check(&entry, threads);
        let violated = (outcome.violated.iter())
            .map(|(n, _)| *n)
            .collect::<Vec<_>>()
            .join(", ");
        let result = match (entry.expect, outcome.as_expected) {
            (Expect::Holds, true) => "every property holds".to_owned(),
            (Expect::Violated(p), true) => format!("caught as expected: {p}"),
            (Expect::Only(p), true) => format!("{p} violated (known), every other holds"),
            (Expect::Holds | Expect::Only(_), false) if !outcome.held => {
                "FAILED: nobody ever held the lock".into()
            }
            (Expect::Holds, false) => format!("FAILED: violated {violated}"),
            (Expect::Violated(p), false) => format!("FAILED: {p} was not violated"),
            (Expect::Only(p), false) => format!("FAILED: violated {violated} (expected {p} only)"),
        };
        println!(
            "{:<72} {:>10} {:>6} {:>8.1}s  {result}",
            outcome.name,
            outcome.states,
            outcome.depth,
            outcome.time.as_secs_f64()
        );
        if !outcome.as_expected {
            failed += 1;
        }
        if flag("--traces") || !outcome.as_expected {
            for (property, trace) in &outcome.violated {
                println!("\n{property}, a counterexample:\n{trace}");
            }
        }
    }
    if failed > 0 {
        eprintln!("model: {failed} world(s) did not show what they must");
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}
