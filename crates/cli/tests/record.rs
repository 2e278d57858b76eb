//! `weft record`: function entries and exits of real C programs, read back from the
//! record file (by weft's reader and by the Python one) and checked call by call.

mod common;

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::time::Duration;

use common::*;
use weft_trace::record::{Frame, Reader};
use weft_trace::{Event, Record};

const T: Duration = Duration::from_secs(60);

/// The function records of a file, and the names of the functions by (pid, address).
fn read(path: &Path) -> (Vec<Record>, HashMap<(u32, u64), String>) {
    let f = std::fs::File::open(path).unwrap();
    let mut r = Reader::new(std::io::BufReader::new(f)).unwrap();
    let (mut records, mut names) = (Vec::new(), HashMap::new());
    while let Some(frame) = r.next_frame().unwrap() {
        let Frame::Record(rec) = frame else { continue };
        match &rec.event {
            Event::Function { func, name } => {
                let old = names.insert((rec.pid, *func), name.clone());
                assert!(old.is_none(), "{name} named twice");
            }
            Event::FunctionEntry { func, .. } | Event::FunctionExit { func, .. } => {
                assert!(
                    names.contains_key(&(rec.pid, *func)),
                    "function {func:#x} used before it was named"
                );
                records.push(rec);
            }
            _ => {}
        }
    }
    (records, names)
}

/// What calltree.c's threads (t = 1..=threads) and main (t = 100) call.
struct Calls {
    /// Per function: entries, exits.
    counts: BTreeMap<String, (u64, u64)>,
    /// `run(t)`'s arguments, sorted.
    run_args: Vec<u64>,
    /// `parse(i, t)`'s argument pairs, sorted.
    parse_args: Vec<(u64, u64)>,
    /// `leaf`'s return values, sorted.
    leaf_returns: Vec<u64>,
    threads: usize,
}

/// Walks each thread's records as a call stack: every exit closes that thread's
/// latest entry, run calls parse calls leaf, time never goes back.
fn calls(records: &[Record], names: &HashMap<(u32, u64), String>) -> Calls {
    let mut c = Calls {
        counts: BTreeMap::new(),
        run_args: Vec::new(),
        parse_args: Vec::new(),
        leaf_returns: Vec::new(),
        threads: 0,
    };
    let mut stacks: HashMap<(u32, u32), (Vec<String>, u64)> = HashMap::new();
    for r in records {
        let (stack, last) = stacks.entry((r.pid, r.tid)).or_default();
        assert!(r.nsecs >= *last, "time went back on thread {}", r.tid);
        *last = r.nsecs;
        match &r.event {
            Event::FunctionEntry { func, args } => {
                let name = names[&(r.pid, *func)].clone();
                let parent = stack.last().map(String::as_str);
                let want_parent = match name.as_str() {
                    "run" => None,
                    "parse" => Some("run"),
                    "leaf" => Some("parse"),
                    other => panic!("unexpected function {other}"),
                };
                assert_eq!(parent, want_parent, "{name} called from {parent:?}");
                match name.as_str() {
                    "run" => c.run_args.push(args[0]),
                    "parse" => c.parse_args.push((args[0], args[1])),
                    _ => {}
                }
                assert_eq!(args.len(), 2);
                c.counts.entry(name.clone()).or_default().0 += 1;
                stack.push(name);
            }
            Event::FunctionExit { func, retval } => {
                let name = &names[&(r.pid, *func)];
                assert_eq!(stack.pop().as_ref(), Some(name), "exit of {name} unopened");
                if name == "leaf" {
                    c.leaf_returns.push(*retval);
                }
                c.counts.entry(name.clone()).or_default().1 += 1;
            }
            _ => unreachable!(),
        }
    }
    for (t, (stack, _)) in &stacks {
        assert!(stack.is_empty(), "thread {t:?} left {stack:?} open");
    }
    c.threads = stacks.len();
    c.run_args.sort();
    c.parse_args.sort();
    c.leaf_returns.sort();
    c
}

/// What `calls` must find for calltree.c run with `ts` as its callers' `t`.
fn check_calltree(c: &Calls, ts: &[u64]) {
    let n = ts.len() as u64;
    let want: BTreeMap<String, (u64, u64)> = [
        ("leaf".to_string(), (6 * n, 6 * n)),
        ("parse".to_string(), (3 * n, 3 * n)),
        ("run".to_string(), (n, n)),
    ]
    .into();
    assert_eq!(c.counts, want);
    let mut run_args = ts.to_vec();
    run_args.sort();
    assert_eq!(c.run_args, run_args);
    let mut parse_args: Vec<(u64, u64)> = ts
        .iter()
        .flat_map(|&t| (0..3).map(move |i| (i, t)))
        .collect();
    parse_args.sort();
    assert_eq!(c.parse_args, parse_args);
    let mut leaf: Vec<u64> = ts
        .iter()
        .flat_map(|&t| (0..3).flat_map(move |i| [3 * (i + t), 3 * (i * t)]))
        .collect();
    leaf.sort();
    assert_eq!(c.leaf_returns, leaf);
    assert_eq!(c.threads, ts.len());
}

#[test]
fn record_writes_the_exact_call_tree_of_every_thread() {
    for v in all_variants() {
        let bin = build("calltree.c", v, &["-pthread"]);
        let dir = tempdir();
        let file = dir.join("calltree.rec");
        let o = weft(
            &[
                "record",
                "-F",
                "run",
                "-F",
                "parse",
                "-F",
                "leaf",
                "--args",
                "2",
                "--retval",
                "-o",
                file.to_str().unwrap(),
                "--",
                bin.to_str().unwrap(),
                "3",
            ],
            T,
        );
        let out = ok(&o);
        assert_eq!(out, format!("sum={}\n", calltree_sum(&[1, 2, 3, 100])));
        assert!(
            text(&o.stderr)
                .contains("weft: recorded 40 entries and 40 exits of 3 functions in 4 threads to"),
            "{}",
            text(&o.stderr)
        );
        let (records, names) = read(&file);
        let mut named: Vec<&str> = names.values().map(String::as_str).collect();
        named.sort();
        assert_eq!(named, ["leaf", "parse", "run"], "{v:?}");
        check_calltree(&calls(&records, &names), &[1, 2, 3, 100]);

        // The same file through the reader that is not weft.
        let lines = python_dump(&file);
        let count = |kind: &str, func: &str| {
            lines
                .lines()
                .filter(|l| {
                    l.contains(&format!("\"kind\": \"{kind}\""))
                        && l.contains(&format!("\"function\": \"{func}\""))
                })
                .count()
        };
        assert_eq!(
            (count("entry", "leaf"), count("exit", "leaf")),
            (24, 24),
            "{v:?}"
        );
        assert_eq!(count("entry", "run"), 4);
        assert!(lines.contains("\"function\": \"leaf\", \"address\": "));
        assert!(
            lines.contains("\"retval\": 306"),
            "leaf(2 + 100) returning 306 is missing"
        );
    }
}

/// Without `--args` or `--retval` every event is a 16-byte record: the same call
/// tree, nested and timed, read by weft and by the Python reader, in a smaller
/// file than with return values.
#[test]
fn record_without_arguments_or_values_writes_short_events() {
    let bin = build("calltree.c", Variant::O2_PIE, &["-pthread"]);
    let dir = tempdir();
    let run = |file: &Path, extra: &[&str]| {
        let mut args = vec!["record", "-F", "run", "-F", "parse", "-F", "leaf"];
        args.extend_from_slice(extra);
        args.extend([
            "-o",
            file.to_str().unwrap(),
            "--",
            bin.to_str().unwrap(),
            "3",
        ]);
        let o = weft(&args, T);
        ok(&o);
        assert!(
            text(&o.stderr)
                .contains("weft: recorded 40 entries and 40 exits of 3 functions in 4 threads to"),
            "{}",
            text(&o.stderr)
        );
    };
    let short = dir.join("short.rec");
    let long = dir.join("long.rec");
    let monotonic = || {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: ts is a valid timespec for the call to fill.
        assert_eq!(
            unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) },
            0
        );
        ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
    };
    let before = monotonic();
    run(&short, &[]);
    let after = monotonic();
    run(&long, &["--retval"]);
    let (records, names) = read(&short);
    let mut counts: BTreeMap<String, (u64, u64)> = BTreeMap::new();
    let mut stacks: HashMap<u32, (Vec<String>, u64)> = HashMap::new();
    for r in &records {
        // CLOCK_MONOTONIC nanoseconds, within the run.
        assert!(
            (before..=after).contains(&r.nsecs),
            "{} outside {before}..{after}",
            r.nsecs
        );
        let (stack, last) = stacks.entry(r.tid).or_default();
        assert!(r.nsecs >= *last, "time went back on thread {}", r.tid);
        *last = r.nsecs;
        match &r.event {
            Event::FunctionEntry { func, args } => {
                assert!(args.is_empty());
                let name = names[&(r.pid, *func)].clone();
                counts.entry(name.clone()).or_default().0 += 1;
                stack.push(name);
            }
            Event::FunctionExit { func, retval } => {
                assert_eq!(*retval, 0, "a short exit carries no value");
                let name = &names[&(r.pid, *func)];
                assert_eq!(stack.pop().as_ref(), Some(name));
                counts.entry(name.clone()).or_default().1 += 1;
            }
            _ => unreachable!(),
        }
    }
    let want: BTreeMap<String, (u64, u64)> = [
        ("leaf".to_string(), (24, 24)),
        ("parse".to_string(), (12, 12)),
        ("run".to_string(), (4, 4)),
    ]
    .into();
    assert_eq!(counts, want);
    // 40 exits 24 bytes shorter each (16 against 32 + the value): 960 bytes,
    // less what a drain splitting a thread's events into one more frame adds.
    let size = |f: &Path| std::fs::metadata(f).unwrap().len();
    assert!(
        size(&short) + 40 * 16 < size(&long),
        "{} {}",
        size(&short),
        size(&long)
    );
    let lines = python_dump(&short);
    let n = |kind: &str| {
        lines
            .lines()
            .filter(|l| l.contains(&format!("\"kind\": \"{kind}\"")))
            .count()
    };
    assert_eq!((n("entry"), n("exit")), (40, 40));
    assert!(!lines
        .lines()
        .any(|l| l.contains("\"kind\": \"exit\"") && l.contains("retval")));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `scripts/weft-record-dump`'s output for a record file (the reader that is not
/// weft): one JSON object a line.
fn python_dump(file: &Path) -> String {
    let dump = std::process::Command::new(repo_root().join("scripts/weft-record-dump"))
        .arg(file)
        .output()
        .unwrap();
    assert!(dump.status.success(), "{}", text(&dump.stderr));
    text(&dump.stdout)
}

/// The kinds of a record file's frames, in file order (the reader keeps clock
/// frames to itself).
fn frame_kinds(path: &Path) -> Vec<u16> {
    let data = std::fs::read(path).unwrap();
    let u32_at = |at: usize| u32::from_le_bytes(data[at..at + 4].try_into().unwrap()) as usize;
    let mut at = 16 + u32_at(12);
    let mut kinds = Vec::new();
    while at < data.len() {
        kinds.push(u16::from_le_bytes(data[at + 4..at + 6].try_into().unwrap()));
        at += 4 + u32_at(at);
    }
    kinds
}

/// A short entry keeps the raw TSC, and the file the clock's lines (kind 21):
/// over 2 s weft recalibrates several times, and each entry's time, converted
/// where the file is read, lies between the `nsecs` its advice read just before
/// and just after it, on every line — as weft's reader and the Python one read it.
#[test]
fn raw_times_are_read_on_the_clock_line_of_their_moment() {
    let bin = build("clock.c", Variant::O2_PIE, &[]);
    let b = bin.to_str().unwrap();
    let dir = tempdir();
    let file = dir.join("clock.rec");
    let n = 400;
    let prog = format!(
        "uprobe:{b}:stamp {{ printf(\"%llu\\n\", nsecs); __weft_entry(0); printf(\"%llu\\n\", nsecs); }}"
    );
    let cmd = format!("{b} {n} 5000");
    let o = weft_with_input(
        &[
            "trace",
            "--record",
            file.to_str().unwrap(),
            "-e",
            &prog,
            "-c",
            &cmd,
        ],
        &[],
        b"go\n",
        T,
    );
    let stdout = text(&o.stdout);
    assert!(o.status.success(), "{stdout}{}", text(&o.stderr));
    let seen: Vec<u64> = stdout.lines().filter_map(|l| l.parse().ok()).collect();
    assert_eq!(seen.len(), 2 * n, "{stdout}");
    let (records, _) = read(&file);
    let entries: Vec<u64> = records
        .iter()
        .filter(|r| matches!(r.event, Event::FunctionEntry { .. }))
        .map(|r| r.nsecs)
        .collect();
    assert_eq!(entries.len(), n);
    for (i, &t) in entries.iter().enumerate() {
        let (lo, hi) = (seen[2 * i], seen[2 * i + 1]);
        assert!(lo <= t && t <= hi, "entry {i}: {t} not within {lo}..={hi}");
    }
    let clocks = frame_kinds(&file).iter().filter(|&&k| k == 21).count();
    assert!(clocks >= 3, "{clocks} clock lines in 2 s");
    let dumped: Vec<u64> = python_dump(&file)
        .lines()
        .filter(|l| l.contains("\"kind\": \"entry\""))
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            v["nsecs"].as_u64().unwrap()
        })
        .collect();
    assert_eq!(dumped, entries);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// calltree.c's printed sum when its callers pass `ts`.
fn calltree_sum(ts: &[u64]) -> String {
    let s: u64 = ts
        .iter()
        .flat_map(|&t| (0..3).map(move |i| 3 * (i + t) + 3 * (i * t)))
        .sum();
    s.to_string()
}

/// A running process, recorded from the moment weft attaches: its calls after
/// that, all of them, and nothing else.
#[test]
fn record_an_attached_process_until_it_exits() {
    let bin = build("calltree.c", Variant::O2_PIE, &["-pthread"]);
    record_attached(&bin, |_| ());
}

/// A program upgraded on disk while it runs (a new file renamed over its path):
/// weft records the code the process runs, read from its mapping, and names the
/// program by its path, not "PATH (deleted)".
#[test]
fn record_a_process_whose_program_was_replaced_on_disk() {
    let built = build("calltree.c", Variant::O2_PIE, &["-pthread"]);
    let dir = tempdir();
    let bin = dir.join("calltree");
    // A link, not a copy: a file this (multithreaded) test process just wrote may
    // still be open in a child another test thread forked, and exec would fail
    // with "Text file busy".
    std::fs::hard_link(&built, &bin).unwrap();
    record_attached(&bin, |bin| {
        let new = bin.with_extension("new");
        std::fs::copy(bin, &new).unwrap();
        std::fs::rename(&new, bin).unwrap();
    });
}

/// Starts `bin` waiting for its input, calls `meddle` with it, records it with
/// `weft record -p` and checks the call tree.
fn record_attached(bin: &Path, meddle: impl FnOnce(&Path)) {
    use std::io::Write;
    let mut t = std::process::Command::new(bin)
        .args(["2", "wait"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    meddle(bin);
    let dir = tempdir();
    let file = dir.join("attached.rec");
    let pid = t.id().to_string();
    let w = std::process::Command::new(weft_bin())
        .args([
            "record",
            "--args",
            "2",
            "--retval",
            "-o",
            file.to_str().unwrap(),
            "-p",
            &pid,
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Woven when the code differs from the file; the target, blocked reading its
    // input, makes its calls only after that.
    let start = std::time::Instant::now();
    let mut w = w;
    while code_matches_file(t.id() as i32, bin) {
        if w.try_wait().unwrap().is_some() {
            let o = w.wait_with_output().unwrap();
            let _ = t.kill();
            panic!(
                "weft ended before weaving ({}): {}{}",
                o.status,
                text(&o.stdout),
                text(&o.stderr)
            );
        }
        if start.elapsed() > T {
            let _ = w.kill();
            let o = w.wait_with_output().unwrap();
            let _ = t.kill();
            panic!("weft never wove the target: {}", text(&o.stderr));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    t.stdin.take().unwrap().write_all(b"go\n").unwrap();
    let got = t.wait_with_output().unwrap();
    assert!(got.status.success());
    assert_eq!(
        text(&got.stdout),
        format!("sum={}\n", calltree_sum(&[1, 2, 100]))
    );
    let o = wait_output(w, T);
    assert!(o.status.success(), "{}", text(&o.stderr));
    // Every function of the program was recorded (the default pattern); the ones
    // of the call tree are exactly its calls.
    let (records, names) = read(&file);
    let tree: Vec<Record> = records
        .into_iter()
        .filter(|r| match &r.event {
            Event::FunctionEntry { func, .. } | Event::FunctionExit { func, .. } => {
                matches!(names[&(r.pid, *func)].as_str(), "run" | "parse" | "leaf")
            }
            _ => false,
        })
        .collect();
    check_calltree(&calls(&tree, &names), &[1, 2, 100]);
    let main_entries = names
        .iter()
        .filter(|(_, n)| n.as_str() == "thread_main")
        .count();
    assert_eq!(main_entries, 1, "{names:?}");
}

/// A million calls as fast as one thread makes them (two million events, far
/// more than a ring holds): `weft record`'s producers wait for weft when a ring is
/// full, so none is lost, and the file holds every one, in order.
#[test]
fn a_burst_of_calls_faster_than_weft_drains_loses_nothing() {
    const N: u64 = 1_000_000;
    let bin = build("calls.c", Variant::O2_PIE, &[]);
    let dir = tempdir();
    let file = dir.join("burst.rec");
    let o = weft(
        &[
            "record",
            "-F",
            "work",
            "--retval",
            "-o",
            file.to_str().unwrap(),
            "--",
            bin.to_str().unwrap(),
            &N.to_string(),
        ],
        T,
    );
    ok(&o);
    let err = text(&o.stderr);
    assert!(
        err.contains(&format!(
            "weft: recorded {N} entries and {N} exits of 1 functions in 1 threads"
        )),
        "{err}"
    );
    assert!(!err.contains("Lost"), "{err}");
    let (records, _) = read(&file);
    assert_eq!(records.len() as u64, 2 * N);
    let mut last = 0;
    for (i, r) in records.iter().enumerate() {
        assert!(r.nsecs >= last, "time went back at record {i}");
        last = r.nsecs;
        match (&r.event, i % 2) {
            (Event::FunctionEntry { .. }, 0) => {}
            (Event::FunctionExit { retval, .. }, 1) => assert_eq!(*retval, i as u64 / 2 * 2 + 1),
            (e, _) => panic!("record {i}: {e:?}"),
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A weft that stops draining (SIGSTOP) while the program makes more calls than
/// a ring holds: the program waits once (`RING_WAIT_NS`) for weft, then drops
/// its events at once, each counted: it finishes its calls with weft still
/// stopped, and once weft runs again the record holds the events written before
/// the ring filled, and entries, exits and lost events add up to two per call.
#[test]
fn a_stopped_weft_costs_the_program_one_wait_and_every_lost_event_is_counted() {
    use std::io::Write;
    const N: u64 = 2_000_000;
    let bin = build("burst.c", Variant::O2_PIE, &[]);
    let mut t = Spawned::start_piped(&bin, &[&N.to_string()]);
    t.wait_line("ready", T);
    let dir = tempdir();
    let file = dir.join("stopped.rec");
    let pid = t.child.id();
    let w = std::process::Command::new(weft_bin())
        .args(["record", "-F", "work", "-o", file.to_str().unwrap(), "-p"])
        .arg(pid.to_string())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Woven when the code differs from the file.
    let start = std::time::Instant::now();
    while code_matches_file(pid as i32, &bin) {
        assert!(start.elapsed() < T, "weft never wove the target");
        std::thread::sleep(Duration::from_millis(5));
    }
    let weft_pid = nix::unistd::Pid::from_raw(w.id() as i32);
    nix::sys::signal::kill(weft_pid, nix::sys::signal::Signal::SIGSTOP).unwrap();
    let stdin = t.child.stdin.as_mut().unwrap();
    stdin.write_all(b"go\n").unwrap();
    stdin.flush().unwrap();
    // Every call made, weft still stopped.
    let mut lines = Vec::new();
    while !lines.iter().any(|l: &String| l == "done") {
        lines.push(
            t.lines
                .recv_timeout(T)
                .expect("the program finishes its calls"),
        );
    }
    let want = (0..N).map(|i| 2 * i + 1).sum::<u64>();
    assert_eq!(lines, [format!("sum={want}"), "done".to_string()]);
    nix::sys::signal::kill(weft_pid, nix::sys::signal::Signal::SIGCONT).unwrap();
    t.child.stdin.as_mut().unwrap().write_all(b"end\n").unwrap();
    assert!(t.child.wait().unwrap().success());
    let o = wait_output(w, T);
    let err = text(&o.stderr);
    assert!(o.status.success(), "{err}");
    let num = |re: &str| -> u64 {
        let c = regex::Regex::new(re).unwrap().captures(&err);
        c.unwrap_or_else(|| panic!("no {re} in:\n{err}"))[1]
            .parse()
            .unwrap()
    };
    let lost = num(r"Lost (\d+) events");
    let entries = num(r"recorded (\d+) entries");
    let exits = num(r"entries and (\d+) exits");
    assert!(lost > 0 && entries > 0, "{err}");
    assert_eq!(entries + exits + lost, 2 * N, "{err}");
    // The file holds exactly what was recorded: the first calls, in order.
    let (records, _) = read(&file);
    assert_eq!(records.len() as u64, entries + exits);
    for (i, r) in records.iter().enumerate() {
        match (&r.event, i % 2) {
            (Event::FunctionEntry { .. }, 0) | (Event::FunctionExit { .. }, 1) => {}
            (e, _) => panic!("record {i}: {e:?}"),
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn record_refuses_bad_requests_clearly() {
    let bin = build("calltree.c", Variant::O2_PIE, &["-pthread"]);
    let b = bin.to_str().unwrap();
    let dir = tempdir();
    let file = dir.join("refused.rec");
    let f = file.to_str().unwrap();
    for (args, want) in [
        (vec!["record", "-o", f], "weft: record needs a target"),
        (
            vec!["record", "-o", f, "--args", "7", "--", b],
            "7 is not in 0..=6",
        ),
        (
            vec!["record", "-o", f, "-F", "a b", "--", b],
            "-F a b: not a function pattern",
        ),
        (
            vec![
                "record",
                "-o",
                f,
                "-F",
                "no_such_function_anywhere",
                "--",
                b,
            ],
            "function `no_such_function_anywhere` not found",
        ),
        (
            vec!["record", "-o", "/nonexistent/dir/x.rec", "--", b],
            "creating /nonexistent/dir/x.rec",
        ),
        (
            vec!["record", "-o", f, "--", "/nonexistent/program"],
            "/nonexistent/program: command not found",
        ),
    ] {
        let o = weft(&args, T);
        assert!(!o.status.success(), "{args:?} succeeded");
        let err = text(&o.stderr);
        assert!(err.contains(want), "{args:?}: {err}");
    }
}

/// A fresh directory under the target dir (removed with it).
fn tempdir() -> std::path::PathBuf {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let d = repo_root().join("target/tmp").join(format!(
        "record-{}-{}",
        std::process::id(),
        N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&d).unwrap();
    d
}
