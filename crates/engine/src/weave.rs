//! Planning sites and writing their code: trampolines, int3 resume stubs and
//! compiled advice go into code regions the agent mapped near the probed code;
//! each site gets an entry in the shared site table with its original and patched
//! bytes. Nothing here touches the target's code: `patch` does, with the world
//! stopped.

use std::fmt;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::Ordering;

use anyhow::{anyhow, bail, Context, Result};
use weft_abi::{SiteKind, SITE_MAX_BYTES, SITE_NAME_LEN, SITE_UNUSED};
use weft_jit::trampoline::{entry_head, multi_call, EntryTrampoline};
use weft_runtime::shm::Shm;
use weft_x86::{FunctionCode, SitePlan};

use crate::conn::Agent;

/// A code region: RX in the target, mapped RW here.
pub struct CodeRegion {
    pub addr: u64,
    pub size: u64,
    used: u64,
    map: *mut u8,
    _fd: OwnedFd,
}

impl CodeRegion {
    pub fn map(addr: u64, size: u64, fd: OwnedFd) -> Result<CodeRegion> {
        // SAFETY: mapping the agent's memfd shared read-write in our process.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                size as usize,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error()).context("mapping a code region");
        }
        Ok(CodeRegion {
            addr,
            size,
            used: 0,
            map: p as *mut u8,
            _fd: fd,
        })
    }

    /// Copy `code` into the region (16-aligned); its address in the target.
    pub fn put(&mut self, code: &[u8]) -> Option<u64> {
        let at = self.used.div_ceil(16) * 16;
        if at + code.len() as u64 > self.size {
            return None;
        }
        // SAFETY: [at, at+len) lies inside our RW mapping of the region.
        unsafe {
            std::ptr::copy_nonoverlapping(code.as_ptr(), self.map.add(at as usize), code.len())
        };
        self.used = at + code.len() as u64;
        Some(self.addr + at)
    }

    /// Address the next `put` would use (for code that depends on its address).
    pub fn next_addr(&self) -> u64 {
        self.addr + self.used.div_ceil(16) * 16
    }

    pub fn contains(&self, addr: u64) -> bool {
        addr >= self.addr && addr < self.addr + self.size
    }
}

impl Drop for CodeRegion {
    fn drop(&mut self) {
        // SAFETY: our own mapping.
        unsafe { libc::munmap(self.map as *mut _, self.size as usize) };
    }
}

/// One advice call at a site: compiled advice address and probe name index.
#[derive(Clone, Copy, Debug)]
pub struct Call {
    pub advice: u64,
    pub probe: u32,
    /// Index of the probe body in the program (None for the agent's own advice);
    /// simple bodies are compiled inline into the trampoline.
    pub body: Option<usize>,
}

/// Where a USDT site's arguments are (the note's argument string), for `argN`.
pub type UsdtArgs = Vec<weft_jit::UsdtArg>;

/// A call site (`call:` probes): the branch to rewrite and the function it calls.
#[derive(Clone, Debug)]
pub struct CallSpec {
    /// The `call`/`jmp`/`jcc rel32` to the callee (or its PLT entry), at run-time
    /// addresses.
    pub site: weft_x86::CallSite,
    /// The callee's address as advice reports it (`func`): its definition, also for a
    /// library function called through the PLT.
    pub func: u64,
}

/// A site to weave: a function (bytes from its file), the address to patch, and
/// the advice for its entry and its return.
#[derive(Clone, Debug)]
pub struct SiteSpec {
    pub func: FunctionCode,
    pub name: String,
    pub site_addr: u64,
    pub entry: Vec<Call>,
    pub ret: Vec<Call>,
    /// Around advice (at most one per function): runs after the entry advice and
    /// decides whether and how the function runs.
    pub around: Option<Call>,
    /// Shown in `-v` output (`uprobe:/bin/app:main`).
    pub label: String,
    /// A USDT site: its arguments (its advice is compiled for this site alone).
    pub usdt_args: Option<UsdtArgs>,
    /// A USDT semaphore to increment while the site is patched.
    pub semaphore: Option<u64>,
    /// A call site: `func` is the calling function (its name is what `caller`
    /// reads), `site_addr` the branch; woven by [`Weaver::call_site`].
    pub call: Option<CallSpec>,
    /// A placeholder in a `weft prepare` stub (outside the function, which jumps to
    /// it): `func` is the placeholder alone, and this is the function's own run-time
    /// address, what advice reports as the function.
    pub stub_of: Option<u64>,
}

impl SiteSpec {
    /// A site of `func` (named `name`) at `site_addr`, with no advice yet.
    pub fn new(func: FunctionCode, name: String, site_addr: u64, label: String) -> SiteSpec {
        SiteSpec {
            func,
            name,
            site_addr,
            entry: Vec::new(),
            ret: Vec::new(),
            around: None,
            label,
            usdt_args: None,
            semaphore: None,
            call: None,
            stub_of: None,
        }
    }

    /// The function's address as advice and the site table report it.
    pub fn func_addr(&self) -> u64 {
        self.stub_of.unwrap_or(self.func.addr)
    }
}

/// What an access site's trampoline reads and may write: the watched bytes.
#[derive(Clone, Copy, Debug)]
pub struct AccessSpec {
    /// Run-time address of the watched bytes.
    pub var: u64,
    /// How many of them `old` and `new` cover (1, 2, 4 or 8; fewer than the
    /// variable's size for a larger one: its first 8 bytes).
    pub size: u32,
    /// Write `new` back when the advice changed it (`new = EXPR`).
    pub write_back: bool,
}

/// Label prefix of the agent's internal sites (the unwinder hooks).
pub const INTERNAL: &str = "(internal) ";

/// True for the agent's internal sites: their advice runs on every thread, with or
/// without a session, and they stay woven until no hijacked frame is left.
pub fn is_internal(label: &str) -> bool {
    label.starts_with(INTERNAL)
}

/// How a site was woven, for `-v` and for patching.
#[derive(Clone, Debug)]
pub enum Outcome {
    Jump,
    /// A jump to a trampoline with the advice compiled inline.
    JumpInline,
    /// A jump written over a NOP placeholder (no code of the program moves); true
    /// when the advice is inline.
    Placeholder(bool),
    /// A call site's branch retargeted to a stub (nothing relocated).
    CallStub,
    /// The same, with the advice compiled inline into the stub.
    CallStubInline,
    /// A `ret` (with the instructions before it, or the padding after it) replaced
    /// by a jump to a trampoline that runs them, the return advice and the `ret`;
    /// true when the advice is inline.
    Return(bool),
    /// An access site (a data pointcut by instruction rewriting): the access
    /// instruction replaced by a jump to a trampoline that reads the value before,
    /// runs the access, reads it after and runs the advice.
    AccessSite,
    Int3(String),
    Skipped(String),
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Outcome::Jump => write!(f, "jump to trampoline"),
            Outcome::JumpInline => write!(f, "jump to trampoline (advice inline)"),
            Outcome::Placeholder(false) => write!(f, "jump over a NOP placeholder"),
            Outcome::Placeholder(true) => write!(f, "jump over a NOP placeholder (advice inline)"),
            Outcome::CallStub => write!(f, "branch retargeted to a stub"),
            Outcome::CallStubInline => write!(f, "branch retargeted to a stub (advice inline)"),
            Outcome::Return(false) => write!(f, "return site: jump to trampoline"),
            Outcome::Return(true) => write!(f, "return site: jump to trampoline (advice inline)"),
            Outcome::AccessSite => write!(f, "access site: jump to trampoline"),
            Outcome::Int3(r) => write!(f, "int3 ({r})"),
            Outcome::Skipped(r) => write!(f, "skipped: {r}"),
        }
    }
}

/// A site ready to patch.
#[derive(Clone, Debug)]
pub struct Planned {
    pub index: u32,
    pub addr: u64,
    pub orig: Vec<u8>,
    pub patch: Vec<u8>,
    pub label: String,
    pub outcome: Outcome,
    /// USDT semaphore incremented while patched.
    pub semaphore: Option<u64>,
    /// The patch replaces one instruction: it can be written while the process
    /// runs (the agent's int3-first sequence), not only with it stopped.
    pub atomic: bool,
}

impl Planned {
    /// A site the planner refused: reported, never patched.
    pub(crate) fn refused(spec: &SiteSpec, reason: &impl std::fmt::Display) -> Planned {
        Planned {
            index: u32::MAX,
            addr: spec.site_addr,
            orig: vec![],
            patch: vec![],
            label: spec.label.clone(),
            outcome: Outcome::Skipped(reason.to_string()),
            semaphore: None,
            atomic: false,
        }
    }
}

/// What a planned site's descriptor holds, before it is published.
struct Filled {
    kind: SiteKind,
    patch_addr: u64,
    /// The function advice reports (`func`).
    func: u64,
    /// The patch replaces one instruction (see [`Planned::atomic`]).
    atomic: bool,
    orig: Vec<u8>,
    patch: Vec<u8>,
    entry_advice: u64,
    return_advice: u64,
    return_stub: u64,
    resume: u64,
    entry_probe: u32,
    return_probe: u32,
    semaphore: Option<u64>,
}

/// What [`Weaver::heads`] needs to know of a site besides its spec.
struct Head {
    index: u32,
    /// The address advice sees as `reg("ip")`.
    reported_ip: u64,
    /// The function advice sees as `func`.
    func: u64,
    at_entry: bool,
    thread_attach: u64,
    /// Return advice, its inline stub and its probe (for the hijack).
    ret: (u64, u64, u32),
    entry_probe: u32,
}

/// Rough bytes per site (trampoline head + relocated code + a stub).
pub const SITE_CODE_ESTIMATE: u64 = 1280;

pub struct Weaver<'a> {
    pub agent: &'a Agent,
    pub shm: &'a Shm,
    /// Where the agent mapped the segment in the target.
    pub shm_base_in_target: u64,
    /// The agent's generation number for this session (return probes check it).
    pub generation: u32,
    pub prog: &'a weft_ir::Program,
    pub maps: &'a [weft_jit::MapLayout],
    pub thread_agg_off: u64,
    /// Compile simple advice into trampolines (`--no-inline` turns it off).
    pub inline: bool,
    pub regions: Vec<CodeRegion>,
    /// The site space of the process woven into (recorded in each site).
    pub space: u32,
    /// Resolves the symbols of probe `i`'s advice (`uaddr`, `cflow_strict`'s code
    /// ranges) for inline code; without it, advice with symbols is not inlined.
    pub symbols: Option<&'a SymbolResolver<'a>>,
    /// Put return probes on the functions' `ret`s where every exit is one
    /// (`WEFT_RETURN_SITES=0` keeps the hijack everywhere, for comparison).
    pub ret_sites: bool,
    /// Why sites were woven as they were, beyond each site's outcome (`-v`).
    pub notes: Vec<String>,
}

/// Resolves a symbol of probe `i`'s advice in the process woven into.
pub type SymbolResolver<'a> = dyn Fn(usize, &weft_ir::SymbolRef) -> Option<u64> + 'a;

/// One body of a site's inline code: its function, probe name index and probe.
type InlineBody<'a> = (&'a weft_ir::Function, u32, usize);

/// Run `f` with the [`weft_jit::inline::Body`]s of `list`, each resolving its
/// symbols with `symbols`.
fn with_bodies<T>(
    list: &[InlineBody<'_>],
    symbols: Option<&SymbolResolver<'_>>,
    f: impl FnOnce(&[weft_jit::inline::Body<'_>]) -> T,
) -> T {
    let resolvers: Vec<_> = list
        .iter()
        .map(|&(_, _, i)| move |s: &weft_ir::SymbolRef| symbols.and_then(|r| r(i, s)))
        .collect();
    let bodies: Vec<weft_jit::inline::Body<'_>> = list
        .iter()
        .zip(&resolvers)
        .map(|(&(f, probe, _), symbol)| weft_jit::inline::Body { f, probe, symbol })
        .collect();
    f(&bodies)
}

const TWO_GIB: u64 = 1 << 31;
const MARGIN: u64 = 1 << 24;

impl<'a> Weaver<'a> {
    pub fn new(
        agent: &'a Agent,
        seg: &'a crate::segment::Segment,
        prog: &'a weft_ir::Program,
        shm_base_in_target: u64,
        generation: u32,
    ) -> Weaver<'a> {
        Weaver {
            agent,
            shm: &seg.shm,
            shm_base_in_target,
            generation,
            prog,
            maps: &seg.maps,
            thread_agg_off: seg.layout.agg_off,
            inline: true,
            regions: Vec::new(),
            space: 0,
            symbols: None,
            ret_sites: std::env::var_os("WEFT_RETURN_SITES").is_none_or(|v| v != "0"),
            notes: Vec::new(),
        }
    }

    /// The entry advice bodies to inline at a site, in order, if the site
    /// qualifies: a function entry, and every entry advice simple enough.
    fn inline_bodies(&self, spec: &SiteSpec, at_entry: bool) -> Option<Vec<InlineBody<'a>>> {
        // Return probes need the entry (the hijack); USDT arguments are not in the
        // ABI registers.
        if !self.inline
            || spec.around.is_some()
            || (!at_entry && !spec.ret.is_empty())
            || spec.usdt_args.is_some()
        {
            return None;
        }
        self.simple_bodies(&spec.entry, weft_jit::inline::eligible)
    }

    /// The bodies of `calls` when each is simple enough (`eligible`).
    fn simple_bodies(
        &self,
        calls: &[Call],
        eligible: fn(&weft_ir::Function, &[weft_jit::MapLayout], weft_jit::inline::Caps) -> bool,
    ) -> Option<Vec<InlineBody<'a>>> {
        calls
            .iter()
            .map(|c| {
                let i = c.body?;
                let f = &self.prog.probes.get(i)?.body;
                let symbols = f
                    .code
                    .iter()
                    .any(|x| matches!(x, weft_ir::Inst::SymbolAddr { .. }));
                (eligible(f, self.maps, self.caps()) && (!symbols || self.symbols.is_some()))
                    .then_some((f, c.probe, i))
            })
            .collect()
    }

    /// Ask the agent for a region within ±2 GiB of every address in `[lo, hi]`.
    pub fn region_near(&mut self, lo: u64, hi: u64, size: u64) -> Result<usize> {
        let want_lo = hi.saturating_sub(TWO_GIB - MARGIN);
        let want_hi = lo.saturating_add(TWO_GIB - MARGIN);
        let (addr, got, fd) = self.agent.alloc_code(want_lo, want_hi, size)?;
        self.regions.push(CodeRegion::map(addr, got, fd)?);
        Ok(self.regions.len() - 1)
    }

    /// Put position-independent code (advice) in any region, making one if needed.
    pub fn put_anywhere(&mut self, code: &[u8]) -> Result<u64> {
        for r in &mut self.regions {
            if let Some(a) = r.put(code) {
                return Ok(a);
            }
        }
        let size = (code.len() as u64 + 4096).max(1 << 20);
        let (addr, got, fd) = self.agent.alloc_code(0x10000, 0x7fff_0000_0000, size)?;
        let mut r = CodeRegion::map(addr, got, fd)?;
        let a = r
            .put(code)
            .ok_or_else(|| anyhow!("advice of {} bytes does not fit a code region", code.len()))?;
        self.regions.push(r);
        Ok(a)
    }

    fn region_for(&mut self, addr: u64, need: u64) -> Result<usize> {
        for (i, r) in self.regions.iter().enumerate() {
            let near = r.addr.abs_diff(addr) < TWO_GIB - MARGIN
                && (r.addr + r.size).abs_diff(addr) < TWO_GIB - MARGIN;
            if near && r.next_addr() + need <= r.addr + r.size {
                return Ok(i);
            }
        }
        self.region_near(addr, addr, (need * 64).max(1 << 20))
    }

    /// Plan and write the code of one site; record it in the site table.
    /// Plans, compiles and publishes one site; `others` are the addresses of the
    /// process's other sites (woven or being woven), which a jump must not cover.
    /// Return probes go on the function's `ret`s where every exit is one (see
    /// [`weft_x86::return_sites`]): those sites come first, then the entry's (none
    /// when it has no advice of its own and no `ret`).
    pub fn site(
        &mut self,
        spec: &SiteSpec,
        thread_attach: u64,
        others: &[u64],
    ) -> Result<Vec<Planned>> {
        let plan = weft_x86::plan_site_among(&spec.func, spec.site_addr, others);
        let (patch_addr, skipped_endbr) = match &plan {
            SitePlan::Refused { reason } => return Ok(vec![Planned::refused(spec, reason)]),
            SitePlan::Jump {
                patch_addr,
                skipped_endbr,
                ..
            }
            | SitePlan::Int3 {
                patch_addr,
                skipped_endbr,
                ..
            } => (*patch_addr, *skipped_endbr),
        };
        let at_entry =
            spec.site_addr == spec.func.addr && (patch_addr == spec.func.addr || skipped_endbr);
        // What advice sees as the probe's address: the function's, also when the
        // patch went after its endbr64 (as a uprobe at the function reports it).
        let reported_ip = if at_entry { spec.func.addr } else { patch_addr };
        if !spec.ret.is_empty() && !at_entry {
            bail!("{}: return probes need the function's entry", spec.label);
        }
        if spec.around.is_some() {
            if let SitePlan::Int3 { reason, .. } = &plan {
                bail!(
                    "{}: around advice needs a jump at the function's entry, and {} cannot have one ({reason})",
                    spec.label,
                    spec.name
                );
            }
            if !at_entry {
                bail!("{}: around advice needs the function's entry", spec.label);
            }
        }
        let mut planned = Vec::new();
        let returns = self.return_sites(spec, &plan, at_entry, others);
        let without_ret;
        let (spec, in_entry) = match &returns {
            Some(r) => {
                for w in &r.sites {
                    planned.push(self.ret_site(spec, w, thread_attach)?);
                }
                if spec.entry.is_empty() && r.in_entry.is_none() {
                    return Ok(planned);
                }
                without_ret = SiteSpec {
                    ret: Vec::new(),
                    ..spec.clone()
                };
                (&without_ret, r.in_entry.map(|ret| (ret, spec)))
            }
            None => (spec, None),
        };
        let index = self.next_site_index()?;
        let ri = self.region_for(patch_addr, SITE_CODE_ESTIMATE)?;
        let ret_advice = match spec.ret.len() {
            0 => 0,
            1 => spec.ret[0].advice,
            _ => {
                let calls: Vec<(u64, u32)> = spec.ret.iter().map(|c| (c.advice, c.probe)).collect();
                self.put_anywhere(&multi_call(&calls)?)?
            }
        };
        let ret_probe = spec.ret.first().map_or(0, |c| c.probe);
        let entry_probe = spec.entry.first().map_or(0, |c| c.probe);
        let ret_stub = self.return_stub(spec, index, patch_addr)?;
        let (kind, patch, orig, resume, entry_advice, outcome) = match &plan {
            SitePlan::Jump { .. } => {
                let head = Head {
                    index,
                    reported_ip,
                    func: spec.func_addr(),
                    at_entry,
                    thread_attach,
                    ret: (ret_advice, ret_stub, ret_probe),
                    entry_probe,
                };
                // A whole short function displaced: its `ret` runs in the tail, with
                // the return advice before it.
                let ret_parts = match in_entry {
                    Some((ret, full)) => {
                        Some(self.ret_parts(ri, full, index, ret, thread_attach)?)
                    }
                    None => None,
                };
                let ctx = self.tail_context();
                let relocated = |at: u64| match &ret_parts {
                    Some(parts) => ret_tail(&ctx, &plan, parts, at),
                    None => weft_x86::relocate(&plan, at, true)
                        .with_context(|| format!("{}: relocating the prologue", spec.label)),
                };
                let (target, resume, inline) = match &ret_parts {
                    Some(parts) if spec.entry.is_empty() => {
                        let region = &mut self.regions[ri];
                        let code = relocated(region.next_addr())?;
                        let at = region
                            .put(&code)
                            .ok_or_else(|| anyhow!("code region full"))?;
                        (at, at, parts.inline.is_some())
                    }
                    _ => self.heads(ri, spec, &head, &relocated)?,
                };
                let patch = weft_x86::patch_bytes(&plan, target)?;
                let outcome = match (plan.is_placeholder(), inline) {
                    (true, inline) => Outcome::Placeholder(inline),
                    (false, false) => Outcome::Jump,
                    (false, true) => Outcome::JumpInline,
                };
                (
                    SiteKind::Jump,
                    patch,
                    plan.original_bytes().to_vec(),
                    resume,
                    0,
                    outcome,
                )
            }
            SitePlan::Int3 { reason, .. } => {
                let region = &mut self.regions[ri];
                let stub_at = region.next_addr();
                let stub = weft_x86::relocate(&plan, stub_at, true).with_context(|| {
                    format!("{}: relocating the displaced instruction", spec.label)
                })?;
                let at = region
                    .put(&stub)
                    .ok_or_else(|| anyhow!("code region full"))?;
                let entry = match spec.entry.len() {
                    0 => 0,
                    1 => spec.entry[0].advice,
                    _ => {
                        let calls: Vec<(u64, u32)> =
                            spec.entry.iter().map(|c| (c.advice, c.probe)).collect();
                        self.put_anywhere(&multi_call(&calls)?)?
                    }
                };
                let orig = plan.original_bytes()[..1].to_vec();
                (
                    SiteKind::Int3,
                    vec![weft_x86::INT3],
                    orig,
                    at,
                    entry,
                    Outcome::Int3(reason.to_string()),
                )
            }
            SitePlan::Refused { .. } => unreachable!("handled above"),
        };
        planned.push(self.publish(
            index,
            spec,
            Filled {
                kind,
                patch_addr,
                func: spec.func_addr(),
                atomic: plan.single_instruction(),
                orig,
                patch,
                entry_advice,
                return_advice: ret_advice,
                return_stub: ret_stub,
                resume,
                entry_probe,
                return_probe: ret_probe,
                semaphore: spec.semaphore,
            },
            outcome,
        )?);
        Ok(planned)
    }

    /// The return sites of `spec`'s function, when its return probes may use them
    /// instead of the hijack (`-v` says why not, when not).
    fn return_sites(
        &mut self,
        spec: &SiteSpec,
        plan: &SitePlan,
        at_entry: bool,
        others: &[u64],
    ) -> Option<weft_x86::ReturnSites> {
        if spec.ret.is_empty()
            || !at_entry
            || spec.around.is_some()
            || spec.usdt_args.is_some()
            || is_internal(&spec.label)
        {
            return None;
        }
        // `override` writes the frame's rax, which the agent's return trampoline
        // puts back and a return site's head does not.
        let overrides = spec.ret.iter().any(|c| {
            c.body
                .and_then(|i| self.prog.probes.get(i))
                .is_none_or(|p| {
                    p.body
                        .code
                        .iter()
                        .any(|x| matches!(x, weft_ir::Inst::Override { .. }))
                })
        });
        if overrides {
            return None;
        }
        match weft_x86::return_sites(&spec.func, plan, others) {
            // No exit at all (`_start`, a function that never returns): no return
            // site and no hijack either way. At the entry point the word at rsp is
            // argc, not a return address: a hijack would overwrite it.
            Ok(r) if r.sites.is_empty() => Some(r),
            _ if !self.ret_sites => None,
            // Return sites take a site per `ret`: past three quarters of the site
            // table, the rest of the functions keep the hijack (one site each).
            Ok(r)
                if {
                    let h = self.shm.header();
                    let used = h.site_count.load(Ordering::Acquire) as usize;
                    (used + r.sites.len() + 1) * 4 > h.max_sites as usize * 3
                } =>
            {
                self.notes.push(format!(
                    "{}: return-address hijack (the site table is three quarters full)",
                    spec.label
                ));
                None
            }
            Ok(r) => Some(r),
            Err(why) => {
                self.notes
                    .push(format!("{}: return-address hijack ({why})", spec.label));
                None
            }
        }
    }

    /// Weave one `ret`'s window: a jump to the relocated instructions before the
    /// `ret`, the return advice (inline when simple, with the generic head as its
    /// fallback) and the `ret`.
    fn ret_site(
        &mut self,
        spec: &SiteSpec,
        w: &weft_x86::ReturnSite,
        thread_attach: u64,
    ) -> Result<Planned> {
        let index = self.next_site_index()?;
        let patch_addr = w.plan.patch_addr().unwrap_or(w.ret);
        let ri = self.region_for(patch_addr, SITE_CODE_ESTIMATE)?;
        let parts = self.ret_parts(ri, spec, index, w.ret, thread_attach)?;
        let ctx = self.tail_context();
        let region = &mut self.regions[ri];
        let code = ret_tail(&ctx, &w.plan, &parts, region.next_addr())?;
        let target = region
            .put(&code)
            .ok_or_else(|| anyhow!("code region full"))?;
        // What a thread meeting the transient int3 of a restore runs: the window
        // as it was, without advice.
        let (mut plain, ret) = weft_x86::relocate_before_ret(&w.plan, region.next_addr())?;
        plain.extend_from_slice(&ret);
        let resume = region
            .put(&plain)
            .ok_or_else(|| anyhow!("code region full"))?;
        let patch = weft_x86::patch_bytes(&w.plan, target)?;
        let label = format!("{} (ret at {:#x})", spec.label, w.ret);
        let mut planned = self.publish(
            index,
            spec,
            Filled {
                kind: SiteKind::Jump,
                patch_addr,
                func: spec.func.addr,
                atomic: w.plan.single_instruction(),
                orig: w.plan.original_bytes().to_vec(),
                patch,
                entry_advice: 0,
                return_advice: 0,
                return_stub: 0,
                resume,
                entry_probe: spec.ret.first().map_or(0, |c| c.probe),
                return_probe: 0,
                semaphore: None,
            },
            Outcome::Return(parts.inline.is_some()),
        )?;
        planned.label = label;
        Ok(planned)
    }

    /// The generic return head of a return site (a full frame, every return advice,
    /// then the `ret`), placed in region `ri`, and the inline bodies when simple.
    fn ret_parts(
        &mut self,
        ri: usize,
        spec: &SiteSpec,
        index: u32,
        ret: u64,
        thread_attach: u64,
    ) -> Result<RetParts<'a>> {
        let ret_bytes = ret_bytes_at(&spec.func, ret)?;
        let head = entry_head(&EntryTrampoline {
            site_addr: ret,
            func: spec.func.addr,
            site_index: index,
            calls: spec.ret.iter().map(|c| (c.advice, c.probe)).collect(),
            hijack: None,
            around: None,
            at_entry: false,
            shm_base: self.target_shm_base(),
            tls_offset: self.agent.hello.tls_offset,
            thread_attach,
            unconditional: false,
            return_site: true,
            data: None,
        })?;
        let mut code = head;
        code.extend_from_slice(&ret_bytes);
        let generic = self.regions[ri]
            .put(&code)
            .ok_or_else(|| anyhow!("code region full"))?;
        let inline = if self.inline {
            self.simple_bodies(&spec.ret, weft_jit::inline::eligible_return)
        } else {
            None
        };
        Ok(RetParts {
            generic,
            inline,
            index,
            ret,
            func: spec.func.addr,
        })
    }

    /// What [`ret_tail`] needs of the weaver.
    fn tail_context(&self) -> TailContext<'a> {
        TailContext {
            prog: self.prog,
            maps: self.maps,
            symbols: self.symbols,
            shm_base: self.target_shm_base(),
            tls_offset: self.agent.hello.tls_offset,
            thread_agg_off: self.thread_agg_off,
            map_index: self.agent.hello.helpers[weft_abi::Helper::MapIndex as usize],
            map_key: self.agent.hello.helpers[weft_abi::Helper::MapKey as usize],
            safe_strcpy: self.agent.hello.helpers[weft_abi::Helper::SafeStrcpy as usize],
            maps_off: self.shm.header().maps_off,
            ring_off: self.shm.header().ring_off,
            ring_size: self.shm.header().ring_size,
        }
    }

    /// What inline code may use of this session.
    fn caps(&self) -> weft_jit::inline::Caps {
        weft_jit::inline::Caps {
            tsc_clock: self
                .shm
                .header()
                .clock
                .mult
                .load(std::sync::atomic::Ordering::Acquire)
                != 0,
        }
    }

    /// Write a site's trampolines into region `ri`: the generic head (a full frame,
    /// every entry advice, the return-address hijack) and, when the advice is simple
    /// enough, an inline head in front of it that falls back to it; each followed by
    /// `tail(at)`, the code that carries on with the site (relocated instructions and
    /// a jump back, or a call site's `jmp FUNC`). Returns where the patch should
    /// branch, where the generic head's tail starts (a jump site's `resume`), and
    /// whether the inline head is used.
    fn heads(
        &mut self,
        ri: usize,
        spec: &SiteSpec,
        h: &Head,
        tail: &dyn Fn(u64) -> Result<Vec<u8>>,
    ) -> Result<(u64, u64, bool)> {
        let shm_base = self.target_shm_base();
        let inline = self.inline_bodies(spec, h.at_entry);
        let symbols = self.symbols;
        let (ret_advice, ret_stub, ret_probe) = h.ret;
        let (prog, maps, thread_agg_off) = (self.prog, self.maps, self.thread_agg_off);
        let hello = &self.agent.hello;
        let (hijack_fn, return_trampoline, tls_offset) =
            (hello.hijack, hello.return_trampoline, hello.tls_offset);
        let generation = self.generation;
        let region = &mut self.regions[ri];
        // The generic trampoline: full frame, any advice.
        let generic_at = region.next_addr();
        let head = entry_head(&EntryTrampoline {
            site_addr: h.reported_ip,
            func: h.func,
            site_index: h.index,
            calls: spec.entry.iter().map(|c| (c.advice, c.probe)).collect(),
            hijack: (!spec.ret.is_empty()).then_some(hijack_fn),
            around: spec.around.as_ref().map(|c| (c.advice, c.probe)),
            at_entry: h.at_entry,
            shm_base,
            tls_offset,
            thread_attach: h.thread_attach,
            unconditional: is_internal(&spec.label),
            return_site: false,
            data: None,
        })?;
        let resume = generic_at + head.len() as u64;
        let mut code = head;
        code.extend_from_slice(&tail(resume)?);
        let at = region
            .put(&code)
            .ok_or_else(|| anyhow!("code region full"))?;
        debug_assert_eq!(at, generic_at);
        // The inline trampoline in front of it, for simple advice.
        let Some(list) = inline else {
            return Ok((generic_at, resume, false));
        };
        let inline_at = region.next_addr();
        let site = weft_jit::inline::InlineSite {
            site_addr: h.reported_ip,
            func: h.func,
            site_index: h.index,
            shm_base,
            tls_offset,
            thread_agg_off,
            hijack: (!spec.ret.is_empty()).then_some(weft_jit::inline::Hijack {
                advice: ret_advice,
                stub: ret_stub,
                probe: ret_probe,
                generation,
                return_trampoline,
            }),
            generic: generic_at,
            at_entry: h.at_entry,
            at_return: false,
            map_index: self.agent.hello.helpers[weft_abi::Helper::MapIndex as usize],
            map_key: self.agent.hello.helpers[weft_abi::Helper::MapKey as usize],
            safe_strcpy: self.agent.hello.helpers[weft_abi::Helper::SafeStrcpy as usize],
            maps_off: self.shm.header().maps_off,
            ring_off: self.shm.header().ring_off,
            ring_size: self.shm.header().ring_size,
        };
        let mut code = with_bodies(&list, symbols, |bodies| {
            weft_jit::inline::inline_head(bodies, prog, maps, &site, inline_at)
        })?;
        code.extend_from_slice(&tail(inline_at + code.len() as u64)?);
        let at = region
            .put(&code)
            .ok_or_else(|| anyhow!("code region full"))?;
        debug_assert_eq!(at, inline_at);
        Ok((inline_at, resume, true))
    }

    /// Weave a call site (Arachne's way): the branch to the callee becomes the same
    /// instruction branching to a stub — an entry trampoline head whose tail is `jmp
    /// FUNC` — so nothing is relocated and the callee returns straight to the caller.
    /// At the branch the stack is exactly what the callee's entry sees once the stub
    /// is reached (a `call` pushed the return address; a tail jump already has it),
    /// so the head is an entry head: the red zone is dead there, and `argN` are the
    /// callee's arguments. A thread that meets the transient `int3` of the rewrite
    /// resumes at the original branch re-encoded (`resume`).
    pub fn call_site(&mut self, spec: &SiteSpec, thread_attach: u64) -> Result<Planned> {
        let c = spec
            .call
            .as_ref()
            .ok_or_else(|| anyhow!("{}: not a call site", spec.label))?;
        let index = self.next_site_index()?;
        let ri = self.region_for(spec.site_addr, SITE_CODE_ESTIMATE)?;
        let callee = c.site.target;
        let head = Head {
            index,
            reported_ip: spec.site_addr,
            func: c.func,
            at_entry: true,
            thread_attach,
            ret: (0, 0, 0),
            entry_probe: spec.entry.first().map_or(0, |e| e.probe),
        };
        let jmp = |at: u64| Ok(weft_x86::jmp_rel32(at, callee)?.to_vec());
        let (stub, _, inline) = self.heads(ri, spec, &head, &jmp)?;
        let region = &mut self.regions[ri];
        let resume_code = weft_x86::resume_code(&c.site, region.next_addr())?;
        let resume = region
            .put(&resume_code)
            .ok_or_else(|| anyhow!("code region full"))?;
        let patch = weft_x86::retarget(&c.site, stub)
            .with_context(|| format!("{}: retargeting the call", spec.label))?;
        self.publish(
            index,
            spec,
            Filled {
                kind: SiteKind::Jump,
                patch_addr: spec.site_addr,
                func: c.func,
                atomic: true,
                orig: c.site.bytes.clone(),
                patch,
                entry_advice: 0,
                return_advice: 0,
                return_stub: 0,
                resume,
                entry_probe: head.entry_probe,
                return_probe: 0,
                semaphore: None,
            },
            if inline {
                Outcome::CallStubInline
            } else {
                Outcome::CallStub
            },
        )
    }

    /// Weave an access site (a data pointcut by instruction rewriting): the access
    /// instruction at `spec.site_addr`, at least 5 bytes, becomes a jump to
    /// `weft_x86::access_prologue` + the access relocated + `access_middle` + a
    /// general head with `old` and `new` ([`weft_jit::trampoline::DataHead`]) +
    /// `access_epilogue`. The advice runs after the access (`ip` = the access,
    /// `func` = its function). A thread that meets the transient `int3` of a
    /// rewrite resumes at the access relocated alone. Advice is never inline here:
    /// the general head reads `old`/`new` from the stack the access code built.
    pub fn access_site(
        &mut self,
        spec: &SiteSpec,
        access: &AccessSpec,
        thread_attach: u64,
        others: &[u64],
    ) -> Result<Planned> {
        let plan = weft_x86::plan_site_among(&spec.func, spec.site_addr, others);
        match &plan {
            SitePlan::Jump { patch_addr, .. }
                if *patch_addr == spec.site_addr && plan.single_instruction() => {}
            SitePlan::Jump { .. } => {
                return Ok(Planned::refused(
                    spec,
                    &"a jump would displace more than the access",
                ))
            }
            SitePlan::Int3 { reason, .. } => {
                return Ok(Planned::refused(
                    spec,
                    &format!("an access site needs a jump: {reason}"),
                ))
            }
            SitePlan::Refused { reason } => return Ok(Planned::refused(spec, reason)),
        }
        let insn_len = plan.original_bytes().len() as u64;
        let index = self.next_site_index()?;
        let ri = self.region_for(spec.site_addr, SITE_CODE_ESTIMATE)?;
        let shm_base = self.target_shm_base();
        let tls_offset = self.agent.hello.tls_offset;
        let region = &mut self.regions[ri];
        let at = region.next_addr();
        let mut code = weft_x86::access_prologue(access.var, access.size);
        code.extend(
            weft_x86::relocate(&plan, at + code.len() as u64, false)
                .with_context(|| format!("{}: relocating the access", spec.label))?,
        );
        code.extend(weft_x86::access_middle(access.var, access.size));
        code.extend(entry_head(&EntryTrampoline {
            site_addr: spec.site_addr,
            func: spec.func.addr,
            site_index: index,
            calls: spec.entry.iter().map(|c| (c.advice, c.probe)).collect(),
            hijack: None,
            around: None,
            at_entry: false,
            shm_base,
            tls_offset,
            thread_attach,
            unconditional: false,
            return_site: false,
            data: Some(weft_jit::trampoline::DataHead {
                var: access.var,
                size: access.size,
                write_back: access.write_back,
            }),
        })?);
        let epilogue_at = at + code.len() as u64;
        code.extend(weft_x86::access_epilogue(
            epilogue_at,
            spec.site_addr + insn_len,
        )?);
        let put = region
            .put(&code)
            .ok_or_else(|| anyhow!("code region full"))?;
        debug_assert_eq!(put, at);
        let resume_at = region.next_addr();
        let resume_code = weft_x86::relocate(&plan, resume_at, true)?;
        let resume = region
            .put(&resume_code)
            .ok_or_else(|| anyhow!("code region full"))?;
        let patch = weft_x86::patch_bytes(&plan, at)?;
        self.publish(
            index,
            spec,
            Filled {
                kind: SiteKind::Jump,
                patch_addr: spec.site_addr,
                func: spec.func.addr,
                atomic: true,
                orig: plan.original_bytes().to_vec(),
                patch,
                entry_advice: 0,
                return_advice: 0,
                return_stub: 0,
                resume,
                entry_probe: spec.entry.first().map_or(0, |c| c.probe),
                return_probe: 0,
                semaphore: None,
            },
            Outcome::AccessSite,
        )
    }

    /// Plan a *redirect*: every call of `spec`'s function goes to `target` (an agent
    /// function with the same signature) instead, and the original never runs. A jump
    /// site jumps to a stub (`jmp [rip]` to `target`); an int3 site resumes at
    /// `target` (`resume` is the target in both cases, so the agent's trap handler
    /// also sends a thread that meets the int3-first restore there). No advice.
    pub fn redirect_site(&mut self, spec: &SiteSpec, target: u64) -> Result<Planned> {
        let plan = weft_x86::plan_site(&spec.func, spec.site_addr);
        let index = self.next_site_index()?;
        let (kind, patch_addr, patch, orig, outcome) = match &plan {
            SitePlan::Refused { reason } => return Ok(Planned::refused(spec, reason)),
            SitePlan::Jump { patch_addr, .. } => {
                let ri = self.region_for(*patch_addr, 16)?;
                let mut stub = vec![0xff, 0x25, 0, 0, 0, 0];
                stub.extend_from_slice(&target.to_le_bytes());
                let at = self.regions[ri]
                    .put(&stub)
                    .ok_or_else(|| anyhow!("code region full"))?;
                (
                    SiteKind::Jump,
                    *patch_addr,
                    weft_x86::patch_bytes(&plan, at)?,
                    plan.original_bytes().to_vec(),
                    Outcome::Jump,
                )
            }
            SitePlan::Int3 {
                patch_addr, reason, ..
            } => (
                SiteKind::Int3,
                *patch_addr,
                vec![weft_x86::INT3],
                plan.original_bytes()[..1].to_vec(),
                Outcome::Int3(reason.to_string()),
            ),
        };
        self.publish(
            index,
            spec,
            Filled {
                kind,
                patch_addr,
                func: spec.func.addr,
                atomic: plan.single_instruction(),
                orig,
                patch,
                entry_advice: 0,
                return_advice: 0,
                return_stub: 0,
                resume: target,
                entry_probe: 0,
                return_probe: 0,
                semaphore: None,
            },
            outcome,
        )
    }

    /// The index the next site takes, if the table has room.
    fn next_site_index(&self) -> Result<u32> {
        let index = self.shm.header().site_count.load(Ordering::Acquire);
        if index >= self.shm.header().max_sites {
            bail!(
                "too many probe sites (limit {})",
                self.shm.header().max_sites
            );
        }
        Ok(index)
    }

    /// Write site `index`'s descriptor and make it visible (hash, then count).
    fn publish(
        &mut self,
        index: u32,
        spec: &SiteSpec,
        f: Filled,
        outcome: Outcome,
    ) -> Result<Planned> {
        if f.patch.len() > SITE_MAX_BYTES || f.orig.len() != f.patch.len() {
            bail!(
                "{}: patch of {} bytes over {} original bytes",
                spec.label,
                f.patch.len(),
                f.orig.len()
            );
        }
        // SAFETY: site `index` is unused and ours to fill (site_count not yet bumped);
        // no other thread or process reads it until site_count includes it.
        let d = unsafe { &mut *self.shm.site_mut(index) };
        d.addr = f.patch_addr;
        d.func = f.func;
        d.kind = f.kind as u32;
        d.orig_len = f.orig.len() as u32;
        d.space = self.space;
        d.patch_len = f.patch.len() as u32;
        d.orig[..f.orig.len()].copy_from_slice(&f.orig);
        d.patch[..f.patch.len()].copy_from_slice(&f.patch);
        d.entry_advice = f.entry_advice;
        d.return_advice = f.return_advice;
        d.return_stub = f.return_stub;
        d.resume = f.resume;
        d.entry_probe = f.entry_probe;
        d.return_probe = f.return_probe;
        let n = spec.name.len().min(SITE_NAME_LEN - 1);
        d.name[..n].copy_from_slice(&spec.name.as_bytes()[..n]);
        d.semaphore = f.semaphore.unwrap_or(0);
        d.state.store(SITE_UNUSED, Ordering::Release);
        self.shm.site_hash_insert(index);
        self.shm
            .header()
            .site_count
            .store(index + 1, Ordering::Release);
        Ok(Planned {
            index,
            addr: f.patch_addr,
            orig: f.orig,
            patch: f.patch,
            label: spec.label.clone(),
            outcome,
            semaphore: f.semaphore,
            atomic: f.atomic,
        })
    }

    /// The inline stub of a site's return advice (all of it, in order), when each is
    /// simple enough; 0 otherwise.
    fn return_stub(&mut self, spec: &SiteSpec, index: u32, patch_addr: u64) -> Result<u64> {
        if !self.inline || spec.ret.is_empty() {
            return Ok(0);
        }
        let Some(list) = self.simple_bodies(&spec.ret, weft_jit::inline::eligible_return) else {
            return Ok(0);
        };
        let site = weft_jit::inline::InlineSite {
            site_addr: patch_addr,
            func: spec.func.addr,
            site_index: index,
            shm_base: self.shm_base_in_target,
            tls_offset: self.agent.hello.tls_offset,
            thread_agg_off: self.thread_agg_off,
            hijack: None,
            generic: 0,
            at_entry: true,
            at_return: false,
            map_index: self.agent.hello.helpers[weft_abi::Helper::MapIndex as usize],
            map_key: self.agent.hello.helpers[weft_abi::Helper::MapKey as usize],
            safe_strcpy: self.agent.hello.helpers[weft_abi::Helper::SafeStrcpy as usize],
            maps_off: self.shm.header().maps_off,
            ring_off: self.shm.header().ring_off,
            ring_size: self.shm.header().ring_size,
        };
        let code = with_bodies(&list, self.symbols, |bodies| {
            weft_jit::inline::return_stub(bodies, self.maps, &site)
        })?;
        self.put_anywhere(&code)
    }

    /// Where the agent mapped the segment. Trampolines pass it to advice in the
    /// frame, so it must be the target-side address.
    fn target_shm_base(&self) -> u64 {
        self.shm_base_in_target
    }
}

/// A return site's advice code: the generic head (then the `ret`) and the bodies to
/// inline, when simple.
struct RetParts<'a> {
    generic: u64,
    inline: Option<Vec<InlineBody<'a>>>,
    index: u32,
    ret: u64,
    func: u64,
}

/// What a return site's tail is compiled with.
struct TailContext<'a> {
    prog: &'a weft_ir::Program,
    maps: &'a [weft_jit::MapLayout],
    symbols: Option<&'a SymbolResolver<'a>>,
    shm_base: u64,
    tls_offset: i64,
    thread_agg_off: u64,
    map_index: u64,
    map_key: u64,
    safe_strcpy: u64,
    maps_off: u64,
    ring_off: u64,
    ring_size: u64,
}

/// The code at `at` for a plan whose relocated instructions end with a `ret`: those
/// before it, relocated; the inline return advice (falling back to the generic head,
/// which has its own `ret`) and the `ret`; or a jump to the generic head.
fn ret_tail(
    cx: &TailContext<'_>,
    plan: &SitePlan,
    parts: &RetParts<'_>,
    at: u64,
) -> Result<Vec<u8>> {
    let (mut code, ret) = weft_x86::relocate_before_ret(plan, at)?;
    let head_at = at + code.len() as u64;
    match &parts.inline {
        Some(list) => {
            let site = weft_jit::inline::InlineSite {
                site_addr: parts.ret,
                func: parts.func,
                site_index: parts.index,
                shm_base: cx.shm_base,
                tls_offset: cx.tls_offset,
                thread_agg_off: cx.thread_agg_off,
                hijack: None,
                generic: parts.generic,
                at_entry: false,
                at_return: true,
                map_index: cx.map_index,
                map_key: cx.map_key,
                safe_strcpy: cx.safe_strcpy,
                maps_off: cx.maps_off,
                ring_off: cx.ring_off,
                ring_size: cx.ring_size,
            };
            let head = with_bodies(list, cx.symbols, |bodies| {
                weft_jit::inline::inline_head(bodies, cx.prog, cx.maps, &site, head_at)
            })?;
            code.extend_from_slice(&head);
            code.extend_from_slice(&ret);
        }
        None => code.extend_from_slice(&weft_x86::jmp_rel32(head_at, parts.generic)?),
    }
    Ok(code)
}

/// The bytes of the `ret` at `ret` in `func` (`ret`, `ret imm16`, `rep ret`).
fn ret_bytes_at(func: &FunctionCode, ret: u64) -> Result<Vec<u8>> {
    let off = ret
        .checked_sub(func.addr)
        .map(|o| o as usize)
        .filter(|&o| o < func.bytes.len())
        .ok_or_else(|| anyhow!("ret at {ret:#x} outside its function"))?;
    let len = weft_x86::decode_len(&func.bytes[off..], ret)
        .ok_or_else(|| anyhow!("cannot decode the ret at {ret:#x}"))?;
    Ok(func.bytes[off..off + len].to_vec())
}
