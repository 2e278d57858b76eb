//! `weft dump`: a record in the formats other tools open — Chrome trace event JSON
//! (`--chrome`: Perfetto UI, chrome://tracing) and folded stacks or an SVG flame
//! graph (`--flame`, the SVG drawn by the `inferno` crate), and OpenTelemetry
//! spans sent to a collector (`--otlp URL`, [`crate::export::spans`]).
//!
//! No native Perfetto protobuf (`--perfetto`): Perfetto UI opens the Chrome JSON
//! itself, and the protobuf would need Perfetto's `.proto` files compiled in (no
//! well-kept crate ships them).

use std::collections::{BTreeMap, HashMap};
use std::io::{self, BufWriter, Write};
use std::path::Path;

use anyhow::{Context, Result};
use weft_trace::calls::{self, Step};

use crate::args::DumpArgs;
use crate::replay_cmd::{open, walk};

/// Runs `weft dump`.
pub fn run(a: DumpArgs) -> Result<i32> {
    if let Some(url) = &a.otlp {
        let url = crate::export::spans::traces_url(url, "--otlp ")?;
        let s = crate::export::spans::send_record(&a.path, &url)?;
        eprintln!(
            "weft: sent {} spans to {url} in {} requests",
            s.sent, s.requests
        );
        return Ok(0);
    }
    let out: Box<dyn Write> = match &a.output {
        Some(p) => {
            Box::new(std::fs::File::create(p).with_context(|| format!("creating {}", p.display()))?)
        }
        None => Box::new(io::stdout().lock()),
    };
    let mut out = BufWriter::with_capacity(1 << 16, out);
    let svg = a.svg || a.output.as_deref().is_some_and(is_svg);
    let r = if a.chrome {
        chrome(&a.path, &mut out)
    } else {
        flame(&a.path, svg, &mut out)
    };
    let r = r.and_then(|()| out.flush().map_err(anyhow::Error::from));
    match r {
        Err(e)
            if e.downcast_ref::<io::Error>()
                .is_some_and(|e| e.kind() == io::ErrorKind::BrokenPipe) =>
        {
            Ok(0)
        }
        Err(e) => match &a.output {
            Some(p) if e.downcast_ref::<io::Error>().is_some() => {
                Err(e.context(format!("writing {}", p.display())))
            }
            _ => Err(e),
        },
        Ok(()) => Ok(0),
    }
}

fn is_svg(p: &Path) -> bool {
    p.extension().is_some_and(|e| e.eq_ignore_ascii_case("svg"))
}

/// Microseconds with the nanoseconds after the point, as Chrome's `ts` wants.
fn micros(ns: u64) -> String {
    format!("{}.{:03}", ns / 1000, ns % 1000)
}

/// A JSON string.
fn quote(s: &str) -> String {
    serde_json::to_string(s).expect("a string serializes")
}

/// Chrome trace event JSON: a `B` event at each entry and an `E` at each exit, in
/// time order (so monotonic per thread); a call still open when the record ends
/// gets its `E` at its thread's last time with `"unfinished": true` in its args.
/// Process and thread names come as `M` events at the end.
fn chrome(path: &Path, out: &mut impl Write) -> Result<()> {
    write!(out, "{{\"traceEvents\":[")?;
    let mut first = true;
    let mut failed: Option<io::Error> = None;
    let opened = open(path)?;
    let retval = opened.retval;
    let read = opened.walk(|s| {
        if failed.is_some() {
            return;
        }
        let (pid, tid) = s.thread();
        let name = quote(s.name());
        let line = match &s {
            Step::Entry { at, args, .. } => {
                let args = if args.is_empty() {
                    String::new()
                } else {
                    let a: Vec<String> = args.iter().map(|&v| calls::value(v)).collect();
                    format!(
                        ",\"args\":{{\"arguments\":{}}}",
                        quote(&format!("({})", a.join(", ")))
                    )
                };
                format!(
                    "{{\"ph\":\"B\",\"ts\":{},\"pid\":{pid},\"tid\":{tid},\"name\":{name}{args}}}",
                    micros(*at)
                )
            }
            Step::Exit { end, retval: r, .. } => {
                let args = match r {
                    None => ",\"args\":{\"unfinished\":true}".to_string(),
                    Some(v) if retval => {
                        format!(",\"args\":{{\"retval\":{}}}", quote(&calls::value(*v)))
                    }
                    Some(_) => String::new(),
                };
                format!(
                    "{{\"ph\":\"E\",\"ts\":{},\"pid\":{pid},\"tid\":{tid},\"name\":{name}{args}}}",
                    micros(*end)
                )
            }
        };
        let sep = if first { "\n" } else { ",\n" };
        first = false;
        if let Err(e) = write!(out, "{sep}{line}") {
            failed = Some(e);
        }
    })?;
    if let Some(e) = failed {
        return Err(e.into());
    }
    let w = &read.walker;
    let mut pids: Vec<u32> = w.order.iter().map(|t| t.0).collect();
    pids.sort();
    pids.dedup();
    let comm = |pid: u32| w.comms.get(&pid).cloned().unwrap_or_default();
    let mut meta = Vec::new();
    for pid in pids {
        meta.push(format!(
            "{{\"ph\":\"M\",\"ts\":0,\"pid\":{pid},\"name\":\"process_name\",\"args\":{{\"name\":{}}}}}",
            quote(format!("[{pid}] {}", comm(pid)).trim_end())
        ));
    }
    for &(pid, tid) in &w.order {
        meta.push(format!(
            "{{\"ph\":\"M\",\"ts\":0,\"pid\":{pid},\"tid\":{tid},\"name\":\"thread_name\",\"args\":{{\"name\":{}}}}}",
            quote(format!("[{tid}] {}", comm(pid)).trim_end())
        ));
    }
    for m in meta {
        let sep = if first { "\n" } else { ",\n" };
        first = false;
        write!(out, "{sep}{m}")?;
    }
    writeln!(
        out,
        "\n],\"displayTimeUnit\":\"ns\",\"otherData\":{{\"writer\":{},\"record\":{},\"unfinished_calls\":{},\"lost_events\":{}}}}}",
        quote(concat!("weft ", env!("CARGO_PKG_VERSION"))),
        quote(&read.file.display().to_string()),
        w.unfinished,
        w.lost
    )?;
    Ok(())
}

/// Folded stacks, one line per distinct stack (`main;parse;lex 1234`, the self
/// time in ns of the calls with that stack), sorted; or, with `svg`, the flame
/// graph inferno draws from them.
fn flame(path: &Path, svg: bool, out: &mut impl Write) -> Result<()> {
    let mut stacks: HashMap<Vec<usize>, u64> = HashMap::new();
    let read = walk(path, |s| {
        if let Step::Exit {
            callers,
            name,
            self_ns,
            ..
        } = s
        {
            let mut k = Vec::with_capacity(callers.len() + 1);
            k.extend_from_slice(callers);
            k.push(name);
            *stacks.entry(k).or_default() += self_ns;
        }
    })?;
    let names = &read.walker.names;
    let folded: BTreeMap<String, u64> = stacks
        .into_iter()
        .filter(|(_, ns)| *ns > 0)
        .map(|(k, ns)| {
            let path: Vec<&str> = k.iter().map(|&n| names[n].as_str()).collect();
            (path.join(";"), ns)
        })
        .collect();
    let lines: Vec<String> = folded.iter().map(|(k, ns)| format!("{k} {ns}")).collect();
    if !svg {
        for l in &lines {
            writeln!(out, "{l}")?;
        }
        return Ok(());
    }
    let mut opts = inferno::flamegraph::Options::default();
    opts.title = format!("weft record {}", read.file.display());
    opts.count_name = "ns".to_string();
    // Every stack is drawn, however short (inferno leaves out frames under 0.1
    // pixel by default): the SVG's size grows with the distinct stacks, not the
    // calls.
    opts.min_width = 0.0;
    inferno::flamegraph::from_lines(&mut opts, lines.iter().map(String::as_str), out)
        .map_err(|e| anyhow::anyhow!("drawing the flame graph: {e}"))?;
    Ok(())
}
