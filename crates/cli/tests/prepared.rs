//! Prepared binaries (issue 4): one program built every prepared way
//! (`tests/targets/prepared_calls.c`, see `tests/targets/PREPARED.md`), woven at its
//! placeholders, with exact counts, arguments and return values.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::*;

const T: Duration = Duration::from_secs(60);

/// The program's own output, the same for every build.
const OUTPUT: &str =
    "mid total 10000\ntouch sink 300\nclassify -1:10 0:1 1:19\nfib(10) 55\ntwelve twelve\n";

fn sh(cmd: &mut Command) {
    let st = cmd.status().expect("running the compiler");
    assert!(st.success(), "{cmd:?} failed");
}

/// Build `prepared_calls.c` as `style` (cached per style).
fn prepared(style: &str) -> PathBuf {
    // The coldpatched build needs the instrumented one: build it before locking.
    let raw = (style == "coldpatched").then(|| prepared("instrumented"));
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _g = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let root = repo_root();
    let src = root.join("tests/targets/prepared_calls.c");
    let inc = root.join("include");
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("prepared");
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join(style);
    if out.is_file() {
        return out;
    }
    let gcc = |extra: &[&str], o: &Path| {
        let mut c = Command::new("gcc");
        c.args(["-O2", "-g"])
            .arg("-I")
            .arg(&inc)
            .args(extra)
            .arg(&src)
            .arg("-o")
            .arg(o);
        c
    };
    match style {
        "plain" => sh(&mut gcc(&[], &out)),
        "sdt-semaphores" => sh(&mut gcc(&["-DPREPARED_SDT_SEMAPHORES"], &out)),
        "patchable" => sh(&mut gcc(&["-fpatchable-function-entry=5"], &out)),
        "patchable-cet" => sh(&mut gcc(
            &["-fpatchable-function-entry=5", "-fcf-protection=full"],
            &out,
        )),
        "fentry" => {
            let obj = dir.join("fentry.o");
            let mut c = Command::new("gcc");
            c.args([
                "-O2",
                "-g",
                "-no-pie",
                "-fno-pie",
                "-pg",
                "-mfentry",
                "-mnop-mcount",
                "-mrecord-mcount",
                "-c",
            ])
            .arg("-I")
            .arg(&inc)
            .arg(&src)
            .arg("-o")
            .arg(&obj);
            sh(&mut c);
            sh(Command::new("gcc")
                .arg("-no-pie")
                .arg(&obj)
                .arg("-o")
                .arg(&out));
        }
        "instrumented" => sh(&mut gcc(&["-finstrument-functions"], &out)),
        "coldpatched" => {
            let raw = raw.expect("built above");
            let o = Command::new(weft_bin())
                .arg("coldpatch")
                .arg(&raw)
                .arg("-o")
                .arg(&out)
                .output()
                .unwrap();
            assert!(o.status.success(), "coldpatch: {}", text(&o.stderr));
        }
        other => panic!("unknown style {other}"),
    }
    out
}

/// Every build of the target: the plain one and the placeholder-carrying ones.
const BUILDS: [&str; 5] = [
    "plain",
    "coldpatched",
    "patchable",
    "patchable-cet",
    "fentry",
];

/// The placeholder-carrying builds, with the -v phrase their sites show.
const STYLES: [&str; 4] = ["coldpatched", "patchable", "patchable-cet", "fentry"];

#[test]
fn every_prepared_build_counts_arguments_and_returns_exactly() {
    for style in BUILDS {
        let bin = prepared(style);
        let b = bin.to_str().unwrap();
        let prog = format!(
            "uprobe:{b}:leaf {{ @leaf = count(); @x = sum(arg0); }} uretprobe:{b}:leaf {{ @lr = sum(retval); }} \
             uprobe:{b}:mid {{ @mid = count(); }} uretprobe:{b}:mid {{ @midret = count(); }} \
             uprobe:{b}:classify {{ @cx = sum((int32)arg0); }} uretprobe:{b}:classify {{ @[(int32)retval] = count(); }} \
             uprobe:{b}:fib {{ @fib = count(); }} uretprobe:{b}:touch {{ @touch = count(); }}"
        );
        let o = weft(&["-v", "-e", &prog, "-c", b], T);
        let out = ok(&o);
        assert!(
            out.starts_with(OUTPUT),
            "{style}: program output changed: {out}"
        );
        let v = |m: &str| map_value(&out, m);
        assert_eq!(
            (v("@leaf"), v("@x"), v("@lr")),
            (Some(100), Some(4950), Some(10000)),
            "{style}: {out}"
        );
        assert_eq!((v("@mid"), v("@midret")), (Some(10), Some(10)), "{style}");
        assert_eq!(v("@cx"), Some(135), "{style}");
        assert!(
            out.contains("@[-1]: 10\n") && out.contains("@[0]: 1\n") && out.contains("@[1]: 19\n")
        );
        assert_eq!((v("@fib"), v("@touch")), (Some(177), Some(25)), "{style}");
        let err = text(&o.stderr);
        if STYLES.contains(&style) {
            assert!(
                err.contains("jump over a NOP placeholder"),
                "{style}: {err}"
            );
        }
        if style == "coldpatched" {
            // Count-only return probes run at the exit placeholders: no hijack.
            assert!(err.contains("mid (exit placeholder)"), "{err}");
            assert!(err.contains("touch (exit placeholder)"), "{err}");
        }
    }
}

/// Around advice that proceeds with a new argument, woven as entry advice that
/// sets it, sets it at the function's real entry on every build (never at a
/// coldpatched placeholder inside the prologue, where the registers are no longer
/// the arguments): every `leaf(x)` becomes `leaf(7)`.
#[test]
fn new_arguments_reach_the_function_on_every_prepared_build() {
    for style in BUILDS {
        let bin = prepared(style);
        let b = bin.to_str().unwrap();
        let prog = format!(
            "around uprobe:{b}:leaf {{ return proceed(7); }} \
             uretprobe:{b}:leaf {{ @r = sum(retval); @n = count(); }}"
        );
        let out = ok(&weft(&["--unsafe", "-e", &prog, "-c", b], T));
        assert_eq!(
            (map_value(&out, "@n"), map_value(&out, "@r")),
            (Some(100), Some(100 * 15)),
            "{style}: {out}"
        );
    }
}

#[test]
fn coldpatched_binary_runs_like_the_original_and_unweave_restores_the_nops() {
    let cold = prepared("coldpatched");
    let raw = prepared("instrumented");
    // Without weft the coldpatched program behaves exactly as the original.
    let run = |p: &Path| text(&Command::new(p).output().unwrap().stdout);
    assert_eq!(run(&cold), run(&raw));
    assert!(run(&cold).starts_with(OUTPUT));
    // Coldpatching again is refused; a binary without hooks is refused.
    let again = Command::new(weft_bin())
        .arg("coldpatch")
        .arg(&cold)
        .arg("-o")
        .arg("/dev/null")
        .output()
        .unwrap();
    assert!(!again.status.success() && text(&again.stderr).contains("already coldpatched"));
    let plain = prepared("plain");
    let none = Command::new(weft_bin())
        .arg("coldpatch")
        .arg(&plain)
        .arg("-o")
        .arg("/tmp/x")
        .output()
        .unwrap();
    assert!(
        !none.status.success() && text(&none.stderr).contains("no -finstrument-functions calls")
    );
}

#[test]
fn stripped_coldpatched_binary_is_traced_through_its_probe_list() {
    let raw = prepared("instrumented");
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("prepared");
    let out = dir.join("coldpatched-stripped");
    let o = Command::new(weft_bin())
        .arg("coldpatch")
        .arg(&raw)
        .arg("-o")
        .arg(&out)
        .arg("--strip")
        .output()
        .unwrap();
    assert!(o.status.success(), "coldpatch --strip: {}", text(&o.stderr));
    let b = out.to_str().unwrap();
    // No symbol table: the functions are known only from the probe list.
    assert!(ok(&weft(&["list", "leaf", b], T)).contains(&format!("uprobe:{b}:leaf\n")));
    let prog = format!(
        "uprobe:{b}:leaf {{ @leaf = count(); }} uretprobe:{b}:mid {{ @mid = count(); }} \
         uprobe:{b}:fib {{ @n = sum(arg0); }} uretprobe:{b}:classify {{ @[(int32)retval] = count(); }}"
    );
    let o = weft(&["-v", "-e", &prog, "-c", b], T);
    let out = ok(&o);
    assert!(out.starts_with(OUTPUT), "{out}");
    assert_eq!(
        (map_value(&out, "@leaf"), map_value(&out, "@mid")),
        (Some(100), Some(10)),
        "{out}"
    );
    // Arguments and return values need the real entry (an int3: the size is unknown).
    assert_eq!(map_value(&out, "@n"), Some(364), "{out}");
    assert!(
        out.contains("@[-1]: 10\n") && out.contains("@[0]: 1\n") && out.contains("@[1]: 19\n"),
        "{out}"
    );
    let err = text(&o.stderr);
    assert!(
        err.contains("leaf (entry placeholder)") && err.contains("mid (exit placeholder)"),
        "{err}"
    );
}

#[test]
fn weft_h_and_sdt_probes_with_semaphores() {
    for style in ["plain", "sdt-semaphores"] {
        let bin = prepared(style);
        let b = bin.to_str().unwrap();
        let prog = format!(
            "usdt:{b}:prepared:tick {{ @t0 = sum(arg0); @t1 = sum(arg1); @t2 = sum((int64)arg2); }} \
             usdt:{b}:prepared:gated {{ @g = sum(arg1); }} \
             usdt:{b}:prepared_sdt:pair {{ @p = sum((int64)arg1); }} \
             usdt:{b}:prepared:twelve {{ printf(\"%d %d %d %d %d %d %s %d\\n\", arg0, arg1, arg2, arg3, arg4, arg9, str(arg8), arg11); }}"
        );
        let out = ok(&weft(&["-e", &prog, "-c", b], T));
        let v = |m: &str| map_value(&out, m);
        assert_eq!(
            (v("@t0"), v("@t1"), v("@t2")),
            (Some(45), Some(285), Some(-45)),
            "{style}: {out}"
        );
        // The gated code ran only because weft held the semaphore.
        assert_eq!(v("@g"), Some(45070), "{style}: {out}");
        let sdt = if style == "sdt-semaphores" { 10 } else { 0 };
        assert!(
            out.contains(&format!("gated runs weft 10 sdt {sdt}\n")),
            "{style}: {out}"
        );
        assert_eq!(v("@p"), Some(-135), "{style}");
        assert!(
            out.contains("-1 200 -300 60000 -70000 -12 twelve 1\n"),
            "{style}: {out}"
        );
    }
}

#[test]
fn whole_program_on_a_prepared_binary() {
    let bin = prepared("patchable");
    let b = bin.to_str().unwrap();
    let o = weft(
        &[
            "-v",
            "-e",
            &format!("uprobe:{b}:* {{ @[func] = count(); }}"),
            "-c",
            b,
        ],
        T,
    );
    let out = ok(&o);
    for (f, n) in [
        ("leaf", 100),
        ("mid", 10),
        ("classify", 30),
        ("fib", 177),
        ("touch", 25),
        ("main", 1),
    ] {
        assert!(out.contains(&format!("@[{f}]: {n}\n")), "{f}: {out}");
    }
}

#[test]
fn attach_to_a_prepared_process_and_detach_restores_its_nops() {
    // The coldpatched program, kept alive: its code must equal the file again after.
    let bin = prepared("coldpatched");
    let b = bin.to_str().unwrap();
    let mut t = Spawned::start(&bin, &["linger"]);
    // Attach once it has run its program through (not while it may still be starting).
    t.wait_line("gated runs", T);
    // Leave once a few runs were counted, however long those take on this machine.
    let prog = format!("uprobe:{b}:* {{ @c = count(); }} uretprobe:{b}:* {{ @r = count(); }} interval:ms:200 /@c > 1000/ {{ exit(); }}");
    let o = weft(&["-v", "-e", &prog, "-p", &t.pid().to_string()], T);
    let out = ok(&o);
    // Each run() is 10 mid + 100 leaf + 25 touch + 30 classify + 177 fib + ... calls,
    // and every entry was counted with its exit (count-only exits need no hijack).
    let (c, r) = (map_value(&out, "@c"), map_value(&out, "@r"));
    assert!(c.is_some_and(|c| c > 350), "{out}");
    assert!(r.is_some_and(|r| r.abs_diff(c.unwrap()) <= 400), "{out}");
    std::thread::sleep(Duration::from_millis(100));
    let st = t.child.try_wait().unwrap();
    assert!(st.is_none(), "target alive: {st:?}");
    assert!(code_matches_file(t.pid(), &bin), "placeholders restored");
}
