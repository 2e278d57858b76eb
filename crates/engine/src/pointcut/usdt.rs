//! `usdt:BIN:PROVIDER:NAME`: each probe's NOP (a `sys/sdt.h` or `weft.h` note),
//! planned inside the function that contains it; the note's argument locations
//! become the advice's `argN`, and a probe's semaphore is raised while it is woven.

use anyhow::{anyhow, bail, Result};
use weft_ir::AttachPoint;
use weft_symbols::{ElfFile, Module};

use super::{module_of, Cx, PointcutKind, Resolved};
use crate::weave::{Call, SiteSpec};

pub struct Usdt;

impl PointcutKind for Usdt {
    fn handles(&self, a: &AttachPoint) -> bool {
        matches!(a, AttachPoint::Usdt { .. })
    }

    fn resolve(
        &self,
        a: &AttachPoint,
        probe_index: usize,
        _name: u32,
        cx: &mut Cx<'_>,
        out: &mut Resolved,
    ) -> Result<()> {
        let AttachPoint::Usdt {
            target,
            provider,
            name,
        } = a
        else {
            return Ok(());
        };
        // An empty binary (`usdt::PROV:NAME -p PID`) is every module of the
        // process, a wildcard every module whose path matches, as bpftrace does.
        let any = target.is_empty() || weft_symbols::glob::has_wildcards(target);
        let modules = if any {
            modules_matching(target, cx)
        } else {
            match module_of(a, target, cx)? {
                Some(m) => vec![m],
                None => return Ok(()),
            }
        };
        let mut found = 0;
        for module in &modules {
            let elf = match module.open() {
                Ok(elf) => elf,
                Err(_) if any => continue,
                Err(e) => return Err(anyhow!("{e}")),
            };
            let probes = match weft_symbols::resolve_usdt(&elf, provider, name) {
                Ok(p) => p,
                Err(_) if any => continue,
                Err(weft_symbols::Error::UsdtNotFound { .. })
                    if cx.prog.config.missing_probes != weft_ir::MissingProbes::Error =>
                {
                    continue
                }
                Err(e) => return Err(anyhow!("{e}")),
            };
            found += probes.len();
            add_probes(a, target, module, &elf, probes, probe_index, cx, out)?;
        }
        if any && found == 0 && !cx.lenient {
            bail!(
                "{a}: no USDT probe matches in {} of process {}",
                if target.is_empty() {
                    "the modules".to_string()
                } else {
                    format!("the modules matching `{target}`")
                },
                cx.pid
            );
        }
        Ok(())
    }
}

/// Sites for `probes`, the notes of `module` that attach point `a` matched.
#[allow(clippy::too_many_arguments)]
fn add_probes(
    a: &AttachPoint,
    target: &str,
    module: &Module,
    elf: &ElfFile,
    probes: Vec<weft_symbols::UsdtProbe>,
    probe_index: usize,
    cx: &mut Cx<'_>,
    out: &mut Resolved,
) -> Result<()> {
    for p in probes {
        let args = p
            .args()
            .map_err(|e| anyhow!("{a}: {}:{}: {e}", p.provider, p.name))?;
        let usdt_args = args
            .iter()
            .map(|l| usdt_arg(l, elf, module.load_bias))
            .collect::<Vec<_>>();
        let site_addr = module.runtime_addr(p.pc);
        let func = match elf.function_at(p.pc) {
            Some(f) if f.size > 0 => weft_x86::FunctionCode {
                addr: module.runtime_addr(f.vaddr),
                bytes: elf
                    .read_vaddr(f.vaddr, f.size)
                    .map_err(|e| anyhow!("{e}"))?
                    .to_vec(),
                size_known: true,
                padding: Vec::new(),
            },
            // No function around it: only the probe's own instruction is known.
            _ => weft_x86::FunctionCode {
                addr: site_addr,
                bytes: elf
                    .read_vaddr(p.pc, 16)
                    .map_err(|e| anyhow!("{e}"))?
                    .to_vec(),
                size_known: false,
                padding: Vec::new(),
            },
        };
        let shown = super::shown_binary(target, module);
        let label = format!("usdt:{shown}:{}:{}", p.provider, p.name);
        let probe = cx.names.intern(label.clone());
        let fname = elf
            .function_at(p.pc)
            .map(|f| f.name().to_string())
            .unwrap_or_else(|| p.name.clone());
        let spec = out.sites.entry(site_addr).or_insert_with(|| SiteSpec {
            usdt_args: Some(usdt_args),
            semaphore: p.semaphore.map(|s| module.runtime_addr(s)),
            ..SiteSpec::new(func, fname, site_addr, label)
        });
        spec.entry.push(Call {
            advice: probe_index as u64,
            probe,
            body: Some(probe_index),
        });
    }
    Ok(())
}

/// The modules of `cx`'s process that `target` names: every one when it is empty,
/// else those whose path matches it as a pattern (a relative directory is taken
/// from the current one). weft's own agent is never one of them.
fn modules_matching(target: &str, cx: &Cx<'_>) -> Vec<Module> {
    let Some((_, modules)) = cx.target.process else {
        return Vec::new();
    };
    let (dir, file) = match target.rsplit_once('/') {
        Some((d, f)) => (Some(d), f),
        None => (None, target),
    };
    let dir = dir.map(|d| {
        let d = if d.is_empty() { "/" } else { d };
        std::fs::canonicalize(d).unwrap_or_else(|_| std::path::PathBuf::from(d))
    });
    let dir_glob = dir
        .as_ref()
        .map(|d| weft_symbols::glob::Glob::new(&d.display().to_string()));
    let file_glob = weft_symbols::glob::Glob::new(if file.is_empty() { "*" } else { file });
    modules
        .iter()
        .filter(|m| !m.file_name().starts_with("libweft_agent"))
        .filter(|m| file_glob.matches(m.file_name()))
        .filter(|m| match &dir_glob {
            None => true,
            Some(g) => m.path.parent().is_some_and(|p| {
                g.matches(&p.display().to_string())
                    || std::fs::canonicalize(p).is_ok_and(|c| g.matches(&c.display().to_string()))
            }),
        })
        .cloned()
        .collect()
}

/// A note's argument location as the code generator reads it.
fn usdt_arg(l: &weft_symbols::ArgLoc, elf: &weft_symbols::ElfFile, bias: u64) -> weft_jit::UsdtArg {
    use weft_symbols::ArgKind;
    match &l.kind {
        ArgKind::Reg(r) if !r.high_byte => weft_jit::UsdtArg::Reg {
            reg: r.reg,
            size: l.size,
            signed: l.signed,
        },
        // A constant has the width and sign of its spec (`4@$-202182160` is
        // 4092785136), as a register's value does.
        ArgKind::Imm(v) => weft_jit::UsdtArg::Imm(imm_of_width(*v, l.size, l.signed)),
        ArgKind::Mem {
            base,
            index,
            scale,
            disp,
        } => weft_jit::UsdtArg::Mem {
            base: base.as_ref().map(|r| r.reg),
            index: index.as_ref().map(|r| (r.reg, *scale)),
            disp: *disp,
            size: l.size,
            signed: l.signed,
        },
        ArgKind::RipRel { .. } => match l.static_address(elf) {
            Some(v) => weft_jit::UsdtArg::Mem {
                base: None,
                index: None,
                disp: v.wrapping_add(bias) as i64,
                size: l.size,
                signed: l.signed,
            },
            None => weft_jit::UsdtArg::Imm(0),
        },
        // ah/bh/ch/dh operands are rare; they read as zero.
        ArgKind::Reg(_) => weft_jit::UsdtArg::Imm(0),
    }
}

/// `v` cut to `size` bytes, sign- or zero-extended back to 64 bits.
fn imm_of_width(v: i64, size: u8, signed: bool) -> i64 {
    match (size, signed) {
        (1, true) => i64::from(v as i8),
        (1, false) => i64::from(v as u8),
        (2, true) => i64::from(v as i16),
        (2, false) => i64::from(v as u16),
        (4, true) => i64::from(v as i32),
        (4, false) => i64::from(v as u32),
        _ => v,
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn constants_take_their_specs_width() {
        use super::imm_of_width as w;
        assert_eq!(w(-202182160, 4, false), 4092785136);
        assert_eq!(w(-202182160, 4, true), -202182160);
        assert_eq!(w(-3600, 2, false), 61936);
        assert_eq!(w(-16, 1, false), 240);
        assert_eq!(w(-16, 1, true), -16);
        assert_eq!(w(-579005069656919568, 8, false), -579005069656919568);
    }
}
