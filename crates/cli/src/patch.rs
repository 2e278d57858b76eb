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
/// are marked `Skipped`.
pub fn apply(pid: i32, sites: &mut [Planned], shm: &Shm) -> Result<PatchReport> {
    apply_stepping_out_of(pid, sites, shm, &[])
}

/// As [`apply`], and first step every thread out of `bodies` too (whole functions
/// that are redirected: a thread inside one would finish the original).
pub fn apply_stepping_out_of(
    pid: i32,
    sites: &mut [Planned],
    shm: &Shm,
    bodies: &[Range<u64>],
) -> Result<PatchReport> {
    let mut w = StoppedProcess::stop(pid).map_err(|e| anyhow!("{e}"))?;
    let mut report = PatchReport {
        threads: w.threads().len(),
        ..PatchReport::default()
    };
    let mut inside: Vec<Range<u64>> = sites
        .iter()
        .filter(|s| !s.patch.is_empty())
        .map(|s| s.addr + 1..s.addr + s.patch.len() as u64)
        .filter(|r| !r.is_empty())
        .collect();
    inside.extend(bodies.iter().cloned());
    let max_steps = if bodies.is_empty() { 64 } else { 1024 };
    for tid in w.threads_in(&inside) {
        w.step_out(tid, &inside, max_steps)
            .map_err(|e| anyhow!("{e}"))?;
        report.stepped_threads += 1;
    }
    let mut cur = [0u8; weft_abi::SITE_MAX_BYTES];
    for s in sites.iter_mut() {
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
        d.state.store(SITE_PATCHED, Ordering::Release);
        if let Some(sem) = s.semaphore {
            bump_semaphore(&w, sem, 1)?;
        }
        report.patched += 1;
    }
    report.pause = w.resume().map_err(|e| anyhow!("{e}"))?;
    Ok(report)
}

/// Put the original bytes back at every patched site.
pub fn restore(pid: i32, sites: &[Planned], shm: &Shm) -> Result<Duration> {
    let w = StoppedProcess::stop(pid).map_err(|e| anyhow!("{e}"))?;
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
        }
        d.state.store(SITE_RESTORED, Ordering::Release);
        if let Some(sem) = s.semaphore {
            bump_semaphore(&w, sem, -1)?;
        }
    }
    w.resume().map_err(|e| anyhow!("{e}"))
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
                || queued_signals(pid, t.tid()).is_some_and(|m| {
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
        return restore(pid, sites, shm);
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

/// Wait until no thread is inside advice (`AgentThread::nest`), a trampoline or a
/// code region, or the agent's return trampoline, checking with the world stopped.
pub fn wait_quiescent(
    pid: i32,
    code: &[Range<u64>],
    tls_offset: i64,
    timeout: Duration,
) -> Result<()> {
    let start = Instant::now();
    loop {
        let w = StoppedProcess::stop(pid).map_err(|e| anyhow!("{e}"))?;
        let mut busy = !w.threads_in(code).is_empty();
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
                let mut nest = [0u8; 4];
                if w.read_mem(at + weft_abi::AGENT_THREAD_NEST_OFF as u64, &mut nest)
                    .is_ok()
                    && u32::from_le_bytes(nest) != 0
                {
                    busy = true;
                    break;
                }
            }
        }
        w.resume().map_err(|e| anyhow!("{e}"))?;
        if !busy {
            return Ok(());
        }
        if start.elapsed() > timeout {
            bail!(
                "a thread of {pid} stayed inside advice for {} s; leaving its code mapped",
                timeout.as_secs()
            );
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}
