//! Running processes: load biases, library resolution and symbolization, checked
//! against the addresses the programs print of themselves.

mod common;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};

use common::cc;
use weft_symbols::{
    list, resolve_in_module, resolve_target, Error, LibrarySearch, ListSource, Module, ProcMaps,
    Symbolizer, TargetContext,
};

/// Prints its own `target_fn` and libc's `malloc`, then waits for stdin to close.
const PROG: &str = r#"
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <unistd.h>
__attribute__((noinline)) int target_fn(int x) { return x + 1; }
int main(void) {
    printf("%p %p\n", (void *)target_fn, dlsym(RTLD_DEFAULT, "malloc"));
    fflush(stdout);
    char buf[16];
    while (read(0, buf, sizeof buf) > 0) {}
    return target_fn(0) - 1;
}
"#;

/// A running copy of the program; it exits when dropped (stdin closes).
struct Running {
    child: Child,
    stdin: Option<ChildStdin>,
    target_fn: u64,
    malloc: u64,
}

impl Running {
    fn start(exe: &Path) -> Running {
        let mut child = Command::new(exe)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let addrs: Vec<u64> = line
            .split_whitespace()
            .map(|a| u64::from_str_radix(a.trim_start_matches("0x"), 16).unwrap())
            .collect();
        Running {
            child,
            stdin,
            target_fn: addrs[0],
            malloc: addrs[1],
        }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        drop(self.stdin.take());
        let _ = self.child.wait();
    }
}

fn module<'a>(modules: &'a [Module], file_name: &str) -> &'a Module {
    modules
        .iter()
        .find(|m| m.file_name() == file_name)
        .unwrap_or_else(|| panic!("{file_name} not mapped"))
}

fn check_process(exe: &Path, expect_exe_bias_zero: bool) {
    let run = Running::start(exe);
    let maps = ProcMaps::read(run.pid()).unwrap();
    let modules = maps.modules();
    let canonical = std::fs::canonicalize(exe).unwrap();

    // The executable: bias and runtime address of target_fn.
    let app = module(&modules, "app");
    assert_eq!(app.path, canonical);
    assert_eq!(
        app.load_bias == 0,
        expect_exe_bias_zero,
        "bias {:#x}",
        app.load_bias
    );
    assert_eq!(app.load_bias % 4096, 0);
    let r = resolve_in_module(app, "target_fn").unwrap();
    assert_eq!(r.len(), 1);
    assert_eq!(r[0].runtime_addr, Some(run.target_fn), "target_fn");

    // libc, found by name in the process.
    let search = LibrarySearch::system();
    let ctx = TargetContext {
        process: Some((run.pid(), &modules)),
        executable: None,
        search: &search,
    };
    let libc = resolve_target("libc", &ctx).unwrap();
    let libc_module = libc.module.clone().unwrap();
    assert_eq!(libc_module.file_name(), "libc.so.6");
    assert_eq!(resolve_target("libc.so.6", &ctx).unwrap(), libc);
    let r = resolve_in_module(&libc_module, "malloc").unwrap();
    assert_eq!(r.len(), 1);
    assert_eq!(r[0].runtime_addr, Some(run.malloc), "malloc");
    assert_eq!(r[0].path, libc_module.path);

    // The executable by name and by path.
    assert_eq!(resolve_target("app", &ctx).unwrap().path, canonical);
    assert_eq!(
        resolve_target(exe.to_str().unwrap(), &ctx).unwrap().path,
        canonical
    );

    // Unknown names suggest mapped ones.
    let e = resolve_target("libcc", &ctx).unwrap_err();
    assert_eq!(
        e.to_string(),
        format!(
            "cannot find `libcc` (not mapped in process {}); did you mean `libc.so.6`?",
            run.pid()
        )
    );
    assert!(matches!(
        resolve_target("libm", &ctx),
        Err(Error::TargetNotFound { .. })
    ));

    // Symbolization.
    let mut sym = Symbolizer::for_process(run.pid()).unwrap();
    let s = sym.symbolize(run.target_fn + 3).unwrap();
    assert_eq!(
        (s.name.as_deref(), s.offset, s.module.as_path()),
        (Some("target_fn"), 3, canonical.as_path())
    );
    let s = sym.symbolize(run.malloc).unwrap();
    assert_eq!((s.name.as_deref(), s.offset), (Some("malloc"), 0));
    assert_eq!(s.module, libc_module.path);
    assert_eq!(sym.symbolize(0x10), None);
    let heap = maps.mappings.iter().find(|m| m.name == "[stack]").unwrap();
    assert_eq!(sym.symbolize(heap.start), None);

    // Listing a process covers the executable and its libraries.
    let lines = list(&ListSource::Process(run.pid()), "uprobe:*:target_fn").unwrap();
    assert_eq!(lines, [format!("uprobe:{}:target_fn", canonical.display())]);
    let lines = list(&ListSource::Process(run.pid()), "uprobe:*/libc.so.6:malloc").unwrap();
    assert_eq!(
        lines,
        [format!("uprobe:{}:malloc", libc_module.path.display())]
    );
}

#[test]
fn pie_process() {
    let dir = tempfile::tempdir().unwrap();
    let exe = cc(
        dir.path(),
        "app",
        &[("app.c", PROG)],
        &["-O1", "-pie", "-fPIE"],
    );
    check_process(&exe, false);
}

#[test]
fn non_pie_process() {
    let dir = tempfile::tempdir().unwrap();
    let exe = cc(
        dir.path(),
        "app",
        &[("app.c", PROG)],
        &["-O1", "-no-pie", "-fno-pie"],
    );
    check_process(&exe, true);
}

#[test]
fn deleted_executable_is_still_resolved() {
    let dir = tempfile::tempdir().unwrap();
    let exe = cc(dir.path(), "app", &[("app.c", PROG)], &["-O1"]);
    let run = Running::start(&exe);
    let canonical: PathBuf = std::fs::canonicalize(&exe).unwrap();
    std::fs::remove_file(&exe).unwrap();
    let modules = ProcMaps::read(run.pid()).unwrap().modules();
    let app = modules
        .iter()
        .find(|m| m.path == canonical)
        .expect("deleted module listed");
    assert!(app.deleted);
    assert!(
        app.open_path.starts_with("/proc"),
        "{}",
        app.open_path.display()
    );
    let r = resolve_in_module(app, "target_fn").unwrap();
    assert_eq!(r[0].runtime_addr, Some(run.target_fn));
    assert_eq!(r[0].path, canonical);
}

#[test]
fn missing_process_is_an_error() {
    // Pid numbers wrap far below this.
    let e = ProcMaps::read(999_999_999).unwrap_err();
    assert!(
        e.to_string()
            .starts_with("cannot read the memory map of process 999999999: "),
        "{e}"
    );
}
