//! Compiles the C runtime `weft memprof` preloads (`c/memprof.c` →
//! libweft_memprof.so) and the inert hooks a counted-mode build links against
//! (`c/memstub.c` → libweft_memstub.so), and, when clang is there, the hooks as
//! LLVM bitcode that a clang `-flto` build inlines (`c/hooks.c` →
//! libweft_memhooks.a, empty without clang); `src/lib.rs` embeds the three.

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
            // The allocation stack is a frame-pointer walk that starts in this
            // library's own frames.
            "-fno-omit-frame-pointer",
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
    for f in [
        "c/memprof.c",
        "c/memstub.c",
        "c/atomics.h",
        "c/sample.h",
        "c/decode.h",
    ] {
        println!("cargo:rerun-if-changed={f}");
    }
    build(
        "c/memprof.c",
        &out.join("libweft_memprof.so"),
        &["-ldl", "-lpthread"],
    );
    build("c/memstub.c", &out.join("libweft_memstub.so"), &[]);
    hooks(&out);
}

/// libweft_memhooks.a: c/hooks.c compiled by clang to bitcode. Without clang (or
/// ar) the archive is left empty and counted mode calls the hooks in
/// libweft_memprof.so instead.
fn hooks(out: &std::path::Path) {
    let clang = std::env::var("WEFT_CLANG").unwrap_or_else(|_| "clang".into());
    let obj = out.join("memhooks.o");
    let lib = out.join("libweft_memhooks.a");
    let _ = std::fs::remove_file(&lib);
    let ok = Command::new(&clang)
        .args([
            "-O2",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-flto",
            "-fPIC",
            "-c",
            "c/hooks.c",
            "-o",
        ])
        .arg(&obj)
        .status()
        .is_ok_and(|s| s.success())
        && Command::new("ar")
            .arg("rcs")
            .arg(&lib)
            .arg(&obj)
            .status()
            .is_ok_and(|s| s.success());
    if !ok {
        println!("cargo:warning=no clang: weft memprof's counted mode will call its hooks, not inline them");
        std::fs::write(&lib, b"").expect("writing an empty libweft_memhooks.a");
    }
}
