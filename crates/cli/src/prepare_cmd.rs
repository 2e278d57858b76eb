//! `weft prepare BINARY -o OUT [--functions PATTERN] [-v]`: rewrite a binary built
//! without instrumentation so that each function's entry jumps to a stub holding a
//! NOP placeholder (see `weft-prepare`). The file IO around the pure library.

use std::io::Write;
use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;

#[derive(Args, Debug, Clone)]
pub struct PrepareArgs {
    /// A dynamically linked x86-64 program or shared library.
    pub binary: PathBuf,
    /// Where to write the prepared binary (BINARY itself is never changed).
    #[arg(short = 'o', value_name = "OUT")]
    pub output: PathBuf,
    /// Only the functions matching this wildcard pattern (default: every function).
    #[arg(long, value_name = "PATTERN")]
    pub functions: Option<String>,
    /// List the functions left as they were, with the reason.
    #[arg(short, long)]
    pub verbose: bool,
}

/// Runs the subcommand; the exit status is 0, or an error (exit 1) with nothing
/// written.
pub fn run(a: PrepareArgs) -> Result<i32> {
    let input =
        std::fs::read(&a.binary).with_context(|| format!("cannot read {}", a.binary.display()))?;
    let options = weft_prepare::Options {
        functions: a.functions.clone(),
    };
    let done = weft_prepare::prepare(&a.binary, &input, &options)?;
    if done.dynsym_only {
        eprintln!(
            "weft: note: {} has no .symtab (stripped): only its {} exported functions (.dynsym) could be considered{}",
            a.binary.display(),
            done.probes.len() + done.skipped.len(),
            if a.verbose { "" } else { " (-v lists the ones prepared)" }
        );
    }
    if a.verbose {
        if done.dynsym_only {
            for p in &done.probes {
                eprintln!(
                    "weft: prepared: {} ({:#x})",
                    p.function,
                    p.function_vaddr.unwrap_or(0)
                );
            }
        }
        for s in &done.skipped {
            eprintln!("weft: left as it was: {s}");
        }
    }
    crate::coldpatch_cmd::write_replacing(&a.output, &done.bytes, &a.binary)?;
    let mut stdout = std::io::stdout().lock();
    write!(
        stdout,
        "{}: {} functions prepared, {} left as they were",
        a.output.display(),
        done.probes.len(),
        done.skipped.len()
    )?;
    if !done.skipped.is_empty() && !a.verbose {
        write!(stdout, " (-v says why)")?;
    }
    writeln!(stdout)?;
    Ok(0)
}
