//! `weft fperf [-e EVENT] [--budget PCT|none] [-F PATTERN]... [-o FILE] [--folded FILE]
//! (-c CMD | -p PID | -- CMD ARGS)`: per-function profiles of every function (FPerf,
//! seed 004 IV-B), with the probes' overhead held under a budget.
//!
//! The session is `weft trace`'s, with a program written here: for each pattern, an
//! entry and a return probe. Every call counts in `@fperf_calls[func]`; a call is
//! *sampled* when its function has used fewer than `@fperf_quota` samples this
//! interval (`@fperf_used[func]`), and a sampled call emits a function entry and
//! exit event (timestamped: the event's CLOCK_MONOTONIC time, which the vDSO
//! reads from the TSC here). Whether the call in flight was sampled is one bit of
//! a per-thread bit stack (`@fperf_bits`, the thread's own `sum()` accumulator,
//! as `cflow_strict` keeps its stack): pushed at entry, popped at return.
//!
//! weft rebuilds each thread's stack of sampled calls from the events: inclusive
//! time is exit − entry; exclusive is inclusive minus the sampled callees'
//! inclusive time (exact when every callee call was sampled, e.g. `--budget none`;
//! under a tight budget, calls of callees that were not sampled count as the
//! caller's own time).
//!
//! The overhead is *measured*: each probe reads the clock (`nsecs`) as its advice
//! starts and ends and adds the difference to `@fperf_ns` (every hit, sampled or
//! not, entry and return; at most `HIT_CAP_NS` a run: longer is a thread preempted
//! inside the advice). What that leaves out is the trampolines around the
//! advice (register saves, the return-address hijack): a fixed cost per hit,
//! `HEAD_NS` (`WEFT_FPERF_HEAD_NS` overrides it), added per call counted. The
//! stops of the world that reweaving needs are measured by the engine and added
//! too. The overhead is that time over the target's own (wall time less it).
//!
//! The control loop (a leaky bucket over time, as FPerf's daemon over samples):
//! every tick (2 ms) weft reads the time spent so far; when it is over the budget
//! (`budget` × wall time since the start), every function called since the last
//! interval began is *unwoven* (`Session::functions`, `Session::unweave`: its
//! entry site goes, no stop of the world). Every interval (100 ms), if the
//! bucket is not in debt, the unwoven functions are woven back together (one
//! `Session::reweave`, one stop per process) and every function's sample quota
//! is refilled (`@fperf_used` zeroed); the quota halves after an interval that
//! went over the budget and doubles after one well under it. The quota is never
//! below 1, and a function never called stays woven, so every function called
//! gets a sample (its first call in an interval is sampled).
//!
//! Unweaving with calls open is exact because return probes keep the
//! return-address hijack here (`Options::return_sites` off): a return probe runs
//! for exactly the calls whose entry ran, so the bit stack's pushes and pops
//! pair up however often a function goes out and comes back. Calls are counted
//! only while their function is woven: under a tight budget `CALLS` is the calls
//! seen, and the totals (mean × calls seen) are those of the woven time.

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use clap::Args;
use weft_engine::{segment, target, Options, RunEnd, Session, Weaving};
use weft_trace::{Context as SinkContext, Event, MapSnapshot, Record, Sink};

use crate::trace::Target;

#[derive(Args, Debug, Clone)]
pub struct FperfArgs {
    /// The counter read at each sampled function's entry and exit: `wall` (wall
    /// clock in ns, from the TSC; the default), `cputime` (the thread's CPU time),
    /// `page-faults` (`minor-faults`, `major-faults`) or `context-switches` (the
    /// thread's, from getrusage). `--list-events` shows what this machine has.
    #[arg(
        short = 'e',
        long = "event",
        value_name = "EVENT",
        default_value = "wall"
    )]
    pub event: String,
    /// Show the counters this machine offers, and why the others are not.
    #[arg(long = "list-events")]
    pub list_events: bool,
    /// The most the probes may slow the target, in percent (0.1 to 100), or
    /// `none`: every call sampled.
    #[arg(long = "budget", value_name = "PCT|none", default_value = "5")]
    pub budget: String,
    /// Functions to profile: a wildcard pattern over the program's functions, or
    /// `BINARY:PATTERN` for a library's. Repeat it for several; every function of
    /// the program by default.
    #[arg(short = 'F', long = "functions", value_name = "PATTERN")]
    pub functions: Vec<String>,
    /// Write the profile as JSON to FILE as well.
    #[arg(short = 'o', value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// Write folded stacks of the sampled calls (exclusive time, ns) to FILE, for
    /// flame graphs.
    #[arg(long = "folded", value_name = "FILE")]
    pub folded: Option<PathBuf>,
    /// Launch this command (split like a shell would) and profile it from its start.
    #[arg(short = 'c', value_name = "CMD")]
    pub command: Option<String>,
    /// Profile this running process from now on.
    #[arg(short = 'p', value_name = "PID", value_parser = clap::value_parser!(i32).range(1..))]
    pub pid: Option<i32>,
    /// Show the control loop's decisions, and how each site was woven.
    #[arg(short = 'v')]
    pub verbose: bool,
    /// The command to launch, after `--`.
    #[arg(last = true, value_name = "CMD")]
    pub cmd: Vec<String>,
}

/// The control loop's period: quotas refilled, unwoven functions woven back.
const INTERVAL: Duration = Duration::from_millis(100);
/// How often the time spent is compared with the budget.
const TICK: Duration = Duration::from_millis(2);
/// The trampolines' cost per call, around the advice (which times itself): the
/// generic entry head and the return-address hijack and its return trampoline.
const HEAD_NS: f64 = 40.0;
/// The most one advice run counts (see `program_text`).
const HIT_CAP_NS: u64 = 50_000;
/// The first interval's per-function quota.
const FIRST_QUOTA: u64 = 64;
/// The period of the pc samples that measure the probes' share of the target's
/// CPU time (`WEFT_FPERF_SAMPLE_US`; 0: none). Each costs the target a timer
/// interrupt, some microseconds on a virtual machine: 2 ms keeps that under 1 %.
const SAMPLE_NS: u64 = 2_000_000;
/// The quota with no budget: every call.
const UNLIMITED: u64 = 1 << 62;

/// A counter `-e` may name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Counter {
    Wall,
    /// The thread's CPU time (`CLOCK_THREAD_CPUTIME_ID`, a system call a read).
    CpuTime,
    /// A software event of the thread, from `getrusage(RUSAGE_THREAD)` (a system
    /// call a read): a `weft_ir::RUSAGE_*` counter.
    Software(u64),
}

impl Counter {
    fn name(self) -> &'static str {
        match self {
            Counter::Wall => "wall",
            Counter::CpuTime => "cputime",
            Counter::Software(weft_ir::RUSAGE_MINOR_FAULTS) => "minor-faults",
            Counter::Software(weft_ir::RUSAGE_MAJOR_FAULTS) => "major-faults",
            Counter::Software(weft_ir::RUSAGE_CONTEXT_SWITCHES) => "context-switches",
            Counter::Software(_) => "page-faults",
        }
    }

    /// What the counter counts: `ns` for the clocks, else events.
    fn unit(self) -> &'static str {
        match self {
            Counter::Wall | Counter::CpuTime => "ns",
            Counter::Software(weft_ir::RUSAGE_CONTEXT_SWITCHES) => "switches",
            Counter::Software(_) => "faults",
        }
    }

    /// The hidden variable advice reads it from; none for the events' own time.
    fn variable(self) -> Option<&'static str> {
        match self {
            Counter::Wall => None,
            Counter::CpuTime => Some("__weft_cputime"),
            Counter::Software(weft_ir::RUSAGE_MINOR_FAULTS) => Some("__weft_minflt"),
            Counter::Software(weft_ir::RUSAGE_MAJOR_FAULTS) => Some("__weft_majflt"),
            Counter::Software(weft_ir::RUSAGE_CONTEXT_SWITCHES) => Some("__weft_csw"),
            Counter::Software(_) => Some("__weft_faults"),
        }
    }

    /// A value of the counter as the report shows it.
    fn show(self, v: f64) -> String {
        match self.unit() {
            "ns" => ns(v),
            _ if v >= 100.0 || v == v.trunc() => format!("{v:.0}"),
            _ => format!("{v:.2}"),
        }
    }
}

/// Hardware events: refused on a machine without a PMU, with the reason.
const HARDWARE: &[&str] = &[
    "cycles",
    "cpu-cycles",
    "instructions",
    "cache-misses",
    "cache-references",
    "branch-misses",
    "branches",
    "branch-instructions",
    "bus-cycles",
    "ref-cycles",
];
/// Software events fperf reads per thread (`getrusage(RUSAGE_THREAD)`).
const SOFTWARE: &[&str] = &[
    "page-faults",
    "faults",
    "minor-faults",
    "major-faults",
    "context-switches",
    "cs",
];
/// Software events the kernel counts but no per-thread read serves.
const SOFTWARE_UNREAD: &[&str] = &["cpu-migrations", "migrations"];

fn parse_event(e: &str) -> Result<Counter> {
    match e {
        "wall" | "time" => Ok(Counter::Wall),
        "cputime" | "task-clock" | "cpu-clock" => Ok(Counter::CpuTime),
        _ if HARDWARE.contains(&e) => match weft_kernel::perf::hardware() {
            Ok(()) => {
                bail!("-e {e}: hardware events are not read by weft fperf yet (rdpmc); use -e wall")
            }
            Err(why) => bail!("-e {e}: a hardware event, unavailable on this machine: {why}"),
        },
        "page-faults" | "faults" => Ok(Counter::Software(weft_ir::RUSAGE_FAULTS)),
        "minor-faults" => Ok(Counter::Software(weft_ir::RUSAGE_MINOR_FAULTS)),
        "major-faults" => Ok(Counter::Software(weft_ir::RUSAGE_MAJOR_FAULTS)),
        "context-switches" | "cs" => Ok(Counter::Software(weft_ir::RUSAGE_CONTEXT_SWITCHES)),
        _ if SOFTWARE_UNREAD.contains(&e) => bail!(
            "-e {e}: not read by weft fperf: a thread's resource usage (getrusage) does not \
             count migrations, and a perf counter per thread is not opened; use -e \
             context-switches or -e wall"
        ),
        _ => {
            let all: Vec<&str> = ["wall", "cputime"]
                .iter()
                .chain(HARDWARE)
                .chain(SOFTWARE)
                .chain(SOFTWARE_UNREAD)
                .copied()
                .collect();
            let near = all
                .iter()
                .min_by_key(|k| strsim_distance(k, e))
                .filter(|k| strsim_distance(k, e) <= 2);
            match near {
                Some(k) => bail!("-e {e}: unknown event; did you mean `{k}`? (--list-events)"),
                None => bail!("-e {e}: unknown event (--list-events shows them)"),
            }
        }
    }
}

/// Levenshtein distance (for "did you mean").
fn strsim_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for (j, &cb) in b.iter().enumerate() {
            let cur = row[j + 1];
            row[j + 1] = (prev + usize::from(ca != cb)).min(row[j] + 1).min(cur + 1);
            prev = cur;
        }
    }
    row[b.len()]
}

/// `--budget`: a fraction of the target's time, or `None` (no limit).
fn parse_budget(s: &str) -> Result<Option<f64>> {
    if s == "none" || s == "unlimited" {
        return Ok(None);
    }
    let v: f64 = s.trim_end_matches('%').parse().map_err(|_| {
        anyhow!("--budget {s}: not a percentage (a number from 0.1 to 100, or `none`)")
    })?;
    if !(0.1..=100.0).contains(&v) {
        bail!("--budget {s}: out of range (0.1 to 100 percent, or `none`)");
    }
    Ok(Some(v / 100.0))
}

fn list_events() -> String {
    let mut s = String::from(
        "wall            yes: wall-clock ns from the TSC (vDSO CLOCK_MONOTONIC), the default\n\
         cputime         yes: the thread's CPU time in ns (also task-clock, cpu-clock): \
         clock_gettime(CLOCK_THREAD_CPUTIME_ID), a system call at each sampled entry and exit \
         (the budget counts it)\n",
    );
    let hw = weft_kernel::perf::hardware();
    for e in ["cycles", "instructions", "cache-misses", "branch-misses"] {
        match &hw {
            Ok(()) => s.push_str(&format!(
                "{e:<15} no: the PMU exists, weft fperf does not read it yet (rdpmc)\n"
            )),
            Err(why) => s.push_str(&format!("{e:<15} no: {why}\n")),
        }
    }
    s.push_str(
        "page-faults     yes: the thread's page faults (also faults; minor-faults, major-faults \
         apart): getrusage(RUSAGE_THREAD), a system call at each sampled entry and exit\n\
         context-switches yes: the thread's context switches, voluntary and involuntary (also cs): \
         getrusage(RUSAGE_THREAD), as page-faults\n\
         cpu-migrations  no: a thread's resource usage does not count them\n",
    );
    s.push_str(&format!(
        "(event sources of this kernel: {})\n",
        weft_kernel::perf::sources().join(", ")
    ));
    s
}

/// Runs the subcommand.
pub fn run(a: FperfArgs) -> Result<i32> {
    if a.list_events {
        print!("{}", list_events());
        return Ok(0);
    }
    let counter = parse_event(&a.event)?;
    let budget = parse_budget(&a.budget)?;
    let target = match (&a.command, a.pid, a.cmd.is_empty()) {
        (Some(c), None, true) => Target::Launch(target::split_command(c)?),
        (None, Some(p), true) => Target::Attach(vec![p]),
        (None, None, false) => Target::Launch(a.cmd.clone()),
        (None, None, true) => bail!("fperf needs a target: -c CMD, -p PID or -- CMD ARGS"),
        _ => bail!("give only one of -c CMD, -p PID and -- CMD ARGS..."),
    };
    let program = crate::record_cmd::traced_program(&target)?;
    let patterns = if a.functions.is_empty() {
        vec!["*".to_string()]
    } else {
        a.functions.clone()
    };
    let first = if budget.is_some() {
        FIRST_QUOTA
    } else {
        UNLIMITED
    };
    let text = program_text(&program, &patterns, first, counter)?;
    let out = crate::front_end(&text, "weft fperf", &weft_lang::Options::default(), None)?;
    if !out.diagnostics.is_empty() {
        eprint!(
            "{}",
            weft_lang::render(&out.diagnostics, &text, "weft fperf")
        );
    }
    let Some(prog) = out.program else {
        return Ok(1);
    };
    let map = |name: &str| {
        prog.maps
            .iter()
            .position(|m| m.name == name)
            .map(|i| i as u32)
            .ok_or_else(|| anyhow!("internal: the program has no {name}"))
    };
    let ids = MapIds {
        quota: map("@fperf_quota")?,
        used: map("@fperf_used")?,
        calls: map("@fperf_calls")?,
        ns: map("@fperf_ns")?,
    };
    let engine = Options {
        // Sampled calls are events: with no budget, every call is two. Rings of
        // 8 MiB whose producers wait for weft when full (as `weft record`'s): a
        // sample is never lost while weft keeps up, and a wait is advice time the
        // advice's own timing counts against the budget.
        sizes: segment::Sizes {
            ring_size: 8 << 20,
            lossless: true,
            ..segment::Sizes::default()
        },
        verbose: a.verbose,
        progress: crate::progress::TermProgress::hook(false),
        // The hijack: return advice runs exactly for the calls whose entry ran,
        // so a function unwoven with calls open keeps its bit stack paired.
        return_sites: false,
        ..Options::default()
    };
    let attaching = matches!(target, Target::Attach(_));
    let mut session = Session::new(&prog, engine, attaching)?;
    match &target {
        Target::Launch(argv) => {
            session.launch(argv)?;
        }
        Target::Attach(pids) => session.attach(pids[0])?,
        Target::None => {}
    }
    let mut profile = Profile {
        calls_map: ids.calls,
        counter_values: counter != Counter::Wall,
        ..Profile::default()
    };
    let head_ns = std::env::var("WEFT_FPERF_HEAD_NS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(HEAD_NS);
    let mut control = Control {
        budget,
        quota: first,
        head_ns,
        functions: Vec::new(),
        advice_ns: 0,
        calls: 0,
        pause: Duration::ZERO,
        interval_over: false,
        interval_calls: HashMap::new(),
        unweaves: 0,
        reweaves: 0,
        reweave_cost: 0.0,
        // Everything is woven at the start, as after a reweave: its cost until
        // the first unweave is the first reweave's estimate.
        reweave_from: Some(0.0),
        verbose: a.verbose,
        sampler: None,
    };
    let sample_ns = std::env::var("WEFT_FPERF_SAMPLE_US")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .map_or(SAMPLE_NS, |us| us * 1000);
    let mut started = Instant::now();
    let result = (|| -> Result<()> {
        session.prepare()?;
        session.begin(&mut profile);
        session.go()?;
        started = Instant::now();
        if sample_ns > 0 {
            control.sampler = session
                .first_pid()
                .and_then(|pid| crate::fperf_sample::PcSampler::new(pid, sample_ns));
        }
        control.functions = session
            .functions()
            .into_iter()
            .map(|(f, w)| Func { addr: f, w })
            .collect();
        let stop = crate::trace::stop_flag();
        let mut interval = Instant::now();
        let mut next = interval + TICK;
        loop {
            match session.run_until(&mut profile, stop, Some(next))? {
                RunEnd::Deadline => {}
                _ => break,
            }
            let now = Instant::now();
            control.tick(&mut session, &ids, now - started)?;
            if now >= interval + INTERVAL {
                control.interval(&mut session, &ids, now - started)?;
                interval = now;
            }
            next = Instant::now() + TICK;
        }
        Ok(())
    })();
    if let Err(e) = result {
        session.abandon();
        return Err(e);
    }
    // The last stretch, since the last tick; the run's time ends here (what
    // finishing takes is weft's, after the target).
    control.read(&session, &ids);
    let elapsed = started.elapsed();
    let done = session.finish(&mut profile)?;
    let spent = control.spent_ns();
    let overhead = overhead(spent, elapsed);
    let calls_total = profile.calls.values().sum::<u64>();
    let samples_total = profile.samples_total;
    let rows = profile.rows();
    let mut stdout = std::io::stdout().lock();
    write_table(&mut stdout, &rows, counter)?;
    let budget_text = match budget {
        Some(b) => format!("{:.1}%", b * 100.0),
        None => "none".to_string(),
    };
    writeln!(
        stdout,
        "weft: fperf: {} functions called, {} sampled; {} calls seen, {} samples; {} unweaves, \
         {} reweaves",
        rows.len(),
        rows.iter().filter(|r| r.samples > 0).count(),
        calls_total,
        samples_total,
        control.unweaves,
        control.reweaves,
    )?;
    writeln!(
        stdout,
        "weft: fperf: measured overhead {:.2}% of {:.2} s (budget {budget_text}): advice {:.1} ms \
         (timed), trampolines {:.1} ms ({} hits x {:.0} ns), reweave stops {:.1} ms",
        overhead * 100.0,
        elapsed.as_secs_f64(),
        control.advice_ns as f64 / 1e6,
        control.calls as f64 * control.head_ns / 1e6,
        control.calls,
        control.head_ns,
        control.pause.as_secs_f64() * 1e3,
    )?;
    let sampled = control.sampler.as_ref();
    match sampled {
        Some(p) => writeln!(
            stdout,
            "weft: fperf: the target's pc sampled every {:.1} ms of CPU time: {} of {} samples in \
             probes ({:.1} ms){}; the larger of the two measures counts",
            sample_ns as f64 / 1e6,
            p.in_probes,
            p.total,
            p.probe_ns() / 1e6,
            if p.lost > 0 {
                format!(", {} samples lost", p.lost)
            } else {
                String::new()
            }
        )?,
        None if sample_ns > 0 => writeln!(
            stdout,
            "weft: fperf: the target's pc could not be sampled (perf events): the advice's \
             timing alone measured the overhead"
        )?,
        None => {}
    }
    if let Some(p) = &a.output {
        let json = serde_json::json!({
            "event": counter.name(),
            "unit": counter.unit(),
            "budget_percent": budget.map(|b| b * 100.0),
            "overhead_percent": overhead * 100.0,
            "seconds": elapsed.as_secs_f64(),
            "advice_ns": control.advice_ns,
            "trampoline_ns_per_hit": control.head_ns,
            "hits": control.calls,
            "reweave_pause_ns": control.pause.as_nanos() as u64,
            "unweaves": control.unweaves,
            "reweaves": control.reweaves,
            "orphan_exits": profile.orphans,
            "pc_samples": sampled.map(|p| p.total),
            "pc_samples_in_probes": sampled.map(|p| p.in_probes),
            "pc_sample_period_ns": sampled.map(|_| sample_ns),
            "events_lost": done.losses.events_lost,
            "functions": rows.iter().map(Row::json).collect::<Vec<_>>(),
        });
        std::fs::write(p, serde_json::to_string_pretty(&json)? + "\n")
            .with_context(|| format!("writing {}", p.display()))?;
    }
    if let Some(p) = &a.folded {
        let mut lines: Vec<String> = profile
            .folded
            .iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect();
        lines.sort();
        std::fs::write(p, lines.join("\n") + "\n")
            .with_context(|| format!("writing {}", p.display()))?;
    }
    if done.losses.events_lost > 0 {
        eprintln!(
            "weft: fperf: {} events of sampled calls were lost (a ring stayed full): those \
             calls are missing from the samples",
            done.losses.events_lost
        );
    }
    for line in done.losses.report() {
        eprintln!("{line}");
    }
    Ok(done.exit_code)
}

/// The slowdown: time in probes over the time the target would have taken
/// without them.
fn overhead(spent_ns: f64, elapsed: Duration) -> f64 {
    let el = elapsed.as_nanos().max(1) as f64;
    spent_ns / (el - spent_ns).max(el * 0.01)
}

/// The program `weft fperf` runs.
fn program_text(
    program: &Path,
    patterns: &[String],
    quota: u64,
    counter: Counter,
) -> Result<String> {
    // The counter, when it is not the events' own time: recorded after the
    // (no) arguments at entry, in place of the return value at exit.
    let value = counter.variable().unwrap_or("");
    let (entry_value, exit_value) = if value.is_empty() {
        (String::new(), String::new())
    } else {
        (format!(", {value}"), value.to_string())
    };
    let mut text = format!("BEGIN {{ @fperf_quota = {quota}; }}\n");
    for p in patterns {
        let (binary, functions) = crate::record_cmd::checked_pattern(p, program)?;
        // The bit stack: push 2b+s at entry, pop b>>1 at return (as sums of the
        // thread's accumulator: + (b + s), + ((b >> 1) - b)). Each advice times
        // itself into @fperf_ns, at most HIT_CAP_NS a hit (more is a thread
        // preempted inside the advice: the machine's time, not the probe's).
        text.push_str(&format!(
            "uprobe:{binary}:{functions} {{\n  \
               $t = nsecs;\n  \
               @fperf_calls[func] = count();\n  \
               $b = (uint64)__weft_thread(@fperf_bits);\n  \
               $u = @fperf_used[func];\n  \
               if ($u < @fperf_quota) {{\n    \
                 @fperf_used[func] = $u + 1;\n    \
                 @fperf_bits = sum($b + 1);\n    \
                 __weft_entry(0{entry_value});\n  \
               }} else {{\n    \
                 @fperf_bits = sum($b);\n  \
               }}\n  \
               $d = nsecs - $t;\n  \
               @fperf_ns = sum($d < {cap} ? $d : {cap});\n\
             }}\n\
             uretprobe:{binary}:{functions} {{\n  \
               $t = nsecs;\n  \
               $b = (uint64)__weft_thread(@fperf_bits);\n  \
               @fperf_bits = sum(($b >> 1) - $b);\n  \
               if ($b & 1) {{ __weft_exit({exit_value}); }}\n  \
               $d = nsecs - $t;\n  \
               @fperf_ns = sum($d < {cap} ? $d : {cap});\n\
             }}\n",
            cap = HIT_CAP_NS,
        ));
    }
    Ok(text)
}

struct MapIds {
    quota: u32,
    used: u32,
    calls: u32,
    ns: u32,
}

/// One function's sites.
struct Func {
    addr: u64,
    w: Weaving,
}

/// The leaky bucket, over the measured time in probes.
struct Control {
    /// `None`: no limit.
    budget: Option<f64>,
    quota: u64,
    /// The trampolines' cost per call, around the advice.
    head_ns: f64,
    functions: Vec<Func>,
    /// Time the advice measured itself spending (`@fperf_ns`), so far.
    advice_ns: u64,
    /// Calls seen so far (probe hits: an entry and a return each).
    calls: u64,
    /// Stops of the world reweaving needed.
    pause: Duration,
    /// The budget was exceeded in this interval.
    interval_over: bool,
    /// Calls per function when the interval began.
    interval_calls: HashMap<u64, u64>,
    unweaves: u64,
    reweaves: u64,
    /// What a reweave cost until its functions went out again (its stop and the
    /// probes' time meanwhile), the most lately: the headroom the next one waits
    /// for.
    reweave_cost: f64,
    /// Time spent when the last reweave began, while its cost is being measured.
    reweave_from: Option<f64>,
    verbose: bool,
    /// The target's pc, sampled: the probes' share of its CPU time, whatever the
    /// advice's own timing misses (`None` where perf events cannot be opened).
    sampler: Option<crate::fperf_sample::PcSampler>,
}

/// A keyless or per-key u64 value of a snapshot.
fn word(v: &[u8]) -> u64 {
    v.get(..8)
        .map_or(0, |b| u64::from_le_bytes(b.try_into().unwrap()))
}

impl Control {
    fn spent_ns(&self) -> f64 {
        let timed = self.advice_ns as f64 + self.calls as f64 * self.head_ns;
        let sampled = self.sampler.as_ref().map_or(0.0, |s| s.probe_ns());
        timed.max(sampled) + self.pause.as_nanos() as f64
    }

    /// Per-function calls so far.
    fn calls_by_function(s: &Session<'_>, ids: &MapIds) -> HashMap<u64, u64> {
        s.snapshot(ids.calls)
            .entries
            .iter()
            .filter_map(|(k, v)| Some((u64::from_le_bytes(k.as_slice().try_into().ok()?), word(v))))
            .collect()
    }

    /// Read the time spent and the calls so far.
    fn read(&mut self, s: &Session<'_>, ids: &MapIds) {
        if let Some(p) = self.sampler.as_mut() {
            p.read();
        }
        self.advice_ns = s
            .snapshot(ids.ns)
            .entries
            .first()
            .map_or(0, |(_, v)| word(v));
        self.calls = Self::calls_by_function(s, ids).values().sum();
    }

    /// Over the budget: unweave every woven function called in this interval.
    fn tick(&mut self, s: &mut Session<'_>, ids: &MapIds, elapsed: Duration) -> Result<()> {
        self.read(s, ids);
        let Some(budget) = self.budget else {
            return Ok(());
        };
        // A tenth of the budget is kept for what runs until the next tick.
        let over = overhead(self.spent_ns(), elapsed);
        if over <= 0.9 * budget {
            return Ok(());
        }
        self.interval_over = true;
        let spent = self.spent_ns();
        let now = Self::calls_by_function(s, ids);
        let mut out = Vec::new();
        for f in self.functions.iter_mut().filter(|f| f.w.woven) {
            let before = self.interval_calls.get(&f.addr).copied().unwrap_or(0);
            if now.get(&f.addr).copied().unwrap_or(0) > before {
                out.push(f);
            }
        }
        if out.is_empty() {
            return Ok(());
        }
        let mut all = Weaving::union(out.iter().map(|f| &f.w));
        s.unweave(&mut all)?;
        for f in &mut out {
            f.w.woven = false;
        }
        self.unweaves += out.len() as u64;
        // The most a reweave cost lately (a stop of the world takes far longer
        // on a busy machine, and varies): a decaying maximum.
        if let Some(from) = self.reweave_from.take() {
            self.reweave_cost = (spent - from).max(0.8 * self.reweave_cost);
        }
        if self.verbose {
            eprintln!(
                "weft: fperf: {:.0} ms: overhead {:.2}% over the budget: unwove {} functions",
                elapsed.as_secs_f64() * 1e3,
                over * 100.0,
                out.len()
            );
        }
        Ok(())
    }

    /// An interval ended: set the quota, refill every function's, weave the
    /// unwoven back unless the bucket is in debt.
    fn interval(&mut self, s: &mut Session<'_>, ids: &MapIds, elapsed: Duration) -> Result<()> {
        if let Some(p) = self.sampler.as_mut() {
            p.refresh();
        }
        let Some(budget) = self.budget else {
            return Ok(());
        };
        let over = overhead(self.spent_ns(), elapsed);
        let old = self.quota;
        if self.interval_over {
            self.quota = (self.quota / 2).max(1);
        } else if over < budget / 2.0 {
            self.quota = (self.quota * 2).min(1 << 20);
        }
        let shm = &s.seg.shm;
        let d = shm.map(ids.quota);
        if let Some(i) = weft_runtime::map::insert(shm, d, &[]).index() {
            let v = weft_runtime::map::plain_value_ptr(shm, d, i)
                as *const std::sync::atomic::AtomicU64;
            // SAFETY: a live plain entry's value: 8 bytes, 8-aligned, in the segment
            // mapped for the session's life; advice reads it with plain loads.
            unsafe { (*v).store(self.quota, Ordering::Relaxed) };
        }
        weft_runtime::map::zero(shm, shm.map(ids.used));
        self.interval_over = false;
        self.interval_calls = Self::calls_by_function(s, ids);
        // Weave back only with room for what the last reweave cost (and half
        // again, for a burst that runs longer: a late tick), so the bucket stays
        // under the budget through the next one too.
        let spent = self.spent_ns();
        let room = budget * (elapsed.as_nanos() as f64 - spent) - spent;
        let out: Vec<&mut Func> = self.functions.iter_mut().filter(|f| !f.w.woven).collect();
        if out.is_empty() || room < 1.5 * self.reweave_cost {
            if self.verbose && old != self.quota {
                eprintln!("weft: fperf: quota {old} -> {}", self.quota);
            }
            return Ok(());
        }
        let mut all = Weaving::union(out.iter().map(|f| &f.w));
        self.reweave_from = Some(spent);
        s.reweave(&mut all)?;
        self.pause += all.pause;
        self.reweaves += out.len() as u64;
        if self.verbose {
            eprintln!(
                "weft: fperf: {:.0} ms: overhead {:.2}%: rewove {} functions (target stopped {:.2} \
                 ms); quota {old} -> {}",
                elapsed.as_secs_f64() * 1e3,
                over * 100.0,
                out.len(),
                all.pause.as_secs_f64() * 1e3,
                self.quota
            );
        }
        for f in out {
            f.w.woven = true;
        }
        Ok(())
    }
}

/// One sampled call in flight.
struct Open {
    func: u64,
    start: u64,
    /// Sampled callees' inclusive time.
    children: u64,
}

#[derive(Default, Clone)]
struct Stat {
    /// Sampled entries; `samples` of them saw their exit.
    entries: u64,
    samples: u64,
    incl: u64,
    incl_sq: f64,
    incl_min: u64,
    excl: u64,
}

/// The profile, built from the sampled calls' events.
#[derive(Default)]
struct Profile {
    names: HashMap<(u32, u64), String>,
    stacks: HashMap<(u32, u32), Vec<Open>>,
    stats: HashMap<(u32, u64), Stat>,
    /// Calls per function (from `@fperf_calls` at the end).
    calls: HashMap<(u32, u64), u64>,
    samples_total: u64,
    /// Folded stacks → exclusive ns.
    folded: HashMap<String, u64>,
    /// Exits that closed no sampled entry (a bit stack deeper than 64 calls).
    orphans: u64,
    calls_map: u32,
    /// Entries carry the counter's value as their last argument, exits in place
    /// of the return value (`-e cputime`, `-e page-faults`...); else the events'
    /// own times count.
    counter_values: bool,
}

impl Profile {
    fn name(&self, pid: u32, func: u64) -> String {
        self.names
            .get(&(pid, func))
            .cloned()
            .unwrap_or_else(|| format!("{func:#x}"))
    }

    fn rows(&self) -> Vec<Row> {
        let mut rows: Vec<Row> = self
            .calls
            .iter()
            .filter(|(_, &c)| c > 0)
            .map(|(&(pid, func), &calls)| {
                let s = self.stats.get(&(pid, func)).cloned().unwrap_or_default();
                Row::new(self.name(pid, func), calls, &s)
            })
            .collect();
        rows.sort_by(|a, b| {
            b.total_incl
                .partial_cmp(&a.total_incl)
                .unwrap_or(std::cmp::Ordering::Equal)
                .then(a.name.cmp(&b.name))
        });
        rows
    }
}

impl Sink for Profile {
    fn record(&mut self, r: &Record, _cx: &SinkContext<'_>) {
        match &r.event {
            Event::Function { func, name } => {
                self.names.insert((r.pid, *func), name.clone());
            }
            Event::FunctionEntry { func, args } => {
                let start = match (self.counter_values, args.last()) {
                    (true, Some(&v)) => v,
                    _ => r.nsecs,
                };
                self.samples_total += 1;
                self.stats.entry((r.pid, *func)).or_default().entries += 1;
                self.stacks.entry((r.pid, r.tid)).or_default().push(Open {
                    func: *func,
                    start,
                    children: 0,
                });
            }
            Event::FunctionExit { func, retval } => {
                let end = if self.counter_values {
                    *retval
                } else {
                    r.nsecs
                };
                let names = &self.names;
                let name = |f: u64| {
                    names
                        .get(&(r.pid, f))
                        .cloned()
                        .unwrap_or_else(|| format!("{f:#x}"))
                };
                let Some(stack) = self.stacks.get_mut(&(r.pid, r.tid)) else {
                    self.orphans += 1;
                    return;
                };
                let Some(at) = stack.iter().rposition(|o| o.func == *func) else {
                    self.orphans += 1;
                    return;
                };
                // Entries above it never saw their exit: dropped.
                stack.truncate(at + 1);
                let o = stack.pop().expect("an entry at `at`");
                let incl = end.saturating_sub(o.start);
                let excl = incl.saturating_sub(o.children);
                if let Some(parent) = stack.last_mut() {
                    parent.children += incl;
                }
                let mut path: Vec<String> = stack.iter().map(|f| name(f.func)).collect();
                path.push(name(o.func));
                *self.folded.entry(path.join(";")).or_default() += excl;
                let s = self.stats.entry((r.pid, o.func)).or_default();
                if s.samples == 0 || incl < s.incl_min {
                    s.incl_min = incl;
                }
                s.samples += 1;
                s.incl += incl;
                s.incl_sq += (incl as f64) * (incl as f64);
                s.excl += excl;
            }
            _ => {}
        }
    }

    fn finish(&mut self, maps: &[MapSnapshot], cx: &SinkContext<'_>) {
        // `@fperf_calls`: keys the function's address, values the count.
        let Some(m) = maps.iter().find(|m| m.map == self.calls_map) else {
            return;
        };
        for (k, v) in &m.entries {
            let (Ok(k), Some(v)) = (<[u8; 8]>::try_from(k.as_slice()), v.get(..8)) else {
                continue;
            };
            let func = u64::from_le_bytes(k);
            let pid = self
                .names
                .keys()
                .find(|&&(_, f)| f == func)
                .map_or(0, |&(p, _)| p);
            *self.calls.entry((pid, func)).or_default() +=
                u64::from_le_bytes(v.try_into().unwrap());
            // A function called but never sampled has no name from the events
            // (a name comes with a function's first recorded call): the symbols'.
            if let std::collections::hash_map::Entry::Vacant(e) = self.names.entry((pid, func)) {
                if let Some(sym) = cx.resolver.usym(func).filter(|s| s.offset == 0) {
                    e.insert(sym.name);
                }
            }
        }
    }
}

/// A line of the report.
struct Row {
    name: String,
    calls: u64,
    samples: u64,
    /// Sampled entries that saw no exit (calls open at the end).
    open: u64,
    mean_incl: f64,
    min_incl: u64,
    mean_excl: f64,
    /// Estimated total over every call: mean × calls.
    total_incl: f64,
    total_excl: f64,
    /// The mean inclusive time's relative standard error.
    error: f64,
}

impl Row {
    fn new(name: String, calls: u64, s: &Stat) -> Row {
        let n = s.samples as f64;
        let (mean_incl, mean_excl) = if s.samples > 0 {
            (s.incl as f64 / n, s.excl as f64 / n)
        } else {
            (0.0, 0.0)
        };
        let error = if s.samples > 1 && mean_incl > 0.0 {
            let var = (s.incl_sq / n - mean_incl * mean_incl).max(0.0) * n / (n - 1.0);
            var.sqrt() / n.sqrt() / mean_incl
        } else {
            f64::NAN
        };
        Row {
            name,
            calls,
            samples: s.samples,
            open: s.entries.saturating_sub(s.samples),
            mean_incl,
            min_incl: s.incl_min,
            mean_excl,
            total_incl: mean_incl * calls as f64,
            total_excl: mean_excl * calls as f64,
            error,
        }
    }

    fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "function": self.name,
            "calls": self.calls,
            "samples": self.samples,
            "open_samples": self.open,
            "mean_inclusive": self.mean_incl,
            "min_inclusive": self.min_incl,
            "mean_exclusive": self.mean_excl,
            "total_inclusive": self.total_incl,
            "total_exclusive": self.total_excl,
            "relative_error": if self.error.is_finite() { Some(self.error) } else { None },
        })
    }
}

fn write_table(out: &mut dyn Write, rows: &[Row], counter: Counter) -> Result<()> {
    writeln!(
        out,
        "{:<32} {:>10} {:>9} {:>12} {:>12} {:>12} {:>12} {:>7}",
        "FUNCTION",
        "CALLS",
        "SAMPLES",
        "INCL/CALL",
        "EXCL/CALL",
        "TOTAL INCL",
        "TOTAL EXCL",
        "±ERR"
    )?;
    for r in rows {
        let err = if r.error.is_finite() {
            format!("{:.1}%", r.error * 100.0)
        } else {
            "-".into()
        };
        writeln!(
            out,
            "{:<32} {:>10} {:>9} {:>12} {:>12} {:>12} {:>12} {:>7}",
            r.name,
            r.calls,
            r.samples,
            counter.show(r.mean_incl),
            counter.show(r.mean_excl),
            counter.show(r.total_incl),
            counter.show(r.total_excl),
            err
        )?;
    }
    Ok(())
}

/// A duration in ns as ns, us, ms or s.
fn ns(v: f64) -> String {
    if v < 1e3 {
        format!("{v:.0}ns")
    } else if v < 1e6 {
        format!("{:.2}us", v / 1e3)
    } else if v < 1e9 {
        format!("{:.2}ms", v / 1e6)
    } else {
        format!("{:.2}s", v / 1e9)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn budgets_and_events_are_checked() {
        assert_eq!(parse_budget("5").unwrap(), Some(0.05));
        assert_eq!(parse_budget("2.5%").unwrap(), Some(0.025));
        assert_eq!(parse_budget("none").unwrap(), None);
        assert!(parse_budget("0").is_err());
        assert!(parse_budget("abc").is_err());
        assert!(parse_budget("101").is_err());
        assert_eq!(parse_event("wall").unwrap(), Counter::Wall);
        assert_eq!(parse_event("cputime").unwrap(), Counter::CpuTime);
        assert_eq!(parse_event("task-clock").unwrap(), Counter::CpuTime);
        let e = parse_event("wal").unwrap_err().to_string();
        assert!(e.contains("did you mean `wall`"), "{e}");
    }

    #[test]
    fn the_program_compiles() {
        let text = program_text(Path::new("/bin/app"), &["f*".into()], 3, Counter::Wall).unwrap();
        assert!(text.starts_with("BEGIN { @fperf_quota = 3; }\n"));
        assert!(program_text(Path::new("/bin/app"), &["a b".into()], 3, Counter::Wall).is_err());
        let text = program_text(Path::new("/bin/app"), &["f".into()], 3, Counter::CpuTime).unwrap();
        assert!(text.contains("__weft_entry(0, __weft_cputime)"), "{text}");
        assert!(text.contains("__weft_exit(__weft_cputime)"), "{text}");
    }
}
