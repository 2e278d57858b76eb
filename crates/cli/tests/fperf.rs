//! `weft fperf`: per-function profiles of tests/targets/fperf.c, whose functions
//! have known relative costs (f does twice g's work, h is never called, once is
//! called once), and its refusals of bad input.
//!
//! Ratios compare the *minimum* inclusive time of the sampled calls: on a busy
//! machine a preempted call's time is inflated, never shortened, so the minimum
//! over dozens of samples is the call's own cost, retry-free.

mod common;

use std::time::Duration;

use common::*;

const T: Duration = Duration::from_secs(120);

fn functions(json: &serde_json::Value) -> Vec<serde_json::Value> {
    json["functions"].as_array().unwrap().clone()
}

fn row<'a>(rows: &'a [serde_json::Value], name: &str) -> Option<&'a serde_json::Value> {
    rows.iter().find(|r| r["function"] == name)
}

#[test]
fn known_costs_come_out_in_order_and_ratio() {
    let bin = build("fperf.c", Variant::O2_PIE, &[]);
    let dir = std::env::temp_dir().join(format!("weft-fperf-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let json_path = dir.join("p.json");
    let folded = dir.join("p.folded");
    let o = weft(
        &[
            "fperf",
            "-o",
            json_path.to_str().unwrap(),
            "--folded",
            folded.to_str().unwrap(),
            "--",
            bin.to_str().unwrap(),
            "ratio",
            "2000",
        ],
        T,
    );
    let out = ok(&o);
    assert!(out.contains("FUNCTION"), "{out}");
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json_path).unwrap()).unwrap();
    let rows = functions(&json);
    let (f, g) = (row(&rows, "f").unwrap(), row(&rows, "g").unwrap());
    assert_eq!(f["calls"], 2000);
    assert_eq!(g["calls"], 2000);
    assert!(f["samples"].as_u64().unwrap() >= 10, "{f}");
    assert!(g["samples"].as_u64().unwrap() >= 10, "{g}");
    let ratio = f["min_inclusive"].as_f64().unwrap() / g["min_inclusive"].as_f64().unwrap();
    assert!((1.7..=2.3).contains(&ratio), "f/g = {ratio}: {f} {g}");
    // Sorted by total inclusive time: f before g.
    let pos = |n: &str| rows.iter().position(|r| r["function"] == n).unwrap();
    assert!(pos("f") < pos("g"), "{rows:?}");
    // Called once: present, sampled.
    let once = row(&rows, "once").unwrap();
    assert_eq!(once["calls"], 1);
    assert_eq!(once["samples"], 1);
    // Never called: absent.
    assert!(row(&rows, "h").is_none(), "{rows:?}");
    // f and g are leaves: exclusive is inclusive.
    assert_eq!(f["mean_exclusive"], f["mean_inclusive"]);
    let stacks = std::fs::read_to_string(&folded).unwrap();
    assert!(stacks.lines().any(|l| l.contains("main;f ")), "{stacks}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn bad_input_is_refused_with_the_reason() {
    let bin = build("fperf.c", Variant::O2_PIE, &[]);
    let b = bin.to_str().unwrap();
    let err = |args: &[&str]| {
        let o = weft(args, T);
        assert!(!o.status.success(), "{args:?} succeeded");
        text(&o.stderr)
    };
    let e = err(&["fperf", "-e", "wal", "--", b, "ratio", "1"]);
    assert!(e.contains("unknown event; did you mean `wall`"), "{e}");
    // No PMU on these machines: refused, saying why.
    if weft_kernel::perf::hardware().is_err() {
        let e = err(&["fperf", "-e", "cycles", "--", b, "ratio", "1"]);
        assert!(
            e.contains("a hardware event, unavailable on this machine"),
            "{e}"
        );
        let o = weft(&["fperf", "--list-events"], T);
        let out = ok(&o);
        assert!(out.contains("cycles          no: "), "{out}");
    }
    let e = err(&["fperf", "--budget", "0", "--", b, "ratio", "1"]);
    assert!(e.contains("--budget 0: out of range"), "{e}");
    let e = err(&["fperf", "--budget", "lots", "--", b, "ratio", "1"]);
    assert!(e.contains("--budget lots: not a percentage"), "{e}");
}
