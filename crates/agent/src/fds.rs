//! The descriptors the agent keeps open inside the target (its control socket and
//! `/proc/self/mem`) live at the top of the range programs use, never at the
//! lowest free numbers: a program expects its first `open` to return 3, and some
//! (shells, daemons that pass descriptors by number) depend on it. They are held
//! only while a session is served.

use std::os::fd::{FromRawFd, IntoRawFd, OwnedFd, RawFd};

/// How far below the lower of `RLIMIT_NOFILE`'s soft limit and 1024 (`select`'s
/// `FD_SETSIZE`) the agent's descriptors go.
const BELOW_TOP: u64 = 64;

/// The first number the agent's descriptors may take.
fn floor() -> RawFd {
    // SAFETY: getrlimit fills a plain struct.
    let soft = unsafe {
        let mut r: libc::rlimit = core::mem::zeroed();
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) != 0 {
            return 3;
        }
        r.rlim_cur
    };
    let top = soft.min(1024);
    if top < 2 * BELOW_TOP {
        // A tiny limit: take what there is.
        return 3;
    }
    (top - BELOW_TOP) as RawFd
}

/// Moves `fd` to the lowest free number at or above [`floor`] (close-on-exec), or
/// leaves it where it is if that fails (a limit too low: better a low number than
/// no session).
pub fn high_raw(fd: RawFd) -> RawFd {
    let floor = floor();
    if fd < 0 || fd >= floor {
        return fd;
    }
    // SAFETY: duplicating and closing a descriptor this agent owns.
    unsafe {
        let moved = libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, floor);
        if moved < 0 {
            return fd;
        }
        libc::close(fd);
        moved
    }
}

/// [`high_raw`] for an owned descriptor.
pub fn high(fd: OwnedFd) -> OwnedFd {
    let raw = high_raw(fd.into_raw_fd());
    // SAFETY: `raw` is the descriptor just moved (or the original), owned here.
    unsafe { OwnedFd::from_raw_fd(raw) }
}

/// Grows the process's descriptor table past [`floor`] now, in the agent's
/// constructor, if the process has one thread (a launched command, a process caught
/// as it starts): growing it then costs nothing, while growing it from the control
/// thread later makes the kernel wait for an RCU grace period (`expand_fdtable`, for a
/// table several threads share), ~10 ms of that process's first session. A process
/// with several threads is left alone here: its constructor runs while weft holds
/// every thread stopped, and the wait would lengthen that pause; the control thread
/// pays it later, with the process running. The table never shrinks; no descriptor
/// is left open.
pub fn grow_table() {
    let floor = floor();
    if floor <= 3 {
        return;
    }
    let one_thread = std::fs::read_dir("/proc/self/task").is_ok_and(|d| d.count() == 1);
    if !one_thread {
        return;
    }
    // SAFETY: opening, duplicating and closing descriptors of our own.
    unsafe {
        let fd = libc::open(c"/".as_ptr(), libc::O_PATH | libc::O_CLOEXEC);
        if fd < 0 {
            return;
        }
        let high = libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, floor + 1);
        if high >= 0 {
            libc::close(high);
        }
        libc::close(fd);
    }
}
