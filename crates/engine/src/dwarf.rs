//! `args` for uprobes: parameter names and types from the probed function's DWARF,
//! found before anything is woven (the front end asks while checking).

use std::path::PathBuf;

use weft_ir::{AttachPoint, Type};
use weft_symbols::{ElfFile, LibrarySearch, ProcMaps, TargetContext};

/// Resolves `BIN` of a probe against the process (`-p`) or the command (`-c`).
pub struct DwarfArgs {
    pub pid: Option<i32>,
    pub executable: Option<PathBuf>,
}

impl weft_lang::ArgsResolver for DwarfArgs {
    fn params(&self, attach: &AttachPoint) -> Option<Vec<(String, Type)>> {
        let (info, name) = self.function(attach)?;
        let params = info.function_params(&name)?;
        Some(params.into_iter().map(|p| (p.name, p.ty)).collect())
    }

    fn return_type(&self, attach: &AttachPoint) -> Option<Type> {
        let (info, name) = self.function(attach)?;
        info.function_return_type(&name)
    }

    fn struct_type(&self, attach: &AttachPoint, name: &str) -> Option<Type> {
        let elf = ElfFile::open(self.binary(attach)?).ok()?;
        elf.debug_info().ok()??.struct_type(name)
    }

    fn source_line(&self, attach: &AttachPoint) -> Result<(), String> {
        let AttachPoint::SourceLine { file, line, .. } = attach else {
            return Ok(());
        };
        let Some(elf) = self.binary(attach).and_then(|p| ElfFile::open(p).ok()) else {
            return Ok(());
        };
        weft_symbols::resolve_line(
            &elf,
            &weft_symbols::DebugSearch::system(),
            file,
            *line,
            None,
        )
        .map(|_| ())
        .map_err(|e| e.to_string())
    }
}

impl DwarfArgs {
    /// The debug info of the binary an attach point names, and the function's name
    /// (a wildcard's first match).
    fn function(&self, attach: &AttachPoint) -> Option<(weft_symbols::DebugInfo, String)> {
        let func = match attach {
            AttachPoint::Uprobe { func, .. }
            | AttachPoint::Uretprobe { func, .. }
            | AttachPoint::Call { func, .. } => func,
            _ => return None,
        };
        let path = self.binary(attach)?;
        let elf = ElfFile::open(&path).ok()?;
        let info = elf.debug_info().ok()??;
        // A wildcard matches several functions: `args` needs one signature; use the
        // first matching function that has debug info.
        let name = if func.contains(['*', '?', '[']) {
            weft_symbols::match_functions(&elf, func)
                .ok()?
                .first()?
                .1
                .raw
                .clone()
        } else {
            func.clone()
        };
        Some((info, name))
    }

    /// The file of the binary an attach point names, in the process (`-p`) or as
    /// the command (`-c`) would load it.
    fn binary(&self, attach: &AttachPoint) -> Option<PathBuf> {
        let target = match attach {
            AttachPoint::Uprobe { target, .. }
            | AttachPoint::SourceLine { target, .. }
            | AttachPoint::Uretprobe { target, .. }
            | AttachPoint::Call { target, .. } => target,
            _ => return None,
        };
        let search = LibrarySearch::system();
        let path = match self.pid {
            Some(pid) => {
                let maps = ProcMaps::read(pid as u32).ok()?;
                let modules = maps.modules();
                let ctx = TargetContext {
                    process: Some((pid as u32, &modules)),
                    executable: None,
                    search: &search,
                };
                let t = weft_symbols::resolve_target(target, &ctx).ok()?;
                t.module.map_or(t.path, |m| m.open_path)
            }
            None => {
                let exe = self.executable.as_ref().and_then(|p| ElfFile::open(p).ok());
                let ctx = TargetContext {
                    process: None,
                    executable: exe.as_ref(),
                    search: &search,
                };
                weft_symbols::resolve_target(target, &ctx).ok()?.path
            }
        };
        Some(path)
    }
}
