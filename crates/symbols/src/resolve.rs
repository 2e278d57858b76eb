//! From a function pattern to probe sites, and `weft -l` listings.

use std::path::{Path, PathBuf};

use crate::elf::{ElfFile, Function, FunctionName};
use crate::error::{Error, Result};
use crate::glob::{suggest, Glob};
use crate::maps::{Module, ProcMaps};
use crate::usdt::UsdtProbe;

/// A function a probe attaches to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResolvedFunction {
    /// The symbol name that matched (mangled for C++).
    pub name: String,
    /// Its demangling, for C++ names.
    pub demangled: Option<String>,
    /// The file it is in (as given, or the module's path).
    pub path: PathBuf,
    pub vaddr: u64,
    /// `st_size`; 0 when the symbol has none (then `bytes` holds only the first
    /// [`UNSIZED_BYTES`]).
    pub size: u64,
    /// `vaddr + load bias`, when resolved in a process.
    pub runtime_addr: Option<u64>,
    /// The function's bytes from the file (what the planner decodes).
    pub bytes: Vec<u8>,
    /// The file's bytes from the function's end to the next function's start (its
    /// alignment padding), at most [`MAX_PADDING`] bytes; empty when unknown.
    pub padding: Vec<u8>,
    /// An `STT_GNU_IFUNC` resolver rather than the function itself.
    pub ifunc: bool,
}

/// The functions of `elf` a pattern selects, each with the name that matched.
///
/// Each function's names are tried in preference order ([`Function::names`]), each
/// as written, demangled and demangled without parameters; one result per address,
/// in address order. An empty result is an [`Error::FunctionNotFound`] with up to
/// three close names for a pattern without wildcards.
pub fn match_functions<'a>(
    elf: &'a ElfFile,
    pattern: &str,
) -> Result<Vec<(&'a Function, &'a FunctionName)>> {
    let glob = Glob::new(pattern);
    let hits: Vec<_> = elf
        .functions()
        .iter()
        .filter_map(|f| {
            f.names
                .iter()
                .find(|n| n.forms().any(|s| glob.matches(s)))
                .map(|n| (f, n))
        })
        .collect();
    if !hits.is_empty() {
        return Ok(hits);
    }
    let suggestions = if glob.is_literal() {
        let names = elf
            .functions()
            .iter()
            .flat_map(|f| &f.names)
            .flat_map(|n| std::iter::once(n.raw.as_str()).chain(n.demangled_base.as_deref()));
        suggest(pattern, names)
    } else {
        Vec::new()
    };
    Err(Error::FunctionNotFound {
        pattern: pattern.to_string(),
        path: elf.path().to_path_buf(),
        suggestions,
    })
}

/// Resolves a function pattern in a file; `load_bias` is the module's bias when the
/// file is mapped in a process (fills [`ResolvedFunction::runtime_addr`]).
pub fn resolve(
    elf: &ElfFile,
    pattern: &str,
    load_bias: Option<u64>,
) -> Result<Vec<ResolvedFunction>> {
    Ok(match_functions(elf, pattern)?
        .into_iter()
        .map(|(f, n)| resolved(elf, f, n, load_bias))
        .collect())
}

/// `f` of `elf`, under its name `n`, as a resolved function (its code read from the
/// file; its run-time address when `load_bias` is known).
fn resolved(
    elf: &ElfFile,
    f: &crate::elf::Function,
    n: &crate::elf::FunctionName,
    load_bias: Option<u64>,
) -> ResolvedFunction {
    ResolvedFunction {
        name: n.raw.clone(),
        demangled: n.demangled.clone(),
        path: elf.path().to_path_buf(),
        vaddr: f.vaddr,
        size: f.size,
        runtime_addr: load_bias.map(|b| f.vaddr.wrapping_add(b)),
        bytes: function_bytes(elf, f).to_vec(),
        padding: padding_bytes(elf, f).to_vec(),
        ifunc: f.ifunc,
    }
}

/// The sites of `FILE:LINE` in `elf` ([`crate::DebugInfo::line_sites`]), each as the
/// function that holds it and the site's offset in that function; DWARF from the
/// file or a separate debug file `search` finds.
pub fn resolve_line(
    elf: &ElfFile,
    search: &crate::DebugSearch,
    file: &str,
    line: u32,
    load_bias: Option<u64>,
) -> Result<Vec<(ResolvedFunction, u64)>> {
    let path = elf.path().to_path_buf();
    let Some(debug) = elf.debug_info_in(search)? else {
        return Err(Error::NoLineTable {
            path,
            file: file.to_string(),
            line,
        });
    };
    let addrs = debug.line_sites(file, line).map_err(|miss| match miss {
        crate::LineMiss::NoFile { suggestions } => Error::SourceFileNotFound {
            path: path.clone(),
            file: file.to_string(),
            suggestions,
        },
        crate::LineMiss::NoCode {
            file,
            before,
            after,
        } => Error::NoCodeAtLine {
            path: path.clone(),
            file,
            line,
            before,
            after,
        },
    })?;
    addrs
        .into_iter()
        .map(|vaddr| {
            let f = elf
                .function_at(vaddr)
                .ok_or_else(|| Error::LineOutsideFunctions {
                    path: path.clone(),
                    file: file.to_string(),
                    line,
                    vaddr,
                })?;
            let resolved = resolved(elf, f, &f.names[0], load_bias);
            Ok((resolved, vaddr - f.vaddr))
        })
        .collect()
}

/// Longest stretch of inter-function padding reported.
pub const MAX_PADDING: u64 = 64;

/// Bytes between `f`'s end and the next function (or the end of its section), from
/// the file. Empty for a function without a size.
fn padding_bytes<'a>(elf: &'a ElfFile, f: &Function) -> &'a [u8] {
    if f.size == 0 {
        return &[];
    }
    let end = f.vaddr + f.size;
    // functions() is in address order: the next one starts at the first vaddr >= end.
    let funcs = elf.functions();
    let next = funcs
        .get(funcs.partition_point(|g| g.vaddr < end))
        .map(|g| g.vaddr);
    let section_end = elf
        .sections()
        .iter()
        .find(|s| s.addr <= f.vaddr && f.vaddr < s.addr + s.size)
        .map(|s| s.addr + s.size);
    let limit = [next, section_end]
        .into_iter()
        .flatten()
        .min()
        .unwrap_or(end);
    let len = limit.saturating_sub(end).min(MAX_PADDING);
    elf.read_vaddr(end, len).unwrap_or(&[])
}

/// Resolves a function pattern in a process's module.
pub fn resolve_in_module(module: &Module, pattern: &str) -> Result<Vec<ResolvedFunction>> {
    resolve(&*module.open()?, pattern, Some(module.load_bias))
}

/// Bytes given for a function whose symbol has no size: enough for its first
/// instruction (an int3 site needs no more).
pub const UNSIZED_BYTES: u64 = 16;

/// The function's file bytes; fewer than `size` if its segment holds fewer. For a
/// symbol without a size, the first [`UNSIZED_BYTES`].
fn function_bytes<'a>(elf: &'a ElfFile, f: &Function) -> &'a [u8] {
    let available = elf
        .segments()
        .iter()
        .find(|s| s.is_load() && s.vaddr <= f.vaddr && f.vaddr - s.vaddr < s.filesz)
        .map_or(0, |s| s.vaddr + s.filesz - f.vaddr);
    let size = if f.size == 0 { UNSIZED_BYTES } else { f.size };
    elf.read_vaddr(f.vaddr, size.min(available)).unwrap_or(&[])
}

/// The USDT probes of `elf` selected by `provider` (empty: any) and `name`, both
/// with wildcards allowed; an empty result is an [`Error::UsdtNotFound`].
pub fn resolve_usdt(elf: &ElfFile, provider: &str, name: &str) -> Result<Vec<UsdtProbe>> {
    let (pg, ng) = (
        Glob::new(if provider.is_empty() { "*" } else { provider }),
        Glob::new(name),
    );
    let all = elf.usdt_probes();
    let hits: Vec<UsdtProbe> = all
        .iter()
        .filter(|p| pg.matches(&p.provider) && ng.matches(&p.name))
        .cloned()
        .collect();
    if !hits.is_empty() {
        return Ok(hits);
    }
    let wanted = if provider.is_empty() {
        name.to_string()
    } else {
        format!("{provider}:{name}")
    };
    let names: Vec<String> = all
        .iter()
        .map(|p| {
            if provider.is_empty() {
                p.name.clone()
            } else {
                format!("{}:{}", p.provider, p.name)
            }
        })
        .collect();
    Err(Error::UsdtNotFound {
        probe: wanted.clone(),
        path: elf.path().to_path_buf(),
        suggestions: suggest(&wanted, names.iter().map(String::as_str)),
    })
}

/// What `weft -l` lists: a file, or a process (its executable and every mapped
/// library).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ListSource {
    File(PathBuf),
    Process(u32),
}

/// Probe names in the style of `bpftrace -l`: `uprobe:/abs/path:func` for every
/// function name (aliases included, mangled as in the symbol table) and
/// `usdt:/abs/path:provider:name` for every USDT probe, of every file in `source`;
/// sorted and unique. `pattern` (wildcards allowed; empty for all) must match a whole
/// line, e.g. `uprobe:*:mall*` or `usdt:*`. Modules of a process that cannot be
/// read are left out.
pub fn list(source: &ListSource, pattern: &str) -> Result<Vec<String>> {
    let glob = Glob::new(if pattern.is_empty() { "*" } else { pattern });
    let mut lines = Vec::new();
    match source {
        ListSource::File(path) => {
            let abs = std::fs::canonicalize(path).map_err(|source| Error::Io {
                path: path.clone(),
                source,
            })?;
            let elf = ElfFile::open(&abs)?;
            lines.extend(list_lines(&elf, &abs, &glob));
        }
        ListSource::Process(pid) => {
            for module in ProcMaps::read(*pid)?.modules() {
                if let Ok(elf) = module.open() {
                    lines.extend(list_lines(&elf, &module.path, &glob));
                }
            }
        }
    }
    lines.sort();
    lines.dedup();
    Ok(lines)
}

/// The listing lines of one file, shown as `display` (unsorted).
pub fn list_lines(elf: &ElfFile, display: &Path, glob: &Glob) -> Vec<String> {
    let path = display.display();
    let uprobes = elf
        .functions()
        .iter()
        .flat_map(|f| &f.names)
        .map(|n| format!("uprobe:{path}:{}", n.raw));
    let usdts = elf
        .usdt_probes()
        .into_iter()
        .map(|p| format!("usdt:{path}:{}:{}", p.provider, p.name));
    uprobes.chain(usdts).filter(|l| glob.matches(l)).collect()
}
