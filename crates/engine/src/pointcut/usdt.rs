//! `usdt:BIN:PROVIDER:NAME`: each probe's NOP (a `sys/sdt.h` or `weft.h` note),
//! planned inside the function that contains it; the note's argument locations
//! become the advice's `argN`, and a probe's semaphore is raised while it is woven.

use anyhow::{anyhow, Result};
use weft_ir::AttachPoint;

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
        let Some(module) = module_of(a, target, cx)? else {
            return Ok(());
        };
        let elf = module.open().map_err(|e| anyhow!("{e}"))?;
        let probes =
            weft_symbols::resolve_usdt(&elf, provider, name).map_err(|e| anyhow!("{e}"))?;
        for p in probes {
            let args = p
                .args()
                .map_err(|e| anyhow!("{a}: {}:{}: {e}", p.provider, p.name))?;
            let usdt_args = args
                .iter()
                .map(|l| usdt_arg(l, &elf, module.load_bias))
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
            let shown = super::shown_binary(target, &module);
            let label = format!("usdt:{shown}:{}:{}", p.provider, p.name);
            let probe = cx.names.intern(label.clone());
            let fname = elf
                .function_at(p.pc)
                .map(|f| f.name().to_string())
                .unwrap_or_else(|| p.name.clone());
            let spec = out.sites.entry(site_addr).or_insert_with(|| SiteSpec {
                func,
                name: fname,
                site_addr,
                entry: Vec::new(),
                ret: Vec::new(),
                around: None,
                label,
                usdt_args: Some(usdt_args),
                semaphore: p.semaphore.map(|s| module.runtime_addr(s)),
                call: None,
            });
            spec.entry.push(Call {
                advice: probe_index as u64,
                probe,
                body: Some(probe_index),
            });
        }
        Ok(())
    }
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
        ArgKind::Imm(v) => weft_jit::UsdtArg::Imm(*v),
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
