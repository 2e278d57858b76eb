//! Control-flow pointcuts (`cflow`, `cflow_strict`, Arachne's `controlflow`) and
//! named pointcuts, against `tests/targets/cflow.c`, which counts its own calls
//! (who called whom, inside what): weft's counts must equal the program's, and the
//! numbers its comment derives.

mod common;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;

const T: Duration = Duration::from_secs(120);
/// Rounds the target runs (each the calls its comment lists).
const ROUNDS: i64 = 100;

fn target(variant: Variant) -> String {
    build("cflow.c", variant, &[]).to_str().unwrap().to_string()
}

/// The program's own counts (`name=value ...`).
fn own_counts(stdout: &str) -> BTreeMap<String, i64> {
    key_values(stdout, "foo")
}

/// Run `prog` with `%T` standing for the target, on `ROUNDS` rounds; stdout, and
/// the program's counts checked against what one round does.
fn run(variant: Variant, prog: &str) -> (String, BTreeMap<String, i64>) {
    let bin = target(variant);
    let prog = prog.replace("%T", &bin);
    let cmd = format!("{bin} {ROUNDS}");
    let out = ok(&weft(&["trace", "-e", &prog, "-c", &cmd], T));
    let own = own_counts(&out);
    let per_round = [
        ("foo", 9),
        ("foo_in_zoo", 6),
        ("foo_by_zoo", 2),
        ("foo_in_bar_in_zoo", 2),
        ("foo_by_bar_by_zoo", 1),
        ("foo_in_foo", 3),
        ("leaf", 9),
        ("leaf_in_foo_in_zoo", 6),
        ("bar", 3),
        ("rec", 5),
        ("rec_in_rec", 4),
        ("rec_by_rec", 2),
    ];
    for (k, v) in per_round {
        assert_eq!(own[k], v * ROUNDS, "the target's {k}: {out}");
    }
    (out, own)
}

/// foo inside zoo (non-strict) against foo called by zoo (strict), at foo's own
/// entry; a recursion direct and through mid(): rec inside rec, rec called by rec.
#[test]
fn strict_and_not_on_direct_indirect_and_recursive_calls() {
    for variant in [
        Variant::O2_PIE,
        Variant {
            opt: "-O0",
            pie: false,
            cet: false,
        },
    ] {
        let (out, own) = run(
            variant,
            "uprobe:%T:foo /cflow(uprobe:%T:zoo, uprobe:%T:foo)/ { @inside = count(); }
             uprobe:%T:foo /cflow_strict(uprobe:%T:zoo, uprobe:%T:foo)/ { @called = count(); }
             uprobe:%T:rec /cflow(uprobe:%T:rec, uprobe:%T:rec)/ { @rec_inside = count(); }
             uprobe:%T:rec /cflow_strict(uprobe:%T:rec, uprobe:%T:rec)/ { @rec_called = count(); }
             uprobe:%T:foo /cflow(uprobe:%T:foo, uprobe:%T:foo)/ { @foo_in_foo = count(); }",
        );
        assert_eq!(map_value(&out, "@inside"), Some(6 * ROUNDS), "{out}");
        assert_eq!(map_value(&out, "@inside"), Some(own["foo_in_zoo"]));
        assert_eq!(map_value(&out, "@called"), Some(2 * ROUNDS), "{out}");
        assert_eq!(map_value(&out, "@called"), Some(own["foo_by_zoo"]));
        assert_eq!(map_value(&out, "@rec_inside"), Some(4 * ROUNDS), "{out}");
        assert_eq!(map_value(&out, "@rec_inside"), Some(own["rec_in_rec"]));
        assert_eq!(map_value(&out, "@rec_called"), Some(2 * ROUNDS), "{out}");
        assert_eq!(map_value(&out, "@rec_called"), Some(own["rec_by_rec"]));
        assert_eq!(map_value(&out, "@foo_in_foo"), Some(3 * ROUNDS), "{out}");
        // The state is the aspect's own: not printed.
        assert!(!out.contains("@__cflow"), "{out}");
    }
}

/// Three levels: foo inside bar inside zoo (bar called directly by zoo, or through
/// via), and foo called by bar called by zoo.
#[test]
fn three_levels() {
    let (out, own) = run(
        Variant::O2_PIE,
        "uprobe:%T:foo /cflow(uprobe:%T:zoo, uprobe:%T:bar, uprobe:%T:foo)/ { @inside = count(); }
         uprobe:%T:foo /cflow_strict(uprobe:%T:zoo, uprobe:%T:bar, uprobe:%T:foo)/ { @called = count(); }
         uprobe:%T:leaf /cflow_strict(uprobe:%T:zoo, uprobe:%T:bar, uprobe:%T:foo)/ { @leaf = count(); }",
    );
    assert_eq!(map_value(&out, "@inside"), Some(2 * ROUNDS), "{out}");
    assert_eq!(map_value(&out, "@inside"), Some(own["foo_in_bar_in_zoo"]));
    assert_eq!(map_value(&out, "@called"), Some(ROUNDS), "{out}");
    assert_eq!(map_value(&out, "@called"), Some(own["foo_by_bar_by_zoo"]));
    // leaf is inside that foo (its innermost foo frame is the chained one).
    assert_eq!(map_value(&out, "@leaf"), Some(ROUNDS), "{out}");
}

/// cflow as a predicate of another function (leaf, inside foo) and of foo's own
/// probes that are not its entry alone: one probe on foo and leaf, and foo's
/// return. The hidden probes that keep the state run before the program's entry
/// advice and after its return advice, so the current call of foo counts.
#[test]
fn on_another_function_and_around_the_current_call() {
    let (out, own) = run(
        Variant::O2_PIE,
        "uprobe:%T:leaf /cflow(uprobe:%T:zoo, uprobe:%T:foo)/ { @leaf = count(); }
         uprobe:%T:foo, uprobe:%T:leaf /cflow(uprobe:%T:zoo, uprobe:%T:foo)/ { @both[probe] = count(); }
         uretprobe:%T:foo /cflow(uprobe:%T:zoo, uprobe:%T:foo)/ { @ret = count(); }
         uretprobe:%T:foo /cflow_strict(uprobe:%T:zoo, uprobe:%T:foo)/ { @ret_strict = count(); }
         uprobe:%T:bar /cflow(uprobe:%T:zoo, uprobe:%T:foo)/ { @bar = count(); }",
    );
    assert_eq!(map_value(&out, "@leaf"), Some(6 * ROUNDS), "{out}");
    assert_eq!(map_value(&out, "@leaf"), Some(own["leaf_in_foo_in_zoo"]));
    let both = keyed(&out, "@both");
    let name = |f: &str| format!("uprobe:{}:{f}", target(Variant::O2_PIE));
    assert_eq!(both.get(&name("foo")), Some(&(6 * ROUNDS)), "{out}");
    assert_eq!(both.get(&name("leaf")), Some(&(6 * ROUNDS)), "{out}");
    assert_eq!(map_value(&out, "@ret"), Some(6 * ROUNDS), "{out}");
    assert_eq!(map_value(&out, "@ret_strict"), Some(2 * ROUNDS), "{out}");
    // bar is never called inside foo.
    assert_eq!(map_value(&out, "@bar"), Some(0), "{out}");
}

/// KLAS's reuse of a pointcut: one advice on a named set of functions, a name
/// mixed with an attach point and used inside cflow.
#[test]
fn named_pointcuts() {
    let (out, own) = run(
        Variant::O2_PIE,
        "pointcut inner = uprobe:%T:foo, uprobe:%T:bar;
         pointcut outer = uprobe:%T:zoo;
         inner { @calls[probe] = count(); }
         inner, uprobe:%T:rec /cflow(outer, inner)/ { @inside[probe] = count(); }
         uprobe:%T:leaf /cflow(outer, uprobe:%T:foo)/ { @leaf = count(); }",
    );
    let bin = target(Variant::O2_PIE);
    let name = |f: &str| format!("uprobe:{bin}:{f}");
    let calls = keyed(&out, "@calls");
    assert_eq!(calls.get(&name("foo")), Some(&own["foo"]), "{out}");
    assert_eq!(calls.get(&name("bar")), Some(&own["bar"]), "{out}");
    assert_eq!(calls.len(), 2, "{out}");
    // Inside foo or bar inside zoo: foo 6 times a round, bar twice (from zoo and
    // via); rec never runs inside zoo.
    let inside = keyed(&out, "@inside");
    assert_eq!(inside.get(&name("foo")), Some(&(6 * ROUNDS)), "{out}");
    assert_eq!(inside.get(&name("bar")), Some(&(2 * ROUNDS)), "{out}");
    assert_eq!(inside.get(&name("rec")), None, "{out}");
    assert_eq!(map_value(&out, "@leaf"), Some(own["leaf_in_foo_in_zoo"]));
}

/// A coldpatched binary (`-finstrument-functions`, then `weft coldpatch`): advice
/// that reads nothing of the machine state runs at the entry and exit
/// placeholders, inside the function's real entry and return, where cflow's own
/// probes stay. Either way the current call counts, and "Attached N probes" counts
/// the program's probes only.
#[test]
fn a_coldpatched_binary_keeps_the_order() {
    let raw = build("cflow.c", Variant::O2_PIE, &["-finstrument-functions"]);
    let bin = raw.with_file_name("cflow-coldpatched");
    let o = Command::new(weft_bin())
        .arg("coldpatch")
        .arg(&raw)
        .arg("-o")
        .arg(&bin)
        .output()
        .unwrap();
    assert!(o.status.success(), "coldpatch: {}", text(&o.stderr));
    let b = bin.to_str().unwrap();
    let prog = format!(
        "uprobe:{b}:foo, uprobe:{b}:leaf /cflow(uprobe:{b}:zoo, uprobe:{b}:foo)/ {{ @nop[probe] = count(); }}
         uprobe:{b}:foo, uprobe:{b}:leaf /cflow(uprobe:{b}:zoo, uprobe:{b}:foo)/ {{ @real[probe, arg0 & 0] = count(); }}
         uretprobe:{b}:foo /cflow(uprobe:{b}:zoo, uprobe:{b}:foo)/ {{ @nop_ret = count(); }}
         uretprobe:{b}:foo /cflow(uprobe:{b}:zoo, uprobe:{b}:foo)/ {{ @real_ret[retval & 0] = count(); }}"
    );
    let cmd = format!("{b} {ROUNDS}");
    let o = weft(&["trace", "-v", "-e", &prog, "-c", &cmd], T);
    let out = ok(&o);
    let err = text(&o.stderr);
    assert!(err.contains("(entry placeholder)"), "{err}");
    assert!(err.contains("(exit placeholder)"), "{err}");
    assert!(err.contains("Attached 6 probes"), "{err}");
    let own = own_counts(&out);
    let nop = keyed(&out, "@nop");
    assert_eq!(
        nop.get(&format!("uprobe:{b}:foo")),
        Some(&own["foo_in_zoo"]),
        "{out}"
    );
    assert_eq!(
        nop.get(&format!("uprobe:{b}:leaf")),
        Some(&own["leaf_in_foo_in_zoo"])
    );
    let real = keyed(&out, "@real");
    assert_eq!(
        real.get(&format!("uprobe:{b}:foo, 0")),
        Some(&own["foo_in_zoo"]),
        "{out}"
    );
    assert_eq!(
        real.get(&format!("uprobe:{b}:leaf, 0")),
        Some(&own["leaf_in_foo_in_zoo"])
    );
    assert_eq!(
        map_value(&out, "@nop_ret"),
        Some(own["foo_in_zoo"]),
        "{out}"
    );
    assert_eq!(
        keyed(&out, "@real_ret").get("0"),
        Some(&own["foo_in_zoo"]),
        "{out}"
    );
    assert_eq!(own["foo_in_zoo"], 6 * ROUNDS);
}

/// Four threads nest their calls at once: each thread's state is its own, so the
/// counts are exactly four times one thread's.
#[test]
fn threads_keep_their_own_state() {
    let bin = target(Variant::O2_PIE);
    let rounds = 2000;
    let prog = format!(
        "uprobe:{bin}:leaf /cflow(uprobe:{bin}:zoo, uprobe:{bin}:foo)/ {{ @leaf = count(); }}
         uprobe:{bin}:foo /cflow(uprobe:{bin}:zoo, uprobe:{bin}:bar, uprobe:{bin}:foo)/ {{ @three = count(); }}
         uretprobe:{bin}:rec /cflow_strict(uprobe:{bin}:rec, uprobe:{bin}:rec)/ {{ @rec = count(); }}"
    );
    let cmd = format!("{bin} {rounds} threads");
    let out = ok(&weft(&["trace", "-e", &prog, "-c", &cmd], T));
    let own = own_counts(&out);
    assert_eq!(own["leaf_in_foo_in_zoo"], 4 * 6 * rounds, "{out}");
    assert_eq!(
        map_value(&out, "@leaf"),
        Some(own["leaf_in_foo_in_zoo"]),
        "{out}"
    );
    assert_eq!(
        map_value(&out, "@three"),
        Some(own["foo_in_bar_in_zoo"]),
        "{out}"
    );
    assert_eq!(map_value(&out, "@rec"), Some(own["rec_by_rec"]), "{out}");
}

/// The symbols advice names are resolved in the process (cflow_strict's code
/// ranges, and `uaddr`, which resolves in the probe's own binary).
#[test]
fn uaddr_is_a_symbol_of_the_probes_binary() {
    let bin = target(Variant::O2_PIE);
    let prog =
        format!("uprobe:{bin}:foo {{ @at_foo[(uint64)uaddr(\"foo\") == reg(\"ip\")] = count(); }}");
    let cmd = format!("{bin} {ROUNDS}");
    let out = ok(&weft(&["trace", "-e", &prog, "-c", &cmd], T));
    assert_eq!(
        keyed(&out, "@at_foo").get("true"),
        Some(&(9 * ROUNDS)),
        "{out}"
    );
    let prog = format!("uprobe:{bin}:foo {{ @x = uaddr(\"no_such_symbol\"); }}");
    let o = weft(&["trace", "-e", &prog, "-c", &cmd], T);
    assert!(!o.status.success());
    assert!(
        text(&o.stderr).contains("symbol `no_such_symbol` not found in the target"),
        "{}",
        text(&o.stderr)
    );
}

/// `--probe-filter` picks the program's probes; cflow's own run whatever it says.
#[test]
fn a_probe_filter_keeps_cflows_own_probes() {
    let bin = target(Variant::O2_PIE);
    let prog = format!(
        "uprobe:{bin}:leaf /cflow(uprobe:{bin}:zoo, uprobe:{bin}:foo)/ {{ @leaf = count(); }}
         uprobe:{bin}:bar {{ @bar = count(); }}"
    );
    let cmd = format!("{bin} {ROUNDS}");
    let out = ok(&weft(
        &["trace", "--probe-filter", "leaf", "-e", &prog, "-c", &cmd],
        T,
    ));
    assert_eq!(map_value(&out, "@leaf"), Some(6 * ROUNDS), "{out}");
    assert_eq!(map_value(&out, "@bar"), Some(0), "{out}");
    // A filter that matches only cflow's functions matches none of the program's.
    let o = weft(
        &["trace", "--probe-filter", "zoo", "-e", &prog, "-c", &cmd],
        T,
    );
    assert_eq!(o.status.code(), Some(1));
    assert!(
        text(&o.stderr).contains("--probe-filter matches no probe of the program"),
        "{}",
        text(&o.stderr)
    );
}

/// BEGIN, END and interval probes run in weft, on no thread of the target:
/// cflow is false there.
#[test]
fn false_where_no_target_thread_runs() {
    let (out, _) = run(
        Variant::O2_PIE,
        "BEGIN { @begin = cflow(uprobe:%T:zoo, uprobe:%T:foo); }
         END { @end = cflow_strict(uprobe:%T:zoo, uprobe:%T:foo); }",
    );
    assert_eq!(
        map_value_text(&out, "@begin"),
        Some("false".into()),
        "{out}"
    );
    assert_eq!(map_value_text(&out, "@end"), Some("false".into()), "{out}");
}

fn map_value_text(stdout: &str, name: &str) -> Option<String> {
    let prefix = format!("{name}: ");
    stdout
        .lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .map(|v| v.trim().to_string())
}

/// Attached to a running process, which waits for a line on stdin (sent once the
/// probes are live): the same exact counts.
#[test]
fn attached_to_a_running_process() {
    let bin = target(Variant::O2_PIE);
    let mut child = Command::new(&bin)
        .args([&ROUNDS.to_string(), "wait"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let prog = format!(
        "uprobe:{bin}:foo /cflow(uprobe:{bin}:zoo, uprobe:{bin}:foo)/ {{ @inside = count(); }}
         uprobe:{bin}:rec /cflow_strict(uprobe:{bin}:rec, uprobe:{bin}:rec)/ {{ @rec = count(); }}
         interval:ms:10 /@live == 0/ {{ @live = 1; printf(\"live\\n\"); }}"
    );
    let mut w = Background::start(&["trace", "-e", &prog, "-p", &child.id().to_string()]);
    // Interval probes run once the sites are patched.
    w.wait_line("live", false, T);
    child.stdin.take().unwrap().write_all(b"go\n").unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert!(child.wait().unwrap().success());
    let own = own_counts(&line);
    let out = ok(&w.finish(T));
    assert_eq!(map_value(&out, "@inside"), Some(own["foo_in_zoo"]), "{out}");
    assert_eq!(map_value(&out, "@rec"), Some(own["rec_by_rec"]), "{out}");
}

/// Where `needle` first is in `prog`, as a diagnostic of `-e` says it.
fn at(prog: &str, needle: &str) -> String {
    let off = prog
        .find(needle)
        .unwrap_or_else(|| panic!("{needle:?} in {prog}"));
    let line = prog[..off].matches('\n').count() + 1;
    let col = off - prog[..off].rfind('\n').map_or(0, |i| i + 1) + 1;
    format!(" --> -e:{line}:{col}")
}

/// Bad input: one located error each (the located line checked exactly), weft
/// exits 1, and the target never runs.
#[test]
fn errors_are_located() {
    let bin = target(Variant::O2_PIE);
    for (prog, message, located) in [
        (
            "uprobe:%T:foo /cflow(uprobe:%T:foo)/ { }",
            "error: cflow() needs at least two functions, outermost first: \
             cflow(uprobe:BIN:OUTER, uprobe:BIN:INNER)",
            "cflow(",
        ),
        (
            "uprobe:%T:foo /cflow(uretprobe:%T:zoo, uprobe:%T:foo)/ { }",
            "error: `uretprobe:%T:zoo` in cflow(): an element is a function's entry, \
             uprobe:BIN:FUNC (weft follows its returns itself)",
            "uretprobe",
        ),
        (
            "uprobe:%T:foo /cflow_strict(uprobe:%T:z*, uprobe:%T:foo)/ { }",
            "error: `uprobe:%T:z*` in cflow_strict(): the caller's code is compared with \
             return addresses, so it names one function (no wildcards)",
            "uprobe:%T:z*",
        ),
        (
            "tracepoint:syscalls:sys_enter_getppid /cflow(uprobe:%T:zoo, uprobe:%T:foo)/ { }",
            "error: cflow() cannot be used in a kernel probe: it reads the state of the \
             target's thread, which kernel probes do not run on",
            "cflow(",
        ),
        (
            "pointcut net = uprobe:%T:foo;\npointcut net = uprobe:%T:bar;\nnet { }",
            "error: pointcut `net` is defined twice",
            "net = uprobe:%T:bar",
        ),
        (
            "pointcut uprobe = uprobe:%T:foo;\nuprobe { }",
            "error: pointcut `uprobe` has the name of a probe type: choose another name",
            "uprobe =",
        ),
        (
            "pointcut net = uprobe:%T:foo;\nnte { }",
            "error: unknown pointcut `nte`; did you mean `net`?",
            "nte",
        ),
    ] {
        let prog = prog.replace("%T", &bin);
        let want = format!(
            "{}\n{}\n",
            message.replace("%T", &bin),
            at(&prog, &located.replace("%T", &bin))
        );
        let cmd = format!("{bin} 1");
        let o = weft(&["trace", "-e", &prog, "-c", &cmd], T);
        let err = text(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{prog}: {err}");
        assert!(err.starts_with(&want), "{prog}:\n{err}\nwanted:\n{want}");
        assert!(
            text(&o.stdout).is_empty(),
            "the target ran: {}",
            text(&o.stdout)
        );
    }
}
