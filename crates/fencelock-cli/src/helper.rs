//! What fencelock and its helper processes (the [watcher](crate::watcher), the
//! [keeper](crate::keeper)) share: the binary a helper starts from, the name it shows in
//! `ps`, the signals it ignores.

use std::path::{Path, PathBuf};

/// This process's own binary, as the kernel sees it.
const PROC_SELF_EXE: &str = "/proc/self/exe";

/// The binary to start fencelock's helpers (the watcher, the keeper) from: this very
/// binary through /proc/self/exe, even if its file has been replaced or removed since
/// fencelock started (a package upgrade), so a helper is never another version of
/// fencelock, and never missing; its path where there is no /proc.
pub(crate) fn own_binary() -> std::io::Result<PathBuf> {
    match Path::new(PROC_SELF_EXE) {
        own if own.exists() => Ok(own.to_path_buf()),
        _ => std::env::current_exe(),
    }
}

/// Sets this process's command name (`/proc/self/comm`, what `ps -C`, `pkill` and
/// `killall` match; at most 15 bytes are kept) to `name`.
#[allow(unsafe_code)]
pub(crate) fn name_self(name: &str) {
    let comm = std::ffi::CString::new(name).unwrap_or_default();
    // SAFETY: PR_SET_NAME copies at most 16 bytes from a NUL-terminated string that
    // outlives the call.
    unsafe {
        libc::prctl(libc::PR_SET_NAME, comm.as_ptr() as libc::c_ulong, 0, 0, 0);
    }
}

/// Ignores `signal` in this process (fencelock, the watcher or the keeper).
#[allow(unsafe_code)]
pub(crate) fn ignore(signal: libc::c_int) {
    // SAFETY: setting a disposition to SIG_IGN has no memory effects.
    unsafe {
        libc::signal(signal, libc::SIG_IGN);
    }
}
