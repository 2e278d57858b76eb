//! The stress suite (issue 5): try hard to harm a target and check it is never
//! harmed. Each test counts what it did (cycles, kills, faults, inputs) and every
//! failure, records the counts for `tests/stress/RESULTS.md`, then asserts zero
//! failures, listing each one.
//!
//! CI runs the bounded version (the whole file in well under 10 minutes);
//! `tests/stress/soak --long` sets `WEFT_STRESS=long` for the long soak (1,000 storm
//! cycles, 100 kills, ...). `WEFT_STRESS_SEED` replays a run's random choices.
//!
//! Targets are C programs in `tests/stress/`; they check their own results and print
//! `CORRUPT ...` (and exit non-zero) on any wrong one.
//!
//! Failing reproducers of bugs outside `crates/inject` live in `stress_known.rs`.

mod common;

use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

const T: Duration = Duration::from_secs(60);

// ---------------------------------------------------------------------------------
// Harness: scale, tallies, watched targets.
// ---------------------------------------------------------------------------------

/// True for the soak run (`tests/stress/soak --long`).
fn long() -> bool {
    std::env::var("WEFT_STRESS").is_ok_and(|v| v == "long")
}

fn scale(ci: u64, soak: u64) -> u64 {
    if long() {
        soak
    } else {
        ci
    }
}

/// Tests that need root fail without it (CI runs as root): a skipped security test
/// would pass silently.
fn require_root(why: &str) {
    // SAFETY: getuid has no preconditions.
    let uid = unsafe { libc::getuid() };
    assert_eq!(
        uid, 0,
        "this test needs root ({why}); run the suite as root"
    );
}

fn b(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn stress(src: &str) -> PathBuf {
    build_in("tests/stress", src, Variant::O2_PIE, &[])
}

fn stress_v(src: &str, v: Variant, extra: &[&str]) -> PathBuf {
    build_in("tests/stress", src, v, extra)
}

const O0_NOPIE: Variant = Variant {
    opt: "-O0",
    pie: false,
    cet: false,
};

/// What one test did and what went wrong, recorded for RESULTS.md.
struct Tally {
    row: &'static str,
    unit: &'static str,
    count: u64,
    failures: Vec<String>,
}

impl Tally {
    fn new(row: &'static str, unit: &'static str) -> Tally {
        Tally {
            row,
            unit,
            count: 0,
            failures: Vec::new(),
        }
    }

    fn fail(&mut self, what: impl Into<String>) {
        let what = what.into();
        eprintln!("FAILURE [{}]: {what}", self.row);
        self.failures.push(what);
    }

    fn check(&mut self, ok: bool, what: impl FnOnce() -> String) {
        if !ok {
            self.fail(what());
        }
    }

    /// Record the counts (for the soak script's table), then fail if anything failed.
    fn finish(self) {
        let dir = std::env::var_os("WEFT_STRESS_RESULTS")
            .map(PathBuf::from)
            .unwrap_or_else(|| Path::new(env!("CARGO_TARGET_TMPDIR")).join("stress-results"));
        let _ = std::fs::create_dir_all(&dir);
        let line = format!(
            "{}\t{}\t{}\t{}\n",
            self.row,
            self.count,
            self.unit,
            self.failures.len()
        );
        let file = dir.join(format!("{}.tsv", self.row.replace([' ', '/', ','], "_")));
        let _ = std::fs::write(file, line);
        assert!(
            self.failures.is_empty(),
            "{}: {} failures in {} {}:\n{}",
            self.row,
            self.failures.len(),
            self.count,
            self.unit,
            self.failures.join("\n")
        );
    }
}

/// A running target that prints `ready`, `progress N` and `CORRUPT ...` lines.
struct Watched {
    t: Spawned,
    bin: PathBuf,
    progress: i64,
    last_progress_at: Instant,
    log: Vec<String>,
}

impl Watched {
    fn start(bin: &Path, args: &[&str]) -> Watched {
        let t = Spawned::start(bin, args);
        t.wait_line("ready", T);
        Watched {
            t,
            bin: bin.to_path_buf(),
            progress: 0,
            last_progress_at: Instant::now(),
            log: Vec::new(),
        }
    }

    fn pid(&self) -> i32 {
        self.t.pid()
    }

    /// Read what the target printed; `Err` if it reported a wrong result or exited.
    fn health(&mut self) -> Result<(), String> {
        while let Ok(l) = self.t.lines.try_recv() {
            if let Some(n) = l.strip_prefix("progress ") {
                let n: i64 = n.trim().parse().unwrap_or(0);
                if n > self.progress {
                    self.progress = n;
                    self.last_progress_at = Instant::now();
                }
            } else {
                self.log.push(l.clone());
            }
            if l.contains("CORRUPT") {
                return Err(format!("target reported: {l}"));
            }
        }
        if let Some(st) = self.t.child.try_wait().unwrap() {
            return Err(format!(
                "target exited ({st}); its last lines: {:?}",
                self.log.iter().rev().take(5).collect::<Vec<_>>()
            ));
        }
        Ok(())
    }

    /// Health, plus: the program's code equals its file, and (if `all_modules`)
    /// so does every library's.
    fn intact(&mut self, all_modules: bool) -> Result<(), String> {
        self.health()?;
        if !code_matches_file(self.pid(), &self.bin) {
            return Err(format!(
                "code of {} differs from the file",
                self.bin.display()
            ));
        }
        if all_modules {
            let bad = modules_differing_from_files(self.pid());
            if !bad.is_empty() {
                return Err(format!("modules differ from their files: {bad:?}"));
            }
        }
        Ok(())
    }

    /// Wait until the target reports progress beyond what it reported so far.
    fn makes_progress(&mut self, within: Duration) -> Result<(), String> {
        let before = self.progress;
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            self.health()?;
            if self.progress > before {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Err(format!(
            "target made no progress for {within:?} (stuck at {before})"
        ))
    }
}

/// Start weft with `args`, stdout and stderr piped.
fn spawn_weft(args: &[&str]) -> std::process::Child {
    Command::new(weft_bin())
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting weft")
}

/// Run weft to completion; `Err` (after killing it) if it runs past `timeout`.
fn run_weft(args: &[&str], timeout: Duration) -> Result<std::process::Output, String> {
    run_cmd(Command::new(weft_bin()).args(args), timeout)
}

fn run_cmd(cmd: &mut Command, timeout: Duration) -> Result<std::process::Output, String> {
    let child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("starting {cmd:?}: {e}"))?;
    let pid = child.id() as i32;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(timeout) {
        Ok(r) => r.map_err(|e| e.to_string()),
        Err(_) => {
            // SAFETY: killing the child we started (it has not been reaped: the
            // waiting thread still holds it).
            unsafe { libc::kill(pid, libc::SIGKILL) };
            let _ = rx.recv_timeout(Duration::from_secs(5));
            Err(format!("timed out after {timeout:?}"))
        }
    }
}

/// weft's stderr minus the lines every run prints.
fn unexpected_stderr(err: &str) -> Vec<&str> {
    err.lines()
        .filter(|l| {
            !l.is_empty()
                && !l.starts_with("Attached ")
                && !l.starts_with("Lost ")
                && !l.contains("events were dropped")
        })
        .collect()
}

fn first_lines(s: &str, n: usize) -> String {
    s.lines().take(n).collect::<Vec<_>>().join("\n")
}

// ---------------------------------------------------------------------------------
// 1. Weave/unweave storms.
// ---------------------------------------------------------------------------------

/// The programs a storm cycles through: (extra flags, program, map that must count).
fn storm_programs(bin: &str) -> Vec<(Vec<&'static str>, String, Option<&'static str>)> {
    // Leave once the probes fired (they are what the storm checks), however long the
    // target takes to get there on this machine.
    let exit = "interval:ms:50 /@c/ { exit(); }";
    vec![
        (
            vec![],
            format!("uprobe:{bin}:fn_* {{ @c = count(); }} uretprobe:{bin}:fn_* {{ @r = count(); }} {exit}"),
            Some("@c"),
        ),
        (
            vec![],
            format!("uprobe:{bin}:fn_* {{ @c = count(); }} {exit}"),
            Some("@c"),
        ),
        (
            vec!["--no-inline"],
            format!("uprobe:{bin}:fn_* {{ @c = count(); }} uretprobe:{bin}:fn_* {{ @r = count(); }} {exit}"),
            Some("@c"),
        ),
        // Only the int3 sites (kind 2: indices ending in 2 and 7), entry and return.
        (
            vec![],
            format!(
                "uprobe:{bin}:fn_?2,uprobe:{bin}:fn_?7 {{ @c = count(); @k[func] = count(); @s = sum(arg0); }} \
                 uretprobe:{bin}:fn_?2,uretprobe:{bin}:fn_?7 {{ @h = hist(retval); }} {exit}"
            ),
            Some("@c"),
        ),
        // Return probes only, general advice with maps keyed by thread.
        (
            vec![],
            format!("uretprobe:{bin}:fn_* {{ @c = count(); @t[tid] = count(); @m = max(retval); }} {exit}"),
            Some("@c"),
        ),
        // Recursive functions (kind 4) with both, and printf on the sleepy one.
        (
            vec!["--no-inline"],
            format!(
                "uprobe:{bin}:fn_?4,uprobe:{bin}:fn_?9 {{ @c = count(); }} \
                 uretprobe:{bin}:fn_?4,uretprobe:{bin}:fn_?9,uretprobe:{bin}:fn_sleepy {{ @r = count(); }} \
                 uprobe:{bin}:fn_sleepy {{ printf(\"sleepy %d\\n\", arg0); }} {exit}"
            ),
            Some("@c"),
        ),
    ]
}

/// Weave and unweave 100 functions of an 8-thread target that checks its results,
/// over and over; after every cycle the target is alive, reported no wrong result,
/// and its code equals the file.
#[test]
fn storm_weave_unweave_cycles() {
    let budget = Duration::from_secs(scale(110, 3600));
    let want_cycles = scale(u64::MAX, 1000);
    let mut tally = Tally::new("weave/unweave cycles (100 functions, 8 threads)", "cycles");
    let variants = [stress("storm.c"), stress_v("storm.c", O0_NOPIE, &[])];
    let start = Instant::now();
    let mut cycle = 0u64;
    'outer: for (vi, bin) in variants.iter().enumerate() {
        let mut t = Watched::start(bin, &["8"]);
        let progs = storm_programs(b(bin));
        let share = budget / variants.len() as u32;
        let vstart = Instant::now();
        let pid = t.pid().to_string();
        while vstart.elapsed() < share && tally.count < want_cycles {
            let (flags, prog, counter) = &progs[(cycle as usize + vi) % progs.len()];
            let mut args: Vec<&str> = flags.clone();
            args.extend(["-e", prog.as_str(), "-p", pid.as_str()]);
            let o = wait_output(spawn_weft(&args), T);
            cycle += 1;
            tally.count += 1;
            let out = text(&o.stdout);
            let err = text(&o.stderr);
            if !o.status.success() {
                tally.fail(format!(
                    "cycle {cycle} ({}): weft failed ({}): {}",
                    bin.display(),
                    o.status,
                    first_lines(&err, 5)
                ));
            } else if let Some(c) = counter {
                tally.check(map_value(&out, c).is_some_and(|n| n > 0), || {
                    format!("cycle {cycle}: {c} not counted: {}", first_lines(&out, 5))
                });
            }
            let odd = unexpected_stderr(&err);
            tally.check(odd.is_empty() || !o.status.success(), || {
                format!("cycle {cycle}: unexpected stderr: {odd:?}")
            });
            if let Err(e) = t.intact(true) {
                tally.fail(format!("cycle {cycle} ({}): {e}", bin.display()));
                break 'outer;
            }
            if cycle.is_multiple_of(25) {
                if let Err(e) = t.makes_progress(T) {
                    tally.fail(format!("cycle {cycle}: {e}"));
                    break 'outer;
                }
            }
            if tally.failures.len() > 20 {
                break 'outer;
            }
        }
        if let Err(e) = t.makes_progress(T) {
            tally.fail(format!("after the storm on {}: {e}", bin.display()));
        }
    }
    eprintln!(
        "storm: {} cycles in {:.1} s",
        tally.count,
        start.elapsed().as_secs_f64()
    );
    tally.finish();
}

/// One weave/unweave cycle of `prog` (with `flags`) on `t`: weft must succeed, count
/// with `counter` (if given), and leave the target running with every module's code
/// equal to its file. Returns false once the target is gone.
fn cycle(
    t: &mut Watched,
    flags: &[&str],
    prog: &str,
    counter: Option<&str>,
    tally: &mut Tally,
    what: &str,
) -> bool {
    cycle_checking(
        t,
        flags,
        prog,
        |out, _| match counter {
            Some(c) if map_value(out, c).is_none_or(|v| v <= 0) => {
                Err(format!("{c} not counted: {}", first_lines(out, 4)))
            }
            _ => Ok(()),
        },
        tally,
        what,
    )
}

/// [`cycle`], with `check(stdout, stderr)` judging a successful run of weft.
fn cycle_checking(
    t: &mut Watched,
    flags: &[&str],
    prog: &str,
    check: impl FnOnce(&str, &str) -> Result<(), String>,
    tally: &mut Tally,
    what: &str,
) -> bool {
    let pid = t.pid().to_string();
    let mut args: Vec<&str> = flags.to_vec();
    args.extend(["-e", prog, "-p", &pid]);
    tally.count += 1;
    let n = tally.count;
    match run_weft(&args, T) {
        Err(e) => tally.fail(format!("{what}, cycle {n}: weft {e}")),
        Ok(o) => {
            let out = text(&o.stdout);
            let err = text(&o.stderr);
            if !o.status.success() {
                tally.fail(format!(
                    "{what}, cycle {n}: weft failed ({}): {}",
                    o.status,
                    first_lines(&err, 4)
                ));
            } else if let Err(e) = check(&out, &err) {
                tally.fail(format!("{what}, cycle {n}: {e}"));
            }
        }
    }
    match t.intact(true) {
        Ok(()) => true,
        Err(e) => {
            tally.fail(format!("{what}, cycle {n}: {e}"));
            false
        }
    }
}

/// Entry and return probes on every function of `probed.h` (and `extra` names); weft
/// leaves `interval_ms` after the weave, or later, once `@c` counted (a target slowed
/// by a busy machine may not have called a probed function yet).
fn hot_program(bin: &str, extra: &[&str], interval_ms: u32) -> String {
    let mut sites = vec![format!("{bin}:hot_*")];
    sites.extend(extra.iter().map(|f| format!("{bin}:{f}")));
    let entry: Vec<String> = sites.iter().map(|s| format!("uprobe:{s}")).collect();
    let ret: Vec<String> = sites.iter().map(|s| format!("uretprobe:{s}")).collect();
    format!(
        "{} {{ @c = count(); }} {} {{ @r = count(); }} interval:ms:{interval_ms} /@c/ {{ exit(); }}",
        entry.join(","),
        ret.join(",")
    )
}

// ---------------------------------------------------------------------------------
// 2. Threads and processes in flight.
// ---------------------------------------------------------------------------------

fn churn_mode(mode: &str, extra: &[&str], tally: &mut Tally) {
    let bin = stress("churn.c");
    let mut t = Watched::start(&bin, &[mode]);
    let prog = hot_program(b(&bin), extra, 60);
    let n = scale(12, 200);
    for i in 0..n {
        let flags: &[&str] = if i % 3 == 2 { &["--no-inline"] } else { &[] };
        if !cycle(&mut t, flags, &prog, Some("@c"), tally, mode) {
            return;
        }
    }
    if let Err(e) = t.makes_progress(T) {
        tally.fail(format!("{mode}: {e}"));
    }
}

/// Threads created and exiting constantly while weft weaves and unweaves (batches
/// of 4 short-lived threads of 100 rounds). Each cycle counts the threads that start
/// while woven and ends when `want` have (500, or 1,100 every fourth cycle), so the
/// run takes well over 5,000 threads through one process and over 1,024 through
/// one session: the limits weft once had on threads ever seen (4,096 agent thread
/// states per process, 1,024 slots per session; the soak's cycles 150 to 200 gave
/// `@c: 0` once the first was used up). A cycle whose threads stop being counted
/// ends at its 20 s fallback instead, and fails.
#[test]
fn threads_created_and_exiting_during_weaving() {
    let mut tally = Tally::new("threads created/exiting during weaving", "cycles");
    let bin = stress("churn.c");
    let b = b(&bin);
    let mut t = Watched::start(&bin, &["threads", "100"]);
    let mut threads = 0;
    let mut want_total = 0;
    for i in 0..scale(12, 200) {
        let flags: &[&str] = if i % 3 == 2 { &["--no-inline"] } else { &[] };
        let want = if i % 4 == 0 { 1100 } else { 500 };
        want_total += want;
        let prog = format!(
            "{} uprobe:{b}:thread_begins {{ @threads = count(); if (@threads >= {want}) {{ exit(); }} }}",
            hot_program(b, &[], 20_000)
        );
        let check = |out: &str, err: &str| {
            let n = map_value(out, "@threads").unwrap_or(0);
            threads += n;
            let maps = || {
                out.lines()
                    .filter(|l| l.starts_with('@'))
                    .collect::<Vec<_>>()
            };
            if n < want {
                return Err(format!("{n} of {want} threads counted: {:?}", maps()));
            }
            if map_value(out, "@c").is_none_or(|c| c <= 0) {
                return Err(format!("@c not counted: {:?}", maps()));
            }
            match err.lines().find(|l| l.contains("ran no advice")) {
                Some(l) => Err(l.to_string()),
                None => Ok(()),
            }
        };
        if !cycle_checking(&mut t, flags, &prog, check, &mut tally, "threads") {
            break;
        }
        if tally.failures.len() > 3 {
            break;
        }
    }
    tally.check(threads >= want_total, || {
        format!("{threads} threads counted while woven, {want_total} wanted")
    });
    if let Err(e) = t.makes_progress(T) {
        tally.fail(format!("threads: {e}"));
    }
    eprintln!("threads: {threads} threads counted while woven");
    tally.finish();
}

/// fork() while woven, also from inside a probed function with a return probe
/// pending: every child must run correctly. Observed: advice does not run in the
/// child (its session belongs to the parent); the child keeps its copy of the
/// patched code.
#[test]
fn fork_while_woven() {
    let mut tally = Tally::new("fork while woven", "cycles");
    churn_mode("fork", &["fork_inside"], &mut tally);
    tally.finish();
}

/// vfork() while woven: the child calls a probed function (on the parent's stack
/// and thread state) then exits, or execs /bin/true.
#[test]
fn vfork_while_woven() {
    let mut tally = Tally::new("vfork while woven", "cycles");
    churn_mode("vfork", &[], &mut tally);
    tally.finish();
}

/// A child made with clone(CLONE_VM) only (another process sharing the memory, its
/// own signal handlers, the parent's TLS) calls probed functions all along.
#[test]
fn clone_vm_child_while_woven() {
    let mut tally = Tally::new("clone(CLONE_VM) child while woven", "cycles");
    churn_mode("clonevm", &[], &mut tally);
    tally.finish();
}

/// clone(CLONE_VM) children made one after another, some while weft stops the
/// world (each must be held and armed too), each calling probed functions.
#[test]
fn clone_vm_children_created_while_weaving() {
    let mut tally = Tally::new("clone(CLONE_VM) children created while weaving", "cycles");
    churn_mode("clonevm-churn", &[], &mut tally);
    tally.finish();
}

/// The woven process execs itself: the new image runs correctly and weft ends
/// cleanly.
#[test]
fn exec_while_woven() {
    let mut tally = Tally::new("exec while woven", "trials");
    let bin = stress("churn.c");
    let bs = b(&bin);
    // No exit of its own: weft is told to leave (SIGINT) once the new image runs, so
    // the exec always happens while woven, however slow the machine.
    let prog = format!(
        "uprobe:{bs}:hot_* {{ @c = count(); }} uretprobe:{bs}:hot_* {{ @r = count(); }} {LIVE}"
    );
    for trial in 0..scale(3, 30) {
        tally.count += 1;
        let mut t = Watched::start(&bin, &["exec"]);
        let mut w = Background::start(&["-e", &prog, "-p", &t.pid().to_string()]);
        // Wait until the probes run, then exec.
        w.wait_line("live", false, T);
        // SAFETY: signalling the target we started.
        unsafe { libc::kill(t.pid(), libc::SIGUSR1) };
        let after = Instant::now();
        let mut saw = false;
        while after.elapsed() < T && !saw {
            if let Err(e) = t.health() {
                tally.fail(format!("trial {trial}: {e}"));
                break;
            }
            saw = t.log.iter().any(|l| l == "ready after exec");
            std::thread::sleep(Duration::from_millis(10));
        }
        tally.check(saw, || {
            format!("trial {trial}: the new image never started")
        });
        w.signal(libc::SIGINT);
        let o = w.finish(T);
        let err = text(&o.stderr);
        tally.check(o.status.success(), || {
            format!("trial {trial}: weft failed ({}): {err}", o.status)
        });
        if let Err(e) = t.makes_progress(T).and_then(|()| t.intact(true)) {
            tally.fail(format!("trial {trial}: after exec: {e}"));
        }
    }
    tally.finish();
}

// ---------------------------------------------------------------------------------
// 3. Signals.
// ---------------------------------------------------------------------------------

fn signals_mode(mode: &str, prog_extra: &str, tally: &mut Tally) {
    let bin = stress("signals.c");
    let mut t = Watched::start(&bin, &[mode]);
    let bs = b(&bin);
    let prog = format!("{} {prog_extra}", hot_program(bs, &[], 60));
    for i in 0..scale(12, 200) {
        let flags: &[&str] = if i % 3 == 2 { &["--no-inline"] } else { &[] };
        if !cycle(&mut t, flags, &prog, Some("@c"), tally, mode) {
            return;
        }
    }
    if let Err(e) = t.makes_progress(T) {
        tally.fail(format!("{mode}: {e}"));
    }
}

/// Probed functions called from signal handlers that interrupt the same functions
/// (nested, SA_NODEFER), at a high rate.
#[test]
fn signal_handlers_reenter_probed_functions() {
    let mut tally = Tally::new("signal handlers re-entering probed functions", "cycles");
    signals_mode("reenter", "", &mut tally);
    tally.finish();
}

/// The same from handlers running on an alternate signal stack.
#[test]
fn signal_handlers_on_sigaltstack() {
    let mut tally = Tally::new("handlers on sigaltstack", "cycles");
    signals_mode("altstack", "", &mut tally);
    tally.finish();
}

/// The target's own SIGSEGV (deliberate faults, recovered with siglongjmp) and
/// SIGTRAP (its own int3) handlers keep seeing exactly their own signals while
/// advice reads through bad pointers and int3 sites trap.
#[test]
fn targets_own_sigsegv_and_sigtrap_handlers() {
    let mut tally = Tally::new("target's own SIGSEGV/SIGTRAP handlers", "cycles");
    let bin = stress("signals.c");
    let bs = b(&bin);
    let extra = format!(
        "uprobe:{bs}:take_ptr {{ @s[str(arg0)] = count(); @v = sum(*(int64*)arg0); @b[buf(arg0, 8)] = count(); }}"
    );
    signals_mode("faults", &extra, &mut tally);
    tally.finish();
}

/// As above, with a target that re-installs its handlers all the time (as programs
/// that set handlers lazily, after weft's agent, do).
#[test]
fn target_reinstalling_its_handlers() {
    let mut tally = Tally::new(
        "target re-installing its SIGSEGV/SIGTRAP handlers",
        "cycles",
    );
    let bin = stress("signals.c");
    let bs = b(&bin);
    let extra = format!("uprobe:{bs}:take_ptr {{ @s[str(arg0)] = count(); }}");
    signals_mode("reinstall", &extra, &mut tally);
    tally.finish();
}

/// SIGSTOP and SIGCONT sent to the target at random moments while weft attaches,
/// weaves, runs and unweaves.
#[test]
fn sigstop_sigcont_during_weaving() {
    let mut tally = Tally::new("SIGSTOP/SIGCONT during weaving", "cycles");
    let bin = stress("hammer.c");
    let mut t = Watched::start(&bin, &["4"]);
    let pid = t.pid();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let signals = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let toggler = {
        let (stop, signals) = (stop.clone(), signals.clone());
        std::thread::spawn(move || {
            let mut rng = Rng::from_env();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(5 + rng.below(40)));
                let sig = if rng.below(2) == 0 {
                    libc::SIGSTOP
                } else {
                    libc::SIGCONT
                };
                // SAFETY: signalling the target we started.
                unsafe { libc::kill(pid, sig) };
                signals.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
            // SAFETY: as above.
            unsafe { libc::kill(pid, libc::SIGCONT) };
        })
    };
    let prog = hot_program(b(&bin), &[], 50);
    for i in 0..scale(15, 200) {
        let flags: &[&str] = if i % 2 == 1 { &["--no-inline"] } else { &[] };
        // The target may be stopped when a cycle ends: check once it runs.
        let pid_s = pid.to_string();
        let mut args: Vec<&str> = flags.to_vec();
        args.extend(["-e", &prog, "-p", &pid_s]);
        tally.count += 1;
        match run_weft(&args, T) {
            Err(e) => tally.fail(format!("cycle {i}: weft {e}")),
            Ok(o) if !o.status.success() => tally.fail(format!(
                "cycle {i}: weft failed ({}): {}",
                o.status,
                first_lines(&text(&o.stderr), 3)
            )),
            Ok(_) => {}
        }
        if let Err(e) = t.intact(true) {
            tally.fail(format!("cycle {i}: {e}"));
            break;
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    toggler.join().unwrap();
    eprintln!(
        "sent {} SIGSTOP/SIGCONT",
        signals.load(std::sync::atomic::Ordering::Relaxed)
    );
    if let Err(e) = t.makes_progress(T).and_then(|()| t.intact(true)) {
        tally.fail(format!("after SIGCONT: {e}"));
    }
    tally.finish();
}

// ---------------------------------------------------------------------------------
// 4. Non-local exits.
// ---------------------------------------------------------------------------------

fn nonlocal_mode(mode: &str, tally: &mut Tally) {
    let bin = stress("nonlocal.c");
    let mut t = Watched::start(&bin, &[mode]);
    let prog = hot_program(b(&bin), &["co_rec"], 60);
    for i in 0..scale(12, 200) {
        let flags: &[&str] = if i % 3 == 2 { &["--no-inline"] } else { &[] };
        if !cycle(&mut t, flags, &prog, Some("@c"), tally, mode) {
            return;
        }
    }
    if let Err(e) = t.makes_progress(T) {
        tally.fail(format!("{mode}: {e}"));
    }
}

/// longjmp out of up to 9 hijacked frames at a time, in 3 threads (stale shadow
/// entries pile up far beyond the shadow stack's capacity and are collected).
#[test]
fn longjmp_out_of_probed_frames_in_threads() {
    let mut tally = Tally::new("longjmp out of probed frames", "cycles");
    nonlocal_mode("longjmp", &mut tally);
    tally.finish();
}

/// swapcontext coroutines on one thread, each suspended inside probed recursion.
#[test]
fn coroutines_with_return_probes() {
    let mut tally = Tally::new("swapcontext coroutines (one thread)", "cycles");
    nonlocal_mode("coro", &mut tally);
    tally.finish();
}

/// Coroutines suspended inside probed frames and abandoned, their stacks reused.
#[test]
fn abandoned_coroutines_with_return_probes() {
    let mut tally = Tally::new("abandoned coroutines", "cycles");
    nonlocal_mode("abandon", &mut tally);
    tally.finish();
}

/// Coroutines resumed on another thread than the one that suspended them.
#[test]
fn coroutines_migrating_between_threads() {
    let mut tally = Tally::new("coroutines migrating between threads", "cycles");
    nonlocal_mode("migrate", &mut tally);
    tally.finish();
}

/// C++ exceptions thrown through probed frames, caught inside probed frames and
/// rethrown, in 3 threads.
#[test]
fn cxx_exceptions_through_probed_frames_in_threads() {
    let mut tally = Tally::new("C++ exceptions through probed frames", "cycles");
    let bin = stress("throw.cc");
    let mut t = Watched::start(&bin, &[]);
    let prog = hot_program(
        b(&bin),
        &["_Z7throwerl", "_Z7catcherl", "_Z9rethrowerl"],
        60,
    );
    for i in 0..scale(12, 200) {
        let flags: &[&str] = if i % 3 == 2 { &["--no-inline"] } else { &[] };
        if !cycle(&mut t, flags, &prog, Some("@c"), &mut tally, "throw") {
            break;
        }
    }
    tally.finish();
}

// ---------------------------------------------------------------------------------
// 5. Controller failure: SIGKILL of weft at random points.
// ---------------------------------------------------------------------------------

/// Kill weft with SIGKILL at a random moment of attach (remote dlopen, connect),
/// weave, run or detach; the target's code must come to equal its files again,
/// and it must keep running correctly. Every third trial uses a fresh target, so
/// the agent is loaded (a remote dlopen) again.
#[test]
fn sigkill_of_weft_at_random_points() {
    let mut tally = Tally::new("SIGKILL of weft at random points", "kills");
    let mut rng = Rng::from_env();
    let bin = stress("hammer.c");
    let bs = b(&bin);
    let progs = [
        (vec![], hot_program(bs, &[], 40)),
        (vec!["--no-inline"], hot_program(bs, &[], 40)),
        (
            vec![],
            format!("uprobe:{bs}:hot_* {{ @c[tid] = count(); printf(\"%d\\n\", arg0); }} interval:ms:40 {{ exit(); }}"),
        ),
    ];
    let mut t: Option<Watched> = None;
    let mut phases = [0u64; 3];
    for trial in 0..scale(30, 100) {
        if trial % 3 == 0 || t.is_none() {
            t = Some(Watched::start(&bin, &["4"]));
        }
        let target = t.as_mut().unwrap();
        let (flags, prog) = &progs[rng.below(progs.len() as u64) as usize];
        let pid = target.pid().to_string();
        let mut args: Vec<&str> = flags.clone();
        args.extend(["-e", prog.as_str(), "-p", pid.as_str()]);
        let mut w = Command::new(weft_bin())
            .args(&args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        // Half the trials kill at a uniformly random time in the first 80 ms (attach,
        // weave, run, detach); the other half once the code is patched.
        let started = Instant::now();
        if rng.below(2) == 0 {
            std::thread::sleep(Duration::from_micros(rng.below(80_000)));
        } else {
            while code_matches_file(target.pid(), &bin) && started.elapsed() < T {
                std::thread::sleep(Duration::from_micros(200));
            }
            std::thread::sleep(Duration::from_micros(rng.below(40_000)));
        }
        let woven = !code_matches_file(target.pid(), &bin);
        phases[if woven {
            1
        } else if started.elapsed() < Duration::from_millis(20) {
            0
        } else {
            2
        }] += 1;
        w.kill().unwrap();
        w.wait().unwrap();
        tally.count += 1;
        let killed_at = Instant::now();
        let mut restored = false;
        // A ceiling, not a deadline: the agent may take its time on a busy machine.
        while killed_at.elapsed() < T {
            if target.intact(true).is_ok() {
                restored = true;
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        if !restored {
            let why = target.intact(true).err().unwrap_or_default();
            tally.fail(format!(
                "trial {trial} (killed {:?} after start, code patched: {woven}): not intact {T:?} later: {why}",
                killed_at - started
            ));
            if target.health().is_err() {
                t = None;
            }
            continue;
        }
        if let Err(e) = target.makes_progress(T) {
            tally.fail(format!(
                "trial {trial} (killed {:?} after start, code patched: {woven}): {e}",
                killed_at - started
            ));
            t = None;
        }
    }
    eprintln!(
        "kills: early {}, while woven {}, other {}",
        phases[0], phases[1], phases[2]
    );
    // And a last session works normally.
    if let Some(target) = t.as_mut() {
        let prog = hot_program(bs, &[], 40);
        cycle(
            target,
            &[],
            &prog,
            Some("@c"),
            &mut Tally::new("after kills", "cycles"),
            "after the kills",
        );
    }
    tally.finish();
}

/// SIGKILL of weft while attach single-steps threads out of the C library, or runs
/// them over a call or a `rep` string instruction to a hardware breakpoint: the
/// target lives in `calloc`/`free` (grow) or in one 64 MiB `memset` after another
/// (fill). A kill in a step's SIGTRAP stop, or with a breakpoint still armed, would
/// hand a SIGTRAP to a process with no agent and no handler yet, unless the no-op
/// handler weft holds in place while stepping takes it. The target (run until
/// SIGUSR1, sent after the kill) must finish with its exact output.
#[test]
fn sigkill_of_weft_while_stepping_out_of_the_c_library() {
    let mut tally = Tally::new("SIGKILL of weft while stepping out of libc", "kills");
    let mut rng = Rng::from_env();
    let bin = build("libcbusy.c", Variant::O2_PIE, &["-pthread"]);
    let bs = b(&bin);
    let prog = format!("uprobe:{bs}:tick {{ @c = count(); }} interval:ms:50 {{ exit(); }}");
    for trial in 0..scale(20, 100) {
        let mode = ["fill", "grow"][trial as usize % 2];
        let target = Command::new(&bin)
            .args(["0", "2", mode])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(50));
        let pid = target.id().to_string();
        let mut w = Command::new(weft_bin())
            .args(["-e", &prog, "-p", pid.as_str()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        // Attach looks and steps from its first look on (a few ms after weft starts)
        // until the agent is loaded, tens of ms later.
        let at = Duration::from_millis(5 + rng.below(120));
        std::thread::sleep(at);
        let _ = w.kill();
        let _ = w.wait();
        tally.count += 1;
        signal_when_caught(target.id(), libc::SIGUSR1);
        let got = target.wait_with_output().unwrap();
        let out = text(&got.stdout);
        let checked = check_libcbusy(&out, mode);
        tally.check(got.status.success() && checked.is_ok(), || {
            format!(
                "trial {trial} ({mode}, killed at {at:?}): target ended with {}, printed {out:?} ({checked:?})",
                got.status,
            )
        });
    }
    tally.finish();
}

#[test]
fn sigkill_of_weft_at_each_step_of_an_attach() {
    // The attach runs threads out of the C library to a hardware breakpoint (or
    // steps them, settling only the last trap: the trap guard makes a pending one
    // harmless): weft killed at a run's or step's trap stop, or with the breakpoint
    // armed, leaves a target that finishes with its exact result and takes a new
    // session (which clears the breakpoint, and takes and drops the traps it raised
    // meanwhile: delivered after the guard is gone, they killed the target). A thread
    // caught in the program's own code needs no run: such an attach just completes,
    // and is tried again.
    let mut tally = Tally::new("SIGKILL of weft at an attach's step", "kills");
    let bin = build("libcbusy.c", Variant::O2_PIE, &["-pthread"]);
    let bs = b(&bin);
    let prog = format!("uprobe:{bs}:tick {{ @c = count(); }} interval:ms:50 /@c/ {{ exit(); }}");
    for (mode, threads, point) in [
        ("grow", "1", "attach:step-trap"),
        ("grow", "2", "attach:step-trap#2"),
        ("fill", "1", "attach:step-breakpoint"),
        ("churn", "4", "attach:step-breakpoint#2"),
    ] {
        let mut died = false;
        for attempt in 0..20 {
            let target = Command::new(&bin)
                .args(["0", threads, mode])
                .stdout(Stdio::piped())
                .spawn()
                .unwrap();
            let pid = target.id().to_string();
            let r = weft_dying_at(point, &["-e", &prog, "-p", pid.as_str()]);
            died = r.is_ok();
            if died {
                // A later session works (it clears what the dead one left).
                let o = run_cmd(Command::new(weft_bin()).args(["-e", &prog, "-p", &pid]), T);
                let counted = o.as_ref().map(|o| map_value(&text(&o.stdout), "@c"));
                tally.check(
                    o.as_ref().is_ok_and(|o| o.status.success())
                        && counted.as_ref().is_ok_and(|c| c.is_some_and(|c| c > 0)),
                    || format!("{point} ({mode} {threads}): the next session: {counted:?}"),
                );
            }
            tally.count += 1;
            signal_when_caught(target.id(), libc::SIGUSR1);
            let got = target.wait_with_output().unwrap();
            let out = text(&got.stdout);
            let checked = check_libcbusy(&out, mode);
            tally.check(got.status.success() && checked.is_ok(), || {
                format!(
                    "{point} ({mode} {threads}, attempt {attempt}): target ended with {}, printed {out:?} ({checked:?})",
                    got.status,
                )
            });
            if died {
                break;
            }
        }
        tally.check(died, || {
            format!("weft never reached {point} ({mode} {threads})")
        });
    }
    tally.finish();
}

/// weft with `WEFT_TEST_DIE_AT=<point>` (ARCHITECTURE.md, "Dying at any point") and
/// `args`: `Ok` if it sent itself SIGKILL at that point, else what it did instead.
fn weft_dying_at(point: &str, args: &[&str]) -> Result<(), String> {
    use std::os::unix::process::ExitStatusExt;
    let o = run_cmd(
        Command::new(weft_bin())
            .env("WEFT_TEST_DIE_AT", point)
            .args(args),
        T,
    )?;
    if o.status.signal() == Some(libc::SIGKILL) {
        Ok(())
    } else {
        Err(format!(
            "weft did not die at {point}: it ended with {} ({})",
            o.status,
            first_lines(&text(&o.stderr), 3)
        ))
    }
}

/// After weft died: the target becomes intact (its code and every library's equal
/// to their files: the agent restores them once it sees its socket close; a
/// ceiling, not a deadline, as a loaded machine may take its time), then it makes
/// progress.
fn survives(t: &mut Watched) -> Result<(), String> {
    let pid = t.pid();
    intact_within(|| t.health(), pid)?;
    t.makes_progress(T)
}

/// Waits (at most [`T`]) until every module of `pid` equals its file, checking
/// `health` meanwhile (a target that dies is reported, not waited for).
fn intact_within(mut health: impl FnMut() -> Result<(), String>, pid: i32) -> Result<(), String> {
    let killed = Instant::now();
    loop {
        health()?;
        // The program's own code too (and no panic if the target just died).
        let bad = modules_differing_from_files(pid);
        health()?;
        if bad.is_empty() {
            return Ok(());
        }
        if killed.elapsed() > T {
            return Err(format!("not intact {T:?} later: differing {bad:?}"));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// SIGKILL of weft at every named point of attaching, weaving and unweaving, on a
/// `hammer` weft loads its agent into and on one that has it already (issue 24: a
/// kill 74 ms into a session, code not patched, killed the target with SIGSEGV).
/// weft must die exactly there; within a second the target's code and every
/// library's equal their files, and it goes on computing correct results. A kill
/// at `ended` (the agent had ended the session, weft had not yet freed it) unmapped
/// the session's code under the target and left the unwinder hooks in libgcc
/// jumping into it.
#[test]
fn sigkill_of_weft_at_every_named_point() {
    let mut tally = Tally::new("SIGKILL of weft at every named point", "kills");
    let bin = stress("hammer.c");
    let prog = hot_program(b(&bin), &[], 40);
    // (point, also reached when the agent is loaded already)
    let points = [
        ("attach-stopped", true),
        ("attach-borrowed", true),
        ("attach:call-running", true),
        ("attach:call-landed", true),
        ("attach:call-returned", true),
        ("attach-loaded", false),
        ("attach-connected", true),
        ("attach-resumed", true),
        ("handshake", true),
        ("shm-mapped", true),
        ("code-written", true),
        ("patch:world-stopped", true),
        ("patch:site-written", true),
        ("redirect-patched", true),
        ("signals-taken", true),
        ("patch:site-written#2", true),
        ("sites-patched", true),
        ("running", true),
        ("unweave:world-stopped", true),
        ("site-restored", true),
        ("sites-restored", true),
        ("redirects-restored", true),
        ("ended", true),
        ("quiescent", true),
    ];
    let loaded_target = |tally: &mut Tally| {
        let mut t = Watched::start(&bin, &["4"]);
        let ok = cycle(&mut t, &[], &prog, Some("@c"), tally, "loading the agent");
        assert!(ok, "a plain session failed: {:?}", tally.failures);
        t
    };
    let mut loaded = loaded_target(&mut tally);
    let trial = |t: &mut Watched, point: &str, what: &str, tally: &mut Tally| {
        let pid = t.pid().to_string();
        tally.count += 1;
        let r = weft_dying_at(point, &["-e", &prog, "-p", &pid]).and_then(|()| survives(t));
        if let Err(e) = r {
            tally.fail(format!("{point} ({what}): {e}"));
        }
    };
    for (point, when_loaded) in points {
        let mut fresh = Watched::start(&bin, &["4"]);
        trial(&mut fresh, point, "loading the agent", &mut tally);
        if when_loaded {
            trial(&mut loaded, point, "agent loaded", &mut tally);
            if loaded.health().is_err() {
                loaded = loaded_target(&mut tally);
            }
        }
    }
    // And a session after all that works normally.
    cycle(
        &mut loaded,
        &[],
        &prog,
        Some("@c"),
        &mut tally,
        "after the kills",
    );
    tally.finish();
}

/// SIGKILL of weft while woven, in a target with its own SIGSEGV and SIGTRAP
/// handlers that it re-installs every millisecond (`signals reinstall`). The agent
/// then restores the sites itself, the sigaction redirect with them: the target's
/// next `sigaction` reaches the kernel and puts its own SIGTRAP handler in front. A
/// thread that had hit an int3 site and was not yet given the trap (preempted on
/// its way back to user space) got weft's trap in the target's handler, which
/// reported it (a third of these kills). The redirect must wait until no such
/// signal is pending.
#[test]
fn sigkill_of_weft_while_the_target_reinstalls_its_handlers() {
    let mut tally = Tally::new(
        "SIGKILL of weft while the target re-installs its handlers",
        "kills",
    );
    let bin = stress("signals.c");
    let bs = b(&bin);
    let prog = format!(
        "{} uprobe:{bs}:take_ptr {{ @s[str(arg0)] = count(); }}",
        hot_program(bs, &[], 60)
    );
    let mut t = Watched::start(&bin, &["reinstall"]);
    for point in [
        "patch:site-written#2",
        "sites-patched",
        "running",
        "unweave:world-stopped",
    ] {
        for trial in 0..scale(4, 25) {
            let pid = t.pid().to_string();
            tally.count += 1;
            let r =
                weft_dying_at(point, &["-e", &prog, "-p", &pid]).and_then(|()| survives(&mut t));
            if let Err(e) = r {
                tally.fail(format!("{point}, trial {trial}: {e}"));
                if t.health().is_err() {
                    t = Watched::start(&bin, &["reinstall"]);
                }
            }
        }
    }
    tally.finish();
}

/// `tests/stress/parked.c`: a thread parked in a system call at a probed function's
/// first instruction, a worker computing, "progress ITERATIONS WAKEUPS" lines.
struct Parked {
    t: Spawned,
    /// The parked (or waiting) thread.
    tid: i32,
    iterations: i64,
    wakeups: i64,
    /// SIGURG handlers entered and returned (`handler` mode).
    handlers_in: i64,
    handlers_out: i64,
}

impl Parked {
    fn start(bin: &Path, mode: &str) -> Parked {
        let t = Spawned::start(bin, &[mode]);
        t.wait_line("ready", T);
        let l = t.lines.recv_timeout(T).expect("no tid line");
        let tid = l.strip_prefix("tid ").and_then(|n| n.parse().ok());
        Parked {
            t,
            tid: tid.unwrap_or_else(|| panic!("not a tid line: {l:?}")),
            iterations: 0,
            wakeups: 0,
            handlers_in: 0,
            handlers_out: 0,
        }
    }

    fn pid(&self) -> i32 {
        self.t.pid()
    }

    /// Read what it printed; `Err` if it reported a wrong result or exited.
    fn health(&mut self) -> Result<(), String> {
        while let Ok(l) = self.t.lines.try_recv() {
            if l.contains("CORRUPT") {
                return Err(format!("target reported: {l}"));
            }
            let n: Vec<i64> = l
                .strip_prefix("progress ")
                .map(|r| r.split(' ').filter_map(|n| n.parse().ok()).collect())
                .unwrap_or_default();
            if let [i, w, hi, ho] = n[..] {
                self.iterations = i;
                self.wakeups = w;
                self.handlers_in = hi;
                self.handlers_out = ho;
            }
        }
        match self.t.child.try_wait().unwrap() {
            Some(st) => Err(format!("target exited ({st})")),
            None => Ok(()),
        }
    }

    /// Within a second: healthy, its code and every library's equal to their files.
    /// Then its worker makes progress.
    fn survives(&mut self) -> Result<(), String> {
        let pid = self.pid();
        intact_within(|| self.health(), pid)?;
        let before = self.iterations;
        self.until(|p| p.iterations > before, "no progress")
    }

    /// Wait (a ceiling of [`T`]) until `cond` holds.
    fn until(&mut self, cond: impl Fn(&Parked) -> bool, what: &str) -> Result<(), String> {
        let deadline = Instant::now() + T;
        while Instant::now() < deadline {
            self.health()?;
            if cond(self) {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Err(format!("{what} within {T:?}"))
    }

    /// SIGUSR2 `n` times: exactly `n` more wake-ups of the parked thread.
    fn wakes(&mut self, n: i64) -> Result<(), String> {
        self.health()?;
        let want = self.wakeups + n;
        for _ in 0..n {
            // One at a time, each once the previous one woke the thread: two sent
            // before the thread takes the first would be one pending signal.
            let next = self.wakeups + 1;
            // SAFETY: kill takes no pointers.
            unsafe { libc::kill(self.pid(), libc::SIGUSR2) };
            self.until(|p| p.wakeups >= next, "the parked thread did not wake up")?;
        }
        // Progress lines come every 100 ms: one more, and no extra wake-up.
        let at = self.iterations;
        self.until(|p| p.iterations > at, "no progress")?;
        if self.wakeups != want {
            return Err(format!("{} wake-ups, want {want}", self.wakeups));
        }
        Ok(())
    }

    /// The parked thread is blocked in `read` with its pc inside one of weft's code
    /// regions (a trampoline).
    fn parked_in_weft_code(&self) -> bool {
        let pid = self.pid();
        let Ok(sc) = std::fs::read_to_string(format!("/proc/{pid}/task/{}/syscall", self.tid))
        else {
            return false;
        };
        let f: Vec<&str> = sc.split_whitespace().collect();
        let Some(pc) = f
            .last()
            .and_then(|p| u64::from_str_radix(p.trim_start_matches("0x"), 16).ok())
        else {
            return false;
        };
        let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default();
        f.first() == Some(&"0")
            && maps.lines().filter(|l| l.contains("weft-code")).any(|l| {
                let r = l.split_whitespace().next().unwrap_or("");
                r.split_once('-').is_some_and(|(a, b)| {
                    let a = u64::from_str_radix(a, 16).unwrap_or(u64::MAX);
                    let b = u64::from_str_radix(b, 16).unwrap_or(0);
                    (a..b).contains(&pc)
                })
            })
    }
}

/// SIGKILL of weft while patching single-steps a thread out of the bytes a jump
/// replaces (`parked nop`: a thread in epoll_wait at the probed function's first
/// instruction, which every stop interrupts), or runs it over a call to a hardware
/// breakpoint (`parked call`). The kernel then gives that thread the step's SIGTRAP,
/// or lets it meet the breakpoint, still armed, with no tracer to take it: the
/// target (no SIGTRAP handler of its own) died of it. The agent must take those
/// traps as weft's: the thread goes on waking up (past the breakpoint, each time),
/// the code is intact, and a later session works.
#[test]
fn sigkill_of_weft_while_patching_steps_a_thread() {
    let mut tally = Tally::new("SIGKILL of weft while patching steps a thread", "kills");
    let bin = stress("parked.c");
    let bs = b(&bin);
    for (mode, point) in [
        ("nop", "patch:step-trap"),
        ("call", "patch:step-breakpoint"),
    ] {
        let prog =
            format!("uprobe:{bs}:wait_{mode} {{ @c = count(); }} interval:ms:50 {{ exit(); }}");
        for trial in 0..2 {
            let mut t = Parked::start(&bin, mode);
            let pid = t.pid().to_string();
            let args = ["-e", prog.as_str(), "-p", pid.as_str()];
            tally.count += 1;
            let r = weft_dying_at(point, &args)
                .and_then(|()| t.survives())
                .and_then(|()| t.wakes(3))
                .and_then(|()| match run_weft(&args, T) {
                    Ok(o) if o.status.success() => Ok(()),
                    Ok(o) => Err(format!(
                        "a later session failed: {}",
                        first_lines(&text(&o.stderr), 3)
                    )),
                    Err(e) => Err(format!("a later session: weft {e}")),
                })
                .and_then(|()| t.survives())
                .and_then(|()| t.wakes(2));
            if let Err(e) = r {
                tally.fail(format!("{mode} trial {trial}: {e}"));
            }
        }
    }
    tally.finish();
}

/// weft gone while a thread is inside its code: a read that was the probed
/// function's first instruction, relocated into the trampoline, blocks there
/// (`parked park`). weft is killed after the agent ended the session and before it
/// could free it, or gives up waiting for the thread to leave (5 s) and exits. The
/// agent unmapped the session's code either way, and the read returned into nothing
/// (SIGSEGV). The code must stay mapped: the thread returns, the target goes on.
#[test]
fn weft_gone_with_a_thread_inside_its_code() {
    let mut tally = Tally::new("weft gone with a thread inside its code", "sessions");
    let bin = stress("parked.c");
    let prog = format!("uprobe:{}:park {{ @c = count(); }}", b(&bin));
    for die in [Some("ended"), None] {
        let mut t = Parked::start(&bin, "park");
        let pid = t.pid().to_string();
        let mut cmd = Command::new(weft_bin());
        cmd.args(["-e", &prog, "-p", &pid])
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        if let Some(point) = die {
            cmd.env("WEFT_TEST_DIE_AT", point);
        }
        let mut w = cmd.spawn().unwrap();
        tally.count += 1;
        let what = die.unwrap_or("weft giving up");
        let woven = Instant::now();
        while code_matches_file(t.pid(), &bin) && woven.elapsed() < T {
            std::thread::sleep(Duration::from_millis(2));
        }
        // SAFETY: kill takes no pointers.
        unsafe { libc::kill(t.pid(), libc::SIGUSR1) };
        let parked = Instant::now();
        while !t.parked_in_weft_code() && parked.elapsed() < T {
            std::thread::sleep(Duration::from_millis(2));
        }
        if !t.parked_in_weft_code() {
            tally.fail(format!(
                "{what}: the thread never blocked inside weft's code"
            ));
            let _ = w.kill();
            let _ = w.wait();
            continue;
        }
        // SAFETY: kill takes no pointers.
        unsafe { libc::kill(w.id() as i32, libc::SIGINT) };
        let o = w.wait_with_output().unwrap();
        let err = text(&o.stderr);
        use std::os::unix::process::ExitStatusExt;
        let ended_as_planned = match die {
            Some(_) => o.status.signal() == Some(libc::SIGKILL),
            None => o.status.success() && err.contains("stayed inside advice"),
        };
        if !ended_as_planned {
            tally.fail(format!(
                "{what}: weft ended with {} ({})",
                o.status,
                first_lines(&err, 3)
            ));
            continue;
        }
        let r = t.wakes(1).and_then(|()| t.survives());
        if let Err(e) = r {
            tally.fail(format!("{what}: {e}"));
        }
    }
    tally.finish();
}

/// A thread blocked inside the session's code (the relocated first instruction of a
/// probed function) is interrupted by a signal whose handler, the target's own
/// code, blocks: weft must not free the session's code while that handler can still
/// return into it (it did: the handler's return jumped into unmapped memory, the
/// SIGSEGV of a long soak of `signal_handlers_reenter_probed_functions`). weft waits
/// for the handler, gives up after 5 s and leaves the code mapped; the handler then
/// returns into it, the read is restarted there, and the thread goes on.
#[test]
fn no_code_freed_under_a_signal_handler() {
    let mut tally = Tally::new(
        "code kept for a signal handler that will return into it",
        "sessions",
    );
    let bin = stress("parked.c");
    let prog = format!("uprobe:{}:park {{ @c = count(); }}", b(&bin));
    for _ in 0..scale(1, 3) {
        tally.count += 1;
        let mut t = Parked::start(&bin, "handler");
        let mut w = Command::new(weft_bin())
            .args(["-e", &prog, "-p", &t.pid().to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let woven = Instant::now();
        while code_matches_file(t.pid(), &bin) && woven.elapsed() < T {
            std::thread::sleep(Duration::from_millis(2));
        }
        // Park the thread in weft's code, then interrupt it there with the handler.
        // SAFETY: kill takes no pointers.
        unsafe { libc::kill(t.pid(), libc::SIGUSR1) };
        let parked = Instant::now();
        while !t.parked_in_weft_code() && parked.elapsed() < T {
            std::thread::sleep(Duration::from_millis(2));
        }
        // SAFETY: as above.
        unsafe { libc::kill(t.pid(), libc::SIGWINCH) };
        if let Err(e) = t.until(|p| p.handlers_in == 1, "the handler did not run") {
            tally.fail(e);
            let _ = w.kill();
            let _ = w.wait();
            continue;
        }
        // SAFETY: as above.
        unsafe { libc::kill(w.id() as i32, libc::SIGINT) };
        let o = w.wait_with_output().unwrap();
        let err = text(&o.stderr);
        if !o.status.success() || !err.contains("leaving its code mapped") {
            tally.fail(format!(
                "weft ended with {} ({})",
                o.status,
                first_lines(&err, 3)
            ));
        }
        // The handler returns into weft's code, the read restarts there and gets its
        // byte; the thread goes on.
        // SAFETY: as above.
        unsafe { libc::kill(t.pid(), libc::SIGHUP) };
        let r = t
            .until(|p| p.handlers_out == 1, "the handler did not return")
            .and_then(|()| t.wakes(1))
            .and_then(|()| t.survives());
        if let Err(e) = r {
            tally.fail(e);
        }
    }
    tally.finish();
}

/// Remote calls borrow a thread that may be computing in vector registers (no thread
/// of this target ever blocks in a system call): its x87/SSE/AVX state must survive
/// the agent's remote dlopen.
#[test]
fn attach_preserves_vector_registers_of_the_borrowed_thread() {
    let mut tally = Tally::new(
        "attach to threads computing in vector registers",
        "attaches",
    );
    let bin = stress_v("spinfp.c", Variant::O2_PIE, &["-mavx"]);
    for _ in 0..scale(5, 50) {
        let mut t = Watched::start(&bin, &["2"]);
        let prog = format!(
            "uprobe:{}:hot_jump {{ @c = count(); }} interval:ms:50 {{ exit(); }}",
            b(&bin)
        );
        tally.count += 1;
        match run_weft(&["-e", &prog, "-p", &t.pid().to_string()], T) {
            Ok(o) if o.status.success() => {}
            Ok(o) => tally.fail(format!("weft failed: {}", text(&o.stderr))),
            Err(e) => tally.fail(format!("weft {e}")),
        }
        std::thread::sleep(Duration::from_millis(100));
        if let Err(e) = t.intact(true) {
            tally.fail(e);
        }
    }
    tally.finish();
}

// ---------------------------------------------------------------------------------
// 6. Advice faults.
// ---------------------------------------------------------------------------------

/// Bad pointers to str(), buf(), pointer and struct field reads, divisions by zero,
/// a full map and strings longer than their capacity: the target's output is
/// unchanged, and weft reports each count exactly.
#[test]
fn advice_faults_are_counted_and_harmless() {
    let mut tally = Tally::new("advice faults injected", "faults");
    let bin = stress("faults.c");
    let bs = b(&bin);
    let n = scale(1000, 20000);
    let prog = faults_program(bs);
    let native = text(
        &Command::new(&bin)
            .arg(n.to_string())
            .output()
            .unwrap()
            .stdout,
    );
    let o = weft(&["-e", &prog, "-c", &format!("{bs} {n}")], T);
    let out = text(&o.stdout);
    let err = text(&o.stderr);
    tally.count = 3 * n + 3 * n + 2 * n + (n - 10) + n;
    tally.check(o.status.success(), || format!("weft failed: {err}"));
    tally.check(out.contains(native.trim()), || {
        format!("target output changed: want {native}")
    });
    let want = [
        format!("weft: {} reads of target memory faulted", 6 * n),
        format!("weft: {} divisions or remainders by zero gave 1", 2 * n),
        format!("Additional Info - map: @k, updates dropped: {}", n - 10),
    ];
    for w in &want {
        tally.check(err.contains(w.as_str()), || {
            format!("stderr lacks {w:?}:\n{err}")
        });
    }
    if let Err(e) = check_long_strings(&out, &err, n) {
        tally.fail(e);
    }
    tally.finish();
}

/// The probe program of the advice-fault tests, for the faults.c binary `bs`.
fn faults_program(bs: &str) -> String {
    format!(
        "config = {{ max_map_keys = 10 }}
         uprobe:{bs}:bad_ptr {{ @s[str(arg0)] = count(); @v = sum(*(int64*)arg0); @u[buf(arg0, 8)] = count(); }}
         uprobe:{bs}:bad_struct {{ @x = sum(args.p->x); @n[str(args.p->name)] = count(); }}
         uprobe:{bs}:divide {{ @q = sum(arg0 / arg1); @m = sum(arg0 % arg1); }}
         uprobe:{bs}:key {{ @k[arg0] = count(); }}
         uprobe:{bs}:long_string {{ @l[str(arg0)] = count(); printf(\"%s\\n\", str(arg0)); }}"
    )
}

/// The long_string printfs of faults.c (its 1000-byte string, `n` calls) in weft's
/// output: each call is printed as the string truncated to 63 bytes + NUL, or counted
/// in weft's "Lost N events" (a full event ring drops events and says so: only
/// these printfs make events here). Returns (printed, lost).
///
/// Counting the 63-byte lines alone (as this check once did) fails whenever weft is
/// not scheduled for the ~10 ms the target takes to fill its 256 KiB ring (20000
/// events of 96 bytes in the soak): a loaded machine, not a string read escaping
/// its limit.
fn check_long_strings(out: &str, err: &str, n: u64) -> Result<(u64, u64), String> {
    let long_line = "a".repeat(63);
    let lost: u64 = err
        .lines()
        .find_map(|l| l.strip_prefix("Lost ")?.strip_suffix(" events"))
        .map_or(Ok(0), |v| v.trim().parse())
        .map_err(|e| format!("bad Lost line in {err:?}: {e}"))?;
    let odd: Vec<&str> = out
        .lines()
        .filter(|l| (l.starts_with('a') || l.contains('z')) && *l != long_line)
        .take(3)
        .collect();
    let printed = out.lines().filter(|l| *l == long_line).count() as u64;
    if !odd.is_empty() {
        return Err(format!(
            "long strings not truncated to 63 bytes + NUL: {odd:?} ({printed} lines right)"
        ));
    }
    if printed + lost != n {
        return Err(format!(
            "{n} long_string calls, but {printed} printed + {lost} lost"
        ));
    }
    Ok((printed, lost))
}

/// The state letter of `/proc/PID/stat` (`R`, `S`, `T`, ...).
fn proc_state(pid: i32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?.1.trim_start().chars().next()
}

/// A full event ring while weft is not running (stopped here; descheduled on a busy
/// machine in the soak) drops the long_string printf events, and says so: every call
/// is printed, truncated to 63 bytes + NUL, or counted in "Lost N events". weft is
/// held stopped, deterministically, while the target makes all its calls (it waits
/// on a FIFO for the test, and tells it through another when it is done).
#[test]
fn advice_faults_with_events_lost_while_weft_is_stopped() {
    let mut tally = Tally::new("advice faults injected, weft stopped", "faults");
    let bin = stress("faults.c");
    let bs = b(&bin);
    let n = 20_000u64;
    let dir =
        PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("faults-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let (go, done) = (dir.join("go"), dir.join("done"));
    for f in [&go, &done] {
        let c = std::ffi::CString::new(f.to_str().unwrap()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    }
    // A division by zero is warned where it happens, by an event of its own: this
    // test counts the long_string events alone, so it leaves divisions to the test
    // above.
    let prog = faults_program(bs).replace(
        &format!("uprobe:{bs}:divide {{ @q = sum(arg0 / arg1); @m = sum(arg0 % arg1); }}"),
        "",
    );
    assert!(!prog.contains("divide"), "{prog}");
    let w = Command::new(weft_bin())
        .args(["-e", &prog, "-c"])
        .arg(format!("{bs} {n} {} {}", go.display(), done.display()))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let wpid = w.id() as i32;
    let deadline = Instant::now() + T;
    // The target opens GO in main, after weft has woven every probe.
    let mut go_w = loop {
        match std::fs::OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(&go)
        {
            Ok(f) => break f,
            Err(e) if e.raw_os_error() == Some(libc::ENXIO) && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(5))
            }
            Err(e) => panic!("the target never opened {}: {e}", go.display()),
        }
    };
    // SAFETY: stopping our own child.
    unsafe { libc::kill(wpid, libc::SIGSTOP) };
    while proc_state(wpid) != Some('T') {
        assert!(Instant::now() < deadline, "weft did not stop");
        std::thread::sleep(Duration::from_millis(1));
    }
    use std::io::{Read, Write};
    go_w.write_all(b"g").unwrap();
    drop(go_w);
    let mut done_r = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(&done)
        .unwrap();
    let mut got = Vec::new();
    while got != b"done" {
        let mut buf = [0u8; 8];
        match done_r.read(&mut buf) {
            Ok(k) => got.extend_from_slice(&buf[..k]),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => panic!("reading {}: {e}", done.display()),
        }
        assert!(
            Instant::now() < deadline,
            "the target never finished its calls"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    // SAFETY: resuming our own child.
    unsafe { libc::kill(wpid, libc::SIGCONT) };
    let o = wait_output(w, T);
    let _ = std::fs::remove_dir_all(&dir);
    let out = text(&o.stdout);
    let err = text(&o.stderr);
    tally.count = 3 * n + 3 * n + (n - 10) + n;
    tally.check(o.status.success(), || format!("weft failed: {err}"));
    let native = text(
        &Command::new(&bin)
            .arg(n.to_string())
            .output()
            .unwrap()
            .stdout,
    );
    tally.check(out.contains(native.trim()), || {
        format!("target output changed: want {native}")
    });
    tally.check(
        err.contains(&format!("weft: {} reads of target memory faulted", 6 * n)),
        || format!("fault count wrong:\n{err}"),
    );
    // Every event the ring holds is printed (weft drains it when it resumes), the
    // rest are lost: 262144-byte ring / 96-byte records (32 header + 64 string).
    match check_long_strings(&out, &err, n) {
        Ok(got) => tally.check(got == (2730, n - 2730), || {
            format!("want 2730 printed and {} lost, got {got:?}", n - 2730)
        }),
        Err(e) => tally.fail(e),
    }
    tally.finish();
}

// ---------------------------------------------------------------------------------
// 7. Lost nothing.
// ---------------------------------------------------------------------------------

/// A target calls a function far faster than weft drains printf events: every event
/// is either printed or counted in "Lost N events", exactly.
#[test]
fn delivered_plus_lost_equals_produced() {
    let mut tally = Tally::new("events produced faster than drained", "events");
    let bin = stress("lost.c");
    let bs = b(&bin);
    for (n, threads) in [
        (scale(1_000_000, 5_000_000), 1),
        (scale(300_000, 2_000_000), 4),
    ] {
        let prog = format!("uprobe:{bs}:emit {{ printf(\"e %d %d\\n\", arg0, arg1); }}");
        let o = weft(&["-e", &prog, "-c", &format!("{bs} {n} {threads}")], T);
        let out = text(&o.stdout);
        let err = text(&o.stderr);
        let delivered = out.lines().filter(|l| l.starts_with("e ")).count() as u64;
        let produced: u64 = out
            .lines()
            .find_map(|l| l.strip_prefix("produced "))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0);
        let lost: u64 = err
            .lines()
            .find_map(|l| {
                l.strip_prefix("Lost ")
                    .and_then(|r| r.strip_suffix(" events"))
            })
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0);
        tally.count += produced;
        tally.check(produced == n * threads, || {
            format!("target produced {produced}")
        });
        tally.check(delivered + lost == produced, || {
            format!("{threads} threads: delivered {delivered} + lost {lost} != produced {produced}")
        });
    }
    tally.finish();
}

// ---------------------------------------------------------------------------------
// 8. Hostile input.
// ---------------------------------------------------------------------------------

/// A run that must end with a clear error or success: never a panic, a crash or a
/// hang.
fn no_panic(r: &Result<std::process::Output, String>) -> Result<(), String> {
    let o = r.as_ref().map_err(|e| e.clone())?;
    let err = text(&o.stderr);
    if err.contains("panicked") || o.status.code() == Some(101) || o.status.code().is_none() {
        return Err(format!("{}: {}", o.status, first_lines(&err, 6)));
    }
    Ok(())
}

fn le_u64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
}
fn le_u16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes(b[at..at + 2].try_into().unwrap())
}

/// Malformed copies of a real ELF file: truncations, and header fields that lie.
fn malformed_elves(elf: &[u8], rng: &mut Rng, extra_random: usize) -> Vec<(String, Vec<u8>)> {
    let mut out: Vec<(String, Vec<u8>)> = Vec::new();
    let shoff = le_u64(elf, 0x28) as usize;
    let phoff = le_u64(elf, 0x20) as usize;
    let shnum = le_u16(elf, 0x3c) as usize;
    let mut cuts = vec![
        0,
        1,
        4,
        16,
        52,
        63,
        64,
        65,
        phoff + 56,
        phoff + 60,
        shoff,
        shoff + 64,
        elf.len() - 1,
    ];
    let slices = scale(12, 200) as usize;
    for k in 1..slices {
        cuts.push(elf.len() * k / slices);
    }
    // Section names, to pick the sections parsers read.
    let shstrndx = le_u16(elf, 0x3e) as usize;
    let strtab_off = le_u64(elf, shoff + shstrndx * 64 + 0x18) as usize;
    let name_of = |i: usize| -> String {
        let at = strtab_off
            + u32::from_le_bytes(elf[shoff + i * 64..shoff + i * 64 + 4].try_into().unwrap())
                as usize;
        let end = elf[at..]
            .iter()
            .position(|&c| c == 0)
            .map_or(at, |n| at + n);
        String::from_utf8_lossy(&elf[at..end]).into_owned()
    };
    const READ: &[&str] = &[
        ".symtab",
        ".strtab",
        ".dynsym",
        ".dynstr",
        ".text",
        ".debug_info",
        ".debug_abbrev",
        ".debug_line",
        ".debug_str",
        ".shstrtab",
        ".eh_frame_hdr",
        ".note.gnu.build-id",
    ];
    for c in cuts {
        let c = c.min(elf.len());
        out.push((format!("truncated to {c} bytes"), elf[..c].to_vec()));
    }
    let mut patch = |name: &str, at: usize, bytes: &[u8]| {
        if at + bytes.len() <= elf.len() {
            let mut v = elf.to_vec();
            v[at..at + bytes.len()].copy_from_slice(bytes);
            out.push((name.to_string(), v));
        }
    };
    patch("e_shoff beyond the file", 0x28, &(1u64 << 40).to_le_bytes());
    patch("e_shoff near u64::MAX", 0x28, &(u64::MAX - 8).to_le_bytes());
    patch("e_shnum 0xffff", 0x3c, &0xffffu16.to_le_bytes());
    patch("e_shstrndx out of range", 0x3e, &0xfff0u16.to_le_bytes());
    patch("e_phoff beyond the file", 0x20, &(1u64 << 40).to_le_bytes());
    patch("e_phnum 0xffff", 0x38, &0xffffu16.to_le_bytes());
    patch("e_shentsize 1", 0x3a, &1u16.to_le_bytes());
    patch("e_phentsize 0", 0x36, &0u16.to_le_bytes());
    patch("32-bit class", 4, &[1]);
    patch("big endian", 5, &[2]);
    patch("e_machine aarch64", 0x12, &183u16.to_le_bytes());
    // Each section header's offset and size, lying.
    for i in 0..shnum {
        let name = name_of(i);
        if !long() && !READ.contains(&name.as_str()) {
            continue;
        }
        let sh = shoff + i * 64;
        patch(
            &format!("{name}: sh_offset huge"),
            sh + 0x18,
            &(u64::MAX / 2).to_le_bytes(),
        );
        patch(
            &format!("{name}: sh_size huge"),
            sh + 0x20,
            &(u64::MAX / 2).to_le_bytes(),
        );
        patch(
            &format!("{name}: sh_size past the end"),
            sh + 0x20,
            &(elf.len() as u64).to_le_bytes(),
        );
        patch(
            &format!("{name}: sh_link bad"),
            sh + 0x28,
            &0xffffu32.to_le_bytes(),
        );
        if long() {
            patch(
                &format!("{name}: sh_entsize 0"),
                sh + 0x38,
                &0u64.to_le_bytes(),
            );
            patch(
                &format!("{name}: sh_entsize 3"),
                sh + 0x38,
                &3u64.to_le_bytes(),
            );
        }
    }
    for _ in 0..extra_random {
        let mut v = elf.to_vec();
        let flips = 1 + rng.below(16);
        // In the headers, the section header table, and the tail of the file where
        // the symbol and string tables are; never in the code, so that launching a
        // copy still ends.
        let tail = shoff.saturating_sub(8192).max(elf.len() / 2);
        for _ in 0..flips {
            let at = match rng.below(3) {
                0 => rng.below(64 + 56 * 13) as usize,
                1 => shoff + rng.below((shnum * 64) as u64) as usize,
                _ => tail + rng.below((elf.len() - tail) as u64) as usize,
            };
            if at < v.len() {
                v[at] = rng.next() as u8;
            }
        }
        out.push((format!("random bytes changed ({flips})"), v));
    }
    out
}

/// weft reads malformed ELF files (as a probe's binary, with `list`, and as modules
/// mapped by a running target) and says so in one line, never panicking or hanging.
#[test]
fn malformed_elf_inputs_give_errors_not_panics() {
    let mut tally = Tally::new("malformed ELF inputs", "inputs");
    let mut rng = Rng::from_env();
    // A program that exits at once when launched (its copies are launched too).
    let real = stress("lost.c");
    let elf = std::fs::read(&real).unwrap();
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("elves-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let inputs = malformed_elves(&elf, &mut rng, scale(20, 2000) as usize);
    let mut paths = Vec::new();
    for (i, (_, bytes)) in inputs.iter().enumerate() {
        let p = dir.join(format!("elf{i}"));
        std::fs::write(&p, bytes).unwrap();
        std::fs::set_permissions(&p, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        paths.push(p);
    }
    // One process maps every input as if it were code.
    let hostile = stress("hostile.c");
    let mut args = vec!["map".to_string()];
    args.extend(paths.iter().map(|p| p.display().to_string()));
    let argv: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut t = Watched::start(&hostile, &argv);
    let pid = t.pid().to_string();
    let short = Duration::from_secs(20);
    for (i, ((what, _), p)) in inputs.iter().zip(&paths).enumerate() {
        tally.count += 1;
        let ps = b(p);
        // Every input as a probe's binary in a launch; in turn, listed, or a module of
        // the running process.
        let mut runs = vec![run_weft(
            &[
                "-e",
                &format!("uprobe:{ps}:emit {{ @c = count(); }}"),
                "-c",
                &format!("{ps} 10"),
            ],
            short,
        )];
        if i % 2 == 0 || long() {
            runs.push(run_weft(&["list", "--binary", ps], short));
        }
        if i % 2 == 1 || long() {
            runs.push(run_weft(
                &[
                    "-e",
                    &format!("uprobe:{ps}:* {{ @c = count(); }} interval:ms:10 {{ exit(); }}"),
                    "-p",
                    &pid,
                ],
                short,
            ));
        }
        for (k, r) in runs.iter().enumerate() {
            if let Err(e) = no_panic(r) {
                tally.fail(format!("{what} ({}), run {k}: {e}", p.display()));
            }
        }
    }
    // Wildcards over every module of the process parse them all at once.
    tally.count += 1;
    if let Err(e) = no_panic(&run_weft(&["-l", "uprobe:*:em*", "-p", &pid], short)) {
        tally.fail(format!("listing every module: {e}"));
    }
    if let Err(e) = t.health() {
        tally.fail(format!("the process mapping the inputs: {e}"));
    }
    drop(t);
    let _ = std::fs::remove_dir_all(&dir);
    tally.finish();
}

/// Programs to mutate for the script fuzzer.
const SEEDS: &[&str] = &[
    "BEGIN { printf(\"%d %s\\n\", 1, \"x\"); exit(); }",
    "uprobe:/bin/true:main /arg0 > 1/ { @a[tid, comm] = count(); @h = hist(arg1); @l = lhist(arg0, 0, 100, 10); }",
    "uretprobe:/bin/true:main { @s = stats(retval); @m = max(retval); $x = retval * 2 + 1; if ($x > 3) { @y = $x; } else { delete(@y); } }",
    "BEGIN { $i = 0; while ($i < 10) { $i++; @c[$i] = sum($i); } unroll(3) { @u = count(); } exit(); }",
    "uprobe:libc:malloc { @b[ustack] = count(); printf(\"%s %x\\n\", str(arg0, 8), arg1); }",
    "config = { max_map_keys = 5 } BEGIN { @t = (1, \"two\", 3); print(@t); clear(@t); exit(); }",
    "interval:ms:1 { @n = count(); if (@n > 2) { exit(); } } END { print(@n); }",
];

const TOKENS: &[&str] = &[
    "{",
    "}",
    "(",
    ")",
    "[",
    "]",
    "@",
    "$",
    "$1",
    "\"",
    "\\",
    "/",
    "*",
    "uprobe:",
    "uretprobe:",
    ",",
    ";",
    ":",
    "printf(\"%s %d %llx %c\\n\",",
    "str(",
    "buf(",
    "hist(",
    "0x7fffffffffffffff",
    "-9223372036854775808",
    "-",
    "++",
    "--",
    "if",
    "else",
    "while",
    "unroll(",
    "**",
    "'",
    "é",
    "\u{0}",
    "interval:s:",
    "BEGIN",
    "END",
    "exit();",
    "args.",
    "->",
    "retval",
    "arg9",
    "comm",
    "tid",
    "@x[",
    "((((((((",
    "))))))))",
    "1/0",
    "%",
    "<<",
    ">>",
    "==",
    "!",
    "~",
    "?",
    ":",
    "=",
    "+=",
];

fn mutate(rng: &mut Rng, seed: &str) -> String {
    let mut s: Vec<char> = seed.chars().collect();
    for _ in 0..1 + rng.below(6) {
        let at = rng.below(s.len() as u64 + 1) as usize;
        match rng.below(4) {
            0 if !s.is_empty() => {
                let n = (1 + rng.below(8) as usize).min(s.len() - at.min(s.len()));
                s.drain(at.min(s.len())..at.min(s.len()) + n);
            }
            1 => {
                let t = TOKENS[rng.below(TOKENS.len() as u64) as usize];
                s.splice(at..at, t.chars());
            }
            2 if !s.is_empty() => {
                let i = at.min(s.len() - 1);
                s[i] = char::from(b' ' + (rng.below(95) as u8));
            }
            _ => {
                // Duplicate a slice (nesting, repeated probes).
                let from = rng.below(s.len() as u64 + 1) as usize;
                let to = (from + rng.below(40) as usize).min(s.len());
                let piece: Vec<char> = s[from..to].to_vec();
                s.splice(at..at, piece);
            }
        }
    }
    s.into_iter().collect()
}

/// One fuzzed program: its text, or a file of the corpus (run as `weft trace FILE`).
enum FuzzInput {
    Text(String),
    File(PathBuf),
}

/// A file that is not a program's text (a NUL byte, invalid UTF-8): weft must say so
/// in one line naming the file, line and column.
fn not_text(bytes: &[u8]) -> bool {
    bytes.contains(&0) || std::str::from_utf8(bytes).is_err()
}

/// Mutated and pathological programs: the front end reports errors (or the program
/// runs), never panics, crashes or hangs. The regression corpus
/// (`tests/stress/corpus/`: inputs that once crashed weft, and hostile shapes) is
/// replayed first, each file as `weft trace FILE`. Programs holding a NUL byte (which
/// argv cannot carry) go through a file too. A failing input is saved under the
/// target directory (not the source tree): copy it into the corpus once the bug is
/// fixed.
#[test]
fn script_fuzz_never_panics() {
    let mut tally = Tally::new("programs fuzzed (parser, checker)", "inputs");
    let mut rng = Rng::from_env();
    let corpus_dir = repo_root().join("tests/stress/corpus");
    let work = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("fuzz-{}", std::process::id()));
    let crashes = Path::new(env!("CARGO_TARGET_TMPDIR")).join("fuzz-crashes");
    std::fs::create_dir_all(&work).unwrap();
    let mut corpus: Vec<PathBuf> = std::fs::read_dir(&corpus_dir)
        .expect("the regression corpus tests/stress/corpus")
        .map(|e| e.unwrap().path())
        .collect();
    corpus.sort();
    assert!(
        corpus.len() >= 10,
        "the regression corpus is missing: {corpus:?}"
    );
    let mut inputs: Vec<FuzzInput> = corpus.into_iter().map(FuzzInput::File).collect();
    inputs.push(FuzzInput::Text(format!(
        "BEGIN {{ @{} = 1; exit(); }}",
        "a".repeat(100_000)
    )));
    inputs.push(FuzzInput::Text(format!(
        "BEGIN {{ printf(\"{}\"); exit(); }}",
        "%d".repeat(10_000)
    )));
    inputs.push(FuzzInput::Text("BEGIN { @x = \"unterminated".to_string()));
    inputs.push(FuzzInput::Text(format!(
        "{} BEGIN {{ exit(); }}",
        "uprobe:/bin/true:main { @c = count(); } ".repeat(2000)
    )));
    for _ in 0..scale(300, 20000) {
        let seed = SEEDS[rng.below(SEEDS.len() as u64) as usize];
        inputs.push(FuzzInput::Text(mutate(&mut rng, seed)));
    }
    for (i, input) in inputs.iter().enumerate() {
        tally.count += 1;
        let (path, bytes) = match input {
            FuzzInput::File(p) => (Some(p.clone()), std::fs::read(p).unwrap()),
            FuzzInput::Text(t) if t.contains('\0') => {
                let p = work.join(format!("input-{i}.bt"));
                std::fs::write(&p, t).unwrap();
                (Some(p), t.clone().into_bytes())
            }
            FuzzInput::Text(t) => (None, t.clone().into_bytes()),
        };
        // Each program runs against a command of its own: without -p or -c a program
        // with uprobes would be system-wide and weave into every process that maps
        // the file (other tests' targets too). Programs that run on after it are
        // stopped after 2 s: not a failure.
        let r = match &path {
            Some(p) => run_weft(&["trace", "-c", "/bin/true", b(p)], Duration::from_secs(2)),
            None => run_weft(
                &[
                    "-c",
                    "/bin/true",
                    "-e",
                    std::str::from_utf8(&bytes).unwrap(),
                ],
                Duration::from_secs(2),
            ),
        };
        if r.as_ref().is_err_and(|e| e.starts_with("timed out")) {
            continue;
        }
        let mut failed = no_panic(&r);
        if let (Ok(()), Some(p), Ok(o)) = (&failed, &path, &r) {
            let err = text(&o.stderr);
            if not_text(&bytes)
                && !(err.lines().count() == 1
                    && err.contains(&format!("{}:", p.display()))
                    && err.contains("UTF-8 text"))
            {
                failed = Err(format!(
                    "want one located line for a file that is not text: {err:?}"
                ));
            }
        }
        if let Err(e) = failed {
            let saved = match input {
                FuzzInput::File(p) => p.clone(),
                FuzzInput::Text(_) => {
                    let name = format!("crash-{:016x}", {
                        use std::hash::{Hash, Hasher};
                        let mut h = std::collections::hash_map::DefaultHasher::new();
                        bytes.hash(&mut h);
                        h.finish()
                    });
                    let _ = std::fs::create_dir_all(&crashes);
                    let _ = std::fs::write(crashes.join(&name), &bytes);
                    crashes.join(name)
                }
            };
            let shown: String = String::from_utf8_lossy(&bytes).chars().take(200).collect();
            tally.fail(format!(
                "{e}\n    program ({} bytes, in {}): {shown:?}",
                bytes.len(),
                saved.display()
            ));
        }
    }
    let _ = std::fs::remove_dir_all(&work);
    tally.finish();
}

/// Builds the two libraries of the /proc/PID/root test into `dir`.
fn build_modules(dir: &Path) -> (PathBuf, PathBuf) {
    let src = repo_root().join("tests/stress/modules.c");
    let inside = dir.join("inside.so");
    let outside = dir.join("outside.so");
    for (out, def) in [(&inside, Some("-DINSIDE")), (&outside, None)] {
        let mut c = Command::new("gcc");
        c.args(["-shared", "-fPIC", "-O2", "-o"]).arg(out).arg(&src);
        if let Some(d) = def {
            c.arg(d);
        }
        assert!(c.status().unwrap().success());
    }
    (inside, outside)
}

/// A target in its own user and mount namespace (as an unprivileged container)
/// maps a library, then makes the path in its maps a symlink to an absolute path
/// that, outside its namespace, is a root-only file it cannot read. weft (root) must
/// read the file the target mapped, or refuse: never the file the symlink names in
/// weft's own namespace.
#[test]
fn proc_pid_root_symlinks_are_not_followed_out_of_the_target() {
    let mut tally = Tally::new("/proc/PID/root symlink escapes", "probes");
    require_root("to give the target a namespace and weft a root-only file");
    let dir = PathBuf::from(format!("/tmp/weft-root-escape-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    for d in ["mnt", "over", "secret"] {
        std::fs::create_dir_all(dir.join(d)).unwrap();
    }
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let (inside, outside) = build_modules(&dir);
    let secret = dir.join("secret/lib.so");
    std::fs::rename(&outside, &secret).unwrap();
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
    std::fs::set_permissions(dir.join("secret"), std::fs::Permissions::from_mode(0o700)).unwrap();
    std::os::unix::fs::symlink(&secret, dir.join("over/lib.so")).unwrap();
    let hostile = dir.join("hostile");
    std::fs::copy(stress("hostile.c"), &hostile).unwrap();
    let d = dir.display();
    // The bind mount goes over the library only once the target has loaded it (it
    // says ready, or CORRUPT, into a file of the tmpfs, which the mount then hides).
    let script = format!(
        "mount -t tmpfs none {d}/mnt && cp {d}/inside.so {d}/mnt/lib.so && \
         ( {d}/hostile dlopen {d}/mnt/lib.so > {d}/mnt/out & p=$!; echo pid $p; \
           until grep -q -e ready -e CORRUPT {d}/mnt/out || ! kill -0 $p; do sleep 0.01; done; \
           cat {d}/mnt/out; \
           mount --bind {d}/over {d}/mnt && echo overmounted; \
           cat {d}/secret/lib.so >/dev/null 2>&1 && echo CORRUPT can read the secret; wait )"
    );
    let mut child = Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "unshare",
            "-U",
            "-r",
            "-m",
            "sh",
            "-c",
            &script,
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let lines = std::io::BufRead::lines(std::io::BufReader::new(child.stdout.take().unwrap()));
    let mut pid = None;
    let mut ready = false;
    for l in lines.map_while(Result::ok) {
        if let Some(p) = l.strip_prefix("pid ") {
            pid = p.trim().parse::<i32>().ok();
        }
        ready |= l == "ready";
        assert!(!l.contains("CORRUPT"), "{l}");
        if l == "overmounted" {
            break;
        }
    }
    let pid = pid.expect("the namespaced target started");
    assert!(ready, "the namespaced target mapped its library");
    let lib = format!("{d}/mnt/lib.so");
    tally.count += 2;
    match run_weft(
        &["-l", &format!("uprobe:{lib}:*"), "-p", &pid.to_string()],
        T,
    ) {
        Ok(o) => {
            let out = text(&o.stdout);
            tally.check(!out.contains("outside_fn"), || {
                format!("weft read the root-only file outside the target's namespace through its symlink: {out}")
            });
        }
        Err(e) => tally.fail(format!("weft -l {e}")),
    }
    let prog = format!("uprobe:{lib}:outside_fn {{ @c = count(); }} interval:ms:10 {{ exit(); }}");
    match run_weft(&["-e", &prog, "-p", &pid.to_string()], T) {
        Ok(o) => tally.check(!o.status.success(), || {
            "weft wove a function found only in the root-only file outside the target".to_string()
        }),
        Err(e) => tally.fail(format!("weft -e {e}")),
    }
    // SAFETY: killing the target we started (through setpriv/unshare/sh).
    unsafe { libc::kill(pid, libc::SIGKILL) };
    let _ = child.kill();
    let _ = child.wait();
    let _ = std::fs::remove_dir_all(&dir);
    let _ = inside;
    tally.finish();
}

// ---------------------------------------------------------------------------------
// 9. Security.
// ---------------------------------------------------------------------------------

/// The abstract name of weft's listening socket, from /proc/net/unix.
fn weft_socket_name(weft_pid: u32) -> Option<String> {
    let unix = std::fs::read_to_string("/proc/net/unix").ok()?;
    let prefix = format!("@weft-{weft_pid}-");
    unix.lines()
        .filter_map(|l| l.split_whitespace().nth(7))
        .find(|p| p.starts_with(&prefix))
        .map(|p| p[1..].to_string())
}

/// While weft waits for its agent (the target is stopped, so the agent cannot
/// connect yet), another user — and another process of weft's own user — connect to
/// weft's socket and send a forged hello: weft must refuse both, then serve the real
/// agent normally.
#[test]
fn control_socket_refuses_other_peers() {
    let mut tally = Tally::new("foreign connections to the control socket", "connections");
    require_root("to connect as another user");
    let bin = stress("hammer.c");
    let peer = stress_v("sockpeer.c", O0_NOPIE, &[]);
    let mut t = Watched::start(&bin, &["2"]);
    // Let the agent in first, so the attach below only needs it to connect.
    let prog = hot_program(b(&bin), &[], 300);
    ok(&weft(&["-e", &prog, "-p", &t.pid().to_string()], T));
    // SAFETY: stopping the target we started.
    unsafe { libc::kill(t.pid(), libc::SIGSTOP) };
    let mut w = Background::start(&["-v", "-e", &prog, "-p", &t.pid().to_string()]);
    // weft has made its remote call and waits for the agent once it says so.
    w.wait_line("agent loaded into", true, T);
    let name = weft_socket_name(w.child.id()).expect("no weft socket");
    let as_nobody = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(&peer)
        .arg(&name)
        .output()
        .unwrap();
    let as_root = Command::new(&peer).arg(&name).output().unwrap();
    for (who, o) in [
        ("uid 65534", &as_nobody),
        ("another root process", &as_root),
    ] {
        tally.count += 1;
        let said = text(&o.stdout);
        tally.check(said.trim() == "closed" || said.trim() == "refused", || {
            format!("{who} connecting to weft's socket: {said:?} (weft must close it at once)")
        });
    }
    // SAFETY: continuing the target.
    unsafe { libc::kill(t.pid(), libc::SIGCONT) };
    let o = w.finish(T);
    tally.check(
        o.status.success() && map_value(&text(&o.stdout), "@c").is_some_and(|c| c > 0),
        || {
            format!(
                "weft did not go on with the real agent: {}",
                text(&o.stderr)
            )
        },
    );
    if let Err(e) = t.intact(true) {
        tally.fail(e);
    }
    tally.finish();
}

/// An unprivileged user attaching to a root process is refused, with the kernel's
/// reason, and the target is left alone.
#[test]
fn unprivileged_attach_to_root_process_is_refused() {
    let mut tally = Tally::new("unprivileged attaches to a root process", "attaches");
    require_root("to own the target");
    let bin = stress("hammer.c");
    let mut t = Watched::start(&bin, &["1"]);
    let prog = format!("uprobe:{}:hot_jump {{ @c = count(); }}", b(&bin));
    tally.count += 1;
    let o = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(weft_bin())
        .args(["-e", &prog, "-p", &t.pid().to_string()])
        .output()
        .unwrap();
    let err = text(&o.stderr);
    tally.check(o.status.code() == Some(1), || {
        format!("status {}: {err}", o.status)
    });
    tally.check(
        err.lines().count() == 1 && err.contains("permission denied"),
        || format!("want one line saying permission denied and why: {err:?}"),
    );
    tally.check(
        err.contains("Operation not permitted")
            || err.contains("EPERM")
            || err.contains("uid")
            || err.contains("ptrace"),
        || format!("the kernel's reason is missing: {err:?}"),
    );
    let maps = std::fs::read_to_string(format!("/proc/{}/maps", t.pid())).unwrap();
    tally.check(!maps.contains("libweft_agent"), || {
        "the agent got into the root process".into()
    });
    if let Err(e) = t.intact(true) {
        tally.fail(e);
    }
    tally.finish();
}

/// A target started with LD_PRELOAD (a library recording every process it is
/// loaded into): weft attaching to it, and weft launching a command whose own
/// environment has LD_PRELOAD, never load that library into weft itself.
#[test]
fn targets_ld_preload_does_not_reach_weft() {
    let mut tally = Tally::new("target LD_PRELOAD reaching weft", "runs");
    let dir =
        Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("preload-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mark = dir.join("mark");
    let lib = dir.join("record.so");
    let st = Command::new("gcc")
        .args([
            "-shared",
            "-fPIC",
            "-O2",
            &format!("-DMARK=\"{}\"", mark.display()),
            "-o",
        ])
        .arg(&lib)
        .arg(repo_root().join("tests/stress/preload.c"))
        .status()
        .unwrap();
    assert!(st.success());
    let bin = stress("hammer.c");
    let mut child = Command::new(&bin)
        .arg("1")
        .env("LD_PRELOAD", &lib)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let target_pid = child.id();
    let out = child.stdout.take().unwrap();
    let (tx, lines) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::io::BufRead;
        for l in std::io::BufReader::new(out).lines().map_while(Result::ok) {
            if tx.send(l).is_err() {
                break;
            }
        }
    });
    let mut t = Spawned { child, lines };
    // Attach once it runs its main (its loader and the preloaded library are done).
    t.wait_line("ready", T);
    let prog = hot_program(b(&bin), &[], 50);
    tally.count += 1;
    let o = weft(&["-e", &prog, "-p", &target_pid.to_string()], T);
    tally.check(o.status.success(), || text(&o.stderr));
    // Launch: the command line sets LD_PRELOAD for the command only (through env).
    tally.count += 1;
    let calls = stress("lost.c");
    let launch = format!("env LD_PRELOAD={} {} 10 1", lib.display(), b(&calls));
    let _ = weft(&["-e", "BEGIN { @x = 1; }", "-c", &launch], T);
    let marks = std::fs::read_to_string(&mark).unwrap_or_default();
    for l in marks.lines() {
        tally.check(!l.ends_with("/weft"), || {
            format!("weft's own process loaded the target's LD_PRELOAD: {l}")
        });
    }
    tally.check(
        marks
            .lines()
            .any(|l| l.starts_with(&format!("{target_pid} "))),
        || format!("the library never recorded the target itself: {marks:?}"),
    );
    let _ = t.child.kill();
    let _ = std::fs::remove_dir_all(&dir);
    tally.finish();
}

/// The shared segment (and code regions) are memfds only their owner may open.
#[test]
fn shared_memory_is_private_to_its_owner() {
    let mut tally = Tally::new("shared memory permissions", "memfds");
    let bin = stress("hammer.c");
    let t = Watched::start(&bin, &["1"]);
    let prog = format!("uprobe:{}:hot_jump {{ @c = count(); }}", b(&bin));
    let mut w = spawn_weft(&["-e", &prog, "-p", &t.pid().to_string()]);
    let start = Instant::now();
    while code_matches_file(t.pid(), &bin) && start.elapsed() < T {
        std::thread::sleep(Duration::from_millis(5));
    }
    use std::os::unix::fs::MetadataExt;
    let mut seen = Vec::new();
    for pid in [w.id() as i32, t.pid()] {
        for dir in ["fd", "map_files"] {
            let Ok(rd) = std::fs::read_dir(format!("/proc/{pid}/{dir}")) else {
                continue;
            };
            for e in rd.flatten() {
                let Ok(target) = std::fs::read_link(e.path()) else {
                    continue;
                };
                let name = target.display().to_string();
                if !name.contains("memfd:weft") {
                    continue;
                }
                let Ok(md) = std::fs::metadata(e.path()) else {
                    continue;
                };
                tally.count += 1;
                seen.push(name.clone());
                tally.check(md.mode() & 0o077 == 0, || {
                    format!("{name} (in {}/{dir}) has mode {:o}", pid, md.mode() & 0o777)
                });
            }
        }
    }
    tally.check(!seen.is_empty(), || "found no weft memfd".into());
    // SAFETY: interrupting the weft we started.
    unsafe { libc::kill(w.id() as i32, libc::SIGINT) };
    let _ = w.wait();
    tally.finish();
}
