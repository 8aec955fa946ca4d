//! The worlds `scripts/model` checks, each with what it must show: every property
//! holding, or a named property violated (a control's mutation caught, or a case the
//! docs state fencelock does not cover).

use std::time::{Duration, Instant};

use stateright::{Checker, HasDiscoveries, Model};

use crate::controls::{self, Control, ONE_HOLDER};
use crate::scripts::Scripts;
use crate::world::{self, World};

/// What a world must show.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expect {
    /// Every safety property holds, and a client does hold the lock somewhere.
    Holds,
    /// This property is violated: a control caught, or a case known not to hold.
    Violated(&'static str),
}

/// One world to check.
#[derive(Clone, Debug)]
pub struct Entry {
    /// The world.
    pub world: World,
    /// What it must show.
    pub expect: Expect,
}

/// What a check found.
#[derive(Debug)]
pub struct Outcome {
    /// The world's name.
    pub name: String,
    /// States explored (unique; a world that must show a violation stops at it).
    pub states: usize,
    /// The deepest path.
    pub depth: usize,
    /// How long it took.
    pub time: Duration,
    /// The violated safety properties, each with its counterexample.
    pub violated: Vec<(&'static str, String)>,
    /// Whether a client held the lock in some state.
    pub held: bool,
    /// Whether it showed what it must.
    pub as_expected: bool,
}

/// A plain lock world with 2 clients taking it twice each on one server, with the
/// given faults (budget 1).
fn plain(name: &'static str, scripts: Scripts, faults: impl Fn(&mut world::Faults)) -> World {
    let mut world = World::plain(scripts, 2, 2);
    world.name = name;
    world.faults.budget = 1;
    faults(&mut world.faults);
    world
}

fn mutated(control: &Control) -> Scripts {
    control
        .patches
        .iter()
        .fold(Scripts::shipped(), |scripts, patch| {
            scripts
                .patched(patch)
                .unwrap_or_else(|e| panic!("control {:?}: {e}", control.name))
        })
}

/// Every world, `quick` for the bounded run CI makes.
pub fn worlds(quick: bool) -> Vec<Entry> {
    let shipped = Scripts::shipped;
    let mut out = vec![
        Entry {
            world: plain("plain lock; a lost reply", shipped(), |f| {
                f.lost_reply = true
            }),
            expect: Expect::Holds,
        },
        Entry {
            world: plain(
                "plain lock; a lost release message or a client crash",
                shipped(),
                |f| {
                    f.lost_message = true;
                    f.crash = true;
                },
            ),
            expect: Expect::Holds,
        },
        Entry {
            world: plain(
                "plain lock; a server restart without persistence (known not to hold)",
                shipped(),
                |f| f.restart = true,
            ),
            expect: Expect::Violated(ONE_HOLDER),
        },
        Entry {
            world: plain(
                "plain lock; a failover that loses the last writes (known not to hold)",
                shipped(),
                |f| f.failover = true,
            ),
            expect: Expect::Violated(ONE_HOLDER),
        },
    ];
    for control in controls::PLAIN {
        let mut world = plain("", mutated(&control), |f| f.lost_reply = true);
        world.name = control.name;
        out.push(Entry {
            world,
            expect: Expect::Violated(control.caught_by),
        });
    }
    if quick {
        for entry in &mut out {
            entry.world.ticks = entry.world.ticks.min(3);
        }
    }
    out
}

/// Checks one world (breadth first, so a counterexample is a shortest one).
pub fn check(entry: &Entry, threads: usize) -> Outcome {
    let started = Instant::now();
    let mut checker = entry.world.clone().checker().threads(threads);
    if let Expect::Violated(property) = entry.expect {
        // Its counterexample found (a shortest: breadth first), the rest can wait.
        checker = checker.finish_when(HasDiscoveries::AnyOf([property].into()));
    }
    let checker = checker.spawn_bfs().join();
    let mut violated = Vec::new();
    let mut held = false;
    for (name, path) in checker.discoveries() {
        if name == world::HELD {
            held = true;
        } else {
            violated.push((name, world::trace(path)));
        }
    }
    violated.sort_by_key(|(name, _)| *name);
    let as_expected = match entry.expect {
        Expect::Holds => violated.is_empty() && held,
        Expect::Violated(property) => violated.iter().any(|(name, _)| *name == property),
    };
    Outcome {
        name: entry.world.name.to_owned(),
        states: checker.unique_state_count(),
        depth: checker.max_depth(),
        time: started.elapsed(),
        violated,
        held,
        as_expected,
    }
}
