//! Getting the agent into the target: launch a command with it preloaded, or load it
//! into a running process through ptrace.

use std::path::{Path, PathBuf};
use std::process::{Child, Command};

use crate::safepoint;
use anyhow::{anyhow, bail, Context, Result};
use weft_inject::{CallArg, StoppedProcess};
use weft_symbols::{ElfFile, ProcMaps};

pub const AGENT_FILE: &str = "libweft_agent.so";

/// Where the agent library is: `$WEFT_AGENT`, else beside the `weft` executable,
/// else `../lib/weft/` relative to it.
pub fn agent_path() -> Result<PathBuf> {
    if let Ok(p) = std::env::var("WEFT_AGENT") {
        return Ok(PathBuf::from(p));
    }
    let exe = std::env::current_exe().context("locating the weft executable")?;
    let dir = exe
        .parent()
        .ok_or_else(|| anyhow!("weft executable has no directory"))?;
    for cand in [
        dir.join(AGENT_FILE),
        dir.join("../lib/weft").join(AGENT_FILE),
    ] {
        if cand.is_file() {
            return Ok(cand.canonicalize()?);
        }
    }
    // `cargo test` puts test binaries in target/*/deps/.
    if let Some(parent) = dir.parent() {
        let p = parent.join(AGENT_FILE);
        if p.is_file() {
            return Ok(p.canonicalize()?);
        }
    }
    bail!("cannot find {AGENT_FILE} next to {}; build it with `cargo build -p weft-agent` or set WEFT_AGENT", exe.display())
}

/// The interpreter of a `#!` script (its first word), if `path` is one.
pub fn script_interpreter(path: &Path) -> Option<PathBuf> {
    use std::io::Read;
    let mut head = [0u8; 256];
    let n = std::fs::File::open(path).ok()?.read(&mut head).ok()?;
    let line = head[..n].strip_prefix(b"#!")?;
    let line = &line[..line.iter().position(|&b| b == b'\n').unwrap_or(line.len())];
    let first = std::str::from_utf8(line).ok()?.split_whitespace().next()?;
    Some(PathBuf::from(first))
}

/// Check an executable can take the agent: an x86-64 ELF, dynamically linked, or a
/// `#!` script whose interpreter is one (the kernel runs the interpreter, and the
/// agent loads into it).
pub fn check_executable(path: &Path) -> Result<()> {
    let mut path = path.to_path_buf();
    for _ in 0..4 {
        match script_interpreter(&path) {
            Some(interp) => path = interp,
            None => break,
        }
    }
    let path = path.as_path();
    let elf = ElfFile::open(path).map_err(|e| anyhow!("{e}"))?;
    if elf.is_static() {
        bail!(
            "{} is statically linked: weft loads its agent with the dynamic linker, so static \
             executables are not supported yet",
            path.display()
        );
    }
    Ok(())
}

/// Split a `-c` command line like a shell would for simple cases: whitespace
/// separates words, single and double quotes group, backslash escapes.
pub fn split_command(s: &str) -> Result<Vec<String>> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut in_word = false;
    let mut chars = s.chars();
    let mut quote: Option<char> = None;
    while let Some(c) = chars.next() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some('"'), '\\') => {
                if let Some(n) = chars.next() {
                    cur.push(n);
                }
            }
            (Some(_), c) => cur.push(c),
            (None, '\'' | '"') => {
                quote = Some(c);
                in_word = true;
            }
            (None, '\\') => {
                if let Some(n) = chars.next() {
                    cur.push(n);
                    in_word = true;
                }
            }
            (None, c) if c.is_whitespace() => {
                if in_word {
                    out.push(std::mem::take(&mut cur));
                    in_word = false;
                }
            }
            (None, c) => {
                cur.push(c);
                in_word = true;
            }
        }
    }
    if quote.is_some() {
        bail!("unterminated quote in command `{s}`");
    }
    if in_word {
        out.push(cur);
    }
    if out.is_empty() {
        bail!("empty command");
    }
    Ok(out)
}

/// Resolve a command name through `$PATH` like execvp.
pub fn which(cmd: &str) -> Option<PathBuf> {
    if cmd.contains('/') {
        return Some(PathBuf::from(cmd));
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(cmd))
        .find(|p| p.is_file())
}

/// Start `argv` with the agent preloaded; its constructor connects to `socket` and
/// holds `main` until weft says go. `follow`: the value of
/// [`weft_abi::ENV_FOLLOW`] (none: the agent takes itself out of the environment).
///
/// `hold`: the command stops at its `exec` (traced, before its first instruction),
/// and this returns only then; [`release`] lets it go.
pub fn launch(
    argv: &[String],
    agent: &Path,
    socket: &str,
    follow: Option<&str>,
    hold: bool,
) -> Result<Child> {
    let exe = which(&argv[0]).ok_or_else(|| anyhow!("command not found: {}", argv[0]))?;
    check_executable(&exe)?;
    let mut preload = agent.display().to_string();
    if let Ok(old) = std::env::var("LD_PRELOAD") {
        if !old.is_empty() {
            preload = format!("{preload}:{old}");
        }
    }
    let mut cmd = Command::new(&exe);
    cmd.args(&argv[1..])
        .env("LD_PRELOAD", preload)
        .env(weft_abi::ENV_SOCKET, socket);
    if let Some(value) = follow {
        cmd.env(weft_abi::ENV_FOLLOW, value);
    }
    if hold {
        use std::os::unix::process::CommandExt;
        // SAFETY: ptrace(PTRACE_TRACEME) is a system call, async-signal-safe, as
        // code between fork and exec must be.
        unsafe {
            cmd.pre_exec(|| {
                if libc::ptrace(libc::PTRACE_TRACEME, 0, 0, 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
    let mut child = cmd
        .spawn()
        .with_context(|| format!("starting {}", argv[0]))?;
    if hold {
        // The exec succeeded (spawn says so): the child stops with SIGTRAP after it,
        // before the loader's first instruction.
        let pid = child.id() as i32;
        let mut status = 0;
        // SAFETY: waits for our own child; `status` is a valid out pointer.
        let r = unsafe { libc::waitpid(pid, &mut status, libc::__WALL) };
        if r != pid || !libc::WIFSTOPPED(status) {
            let _ = child.kill();
            let _ = child.wait();
            bail!("{} did not stop at its exec (status {status:#x})", argv[0]);
        }
    }
    Ok(child)
}

/// Let a command [`launch`] held at its `exec` run.
pub fn release(pid: i32) -> Result<()> {
    // SAFETY: detaching from our own traced, stopped child, with no signal.
    if unsafe { libc::ptrace(libc::PTRACE_DETACH, pid, 0, 0) } != 0 {
        bail!(
            "letting process {pid} go after its exec: {}",
            std::io::Error::last_os_error()
        );
    }
    Ok(())
}

/// Address of an exported function in a process's modules (first module that
/// defines it, preferring `prefer` by file name).
pub fn find_function(maps: &ProcMaps, name: &str, prefer: &[&str]) -> Option<u64> {
    let mut modules = maps.modules();
    modules.sort_by_key(|m| {
        let f = m.file_name().to_string();
        prefer
            .iter()
            .position(|p| f.starts_with(p))
            .unwrap_or(usize::MAX)
    });
    for m in modules {
        let Ok(elf) = m.open() else { continue };
        if let Some(v) = elf.symbol_vaddr(name) {
            return Some(m.runtime_addr(v));
        }
    }
    None
}

/// Where `dlopen` and `dlerror` live, by file-name prefix, in order of preference.
const LIBDL: &[&str] = &["libc.so", "libc-", "libdl"];

/// The process is running (it exists and has not exited into a zombie).
pub fn alive(pid: i32) -> bool {
    weft_inject::process::process_exists(pid) && !is_zombie(pid)
}

/// The state letter of `/proc/PID/stat` (`R`, `S`, `Z`, ...), `None` if it is gone.
fn proc_state(pid: i32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // "pid (comm) S ...": comm may hold spaces and parentheses.
    let (_, rest) = stat.rsplit_once(')')?;
    rest.trim_start().chars().next()
}

/// The process has exited but its parent has not reaped it.
/// The name of `pid` if it is a kernel thread (`PF_KTHREAD` in its flags).
pub fn kernel_thread(pid: i32) -> Option<String> {
    const PF_KTHREAD: u64 = 0x0020_0000;
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // pid (comm) state ppid pgrp session tty tpgid flags ...; comm may hold spaces.
    let (head, rest) = stat.rsplit_once(')')?;
    let name = head.split_once('(')?.1.to_string();
    let flags: u64 = rest.split_whitespace().nth(6)?.parse().ok()?;
    (flags & PF_KTHREAD != 0).then_some(name)
}

fn is_zombie(pid: i32) -> bool {
    proc_state(pid) == Some('Z')
}

/// What an attach did, for `-v`.
pub struct AttachReport {
    /// How long the target was stopped in all.
    pub pause: std::time::Duration,
    /// Threads run out of the system libraries to their callers, and threads
    /// single-stepped out (see `safepoint::look`), over every look.
    pub ran_out: usize,
    pub stepped_out: usize,
}

/// Load the agent into running process `pid` (unless it is already there) and tell
/// it to connect to `socket`. `warm`, if given, is waited for before the process is
/// stopped (see `weft_inject::warm`).
pub fn attach(
    pid: i32,
    agent: &Path,
    socket: &str,
    warm: Option<&mut weft_inject::warm::Warm>,
) -> Result<AttachReport> {
    if !weft_inject::process::process_exists(pid) {
        bail!("no process with pid {pid}");
    }
    if is_zombie(pid) {
        bail!("process {pid} has exited (it is a zombie waiting for its parent)");
    }
    if let Some(name) = kernel_thread(pid) {
        bail!("process {pid} ({name}) is a kernel thread: weft weaves into user-space programs");
    }
    attach_to(pid, agent, socket, warm).map_err(|e| {
        // Whatever step failed, a process that ended meanwhile is the reason.
        if exiting(pid) {
            anyhow!("process {pid} exited while weft was attaching")
        } else {
            e
        }
    })
}

/// The process is gone, a zombie, or on its way there: its threads are exiting, or
/// its memory is already released. Waits a little for an exit to show.
fn exiting(pid: i32) -> bool {
    let deadline = std::time::Instant::now() + std::time::Duration::from_millis(200);
    loop {
        if !alive(pid) {
            return true;
        }
        let no_memory =
            std::fs::read_to_string(format!("/proc/{pid}/maps")).is_ok_and(|m| m.is_empty());
        if matches!(proc_state(pid), Some('X' | 'Z')) || no_memory {
            return true;
        }
        if std::time::Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// The modules process `pid` maps, once its `execve` has mapped them. A process
/// met just after it was spawned may still be inside `execve`: its parent (a
/// `vfork`/`posix_spawn` caller) resumes as soon as the old address space is
/// released, before the kernel maps the new executable and its dynamic linker.
/// Such a process maps no loader for a moment; a statically linked one never does.
/// The executable (opened through /proc/PID/exe, whatever mount namespace it is
/// in) decides when it can be read; the mappings otherwise, after a short wait.
fn modules_once_exec_done(pid: i32) -> Result<Vec<weft_symbols::Module>> {
    let dynamic_file = ElfFile::open(Path::new(&format!("/proc/{pid}/exe")))
        .map(|e| !e.is_static())
        .ok();
    let deadline = std::time::Instant::now() + std::time::Duration::from_millis(500);
    loop {
        let maps = ProcMaps::read(pid as u32).map_err(|e| anyhow!("{e}"))?;
        let modules = maps.modules();
        let mapped = modules
            .iter()
            .any(|m| safepoint::is_loader(m) || m.file_name() == AGENT_FILE);
        if mapped || dynamic_file == Some(false) || std::time::Instant::now() > deadline {
            return Ok(modules);
        }
        if !weft_inject::process::process_exists(pid) || is_zombie(pid) {
            bail!("process {pid} exited while weft was attaching");
        }
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
}

fn attach_to(
    pid: i32,
    agent: &Path,
    socket: &str,
    mut warm: Option<&mut weft_inject::warm::Warm>,
) -> Result<AttachReport> {
    match attach_once(pid, agent, socket, warm.as_deref_mut(), false)? {
        Some(r) => Ok(r),
        // The agent's control thread ended while we looked: start one from a safe
        // point.
        None => attach_once(pid, agent, socket, warm, true)?
            .ok_or_else(|| anyhow!("the agent in process {pid} did not start its control thread")),
    }
}

/// One attach; `None` when the agent needed a control thread started and the
/// thread borrowed was not at a safe point (only when `safe` is false).
fn attach_once(
    pid: i32,
    agent: &Path,
    socket: &str,
    warm: Option<&mut weft_inject::warm::Warm>,
    safe: bool,
) -> Result<Option<AttachReport>> {
    weft_inject::die::phase("attach");
    let exe = match weft_inject::process::exe(pid) {
        Ok(e) => e,
        Err(_) if !weft_inject::process::process_exists(pid) || is_zombie(pid) => {
            bail!("process {pid} exited while weft was attaching")
        }
        Err(e) => bail!("{e}"),
    };
    let modules = modules_once_exec_done(pid)?;
    let has_agent = modules.iter().any(|m| m.file_name() == AGENT_FILE);
    // Between sessions the agent keeps no thread: the connect call starts one, and
    // that needs a safe point as the `dlopen` does. With a control thread alive
    // (another session is being served), any thread will do.
    let quick = !safe && has_agent && control_thread_alive(pid);
    if !has_agent && !modules.iter().any(safepoint::is_loader) {
        bail!(
            "process {pid} ({}) is statically linked: weft loads its agent with the dynamic \
             linker, so static executables are not supported yet",
            exe.display()
        );
    }
    // The agent is loaded by a thread borrowed at a moment it cannot be inside the C
    // library (see `safepoint`). A process caught while the dynamic linker is still
    // loading it (libc not mapped or not relocated yet) is let run a little first, as
    // is one whose threads are all busy in the library.
    let since = std::time::Instant::now();
    // What the safe-point judgement needs from libc, found before the pause.
    let mut spots = Some(safepoint::LibcSpots::find(&modules))
        .filter(|_| !quick)
        .filter(safepoint::LibcSpots::complete);
    let mut unwinder = safepoint::Unwinder::default();
    // Threads are run out of the library to a hardware breakpoint: the kernel's
    // one-time cost of the first one is paid before the stop.
    if let Some(w) = warm {
        w.ready();
    }
    let mut pause = std::time::Duration::from_millis(2);
    // Looked up once it is there (libc mapped), not again at every look.
    let mut dlopen = None;
    let (mut stopped, maps, tid) = 'look: loop {
        let mut stopped = StoppedProcess::stop(pid).map_err(|e| anyhow!("{e}"))?;
        // A step-over breakpoint left armed by a weft that died while stepping.
        stopped.clear_breakpoints();
        weft_inject::die::at("attach-stopped");
        let maps = ProcMaps::read(pid as u32).map_err(|e| anyhow!("{e}"))?;
        let modules = maps.modules();
        let loader: Vec<std::ops::Range<u64>> = modules
            .iter()
            .filter(|m| safepoint::is_loader(m))
            .flat_map(|m| m.ranges.clone())
            .collect();
        if !has_agent && dlopen.is_none() {
            dlopen = find_function(&maps, "dlopen", LIBDL);
        }
        let starting = !has_agent && (!stopped.threads_in(&loader).is_empty() || dlopen.is_none());
        let waited = since.elapsed();
        let why = if starting {
            "the dynamic linker is still starting it".to_string()
        } else if quick {
            // Only the agent's own connect function is called, and it starts no
            // thread: any thread will do.
            let tid = stopped.pick_call_thread();
            break 'look (stopped, maps, tid);
        } else {
            let layout = safepoint::Layout::new(&maps, &modules, &mut spots);
            safepoint::drop_stray_traps(&mut stopped, &layout)?;
            match safepoint::look(&mut stopped, &layout, &mut unwinder, since)? {
                safepoint::Look::Borrow(tid) => break (stopped, maps, tid),
                safepoint::Look::Later(busy) => busy,
            }
        };
        if waited > safepoint::SAFE_POINT_TIMEOUT {
            bail!(
                "no thread of process {pid} reached a point where loading the agent is safe \
                 within {} s ({why}); try again",
                safepoint::SAFE_POINT_TIMEOUT.as_secs()
            );
        }
        stopped.resume().map_err(|e| anyhow!("{e}"))?;
        std::thread::sleep(pause);
        pause = (pause * 2).min(std::time::Duration::from_millis(5));
        if !alive(pid) {
            bail!("process {pid} exited while weft was attaching");
        }
    };
    weft_inject::die::at("attach-borrowed");
    if !has_agent {
        let dlopen = dlopen.ok_or_else(|| {
            anyhow!("process {pid} has no dlopen (libc or libdl) to load the agent with")
        })?;
        let dlerror = find_function(&maps, "dlerror", LIBDL).unwrap_or(0);
        weft_inject::inject_library(&mut stopped, tid, dlopen, dlerror, agent)
            .map_err(|e| anyhow!("loading the agent into {pid}: {e}"))?;
        weft_inject::die::at("attach-loaded");
    }
    let maps = ProcMaps::read(pid as u32).map_err(|e| anyhow!("{e}"))?;
    let connect = find_function(&maps, "weft_agent_connect", &[AGENT_FILE])
        .ok_or_else(|| anyhow!("the agent in process {pid} exports no weft_agent_connect"))?;
    let mut name = socket.as_bytes().to_vec();
    name.push(0);
    let may_start = if quick { 0 } else { CONNECT_MAY_START };
    let r = stopped
        .call(
            tid,
            connect,
            &[CallArg::StackData, CallArg::Value(may_start)],
            &name,
        )
        .map_err(|e| anyhow!("asking the agent in {pid} to connect: {e}"))?;
    match r.ret as i32 {
        0 => {}
        -3 if quick => {
            stopped.resume().map_err(|e| anyhow!("{e}"))?;
            return Ok(None);
        }
        -2 => bail!("the agent in process {pid} could not start its control thread"),
        e => bail!("the agent in process {pid} refused to connect ({e})"),
    }
    weft_inject::die::at("attach-connected");
    let pause = stopped.resume().map_err(|e| anyhow!("{e}"))?;
    weft_inject::die::at("attach-resumed");
    Ok(Some(AttachReport {
        pause,
        ran_out: unwinder.ran,
        stepped_out: unwinder.stepped,
    }))
}

/// `weft_agent_connect`'s flags (the agent's `CONNECT_*`).
const CONNECT_MAY_START: u64 = 1;
const CONNECT_HOLD: u64 = 2;
/// How far below the stack pointer [`attach_held`] puts the thread's return
/// address: past the red zone the interrupted code may be using.
const HOLD_RED_ZONE: u64 = 128;

/// Load the agent into `pid`, a process weft caught as it started (a kernel uprobe
/// stopped it at its entry point, at `__libc_start_main` or where `dlopen` returned:
/// one thread, at an instruction boundary, outside any system call, holding no lock),
/// connect it to `socket`, and leave its thread held in the agent's `weft_agent_hold`
/// until the session says `GO`. The thread is borrowed where it is, with no
/// safe-point search. (Not inside the dynamic linker: held there, holding its lock,
/// the thread would block the agent's control thread, whose start needs that lock.)
/// The process may be group-stopped (the kernel's `SIGSTOP`): the caller continues
/// it after this returns.
pub fn attach_held(pid: i32, agent: &Path, socket: &str) -> Result<AttachReport> {
    if !weft_inject::process::process_exists(pid) || is_zombie(pid) {
        bail!("process {pid} exited while weft was attaching");
    }
    weft_inject::die::phase("attach");
    let mut stopped = StoppedProcess::stop(pid).map_err(|e| anyhow!("{e}"))?;
    stopped.clear_breakpoints();
    let tid = match stopped.threads() {
        [t] if !t.in_syscall() => t.tid(),
        [_] => bail!("process {pid} was caught inside a system call, not at its start"),
        ts => bail!(
            "process {pid} has {} threads: not a process caught as it starts",
            ts.len()
        ),
    };
    let maps = ProcMaps::read(pid as u32).map_err(|e| anyhow!("{e}"))?;
    let has_agent = maps.modules().iter().any(|m| m.file_name() == AGENT_FILE);
    if !has_agent {
        let dlopen = find_function(&maps, "dlopen", LIBDL).ok_or_else(|| {
            anyhow!("process {pid} has no dlopen (libc or libdl) to load the agent with")
        })?;
        let dlerror = find_function(&maps, "dlerror", LIBDL).unwrap_or(0);
        weft_inject::inject_library(&mut stopped, tid, dlopen, dlerror, agent)
            .map_err(|e| anyhow!("loading the agent into {pid}: {e}"))?;
    }
    let maps = ProcMaps::read(pid as u32).map_err(|e| anyhow!("{e}"))?;
    let connect = find_function(&maps, "weft_agent_connect", &[AGENT_FILE])
        .ok_or_else(|| anyhow!("the agent in process {pid} exports no weft_agent_connect"))?;
    let hold = find_function(&maps, "weft_agent_hold", &[AGENT_FILE])
        .ok_or_else(|| anyhow!("the agent in process {pid} exports no weft_agent_hold"))?;
    let mut name = socket.as_bytes().to_vec();
    name.push(0);
    let r = stopped
        .call(
            tid,
            connect,
            &[
                CallArg::StackData,
                CallArg::Value(CONNECT_MAY_START | CONNECT_HOLD),
            ],
            &name,
        )
        .map_err(|e| anyhow!("asking the agent in {pid} to connect: {e}"))?;
    match r.ret as i32 {
        0 => {}
        -2 => bail!("the agent in process {pid} could not start its control thread"),
        e => bail!("the agent in process {pid} refused to connect ({e})"),
    }
    // Into the hold: the original pc as a return address below the red zone.
    let mut regs = *stopped.thread(tid).map_err(|e| anyhow!("{e}"))?.regs();
    let slot = regs.rsp - HOLD_RED_ZONE - 8;
    stopped
        .write_mem(slot, &regs.rip.to_le_bytes())
        .map_err(|e| anyhow!("holding process {pid}: {e}"))?;
    regs.rsp = slot;
    regs.rip = hold;
    stopped
        .set_regs(tid, &regs)
        .map_err(|e| anyhow!("holding process {pid}: {e}"))?;
    let pause = stopped.resume().map_err(|e| anyhow!("{e}"))?;
    Ok(AttachReport {
        pause,
        ran_out: 0,
        stepped_out: 0,
    })
}

/// The parent of process `pid` (`/proc/PID/stat`).
pub fn parent_of(pid: i32) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // "pid (comm) S ppid ...": comm may hold spaces and parentheses.
    let (_, rest) = stat.rsplit_once(')')?;
    rest.split_whitespace().nth(1)?.parse().ok()
}

/// Whether a thread of `pid` is the agent's control thread (named `weft-agent`).
fn control_thread_alive(pid: i32) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return false;
    };
    tasks.flatten().any(|t| {
        std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.trim_end() == "weft-agent")
    })
}

#[cfg(test)]
mod tests {
    use super::split_command;

    #[test]
    fn splits_like_a_shell() {
        assert_eq!(split_command("./app a b").unwrap(), ["./app", "a", "b"]);
        assert_eq!(
            split_command("  ./app  'a b'  \"c d\" e\\ f").unwrap(),
            ["./app", "a b", "c d", "e f"]
        );
        assert!(split_command("./app 'oops").is_err());
        assert!(split_command("   ").is_err());
    }
}
