//! What a new user meets in the first hour: a target left exactly as it was, the
//! way sessions end, listing probes, and messages.

mod common;

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::Receiver;
use std::time::Duration;

use common::*;

const T: Duration = Duration::from_secs(60);

/// `fdtable`, driven line by line through its stdin.
struct Driven {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
}

impl Driven {
    fn start(bin: &std::path::Path) -> Driven {
        let mut child = Command::new(bin)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take();
        let out = child.stdout.take().unwrap();
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for l in BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        Driven {
            child,
            stdin,
            lines,
        }
    }

    fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// Sends `cmd` and returns the line it answers.
    fn ask(&mut self, cmd: &str) -> String {
        writeln!(self.stdin.as_mut().unwrap(), "{cmd}").unwrap();
        self.next()
    }

    fn next(&self) -> String {
        self.lines.recv_timeout(T).expect("the target answered")
    }
}

impl Drop for Driven {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `pid`'s descriptors: number and what each one is.
fn fd_table(pid: i32) -> BTreeSet<(i32, String)> {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            let n: i32 = e.file_name().to_str().unwrap().parse().unwrap();
            let what = std::fs::read_link(e.path())
                .map(|p| p.display().to_string())
                .unwrap_or_default();
            // Pipes and sockets are named by inode: the same object keeps its name.
            (n, what)
        })
        .collect()
}

fn threads(pid: i32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .count()
}

/// `pid`'s mappings, by what backs them (a path, a pseudo-name or nothing), with
/// their addresses.
fn mappings(pid: i32) -> BTreeSet<String> {
    std::fs::read_to_string(format!("/proc/{pid}/maps"))
        .unwrap()
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            format!(
                "{} {}",
                f[0],
                f.get(5..).map(|r| r.join(" ")).unwrap_or_default()
            )
        })
        .collect()
}

/// The lowest descriptor the agent may hold: 64 below the lower of the process's
/// soft `RLIMIT_NOFILE` and 1024.
fn agent_floor(pid: i32) -> i32 {
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let soft = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .and_then(|l| l.split_whitespace().nth(3))
        .and_then(|s| s.parse::<i64>().ok())
        .unwrap();
    (soft.min(1024) - 64) as i32
}

/// A launched program's first `open` gets descriptor 3, as without weft: the
/// agent's descriptors sit at the top of the range.
#[test]
fn a_launched_program_opens_descriptor_3_first() {
    let bin = build("fdtable.c", Variant::O2_PIE, &[]);
    let b = bin.to_str().unwrap();
    let mut w = Command::new(weft_bin())
        .args([
            "-e",
            &format!("uprobe:{b}:step {{ @c = count(); }}"),
            "-c",
            b,
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    w.stdin
        .take()
        .unwrap()
        .write_all(b"call 7\nopen\n")
        .unwrap();
    let o = wait_output(w, T);
    let out = ok(&o);
    assert!(out.contains("first=3\ncalled 7\nfd=3\n"), "{out}");
    assert_eq!(map_value(&out, "@c"), Some(7), "{out}");
}

/// Attached and detached, three times: the target's descriptor table is what it
/// was, its first free descriptor stays the lowest during the session, and no
/// mapping or thread of a session remains. Each session counts exactly, on the
/// main thread and on a second one that hit the probe in every session before
/// (its state was given back with the agent's thread pool at the end of each, and
/// taken anew at its first hit).
#[test]
fn an_attach_leaves_descriptors_and_mappings_as_they_were() {
    let bin = build("fdtable.c", Variant::O2_PIE, &[]);
    let b = bin.to_str().unwrap();
    let mut t = Driven::start(&bin);
    assert_eq!(t.next(), "first=3");
    for round in 0..3 {
        let (fds, tasks, maps) = (fd_table(t.pid()), threads(t.pid()), mappings(t.pid()));
        let prog = format!("uprobe:{b}:step {{ @c = count(); @t[tid] = count(); }}");
        let mut w = Background::start(&["-e", &prog, "-p", &t.pid().to_string()]);
        w.wait_line("Attached", true, T);
        while code_matches_file(t.pid(), &bin) {
            std::thread::sleep(Duration::from_millis(5));
        }
        // During the session: the program's next descriptor is still its lowest
        // free one, and every descriptor the agent added is at the top.
        assert_eq!(t.ask("open"), "fd=3");
        let floor = agent_floor(t.pid());
        let during = fd_table(t.pid());
        let added: Vec<_> = during.difference(&fds).collect();
        assert!(!added.is_empty(), "the agent holds its socket");
        for (n, what) in &added {
            assert!(*n >= floor, "agent descriptor {n} ({what}) below {floor}");
        }
        assert_eq!(t.ask("call 11"), "called 11");
        assert_eq!(t.ask("tcall 7"), "tcalled 7");
        w.signal(libc::SIGINT);
        let o = w.finish(T);
        let out = ok(&o);
        assert_eq!(map_value(&out, "@c"), Some(18), "round {round}: {out}");
        let mut per_thread: Vec<i64> = keyed(&out, "@t").into_values().collect();
        per_thread.sort();
        assert_eq!(per_thread, [7, 11], "round {round}: {out}");
        assert!(code_matches_file(t.pid(), &bin));
        // The agent's control thread, descriptors and memory are released
        // asynchronously of the target: wait for the table and the threads to
        // settle, bounded (the thread ends once it has given back what it holds).
        let start = std::time::Instant::now();
        while (fd_table(t.pid()) != fds || threads(t.pid()) != tasks) && start.elapsed() < T {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(fd_table(t.pid()), fds, "round {round}");
        assert_eq!(threads(t.pid()), tasks, "round {round}: a thread was left");
        // The first session leaves the agent's library loaded (with what it links:
        // the README says so) and the C library's cached stack of its thread, but
        // no thread; no session leaves anything of its own, so the later ones
        // leave the process exactly as the first left it.
        let after = mappings(t.pid());
        if round > 0 {
            let new: Vec<_> = after.difference(&maps).collect();
            assert!(new.is_empty(), "round {round}: mappings left: {new:?}");
        } else {
            first_session_leaves_only_the_agent(&maps, &after);
        }
        // (Anonymous mappings may merge with the agent's new neighbours.)
        let gone: Vec<_> = maps
            .difference(&after)
            .filter(|m| !m.ends_with(' '))
            .collect();
        assert!(gone.is_empty(), "round {round}: mappings lost: {gone:?}");
        assert_eq!(t.ask("open"), "fd=3");
    }
    t.stdin.take();
    assert!(t.child.wait().unwrap().success());
}

/// A mapping of `/proc/PID/maps` as [`mappings`] writes it: start, end, backing.
fn parse_mapping(m: &str) -> (u64, u64, String) {
    let (range, what) = m.split_once(' ').unwrap();
    let (a, b) = range.split_once('-').unwrap();
    (
        u64::from_str_radix(a, 16).unwrap(),
        u64::from_str_radix(b, 16).unwrap(),
        what.to_string(),
    )
}

/// Bytes of `[a, b)` that no range of `cover` covers.
fn uncovered(a: u64, b: u64, cover: &[(u64, u64)]) -> u64 {
    let mut left = b - a;
    for &(c, d) in cover {
        let (lo, hi) = (a.max(c), b.min(d));
        if lo < hi {
            left -= hi - lo;
        }
    }
    left
}

/// What the first `-p` session leaves, exactly (the README's list): the agent's
/// library and `libgcc_s` it links, and anonymous memory of these sizes, no more:
/// the agent's `.bss` (right after its last file mapping) and the control thread's
/// 256 KiB stack and guard page (kept in the C library's stack cache, for the
/// program's next thread). The agent's thread table and shadow stacks, and its
/// heap, were given back when the session ended; no malloc arena was made (the
/// agent never calls the target's `malloc`). Anonymous mappings may merge with
/// neighbours, so new anonymous bytes are counted, not mappings.
fn first_session_leaves_only_the_agent(before: &BTreeSet<String>, after: &BTreeSet<String>) {
    const KIB: u64 = 1024;
    let before: Vec<_> = before.iter().map(|m| parse_mapping(m)).collect();
    let after: Vec<_> = after.iter().map(|m| parse_mapping(m)).collect();
    let had_gcc = before.iter().any(|(_, _, w)| w.ends_with("/libgcc_s.so.1"));
    let old: Vec<(u64, u64)> = before.iter().map(|&(a, b, _)| (a, b)).collect();
    let mut anon = 0;
    let mut files = Vec::new();
    for (a, b, what) in &after {
        let new = uncovered(*a, *b, &old);
        if new == 0 {
            continue;
        }
        if what.is_empty() {
            anon += new;
        } else {
            files.push(what.clone());
        }
    }
    for f in &files {
        let agent = f.ends_with("/libweft_agent.so");
        let gcc = f.ends_with("/libgcc_s.so.1") && !had_gcc;
        assert!(agent || gcc, "a file mapping left: {f} ({files:?})");
    }
    assert!(files.iter().any(|f| f.ends_with("/libweft_agent.so")));
    let agent_end = after
        .iter()
        .filter(|(_, _, w)| w.ends_with("/libweft_agent.so"))
        .map(|&(_, b, _)| b)
        .max()
        .unwrap();
    // Its new bytes only: an anonymous mapping that was there before and lies
    // right after it merges with it (a CI run met 3 such pages).
    let bss = after
        .iter()
        .find(|&&(a, _, ref w)| a == agent_end && w.is_empty())
        .map_or(0, |&(a, b, _)| uncovered(a, b, &old));
    let control_stack = 256 * KIB + 4 * KIB;
    assert!(bss > 0 && bss < 1024 * KIB, "agent .bss {bss}");
    assert_eq!(
        anon,
        bss + control_stack,
        "new anonymous bytes: .bss {bss} + stack {control_stack} expected"
    );
}

/// Processes running `bin` (an executable no other test runs).
fn running(bin: &std::path::Path) -> Vec<i32> {
    let bin = bin.canonicalize().unwrap();
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| std::fs::read_link(format!("/proc/{pid}/exe")).is_ok_and(|e| e == bin))
        .collect()
}

/// SIGINT or SIGTERM to weft while `-c` runs a command that would run forever:
/// weft prints the maps, unweaves and ends, and ends the command as bpftrace does
/// (SIGTERM; SIGKILL a second later for one that ignores it). A second signal
/// while weft ends changes nothing.
#[test]
fn a_signal_ends_a_launched_session_and_its_command() {
    for (sig, flags, twice) in [
        (libc::SIGINT, "-DEND_BY_INT", false),
        (libc::SIGTERM, "-DEND_BY_TERM", true),
        (libc::SIGINT, "-DIGNORE_TERM", true),
    ] {
        let bin = build("spinner.c", Variant::O2_PIE, &[flags]);
        let b = bin.to_str().unwrap();
        let prog = format!("uprobe:{b}:tick {{ @c = count(); }} {LIVE}");
        let mut w = Background::start(&["-e", &prog, "-c", b]);
        w.wait_line("live", false, T);
        assert_eq!(running(&bin).len(), 1, "{flags}");
        w.signal(sig);
        if twice {
            w.signal(sig);
        }
        let o = w.finish(T);
        let out = ok(&o);
        assert!(map_value(&out, "@c").unwrap() > 0, "{flags}: {out}");
        assert_eq!(
            running(&bin),
            Vec::<i32>::new(),
            "{flags}: command left running"
        );
    }
}

/// Ctrl-C in a terminal: SIGINT reaches weft and the command it launched (one
/// process group), so the command may be gone before weft unweaves it. As
/// bpftrace: the maps are printed, weft exits 0 and says nothing of the command's
/// end (it once said "process N is a zombie", or "exited during the operation" and
/// "No child processes", and exited 1).
#[test]
fn ctrl_c_ends_weft_and_its_command_quietly() {
    let bin = build("spinner.c", Variant::O2_PIE, &[]);
    let b = bin.to_str().unwrap();
    let prog = format!("uprobe:{b}:tick {{ @c = count(); }} {LIVE}");
    for round in 0..3 {
        let mut w = Background::start_in_own_group(&["-e", &prog, "-c", b]);
        w.wait_line("live", false, T);
        w.signal_group(libc::SIGINT);
        let o = w.finish(T);
        let err = text(&o.stderr);
        assert_eq!(o.status.code(), Some(0), "round {round}: {err}");
        assert_eq!(err, "Attached 2 probes\n", "round {round}");
        assert!(map_value(&text(&o.stdout), "@c").unwrap() > 0);
        assert_eq!(running(&bin), Vec::<i32>::new(), "round {round}");
    }
}

/// A launched command that crashes on its own: weft's status stays 0 (as
/// bpftrace's), but it says which signal ended the command, and the maps hold
/// every call made before.
#[test]
fn a_command_killed_by_a_signal_is_said() {
    // spinner.c built to end itself after N ticks: `@c` and weft's stderr.
    let run = |flag: &str| {
        let bin = build("spinner.c", Variant::O2_PIE, &[flag]);
        let b = bin.to_str().unwrap();
        let prog = format!("uprobe:{b}:tick {{ @c = count(); }}");
        let o = weft(&["trace", "-e", &prog, "-c", b], T);
        (map_value(&ok(&o), "@c"), text(&o.stderr))
    };
    let (c, err) = run("-DCRASH_AFTER=5000");
    assert_eq!(c, Some(5000), "{err}");
    let said: Vec<&str> = err
        .lines()
        .filter(|l| l.contains("was killed by"))
        .collect();
    assert_eq!(said.len(), 1, "{err}");
    assert!(
        said[0].starts_with("weft: the command (pid ")
            && said[0].contains(") was killed by SIGSEGV"),
        "{err}"
    );

    // A trap of the program's own that none of weft's mechanisms claims: the
    // agent says so on the program's stderr (a crash weft caused would be told
    // apart by that line), then the default action ends it, as without weft.
    let (c, err) = run("-DTRAP_AFTER=300");
    assert_eq!(c, Some(300), "{err}");
    assert!(
        err.contains("weft-agent: a SIGTRAP no weft mechanism claimed (si_code 128, rip 0x"),
        "{err}"
    );
    assert!(err.contains(") was killed by SIGTRAP"), "{err}");
}

/// Two SIGINTs in a row to a weft attached to a running process: the process is
/// unwoven and keeps running, unharmed.
#[test]
fn a_second_signal_never_leaves_an_attached_target_woven() {
    let bin = build("spinner.c", Variant::O2_PIE, &[]);
    let b = bin.to_str().unwrap();
    let mut t = Spawned::start(&bin, &[]);
    t.wait_line("ready", T);
    let prog = format!("uprobe:{b}:tick {{ @c = count(); }} {LIVE}");
    let mut w = Background::start(&["-e", &prog, "-p", &t.pid().to_string()]);
    w.wait_line("live", false, T);
    w.signal(libc::SIGINT);
    w.signal(libc::SIGINT);
    let o = w.finish(T);
    assert!(map_value(&ok(&o), "@c").unwrap() > 0);
    assert!(code_matches_file(t.pid(), &bin));
    t.assert_healthy();
}

/// weft run in `dir`, for relative paths in patterns.
fn weft_in(dir: &std::path::Path, args: &[&str]) -> std::process::Output {
    let child = Command::new(weft_bin())
        .args(args)
        .current_dir(dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_output(child, T)
}

/// Listing as bpftrace lists: probe patterns with relative paths (shown as written,
/// as bpftrace lists them; upstream tests/runtime/uprobe and usdt), a wildcard in a
/// path's file name or in the probe type, library names resolved in a process, USDT
/// probes, `--binary`, `-lv` with DWARF types, and a pattern that matches nothing is
/// an error.
#[test]
fn list_the_bpftrace_way() {
    let calls = build("calls.c", Variant::O2_PIE, &[]);
    let dir = calls.parent().unwrap();
    let rel = "./calls";
    let out = ok(&weft_in(dir, &["-l", "uprobe:./calls:*"]));
    assert!(out.contains(&format!("uprobe:{rel}:many_args\n")), "{out}");
    assert!(
        out.lines()
            .all(|l| l.starts_with(&format!("uprobe:{rel}:"))),
        "{out}"
    );
    // A wildcard in the file name: the directory's matching binaries, as written.
    let out = ok(&weft_in(dir, &["-l", "uprobe:./call*:work"]));
    assert!(out.lines().any(|l| l == "uprobe:./calls:work"), "{out}");
    assert!(out.lines().all(|l| l.starts_with("uprobe:./call")), "{out}");
    // A wildcard probe type lists every kind in the binary.
    let out = ok(&weft_in(dir, &["-l", "*:./calls:wor*"]));
    assert!(out.lines().any(|l| l == "uprobe:./calls:work"), "{out}");
    assert_eq!(
        ok(&weft_in(dir, &["list", "wor*", "--binary", "./calls"])),
        format!("uprobe:{rel}:work\n")
    );
    assert_eq!(
        ok(&weft_in(dir, &["list", "uretprobe:./calls:work"])),
        format!("uretprobe:{rel}:work\n")
    );
    assert_eq!(
        ok(&weft_in(dir, &["-lv", "uprobe:./calls:many_args"])),
        format!(
            "uprobe:{rel}:many_args\n{}",
            ["a", "b", "c", "d", "e", "f", "g", "h"]
                .iter()
                .map(|n| format!("    long int {n}\n"))
                .collect::<String>()
        )
    );
    let sdt = build("sdt.c", Variant::O2_PIE, &[]);
    assert_eq!(
        ok(&weft_in(sdt.parent().unwrap(), &["list", "usdt:./sdt:*"])),
        "usdt:./sdt:app:tick\nusdt:./sdt:app:work\n"
    );
    // A library name, in a running process.
    let spinner = build("spinner.c", Variant::O2_PIE, &[]);
    let t = Spawned::start(&spinner, &[]);
    t.wait_line("ready", T);
    let pid = t.pid().to_string();
    let libc = ok(&weft(&["-l", "uprobe:libc:mall*", "-p", &pid], T));
    assert!(
        libc.lines()
            .any(|l| l.starts_with("uprobe:/") && l.ends_with("libc.so.6:malloc")),
        "{libc}"
    );
    assert!(libc.lines().all(|l| l.contains("libc.so.6:mall")), "{libc}");
    // Nothing matched, a kernel probe, no binary: one line, exit 1.
    for (args, want) in [
        (
            vec!["-l", "uprobe:./calls:no_such_fn*"],
            "weft: no probe matches uprobe:./calls:no_such_fn*\n",
        ),
        (
            vec!["-l", "kprobe:vfs_read"],
            // What follows says what the running kernel offers.
            "weft: kprobe: ",
        ),
        (vec!["list", "mall*"], "weft: mall*: list needs a binary"),
    ] {
        let o = weft_in(dir, &args);
        assert_eq!(o.status.code(), Some(1), "{args:?}");
        let err = text(&o.stderr);
        assert!(err.starts_with(want), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{err}");
    }
}

/// A kernel thread's pid, found by its flags (`PF_KTHREAD`), not assumed.
fn a_kernel_thread() -> i32 {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .find(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
                s.rsplit_once(')')
                    .and_then(|(_, r)| r.split_whitespace().nth(6)?.parse::<u64>().ok())
                    .is_some_and(|f| f & 0x0020_0000 != 0)
            })
        })
        .expect("a kernel thread")
}

/// One line on stderr containing `want`, exit status 1.
fn refused(o: &std::process::Output, want: &str) {
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains(want), "stderr lacks {want:?}:\n{err}");
    assert_eq!(
        err.lines()
            .filter(|l| l.starts_with("weft:") || l.starts_with("error"))
            .count(),
        1,
        "{err}"
    );
}

/// Messages that say what happened and what works instead.
#[test]
fn messages_lead_somewhere() {
    let bin = build("calls.c", Variant::O2_PIE, &[]);
    let b = bin.to_str().unwrap();
    // A kernel probe says what this kernel offers and what to use instead.
    refused(
        &weft(&["-e", "kprobe:vfs_read { @ = count(); }", "-c", b], T),
        "use tracepoint:CATEGORY:NAME",
    );
    // A kernel thread is called one.
    let k = a_kernel_thread().to_string();
    for args in [
        vec!["-e", "BEGIN { exit(); }", "-p", &k],
        vec!["record", "-p", &k],
        vec!["-l", "uprobe:*:mall*", "-p", &k],
    ] {
        refused(&weft(&args, T), "is a kernel thread");
    }
    // A function the program calls but its library defines: the library is named.
    let o = weft(
        &[
            "-e",
            &format!("uprobe:{b}:malloc {{ @ = count(); }}"),
            "-c",
            b,
        ],
        T,
    );
    refused(
        &o,
        "(it is in libc.so.6, which the process maps: probe it as uprobe:libc:malloc)",
    );
    let sqlite = "/usr/bin/sqlite3";
    let o = weft(
        &[
            "-e",
            &format!("uprobe:{sqlite}:sqlite3_prepare_v2 {{ @ = count(); }}"),
            "-c",
            &format!("{sqlite} :memory: 'select 1'"),
        ],
        T,
    );
    refused(&o, "probe it as uprobe:libsqlite3:sqlite3_prepare_v2)");
    let o = weft(
        &[
            "-e",
            "uprobe:libsqlite3:sqlite3_prepare_v2 { @ = count(); }",
            "-c",
            &format!("{sqlite} :memory: 'select 1'"),
        ],
        T,
    );
    assert_eq!(map_value(&ok(&o), "@"), Some(1));
    // weft's own hook: explained, the rest of the program runs.
    let o = weft(
        &[
            "-e",
            "uprobe:libc:__libc_sigaction { @s = count(); } uprobe:libc:malloc { @m = count(); }",
            "-c",
            b,
        ],
        T,
    );
    let out = ok(&o);
    assert!(
        text(&o.stderr)
            .contains("__libc_sigaction not woven: weft's agent redirects this function"),
        "{}",
        text(&o.stderr)
    );
    assert!(map_value(&out, "@m").unwrap() > 0, "{out}");
    // An empty program, an unknown -d stage, an unknown option: usage errors, exit 1.
    refused(
        &weft(&["-e", " "], T),
        "weft: -e: the program has no probes",
    );
    refused(
        &weft(&["-d", "bogus", "-e", "BEGIN { exit(); }"], T),
        "use ast, expanded, checked or program; or parse, expand, check, lower",
    );
    refused(&weft(&["--bogus"], T), "unexpected argument '--bogus'");
    // A dump of a program that cannot run (no target) still exits 1.
    let o = weft(&["-d", "ast", "-e", "profile:hz:99 { @ = count(); }"], T);
    assert_eq!(o.status.code(), Some(1));
    assert!(text(&o.stderr).contains("=== parse ==="));
    assert!(text(&o.stderr).contains("weft: profile probes need a target process"));
    // An unsigned value tested for its sign warns, and the program still runs.
    let o = weft(
        &[
            "-e",
            &format!("uretprobe:{b}:work /retval < 0/ {{ @ = count(); }}"),
            "-c",
            b,
        ],
        T,
    );
    assert!(o.status.success());
    assert!(text(&o.stderr).contains("warning: this is unsigned (`uint64`)"));
    // `--unsafe`'s help names all it allows, as the README's safety list does.
    let help = ok(&weft(&["--help"], T));
    let line = help
        .lines()
        .find(|l| l.trim_start().starts_with("--unsafe"))
        .unwrap();
    let readme = std::fs::read_to_string(repo_root().join("README.md")).unwrap();
    for what in [
        "`around`",
        "override()",
        "`new = EXPR`",
        "signal()",
        "system()",
    ] {
        assert!(
            line.contains(&what.replace('`', "")),
            "--unsafe help lacks {what}: {line}"
        );
        assert!(readme.contains(what), "README lacks {what}");
    }
    // Neither says advice never writes memory: `new = EXPR` does.
    assert!(line.contains("the only advice that writes the target's memory"));
    assert!(!help.contains("never writes the target's memory"));
    assert!(!readme.contains("Advice cannot write target memory"));
}

/// `-c` through wrappers: a `#!` script that runs the program twice, `sh -c`, and
/// `env`: the probes reach the program whichever exec brings it, as bpftrace's do.
#[test]
fn launch_through_scripts_and_shells() {
    let include = repo_root().join("include");
    let app = build(
        "app.c",
        Variant::O2_PIE,
        &[&format!("-I{}", include.display())],
    );
    let dir = scratch_dir("wrappers");
    // Linked, not copied: see `record.rs` ("Text file busy").
    std::fs::hard_link(&app, dir.join("app")).unwrap();
    let script = dir.join("run.sh");
    // Subshells (`$(...)`) are forked children that end at once, as a pyenv shim's
    // are: followed, they are no error (weft said "left out: the target exited").
    std::fs::write(
        &script,
        "#!/bin/sh\nfor i in 1 2 3 4 5 6 7 8; do a=$(true); b=$(cat /dev/null); done\n\
         ./app\n./app x\necho done\n",
    )
    .unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    // app with no usable file handles five requests and parses them again: 10
    // parse calls per run.
    for (cmd, runs) in [
        ("./run.sh", 2),
        ("sh -c './app x'", 1),
        ("env FOO=1 ./app", 1),
        ("./app", 1),
    ] {
        let o = weft_in(
            &dir,
            &["-e", "uprobe:./app:parse { @calls = count(); }", "-c", cmd],
        );
        let out = ok(&o);
        assert_eq!(
            map_value(&out, "@calls"),
            Some(10 * runs),
            "{cmd}: {out}{}",
            text(&o.stderr)
        );
        assert_eq!(text(&o.stderr), "Attached 1 probe\n", "{cmd}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// `-c` through a wrapper when the probes name only a library (`uprobe:libc:...`):
/// weft follows the shell's or script's exec and counts the program's calls
/// exactly, and the program the wrapper runs keeps nothing of weft in its
/// environment (`LD_PRELOAD`, `WEFT_*`), so what it runs in turn starts clean.
/// `--follow-fork` keeps them: following is what it asks for.
#[test]
fn a_library_probe_through_a_wrapper_counts_the_program() {
    let prog = build("wrapped.c", Variant::O2_PIE, &[]);
    let dir = scratch_dir("wrapped");
    std::fs::hard_link(&prog, dir.join("wrapped")).unwrap();
    let script = dir.join("run.sh");
    std::fs::write(&script, "#!/bin/sh\n./wrapped\n./wrapped\n").unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let probe = "uprobe:libc:malloc /arg0 == 4321/ { @m = count(); }";
    // (command, its malloc(4321) calls weft sees, "checked" lines printed). With an
    // argument the program runs itself again through `system()`: that copy starts
    // without the agent, so its calls are not counted.
    for (cmd, calls, checked) in [
        ("sh -c ./wrapped", 7, 1),
        ("./run.sh", 14, 2),
        ("env A=1 ./wrapped x", 7, 2),
        ("bash -c './wrapped x'", 7, 2),
        ("./wrapped", 7, 1),
    ] {
        let o = weft_in(&dir, &["-e", probe, "-c", cmd]);
        let out = ok(&o);
        assert_eq!(map_value(&out, "@m"), Some(calls), "{cmd}: {out}");
        assert_eq!(out.matches("checked\n").count(), checked, "{cmd}: {out}");
        assert!(!out.contains("left: "), "{cmd}: {out}");
        assert_eq!(text(&o.stderr), "Attached 1 probe\n", "{cmd}");
    }
    // A script whose interpreter is no shell (python) running the program a probe
    // names by path: followed through python, which keeps the variables for it;
    // the program takes them out.
    let py = dir.join("run.py");
    std::fs::write(
        &py,
        "#!/usr/bin/python3\nimport subprocess\nsubprocess.run(['./wrapped'], check=True)\n",
    )
    .unwrap();
    std::fs::set_permissions(&py, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let o = weft_in(
        &dir,
        &[
            "-e",
            "uprobe:./wrapped:main { @main = count(); }",
            "-c",
            "./run.py",
        ],
    );
    let out = ok(&o);
    assert_eq!(map_value(&out, "@main"), Some(1), "{out}");
    assert_eq!(out.matches("checked\n").count(), 1, "{out}");
    assert!(!out.contains("left: "), "{out}");
    let o = weft_in(
        &dir,
        &["--follow-fork", "-e", probe, "-c", "sh -c ./wrapped"],
    );
    let out = ok(&o);
    assert_eq!(map_value(&out, "@m"), Some(7), "{out}");
    assert!(out.contains("left: LD_PRELOAD="), "{out}");
    assert!(out.contains("left: WEFT_FOLLOW=1"), "{out}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A launched program is probed from its first instruction: calls made by its
/// libraries' constructors, its `.preinit_array` and its constructors are all
/// counted (the agent is linked `-z initfirst`), as bpftrace and gdb count them.
#[test]
fn launch_sees_constructors_and_preinit() {
    let dir = scratch_dir("ctors");
    let src = repo_root().join("tests/targets");
    let (lib, prog) = (src.join("ctorlib.c"), src.join("ctors.c"));
    for args in [
        vec![
            "-O2",
            "-g",
            "-shared",
            "-fPIC",
            "-o",
            "libctor.so",
            lib.to_str().unwrap(),
        ],
        vec![
            "-O2",
            "-g",
            "-o",
            "ctors",
            prog.to_str().unwrap(),
            "-L.",
            "-lctor",
            "-Wl,-rpath,$ORIGIN",
        ],
    ] {
        let st = Command::new("gcc")
            .args(&args)
            .current_dir(&dir)
            .status()
            .unwrap();
        assert!(st.success(), "gcc {args:?}");
    }
    let o = weft_in(
        &dir,
        &[
            "-e",
            "uprobe:libc:malloc /arg0 == 5555/ { @m = count(); }
             uprobe:./ctors:pre { @pre = count(); }
             uprobe:./libctor.so:lib_ctor { @lib = count(); }",
            "-c",
            "./ctors",
        ],
    );
    let out = ok(&o);
    assert!(out.starts_with("main\n"), "{out}");
    assert_eq!(map_value(&out, "@m"), Some(9), "{out}");
    assert_eq!(map_value(&out, "@pre"), Some(1), "{out}");
    assert_eq!(map_value(&out, "@lib"), Some(1), "{out}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Where a launched program's probes start: after the loader has mapped and
/// relocated every library, before any constructor. A call from an IFUNC resolver
/// the loader runs while relocating (the program linked `-z now`) is not seen, nor
/// is the C library's `__libc_early_init`; the same resolver run lazily (`-z lazy`,
/// at the first call), the library's constructor and `main`'s call are each
/// counted once. README ("Usage by example", first paragraph) says the same.
/// A launched program is probed from its first instruction: the loader's start-up
/// (an IFUNC resolver run while `-z now` relocates, `__libc_early_init`) runs
/// before the agent can, on kernel uprobes set in that one process at its `exec`;
/// the agent's trampolines take over at its initializer. Each call is counted once
/// (entry and return, printf order kept), a probe eBPF cannot run there says so
/// with `-v`, and without eBPF the start-up is what the agent misses.
#[test]
fn launch_sees_the_loaders_start_up() {
    let dir = scratch_dir("ifunc");
    let src = repo_root().join("tests/targets");
    let (lib, prog) = (src.join("ifunclib.c"), src.join("ifuncprog.c"));
    let (lib, prog) = (lib.to_str().unwrap(), prog.to_str().unwrap());
    let link = ["-L.", "-lifunc", "-Wl,-rpath,$ORIGIN"];
    for args in [
        vec![
            "-O2",
            "-g",
            "-shared",
            "-fPIC",
            "-fno-semantic-interposition",
            "-o",
            "libifunc.so",
            lib,
        ],
        [&["-O2", "-g", "-o", "now", prog, "-Wl,-z,now"], &link[..]].concat(),
        [&["-O2", "-g", "-o", "lazy", prog, "-Wl,-z,lazy"], &link[..]].concat(),
    ] {
        let st = Command::new("gcc")
            .args(&args)
            .current_dir(&dir)
            .status()
            .unwrap();
        assert!(st.success(), "gcc {args:?}");
    }
    let probes = "uprobe:./libifunc.so:seen_in { @[arg0] = count(); printf(\"seen %d\\n\", arg0); }
                  uretprobe:./libifunc.so:seen_in { @ret = count(); }
                  uprobe:libc:__libc_early_init { @early = count(); }";
    let want = |resolver: bool| {
        let mut w = std::collections::BTreeMap::new();
        if resolver {
            w.insert("1".to_string(), 1);
        }
        w.insert("2".to_string(), 1);
        w.insert("3".to_string(), 1);
        w
    };
    // The resolver runs before the library's constructor under `-z now`, at
    // pick's first call (from main) under `-z lazy`: the order of weft's lines,
    // the kernel's events merged with the agent's by time, says which.
    for (cmd, lines) in [
        ("./now", ["seen 1", "seen 2", "seen 3"]),
        ("./lazy", ["seen 2", "seen 1", "seen 3"]),
    ] {
        let o = weft_in(&dir, &["-e", probes, "-c", cmd]);
        let out = ok(&o);
        let printed: Vec<&str> = out.lines().filter(|l| l.starts_with("seen ")).collect();
        assert_eq!(printed, lines, "{cmd}: {out}");
        assert!(out.contains("pick 1\n"), "{cmd}: {out}");
        assert_eq!(keyed(&out, "@"), want(true), "{cmd}: {out}");
        assert_eq!(map_value(&out, "@ret"), Some(3), "{cmd}: {out}");
        assert_eq!(map_value(&out, "@early"), Some(1), "{cmd}: {out}");
    }
    // Advice eBPF does not run (assigning a map) starts with the agent, and -v says
    // why; the agent's own calls are never counted (the hand-over is at its first
    // instruction, before it calls the C library).
    let o = weft_in(
        &dir,
        &[
            "-v",
            "-e",
            "uprobe:./libifunc.so:seen_in { @last[arg0] = 1; }
             uprobe:libc:socket { @sockets = count(); }
             uprobe:libc:getenv { @getenv = count(); }",
            "-c",
            "./now",
        ],
    );
    let out = ok(&o);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains(
            "from the first instruction until the agent starts, not probed: \
             uprobe:./libifunc.so:seen_in: its advice reads or assigns a map"
        ),
        "{err}"
    );
    assert!(err.contains("2 kernel uprobes run 2 probes"), "{err}");
    assert!(!out.contains("@last[1]"), "{out}");
    assert!(
        out.contains("@last[2]: 1") && out.contains("@last[3]: 1"),
        "{out}"
    );
    // The agent connects to weft with socket(2) and reads its environment.
    assert_eq!(map_value(&out, "@sockets"), Some(0), "{out}");
    assert_eq!(map_value(&out, "@getenv"), Some(0), "{out}");
    // Without eBPF, the loader's start-up is what a launch misses.
    let o = Command::new(weft_bin())
        .args(["-e", probes, "-c", "./now"])
        .env("WEFT_TEST_NO_EBPF", "1")
        .current_dir(&dir)
        .output()
        .unwrap();
    let out = ok(&o);
    assert_eq!(keyed(&out, "@"), want(false), "{out}");
    assert_eq!(map_value(&out, "@early").unwrap_or(0), 0, "{out}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `probe` names the binary as the user wrote it (`uprobe:./calls:work`), as
/// bpftrace does; a library name shows the file it resolved to.
#[test]
fn probe_names_the_binary_as_written() {
    let calls = build("calls.c", Variant::O2_PIE, &[]);
    let dir = calls.parent().unwrap();
    let o = weft_in(
        dir,
        &[
            "-e",
            "uprobe:./calls:work { @[probe] = count(); } uprobe:libc:malloc { @m[probe] = count(); }",
            "-c",
            "./calls",
        ],
    );
    let out = ok(&o);
    assert!(map_value(&out, "@[uprobe:./calls:work]").is_some(), "{out}");
    assert!(
        out.lines()
            .any(|l| l.starts_with("@m[uprobe:/") && l.contains("libc.so.6:malloc]")),
        "{out}"
    );
}

/// bpftrace's command line as upstream writes it: long forms of the short flags
/// (`--cmd`, `--pid`, `--output`, `--quiet`, `--verbose`, `--debug`, `--list`),
/// `-B` output buffering (the same bytes in every mode), `--probe-filter` (only the
/// probes whose name matches run), and the flags weft accepts for compatibility
/// (`-k`, `--usdt-file-activation`, `--no-feature`).
#[test]
fn upstream_command_line_forms() {
    let calls = build("calls.c", Variant::O2_PIE, &[]);
    let c = calls.to_str().unwrap();
    let dir = scratch_dir("cli-forms");
    let prog = format!(
        "uprobe:{c}:work {{ @w = count(); printf(\"w %d\\n\", arg0); }} \
         uprobe:{c}:tiny {{ @t = count(); }}"
    );
    let cmd = format!("{c} 5");
    let mut files = Vec::new();
    for mode in ["line", "full", "none"] {
        let out = dir.join(format!("{mode}.txt"));
        let o = weft(
            &[
                "-B",
                mode,
                "--quiet",
                "--output",
                out.to_str().unwrap(),
                "--cmd",
                &cmd,
                "-e",
                &prog,
                "-k",
                "-kk",
                "--usdt-file-activation",
                "--no-feature",
                "uprobe_multi",
            ],
            T,
        );
        assert!(o.status.success(), "{mode}: {o:?}");
        files.push(std::fs::read_to_string(&out).unwrap());
    }
    assert!(
        files[0].starts_with("w 0\nw 1\nw 2\nw 3\nw 4\n"),
        "{}",
        files[0]
    );
    assert!(
        files[0].contains("@t: 5\n") && files[0].contains("@w: 5\n"),
        "{}",
        files[0]
    );
    assert_eq!(files[0], files[1]);
    assert_eq!(files[0], files[2]);
    // Only the probes whose name matches run.
    let o = weft(&["--probe-filter", ":tiny$", "-c", &cmd, "-e", &prog], T);
    let out = ok(&o);
    assert_eq!(map_value(&out, "@t"), Some(5), "{out}");
    assert!(!out.contains("w 0") && !out.contains("@w: 5"), "{out}");
    refused(
        &weft(&["--probe-filter", "nothing", "-c", &cmd, "-e", &prog], T),
        "--probe-filter matches no probe of the program",
    );
    refused(
        &weft(&["--probe-filter", "(", "-c", &cmd, "-e", &prog], T),
        "--probe-filter \"(\": not a regular expression (unclosed group)",
    );
    // --list and --verbose, as -l and -v.
    let o = weft(&["--list", &format!("uprobe:{c}:wor*")], T);
    assert_eq!(ok(&o), format!("uprobe:{c}:work\n"));
    let _ = std::fs::remove_dir_all(&dir);
}
