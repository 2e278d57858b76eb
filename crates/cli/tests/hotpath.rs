//! Keyed aggregations compiled inline (an 8-byte key hashed and looked up in the
//! trampoline, first inserts through a helper): exact counts and sums per key from
//! 4 threads, with 1, 100 and 10,000 keys, a key deleted and revived in between,
//! and the same numbers with the generic path (`--no-inline`).

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::*;

const T: Duration = Duration::from_secs(120);

fn run(args: &[&str]) -> (String, String) {
    let o = weft_with_input(args, &[], b"go\n", T);
    let (stdout, stderr) = (text(&o.stdout), text(&o.stderr));
    assert!(
        o.status.success() && stdout.contains("done"),
        "{stdout}\n{stderr}"
    );
    assert!(!stderr.contains("WARNING"), "{stderr}");
    (stdout, stderr)
}

#[test]
fn keyed_counts_and_sums_are_exact_inline_and_not() {
    let bin = build("keys.c", Variant::O2_PIE, &["-pthread"]);
    let b = bin.to_str().unwrap();
    let n: i64 = 2000;
    for keys in [1i64, 100, 10_000] {
        let prog = format!(
            "config = {{ max_map_keys = 20000 }} \
             uprobe:{b}:hit {{ @c[arg0 % {keys}] = count(); @s[arg0 % {keys}] = sum(arg1); }} \
             uprobe:{b}:drop_key {{ delete(@c[arg0]); delete(@s[arg0]); }}"
        );
        let cmd = format!("{b} {n}");
        // What the target did: 4 threads, hit(i, i) for i < n, twice; key 3's
        // first round deleted (when there is a key 3).
        let (mut count, mut sum) = (BTreeMap::new(), BTreeMap::new());
        for round in 0..2 {
            for i in 0..n {
                let k = i % keys;
                if round == 0 && k == 3 {
                    continue;
                }
                *count.entry(k.to_string()).or_insert(0) += 4;
                *sum.entry(k.to_string()).or_insert(0) += 4 * i;
            }
        }
        for flags in [&[][..], &["--no-inline"][..]] {
            let mut args = vec!["trace"];
            args.extend_from_slice(flags);
            args.extend_from_slice(&["-e", &prog, "-c", &cmd]);
            let (stdout, _) = run(&args);
            let what = format!("{keys} keys {flags:?}");
            assert_eq!(keyed(&stdout, "@c"), count, "{what}: counts\n{stdout}");
            assert_eq!(keyed(&stdout, "@s"), sum, "{what}: sums\n{stdout}");
        }
    }
}

/// Keys the site knows before it runs (`func`, `probe`, literals, tuples of them)
/// are hashed when the site is compiled, not at each hit: the counts, sums and
/// stored values are the generic path's, exact, with two sites sharing a map, and
/// with a key deleted between the rounds and revived.
#[test]
fn keys_known_before_the_site_runs_are_exact_inline_and_not() {
    let bin = build("keys.c", Variant::O2_PIE, &["-pthread"]);
    let b = bin.to_str().unwrap();
    let n: i64 = 2000;
    let prog = format!(
        "uprobe:{b}:hit {{ @f[func] = count(); @p[probe, 7] = count(); @k[3] = sum(arg1); \
                           @last[1] = arg0; }} \
         uprobe:{b}:drop_key {{ @p[probe, 7] = count(); delete(@k[3]); }}"
    );
    let cmd = format!("{b} {n}");
    let hit = format!("uprobe:{b}:hit, 7");
    let drop = format!("uprobe:{b}:drop_key, 7");
    for flags in [&["-v"][..], &["--no-inline"][..]] {
        let mut args = vec!["trace"];
        args.extend_from_slice(flags);
        args.extend_from_slice(&["-e", &prog, "-c", &cmd]);
        let (stdout, stderr) = run(&args);
        if flags == ["-v"] {
            assert!(stderr.contains("(advice inline)"), "{stderr}");
        }
        let what = format!("{flags:?}\n{stdout}");
        // 4 threads call hit(i, i) for i < n, twice; drop_key once in between.
        assert_eq!(
            keyed(&stdout, "@f"),
            BTreeMap::from([("hit".to_string(), 8 * n)]),
            "{what}"
        );
        assert_eq!(
            keyed(&stdout, "@p"),
            BTreeMap::from([(hit.clone(), 8 * n), (drop.clone(), 1)]),
            "{what}"
        );
        // The first round's sum was deleted: the second's, 4 threads' 0 + ... + n-1.
        assert_eq!(
            keyed(&stdout, "@k"),
            BTreeMap::from([("3".to_string(), 4 * n * (n - 1) / 2)]),
            "{what}"
        );
        assert_eq!(
            keyed(&stdout, "@last"),
            BTreeMap::from([("1".to_string(), n - 1)]),
            "{what}"
        );
    }
}

/// `@[tid] = count()`: one key per thread, each thread's own count.
#[test]
fn counts_keyed_by_thread_are_exact() {
    let bin = build("keys.c", Variant::O2_PIE, &["-pthread"]);
    let b = bin.to_str().unwrap();
    let prog = format!("uprobe:{b}:hit {{ @[tid] = count(); }}");
    let cmd = format!("{b} 5000");
    let (stdout, stderr) = run(&["trace", "-v", "-e", &prog, "-c", &cmd]);
    assert!(stderr.contains(":hit at 0x"), "{stderr}");
    assert!(
        stderr
            .lines()
            .filter(|l| l.contains(":hit at 0x"))
            .all(|l| l.ends_with("(advice inline)")),
        "compiled inline: {stderr}"
    );
    let per = keyed(&stdout, "@");
    assert_eq!(per.len(), 4, "{stdout}");
    assert!(per.values().all(|&c| c == 10_000), "{stdout}");
}

/// Plain maps of 8-byte keys and values, loaded, stored and deleted inline: the
/// latency idiom's pattern keyed by thread, and 1 to 10,000 keys shared by 4
/// threads with a key deleted and stored again; exact, and the same with
/// `--no-inline`.
#[test]
fn plain_maps_of_words_are_exact_inline_and_not() {
    let bin = build("keys.c", Variant::O2_PIE, &["-pthread"]);
    let b = bin.to_str().unwrap();
    let n: i64 = 3000;
    let cmd = format!("{b} {n}");
    // 4 threads call hit(i, i) for i < n, twice.
    let idiom = format!(
        "uprobe:{b}:hit {{ @s[tid] = arg1 + 1; }} \
         uretprobe:{b}:hit /@s[tid]/ {{ @pairs = count(); @sum = sum(@s[tid] - 1); delete(@s[tid]); }}"
    );
    for flags in [&[][..], &["--no-inline"][..]] {
        let mut args = vec!["trace", "-v"];
        args.extend_from_slice(flags);
        args.extend_from_slice(&["-e", &idiom, "-c", &cmd]);
        let (stdout, stderr) = run(&args);
        assert!(
            stdout.contains(&format!("@pairs: {}\n", 8 * n)),
            "{flags:?}: {stdout}"
        );
        assert!(
            stdout.contains(&format!("@sum: {}\n", 8 * (n * (n - 1) / 2))),
            "{flags:?}: {stdout}"
        );
        assert!(!stdout.contains("@s["), "every entry deleted: {stdout}");
        if flags.is_empty() {
            assert!(
                stderr
                    .lines()
                    .filter(|l| l.contains(":hit at 0x"))
                    .all(|l| l.ends_with("(advice inline)")),
                "compiled inline: {stderr}"
            );
        }
    }
    for keys in [1i64, 100, 10_000] {
        let prog = format!(
            "config = {{ max_map_keys = 20000 }} \
             uprobe:{b}:hit {{ @v[arg0 % {keys}] = arg0 % {keys}; @t = sum(@v[arg0 % {keys}]); }} \
             uprobe:{b}:drop_key {{ delete(@v[arg0]); }}"
        );
        let want: BTreeMap<String, i64> = (0..keys.min(n)).map(|k| (k.to_string(), k)).collect();
        let total: i64 = 8 * (0..n).map(|i| i % keys).sum::<i64>();
        for flags in [&[][..], &["--no-inline"][..]] {
            let mut args = vec!["trace"];
            args.extend_from_slice(flags);
            args.extend_from_slice(&["-e", &prog, "-c", &cmd]);
            let (stdout, _) = run(&args);
            let what = format!("{keys} keys {flags:?}");
            assert_eq!(keyed(&stdout, "@v"), want, "{what}\n{stdout}");
            assert!(
                stdout.contains(&format!("@t: {total}\n")),
                "{what}: {stdout}"
            );
        }
    }
}

/// `nsecs` is CLOCK_MONOTONIC: read in advice just after the program read it
/// itself, it is never behind by more than the TSC clock's stated error (50 µs;
/// weft keeps it within a few), inline and in the generic path; and with the
/// vDSO clock (`WEFT_CLOCK=vdso`) never behind at all.
#[test]
fn nsecs_keeps_to_the_programs_own_clock() {
    let bin = build("clock.c", Variant::O2_PIE, &[]);
    let b = bin.to_str().unwrap();
    let n = 200_000;
    let cmd = format!("{b} {n}");
    let prog =
        format!("uprobe:{b}:stamp {{ @lo = min((int64)nsecs - (int64)arg0); @n = count(); }}");
    for (flags, env, bound) in [
        (&[][..], None, -50_000i64),
        (&["--no-inline"][..], None, -50_000),
        (&[][..], Some("vdso"), 0),
    ] {
        let mut args = vec!["trace"];
        args.extend_from_slice(flags);
        args.extend_from_slice(&["-e", &prog, "-c", &cmd]);
        let env: Vec<(&str, &str)> = env.map(|v| ("WEFT_CLOCK", v)).into_iter().collect();
        let o = weft_with_input(&args, &env, b"go\n", T);
        let stdout = text(&o.stdout);
        assert!(o.status.success(), "{stdout}{}", text(&o.stderr));
        assert!(stdout.contains(&format!("@n: {n}\n")), "{stdout}");
        let lo: i64 = stdout
            .lines()
            .find_map(|l| l.strip_prefix("@lo: "))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{stdout}"));
        assert!(
            (bound..1_000_000_000).contains(&lo),
            "{flags:?} {env:?}: nsecs - the program's clock at least {lo} ns"
        );
    }
}

/// A map keyed only by `tid` keeps each thread's entry in the thread's own slot;
/// when the thread ends, weft moves the entry into the map's table: the map
/// prints every thread's entry once, with its last value, whether the thread
/// ended before the end of the session or not, inline and not.
#[test]
fn thread_keyed_entries_outlive_their_threads() {
    let bin = build("keys.c", Variant::O2_PIE, &["-pthread"]);
    let b = bin.to_str().unwrap();
    let n: i64 = 500;
    let cmd = format!("{b} {n}");
    let prog = format!("uprobe:{b}:hit {{ @last[tid] = arg1 + 1; }} END {{ @n = len(@last); }}");
    let prog_kept = format!("uprobe:{b}:hit {{ @last[tid] = arg1 + 1; }}");
    for p in [&prog, &prog_kept] {
        for flags in [&[][..], &["--no-inline"][..]] {
            let mut args = vec!["trace"];
            args.extend_from_slice(flags);
            args.extend_from_slice(&["-e", p, "-c", &cmd]);
            let (stdout, _) = run(&args);
            let last = keyed(&stdout, "@last");
            assert_eq!(last.len(), 4, "{flags:?}: {stdout}");
            assert!(last.values().all(|&v| v == n), "{flags:?}: {stdout}");
            if p == &prog {
                assert!(stdout.contains("@n: 4\n"), "{stdout}");
            }
        }
    }
}

/// `@s[str(arg1)] = sum(arg0)` inline: the string read by the runtime's
/// fault-tolerant copy called from the trampoline, the 64-byte key hashed and
/// compared there. Exact per string from 4 threads — a 63-character name whole,
/// a 64-character one cut to 63, a bad pointer's faults counted under the empty
/// key — and the same with `--no-inline`.
#[test]
fn string_keys_are_exact_inline_and_not() {
    let bin = build("strkeys.c", Variant::O2_PIE, &["-pthread"]);
    let b = bin.to_str().unwrap();
    let n: i64 = 10_000;
    let cmd = format!("{b} {n}");
    let names = [
        "get",
        "a-name-of-sixty-three-characters-xxxxxxxxxxxxxxxxxxxxxxxxxxxxxx",
        "a-name-of-sixty-four-characters-xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx",
        "put",
        "",
    ];
    let mut sums = BTreeMap::new();
    let mut counts = BTreeMap::new();
    for i in 0..n {
        let k = names[(i % 5) as usize].to_string();
        *sums.entry(k.clone()).or_insert(0) += 4 * i;
        *counts.entry(k).or_insert(0) += 4;
    }
    let prog =
        format!("uprobe:{b}:named {{ @s[str(arg1)] = sum(arg0); @c[str(arg1)] = count(); }}");
    for flags in [&["-v"][..], &["--no-inline"][..]] {
        let mut args = vec!["trace"];
        args.extend_from_slice(flags);
        args.extend_from_slice(&["-e", &prog, "-c", &cmd]);
        let o = weft_with_input(&args, &[], b"go\n", T);
        let (stdout, stderr) = (text(&o.stdout), text(&o.stderr));
        assert!(o.status.success() && stdout.contains("done"), "{stderr}");
        assert_eq!(keyed(&stdout, "@s"), sums, "{flags:?}\n{stdout}");
        assert_eq!(keyed(&stdout, "@c"), counts, "{flags:?}\n{stdout}");
        let faults = 2 * 4 * n / 5;
        assert!(
            stderr.contains(&format!("weft: {faults} reads of target memory faulted")),
            "{flags:?}: {stderr}"
        );
        if flags == ["-v"] {
            assert!(
                stderr.contains(":named at 0x") && stderr.contains("(advice inline)"),
                "{stderr}"
            );
        }
    }
}

/// `@[comm] = count()` and `@[pcomm, tid % 1] = count()` inline (the slot's own
/// copies of the names, a 16- and a 24-byte key hashed in the trampoline): the same
/// counts as the generic path.
#[test]
fn counts_keyed_by_name_are_exact_inline_and_not() {
    let bin = build("keys.c", Variant::O2_PIE, &["-pthread"]);
    let b = bin.to_str().unwrap();
    let n: i64 = 3000;
    let cmd = format!("{b} {n}");
    let prog = format!("uprobe:{b}:hit {{ @c[comm] = count(); @p[pcomm, arg0 % 3] = count(); }}");
    let mut outs = Vec::new();
    for flags in [&["-v"][..], &["--no-inline"][..]] {
        let mut args = vec!["trace"];
        args.extend_from_slice(flags);
        args.extend_from_slice(&["-e", &prog, "-c", &cmd]);
        let (stdout, stderr) = run(&args);
        assert_eq!(
            keyed(&stdout, "@c"),
            BTreeMap::from([("keys".to_string(), 8 * n)]),
            "{stdout}"
        );
        if flags == ["-v"] {
            assert!(stderr.contains("(advice inline)"), "{stderr}");
        }
        outs.push(keyed(&stdout, "@p"));
    }
    let want: BTreeMap<String, i64> = (0..3)
        .map(|k| {
            (
                format!("keys, {k}"),
                8 * (0..n).filter(|i| i % 3 == k).count() as i64,
            )
        })
        .collect();
    assert_eq!(outs[0], want);
    assert_eq!(outs[1], want);
}
