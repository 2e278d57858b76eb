//! `weft replay` and `weft report`: a record's calls as uftrace prints them — each
//! thread's call trees with durations, and per-function totals. The calls are
//! `weft_trace::calls`'s; this is reading the file and the text.

use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use weft_symbols::glob::Glob;
use weft_trace::calls::{self, Call, Filter, Step, Totals, Tree, Walker};
use weft_trace::record::{Frame, ReadError, Reader};

use crate::args::{ReplayArgs, ReportArgs, SortKey};

/// The record file at `path`: the file itself, or `weft.rec` in the directory.
pub fn record_file(path: &Path) -> PathBuf {
    if path.is_dir() {
        path.join("weft.rec")
    } else {
        path.to_path_buf()
    }
}

/// What a record says about itself (its metadata) and what the walk found.
pub struct Read {
    pub file: PathBuf,
    pub walker: Walker,
    /// `weft record --retval`: the exits' values are return values worth showing.
    pub retval: bool,
}

/// A record file, open, its header read.
pub struct Opened {
    pub file: PathBuf,
    reader: Reader<io::BufReader<std::fs::File>>,
    /// `weft record --retval`: the exits' values are return values worth showing.
    pub retval: bool,
}

/// Opens the record at `path` (a file, or a directory holding `weft.rec`).
pub fn open(path: &Path) -> Result<Opened> {
    let file = record_file(path);
    let f = std::fs::File::open(&file).with_context(|| format!("reading {}", file.display()))?;
    let reader = Reader::new(io::BufReader::with_capacity(1 << 16, f))
        .map_err(|e| anyhow::anyhow!("{}: {e}", file.display()))?;
    let retval = reader.metadata["record"]["retval"]
        .as_bool()
        .unwrap_or(false);
    Ok(Opened {
        file,
        reader,
        retval,
    })
}

impl Opened {
    /// The record's metadata (docs/record-format.md).
    pub fn metadata(&self) -> &serde_json::Value {
        &self.reader.metadata
    }

    /// Reads the frames, giving each call's entry and exit to `each`. A corrupt
    /// frame is an error naming the file and its offset; a last frame cut short
    /// (weft was stopped while writing it) is a warning, and the frames before it
    /// are used.
    pub fn walk(mut self, mut each: impl FnMut(Step<'_>)) -> Result<Read> {
        let mut walker = Walker::new();
        loop {
            match self.reader.next_frame() {
                Ok(Some(Frame::Record(rec))) => walker.feed(&rec, &mut each),
                Ok(Some(_)) => {}
                Ok(None) => break,
                Err(e @ ReadError::Truncated { .. }) => {
                    eprintln!(
                        "weft: warning: {}: {e}; the frames before it are used",
                        self.file.display()
                    );
                    break;
                }
                Err(e) => bail!("{}: {e}", self.file.display()),
            }
        }
        walker.finish(&mut each);
        if walker.lost > 0 {
            eprintln!(
                "weft: warning: {}: {} events were lost while recording (the agent's buffers were full): some calls are missing or cut short",
                self.file.display(),
                walker.lost
            );
        }
        Ok(Read {
            file: self.file,
            walker,
            retval: self.retval,
        })
    }
}

/// [`open`], then [`Opened::walk`].
pub fn walk(path: &Path, each: impl FnMut(Step<'_>)) -> Result<Read> {
    open(path)?.walk(each)
}

/// A wildcard filter over function names, from `-F`/`-N` patterns.
fn matcher(patterns: &[String]) -> Option<impl Fn(&str) -> bool> {
    let globs: Vec<Glob> = patterns.iter().map(|p| Glob::new(p)).collect();
    let any = move |name: &str| globs.iter().any(|g| g.matches(name));
    (!patterns.is_empty()).then_some(any)
}

/// Runs `weft replay`.
pub fn replay(a: ReplayArgs) -> Result<i32> {
    let mut tree = Tree::new();
    let read = walk(&a.path, |s| tree.step(s))?;
    let only = matcher(&a.filter);
    let hide = matcher(&a.notrace);
    let filter = Filter {
        depth: a.depth.map(|d| d as usize),
        only: only.as_ref().map(|f| f as &dyn Fn(&str) -> bool),
        hide: hide.as_ref().map(|f| f as &dyn Fn(&str) -> bool),
        min_duration: a.time_filter.unwrap_or(0),
    };
    let mut out = BufWriter::new(io::stdout().lock());
    let r = (|| -> io::Result<()> {
        writeln!(out, "# DURATION     TID     FUNCTION")?;
        for t in tree.threads() {
            if !a.tids.is_empty() && !a.tids.contains(&t.tid) {
                continue;
            }
            let p = Printer {
                names: &read.walker.names,
                filter: &filter,
                retval: read.retval,
                tid: t.tid,
            };
            for c in filter.roots(&t.calls, &read.walker.names) {
                p.call(&mut out, c, 0)?;
            }
        }
        out.flush()
    })();
    quiet_pipe(r)
}

/// A closed pipe (`weft replay | head`) ends the output without an error.
fn quiet_pipe(r: io::Result<()>) -> Result<i32> {
    match r {
        Ok(()) => Ok(0),
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => Ok(0),
        Err(e) => Err(e.into()),
    }
}

/// Prints calls as `uftrace replay` does.
struct Printer<'a> {
    names: &'a [String],
    filter: &'a Filter<'a>,
    retval: bool,
    tid: u32,
}

impl Printer<'_> {
    fn call(&self, out: &mut impl Write, c: &Call, depth: usize) -> io::Result<()> {
        let name = &self.names[c.name];
        let indent = "  ".repeat(depth);
        let args: Vec<String> = c.args.iter().map(|&v| calls::value(v)).collect();
        let args = args.join(", ");
        let ret = match (self.retval, c.retval) {
            (true, Some(v)) => format!(" = {}", calls::value(v)),
            _ => String::new(),
        };
        let dur = calls::duration(c.duration());
        let tid = self.tid;
        let unfinished = c.retval.is_none();
        let children = self.filter.children(c, depth, self.names);
        if children.is_empty() {
            let note = if unfinished { " /* unfinished */" } else { "" };
            return writeln!(
                out,
                " {dur} [{tid:>6}] | {indent}{name}({args}){ret};{note}"
            );
        }
        writeln!(out, "{:12}[{tid:>6}] | {indent}{name}({args}) {{", "")?;
        for k in children {
            self.call(out, k, depth + 1)?;
        }
        let note = if unfinished { ", unfinished" } else { "" };
        let semi = if ret.is_empty() { "" } else { ";" };
        writeln!(
            out,
            " {dur} [{tid:>6}] | {indent}}}{ret}{semi} /* {name}{note} */"
        )
    }
}

/// Runs `weft report`.
pub fn report(a: ReportArgs) -> Result<i32> {
    let mut totals = Totals::new();
    let read = walk(&a.path, |s| {
        if a.tids.is_empty() || a.tids.contains(&s.thread().1) {
            totals.step(&s);
        }
    })?;
    let names = &read.walker.names;
    let mut rows: Vec<_> = totals.functions.iter().collect();
    rows.sort_by(|(na, x), (nb, y)| {
        let by = match a.sort {
            SortKey::Total => y.total.cmp(&x.total),
            SortKey::SelfTime => y.self_ns.cmp(&x.self_ns),
            SortKey::Calls => y.calls.cmp(&x.calls),
            SortKey::Avg => y.avg().cmp(&x.avg()),
            SortKey::Min => y.min.cmp(&x.min),
            SortKey::Max => y.max.cmp(&x.max),
            SortKey::Name => std::cmp::Ordering::Equal,
        };
        by.then_with(|| names[**na].cmp(&names[**nb]))
    });
    let mut out = BufWriter::new(io::stdout().lock());
    let r = (|| -> io::Result<()> {
        let heads = [
            "Total time",
            "Self time",
            "Calls",
            "Total avg",
            "Total min",
            "Total max",
        ];
        for h in heads {
            write!(out, "  {h:>10}")?;
        }
        writeln!(out, "  Function")?;
        for _ in heads {
            write!(out, "  ==========")?;
        }
        writeln!(out, "  ====================")?;
        for (n, f) in rows {
            let d = calls::duration;
            writeln!(
                out,
                "  {}  {}  {:>10}  {}  {}  {}  {}",
                d(f.total),
                d(f.self_ns),
                f.calls,
                d(f.avg()),
                d(f.min),
                d(f.max),
                names[*n]
            )?;
        }
        out.flush()
    })();
    quiet_pipe(r)
}
