//! Data pointcuts (`set:`, `get:`, `watchpoint:`) by hardware watchpoints: exact
//! counts of writes and reads, `old`/`new` along a known sequence, a field watched
//! while its neighbour is written, a heap object watched at an address a uprobe
//! learned, attach and detach, and the errors. Target: `tests/targets/data.c`.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

const T: Duration = Duration::from_secs(120);

/// The mechanisms each test forces in turn (`rewrite` where the accesses name
/// the variable: not for a heap object).
const MECHS: [&str; 3] = ["hw", "page", "rewrite"];

fn data(variant: Variant) -> PathBuf {
    build("data.c", variant, &[])
}

fn variants() -> [Variant; 2] {
    [
        Variant::O2_PIE,
        Variant {
            opt: "-O0",
            pie: false,
            cet: false,
        },
    ]
}

/// Writes to a global incremented by 4 threads (made after weft is in: the
/// events are inherited), counted exactly, per thread too.
#[test]
fn writes_from_four_threads_counted_exactly() {
    for (v, m) in variants().into_iter().flat_map(|v| MECHS.map(|m| (v, m))) {
        let bin = data(v);
        let b = bin.display();
        let prog = format!("set:{b}:counter {{ @w = count(); @t[tid] = count(); }}");
        let cmd = format!("{b} threads 20000");
        let out = weft(
            &["trace", "--data-mechanism", m, "-e", &prog, "-c", &cmd],
            T,
        );
        let stdout = ok(&out);
        let why = || format!("{} {m}: {stdout}\nstderr:\n{}", v.name(), text(&out.stderr));
        assert!(stdout.contains("done 80000"), "{}", why());
        assert_eq!(map_value(&stdout, "@w"), Some(80000), "{}", why());
        let per: Vec<i64> = keyed(&stdout, "@t").into_values().collect();
        assert_eq!(per, vec![20000; 4], "{}", why());
    }
}

/// `old` and `new` along `seq = 1, 2, ..., 5`; `func` is the writing function.
#[test]
fn old_and_new_along_a_sequence() {
    for (v, m) in variants().into_iter().flat_map(|v| MECHS.map(|m| (v, m))) {
        let bin = data(v);
        let b = bin.display();
        let prog = format!("set:{b}:seq {{ printf(\"%d -> %d in %s\\n\", old, new, func); }}");
        let cmd = format!("{b} seq 5");
        let stdout = ok(&weft(
            &["trace", "--data-mechanism", m, "-e", &prog, "-c", &cmd],
            T,
        ));
        let lines: Vec<&str> = stdout.lines().filter(|l| l.contains("->")).collect();
        assert_eq!(
            lines,
            [
                "0 -> 1 in main",
                "1 -> 2 in main",
                "2 -> 3 in main",
                "3 -> 4 in main",
                "4 -> 5 in main"
            ],
            "{} {m}: {stdout}",
            v.name()
        );
    }
}

/// `pair.a` watched while `pair.b`, its neighbour in the same 16 bytes, is
/// written 1000 times: one event, for the one write of `a`; an array element
/// likewise.
#[test]
fn a_field_watched_while_its_neighbour_is_written() {
    for m in MECHS {
        field_watched(m);
    }
}

fn field_watched(m: &str) {
    let bin = data(Variant::O2_PIE);
    let b = bin.display();
    let prog = format!(
        "set:{b}:pair.a {{ printf(\"a %d -> %d\\n\", old, new); @a = count(); }} \
         set:{b}:table[2] {{ printf(\"t2 %d\\n\", new); @t = count(); }}"
    );
    let cmd = format!("{b} field 1000");
    let stdout = ok(&weft(
        &["trace", "--data-mechanism", m, "-e", &prog, "-c", &cmd],
        T,
    ));
    assert!(stdout.contains("done 5 1000"), "{stdout}");
    assert!(stdout.contains("a 0 -> 5\n"), "{stdout}");
    assert!(stdout.contains("t2 9\n"), "{stdout}");
    assert_eq!(map_value(&stdout, "@a"), Some(1), "{stdout}");
    assert_eq!(map_value(&stdout, "@t"), Some(1), "{stdout}");
}

/// A heap word whose address a uprobe stored in `@p`: weft arms the watch when it
/// sees `@p` change (-v says so), then the target writes it 1000 times.
#[test]
fn a_heap_object_watched_at_an_address_a_uprobe_learned() {
    heap_object("hw", "hardware watchpoint");
    heap_object("page", "page protection");
}

/// The address is watched from the store on: the target writes the word right
/// after `got_object` returns (no file to wait for), and the advice that stored
/// `@p` waited for weft to arm the watch, so every write is seen, the first one
/// with `old` 0 (Arachne's alias pointcut: bind, then watch, nothing between).
#[test]
fn a_heap_object_is_watched_from_the_store_of_its_address_on() {
    let bin = data(Variant::O2_PIE);
    let b = bin.display();
    let prog = format!(
        "uprobe:{b}:got_object {{ @p = arg0; }} \
         set:addr(@p, 8) {{ @n = count(); @first = min(old); @last = new; @sum = sum(new - old); }}"
    );
    let cmd = format!("{b} heap 1000");
    for m in ["hw", "page"] {
        for round in 0..3 {
            let out = weft(
                &["trace", "--data-mechanism", m, "-e", &prog, "-c", &cmd],
                T,
            );
            let stdout = ok(&out);
            let why = format!("{m} round {round}: {stdout}\n{}", text(&out.stderr));
            assert!(stdout.contains("done 1000"), "{why}");
            assert_eq!(map_value(&stdout, "@n"), Some(1000), "{why}");
            assert_eq!(map_value(&stdout, "@first"), Some(0), "{why}");
            assert_eq!(map_value(&stdout, "@last"), Some(1000), "{why}");
            assert_eq!(map_value(&stdout, "@sum"), Some(1000), "{why}");
            assert!(!text(&out.stderr).contains("not watched in time"), "{why}");
        }
    }
}

/// Instruction rewriting cannot watch memory known only at run time: a clear
/// error, nothing woven.
#[test]
fn rewrite_refuses_an_address_learned_at_run_time() {
    let bin = data(Variant::O2_PIE);
    let b = bin.display();
    let prog =
        format!("uprobe:{b}:got_object {{ @p = arg0; }} set:addr(@p, 8) {{ @w = count(); }}");
    let cmd = format!("{b} heap 10");
    let out = weft(
        &[
            "trace",
            "--data-mechanism",
            "rewrite",
            "-e",
            &prog,
            "-c",
            &cmd,
        ],
        T,
    );
    assert!(!out.status.success());
    let e = text(&out.stderr);
    assert!(
        e.contains("set:addr(@p, 8): --data-mechanism rewrite rewrites the instructions that name a variable"),
        "{e}"
    );
}

/// Page protection on a heap word whose page the target's 4 threads share with
/// their malloc chunks, tcaches and stdio buffers (one arena), amid malloc, free,
/// large memset/memcpy (string instructions), snprintf and fprintf: exactly the
/// 4 × 2000 increments are seen, each by 1, and every block the threads filled
/// and copied came out right.
#[test]
fn a_page_watch_on_a_heap_page_busy_with_malloc_and_stdio() {
    let bin = data(Variant::O2_PIE);
    let b = bin.display();
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("data-heap");
    std::fs::create_dir_all(&dir).unwrap();
    let go = dir.join(format!("go-{}-mix", std::process::id()));
    let _ = std::fs::remove_file(&go);
    let prog = format!(
        "uprobe:{b}:got_object {{ @p = arg0; }} \
         set:addr(@p, 8) {{ @n = count(); @max = max(new); @step = sum(new - old); }}"
    );
    let cmd = format!("{b} heapmix 2000 {}", go.display());
    let mut w = Background::start(&[
        "trace",
        "-v",
        "--data-mechanism",
        "page",
        "-e",
        &prog,
        "-c",
        &cmd,
    ]);
    w.wait_line("set:addr(@p, 8): watching 8 bytes at", true, T);
    std::fs::write(&go, b"").unwrap();
    let out = w.finish(T);
    let _ = std::fs::remove_file(&go);
    let stdout = ok(&out);
    assert!(stdout.contains("done 8000 0\n"), "{stdout}");
    assert_eq!(map_value(&stdout, "@n"), Some(8000), "{stdout}");
    assert_eq!(map_value(&stdout, "@max"), Some(8000), "{stdout}");
    assert_eq!(map_value(&stdout, "@step"), Some(8000), "{stdout}");
}

fn heap_object(m: &str, describe: &str) {
    let bin = data(Variant::O2_PIE);
    let b = bin.display();
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("data-heap");
    std::fs::create_dir_all(&dir).unwrap();
    let go = dir.join(format!("go-{}-{m}", std::process::id()));
    let _ = std::fs::remove_file(&go);
    let prog = format!(
        "uprobe:{b}:got_object {{ @p = arg0; }} \
         set:addr(@p, 8) {{ @n = count(); @last = new; }}"
    );
    let cmd = format!("{b} heap 1000 {}", go.display());
    let mut w = Background::start(&[
        "trace",
        "-v",
        "--data-mechanism",
        m,
        "-e",
        &prog,
        "-c",
        &cmd,
    ]);
    w.wait_line("set:addr(@p, 8): watching 8 bytes at", true, T);
    std::fs::write(&go, b"").unwrap();
    let out = w.finish(T);
    let _ = std::fs::remove_file(&go);
    let stdout = ok(&out);
    assert!(stdout.contains("done 1000"), "{stdout}");
    assert_eq!(map_value(&stdout, "@n"), Some(1000), "{stdout}");
    assert_eq!(map_value(&stdout, "@last"), Some(1000), "{stdout}");
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains(&format!(
            "set:addr(@p, 8): data mechanism {m} ({describe}) on writes"
        )),
        "{stderr}"
    );
}

/// The target's own SIGTRAP handler still gets its own traps while weft's
/// watchpoint traps (the same signal) go to the advice.
#[test]
fn the_targets_own_sigtrap_is_unaffected() {
    let bin = data(Variant::O2_PIE);
    let b = bin.display();
    let prog = format!("set:{b}:seq {{ @n = count(); }}");
    let cmd = format!("{b} ownsig 50");
    let stdout = ok(&weft(&["trace", "-e", &prog, "-c", &cmd], T));
    assert!(stdout.contains("done 50\nown traps 50\n"), "{stdout}");
    assert_eq!(map_value(&stdout, "@n"), Some(50), "{stdout}");
}

/// `get`: 1000 reads of `source` counted (the one write that changes it is not);
/// `val` is the value read.
#[test]
fn reads_counted_by_a_get_pointcut() {
    for (v, m) in variants().into_iter().flat_map(|v| MECHS.map(|m| (v, m))) {
        let bin = data(v);
        let b = bin.display();
        let prog = format!("get:{b}:source {{ @r = count(); @v = sum(val); }}");
        let cmd = format!("{b} reads 1000");
        let stdout = ok(&weft(
            &["trace", "--data-mechanism", m, "-e", &prog, "-c", &cmd],
            T,
        ));
        assert!(stdout.contains("done 3000"), "{}: {stdout}", v.name());
        assert_eq!(
            map_value(&stdout, "@r"),
            Some(1000),
            "{}: {stdout}",
            v.name()
        );
        assert_eq!(
            map_value(&stdout, "@v"),
            Some(3000),
            "{}: {stdout}",
            v.name()
        );
    }
}

/// bpftrace's form: an absolute address (a non-PIE binary's global, from its
/// symbol table), its length and mode.
#[test]
fn bpftrace_watchpoint_form() {
    let v = Variant {
        opt: "-O2",
        pie: false,
        cet: true,
    };
    let bin = data(v);
    let elf = weft_symbol_addr(&bin, "seq");
    let prog = format!("watchpoint:{elf:#x}:8:w {{ @n = count(); @last = new; }}");
    let cmd = format!("{} seq 100", bin.display());
    let stdout = ok(&weft(&["trace", "-e", &prog, "-c", &cmd], T));
    assert_eq!(map_value(&stdout, "@n"), Some(100), "{stdout}");
    assert_eq!(map_value(&stdout, "@last"), Some(100), "{stdout}");
}

/// A symbol's address from `nm` (the test does not link weft's own crates).
fn weft_symbol_addr(bin: &Path, name: &str) -> u64 {
    let out = Command::new("nm").arg(bin).output().expect("running nm");
    let text = text(&out.stdout);
    let line = text
        .lines()
        .find(|l| l.split_whitespace().nth(2) == Some(name))
        .unwrap_or_else(|| panic!("no {name} in nm {}", bin.display()));
    u64::from_str_radix(line.split_whitespace().next().unwrap(), 16).unwrap()
}

/// `-p`: weft attaches, counts the writes of one round, detaches; the target runs
/// on (another round, no SIGTRAP) with no perf event of weft's left open, in it or
/// in a child it forked while woven.
#[test]
fn attach_then_detach_leaves_no_watchpoint() {
    let bin = data(Variant::O2_PIE);
    let mut target = Command::new(&bin)
        .args(["wait", "1000", "fork"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = target.stdin.take().unwrap();
    let mut lines = BufReader::new(target.stdout.take().unwrap()).lines();
    let mut next = || lines.next().unwrap().unwrap();
    assert_eq!(next(), "ready");
    let pid = target.id() as i32;
    let prog = format!("set:{}:counter {{ @w = count(); }}", bin.display());
    let mut w = Background::start(&["trace", "-v", "-e", &prog, "-p", &pid.to_string()]);
    w.wait_line("Attached 1 probe", true, T);
    assert!(
        perf_events(pid) > 0,
        "no perf event in the target while woven"
    );
    writeln!(stdin, "go").unwrap();
    assert_eq!(next(), "done 1000");
    // A child forked while woven: it closed its copies of the events at once (a
    // copy would keep the parent's watchpoints alive after weft leaves).
    let child: i32 = next().strip_prefix("child ").unwrap().parse().unwrap();
    assert_eq!(perf_events(child), 0, "the forked child holds perf events");
    w.signal(libc::SIGINT);
    let out = w.finish(T);
    let stdout = ok(&out);
    assert_eq!(map_value(&stdout, "@w"), Some(1000), "{stdout}");
    // The agent closes the events when the session ends.
    let deadline = Instant::now() + T;
    while perf_events(pid) > 0 {
        assert!(Instant::now() < deadline, "perf events left in the target");
        std::thread::sleep(Duration::from_millis(10));
    }
    writeln!(stdin, "again").unwrap();
    assert_eq!(next(), "done 2000");
    assert!(target.try_wait().unwrap().is_none(), "the target died");
    drop(stdin);
    let st = target.wait().unwrap();
    assert!(st.success(), "target ended with {st}");
}

/// `-p` into a process whose 4 threads exist before weft: each gets its event; a
/// round of 4 × 5000 writes counted exactly, per thread too.
#[test]
fn attach_to_threads_that_exist_counts_exactly() {
    let bin = data(Variant::O2_PIE);
    let mut target = Command::new(&bin)
        .args(["pool", "5000"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = target.stdin.take().unwrap();
    let mut lines = BufReader::new(target.stdout.take().unwrap()).lines();
    let mut next = || lines.next().unwrap().unwrap();
    assert_eq!(next(), "ready");
    let pid = target.id() as i32;
    let prog = format!(
        "set:{}:counter {{ @w = count(); @t[tid] = count(); }}",
        bin.display()
    );
    let mut w = Background::start(&["trace", "-e", &prog, "-p", &pid.to_string()]);
    w.wait_line("Attached 1 probe", true, T);
    writeln!(stdin, "go").unwrap();
    assert_eq!(next(), "done 20000");
    w.signal(libc::SIGINT);
    let stdout = ok(&w.finish(T));
    assert_eq!(map_value(&stdout, "@w"), Some(20000), "{stdout}");
    let per: Vec<i64> = keyed(&stdout, "@t").into_values().collect();
    assert_eq!(per, vec![5000; 4], "{stdout}");
    let _ = target.kill();
    let _ = target.wait();
}

/// weft killed (SIGKILL) while its watchpoints are armed: the agent closes them when
/// the socket closes, and the target's next writes trap nowhere.
#[test]
fn weft_killed_while_watching_leaves_the_target_unharmed() {
    let bin = data(Variant::O2_PIE);
    let mut target = Command::new(&bin)
        .args(["wait", "500"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = target.stdin.take().unwrap();
    let mut lines = BufReader::new(target.stdout.take().unwrap()).lines();
    let mut next = || lines.next().unwrap().unwrap();
    assert_eq!(next(), "ready");
    let pid = target.id() as i32;
    let prog = format!("set:{}:counter {{ @w = count(); }}", bin.display());
    let mut w = Background::start(&["trace", "-e", &prog, "-p", &pid.to_string()]);
    w.wait_line("Attached 1 probe", true, T);
    writeln!(stdin, "go").unwrap();
    assert_eq!(next(), "done 500");
    w.signal(libc::SIGKILL);
    let _ = w.finish(T);
    let deadline = Instant::now() + T;
    while perf_events(pid) > 0 {
        assert!(
            Instant::now() < deadline,
            "perf events left after weft died"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    for round in 2..=4 {
        writeln!(stdin, "again").unwrap();
        assert_eq!(next(), format!("done {}", round * 500));
    }
    drop(stdin);
    let st = target.wait().unwrap();
    assert!(st.success(), "target ended with {st}");
}

/// The target's descriptors that are perf events.
fn perf_events(pid: i32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| {
            d.filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
                .filter(|l| l.to_string_lossy().contains("perf_event"))
                .count()
        })
        .unwrap_or(0)
}

/// Bad input: a located error and a non-zero exit, before any process is touched.
#[test]
fn errors_are_located() {
    let bin = data(Variant::O2_PIE);
    let b = bin.display();
    let cmd = format!("{b} seq 3");
    let run = |prog: &str, extra: &[&str]| {
        let mut args = vec!["trace", "-e", prog, "-c", &cmd];
        args.extend_from_slice(extra);
        let out = weft(&args, T);
        assert!(!out.status.success(), "{prog}: weft succeeded");
        text(&out.stderr)
    };
    let e = run(&format!("set:{b}:countr {{ }}"), &[]);
    assert!(
        e.contains(&format!(
            "error: set:{b}:countr: no global or static variable `countr` in {b}; did you mean `counter`?"
        )) && e.contains(" --> -e:1:1"),
        "{e}"
    );
    let e = run(&format!("set:{b}:pair {{ }}"), &["--data-mechanism", "hw"]);
    assert!(
        e.contains("`pair` is 16 bytes: a hardware watchpoint watches 1, 2, 4 or 8"),
        "{e}"
    );
    let e = run(&format!("set:{b}:pair.c {{ }}"), &[]);
    assert!(e.contains("has no member `c`"), "{e}");
    let e = run(&format!("set:{b}:table[7] {{ }}"), &[]);
    assert!(
        e.contains("`table[7]`: index [7] is outside `int32[4]`"),
        "{e}"
    );
    let e = run(&format!("set:{b}:main {{ }}"), &[]);
    assert!(e.contains("(it is a function: use uprobe)"), "{e}");
    let e = run(&format!("get:{b}:source {{ print(old); }}"), &[]);
    assert!(
        e.contains("error: old can only be used in set probes") && e.contains(" --> -e:1:"),
        "{e}"
    );
    let e = run(&format!("set:{b}:seq {{ new = 3; }}"), &[]);
    assert!(
        e.contains("error: assigning `new` needs --unsafe") && e.contains(" --> -e:1:"),
        "{e}"
    );
    let e = run(&format!("get:{b}:source {{ new = 3; }}"), &["--unsafe"]);
    assert!(
        e.contains("error: assigning `new` can only be used in set probes"),
        "{e}"
    );
    let e = run(
        &format!("set:{b}:seq {{ }}"),
        &["--data-mechanism", "pages"],
    );
    assert!(
        e.contains("expected auto, hw, page or rewrite (direct)"),
        "{e}"
    );
}

/// Page protection: a watched word on a page with a hot one (written 100000
/// times): the hot writes are stepped over without advice, both end right, and
/// exactly the 1000 writes of the watched word are seen.
#[test]
fn a_watched_page_with_unrelated_hot_data() {
    let bin = data(Variant::O2_PIE);
    let b = bin.display();
    let prog = format!("set:{b}:shared.watched {{ @n = count(); @last = new; }}");
    let cmd = format!("{b} hot 100000");
    let stdout = ok(&weft(
        &["trace", "--data-mechanism", "page", "-e", &prog, "-c", &cmd],
        T,
    ));
    assert!(stdout.contains("done 100000 100000"), "{stdout}");
    assert_eq!(map_value(&stdout, "@n"), Some(1000), "{stdout}");
    assert_eq!(map_value(&stdout, "@last"), Some(100000), "{stdout}");
}

/// Page protection: an 8 KiB global filled 100 times by memset and memcpy (string
/// instructions or vector stores, done by the agent on the protected pages): one
/// event per fill for the watched element, with its new value, and the buffer
/// right.
#[test]
fn a_page_watch_under_memset_and_memcpy() {
    let bin = data(Variant::O2_PIE);
    let b = bin.display();
    let prog = format!("set:{b}:big.mid {{ @n = count(); @last = new; }}");
    let cmd = format!("{b} bulk 100");
    let stdout = ok(&weft(
        &["trace", "--data-mechanism", "page", "-e", &prog, "-c", &cmd],
        T,
    ));
    assert!(stdout.contains("done 0\n"), "{stdout}");
    assert_eq!(map_value(&stdout, "@n"), Some(100), "{stdout}");
    assert_eq!(
        map_value(&stdout, "@last"),
        Some(0x6464_6464_6464_6464),
        "{stdout}"
    );
}

/// Page protection: the target's own SIGSEGV handler gets its own faults (and
/// writes a global on the watched page from inside it), while weft's faults go to
/// the advice.
#[test]
fn the_targets_own_sigsegv_is_unaffected_by_a_page_watch() {
    let bin = data(Variant::O2_PIE);
    let b = bin.display();
    let prog = format!("set:{b}:seq {{ @n = count(); }}");
    let cmd = format!("{b} ownsegv 50");
    let stdout = ok(&weft(
        &["trace", "--data-mechanism", "page", "-e", &prog, "-c", &cmd],
        T,
    ));
    assert!(stdout.contains("done 50\nown faults 50\n"), "{stdout}");
    assert_eq!(map_value(&stdout, "@n"), Some(50), "{stdout}");
}

/// Five data pointcuts: the hardware takes four, the fifth falls back to page
/// protection (-v says so); a 16-byte struct (too wide for a hardware watchpoint)
/// too. Every count is exact.
#[test]
fn a_fifth_watch_and_a_wide_one_fall_back_to_page_protection() {
    let bin = data(Variant::O2_PIE);
    let b = bin.display();
    let prog = format!(
        "set:{b}:table[0], set:{b}:table[1], set:{b}:table[2], set:{b}:table[3] {{ @t = count(); }} \
         set:{b}:pair.b {{ @b = count(); }} set:{b}:pair {{ @p = count(); }}"
    );
    let cmd = format!("{b} field 1000");
    let out = weft(&["trace", "-v", "-e", &prog, "-c", &cmd], T);
    let stdout = ok(&out);
    let stderr = text(&out.stderr);
    assert!(stdout.contains("done 5 1000"), "{stdout}");
    assert_eq!(map_value(&stdout, "@t"), Some(2), "{stdout}");
    assert_eq!(map_value(&stdout, "@b"), Some(1000), "{stdout}");
    assert_eq!(map_value(&stdout, "@p"), Some(1001), "{stdout}");
    assert!(
        stderr.contains(&format!(
            "set:{b}:pair.b: falls back to page protection: the 4 hardware watchpoints are taken"
        )),
        "{stderr}"
    );
    assert!(
        stderr.contains(&format!(
            "set:{b}:pair: falls back to page protection: `pair` is 16 bytes"
        )),
        "{stderr}"
    );
    assert!(
        stderr.contains(&format!(
            "set:{b}:table[0]: data mechanism hw (hardware watchpoint)"
        )),
        "{stderr}"
    );
}

/// The permissions of the mapping holding `addr` in `pid`.
fn perms_at(pid: i32, addr: u64) -> String {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    for l in maps.lines() {
        let mut f = l.split_whitespace();
        let (range, perms) = (f.next().unwrap(), f.next().unwrap());
        let (a, e) = range.split_once('-').unwrap();
        let (a, e) = (
            u64::from_str_radix(a, 16).unwrap(),
            u64::from_str_radix(e, 16).unwrap(),
        );
        if a <= addr && addr < e {
            return perms.to_string();
        }
    }
    panic!("{addr:#x} not mapped in {pid}");
}

/// `-p` with a page watch: the page is read-only while woven (in a child forked
/// meanwhile too, until its agent gives it back), read-write again after weft
/// detached, and the target writes it on without faulting.
#[test]
fn detach_restores_the_pages_protection() {
    let bin = data(Variant {
        opt: "-O0",
        pie: false,
        cet: false,
    });
    let counter = weft_symbol_addr(&bin, "counter");
    let mut target = Command::new(&bin)
        .args(["wait", "1000", "fork"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = target.stdin.take().unwrap();
    let mut lines = BufReader::new(target.stdout.take().unwrap()).lines();
    let mut next = || lines.next().unwrap().unwrap();
    assert_eq!(next(), "ready");
    let pid = target.id() as i32;
    assert_eq!(perms_at(pid, counter), "rw-p");
    let prog = format!("set:{}:counter {{ @w = count(); }}", bin.display());
    let mut w = Background::start(&[
        "trace",
        "--data-mechanism",
        "page",
        "-e",
        &prog,
        "-p",
        &pid.to_string(),
    ]);
    w.wait_line("Attached 1 probe", true, T);
    assert_eq!(perms_at(pid, counter), "r--p");
    writeln!(stdin, "go").unwrap();
    assert_eq!(next(), "done 1000");
    let child: i32 = next().strip_prefix("child ").unwrap().parse().unwrap();
    assert_eq!(perms_at(child, counter), "rw-p", "the forked child's page");
    w.signal(libc::SIGINT);
    let stdout = ok(&w.finish(T));
    assert_eq!(map_value(&stdout, "@w"), Some(1000), "{stdout}");
    assert_eq!(perms_at(pid, counter), "rw-p");
    writeln!(stdin, "again").unwrap();
    assert_eq!(next(), "done 2000");
    assert!(target.try_wait().unwrap().is_none(), "the target died");
    drop(stdin);
    let st = target.wait().unwrap();
    assert!(st.success(), "target ended with {st}");
}

/// `-p` with `--data-mechanism rewrite`: weft rewrites the instructions that write
/// `counter` (-v lists each, read or write, with its function and offset), counts
/// one round exactly, and on detach gives the text back byte for byte; the target
/// runs on unharmed.
#[test]
fn rewrite_attach_then_detach_leaves_the_text_as_the_file() {
    for v in variants() {
        let bin = data(v);
        let mut target = Command::new(&bin)
            .args(["wait", "1000"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdin = target.stdin.take().unwrap();
        let mut lines = BufReader::new(target.stdout.take().unwrap()).lines();
        let mut next = || lines.next().unwrap().unwrap();
        assert_eq!(next(), "ready");
        let pid = target.id() as i32;
        let b = bin.display();
        let prog = format!("set:{b}:counter {{ @w = count(); @in[func] = count(); }}");
        let mut w = Background::start(&[
            "trace",
            "-v",
            "--data-mechanism",
            "rewrite",
            "-e",
            &prog,
            "-p",
            &pid.to_string(),
        ]);
        w.wait_line("Attached 1 probe", true, T);
        w.wait_line("weft: patched ", true, T);
        assert!(
            !code_matches_file(pid, &bin),
            "{}: nothing rewritten",
            v.name()
        );
        writeln!(stdin, "go").unwrap();
        assert_eq!(next(), "done 1000");
        w.signal(libc::SIGINT);
        let out = w.finish(T);
        let stdout = ok(&out);
        let stderr = text(&out.stderr);
        assert_eq!(
            map_value(&stdout, "@w"),
            Some(1000),
            "{}: {stdout}",
            v.name()
        );
        assert_eq!(
            keyed(&stdout, "@in").get("main"),
            Some(&1000),
            "{}: {stdout}",
            v.name()
        );
        assert!(
            stderr.contains(&format!(
                "set:{b}:counter: data mechanism rewrite (instruction rewriting)"
            )) && stderr.contains("from other modules (through the GOT) are not seen"),
            "{stderr}"
        );
        assert!(
            stderr
                .lines()
                .any(|l| l.contains(&format!("set:{b}:counter: write `"))
                    && l.contains(" in main+0x")
                    && l.ends_with("access site: jump to trampoline")),
            "{stderr}"
        );
        assert!(
            code_restored_within(pid, &bin, T),
            "{}: the text differs from the file after detach",
            v.name()
        );
        writeln!(stdin, "again").unwrap();
        assert_eq!(next(), "done 2000");
        drop(stdin);
        let st = target.wait().unwrap();
        assert!(st.success(), "target ended with {st}");
    }
}

/// `new = EXPR` under `--unsafe` changes the value written, with each mechanism:
/// `seq = i` becomes `seq = 10 * i` (the next write's `old` shows it), and in
/// `counter = counter + 1`, run 1000 times, each write adds 2.
#[test]
fn new_assigned_under_unsafe_changes_the_value_written() {
    for (v, m) in variants().into_iter().flat_map(|v| MECHS.map(|m| (v, m))) {
        let bin = data(v);
        let b = bin.display();
        let prog = format!("set:{b}:seq {{ printf(\"%d -> %d\\n\", old, new); new = new * 10; }}");
        let cmd = format!("{b} seq 5");
        let stdout = ok(&weft(
            &[
                "trace",
                "--unsafe",
                "--data-mechanism",
                m,
                "-e",
                &prog,
                "-c",
                &cmd,
            ],
            T,
        ));
        let lines: Vec<&str> = stdout.lines().filter(|l| l.contains("->")).collect();
        assert_eq!(
            lines,
            ["0 -> 1", "10 -> 2", "20 -> 3", "30 -> 4", "40 -> 5"],
            "{} {m}: {stdout}",
            v.name()
        );
        assert!(stdout.contains("done 50\n"), "{} {m}: {stdout}", v.name());
        let prog = format!("set:{b}:counter {{ new = new + 1; @w = count(); }}");
        let cmd = format!("{b} plain 1000");
        let stdout = ok(&weft(
            &[
                "trace",
                "--unsafe",
                "--data-mechanism",
                m,
                "-e",
                &prog,
                "-c",
                &cmd,
            ],
            T,
        ));
        assert!(stdout.contains("done 2000\n"), "{} {m}: {stdout}", v.name());
        assert_eq!(
            map_value(&stdout, "@w"),
            Some(1000),
            "{} {m}: {stdout}",
            v.name()
        );
    }
}

/// `many[600]` of a `long[1024]` (too many elements for weft's DWARF reader to
/// list: the offset comes from the element size), with each mechanism: its 1000
/// writes counted, not its neighbours'; an index past the end is refused.
#[test]
fn an_element_of_a_large_array() {
    for m in MECHS {
        let bin = data(Variant::O2_PIE);
        let b = bin.display();
        let prog = format!("set:{b}:many[600] {{ @n = count(); @last = new; }}");
        let cmd = format!("{b} many 1000");
        let stdout = ok(&weft(
            &["trace", "--data-mechanism", m, "-e", &prog, "-c", &cmd],
            T,
        ));
        assert!(stdout.contains("done 1000\n"), "{m}: {stdout}");
        assert_eq!(map_value(&stdout, "@n"), Some(1000), "{m}: {stdout}");
        assert_eq!(map_value(&stdout, "@last"), Some(1000), "{m}: {stdout}");
    }
    let bin = data(Variant::O2_PIE);
    let b = bin.display();
    let out = weft(
        &[
            "trace",
            "-e",
            &format!("set:{b}:many[1024] {{ }}"),
            "-c",
            &format!("{b} many 1"),
        ],
        T,
    );
    assert!(!out.status.success());
    let e = text(&out.stderr);
    assert!(
        e.contains("`many[1024]`: index [1024] is outside `int64[1024]`")
            && e.contains(" --> -e:1:1"),
        "{e}"
    );
}

/// `set:addr(@p, 4816)`, more than 255 bytes of a heap block: the 1000 writes of
/// word 600 and the one of word 601 are counted, not word 602's (just past the
/// range).
#[test]
fn a_heap_range_of_more_than_255_bytes() {
    for m in ["auto", "page"] {
        let bin = data(Variant::O2_PIE);
        let b = bin.display();
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("data-heap");
        std::fs::create_dir_all(&dir).unwrap();
        let go = dir.join(format!("go-{}-big-{m}", std::process::id()));
        let _ = std::fs::remove_file(&go);
        let prog = format!(
            "uprobe:{b}:got_object {{ @p = arg0; }} set:addr(@p, 4816) {{ @n = count(); }}"
        );
        let cmd = format!("{b} heapbig 1000 {}", go.display());
        let mut w = Background::start(&[
            "trace",
            "-v",
            "--data-mechanism",
            m,
            "-e",
            &prog,
            "-c",
            &cmd,
        ]);
        w.wait_line("set:addr(@p, 4816): watching 4816 bytes at", true, T);
        std::fs::write(&go, b"").unwrap();
        let out = w.finish(T);
        let _ = std::fs::remove_file(&go);
        let stdout = ok(&out);
        assert!(stdout.contains("done 1000\n"), "{m}: {stdout}");
        assert_eq!(map_value(&stdout, "@n"), Some(1001), "{m}: {stdout}");
    }
}

/// Two `set` pointcuts on one variable share each rewritten instruction's site
/// (advice in program order); one on overlapping other bytes is refused, naming
/// the first.
#[test]
fn rewrite_two_pointcuts_on_one_variable() {
    let bin = data(Variant::O2_PIE);
    let b = bin.display();
    let prog = format!("set:{b}:seq {{ @a = count(); }} set:{b}:seq /new > 2/ {{ @b = count(); }}");
    let cmd = format!("{b} seq 5");
    let stdout = ok(&weft(
        &[
            "trace",
            "--data-mechanism",
            "rewrite",
            "-e",
            &prog,
            "-c",
            &cmd,
        ],
        T,
    ));
    assert_eq!(map_value(&stdout, "@a"), Some(5), "{stdout}");
    assert_eq!(map_value(&stdout, "@b"), Some(3), "{stdout}");
    let prog = format!("set:{b}:pair {{ }} set:{b}:pair.b {{ }}");
    let cmd = format!("{b} field 5");
    let out = weft(
        &[
            "trace",
            "--data-mechanism",
            "rewrite",
            "-e",
            &prog,
            "-c",
            &cmd,
        ],
        T,
    );
    assert!(!out.status.success());
    let e = text(&out.stderr);
    assert!(
        e.contains(&format!("set:{b}:pair.b: the instruction at 0x"))
            && e.contains(&format!("is rewritten for set:{b}:pair already")),
        "{e}"
    );
}

/// weft killed (SIGKILL) while instructions are rewritten: the agent writes the
/// original bytes back when the socket closes (the text equals the file again) and
/// the target runs on.
#[test]
fn weft_killed_while_rewriting_leaves_the_text_as_the_file() {
    let bin = data(Variant::O2_PIE);
    let mut target = Command::new(&bin)
        .args(["wait", "500"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = target.stdin.take().unwrap();
    let mut lines = BufReader::new(target.stdout.take().unwrap()).lines();
    let mut next = || lines.next().unwrap().unwrap();
    assert_eq!(next(), "ready");
    let pid = target.id() as i32;
    let prog = format!("set:{}:counter {{ @w = count(); }}", bin.display());
    let mut w = Background::start(&[
        "trace",
        "-v",
        "--data-mechanism",
        "rewrite",
        "-e",
        &prog,
        "-p",
        &pid.to_string(),
    ]);
    w.wait_line("weft: patched ", true, T);
    writeln!(stdin, "go").unwrap();
    assert_eq!(next(), "done 500");
    w.signal(libc::SIGKILL);
    let _ = w.finish(T);
    assert!(
        code_restored_within(pid, &bin, T),
        "the text differs from the file after weft died"
    );
    for round in 2..=4 {
        writeln!(stdin, "again").unwrap();
        assert_eq!(next(), format!("done {}", round * 500));
    }
    drop(stdin);
    let st = target.wait().unwrap();
    assert!(st.success(), "target ended with {st}");
}

/// `uaddr` of a global variable points to a value of its width, as upstream types it
/// (a 1, 2 or 4-byte variable that width, a larger one 64 bits); a function's
/// address points to a byte.
#[test]
fn uaddr_of_a_global_reads_its_width() {
    let bin = data(Variant::O2_PIE);
    let b = bin.display().to_string();
    let prog = format!(
        "uprobe:{b}:main {{ printf(\"%d %d %d\\n\", *uaddr(\"source\"), sizeof(*uaddr(\"source\")), sizeof(*uaddr(\"main\"))); }}"
    );
    let out = ok(&weft(&["-e", &prog, "-c", &format!("{b} reads 1")], T));
    assert!(
        out.contains("\n3 8 1\n") || out.starts_with("3 8 1\n"),
        "{out}"
    );
}

/// Statics by name: a file's `static` and a function's (the symbol table calls it
/// `calls.0`; DWARF gives its address), each written 500 times: counted exactly,
/// with their last value, under each mechanism and build.
#[test]
fn static_variables_by_name() {
    for v in variants() {
        let bin = data(v);
        let b = bin.display();
        let prog = format!(
            "set:{b}:file_static {{ @f = count(); @lf = new; }} \
             set:{b}:calls {{ @c = count(); @lc = new; }}"
        );
        let cmd = format!("{b} misc 500");
        for m in ["hw", "page", "rewrite"] {
            let stdout = ok(&weft(
                &["trace", "--data-mechanism", m, "-e", &prog, "-c", &cmd],
                T,
            ));
            assert!(stdout.contains("done 500 500 500 500\n"), "{m}: {stdout}");
            for (name, want) in [("@f", 500), ("@lf", 500), ("@c", 500), ("@lc", 500)] {
                assert_eq!(
                    map_value(&stdout, name),
                    Some(want),
                    "{m} {}: {name}: {stdout}",
                    v.name()
                );
            }
        }
    }
}

/// What cannot be watched says why and what to use instead: a symbol with no size
/// (defined in assembly, no DWARF), a parameter and a local (in registers: the
/// message names the function and the uprobe to read them with, and that uprobe
/// works), and a name nothing has (the local-variable hint, always).
#[test]
fn variables_that_cannot_be_watched_name_the_alternative() {
    for v in variants() {
        let bin = data(v);
        let b = bin.display();
        let cmd = format!("{b} misc 10");
        let run = |prog: &str| {
            let out = weft(&["trace", "-e", prog, "-c", &cmd], T);
            assert!(!out.status.success(), "{prog}: weft succeeded");
            text(&out.stderr)
        };
        let e = run(&format!("set:{b}:bare {{ }}"));
        assert!(
            e.contains(&format!(
                "error: set:{b}:bare: `bare` has no size in the symbol table and no type \
                 in DWARF: weft cannot tell which bytes to watch"
            )) && e.contains(" --> -e:1:1"),
            "{e}"
        );
        let e = run(&format!("set:{b}:factor {{ }}"));
        assert!(
            e.contains(&format!(
                "`factor` is a parameter of `scale`: it lives in a register or on the stack, \
                 with no fixed address to watch; read it where `scale` starts: \
                 `uprobe:{b}:scale {{ print(args.factor); }}`"
            )) && e.contains(" --> -e:1:1"),
            "{e}"
        );
        let e = run(&format!("get:{b}:scaled {{ }}"));
        assert!(
            e.contains(
                "`scaled` is a local variable of `scale`: it lives in a register or on the stack"
            ) && e.contains(&format!("`uprobe:{b}:scale {{ print(args); }}`"))
                && e.contains(&format!("`uretprobe:{b}:scale {{ print(retval); }}`")),
            "{e}"
        );
        let e = run(&format!("set:{b}:nothing_here {{ }}"));
        assert!(
            e.contains("no global or static variable `nothing_here`")
                && e.contains(
                    "(if it is a local variable or a parameter, it lives in a register or on \
                     the stack: read it in a uprobe on its function, with args)"
                ),
            "{e}"
        );
        // A near name is suggested, and the hint is still there.
        let e = run(&format!("set:{b}:file_statik {{ }}"));
        assert!(
            e.contains("did you mean `file_static`?") && e.contains("read it in a uprobe"),
            "{e}"
        );
        // The alternative the message gives works: 1 + 2 + ... + 10. And a symbol
        // with no size whose type DWARF has (from a C declaration) is watched with
        // DWARF's size.
        let stdout = ok(&weft(
            &[
                "trace",
                "-e",
                &format!(
                    "uprobe:{b}:scale {{ @s = sum(args.factor); }} \
                     set:{b}:nosize {{ @n = count(); @last = new; }}"
                ),
                "-c",
                &cmd,
            ],
            T,
        ));
        assert_eq!(map_value(&stdout, "@s"), Some(55), "{}: {stdout}", v.name());
        assert_eq!(map_value(&stdout, "@n"), Some(10), "{}: {stdout}", v.name());
        assert_eq!(
            map_value(&stdout, "@last"),
            Some(10),
            "{}: {stdout}",
            v.name()
        );
    }
}

/// An unaligned member (a packed struct's `long` at offset 1): a hardware
/// watchpoint cannot take it, so `auto` uses page protection and `-v` says why;
/// `hw` is refused with the reason; every write is counted.
#[test]
fn an_unaligned_member_falls_back_to_page_protection() {
    let bin = data(Variant::O2_PIE);
    let b = bin.display();
    let prog = format!("set:{b}:packed_rec.v {{ @n = count(); @last = new; }}");
    let cmd = format!("{b} misc 300");
    let out = weft(&["trace", "-v", "-e", &prog, "-c", &cmd], T);
    let stdout = ok(&out);
    assert_eq!(map_value(&stdout, "@n"), Some(300), "{stdout}");
    assert_eq!(map_value(&stdout, "@last"), Some(300), "{stdout}");
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains(
            "falls back to page protection: `packed_rec.v` is not aligned to its size (8 \
             bytes): a hardware watchpoint cannot watch it"
        ),
        "{stderr}"
    );
    let out = weft(
        &["trace", "--data-mechanism", "hw", "-e", &prog, "-c", &cmd],
        T,
    );
    assert!(!out.status.success());
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("`packed_rec.v` is not aligned to its size (8 bytes)"),
        "{stderr}"
    );
}

/// `set:addr` at an address a uprobe learned that turns out unaligned (a packed
/// record's `long`, one byte into a heap block): `auto` falls back to page
/// protection (-v says so) and counts every write; `hw` says, without -v, that it
/// cannot watch it, and the target runs to its end.
#[test]
fn an_unaligned_address_falls_back_to_page_protection() {
    let bin = data(Variant::O2_PIE);
    let b = bin.display();
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("data-heap");
    std::fs::create_dir_all(&dir).unwrap();
    let prog = format!(
        "uprobe:{b}:got_object {{ @p = arg0 + 1; }} \
         set:addr(@p, 8) {{ @n = count(); @last = new; }}"
    );
    for (m, want) in [
        ("auto", "falls back to page protection"),
        ("hw", "not watched"),
    ] {
        let go = dir.join(format!("go-{}-odd-{m}", std::process::id()));
        let _ = std::fs::remove_file(&go);
        let cmd = format!("{b} odd 400 {}", go.display());
        let mut args = vec!["trace", "--data-mechanism", m, "-e", &prog, "-c", &cmd];
        if m == "auto" {
            args.insert(1, "-v");
        }
        let mut w = Background::start(&args);
        w.wait_line(want, true, T);
        std::fs::write(&go, b"").unwrap();
        let out = w.finish(T);
        let _ = std::fs::remove_file(&go);
        let stdout = ok(&out);
        let stderr = text(&out.stderr);
        assert!(stdout.contains("done 400\n"), "{m}: {stdout}");
        if m == "auto" {
            assert!(
                stderr.contains("is not aligned to 8 bytes: falls back to page protection"),
                "{stderr}"
            );
            assert_eq!(map_value(&stdout, "@n"), Some(400), "{stdout}");
            assert_eq!(map_value(&stdout, "@last"), Some(400), "{stdout}");
        } else {
            assert!(
                stderr.contains(
                    "is not aligned to 8 bytes: a hardware watchpoint cannot watch it, and \
                     --data-mechanism hw allows nothing else; not watched"
                ),
                "{stderr}"
            );
            assert_eq!(map_value(&stdout, "@n").unwrap_or(0), 0, "{stdout}");
        }
    }
}

/// bpftrace's `watchpoint:` modes `r` and `rw` (and `w`) on a global read 200
/// times, written 200 times, then read once more (printed): `r` counts the 201
/// reads (an access that leaves the value unchanged), `w` the 200 writes, `rw`
/// all 401.
#[test]
fn watchpoint_read_and_read_write_modes() {
    let v = Variant {
        opt: "-O2",
        pie: false,
        cet: true,
    };
    let bin = data(v);
    let addr = weft_symbol_addr(&bin, "source");
    let cmd = format!("{} rw 200", bin.display());
    for (mode, want) in [("r", 201), ("w", 200), ("rw", 401)] {
        let prog = format!("watchpoint:{addr:#x}:8:{mode} {{ @n = count(); }}");
        let stdout = ok(&weft(&["trace", "-e", &prog, "-c", &cmd], T));
        assert!(stdout.contains("done 600 200\n"), "{mode}: {stdout}");
        assert_eq!(map_value(&stdout, "@n"), Some(want), "{mode}: {stdout}");
    }
}

/// `ip` in data advice is the accessing instruction under every mechanism (a
/// hardware watchpoint traps after it: weft finds the instruction that ends
/// there; page protection decodes the faulting one; rewrite knows it), and `func`
/// its function: one address, the same for hw, page and rewrite, where objdump
/// shows the access to the variable. For a write (`set:seq`) and a read
/// (`get:source`), at -O0 and -O2.
#[test]
fn ip_is_the_accessing_instruction_under_every_mechanism() {
    for v in [
        Variant {
            opt: "-O0",
            pie: false,
            cet: false,
        },
        Variant {
            opt: "-O2",
            pie: false,
            cet: true,
        },
    ] {
        let bin = data(v);
        let b = bin.display();
        let dump = text(
            &Command::new("objdump")
                .args(["-d", "--no-show-raw-insn"])
                .arg(&bin)
                .output()
                .expect("objdump")
                .stdout,
        );
        for (mode, pointcut, var) in [("seq 5", "set", "seq"), ("reads 5", "get", "source")] {
            let prog = format!("{pointcut}:{b}:{var} {{ @ip[ip] = count(); @f[func] = count(); }}");
            let cmd = format!("{b} {mode}");
            let mut seen = Vec::new();
            for m in ["hw", "page", "rewrite"] {
                let stdout = ok(&weft(
                    &["trace", "--data-mechanism", m, "-e", &prog, "-c", &cmd],
                    T,
                ));
                let ips = keyed(&stdout, "@ip");
                assert_eq!(ips.len(), 1, "{m} {}: {stdout}", v.name());
                let (ip, n) = ips.into_iter().next().unwrap();
                assert_eq!(n, 5, "{m} {}: {stdout}", v.name());
                assert_eq!(map_value(&stdout, "@f[main]"), Some(5), "{m}: {stdout}");
                let ip: u64 = ip.parse().unwrap();
                let line = dump
                    .lines()
                    .find(|l| l.trim_start().starts_with(&format!("{ip:x}:")))
                    .unwrap_or_else(|| panic!("{m} {}: no instruction at {ip:#x}", v.name()));
                assert!(
                    line.contains(&format!("<{var}>")),
                    "{m} {}: {ip:#x} is `{line}`, not an access to {var}",
                    v.name()
                );
                seen.push(ip);
            }
            assert!(seen.iter().all(|&ip| ip == seen[0]), "{var}: {seen:x?}");
        }
    }
}

/// bpftrace's `watchpoint:FUNC+argN:LEN:MODE`: from each entry of FUNC on, the
/// address its argument N holds is watched (the entry waits until it is, so the
/// function's own write is seen); two probes on the same bytes both run, in
/// order; `unwatch(addr)` stops it before the advice goes on; `probe` names the
/// program and the function as upstream does; without a target it is refused.
#[test]
fn watchpoint_on_a_functions_argument() {
    let bin = build("wpfunc.c", Variant::O2_PIE, &[]);
    let b = bin.display().to_string();
    let cmd = format!("{b} 5");
    // Each call's write and main's write after it: 10, values 1..=10.
    let prog = "watchpoint:increment+arg1:4:w { @n = count(); @max = max(new); \
                @sum = sum(new - old); @p[probe] = count(); }";
    let o = weft(&["-e", prog, "-c", &cmd], T);
    let out = ok(&o);
    let why = format!("{out}\n{}", text(&o.stderr));
    assert!(out.contains("a=10 b=4"), "{why}");
    assert_eq!(map_value(&out, "@n"), Some(10), "{why}");
    assert_eq!(map_value(&out, "@max"), Some(10), "{why}");
    assert_eq!(map_value(&out, "@sum"), Some(10), "{why}");
    let name = format!("@p[watchpoint:{b}:increment:4:w]: 10");
    assert!(out.contains(&name), "{name} in {why}");
    assert!(!out.contains("__seq_watch"), "hidden maps printed: {why}");
    // Two probes on the same bytes: both, in the program's order, each time.
    let prog = "watchpoint:increment+arg1:4:w { printf(\"first\"); } \
                asyncwatchpoint:increment+arg1:4:w { printf(\" second\\n\"); }";
    let o = weft(&["-e", prog, "-c", &cmd], T);
    let out = ok(&o);
    let lines = out.lines().filter(|l| *l == "first second").count();
    assert_eq!(lines, 10, "{out}");
    // unwatch: bump's write is seen, main's two after it are not.
    let prog = format!(
        "uprobe:{b}:bump {{ @addr = arg0; }} \
         watchpoint:bump+arg0:4:w {{ @w = count(); @v = max(new); unwatch(@addr); }}"
    );
    let o = weft(&["-e", &prog, "-c", &cmd], T);
    let out = ok(&o);
    assert_eq!(map_value(&out, "@w"), Some(1), "{out}");
    assert_eq!(map_value(&out, "@v"), Some(2), "{out}");
    // No target: the function is the target program's.
    let o = weft(
        &["-e", "watchpoint:increment+arg1:4:w { @n = count(); }"],
        T,
    );
    assert!(!o.status.success());
    let err = text(&o.stderr);
    assert!(
        err.contains("a watchpoint on a function's argument needs a target process"),
        "{err}"
    );
    let o = weft(
        &[
            "-e",
            "watchpoint:increment+arg9:4:w { @n = count(); }",
            "-c",
            &cmd,
        ],
        T,
    );
    assert!(!o.status.success());
    assert!(
        text(&o.stderr).contains("N from 0 to 5"),
        "{}",
        text(&o.stderr)
    );
}
