//! The only code in weft that touches another process from outside: ptrace and
//! `/proc`.
//!
//! * [`StoppedProcess`]: stop every thread of a process, and of every other process
//!   sharing its memory (`clone(CLONE_VM)` children, [`StoppedProcess::sharers`])
//!   ([`StoppedProcess::stop`]),
//!   read and write its memory through `/proc/PID/mem`, check where its threads are
//!   ([`StoppedProcess::threads_in`]), single-step a thread out of bytes about to be
//!   replaced ([`StoppedProcess::step_out`]), call a function in it
//!   ([`StoppedProcess::call`]), and let it go ([`StoppedProcess::resume`]) with every
//!   signal it was kept from receiving delivered again.
//! * [`inject_library`]: a remote `dlopen`.
//! * [`process`]: what `/proc` says about a process, without stopping it.
//! * [`die`]: named points at which a test makes weft SIGKILL itself.
//! * [`warm`]: the kernel's one-time cost of hardware breakpoints, paid before a stop.
//!
//! This crate knows nothing of probes: addresses come in, bytes and registers go out.
//! Errors are [`InjectError`]s whose messages are one line, for the CLI to print.
//!
//! All calls on a [`StoppedProcess`] must come from the thread that stopped it (ptrace
//! ties a tracee to a tracer *thread*); the type is neither `Send` nor `Sync`.
//!
//! # Limits
//!
//! * A remote call runs target code on a borrowed thread. If that thread holds a lock
//!   the function needs (malloc's arena lock, the loader lock, a stdio lock), the call
//!   deadlocks until its timeout, and abandoning it leaves the lock held.
//!   [`StoppedProcess::pick_call_thread`] lowers the odds (a thread blocked in `read`
//!   or `poll` normally holds none) but cannot rule it out; nor can it see a thread
//!   in the middle of a lock-free (single-threaded) `malloc`, where a nested call
//!   corrupts the heap. Choosing the moment is the caller's business (weft's CLI:
//!   `safepoint`, which steps threads back out of the C library first).
//! * Threads a called function creates stay stopped until resume: a function that
//!   waits for its own new thread deadlocks until the timeout.
//! * Stopping interrupts blocking system calls. Most are restarted on resume; a few
//!   (`epoll_wait`, `inotify` reads) return EINTR to the target, as with any ptrace
//!   attach.
//! * A thread that does not stop in time (uninterruptible sleep, a `vfork` parent)
//!   fails the stop and stays attached to the calling thread: it stops when it next
//!   returns to user space and stays stopped until a later stop of the same process
//!   from the same thread adopts it, or the calling thread exits.
//! * A main thread that exits *while being stopped*, other threads living on, stays
//!   traced by the calling thread: the process's exit status reaches its parent only
//!   once that thread exits. `execve` during a stop is not handled.
//! * The remote call ends by faulting at address 0. A target that *ignores* SIGSEGV
//!   (SIG_IGN) gets it reset to SIG_DFL by the kernel; a thread running with a CET
//!   shadow stack faults at the final `ret` instead (reported as
//!   [`InjectError::CallFaulted`]).
//! * Per thread, the first held signal is re-delivered with its original siginfo;
//!   further ones are re-sent with `tgkill` and carry weft as their sender.
//! * If the calling process dies while it holds a stop, the kernel lets a thread
//!   caught in a signal-delivery-stop go *without* that signal. A fault is raised
//!   again (the thread is still on the faulting instruction); an `int3`'s SIGTRAP is
//!   too, as a stop puts such a thread back on the `int3`; any other signal caught
//!   so is lost.

mod call;
pub mod die;
mod error;
mod library;
pub mod process;
mod stop;
mod sys;
pub mod warm;

pub use call::{CallArg, RemoteCallResult, DEFAULT_CALL_TIMEOUT, MAX_STACK_DATA};
pub use error::{signal_name, AbandonedCall, InjectError, MemOp, Result};
pub use library::inject_library;
pub use stop::{
    StopKind, StopStats, StoppedProcess, StoppedThread, DEFAULT_STOP_TIMEOUT, STEP_OUT_TIMEOUT,
};

/// The registers of a stopped thread, as ptrace sees them.
pub use libc::user_regs_struct as Registers;
