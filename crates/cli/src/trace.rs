//! One `weft trace` run: the engine's session, with the printer as its sink.

use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};

use anyhow::{bail, Context, Result};
use weft_engine::segment::Sizes;
use weft_engine::{target, watch, Options, Session};
use weft_ir::{AttachPoint, Program};

use crate::printer::{OutputFormat, Printer};

/// Where the probes go.
#[derive(Clone, Debug)]
pub enum Target {
    /// No process: only BEGIN/END/interval probes.
    None,
    /// Launch a command (argv).
    Launch(Vec<String>),
    /// Attach to running processes.
    Attach(Vec<i32>),
}

#[derive(Clone, Debug)]
pub struct TraceOptions {
    pub target: Target,
    pub output: Option<PathBuf>,
    /// Where to write the record file, if anywhere.
    pub record: Option<PathBuf>,
    /// The record file's metadata `record` (`weft record`'s request).
    pub record_note: Option<serde_json::Value>,
    pub format: OutputFormat,
    pub quiet: bool,
    pub verbose: bool,
    pub unsafe_ok: bool,
    /// `--no-warnings`: `warnf()` messages are not printed either (upstream).
    pub no_warnings: bool,
    pub sizes: Sizes,
    /// Compile simple advice into trampolines.
    pub inline: bool,
    /// Several processes: refuse the session if one cannot be attached to.
    pub all_or_nothing: bool,
    /// `--data-mechanism`.
    pub data_mechanism: weft_engine::data::Mechanism,
    /// Children join the session.
    pub follow_fork: bool,
    /// System-wide: the most processes that may map the probed files at the start.
    pub max_processes: usize,
    /// `--system`: kernel probes run for every process, targets or not.
    pub kernel_system: bool,
    /// Run only the probes whose name matches (`--probe-filter`).
    pub probe_filter: Option<regex::Regex>,
    /// How output is buffered (`-B`).
    pub buffering: Buffering,
    /// Print records and maps (bpftrace's output); off for `weft record`, whose
    /// output is its file.
    pub print: bool,
}

/// `-B`: when output is written (bpftrace's modes).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Buffering {
    /// At each newline.
    #[default]
    Line,
    /// When the buffer fills, and at the end.
    Full,
    /// At each write.
    None,
}

/// Output written as [`Buffering`] says; what is held is written when it is
/// dropped.
struct Buffered<W: Write> {
    inner: std::io::BufWriter<W>,
    mode: Buffering,
}

impl<W: Write> Write for Buffered<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.inner.write_all(buf)?;
        match self.mode {
            Buffering::None => self.inner.flush()?,
            Buffering::Line if buf.contains(&b'\n') => self.inner.flush()?,
            _ => {}
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        // The printer flushes after each batch of records: held in full mode.
        match self.mode {
            Buffering::Full => Ok(()),
            _ => self.inner.flush(),
        }
    }
}

impl<W: Write> Drop for Buffered<W> {
    fn drop(&mut self) {
        let _ = self.inner.flush();
    }
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

/// SIGINT and SIGTERM raise the returned flag (for commands with their own run
/// loop).
pub(crate) fn stop_flag() -> &'static AtomicBool {
    install_stop_handlers();
    &STOP
}

/// Run a checked program. Returns the exit status.
pub fn run(prog: &Program, opts: &TraceOptions) -> Result<i32> {
    run_with(prog, opts, &mut [])
}

/// [`run`], delivering the records to `extra` sinks too.
pub fn run_with(
    prog: &Program,
    opts: &TraceOptions,
    extra: &mut [&mut dyn weft_trace::Sink],
) -> Result<i32> {
    install_stop_handlers();
    let only = opts.probe_filter.as_ref().map(|re| {
        let names = weft_engine::pointcut::attach_name_indices(prog);
        (0..prog.probes.len())
            .filter(|&i| {
                names[i].iter().any(|&k| {
                    prog.probe_names
                        .get(k as usize)
                        .is_some_and(|n| re.is_match(n))
                })
            })
            .collect::<Vec<usize>>()
    });
    if only
        .as_ref()
        .is_some_and(|o| o.iter().all(|&i| prog.probes[i].hidden))
    {
        bail!("--probe-filter matches no probe of the program");
    }
    // The front end's own probes (cflow's state) run whatever the filter says.
    let only = only.map(|mut o| {
        o.extend((0..prog.probes.len()).filter(|&i| prog.probes[i].hidden));
        o.sort_unstable();
        o.dedup();
        o
    });
    let selected = |i: &usize| only.as_ref().is_none_or(|o| o.contains(i));
    let needs_target = (0..prog.probes.len()).filter(selected).any(|i| {
        prog.probes[i]
            .attach
            .iter()
            .any(AttachPoint::runs_in_target)
    });
    // No -p, no -c: the probes apply to every process that maps a probed file.
    let system_wide = needs_target && matches!(opts.target, Target::None);
    missing_probes(prog, &selected, opts.no_warnings, system_wide)?;
    let watched = if system_wide {
        watched_files(prog, &selected)?
    } else {
        Vec::new()
    };
    let out: Box<dyn Write> = match &opts.output {
        Some(p) => Box::new(Buffered {
            inner: std::io::BufWriter::with_capacity(
                64 << 10,
                std::fs::File::create(p).with_context(|| format!("creating {}", p.display()))?,
            ),
            mode: opts.buffering,
        }),
        None => Box::new(Buffered {
            inner: std::io::BufWriter::with_capacity(64 << 10, std::io::stdout()),
            mode: opts.buffering,
        }),
    };
    let mut printer = Printer {
        to_file: opts.output.is_some(),
        out,
        format: opts.format,
        unsafe_ok: opts.unsafe_ok,
        no_warnings: opts.no_warnings,
    };
    let mut recorder = match &opts.record {
        Some(p) => {
            let f =
                std::fs::File::create(p).with_context(|| format!("creating {}", p.display()))?;
            Some(
                weft_trace::record::Writer::with_note(
                    std::io::BufWriter::new(f),
                    prog,
                    opts.record_note.as_ref(),
                )
                .with_context(|| format!("writing {}", p.display()))?,
            )
        }
        None => None,
    };
    // A group's forked children join it (and must be woven to run its probes).
    let groups = prog.maps.iter().any(|m| weft_ir::is_inherited_map(&m.name));
    let wrapper = through_wrapper(prog, &opts.target);
    let follow = opts.follow_fork || system_wide || groups || wrapper.is_some();
    let wrappers_only = follow && !opts.follow_fork && !system_wide && !groups;
    if wrappers_only && opts.verbose {
        eprintln!(
            "weft: the command does not run the probed binary itself: following its \
             children and the programs it executes (as --follow-fork)"
        );
    }
    let engine = Options {
        sizes: opts.sizes,
        inline: opts.inline,
        verbose: opts.verbose,
        all_or_nothing: opts.all_or_nothing,
        follow_fork: follow,
        follow_wrappers_only: wrappers_only,
        follow_to: wrapper.unwrap_or_default(),
        system_wide,
        only_probes: only.clone(),
        kernel_all: opts.kernel_system || matches!(opts.target, Target::None),
        progress: crate::progress::TermProgress::hook(opts.quiet),
        data_mechanism: opts.data_mechanism,
        pack_functions: opts.record.is_some(),
        ..Options::default()
    };
    let attaching = matches!(opts.target, Target::Attach(_)) || system_wide;
    let mut session = Session::new(prog, engine, attaching)?;
    match &opts.target {
        Target::None if system_wide => {
            if let Err(e) = start_system_wide(&mut session, &watched, opts) {
                session.abandon();
                return Err(e);
            }
        }
        Target::None => {}
        Target::Launch(argv) => {
            session.launch(argv)?;
        }
        Target::Attach(pids) => attach_all(&mut session, pids, opts.all_or_nothing)?,
    }
    let mut sinks: Vec<&mut dyn weft_trace::Sink> = Vec::new();
    if opts.print {
        sinks.push(&mut printer);
    }
    if let Some(r) = recorder.as_mut() {
        sinks.push(r);
    }
    for e in extra.iter_mut() {
        sinks.push(&mut **e);
    }
    let mut sink = weft_trace::sink::Tee(sinks);
    // Only BEGIN/END probes and no process: nothing can fire after BEGIN, so the
    // session ends once BEGIN has run (upstream bpftrace exits then too).
    let begin_end_only = matches!(opts.target, Target::None)
        && (0..prog.probes.len()).filter(selected).all(|i| {
            prog.probes[i]
                .attach
                .iter()
                .all(|a| matches!(a, AttachPoint::Begin | AttachPoint::End))
        });
    match weave_and_run(&mut session, &mut sink, opts, begin_end_only) {
        Ok(()) => {}
        Err(e) => {
            // A target that dies mid-session breaks the agent's connection: say what
            // happened (judged before abandoning, which ends a launched command).
            let gone = session.first_pid().filter(|&p| !target::alive(p));
            session.abandon();
            if let Some(pid) = gone {
                return Err(e.context(format!("process {pid} exited while weft was working on it")));
            }
            return Err(e);
        }
    }
    let done = session.finish(&mut sink)?;
    drop(sink);
    if let (Some(r), Some(p)) = (recorder, &opts.record) {
        r.close()
            .with_context(|| format!("writing {}", p.display()))?;
    }
    let _ = printer.out.flush();
    let l = &done.losses;
    if l.events_lost > 0 {
        eprint!("{}", weft_output::lost_events_line(l.events_lost));
    }
    for line in l.report() {
        eprintln!("{line}");
    }
    if opts.verbose && done.had_targets {
        eprintln!(
            "weft: at most {} threads held a slot at once (--max-threads {}); {} slots of threads that ended were drained and reused",
            done.threads_peak, done.max_live, done.threads_retired
        );
    }
    Ok(done.exit_code)
}

/// Attach to every process of `pids`. One that cannot be attached to is reported
/// and left out, unless `all_or_nothing` (then the session is refused); none at all
/// is an error.
fn attach_all(session: &mut Session<'_>, pids: &[i32], all_or_nothing: bool) -> Result<()> {
    let mut seen = std::collections::BTreeSet::new();
    let pids: Vec<i32> = pids.iter().copied().filter(|p| seen.insert(*p)).collect();
    if all_or_nothing {
        // Refused before any agent is loaded, where it can be told in advance.
        if let Some(pid) = pids.iter().find(|&&p| !target::alive(p)) {
            bail!("no process with pid {pid} (--all-or-nothing: nothing woven)");
        }
    }
    let mut first_error = None;
    for &pid in &pids {
        match session.attach(pid) {
            Ok(()) => {}
            Err(e) if pids.len() == 1 || all_or_nothing => {
                return Err(if pids.len() > 1 {
                    e.context(format!("process {pid} (--all-or-nothing: nothing woven)"))
                } else {
                    e
                });
            }
            Err(e) => {
                eprintln!("weft: process {pid} left out: {e:#}");
                first_error.get_or_insert(e);
            }
        }
    }
    match (session.members.is_empty(), first_error) {
        (true, Some(e)) => Err(e.context("no process could be attached to")),
        _ => Ok(()),
    }
}

/// Probes on a function or USDT probe their binary (a file named without wildcards)
/// lacks, found before anything starts: system-wide, an error (else a session would
/// wait for a process in which the probe can never be woven; with -p or -c the
/// engine says so, once the process is there); with bpftrace's
/// `missing_probes = "warn"` a warning in upstream's words (the engine skips them);
/// with `"ignore"` nothing.
fn missing_probes(
    prog: &Program,
    selected: &dyn Fn(&usize) -> bool,
    no_warnings: bool,
    system_wide: bool,
) -> Result<()> {
    let mode = prog.config.missing_probes;
    if mode == weft_ir::MissingProbes::Ignore
        || (mode == weft_ir::MissingProbes::Error && !system_wide)
    {
        return Ok(());
    }
    let search = weft_symbols::LibrarySearch::system();
    let ctx = weft_symbols::TargetContext {
        process: None,
        executable: None,
        search: &search,
    };
    for a in (0..prog.probes.len())
        .filter(selected)
        .flat_map(|i| &prog.probes[i].attach)
    {
        let (target, what) = match a {
            AttachPoint::Uprobe { target, func, .. } | AttachPoint::Uretprobe { target, func } => {
                (target, func.clone())
            }
            AttachPoint::Usdt {
                target,
                provider,
                name,
            } => (target, format!("{provider}:{name}")),
            _ => continue,
        };
        if target.is_empty() || weft_symbols::glob::has_wildcards(target) {
            continue;
        }
        // What cannot be resolved without a process is left to the engine.
        let Ok(t) = weft_symbols::resolve_target(target, &ctx) else {
            continue;
        };
        let Ok(elf) = weft_symbols::ElfFile::open(&t.path) else {
            continue;
        };
        let err = match a {
            AttachPoint::Usdt { provider, name, .. } => {
                weft_symbols::resolve_usdt(&elf, provider, name).err()
            }
            _ if what.starts_with("0x") || what.bytes().all(|b| b.is_ascii_digit()) => None,
            _ => weft_symbols::match_functions(&elf, &what).err(),
        };
        let Some(err) = err else { continue };
        match mode {
            weft_ir::MissingProbes::Error => bail!(
                "{a}: {err} (with config `missing_probes = \"warn\"` or `\"ignore\"` the \
                 probe is skipped)"
            ),
            weft_ir::MissingProbes::Warn if !no_warnings => {
                eprintln!("WARNING: Could not resolve symbol: {target}:{what}, skipping probe.")
            }
            _ => {}
        }
    }
    Ok(())
}

/// The files the probes name, for a system-wide session: each probe's binary or
/// library, as a path or a library name (`libc`), resolved without a process.
fn watched_files(
    prog: &Program,
    selected: &dyn Fn(&usize) -> bool,
) -> Result<Vec<watch::WatchedFile>> {
    let search = weft_symbols::LibrarySearch::system();
    let ctx = weft_symbols::TargetContext {
        process: None,
        executable: None,
        search: &search,
    };
    let mut files: Vec<watch::WatchedFile> = Vec::new();
    for a in (0..prog.probes.len())
        .filter(selected)
        .flat_map(|i| &prog.probes[i].attach)
    {
        if matches!(a, AttachPoint::Data { .. }) {
            bail!(
                "{a}: a data pointcut needs a target process (-p PID or -c CMD): its \
                 watchpoints are set on that process's threads"
            );
        }
        let (AttachPoint::Uprobe { target, .. }
        | AttachPoint::SourceLine { target, .. }
        | AttachPoint::Uretprobe { target, .. }
        | AttachPoint::Call { target, .. }
        | AttachPoint::Usdt { target, .. }) = a
        else {
            continue;
        };
        // `usdt:./dir/app*:...`: every ELF file of the directory whose name
        // matches (the resolver then takes the modules matching it in each process).
        if matches!(a, AttachPoint::Usdt { .. }) && target.contains('/') {
            if let Some((dir, pattern)) = target
                .rsplit_once('/')
                .filter(|(d, f)| !d.contains(['*', '?', '[']) && f.contains(['*', '?', '[']))
            {
                let g = weft_symbols::glob::Glob::new(pattern);
                let read = std::fs::read_dir(if dir.is_empty() { "/" } else { dir })
                    .with_context(|| format!("{a}: reading {dir}"))?;
                let mut found = false;
                for e in read.filter_map(|e| e.ok()) {
                    if !g.matches(&e.file_name().to_string_lossy())
                        || !e.file_type().is_ok_and(|t| t.is_file())
                        || weft_symbols::ElfFile::open(e.path()).is_err()
                    {
                        continue;
                    }
                    found = true;
                    let w = watch::WatchedFile::new(&e.path())?;
                    if !files.iter().any(|f| f.path == w.path) {
                        files.push(w);
                    }
                }
                if !found {
                    bail!("{a}: no executable or library matches {target}");
                }
                continue;
            }
        }
        if target.contains(['*', '?', '[']) {
            bail!(
                "{target}: a wildcard binary needs a target process (-p PID or -c CMD); \
                 without one the probes apply system-wide, to the processes that map a \
                 binary named by its path or library name"
            );
        }
        let t = weft_symbols::resolve_target(target, &ctx).map_err(|e| anyhow::anyhow!("{e}"))?;
        let w = watch::WatchedFile::new(&t.path)?;
        if !files.iter().any(|f| f.path == w.path) {
            files.push(w);
        }
    }
    if files.is_empty() {
        // Profile probes alone: there is no file to find processes by.
        bail!("profile probes need a target process: give -p PID or -c 'CMD'");
    }
    Ok(files)
}

/// System-wide: catch the processes that start from now on, then attach to those
/// that map a probed file already (at most `--max-processes`).
fn start_system_wide(
    session: &mut Session<'_>,
    files: &[watch::WatchedFile],
    opts: &TraceOptions,
) -> Result<()> {
    // The kernel catches new processes first, so none starting meanwhile is missed.
    let watcher = watch::Watcher::start(files);
    if let Some(why) = &watcher.fallback {
        eprintln!(
            "weft: the kernel cannot catch processes as they start ({why}): weft looks for \
             new ones in /proc every {} ms instead, and calls they make before it attaches \
             are missed",
            watch::PROC_SCAN_EVERY.as_millis()
        );
    }
    if opts.verbose {
        for p in &watcher.points {
            eprintln!("weft: system-wide: processes are caught as they start at {p}");
        }
    }
    session.watch(watcher);
    let pids = watch::mapping_processes(files);
    if pids.len() > opts.max_processes {
        bail!(
            "{} processes map {}: more than --max-processes {} (each is attached to: its \
             agent loaded and its threads paused a few milliseconds); raise the limit, or \
             give -p PID",
            pids.len(),
            files
                .iter()
                .map(|f| f.path.display().to_string())
                .collect::<Vec<_>>()
                .join(", "),
            opts.max_processes
        );
    }
    if opts.verbose {
        eprintln!(
            "weft: system-wide: {} processes map the probed files now; each is attached to",
            pids.len()
        );
    }
    for pid in pids {
        // Caught by the kernel as it started: it joins once the session runs.
        if session.is_caught(pid) {
            continue;
        }
        if let Err(e) = session.attach(pid) {
            if opts.verbose || weft_engine::target::alive(pid) {
                eprintln!("weft: process {pid} left out: {e:#}");
            }
        }
    }
    Ok(())
}

/// Prepare, announce, BEGIN, patch, and run until the session should end.
fn weave_and_run(
    session: &mut Session<'_>,
    sink: &mut dyn weft_trace::Sink,
    opts: &TraceOptions,
    begin_end_only: bool,
) -> Result<()> {
    let n_probes = session.prepare()?;
    if !opts.quiet {
        sink.attached(n_probes);
        let calls = session.call_sites();
        if calls > 0 {
            sink.call_sites(calls);
        }
    }
    session.begin(sink);
    session.go()?;
    if !begin_end_only {
        session.run(sink, &STOP)?;
    }
    Ok(())
}

/// Whether a launched command reaches the probed code only through other programs
/// (a `#!` script, `sh -c "./app x"`, `env`, `timeout`): the command is a script, or
/// a probe names a program by path that is not the command's executable. bpftrace's
/// uprobes are set on the file and fire in whatever process runs it; weft then
/// follows the command's children and execs, so the probes reach that process.
/// `Some`: follow, with the programs the probes name by path (canonical), the
/// first of which the wrapper runs is where following stops (none: the first image
/// that is not a wrapper, `weft_abi::WRAPPERS`).
fn through_wrapper(prog: &Program, target: &Target) -> Option<Vec<std::path::PathBuf>> {
    let Target::Launch(argv) = target else {
        return None;
    };
    let exe = target::which(&argv[0])?;
    // A program by path; a library (`.so` in its name) is the command's own.
    let probes_a_path = |t: &str| {
        t.contains('/')
            && !std::path::Path::new(t)
                .file_name()
                .is_some_and(|n| n.to_string_lossy().contains(".so"))
    };
    let targets: Vec<&str> = prog
        .probes
        .iter()
        .flat_map(|p| &p.attach)
        .filter_map(|a| match a {
            AttachPoint::Uprobe { target, .. }
            | AttachPoint::SourceLine { target, .. }
            | AttachPoint::Uretprobe { target, .. }
            | AttachPoint::Call { target, .. }
            | AttachPoint::Usdt { target, .. } => Some(target.as_str()),
            AttachPoint::Data {
                place: weft_ir::DataPlace::Var { target, .. },
                ..
            } => Some(target.as_str()),
            _ => None,
        })
        .collect();
    if targets.is_empty() {
        return None;
    }
    let canonical = exe.canonicalize().unwrap_or(exe.clone());
    let mut programs: Vec<std::path::PathBuf> = targets
        .iter()
        .filter(|t| probes_a_path(t))
        .filter_map(|t| std::path::Path::new(t).canonicalize().ok())
        .filter(|p| *p != canonical)
        .collect();
    programs.sort();
    programs.dedup();
    // A script, or a shell, `env` and their kind: the probes are for what it runs
    // (a library's too: `uprobe:libc:malloc -c 'sh -c ./app'` counts the app's).
    let wrapper =
        target::script_interpreter(&exe).is_some() || weft_abi::is_wrapper(&exe.to_string_lossy());
    (wrapper || !programs.is_empty()).then_some(programs)
}
