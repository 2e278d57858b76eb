//! int3 sites: a SIGTRAP handler that runs the advice of the site the thread hit and
//! resumes at the site's relocated copy of the displaced instruction.
//!
//! A trap at an address that is no longer an `int3` (the site was restored between
//! the trap and this handler) restarts the original instruction. A single step's or
//! hardware breakpoint's trap of a thread weft was stepping when it died is weft's
//! too ([`STEP_GUARD`]), and swallowed. Traps that are not ours go to the target's
//! own disposition ([`signals::chain`]).

use core::sync::atomic::{AtomicU64, Ordering};
use weft_abi::{Frame, Regs, SiteKind, SITE_PATCHED, SITE_PATCHING, THREAD_FLAG_IGNORE};

use crate::{ret, session, signals, threads};

const SI_KERNEL: i32 = 0x80;
const TRAP_BRKPT: i32 = 1;
const TRAP_TRACE: i32 = 2;
const TRAP_HWBKPT: i32 = 4;

/// Written by weft (`/proc/PID/mem`, the world stopped) while it single-steps a
/// thread or runs it to a hardware breakpoint: the thread's id, and the signal
/// mask weft changed for it (SIGTRAP unblocked for the step; 0 if unchanged);
/// zeroes otherwise. If weft dies meanwhile, the kernel hands that thread the
/// step's SIGTRAP (or lets it meet the breakpoint, still armed) with no tracer to
/// take it: here, not to the target, whose default action would kill the process.
/// A guard left by a weft that died stays until the next session (whose weft
/// cleared every debug register when it attached).
#[repr(C)]
pub struct StepGuard {
    tid: AtomicU64,
    mask: AtomicU64,
}

pub static STEP_GUARD: StepGuard = StepGuard {
    tid: AtomicU64::new(0),
    mask: AtomicU64::new(0),
};

impl StepGuard {
    pub fn clear(&self) {
        self.tid.store(0, Ordering::Release);
        self.mask.store(0, Ordering::Release);
    }
}

/// A trap of weft's own step of this thread (see [`STEP_GUARD`]): swallow it. The
/// kernel cleared the trap flag when it delivered the signal; a breakpoint resumes
/// past itself (the kernel set the resume flag). The mask weft changed is put back
/// after a step, unless the thread set its own meanwhile; not after a breakpoint,
/// which stays armed: it must find SIGTRAP unblocked every time (a blocked trap
/// signal makes the kernel reset the handler and kill the process).
fn weft_stray_trap(code: i32, uc: &mut libc::ucontext_t) -> bool {
    if !matches!(code, TRAP_BRKPT | TRAP_TRACE | TRAP_HWBKPT) {
        return false;
    }
    let tid = STEP_GUARD.tid.load(Ordering::Acquire);
    // SAFETY: gettid takes no arguments.
    if tid == 0 || tid != unsafe { threads::raw_syscall(libc::SYS_gettid, 0, 0) } as u64 {
        return false;
    }
    const EFLAGS_TF: i64 = 1 << 8;
    uc.uc_mcontext.gregs[libc::REG_EFL as usize] &= !EFLAGS_TF;
    let mask = STEP_GUARD.mask.load(Ordering::Acquire);
    let trap = 1u64 << (libc::SIGTRAP - 1);
    // SAFETY: the first 8 bytes of the saved sigset are signals 1 to 64, as the
    // kernel's.
    let saved = unsafe { &mut *(&mut uc.uc_sigmask as *mut libc::sigset_t as *mut u64) };
    if code != TRAP_HWBKPT && mask & trap != 0 && *saved == mask & !trap {
        *saved = mask;
    }
    true
}

pub(crate) extern "C" fn on_trap(
    sig: libc::c_int,
    info: *mut libc::siginfo_t,
    ctx: *mut libc::c_void,
) {
    // SAFETY: SA_SIGINFO handlers get valid siginfo and ucontext.
    let (si, uc) = unsafe { (&*info, &mut *(ctx as *mut libc::ucontext_t)) };
    let g = &mut uc.uc_mcontext.gregs;
    let ip = (g[libc::REG_RIP as usize] as u64).wrapping_sub(1);
    if si.si_code == crate::watch::TRAP_PERF && crate::watch::on_trap(si, uc) {
        return;
    }
    if crate::page::on_trap(si, uc) {
        return;
    }
    if crate::watch::on_unclaimed_trap(si, uc) {
        return;
    }
    if si.si_code != SI_KERNEL && weft_stray_trap(si.si_code, uc) {
        return;
    }
    if si.si_code == SI_KERNEL {
        // Marked before the session is loaded: weft frees no session while we hold it.
        let _using = threads::hold_session();
        if let Some(s) = session::current() {
            if let Some(idx) = s.shm.site_by_addr(ip, s.space()) {
                let site = s.shm.site(idx);
                if site.resume != 0 {
                    let patched = site.state.load(Ordering::Acquire) == SITE_PATCHED;
                    // A redirect (weft's own, e.g. glibc's sigaction) has no advice:
                    // it resumes at its replacement.
                    if patched
                        && site.kind == SiteKind::Int3 as u32
                        && (site.entry_advice != 0 || site.return_advice != 0)
                    {
                        run_advice(uc, s, idx, ip);
                    }
                    uc.uc_mcontext.gregs[libc::REG_RIP as usize] = site.resume as i64;
                    return;
                }
            }
        }
        // A site of an abandoned session that the agent is restoring (int3 first):
        // no advice, resume at its relocated code (abandoned code stays mapped).
        if let Some(s) = session::abandoned() {
            if let Some(idx) = s.shm.site_by_addr(ip, s.space()) {
                let site = s.shm.site(idx);
                let st = site.state.load(Ordering::Acquire);
                if site.resume != 0 && (st == SITE_PATCHED || st == SITE_PATCHING) {
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
    signals::chain(sig, info, ctx);
}

fn run_advice(uc: &mut libc::ucontext_t, s: &session::Session, idx: u32, ip: u64) {
    let t = threads::get_or_create();
    // SAFETY: this thread's own AgentThread.
    let Some(th) = (unsafe { t.as_mut() }) else {
        threads::note_pool_miss();
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
