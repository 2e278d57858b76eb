//! Sequence aspects (`seq NAME[KEY] { step; step*; ...; step }`, Arachne's `seq`):
//! an instance per key, steps firing in order, `*` steps repeating (or not at all),
//! variables bound in one step read in later ones, steps in user space and in the
//! kernel together.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::*;

const T: Duration = Duration::from_secs(120);

/// Arachne's per-client accounting as a sequence: the request binds the client in
/// user space, the kernel's `read` system calls inside it add up per client, the
/// return ends the instance. Totals equal what the server does.
#[test]
fn per_client_bytes_with_a_kernel_step() {
    let bin = tp();
    let prog = format!(
        "seq acct[tid] {{
             uprobe:{bin}:handle {{ $client = arg0; }}
             tracepoint:syscalls:sys_exit_read {{ @bytes[$client] = sum(args.ret); }}*
             uretprobe:{bin}:handle {{ @requests[$client] = count(); }}
         }}"
    );
    let cmd = format!("{bin} serve 20");
    let stdout = ok(&weft(&["trace", "-e", &prog, "-c", &cmd], T));
    let (mut bytes, mut requests) = (BTreeMap::new(), BTreeMap::new());
    for i in 0..20 {
        let c = 1 + i % 3;
        *bytes.entry(c.to_string()).or_insert(0) += 100 * c;
        *requests.entry(c.to_string()).or_insert(0) += 1;
    }
    assert_eq!(keyed(&stdout, "@bytes"), bytes, "{stdout}");
    assert_eq!(keyed(&stdout, "@requests"), requests, "{stdout}");
    // The instances are the aspect's own: not printed.
    assert!(!stdout.contains("@__seq"), "{stdout}");
}

/// Steps fire only in order: the end before a start is ignored; a `*` step may
/// fire no time at all.
#[test]
fn steps_fire_in_order_and_a_repeated_step_may_not_fire() {
    let bin = tp();
    // `handle` returns, then is entered again: 5 requests give 4 return-then-entry.
    let prog = format!(
        "seq s[tid] {{ uretprobe:{bin}:handle {{ @started = count(); }} \
                      uprobe:{bin}:handle {{ @ended = count(); }} }}"
    );
    let cmd = format!("{bin} serve 5");
    let stdout = ok(&weft(&["trace", "-e", &prog, "-c", &cmd], T));
    assert_eq!(map_value(&stdout, "@started"), Some(5), "{stdout}");
    assert_eq!(map_value(&stdout, "@ended"), Some(4), "{stdout}");
    // work() never runs inside handle(): the `*` step never fires, every instance
    // still ends.
    let prog = format!(
        "seq s[tid] {{ uprobe:{bin}:handle {{ }} \
                      uprobe:{bin}:work {{ @inside = count(); }}* \
                      uretprobe:{bin}:handle {{ @done = count(); }} }}"
    );
    let stdout = ok(&weft(&["trace", "-e", &prog, "-c", &cmd], T));
    assert_eq!(map_value(&stdout, "@done"), Some(5), "{stdout}");
    assert_eq!(map_value(&stdout, "@inside"), Some(0), "{stdout}");
}

#[test]
fn a_sequence_needs_a_start_and_an_end() {
    for (prog, why) in [
        (
            "seq s[tid] { uprobe:/bin/true:main { } }",
            "needs at least two steps",
        ),
        (
            "seq s[tid] { uprobe:/bin/true:main { }* uprobe:/bin/true:exit { } }",
            "the first step of a seq cannot repeat",
        ),
        (
            "seq s[tid] { uprobe:/bin/true:main { } uprobe:/bin/true:exit { }* }",
            "the last step of a seq cannot repeat",
        ),
    ] {
        let o = weft(&["trace", "-e", prog, "-c", "/bin/true"], T);
        let err = text(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{err}");
        assert!(err.contains(why), "{err}");
        assert!(err.contains("-e:1:"), "{err}");
    }
}

/// An instance that never reaches its last step ends after the timeout, its
/// advice running with `$key` and the instance's variables.
#[test]
fn a_timeout_ends_a_stale_instance() {
    let bin = tp();
    // Each request's instance is keyed by the thread: the first starts it, and
    // nothing ends it (work() is never called), so it times out once.
    let prog = format!(
        "seq req[tid] {{
             uprobe:{bin}:handle {{ $client = arg0; }}
             uprobe:{bin}:work {{ @ended = count(); }}
             timeout 50ms {{ @stale[$client] = count(); printf(\"stale %d %d\\n\", $client, $key > 0); }}
         }}"
    );
    // The command lives on after the requests until the timeout has passed (weft
    // said so), then is let go.
    let cmd = format!("{bin} serve 3 wait");
    let mut w = Background::start(&["trace", "-e", &prog, "-c", &cmd]);
    w.wait_line("stale 1 1", false, T);
    let target = std::process::Command::new("pgrep")
        .args(["-P", &w.pid().to_string()])
        .output()
        .unwrap();
    let tpid: i32 = text(&target.stdout).trim().parse().unwrap();
    // SAFETY: signalling the command weft launched for this test.
    unsafe { libc::kill(tpid, libc::SIGUSR1) };
    let stdout = ok(&w.finish(T));
    let stale: Vec<&str> = stdout.lines().filter(|l| l.starts_with("stale")).collect();
    assert_eq!(stale, vec!["stale 1 1"], "{stdout}");
    assert_eq!(keyed(&stdout, "@stale").get("1"), Some(&1), "{stdout}");
    assert_eq!(map_value(&stdout, "@ended"), Some(0), "{stdout}");
}

/// Instances keyed by `tid` live in each thread's own state (no map): four threads
/// running the same sequence at once each complete theirs every round.
#[test]
fn thread_keyed_instances_in_four_threads() {
    let bin = build("cflow.c", Variant::O2_PIE, &[]);
    let b = bin.to_str().unwrap();
    // A round: zoo(), then bar() inside it, then via(): one complete instance.
    let prog = format!(
        "seq s[tid] {{ uprobe:{b}:zoo {{ }} uprobe:{b}:bar {{ }} uprobe:{b}:via {{ @done[tid] = count(); }} }}"
    );
    let cmd = format!("{b} 500 threads");
    let out = ok(&weft(&["trace", "-e", &prog, "-c", &cmd], T));
    let done = keyed(&out, "@done");
    assert_eq!(done.len(), 4, "{out}");
    assert!(done.values().all(|&c| c == 500), "{out}");
    assert!(!out.contains("@__seq"), "{out}");
}
