//! Other processes sharing the stopped process's memory.
//!
//! `clone(CLONE_VM)` without `CLONE_THREAD` makes a new *process* (its own thread
//! group, signal dispositions and `/proc/PID/task`) that runs in the same address
//! space. Code weft rewrites is that process's code too, so "every thread stopped"
//! must include its threads: after the process's own threads are all stopped,
//! [`StoppedProcess::stop_sharers`] scans `/proc` for processes whose mm is the
//! same (`kcmp(KCMP_VM)`) and stops their threads as well, scanning again until a
//! scan finds nothing new (a sharer may have made another one before it stopped).
//! Their threads are held like the process's own: they are in
//! [`StoppedProcess::threads`], so PC checks, step-outs and remote calls apply to
//! them; [`StoppedProcess::tgid_of`] tells whose they are.
//!
//! The process's own threads are stopped first, then the sharers: a `vfork` child
//! shares the memory until it execs or exits, and its parent cannot stop before
//! that, so by the time the parent is stopped no such child is left to hold.
//!
//! A `clone(CLONE_VM)` child created while weft holds a thread is not attached by
//! the kernel (`PTRACE_O_TRACECLONE` covers only clones that do not report to their
//! parent with SIGCHLD); the rescan after every stop finds it.

use std::time::Duration;

use nix::errno::Errno;

use super::{Deadline, StoppedProcess};
use crate::error::{InjectError, Result};
use crate::process;

/// `kcmp` type: compare the tasks' address spaces.
const KCMP_VM: i64 = 1;

/// What a [`StoppedProcess`] knows of the processes sharing its memory.
#[derive(Debug, Default)]
pub(crate) struct Sharing {
    /// Thread group ids of the sharers found so far.
    procs: Vec<i32>,
    /// Threads of sharers we seized or were attached to, with their thread group.
    tasks: Vec<(i32, i32)>,
}

impl StoppedProcess {
    /// Processes other than [`pid`](Self::pid) that share its address space and
    /// whose threads are held (each such thread is in [`threads`](Self::threads)).
    pub fn sharers(&self) -> Vec<i32> {
        let mut out: Vec<i32> = self
            .threads
            .iter()
            .map(|t| self.tgid_of(t.tid))
            .filter(|&g| g != self.pid)
            .collect();
        out.sort_unstable();
        out.dedup();
        out
    }

    /// The process (thread group) a held thread belongs to: [`pid`](Self::pid), or a
    /// process sharing its memory.
    pub fn tgid_of(&self, tid: i32) -> i32 {
        self.sharing
            .tasks
            .iter()
            .find(|&&(t, _)| t == tid)
            .map_or(self.pid, |&(_, g)| g)
    }

    /// A held thread of the process itself, the reference for `kcmp` (a main thread
    /// that exited has no mm any more).
    fn own_thread(&self) -> Option<i32> {
        self.threads
            .iter()
            .map(|t| t.tid)
            .find(|&t| self.tgid_of(t) == self.pid)
    }

    /// True if `tgid` is the process or one of the sharers we hold threads of.
    pub(crate) fn holds_process(&self, tgid: i32) -> bool {
        tgid == self.pid || self.sharing.procs.contains(&tgid)
    }

    /// A new process made by a held thread (a clone event): if it shares the memory,
    /// hold it as a sharer (rather than letting it go at its first stop).
    pub(crate) fn adopt_sharer(&mut self, tgid: i32) -> bool {
        let shares = shares_mm(self.own_thread().unwrap_or(self.pid), tgid);
        if shares && !self.sharing.procs.contains(&tgid) {
            self.sharing.procs.push(tgid);
        }
        shares
    }

    /// A thread created by a held thread (seen through a clone event): remember
    /// whose it is when it is a sharer's.
    pub(crate) fn note_sharer_task(&mut self, tid: i32, tgid: i32) {
        if tgid != self.pid && !self.sharing.tasks.iter().any(|&(t, _)| t == tid) {
            self.sharing.tasks.push((tid, tgid));
        }
    }

    /// With every thread of the process stopped: stop every thread of every other
    /// process sharing its memory, until a scan finds none we do not hold. Then let
    /// go of those that no longer share it (a `vfork` child caught in `execve`).
    pub(super) fn stop_sharers(&mut self, deadline: Deadline, timeout: Duration) -> Result<()> {
        const WHAT: &str = "waiting for the processes sharing its memory to stop";
        loop {
            let mut seized = false;
            let Some(me) = self.own_thread() else {
                return Ok(());
            };
            for tgid in sharing_mm(self.pid, me) {
                let Ok(tids) = process::threads(tgid) else {
                    continue; // gone meanwhile
                };
                if !self.sharing.procs.contains(&tgid) {
                    self.sharing.procs.push(tgid);
                }
                for tid in tids {
                    if !self.knows(tid) {
                        self.note_sharer_task(tid, tgid);
                        seized |= self.seize(tid)?;
                    }
                }
            }
            if !seized && self.awaiting.is_empty() {
                break;
            }
            if deadline.passed() {
                return Err(InjectError::Timeout {
                    pid: self.pid,
                    what: WHAT,
                    after: timeout,
                });
            }
            self.await_stops(deadline, WHAT)?;
        }
        let me = self.own_thread().unwrap_or(self.pid);
        for tgid in self.sharing.procs.clone() {
            if !shares_mm(me, tgid) {
                self.release_process(tgid);
            }
        }
        Ok(())
    }

    /// Lets every held thread of sharer `tgid` go.
    fn release_process(&mut self, tgid: i32) {
        let (mine, others): (Vec<_>, Vec<_>) = std::mem::take(&mut self.threads)
            .into_iter()
            .partition(|t| self.tgid_of(t.tid) == tgid);
        self.threads = others;
        for t in mine {
            if !matches!(super::detach_thread(tgid, &t), Ok(true)) {
                self.dying.push(t.tid);
            }
        }
        self.sharing.procs.retain(|&g| g != tgid);
    }
}

/// Processes other than `pid` (and weft) whose address space is that of `pid`'s
/// thread `me`. Empty if the kernel has no `kcmp` (then sharers are not seen).
fn sharing_mm(pid: i32, me: i32) -> Vec<i32> {
    let weft = std::process::id() as i32;
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for entry in dir.flatten() {
        let Some(other) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<i32>().ok())
        else {
            continue;
        };
        if other == pid || other == weft {
            continue;
        }
        match kcmp_vm(me, other) {
            Ok(true) if has_mm(other) => out.push(other),
            Ok(_) => {}
            Err(Errno::ENOSYS) => return Vec::new(),
            // EPERM (not ours to inspect), ESRCH (gone): not a sharer we can hold.
            Err(_) => {}
        }
    }
    out.sort_unstable();
    out
}

/// Whether tasks `a` and `b` share one address space (and have one).
fn shares_mm(a: i32, b: i32) -> bool {
    kcmp_vm(a, b) == Ok(true) && has_mm(b)
}

/// False for a kernel thread or an exited task: no address space (their mm
/// pointers are all null, so `kcmp` calls them equal).
fn has_mm(tid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{tid}/statm"))
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .is_some_and(|size| size > 0)
}

/// Whether tasks `a` and `b` have the same mm pointer.
fn kcmp_vm(a: i32, b: i32) -> std::result::Result<bool, Errno> {
    // SAFETY: kcmp takes integers only.
    let r = unsafe { libc::syscall(libc::SYS_kcmp, a, b, KCMP_VM, 0, 0) };
    Errno::result(r).map(|r| r == 0)
}
