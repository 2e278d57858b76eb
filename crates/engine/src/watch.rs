//! System-wide sessions (no `-p`, no `-c`): the probes apply to every process that
//! maps a probed file — those running when weft starts ([`mapping_processes`]) and
//! those that start later, which the kernel catches for weft ([`Watcher`]).
//!
//! weft's probes live inside processes, so a process that starts while weft runs must
//! be woven before it runs probed code. The kernel stops it for weft: an eBPF program
//! (`bpf/catch.bpf.c`) on kernel uprobes at points every such process passes before
//! its first probed call sends it `SIGSTOP` and weft its pid (`weft_kernel::catch`
//! loads it):
//!
//! * a program: its entry point (`e_entry`), after the dynamic linker has loaded its
//!   libraries and before any of its own code (its constructors run later, from
//!   `__libc_start_main`);
//! * a library: its initializer (`DT_INIT`, the `.init` section), which the dynamic
//!   linker runs when it loads the library, at start-up or in `dlopen`; the C library
//!   itself (and a library without an initializer): `__libc_start_main`, which every
//!   dynamically linked program calls once its libraries are loaded and initialized.
//!
//! The session then loads the agent right there and holds the thread in it until the
//! probes are in (`target::attach_held`), and continues the process. The kernel's
//! uprobes stay on the files while weft runs and cost a process one trap at start.
//!
//! Windows where calls are not seen (documented in the README): calls a library's
//! code makes before its initializer, or before `__libc_start_main` for the C
//! library (other libraries' constructors calling `malloc`); in a process with
//! several threads that `dlopen`s a probed library, calls between the library's
//! initializer and the point where weft can load its agent safely.

use std::collections::BTreeSet;
use std::os::fd::RawFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};
use weft_kernel::catch::{Catcher, Uprobe};
use weft_symbols::ElfFile;

/// What a kernel uprobe of the watcher does (a program of `bpf/catch.bpf.c`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum CatchHow {
    /// Catch the process (`weft_catch`).
    Catch,
    /// Mark it: it loads a probed library (`weft_mark`).
    Mark,
    /// Catch it if marked (`weft_catch_marked`).
    CatchMarked,
    /// Catch it if marked, where the function returns (`weft_catch_marked_return`).
    CatchMarkedReturn,
}

impl CatchHow {
    fn program(self) -> &'static str {
        match self {
            CatchHow::Catch => "weft_catch",
            CatchHow::Mark => "weft_mark",
            CatchHow::CatchMarked => "weft_catch_marked",
            CatchHow::CatchMarkedReturn => "weft_catch_marked_return",
        }
    }
}

/// One kernel uprobe: a file, a file offset, what is there (for `-v`) and what the
/// uprobe does.
#[derive(Clone, Debug)]
pub struct CatchPoint {
    pub file: PathBuf,
    pub offset: u64,
    pub what: &'static str,
    pub how: CatchHow,
}

/// A file the probes name, and where the kernel catches the processes that start
/// running it.
#[derive(Clone, Debug)]
pub struct WatchedFile {
    /// As the probes resolved it (canonical).
    pub path: PathBuf,
    /// `(dev, inode)` of the file.
    pub identity: (u64, u64),
    pub catch_at: Vec<CatchPoint>,
}

impl WatchedFile {
    /// Where processes running `path` are caught (see the module's comment).
    pub fn new(path: &Path) -> Result<WatchedFile> {
        let path = path
            .canonicalize()
            .with_context(|| format!("{}", path.display()))?;
        let meta = std::fs::metadata(&path).with_context(|| format!("{}", path.display()))?;
        let elf = ElfFile::open(&path).map_err(|e| anyhow!("{}: {e}", path.display()))?;
        if elf.is_static() {
            bail!(
                "{} is statically linked: weft loads its agent with the dynamic linker, so \
                 static executables are not supported yet",
                path.display()
            );
        }
        let offset = |vaddr: u64, what: &str| {
            elf.vaddr_to_file_offset(vaddr)
                .ok_or_else(|| anyhow!("{}: its {what} is not in a loaded segment", path.display()))
        };
        let point = |file: &Path, offset: u64, what: &'static str, how: CatchHow| CatchPoint {
            file: file.to_path_buf(),
            offset,
            what,
            how,
        };
        // A library has a soname, or no interpreter (a program has one; the C
        // library, which can run as a program too, has both).
        let library = elf.soname().is_some() || elf.interpreter().is_none();
        let is_libc = elf.soname().is_some_and(|s| s.starts_with("libc.so"));
        let init = elf.section(".init").map(|s| s.addr).filter(|&a| a != 0);
        let catch_at = if !library {
            vec![point(
                &path,
                offset(elf.entry(), "entry point")?,
                "entry point",
                CatchHow::Catch,
            )]
        } else if let (false, Some(init)) = (is_libc, init) {
            let libc = Libc::find()?;
            vec![
                point(
                    &path,
                    offset(init, "initializer")?,
                    "initializer",
                    CatchHow::Mark,
                ),
                point(
                    &libc.path,
                    libc.start_main,
                    "__libc_start_main",
                    CatchHow::CatchMarked,
                ),
                point(
                    &libc.path,
                    libc.dlopen,
                    "return of dlopen",
                    CatchHow::CatchMarkedReturn,
                ),
            ]
        } else {
            // The C library itself (or a library with no initializer to mark the
            // processes that load it by): every program that starts is looked at.
            let libc = Libc::find()?;
            vec![point(
                &libc.path,
                libc.start_main,
                "__libc_start_main",
                CatchHow::Catch,
            )]
        };
        Ok(WatchedFile {
            path,
            identity: (meta.dev(), meta.ino()),
            catch_at,
        })
    }
}

/// The C library weft itself runs with: where its `__libc_start_main` and `dlopen`
/// are (file offsets).
struct Libc {
    path: PathBuf,
    start_main: u64,
    dlopen: u64,
}

impl Libc {
    fn find() -> Result<Libc> {
        let maps = weft_symbols::ProcMaps::read(std::process::id()).map_err(|e| anyhow!("{e}"))?;
        let libc = maps
            .modules()
            .into_iter()
            .find(|m| m.file_name().starts_with("libc.so"))
            .ok_or_else(|| anyhow!("weft does not map a C library to find __libc_start_main in"))?;
        let path = libc.open_path.clone();
        let elf = ElfFile::open(&path).map_err(|e| anyhow!("{}: {e}", path.display()))?;
        let at = |name: &str| {
            elf.symbol_vaddr(name)
                .and_then(|v| elf.vaddr_to_file_offset(v))
                .ok_or_else(|| anyhow!("{}: no {name}", path.display()))
        };
        Ok(Libc {
            start_main: at("__libc_start_main")?,
            dlopen: at("dlopen")?,
            path,
        })
    }
}

/// Processes (other than weft) that map one of `files` now, in pid order.
pub fn mapping_processes(files: &[WatchedFile]) -> Vec<i32> {
    let me = std::process::id() as i32;
    let mut out = BTreeSet::new();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    for e in dir.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        // Not weft, nor a process of weft's own (its guardian).
        if pid == me || crate::target::parent_of(pid) == Some(me) {
            continue;
        }
        let Ok(maps) = std::fs::read_to_string(format!("/proc/{pid}/maps")) else {
            continue;
        };
        if maps.lines().any(|l| maps_line_is_one_of(l, files)) {
            out.insert(pid);
        }
    }
    out.into_iter().collect()
}

/// Whether a `/proc/PID/maps` line maps one of `files`: by path, or by inode and
/// device (the path may be another name of the file, or a name in another mount
/// namespace).
fn maps_line_is_one_of(line: &str, files: &[WatchedFile]) -> bool {
    let mut f = line.split_whitespace();
    let (_, _, _, dev, inode) = (f.next(), f.next(), f.next(), f.next(), f.next());
    let path: String = f.collect::<Vec<_>>().join(" ");
    if path.is_empty() {
        return false;
    }
    let inode: u64 = inode.and_then(|i| i.parse().ok()).unwrap_or(0);
    let dev = dev.and_then(|d| {
        let (maj, min) = d.split_once(':')?;
        Some(libc::makedev(
            u32::from_str_radix(maj, 16).ok()?,
            u32::from_str_radix(min, 16).ok()?,
        ))
    });
    files.iter().any(|w| {
        Path::new(&path) == w.path
            || (inode != 0 && inode == w.identity.1 && dev == Some(w.identity.0))
    })
}

/// How weft learns of processes that start: the kernel catches them (eBPF on
/// uprobes: [`Kernel`]), or, where the kernel cannot, weft reads `/proc` every
/// [`PROC_SCAN_EVERY`] and attaches to what it finds (calls made before are missed).
pub struct Watcher {
    files: Vec<WatchedFile>,
    kernel: Option<Kernel>,
    /// Without the kernel: the processes found so far, and when to look again.
    known: std::collections::HashSet<i32>,
    next_scan: std::time::Instant,
    /// Where the uprobes are (for `-v`).
    pub points: Vec<String>,
    /// Why the kernel cannot catch processes, when weft watches `/proc` instead.
    pub fallback: Option<String>,
}

/// How often `/proc` is read without the kernel's help.
pub const PROC_SCAN_EVERY: std::time::Duration = std::time::Duration::from_millis(100);

/// `WEFT_TEST_NO_EBPF=1`: behave as on a kernel without eBPF (tests of the `/proc`
/// fallback).
const NO_EBPF_ENV: &str = "WEFT_TEST_NO_EBPF";

/// The kernel side: uprobes on the files with the catching program, and the ring
/// weft reads the caught pids from. Dropping it takes them all out.
struct Kernel {
    guardian: Guardian,
    catcher: Catcher,
}

impl Watcher {
    /// Catch the processes that start running `files`: with the kernel's help
    /// where it can, else by watching `/proc` (and [`Watcher::fallback`] says why).
    pub fn start(files: &[WatchedFile]) -> Watcher {
        let kernel = if std::env::var_os(NO_EBPF_ENV).is_some() {
            Err(anyhow!("{NO_EBPF_ENV} is set"))
        } else {
            Kernel::start(files)
        };
        let (kernel, points, fallback) = match kernel {
            Ok((k, points)) => (Some(k), points, None),
            Err(e) => (None, Vec::new(), Some(format!("{e:#}"))),
        };
        Watcher {
            files: files.to_vec(),
            kernel,
            known: std::collections::HashSet::new(),
            next_scan: std::time::Instant::now(),
            points,
            fallback,
        }
    }

    /// Whether a process this reports is stopped where it started (the kernel
    /// caught it), rather than found running.
    pub fn stops(&self) -> bool {
        self.kernel.is_some()
    }

    /// `pid` is woven (or being woven) already: it is not reported again (with the
    /// kernel: until it execs).
    pub fn seen(&mut self, pid: i32) {
        self.known.insert(pid);
        if let Some(k) = self.kernel.as_mut() {
            k.catcher.seen(pid as u32);
        }
    }

    /// Whether process `pid` maps one of the watched files (a process caught at
    /// `__libc_start_main` may map none: it is let go).
    pub fn concerns(&self, pid: i32) -> bool {
        std::fs::read_to_string(format!("/proc/{pid}/maps"))
            .is_ok_and(|m| m.lines().any(|l| maps_line_is_one_of(l, &self.files)))
    }

    /// Processes caught since the last call (each stopped, or about to stop: the
    /// guardian knows them until [`Watcher::resume`]); without the kernel, processes
    /// that map a watched file and were not reported before.
    pub fn poll(&mut self) -> Vec<i32> {
        let Some(k) = self.kernel.as_mut() else {
            if std::time::Instant::now() < self.next_scan {
                return Vec::new();
            }
            self.next_scan = std::time::Instant::now() + PROC_SCAN_EVERY;
            let new: Vec<i32> = mapping_processes(&self.files)
                .into_iter()
                .filter(|p| !self.known.contains(p))
                .collect();
            self.known.extend(&new);
            return new;
        };
        let out = k.catcher.caught();
        for &pid in &out {
            k.guardian.tell(pid);
        }
        out
    }

    /// Wait up to `timeout` for a process to be caught (the ring's descriptor
    /// becomes readable), so that one is woven as soon as it is stopped.
    pub fn wait(&self, timeout: std::time::Duration) {
        let Some(k) = self.kernel.as_ref() else {
            std::thread::sleep(timeout);
            return;
        };
        let mut pfd = libc::pollfd {
            fd: k.catcher.ring_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: poll on one valid pollfd.
        unsafe { libc::poll(&mut pfd, 1, timeout.as_millis().max(1) as i32) };
    }

    /// Let caught process `pid` go on.
    pub fn resume(&mut self, pid: i32) {
        if let Some(k) = self.kernel.as_mut() {
            resume_caught(pid);
            k.catcher.released(pid as u32);
            k.guardian.tell(-pid);
        }
    }

    /// Take the uprobes out and let every process caught until then go on (none is
    /// caught afterwards, so none is left stopped).
    pub fn stop(mut self) {
        if let Some(k) = self.kernel.as_mut() {
            k.catcher.detach();
        }
        if self.kernel.is_some() {
            for pid in self.poll() {
                self.resume(pid);
            }
        }
    }
}

impl Kernel {
    /// Load the catching program and set its uprobes for `files`; where they are.
    fn start(files: &[WatchedFile]) -> Result<(Kernel, Vec<String>)> {
        // Before any uprobe exists, so that it holds none of their descriptors.
        let guardian = Guardian::spawn()?;
        let mut points = Vec::new();
        let mut uprobes = Vec::new();
        let mut done = BTreeSet::new();
        for p in files.iter().flat_map(|w| &w.catch_at) {
            if !done.insert((p.file.clone(), p.offset, p.how)) {
                continue;
            }
            uprobes.push(Uprobe {
                file: p.file.clone(),
                offset: p.offset,
                program: p.how.program(),
            });
            points.push(format!(
                "{} ({}, file offset {:#x})",
                p.file.display(),
                p.what,
                p.offset
            ));
        }
        let catcher = Catcher::start(&uprobes)?;
        guardian.give_map(catcher.stopped_fd());
        Ok((Kernel { guardian, catcher }, points))
    }
}

/// A process of weft's own that continues the processes weft caught and had not
/// let go yet, should weft die (be SIGKILLed) meanwhile. weft sends it, over a
/// socket pair, each pid it reads from the ring (and its negation once it resumes
/// it), and the descriptor of the eBPF map `stopped`, where the kernel puts every
/// process it stops before weft reads it. When the socket closes without weft's
/// goodbye, the guardian waits for weft's process to be gone (its uprobes with it,
/// so nothing more is caught), then sends SIGCONT to every process it was told of
/// and every one still in `stopped`, and ends.
struct Guardian {
    sock: Option<std::os::fd::OwnedFd>,
    pid: i32,
}

/// What weft sends the guardian as it ends on its own: no waiting for weft's death.
const GUARDIAN_BYE: i32 = i32::MIN;
/// The message that carries the `stopped` map's descriptor.
const GUARDIAN_MAP: i32 = 0;
/// The longest the guardian waits for weft's process to be gone.
const GUARDIAN_WAIT_MS: i32 = 10_000;

impl Guardian {
    fn spawn() -> Result<Guardian> {
        use std::os::fd::FromRawFd;
        let mut fds = [0i32; 2];
        // SAFETY: socketpair writes two descriptors into the array.
        let r = unsafe {
            libc::socketpair(
                libc::AF_UNIX,
                libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC,
                0,
                fds.as_mut_ptr(),
            )
        };
        if r != 0 {
            return Err(std::io::Error::last_os_error()).context("creating the guardian's socket");
        }
        // SAFETY: getpid has no preconditions.
        let weft = unsafe { libc::getpid() };
        // SAFETY: fork; the child only makes async-signal-safe system calls on its
        // own stack and ends with _exit (weft has other threads).
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            // SAFETY: as above.
            unsafe { guardian_main(fds[1], weft) };
        }
        // SAFETY: the descriptors are ours; the other end is the child's now.
        unsafe { libc::close(fds[1]) };
        if pid < 0 {
            // SAFETY: ours.
            unsafe { libc::close(fds[0]) };
            return Err(std::io::Error::last_os_error()).context("starting the guardian");
        }
        Ok(Guardian {
            // SAFETY: fds[0] is open and owned by nothing else.
            sock: Some(unsafe { std::os::fd::OwnedFd::from_raw_fd(fds[0]) }),
            pid,
        })
    }

    /// `pid` > 0: caught; < 0: let go.
    fn tell(&self, pid: i32) {
        self.send(pid, None);
    }

    /// Hand the guardian the `stopped` map (it keeps its own reference).
    fn give_map(&self, fd: RawFd) {
        self.send(GUARDIAN_MAP, Some(fd));
    }

    fn send(&self, word: i32, fd: Option<RawFd>) {
        use std::os::fd::AsRawFd;
        let Some(sock) = &self.sock else {
            return;
        };
        let b = word.to_ne_bytes();
        let mut iov = libc::iovec {
            iov_base: b.as_ptr() as *mut libc::c_void,
            iov_len: 4,
        };
        // u64s: the control buffer's alignment.
        let mut control = [0u64; 4];
        // SAFETY: a zeroed msghdr is valid; every pointer set below outlives the call.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        if let Some(fd) = fd {
            msg.msg_control = control.as_mut_ptr().cast();
            // SAFETY: CMSG_SPACE is arithmetic.
            msg.msg_controllen = unsafe { libc::CMSG_SPACE(4) } as usize;
            // SAFETY: the control buffer holds one header with 4 bytes of data
            // (CMSG_SPACE(4) <= 32 bytes).
            unsafe {
                let c = libc::CMSG_FIRSTHDR(&msg);
                (*c).cmsg_level = libc::SOL_SOCKET;
                (*c).cmsg_type = libc::SCM_RIGHTS;
                (*c).cmsg_len = libc::CMSG_LEN(4) as usize;
                std::ptr::write_unaligned(libc::CMSG_DATA(c).cast::<i32>(), fd);
            }
        }
        // SAFETY: msg and everything it points to are valid for the call.
        unsafe { libc::sendmsg(sock.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
    }
}

impl Drop for Guardian {
    fn drop(&mut self) {
        // weft ends on its own: the guardian lets go what it still holds at once.
        self.send(GUARDIAN_BYE, None);
        self.sock.take();
        let mut st = 0;
        // SAFETY: reaping our own child.
        unsafe { libc::waitpid(self.pid, &mut st, 0) };
    }
}

/// The guardian's body (in the child of `fork`): no allocation, no lock.
///
/// # Safety
/// Called once, in a freshly forked child of `weft`, with its end of the socket.
unsafe fn guardian_main(sock: i32, weft: i32) -> ! {
    const MAX: usize = 4096;
    let mut held = [0i32; MAX];
    let mut map = -1;
    let mut bye = false;
    // SAFETY: plain system calls on our own descriptors, signals and stack.
    unsafe {
        // Only the socket: not weft's listening socket (agents would wait on it),
        // not its terminal.
        libc::dup2(sock, 0);
        libc::syscall(libc::SYS_close_range, 1u32, u32::MAX, 0u32);
        // weft's process, to wait for it to be gone (-1: gone already).
        let pidfd = libc::syscall(libc::SYS_pidfd_open, weft, 0u32) as i32;
        // A Ctrl-C or a hang-up for weft's process group is weft's to act on.
        for sig in [
            libc::SIGINT,
            libc::SIGTERM,
            libc::SIGHUP,
            libc::SIGQUIT,
            libc::SIGPIPE,
        ] {
            libc::signal(sig, libc::SIG_IGN);
        }
        libc::prctl(
            libc::PR_SET_NAME,
            c"weft-guardian".as_ptr() as libc::c_ulong,
            0,
            0,
            0,
        );
        loop {
            let mut b = [0u8; 4];
            let mut iov = libc::iovec {
                iov_base: b.as_mut_ptr().cast(),
                iov_len: 4,
            };
            let mut control = [0u64; 4];
            let mut msg: libc::msghdr = std::mem::zeroed();
            msg.msg_iov = &mut iov;
            msg.msg_iovlen = 1;
            msg.msg_control = control.as_mut_ptr().cast();
            msg.msg_controllen = std::mem::size_of_val(&control);
            let n = libc::recvmsg(0, &mut msg, libc::MSG_CMSG_CLOEXEC);
            if n == 4 {
                let pid = i32::from_ne_bytes(b);
                if pid == GUARDIAN_BYE {
                    bye = true;
                } else if pid == GUARDIAN_MAP {
                    let c = libc::CMSG_FIRSTHDR(&msg);
                    if !c.is_null()
                        && (*c).cmsg_level == libc::SOL_SOCKET
                        && (*c).cmsg_type == libc::SCM_RIGHTS
                    {
                        map = std::ptr::read_unaligned(libc::CMSG_DATA(c).cast::<i32>());
                    }
                } else if pid > 0 {
                    if let Some(slot) = held.iter_mut().find(|p| **p == 0) {
                        *slot = pid;
                    }
                } else if let Some(slot) = held.iter_mut().find(|p| **p == -pid) {
                    *slot = 0;
                }
                continue;
            }
            if n < 0 && *libc::__errno_location() == libc::EINTR {
                continue;
            }
            break;
        }
        if !bye && pidfd >= 0 {
            // weft died: once its process is gone, so are its uprobes, and no
            // process is caught after the sweep below.
            let mut pfd = libc::pollfd {
                fd: pidfd,
                events: libc::POLLIN,
                revents: 0,
            };
            while libc::poll(&mut pfd, 1, GUARDIAN_WAIT_MS) < 0
                && *libc::__errno_location() == libc::EINTR
            {}
        }
        for &pid in &held {
            if pid > 0 {
                libc::kill(pid, libc::SIGCONT);
            }
        }
        if map >= 0 {
            continue_stopped(map);
        }
        libc::_exit(0)
    }
}

/// Send SIGCONT to every pid in the eBPF hash map `map` (u32 keys), walking it with
/// `BPF_MAP_GET_NEXT_KEY`: no allocation.
///
/// # Safety
/// In the guardian: `map` is a descriptor of the `stopped` map.
unsafe fn continue_stopped(map: i32) {
    const BPF_MAP_GET_NEXT_KEY: libc::c_long = 4;
    // `union bpf_attr`'s map element form: map_fd, (pad), key, next_key, flags;
    // the rest zero, as the kernel requires.
    #[repr(C)]
    struct Attr {
        map_fd: u32,
        pad: u32,
        key: u64,
        next_key: u64,
        flags: u64,
        rest: [u64; 12],
    }
    let mut key = 0u32;
    let mut next = 0u32;
    let mut first = true;
    // At most the map's size: a map that changed under us is not walked forever.
    for _ in 0..65_536 {
        let mut attr = Attr {
            map_fd: map as u32,
            pad: 0,
            key: if first { 0 } else { &key as *const u32 as u64 },
            next_key: &mut next as *mut u32 as u64,
            flags: 0,
            rest: [0; 12],
        };
        // SAFETY: attr points at key and next, both alive across the call.
        let r = unsafe {
            libc::syscall(
                libc::SYS_bpf,
                BPF_MAP_GET_NEXT_KEY,
                &mut attr as *mut Attr,
                std::mem::size_of::<Attr>() as u32,
            )
        };
        if r != 0 {
            break;
        }
        // SAFETY: kill has no memory preconditions.
        unsafe { libc::kill(next as i32, libc::SIGCONT) };
        key = next;
        first = false;
    }
}

/// Let a process the kernel stopped for weft go on.
pub fn resume_caught(pid: i32) {
    // SAFETY: kill has no memory preconditions; SIGCONT only continues a stopped
    // process (one weft caught) and is ignored by a running one.
    unsafe { libc::kill(pid, libc::SIGCONT) };
}

#[cfg(test)]
mod tests {
    use super::*;

    fn watched(path: &str, dev: u64, ino: u64) -> WatchedFile {
        WatchedFile {
            path: PathBuf::from(path),
            identity: (dev, ino),
            catch_at: Vec::new(),
        }
    }

    #[test]
    fn maps_lines_match_by_path_or_identity() {
        let w = [watched("/usr/bin/app", libc::makedev(0xfd, 1), 1234)];
        let line = |dev: &str, ino: u64, path: &str| {
            format!("55d0c0a00000-55d0c0a01000 r-xp 00001000 {dev} {ino}      {path}")
        };
        assert!(maps_line_is_one_of(&line("00:2a", 9, "/usr/bin/app"), &w));
        assert!(maps_line_is_one_of(&line("fd:01", 1234, "/other/name"), &w));
        assert!(!maps_line_is_one_of(
            &line("fd:02", 1234, "/other/name"),
            &w
        ));
        assert!(!maps_line_is_one_of(
            &line("fd:01", 99, "/usr/bin/app2"),
            &w
        ));
        assert!(!maps_line_is_one_of(
            "7ffd0000-7ffd1000 rw-p 00000000 00:00 0 ",
            &w
        ));
    }
}
