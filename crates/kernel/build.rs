//! Compiles the eBPF program that catches processes as they start
//! (`bpf/catch.bpf.c`, loaded by `src/catch.rs` for `weft-engine`'s system-wide watcher) with clang's BPF target.

use std::path::PathBuf;
use std::process::Command;

/// x86-64 system call numbers by name, from the kernel's UAPI header (linux-libc-dev,
/// which scripts/setup installs): `syscalls.rs` in OUT_DIR. Without the header the
/// table is empty and every `syscalls:` tracepoint takes the perf path.
fn syscall_table(out_dir: &std::path::Path) {
    let header = "/usr/include/x86_64-linux-gnu/asm/unistd_64.h";
    println!("cargo:rerun-if-changed={header}");
    let text = std::fs::read_to_string(header).unwrap_or_else(|e| {
        println!("cargo:warning=reading {header}: {e}; syscalls: tracepoints use the perf path");
        String::new()
    });
    let mut rows = Vec::new();
    for line in text.lines() {
        let mut w = line.split_whitespace();
        if let (Some("#define"), Some(name), Some(nr)) = (w.next(), w.next(), w.next()) {
            if let (Some(name), Ok(nr)) = (name.strip_prefix("__NR_"), nr.parse::<u32>()) {
                rows.push(format!("    ({name:?}, {nr}),\n"));
            }
        }
    }
    rows.sort();
    let code = format!(
        "/// `(name, number)` of every x86-64 system call, sorted by name.\n\
         pub static SYSCALLS: &[(&str, u32)] = &[\n{}];\n",
        rows.concat()
    );
    std::fs::write(out_dir.join("syscalls.rs"), code).expect("writing syscalls.rs");
}

fn main() {
    syscall_table(&PathBuf::from(
        std::env::var_os("OUT_DIR").expect("OUT_DIR"),
    ));
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
