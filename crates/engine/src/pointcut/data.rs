//! Data pointcuts (`set:`, `get:`, `watchpoint:`): the watched bytes in one
//! process, for the agent's hardware watchpoints or page protection (see
//! `crate::data`; `Member::prepare` picks the mechanism).
//!
//! `get` is a read-write watchpoint whose advice runs only when the value did not
//! change (x86 debug registers watch writes, or reads and writes, never reads
//! alone): a read-modify-write that changes the value counts as a write, and a
//! write of the same value as a read. `set:addr(@p, N)` has no address yet: weft
//! arms it when it sees `@p` hold one (`Session::bind_watches`); the advice that
//! stored the address waits for that (`weft_abi::Helper::WatchBind`), so no access
//! after the store is missed.

use anyhow::{anyhow, Result};
use weft_ir::{AttachPoint, DataAccess, DataPlace};
use weft_symbols::Module;
use weft_x86::{Access, FunctionCode};

use crate::weave::{Call, SiteSpec};

use super::{module_of, Cx, PointcutKind, Resolved};

/// One data pointcut in one process.
#[derive(Clone, Debug)]
pub struct WatchSpec {
    /// 0 while a `set:addr(@p, N)` map holds none.
    pub addr: u64,
    pub len: u32,
    /// `weft_abi::WATCH_*`.
    pub access: u32,
    /// `set:addr(@MAP, N)`: the map (its name with `@`).
    pub map: Option<String>,
    /// Probe name index.
    pub probe: u32,
    /// Index of the probe body in the program.
    pub body: usize,
    /// The attach point, for `-v`.
    pub label: String,
    /// Why a hardware watchpoint cannot take it (`None`: it can, or not known
    /// before the address is).
    pub fits_hw: Option<String>,
    /// The module holding the watched bytes (a variable's, or the one mapping a
    /// `watchpoint:` address): where instruction rewriting looks for accesses.
    pub module: Option<Module>,
}

pub struct Data;

impl PointcutKind for Data {
    fn handles(&self, a: &AttachPoint) -> bool {
        matches!(a, AttachPoint::Data { .. })
    }

    fn resolve(
        &self,
        a: &AttachPoint,
        probe_index: usize,
        name: u32,
        cx: &mut Cx<'_>,
        out: &mut Resolved,
    ) -> Result<()> {
        let AttachPoint::Data { place, access } = a else {
            return Ok(());
        };
        let access = match access {
            DataAccess::Write => weft_abi::WATCH_W,
            DataAccess::Read => weft_abi::WATCH_RW | weft_abi::WATCH_UNCHANGED_ONLY,
            DataAccess::ReadWrite => weft_abi::WATCH_RW,
        };
        let mut spec = WatchSpec {
            addr: 0,
            len: 0,
            access,
            map: None,
            probe: name,
            body: probe_index,
            label: a.to_string(),
            fits_hw: None,
            module: None,
        };
        match place {
            DataPlace::Var { target, var, path } => {
                let Some(module) = module_of(a, target, cx)? else {
                    return Ok(());
                };
                let elf = module.open().map_err(|e| anyhow!("{e}"))?;
                let f =
                    crate::data::find_variable(&elf, var, path).map_err(|e| anyhow!("{a}: {e}"))?;
                spec.fits_hw = crate::data::check_size(f.vaddr, f.size, var, path).err();
                spec.addr = module.runtime_addr(f.vaddr);
                spec.len = f.size;
                spec.module = Some(module);
            }
            DataPlace::Map { map, size } => {
                spec.len = *size;
                spec.map = Some(map.clone());
                if !matches!(spec.len, 1 | 2 | 4 | 8) {
                    spec.fits_hw = Some(format!(
                        "{} bytes: a hardware watchpoint watches 1, 2, 4 or 8",
                        spec.len
                    ));
                }
            }
            DataPlace::Addr { addr, len } => {
                spec.addr = *addr;
                spec.len = u32::from(*len);
                spec.fits_hw =
                    crate::data::check_size(*addr, spec.len, &format!("{addr:#x}"), "").err();
                spec.module = cx.maps.modules().into_iter().find(|m| m.contains(*addr));
            }
        }
        if out.watches.len() == weft_abi::MAX_WATCHES {
            anyhow::bail!(
                "{a}: at most {} data pointcuts per program",
                weft_abi::MAX_WATCHES
            );
        }
        out.watches.push(spec);
        Ok(())
    }
}

/// What instruction rewriting finds for one watch: the sites to weave and what it
/// cannot see.
#[derive(Debug, Default)]
pub struct AccessSites {
    /// A site per instruction that names the watched bytes and makes the watched
    /// access (`set`: a write, `get`: a read that does not write, `rw`: any), with
    /// the instruction (its `refused` says why it cannot be woven).
    pub sites: Vec<(SiteSpec, Access)>,
    /// Instructions taking the bytes' address (`lea`): what is reached through the
    /// pointer is not seen.
    pub address_taken: usize,
    /// Indexed accesses on the variable's address (`[var+rax*8]`): not rewritten.
    pub indexed: usize,
}

/// The access sites of watch `w` (advice `advice`) in its module: every sized
/// function of the file decoded, at run-time addresses.
pub fn access_sites(w: &WatchSpec, module: &Module, advice: u64) -> Result<AccessSites> {
    let elf = module.open().map_err(|e| anyhow!("{e}"))?;
    let bias = module.load_bias;
    let (lo, hi) = (w.addr, w.addr + u64::from(w.len.max(1)));
    let mut out = AccessSites::default();
    let mut seen = std::collections::HashSet::new();
    for f in elf.functions().iter().filter(|f| f.size > 0 && !f.ifunc) {
        if !seen.insert(f.vaddr) {
            continue;
        }
        let Ok(bytes) = elf.read_vaddr(f.vaddr, f.size) else {
            continue;
        };
        let code = FunctionCode {
            addr: f.vaddr.wrapping_add(bias),
            bytes: bytes.to_vec(),
            size_known: true,
            padding: Vec::new(),
        };
        let scan = weft_x86::scan_accesses(&code, lo, hi);
        out.address_taken += scan.address_taken;
        out.indexed += scan.indexed;
        let name = f.display_name().to_string();
        for acc in scan.accesses {
            let wanted = if w.access & weft_abi::WATCH_UNCHANGED_ONLY != 0 {
                !acc.kind.writes()
            } else if w.access & 0xff == weft_abi::WATCH_RW {
                true
            } else {
                acc.kind.writes()
            };
            if !wanted {
                continue;
            }
            let label = format!(
                "{}: {} `{}` in {name}+{:#x}",
                w.label,
                acc.kind.name(),
                acc.text,
                acc.addr - code.addr
            );
            out.sites.push((
                SiteSpec {
                    func: code.clone(),
                    name: name.clone(),
                    site_addr: acc.addr,
                    entry: vec![Call {
                        advice,
                        probe: w.probe,
                        body: Some(w.body),
                    }],
                    ret: Vec::new(),
                    around: None,
                    label,
                    usdt_args: None,
                    semaphore: None,
                    stub_of: None,
                    call: None,
                },
                acc,
            ));
        }
    }
    Ok(out)
}
