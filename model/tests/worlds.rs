//! The bounded model check CI runs (`scripts/model --quick`'s worlds), its clients the
//! library's own acquire engine: each world shows what it must. With the scripts as
//! shipped the plain lock keeps one holder, rising tokens and a fenced resource that
//! takes no lower token, under a lost reply, a lost release message and a client crash,
//! and wakes its waiters without faults; no refused waiter of one server sleeps past
//! the lease in its way (the fallback when a release message is lost), faults
//! included; the fair lock grants in queue order and
//! purges a crashed head of its queue before it makes a live waiter wait on it (a
//! release's handover included), the
//! semaphore gives at most 2 permits, the read-write lock no reader beside a writer,
//! the reentrant and multi-locks and the election one holder; Redlock over 3 nodes
//! keeps one holder and rising tokens, a node restart included with restart protection,
//! a late or slow answer, lost release messages, and its fenced resource (a store of
//! its own) takes no lower token; no Redlock node keeps a failed attempt's grant (a
//! late one's included), and no refused Redlock waiter sleeps past the soonest refusing
//! lease; holders renewed by the library's watchdog keep one holder through a lost
//! renewal reply and a holder paused past its lease; a server restart, a failover, a
//! Redlock node restart without restart protection and a clock step on a Redlock node
//! break "one holder" (known, and documented); each control's mutated script is caught
//! with a readable counterexample.

use model::catalogue::{self, Expect};
use std::time::Duration;

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
                trace.contains(".lua KEYS") && trace.contains("{x} = "),
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

#[test]
fn the_model_runs_the_text_the_library_sends() {
    // The engine's calls name their script; the node runs the registry's text for it,
    // which must be what `call_parts` says the library loads.
    use fencelock::model::{Command, Site, call_parts};
    let mut engine =
        model::client::acquire(model::client::Kind::FAIR, 0, 0, Duration::from_secs(1), 0);
    let command = engine.start(model::client::instant(0));
    let command = match command {
        Command::Subscribe(_) => engine.on(
            fencelock::model::Event::Subscribed(None),
            model::client::instant(0),
        ),
        other => other,
    };
    let Command::Attempt(attempt) = command else {
        panic!("{command:?}")
    };
    let call = engine.call(&attempt, &Site::default(), false);
    let parts = call_parts(&call);
    assert_eq!(Scripts::shipped().get(parts.file), parts.source);
}
