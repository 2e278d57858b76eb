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
//! The control loop (a leaky bucket, as FPerf's daemon): every interval (100 ms)
//! weft estimates the time the target spent in probes — calls × the cost of a
//! probe hit + samples × the cost of a sample, both measured when weft starts —
//! over the interval's wall time, scales the per-function quota by how far that is
//! from the budget, and refills every function's quota (`@fperf_used` zeroed). The
//! quota is never below 1, so a function called for the first time is sampled.

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use clap::Args;
use weft_engine::{segment, target, Options, RunEnd, Session};
use weft_trace::{Context as SinkContext, Event, MapSnapshot, Record, Sink};

use crate::trace::Target;

#[derive(Args, Debug, Clone)]
pub struct FperfArgs {
    /// The counter read at each sampled function's entry and exit: `wall` (wall
    /// clock in ns, from the TSC; the default). `--list-events` shows what this
    /// machine has.
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

/// The control loop's period.
const INTERVAL: Duration = Duration::from_millis(100);
/// The first interval's per-function quota.
const FIRST_QUOTA: u64 = 64;
/// The quota with no budget: every call.
const UNLIMITED: u64 = 1 << 62;

/// A counter `-e` may name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Counter {
    Wall,
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
/// Software events and the per-thread CPU clock: not read by fperf yet.
const SOFTWARE: &[&str] = &[
    "page-faults",
    "faults",
    "minor-faults",
    "major-faults",
    "context-switches",
    "cs",
    "cpu-migrations",
    "task-clock",
    "cpu-clock",
    "cputime",
];

fn parse_event(e: &str) -> Result<Counter> {
    match e {
        "wall" | "time" => Ok(Counter::Wall),
        _ if HARDWARE.contains(&e) => match weft_kernel::perf::hardware() {
            Ok(()) => {
                bail!("-e {e}: hardware events are not read by weft fperf yet (rdpmc); use -e wall")
            }
            Err(why) => bail!("-e {e}: a hardware event, unavailable on this machine: {why}"),
        },
        _ if SOFTWARE.contains(&e) => bail!(
            "-e {e}: not read by weft fperf yet (a read() system call per sample, or \
             clock_gettime(CLOCK_THREAD_CPUTIME_ID), which is a system call here); use -e wall"
        ),
        _ => {
            let all: Vec<&str> = ["wall"]
                .iter()
                .chain(HARDWARE)
                .chain(SOFTWARE)
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
        "wall            yes: wall-clock ns from the TSC (vDSO CLOCK_MONOTONIC), the default\n",
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
    let sw = match weft_kernel::perf::software() {
        Ok(()) => {
            "the kernel has it; weft fperf does not read it yet (a read() per sample)".to_string()
        }
        Err(why) => why,
    };
    for e in ["page-faults", "context-switches"] {
        s.push_str(&format!("{e:<15} no: {sw}\n"));
    }
    s.push_str(
        "cputime         no: clock_gettime(CLOCK_THREAD_CPUTIME_ID) is a system call, not a vDSO read\n",
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
    let _counter = parse_event(&a.event)?;
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
    let text = program_text(&program, &patterns, first)?;
    let out = crate::front_end(&text, "weft fperf", &weft_lang::Options::default())?;
    if !out.diagnostics.is_empty() {
        eprint!(
            "{}",
            weft_lang::render(&out.diagnostics, &text, "weft fperf")
        );
    }
    let Some(prog) = out.program else {
        return Ok(1);
    };
    let cost = Costs::measure();
    if a.verbose {
        eprintln!(
            "weft: fperf: a probe hit costs ~{:.0} ns, a sample ~{:.0} ns more (measured now)",
            cost.hit_ns, cost.sample_ns
        );
    }
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
    };
    let engine = Options {
        sizes: segment::Sizes::default(),
        verbose: a.verbose,
        progress: crate::progress::TermProgress::hook(false),
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
        ..Profile::default()
    };
    let mut control = Control {
        budget,
        quota: first,
        cost,
        last_calls: 0,
        last_samples: 0,
        spent_ns: 0.0,
        verbose: a.verbose,
    };
    let mut started = Instant::now();
    let result = (|| -> Result<()> {
        session.prepare()?;
        session.begin(&mut profile);
        session.go()?;
        started = Instant::now();
        let stop = crate::trace::stop_flag();
        let mut next = Instant::now() + INTERVAL;
        loop {
            match session.run_until(&mut profile, stop, Some(next))? {
                RunEnd::Deadline => {}
                _ => break,
            }
            let now = Instant::now();
            let wall = now.saturating_duration_since(next - INTERVAL);
            control.step(&session, &ids, &profile, wall);
            next = now + INTERVAL;
        }
        Ok(())
    })();
    if let Err(e) = result {
        session.abandon();
        return Err(e);
    }
    let done = session.finish(&mut profile)?;
    let elapsed = started.elapsed();
    // The last stretch of the run, since the last control step.
    let calls_total = profile.calls.values().sum::<u64>();
    let samples_total = profile.samples_total;
    control.spent_ns += (calls_total.saturating_sub(control.last_calls)) as f64
        * control.cost.hit_ns
        + (samples_total.saturating_sub(control.last_samples)) as f64 * control.cost.sample_ns;
    // The slowdown: time in probes over the time the target would have taken
    // without them.
    let el = elapsed.as_nanos().max(1) as f64;
    let overhead = control.spent_ns / (el - control.spent_ns).max(el * 0.01);
    let rows = profile.rows();
    let mut stdout = std::io::stdout().lock();
    write_table(&mut stdout, &rows)?;
    let budget_text = match budget {
        Some(b) => format!("{:.1}%", b * 100.0),
        None => "none".to_string(),
    };
    writeln!(
        stdout,
        "weft: fperf: {} functions called, {} sampled; {} calls, {} samples; estimated \
         overhead {:.2}% of {:.2} s (budget {budget_text})",
        rows.len(),
        rows.iter().filter(|r| r.samples > 0).count(),
        calls_total,
        samples_total,
        overhead * 100.0,
        elapsed.as_secs_f64(),
    )?;
    if let Some(p) = &a.output {
        let json = serde_json::json!({
            "event": "wall",
            "unit": "ns",
            "budget_percent": budget.map(|b| b * 100.0),
            "overhead_percent": overhead * 100.0,
            "seconds": elapsed.as_secs_f64(),
            "probe_hit_ns": control.cost.hit_ns,
            "sample_ns": control.cost.sample_ns,
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
    for line in done.losses.report() {
        eprintln!("{line}");
    }
    Ok(done.exit_code)
}

/// The program `weft fperf` runs.
fn program_text(program: &Path, patterns: &[String], quota: u64) -> Result<String> {
    let mut text = format!("BEGIN {{ @fperf_quota = {quota}; }}\n");
    for p in patterns {
        let (binary, functions) = crate::record_cmd::checked_pattern(p, program)?;
        // The bit stack: push 2b+s at entry, pop b>>1 at return (as sums of the
        // thread's accumulator: + (b + s), + ((b >> 1) - b)).
        text.push_str(&format!(
            "uprobe:{binary}:{functions} {{\n  \
               @fperf_calls[func] = count();\n  \
               $b = (uint64)__weft_thread(@fperf_bits);\n  \
               $u = @fperf_used[func];\n  \
               if ($u < @fperf_quota) {{\n    \
                 @fperf_used[func] = $u + 1;\n    \
                 @fperf_bits = sum($b + 1);\n    \
                 __weft_entry(0);\n  \
               }} else {{\n    \
                 @fperf_bits = sum($b);\n  \
               }}\n\
             }}\n\
             uretprobe:{binary}:{functions} {{\n  \
               $b = (uint64)__weft_thread(@fperf_bits);\n  \
               @fperf_bits = sum(($b >> 1) - $b);\n  \
               if ($b & 1) {{ __weft_exit(); }}\n\
             }}\n"
        ));
    }
    Ok(text)
}

struct MapIds {
    quota: u32,
    used: u32,
    calls: u32,
}

/// What a probe hit and a sample cost the target, measured as weft starts.
#[derive(Clone, Copy, Debug)]
struct Costs {
    hit_ns: f64,
    sample_ns: f64,
}

impl Costs {
    /// A probe hit is an entry and a return probe: the trampolines and the
    /// advice's map updates. A sample adds two events, each a clock read and a
    /// ring write. The clock read is timed here (it dominates a sample on a
    /// virtual machine: 20 to 200 ns); the rest are fixed estimates from
    /// `bench/run fperf` on this kind of machine.
    fn measure() -> Costs {
        if let Some(c) = std::env::var("WEFT_FPERF_COSTS").ok().and_then(|v| {
            let (h, s) = v.split_once(',')?;
            Some(Costs {
                hit_ns: h.parse().ok()?,
                sample_ns: s.parse().ok()?,
            })
        }) {
            return c;
        }
        let n = 20_000u32;
        let mut best = f64::MAX;
        for _ in 0..5 {
            let t = Instant::now();
            let mut x = 0u64;
            for _ in 0..n {
                x = x.wrapping_add(weft_runtime::clock::monotonic_ns());
            }
            std::hint::black_box(x);
            best = best.min(t.elapsed().as_nanos() as f64 / f64::from(n));
        }
        Costs {
            hit_ns: 80.0,
            sample_ns: 2.0 * (best + 25.0),
        }
    }
}

/// The leaky bucket.
struct Control {
    /// `None`: no limit.
    budget: Option<f64>,
    quota: u64,
    cost: Costs,
    last_calls: u64,
    last_samples: u64,
    /// Estimated time spent in probes so far.
    spent_ns: f64,
    verbose: bool,
}

impl Control {
    /// One interval of `wall` ended: estimate its overhead, set the next quota,
    /// refill every function's.
    fn step(&mut self, s: &Session<'_>, ids: &MapIds, p: &Profile, wall: Duration) {
        let shm = &s.seg.shm;
        let calls_snap = s.snapshot(ids.calls);
        let calls: u64 = calls_snap
            .entries
            .iter()
            .map(|(_, v)| {
                v.get(..8)
                    .map_or(0, |b| u64::from_le_bytes(b.try_into().unwrap()))
            })
            .sum();
        let hits = calls.saturating_sub(self.last_calls) as f64;
        let samples = p.samples_total.saturating_sub(self.last_samples) as f64;
        self.last_calls = calls;
        self.last_samples = p.samples_total;
        let spent = hits * self.cost.hit_ns + samples * self.cost.sample_ns;
        self.spent_ns += spent;
        let Some(budget) = self.budget else {
            return;
        };
        // The target's own time in the interval: the wall time less the probes'.
        let wall_ns = (wall.as_nanos().max(1) as f64 - spent).max(wall.as_nanos() as f64 * 0.01);
        let allowed = budget * wall_ns - hits * self.cost.hit_ns;
        let sample_time = samples * self.cost.sample_ns;
        let old = self.quota;
        self.quota = if allowed <= 0.0 {
            1
        } else if sample_time <= 0.0 {
            (self.quota * 2).min(1 << 20)
        } else {
            // Samples scale with the quota as far as functions use it: aim at
            // 80 % of what is allowed, grow at most 4x a step.
            let f = (0.8 * allowed / sample_time).min(4.0);
            ((self.quota as f64 * f) as u64).clamp(1, 1 << 20)
        };
        if self.verbose {
            eprintln!(
                "weft: fperf: {:.0} ms: {} calls, {} samples, overhead ~{:.2}%; quota {old} -> {}",
                wall_ns / 1e6,
                hits,
                samples,
                spent / wall_ns * 100.0,
                self.quota
            );
        }
        let d = shm.map(ids.quota);
        if let Some(i) = weft_runtime::map::insert(shm, d, &[]).index() {
            let v = weft_runtime::map::plain_value_ptr(shm, d, i)
                as *const std::sync::atomic::AtomicU64;
            // SAFETY: a live plain entry's value: 8 bytes, 8-aligned, in the segment
            // mapped for the session's life; advice reads it with plain loads.
            unsafe { (*v).store(self.quota, Ordering::Relaxed) };
        }
        weft_runtime::map::zero(shm, shm.map(ids.used));
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
            Event::FunctionEntry { func, .. } => {
                self.samples_total += 1;
                self.stacks.entry((r.pid, r.tid)).or_default().push(Open {
                    func: *func,
                    start: r.nsecs,
                    children: 0,
                });
            }
            Event::FunctionExit { func, .. } => {
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
                let incl = r.nsecs.saturating_sub(o.start);
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

    fn finish(&mut self, maps: &[MapSnapshot], _cx: &SinkContext<'_>) {
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
        }
    }
}

/// A line of the report.
struct Row {
    name: String,
    calls: u64,
    samples: u64,
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
            "mean_inclusive": self.mean_incl,
            "min_inclusive": self.min_incl,
            "mean_exclusive": self.mean_excl,
            "total_inclusive": self.total_incl,
            "total_exclusive": self.total_excl,
            "relative_error": if self.error.is_finite() { Some(self.error) } else { None },
        })
    }
}

fn write_table(out: &mut dyn Write, rows: &[Row]) -> Result<()> {
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
            ns(r.mean_incl),
            ns(r.mean_excl),
            ns(r.total_incl),
            ns(r.total_excl),
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
        let e = parse_event("wal").unwrap_err().to_string();
        assert!(e.contains("did you mean `wall`"), "{e}");
    }

    #[test]
    fn the_program_compiles() {
        let text = program_text(Path::new("/bin/app"), &["f*".into()], 3).unwrap();
        assert!(text.starts_with("BEGIN { @fperf_quota = 3; }\n"));
        assert!(program_text(Path::new("/bin/app"), &["a b".into()], 3).is_err());
    }
}
