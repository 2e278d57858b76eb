//! System-wide probes (no `-p`, no `-c`): every process that maps the probed binary
//! or library, those running when weft starts and those that start while it runs
//! (caught by the kernel: an eBPF program on uprobes stops them until they are woven).
//!
//! Each test builds its own copy of the targets (`tests/targets/sw.c`, `swlib.c`)
//! in a directory of its own, so the processes of other tests never map the probed
//! files. These tests need eBPF and uprobes (CI runs as root): they fail, never skip,
//! when the kernel refuses them.

mod common;

use std::collections::BTreeMap;
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;

const T: Duration = Duration::from_secs(120);

/// `sw` (and `libswlib.so`, and `sw_linked`, linked with it) built in a directory of
/// the test's own.
struct Targets {
    dir: PathBuf,
}

impl Targets {
    fn build(test: &str) -> Targets {
        let dir = scratch_dir(&format!("sw-{test}"));
        let src = repo_root().join("tests/targets");
        let (prog, lib) = (src.join("sw.c"), src.join("swlib.c"));
        let (prog, lib) = (prog.to_str().unwrap(), lib.to_str().unwrap());
        for args in [
            vec!["-O2", "-g", "-o", "sw", prog, "-ldl"],
            vec!["-O2", "-g", "-shared", "-fPIC", "-o", "libswlib.so", lib],
            vec![
                "-O2",
                "-g",
                "-DWITH_LIB",
                "-o",
                "sw_linked",
                prog,
                "-L.",
                "-lswlib",
                "-Wl,-rpath,$ORIGIN",
                "-ldl",
            ],
        ] {
            let st = Command::new("gcc")
                .args(&args)
                .current_dir(&dir)
                .status()
                .unwrap();
            assert!(st.success(), "gcc {args:?}");
        }
        Targets { dir }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    fn s(&self, name: &str) -> String {
        self.path(name).to_str().unwrap().to_string()
    }

    /// Runs `bin args` to its end; its stdout.
    fn run(&self, bin: &str, args: &[&str]) -> String {
        let o = Command::new(self.path(bin)).args(args).output().unwrap();
        assert!(o.status.success(), "{bin} {args:?}: {o:?}");
        text(&o.stdout)
    }
}

impl Drop for Targets {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// weft's line once its session runs (the first interval tick comes after the
/// probes are patched into the processes found at the start).
const WOVEN: &str = "interval:ms:10 /@woven == 0/ { @woven = 1; printf(\"woven\\n\"); } \
                     END { clear(@woven); }";

/// `@NAME[KEY]: VALUE` lines of a map, by key.
fn keyed(out: &str, name: &str) -> BTreeMap<i64, i64> {
    let prefix = format!("{name}[");
    out.lines()
        .filter_map(|l| {
            let rest = l.strip_prefix(&prefix)?;
            let (k, v) = rest.split_once("]: ")?;
            Some((k.parse().ok()?, v.trim().parse().ok()?))
        })
        .collect()
}

/// Start `weft ARGS` system-wide and wait until its session runs.
fn start_weft(args: &[&str]) -> Background {
    let mut w = Background::start(args);
    w.wait_line("woven", false, T);
    w
}

/// Three processes running before weft starts and three started after it: each
/// counted exactly, under its own pid.
#[test]
fn processes_before_and_after_weft_are_counted_exactly() {
    let t = Targets::build("before-after");
    let bin = t.s("sw");
    let before: Vec<Spawned> = (1..=3)
        .map(|n| Spawned::start(&t.path("sw"), &[&n.to_string(), "wait"]))
        .collect();
    for s in &before {
        s.wait_line("ready", T);
    }
    let prog = format!("uprobe:{bin}:f {{ @[pid] = count(); }} {WOVEN}");
    let w = start_weft(&["-e", &prog]);
    let mut want = BTreeMap::new();
    for (n, s) in (1..=3).zip(&before) {
        want.insert(s.pid() as i64, n);
        // SAFETY: signalling a child of this test that is still running.
        unsafe { libc::kill(s.pid(), libc::SIGUSR1) };
    }
    for n in 4..=6 {
        let c = Command::new(&bin)
            .arg(n.to_string())
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        want.insert(c.id() as i64, n);
        let o = c.wait_with_output().unwrap();
        assert!(o.status.success());
    }
    for mut s in before {
        assert!(s.child.wait().unwrap().success());
    }
    w.signal(libc::SIGINT);
    let o = w.finish(T);
    let out = ok(&o);
    assert_eq!(keyed(&out, "@"), want, "{out}\n{}", text(&o.stderr));
}

/// A shell loop starting 200 short-lived processes of the binary while weft runs:
/// every call of every one counted.
#[test]
fn two_hundred_short_lived_processes_are_all_counted() {
    let t = Targets::build("loop");
    let bin = t.s("sw");
    let prog = format!("uprobe:{bin}:f {{ @calls = count(); @procs[pid] = count(); }} {WOVEN}");
    let w = start_weft(&["-e", &prog]);
    let st = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "i=0; while [ $i -lt 200 ]; do {bin} 3 >/dev/null || exit 1; i=$((i+1)); done"
        ))
        .status()
        .unwrap();
    assert!(st.success());
    w.signal(libc::SIGINT);
    let o = w.finish(T);
    let out = ok(&o);
    assert_eq!(map_value(&out, "@calls"), Some(600), "{out}");
    let procs = keyed(&out, "@procs");
    assert_eq!(procs.len(), 200, "{out}");
    assert!(procs.values().all(|&n| n == 3), "{out}");
}

/// A library probe: processes that load the library at start-up and with `dlopen`,
/// all started after weft, are counted exactly.
#[test]
fn a_library_loaded_at_start_or_by_dlopen_later_is_probed() {
    let t = Targets::build("lib");
    let lib = t.s("libswlib.so");
    let prog = format!("uprobe:{lib}:g {{ @[pid] = count(); }} {WOVEN}");
    let w = start_weft(&["-e", &prog]);
    let mut want = BTreeMap::new();
    for n in [2, 5, 7] {
        let c = Command::new(t.path("sw"))
            .args([&n.to_string(), "dlopen", &lib])
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        want.insert(c.id() as i64, n);
        assert!(c.wait_with_output().unwrap().status.success());
        let c = Command::new(t.path("sw_linked"))
            .arg((n + 1).to_string())
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        want.insert(c.id() as i64, n + 1);
        assert!(c.wait_with_output().unwrap().status.success());
    }
    w.signal(libc::SIGINT);
    let o = w.finish(T);
    let out = ok(&o);
    assert_eq!(keyed(&out, "@"), want, "{out}\n{}", text(&o.stderr));
    // The programs themselves ran as without weft.
    assert_eq!(t.run("sw", &["4", "dlopen", &lib]), "12\n");
}

/// weft ended by SIGINT while members (found at the start, and caught as they
/// started) still run: every one unwoven, its code equal to the file, and running on.
#[test]
fn sigint_unweaves_every_member_still_running() {
    let t = Targets::build("sigint");
    let bin = t.path("sw");
    let mut early = Spawned::start(&bin, &["0", "spin"]);
    early.wait_line("ready", T);
    let prog = format!(
        "uprobe:{}:f {{ @c[pid] = count(); }} {WOVEN} \
         interval:ms:10 /@both == 0 && len(@c) == 2/ {{ @both = 1; printf(\"both\\n\"); }} \
         END {{ clear(@both); }}",
        bin.display()
    );
    let mut w = start_weft(&["-e", &prog]);
    let mut late = Spawned::start(&bin, &["0", "spin"]);
    late.wait_line("ready", T);
    // Caught as it started: woven before it printed.
    assert!(
        !code_matches_file(late.pid(), &bin),
        "the late process is not woven"
    );
    assert!(
        !code_matches_file(early.pid(), &bin),
        "the early process is not woven"
    );
    w.wait_line("both", false, T);
    w.signal(libc::SIGINT);
    let o = w.finish(T);
    let out = ok(&o);
    let counts = keyed(&out, "@c");
    for pid in [early.pid(), late.pid()] {
        assert!(
            counts.get(&(pid as i64)).is_some_and(|&n| n > 0),
            "{pid}: {out}"
        );
    }
    for s in [&mut early, &mut late] {
        assert!(code_matches_file(s.pid(), &bin), "{} left woven", s.pid());
        s.assert_healthy();
    }
}

/// Without a process there is no file to find processes by for a profile probe;
/// a wildcard binary cannot be watched; more processes than `--max-processes` are
/// refused before any is touched.
#[test]
fn system_wide_refusals_are_clear() {
    let o = weft(&["-e", "profile:hz:99 { @ = count(); }"], T);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        text(&o.stderr).contains("profile probes need a target process"),
        "{o:?}"
    );
    let o = weft(&["-e", "uprobe:*:f { @ = count(); }"], T);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        text(&o.stderr).contains("a wildcard binary needs a target process"),
        "{o:?}"
    );
    let t = Targets::build("max");
    let bin = t.path("sw");
    let running: Vec<Spawned> = (0..2)
        .map(|_| Spawned::start(&bin, &["0", "spin"]))
        .collect();
    for s in &running {
        s.wait_line("ready", T);
    }
    let prog = format!("uprobe:{}:f {{ @ = count(); }}", bin.display());
    let o = weft(&["--max-processes", "1", "-e", &prog], T);
    assert_eq!(o.status.code(), Some(1), "{o:?}");
    assert!(
        text(&o.stderr).contains("2 processes map")
            && text(&o.stderr).contains("--max-processes 1"),
        "{}",
        text(&o.stderr)
    );
    for s in &running {
        assert!(code_matches_file(s.pid(), &bin));
    }
}

/// weft SIGKILLed just after the kernel stopped a starting process for it (its
/// guardian continues it), or while the process's thread is held in the agent
/// (the agent lets it go when weft's socket closes): the process runs to its end
/// with its own result, unharmed.
#[test]
fn sigkill_of_weft_with_a_process_caught_or_held_leaves_it_running() {
    let t = Targets::build("sigkill");
    let bin = t.s("sw");
    let prog = format!("uprobe:{bin}:f {{ @ = count(); }} {WOVEN}");
    for point in ["caught", "held"] {
        let mut w = Background::start_with_env(&["-e", &prog], &[("WEFT_TEST_DIE_AT", point)]);
        w.wait_line("woven", false, T);
        let c = Command::new(&bin)
            .arg("5")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // (Stopped for good, it would be killed at the timeout and fail here.)
        let o = wait_output(c, T);
        assert!(o.status.success(), "{point}: {o:?}");
        assert_eq!(text(&o.stdout), "15\n", "{point}");
        let done = w.finish(T);
        assert_eq!(
            done.status.signal(),
            Some(libc::SIGKILL),
            "{point}: {done:?}"
        );
    }
}

/// weft SIGKILLed while a process it caught is still in the kernel's ring, unread
/// (weft is kept from reading it: stopped): the guardian continues it too, once
/// weft's process is gone, and it runs to its end with its own result.
#[test]
fn sigkill_of_weft_with_a_caught_process_it_never_read_leaves_it_running() {
    let t = Targets::build("unread");
    let bin = t.s("sw");
    let prog = format!("uprobe:{bin}:f {{ @ = count(); }} {WOVEN}");
    let mut w = Background::start(&["-e", &prog]);
    w.wait_line("woven", false, T);
    w.signal(libc::SIGSTOP);
    let c = Command::new(&bin)
        .arg("5")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The kernel stops it as it starts (weft, stopped, cannot read it).
    let stat = format!("/proc/{}/stat", c.id());
    let state = || {
        let s = std::fs::read_to_string(&stat).unwrap_or_default();
        s.rsplit_once(')')
            .and_then(|(_, r)| r.trim_start().chars().next())
    };
    let until = std::time::Instant::now() + T;
    while state() != Some('T') {
        assert!(std::time::Instant::now() < until, "never caught");
        std::thread::sleep(Duration::from_millis(5));
    }
    w.signal(libc::SIGKILL);
    // (Stopped for good, it would be killed at the timeout and fail here.)
    let o = wait_output(c, T);
    assert!(o.status.success(), "{o:?}");
    assert_eq!(text(&o.stdout), "15\n");
    let done = w.finish(T);
    assert_eq!(done.status.signal(), Some(libc::SIGKILL), "{done:?}");
}

/// Where the kernel cannot catch processes (no eBPF; forced here with
/// `WEFT_TEST_NO_EBPF`), weft says so and finds new processes in `/proc`: a process
/// started after weft is woven within a scan, and counted exactly from then on.
#[test]
fn without_ebpf_new_processes_are_found_in_proc() {
    let t = Targets::build("noebpf");
    let bin = t.path("sw");
    let prog = format!("uprobe:{}:f {{ @[pid] = count(); }} {WOVEN}", bin.display());
    let mut w = Background::start_with_env(&["-e", &prog], &[("WEFT_TEST_NO_EBPF", "1")]);
    w.wait_line("looks for new ones in /proc", true, T);
    w.wait_line("woven", false, T);
    let mut late = Spawned::start(&bin, &["4", "wait"]);
    late.wait_line("ready", T);
    let deadline = std::time::Instant::now() + T;
    while code_matches_file(late.pid(), &bin) {
        assert!(std::time::Instant::now() < deadline, "never woven");
        std::thread::sleep(Duration::from_millis(10));
    }
    // SAFETY: signalling a child of this test that is still running.
    unsafe { libc::kill(late.pid(), libc::SIGUSR1) };
    assert!(late.child.wait().unwrap().success());
    w.signal(libc::SIGINT);
    let o = w.finish(T);
    let out = ok(&o);
    assert_eq!(
        keyed(&out, "@"),
        BTreeMap::from([(late.pid() as i64, 4)]),
        "{out}\n{}",
        text(&o.stderr)
    );
}

/// A program whose probed function is not in it (a stripped copy), with
/// `missing_probes = "warn"`: the probe is skipped with upstream's warning, and the
/// program runs on at once, never held until weft ends.
#[test]
fn a_process_left_out_runs_on_at_once() {
    let t = Targets::build("leftout");
    let stripped = t.path("sw_stripped");
    std::fs::copy(t.path("sw"), &stripped).unwrap();
    let st = Command::new("strip")
        .arg("-s")
        .arg(&stripped)
        .status()
        .unwrap();
    assert!(st.success());
    let bin = stripped.to_str().unwrap();
    // Refused at once by default (below); skipped with a warning, the probe's file
    // is still watched and its processes caught.
    let prog = format!(
        "config = {{ missing_probes = \"warn\" }} uprobe:{bin}:f {{ @c = count(); }} {WOVEN}"
    );
    let w = start_weft(&["-e", &prog]);
    // Held until weft ends, it would be killed by the timeout.
    let o = Command::new("timeout")
        .args(["60", bin, "3"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{o:?}");
    assert_eq!(text(&o.stdout), t.run("sw", &["3"]));
    w.signal(libc::SIGINT);
    let o = w.finish(T);
    let err = text(&o.stderr);
    assert!(
        err.contains(&format!(
            "Could not resolve symbol: {bin}:f, skipping probe."
        )),
        "{err}"
    );
    assert_eq!(map_value(&ok(&o), "@c"), Some(0));
}

/// A probe on a function its file lacks is refused before anything starts (it could
/// never be woven: the session would wait forever), with the way to skip it.
#[test]
fn system_wide_missing_function_is_refused_at_once() {
    let t = Targets::build("missing");
    let bin = t.path("sw");
    let b = bin.display();
    let o = weft(
        &["-e", &format!("uprobe:{b}:no_such_fn {{ @ = count(); }}")],
        T,
    );
    assert_eq!(o.status.code(), Some(1));
    let err = text(&o.stderr);
    assert!(
        err.contains(&format!(
            "weft: uprobe:{b}:no_such_fn: function `no_such_fn` not found in "
        )) && err.contains(
            "(with config `missing_probes = \"warn\"` or `\"ignore\"` the probe is skipped)"
        ),
        "{err}"
    );
}
