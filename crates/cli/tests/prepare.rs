//! `weft prepare` (issue 23): binaries built with no instrumentation flag, rewritten
//! so each function's entry jumps to a stub holding a NOP placeholder. The prepared
//! program runs as the original does; weft weaves its probes at the stubs'
//! placeholders with exact counts, and detaching leaves its code as in the file.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::*;

const T: Duration = Duration::from_secs(60);

/// The plain build of prepared_calls.c (no placeholder of any kind) and its prepared
/// copy, built once.
fn app() -> (PathBuf, PathBuf) {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _g = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("prepare");
    std::fs::create_dir_all(&dir).unwrap();
    let (plain, prep) = (dir.join("app"), dir.join("app.prep"));
    // Prepared again whenever weft is newer than the copy.
    let mtime = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    if !prep.is_file() || mtime(&prep) < mtime(&weft_bin()) {
        let root = repo_root();
        let st = Command::new("gcc")
            .args(["-O2", "-I"])
            .arg(root.join("include"))
            .arg(root.join("tests/targets/prepared_calls.c"))
            .arg("-o")
            .arg(&plain)
            .status()
            .unwrap();
        assert!(st.success());
        let o = prepare(&[plain.to_str().unwrap(), "-o", prep.to_str().unwrap()]);
        assert!(o.status.success(), "{}", text(&o.stderr));
    }
    (plain, prep)
}

fn prepare(args: &[&str]) -> std::process::Output {
    Command::new(weft_bin())
        .arg("prepare")
        .args(args)
        .output()
        .unwrap()
}

fn run_bytes(cmd: &mut Command) -> Vec<u8> {
    let o = cmd.output().unwrap();
    assert!(o.status.success(), "{cmd:?}: {}", text(&o.stderr));
    o.stdout
}

#[test]
fn prepared_program_runs_identically_and_lists_the_same_functions() {
    let (plain, prep) = app();
    assert_eq!(
        run_bytes(&mut Command::new(&plain)),
        run_bytes(&mut Command::new(&prep))
    );
    // `weft list` sees the same functions.
    let list = |bin: &Path| {
        let o = weft(&["list", &format!("uprobe:{}:*", bin.display())], T);
        ok(&o).replace(prep.to_str().unwrap(), plain.to_str().unwrap())
    };
    assert_eq!(list(&plain), list(&prep));
    // The probe list: one entry stub per prepared function.
    let o = Command::new(weft_bin())
        .args(["coldpatch", "--list"])
        .arg(&prep)
        .output()
        .unwrap();
    let listed = ok(&o);
    for f in [
        "main", "run", "leaf", "mid", "touch", "classify", "fib", "summary",
    ] {
        assert!(
            listed
                .lines()
                .any(|l| l.ends_with(&format!(" entry-stub {f}"))),
            "{f}: {listed}"
        );
    }
    // readelf and gdb read it: gdb stops at fib and shows the jump to the stub.
    let o = Command::new("readelf")
        .arg("-aW")
        .arg(&prep)
        .output()
        .unwrap();
    assert!(
        o.status.success() && o.stderr.is_empty(),
        "{}",
        text(&o.stderr)
    );
    let o = Command::new("gdb")
        .args([
            "-nx",
            "-batch",
            "-ex",
            "break fib",
            "-ex",
            "run",
            "-ex",
            "x/i $pc",
        ])
        .arg(&prep)
        .output();
    if let Ok(o) = o {
        let out = text(&o.stdout);
        assert!(out.contains("<fib>:\tjmp"), "gdb: {out}{}", text(&o.stderr));
    }
}

#[test]
fn probes_count_exactly_at_the_stub_placeholders() {
    let (_, prep) = app();
    let b = prep.to_str().unwrap();
    let prog = format!(
        "uprobe:{b}:fib {{ @fib = count(); }} uprobe:{b}:leaf {{ @leaf = count(); @x = sum(arg0); }} \
         uretprobe:{b}:leaf {{ @lr = sum(retval); }} uretprobe:{b}:classify {{ @[(int32)retval] = count(); }} \
         uprobe:{b}:mid {{ @mid = count(); }} uprobe:{b}:touch {{ @ip[reg(\"ip\") > 0] = count(); }}"
    );
    let o = weft(&["-v", "-e", &prog, "-c", b], T);
    let out = ok(&o);
    assert!(out.starts_with("mid total 10000\n"), "{out}");
    let v = |m: &str| map_value(&out, m);
    assert_eq!(v("@fib"), Some(177), "{out}");
    assert_eq!(
        (v("@leaf"), v("@x"), v("@lr")),
        (Some(100), Some(4950), Some(10000))
    );
    assert_eq!(v("@mid"), Some(10));
    assert!(out.contains("@[-1]: 10\n") && out.contains("@[0]: 1\n") && out.contains("@[1]: 19\n"));
    assert!(out.contains("@ip[true]: 25\n"), "{out}");
    let err = text(&o.stderr);
    // Counting and argument-reading advice run at the stubs' placeholders...
    for f in ["fib", "leaf", "mid"] {
        let line = err
            .lines()
            .find(|l| l.starts_with(&format!("weft: uprobe:{b}:{f} (entry placeholder) at ")))
            .unwrap_or_else(|| panic!("{f}: {err}"));
        assert!(line.contains("jump over a NOP placeholder"), "{line}");
    }
    // ...advice reading `reg("ip")` at the function's real entry (its jump to the
    // stub, relocated), and returns by the hijack.
    assert!(
        err.contains(&format!("weft: uprobe:{b}:touch at ")),
        "{err}"
    );
    assert!(
        err.contains(&format!("uretprobe:{b}:leaf: return-address hijack")),
        "{err}"
    );

    // An offset inside the bytes moved to the stub would never fire: refused.
    let o = weft(
        &[
            "-e",
            &format!("uprobe:{b}:fib+2 {{ @ = count(); }}"),
            "-c",
            b,
        ],
        T,
    );
    let err = text(&o.stderr);
    assert!(!o.status.success(), "{err}");
    assert!(err.contains("moved to a stub"), "{err}");
}

/// Advice reading arguments runs at the stub's placeholder, which sees the entry
/// state: register and stack arguments alike.
#[test]
fn register_and_stack_arguments_at_the_stub() {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("prepare-args");
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join("many.c");
    std::fs::write(
        &src,
        "#include <stdio.h>\n\
         __attribute__((noipa)) long many(long a, long b, long c, long d, long e, long f, long g, long h)\n\
         { return a + b + c + d + e + f + g * h; }\n\
         int main(void) { long s = 0; for (long i = 0; i < 10; i++) s += many(i, 1, 2, 3, 4, 5, i * 10, 7);\n\
         printf(\"%ld\\n\", s); return 0; }\n",
    )
    .unwrap();
    let (plain, prep) = (dir.join("many"), dir.join("many.prep"));
    assert!(Command::new("gcc")
        .arg("-O2")
        .arg(&src)
        .arg("-o")
        .arg(&plain)
        .status()
        .unwrap()
        .success());
    let o = prepare(&[plain.to_str().unwrap(), "-o", prep.to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let b = prep.to_str().unwrap();
    let prog = format!("uprobe:{b}:many {{ @a = sum(arg0); @g = sum(arg6); @h = sum(arg7); }}");
    let o = weft(&["-v", "-e", &prog, "-c", b], T);
    let out = ok(&o);
    assert!(out.starts_with("3345\n"), "{out}");
    let v = |m: &str| map_value(&out, m);
    assert_eq!(
        (v("@a"), v("@g"), v("@h")),
        (Some(45), Some(450), Some(70)),
        "{out}"
    );
    assert!(
        text(&o.stderr).contains(&format!("uprobe:{b}:many (entry placeholder)")),
        "{}",
        text(&o.stderr)
    );
}

#[test]
fn whole_program_weave_on_a_prepared_binary() {
    let (_, prep) = app();
    let b = prep.to_str().unwrap();
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
        ("run", 1),
        ("main", 1),
        ("twelve", 1),
    ] {
        assert!(out.contains(&format!("@[{f}]: {n}\n")), "{f}: {out}");
    }
    let err = text(&o.stderr);
    assert_eq!(err.matches("(entry placeholder)").count(), 8, "{err}");
}

/// `weft record` (entry and return probes on every function) on a prepared binary:
/// the same calls as on the original, and the program runs to its end (the entry
/// point stays unprepared: a return probe there must see it never returns).
#[test]
fn record_a_prepared_binary() {
    let (plain, prep) = app();
    let dir = prep.parent().unwrap().join("record");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let report = |bin: &Path, name: &str| {
        let out = dir.join(name);
        let o = Command::new(weft_bin())
            .args(["record", "-o"])
            .arg(&out)
            .arg("--")
            .arg(bin)
            .output()
            .unwrap();
        let stdout = ok(&o);
        assert!(stdout.starts_with("mid total 10000\n"), "{name}: {stdout}");
        let o = Command::new(weft_bin())
            .arg("report")
            .arg(&out)
            .output()
            .unwrap();
        // Function name → calls.
        let mut calls: Vec<(String, String)> = ok(&o)
            .lines()
            .skip(2)
            .filter_map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                (f.len() >= 2).then(|| (f[f.len() - 1].to_string(), f[f.len() - 8].to_string()))
            })
            .collect();
        calls.sort();
        calls
    };
    let (a, b) = (report(&plain, "plain.rec"), report(&prep, "prep.rec"));
    assert_eq!(a, b);
    assert!(b.contains(&("fib".to_string(), "177".to_string())), "{b:?}");
}

#[test]
fn attach_and_detach_leave_the_code_as_in_the_file() {
    let (_, prep) = app();
    let b = prep.to_str().unwrap();
    let mut t = Spawned::start(&prep, &["linger"]);
    t.wait_line("gated runs", T);
    let prog = format!(
        "uprobe:{b}:* {{ @c = count(); }} uretprobe:{b}:fib {{ @r = count(); }} interval:ms:200 /@c > 1000/ {{ exit(); }}"
    );
    let o = weft(&["-v", "-e", &prog, "-p", &t.pid().to_string()], T);
    let out = ok(&o);
    assert!(map_value(&out, "@c").is_some_and(|c| c > 1000), "{out}");
    assert!(map_value(&out, "@r").is_some_and(|r| r > 0), "{out}");
    assert!(t.child.try_wait().unwrap().is_none(), "target alive");
    // Every executable mapping of the file (its text and the stubs) is as on disk.
    assert!(
        code_restored_within(t.pid(), &prep, T),
        "code differs from the file after detach"
    );
    t.wait_line("gated runs", T);
}

#[test]
fn bad_inputs_are_refused_with_one_line() {
    let (plain, prep) = app();
    let dir = prep.parent().unwrap();
    let out = dir.join("never-written");
    let refuse = |bin: &Path, extra: &[&str], want: &str| {
        let mut args = vec![bin.to_str().unwrap(), "-o", out.to_str().unwrap()];
        args.extend_from_slice(extra);
        let o = prepare(&args);
        let err = text(&o.stderr);
        assert!(!o.status.success(), "{}: {err}", bin.display());
        assert!(err.contains(want), "{}: {err}", bin.display());
        assert_eq!(err.trim_end().lines().count(), 1, "{err}");
        assert!(!out.exists(), "{} written", out.display());
    };
    refuse(&prep, &[], "is already prepared");
    refuse(&plain, &["--functions", "no_such_*"], "no function of");
    let stripped = dir.join("app.stripped");
    std::fs::copy(&plain, &stripped).unwrap();
    assert!(Command::new("strip")
        .arg(&stripped)
        .status()
        .unwrap()
        .success());
    refuse(&stripped, &[], "stripped beyond .dynsym");
    // Debian's gzip is stripped and exports nothing.
    if Path::new("/usr/bin/gzip").exists() {
        refuse(Path::new("/usr/bin/gzip"), &[], "stripped beyond .dynsym");
    }
    let mut arm = std::fs::read(&plain).unwrap();
    arm[18..20].copy_from_slice(&183u16.to_le_bytes());
    let arm_path = dir.join("app.aarch64");
    std::fs::write(&arm_path, arm).unwrap();
    refuse(&arm_path, &[], "AArch64");
    refuse(&dir.join("no-such-file"), &[], "cannot read");
    // The count is always printed, the reasons with -v.
    let o = prepare(&[
        plain.to_str().unwrap(),
        "-o",
        dir.join("app.v").to_str().unwrap(),
        "-v",
    ]);
    assert!(o.status.success());
    assert!(
        text(&o.stdout).contains(" functions prepared, "),
        "{}",
        text(&o.stdout)
    );
    assert!(
        text(&o.stderr).contains("left as it was: twelve"),
        "{}",
        text(&o.stderr)
    );
}

/// A real Debian program: xz with its library, liblzma (stripped: prepared through
/// `.dynsym`), compresses and decompresses byte for byte as with the original, and
/// `lzma_code` counts the same number of calls through the placeholder as through
/// the original library's entry.
#[test]
fn xz_with_a_prepared_liblzma() {
    let lib = Path::new("/usr/lib/x86_64-linux-gnu/liblzma.so.5");
    // scripts/setup installs them: missing, the test fails rather than skip.
    assert!(
        lib.exists() && Path::new("/usr/bin/xz").exists(),
        "xz and liblzma are not installed (scripts/setup installs them)"
    );
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("prepare-xz");
    let _ = std::fs::remove_dir_all(&dir);
    let libdir = dir.join("lib");
    std::fs::create_dir_all(&libdir).unwrap();
    let prepared = libdir.join("liblzma.so.5");
    let o = prepare(&[lib.to_str().unwrap(), "-o", prepared.to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert!(text(&o.stderr).contains(".dynsym"), "{}", text(&o.stderr));
    // Some compressible, deterministic input.
    let mut data = Vec::new();
    let mut x: u32 = 1;
    while data.len() < 1 << 21 {
        x = x.wrapping_mul(1_103_515_245).wrapping_add(12345);
        data.extend_from_slice(
            format!("line {} value {}\n", data.len() / 7, (x >> 16) % 1000).as_bytes(),
        );
    }
    let input = dir.join("data");
    std::fs::write(&input, &data).unwrap();
    let xz = |lib: Option<&Path>, args: &[&str]| {
        let mut c = Command::new("/usr/bin/xz");
        c.args(args);
        if let Some(l) = lib {
            c.env("LD_LIBRARY_PATH", l);
        }
        run_bytes(&mut c)
    };
    let i = input.to_str().unwrap();
    let reference = xz(None, &["-T1", "-c", i]);
    let compressed = xz(Some(&libdir), &["-T1", "-c", i]);
    assert!(reference == compressed, "compressed output differs");
    let packed = dir.join("data.xz");
    std::fs::write(&packed, &compressed).unwrap();
    assert!(xz(Some(&libdir), &["-dc", packed.to_str().unwrap()]) == data);

    // With weft: the same number of lzma_code calls either way.
    let count = |lib_path: &Path, env: &[(&str, &str)]| {
        let cmd = format!("/usr/bin/xz -T1 -k -f {i}");
        let prog = format!(
            "uprobe:{}:lzma_code {{ @n = count(); }}",
            lib_path.display()
        );
        let o = weft_with_input(&["-v", "-e", &prog, "-c", &cmd], env, b"", T);
        let out = ok(&o);
        (map_value(&out, "@n"), text(&o.stderr))
    };
    let (original, _) = count(lib, &[]);
    let (woven, err) = count(&prepared, &[("LD_LIBRARY_PATH", libdir.to_str().unwrap())]);
    assert!(original.is_some_and(|n| n > 0), "{original:?}");
    assert_eq!(original, woven, "{err}");
    assert!(err.contains("lzma_code (entry placeholder)"), "{err}");
}

/// A large real program with a full symbol table: weft itself (Rust, tens of
/// thousands of functions, jump tables, landing pads). The prepared weft prepares
/// and lists exactly as the original does.
#[test]
fn weft_prepares_itself() {
    let (plain, _) = app();
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("prepare-self");
    std::fs::create_dir_all(&dir).unwrap();
    let me = dir.join("weft.prep");
    let o = prepare(&[weft_bin().to_str().unwrap(), "-o", me.to_str().unwrap()]);
    let summary = ok(&o);
    let prepared: usize = summary
        .split(": ")
        .nth(1)
        .and_then(|s| s.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    assert!(prepared > 5000, "{summary}");
    let run = |weft: &Path, args: &[&str]| {
        let o = Command::new(weft).args(args).output().unwrap();
        assert!(
            o.status.success(),
            "{}: {}",
            weft.display(),
            text(&o.stderr)
        );
        o.stdout
    };
    let (a, b) = (dir.join("app.a"), dir.join("app.b"));
    let p = plain.to_str().unwrap();
    run(&weft_bin(), &["prepare", p, "-o", a.to_str().unwrap()]);
    run(&me, &["prepare", p, "-o", b.to_str().unwrap()]);
    assert!(std::fs::read(&a).unwrap() == std::fs::read(&b).unwrap());
    let list = format!("uprobe:{p}:*");
    assert_eq!(
        run(&weft_bin(), &["list", &list]),
        run(&me, &["list", &list])
    );
    let begin = "BEGIN { printf(\"%d\\n\", 6 * 7); exit(); }";
    let out = run(&me, &["-e", begin]);
    assert!(out.starts_with(b"42\n"));
    assert_eq!(out, run(&weft_bin(), &["-e", begin]));
}
