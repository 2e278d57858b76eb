//! The system calls that act on another task: ptrace(2), waitpid(2), tgkill(2). This
//! is the only module that issues them.
//!
//! Signals are raw numbers: nix's `Signal` cannot hold real-time signals, which a
//! target may receive while we hold it. Waits are per thread id and never
//! `waitpid(-1)`: the tracer is a *thread*, and a wildcard wait could take events (or
//! exit statuses) that belong to another tracer thread or to the caller's children.

use std::mem::MaybeUninit;
use std::time::{Duration, Instant};

use libc::{c_void, pid_t, siginfo_t, user_regs_struct};
use nix::errno::Errno;

use crate::error::InjectError;

/// A raw ptrace(2) request.
///
/// # Safety
/// `addr` and `data` must be what `request` expects: for requests that read or write
/// through `data`, a pointer to a live buffer of the right type.
unsafe fn ptrace(request: libc::c_uint, tid: pid_t, addr: usize, data: usize) -> Result<(), Errno> {
    // SAFETY: forwarded from this function's contract.
    let ret = unsafe { libc::ptrace(request, tid, addr as *mut c_void, data as *mut c_void) };
    if ret == -1 {
        Err(Errno::last())
    } else {
        Ok(())
    }
}

pub(crate) fn ptrace_error(request: &'static str, tid: pid_t, errno: Errno) -> InjectError {
    InjectError::Ptrace {
        request,
        tid,
        errno,
    }
}

pub(crate) fn seize(tid: pid_t, options: libc::c_int) -> Result<(), Errno> {
    // SAFETY: PTRACE_SEIZE takes the options as a value in `data`.
    unsafe { ptrace(libc::PTRACE_SEIZE, tid, 0, options as usize) }
}

pub(crate) fn interrupt(tid: pid_t) -> Result<(), Errno> {
    // SAFETY: PTRACE_INTERRUPT takes no pointers.
    unsafe { ptrace(libc::PTRACE_INTERRUPT, tid, 0, 0) }
}

/// Detach, delivering `signal` (0 for none) if the thread is in a signal-delivery-stop.
pub(crate) fn detach(tid: pid_t, signal: i32) -> Result<(), Errno> {
    // SAFETY: PTRACE_DETACH takes the signal as a value in `data`.
    unsafe { ptrace(libc::PTRACE_DETACH, tid, 0, signal as usize) }
}

pub(crate) fn cont(tid: pid_t, signal: i32) -> Result<(), Errno> {
    // SAFETY: PTRACE_CONT takes the signal as a value in `data`.
    unsafe { ptrace(libc::PTRACE_CONT, tid, 0, signal as usize) }
}

/// Offset of `u_debugreg` in `struct user` (x86-64), for PTRACE_POKEUSER.
const DEBUGREG_OFFSET: usize = 848;

/// Writes debug register `n` (0-3: addresses, 7: control) of a stopped thread.
pub(crate) fn set_debugreg(tid: pid_t, n: usize, value: u64) -> Result<(), Errno> {
    // SAFETY: PTRACE_POKEUSER takes an offset into `struct user` and the value.
    unsafe {
        ptrace(
            libc::PTRACE_POKEUSER,
            tid,
            DEBUGREG_OFFSET + 8 * n,
            value as usize,
        )
    }
}

/// Resume, stopping at the next system call's entry or exit (a `Syscall` event).
pub(crate) fn syscall_cont(tid: pid_t, signal: i32) -> Result<(), Errno> {
    // SAFETY: PTRACE_SYSCALL takes the signal as a value in `data`.
    unsafe { ptrace(libc::PTRACE_SYSCALL, tid, 0, signal as usize) }
}

pub(crate) fn singlestep(tid: pid_t, signal: i32) -> Result<(), Errno> {
    // SAFETY: PTRACE_SINGLESTEP takes the signal as a value in `data`.
    unsafe { ptrace(libc::PTRACE_SINGLESTEP, tid, 0, signal as usize) }
}

pub(crate) fn getregs(tid: pid_t) -> Result<user_regs_struct, Errno> {
    let mut regs = MaybeUninit::<user_regs_struct>::uninit();
    // SAFETY: PTRACE_GETREGS writes one user_regs_struct through `data`.
    unsafe { ptrace(libc::PTRACE_GETREGS, tid, 0, regs.as_mut_ptr() as usize)? };
    // SAFETY: the kernel filled the whole struct (the call succeeded).
    Ok(unsafe { regs.assume_init() })
}

pub(crate) fn setregs(tid: pid_t, regs: &user_regs_struct) -> Result<(), Errno> {
    // SAFETY: PTRACE_SETREGS reads one user_regs_struct through `data`.
    unsafe { ptrace(libc::PTRACE_SETREGS, tid, 0, regs as *const _ as usize) }
}

/// `NT_PRFPREG`: the x87/SSE state in `fxsave` layout (512 bytes).
pub(crate) const NT_PRFPREG: usize = 2;
/// `NT_X86_XSTATE`: the whole user state in standard `xsave` layout (AVX, AVX-512,
/// PKRU, ...), as large as the CPU needs.
pub(crate) const NT_X86_XSTATE: usize = 0x202;

/// Reads register set `note` into `buf`; returns how many bytes the kernel wrote.
pub(crate) fn getregset(tid: pid_t, note: usize, buf: &mut [u8]) -> Result<usize, Errno> {
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr() as *mut c_void,
        iov_len: buf.len(),
    };
    // SAFETY: PTRACE_GETREGSET writes at most iov_len bytes to iov_base and updates
    // iov_len; both outlive the call.
    unsafe {
        ptrace(
            libc::PTRACE_GETREGSET,
            tid,
            note,
            &mut iov as *mut libc::iovec as usize,
        )?
    };
    Ok(iov.iov_len)
}

/// Writes register set `note` from `buf`.
pub(crate) fn setregset(tid: pid_t, note: usize, buf: &[u8]) -> Result<(), Errno> {
    let mut iov = libc::iovec {
        iov_base: buf.as_ptr() as *mut c_void,
        iov_len: buf.len(),
    };
    // SAFETY: PTRACE_SETREGSET reads iov_len bytes from iov_base (not written).
    unsafe {
        ptrace(
            libc::PTRACE_SETREGSET,
            tid,
            note,
            &mut iov as *mut libc::iovec as usize,
        )
    }
}

pub(crate) fn getsiginfo(tid: pid_t) -> Result<siginfo_t, Errno> {
    let mut info = MaybeUninit::<siginfo_t>::zeroed();
    // SAFETY: PTRACE_GETSIGINFO writes one siginfo_t through `data`.
    unsafe { ptrace(libc::PTRACE_GETSIGINFO, tid, 0, info.as_mut_ptr() as usize)? };
    // SAFETY: zero-initialised, then filled by the kernel; all bit patterns are valid.
    Ok(unsafe { info.assume_init() })
}

pub(crate) fn setsiginfo(tid: pid_t, info: &siginfo_t) -> Result<(), Errno> {
    // SAFETY: PTRACE_SETSIGINFO reads one siginfo_t through `data`.
    unsafe { ptrace(libc::PTRACE_SETSIGINFO, tid, 0, info as *const _ as usize) }
}

pub(crate) fn geteventmsg(tid: pid_t) -> Result<u64, Errno> {
    let mut msg: libc::c_ulong = 0;
    // SAFETY: PTRACE_GETEVENTMSG writes one unsigned long through `data`.
    unsafe {
        ptrace(
            libc::PTRACE_GETEVENTMSG,
            tid,
            0,
            &mut msg as *mut _ as usize,
        )?
    };
    Ok(msg)
}

/// The thread's blocked-signal mask, bit `n - 1` for signal `n`.
pub(crate) fn getsigmask(tid: pid_t) -> Result<u64, Errno> {
    let mut mask: u64 = 0;
    // SAFETY: PTRACE_GETSIGMASK writes `addr` (8, the kernel's sigset size) bytes
    // through `data`.
    unsafe {
        ptrace(
            libc::PTRACE_GETSIGMASK,
            tid,
            8,
            &mut mask as *mut u64 as usize,
        )?
    };
    Ok(mask)
}

pub(crate) fn setsigmask(tid: pid_t, mask: u64) -> Result<(), Errno> {
    // SAFETY: PTRACE_SETSIGMASK reads `addr` (8) bytes through `data`.
    unsafe {
        ptrace(
            libc::PTRACE_SETSIGMASK,
            tid,
            8,
            &mask as *const u64 as usize,
        )
    }
}

pub(crate) fn tgkill(pid: pid_t, tid: pid_t, signal: i32) -> Result<(), Errno> {
    // SAFETY: tgkill takes three integers.
    let ret = unsafe { libc::syscall(libc::SYS_tgkill, pid, tid, signal) };
    Errno::result(ret).map(drop)
}

pub(crate) fn gettid() -> pid_t {
    // SAFETY: gettid takes no arguments and cannot fail.
    unsafe { libc::syscall(libc::SYS_gettid) as pid_t }
}

/// What `waitpid` reported for one traced thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WaitEvent {
    Exited,
    Killed,
    /// Signal-delivery-stop: `signal` is about to be delivered.
    SignalStop {
        signal: i32,
    },
    /// PTRACE_EVENT_STOP: an interrupt (SIGTRAP), a group-stop (the stop signal), or
    /// the first stop of an auto-attached thread.
    EventStop {
        signal: i32,
    },
    /// PTRACE_EVENT_CLONE: the thread created another; PTRACE_GETEVENTMSG has its tid.
    Clone,
    /// A syscall-entry or -exit stop (only after `PTRACE_SYSCALL`; told from a
    /// SIGTRAP by `PTRACE_O_TRACESYSGOOD`).
    Syscall,
    /// Any other PTRACE_EVENT_* (none is enabled, so this should not happen).
    OtherEvent,
}

fn decode(status: i32) -> WaitEvent {
    if libc::WIFEXITED(status) {
        return WaitEvent::Exited;
    }
    if libc::WIFSIGNALED(status) {
        return WaitEvent::Killed;
    }
    let signal = libc::WSTOPSIG(status);
    match (status >> 16) & 0xff {
        0 if signal == libc::SIGTRAP | 0x80 => WaitEvent::Syscall,
        0 => WaitEvent::SignalStop { signal },
        libc::PTRACE_EVENT_STOP => WaitEvent::EventStop { signal },
        libc::PTRACE_EVENT_CLONE => WaitEvent::Clone,
        _ => WaitEvent::OtherEvent,
    }
}

/// One non-blocking wait for `tid`.
pub(crate) fn try_wait(tid: pid_t) -> Result<Option<WaitEvent>, Errno> {
    loop {
        let mut status = 0;
        // SAFETY: `status` is a valid out pointer for the duration of the call.
        let ret = unsafe { libc::waitpid(tid, &mut status, libc::__WALL | libc::WNOHANG) };
        match ret {
            -1 if Errno::last() == Errno::EINTR => continue,
            -1 => return Err(Errno::last()),
            0 => return Ok(None),
            _ => return Ok(Some(decode(status))),
        }
    }
}

/// Sleeps between polls: first yield, then back off to 1 ms, so a thread that stops
/// within microseconds is seen within microseconds.
pub(crate) struct Backoff(u32);

impl Backoff {
    pub(crate) fn new() -> Self {
        Backoff(0)
    }

    pub(crate) fn snooze(&mut self) {
        if self.0 < 16 {
            std::thread::yield_now();
        } else {
            let micros = 20u64 << (self.0 - 16).min(6);
            std::thread::sleep(Duration::from_micros(micros.min(1000)));
        }
        self.0 = self.0.saturating_add(1);
    }
}

/// Waits for an event of `tid` until `deadline`; `Ok(None)` when time ran out.
pub(crate) fn wait_until(tid: pid_t, deadline: Instant) -> Result<Option<WaitEvent>, Errno> {
    let mut backoff = Backoff::new();
    loop {
        if let Some(event) = try_wait(tid)? {
            return Ok(Some(event));
        }
        if Instant::now() >= deadline {
            return Ok(None);
        }
        backoff.snooze();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_wait_statuses() {
        // Layouts from <bits/waitstatus.h>: exit code << 8; term signal; stop: 0x7f,
        // signal << 8, event << 16.
        assert_eq!(decode(3 << 8), WaitEvent::Exited);
        assert_eq!(decode(libc::SIGKILL), WaitEvent::Killed);
        assert_eq!(
            decode(0x7f | (libc::SIGUSR1 << 8)),
            WaitEvent::SignalStop {
                signal: libc::SIGUSR1
            }
        );
        assert_eq!(
            decode(0x7f | (libc::SIGTRAP << 8) | (libc::PTRACE_EVENT_STOP << 16)),
            WaitEvent::EventStop {
                signal: libc::SIGTRAP
            }
        );
        assert_eq!(
            decode(0x7f | (libc::SIGTRAP << 8) | (libc::PTRACE_EVENT_CLONE << 16)),
            WaitEvent::Clone
        );
        assert_eq!(
            decode(0x7f | (libc::SIGTRAP << 8) | (libc::PTRACE_EVENT_EXEC << 16)),
            WaitEvent::OtherEvent
        );
        assert_eq!(
            decode(0x7f | ((libc::SIGTRAP | 0x80) << 8)),
            WaitEvent::Syscall
        );
    }
}
