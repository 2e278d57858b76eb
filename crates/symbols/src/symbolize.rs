//! Addresses in a process → `function+offset (module)`, for `usym`, `ustack` and
//! `func`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use crate::dwarf::{DebugInfo, SourceFrame};
use crate::elf::ElfFile;
use crate::error::Result;
use crate::maps::{Module, ProcMaps};

/// A symbolized address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Symbol {
    /// The function's preferred symbol name (mangled for C++); `None` when the address
    /// is in a module but in no known function (PLT stubs, stripped code).
    pub name: Option<String>,
    /// The C++ demangling of `name`.
    pub demangled: Option<String>,
    /// Offset from the function's start; with no function, the file virtual address.
    pub offset: u64,
    /// The module's path, as the process sees it.
    pub module: PathBuf,
}

/// Symbolizes addresses of one process. Each module's symbols are loaded once, on
/// first use, and kept across [`Symbolizer::set_modules`] (after a `dlopen`).
#[derive(Debug, Default)]
pub struct Symbolizer {
    modules: Vec<Module>,
    files: HashMap<PathBuf, Option<std::sync::Arc<ElfFile>>>,
    /// Each module's DWARF, loaded on the first [`Symbolizer::source_frames`].
    debug: HashMap<PathBuf, Option<DebugInfo>>,
}

impl Symbolizer {
    pub fn new(modules: Vec<Module>) -> Symbolizer {
        Symbolizer {
            modules,
            files: HashMap::new(),
            debug: HashMap::new(),
        }
    }

    /// Reads the process's maps now.
    pub fn for_process(pid: u32) -> Result<Symbolizer> {
        Ok(Symbolizer::new(ProcMaps::read(pid)?.modules()))
    }

    /// Replaces the module list (e.g. after re-reading maps), keeping loaded symbols.
    pub fn set_modules(&mut self, modules: Vec<Module>) {
        self.modules = modules;
    }

    pub fn modules(&self) -> &[Module] {
        &self.modules
    }

    /// The module that maps `addr`, if any.
    pub fn module_of(&self, addr: u64) -> Option<&Module> {
        self.modules.iter().find(|m| m.contains(addr))
    }

    /// `addr` as function + offset in its module; `None` outside every module.
    pub fn symbolize(&mut self, addr: u64) -> Option<Symbol> {
        let module = self.modules.iter().find(|m| m.contains(addr))?;
        let vaddr = module.vaddr(addr);
        let elf = self
            .files
            .entry(module.open_path.clone())
            .or_insert_with(|| module.open().ok())
            .as_deref();
        let found = elf.and_then(|elf| containing_function(elf, vaddr));
        Some(match found {
            Some((name, demangled, start)) => Symbol {
                name: Some(name.to_string()),
                demangled: demangled.map(str::to_string),
                offset: vaddr - start,
                module: module.path.clone(),
            },
            None => Symbol {
                name: None,
                demangled: None,
                offset: vaddr,
                module: module.path.clone(),
            },
        })
    }

    /// The source-level frames at `addr` (inlined functions first, then the function
    /// holding the code: [`DebugInfo::frames`]), from its module's DWARF wherever
    /// that lives; empty outside every module or without DWARF.
    pub fn source_frames(&mut self, addr: u64) -> Vec<SourceFrame> {
        let Some(module) = self.modules.iter().find(|m| m.contains(addr)) else {
            return Vec::new();
        };
        let vaddr = module.vaddr(addr);
        let elf = self
            .files
            .entry(module.open_path.clone())
            .or_insert_with(|| module.open().ok())
            .clone();
        let debug = self
            .debug
            .entry(module.open_path.clone())
            .or_insert_with(|| elf.and_then(|e| e.debug_info().ok().flatten()));
        debug.as_ref().map_or_else(Vec::new, |d| d.frames(vaddr))
    }

    /// The loaded file for a module path, if it was loaded and readable.
    pub fn file(&self, open_path: &Path) -> Option<&ElfFile> {
        self.files.get(open_path)?.as_deref()
    }
}

/// The function holding `vaddr`: `[start, start + size)`, or for a symbol without a
/// size, from its start to the next function or the end of its segment.
fn containing_function(elf: &ElfFile, vaddr: u64) -> Option<(&str, Option<&str>, u64)> {
    let fns = elf.functions();
    let i = fns.partition_point(|f| f.vaddr <= vaddr).checked_sub(1)?;
    let f = &fns[i];
    let inside = if f.size > 0 {
        vaddr - f.vaddr < f.size
    } else {
        let next = fns.get(i + 1).map_or(u64::MAX, |n| n.vaddr);
        let seg_end = elf
            .segments()
            .iter()
            .find(|s| s.is_load() && s.vaddr <= f.vaddr && f.vaddr - s.vaddr < s.memsz)
            .map_or(f.vaddr, |s| s.vaddr + s.memsz);
        vaddr == f.vaddr || (vaddr < next && vaddr < seg_end)
    };
    inside.then(|| (f.name(), f.names[0].demangled.as_deref(), f.vaddr))
}
