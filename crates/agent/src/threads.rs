//! Per-thread state: one `AgentThread` per target thread, found through an
//! initial-exec TLS slot so a trampoline reaches it with `mov rax, fs:[off]`.
//!
//! `AgentThread`s come from a pool mapped at load time (no allocation, no system
//! call when a thread first hits a probe, apart from one `gettid` and one
//! `prctl(PR_GET_TID_ADDRESS)` per thread and one `prctl(PR_GET_NAME)` per thread and
//! session). Shadow stacks live beside them. When a thread is gone, the control
//! thread's reaper ([`crate::reap`]) gives its slot back to the session and its
//! entry (with its shadow stack) to the next new thread.
//!
//! When the last session is over, the control thread gives the pool back
//! ([`release`]) if nothing can reach it any more, and the next control thread maps
//! it again ([`ensure`]). Code that may run between sessions (signal handlers, the
//! exit hook) touches the pool only inside a [`PoolHold`], which the release waits
//! for; everything else reaches it from a session's trampolines, or from a hijacked
//! return, and the release happens only once there is neither.

use core::arch::{asm, global_asm};
use core::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicU64, Ordering};
use weft_abi::{AgentThread, ShadowEntry, ThreadAttach, ThreadSlot, THREAD_FLAG_IGNORE};
use weft_runtime::queue::IndexQueue;
use weft_runtime::slots;

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

/// The address of this thread's TLS slot: the thread pointer (which the x86-64 ABI
/// keeps at `fs:0`) plus the slot's offset.
fn tls_slot_address() -> u64 {
    let tp: u64;
    // SAFETY: fs:0 holds the thread control block's own address (x86-64 TLS ABI).
    unsafe { asm!("mov {}, qword ptr fs:[0]", out(reg) tp, options(nostack, readonly)) };
    tp.wrapping_add(tls_offset() as u64)
}

fn set_current(t: *mut AgentThread) {
    let off = tls_offset();
    // SAFETY: fs:[off] is this thread's TLS slot.
    unsafe { asm!("mov qword ptr fs:[{}], {}", in(reg) off, in(reg) t, options(nostack)) };
}

pub const POOL_THREADS: usize = weft_abi::AGENT_POOL_THREADS;
pub const SHADOW_ENTRIES: usize = 4096;

static POOL: AtomicPtr<AgentThread> = AtomicPtr::new(core::ptr::null_mut());
static SHADOWS: AtomicPtr<ShadowEntry> = AtomicPtr::new(core::ptr::null_mut());
/// The pool's gate: [`GATE_CLOSED`] while the pool is not mapped or being
/// released; the bits below count the threads inside a [`PoolHold`].
static GATE: AtomicU64 = AtomicU64::new(GATE_CLOSED);
const GATE_CLOSED: u64 = 1 << 63;
/// How far a release has gone (`STAGE_*`), for the child of a fork() made meanwhile.
static STAGE: AtomicU32 = AtomicU32::new(STAGE_NONE);
const STAGE_NONE: u32 = 0;
/// The gate is closed for a release; the pool is still published and mapped.
const STAGE_CLOSED: u32 = 1;
/// `POOL` is null, the mapping at [`RELEASING`] is still there.
const STAGE_UNPUBLISHED: u32 = 2;
/// The mapping is gone; the bookkeeping is not reset yet.
const STAGE_UNMAPPED: u32 = 3;
/// The thread table and shadow stacks being released (their addresses).
static RELEASING: [AtomicU64; 2] = [AtomicU64::new(0), AtomicU64::new(0)];
/// Serializes [`release`] and [`ensure`] (an ending control thread and the next
/// one). Not a `std` mutex: the child of a fork() made while a parent thread held
/// it frees it ([`after_fork_child`]).
static POOL_LOCK: AtomicBool = AtomicBool::new(false);
/// Bumped by every release: what the reaper learnt is about one pool's entries.
static EPOCH: AtomicU32 = AtomicU32::new(0);

struct PoolLock;

fn pool_lock() -> PoolLock {
    while POOL_LOCK
        .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
        .is_err()
    {
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    PoolLock
}

impl Drop for PoolLock {
    fn drop(&mut self) {
        POOL_LOCK.store(false, Ordering::Release);
    }
}

/// The pool's epoch (see [`EPOCH`]).
pub fn epoch() -> u32 {
    EPOCH.load(Ordering::Acquire)
}
/// Pool entries handed out at least once: `[0, NEXT)` (never above POOL_THREADS).
static NEXT: AtomicU32 = AtomicU32::new(0);
/// Pool entries whose thread is gone, ready for a new thread (pushed by the control
/// thread's reaper, popped by a thread's first use).
static FREE_HEAD: AtomicU64 = AtomicU64::new(0);
static FREE_TAIL: AtomicU64 = AtomicU64::new(0);
static FREE: [AtomicU32; POOL_THREADS] = [const { AtomicU32::new(0) }; POOL_THREADS];
/// Threads given an `AgentThread` so far (the reaper looks more often while it grows).
pub static STARTED: AtomicU64 = AtomicU64::new(0);
static PID: AtomicU32 = AtomicU32::new(0);
/// The thread-specific data key whose destructor tells the session a thread is
/// ending ([`thread_ending`]); `u32::MAX` when there is none (see [`init_exit_hook`]).
static EXIT_KEY: AtomicU32 = AtomicU32::new(u32::MAX);
/// glibc keeps the values of the first 32 keys in the thread's own descriptor
/// (`PTHREAD_KEY_2NDLEVEL_SIZE`); `pthread_setspecific` on a later key may allocate,
/// which a probe hit must not do.
const INLINE_KEYS: u32 = 32;

/// What the reaper needs to know about the thread holding a pool entry, written by
/// that thread when it takes the entry.
pub struct Record {
    /// `RECORD_*`.
    pub state: AtomicU32,
    /// Bumped each time the entry is handed to a thread.
    pub uses: AtomicU32,
    /// The thread's clear-child-tid address (`PR_GET_TID_ADDRESS`; glibc's
    /// `&pthread->tid`), 0 when unknown.
    pub tid_address: AtomicU64,
    /// Where the TLS slot that points at the entry lives (`fs:[tls_offset]` of the
    /// thread that took it). Until that word stops pointing at the entry (the TLS
    /// block reused by a new thread, which glibc zeroes, or unmapped), some thread
    /// may still reach the entry: a `vfork` child that took it on its parent's TLS,
    /// or a `clone(CLONE_VM)` child sharing its creator's, is gone long before the
    /// thread whose TLS it used.
    pub tls_slot: AtomicU64,
}

/// The entry is not handed out (never used, or free again).
pub const RECORD_FREE: u32 = 0;
/// A thread holds it; it may be running.
pub const RECORD_IN_USE: u32 = 1;
/// Its thread is gone but its shadow stack still holds a return address a frame
/// elsewhere (a coroutine's stack) may return through: not reused yet.
pub const RECORD_KEPT: u32 = 2;

pub static RECORDS: [Record; POOL_THREADS] = [const {
    Record {
        state: AtomicU32::new(RECORD_FREE),
        uses: AtomicU32::new(0),
        tid_address: AtomicU64::new(0),
        tls_slot: AtomicU64::new(0),
    }
}; POOL_THREADS];

fn free_list() -> IndexQueue<'static> {
    IndexQueue::new(&FREE_HEAD, &FREE_TAIL, &FREE)
}

const TABLE_BYTES: usize = POOL_THREADS * core::mem::size_of::<AgentThread>();
const SHADOW_BYTES: usize = POOL_THREADS * SHADOW_ENTRIES * core::mem::size_of::<ShadowEntry>();

/// At load: map the pool.
pub fn init() -> std::io::Result<()> {
    // SAFETY: getpid has no preconditions.
    PID.store(unsafe { libc::getpid() } as u32, Ordering::Relaxed);
    ensure()
}

/// Map the pool if it is not (at load, and when a control thread starts after a
/// [`release`]), and open its gate.
pub fn ensure() -> std::io::Result<()> {
    let _lock = pool_lock();
    if POOL.load(Ordering::Acquire).is_null() {
        let threads = map_anon(TABLE_BYTES)? as *mut AgentThread;
        let shadows = match map_anon(SHADOW_BYTES) {
            Ok(p) => p as *mut ShadowEntry,
            Err(e) => {
                // SAFETY: unmapping what we just mapped, never published.
                unsafe { libc::munmap(threads as *mut libc::c_void, TABLE_BYTES) };
                return Err(e);
            }
        };
        SHADOWS.store(shadows, Ordering::Release);
        POOL.store(threads, Ordering::Release);
    }
    GATE.fetch_and(!GATE_CLOSED, Ordering::SeqCst);
    Ok(())
}

/// Held by code that may touch the pool at any time, between sessions too (signal
/// handlers, the exit hook): while one is held, the pool is not released. Never
/// held across anything that may not return (the target's own handlers).
pub struct PoolHold(());

impl PoolHold {
    /// `None` while the pool is not mapped or being released.
    pub fn enter() -> Option<PoolHold> {
        let v = GATE.fetch_add(1, Ordering::SeqCst);
        if v & GATE_CLOSED != 0 {
            GATE.fetch_sub(1, Ordering::SeqCst);
            return None;
        }
        Some(PoolHold(()))
    }
}

impl Drop for PoolHold {
    fn drop(&mut self) {
        GATE.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Create the key whose destructor runs [`thread_ending`] in every thread that took
/// an `AgentThread`, as it exits (`pthread_exit` or a return from its start
/// routine): the session then stops counting it against `--max-threads` at once,
/// not when the reaper next looks (which a busy machine can delay by tens of
/// milliseconds, while hundreds of short threads start). Called once, at load.
/// Without a key (none left, or not one glibc keeps inline) the reaper alone does it.
pub fn init_exit_hook() {
    let mut key: libc::pthread_key_t = 0;
    // SAFETY: `key` is a valid out pointer; the destructor is a plain C function of
    // this library, which is never unloaded.
    if unsafe { libc::pthread_key_create(&mut key, Some(thread_ending)) } != 0 {
        return;
    }
    if key >= INLINE_KEYS {
        // SAFETY: the key was just created and holds no value anywhere.
        unsafe { libc::pthread_key_delete(key) };
        return;
    }
    EXIT_KEY.store(key, Ordering::Release);
}

/// The exit hook: the calling thread (whose `AgentThread` is `arg`) is ending.
extern "C" fn thread_ending(arg: *mut libc::c_void) {
    // Between sessions too: the pool may be released meanwhile, and then the
    // thread's slot is null.
    let Some(_hold) = PoolHold::enter() else {
        return;
    };
    let t = current();
    if t.is_null() || t as *mut libc::c_void != arg {
        return;
    }
    let _using = using_session(t);
    // SAFETY: our own AgentThread, used only by this thread.
    let th = unsafe { &*t };
    if let Some(s) = session::current() {
        if th.session == s.generation && !th.slot.is_null() {
            slots::thread_ending(&s.shm, th.slot);
        }
    }
}

/// The pid the agent's state belongs to (updated in the child of a fork()).
pub fn pid() -> u32 {
    PID.load(Ordering::Relaxed)
}

/// After fork() in the child: the pid changed and no session is ours. The child has
/// one thread, which holds no [`PoolHold`] (none is held across a fork): the holds
/// of the parent's other threads are not the child's. A release the parent was
/// making is undone or finished here, by how far it had gone.
pub fn after_fork_child() {
    // SAFETY: getpid has no preconditions.
    PID.store(unsafe { libc::getpid() } as u32, Ordering::Relaxed);
    POOL_LOCK.store(false, Ordering::Release);
    GATE.fetch_and(GATE_CLOSED, Ordering::SeqCst);
    match STAGE.load(Ordering::Acquire) {
        STAGE_NONE => {}
        STAGE_CLOSED => {
            // Nothing was changed yet: the pool is the child's as it was.
            STAGE.store(STAGE_NONE, Ordering::Release);
            GATE.fetch_and(!GATE_CLOSED, Ordering::SeqCst);
        }
        stage => {
            let table = RELEASING[0].load(Ordering::Acquire);
            // This thread's slot (the others are copies of threads the child does
            // not have; glibc sets up their TLS again before a new thread runs).
            let me = current() as u64;
            if me >= table && me < table + TABLE_BYTES as u64 {
                set_current(core::ptr::null_mut());
            }
            if stage == STAGE_UNPUBLISHED {
                // SAFETY: the mapping the parent was releasing, still here: no
                // thread of the child reaches it (its only thread's slot is null).
                unsafe {
                    libc::munmap(table as *mut libc::c_void, TABLE_BYTES);
                    libc::munmap(
                        RELEASING[1].load(Ordering::Acquire) as *mut libc::c_void,
                        SHADOW_BYTES,
                    );
                }
            }
            reset_bookkeeping();
        }
    }
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

/// Number of pool entries handed out at least once (`[0, n)`).
pub fn high_water() -> usize {
    (NEXT.load(Ordering::Acquire) as usize).min(POOL_THREADS)
}

/// Pool entry `i` (< [`high_water`]), of the mapped pool.
pub fn entry(i: usize) -> *mut AgentThread {
    debug_assert!(i < POOL_THREADS);
    // SAFETY: the pool has POOL_THREADS entries (an address is computed; callers
    // read it only while the pool is mapped: a session runs, or a hold is held).
    unsafe { POOL.load(Ordering::Acquire).add(i) }
}

/// Every `AgentThread` handed out so far (some may be free again).
pub fn all() -> impl Iterator<Item = *mut AgentThread> {
    let n = if POOL.load(Ordering::Acquire).is_null() {
        0
    } else {
        high_water()
    };
    (0..n).map(entry)
}

/// A pool entry for a new thread: one whose thread is gone, else one never used.
fn take_entry() -> Option<usize> {
    if let Some(i) = free_list().pop() {
        return Some(i as usize);
    }
    let mut n = NEXT.load(Ordering::Relaxed);
    loop {
        if n as usize >= POOL_THREADS {
            return None;
        }
        match NEXT.compare_exchange_weak(n, n + 1, Ordering::AcqRel, Ordering::Relaxed) {
            Ok(_) => return Some(n as usize),
            Err(now) => n = now,
        }
    }
}

/// This thread's state, created on first use. A new thread always starts with an
/// empty TLS slot (glibc zeroes a new thread's static TLS, even on a reused stack),
/// so it never inherits another thread's state, whatever its tid.
pub fn get_or_create() -> *mut AgentThread {
    let t = current();
    if !t.is_null() {
        return t;
    }
    if POOL.load(Ordering::Acquire).is_null() {
        return core::ptr::null_mut();
    }
    let Some(i) = take_entry() else {
        return core::ptr::null_mut();
    };
    let t = entry(i);
    let mut tid_address = 0u64;
    // SAFETY: entry i is ours alone: popped from the free list (the reaper emptied
    // its shadow stack and pushed it once its thread was gone) or fresh (zeroed
    // memory). `shadow_gc` and `shadow_thieves` are never reset: a thread looking for
    // a migrated frame may hold them. The system calls are gettid and
    // prctl(PR_GET_TID_ADDRESS), which writes 8 bytes to our local.
    unsafe {
        (*t).slot = core::ptr::null_mut();
        (*t).nest = 0;
        (*t).flags = 0;
        (*t).tid = raw_syscall(libc::SYS_gettid, 0, 0) as u32;
        (*t).pid = PID.load(Ordering::Relaxed);
        (*t).session = 0;
        if (*t).shadow.is_null() {
            // A fresh entry; a reused one keeps its stack (other threads may read
            // these two fields while they search it).
            (*t).shadow_cap = SHADOW_ENTRIES as u32;
            (*t).shadow = SHADOWS.load(Ordering::Acquire).add(i * SHADOW_ENTRIES);
        }
        (*t).rand = 0;
        (*t).busy = 0;
        (*t).around = 0;
        if raw_syscall(
            libc::SYS_prctl,
            libc::PR_GET_TID_ADDRESS as u64,
            &mut tid_address as *mut u64 as u64,
        ) != 0
        {
            tid_address = 0;
        }
    }
    let r = &RECORDS[i];
    r.tid_address.store(tid_address, Ordering::Relaxed);
    r.tls_slot.store(tls_slot_address(), Ordering::Relaxed);
    r.uses.fetch_add(1, Ordering::Relaxed);
    r.state.store(RECORD_IN_USE, Ordering::Release);
    STARTED.fetch_add(1, Ordering::Relaxed);
    set_current(t);
    let key = EXIT_KEY.load(Ordering::Acquire);
    if key != u32::MAX {
        // SAFETY: a key below 32, whose value glibc stores in the thread's own
        // descriptor (a few stores: no lock, no allocation, no system call).
        unsafe { libc::pthread_setspecific(key, t as *const libc::c_void) };
    }
    t
}

/// In the child of a fork() that stays woven (the session follows forks), while it
/// has one thread: the forking thread's entry becomes the child thread's (its tid
/// and pid are the child's; its slot, the parent thread's, is left to the parent:
/// it claims a slot of its own at its next hit); every other entry was a thread
/// of the parent that the child does not have, and is free again (without giving
/// back its slot: that is the parent thread's).
pub fn adopt_fork() {
    let me = current();
    for (i, r) in RECORDS.iter().enumerate().take(high_water()) {
        let t = entry(i);
        // SAFETY: the child has this one thread: no one else touches the pool.
        unsafe {
            (*t).slot = core::ptr::null_mut();
            if t == me {
                (*t).tid = raw_syscall(libc::SYS_gettid, 0, 0) as u32;
                (*t).pid = PID.load(Ordering::Relaxed);
                continue;
            }
            if r.state.load(Ordering::Acquire) == RECORD_FREE {
                continue;
            }
            AtomicU32::from_ptr(core::ptr::addr_of_mut!((*t).shadow_depth))
                .store(0, Ordering::Release);
        }
        r.state.store(RECORD_FREE, Ordering::Release);
        free_list().push(i as u32);
    }
}

/// A hit ran no advice because this thread has no `AgentThread` (the pool is
/// exhausted): count it in the session's `pool_dropped`.
///
/// Without an `AgentThread` there is no `busy` to raise; the session stays mapped
/// all the same, since weft frees it only once no thread's PC is in the agent's
/// text, and nothing between the load of the session and the add leaves it.
pub fn note_pool_miss() {
    if let Some(s) = session::current() {
        s.shm.header().pool_dropped.fetch_add(1, Ordering::Relaxed);
    }
}

/// The reaper found entry `i`'s thread gone: give up its slot in the current session
/// (weft drains and reuses it) and free the entry for a new thread, or keep it while
/// its shadow stack may still be returned through (`shadow_idle` says no).
///
/// Control thread only, for an entry whose thread runs no more user code: nothing
/// else writes the entry meanwhile (other threads only search its shadow stack).
pub fn reap(i: usize, shadow_idle: impl Fn(*mut AgentThread) -> bool) -> bool {
    let t = entry(i);
    let r = &RECORDS[i];
    if r.state.load(Ordering::Acquire) == RECORD_IN_USE {
        // SAFETY: the thread is gone; its AgentThread has no other writer.
        let th = unsafe { &mut *t };
        if let Some(s) = session::current() {
            if th.session == s.generation && !th.slot.is_null() {
                slots::release(&s.shm, th.slot);
            }
        }
        th.slot = core::ptr::null_mut();
        r.state.store(RECORD_KEPT, Ordering::Release);
    }
    if !shadow_idle(t) {
        return false;
    }
    // SAFETY: as above; a thread searching the stack sees no entry or a dead one.
    unsafe { AtomicU32::from_ptr(core::ptr::addr_of_mut!((*t).shadow_depth)) }
        .store(0, Ordering::Release);
    r.state.store(RECORD_FREE, Ordering::Release);
    free_list().push(i as u32);
    true
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
pub struct UsingSession {
    t: *mut AgentThread,
    /// Dropped after `busy` is lowered.
    _hold: Option<PoolHold>,
}

/// For the trampolines' slow path (a session's code: the pool is mapped).
pub fn using_session(t: *mut AgentThread) -> UsingSession {
    mark_busy(t);
    UsingSession { t, _hold: None }
}

/// For a signal handler, which may run between sessions: holds the pool (see
/// [`PoolHold`]) and marks this thread's state, created if need be (none while the
/// pool is not mapped).
pub fn hold_session() -> UsingSession {
    let Some(hold) = PoolHold::enter() else {
        return UsingSession {
            t: core::ptr::null_mut(),
            _hold: None,
        };
    };
    let t = get_or_create();
    mark_busy(t);
    UsingSession {
        t,
        _hold: Some(hold),
    }
}

fn mark_busy(t: *mut AgentThread) {
    if !t.is_null() {
        // SAFETY: our own pool AgentThread; weft reads `busy` with the world stopped.
        unsafe {
            let p = core::ptr::addr_of_mut!((*t).busy);
            p.write_volatile(p.read_volatile() + 1);
        }
        core::sync::atomic::fence(Ordering::SeqCst);
    }
}

impl Drop for UsingSession {
    fn drop(&mut self) {
        if !self.t.is_null() {
            core::sync::atomic::fence(Ordering::SeqCst);
            // SAFETY: as in `mark_busy`; the pool is still held.
            unsafe {
                let p = core::ptr::addr_of_mut!((*self.t).busy);
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
        note_pool_miss();
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
    let Some(slot) = slots::claim(&s.shm, th.pid, th.tid) else {
        s.shm
            .header()
            .threads_dropped
            .fetch_add(1, Ordering::Relaxed);
        return core::ptr::null_mut();
    };
    let mut name = [0u8; 16];
    // SAFETY: prctl(PR_GET_NAME) writes at most 16 bytes into `name`; the slot is
    // ours (claimed), and `comm` and `pcomm` are read only by advice on this thread.
    unsafe {
        raw_syscall(
            libc::SYS_prctl,
            libc::PR_GET_NAME as u64,
            name.as_mut_ptr() as u64,
        );
        (*slot).comm = name;
        (*slot).pcomm = s.pcomm;
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

/// Why [`release`] kept the pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kept {
    /// A control thread or a session is there (or coming).
    InUse,
    /// A session was leaked (weft died, or it was abandoned): its code stays
    /// mapped and a thread may still run through it.
    Leaked,
    /// A thread stayed inside a [`PoolHold`] (a signal handler, the exit hook).
    Held,
    /// A gone thread's shadow stack may still be returned through (a coroutine).
    Coroutine,
    /// A thread has a hijacked return outstanding, or is inside advice.
    Pending,
    /// The threads' TLS slots could not be read or written (`process_vm_*`).
    NoVm,
    /// The pool is not mapped.
    NotMapped,
}

/// Give the pool back (unmap the thread table and the shadow stacks) once no
/// thread can reach it: the control thread, at the end of the last session, when no
/// control thread is coming (`idle`, asked under the lock). Refused (and kept, the
/// reason returned) when it is doubtful: a leaked session, an entry kept for a
/// coroutine, a return still hijacked, a thread inside advice or a [`PoolHold`].
/// Every TLS slot that points into the pool is nulled first, through
/// `process_vm_readv`/`process_vm_writev` on our own process (a TLS block unmapped
/// meanwhile reads as a hole, not a fault); a thread takes a new entry at its next
/// hit in a later session.
pub fn release(idle: impl Fn() -> bool, leaked: bool) -> Result<(), Kept> {
    let _lock = pool_lock();
    let table = POOL.load(Ordering::Acquire);
    if table.is_null() {
        return Err(Kept::NotMapped);
    }
    if !idle() {
        return Err(Kept::InUse);
    }
    if leaked {
        return Err(Kept::Leaked);
    }
    STAGE.store(STAGE_CLOSED, Ordering::Release);
    GATE.fetch_or(GATE_CLOSED, Ordering::SeqCst);
    let reopen = |why: Kept| {
        GATE.fetch_and(!GATE_CLOSED, Ordering::SeqCst);
        STAGE.store(STAGE_NONE, Ordering::Release);
        Err(why)
    };
    // Holds are short (a handler's look at an absent session, the exit hook).
    let start = std::time::Instant::now();
    while GATE.load(Ordering::SeqCst) & !GATE_CLOSED != 0 {
        if start.elapsed() > std::time::Duration::from_millis(200) {
            return reopen(Kept::Held);
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    if !idle() {
        return reopen(Kept::InUse);
    }
    let n = high_water();
    let mut slots: Vec<u64> = Vec::new();
    for (i, r) in RECORDS.iter().enumerate().take(n) {
        match r.state.load(Ordering::Acquire) {
            RECORD_KEPT => return reopen(Kept::Coroutine),
            RECORD_IN_USE => {}
            _ => continue,
        }
        let t = entry(i);
        // SAFETY: a pool entry; these fields are read racily, as weft's
        // quiescence checks do (no session: nothing raises them any more).
        let (nest, busy, around) = unsafe {
            (
                core::ptr::addr_of!((*t).nest).read_volatile(),
                core::ptr::addr_of!((*t).busy).read_volatile(),
                core::ptr::addr_of!((*t).around).read_volatile(),
            )
        };
        if nest != 0 || busy != 0 || around != 0 || !crate::ret::pending_slots(t).is_empty() {
            return reopen(Kept::Pending);
        }
        let slot = r.tls_slot.load(Ordering::Relaxed);
        if slot != 0 {
            slots.push(slot);
        }
    }
    // Only the slots that point into the table are nulled (a TLS block reused by a
    // new thread holds 0 or that thread's own entry, recorded too).
    let lo = table as u64;
    let hi = lo + TABLE_BYTES as u64;
    let Ok(values) = crate::reap::read_own(&slots, 8) else {
        return reopen(Kept::NoVm);
    };
    let into: Vec<u64> = slots
        .iter()
        .zip(values)
        .filter(|(_, v)| v.is_some_and(|v| v >= lo && v < hi))
        .map(|(&a, _)| a)
        .collect();
    let shadows = SHADOWS.load(Ordering::Acquire);
    RELEASING[0].store(lo, Ordering::Release);
    RELEASING[1].store(shadows as u64, Ordering::Release);
    // Unpublished first: a fork() child from now on finishes the release itself.
    POOL.store(core::ptr::null_mut(), Ordering::Release);
    SHADOWS.store(core::ptr::null_mut(), Ordering::Release);
    STAGE.store(STAGE_UNPUBLISHED, Ordering::Release);
    if crate::reap::zero_own(&into).is_err() {
        // Some slots may be nulled already: their threads take new entries. The
        // pool stays, published again.
        SHADOWS.store(shadows, Ordering::Release);
        POOL.store(table, Ordering::Release);
        return reopen(Kept::NoVm);
    }
    // SAFETY: no TLS slot points into the pool any more, no thread holds it (the
    // gate is closed and drained), no session's code or hijacked return leads into
    // it (checked above): nothing reaches these mappings.
    unsafe {
        libc::munmap(table as *mut libc::c_void, TABLE_BYTES);
        libc::munmap(shadows as *mut libc::c_void, SHADOW_BYTES);
    }
    STAGE.store(STAGE_UNMAPPED, Ordering::Release);
    reset_bookkeeping();
    Ok(())
}

/// The pool is gone: no entry is handed out, none is free.
fn reset_bookkeeping() {
    NEXT.store(0, Ordering::Release);
    FREE_HEAD.store(0, Ordering::Release);
    FREE_TAIL.store(0, Ordering::Release);
    for f in &FREE {
        f.store(0, Ordering::Relaxed);
    }
    for r in &RECORDS {
        r.state.store(RECORD_FREE, Ordering::Relaxed);
        r.uses.store(0, Ordering::Relaxed);
        r.tid_address.store(0, Ordering::Relaxed);
        r.tls_slot.store(0, Ordering::Relaxed);
    }
    RELEASING[0].store(0, Ordering::Release);
    RELEASING[1].store(0, Ordering::Release);
    EPOCH.fetch_add(1, Ordering::AcqRel);
    STAGE.store(STAGE_NONE, Ordering::Release);
}
