//! Paying the kernel's one-time cost of task-bound perf events before the target is
//! stopped, not while it is.
//!
//! A hardware breakpoint set through ptrace (a debug register poked with
//! `PTRACE_POKEUSER`) is a task-bound perf event in the kernel. When no task-bound
//! perf event exists anywhere on the machine, creating one first enables the
//! scheduler's perf hooks (a static key: kernel text is patched) and waits for an
//! RCU grace period: 10 to 20 ms measured on the 2-core machines weft is built on,
//! spent with the whole target stopped if it happens at the first step-out of an
//! attach. The kernel keeps the hooks enabled while any such event exists (and for
//! a moment after the last one goes), so holding a harmless one — a software
//! "dummy" event counting nothing, on weft itself, user space only — from before
//! the stop until the probes are live makes every breakpoint poke cheap.
//!
//! [`Warm::start`] opens that event on a thread of its own (the grace period is
//! waited out while weft does other work); [`Warm::ready`] waits for it. Failing to
//! open one (perf events not permitted here) costs nothing but the speed-up.

use std::os::fd::{FromRawFd, OwnedFd};
use std::thread::JoinHandle;

use perf_event_open_sys::bindings;

/// A dummy task-bound perf event held open (or being opened).
pub struct Warm {
    opening: Option<JoinHandle<Option<OwnedFd>>>,
    fd: Option<OwnedFd>,
}

impl Warm {
    /// Starts opening the event on a new thread.
    pub fn start() -> Warm {
        let opening = std::thread::Builder::new()
            .name("weft-warm".into())
            .spawn(open_dummy)
            .ok();
        Warm { opening, fd: None }
    }

    /// Waits until the event is open; true if it could be.
    pub fn ready(&mut self) -> bool {
        if let Some(t) = self.opening.take() {
            self.fd = t.join().ok().flatten();
        }
        self.fd.is_some()
    }
}

/// `perf_event_open` of a software dummy event on this thread, user space only.
fn open_dummy() -> Option<OwnedFd> {
    let mut attr = bindings::perf_event_attr {
        type_: bindings::PERF_TYPE_SOFTWARE,
        size: std::mem::size_of::<bindings::perf_event_attr>() as u32,
        config: bindings::PERF_COUNT_SW_DUMMY as u64,
        ..Default::default()
    };
    attr.set_disabled(1);
    attr.set_exclude_kernel(1);
    attr.set_exclude_hv(1);
    // SAFETY: `attr` is a fully initialised perf_event_attr of its own size; the
    // event (pid 0: this thread, any CPU, no group) measures nothing and is only
    // ever closed.
    let fd = unsafe {
        perf_event_open_sys::perf_event_open(
            &mut attr,
            0,
            -1,
            -1,
            bindings::PERF_FLAG_FD_CLOEXEC as libc::c_ulong,
        )
    };
    // SAFETY: a non-negative return is a new file descriptor this function owns.
    (fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd) })
}

#[cfg(test)]
mod tests {
    use super::Warm;

    #[test]
    fn a_dummy_event_opens_as_root() {
        // The suite runs as root (CI does): perf events are always permitted there.
        if nix::unistd::geteuid().is_root() {
            assert!(Warm::start().ready());
        }
    }
}
