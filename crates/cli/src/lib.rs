//! The `weft` command: flags and subcommands, and the output. The work is the
//! engine's (`weft_engine`): `weft trace` reads as the pipeline — compile, start a
//! session, weave, deliver records to the printer, finish.
//!
//! * [`args`]: the command line (clap).
//! * [`trace`](mod@trace): one `weft trace` run.
//! * [`printer`]: records and maps as bpftrace prints them (a `weft_trace::Sink`).
//! * [`record_cmd`]: `weft record`, function entries and exits to a record file.
//! * [`replay_cmd`], [`dump_cmd`]: `weft replay`/`report`/`dump`, a record file's
//!   calls as trees, totals, Chrome trace JSON and flame graphs.
//! * [`fperf_cmd`]: `weft fperf`, per-function profiles under an overhead budget.
//! * [`events`]: the kernel's tracepoints (tracefs) for the front end.
//! * [`demo`], [`coldpatch_cmd`]: the other subcommands.

pub mod args;
pub mod coldpatch_cmd;
pub mod demo;
pub mod dump_cmd;
pub mod events;
pub mod export;
pub mod fperf_cmd;
mod fperf_sample;
pub mod headers;
pub mod list_cmd;
pub mod memprof_cmd;
pub mod prepare_cmd;
pub mod printer;
pub mod progress;
pub mod record_cmd;
pub mod replay_cmd;
pub mod trace;

use anyhow::{anyhow, bail, Context, Result};
use clap::Parser;
use weft_lang::HeaderResolver;

use args::{Cli, Command, ListArgs, TraceArgs};
use printer::OutputFormat;
use trace::{Target, TraceOptions};
use weft_engine::{dwarf, segment, target};

/// Run the command line; returns the exit status.
pub fn main() -> Result<i32> {
    // Usage errors exit 1, as bpftrace's (and every other error of weft) do; help
    // and version go to stdout with 0.
    let cli = match Cli::try_parse_from(named_params_last(std::env::args_os().collect())) {
        Ok(c) => c,
        Err(e) => {
            let code = if e.use_stderr() { 1 } else { 0 };
            let _ = e.print();
            return Ok(code);
        }
    };
    let debuginfo = match &cli.command {
        Some(Command::Trace(t)) => &t.debuginfo,
        _ => &cli.trace.debuginfo,
    };
    weft_symbols::DebugSearch::add_user_dirs(debuginfo.clone());
    match cli.command {
        Some(Command::Trace(t)) => trace(t),
        Some(Command::List(l)) => list_cmd::run(l),
        Some(Command::Demo { requests }) => demo::run(requests),
        Some(Command::Coldpatch(c)) => coldpatch_cmd::run(c),
        Some(Command::Prepare(p)) => prepare_cmd::run(p),
        Some(Command::Memprof(m)) => memprof_cmd::run(m),
        Some(Command::Record(r)) => record_cmd::run(r),
        Some(Command::Fperf(f)) => fperf_cmd::run(f),
        Some(Command::Stap(a)) => trace(stap_trace_args(a)?),
        Some(Command::Replay(r)) => replay_cmd::replay(r),
        Some(Command::Report(r)) => replay_cmd::report(r),
        Some(Command::Dump(d)) => dump_cmd::run(d),
        None => {
            if cli.trace.list {
                if cli.trace.pids().len() > 1 {
                    bail!("-l lists the probes of one process: give one -p PID");
                }
                // `-l -e PROGRAM` or `-l FILE.bt`: the probes the program names, as
                // bpftrace lists them.
                let file = match cli.trace.args.as_slice() {
                    [f] if f.ends_with(".bt") && std::path::Path::new(f).is_file() => {
                        Some(f.clone())
                    }
                    _ => None,
                };
                if cli.trace.program.is_some() || file.is_some() {
                    let (text, name) = match (&cli.trace.program, file) {
                        (Some(p), _) => (p.clone(), "-e".to_string()),
                        (None, Some(f)) => (
                            std::fs::read_to_string(&f).with_context(|| format!("reading {f}"))?,
                            f,
                        ),
                        (None, None) => unreachable!(),
                    };
                    return list_cmd::program(
                        &text,
                        &name,
                        cli.trace.pids().first().copied(),
                        cli.trace.verbose,
                    );
                }
                return list_cmd::run(ListArgs {
                    args: cli.trace.args.clone(),
                    binary: None,
                    pid: cli.trace.pids().first().copied(),
                    verbose: cli.trace.verbose,
                });
            }
            trace(cli.trace)
        }
    }
}

/// `weft stap`'s flags as `weft trace`'s.
fn stap_trace_args(a: args::StapArgs) -> Result<TraceArgs> {
    #[derive(Parser)]
    struct Wrap {
        #[command(flatten)]
        t: TraceArgs,
    }
    let mut argv: Vec<String> = vec!["weft".into()];
    if let Some(e) = &a.script {
        argv.extend(["-e".into(), e.clone()]);
    }
    if let Some(c) = &a.command {
        argv.extend(["-c".into(), c.clone()]);
    }
    if let Some(p) = a.pid {
        argv.extend(["-p".into(), p.to_string()]);
    }
    if a.verbose > 0 {
        argv.push("-v".into());
    }
    if let Some(o) = &a.output {
        argv.extend(["-o".into(), o.display().to_string()]);
    }
    if a.dry_run {
        argv.push("--dry-run".into());
    }
    for d in &a.dump {
        argv.extend(["-d".into(), d.clone()]);
    }
    if !a.args.is_empty() {
        argv.push("--".into());
    }
    let mut t = Wrap::try_parse_from(argv)
        .map_err(|e| anyhow!("{}", e.to_string().trim()))?
        .t;
    // After `--` they would be parameters; a script file comes first.
    t.args = a.args;
    t.program_params.clear();
    t.stap = true;
    Ok(t)
}

/// What `target()` and a path-less `process` name for a SystemTap script.
fn stap_options(t: &TraceArgs, executable: Option<String>) -> weft_lang::stap::StapOptions {
    let pid = t.pids().first().copied();
    let target_binary = match pid {
        Some(p) => std::fs::read_link(format!("/proc/{p}/exe"))
            .ok()
            .map(|p| p.display().to_string()),
        None => executable,
    };
    weft_lang::stap::StapOptions {
        target_pid: pid,
        command: t.command.is_some(),
        target_binary,
        marks: Some(std::sync::Arc::new(SdtMarks)),
    }
}

/// SDT notes of a program, for `process.mark("*")`.
struct SdtMarks;

impl weft_lang::stap::MarkResolver for SdtMarks {
    fn marks(&self, binary: &str) -> Result<Vec<(String, String)>, String> {
        let elf = weft_symbols::ElfFile::open(binary).map_err(|e| format!("{binary}: {e:#}"))?;
        Ok(elf
            .usdt_probes()
            .into_iter()
            .map(|p| (p.provider, p.name))
            .collect())
    }
}

/// bpftrace takes program parameters anywhere after the program: `--NAME[=VALUE]`
/// that is none of weft's options is a named parameter (`getopt`) wherever it is
/// (`weft -e PROG --aa=20 pos1 -- pos2`). They are moved behind `--`, where clap
/// keeps the program's parameters, in their order and before the ones there.
fn named_params_last(argv: Vec<std::ffi::OsString>) -> Vec<std::ffi::OsString> {
    use clap::CommandFactory;
    let cmd = Cli::command();
    let sub = argv.get(1).and_then(|a| a.to_str()).unwrap_or("");
    let trace_cmd = if sub == "trace" {
        cmd.find_subcommand("trace").cloned()
    } else if cmd.get_subcommands().any(|c| c.get_name() == sub) {
        return argv;
    } else {
        Some(cmd.clone())
    };
    let Some(trace_cmd) = trace_cmd else {
        return argv;
    };
    let known: Vec<String> = trace_cmd
        .get_arguments()
        .flat_map(|a| {
            a.get_long_and_visible_aliases()
                .unwrap_or_default()
                .into_iter()
                .chain(a.get_all_aliases().unwrap_or_default())
                .map(str::to_string)
                .collect::<Vec<_>>()
        })
        .chain(["help".to_string(), "version".to_string()])
        .collect();
    let start = if sub == "trace" { 2 } else { 1 };
    let dashes = argv.iter().position(|a| a == "--").unwrap_or(argv.len());
    // Without a program, an unknown option is a usage error, as bpftrace's.
    let has_program = argv[start.min(dashes)..dashes].iter().any(|a| {
        a.to_str().is_some_and(|s| {
            s == "-e" || s.starts_with("--program") || (!s.starts_with('-') && !s.is_empty())
        })
    });
    if !has_program {
        return argv;
    }
    let mut kept: Vec<std::ffi::OsString> = Vec::new();
    let mut named = Vec::new();
    for (i, a) in argv.iter().enumerate() {
        let name = a
            .to_str()
            .filter(|_| i >= start && i < dashes)
            .and_then(|s| s.strip_prefix("--"))
            .map(|s| s.split('=').next().unwrap_or(s));
        // The value of an option that takes one (`-e '--x'`) stays where it is.
        let after_value_option = i > 0
            && argv[i - 1]
                .to_str()
                .is_some_and(|p| matches!(p, "-e" | "-o" | "-c" | "-p" | "-f" | "-B" | "-I"));
        match name {
            Some(n) if !n.is_empty() && !known.iter().any(|k| k == n) && !after_value_option => {
                named.push(a.clone())
            }
            _ => kept.push(a.clone()),
        }
    }
    if named.is_empty() {
        return argv;
    }
    match kept.iter().position(|a| a == "--") {
        Some(d) => {
            kept.splice(d + 1..d + 1, named);
        }
        None => {
            kept.push("--".into());
            kept.extend(named);
        }
    }
    kept
}

pub(crate) fn trace(t: TraceArgs) -> Result<i32> {
    if t.info {
        print!("{}", info());
        return Ok(0);
    }
    let (text, file, params) = match (&t.program, t.args.split_first()) {
        (Some(p), _) => (p.clone(), "-e".to_string(), t.args.clone()),
        (None, Some((file, rest))) => {
            // `-`: the program comes on standard input (as with bpftrace).
            let bytes = if file == "-" {
                let mut b = Vec::new();
                std::io::Read::read_to_end(&mut std::io::stdin(), &mut b)
                    .context("reading the program from standard input")?;
                b
            } else {
                std::fs::read(file).with_context(|| format!("reading {file}"))?
            };
            let name = if file == "-" { "stdin" } else { file.as_str() };
            (program_text(name, bytes)?, name.to_string(), rest.to_vec())
        }
        (None, None) if t.stap => bail!("no script: give -e 'SCRIPT' or a .stp file"),
        (None, None) => bail!("no program: give -e 'PROGRAM' or a program file"),
    };
    let dump: Vec<weft_lang::Stage> = t
        .dump
        .iter()
        .map(|d| {
            weft_lang::Stage::from_dump_name(d).ok_or_else(|| {
                anyhow!(
                    "unknown stage `{d}` for -d (use ast, expanded, checked or program; \
                     or parse, expand, check, lower)"
                )
            })
        })
        .collect::<Result<_>>()?;
    let (after_dashes, named) = t.split_program_params();
    let params: Vec<String> = params.into_iter().chain(after_dashes).collect();
    let executable = t.command.as_ref().and_then(|c| {
        target::split_command(c)
            .ok()
            .and_then(|v| target::which(&v[0]))
    });
    let executable_path = executable.as_ref().map(|p| p.display().to_string());
    // Checked before anything runs: a bad --export is a one-line error.
    let exports = t
        .export
        .iter()
        .map(|s| export::Spec::parse(s))
        .collect::<Result<Vec<_>>>()?;
    let export_interval = export::parse_interval(&t.export_interval)?;
    let mechanism = match &t.data_mechanism {
        Some(m) => weft_engine::data::Mechanism::parse(m).map_err(|e| anyhow::anyhow!("{e}"))?,
        None => weft_engine::data::Mechanism::Auto,
    };
    let data = weft_engine::data::DwarfData {
        mechanism,
        pid: t.pids().first().copied(),
        executable: executable.clone(),
    };
    let resolver = dwarf::DwarfArgs {
        pid: t.pids().first().copied(),
        executable,
    };
    let script_dir = match t.program {
        Some(_) => None,
        None => std::path::Path::new(&file)
            .parent()
            .map(|d| d.to_path_buf()),
    };
    let headers = headers::SearchPath::new(script_dir, t.include_dirs.clone());
    for f in &t.include_files {
        if let Err(searched) = headers.find(f, false, weft_lang::Includer::CommandLine) {
            bail!("--include {f}: not found; searched {}", searched.join(", "));
        }
    }
    let opts = weft_lang::Options {
        positional: params,
        named: named.clone(),
        config: weft_ir::Config {
            unsafe_ok: t.unsafe_ok,
            ..weft_ir::Config::default()
        },
        unsafe_ok: t.unsafe_ok,
        args_resolver: Some(std::sync::Arc::new(resolver)),
        data: Some(std::sync::Arc::new(data)),
        events: Some(std::sync::Arc::new(events::TracefsEvents::default())),
        dump,
        headers: Some(std::sync::Arc::new(headers)),
        include_files: t.include_files.clone(),
        groups: t.groups(),
        ncpus: weft_kernel::probes::possible_cpus().map_or(0, u64::from),
        env_config: std::env::vars()
            .filter(|(k, _)| k.starts_with("BPFTRACE_"))
            .collect(),
        clock_offsets: clock_offsets(),
        helper_warnings: t.warnings > 0,
        target_program: executable_path.clone().or_else(|| {
            let pid = t.pids().first().copied()?;
            std::fs::read_link(format!("/proc/{pid}/exe"))
                .ok()
                .map(|p| p.display().to_string())
        }),
    };
    let stap =
        (t.stap || file.ends_with(".stp")).then(|| stap_options(&t, executable_path.clone()));
    let out = front_end(&text, &file, &opts, stap.as_ref())?;
    for (stage, d) in &out.dumps {
        eprintln!("=== {} ===\n{d}", stage.name());
    }
    let shown: Vec<weft_lang::Diagnostic> = out
        .diagnostics
        .iter()
        .filter(|d| !t.no_warnings || d.severity == weft_lang::Severity::Error)
        .cloned()
        .collect();
    if !shown.is_empty() {
        eprint!("{}", weft_lang::render(&shown, &text, &file));
    }
    let Some(prog) = out.program else {
        return Ok(1);
    };
    // As a typo would otherwise go unnoticed: every named parameter is one the
    // program reads.
    if let Some((name, _)) = named.iter().find(|(n, _)| !out.getopt_names.contains(n)) {
        let known = if out.getopt_names.is_empty() {
            "it has none".to_string()
        } else {
            format!("it has --{}", out.getopt_names.join(", --"))
        };
        eprintln!("error: --{name}: the program has no named parameter `{name}` (getopt); {known}");
        return Ok(1);
    }
    if t.dry_run {
        return Ok(0);
    }
    if prog.probes.is_empty() {
        bail!("{file}: the program has no probes (e.g. -e 'BEGIN {{ printf(\"hello\\n\"); }}')");
    }
    let target = match (&t.command, t.pids().is_empty()) {
        (Some(c), true) => Target::Launch(target::split_command(c)?),
        (None, false) => Target::Attach(t.pids()),
        (None, true) => Target::None,
        _ => bail!("give only one of -c CMD and -p PID"),
    };
    let opts = TraceOptions {
        target,
        output: t.output.clone(),
        record: t.record.clone(),
        record_note: None,
        format: match t.format.as_deref() {
            None | Some("text") => OutputFormat::Text,
            Some("json") => OutputFormat::Json,
            Some(other) => bail!("unknown output format `{other}` (use text or json)"),
        },
        quiet: t.quiet,
        verbose: t.verbose,
        unsafe_ok: t.unsafe_ok,
        no_warnings: t.no_warnings,
        sizes: segment::Sizes {
            max_threads: t
                .max_threads
                .unwrap_or(segment::Sizes::default().max_threads),
            ..segment::Sizes::default()
        },
        inline: !t.no_inline,
        all_or_nothing: t.all_or_nothing,
        data_mechanism: mechanism,
        follow_fork: t.follow_fork,
        max_processes: t.max_processes,
        kernel_system: t.system,
        probe_filter: t
            .probe_filter
            .as_deref()
            .map(|re| {
                regex::Regex::new(re).map_err(|e| {
                    // One line: the regex crate's message draws the pattern and a caret.
                    let e = e.to_string();
                    let why = e
                        .lines()
                        .last()
                        .unwrap_or_default()
                        .trim_start_matches("error: ");
                    anyhow!("--probe-filter {re:?}: not a regular expression ({why})")
                })
            })
            .transpose()?,
        buffering: match t.buffering.as_deref() {
            Some("full") => trace::Buffering::Full,
            Some("none") => trace::Buffering::None,
            _ => trace::Buffering::Line,
        },
        print: true,
    };
    if t.export.is_empty() {
        return trace::run(&prog, &opts);
    }
    let mut exporter = export::Exporter::start(&exports, export_interval)?;
    trace::run_with(&prog, &opts, &mut [&mut exporter])
}

/// The stack the front end runs on. Its stages recurse over the program's tree,
/// whose depth the parser bounds (`weft_lang::parser::MAX_NESTING`); this leaves a
/// wide margin for that even in debug builds and whatever `ulimit -s` says. Pages
/// are only committed when touched.
const FRONT_END_STACK: usize = 64 << 20;

/// `weft_lang::compile` on a thread with [`FRONT_END_STACK`].
pub(crate) fn front_end(
    text: &str,
    file: &str,
    opts: &weft_lang::Options,
    stap: Option<&weft_lang::stap::StapOptions>,
) -> Result<weft_lang::Output> {
    std::thread::scope(|s| {
        let worker = std::thread::Builder::new()
            .name("front-end".into())
            .stack_size(FRONT_END_STACK)
            .spawn_scoped(s, || match stap {
                Some(so) => weft_lang::stap::compile(text, file, opts, so),
                None => weft_lang::compile(text, file, opts),
            })
            .context("starting the front end's thread")?;
        match worker.join() {
            Ok(out) => Ok(out),
            Err(panic) => std::panic::resume_unwind(panic),
        }
    })
}

/// A program file's text: UTF-8 without NUL bytes, or a one-line error saying
/// where it is not.
fn program_text(file: &str, bytes: Vec<u8>) -> Result<String> {
    let located = |at: usize, what: String| {
        let before = &bytes[..at];
        let line = before.iter().filter(|&&b| b == b'\n').count() + 1;
        let line_start = before
            .iter()
            .rposition(|&b| b == b'\n')
            .map_or(0, |i| i + 1);
        // Columns count characters; the prefix is valid UTF-8 up to `at`.
        let col = String::from_utf8_lossy(&bytes[line_start..at])
            .chars()
            .count()
            + 1;
        anyhow!("{file}:{line}:{col}: {what}; a program is UTF-8 text")
    };
    let text = match std::str::from_utf8(&bytes) {
        Ok(t) => t.to_string(),
        Err(e) => {
            let at = e.valid_up_to();
            return Err(located(
                at,
                format!("invalid UTF-8 (byte 0x{:02x})", bytes[at]),
            ));
        }
    };
    if let Some(at) = bytes.iter().position(|&b| b == 0) {
        return Err(located(at, "NUL byte in the program".to_string()));
    }
    Ok(text)
}

/// `--info`: the system and what this weft supports, in bpftrace's layout where it
/// applies.
fn info() -> String {
    let kernel = |f: &str| {
        std::fs::read_to_string(format!("/proc/sys/kernel/{f}"))
            .map(|s| s.trim().to_string())
            .unwrap_or_default()
    };
    let os = format!(
        "{} {} {}",
        kernel("ostype"),
        kernel("osrelease"),
        kernel("version")
    );
    let features = weft_kernel::tracefs::features();
    let kernel_probe = |path: &str| {
        if std::path::Path::new(path).exists() {
            "yes"
        } else {
            "no"
        }
    };
    format!(
        "System\n  OS: {os}\n  Arch: {}\n\n\
         Build\n  version: weft {}\n  agent: {}\n\n\
         Probe types\n  uprobe, uretprobe, usdt: yes (woven into the process, no kernel uprobe)\n  \
         profile, interval, BEGIN, END: yes\n  tracepoint: {} (advice compiled to eBPF)\n  \
         kprobe, kretprobe: {}\n  kfunc: no\n  software, hardware, watchpoint: no\n\n\
         Kernel\n  uprobes (for peers): {}\n  tracefs: {}\n  BTF: {}\n",
        std::env::consts::ARCH,
        env!("CARGO_PKG_VERSION"),
        target::agent_path()
            .map(|p| p.display().to_string())
            .unwrap_or_else(|e| format!("not found ({e})")),
        if features.tracefs.is_ok() {
            "yes"
        } else {
            "no (no tracefs)"
        },
        if features.kprobes.is_some() {
            "the kernel has them; weft does not use them yet"
        } else {
            "no (this kernel has no kprobes)"
        },
        kernel_probe("/sys/bus/event_source/devices/uprobe"),
        kernel_probe("/sys/kernel/tracing/uprobe_events"),
        if features.btf.is_some() { "yes" } else { "no" },
    )
}

/// Other clocks' offsets from CLOCK_MONOTONIC, now (`nsecs(boot)`, `nsecs(tai)`).
fn clock_offsets() -> weft_lang::ClockOffsets {
    let ns = |clock: libc::clockid_t| -> u64 {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: clock_gettime writes the timespec it is given.
        unsafe { libc::clock_gettime(clock, &mut ts) };
        (ts.tv_sec as u64)
            .wrapping_mul(1_000_000_000)
            .wrapping_add(ts.tv_nsec as u64)
    };
    let mono = ns(libc::CLOCK_MONOTONIC);
    weft_lang::ClockOffsets {
        boot: ns(libc::CLOCK_BOOTTIME).wrapping_sub(mono),
        tai: ns(libc::CLOCK_TAI).wrapping_sub(mono),
    }
}
