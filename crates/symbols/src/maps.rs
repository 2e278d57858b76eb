//! `/proc/PID/maps`: which ELF files a process has mapped, and where.
//!
//! [`ProcMaps::parse`] and [`load_bias`] are pure; [`ProcMaps::read`] and
//! [`ProcMaps::modules`] are the thin layer that reads `/proc` and the files' program
//! headers.
//!
//! **Load bias.** A module's *load bias* is what the loader added to every file
//! virtual address: `runtime = vaddr + bias`. A mapping of file offset `m.offset` at
//! `m.start`, backed by the `PT_LOAD` `p`, gives
//! `bias = m.start - (p.vaddr - (p.offset - m.offset))`. It is 0 for non-PIE
//! executables and page-aligned otherwise. Because two segments may share a file page
//! (old, non-`-z separate-code` layouts), every mapping votes and the bias most
//! mappings agree on wins.
//!
//! **Opening mapped files.** What weft reads must be the file the process mapped,
//! never whatever its path leads to now: the process may have replaced the path with
//! a symlink, and a symlink met under `/proc/PID/root` is resolved in *weft's* mount
//! namespace, so a process in a container could make a root weft read files its
//! owner cannot (a root-only file named by an absolute symlink). So:
//!
//! 1. `/proc/PID/map_files/START-END` when the kernel lets us open it: the mapped file
//!    itself, no path resolved. Opening it needs `CAP_SYS_ADMIN` (or
//!    `CAP_CHECKPOINT_RESTORE`) in the initial user namespace: exactly when weft may
//!    have more rights than the process's owner. (When the path leads to the very
//!    same file, the path is kept, so the file stays readable after the process
//!    exits; its `(st_dev, st_ino)` is checked again on every open.)
//! 2. Otherwise (weft has no such rights), the path (through `/proc/PID/root/PATH`
//!    when the process has its own mount namespace; the kernel allows that only if we
//!    may ptrace-read it), used only if the file there is the mapped one: the same
//!    inode number as in the maps line. (Only the inode: the device maps shows
//!    differs from `stat`'s on btrfs subvolumes and overlayfs.) A deleted file, or a
//!    path now leading to another file, leaves the module out.
//!
//! Nothing is opened with more rights than the caller has.

use std::collections::HashMap;
use std::io::Read;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use crate::elf::{ElfFile, Segment};
use crate::error::{Error, Result};

/// Access rights of a mapping.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Perms {
    pub read: bool,
    pub write: bool,
    pub exec: bool,
    /// `s` (shared) rather than `p` (private).
    pub shared: bool,
}

/// One line of `/proc/PID/maps`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mapping {
    pub start: u64,
    pub end: u64,
    pub perms: Perms,
    /// File offset of `start`.
    pub offset: u64,
    /// Device major and minor numbers.
    pub dev: (u32, u32),
    pub inode: u64,
    /// The path or pseudo-name (`[heap]`, `[vdso]`), without ` (deleted)`; empty for
    /// anonymous memory.
    pub name: String,
    /// The file was deleted (or replaced) after it was mapped.
    pub deleted: bool,
}

impl Mapping {
    /// The mapped file's path, when this mapping is backed by a file.
    pub fn file_path(&self) -> Option<&str> {
        (self.name.starts_with('/') && self.inode != 0).then_some(self.name.as_str())
    }

    pub fn contains(&self, addr: u64) -> bool {
        self.start <= addr && addr < self.end
    }
}

/// A process's memory map.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProcMaps {
    /// The process, when the map was read from `/proc` (used to open files through
    /// `/proc/PID/root` and `/proc/PID/map_files`).
    pub pid: Option<u32>,
    pub mappings: Vec<Mapping>,
}

impl ProcMaps {
    /// Reads `/proc/PID/maps`.
    pub fn read(pid: u32) -> Result<ProcMaps> {
        let mut text = String::new();
        std::fs::File::open(format!("/proc/{pid}/maps"))
            .and_then(|mut f| f.read_to_string(&mut text))
            .map_err(|source| Error::ProcMaps { pid, source })?;
        let mut maps = ProcMaps::parse(&text)?;
        maps.pid = Some(pid);
        Ok(maps)
    }

    /// Parses the text of a maps file.
    pub fn parse(text: &str) -> Result<ProcMaps> {
        let mappings = text
            .lines()
            .enumerate()
            .filter(|(_, l)| !l.trim().is_empty())
            .map(|(i, l)| {
                parse_line(l).ok_or_else(|| Error::MapsSyntax {
                    line: i + 1,
                    text: l.to_string(),
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(ProcMaps {
            pid: None,
            mappings,
        })
    }

    /// The mapped files in order of first appearance, each with its mappings.
    pub fn mapped_files(&self) -> Vec<MappedFile<'_>> {
        let mut index: HashMap<(&str, (u32, u32), u64), usize> = HashMap::new();
        let mut out: Vec<MappedFile<'_>> = Vec::new();
        for m in &self.mappings {
            let Some(path) = m.file_path() else { continue };
            let i = *index.entry((path, m.dev, m.inode)).or_insert_with(|| {
                out.push(MappedFile {
                    path,
                    deleted: m.deleted,
                    mappings: Vec::new(),
                });
                out.len() - 1
            });
            out[i].mappings.push(m);
        }
        out
    }

    /// The mapped ELF files with their load biases. Files that are not readable
    /// x86-64 ELF files (locale archives, fonts, memfds of JIT code) are left out.
    pub fn modules(&self) -> Vec<Module> {
        let same_ns = self.pid.is_none_or(same_mount_namespace);
        self.mapped_files()
            .into_iter()
            .filter_map(|f| {
                let first = f.mappings.first()?;
                let (open_path, identity) = match self.pid {
                    Some(pid) => mapped_file_path(pid, &f, first, same_ns)?,
                    None => (PathBuf::from(f.path), None),
                };
                let segments = crate::elf::read_segments(&open_path).ok()?;
                let load_bias = load_bias(&f.mappings, &segments)?;
                Some(Module {
                    path: PathBuf::from(f.path),
                    open_path,
                    identity,
                    load_bias,
                    ranges: f.mappings.iter().map(|m| m.start..m.end).collect(),
                    deleted: f.deleted,
                })
            })
            .collect()
    }
}

/// A file and the mappings of it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MappedFile<'a> {
    pub path: &'a str,
    pub deleted: bool,
    pub mappings: Vec<&'a Mapping>,
}

/// An ELF file mapped into a process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Module {
    /// The path as the process sees it (as printed in maps).
    pub path: PathBuf,
    /// Where weft reads the file from (see the module docs).
    pub open_path: PathBuf,
    /// `(st_dev, st_ino)` the file at `open_path` must have when it is opened (when
    /// `open_path` is a path that was checked to lead to the mapped file).
    pub identity: Option<(u64, u64)>,
    /// `runtime address = file vaddr + load_bias` (wrapping).
    pub load_bias: u64,
    /// The address ranges mapped from the file.
    pub ranges: Vec<Range<u64>>,
    pub deleted: bool,
}

impl Module {
    /// The file name, `libc.so.6`.
    pub fn file_name(&self) -> &str {
        self.path.file_name().and_then(|n| n.to_str()).unwrap_or("")
    }

    pub fn contains(&self, addr: u64) -> bool {
        self.ranges.iter().any(|r| r.contains(&addr))
    }

    pub fn runtime_addr(&self, vaddr: u64) -> u64 {
        vaddr.wrapping_add(self.load_bias)
    }

    pub fn vaddr(&self, runtime_addr: u64) -> u64 {
        runtime_addr.wrapping_sub(self.load_bias)
    }

    /// Opens the module's ELF file (from [`Module::open_path`]); the result's
    /// [`ElfFile::path`] is [`Module::path`].
    ///
    /// A file known by its identity (`(st_dev, st_ino)`, checked when it was first
    /// opened) is parsed once per weft process and shared: an attach looks up the C
    /// library's functions several times (the safe point, `dlopen`, the internal
    /// probes), and parsing its symbols is the larger part of each lookup.
    pub fn open(&self) -> Result<Arc<ElfFile>> {
        type Key = (PathBuf, PathBuf, (u64, u64));
        static OPENED: Mutex<Option<HashMap<Key, Arc<ElfFile>>>> = Mutex::new(None);
        let open = || {
            ElfFile::open_identified(&self.open_path, self.identity)
                .map(|e| Arc::new(e.with_path(&self.path)))
        };
        let Some(id) = self.identity else {
            return open();
        };
        let key = (self.open_path.clone(), self.path.clone(), id);
        let cached = |map: &mut Option<HashMap<Key, Arc<ElfFile>>>| {
            map.get_or_insert_with(HashMap::new).get(&key).cloned()
        };
        if let Some(elf) = cached(&mut OPENED.lock().unwrap_or_else(|p| p.into_inner())) {
            return Ok(elf);
        }
        // Parsed outside the lock (another thread may parse the same file meanwhile:
        // either result will do).
        let elf = open()?;
        OPENED
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get_or_insert_with(HashMap::new)
            .insert(key, elf.clone());
        Ok(elf)
    }
}

/// The load bias of a file given its mappings and program headers: every mapping
/// proposes `start - (p_vaddr - (p_offset - offset))` for each `PT_LOAD` whose file
/// pages hold its offset; the page-aligned proposal made most often wins (ties: the
/// earliest). `None` when no mapping matches a `PT_LOAD`.
pub fn load_bias(mappings: &[&Mapping], segments: &[Segment]) -> Option<u64> {
    const PAGE: u64 = 4096;
    let mut votes: Vec<(u64, usize)> = Vec::new();
    for m in mappings {
        for p in segments.iter().filter(|s| s.is_load() && s.filesz > 0) {
            let first_page = p.offset & !(PAGE - 1);
            if m.offset < first_page || m.offset >= p.offset.saturating_add(p.filesz) {
                continue;
            }
            // The vaddr mapped at m.start: p.vaddr - (p.offset - m.offset).
            let vaddr_at_start =
                i128::from(p.vaddr) - (i128::from(p.offset) - i128::from(m.offset));
            let bias = (i128::from(m.start) - vaddr_at_start) as u64;
            if bias & (PAGE - 1) != 0 {
                continue;
            }
            match votes.iter_mut().find(|(b, _)| *b == bias) {
                Some((_, n)) => *n += 1,
                None => votes.push((bias, 1)),
            }
        }
    }
    let best = votes.iter().map(|&(_, n)| n).max()?;
    votes.into_iter().find(|&(_, n)| n == best).map(|(b, _)| b)
}

fn parse_line(line: &str) -> Option<Mapping> {
    let mut rest = line;
    let mut field = || -> Option<&str> {
        let t = rest.trim_start_matches(' ');
        let end = t.find(' ').unwrap_or(t.len());
        let (f, r) = t.split_at(end);
        rest = r;
        (!f.is_empty()).then_some(f)
    };
    let range = field()?;
    let perms = field()?;
    let offset = field()?;
    let dev = field()?;
    let inode = field()?;
    let (start, end) = range.split_once('-')?;
    let (major, minor) = dev.split_once(':')?;
    let pb = perms.as_bytes();
    if pb.len() != 4 {
        return None;
    }
    let mut name = rest.trim_start_matches(' ').to_string();
    let deleted = name.ends_with(" (deleted)");
    if deleted {
        name.truncate(name.len() - " (deleted)".len());
    }
    Some(Mapping {
        start: u64::from_str_radix(start, 16).ok()?,
        end: u64::from_str_radix(end, 16).ok()?,
        perms: Perms {
            read: pb[0] == b'r',
            write: pb[1] == b'w',
            exec: pb[2] == b'x',
            shared: pb[3] == b's',
        },
        offset: u64::from_str_radix(offset, 16).ok()?,
        dev: (
            u32::from_str_radix(major, 16).ok()?,
            u32::from_str_radix(minor, 16).ok()?,
        ),
        inode: inode.parse().ok()?,
        name,
        deleted,
    })
}

/// Where to read the file `f` of process `pid` from (see the module docs), and the
/// identity the file there must have when opened: `None` when the file it mapped
/// cannot be read without resolving a path that now leads elsewhere.
///
/// When map_files can be opened but the path leads to the very same file, the path
/// is used (with its identity checked at each open): it stays readable after the
/// process exits, for symbolizing what it left behind.
fn mapped_file_path(
    pid: u32,
    f: &MappedFile<'_>,
    first: &Mapping,
    same_ns: bool,
) -> Option<(PathBuf, Option<(u64, u64)>)> {
    use std::os::unix::fs::MetadataExt;
    let map_file = PathBuf::from(format!(
        "/proc/{pid}/map_files/{:x}-{:x}",
        first.start, first.end
    ));
    let path = if same_ns {
        PathBuf::from(f.path)
    } else {
        PathBuf::from(format!("/proc/{pid}/root{}", f.path))
    };
    let at_path = if f.deleted {
        None
    } else {
        std::fs::metadata(&path).ok()
    };
    let at_path_id = at_path.as_ref().map(|m| (m.dev(), m.ino()));
    if let Ok(mapped) = std::fs::File::open(&map_file).and_then(|f| f.metadata()) {
        let mapped_id = (mapped.dev(), mapped.ino());
        return Some(if at_path_id == Some(mapped_id) {
            (path, Some(mapped_id))
        } else {
            (map_file, None)
        });
    }
    let id = at_path_id?;
    (id.1 == first.inode).then_some((path, Some(id)))
}

fn same_mount_namespace(pid: u32) -> bool {
    let ours = std::fs::read_link("/proc/self/ns/mnt");
    let theirs = std::fs::read_link(format!("/proc/{pid}/ns/mnt"));
    match (ours, theirs) {
        (Ok(a), Ok(b)) => a == b,
        // Cannot tell (no permission): use the plain path.
        _ => true,
    }
}

/// Is `path` one of the mapped files? (Canonical paths compared.)
pub fn find_module<'a>(modules: &'a [Module], path: &Path) -> Option<&'a Module> {
    modules.iter().find(|m| m.path == path)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAPS: &str = "\
55d0c3a6e000-55d0c3a70000 r--p 00000000 fd:01 1835023                    /usr/bin/cat
55d0c3a70000-55d0c3a75000 r-xp 00002000 fd:01 1835023                    /usr/bin/cat
55d0c3a75000-55d0c3a78000 r--p 00007000 fd:01 1835023                    /usr/bin/cat
55d0c3a78000-55d0c3a79000 r--p 00009000 fd:01 1835023                    /usr/bin/cat
55d0c3a79000-55d0c3a7a000 rw-p 0000a000 fd:01 1835023                    /usr/bin/cat
55d0c4b1a000-55d0c4b3b000 rw-p 00000000 00:00 0                          [heap]
7f1e2a200000-7f1e2a228000 r--p 00000000 fd:01 1837453                    /usr/lib/x86_64-linux-gnu/libc.so.6
7f1e2a228000-7f1e2a3bd000 r-xp 00028000 fd:01 1837453                    /usr/lib/x86_64-linux-gnu/libc.so.6
7f1e2a400000-7f1e2a401000 rw-s 00000000 00:01 99                         /memfd:weft code (deleted)
7f1e2a500000-7f1e2a501000 r-xp 00001000 fd:01 77                         /tmp/my app (deleted)
7ffd1b3c6000-7ffd1b3e7000 rw-p 00000000 00:00 0                          [stack]
ffffffffff600000-ffffffffff601000 --xp 00000000 00:00 0                  [vsyscall]
";

    #[test]
    fn parses_lines() {
        let maps = ProcMaps::parse(MAPS).unwrap();
        assert_eq!(maps.mappings.len(), 12);
        let m = &maps.mappings[1];
        assert_eq!(
            (m.start, m.end, m.offset),
            (0x55d0c3a70000, 0x55d0c3a75000, 0x2000)
        );
        assert_eq!(
            m.perms,
            Perms {
                read: true,
                write: false,
                exec: true,
                shared: false
            }
        );
        assert_eq!((m.dev, m.inode), ((0xfd, 1), 1835023));
        assert_eq!(m.file_path(), Some("/usr/bin/cat"));
        assert_eq!(maps.mappings[5].name, "[heap]");
        assert_eq!(maps.mappings[5].file_path(), None);
        let app = &maps.mappings[9];
        assert_eq!(app.name, "/tmp/my app");
        assert!(app.deleted);
        assert!(maps.mappings[8].perms.shared);
        let files = maps.mapped_files();
        let names: Vec<&str> = files.iter().map(|f| f.path).collect();
        assert_eq!(
            names,
            [
                "/usr/bin/cat",
                "/usr/lib/x86_64-linux-gnu/libc.so.6",
                "/memfd:weft code",
                "/tmp/my app"
            ]
        );
        assert_eq!(files[0].mappings.len(), 5);
    }

    #[test]
    fn rejects_garbage() {
        let e = ProcMaps::parse("hello world\n").unwrap_err();
        assert_eq!(
            e.to_string(),
            "malformed line 1 in a /proc/PID/maps file: `hello world`"
        );
        assert!(ProcMaps::parse("1-2 r-xp 0 zz 0\n").is_err());
        assert!(ProcMaps::parse("").unwrap().mappings.is_empty());
    }

    fn load(offset: u64, vaddr: u64, filesz: u64) -> Segment {
        Segment {
            kind: 1,
            flags: 4,
            offset,
            vaddr,
            filesz,
            memsz: filesz,
            align: 0x1000,
        }
    }

    fn mapping(start: u64, offset: u64) -> Mapping {
        Mapping {
            start,
            end: start + 0x1000,
            perms: Perms::default(),
            offset,
            dev: (0, 0),
            inode: 1,
            name: "/x".into(),
            deleted: false,
        }
    }

    #[test]
    fn bias_pie() {
        // A typical PIE: four PT_LOADs, data segment with an unaligned offset.
        let segs = [
            load(0, 0, 0x5e8),
            load(0x1000, 0x1000, 0x1a5),
            load(0x2000, 0x2000, 0xf4),
            load(0x2db8, 0x3db8, 0x260),
        ];
        let s = 0x5555_5555_4000;
        let maps = [
            mapping(s, 0),
            mapping(s + 0x1000, 0x1000),
            mapping(s + 0x2000, 0x2000),
            mapping(s + 0x3000, 0x2000),
            mapping(s + 0x4000, 0x3000),
        ];
        let refs: Vec<&Mapping> = maps.iter().collect();
        assert_eq!(load_bias(&refs, &segs), Some(s));
        // The data mappings alone give the same answer.
        assert_eq!(load_bias(&refs[3..], &segs), Some(s));
    }

    #[test]
    fn bias_non_pie_is_zero() {
        let segs = [
            load(0, 0x400000, 0x5e8),
            load(0x1000, 0x401000, 0x1a5),
            load(0x2df0, 0x403df0, 0x230),
        ];
        let maps = [
            mapping(0x400000, 0),
            mapping(0x401000, 0x1000),
            mapping(0x403000, 0x2000),
        ];
        let refs: Vec<&Mapping> = maps.iter().collect();
        assert_eq!(load_bias(&refs, &segs), Some(0));
    }

    #[test]
    fn bias_with_shared_file_page() {
        // Old layout: text at offset 0, data at 0xdb0 in the same file page.
        let segs = [load(0, 0, 0x7fc), load(0xdb0, 0x200db0, 0x260)];
        let s = 0x7f00_0000_0000;
        let maps = [
            mapping(s, 0),
            mapping(s + 0x200000, 0),
            mapping(s + 0x201000, 0x1000),
        ];
        let refs: Vec<&Mapping> = maps.iter().collect();
        assert_eq!(load_bias(&refs, &segs), Some(s));
        assert_eq!(load_bias(&refs[..1], &segs), Some(s));
    }

    #[test]
    fn bias_of_unrelated_mapping_is_none() {
        let segs = [load(0, 0, 0x100)];
        let maps = [mapping(0x1000, 0x5000)];
        assert_eq!(load_bias(&[&maps[0]], &segs), None);
    }
}
