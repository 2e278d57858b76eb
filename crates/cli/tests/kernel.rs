//! Kernel probes (`tracepoint:`): advice compiled to eBPF, run by the kernel for
//! the session's processes, in the same program, maps and output as user-space
//! probes. These need eBPF and tracepoints (CI runs as root): they fail, never skip,
//! when the kernel refuses them.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::*;

const T: Duration = Duration::from_secs(120);

#[test]
fn openat_counts_each_file_the_command_opens() {
    let dir = std::env::temp_dir().join(format!("weft-tp-open-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let d = dir.to_str().unwrap();
    let cmd = format!("{} 7 0 0 {d}", tp());
    let out = weft(
        &[
            "trace",
            "-e",
            "tracepoint:syscalls:sys_enter_openat /pid == cpid/ { @[str(args.filename)] = count(); @total = count(); \
             if (strcontains(str(args.filename), \"weft-tp-open\")) { @ours = count(); } }",
            "-c",
            &cmd,
        ],
        T,
    );
    let stdout = ok(&out);
    let files = keyed(&stdout, "@");
    for i in 0..7 {
        assert_eq!(files.get(&format!("{d}/f{i}")), Some(&1), "{stdout}");
    }
    let ours = files.keys().filter(|k| k.starts_with(d)).count();
    assert_eq!(ours, 7, "{stdout}");
    assert_eq!(map_value(&stdout, "@ours"), Some(7), "{stdout}");
    // Every openat of the command is in one of the keys, and only those.
    let total = map_value(&stdout, "@total").unwrap();
    assert_eq!(total, files.values().sum::<i64>(), "{stdout}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn kernel_and_user_probes_share_maps_and_only_the_session_counts() {
    let bin = tp();
    // Another process making the same system calls the whole time: never counted.
    let mut noise = std::process::Command::new("sh")
        .args(["-c", &format!("while :; do {bin} 1 100; done")])
        .spawn()
        .unwrap();
    let cmd = format!("{bin} 5 30 2");
    let prog = format!(
        "uprobe:{bin}:work {{ @user = count(); @both = count(); }} \
         tracepoint:syscalls:sys_enter_getppid {{ @kernel = count(); @both = count(); @per[pid == cpid] = count(); }}"
    );
    let out = weft(&["trace", "-e", &prog, "-c", &cmd], T);
    let _ = noise.kill();
    let _ = noise.wait();
    let stdout = ok(&out);
    // 5 calls of work(30) in the command, 2 children of 30 calls each.
    assert_eq!(map_value(&stdout, "@user"), Some(5), "{stdout}");
    assert_eq!(
        map_value(&stdout, "@kernel"),
        Some(5 * 30 + 2 * 30),
        "{stdout}"
    );
    assert_eq!(
        map_value(&stdout, "@both"),
        Some(5 + 5 * 30 + 2 * 30),
        "{stdout}"
    );
    let per = keyed(&stdout, "@per");
    assert_eq!(per.get("true"), Some(&150), "{stdout}");
    assert_eq!(per.get("false"), Some(&60), "{stdout}");
}

#[test]
fn kernel_printf_builtins_and_exit_fields() {
    let cmd = format!("{} 3 2", tp());
    let out = weft(
        &[
            "trace",
            "-e",
            "tracepoint:syscalls:sys_enter_getppid { printf(\"%s %d %d\\n\", comm, pid == cpid, args.__syscall_nr); } \
             tracepoint:syscalls:sys_exit_getppid /args.ret > 0/ { @ok = count(); @ret = max(args.ret); }",
            "-c",
            &cmd,
        ],
        T,
    );
    let stdout = ok(&out);
    let lines: Vec<&str> = stdout.lines().filter(|l| l.starts_with("tp ")).collect();
    // getppid is system call 110 on x86-64.
    assert_eq!(lines, vec!["tp 1 110"; 6], "{stdout}");
    assert_eq!(map_value(&stdout, "@ok"), Some(6), "{stdout}");
}

/// `exit()` in a kernel probe: the code after it is never reached, and the
/// kernel's verifier refuses unreachable code, so it is left out. The first call
/// ends the session; as in bpftrace, a kernel probe's `exit()` is asynchronous, so
/// calls made before weft reads it still count (at most the command's 6).
#[test]
fn exit_in_a_kernel_probe_ends_the_session_at_the_first_event() {
    let cmd = format!("{} 3 2", tp());
    let out = weft(
        &[
            "trace",
            "-e",
            "tracepoint:syscalls:sys_enter_getppid { $z = 0; @d = 5 / $z; @n = count(); exit(); }",
            "-c",
            &cmd,
        ],
        T,
    );
    let stdout = ok(&out);
    let n = map_value(&stdout, "@n").unwrap_or(0);
    assert!((1..=6).contains(&n), "{stdout}");
    assert_eq!(map_value(&stdout, "@d"), Some(1), "{stdout}");
}

#[test]
fn array_and_data_loc_fields_are_strings() {
    let bin = tp();
    let rename = format!("{bin} rename tp-renamed");
    let out = weft(
        &[
            "trace",
            "-e",
            "tracepoint:task:task_rename { printf(\"%s -> %s %d\\n\", args.oldcomm, args.newcomm, args.pid == pid); }",
            "-c",
            &rename,
        ],
        T,
    );
    let stdout = ok(&out);
    assert!(
        stdout.lines().any(|l| l == "tp -> tp-renamed 1"),
        "{stdout}"
    );
    // A data_loc string: the path a process execs, in the process that execs.
    let exec = format!("sh -c 'exec {bin} 0 0'");
    let out = weft(
        &[
            "trace",
            "-e",
            "tracepoint:sched:sched_process_exec { printf(\"exec %s %d\\n\", args.filename, args.pid == cpid); }",
            "-c",
            &exec,
        ],
        T,
    );
    let stdout = ok(&out);
    assert_eq!(
        stdout
            .lines()
            .filter(|l| l.starts_with("exec "))
            .collect::<Vec<_>>(),
        vec![format!("exec {bin} 1")],
        "{stdout}"
    );
}

#[test]
fn attach_by_pid_and_system_wide() {
    let bin = tp();
    // -p: the attached process only.
    let mut target = Spawned::start(std::path::Path::new(&bin), &["wait", "40"]);
    target.wait_line("waiting", T);
    let pid = target.pid().to_string();
    let mut w = Background::start(&[
        "trace",
        "-e",
        "BEGIN { printf(\"ready\\n\"); } tracepoint:syscalls:sys_enter_getppid { @ = count(); }",
        "-p",
        &pid,
    ]);
    w.wait_line("ready", false, T);
    // SAFETY: signalling a process this test started.
    unsafe { libc::kill(target.pid(), libc::SIGUSR1) };
    let _ = target.child.wait();
    let out = w.finish(T);
    assert_eq!(map_value(&ok(&out), "@"), Some(40));
    // No target: every process; this one is told apart by its pid.
    let target = Spawned::start(std::path::Path::new(&bin), &["wait", "25"]);
    target.wait_line("waiting", T);
    let pid = target.pid().to_string();
    let mut w = Background::start(&[
        "trace",
        "-e",
        "BEGIN { printf(\"ready\\n\"); } tracepoint:syscalls:sys_enter_getppid /pid == $1/ { @ = count(); } \
         tracepoint:sched:sched_process_exit /pid == $1/ { exit(); }",
        "--",
        &pid,
    ]);
    w.wait_line("ready", false, T);
    // SAFETY: as above.
    unsafe { libc::kill(target.pid(), libc::SIGUSR1) };
    let out = w.finish(T);
    assert_eq!(map_value(&ok(&out), "@"), Some(25));
}

#[test]
fn with_system_the_kernel_probes_see_other_processes() {
    let bin = tp();
    for system in [true, false] {
        let mut target = Spawned::start(std::path::Path::new(&bin), &["wait", "33"]);
        target.wait_line("waiting", T);
        let tpid = target.pid();
        let prog = format!(
            "BEGIN {{ printf(\"ready\\n\"); }} \
             tracepoint:syscalls:sys_enter_getppid /pid == {tpid}/ {{ @ = count(); }}"
        );
        // The session's own command lasts as long as the other process.
        let wait = format!("sh -c 'while kill -0 {tpid} 2>/dev/null; do sleep 0.01; done'");
        let mut args = vec!["trace", "-e", &prog, "-c", &wait];
        if system {
            args.push("--system");
        }
        let mut w = Background::start(&args);
        w.wait_line("ready", false, T);
        // SAFETY: signalling a process this test started.
        unsafe { libc::kill(tpid, libc::SIGUSR1) };
        // Reaped, so that `kill -0` stops finding it.
        let _ = target.child.wait();
        let out = w.finish(T);
        let want = if system { 33 } else { 0 };
        assert_eq!(map_value(&ok(&out), "@"), Some(want), "--system: {system}");
    }
}

/// Arachne's per-client disk accounting, with the read step in the kernel: the
/// kernel probe reads the client a user-space probe recorded for the thread.
#[test]
fn per_client_bytes_from_a_user_probe_and_the_kernel_read() {
    let bin = tp();
    let prog = format!(
        "uprobe:{bin}:handle {{ @client[tid] = arg0; }} \
         uretprobe:{bin}:handle {{ delete(@client[tid]); }} \
         tracepoint:syscalls:sys_exit_read /@client[tid]/ {{ @bytes[@client[tid]] = sum(args.ret); @reads = count(); }}"
    );
    let cmd = format!("{bin} serve 20");
    let out = weft(&["trace", "-e", &prog, "-c", &cmd], T);
    let stdout = ok(&out);
    // Requests 0..20: client 1 + i % 3; each reads 100 * client bytes.
    let mut want = BTreeMap::new();
    for i in 0..20 {
        let c = 1 + i % 3;
        *want.entry(c.to_string()).or_insert(0) += 100 * c;
    }
    assert_eq!(keyed(&stdout, "@bytes"), want, "{stdout}");
    assert_eq!(map_value(&stdout, "@reads"), Some(20), "{stdout}");
}

/// What cannot run in the kernel is refused before the command starts, with the
/// probe named (what the code generator refuses at its location; the verifier's
/// verdict, the programs loaded once unattached); without privileges, kernel probes are refused and user space works.
#[test]
fn refused_before_anything_runs() {
    let mark = std::env::temp_dir().join(format!("weft-tp-mark-{}", std::process::id()));
    let _ = std::fs::remove_file(&mark);
    let touch = format!("touch {}", mark.display());
    let bin = tp();
    for (prog, why) in [
        (
            "tracepoint:syscalls:sys_enter_getppid { $i = 0; while ($i < 100000) { $i++; } @ = count(); }"
                .to_string(),
            "kernel probe tracepoint:syscalls:sys_enter_getppid: the kernel's eBPF verifier refused it",
        ),
        (
            "tracepoint:syscalls:sys_enter_openat { @[pcomm] = count(); }".to_string(),
            "kernel probe: pcomm is not available in kernel probes yet\n --> -e:1:1",
        ),
        (
            format!("uprobe:{bin}:work {{ @x = 1; }} tracepoint:syscalls:sys_enter_getppid {{ @x = 2; @y = @x; }}"),
            "reads @x, which both user-space and kernel probes write",
        ),
    ] {
        let o = weft(&["trace", "-e", &prog, "-c", &touch], T);
        let err = text(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{err}");
        assert!(err.contains(why), "{err}");
        assert!(!mark.exists(), "the command ran: {err}");
    }
    // As nobody: a located error for the tracepoint; BEGIN alone still runs.
    let weft = weft_bin();
    let o = std::process::Command::new("setpriv")
        .args(["--reuid", "65534", "--regid", "65534", "--clear-groups"])
        .arg(&weft)
        .args([
            "trace",
            "-e",
            "tracepoint:syscalls:sys_enter_openat { @ = count(); }",
            "-c",
            &touch,
        ])
        .current_dir(std::env::temp_dir())
        .output()
        .unwrap();
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("kernel tracepoints need root"), "{err}");
    assert!(err.contains("-e:1:1"), "{err}");
    assert!(!mark.exists());
}

/// The stat/open race (the kernel-level logger's example), all in the kernel: the
/// command checks a path; another process (this test, outside the session: hence
/// `--system`) replaces the file; the command opens it. The aspect fires only when
/// the replacement happened between the check and the use.
#[test]
fn the_stat_open_race_fires_only_when_another_process_replaces_the_file() {
    let bin = tp();
    let dir = std::env::temp_dir().join(format!("weft-tp-race-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("config");
    let p = path.to_str().unwrap().to_string();
    let prog = "tracepoint:syscalls:sys_enter_newfstatat, tracepoint:syscalls:sys_enter_statx \
                /pid == cpid/ { @checked[str(args.filename)] = 1; } \
                tracepoint:syscalls:sys_enter_rename* /pid != cpid && @checked[str(args.newname)]/ \
                { @replaced[str(args.newname)] = pid; } \
                tracepoint:syscalls:sys_enter_openat /pid == cpid && @replaced[str(args.filename)]/ \
                { printf(\"race on %s: replaced by %d\\n\", str(args.filename), @replaced[str(args.filename)]); }";
    for replace in [true, false] {
        std::fs::write(&path, "v1").unwrap();
        let cmd = format!("{bin} race {p}");
        let mut w = Background::start(&["trace", "--system", "-e", prog, "-c", &cmd]);
        w.wait_line("checked", false, T);
        if replace {
            let tmp = dir.join("config.new");
            std::fs::write(&tmp, "v2").unwrap();
            std::fs::rename(&tmp, &path).unwrap();
        }
        // The command is weft's child.
        let target = std::process::Command::new("pgrep")
            .args(["-P", &w.pid().to_string()])
            .output()
            .unwrap();
        let tpid: i32 = text(&target.stdout)
            .trim()
            .lines()
            .next()
            .unwrap()
            .parse()
            .unwrap();
        // SAFETY: signalling the command weft launched for this test.
        unsafe { libc::kill(tpid, libc::SIGUSR1) };
        let out = w.finish(T);
        let stdout = ok(&out);
        let races: Vec<&str> = stdout
            .lines()
            .filter(|l| l.starts_with("race on"))
            .collect();
        if replace {
            let me = std::process::id();
            assert_eq!(
                races,
                vec![format!("race on {p}: replaced by {me}")],
                "{stdout}"
            );
        } else {
            assert!(races.is_empty(), "{stdout}");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Issue 14's seed 1 as a sequence keyed by the path, with the file's check, its
/// replacement and its use as kernel events: process A (`tp toctou`, the command)
/// stat()s a path; another process B (`tp replace` or `tp modify`, a program A
/// forks and execs) replaces the file or rewrites it in place; A opens it. The aspect reports "race condition" with A's pid,
/// B's pid and the path (a string bound in the first step, read in the last).
/// Without B nothing is reported, nor when A replaces the file itself. `--system`:
/// B's events are seen whatever process makes them.
#[test]
fn toctou_as_a_seq_reports_both_pids_and_the_path_only_when_another_process_changes_the_file() {
    let bin = tp();
    let dir = std::env::temp_dir().join(format!("weft-toctou-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("config");
    let p = path.to_str().unwrap().to_string();
    let prog = "seq race[str(args.filename)] { \
                  tracepoint:syscalls:sys_enter_newfstatat, tracepoint:syscalls:sys_enter_statx /pid == cpid/ \
                    { $a = pid; $path = str(args.filename); } \
                  tracepoint:syscalls:sys_enter_openat /pid != $a && (args.flags & 3) != 0/ { $b = pid; } \
                  tracepoint:syscalls:sys_enter_openat /pid == $a/ \
                    { printf(\"race condition %d %d %s\\n\", $a, $b, $path); } \
                }";
    for who in ["other", "modifier", "none", "self"] {
        std::fs::write(&path, "v1").unwrap();
        let cmd = format!("{bin} toctou {p} {who}");
        let out = weft(&["trace", "--system", "-e", prog, "-c", &cmd], T);
        let stdout = ok(&out);
        // `opened A B`: the command's pid and its replacer's (0: none).
        let opened: Vec<&str> = stdout
            .lines()
            .find_map(|l| l.strip_prefix("opened "))
            .unwrap_or_else(|| panic!("{stdout}"))
            .split_whitespace()
            .collect();
        let races: Vec<&str> = stdout
            .lines()
            .filter(|l| l.starts_with("race condition"))
            .collect();
        if who == "other" || who == "modifier" {
            assert_eq!(
                races,
                vec![format!("race condition {} {} {p}", opened[0], opened[1])],
                "{stdout}"
            );
        } else {
            assert_eq!(races, Vec::<&str>::new(), "{who}: {stdout}");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// `syscalls:` probes run from the raw `sys_enter`/`sys_exit` tracepoints (no
/// record is built for a process the filter leaves out), and from the perf
/// tracepoint when asked (`WEFT_PERF_TRACEPOINTS=1`): the same counts and values
/// either way.
#[test]
fn raw_and_perf_system_call_paths_agree() {
    let bin = tp();
    let cmd = format!("{bin} 4 25");
    let prog =
        "tracepoint:syscalls:sys_enter_getppid { @n = count(); @nr = max(args.__syscall_nr); } \
                tracepoint:syscalls:sys_exit_getppid /args.ret > 0/ { @ok = count(); }";
    for (perf, raw_programs) in [(false, 2), (true, 0)] {
        let mut c = std::process::Command::new(weft_bin());
        c.args(["trace", "-v", "-e", prog, "-c", &cmd]);
        if perf {
            c.env("WEFT_PERF_TRACEPOINTS", "1");
        }
        let o = c.output().unwrap();
        let (stdout, stderr) = (text(&o.stdout), text(&o.stderr));
        assert!(o.status.success(), "{stderr}");
        assert!(
            stderr.contains(&format!(
                "({raw_programs} on the raw system call tracepoints)"
            )),
            "{stderr}"
        );
        assert_eq!(map_value(&stdout, "@n"), Some(100), "{stdout}");
        assert_eq!(map_value(&stdout, "@nr"), Some(110), "{stdout}");
        assert_eq!(map_value(&stdout, "@ok"), Some(100), "{stdout}");
    }
    // `common_pid` is the thread's id on both paths.
    let o = weft(
        &[
            "trace",
            "-v",
            "-e",
            "tracepoint:syscalls:sys_enter_getppid { @pid[args.common_pid == tid] = count(); }",
            "-c",
            &cmd,
        ],
        T,
    );
    let stderr = text(&o.stderr);
    assert!(
        stderr.contains("(1 on the raw system call tracepoints)"),
        "{stderr}"
    );
    assert_eq!(keyed(&ok(&o), "@pid").get("true"), Some(&100));
}

/// `ustack` in a kernel probe: the user stack of the thread that made the system
/// call, symbolized in the session's process.
#[test]
fn a_kernel_probe_takes_the_user_stack() {
    let cmd = format!("{} 4 25", tp());
    let stdout = ok(&weft(
        &[
            "trace",
            "-e",
            "tracepoint:syscalls:sys_enter_getppid { @[ustack] = count(); }",
            "-c",
            &cmd,
        ],
        T,
    ));
    // One call site in work(): one stack, every call.
    let frames: Vec<&str> = stdout
        .lines()
        .map(str::trim)
        .filter(|l| l.contains('+') || l.starts_with("0x"))
        .collect();
    assert!(
        frames.first().is_some_and(|f| f.starts_with("getppid+")),
        "{stdout}"
    );
    assert!(frames.iter().any(|f| f.starts_with("main+")), "{stdout}");
    assert!(stdout.contains("]: 100"), "{stdout}");
}

/// Division and remainder by zero in kernel advice give 1, as upstream bpftrace's
/// ("1 is being used as the result"), and are counted into its warning at exit.
#[test]
fn kernel_division_by_zero_gives_1_with_upstreams_warning() {
    let cmd = format!("{} 3 2", tp());
    let out = weft(
        &[
            "trace",
            "-e",
            "tracepoint:syscalls:sys_enter_getppid /pid == cpid/ { @n = count(); \
             @d = sum(10 / (cpid - cpid)); @m = sum(10 % (cpid - cpid)); }",
            "-c",
            &cmd,
        ],
        T,
    );
    let stdout = ok(&out);
    let n = 6;
    assert_eq!(map_value(&stdout, "@n"), Some(n), "{stdout}");
    assert_eq!(map_value(&stdout, "@d"), Some(n), "{stdout}");
    assert_eq!(map_value(&stdout, "@m"), Some(n), "{stdout}");
    let err = text(&out.stderr);
    // Each one warned where it happened, as upstream, then their number at exit.
    for (col, len) in [(78, 17), (108, 17)] {
        let warning = format!(
            "stdin:1:{col}-{}: WARNING: Divide or modulo by 0 detected. This can lead to unexpected results. 1 is being used as the result.\n",
            col + len
        );
        assert_eq!(
            err.matches(&warning).count(),
            n as usize,
            "{warning}: {err}"
        );
    }
    assert!(
        err.contains(&format!(
            "weft: {} divisions or remainders by zero gave 1 (each warned where it happened)\n",
            2 * n
        )),
        "{err}"
    );
}
