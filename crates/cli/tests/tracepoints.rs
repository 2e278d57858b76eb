//! Kernel tracepoints on the running kernel's tracefs: `weft -l`/`-lv` against
//! `bpftrace -l`/`-lv`, the front end's messages (`weft trace -e ...`), and the
//! probe program a tracepoint probe lowers to (`-d program`). Skipped where tracefs
//! cannot be read; the comparisons with bpftrace need bpftrace v0.17.

mod common;

use std::process::Command;
use std::time::Duration;

use common::*;

const T: Duration = Duration::from_secs(60);

/// The kernel's tracepoints can be read here: the machines weft is tested on have
/// tracefs (CI runs as root), so a missing one fails the test, never skips it.
fn assert_tracefs() {
    let ok = std::path::Path::new("/sys/kernel/tracing/events/syscalls/sys_enter_openat/format")
        .exists()
        || std::path::Path::new(
            "/sys/kernel/debug/tracing/events/syscalls/sys_enter_openat/format",
        )
        .exists();
    assert!(ok, "no tracefs with syscall tracepoints (run as root)");
}

/// `bpftrace ARGS`' stdout, when bpftrace v0.17 runs here.
fn bpftrace(args: &[&str]) -> Option<String> {
    let v = Command::new("bpftrace").arg("--version").output().ok()?;
    if !text(&v.stdout).contains("v0.17.") {
        eprintln!("no bpftrace v0.17: not compared");
        return None;
    }
    let o = Command::new("bpftrace").args(args).output().ok()?;
    Some(text(&o.stdout))
}

/// weft's stderr for a program it must refuse.
fn refused(program: &str) -> String {
    let o = weft(&["trace", "-e", program], T);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o.stderr));
    text(&o.stderr)
}

#[test]
fn list_names_tracepoints_as_bpftrace_does() {
    assert_tracefs();
    let out = ok(&weft(&["-l", "tracepoint:syscalls:sys_enter_open*"], T));
    assert!(
        out.lines()
            .any(|l| l == "tracepoint:syscalls:sys_enter_openat"),
        "{out}"
    );
    assert!(out
        .lines()
        .all(|l| l.starts_with("tracepoint:syscalls:sys_enter_open")));
    // The short provider, and a bare pattern (a tracepoint's name, as bpftrace).
    assert_eq!(ok(&weft(&["-l", "t:syscalls:sys_enter_open*"], T)), out);
    let bare = ok(&weft(&["-l", "sys_enter_openat*"], T));
    assert!(
        bare.starts_with("tracepoint:syscalls:sys_enter_openat\n"),
        "{bare}"
    );
    if let Some(b) = bpftrace(&["-l", "tracepoint:syscalls:sys_enter_open*"]) {
        assert_eq!(out, b);
    }
}

#[test]
fn list_verbose_gives_the_fields_as_bpftrace_does() {
    assert_tracefs();
    let out = ok(&weft(&["-lv", "tracepoint:syscalls:sys_enter_openat"], T));
    let want = "tracepoint:syscalls:sys_enter_openat\n    int __syscall_nr\n    int dfd\n    \
                const char * filename\n    int flags\n    umode_t mode\n";
    assert_eq!(out, want);
    // Every tracepoint, its fields included (strings, arrays, `__data_loc`).
    let all = ok(&weft(&["-lv", "tracepoint:*"], T));
    if let Some(b) = bpftrace(&["-lv", "tracepoint:*"]) {
        assert!(all == b, "weft -lv 'tracepoint:*' differs from bpftrace's");
    }
}

#[test]
fn list_without_a_pattern_is_every_tracepoint() {
    assert_tracefs();
    let out = ok(&weft(&["-l"], T));
    assert!(out.lines().count() > 100, "{out}");
    assert!(out.lines().all(|l| l.starts_with("tracepoint:")));
    if let Some(b) = bpftrace(&["-l"]) {
        let theirs: String = b
            .lines()
            .filter(|l| l.starts_with("tracepoint:"))
            .map(|l| format!("{l}\n"))
            .collect();
        assert!(
            out == theirs,
            "weft -l differs from bpftrace -l's tracepoints"
        );
    }
}

#[test]
fn unknown_tracepoint_suggests_the_closest() {
    assert_tracefs();
    let e = refused("tracepoint:syscalls:sys_enter_opnat { }");
    assert!(
        e.contains(
            "error: unknown tracepoint `tracepoint:syscalls:sys_enter_opnat`; did you mean \
             `tracepoint:syscalls:sys_enter_openat`?"
        ),
        "{e}"
    );
    assert!(e.contains(" --> -e:1:1"), "{e}");
    let e = refused("t:syscals:sys_enter_openat { }");
    assert!(e.contains("unknown tracepoint category `syscals`"), "{e}");
    assert!(e.contains("did you mean `syscalls`?"), "{e}");
    let e = refused("kernel:syscall:opnat { }");
    assert!(e.contains("did you mean `openat`?"), "{e}");
}

#[test]
fn missing_field_lists_the_fields() {
    assert_tracefs();
    let e = refused("tracepoint:syscalls:sys_enter_openat { print(args.nosuch); }");
    assert!(
        e.contains(
            "error: tracepoint:syscalls:sys_enter_openat has no field `nosuch`; it has \
             __syscall_nr, dfd, filename, flags, mode"
        ),
        "{e}"
    );
    let e = refused("tracepoint:syscalls:sys_enter_openat { print(args->flag); }");
    assert!(e.contains("did you mean `flags`?"), "{e}");
    let e = refused("tracepoint:syscalls:sys_exit_openat { print(retval); }");
    assert!(
        e.contains("in a sys_exit tracepoint the return value is args.ret"),
        "{e}"
    );
}

#[test]
fn kprobe_says_what_the_kernel_offers() {
    assert_tracefs();
    let e = refused("kprobe:do_sys_open { }");
    let kprobes = std::path::Path::new("/sys/kernel/tracing/kprobe_events").exists()
        || std::path::Path::new("/sys/bus/event_source/devices/kprobe").exists();
    let why = if kprobes {
        "error: kprobe: kernel function probes are not supported by weft yet (this kernel has kprobes)"
    } else {
        "error: kprobe: this kernel has no kprobes (no kprobe_events in"
    };
    assert!(e.contains(why), "{e}");
    assert!(e.contains("use tracepoint:CATEGORY:NAME"), "{e}");
}

#[test]
fn the_program_reads_the_event_record() {
    assert_tracefs();
    let o = weft(
        &[
            "trace",
            "--dry-run",
            "-d",
            "program",
            "-e",
            "tracepoint:syscalls:sys_enter_openat { @[str(args.filename)] = count(); }",
        ],
        T,
    );
    let dump = text(&o.stderr);
    assert!(o.status.success(), "{dump}");
    assert!(
        dump.contains("probe tracepoint:syscalls:sys_enter_openat"),
        "{dump}"
    );
    // `filename` is the pointer at 24 (the format file says so), read for str().
    let field = dump
        .lines()
        .find(|l| l.contains("EventField"))
        .unwrap_or_else(|| panic!("no EventField: {dump}"));
    assert!(field.contains("off: 24, size: 8"), "{dump}");
    assert!(dump.contains("ReadStr"), "{dump}");
    // Without --dry-run it runs (crates/cli/tests/kernel.rs has the rest).
    let o = weft(
        &[
            "trace",
            "-e",
            "kernel:syscall:openat /pid == cpid/ { @ = count(); }",
            "-c",
            "/bin/true",
        ],
        T,
    );
    assert!(map_value(&ok(&o), "@").is_some_and(|n| n > 0));
}
