//! The command line. `weft -e PROGRAM -c CMD` works without a subcommand, as with
//! bpftrace.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(
    name = "weft",
    version,
    about = "Weave probes into running programs and take them out again",
    args_conflicts_with_subcommands = true
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    #[command(flatten)]
    pub trace: TraceArgs,
}

// Parsed once per run: the size of a variant does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run a program of probes against a launched command or a running process.
    Trace(TraceArgs),
    /// List the functions that can be probed (`uprobe:BIN:FUNC` lines).
    List(ListArgs),
    /// Record every entry and exit of functions (per thread, timestamped, with
    /// arguments and return values) to a record file, as `uftrace record` does.
    Record(crate::record_cmd::RecordArgs),
    /// Profile every function (calls, inclusive and exclusive time per call) with
    /// the probes' overhead held under a budget (FPerf).
    Fperf(crate::fperf_cmd::FperfArgs),
    /// Print a record's calls as trees with their durations, per thread, as
    /// `uftrace replay` does.
    Replay(ReplayArgs),
    /// Per-function totals of a record: calls, total and self time, average,
    /// minimum, maximum (`uftrace report`).
    Report(ReportArgs),
    /// Export a record: Chrome trace event JSON (`--chrome`, for Perfetto UI and
    /// chrome://tracing), folded stacks or an SVG flame graph (`--flame`).
    Dump(DumpArgs),
    /// Turn the -finstrument-functions calls of a binary into NOP placeholders and
    /// record the probe list in it (iProbe's ColdPatch).
    Coldpatch(crate::coldpatch_cmd::ColdpatchArgs),
    /// Rewrite a binary built with no instrumentation flag so that each function's
    /// entry jumps to a stub with a NOP placeholder (iProbe's static rewriting mode).
    Prepare(crate::prepare_cmd::PrepareArgs),
    /// Reads and writes per heap object and per allocation site: `weft memprof --
    /// ./app` (a binary built with `weft memprof --cflags`), or `--sampled` for any
    /// dynamically linked binary.
    Memprof(crate::memprof_cmd::MemprofArgs),
    /// Run a SystemTap script (`.stp`) on weft's engine: no kernel module, no
    /// Dyninst (the SystemTap-sans-kernel seed).
    Stap(StapArgs),
    /// Build the bundled demo program and weave into it.
    Demo {
        /// Requests the demo program handles.
        #[arg(default_value_t = 2000)]
        requests: u32,
    },
}

/// A process id: positive (0 and negative numbers name process groups, or every
/// process, to kill(2)).
/// One `-p` value: `PID[,PID...]`, or `GROUP=PID[,PID...]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PidList {
    pub group: Option<String>,
    pub pids: Vec<i32>,
}

fn parse_pid_list(s: &str) -> Result<PidList, String> {
    let (group, list) = match s.split_once('=') {
        Some((g, l)) => {
            let ok = g.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
                && g.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
            if !ok {
                return Err(format!("`{g}` is not a group name (GROUP=PID,...)"));
            }
            (Some(g.to_string()), l)
        }
        None => (None, s),
    };
    let pids = list
        .split(',')
        .map(|p| match p.trim().parse::<i32>() {
            Ok(n) if n >= 1 => Ok(n),
            _ => Err(format!("`{p}` is not a process id (1 or more)")),
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(PidList { group, pids })
}

impl TraceArgs {
    /// Every `-p` process, in order.
    pub fn pids(&self) -> Vec<i32> {
        self.pid_lists
            .iter()
            .flat_map(|l| l.pids.iter().copied())
            .collect()
    }

    /// Groups named with `-p GROUP=PID,...`.
    pub fn groups(&self) -> Vec<(String, Vec<i32>)> {
        let mut out: Vec<(String, Vec<i32>)> = Vec::new();
        for l in &self.pid_lists {
            let Some(g) = &l.group else { continue };
            match out.iter_mut().find(|(n, _)| n == g) {
                Some((_, p)) => p.extend(&l.pids),
                None => out.push((g.clone(), l.pids.clone())),
            }
        }
        out
    }
}

fn pid_parser() -> clap::builder::RangedI64ValueParser<i32> {
    clap::value_parser!(i32).range(1..)
}

/// `weft stap SCRIPT.stp [-x PID | -c CMD] [-e SCRIPT] [-v]`, stap's own flags.
#[derive(Args, Debug, Clone)]
pub struct StapArgs {
    /// The script text (instead of a script file).
    #[arg(short = 'e', value_name = "SCRIPT")]
    pub script: Option<String>,
    /// Run this command (its pid is `target()`) and trace it from its start.
    #[arg(short = 'c', value_name = "CMD")]
    pub command: Option<String>,
    /// Attach to this running process (its pid is `target()`).
    #[arg(short = 'x', value_name = "PID", value_parser = pid_parser())]
    pub pid: Option<i32>,
    /// Say what weft does (attach points, timing).
    #[arg(short = 'v', action = clap::ArgAction::Count)]
    pub verbose: u8,
    /// Write the output to this file.
    #[arg(short = 'o', value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// Check and translate the script, run nothing.
    #[arg(long = "dry-run")]
    pub dry_run: bool,
    /// Dump a stage (`ast` is the translated script).
    #[arg(short = 'd', value_name = "STAGE")]
    pub dump: Vec<String>,
    /// The script file, then its arguments.
    #[arg(value_name = "SCRIPT_OR_ARGS")]
    pub args: Vec<String>,
}

#[derive(Args, Debug, Clone)]
pub struct TraceArgs {
    /// The program is SystemTap's language (`weft stap`, or a `.stp` file).
    #[arg(skip)]
    pub stap: bool,
    /// The program text (instead of a program file).
    #[arg(short = 'e', value_name = "PROGRAM")]
    pub program: Option<String>,
    /// Launch this command (split like a shell would) and trace it from its start.
    #[arg(short = 'c', long = "cmd", value_name = "CMD")]
    pub command: Option<String>,
    /// Attach to this running process; repeat it (or give a comma list) to weave the
    /// same program into several processes. `NAME=PID,...` also makes them the
    /// members of group NAME (`@NAME uprobe:...`, `ingroup(NAME)`).
    #[arg(short = 'p', long = "pid", value_name = "[GROUP=]PID", value_parser = parse_pid_list)]
    pub pid_lists: Vec<PidList>,
    /// With several processes: refuse the whole session if any of them cannot be
    /// attached to (by default the others are woven and that one is reported).
    #[arg(long = "all-or-nothing")]
    pub all_or_nothing: bool,
    /// Children the traced processes fork join the session, woven (their calls are
    /// counted with the parent's); with -c, programs they exec join too, the probes
    /// resolved against the new image.
    #[arg(long = "follow-fork")]
    pub follow_fork: bool,
    /// Without -p and -c the probes apply system-wide: to every process that maps a
    /// probed file, now and as it starts. Refuse the session if more than N
    /// processes map them when weft starts (each is attached to: its agent loaded,
    /// its threads paused a few milliseconds).
    #[arg(long = "max-processes", value_name = "N", default_value_t = 100)]
    pub max_processes: usize,
    /// Kernel probes (tracepoint:) run for every process. By default, with -p or
    /// -c, the kernel runs them only for the traced processes and the processes they
    /// start (others pay one map lookup per event); without -p and -c, for every
    /// process.
    #[arg(long = "system")]
    pub system: bool,
    /// Add DIR to the directories `#include` looks in (after the script's own
    /// directory for `#include "..."`, before the system's), as bpftrace's -I.
    #[arg(short = 'I', value_name = "DIR")]
    pub include_dirs: Vec<PathBuf>,
    /// Look for the separate debug info of stripped binaries in DIR too (before
    /// /usr/lib/debug): DIR/.build-id/xx/rest.debug by build-id, and the file's
    /// path under DIR with its .gnu_debuglink name (or FILE.debug), as gdb's
    /// debug-file-directory and bpftrace's --debuginfo.
    #[arg(long = "debuginfo", value_name = "DIR")]
    pub debuginfo: Vec<PathBuf>,
    /// Include the C header FILE before the program (its structs, unions, enums,
    /// typedefs and integer #defines), as bpftrace's --include.
    #[arg(long = "include", value_name = "FILE")]
    pub include_files: Vec<String>,
    /// Write output to FILE instead of stdout.
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// Output buffering (terminal and file), as bpftrace's -B: line (the default:
    /// written at each newline), full (when the buffer fills, and at the end) or none
    /// (at each write).
    #[arg(short = 'B', value_name = "MODE", value_parser = ["line", "full", "none"])]
    pub buffering: Option<String>,
    /// Output format: text (default) or json.
    #[arg(short = 'f', value_name = "FORMAT")]
    pub format: Option<String>,
    /// Also write every record to FILE, in weft's record format
    /// (docs/record-format.md), for other tools.
    #[arg(long = "record", value_name = "FILE")]
    pub record: Option<PathBuf>,
    /// Export the maps while the session runs: `prometheus=ADDR` serves them on
    /// http://ADDR/metrics (e.g. prometheus=127.0.0.1:9464; port 0 picks one, said
    /// on stderr); `otlp=URL` pushes them as OpenTelemetry metrics over OTLP/HTTP
    /// (e.g. otlp=http://127.0.0.1:4318/v1/metrics) every --export-interval and at
    /// the end. Repeat it for both.
    #[arg(long = "export", value_name = "KIND=WHERE")]
    pub export: Vec<String>,
    /// How often `--export otlp=URL` pushes: seconds, or with a unit (500ms, 10s).
    #[arg(
        long = "export-interval",
        value_name = "DURATION",
        default_value = "10"
    )]
    pub export_interval: String,
    /// Quiet: no "Attached N probes" line.
    #[arg(short = 'q', long = "quiet")]
    pub quiet: bool,
    /// Verbose: how each site was woven, pause times.
    #[arg(short = 'v', long = "verbose")]
    pub verbose: bool,
    /// Dump the program after a stage: ast, expanded, checked or program (also
    /// named parse, expand, check, lower), on stderr.
    #[arg(short = 'd', long = "debug", value_name = "STAGE")]
    pub dump: Vec<String>,
    /// Warn, where it happens, when a map read finds no element or `delete` has
    /// nothing to delete (bpftrace's `-k`, in its words); weft always counts failed
    /// reads of memory and reports them at the end.
    #[arg(short = 'k', long = "warnings", action = clap::ArgAction::Count)]
    pub warnings: u8,
    /// Run only the probes whose name (`uprobe:./app:parse`, `BEGIN`, ...) matches
    /// this regular expression.
    #[arg(long = "probe-filter", value_name = "REGEX")]
    pub probe_filter: Option<String>,
    /// Accepted for bpftrace's command lines: weft raises a USDT probe's semaphore in
    /// every process it weaves, and with neither -p nor -c that is every process that
    /// maps the file, which is what this asks of bpftrace.
    #[arg(long = "usdt-file-activation")]
    pub usdt_file_activation: bool,
    /// Accepted for bpftrace's command lines: bpftrace's kernel features
    /// (uprobe_multi, kprobe_multi, kprobe_session) are not used by weft.
    #[arg(long = "no-feature", value_name = "FEATURE,...")]
    pub no_feature: Option<String>,
    /// Do not print warnings (errors still print).
    #[arg(long = "no-warnings")]
    pub no_warnings: bool,
    /// Check the program (parse, types, lowering) and exit without running it or
    /// touching any process.
    #[arg(long = "dry-run")]
    pub dry_run: bool,
    /// What this weft supports and the system it runs on, then exit.
    #[arg(long = "info")]
    pub info: bool,
    /// Allow advice that changes what the program does: `around` advice (it may
    /// skip or replace a call), override() of a return value, `new = EXPR` in a
    /// set: advice (it changes the value the program writes: the only advice that
    /// writes the target's memory), signal() to the target, and system().
    #[arg(long = "unsafe")]
    pub unsafe_ok: bool,
    /// Most target threads running advice at once (default 1024). Threads that
    /// exit give their slot back; hits on threads beyond the limit run no advice and
    /// are counted.
    #[arg(long = "max-threads", value_name = "N", value_parser = clap::value_parser!(u32).range(1..=65536))]
    pub max_threads: Option<u32>,
    /// How data pointcuts (`set:`, `get:`, `watchpoint:`) catch accesses: `auto`
    /// (the default: a hardware watchpoint when one can take the bytes, at most 4,
    /// else page protection), `hw` (hardware watchpoints only), `page` (page
    /// protection: any size, any number) or `rewrite` (also `direct`: the
    /// instructions that name the variable jump to a trampoline; exact and fastest
    /// for those, blind to accesses through pointers; never chosen by `auto`).
    #[arg(long = "data-mechanism", value_name = "MECHANISM")]
    pub data_mechanism: Option<String>,
    /// Always use the general trampoline (for comparisons and debugging).
    #[arg(long = "no-inline", hide = true)]
    pub no_inline: bool,
    /// List the probes matching the pattern given as the first argument (as
    /// `weft list`; with -v, the arguments' types from DWARF).
    #[arg(short = 'l', long = "list")]
    pub list: bool,
    /// Program file, then positional parameters ($1, $2, ...).
    #[arg(value_name = "FILE_OR_ARGS")]
    pub args: Vec<String>,
    /// Program parameters after `--`, as bpftrace takes them: `--NAME` and
    /// `--NAME=VALUE` are named parameters (`getopt("NAME", default)`), the others
    /// positional ones after those before `--`.
    #[arg(last = true, value_name = "PARAMS")]
    pub program_params: Vec<String>,
}

impl TraceArgs {
    /// The parameters after `--`: (positional, named).
    #[allow(clippy::type_complexity)]
    pub fn split_program_params(&self) -> (Vec<String>, Vec<(String, Option<String>)>) {
        split_program_params(&self.program_params)
    }
}

/// Split the parameters after `--`: `--NAME[=VALUE]` is named, anything else (`-x`,
/// `--`, `--=v` too) positional.
#[allow(clippy::type_complexity)]
pub fn split_program_params(params: &[String]) -> (Vec<String>, Vec<(String, Option<String>)>) {
    let mut positional = Vec::new();
    let mut named = Vec::new();
    for p in params {
        match p.strip_prefix("--") {
            Some(rest) if !rest.is_empty() && !rest.starts_with('=') => {
                match rest.split_once('=') {
                    Some((n, v)) => named.push((n.to_string(), Some(v.to_string()))),
                    None => named.push((rest.to_string(), None)),
                }
            }
            _ => positional.push(p.clone()),
        }
    }
    (positional, named)
}

#[derive(Args, Debug, Clone)]
pub struct ListArgs {
    /// `[PATTERN] [BINARY]`: a probe pattern (`uprobe:BIN:FUNC`, `uretprobe:…`,
    /// `usdt:BIN:[PROVIDER:]NAME`, wildcards anywhere; BIN a path or a library name)
    /// or a bare function pattern, and/or the binary to list. One argument that names
    /// a file is the binary.
    #[arg(value_name = "PATTERN_OR_BINARY", num_args = 0..=2)]
    pub args: Vec<String>,
    /// The binary whose probes a bare pattern lists.
    #[arg(long = "binary", short = 'b', value_name = "BINARY")]
    pub binary: Option<String>,
    /// List the probes of a running process: its program and its libraries.
    #[arg(short = 'p', value_name = "PID", value_parser = pid_parser())]
    pub pid: Option<i32>,
    /// Also show each function's arguments and their types, from DWARF.
    #[arg(short = 'v')]
    pub verbose: bool,
}

impl ListArgs {
    /// `(pattern, binary)` from the positional arguments and `--binary`.
    pub fn split(&self) -> (Option<String>, Option<String>) {
        let (p, b) = match self.args.as_slice() {
            [] => (None, None),
            [one]
                if self.pid.is_none()
                    && self.binary.is_none()
                    && !one.contains(':')
                    && std::path::Path::new(one).is_file() =>
            {
                (None, Some(one.clone()))
            }
            [one] => (Some(one.clone()), None),
            [p, b, ..] => (Some(p.clone()), Some(b.clone())),
        };
        (p, b.or_else(|| self.binary.clone()))
    }
}

/// The record `weft record` wrote: a record file, or the directory holding it
/// as `weft.rec`.
const RECORD_HELP: &str = "The record: a file, or a directory holding weft.rec";

/// `weft replay`.
#[derive(Args, Debug, Clone)]
pub struct ReplayArgs {
    #[arg(value_name = "PATH", default_value = "weft.data", help = RECORD_HELP)]
    pub path: PathBuf,
    /// Show calls at most N deep (1: each thread's outermost calls).
    #[arg(short = 'D', long = "depth", value_name = "N",
          value_parser = clap::value_parser!(u32).range(1..))]
    pub depth: Option<u32>,
    /// Only these threads (repeat it, or a comma list).
    #[arg(long = "tid", value_name = "TID", value_delimiter = ',')]
    pub tids: Vec<u32>,
    /// Only the calls of functions matching FUNC (a wildcard pattern), with their
    /// callees; repeat it for several.
    #[arg(short = 'F', long = "filter", value_name = "FUNC")]
    pub filter: Vec<String>,
    /// Hide the calls of functions matching FUNC, with their callees.
    #[arg(short = 'N', long = "notrace", value_name = "FUNC")]
    pub notrace: Vec<String>,
    /// Hide calls shorter than DUR (`500ns`, `1us`, `2ms`, `1s`, `1m`, `1h`; ns
    /// without a unit).
    #[arg(short = 't', long = "time-filter", value_name = "DUR",
          value_parser = parse_duration)]
    pub time_filter: Option<u64>,
}

/// `weft report`.
#[derive(Args, Debug, Clone)]
pub struct ReportArgs {
    #[arg(value_name = "PATH", default_value = "weft.data", help = RECORD_HELP)]
    pub path: PathBuf,
    /// The column to sort by (largest first; names in order).
    #[arg(short = 's', long = "sort", value_name = "KEY", value_enum, default_value_t = SortKey::Total)]
    pub sort: SortKey,
    /// Only these threads (repeat it, or a comma list).
    #[arg(long = "tid", value_name = "TID", value_delimiter = ',')]
    pub tids: Vec<u32>,
}

/// What `weft report` sorts by.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum SortKey {
    Total,
    #[value(name = "self")]
    SelfTime,
    Calls,
    Avg,
    Min,
    Max,
    Name,
}

/// `weft dump`.
#[derive(Args, Debug, Clone)]
#[command(group(clap::ArgGroup::new("format").required(true).args(["chrome", "flame", "otlp"])))]
pub struct DumpArgs {
    #[arg(value_name = "PATH", default_value = "weft.data", help = RECORD_HELP)]
    pub path: PathBuf,
    /// Chrome trace event JSON (opens in Perfetto UI and chrome://tracing).
    #[arg(long = "chrome")]
    pub chrome: bool,
    /// Folded stacks (`main;parse;lex 1234`, self time in ns), for flame graphs.
    #[arg(long = "flame")]
    pub flame: bool,
    /// With --flame: an SVG flame graph instead (also when -o ends in .svg).
    #[arg(long = "svg", requires = "flame")]
    pub svg: bool,
    /// Send every call to an OTLP/HTTP collector as an OpenTelemetry span
    /// (`http://127.0.0.1:4318`; the path defaults to /v1/traces).
    #[arg(long = "otlp", value_name = "URL", conflicts_with = "output")]
    pub otlp: Option<String>,
    /// Write to FILE instead of the standard output.
    #[arg(short = 'o', value_name = "FILE")]
    pub output: Option<PathBuf>,
}

/// A duration: a number with `ns`, `us`, `ms`, `s`, `m` or `h` after it (ns
/// without).
pub fn parse_duration(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let digits = t
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(digits);
    let scale = match unit.trim() {
        "" | "ns" => 1.0,
        "us" => 1e3,
        "ms" => 1e6,
        "s" | "sec" => 1e9,
        "m" | "min" => 60e9,
        "h" => 3600e9,
        _ => {
            return Err(format!(
                "`{s}`: not a duration (a number and ns, us, ms, s, m or h)"
            ))
        }
    };
    let v: f64 = num
        .parse()
        .map_err(|_| format!("`{s}`: not a duration (a number and ns, us, ms, s, m or h)"))?;
    Ok((v * scale).round() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pid(args: &[&str]) -> Result<Option<i32>, String> {
        let cli = Cli::try_parse_from(args).map_err(|e| e.kind().to_string())?;
        Ok(match cli.command {
            Some(Command::Trace(t)) => t.pids().first().copied(),
            Some(Command::List(l)) => l.pid,
            _ => cli.trace.pids().first().copied(),
        })
    }

    fn pids(args: &[&str]) -> Vec<i32> {
        Cli::try_parse_from(args).unwrap().trace.pids()
    }

    /// As upstream's man page: `-e '...' p1 -- --aa=20 --bb p2` gives `$1 = p1`,
    /// `$2 = p2`, `aa = 20`, `bb` set.
    #[test]
    fn program_params_after_dashes() {
        let cli = Cli::try_parse_from([
            "weft", "-e", "BEGIN {}", "p1", "--", "--aa=20", "--bb", "p2", "-x", "--c=",
        ])
        .unwrap();
        assert_eq!(cli.trace.args, ["p1"]);
        let (pos, named) = cli.trace.split_program_params();
        assert_eq!(pos, ["p2", "-x"]);
        assert_eq!(
            named,
            [
                ("aa".to_string(), Some("20".to_string())),
                ("bb".to_string(), None),
                ("c".to_string(), Some(String::new())),
            ]
        );
    }

    #[test]
    fn several_pids_repeated_or_in_a_list() {
        assert_eq!(
            pids(&["weft", "-e", "BEGIN {}", "-p", "4", "-p", "7"]),
            [4, 7]
        );
        assert_eq!(pids(&["weft", "-e", "BEGIN {}", "-p", "4,7,9"]), [4, 7, 9]);
        assert!(Cli::try_parse_from(["weft", "-e", "BEGIN {}", "-p", "4,0"]).is_err());
    }

    /// A process id is positive (issue 24): 0 and negative numbers name process groups
    /// or every process to kill(2), and ptrace fails on them at best.
    #[test]
    fn pids_are_positive() {
        assert_eq!(pid(&["weft", "-e", "BEGIN {}", "-p", "42"]), Ok(Some(42)));
        assert_eq!(pid(&["weft", "list", "-p", "42"]), Ok(Some(42)));
        for p in ["-p=0", "-p=-1", "-p=-4242"] {
            for args in [
                &["weft", "-e", "BEGIN {}", p][..],
                &["weft", "trace", "-e", "BEGIN {}", p],
                &["weft", "list", "malloc", p],
                &["weft", "-l", "uprobe:*", p],
                &["weft", "-lv", "uprobe:*", p],
            ] {
                assert!(pid(args).is_err(), "{args:?} accepted");
            }
        }
    }

    #[test]
    fn durations_take_a_unit() {
        assert_eq!(parse_duration("1us"), Ok(1_000));
        assert_eq!(parse_duration("1.5ms"), Ok(1_500_000));
        assert_eq!(parse_duration("250"), Ok(250));
        assert_eq!(parse_duration("2s"), Ok(2_000_000_000));
        assert!(parse_duration("1 fortnight").is_err());
        assert!(parse_duration("us").is_err());
    }
}
