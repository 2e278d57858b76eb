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
    let one_thread = tasks().is_some_and(|t| t.len() == 1);
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

/// The ids of the process's threads (`/proc/self/task`), `None` if it cannot be
/// read. Read with `getdents64` on a descriptor of the directory: `opendir` (behind
/// `std::fs::read_dir`) allocates its buffer with the target's `malloc`, whose first
/// use on the control thread would give it a malloc arena for good.
pub fn tasks() -> Option<Vec<i32>> {
    // SAFETY: opening a directory by a static path.
    let fd = unsafe {
        libc::open(
            c"/proc/self/task".as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return None;
    }
    // SAFETY: `fd` was just opened and is owned here.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let mut buf = vec![0u64; 1024];
    let mut out = Vec::new();
    loop {
        // SAFETY: getdents64 writes at most the buffer's length into it.
        let n = unsafe {
            libc::syscall(
                libc::SYS_getdents64,
                std::os::fd::AsRawFd::as_raw_fd(&fd),
                buf.as_mut_ptr(),
                buf.len() * 8,
            )
        };
        if n < 0 {
            return None;
        }
        if n == 0 {
            return Some(out);
        }
        // SAFETY: the kernel filled `n` bytes of the buffer.
        let bytes = unsafe { core::slice::from_raw_parts(buf.as_ptr() as *const u8, n as usize) };
        out.extend(
            dirents(bytes).filter_map(|name| std::str::from_utf8(name).ok()?.parse::<i32>().ok()),
        );
    }
}

/// The names in a `getdents64` buffer (`struct linux_dirent64`: inode 8 bytes,
/// offset 8, record length 2, type 1, then the NUL-terminated name).
fn dirents(mut bytes: &[u8]) -> impl Iterator<Item = &[u8]> {
    core::iter::from_fn(move || {
        if bytes.len() < 19 {
            return None;
        }
        let len = u16::from_ne_bytes([bytes[16], bytes[17]]) as usize;
        if len < 19 || len > bytes.len() {
            return None;
        }
        let name = &bytes[19..len];
        let name = &name[..name.iter().position(|&b| b == 0).unwrap_or(name.len())];
        bytes = &bytes[len..];
        Some(name)
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn tasks_lists_this_process_threads() {
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let h = std::thread::spawn(move || {
            // SAFETY: gettid has no preconditions.
            let tid = unsafe { libc::gettid() };
            let _ = rx.recv();
            tid
        });
        // SAFETY: gettid has no preconditions.
        let me = unsafe { libc::gettid() };
        // The test harness runs other tests on threads of this process, which come
        // and go meanwhile: the two threads known alive must be listed, each once,
        // and nothing that is not a thread of this process.
        let got = super::tasks().unwrap();
        let mut unique = got.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(unique.len(), got.len(), "{got:?}");
        assert!(got.contains(&me), "{got:?}");
        for t in &got {
            assert!(*t > 0, "{got:?}");
        }
        drop(tx);
        let other = h.join().unwrap();
        assert!(got.contains(&other), "{other} in {got:?}");
    }
}
