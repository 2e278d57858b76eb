//! Shared helpers for the end-to-end tests: building the C targets in
//! `tests/targets/` across the flag matrix, running `weft`, reading its output.

#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// One way of compiling a target.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Variant {
    pub opt: &'static str,
    pub pie: bool,
    pub cet: bool,
}

impl Variant {
    pub const O2_PIE: Variant = Variant {
        opt: "-O2",
        pie: true,
        cet: true,
    };

    pub fn name(&self) -> String {
        format!(
            "{}-{}-{}",
            self.opt.trim_start_matches('-'),
            if self.pie { "pie" } else { "nopie" },
            if self.cet { "cet" } else { "nocet" }
        )
    }

    fn flags(&self) -> Vec<&'static str> {
        let mut f = vec![self.opt, "-g", "-fno-omit-frame-pointer"];
        f.extend(if self.pie {
            ["-fPIE", "-pie"]
        } else {
            ["-fno-pie", "-no-pie"]
        });
        f.push(if self.cet {
            "-fcf-protection=full"
        } else {
            "-fcf-protection=none"
        });
        f
    }
}

/// -O0/-O2 × PIE/non-PIE × with/without -fcf-protection.
pub fn all_variants() -> Vec<Variant> {
    let mut v = Vec::new();
    for opt in ["-O0", "-O2"] {
        for pie in [true, false] {
            for cet in [true, false] {
                v.push(Variant { opt, pie, cet });
            }
        }
    }
    v
}

/// An empty directory of this test process under `target/tmp`: `NAME-PID`, whatever
/// an earlier run left there removed.
#[allow(dead_code)]
pub fn scratch_dir(name: &str) -> PathBuf {
    let dir = repo_root()
        .join("target/tmp")
        .join(format!("{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap()
}

/// Build `tests/targets/<src>` with `variant` (and `extra` flags); cached by name.
pub fn build(src: &str, variant: Variant, extra: &[&str]) -> PathBuf {
    let root = repo_root();
    let source = root.join("tests/targets").join(src);
    let stem = Path::new(src).file_stem().unwrap().to_str().unwrap();
    let tag = if extra.is_empty() {
        variant.name()
    } else {
        format!(
            "{}-{}",
            variant.name(),
            extra.join("").replace(['-', '='], "")
        )
    };
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("targets")
        .join(&tag);
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join(stem);
    compile_once(&source, &out, variant, extra, &tag);
    out
}

/// The weft binary under test, with the agent library built beside it (a plain
/// `cargo test` does not build the agent's cdylib; do it once per test binary).
pub fn weft_bin() -> PathBuf {
    static AGENT: std::sync::Once = std::sync::Once::new();
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_weft"));
    AGENT.call_once(|| {
        let dir = bin.parent().unwrap();
        // Always (a no-op when it is up to date): an agent left from an older build
        // would speak another protocol version.
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let mut cmd = Command::new(cargo);
        cmd.args(["build", "-p", "weft-agent"])
            .current_dir(repo_root());
        if dir.file_name().is_some_and(|n| n == "release") {
            cmd.arg("--release");
        }
        // target/<profile>/weft → target dir is two levels up.
        cmd.env("CARGO_TARGET_DIR", dir.parent().unwrap());
        let st = cmd.status().expect("running cargo to build the agent");
        assert!(st.success(), "building libweft_agent.so failed");
    });
    bin
}

/// The `name=value name=value ...` line a target prints (the first whose first
/// name is `first`), as a map.
pub fn key_values(stdout: &str, first: &str) -> std::collections::BTreeMap<String, i64> {
    let line = stdout
        .lines()
        .find(|l| l.starts_with(&format!("{first}=")))
        .unwrap_or_else(|| panic!("no `{first}=...` line from the target:\n{stdout}"));
    line.split_whitespace()
        .map(|kv| {
            let (k, v) = kv.split_once('=').unwrap();
            (k.to_string(), v.parse().unwrap())
        })
        .collect()
}

/// Run weft with `env` to completion, its target's stdin given `input` (targets
/// wait for a line there, so they start once the probes are in).
pub fn weft_with_input(
    args: &[&str],
    env: &[(&str, &str)],
    input: &[u8],
    timeout: Duration,
) -> Output {
    use std::io::Write;
    let mut child = Command::new(weft_bin())
        .args(args)
        .envs(env.iter().copied())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting weft");
    child.stdin.take().unwrap().write_all(input).unwrap();
    wait_output(child, timeout)
}

/// Run weft to completion (with a timeout that kills it).
pub fn weft(args: &[&str], timeout: Duration) -> Output {
    let child = Command::new(weft_bin())
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting weft");
    wait_output(child, timeout)
}

pub fn wait_output(mut child: Child, timeout: Duration) -> Output {
    let mut out = child.stdout.take().unwrap();
    let mut err = child.stderr.take().unwrap();
    let t_out = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = out.read_to_end(&mut v);
        v
    });
    let t_err = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = err.read_to_end(&mut v);
        v
    });
    let start = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if start.elapsed() > timeout {
            let _ = child.kill();
            let _ = child.wait();
            let err = t_err.join().unwrap();
            panic!(
                "weft timed out after {timeout:?}; stderr:\n{}",
                String::from_utf8_lossy(&err)
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    Output {
        status,
        stdout: t_out.join().unwrap(),
        stderr: t_err.join().unwrap(),
    }
}

pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// The value printed for `name` (`@c: 12` → 12), if any.
pub fn map_value(stdout: &str, name: &str) -> Option<i64> {
    let prefix = format!("{name}: ");
    stdout
        .lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .map(|v| v.trim().parse().unwrap())
}

/// The `@name[key]: value` lines of one map, by key as printed.
pub fn keyed(stdout: &str, name: &str) -> std::collections::BTreeMap<String, i64> {
    let prefix = format!("{name}[");
    stdout
        .lines()
        .filter_map(|l| l.strip_prefix(&prefix))
        .filter_map(|l| l.split_once("]: "))
        .map(|(k, v)| (k.to_string(), v.trim().parse().unwrap()))
        .collect()
}

/// `tests/targets/tp.c` (system calls, requests, renames, races for the
/// kernel-probe and sequence tests), built once.
pub fn tp() -> String {
    build("tp.c", Variant::O2_PIE, &[])
        .to_str()
        .unwrap()
        .to_string()
}

/// Require a successful run and return its stdout.
pub fn ok(o: &Output) -> String {
    assert!(
        o.status.success(),
        "weft failed ({}):\nstdout:\n{}\nstderr:\n{}",
        o.status,
        text(&o.stdout),
        text(&o.stderr)
    );
    text(&o.stdout)
}

/// A target started directly (for attach tests), with its stdout readable.
pub struct Spawned {
    pub child: Child,
    pub lines: std::sync::mpsc::Receiver<String>,
}

impl Spawned {
    pub fn start(bin: &Path, args: &[&str]) -> Spawned {
        Spawned::start_with(bin, args, Stdio::inherit())
    }

    /// [`Spawned::start`] with its stdin a pipe (`child.stdin`) the test writes to.
    pub fn start_piped(bin: &Path, args: &[&str]) -> Spawned {
        Spawned::start_with(bin, args, Stdio::piped())
    }

    fn start_with(bin: &Path, args: &[&str], stdin: Stdio) -> Spawned {
        let mut child = Command::new(bin)
            .args(args)
            .stdin(stdin)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let out = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Spawned { child, lines: rx }
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    pub fn wait_line(&self, want: &str, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Ok(l) = self.lines.recv_timeout(Duration::from_millis(50)) {
                if l.contains(want) {
                    return;
                }
                assert!(!l.contains("CORRUPT"), "target reported: {l}");
            }
        }
        panic!("target did not print {want:?}");
    }

    /// Assert the target is still running and never reported a wrong result.
    pub fn assert_healthy(&mut self) {
        while let Ok(l) = self.lines.try_recv() {
            assert!(!l.contains("CORRUPT"), "target reported: {l}");
        }
        assert!(self.child.try_wait().unwrap().is_none(), "target exited");
    }
}

impl Drop for Spawned {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Compare every executable mapping of `bin` in `pid` with the file's bytes.
pub fn code_matches_file(pid: i32, bin: &Path) -> bool {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    let bin = bin.canonicalize().unwrap();
    let file = std::fs::read(&bin).unwrap();
    let mut mem = std::fs::File::open(format!("/proc/{pid}/mem")).unwrap();
    let mut checked = 0;
    for l in maps.lines() {
        let f: Vec<&str> = l.split_whitespace().collect();
        if f.len() < 6 || !f[1].contains('x') || Path::new(f[5]) != bin {
            continue;
        }
        let (a, b) = f[0].split_once('-').unwrap();
        let (a, b) = (
            u64::from_str_radix(a, 16).unwrap(),
            u64::from_str_radix(b, 16).unwrap(),
        );
        let off = u64::from_str_radix(f[2], 16).unwrap() as usize;
        let len = ((b - a) as usize).min(file.len() - off);
        let mut live = vec![0u8; len];
        use std::io::{Seek, SeekFrom};
        mem.seek(SeekFrom::Start(a)).unwrap();
        mem.read_exact(&mut live).unwrap();
        if live != file[off..off + len] {
            return false;
        }
        checked += 1;
    }
    assert!(
        checked > 0,
        "no executable mapping of {} in {pid}",
        bin.display()
    );
    true
}

// ---------------------------------------------------------------------------------
// Added for the stress suite (`tests/stress.rs`, `tests/stress_known.rs`).
// ---------------------------------------------------------------------------------

/// Build `<dir>/<src>` (a path relative to the repository root, e.g. `tests/stress`)
/// with `variant` and `extra` flags; cached by name, like [`build`].
pub fn build_in(dir: &str, src: &str, variant: Variant, extra: &[&str]) -> PathBuf {
    let root = repo_root();
    let source = root.join(dir).join(src);
    let stem = Path::new(src).file_stem().unwrap().to_str().unwrap();
    let tag = format!(
        "{}-{}{}",
        dir.replace('/', "_"),
        variant.name(),
        extra.join("").replace(['-', '=', ',', '/'], "")
    );
    let out_dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("targets")
        .join(&tag);
    std::fs::create_dir_all(&out_dir).unwrap();
    let out = out_dir.join(stem);
    compile_once(&source, &out, variant, extra, &tag);
    out
}

/// Compiles `source` to `out` unless `out` is newer. Tests run in threads of one
/// process (and suites in several processes) and two of them may want the same
/// target at once: a lock per output (`flock`, which also excludes two opens in
/// one process) makes the second wait for the first and reuse its file. Replacing
/// a file a running target maps left that target's program "(deleted)", and a
/// compiler writing it while the other starts it made "Text file busy".
fn compile_once(source: &Path, out: &Path, variant: Variant, extra: &[&str], tag: &str) {
    let name = source.file_name().unwrap().to_str().unwrap();
    let lock = std::fs::File::create(out.with_file_name(format!(".{name}.lock"))).unwrap();
    lock.lock().unwrap();
    let src_time = std::fs::metadata(source).unwrap().modified().unwrap();
    if std::fs::metadata(out)
        .and_then(|m| m.modified())
        .is_ok_and(|t| t >= src_time)
    {
        return;
    }
    let tmp = out.with_file_name(format!(".{name}.{}", std::process::id()));
    let o = Command::new(if name.ends_with(".cc") { "g++" } else { "gcc" })
        .args(variant.flags())
        .args(extra)
        .arg("-o")
        .arg(&tmp)
        .arg(source)
        .arg("-lpthread")
        .output()
        .expect("running the compiler");
    assert!(
        o.status.success(),
        "compiling {} ({tag}) failed:\n{}",
        source.display(),
        text(&o.stderr)
    );
    std::fs::rename(&tmp, out).unwrap();
}

/// Like [`code_matches_file`], over every file-backed executable mapping of `pid`
/// (the program, libc, libgcc_s, ...): the paths of those that differ from their
/// file. Mappings whose file cannot be read (deleted, replaced) are skipped.
pub fn modules_differing_from_files(pid: i32) -> Vec<String> {
    use std::io::{Seek, SeekFrom};
    let Ok(maps) = std::fs::read_to_string(format!("/proc/{pid}/maps")) else {
        return vec![format!("/proc/{pid}/maps unreadable")];
    };
    let Ok(mut mem) = std::fs::File::open(format!("/proc/{pid}/mem")) else {
        return vec![format!("/proc/{pid}/mem unreadable")];
    };
    let mut bad = Vec::new();
    for l in maps.lines() {
        let f: Vec<&str> = l.split_whitespace().collect();
        if f.len() < 6 || !f[1].contains('x') || !f[5].starts_with('/') {
            continue;
        }
        let Ok(file) = std::fs::read(f[5]) else {
            continue;
        };
        let (a, b) = f[0].split_once('-').unwrap();
        let (a, b) = (
            u64::from_str_radix(a, 16).unwrap(),
            u64::from_str_radix(b, 16).unwrap(),
        );
        let off = u64::from_str_radix(f[2], 16).unwrap() as usize;
        if off >= file.len() {
            continue;
        }
        let len = ((b - a) as usize).min(file.len() - off);
        let mut live = vec![0u8; len];
        if mem.seek(SeekFrom::Start(a)).is_err() || mem.read_exact(&mut live).is_err() {
            bad.push(format!("{} (unreadable at {a:#x})", f[5]));
            continue;
        }
        if live != file[off..off + len] {
            let at = live
                .iter()
                .zip(&file[off..off + len])
                .position(|(x, y)| x != y)
                .unwrap();
            bad.push(format!("{} differs at {:#x}", f[5], a + at as u64));
        }
    }
    bad
}

/// A small deterministic random number generator (xorshift64*), seeded from the
/// environment variable `WEFT_STRESS_SEED` or the clock; tests print their seed.
pub struct Rng(pub u64);

impl Rng {
    pub fn from_env() -> Rng {
        let seed = std::env::var("WEFT_STRESS_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap()
                    .as_nanos() as u64
            });
        eprintln!("WEFT_STRESS_SEED={seed}");
        Rng(seed | 1)
    }

    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in `0..n`.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// Checks the output of `tests/targets/libcbusy.c` run with ROUNDS 0 (until SIGUSR1):
/// "rounds R0 R1 ...", then "sum S", where S must be what each thread's rounds make
/// in `mode` (the target's arithmetic, redone here). A heap the attach corrupted
/// shows as a wrong sum (or a dead target).
pub fn check_libcbusy(out: &str, mode: &str) -> Result<Vec<i64>, String> {
    let mut lines = out.lines();
    let rounds: Vec<i64> = lines
        .next()
        .and_then(|l| l.strip_prefix("rounds "))
        .ok_or_else(|| format!("no rounds line in {out:?}"))?
        .split(' ')
        .map(|r| r.parse().map_err(|_| format!("bad rounds in {out:?}")))
        .collect::<Result<_, _>>()?;
    let sum: i64 = lines
        .next()
        .and_then(|l| l.strip_prefix("sum "))
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("no sum line in {out:?}"))?;
    let want: i64 = rounds
        .iter()
        .enumerate()
        .map(|(seed, &n)| {
            let seed = seed as i64;
            match mode {
                "grow" => n * (16384 * seed + 1),
                "fill" => (0..n).map(|r| ((r + seed) & 0xff) + 1).sum(),
                "idle" => n * (seed + 1),
                _ => (0..n)
                    .map(|i| (i & 0xff) + 16 + (i * 7919 + seed) % 4000 + 1)
                    .sum(),
            }
        })
        .sum();
    if sum != want {
        return Err(format!(
            "sum {sum}, want {want} for rounds {rounds:?} ({mode})"
        ));
    }
    Ok(rounds)
}

/// Sends `sig` to `pid` once the process has a handler for it (`SigCgt` in
/// /proc/PID/status), so a target told to stop by a signal is never killed by one
/// that came before its handler.
pub fn signal_when_caught(pid: u32, sig: i32) {
    let caught = || {
        std::fs::read_to_string(format!("/proc/{pid}/status"))
            .ok()
            .and_then(|s| {
                let l = s.lines().find(|l| l.starts_with("SigCgt:"))?;
                u64::from_str_radix(l[7..].trim(), 16).ok()
            })
            .is_some_and(|m| m & (1 << (sig - 1)) != 0)
    };
    let start = std::time::Instant::now();
    while !caught() && start.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(5));
    }
    // SAFETY: kill takes no pointers.
    unsafe { libc::kill(pid as i32, sig) };
}

/// weft run in the background with its stdout and stderr read line by line as they
/// come, so that a test acts once weft has said something (the agent is in, the
/// probes fired) instead of after a sleep.
pub struct Background {
    pub child: Child,
    lines: std::sync::mpsc::Receiver<(bool, String)>,
    stdout: String,
    stderr: String,
}

impl Background {
    pub fn start(args: &[&str]) -> Background {
        Background::start_with_env(args, &[])
    }

    /// [`Background::start`] with more environment variables.
    pub fn start_with_env(args: &[&str], env: &[(&str, &str)]) -> Background {
        let mut cmd = Command::new(weft_bin());
        cmd.args(args).envs(env.iter().copied());
        Background::spawn(cmd)
    }

    /// [`Background::start`] as a shell starts a job: weft leads a process group of
    /// its own, which a launched command joins, so [`Background::signal_group`] is
    /// a terminal's Ctrl-C.
    pub fn start_in_own_group(args: &[&str]) -> Background {
        let mut cmd = Command::new(weft_bin());
        std::os::unix::process::CommandExt::process_group(cmd.args(args), 0);
        Background::spawn(cmd)
    }

    /// `sig` to weft's whole process group (see [`Background::start_in_own_group`]).
    pub fn signal_group(&self, sig: i32) {
        // SAFETY: kill takes no pointers; the group is the one weft leads.
        unsafe { libc::kill(-self.pid(), sig) };
    }

    fn spawn(mut cmd: Command) -> Background {
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("starting weft");
        let (tx, rx) = std::sync::mpsc::channel();
        let out = child.stdout.take().unwrap();
        let err = child.stderr.take().unwrap();
        let tx2 = tx.clone();
        std::thread::spawn(move || {
            for l in BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send((false, l)).is_err() {
                    break;
                }
            }
        });
        std::thread::spawn(move || {
            for l in BufReader::new(err).lines().map_while(Result::ok) {
                if tx2.send((true, l)).is_err() {
                    break;
                }
            }
        });
        Background {
            child,
            lines: rx,
            stdout: String::new(),
            stderr: String::new(),
        }
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    fn take(&mut self, (err, l): (bool, String)) -> (bool, String) {
        let all = if err {
            &mut self.stderr
        } else {
            &mut self.stdout
        };
        all.push_str(&l);
        all.push('\n');
        (err, l)
    }

    /// Waits until weft prints a line containing `want` (on stderr if `on_stderr`);
    /// panics, showing what it printed, if it ends first or `timeout` passes (a
    /// ceiling that only bounds a hang).
    pub fn wait_line(&mut self, want: &str, on_stderr: bool, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(x) => {
                    let (err, l) = self.take(x);
                    if err == on_stderr && l.contains(want) {
                        return;
                    }
                }
                Err(e) => panic!(
                    "weft never printed {want:?} ({e:?}); stdout:\n{}\nstderr:\n{}",
                    self.stdout, self.stderr
                ),
            }
        }
    }

    /// What weft printed on stderr so far (as far as `wait_line` read).
    pub fn stderr_text(&self) -> String {
        self.stderr.clone()
    }

    pub fn signal(&self, sig: i32) {
        // SAFETY: signalling the weft we started (not reaped before `finish`).
        unsafe { libc::kill(self.pid(), sig) };
    }

    /// Waits for weft to end (killing it and panicking after `timeout`); everything it
    /// printed.
    pub fn finish(mut self, timeout: Duration) -> Output {
        let deadline = Instant::now() + timeout;
        let status = loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                break st;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!("weft timed out after {timeout:?}; stderr:\n{}", self.stderr);
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        // The readers end at EOF, once weft and anything holding its pipes are gone.
        while let Ok(x) = self
            .lines
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
        {
            self.take(x);
        }
        Output {
            status,
            stdout: std::mem::take(&mut self.stdout).into_bytes(),
            stderr: std::mem::take(&mut self.stderr).into_bytes(),
        }
    }
}

/// A clause to add to a program whose probes count `@c`: weft prints `live` once the
/// probes have fired, a state a test can wait for (`Background::wait_line`).
pub const LIVE: &str = "interval:ms:10 /@c > 0 && @live == 0/ { @live = 1; printf(\"live\\n\"); }";

/// Waits until `pid`'s code (the executable's mappings) matches `bin` again, for at
/// most `timeout` (a ceiling that only bounds a hang); whether it did.
pub fn code_restored_within(pid: i32, bin: &Path, timeout: Duration) -> bool {
    let start = Instant::now();
    loop {
        if code_matches_file(pid, bin) {
            return true;
        }
        if start.elapsed() > timeout {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}
