//! A session: one program woven into target processes, from the first agent to
//! the last map.
//!
//! ```text
//! Session::new ─▶ launch / attach (agents join) ─▶ prepare (resolve, compile,
//! write code) ─▶ begin (BEGIN) ─▶ go (patch, release) ─▶ run (events, intervals)
//! ─▶ finish (unweave, END, final maps, losses)
//! ```
//!
//! Records go to a [`Sink`] (`weft_trace`); the session's own diagnostics (`-v`
//! lines, sites that could not be woven) go to [`Options::note`].

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::process::Child;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use weft_abi::{MapKind, ENTRY_LIVE};
use weft_ir::{AttachPoint, FmtId, Format, Program};
use weft_output::{Resolver, Symbol};
use weft_symbols::Symbolizer;
use weft_trace::{decode, Context, Decoder, Losses, Record, Sink};

use crate::conn::Listener;
use crate::local::Local;
use crate::member::Member;
use crate::pointcut::{attach_name_indices, ProbeNames};
use crate::segment::{Segment, Sizes};
use crate::target;

/// How a session runs.
#[derive(Clone, Debug)]
pub struct Options {
    pub sizes: Sizes,
    /// Compile simple advice into trampolines.
    pub inline: bool,
    /// Report how each site was woven, pause times, thread counts.
    pub verbose: bool,
    /// Where diagnostics go (each line starts with `weft: `).
    pub note: fn(&str),
    /// With several processes, a failure in one fails the session (else that one is
    /// left out and reported, and the others go on).
    pub all_or_nothing: bool,
    /// Children the members fork join the session, woven; the programs a launched
    /// command's processes exec load the agent and join, the program resolved
    /// against their image.
    pub follow_fork: bool,
    /// With `follow_fork`: weft follows only because the command is a wrapper (a
    /// script, a shell, `env`): the program it runs keeps no `LD_PRELOAD` or
    /// `WEFT_*` in its environment ([`weft_abi::FOLLOW_WRAPPERS`]).
    pub follow_wrappers_only: bool,
    /// With `follow_wrappers_only`: the programs the probes name by path; the
    /// first image that is one of them is the program the wrapper runs (none: the
    /// first image that is not a wrapper).
    pub follow_to: Vec<std::path::PathBuf>,
    /// System-wide (no `-p`, no `-c`): the session lasts until it is stopped, not
    /// until its members end; a member that fails is left out, never the session;
    /// processes the kernel catches as they start join it ([`Session::watch`]).
    pub system_wide: bool,
    /// Run only these probes (indices in the program; `--probe-filter`); all when
    /// `None`.
    pub only_probes: Option<Vec<usize>>,
    /// Kernel probes run their advice for every process (no `-p`, no `-c`, or
    /// `--system`), not only for the session's processes and their children.
    pub kernel_all: bool,
    /// Told the long steps (symbols, weaving) for a progress line; `None`: silent.
    pub progress: Option<crate::ProgressHook>,
    /// How data pointcuts catch accesses (`--data-mechanism`).
    pub data_mechanism: crate::data::Mechanism,
    /// Deliver function entries and exits packed, a record per thread and drain
    /// (`weft_trace::Event::Functions`): for sinks that store them (`weft record`).
    pub pack_functions: bool,
    /// Return probes may run at the functions' `ret`s (return sites) where every
    /// exit is one; `false` keeps the return-address hijack everywhere, so a
    /// function's return advice runs exactly for the calls its entry saw
    /// (`weft fperf`, which unweaves functions' entries while calls are open).
    pub return_sites: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            sizes: Sizes::default(),
            inline: true,
            verbose: false,
            note: |l| eprintln!("{l}"),
            all_or_nothing: false,
            follow_fork: false,
            follow_wrappers_only: false,
            follow_to: Vec::new(),
            system_wide: false,
            only_probes: None,
            kernel_all: false,
            progress: None,
            data_mechanism: crate::data::Mechanism::Auto,
            pack_functions: false,
            return_sites: true,
        }
    }
}

/// Why [`Session::run`] returned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RunEnd {
    /// Advice called `exit()`.
    Exit,
    /// Every target process ended.
    TargetsGone,
    /// The caller's stop flag was raised (SIGINT, SIGTERM).
    Stopped,
    /// The deadline given to [`Session::run_until`] passed.
    Deadline,
}

/// Sites woven together (by one [`Session::weave`]), in every member.
#[derive(Clone, Debug, Default)]
pub struct Weaving {
    /// Indices of the program's probes.
    pub probes: Vec<usize>,
    /// Per member (by site space): indices in the member's planned sites.
    sites: Vec<(u32, Vec<usize>)>,
    /// The agent's internal sites planned with them (patched with them, never
    /// unwoven before the session ends).
    internal: Vec<(u32, Vec<usize>)>,
    /// Call sites (`call:` probes) among the sites, in all members.
    pub call_sites: usize,
    /// Patched now.
    pub woven: bool,
    /// How long the targets were stopped (summed over members) by the latest
    /// weave or reweave of these sites; zero when none had to be.
    pub pause: Duration,
}

impl Weaving {
    /// Sites in all members.
    pub fn site_count(&self) -> usize {
        self.sites.iter().map(|(_, v)| v.len()).sum()
    }

    /// The sites of several weavings as one, to unweave or reweave them together
    /// (one stop per process for a reweave that needs one). Woven when all are.
    pub fn union<'w>(ws: impl IntoIterator<Item = &'w Weaving>) -> Weaving {
        let mut u = Weaving {
            woven: true,
            ..Weaving::default()
        };
        for w in ws {
            u.woven &= w.woven;
            u.call_sites += w.call_sites;
            for p in &w.probes {
                if !u.probes.contains(p) {
                    u.probes.push(*p);
                }
            }
            for (space, sites) in &w.sites {
                match u.sites.iter_mut().find(|(s, _)| s == space) {
                    Some((_, v)) => v.extend(sites),
                    None => u.sites.push((*space, sites.clone())),
                }
            }
        }
        u
    }
}

/// What a finished session reports.
#[derive(Clone, Debug)]
pub struct Finished {
    /// What advice could not do (nothing is lost silently).
    pub losses: Losses,
    /// The session had target processes.
    pub had_targets: bool,
    /// Most target threads holding a slot at once, the limit, and the slots of
    /// threads that ended that were drained and reused.
    pub threads_peak: u32,
    pub max_live: u32,
    pub threads_retired: u64,
    /// The code of `exit(code)` (0 without one), weft's exit status.
    pub exit_code: i32,
}

/// One program woven into any number of processes.
pub struct Session<'p> {
    prog: &'p Program,
    opts: Options,
    pub seg: Segment,
    listener: Listener,
    names: ProbeNames,
    local: Local,
    begin: Vec<(usize, u32)>,
    end: Vec<(usize, u32)>,
    intervals: Vec<(usize, u32, u64)>,
    pub members: Vec<Member>,
    decoder: Decoder,
    resolver: SessionResolver,
    /// Opened while weft starts, so that the kernel's first hardware breakpoint
    /// is not paid while a target is stopped (`weft_inject::warm`).
    warm: Option<weft_inject::warm::Warm>,
    /// What [`Session::prepare`] planned, patched by [`Session::go`].
    initial: Weaving,
    /// Records made before there was a sink to give them to (processes that
    /// joined before BEGIN).
    pending: Vec<Record>,
    /// System-wide: the kernel's catching of processes that start.
    watcher: Option<crate::watch::Watcher>,
    /// Processes caught and not yet woven (stopped, or about to stop).
    caught: Vec<i32>,
    /// Processes that could not be woven (reported once).
    refused: std::collections::HashSet<i32>,
    /// Kernel probes: `(probe, category, name)` and their `probe` indices, then,
    /// once [`Session::prepare`] loaded them, the loaded side.
    kernel_probes: (Vec<(usize, String, String)>, Vec<u32>),
    kernel: Option<crate::kernel::KernelSide>,
    /// Kernel probes started at a launch's `exec`, not yet counted by `prepare`.
    kernel_started: usize,
    /// Local advice ran since the kernel's maps were last mirrored.
    local_ran: bool,
    /// `set:addr(@p, N)` watches: the address each (member pid, watch index) was
    /// last armed at.
    armed: HashMap<(i32, u32), u64>,
}

impl<'p> Session<'p> {
    /// A session for `prog`: its segment, and its BEGIN/END/interval advice
    /// compiled for weft. `attaching`: a process will be attached to (the kernel's
    /// hardware-breakpoint set-up starts now, in the background).
    pub fn new(prog: &'p Program, opts: Options, attaching: bool) -> Result<Session<'p>> {
        let warm = attaching.then(weft_inject::warm::Warm::start);
        let seg = Segment::create(prog, opts.sizes, 0)?;
        let pack_functions = opts.pack_functions;
        // SAFETY: gettid has no preconditions.
        let own_slot = seg.claim_own_slot(unsafe { libc::gettid() } as u32);
        let mut begin = Vec::new();
        let mut end = Vec::new();
        let mut intervals = Vec::new();
        let mut bodies = Vec::new();
        let mut kernel_probes = (Vec::new(), Vec::new());
        for (i, (p, names)) in prog
            .probes
            .iter()
            .zip(attach_name_indices(prog))
            .enumerate()
        {
            if opts.only_probes.as_ref().is_some_and(|o| !o.contains(&i)) {
                continue;
            }
            for (a, name) in p.attach.iter().zip(names) {
                let slot = bodies.len();
                match a {
                    AttachPoint::Begin => begin.push((slot, name)),
                    AttachPoint::End => end.push((slot, name)),
                    AttachPoint::Interval { period_ns } => intervals.push((slot, name, *period_ns)),
                    AttachPoint::Tracepoint { category, name: tp } => {
                        kernel_probes.0.push((i, category.clone(), tp.clone()));
                        kernel_probes.1.push(name);
                        continue;
                    }
                    _ => continue,
                }
                bodies.push(&p.body);
            }
        }
        let local = Local::new(
            prog,
            &bodies,
            &seg.maps,
            seg.layout.agg_off,
            seg.shm,
            own_slot,
        )?;
        if !kernel_probes.0.is_empty() {
            // Before any process is touched.
            crate::kernel::check(prog, &kernel_probes.0, &kernel_probes.1, &seg.shm)?;
        }
        let names = ProbeNames::new(&prog.probe_names);
        Ok(Session {
            prog,
            resolver: SessionResolver {
                symbolizers: RefCell::new(HashMap::new()),
                current: Cell::new(0),
                probe_names: names.names.clone(),
                formats: prog.formats.clone(),
                show_debug_info: prog.config.show_debug_info,
            },
            opts,
            seg,
            listener: Listener::new()?,
            names,
            local,
            begin,
            end,
            intervals,
            members: Vec::new(),
            decoder: {
                let mut d = Decoder::default();
                d.pack_functions = pack_functions;
                d
            },
            warm,
            initial: Weaving::default(),
            pending: Vec::new(),
            watcher: None,
            armed: HashMap::new(),
            caught: Vec::new(),
            refused: std::collections::HashSet::new(),
            kernel_probes,
            kernel: None,
            kernel_started: 0,
            local_ran: false,
        })
    }

    fn note(&self, line: &str) {
        (self.opts.note)(&format!("weft: {line}"));
    }

    fn verbose(&self, line: &str) {
        if self.opts.verbose {
            self.note(line);
        }
    }

    /// Launch `argv` with the agent preloaded; it waits before `main` until
    /// [`Session::go`].
    pub fn launch(&mut self, argv: &[String]) -> Result<i32> {
        let agent = target::agent_path()?;
        // Kernel probes, and user-space probes eBPF can run, start at the exec:
        // the command is held there until they are in. (Following wrappers, the
        // program comes later, in a process of its own.)
        let early = !self.opts.follow_fork
            && std::env::var_os("WEFT_TEST_NO_EBPF").is_none()
            && std::env::var_os("WEFT_NO_EARLY").is_none();
        // (Without the privileges eBPF needs, only kernel probes, which then fail.)
        let hold = early
            && (!self.kernel_probes.0.is_empty()
                || (weft_kernel::probes::check_privileges().is_ok()
                    && self.selected().iter().any(|&i| {
                        self.prog.probes[i]
                            .attach
                            .iter()
                            .any(|a| a.function().is_some())
                    })));
        let mut c = target::launch(
            argv,
            &agent,
            &self.listener.name,
            match (self.opts.follow_fork, self.opts.follow_wrappers_only) {
                (false, _) => None,
                (true, false) => Some(weft_abi::FOLLOW_ALL.to_string()),
                (true, true) => Some(
                    std::iter::once(weft_abi::FOLLOW_WRAPPERS.to_string())
                        .chain(self.opts.follow_to.iter().map(|p| p.display().to_string()))
                        .collect::<Vec<_>>()
                        .join(":"),
                ),
            }
            .as_deref(),
            hold,
        )?;
        let pid = c.id() as i32;
        if hold {
            let started = self.start_at_exec(pid, argv, &agent);
            let released = target::release(pid);
            if let Err(e) = started.and(released) {
                let _ = c.kill();
                let _ = c.wait();
                return Err(e);
            }
        }
        let a = self
            .listener
            .accept(pid, Duration::from_secs(30), || match c.try_wait()? {
                Some(st) => bail!("{} exited ({st}) before weft could attach", argv[0]),
                None => Ok(()),
            });
        let a = match a {
            Ok(a) => a,
            Err(e) => {
                let _ = c.kill();
                let _ = c.wait();
                return Err(e);
            }
        };
        self.join(pid, a, Some(c))?;
        Ok(pid)
    }

    /// Launched process `pid` is stopped at its `exec`: start the kernel probes for
    /// it, and the early probes (the user-space probes eBPF can run, until the agent
    /// takes over; see `crate::kernel`). A user-space probe that cannot run there is
    /// said with `-v`; what the kernel refuses of the early probes leaves them out.
    fn start_at_exec(&mut self, pid: i32, argv: &[String], agent: &std::path::Path) -> Result<()> {
        let (uid, gid) = proc_ids(pid).unwrap_or((0, 0));
        self.seg.set_target(pid as u32, pid as u64, uid, gid);
        let exe = target::which(&argv[0]).unwrap_or_else(|| argv[0].clone().into());
        let selected = self.selected();
        let (early, mut notes) = if weft_kernel::probes::check_privileges().is_ok() {
            let names = crate::pointcut::attach_name_indices(self.prog);
            crate::kernel::early_probes(self.prog, &selected, &names, &exe)
        } else {
            Default::default()
        };
        self.kernel_started = self.start_kernel(&selected, &early)?;
        if let Some(k) = self.kernel.as_mut() {
            notes.append(&mut k.refused);
        }
        for n in &notes {
            self.verbose(&format!(
                "from the first instruction until the agent starts, not probed: {n}"
            ));
        }
        let Some(k) = self.kernel.as_mut() else {
            return Ok(());
        };
        // The kernel probes count for it from `join` on, as for any member: what
        // the agent does at its start is not the program's.
        let attached = if early.is_empty() {
            Ok(0)
        } else {
            k.attach_early(pid as u32, agent).map(|()| k.early_sites)
        };
        match attached {
            Ok(0) => {}
            Ok(n) => self.verbose(&format!(
                "{n} kernel uprobes run {} probes from the first instruction until the \
                 agent starts",
                early.len()
            )),
            Err(e) => self.verbose(&format!(
                "from the first instruction until the agent starts, not probed: {e:#}"
            )),
        }
        Ok(())
    }

    /// The kernel probes among `probes` and their `probe` indices.
    fn kernel_probes_of(&self, probes: &[usize]) -> (Vec<(usize, String, String)>, Vec<u32>) {
        let (all, names) = &self.kernel_probes;
        all.iter()
            .zip(names)
            .filter(|((i, _, _), _)| probes.contains(i))
            .map(|(w, n)| (w.clone(), *n))
            .unzip()
    }

    /// Catch the processes that start running the probed files from now on
    /// (system-wide sessions): they join as they start, woven before they run on.
    pub fn watch(&mut self, w: crate::watch::Watcher) {
        self.watcher = Some(w);
    }

    /// Whether the kernel caught `pid` as it started (it joins once the session
    /// runs, see [`Session::watch`]); asks the kernel first.
    pub fn is_caught(&mut self, pid: i32) -> bool {
        self.poll_caught();
        self.caught.contains(&pid)
    }

    fn poll_caught(&mut self) {
        if let Some(w) = self.watcher.as_mut() {
            for pid in w.poll() {
                if !self.caught.contains(&pid) {
                    self.caught.push(pid);
                }
            }
        }
    }

    /// Load the agent into running process `pid` (unless it is there already).
    pub fn attach(&mut self, pid: i32) -> Result<()> {
        if let Some(w) = self.watcher.as_mut() {
            // Not to be stopped by the kernel while (or after) weft weaves it.
            w.seen(pid);
        }
        let agent = target::agent_path()?;
        let report = target::attach(pid, &agent, &self.listener.name, self.warm.as_mut())?;
        let moved = match (report.ran_out, report.stepped_out) {
            (0, 0) => String::new(),
            (r, s) => format!(
                "; threads moved out of the C library: {r} run to their callers, {s} single-stepped"
            ),
        };
        self.verbose(&format!(
            "agent loaded into {pid} (target paused {:.1} ms{moved})",
            report.pause.as_secs_f64() * 1e3
        ));
        let a = self.accept_agent(pid)?;
        self.join(pid, a, None)
    }

    /// The connection of the agent just loaded into (or asked to connect in) `pid`.
    fn accept_agent(&self, pid: i32) -> Result<crate::conn::Agent> {
        self.listener.accept(pid, Duration::from_secs(10), || {
            if target::alive(pid) {
                Ok(())
            } else {
                bail!("process {pid} exited while weft was attaching")
            }
        })
    }

    fn join(&mut self, pid: i32, agent: crate::conn::Agent, child: Option<Child>) -> Result<()> {
        weft_inject::die::at("handshake");
        if self.members.is_empty() {
            let (uid, gid) = proc_ids(pid).unwrap_or((0, 0));
            let cpid = if child.is_some() { pid as u64 } else { 0 };
            self.seg.set_target(pid as u32, cpid, uid, gid);
        }
        let space = self.members.len() as u32 + 1;
        let flags = if self.opts.follow_fork {
            weft_abi::msg::SESSION_FOLLOW_FORK
        } else {
            0
        };
        let m = Member::join(pid, agent, child, &self.seg, space, flags)?;
        if let Some(k) = &self.kernel {
            k.add_member(pid as u32, m.shm_base())?;
        }
        self.members.push(m);
        self.pending.push(joined_record(pid));
        Ok(())
    }

    /// Resolve the program in every member, compile its advice and write the code;
    /// returns the number of probes ("Attached N probes").
    pub fn prepare(&mut self) -> Result<usize> {
        let all: Vec<usize> = self.selected();
        self.prepare_probes(&all)
    }

    /// As [`Session::prepare`], for the probes `probes` only (by index); the others
    /// may be woven later ([`Session::weave`]).
    pub fn prepare_probes(&mut self, probes: &[usize]) -> Result<usize> {
        let kernel = self.start_kernel(probes, &[])?;
        if let Some(k) = self.kernel.as_mut() {
            // The agent has taken over: the early uprobes leave before weft reads
            // or patches the code they are in.
            k.end_early()?;
        }
        let (w, n) = self.plan(probes, None)?;
        self.initial = w;
        // Following children and execs, a probe may have its sites only in the
        // processes to come: it counts as attached (bpftrace sets it on the file).
        let n = if self.opts.follow_fork {
            let in_target = probes
                .iter()
                .filter(|&&i| !self.prog.probes[i].hidden)
                .flat_map(|&i| &self.prog.probes[i].attach)
                .filter(|a| a.runs_in_target())
                .count();
            n.max(in_target)
        } else {
            n
        };
        Ok(n + kernel + self.begin.len() + self.end.len() + self.intervals.len())
    }

    /// The sites [`Session::prepare`] planned (and [`Session::go`] wove), one
    /// [`Weaving`] per function they are in, by the function's entry address in
    /// the member: a function's entry site, its return sites, and any other site
    /// inside it. Each can be unwoven and rewoven alone ([`Session::unweave`],
    /// [`Session::reweave`]; [`Weaving::union`] batches several). The agent's
    /// internal sites planned with them are in none: they stay until the session
    /// ends. Sorted by address.
    pub fn functions(&self) -> Vec<(u64, Weaving)> {
        let mut by: std::collections::BTreeMap<u64, Weaving> = Default::default();
        for (space, sites) in &self.initial.sites {
            let Some(m) = self.members.iter().find(|m| m.space == *space) else {
                continue;
            };
            for &i in sites {
                let index = m.planned[i].index;
                if index == u32::MAX {
                    continue;
                }
                let func = self.seg.shm.site(index).func;
                let w = by.entry(func).or_insert_with(|| Weaving {
                    probes: self.initial.probes.clone(),
                    woven: self.initial.woven,
                    ..Weaving::default()
                });
                match w.sites.iter_mut().find(|(s, _)| s == space) {
                    Some((_, v)) => v.push(i),
                    None => w.sites.push((*space, vec![i])),
                }
            }
        }
        by.into_iter().collect()
    }

    /// The call sites (`call:` probes) [`Session::prepare`] planned in every member
    /// ("Woven N call sites").
    pub fn call_sites(&self) -> usize {
        self.initial.call_sites
    }

    /// Compile, load and attach the kernel probes among `probes`, filtered to the
    /// members (and their children) unless `kernel_all`; how many there are.
    fn start_kernel(
        &mut self,
        probes: &[usize],
        early: &[crate::kernel::EarlyProbe],
    ) -> Result<usize> {
        let (which, names) = self.kernel_probes_of(probes);
        if self.kernel.is_some() {
            return Ok(std::mem::take(&mut self.kernel_started));
        }
        if which.is_empty() && early.is_empty() {
            return Ok(0);
        }
        // SAFETY: gettid has no preconditions.
        let me = unsafe { libc::getpid() } as u32;
        let slot = weft_runtime::slots::claim_uncounted(&self.seg.shm, me, KERNEL_TID)
            .ok_or_else(|| anyhow::anyhow!("no thread slot left for the kernel probes"))?;
        // SAFETY: the slot was just claimed by weft; nothing else writes its names.
        unsafe {
            (*slot).comm = *b"kernel\0\0\0\0\0\0\0\0\0\0";
            (*slot).pcomm = (*slot).comm;
        }
        let k = crate::kernel::KernelSide::start(
            self.prog,
            &which,
            &names,
            early,
            &self.seg.shm,
            slot,
            !self.opts.kernel_all,
        )?;
        for m in &self.members {
            if m.alive {
                k.add_member(m.pid as u32, m.shm_base())?;
            }
        }
        if !which.is_empty() {
            self.verbose(&format!(
                "kernel probes: {} eBPF programs ({} on the raw system call tracepoints), {} \
             instructions, {}",
                k.programs,
                k.raw,
                k.instructions,
                if k.filtered {
                    "for the session's processes and their children"
                } else {
                    "for every process"
                }
            ));
        }
        self.kernel = Some(k);
        Ok(which.len())
    }

    /// Plan `probes` in every live member (or only member `only`): resolve,
    /// compile, write code. A member that fails is left out (or exited meanwhile),
    /// unless `all_or_nothing`.
    fn plan(&mut self, probes: &[usize], only: Option<usize>) -> Result<(Weaving, usize)> {
        let (prog, inline, verbose, note, lenient) = (
            self.prog,
            self.opts.inline,
            self.opts.verbose,
            self.opts.note,
            self.opts.follow_fork,
        );
        let mut lines = |l: String| {
            if verbose {
                note(&format!("weft: {l}"));
            }
        };
        let select = |i: usize| probes.contains(&i);
        let mut w = Weaving {
            probes: probes.to_vec(),
            ..Weaving::default()
        };
        let mut n_probes = 0;
        for i in 0..self.members.len() {
            if !self.members[i].alive || only.is_some_and(|o| o != i) {
                continue;
            }
            let m = &mut self.members[i];
            let how = crate::member::How {
                inline,
                lenient,
                progress: self.opts.progress.as_ref().map(|p| &*p.0),
                data: self.opts.data_mechanism,
                return_sites: self.opts.return_sites,
            };
            let p = match m.prepare(prog, &self.seg, &mut self.names, how, &mut lines, &select) {
                Ok(p) => p,
                Err(e) => {
                    self.member_failed(i, e, "weaving")?;
                    continue;
                }
            };
            n_probes += p.probes;
            w.call_sites += p.call_sites;
            lines(format!(
                "resolved, planned and compiled {} sites in {:.1} ms",
                p.sites.len() + p.internal.len(),
                p.elapsed.as_secs_f64() * 1e3
            ));
            for r in &p.regions {
                lines(format!("code region {:#x}..{:#x}", r.start, r.end));
            }
            if let Some(s) = m.symbolizer.take() {
                self.resolver
                    .symbolizers
                    .borrow_mut()
                    .insert(m.pid as u32, s);
            }
            w.sites.push((m.space, p.sites));
            w.internal.push((m.space, p.internal));
        }
        self.resolver.probe_names = self.names.names.clone();
        Ok((w, n_probes))
    }

    /// Member `i` failed `what`: it exited meanwhile (no error for the others), or
    /// it is left out and reported (its sites restored), unless it is the only one
    /// or the session is all or nothing.
    fn member_failed(&mut self, i: usize, e: anyhow::Error, what: &str) -> Result<()> {
        let m = &mut self.members[i];
        let pid = m.pid;
        if !target::alive(pid) {
            m.alive = false;
            self.note(&format!("process {pid} exited while weft was {what} it"));
            return Ok(());
        }
        if (self.members.len() == 1 || self.opts.all_or_nothing) && !self.opts.system_wide {
            return Err(e);
        }
        let m = &mut self.members[i];
        let _ = m.unweave(&self.seg);
        m.alive = false;
        self.note(&format!("process {pid} left out: {e:#}"));
        Ok(())
    }

    /// Run the BEGIN probes and deliver what they printed.
    pub fn begin(&mut self, sink: &mut dyn Sink) {
        for &(i, probe) in &self.begin {
            self.local.run(i, probe);
        }
        self.local_ran = true;
        self.drain(sink);
    }

    /// Patch every member (unless BEGIN called `exit()`) and let advice run;
    /// launched targets start.
    pub fn go(&mut self) -> Result<()> {
        if !self.decoder.exited {
            let mut initial = std::mem::take(&mut self.initial);
            initial.pause = self.patch(&initial)?;
            initial.woven = true;
            self.initial = initial;
        }
        for i in 0..self.members.len() {
            if !self.members[i].alive {
                continue;
            }
            if let Err(e) = self.members[i].agent.go() {
                self.member_failed(i, e, "starting")?;
            }
        }
        if !self.members.is_empty() {
            weft_inject::die::phase("run");
            weft_inject::die::at("running");
        }
        // The breakpoint set-up is no longer needed (the kernel keeps it a moment).
        self.warm = None;
        Ok(())
    }

    /// Patch `w`'s sites (and the internal ones planned with them), one stop per
    /// member; how long the members were stopped in all.
    fn patch(&mut self, w: &Weaving) -> Result<Duration> {
        let mut paused = Duration::ZERO;
        for (space, sites) in &w.sites {
            let internal = w.internal.iter().find(|(s, _)| s == space);
            let sites: Vec<usize> = sites
                .iter()
                .chain(internal.into_iter().flat_map(|(_, v)| v))
                .copied()
                .collect();
            let Some(i) = self
                .members
                .iter()
                .position(|m| m.space == *space && m.alive)
            else {
                continue;
            };
            let (seg, note) = (&self.seg, self.opts.note);
            let report =
                match self.members[i].patch(seg, &sites, &mut |l| note(&format!("weft: {l}"))) {
                    Ok(r) => r,
                    Err(e) => {
                        self.member_failed(i, e, "patching")?;
                        continue;
                    }
                };
            paused += report.pause;
            self.verbose(&format!(
                "patched {} sites in {} threads; target paused {:.2} ms{}",
                report.patched,
                report.threads,
                report.pause.as_secs_f64() * 1e3,
                if report.stepped_threads > 0 {
                    format!(
                        " ({} threads stepped out of patched bytes)",
                        report.stepped_threads
                    )
                } else {
                    String::new()
                }
            ));
        }
        Ok(paused)
    }

    /// Weave `probes` (indices of the program's probes) into every member while the
    /// session runs: resolve, compile, write code, patch (one stop per process).
    pub fn weave(&mut self, probes: &[usize]) -> Result<Weaving> {
        let (mut w, _) = self.plan(probes, None)?;
        w.pause = self.patch(&w)?;
        w.woven = true;
        Ok(w)
    }

    /// Take `w`'s sites out while the processes run (no stop: the agents write the
    /// original bytes with the int3-first sequence). Their code stays until the
    /// session ends, so [`Session::reweave`] is cheap.
    pub fn unweave(&mut self, w: &mut Weaving) -> Result<()> {
        for (i, sites) in self.members_sites(w) {
            if let Err(e) = self.members[i].disable(&sites) {
                self.member_failed(i, e, "unweaving")?;
            }
        }
        w.woven = false;
        Ok(())
    }

    /// `w`'s sites in each live member: those it was woven into, and the children
    /// they forked since (which have copies of their parent's sites).
    fn members_sites(&self, w: &Weaving) -> Vec<(usize, Vec<usize>)> {
        let mut out = Vec::new();
        for (i, m) in self.members.iter().enumerate() {
            if !m.alive {
                continue;
            }
            let mine = w
                .sites
                .iter()
                .find_map(|(space, sites)| self.sites_in(m, *space, sites));
            if let Some(sites) = mine.filter(|s| !s.is_empty()) {
                out.push((i, sites));
            }
        }
        out
    }

    /// Member `m`'s sites for the sites `sites` of site space `space`: the same if
    /// it is that space, its copies if it descends from the member that is.
    fn sites_in(&self, m: &Member, space: u32, sites: &[usize]) -> Option<Vec<usize>> {
        if m.space == space {
            return Some(sites.to_vec());
        }
        let (parent_space, map) = m.origin.as_ref()?;
        let parent = self.members.iter().find(|p| p.space == *parent_space)?;
        let theirs = self.sites_in(parent, space, sites)?;
        Some(theirs.iter().filter_map(|k| map.get(k).copied()).collect())
    }

    /// Put `w`'s sites back: while the processes run for sites whose patch
    /// replaces one instruction (placeholders, int3 sites), with one stop per
    /// process for the others. Returns how many processes had to be stopped.
    pub fn reweave(&mut self, w: &mut Weaving) -> Result<usize> {
        let mut stops = 0;
        w.pause = Duration::ZERO;
        for (i, sites) in self.members_sites(w) {
            let seg = &self.seg;
            match self.members[i].enable(seg, &sites) {
                Ok(Some(pause)) => {
                    stops += 1;
                    w.pause += pause;
                }
                Ok(None) => {}
                Err(e) => self.member_failed(i, e, "weaving")?,
            }
        }
        w.woven = true;
        Ok(stops)
    }

    /// Agents that joined by themselves (the session follows children): a forked
    /// child, adopted with copies of its parent's sites; a program a member (or a
    /// child of one) exec'd, or a process a member spawned, woven like a new
    /// member. Returns how many joined.
    fn accept_joiners(&mut self, sink: &mut dyn Sink) -> Result<usize> {
        let mut joined = 0;
        loop {
            let members: Vec<i32> = self.members.iter().map(|m| m.pid).collect();
            let related = |pid: i32| {
                members.contains(&pid)
                    || target::parent_of(pid).is_some_and(|pp| members.contains(&pp))
            };
            let Some((agent, pid)) = self.listener.try_accept(related)? else {
                return Ok(joined);
            };
            joined += 1;
            let (parent, parent_space) = (agent.hello.parent, agent.hello.parent_space);
            let space = self.members.len() as u32 + 1;
            if parent != 0 {
                let Some(p) = self.members.iter().position(|m| m.space == parent_space) else {
                    // Not a session of ours: dropping the connection makes the child
                    // unweave itself.
                    continue;
                };
                match Member::forked(pid, agent, &self.members[p], &self.seg, space) {
                    Ok(m) => {
                        self.verbose(&format!("process {pid} (forked by {parent}) joined"));
                        self.members.push(m);
                    }
                    // Ended, or exec'd (its new image joins by itself): not an error.
                    Err(e) if !target::alive(pid) || is_broken_connection(&e) => {
                        self.verbose(&format!("process {pid} (forked by {parent}) went: {e:#}"));
                        continue;
                    }
                    Err(e) => {
                        self.note(&format!(
                            "process {pid} (forked by {parent}) left out: {e:#}"
                        ));
                        continue;
                    }
                }
            } else {
                // The same pid: the member exec'd a new program (its old image and
                // sites are gone with it).
                for m in self.members.iter_mut().filter(|m| m.pid == pid && m.alive) {
                    m.alive = false;
                }
                if let Err(e) = self.join(pid, agent, None) {
                    self.note(&format!("process {pid} left out: {e:#}"));
                    continue;
                }
                self.weave_late_member(self.members.len() - 1)?;
                self.verbose(&format!("process {pid} joined"));
            }
            if parent != 0 {
                // (An exec'd or spawned one was recorded when it joined.)
                self.pending.push(joined_record(pid));
            }
            let pending = std::mem::take(&mut self.pending);
            self.deliver(&pending, sink);
        }
    }

    /// The probes this session runs: all, or those `--probe-filter` kept.
    fn selected(&self) -> Vec<usize> {
        match &self.opts.only_probes {
            Some(o) => o.clone(),
            None => (0..self.prog.probes.len()).collect(),
        }
    }

    /// Weave the whole program into member `i`, which joined while the session runs,
    /// and let it go on.
    fn weave_late_member(&mut self, i: usize) -> Result<()> {
        let all: Vec<usize> = self.selected();
        let (w, _) = self.plan(&all, Some(i))?;
        self.patch(&w)?;
        if self.members[i].alive {
            if let Err(e) = self.members[i].agent.go() {
                self.member_failed(i, e, "starting")?;
            }
        } else {
            // Left out (nothing of it could be woven): a process caught as it
            // started is held in its agent until `GO`; let it run, unwoven.
            let _ = self.members[i].agent.go();
        }
        Ok(())
    }

    /// Weave the processes the kernel caught as they started (system-wide): each is
    /// stopped; its one thread is held in the agent until its probes are in
    /// (`target::attach_held`); one with several threads (a `dlopen` of a probed
    /// library) is attached the usual way. A process that cannot be woven is
    /// reported once and let go.
    fn join_caught(&mut self) {
        self.poll_caught();
        for pid in std::mem::take(&mut self.caught) {
            // The kernel stops every process at `__libc_start_main`: let go one that
            // maps no probed file. (Without the kernel, `/proc` found it by its maps.)
            let stops = self.watcher.as_ref().is_some_and(|w| w.stops());
            if stops && !self.watcher.as_ref().is_some_and(|w| w.concerns(pid)) {
                self.resume_caught(pid);
                self.verbose(&format!(
                    "process {pid} caught, maps no probed file: let go"
                ));
                continue;
            }
            weft_inject::die::at("caught");
            // A member caught again has exec'd: its old image (and agent) is gone.
            for m in self.members.iter_mut().filter(|m| m.pid == pid && m.alive) {
                m.alive = false;
            }
            let t0 = Instant::now();
            match self.weave_caught(pid) {
                Ok(t) => self.verbose(&format!(
                    "process {pid} joined as it started: held {:.1} ms (agent loaded in {:.1} ms, \
                     connected in {:.1}, woven in {:.1})",
                    t0.elapsed().as_secs_f64() * 1e3,
                    t[0].as_secs_f64() * 1e3,
                    t[1].as_secs_f64() * 1e3,
                    t[2].as_secs_f64() * 1e3
                )),
                Err(e) => {
                    if let Some(m) = self.members.iter_mut().find(|m| m.pid == pid && m.alive) {
                        // Held in its agent until `GO`: let it run, unwoven.
                        let _ = m.agent.go();
                        m.alive = false;
                    }
                    if self.refused.insert(pid) {
                        self.verbose(&format!("process {pid} left out: {e:#}"));
                    }
                }
            }
            self.resume_caught(pid);
        }
    }

    fn resume_caught(&mut self, pid: i32) {
        if let Some(w) = self.watcher.as_mut() {
            w.resume(pid);
        }
    }

    /// Weave caught process `pid`; how long loading the agent, the handshake and the
    /// weave took.
    fn weave_caught(&mut self, pid: i32) -> Result<[Duration; 3]> {
        let t0 = Instant::now();
        let agent = target::agent_path()?;
        let threads = std::fs::read_dir(format!("/proc/{pid}/task"))
            .map(|d| d.count())
            .unwrap_or(0);
        let stopped = self.watcher.as_ref().is_some_and(|w| w.stops());
        if stopped && threads == 1 {
            target::attach_held(pid, &agent, &self.listener.name)?;
        } else {
            if stopped {
                crate::watch::resume_caught(pid);
            }
            target::attach(pid, &agent, &self.listener.name, None)?;
        }
        // Held (or attached): it may run now; its thread waits in the agent.
        if stopped {
            crate::watch::resume_caught(pid);
        }
        weft_inject::die::at("held");
        let t1 = Instant::now();
        let a = self.accept_agent(pid)?;
        self.join(pid, a, None)?;
        let t2 = Instant::now();
        self.weave_late_member(self.members.len() - 1)?;
        Ok([t1 - t0, t2 - t1, t2.elapsed()])
    }

    /// Deliver events, run interval probes, until `exit()`, every target ends, or
    /// `stop` is raised.
    pub fn run(&mut self, sink: &mut dyn Sink, stop: &AtomicBool) -> Result<RunEnd> {
        self.run_until(sink, stop, None)
    }

    /// [`Session::run`], returning [`RunEnd::Deadline`] once `until` has passed
    /// (after a drain), so a caller can act on the session between runs (`weft
    /// fperf`'s quota control). Interval probes restart their period at each call.
    pub fn run_until(
        &mut self,
        sink: &mut dyn Sink,
        stop: &AtomicBool,
        until: Option<Instant>,
    ) -> Result<RunEnd> {
        let start = Instant::now();
        let mut next_release = start;
        let mut next_tick: Vec<Instant> = self
            .intervals
            .iter()
            .map(|&(_, _, p)| start + Duration::from_nanos(p))
            .collect();
        // Drains in a row that found nothing: weft looks less often while idle
        // (5, 10, then 20 ms), and at once again every 5 ms when events come.
        let mut idle = 0u32;
        loop {
            if self.decoder.exited {
                return Ok(RunEnd::Exit);
            }
            if stop.load(Ordering::Acquire) {
                return Ok(RunEnd::Stopped);
            }
            self.seg.tick_clock();
            let now = Instant::now();
            for (k, &(i, probe, period)) in self.intervals.iter().enumerate() {
                if now >= next_tick[k] {
                    self.local.run(i, probe);
                    self.local_ran = true;
                    next_tick[k] += Duration::from_nanos(period);
                    if next_tick[k] < now {
                        next_tick[k] = now + Duration::from_nanos(period);
                    }
                }
            }
            let drained = self.drain(sink);
            if drained == 0 {
                idle = (idle + 1).min(2);
            } else {
                idle = 0;
            }
            if sink.wants_maps() {
                self.live_maps(sink);
            }
            if self.opts.follow_fork {
                self.accept_joiners(sink)?;
            }
            if self.watcher.is_some() {
                self.join_caught();
            }
            self.bind_watches();
            if Instant::now() >= next_release {
                self.release_gone_processes();
                self.join_group_members();
                next_release = Instant::now() + Duration::from_millis(100);
            }
            if !self.members.is_empty() && self.reap_members(sink)? && !self.opts.system_wide {
                return Ok(RunEnd::TargetsGone);
            }
            if self.seg.shm.header().exit_requested.load(Ordering::Acquire) != 0 {
                self.drain(sink);
                return Ok(RunEnd::Exit);
            }
            if self.decoder.exited {
                return Ok(RunEnd::Exit);
            }
            if until.is_some_and(|u| Instant::now() >= u) {
                return Ok(RunEnd::Deadline);
            }
            let sleep = next_tick
                .iter()
                .chain(until.as_ref())
                .map(|t| t.saturating_duration_since(Instant::now()))
                .min();
            // Lossless rings (`weft record`): their producers wait for room, so
            // weft looks every millisecond, and at once again while events come.
            let poll = if self.opts.sizes.lossless {
                if drained > 0 {
                    Duration::ZERO
                } else {
                    Duration::from_millis(1)
                }
            } else if self.binds_watches() {
                // Advice that stored a `set:addr` address waits for weft to arm it.
                Duration::from_millis(1)
            } else {
                Duration::from_millis(5 << idle)
            };
            let sleep = sleep.unwrap_or(poll).min(poll);
            match &self.watcher {
                // Woken as soon as the kernel catches a process.
                Some(w) => w.wait(sleep),
                None => std::thread::sleep(sleep),
            }
        }
    }

    /// Processes a group names that are not members of the session (advice ran
    /// `add(GROUP, PID)` for them): attached and woven, like a process caught at
    /// its start, within 100 ms of the add. One that cannot be is left out once,
    /// said with `-v`.
    fn join_group_members(&mut self) {
        let shm = &self.seg.shm;
        let mut want = Vec::new();
        for (id, m) in self.prog.maps.iter().enumerate() {
            if !weft_ir::is_inherited_map(&m.name) {
                continue;
            }
            let d = shm.map(id as u32);
            if d.flags & weft_abi::MAP_FLAG_INHERIT_PID == 0 {
                continue;
            }
            for i in weft_runtime::map::live_entries(shm, d) {
                let key = weft_runtime::map::key_bytes(shm, d, i);
                let Ok(k) = <[u8; 8]>::try_from(key) else {
                    continue;
                };
                let pid = u64::from_le_bytes(k);
                // SAFETY: a live plain entry's value, at least 8 bytes.
                let v = unsafe {
                    core::ptr::read_volatile(
                        weft_runtime::map::plain_value_ptr(shm, d, i) as *const u64
                    )
                };
                if v != 0 && pid > 0 && pid <= i32::MAX as u64 {
                    want.push(pid as i32);
                }
            }
        }
        for pid in want {
            // A member's forked child joins by itself (it has the agent, and its
            // membership came with it), as does a process weft is already weaving.
            let member = |p: i32| self.members.iter().any(|m| m.pid == p && m.alive);
            if self.refused.contains(&pid)
                || member(pid)
                || target::parent_of(pid).is_some_and(member)
                || pid as u32 == std::process::id()
                || !target::alive(pid)
            {
                continue;
            }
            let joined = self.attach(pid).and_then(|()| {
                let i = self.members.len() - 1;
                self.weave_late_member(i).map(|_| ())
            });
            match joined {
                Ok(()) => self.verbose(&format!("process {pid} joined: added to a group")),
                Err(e) => {
                    if let Some(m) = self.members.iter_mut().find(|m| m.pid == pid && m.alive) {
                        // Held in its agent until `GO`: let it run, unwoven.
                        let _ = m.agent.go();
                        m.alive = false;
                    }
                    self.refused.insert(pid);
                    self.note(&format!("process {pid} (added to a group) left out: {e:#}"));
                }
            }
        }
    }

    /// Whether some member has a `set:addr(@p, N)` watch.
    fn binds_watches(&self) -> bool {
        self.members
            .iter()
            .any(|m| m.alive && m.watches.iter().any(|(_, w, _)| w.map.is_some()))
    }

    /// [`Self::rearm_watches`], then the advice waiting since it stored an
    /// address (`weft_abi::Helper::WatchBind`) goes on: every request made before
    /// weft looked at the maps is answered.
    fn bind_watches(&mut self) {
        let h = self.seg.shm.header();
        let req = h.watch_bind_req.load(Ordering::Acquire);
        self.rearm_watches();
        let h = self.seg.shm.header();
        if h.watch_bind_done.load(Ordering::Relaxed) < req {
            h.watch_bind_done.store(req, Ordering::Release);
        }
    }

    /// `set:addr(@p, N)`: (re)arm each member's watch at the address `@p` holds
    /// when it changed since the last look (every pass of the run loop, every
    /// millisecond while there are such watches). The advice that stored the
    /// address waits for this (see [`Self::bind_watches`]), so no access after the
    /// store is missed; an address of 0 disarms the watch.
    fn rearm_watches(&mut self) {
        let shm = &self.seg.shm;
        let mut notes = Vec::new();
        // Said without -v: the user asked for what cannot be done.
        let mut warnings = Vec::new();
        for m in self.members.iter().filter(|m| m.alive) {
            for (index, w, advice) in &m.watches {
                let Some(map) = &w.map else { continue };
                let Some(id) = self.prog.maps.iter().position(|d| &d.name == map) else {
                    continue;
                };
                let d = shm.map(id as u32);
                if d.kind != MapKind::Plain as u32 {
                    continue;
                }
                let addr = if weft_runtime::map::entry_state(shm, d, 0) == ENTRY_LIVE {
                    let p = weft_runtime::map::plain_value_ptr(shm, d, 0);
                    // SAFETY: a live plain entry's value, at least 8 bytes of an
                    // integer map value, in the mapped segment.
                    unsafe { core::ptr::read_volatile(p as *const u64) }
                } else {
                    0
                };
                let last = self.armed.entry((m.pid, *index)).or_insert(0);
                if *last == addr {
                    continue;
                }
                *last = addr;
                let mut desc = crate::member::watch_desc(w, addr, *advice);
                if w.access & weft_abi::WATCH_PAGE == 0
                    && !addr.is_multiple_of(u64::from(w.len.max(1)))
                {
                    if self.opts.data_mechanism == crate::data::Mechanism::Hardware {
                        warnings.push(format!(
                            "{}: {addr:#x} is not aligned to {} bytes: a hardware watchpoint \
                             cannot watch it, and --data-mechanism hw allows nothing else; \
                             not watched",
                            w.label, w.len
                        ));
                        continue;
                    }
                    notes.push(format!(
                        "{}: {addr:#x} is not aligned to {} bytes: falls back to page \
                         protection",
                        w.label, w.len
                    ));
                    desc.access |= weft_abi::WATCH_PAGE;
                }
                match m.agent.set_watch(*index, desc) {
                    Ok(()) => notes.push(format!(
                        "{}: watching {} bytes at {addr:#x} in process {}",
                        w.label, w.len, m.pid
                    )),
                    Err(e) => notes.push(format!("{}: {e:#}", w.label)),
                }
            }
        }
        for n in notes {
            self.verbose(&n);
        }
        for w in warnings {
            self.note(&w);
        }
    }

    /// Slots of threads whose process is gone (a member that exited, a child
    /// that ended before it was adopted): no agent is left there to say so, so weft
    /// does, and the slots are drained and reused like those of any thread that
    /// ended. A pid reused meanwhile only delays it.
    fn release_gone_processes(&mut self) {
        let mut gone: HashMap<u32, bool> = HashMap::new();
        for (idx, pid) in weft_runtime::slots::live(&self.seg.shm) {
            if pid == 0 {
                continue;
            }
            let dead = *gone
                .entry(pid)
                .or_insert_with(|| !target::alive(pid as i32));
            if dead {
                weft_runtime::slots::release_index(&self.seg.shm, idx);
            }
        }
    }

    /// Notice members that ended; true when none is left.
    fn reap_members(&mut self, sink: &mut dyn Sink) -> Result<bool> {
        use std::os::unix::process::ExitStatusExt;
        let mut left = Vec::new();
        let mut killed = Vec::new();
        for m in &mut self.members {
            if !m.alive {
                continue;
            }
            let gone = match m.child.as_mut() {
                // As bpftrace: weft's status does not follow the command's; but a
                // command a signal ended is said (a crash is never silent).
                Some(c) => match c.try_wait()? {
                    Some(st) => {
                        // Not the signals that ask a program to end (a
                        // terminal's Ctrl-C reaches the command with weft).
                        let asked = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGQUIT];
                        if let Some(sig) = st.signal().filter(|s| !asked.contains(s)) {
                            let core = if st.core_dumped() {
                                " (core dumped)"
                            } else {
                                ""
                            };
                            killed.push(format!(
                                "the command (pid {}) was killed by {}{core}",
                                m.pid,
                                weft_inject::signal_name(sig)
                            ));
                        }
                        true
                    }
                    None => false,
                },
                None => !target::alive(m.pid),
            };
            if gone {
                m.alive = false;
                left.push(Record {
                    nsecs: weft_runtime::clock::monotonic_ns(),
                    pid: m.pid as u32,
                    tid: m.pid as u32,
                    event: weft_trace::Event::ProcessLeft { pid: m.pid as u32 },
                });
            }
        }
        for k in killed {
            self.note(&k);
        }
        if !left.is_empty() {
            self.deliver(&left, sink);
        }
        Ok(self.members.iter().all(|m| !m.alive))
    }

    /// End the session: every member still alive is unwoven; END runs; the sink
    /// gets the final maps; then a launched command still running (the session
    /// ended by `exit()`, a signal or a limit) is ended, as bpftrace ends it: SIGTERM,
    /// and SIGKILL if it is still there a second later. Returns what advice could
    /// not do, and thread counts.
    pub fn finish(mut self, sink: &mut dyn Sink) -> Result<Finished> {
        // No process is caught from now on; those caught go on unwoven.
        if let Some(mut w) = self.watcher.take() {
            for pid in std::mem::take(&mut self.caught) {
                w.resume(pid);
            }
            w.stop();
        }
        // Unweave while the targets live. One that died meanwhile (a terminal's
        // Ctrl-C reaches the command too) has nothing left to unweave: not an error,
        // as for bpftrace.
        let mut notes = Vec::new();
        for m in &mut self.members {
            if !m.alive {
                continue;
            }
            if member_gone(m) {
                m.alive = false;
                continue;
            }
            if let Err(e) = m.unweave(&self.seg) {
                if member_gone(m) {
                    m.alive = false;
                } else {
                    notes.push(format!("{e:#}"));
                }
            }
        }
        for n in notes {
            self.note(&n);
        }
        self.drain(sink);
        // END, maps, losses. END reads what kernel probes wrote as it is now (a
        // SystemTap script's `probe end` walks the counts syscall probes made).
        self.decoder.resume();
        if !self.end.is_empty() {
            if let Some(k) = self.kernel.as_mut() {
                if let Err(e) = k.sync(&self.seg.shm) {
                    (self.opts.note)(&format!("weft: reading the kernel probes' maps: {e:#}"));
                }
            }
        }
        for &(i, probe) in &self.end {
            self.local.run(i, probe);
        }
        self.local_ran = true;
        self.drain(sink);
        if let Some(k) = self.kernel.as_mut() {
            if let Err(e) = k.sync(&self.seg.shm) {
                (self.opts.note)(&format!("weft: reading the kernel probes' maps: {e:#}"));
            }
        }
        let maps = decode::all_maps(&self.seg.shm, self.prog);
        sink.finish(&maps, &self.context());
        sink.flush();
        let h = self.seg.shm.header();
        let finished = Finished {
            losses: Losses::of(&self.seg.shm, self.prog),
            had_targets: !self.members.is_empty(),
            threads_peak: h.threads_live_peak.load(Ordering::Relaxed),
            max_live: h.max_live,
            threads_retired: h.threads_retired.load(Ordering::Relaxed),
            // As a process exit status: the low 8 bits.
            exit_code: (self.decoder.exit_code & 0xff) as i32,
        };
        for m in &mut self.members {
            if let Some(c) = m.child.as_mut() {
                end_child(c)?;
            }
        }
        Ok(finished)
    }

    /// Kill launched commands (the session failed before they could run); let
    /// caught processes go.
    pub fn abandon(&mut self) {
        if let Some(mut w) = self.watcher.take() {
            for pid in std::mem::take(&mut self.caught) {
                w.resume(pid);
            }
            w.stop();
        }
        for m in &mut self.members {
            if let Some(c) = m.child.as_mut() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }

    /// Every map as it is now, to a sink that asked for them (an exporter): the
    /// kernel probes' maps are mirrored first. Read in the run loop, the one thread
    /// that reads the segment, between drains.
    fn live_maps(&mut self, sink: &mut dyn Sink) {
        if let Some(k) = self.kernel.as_mut() {
            if let Err(e) = k.sync(&self.seg.shm) {
                (self.opts.note)(&format!("weft: reading the kernel probes' maps: {e:#}"));
            }
        }
        let maps = decode::all_maps(&self.seg.shm, self.prog);
        sink.maps(&maps, &self.context());
    }

    /// Map `id`'s merged entries now (every member's threads, ended ones too).
    pub fn snapshot(&self, id: u32) -> weft_trace::MapSnapshot {
        decode::snapshot(&self.seg.shm, self.prog, id, 0, 0)
    }

    /// Whether every member has exited.
    pub fn targets_gone(&self) -> bool {
        !self.members.is_empty() && self.members.iter().all(|m| !m.alive)
    }

    /// The first member's process id (for messages).
    pub fn first_pid(&self) -> Option<i32> {
        self.members.first().map(|m| m.pid)
    }

    fn context(&self) -> Context<'_> {
        Context {
            prog: self.prog,
            resolver: &self.resolver,
        }
    }

    /// Deliver every pending record to `sink`; how many there were.
    fn drain(&mut self, sink: &mut dyn Sink) -> usize {
        let mut records = std::mem::take(&mut self.pending);
        let Some(k) = self.kernel.as_mut() else {
            records.extend(self.decoder.drain(&self.seg.shm, self.prog));
            self.deliver(&records, sink);
            return records.len();
        };
        // The kernel's events join the processes'; its maps are mirrored before
        // anything that reads or resets maps is decoded.
        let note = self.opts.note;
        loop {
            let more = k.pump(&self.seg.shm);
            let due = k.due();
            let shm = &self.seg.shm;
            let mut sync = || {
                if let Err(e) = k.sync(shm) {
                    note(&format!("weft: reading the kernel probes' maps: {e:#}"));
                }
            };
            // Local advice may read them; and what advice in processes reads
            // of them is at most SYNC_EVERY old.
            if self.local_ran || due {
                self.local_ran = false;
                sync();
            }
            records.extend(self.decoder.drain_with(shm, self.prog, &mut sync));
            for (map, zero) in std::mem::take(&mut self.decoder.cleared) {
                k.cleared(map, zero);
            }
            if !more || self.decoder.exited {
                break;
            }
        }
        self.deliver(&records, sink);
        records.len()
    }

    fn deliver(&self, records: &[Record], sink: &mut dyn Sink) {
        let cx = self.context();
        for r in records {
            self.resolver.current.set(r.pid);
            sink.record(r, &cx);
        }
        sink.flush();
    }
}

/// The thread id of the slot weft keeps for the kernel probes' events and maps (no
/// thread has it: tids stop below 2^22).
const KERNEL_TID: u32 = u32::MAX - 1;

/// Symbolizes target addresses (in the process of the record being delivered) and
/// names probes for the sinks.
struct SessionResolver {
    symbolizers: RefCell<HashMap<u32, Symbolizer>>,
    /// Process of the record being delivered (0: none, e.g. the final maps).
    current: Cell<u32>,
    probe_names: Vec<String>,
    formats: Vec<Format>,
    show_debug_info: bool,
}

impl Resolver for SessionResolver {
    fn show_debug_info(&self) -> bool {
        self.show_debug_info
    }

    fn source_frames(&self, addr: u64) -> Vec<weft_output::SourceFrame> {
        let mut all = self.symbolizers.borrow_mut();
        let current = self.current.get();
        let mut pids: Vec<u32> = all.keys().copied().collect();
        pids.sort_by_key(|&p| p != current);
        for pid in pids {
            let Some(s) = all.get_mut(&pid) else { continue };
            if s.module_of(addr).is_none() {
                continue;
            }
            return s
                .source_frames(addr)
                .into_iter()
                .map(|f| weft_output::SourceFrame {
                    function: f.demangled.or(f.function),
                    file: f.file,
                    line: f.line,
                    inlined: f.inlined,
                })
                .collect();
        }
        Vec::new()
    }

    fn usym(&self, addr: u64) -> Option<Symbol> {
        let mut all = self.symbolizers.borrow_mut();
        let current = self.current.get();
        // The record's process first, then any member that maps the address.
        let mut pids: Vec<u32> = all.keys().copied().collect();
        pids.sort_by_key(|&p| p != current);
        for pid in pids {
            let s = all.get_mut(&pid)?;
            if s.module_of(addr).is_none() {
                continue;
            }
            let sym = s.symbolize(addr)?;
            return Some(Symbol {
                name: sym.demangled.or(sym.name)?,
                offset: sym.offset,
                module: sym.module.display().to_string(),
            });
        }
        None
    }

    fn probe_name(&self, id: u64) -> String {
        self.probe_names
            .get(id as usize)
            .cloned()
            .unwrap_or_else(|| format!("probe{id}"))
    }

    fn format(&self, id: FmtId) -> Option<&Format> {
        self.formats.get(id.0 as usize)
    }
}

/// `ProcessJoined` for `pid`, now.
fn joined_record(pid: i32) -> Record {
    let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
    Record {
        nsecs: weft_runtime::clock::monotonic_ns(),
        pid: pid as u32,
        tid: pid as u32,
        event: weft_trace::Event::ProcessJoined {
            pid: pid as u32,
            comm: comm.trim().to_string(),
        },
    }
}

/// The agent's end of the connection is gone (its process exited or exec'd).
fn is_broken_connection(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>().is_some_and(|io| {
            matches!(
                io.kind(),
                std::io::ErrorKind::BrokenPipe | std::io::ErrorKind::ConnectionReset
            )
        })
    }) || {
        // As `conn` words a connection the target's end closed, at any depth.
        let s = format!("{e:#}");
        s.contains("closed the connection") || s.contains("connection closed")
    }
}

fn proc_ids(pid: i32) -> Option<(u64, u64)> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |k: &str| {
        s.lines()
            .find(|l| l.starts_with(k))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
    };
    Some((field("Uid:")?, field("Gid:")?))
}

/// Ends a launched command that is still running when its session ends: SIGTERM,
/// then SIGKILL after a second; reaps it.
/// Whether a member's process has exited (a zombie counts: nothing runs there).
fn member_gone(m: &mut Member) -> bool {
    match m.child.as_mut().map(|c| c.try_wait()) {
        Some(Ok(Some(_))) => true,
        // Reaped already (a wait of the unweave's stop of the world took it).
        Some(Err(e)) if e.raw_os_error() == Some(libc::ECHILD) => true,
        _ => !target::alive(m.pid),
    }
}

fn end_child(c: &mut std::process::Child) -> Result<()> {
    match c.try_wait() {
        Ok(Some(_)) => return Ok(()),
        // Reaped already: see `member_gone`.
        Err(e) if e.raw_os_error() == Some(libc::ECHILD) => return Ok(()),
        Err(e) => return Err(e.into()),
        Ok(None) => {}
    }
    // SAFETY: signalling our own child, not yet reaped.
    unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
    let deadline = Instant::now() + Duration::from_secs(1);
    while Instant::now() < deadline {
        if c.try_wait()?.is_some() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let _ = c.kill();
    c.wait()?;
    Ok(())
}
