//! A held lock passed from one guard to another without a release:
//! [`LockGuard::detach`] lets go of it, [`Client::attach`](crate::Client::attach) takes
//! it over (in this process, or in another that got it as text), confirming with one
//! owner-checked extend that it is still held.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::engine::Protocol;
use crate::error::Error;
use crate::keys;
use crate::limits::{MAX_LEASE, MIN_LEASE};
use crate::protocols;
use crate::token::{FencingToken, HolderToken};

/// The first line of [`DetachedLock::to_text`]: the format and its version.
const HEADER: &str = "fencelock detached lock 1";

/// A held lock that its guard let go of without releasing it
/// ([`LockGuard::detach`](crate::LockGuard::detach)): the key keeps its lease in Redis, renewed by no one, until
/// [`Client::attach`](crate::Client::attach) takes it over or the lease runs out.
///
/// It carries what the holder needs: the name, the holder token (which lets its bearer
/// extend and release the lock), the fencing token, the mode (plain, fair, reentrant,
/// a semaphore's permit, a reader), the lease length, whether the watchdog renews it,
/// and when the [maximum hold](crate::LockBuilder::max_hold) ends (by the wall clock, so
/// that it means the same in another process or on another host). Its `Debug`
/// hides the holder token and the owner id; [`to_text`](Self::to_text) does not: pass
/// that text only to processes you trust (a pipe, not a command line or a log).
#[derive(Clone)]
pub struct DetachedLock {
    pub(crate) name: String,
    pub(crate) token: HolderToken,
    pub(crate) protocol: Arc<dyn Protocol>,
    pub(crate) fence: FencingToken,
    /// The lease each renewal asks for.
    pub(crate) ttl: Duration,
    pub(crate) renew: bool,
    /// When the maximum hold ends, by the wall clock (the one clock another host
    /// shares).
    pub(crate) max_hold_end: Option<SystemTime>,
}

/// Equal when every field is (the mode as it is written).
impl PartialEq for DetachedLock {
    fn eq(&self, other: &Self) -> bool {
        self.name == other.name
            && self.token == other.token
            && self.protocol.to_text() == other.protocol.to_text()
            && self.fence == other.fence
            && self.ttl == other.ttl
            && self.renew == other.renew
            && self.max_hold_end == other.max_hold_end
    }
}

impl Eq for DetachedLock {}

impl fmt::Debug for DetachedLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DetachedLock")
            .field("name", &self.name)
            .field("fencing_token", &self.fence)
            .field("mode", &self.protocol)
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
        let mode = self.protocol.to_text();
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
        let protocol = protocols::from_text(field("mode")?)?;
        Ok(Self {
            name,
            token: HolderToken::from_stored(token.to_ascii_lowercase()),
            protocol,
            fence: FencingToken::new(number("fence")?),
            ttl,
            renew,
            max_hold_end,
        })
    }
}
