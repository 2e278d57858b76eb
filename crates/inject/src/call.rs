//! Calling a function inside the target, on one of its stopped threads.
//!
//! The thread's registers (general, and the whole x87/SSE/AVX state) are saved, then
//! set up as if it had executed `call func` with a return address in a *landing
//! pad*: a small stub weft writes into the zero padding after the code of one of the
//! target's libraries (ld.so's, usually: bytes past the end of its executable segment,
//! which nothing runs), with its data on the thread's stack:
//!
//! ```text
//!   original rsp ──▶ ┌──────────────────────┐
//!                    │ red zone (128 bytes) │  untouched: the interrupted code may use it
//!                    ├──────────────────────┤
//!                    │ pad data (64-aligned)│  result, flags, original registers and
//!                    │                      │  vector state, for the pad
//!                    ├──────────────────────┤
//!                    │ stack_data           │  ◀── CallArg::StackData (16-aligned)
//!                    ├──────────────────────┤  ◀── 16-aligned (rsp at the call)
//!   rsp at entry ──▶ │ landing pad address  │
//!                    └──────────────────────┘
//! ```
//!
//! The function returns into the pad, which stores `rax` and raises a flag in its
//! data, then waits (a `futex` wait of 100 ms, ten times). weft sees the flag,
//! interrupts the thread and puts every original register back, `orig_rax` and `rax`
//! included, so a system call the stop interrupted is restarted on resume; during the
//! call `orig_rax` is -1 so the kernel does not "restart" a system call into it.
//!
//! If weft dies during the call (killed at any point), the kernel lets the thread go
//! and it carries on with the function; when it returns, the pad restores the
//! original state itself after its wait: `xrstor` (or `fxrstor`) of the saved vector
//! state, the flags, every general register, and a `ret imm16` that pops the original
//! `rip` and leaves `rsp` as it was (moved back onto the `syscall` instruction, with
//! the system call number in `rax`, when the interrupted call was to be restarted).
//! The target never sees the call. The padding is given back its bytes when the
//! process is resumed (unless a call was abandoned with its thread still running).
//!
//! If the thread blocks SIGSEGV, SIGSEGV is unblocked for the call (and the mask put
//! back after): the kernel resets the handler of a fault signal that is blocked when
//! it is raised, which would silently remove the target's own SIGSEGV handler.

use std::ops::Range;
use std::time::{Duration, Instant};

use libc::user_regs_struct;

use crate::error::{AbandonedCall, InjectError, Result};
use crate::process;
use crate::stop::{
    is_fault, Deadline, PendingSignal, StopKind, StoppedProcess, StoppedThread, GRACE,
};
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
    /// The function returned `ret`. `self_restored`: the pad had already put the
    /// original registers back itself (weft was slower than its wait).
    Returned {
        ret: u64,
        self_restored: bool,
    },
    Faulted {
        signal: i32,
        pc: u64,
        addr: u64,
    },
    TimedOut,
}

/// The x87/SSE/AVX state of a thread, saved around a remote call.
#[derive(Debug, Clone)]
pub(crate) enum FpState {
    /// Standard-format `xsave` image (`NT_X86_XSTATE`).
    Xsave(Vec<u8>),
    /// `fxsave` image (`NT_PRFPREG`), when the kernel offers no xstate.
    Fx(Vec<u8>),
    None,
}

impl FpState {
    fn save(tid: i32) -> FpState {
        let mut buf = vec![0u8; 64 * 1024];
        if let Ok(n) = sys::getregset(tid, sys::NT_X86_XSTATE, &mut buf) {
            buf.truncate(n);
            return FpState::Xsave(buf);
        }
        buf.truncate(512);
        match sys::getregset(tid, sys::NT_PRFPREG, &mut buf) {
            Ok(512) => FpState::Fx(buf),
            _ => FpState::None,
        }
    }

    fn restore(&self, tid: i32) -> std::result::Result<(), nix::errno::Errno> {
        match self {
            FpState::Xsave(b) => sys::setregset(tid, sys::NT_X86_XSTATE, b),
            FpState::Fx(b) => sys::setregset(tid, sys::NT_PRFPREG, b),
            FpState::None => Ok(()),
        }
    }

    fn image(&self) -> &[u8] {
        match self {
            FpState::Xsave(b) | FpState::Fx(b) => b,
            FpState::None => &[],
        }
    }

    /// What the pad restores with: 1 `xrstor`, 2 `fxrstor`, 0 nothing.
    fn kind(&self) -> u32 {
        match self {
            FpState::Xsave(_) => 1,
            FpState::Fx(_) => 2,
            FpState::None => 0,
        }
    }
}

/// Where the landing pad's code was written, and what was there before.
#[derive(Debug, Clone)]
pub(crate) struct Pad {
    pub addr: u64,
    /// The padding's bytes, put back on resume.
    pub saved: Vec<u8>,
}

// The pad's data, at offsets from its (64-aligned) start on the thread's stack.
const PAD_RESULT: u64 = 0x00;
const PAD_DONE: u64 = 0x08;
const PAD_FUTEX: u64 = 0x0c;
const PAD_TIMEOUT: u64 = 0x10;
const PAD_RESTORED: u64 = 0x20;
const PAD_FPKIND: u64 = 0x24;
/// rax rbx rcx rdx rsi rdi rbp r8-r15 rsp rflags rip, 8 bytes each.
const PAD_REGS: u64 = 0x40;
const PAD_REG_RIP: u64 = PAD_REGS + 17 * 8;
/// The saved vector state (`xsave` needs 64-byte alignment).
const PAD_FP: u64 = 0x100;
/// The pad's code is this long (and 16 bytes more of padding are needed to place it).
const PAD_CODE_LEN: usize = 0x104;

/// The landing pad's code, for data `k` bytes above `rsp` at landing, ending with a
/// `ret pop` that returns to the saved `rip` with the original `rsp`:
///
/// ```text
/// landing: mov [DATA.result], rax ; mov dword [DATA.done], 1 ; mov ecx, 10
/// wait:    push rcx ; futex(&DATA.futex, FUTEX_WAIT_PRIVATE, 0, &DATA.timeout)
///          pop rcx ; dec ecx ; jnz wait
///          xrstor64 [DATA.fp] (fpkind 1, eax = edx = -1) or fxrstor64 (fpkind 2)
///          push [DATA.rflags] ; popfq ; mov every register from DATA.regs
///          mov dword [DATA.restored], 1 ; lea rsp, [DATA.rip] ; ret pop
/// ```
///
/// Every operand is `[rsp + disp32]` (`DATA.x` is `rsp + k + x`, 8 more while `rcx`
/// is pushed). The bytes are checked against GNU as in this module's tests.
fn pad_code(k: u32, pop: u16) -> Vec<u8> {
    let d = |off: u64| (u64::from(k) + off) as u32;
    let mut c = Vec::with_capacity(PAD_CODE_LEN);
    c.extend_from_slice(&[0x48, 0x89, 0x84, 0x24]); // mov [rsp+d], rax
    c.extend_from_slice(&d(PAD_RESULT).to_le_bytes());
    c.extend_from_slice(&[0xc7, 0x84, 0x24]); // mov dword [rsp+d], 1
    c.extend_from_slice(&d(PAD_DONE).to_le_bytes());
    c.extend_from_slice(&1u32.to_le_bytes());
    c.extend_from_slice(&[0xb9, 0x0a, 0x00, 0x00, 0x00]); // mov ecx, 10
    c.push(0x51); // wait: push rcx
    c.extend_from_slice(&[0xb8, 0xca, 0x00, 0x00, 0x00]); // mov eax, 202 (futex)
    c.extend_from_slice(&[0x48, 0x8d, 0xbc, 0x24]); // lea rdi, [rsp+d]
    c.extend_from_slice(&d(8 + PAD_FUTEX).to_le_bytes());
    c.extend_from_slice(&[0xbe, 0x80, 0x00, 0x00, 0x00]); // mov esi, FUTEX_WAIT_PRIVATE
    c.extend_from_slice(&[0x31, 0xd2]); // xor edx, edx
    c.extend_from_slice(&[0x4c, 0x8d, 0x94, 0x24]); // lea r10, [rsp+d]
    c.extend_from_slice(&d(8 + PAD_TIMEOUT).to_le_bytes());
    c.extend_from_slice(&[0x0f, 0x05]); // syscall
    c.push(0x59); // pop rcx
    c.extend_from_slice(&[0xff, 0xc9]); // dec ecx
    c.extend_from_slice(&[0x75, 0xdc]); // jnz wait
    c.extend_from_slice(&[0x83, 0xbc, 0x24]); // cmp dword [rsp+d], 1
    c.extend_from_slice(&d(PAD_FPKIND).to_le_bytes());
    c.push(0x01);
    c.extend_from_slice(&[0x75, 0x15]); // jne fx
    c.extend_from_slice(&[0xb8, 0xff, 0xff, 0xff, 0xff]); // mov eax, -1
    c.extend_from_slice(&[0xba, 0xff, 0xff, 0xff, 0xff]); // mov edx, -1
    c.extend_from_slice(&[0x48, 0x0f, 0xae, 0xac, 0x24]); // xrstor64 [rsp+d]
    c.extend_from_slice(&d(PAD_FP).to_le_bytes());
    c.extend_from_slice(&[0xeb, 0x13]); // jmp regs
    c.extend_from_slice(&[0x83, 0xbc, 0x24]); // fx: cmp dword [rsp+d], 2
    c.extend_from_slice(&d(PAD_FPKIND).to_le_bytes());
    c.push(0x02);
    c.extend_from_slice(&[0x75, 0x09]); // jne regs
    c.extend_from_slice(&[0x48, 0x0f, 0xae, 0x8c, 0x24]); // fxrstor64 [rsp+d]
    c.extend_from_slice(&d(PAD_FP).to_le_bytes());
    c.extend_from_slice(&[0xff, 0xb4, 0x24]); // regs: push qword [rsp+d]
    c.extend_from_slice(&d(PAD_REGS + 16 * 8).to_le_bytes());
    c.push(0x9d); // popfq
                  // mov REG, [rsp+d] for rax rbx rcx rdx rsi rdi rbp r8-r15 (REX.W, REX.R for r8+).
    const REGS: [(u8, u8); 15] = [
        (0x48, 0),
        (0x48, 3),
        (0x48, 1),
        (0x48, 2),
        (0x48, 6),
        (0x48, 7),
        (0x48, 5),
        (0x4c, 0),
        (0x4c, 1),
        (0x4c, 2),
        (0x4c, 3),
        (0x4c, 4),
        (0x4c, 5),
        (0x4c, 6),
        (0x4c, 7),
    ];
    for (i, (rex, reg)) in REGS.iter().enumerate() {
        c.extend_from_slice(&[*rex, 0x8b, 0x84 | (reg << 3), 0x24]);
        c.extend_from_slice(&d(PAD_REGS + i as u64 * 8).to_le_bytes());
    }
    c.extend_from_slice(&[0xc7, 0x84, 0x24]); // mov dword [rsp+d], 1
    c.extend_from_slice(&d(PAD_RESTORED).to_le_bytes());
    c.extend_from_slice(&1u32.to_le_bytes());
    c.extend_from_slice(&[0x48, 0x8d, 0xa4, 0x24]); // lea rsp, [rsp+d]
    c.extend_from_slice(&d(PAD_REG_RIP).to_le_bytes());
    c.push(0xc2); // ret pop
    c.extend_from_slice(&pop.to_le_bytes());
    debug_assert_eq!(c.len(), PAD_CODE_LEN);
    c
}

/// Room for the pad's code (16-aligned).
const PAD_SLOT: u64 = 0x110;

/// The pad's data for one call: where it goes on the stack, and its bytes.
struct PadData {
    /// Its address (64-aligned, below the red zone).
    at: u64,
    bytes: Vec<u8>,
}

/// Where a call lands: the pad's code, and its data on the stack.
#[derive(Debug, Clone, Copy)]
struct Landing {
    code: u64,
    data: u64,
}

/// The pad's data for a call by a thread stopped with `original` registers and
/// `fp` vector state: flags cleared, the futex timeout, what the pad restores.
fn pad_data(original: &user_regs_struct, fp: &FpState) -> PadData {
    let image = fp.image();
    let len = PAD_FP as usize + image.len().div_ceil(64) * 64;
    let at = (original.rsp.wrapping_sub(RED_ZONE) - len as u64) & !63;
    let mut bytes = vec![0u8; len];
    let put = |b: &mut Vec<u8>, off: u64, v: &[u8]| {
        b[off as usize..off as usize + v.len()].copy_from_slice(v);
    };
    put(&mut bytes, PAD_TIMEOUT + 8, &100_000_000u64.to_le_bytes());
    put(&mut bytes, PAD_FPKIND, &fp.kind().to_le_bytes());
    for (i, v) in pad_regs(original).iter().enumerate() {
        put(&mut bytes, PAD_REGS + i as u64 * 8, &v.to_le_bytes());
    }
    put(&mut bytes, PAD_FP, image);
    debug_assert!(PAD_DONE < PAD_FUTEX && PAD_RESTORED < PAD_REGS && PAD_RESULT == 0);
    PadData { at, bytes }
}

/// The registers, in `PAD_REGS` order, that resume the thread where the stop found
/// it, done by the pad without ptrace: a system call to be restarted is entered
/// again (`rip` back on the `syscall`, its number in `rax`).
fn pad_regs(r: &user_regs_struct) -> [u64; 18] {
    let (mut rip, mut rax) = (r.rip, r.rax);
    if (r.orig_rax as i64) >= 0 {
        match -(r.rax as i64) {
            512..=514 => {
                rip = rip.wrapping_sub(2);
                rax = r.orig_rax;
            }
            // ERESTART_RESTARTBLOCK
            516 => {
                rip = rip.wrapping_sub(2);
                rax = libc::SYS_restart_syscall as u64;
            }
            _ => {}
        }
    }
    [
        rax,
        r.rbx,
        r.rcx,
        r.rdx,
        r.rsi,
        r.rdi,
        r.rbp,
        r.r8,
        r.r9,
        r.r10,
        r.r11,
        r.r12,
        r.r13,
        r.r14,
        r.r15,
        r.rsp,
        r.eflags & !EFLAGS_TF,
        rip,
    ]
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
    /// Afterwards the thread has exactly its original registers, vector registers
    /// included. Signals that arrive during the call are held and delivered on
    /// resume. If the function faults, the fault is swallowed and
    /// [`InjectError::CallFaulted`] returned. If weft dies during the call, the thread
    /// finishes the function and restores its own registers (see the module docs).
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
        let fp = FpState::save(tid);
        let pad = self.landing_pad(tid)?;

        // The pad's data just below the red zone, then the stack data, then the
        // return address (see the module docs).
        let data = pad_data(&original, &fp);
        let mut sp = data.at;
        if !stack_data.is_empty() {
            sp = sp.wrapping_sub(stack_data.len() as u64) & !15;
            self.write_mem(sp, stack_data)?;
        }
        let stack_data_addr = sp;
        let landing_rsp = sp & !15;
        let pop = original.rsp - (data.at + PAD_REG_RIP + 8);
        let pop = u16::try_from(pop).map_err(|_| InjectError::StackDataTooLarge {
            len: fp.image().len(),
            max: 60 * 1024,
        })?;
        self.write_mem(pad.addr, &pad_code((data.at - landing_rsp) as u32, pop))?;
        self.write_mem(data.at, &data.bytes)?;
        sp = landing_rsp - 8;
        self.write_mem(sp, &pad.addr.to_le_bytes())?;

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
        let landing = Landing {
            code: pad.addr,
            data: data.at,
        };
        let result = self.run_call(tid, func, &regs, &original, &fp, landing, timeout);
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
    #[allow(clippy::too_many_arguments)]
    fn run_call(
        &mut self,
        tid: i32,
        func: u64,
        regs: &user_regs_struct,
        original: &user_regs_struct,
        fp: &FpState,
        pad: Landing,
        timeout: Duration,
    ) -> Result<(u64, Duration)> {
        sys::setregs(tid, regs).map_err(|e| self.ptrace_failed("PTRACE_SETREGS", tid, e))?;
        let started = Instant::now();
        if let Err(e) = sys::cont(tid, 0) {
            let _ = sys::setregs(tid, original);
            return Err(self.ptrace_failed("PTRACE_CONT", tid, e));
        }

        let deadline = Deadline::after(timeout);
        match self.wait_for_return(tid, pad, deadline)? {
            CallEnd::Returned { ret, self_restored } => {
                let duration = started.elapsed();
                if self_restored {
                    let now = self.getregs(tid)?;
                    let thread = self.thread_mut(tid)?;
                    thread.regs = now;
                    thread.stop = StopKind::Interrupted;
                } else {
                    self.restore_after_call(tid, original, fp)?;
                }
                self.collect_new_threads()?;
                Ok((ret, duration))
            }
            CallEnd::Faulted { signal, pc, addr } => {
                self.settle_trap(tid, Deadline::after(GRACE))?;
                self.restore_after_call(tid, original, fp)?;
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
                    let _ = fp.restore(tid);
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

    /// Runs the thread until the call returns into the pad, faults, or the deadline
    /// passes.
    fn wait_for_return(&mut self, tid: i32, pad: Landing, deadline: Deadline) -> Result<CallEnd> {
        let mut backoff = Backoff::new();
        let mut idle_polls = 0u32;
        loop {
            let event = match sys::try_wait(tid) {
                Ok(Some(event)) => event,
                Ok(None) => {
                    if self.read_u32(pad.data + PAD_DONE)? != 0 {
                        return self.stop_landed(tid, pad);
                    }
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

    /// The call returned into the pad: stop the thread there and read the result.
    fn stop_landed(&mut self, tid: i32, pad: Landing) -> Result<CallEnd> {
        let deadline = Deadline::after(GRACE);
        sys::interrupt(tid).map_err(|e| self.ptrace_failed("PTRACE_INTERRUPT", tid, e))?;
        loop {
            let Some(event) = self.wait_event(tid, deadline)? else {
                return Err(InjectError::Timeout {
                    pid: self.pid,
                    what: "stopping a thread back from a remote call",
                    after: GRACE,
                });
            };
            match event {
                WaitEvent::EventStop { .. } => break,
                WaitEvent::SignalStop { signal } => {
                    let info = sys::getsiginfo(tid).ok();
                    self.thread_mut(tid)?
                        .pending
                        .push(PendingSignal { signal, info });
                    break;
                }
                WaitEvent::Clone | WaitEvent::OtherEvent => {
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
        let mut result = [0u8; 8];
        self.read_mem(pad.data + PAD_RESULT, &mut result)?;
        let pc = self.getregs(tid)?.rip;
        let in_pad = (pad.code..pad.code + PAD_CODE_LEN as u64).contains(&pc);
        Ok(CallEnd::Returned {
            ret: u64::from_le_bytes(result),
            self_restored: !in_pad,
        })
    }

    fn read_u32(&self, addr: u64) -> Result<u32> {
        let mut b = [0u8; 4];
        self.read_mem(addr, &mut b)?;
        Ok(u32::from_le_bytes(b))
    }

    fn restore_after_call(
        &mut self,
        tid: i32,
        original: &user_regs_struct,
        fp: &FpState,
    ) -> Result<()> {
        sys::setregs(tid, original).map_err(|e| self.ptrace_failed("PTRACE_SETREGS", tid, e))?;
        fp.restore(tid)
            .map_err(|e| self.ptrace_failed("PTRACE_SETREGSET", tid, e))?;
        let thread = self.thread_mut(tid)?;
        thread.regs = *original;
        thread.stop = StopKind::Trap;
        Ok(())
    }

    /// Where this stop's landing pad goes: found on first use, in the zero padding
    /// after the executable segment of one of the target's libraries.
    fn landing_pad(&mut self, tid: i32) -> Result<Pad> {
        if let Some(pad) = &self.pad {
            return Ok(pad.clone());
        }
        // The thread's view: a main thread that exited leaves /proc/PID/maps empty.
        let path = format!("/proc/{}/task/{tid}/maps", self.tgid_of(tid));
        let maps = std::fs::read_to_string(&path).map_err(|source| InjectError::Proc {
            path: path.clone().into(),
            source,
        })?;
        let mut files: Vec<&str> = Vec::new();
        for l in maps.lines() {
            let f: Vec<&str> = l.split_whitespace().collect();
            if f.len() >= 6 && f[1].contains('x') && f[5].starts_with('/') && !files.contains(&f[5])
            {
                files.push(f[5]);
            }
        }
        let rank = |p: &str| {
            let name = p.rsplit('/').next().unwrap_or(p);
            if name.starts_with("ld-linux") || name.starts_with("ld64") {
                0
            } else if name.starts_with("libc.so") || name.starts_with("libc-") {
                1
            } else {
                2
            }
        };
        files.sort_by_key(|p| rank(p));
        for file in files {
            if let Some(addr) = self.padding_in(&maps, file) {
                let pad = Pad {
                    addr,
                    saved: vec![0; PAD_SLOT as usize],
                };
                self.pad = Some(pad.clone());
                return Ok(pad);
            }
        }
        Err(InjectError::NoLandingPad { pid: self.pid })
    }

    /// A free slot of [`PAD_SLOT`] zero bytes between the end of an executable
    /// segment of `file` (as its program headers, read from memory, say) and the end
    /// of that segment's last page. Slots still holding a pad (left by a weft that
    /// died during a call) are skipped.
    fn padding_in(&self, maps: &str, file: &str) -> Option<u64> {
        let mappings: Vec<(Range<u64>, u64, bool)> = maps
            .lines()
            .filter_map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                if f.len() < 6 || f[5] != file {
                    return None;
                }
                let (a, b) = f[0].split_once('-')?;
                let range = u64::from_str_radix(a, 16).ok()?..u64::from_str_radix(b, 16).ok()?;
                Some((
                    range,
                    u64::from_str_radix(f[2], 16).ok()?,
                    f[1].contains('x'),
                ))
            })
            .collect();
        let base = mappings.iter().find(|m| m.1 == 0)?.0.start;
        let mut ehdr = [0u8; 64];
        self.read_mem(base, &mut ehdr).ok()?;
        if ehdr[..4] != *b"\x7fELF" || ehdr[4] != 2 {
            return None;
        }
        let u16_at = |b: &[u8], o: usize| u16::from_le_bytes([b[o], b[o + 1]]);
        let u64_at = |b: &[u8], o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap());
        let (phoff, phentsize, phnum) = (
            u64_at(&ehdr, 0x20),
            u16_at(&ehdr, 0x36),
            u16_at(&ehdr, 0x38),
        );
        if phentsize != 56 || phnum == 0 || phnum > 64 {
            return None;
        }
        let mut ph = vec![0u8; 56 * phnum as usize];
        self.read_mem(base + phoff, &mut ph).ok()?;
        let loads: Vec<&[u8]> = ph
            .chunks(56)
            .filter(|p| u32::from_le_bytes(p[0..4].try_into().unwrap()) == 1)
            .collect();
        let first_vaddr = loads.iter().map(|p| u64_at(p, 0x10)).min()? & !4095;
        let bias = if u16_at(&ehdr, 0x10) == 3 {
            base - first_vaddr
        } else {
            0
        };
        for p in loads {
            let flags = u32::from_le_bytes(p[4..8].try_into().unwrap());
            if flags & 1 == 0 {
                continue;
            }
            let end = bias + u64_at(p, 0x10) + u64_at(p, 0x20);
            let page_end = (end + 4095) & !4095;
            // The slot must lie in one executable mapping of the file.
            if !mappings
                .iter()
                .any(|(r, _, x)| *x && r.contains(&end) && r.end >= page_end)
            {
                continue;
            }
            let mut slot = page_end - PAD_SLOT;
            while slot >= end {
                let mut bytes = vec![0u8; PAD_SLOT as usize];
                if self.read_mem(slot, &mut bytes).is_ok() && bytes.iter().all(|&b| b == 0) {
                    return Some(slot);
                }
                slot -= PAD_SLOT;
            }
        }
        None
    }

    /// Gives the padding its bytes back before the process is let go (unless a
    /// thread may still come back to the pad).
    pub(crate) fn release_pad(&mut self) {
        let Some(pad) = self.pad.take() else { return };
        if self.lost.is_empty() {
            let _ = self.write_mem(pad.addr, &pad.saved);
        }
    }

    /// The thread best suited to run a remote call: one blocked in a system call
    /// other than `futex` (it holds no lock a `malloc` or `dlopen` could need, most
    /// likely), else the main thread, else the first. Never a thread of another
    /// process sharing the memory ([`sharers`](Self::sharers)).
    pub fn pick_call_thread(&self) -> i32 {
        let blocked = |tid: i32, regs: &user_regs_struct, in_syscall: bool| {
            let nr = process::thread_syscall(self.pid, tid).or_else(|| {
                let nr = regs.orig_rax as i64;
                (nr >= 0).then_some(nr)
            });
            in_syscall && nr.is_some_and(|nr| nr != libc::SYS_futex)
        };
        let threads: Vec<&StoppedThread> = self
            .threads()
            .iter()
            .filter(|t| self.tgid_of(t.tid()) == self.pid)
            .collect();
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

#[cfg(test)]
mod tests {
    use super::*;

    /// `pad_code(0x100, 0x98)`, assembled by GNU as from the listing in the comments.
    #[rustfmt::skip]
    const EXPECTED: [u8; PAD_CODE_LEN] = [
        0x48, 0x89, 0x84, 0x24, 0x00, 0x01, 0x00, 0x00,                 // 00: mov qword [rsp+0x100],rax
        0xc7, 0x84, 0x24, 0x08, 0x01, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00,// 08: mov dword [rsp+0x108],0x1
        0xb9, 0x0a, 0x00, 0x00, 0x00,                                   // 13: mov ecx,0xa
        0x51,                                                           // 18: push rcx
        0xb8, 0xca, 0x00, 0x00, 0x00,                                   // 19: mov eax,0xca
        0x48, 0x8d, 0xbc, 0x24, 0x14, 0x01, 0x00, 0x00,                 // 1e: lea rdi,[rsp+0x114]
        0xbe, 0x80, 0x00, 0x00, 0x00,                                   // 26: mov esi,0x80
        0x31, 0xd2,                                                     // 2b: xor edx,edx
        0x4c, 0x8d, 0x94, 0x24, 0x18, 0x01, 0x00, 0x00,                 // 2d: lea r10,[rsp+0x118]
        0x0f, 0x05,                                                     // 35: syscall
        0x59,                                                           // 37: pop rcx
        0xff, 0xc9,                                                     // 38: dec ecx
        0x75, 0xdc,                                                     // 3a: jne 18
        0x83, 0xbc, 0x24, 0x24, 0x01, 0x00, 0x00, 0x01,                 // 3c: cmp dword [rsp+0x124],0x1
        0x75, 0x15,                                                     // 44: jne 5b
        0xb8, 0xff, 0xff, 0xff, 0xff,                                   // 46: mov eax,0xffffffff
        0xba, 0xff, 0xff, 0xff, 0xff,                                   // 4b: mov edx,0xffffffff
        0x48, 0x0f, 0xae, 0xac, 0x24, 0x00, 0x02, 0x00, 0x00,           // 50: xrstor64 [rsp+0x200]
        0xeb, 0x13,                                                     // 59: jmp 6e
        0x83, 0xbc, 0x24, 0x24, 0x01, 0x00, 0x00, 0x02,                 // 5b: cmp dword [rsp+0x124],0x2
        0x75, 0x09,                                                     // 63: jne 6e
        0x48, 0x0f, 0xae, 0x8c, 0x24, 0x00, 0x02, 0x00, 0x00,           // 65: fxrstor64 [rsp+0x200]
        0xff, 0xb4, 0x24, 0xc0, 0x01, 0x00, 0x00,                       // 6e: push qword [rsp+0x1c0]
        0x9d,                                                           // 75: popf
        0x48, 0x8b, 0x84, 0x24, 0x40, 0x01, 0x00, 0x00,                 // 76: mov rax,qword [rsp+0x140]
        0x48, 0x8b, 0x9c, 0x24, 0x48, 0x01, 0x00, 0x00,                 // 7e: mov rbx,qword [rsp+0x148]
        0x48, 0x8b, 0x8c, 0x24, 0x50, 0x01, 0x00, 0x00,                 // 86: mov rcx,qword [rsp+0x150]
        0x48, 0x8b, 0x94, 0x24, 0x58, 0x01, 0x00, 0x00,                 // 8e: mov rdx,qword [rsp+0x158]
        0x48, 0x8b, 0xb4, 0x24, 0x60, 0x01, 0x00, 0x00,                 // 96: mov rsi,qword [rsp+0x160]
        0x48, 0x8b, 0xbc, 0x24, 0x68, 0x01, 0x00, 0x00,                 // 9e: mov rdi,qword [rsp+0x168]
        0x48, 0x8b, 0xac, 0x24, 0x70, 0x01, 0x00, 0x00,                 // a6: mov rbp,qword [rsp+0x170]
        0x4c, 0x8b, 0x84, 0x24, 0x78, 0x01, 0x00, 0x00,                 // ae: mov r8,qword [rsp+0x178]
        0x4c, 0x8b, 0x8c, 0x24, 0x80, 0x01, 0x00, 0x00,                 // b6: mov r9,qword [rsp+0x180]
        0x4c, 0x8b, 0x94, 0x24, 0x88, 0x01, 0x00, 0x00,                 // be: mov r10,qword [rsp+0x188]
        0x4c, 0x8b, 0x9c, 0x24, 0x90, 0x01, 0x00, 0x00,                 // c6: mov r11,qword [rsp+0x190]
        0x4c, 0x8b, 0xa4, 0x24, 0x98, 0x01, 0x00, 0x00,                 // ce: mov r12,qword [rsp+0x198]
        0x4c, 0x8b, 0xac, 0x24, 0xa0, 0x01, 0x00, 0x00,                 // d6: mov r13,qword [rsp+0x1a0]
        0x4c, 0x8b, 0xb4, 0x24, 0xa8, 0x01, 0x00, 0x00,                 // de: mov r14,qword [rsp+0x1a8]
        0x4c, 0x8b, 0xbc, 0x24, 0xb0, 0x01, 0x00, 0x00,                 // e6: mov r15,qword [rsp+0x1b0]
        0xc7, 0x84, 0x24, 0x20, 0x01, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00,// ee: mov dword [rsp+0x120],0x1
        0x48, 0x8d, 0xa4, 0x24, 0xc8, 0x01, 0x00, 0x00,                 // f9: lea rsp,[rsp+0x1c8]
        0xc2, 0x98, 0x00,                                               // 101: ret 0x98
    ];

    #[test]
    fn pad_code_is_the_listed_instructions() {
        assert_eq!(pad_code(0x100, 0x98), EXPECTED);
    }

    #[test]
    fn pad_data_sits_below_the_red_zone_and_returns_to_the_original_rsp() {
        // SAFETY: user_regs_struct is plain integers.
        let mut r: user_regs_struct = unsafe { std::mem::zeroed() };
        r.rsp = 0x7fff_0000_1238;
        r.rip = 0x4000;
        let fp = FpState::Fx(vec![7; 512]);
        let d = pad_data(&r, &fp);
        assert_eq!(d.at % 64, 0);
        assert!(d.at + d.bytes.len() as u64 <= r.rsp - RED_ZONE);
        assert_eq!(
            &d.bytes[PAD_FP as usize..PAD_FP as usize + 512],
            &[7; 512][..]
        );
        let rip = u64::from_le_bytes(d.bytes[PAD_REG_RIP as usize..][..8].try_into().unwrap());
        assert_eq!(rip, 0x4000);
        // `ret pop` from the rip slot leaves rsp at the original value.
        let pop = r.rsp - (d.at + PAD_REG_RIP + 8);
        assert_eq!(d.at + PAD_REG_RIP + 8 + pop, r.rsp);
    }

    #[test]
    fn a_restarted_system_call_resumes_on_its_syscall_instruction() {
        // SAFETY: user_regs_struct is plain integers.
        let mut r: user_regs_struct = unsafe { std::mem::zeroed() };
        r.rip = 0x1002;
        r.orig_rax = libc::SYS_read as u64;
        r.rax = (-512i64) as u64; // ERESTARTSYS
        let regs = pad_regs(&r);
        assert_eq!((regs[17], regs[0]), (0x1000, libc::SYS_read as u64));
        r.rax = (-4i64) as u64; // EINTR: returned as is
        let regs = pad_regs(&r);
        assert_eq!((regs[17], regs[0]), (0x1002, (-4i64) as u64));
    }
}
