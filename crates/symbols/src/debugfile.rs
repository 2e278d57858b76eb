//! Where a file's DWARF lives, and loading it for gimli.
//!
//! * **The file's own sections**, compressed (`SHF_COMPRESSED`: zlib or zstd, and the
//!   older `.zdebug_*` form) or not. Uncompressed sections are read in place (ranges
//!   of the mapped file); compressed ones are inflated once, into their own buffer
//!   (object's `uncompressed_data`).
//! * **A separate debug file** when the file has no `.debug_info` of its own, looked
//!   for as gdb does ([`DebugSearch::find_separate`]): by build-id under each
//!   debug-file directory, then by `.gnu_debuglink` (next to the file, in its
//!   `.debug/` directory, and under each debug-file directory followed by the file's
//!   own directory), a debuglink candidate only if its CRC matches.
//! * **Split DWARF**: each skeleton unit (one with a DWO id) is replaced by its full
//!   unit, from the package `FILE.dwp` next to the file (or next to its debug file),
//!   else from the `.dwo` file its skeleton names (`DW_AT_dwo_name` or
//!   `DW_AT_GNU_dwo_name`, under `DW_AT_comp_dir`; then in the file's directory), whose
//!   DWO id must match.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use gimli::LittleEndian;
use object::{CompressionFormat, Object, ObjectSection};

use crate::elf::{Bytes, ElfFile, SharedBytes};

/// The reader every DWARF section is read through: a range of shared bytes.
pub(crate) type R = gimli::EndianReader<LittleEndian, SharedBytes>;

type Elf64<'a> = object::read::elf::ElfFile64<'a, object::LittleEndian>;

/// The `--debuginfo` directories ([`DebugSearch::add_user_dirs`]).
static USER_DIRS: std::sync::OnceLock<Vec<PathBuf>> = std::sync::OnceLock::new();

/// gdb's default `debug-file-directory`.
pub const DEFAULT_DEBUG_DIR: &str = "/usr/lib/debug";

/// Where separate debug files are looked for: gdb's `debug-file-directory`, a list
/// of directories.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DebugSearch {
    pub dirs: Vec<PathBuf>,
}

impl DebugSearch {
    /// The environment variable that replaces the default list
    /// ([`DEFAULT_DEBUG_DIR`]): directories separated by `:`, as gdb's setting.
    pub const ENV: &'static str = "WEFT_DEBUG_FILE_DIRECTORY";

    /// The directories given with [`DebugSearch::add_user_dirs`] (`--debuginfo`),
    /// then `$WEFT_DEBUG_FILE_DIRECTORY` if set, else `/usr/lib/debug`.
    pub fn system() -> DebugSearch {
        let mut dirs = USER_DIRS.get().cloned().unwrap_or_default();
        match std::env::var_os(Self::ENV) {
            Some(v) => dirs.extend(std::env::split_paths(&v).filter(|p| !p.as_os_str().is_empty())),
            None => dirs.push(PathBuf::from(DEFAULT_DEBUG_DIR)),
        }
        DebugSearch { dirs }
    }

    /// Directories searched first by every [`DebugSearch::system`] of this process
    /// (upstream's `--debuginfo=DIR`: the program sets them once, at its start,
    /// before any DWARF is read; a second call is ignored and returns false).
    pub fn add_user_dirs(dirs: Vec<PathBuf>) -> bool {
        USER_DIRS.set(dirs).is_ok()
    }

    /// The separate debug file of `elf`: by build-id (`DIR/.build-id/xx/rest.debug`
    /// with the same build-id), then by `.gnu_debuglink` (`FILEDIR/NAME`,
    /// `FILEDIR/.debug/NAME`, `DIR/FILEDIR/NAME`, with a matching CRC); a file
    /// without a `.gnu_debuglink` by the name it would have (`DIR/FILEPATH.debug`,
    /// with the same build-id). Only files with a `.debug_info` count.
    pub fn find_separate(&self, elf: &ElfFile) -> Option<PathBuf> {
        if let Some(id) = elf.build_id_hex().filter(|id| id.len() > 2) {
            let (head, rest) = id.split_at(2);
            for dir in &self.dirs {
                let path = dir
                    .join(".build-id")
                    .join(head)
                    .join(format!("{rest}.debug"));
                let Ok(bytes) = SharedBytes::map(&path) else {
                    continue;
                };
                let Ok(obj) = Elf64::parse(&*bytes) else {
                    continue;
                };
                if obj.build_id().ok().flatten() == elf.build_id() && has_debug_info(&obj) {
                    return Some(path);
                }
            }
        }
        let obj = Elf64::parse(elf.data()).ok()?;
        let Some((name, crc)) = obj.gnu_debuglink().ok()? else {
            return self.by_path(elf);
        };
        let name = Path::new(std::str::from_utf8(name).ok()?);
        if name.components().count() != 1 {
            return None; // a bare file name, never a path
        }
        let own = elf.path().canonicalize().ok();
        let file_dir = own
            .as_deref()
            .unwrap_or(elf.path())
            .parent()
            .unwrap_or(Path::new("/"))
            .to_path_buf();
        let mut candidates = vec![file_dir.join(name), file_dir.join(".debug").join(name)];
        let relative = file_dir.strip_prefix("/").unwrap_or(&file_dir);
        candidates.extend(self.dirs.iter().map(|d| d.join(relative).join(name)));
        candidates.into_iter().find(|path| {
            // A debuglink naming the file itself is not a separate file.
            if own.is_some() && path.canonicalize().ok() == own {
                return false;
            }
            let Ok(bytes) = SharedBytes::map(path) else {
                return false;
            };
            crc32fast::hash(&bytes) == crc
                && Elf64::parse(&*bytes).is_ok_and(|o| has_debug_info(&o))
        })
    }
}

impl DebugSearch {
    /// `DIR/FILEPATH.debug` (the name `objcopy --only-keep-debug` output is given
    /// under a debug directory, and a debuglink would name) for a file with no
    /// `.gnu_debuglink`: its build-id must be the file's (both without one counts).
    fn by_path(&self, elf: &ElfFile) -> Option<PathBuf> {
        let own = elf.path().canonicalize().ok()?;
        let relative = own.strip_prefix("/").ok()?;
        let mut name = relative.as_os_str().to_os_string();
        name.push(".debug");
        self.dirs.iter().map(|d| d.join(&name)).find(|path| {
            let Ok(bytes) = SharedBytes::map(path) else {
                return false;
            };
            Elf64::parse(&*bytes)
                .is_ok_and(|o| has_debug_info(&o) && o.build_id().ok().flatten() == elf.build_id())
        })
    }
}

fn has_debug_info(obj: &Elf64<'_>) -> bool {
    obj.section_by_name(".debug_info").is_some()
}

/// Whether an ELF file holds `.debug_info` (compressed or not).
pub(crate) fn file_has_debug_info(bytes: &[u8]) -> bool {
    Elf64::parse(bytes).is_ok_and(|o| has_debug_info(&o))
}

fn empty() -> R {
    R::new(SharedBytes::new(Bytes::Owned(Vec::new())), LittleEndian)
}

/// One section for gimli: `name` in the file (its `.zdebug_` form too), read in
/// place or decompressed; empty when the file has no such section.
fn section(bytes: &SharedBytes, obj: &Elf64<'_>, name: Option<&str>) -> Result<R, String> {
    let Some(s) = name.and_then(|n| obj.section_by_name(n)) else {
        return Ok(empty());
    };
    let why = |e: object::Error| format!("{}: {e}", name.unwrap_or(""));
    let range = s.compressed_file_range().map_err(why)?;
    if range.format == CompressionFormat::None {
        let start = usize::try_from(range.offset).ok();
        let end = start.zip(usize::try_from(range.compressed_size).ok());
        let end = end
            .and_then(|(s, n)| s.checked_add(n))
            .filter(|&e| e <= bytes.len());
        return match (start, end) {
            (Some(start), Some(end)) => Ok(R::new(bytes.clone(), LittleEndian).range(start..end)),
            _ => Err(format!("{}: section outside the file", name.unwrap_or(""))),
        };
    }
    let data = s.uncompressed_data().map_err(why)?.into_owned();
    Ok(R::new(SharedBytes::new(Bytes::Owned(data)), LittleEndian))
}

/// The DWARF sections of an ELF file (a program, a debug file, a `.dwo`: `dwo`
/// reads the `.dwo`-suffixed names).
pub(crate) fn load_dwarf(bytes: &SharedBytes, dwo: bool) -> Result<gimli::Dwarf<R>, String> {
    let obj = Elf64::parse(&**bytes).map_err(|e| e.to_string())?;
    gimli::Dwarf::load(|id| {
        section(
            bytes,
            &obj,
            if dwo { id.dwo_name() } else { Some(id.name()) },
        )
    })
}

/// A `.dwp` package, if `path` is one.
pub(crate) fn load_package(path: &Path) -> Option<gimli::DwarfPackage<R>> {
    let bytes = SharedBytes::map(path).ok()?;
    let obj = Elf64::parse(&*bytes).ok()?;
    gimli::DwarfPackage::load(
        |id| section(&bytes, &obj, id.dwo_name()).map_err(|_| gimli::Error::Io),
        empty(),
    )
    .ok()
}

/// `FILE.dwp` for a file path (the name `dwp -e FILE` writes by default).
pub(crate) fn package_path(file: &Path) -> PathBuf {
    let mut name = file.as_os_str().to_os_string();
    name.push(".dwp");
    PathBuf::from(name)
}

/// A split unit: the DWARF of its `.dwo` (or package contribution) and the unit.
pub(crate) struct SplitUnit {
    pub dwarf: Arc<gimli::Dwarf<R>>,
    pub unit: gimli::Unit<R>,
}

/// Where the full unit of a skeleton was looked for, when it was found nowhere.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MissingDwo {
    /// The `.dwo` file the skeleton names, as the compiler wrote it.
    pub name: String,
    pub dwo_id: u64,
}

/// The full unit of `skeleton`: from `package`, else from its `.dwo` file (under its
/// `DW_AT_comp_dir`, then in `file_dir`, then its base name in `file_dir`).
pub(crate) fn split_unit(
    parent: &gimli::Dwarf<R>,
    skeleton: &gimli::Unit<R>,
    package: Option<&gimli::DwarfPackage<R>>,
    file_dir: &Path,
) -> Result<SplitUnit, MissingDwo> {
    let dwo_id = skeleton.dwo_id.unwrap_or(gimli::DwoId(0));
    let name = skeleton
        .dwo_name()
        .ok()
        .flatten()
        .and_then(|v| parent.attr_string(skeleton, v).ok())
        .map(|s| String::from_utf8_lossy(&s).into_owned());
    let missing = || MissingDwo {
        name: name.clone().unwrap_or_default(),
        dwo_id: dwo_id.0,
    };
    let finish = |dwarf: gimli::Dwarf<R>| -> Option<SplitUnit> {
        let header = dwarf.units().next().ok()??;
        let mut unit = dwarf.unit(header).ok()?;
        if unit.dwo_id != Some(dwo_id) {
            return None;
        }
        unit.copy_relocated_attributes(skeleton);
        Some(SplitUnit {
            dwarf: Arc::new(dwarf),
            unit,
        })
    };
    if let Some(found) = package
        .and_then(|p| p.find_cu(dwo_id, parent).ok().flatten())
        .and_then(finish)
    {
        return Ok(found);
    }
    let Some(name) = name.as_deref() else {
        return Err(missing());
    };
    let mut candidates = Vec::new();
    let comp_dir = skeleton
        .comp_dir
        .as_ref()
        .map(|d| PathBuf::from(OsStr::from_bytes(d)));
    candidates.push(match &comp_dir {
        Some(dir) => dir.join(name),
        None => PathBuf::from(name),
    });
    if Path::new(name).is_relative() {
        candidates.push(file_dir.join(name));
    }
    if let Some(base) = Path::new(name).file_name() {
        candidates.push(file_dir.join(base));
    }
    for path in candidates {
        let Ok(bytes) = SharedBytes::map(&path) else {
            continue;
        };
        let Ok(mut dwarf) = load_dwarf(&bytes, true) else {
            continue;
        };
        dwarf.make_dwo(parent);
        if let Some(found) = finish(dwarf) {
            return Ok(found);
        }
    }
    Err(missing())
}
