//! The signals weft needs for itself, shared with the target's own handlers.
//!
//! weft's int3 sites raise SIGTRAP, and advice reads memory it does not own through
//! instructions whose faults (SIGSEGV, SIGBUS) resume at a fixup. The agent's handlers
//! for these *guarded* signals must stay installed whatever the target does, and the
//! target's handlers must keep receiving exactly the signals that are not weft's.
//!
//! * The kernel always holds the agent's handlers for the guarded signals; the
//!   target's dispositions are *virtual*: recorded here ([`app_action`]) and honoured
//!   by [`chain`], which the agent's handlers call for every signal that is not weft's,
//!   with the target's mask, flags and handler, as the kernel would have delivered it.
//! * While a session is woven, glibc's `__libc_sigaction` (which `sigaction`,
//!   `signal`, `sysv_signal`, `sigset` and glibc itself all go through) is redirected
//!   to [`weft_agent_sigaction`]: for the guarded signals it reads and writes the
//!   virtual disposition (so a target re-installing its handlers at any time never
//!   displaces weft's); for every other signal, and in any other process sharing our
//!   memory (a `vfork` or `posix_spawn` child, a `clone(CLONE_VM)` child), it does
//!   exactly what glibc does. weft writes that redirect with the world stopped, before
//!   any other site, then asks the agent to [`take_over`]: from then on the kernel's
//!   dispositions can only change through the redirect.
//! * Between sessions the redirect is gone: the target's `sigaction` reaches the
//!   kernel again (nothing of weft's traps then). [`take_over`] at the next session
//!   records whatever the target installed meanwhile as its virtual disposition. The
//!   control thread also re-checks periodically, for targets that call the
//!   `rt_sigaction` system call directly.
//!
//! Writers (the redirect, [`take_over`]) block every signal and take a spin lock;
//! readers (the handlers) read under a sequence count, without locks.

use core::sync::atomic::{fence, AtomicU32, AtomicU64, AtomicUsize, Ordering};

use crate::{threads, trap};

/// The kernel's `struct sigaction` on x86-64.
#[repr(C)]
#[derive(Clone, Copy, Default, Debug)]
pub struct KAction {
    pub handler: usize,
    pub flags: u64,
    pub restorer: usize,
    pub mask: u64,
}

const SA_RESTORER: u64 = 0x0400_0000;
const SIGSET_BYTES: usize = 8;

/// The signals whose kernel disposition is always the agent's.
const GUARDED: [i32; 3] = [libc::SIGTRAP, libc::SIGSEGV, libc::SIGBUS];

fn guarded_index(sig: i32) -> Option<usize> {
    GUARDED.iter().position(|&s| s == sig)
}

/// One virtual disposition, under a sequence count (odd while being written).
struct AppAction {
    seq: AtomicU32,
    handler: AtomicUsize,
    flags: AtomicU64,
    restorer: AtomicUsize,
    mask: AtomicU64,
}

impl AppAction {
    const fn new() -> AppAction {
        AppAction {
            seq: AtomicU32::new(0),
            handler: AtomicUsize::new(libc::SIG_DFL),
            flags: AtomicU64::new(0),
            restorer: AtomicUsize::new(0),
            mask: AtomicU64::new(0),
        }
    }

    /// Only with `LOCK` held.
    fn store(&self, a: &KAction) {
        self.seq.fetch_add(1, Ordering::AcqRel);
        fence(Ordering::Release);
        self.handler.store(a.handler, Ordering::Relaxed);
        self.flags.store(a.flags, Ordering::Relaxed);
        self.restorer.store(a.restorer, Ordering::Relaxed);
        self.mask.store(a.mask, Ordering::Relaxed);
        self.seq.fetch_add(1, Ordering::Release);
    }

    fn load(&self) -> KAction {
        loop {
            let s1 = self.seq.load(Ordering::Acquire);
            if s1 & 1 != 0 {
                core::hint::spin_loop();
                continue;
            }
            let a = KAction {
                handler: self.handler.load(Ordering::Relaxed),
                flags: self.flags.load(Ordering::Relaxed),
                restorer: self.restorer.load(Ordering::Relaxed),
                mask: self.mask.load(Ordering::Relaxed),
            };
            fence(Ordering::Acquire);
            if self.seq.load(Ordering::Relaxed) == s1 {
                return a;
            }
        }
    }
}

static APP: [AppAction; 3] = [AppAction::new(), AppAction::new(), AppAction::new()];
static LOCK: AtomicU32 = AtomicU32::new(0);
/// glibc's signal return trampoline (`__restore_rt`), learnt from the kernel after
/// glibc installed the agent's first handler.
static RESTORER: AtomicUsize = AtomicUsize::new(0);

fn raw_sigaction(sig: i32, act: Option<&KAction>, old: Option<&mut KAction>) -> i64 {
    let a = act.map_or(core::ptr::null(), |a| a as *const KAction);
    let o = old.map_or(core::ptr::null_mut(), |o| o as *mut KAction);
    // SAFETY: rt_sigaction with kernel-layout structs (or null) and the kernel's
    // sigset size.
    unsafe { libc::syscall(libc::SYS_rt_sigaction, sig, a, o, SIGSET_BYTES) }
}

fn raw_sigprocmask(how: i32, set: u64) -> u64 {
    let mut old = 0u64;
    // SAFETY: rt_sigprocmask with 8-byte sets on our stack.
    unsafe {
        libc::syscall(
            libc::SYS_rt_sigprocmask,
            how,
            &set as *const u64,
            &mut old as *mut u64,
            SIGSET_BYTES,
        )
    };
    old
}

/// Run `f` with every signal blocked and the writers' lock held.
fn locked<R>(f: impl FnOnce() -> R) -> R {
    let old = raw_sigprocmask(libc::SIG_SETMASK, !0);
    while LOCK
        .compare_exchange_weak(0, 1, Ordering::Acquire, Ordering::Relaxed)
        .is_err()
    {
        core::hint::spin_loop();
    }
    let r = f();
    LOCK.store(0, Ordering::Release);
    raw_sigprocmask(libc::SIG_SETMASK, old);
    r
}

fn our_handler(sig: i32) -> usize {
    if sig == libc::SIGTRAP {
        trap::on_trap as *const () as usize
    } else if sig == libc::SIGSEGV {
        crate::page::on_segv as *const () as usize
    } else {
        weft_runtime::safe::on_fault as *const () as usize
    }
}

fn our_action(sig: i32) -> KAction {
    let mut flags = (libc::SA_SIGINFO | libc::SA_ONSTACK | libc::SA_NODEFER) as u64;
    if sig == libc::SIGTRAP {
        flags |= libc::SA_RESTART as u64;
    }
    let restorer = RESTORER.load(Ordering::Acquire);
    if restorer != 0 {
        flags |= SA_RESTORER;
    }
    KAction {
        handler: our_handler(sig),
        flags,
        restorer,
        mask: 0,
    }
}

/// At load: install the agent's handlers; what was there becomes the target's
/// virtual disposition.
pub fn init() -> std::io::Result<()> {
    // The first through glibc, which supplies its signal return trampoline; the
    // kernel tells us which it is.
    // SAFETY: a zeroed sigaction is valid; we fill in handler and flags.
    let old = unsafe {
        let mut sa: libc::sigaction = core::mem::zeroed();
        sa.sa_sigaction = our_handler(libc::SIGTRAP);
        sa.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK | libc::SA_NODEFER | libc::SA_RESTART;
        libc::sigemptyset(&mut sa.sa_mask);
        let mut old: libc::sigaction = core::mem::zeroed();
        if libc::sigaction(libc::SIGTRAP, &sa, &mut old) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        old
    };
    let mut cur = KAction::default();
    if raw_sigaction(libc::SIGTRAP, None, Some(&mut cur)) == 0 && cur.flags & SA_RESTORER != 0 {
        RESTORER.store(cur.restorer, Ordering::Release);
    }
    locked(|| APP[0].store(&from_user(&old, old.sa_restorer.map_or(0, |f| f as usize))));
    take_over();
    Ok(())
}

/// Make the kernel hold the agent's handler for every guarded signal; a handler
/// found there instead (installed while the redirect was not woven, or with a raw
/// system call) becomes the target's virtual disposition.
pub fn take_over() {
    locked(|| {
        for (i, &sig) in GUARDED.iter().enumerate() {
            let mut cur = KAction::default();
            if raw_sigaction(sig, None, Some(&mut cur)) != 0 {
                continue;
            }
            if cur.handler == our_handler(sig) {
                continue;
            }
            APP[i].store(&cur);
            raw_sigaction(sig, Some(&our_action(sig)), None);
        }
    });
}

/// Called by weft (through ptrace) in a thread of *another process sharing our
/// memory*: a `clone(CLONE_VM)` child without `CLONE_SIGHAND` keeps the signal
/// dispositions its parent had when it was made, so one made before the agent took
/// the guarded signals would die of the first int3 site it runs (SIGTRAP, SIG_DFL)
/// or of a faulting read of advice. Puts the agent's handlers in that process's
/// kernel dispositions. What it had there is not recorded: signals that are not
/// weft's go to the target's virtual dispositions, which were the same when the
/// child was made (a sharer that changed its own SIGTRAP, SIGSEGV or SIGBUS handler
/// since gets the target's instead).
///
/// Raw system calls only (no libc, no TLS, no lock): safe wherever the thread was
/// stopped. Returns how many handlers it installed, or a negative errno.
#[unsafe(no_mangle)]
pub extern "C" fn weft_agent_guard_signals() -> i64 {
    let mut installed = 0;
    for &sig in &GUARDED {
        let mut cur = KAction::default();
        let r = raw_sigaction_nolibc(sig, None, Some(&mut cur));
        if r < 0 {
            return r;
        }
        if cur.handler == our_handler(sig) {
            continue;
        }
        let r = raw_sigaction_nolibc(sig, Some(&our_action(sig)), None);
        if r < 0 {
            return r;
        }
        installed += 1;
    }
    installed
}

/// `rt_sigaction` without libc's wrapper (which writes `errno` through the thread
/// pointer: a `clone(CLONE_VM)` child shares its parent's). Returns the kernel's
/// result (a negative errno on failure).
fn raw_sigaction_nolibc(sig: i32, act: Option<&KAction>, old: Option<&mut KAction>) -> i64 {
    let a = act.map_or(core::ptr::null(), |a| a as *const KAction);
    let o = old.map_or(core::ptr::null_mut(), |o| o as *mut KAction);
    let ret: i64;
    // SAFETY: rt_sigaction with kernel-layout structs (or null) and the kernel's
    // sigset size; `syscall` clobbers rcx and r11 only.
    unsafe {
        core::arch::asm!("syscall", inlateout("rax") libc::SYS_rt_sigaction => ret,
            in("rdi") sig as i64, in("rsi") a, in("rdx") o, in("r10") SIGSET_BYTES,
            out("rcx") _, out("r11") _, options(nostack))
    };
    ret
}

/// The target's disposition of a guarded signal.
pub fn app_action(sig: i32) -> KAction {
    guarded_index(sig).map_or(
        KAction {
            handler: libc::SIG_DFL,
            ..KAction::default()
        },
        |i| APP[i].load(),
    )
}

fn from_user(a: &libc::sigaction, restorer: usize) -> KAction {
    // SAFETY: sigset_t is at least 8 bytes; the kernel uses the first 8.
    let mask = unsafe { *(&a.sa_mask as *const libc::sigset_t as *const u64) };
    KAction {
        handler: a.sa_sigaction,
        flags: a.sa_flags as u32 as u64,
        restorer,
        mask,
    }
}

fn to_user(k: &KAction, out: &mut libc::sigaction) {
    // SAFETY: a zeroed sigaction is valid; the mask's first 8 bytes are the kernel's.
    unsafe {
        *out = core::mem::zeroed();
        *(&mut out.sa_mask as *mut libc::sigset_t as *mut u64) = k.mask;
        out.sa_restorer = core::mem::transmute::<usize, Option<extern "C" fn()>>(k.restorer);
    }
    out.sa_sigaction = k.handler;
    out.sa_flags = k.flags as u32 as i32;
}

fn set_errno(e: i32) {
    // SAFETY: errno of the calling thread.
    unsafe { *libc::__errno_location() = e };
}

fn in_our_process() -> bool {
    // SAFETY: getpid has no preconditions (a system call: glibc caches no pid).
    let pid = unsafe { libc::getpid() } as u32;
    pid == threads::pid()
}

/// What glibc's `__libc_sigaction` does: the user struct to the kernel's, with
/// glibc's signal return trampoline.
fn passthrough(sig: i32, act: *const libc::sigaction, oact: *mut libc::sigaction) -> i32 {
    let restorer = RESTORER.load(Ordering::Acquire);
    // SAFETY: act is null or the caller's valid struct sigaction.
    let k = unsafe { act.as_ref() }.map(|a| {
        let mut k = from_user(a, restorer);
        if restorer != 0 {
            k.flags |= SA_RESTORER;
        }
        k
    });
    let mut old = KAction::default();
    let r = raw_sigaction(sig, k.as_ref(), (!oact.is_null()).then_some(&mut old));
    if r < 0 {
        set_errno(-r as i32);
        return -1;
    }
    // SAFETY: oact is null or the caller's writable struct sigaction.
    if let Some(o) = unsafe { oact.as_mut() } {
        to_user(&old, o);
    }
    0
}

/// The target's `sigaction` while a session is woven: glibc's `__libc_sigaction` is
/// redirected here (same arguments, same result, errno on failure).
///
/// # Safety
/// `act` and `oact` are null or valid, as for `sigaction`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn weft_agent_sigaction(
    sig: libc::c_int,
    act: *const libc::sigaction,
    oact: *mut libc::sigaction,
) -> libc::c_int {
    let Some(i) = guarded_index(sig) else {
        return passthrough(sig, act, oact);
    };
    // A vfork/posix_spawn/clone(CLONE_VM) child runs in our memory with its own
    // dispositions: they are its business, and our table is the parent's.
    if !in_our_process() {
        return passthrough(sig, act, oact);
    }
    // SAFETY: act is null or the caller's valid struct sigaction.
    let new =
        unsafe { act.as_ref() }.map(|a| from_user(a, a.sa_restorer.map_or(0, |f| f as usize)));
    let old = locked(|| {
        let old = APP[i].load();
        if let Some(n) = &new {
            APP[i].store(n);
        }
        old
    });
    // SAFETY: oact is null or the caller's writable struct sigaction.
    if let Some(o) = unsafe { oact.as_mut() } {
        to_user(&old, o);
    }
    0
}

/// Deliver a guarded signal that is not weft's to the target's disposition, as the
/// kernel would have. Called from the agent's handlers.
/// A trap none of weft's mechanisms claimed, about to end a program that has no
/// SIGTRAP handler of its own: one line on its stderr with what the kernel said,
/// so a crash during a session can be told from one weft caused. No allocation
/// (a signal handler): the line is built on the stack.
fn say_fatal_trap(info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: the kernel's siginfo and ucontext for this delivery.
    let (code, rip) = unsafe {
        let uc = &*(ctx as *const libc::ucontext_t);
        (
            (*info).si_code,
            uc.uc_mcontext.gregs[libc::REG_RIP as usize] as u64,
        )
    };
    let mut buf = [0u8; 128];
    let mut n = 0;
    let mut put = |b: &[u8]| {
        let k = b.len().min(buf.len() - n);
        buf[n..n + k].copy_from_slice(&b[..k]);
        n += k;
    };
    put(b"weft-agent: a SIGTRAP no weft mechanism claimed (si_code ");
    let mut dec = [0u8; 11];
    let mut k = dec.len();
    let mut v = code.unsigned_abs();
    loop {
        k -= 1;
        dec[k] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    if code < 0 {
        put(b"-");
    }
    put(&dec[k..]);
    put(b", rip 0x");
    let mut hex = [0u8; 16];
    for (i, h) in hex.iter_mut().enumerate() {
        *h = b"0123456789abcdef"[((rip >> (60 - 4 * i)) & 0xf) as usize];
    }
    put(&hex);
    put(b"): the program's default action ends it\n");
    // SAFETY: writing our stack buffer to stderr.
    unsafe { libc::write(2, buf.as_ptr() as *const libc::c_void, n) };
}

pub fn chain(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    let a = app_action(sig);
    // SAFETY: the kernel's siginfo for this delivery.
    let code = unsafe { (*info).si_code };
    // A positive si_code comes from the kernel: a fault or a trap of this thread.
    // The kernel never lets those be ignored (it forces the default action).
    let synchronous = code > 0;
    if a.handler == libc::SIG_IGN && !synchronous {
        return;
    }
    if a.handler == libc::SIG_DFL || a.handler == libc::SIG_IGN {
        // The default action, as without weft: put it in the kernel and let it happen.
        // A fault happens again when the instruction restarts; a trap (rip is past the
        // int3) or a signal sent by someone is sent again.
        let dfl = KAction {
            handler: libc::SIG_DFL,
            ..KAction::default()
        };
        raw_sigaction(sig, Some(&dfl), None);
        if sig == libc::SIGTRAP && synchronous {
            say_fatal_trap(info, ctx);
        }
        if sig == libc::SIGTRAP || !synchronous {
            // SAFETY: sending a signal to our own thread.
            unsafe {
                libc::syscall(libc::SYS_tgkill, libc::getpid(), libc::gettid(), sig);
            }
        }
        return;
    }
    if a.flags & libc::SA_RESETHAND as u64 != 0 {
        if let Some(i) = guarded_index(sig) {
            let dfl = KAction {
                handler: libc::SIG_DFL,
                ..KAction::default()
            };
            locked(|| APP[i].store(&dfl));
        }
    }
    // The target's mask for its handler (restored by sigreturn when ours returns).
    let mut mask = a.mask;
    if a.flags & libc::SA_NODEFER as u64 == 0 {
        mask |= 1u64 << (sig - 1);
    }
    // With pages protected for data watches, the handler's own accesses to them
    // fault and trap (weft's, emulated): those two signals must reach the agent.
    if crate::page::active() {
        mask &= !((1u64 << (libc::SIGSEGV - 1)) | (1u64 << (libc::SIGTRAP - 1)));
    }
    raw_sigprocmask(libc::SIG_BLOCK, mask);
    if a.flags & libc::SA_SIGINFO as u64 != 0 {
        // SAFETY: the target installed this handler with SA_SIGINFO.
        let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
            unsafe { core::mem::transmute(a.handler) };
        f(sig, info, ctx);
    } else {
        // SAFETY: a plain handler takes the signal number.
        let f: extern "C" fn(libc::c_int) = unsafe { core::mem::transmute(a.handler) };
        f(sig);
    }
}
