//! `ustack` on programs built without frame pointers (the distributions' default):
//! unwound with the modules' `.eh_frame` (compact tables the agent searches), with
//! source lines when asked (`config = { show_debug_info = 1 }`), through the C
//! library's frames. Target: tests/targets/stacks.c.

mod common;

use common::*;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

const T: Duration = Duration::from_secs(120);

fn no_fp() -> PathBuf {
    build("stacks.c", Variant::O2_PIE, &["-fomit-frame-pointer"])
}

fn with_fp() -> PathBuf {
    build("stacks.c", Variant::O2_PIE, &[])
}

/// Run weft with `WEFT_USTACK_FP` set or not; its standard output.
fn run(prog: &str, bin: &Path, args: &str, fp_only: bool) -> String {
    let mut cmd = Command::new(weft_bin());
    cmd.args(["-e", prog, "-c", &format!("{} {args}", bin.display())])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if fp_only {
        cmd.env("WEFT_USTACK_FP", "1");
    } else {
        cmd.env_remove("WEFT_USTACK_FP");
    }
    ok(&wait_output(cmd.spawn().expect("starting weft"), T))
}

/// Each `@[...]: N` entry of a map keyed by a stack: its frame lines (trimmed) and
/// its value.
fn stacks(out: &str) -> Vec<(Vec<String>, i64)> {
    let mut all = Vec::new();
    let mut cur: Option<Vec<String>> = None;
    for l in out.lines() {
        if l.starts_with("@[") || l.starts_with("@s[") {
            cur = Some(Vec::new());
        } else if let Some(rest) = l.strip_prefix("]: ") {
            all.push((cur.take().unwrap_or_default(), rest.trim().parse().unwrap()));
        } else if let Some(c) = cur.as_mut() {
            if !l.trim().is_empty() {
                c.push(l.trim().to_string());
            }
        }
    }
    all
}

/// The frames' function names (`level3+21` → `level3`; `@file:line` dropped).
fn names(frames: &[String]) -> Vec<String> {
    frames
        .iter()
        .map(|f| {
            let f = f.split('@').next().unwrap();
            f.split('+').next().unwrap().to_string()
        })
        .collect()
}

const CHAIN: [&str; 5] = ["level4", "level3", "level2", "level1", "main"];

fn assert_chain(out: &str, first: usize, what: &str) {
    let s = stacks(out);
    assert_eq!(s.len(), 1, "{what}: one stack: {out}");
    let (frames, n) = &s[0];
    assert_eq!(*n, 5, "{what}: {out}");
    let got = names(frames);
    assert!(got.len() >= CHAIN.len() - first, "{what}: {out}");
    assert_eq!(got[..CHAIN.len() - first], CHAIN[first..], "{what}: {out}");
    if first == 0 {
        assert_eq!(frames[0], "level4+0", "{what}: {out}");
    }
}

#[test]
fn ustack_unwinds_code_without_frame_pointers() {
    let bin = no_fp();
    let prog = format!("uprobe:{}:level4 {{ @[ustack] = count(); }}", bin.display());
    assert_chain(&run(&prog, &bin, "5", false), 0, "CFI");
    // Upstream's `dw_ustack` (DWARF CFI unwinding) is the same stack.
    for form in ["dw_ustack()", "dw_ustack"] {
        let dw = format!("uprobe:{}:level4 {{ @[{form}] = count(); }}", bin.display());
        assert_chain(&run(&dw, &bin, "5", false), 0, form);
    }
    // Frame pointers alone lose the callers: the rbp walk stops after level3 (the
    // return address at level4's entry).
    let out = run(&prog, &bin, "5", true);
    let s = stacks(&out);
    assert_eq!(s.len(), 1, "{out}");
    let got = names(&s[0].0);
    assert_eq!(got[..2], ["level4", "level3"], "{out}");
    assert!(
        !got.iter().any(|f| f == "level2"),
        "rbp walk found level2 without frame pointers: {out}"
    );
}

#[test]
fn ustack_in_return_probes_without_frame_pointers() {
    let bin = no_fp();
    let prog = format!(
        "uretprobe:{}:level4 {{ @[ustack] = count(); }}",
        bin.display()
    );
    // A return probe's first frame is the return address, in level3.
    assert_chain(&run(&prog, &bin, "5", false), 1, "return");
}

#[test]
fn ustack_with_frame_pointers_still_works() {
    let bin = with_fp();
    let prog = format!("uprobe:{}:level4 {{ @[ustack] = count(); }}", bin.display());
    assert_chain(&run(&prog, &bin, "5", false), 0, "CFI, frame pointers");
    assert_chain(&run(&prog, &bin, "5", true), 0, "rbp walk");
}

/// The line of the `@marker` comment in stacks.c.
fn marker_line(marker: &str) -> u32 {
    let src = std::fs::read_to_string(repo_root().join("tests/targets/stacks.c")).unwrap();
    let want = format!("/* {marker} */");
    src.lines()
        .position(|l| l.contains(&want))
        .unwrap_or_else(|| panic!("no {marker} in stacks.c")) as u32
        + 1
}

#[test]
fn ustack_shows_file_and_line_with_show_debug_info() {
    let bin = no_fp();
    let prog = format!(
        "config = {{ show_debug_info = 1 }} uprobe:{}:level4 {{ @[ustack] = count(); }}",
        bin.display()
    );
    let out = run(&prog, &bin, "5", false);
    let s = stacks(&out);
    assert_eq!(s.len(), 1, "{out}");
    let frames = &s[0].0;
    for (i, (f, marker)) in CHAIN
        .iter()
        .zip(["@L4", "@L3", "@L2", "@L1", "@MAIN"])
        .enumerate()
    {
        let want = format!("/stacks.c:{}", marker_line(marker));
        assert!(
            frames[i].starts_with(&format!("{f}+")) && frames[i].ends_with(&want),
            "frame {i}: want {f}+N@...{want}: {out}"
        );
    }
    // Without the config key, bpftrace's plain frames.
    let plain = format!("uprobe:{}:level4 {{ @[ustack] = count(); }}", bin.display());
    let out = run(&plain, &bin, "5", false);
    assert!(!out.contains("stacks.c:"), "{out}");
}

#[test]
fn ustack_unwinds_through_the_c_library() {
    let bin = no_fp();
    let prog = format!(
        "uprobe:{}:by_value {{ @[ustack(perf)] = count(); }}",
        bin.display()
    );
    let out = run(&prog, &bin, "1", false);
    let all = stacks(&out);
    assert!(!all.is_empty(), "{out}");
    // Every comparison's stack: by_value, qsort's frames in the C library, then
    // sort_things and main.
    for (frames, _) in &all {
        assert!(frames[0].contains(" by_value+0 "), "{out}");
        let sort = frames
            .iter()
            .position(|f| f.contains(" sort_things+"))
            .unwrap_or_else(|| panic!("no sort_things: {out}"));
        assert!(frames[sort + 1].contains(" main+"), "{out}");
        assert!(sort >= 2, "{out}");
        assert!(
            frames[1..sort]
                .iter()
                .all(|f| f.contains("libc.so") || f.contains("[unknown]")),
            "{out}"
        );
        assert!(
            frames[1..sort].iter().any(|f| f.contains("libc.so")),
            "{out}"
        );
    }
}
