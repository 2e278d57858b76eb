//! Pointcut kinds: each resolves its attach points against one process into sites
//! (or, for `profile`, sampled advice). One resolver per kind, behind
//! [`PointcutKind`]; adding a kind is a new file here and an entry in [`KINDS`],
//! not a change to the session.

mod call;
mod data;
mod internal;
mod line;
mod profile;
mod uprobe;
mod usdt;

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Result;
use weft_ir::{AttachPoint, Program};
use weft_symbols::{ElfFile, Module, ProcMaps, TargetContext, WeftProbeSite};

use crate::weave::SiteSpec;

pub use call::CallFound;
pub use data::{access_sites, AccessSites, WatchSpec};
pub use internal::{sigaction_redirect, unwind_hooks};

/// A `profile:hz:N` probe: its advice is sampled by the agent's timers.
#[derive(Clone, Copy, Debug)]
pub struct ProfileSpec {
    pub hz: u32,
    /// Probe name index.
    pub probe: u32,
    /// Index of the probe body in the program.
    pub body: usize,
}

/// What the attach points of a program resolve to in one process.
#[derive(Debug, Default)]
pub struct Resolved {
    /// Sites by address (one site may carry several probes' advice). The `advice`
    /// field of each `Call` holds the probe index until advice is compiled.
    pub sites: BTreeMap<u64, SiteSpec>,
    /// Call sites (`call:`) by address, apart from `sites`: a call site's patch is
    /// its own instruction, woven after the other sites, never merged with a probe
    /// whose site has the same address.
    pub calls: BTreeMap<u64, SiteSpec>,
    /// What each `call:` attach point found, for the report.
    pub calls_found: Vec<CallFound>,
    pub profiles: Vec<ProfileSpec>,
    /// Data pointcuts (hardware watchpoints).
    pub watches: Vec<WatchSpec>,
}

/// What a resolver works with.
pub struct Cx<'a> {
    pub prog: &'a Program,
    pub pid: i32,
    pub maps: &'a ProcMaps,
    pub target: TargetContext<'a>,
    pub names: &'a mut ProbeNames,
    /// A coldpatched binary's file and placeholders by function address, read once
    /// per module (a whole-program weave looks up 10,000 functions).
    pub placeholders: HashMap<PathBuf, Placeholders>,
    /// A probe on a file this process does not map has no site here, and that is
    /// no error (a session that follows children: another process may map it).
    pub lenient: bool,
}

/// A module's file (if it has a probe list) and its placeholders by function vaddr.
pub type Placeholders = (Option<Arc<ElfFile>>, HashMap<u64, Vec<WeftProbeSite>>);

/// One kind of pointcut.
pub trait PointcutKind: Sync {
    /// Whether `a` is of this kind.
    fn handles(&self, a: &AttachPoint) -> bool;
    /// Add what `a` (an attach point of probe `probe_index`, named by the program's
    /// probe name `name`) resolves to in the process of `cx` to `out`.
    fn resolve(
        &self,
        a: &AttachPoint,
        probe_index: usize,
        name: u32,
        cx: &mut Cx<'_>,
        out: &mut Resolved,
    ) -> Result<()>;
}

/// Every kind of pointcut that runs in a target process.
pub static KINDS: &[&dyn PointcutKind] = &[
    &uprobe::Uprobe,
    &line::SourceLine,
    &call::CallSites,
    &usdt::Usdt,
    &profile::Profile,
    &data::Data,
];

/// Resolve the attach points of `prog`'s probes that `select` picks (by index) and
/// that run in a target against process `pid`.
pub fn resolve(
    prog: &Program,
    maps: &ProcMaps,
    pid: i32,
    names: &mut ProbeNames,
    select: &dyn Fn(usize) -> bool,
    lenient: bool,
) -> Result<Resolved> {
    let modules = maps.modules();
    let search = weft_symbols::LibrarySearch::system();
    let mut cx = Cx {
        prog,
        pid,
        maps,
        target: TargetContext {
            process: Some((pid as u32, &modules)),
            executable: None,
            search: &search,
        },
        names,
        placeholders: HashMap::new(),
        lenient,
    };
    let mut out = Resolved::default();
    for ((pi, p), names) in prog
        .probes
        .iter()
        .enumerate()
        .zip(attach_name_indices(prog))
    {
        if !select(pi) {
            continue;
        }
        for (a, name) in p.attach.iter().zip(names) {
            if let Some(kind) = KINDS.iter().find(|k| k.handles(a)) {
                kind.resolve(a, pi, name, &mut cx, &mut out)?;
            }
        }
    }
    Ok(out)
}

/// Resolves [`weft_ir::SymbolRef`]s (`uaddr`, the code ranges of `cflow_strict`) in
/// one process, for the code generator ([`weft_jit::Env::symbol`]).
pub struct Symbols<'a> {
    pub prog: &'a Program,
    pub modules: &'a [Module],
    pub pid: i32,
    /// A binary the process does not map is no error (a session over several
    /// processes): its symbols are at 0, an empty range.
    pub lenient: bool,
}

impl Symbols<'_> {
    /// The address of `s` (or its end) for advice of probe `probe`: in the binary
    /// `s` names, else in the binary of the probe's first function or USDT attach
    /// point, else in the program (the first module).
    pub fn address(&self, probe: usize, s: &weft_ir::SymbolRef) -> Option<u64> {
        let own = || {
            self.prog
                .probes
                .get(probe)?
                .attach
                .iter()
                .find_map(|a| match a {
                    AttachPoint::Uprobe { target, .. }
                    | AttachPoint::SourceLine { target, .. }
                    | AttachPoint::Uretprobe { target, .. }
                    | AttachPoint::Usdt { target, .. } => Some(target.clone()),
                    _ => None,
                })
        };
        let spec = s.module.clone().or_else(own).unwrap_or_default();
        let module = if spec.is_empty() {
            self.modules.first().cloned()
        } else {
            let search = weft_symbols::LibrarySearch::system();
            let cx = TargetContext {
                process: Some((self.pid as u32, self.modules)),
                executable: None,
                search: &search,
            };
            weft_symbols::resolve_target(&spec, &cx)
                .ok()
                .and_then(|t| t.module)
        };
        let Some(module) = module else {
            return (self.lenient && s.module.is_some()).then_some(0);
        };
        let (start, size) = match weft_symbols::resolve_in_module(&module, &s.name)
            .ok()
            .and_then(|fs| fs.into_iter().find(|f| f.runtime_addr.is_some()))
        {
            Some(f) => (f.runtime_addr?, f.size),
            // A global variable (`uaddr("GLOBAL_A")`): a data object of the file.
            None => {
                let (vaddr, size) = module.open().ok()?.object(&s.name)?;
                (module.runtime_addr(vaddr), size)
            }
        };
        Some(if s.end { start + size } else { start })
    }
}

/// The module a probe's target names, in the process of `cx`; `None` if the process
/// does not map it and `cx` is lenient.
/// The binary as a probe's name shows it (`probe`, `-v`): a path as the user wrote
/// it (`uprobe:./app:parse`, as bpftrace prints it), else the file a library name or
/// a wildcard resolved to.
/// A site at `site_addr` in `f`, which runs at `addr`, with no advice yet.
fn function_site(
    f: &weft_symbols::ResolvedFunction,
    addr: u64,
    site_addr: u64,
    label: &str,
) -> SiteSpec {
    SiteSpec::new(
        weft_x86::FunctionCode {
            addr,
            bytes: f.bytes.clone(),
            size_known: f.size > 0,
            padding: f.padding.clone(),
        },
        f.demangled.clone().unwrap_or_else(|| f.name.clone()),
        site_addr,
        label.to_string(),
    )
}

fn shown_binary(spec: &str, module: &Module) -> String {
    if spec.contains('/') && !weft_symbols::glob::has_wildcards(spec) {
        spec.to_string()
    } else {
        module.path.display().to_string()
    }
}

fn module_of(a: &AttachPoint, target: &str, cx: &Cx<'_>) -> Result<Option<Module>> {
    let t = match weft_symbols::resolve_target(target, &cx.target) {
        Ok(t) => t,
        // Not in this process; another may map it (a file that exists, or a
        // library name).
        Err(weft_symbols::Error::TargetNotFound { .. })
            if cx.lenient && (!target.contains('/') || std::path::Path::new(target).is_file()) =>
        {
            return Ok(None)
        }
        Err(e) => anyhow::bail!("{a}: {e}"),
    };
    match t.module {
        Some(m) => Ok(Some(m)),
        None if cx.lenient => Ok(None),
        None => anyhow::bail!(
            "{a}: {} is not mapped in process {}",
            t.path.display(),
            cx.pid
        ),
    }
}

/// For each probe, the indices in `prog.probe_names` of its attach points: the
/// front end names them as written, in source order, one per attach point.
pub fn attach_name_indices(prog: &Program) -> Vec<Vec<u32>> {
    let mut k = 0u32;
    prog.probes
        .iter()
        .map(|p| {
            p.attach
                .iter()
                .map(|_| {
                    k += 1;
                    k - 1
                })
                .collect()
        })
        .collect()
}

/// Probe names with their indices (the program's, then one per expanded site).
#[derive(Clone, Debug, Default)]
pub struct ProbeNames {
    pub names: Vec<String>,
    index: HashMap<String, u32>,
}

impl ProbeNames {
    /// The program's own names keep their positions (its code refers to them).
    pub fn new(initial: &[String]) -> ProbeNames {
        let mut index = HashMap::new();
        for (i, n) in initial.iter().enumerate() {
            index.entry(n.clone()).or_insert(i as u32);
        }
        ProbeNames {
            names: initial.to_vec(),
            index,
        }
    }

    /// The index of `s`, added if new.
    pub fn intern(&mut self, s: String) -> u32 {
        if let Some(&i) = self.index.get(&s) {
            return i;
        }
        let i = self.names.len() as u32;
        self.index.insert(s.clone(), i);
        self.names.push(s);
        i
    }
}
