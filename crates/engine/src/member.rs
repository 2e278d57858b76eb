//! One process of a session: its agent's connection, the code weft wrote into it,
//! and its sites, from weaving to unweaving.

use std::collections::{BTreeMap, HashMap};
use std::ops::Range;
use std::process::Child;
use std::time::Duration;

use anyhow::{anyhow, Result};
use weft_ir::Program;
use weft_jit::Env;
use weft_symbols::{ProcMaps, Symbolizer};

use crate::conn::Agent;
use crate::patch::{self, PatchReport};
use crate::pointcut::{self, ProbeNames};
use crate::progress::Step;
use crate::segment::Segment;
use crate::weave::{CodeRegion, Outcome, Planned, Weaver};

/// A process in the session.
pub struct Member {
    pub pid: i32,
    pub agent: Agent,
    /// The command weft launched (`-c`), if this is it.
    pub child: Option<Child>,
    /// This process's site space in the segment.
    pub space: u32,
    /// Where the agent mapped the segment, and the agent's session generation.
    shm_base: u64,
    generation: u32,
    /// Code regions weft wrote trampolines and advice into.
    regions: Vec<CodeRegion>,
    /// Code regions it inherited (a forked child: its parent's, mapped shared).
    inherited: Vec<Range<u64>>,
    /// A forked child: its parent's site space, and its own planned site for each
    /// of its parent's (by index).
    pub origin: Option<(u32, std::collections::HashMap<usize, usize>)>,
    /// Sites planned and written (or to be written).
    pub planned: Vec<Planned>,
    /// The `sigaction` redirect, and the function bodies it covers.
    redirects: Vec<Planned>,
    redirect_bodies: Vec<Range<u64>>,
    /// Probes with sites here (and profile probes), for "Attached N probes".
    pub site_probes: usize,
    /// The unwinder hooks (needed once a return probe is woven) are planned.
    unwind_hooked: bool,
    /// The modules (path, bias) the published `ustack` unwind table covers
    /// (`crate::unwind`): a new table only when they change.
    ustack_modules: Vec<(std::path::PathBuf, u64)>,
    /// The `sigaction` redirect is patched.
    redirected: bool,
    /// Profile probes given to the agent.
    profiles: u32,
    /// Data watches given to the agent: (index, what, compiled advice).
    pub watches: Vec<(u32, pointcut::WatchSpec, u64)>,
    /// Symbols of the process, for `usym`/`ustack`.
    pub symbolizer: Option<Symbolizer>,
    /// Still running (not exited or gone from the session).
    pub alive: bool,
}

/// How [`Member::prepare`] plans.
#[derive(Clone, Copy)]
pub struct How<'a> {
    /// Compile simple advice into trampolines.
    pub inline: bool,
    /// A probe on a file this process does not map is no error (another process
    /// of the session may map it).
    pub lenient: bool,
    /// Told the long steps: reading symbols, compiling and weaving the sites.
    pub progress: Option<&'a dyn crate::Progress>,
    /// `--data-mechanism`.
    pub data: crate::data::Mechanism,
    /// Return probes may use return sites ([`crate::Options::return_sites`]).
    pub return_sites: bool,
}

/// What [`Member::prepare`] planned.
pub struct Prepared {
    /// Indices in [`Member::planned`] of the probes' sites planned.
    pub sites: Vec<usize>,
    /// And of the agent's internal sites planned with them (the unwinder hooks, woven
    /// until the session ends).
    pub internal: Vec<usize>,
    /// Probes with sites (and profile probes) among those prepared.
    pub probes: usize,
    /// Call sites (`call:`) planned, not refused.
    pub call_sites: usize,
    pub elapsed: Duration,
    pub regions: Vec<Range<u64>>,
}

impl Member {
    /// Where the agent mapped the session's segment in this process.
    pub fn shm_base(&self) -> u64 {
        self.shm_base
    }

    /// A process whose agent has connected: it maps the session's segment, its
    /// sites being those of site space `space`.
    pub fn join(
        pid: i32,
        agent: Agent,
        child: Option<Child>,
        seg: &Segment,
        space: u32,
        flags: u32,
    ) -> Result<Member> {
        let (base, generation) = agent.map_shm(
            std::os::fd::AsRawFd::as_raw_fd(&seg.fd),
            seg.size(),
            space,
            flags,
            pid,
        )?;
        weft_inject::die::at("shm-mapped");
        Ok(Member {
            pid,
            agent,
            child,
            space,
            shm_base: base,
            generation,
            regions: Vec::new(),
            inherited: Vec::new(),
            origin: None,
            planned: Vec::new(),
            redirects: Vec::new(),
            redirect_bodies: Vec::new(),
            site_probes: 0,
            unwind_hooked: false,
            ustack_modules: Vec::new(),
            redirected: false,
            profiles: 0,
            watches: Vec::new(),
            symbolizer: None,
            alive: true,
        })
    }

    /// Resolve the attach points of the probes `select` picks in this process,
    /// compile their advice and write the trampolines; nothing is patched yet.
    /// `note` gets `-v` lines.
    pub fn prepare(
        &mut self,
        prog: &Program,
        seg: &Segment,
        names: &mut ProbeNames,
        how: How<'_>,
        note: &mut dyn FnMut(String),
        select: &dyn Fn(usize) -> bool,
    ) -> Result<Prepared> {
        let How {
            inline,
            lenient,
            progress,
            data,
            return_sites,
        } = how;
        let t = std::time::Instant::now();
        let maps = ProcMaps::read(self.pid as u32).map_err(|e| anyhow!("{e}"))?;
        self.symbolizer = Some(Symbolizer::new(maps.modules()));
        let modules_now: Vec<_> = maps
            .modules()
            .iter()
            .map(|m| (m.path.clone(), m.load_bias))
            .collect();
        if modules_now != self.ustack_modules {
            crate::unwind::publish(prog, seg, self.pid as u32, &maps.modules(), note);
            self.ustack_modules = modules_now;
        }
        let step = Step::begin(
            progress,
            &format!("reading symbols (process {})", self.pid),
            0,
        );
        let resolved = pointcut::resolve(prog, &maps, self.pid, names, select, lenient)?;
        drop(step);
        let mut specs: Vec<_> = resolved.sites.into_values().collect();
        let mut calls: Vec<_> = resolved.calls.into_values().collect();
        let first_new = self.planned.len();
        // A call probe counts once per callee, however many sites it has (as a
        // uprobe counts once per function): "Woven N call sites" says the rest.
        // The front end's hidden probes are not the program's to count.
        let shown = |c: &&crate::weave::Call| c.body.is_none_or(|b| !prog.probes[b].hidden);
        let call_probes: std::collections::HashSet<u32> = calls
            .iter()
            .flat_map(|s| s.entry.iter().filter(shown).map(|c| c.probe))
            .collect();
        // A USDT probe counts once however many locations it has, as bpftrace
        // counts it.
        let usdt_probes: std::collections::HashSet<u32> = specs
            .iter()
            .filter(|s| s.usdt_args.is_some())
            .flat_map(|s| s.entry.iter().filter(shown).map(|c| c.probe))
            .collect();
        let probes: usize = specs
            .iter()
            .filter(|s| s.usdt_args.is_none())
            .map(|s| {
                s.entry.iter().chain(&s.ret).filter(shown).count() + usize::from(s.around.is_some())
            })
            .sum::<usize>()
            + call_probes.len()
            + usdt_probes.len();
        let mut call_sites = 0;
        self.site_probes += probes;
        let agent = &self.agent;
        let modules = maps.modules();
        let symbols = pointcut::Symbols {
            prog,
            modules: &modules,
            pid: self.pid,
            lenient,
        };
        let resolve = |i: usize, s: &weft_ir::SymbolRef| symbols.address(i, s);
        let mut weaver = Weaver::new(agent, seg, prog, self.shm_base, self.generation);
        weaver.inline = inline;
        weaver.ret_sites &= return_sites;
        weaver.space = self.space;
        weaver.regions = std::mem::take(&mut self.regions);
        weaver.symbols = Some(&resolve);
        // Each site is compiled for, then planned: two units.
        let step = Step::begin(
            progress,
            &format!("weaving (process {})", self.pid),
            2 * (specs.len() + calls.len()) as u64,
        );
        let result = (|| -> Result<()> {
            // Advice: one compiled function per probe body that runs in the target.
            let mut advice_addr = BTreeMap::new();
            let no_symbols = |_: &weft_ir::SymbolRef| None;
            let env = Env {
                helpers: &agent.hello.helpers,
                maps: &seg.maps,
                thread_agg_off: seg.layout.agg_off,
                symbol: &no_symbols,
                usdt_args: None,
            };
            for s in specs.iter_mut().chain(calls.iter_mut()) {
                for c in s.entry.iter_mut().chain(&mut s.ret).chain(&mut s.around) {
                    let body = c.advice as usize;
                    let addr = match (&s.usdt_args, advice_addr.get(&body)) {
                        (None, Some(a)) => *a,
                        (usdt, _) => {
                            // USDT arguments differ per site: compile for this site.
                            let symbol = |sym: &weft_ir::SymbolRef| symbols.address(body, sym);
                            let env = Env {
                                usdt_args: usdt.as_deref(),
                                symbol: &symbol,
                                ..env
                            };
                            let code = weft_jit::compile(&prog.probes[body].body, prog, &env)?;
                            let a = weaver.put_anywhere(&code)?;
                            if usdt.is_none() {
                                advice_addr.insert(body, a);
                            }
                            a
                        }
                    };
                    c.advice = addr;
                }
                step.advance(1);
            }
            // Exceptions must not unwind through hijacked return addresses.
            if !self.unwind_hooked
                && specs.iter().any(|s| !s.ret.is_empty())
                && agent.hello.on_raise != 0
            {
                specs.extend(pointcut::unwind_hooks(&maps, agent.hello.on_raise));
                self.unwind_hooked = true;
            }
            // The redirect's own function: a probe there cannot be woven too.
            let redirected = self.redirects.first().map(|r| r.addr).or_else(|| {
                (agent.hello.sigaction != 0)
                    .then(|| pointcut::sigaction_redirect(&maps))
                    .flatten()
                    .map(|r| r.site_addr)
            });
            // Sites one instruction apart (USDT NOPs, call sites): a jump must not
            // cover another.
            // In increasing order: the planner looks for the ones in a range.
            let others: Vec<u64> = specs
                .iter()
                .chain(&calls)
                .map(|s| s.site_addr)
                .chain(
                    self.planned
                        .iter()
                        .filter(|p| !restored(seg, p))
                        .map(|p| p.addr),
                )
                .collect::<std::collections::BTreeSet<u64>>()
                .into_iter()
                .collect();
            // The patches in place (start -> index in `planned`), which do not
            // overlap, and the call and access sites among them: each site is
            // checked against them in log time, not against every planned site.
            let live = |p: &Planned| !matches!(p.outcome, Outcome::Skipped(_)) && !restored(seg, p);
            let mut patches: BTreeMap<u64, usize> = self
                .planned
                .iter()
                .enumerate()
                .filter(|(_, p)| live(p))
                .map(|(i, p)| (p.addr, i))
                .collect();
            let mut rewritten: Vec<usize> = (0..self.planned.len())
                .filter(|&i| is_rewrite(&self.planned[i]))
                .collect();
            for s in &specs {
                // A site inside the bytes another's jump replaced (a return site's
                // window, a prologue) would write into that jump.
                let covered = patches
                    .range(..s.site_addr)
                    .next_back()
                    .map(|(_, &i)| &self.planned[i])
                    .filter(|p| s.site_addr < p.addr + p.patch.len() as u64);
                let ps = if let Some(other) = covered {
                    vec![crate::weave::Planned::refused(
                        s,
                        &format!(
                            "it lies in the bytes {} patches at {:#x}",
                            other.label, other.addr
                        ),
                    )]
                } else if Some(s.site_addr) == redirected {
                    vec![crate::weave::Planned::refused(
                        s,
                        &"weft's agent redirects this function to itself while it weaves \
                          (so that weft's signal handlers stay first) and cannot probe it \
                          too; probe its callers (`sigaction`, `signal`) instead",
                    )]
                } else if let Some(c) = call_site_at(&self.planned, &rewritten, s, &others) {
                    vec![crate::weave::Planned::refused(
                        s,
                        &format!(
                            "its first instruction is {c}, woven before it \
                             (one rewrite per instruction)"
                        ),
                    )]
                } else {
                    weaver.site(s, agent.hello.thread_attach, &others)?
                };
                for n in weaver.notes.drain(..) {
                    note(n);
                }
                for p in ps {
                    note(format!("{} at {:#x}: {}", p.label, p.addr, p.outcome));
                    let i = self.planned.len();
                    if live(&p) {
                        patches.insert(p.addr, i);
                    }
                    if is_rewrite(&p) {
                        rewritten.push(i);
                    }
                    self.planned.push(p);
                }
                step.advance(1);
            }
            // Call sites after the other sites: one inside the bytes another site's
            // patch covers (its jump's displaced instructions, its int3) is not woven
            // (the other probe keeps its site; this call is not counted).
            for s in &calls {
                let end = s.site_addr + s.call.as_ref().map_or(0, |c| c.site.bytes.len() as u64);
                let covering = self
                    .planned
                    .iter()
                    .chain(&self.redirects)
                    .filter(|p| !matches!(p.outcome, Outcome::Skipped(_)))
                    .find(|p| p.addr < end && s.site_addr < p.addr + p.patch.len() as u64);
                let p = match covering {
                    Some(other) => crate::weave::Planned::refused(
                        s,
                        &format!(
                            "the call at {:#x} lies in the bytes {} patches at {:#x}",
                            s.site_addr, other.label, other.addr
                        ),
                    ),
                    None => weaver.call_site(s, agent.hello.thread_attach)?,
                };
                if !matches!(p.outcome, Outcome::Skipped(_)) {
                    call_sites += 1;
                }
                note(format!("{} at {:#x}: {}", p.label, p.addr, p.outcome));
                self.planned.push(p);
                step.advance(1);
            }
            drop(step);
            for f in &resolved.calls_found {
                let woven = |probe: u32| {
                    calls
                        .iter()
                        .zip(&self.planned[self.planned.len() - calls.len()..])
                        .filter(|(s, p)| {
                            !matches!(p.outcome, Outcome::Skipped(_))
                                && s.entry.iter().any(|c| c.probe == probe)
                        })
                        .count()
                };
                let n =
                    |k: usize, what: &str| format!("{k} {what}{}", if k == 1 { "" } else { "s" });
                for &probe in &f.probes {
                    let mut line = format!(
                        "{}: {} woven, {} not covered",
                        names.names[probe as usize],
                        n(woven(probe), "call site"),
                        n(f.indirect, "indirect call"),
                    );
                    if f.short > 0 {
                        line.push_str(&format!(", {} not covered", n(f.short, "short tail jump")));
                    }
                    note(line);
                }
            }
            // The target's sigaction goes through the agent while woven, so its own
            // SIGTRAP/SIGSEGV/SIGBUS handlers never displace weft's (see the agent's
            // `signals`).
            if agent.hello.sigaction != 0 && self.redirects.is_empty() {
                if let Some(spec) = pointcut::sigaction_redirect(&maps) {
                    let p = weaver.redirect_site(&spec, agent.hello.sigaction)?;
                    note(format!("{} at {:#x}: {}", p.label, p.addr, p.outcome));
                    self.redirect_bodies.push(spec.func.addr..spec.func.end());
                    self.redirects.push(p);
                }
            }
            // profile:hz:N probes: advice in a code region, sampled by the agent's
            // timers.
            for pr in &resolved.profiles {
                if self.profiles as usize >= weft_abi::MAX_PROFILES {
                    anyhow::bail!(
                        "at most {} profile probes per session",
                        weft_abi::MAX_PROFILES
                    );
                }
                let symbol = |sym: &weft_ir::SymbolRef| symbols.address(pr.body, sym);
                let env = Env {
                    symbol: &symbol,
                    ..env
                };
                let code = weft_jit::compile(&prog.probes[pr.body].body, prog, &env)?;
                let advice = weaver.put_anywhere(&code)?;
                self.profiles += 1;
                agent.set_profile(
                    self.profiles - 1,
                    weft_abi::ProfileDesc {
                        hz: pr.hz,
                        probe: pr.probe,
                        advice,
                    },
                )?;
            }
            // Data pointcuts: advice in a code region, run by the agent's SIGTRAP
            // handler on the accessing thread; the watchpoints are armed now (those
            // on a map's address when the map holds one).
            // Access sites (`--data-mechanism rewrite`), by address, woven after
            // every watch is resolved.
            let mut rewrites = BTreeMap::new();
            let mut rewritten: Vec<(String, String, &str)> = Vec::new();
            for w in &resolved.watches {
                if self.watches.len() >= weft_abi::MAX_WATCHES {
                    anyhow::bail!(
                        "{}: at most {} data pointcuts per session",
                        w.label,
                        weft_abi::MAX_WATCHES
                    );
                }
                let mut w = w.clone();
                if data == crate::data::Mechanism::Rewrite {
                    let code = weft_jit::compile(&prog.probes[w.body].body, prog, &env)?;
                    let advice = weaver.put_anywhere(&code)?;
                    let Some(module) = w.module.clone().filter(|_| w.addr != 0) else {
                        anyhow::bail!(
                            "{}: --data-mechanism rewrite rewrites the instructions that name \
                             a variable; this address is not in a module's image (use hw or \
                             page)",
                            w.label
                        );
                    };
                    let found = pointcut::access_sites(&w, &module, advice)?;
                    let write_back = weft_ir::writes_data_new(&prog.probes[w.body].body);
                    let access = crate::weave::AccessSpec {
                        var: w.addr,
                        size: match w.len {
                            8.. => 8,
                            4..=7 => 4,
                            2 | 3 => 2,
                            _ => 1,
                        },
                        write_back,
                    };
                    note(format!(
                        "{}: data mechanism rewrite (instruction rewriting) on {} bytes at \
                         {:#x}: {} instruction(s) of {} name them; accesses through pointers \
                         ({} instruction(s) take their address, {} index them) and from \
                         other modules (through the GOT) are not seen",
                        w.label,
                        w.len,
                        w.addr,
                        found.sites.len(),
                        module.path.display(),
                        found.address_taken,
                        found.indexed
                    ));
                    let what = if w.access & weft_abi::WATCH_UNCHANGED_ONLY != 0 {
                        "reads"
                    } else if w.access & 0xff == weft_abi::WATCH_RW {
                        "accesses"
                    } else {
                        "writes"
                    };
                    if found.sites.is_empty() {
                        anyhow::bail!(
                            "{}: no instruction of {} {what} it by its address (it may be \
                             reached only through pointers); use --data-mechanism hw or page",
                            w.label,
                            module.path.display()
                        );
                    }
                    // Two pointcuts on the same instruction share its site when they
                    // watch the same bytes (their advice in program order).
                    for (s, acc) in found.sites {
                        match rewrites.entry(s.site_addr) {
                            std::collections::btree_map::Entry::Vacant(e) => {
                                e.insert((s, acc, access, vec![w.label.clone()]));
                            }
                            std::collections::btree_map::Entry::Occupied(mut e) => {
                                let (site, _, shared, labels) = e.get_mut();
                                if shared.var == access.var && shared.size == access.size {
                                    site.entry.extend(s.entry);
                                    shared.write_back |= access.write_back;
                                    labels.push(w.label.clone());
                                } else {
                                    anyhow::bail!(
                                        "{}: the instruction at {:#x} is rewritten for {} \
                                         already, which watches other bytes (one rewrite per \
                                         instruction); use --data-mechanism hw or page for \
                                         one of them",
                                        w.label,
                                        s.site_addr,
                                        labels[0]
                                    );
                                }
                            }
                        }
                    }
                    rewritten.push((w.label.clone(), module.path.display().to_string(), what));
                    continue;
                }
                let hw_used = self
                    .watches
                    .iter()
                    .filter(|(_, w, _)| w.access & weft_abi::WATCH_PAGE == 0)
                    .count();
                let mech = match data {
                    crate::data::Mechanism::Hardware => {
                        if let Some(why) = &w.fits_hw {
                            anyhow::bail!("{}: {why}", w.label);
                        }
                        if hw_used >= weft_abi::MAX_HW_WATCHES {
                            anyhow::bail!(
                                "{}: at most {} hardware watchpoints (x86-64 has {} debug \
                                 registers per thread); use --data-mechanism page or auto",
                                w.label,
                                weft_abi::MAX_HW_WATCHES,
                                weft_abi::MAX_HW_WATCHES
                            );
                        }
                        crate::data::Mechanism::Hardware
                    }
                    crate::data::Mechanism::Page | crate::data::Mechanism::Rewrite => {
                        crate::data::Mechanism::Page
                    }
                    crate::data::Mechanism::Auto => {
                        let why = w.fits_hw.clone().or_else(|| {
                            (hw_used >= weft_abi::MAX_HW_WATCHES).then(|| {
                                format!(
                                    "the {} hardware watchpoints are taken",
                                    weft_abi::MAX_HW_WATCHES
                                )
                            })
                        });
                        match why {
                            Some(why) => {
                                note(format!("{}: falls back to page protection: {why}", w.label));
                                crate::data::Mechanism::Page
                            }
                            None => crate::data::Mechanism::Hardware,
                        }
                    }
                };
                if mech == crate::data::Mechanism::Page {
                    w.access |= weft_abi::WATCH_PAGE;
                }
                let w = &w;
                let code = weft_jit::compile(&prog.probes[w.body].body, prog, &env)?;
                let advice = weaver.put_anywhere(&code)?;
                let index = self.watches.len() as u32;
                let at = match &w.map {
                    Some(m) => format!("the address {m} holds (armed when it holds one)"),
                    None => format!("{} bytes at {:#x}", w.len, w.addr),
                };
                note(format!(
                    "{}: data mechanism {} ({}) on {}, {at}",
                    w.label,
                    mech.name(),
                    mech.describe(),
                    if w.access & weft_abi::WATCH_UNCHANGED_ONLY != 0 {
                        "reads (accesses that leave the value unchanged)"
                    } else if w.access & 0xff == weft_abi::WATCH_RW {
                        "reads and writes"
                    } else {
                        "writes"
                    }
                ));
                if w.addr != 0 {
                    agent
                        .set_watch(index, watch_desc(w, w.addr, advice))
                        .map_err(|e| anyhow::anyhow!("{}: {e}", w.label))?;
                }
                self.watches.push((index, w.clone(), advice));
            }
            let others: Vec<u64> = self
                .planned
                .iter()
                .filter(|p| !restored(seg, p))
                .map(|p| p.addr)
                .chain(rewrites.keys().copied())
                .collect::<std::collections::BTreeSet<u64>>()
                .into_iter()
                .collect();
            let mut woven: HashMap<String, usize> = HashMap::new();
            for (s, acc, access, labels) in rewrites.values() {
                let end = s.site_addr + acc.len as u64;
                let covering = self
                    .planned
                    .iter()
                    .chain(&self.redirects)
                    .filter(|p| !matches!(p.outcome, Outcome::Skipped(_)) && !restored(seg, p))
                    .find(|p| p.addr < end && s.site_addr < p.addr + p.patch.len() as u64);
                let p = if let Some(why) = &acc.refused {
                    crate::weave::Planned::refused(s, why)
                } else if let Some(other) = covering {
                    crate::weave::Planned::refused(
                        s,
                        &format!(
                            "the access lies in the bytes {} patches at {:#x}",
                            other.label, other.addr
                        ),
                    )
                } else {
                    weaver.access_site(s, access, agent.hello.thread_attach, &others)?
                };
                if !matches!(p.outcome, Outcome::Skipped(_)) {
                    for l in labels {
                        *woven.entry(l.clone()).or_default() += 1;
                    }
                }
                note(format!("{} at {:#x}: {}", p.label, p.addr, p.outcome));
                self.planned.push(p);
            }
            for (label, module, what) in &rewritten {
                if woven.get(label).copied().unwrap_or(0) == 0 {
                    anyhow::bail!(
                        "{label}: none of the instructions of {module} that {what} it by its \
                         address could be rewritten (-v says why); use --data-mechanism hw \
                         or page"
                    );
                }
            }
            Ok(())
        })();
        self.regions = std::mem::take(&mut weaver.regions);
        result?;
        self.site_probes += resolved.profiles.len() + resolved.watches.len();
        let (internal, sites): (Vec<usize>, Vec<usize>) = (first_new..self.planned.len())
            .partition(|&i| crate::weave::is_internal(&self.planned[i].label));
        Ok(Prepared {
            sites,
            internal,
            probes: probes + resolved.profiles.len() + resolved.watches.len(),
            call_sites,
            elapsed: t.elapsed(),
            regions: self.code_ranges(),
        })
    }

    /// Where the session's code lives in this process: no thread may be there when
    /// the agent unmaps it.
    fn code_ranges(&self) -> Vec<Range<u64>> {
        self.regions
            .iter()
            .map(|r| r.addr..r.addr + r.size)
            .chain(self.inherited.iter().cloned())
            .collect()
    }

    /// A child `parent` forked, whose agent connected by itself: it runs its
    /// parent's code, woven, with its parent's segment and trampolines (shared
    /// memory). Its sites get entries of their own, in site space `space`, copied
    /// from its parent's (patched where the child's bytes say so), and the child's
    /// agent adopts them.
    pub fn forked(
        pid: i32,
        agent: Agent,
        parent: &Member,
        seg: &Segment,
        space: u32,
    ) -> Result<Member> {
        use std::os::unix::fs::FileExt;
        let mem = std::fs::File::open(format!("/proc/{pid}/mem"))
            .map_err(|e| anyhow!("reading the memory of process {pid}: {e}"))?;
        let mut map = std::collections::HashMap::new();
        let copy = |p: &Planned| -> Result<Planned> {
            if p.index == u32::MAX {
                return Ok(p.clone());
            }
            let h = seg.shm.header();
            let index = h.site_count.load(std::sync::atomic::Ordering::Acquire);
            if index >= h.max_sites {
                anyhow::bail!("too many probe sites (limit {})", h.max_sites);
            }
            let mut now = vec![0u8; p.patch.len()];
            let patched = mem.read_exact_at(&mut now, p.addr).is_ok() && now == p.patch;
            // SAFETY: entry `index` is unused (site_count not yet bumped), entry
            // `p.index` is a filled one: a byte copy of plain data, then its own space
            // and state, before the entry is published.
            unsafe {
                let to = seg.shm.site_mut(index);
                core::ptr::copy_nonoverlapping(seg.shm.site(p.index), to, 1);
                (*to).space = space;
                (*to).state.store(
                    if patched {
                        weft_abi::SITE_PATCHED
                    } else {
                        weft_abi::SITE_RESTORED
                    },
                    std::sync::atomic::Ordering::Release,
                );
            }
            seg.shm.site_hash_insert(index);
            h.site_count
                .store(index + 1, std::sync::atomic::Ordering::Release);
            Ok(Planned { index, ..p.clone() })
        };
        let mut planned = Vec::with_capacity(parent.planned.len());
        for (k, p) in parent.planned.iter().enumerate() {
            map.insert(k, planned.len());
            planned.push(copy(p)?);
        }
        let redirects = parent
            .redirects
            .iter()
            .map(copy)
            .collect::<Result<Vec<_>>>()?;
        // Same address space: the parent's unwind table serves the child.
        let _ = weft_runtime::unwind::share(&seg.shm, parent.pid as u32, pid as u32);
        agent.adopt(space)?;
        Ok(Member {
            pid,
            agent,
            child: None,
            space,
            shm_base: parent.shm_base,
            generation: parent.generation,
            regions: Vec::new(),
            inherited: parent.code_ranges(),
            origin: Some((parent.space, map)),
            planned,
            redirects,
            redirect_bodies: parent.redirect_bodies.clone(),
            site_probes: parent.site_probes,
            unwind_hooked: parent.unwind_hooked,
            ustack_modules: parent.ustack_modules.clone(),
            redirected: parent.redirected,
            profiles: parent.profiles,
            // Hardware watchpoints are not inherited across fork (the agent's
            // events are per thread, `inherit_thread`): a followed child is not
            // watched.
            watches: Vec::new(),
            symbolizer: None,
            alive: true,
        })
    }

    /// Patch the planned sites `which` (indices in [`Member::planned`]) with the
    /// process stopped, the `sigaction` redirect first, alone (the first time):
    /// once it is in, the agent can put its handlers in front for good, before any
    /// int3 site can trap. Sites that could not be woven are reported through
    /// `warn`.
    pub fn patch(
        &mut self,
        seg: &Segment,
        which: &[usize],
        warn: &mut dyn FnMut(String),
    ) -> Result<PatchReport> {
        weft_inject::die::at("code-written");
        weft_inject::die::phase("patch");
        if !self.redirects.is_empty() && !self.redirected {
            patch::apply_stepping_out_of(
                self.pid,
                &mut self.redirects,
                &seg.shm,
                self.space,
                &self.redirect_bodies,
                self.agent.hello.step_guard,
            )?;
            self.redirected = true;
            weft_inject::die::at("redirect-patched");
            if self
                .redirects
                .iter()
                .any(|p| !matches!(p.outcome, Outcome::Skipped(_)))
            {
                self.agent.take_signals()?;
                weft_inject::die::at("signals-taken");
            }
            for p in &self.redirects {
                if let Outcome::Skipped(r) = &p.outcome {
                    warn(format!("{} not woven: {r}", p.label));
                }
            }
        }
        let mut sites: Vec<Planned> = which.iter().map(|&i| self.planned[i].clone()).collect();
        let report = patch::apply(
            self.pid,
            &mut sites,
            &seg.shm,
            self.space,
            self.agent.hello.step_guard,
        )?;
        for (&i, p) in which.iter().zip(sites) {
            self.planned[i] = p;
        }
        weft_inject::die::at("sites-patched");
        for &i in which {
            if let Outcome::Skipped(r) = &self.planned[i].outcome {
                warn(format!("{} not woven: {r}", self.planned[i].label));
            }
        }
        Ok(report)
    }

    /// Write the original bytes back at the sites `which` while the process runs
    /// (the agent's int3-first sequence: a jump site's patch is one instruction, so
    /// no thread can be inside it). Their code stays until the session ends.
    pub fn disable(&self, which: &[usize]) -> Result<()> {
        self.set_sites(which, false)
    }

    /// Patch again the sites `which`, woven before: those whose patch replaces one
    /// instruction while the process runs, the others with it stopped. Returns how
    /// long the process was stopped, if it had to be.
    pub fn enable(&mut self, seg: &Segment, which: &[usize]) -> Result<Option<Duration>> {
        let (atomic, stopped): (Vec<usize>, Vec<usize>) = which
            .iter()
            .copied()
            .filter(|&i| !matches!(self.planned[i].outcome, Outcome::Skipped(_)))
            .partition(|&i| self.planned[i].atomic);
        // The stop first: a thread stepped out of bytes about to be patched must not
        // meet a site enabled meanwhile (its trap is the agent's to take, not the
        // step's).
        let pause = if stopped.is_empty() {
            None
        } else {
            Some(self.patch(seg, &stopped, &mut |_| {})?.pause)
        };
        self.set_sites(&atomic, true)?;
        Ok(pause)
    }

    fn set_sites(&self, which: &[usize], on: bool) -> Result<()> {
        let indices: Vec<u32> = which
            .iter()
            .map(|&i| self.planned[i].index)
            .filter(|&i| i != u32::MAX)
            .collect();
        for chunk in indices.chunks(weft_abi::msg::SiteList::MAX) {
            self.agent.set_sites(chunk, on)?;
        }
        Ok(())
    }

    /// Restore every site, end the agent's session once no thread is inside the
    /// session's code, and free it.
    pub fn unweave(&self, seg: &Segment) -> Result<()> {
        weft_inject::die::phase("unweave");
        let agent = &self.agent;
        // Watchpoints first (the agent closes their events): none traps once the
        // `sigaction` redirect is gone and the target's own SIGTRAP handler may be
        // the kernel's again.
        for (index, _, _) in &self.watches {
            if let Err(e) = agent.set_watch(*index, weft_abi::WatchDesc::default()) {
                anyhow::bail!("closing watchpoint {index}: {e:#}");
            }
        }
        let mut ranges = self.code_ranges();
        ranges.push(agent.hello.text_start..agent.hello.text_end);
        let maps = ProcMaps::read(self.pid as u32).map_err(|e| anyhow!("{e}"))?;
        let frames = crate::safepoint::SignalFrames::new(&maps, &maps.modules());
        let shadows = patch::Shadows {
            busy_code: &ranges,
            tls_offset: agent.hello.tls_offset,
            return_trampoline: agent.hello.return_trampoline,
            frames: &frames,
        };
        // The unwinder hooks (jump sites) stay until the last hijacked frame is gone:
        // a thread inside an entry trampoline at the restore may still hijack its
        // return address, then throw. An int3 hook cannot stay: without a session the
        // trap handler would no longer know it.
        let (late, early): (Vec<Planned>, Vec<Planned>) =
            self.planned.iter().cloned().partition(|p| {
                crate::weave::is_internal(&p.label)
                    && matches!(p.outcome, Outcome::Jump | Outcome::JumpInline)
            });
        if !early.is_empty() || !late.is_empty() {
            patch::restore(self.pid, &early, &seg.shm, &shadows)?;
            weft_inject::die::at("sites-restored");
        }
        // The sigaction redirect after the sites, once weft's last traps and faults
        // (kept from their threads by the stop above, delivered on resume) reached
        // the agent's handlers.
        if !self.redirects.is_empty() {
            patch::restore_redirects(
                self.pid,
                &self.redirects,
                &seg.shm,
                &shadows,
                Duration::from_millis(500),
            )?;
            weft_inject::die::at("redirects-restored");
        }
        agent.end()?;
        weft_inject::die::at("ended");
        patch::wait_quiescent(self.pid, &shadows, &late, &seg.shm, Duration::from_secs(5))?;
        weft_inject::die::at("quiescent");
        agent.free()
    }
}

/// A site taken out since (unwoven): its bytes are the original ones again.
fn restored(seg: &Segment, p: &Planned) -> bool {
    p.index != u32::MAX
        && seg
            .shm
            .site(p.index)
            .state
            .load(std::sync::atomic::Ordering::Acquire)
            == weft_abi::SITE_RESTORED
}

/// The call or access site among `planned`, woven before, that `s`'s patch would start on
/// (its patch point is the call instruction): named, for the reason `s` is refused.
/// A call site strictly inside the bytes a jump would displace is in `others`, which
/// already turns the jump into an int3.
fn call_site_at(
    planned: &[Planned],
    rewritten: &[usize],
    s: &crate::weave::SiteSpec,
    others: &[u64],
) -> Option<String> {
    let in_func = |p: &&Planned| s.func.addr <= p.addr && p.addr < s.func.end();
    let mut here = rewritten
        .iter()
        .map(|&i| &planned[i])
        .filter(in_func)
        .peekable();
    here.peek()?;
    let at = weft_x86::plan_site_among(&s.func, s.site_addr, others).patch_addr()?;
    here.find(|p| p.addr == at).map(|p| {
        let what = match p.outcome {
            Outcome::AccessSite => "the access site",
            _ => "the call site",
        };
        format!("{what} {} at {:#x}", p.label, p.addr)
    })
}

/// A call or access site: an instruction rewritten in place, which a function's
/// own site must not patch again.
fn is_rewrite(p: &Planned) -> bool {
    matches!(
        p.outcome,
        Outcome::CallStub | Outcome::CallStubInline | Outcome::AccessSite
    )
}

/// The agent's description of watch `w` at `addr`.
pub fn watch_desc(w: &pointcut::WatchSpec, addr: u64, advice: u64) -> weft_abi::WatchDesc {
    weft_abi::WatchDesc {
        addr,
        len: w.len,
        access: w.access,
        probe: w.probe,
        advice,
    }
}
