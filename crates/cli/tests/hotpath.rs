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
