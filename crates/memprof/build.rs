//! Compiles the C runtime `weft memprof` preloads (`c/memprof.c` →
//! libweft_memprof.so) and the inert hooks a counted-mode build links against
//! (`c/memstub.c` → libweft_memstub.so); `src/lib.rs` embeds both.

use std::path::PathBuf;
use std::process::Command;

fn build(src: &str, out: &PathBuf, extra: &[&str]) {
    let cc = std::env::var("WEFT_CC").unwrap_or_else(|_| "cc".into());
    let status = Command::new(&cc)
        .args([
            "-O2",
            "-g",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-shared",
            "-fPIC",
            "-fvisibility=hidden",
            "-ftls-model=initial-exec",
            "-Ic",
        ])
        .arg(src)
        .arg("-o")
        .arg(out)
        .args(extra)
        .status();
    match status {
        Ok(s) if s.success() => {}
        Ok(s) => panic!("{cc} failed ({s}) compiling {src}"),
        Err(e) => panic!("cannot run {cc} to compile {src} ({e}): install gcc (scripts/setup does) or name a compiler with WEFT_CC"),
    }
}

fn main() {
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("OUT_DIR"));
    for f in ["c/memprof.c", "c/memstub.c", "c/atomics.h", "c/sample.h"] {
        println!("cargo:rerun-if-changed={f}");
    }
    build(
        "c/memprof.c",
        &out.join("libweft_memprof.so"),
        &["-ldl", "-lpthread"],
    );
    build("c/memstub.c", &out.join("libweft_memstub.so"), &[]);
}
