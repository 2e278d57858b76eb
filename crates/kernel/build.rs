//! Compiles the eBPF program that catches processes as they start
//! (`bpf/catch.bpf.c`, loaded by `src/catch.rs` for `weft-engine`'s system-wide watcher) with clang's BPF target.

use std::path::PathBuf;
use std::process::Command;

fn main() {
    let src = "bpf/catch.bpf.c";
    println!("cargo:rerun-if-changed={src}");
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("OUT_DIR")).join("catch.bpf.o");
    let clang = std::env::var("WEFT_CLANG").unwrap_or_else(|_| "clang".into());
    let status = Command::new(&clang)
        .args([
            "-O2", "-g", "-target", "bpf", "-Wall", "-Werror", "-c", src, "-o",
        ])
        .arg(&out)
        .status();
    match status {
        Ok(s) if s.success() => {}
        Ok(s) => panic!("{clang} failed ({s}) compiling {src}"),
        Err(e) => panic!(
            "cannot run {clang} to compile {src} ({e}): install clang (scripts/setup does) \
             or name one with WEFT_CLANG"
        ),
    }
}
