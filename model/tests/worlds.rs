//! The bounded model check CI runs (`scripts/model --quick`'s worlds): each world
//! shows what it must. With the scripts as shipped the plain lock keeps one holder,
//! rising tokens and a fenced resource that takes no lower token, under a lost reply,
//! a lost release message and a client crash; a server restart and a failover break
//! "one holder" (known, and documented); each control's mutated script is caught with a
//! readable counterexample.

use model::catalogue::{self, Expect};
use model::scripts::{Patch, Scripts};

#[test]
fn every_world_shows_what_it_must() {
    let mut failures = Vec::new();
    for entry in catalogue::worlds(true) {
        let outcome = catalogue::check(&entry, 1);
        eprintln!(
            "{}: {} states, depth {}, {:.1}s, as expected: {}",
            outcome.name,
            outcome.states,
            outcome.depth,
            outcome.time.as_secs_f64(),
            outcome.as_expected
        );
        if let Expect::Violated(property) = entry.expect
            && let Some((_, trace)) = outcome.violated.iter().find(|(n, _)| *n == property)
        {
            // The counterexample names the scripts' calls and shows the keyspace.
            assert!(
                trace.contains("lock/acquire.lua") && trace.contains("{x} = "),
                "{trace}"
            );
        }
        if !outcome.as_expected {
            let traces: Vec<String> = outcome
                .violated
                .iter()
                .map(|(n, t)| format!("{n}:\n{t}"))
                .collect();
            failures.push(format!(
                "{} ({:?}):\n{}",
                outcome.name,
                entry.expect,
                traces.join("\n")
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[test]
fn a_stale_patch_fails_loudly() {
    let stale = Patch {
        script: "lock/release.lua",
        find: "a line the script does not have",
        replace: "",
    };
    let err = Scripts::shipped().patched(&stale).unwrap_err();
    assert!(err.contains("stale"), "{err}");
}
