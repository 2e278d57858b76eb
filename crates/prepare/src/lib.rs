//! `weft prepare` (iProbe, seed 004 §II-D, static binary rewriting mode): give a
//! binary built with no instrumentation flag the placeholders `weft coldpatch` gives
//! `-finstrument-functions` builds, offline.
//!
//! For each selected function whose prologue can move ([`prepare`] says which cannot
//! and why), the first instructions after any `endbr64` — whole instructions, at least
//! 5 bytes — are replaced by `jmp rel32` to a stub (the rest of those bytes become
//! `int3`), and the stub, in a new executable segment appended to the file, is
//!
//! ```text
//! stub:  nopl 0x0(%rax,%rax,1)      ; the placeholder (5 bytes)
//!        <the displaced prologue, relocated by iced-x86's BlockEncoder>
//!        jmp <first byte after the displaced ones>
//! ```
//!
//! Each placeholder goes into the `.weft.probes` list (coldpatch's format) as kind
//! `EntryStub`, with the function's real address and name. The engine weaves a probe
//! there with one 5-byte write over the NOP, no decoding or relocation at run time,
//! and the machine state at the placeholder is the function's entry state (arguments
//! in their registers, the return address at `[rsp]`).
//!
//! Returns get no placeholder: one before each `ret` would mean moving the whole
//! function. Return probes use the engine's return-address hijack at the real entry
//! (which now holds the jump to the stub; the engine relocates that jump like any
//! instruction).
//!
//! A function is prepared only when the planner's jump plan for its entry holds
//! (`weft_x86::plan_site`: whole instructions, none of its own branches or
//! `[rip+disp]` operands into the displaced bytes, relocatable) and, because the
//! change is permanent, when nothing else in the file names a byte inside them either
//! ([`refs`]), and no `call` is displaced (its return address would be in the stub,
//! where no unwind table reaches, and the emulated call breaks CET shadow stacks).
//!
//! Pure: bytes in, bytes out. [`prepare`] checks its own output before returning it.

mod refs;
mod write;

use std::fmt;
use std::path::{Path, PathBuf};

use weft_symbols::{ElfFile, WeftProbeKind, WeftProbeSite};
use weft_x86::{FunctionCode, SitePlan};

/// What to prepare.
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// Only functions whose name matches this wildcard pattern (raw or demangled).
    pub functions: Option<String>,
}

/// The result of a successful prepare.
#[derive(Clone, Debug)]
pub struct Prepared {
    /// The output file.
    pub bytes: Vec<u8>,
    /// The probe list written to `.weft.probes`, by address (one per prepared function).
    pub probes: Vec<WeftProbeSite>,
    /// Selected functions left as they were, with the reason, by address.
    pub skipped: Vec<Skipped>,
    /// The functions came from `.dynsym` alone (the file has no `.symtab`).
    pub dynsym_only: bool,
    /// Address and size of the stub segment.
    pub stubs: (u64, u64),
}

/// A selected function that was not prepared.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Skipped {
    pub vaddr: u64,
    pub function: String,
    pub reason: String,
}

impl fmt::Display for Skipped {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({:#x}): {}", self.function, self.vaddr, self.reason)
    }
}

/// Why nothing was produced. Messages are one line, for the user.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Not an ELF file, not x86-64, truncated, ... (the message says which).
    #[error(transparent)]
    Elf(#[from] weft_symbols::Error),

    #[error("{} is already prepared by weft prepare (it has a .weft.probes list of stub placeholders); nothing written", path.display())]
    AlreadyPrepared { path: PathBuf },

    #[error("{} is coldpatched (it has a .weft.probes section): its placeholders are already there; nothing written", path.display())]
    Coldpatched { path: PathBuf },

    #[error("{} is statically linked; weft traces dynamically linked programs and libraries only; nothing written", path.display())]
    Static { path: PathBuf },

    #[error("{} is stripped beyond .dynsym: no .symtab and no function in .dynsym, so no function can be found; prepare it before stripping it", path.display())]
    NoFunctions { path: PathBuf },

    #[error("no function of {} matches `{pattern}`{}", path.display(), if *dynsym_only { " (it is stripped: only its .dynsym functions are known)" } else { "" })]
    NoMatch {
        path: PathBuf,
        pattern: String,
        dynsym_only: bool,
    },

    #[error("none of the {selected} selected functions of {} can be prepared safely (run with -v for the reasons); nothing written", path.display())]
    NothingPreparable { path: PathBuf, selected: usize },

    /// The file's layout cannot be extended (unusual layouts).
    #[error("cannot add a segment to {}: {why}", path.display())]
    Unsupported { path: PathBuf, why: String },

    /// The output failed prepare's own checks (a bug: please report it).
    #[error("internal error preparing {}: {why}; nothing written", path.display())]
    Internal { path: PathBuf, why: String },
}

/// The placeholder at the head of each stub: `nopl 0x0(%rax,%rax,1)`.
pub const PLACEHOLDER: [u8; 5] = [0x0f, 0x1f, 0x44, 0x00, 0x00];
const STUB_ALIGN: usize = 16;

/// A function that will be prepared.
struct Chosen {
    vaddr: u64,
    name: String,
    plan: SitePlan,
}

/// Prepares the ELF file `input`; `path` names it in messages.
pub fn prepare(path: &Path, input: &[u8], options: &Options) -> Result<Prepared, Error> {
    let elf = ElfFile::parse(path, input.to_vec())?;
    if elf.section(weft_coldpatch::format::SECTION).is_some() {
        let stubbed = elf
            .weft_probes()
            .map(|l| l.iter().any(|p| p.kind == WeftProbeKind::EntryStub))
            .unwrap_or(false);
        return Err(if stubbed || elf.section(".weft.text").is_some() {
            Error::AlreadyPrepared { path: path.into() }
        } else {
            Error::Coldpatched { path: path.into() }
        });
    }
    if elf.is_static() || !elf.has_dynamic_section() {
        return Err(Error::Static { path: path.into() });
    }
    let dynsym_only = elf.is_stripped();
    if elf.functions().iter().all(|f| f.size == 0) {
        return Err(Error::NoFunctions { path: path.into() });
    }
    let glob = options
        .functions
        .as_deref()
        .map(weft_symbols::glob::Glob::new);
    let selected: Vec<&weft_symbols::Function> = elf
        .functions()
        .iter()
        .filter(|f| {
            glob.as_ref().is_none_or(|g| {
                f.names
                    .iter()
                    .any(|n| n.forms().any(|form| g.matches(form)))
            })
        })
        .collect();
    if selected.is_empty() {
        return Err(Error::NoMatch {
            path: path.into(),
            pattern: options.functions.clone().unwrap_or_default(),
            dynsym_only,
        });
    }

    let refs = refs::collect(&elf);
    let exec_segments: Vec<(u64, u64)> = elf
        .segments()
        .iter()
        .filter(|s| s.is_load() && s.flags & 1 != 0)
        .map(|s| (s.vaddr, s.vaddr + s.filesz))
        .collect();
    let starts: Vec<u64> = elf.functions().iter().map(|f| f.vaddr).collect();
    let pinned: Vec<u64> = elf
        .usdt_probes()
        .iter()
        .map(|p| p.pc)
        .chain(elf.patchable_function_entries())
        .chain(elf.mcount_locations())
        .collect();
    let mut chosen = Vec::new();
    let mut skipped = Vec::new();
    let mut claimed: Vec<(u64, u64)> = Vec::new();
    for f in &selected {
        let skip = |reason: String| Skipped {
            vaddr: f.vaddr,
            function: f.name().to_string(),
            reason,
        };
        match choose(&elf, f, &refs, &exec_segments, &starts, &pinned) {
            Ok(plan) => {
                let (lo, hi) = plan_range(&plan);
                if claimed.iter().any(|&(a, b)| lo < b && a < hi) {
                    skipped.push(skip(
                        "its prologue overlaps another prepared function's".into(),
                    ));
                    continue;
                }
                claimed.push((lo, hi));
                chosen.push(Chosen {
                    vaddr: f.vaddr,
                    name: f.name().to_string(),
                    plan,
                });
            }
            Err(reason) => skipped.push(skip(reason)),
        }
    }
    if chosen.is_empty() {
        return Err(Error::NothingPreparable {
            path: path.into(),
            selected: selected.len(),
        });
    }

    let unsupported = |why: String| Error::Unsupported {
        path: path.into(),
        why,
    };
    let internal = |why: String| Error::Internal {
        path: path.into(),
        why,
    };
    let layout = write::layout(input).map_err(unsupported)?;
    let (debug, _) = match elf.debug_info() {
        Ok(d) => (d, None::<String>),
        Err(e) => (None, Some(e.to_string())),
    };

    // Stubs, and the jumps to them.
    let mut stubs = Vec::new();
    let mut patched = input.to_vec();
    let mut probes = Vec::with_capacity(chosen.len());
    for c in &chosen {
        while stubs.len() % STUB_ALIGN != 0 {
            stubs.push(weft_x86::INT3);
        }
        let at = layout.stub_vaddr + stubs.len() as u64;
        let body = weft_x86::relocate(&c.plan, at + PLACEHOLDER.len() as u64, true)
            .map_err(|e| internal(format!("{}: relocating the prologue: {e}", c.name)))?;
        let jump = weft_x86::patch_bytes(&c.plan, at)
            .map_err(|e| internal(format!("{}: the jump to its stub: {e}", c.name)))?;
        let patch_addr = c.plan.patch_addr().unwrap_or(c.vaddr);
        let off = elf
            .vaddr_to_file_offset(patch_addr)
            .ok_or_else(|| internal(format!("{patch_addr:#x} is not in the file")))?
            as usize;
        patched[off..off + jump.len()].copy_from_slice(&jump);
        stubs.extend_from_slice(&PLACEHOLDER);
        stubs.extend_from_slice(&body);
        let location = debug
            .as_ref()
            .and_then(|d| d.line_for(c.vaddr))
            .map(|(file, line)| format!("{file}:{line}"));
        probes.push(WeftProbeSite {
            vaddr: at,
            kind: WeftProbeKind::EntryStub,
            function: c.name.clone(),
            function_vaddr: Some(c.vaddr),
            location,
            len: PLACEHOLDER.len() as u8,
            tail: false,
            inlined: false,
        });
    }
    drop(debug);
    let list = weft_coldpatch::format::encode(&probes);
    let bytes = write::write(&patched, &layout, &stubs, &list).map_err(unsupported)?;
    verify(path, &elf, &bytes, &probes, &chosen, &layout).map_err(internal)?;
    skipped.sort_by_key(|s| s.vaddr);
    Ok(Prepared {
        bytes,
        probes,
        skipped,
        dynsym_only,
        stubs: (layout.stub_vaddr, stubs.len() as u64),
    })
}

/// The bytes a plan replaces.
fn plan_range(plan: &SitePlan) -> (u64, u64) {
    match plan {
        SitePlan::Jump {
            patch_addr,
            displaced_len,
            ..
        } => (*patch_addr, patch_addr + *displaced_len as u64),
        _ => (0, 0),
    }
}

/// The jump plan for `f`'s entry, or why it cannot be prepared.
fn choose(
    elf: &ElfFile,
    f: &weft_symbols::Function,
    refs: &refs::Refs,
    exec: &[(u64, u64)],
    starts: &[u64],
    pinned: &[u64],
) -> Result<SitePlan, String> {
    if f.size == 0 {
        return Err("its symbol has no size".into());
    }
    if f.ifunc {
        return Err("an IFUNC resolver".into());
    }
    // The entry point is jumped to with argc, not a return address, at the top of
    // the stack. The engine sees that it never returns only while its own code is
    // there to read (moved to a stub, a return probe would hijack argc).
    if f.vaddr == elf.entry() && elf.kind() != weft_symbols::ElfKind::SharedLibrary {
        return Err("the program's entry point (no return address on its stack)".into());
    }
    if !exec
        .iter()
        .any(|&(lo, hi)| lo <= f.vaddr && f.vaddr + f.size <= hi)
    {
        return Err("not in an executable segment".into());
    }
    let bytes = elf
        .read_vaddr(f.vaddr, f.size)
        .map_err(|e| e.to_string())?
        .to_vec();
    // Alignment filler up to the next function (the planner uses it only when it
    // decodes as NOP/INT3 and the function is too short for a jump).
    let end = f.vaddr + f.size;
    let next = starts
        .get(starts.partition_point(|&s| s <= f.vaddr))
        .copied()
        .unwrap_or(end);
    let pad_len = next.saturating_sub(end).min(64);
    let padding = if pad_len > 0
        && exec
            .iter()
            .any(|&(lo, hi)| lo <= end && end + pad_len <= hi)
    {
        elf.read_vaddr(end, pad_len)
            .map(<[u8]>::to_vec)
            .unwrap_or_default()
    } else {
        Vec::new()
    };
    let code = FunctionCode {
        addr: f.vaddr,
        bytes,
        size_known: true,
        padding,
    };
    let plan = weft_x86::plan_site(&code, f.vaddr);
    if let Some(reason) = plan.reason() {
        return Err(reason.to_string());
    }
    let SitePlan::Jump {
        patch_addr,
        displaced_len,
        ref displaced,
        padding,
        ..
    } = plan
    else {
        return Err("no jump plan".into());
    };
    let (lo, hi) = (patch_addr, patch_addr + displaced_len as u64);
    if plan.is_placeholder() {
        return Err(
            "its first instructions are NOPs (a patchable entry, fentry or USDT site): the engine weaves there without moving anything"
                .into(),
        );
    }
    // Probe points other tools know by address must stay where they are.
    if let Some(&at) = pinned.iter().find(|&&a| lo <= a && a < hi) {
        return Err(format!(
            "a USDT or patchable-entry site at {at:#x} is among the bytes a jump would replace"
        ));
    }
    // A displaced call would return into the stub.
    let code_len = displaced_len - padding;
    let mut d = iced_x86::Decoder::with_ip(
        64,
        &displaced[..code_len],
        patch_addr,
        iced_x86::DecoderOptions::NONE,
    );
    while d.can_decode() {
        let insn = d.decode();
        if insn.is_call_near() || insn.is_call_near_indirect() || insn.is_call_far() {
            return Err(format!(
                "a call at {:#x} is among the first {} bytes (its return address would be in the stub)",
                insn.ip(),
                displaced_len
            ));
        }
    }
    // A function that never returns (no `ret`, no jump out: `_start`, a signal
    // restorer, `abort`-like ones) may be entered with no return address on its
    // stack. The engine reads that off its code and sets no return probe there;
    // moved to a stub, the code would no longer show it, and a return probe would
    // overwrite what lies at the top of the stack.
    if weft_x86::return_sites(&code, &plan, &[])
        .is_ok_and(|r| r.sites.is_empty() && r.in_entry.is_none())
    {
        return Err(
            "it never returns (no exit): a return probe needs its own code to see that".into(),
        );
    }
    if let Some(at) = refs.written_in(lo.saturating_sub(7), hi) {
        return Err(format!(
            "a dynamic relocation writes at {at:#x}, over the bytes a jump would replace"
        ));
    }
    if let Some(r) = refs.inside(patch_addr, patch_addr + displaced_len as u64) {
        return Err(format!(
            "something in the file refers to {r:#x}, inside the {displaced_len} bytes a jump would replace"
        ));
    }
    Ok(plan)
}

/// Checks the output: it parses with the new segment, the probe list reads back, each
/// entry jumps to its stub, and every loaded byte of the input is unchanged apart from
/// the displaced prologues.
fn verify(
    path: &Path,
    input: &ElfFile,
    output: &[u8],
    probes: &[WeftProbeSite],
    chosen: &[Chosen],
    layout: &write::Layout,
) -> Result<(), String> {
    let out = ElfFile::parse(path, output.to_vec())
        .map_err(|e| format!("the output does not parse: {e}"))?;
    let read_back = out.weft_probes().map_err(|e| e.to_string())?;
    if read_back != probes {
        return Err("the probe list does not read back as written".into());
    }
    let new_loads: Vec<_> = out
        .segments()
        .iter()
        .filter(|s| s.is_load() && s.vaddr >= layout.phdr_vaddr)
        .collect();
    if new_loads.len() != 2 || new_loads[1].vaddr != layout.stub_vaddr {
        return Err("the new segments are not where they were put".into());
    }
    // The ELF header's e_phoff, e_shoff, e_phnum, e_shnum.
    let mut allowed: Vec<(usize, usize)> = vec![(0x20, 0x30), (0x38, 0x3a), (0x3c, 0x3e)];
    for (c, p) in chosen.iter().zip(probes) {
        let (lo, hi) = plan_range(&c.plan);
        let jump = out
            .read_vaddr(lo, 5)
            .map_err(|e| format!("{}: {e}", c.name))?;
        let rel = i32::from_le_bytes([jump[1], jump[2], jump[3], jump[4]]);
        if jump[0] != 0xe9 || (lo + 5).wrapping_add(rel as i64 as u64) != p.vaddr {
            return Err(format!("{} does not jump to its stub", c.name));
        }
        if out.read_vaddr(p.vaddr, 5).ok() != Some(&PLACEHOLDER[..]) {
            return Err(format!(
                "{}'s stub does not start with the placeholder",
                c.name
            ));
        }
        let off = input.vaddr_to_file_offset(lo).unwrap_or(0) as usize;
        allowed.push((off, off + (hi - lo) as usize));
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
            return Err("a loaded segment is missing from the output".into());
        };
        if let Some(i) = a
            .iter()
            .zip(b)
            .enumerate()
            .position(|(i, (x, y))| x != y && !is_allowed(start + i))
        {
            return Err(format!(
                "loaded byte at file offset {:#x} changed",
                start + i
            ));
        }
    }
    Ok(())
}
