//! One `weft trace` run, start to finish:
//! compile → get the agent into the target → resolve sites → lay out the segment →
//! compile advice and trampolines → BEGIN → patch → poll events → unweave → END →
//! print maps and losses.

use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::ops::Range;
use std::path::PathBuf;
use std::process::Child;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use weft_ir::{AttachPoint, Program};
use weft_jit::Env;
use weft_symbols::{ProcMaps, Symbolizer};

use crate::conn::{Agent, Listener};
use crate::local::Local;
use crate::printer::{losses, OutputFormat, Printer, SessionResolver};
use crate::segment::{Segment, Sizes};
use crate::weave::{Call, Outcome, Planned, SiteSpec, Weaver};
use crate::{patch, target};

/// Where the probes go.
#[derive(Clone, Debug)]
pub enum Target {
    /// No process: only BEGIN/END/interval probes.
    None,
    /// Launch a command (argv).
    Launch(Vec<String>),
    /// Attach to a running process.
    Attach(i32),
}

#[derive(Clone, Debug)]
pub struct TraceOptions {
    pub target: Target,
    pub output: Option<PathBuf>,
    pub format: OutputFormat,
    pub quiet: bool,
    pub verbose: bool,
    pub unsafe_ok: bool,
    pub sizes: Sizes,
    /// Compile simple advice into trampolines.
    pub inline: bool,
}

static STOP: AtomicBool = AtomicBool::new(false);
static STOP_SIGNAL: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_stop_signal(sig: libc::c_int) {
    STOP_SIGNAL.store(sig, Ordering::Relaxed);
    STOP.store(true, Ordering::Release);
}

fn install_stop_handlers() {
    for sig in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: a handler that only stores to atomics.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_stop_signal as *const () as usize;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(sig, &sa, std::ptr::null_mut());
        }
    }
}

/// A probe body and where it runs.
struct ProbeRef<'p> {
    body: &'p weft_ir::Function,
}

/// Run a checked program. Returns the exit status.
pub fn trace(prog: &Program, opts: &TraceOptions) -> Result<i32> {
    install_stop_handlers();
    // The kernel's first hardware breakpoint is slow (see `weft_inject::warm`): paid
    // while weft starts, not while the target is stopped.
    let mut warm = matches!(opts.target, Target::Attach(_)).then(weft_inject::warm::Warm::start);
    let needs_target = prog
        .probes
        .iter()
        .any(|p| p.attach.iter().any(AttachPoint::runs_in_target));
    if needs_target && matches!(opts.target, Target::None) {
        bail!("uprobe probes need a target process: give -p PID or -c 'CMD' (or -- CMD ARGS...)");
    }
    let out: Box<dyn Write> = match &opts.output {
        Some(p) => Box::new(std::io::BufWriter::new(
            std::fs::File::create(p).with_context(|| format!("creating {}", p.display()))?,
        )),
        None => Box::new(std::io::stdout()),
    };
    let mut probe_names = ProbeNames::new(&prog.probe_names);

    // 1. The target and its agent.
    let mut child: Option<Child> = None;
    let mut conn: Option<(Agent, i32)> = None;
    let listener = Listener::new()?;
    match &opts.target {
        Target::None => {}
        Target::Launch(argv) => {
            let agent = target::agent_path()?;
            let mut c = target::launch(argv, &agent, &listener.name)?;
            let pid = c.id() as i32;
            let a = listener.accept(pid, Duration::from_secs(30), || match c.try_wait()? {
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
            child = Some(c);
            conn = Some((a, pid));
        }
        Target::Attach(pid) => {
            let agent = target::agent_path()?;
            let pid = *pid;
            let report = target::attach(pid, &agent, &listener.name, warm.as_mut())?;
            if opts.verbose {
                let moved = match (report.ran_out, report.stepped_out) {
                    (0, 0) => String::new(),
                    (r, s) => format!(
                        "; threads moved out of the C library: {r} run to their callers, {s} single-stepped"
                    ),
                };
                eprintln!(
                    "weft: agent loaded into {pid} (target paused {:.1} ms{moved})",
                    report.pause.as_secs_f64() * 1e3
                );
            }
            let a = listener.accept(pid, Duration::from_secs(10), || {
                if target::alive(pid) {
                    Ok(())
                } else {
                    bail!("process {pid} exited while weft was attaching")
                }
            })?;
            conn = Some((a, pid));
        }
    }
    if conn.is_some() {
        weft_inject::die::at("handshake");
    }
    let result = run(
        prog,
        opts,
        out,
        &mut probe_names,
        conn.as_ref(),
        child.as_mut(),
    );
    // A target that dies mid-session breaks the agent's connection: say what happened.
    let result = match (result, &conn) {
        (Err(e), Some((_, pid))) if !target::alive(*pid) => {
            Err(e.context(format!("process {pid} exited while weft was working on it")))
        }
        (r, _) => r,
    };
    if let Some(mut c) = child {
        if result.is_err() {
            let _ = c.kill();
        }
        let _ = c.wait();
    }
    result
}

fn run(
    prog: &Program,
    opts: &TraceOptions,
    out: Box<dyn Write>,
    probe_names: &mut ProbeNames,
    conn: Option<&(Agent, i32)>,
    mut child: Option<&mut Child>,
) -> Result<i32> {
    let pid = conn.map_or(0, |c| c.1);
    // 2. The shared segment.
    let seg = Segment::create(prog, opts.sizes, pid as u32)?;
    if let Some((_, pid)) = conn {
        let (uid, gid) = proc_ids(*pid).unwrap_or((0, 0));
        let cpid = if matches!(opts.target, Target::Launch(_)) {
            *pid as u64
        } else {
            0
        };
        seg.set_target(*pid as u32, cpid, uid, gid);
    }
    // SAFETY: gettid has no preconditions.
    let own_slot = seg.claim_own_slot(unsafe { libc::gettid() } as u32);

    // 3. Local probes (BEGIN, END, interval) compiled for weft itself.
    let mut begin = Vec::new();
    let mut end = Vec::new();
    let mut intervals = Vec::new();
    let mut local_bodies = Vec::new();
    for (p, names) in prog.probes.iter().zip(attach_name_indices(prog)) {
        for (a, name) in p.attach.iter().zip(names) {
            let slot = local_bodies.len();
            match a {
                AttachPoint::Begin => begin.push((slot, name)),
                AttachPoint::End => end.push((slot, name)),
                AttachPoint::Interval { period_ns } => intervals.push((slot, name, *period_ns)),
                _ => continue,
            }
            local_bodies.push(ProbeRef { body: &p.body });
        }
    }
    let bodies: Vec<&weft_ir::Function> = local_bodies.iter().map(|r| r.body).collect();
    let mut local = Local::new(
        prog,
        &bodies,
        &seg.maps,
        seg.layout.agg_off,
        seg.shm,
        own_slot,
    )?;

    // 4. Sites in the target.
    let t_sites = Instant::now();
    let mut planned: Vec<Planned> = Vec::new();
    let mut redirects: Vec<Planned> = Vec::new();
    let mut redirect_bodies: Vec<Range<u64>> = Vec::new();
    let mut code_ranges: Vec<Range<u64>> = Vec::new();
    let mut symbolizer = None;
    let mut site_probes = 0usize;
    if let Some((agent, pid)) = conn {
        let (base, generation) =
            agent.map_shm(std::os::fd::AsRawFd::as_raw_fd(&seg.fd), seg.size())?;
        weft_inject::die::at("shm-mapped");
        let maps = ProcMaps::read(*pid as u32).map_err(|e| anyhow!("{e}"))?;
        symbolizer = Some(Symbolizer::new(maps.modules()));
        let specs = resolve_sites(prog, &maps, *pid, probe_names)?;
        site_probes = specs.iter().map(|s| s.entry.len() + s.ret.len()).sum();
        let mut weaver = Weaver::new(agent, &seg, prog, base, generation);
        weaver.inline = opts.inline;
        // Advice: one compiled function per probe body that runs in the target.
        let mut advice_addr = BTreeMap::new();
        let no_symbols = |_: &str| None;
        let env = Env {
            helpers: &agent.hello.helpers,
            maps: &seg.maps,
            thread_agg_off: seg.layout.agg_off,
            symbol: &no_symbols,
            usdt_args: None,
        };
        let mut specs = specs;
        for s in &mut specs {
            for c in s.entry.iter_mut().chain(s.ret.iter_mut()) {
                let body = c.advice as usize;
                let addr = match (&s.usdt_args, advice_addr.get(&body)) {
                    (None, Some(a)) => *a,
                    (usdt, _) => {
                        // USDT arguments differ per site: compile for this site.
                        let env = Env {
                            usdt_args: usdt.as_deref(),
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
        }
        // Exceptions must not unwind through hijacked return addresses.
        if specs.iter().any(|s| !s.ret.is_empty()) && agent.on_raise != 0 {
            specs.extend(unwind_hooks(&maps, agent.on_raise));
        }
        for s in &specs {
            let p = weaver.site(s, agent.hello.thread_attach)?;
            if opts.verbose {
                eprintln!("weft: {} at {:#x}: {}", p.label, p.addr, p.outcome);
            }
            planned.push(p);
        }
        // The target's sigaction goes through the agent while woven, so its own
        // SIGTRAP/SIGSEGV/SIGBUS handlers never displace weft's (see the agent's
        // `signals`).
        if agent.sigaction != 0 {
            if let Some(spec) = sigaction_redirect(&maps) {
                let p = weaver.redirect_site(&spec, agent.sigaction)?;
                if opts.verbose {
                    eprintln!("weft: {} at {:#x}: {}", p.label, p.addr, p.outcome);
                }
                redirect_bodies.push(spec.func.addr..spec.func.end());
                redirects.push(p);
            }
        }
        // profile:hz:N probes: advice in a code region, sampled by the agent's timers.
        let mut n_profiles = 0usize;
        for ((pi, p), names) in prog
            .probes
            .iter()
            .enumerate()
            .zip(attach_name_indices(prog))
        {
            for (a, probe) in p.attach.iter().zip(names) {
                let AttachPoint::Profile { hz } = a else {
                    continue;
                };
                if n_profiles == weft_abi::MAX_PROFILES {
                    bail!(
                        "{a}: at most {} profile probes per program",
                        weft_abi::MAX_PROFILES
                    );
                }
                let hz = u32::try_from(*hz).ok().filter(|h| (1..=10_000).contains(h));
                let hz = hz.ok_or_else(|| anyhow!("{a}: the rate must be 1 to 10000 Hz"))?;
                let code = weft_jit::compile(&prog.probes[pi].body, prog, &env)?;
                let advice = weaver.put_anywhere(&code)?;
                let h = seg.shm.header() as *const weft_abi::ShmHeader as *mut weft_abi::ShmHeader;
                // SAFETY: the agent reads the profile table only once weft says go.
                unsafe {
                    (*h).profiles[n_profiles] = weft_abi::ProfileDesc { hz, probe, advice };
                }
                n_profiles += 1;
            }
        }
        site_probes += n_profiles;
        // Where the session's code lives in the target: no thread may be there when
        // the agent unmaps it.
        code_ranges = weaver
            .regions
            .iter()
            .map(|r| r.addr..r.addr + r.size)
            .collect();
    }

    if opts.verbose && conn.is_some() {
        eprintln!(
            "weft: resolved, planned and compiled {} sites in {:.1} ms",
            planned.len(),
            t_sites.elapsed().as_secs_f64() * 1e3
        );
        for r in &code_ranges {
            eprintln!("weft: code region {:#x}..{:#x}", r.start, r.end);
        }
    }
    let resolver = SessionResolver {
        symbolizer: std::cell::RefCell::new(symbolizer),
        probe_names: probe_names.names.clone(),
        formats: prog.formats.clone(),
    };
    let mut printer = Printer {
        out,
        format: opts.format,
        prog,
        resolver,
        exited: false,
        unsafe_ok: opts.unsafe_ok,
    };

    // 5. Attach: "Attaching N probes...", BEGIN, patch, go.
    let n_probes = site_probes + begin.len() + end.len() + intervals.len();
    if !opts.quiet {
        match opts.format {
            OutputFormat::Text => eprint!("{}", weft_output::attaching_line(n_probes as u64)),
            OutputFormat::Json => {
                let _ = printer
                    .out
                    .write_all(&weft_output::json::attached_probes(n_probes as u64));
            }
        }
    }
    for &(i, probe) in &begin {
        local.run(i, probe);
    }
    printer.drain(&seg.shm);
    let mut target_alive = conn.is_some();
    if let Some((agent, pid)) = conn {
        if !printer.exited {
            // The sigaction redirect first, alone: once it is in, the agent can put
            // its handlers in front for good, before any int3 site can trap.
            weft_inject::die::at("code-written");
            weft_inject::die::phase("patch");
            if !redirects.is_empty() {
                patch::apply_stepping_out_of(
                    *pid,
                    &mut redirects,
                    &seg.shm,
                    &redirect_bodies,
                    agent.step_guard,
                )?;
                weft_inject::die::at("redirect-patched");
                if redirects
                    .iter()
                    .any(|p| !matches!(p.outcome, Outcome::Skipped(_)))
                {
                    agent.take_signals()?;
                    weft_inject::die::at("signals-taken");
                }
            }
            let report = patch::apply(*pid, &mut planned, &seg.shm, agent.step_guard)?;
            weft_inject::die::at("sites-patched");
            if opts.verbose {
                eprintln!(
                    "weft: patched {} sites in {} threads; target paused {:.2} ms{}",
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
                );
            }
            for p in planned.iter().chain(&redirects) {
                if let Outcome::Skipped(r) = &p.outcome {
                    eprintln!("weft: {} not woven: {r}", p.label);
                }
            }
        }
        agent.go()?;
        weft_inject::die::phase("run");
        weft_inject::die::at("running");
    }

    // 6. Run until exit(), the target ends, or a signal.
    let start = Instant::now();
    let mut next_tick: Vec<Instant> = intervals
        .iter()
        .map(|&(_, _, p)| start + Duration::from_nanos(p))
        .collect();
    let mut stopped_by_signal = false;
    while !printer.exited {
        if STOP.load(Ordering::Acquire) {
            stopped_by_signal = true;
            break;
        }
        let now = Instant::now();
        for (k, &(i, probe, period)) in intervals.iter().enumerate() {
            if now >= next_tick[k] {
                local.run(i, probe);
                next_tick[k] += Duration::from_nanos(period);
                if next_tick[k] < now {
                    next_tick[k] = now + Duration::from_nanos(period);
                }
            }
        }
        printer.drain(&seg.shm);
        if let Some(c) = child.as_deref_mut() {
            // As bpftrace: weft's status does not follow the command's.
            if c.try_wait()?.is_some() {
                target_alive = false;
                break;
            }
        } else if let Some((_, pid)) = conn {
            if !target::alive(*pid) {
                target_alive = false;
                break;
            }
        }
        if seg.shm.header().exit_requested.load(Ordering::Acquire) != 0 {
            printer.drain(&seg.shm);
            break;
        }
        if printer.exited {
            break;
        }
        let sleep = next_tick
            .iter()
            .map(|t| t.saturating_duration_since(Instant::now()))
            .min();
        std::thread::sleep(
            sleep
                .unwrap_or(Duration::from_millis(5))
                .min(Duration::from_millis(5)),
        );
    }
    let _ = stopped_by_signal;

    // After exit() a launched command gets SIGTERM, as with bpftrace.
    if printer.exited || seg.shm.header().exit_requested.load(Ordering::Acquire) != 0 {
        if let (Some(c), true) = (child, target_alive) {
            // SAFETY: signalling our own child.
            unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
            let deadline = Instant::now() + Duration::from_secs(1);
            while Instant::now() < deadline {
                if c.try_wait()?.is_some() {
                    target_alive = false;
                    break;
                }
                std::thread::sleep(Duration::from_millis(5));
            }
        }
    }

    // 7. Unweave while the target lives.
    if let (Some((agent, pid)), true) = (conn, target_alive) {
        if let Err(e) = unweave(agent, *pid, &planned, &redirects, &seg, &code_ranges) {
            eprintln!("weft: {e:#}");
        }
    }
    printer.drain(&seg.shm);

    // 8. END, maps, losses.
    printer.exited = false;
    for &(i, probe) in &end {
        local.run(i, probe);
    }
    printer.drain(&seg.shm);
    printer.print_all(&seg.shm);
    let _ = printer.out.flush();
    let l = losses(&seg.shm, prog);
    if l.events_lost > 0 {
        eprint!("{}", weft_output::lost_events_line(l.events_lost));
    }
    for line in l.report() {
        eprintln!("{line}");
    }
    if opts.verbose && conn.is_some() {
        let h = seg.shm.header();
        eprintln!(
            "weft: at most {} threads held a slot at once (--max-threads {}); {} slots of threads that ended were drained and reused",
            h.threads_live_peak.load(Ordering::Relaxed),
            h.max_live,
            h.threads_retired.load(Ordering::Relaxed)
        );
    }
    Ok(0)
}

fn unweave(
    agent: &Agent,
    pid: i32,
    planned: &[Planned],
    redirects: &[Planned],
    seg: &Segment,
    code: &[Range<u64>],
) -> Result<()> {
    weft_inject::die::phase("unweave");
    let mut ranges = code.to_vec();
    ranges.push(agent.hello.text_start..agent.hello.text_end);
    let shadows = patch::Shadows {
        busy_code: &ranges,
        tls_offset: agent.hello.tls_offset,
        return_trampoline: agent.hello.return_trampoline,
    };
    // The unwinder hooks (jump sites) stay until the last hijacked frame is gone:
    // a thread inside an entry trampoline at the restore may still hijack its
    // return address, then throw. An int3 hook cannot stay: without a session the
    // trap handler would no longer know it.
    let (late, early): (Vec<Planned>, Vec<Planned>) = planned.iter().cloned().partition(|p| {
        crate::weave::is_internal(&p.label)
            && matches!(p.outcome, Outcome::Jump | Outcome::JumpInline)
    });
    if !early.is_empty() || !late.is_empty() {
        patch::restore(pid, &early, &seg.shm, &shadows)?;
        weft_inject::die::at("sites-restored");
    }
    // The sigaction redirect after the sites, once weft's last traps and faults (kept
    // from their threads by the stop above, delivered on resume) reached the agent's
    // handlers.
    if !redirects.is_empty() {
        patch::restore_redirects(
            pid,
            redirects,
            &seg.shm,
            &shadows,
            Duration::from_millis(500),
        )?;
        weft_inject::die::at("redirects-restored");
    }
    agent.end()?;
    weft_inject::die::at("ended");
    patch::wait_quiescent(pid, &shadows, &late, &seg.shm, Duration::from_secs(5))?;
    weft_inject::die::at("quiescent");
    agent.free()
}

/// For each probe, the indices in `prog.probe_names` of its attach points: the
/// front end names them as written, in source order, one per attach point.
fn attach_name_indices(prog: &Program) -> Vec<Vec<u32>> {
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

/// Probe names for `probe`, with their indices (the program's, then one per expanded
/// site).
pub struct ProbeNames {
    pub names: Vec<String>,
    index: HashMap<String, u32>,
}

impl ProbeNames {
    /// The program's own names keep their positions (its code refers to them).
    fn new(initial: &[String]) -> ProbeNames {
        let mut index = HashMap::new();
        for (i, n) in initial.iter().enumerate() {
            index.entry(n.clone()).or_insert(i as u32);
        }
        ProbeNames {
            names: initial.to_vec(),
            index,
        }
    }
}

fn intern(names: &mut ProbeNames, s: String) -> u32 {
    if let Some(&i) = names.index.get(&s) {
        return i;
    }
    let i = names.names.len() as u32;
    names.index.insert(s.clone(), i);
    names.names.push(s);
    i
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

/// Resolve every uprobe/uretprobe attach point against the target's modules. The
/// `advice` field of each `Call` temporarily holds the probe index.
fn resolve_sites(
    prog: &Program,
    maps: &ProcMaps,
    pid: i32,
    names: &mut ProbeNames,
) -> Result<Vec<SiteSpec>> {
    let modules = maps.modules();
    let search = weft_symbols::LibrarySearch::system();
    let ctx = weft_symbols::TargetContext {
        process: Some((pid as u32, &modules)),
        executable: None,
        search: &search,
    };
    let mut by_addr: BTreeMap<u64, SiteSpec> = BTreeMap::new();
    // A coldpatched binary's file and placeholders (probe list) by function address,
    // read once per module (a whole-program weave looks up 10,000 functions).
    type Placeholders = (
        Option<std::sync::Arc<weft_symbols::ElfFile>>,
        HashMap<u64, Vec<weft_symbols::WeftProbeSite>>,
    );
    let mut placeholders: HashMap<std::path::PathBuf, Placeholders> = Default::default();
    for (pi, p) in prog.probes.iter().enumerate() {
        for a in &p.attach {
            let (target_spec, func, offset, is_ret) = match a {
                AttachPoint::Uprobe {
                    target,
                    func,
                    offset,
                } => (target, func, *offset, false),
                AttachPoint::Uretprobe { target, func } => (target, func, 0, true),
                AttachPoint::Usdt {
                    target,
                    provider,
                    name,
                } => {
                    resolve_usdt(
                        a,
                        target,
                        provider,
                        name,
                        &ctx,
                        pid,
                        pi,
                        names,
                        &mut by_addr,
                    )?;
                    continue;
                }
                AttachPoint::Profile { .. } => continue,
                _ => continue,
            };
            let t =
                weft_symbols::resolve_target(target_spec, &ctx).map_err(|e| anyhow!("{a}: {e}"))?;
            let module = t.module.ok_or_else(|| {
                anyhow!("{a}: {} is not mapped in process {pid}", t.path.display())
            })?;
            let funcs =
                weft_symbols::resolve_in_module(&module, func).map_err(|e| anyhow!("{e}"))?;
            let (elf, list) = placeholders
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
            let frame_free = !uses_frame_state(&p.body);
            for f in funcs {
                let Some(addr) = f.runtime_addr else { continue };
                if f.ifunc {
                    continue;
                }
                let kind = if is_ret { "uretprobe" } else { "uprobe" };
                let label = if offset != 0 {
                    format!("{kind}:{}:{}+{offset}", module.path.display(), f.name)
                } else {
                    format!("{kind}:{}:{}", module.path.display(), f.name)
                };
                let probe = intern(names, label.clone());
                // HotPatch: advice that needs nothing of the machine state at the
                // function's entry or return runs at the coldpatched placeholders
                // instead (plain NOP sites, no return-address hijack).
                if offset == 0 && frame_free {
                    let want = if is_ret {
                        weft_symbols::WeftProbeKind::Exit
                    } else {
                        weft_symbols::WeftProbeKind::Entry
                    };
                    let sites: Vec<&weft_symbols::WeftProbeSite> = list
                        .get(&f.vaddr)
                        .into_iter()
                        .flatten()
                        .filter(|w| w.kind == want)
                        .collect();
                    if !sites.is_empty() {
                        for w in sites {
                            let site_addr = module.runtime_addr(w.vaddr);
                            // A stripped binary's functions have no size; the planner
                            // then sees the function up to the end of the placeholder
                            // (one NOP instruction: nothing can branch into it).
                            let (bytes, padding) = if f.size > 0 {
                                (f.bytes.clone(), f.padding.clone())
                            } else {
                                let len = w.vaddr + u64::from(w.len) - f.vaddr;
                                let bytes = elf
                                    .as_ref()
                                    .and_then(|e| e.read_vaddr(f.vaddr, len).ok())
                                    .map(<[u8]>::to_vec);
                                (bytes.unwrap_or_default(), Vec::new())
                            };
                            let spec = by_addr.entry(site_addr).or_insert_with(|| SiteSpec {
                                func: weft_x86::FunctionCode {
                                    addr,
                                    size_known: !bytes.is_empty(),
                                    bytes,
                                    padding,
                                },
                                name: f.demangled.clone().unwrap_or_else(|| f.name.clone()),
                                site_addr,
                                entry: Vec::new(),
                                ret: Vec::new(),
                                label: format!(
                                    "{label} ({} placeholder)",
                                    if is_ret { "exit" } else { "entry" }
                                ),
                                usdt_args: None,
                                semaphore: None,
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
                let site_addr = addr + offset;
                let spec = by_addr.entry(site_addr).or_insert_with(|| SiteSpec {
                    func: weft_x86::FunctionCode {
                        addr,
                        bytes: f.bytes.clone(),
                        size_known: f.size > 0,
                        padding: f.padding.clone(),
                    },
                    name: f.demangled.clone().unwrap_or_else(|| f.name.clone()),
                    site_addr,
                    entry: Vec::new(),
                    ret: Vec::new(),
                    label: label.clone(),
                    usdt_args: None,
                    semaphore: None,
                });
                let call = Call {
                    advice: pi as u64,
                    probe,
                    body: Some(pi),
                };
                if is_ret {
                    spec.ret.push(call);
                } else {
                    spec.entry.push(call);
                }
            }
        }
    }
    Ok(by_addr.into_values().collect())
}

/// Whether a probe body reads the machine state at its site (arguments, return
/// value, registers, the instruction pointer, the stack): such advice must run at the
/// function's real entry or return.
fn uses_frame_state(f: &weft_ir::Function) -> bool {
    use weft_ir::{CtxValue, Inst};
    f.code.iter().any(|i| match i {
        Inst::Ctx { value, .. } => matches!(
            value,
            CtxValue::Arg(_) | CtxValue::Retval | CtxValue::Reg(_) | CtxValue::Ip
        ),
        Inst::UStack { .. } => true,
        _ => false,
    })
}

/// Sites of `usdt:BIN:provider:name`: each probe's NOP, planned inside the function
/// that contains it; the note's argument locations become the advice's `argN`.
#[allow(clippy::too_many_arguments)]
fn resolve_usdt(
    a: &AttachPoint,
    target: &str,
    provider: &str,
    name: &str,
    ctx: &weft_symbols::TargetContext<'_>,
    pid: i32,
    probe_index: usize,
    names: &mut ProbeNames,
    by_addr: &mut BTreeMap<u64, SiteSpec>,
) -> Result<()> {
    let t = weft_symbols::resolve_target(target, ctx).map_err(|e| anyhow!("{a}: {e}"))?;
    let module = t
        .module
        .ok_or_else(|| anyhow!("{a}: {} is not mapped in process {pid}", t.path.display()))?;
    let elf = module.open().map_err(|e| anyhow!("{e}"))?;
    let probes = weft_symbols::resolve_usdt(&elf, provider, name).map_err(|e| anyhow!("{e}"))?;
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
        let label = format!("usdt:{}:{}:{}", module.path.display(), p.provider, p.name);
        let probe = intern(names, label.clone());
        let fname = elf
            .function_at(p.pc)
            .map(|f| f.name().to_string())
            .unwrap_or_else(|| p.name.clone());
        let spec = by_addr.entry(site_addr).or_insert_with(|| SiteSpec {
            func,
            name: fname,
            site_addr,
            entry: Vec::new(),
            ret: Vec::new(),
            label,
            usdt_args: Some(usdt_args),
            semaphore: p.semaphore.map(|s| module.runtime_addr(s)),
        });
        spec.entry.push(Call {
            advice: probe_index as u64,
            probe,
            body: Some(probe_index),
        });
    }
    Ok(())
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

/// Internal sites that give hijacked frames their return addresses back before a C++
/// exception (or thread cancellation) unwinds the stack.
fn unwind_hooks(maps: &ProcMaps, on_raise: u64) -> Vec<SiteSpec> {
    let mut out = Vec::new();
    for m in maps.modules() {
        if !m.file_name().starts_with("libgcc_s") {
            continue;
        }
        for name in [
            "_Unwind_RaiseException",
            "_Unwind_Resume_or_Rethrow",
            "_Unwind_ForcedUnwind",
        ] {
            let Ok(funcs) = weft_symbols::resolve_in_module(&m, name) else {
                continue;
            };
            for f in funcs {
                let Some(addr) = f.runtime_addr else { continue };
                out.push(SiteSpec {
                    func: weft_x86::FunctionCode {
                        addr,
                        bytes: f.bytes.clone(),
                        size_known: f.size > 0,
                        padding: f.padding.clone(),
                    },
                    name: f.name.clone(),
                    site_addr: addr,
                    entry: vec![Call {
                        advice: on_raise,
                        probe: 0,
                        body: None,
                    }],
                    ret: Vec::new(),
                    label: format!("{}{}:{}", crate::weave::INTERNAL, m.path.display(), f.name),
                    usdt_args: None,
                    semaphore: None,
                });
            }
        }
    }
    out
}

/// The redirect of glibc's `__libc_sigaction` (which `sigaction`, `signal` and glibc
/// itself call) to the agent's `weft_agent_sigaction`; `__sigaction` where the former
/// is not exported.
fn sigaction_redirect(maps: &ProcMaps) -> Option<SiteSpec> {
    for m in maps.modules() {
        if !m.file_name().starts_with("libc.so") {
            continue;
        }
        for name in ["__libc_sigaction", "__sigaction"] {
            let Ok(funcs) = weft_symbols::resolve_in_module(&m, name) else {
                continue;
            };
            for f in funcs {
                let Some(addr) = f.runtime_addr else { continue };
                if f.ifunc || f.size == 0 {
                    continue;
                }
                return Some(SiteSpec {
                    func: weft_x86::FunctionCode {
                        addr,
                        bytes: f.bytes.clone(),
                        size_known: true,
                        padding: f.padding.clone(),
                    },
                    name: f.name.clone(),
                    site_addr: addr,
                    entry: Vec::new(),
                    ret: Vec::new(),
                    label: format!("(internal) {}:{}", m.path.display(), f.name),
                    usdt_args: None,
                    semaphore: None,
                });
            }
        }
    }
    None
}
