//! ELF and DWARF for weft: from a probe spec (`uprobe:libc:mall*`) to resolved sites.
//!
//! The path through this crate, in pipeline order:
//!
//! 1. **Where** — [`ProcMaps`] reads `/proc/PID/maps`; [`ProcMaps::modules`] gives each
//!    mapped ELF file as a [`Module`] with its load bias. [`resolve_target`] turns the
//!    `BIN` of a spec (a path, or a library name like `libc`) into a file, against a
//!    process's modules or, without one, the executable's `DT_NEEDED`,
//!    `/etc/ld.so.cache` and the library directories.
//! 2. **What** — [`ElfFile`] validates a file and knows its functions (`.symtab` and
//!    `.dynsym`, merged by address, C++ names demangled), its bytes by address, its
//!    USDT probes ([`ElfFile::usdt_probes`]), compiler placeholders
//!    ([`ElfFile::patchable_function_entries`], [`ElfFile::mcount_locations`]) and the
//!    probe list `weft coldpatch` leaves ([`ElfFile::weft_probes`]).
//! 3. **Which** — [`resolve`] matches a [`glob`] pattern against function names and
//!    returns [`ResolvedFunction`]s: file address, size, runtime address and the
//!    function's bytes (what `weft-x86` plans a patch from). A miss is an error with
//!    "did you mean" suggestions. [`resolve_usdt`] does the same for USDT probes.
//! 4. **Printing** — [`Symbolizer`] turns addresses back into `function+offset` for
//!    `usym`/`ustack`/`func`; [`list`] produces `weft -l` lines;
//!    [`ElfFile::debug_info`] gives DWARF parameter types (for `args`) and lines,
//!    from the file, its separate debug file ([`DebugSearch`]) or split DWARF.
//!
//! Parsing is pure (bytes in, values out: [`ElfFile::parse`], [`ProcMaps::parse`],
//! [`load_bias`], [`parse_stapsdt_notes`], [`parse_arg`], [`parse_ld_so_cache`],
//! [`parse_weft_probes`]);
//! the functions that read `/proc` or the file system are thin layers over them.
//! Malformed input of any kind is an [`Error`] with a one-line message for the user,
//! never a panic.
//!
//! Addresses: a *vaddr* is a file virtual address (`st_value`); a *runtime address*
//! is `vaddr + load bias` in one process.

mod debugfile;
mod dwarf;
mod elf;
mod error;
pub mod glob;
mod maps;
mod probelist;
mod resolve;
mod srcline;
mod symbolize;
mod target;
mod unwind;
mod usdt;

pub use debugfile::{DebugSearch, MissingDwo, DEFAULT_DEBUG_DIR};
pub use dwarf::{DebugInfo, LocalVariable, Param, SourceFrame, ARRAY_ELEMENT};
pub use elf::{demangle, ElfFile, ElfKind, Function, FunctionName, Import, Section, Segment};
pub use error::{Error, Result};
pub use maps::{find_module, load_bias, MappedFile, Mapping, Module, Perms, ProcMaps};
pub use probelist::{parse_weft_probes, WeftProbeKind, WeftProbeSite, WEFT_PROBES_SECTION};
pub use resolve::{
    list, list_lines, match_functions, resolve, resolve_in_module, resolve_line, resolve_usdt,
    ListSource, ResolvedFunction,
};
pub use srcline::LineMiss;
pub use symbolize::{Symbol, Symbolizer};
pub use target::{
    library_name_matches, parse_ld_so_cache, resolve_target, LibrarySearch, Target, TargetContext,
    STANDARD_LIBRARY_DIRS,
};
pub use unwind::{CfaBase, CfiRow, Frame, FrameTable};
pub use usdt::{parse_arg, parse_stapsdt_notes, register, ArgKind, ArgLoc, Register, UsdtProbe};
