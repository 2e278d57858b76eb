//! One ELF file on disk: validated headers, the facts weft needs about it (PIE or not,
//! static or dynamic, build-id, `DT_NEEDED`, stripped or not), its functions, and its
//! bytes by virtual address.
//!
//! Everything is parsed once, in [`ElfFile::parse`], from a byte slice; a malformed or
//! truncated file is an [`Error`], never a panic. [`ElfFile::open`] maps the file and
//! calls it.
//!
//! Addresses here are *file* virtual addresses (`st_value`, `p_vaddr`); add a
//! [`crate::Module`]'s load bias to get the address in a running process.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::ops::Deref;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use object::elf;
use object::read::elf::{FileHeader, ProgramHeader, SectionHeader, Sym};
use object::LittleEndian as LE;

use crate::error::{Error, Result};

type Header = elf::FileHeader64<LE>;

const DT_RELRSZ: u64 = 35;
const DT_RELR: u64 = 36;
const T_NULL: u64 = elf::DT_NULL as u64;
const T_NEEDED: u64 = elf::DT_NEEDED as u64;
const T_STRTAB: u64 = elf::DT_STRTAB as u64;
const T_STRSZ: u64 = elf::DT_STRSZ as u64;
const T_SONAME: u64 = elf::DT_SONAME as u64;
const T_FLAGS_1: u64 = elf::DT_FLAGS_1 as u64;

/// What kind of program an ELF file is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ElfKind {
    /// `ET_EXEC`: a position-dependent executable; its load bias is always 0.
    Executable,
    /// `ET_DYN` with `DF_1_PIE` (or an interpreter and no soname).
    PieExecutable,
    /// `ET_DYN` otherwise.
    SharedLibrary,
}

/// A program header (only the fields weft uses).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Segment {
    /// `p_type` (`PT_LOAD` = 1, …).
    pub kind: u32,
    /// `p_flags`: `PF_X` = 1, `PF_W` = 2, `PF_R` = 4.
    pub flags: u32,
    pub offset: u64,
    pub vaddr: u64,
    pub filesz: u64,
    pub memsz: u64,
    pub align: u64,
}

impl Segment {
    pub fn is_load(&self) -> bool {
        self.kind == elf::PT_LOAD
    }
}

/// A section header (only the fields weft uses).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Section {
    pub name: String,
    /// `sh_type`.
    pub kind: u32,
    pub flags: u64,
    pub addr: u64,
    pub offset: u64,
    pub size: u64,
}

/// One name of a function, with its C++ demangling when it is a mangled name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FunctionName {
    /// The symbol name exactly as in the symbol table (mangled for C++).
    pub raw: String,
    /// The full demangled name, `ns::f(int, char const*)`.
    pub demangled: Option<String>,
    /// The demangled name without the parameter list, `ns::f`.
    pub demangled_base: Option<String>,
}

impl FunctionName {
    fn new(raw: String) -> FunctionName {
        let (demangled, demangled_base) = match demangle(&raw) {
            Some((full, base)) => (Some(full), Some(base)),
            None => (None, None),
        };
        FunctionName {
            raw,
            demangled,
            demangled_base,
        }
    }

    /// The raw name and the demangled forms, the strings a pattern is matched against.
    pub fn forms(&self) -> impl Iterator<Item = &str> {
        std::iter::once(self.raw.as_str())
            .chain(self.demangled.as_deref())
            .chain(self.demangled_base.as_deref())
    }
}

/// A function defined in the file: every symbol (`STT_FUNC` or `STT_GNU_IFUNC`) at one
/// address, merged.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Function {
    pub vaddr: u64,
    /// `st_size` (the largest among the aliases); 0 when the symbol has no size.
    pub size: u64,
    /// All names at this address, the preferred one first: `.symtab` names before
    /// `.dynsym` ones, then global before weak before local, then fewer leading
    /// underscores (`malloc` before `__libc_malloc`), then table order.
    pub names: Vec<FunctionName>,
    /// An `STT_GNU_IFUNC`: the address is the resolver, not the implementation.
    pub ifunc: bool,
    pub in_symtab: bool,
    pub in_dynsym: bool,
}

impl Function {
    /// The preferred name.
    pub fn name(&self) -> &str {
        &self.names[0].raw
    }

    /// The preferred name's demangling, or the name itself.
    pub fn display_name(&self) -> &str {
        self.names[0]
            .demangled
            .as_deref()
            .unwrap_or(&self.names[0].raw)
    }
}

/// A file's bytes: mapped from disk, or owned (for files parsed from memory and
/// decompressed sections).
pub(crate) enum Bytes {
    Mapped(memmap2::Mmap),
    Owned(Vec<u8>),
}

impl Deref for Bytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Bytes::Mapped(m) => m,
            Bytes::Owned(v) => v,
        }
    }
}

/// [`Bytes`] shared by everything read from them: the [`ElfFile`], and the DWARF
/// readers (`gimli::EndianReader`s) that outlive a borrow of it.
#[derive(Clone)]
pub(crate) struct SharedBytes(Arc<Bytes>);

impl SharedBytes {
    pub(crate) fn new(bytes: Bytes) -> SharedBytes {
        SharedBytes(Arc::new(bytes))
    }

    /// Maps the file at `path` (an empty file is an empty buffer: mmap refuses it).
    pub(crate) fn map(path: &Path) -> std::io::Result<SharedBytes> {
        // Never open a FIFO or a device (the open itself may block).
        if !std::fs::metadata(path)?.is_file() {
            return Err(std::io::Error::other("not a regular file"));
        }
        let file = File::open(path)?;
        let meta = file.metadata()?;
        if !meta.is_file() {
            return Err(std::io::Error::other("not a regular file"));
        }
        if meta.len() == 0 {
            return Ok(SharedBytes::new(Bytes::Owned(Vec::new())));
        }
        // SAFETY: as in `ElfFile::open_identified`: a private read-only mapping of a
        // file that is replaced by rename, not rewritten in place, in practice.
        let map = unsafe { memmap2::Mmap::map(&file) }?;
        Ok(SharedBytes::new(Bytes::Mapped(map)))
    }
}

impl Deref for SharedBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.0
    }
}

impl std::fmt::Debug for SharedBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SharedBytes({} bytes)", self.len())
    }
}

// SAFETY: the bytes live in an `Arc` that is never mutated, and neither a mapping nor
// a `Vec`'s buffer moves when the `SharedBytes` (or the `Arc`) is moved or cloned: the
// address `deref` returns is the same for every clone for as long as any lives.
unsafe impl gimli::StableDeref for SharedBytes {}
// SAFETY: see above; a clone derefs to the same address.
unsafe impl gimli::CloneStableDeref for SharedBytes {}

/// A function the file calls through the dynamic linker: a dynamic symbol with an
/// `R_X86_64_JUMP_SLOT` or `R_X86_64_GLOB_DAT` relocation (a library's function, or
/// one of its own that another object may interpose).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Import {
    pub name: String,
    /// The GOT slot the dynamic linker fills with the function's address.
    pub slot: u64,
    /// The PLT entry that jumps through the slot (what the file's `call`s target):
    /// in `.plt.sec` (IBT builds), `.plt` or `.plt.got`. `None` when no PLT entry
    /// uses the slot (`-fno-plt` code calls through it: `call [rip+slot]`).
    pub plt: Option<u64>,
}

/// A validated 64-bit little-endian x86-64 executable or shared library.
pub struct ElfFile {
    path: PathBuf,
    data: SharedBytes,
    kind: ElfKind,
    entry: u64,
    segments: Vec<Segment>,
    sections: Vec<Section>,
    interpreter: Option<String>,
    needed: Vec<String>,
    soname: Option<String>,
    has_dynamic: bool,
    build_id: Option<Vec<u8>>,
    functions: Vec<Function>,
    /// Defined symbols of any type by name (for `sym(%rip)` USDT arguments).
    symbols: HashMap<String, u64>,
    /// Data objects (`STT_OBJECT`) by name: address and size.
    objects: HashMap<String, (u64, u64)>,
    /// `(r_offset, value)` of the dynamic relocations whose value is known statically.
    static_relocs: BTreeMap<u64, u64>,
    imports: Vec<Import>,
}

impl std::fmt::Debug for ElfFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ElfFile")
            .field("path", &self.path)
            .field("kind", &self.kind)
            .field("functions", &self.functions.len())
            .finish_non_exhaustive()
    }
}

impl ElfFile {
    /// Maps and parses the file at `path`.
    pub fn open(path: impl AsRef<Path>) -> Result<ElfFile> {
        ElfFile::open_identified(path.as_ref(), None)
    }

    /// Maps and parses the file at `path` if it is (still) the file with this
    /// `(st_dev, st_ino)`: checked on the opened file, so a path swapped meanwhile
    /// cannot substitute another file.
    pub fn open_identified(path: &Path, identity: Option<(u64, u64)>) -> Result<ElfFile> {
        use std::os::unix::fs::MetadataExt;
        let io = |source| Error::Io {
            path: path.to_path_buf(),
            source,
        };
        let file = File::open(path).map_err(io)?;
        let meta = file.metadata().map_err(io)?;
        if identity.is_some_and(|id| id != (meta.dev(), meta.ino())) {
            return Err(io(std::io::Error::other(
                "no longer the file the process mapped",
            )));
        }
        if meta.is_dir() {
            return Err(io(std::io::Error::from(std::io::ErrorKind::IsADirectory)));
        }
        if !meta.is_file() {
            // Devices, FIFOs, sockets: never read them (they may not end).
            return Err(Error::NotElf {
                path: path.to_path_buf(),
            });
        }
        if meta.len() < 64 {
            // Too small to be ELF (and mmap of an empty file fails).
            let data = std::fs::read(path).map_err(io)?;
            return ElfFile::parse(path, data);
        }
        // SAFETY: the mapping is private and read-only. Like every ELF reader that maps
        // files (gdb, perf, bpftrace), we accept that a concurrent truncation of the
        // file by another process could fault; binaries are replaced by rename, not
        // rewritten in place, in practice.
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io)?;
        ElfFile::parse_bytes(path, Bytes::Mapped(map))
    }

    /// Parses ELF bytes already in memory; `path` is used in messages and listings.
    pub fn parse(path: impl AsRef<Path>, data: Vec<u8>) -> Result<ElfFile> {
        ElfFile::parse_bytes(path.as_ref(), Bytes::Owned(data))
    }

    fn parse_bytes(path: &Path, data: Bytes) -> Result<ElfFile> {
        let parsed = Parsed::parse(path, &data)?;
        Ok(ElfFile {
            path: path.to_path_buf(),
            data: SharedBytes::new(data),
            kind: parsed.kind,
            entry: parsed.entry,
            segments: parsed.segments,
            sections: parsed.sections,
            interpreter: parsed.interpreter,
            needed: parsed.needed,
            soname: parsed.soname,
            has_dynamic: parsed.has_dynamic,
            build_id: parsed.build_id,
            functions: parsed.functions,
            symbols: parsed.symbols,
            objects: parsed.objects,
            static_relocs: parsed.static_relocs,
            imports: parsed.imports,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The same file under another name (for files read through `/proc/PID/root`).
    pub fn with_path(mut self, path: impl Into<PathBuf>) -> ElfFile {
        self.path = path.into();
        self
    }

    /// The whole file.
    pub fn data(&self) -> &[u8] {
        &self.data
    }

    /// The whole file, shared (for readers that outlive a borrow of `self`).
    pub(crate) fn shared_data(&self) -> SharedBytes {
        self.data.clone()
    }

    pub fn kind(&self) -> ElfKind {
        self.kind
    }

    /// `ET_DYN`: loaded at a bias chosen at run time (PIE executables and libraries).
    pub fn is_position_independent(&self) -> bool {
        self.kind != ElfKind::Executable
    }

    pub fn is_pie(&self) -> bool {
        self.kind == ElfKind::PieExecutable
    }

    /// A program with no interpreter and no `DT_NEEDED` (static, or static-pie).
    pub fn is_static(&self) -> bool {
        self.kind != ElfKind::SharedLibrary && self.interpreter.is_none() && self.needed.is_empty()
    }

    /// Has a `PT_DYNAMIC` segment (dynamic executables, libraries, static-pie).
    pub fn has_dynamic_section(&self) -> bool {
        self.has_dynamic
    }

    /// `PT_INTERP`, e.g. `/lib64/ld-linux-x86-64.so.2`.
    pub fn interpreter(&self) -> Option<&str> {
        self.interpreter.as_deref()
    }

    /// `DT_NEEDED` entries in order, e.g. `["libc.so.6"]`.
    pub fn needed(&self) -> &[String] {
        &self.needed
    }

    pub fn soname(&self) -> Option<&str> {
        self.soname.as_deref()
    }

    /// The GNU build-id note's bytes.
    pub fn build_id(&self) -> Option<&[u8]> {
        self.build_id.as_deref()
    }

    /// The build-id as lowercase hex.
    pub fn build_id_hex(&self) -> Option<String> {
        self.build_id
            .as_ref()
            .map(|b| b.iter().map(|x| format!("{x:02x}")).collect())
    }

    /// No `.symtab`: only exported (`.dynsym`) functions are known.
    pub fn is_stripped(&self) -> bool {
        !self.sections.iter().any(|s| s.kind == elf::SHT_SYMTAB)
    }

    pub fn has_debug_info(&self) -> bool {
        self.section(".debug_info").is_some()
    }

    pub fn entry(&self) -> u64 {
        self.entry
    }

    pub fn segments(&self) -> &[Segment] {
        &self.segments
    }

    pub fn sections(&self) -> &[Section] {
        &self.sections
    }

    pub fn section(&self, name: &str) -> Option<&Section> {
        self.sections.iter().find(|s| s.name == name)
    }

    /// The file bytes of a section (empty for `SHT_NOBITS`).
    pub fn section_data(&self, section: &Section) -> &[u8] {
        if section.kind == elf::SHT_NOBITS {
            return &[];
        }
        let range = usize::try_from(section.offset)
            .ok()
            .zip(usize::try_from(section.size).ok())
            .and_then(|(start, len)| Some(start..start.checked_add(len)?));
        range.and_then(|r| self.data.get(r)).unwrap_or(&[])
    }

    /// Functions, sorted by address, one per address (see [`Function::names`]).
    pub fn functions(&self) -> &[Function] {
        &self.functions
    }

    /// The function whose `[vaddr, vaddr + size)` holds `vaddr` (size-0 functions
    /// cover only their own address).
    pub fn function_at(&self, vaddr: u64) -> Option<&Function> {
        let i = self.functions.partition_point(|f| f.vaddr <= vaddr);
        let f = self.functions.get(i.checked_sub(1)?)?;
        (vaddr == f.vaddr || vaddr - f.vaddr < f.size).then_some(f)
    }

    /// The functions called through the dynamic linker, by GOT slot (see
    /// [`Import`]).
    pub fn imports(&self) -> &[Import] {
        &self.imports
    }

    /// The address of a defined symbol of any type (function, object, notype).
    pub fn symbol_vaddr(&self, name: &str) -> Option<u64> {
        self.symbols.get(name).copied()
    }

    /// A data object (`STT_OBJECT` symbol: a global or static variable) by name:
    /// its address and size (0 when the symbol has none).
    pub fn object(&self, name: &str) -> Option<(u64, u64)> {
        self.objects.get(name).copied()
    }

    /// Names of the data objects (for suggestions).
    pub fn object_names(&self) -> impl Iterator<Item = &str> {
        self.objects.keys().map(String::as_str)
    }

    /// `len` file bytes at virtual address `vaddr` (through the `PT_LOAD` headers).
    /// Bytes that exist only in memory (`.bss`) are an error.
    pub fn read_vaddr(&self, vaddr: u64, len: u64) -> Result<&[u8]> {
        let err = || Error::NoFileBytes {
            path: self.path.clone(),
            vaddr,
            len,
        };
        let end = vaddr.checked_add(len).ok_or_else(err)?;
        let seg = self
            .segments
            .iter()
            .filter(|s| s.is_load())
            .find(|s| s.vaddr <= vaddr && end <= s.vaddr + s.filesz)
            .ok_or_else(err)?;
        let start = (seg.offset + (vaddr - seg.vaddr)) as usize;
        Ok(&self.data[start..start + len as usize])
    }

    /// The file offset holding virtual address `vaddr`.
    pub fn vaddr_to_file_offset(&self, vaddr: u64) -> Option<u64> {
        self.segments
            .iter()
            .filter(|s| s.is_load())
            .find(|s| s.vaddr <= vaddr && vaddr - s.vaddr < s.filesz)
            .map(|s| s.offset + (vaddr - s.vaddr))
    }

    /// The virtual address at which file offset `offset` is loaded.
    pub fn file_offset_to_vaddr(&self, offset: u64) -> Option<u64> {
        self.segments
            .iter()
            .filter(|s| s.is_load())
            .find(|s| s.offset <= offset && offset - s.offset < s.filesz)
            .map(|s| s.vaddr + (offset - s.offset))
    }

    /// Entries of `__patchable_function_entries` (`-fpatchable-function-entry=N[,M]`):
    /// the address of each function's NOP area, sorted. Empty when absent.
    pub fn patchable_function_entries(&self) -> Vec<u64> {
        self.address_table("__patchable_function_entries")
    }

    /// Entries of `__mcount_loc` (`-pg -mrecord-mcount`, with `-mfentry` at the
    /// function entries): the address of each `call mcount`/NOP, sorted.
    pub fn mcount_locations(&self) -> Vec<u64> {
        self.address_table("__mcount_loc")
    }

    /// A section of 8-byte absolute addresses. In an `ET_DYN` file the linker emits
    /// a dynamic relocation for each (`R_X86_64_RELATIVE` in `.rela.dyn`, or a
    /// `.relr.dyn` bitmap entry), and the value is the relocation's result at bias 0;
    /// otherwise it is the section's content. Zero entries (functions removed by
    /// `--gc-sections`) are dropped.
    fn address_table(&self, name: &str) -> Vec<u64> {
        let Some(sec) = self.section(name) else {
            return Vec::new();
        };
        let bytes = self.section_data(sec);
        let mut out: Vec<u64> = bytes
            .chunks_exact(8)
            .enumerate()
            .map(|(i, w)| {
                let at = sec.addr.wrapping_add(8 * i as u64);
                let content = u64::from_le_bytes(w.try_into().unwrap_or([0; 8]));
                self.static_relocs.get(&at).copied().unwrap_or(content)
            })
            .filter(|&v| v != 0)
            .collect();
        out.sort_unstable();
        out.dedup();
        out
    }
}

/// Reads only the ELF header and program headers of the file at `path` (enough for a
/// load bias), validating them as [`ElfFile::open`] would.
pub(crate) fn read_segments(path: &Path) -> Result<Vec<Segment>> {
    use std::io::{Read, Seek, SeekFrom};
    let io = |source| Error::Io {
        path: path.to_path_buf(),
        source,
    };
    let malformed = |what: &str| Error::Malformed {
        path: path.to_path_buf(),
        what: what.to_string(),
    };
    let mut file = File::open(path).map_err(io)?;
    let mut head = Vec::with_capacity(64);
    (&mut file).take(64).read_to_end(&mut head).map_err(io)?;
    if head.len() < 16 || &head[..4] != b"\x7fELF" {
        return Err(Error::NotElf {
            path: path.to_path_buf(),
        });
    }
    if head[4] == 1 {
        return Err(Error::Not64Bit {
            path: path.to_path_buf(),
        });
    }
    if head.len() < 64 || head[4] != 2 || head[5] != 1 {
        return Err(malformed("bad ELF header"));
    }
    let u16_at = |i: usize| u16::from_le_bytes([head[i], head[i + 1]]);
    let machine = u16_at(18);
    if machine != elf::EM_X86_64 {
        return Err(Error::WrongMachine {
            path: path.to_path_buf(),
            machine: machine_name(machine),
        });
    }
    let phoff = u64::from_le_bytes(head[32..40].try_into().unwrap_or([0; 8]));
    let (phentsize, phnum) = (u16_at(54), u16_at(56));
    if phentsize != 56 || phnum == 0 || phnum == 0xffff {
        return Err(malformed("bad program header table"));
    }
    let mut table = vec![0u8; 56 * usize::from(phnum)];
    file.seek(SeekFrom::Start(phoff)).map_err(io)?;
    file.read_exact(&mut table)
        .map_err(|_| malformed("program headers lie outside the file"))?;
    Ok(table
        .chunks_exact(56)
        .map(|p| {
            let w32 = |i: usize| u32::from_le_bytes(p[i..i + 4].try_into().unwrap_or([0; 4]));
            let w64 = |i: usize| u64::from_le_bytes(p[i..i + 8].try_into().unwrap_or([0; 8]));
            Segment {
                kind: w32(0),
                flags: w32(4),
                offset: w64(8),
                vaddr: w64(16),
                filesz: w64(32),
                memsz: w64(40),
                align: w64(48),
            }
        })
        .collect())
}

/// Demangles a C++ (Itanium) or Rust (legacy or v0) name: `(full, without
/// parameters)`. A Rust name has no parameters (both are the path, without the
/// legacy hash: `rsapp::worker::step`).
pub fn demangle(name: &str) -> Option<(String, String)> {
    if let Ok(d) = rustc_demangle::try_demangle(name) {
        // Legacy Rust names are Itanium-shaped (`_ZN...17h<hash>E`): rustc-demangle
        // takes only those with the hash; v0 names start with `_R`.
        let path = format!("{d:#}");
        return Some((path.clone(), path));
    }
    if !name.starts_with("_Z") {
        return None;
    }
    let sym = cpp_demangle::Symbol::new(name.as_bytes()).ok()?;
    let full = sym.demangle(&cpp_demangle::DemangleOptions::new()).ok()?;
    let base = sym
        .demangle(
            &cpp_demangle::DemangleOptions::new()
                .no_params()
                .no_return_type(),
        )
        .ok()?;
    Some((full, base))
}

// ---------------------------------------------------------------------------------
// Parsing
// ---------------------------------------------------------------------------------

struct Parsed {
    kind: ElfKind,
    entry: u64,
    segments: Vec<Segment>,
    sections: Vec<Section>,
    interpreter: Option<String>,
    needed: Vec<String>,
    soname: Option<String>,
    has_dynamic: bool,
    build_id: Option<Vec<u8>>,
    functions: Vec<Function>,
    symbols: HashMap<String, u64>,
    objects: HashMap<String, (u64, u64)>,
    static_relocs: BTreeMap<u64, u64>,
    imports: Vec<Import>,
}

impl Parsed {
    fn parse(path: &Path, data: &[u8]) -> Result<Parsed> {
        let malformed = |what: String| Error::Malformed {
            path: path.to_path_buf(),
            what,
        };
        if data.len() < 16 || &data[..4] != b"\x7fELF" {
            return Err(Error::NotElf {
                path: path.to_path_buf(),
            });
        }
        match data[4] {
            elf::ELFCLASS64 => {}
            elf::ELFCLASS32 => {
                return Err(Error::Not64Bit {
                    path: path.to_path_buf(),
                })
            }
            c => return Err(malformed(format!("unknown ELF class {c}"))),
        }
        match data[5] {
            elf::ELFDATA2LSB => {}
            elf::ELFDATA2MSB => {
                return Err(Error::BigEndian {
                    path: path.to_path_buf(),
                })
            }
            d => return Err(malformed(format!("unknown data encoding {d}"))),
        }
        let hdr = Header::parse(data).map_err(|_| malformed("truncated ELF header".into()))?;
        let e = LE;
        let machine = hdr.e_machine(e);
        if machine != elf::EM_X86_64 {
            return Err(Error::WrongMachine {
                path: path.to_path_buf(),
                machine: machine_name(machine),
            });
        }
        let is_dyn = match hdr.e_type(e) {
            elf::ET_EXEC => false,
            elf::ET_DYN => true,
            elf::ET_REL => {
                return Err(Error::WrongType {
                    path: path.to_path_buf(),
                    what: "a relocatable object file",
                })
            }
            elf::ET_CORE => {
                return Err(Error::WrongType {
                    path: path.to_path_buf(),
                    what: "a core dump",
                })
            }
            _ => {
                return Err(Error::WrongType {
                    path: path.to_path_buf(),
                    what: "an ELF file of unknown type",
                })
            }
        };

        // Program headers.
        let phdrs = hdr
            .program_headers(e, data)
            .map_err(|err| malformed(format!("program headers: {err}")))?;
        let mut segments = Vec::with_capacity(phdrs.len());
        for (i, ph) in phdrs.iter().enumerate() {
            let seg = Segment {
                kind: ph.p_type(e),
                flags: ph.p_flags(e),
                offset: ph.p_offset(e),
                vaddr: ph.p_vaddr(e),
                filesz: ph.p_filesz(e),
                memsz: ph.p_memsz(e),
                align: ph.p_align(e),
            };
            let in_file = seg
                .offset
                .checked_add(seg.filesz)
                .is_some_and(|end| end <= data.len() as u64);
            if seg.kind != elf::PT_NULL && !in_file {
                return Err(malformed(format!(
                    "segment {i} lies outside the file (truncated?)"
                )));
            }
            if seg.is_load() && seg.vaddr.checked_add(seg.memsz.max(seg.filesz)).is_none() {
                return Err(malformed(format!(
                    "segment {i} wraps around the address space"
                )));
            }
            segments.push(seg);
        }

        // Section headers.
        let table = hdr
            .sections(e, data)
            .map_err(|err| malformed(format!("section headers: {err}")))?;
        let mut sections = Vec::with_capacity(table.len());
        for (i, sh) in table.iter().enumerate() {
            let name = table
                .section_name(e, sh)
                .map_err(|_| malformed(format!("section {i} has a bad name")))?;
            let sec = Section {
                name: String::from_utf8_lossy(name).into_owned(),
                kind: sh.sh_type(e),
                flags: sh.sh_flags(e),
                addr: sh.sh_addr(e),
                offset: sh.sh_offset(e),
                size: sh.sh_size(e),
            };
            let in_file = sec
                .offset
                .checked_add(sec.size)
                .is_some_and(|end| end <= data.len() as u64);
            if sec.kind != elf::SHT_NOBITS && sec.kind != elf::SHT_NULL && !in_file {
                return Err(malformed(format!(
                    "section `{}` lies outside the file (truncated?)",
                    sec.name
                )));
            }
            sections.push(sec);
        }

        // Symbols.
        let mut raw = Vec::new();
        let mut symbols = HashMap::new();
        let mut objects: HashMap<String, (u64, u64)> = HashMap::new();
        let mut dynsyms: Vec<u64> = Vec::new();
        // Names of the dynamic symbols that may be functions, by index (imports).
        let mut dyn_funcs: Vec<Option<String>> = Vec::new();
        for (sh_type, from_symtab) in [(elf::SHT_SYMTAB, true), (elf::SHT_DYNSYM, false)] {
            let syms = table
                .symbols(e, data, sh_type)
                .map_err(|err| malformed(format!("symbol table: {err}")))?;
            for (idx, sym) in syms.iter().enumerate() {
                if !from_symtab {
                    // Keep values by index for relocations against dynamic symbols.
                    let value = if sym.st_shndx(e) == elf::SHN_UNDEF {
                        0
                    } else {
                        sym.st_value(e)
                    };
                    if dynsyms.len() <= idx {
                        dynsyms.resize(idx + 1, 0);
                    }
                    dynsyms[idx] = value;
                    if matches!(
                        sym.st_type(),
                        elf::STT_FUNC | elf::STT_GNU_IFUNC | elf::STT_NOTYPE
                    ) {
                        if let Ok(n) = syms.symbol_name(e, sym) {
                            if dyn_funcs.len() <= idx {
                                dyn_funcs.resize(idx + 1, None);
                            }
                            dyn_funcs[idx] = Some(String::from_utf8_lossy(n).into_owned())
                                .filter(|n| !n.is_empty());
                        }
                    }
                }
                let shndx = sym.st_shndx(e);
                if shndx == elf::SHN_UNDEF {
                    continue;
                }
                let name = syms
                    .symbol_name(e, sym)
                    .map_err(|_| malformed("a symbol name lies outside its string table".into()))?;
                if name.is_empty() {
                    continue;
                }
                let name = String::from_utf8_lossy(name).into_owned();
                let st_type = sym.st_type();
                if matches!(
                    st_type,
                    elf::STT_FUNC | elf::STT_GNU_IFUNC | elf::STT_OBJECT | elf::STT_NOTYPE
                ) {
                    symbols.entry(name.clone()).or_insert(sym.st_value(e));
                }
                if st_type == elf::STT_OBJECT {
                    let size = sym.st_size(e);
                    let o = objects
                        .entry(name.clone())
                        .or_insert((sym.st_value(e), size));
                    o.1 = o.1.max(size);
                }
                if st_type == elf::STT_FUNC || st_type == elf::STT_GNU_IFUNC {
                    raw.push(RawSym {
                        name,
                        vaddr: sym.st_value(e),
                        size: sym.st_size(e),
                        ifunc: st_type == elf::STT_GNU_IFUNC,
                        from_symtab,
                        bind: sym.st_bind(),
                    });
                }
            }
        }
        // A stripped coldpatched binary still names its functions in its probe list.
        if let Some(list) = sections
            .iter()
            .find(|s| s.name == crate::WEFT_PROBES_SECTION && s.kind != elf::SHT_NOBITS)
        {
            let bytes = data
                .get(list.offset as usize..(list.offset + list.size) as usize)
                .unwrap_or(&[]);
            let known: std::collections::HashSet<u64> = raw.iter().map(|s| s.vaddr).collect();
            let mut added = std::collections::HashSet::new();
            for site in crate::parse_weft_probes(bytes).unwrap_or_default() {
                let Some(vaddr) = site.function_vaddr else {
                    continue;
                };
                if site.function.is_empty() || known.contains(&vaddr) || !added.insert(vaddr) {
                    continue;
                }
                raw.push(RawSym {
                    name: site.function,
                    vaddr,
                    size: 0,
                    ifunc: false,
                    from_symtab: true,
                    bind: elf::STB_LOCAL,
                });
            }
        }
        let functions = merge_functions(raw);

        // Dynamic section, interpreter, notes.
        let view = FileView {
            data,
            segments: &segments,
        };
        let interpreter = segments.iter().find(|s| s.kind == elf::PT_INTERP).map(|s| {
            let bytes = &data[s.offset as usize..(s.offset + s.filesz) as usize];
            let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
            String::from_utf8_lossy(&bytes[..end]).into_owned()
        });
        let dynamic = segments
            .iter()
            .find(|s| s.kind == elf::PT_DYNAMIC)
            .map(|s| {
                parse_dynamic(
                    &view,
                    &data[s.offset as usize..(s.offset + s.filesz) as usize],
                )
            })
            .unwrap_or_default();
        let build_id = find_build_id(data, &segments, &sections);

        let kind = if !is_dyn {
            ElfKind::Executable
        } else if dynamic.flags_1 & u64::from(elf::DF_1_PIE) != 0
            || (interpreter.is_some() && dynamic.soname.is_none())
        {
            ElfKind::PieExecutable
        } else {
            ElfKind::SharedLibrary
        };

        let static_relocs = if is_dyn {
            static_relocations(&view, &sections, &dynamic, &dynsyms)
        } else {
            BTreeMap::new()
        };

        let imports = imports(&view, &sections, &dyn_funcs);

        Ok(Parsed {
            kind,
            entry: hdr.e_entry(e),
            segments: segments.clone(),
            sections,
            interpreter,
            needed: dynamic.needed,
            soname: dynamic.soname,
            has_dynamic: segments.iter().any(|s| s.kind == elf::PT_DYNAMIC),
            build_id,
            functions,
            symbols,
            objects,
            static_relocs,
            imports,
        })
    }
}

/// Reads file bytes by virtual address during parsing (before the `ElfFile` exists).
struct FileView<'a> {
    data: &'a [u8],
    segments: &'a [Segment],
}

impl FileView<'_> {
    fn at_vaddr(&self, vaddr: u64, len: u64) -> Option<&[u8]> {
        let end = vaddr.checked_add(len)?;
        let s = self
            .segments
            .iter()
            .filter(|s| s.is_load())
            .find(|s| s.vaddr <= vaddr && end <= s.vaddr + s.filesz)?;
        let start = (s.offset + (vaddr - s.vaddr)) as usize;
        self.data.get(start..start.checked_add(len as usize)?)
    }
}

struct RawSym {
    name: String,
    vaddr: u64,
    size: u64,
    ifunc: bool,
    from_symtab: bool,
    bind: u8,
}

fn merge_functions(raw: Vec<RawSym>) -> Vec<Function> {
    let mut by_addr: BTreeMap<u64, Vec<(usize, RawSym)>> = BTreeMap::new();
    for (order, s) in raw.into_iter().enumerate() {
        by_addr.entry(s.vaddr).or_default().push((order, s));
    }
    by_addr
        .into_iter()
        .map(|(vaddr, mut syms)| {
            let bind_rank = |b: u8| match b {
                elf::STB_GLOBAL => 0,
                elf::STB_WEAK => 1,
                elf::STB_LOCAL => 2,
                _ => 3,
            };
            syms.sort_by_key(|(order, s)| {
                let underscores = s.name.bytes().take_while(|&b| b == b'_').count();
                (!s.from_symtab, bind_rank(s.bind), underscores, *order)
            });
            let mut names: Vec<FunctionName> = Vec::new();
            for (_, s) in &syms {
                if !names.iter().any(|n| n.raw == s.name) {
                    names.push(FunctionName::new(s.name.clone()));
                }
            }
            Function {
                vaddr,
                size: syms.iter().map(|(_, s)| s.size).max().unwrap_or(0),
                names,
                ifunc: syms.iter().any(|(_, s)| s.ifunc),
                in_symtab: syms.iter().any(|(_, s)| s.from_symtab),
                in_dynsym: syms.iter().any(|(_, s)| !s.from_symtab),
            }
        })
        .collect()
}

#[derive(Default)]
struct Dynamic {
    needed: Vec<String>,
    soname: Option<String>,
    flags_1: u64,
    relr: Option<(u64, u64)>,
}

fn parse_dynamic(view: &FileView<'_>, bytes: &[u8]) -> Dynamic {
    let mut needed_offsets = Vec::new();
    let (mut strtab, mut strsz, mut soname_off) = (None, 0u64, None);
    let (mut relr, mut relrsz) = (None, 0u64);
    let mut out = Dynamic::default();
    for entry in bytes.chunks_exact(16) {
        let tag = u64::from_le_bytes(entry[..8].try_into().unwrap_or([0; 8]));
        let val = u64::from_le_bytes(entry[8..].try_into().unwrap_or([0; 8]));
        match tag {
            T_NULL => break,
            T_NEEDED => needed_offsets.push(val),
            T_STRTAB => strtab = Some(val),
            T_STRSZ => strsz = val,
            T_SONAME => soname_off = Some(val),
            T_FLAGS_1 => out.flags_1 = val,
            DT_RELR => relr = Some(val),
            DT_RELRSZ => relrsz = val,
            _ => {}
        }
    }
    out.relr = relr.map(|a| (a, relrsz));
    let Some(strings) = strtab.and_then(|a| view.at_vaddr(a, strsz)) else {
        return out;
    };
    let string_at = |off: u64| -> Option<String> {
        let rest = strings.get(usize::try_from(off).ok()?..)?;
        let end = rest.iter().position(|&b| b == 0)?;
        Some(String::from_utf8_lossy(&rest[..end]).into_owned())
    };
    out.needed = needed_offsets.into_iter().filter_map(string_at).collect();
    out.soname = soname_off.and_then(string_at);
    out
}

/// A note in a `PT_NOTE` segment or `SHT_NOTE` section.
pub(crate) struct Note<'a> {
    pub name: &'a [u8],
    pub kind: u32,
    pub desc: &'a [u8],
}

/// Parses a run of notes (`align` is 4 or 8); stops quietly at the first malformed one.
pub(crate) fn parse_notes(mut data: &[u8], align: u64) -> Vec<Note<'_>> {
    let align = if align == 8 { 8 } else { 4 };
    let pad = |n: usize| n.div_ceil(align) * align;
    let mut out = Vec::new();
    while data.len() >= 12 {
        let word = |i: usize| {
            u32::from_le_bytes([data[i], data[i + 1], data[i + 2], data[i + 3]]) as usize
        };
        let (namesz, descsz, kind) = (word(0), word(4), word(8) as u32);
        let name_start = 12usize;
        let Some(desc_start) = name_start.checked_add(pad(namesz)) else {
            break;
        };
        let Some(next) = desc_start.checked_add(pad(descsz)) else {
            break;
        };
        if desc_start
            .checked_add(descsz)
            .is_none_or(|end| end > data.len())
        {
            break;
        }
        let mut name = &data[name_start..name_start + namesz];
        if let [rest @ .., 0] = name {
            name = rest;
        }
        out.push(Note {
            name,
            kind,
            desc: &data[desc_start..desc_start + descsz],
        });
        data = data.get(next..).unwrap_or(&[]);
    }
    out
}

fn find_build_id(data: &[u8], segments: &[Segment], sections: &[Section]) -> Option<Vec<u8>> {
    let from_segments = segments
        .iter()
        .filter(|s| s.kind == elf::PT_NOTE)
        .map(|s| (s.offset, s.filesz, s.align));
    let from_sections = sections
        .iter()
        .filter(|s| s.kind == elf::SHT_NOTE)
        .map(|s| (s.offset, s.size, 4));
    for (offset, size, align) in from_segments.chain(from_sections) {
        let end = offset.checked_add(size)?;
        let bytes = data.get(usize::try_from(offset).ok()?..usize::try_from(end).ok()?)?;
        for note in parse_notes(bytes, align) {
            if note.name == b"GNU" && note.kind == elf::NT_GNU_BUILD_ID {
                return Some(note.desc.to_vec());
            }
        }
    }
    None
}

/// The functions the file reaches through GOT slots (`R_X86_64_JUMP_SLOT` and
/// `R_X86_64_GLOB_DAT` relocations against function symbols, named from `dyn_funcs`),
/// each with the PLT entry that jumps through its slot. A PLT entry is found by its
/// `jmp qword ptr [rip+disp]` (`ff 25`, maybe after a `bnd` prefix) whose operand is
/// the slot; the entry starts at that jump, or at the `endbr64` just before it.
fn imports(view: &FileView<'_>, sections: &[Section], dyn_funcs: &[Option<String>]) -> Vec<Import> {
    let mut by_slot: BTreeMap<u64, Import> = BTreeMap::new();
    for sec in sections.iter().filter(|s| s.kind == elf::SHT_RELA) {
        let Some(bytes) = view
            .data
            .get(sec.offset as usize..(sec.offset.saturating_add(sec.size)) as usize)
        else {
            continue;
        };
        for r in bytes.chunks_exact(24) {
            let word = |i: usize| u64::from_le_bytes(r[i..i + 8].try_into().unwrap_or([0; 8]));
            let (offset, info) = (word(0), word(8));
            if !matches!(
                (info & 0xffff_ffff) as u32,
                elf::R_X86_64_JUMP_SLOT | elf::R_X86_64_GLOB_DAT
            ) {
                continue;
            }
            if let Some(Some(name)) = dyn_funcs.get((info >> 32) as usize) {
                by_slot.insert(
                    offset,
                    Import {
                        name: name.clone(),
                        slot: offset,
                        plt: None,
                    },
                );
            }
        }
    }
    if by_slot.is_empty() {
        return Vec::new();
    }
    const ENDBR64: [u8; 4] = [0xf3, 0x0f, 0x1e, 0xfa];
    for sec in sections
        .iter()
        .filter(|s| matches!(s.name.as_str(), ".plt" | ".plt.sec" | ".plt.got"))
        .filter(|s| s.kind != elf::SHT_NOBITS)
    {
        let Some(code) = view
            .data
            .get(sec.offset as usize..(sec.offset.saturating_add(sec.size)) as usize)
        else {
            continue;
        };
        for i in 0..code.len().saturating_sub(5) {
            if code[i] != 0xff || code[i + 1] != 0x25 {
                continue;
            }
            let disp = i32::from_le_bytes(code[i + 2..i + 6].try_into().unwrap_or([0; 4]));
            let next = sec.addr + i as u64 + 6;
            let slot = next.wrapping_add(disp as i64 as u64);
            let Some(imp) = by_slot.get_mut(&slot) else {
                continue;
            };
            let jmp = if i > 0 && code[i - 1] == 0xf2 {
                i - 1
            } else {
                i
            };
            let start = if jmp >= 4 && code[jmp - 4..jmp] == ENDBR64 {
                jmp - 4
            } else {
                jmp
            };
            // `.plt.sec` is scanned after `.plt` when it follows it; either way one
            // entry per slot jumps through it.
            imp.plt.get_or_insert(sec.addr + start as u64);
        }
    }
    by_slot.into_values().collect()
}

/// Dynamic relocations whose result is known without loading: `R_X86_64_RELATIVE`
/// (the addend), `R_X86_64_64` against a defined dynamic symbol (its value plus the
/// addend), and `.relr.dyn` entries (the word in the file). Values are at bias 0.
fn static_relocations(
    view: &FileView<'_>,
    sections: &[Section],
    dynamic: &Dynamic,
    dynsyms: &[u64],
) -> BTreeMap<u64, u64> {
    let mut out = BTreeMap::new();
    for sec in sections.iter().filter(|s| s.kind == elf::SHT_RELA) {
        let Some(bytes) = view
            .data
            .get(sec.offset as usize..(sec.offset + sec.size) as usize)
        else {
            continue;
        };
        for r in bytes.chunks_exact(24) {
            let word = |i: usize| u64::from_le_bytes(r[i..i + 8].try_into().unwrap_or([0; 8]));
            let (offset, info, addend) = (word(0), word(8), word(16));
            match (info & 0xffff_ffff) as u32 {
                elf::R_X86_64_RELATIVE => {
                    out.insert(offset, addend);
                }
                elf::R_X86_64_64 => {
                    if let Some(&v) = dynsyms.get((info >> 32) as usize) {
                        if v != 0 {
                            out.insert(offset, v.wrapping_add(addend));
                        }
                    }
                }
                _ => {}
            }
        }
    }
    let relr = sections
        .iter()
        .find(|s| s.kind == elf::SHT_RELR)
        .and_then(|s| {
            view.data
                .get(s.offset as usize..(s.offset + s.size) as usize)
        })
        .or_else(|| dynamic.relr.and_then(|(a, n)| view.at_vaddr(a, n)));
    if let Some(relr) = relr {
        let mut base = 0u64;
        let apply = |at: u64, out: &mut BTreeMap<u64, u64>| {
            if let Some(w) = view.at_vaddr(at, 8) {
                out.insert(at, u64::from_le_bytes(w.try_into().unwrap_or([0; 8])));
            }
        };
        for w in relr.chunks_exact(8) {
            let entry = u64::from_le_bytes(w.try_into().unwrap_or([0; 8]));
            if entry & 1 == 0 {
                apply(entry, &mut out);
                base = entry.wrapping_add(8);
            } else {
                for bit in 1..64 {
                    if entry >> bit & 1 == 1 {
                        apply(base.wrapping_add((bit - 1) * 8), &mut out);
                    }
                }
                base = base.wrapping_add(63 * 8);
            }
        }
    }
    out
}

fn machine_name(m: u16) -> String {
    match m {
        elf::EM_386 => "i386".into(),
        elf::EM_ARM => "ARM".into(),
        elf::EM_AARCH64 => "AArch64".into(),
        elf::EM_RISCV => "RISC-V".into(),
        elf::EM_PPC64 => "PowerPC64".into(),
        elf::EM_S390 => "s390".into(),
        elf::EM_MIPS => "MIPS".into(),
        elf::EM_LOONGARCH => "LoongArch".into(),
        other => format!("machine type {other}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notes_parse_and_stop_on_garbage() {
        let mut n = Vec::new();
        n.extend_from_slice(&4u32.to_le_bytes());
        n.extend_from_slice(&3u32.to_le_bytes());
        n.extend_from_slice(&3u32.to_le_bytes());
        n.extend_from_slice(b"GNU\0");
        n.extend_from_slice(&[1, 2, 3, 0]);
        n.extend_from_slice(&[0xff; 12]);
        let notes = parse_notes(&n, 4);
        assert_eq!(notes.len(), 1);
        assert_eq!(notes[0].name, b"GNU");
        assert_eq!(notes[0].desc, &[1, 2, 3]);
    }

    #[test]
    fn demangles_cpp_names() {
        let (full, base) = demangle("_ZN3foo3barEi").unwrap();
        assert_eq!(full, "foo::bar(int)");
        assert_eq!(base, "foo::bar");
        assert!(demangle("main").is_none());
        assert!(demangle("_Zgarbage").is_none());
        // Rust, legacy and v0: the path, without the hash.
        let legacy = "_ZN5rsapp6worker4step17h0123456789abcdefE";
        assert_eq!(
            demangle(legacy).unwrap(),
            (
                "rsapp::worker::step".to_string(),
                "rsapp::worker::step".to_string()
            )
        );
        assert_eq!(
            demangle("_RNvNtCs1234_5rsapp6worker4step").unwrap().0,
            "rsapp::worker::step"
        );
    }

    #[test]
    fn not_elf_and_short_inputs() {
        for data in [&b""[..], b"hello", b"\x7fELF", b"\x7fELF\x02\x01\x01"] {
            let e = ElfFile::parse("/x", data.to_vec()).unwrap_err();
            assert!(
                matches!(e, Error::NotElf { .. } | Error::Malformed { .. }),
                "{e}"
            );
        }
        let mut h = vec![0u8; 64];
        h[..4].copy_from_slice(b"\x7fELF");
        h[4] = 1;
        h[5] = 1;
        assert_eq!(
            ElfFile::parse("/x", h.clone()).unwrap_err().to_string(),
            "`/x` is a 32-bit ELF file; weft supports only 64-bit x86-64 programs"
        );
        h[4] = 2;
        h[5] = 2;
        assert!(matches!(
            ElfFile::parse("/x", h).unwrap_err(),
            Error::BigEndian { .. }
        ));
    }
}
