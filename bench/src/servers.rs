//! The redis-servers of a run and the machine they run on: the servers of the scenarios
//! that do not use the main one, CPU pinning for the latency runs, and what the servers
//! and the machine say about themselves (Redis version, commands processed, CPU model,
//! load average).

use std::time::Duration;

use crate::affinity;
use crate::plan::REDLOCK_NODES;

/// The servers of the scenarios that do not use the main one.
pub(crate) struct Servers {
    /// Independent nodes for the Redlock clients.
    pub(crate) redlock: Vec<testkit::RedisServer>,
    /// The held-locks scenario's own node.
    pub(crate) held: testkit::RedisServer,
}

impl Servers {
    /// Starts [`REDLOCK_NODES`] nodes for Redlock, then the held-locks scenario's node
    /// (testkit ties each server's PR_SET_PDEATHSIG to the calling thread).
    pub(crate) fn start() -> Self {
        Servers {
            redlock: testkit::RedisServer::start_many(REDLOCK_NODES),
            held: testkit::RedisServer::start(),
        }
    }
}

/// Pins the harness thread (or `client`, a process) to the first CPU it may use and
/// every server to the others (round robin), until the result is dropped; and says where
/// each runs.
pub(crate) fn pin_for_latency(
    client: Option<u32>,
    main: &testkit::RedisServer,
    redlock: &[testkit::RedisServer],
) -> (affinity::Pins, String) {
    let cpus = affinity::allowed_cpus();
    if cpus.len() < 2 {
        return (
            affinity::Pins::default(),
            format!("not pinned ({} CPU allowed)", cpus.len()),
        );
    }
    let (client_cpu, rest) = (cpus[0], &cpus[1..]);
    let mut pins = affinity::Pins::default();
    let pinned = (|| {
        match client {
            None => pins.pin_thread(client_cpu)?,
            Some(pid) => pins.pin_process(pid, client_cpu)?,
        }
        pins.pin_process(main.pid(), rest[0])?;
        for (i, s) in redlock.iter().enumerate() {
            pins.pin_process(s.pid(), rest[i % rest.len()])?;
        }
        Ok::<_, std::io::Error>(())
    })();
    if let Err(e) = pinned {
        drop(pins);
        return (affinity::Pins::default(), format!("not pinned ({e})"));
    }
    let who = if client.is_some() {
        "the driver (all its threads)"
    } else {
        "the harness (one thread)"
    };
    let placement = if rest.len() == 1 {
        format!(
            "{who} pinned to CPU {client_cpu}, every redis-server to CPU {}",
            rest[0]
        )
    } else {
        let nodes: Vec<String> = (0..redlock.len())
            .map(|i| rest[i % rest.len()].to_string())
            .collect();
        format!(
            "{who} pinned to CPU {client_cpu}, the single node to CPU {}, the Redlock nodes \
             to CPUs {}",
            rest[0],
            nodes.join(", ")
        )
    };
    (pins, placement)
}

/// Pins the harness thread to the first CPU it may use and every server in `servers`
/// (`(what, server)`) to the others, round robin in that order, until the result is
/// dropped; and says where each runs. As [`pin_for_latency`], for the Sentinel and
/// Cluster runs, whose servers are many processes.
pub(crate) fn pin_apart(servers: &[(&str, &testkit::RedisServer)]) -> (affinity::Pins, String) {
    let cpus = affinity::allowed_cpus();
    if cpus.len() < 2 {
        return (
            affinity::Pins::default(),
            format!("not pinned ({} CPU allowed)", cpus.len()),
        );
    }
    let (client_cpu, rest) = (cpus[0], &cpus[1..]);
    let mut pins = affinity::Pins::default();
    let mut placed = Vec::new();
    let pinned = (|| {
        pins.pin_thread(client_cpu)?;
        for (i, (what, s)) in servers.iter().enumerate() {
            let cpu = rest[i % rest.len()];
            pins.pin_process(s.pid(), cpu)?;
            let said = format!("{what} to CPU {cpu}");
            if !placed.contains(&said) {
                placed.push(said);
            }
        }
        Ok::<_, std::io::Error>(())
    })();
    if let Err(e) = pinned {
        drop(pins);
        return (affinity::Pins::default(), format!("not pinned ({e})"));
    }
    let placement = if rest.len() == 1 {
        format!(
            "the harness (one thread) pinned to CPU {client_cpu}, every redis-server ({}) to \
             CPU {}",
            servers
                .iter()
                .fold(Vec::new(), |mut seen, (what, _)| {
                    if !seen.contains(what) {
                        seen.push(*what);
                    }
                    seen
                })
                .join(", "),
            rest[0]
        )
    } else {
        format!(
            "the harness (one thread) pinned to CPU {client_cpu}, {}",
            placed.join(", ")
        )
    };
    (pins, placement)
}

/// The `redis_version` of `INFO server`, or `unknown`.
pub(crate) fn redis_version(server: &testkit::RedisServer) -> String {
    let info = server.cmd(&["INFO", "server"]);
    info.as_str()
        .and_then(|t| t.lines().find_map(|l| l.strip_prefix("redis_version:")))
        .unwrap_or("unknown")
        .trim()
        .to_owned()
}

/// `total_commands_processed` of `INFO stats`: to count what a run sent to Redis.
pub(crate) fn commands_processed(server: &testkit::RedisServer) -> Option<u64> {
    let info = server
        .try_cmd(&["INFO", "stats"], Duration::from_secs(5))
        .ok()?;
    info.as_str()?
        .lines()
        .find_map(|l| l.strip_prefix("total_commands_processed:"))?
        .trim()
        .parse()
        .ok()
}

/// `(CPU model, load average 1/5/15)`.
pub(crate) fn machine() -> (String, String) {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown".to_owned());
    let load = std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".to_owned());
    (cpu, load)
}
