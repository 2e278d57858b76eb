//! What /proc says about a process, read without stopping it.
//!
//! Nothing here resolves a path through `/proc/PID/root` or `/proc/PID/cwd`: those
//! magic links lead into the target's mount namespace, and paths inside it are the
//! caller's business.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use crate::error::{InjectError, Result};

fn proc_path(pid: i32, file: &str) -> PathBuf {
    PathBuf::from(format!("/proc/{pid}/{file}"))
}

/// Maps a /proc read error: a vanished directory means the process is gone.
fn proc_error(pid: i32, path: &Path, source: io::Error) -> InjectError {
    if source.kind() == io::ErrorKind::NotFound || source.raw_os_error() == Some(libc::ESRCH) {
        InjectError::NoSuchProcess { pid }
    } else {
        InjectError::Proc {
            path: path.to_path_buf(),
            source,
        }
    }
}

fn read_proc(pid: i32, file: &str) -> Result<String> {
    let path = proc_path(pid, file);
    fs::read_to_string(&path).map_err(|e| proc_error(pid, &path, e))
}

/// True if `pid` is a process (a thread-group leader), live or zombie. A thread id
/// that is not a process id is not a process.
pub fn process_exists(pid: i32) -> bool {
    pid > 0 && status(pid).is_ok_and(|s| s.tgid == pid)
}

/// The process's command name (`/proc/PID/comm`, at most 15 bytes).
pub fn comm(pid: i32) -> Result<String> {
    Ok(read_proc(pid, "comm")?.trim_end_matches('\n').to_string())
}

/// The path of the process's executable as the kernel reports it: within the
/// target's mount namespace, with `" (deleted)"` appended if the file was removed.
/// Read with readlink; never followed.
pub fn exe(pid: i32) -> Result<PathBuf> {
    let path = proc_path(pid, "exe");
    fs::read_link(&path).map_err(|e| {
        if e.kind() == io::ErrorKind::NotFound && !proc_path(pid, "").exists() {
            InjectError::NoSuchProcess { pid }
        } else if matches!(e.raw_os_error(), Some(libc::EACCES | libc::EPERM)) {
            // The kernel checks ptrace access for this link: say why it refused.
            InjectError::PermissionDenied {
                pid,
                reason: permission_reason(pid),
            }
        } else {
            InjectError::Proc { path, source: e }
        }
    })
}

/// The thread ids of the process, sorted, the main thread first.
pub fn threads(pid: i32) -> Result<Vec<i32>> {
    let path = proc_path(pid, "task");
    let entries = fs::read_dir(&path).map_err(|e| proc_error(pid, &path, e))?;
    let mut tids: Vec<i32> = entries
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    tids.sort_by_key(|&tid| (tid != pid, tid));
    Ok(tids)
}

/// The fields of `/proc/PID/status` weft uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Status {
    /// First letter of `State:` (`R`, `S`, `D`, `T`, `t`, `Z`, `X`...).
    pub state: char,
    pub tgid: i32,
    /// The tracer's thread id, 0 if untraced.
    pub tracer: i32,
    /// Real, effective, saved, filesystem.
    pub uids: [u32; 4],
    pub gids: [u32; 4],
}

pub(crate) fn parse_status(text: &str) -> Option<Status> {
    let field = |key: &str| {
        text.lines()
            .find_map(|line| line.strip_prefix(key)?.strip_prefix(':'))
            .map(str::trim)
    };
    let ids = |key: &str| -> Option<[u32; 4]> {
        let mut out = [0; 4];
        let mut values = field(key)?.split_whitespace();
        for slot in &mut out {
            *slot = values.next()?.parse().ok()?;
        }
        Some(out)
    };
    Some(Status {
        state: field("State")?.chars().next()?,
        tgid: field("Tgid")?.parse().ok()?,
        tracer: field("TracerPid")?.parse().ok()?,
        uids: ids("Uid")?,
        gids: ids("Gid")?,
    })
}

/// `/proc/PID/status` of a process or (as `/proc/TID/status`) of any thread.
pub(crate) fn status(tid: i32) -> Result<Status> {
    let path = proc_path(tid, "status");
    let text = fs::read_to_string(&path).map_err(|e| proc_error(tid, &path, e))?;
    parse_status(&text).ok_or_else(|| InjectError::Proc {
        path,
        source: io::Error::new(io::ErrorKind::InvalidData, "unexpected format"),
    })
}

/// State letter of one thread, `None` if it is gone.
pub(crate) fn thread_state(pid: i32, tid: i32) -> Option<char> {
    let text = fs::read_to_string(format!("/proc/{pid}/task/{tid}/stat")).ok()?;
    // "tid (comm) S ...": comm may contain spaces and parentheses; the state follows
    // the last ')'.
    text[text.rfind(')')? + 1..].trim_start().chars().next()
}

/// A signal mask field of one thread's status (`SigPnd`: queued for it alone,
/// `SigBlk`, `SigCgt`: caught, ...), bit `n - 1` for signal `n`; 0 if unreadable.
pub fn signal_mask(pid: i32, tid: i32, field: &str) -> u64 {
    fs::read_to_string(format!("/proc/{pid}/task/{tid}/status"))
        .ok()
        .and_then(|text| {
            let hex = text
                .lines()
                .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))?;
            u64::from_str_radix(hex.trim(), 16).ok()
        })
        .unwrap_or(0)
}

/// The system call number a stopped or blocked thread is in
/// (`/proc/PID/task/TID/syscall`), `None` if it is not in one or it is unreadable.
pub(crate) fn thread_syscall(pid: i32, tid: i32) -> Option<i64> {
    let text = fs::read_to_string(format!("/proc/{pid}/task/{tid}/syscall")).ok()?;
    let nr: i64 = text.split_whitespace().next()?.parse().ok()?;
    (nr >= 0).then_some(nr)
}

/// The capability bit that lets a process trace any other (linux/capability.h).
const CAP_SYS_PTRACE: u32 = 19;

/// Why PTRACE_SEIZE of `pid` failed with EPERM, as far as /proc lets us tell.
pub(crate) fn permission_reason(pid: i32) -> String {
    let Ok(target) = status(pid) else {
        return "the kernel refused".to_string();
    };
    if target.tracer != 0 {
        // TracerPid names the tracer *thread*; name its process.
        let tracer = status(target.tracer).map_or(target.tracer, |s| s.tgid);
        let name = comm(tracer).unwrap_or_else(|_| "?".to_string());
        return format!("already traced by process {tracer} ({name})");
    }
    let ours = status(std::process::id() as i32).ok();
    let has_cap = fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|text| {
            let hex = text.lines().find_map(|l| l.strip_prefix("CapEff:"))?.trim();
            u64::from_str_radix(hex, 16).ok()
        })
        .is_some_and(|caps| caps & (1 << CAP_SYS_PTRACE) != 0);
    if !has_cap {
        if let Some(ours) = &ours {
            // The kernel compares our real uid/gid with the target's real, effective
            // and saved ones.
            if target.uids[..3].iter().any(|&u| u != ours.uids[0]) {
                return format!(
                    "target runs as uid {} and weft as uid {}, without CAP_SYS_PTRACE",
                    target.uids[1], ours.uids[0]
                );
            }
            if target.gids[..3].iter().any(|&g| g != ours.gids[0]) {
                return format!(
                    "target runs as gid {} and weft as gid {}, without CAP_SYS_PTRACE",
                    target.gids[1], ours.gids[0]
                );
            }
        }
        if let Ok(scope) = fs::read_to_string("/proc/sys/kernel/yama/ptrace_scope") {
            match scope.trim() {
                "1" => {
                    return "kernel.yama.ptrace_scope is 1: only an ancestor may attach without CAP_SYS_PTRACE".to_string()
                }
                "2" => return "kernel.yama.ptrace_scope is 2: attaching needs CAP_SYS_PTRACE".to_string(),
                "3" => return "kernel.yama.ptrace_scope is 3: attaching is disabled".to_string(),
                _ => {}
            }
        }
        return "the target is not dumpable (setuid, setcap or prctl(PR_SET_DUMPABLE)) and weft lacks CAP_SYS_PTRACE".to_string();
    }
    "the kernel refused (a security module may deny ptrace)".to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    const STATUS: &str = "Name:\tcat\nUmask:\t0022\nState:\tS (sleeping)\nTgid:\t4242\nNgid:\t0\nPid:\t4243\nPPid:\t1\nTracerPid:\t17\nUid:\t1000\t1001\t1002\t1003\nGid:\t5\t6\t7\t8\n";

    #[test]
    fn parses_status() {
        assert_eq!(
            parse_status(STATUS),
            Some(Status {
                state: 'S',
                tgid: 4242,
                tracer: 17,
                uids: [1000, 1001, 1002, 1003],
                gids: [5, 6, 7, 8],
            })
        );
        assert_eq!(parse_status("Name:\tx\n"), None);
    }

    #[test]
    fn reads_own_process() {
        let pid = std::process::id() as i32;
        assert!(process_exists(pid));
        let tid = crate::sys::gettid();
        let tids = threads(pid).unwrap();
        assert_eq!(tids[0], pid);
        assert!(tids.contains(&tid));
        assert_eq!(thread_state(pid, tid), Some('R'));
        assert_eq!(
            exe(pid).unwrap(),
            std::env::current_exe().unwrap().canonicalize().unwrap()
        );
        assert!(!process_exists(i32::MAX));
        assert!(!process_exists(0));
        assert!(matches!(
            comm(i32::MAX),
            Err(InjectError::NoSuchProcess { pid: i32::MAX })
        ));
    }
}
