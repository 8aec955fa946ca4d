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

/// CPU time another process (a redis-server) has used so far (user + system, all
/// threads), from `/proc/PID/stat`; `None` once it is gone.
#[allow(unsafe_code)]
pub fn process_cpu_time(pid: u32) -> Option<std::time::Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which may hold spaces): state is the first,
    // utime the 12th and stime the 13th, in clock ticks.
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    // SAFETY: sysconf only reads a configuration value.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    let hz = if hz > 0 { hz as u64 } else { 100 };
    Some(std::time::Duration::from_nanos(ticks * 1_000_000_000 / hz))
}
