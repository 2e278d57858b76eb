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
    // No budget: every call sampled and counted (under a budget, calls are
    // counted only while their function is woven).
    let o = weft(
        &[
            "fperf",
            "--budget",
            "none",
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
    // fperf's return probes hijack return addresses; `_start` has none (the word
    // at rsp is argc), so main gets its argc untouched.
    assert!(out.contains("argc 3 done"), "{out}");
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
    // Sorted by total inclusive time. (Not "f before g": totals include the
    // preemptions of a busy machine, which put g's above f's in a CI run; the
    // minimum above is the call's own cost.)
    let totals: Vec<f64> = rows
        .iter()
        .map(|r| r["total_inclusive"].as_f64().unwrap())
        .collect();
    assert!(totals.windows(2).all(|w| w[0] >= w[1]), "{rows:?}");
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

/// `-e cputime`: a function that sleeps costs wall time but next to no CPU time;
/// one that spins costs both. Each read is the thread's own CPU clock.
#[test]
fn cputime_counts_what_the_thread_ran_not_what_it_waited() {
    let bin = build("fperf.c", Variant::O2_PIE, &[]);
    let dir = std::env::temp_dir().join(format!("weft-fperf-cpu-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut means = Vec::new();
    for event in ["wall", "cputime"] {
        let json_path = dir.join(format!("{event}.json"));
        let o = weft(
            &[
                "fperf",
                "-e",
                event,
                "--budget",
                "none",
                "-F",
                "nap",
                "-F",
                "burn",
                "-o",
                json_path.to_str().unwrap(),
                "--",
                bin.to_str().unwrap(),
                "sleepy",
                "20",
            ],
            T,
        );
        ok(&o);
        let json: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&json_path).unwrap()).unwrap();
        assert_eq!(json["event"], event);
        let rows = functions(&json);
        let (nap, burn) = (row(&rows, "nap").unwrap(), row(&rows, "burn").unwrap());
        assert_eq!(
            (nap["calls"].as_u64(), burn["calls"].as_u64()),
            (Some(20), Some(20))
        );
        assert_eq!(
            (nap["samples"].as_u64(), burn["samples"].as_u64()),
            (Some(20), Some(20))
        );
        let value = |r: &serde_json::Value, k: &str| r[k].as_f64().unwrap();
        means.push((
            value(nap, "mean_inclusive"),
            value(nap, "min_inclusive"),
            value(burn, "min_inclusive"),
        ));
    }
    let ((wall_nap, _, _), (cpu_nap, cpu_nap_min, cpu_burn_min)) = (means[0], means[1]);
    // usleep(2000) lasts at least 2 ms of wall time.
    assert!(wall_nap >= 2e6, "wall nap {wall_nap}");
    // Asleep, the thread runs a few microseconds; spinning, it runs all along.
    // The mean of nap carries its first call (the loader binding usleep, tens
    // of microseconds on a busy machine), so the ratio compares the fastest
    // call of each: what one call costs when nothing else is paid in it.
    assert!(cpu_nap < 2e5, "cputime nap {cpu_nap}");
    assert!(
        cpu_burn_min > 10.0 * cpu_nap_min,
        "cputime burn {cpu_burn_min} nap {cpu_nap_min} (minimums)"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `-e page-faults`: a function that touches 8 fresh pages costs 8 faults a call,
/// one that touches 2 costs 2, one that writes pages it touched before costs none
/// (the thread's own faults, from getrusage; a ring page weft's own entry event
/// touches first can add one now and then). `-e context-switches`: a function that
/// sleeps switches out at least once a call, one that spins only when preempted.
#[test]
fn software_events_count_the_threads_faults_and_switches() {
    let bin = build("fperf.c", Variant::O2_PIE, &[]);
    let dir = std::env::temp_dir().join(format!("weft-fperf-sw-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let run = |event: &str, mode: &str, funcs: &[&str]| {
        let json_path = dir.join(format!("{event}.json"));
        let mut args = vec!["fperf", "-e", event, "--budget", "none"];
        for f in funcs {
            args.extend(["-F", f]);
        }
        args.extend([
            "-o",
            json_path.to_str().unwrap(),
            "--",
            bin.to_str().unwrap(),
            mode,
            "100",
        ]);
        let o = weft(&args, T);
        let out = ok(&o);
        let json: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&json_path).unwrap()).unwrap();
        (json, out)
    };
    let (json, out) = run("page-faults", "faults", &["fault8", "fault2", "reuse"]);
    assert_eq!(
        (json["event"].as_str(), json["unit"].as_str()),
        (Some("page-faults"), Some("faults"))
    );
    let rows = functions(&json);
    let mean = |name: &str| {
        let r = row(&rows, name).unwrap_or_else(|| panic!("{name} in {out}"));
        assert_eq!(
            (r["calls"].as_u64(), r["samples"].as_u64()),
            (Some(100), Some(100)),
            "{name}"
        );
        r["mean_inclusive"].as_f64().unwrap()
    };
    let (f8, f2, re) = (mean("fault8"), mean("fault2"), mean("reuse"));
    assert!(
        (8.0..8.5).contains(&f8),
        "fault8: {f8} faults a call\n{out}"
    );
    assert!(
        (2.0..2.5).contains(&f2),
        "fault2: {f2} faults a call\n{out}"
    );
    assert!(re < 0.5, "reuse: {re} faults a call\n{out}");
    // The table shows counts, not durations.
    let line = out.lines().find(|l| l.starts_with("fault8 ")).unwrap();
    assert!(!line.contains("ns"), "{line}");

    let (json, out) = run("context-switches", "sleepy", &["nap", "burn"]);
    assert_eq!(json["unit"], "switches");
    let rows = functions(&json);
    let nap = row(&rows, "nap").unwrap()["mean_inclusive"]
        .as_f64()
        .unwrap();
    let burn = row(&rows, "burn").unwrap()["mean_inclusive"]
        .as_f64()
        .unwrap();
    assert!(nap >= 1.0, "nap: {nap} switches a call\n{out}");
    // A spinning call is switched out only when preempted (0.2 a call here with two
    // busy loops beside it); a sleeping one at least once.
    assert!(
        burn < 0.75 * nap,
        "burn: {burn} switches a call, nap {nap}\n{out}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// With no budget every call is a sample, however many: a million calls of a small
/// leaf are two million events, more than a ring holds between two drains, and
/// the rings wait for weft rather than drop them (they did: a fifth of the calls
/// were sampled, and nothing said so).
#[test]
fn with_no_budget_every_one_of_a_million_calls_is_sampled() {
    let bin = build("fperf.c", Variant::O2_PIE, &[]);
    let dir = std::env::temp_dir().join(format!("weft-fperf-all-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let json_path = dir.join("p.json");
    let o = weft(
        &[
            "fperf",
            "--budget",
            "none",
            "-F",
            "leaf",
            "-F",
            "batch",
            "-o",
            json_path.to_str().unwrap(),
            "--",
            bin.to_str().unwrap(),
            "heavy",
            "1000000",
        ],
        T,
    );
    ok(&o);
    let err = text(&o.stderr);
    assert!(!err.contains("lost"), "{err}");
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json_path).unwrap()).unwrap();
    assert_eq!(json["events_lost"], 0);
    // The target's pc was sampled (the suite runs as root: perf events are
    // permitted), and with every call probed, some samples are in weft's code.
    let (pcs, in_probes) = (
        json["pc_samples"].as_u64().unwrap(),
        json["pc_samples_in_probes"].as_u64().unwrap(),
    );
    assert!(
        pcs > 0 && in_probes > 0 && in_probes < pcs,
        "{pcs} {in_probes}"
    );
    let rows = functions(&json);
    for (name, n) in [("leaf", 1_000_000), ("batch", 1_000)] {
        let r = row(&rows, name).unwrap();
        assert_eq!(
            (r["calls"].as_u64(), r["samples"].as_u64()),
            (Some(n), Some(n)),
            "{name}"
        );
    }
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
    let e = err(&["fperf", "-e", "cpu-migrations", "--", b, "ratio", "1"]);
    assert!(e.contains("does not count migrations"), "{e}");
    let e = err(&["fperf", "--budget", "0", "--", b, "ratio", "1"]);
    assert!(e.contains("--budget 0: out of range"), "{e}");
    let e = err(&["fperf", "--budget", "lots", "--", b, "ratio", "1"]);
    assert!(e.contains("--budget lots: not a percentage"), "{e}");
}

/// Runs `weft fperf -v -o JSON ARGS -- fperf.c MODE N STOP` until weft has woven
/// functions back and taken them out again three times (its `-v` lines), then
/// lets the target finish (the stop file); the JSON and what weft printed.
fn run_until_rewoven(args: &[&str], mode: &str, n: &str) -> (serde_json::Value, String) {
    let bin = build("fperf.c", Variant::O2_PIE, &[]);
    let dir = std::env::temp_dir().join(format!("weft-fperf-{}-{mode}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let json_path = dir.join("p.json");
    let stop = dir.join("stop");
    let mut all: Vec<&str> = vec!["fperf", "-v", "-o", json_path.to_str().unwrap()];
    all.extend(args);
    all.extend(["--", bin.to_str().unwrap(), mode, n, stop.to_str().unwrap()]);
    let mut b = Background::start(&all);
    // Three times out and back, then out again.
    b.wait_line(": unwove ", true, T);
    for _ in 0..3 {
        b.wait_line(": rewove ", true, T);
        b.wait_line(": unwove ", true, T);
    }
    std::fs::write(&stop, "").unwrap();
    let o = b.finish(T);
    let out = format!("{}{}", ok(&o), text(&o.stderr));
    let json = serde_json::from_str(&std::fs::read_to_string(&json_path).unwrap()).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    (json, out)
}

/// A call-heavy program (a ~50 ns leaf called in a loop) at --budget 5: the
/// overhead weft measures stays within a point of the budget because functions
/// go out when it is spent and come back at a later interval; every function
/// called is sampled.
#[test]
fn the_budget_holds_on_a_call_heavy_program() {
    let (json, out) = run_until_rewoven(&["--budget", "5"], "heavy", "1000000");
    let overhead = json["overhead_percent"].as_f64().unwrap();
    assert!(overhead <= 6.0, "measured overhead {overhead}%: {out}");
    assert!(json["unweaves"].as_u64().unwrap() >= 4, "{out}");
    assert!(json["reweaves"].as_u64().unwrap() >= 3, "{out}");
    let rows = functions(&json);
    for f in ["main", "batch", "leaf"] {
        let r = row(&rows, f).unwrap_or_else(|| panic!("{f} missing: {out}"));
        assert!(r["samples"].as_u64().unwrap() >= 1, "{r}");
    }
    assert!(out.contains("measured overhead"), "{out}");
}

/// Functions go out and come back while 2 threads are inside them (outer and mid
/// are open whenever leaf runs): the target's results stay right, and every
/// sampled call is paired with its own exit (return probes keep the hijack, so a
/// return runs exactly for the calls whose entry ran): no exit without its
/// entry, no sampled entry of the target's functions left open. Calls are
/// counted only while woven, so fperf's counts are at most the target's.
#[test]
fn functions_go_out_and_back_with_calls_open_on_two_threads() {
    let (json, out) = run_until_rewoven(&["--budget", "5"], "threads", "100");
    let line = out
        .lines()
        .find(|l| l.starts_with("outer "))
        .unwrap_or_else(|| panic!("{out}"));
    let w: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .step_by(2)
        .map(|v| v.parse().unwrap())
        .collect();
    let (outer, mid, leaf, wrong) = (w[0], w[1], w[2], w[3]);
    assert!(
        outer >= 200 && mid == 10 * outer && leaf == 100 * mid && wrong == 0,
        "{line}"
    );
    assert!(json["unweaves"].as_u64().unwrap() >= 4, "{out}");
    assert!(json["reweaves"].as_u64().unwrap() >= 3, "{out}");
    assert_eq!(json["orphan_exits"], 0, "{out}");
    let rows = functions(&json);
    for (f, made) in [
        ("outer", outer),
        ("mid", mid),
        ("leaf", leaf),
        ("worker", 2),
    ] {
        let r = row(&rows, f).unwrap_or_else(|| panic!("{f} missing: {out}"));
        let (calls, samples) = (r["calls"].as_u64().unwrap(), r["samples"].as_u64().unwrap());
        assert!(samples >= 1 && samples <= calls && calls <= made, "{r}");
        assert_eq!(r["open_samples"], 0, "{r}");
    }
}
