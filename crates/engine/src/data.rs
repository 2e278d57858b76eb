//! Data pointcuts (`set:BIN:VAR`, `get:BIN:VAR`): the variable a pointcut names,
//! found in the symbol table (address, size) and DWARF (type, `.field` / `[i]`
//! steps), for the front end (before anything is woven: located errors, the type
//! of `old`/`new`/`val`) and for the resolver (`pointcut::data`).
//!
//! The mechanism ([`Mechanism`], `--data-mechanism`): hardware watchpoints, page
//! protection, or (the default) per pointcut a hardware watchpoint when one can
//! take it and page protection otherwise (`Member::prepare`); or, only when
//! asked for, instruction rewriting (`weave::Weaver::access_site`).

use std::path::PathBuf;

use weft_ir::{CStruct, Type};
use weft_lang::DataVar;
use weft_symbols::{ElfFile, LibrarySearch, ProcMaps, TargetContext};

/// How a data pointcut's accesses are caught (`--data-mechanism`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Mechanism {
    /// Per pointcut: a hardware watchpoint when one can take it (1, 2, 4 or 8
    /// aligned bytes, at most 4), else page protection (said by `-v`).
    #[default]
    Auto,
    /// Hardware watchpoints: perf breakpoint events with a synchronous SIGTRAP in
    /// the accessing thread (the agent's `watch`). At most 4 per thread.
    Hardware,
    /// Page protection: the watched bytes' pages are protected and the faulting
    /// accesses emulated out of line (the agent's `page`). Any size, any number.
    Page,
    /// Instruction rewriting (Arachne's readGlobal/writeGlobal): every instruction of
    /// the variable's module that names its bytes by a fixed address (`[rip+disp]`,
    /// absolute) jumps to a trampoline that runs the access and the advice. Exact
    /// for those; accesses through pointers, and from other modules (through the
    /// GOT), are not seen. Never chosen by `auto`.
    Rewrite,
}

impl Mechanism {
    /// From `--data-mechanism`: `auto`, `hw`, `page`, `rewrite` (or `direct`).
    pub fn parse(s: &str) -> Result<Mechanism, String> {
        match s {
            "auto" => Ok(Mechanism::Auto),
            "hw" => Ok(Mechanism::Hardware),
            "page" => Ok(Mechanism::Page),
            "rewrite" | "direct" => Ok(Mechanism::Rewrite),
            _ => Err(format!(
                "--data-mechanism `{s}`: expected auto, hw, page or rewrite (direct)"
            )),
        }
    }

    /// As `--data-mechanism` names it.
    pub fn name(self) -> &'static str {
        match self {
            Mechanism::Auto => "auto",
            Mechanism::Hardware => "hw",
            Mechanism::Page => "page",
            Mechanism::Rewrite => "rewrite",
        }
    }

    /// As `-v` describes it.
    pub fn describe(self) -> &'static str {
        match self {
            Mechanism::Auto => "hardware watchpoint or page protection",
            Mechanism::Hardware => "hardware watchpoint",
            Mechanism::Page => "page protection",
            Mechanism::Rewrite => "instruction rewriting",
        }
    }
}

/// A variable found: its address in the file, the bytes watched and their type.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Found {
    pub vaddr: u64,
    pub size: u32,
    pub ty: Type,
}

/// No data object `var`: a near name, a function, or what to do for a local.
fn missing_message(elf: &ElfFile, var: &str) -> String {
    let mut msg = format!(
        "no global or static variable `{var}` in {}",
        elf.path().display()
    );
    let near = weft_symbols::glob::suggest(var, elf.object_names());
    if let Some(s) = near.first() {
        msg.push_str(&format!("; did you mean `{s}`?"));
    }
    if elf.symbol_vaddr(var).is_some() {
        msg.push_str(" (it is a function: use uprobe)");
    } else {
        msg.push_str(
            " (if it is a local variable or a parameter, it lives in a register or on the \
             stack: read it in a uprobe on its function, with args)",
        );
    }
    msg
}

/// `var` is a parameter or local of a function (DWARF says so): no address to
/// watch, and where to read it instead.
fn local_message(elf: &ElfFile, var: &str, local: &weft_symbols::LocalVariable) -> String {
    let bin = elf.path().display();
    let f = &local.function;
    if local.parameter {
        format!(
            "`{var}` is a parameter of `{f}`: it lives in a register or on the stack, with \
             no fixed address to watch; read it where `{f}` starts: \
             `uprobe:{bin}:{f} {{ print(args.{var}); }}`"
        )
    } else {
        format!(
            "`{var}` is a local variable of `{f}`: it lives in a register or on the stack, \
             with no fixed address to watch; read what it is made from where `{f}` starts \
             (`uprobe:{bin}:{f} {{ print(args); }}`) or what `{f}` returns \
             (`uretprobe:{bin}:{f} {{ print(retval); }}`), and keep it in a `$variable` of \
             that advice or a map"
        )
    }
}

/// The variable `var` of `elf` with the `.field` / `[i]` steps of `path`.
pub fn find_variable(elf: &ElfFile, var: &str, path: &str) -> Result<Found, String> {
    let debug = elf.debug_info().ok().flatten();
    let (vaddr, size, dwarf) = match elf.object(var) {
        Some((vaddr, size)) => (
            vaddr,
            size,
            debug.as_ref().and_then(|d| d.data_variable_type(var)),
        ),
        None => match debug.as_ref().and_then(|d| d.local_variable(var)) {
            // A function's `static` (the symbol table calls it `var.N`).
            Some(weft_symbols::LocalVariable {
                static_addr: Some(a),
                ty,
                ..
            }) => {
                let size = ty.as_ref().map_or(0, |t| u64::from(t.size()));
                (a, size, ty)
            }
            Some(local) => return Err(local_message(elf, var, &local)),
            None => return Err(missing_message(elf, var)),
        },
    };
    let size = match (size, &dwarf) {
        // No size in the symbol table (a symbol defined in assembly): DWARF's.
        (0, Some(t)) => u64::from(t.size()),
        _ => size,
    };
    let whole = dwarf.clone().unwrap_or(Type::Int {
        bits: (size.min(8) * 8) as u8,
        signed: false,
    });
    if path.is_empty() {
        if size == 0 {
            return Err(format!(
                "`{var}` has no size in the symbol table and no type in DWARF: weft cannot \
                 tell which bytes to watch (give it a size: `.size {var}, N` in assembly, a \
                 C definition built with -g, or watch it by address with \
                 `watchpoint:ADDR:LEN:w` or `set:addr(@p, LEN)`)"
            ));
        }
        return Ok(Found {
            vaddr,
            size: size as u32,
            ty: whole,
        });
    }
    let Some(mut ty) = dwarf else {
        return Err(format!(
            "`{var}{path}` needs the type of `{var}` from DWARF, and {} has none for it \
             (build with -g)",
            elf.path().display()
        ));
    };
    let mut off = 0u64;
    let mut rest = path;
    while !rest.is_empty() {
        let (want, next): (String, &str) = if let Some(r) = rest.strip_prefix('.') {
            let end = r.find(['.', '[']).unwrap_or(r.len());
            (r[..end].to_string(), &r[end..])
        } else if rest.starts_with('[') {
            let end = rest
                .find(']')
                .ok_or_else(|| format!("`{var}{path}`: missing `]`"))?;
            let i: u64 = rest[1..end]
                .trim()
                .parse()
                .map_err(|_| format!("`{var}{path}`: the index must be a number"))?;
            (format!("[{i}]"), &rest[end + 1..])
        } else {
            return Err(format!("`{var}{path}`: expected .FIELD or [INDEX]"));
        };
        let Type::CStruct(CStruct { fields, name, size }) = &ty else {
            return Err(format!(
                "`{var}{path}`: `{want}` steps into a value that is not a struct or array"
            ));
        };
        // An array too large to list its elements: the element's offset from its
        // size.
        if let [only] = &fields[..] {
            if only.name == weft_symbols::ARRAY_ELEMENT && want.starts_with('[') {
                let i: u64 = want[1..want.len() - 1].parse().unwrap_or(u64::MAX);
                let elem = u64::from(only.ty.size());
                let n = u64::from(*size).checked_div(elem).unwrap_or(0);
                if i >= n {
                    return Err(format!("`{var}{path}`: index {want} is outside `{name}`"));
                }
                off += i * elem;
                ty = only.ty.clone();
                rest = next;
                continue;
            }
        }
        let Some(f) = fields.iter().find(|f| f.name == want) else {
            let mut msg = if want.starts_with('[') {
                format!("`{var}{path}`: index {want} is outside `{name}`")
            } else {
                format!("`{name}` has no member `{want}`")
            };
            let names = fields.iter().map(|f| f.name.as_str());
            match weft_symbols::glob::suggest(&want, names).first() {
                Some(s) if !want.starts_with('[') => {
                    msg.push_str(&format!("; did you mean `{s}`?"))
                }
                _ => {}
            }
            return Err(msg);
        };
        if f.bits.is_some() {
            return Err(format!("`{var}{path}`: a bit-field cannot be watched"));
        }
        off += u64::from(f.offset);
        ty = f.ty.clone();
        rest = next;
    }
    let size = ty.size();
    Ok(Found {
        vaddr: vaddr + off,
        size,
        ty: if matches!(ty, Type::Int { .. }) {
            ty
        } else {
            Type::Int {
                bits: (size.min(8) * 8) as u8,
                signed: false,
            }
        },
    })
}

/// Finds data pointcuts' variables for the front end, in the process (`-p`) or
/// the command (`-c`).
pub struct DwarfData {
    pub pid: Option<i32>,
    pub executable: Option<PathBuf>,
    /// `--data-mechanism`: only hardware watchpoints limit the size.
    pub mechanism: Mechanism,
}

impl DwarfData {
    fn file(&self, target: &str) -> Result<PathBuf, String> {
        let search = LibrarySearch::system();
        match self.pid {
            Some(pid) => {
                let maps = ProcMaps::read(pid as u32).map_err(|e| e.to_string())?;
                let modules = maps.modules();
                let ctx = TargetContext {
                    process: Some((pid as u32, &modules)),
                    executable: None,
                    search: &search,
                };
                let t = weft_symbols::resolve_target(target, &ctx).map_err(|e| e.to_string())?;
                Ok(t.module.map_or(t.path, |m| m.open_path))
            }
            None => {
                let exe = self.executable.as_ref().and_then(|p| ElfFile::open(p).ok());
                let ctx = TargetContext {
                    process: None,
                    executable: exe.as_ref(),
                    search: &search,
                };
                Ok(weft_symbols::resolve_target(target, &ctx)
                    .map_err(|e| e.to_string())?
                    .path)
            }
        }
    }
}

impl weft_lang::DataResolver for DwarfData {
    fn variable(&self, target: &str, var: &str, path: &str) -> Result<DataVar, String> {
        let file = self.file(target)?;
        let elf = ElfFile::open(&file).map_err(|e| e.to_string())?;
        let f = find_variable(&elf, var, path)?;
        if self.mechanism == Mechanism::Hardware {
            check_size(f.vaddr, f.size, var, path)?;
        }
        Ok(DataVar {
            size: f.size,
            ty: f.ty,
        })
    }
}

/// What a hardware watchpoint can take: 1, 2, 4 or 8 bytes, aligned.
pub fn check_size(vaddr: u64, size: u32, var: &str, path: &str) -> Result<(), String> {
    if !matches!(size, 1 | 2 | 4 | 8) {
        return Err(format!(
            "`{var}{path}` is {size} bytes: a hardware watchpoint watches 1, 2, 4 or 8 \
             (watch a member: `{var}.FIELD`, `{var}[i]`)"
        ));
    }
    if !vaddr.is_multiple_of(u64::from(size)) {
        return Err(format!(
            "`{var}{path}` is not aligned to its size ({size} bytes): a hardware \
             watchpoint cannot watch it"
        ));
    }
    Ok(())
}
