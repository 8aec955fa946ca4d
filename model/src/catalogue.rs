//! The worlds `scripts/model` checks, each with what it must show: every property
//! holding, or a named property violated (a control's mutation caught, or a case the
//! docs state fencelock does not cover).

use std::time::{Duration, Instant};

use stateright::{Checker, HasDiscoveries, Model};

use crate::client::Kind;
use crate::controls::{self, Control, ONE_HOLDER};
use crate::first::First;
use crate::scripts::Scripts;
use crate::world::{self, World};

/// What a world must show.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expect {
    /// Every safety property holds, and a client does hold the lock somewhere.
    Holds,
    /// This property is violated: a control caught, or a case known not to hold.
    Violated(&'static str),
    /// This property is violated (a case known not to hold) and every other holds:
    /// explored in full, where [`Expect::Violated`] stops at the first counterexample.
    Only(&'static str),
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

/// Redlock's world with one node restart (its keys lost), with restart protection or
/// without: one tick; in the quick run each acquire makes 2 attempts at most (the
/// fewest that reach a restarted node again: the first call after the restart fails
/// on the connection it closed), in the full run 3.
fn redlock_restart(name: &'static str, protected: bool, quick: bool) -> World {
    let mut world = World::redlock(name, Scripts::shipped(), protected);
    world.faults.restart = true;
    world.faults.budget = 1;
    world.ticks = 1;
    if quick {
        world.max_attempts = Some(2);
    }
    world
}

/// Redlock's world (restart protection on) with the given faults (budget 1): one tick
/// in the quick run, two in the full.
fn redlock_faults(name: &'static str, quick: bool, faults: impl Fn(&mut world::Faults)) -> World {
    let mut world = World::redlock(name, Scripts::shipped(), true);
    world.faults.budget = 1;
    faults(&mut world.faults);
    world.ticks = if quick { 1 } else { 2 };
    world
}

/// Redlock's world (restart protection on) where one node's clock jumps ahead by
/// `skew_ms`, once, at any moment: two ticks, so that leases run out.
fn skewed(name: &'static str, skew_ms: i64) -> World {
    let mut world = World::redlock(name, Scripts::shipped(), true);
    world.ticks = 2;
    world.skew_ms = skew_ms;
    world
}

/// The fair lock's dead head: 2 fair clients queue behind a holder that is gone (its
/// lease runs out unreleased), and one of them may crash (`crash`); their waiter
/// timeout is 1.2 s (they call again every 400 ms), and the clock runs to 1.2 s, the
/// first waiter's deadline to call again (a deadline at the server's now has passed),
/// so that the other's attempts meet a silent head (crashed, or paused as long, which
/// every interleaving has and the server cannot tell apart) at the bound at which the
/// scripts must purge it. (With the worlds' 3 s timeout and 6 ticks, or 1.2 s and 3
/// ticks, it outgrew 9 GB.)
fn dead_head(name: &'static str, scripts: Scripts, crash: bool) -> World {
    let fair = Kind::Fair(Duration::from_millis(1_200));
    let mut world = World::new(name, scripts, vec![fair; 2], 1);
    world.held_at_start = true;
    world.faults.crash = crash;
    world.faults.budget = 1;
    world.ticks = 2;
    world
}

/// The fair lock's dead head purged by a release: `clients` fair clients with a waiter
/// timeout of 600 ms (they call again every 200 ms), shorter than the 1 s lease, so
/// that the first to take the lock may still hold it at 600 ms, the deadline of a
/// waiter that queued at the start and was silent since (paused: its answer waits in
/// the network); the clock runs one tick, to 600 ms. A release then must purge that
/// head and hand the lock to the waiter behind it, alive as it called again since (3
/// clients), or to nobody (2). With `crash`, a client may also crash (a head that stops
/// calling for good; the server cannot tell it from the pause).
fn release_purge(name: &'static str, scripts: Scripts, clients: usize, crash: bool) -> World {
    let fair = Kind::Fair(Duration::from_millis(600));
    let mut world = World::new(name, scripts, vec![fair; clients], 1);
    world.ticks = 1;
    world.faults.crash = crash;
    world.faults.budget = u8::from(crash);
    world
}

/// The watchdog's world: 2 plain clients whose holders' leases are renewed by the
/// library's watchdog ([`World::watchdog`]), over 2 ticks (1.2 s: a lease runs out
/// unrenewed), with one lost reply: a renewal's (quick), or any (`every_reply`). A
/// holder's watchdog wakes on a timer, which the clock may run past: a client paused
/// past its lease (its renewal stalled, or sent and not yet run) is in every
/// interleaving. (Over 3 ticks, with a lost renewal's reply only, it outgrew 7 GB.)
fn renewing(name: &'static str, scripts: Scripts, every_reply: bool) -> World {
    let mut world = World::new(name, scripts, vec![Kind::Plain; 2], 1);
    world.watchdog = true;
    world.faults.lost_renewal = true;
    world.faults.lost_reply = every_reply;
    world.faults.budget = 1;
    world.ticks = 2;
    world
}

/// `world` with each holder writing to the fenced resource before it releases.
fn fenced(mut world: World) -> World {
    world.fenced_writes = true;
    world
}

/// A world of one client of each kind, without faults.
fn of(name: &'static str, scripts: Scripts, kinds: &[Kind]) -> World {
    World::new(name, scripts, kinds.to_vec(), 2)
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

/// Every world, `quick` for the bounded run CI makes (each client takes the lock once,
/// a lost reply within two ticks).
pub fn worlds(quick: bool) -> Vec<Entry> {
    let shipped = Scripts::shipped;
    let holds = |world| Entry {
        world,
        expect: Expect::Holds,
    };
    let mut semaphore = of(
        "semaphore of 2 permits, 3 clients",
        shipped(),
        &[Kind::Semaphore(2); 3],
    );
    semaphore.max_holders = 2;
    let mut rwlock = of(
        "read-write lock: a writer and 2 readers",
        shipped(),
        &[Kind::Plain, Kind::Read, Kind::Read],
    );
    // Three clients: a shorter horizon keeps them in bounds (quick: no lease runs out;
    // the semaphore's full run: one lease and a bit).
    semaphore.ticks = if quick { 1 } else { 2 };
    rwlock.ticks = 1;
    let mut lost_reply = plain("plain lock; a lost reply", shipped(), |f| {
        f.lost_reply = true
    });
    if quick {
        lost_reply.ticks = 2;
    }
    // Redlock: one tick in the quick run (a lease does not run out), two in the full.
    let mut redlock = World::redlock("Redlock, 3 nodes; no faults", shipped(), true);
    redlock.ticks = if quick { 1 } else { 2 };
    let mut out = vec![
        holds(plain("plain lock; no faults", shipped(), |_| {})),
        holds(lost_reply),
        holds(plain(
            "plain lock; a lost release message or a client crash",
            shipped(),
            |f| {
                f.lost_message = true;
                f.crash = true;
            },
        )),
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
        Entry {
            world: {
                let mut world = plain(
                    "plain lock; the server's clock runs 30 ms ahead (known not to hold)",
                    shipped(),
                    |_| {},
                );
                world.max_drift_ms = 30;
                world
            },
            expect: Expect::Violated(ONE_HOLDER),
        },
        Entry {
            world: {
                let mut world = plain(
                    "plain lock; the server's clock steps forward a tick (known not to hold)",
                    shipped(),
                    |_| {},
                );
                world.max_drift_ms = world.tick_ms;
                world
            },
            expect: Expect::Violated(ONE_HOLDER),
        },
        holds(of("fair lock, 2 clients", shipped(), &[Kind::FAIR; 2])),
        // Three in line: one tick, so no lease runs out (2 ticks passed 16 GB in 4 minutes).
        holds({
            let mut three = of("fair lock, 3 clients", shipped(), &[Kind::FAIR; 3]);
            three.ticks = 1;
            three
        }),
        // Quick: the head stops calling by a pause only (twice the states with a crash).
        holds(dead_head(
            "fair lock; a head of the queue that stops calling (crashed or paused)",
            shipped(),
            !quick,
        )),
        // Quick: the head and the holder only (3 clients: 1.9 million states, 67 s).
        holds(release_purge(
            "fair lock; a release behind a head of the queue that stopped calling",
            shipped(),
            if quick { 2 } else { 3 },
            false,
        )),
        holds(release_purge(
            "fair lock; a release behind a head of the queue that crashed",
            shipped(),
            if quick { 2 } else { 3 },
            true,
        )),
        holds(semaphore),
        holds(of(
            "reentrant lock, 2 clients",
            shipped(),
            &[Kind::Reentrant; 2],
        )),
        holds(rwlock),
        holds(of(
            "election: 2 candidates (one leader per term)",
            shipped(),
            &[Kind::Election; 2],
        )),
        holds(of(
            "multi-lock: 2 clients take x and y in opposite orders",
            shipped(),
            &[Kind::Multi; 2],
        )),
        holds(redlock),
        holds(fenced(redlock_restart(
            "Redlock; a node restart, with restart protection and a fenced resource",
            true,
            quick,
        ))),
        Entry {
            world: redlock_restart(
                "Redlock; a node restart without restart protection (known not to hold)",
                false,
                quick,
            ),
            expect: Expect::Violated(ONE_HOLDER),
        },
    ];
    // One tick (2: beyond 2.5 GB after 9 minutes); quick: 2 attempts.
    let mut late = redlock_faults(
        "Redlock; a late answer (after the verdict, or slow)",
        quick,
        |f| f.late_answer = true,
    );
    late.ticks = 1;
    if quick {
        late.max_attempts = Some(2);
    }
    out.push(holds(late));
    // Two lost messages: a release wakes a waiter from each node that listed it (the
    // majority that refused it). Quick: one tick, where no timer ends before the
    // horizon; full: two, where a waiter that missed them wakes on its timer and
    // takes the lock.
    let mut lost = redlock_faults("Redlock; lost release messages (2)", quick, |f| {
        f.lost_message = true
    });
    lost.faults.budget = 2;
    out.push(holds(lost));
    // A node's clock that runs fast, its whole gain at one moment: a tick (600 ms,
    // inside a 1 s lease) on a node of the holder's majority lets another take it.
    out.push(Entry {
        world: skewed(
            "Redlock; a node's clock steps forward a tick (known not to hold)",
            600,
        ),
        expect: Expect::Violated(ONE_HOLDER),
    });
    if !quick {
        // A restart over 2 ticks, where a lease runs out and a quarantine ends: 2
        // attempts (3.4 million states, 3.7 GB).
        let mut late_restart = redlock_restart(
            "Redlock; a node restart over 2 ticks, with restart protection",
            true,
            true,
        );
        late_restart.ticks = 2;
        out.push(holds(late_restart));
        // Within the library's drift allowance (validity = ttl - elapsed - drift, drift
        // 1% of the lease + 2 ms: 12 ms), and 8 ms beyond it (the counterexample: a
        // waiter wakes on its timer as the fast node's key ends, 6 ms before the
        // holder's validity).
        out.push(holds(skewed(
            "Redlock; a node's clock jumps 12 ms ahead (the drift allowance)",
            12,
        )));
        out.push(Entry {
            world: skewed(
                "Redlock; a node's clock jumps 20 ms ahead (known not to hold)",
                20,
            ),
            expect: Expect::Violated(ONE_HOLDER),
        });
        // The library gives up 1% of the lease and 2 ms to the clocks' drift: 12 ms of
        // the worlds' 1 s lease (0.5 million states, 19 s: the full run only).
        out.push(holds({
            let mut world = plain(
                "plain lock; the server's clock runs 12 ms ahead (the drift allowance)",
                shipped(),
                |_| {},
            );
            world.max_drift_ms = 12;
            world
        }));
        // The quick run checks restart protection with the fenced resource only: its
        // holders write before they release, so it checks every property of the world
        // without, and the resource's.
        out.push(holds(redlock_restart(
            "Redlock; a node restart, with restart protection",
            true,
            quick,
        )));
        // Two holders at once, and yet the resource takes no lower token: fencing is
        // what keeps it safe where Redlock alone does not (explored in full, 0.9 million
        // states in 44 s; the quick run's 2 attempts would add 0.4 million and 18 s).
        out.push(Entry {
            world: fenced(redlock_restart(
                "Redlock; a node restart without restart protection, a fenced resource",
                false,
                quick,
            )),
            expect: Expect::Only(ONE_HOLDER),
        });
    }
    // Each client takes the lock once, but in the full run's fault-free plain world
    // twice (4.7 million states; with a fault, twice outgrows 9 GB).
    for entry in &mut out {
        if quick || entry.world.name != "plain lock; no faults" {
            entry.world.rounds = 1;
        }
    }
    // The controls: each stops at the first counterexample its breadth-first search meets.
    for control in controls::PLAIN {
        let mut world = plain("", mutated(&control), |_| {});
        world.name = control.name;
        out.push(Entry {
            world,
            expect: Expect::Violated(control.caught_by),
        });
    }
    let control = controls::WAKE_LIST_DROPS_A_WAITER;
    out.push(Entry {
        world: plain(control.name, mutated(&control), |_| {}),
        expect: Expect::Violated(control.caught_by),
    });
    let control = controls::REFUSAL_OVERSTATES_THE_LEASE;
    out.push(Entry {
        world: plain(control.name, mutated(&control), |_| {}),
        expect: Expect::Violated(control.caught_by),
    });
    let control = controls::MULTI_REFUSAL_OVERSTATES_THE_LEASE;
    out.push(Entry {
        world: of(control.name, mutated(&control), &[Kind::Multi; 2]),
        expect: Expect::Violated(control.caught_by),
    });
    let control = controls::CAMPAIGN_WITHOUT_NX;
    out.push(Entry {
        world: of(control.name, mutated(&control), &[Kind::Election; 2]),
        expect: Expect::Violated(control.caught_by),
    });
    let control = controls::FAIR_QUEUE_JUMPED;
    out.push(Entry {
        world: of(control.name, mutated(&control), &[Kind::FAIR; 3]),
        expect: Expect::Violated(control.caught_by),
    });
    for control in [
        controls::FAIR_FAST_PATH_IGNORES_HOLDER,
        controls::FAIR_FAST_TOKEN_NOT_RAISED,
    ] {
        out.push(Entry {
            world: of(control.name, mutated(&control), &[Kind::FAIR; 2]),
            expect: Expect::Violated(control.caught_by),
        });
    }
    let control = controls::FAIR_DEAD_HEAD_KEPT;
    out.push(Entry {
        world: dead_head(control.name, mutated(&control), false),
        expect: Expect::Violated(control.caught_by),
    });
    let control = controls::FAIR_RELEASE_KEEPS_DEAD_HEAD;
    out.push(Entry {
        world: release_purge(control.name, mutated(&control), 2, false),
        expect: Expect::Violated(control.caught_by),
    });
    if !quick {
        // With a live waiter behind the dead head, which the release must hand the lock.
        let mut world = release_purge(control.name, mutated(&control), 3, false);
        world.name = "a fair release that never purges a dead head (3 clients)";
        out.push(Entry {
            world,
            expect: Expect::Violated(control.caught_by),
        });
    }
    // The fallback bound in Redlock: the pause comes from the majority's refusals.
    let control = controls::REFUSAL_OVERSTATES_THE_LEASE;
    let mut world = World::redlock(
        "a refusal that reports 3 s more than the lease (acquire.lua; Redlock)",
        mutated(&control),
        true,
    );
    world.ticks = 1;
    out.push(Entry {
        world,
        expect: Expect::Violated(control.caught_by),
    });
    let control = controls::REDLOCK_COUNTER_NOT_RAISED;
    let mut world = World::redlock(control.name, mutated(&control), true);
    world.ticks = 1;
    out.push(Entry {
        world,
        expect: Expect::Violated(control.caught_by),
    });
    if !quick {
        // Redlock's two holders at once (a restart without protection) write in either
        // order: the resource's check is what keeps the older token out. (The plain
        // world catches this control in the quick run; here it takes 10 s.)
        let control = controls::FENCE_CHECK_SKIPPED;
        let mut world = fenced(redlock_restart(
            "a fenced write without the token check (Redlock, a restart without protection)",
            false,
            quick,
        ));
        world.scripts = mutated(&control);
        out.push(Entry {
            world,
            expect: Expect::Violated(control.caught_by),
        });
    }
    // Quick: a renewal's reply lost (0.45 million states); full: any reply (1.5 million).
    out.push(holds(renewing(
        "plain lock, renewed by the watchdog; a lost reply, a holder paused past its lease",
        shipped(),
        !quick,
    )));
    let control = controls::RENEW_WITHOUT_OWNER_CHECK;
    out.push(Entry {
        world: renewing(control.name, mutated(&control), false),
        expect: Expect::Violated(control.caught_by),
    });
    let control = controls::SEMAPHORE_FAST_PATH_ONE_TOO_MANY;
    let mut permits = of(control.name, mutated(&control), &[Kind::Semaphore(2); 3]);
    permits.max_holders = 2;
    permits.ticks = 1;
    out.push(Entry {
        world: permits,
        expect: Expect::Violated(control.caught_by),
    });
    for control in [
        controls::READ_FAST_TOKEN_NOT_RAISED,
        controls::WRITER_OVER_READERS,
    ] {
        let mut readers = of(
            control.name,
            mutated(&control),
            &[Kind::Plain, Kind::Read, Kind::Read],
        );
        readers.ticks = 1;
        out.push(Entry {
            world: readers,
            expect: Expect::Violated(control.caught_by),
        });
    }
    out
}

/// Checks one world, breadth first. The path kept to a violation is the first one the
/// search met ([`First`]): with one thread, a shortest.
pub fn check(entry: &Entry, threads: usize) -> Outcome {
    let started = Instant::now();
    let mut checker = First::new(entry.world.clone()).checker().threads(threads);
    if let Expect::Violated(property) = entry.expect {
        // Its counterexample found, the rest can wait.
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
        Expect::Only(property) => held && violated.iter().all(|(name, _)| *name == property),
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
