//! The README's "Usage by example", run: every command in it that can run here,
//! against `tests/targets/app.c` as `./app` and a running `./app serve` as
//! `-p 4242`, so the examples cannot drift from the tool.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

const T: Duration = Duration::from_secs(60);

/// Commands that cannot run here, by a text they contain, and why.
const CANNOT_RUN: [(&str, &str); 5] = [
    ("/usr/sbin/nginx", "needs nginx running"),
    (
        "/bin/bash:readline",
        "system-wide on every bash of the machine (CI's own) until Ctrl-C",
    ),
    ("make -j4", "needs a make project"),
    ("…", "elided arguments"),
    (
        "otlp=",
        "needs an OTLP receiver (an OpenTelemetry Collector) on port 4318",
    ),
];

/// The shell commands of the usage section, in order: each `sh` block's lines,
/// comments dropped, joined while a quote is open.
fn usage_commands(readme: &str) -> Vec<String> {
    let start = readme.find("## Usage by example").expect("usage section");
    let section = &readme[start..];
    let end = section[3..].find("\n## ").map_or(section.len(), |e| e + 3);
    let mut out = Vec::new();
    let mut in_sh = false;
    let mut cur = String::new();
    for line in section[..end].lines() {
        if line.starts_with("```") {
            in_sh = line == "```sh";
            assert!(cur.is_empty(), "unterminated command: {cur}");
            continue;
        }
        if !in_sh {
            continue;
        }
        let (code, open) = strip_comment(&cur, line);
        cur.push_str(code.trim_end());
        if open {
            cur.push('\n');
        } else {
            if !cur.trim().is_empty() {
                out.push(cur.trim().to_string());
            }
            cur.clear();
        }
    }
    out
}

/// `line` without a trailing `# comment` (outside quotes), and whether a quote is
/// still open at its end, given the command so far.
fn strip_comment<'a>(before: &str, line: &'a str) -> (&'a str, bool) {
    let (mut single, mut double) = (false, false);
    for c in before.chars() {
        match c {
            '\'' if !double => single = !single,
            '"' if !single => double = !double,
            _ => {}
        }
    }
    let mut prev = ' ';
    for (i, c) in line.char_indices() {
        match c {
            '\'' if !double => single = !single,
            '"' if !single => double = !double,
            '#' if !single && !double && prev.is_whitespace() => return (&line[..i], false),
            _ => {}
        }
        prev = c;
    }
    (line, single || double)
}

/// A directory holding `app` (and its source, for the README's `gcc` lines),
/// `input.txt`, `run.sh` (a script running app) and `scripts` (the repository's).
fn workdir() -> PathBuf {
    let dir = scratch_dir("readme");
    let include = repo_root().join("include");
    let app = build(
        "app.c",
        Variant::O2_PIE,
        &[&format!("-I{}", include.display())],
    );
    // Linked, not copied: a file this multithreaded process wrote may still be open
    // in a child another thread forked, and exec would fail ("Text file busy").
    // (The README's `gcc -o app` replaces the link, as ld unlinks its output first.)
    std::fs::hard_link(&app, dir.join("app")).unwrap();
    std::fs::copy(repo_root().join("tests/targets/app.c"), dir.join("app.c")).unwrap();
    std::fs::copy(include.join("weft.h"), dir.join("weft.h")).unwrap();
    std::fs::write(dir.join("input.txt"), "get a\nput b\n\nscan\n").unwrap();
    let script = dir.join("run.sh");
    std::fs::write(&script, "#!/bin/sh\n./app input.txt\n").unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    std::os::unix::fs::symlink(repo_root().join("scripts"), dir.join("scripts")).unwrap();
    dir
}

/// Runs `cmd` with `sh` in `dir`, `weft` on the PATH; `target` is the running
/// `./app serve` that stands for 4242. A session that would run until Ctrl-C gets
/// SIGINT once the target is woven.
fn run(cmd: &str, dir: &Path, target: Option<&Spawned>) -> std::process::Output {
    let weft_dir = weft_bin().parent().unwrap().to_path_buf();
    let path = format!(
        "{}:{}",
        weft_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let cmd = match target {
        Some(t) => cmd.replace("4242", &t.pid().to_string()),
        None => cmd.to_string(),
    };
    let child = Command::new("sh")
        .arg("-c")
        .arg(format!("exec {cmd}"))
        .current_dir(dir)
        .env("PATH", path)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // A program of only BEGIN/END probes, with no process, ends after BEGIN.
    let begin_end_only = [
        "probe:",
        "usdt:",
        "interval:",
        "profile:",
        "tracepoint:",
        "watchpoint:",
        "set:",
        "get:",
        "call:",
        " -p ",
        " -c ",
    ]
    .iter()
    .all(|k| !cmd.contains(k));
    let ends_by_itself =
        cmd.contains("exit()") || cmd.contains(" -l") || cmd.contains(" list ") || begin_end_only;
    if let (Some(t), false) = (target, ends_by_itself) {
        let app = dir.join("app");
        let start = Instant::now();
        while code_matches_file(t.pid(), &app) {
            assert!(start.elapsed() < T, "{cmd}: never wove the target");
            std::thread::sleep(Duration::from_millis(5));
        }
        // SAFETY: signalling the weft we started (sh exec'd it), not yet reaped.
        unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    }
    wait_output(child, T)
}

#[test]
fn every_usage_example_runs() {
    let readme = std::fs::read_to_string(repo_root().join("README.md")).unwrap();
    let commands = usage_commands(&readme);
    assert!(commands.len() >= 25, "{commands:#?}");
    let dir = workdir();
    let mut ran = 0;
    let mut skipped = Vec::new();
    for cmd in &commands {
        if let Some((_, why)) = CANNOT_RUN.iter().find(|(t, _)| cmd.contains(t)) {
            skipped.push(format!("{cmd}: {why}"));
            continue;
        }
        // A system-wide session (no -p, no -c) finds `./app serve` by itself.
        let system_wide =
            cmd.starts_with("weft -e") && !cmd.contains(" -c ") && !cmd.contains(" -p ");
        let target = (cmd.contains("4242") || system_wide).then(|| {
            let t = Spawned::start(&dir.join("app"), &["serve"]);
            t.wait_line("ready", T);
            t
        });
        let o = run(cmd, &dir, target.as_ref());
        let (out, err) = (text(&o.stdout), text(&o.stderr));
        assert!(
            o.status.success(),
            "{cmd}\nexit {:?}\nstdout:\n{out}\nstderr:\n{err}",
            o.status
        );
        for bad in ["error", "warning", "not woven", "Lost", "failed"] {
            assert!(!err.contains(bad), "{cmd}: stderr says {bad:?}:\n{err}");
        }
        // A session that prints maps or lines printed something.
        if cmd.starts_with("weft") && cmd.contains('{') && !cmd.contains("profile:") {
            assert!(
                out.contains('@') || out.lines().count() > 1,
                "{cmd}: printed nothing:\n{out}\n{err}"
            );
        }
        if let Some(mut t) = target {
            t.assert_healthy();
        }
        ran += 1;
    }
    // The commands that cannot run are exactly the known ones: every reason is
    // used, and the OTLP ones (tested against a receiver in export.rs) are the
    // only reason given to more than one command.
    for (what, why) in CANNOT_RUN {
        let n = skipped.iter().filter(|s| s.ends_with(why)).count();
        assert!(n >= 1, "{what}: no command skipped for it: {skipped:#?}");
        assert!(n == 1 || what == "otlp=", "{what}: {skipped:#?}");
    }
    assert_eq!(ran, commands.len() - skipped.len());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn commands_are_split_as_a_shell_reads_them() {
    let md = "## Usage by example\n```sh\nweft -e 'a { # not a comment\n  b }' -c ./app   # a comment\nweft list x\n```\n```c\nint x; # no\n```\n## Next\n```sh\nnot this\n```\n";
    assert_eq!(
        usage_commands(md),
        [
            "weft -e 'a { # not a comment\n  b }' -c ./app",
            "weft list x"
        ]
    );
}
