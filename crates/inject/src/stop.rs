//! Stop the world: every thread of a process in a ptrace-stop, held until
//! [`StoppedProcess::resume`].
//!
//! How a stop goes:
//!
//! 1. List `/proc/PID/task`; `PTRACE_SEIZE` each thread not yet seized (with
//!    `PTRACE_O_TRACECLONE`, so a thread it creates is attached by the kernel before it
//!    runs, and `PTRACE_O_TRACESYSGOOD`, so a run over a call can stop at its system
//!    calls) and `PTRACE_INTERRUPT` it.
//! 2. Wait for each seized thread until it is in a ptrace-stop: an interrupt stop, a
//!    group-stop (the process was already stopped by job control), or a
//!    signal-delivery-stop (a signal arrived first: it is kept and delivered again on
//!    resume). A thread caught in `clone` is let go until `clone` returns and
//!    interrupted again, and its new thread joins the wait. A thread that exits is
//!    dropped; the main thread exiting means the process is gone.
//! 3. List the tasks again; repeat until a listing shows no thread we have not seized.
//!
//! The tracer is the calling *thread*: every later call must come from it, so
//! [`StoppedProcess`] is neither `Send` nor `Sync`.

use std::fs::File;
use std::io;
use std::marker::PhantomData;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::time::{Duration, Instant};

use libc::{siginfo_t, user_regs_struct};
use nix::errno::Errno;

use crate::error::{InjectError, MemOp, Result};
use crate::process;
use crate::sys::{self, ptrace_error, Backoff, WaitEvent};

mod sharers;

/// How long [`StoppedProcess::stop`] may take before giving up.
pub const DEFAULT_STOP_TIMEOUT: Duration = Duration::from_secs(5);
/// How long [`StoppedProcess::step_out`] may single-step one thread.
pub const STEP_OUT_TIMEOUT: Duration = Duration::from_secs(2);
/// How long a thread created during a remote call or a step may take to report its
/// first stop, and how long an interrupted thread may take to stop.
pub(crate) const GRACE: Duration = Duration::from_secs(1);

// Kernel-internal return values of a system call that was interrupted and will be
// restarted when the thread resumes (include/linux/errno.h).
const ERESTARTSYS: i64 = 512;
const ERESTARTNOINTR: i64 = 513;
const ERESTARTNOHAND: i64 = 514;
const ERESTART_RESTARTBLOCK: i64 = 516;

/// Why a thread is stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopKind {
    /// weft's `PTRACE_INTERRUPT`, or the first stop of a thread created meanwhile.
    Interrupted,
    /// The process is stopped by job control (`signal` is SIGSTOP, SIGTSTP, ...). It
    /// is still stopped after [`StoppedProcess::resume`].
    GroupStop { signal: i32 },
    /// The thread was about to receive `signal`; it receives it on resume.
    Signal { signal: i32 },
    /// weft's own trap: the end of a single step or of a remote call. Nothing is
    /// delivered for it; the thread is held in an interrupt stop (signals kept for it
    /// are sent again on resume).
    Trap,
}

/// A signal taken from a thread while it was stopped, delivered again on resume.
#[derive(Debug, Clone)]
pub(crate) struct PendingSignal {
    pub signal: i32,
    /// The original siginfo, restored with PTRACE_SETSIGINFO when possible.
    pub info: Option<siginfo_t>,
}

/// One thread of a [`StoppedProcess`].
#[derive(Debug, Clone)]
pub struct StoppedThread {
    pub(crate) tid: i32,
    pub(crate) regs: user_regs_struct,
    pub(crate) stop: StopKind,
    pub(crate) pending: Vec<PendingSignal>,
}

impl StoppedThread {
    pub fn tid(&self) -> i32 {
        self.tid
    }

    /// The registers the thread will resume with.
    pub fn regs(&self) -> &user_regs_struct {
        &self.regs
    }

    pub fn pc(&self) -> u64 {
        self.regs.rip
    }

    pub fn stop_kind(&self) -> StopKind {
        self.stop
    }

    /// Signals that arrived while weft held the thread, in arrival order; they are
    /// delivered on resume.
    pub fn pending_signals(&self) -> Vec<i32> {
        self.pending.iter().map(|p| p.signal).collect()
    }

    /// True if the thread was blocked in a system call that the stop interrupted
    /// (it will be restarted, or fail with EINTR, when the thread resumes).
    pub fn in_syscall(&self) -> bool {
        self.syscall_error().is_some_and(|e| {
            e == libc::EINTR as i64
                || matches!(
                    e,
                    ERESTARTSYS | ERESTARTNOINTR | ERESTARTNOHAND | ERESTART_RESTARTBLOCK
                )
        })
    }

    /// Where the thread resumes if the kernel restarts its interrupted system call:
    /// the `syscall` instruction, two bytes before `pc`. `None` if there is no restart.
    pub fn restart_pc(&self) -> Option<u64> {
        let restarts = self.syscall_error().is_some_and(|e| {
            matches!(
                e,
                ERESTARTSYS | ERESTARTNOINTR | ERESTARTNOHAND | ERESTART_RESTARTBLOCK
            )
        });
        restarts.then(|| self.regs.rip.wrapping_sub(2))
    }

    /// The negated return value of the system call the thread is in, if any.
    fn syscall_error(&self) -> Option<i64> {
        ((self.regs.orig_rax as i64) >= 0).then(|| -(self.regs.rax as i64))
    }
}

/// Counters describing how a stop went (for tests and `-v` output).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StopStats {
    /// Listings of `/proc/PID/task`.
    pub rounds: u32,
    /// Threads created while weft held the process, attached through
    /// `PTRACE_EVENT_CLONE`.
    pub clones_caught: u32,
    /// Threads that exited while being stopped.
    pub threads_exited: u32,
}

/// Where a step at `insn` should run to rather than single-step: past a `call` or a
/// `rep`-prefixed string instruction (see [`StoppedProcess::step_out_within`]).
fn run_over(insn: iced_x86::Instruction) -> Option<u64> {
    // `call` only: iced-x86's flow control counts `syscall` as a call too.
    let over = insn.mnemonic() == iced_x86::Mnemonic::Call
        || ((insn.has_rep_prefix() || insn.has_repne_prefix()) && insn.is_string_instruction());
    over.then(|| insn.next_ip())
}

/// What a step-out leaves to clean up when it ends.
#[derive(Default)]
struct StepState {
    mask: TrapUnblocked,
    /// The thread is in its last step's trap stop, not yet an interrupt stop.
    unsettled: bool,
}

/// SIGTRAP unblocked in a thread for each step weft makes it take: the kernel
/// resets the handler of a trap signal that is blocked when a step raises it, which
/// would silently remove the target's (or weft's agent's) SIGTRAP handler and
/// unblock it. With the agent's step guard ([`StoppedProcess::set_step_guard`]),
/// the guard names the thread (and the mask weft changed) from the first step to
/// the end of the step-out.
#[derive(Default)]
struct TrapUnblocked {
    /// The mask weft set and the thread's own, to put back after the step.
    set: Option<(u64, u64)>,
    /// The step guard's address and the mask written there, once written.
    guard: Option<(u64, u64)>,
}

impl TrapUnblocked {
    const TRAP: u64 = 1 << (libc::SIGTRAP - 1);

    /// Before a step: unblocks SIGTRAP if the thread blocks it (its mask now: it
    /// may have set a new one since the last step).
    fn unblock(&mut self, stopped: &mut StoppedProcess, tid: i32) -> Result<()> {
        let mask =
            sys::getsigmask(tid).map_err(|e| stopped.ptrace_failed("PTRACE_GETSIGMASK", tid, e))?;
        let changed = if mask & Self::TRAP != 0 { mask } else { 0 };
        if let Some(at) = stopped.step_guard {
            if self.guard != Some((at, changed)) {
                let mut words = [0u8; 16];
                words[..8].copy_from_slice(&(tid as u64).to_le_bytes());
                words[8..].copy_from_slice(&changed.to_le_bytes());
                stopped.write_mem(at, &words)?;
                self.guard = Some((at, changed));
            }
        }
        if changed != 0 {
            sys::setsigmask(tid, mask & !Self::TRAP)
                .map_err(|e| stopped.ptrace_failed("PTRACE_SETSIGMASK", tid, e))?;
            self.set = Some((mask & !Self::TRAP, mask));
        }
        Ok(())
    }

    /// Whether the next step must look at the mask again (it was put back).
    fn after_step(&mut self, tid: i32) -> bool {
        let Some((set, mask)) = self.set.take() else {
            return false;
        };
        // A step over a call may change the mask itself (a new thread leaving
        // pthread_create's all-blocked mask, a `sigreturn`): the thread's own mask
        // stands then. Blocking SIGTRAP again over it would let the thread's next
        // int3 reset the SIGTRAP handler and kill the process. (The thread may be
        // gone: then so is its mask.)
        if sys::getsigmask(tid) == Ok(set) {
            let _ = sys::setsigmask(tid, mask);
        }
        true
    }

    /// At the end of the step-out (its last trap settled, no breakpoint armed):
    /// nothing of weft's is left to reach the thread.
    fn put_back(mut self, stopped: &StoppedProcess, tid: i32) {
        self.after_step(tid);
        if let Some((at, _)) = self.guard {
            let _ = stopped.write_mem(at, &[0u8; 16]);
        }
    }
}

/// A deadline and the budget it came from (for the error message).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Deadline {
    pub at: Instant,
    pub total: Duration,
}

impl Deadline {
    pub(crate) fn after(total: Duration) -> Self {
        Deadline {
            at: Instant::now() + total,
            total,
        }
    }

    pub(crate) fn passed(&self) -> bool {
        Instant::now() >= self.at
    }
}

/// A process with every thread in a ptrace-stop. Dropping it resumes the process
/// (as [`resume`](Self::resume) does, ignoring errors).
pub struct StoppedProcess {
    pub(crate) pid: i32,
    /// Our own thread id: the tracer.
    tracer: i32,
    /// `/proc/PID/task/TID/mem` of a held thread (the main thread's would be empty if
    /// it has exited while others live). Opened once the process is stopped.
    mem: Option<File>,
    /// Stopped threads, the main thread first, then by tid.
    pub(crate) threads: Vec<StoppedThread>,
    /// Seized (or auto-attached) threads whose stop we have not seen yet.
    awaiting: Vec<i32>,
    /// Auto-attached tasks of *another* process (clone without CLONE_THREAD): let go
    /// at their first stop.
    foreign: Vec<i32>,
    /// Threads that did not stop when interrupted after an abandoned remote call or
    /// step, with the registers to put back (if any) once they do.
    pub(crate) lost: Vec<(i32, Option<user_regs_struct>)>,
    /// Threads [`run_to`](Self::run_to) set a breakpoint on that is not cleared
    /// yet (they were not in a stop when their run ended).
    armed: Vec<i32>,
    /// Threads seen exiting; never seized again.
    dead: Vec<i32>,
    /// Traced threads that are exiting (killed while stopped, or a main thread that
    /// exited). Their exit is reported to us, the tracer, and must be collected, or
    /// the target's parent could never reap the process.
    dying: Vec<i32>,
    /// The main thread's exit was collected: the process is gone.
    leader_reaped: bool,
    first_interrupt: Option<Instant>,
    stats: StopStats,
    detached: bool,
    /// Where remote calls land, once chosen (see `call`).
    pub(crate) pad: Option<crate::call::Pad>,
    /// How long a landing pad waits for weft per round (tests shorten it).
    pub(crate) pad_wait: Duration,
    /// Tests: wait for pads to start leaving on their own before stopping them.
    pub(crate) catch_leaving: bool,
    /// Where the target's handler learns which thread weft is stepping
    /// ([`set_step_guard`](Self::set_step_guard)).
    step_guard: Option<u64>,
    /// Other processes sharing the memory, whose threads are held too (`sharers`).
    sharing: sharers::Sharing,
    /// A stray SIGTRAP would be harmless (see `set_trap_guarded`).
    trap_guarded: bool,
    _tracer_thread: PhantomData<*const ()>,
}

impl StoppedProcess {
    /// Stops every thread of `pid`, giving up after [`DEFAULT_STOP_TIMEOUT`].
    pub fn stop(pid: i32) -> Result<Self> {
        Self::stop_within(pid, DEFAULT_STOP_TIMEOUT)
    }

    /// Stops every thread of `pid`, giving up after `timeout`. On error, whatever was
    /// stopped is resumed.
    pub fn stop_within(pid: i32, timeout: Duration) -> Result<Self> {
        let deadline = Deadline::after(timeout);
        preflight(pid)?;
        let mut this = StoppedProcess {
            pid,
            tracer: sys::gettid(),
            mem: None,
            threads: Vec::new(),
            awaiting: Vec::new(),
            foreign: Vec::new(),
            lost: Vec::new(),
            armed: Vec::new(),
            dead: Vec::new(),
            dying: Vec::new(),
            leader_reaped: false,
            first_interrupt: None,
            stats: StopStats::default(),
            detached: false,
            pad: None,
            pad_wait: crate::call::PAD_WAIT,
            catch_leaving: false,
            step_guard: None,
            sharing: sharers::Sharing::default(),
            trap_guarded: false,
            _tracer_thread: PhantomData,
        };
        loop {
            this.stats.rounds += 1;
            let tids = match process::threads(pid) {
                Ok(tids) => tids,
                Err(InjectError::NoSuchProcess { .. }) => return Err(this.gone_error()),
                Err(e) => return Err(e),
            };
            let mut seized = false;
            for tid in tids {
                if !this.knows(tid) {
                    seized |= this.seize(tid)?;
                }
            }
            if !seized && this.awaiting.is_empty() {
                break;
            }
            if deadline.passed() {
                return Err(InjectError::Timeout {
                    pid,
                    what: "waiting for every thread to stop",
                    after: timeout,
                });
            }
            this.await_stops(deadline, "waiting for every thread to stop")?;
        }
        this.stop_sharers(deadline, timeout)?;
        // A SIGKILL (or another thread's exit_group) wakes even stopped threads: keep
        // only threads still in a ptrace-stop (any request but a few fails with ESRCH
        // on a thread that is not, or that has a fatal signal pending).
        for tid in this.threads.iter().map(|t| t.tid).collect::<Vec<_>>() {
            if sys::geteventmsg(tid) == Err(Errno::ESRCH) {
                this.threads.retain(|t| t.tid != tid);
                this.dying.push(tid);
            }
        }
        if !this.dying.is_empty() {
            this.collect_dying(Deadline::after(GRACE));
        }
        if this.threads.is_empty() || this.leader_reaped {
            return Err(this.gone_error());
        }
        let tid = this.threads[0].tid;
        this.mem = Some(open_mem(pid, tid)?);
        for tid in this.threads.iter().map(|t| t.tid).collect::<Vec<_>>() {
            this.rewind_int3_trap(tid)?;
        }
        crate::die::at("world-stopped");
        Ok(this)
    }

    /// If thread `tid` is caught in the signal-delivery-stop of an `int3` (SIGTRAP,
    /// SI_KERNEL, its pc just past a 0xCC byte), puts it back on the `int3` and drops
    /// the SIGTRAP: it traps again when it runs (or runs the original instruction if
    /// the byte was restored meanwhile), with the same siginfo. Held instead, the
    /// trap would be lost if weft died: a tracer's exit lets a thread in a
    /// signal-delivery-stop go *without* its signal, and it would run on from the
    /// middle of the instruction the `int3` replaced. (A fault needs nothing: its pc
    /// is still on the faulting instruction, which faults again.)
    fn rewind_int3_trap(&mut self, tid: i32) -> Result<bool> {
        const SI_KERNEL: i32 = 0x80;
        let Ok(t) = self.thread(tid) else {
            return Ok(false);
        };
        let trapped = t.stop
            == StopKind::Signal {
                signal: libc::SIGTRAP,
            }
            && t.pending.len() == 1
            && t.pending[0].info.is_some_and(|i| i.si_code == SI_KERNEL);
        if !trapped {
            return Ok(false);
        }
        let mut regs = t.regs;
        let at = regs.rip.wrapping_sub(1);
        let mut byte = [0u8; 1];
        let read = match self.mem {
            Some(_) => self.read_mem(at, &mut byte).is_ok(),
            // While the world is being stopped: through the thread's own file.
            None => open_mem(self.tgid_of(tid), tid)
                .is_ok_and(|f| f.read_exact_at(&mut byte, at).is_ok()),
        };
        if !read || byte[0] != 0xcc {
            return Ok(false);
        }
        // Back on the int3 first, while the SIGTRAP is still the stop's: should weft
        // die from here on, the kernel drops the signal and the thread traps again.
        regs.rip = at;
        sys::setregs(tid, &regs).map_err(|e| self.ptrace_failed("PTRACE_SETREGS", tid, e))?;
        self.thread_mut(tid)?.pending.clear();
        self.settle_trap(tid, Deadline::after(GRACE))?;
        let regs = self.getregs(tid)?;
        let thread = self.thread_mut(tid)?;
        thread.regs = regs;
        thread.stop = StopKind::Interrupted;
        crate::die::at("int3-held");
        Ok(true)
    }

    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// The stopped threads, the main thread first.
    pub fn threads(&self) -> &[StoppedThread] {
        &self.threads
    }

    pub fn thread(&self, tid: i32) -> Result<&StoppedThread> {
        self.threads
            .iter()
            .find(|t| t.tid == tid)
            .ok_or(InjectError::UnknownThread { pid: self.pid, tid })
    }

    /// Lets each held thread that has a SIGTRAP queued (not yet delivered) take it
    /// alone, in a signal-delivery-stop before it runs any instruction, and keeps it
    /// (with any other signal taken on the way) for resume, where
    /// [`drop_pending`](Self::drop_pending) can reach it: for traps a weft that died
    /// while stepping left behind, which the process would take after the resume.
    pub fn take_queued_traps(&mut self) -> Result<()> {
        let own: Vec<i32> = self
            .threads
            .iter()
            .map(|t| t.tid)
            .filter(|&t| self.tgid_of(t) == self.pid)
            .collect();
        for tid in own {
            if self.thread(tid).is_ok() {
                self.take_queued_trap(tid, true)?;
            }
        }
        Ok(())
    }

    /// Drops the signals kept for `tid` (delivered on resume otherwise) that `stray`
    /// picks by number and siginfo: signals the caller knows are not the program's,
    /// such as the step trap of a weft that died while stepping. Returns how many.
    pub fn drop_pending(
        &mut self,
        tid: i32,
        mut stray: impl FnMut(i32, Option<&siginfo_t>) -> bool,
    ) -> Result<usize> {
        let thread = self.thread_mut(tid)?;
        let before = thread.pending.len();
        thread.pending.retain(|p| !stray(p.signal, p.info.as_ref()));
        Ok(before - thread.pending.len())
    }

    pub(crate) fn thread_mut(&mut self, tid: i32) -> Result<&mut StoppedThread> {
        let pid = self.pid;
        self.threads
            .iter_mut()
            .find(|t| t.tid == tid)
            .ok_or(InjectError::UnknownThread { pid, tid })
    }

    pub fn stats(&self) -> StopStats {
        self.stats
    }

    /// Time since the first thread was interrupted.
    pub fn paused_for(&self) -> Duration {
        self.first_interrupt.map_or(Duration::ZERO, |t| t.elapsed())
    }

    /// Threads whose pc, or the pc they resume at after a system call restart, lies
    /// in one of `ranges`.
    pub fn threads_in(&self, ranges: &[Range<u64>]) -> Vec<i32> {
        let inside = |pc: u64| ranges.iter().any(|r| r.contains(&pc));
        self.threads
            .iter()
            .filter(|t| inside(t.pc()) || t.restart_pc().is_some_and(inside))
            .map(|t| t.tid)
            .collect()
    }

    /// Sets the registers `tid` resumes with.
    pub fn set_regs(&mut self, tid: i32, regs: &user_regs_struct) -> Result<()> {
        self.thread(tid)?;
        sys::setregs(tid, regs).map_err(|e| self.ptrace_failed("PTRACE_SETREGS", tid, e))?;
        self.thread_mut(tid)?.regs = *regs;
        Ok(())
    }

    fn mem(&self) -> &File {
        self.mem.as_ref().expect("opened by stop()")
    }

    /// Reads target memory through `/proc/PID/mem`; all of `buf` or an error.
    pub fn read_mem(&self, addr: u64, buf: &mut [u8]) -> Result<()> {
        let mut done = 0;
        while done < buf.len() {
            let at = addr.checked_add(done as u64);
            match at.map(|at| self.mem().read_at(&mut buf[done..], at)) {
                Some(Ok(0)) => return Err(self.mem_error(MemOp::Read, addr, buf.len(), eio())),
                Some(Ok(n)) => done += n,
                Some(Err(e)) if e.kind() == io::ErrorKind::Interrupted => {}
                Some(Err(e)) => return Err(self.mem_error(MemOp::Read, addr, buf.len(), e)),
                None => return Err(self.mem_error(MemOp::Read, addr, buf.len(), eio())),
            }
        }
        Ok(())
    }

    /// Writes target memory through `/proc/PID/mem`. The kernel writes through page
    /// protections (read-only code included) without changing them; private file
    /// mappings get a private copy of the page, as a breakpoint would.
    pub fn write_mem(&self, addr: u64, data: &[u8]) -> Result<()> {
        let mut done = 0;
        while done < data.len() {
            let at = addr.checked_add(done as u64);
            match at.map(|at| self.mem().write_at(&data[done..], at)) {
                Some(Ok(0)) => return Err(self.mem_error(MemOp::Write, addr, data.len(), eio())),
                Some(Ok(n)) => done += n,
                Some(Err(e)) if e.kind() == io::ErrorKind::Interrupted => {}
                Some(Err(e)) => return Err(self.mem_error(MemOp::Write, addr, data.len(), e)),
                None => return Err(self.mem_error(MemOp::Write, addr, data.len(), eio())),
            }
        }
        Ok(())
    }

    /// Reads a NUL-terminated string of at most `max` bytes (without the NUL), never
    /// reading past the page that holds its end.
    pub fn read_c_string(&self, addr: u64, max: usize) -> Result<Vec<u8>> {
        const PAGE: u64 = 4096;
        let mut out = Vec::new();
        let mut at = addr;
        while out.len() < max {
            let chunk = ((PAGE - at % PAGE) as usize).min(max - out.len());
            let mut buf = vec![0; chunk];
            self.read_mem(at, &mut buf)?;
            if let Some(end) = buf.iter().position(|&b| b == 0) {
                out.extend_from_slice(&buf[..end]);
                return Ok(out);
            }
            out.extend_from_slice(&buf);
            at += chunk as u64;
        }
        Ok(out)
    }

    /// Single-steps `tid` until its pc is outside every range in `ranges`, at most
    /// `max_steps` steps. Returns the number of steps taken.
    ///
    /// Signals that arrive meanwhile are kept for resume. Fails without stepping if
    /// the thread sits after a system call whose restart would jump back into a range
    /// (stepping would re-enter the call), and stops with an error if the thread
    /// faults (the fault is delivered on resume) or blocks for [`STEP_OUT_TIMEOUT`].
    pub fn step_out(&mut self, tid: i32, ranges: &[Range<u64>], max_steps: usize) -> Result<usize> {
        self.step_out_within(tid, ranges, max_steps, STEP_OUT_TIMEOUT, None)
    }

    /// [`step_out`](Self::step_out) giving up after `timeout` (a thread that blocks
    /// meanwhile is interrupted and stays where it got to, its own code having run).
    /// With `may_enter`, stepping stops with an error before a `syscall` instruction
    /// inside a range unless `may_enter` accepts the registers (call number in `rax`,
    /// arguments in `rdi`, `rsi`, ...): a call that blocks stalls the step until the
    /// timeout (callers accept the calls that return at once, such as `brk`, `munmap`
    /// or a futex wake). `None` steps into any call.
    ///
    /// A `call` is run over rather than stepped through (a hardware breakpoint at its
    /// return address; the callee may run thousands of instructions, a ptrace round
    /// trip each), stopping at each of the callee's system calls: one `may_enter`
    /// refuses is taken back before it runs (the thread is left at its `syscall`
    /// instruction), so a callee never blocks, and never blocks SIGTRAP
    /// (`rt_sigprocmask`), while weft runs it. So is a `rep` string instruction (one
    /// trap per iteration otherwise).
    pub fn step_out_within(
        &mut self,
        tid: i32,
        ranges: &[Range<u64>],
        max_steps: usize,
        timeout: Duration,
        may_enter: Option<&dyn Fn(&libc::user_regs_struct) -> bool>,
    ) -> Result<usize> {
        let deadline = Deadline::after(timeout);
        let mut state = StepState::default();
        let result = self.step_out_steps(tid, ranges, max_steps, deadline, may_enter, &mut state);
        // Only the last trap stop is traded for an interrupt stop (see
        // `set_trap_guarded`); the thread may be gone.
        let settled = if state.unsettled && self.thread(tid).is_ok() {
            self.settle_trap(tid, Deadline::after(GRACE))
        } else {
            Ok(())
        };
        std::mem::take(&mut state.mask).put_back(self, tid);
        let steps = result?;
        settled.map(|()| steps)
    }

    /// Runs `tid` alone until its pc is `addr` (a hardware breakpoint, as a run
    /// over a call), at most `timeout`: for a thread inside a library whose return
    /// address into the program is known, one run instead of a step-out's
    /// thousands of steps. System calls on the way are refused as in
    /// [`step_out_within`](Self::step_out_within) (the thread is left at the
    /// `syscall` instruction, with [`InjectError::StepOutAtSyscall`]); SIGTRAP is
    /// unblocked meanwhile, and the thread ends in an interrupt stop.
    pub fn run_until(
        &mut self,
        tid: i32,
        addr: u64,
        timeout: Duration,
        may_enter: Option<&dyn Fn(&libc::user_regs_struct) -> bool>,
    ) -> Result<()> {
        let deadline = Deadline::after(timeout);
        let mut mask = TrapUnblocked::default();
        mask.unblock(self, tid)?;
        let result = self.run_to(tid, addr, deadline, may_enter, true);
        mask.put_back(self, tid);
        result
    }

    fn step_out_steps(
        &mut self,
        tid: i32,
        ranges: &[Range<u64>],
        max_steps: usize,
        deadline: Deadline,
        may_enter: Option<&dyn Fn(&libc::user_regs_struct) -> bool>,
        state: &mut StepState,
    ) -> Result<usize> {
        let inside = |pc: u64| ranges.iter().any(|r| r.contains(&pc));
        let settle = !self.trap_guarded;
        let mut steps = 0;
        // The thread's mask is looked at before the first step and again after any
        // step that may have changed it (a system call, a run over a call).
        let mut look_at_mask = true;
        loop {
            let thread = self.thread(tid)?;
            if let Some(pc) = thread.restart_pc().filter(|&pc| inside(pc)) {
                return Err(InjectError::StepOutInSyscall { tid, pc });
            }
            if !inside(thread.pc()) {
                return Ok(steps);
            }
            if steps >= max_steps {
                let pc = thread.pc();
                return Err(InjectError::StepOutLimit { tid, steps, pc });
            }
            let pc = thread.pc();
            let regs = thread.regs;
            let insn = self.decode_at(pc);
            let syscall = insn.is_some_and(|i| i.mnemonic() == iced_x86::Mnemonic::Syscall);
            if syscall && may_enter.is_some_and(|ok| !ok(&regs)) {
                return Err(InjectError::StepOutAtSyscall { tid, pc });
            }
            if steps > 0 && deadline.passed() {
                return Err(InjectError::Timeout {
                    pid: self.pid,
                    what: "single-stepping a thread out of the given ranges",
                    after: deadline.total,
                });
            }
            // The budget is checked between steps; a step itself gets at least GRACE.
            // A step cut short by an interrupt may leave its SIGTRAP queued behind the
            // interrupt stop, where it would reach the thread after the detach.
            let step_deadline = if deadline.at.saturating_duration_since(Instant::now()) < GRACE {
                Deadline::after(GRACE)
            } else {
                deadline
            };
            if look_at_mask {
                state.mask.unblock(self, tid)?;
            }
            let over = insn.and_then(run_over);
            state.unsettled = false;
            let stepped = match over {
                Some(next) => self.run_to(tid, next, step_deadline, may_enter, settle),
                None => self.resume_until_trap(tid, step_deadline, settle),
            };
            state.unsettled = stepped.is_ok() && !settle;
            let put_back = state.mask.after_step(tid);
            stepped?;
            look_at_mask = syscall || over.is_some() || put_back;
            steps += 1;
        }
    }

    /// The instruction at `pc`, if it can be read and decoded.
    fn decode_at(&self, pc: u64) -> Option<iced_x86::Instruction> {
        let mut bytes = [0u8; 15];
        self.read_mem(pc, &mut bytes).ok()?;
        let insn =
            iced_x86::Decoder::with_ip(64, &bytes, pc, iced_x86::DecoderOptions::NONE).decode();
        (!insn.is_invalid()).then_some(insn)
    }

    /// Says that a SIGTRAP the kernel delivered to a held thread would be harmless
    /// (the caller has a no-op SIGTRAP handler in place: the attach's trap guard).
    /// Should weft die while a step's trap stop is pending, the kernel delivers the
    /// SIGTRAP; without a guard each step's stop is therefore traded for an interrupt
    /// stop at once (two more round trips per step); with one, only the last step's.
    pub fn set_trap_guarded(&mut self, guarded: bool) {
        self.trap_guarded = guarded;
    }

    /// Runs `tid` alone until it reaches `addr` (a hardware breakpoint in debug
    /// register 0, cleared again before returning), stopping at each system call on
    /// the way: one `may_enter` refuses is taken back before it runs (the thread is
    /// left at its `syscall` instruction, with [`InjectError::StepOutAtSyscall`]).
    /// Other signals are kept for resume; a fault or the deadline ends it with an
    /// error. Were weft killed meanwhile, the breakpoint would stay: callers hold a
    /// SIGTRAP handler in place (the trap guard, or the agent's with the step
    /// guard), and the next attach clears every thread's debug registers.
    fn run_to(
        &mut self,
        tid: i32,
        addr: u64,
        deadline: Deadline,
        may_enter: Option<&dyn Fn(&libc::user_regs_struct) -> bool>,
        settle: bool,
    ) -> Result<()> {
        /// DR7: local enable of breakpoint 0, execute, length 1.
        const DR7_L0: u64 = 1;
        sys::set_debugreg(tid, 0, addr)
            .map_err(|e| self.ptrace_failed("PTRACE_POKEUSER", tid, e))?;
        self.armed.push(tid);
        sys::set_debugreg(tid, 7, DR7_L0)
            .map_err(|e| self.ptrace_failed("PTRACE_POKEUSER", tid, e))?;
        crate::die::at("step-breakpoint");
        let result = self.run_to_breakpoint(tid, deadline, may_enter, settle);
        self.disarm(tid);
        result
    }

    /// Clears the breakpoint [`run_to`](Self::run_to) set on `tid`, if the thread is
    /// in a stop now; else it stays listed and is cleared once the thread is stopped
    /// again (at the latest before it is let go: a thread left with its breakpoint
    /// armed would meet it with no tracer, and its SIGTRAP would kill the process).
    fn disarm(&mut self, tid: i32) {
        // The thread may be gone (then so are its registers).
        let gone =
            !self.threads.iter().any(|t| t.tid == tid) && !self.lost.iter().any(|(t, _)| *t == tid);
        if gone || (sys::set_debugreg(tid, 7, 0).is_ok() && sys::set_debugreg(tid, 0, 0).is_ok()) {
            self.armed.retain(|&t| t != tid);
        }
    }

    /// Clears every breakpoint still listed (threads that were not stopped when
    /// their run ended), now that they are.
    fn disarm_all(&mut self) {
        for tid in self.armed.clone() {
            self.disarm(tid);
        }
    }

    /// Names where in the target a SIGTRAP handler can tell weft's own traps: two
    /// 64-bit words at `addr` that hold, while weft single-steps a thread or runs
    /// it to a breakpoint, the thread's id and the signal mask weft changed for it
    /// (it unblocks SIGTRAP for the step; 0 if it changed nothing), and zeroes
    /// otherwise. Written with the world stopped. Should weft die in between, the
    /// thread gets the step's SIGTRAP, or meets the breakpoint, with no tracer to
    /// take it: a handler that finds its thread named there knows the trap is
    /// weft's and swallows it (weft's agent does).
    pub fn set_step_guard(&mut self, addr: u64) {
        self.step_guard = (addr != 0).then_some(addr);
    }

    fn run_to_breakpoint(
        &mut self,
        tid: i32,
        deadline: Deadline,
        may_enter: Option<&dyn Fn(&libc::user_regs_struct) -> bool>,
        settle: bool,
    ) -> Result<()> {
        let go = |s: &mut Self| {
            sys::syscall_cont(tid, 0).map_err(|e| s.ptrace_failed("PTRACE_SYSCALL", tid, e))
        };
        // Between a syscall-entry stop and its exit stop.
        let mut in_call = false;
        go(self)?;
        loop {
            let Some(event) = self.wait_event(tid, deadline)? else {
                return Err(self.step_timed_out(tid, deadline));
            };
            match event {
                WaitEvent::Syscall if in_call => in_call = false,
                WaitEvent::Syscall => {
                    let regs = self.getregs(tid)?;
                    // As the thread was at its `syscall` instruction.
                    let mut at = regs;
                    at.rax = regs.orig_rax;
                    at.rip = regs.rip.wrapping_sub(2);
                    if may_enter.is_some_and(|ok| !ok(&at)) {
                        return self.take_back_syscall(tid, regs);
                    }
                    in_call = true;
                }
                WaitEvent::SignalStop { signal } => {
                    if self.trap_or_fault(tid, signal)? {
                        break;
                    }
                }
                WaitEvent::EventStop { .. } | WaitEvent::OtherEvent => {}
                WaitEvent::Clone => self.note_clone(tid)?,
                WaitEvent::Exited | WaitEvent::Killed => return Err(self.thread_exited(tid)),
            }
            go(self)?;
        }
        self.trap_taken(tid, settle)
    }

    /// `tid` is at the entry of a system call (registers `regs`) that must not run:
    /// the call is skipped (`orig_rax` -1) and the thread put back at its `syscall`
    /// instruction with the call number in `rax`, as if it had not got there yet; it
    /// makes the call when resumed.
    fn take_back_syscall(&mut self, tid: i32, regs: user_regs_struct) -> Result<()> {
        let deadline = Deadline::after(GRACE);
        let mut skip = regs;
        skip.orig_rax = u64::MAX;
        sys::setregs(tid, &skip).map_err(|e| self.ptrace_failed("PTRACE_SETREGS", tid, e))?;
        sys::syscall_cont(tid, 0).map_err(|e| self.ptrace_failed("PTRACE_SYSCALL", tid, e))?;
        loop {
            let Some(event) = self.wait_event(tid, deadline)? else {
                return Err(self.step_timed_out(tid, deadline));
            };
            match event {
                WaitEvent::Syscall => break,
                WaitEvent::Exited | WaitEvent::Killed => return Err(self.thread_exited(tid)),
                WaitEvent::SignalStop { signal } => {
                    let info = sys::getsiginfo(tid).ok();
                    self.thread_mut(tid)?
                        .pending
                        .push(PendingSignal { signal, info });
                }
                WaitEvent::Clone => self.note_clone(tid)?,
                WaitEvent::EventStop { .. } | WaitEvent::OtherEvent => {}
            }
            sys::syscall_cont(tid, 0).map_err(|e| self.ptrace_failed("PTRACE_SYSCALL", tid, e))?;
        }
        let mut back = regs;
        back.rax = regs.orig_rax;
        back.orig_rax = u64::MAX;
        back.rip = regs.rip.wrapping_sub(2);
        sys::setregs(tid, &back).map_err(|e| self.ptrace_failed("PTRACE_SETREGS", tid, e))?;
        // From the syscall-exit stop to an interrupt stop, as after any step.
        self.settle_trap(tid, deadline)?;
        let regs = self.getregs(tid)?;
        let thread = self.thread_mut(tid)?;
        thread.regs = regs;
        thread.stop = StopKind::Trap;
        Err(InjectError::StepOutAtSyscall { tid, pc: back.rip })
    }

    /// Clears the debug registers of every stopped thread: a breakpoint
    /// [`run_to`](Self::run_to) left in place if a weft died during it.
    pub fn clear_breakpoints(&mut self) {
        for t in &self.threads {
            let _ = sys::set_debugreg(t.tid, 7, 0);
        }
    }

    /// One single step of `tid`. A thread that blocks SIGTRAP has it unblocked for
    /// the step (and the mask put back after): the kernel resets the handler of a
    /// trap signal that is blocked when the step raises it, which would silently
    /// remove the target's (or weft's agent's) SIGTRAP handler and unblock it.
    pub(crate) fn single_step(&mut self, tid: i32, deadline: Deadline) -> Result<()> {
        let mut mask = TrapUnblocked::default();
        mask.unblock(self, tid)?;
        let result = self.resume_until_trap(tid, deadline, true);
        mask.put_back(self, tid);
        result
    }

    /// One single step; with `settle`, its trap stop traded for an interrupt stop.
    fn resume_until_trap(&mut self, tid: i32, deadline: Deadline, settle: bool) -> Result<()> {
        let go = |s: &mut Self| {
            sys::singlestep(tid, 0).map_err(|e| s.ptrace_failed("PTRACE_SINGLESTEP", tid, e))
        };
        go(self)?;
        loop {
            let Some(event) = self.wait_event(tid, deadline)? else {
                return Err(self.step_timed_out(tid, deadline));
            };
            match event {
                WaitEvent::SignalStop { signal } => {
                    if self.trap_or_fault(tid, signal)? {
                        break;
                    }
                }
                WaitEvent::EventStop { .. } | WaitEvent::OtherEvent | WaitEvent::Syscall => {}
                WaitEvent::Clone => self.note_clone(tid)?,
                WaitEvent::Exited | WaitEvent::Killed => return Err(self.thread_exited(tid)),
            }
            // The step has not completed: ask again.
            go(self)?;
        }
        self.trap_taken(tid, settle)
    }

    /// A signal stop during a step or a run: `true` for the step's (or breakpoint's)
    /// own trap; another signal is kept for resume, and a fault ends the step with
    /// an error (the thread stays in the fault's stop; the fault is delivered on
    /// resume).
    fn trap_or_fault(&mut self, tid: i32, signal: i32) -> Result<bool> {
        let info = sys::getsiginfo(tid).ok();
        if signal == libc::SIGTRAP && info.is_some_and(|i| is_step_trap(&i)) {
            crate::die::at("step-trap");
            return Ok(true);
        }
        let fault = is_fault(signal, info.as_ref());
        self.thread_mut(tid)?
            .pending
            .push(PendingSignal { signal, info });
        if fault {
            let regs = self.getregs(tid)?;
            let thread = self.thread_mut(tid)?;
            thread.regs = regs;
            thread.stop = StopKind::Signal { signal };
            let pc = regs.rip;
            self.rewind_int3_trap(tid)?;
            return Err(InjectError::StepOutFault { tid, signal, pc });
        }
        Ok(false)
    }

    /// The step's trap stop was reached: settle it (or leave that to the end of the
    /// step-out) and take the registers. Settling has its own time: the step or run
    /// whose budget is spent got there, and a thread left half-settled (interrupted,
    /// not yet stopped) could not have its breakpoint cleared.
    fn trap_taken(&mut self, tid: i32, settle: bool) -> Result<()> {
        if settle {
            self.settle_trap(tid, Deadline::after(GRACE))?;
        }
        let regs = self.getregs(tid)?;
        let thread = self.thread_mut(tid)?;
        thread.regs = regs;
        thread.stop = StopKind::Trap;
        Ok(())
    }

    /// A step or run that did not complete in time: the thread is interrupted where
    /// it got to (a trap it raised meanwhile taken and swallowed).
    fn step_timed_out(&mut self, tid: i32, deadline: Deadline) -> InjectError {
        let outcome = match self.interrupt_and_restore(tid, None) {
            Ok(None) => {
                self.threads.retain(|t| t.tid != tid);
                self.lost.push((tid, None));
                Ok(())
            }
            Ok(Some(_)) => self.take_queued_step_trap(tid),
            Err(e) => Err(e),
        };
        match outcome {
            Ok(()) => InjectError::Timeout {
                pid: self.pid,
                what: "single-stepping a thread out of the given ranges",
                after: deadline.total,
            },
            Err(e) => e,
        }
    }

    /// After a step cut short by an interrupt: a step that completed meanwhile (in a
    /// blocking system call, the trap is raised when the call is interrupted) has
    /// its SIGTRAP queued behind the interrupt stop, where it would reach the thread
    /// after the detach and kill it. Let the thread take it, and swallow it; other
    /// signals taken on the way are kept for resume.
    fn take_queued_step_trap(&mut self, tid: i32) -> Result<()> {
        self.take_queued_trap(tid, false)
    }

    /// As [`take_queued_step_trap`](Self::take_queued_step_trap); with `keep`, a
    /// step's trap is kept for resume like any other signal (the caller decides).
    fn take_queued_trap(&mut self, tid: i32, keep: bool) -> Result<()> {
        let trap = 1u64 << (libc::SIGTRAP - 1);
        if process::signal_mask(self.pid, tid, "SigPnd") & trap == 0 {
            return Ok(());
        }
        let deadline = Deadline::after(GRACE);
        sys::cont(tid, 0).map_err(|e| self.ptrace_failed("PTRACE_CONT", tid, e))?;
        loop {
            let Some(event) = self.wait_event(tid, deadline)? else {
                // Not taken in time (blocked meanwhile?): stop the thread where it is.
                if self.interrupt_and_restore(tid, None)?.is_none() {
                    self.threads.retain(|t| t.tid != tid);
                    self.lost.push((tid, None));
                }
                return Ok(());
            };
            match event {
                WaitEvent::SignalStop { signal } => {
                    let info = sys::getsiginfo(tid).ok();
                    if keep && signal == libc::SIGTRAP {
                        // Any SIGTRAP ends it: an int3's is put back on its int3
                        // (as a stop does), any other kept.
                        let regs = self.getregs(tid)?;
                        let thread = self.thread_mut(tid)?;
                        thread.regs = regs;
                        thread.stop = StopKind::Signal { signal };
                        thread.pending.push(PendingSignal { signal, info });
                        if self.rewind_int3_trap(tid)? {
                            return Ok(());
                        }
                        self.settle_trap(tid, deadline)?;
                        let regs = self.getregs(tid)?;
                        let thread = self.thread_mut(tid)?;
                        thread.regs = regs;
                        thread.stop = StopKind::Trap;
                        return Ok(());
                    }
                    if signal == libc::SIGTRAP && info.is_some_and(|i| is_step_trap(&i)) {
                        self.settle_trap(tid, deadline)?;
                        let regs = self.getregs(tid)?;
                        let thread = self.thread_mut(tid)?;
                        thread.regs = regs;
                        thread.stop = StopKind::Trap;
                        return Ok(());
                    }
                    self.thread_mut(tid)?
                        .pending
                        .push(PendingSignal { signal, info });
                }
                WaitEvent::EventStop { .. } | WaitEvent::OtherEvent | WaitEvent::Syscall => {}
                WaitEvent::Clone => self.note_clone(tid)?,
                WaitEvent::Exited | WaitEvent::Killed => return Err(self.thread_exited(tid)),
            }
            sys::cont(tid, 0).map_err(|e| self.ptrace_failed("PTRACE_CONT", tid, e))?;
        }
    }

    /// `tid` sits in a signal-delivery-stop weft caused (the SIGTRAP of a completed
    /// step, a fault of a remote call). Should weft die now, the kernel would let it
    /// go *with* that signal, which kills the target: trade the stop for an
    /// interrupt stop, which carries no signal (resuming with no signal and an
    /// interrupt pending stops the thread again before it runs any instruction).
    pub(crate) fn settle_trap(&mut self, tid: i32, deadline: Deadline) -> Result<()> {
        sys::interrupt(tid).map_err(|e| self.ptrace_failed("PTRACE_INTERRUPT", tid, e))?;
        sys::cont(tid, 0).map_err(|e| self.ptrace_failed("PTRACE_CONT", tid, e))?;
        loop {
            let Some(event) = self.wait_event(tid, deadline)? else {
                return Err(InjectError::Timeout {
                    pid: self.pid,
                    what: "stopping a thread after a single step",
                    after: deadline.total,
                });
            };
            match event {
                WaitEvent::EventStop { .. } => return Ok(()),
                WaitEvent::SignalStop { signal } => {
                    // A signal that was queued meanwhile: keep it for resume and ask
                    // again (this stop consumed nothing of the interrupt).
                    let info = sys::getsiginfo(tid).ok();
                    self.thread_mut(tid)?
                        .pending
                        .push(PendingSignal { signal, info });
                    sys::cont(tid, 0).map_err(|e| self.ptrace_failed("PTRACE_CONT", tid, e))?;
                }
                WaitEvent::Clone | WaitEvent::OtherEvent | WaitEvent::Syscall => {
                    if event == WaitEvent::Clone {
                        self.note_clone(tid)?;
                    }
                    sys::cont(tid, 0).map_err(|e| self.ptrace_failed("PTRACE_CONT", tid, e))?;
                    sys::interrupt(tid)
                        .map_err(|e| self.ptrace_failed("PTRACE_INTERRUPT", tid, e))?;
                }
                WaitEvent::Exited | WaitEvent::Killed => return Err(self.thread_exited(tid)),
            }
        }
    }

    /// Detaches every thread, delivering again the signals that arrived during the
    /// stop. A process that was stopped by job control stays stopped. Returns how long
    /// the process was paused (first interrupt to last detach).
    pub fn resume(mut self) -> Result<Duration> {
        self.detach_all()
    }

    fn detach_all(&mut self) -> Result<Duration> {
        self.detached = true;
        let mut first_error = None;
        if !self.awaiting.is_empty() {
            // Threads created during a call or a step stop at once; wait for them,
            // since only a stopped tracee can be detached.
            let what = "waiting for new threads to stop before resuming";
            if let Err(e) = self.await_stops(Deadline::after(GRACE), what) {
                first_error.get_or_insert(e);
            }
        }
        for (tid, regs) in std::mem::take(&mut self.lost) {
            if let Err(e) = self.recover_lost(tid, regs) {
                first_error.get_or_insert(e);
                // Still running a remote call: it may come back to the pad.
                self.lost.push((tid, regs));
            }
        }
        self.release_pad();
        self.disarm_all();
        for thread in std::mem::take(&mut self.threads) {
            match detach_thread(self.tgid_of(thread.tid), &thread) {
                Ok(true) => {}
                // Not in a ptrace-stop any more: killed meanwhile.
                Ok(false) => self.dying.push(thread.tid),
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        self.collect_dying(Deadline::after(GRACE));
        let paused = self.paused_for();
        first_error.map_or(Ok(paused), Err)
    }

    /// A thread that ignored the interrupt after an abandoned call or step: try once
    /// more to stop it (and put its registers back) before letting it go.
    fn recover_lost(&mut self, tid: i32, regs: Option<user_regs_struct>) -> Result<()> {
        self.threads.push(StoppedThread {
            tid,
            regs: regs.unwrap_or_else(zeroed_regs),
            stop: StopKind::Interrupted,
            pending: Vec::new(),
        });
        match self.interrupt_and_restore(tid, regs.as_ref()) {
            Ok(Some(_)) => {
                self.disarm(tid);
                let thread = self.threads.iter().find(|t| t.tid == tid).cloned();
                self.threads.retain(|t| t.tid != tid);
                let tgid = self.tgid_of(tid);
                thread.map_or(Ok(()), |t| detach_thread(tgid, &t).map(drop))
            }
            Ok(None) => {
                self.threads.retain(|t| t.tid != tid);
                Err(InjectError::Timeout {
                    pid: self.pid,
                    what: "stopping a thread that never returned from a remote call",
                    after: GRACE,
                })
            }
            Err(e) => {
                self.threads.retain(|t| t.tid != tid);
                Err(e)
            }
        }
    }

    /// Interrupts a running thread and waits up to [`GRACE`] for it to stop; then
    /// records its registers, first setting them to `restore` if given. Returns the pc
    /// it stopped at (before any restore), `None` if it did not stop.
    ///
    /// With `restore` (an abandoned remote call), a fault the thread stopped on came
    /// from the called code, so it is swallowed rather than delivered.
    pub(crate) fn interrupt_and_restore(
        &mut self,
        tid: i32,
        restore: Option<&user_regs_struct>,
    ) -> Result<Option<u64>> {
        let deadline = Deadline::after(GRACE);
        sys::interrupt(tid).map_err(|e| self.ptrace_failed("PTRACE_INTERRUPT", tid, e))?;
        let kind = loop {
            let Some(event) = self.wait_event(tid, deadline)? else {
                return Ok(None);
            };
            match event {
                WaitEvent::EventStop { signal } => break stop_kind_for_event(signal),
                WaitEvent::SignalStop { signal } => {
                    let info = sys::getsiginfo(tid).ok();
                    let step = signal == libc::SIGTRAP && info.is_some_and(|i| is_step_trap(&i));
                    if step || (restore.is_some() && is_fault(signal, info.as_ref())) {
                        self.settle_trap(tid, Deadline::after(GRACE))?;
                        break StopKind::Trap;
                    }
                    self.thread_mut(tid)?
                        .pending
                        .push(PendingSignal { signal, info });
                    break StopKind::Signal { signal };
                }
                WaitEvent::Clone | WaitEvent::OtherEvent | WaitEvent::Syscall => {
                    if event == WaitEvent::Clone {
                        self.note_clone(tid)?;
                    }
                    // This stop consumed the interrupt: let the thread go on, ask again.
                    sys::cont(tid, 0).map_err(|e| self.ptrace_failed("PTRACE_CONT", tid, e))?;
                    sys::interrupt(tid)
                        .map_err(|e| self.ptrace_failed("PTRACE_INTERRUPT", tid, e))?;
                }
                WaitEvent::Exited | WaitEvent::Killed => return Err(self.thread_exited(tid)),
            }
        };
        let stopped_at = self.getregs(tid)?.rip;
        if let Some(regs) = restore {
            sys::setregs(tid, regs).map_err(|e| self.ptrace_failed("PTRACE_SETREGS", tid, e))?;
        }
        let regs = self.getregs(tid)?;
        let thread = self.thread_mut(tid)?;
        thread.regs = regs;
        thread.stop = kind;
        self.rewind_int3_trap(tid)?;
        Ok(Some(stopped_at))
    }

    // --- stopping -----------------------------------------------------------------

    fn knows(&self, tid: i32) -> bool {
        self.threads.iter().any(|t| t.tid == tid)
            || self.awaiting.contains(&tid)
            || self.dead.contains(&tid)
            || self.foreign.contains(&tid)
    }

    /// Seizes and interrupts one listed thread. Returns whether we now wait for it.
    fn seize(&mut self, tid: i32) -> Result<bool> {
        match sys::seize(tid, libc::PTRACE_O_TRACECLONE | libc::PTRACE_O_TRACESYSGOOD) {
            Ok(()) => {
                self.first_interrupt.get_or_insert_with(Instant::now);
                match sys::interrupt(tid) {
                    // ESRCH: it is exiting; waitpid will say so.
                    Ok(()) | Err(Errno::ESRCH) => {}
                    Err(e) => return Err(ptrace_error("PTRACE_INTERRUPT", tid, e)),
                }
                self.awaiting.push(tid);
                Ok(true)
            }
            Err(Errno::ESRCH) => {
                self.dead.push(tid);
                Ok(false)
            }
            Err(Errno::EPERM) => match process::status(tid) {
                // Created by a thread we hold, attached by the kernel; its clone
                // event has not been read yet.
                Ok(status) if status.tracer == self.tracer => {
                    self.awaiting.push(tid);
                    Ok(true)
                }
                // Exited, or an exited main thread whose process lives on.
                Ok(status) if matches!(status.state, 'Z' | 'X') => {
                    self.dead.push(tid);
                    Ok(false)
                }
                Err(_) => {
                    self.dead.push(tid);
                    Ok(false)
                }
                Ok(_) => Err(InjectError::PermissionDenied {
                    pid: self.pid,
                    reason: process::permission_reason(self.pid),
                }),
            },
            Err(e) => Err(ptrace_error("PTRACE_SEIZE", tid, e)),
        }
    }

    /// Waits until every thread in `awaiting` has stopped or exited.
    fn await_stops(&mut self, deadline: Deadline, what: &'static str) -> Result<()> {
        let mut backoff = Backoff::new();
        let mut idle_passes = 0u32;
        while !self.awaiting.is_empty() {
            let mut progressed = false;
            for tid in self.awaiting.clone() {
                let still_waiting = match sys::try_wait(tid) {
                    Ok(None) => true,
                    Ok(Some(event)) => {
                        progressed = true;
                        self.on_awaited_event(tid, event)?
                    }
                    // Not our tracee any more: it is gone.
                    Err(Errno::ECHILD) => {
                        progressed = true;
                        self.dead.push(tid);
                        false
                    }
                    Err(e) => return Err(ptrace_error("waitpid", tid, e)),
                };
                if !still_waiting {
                    self.awaiting.retain(|&t| t != tid);
                }
            }
            if self.awaiting.is_empty() {
                break;
            }
            // Checked even while events keep coming: a process spawning threads
            // without end must not keep us here.
            if deadline.passed() {
                return Err(InjectError::Timeout {
                    pid: self.pid,
                    what,
                    after: deadline.total,
                });
            }
            if progressed {
                continue;
            }
            idle_passes = (idle_passes + 1) % 16;
            // A main thread that exited while other threads live stays a zombie that
            // reports nothing until the whole process exits.
            if idle_passes == 0
                && self.awaiting.contains(&self.pid)
                && matches!(
                    process::thread_state(self.pid, self.pid),
                    Some('Z' | 'X') | None
                )
            {
                self.awaiting.retain(|&t| t != self.pid);
                self.dead.push(self.pid);
                self.dying.push(self.pid);
                continue;
            }
            backoff.snooze();
        }
        Ok(())
    }

    /// Handles an event of a thread we wait for; returns whether we still wait.
    fn on_awaited_event(&mut self, tid: i32, event: WaitEvent) -> Result<bool> {
        match event {
            WaitEvent::EventStop { signal } => self.adopt(tid, stop_kind_for_event(signal), None),
            WaitEvent::SignalStop { signal } => {
                let info = sys::getsiginfo(tid).ok();
                let pending = PendingSignal { signal, info };
                let waiting = self.adopt(tid, StopKind::Signal { signal }, Some(pending))?;
                if !waiting {
                    self.rewind_int3_trap(tid)?;
                }
                Ok(waiting)
            }
            WaitEvent::Clone | WaitEvent::OtherEvent | WaitEvent::Syscall => {
                if event == WaitEvent::Clone {
                    self.note_clone(tid)?;
                }
                // Registers taken inside clone would not survive a remote call (the
                // kernel writes the return value after we resume): let clone return,
                // and interrupt again, since this stop consumed the interrupt.
                match sys::cont(tid, 0).and_then(|()| sys::interrupt(tid)) {
                    Ok(()) | Err(Errno::ESRCH) => Ok(true),
                    Err(e) => Err(ptrace_error("PTRACE_CONT", tid, e)),
                }
            }
            WaitEvent::Exited | WaitEvent::Killed => {
                self.dead.push(tid);
                self.stats.threads_exited += 1;
                if tid == self.pid {
                    // The main thread reports its exit only once all others are gone.
                    self.leader_reaped = true;
                    return Err(InjectError::TargetExited { pid: self.pid });
                }
                Ok(false)
            }
        }
    }

    /// A waited-for thread stopped: record it (or let it go if it is not ours).
    fn adopt(&mut self, tid: i32, stop: StopKind, pending: Option<PendingSignal>) -> Result<bool> {
        if self.foreign.contains(&tid) {
            let signal = pending.map_or(0, |p| p.signal);
            self.foreign.retain(|&t| t != tid);
            return match sys::detach(tid, signal) {
                Ok(()) | Err(Errno::ESRCH) => Ok(false),
                Err(e) => Err(ptrace_error("PTRACE_DETACH", tid, e)),
            };
        }
        match sys::getregs(tid) {
            Ok(regs) => {
                self.threads.push(StoppedThread {
                    tid,
                    regs,
                    stop,
                    pending: pending.into_iter().collect(),
                });
                let pid = self.pid;
                self.threads.sort_by_key(|t| (t.tid != pid, t.tid));
                Ok(false)
            }
            // Killed while stopping: its exit follows.
            Err(Errno::ESRCH) => Ok(true),
            Err(e) => Err(ptrace_error("PTRACE_GETREGS", tid, e)),
        }
    }

    /// `parent` stopped in clone: wait for the new thread too.
    pub(crate) fn note_clone(&mut self, parent: i32) -> Result<()> {
        let child = match sys::geteventmsg(parent) {
            Ok(child) => child as i32,
            Err(Errno::ESRCH) => return Ok(()),
            Err(e) => return Err(ptrace_error("PTRACE_GETEVENTMSG", parent, e)),
        };
        self.stats.clones_caught += 1;
        if self.knows(child) {
            return Ok(());
        }
        match process::status(child) {
            Ok(s) if !self.holds_process(s.tgid) && !self.adopt_sharer(s.tgid) => {
                self.foreign.push(child)
            }
            Ok(s) => self.note_sharer_task(child, s.tgid),
            Err(_) => {}
        }
        self.awaiting.push(child);
        Ok(())
    }

    /// Collects the exits of stopped threads killed meanwhile (a SIGKILL wakes even
    /// a stopped thread). Loops because the main thread's exit is reported only once
    /// every other thread has been reaped.
    pub(crate) fn reap_dead_threads(&mut self) -> Result<()> {
        loop {
            let mut reaped = false;
            for tid in self.threads.iter().map(|t| t.tid).collect::<Vec<_>>() {
                if let Ok(Some(WaitEvent::Exited | WaitEvent::Killed)) | Err(Errno::ECHILD) =
                    sys::try_wait(tid)
                {
                    reaped = true;
                    self.threads.retain(|t| t.tid != tid);
                    self.dead.push(tid);
                    self.stats.threads_exited += 1;
                    if tid == self.pid {
                        self.leader_reaped = true;
                        return Err(InjectError::TargetExited { pid: self.pid });
                    }
                }
            }
            if !reaped {
                return Ok(());
            }
        }
    }

    /// Collects the exits of `dying` threads, until none is left, or only a main
    /// thread that waits for live threads to exit first, or `deadline`.
    fn collect_dying(&mut self, deadline: Deadline) {
        let mut backoff = Backoff::new();
        while !self.dying.is_empty() {
            self.reap_dying_once();
            let leader_waits_for_others = self.dying == [self.pid]
                && process::threads(self.pid).is_ok_and(|tids| {
                    tids.iter().any(|&t| {
                        t != self.pid
                            && !matches!(process::thread_state(self.pid, t), Some('Z' | 'X') | None)
                    })
                });
            if leader_waits_for_others || deadline.passed() {
                return;
            }
            backoff.snooze();
        }
    }

    /// One non-blocking pass over `dying`.
    fn reap_dying_once(&mut self) {
        for tid in self.dying.clone() {
            match sys::try_wait(tid) {
                Ok(Some(WaitEvent::Exited | WaitEvent::Killed)) | Err(_) => {
                    self.leader_reaped |= tid == self.pid;
                    self.dying.retain(|&t| t != tid);
                    if !self.dead.contains(&tid) {
                        self.dead.push(tid);
                    }
                }
                Ok(_) => {}
            }
        }
    }

    /// After new threads appeared during a call or a step: wait (briefly) for their
    /// first stop so they are held like the others.
    pub(crate) fn collect_new_threads(&mut self) -> Result<()> {
        if self.awaiting.is_empty() {
            return Ok(());
        }
        match self.await_stops(Deadline::after(GRACE), "waiting for new threads to stop") {
            // Still awaited: resume() tries again.
            Err(InjectError::Timeout { .. }) => Ok(()),
            other => other,
        }
    }

    // --- helpers ------------------------------------------------------------------

    /// Waits for an event of a thread we resumed; `None` at the deadline.
    pub(crate) fn wait_event(&mut self, tid: i32, deadline: Deadline) -> Result<Option<WaitEvent>> {
        match sys::wait_until(tid, deadline.at) {
            Ok(event) => Ok(event),
            Err(Errno::ECHILD) => Err(self.thread_exited(tid)),
            Err(e) => Err(ptrace_error("waitpid", tid, e)),
        }
    }

    pub(crate) fn getregs(&mut self, tid: i32) -> Result<user_regs_struct> {
        sys::getregs(tid).map_err(|e| self.ptrace_failed("PTRACE_GETREGS", tid, e))
    }

    /// A ptrace request on a held thread failed; ESRCH means it died.
    pub(crate) fn ptrace_failed(
        &mut self,
        request: &'static str,
        tid: i32,
        errno: Errno,
    ) -> InjectError {
        if errno == Errno::ESRCH {
            self.thread_exited(tid)
        } else {
            ptrace_error(request, tid, errno)
        }
    }

    /// `tid` exited (or vanished) while we operated on it. Says whether the whole
    /// process went with it: an exit_group kills the other threads at once, so give
    /// them a moment to be reaped.
    pub(crate) fn thread_exited(&mut self, tid: i32) -> InjectError {
        self.threads.retain(|t| t.tid != tid);
        self.dead.push(tid);
        // Already reaped if we saw its exit; else it is on its way out.
        self.dying.push(tid);
        self.reap_dying_once();
        if tid == self.pid {
            return InjectError::TargetExited { pid: self.pid };
        }
        let deadline = Instant::now() + Duration::from_millis(100);
        loop {
            self.reap_dying_once();
            if self.reap_dead_threads().is_err() || self.threads.is_empty() {
                return InjectError::TargetExited { pid: self.pid };
            }
            if Instant::now() >= deadline {
                return InjectError::ThreadExited { pid: self.pid, tid };
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// The process vanished (or only its zombie is left) after `preflight` saw it
    /// alive: it exited while we were stopping it.
    fn gone_error(&self) -> InjectError {
        InjectError::TargetExited { pid: self.pid }
    }

    fn mem_error(&self, op: MemOp, addr: u64, len: usize, source: io::Error) -> InjectError {
        InjectError::Memory {
            pid: self.pid,
            op,
            addr,
            len,
            source,
        }
    }
}

impl Drop for StoppedProcess {
    fn drop(&mut self) {
        if !self.detached {
            let _ = self.detach_all();
        }
    }
}

/// Checks what can be checked before touching the process.
fn preflight(pid: i32) -> Result<()> {
    if pid <= 0 {
        return Err(InjectError::NoSuchProcess { pid });
    }
    if pid == std::process::id() as i32 {
        return Err(InjectError::PermissionDenied {
            pid,
            reason: "weft cannot stop its own process".to_string(),
        });
    }
    let status = process::status(pid)?;
    if status.tgid != pid {
        return Err(InjectError::NotAProcess {
            pid,
            tgid: status.tgid,
        });
    }
    if matches!(status.state, 'Z' | 'X') && process::threads(pid).is_ok_and(|t| t.len() <= 1) {
        return Err(InjectError::Zombie { pid });
    }
    Ok(())
}

/// Opens the memory of `pid` through one of its (held, live) threads.
fn open_mem(pid: i32, tid: i32) -> Result<File> {
    let path = format!("/proc/{pid}/task/{tid}/mem");
    File::options()
        .read(true)
        .write(true)
        .open(&path)
        .map_err(|source| match source.raw_os_error() {
            Some(libc::ENOENT | libc::ESRCH) => InjectError::TargetExited { pid },
            Some(libc::EACCES | libc::EPERM) => InjectError::PermissionDenied {
                pid,
                reason: process::permission_reason(pid),
            },
            _ => InjectError::Proc {
                path: path.into(),
                source,
            },
        })
}

/// Lets one thread go, delivering again what it was kept from receiving. Returns
/// false if the thread was no longer in a ptrace-stop (it is being killed).
fn detach_thread(pid: i32, thread: &StoppedThread) -> Result<bool> {
    let tid = thread.tid;
    let mut pending = thread.pending.iter();
    let first = pending.next();
    // Only one signal rides on the detach; the others are queued again (losing their
    // original siginfo: the sender becomes weft).
    for extra in pending {
        let _ = sys::tgkill(pid, tid, extra.signal);
    }
    let signal = match (thread.stop, first) {
        // In a signal-delivery-stop the detach delivers the signal; restoring its
        // siginfo first keeps the sender, address and code the target would have seen.
        (StopKind::Signal { .. }, Some(first)) => {
            if let Some(info) = &first.info {
                let _ = sys::setsiginfo(tid, info);
            }
            first.signal
        }
        // Held in an interrupt stop by weft's own step or call: queue the signal,
        // let the thread take it into a signal-delivery-stop, and deliver it there
        // with its original siginfo.
        (StopKind::Trap, Some(first)) => {
            let _ = sys::tgkill(pid, tid, first.signal);
            redeliver(tid, &thread.pending)
        }
        (_, Some(first)) => {
            let _ = sys::tgkill(pid, tid, first.signal);
            0
        }
        (_, None) => 0,
    };
    match sys::detach(tid, signal) {
        Ok(()) => Ok(true),
        Err(Errno::ESRCH) => Ok(false),
        Err(e) => Err(ptrace_error("PTRACE_DETACH", tid, e)),
    }
}

/// After `tgkill`s to a thread held in an interrupt stop: resume it until it stops
/// to take one of them, restore that signal's siginfo, and return the signal for
/// the detach to deliver (0 if it did not stop in time: the queued signals are
/// then delivered by the kernel, with weft as their sender).
fn redeliver(tid: i32, pending: &[PendingSignal]) -> i32 {
    // A blocked signal would not stop the thread: leave it queued.
    let blocked = sys::getsigmask(tid).unwrap_or(u64::MAX);
    if pending
        .iter()
        .any(|p| p.signal <= 64 && blocked & (1u64 << (p.signal - 1)) != 0)
    {
        return 0;
    }
    if sys::cont(tid, 0).is_err() {
        return 0;
    }
    let deadline = Instant::now() + GRACE;
    loop {
        match sys::wait_until(tid, deadline) {
            Ok(Some(WaitEvent::SignalStop { signal })) => {
                if let Some(info) = pending
                    .iter()
                    .find(|p| p.signal == signal)
                    .and_then(|p| p.info.as_ref())
                {
                    let _ = sys::setsiginfo(tid, info);
                }
                return signal;
            }
            // A stale interrupt: go on.
            Ok(Some(WaitEvent::EventStop { .. } | WaitEvent::OtherEvent | WaitEvent::Clone)) => {
                if sys::cont(tid, 0).is_err() {
                    return 0;
                }
            }
            Ok(None) => {
                // Running, and not stopping for the signal: stop it again so it can
                // be detached (the signal stays queued).
                let _ = sys::interrupt(tid);
                let _ = sys::wait_until(tid, Instant::now() + GRACE);
                return 0;
            }
            _ => return 0,
        }
    }
}

fn stop_kind_for_event(signal: i32) -> StopKind {
    match signal {
        libc::SIGSTOP | libc::SIGTSTP | libc::SIGTTIN | libc::SIGTTOU => {
            StopKind::GroupStop { signal }
        }
        _ => StopKind::Interrupted,
    }
}

/// The SIGTRAP of a completed single step (TRAP_TRACE; TRAP_BRKPT after stepping
/// over a `syscall`), as opposed to an `int3` (SI_KERNEL) or a sent SIGTRAP.
pub(crate) fn is_step_trap(info: &siginfo_t) -> bool {
    const TRAP_BRKPT: i32 = 1;
    const TRAP_TRACE: i32 = 2;
    const TRAP_HWBKPT: i32 = 4;
    matches!(info.si_code, TRAP_BRKPT | TRAP_TRACE | TRAP_HWBKPT)
}

/// A fault raised by the instruction the thread executes (as opposed to a signal
/// sent to it): the kernel sets a positive si_code for those.
pub(crate) fn is_fault(signal: i32, info: Option<&siginfo_t>) -> bool {
    matches!(
        signal,
        libc::SIGSEGV | libc::SIGBUS | libc::SIGILL | libc::SIGFPE | libc::SIGTRAP | libc::SIGSYS
    ) && info.is_some_and(|i| i.si_code > 0)
}

fn zeroed_regs() -> user_regs_struct {
    // SAFETY: user_regs_struct is plain integers; all zeroes is a valid value.
    unsafe { std::mem::zeroed() }
}

fn eio() -> io::Error {
    io::Error::from_raw_os_error(libc::EIO)
}
