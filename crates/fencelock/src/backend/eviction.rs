//! Whether a server can evict lock keys: [`EvictionRisk`], read from its `INFO memory`,
//! or [`PolicyUnknown`] where that cannot be read.
//! A node checks once per connection and warns; the API reports them
//! ([`Client::eviction_risks`](crate::Client::eviction_risks)).

use std::fmt;

/// A server that can evict lock keys: it has a `maxmemory` limit and a
/// `maxmemory-policy` other than `noeviction`. When its memory fills, Redis deletes keys
/// to make room: with a `volatile-*` policy the keys with an expiry first, which every
/// held lock key is, so a lock can vanish while its holder works and another client
/// take it (two holders at once); with an `allkeys-*` policy any key, the fencing
/// counters too (the next token then comes from the server clock, so tokens still
/// increase as long as that clock does not step back). The remedy is
/// `maxmemory-policy noeviction` on the servers that hold locks (writes then fail with
/// an error instead, which fencelock reports).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct EvictionRisk {
    /// The server, as `host:port`.
    pub node: String,
    /// Its `maxmemory-policy`, such as `volatile-lru` or `allkeys-lru`.
    pub policy: String,
    /// Its `maxmemory`, in bytes.
    pub maxmemory: u64,
    /// Whether the policy can evict keys without an expiry: the fencing counters.
    pub counters_too: bool,
}

impl fmt::Display for EvictionRisk {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} may evict lock keys before their lease ends (maxmemory-policy {}, maxmemory \
             {} bytes): two clients could then hold a lock at once{}; set maxmemory-policy \
             noeviction on the servers that hold locks",
            self.node,
            self.policy,
            self.maxmemory,
            if self.counters_too {
                ", and fencing counters can go too"
            } else {
                ""
            }
        )
    }
}

/// A server whose eviction policy could not be read: it answered, but refused `INFO`
/// (renamed away, as some managed services do, or not allowed to the Redis user) or its
/// `INFO memory` shows no `maxmemory` and `maxmemory_policy` (some proxies). Whether it
/// can evict lock keys is unknown: check its `maxmemory-policy` where it is configured.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct PolicyUnknown {
    /// The server, as `host:port` (a cluster's seeds, when no master could be named).
    pub node: String,
    /// Why: the server's refusal, or what its answer lacked.
    pub why: String,
}

impl fmt::Display for PolicyUnknown {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the eviction policy of {} is unknown ({}): if it evicts keys (a maxmemory-policy \
             other than noeviction), two clients could hold a lock at once; check its \
             maxmemory-policy",
            self.node, self.why
        )
    }
}

/// The eviction risk of the server at `node`, from its `INFO memory` text: `None` when
/// it cannot evict (no `maxmemory`, or `noeviction`), [`PolicyUnknown`] when the text
/// says neither field.
pub(crate) fn eviction_risk(node: &str, info: &str) -> Result<Option<EvictionRisk>, PolicyUnknown> {
    let field = |name: &str| {
        info.lines()
            .find_map(|l| l.strip_prefix(name))
            .map(str::trim)
    };
    let (Some(maxmemory), Some(policy)) = (
        field("maxmemory:").and_then(|m| m.parse::<u64>().ok()),
        field("maxmemory_policy:"),
    ) else {
        return Err(PolicyUnknown {
            node: node.to_owned(),
            why: "its INFO memory shows no maxmemory and maxmemory_policy".to_owned(),
        });
    };
    if maxmemory == 0 || policy == "noeviction" {
        return Ok(None);
    }
    Ok(Some(EvictionRisk {
        node: node.to_owned(),
        policy: policy.to_owned(),
        maxmemory,
        counters_too: policy.starts_with("allkeys-"),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_policy_that_can_evict_is_a_risk_only_with_a_memory_limit() {
        let info = |max: u64, policy: &str| {
            format!(
                "# Memory\r\nused_memory:1000\r\nmaxmemory:{max}\r\nmaxmemory_human:x\r\nmaxmemory_policy:{policy}\r\n"
            )
        };
        assert_eq!(eviction_risk("a:1", &info(0, "volatile-lru")), Ok(None));
        assert_eq!(eviction_risk("a:1", &info(1 << 20, "noeviction")), Ok(None));
        let volatile = eviction_risk("a:1", &info(1 << 20, "volatile-ttl"))
            .unwrap()
            .unwrap();
        assert_eq!(
            (
                volatile.policy.as_str(),
                volatile.maxmemory,
                volatile.counters_too
            ),
            ("volatile-ttl", 1 << 20, false)
        );
        assert!(
            eviction_risk("a:1", &info(5, "allkeys-lfu"))
                .unwrap()
                .unwrap()
                .counters_too
        );
        let unknown = eviction_risk("a:1", "# Memory\r\n").unwrap_err();
        assert!(
            unknown
                .to_string()
                .starts_with("the eviction policy of a:1 is unknown (its INFO memory shows no"),
            "{unknown}"
        );
    }
}
