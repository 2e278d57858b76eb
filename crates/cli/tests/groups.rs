//! Groups of processes (Arachne's placement): `-p NAME=PID,...` and `group NAME =
//! comm("..."), pid(...), command;` name processes; `@NAME probe` places a probe on
//! them, `ingroup(NAME)` tests the current process, `add`/`remove` change the set;
//! forked children of a member are members. Maps are shared by every process.

mod common;

use std::time::Duration;

use common::*;

const T: Duration = Duration::from_secs(120);

/// Two processes named as a group and one that is not, in one session: the placed
/// probe counts only the group's calls, a map they all write is shared, and
/// `!ingroup(web)` sees the third one's.
#[test]
fn a_placed_probe_fires_only_in_its_group() {
    let bin = build("member.c", Variant::O2_PIE, &[]);
    let b = bin.to_str().unwrap();
    let ns = [1000u64, 2000, 3000];
    let targets: Vec<Spawned> = ns
        .iter()
        .map(|n| {
            let t = Spawned::start(&bin, &[&n.to_string()]);
            t.wait_line("ready", T);
            t
        })
        .collect();
    let pids: Vec<String> = targets.iter().map(|t| t.pid().to_string()).collect();
    let total: u64 = ns.iter().sum();
    let prog = format!(
        "uprobe:{b}:ping /@seen[pid] == 0/ {{ @seen[pid] = 1; printf(\"live %d\\n\", pid); }} \
         @web uprobe:{b}:work {{ @w[pid] = count(); @all = count(); }} \
         uprobe:{b}:work /!ingroup(web)/ {{ @others = count(); @all = count(); }} \
         interval:ms:20 /@all == {total}/ {{ exit(); }}"
    );
    let web = format!("web={},{}", pids[0], pids[1]);
    let mut w = Background::start(&["-e", &prog, "-p", &web, "-p", &pids[2]]);
    for _ in 0..3 {
        w.wait_line("live ", false, T);
    }
    for t in &targets {
        // SAFETY: signalling our own child.
        unsafe { libc::kill(t.pid(), libc::SIGUSR1) };
    }
    let out = ok(&w.finish(T));
    assert_eq!(map_value(&out, "@all"), Some(total as i64), "{out}");
    assert_eq!(
        map_value(&out, &format!("@w[{}]", pids[0])),
        Some(1000),
        "{out}"
    );
    assert_eq!(
        map_value(&out, &format!("@w[{}]", pids[1])),
        Some(2000),
        "{out}"
    );
    assert!(!out.contains(&format!("@w[{}]", pids[2])), "{out}");
    assert_eq!(map_value(&out, "@others"), Some(3000), "{out}");
    // The membership map is the aspect's own: not printed.
    assert!(!out.contains("@__group"), "{out}");
    for mut t in targets {
        t.wait_line("done", T);
        assert!(code_matches_file(t.pid(), &bin));
        // SAFETY: signalling our own child.
        unsafe { libc::kill(t.pid(), libc::SIGUSR2) };
        assert!(t.child.wait().unwrap().success());
    }
}

/// `weft -c` with the command's stdin fed `go` (the command reads it once woven).
fn run_with_go(args: &[&str]) -> std::process::Output {
    use std::io::Write;
    let mut w = std::process::Command::new(weft_bin())
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut input = w.stdin.take().unwrap();
    input.write_all(b"go\n").unwrap();
    drop(input);
    wait_output(w, T)
}

/// The `-c` command's group: every child it forks is a member from its first call
/// (the agent copies the membership inside `fork()`), with no `--follow-fork`.
#[test]
fn forked_children_join_their_parents_group() {
    let bin = build("forkserver.c", Variant::O2_PIE, &[]);
    let b = bin.to_str().unwrap();
    let prog = format!(
        "group srv = command; \
         @srv uprobe:{b}:work {{ @in[pid] = count(); @n = count(); }} \
         uprobe:{b}:work /!ingroup(srv)/ {{ @out = count(); }}"
    );
    let cmd = format!("{b} 5 100");
    let out = ok(&run_with_go(&["-e", &prog, "-c", &cmd]));
    assert!(out.contains("served 5 5050"), "{out}");
    assert_eq!(map_value(&out, "@n"), Some(600), "{out}");
    assert_eq!(keyed(&out, "@in").len(), 6, "{out}");
    assert!(keyed(&out, "@in").values().all(|&c| c == 100), "{out}");
    assert_eq!(map_value(&out, "@out"), Some(0), "{out}");
}

/// `add` and `remove` from advice: each child adds itself at its first call and
/// leaves at its 50th; the parent never joins.
#[test]
fn advice_adds_and_removes_members() {
    let bin = build("forkserver.c", Variant::O2_PIE, &[]);
    let b = bin.to_str().unwrap();
    let prog = format!(
        "group picked; \
         uprobe:{b}:work /arg0 == 0 && pid != cpid/ {{ add(picked, pid); }} \
         uprobe:{b}:work /arg0 == 50 && ingroup(picked)/ {{ remove(picked, pid); }} \
         @picked uprobe:{b}:work {{ @p[pid] = count(); @total = count(); }}"
    );
    let cmd = format!("{b} 4 100");
    let out = ok(&run_with_go(&["-e", &prog, "-c", &cmd]));
    assert!(out.contains("served 4 5050"), "{out}");
    assert_eq!(map_value(&out, "@total"), Some(200), "{out}");
    let p = keyed(&out, "@p");
    assert_eq!(p.len(), 4, "{out}");
    assert!(p.values().all(|&c| c == 50), "{out}");
}

/// A `comm("...")` member: processes of that name, whichever pid.
#[test]
fn a_comm_member_names_processes_by_name() {
    let bin = build("forkserver.c", Variant::O2_PIE, &[]);
    let b = bin.to_str().unwrap();
    let prog = format!(
        "group fs = comm(\"forkserver\"); group other = comm(\"nginx\"); \
         @fs uprobe:{b}:work {{ @fs = count(); }} @other uprobe:{b}:work {{ @other = count(); }}"
    );
    let cmd = format!("{b} 2 100");
    let out = ok(&run_with_go(&["-e", &prog, "-c", &cmd]));
    assert_eq!(map_value(&out, "@fs"), Some(300), "{out}");
    assert_eq!(map_value(&out, "@other"), Some(0), "{out}");
}

#[test]
fn group_mistakes_are_located() {
    for (args, want) in [
        (
            vec!["-e", "group web; @wbe uprobe:/bin/true:main { }"],
            "unknown group `wbe`; did you mean `web`?",
        ),
        (
            vec!["-e", "group web; group web; BEGIN { }"],
            "group `web` is declared twice",
        ),
        (
            vec!["-e", "group web = 42; BEGIN { }"],
            "a group member is comm(\"NAME\"), pid(PID, ...) or command",
        ),
        (
            vec!["-e", "group web; BEGIN { $x = add(web, 1); }"],
            "add(GROUP, PID) is a statement, not a value",
        ),
        (
            vec!["-e", "BEGIN { if (ingroup(nope)) { } }"],
            "unknown group `nope`",
        ),
        (
            vec!["-e", "BEGIN { }", "-p", "9web=1"],
            "`9web` is not a group name",
        ),
    ] {
        let o = weft(&args, T);
        let err = text(&o.stderr);
        assert!(!o.status.success(), "{args:?} succeeded");
        assert!(err.contains(want), "{args:?}: want {want:?} in:\n{err}");
    }
}

/// Shared state across processes: a sequence instance started in one process ends
/// in another (its key is not the thread's), with what the first step bound.
#[test]
fn a_sequence_starts_in_one_process_and_ends_in_another() {
    let bin = build("member.c", Variant::O2_PIE, &[]);
    let b = bin.to_str().unwrap();
    let a = Spawned::start(&bin, &["10"]);
    let c = Spawned::start(&bin, &["10"]);
    a.wait_line("ready", T);
    c.wait_line("ready", T);
    let (pa, pc) = (a.pid(), c.pid());
    let prog = format!(
        "uprobe:{b}:ping /@seen[pid] == 0/ {{ @seen[pid] = 1; printf(\"live %d\\n\", pid); }} \
         seq handoff[1] {{ \
           uprobe:{b}:work /pid == {pa} && arg0 == 5/ {{ $from = pid; $at = arg0; }} \
           uprobe:{b}:work /pid == {pc} && arg0 == 7/ {{ printf(\"handoff %d@%d -> %d@%d\\n\", $from, $at, pid, arg0); @n = count(); }} \
         }} \
         interval:ms:20 /@n == 1/ {{ exit(); }}"
    );
    let mut w = Background::start(&["-e", &prog, "-p", &format!("{pa},{pc}")]);
    w.wait_line("live ", false, T);
    w.wait_line("live ", false, T);
    // A first, to its end; then C: the instance A started is the one C ends.
    // SAFETY: signalling our own children.
    unsafe { libc::kill(pa, libc::SIGUSR1) };
    a.wait_line("done", T);
    unsafe { libc::kill(pc, libc::SIGUSR1) };
    let out = ok(&w.finish(T));
    assert!(out.contains(&format!("handoff {pa}@5 -> {pc}@7")), "{out}");
    assert_eq!(map_value(&out, "@n"), Some(1), "{out}");
    for mut t in [a, c] {
        // SAFETY: as above.
        unsafe { libc::kill(t.pid(), libc::SIGUSR2) };
        assert!(t.child.wait().unwrap().success());
    }
}

/// A process that advice adds to a group, outside the session until then, is
/// attached and woven: the group's probes reach it.
#[test]
fn a_process_added_from_advice_is_woven() {
    let bin = build("member.c", Variant::O2_PIE, &[]);
    let b = bin.to_str().unwrap();
    let a = Spawned::start(&bin, &["10"]);
    let c = Spawned::start(&bin, &["300"]);
    a.wait_line("ready", T);
    c.wait_line("ready", T);
    let (pa, pc) = (a.pid(), c.pid());
    let prog = format!(
        "group web; \
         uprobe:{b}:ping /pid == {pa} && @added == 0/ {{ @added = 1; add(web, {pc}); }} \
         uprobe:{b}:ping /pid == {pc} && @live == 0/ {{ @live = 1; printf(\"live %d\\n\", pid); }} \
         @web uprobe:{b}:work {{ @w[pid] = count(); @n = count(); }} \
         interval:ms:20 /@n == 300/ {{ exit(); }}"
    );
    let mut w = Background::start(&["-v", "-e", &prog, "-p", &pa.to_string()]);
    w.wait_line(&format!("live {pc}"), false, T);
    // SAFETY: signalling our own child.
    unsafe { libc::kill(pc, libc::SIGUSR1) };
    let o = w.finish(T);
    let out = ok(&o);
    assert_eq!(map_value(&out, &format!("@w[{pc}]")), Some(300), "{out}");
    assert!(
        text(&o.stderr).contains(&format!("process {pc} joined: added to a group")),
        "{}",
        text(&o.stderr)
    );
    assert!(
        code_matches_file(pc, &bin),
        "the added process was left woven"
    );
    for mut t in [a, c] {
        let _ = t.child.kill();
        let _ = t.child.wait();
    }
}
