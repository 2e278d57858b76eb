//! Per-thread state: one `AgentThread` per target thread, found through an
//! initial-exec TLS slot so a trampoline reaches it with `mov rax, fs:[off]`.
//!
//! `AgentThread`s come from a pool mapped once at load time (no allocation, no
//! system call when a thread first hits a probe, apart from one `gettid` and one
//! `prctl(PR_GET_NAME)` per thread and session). Shadow stacks live beside them.

use core::arch::{asm, global_asm};
use core::sync::atomic::{AtomicPtr, AtomicU32, AtomicU64, Ordering};
use weft_abi::{
    AgentThread, ShadowEntry, ThreadAttach, ThreadSlot, THREAD_FLAG_IGNORE, THREAD_LIVE,
};

use crate::session;

// The TLS slot. Initial-exec: the dynamic linker resolves its offset from the thread
// pointer at load time (DF_STATIC_TLS), and glibc sets it up in threads that already
// exist when the agent is dlopen()ed.
global_asm!(
    ".section .tbss,\"awT\",@nobits",
    ".p2align 3",
    // Global (other codegen units refer to it) but hidden (not exported).
    ".globl weft_agent_tls",
    ".hidden weft_agent_tls",
    ".type weft_agent_tls,@object",
    ".size weft_agent_tls,8",
    "weft_agent_tls: .zero 8",
    ".text",
);

/// Offset of the TLS slot from the thread pointer (`fs:[offset]`).
pub fn tls_offset() -> i64 {
    let off: i64;
    // SAFETY: reads the linker-resolved TP offset of our TLS symbol from the GOT.
    unsafe {
        asm!("mov {}, qword ptr [rip + weft_agent_tls@GOTTPOFF]", out(reg) off, options(nostack, readonly))
    };
    off
}

#[inline]
pub fn current() -> *mut AgentThread {
    let off = tls_offset();
    let v: *mut AgentThread;
    // SAFETY: fs:[off] is this thread's TLS slot.
    unsafe {
        asm!("mov {}, qword ptr fs:[{}]", out(reg) v, in(reg) off, options(nostack, readonly))
    };
    v
}

fn set_current(t: *mut AgentThread) {
    let off = tls_offset();
    // SAFETY: fs:[off] is this thread's TLS slot.
    unsafe { asm!("mov qword ptr fs:[{}], {}", in(reg) off, in(reg) t, options(nostack)) };
}

pub const POOL_THREADS: usize = 4096;
pub const SHADOW_ENTRIES: usize = 4096;

static POOL: AtomicPtr<AgentThread> = AtomicPtr::new(core::ptr::null_mut());
static SHADOWS: AtomicPtr<ShadowEntry> = AtomicPtr::new(core::ptr::null_mut());
static NEXT: AtomicU32 = AtomicU32::new(0);
/// Threads that found no free `AgentThread` (their hits run no advice).
pub static POOL_EXHAUSTED: AtomicU64 = AtomicU64::new(0);
static PID: AtomicU32 = AtomicU32::new(0);

/// Map the pool (once, at load).
pub fn init() -> std::io::Result<()> {
    let tsize = POOL_THREADS * core::mem::size_of::<AgentThread>();
    let ssize = POOL_THREADS * SHADOW_ENTRIES * core::mem::size_of::<ShadowEntry>();
    let threads = map_anon(tsize)? as *mut AgentThread;
    let shadows = map_anon(ssize)? as *mut ShadowEntry;
    SHADOWS.store(shadows, Ordering::Release);
    POOL.store(threads, Ordering::Release);
    // SAFETY: getpid has no preconditions.
    PID.store(unsafe { libc::getpid() } as u32, Ordering::Relaxed);
    Ok(())
}

/// The pid the agent's state belongs to (updated in the child of a fork()).
pub fn pid() -> u32 {
    PID.load(Ordering::Relaxed)
}

/// After fork() in the child: the pid changed and no session is ours.
pub fn after_fork_child() {
    // SAFETY: getpid has no preconditions.
    PID.store(unsafe { libc::getpid() } as u32, Ordering::Relaxed);
}

fn map_anon(size: usize) -> std::io::Result<*mut u8> {
    // SAFETY: anonymous private mapping; NORESERVE so untouched pages cost nothing.
    let p = unsafe {
        libc::mmap(
            core::ptr::null_mut(),
            size,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(std::io::Error::last_os_error());
    }
    Ok(p as *mut u8)
}

/// A system call made from the agent's own text, not through libc: these run with
/// a pointer into the session held (trap handler, attach slow path), and weft only
/// waits for threads whose PC is inside the agent (see `Hello::text_start`).
///
/// # Safety
/// The caller passes a system call whose arguments are valid for it.
pub unsafe fn raw_syscall(nr: i64, a0: u64, a1: u64) -> i64 {
    let ret: i64;
    // SAFETY: per the caller; `syscall` clobbers rcx and r11 only.
    unsafe {
        asm!("syscall", inlateout("rax") nr => ret, in("rdi") a0, in("rsi") a1,
             out("rcx") _, out("r11") _, options(nostack))
    };
    ret
}

/// Every `AgentThread` handed out so far.
pub fn all() -> impl Iterator<Item = *mut AgentThread> {
    let base = POOL.load(Ordering::Acquire);
    let n = (NEXT.load(Ordering::Acquire) as usize).min(POOL_THREADS);
    // SAFETY: entries below NEXT were initialised by `get_or_create`.
    (0..if base.is_null() { 0 } else { n }).map(move |i| unsafe { base.add(i) })
}

/// This thread's state, created on first use.
pub fn get_or_create() -> *mut AgentThread {
    let t = current();
    if !t.is_null() {
        return t;
    }
    let base = POOL.load(Ordering::Acquire);
    if base.is_null() {
        return core::ptr::null_mut();
    }
    let i = NEXT.fetch_add(1, Ordering::AcqRel) as usize;
    if i >= POOL_THREADS {
        NEXT.store(POOL_THREADS as u32, Ordering::Relaxed);
        POOL_EXHAUSTED.fetch_add(1, Ordering::Relaxed);
        return core::ptr::null_mut();
    }
    // SAFETY: index i is ours alone; the pool and shadow areas have room for it.
    unsafe {
        let t = base.add(i);
        t.write(AgentThread {
            slot: core::ptr::null_mut(),
            nest: 0,
            flags: 0,
            tid: raw_syscall(libc::SYS_gettid, 0, 0) as u32,
            pid: PID.load(Ordering::Relaxed),
            session: 0,
            shadow_depth: 0,
            shadow_cap: SHADOW_ENTRIES as u32,
            shadow: SHADOWS.load(Ordering::Acquire).add(i * SHADOW_ENTRIES),
            rand: 0,
            shadow_overflows: 0,
            shadow_discarded: 0,
            busy: 0,
            _pad: 0,
            shadow_gc: 0,
            shadow_thieves: 0,
        });
        set_current(t);
        t
    }
}

/// Mark the calling thread as the agent's own (advice never runs on it).
pub fn mark_ignored() {
    let t = get_or_create();
    if !t.is_null() {
        // SAFETY: our own AgentThread.
        unsafe { (*t).flags |= THREAD_FLAG_IGNORE };
    }
}

/// Marks the thread as holding a pointer into the session (`AgentThread::busy`)
/// until dropped. weft does not free a session while any thread is marked: code the
/// compiler emits here may call libc (memcpy...), so "PC inside the agent" alone
/// does not show it. Mark before loading the session pointer.
pub struct UsingSession(*mut AgentThread);

pub fn using_session(t: *mut AgentThread) -> UsingSession {
    if !t.is_null() {
        // SAFETY: our own pool AgentThread; weft reads `busy` with the world stopped.
        unsafe {
            let p = core::ptr::addr_of_mut!((*t).busy);
            p.write_volatile(p.read_volatile() + 1);
        }
        core::sync::atomic::fence(Ordering::SeqCst);
    }
    UsingSession(t)
}

impl Drop for UsingSession {
    fn drop(&mut self) {
        if !self.0.is_null() {
            core::sync::atomic::fence(Ordering::SeqCst);
            // SAFETY: as in `using_session`.
            unsafe {
                let p = core::ptr::addr_of_mut!((*self.0).busy);
                p.write_volatile(p.read_volatile() - 1);
            }
        }
    }
}

/// The trampolines' slow path: find or create this thread's state and its slot in
/// the current session. Returns a null slot when advice must not run (no session,
/// the agent's own thread, advice already running on this thread, no slot left).
#[unsafe(no_mangle)]
pub extern "C" fn weft_agent_thread_attach(_frame: *mut weft_abi::Frame) -> ThreadAttach {
    let t = get_or_create();
    let none = ThreadAttach {
        thread: t,
        slot: core::ptr::null_mut(),
    };
    if t.is_null() {
        return none;
    }
    // SAFETY: t is this thread's AgentThread, used only by this thread.
    let th = unsafe { &mut *t };
    if th.flags & THREAD_FLAG_IGNORE != 0 || th.nest != 0 {
        return none;
    }
    let _using = using_session(t);
    // SAFETY: as above.
    let slot = attach_slot(unsafe { &mut *t });
    ThreadAttach { thread: t, slot }
}

/// Claim a slot for `th` in the current session if it has none.
pub fn attach_slot(th: &mut AgentThread) -> *mut ThreadSlot {
    let Some(s) = session::current() else {
        return core::ptr::null_mut();
    };
    if th.session == s.generation && !th.slot.is_null() {
        return th.slot;
    }
    let h = s.shm.header();
    let idx = h.threads_claimed.fetch_add(1, Ordering::AcqRel);
    if idx >= h.max_threads {
        h.threads_dropped.fetch_add(1, Ordering::Relaxed);
        return core::ptr::null_mut();
    }
    let slot = s.shm.thread_slot(idx);
    // SAFETY: the slot at idx is ours alone (claimed by fetch_add).
    unsafe {
        let sl = &mut *slot;
        sl.tid = th.tid;
        let mut name = [0u8; 16];
        raw_syscall(
            libc::SYS_prctl,
            libc::PR_GET_NAME as u64,
            name.as_mut_ptr() as u64,
        );
        sl.comm = name;
        sl.state.store(THREAD_LIVE, Ordering::Release);
    }
    th.slot = slot;
    th.session = s.generation;
    slot
}

/// Detach every thread from the session that is ending.
pub fn detach_all() {
    for t in all() {
        // SAFETY: pool entries stay valid; a racing reader is covered by the
        // quiescence check weft makes before the segment is unmapped.
        unsafe { core::ptr::addr_of_mut!((*t).slot).write_volatile(core::ptr::null_mut()) };
    }
}
