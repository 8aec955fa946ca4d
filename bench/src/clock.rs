//! Clocks: one every process on the machine shares, and this process's CPU time.

/// `CLOCK_MONOTONIC` in nanoseconds, shared by every process on the machine (unlike
/// [`std::time::Instant`]): the test kit's clock, the one the safety lab's histories use.
pub use testkit::history::monotonic_ns as mono_ns;

/// CPU time this process has used so far (user + system, all threads), from
/// `getrusage(RUSAGE_SELF)`.
#[allow(unsafe_code)]
pub fn cpu_time() -> std::time::Duration {
    // SAFETY: an all-zero `rusage` is a valid value of this plain C struct.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `usage` is a valid, writable rusage; RUSAGE_SELF is always accepted.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) };
    assert_eq!(rc, 0, "getrusage(RUSAGE_SELF) failed");
    let tv = |t: libc::timeval| {
        std::time::Duration::from_secs(t.tv_sec as u64)
            + std::time::Duration::from_micros(t.tv_usec as u64)
    };
    tv(usage.ru_utime) + tv(usage.ru_stime)
}
