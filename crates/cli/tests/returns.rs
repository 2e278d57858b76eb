//! Return sites: return probes woven on a function's own `ret`s (the return address
//! left alone) where every exit is one, the return-address hijack kept for the rest
//! (tail calls, jump tables). Either way the counts and return values are exact, and
//! equal to what the target computes itself.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::*;

const T: Duration = Duration::from_secs(120);
const SHAPES: [&str; 7] = [
    "tiny",
    "epilogue",
    "two_exits",
    "fib",
    "tail",
    "table",
    "jumps_out",
];

/// Run weft over `returns 1000` with `env`, the target's stdin given one line.
fn run(args: &[&str], env: &[(&str, &str)]) -> (String, String) {
    let o = weft_with_input(args, env, b"go\n", T);
    let (stdout, stderr) = (text(&o.stdout), text(&o.stderr));
    assert!(o.status.success(), "{stdout}\n{stderr}");
    (stdout, stderr)
}

/// The target's own totals: `tiny=N epilogue=N ...`.
fn own_totals(stdout: &str) -> BTreeMap<String, i64> {
    key_values(stdout, "tiny")
}

fn program(bin: &str) -> String {
    let list: Vec<String> = SHAPES.iter().map(|s| format!("{bin}:{s}")).collect();
    let entries: Vec<String> = list.iter().map(|p| format!("uprobe:{p}")).collect();
    let returns: Vec<String> = list.iter().map(|p| format!("uretprobe:{p}")).collect();
    format!(
        "{} {{ @in[func] = count(); }} {} {{ @out[probe] = count(); @ret[probe] = sum(retval); }}",
        entries.join(","),
        returns.join(",")
    )
}

fn check(stdout: &str, mode: &str) {
    let own = own_totals(stdout);
    // A return probe's `func` names the caller (bpftrace 0.17): key by probe.
    let by_func = |m: BTreeMap<String, i64>| -> BTreeMap<String, i64> {
        m.into_iter()
            .map(|(k, v)| (k.rsplit(':').next().unwrap().to_string(), v))
            .collect()
    };
    let (ins, outs, rets) = (
        keyed(stdout, "@in"),
        by_func(keyed(stdout, "@out")),
        by_func(keyed(stdout, "@ret")),
    );
    for s in ["tiny", "epilogue", "two_exits", "tail", "table"] {
        assert_eq!(ins.get(s), Some(&4000), "{mode}: {s} entries\n{stdout}");
        assert_eq!(outs.get(s), Some(&4000), "{mode}: {s} returns\n{stdout}");
        assert_eq!(
            rets.get(s),
            own.get(s),
            "{mode}: {s} return values\n{stdout}"
        );
    }
    // fib: every call returns; the compiler decides how many calls there are.
    assert!(ins["fib"] > 4, "{mode}: {stdout}");
    assert_eq!(ins.get("fib"), outs.get("fib"), "{mode}: fib\n{stdout}");
    // jumps_out: the calls left by longjmp never return.
    assert_eq!(ins.get("jumps_out"), Some(&4000), "{mode}: {stdout}");
    assert_eq!(
        outs["jumps_out"],
        4000 - own["jumped"],
        "{mode}: jumps_out returns\n{stdout}"
    );
    assert_eq!(
        rets.get("jumps_out"),
        own.get("jumps_out"),
        "{mode}: {stdout}"
    );
}

/// Exact counts and return values with return sites, with the hijack everywhere
/// (`WEFT_RETURN_SITES=0`), and without inline advice; `-v` says which functions
/// keep the hijack and why.
#[test]
fn return_sites_count_exactly_what_the_hijack_counts() {
    for variant in [
        Variant::O2_PIE,
        Variant {
            opt: "-O0",
            pie: false,
            cet: false,
        },
    ] {
        let bin = build("returns.c", variant, &["-pthread"]);
        let bin = bin.to_str().unwrap();
        let prog = program(bin);
        let cmd = format!("{bin} 1000");
        let (stdout, stderr) = run(&["trace", "-v", "-e", &prog, "-c", &cmd], &[]);
        check(&stdout, &format!("{} return sites", variant.name()));
        if variant == Variant::O2_PIE {
            // tail() ends in a jump to callee(), table() in a jump table.
            for (f, why) in [("tail", "leaves the function"), ("table", "indirect jump")] {
                assert!(
                    stderr
                        .lines()
                        .any(|l| l.contains(&format!(":{f}: return-address hijack"))
                            && l.contains(why)),
                    "{f}: {stderr}"
                );
            }
            // The others' exits are all `ret`s with a window (at -O0, a shared
            // epilogue is often a branch target, and the hijack stays).
            for f in ["tiny", "epilogue", "two_exits", "fib", "jumps_out"] {
                assert!(
                    !stderr.contains(&format!(":{f}: return-address hijack")),
                    "{f} keeps the hijack: {stderr}"
                );
            }
            assert!(stderr.contains("return site"), "{stderr}");
        }
        let (stdout, _) = run(
            &["trace", "-e", &prog, "-c", &cmd],
            &[("WEFT_RETURN_SITES", "0")],
        );
        check(&stdout, &format!("{} hijack", variant.name()));
        let (stdout, _) = run(&["trace", "--no-inline", "-e", &prog, "-c", &cmd], &[]);
        check(&stdout, &format!("{} not inline", variant.name()));
    }
}

/// The latency idiom over return sites, inline: one histogram sample per call, and
/// the start times all deleted.
#[test]
fn the_latency_idiom_pairs_every_call() {
    let bin = build("returns.c", Variant::O2_PIE, &["-pthread"]);
    let bin = bin.to_str().unwrap();
    let prog = format!(
        "uprobe:{bin}:epilogue {{ @s[tid] = nsecs; }} \
         uretprobe:{bin}:epilogue /@s[tid]/ {{ @ns = stats(nsecs - @s[tid]); delete(@s[tid]); }} \
         uretprobe:{bin}:tiny {{ @tiny = sum(retval); }}"
    );
    let cmd = format!("{bin} 1000");
    let (stdout, _) = run(&["trace", "-e", &prog, "-c", &cmd], &[]);
    let own = own_totals(&stdout);
    assert!(
        stdout.contains("@ns: count 4000,"),
        "every call paired: {stdout}"
    );
    assert_eq!(
        map_value(&stdout, "@tiny"),
        own.get("tiny").copied(),
        "{stdout}"
    );
    assert!(!stdout.contains("@s["), "start times left: {stdout}");
}
