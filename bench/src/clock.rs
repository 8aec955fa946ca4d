//! A clock every process on the machine shares.

/// `CLOCK_MONOTONIC` in nanoseconds. Unlike [`std::time::Instant`], whose value cannot be
/// sent to another process, this number means the same in every process on the machine,
/// so a time stamp written by one worker can be subtracted from one read by another.
#[allow(unsafe_code)]
pub fn mono_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_MONOTONIC exists on Linux.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_MONOTONIC) failed");
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}
