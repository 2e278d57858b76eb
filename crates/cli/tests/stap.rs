//! `weft stap`: SystemTap scripts on weft's engine. The seed's three examples run
//! unchanged (`/work/shared/seeds/001_*`), then the language against
//! `tests/targets/stap.c` with exact outputs, then bad input.

mod common;

use std::time::Duration;

use common::*;

const T: Duration = Duration::from_secs(120);

fn stap_target() -> String {
    build("stap.c", Variant::O2_PIE, &[])
        .to_str()
        .unwrap()
        .to_string()
}

/// A script in a `.stp` file of its own (the tests run in parallel).
fn script(name: &str, text: &str) -> String {
    let dir = std::env::temp_dir().join(format!("weft-stap-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join(format!("{name}.stp"));
    std::fs::write(&p, text).unwrap();
    p.to_str().unwrap().to_string()
}

/// weft's output lines, without the target's (which share stdout).
fn weft_lines(stdout: &str, target_lines: &[&str]) -> Vec<String> {
    stdout
        .lines()
        .filter(|l| !target_lines.iter().any(|t| l.starts_with(t)))
        .map(str::to_string)
        .collect()
}

const TOP_SYSCALLS: &str = "global syscount

probe syscall.* {
    syscount[name] += 1
}

probe end {
    foreach (count = name in syscount - limit 10)
        printf(\"%6d %s\\n\", count, name)
}
";

#[test]
fn seed_top_syscalls_counts_the_commands_system_calls() {
    // tp 5 30: five work() calls of 30 getppid() each.
    let cmd = format!("{} 5 30", tp());
    let file = script("top", TOP_SYSCALLS);
    let out = weft(&["stap", &file, "-c", &cmd], T);
    let stdout = ok(&out);
    let rows: Vec<(i64, String)> = stdout
        .lines()
        .filter_map(|l| {
            let (n, name) = l.trim_start().split_once(' ')?;
            Some((n.parse().ok()?, name.to_string()))
        })
        .collect();
    assert!(!rows.is_empty() && rows.len() <= 10, "{stdout}");
    assert!(rows.contains(&(150, "getppid".to_string())), "{stdout}");
    // `%6d %s`, by count, most first.
    for l in stdout.lines().filter(|l| l.ends_with("getppid")) {
        assert_eq!(l, "   150 getppid");
    }
    let counts: Vec<i64> = rows.iter().map(|r| r.0).collect();
    let mut sorted = counts.clone();
    sorted.sort_by(|a, b| b.cmp(a));
    assert_eq!(counts, sorted, "{stdout}");
}

#[test]
fn seed_top_syscalls_through_weft_trace_and_a_bare_stp_file() {
    let cmd = format!("{} 2 7", tp());
    let file = script("top_trace", TOP_SYSCALLS);
    for args in [
        vec!["trace", file.as_str(), "-c", &cmd],
        vec![file.as_str(), "-c", &cmd],
    ] {
        let stdout = ok(&weft(&args, T));
        assert!(stdout.lines().any(|l| l == "    14 getppid"), "{stdout}");
    }
}

#[test]
fn seed_scheduler_tracer_prints_the_targets_on_cpu_times() {
    let file = script(
        "sched",
        "global on_times

probe scheduler.cpu_on {
    if (pid() == target())
        on_times[tid()] = local_clock_ns()
}

probe scheduler.cpu_off {
    if (tid() in on_times) {
        delta = local_clock_ns() - on_times[tid()]
        printf(\"%3d %5d %5d %10d\\n\",
            cpu(), pid(), tid(), delta)
        delete on_times[tid()]
    }
}

probe begin {
    printf(\"%3s %5s %5s %10s\\n\",
        \"CPU\", \"PID\", \"TID\", \"DELTA(ns)\")
}
",
    );
    // The shell waits for each sleep: off the CPU, back on, off again (a row).
    let out = weft(
        &[
            "stap",
            &file,
            "-c",
            "sh -c 'sleep 0.02; sleep 0.02; sleep 0.02'",
        ],
        T,
    );
    let stdout = ok(&out);
    let lines = weft_lines(&stdout, &[]);
    assert!(
        lines.iter().any(|l| l == "CPU   PID   TID  DELTA(ns)"),
        "{stdout}"
    );
    let rows: Vec<Vec<i64>> = lines
        .iter()
        .filter(|l| !l.starts_with("CPU"))
        .map(|l| {
            l.split_whitespace()
                .map(|f| f.parse().unwrap_or_else(|_| panic!("row {l:?}")))
                .collect()
        })
        .collect();
    assert!(!rows.is_empty(), "{stdout}");
    let pid = rows[0][1];
    for r in &rows {
        assert_eq!(r.len(), 4, "{stdout}");
        // Only the target's threads, and a time on the CPU.
        assert_eq!(r[1], pid, "{stdout}");
        assert!(r[2] >= pid && r[3] > 0, "{stdout}");
    }
}

#[test]
fn seed_every_mark_prints_its_name() {
    let bin = build("sdt.c", Variant::O2_PIE, &[]);
    let cmd = format!("{} 3", bin.display());
    let out = weft(
        &[
            "stap",
            "-e",
            "probe process.mark(\"*\") { println($$name) }",
            "-c",
            &cmd,
        ],
        T,
    );
    let stdout = ok(&out);
    assert_eq!(
        weft_lines(&stdout, &["s=", "enabled"]),
        ["work", "tick", "work", "tick", "work", "tick"],
        "{stdout}"
    );
}

#[test]
fn functions_returns_entry_values_statistics_and_sorted_foreach() {
    let bin = stap_target();
    let file = script(
        "feat",
        &format!(
            r#"global calls, rets, lats, names, total
function twice(x) {{ return x * 2 }}
function classify(v) {{
  if (v < 20) return "small"
  return "big"
}}
probe process("{bin}").function("work") {{
  calls[$n % 3] += 1
  if ($n < 2) printf("work n=%d x=%d y=%d %s\n", $n, $p->x, $p->y, user_string($p->name))
}}
probe process("{bin}").function("work").return {{
  rets[@entry($n)] = $return
  total += twice($return)
}}
probe process("{bin}").function("lat") {{ lats <<< $v }}
probe process("{bin}").function("label").return {{ names[user_string($return)]++ }}
probe end {{
  foreach (k+ in calls) printf("calls[%d]=%d\n", k, calls[k])
  foreach ([k] in rets- limit 3) printf("ret %d -> %d %s\n", k, rets[k], classify(rets[k]))
  printf("count=%d sum=%d min=%d max=%d avg=%d\n", @count(lats), @sum(lats), @min(lats), @max(lats), @avg(lats))
  print(@hist_log(lats))
  println("odd ", names["odd"], " even ", names["even"])
  i = 0
  while (i < 3) {{ i++ }}
  for (j = 0; j < 2; j++) {{ i += 10 }}
  println("i=", i, " total=", total, " ", sprintf("<%d:%s>", 7, "x") . "!")
}}
"#
        ),
    );
    let cmd = format!("{bin} 10");
    let stdout = ok(&weft(&["stap", &file, "-c", &cmd], T));
    let expected = "work n=0 x=3 y=4 pt
work n=1 x=3 y=4 pt
calls[0]=4
calls[1]=3
calls[2]=3
ret 9 -> 21 big
ret 8 -> 19 small
ret 7 -> 17 small
count=10 sum=450 min=0 max=90 avg=45
value |-------------------------------------------------- count
    0 |@                                                  1
    1 |                                                   0
    2 |                                                   0
    4 |                                                   0
    8 |@                                                  1
   16 |@@                                                 2
   32 |@@@                                                3
   64 |@@@                                                3
  128 |                                                   0
  256 |                                                   0

odd 5 even 5
i=23 total=240 <7:x>!
";
    assert_eq!(weft_lines(&stdout, &["s="]).join("\n") + "\n", expected);
}

#[test]
fn linear_histograms_multi_key_arrays_and_globals_printed_at_the_end() {
    let bin = stap_target();
    let file = script(
        "linear",
        &format!(
            r#"global h, pairs, unread, last
probe process("{bin}").function("lat") {{
  h <<< $v
  pairs[$v % 20, $v < 50] += 1
  unread[$v / 30] = $v
  last = $v
}}
probe process("{bin}").function("label") {{ next; printf("never\n") }}
probe end {{
  print(@hist_linear(h, 0, 60, 20))
  foreach ([a, b] in pairs) printf("%d,%d: %d\n", a, b, pairs[a, b])
  if ([0, 1] in pairs && !([5, 5] in pairs)) println("in")
  delete pairs[0, 1]
  if (!([0, 1] in pairs)) println("deleted")
}}
"#
        ),
    );
    let cmd = format!("{bin} 10");
    let stdout = ok(&weft(&["stap", &file, "-c", &cmd], T));
    let lines = weft_lines(&stdout, &["s="]);
    // v = 0, 10, ..., 90: [0, 20) [20, 40) [40, 60) [60, 80), and over (SystemTap labels
    // it with the last bucket it is not in: ">60").
    let hist = "value |-------------------------------------------------- count
    0 |@@                                                 2
   20 |@@                                                 2
   40 |@@                                                 2
   60 |@@                                                 2
  >60 |@@                                                 2
";
    assert_eq!(lines[..6].join("\n") + "\n", hist, "{stdout}");
    let mut pairs: Vec<&str> = lines
        .iter()
        .filter(|l| l.contains(": "))
        .map(String::as_str)
        .collect();
    pairs.sort();
    assert_eq!(
        pairs,
        ["0,0: 2", "0,1: 3", "10,0: 3", "10,1: 2"],
        "{stdout}"
    );
    assert!(lines.iter().any(|l| l == "in") && lines.iter().any(|l| l == "deleted"));
    assert!(!stdout.contains("never"));
    // Never read: printed at the end as SystemTap does.
    let mut unread: Vec<&str> = lines
        .iter()
        .filter(|l| l.starts_with("unread["))
        .map(String::as_str)
        .collect();
    unread.sort();
    assert_eq!(
        unread,
        [
            "unread[0]=20",
            "unread[1]=50",
            "unread[2]=80",
            "unread[3]=90"
        ]
    );
    assert!(lines.iter().any(|l| l == "last=90"), "{stdout}");
}

#[test]
fn attach_with_x_target_and_mark_arguments() {
    let bin = build("sdt.c", Variant::O2_PIE, &[]);
    let mut t = Spawned::start(&bin, &["0", "loop"]);
    t.wait_line("ready", T);
    let pid = t.child.id().to_string();
    let out = weft(
        &[
            "stap",
            "-x",
            &pid,
            "-e",
            "global n, args
             probe process.mark(\"work\") { n++; args[$arg1 * 3 == $arg2] += 1; if (n >= 5) exit() }
             probe end { printf(\"%d marks in %d, %d right\\n\", n, target(), args[1]) }",
        ],
        T,
    );
    let stdout = ok(&out);
    // exit() is asynchronous, as in SystemTap: marks that fire before the probes are
    // out still count.
    let f: Vec<&str> = stdout.split_whitespace().collect();
    assert_eq!(
        (f.len(), f[1], f[2], f[3], f[5]),
        (6, "marks", "in", format!("{pid},").as_str(), "right"),
        "{stdout}"
    );
    let (n, right): (i64, i64) = (f[0].parse().unwrap(), f[4].parse().unwrap());
    assert!(n >= 5 && right == n, "{stdout}");
    // The target goes on.
    let _ = t.child.kill();
    let _ = t.child.wait();
}

#[test]
fn parms_return_strings_and_typed_return() {
    let bin = stap_target();
    let file = script(
        "parms",
        &format!(
            r#"probe process("{bin}").function("lat") {{ if ($v == 30) println($$parms) }}
probe process("{bin}").function("lat").return {{ if ($v == 30) printf("%s | %s\n", $$return, $$parms) }}
global r
probe process("{bin}").function("parity").return {{ r[$return]++ }}
probe end {{ foreach ([k+] in r) printf("%d:%d\n", k, r[k]) }}
"#
        ),
    );
    let cmd = format!("{bin} 5");
    let stdout = ok(&weft(&["stap", &file, "-c", &cmd], T));
    assert_eq!(
        weft_lines(&stdout, &["s="]),
        // $return as DWARF types it: an int's -1 is -1.
        ["v=0x1e", "return=0x1e | v=0x1e", "-1:2", "1:3"],
        "{stdout}"
    );
}

#[test]
fn syscall_probes_by_name_with_fields_and_return() {
    // tp 4 6 0 DIR: opens DIR/f0 .. DIR/f3, then 4 x 6 getppid().
    let dir = std::env::temp_dir().join(format!("weft-stap-open-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let d = dir.to_str().unwrap();
    let cmd = format!("{} 4 6 0 {d}", tp());
    let script = format!(
        "global n, ok, opened, minus_one
         probe syscall.getppid {{ n++ }}
         probe syscall.getppid.return {{ if ($return == minus_one) ok++ }}
         probe syscall.openat {{ if (isinstr(user_string($filename), \"{d}/f\")) opened++ }}
         probe begin {{ minus_one = -1 }}
         probe end {{ printf(\"%d getppid, %d returned -1, %d opened\\n\", n, ok, opened) }}"
    );
    let stdout = ok(&weft(&["stap", "-e", &script, "-c", &cmd], T));
    assert_eq!(
        stdout.trim(),
        "24 getppid, 0 returned -1, 4 opened",
        "{stdout}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn script_arguments_and_begin_only_scripts() {
    let file = script(
        "args",
        "probe begin { printf(\"%d %s %d\\n\", $1 * 2, @2, $1 + 1); exit() }",
    );
    let stdout = ok(&weft(&["stap", &file, "21", "hello"], T));
    assert_eq!(stdout, "42 hello 22\n");
    let out = weft(&["stap", &file, "x", "y"], T);
    assert_eq!(out.status.code(), Some(1));
    assert!(text_of(&out.stderr).contains("'$1' is \"x\", not a number (use @1 for a string)"));
}

#[test]
fn foreach_sorts_strings_bytewise() {
    let stdout = ok(&weft(
        &[
            "stap",
            "-e",
            "global a, b
             probe begin {
               a[\"pear\"] = 3; a[\"apple\"] = 1; a[\"fig\"] = 2; a[\"banana\"] = 5
               b[\"x\", 2] = 1; b[\"a\", 9] = 2; b[\"m\", 1] = 3
               foreach (k+ in a) printf(\"%s=%d \", k, a[k]); println(\"\")
               foreach (k- in a limit 2) printf(\"%s=%d \", k, a[k]); println(\"\")
               foreach ([s+, n] in b) printf(\"%s,%d \", s, n); println(\"\")
               foreach ([s, n-] in b) printf(\"%s,%d \", s, n); println(\"\")
               exit()
             }",
        ],
        T,
    ));
    assert_eq!(
        stdout,
        "apple=1 banana=5 fig=2 pear=3 \npear=3 fig=2 \na,9 m,1 x,2 \na,9 x,2 m,1 \n"
    );
}

#[test]
fn process_begin_and_end_in_the_target() {
    let bin = stap_target();
    let cmd = format!("{bin} 2");
    let stdout = ok(&weft(
        &[
            "stap",
            "-e",
            "probe process.begin { printf(\"begin %d %s\\n\", pid() == target(), execname()) }
             probe process.end { printf(\"end %d\\n\", pid() == target()) }",
            "-c",
            &cmd,
        ],
        T,
    ));
    assert_eq!(
        weft_lines(&stdout, &["s="]),
        ["begin 1 stap", "end 1"],
        "{stdout}"
    );
}

/// Bad input: one located error (file:line:col, the line, a caret) and exit 1.
fn refused(text: &str, message: &str, at: &str) {
    let file = script(&format!("bad{:x}", text.len() * 31 + message.len()), text);
    let out = weft(&["stap", &file, "--dry-run"], T);
    let stderr = text_of(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains(message), "{stderr}");
    assert!(stderr.contains(&format!("{file}:{at}")), "{stderr}");
    assert!(stderr.contains('^'), "{stderr}");
}

fn text_of(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn bad_scripts_are_located_errors() {
    let out = weft(&["stap"], T);
    assert_eq!(out.status.code(), Some(1));
    assert!(text_of(&out.stderr).contains("no script: give -e 'SCRIPT' or a .stp file"));
    refused(
        "probe begin { }\nprobe kernel.function(\"vfs_read\") { }\n",
        "error: probe point 'kernel.function(\"vfs_read\")' is a kernel probe point",
        "2:7",
    );
    refused(
        "probe module(\"ext4\").function(\"*\") { }",
        "is a kernel probe point",
        "1:7",
    );
    refused(
        "probe begin {\n  x = 1 +;\n}",
        "parse error: expected an expression, saw operator ';'",
        "2:10",
    );
    refused(
        "probe begin { printf(\"%d\\n\", nosuch) }",
        "unresolved symbol 'nosuch'",
        "1:30",
    );
    refused(
        "probe process(\"/bin/true\").statement(\"main@t.c:3\") { }",
        "statement probes (FUNC@FILE:LINE) need line-level probe sites",
        "1:28",
    );
    refused(
        "probe begin { foo(1) }",
        "unresolved function 'foo'",
        "1:15",
    );
    refused(
        "probe begin { println(target()) }",
        "target() needs -x PID or -c CMD",
        "1:23",
    );
    refused(
        "probe foo.bar { }",
        "probe point 'foo.bar' not recognised",
        "1:7",
    );
    refused(
        "function f(x) { return f(x) }\nprobe begin { println(f(1)) }",
        "'f' calls itself",
        "1:24",
    );
    refused(
        "global s\nprobe begin { s <<< 1; println(s) }",
        "'s' holds statistics",
        "2:32",
    );
    refused(
        "probe begin { x = \"a\" . \"b\" }",
        "string concatenation",
        "1:19",
    );
    refused(
        "probe begin { printf(\"%d\\n\", \"str\") }",
        "`%d` expects an integer",
        "1:15",
    );
}
