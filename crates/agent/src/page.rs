//! Data pointcuts by page protection (`--data-mechanism page`, and the fallback
//! for a watch a hardware watchpoint cannot take): KLAS's and Arachne's local
//! aliases.
//!
//! The pages holding a page watch's bytes are `mprotect`ed: `PROT_READ` when every
//! watch on the page is a `set`, `PROT_NONE` when one reads (`get`, `rw`). What
//! they were is read from `/proc/self/maps` when a page is first protected and put
//! back when no watch is left on it ([`protect`], [`restore_all`]: the session's
//! end, weft gone, a `fork` child).
//!
//! A fault on such a page (`SEGV_ACCERR` at an address of a protected page, and not
//! at one of the runtime's fault-tolerant reads) is weft's ([`on_segv`]). The
//! faulting instruction is decoded (iced-x86) for the address and size of its
//! memory operand; the watches it overlaps read their `old` value (through
//! `/proc/self/mem`, which reads and writes whatever the protection); the access
//! is done, then [`on_trap`] reads `new` and runs the advice of the watches that
//! match (`set`: the access wrote; `get`: it read without writing; `rw`: any). An
//! access to the page that overlaps no watch (unrelated data sharing the page) is
//! done the same way, without advice.
//!
//! **Threads.** The page is never opened for the accessing thread, so no other
//! thread can slip an access through meanwhile: the instruction is *emulated out
//! of line*. Its memory operand is re-encoded as `[R]` (R a register the
//! instruction does not name, its value saved), the bytes it accesses are copied
//! into a buffer of the thread's emulation slot (same alignment modulo 64), and the
//! re-encoded instruction runs in the slot's code, followed by an `int3`; the trap
//! puts R and `rip` back and copies the bytes back if they changed. Every thread
//! that faults on a page takes the page's lock (a spin with `sched_yield`: the
//! holder is one instruction from releasing it) from the fault to the trap, so
//! accesses to a protected page are serialized and none is missed or torn by
//! another's copy. An operand that runs into the next page (memcpy's unaligned
//! vector stores) takes that page's lock too, without waiting: if another thread
//! holds it, this one lets its own go and faults again, so two threads never wait
//! for each other. `stos` and `movs` (`rep` or not: large `memset`/`memcpy`) are
//! done by the handler itself through `/proc/self/mem`, a page at a time, the
//! registers advanced as the CPU would, and the instruction resumed for the rest
//! ([`string_op`]). The handlers allocate nothing: iced's decoder tables, built on
//! the heap at first use, are built by the control thread before a page is
//! protected (a `malloc` in the handler touched the protected heap page and killed
//! the target). Instructions that still cannot be moved (pushes and pops, branches
//! through memory, other string instructions, backward or overlapping string
//! copies, gathers and scatters) are single-stepped in place: the page is opened with
//! its original protection, the trap flag set, and re-protected at the step's trap.
//! Threads that faulted on the page wait on its lock meanwhile; an access by a
//! thread that did not fault because the page was open during that one instruction
//! is not seen (the remaining limit; no such instruction touches a heap or data
//! page in the tests, which count exactly with 4 threads and malloc/stdio traffic on
//! the page).
//!
//! A fault on a watched page that the emulation cannot complete (the bytes cannot be
//! read: a truly bad access) goes to the target's disposition as it would have.

use core::cell::UnsafeCell;
use core::sync::atomic::{AtomicI32, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering};

use iced_x86::{Decoder, DecoderOptions, Encoder, FlowControl, Instruction, OpKind, Register};
use weft_abi::{MAX_WATCHES, WATCH_PAGE, WATCH_RW, WATCH_UNCHANGED_ONLY};

use crate::{session, threads, watch};

const PAGE: u64 = 4096;
const SEGV_ACCERR: i32 = 2;
const SI_KERNEL: i32 = 0x80;
const TRAP_TRACE: i32 = 2;
const EFLAGS_TF: i64 = 1 << 8;
/// The page-fault error code's write bit (`uc_mcontext.gregs[REG_ERR]`).
const PF_WRITE: i64 = 2;

/// Most pages protected at once (watches of up to 4 MiB together).
const MAX_PAGES: usize = 1024;
/// Most threads inside an access to a protected page at once.
const SLOTS: usize = 64;
const CODE_BYTES: usize = 64;
const DATA_BYTES: usize = 256;

/// One protected page (`addr == 0`: free).
struct Page {
    addr: AtomicU64,
    /// Its protection before weft.
    orig: AtomicU32,
    /// The protection weft gave it.
    prot: AtomicU32,
    /// The thread inside an access to it (0: none).
    lock: AtomicI32,
}

static PAGES: [Page; MAX_PAGES] = [const {
    Page {
        addr: AtomicU64::new(0),
        orig: AtomicU32::new(0),
        prot: AtomicU32::new(0),
        lock: AtomicI32::new(0),
    }
}; MAX_PAGES];
/// Pages in use (an upper bound of the used prefix of [`PAGES`]).
static USED: AtomicUsize = AtomicUsize::new(0);

#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// The instruction runs in the slot's code on the slot's copy.
    Emulate,
    /// The instruction is single-stepped in place, its pages open.
    Step,
}

/// What a thread inside an access remembers from the fault to the trap.
struct Pending {
    mode: Mode,
    /// The faulting instruction, and the one after it.
    ip: u64,
    next_ip: u64,
    /// The memory operand: address and size.
    addr: u64,
    size: usize,
    /// The fault was a write.
    wrote: bool,
    /// Emulate: the register that points at the copy, and its own value.
    reg: usize,
    reg_value: i64,
    /// The thread's signal mask, restored at the trap (asynchronous signals are
    /// blocked from the fault to the trap: a handler touching the page meanwhile
    /// would find it locked by its own thread).
    sigmask: u64,
    /// Pages locked (indices in [`PAGES`]).
    pages: [usize; 4],
    npages: usize,
    /// Watches the access overlaps, and for each the address and size of the value
    /// reported and its value before.
    hits: u32,
    at: [u64; MAX_WATCHES],
    len: [u8; MAX_WATCHES],
    old: [u64; MAX_WATCHES],
}

struct Slot {
    owner: AtomicI32,
    pending: UnsafeCell<Pending>,
    encoder: UnsafeCell<Option<Encoder>>,
}

// SAFETY: a slot's cells are used only by the thread that owns it (`owner`).
unsafe impl Sync for Slot {}

struct Pool {
    slots: Box<[Slot]>,
    /// CODE_BYTES per slot, read-write-execute.
    code: u64,
    /// DATA_BYTES per slot (64-aligned): the copy at +0..128, the original at +128.
    data: u64,
}

static POOL: AtomicPtr<Pool> = AtomicPtr::new(core::ptr::null_mut());
/// Slots owned (a cheap test for the trap handler).
static BUSY: AtomicUsize = AtomicUsize::new(0);

/// Made once, by the control thread, before the first page is protected (no
/// allocation happens in the handlers).
fn pool() -> Result<&'static Pool, String> {
    let p = POOL.load(Ordering::Acquire);
    if !p.is_null() {
        // SAFETY: leaked, never freed.
        return Ok(unsafe { &*p });
    }
    let map = |len: usize, prot: i32| -> Result<u64, String> {
        // SAFETY: a fresh anonymous mapping.
        let a = unsafe {
            libc::mmap(
                core::ptr::null_mut(),
                len,
                prot,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if a == libc::MAP_FAILED {
            return Err(format!(
                "page watches: mmap: {}",
                std::io::Error::last_os_error()
            ));
        }
        Ok(a as u64)
    };
    let code = map(
        SLOTS * CODE_BYTES,
        libc::PROT_READ | libc::PROT_WRITE | libc::PROT_EXEC,
    )?;
    let data = map(SLOTS * DATA_BYTES, libc::PROT_READ | libc::PROT_WRITE)?;
    let slots = (0..SLOTS).map(|_| Slot {
        owner: AtomicI32::new(0),
        pending: UnsafeCell::new(Pending {
            mode: Mode::Emulate,
            ip: 0,
            next_ip: 0,
            addr: 0,
            size: 0,
            wrote: false,
            reg: 0,
            reg_value: 0,
            sigmask: 0,
            pages: [0; 4],
            npages: 0,
            hits: 0,
            at: [0; MAX_WATCHES],
            len: [0; MAX_WATCHES],
            old: [0; MAX_WATCHES],
        }),
        encoder: UnsafeCell::new(Encoder::try_with_capacity(64, 64).ok()),
    });
    let slots = slots.collect();
    // iced's decoder builds its tables (on the heap) at its first use: here, not
    // in the SIGSEGV handler, where that `malloc` may touch a protected heap page
    // (a fault inside the handler: the target died) or deadlock on an arena lock
    // the interrupted code holds.
    let _ = Decoder::with_ip(64, &[0x90], 0, DecoderOptions::NONE).decode();
    let pool = Box::into_raw(Box::new(Pool { slots, code, data }));
    POOL.store(pool, Ordering::Release);
    // SAFETY: just leaked.
    Ok(unsafe { &*pool })
}

fn tid() -> i32 {
    // SAFETY: gettid takes no arguments.
    unsafe { threads::raw_syscall(libc::SYS_gettid, 0, 0) as i32 }
}

fn sched_yield() {
    // SAFETY: sched_yield takes no arguments.
    unsafe { threads::raw_syscall(libc::SYS_sched_yield, 0, 0) };
}

fn mprotect(page: u64, prot: u32) -> i64 {
    // SAFETY: changes the protection of one page weft watches (or gives back the
    // one it had).
    unsafe { libc::syscall(libc::SYS_mprotect, page, PAGE, u64::from(prot)) }
}

fn lock(p: &Page, me: i32) {
    while p
        .lock
        .compare_exchange(0, me, Ordering::Acquire, Ordering::Relaxed)
        .is_err()
    {
        sched_yield();
    }
}

/// `len` bytes at `addr` through `/proc/self/mem` (whatever the protection).
fn mem_read(addr: u64, buf: *mut u8, len: usize) -> bool {
    let fd = crate::patch::mem_fd();
    // SAFETY: `buf` holds `len` writable bytes.
    fd >= 0
        && unsafe { libc::pread(fd, buf as *mut libc::c_void, len, addr as i64) } == len as isize
}

fn mem_write(addr: u64, buf: *const u8, len: usize) -> bool {
    let fd = crate::patch::mem_fd();
    // SAFETY: `buf` holds `len` readable bytes.
    fd >= 0
        && unsafe { libc::pwrite(fd, buf as *const libc::c_void, len, addr as i64) } == len as isize
}

fn mem_value(addr: u64, len: u8) -> u64 {
    let mut v = 0u64;
    mem_read(addr, &mut v as *mut u64 as *mut u8, usize::from(len.min(8)));
    v
}

/// The protection page `page` had, from `/proc/self/maps`.
fn original_prot(page: u64) -> Option<u32> {
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    for l in maps.lines() {
        let mut f = l.split_whitespace();
        let (range, perms) = (f.next()?, f.next()?);
        let (a, b) = range.split_once('-')?;
        let (a, b) = (
            u64::from_str_radix(a, 16).ok()?,
            u64::from_str_radix(b, 16).ok()?,
        );
        if a <= page && page < b {
            let p = perms.as_bytes();
            let mut prot = 0;
            if p[0] == b'r' {
                prot |= libc::PROT_READ as u32;
            }
            if p[1] == b'w' {
                prot |= libc::PROT_WRITE as u32;
            }
            if p[2] == b'x' {
                prot |= libc::PROT_EXEC as u32;
            }
            return Some(prot);
        }
    }
    None
}

/// Whether pages are protected (or were, in this process).
pub fn active() -> bool {
    USED.load(Ordering::Acquire) != 0
}

fn find(page: u64) -> Option<usize> {
    let n = USED.load(Ordering::Acquire).min(MAX_PAGES);
    (0..n).find(|&i| PAGES[i].addr.load(Ordering::Acquire) == page)
}

/// Protect the pages the session's page watches need, and give back their
/// protection to those no watch is on any more. Control thread only.
pub fn protect(s: &session::Session) -> Result<(), String> {
    pool()?;
    crate::patch::open_mem();
    // What each page needs: READ (writes fault) or NONE (every access faults).
    let mut want: Vec<(u64, u32)> = Vec::new();
    for w in &s.watches {
        let len = u64::from(w.len.load(Ordering::Acquire));
        let access = w.access.load(Ordering::Acquire);
        if len == 0 || access & WATCH_PAGE == 0 {
            continue;
        }
        let addr = w.addr.load(Ordering::Acquire);
        let reads = access & 0xff == WATCH_RW;
        let mut p = addr & !(PAGE - 1);
        while p < addr + len {
            match want.iter_mut().find(|(a, _)| *a == p) {
                Some((_, r)) => *r |= u32::from(reads),
                None => want.push((p, u32::from(reads))),
            }
            p += PAGE;
        }
    }
    let me = tid();
    // Pages no longer wanted: back to what they were.
    for pg in PAGES
        .iter()
        .take(USED.load(Ordering::Acquire).min(MAX_PAGES))
    {
        let a = pg.addr.load(Ordering::Acquire);
        if a != 0 && !want.iter().any(|(w, _)| *w == a) {
            lock(pg, me);
            mprotect(a, pg.orig.load(Ordering::Acquire));
            pg.addr.store(0, Ordering::Release);
            pg.lock.store(0, Ordering::Release);
        }
    }
    for (a, reads) in want {
        let i = match find(a) {
            Some(i) => i,
            None => {
                let orig =
                    original_prot(a).ok_or_else(|| format!("page watch: {a:#x} is not mapped"))?;
                let i = (0..MAX_PAGES)
                    .find(|&i| {
                        PAGES[i].lock.load(Ordering::Acquire) == 0
                            && PAGES[i]
                                .addr
                                .compare_exchange(0, u64::MAX, Ordering::AcqRel, Ordering::Relaxed)
                                .is_ok()
                    })
                    .ok_or_else(|| format!("page watches: more than {MAX_PAGES} pages"))?;
                PAGES[i].orig.store(orig, Ordering::Release);
                PAGES[i].prot.store(orig, Ordering::Release);
                USED.fetch_max(i + 1, Ordering::AcqRel);
                PAGES[i].addr.store(a, Ordering::Release);
                i
            }
        };
        let pg = &PAGES[i];
        let orig = pg.orig.load(Ordering::Acquire);
        let prot = if reads != 0 {
            libc::PROT_NONE as u32
        } else {
            orig & !(libc::PROT_WRITE as u32)
        };
        if pg.prot.load(Ordering::Acquire) != prot {
            lock(pg, me);
            let r = mprotect(a, prot);
            pg.prot.store(prot, Ordering::Release);
            pg.lock.store(0, Ordering::Release);
            if r != 0 {
                return Err(format!(
                    "page watch: mprotect {a:#x}: {}",
                    std::io::Error::last_os_error()
                ));
            }
        }
    }
    Ok(())
}

/// Give every protected page back its protection (the session's end, weft gone).
pub fn restore_all() {
    let me = tid();
    for pg in PAGES
        .iter()
        .take(USED.load(Ordering::Acquire).min(MAX_PAGES))
    {
        let a = pg.addr.load(Ordering::Acquire);
        if a != 0 && a != u64::MAX {
            lock(pg, me);
            mprotect(a, pg.orig.load(Ordering::Acquire));
            pg.addr.store(0, Ordering::Release);
            pg.lock.store(0, Ordering::Release);
        }
    }
}

/// In the child of a `fork()` (one thread): its pages were copied protected and
/// it has no session of its own; give them back their protection. Raw system
/// calls only.
pub fn after_fork_child() {
    for pg in PAGES
        .iter()
        .take(USED.load(Ordering::Acquire).min(MAX_PAGES))
    {
        let a = pg.addr.load(Ordering::Acquire);
        if a != 0 && a != u64::MAX {
            mprotect(a, pg.orig.load(Ordering::Acquire));
            pg.addr.store(0, Ordering::Release);
        }
        pg.lock.store(0, Ordering::Release);
    }
    for s in pool_slots() {
        s.owner.store(0, Ordering::Release);
    }
    BUSY.store(0, Ordering::Release);
}

fn pool_slots() -> &'static [Slot] {
    let p = POOL.load(Ordering::Acquire);
    if p.is_null() {
        &[]
    } else {
        // SAFETY: leaked, never freed.
        unsafe { &(*p).slots }
    }
}

/// The agent's SIGSEGV handler: a fault on a watched page is weft's; the rest
/// goes to the runtime's (fault-tolerant reads, then the target's disposition).
pub(crate) extern "C" fn on_segv(
    sig: libc::c_int,
    info: *mut libc::siginfo_t,
    ctx: *mut libc::c_void,
) {
    // SAFETY: SA_SIGINFO handlers get valid siginfo and ucontext.
    let (si, uc) = unsafe { (&*info, &mut *(ctx as *mut libc::ucontext_t)) };
    let ip = uc.uc_mcontext.gregs[libc::REG_RIP as usize] as u64;
    if si.si_code == SEGV_ACCERR
        && USED.load(Ordering::Acquire) != 0
        && weft_runtime::safe::fixup_for(ip).is_none()
    {
        // SAFETY: a SIGSEGV's siginfo has si_addr.
        let addr = unsafe { si.si_addr() } as u64;
        if on_fault(addr, uc) {
            return;
        }
    }
    weft_runtime::safe::on_fault(sig, info, ctx);
}

/// Signals an instruction raises itself: never blocked between a fault and its
/// trap.
const SYNCHRONOUS: u64 = (1 << (libc::SIGTRAP - 1))
    | (1 << (libc::SIGSEGV - 1))
    | (1 << (libc::SIGBUS - 1))
    | (1 << (libc::SIGILL - 1))
    | (1 << (libc::SIGFPE - 1));

/// The registers of a ucontext in iced's terms (`gregs` index of a 64-bit one).
fn greg(r: Register) -> Option<usize> {
    Some(match r {
        Register::RAX => libc::REG_RAX,
        Register::RBX => libc::REG_RBX,
        Register::RCX => libc::REG_RCX,
        Register::RDX => libc::REG_RDX,
        Register::RSI => libc::REG_RSI,
        Register::RDI => libc::REG_RDI,
        Register::RBP => libc::REG_RBP,
        Register::RSP => libc::REG_RSP,
        Register::R8 => libc::REG_R8,
        Register::R9 => libc::REG_R9,
        Register::R10 => libc::REG_R10,
        Register::R11 => libc::REG_R11,
        Register::R12 => libc::REG_R12,
        Register::R13 => libc::REG_R13,
        Register::R14 => libc::REG_R14,
        Register::R15 => libc::REG_R15,
        Register::RIP => libc::REG_RIP,
        _ => return None,
    } as usize)
}

fn segment_base(code: u64) -> u64 {
    let mut v = 0u64;
    // SAFETY: arch_prctl(ARCH_GET_FS/GS) writes the base at `v`.
    unsafe { libc::syscall(libc::SYS_arch_prctl, code, &mut v as *mut u64) };
    v
}

pub(crate) fn register_value(uc: &libc::ucontext_t, r: Register) -> Option<u64> {
    match r {
        Register::ES | Register::CS | Register::SS | Register::DS => return Some(0),
        Register::FS => return Some(segment_base(0x1003)),
        Register::GS => return Some(segment_base(0x1004)),
        _ => {}
    }
    let full = r.full_register();
    let v = uc.uc_mcontext.gregs[greg(full)?] as u64;
    Some(match r.size() {
        8 => v,
        4 => v & 0xffff_ffff,
        2 => v & 0xffff,
        _ => return None,
    })
}

/// The scratch registers an emulated instruction's operand may be rebased on.
const SCRATCH: [Register; 9] = [
    Register::R11,
    Register::R10,
    Register::R9,
    Register::R8,
    Register::R15,
    Register::R14,
    Register::R13,
    Register::R12,
    Register::RBX,
];

/// A fault at `addr`: weft's if its page is protected for a watch.
fn on_fault(addr: u64, uc: &mut libc::ucontext_t) -> bool {
    let Some(pi) = find(addr & !(PAGE - 1)) else {
        return false;
    };
    let Ok(pool) = pool_ready() else {
        return false;
    };
    let me = tid();
    // Already inside an access (a step touching a second watched page): open that
    // page too, for the rest of the step.
    if let Some(si) = owned(pool, me) {
        // SAFETY: our own slot.
        let p = unsafe { &mut *pool.slots[si].pending.get() };
        if p.mode == Mode::Step && p.npages < p.pages.len() && !p.pages[..p.npages].contains(&pi) {
            lock(&PAGES[pi], me);
            mprotect(
                PAGES[pi].addr.load(Ordering::Acquire),
                PAGES[pi].orig.load(Ordering::Acquire),
            );
            p.pages[p.npages] = pi;
            p.npages += 1;
            return true;
        }
        return false;
    }
    let page = &PAGES[pi];
    lock(page, me);
    // Given back meanwhile: run the instruction again.
    if page.addr.load(Ordering::Acquire) != addr & !(PAGE - 1)
        || page.prot.load(Ordering::Acquire) == page.orig.load(Ordering::Acquire)
    {
        page.lock.store(0, Ordering::Release);
        return true;
    }
    let ip = uc.uc_mcontext.gregs[libc::REG_RIP as usize] as u64;
    let mut bytes = [0u8; 16];
    let got = weft_runtime::safe::copy(&mut bytes, ip);
    let mut dec = Decoder::with_ip(64, &bytes[..got], ip, DecoderOptions::NONE);
    let ins = dec.decode();
    if ins.is_invalid() {
        page.lock.store(0, Ordering::Release);
        return false;
    }
    if let Some(r) = string_op(pi, me, &ins, uc) {
        return r;
    }
    let Some(si) = claim(pool, me) else {
        // Every slot busy: let another thread finish, and fault again.
        page.lock.store(0, Ordering::Release);
        sched_yield();
        return true;
    };
    let slot = &pool.slots[si];
    // SAFETY: our own slot.
    let p = unsafe { &mut *slot.pending.get() };
    let release = |page: &Page| {
        page.lock.store(0, Ordering::Release);
        release(pool, si);
    };
    // The memory operand: exactly one explicit one emulates.
    let mut mem_op = None;
    let mut others = false;
    for i in 0..ins.op_count() {
        match ins.op_kind(i) {
            OpKind::Memory if mem_op.is_none() => mem_op = Some(i),
            OpKind::Memory => others = true,
            k if is_implicit_memory(k) => others = true,
            _ => {}
        }
    }
    let (maddr, msize) = match mem_op
        .or_else(|| (0..ins.op_count()).find(|&i| is_implicit_memory(ins.op_kind(i))))
    {
        Some(i) => (
            ins.virtual_address(i, 0, |r, _, _| register_value(uc, r))
                .unwrap_or(addr),
            ins.memory_size().size().max(1),
        ),
        None => (addr, 1),
    };
    // SAFETY: the kernel's page-fault error code is in the saved context.
    let wrote = uc.uc_mcontext.gregs[libc::REG_ERR as usize] & PF_WRITE != 0;
    *p = Pending {
        mode: Mode::Emulate,
        ip,
        next_ip: ip + ins.len() as u64,
        addr: maddr,
        size: msize,
        wrote,
        reg: 0,
        reg_value: 0,
        sigmask: 0,
        pages: [pi, 0, 0, 0],
        npages: 1,
        hits: 0,
        at: p.at,
        len: p.len,
        old: p.old,
    };
    // The watches the access overlaps, and their values before it.
    if let Some(s) = session::current() {
        for (wi, w) in s.watches.iter().enumerate() {
            // Hardware watches too: the emulated access is the kernel's write
            // through /proc/self/mem, which no debug register sees.
            let len = u64::from(w.len.load(Ordering::Acquire));
            if len == 0 {
                continue;
            }
            let wa = w.addr.load(Ordering::Acquire);
            let (a, e) = (maddr, maddr + msize as u64);
            if a < wa + len && wa < e {
                // Up to 8 bytes reported: the watch's own, or (a wider one) those
                // the access starts at.
                let at = if len <= 8 { wa } else { a.max(wa) };
                let n = (wa + len - at).min(8) as u8;
                p.hits |= 1 << wi;
                p.at[wi] = at;
                p.len[wi] = n;
                p.old[wi] = mem_value(at, n);
            }
        }
    }
    // SAFETY: the first 8 bytes of the saved sigset are signals 1 to 64.
    let saved = unsafe { &mut *(&mut uc.uc_sigmask as *mut libc::sigset_t as *mut u64) };
    p.sigmask = *saved;
    *saved = !SYNCHRONOUS;
    let movable = mem_op.is_some()
        && !others
        && !ins.is_vsib()
        && ins.flow_control() == FlowControl::Next
        && ins.stack_pointer_increment() == 0
        && (1..=64).contains(&msize);
    // An operand that runs into the next page (an unaligned vector store of
    // memcpy's): that page's lock too, if it is protected. Taken without waiting
    // (its holder may be waiting for ours): on failure, back off and fault again.
    let last = (maddr + msize as u64 - 1) & !(PAGE - 1);
    if movable && last != maddr & !(PAGE - 1) {
        if let Some(pj) = find(last).filter(|&pj| pj != pi) {
            if PAGES[pj]
                .lock
                .compare_exchange(0, me, Ordering::Acquire, Ordering::Relaxed)
                .is_err()
            {
                *saved = p.sigmask;
                release(page);
                sched_yield();
                return true;
            }
            p.pages[1] = pj;
            p.npages = 2;
        }
    }
    if movable && emulate(pool, si, p, &ins, uc) {
        return true;
    }
    // Single-step in place, the page(s) open.
    p.mode = Mode::Step;
    for &pj in &p.pages[..p.npages] {
        mprotect(
            PAGES[pj].addr.load(Ordering::Acquire),
            PAGES[pj].orig.load(Ordering::Acquire),
        );
    }
    uc.uc_mcontext.gregs[libc::REG_EFL as usize] |= EFLAGS_TF;
    true
}

/// `stos` and `movs` (byte to quad, `rep` or not, forward, 64-bit addresses: what
/// `memset` and `memcpy` use for large sizes) are done here, through
/// `/proc/self/mem`, for the part on the faulting page (and on the other
/// operand's page: at most one page each): the registers advance as the CPU's
/// would, and the instruction resumes for the rest (faulting again at the next
/// protected page). The page is never opened. `None`: not such an instruction (or
/// one this does not take: `std`, overlapping forward copies, a segment prefix);
/// `Some(true)`: done (or backed off, to fault again); `Some(false)`: the bytes
/// cannot be read or written (a real fault). Called with page `pi` locked; returns
/// with it unlocked unless `None`.
fn string_op(pi: usize, me: i32, ins: &Instruction, uc: &mut libc::ucontext_t) -> Option<bool> {
    use iced_x86::Code;
    const EFLAGS_DF: i64 = 1 << 10;
    let (e, movs) = match ins.code() {
        Code::Stosb_m8_AL => (1u64, false),
        Code::Stosw_m16_AX => (2, false),
        Code::Stosd_m32_EAX => (4, false),
        Code::Stosq_m64_RAX => (8, false),
        Code::Movsb_m8_m8 => (1, true),
        Code::Movsw_m16_m16 => (2, true),
        Code::Movsd_m32_m32 => (4, true),
        Code::Movsq_m64_m64 => (8, true),
        _ => return None,
    };
    let g = &uc.uc_mcontext.gregs;
    if ins.op_kind(0) != OpKind::MemoryESRDI
        || (movs && ins.op_kind(1) != OpKind::MemorySegRSI)
        || ins.segment_prefix() != Register::None
        || g[libc::REG_EFL as usize] & EFLAGS_DF != 0
    {
        return None;
    }
    let rep = ins.has_rep_prefix() || ins.has_repne_prefix();
    let count = if rep {
        g[libc::REG_RCX as usize] as u64
    } else {
        1
    };
    let (dst, src) = (
        g[libc::REG_RDI as usize] as u64,
        g[libc::REG_RSI as usize] as u64,
    );
    let room = |a: u64| (PAGE - (a & (PAGE - 1))) / e;
    let mut k = count.min(room(dst));
    if movs {
        k = k.min(room(src));
        if dst > src && dst - src < k * e {
            return None;
        }
    }
    if k == 0 {
        return None;
    }
    let n = k * e;
    // The other protected page the chunk touches, locked without waiting.
    let page_of = |a: u64| find(a & !(PAGE - 1)).filter(|&i| i != pi);
    let other = if movs {
        page_of(dst).or_else(|| page_of(src))
    } else {
        page_of(dst)
    };
    let unlock = |o: Option<usize>| {
        if let Some(j) = o {
            PAGES[j].lock.store(0, Ordering::Release);
        }
        PAGES[pi].lock.store(0, Ordering::Release);
    };
    if let Some(j) = other {
        if PAGES[j]
            .lock
            .compare_exchange(0, me, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            unlock(None);
            sched_yield();
            return Some(true);
        }
    }
    // The watches the chunk writes (dst) or reads (src), and their values before.
    let mut hits = 0u32;
    let mut wrote = 0u32;
    let mut at = [0u64; MAX_WATCHES];
    let mut len = [0u8; MAX_WATCHES];
    let mut old = [0u64; MAX_WATCHES];
    if let Some(s) = session::current() {
        for (wi, w) in s.watches.iter().enumerate().take(MAX_WATCHES) {
            let wl = u64::from(w.len.load(Ordering::Acquire));
            if wl == 0 {
                continue;
            }
            let wa = w.addr.load(Ordering::Acquire);
            let over = |a: u64| a < wa + wl && wa < a + n;
            let (d, r) = (over(dst), movs && over(src));
            if d || r {
                let a = if d { dst } else { src };
                let x = if wl <= 8 { wa } else { a.max(wa) };
                hits |= 1 << wi;
                wrote |= u32::from(d) << wi;
                at[wi] = x;
                len[wi] = (wa + wl - x).min(8) as u8;
                old[wi] = mem_value(x, len[wi]);
            }
        }
    }
    // The copy, 256 bytes at a time (a multiple of every element size).
    let mut buf = [0u8; 256];
    if !movs {
        let v = (g[libc::REG_RAX as usize] as u64).to_le_bytes();
        for (i, b) in buf.iter_mut().enumerate() {
            *b = v[i % e as usize];
        }
    }
    let mut done = 0u64;
    while done < n {
        let m = (n - done).min(buf.len() as u64) as usize;
        if movs && !mem_read(src + done, buf.as_mut_ptr(), m) {
            break;
        }
        if !mem_write(dst + done, buf.as_ptr(), m) {
            break;
        }
        done += m as u64;
    }
    unlock(other);
    if done == 0 {
        return Some(false);
    }
    let g = &mut uc.uc_mcontext.gregs;
    g[libc::REG_RDI as usize] = (dst + done) as i64;
    if movs {
        g[libc::REG_RSI as usize] = (src + done) as i64;
    }
    let left = count - done / e;
    if rep {
        g[libc::REG_RCX as usize] = left as i64;
    }
    let ip = g[libc::REG_RIP as usize] as u64;
    if left == 0 || !rep {
        g[libc::REG_RIP as usize] = (ip + ins.len() as u64) as i64;
    }
    let mut new = [0u64; MAX_WATCHES];
    for (wi, v) in new.iter_mut().enumerate() {
        if hits & (1 << wi) != 0 {
            *v = mem_value(at[wi], len[wi]);
        }
    }
    run_watches(uc, ip, hits, wrote, &old, &new, false);
    Some(true)
}

pub(crate) fn is_implicit_memory(k: OpKind) -> bool {
    matches!(
        k,
        OpKind::MemorySegSI
            | OpKind::MemorySegESI
            | OpKind::MemorySegRSI
            | OpKind::MemorySegDI
            | OpKind::MemorySegEDI
            | OpKind::MemorySegRDI
            | OpKind::MemoryESDI
            | OpKind::MemoryESEDI
            | OpKind::MemoryESRDI
    )
}

/// Set up the out-of-line run of `ins` on the slot's copy. `false`: it cannot
/// (nothing changed in `uc`).
fn emulate(
    pool: &Pool,
    si: usize,
    p: &mut Pending,
    ins: &Instruction,
    uc: &mut libc::ucontext_t,
) -> bool {
    // A register the instruction does not name.
    let named = |r: Register| {
        ins.memory_base().full_register() == r
            || ins.memory_index().full_register() == r
            || (0..ins.op_count()).any(|i| {
                ins.op_kind(i) == OpKind::Register && ins.op_register(i).full_register() == r
            })
    };
    let Some(reg) = SCRATCH.iter().copied().find(|&r| !named(r)) else {
        return false;
    };
    let data = pool.data + (si * DATA_BYTES) as u64;
    let copy = data + (p.addr & 63);
    let orig = data + 128;
    if !mem_read(p.addr, copy as *mut u8, p.size) {
        return false;
    }
    // SAFETY: both inside the slot's data (size <= 64, offset < 64).
    unsafe { core::ptr::copy_nonoverlapping(copy as *const u8, orig as *mut u8, p.size) };
    let mut moved = *ins;
    moved.set_memory_base(reg);
    moved.set_memory_index(Register::None);
    moved.set_memory_index_scale(1);
    moved.set_memory_displacement64(0);
    moved.set_memory_displ_size(0);
    moved.set_segment_prefix(Register::None);
    let code = pool.code + (si * CODE_BYTES) as u64;
    // SAFETY: the slot's encoder, made with capacity (no allocation here).
    let Some(enc) = (unsafe { &mut *pool.slots[si].encoder.get() }).as_mut() else {
        return false;
    };
    let n = match enc.encode(&moved, code) {
        Ok(n) => n,
        Err(_) => {
            let mut b = enc.take_buffer();
            b.clear();
            enc.set_buffer(b);
            return false;
        }
    };
    let mut b = enc.take_buffer();
    if n + 1 > CODE_BYTES || b.len() < n {
        b.clear();
        enc.set_buffer(b);
        return false;
    }
    // SAFETY: the slot's own code bytes (read-write-execute), run only by this
    // thread after this handler returns.
    unsafe {
        core::ptr::copy_nonoverlapping(b.as_ptr(), code as *mut u8, n);
        *((code + n as u64) as *mut u8) = 0xcc;
    }
    b.clear();
    enc.set_buffer(b);
    let g = greg(reg).unwrap_or(libc::REG_R11 as usize);
    p.mode = Mode::Emulate;
    p.reg = g;
    p.reg_value = uc.uc_mcontext.gregs[g];
    uc.uc_mcontext.gregs[g] = copy as i64;
    uc.uc_mcontext.gregs[libc::REG_RIP as usize] = code as i64;
    true
}

fn pool_ready() -> Result<&'static Pool, ()> {
    let p = POOL.load(Ordering::Acquire);
    if p.is_null() {
        return Err(());
    }
    // SAFETY: leaked, never freed.
    Ok(unsafe { &*p })
}

fn owned(pool: &Pool, me: i32) -> Option<usize> {
    if BUSY.load(Ordering::Acquire) == 0 {
        return None;
    }
    pool.slots
        .iter()
        .position(|s| s.owner.load(Ordering::Acquire) == me)
}

fn claim(pool: &Pool, me: i32) -> Option<usize> {
    let i = pool.slots.iter().position(|s| {
        s.owner
            .compare_exchange(0, me, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
    })?;
    BUSY.fetch_add(1, Ordering::AcqRel);
    Some(i)
}

fn release(pool: &Pool, i: usize) {
    pool.slots[i].owner.store(0, Ordering::Release);
    BUSY.fetch_sub(1, Ordering::AcqRel);
}

/// The trap after an access to a watched page (the emulation's `int3`, or the
/// step's trace trap): finish the access, run the advice. `false`: not ours.
pub fn on_trap(si: &libc::siginfo_t, uc: &mut libc::ucontext_t) -> bool {
    if BUSY.load(Ordering::Acquire) == 0 {
        return false;
    }
    let Ok(pool) = pool_ready() else {
        return false;
    };
    let me = tid();
    let Some(i) = owned(pool, me) else {
        return false;
    };
    // SAFETY: our own slot.
    let p = unsafe { &mut *pool.slots[i].pending.get() };
    // SAFETY: the first 8 bytes of the saved sigset are signals 1 to 64.
    let saved = unsafe { &mut *(&mut uc.uc_sigmask as *mut libc::sigset_t as *mut u64) };
    *saved = p.sigmask;
    let g = &mut uc.uc_mcontext.gregs;
    let code = pool.code + (i * CODE_BYTES) as u64;
    let mut changed = false;
    match p.mode {
        Mode::Emulate => {
            let rip = g[libc::REG_RIP as usize] as u64;
            if si.si_code != SI_KERNEL || !(code < rip && rip <= code + CODE_BYTES as u64) {
                return false;
            }
            g[p.reg] = p.reg_value;
            g[libc::REG_RIP as usize] = p.next_ip as i64;
            let data = pool.data + (i * DATA_BYTES) as u64;
            let copy = data + (p.addr & 63);
            // SAFETY: the slot's copy and the original bytes (size <= 64).
            let (now, was) = unsafe {
                (
                    core::slice::from_raw_parts(copy as *const u8, p.size),
                    core::slice::from_raw_parts((data + 128) as *const u8, p.size),
                )
            };
            if now != was {
                changed = true;
                mem_write(p.addr, copy as *const u8, p.size);
            }
        }
        Mode::Step => {
            if si.si_code != TRAP_TRACE {
                return false;
            }
            g[libc::REG_EFL as usize] &= !EFLAGS_TF;
            for &pi in &p.pages[..p.npages] {
                let pg = &PAGES[pi];
                mprotect(
                    pg.addr.load(Ordering::Acquire),
                    pg.prot.load(Ordering::Acquire),
                );
            }
        }
    }
    // The values after, then the pages are free for the next access.
    let mut new = [0u64; MAX_WATCHES];
    let hits = p.hits;
    for (wi, v) in new.iter_mut().enumerate() {
        if hits & (1 << wi) != 0 {
            *v = mem_value(p.at[wi], p.len[wi]);
            changed |= *v != p.old[wi];
        }
    }
    let (old, ip, stepped) = (p.old, p.ip, p.mode == Mode::Step);
    let wrote = if p.wrote || changed { hits } else { 0 };
    for &pi in &p.pages[..p.npages] {
        PAGES[pi].lock.store(0, Ordering::Release);
    }
    release(pool, i);
    run_watches(uc, ip, hits, wrote, &old, &new, stepped);
    true
}

/// Run the advice of the watches in `hits` (`wrote`: those whose bytes the access
/// wrote), with their values before and after.
fn run_watches(
    uc: &libc::ucontext_t,
    ip: u64,
    hits: u32,
    wrote: u32,
    old: &[u64; MAX_WATCHES],
    new: &[u64; MAX_WATCHES],
    stepped: bool,
) {
    if hits == 0 {
        return;
    }
    let _using = threads::hold_session();
    let Some(s) = session::current() else {
        return;
    };
    for (wi, w) in s.watches.iter().enumerate() {
        if hits & (1 << wi) == 0 {
            continue;
        }
        let wrote = wrote & (1 << wi) != 0;
        let (len, access, advice) = (
            w.len.load(Ordering::Acquire),
            w.access.load(Ordering::Acquire),
            w.advice.load(Ordering::Acquire),
        );
        if len == 0 || advice == 0 {
            continue;
        }
        if access & WATCH_PAGE == 0 {
            // A hardware watch: a step in place trapped it already.
            if stepped {
                continue;
            }
            w.last.store(new[wi], Ordering::Release);
        }
        let fire = if access & WATCH_UNCHANGED_ONLY != 0 {
            !wrote
        } else if access & 0xff == WATCH_RW {
            true
        } else {
            wrote
        };
        if fire {
            if let Some(v) = watch::run_advice(uc, s, w, advice, ip, ip, old[wi], new[wi]) {
                // `new = EXPR`: after the access, through /proc/self/mem.
                watch::write_new(w.addr.load(Ordering::Acquire), len, v);
                if access & WATCH_PAGE == 0 {
                    w.last.store(v, Ordering::Release);
                }
            }
        }
    }
}
