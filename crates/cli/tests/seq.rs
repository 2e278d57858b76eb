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

/// Issue 14's seed 2, as the issue states it: a multi-client server
/// (tests/targets/acct_server.c, a thread per client connection) calls
/// `handle_request(client_addr, path)` for each request, which reads a real file in
/// several `read()` calls. The aspect binds the client's address (a string) at
/// `handle_request` and sums the bytes of the libc `read` calls that follow in the
/// same thread: the `*` step fires several times per instance, the reads of the
/// request lines from the socket (outside `handle_request`) are not counted, and the
/// totals equal the ones the server prints itself.
#[test]
fn per_client_disk_accounting_equals_the_servers_own_totals() {
    let bin = build("acct_server.c", Variant::O2_PIE, &[]);
    let b = bin.to_str().unwrap();
    let dir = std::env::temp_dir().join(format!("weft-acct-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let (clients, rounds) = (4, 6);
    let cmd = format!("{b} {} {clients} {rounds}", dir.display());
    let prog = format!(
        "seq acct[tid] {{
             uprobe:{b}:handle_request {{ $client = str(arg0); }}
             uretprobe:libc:read /retval > 0/ {{ @bytes[$client] = sum(retval); @reads[$client] = count(); }}*
             uretprobe:{b}:handle_request {{ @requests[$client] = count(); }}
         }}"
    );
    let o = weft_with_input(&["trace", "-e", &prog, "-c", &cmd], &[], b"go\n", T);
    let stdout = ok(&o);
    // The server's own totals: `client ADDR bytes N requests R`.
    let (mut bytes, mut requests) = (BTreeMap::new(), BTreeMap::new());
    for l in stdout.lines().filter(|l| l.starts_with("client ")) {
        let f: Vec<&str> = l.split_whitespace().collect();
        bytes.insert(f[1].to_string(), f[3].parse::<i64>().unwrap());
        requests.insert(f[1].to_string(), f[5].parse::<i64>().unwrap());
    }
    assert_eq!(bytes.len(), clients, "{stdout}");
    assert_eq!(keyed(&stdout, "@bytes"), bytes, "{stdout}");
    assert_eq!(keyed(&stdout, "@requests"), requests, "{stdout}");
    // Client c asks for files (3c + i) % 7, i < rounds, file f being 1000 + 733 f
    // bytes, read 512 at a time: the `*` step fires that many times per request.
    let mut reads = BTreeMap::new();
    for c in 0..clients {
        let n: i64 = (0..rounds)
            .map(|i| (1000 + 733 * ((3 * c + i) % 7) as i64 + 511) / 512)
            .sum();
        reads.insert(format!("10.0.0.{}:{}", c + 1, 40000 + c), n);
    }
    assert_eq!(keyed(&stdout, "@reads"), reads, "{stdout}");
    assert!(!stdout.contains("@__seq"), "{stdout}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Instances keyed by an argument (held in the shared map, not the thread's state):
/// five live at once, their `*` steps interleaved, session k's firing
/// min(4, k + 1) times; a step for a key with no instance is ignored.
#[test]
fn map_held_instances_live_at_once_and_interleave() {
    let bin = build("sessions.c", Variant::O2_PIE, &[]);
    let b = bin.to_str().unwrap();
    let prog = format!(
        "seq s[arg0] {{
             uprobe:{b}:s_open {{ $opened = arg0 * 10; }}
             uprobe:{b}:s_step {{ @steps[arg0] = count(); @seen[arg0] = max($opened); }}*
             uprobe:{b}:s_close {{ @done[arg0] = count(); }}
         }}"
    );
    let cmd = format!("{b} 5 4");
    let stdout = ok(&weft(&["trace", "-e", &prog, "-c", &cmd], T));
    let want = |f: &dyn Fn(i64) -> i64| -> BTreeMap<String, i64> {
        (0..5).map(|k| (k.to_string(), f(k))).collect()
    };
    assert_eq!(
        keyed(&stdout, "@steps"),
        want(&|k| (k + 1).min(4)),
        "{stdout}"
    );
    assert_eq!(keyed(&stdout, "@seen"), want(&|k| k * 10), "{stdout}");
    assert_eq!(keyed(&stdout, "@done"), want(&|_| 1), "{stdout}");
    assert!(!stdout.contains("@__seq"), "{stdout}");
}

/// More instances live at once than the sequence's table holds: the first
/// `max_map_keys` start, the others do not, and stderr says how many, for which
/// sequence, and how to raise the bound (not a hidden map's name).
#[test]
fn instances_beyond_the_bound_are_counted_and_reported() {
    let bin = build("sessions.c", Variant::O2_PIE, &[]);
    let b = bin.to_str().unwrap();
    let prog = format!(
        "config = {{ max_map_keys = 3 }}
         seq s[arg0] {{
             uprobe:{b}:s_open {{ $opened = arg0; }}
             uprobe:{b}:s_step {{ @steps = count(); }}*
             uprobe:{b}:s_close {{ @done = count(); @last = max($opened); }}
         }}"
    );
    let cmd = format!("{b} 5 4");
    let o = weft(&["trace", "-e", &prog, "-c", &cmd], T);
    let (stdout, stderr) = (ok(&o), text(&o.stderr));
    // Sessions 0, 1 and 2 start (1 + 2 + 3 steps); 3 and 4 do not.
    assert_eq!(map_value(&stdout, "@steps"), Some(6), "{stdout}");
    assert_eq!(map_value(&stdout, "@done"), Some(3), "{stdout}");
    assert_eq!(map_value(&stdout, "@last"), Some(2), "{stdout}");
    let lines: Vec<&str> = stderr.lines().filter(|l| l.contains("seq s")).collect();
    assert_eq!(
        lines,
        vec![
            "weft: seq s: 2 sequence instances not started: its instance table was full \
             (3 instances; raise the bound with `config = { max_map_keys = N }`)"
        ],
        "{stderr}"
    );
    assert!(!stderr.contains("@__seq"), "{stderr}");
}
