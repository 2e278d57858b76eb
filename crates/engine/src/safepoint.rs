//! Where in a stopped process the agent may be loaded: a thread, and a moment, at
//! which a remote `dlopen` cannot re-enter the C library.
//!
//! `dlopen` runs `malloc`, takes the loader's locks and runs the agent's
//! constructor on a borrowed thread. Borrowed in the middle of `malloc` (which takes
//! no lock in a single-threaded process), the nested `malloc` corrupts the heap;
//! borrowed while holding one of the C library's internal locks, it deadlocks. A
//! thread is *safe* when it cannot be doing either:
//!
//! * it runs code outside the system libraries (the C library, the loader, the C++
//!   and unwinder runtimes, known allocators), with no signal frame on its stack (a
//!   handler may have interrupted `malloc`); or
//! * it is blocked in a system call (`read`, `poll`, `nanosleep`, a condition
//!   variable, its own mutex, ...) that the loader did not make and that the C
//!   library does not make in the middle of its own bookkeeping (a wait for one of
//!   its internal locks, `malloc`'s memory calls, `fork`).
//!
//! When no thread is safe, the process runs a few milliseconds and is looked at
//! again (up to [`SAFE_POINT_TIMEOUT`]). Other threads are preferred safe too (then
//! none can hold a lock `dlopen` needs), which a process of busy threads may never
//! show at once: after [`ALL_SAFE_FOR`] a safe borrowed thread is enough.
//!
//! A process that lives in the library (growing its heap, say) is rarely caught
//! outside it: so at every look its threads in the library are single-stepped (the
//! others held) back to the program's code, never into a blocking system call (a
//! few hundred steps: a millisecond or two). A step ends in a SIGTRAP stop, and
//! were weft SIGKILLed in one, the kernel would deliver that SIGTRAP to a process
//! that has no handler for it yet; a trap guard (a no-op handler, `TrapGuard`) is
//! held in place while stepping.

use std::collections::HashMap;
use std::ops::Range;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Result};
use weft_inject::{StoppedProcess, StoppedThread};
use weft_symbols::{Module, Perms, ProcMaps};

/// How long to look for a moment at which every thread is safe.
pub const ALL_SAFE_FOR: Duration = Duration::from_millis(600);
/// How long to look for a safe thread at all.
pub const SAFE_POINT_TIMEOUT: Duration = Duration::from_secs(10);
/// How far each thread in a system library is single-stepped towards the
/// program's code at each look, and for how long (the process is paused meanwhile).
const STEP_BUDGET: usize = 20_000;
const STEP_TIME: Duration = Duration::from_millis(40);
/// After a second of looking (a loaded machine, where every step waits for a CPU),
/// a look may step for longer.
const STEP_TIME_LATER: Duration = Duration::from_millis(60);
const STEP_LONGER_AFTER: Duration = Duration::from_secs(1);

/// `WEFT_TEST_STEP_BUDGET_US=N`: each thread's budget at each look, in
/// microseconds, for tests of what happens when a run or a step-out runs out of
/// time (a budget of a few microseconds makes most of them do, on any machine).
fn test_step_time() -> Option<Duration> {
    static T: std::sync::OnceLock<Option<Duration>> = std::sync::OnceLock::new();
    *T.get_or_init(|| {
        std::env::var("WEFT_TEST_STEP_BUDGET_US")
            .ok()?
            .parse()
            .ok()
            .map(Duration::from_micros)
    })
}

/// The system calls a step may go into: those that return at once, the
/// allocator's among them (so that a thread growing or trimming its heap can be
/// stepped out), and futex wakes (a thread leaving the library releases its locks).
/// Not `rt_sigprocmask`: a step over one that blocks SIGTRAP raises the step's trap
/// blocked, and the kernel then resets the SIGTRAP disposition and unblocks it
/// (under load the stress suite saw a target die of SIGTRAP once in 12 runs).
fn quick_syscall(regs: &libc::user_regs_struct) -> bool {
    const FUTEX_CMD_MASK: u64 = !(128 | 256);
    const FUTEX_WAKE: u64 = 1;
    const FUTEX_WAKE_OP: u64 = 5;
    const FUTEX_UNLOCK_PI: u64 = 7;
    const FUTEX_WAKE_BITSET: u64 = 10;
    match regs.rax as i64 {
        libc::SYS_brk
        | libc::SYS_mmap
        | libc::SYS_munmap
        | libc::SYS_mremap
        | libc::SYS_madvise
        | libc::SYS_mprotect
        | libc::SYS_getpid
        | libc::SYS_gettid
        | libc::SYS_clock_gettime => true,
        libc::SYS_futex => matches!(
            regs.rsi & FUTEX_CMD_MASK,
            FUTEX_WAKE | FUTEX_WAKE_OP | FUTEX_UNLOCK_PI | FUTEX_WAKE_BITSET
        ),
        _ => false,
    }
}
/// How much of a thread's stack above its stack pointer is searched for a signal
/// frame.
const STACK_SCAN: u64 = 64 * 1024;

/// File-name prefixes of the libraries a remote call must not be nested in.
const SYSTEM_LIBS: &[&str] = &[
    "ld-linux",
    "ld64",
    "libc.so",
    "libc-",
    "libpthread",
    "libdl",
    "libstdc++",
    "libgcc_s",
    "libjemalloc",
    "libtcmalloc",
    "libmimalloc",
];

/// `mov $15, %rax; syscall`: glibc's `__restore_rt`, where every signal handler
/// returns to (rt_sigreturn is system call 15).
const RESTORER: [u8; 9] = [0x48, 0xc7, 0xc0, 0x0f, 0x00, 0x00, 0x00, 0x0f, 0x05];

/// The address ranges of `maps` with the wanted access (`pick`), all of them or
/// those of module `of`.
fn ranges(maps: &ProcMaps, of: Option<&Module>, pick: fn(&Perms) -> bool) -> Vec<Range<u64>> {
    maps.mappings
        .iter()
        .filter(|x| pick(&x.perms))
        .filter(|x| of.is_none_or(|m| m.ranges.iter().any(|r| r.start == x.start)))
        .map(|x| x.start..x.end)
        .collect()
}

fn exec(p: &Perms) -> bool {
    p.exec
}

fn write(p: &Perms) -> bool {
    p.write
}

/// The dynamic loader (`ld-linux-x86-64.so.2`).
pub fn is_loader(m: &Module) -> bool {
    let f = m.file_name();
    f.starts_with("ld-linux") || f.starts_with("ld64")
}

/// What is looked up in the C library once per attach (it does not move).
#[derive(Clone, Debug, Default)]
pub struct LibcSpots {
    /// Signal-return trampolines.
    restorers: Vec<u64>,
    /// A `ret` instruction: the no-op SIGTRAP handler that guards stepping.
    ret: Option<u64>,
    /// `syscall()`, to call `rt_sigaction` with.
    syscall: Option<u64>,
}

impl LibcSpots {
    /// Looks them up in the C library's file (its code is the same in every
    /// process that maps it, and reading the file's pages is much quicker than
    /// reading the process's memory: this runs before the process is stopped,
    /// keeping it out of the pause).
    pub fn find(modules: &[Module]) -> LibcSpots {
        let mut spots = LibcSpots::default();
        let libc = modules
            .iter()
            .filter(|m| m.file_name().starts_with("libc.so") || m.file_name().starts_with("libc-"));
        for m in libc {
            let Ok(elf) = m.open() else { continue };
            for seg in elf
                .segments()
                .iter()
                .filter(|s| s.is_load() && s.flags & 1 != 0)
            {
                let Some(code) = elf
                    .data()
                    .get(seg.offset as usize..(seg.offset + seg.filesz) as usize)
                else {
                    continue;
                };
                let at = |i: usize| m.runtime_addr(seg.vaddr + i as u64);
                spots
                    .restorers
                    .extend(memchr::memmem::find_iter(code, &RESTORER).map(at));
                spots.ret = spots.ret.or_else(|| memchr::memchr(0xc3, code).map(at));
            }
            spots.syscall = spots
                .syscall
                .or_else(|| elf.symbol_vaddr("syscall").map(|v| m.runtime_addr(v)));
        }
        spots
    }

    /// Found everything (the C library is mapped and readable).
    pub fn complete(&self) -> bool {
        !self.restorers.is_empty() && self.ret.is_some() && self.syscall.is_some()
    }
}

/// What is known of the process's memory layout for the judgement.
pub struct Layout {
    /// Code of the system libraries.
    system: Vec<Range<u64>>,
    /// The system libraries (for their call-frame information).
    system_modules: Vec<Module>,
    /// Data of the system libraries (where their internal locks live).
    system_data: Vec<Range<u64>>,
    /// Code of the dynamic loader.
    loader: Vec<Range<u64>>,
    /// For the trap guard (see [`TrapGuard`]).
    ret: Option<u64>,
    syscall: Option<u64>,
    /// Finding signal frames on threads' stacks.
    frames: SignalFrames,
}

/// Finds the signal frames on a thread's stack: where its signal handlers will
/// return to.
#[derive(Clone, Debug, Default)]
pub struct SignalFrames {
    /// Addresses of signal-return trampolines.
    restorers: Vec<u64>,
    /// Writable mappings (stacks among them), to bound stack scans.
    writable: Vec<Range<u64>>,
    /// Executable mappings.
    code: Vec<Range<u64>>,
}

impl SignalFrames {
    /// For a process with mappings `maps` and C library `modules`.
    pub fn new(maps: &ProcMaps, modules: &[Module]) -> SignalFrames {
        SignalFrames {
            restorers: LibcSpots::find(modules).restorers,
            writable: ranges(maps, None, write),
            code: ranges(maps, None, exec),
        }
    }

    /// Where the signal handlers running on the stack above `rsp` return to: the
    /// pc each interrupted (innermost first).
    pub fn interrupted(&self, stopped: &StoppedProcess, rsp: u64) -> Vec<u64> {
        /// Word offset of the saved rip in an `rt_sigframe` (see [`Self::is_frame`]).
        const RIP: usize = 6 + 16;
        if self.restorers.is_empty() {
            return Vec::new();
        }
        let Some(stack) = self.writable.iter().find(|r| r.contains(&rsp)) else {
            return Vec::new();
        };
        let len = (stack.end - rsp).min(STACK_SCAN) as usize;
        let mut buf = vec![0u8; len];
        if stopped.read_mem(rsp, &mut buf).is_err() {
            return Vec::new();
        }
        let words: Vec<u64> = buf
            .chunks_exact(8)
            .map(|w| u64::from_le_bytes(w.try_into().unwrap()))
            .collect();
        (0..words.len())
            .filter(|&i| self.is_frame(&words[i..]))
            .map(|i| words[i + RIP])
            .collect()
    }

    /// `frame` starts with a kernel `rt_sigframe`: the return address into a
    /// signal trampoline, then a `ucontext` with small flags, no link, and saved
    /// registers that point into the process's stacks and code. Stack slots a frame
    /// has not written yet may hold a stale trampoline address (glibc's `sigaction`
    /// stores one in the structure it passes to the kernel); those fail the other
    /// checks.
    fn is_frame(&self, frame: &[u64]) -> bool {
        // Word offsets: uc_flags, uc_link, then uc_stack (3 words) and the
        // sigcontext, whose rsp and rip are its 16th and 17th words.
        const FLAGS: usize = 1;
        const LINK: usize = 2;
        const RSP: usize = 6 + 15;
        const RIP: usize = 6 + 16;
        frame.len() > RIP
            && self.restorers.contains(&frame[0])
            && frame[FLAGS] <= 0xff
            && frame[LINK] == 0
            && self.writable.iter().any(|r| r.contains(&frame[RSP]))
            && self.code.iter().any(|r| r.contains(&frame[RIP]))
    }
}

impl Layout {
    /// `spots` caches what is found in the C library between looks.
    pub fn new(maps: &ProcMaps, modules: &[Module], spots: &mut Option<LibcSpots>) -> Layout {
        let system: Vec<&Module> = modules
            .iter()
            .filter(|m| SYSTEM_LIBS.iter().any(|p| m.file_name().starts_with(p)))
            .collect();
        let spots = spots
            .get_or_insert_with(|| LibcSpots::find(modules))
            .clone();
        Layout {
            system: system
                .iter()
                .flat_map(|m| ranges(maps, Some(m), exec))
                .collect(),
            system_modules: system.iter().map(|&m| m.clone()).collect(),
            system_data: system
                .iter()
                .flat_map(|m| ranges(maps, Some(m), write))
                .collect(),
            loader: modules
                .iter()
                .filter(|m| is_loader(m))
                .flat_map(|m| ranges(maps, Some(m), exec))
                .collect(),
            ret: spots.ret,
            syscall: spots.syscall,
            frames: SignalFrames {
                restorers: spots.restorers,
                writable: ranges(maps, None, write),
                code: ranges(maps, None, exec),
            },
        }
    }

    fn in_system(&self, pc: u64) -> bool {
        self.system.iter().any(|r| r.contains(&pc))
    }
}

/// Where a thread inside the system libraries returns to in the program: their
/// call-frame information (`.eh_frame`), read once per attach.
#[derive(Default)]
pub struct Unwinder {
    tables: HashMap<PathBuf, Option<weft_symbols::FrameTable>>,
    /// Threads run out of the libraries in one run to their return address, and
    /// threads stepped out (no call-frame information led out).
    pub ran: usize,
    pub stepped: usize,
}

impl Unwinder {
    /// Frames walked at most.
    const DEPTH: usize = 64;

    /// The first return address outside the system libraries on the stack of a
    /// thread stopped inside them, if their call-frame information leads there.
    fn return_to_program(
        &mut self,
        stopped: &StoppedProcess,
        layout: &Layout,
        regs: &libc::user_regs_struct,
    ) -> Option<u64> {
        let read = |at: u64| {
            let mut b = [0u8; 8];
            stopped.read_mem(at, &mut b).ok()?;
            Some(u64::from_le_bytes(b))
        };
        let mut frame = weft_symbols::Frame {
            pc: regs.rip,
            sp: regs.rsp,
            bp: regs.rbp,
        };
        for depth in 0..Self::DEPTH {
            if !layout.in_system(frame.pc) {
                return (depth > 0).then_some(frame.pc);
            }
            let m = layout
                .system_modules
                .iter()
                .find(|m| m.contains(frame.pc))?;
            let table = self
                .tables
                .entry(m.path.clone())
                .or_insert_with(|| weft_symbols::FrameTable::of(&*m.open().ok()?))
                .as_ref()?;
            frame = table.caller(frame, m.load_bias, depth == 0, read)?;
        }
        None
    }
}

/// Why a thread is or is not safe (for `-v` and errors).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Judgement {
    /// Blocked in a plain wait: the best thread to borrow.
    Waiting,
    /// Running the program's own code.
    InProgram,
    /// In a system library (or its system call is not a plain wait).
    InLibrary,
    /// A signal handler is running (it may have interrupted anything).
    InHandler,
}

impl Judgement {
    pub fn safe(self) -> bool {
        matches!(self, Judgement::Waiting | Judgement::InProgram)
    }
}

/// Judges one stopped thread.
pub fn judge(stopped: &StoppedProcess, layout: &Layout, t: &StoppedThread) -> Judgement {
    if handler_on_stack(stopped, layout, t.regs().rsp) {
        return Judgement::InHandler;
    }
    let r = t.regs();
    if t.in_syscall() {
        let loader = layout.loader.iter().any(|x| x.contains(&r.rip));
        if !loader && plain_wait(r.orig_rax as i64, r.rdi, r.rsi, layout) {
            return Judgement::Waiting;
        }
        return Judgement::InLibrary;
    }
    if layout.in_system(r.rip) {
        Judgement::InLibrary
    } else {
        Judgement::InProgram
    }
}

/// An interrupted (blocking) system call made by a thread that holds nothing of
/// the C library's. Blocking calls the library makes in the middle of its own
/// bookkeeping are the exceptions: a lock wait (`FUTEX_WAIT`, `FUTEX_LOCK_PI`) on a
/// lock word in a system library's data or at the head of a malloc arena (a
/// 64 MiB-aligned heap), where its internal locks are (a wait on the program's own
/// mutex, or condition-variable, semaphore and join waits, `FUTEX_WAIT_BITSET`,
/// are fine); the memory calls of `malloc`; `fork`, `vfork` and `clone`, made
/// holding the allocator's and the fork handlers' locks; and the exits.
fn plain_wait(nr: i64, addr: u64, op: u64, layout: &Layout) -> bool {
    const FUTEX_CMD_MASK: u64 = !(128 | 256);
    const FUTEX_WAIT: u64 = 0;
    const FUTEX_LOCK_PI: u64 = 6;
    const FUTEX_LOCK_PI2: u64 = 13;
    const ARENA_ALIGN: u64 = 64 << 20;
    match nr {
        libc::SYS_futex => match op & FUTEX_CMD_MASK {
            FUTEX_WAIT | FUTEX_LOCK_PI | FUTEX_LOCK_PI2 => {
                let internal = layout.system_data.iter().any(|r| r.contains(&addr))
                    || addr % ARENA_ALIGN < 4096;
                !internal
            }
            _ => true,
        },
        libc::SYS_mmap
        | libc::SYS_munmap
        | libc::SYS_mremap
        | libc::SYS_brk
        | libc::SYS_madvise
        | libc::SYS_mprotect
        | libc::SYS_clone
        | libc::SYS_clone3
        | libc::SYS_fork
        | libc::SYS_vfork
        | libc::SYS_execve
        | libc::SYS_execveat
        | libc::SYS_exit
        | libc::SYS_exit_group
        | libc::SYS_rt_sigreturn => false,
        _ => true,
    }
}

/// A signal frame in the live part of the stack above `rsp`: a handler is running.
fn handler_on_stack(stopped: &StoppedProcess, layout: &Layout, rsp: u64) -> bool {
    !layout.frames.interrupted(stopped, rsp).is_empty()
}

/// A no-op SIGTRAP handler held in place while threads are single-stepped.
///
/// A step ends in a SIGTRAP stop; were weft SIGKILLed there, the kernel would deliver
/// that SIGTRAP to the thread, and with the default disposition (the agent is not
/// loaded yet) kill the process. With a handler that is a bare `ret` (returning
/// through glibc's signal trampoline) the SIGTRAP is harmless. Installed with
/// remote calls of `syscall(SYS_rt_sigaction, ...)` (no lock, no allocation: safe
/// wherever the thread is) only over the default disposition, and put back before
/// the look ends; a process that has its own SIGTRAP handler keeps it (the stray
/// trap goes there). Only if weft dies between the two calls does the no-op handler
/// stay, in place of a default that would have killed the process; the next attach
/// puts the default back ([`TrapGuard::clear_leftover`]).
struct TrapGuard {
    tid: i32,
    syscall: u64,
}

/// `struct kernel_sigaction` for x86-64 `rt_sigaction`: handler, flags, restorer,
/// mask.
const KSIGACTION: usize = 32;
const SA_RESTORER: u64 = 0x0400_0000;

impl TrapGuard {
    /// Installs the guard through thread `tid`; `None` (step unguarded, safely) if
    /// the process has its own SIGTRAP handler, an error if the guard could not be
    /// set up (then do not step).
    fn install(stopped: &mut StoppedProcess, layout: &Layout, tid: i32) -> Result<Option<Self>> {
        let (Some(syscall), Some(ret), Some(&restorer)) =
            (layout.syscall, layout.ret, layout.frames.restorers.first())
        else {
            bail!("no syscall(), ret or signal trampoline found in the C library");
        };
        let guard = TrapGuard { tid, syscall };
        let handler = guard.handler(stopped)?;
        if handler != 0 && handler != ret {
            // SIG_IGN (1) is reset to the default by a forced SIGTRAP; a real handler
            // takes the stray trap. Either way: the process's own choice stays.
            return Ok(None);
        }
        let mut act = [0u8; KSIGACTION];
        act[..8].copy_from_slice(&ret.to_le_bytes());
        act[8..16].copy_from_slice(&SA_RESTORER.to_le_bytes());
        act[16..24].copy_from_slice(&restorer.to_le_bytes());
        guard.sigaction(stopped, Some(&act))?;
        Ok(Some(guard))
    }

    /// A guard left behind by a weft that died while stepping (SIGTRAP caught, with
    /// our `ret` as the handler) is put back to the default, through thread `tid`.
    fn clear_leftover(stopped: &mut StoppedProcess, layout: &Layout, tid: i32) -> Result<()> {
        let pid = stopped.pid();
        let caught =
            weft_inject::process::signal_mask(pid, pid, "SigCgt") & (1 << (libc::SIGTRAP - 1)) != 0;
        let (true, Some(syscall), Some(ret)) = (caught, layout.syscall, layout.ret) else {
            return Ok(());
        };
        let guard = TrapGuard { tid, syscall };
        if guard.handler(stopped)? == ret {
            guard.remove(stopped)?;
        }
        Ok(())
    }

    /// The thread that makes the call: the guard's, or another if it exited while
    /// threads were stepped (dispositions are the process's, any thread will do).
    fn caller(&self, stopped: &StoppedProcess) -> i32 {
        if stopped.thread(self.tid).is_ok() {
            self.tid
        } else {
            stopped.pick_call_thread()
        }
    }

    /// The process's current SIGTRAP handler (0: the default, 1: ignored).
    fn handler(&self, stopped: &mut StoppedProcess) -> Result<u64> {
        let r = self.sigaction(stopped, None)?;
        let mut old = [0u8; 8];
        stopped
            .read_mem(r.stack_data_addr, &mut old)
            .map_err(|e| anyhow!("{e}"))?;
        Ok(u64::from_le_bytes(old))
    }

    /// Puts the default disposition back.
    fn remove(self, stopped: &mut StoppedProcess) -> Result<()> {
        self.sigaction(stopped, Some(&[0u8; KSIGACTION])).map(drop)
    }

    /// `syscall(SYS_rt_sigaction, SIGTRAP, act, old, 8)`: `act` copied to the stack,
    /// or without one, NULL and the old action written to the stack data.
    fn sigaction(
        &self,
        stopped: &mut StoppedProcess,
        act: Option<&[u8; KSIGACTION]>,
    ) -> Result<weft_inject::RemoteCallResult> {
        use weft_inject::CallArg::{StackData, Value};
        let (data, args) = match act {
            Some(a) => (a.to_vec(), [StackData, Value(0)]),
            None => (vec![0u8; KSIGACTION], [Value(0), StackData]),
        };
        let all = [
            Value(libc::SYS_rt_sigaction as u64),
            Value(libc::SIGTRAP as u64),
            args[0],
            args[1],
            Value(8),
        ];
        let r = stopped
            .call(self.caller(stopped), self.syscall, &all, &data)
            .map_err(|e| anyhow!("{e}"))?;
        if r.ret != 0 {
            bail!(
                "rt_sigaction(SIGTRAP) in the target failed: {}",
                r.ret as i64
            );
        }
        Ok(r)
    }
}

/// Traps a weft that died while stepping left on their way to a thread (a step's
/// last trap, or its breakpoint, hit again and again until this attach cleared the
/// debug registers): queued in the kernel or caught by the stop, they would be
/// delivered after the resume, and once the trap guard is gone the default
/// disposition would kill the process. A single step's trap (`TRAP_TRACE`) or a
/// hardware breakpoint's (`TRAP_HWBKPT`) is weft's when the process has no SIGTRAP
/// handler of its own (none, or the guard a dead weft left): the program itself
/// sets neither without a handler to take them. Taken and dropped; returns how
/// many were caught by the stop.
pub fn drop_stray_traps(stopped: &mut StoppedProcess, layout: &Layout) -> Result<usize> {
    const TRAP_TRACE: i32 = 2;
    const TRAP_HWBKPT: i32 = 4;
    let is_step_trap = |sig: i32, info: Option<&libc::siginfo_t>| {
        sig == libc::SIGTRAP && info.is_some_and(|i| matches!(i.si_code, TRAP_TRACE | TRAP_HWBKPT))
    };
    let pid = stopped.pid();
    let trap = 1u64 << (libc::SIGTRAP - 1);
    // Queued ones first, kept with the others: a remote call would take them.
    if stopped
        .threads()
        .iter()
        .any(|t| weft_inject::process::signal_mask(pid, t.tid(), "SigPnd") & trap != 0)
    {
        stopped.take_queued_traps().map_err(|e| anyhow!("{e}"))?;
    }
    let held: Vec<i32> = stopped
        .threads()
        .iter()
        .filter(|t| t.pending_signals().contains(&libc::SIGTRAP))
        .map(|t| t.tid())
        .collect();
    if held.is_empty() {
        return Ok(0);
    }
    let caught =
        weft_inject::process::signal_mask(pid, pid, "SigCgt") & (1 << (libc::SIGTRAP - 1)) != 0;
    if caught {
        let (Some(syscall), Some(ret)) = (layout.syscall, layout.ret) else {
            return Ok(0);
        };
        let probe = TrapGuard {
            tid: stopped.pick_call_thread(),
            syscall,
        };
        if probe.handler(stopped)? != ret {
            return Ok(0);
        }
    }
    let mut dropped = 0;
    for tid in held {
        dropped += stopped
            .drop_pending(tid, is_step_trap)
            .map_err(|e| anyhow!("{e}"))?;
    }
    Ok(dropped)
}

/// The outcome of one look at a stopped process.
pub enum Look {
    /// Borrow this thread now.
    Borrow(i32),
    /// Nothing safe yet: let the process run a little and look again.
    Later(String),
}

/// Looks at a stopped process and says which thread to borrow, if any yet; threads
/// in the system libraries are stepped towards the program's code first. `since` is when the search began.
pub fn look(
    stopped: &mut StoppedProcess,
    layout: &Layout,
    unwinder: &mut Unwinder,
    since: Instant,
) -> Result<Look> {
    let pid = stopped.pid();
    // Threads of processes sharing the memory (a vfork child) count for the locks
    // they may hold, but are never borrowed.
    let candidates: Vec<i32> = stopped.threads().iter().map(|t| t.tid()).collect();
    let step_time = test_step_time().unwrap_or(if since.elapsed() >= STEP_LONGER_AFTER {
        STEP_TIME_LATER
    } else {
        STEP_TIME
    });
    let mut verdicts = Vec::new();
    // None: not needed yet; Some(None): stepping unguarded is fine (or impossible).
    let mut guard: Option<Option<TrapGuard>> = None;
    let mut can_step = true;
    for &tid in &candidates {
        // A thread that exited while another was stepped is no longer held.
        let Ok(thread) = stopped.thread(tid) else {
            continue;
        };
        let mut j = judge(stopped, layout, thread);
        // Each thread its own budget: a thread that keeps the library busy for
        // long does not leave the others no time to leave it.
        let time = step_time;
        let mut step = can_step
            && j == Judgement::InLibrary
            && !thread.in_syscall()
            && !time.is_zero()
            && stopped.tgid_of(tid) == pid;
        if step && guard.is_none() {
            match TrapGuard::install(stopped, layout, tid) {
                Ok(g) => {
                    // A step's trap is harmless under our handler: steps need not
                    // each be settled into an interrupt stop.
                    stopped.set_trap_guarded(g.is_some());
                    guard = Some(g);
                }
                Err(_) if !weft_inject::process::process_exists(pid) => {
                    bail!("process {pid} exited")
                }
                Err(_) => {
                    can_step = false;
                    step = false;
                }
            }
        }
        if step {
            // Run it (alone) back to the program's code, not into a blocking call.
            let quick: Option<&dyn Fn(&libc::user_regs_struct) -> bool> = Some(&quick_syscall);
            // In one run to where it returns to the program, if the call-frame
            // information tells; else step by step.
            let regs = *stopped.thread(tid).map_err(|e| anyhow!("{e}"))?.regs();
            let out = match unwinder.return_to_program(stopped, layout, &regs) {
                Some(ra) => {
                    unwinder.ran += 1;
                    stopped.run_until(tid, ra, time, quick).map(drop)
                }
                None => {
                    unwinder.stepped += 1;
                    stopped
                        .step_out_within(tid, &layout.system, STEP_BUDGET, time, quick)
                        .map(drop)
                }
            };
            match out {
                Ok(_) => match stopped.thread(tid) {
                    Ok(thread) => j = judge(stopped, layout, thread),
                    Err(_) => continue,
                },
                Err(e) if !weft_inject::process::process_exists(pid) => bail!("{e}"),
                Err(_) => {}
            }
        }
        verdicts.push((tid, j));
    }
    stopped.set_trap_guarded(false);
    if let Some(Some(g)) = guard {
        g.remove(stopped)?;
    }
    let all_safe = verdicts.iter().all(|(_, j)| j.safe());
    let own: Vec<(i32, Judgement)> = verdicts
        .iter()
        .copied()
        .filter(|&(t, _)| stopped.tgid_of(t) == pid)
        .collect();
    let best = own
        .iter()
        .find(|(_, j)| *j == Judgement::Waiting)
        .or_else(|| {
            own.iter()
                .find(|(t, j)| *t == pid && *j == Judgement::InProgram)
        })
        .or_else(|| own.iter().find(|(_, j)| j.safe()));
    match best {
        Some(&(tid, _)) if all_safe || since.elapsed() >= ALL_SAFE_FOR => {
            TrapGuard::clear_leftover(stopped, layout, tid)?;
            Ok(Look::Borrow(tid))
        }
        _ => {
            let busy: Vec<String> = verdicts
                .iter()
                .filter(|(_, j)| !j.safe())
                .map(|(t, j)| format!("{t} {}", describe(*j)))
                .collect();
            Ok(Look::Later(busy.join(", ")))
        }
    }
}

fn describe(j: Judgement) -> &'static str {
    match j {
        Judgement::Waiting => "waiting",
        Judgement::InProgram => "in the program",
        Judgement::InLibrary => "in the C library or loader",
        Judgement::InHandler => "in a signal handler",
    }
}

#[cfg(test)]
mod tests {
    use super::{plain_wait, Layout, SignalFrames};

    #[test]
    fn signal_frames_are_told_from_stale_trampoline_addresses() {
        let frames = SignalFrames {
            restorers: vec![0x7f00_0003_c050],
            writable: std::iter::once(0x7ffd_0000_0000..0x7ffd_0010_0000).collect(),
            code: std::iter::once(0x5555_0000_0000..0x5555_0001_0000).collect(),
        };
        let is_signal_frame = |_: &(), f: &[u64]| frames.is_frame(f);
        let layout = ();
        let mut frame = vec![0u64; 40];
        frame[0] = 0x7f00_0003_c050; // pretcode
        frame[1] = 7; // uc_flags
        frame[21] = 0x7ffd_0000_8000; // saved rsp
        frame[22] = 0x5555_0000_1234; // saved rip
        assert!(is_signal_frame(&layout, &frame));
        let mut stale = frame.clone();
        stale[2] = 0x1234; // uc_link
        assert!(!is_signal_frame(&layout, &stale));
        let mut stale = frame.clone();
        stale[22] = 42; // rip nowhere
        assert!(!is_signal_frame(&layout, &stale));
        assert!(!is_signal_frame(&layout, &frame[..10]));
        let mut other = frame;
        other[0] = 0x7f00_0003_c051;
        assert!(!is_signal_frame(&layout, &other));
    }

    #[test]
    fn futex_waits_are_told_apart() {
        let layout = Layout {
            system: std::iter::once(0x7000_0000..0x7010_0000).collect(),
            system_modules: vec![],
            system_data: std::iter::once(0x7020_0000..0x7021_0000).collect(),
            loader: vec![],
            ret: None,
            syscall: None,
            frames: SignalFrames::default(),
        };
        let futex = libc::SYS_futex;
        let user_lock = 0x5555_0000_1040;
        // pthread_cond_wait: FUTEX_WAIT_BITSET | FUTEX_PRIVATE_FLAG.
        assert!(plain_wait(futex, user_lock, 9 | 128, &layout));
        // A lock wait (FUTEX_WAIT | FUTEX_PRIVATE_FLAG) on the program's mutex...
        assert!(plain_wait(futex, user_lock, 128, &layout));
        // ... on a lock in libc's data, or at the head of a malloc arena.
        assert!(!plain_wait(futex, 0x7020_0100, 128, &layout));
        assert!(!plain_wait(futex, 0x7f00_0400_0020, 128, &layout));
        // PI mutexes: the same rule.
        assert!(plain_wait(futex, user_lock, 6 | 128, &layout));
        assert!(!plain_wait(futex, 0x7020_0100, 6, &layout));
        assert!(plain_wait(libc::SYS_read, 0, 0, &layout));
        assert!(plain_wait(libc::SYS_ioctl, 0, 0, &layout));
        assert!(!plain_wait(libc::SYS_vfork, 0, 0, &layout));
        assert!(!plain_wait(libc::SYS_mmap, 0, 0, &layout));
        assert!(!plain_wait(libc::SYS_brk, 0, 0, &layout));
    }
}
