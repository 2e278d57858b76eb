//! ColdPatch (iProbe, seed 004 §II-A): prepare a binary built with
//! `-finstrument-functions` for hot patching.
//!
//! [`coldpatch`] takes the bytes of an x86-64 ELF executable or shared library and
//! returns new bytes in which
//!
//! 1. every `call __cyg_profile_func_enter` / `call __cyg_profile_func_exit` — direct
//!    (`call rel32` to the PLT stub or to a definition in the file) or through the GOT
//!    (`call *slot(%rip)`, `-fno-plt`) — is replaced by one NOP of exactly its length
//!    (5 bytes: `0f 1f 44 00 00`; 6 bytes: `66 0f 1f 44 00 00`), and a tail call
//!    (`jmp` to `__cyg_profile_func_exit`, which -O2 emits at the end of void
//!    functions) by `ret` and a NOP (`c3 0f 1f 40 00`; `c3 0f 1f 44 00 00`), so that the
//!    program runs exactly as before minus the instrumentation calls;
//! 2. the probe list — each placeholder's address, entry or exit, the instrumented
//!    function and `file:line` from DWARF — is added as the non-allocated section
//!    `.weft.probes` (format: [`format`]; reader: `weft_symbols::ElfFile::weft_probes`),
//!    so that it travels with the binary;
//! 3. optionally ([`Options::strip`]) `.symtab` and its string table are removed,
//!    as iProbe's optional strip (the probe list keeps the function names).
//!
//! Finding the calls: the instrumentation functions' definitions, PLT stubs and GOT
//! slots are found from the symbol tables, the dynamic relocations and the PLT
//! sections' code; then every function (`.symtab`) is decoded with iced-x86 from its
//! first byte, so only real instruction boundaries are considered. `this_fn` (the
//! function an entry or exit belongs to; with inlining, not always the function the
//! call sits in) is read off the instructions that load `%rdi` before the call.
//!
//! Nothing else changes: no loaded byte moves or changes apart from the placeholders
//! and the ELF header's section table fields; [`coldpatch`] checks this on its own
//! output before returning it. Pure: bytes in, bytes out, no IO.

pub mod format;
mod scan;
mod write;

use std::fmt;
use std::path::{Path, PathBuf};

use weft_symbols::{ElfFile, WeftProbeKind, WeftProbeSite};

/// What to do besides placing the placeholders.
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// Remove `.symtab` and the string table it uses.
    pub strip: bool,
}

/// The result of a successful coldpatch.
#[derive(Clone, Debug)]
pub struct ColdPatched {
    /// The output file.
    pub bytes: Vec<u8>,
    /// The probe list written to `.weft.probes`, by address.
    pub probes: Vec<WeftProbeSite>,
    /// References to the instrumentation functions left as they were, with reasons.
    pub skipped: Vec<Skipped>,
    /// Names of the sections removed by [`Options::strip`].
    pub stripped: Vec<String>,
    /// Why the probe list has no `file:line`s, when the file has DWARF that could not
    /// be read (`None` also when it has no DWARF at all).
    pub debug_info_error: Option<String>,
}

impl ColdPatched {
    /// Number of distinct instrumented functions in the probe list.
    pub fn function_count(&self) -> usize {
        let mut names: Vec<&str> = self.probes.iter().map(|p| p.function.as_str()).collect();
        names.sort_unstable();
        names.dedup();
        names.len()
    }
}

/// A reference to an instrumentation function that did not become a placeholder.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Skipped {
    pub vaddr: u64,
    /// The function holding it.
    pub function: String,
    pub reason: SkipReason,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SkipReason {
    /// A conditional jump to `__cyg_profile_func_exit` (a conditional tail call):
    /// there is no placeholder that keeps both paths.
    ConditionalJump,
    /// The function's or its GOT slot's address is used by something other than a
    /// call or jump (loaded into a register, compared, ...).
    OtherUse,
    /// A call of a length with no placeholder (not 5..=9 bytes).
    UnusualLength(u8),
    /// iced-x86 cannot decode the function's bytes from here on (data in code?); the
    /// rest of the function was not searched.
    Undecodable,
}

impl fmt::Display for SkipReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SkipReason::ConditionalJump => write!(f, "a conditional jump to the instrumentation function"),
            SkipReason::OtherUse => write!(f, "a use of the instrumentation function's address other than a call"),
            SkipReason::UnusualLength(n) => write!(f, "a {n}-byte call, too long for a placeholder"),
            SkipReason::Undecodable => write!(f, "bytes that do not decode as instructions; the rest of the function was not searched"),
        }
    }
}

impl fmt::Display for Skipped {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#x} in {}: {}", self.vaddr, self.function, self.reason)
    }
}

/// Why nothing was produced. Messages are one line, for the user.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Not an ELF file, not x86-64, truncated, ... (the message says which).
    #[error(transparent)]
    Elf(#[from] weft_symbols::Error),

    #[error("no -finstrument-functions calls found in {}; nothing written", path.display())]
    NoCalls { path: PathBuf },

    #[error("{} is already coldpatched (it has a .weft.probes section); nothing written", path.display())]
    AlreadyColdpatched { path: PathBuf },

    #[error(
        "{} has no symbol table (.symtab), so its functions cannot be found; coldpatch it before stripping it (`weft coldpatch --strip` strips it afterwards)",
        path.display()
    )]
    NoSymbols { path: PathBuf },

    /// Both instrumentation functions are one definition (statically linked glibc
    /// aliases them), so entry calls and exit calls look the same. weft does not
    /// trace static executables anyway.
    #[error(
        "__cyg_profile_func_enter and __cyg_profile_func_exit are one function in {} (statically linked?), so entries and exits cannot be told apart; nothing written",
        path.display()
    )]
    AliasedHooks { path: PathBuf },

    /// The section table cannot be rewritten (unusual layouts).
    #[error("cannot add the probe list to {}: {why}", path.display())]
    Unsupported { path: PathBuf, why: String },

    /// The output failed coldpatch's own checks (a bug: please report it).
    #[error("internal error coldpatching {}: {why}; nothing written", path.display())]
    Internal { path: PathBuf, why: String },
}

/// Coldpatches the ELF file `input`; `path` names it in messages.
pub fn coldpatch(path: &Path, input: &[u8], options: &Options) -> Result<ColdPatched, Error> {
    let elf = ElfFile::parse(path, input.to_vec())?;
    if elf.section(format::SECTION).is_some() {
        return Err(Error::AlreadyColdpatched { path: path.into() });
    }
    let targets = scan::Targets::find(&elf);
    if targets.is_empty() {
        return Err(Error::NoCalls { path: path.into() });
    }
    if targets.aliased.is_some() {
        return Err(Error::AliasedHooks { path: path.into() });
    }
    if elf.is_stripped() {
        return Err(Error::NoSymbols { path: path.into() });
    }
    let (calls, skipped) = scan::scan(&elf, &targets);
    if calls.is_empty() {
        return Err(Error::NoCalls { path: path.into() });
    }

    let (debug, debug_info_error) = match elf.debug_info() {
        Ok(d) => (d, None),
        Err(e) => (None, Some(e.to_string())),
    };
    let mut patched = input.to_vec();
    let mut probes = Vec::with_capacity(calls.len());
    for call in calls.values() {
        let internal = |why: String| Error::Internal {
            path: path.into(),
            why,
        };
        let placeholder = format::placeholder(call.len, call.tail)
            .ok_or_else(|| internal(format!("no placeholder for {} bytes", call.len)))?;
        let off = elf
            .vaddr_to_file_offset(call.vaddr)
            .ok_or_else(|| internal(format!("{:#x} is not in the file", call.vaddr)))?
            as usize;
        patched[off..off + call.len].copy_from_slice(&placeholder);

        let this_fn = call
            .this_fn
            .and_then(|a| elf.functions().binary_search_by_key(&a, |f| f.vaddr).ok())
            .map(|i| &elf.functions()[i]);
        let (function, function_vaddr, inlined) = match this_fn {
            Some(f) => {
                let inside = call.vaddr >= f.vaddr && call.vaddr - f.vaddr < f.size.max(1);
                (f.name().to_string(), Some(f.vaddr), !inside)
            }
            None => {
                let holder = elf.function_at(call.container);
                (holder.map_or("?", |f| f.name()).to_string(), None, false)
            }
        };
        let location = debug
            .as_ref()
            .and_then(|d| d.line_for(call.vaddr))
            .map(|(file, line)| format!("{file}:{line}"));
        probes.push(WeftProbeSite {
            vaddr: call.vaddr,
            kind: call.kind,
            function,
            function_vaddr,
            location,
            len: call.len as u8,
            tail: call.tail,
            inlined,
        });
    }
    drop(debug);

    let section = format::encode(&probes);
    let written = write::append_section(input, patched, format::SECTION, &section, options.strip)
        .map_err(|why| Error::Unsupported {
        path: path.into(),
        why,
    })?;
    verify(path, &elf, &written.bytes, &probes)?;
    Ok(ColdPatched {
        bytes: written.bytes,
        probes,
        skipped,
        stripped: written.stripped,
        debug_info_error,
    })
}

/// Checks the output: it parses, its probe list reads back as written, and every
/// loaded byte equals the input's except the placeholders and the ELF header's
/// `e_shoff`, `e_shnum` and `e_shstrndx`.
fn verify(
    path: &Path,
    input: &ElfFile,
    output: &[u8],
    probes: &[WeftProbeSite],
) -> Result<(), Error> {
    let internal = |why: String| Error::Internal {
        path: path.into(),
        why,
    };
    let out = ElfFile::parse(path, output.to_vec())
        .map_err(|e| internal(format!("the output does not parse: {e}")))?;
    let read_back = out.weft_probes().map_err(|e| internal(e.to_string()))?;
    if read_back != probes {
        return Err(internal(
            "the probe list does not read back as written".into(),
        ));
    }
    let mut allowed: Vec<(usize, usize)> = vec![(0x28, 0x30), (0x3c, 0x40)];
    for p in probes {
        let off = input.vaddr_to_file_offset(p.vaddr).unwrap_or(0) as usize;
        allowed.push((off, off + usize::from(p.len)));
    }
    allowed.sort_unstable();
    let is_allowed = |at: usize| {
        let i = allowed.partition_point(|&(lo, _)| lo <= at);
        i > 0 && at < allowed[i - 1].1
    };
    let data = input.data();
    for seg in input.segments().iter().filter(|s| s.is_load()) {
        let (start, end) = (seg.offset as usize, (seg.offset + seg.filesz) as usize);
        let (Some(a), Some(b)) = (data.get(start..end), output.get(start..end)) else {
            return Err(internal(
                "a loaded segment is missing from the output".into(),
            ));
        };
        for (i, (x, y)) in a.iter().zip(b).enumerate() {
            let at = start + i;
            if x != y && !is_allowed(at) {
                return Err(internal(format!(
                    "loaded byte at file offset {at:#x} changed"
                )));
            }
        }
    }
    if out.segments() != input.segments() {
        return Err(internal("the program headers changed".into()));
    }
    Ok(())
}

/// Entry or exit, for messages.
pub fn kind_name(kind: WeftProbeKind) -> &'static str {
    match kind {
        WeftProbeKind::Entry => "entry",
        WeftProbeKind::Exit => "exit",
        WeftProbeKind::EntryStub => "entry-stub",
    }
}
