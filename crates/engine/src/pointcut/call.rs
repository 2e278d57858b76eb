//! `call:BIN:FUNC [within CALLER]`: the call sites of FUNC in BIN's code (Arachne's
//! `call` pointcut). BIN's functions (those the symbol table sizes; with `within`,
//! the callers it names) are decoded, and every `call rel32` — and tail `jmp`/`jcc
//! rel32` — to FUNC, or to FUNC's PLT entry when BIN calls it in a library, is a site
//! ([`weft_x86::scan_calls`]). Each is woven by [`crate::weave::Weaver::call_site`].
//! Indirect calls that may reach FUNC and short tail jumps are counted, not woven.

use std::collections::HashMap;

use anyhow::{anyhow, bail, Result};
use weft_ir::AttachPoint;
use weft_symbols::glob::{suggest, Glob};
use weft_symbols::{ElfFile, Module};
use weft_x86::{CallScan, FunctionCode, Slot};

use super::{module_of, Cx, PointcutKind, Resolved};
use crate::weave::{Call, CallSpec, SiteSpec};

pub struct CallSites;

/// What one `call:` attach point found in one process, for the report ("N call
/// sites woven, M indirect calls not covered").
#[derive(Clone, Debug)]
pub struct CallFound {
    /// The probe name of each callee's sites (`call:./app:work`).
    pub probes: Vec<u32>,
    /// Branches that may reach the callee and cannot be rewritten.
    pub indirect: usize,
    pub short: usize,
}

/// A callee: its name and the address advice reports for it (`func`).
struct Callee {
    name: String,
    func: u64,
}

impl PointcutKind for CallSites {
    fn handles(&self, a: &AttachPoint) -> bool {
        matches!(a, AttachPoint::Call { .. })
    }

    fn resolve(
        &self,
        a: &AttachPoint,
        probe_index: usize,
        _name: u32,
        cx: &mut Cx<'_>,
        out: &mut Resolved,
    ) -> Result<()> {
        let AttachPoint::Call {
            target,
            func,
            within,
        } = a
        else {
            return Ok(());
        };
        let Some(module) = module_of(a, target, cx)? else {
            return Ok(());
        };
        let elf = module.open().map_err(|e| anyhow!("{e}"))?;
        let bias = module.load_bias;
        let callees = callees(a, func, &elf, &module, cx)?;
        // What an indirect call's `[rip+disp]` reads: a GOT slot, the callee's or not.
        let glob = Glob::new(func);
        let slots: HashMap<u64, bool> = elf
            .imports()
            .iter()
            .map(|i| (i.slot, glob.matches(&i.name)))
            .collect();
        let callers = callers(a, within.as_deref(), &elf)?;
        let shown = super::shown_binary(target, &module);
        let within_text = within
            .as_ref()
            .map(|w| format!(" within {w}"))
            .unwrap_or_default();
        let mut probes: HashMap<u64, u32> = HashMap::new();
        let mut total = CallScan::default();
        let mut found = 0usize;
        for f in callers {
            let Ok(bytes) = elf.read_vaddr(f.vaddr, f.size) else {
                continue;
            };
            let code = FunctionCode {
                addr: f.vaddr.wrapping_add(bias),
                bytes: bytes.to_vec(),
                size_known: true,
                padding: Vec::new(),
            };
            let scan = weft_x86::scan_calls(
                &code,
                |t| callees.contains_key(&t.wrapping_sub(bias)),
                |m| match slots.get(&m.wrapping_sub(bias)) {
                    Some(true) => Slot::Callee,
                    Some(false) => Slot::Other,
                    None => Slot::Unknown,
                },
            );
            let caller = f.display_name().to_string();
            for site in &scan.sites {
                let callee = &callees[&site.target.wrapping_sub(bias)];
                let probe = *probes.entry(site.target).or_insert_with(|| {
                    cx.names
                        .intern(format!("call:{shown}:{}{within_text}", callee.name))
                });
                let spec = out.calls.entry(site.addr).or_insert_with(|| SiteSpec {
                    func: code.clone(),
                    name: caller.clone(),
                    site_addr: site.addr,
                    entry: Vec::new(),
                    ret: Vec::new(),
                    around: None,
                    label: format!("call:{shown}:{} in {caller}", callee.name),
                    usdt_args: None,
                    semaphore: None,
                    stub_of: None,
                    call: Some(CallSpec {
                        site: site.clone(),
                        func: callee.func,
                    }),
                });
                let call = Call {
                    advice: probe_index as u64,
                    probe,
                    body: Some(probe_index),
                };
                if cx.prog.probes[probe_index].around {
                    // At the stub the stack is the callee's entry: the around head
                    // returns to the caller itself; `proceed` runs `jmp FUNC`.
                    if spec.around.is_some() {
                        bail!("{}: two around advices on one call site", spec.label);
                    }
                    spec.around = Some(call);
                } else {
                    spec.entry.push(call);
                }
                found += 1;
            }
            total.indirect += scan.indirect;
            total.short += scan.short;
        }
        if found == 0 {
            let names: Vec<&str> = callees.values().map(|c| c.name.as_str()).collect();
            let mut what = format!(
                "{a}: no direct call of {} in {}{within_text}",
                names.join(", "),
                module.path.display()
            );
            let n = |k: usize, what: &str| format!("{k} {what}{}", if k == 1 { "" } else { "s" });
            let missed: Vec<String> = [
                (total.indirect, "indirect call"),
                (total.short, "short tail jump"),
            ]
            .into_iter()
            .filter(|&(k, _)| k > 0)
            .map(|(k, w)| n(k, w))
            .collect();
            if !missed.is_empty() {
                what.push_str(&format!(
                    " ({} that may reach it cannot be woven)",
                    missed.join(" and ")
                ));
            }
            bail!("{what}");
        }
        let mut probes: Vec<u32> = probes.into_values().collect();
        probes.sort_unstable();
        out.calls_found.push(CallFound {
            probes,
            indirect: total.indirect,
            short: total.short,
        });
        Ok(())
    }
}

/// FUNC's entries in BIN by file address: its definitions (calls to them), and the
/// PLT entries of the library functions of that name BIN imports (calls through
/// them). Neither: the uprobe's "not found" error, with close names from both.
fn callees(
    a: &AttachPoint,
    func: &str,
    elf: &ElfFile,
    module: &Module,
    cx: &Cx<'_>,
) -> Result<HashMap<u64, Callee>> {
    let bias = module.load_bias;
    let mut out = HashMap::new();
    match weft_symbols::match_functions(elf, func) {
        Ok(hits) => {
            for (f, n) in hits.into_iter().filter(|(f, _)| !f.ifunc) {
                out.insert(
                    f.vaddr,
                    Callee {
                        name: n.demangled.clone().unwrap_or_else(|| n.raw.clone()),
                        func: f.vaddr.wrapping_add(bias),
                    },
                );
            }
        }
        Err(weft_symbols::Error::FunctionNotFound { .. }) => {}
        Err(e) => bail!("{a}: {e}"),
    }
    let glob = Glob::new(func);
    for i in elf.imports().iter().filter(|i| glob.matches(&i.name)) {
        let Some(plt) = i.plt else { continue };
        out.entry(plt).or_insert_with(|| Callee {
            name: i.name.clone(),
            func: definition(&i.name, module, cx).unwrap_or(plt.wrapping_add(bias)),
        });
    }
    if !out.is_empty() {
        return Ok(out);
    }
    let imported = elf.imports().iter().any(|i| glob.matches(&i.name));
    if imported {
        bail!(
            "{a}: {} calls {func} only through its GOT (built with -fno-plt?): no direct \
             call to rewrite",
            module.path.display()
        );
    }
    // Close names among the functions BIN defines and those it imports.
    let names = elf
        .functions()
        .iter()
        .flat_map(|f| &f.names)
        .map(|n| n.raw.as_str())
        .chain(elf.imports().iter().map(|i| i.name.as_str()));
    Err(not_found(a, func, elf, names))
}

/// The uprobe's "function not found" (close names when `pattern` is a plain name),
/// prefixed with the attach point.
fn not_found<'n>(
    a: &AttachPoint,
    pattern: &str,
    elf: &ElfFile,
    names: impl Iterator<Item = &'n str>,
) -> anyhow::Error {
    let suggestions = if Glob::new(pattern).is_literal() {
        suggest(pattern, names)
    } else {
        Vec::new()
    };
    let e = weft_symbols::Error::FunctionNotFound {
        pattern: pattern.to_string(),
        path: elf.path().to_path_buf(),
        suggestions,
    };
    anyhow!("{a}: {e}")
}

/// The functions whose code is scanned: every sized function of BIN, or those whose
/// name `within` matches (none: an error, with close names).
fn callers<'e>(
    a: &AttachPoint,
    within: Option<&str>,
    elf: &'e ElfFile,
) -> Result<Vec<&'e weft_symbols::Function>> {
    let sized = elf.functions().iter().filter(|f| f.size > 0 && !f.ifunc);
    let Some(pattern) = within else {
        return Ok(sized.collect());
    };
    let glob = Glob::new(pattern);
    let picked: Vec<_> = sized
        .filter(|f| f.names.iter().any(|n| n.forms().any(|s| glob.matches(s))))
        .collect();
    if !picked.is_empty() {
        return Ok(picked);
    }
    let names = elf
        .functions()
        .iter()
        .flat_map(|f| &f.names)
        .map(|n| n.raw.as_str());
    Err(not_found(a, pattern, elf, names))
}

/// Where a library function `name` that `module` imports is defined in the process:
/// the first other module that defines it.
fn definition(name: &str, module: &Module, cx: &Cx<'_>) -> Option<u64> {
    cx.maps
        .modules()
        .iter()
        .filter(|m| m.open_path != module.open_path)
        .find_map(|m| {
            let f = weft_symbols::resolve_in_module(m, name).ok()?;
            f.into_iter().find_map(|f| f.runtime_addr)
        })
}
