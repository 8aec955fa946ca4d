//! A held lock passed from one guard to another without a release:
//! [`LockGuard::detach`] lets go of it, [`Client::attach`](crate::Client::attach) takes
//! it over (in this process, or in another that got it as text), confirming with one
//! owner-checked extend that it is still held.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::algorithms::watchdog::Grant;
use crate::backend::Mode;
use crate::error::Error;
use crate::keys::{self, LockKeys};
use crate::limits::{MAX_LEASE, MIN_LEASE};
use crate::lock::{Held, LockGuard};
use crate::shared::Shared;
use crate::token::{FencingToken, HolderToken};

/// The first line of [`DetachedLock::to_text`]: the format and its version.
const HEADER: &str = "fencelock detached lock 1";

/// A held lock that its guard let go of without releasing it
/// ([`LockGuard::detach`]): the key keeps its lease in Redis, renewed by no one, until
/// [`Client::attach`](crate::Client::attach) takes it over or the lease runs out.
///
/// It carries what the holder needs: the name, the holder token (which lets its bearer
/// extend and release the lock), the fencing token, the mode (plain, fair, reentrant,
/// a semaphore's permit, a reader), the lease length, whether the watchdog renews it,
/// and when the [maximum hold](crate::LockBuilder::max_hold) ends (by the wall clock, so
/// that it means the same in another process or on another host). Its `Debug`
/// hides the holder token and the owner id; [`to_text`](Self::to_text) does not: pass
/// that text only to processes you trust (a pipe, not a command line or a log).
#[derive(Clone, PartialEq, Eq)]
pub struct DetachedLock {
    pub(crate) name: String,
    pub(crate) token: HolderToken,
    pub(crate) mode: Mode,
    pub(crate) fence: FencingToken,
    /// The lease each renewal asks for.
    pub(crate) ttl: Duration,
    pub(crate) renew: bool,
    /// When the maximum hold ends, by the wall clock (the one clock another host
    /// shares).
    pub(crate) max_hold_end: Option<SystemTime>,
}

impl fmt::Debug for DetachedLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DetachedLock")
            .field("name", &self.name)
            .field("fencing_token", &self.fence)
            .field("mode", &self.mode)
            .field("ttl", &self.ttl)
            .field("renew", &self.renew)
            .field("max_hold_end", &self.max_hold_end)
            .finish_non_exhaustive()
    }
}

impl DetachedLock {
    /// The lock name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The fencing token of the grant, which a guard that attaches it keeps.
    pub fn fencing_token(&self) -> FencingToken {
        self.fence
    }

    /// The lock as text, for another process to [`from_text`](Self::from_text) and
    /// attach: one `key=value` per line after a header line. It holds the holder token
    /// (and a reentrant owner id), which let whoever reads it extend and release the
    /// lock: never log it, and pass it through a pipe or a file only you can read.
    pub fn to_text(&self) -> String {
        let mode = match &self.mode {
            Mode::Plain => "plain".to_owned(),
            Mode::Fair { waiter_timeout } => format!("fair {}", waiter_timeout.as_millis()),
            Mode::Reentrant { owner } => format!("reentrant {owner}"),
            Mode::Semaphore { permits, fair } => match fair {
                Some(timeout) => format!("semaphore {permits} {}", timeout.as_millis()),
                None => format!("semaphore {permits}"),
            },
            Mode::Read { owner } => format!("read {owner}"),
        };
        let max_hold = self.max_hold_end.map_or_else(
            || "none".to_owned(),
            |end| {
                end.duration_since(UNIX_EPOCH)
                    .unwrap_or_default()
                    .as_millis()
                    .to_string()
            },
        );
        format!(
            "{HEADER}\nname={}\ntoken={}\nfence={}\nttl_ms={}\nrenew={}\nmax_hold_end_unix_ms={max_hold}\nmode={mode}\n",
            self.name,
            self.token.as_str(),
            self.fence.get(),
            self.ttl.as_millis(),
            u8::from(self.renew),
        )
    }

    /// Reads what [`to_text`](Self::to_text) wrote.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for text in another format or with a bad field (it
    /// names the field, never the token).
    pub fn from_text(text: &str) -> Result<Self, Error> {
        let bad = |reason: &str| Error::invalid("detached lock", reason.to_owned());
        let mut lines = text.lines();
        if lines.next() != Some(HEADER) {
            return Err(bad(&format!("the text does not start with {HEADER:?}")));
        }
        let mut fields = std::collections::HashMap::new();
        for line in lines.filter(|l| !l.is_empty()) {
            let (key, value) = line
                .split_once('=')
                .ok_or_else(|| bad("a line is not key=value"))?;
            fields.insert(key, value);
        }
        let field = |key: &str| {
            fields
                .get(key)
                .copied()
                .ok_or_else(|| bad(&format!("no {key} field")))
        };
        let number = |key: &str| -> Result<u64, Error> {
            field(key)?
                .parse()
                .map_err(|_| bad(&format!("{key} is not a number")))
        };
        let name = field("name")?.to_owned();
        keys::validate_name(&name)?;
        let token = field("token")?;
        if token.len() != 32 || !token.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(bad("token is not 32 hex digits"));
        }
        let ttl = Duration::from_millis(number("ttl_ms")?);
        Error::check_range("lease", ttl, MIN_LEASE, MAX_LEASE)?;
        let renew = match field("renew")? {
            "1" => true,
            "0" => false,
            _ => return Err(bad("renew is not 0 or 1")),
        };
        let max_hold_end = match field("max_hold_end_unix_ms")? {
            "none" => None,
            ms => Some(
                UNIX_EPOCH
                    + Duration::from_millis(
                        ms.parse()
                            .map_err(|_| bad("max_hold_end_unix_ms is not a number"))?,
                    ),
            ),
        };
        let mode = field("mode")?;
        let (kind, rest) = mode.split_once(' ').unwrap_or((mode, ""));
        let ms = |text: &str| -> Result<Duration, Error> {
            text.parse()
                .map(Duration::from_millis)
                .map_err(|_| bad("the mode's duration is not a number"))
        };
        let mode = match kind {
            "plain" => Mode::Plain,
            "fair" => Mode::Fair {
                waiter_timeout: ms(rest)?,
            },
            "reentrant" => Mode::Reentrant {
                owner: crate::lock::checked_owner(rest)?,
            },
            "semaphore" => {
                let (permits, fair) = match rest.split_once(' ') {
                    Some((permits, timeout)) => (permits, Some(ms(timeout)?)),
                    None => (rest, None),
                };
                Mode::Semaphore {
                    permits: permits
                        .parse()
                        .map_err(|_| bad("the permit count is not a number"))?,
                    fair,
                }
            }
            "read" => Mode::Read {
                owner: if rest.is_empty() {
                    String::new()
                } else {
                    crate::lock::checked_owner(rest)?
                },
            },
            _ => return Err(bad("mode is not one fencelock writes")),
        };
        Ok(Self {
            name,
            token: HolderToken::from_stored(token.to_ascii_lowercase()),
            mode,
            fence: FencingToken::new(number("fence")?),
            ttl,
            renew,
            max_hold_end,
        })
    }
}

/// [`Client::attach`](crate::Client::attach).
pub(crate) async fn attach(shared: &Arc<Shared>, lock: DetachedLock) -> Result<LockGuard, Error> {
    let keys = LockKeys::new(&shared.prefix, &lock.name)?;
    let max_hold_left = lock.max_hold_end.map(|end| {
        end.duration_since(SystemTime::now())
            .unwrap_or(Duration::ZERO)
    });
    let hold_until = max_hold_left.map(|left| Instant::now() + left);
    // Not past the maximum hold: the confirming extend ends there at the latest.
    let (ttl, capped) = match max_hold_left {
        Some(left) if left < MIN_LEASE => {
            return Err(Error::LeaseLost {
                name: lock.name,
                cause: crate::LossCause::MaxHold,
            });
        }
        Some(left) if left <= lock.ttl => (left, true),
        _ => (lock.ttl, false),
    };
    let holder = lock.mode.holder_id(&lock.token).into_owned();
    let (sent_at, valid_until) = shared
        .backend
        .extend(&lock.name, &keys, &holder, ttl)
        .await?;
    Ok(LockGuard::watched(
        shared.clone(),
        lock.name,
        Held {
            keys,
            token: lock.token,
            mode: lock.mode,
            fence: lock.fence,
            asked_ttl: ttl,
            ttl: lock.ttl,
            renew: lock.renew,
            hold_until,
        },
        Grant {
            sent_at,
            ttl,
            capped,
            valid_until,
        },
    ))
}
