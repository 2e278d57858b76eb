//! `profile:hz:N`: sampling the target's threads with per-thread CPU-time timers.
//!
//! A process-wide CPU timer would deliver its signal to the main thread first (the
//! kernel prefers it), not to the thread that used the CPU, so each thread gets its
//! own timer on its own CPU clock, delivering a real-time signal to that thread
//! (`SIGEV_THREAD_ID`). The control thread creates timers for the threads that exist
//! when the session starts and, while it runs, for threads that appear later; the
//! handler runs the profile advice with a frame built from the signal context.

use core::sync::atomic::{AtomicI32, Ordering};
use std::collections::HashMap;
use weft_abi::{Frame, MAX_PROFILES, THREAD_FLAG_IGNORE};

use crate::{session, threads, trap};

/// The signal the timers deliver (set when profiling starts).
static SIGNO: AtomicI32 = AtomicI32::new(0);

/// Timers owned by the control thread: (tid, profile index) → timer.
#[derive(Default)]
pub struct Timers {
    timers: HashMap<(i32, usize), libc::timer_t>,
    active: bool,
}

fn signal_number() -> i32 {
    // glibc reserves SIGRTMIN and SIGRTMIN+1 for itself; SIGRTMAX-3 is rarely used.
    libc::SIGRTMAX() - 3
}

/// Per-thread CPU clock id of `tid` (Linux: MAKE_THREAD_CPUCLOCK(tid, SCHED)).
fn thread_cpu_clock(tid: i32) -> libc::clockid_t {
    ((!tid) << 3) | 6
}

impl Timers {
    /// Start (or refresh) the timers of the current session's profile probes.
    pub fn refresh(&mut self) {
        let Some(s) = session::current() else {
            self.stop();
            return;
        };
        let profiles: Vec<u32> = s
            .profiles
            .iter()
            .map(|p| p.hz.load(Ordering::Acquire))
            .collect();
        if profiles.iter().all(|&hz| hz == 0) {
            return;
        }
        if !self.active {
            if install_handler().is_err() {
                return;
            }
            self.active = true;
        }
        // SAFETY: gettid has no preconditions.
        let me = unsafe { libc::gettid() };
        let tids: Vec<i32> = crate::fds::tasks().unwrap_or_default();
        // Drop timers of threads that are gone.
        self.timers.retain(|(tid, _), t| {
            let alive = tids.contains(tid);
            if !alive {
                // SAFETY: deleting a timer we created.
                unsafe { libc::timer_delete(*t) };
            }
            alive
        });
        for &tid in tids.iter().filter(|&&t| t != me) {
            for (i, &hz) in profiles.iter().enumerate().take(MAX_PROFILES) {
                if hz == 0 || self.timers.contains_key(&(tid, i)) {
                    continue;
                }
                if let Some(t) = create_timer(tid, i, hz) {
                    self.timers.insert((tid, i), t);
                }
            }
        }
    }

    /// Delete every timer.
    pub fn stop(&mut self) {
        for (_, t) in self.timers.drain() {
            // SAFETY: deleting a timer we created.
            unsafe { libc::timer_delete(t) };
        }
    }

    pub fn active(&self) -> bool {
        !self.timers.is_empty()
    }
}

fn create_timer(tid: i32, index: usize, hz: u32) -> Option<libc::timer_t> {
    let signo = SIGNO.load(Ordering::Acquire);
    // SAFETY: zeroed sigevent/itimerspec are valid; the kernel fills `timer`.
    unsafe {
        let mut ev: libc::sigevent = core::mem::zeroed();
        ev.sigev_notify = libc::SIGEV_THREAD_ID;
        ev.sigev_signo = signo;
        ev.sigev_notify_thread_id = tid;
        ev.sigev_value = libc::sigval {
            sival_ptr: index as *mut libc::c_void,
        };
        let mut timer: libc::timer_t = core::ptr::null_mut();
        if libc::timer_create(thread_cpu_clock(tid), &mut ev, &mut timer) != 0 {
            return None;
        }
        let ns = 1_000_000_000u64 / u64::from(hz.max(1));
        let period = libc::timespec {
            tv_sec: (ns / 1_000_000_000) as i64,
            tv_nsec: (ns % 1_000_000_000) as i64,
        };
        let spec = libc::itimerspec {
            it_interval: period,
            it_value: period,
        };
        if libc::timer_settime(timer, 0, &spec, core::ptr::null_mut()) != 0 {
            libc::timer_delete(timer);
            return None;
        }
        Some(timer)
    }
}

fn install_handler() -> std::io::Result<()> {
    let signo = signal_number();
    SIGNO.store(signo, Ordering::Release);
    // SAFETY: installing our handler for a real-time signal.
    unsafe {
        let mut sa: libc::sigaction = core::mem::zeroed();
        sa.sa_sigaction = on_sample as *const () as usize;
        sa.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK | libc::SA_RESTART;
        libc::sigemptyset(&mut sa.sa_mask);
        if libc::sigaction(signo, &sa, core::ptr::null_mut()) != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

extern "C" fn on_sample(_sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: SA_SIGINFO handler arguments are valid; the timer passed its index.
    let (index, uc) = unsafe {
        let v = (*info).si_value();
        (v.sival_ptr as usize, &mut *(ctx as *mut libc::ucontext_t))
    };
    // Marked before the session is loaded: weft frees no session while we hold it.
    let _using = threads::hold_session();
    let Some(s) = session::current() else { return };
    let Some(p) = s.profiles.get(index) else {
        return;
    };
    let (probe, advice) = (
        p.probe.load(Ordering::Acquire),
        p.advice.load(Ordering::Acquire),
    );
    if p.hz.load(Ordering::Acquire) == 0 || advice == 0 {
        return;
    }
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
    let ip = uc.uc_mcontext.gregs[libc::REG_RIP as usize] as u64;
    let mut frame: Frame = trap::frame_from(uc, ip, s, slot, t);
    frame.site = u64::MAX;
    frame.func = 0;
    frame.probe = u64::from(probe);
    th.nest += 1;
    // SAFETY: compiled advice in a code region of this session.
    let f: extern "C" fn(*mut Frame) = unsafe { core::mem::transmute(advice) };
    f(&mut frame);
    th.nest -= 1;
}
