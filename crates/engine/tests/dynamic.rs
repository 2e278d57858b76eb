//! Weaving and unweaving while a session runs, through the engine's API, into a
//! real 8-thread C target that checks every result it computes.

use std::io::{BufRead, BufReader, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

use weft_engine::{Options, Session, Weaving};
use weft_trace::{Context, MapSnapshot, Record, Sink};

const T: Duration = Duration::from_secs(60);

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// `tests/stress/hammer.c`, built once per test binary (tests run in parallel: one
/// rebuilding the file while another's target runs it would change it under that
/// test).
fn hammer() -> PathBuf {
    static BUILT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BUILT.get_or_init(build_hammer).clone()
}

fn build_hammer() -> PathBuf {
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join("engine-hammer");
    let src = repo().join("tests/stress/hammer.c");
    let st = Command::new("gcc")
        .args(["-O2", "-pthread", "-o"])
        .arg(&out)
        .arg(&src)
        .arg("-I")
        .arg(repo().join("tests/stress"))
        .status()
        .expect("gcc");
    assert!(st.success(), "building {}", src.display());
    out
}

struct Target {
    child: Child,
    lines: Receiver<String>,
    last_progress: i64,
}

impl Target {
    fn start(bin: &Path, threads: &str) -> Target {
        let mut child = Command::new(bin)
            .arg(threads)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let out = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for l in BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        let t = Target {
            child,
            lines: rx,
            last_progress: 0,
        };
        assert_eq!(t.lines.recv_timeout(T).unwrap(), "ready");
        t
    }

    fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// Healthy: running, no wrong result reported. Returns the latest progress.
    fn healthy(&mut self) -> i64 {
        while let Ok(l) = self.lines.try_recv() {
            assert!(!l.contains("CORRUPT"), "target reported: {l}");
            if let Some(n) = l.strip_prefix("progress ") {
                self.last_progress = n.trim().parse().unwrap();
            }
        }
        assert!(
            self.child.try_wait().unwrap().is_none(),
            "the target exited"
        );
        self.last_progress
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The executable's code in the process equals its file, byte for byte.
fn code_matches_file(pid: i32, bin: &Path) -> bool {
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
        let a = u64::from_str_radix(a, 16).unwrap();
        let b = u64::from_str_radix(b, 16).unwrap();
        let off = usize::from_str_radix(f[2], 16).unwrap();
        let len = ((b - a) as usize).min(file.len() - off);
        let mut live = vec![0u8; len];
        mem.seek(SeekFrom::Start(a)).unwrap();
        mem.read_exact(&mut live).unwrap();
        if live != file[off..off + len] {
            return false;
        }
        checked += 1;
    }
    assert!(checked > 0, "no executable mapping of {}", bin.display());
    true
}

/// Records nothing (the test reads maps itself).
struct Quiet;

impl Sink for Quiet {
    fn record(&mut self, _: &Record, _: &Context<'_>) {}
    fn finish(&mut self, _: &[MapSnapshot], _: &Context<'_>) {}
}

fn count(s: &Session<'_>, map: u32) -> u64 {
    s.snapshot(map)
        .entries
        .first()
        .map_or(0, |(_, v)| u64::from_le_bytes(v[..8].try_into().unwrap()))
}

fn compile(text: &str) -> weft_ir::Program {
    let out = weft_lang::compile(text, "-e", &weft_lang::Options::default());
    assert!(out.diagnostics.is_empty(), "{:?}", out.diagnostics);
    out.program.unwrap()
}

/// Waits until `f` holds (a ceiling, not a deadline).
fn until(what: &str, mut f: impl FnMut() -> bool) {
    let start = Instant::now();
    while !f() {
        assert!(start.elapsed() < T, "{what} within {T:?}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn weave_and_unweave_a_thousand_times_in_one_session() {
    let bin = hammer();
    let b = bin.display();
    let mut t = Target::start(&bin, "8");
    // Probe 0: entry and return of a jump site, an int3 site and a recursive one.
    let prog = compile(&format!(
        "uprobe:{b}:hot_jump,uprobe:{b}:hot_int3,uprobe:{b}:hot_rec {{ @c = count(); }} \
         uretprobe:{b}:hot_jump,uretprobe:{b}:hot_rec {{ @r = count(); }}"
    ));
    let mut s = Session::new(&prog, Options::default(), true).unwrap();
    s.attach(t.pid()).unwrap();
    // Nothing woven at the start; the probes come in while the session runs.
    s.prepare_probes(&[]).unwrap();
    s.go().unwrap();
    assert!(code_matches_file(t.pid(), &bin));
    let mut sink = Quiet;
    let all: Vec<usize> = (0..prog.probes.len()).collect();
    // One weave: take its sites out and put them back, 1,000 times.
    let mut initial = s.weave(&all).unwrap();
    // hot_jump, hot_int3 and hot_rec, and the return sites of hot_jump and hot_rec
    // (their `ret`s: one and two), whose return probes do not hijack (the unwinder
    // hooks are not the weave's).
    let sites = initial.site_count();
    assert_eq!(sites, 6);
    let mut stops = 0;
    for cycle in 0..1000 {
        let before = count(&s, 0);
        until("hits while woven", || count(&s, 0) > before);
        s.unweave(&mut initial).unwrap();
        assert!(
            code_matches_file(t.pid(), &bin),
            "cycle {cycle}: code restored"
        );
        t.healthy();
        stops += s.reweave(&mut initial).unwrap();
    }
    // Jump sites (several instructions displaced) need a stop to go back in.
    assert!(stops >= 1000, "{stops} stops");
    s.unweave(&mut initial).unwrap();
    // And fresh weaves: new sites each time (at the same addresses), patched with
    // one stop per process.
    for cycle in 0..20 {
        let mut fresh = s.weave(&all).unwrap();
        assert_eq!(fresh.site_count(), sites, "cycle {cycle}");
        let before = count(&s, 0);
        until("hits while woven again", || count(&s, 0) > before);
        s.unweave(&mut fresh).unwrap();
        assert!(code_matches_file(t.pid(), &bin), "fresh cycle {cycle}");
    }
    assert!(code_matches_file(t.pid(), &bin));
    // Nothing counts while nothing is woven. A thread the unweave stopped inside
    // advice finishes that hit when it next runs, which a busy machine can delay:
    // the count settles across two progress reports, then stays.
    let mut at = count(&s, 0);
    let start = Instant::now();
    loop {
        let progress = t.healthy();
        until("progress", || t.healthy() > progress + 1);
        let now = count(&s, 0);
        if now == at {
            break;
        }
        assert!(start.elapsed() < T, "hits keep coming while unwoven");
        at = now;
    }
    let progress = t.healthy();
    until("progress", || t.healthy() > progress + 1);
    assert_eq!(count(&s, 0), at, "hits while unwoven");
    s.finish(&mut sink).unwrap();
    assert!(code_matches_file(t.pid(), &bin));
    let p = t.healthy();
    until("progress after the session", || t.healthy() > p);
}

/// Call sites come and go while 8 threads run through them, checking every result:
/// a call site's rewrite is one instruction, so the agent unweaves and reweaves it
/// with the process running (int3 first), never a stop.
#[test]
fn call_sites_unweave_and_reweave_while_threads_run_through_them() {
    let bin = hammer();
    let b = bin.display();
    let mut t = Target::start(&bin, "8");
    // The workers' calls of hot_jump and hot_rec, and hot_rec's call of itself.
    let prog = compile(&format!(
        "call:{b}:hot_jump,call:{b}:hot_rec {{ @c = count(); }}"
    ));
    let mut s = Session::new(&prog, Options::default(), true).unwrap();
    s.attach(t.pid()).unwrap();
    s.prepare_probes(&[]).unwrap();
    s.go().unwrap();
    let mut w = s.weave(&[0]).unwrap();
    assert!(w.call_sites >= 3, "{} call sites", w.call_sites);
    assert_eq!(w.site_count(), w.call_sites);
    assert!(!code_matches_file(t.pid(), &bin));
    let mut stops = 0;
    for cycle in 0..300 {
        let before = count(&s, 0);
        until("hits while woven", || count(&s, 0) > before);
        s.unweave(&mut w).unwrap();
        assert!(code_matches_file(t.pid(), &bin), "cycle {cycle}");
        t.healthy();
        stops += s.reweave(&mut w).unwrap();
    }
    assert_eq!(
        stops, 0,
        "a call site went back in with the process stopped"
    );
    s.finish(&mut Quiet).unwrap();
    assert!(code_matches_file(t.pid(), &bin));
    let p = t.healthy();
    until("progress after the session", || t.healthy() > p);
}

/// A probe woven later whose patch would start on a call site woven before is
/// refused, and says why; the call site stays woven, and both go away cleanly.
/// (At -O2 `eta` is `endbr64; jmp work`: a uprobe on eta patches that very jump.)
#[test]
fn a_later_probe_on_a_woven_call_is_refused() {
    let bin = Path::new(env!("CARGO_TARGET_TMPDIR")).join("engine-callsite");
    let st = Command::new("gcc")
        .args(["-O2", "-fcf-protection=full", "-fPIE", "-pie", "-o"])
        .arg(&bin)
        .arg(repo().join("tests/targets/callsite.c"))
        .status()
        .expect("gcc");
    assert!(st.success());
    let b = bin.display();
    let mut child = Command::new(&bin)
        .arg("wait")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert_eq!(line, "ready\n");
    let pid = child.id() as i32;
    let prog = compile(&format!(
        "call:{b}:work within eta {{ @c = count(); }} uprobe:{b}:eta {{ @e = count(); }}"
    ));
    let mut s = Session::new(&prog, Options::default(), true).unwrap();
    s.attach(pid).unwrap();
    s.prepare_probes(&[]).unwrap();
    s.go().unwrap();
    let mut calls = s.weave(&[0]).unwrap();
    assert_eq!(calls.call_sites, 1);
    let mut later = s.weave(&[1]).unwrap();
    let eta = s.members[0]
        .planned
        .iter()
        .find(|p| p.label == format!("uprobe:{b}:eta"))
        .expect("the uprobe was planned");
    match &eta.outcome {
        weft_engine::weave::Outcome::Skipped(why) => assert!(
            why.contains(&format!("the call site call:{b}:work in eta at ")),
            "{why}"
        ),
        other => panic!("uprobe:eta woven over the call site: {other}"),
    }
    s.unweave(&mut later).unwrap();
    s.unweave(&mut calls).unwrap();
    assert!(code_matches_file(pid, &bin));
    s.finish(&mut Quiet).unwrap();
    assert!(code_matches_file(pid, &bin));
    let _ = child.kill();
    let _ = child.wait();
}

/// `Session::functions` splits the sites `prepare` wove by function: one function
/// goes out and comes back while 8 threads run through both, the other stays
/// woven. Without return sites the return probes run exactly for the calls whose
/// entry ran (the hijack): entries and returns differ by at most the frames open
/// at the end, however often a function went out with calls open.
#[test]
fn one_function_unweaves_and_reweaves_alone() {
    let bin = hammer();
    let b = bin.display();
    let mut t = Target::start(&bin, "8");
    let prog = compile(&format!(
        "uprobe:{b}:hot_jump {{ @j = count(); }} uretprobe:{b}:hot_jump {{ @jr = count(); }} \
         uprobe:{b}:hot_rec {{ @r = count(); }} uretprobe:{b}:hot_rec {{ @rr = count(); }}"
    ));
    let opts = Options {
        return_sites: false,
        ..Options::default()
    };
    let mut s = Session::new(&prog, opts, true).unwrap();
    s.attach(t.pid()).unwrap();
    s.prepare().unwrap();
    s.go().unwrap();
    let mut fns = s.functions();
    assert_eq!(fns.len(), 2, "{fns:?}");
    // One site each: the entry (its return probe hijacks).
    assert!(fns.iter().all(|(_, w)| w.site_count() == 1 && w.woven));
    let id = |name: &str| prog.maps.iter().position(|m| m.name == name).unwrap() as u32;
    let (j, jr, r, rr) = (id("@j"), id("@jr"), id("@r"), id("@rr"));
    // Which is hot_rec: the functions come sorted by address, as in the file.
    let nm = Command::new("nm").arg(&bin).output().unwrap();
    let addr = |f: &str| {
        let out = String::from_utf8_lossy(&nm.stdout);
        let l = out.lines().find(|l| l.ends_with(&format!(" {f}"))).unwrap();
        u64::from_str_radix(l.split_whitespace().next().unwrap(), 16).unwrap()
    };
    let k = usize::from(addr("hot_rec") > addr("hot_jump"));
    for cycle in 0..200 {
        let w = &mut fns[k].1;
        s.unweave(w).unwrap();
        let (a, jb) = (count(&s, r), count(&s, j));
        until("hot_jump hits while hot_rec is out", || {
            count(&s, j) > jb + 100
        });
        // A thread already inside the trampoline when the bytes went back may
        // still count (one per thread).
        let n = count(&s, r);
        assert!(
            n <= a + 8,
            "cycle {cycle}: hot_rec hit while unwoven ({a} -> {n})"
        );
        t.healthy();
        s.reweave(w).unwrap();
        let a = count(&s, r);
        until("hot_rec hits again", || count(&s, r) > a);
    }
    // Both out together, then back together (one stop per process).
    let mut both = Weaving::union(fns.iter().map(|(_, w)| w));
    assert_eq!(both.site_count(), 2);
    s.unweave(&mut both).unwrap();
    assert!(code_matches_file(t.pid(), &bin));
    assert_eq!(s.reweave(&mut both).unwrap(), 1);
    let a = count(&s, j);
    until("hot_jump hits after the union's reweave", || {
        count(&s, j) > a
    });
    // Both out: no entry runs, and every hijacked frame still returns through
    // the return advice. Once the counts settle, returns equal entries exactly.
    s.unweave(&mut both).unwrap();
    let settled = |s: &Session<'_>| {
        let (jr0, rr0) = (count(s, jr), count(s, rr));
        (count(s, j), count(s, r)) == (jr0, rr0)
    };
    until("every return of a call whose entry ran", || settled(&s));
    let (ej, er) = (count(&s, j), count(&s, r));
    assert!(ej > 0 && er > 0);
    s.finish(&mut Quiet).unwrap();
    assert!(code_matches_file(t.pid(), &bin));
    let p = t.healthy();
    until("progress after the session", || t.healthy() > p);
}
