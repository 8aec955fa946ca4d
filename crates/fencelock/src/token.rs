//! The two tokens of a grant: who holds the lock ([`HolderToken`]) and in which order the
//! grants happened ([`FencingToken`]).

use std::fmt;
use std::time::Instant;

/// The random value stored in the lock key while a holder owns it.
///
/// 128 bits from a CSPRNG seeded by the operating system (`rand`'s `ThreadRng`), fresh
/// for every acquisition, written as
/// 32 lowercase hex digits. Release and extend only act when the key still holds this
/// exact value, so a holder whose lease expired can never delete or prolong the lock of
/// the next holder. The key holds the token as a plain string, the format redis-py's
/// `Lock`, redsync and node-redlock use too, so those libraries and fencelock exclude each
/// other on the same key.
#[derive(Clone)]
pub struct HolderToken {
    token: String,
    /// When this client drew it (`None`: read back, drawn elsewhere or earlier): a node
    /// that held back every acquire since before then has nothing of it to release
    /// (see [`UnavailableReason::Stalled`](crate::UnavailableReason::Stalled)).
    drawn: Option<Instant>,
}

impl HolderToken {
    /// Draws a fresh token.
    pub(crate) fn generate() -> Self {
        Self {
            token: random_hex32(),
            drawn: Some(Instant::now()),
        }
    }

    /// A token read back (a [`DetachedLock`](crate::DetachedLock) taken over); the
    /// caller checked it is 32 lowercase hex digits.
    pub(crate) fn from_stored(token: String) -> Self {
        Self { token, drawn: None }
    }

    /// The token as stored in Redis.
    pub fn as_str(&self) -> &str {
        &self.token
    }

    /// When this client drew the token, before any call carried it; `None` for a token
    /// read back.
    pub(crate) fn drawn(&self) -> Option<Instant> {
        self.drawn
    }
}

/// Tokens are equal when their text is: when each was drawn does not matter.
impl PartialEq for HolderToken {
    fn eq(&self, other: &Self) -> bool {
        self.token == other.token
    }
}

impl Eq for HolderToken {}

impl std::hash::Hash for HolderToken {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.token.hash(state);
    }
}

impl fmt::Display for HolderToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.token)
    }
}

impl fmt::Debug for HolderToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "HolderToken({})", self.token)
    }
}

/// A number that strictly increases with every grant of one lock name.
///
/// Pass it to the resource you protect and have the resource reject any write that
/// carries a token lower than one it has already accepted. That turns the lock from
/// "usually exclusive" into "a late holder cannot corrupt data": a holder that paused past
/// its lease (GC, swap, SIGSTOP) still holds an old token, and its late write is refused.
///
/// Tokens come from a counter key next to the lock key, and every new token is the
/// counter plus one **and at least the Redis server's clock in microseconds**. So tokens
/// keep increasing when the counter is lost (`FLUSHALL`, a restart without persistence)
/// or older than the last grants (a replica promoted after missing them, in a Sentinel
/// failover or a Cluster one), and tokens minted by different Redlock nodes stay
/// comparable, as long as the servers' clocks do not step backwards (and agree with each
/// other better than the time between two grants, across a failover or between Redlock
/// nodes) and the lock is not granted more than once per microsecond on average. Tokens
/// of different lock names are unrelated.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct FencingToken(u64);

impl FencingToken {
    /// Wraps a raw token, for tests and for resources that read tokens back.
    pub const fn new(value: u64) -> Self {
        Self(value)
    }

    /// The token as a number (also `u64::from(token)`, or `token.into()`), for a
    /// resource that stores it or an API that takes a `u64`; it compares with one as it
    /// is (`token > stored`).
    ///
    /// ```
    /// let token = fencelock::FencingToken::new(7);
    /// let stored: u64 = 6;
    /// assert!(token > stored);
    /// assert_eq!(token.get(), 7);
    /// assert_eq!(u64::from(token), 7);
    /// ```
    pub const fn get(self) -> u64 {
        self.0
    }
}

/// The token as a number, for a resource that stores or compares it.
impl From<FencingToken> for u64 {
    fn from(token: FencingToken) -> u64 {
        token.0
    }
}

/// Compares with a token the resource stored as a number: `token == 42`,
/// `stored == token`.
impl PartialEq<u64> for FencingToken {
    fn eq(&self, other: &u64) -> bool {
        self.0 == *other
    }
}

impl PartialEq<FencingToken> for u64 {
    fn eq(&self, other: &FencingToken) -> bool {
        *self == other.0
    }
}

/// Orders against a token the resource stored as a number: `token > stored`.
impl PartialOrd<u64> for FencingToken {
    fn partial_cmp(&self, other: &u64) -> Option<std::cmp::Ordering> {
        Some(self.0.cmp(other))
    }
}

impl PartialOrd<FencingToken> for u64 {
    fn partial_cmp(&self, other: &FencingToken) -> Option<std::cmp::Ordering> {
        Some(self.cmp(&other.0))
    }
}

impl fmt::Display for FencingToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// 128 random bits as 32 lowercase hex digits: a holder token, a delay queue's receipt.
pub(crate) fn random_hex32() -> String {
    hex32(rand::random())
}

/// `bits` as 32 lowercase hex digits. By hand: `format!("{bits:032x}")` costs several
/// times as much, and a token is drawn for every acquire.
fn hex32(bits: u128) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut digits = [0u8; 32];
    for (i, digit) in digits.iter_mut().rev().enumerate() {
        *digit = HEX[((bits >> (i * 4)) & 0xf) as usize];
    }
    // ASCII digits: always UTF-8.
    std::str::from_utf8(&digits).unwrap_or_default().to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owner_tokens_are_32_hex_digits_and_distinct() {
        let a = HolderToken::generate();
        let b = HolderToken::generate();
        assert_eq!(a.as_str().len(), 32);
        assert!(
            a.as_str()
                .bytes()
                .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase())
        );
        assert_ne!(a, b);
    }

    #[test]
    fn hex32_writes_what_format_writes() {
        for bits in [
            0,
            1,
            0xabc,
            u128::MAX,
            u128::MAX / 3,
            1 << 127,
            0x0123_4567_89ab_cdef,
        ] {
            assert_eq!(hex32(bits), format!("{bits:032x}"));
        }
    }
}
