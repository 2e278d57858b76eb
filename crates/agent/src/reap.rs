//! Finding the target's threads that are gone, so that what they held (their slot in
//! the session, their `AgentThread` and shadow stack) serves new threads. Runs on
//! the control thread, every few milliseconds while threads come and go; the hot
//! path does nothing for it.
//!
//! A thread is gone once the kernel has run its `mm_release`: that writes 0 into the
//! thread's clear-child-tid word (glibc points it at `pthread->tid`), and the thread
//! runs no user code afterwards. Each thread records the word's address when it
//! takes its `AgentThread` (`prctl(PR_GET_TID_ADDRESS)`, see `threads`); the reaper
//! reads the words of all recorded threads with `process_vm_readv` on its own
//! process (1024 per call; an unmapped word, a freed stack, is reported, not a
//! fault). A thread whose word no longer holds its tid is gone. The word is trusted
//! only once it has been seen holding the tid: an address that is not glibc's
//! (`set_tid_address` pointing elsewhere) goes to the fallback.
//!
//! Fallback (no address: a raw `clone` thread, a kernel without
//! `PR_GET_TID_ADDRESS`; a word that never held the tid or cannot be read):
//! `/proc/TID/stat`, gone when it is missing or a zombie, or when its start time
//! differs from the one first seen there (the tid was reused).
//!
//! tid reuse (after `pid_max` wraps) never hands a thread's slot to another: slots
//! and `AgentThread`s belong to pool entries, and a new thread always takes a new
//! entry through its empty TLS slot. The most a reused tid can do is make a gone
//! thread look alive for longer (its word's memory reused by a new thread with the
//! same tid, or a start time first read after the reuse): its resources come back
//! late, never early.

use core::sync::atomic::Ordering;

use weft_abi::THREAD_FLAG_IGNORE;

use crate::ret;
use crate::threads::{self, RECORDS, RECORD_IN_USE, RECORD_KEPT};

/// How a thread's liveness is decided.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum How {
    /// Its clear-child-tid word, not yet seen holding the tid.
    #[default]
    Unchecked,
    /// Its clear-child-tid word, seen holding the tid.
    Word,
    /// `/proc/TID/stat`.
    Proc,
}

#[derive(Clone, Copy, Debug, Default)]
struct Seen {
    /// `Record::uses` this was learnt for (the entry's current thread).
    uses: u32,
    how: How,
    /// Start time from `/proc/TID/stat` (clock ticks since boot), 0 until read.
    start: u64,
}

pub struct Reaper {
    seen: Vec<Seen>,
    /// `process_vm_readv` works on our own process (seccomp may forbid it).
    vm_read: bool,
    /// `/proc` is there (else the fallback never declares a thread gone).
    proc_ok: bool,
    started: u64,
    quiet: u32,
    /// Threads found gone so far.
    pub reaped: u64,
    /// `WEFT_REAP_MS`: a fixed interval between looks, for tests that show what
    /// does not depend on the reaper's pace (a thread's exit hook).
    fixed_ms: Option<u64>,
}

impl Default for Reaper {
    fn default() -> Self {
        Reaper {
            seen: Vec::new(),
            vm_read: true,
            proc_ok: std::path::Path::new("/proc/self/stat").exists(),
            started: 0,
            quiet: 0,
            reaped: 0,
            fixed_ms: std::env::var("WEFT_REAP_MS")
                .ok()
                .and_then(|v| v.parse().ok()),
        }
    }
}

impl Reaper {
    /// One look at every thread holding an `AgentThread`: those gone give back
    /// their slot and their entry.
    pub fn tick(&mut self) {
        let n = threads::high_water();
        if self.seen.len() < n {
            self.seen.resize(n, Seen::default());
        }
        let mut words: Vec<(usize, u64, u32)> = Vec::new();
        let mut gone: Vec<usize> = Vec::new();
        for (i, r) in RECORDS.iter().enumerate().take(n) {
            match r.state.load(Ordering::Acquire) {
                RECORD_IN_USE => {}
                RECORD_KEPT => {
                    gone.push(i);
                    continue;
                }
                _ => continue,
            }
            let t = threads::entry(i);
            // SAFETY: a pool entry; its thread wrote tid before publishing the record
            // (release, read above with acquire), and only the control thread itself
            // sets the flag read here (`mark_ignored`).
            let (tid, flags) = unsafe {
                (
                    core::ptr::addr_of!((*t).tid).read_volatile(),
                    core::ptr::addr_of!((*t).flags).read_volatile(),
                )
            };
            if flags & THREAD_FLAG_IGNORE != 0 {
                continue;
            }
            let uses = r.uses.load(Ordering::Relaxed);
            let address = r.tid_address.load(Ordering::Relaxed);
            let seen = &mut self.seen[i];
            if seen.uses != uses {
                *seen = Seen {
                    uses,
                    how: if address != 0 && self.vm_read {
                        How::Unchecked
                    } else {
                        How::Proc
                    },
                    start: 0,
                };
            }
            if seen.how == How::Proc {
                if self.proc_ok && proc_gone(tid, &mut seen.start) {
                    gone.push(i);
                }
            } else {
                words.push((i, address, tid));
            }
        }
        if !words.is_empty() {
            let addrs: Vec<u64> = words.iter().map(|w| w.1).collect();
            let values = match read_own(&addrs, 4) {
                Ok(v) => v,
                Err(()) => {
                    self.vm_read = false;
                    vec![None; addrs.len()]
                }
            };
            for (&(i, _, tid), v) in words.iter().zip(values) {
                let seen = &mut self.seen[i];
                match v {
                    Some(w) if w as u32 == tid => seen.how = How::Word,
                    Some(_) if seen.how == How::Word => gone.push(i),
                    _ => {
                        seen.how = How::Proc;
                        if self.proc_ok && proc_gone(tid, &mut seen.start) {
                            gone.push(i);
                        }
                    }
                }
            }
        }
        // A thread is gone, but is its entry unreachable? Not while the TLS slot it
        // was taken through still points at it (see `Record::tls_slot`); an
        // unreadable slot (the TLS block unmapped) cannot be used either.
        let kept: Vec<usize> = gone
            .iter()
            .copied()
            .filter(|&i| RECORDS[i].state.load(Ordering::Acquire) == RECORD_IN_USE)
            .collect();
        if !kept.is_empty() {
            let addrs: Vec<u64> = kept
                .iter()
                .map(|&i| RECORDS[i].tls_slot.load(Ordering::Relaxed))
                .collect();
            let reachable: Vec<usize> = match read_own(&addrs, 8) {
                Ok(values) => kept
                    .iter()
                    .zip(values)
                    .filter(|(&i, v)| *v == Some(threads::entry(i) as u64))
                    .map(|(&i, _)| i)
                    .collect(),
                // Cannot tell: keep them all.
                Err(()) => kept,
            };
            gone.retain(|i| !reachable.contains(i));
        }
        let mut freed = 0;
        for i in gone {
            if threads::reap(i, shadow_idle) {
                freed += 1;
            }
        }
        self.reaped += freed;
        let started = threads::STARTED.load(Ordering::Relaxed);
        if started != self.started || freed > 0 {
            self.quiet = 0;
        } else {
            self.quiet = self.quiet.saturating_add(1);
        }
        self.started = started;
    }

    /// Milliseconds until the next look: 5 while threads start or end (weft drains
    /// at the same pace), 100 once nothing has changed for a while.
    pub fn interval_ms(&self) -> u64 {
        if let Some(ms) = self.fixed_ms {
            ms
        } else if self.quiet < 40 {
            5
        } else {
            100
        }
    }
}

/// Whether the thread `tid` is gone, by `/proc/TID/stat` (`start`: its start time
/// as first seen, 0 before).
fn proc_gone(tid: u32, start: &mut u64) -> bool {
    let stat = match std::fs::read(format!("/proc/{tid}/stat")) {
        Ok(s) => s,
        Err(e) => {
            return e.kind() == std::io::ErrorKind::NotFound
                || e.raw_os_error() == Some(libc::ESRCH);
        }
    };
    let Some(close) = stat.iter().rposition(|&b| b == b')') else {
        return false;
    };
    let rest = String::from_utf8_lossy(&stat[close + 1..]);
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // After the command: state (field 3), ..., starttime (field 22).
    let (Some(state), Some(st)) = (fields.first(), fields.get(19)) else {
        return false;
    };
    if matches!(*state, "Z" | "X" | "x") {
        return true;
    }
    let Ok(st) = st.parse::<u64>() else {
        return false;
    };
    if *start == 0 {
        *start = st;
        return false;
    }
    st != *start
}

/// Whether a gone thread's shadow stack holds no return address that a frame
/// elsewhere may still return through: every entry is claimed, or its stack slot no
/// longer holds the return trampoline (a frame left by `longjmp` or by the thread's
/// exit). A coroutine stack suspended inside probed frames keeps the entry, and the
/// `AgentThread` with it, until it returns.
fn shadow_idle(t: *mut weft_abi::AgentThread) -> bool {
    let slots = ret::pending_slots(t);
    if slots.is_empty() {
        return true;
    }
    let tramp = ret::trampoline_addr();
    match read_own(&slots, 8) {
        Ok(v) => !v.contains(&Some(tramp)),
        Err(()) => false,
    }
}

/// Read `size` (4 or 8) bytes at each of `addrs` in our own process, without
/// faulting: `None` where nothing is mapped. `Err` when `process_vm_readv` cannot be
/// used at all.
pub(crate) fn read_own(addrs: &[u64], size: usize) -> Result<Vec<Option<u64>>, ()> {
    let mut bufs = vec![0u64; addrs.len()];
    let mut out = vec![None; addrs.len()];
    let done = own_batches(addrs, size, |pid, range, remote| {
        let local: Vec<libc::iovec> = bufs[range]
            .iter_mut()
            .map(|b| libc::iovec {
                iov_base: b as *mut u64 as *mut libc::c_void,
                iov_len: size,
            })
            .collect();
        // SAFETY: `local` describes our own buffers (size <= 8 bytes each); the
        // kernel checks the remote addresses and reports what it could not read.
        unsafe {
            libc::process_vm_readv(
                pid,
                local.as_ptr(),
                local.len() as libc::c_ulong,
                remote.as_ptr(),
                remote.len() as libc::c_ulong,
                0,
            )
        }
    })?;
    for k in done {
        out[k] = Some(bufs[k]);
    }
    Ok(out)
}

/// Write 8 zero bytes at each of `addrs` in our own process, without faulting (an
/// address no longer mapped is skipped). `Err` when `process_vm_writev` cannot be
/// used at all.
pub(crate) fn zero_own(addrs: &[u64]) -> Result<(), ()> {
    let zero = 0u64;
    own_batches(addrs, 8, |pid, range, remote| {
        let local = libc::iovec {
            iov_base: &zero as *const u64 as *mut libc::c_void,
            iov_len: 8,
        };
        let locals = vec![local; range.len()];
        // SAFETY: the local buffers are our 8 zero bytes (only read); the kernel
        // checks the remote addresses and reports what it could not write.
        unsafe {
            libc::process_vm_writev(
                pid,
                locals.as_ptr(),
                locals.len() as libc::c_ulong,
                remote.as_ptr(),
                remote.len() as libc::c_ulong,
                0,
            )
        }
    })
    .map(drop)
}

/// `io` (a `process_vm_readv`/`writev` of our own pid) over `addrs`, `size` bytes
/// each, in batches of at most `IOV_MAX`: given the pid, the batch's range of
/// `addrs` and its remote iovecs, it returns the syscall's result. An element the
/// kernel could not reach ends its batch short and is skipped. The indices of the
/// elements transferred; `Err` when the call fails otherwise than `EFAULT`.
fn own_batches(
    addrs: &[u64],
    size: usize,
    mut io: impl FnMut(libc::pid_t, std::ops::Range<usize>, &[libc::iovec]) -> isize,
) -> Result<Vec<usize>, ()> {
    const IOV_MAX: usize = 1024;
    // SAFETY: getpid has no preconditions.
    let pid = unsafe { libc::getpid() };
    let mut done_all = Vec::new();
    let mut start = 0;
    while start < addrs.len() {
        let end = (start + IOV_MAX).min(addrs.len());
        let remote: Vec<libc::iovec> = addrs[start..end]
            .iter()
            .map(|&a| libc::iovec {
                iov_base: a as *mut libc::c_void,
                iov_len: size,
            })
            .collect();
        let r = io(pid, start..end, &remote);
        let done = if r < 0 {
            if std::io::Error::last_os_error().raw_os_error() != Some(libc::EFAULT) {
                return Err(());
            }
            0
        } else {
            r as usize / size
        };
        done_all.extend(start..start + done);
        start = if start + done < end {
            start + done + 1
        } else {
            end
        };
    }
    Ok(done_all)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_own_memory_and_reports_holes() {
        let a = 0x1122_3344_5566_7788u64;
        let b = 42u32;
        // SAFETY: mapping and unmapping a page of our own.
        let hole = unsafe {
            let p = libc::mmap(
                core::ptr::null_mut(),
                4096,
                libc::PROT_READ,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            );
            libc::munmap(p, 4096);
            p as u64
        };
        let addrs = [&a as *const u64 as u64, hole, &b as *const u32 as u64];
        let v = read_own(&addrs, 4).unwrap();
        assert_eq!(v, vec![Some(0x5566_7788), None, Some(42)]);
        let v = read_own(&addrs[..1], 8).unwrap();
        assert_eq!(v, vec![Some(a)]);
    }

    #[test]
    fn zeroes_own_memory_and_skips_holes() {
        let mut a = [u64::MAX; 3];
        // SAFETY: mapping and unmapping a page of our own.
        let hole = unsafe {
            let p = libc::mmap(
                core::ptr::null_mut(),
                4096,
                libc::PROT_READ,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            );
            libc::munmap(p, 4096);
            p as u64
        };
        let addrs = [
            &mut a[0] as *mut u64 as u64,
            hole,
            &mut a[2] as *mut u64 as u64,
        ];
        zero_own(&addrs).unwrap();
        // SAFETY: reading our own array after the kernel wrote it.
        let v = unsafe { core::ptr::read_volatile(&a) };
        assert_eq!(v, [0, u64::MAX, 0]);
    }

    #[test]
    fn proc_stat_tells_a_live_thread_from_a_gone_one() {
        // SAFETY: gettid has no preconditions.
        let me = unsafe { libc::gettid() } as u32;
        let mut start = 0;
        assert!(!proc_gone(me, &mut start));
        assert_ne!(start, 0);
        assert!(!proc_gone(me, &mut start));
        let mut other = start + 1;
        assert!(proc_gone(me, &mut other), "another start time: tid reused");
        // SAFETY: gettid has no preconditions.
        let t = std::thread::spawn(|| unsafe { libc::gettid() } as u32);
        let gone_tid = t.join().unwrap();
        let mut s = 0;
        // Joined: the kernel has released it (CLONE_CHILD_CLEARTID woke the joiner).
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while !proc_gone(gone_tid, &mut s) {
            assert!(
                std::time::Instant::now() < deadline,
                "{gone_tid} never gone"
            );
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }

    #[test]
    fn clear_child_tid_word_holds_the_tid_then_zero() {
        // The protocol the reaper relies on, checked on this machine's glibc/kernel.
        let (tx, rx) = std::sync::mpsc::channel();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let h = std::thread::spawn(move || {
            let mut addr = 0u64;
            // SAFETY: PR_GET_TID_ADDRESS stores the address in `addr`.
            let r = unsafe { libc::prctl(libc::PR_GET_TID_ADDRESS, &mut addr as *mut u64) };
            // SAFETY: gettid has no preconditions.
            let tid = unsafe { libc::gettid() } as u32;
            tx.send((r, addr, tid)).unwrap();
            done_rx.recv().unwrap();
        });
        let (r, addr, tid) = rx.recv().unwrap();
        assert_eq!(r, 0);
        assert_ne!(addr, 0);
        assert_eq!(read_own(&[addr], 4).unwrap(), vec![Some(u64::from(tid))]);
        done_tx.send(()).unwrap();
        h.join().unwrap();
        let v = read_own(&[addr], 4).unwrap();
        assert_ne!(v, vec![Some(u64::from(tid))], "cleared at exit");
    }
}
