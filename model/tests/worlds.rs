//! The checker's worlds with the stand-in client: the plain lock passes its properties
//! with the scripts as shipped, and each control (a mutated script) is caught with a
//! readable counterexample.

use model::controls::{self, Control};
use model::scripts::Scripts;
use model::world::{World, trace};
use stateright::{Checker, Model};

fn plain(scripts: Scripts) -> World {
    let mut world = World::plain(scripts, 2, 2);
    world.faults.lost_reply = true;
    world.faults.budget = 1;
    world
}

#[test]
fn the_plain_lock_keeps_one_holder_and_rising_tokens() {
    let checker = plain(Scripts::shipped())
        .checker()
        .threads(1)
        .spawn_bfs()
        .join();
    eprintln!(
        "plain lock, 2 clients, 1 server: {} states, depth {}",
        checker.unique_state_count(),
        checker.max_depth()
    );
    for (name, path) in checker.discoveries() {
        if name != "a client holds the lock" {
            panic!("{name} violated:\n{}", trace(path));
        }
    }
    checker.assert_properties();
}

fn caught(control: &Control) -> String {
    let mut scripts = Scripts::shipped();
    for patch in control.patches {
        scripts = scripts
            .patched(patch)
            .unwrap_or_else(|e| panic!("{}: {e}", control.name));
    }
    let checker = plain(scripts).checker().threads(1).spawn_bfs().join();
    let path = checker
        .discovery(control.caught_by)
        .unwrap_or_else(|| panic!("{} not caught by {:?}", control.name, control.caught_by));
    trace(path)
}

#[test]
fn a_release_without_the_owner_check_is_caught() {
    let trace = caught(&controls::RELEASE_WITHOUT_OWNER_CHECK);
    eprintln!("{trace}");
    assert!(trace.contains("lock/release.lua"), "{trace}");
}

#[test]
fn an_acquire_without_nx_is_caught() {
    let trace = caught(&controls::ACQUIRE_WITHOUT_NX);
    eprintln!("{trace}");
    assert!(trace.contains("lock/acquire.lua"), "{trace}");
}

#[test]
fn a_stale_patch_fails_loudly() {
    let stale = model::scripts::Patch {
        script: "lock/release.lua",
        find: "a line the script does not have",
        replace: "",
    };
    let err = Scripts::shipped().patched(&stale).unwrap_err();
    assert!(err.contains("stale"), "{err}");
}
