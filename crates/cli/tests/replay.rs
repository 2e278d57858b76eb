//! `weft replay`, `report` and `dump` over a record of a known call tree
//! (tests/targets/replay.c), recorded once by `weft record` into a directory.

mod common;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

use common::*;

const T: Duration = Duration::from_secs(60);

/// The record directory of replay.c's run: main(1) → a(1) → b ×3, main → c(5);
/// worker(0) → d ×2 on a second thread. Made once for every test here.
fn recorded() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let bin = build("replay.c", Variant::O2_PIE, &["-pthread"]);
        let dir = tempdir().join("rec/");
        let mut args = vec!["record"];
        for f in ["main", "a", "b", "c", "d", "worker"] {
            args.extend(["-F", f]);
        }
        let d = dir.to_str().unwrap();
        args.extend([
            "--args",
            "1",
            "--retval",
            "-o",
            d,
            "--",
            bin.to_str().unwrap(),
        ]);
        let o = weft(&args, T);
        assert_eq!(ok(&o), "r=19\n");
        assert!(
            text(&o.stderr)
                .contains("weft: recorded 9 entries and 9 exits of 6 functions in 2 threads to"),
            "{}",
            text(&o.stderr)
        );
        // `-o DIR/` writes DIR/weft.rec.
        assert!(dir.join("weft.rec").is_file());
        dir
    })
}

fn run(args: &[&str]) -> String {
    let mut a = args.to_vec();
    a.insert(1, recorded().to_str().unwrap());
    ok(&weft(&a, T))
}

/// Replay's lines with each duration written `D` and each thread id `tN` (N: the
/// order the ids first appear in).
fn normalized(out: &str) -> (String, Vec<u32>) {
    let dur = regex::Regex::new(r"^ +\d+\.\d{3} (us|ms| s| m| h) \[").unwrap();
    let tid = regex::Regex::new(r"\[ *(\d+)\]").unwrap();
    let mut tids: Vec<u32> = Vec::new();
    let mut lines = Vec::new();
    for l in out.lines() {
        let l = dur.replace(l, "D [").into_owned();
        let l = l.replacen("            [", "  [", 1);
        let l = tid
            .replace(&l, |c: &regex::Captures<'_>| {
                let t: u32 = c[1].parse().unwrap();
                let n = tids.iter().position(|&x| x == t).unwrap_or_else(|| {
                    tids.push(t);
                    tids.len() - 1
                });
                format!("[t{n}]")
            })
            .into_owned();
        lines.push(l);
    }
    (lines.join("\n") + "\n", tids)
}

const TREE: &str = "\
# DURATION     TID     FUNCTION
  [t0] | main(1) {
  [t0] |   a(1) {
D [t0] |     b(1) = 2;
D [t0] |     b(2) = 4;
D [t0] |     b(3) = 6;
D [t0] |   } = 12; /* a */
D [t0] |   c(5) = 7;
D [t0] | } = 0; /* main */
  [t1] | worker(0) {
D [t1] |   d(1) = 2;
D [t1] |   d(2) = 3;
D [t1] | } = 0; /* worker */
";

#[test]
fn replay_prints_the_exact_call_tree() {
    let out = run(&["replay"]);
    let (tree, tids) = normalized(&out);
    assert_eq!(tree, TREE, "{out}");
    assert_eq!(tids.len(), 2);
    // The layout is uftrace's: a duration right-aligned in 10 columns, the thread
    // id in 6, two spaces of indent a level.
    let leaf = out.lines().find(|l| l.contains("b(1) = 2;")).unwrap();
    let want = regex::Regex::new(r"^ [ \d]{3}\.\d{3} us \[ *\d+\] \|     b\(1\) = 2;$").unwrap();
    assert!(want.is_match(leaf), "{leaf:?}");
    assert!(out.lines().nth(1).unwrap().starts_with("            [ "));
}

#[test]
fn replay_filters_by_depth_thread_function_and_duration() {
    let (out, tids) = normalized(&run(&["replay"]));
    assert_eq!(out, TREE);
    let header = "# DURATION     TID     FUNCTION\n";
    assert_eq!(
        normalized(&run(&["replay", "--depth", "1"])).0,
        format!("{header}D [t0] | main(1) = 0;\nD [t1] | worker(0) = 0;\n")
    );
    assert_eq!(
        normalized(&run(&["replay", "-D", "2"])).0,
        format!(
            "{header}  [t0] | main(1) {{\nD [t0] |   a(1) = 12;\nD [t0] |   c(5) = 7;\nD [t0] | }} = 0; /* main */\n{}",
            &TREE[TREE.find("  [t1]").unwrap()..]
        )
    );
    let worker = tids[1].to_string();
    assert_eq!(
        normalized(&run(&["replay", "--tid", &worker])).0,
        format!("{header}{}", &TREE[TREE.find("  [t1]").unwrap()..]).replace("t1", "t0")
    );
    assert_eq!(
        normalized(&run(&["replay", "-F", "a"])).0,
        format!(
            "{header}  [t0] | a(1) {{\nD [t0] |   b(1) = 2;\nD [t0] |   b(2) = 4;\nD [t0] |   b(3) = 6;\nD [t0] | }} = 12; /* a */\n"
        )
    );
    assert_eq!(
        normalized(&run(&["replay", "--filter", "[cd]"])).0,
        format!("{header}D [t0] | c(5) = 7;\nD [t1] | d(1) = 2;\nD [t1] | d(2) = 3;\n")
    );
    assert_eq!(
        normalized(&run(&["replay", "-N", "b", "-N", "worker"])).0,
        format!(
            "{header}  [t0] | main(1) {{\nD [t0] |   a(1) = 12;\nD [t0] |   c(5) = 7;\nD [t0] | }} = 0; /* main */\n"
        )
    );
    // Nothing lasts an hour; everything lasts a nanosecond.
    assert_eq!(run(&["replay", "--time-filter", "1h"]), header);
    assert_eq!(normalized(&run(&["replay", "-t", "1ns"])).0, TREE);
}

/// `weft report`'s rows: name → (calls, total, self, avg, min, max) in ns.
fn report(sort: &str) -> Vec<(String, [u64; 6])> {
    let out = run(&["report", "-s", sort]);
    let mut lines = out.lines();
    assert_eq!(
        lines.next().unwrap(),
        "  Total time   Self time       Calls   Total avg   Total min   Total max  Function"
    );
    assert!(lines
        .next()
        .unwrap()
        .starts_with("  ==========  =========="));
    let ns = |v: &str, unit: &str| -> u64 {
        let (w, f) = v.split_once('.').unwrap();
        let scale = match unit {
            "us" => 1,
            "ms" => 1000,
            "s" => 1_000_000,
            other => panic!("unit {other}"),
        };
        (w.parse::<u64>().unwrap() * 1000 + f.parse::<u64>().unwrap()) * scale
    };
    lines
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            assert_eq!(f.len(), 12, "{l}");
            (
                f[11].to_string(),
                [
                    f[4].parse().unwrap(),
                    ns(f[0], f[1]),
                    ns(f[2], f[3]),
                    ns(f[5], f[6]),
                    ns(f[7], f[8]),
                    ns(f[9], f[10]),
                ],
            )
        })
        .collect()
}

#[test]
fn report_counts_every_call_and_self_time_within_total() {
    let rows = report("total");
    let calls: BTreeMap<&str, u64> = rows.iter().map(|(n, v)| (n.as_str(), v[0])).collect();
    let want: BTreeMap<&str, u64> = [
        ("a", 1),
        ("b", 3),
        ("c", 1),
        ("d", 2),
        ("main", 1),
        ("worker", 1),
    ]
    .into();
    assert_eq!(calls, want);
    for (name, [_, total, self_ns, avg, min, max]) in &rows {
        assert!(self_ns <= total, "{name}");
        assert!(min <= avg && avg <= max, "{name}");
    }
    // Sorted by total, largest first; main's total holds a's, b's and c's.
    let totals: Vec<u64> = rows.iter().map(|r| r.1[1]).collect();
    assert!(totals.windows(2).all(|w| w[0] >= w[1]), "{rows:?}");
    let get = |n: &str| rows.iter().find(|r| r.0 == n).unwrap().1;
    assert!(get("main")[1] >= get("a")[1] + get("c")[1]);
    assert!(get("a")[1] >= get("b")[1]);
    assert_eq!(report("calls")[0].0, "b");
    let names: Vec<String> = report("name").into_iter().map(|r| r.0).collect();
    assert_eq!(names, ["a", "b", "c", "d", "main", "worker"]);
    // Threads: the worker's alone.
    let (_, tids) = normalized(&run(&["replay"]));
    let out = run(&["report", "--tid", &tids[1].to_string(), "-s", "name"]);
    let names: Vec<&str> = out
        .lines()
        .skip(2)
        .map(|l| l.split_whitespace().last().unwrap())
        .collect();
    assert_eq!(names, ["d", "worker"]);
}

#[test]
fn chrome_trace_pairs_every_begin_with_its_end() {
    let dir = tempdir();
    let file = dir.join("trace.json");
    let out = run(&["dump", "--chrome", "-o", file.to_str().unwrap()]);
    assert_eq!(out, "");
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    assert_eq!(json["displayTimeUnit"], "ns");
    assert_eq!(json["otherData"]["unfinished_calls"], 0);
    let events = json["traceEvents"].as_array().unwrap();
    let mut stacks: HashMap<u64, Vec<String>> = HashMap::new();
    let mut last: HashMap<u64, f64> = HashMap::new();
    let mut begun: BTreeMap<String, u32> = BTreeMap::new();
    let mut thread_names = BTreeSet::new();
    for e in events {
        let tid = e["tid"].as_u64();
        let name = e["name"].as_str().unwrap().to_string();
        match e["ph"].as_str().unwrap() {
            "M" => {
                assert!(["process_name", "thread_name"].contains(&name.as_str()));
                if name == "thread_name" {
                    thread_names.insert(tid.unwrap());
                }
                continue;
            }
            "B" => {
                *begun.entry(name.clone()).or_default() += 1;
                stacks.entry(tid.unwrap()).or_default().push(name);
            }
            "E" => {
                let open = stacks.get_mut(&tid.unwrap()).and_then(|s| s.pop());
                assert_eq!(open.as_deref(), Some(name.as_str()), "E without its B");
            }
            other => panic!("phase {other}"),
        }
        let pid = e["pid"].as_u64().unwrap();
        assert!(pid > 0);
        let ts = e["ts"].as_f64().unwrap();
        let t = last.entry(tid.unwrap()).or_insert(0.0);
        assert!(ts >= *t, "time went back on thread {tid:?}");
        *t = ts;
    }
    assert!(
        stacks.values().all(Vec::is_empty),
        "B without its E: {stacks:?}"
    );
    let want: BTreeMap<String, u32> = [
        ("a", 1),
        ("b", 3),
        ("c", 1),
        ("d", 2),
        ("main", 1),
        ("worker", 1),
    ]
    .map(|(n, c)| (n.to_string(), c))
    .into();
    assert_eq!(begun, want);
    assert_eq!(thread_names.len(), 2);
    // Arguments and return values ride along.
    let b1 = events
        .iter()
        .find(|e| e["name"] == "b" && e["ph"] == "B")
        .unwrap();
    assert_eq!(b1["args"]["arguments"], "(1)");
    let c_end = events
        .iter()
        .find(|e| e["name"] == "c" && e["ph"] == "E")
        .unwrap();
    assert_eq!(c_end["args"]["retval"], "7");
}

#[test]
fn flame_graph_folds_stacks_and_draws_them() {
    let out = run(&["dump", "--flame"]);
    let stacks: BTreeSet<&str> = out
        .lines()
        .map(|l| {
            let (stack, ns) = l.rsplit_once(' ').unwrap();
            assert!(ns.parse::<u64>().unwrap() > 0, "{l}");
            stack
        })
        .collect();
    let want: BTreeSet<&str> =
        ["main", "main;a", "main;a;b", "main;c", "worker", "worker;d"].into();
    assert_eq!(stacks, want, "{out}");
    let dir = tempdir();
    let svg = dir.join("flame.svg");
    assert_eq!(run(&["dump", "--flame", "-o", svg.to_str().unwrap()]), "");
    let text = std::fs::read_to_string(&svg).unwrap();
    assert!(text.starts_with("<?xml") && text.contains("<svg"), "{text}");
    for f in ["main", "a", "b", "c", "worker", "d"] {
        assert!(text.contains(&format!("<title>{f} (")), "no frame {f}");
    }
    let piped = run(&["dump", "--flame", "--svg"]);
    assert!(piped.contains("<title>main ("));
}

#[test]
fn corrupt_and_cut_records_are_located() {
    let whole = std::fs::read(recorded().join("weft.rec")).unwrap();
    let dir = tempdir();
    // Not a record at all.
    let junk = dir.join("junk.rec");
    std::fs::write(&junk, b"hello, world\n").unwrap();
    let o = weft(&["replay", junk.to_str().unwrap()], T);
    assert!(!o.status.success());
    assert_eq!(
        text(&o.stderr),
        format!(
            "weft: {}: not a weft record file (no WEFTREC header)\n",
            junk.display()
        )
    );
    // A frame length that cannot be, at the third frame.
    let mut r = weft_trace::record::Reader::new(&whole[..]).unwrap();
    r.next_frame().unwrap();
    r.next_frame().unwrap();
    let at = r.offset() as usize;
    let mut bad = whole.clone();
    bad[at..at + 4].copy_from_slice(&u32::MAX.to_le_bytes());
    let file = dir.join("bad.rec");
    std::fs::write(&file, &bad).unwrap();
    for cmd in ["replay", "report"] {
        let o = weft(&[cmd, file.to_str().unwrap()], T);
        assert!(!o.status.success());
        assert_eq!(
            text(&o.stderr),
            format!(
                "weft: {}: corrupt record file at byte {at}: frame length\n",
                file.display()
            )
        );
    }
    let o = weft(&["dump", "--chrome", file.to_str().unwrap()], T);
    assert!(!o.status.success());
    assert!(text(&o.stderr).contains(&format!("corrupt record file at byte {at}")));
    // Cut inside the last frame (weft killed while writing): a warning, and the
    // rest is used.
    let cut = dir.join("cut.rec");
    std::fs::write(&cut, &whole[..whole.len() - 3]).unwrap();
    let o = weft(&["replay", cut.to_str().unwrap()], T);
    let out = ok(&o);
    assert!(
        text(&o.stderr).starts_with(&format!(
            "weft: warning: {}: the record file ends inside the frame at byte ",
            cut.display()
        )),
        "{}",
        text(&o.stderr)
    );
    assert!(normalized(&out)
        .0
        .starts_with("# DURATION     TID     FUNCTION\n  [t0] | main(1) {\n"));
    // No such record.
    let o = weft(&["report", dir.join("none").to_str().unwrap()], T);
    assert!(!o.status.success());
    assert!(text(&o.stderr).contains("none"), "{}", text(&o.stderr));
}

/// A record whose end came while main was still running (weft stopped before
/// main returned): replay shows main unfinished, and the Chrome trace still gives
/// it its `E`, at the thread's last time, saying so.
#[test]
fn calls_still_open_at_the_end_are_closed_and_marked() {
    use weft_trace::record::{Frame, Reader};
    use weft_trace::Event;
    let whole = std::fs::read(recorded().join("weft.rec")).unwrap();
    let mut r = Reader::new(&whole[..]).unwrap();
    // The file again, one frame per record (kinds 15 to 17, as the format allows)
    // up to main's exit, which is left out.
    let meta = serde_json::to_vec(&r.metadata).unwrap();
    let mut cut = b"WEFTREC\0".to_vec();
    cut.extend_from_slice(&1u32.to_le_bytes());
    cut.extend_from_slice(&(meta.len() as u32).to_le_bytes());
    cut.extend_from_slice(&meta);
    let mut main = None;
    loop {
        let Some(Frame::Record(rec)) = r.next_frame().unwrap() else {
            panic!("main's exit is not in the record");
        };
        let (kind, payload): (u16, Vec<u8>) = match &rec.event {
            Event::Function { func, name } => {
                if name == "main" {
                    main = Some(*func);
                }
                (17, [&func.to_le_bytes()[..], name.as_bytes()].concat())
            }
            Event::FunctionEntry { func, args } => (
                15,
                std::iter::once(func)
                    .chain(args)
                    .flat_map(|w| w.to_le_bytes())
                    .collect(),
            ),
            Event::FunctionExit { func, .. } if Some(*func) == main => break,
            Event::FunctionExit { func, retval } => {
                (16, [func.to_le_bytes(), retval.to_le_bytes()].concat())
            }
            _ => continue,
        };
        cut.extend_from_slice(&(20 + payload.len() as u32).to_le_bytes());
        cut.extend_from_slice(&kind.to_le_bytes());
        cut.extend_from_slice(&0u16.to_le_bytes());
        cut.extend_from_slice(&rec.nsecs.to_le_bytes());
        cut.extend_from_slice(&rec.pid.to_le_bytes());
        cut.extend_from_slice(&rec.tid.to_le_bytes());
        cut.extend_from_slice(&payload);
    }
    let dir = tempdir();
    let file = dir.join("open.rec");
    std::fs::write(&file, &cut).unwrap();
    let f = file.to_str().unwrap();
    let out = ok(&weft(&["replay", f], T));
    let (tree, _) = normalized(&out);
    let main_tree = &TREE[..TREE.find("D [t0] | } = 0; /* main */").unwrap()];
    assert!(
        tree.starts_with(&format!("{main_tree}D [t0] | }} /* main, unfinished */\n")),
        "{out}"
    );
    let json = ok(&weft(&["dump", "--chrome", f], T));
    let json: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(json["otherData"]["unfinished_calls"], 1);
    let events = json["traceEvents"].as_array().unwrap();
    let main_end: Vec<&serde_json::Value> = events
        .iter()
        .filter(|e| e["name"] == "main" && e["ph"] == "E")
        .collect();
    assert_eq!(main_end.len(), 1);
    assert_eq!(main_end[0]["args"]["unfinished"], true);
    // At the main thread's last time: its last event before it is c's end.
    let tid = &main_end[0]["tid"];
    let last_before = events
        .iter()
        .filter(|e| &e["tid"] == tid && e["ph"] != "M")
        .take_while(|e| e["name"] != "main" || e["ph"] != "E")
        .last()
        .unwrap();
    assert_eq!(last_before["name"], "c");
    assert_eq!(last_before["ts"], main_end[0]["ts"]);
}

/// A fresh directory under the target dir (removed with it).
fn tempdir() -> PathBuf {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let d = repo_root().join("target/tmp").join(format!(
        "replay-{}-{}",
        std::process::id(),
        N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&d).unwrap();
    d
}
