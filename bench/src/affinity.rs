//! Pinning threads to CPUs for one measurement, and putting them back afterwards.
//!
//! On a small VM a loopback round trip costs very different amounts depending on whether
//! the scheduler put client and server on one CPU (a context switch) or on two (a
//! cross-CPU wake-up of an idle virtual CPU), and it may choose either from one run to
//! the next. Pinning fixes the placement for a measurement that compares round trips.

#![allow(unsafe_code)]

use std::io;
use std::mem;

/// Threads pinned by [`Pins::pin_thread`] / [`Pins::pin_process`]; dropping it gives each
/// its earlier CPU mask back.
#[derive(Default)]
pub struct Pins {
    restore: Vec<(libc::pid_t, libc::cpu_set_t)>,
}

/// The CPUs this thread may run on, in order.
pub fn allowed_cpus() -> Vec<usize> {
    match get(0) {
        Ok(set) => (0..libc::CPU_SETSIZE as usize)
            // SAFETY: `cpu` is below CPU_SETSIZE, within `set`.
            .filter(|&cpu| unsafe { libc::CPU_ISSET(cpu, &set) })
            .collect(),
        Err(_) => Vec::new(),
    }
}

impl Pins {
    /// Pins the calling thread to `cpu`.
    pub fn pin_thread(&mut self, cpu: usize) -> io::Result<()> {
        self.pin(0, cpu)
    }

    /// Pins every thread of process `pid` to `cpu`.
    pub fn pin_process(&mut self, pid: u32, cpu: usize) -> io::Result<()> {
        for entry in std::fs::read_dir(format!("/proc/{pid}/task"))? {
            let tid = entry?
                .file_name()
                .to_str()
                .and_then(|t| t.parse::<libc::pid_t>().ok());
            if let Some(tid) = tid {
                self.pin(tid, cpu)?;
            }
        }
        Ok(())
    }

    fn pin(&mut self, tid: libc::pid_t, cpu: usize) -> io::Result<()> {
        let old = get(tid)?;
        // SAFETY: an all-zero cpu_set_t is the empty set.
        let mut set: libc::cpu_set_t = unsafe { mem::zeroed() };
        if cpu >= libc::CPU_SETSIZE as usize {
            return Err(io::Error::other(format!("no CPU {cpu}")));
        }
        // SAFETY: `cpu` is below CPU_SETSIZE, within `set`.
        unsafe { libc::CPU_SET(cpu, &mut set) };
        set_mask(tid, &set)?;
        self.restore.push((tid, old));
        Ok(())
    }
}

impl Drop for Pins {
    fn drop(&mut self) {
        for (tid, set) in self.restore.drain(..).rev() {
            // A thread that exited meanwhile has nothing to restore.
            let _ = set_mask(tid, &set);
        }
    }
}

fn get(tid: libc::pid_t) -> io::Result<libc::cpu_set_t> {
    // SAFETY: an all-zero cpu_set_t is a valid value; the kernel fills it in.
    let mut set: libc::cpu_set_t = unsafe { mem::zeroed() };
    // SAFETY: `set` is a valid, writable cpu_set_t of the size passed.
    let rc = unsafe { libc::sched_getaffinity(tid, mem::size_of::<libc::cpu_set_t>(), &mut set) };
    if rc == 0 {
        Ok(set)
    } else {
        Err(io::Error::last_os_error())
    }
}

fn set_mask(tid: libc::pid_t, set: &libc::cpu_set_t) -> io::Result<()> {
    // SAFETY: `set` is a valid cpu_set_t of the size passed; the kernel only reads it.
    let rc = unsafe { libc::sched_setaffinity(tid, mem::size_of::<libc::cpu_set_t>(), set) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}
