//! Helpers for the process tests: build a C program, run it, find its symbols.
#![allow(dead_code)]

use std::fs;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::time::{Duration, Instant};

use object::{Object, ObjectSection, ObjectSegment, ObjectSymbol};

/// Compiles `source` with gcc into a fresh temporary directory.
pub struct Program {
    pub dir: tempfile::TempDir,
    pub path: PathBuf,
}

pub fn build(name: &str, source: &str, flags: &[&str]) -> Program {
    let dir = tempfile::tempdir().unwrap();
    let c = dir.path().join(format!("{name}.c"));
    fs::write(&c, source).unwrap();
    let path = dir.path().join(name);
    let out = Command::new("gcc")
        .args(["-O0", "-g", "-pthread", "-o"])
        .arg(&path)
        .arg(&c)
        .args(flags)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "gcc failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    Program { dir, path }
}

/// A running target. Killed and reaped on drop.
pub struct Target {
    pub child: Child,
    pub exe: PathBuf,
    pub stdin: Option<ChildStdin>,
    lines: Receiver<String>,
}

impl Target {
    pub fn spawn(exe: &Path, args: &[&str]) -> Target {
        let mut child = Command::new(exe)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let stdin = child.stdin.take();
        Target {
            child,
            exe: exe.to_path_buf(),
            stdin,
            lines,
        }
    }

    /// Spawns and waits for the program's "ready" line.
    pub fn start(exe: &Path, args: &[&str]) -> Target {
        let mut target = Target::spawn(exe, args);
        assert_eq!(target.line(), "ready");
        target
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// The next line the target prints (panics after [`CEILING`]).
    pub fn line(&mut self) -> String {
        self.lines
            .recv_timeout(CEILING)
            .expect("the target printed no line within the ceiling")
    }

    /// Writes target memory without ptrace (root may write /proc/PID/mem): tells a
    /// running target to go on.
    pub fn poke(&self, addr: u64, data: &[u8]) {
        let mem = fs::OpenOptions::new()
            .write(true)
            .open(format!("/proc/{}/mem", self.pid()))
            .unwrap();
        mem.write_all_at(data, addr).unwrap();
    }

    /// Writes to the target's stdin and closes it.
    pub fn send_and_close(&mut self, data: &[u8]) {
        let mut stdin = self.stdin.take().unwrap();
        stdin.write_all(data).unwrap();
    }

    /// Runtime address of a symbol of the executable.
    pub fn symbol(&self, name: &str) -> u64 {
        let (addr, _) = elf_symbol(&self.exe, name);
        addr + load_bias(self.pid(), &self.exe)
    }

    /// Runtime range of a function of the executable.
    pub fn function(&self, name: &str) -> std::ops::Range<u64> {
        let (addr, size) = elf_symbol(&self.exe, name);
        let start = addr + load_bias(self.pid(), &self.exe);
        start..start + size
    }

    /// Reads target memory without ptrace (root may read /proc/PID/mem).
    pub fn peek(&self, addr: u64, len: usize) -> Vec<u8> {
        let pid = self.pid();
        let tid = *tasks(pid).last().unwrap();
        let mem = fs::File::open(format!("/proc/{pid}/task/{tid}/mem")).unwrap();
        let mut buf = vec![0; len];
        mem.read_exact_at(&mut buf, addr).unwrap();
        buf
    }

    pub fn peek_u64s(&self, addr: u64, count: usize) -> Vec<u64> {
        self.peek(addr, count * 8)
            .chunks(8)
            .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
            .collect()
    }

    /// Waits for the target to exit; its exit code.
    pub fn wait(&mut self) -> Option<i32> {
        self.stdin.take();
        self.child.wait().unwrap().code()
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// (value, size) of a symbol in an ELF file's .symtab or .dynsym.
pub fn elf_symbol(path: &Path, name: &str) -> (u64, u64) {
    let data = fs::read(path).unwrap();
    let file = object::File::parse(&*data).unwrap();
    let symbol = file
        .symbols()
        .chain(file.dynamic_symbols())
        .find(|s| s.name() == Ok(name) && s.is_definition())
        .unwrap_or_else(|| panic!("no symbol {name} in {}", path.display()));
    (symbol.address(), symbol.size())
}

/// Bytes of an ELF file at a virtual address (from its loadable segments).
pub fn elf_bytes(path: &Path, vaddr: u64, len: usize) -> Vec<u8> {
    let data = fs::read(path).unwrap();
    let file = object::File::parse(&*data).unwrap();
    for segment in file.segments() {
        if let Ok(Some(bytes)) = segment.data_range(vaddr, len as u64) {
            return bytes.to_vec();
        }
    }
    panic!("{vaddr:#x} is not in a segment of {}", path.display());
}

/// One line of /proc/PID/maps.
#[derive(Debug, Clone)]
pub struct Mapping {
    pub start: u64,
    pub end: u64,
    pub perms: String,
    pub offset: u64,
    pub path: String,
}

/// The memory map of `pid`, read through a live thread (the main thread's is empty
/// once it has exited).
pub fn maps(pid: i32) -> Vec<Mapping> {
    let text = tasks(pid)
        .into_iter()
        .map(|tid| fs::read_to_string(format!("/proc/{pid}/task/{tid}/maps")).unwrap_or_default())
        .find(|text| !text.is_empty())
        .unwrap_or_default();
    text.lines()
        .map(|line| {
            let mut fields = line.split_whitespace();
            let range = fields.next().unwrap();
            let (start, end) = range.split_once('-').unwrap();
            let perms = fields.next().unwrap().to_string();
            let offset = u64::from_str_radix(fields.next().unwrap(), 16).unwrap();
            let _dev = fields.next();
            let _inode = fields.next();
            let path = fields.collect::<Vec<_>>().join(" ");
            Mapping {
                start: u64::from_str_radix(start, 16).unwrap(),
                end: u64::from_str_radix(end, 16).unwrap(),
                perms,
                offset,
                path,
            }
        })
        .collect()
}

/// Load bias of an ELF file mapped in `pid`: runtime address minus link-time address.
pub fn load_bias(pid: i32, path: &Path) -> u64 {
    let path = path.canonicalize().unwrap();
    let base = maps(pid)
        .into_iter()
        .find(|m| m.offset == 0 && Path::new(&m.path) == path)
        .unwrap_or_else(|| panic!("{} is not mapped in {pid}", path.display()))
        .start;
    let data = fs::read(&path).unwrap();
    let file = object::File::parse(&*data).unwrap();
    let lowest = file.segments().map(|s| s.address()).min().unwrap() & !0xfff;
    base - lowest
}

/// Runtime address of a function exported by the libc mapped in `pid`, using the
/// default version of the symbol (e.g. `dlopen@@GLIBC_2.34`).
pub fn libc_function(pid: i32, name: &str) -> u64 {
    let libc = maps(pid)
        .into_iter()
        .find(|m| {
            Path::new(&m.path)
                .file_name()
                .is_some_and(|f| f.to_string_lossy().starts_with("libc.so"))
        })
        .expect("libc is not mapped")
        .path;
    let data = fs::read(&libc).unwrap();
    let file = object::File::parse(&*data).unwrap();
    let versym = file
        .section_by_name(".gnu.version")
        .map(|s| s.data().unwrap().to_vec());
    let symbol = file
        .dynamic_symbols()
        .filter(|s| s.name() == Ok(name) && s.is_definition())
        .find(|s| {
            // Bit 15 of the version index marks a non-default (hidden) version.
            versym.as_ref().is_none_or(|v| {
                let i = s.index().0 * 2;
                u16::from_le_bytes([v[i], v[i + 1]]) & 0x8000 == 0
            })
        })
        .unwrap_or_else(|| panic!("no {name} in {libc}"));
    symbol.address() + load_bias(pid, Path::new(&libc))
}

/// State letter of a task (`/proc/PID/task/TID/stat`), None if gone.
pub fn task_state(pid: i32, tid: i32) -> Option<char> {
    let text = fs::read_to_string(format!("/proc/{pid}/task/{tid}/stat")).ok()?;
    text[text.rfind(')')? + 1..].trim_start().chars().next()
}

pub fn tasks(pid: i32) -> Vec<i32> {
    let mut tids: Vec<i32> = fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_str().unwrap().parse().unwrap())
        .collect();
    tids.sort();
    tids
}

/// How long a test waits for something that must happen (a thread runs again, a
/// target prints its line): a ceiling that only bounds a hang, never a deadline that
/// a slow or busy machine could miss.
pub const CEILING: Duration = Duration::from_secs(60);

/// Polls `cond` every millisecond for up to `timeout`; whether it became true.
pub fn eventually(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + timeout;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= end {
            return false;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Waits until thread `tid` of `pid` is blocked in system call `nr`.
pub fn wait_in_syscall(pid: i32, tid: i32, nr: i64) {
    let blocked = eventually(CEILING, || {
        fs::read_to_string(format!("/proc/{pid}/task/{tid}/syscall"))
            .is_ok_and(|s| s.split_whitespace().next() == Some(&nr.to_string()))
    });
    assert!(blocked, "thread {tid} never blocked in system call {nr}");
}

/// The executable file mappings of `pid` whose bytes differ from their file's (the
/// whole mapping, padding after the code included): "path differs at ADDR".
#[allow(dead_code)]
pub fn code_differing_from_files(pid: i32) -> Vec<String> {
    let mut bad = Vec::new();
    for m in maps(pid) {
        if !m.perms.contains('x') || !m.path.starts_with('/') {
            continue;
        }
        let Ok(file) = fs::read(&m.path) else {
            continue;
        };
        let off = m.offset as usize;
        if off >= file.len() {
            continue;
        }
        let len = ((m.end - m.start) as usize).min(file.len() - off);
        let mut live = vec![0u8; len];
        let mem = fs::File::open(format!("/proc/{pid}/mem")).unwrap();
        mem.read_exact_at(&mut live, m.start).unwrap();
        if let Some(at) = live
            .iter()
            .zip(&file[off..off + len])
            .position(|(a, b)| a != b)
        {
            bad.push(format!("{} differs at {:#x}", m.path, m.start + at as u64));
        }
    }
    bad
}

/// How many file descriptors `pid` has open.
#[allow(dead_code)]
pub fn open_fds(pid: i32) -> usize {
    fs::read_dir(format!("/proc/{pid}/fd")).unwrap().count()
}
