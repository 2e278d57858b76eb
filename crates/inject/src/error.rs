//! Every way touching another process can fail. Each message is one line: the CLI
//! prints it verbatim.

use std::fmt;
use std::io;
use std::path::PathBuf;
use std::time::Duration;

use nix::errno::Errno;

pub type Result<T, E = InjectError> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum InjectError {
    #[error("no such process: {pid}")]
    NoSuchProcess { pid: i32 },

    #[error("{pid} is a thread of process {tgid}, not a process")]
    NotAProcess { pid: i32, tgid: i32 },

    /// `reason` says why the kernel refused, as far as /proc lets us tell.
    #[error("cannot attach to process {pid}: permission denied: {reason}")]
    PermissionDenied { pid: i32, reason: String },

    #[error("process {pid} is a zombie: it has exited and its parent has not reaped it")]
    Zombie { pid: i32 },

    #[error("process {pid} exited during the operation")]
    TargetExited { pid: i32 },

    #[error("thread {tid} of process {pid} exited during the operation")]
    ThreadExited { pid: i32, tid: i32 },

    #[error("timed out after {} ms {what} (process {pid})", .after.as_millis())]
    Timeout {
        pid: i32,
        what: &'static str,
        after: Duration,
    },

    #[error("thread {tid} is not a stopped thread of process {pid}")]
    UnknownThread { pid: i32, tid: i32 },

    #[error("ptrace({request}) on thread {tid} failed: {errno}")]
    Ptrace {
        request: &'static str,
        tid: i32,
        errno: Errno,
    },

    #[error("cannot {op} {len} bytes at {addr:#x} in process {pid}: {source}")]
    Memory {
        pid: i32,
        op: MemOp,
        addr: u64,
        len: usize,
        source: io::Error,
    },

    #[error("cannot read {}: {source}", .path.display())]
    Proc { path: PathBuf, source: io::Error },

    /// No library of the target has room after its code for a remote call's
    /// landing pad.
    #[error("process {pid} has no padding after its code to return remote calls to")]
    NoLandingPad { pid: i32 },

    #[error("a remote call takes at most 6 arguments, got {count}")]
    TooManyArguments { count: usize },

    #[error(
        "remote call data is {len} bytes, more than the {max} bytes weft puts on a target stack"
    )]
    StackDataTooLarge { len: usize, max: usize },

    /// The called function crashed; the fault was swallowed and the thread's registers
    /// restored, so the target does not see it.
    #[error("remote call of {func:#x} in thread {tid} faulted: {} at pc {pc:#x} (fault address {addr:#x}); the thread's registers were restored", signal_name(*.signal))]
    CallFaulted {
        tid: i32,
        func: u64,
        signal: i32,
        pc: u64,
        addr: u64,
    },

    #[error("remote call of {func:#x} in thread {tid} did not return within {} ms: {outcome}", .after.as_millis())]
    CallTimedOut {
        tid: i32,
        func: u64,
        after: Duration,
        outcome: AbandonedCall,
    },

    #[error("thread {tid} is still in the given ranges after {steps} single steps (pc {pc:#x})")]
    StepOutLimit { tid: i32, steps: usize, pc: u64 },

    #[error("thread {tid} is in a system call whose restart would re-execute the instruction at {pc:#x}, inside the given ranges")]
    StepOutInSyscall { tid: i32, pc: u64 },

    #[error("thread {tid} is about to make a system call at {pc:#x}, inside the given ranges; it is not stepped into it")]
    StepOutAtSyscall { tid: i32, pc: u64 },

    #[error("thread {tid} raised {} at pc {pc:#x} while being stepped out of the given ranges; it is delivered on resume", signal_name(*.signal))]
    StepOutFault { tid: i32, signal: i32, pc: u64 },

    #[error("dlopen(\"{path}\") failed in the target: {message}")]
    DlopenFailed { path: String, message: String },

    #[error("library path contains a NUL byte: {path:?}")]
    InvalidPath { path: String },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemOp {
    Read,
    Write,
}

impl fmt::Display for MemOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            MemOp::Read => "read",
            MemOp::Write => "write",
        })
    }
}

/// What became of a remote call that did not return in time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AbandonedCall {
    /// The thread was interrupted at `pc` (inside the function, or wherever it had
    /// got to) and its original registers were put back. Whatever the function had
    /// already done stays done: memory it wrote, locks it holds.
    Restored { pc: u64 },
    /// The thread could not be interrupted (e.g. uninterruptible sleep). weft tries
    /// again to stop it and restore its registers when the process is resumed; if
    /// that fails too, the thread stays traced by weft and would fault at address 0
    /// when the function returns.
    StillRunning,
}

impl fmt::Display for AbandonedCall {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AbandonedCall::Restored { pc } => write!(
                f,
                "abandoned at pc {pc:#x} and the thread's registers restored (effects the function already had, such as locks it took, remain)"
            ),
            AbandonedCall::StillRunning => {
                f.write_str("the thread could not be interrupted and still runs the function")
            }
        }
    }
}

/// `SIGSEGV`, `SIGRTMIN+3`, or `signal 99`.
pub fn signal_name(signal: i32) -> String {
    const NAMES: [&str; 32] = [
        "",
        "SIGHUP",
        "SIGINT",
        "SIGQUIT",
        "SIGILL",
        "SIGTRAP",
        "SIGABRT",
        "SIGBUS",
        "SIGFPE",
        "SIGKILL",
        "SIGUSR1",
        "SIGSEGV",
        "SIGUSR2",
        "SIGPIPE",
        "SIGALRM",
        "SIGTERM",
        "SIGSTKFLT",
        "SIGCHLD",
        "SIGCONT",
        "SIGSTOP",
        "SIGTSTP",
        "SIGTTIN",
        "SIGTTOU",
        "SIGURG",
        "SIGXCPU",
        "SIGXFSZ",
        "SIGVTALRM",
        "SIGPROF",
        "SIGWINCH",
        "SIGIO",
        "SIGPWR",
        "SIGSYS",
    ];
    match signal {
        1..=31 => NAMES[signal as usize].to_string(),
        // The kernel's SIGRTMIN is 32; glibc reserves two for itself and reports 34.
        32..=64 => format!("SIGRTMIN+{}", signal - 32),
        _ => format!("signal {signal}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signal_names() {
        assert_eq!(signal_name(libc::SIGSEGV), "SIGSEGV");
        assert_eq!(signal_name(libc::SIGSYS), "SIGSYS");
        assert_eq!(signal_name(34), "SIGRTMIN+2");
        assert_eq!(signal_name(0), "signal 0");
    }

    #[test]
    fn messages_are_one_line() {
        let e = InjectError::CallTimedOut {
            tid: 7,
            func: 0x1000,
            after: Duration::from_millis(250),
            outcome: AbandonedCall::Restored { pc: 0x1004 },
        };
        assert_eq!(
            e.to_string(),
            "remote call of 0x1000 in thread 7 did not return within 250 ms: abandoned at pc 0x1004 and the thread's registers restored (effects the function already had, such as locks it took, remain)"
        );
        let e = InjectError::Ptrace {
            request: "PTRACE_SEIZE",
            tid: 3,
            errno: Errno::EPERM,
        };
        assert_eq!(
            e.to_string(),
            "ptrace(PTRACE_SEIZE) on thread 3 failed: EPERM: Operation not permitted"
        );
    }
}
