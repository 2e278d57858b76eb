//! Around advice (`around uprobe:BIN:FUNC { ... proceed() ... return EXPR; }`) and
//! `override(EXPR)` in return probes: advice that decides what a function does —
//! skip it, call it with new arguments, replace its result — checked against what
//! the target itself prints (tests/targets/around.c).

mod common;

use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use common::*;

const T: Duration = Duration::from_secs(120);

fn target(opt: &'static str) -> PathBuf {
    build(
        "around.c",
        Variant {
            opt,
            pie: true,
            cet: true,
        },
        &[],
    )
}

/// The target's own lines (`check test 0`, `compute sum 4570`, ...) as printed.
fn line<'a>(stdout: &'a str, prefix: &str) -> &'a str {
    stdout
        .lines()
        .find(|l| l.starts_with(prefix))
        .unwrap_or_else(|| panic!("no line {prefix:?} in:\n{stdout}"))
}

fn run(bin: &std::path::Path, prog: &str) -> String {
    let prog = prog.replace("BIN", bin.to_str().unwrap());
    ok(&weft(
        &[
            "trace",
            "--unsafe",
            "-e",
            &prog,
            "-c",
            bin.to_str().unwrap(),
        ],
        T,
    ))
}

/// Without advice: what every other test changes.
#[test]
fn the_workload_as_it_runs_alone() {
    for opt in ["-O0", "-O2"] {
        let out = text(
            &std::process::Command::new(target(opt))
                .output()
                .unwrap()
                .stdout,
        );
        assert_eq!(
            out,
            "check test 0\ncheck secret 1\ncheck wrong 0\ncompute sum 4570\nmany 204\n\
             scale 6\nfact 120\ntouched 10\n"
        );
    }
}

/// Seed example: an around advice that skips the check for one password and
/// returns 1; the others run the original.
#[test]
fn around_skips_the_original_and_sets_the_result() {
    for opt in ["-O0", "-O2"] {
        let bin = target(opt);
        let out = run(
            &bin,
            r#"around uprobe:BIN:check_password /str(arg0) == "test"/ { @bypassed = count(); return 1; }"#,
        );
        assert_eq!(line(&out, "check test"), "check test 1", "{opt}\n{out}");
        assert_eq!(line(&out, "check secret"), "check secret 1", "{opt}");
        assert_eq!(line(&out, "check wrong"), "check wrong 0", "{opt}");
        assert_eq!(map_value(&out, "@bypassed"), Some(1), "{opt}\n{out}");
        // A void function skipped: its side effect never happens.
        let out = run(&bin, "around uprobe:BIN:touch { @skipped = count(); }");
        assert_eq!(line(&out, "touched"), "touched 0", "{opt}");
        assert_eq!(map_value(&out, "@skipped"), Some(10), "{opt}\n{out}");
    }
}

/// `proceed()` calls the original once; its value is the advice's to use, and is
/// what the caller gets when the advice returns nothing else.
#[test]
fn proceed_calls_the_original_and_hands_back_its_result() {
    for opt in ["-O0", "-O2"] {
        let bin = target(opt);
        let out = run(
            &bin,
            "around uprobe:BIN:compute { $t = nsecs; $r = proceed(); \
             @ns = hist(nsecs - $t); @sum = sum($r); return $r; }",
        );
        assert_eq!(
            line(&out, "compute sum"),
            "compute sum 4570",
            "{opt}\n{out}"
        );
        assert_eq!(map_value(&out, "@sum"), Some(4570), "{opt}\n{out}");
        assert!(out.contains("@ns:"), "{out}");
        // No return: the original's value. A second proceed() returns the first's
        // value without calling again.
        let out = run(
            &bin,
            "uprobe:BIN:compute { @entries = count(); } \
             around uprobe:BIN:compute { $a = proceed(); $b = proceed(); @same = sum($a == $b); }",
        );
        assert_eq!(
            line(&out, "compute sum"),
            "compute sum 4570",
            "{opt}\n{out}"
        );
        assert_eq!(map_value(&out, "@same"), Some(10), "{opt}\n{out}");
        assert_eq!(map_value(&out, "@entries"), Some(10), "{opt}\n{out}");
    }
}

/// `proceed(arg0, 42)`: new first arguments, the rest as the caller passed them,
/// stack arguments included; a floating-point result comes back whole.
#[test]
fn proceed_with_new_arguments_and_results_of_every_kind() {
    for opt in ["-O0", "-O2"] {
        let bin = target(opt);
        let out = run(
            &bin,
            "around uprobe:BIN:compute { return proceed(arg0, 42); } \
             around uprobe:BIN:many { return proceed(10); } \
             around uprobe:BIN:scale { @scaled = count(); }",
        );
        // sum(100 i + 42) for i in 0..10; many with a = 10: 204 - 1 + 10.
        assert_eq!(
            line(&out, "compute sum"),
            "compute sum 4920",
            "{opt}\n{out}"
        );
        assert_eq!(line(&out, "many"), "many 213", "{opt}\n{out}");
        // scale() skipped: the advice returns 0 in rax, and xmm0 stays as the
        // caller passed it (1.5, the first argument).
        assert_eq!(map_value(&out, "@scaled"), Some(1), "{opt}\n{out}");
        let out = run(&bin, "around uprobe:BIN:scale { $r = proceed(); }");
        assert_eq!(line(&out, "scale"), "scale 6", "{opt}\n{out}");
        let out = run(&bin, "around uprobe:BIN:many { return proceed(); }");
        assert_eq!(line(&out, "many"), "many 204", "{opt}\n{out}");
    }
}

/// A recursive function under around advice: every level runs the advice (probes
/// fire inside `proceed`), and entry and return probes on it see every call.
#[test]
fn around_on_a_recursion_with_entry_and_return_probes() {
    for opt in ["-O0", "-O2"] {
        let bin = target(opt);
        let out = run(
            &bin,
            "uprobe:BIN:fact { @entries = count(); } \
             uretprobe:BIN:fact { @rets = count(); @last = max(retval); } \
             around uprobe:BIN:fact { @arounds = count(); return proceed(); }",
        );
        assert_eq!(line(&out, "fact"), "fact 120", "{opt}\n{out}");
        // -O2 may turn the recursion into a loop: then one call.
        let calls = if opt == "-O0" {
            5
        } else {
            map_value(&out, "@entries").unwrap()
        };
        assert!(calls == 5 || calls == 1, "{out}");
        assert_eq!(map_value(&out, "@entries"), Some(calls), "{opt}\n{out}");
        assert_eq!(map_value(&out, "@arounds"), Some(calls), "{opt}\n{out}");
        assert_eq!(map_value(&out, "@rets"), Some(calls), "{opt}\n{out}");
        assert_eq!(map_value(&out, "@last"), Some(120), "{opt}\n{out}");
        // The return probe sees what around advice returned.
        let out = run(
            &bin,
            "uretprobe:BIN:compute { @got = sum(retval); } \
             around uprobe:BIN:compute { return 1; }",
        );
        assert_eq!(line(&out, "compute sum"), "compute sum 10", "{opt}\n{out}");
        assert_eq!(map_value(&out, "@got"), Some(10), "{opt}\n{out}");
    }
}

/// `override(EXPR)` in a return probe replaces the value the caller gets.
#[test]
fn override_replaces_a_return_value() {
    for opt in ["-O0", "-O2"] {
        let bin = target(opt);
        let out = run(
            &bin,
            "uretprobe:BIN:compute { override(retval + 1); } \
             uretprobe:BIN:check_password { override(1); }",
        );
        assert_eq!(
            line(&out, "compute sum"),
            "compute sum 4580",
            "{opt}\n{out}"
        );
        assert_eq!(line(&out, "check wrong"), "check wrong 1", "{opt}\n{out}");
    }
}

/// weft ends while a thread is blocked inside `proceed` (the original waits on
/// stdin): the sites are restored at once, weft waits for the thread to leave the
/// advice's code, then gives up saying so and leaves that code mapped; the call
/// completes through the advice later, and the program runs on unwoven.
#[test]
fn weft_ends_while_a_thread_is_blocked_inside_proceed() {
    let bin = target("-O2");
    let mut child = std::process::Command::new(&bin)
        .arg("wait")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id() as i32;
    let mut stdout = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut stdin = child.stdin.take().unwrap();
    let mut l = String::new();
    std::io::BufRead::read_line(&mut stdout, &mut l).unwrap();
    assert_eq!(l, "ready\n");
    let prog = format!(
        "around uprobe:{b}:wait_line {{ printf(\"inside\\n\"); $n = proceed(); return $n + 100; }} \
         around uprobe:{b}:compute {{ return 1; }} \
         interval:ms:10 /@live == 0/ {{ @live = 1; printf(\"live\\n\"); }}",
        b = bin.display()
    );
    let mut w = Background::start(&["trace", "--unsafe", "-p", &pid.to_string(), "-e", &prog]);
    // Interval probes run once the sites are patched.
    w.wait_line("live", false, T);
    stdin.write_all(b"go\n").unwrap();
    w.wait_line("inside", false, T);
    w.signal(libc::SIGINT);
    let out = w.finish(T);
    let err = text(&out.stderr);
    assert!(err.contains("leaving its code mapped"), "{err}");
    assert!(code_matches_file(pid, &bin), "sites left in the code");
    stdin.write_all(b"xy\n").unwrap();
    drop(stdin);
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut stdout, &mut rest).unwrap();
    // read() got 3 bytes, the advice added 100; compute() is the file's again.
    assert_eq!(rest, "read 103\ncompute 304\n");
    assert!(child.wait().unwrap().success());
}

#[test]
fn around_refusals_are_located() {
    let bin = target("-O2");
    let b = bin.to_str().unwrap();
    for (args, want) in [
        (
            vec!["trace", "-e", "around uprobe:BIN:compute { return 1; }"],
            "around advice changes what the program does: it needs --unsafe\n --> -e:1:1",
        ),
        (
            vec![
                "trace",
                "--unsafe",
                "-e",
                "around uretprobe:BIN:compute { return 1; }",
            ],
            "around advice goes on a function's entry (`uprobe:BIN:FUNC`) or its call sites (`call:BIN:FUNC`), not `uretprobe:",
        ),
        (
            vec![
                "trace",
                "--unsafe",
                "-e",
                "around uprobe:BIN:compute+4 { return 1; }",
            ],
            "around advice goes on a function's entry",
        ),
        (
            vec![
                "trace",
                "--unsafe",
                "-e",
                "uprobe:BIN:compute { $x = proceed(); }",
            ],
            "error: proceed() is only for around advice",
        ),
        (
            vec!["trace", "-e", "uretprobe:BIN:compute { override(1); }"],
            "override() needs --unsafe",
        ),
        (
            vec![
                "trace",
                "--unsafe",
                "-e",
                "uprobe:BIN:compute { override(1); }",
            ],
            "override() can only be used in",
        ),
        (
            vec![
                "trace",
                "--unsafe",
                "-e",
                "around uprobe:BIN:compute { return 1; } around uprobe:BIN:compute { return 2; }",
            ],
            "two around advices on compute",
        ),
    ] {
        let args: Vec<String> = args.iter().map(|a| a.replace("BIN", b)).collect();
        let mut args: Vec<&str> = args.iter().map(String::as_str).collect();
        args.extend(["-c", b]);
        let o = weft(&args, T);
        let err = text(&o.stderr);
        assert!(!o.status.success(), "{args:?} succeeded");
        assert!(err.contains(want), "{args:?}: want {want:?} in:\n{err}");
    }
}

/// Around advice at call sites (`around call:BIN:FUNC [within CALLER]`): the calls
/// of one caller are replaced, the others run as they are; a library function
/// called through the PLT too.
#[test]
fn around_at_call_sites_replaces_one_callers_calls() {
    for opt in ["-O0", "-O2"] {
        let bin = build(
            "callsite.c",
            Variant {
                opt,
                pie: true,
                cet: true,
            },
            &[],
        );
        let b = bin.to_str().unwrap();
        // work() is called 20 times, 5 of them by beta; strtol 4 times (1+20+300+4000).
        let prog = format!(
            "around call:{b}:work within beta {{ @skipped = count(); return 0; }} \
             around call:{b}:work within alpha {{ $r = proceed(arg0, 1); @r = sum($r); return $r; }} \
             around call:{b}:strtol {{ return 1; }}"
        );
        let out = ok(&weft(&["trace", "--unsafe", "-e", &prog, "-c", b], T));
        assert!(out.contains("works=15 parsed=4"), "{opt}\n{out}");
        assert_eq!(map_value(&out, "@skipped"), Some(5), "{opt}\n{out}");
        // work(i, 1) for i in 0..3.
        assert_eq!(map_value(&out, "@r"), Some(3), "{opt}\n{out}");
    }
}

/// Around advice that ends by proceeding with new arguments runs only before the
/// call: it is woven as entry advice that sets the arguments (inline: the live
/// registers, and the head's saved rdx and rcx it puts back), all evaluated from
/// the caller's before any is set; the same results with the generic path.
#[test]
fn around_that_proceeds_with_new_arguments_is_woven_as_entry_advice() {
    for opt in ["-O0", "-O2"] {
        let bin = target(opt);
        let b = bin.to_str().unwrap();
        let prog = "around uprobe:BIN:many { return proceed(arg5, arg4, arg3, arg2, arg1, arg0); } \
                    around uprobe:BIN:compute /arg0 % 2 == 0/ { @c = count(); \
                                                               return proceed(arg0, arg1 + arg0); }"
            .replace("BIN", b);
        let mut wovens = Vec::new();
        for flags in [&["-v"][..], &["-v", "--no-inline"][..]] {
            let mut args = vec!["trace", "--unsafe"];
            args.extend_from_slice(flags);
            args.extend_from_slice(&["-e", &prog, "-c", b]);
            let o = weft(&args, T);
            let out = ok(&o);
            let what = format!("{opt} {flags:?}\n{out}");
            // many(6, 5, 4, 3, 2, 1, 7, 8): the first six reversed, the stack's two kept.
            assert_eq!(line(&out, "many"), "many 169", "{what}");
            // compute(i, 7 + i) for the even i, compute(i, 7) for the odd.
            assert_eq!(line(&out, "compute sum"), "compute sum 4590", "{what}");
            assert_eq!(map_value(&out, "@c"), Some(5), "{what}");
            let err = text(&o.stderr);
            let how = |f: &str| {
                err.lines()
                    .find(|l| l.starts_with(&format!("weft: uprobe:{b}:{f} at ")))
                    .and_then(|l| l.rsplit_once(": "))
                    .map(|(_, how)| how.to_string())
                    .unwrap_or_else(|| panic!("{err}"))
            };
            wovens.push((how("many"), how("compute")));
        }
        // Inline: entry advice (around advice proper is never inline), for both.
        assert!(
            wovens[0].0.ends_with("(advice inline)") && wovens[0].1.ends_with("(advice inline)"),
            "{wovens:?}"
        );
    }
}

/// Around advice that proceeds with the caller's arguments and returns the result
/// only observes: it is woven exactly as an entry probe (what `-v` says of the
/// site is the same), and still runs at every call.
#[test]
fn observe_only_around_is_woven_as_entry_advice() {
    let bin = target("-O2");
    let b = bin.to_str().unwrap();
    let site = |prog: &str| {
        let o = weft(
            &[
                "trace",
                "-v",
                "--unsafe",
                "-e",
                &prog.replace("BIN", b),
                "-c",
                b,
            ],
            T,
        );
        let out = ok(&o);
        assert_eq!(map_value(&out, "@c"), Some(10), "{prog}\n{out}");
        assert_eq!(line(&out, "compute sum"), "compute sum 4570", "{out}");
        // `weft: uprobe:BIN:compute at 0xADDR: HOW`, without the address.
        let err = text(&o.stderr);
        let l = err
            .lines()
            .find(|l| l.starts_with(&format!("weft: uprobe:{b}:compute at ")))
            .unwrap_or_else(|| panic!("{err}"))
            .to_string();
        l.split_once(": ")
            .unwrap()
            .1
            .split_once(": ")
            .unwrap()
            .1
            .to_string()
    };
    let entry = site("uprobe:BIN:compute { @c = count(); }");
    assert_eq!(
        site("around uprobe:BIN:compute { @c = count(); return proceed(); }"),
        entry
    );
}
