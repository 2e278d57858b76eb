//! Writing and removing patches with every thread of the target stopped.
//!
//! Before a site is written, no thread may be executing inside the bytes it
//! replaces: such threads are single-stepped out first. The bytes in memory must
//! still be the file's original bytes (else the site is left alone and reported).
//! Writes go through `/proc/PID/mem`, so code pages keep their protections.

use std::ops::Range;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Result};
use weft_abi::{SITE_PATCHED, SITE_PATCHING, SITE_RESTORED};
use weft_inject::StoppedProcess;
use weft_runtime::shm::Shm;
use weft_symbols::ProcMaps;

use crate::target::{find_function, AGENT_FILE};
use crate::weave::{Outcome, Planned};

/// What patching did, for `-v` and the benchmarks.
#[derive(Debug, Default)]
pub struct PatchReport {
    pub pause: Duration,
    pub patched: usize,
    pub stepped_threads: usize,
    pub threads: usize,
}

/// Patch every planned site. Sites whose memory no longer holds the original bytes
/// are marked `Skipped`. `step_guard` is the agent's step guard (0: none): were weft
/// to die while it steps a thread out of the bytes, the agent swallows the trap.
/// `space` is the process's site space in `shm`.
pub fn apply(
    pid: i32,
    sites: &mut [Planned],
    shm: &Shm,
    space: u32,
    step_guard: u64,
) -> Result<PatchReport> {
    apply_stepping_out_of(pid, sites, shm, space, &[], step_guard)
}

/// Threads the stop caught holding the SIGTRAP of a site's int3 that is gone since
/// (the agent wrote a site's bytes while the process ran, with the int3-first
/// sequence, and the thread trapped on the int3 before the handler could run): they
/// are put back on the site's first byte, the trap dropped, so they run the bytes
/// there now (as the agent's handler would have sent them). Else such a thread sits
/// one byte into the site, where a step-out would step it with the trap pending.
fn rewind_stale_traps(w: &mut StoppedProcess, shm: &Shm, space: u32) -> Result<()> {
    const SI_KERNEL: i32 = 0x80;
    // Raised but not yet taken (the stop came first): taken now, and held.
    let pid = w.pid();
    let trap = 1u64 << (libc::SIGTRAP - 1);
    if w.threads().iter().any(|t| {
        weft_inject::process::signal_mask(w.tgid_of(t.tid()), t.tid(), "SigPnd") & trap != 0
    }) {
        w.take_queued_traps().map_err(|e| anyhow!("{e}"))?;
    }
    let _ = pid;
    let caught: Vec<(i32, libc::user_regs_struct)> = w
        .threads()
        .iter()
        .filter(|t| t.pending_signals().contains(&libc::SIGTRAP))
        .map(|t| (t.tid(), *t.regs()))
        .collect();
    for (tid, regs) in caught {
        let ip = regs.rip.wrapping_sub(1);
        let mut b = [0u8; 1];
        let restored = w.read_mem(ip, &mut b).is_ok() && b[0] != weft_x86::INT3;
        if !restored || shm.site_by_addr(ip, space).is_none() {
            continue;
        }
        let dropped = w
            .drop_pending(tid, |sig, info| {
                sig == libc::SIGTRAP && info.is_some_and(|i| i.si_code == SI_KERNEL)
            })
            .map_err(|e| anyhow!("{e}"))?;
        if dropped > 0 {
            let mut back = regs;
            back.rip = ip;
            w.set_regs(tid, &back).map_err(|e| anyhow!("{e}"))?;
        }
    }
    Ok(())
}

/// As [`apply`], and first step every thread out of `bodies` too (whole functions
/// that are redirected: a thread inside one would finish the original).
pub fn apply_stepping_out_of(
    pid: i32,
    sites: &mut [Planned],
    shm: &Shm,
    space: u32,
    bodies: &[Range<u64>],
    step_guard: u64,
) -> Result<PatchReport> {
    let mut inside: Vec<Range<u64>> = sites
        .iter()
        .filter(|s| !s.patch.is_empty())
        .map(|s| s.addr + 1..s.addr + s.patch.len() as u64)
        .filter(|r| !r.is_empty())
        .collect();
    inside.extend(bodies.iter().cloned());
    // USDT semaphores go up in a stop of their own, before the sites are patched:
    // a program that reads its semaphore before the probe (to build the probe's
    // arguments only when traced) has read it again by the time the probe fires
    // woven, instead of carrying the 0 it read before the stop that patched it.
    let bumped: Vec<usize> = sites
        .iter()
        .enumerate()
        .filter(|(_, s)| !s.patch.is_empty() && s.index != u32::MAX && s.semaphore.is_some())
        .map(|(i, _)| i)
        .collect();
    if !bumped.is_empty() {
        let w = StoppedProcess::stop(pid).map_err(|e| anyhow!("{e}"))?;
        for &i in &bumped {
            if let Some(sem) = sites[i].semaphore {
                bump_semaphore(&w, sem, 1)?;
            }
        }
        w.resume().map_err(|e| anyhow!("{e}"))?;
    }
    // A signal handler that interrupted a thread inside the bytes to replace would
    // return into the middle of a jump: let such handlers finish first (the thread
    // itself can be stepped out; its interrupted pc cannot).
    let maps = ProcMaps::read(pid as u32).map_err(|e| anyhow!("{e}"))?;
    let frames = crate::safepoint::SignalFrames::new(&maps, &maps.modules());
    let start = Instant::now();
    let mut w = loop {
        let w = StoppedProcess::stop(pid).map_err(|e| anyhow!("{e}"))?;
        let held: Vec<u64> = w
            .threads()
            .iter()
            .flat_map(|t| frames.interrupted(&w, t.regs().rsp))
            .filter(|pc| inside.iter().any(|r| r.contains(pc)))
            .collect();
        if held.is_empty() {
            break w;
        }
        if start.elapsed() > Duration::from_secs(2) {
            // Still there: those sites wait for another weave.
            for s in sites.iter_mut() {
                let r = s.addr + 1..s.addr + s.patch.len() as u64;
                if held.iter().any(|pc| r.contains(pc)) {
                    s.outcome = Outcome::Skipped(format!(
                        "a signal handler interrupted a thread inside the bytes at {:#x} and did not return for 2 s",
                        s.addr
                    ));
                    s.patch.clear();
                }
            }
            inside.retain(|r| !held.iter().any(|pc| r.contains(pc)));
            break w;
        }
        w.resume().map_err(|e| anyhow!("{e}"))?;
        std::thread::sleep(Duration::from_millis(1));
    };
    w.set_step_guard(step_guard);
    guard_sharers(&mut w)?;
    rewind_stale_traps(&mut w, shm, space)?;
    let mut report = PatchReport {
        threads: w.threads().len(),
        ..PatchReport::default()
    };
    let max_steps = if bodies.is_empty() { 64 } else { 1024 };
    for tid in w.threads_in(&inside) {
        w.step_out(tid, &inside, max_steps)
            .map_err(|e| anyhow!("{e}"))?;
        report.stepped_threads += 1;
    }
    let mut cur = [0u8; weft_abi::SITE_MAX_BYTES];
    let mut patched = vec![false; sites.len()];
    for (i, s) in sites.iter_mut().enumerate() {
        if s.patch.is_empty() || s.index == u32::MAX {
            continue;
        }
        let n = s.orig.len();
        w.read_mem(s.addr, &mut cur[..n])
            .map_err(|e| anyhow!("{e}"))?;
        if cur[..n] != s.orig[..] {
            s.outcome = Outcome::Skipped(format!(
                "the code at {:#x} differs from the file (patched by another tool?)",
                s.addr
            ));
            continue;
        }
        let d = shm.site(s.index);
        d.state.store(SITE_PATCHING, Ordering::Release);
        w.write_mem(s.addr, &s.patch).map_err(|e| anyhow!("{e}"))?;
        weft_inject::die::at("site-written");
        d.state.store(SITE_PATCHED, Ordering::Release);
        patched[i] = true;
        report.patched += 1;
    }
    // A site left out after all gives its semaphore back.
    for &i in bumped.iter().filter(|&&i| !patched[i]) {
        if let Some(sem) = sites[i].semaphore {
            bump_semaphore(&w, sem, -1)?;
        }
    }
    report.pause = w.resume().map_err(|e| anyhow!("{e}"))?;
    Ok(report)
}

/// Give every other process sharing the target's memory (a `clone(CLONE_VM)` child,
/// held with the target's threads) the agent's handlers for SIGTRAP, SIGSEGV and
/// SIGBUS, before any site can trap or any advice fault there: such a process has
/// its own dispositions, copied when it was made, maybe before the agent came. One
/// remote call of `weft_agent_guard_signals` in one of its threads (raw system
/// calls, safe wherever the thread stopped); a process made while the agent held
/// the signals inherits its handlers, and gets the call anyway (it does nothing).
fn guard_sharers(w: &mut StoppedProcess) -> Result<()> {
    let sharers = w.sharers();
    if sharers.is_empty() {
        return Ok(());
    }
    let pid = w.pid();
    let maps = ProcMaps::read(pid as u32).map_err(|e| anyhow!("{e}"))?;
    let guard = find_function(&maps, "weft_agent_guard_signals", &[AGENT_FILE])
        .ok_or_else(|| anyhow!("the agent in process {pid} exports no weft_agent_guard_signals"))?;
    for tgid in sharers {
        let Some(tid) = w
            .threads()
            .iter()
            .map(|t| t.tid())
            .find(|&t| w.tgid_of(t) == tgid)
        else {
            continue;
        };
        let what = || format!("process {tgid}, which shares the memory of {pid}");
        let r = w
            .call(tid, guard, &[], &[])
            .map_err(|e| anyhow!("giving the agent's signal handlers to {}: {e}", what()))?;
        let ret = r.ret as i64;
        if ret < 0 {
            bail!(
                "giving the agent's signal handlers to {}: {}",
                what(),
                std::io::Error::from_raw_os_error(-ret as i32)
            );
        }
    }
    Ok(())
}

/// What [`unhijack`] needs: where a thread may be in the middle of a shadow-stack
/// operation (code regions, the agent's text), where thread states are, and the
/// return trampoline's address.
pub struct Shadows<'a> {
    pub busy_code: &'a [Range<u64>],
    pub tls_offset: i64,
    pub return_trampoline: u64,
    /// Signal frames on threads' stacks: a handler that interrupted a thread inside
    /// the session's code returns there.
    pub frames: &'a crate::safepoint::SignalFrames,
}

/// Put the original bytes back at every patched site, and give every hijacked
/// frame of every thread not in the middle of a shadow-stack operation its real
/// return address back (see [`unhijack`]).
pub fn restore(pid: i32, sites: &[Planned], shm: &Shm, shadows: &Shadows) -> Result<Duration> {
    let w = StoppedProcess::stop(pid).map_err(|e| anyhow!("{e}"))?;
    unhijack(&w, shadows, false);
    restore_stopped(&w, sites, shm)?;
    w.resume().map_err(|e| anyhow!("{e}"))
}

/// Put the original bytes back at `sites`, with every thread stopped.
fn restore_stopped(w: &StoppedProcess, sites: &[Planned], shm: &Shm) -> Result<()> {
    let mut cur = [0u8; weft_abi::SITE_MAX_BYTES];
    for s in sites {
        if s.index == u32::MAX || matches!(s.outcome, Outcome::Skipped(_)) {
            continue;
        }
        let d = shm.site(s.index);
        if d.state.load(Ordering::Acquire) != SITE_PATCHED {
            continue;
        }
        let n = s.patch.len();
        w.read_mem(s.addr, &mut cur[..n])
            .map_err(|e| anyhow!("{e}"))?;
        if cur[..n] == s.patch[..] {
            w.write_mem(s.addr, &s.orig).map_err(|e| anyhow!("{e}"))?;
            weft_inject::die::at("site-restored");
        }
        d.state.store(SITE_RESTORED, Ordering::Release);
        if let Some(sem) = s.semaphore {
            bump_semaphore(w, sem, -1)?;
        }
    }
    Ok(())
}

/// True if the agent thread state at `at` is inside advice (`nest`) or holds a
/// pointer into the session (`busy`: signal handlers, the attach slow path).
fn agent_busy(w: &StoppedProcess, at: u64) -> bool {
    let busy_off = core::mem::offset_of!(weft_abi::AgentThread, busy) as u64;
    [
        weft_abi::AGENT_THREAD_NEST_OFF as u64,
        busy_off,
        weft_abi::AGENT_THREAD_AROUND_OFF as u64,
    ]
    .iter()
    .any(|&off| {
        let mut v = [0u8; 4];
        w.read_mem(at + off, &mut v).is_ok() && u32::from_le_bytes(v) != 0
    })
}

/// The agent's state of thread `t` (its TLS slot), or 0.
fn agent_thread(w: &StoppedProcess, t: &weft_inject::StoppedThread, tls_offset: i64) -> u64 {
    let tls = t.regs().fs_base.wrapping_add(tls_offset as u64);
    let mut p = [0u8; 8];
    if w.read_mem(tls, &mut p).is_err() {
        return 0;
    }
    u64::from_le_bytes(p)
}

/// With every thread stopped: write the real return address back into every slot
/// that still returns into the agent's return trampoline, and tombstone the entries
/// (slot = 0; the owner drops them). After an unweave no hijacked frame is left:
/// the unwinder hooks (`_Unwind_RaiseException`...) are gone with the session, and a
/// C++ exception must never meet the trampoline's address on a stack.
///
/// A thread whose PC is in `busy_code` or that is inside advice may be in the middle
/// of pushing or popping; it is skipped unless `all` (the caller has checked that
/// no thread is). Threads that exited are not visited (their stacks are gone, but a
/// coroutine they suspended may still be resumed elsewhere: the entries stay and
/// can be claimed there).
pub fn unhijack(w: &StoppedProcess, sh: &Shadows, all: bool) -> usize {
    use weft_abi::{AgentThread, ShadowEntry, SHADOW_SLOT_OFF};
    let depth_off = core::mem::offset_of!(AgentThread, shadow_depth) as u64;
    let shadow_off = core::mem::offset_of!(AgentThread, shadow) as u64;
    let size = core::mem::size_of::<ShadowEntry>();
    let busy: Vec<i32> = w.threads_in(sh.busy_code);
    let mut restored = 0;
    for t in w.threads() {
        let at = agent_thread(w, t, sh.tls_offset);
        if at == 0 || (!all && busy.contains(&t.tid())) {
            continue;
        }
        let mut b4 = [0u8; 4];
        let mut b8 = [0u8; 8];
        if (!all && agent_busy(w, at))
            || w.read_mem(at + depth_off, &mut b4).is_err()
            || w.read_mem(at + shadow_off, &mut b8).is_err()
        {
            continue;
        }
        let depth = (u32::from_le_bytes(b4) as usize).min(1 << 16);
        let base = u64::from_le_bytes(b8);
        if depth == 0 || base == 0 {
            continue;
        }
        let mut ents = vec![0u8; depth * size];
        if w.read_mem(base, &mut ents).is_err() {
            continue;
        }
        // Newest first, as the agent's restore_all: a slot hijacked twice (a tail
        // call between two return-probed functions) ends with its oldest address.
        for i in (0..depth).rev() {
            let e = &ents[i * size..(i + 1) * size];
            let ret = u64::from_le_bytes(e[0..8].try_into().unwrap());
            let slot = u64::from_le_bytes(e[8..16].try_into().unwrap());
            if slot == 0 {
                continue;
            }
            if w.read_mem(slot, &mut b8).is_ok()
                && u64::from_le_bytes(b8) == sh.return_trampoline
                && w.write_mem(slot, &ret.to_le_bytes()).is_ok()
            {
                restored += 1;
            }
            let at_slot = base + (i * size) as u64 + SHADOW_SLOT_OFF as u64;
            let _ = w.write_mem(at_slot, &0u64.to_le_bytes());
        }
    }
    restored
}

/// Restore redirects (the sigaction redirect) once no thread holds a SIGTRAP, SIGSEGV
/// or SIGBUS that a stop kept from it: such a signal may be weft's (an int3 site hit,
/// a fault of advice just before the sites were restored) and is delivered again on
/// resume; while the redirect is in, the target cannot have displaced the agent's
/// handler, which must be the one to get it. Tries for up to `patience`, then
/// restores anyway.
pub fn restore_redirects(
    pid: i32,
    sites: &[Planned],
    shm: &Shm,
    shadows: &Shadows<'_>,
    patience: Duration,
) -> Result<Duration> {
    let start = Instant::now();
    loop {
        let w = StoppedProcess::stop(pid).map_err(|e| anyhow!("{e}"))?;
        let guarded = |s: i32| matches!(s, libc::SIGTRAP | libc::SIGSEGV | libc::SIGBUS);
        // Kept by the stop, or still queued: a thread interrupted on its way back
        // to user space after a trap or fault stops before it dequeues the signal.
        let held = w.threads().iter().any(|t| {
            t.pending_signals().into_iter().any(guarded)
                || queued_signals(w.tgid_of(t.tid()), t.tid()).is_some_and(|m| {
                    [libc::SIGTRAP, libc::SIGSEGV, libc::SIGBUS]
                        .iter()
                        .any(|&s| m & (1 << (s - 1)) != 0)
                })
        });
        if held && start.elapsed() < patience {
            w.resume().map_err(|e| anyhow!("{e}"))?;
            std::thread::sleep(Duration::from_millis(1));
            continue;
        }
        drop(w);
        return restore(pid, sites, shm, shadows);
    }
}

/// The signals queued for one thread (`SigPnd` in its `/proc` status).
fn queued_signals(pid: i32, tid: i32) -> Option<u64> {
    let st = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/status")).ok()?;
    let l = st.lines().find(|l| l.starts_with("SigPnd:"))?;
    u64::from_str_radix(l.split_whitespace().nth(1)?, 16).ok()
}

/// Add `by` to a USDT semaphore (an `unsigned short`), with every thread stopped.
fn bump_semaphore(w: &StoppedProcess, addr: u64, by: i32) -> Result<()> {
    let mut b = [0u8; 2];
    w.read_mem(addr, &mut b)
        .map_err(|e| anyhow!("reading a USDT semaphore: {e}"))?;
    let v = (i32::from(u16::from_le_bytes(b)) + by).clamp(0, i32::from(u16::MAX)) as u16;
    w.write_mem(addr, &v.to_le_bytes())
        .map_err(|e| anyhow!("writing a USDT semaphore: {e}"))
}

/// glibc's signal return trampoline (`__restore_rt`): `mov rax, 15; syscall`.
const SIGRETURN: [u8; 9] = [0x48, 0xc7, 0xc0, 0x0f, 0, 0, 0, 0x0f, 0x05];

/// True if `t` is about to return from a signal handler: the context it returns to
/// may be inside a trampoline (the SIGTRAP handler resumes int3 sites at their
/// relocated instructions in a code region), so the code must stay mapped.
fn about_to_sigreturn(w: &StoppedProcess, t: &weft_inject::StoppedThread) -> bool {
    let pc = t.pc();
    let mut b = [0u8; 9];
    if w.read_mem(pc, &mut b).is_ok() && b == SIGRETURN {
        return true;
    }
    // At the `syscall` with rax = 15, or stopped inside rt_sigreturn itself.
    let mut s = [0u8; 2];
    (w.read_mem(pc, &mut s).is_ok() && s == [0x0f, 0x05] && t.regs().rax == 15)
        || (t.regs().orig_rax == 15
            && w.read_mem(pc.wrapping_sub(2), &mut s).is_ok()
            && s == [0x0f, 0x05])
}

/// Wait until no thread is inside advice (`AgentThread::nest`), a trampoline or a
/// code region, or the agent's return trampoline, checking with the world stopped.
///
/// At that moment, also restore `late` sites (the unwinder hooks) and every
/// hijacked frame left ([`unhijack`]). If the wait times out, `late` sites are
/// restored anyway.
pub fn wait_quiescent(
    pid: i32,
    sh: &Shadows,
    late: &[Planned],
    shm: &Shm,
    timeout: Duration,
) -> Result<()> {
    let code = sh.busy_code;
    let tls_offset = sh.tls_offset;
    let start = Instant::now();
    loop {
        let w = StoppedProcess::stop(pid).map_err(|e| anyhow!("{e}"))?;
        // In the code, about to return from a signal handler (into it, maybe), or
        // running a handler that interrupted the thread in it (it returns there).
        let mut busy = !w.threads_in(code).is_empty()
            || w.threads().iter().any(|t| {
                about_to_sigreturn(&w, t)
                    || sh
                        .frames
                        .interrupted(&w, t.regs().rsp)
                        .iter()
                        .any(|pc| code.iter().any(|r| r.contains(pc)))
            });
        if !busy {
            for t in w.threads() {
                let tls = t.regs().fs_base.wrapping_add(tls_offset as u64);
                let mut p = [0u8; 8];
                if w.read_mem(tls, &mut p).is_err() {
                    continue;
                }
                let at = u64::from_le_bytes(p);
                if at == 0 {
                    continue;
                }
                if agent_busy(&w, at) {
                    busy = true;
                    break;
                }
            }
        }
        let give_up = busy && start.elapsed() > timeout;
        if !busy {
            // Hijacks made after the sites were restored, by threads that were in a
            // trampoline then, and those of threads skipped at the restore.
            unhijack(&w, sh, true);
        }
        if !busy || give_up {
            restore_stopped(&w, late, shm)?;
        }
        w.resume().map_err(|e| anyhow!("{e}"))?;
        if !busy {
            return Ok(());
        }
        if give_up {
            bail!(
                "a thread of {pid} stayed inside advice, the session's code or a signal handler that interrupted it there for {} s; leaving its code mapped",
                timeout.as_secs()
            );
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}
