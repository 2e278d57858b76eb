//! `uprobe:BIN:FUNC[+OFF]` and `uretprobe:BIN:FUNC`: a function's entry (or an
//! offset in it) and its return. In a coldpatched binary, advice that needs nothing
//! of the machine state goes to the function's NOP placeholders instead (HotPatch).

use std::collections::HashMap;

use anyhow::{anyhow, bail, Result};
use weft_ir::AttachPoint;

use super::{module_of, Cx, PointcutKind, Resolved};
use crate::weave::{Call, SiteSpec};

pub struct Uprobe;

impl PointcutKind for Uprobe {
    fn handles(&self, a: &AttachPoint) -> bool {
        matches!(
            a,
            AttachPoint::Uprobe { .. } | AttachPoint::Uretprobe { .. }
        )
    }

    fn resolve(
        &self,
        a: &AttachPoint,
        pi: usize,
        _name: u32,
        cx: &mut Cx<'_>,
        out: &mut Resolved,
    ) -> Result<()> {
        let Some((target_spec, func, offset, is_ret)) = a.function() else {
            return Ok(());
        };
        let Some(module) = module_of(a, target_spec, cx)? else {
            return Ok(());
        };
        let funcs = match weft_symbols::resolve_in_module(&module, func) {
            Ok(f) => f,
            // `missing_probes = "warn"` or `"ignore"`: the probe is skipped (weft
            // warned once, before it started).
            Err(weft_symbols::Error::FunctionNotFound { .. })
                if cx.prog.config.missing_probes != weft_ir::MissingProbes::Error =>
            {
                return Ok(())
            }
            Err(e) => return Err(anyhow!("{e}{}", elsewhere(&e, &module, func, cx))),
        };
        let (elf, list) = cx
            .placeholders
            .entry(module.open_path.clone())
            .or_insert_with(|| {
                let elf = module.open().ok();
                let mut list: HashMap<u64, Vec<_>> = HashMap::new();
                for w in elf
                    .as_ref()
                    .and_then(|e| e.weft_probes().ok())
                    .unwrap_or_default()
                {
                    if let Some(f) = w.function_vaddr.filter(|_| !w.inlined) {
                        list.entry(f).or_default().push(w);
                    }
                }
                (elf.filter(|_| !list.is_empty()), list)
            });
        // The front end's own probes (cflow's) stay at the real entry and return:
        // the program's advice, at either kind of site, then runs inside them.
        let probe = &cx.prog.probes[pi];
        let around = probe.around;
        let frame_free = !around && !uses_frame_state(&probe.body) && !probe.hidden;
        // A `weft prepare` stub's placeholder sees the function's entry state (the
        // arguments in their registers), so advice reading arguments may run there
        // too; not what needs the real address or stack (`reg`, `ip`, `ustack`).
        let stub_ok = !around && !probe.hidden && !uses_state_beyond_args(&probe.body);
        let by_addr = &mut out.sites;
        for f in funcs {
            let Some(addr) = f.runtime_addr else { continue };
            if f.ifunc {
                continue;
            }
            let kind = if is_ret { "uretprobe" } else { "uprobe" };
            let shown = super::shown_binary(target_spec, &module);
            // C++ and Rust names demangled (`probe`, `-v`), an overload with its
            // parameter list.
            let name = f.demangled.as_deref().unwrap_or(&f.name);
            let label = if offset != 0 {
                format!("{kind}:{shown}:{name}+{offset}")
            } else {
                format!("{kind}:{shown}:{name}")
            };
            let probe = cx.names.intern(label.clone());
            // HotPatch: advice that needs nothing of the machine state at the
            // function's entry or return runs at the coldpatched placeholders
            // instead (plain NOP sites, no return-address hijack).
            if offset == 0 && (frame_free || (stub_ok && !is_ret)) {
                let want = if is_ret {
                    weft_symbols::WeftProbeKind::Exit
                } else {
                    weft_symbols::WeftProbeKind::Entry
                };
                let sites: Vec<&weft_symbols::WeftProbeSite> = list
                    .get(&f.vaddr)
                    .into_iter()
                    .flatten()
                    .filter(|w| {
                        (frame_free && w.kind == want)
                            || (!is_ret && w.kind == weft_symbols::WeftProbeKind::EntryStub)
                    })
                    .collect();
                if !sites.is_empty() {
                    for w in sites {
                        let site_addr = module.runtime_addr(w.vaddr);
                        let stub = w.kind == weft_symbols::WeftProbeKind::EntryStub;
                        // A stripped binary's functions have no size; the planner
                        // then sees the function up to the end of the placeholder
                        // (one NOP instruction: nothing can branch into it).
                        // A stub's placeholder is planned on its own bytes: one
                        // NOP, which nothing else branches into.
                        let (code_addr, bytes, padding) = if stub {
                            let bytes = elf
                                .as_ref()
                                .and_then(|e| e.read_vaddr(w.vaddr, u64::from(w.len)).ok())
                                .map(<[u8]>::to_vec);
                            (site_addr, bytes.unwrap_or_default(), Vec::new())
                        } else if f.size > 0 {
                            (addr, f.bytes.clone(), f.padding.clone())
                        } else {
                            let len = w.vaddr + u64::from(w.len) - f.vaddr;
                            let bytes = elf
                                .as_ref()
                                .and_then(|e| e.read_vaddr(f.vaddr, len).ok())
                                .map(<[u8]>::to_vec);
                            (addr, bytes.unwrap_or_default(), Vec::new())
                        };
                        let spec = by_addr.entry(site_addr).or_insert_with(|| SiteSpec {
                            func: weft_x86::FunctionCode {
                                addr: code_addr,
                                size_known: !bytes.is_empty(),
                                bytes,
                                padding,
                            },
                            name: f.demangled.clone().unwrap_or_else(|| f.name.clone()),
                            site_addr,
                            entry: Vec::new(),
                            ret: Vec::new(),
                            around: None,
                            label: format!(
                                "{label} ({} placeholder)",
                                if is_ret { "exit" } else { "entry" }
                            ),
                            usdt_args: None,
                            semaphore: None,
                            stub_of: stub.then_some(addr),
                            call: None,
                        });
                        spec.entry.push(Call {
                            advice: pi as u64,
                            probe,
                            body: Some(pi),
                        });
                    }
                    continue;
                }
            }
            if offset != 0
                && list.get(&f.vaddr).is_some_and(|l| {
                    l.iter()
                        .any(|w| w.kind == weft_symbols::WeftProbeKind::EntryStub)
                })
            {
                if let Some(moved) = moved_by_prepare(&f.bytes) {
                    if moved.contains(&offset) {
                        bail!(
                            "{label}: offset {offset} is inside the first {} bytes of {name}, which `weft prepare` moved to a stub (they never run there); probe the function's entry instead",
                            moved.end
                        );
                    }
                }
            }
            let site_addr = addr + offset;
            let spec = by_addr
                .entry(site_addr)
                .or_insert_with(|| super::function_site(&f, addr, site_addr, &label));
            let call = Call {
                advice: pi as u64,
                probe,
                body: Some(pi),
            };
            if around {
                if offset != 0 || is_ret {
                    bail!("{label}: around advice goes on a function's entry");
                }
                if let Some(other) = &spec.around {
                    bail!(
                        "{label}: two around advices on {} (probes {} and {}); one function takes one",
                        spec.name,
                        other.body.map_or(0, |b| b + 1),
                        pi + 1
                    );
                }
                spec.around = Some(call);
            } else if is_ret {
                spec.ret.push(call);
            } else {
                spec.entry.push(call);
            }
        }
        Ok(())
    }
}

/// Whether a probe body reads the machine state at its site (arguments, return
/// value, registers, the instruction pointer, the stack): such advice must run at the
/// function's real entry or return.
fn uses_frame_state(f: &weft_ir::Function) -> bool {
    use weft_ir::{CtxValue, Inst};
    f.code.iter().any(|i| match i {
        Inst::Ctx { value, .. } => matches!(
            value,
            CtxValue::Arg(_)
                | CtxValue::Retval
                | CtxValue::Reg(_)
                | CtxValue::Ip
                | CtxValue::ReturnAddress
        ),
        // New arguments go in the registers the function reads at its entry (a
        // coldpatched placeholder sits inside the prologue, where they are not).
        Inst::UStack { .. } | Inst::Override { .. } | Inst::SetArg { .. } => true,
        _ => false,
    })
}

/// The offsets of a prepared function's entry that `weft prepare` replaced (its
/// `jmp` to the stub after any `endbr64`, and the `int3` filler after it), but the
/// first: nothing runs there any more.
fn moved_by_prepare(bytes: &[u8]) -> Option<std::ops::Range<u64>> {
    let start = if bytes.starts_with(&weft_x86::ENDBR64) {
        4
    } else {
        0
    };
    if bytes.get(start) != Some(&0xe9) {
        return None;
    }
    let filler = bytes.get(start + 5..).map_or(0, |rest| {
        rest.iter().take_while(|&&b| b == weft_x86::INT3).count()
    });
    Some(start as u64 + 1..(start + 5 + filler) as u64)
}

/// Whether a probe body reads machine state other than the arguments: what only the
/// function's real entry has (its address, the stack as unwinders see it).
fn uses_state_beyond_args(f: &weft_ir::Function) -> bool {
    use weft_ir::{CtxValue, Inst};
    f.code.iter().any(|i| match i {
        Inst::Ctx { value, .. } => matches!(
            value,
            CtxValue::Retval | CtxValue::Reg(_) | CtxValue::Ip | CtxValue::ReturnAddress
        ),
        Inst::UStack { .. } | Inst::Override { .. } => true,
        _ => false,
    })
}

/// For a function not found in the file a probe names: the modules of the process
/// that define it (a program calling into its library: `sqlite3_prepare_v2` is in
/// `libsqlite3.so.0`, not in `/usr/bin/sqlite3`), as a hint to append.
fn elsewhere(
    e: &weft_symbols::Error,
    module: &weft_symbols::Module,
    func: &str,
    cx: &Cx<'_>,
) -> String {
    if !matches!(e, weft_symbols::Error::FunctionNotFound { .. })
        || weft_symbols::glob::has_wildcards(func)
    {
        return String::new();
    }
    let mut found: Vec<String> = cx
        .maps
        .modules()
        .iter()
        .filter(|m| m.open_path != module.open_path)
        .filter(|m| weft_symbols::resolve_in_module(m, func).is_ok())
        .filter_map(|m| Some(m.path.file_name()?.to_string_lossy().into_owned()))
        .collect();
    found.dedup();
    match found.first() {
        Some(lib) => {
            // `libsqlite3` names `libsqlite3.so.0.8.6` (see `symbols::target`).
            let short = lib.split_once(".so").map_or(lib.as_str(), |(s, _)| s);
            format!(" (it is in {lib}, which the process maps: probe it as uprobe:{short}:{func})")
        }
        None => String::new(),
    }
}
