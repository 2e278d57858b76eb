//! int3 sites: a SIGTRAP handler that runs the advice of the site the thread hit and
//! resumes at the site's relocated copy of the displaced instruction.
//!
//! A trap at an address that is no longer an `int3` (the site was restored between
//! the trap and this handler) restarts the original instruction. Traps that are not
//! ours go to the handler installed before us, or get the default action.

use core::sync::atomic::Ordering;
use std::cell::UnsafeCell;
use std::mem::MaybeUninit;
use weft_abi::{Frame, Regs, SiteKind, SITE_PATCHED, THREAD_FLAG_IGNORE};

use crate::{ret, session, threads};

/// The SIGTRAP disposition we replaced, written once before our handler can run.
struct OldAction(UnsafeCell<MaybeUninit<libc::sigaction>>);
// SAFETY: written only by `install` (before the handler is active), then only read.
unsafe impl Sync for OldAction {}
static OLD_TRAP: OldAction = OldAction(UnsafeCell::new(MaybeUninit::uninit()));

pub fn install() -> std::io::Result<()> {
    // SAFETY: installing a handler; OLD_TRAP is written before the handler can run.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_trap as *const () as usize;
        sa.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK | libc::SA_NODEFER | libc::SA_RESTART;
        libc::sigemptyset(&mut sa.sa_mask);
        if libc::sigaction(libc::SIGTRAP, &sa, (*OLD_TRAP.0.get()).as_mut_ptr()) != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

pub fn installed() -> bool {
    // SAFETY: query only.
    unsafe {
        let mut cur: libc::sigaction = std::mem::zeroed();
        libc::sigaction(libc::SIGTRAP, std::ptr::null(), &mut cur) == 0
            && cur.sa_sigaction == on_trap as *const () as usize
    }
}

const SI_KERNEL: i32 = 0x80;

extern "C" fn on_trap(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: SA_SIGINFO handlers get valid siginfo and ucontext.
    let (si, uc) = unsafe { (&*info, &mut *(ctx as *mut libc::ucontext_t)) };
    let g = &mut uc.uc_mcontext.gregs;
    let ip = (g[libc::REG_RIP as usize] as u64).wrapping_sub(1);
    if si.si_code == SI_KERNEL {
        // Marked before the session is loaded: weft frees no session while we hold it.
        let _using = threads::using_session(threads::get_or_create());
        if let Some(s) = session::current() {
            if let Some(idx) = s.shm.site_by_addr(ip) {
                let site = s.shm.site(idx);
                if site.resume != 0 {
                    let patched = site.state.load(Ordering::Acquire) == SITE_PATCHED;
                    if patched && site.kind == SiteKind::Int3 as u32 {
                        run_advice(uc, s, idx, ip);
                    }
                    uc.uc_mcontext.gregs[libc::REG_RIP as usize] = site.resume as i64;
                    return;
                }
            }
        }
        // Not a site we know (any more): if the int3 is gone, it was ours and has been
        // restored since the thread trapped: run the original instruction.
        if weft_runtime::safe::load(ip, 1).is_some_and(|b| b != 0xcc) {
            uc.uc_mcontext.gregs[libc::REG_RIP as usize] = ip as i64;
            return;
        }
    }
    chain(sig, info, ctx);
}

fn chain(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: OLD_TRAP was initialised by install().
    let old = unsafe { (*OLD_TRAP.0.get()).assume_init_ref() };
    let h = old.sa_sigaction;
    if h == libc::SIG_IGN {
        return;
    }
    if h == libc::SIG_DFL {
        // Default action for SIGTRAP: terminate with a core dump, as without weft.
        // SAFETY: reset and re-raise; SIGTRAP is not blocked (SA_NODEFER).
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = libc::SIG_DFL;
            libc::sigaction(sig, &sa, std::ptr::null_mut());
            libc::raise(sig);
        }
        return;
    }
    if old.sa_flags & libc::SA_SIGINFO != 0 {
        // SAFETY: the previous handler was installed with SA_SIGINFO.
        let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
            unsafe { core::mem::transmute(h) };
        f(sig, info, ctx);
    } else {
        // SAFETY: a plain handler.
        let f: extern "C" fn(libc::c_int) = unsafe { core::mem::transmute(h) };
        f(sig);
    }
}

fn run_advice(uc: &mut libc::ucontext_t, s: &session::Session, idx: u32, ip: u64) {
    let t = threads::get_or_create();
    // SAFETY: this thread's own AgentThread.
    let Some(th) = (unsafe { t.as_mut() }) else {
        return;
    };
    if th.flags & THREAD_FLAG_IGNORE != 0 || th.nest != 0 {
        return;
    }
    let slot = threads::attach_slot(th);
    if slot.is_null() {
        return;
    }
    let site = s.shm.site(idx);
    // A site just after a function's endbr64 is that function's entry probe: report
    // the function's address, as a uprobe there would.
    const ENDBR64: u64 = 0xfa1e_0ff3;
    let reported = if ip.wrapping_sub(site.func) == 4
        && weft_runtime::safe::load(site.func, 4) == Some(ENDBR64)
    {
        site.func
    } else {
        ip
    };
    let mut frame = frame_from(uc, reported, s, slot, t);
    frame.site = u64::from(idx);
    frame.func = site.func;
    frame.probe = u64::from(site.entry_probe);
    th.nest += 1;
    if site.entry_advice != 0 {
        // SAFETY: compiled advice in a code region of this session.
        let f: extern "C" fn(*mut Frame) = unsafe { core::mem::transmute(site.entry_advice) };
        f(&mut frame);
    }
    // weft sets return advice only on sites at a function's entry (after endbr64).
    if site.return_advice != 0 {
        ret::weft_agent_hijack(&mut frame);
    }
    th.nest -= 1;
}

/// A frame for advice run from a signal handler: registers from the signal context,
/// `rip = ip`.
pub(crate) fn frame_from(
    uc: &libc::ucontext_t,
    ip: u64,
    s: &session::Session,
    slot: *mut weft_abi::ThreadSlot,
    t: *mut weft_abi::AgentThread,
) -> Frame {
    let g = &uc.uc_mcontext.gregs;
    let r = |i: i32| g[i as usize] as u64;
    Frame {
        regs: Regs {
            rax: r(libc::REG_RAX),
            rbx: r(libc::REG_RBX),
            rcx: r(libc::REG_RCX),
            rdx: r(libc::REG_RDX),
            rsi: r(libc::REG_RSI),
            rdi: r(libc::REG_RDI),
            rbp: r(libc::REG_RBP),
            rsp: r(libc::REG_RSP),
            r8: r(libc::REG_R8),
            r9: r(libc::REG_R9),
            r10: r(libc::REG_R10),
            r11: r(libc::REG_R11),
            r12: r(libc::REG_R12),
            r13: r(libc::REG_R13),
            r14: r(libc::REG_R14),
            r15: r(libc::REG_R15),
            rip: ip,
            flags: r(libc::REG_EFL),
        },
        thread: slot,
        shm: s.shm.base(),
        site: u64::MAX,
        func: 0,
        tstate: t as *mut u8,
        probe: 0,
    }
}
