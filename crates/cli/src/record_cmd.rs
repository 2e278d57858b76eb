//! `weft record [-F PATTERN]... [--args N] [--retval] [-o FILE|DIR] (-c CMD | -p PID | -- CMD ARGS)`:
//! every entry and exit of the functions matching the patterns, per thread and
//! timestamped, written to a record file (docs/record-format.md) as uftrace's
//! `record` does; `weft replay`, `report` and `dump` read it. The session is `weft trace`'s, with a program written here: a
//! uprobe and a uretprobe per pattern, whose advice emits the function events.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};
use clap::Args;
use weft_engine::{segment, target};
use weft_trace::{Context as SinkContext, Event, MapSnapshot, Record, Sink};

use crate::printer::OutputFormat;
use crate::trace::{self, Target, TraceOptions};

#[derive(Args, Debug, Clone)]
pub struct RecordArgs {
    /// Functions to record: a wildcard pattern over the functions of the traced
    /// program (`parse_*`), or `BINARY:PATTERN` for a library's. Repeat it for
    /// several; every function of the program by default.
    #[arg(short = 'F', long = "functions", value_name = "PATTERN")]
    pub functions: Vec<String>,
    /// Record the first N integer arguments (0 to 6) of each call.
    #[arg(long = "args", value_name = "N", default_value_t = 0,
          value_parser = clap::value_parser!(u8).range(0..=6))]
    pub args: u8,
    /// Record each call's return value, shown by `weft replay` and `dump` (without
    /// it an exit is a 16-byte record with its time only).
    #[arg(short = 'r', long = "retval")]
    pub retval: bool,
    /// The record file to write; a directory (one that exists, or a path ending
    /// in `/`) holds it as `weft.rec`, as uftrace's `uftrace.data`.
    #[arg(short = 'o', value_name = "FILE|DIR", default_value = "weft.data/")]
    pub output: PathBuf,
    /// Launch this command (split like a shell would) and record it from its start.
    #[arg(short = 'c', value_name = "CMD")]
    pub command: Option<String>,
    /// Record this running process from now on; repeat it (or give a comma list)
    /// for several processes running the same program.
    #[arg(short = 'p', value_name = "PID", value_parser = clap::value_parser!(i32).range(1..),
          value_delimiter = ',')]
    pub pids: Vec<i32>,
    /// Children of the recorded processes join the recording.
    #[arg(long = "follow-fork")]
    pub follow_fork: bool,
    /// Most target threads recording at once (default 1024).
    #[arg(long = "max-threads", value_name = "N",
          value_parser = clap::value_parser!(u32).range(1..=65536))]
    pub max_threads: Option<u32>,
    /// No summary line at the end.
    #[arg(short = 'q')]
    pub quiet: bool,
    /// How each site was woven, pause times.
    #[arg(short = 'v')]
    pub verbose: bool,
    /// When the recording ends, send every recorded call as an OpenTelemetry span
    /// to this OTLP/HTTP collector (`otlp=http://127.0.0.1:4318`; the path
    /// defaults to /v1/traces). `weft dump --otlp URL` sends a record later.
    #[arg(long = "export", value_name = "otlp=URL")]
    pub export: Option<String>,
    /// The command to launch, after `--`.
    #[arg(last = true, value_name = "CMD")]
    pub cmd: Vec<String>,
}

/// Runs the subcommand: records until the command ends (or the processes do, or
/// SIGINT), then says what was recorded.
pub fn run(a: RecordArgs) -> Result<i32> {
    let target = match (&a.command, a.pids.is_empty(), a.cmd.is_empty()) {
        (Some(c), true, true) => Target::Launch(target::split_command(c)?),
        (None, false, true) => Target::Attach(a.pids.clone()),
        (None, true, false) => Target::Launch(a.cmd.clone()),
        (None, true, true) => bail!("record needs a target: -c CMD, -p PID or -- CMD ARGS"),
        _ => bail!("give only one of -c CMD, -p PID and -- CMD ARGS..."),
    };
    let program = traced_program(&target)?;
    let spans_url = match a.export.as_deref() {
        None => None,
        Some(e) => match e.split_once('=') {
            Some(("otlp", url)) => Some(crate::export::spans::traces_url(url, "--export otlp=")?),
            _ => bail!(
                "--export {e}: weft record exports its calls as spans to an OTLP collector: --export otlp=URL (e.g. otlp=http://127.0.0.1:4318)"
            ),
        },
    };
    let patterns = if a.functions.is_empty() {
        vec!["*".to_string()]
    } else {
        a.functions.clone()
    };
    let output = output_file(&a.output)?;
    let text = program_text(&program, &patterns, a.args, a.retval)?;
    let out = crate::front_end(&text, "weft record", &weft_lang::Options::default(), None)?;
    if !out.diagnostics.is_empty() {
        eprint!(
            "{}",
            weft_lang::render(&out.diagnostics, &text, "weft record")
        );
    }
    let Some(prog) = out.program else {
        return Ok(1);
    };
    let opts = TraceOptions {
        target,
        output: None,
        record: Some(output.clone()),
        // The clocks' offset turns the record's monotonic times into Unix times
        // (spans for a collector); the program names the service.
        record_note: Some(serde_json::json!({
            "args": a.args,
            "retval": a.retval,
            "program": program.display().to_string(),
            "realtime_offset_ns": crate::export::spans::realtime_offset_now(),
        })),
        format: OutputFormat::Text,
        quiet: true,
        verbose: a.verbose,
        unsafe_ok: false,
        no_warnings: false,
        // Rings of 8 MiB whose producers wait for weft when full: at 10^7 calls a
        // second (20 million events, 640 MB/s) one holds 13 ms, a few of weft's
        // drains (every millisecond, and at once again while events come) or a
        // scheduler tick of weft descheduled. Untouched, the memory is not used.
        sizes: segment::Sizes {
            max_threads: a
                .max_threads
                .unwrap_or(segment::Sizes::default().max_threads),
            ring_size: 8 << 20,
            lossless: true,
            ..segment::Sizes::default()
        },
        inline: true,
        all_or_nothing: false,
        data_mechanism: Default::default(),
        follow_fork: a.follow_fork,
        max_processes: 0,
        kernel_system: false,
        probe_filter: None,
        buffering: Default::default(),
        print: false,
    };
    let mut tally = Tally::default();
    let code = trace::run_with(&prog, &opts, &mut [&mut tally])?;
    if !a.quiet {
        eprintln!(
            "weft: recorded {} entries and {} exits of {} functions in {} threads to {}",
            tally.entries,
            tally.exits,
            tally.functions.len(),
            tally.threads.len(),
            output.display()
        );
    }
    if let Some(url) = spans_url {
        match crate::export::spans::send_record(&output, &url) {
            Ok(s) if !a.quiet => eprintln!(
                "weft: sent {} spans to {url} in {} requests",
                s.sent, s.requests
            ),
            Ok(_) => {}
            Err(e) => {
                eprintln!(
                    "weft: {e:#}; the record is kept in {}: send it again with `weft dump --otlp URL {}`",
                    output.display(),
                    output.display()
                );
                return Ok(if code == 0 { 1 } else { code });
            }
        }
    }
    Ok(code)
}

/// The file `-o PATH` names: PATH, or `PATH/weft.rec` when PATH is a directory
/// or ends in `/` (made if missing).
fn output_file(path: &Path) -> Result<PathBuf> {
    if path.is_dir() {
        return Ok(path.join("weft.rec"));
    }
    if path.as_os_str().as_encoded_bytes().ends_with(b"/") {
        std::fs::create_dir_all(path).with_context(|| format!("creating {}", path.display()))?;
        return Ok(path.join("weft.rec"));
    }
    Ok(path.to_path_buf())
}

/// The executable a target runs: the launched command's file, or a process's
/// (the file it mapped, even if replaced on disk since).
pub(crate) fn traced_program(target: &Target) -> Result<PathBuf> {
    Ok(match target {
        Target::Launch(argv) => target::which(&argv[0])
            .and_then(|p| p.canonicalize().ok())
            .ok_or_else(|| anyhow!("{}: command not found", argv[0]))?,
        // A program replaced on disk while it runs (an upgrade) still names its
        // path; weft reads the mapped file itself, not the new one.
        Target::Attach(pids) => {
            if let Some(name) = target::kernel_thread(pids[0]) {
                bail!(
                    "process {} ({name}) is a kernel thread: weft weaves into user-space programs",
                    pids[0]
                );
            }
            let exe = std::fs::read_link(format!("/proc/{}/exe", pids[0]))
                .with_context(|| format!("no process with pid {}", pids[0]))?;
            let s = exe.to_string_lossy();
            match s.strip_suffix(" (deleted)") {
                Some(p) => PathBuf::from(p),
                None => exe,
            }
        }
        Target::None => bail!("a target is needed: -c CMD, -p PID or -- CMD ARGS"),
    })
}

/// The program `weft record` runs: for each pattern, advice at the entry and the
/// return of every function it matches. Without arguments or return values each
/// event is a 16-byte record (`weft_abi::EVENT_FUNC_ENTRY_SHORT`).
fn program_text(program: &Path, patterns: &[String], args: u8, retval: bool) -> Result<String> {
    let mut text = String::new();
    let value = if retval { "retval" } else { "" };
    for p in patterns {
        let (binary, functions) = checked_pattern(p, program)?;
        text.push_str(&format!(
            "uprobe:{binary}:{functions} {{ __weft_entry({args}); }}\n\
             uretprobe:{binary}:{functions} {{ __weft_exit({value}); }}\n"
        ));
    }
    Ok(text)
}

/// A `-F` pattern split as [`split_pattern`] does, refused with a one-line error
/// when it is not a function pattern or its binary's path cannot go in a probe.
pub(crate) fn checked_pattern<'p>(p: &'p str, program: &Path) -> Result<(String, &'p str)> {
    let (binary, functions) = split_pattern(p, program);
    if functions.is_empty()
        || !functions
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_*?.$@".contains(&b))
    {
        bail!("-F {p}: not a function pattern (names, with * and ? as wildcards)");
    }
    if binary.contains(|c: char| c.is_whitespace() || "{}\"".contains(c)) {
        bail!("-F {p}: the binary's path cannot hold spaces, braces or quotes");
    }
    Ok((binary, functions))
}

/// `BINARY:PATTERN` or a pattern over `program`'s functions. A `::` (a C++
/// scope) does not separate a binary.
fn split_pattern<'p>(p: &'p str, program: &Path) -> (String, &'p str) {
    match p.split_once(':') {
        Some((bin, rest)) if !bin.is_empty() && !rest.starts_with(':') => (bin.to_string(), rest),
        _ => (program.display().to_string(), p),
    }
}

/// Counts what was recorded, for the closing line.
#[derive(Default)]
struct Tally {
    entries: u64,
    exits: u64,
    functions: HashSet<(u32, u64)>,
    threads: HashSet<(u32, u32)>,
    /// Sites' functions, by id.
    sites: Vec<u64>,
}

impl Sink for Tally {
    fn record(&mut self, r: &Record, _cx: &SinkContext<'_>) {
        match &r.event {
            Event::FunctionEntry { func, .. } => {
                self.entries += 1;
                self.functions.insert((r.pid, *func));
                self.threads.insert((r.pid, r.tid));
            }
            Event::FunctionExit { .. } => self.exits += 1,
            Event::Site { id, func, .. } => {
                let i = *id as usize;
                if self.sites.len() <= i {
                    self.sites.resize(i + 1, 0);
                }
                self.sites[i] = *func;
            }
            Event::Functions {
                entries,
                exits,
                new_sites,
                ..
            } => {
                self.threads.insert((r.pid, r.tid));
                self.entries += entries;
                self.exits += exits;
                for &id in new_sites {
                    if let Some(&func) = self.sites.get(id as usize) {
                        self.functions.insert((r.pid, func));
                    }
                }
            }
            _ => {}
        }
    }
    fn finish(&mut self, _maps: &[MapSnapshot], _cx: &SinkContext<'_>) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_directory_holds_the_record_as_weft_rec() {
        let base = std::env::temp_dir().join(format!("weft-record-out-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        std::fs::create_dir_all(&base).unwrap();
        // A directory that exists, with or without the slash.
        assert_eq!(output_file(&base).unwrap(), base.join("weft.rec"));
        // A path ending in `/` is made.
        let new = base.join("a/b/");
        assert_eq!(output_file(&new).unwrap(), base.join("a/b/weft.rec"));
        assert!(base.join("a/b").is_dir());
        // Anything else is the file.
        let file = base.join("x.rec");
        assert_eq!(output_file(&file).unwrap(), file);
        std::fs::remove_dir_all(&base).unwrap();
    }

    #[test]
    fn patterns_name_a_binary_or_the_program() {
        let prog = Path::new("/bin/app");
        assert_eq!(
            split_pattern("parse_*", prog),
            ("/bin/app".to_string(), "parse_*")
        );
        assert_eq!(
            split_pattern("/lib/libz.so.1:inflate*", prog),
            ("/lib/libz.so.1".to_string(), "inflate*")
        );
        assert_eq!(
            split_pattern("ns::run", prog),
            ("/bin/app".to_string(), "ns::run")
        );
    }

    #[test]
    fn the_program_has_an_entry_and_a_return_probe_per_pattern() {
        let text =
            program_text(Path::new("/bin/app"), &["a*".into(), "b".into()], 2, false).unwrap();
        assert_eq!(
            text,
            "uprobe:/bin/app:a* { __weft_entry(2); }\n\
             uretprobe:/bin/app:a* { __weft_exit(); }\n\
             uprobe:/bin/app:b { __weft_entry(2); }\n\
             uretprobe:/bin/app:b { __weft_exit(); }\n"
        );
        let text = program_text(Path::new("/bin/app"), &["c".into()], 0, true).unwrap();
        assert_eq!(
            text,
            "uprobe:/bin/app:c { __weft_entry(0); }\n\
             uretprobe:/bin/app:c { __weft_exit(retval); }\n"
        );
        assert!(program_text(Path::new("/bin/app"), &["a b".into()], 0, false).is_err());
        assert!(program_text(Path::new("/bin/app"), &["".into()], 0, false).is_err());
    }
}
