//! Calling a function inside the target, on one of its stopped threads.
//!
//! The thread's registers are saved, then set up as if it had executed
//! `call func` with a return address of 0:
//!
//! ```text
//!   original rsp ──▶ ┌──────────────────────┐
//!                    │ red zone (128 bytes) │  untouched: the interrupted code may use it
//!                    ├──────────────────────┤
//!                    │ stack_data           │  ◀── CallArg::StackData (16-aligned)
//!                    ├──────────────────────┤  ◀── 16-aligned (rsp at the call)
//!   rsp at entry ──▶ │ 0 (return address)   │
//!                    └──────────────────────┘
//! ```
//!
//! The function's `ret` jumps to 0 and faults: the thread stops with SIGSEGV at rip 0
//! and rsp just above the slot, which is how the call's end is recognised. `rax`
//! holds the result. The original registers are then put back, `orig_rax` and `rax`
//! included, so a system call the stop interrupted is restarted on resume; during the
//! call `orig_rax` is -1 so the kernel does not "restart" a system call into it.
//!
//! If the thread blocks SIGSEGV, SIGSEGV is unblocked for the call (and the mask put
//! back after): the kernel resets the handler of a fault signal that is blocked when
//! it is raised, which would silently remove the target's own SIGSEGV handler.

use std::time::{Duration, Instant};

use libc::user_regs_struct;

use crate::error::{AbandonedCall, InjectError, Result};
use crate::process;
use crate::stop::{is_fault, Deadline, PendingSignal, StopKind, StoppedProcess};
use crate::sys::{self, Backoff, WaitEvent};

/// How long [`StoppedProcess::call`] lets a function run.
pub const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_secs(5);
/// The most [`StoppedProcess::call`] puts on a target thread's stack.
pub const MAX_STACK_DATA: usize = 64 * 1024;
/// Below rsp, the System V ABI lets leaf code use 128 bytes without moving rsp.
const RED_ZONE: u64 = 128;
/// EFLAGS: the direction flag must be clear at a call; the trap flag must not leak in.
const EFLAGS_DF: u64 = 1 << 10;
const EFLAGS_TF: u64 = 1 << 8;

/// One argument of a remote call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallArg {
    Value(u64),
    /// The address where the call's `stack_data` was copied.
    StackData,
}

impl From<u64> for CallArg {
    fn from(value: u64) -> Self {
        CallArg::Value(value)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RemoteCallResult {
    /// `rax` when the function returned.
    pub ret: u64,
    /// Where `stack_data` was copied (below the thread's red zone).
    pub stack_data_addr: u64,
    /// From resuming the thread into the function to its return.
    pub duration: Duration,
}

/// How a remote call ended.
enum CallEnd {
    Returned(u64),
    Faulted { signal: i32, pc: u64, addr: u64 },
    TimedOut,
}

impl StoppedProcess {
    /// Calls `func(args...)` on stopped thread `tid`, giving up after
    /// [`DEFAULT_CALL_TIMEOUT`]. See [`call_with_timeout`](Self::call_with_timeout).
    pub fn call(
        &mut self,
        tid: i32,
        func: u64,
        args: &[CallArg],
        stack_data: &[u8],
    ) -> Result<RemoteCallResult> {
        self.call_with_timeout(tid, func, args, stack_data, DEFAULT_CALL_TIMEOUT)
    }

    /// Calls `func(args...)` (at most 6 integer arguments) on stopped thread `tid`,
    /// with `stack_data` copied below the thread's red zone
    /// ([`CallArg::StackData`] is its address). Only `tid` runs; the other threads
    /// stay stopped, and threads the function creates are held too.
    ///
    /// Afterwards the thread has exactly its original registers. Signals that arrive
    /// during the call are held and delivered on resume. If the function faults, the
    /// fault is swallowed and [`InjectError::CallFaulted`] returned.
    ///
    /// If it does not return within `timeout`, the thread is interrupted wherever it
    /// is and its original registers are put back: [`InjectError::CallTimedOut`] with
    /// [`AbandonedCall::Restored`]. That abandons the function half-way: memory it
    /// wrote stays written and locks it took stay taken (after a stuck `dlopen`, the
    /// loader lock may be held for good). If the thread cannot even be interrupted,
    /// it keeps running the function ([`AbandonedCall::StillRunning`]); resume tries
    /// once more to stop it and restore its registers.
    pub fn call_with_timeout(
        &mut self,
        tid: i32,
        func: u64,
        args: &[CallArg],
        stack_data: &[u8],
        timeout: Duration,
    ) -> Result<RemoteCallResult> {
        if args.len() > 6 {
            return Err(InjectError::TooManyArguments { count: args.len() });
        }
        if stack_data.len() > MAX_STACK_DATA {
            return Err(InjectError::StackDataTooLarge {
                len: stack_data.len(),
                max: MAX_STACK_DATA,
            });
        }
        let original = *self.thread(tid)?.regs();

        let mut sp = original.rsp.wrapping_sub(RED_ZONE);
        if !stack_data.is_empty() {
            sp = sp.wrapping_sub(stack_data.len() as u64) & !15;
            self.write_mem(sp, stack_data)?;
        }
        let stack_data_addr = sp;
        sp = (sp & !15) - 8;
        self.write_mem(sp, &0u64.to_le_bytes())?;

        let mut regs = original;
        regs.rip = func;
        regs.rsp = sp;
        regs.rax = 0; // no vector registers used, should the function be variadic
        regs.orig_rax = u64::MAX; // -1: not in a system call
        regs.eflags &= !(EFLAGS_DF | EFLAGS_TF);
        for (i, arg) in args.iter().enumerate() {
            let value = match *arg {
                CallArg::Value(v) => v,
                CallArg::StackData => stack_data_addr,
            };
            *arg_register(&mut regs, i) = value;
        }
        let mask =
            sys::getsigmask(tid).map_err(|e| self.ptrace_failed("PTRACE_GETSIGMASK", tid, e))?;
        let segv = 1u64 << (libc::SIGSEGV - 1);
        if mask & segv != 0 {
            sys::setsigmask(tid, mask & !segv)
                .map_err(|e| self.ptrace_failed("PTRACE_SETSIGMASK", tid, e))?;
        }
        let result = self.run_call(tid, func, &regs, &original, timeout);
        if mask & segv != 0 {
            // The thread may be gone (then so is its mask).
            let _ = sys::setsigmask(tid, mask);
        }
        let (ret, duration) = result?;
        Ok(RemoteCallResult {
            ret,
            stack_data_addr,
            duration,
        })
    }

    /// Runs one prepared call: set `regs`, resume, wait for the end, put `original`
    /// back. Returns rax and the time the function ran.
    fn run_call(
        &mut self,
        tid: i32,
        func: u64,
        regs: &user_regs_struct,
        original: &user_regs_struct,
        timeout: Duration,
    ) -> Result<(u64, Duration)> {
        sys::setregs(tid, regs).map_err(|e| self.ptrace_failed("PTRACE_SETREGS", tid, e))?;
        let started = Instant::now();
        if let Err(e) = sys::cont(tid, 0) {
            let _ = sys::setregs(tid, original);
            return Err(self.ptrace_failed("PTRACE_CONT", tid, e));
        }

        let deadline = Deadline::after(timeout);
        match self.wait_for_return(tid, regs.rsp + 8, deadline)? {
            CallEnd::Returned(ret) => {
                let duration = started.elapsed();
                self.restore_after_call(tid, original)?;
                self.collect_new_threads()?;
                Ok((ret, duration))
            }
            CallEnd::Faulted { signal, pc, addr } => {
                self.restore_after_call(tid, original)?;
                self.collect_new_threads()?;
                Err(InjectError::CallFaulted {
                    tid,
                    func,
                    signal,
                    pc,
                    addr,
                })
            }
            CallEnd::TimedOut => {
                let outcome = if let Some(pc) = self.interrupt_and_restore(tid, Some(original))? {
                    AbandonedCall::Restored { pc }
                } else {
                    self.threads.retain(|t| t.tid != tid);
                    self.lost.push((tid, Some(*original)));
                    AbandonedCall::StillRunning
                };
                self.collect_new_threads()?;
                Err(InjectError::CallTimedOut {
                    tid,
                    func,
                    after: timeout,
                    outcome,
                })
            }
        }
    }

    /// Runs the thread until the call returns (a SIGSEGV at rip 0 with rsp at
    /// `return_rsp`), faults, or the deadline passes.
    fn wait_for_return(
        &mut self,
        tid: i32,
        return_rsp: u64,
        deadline: Deadline,
    ) -> Result<CallEnd> {
        let mut backoff = Backoff::new();
        let mut idle_polls = 0u32;
        loop {
            let event = match sys::try_wait(tid) {
                Ok(Some(event)) => event,
                Ok(None) => {
                    if deadline.passed() {
                        return Ok(CallEnd::TimedOut);
                    }
                    idle_polls = (idle_polls + 1) % 64;
                    // If the function calls exit(), the stopped threads are killed and
                    // must be reaped before the calling thread's exit is reported.
                    if idle_polls == 0 {
                        self.reap_dead_threads()?;
                    }
                    backoff.snooze();
                    continue;
                }
                Err(nix::errno::Errno::ECHILD) => return Err(self.thread_exited(tid)),
                Err(e) => return Err(sys::ptrace_error("waitpid", tid, e)),
            };
            match event {
                WaitEvent::SignalStop { signal } => {
                    let info = sys::getsiginfo(tid).ok();
                    if is_fault(signal, info.as_ref()) {
                        let regs = self.getregs(tid)?;
                        if signal == libc::SIGSEGV && regs.rip == 0 && regs.rsp == return_rsp {
                            return Ok(CallEnd::Returned(regs.rax));
                        }
                        // SAFETY: si_addr is the fault address for the fault signals
                        // is_fault accepts (SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGTRAP);
                        // for SIGSYS the union member read is still plain data.
                        let addr = info.map_or(0, |i| unsafe { i.si_addr() } as u64);
                        return Ok(CallEnd::Faulted {
                            signal,
                            pc: regs.rip,
                            addr,
                        });
                    }
                    // Not for the function: hold it for resume.
                    self.thread_mut(tid)?
                        .pending
                        .push(PendingSignal { signal, info });
                }
                // A stale interrupt, or a SIGSTOP's group-stop: carry on.
                WaitEvent::EventStop { .. } | WaitEvent::OtherEvent => {}
                WaitEvent::Clone => self.note_clone(tid)?,
                WaitEvent::Exited | WaitEvent::Killed => return Err(self.thread_exited(tid)),
            }
            sys::cont(tid, 0).map_err(|e| self.ptrace_failed("PTRACE_CONT", tid, e))?;
        }
    }

    fn restore_after_call(&mut self, tid: i32, original: &user_regs_struct) -> Result<()> {
        sys::setregs(tid, original).map_err(|e| self.ptrace_failed("PTRACE_SETREGS", tid, e))?;
        let thread = self.thread_mut(tid)?;
        thread.regs = *original;
        thread.stop = StopKind::Trap;
        Ok(())
    }

    /// The thread best suited to run a remote call: one blocked in a system call
    /// other than `futex` (it holds no lock a `malloc` or `dlopen` could need, most
    /// likely), else the main thread, else the first.
    pub fn pick_call_thread(&self) -> i32 {
        let blocked = |tid: i32, regs: &user_regs_struct, in_syscall: bool| {
            let nr = process::thread_syscall(self.pid, tid).or_else(|| {
                let nr = regs.orig_rax as i64;
                (nr >= 0).then_some(nr)
            });
            in_syscall && nr.is_some_and(|nr| nr != libc::SYS_futex)
        };
        let threads = self.threads();
        threads
            .iter()
            .find(|t| blocked(t.tid(), t.regs(), t.in_syscall()))
            .or_else(|| threads.iter().find(|t| t.tid() == self.pid))
            .or(threads.first())
            .map_or(self.pid, |t| t.tid())
    }
}

fn arg_register(regs: &mut user_regs_struct, index: usize) -> &mut u64 {
    match index {
        0 => &mut regs.rdi,
        1 => &mut regs.rsi,
        2 => &mut regs.rdx,
        3 => &mut regs.rcx,
        4 => &mut regs.r8,
        _ => &mut regs.r9,
    }
}
