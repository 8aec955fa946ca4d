//! How long a waiting acquire sleeps between attempts.

use std::time::Duration;

use rand::Rng;

use crate::error::Error;
use crate::limits::{DEFAULT_RETRY_MAX, DEFAULT_RETRY_MIN, MAX_RETRY_DELAY};

/// The pause between attempts of a waiting acquire: exponential backoff with full
/// jitter, so waiters that collided once spread out instead of colliding again.
///
/// The n-th pause is drawn uniformly from `[min, min(max, min * 2^n)]`, and never runs
/// past the holder's remaining lease (as Redis reported it) or the caller's deadline.
/// The default is 5 ms to 100 ms.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Retry {
    min: Duration,
    max: Duration,
}

impl Retry {
    /// A backoff between `min` and `max`. Checked when the lock is acquired: `min` must
    /// be at least 1 ms and at most `max`, and `max` at most [`MAX_RETRY_DELAY`].
    pub const fn backoff(min: Duration, max: Duration) -> Self {
        Self { min, max }
    }

    pub(crate) fn validate(&self) -> Result<(), Error> {
        if self.min < Duration::from_millis(1) || self.min > self.max || self.max > MAX_RETRY_DELAY
        {
            return Err(Error::invalid(
                "retry backoff",
                format!(
                    "min {:?} and max {:?} must satisfy 1ms <= min <= max <= {:?}",
                    self.min, self.max, MAX_RETRY_DELAY
                ),
            ));
        }
        Ok(())
    }

    /// The pause before attempt `n + 1` (n counts from 0), its jitter drawn from `rng`.
    pub(crate) fn delay(&self, n: u32, rng: &mut impl Rng) -> Duration {
        let cap = self
            .min
            .saturating_mul(1u32.checked_shl(n.min(20)).unwrap_or(u32::MAX))
            .min(self.max);
        rng.random_range(self.min..=cap)
    }
}

impl Default for Retry {
    fn default() -> Self {
        Self::backoff(DEFAULT_RETRY_MIN, DEFAULT_RETRY_MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_stay_within_bounds_and_grow() {
        let r = Retry::backoff(Duration::from_millis(2), Duration::from_millis(50));
        let rng = &mut rand::rng();
        for n in 0..40 {
            let d = r.delay(n, rng);
            assert!(
                d >= Duration::from_millis(2) && d <= Duration::from_millis(50),
                "{d:?}"
            );
        }
        assert_eq!(r.delay(0, rng), Duration::from_millis(2));
        assert!(
            Retry::backoff(Duration::ZERO, Duration::from_millis(1))
                .validate()
                .is_err()
        );
        assert!(
            Retry::backoff(Duration::from_millis(9), Duration::from_millis(1))
                .validate()
                .is_err()
        );
        assert!(Retry::default().validate().is_ok());
    }
}
