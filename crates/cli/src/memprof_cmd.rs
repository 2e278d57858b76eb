//! `weft memprof [OPTIONS] -- CMD ARGS...`: launch CMD with the memprof runtime
//! preloaded, and at its exit print the top allocation sites and the hottest
//! objects (`weft-memprof`); `--cflags`/`--ldflags` print how to build a binary for
//! counted mode.

use std::io::Write;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{anyhow, bail, Context, Result};
use clap::{Args, ValueEnum};
use weft_memprof::{report::Profile, Compiler, Options, Stack};

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum Cc {
    Clang,
    Gcc,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum StackArg {
    /// Frame pointers if the program was built with them, else unwind.
    Auto,
    /// The frame-pointer chain (cheap; stops early in code without them).
    Fp,
    /// glibc's backtrace() through .eh_frame (any code, slower).
    Unwind,
}

#[derive(Args, Debug, Clone)]
pub struct MemprofArgs {
    /// Print the compile flags of counted mode (for clang, or `--cc gcc`) and exit.
    #[arg(long)]
    pub cflags: bool,
    /// Print the link flags of counted mode (the inert hooks, so the binary also
    /// runs without weft) and exit.
    #[arg(long)]
    pub ldflags: bool,
    /// The compiler `--cflags` and `--ldflags` are for.
    #[arg(long, value_enum, default_value = "clang")]
    pub cc: Cc,
    /// Estimate access counts on an unmodified binary (no rebuild) instead of
    /// counting them.
    #[arg(long)]
    pub sampled: bool,
    /// Write DHAT's JSON (open it with Valgrind's dh_view.html) to FILE.
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// Write weft's JSON (every site and every object) to FILE.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Frames kept of each allocation's stack (1-16).
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=16))]
    pub depth: u32,
    /// How each allocation's stack is taken.
    #[arg(long, value_enum, default_value = "auto")]
    pub stack: StackArg,
    /// Rows in each table of the report.
    #[arg(long, default_value_t = 10)]
    pub top: usize,
    /// Objects the table holds; later allocations are counted as dropped.
    #[arg(long, default_value_t = 1 << 24)]
    pub max_objects: u64,
    /// Sampled mode: microseconds of each thread's CPU time between samples.
    #[arg(long, default_value_t = 50)]
    pub period: u64,
    /// The command to run.
    #[arg(last = true, value_name = "CMD")]
    pub command: Vec<String>,
}

pub fn run(a: MemprofArgs) -> Result<i32> {
    let mut out = std::io::stdout().lock();
    if a.cflags || a.ldflags {
        let cc = match a.cc {
            Cc::Clang => Compiler::Clang,
            Cc::Gcc => Compiler::Gcc,
        };
        let mut parts = Vec::new();
        if a.cflags {
            parts.push(weft_memprof::cflags(cc));
        }
        if a.ldflags {
            parts.push(weft_memprof::ldflags(&weft_memprof::install()?, cc));
        }
        writeln!(out, "{}", parts.join(" "))?;
        return Ok(0);
    }
    let Some(program) = a.command.first() else {
        bail!("weft memprof: no command: `weft memprof [OPTIONS] -- CMD [ARGS...]`");
    };
    let exe = find_program(program)?;
    let opts = Options {
        sampled: a.sampled,
        depth: a.depth,
        stack: Stack::Auto,
        max_objects: a.max_objects,
        period_us: a.period.max(1),
    };
    weft_memprof::check(&exe, &opts)?;
    let opts = Options {
        stack: weft_memprof::resolve_stack(
            &exe,
            match a.stack {
                StackArg::Auto => Stack::Auto,
                StackArg::Fp => Stack::FramePointers,
                StackArg::Unwind => Stack::Unwind,
            },
        ),
        ..opts
    };
    let dir = weft_memprof::install()?;
    let tmp = std::env::temp_dir().join(format!("weft-memprof-{}.dump", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    let mut cmd = Command::new(&exe);
    cmd.args(&a.command[1..]);
    for (k, v) in weft_memprof::environment(&dir, &tmp, std::process::id(), &opts) {
        cmd.env(k, v);
    }
    let mut child = cmd
        .spawn()
        .with_context(|| format!("cannot run {}", exe.display()))?;
    let pid = child.id();
    let status = child.wait()?;
    let bytes = std::fs::read(&tmp);
    let _ = std::fs::remove_file(&tmp);
    let bytes = match bytes {
        Ok(b) => b,
        Err(_) => {
            let how = match status.signal() {
                Some(s) => format!("was killed by signal {s}"),
                None => format!("exited with {status}"),
            };
            bail!(
                "{} {how} without writing its profile (a program that ends in _exit or a \
                 signal leaves none)",
                exe.display()
            );
        }
    };
    let dump = weft_memprof::dump::parse(&bytes)?;
    let profile = Profile::new(dump, a.command.join(" "), pid);
    std::io::stdout().flush()?;
    write!(out, "{}", profile.text(a.top))?;
    if let Some(path) = &a.output {
        write_json(path, &profile.dhat())?;
    }
    if let Some(path) = &a.json {
        write_json(path, &profile.json())?;
    }
    Ok(status.code().unwrap_or(1))
}

fn write_json(path: &Path, v: &serde_json::Value) -> Result<()> {
    let text = serde_json::to_string(v)?;
    std::fs::write(path, text).with_context(|| format!("cannot write {}", path.display()))
}

/// The file `program` names: a path, or a name looked up in `PATH`.
fn find_program(program: &str) -> Result<PathBuf> {
    if program.contains('/') {
        let p = PathBuf::from(program);
        if !p.exists() {
            bail!("{program}: no such file");
        }
        return Ok(p);
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|d| d.join(program))
        .find(|p| p.is_file())
        .ok_or_else(|| anyhow!("{program}: not found in PATH"))
}
