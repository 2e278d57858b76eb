//! `weft demo`: compile the bundled demo program and weave into it.

use std::path::PathBuf;
use std::process::Command;

use anyhow::{bail, Context, Result};

use clap::Parser;

use crate::args::Cli;

const DEMO_C: &str = include_str!("../../../tests/targets/demo.c");

/// The program woven into the demo; `DEMO` is replaced by the binary's path.
pub const DEMO_PROGRAM: &str = r#"
uprobe:DEMO:parse { @parse_calls = count(); }
uretprobe:DEMO:parse { @path_len = lhist(retval, 0, 16, 2); }
uprobe:DEMO:handle { @start[tid] = nsecs; }
uretprobe:DEMO:handle /@start[tid]/ {
  @handle_ns = hist(nsecs - @start[tid]);
  delete(@start[tid]);
}
uprobe:libc:malloc /comm == "demo"/ { @malloc_bytes = sum(arg0); }
END { printf("woven, counted and unwoven\n"); }
"#;

fn build() -> Result<PathBuf> {
    let dir = std::env::temp_dir().join(format!("weft-demo-{}", unsafe { libc::getuid() }));
    std::fs::create_dir_all(&dir)?;
    let src = dir.join("demo.c");
    std::fs::write(&src, DEMO_C)?;
    let bin = dir.join("demo");
    let st = Command::new("gcc")
        .args(["-O2", "-g", "-o"])
        .arg(&bin)
        .arg(&src)
        .status()
        .context("running gcc (the demo compiles a small C program)")?;
    if !st.success() {
        bail!("gcc failed to build the demo program");
    }
    Ok(bin)
}

pub fn run(requests: u32) -> Result<i32> {
    let bin = build()?;
    let b = bin.display().to_string();
    let prog = DEMO_PROGRAM.replace("DEMO", &b);
    eprintln!("weft demo: weaving into {b} {requests}\n{}", prog.trim());
    eprintln!();
    // Parsed as the command line would be: every other flag keeps its default.
    let cmd = format!("{b} {requests}");
    let cli = Cli::try_parse_from(["weft", "-e", &prog, "-c", &cmd])
        .context("the demo's own command line")?;
    crate::trace(cli.trace)
}
