//! Call-site pointcuts (`call:BIN:FUNC [within CALLER]`, Arachne's `call`): advice at
//! each call of a function, in the caller, woven by rewriting the call to reach a
//! per-site stub. `tests/targets/callsite.c` calls `work` 3, 5, 7, 2, 1 and 1 times
//! from alpha, beta, gamma_, delta, eta and iota (once more through a pointer) and
//! `strtol` 4 times from parse, and prints what it did.

mod common;

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::*;

const T: Duration = Duration::from_secs(120);

/// What the target prints when its workload is done.
const DONE: &str = "alpha=3 beta=5 gamma_=7 delta=2 eta=1 iota=1 indirect=1 works=20 parsed=4321";

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn counts(pairs: &[(&str, i64)]) -> BTreeMap<String, i64> {
    pairs.iter().map(|&(k, v)| (k.to_string(), v)).collect()
}

/// The direct calls of `work` per caller.
fn per_caller() -> BTreeMap<String, i64> {
    counts(&[
        ("alpha", 3),
        ("beta", 5),
        ("gamma_", 7),
        ("delta", 2),
        ("eta", 1),
        ("iota", 1),
    ])
}

fn o2() -> std::path::PathBuf {
    build("callsite.c", Variant::O2_PIE, &[])
}

/// `callsite wait`: started before weft, told to run (and to end) by a line on its
/// stdin.
struct Waiting(Spawned);

impl Waiting {
    fn start(bin: &Path) -> Waiting {
        let w = Waiting(Spawned::start_piped(bin, &["wait"]));
        w.expect("ready");
        w
    }

    fn pid(&self) -> i32 {
        self.0.pid()
    }

    fn go(&mut self) {
        let stdin = self.0.child.stdin.as_mut().unwrap();
        stdin.write_all(b"go\n").unwrap();
        stdin.flush().unwrap();
    }

    /// The next line the target prints; it must be `want`.
    fn expect(&self, want: &str) {
        let l = self
            .0
            .lines
            .recv_timeout(T)
            .unwrap_or_else(|_| panic!("the target never printed {want:?}"));
        assert_eq!(l, want);
    }

    /// Let it end; it must exit 0.
    fn finish(mut self) {
        self.go();
        let st = self.0.child.wait().unwrap();
        assert!(st.success(), "target: {st}");
    }
}

/// `interval` advice runs in weft once the session runs: the sites are patched and
/// the advice enabled. The test waits for its "up" before letting the target go.
const UP: &str = "interval:ms:10 /@up == 0/ { @up = 1; printf(\"up\\n\"); }";

#[test]
fn counts_per_caller_at_every_level_and_build() {
    for v in all_variants() {
        let bin = build("callsite.c", v, &[]);
        let b = s(&bin);
        let prog = format!(
            "call:{b}:work {{ @[caller] = count(); }} call:{b}:strtol {{ @s[caller] = count(); }}"
        );
        let o = weft(&["-e", &prog, "-c", b], T);
        let out = ok(&o);
        let name = v.name();
        assert!(out.contains(DONE), "{name}: {out}");
        assert_eq!(keyed(&out, "@"), per_caller(), "{name}: {out}");
        // At -O2 parse's call of strtol is a tail jump to its PLT entry.
        assert_eq!(keyed(&out, "@s"), counts(&[("parse", 4)]), "{name}: {out}");
        let err = text(&o.stderr);
        assert!(
            err.contains("Attached 2 probes\nWoven 7 call sites\n"),
            "{name}: {err}"
        );
    }
}

#[test]
fn within_restricts_the_callers() {
    let bin = o2();
    let b = s(&bin);
    let o = weft(
        &[
            "-e",
            &format!("call:{b}:work within beta {{ @c = count(); }}"),
            "-c",
            b,
        ],
        T,
    );
    assert_eq!(map_value(&ok(&o), "@c"), Some(5));
    assert!(text(&o.stderr).contains("Woven 1 call site\n"));
    let prog = format!("call:{b}:work within *ta {{ @[caller] = count(); }}");
    let out = ok(&weft(&["-e", &prog, "-c", b], T));
    let want = counts(&[("beta", 5), ("delta", 2), ("eta", 1), ("iota", 1)]);
    assert_eq!(keyed(&out, "@"), want, "{out}");
}

/// Objdump's direct calls of `callee` in each function of `bin`.
fn objdump_calls(bin: &Path, callee: &str) -> BTreeMap<String, Vec<u64>> {
    let text = String::from_utf8(
        Command::new("objdump")
            .args(["-d", "--no-show-raw-insn", s(bin)])
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap();
    let mut out: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    let mut func = String::new();
    for l in text.lines() {
        if let Some(name) = l.strip_suffix(">:").and_then(|l| l.split_once(" <")) {
            func = name.1.to_string();
        } else if l.contains(&format!("<{callee}>")) && l.contains("call") {
            let addr = l.trim().split(':').next().unwrap();
            out.entry(func.clone())
                .or_default()
                .push(u64::from_str_radix(addr, 16).unwrap());
        }
    }
    out
}

#[test]
fn arguments_ip_func_and_probe_at_the_call_site() {
    // -O0, not PIE: the sites' addresses are the file's, as objdump shows them.
    let v = Variant {
        opt: "-O0",
        pie: false,
        cet: true,
    };
    let bin = build("callsite.c", v, &[]);
    let b = s(&bin);
    let prog = format!(
        "call:{b}:work {{ @a[caller] = sum(arg0); @b[caller] = sum(arg1); \
         @ip[caller] = max(reg(\"ip\")); @f[func] = count(); @p[probe] = count(); }}"
    );
    let out = ok(&weft(&["-e", &prog, "-c", b], T));
    let a = counts(&[
        ("alpha", 3),
        ("beta", 510),
        ("gamma_", 7021),
        ("delta", 15),
        ("eta", 6),
        ("iota", 9),
    ]);
    assert_eq!(keyed(&out, "@a"), a, "{out}");
    let b_sums = counts(&[
        ("alpha", 30),
        ("beta", 100),
        ("gamma_", 210),
        ("delta", 80),
        ("eta", 6),
        ("iota", 9),
    ]);
    assert_eq!(keyed(&out, "@b"), b_sums, "{out}");
    assert_eq!(keyed(&out, "@f"), counts(&[("work", 19)]), "{out}");
    assert_eq!(
        keyed(&out, "@p"),
        counts(&[(&format!("call:{b}:work"), 19)]),
        "{out}"
    );
    let sites = objdump_calls(&bin, "work");
    let ip: BTreeMap<String, i64> = sites
        .iter()
        .map(|(f, a)| (f.clone(), *a.iter().max().unwrap() as i64))
        .collect();
    assert_eq!(ip.len(), 6, "{sites:?}");
    assert_eq!(keyed(&out, "@ip"), ip, "{out}");
}

#[test]
fn call_and_execution_probes_on_the_same_function() {
    let bin = o2();
    let b = s(&bin);
    let prog = format!(
        "call:{b}:work {{ @c[caller] = count(); }} execution:{b}:work {{ @u = count(); }} \
         uretprobe:{b}:work {{ @r = count(); }}"
    );
    let out = ok(&weft(&["-e", &prog, "-c", b], T));
    assert!(out.contains(DONE), "{out}");
    assert_eq!(keyed(&out, "@c"), per_caller(), "{out}");
    // The callee side sees the call through the pointer too.
    assert_eq!(map_value(&out, "@u"), Some(20), "{out}");
    assert_eq!(map_value(&out, "@r"), Some(20), "{out}");
}

#[test]
fn verbose_says_what_is_not_covered() {
    let bin = o2();
    let b = s(&bin);
    let prog = format!("call:{b}:work within gamma_ {{ @c = count(); }}");
    let o = weft(&["-v", "-e", &prog, "-c", b], T);
    assert_eq!(map_value(&ok(&o), "@c"), Some(7));
    let err = text(&o.stderr);
    assert!(
        err.contains(&format!(
            "weft: call:{b}:work within gamma_: 1 call site woven, 1 indirect call not covered\n"
        )),
        "{err}"
    );
    assert!(err.contains("branch retargeted to a stub"), "{err}");
}

#[test]
fn json_reports_the_call_sites() {
    let bin = o2();
    let b = s(&bin);
    let prog = format!("call:{b}:work {{ @c = count(); }}");
    let out = ok(&weft(&["-f", "json", "-e", &prog, "-c", b], T));
    assert!(
        out.contains("{\"type\": \"call_sites\", \"count\": 6, \"data\": {\"sites\": 6}}\n"),
        "{out}"
    );
}

/// Attached to a running process: the sites are woven, fire, and when weft leaves
/// the code is the file's again.
#[test]
fn attach_and_detach_leave_the_code_as_the_file() {
    for opt in ["-O0", "-O2"] {
        let bin = build(
            "callsite.c",
            Variant {
                opt,
                ..Variant::O2_PIE
            },
            &[],
        );
        let b = s(&bin);
        let mut t = Waiting::start(&bin);
        let prog = format!(
            "call:{b}:work {{ @[caller] = count(); }} call:{b}:strtol {{ @s = count(); }} \
             uprobe:{b}:report {{ exit(); }} {UP}"
        );
        let mut w = Background::start(&["-e", &prog, "-p", &t.pid().to_string()]);
        w.wait_line("up", false, T);
        t.go();
        let o = w.finish(T);
        let out = ok(&o);
        assert_eq!(keyed(&out, "@"), per_caller(), "{opt}: {out}");
        assert_eq!(map_value(&out, "@s"), Some(4), "{opt}: {out}");
        t.expect(DONE);
        t.expect("done");
        assert!(code_matches_file(t.pid(), &bin), "{opt}: code differs");
        t.finish();
    }
}

/// weft dies while woven: the agent writes the calls back itself.
#[test]
fn the_agent_restores_the_calls_when_weft_dies() {
    let bin = o2();
    let b = s(&bin);
    let mut t = Waiting::start(&bin);
    let prog = format!("call:{b}:work {{ @c = count(); }} {UP}");
    let mut w = Background::start(&["-e", &prog, "-p", &t.pid().to_string()]);
    w.wait_line("up", false, T);
    assert!(
        !code_matches_file(t.pid(), &bin),
        "the calls are not rewritten"
    );
    w.signal(libc::SIGKILL);
    let _ = w.finish(T);
    assert!(
        code_restored_within(t.pid(), &bin, T),
        "the agent never restored the calls"
    );
    t.go();
    t.expect(DONE);
    t.expect("done");
    t.finish();
}

/// A call inside the bytes another probe patches is woven once: at -O2 eta is
/// `endbr64; jmp work` (a uprobe on eta patches the call itself: the call site is
/// not woven, and says why) and iota is `endbr64; mov rsi, rdi; jmp work` (the jump
/// a uprobe on iota would write covers the call: the uprobe takes an int3 instead).
#[test]
fn a_call_in_bytes_another_probe_patches_is_not_patched_twice() {
    let bin = o2();
    let b = s(&bin);
    let prog = format!(
        "uprobe:{b}:eta {{ @e = count(); }} uprobe:{b}:iota {{ @i = count(); }} \
         call:{b}:work within eta {{ @ce = count(); }} \
         call:{b}:work within iota {{ @ci = count(); }}"
    );
    let o = weft(&["-v", "-e", &prog, "-c", b], T);
    let out = ok(&o);
    let err = text(&o.stderr);
    assert!(out.contains(DONE), "{out}");
    assert_eq!(map_value(&out, "@e"), Some(1), "{out}");
    assert_eq!(map_value(&out, "@i"), Some(1), "{out}");
    assert_eq!(map_value(&out, "@ci"), Some(1), "{out}");
    assert_eq!(map_value(&out, "@ce"), Some(0), "{out}");
    assert!(
        err.contains(&format!("call:{b}:work in eta not woven: the call at "))
            && err.contains(&format!("lies in the bytes uprobe:{b}:eta patches at ")),
        "{err}"
    );
    assert!(
        err.contains(&format!("uprobe:{b}:iota at "))
            && err.contains(": int3 (another probe site at "),
        "{err}"
    );
    assert!(err.contains("Woven 1 call site\n"), "{err}");
}

fn fails_with(o: &std::process::Output, needle: &str) {
    assert_eq!(o.status.code(), Some(1), "{}", text(&o.stdout));
    let err = text(&o.stderr);
    assert!(err.contains(needle), "stderr lacks {needle:?}:\n{err}");
}

#[test]
fn bad_call_probes_are_refused_clearly() {
    let bin = o2();
    let b = s(&bin);
    let run = |p: &str| weft(&["-e", p, "-c", b], T);
    fails_with(
        &run(&format!("call:{b}:wrok {{ @c = count(); }}")),
        &format!("call:{b}:wrok: function `wrok` not found in {b}; did you mean `work`?"),
    );
    // A library function the program does not call: close names include imports.
    fails_with(
        &run(&format!("call:{b}:strtoll {{ @c = count(); }}")),
        "did you mean `strtol`?",
    );
    fails_with(
        &run(&format!("call:{b}:work within alpah {{ @c = count(); }}")),
        &format!("call:{b}:work within alpah: function `alpah` not found in {b}"),
    );
    // Defined and never called directly (the C library calls main).
    fails_with(
        &run(&format!("call:{b}:main {{ @c = count(); }}")),
        &format!("call:{b}:main: no direct call of main in {b}"),
    );
    let o = run(&format!("call:{b}:work {{ @c = retval; }}"));
    fails_with(&o, "retval can only be used in uretprobe probes");
    assert!(text(&o.stderr).contains("-e:1:"), "{}", text(&o.stderr));
}
