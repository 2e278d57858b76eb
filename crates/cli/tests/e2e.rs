//! End-to-end: weave into real C programs and check exact results.

mod common;

use std::time::Duration;

use common::*;

const T: Duration = Duration::from_secs(60);

fn bin_str(p: &std::path::Path) -> &str {
    p.to_str().unwrap()
}

/// What the target prints when run without weft.
fn native(bin: &std::path::Path, args: &[&str]) -> String {
    text(
        &std::process::Command::new(bin)
            .args(args)
            .output()
            .unwrap()
            .stdout,
    )
}

#[test]
fn entry_and_return_counts_exact_across_flag_matrix() {
    for v in all_variants() {
        let bin = build("calls.c", v, &[]);
        let b = bin_str(&bin);
        let prog = format!(
            "uprobe:{b}:work {{ @c = count(); @s = sum(arg0); }} uretprobe:{b}:work {{ @r = sum(retval); }}"
        );
        let o = weft(&["-e", &prog, "-c", &format!("{b} 1000")], T);
        let out = ok(&o);
        assert_eq!(map_value(&out, "@c"), Some(1000), "{}: {out}", v.name());
        assert_eq!(map_value(&out, "@s"), Some(499_500), "{}", v.name());
        assert_eq!(map_value(&out, "@r"), Some(1_000_000), "{}", v.name());
        assert!(
            out.starts_with(&native(&bin, &["1000"])),
            "target output intact: {out}"
        );
    }
}

#[test]
fn short_function_uses_the_padding_after_it() {
    let bin = build("calls.c", Variant::O2_PIE, &[]);
    let b = bin_str(&bin);
    let prog =
        format!("uprobe:{b}:tiny {{ @t = count(); }} uretprobe:{b}:tiny {{ @r = count(); }}");
    let o = weft(&["-v", "-e", &prog, "-c", &format!("{b} 777")], T);
    let out = ok(&o);
    assert_eq!(map_value(&out, "@t"), Some(777));
    assert_eq!(map_value(&out, "@r"), Some(777));
    assert!(
        text(&o.stderr).contains(":tiny at 0x") && text(&o.stderr).contains("jump to trampoline")
    );
}

#[test]
fn branch_into_the_prologue_is_woven_with_int3() {
    for v in [
        Variant::O2_PIE,
        Variant {
            opt: "-O0",
            pie: false,
            cet: false,
        },
    ] {
        let bin = build("calls.c", v, &[]);
        let b = bin_str(&bin);
        let prog = format!(
            "uprobe:{b}:loopy {{ @n = count(); @a = sum(arg0); }} uretprobe:{b}:loopy {{ @r = sum(retval); }}"
        );
        let o = weft(&["-v", "-e", &prog, "-c", &format!("{b} 500")], T);
        let out = ok(&o);
        assert_eq!(map_value(&out, "@n"), Some(500), "{}: {out}", v.name());
        assert_eq!(map_value(&out, "@a"), Some(1500));
        assert_eq!(map_value(&out, "@r"), Some(1500));
        assert!(
            text(&o.stderr).contains("int3 (branch at"),
            "{}",
            text(&o.stderr)
        );
    }
}

#[test]
fn functions_without_a_size_get_int3() {
    let bin = build("calls.c", Variant::O2_PIE, &[]);
    let b = bin_str(&bin);
    let o = weft(
        &[
            "-v",
            "-e",
            &format!("uprobe:{b}:_init {{ @i = count(); }}"),
            "-c",
            &format!("{b} 1"),
        ],
        T,
    );
    let out = ok(&o);
    assert_eq!(map_value(&out, "@i"), Some(1), "{out}");
    assert!(text(&o.stderr).contains("int3 ("), "{}", text(&o.stderr));
}

#[test]
fn every_register_xmm_and_flag_survives_probed_calls() {
    // check_regs() fills every GPR, xmm0-15 and the flags, calls a victim that
    // touches none of them, and reports what changed: nothing may, whatever path the
    // probe takes (inline advice and stub, general trampoline with helper calls,
    // int3).
    let bin = build("regs.c", Variant::O2_PIE, &[]);
    let b = bin_str(&bin);
    let programs = [
        (vec![], format!("uprobe:{b}:victim_* {{ @c = count(); }} uretprobe:{b}:victim_* {{ @r = count(); }}")),
        (
            vec![],
            format!(
                "uprobe:{b}:victim_* {{ @k[tid, func] = count(); @s[\"x\"] = sum(arg0); }} \
                 uretprobe:{b}:victim_* {{ @rk[retval & 7] = count(); printf(\"\"); }}"
            ),
        ),
        (vec!["--no-inline"], format!("uprobe:{b}:victim_* {{ @c = count(); }} uretprobe:{b}:victim_* {{ @r = count(); }}")),
        // Several probes' advice inline at one site, entry and return (cflow's
        // hidden probes and the program's): per-thread state, the return address,
        // a function's code range.
        (
            vec![],
            format!(
                "uprobe:{b}:victim_* /cflow_strict(uprobe:{b}:check_regs, uprobe:{b}:victim_*)/ {{ @s = count(); }} \
                 uprobe:{b}:victim_* /cflow(uprobe:{b}:victim_*, uprobe:{b}:victim_*)/ {{ @n = count(); }} \
                 uretprobe:{b}:victim_* /cflow(uprobe:{b}:check_regs, uprobe:{b}:victim_*)/ {{ @r = count(); }}"
            ),
        ),
        // An access site (data pointcut by instruction rewriting): the access code
        // around the relocated store and the general head with old and new.
        (
            vec!["--data-mechanism", "rewrite"],
            format!(
                "uprobe:{b}:victim_int3 {{ @c = count(); }} \
                 set:{b}:regs_var {{ @d[tid] = count(); @o = sum(old + new); printf(\"\"); }}"
            ),
        ),
    ];
    for (flags, prog) in programs {
        let mut args: Vec<&str> = flags.clone();
        args.extend(["-v", "-e", &prog, "-c"]);
        let cmd = format!("{b} 50");
        args.push(&cmd);
        let o = weft(&args, T);
        let out = ok(&o);
        assert!(out.contains("clobbered=0\n"), "{flags:?} {prog}: {out}");
        assert!(
            text(&o.stderr).contains("victim_int3 at 0x") && text(&o.stderr).contains(": int3 (")
        );
        if flags.contains(&"rewrite") {
            assert!(
                text(&o.stderr).contains("in victim_access+0x0 at 0x")
                    && text(&o.stderr).contains(": access site: jump to trampoline"),
                "{}",
                text(&o.stderr)
            );
            assert_eq!(keyed(&out, "@d").values().sum::<i64>(), 100, "{out}");
        }
    }
}

#[test]
fn args_from_dwarf_with_struct_fields() {
    for v in [
        Variant::O2_PIE,
        Variant {
            opt: "-O0",
            pie: false,
            cet: false,
        },
    ] {
        let bin = build("structs.c", v, &[]);
        let b = bin_str(&bin);
        let prog = format!(
            "uprobe:{b}:dist {{ printf(\"%d %d %s %d\\n\", args.p->x, args.p->y, str(args.p->name), args.scale); }}"
        );
        let out = ok(&weft(&["-e", &prog, "-c", b], T));
        // The target's own line shares weft's stdout, anywhere among the events.
        let (own, events): (Vec<&str>, Vec<&str>) = out.lines().partition(|l| l.starts_with("s="));
        assert_eq!(own, ["s=50"], "{}: {out}", v.name());
        assert!(
            events
                .join("\n")
                .contains("1 2 one 1\n3 4 two 2\n5 6 three 3"),
            "{}: {out}",
            v.name()
        );
    }
}

/// `tests/targets/structs.c` built at -O2 with `flags` in a fresh directory (gcc's
/// working directory: where `-gsplit-dwarf` writes its `.dwo`), then each of `post`
/// run there (`{}` is the directory).
fn build_debug_form(name: &str, flags: &[&str], post: &[&[&str]]) -> std::path::PathBuf {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("debug-forms")
        .join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let run = |argv: &[&str]| {
        let argv: Vec<String> = argv
            .iter()
            .map(|a| a.replace("{}", dir.to_str().unwrap()))
            .collect();
        let o = std::process::Command::new(&argv[0])
            .args(&argv[1..])
            .current_dir(&dir)
            .output()
            .unwrap();
        assert!(o.status.success(), "{argv:?}: {}", text(&o.stderr));
    };
    let source = repo_root().join("tests/targets/structs.c");
    let mut gcc = vec![
        "gcc",
        "-O2",
        "-g",
        "-o",
        "structs",
        source.to_str().unwrap(),
    ];
    gcc.extend_from_slice(flags);
    run(&gcc);
    for argv in post {
        run(argv);
    }
    dir.join("structs")
}

/// The `.dwo` files beside `bin`.
fn dwo_files(bin: &std::path::Path) -> Vec<std::path::PathBuf> {
    std::fs::read_dir(bin.parent().unwrap())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "dwo"))
        .collect()
}

/// `args` of `dist` in `structs.c` read from wherever `bin`'s DWARF is (`env` set
/// for weft): every call's fields and scale, exactly.
fn assert_dist_args(bin: &std::path::Path, env: &[(&str, &str)], what: &str) {
    let b = bin_str(bin);
    let prog = format!(
        "uprobe:{b}:dist {{ printf(\"%d %d %s %d\\n\", args.p->x, args.p->y, str(args.p->name), args.scale); }}"
    );
    let child = std::process::Command::new(weft_bin())
        .args(["-e", &prog, "-c", b])
        .envs(env.iter().copied())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let out = ok(&wait_output(child, T));
    let (own, events): (Vec<&str>, Vec<&str>) = out
        .lines()
        .filter(|l| !l.is_empty())
        .partition(|l| l.starts_with("s="));
    assert_eq!(own, ["s=50"], "{what}: {out}");
    assert_eq!(
        events,
        ["1 2 one 1", "3 4 two 2", "5 6 three 3"],
        "{what}: {out}"
    );
}

#[test]
fn args_from_split_dwarf_dwo() {
    let bin = build_debug_form("split", &["-gsplit-dwarf"], &[]);
    assert_eq!(dwo_files(&bin).len(), 1, "gcc wrote a .dwo");
    assert_dist_args(&bin, &[], "-gsplit-dwarf");
}

#[test]
fn args_from_split_dwarf_dwp_package() {
    // GNU dwp packages DWARF 4 (llvm-dwp 14 loops on gcc 12's DWARF 5 here); the .dwo
    // is removed, so only the package has the types.
    let bin = build_debug_form(
        "dwp",
        &["-gdwarf-4", "-gsplit-dwarf"],
        &[&["dwp", "-e", "structs", "-o", "structs.dwp"]],
    );
    let dwos = dwo_files(&bin);
    assert_eq!(dwos.len(), 1, "gcc wrote a .dwo");
    std::fs::remove_file(&dwos[0]).unwrap();
    assert_dist_args(&bin, &[], "structs.dwp");
}

#[test]
fn args_from_compressed_debug_sections() {
    let zlib = build_debug_form("gz-zlib", &["-gz=zlib"], &[]);
    assert_dist_args(&zlib, &[], "-gz=zlib");
    let zstd = build_debug_form("gz-zstd", &["-Wl,--compress-debug-sections=zstd"], &[]);
    assert_dist_args(&zstd, &[], "zstd");
}

#[test]
fn args_from_a_debuglink_debug_file() {
    let bin = build_debug_form(
        "debuglink",
        &[],
        &[
            &["objcopy", "--only-keep-debug", "structs", "structs.debug"],
            &[
                "objcopy",
                "--strip-debug",
                "--add-gnu-debuglink=structs.debug",
                "structs",
            ],
        ],
    );
    assert_dist_args(&bin, &[], ".gnu_debuglink");
}

#[test]
fn args_from_a_build_id_debug_file() {
    // The debug file goes to DIR/.build-id/xx/rest.debug, DIR named by
    // WEFT_DEBUG_FILE_DIRECTORY (in place of /usr/lib/debug); no debuglink.
    let bin = build_debug_form(
        "build-id",
        &["-Wl,--build-id"],
        &[
            &["objcopy", "--only-keep-debug", "structs", "structs.debug"],
            &["objcopy", "--strip-debug", "structs"],
        ],
    );
    let dir = bin.parent().unwrap();
    let id = text(
        &std::process::Command::new("readelf")
            .args(["-n", bin_str(&bin)])
            .output()
            .unwrap()
            .stdout,
    );
    let id = id
        .lines()
        .find_map(|l| l.trim().strip_prefix("Build ID: "))
        .unwrap()
        .to_string();
    let ids = dir.join("root/.build-id").join(&id[..2]);
    std::fs::create_dir_all(&ids).unwrap();
    std::fs::rename(
        dir.join("structs.debug"),
        ids.join(format!("{}.debug", &id[2..])),
    )
    .unwrap();
    let root = dir.join("root");
    assert_dist_args(
        &bin,
        &[("WEFT_DEBUG_FILE_DIRECTORY", root.to_str().unwrap())],
        "build-id",
    );
}

#[test]
fn profile_samples_each_busy_thread_with_stacks() {
    let bin = build("burn.c", Variant::O2_PIE, &[]);
    let b = bin_str(&bin);
    let prog = "profile:hz:199 { @t[tid] = count(); @s[ustack] = count(); @n = count(); }";
    let out = ok(&weft(&["-e", prog, "-c", &format!("{b} 1")], T));
    let per_thread: Vec<i64> = out
        .lines()
        .filter(|l| l.starts_with("@t["))
        .map(|l| l.rsplit(": ").next().unwrap().parse().unwrap())
        .collect();
    assert_eq!(per_thread.len(), 2, "both busy threads sampled: {out}");
    assert!(per_thread.iter().all(|&n| n >= 20), "{out}");
    assert!(map_value(&out, "@n").unwrap() >= 60, "{out}");
    // Leaf functions keep the caller's rbp, so a frame-pointer walk skips their caller
    // (as perf and bpftrace do): only the sampled functions are certain.
    assert!(out.contains("hot_a+") && out.contains("hot_b+"), "{out}");
}

#[test]
fn usdt_arguments_and_semaphores() {
    for v in [
        Variant::O2_PIE,
        Variant {
            opt: "-O0",
            pie: false,
            cet: false,
        },
    ] {
        let bin = build("sdt.c", v, &[]);
        let b = bin_str(&bin);
        let prog = format!(
            "usdt:{b}:app:work {{ printf(\"work %d %d %s\\n\", arg0, arg1, str(arg2)); @[str(arg2)] = sum(arg1); }} \
             usdt:{b}:app:tick {{ @t = count(); }}"
        );
        let out = ok(&weft(&["-e", &prog, "-c", &format!("{b} 5")], T));
        for i in 0..5 {
            let name = if i % 2 == 1 { "odd" } else { "even" };
            assert!(
                out.contains(&format!("work {i} {} {name}\n", 3 * i)),
                "{}: {out}",
                v.name()
            );
            assert!(
                out.contains(&format!("enabled at {i}\n")),
                "semaphore raised while woven: {out}"
            );
        }
        assert!(
            out.contains("@[odd]: 12\n") && out.contains("@[even]: 18\n"),
            "{out}"
        );
        assert_eq!(map_value(&out, "@t"), Some(5));
        // Without weft the semaphore stays 0.
        assert!(!native(&bin, &["3"]).contains("enabled"));
    }
}

/// A probe whose argument is its semaphore, read just before it fires: weft raises
/// the semaphore in a stop before the one that patches the probe, so even the first
/// woven hit carries 1 (upstream's "attach to probe with semaphore" test). Twice,
/// the second attach after the first left.
#[test]
fn usdt_first_hit_sees_its_semaphore_raised() {
    let bin = build("sdt_sem.c", Variant::O2_PIE, &[]);
    let b = bin_str(&bin);
    let mut t = Spawned::start(&bin, &[]);
    t.wait_line("ready", T);
    let pid = t.pid().to_string();
    let prog = format!(
        "usdt:{b}:app:seen {{ @min = min(arg0); @max = max(arg0); @n = count(); }} \
         interval:ms:100 {{ exit(); }}"
    );
    for round in 0..2 {
        let out = ok(&weft(&["-e", &prog, "-p", &pid], T));
        assert!(map_value(&out, "@n").unwrap() > 0, "round {round}: {out}");
        assert_eq!(map_value(&out, "@min"), Some(1), "round {round}: {out}");
        assert_eq!(map_value(&out, "@max"), Some(1), "round {round}: {out}");
    }
    t.assert_healthy();
    assert!(code_matches_file(t.pid(), &bin));
}

#[test]
fn usdt_semaphore_drops_after_detach() {
    let bin = build("sdt.c", Variant::O2_PIE, &[]);
    let b = bin_str(&bin);
    let mut t = Spawned::start(&bin, &["0", "loop"]);
    t.wait_line("ready", T);
    let pid = t.pid().to_string();
    // weft leaves once a few steps ran woven (the semaphore is raised in the stop that
    // patches, so a step that fired tick twice saw it), however long that takes here.
    let prog =
        format!("usdt:{b}:app:tick {{ @t = count(); }} interval:ms:200 /@t > 2/ {{ exit(); }}");
    let out = ok(&weft(&["-e", &prog, "-p", &pid], T));
    assert!(map_value(&out, "@t").unwrap() > 0, "{out}");
    // While woven the program saw its semaphore raised ...
    t.wait_line("enabled", T);
    // ... and after detach it never does: SIGUSR1, sent now, makes it print "mark",
    // run 100 more steps and say so; no "enabled" may come between the two.
    // SAFETY: signalling the target we started.
    unsafe { libc::kill(t.pid(), libc::SIGUSR1) };
    let mut later = Vec::new();
    let mut marked = false;
    let start = std::time::Instant::now();
    loop {
        assert!(start.elapsed() < T, "no mark and 100 steps: {later:?}");
        let Ok(l) = t.lines.recv_timeout(Duration::from_millis(50)) else {
            continue;
        };
        if l == "mark" {
            marked = true;
        } else if l == "after 100 steps" {
            break;
        } else if marked {
            later.push(l);
        }
    }
    assert!(
        later.is_empty(),
        "semaphore still raised after detach: {later:?}"
    );
    t.assert_healthy();
    assert!(code_matches_file(t.pid(), &bin));
}

/// `usdt::PROV:NAME` and `usdt:*:PROV:NAME` with -p: every module of the process
/// is searched, as bpftrace does; a path's wildcard matches the modules by path.
/// The probe is named after the file it was found in, and its semaphore raised.
#[test]
fn usdt_binary_empty_or_wildcard_with_pid() {
    let bin = build("sdt.c", Variant::O2_PIE, &[]);
    let b = bin_str(&bin);
    let dir = bin.parent().unwrap().display().to_string();
    let mut t = Spawned::start(&bin, &["0", "loop"]);
    t.wait_line("ready", T);
    let pid = t.pid().to_string();
    for spec in ["", "*", &format!("{dir}/sd*")] {
        let prog = format!("usdt:{spec}:app:tick {{ @[probe] = count(); exit(); }}");
        let out = ok(&weft(&["-e", &prog, "-p", &pid], T));
        assert!(
            keyed(&out, "@").contains_key(&format!("usdt:{b}:app:tick")),
            "{spec}: {out}"
        );
    }
    t.wait_line("enabled", T);
    // A pattern that matches no probe of the process is an error.
    let o = weft(&["-e", "usdt:*:nosuch:tick { }", "-p", &pid], T);
    assert!(!o.status.success());
    assert!(
        text(&o.stderr).contains("no USDT probe matches in the modules matching `*` of process"),
        "{}",
        text(&o.stderr)
    );
    t.assert_healthy();
}

/// bpftrace's `missing_probes`: a probe on a function the binary lacks is an error
/// (default; system-wide before anything starts), skipped with upstream's warning
/// (`"warn"`), or skipped silently (`"ignore"`); the other attach points of the
/// probe run.
#[test]
fn missing_probes_error_warn_or_ignore() {
    let bin = build("calls.c", Variant::O2_PIE, &[]);
    let b = bin_str(&bin);
    let body = format!("uprobe:{b}:work,uprobe:{b}:no_such_fn {{ @n = count(); }}");
    let cmd = format!("{b} 10");
    let o = weft(&["-e", &body, "-c", &cmd], T);
    assert_eq!(o.status.code(), Some(1));
    let err = text(&o.stderr);
    assert!(
        err.contains(&format!("function `no_such_fn` not found in {b}")),
        "{err}"
    );
    for (mode, warned) in [("warn", true), ("ignore", false)] {
        let prog = format!("config = {{ missing_probes = \"{mode}\" }} {body}");
        let o = weft(&["-e", &prog, "-c", &cmd], T);
        let out = ok(&o);
        assert_eq!(map_value(&out, "@n"), Some(10), "{mode}: {out}");
        let warning =
            format!("WARNING: Could not resolve symbol: {b}:no_such_fn, skipping probe.\n");
        assert_eq!(text(&o.stderr).contains(&warning), warned, "{mode}: {o:?}");
    }
}

/// `let @a = hash(N)` holds N keys, as upstream: an update past them is dropped and
/// warned about; an LRU map keeps `max_map_keys` (weft's maps do not evict).
#[test]
fn declared_map_holds_its_number_of_keys() {
    let o = weft(
        &["-e", "let @a = hash(2); let @b = lruhash(1); BEGIN { @a[1] = 1; @a[2] = 2; @a[3] = 3; @b[1] = 1; @b[2] = 2; }"],
        T,
    );
    let out = ok(&o);
    assert_eq!(keyed(&out, "@a").len(), 2, "{out}");
    assert_eq!(keyed(&out, "@b").len(), 2, "{out}");
    let err = text(&o.stderr);
    assert!(
        err.contains("WARNING: Map full; can't update element. Try increasing max_map_keys config or manually setting the max entries in a map declaration e.g. `let @a = hash(5000)`\nAdditional Info - map: @a, updates dropped: 1\n"),
        "{err}"
    );
}

/// `-l -e PROGRAM` and `-l FILE.bt` list the probes the program names, as bpftrace
/// does: user-space patterns expanded over their binary, timers as their type and
/// unit, other kinds as written.
#[test]
fn list_the_probes_of_a_program() {
    let bin = build("calls.c", Variant::O2_PIE, &[]);
    let b = bin_str(&bin);
    let prog = format!("uprobe:{b}:wor* {{ }} interval:ms:10 {{ }} BEGIN {{ }}");
    let out = ok(&weft(&["-l", "-e", &prog], T));
    assert_eq!(out, format!("uprobe:{b}:work\ninterval:ms:\nBEGIN\n"));
    let dir = std::env::temp_dir().join(format!("weft-list-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("p.bt");
    std::fs::write(&file, format!("uretprobe:{b}:work {{ }}\nEND {{ }}\n")).unwrap();
    let out = ok(&weft(&["-l", file.to_str().unwrap()], T));
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(out, format!("uretprobe:{b}:work\nEND\n"));
}

/// A USDT constant argument has its spec's width and sign (`4@$-202182160` is
/// 4092785136, as bpftrace reads it), and a probe at two locations is one probe in
/// "Attached N probes" (fired at both).
#[test]
fn usdt_constants_take_their_width_and_a_probe_counts_once() {
    let bin = build("sdt_consts.c", Variant::O2_PIE, &[]);
    let b = bin_str(&bin);
    let prog = format!(
        "usdt:{b}:app:multi {{ @m = count(); }} \
         usdt:{b}:app:u*,usdt:{b}:app:s* {{ printf(\"%s %lld\\n\", probe, arg0); }}"
    );
    let o = weft(&["-e", &prog, "-c", b], T);
    let out = ok(&o);
    let want: String = [
        ("u4", "4092785136"),
        ("s4", "-202182160"),
        ("u2", "61936"),
        ("s2", "-3600"),
        ("u1", "240"),
        ("s1", "-16"),
    ]
    .iter()
    .map(|(p, v)| format!("usdt:{b}:app:{p} {v}\n"))
    .collect();
    assert!(out.contains(&want), "{out}");
    assert_eq!(map_value(&out, "@m"), Some(2), "{out}");
    assert!(text(&o.stderr).contains("Attached 7 probes\n"), "{o:?}");
}

/// `-k`: a map read that finds no element and a `delete` with nothing to delete warn
/// where they happen, in upstream's words and layout (upstream's other/
/// runtime_error_check_lookup and _delete); without `-k`, nothing. In the target's
/// advice and in weft's (BEGIN).
#[test]
fn dash_k_warns_of_missing_map_elements() {
    let bin = build("calls.c", Variant::O2_PIE, &[]);
    let b = bin_str(&bin);
    let prog = format!(
        "BEGIN {{ @[1] = 1; printf(\"%d\\n\", @[2]); }} uprobe:{b}:work /arg0 == 0/ {{ delete(@, 3); }}"
    );
    let cmd = format!("{b} 2");
    let o = weft(&["-k", "-e", &prog, "-c", &cmd], T);
    ok(&o);
    let err = text(&o.stderr);
    let at = prog.find("@[2]").unwrap();
    let lookup = format!(
        "stdin:1:{}-{}: WARNING: Can't lookup map element because it does not exist.\n\
         Additional Info - helper: map_lookup_elem, retcode: 0\n{prog}\n{}~~~~\n",
        at + 1,
        at + 5,
        " ".repeat(at)
    );
    let delete = format!(
        "stdin:1:{}-{}: WARNING: Can't delete map element because it does not exist.\n\
         Additional Info - helper: map_delete_elem, retcode: -2\n{prog}\n{}{}\n",
        prog.find("delete").unwrap() + 1,
        prog.find("delete").unwrap() + 13,
        " ".repeat(prog.find("delete").unwrap()),
        "~".repeat(12)
    );
    assert!(err.contains(&lookup), "{lookup}\n{err}");
    assert_eq!(err.matches(&delete).count(), 1, "{delete}\n{err}");
    let o = weft(&["-e", &prog, "-c", &cmd], T);
    ok(&o);
    assert!(!text(&o.stderr).contains("WARNING"), "{o:?}");
}

#[test]
fn stack_arguments_and_printf() {
    for v in [
        Variant::O2_PIE,
        Variant {
            opt: "-O0",
            pie: false,
            cet: false,
        },
    ] {
        let bin = build("calls.c", v, &[]);
        let b = bin_str(&bin);
        let prog = format!(
            "uprobe:{b}:many_args {{ printf(\"%d %d %d %d %d %d %d %d\\n\", arg0, arg1, arg2, arg3, arg4, arg5, arg6, arg7); }}"
        );
        let out = ok(&weft(&["-e", &prog, "-c", &format!("{b} 1")], T));
        assert!(out.contains("1 2 3 4 5 6 7 8\n"), "{}: {out}", v.name());
    }
}

#[test]
fn every_function_of_a_binary_with_wildcards() {
    let bin = build("calls.c", Variant::O2_PIE, &[]);
    let b = bin_str(&bin);
    let prog = format!("uprobe:{b}:* {{ @[func] = count(); }}");
    let out = ok(&weft(&["-e", &prog, "-c", &format!("{b} 50")], T));
    assert!(out.contains("@[work]: 50\n"), "{out}");
    assert!(out.contains("@[tiny]: 50\n"), "{out}");
    assert!(out.contains("@[spin]: 1\n"), "{out}");
    assert!(out.contains("@[main]: 1\n"), "{out}");
}

#[test]
fn libc_malloc_sizes() {
    let bin = build("mallocs.c", Variant::O2_PIE, &[]);
    let b = bin_str(&bin);
    let prog = "uprobe:libc:malloc /arg0 > 7000000 && arg0 <= 7000010/ { @n = count(); @bytes = sum(arg0); }";
    let out = ok(&weft(&["-e", prog, "-c", &format!("{b} 10")], T));
    assert_eq!(map_value(&out, "@n"), Some(10), "{out}");
    assert_eq!(map_value(&out, "@bytes"), Some(70_000_055));
}

#[test]
fn four_threads_exact_per_thread_totals() {
    let bin = build("threads.c", Variant::O2_PIE, &[]);
    let b = bin_str(&bin);
    let prog = format!("uprobe:{b}:hit {{ @[arg0] = count(); @t[tid] = count(); }}");
    let out = ok(&weft(&["-e", &prog, "-c", &format!("{b} 20000")], T));
    for t in 0..4 {
        assert!(
            out.contains(&format!("@[{t}]: {}\n", (t + 1) * 20000)),
            "{out}"
        );
    }
    assert_eq!(
        out.lines().filter(|l| l.starts_with("@t[")).count(),
        4,
        "{out}"
    );
}

/// `pcomm` is the process's name (its main thread's), `comm` the thread's own
/// (upstream docs/stdlib.md, "pcomm"): each worker names itself `worker-N`.
#[test]
fn pcomm_names_the_process_comm_the_thread() {
    let bin = build("threads.c", Variant::O2_PIE, &[]);
    let b = bin_str(&bin);
    let name: String = bin
        .file_name()
        .unwrap()
        .to_string_lossy()
        .chars()
        .take(15)
        .collect();
    let prog = format!("uprobe:{b}:hit {{ @[comm, pcomm, pcomm()] = count(); }}");
    let out = ok(&weft(&["-e", &prog, "-c", &format!("{b} 100")], T));
    for t in 0..4 {
        let line = format!("@[worker-{t}, {name}, {name}]: {}\n", (t + 1) * 100);
        assert!(out.contains(&line), "{line:?} in {out}");
    }
}

/// `errorf`/`warnf` print on standard error as upstream does (docs/stdlib.md,
/// "errorf", "warnf"): `LOCATION: ERROR: text`, the location of the call in the
/// program (`stdin` for -e); `--no-warnings` silences `warnf`. Nothing on stdout.
#[test]
fn errorf_and_warnf_go_to_stderr_with_their_location() {
    let prog = "BEGIN { errorf(\"Something bad with args: %d, %s\", 10, \"arg2\");\n  warnf(\"kinda bad %s\", \"x\"); printf(\"out\\n\"); exit(); }";
    let o = weft(&["-q", "-e", prog], T);
    let out = ok(&o);
    assert_eq!(out, "out\n\n\n");
    assert_eq!(
        text(&o.stderr),
        "stdin:1:9-62: ERROR: Something bad with args: 10, arg2\n\
         stdin:2:3-29: WARNING: kinda bad x\n"
    );
    let o = weft(&["-q", "--no-warnings", "-e", prog], T);
    ok(&o);
    assert_eq!(
        text(&o.stderr),
        "stdin:1:9-62: ERROR: Something bad with args: 10, arg2\n"
    );
}

// ---------------------------------------------------------------------------------
// Threads that come and go (issue 24): slots and agent state are reused once a
// thread is gone, so the limits are on threads alive at once, not threads ever seen.
// `short_threads TOTAL ALIVE CALLS`: thread i calls bar(i), then foo(i, j) for
// j < CALLS; the agent holds a launched target until weft says go.
// ---------------------------------------------------------------------------------

/// `calls` of foo(i, j) on each of `total` threads, as counted by
/// `@c = count(); @k[arg0 % 7] = count(); @h = hist(arg1)`, and bar's
/// `printf("thread %d\n", arg0)` once per thread: everything exact, nothing lost.
fn assert_every_call_counted(out: &str, err: &str, total: u64, calls: u64) {
    let what = format!("{total} threads x {calls} calls");
    assert_eq!(
        map_value(out, "@c"),
        Some((total * calls) as i64),
        "{what}: {err}"
    );
    for r in 0..7 {
        let threads = (0..total).filter(|i| i % 7 == r).count() as u64;
        assert!(
            out.contains(&format!("@k[{r}]: {}\n", threads * calls)),
            "{what}: @k[{r}] in {:?}",
            map_lines(out, "@k")
        );
    }
    // hist(j) for j < 1000: [0] and [1] once, then 2^l values in [2^l, 2^(l+1)).
    let want: Vec<(&str, u64)> = vec![
        ("[0]", 1),
        ("[1]", 1),
        ("[2, 4)", 2),
        ("[4, 8)", 4),
        ("[8, 16)", 8),
        ("[16, 32)", 16),
        ("[32, 64)", 32),
        ("[64, 128)", 64),
        ("[128, 256)", 128),
        ("[256, 512)", 256),
        ("[512, 1K)", 488),
    ];
    let want: Vec<(String, u64)> = want
        .into_iter()
        .map(|(b, n)| (b.to_string(), n * total))
        .collect();
    assert_eq!(hist_buckets(out, "@h"), want, "{what}");
    let mut seen: Vec<u64> = out
        .lines()
        .filter_map(|l| l.strip_prefix("thread "))
        .map(|n| n.parse().unwrap())
        .collect();
    seen.sort_unstable();
    assert_eq!(
        seen,
        (0..total).collect::<Vec<_>>(),
        "{what}: one event per thread"
    );
    let sum = calls * total * (total - 1) / 2 + total * calls * (calls - 1) / 2;
    assert!(
        out.lines().any(|l| l == format!("sum={sum}")),
        "{what}: target intact"
    );
    let odd: Vec<&str> = err
        .lines()
        .filter(|l| !l.starts_with("Attached "))
        .collect();
    assert!(
        odd.is_empty(),
        "{what}: nothing lost, nothing reported: {odd:?}"
    );
}

/// The lines of map `name` (`@k[...]: v` or `@k: v`).
fn map_lines<'a>(out: &'a str, name: &str) -> Vec<&'a str> {
    out.lines().filter(|l| l.starts_with(name)).collect()
}

/// `(bucket, count)` of each line of the histogram `name`.
fn hist_buckets(out: &str, name: &str) -> Vec<(String, u64)> {
    out.lines()
        .skip_while(|l| *l != format!("{name}:"))
        .skip(1)
        .take_while(|l| l.starts_with('['))
        .map(|l| {
            let end = l.find([']', ')']).unwrap() + 1;
            let count = l[end..].split_whitespace().next().unwrap();
            (l[..end].to_string(), count.parse().unwrap())
        })
        .collect()
}

fn churn_program(b: &str) -> String {
    format!(
        "uprobe:{b}:foo {{ @c = count(); @k[arg0 % 7] = count(); @h = hist(arg1); }} \
         uprobe:{b}:bar {{ printf(\"thread %d\\n\", arg0); }}"
    )
}

/// 5,000 threads, 64 alive at once, each calling foo 1,000 times: more threads than
/// the session has slots (1,024 before) and than the agent has thread states
/// (4,096), so both must be reused. Inline heads and the general trampoline.
#[test]
fn five_thousand_short_threads_every_call_counted() {
    let bin = build("short_threads.c", Variant::O2_PIE, &[]);
    let b = bin_str(&bin);
    let prog = churn_program(b);
    let cmd = format!("{b} 5000 64 1000");
    for flags in [&[][..], &["--no-inline"][..]] {
        let mut args = flags.to_vec();
        args.extend(["-e", &prog, "-c", &cmd]);
        let o = weft(&args, T);
        assert_every_call_counted(&ok(&o), &text(&o.stderr), 5000, 1000);
    }
}

/// 1,500 threads strictly one after another. When they have all ended, `print` and
/// a map read in advice see their counts (from the retired slot), and `delete`
/// clears what they left: the key counted again afterwards starts from zero. Also
/// with `-f json`.
#[test]
fn fifteen_hundred_threads_one_after_another_every_call_counted() {
    let bin = build("short_threads.c", Variant::O2_PIE, &[]);
    let b = bin_str(&bin);
    let cmd = format!("{b} 1500 1 1000");
    let prog = churn_program(b);
    let o = weft(&["-e", &prog, "-c", &cmd], T);
    assert_every_call_counted(&ok(&o), &text(&o.stderr), 1500, 1000);

    let prog = format!(
        "uprobe:{b}:foo {{ @c = count(); @k[arg0 % 7] = count(); }} \
         uprobe:{b}:done {{ print(@c); @read = sum(@c); delete(@k[0]); @k[0] = count(); }}"
    );
    let out = ok(&weft(&["-e", &prog, "-c", &cmd], T));
    assert_eq!(
        out.matches("@c: 1500000\n").count(),
        2,
        "print and END: {out}"
    );
    assert_eq!(map_value(&out, "@read"), Some(1_500_000), "{out}");
    assert_eq!(map_value(&out, "@k[0]"), Some(1), "{out}");
    assert_eq!(map_value(&out, "@k[1]"), Some(215_000), "{out}");
    assert_eq!(map_value(&out, "@k[6]"), Some(214_000), "{out}");

    let out = ok(&weft(&["-f", "json", "-e", &prog, "-c", &cmd], T));
    assert_eq!(
        out.matches(r#"{"type": "map", "data": {"@c": 1500000}}"#)
            .count(),
        2,
        "{out}"
    );
    assert!(
        out.contains(r#""@k": {"0": 1, "#) && out.contains(r#""1": 215000"#),
        "{out}"
    );
}

/// The count of the stderr line `weft: N probe hits ran no advice: <why>...`.
fn hits_lost(err: &str, why: &str) -> u64 {
    let lines: Vec<&str> = err.lines().filter(|l| l.contains(why)).collect();
    assert!(lines.len() <= 1, "reported once: {err}");
    lines.first().map_or(0, |l| {
        l.strip_prefix("weft: ")
            .and_then(|l| l.split_whitespace().next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no count in {l:?}"))
    })
}

/// `--max-threads 8` with 200 threads alive at once: hits on threads beyond the
/// limit run no advice, and their exact number is reported once: 192 threads' worth.
#[test]
fn hits_beyond_max_threads_are_reported_exactly() {
    let bin = build("short_threads.c", Variant::O2_PIE, &[]);
    let b = bin_str(&bin);
    let prog = format!("uprobe:{b}:foo {{ @c = count(); }} uprobe:{b}:bar {{ @b = count(); }}");
    let o = weft(
        &[
            "--max-threads",
            "8",
            "-e",
            &prog,
            "-c",
            &format!("{b} 200 0 1000 hold"),
        ],
        T,
    );
    let out = ok(&o);
    let err = text(&o.stderr);
    let lost = hits_lost(&err, "more than 8 threads");
    assert_eq!(lost, 192 * 1001, "{err}");
    let counted = map_value(&out, "@c").unwrap() + map_value(&out, "@b").unwrap_or(0);
    assert_eq!(counted as u64, 8 * 1001, "{out}\n{err}");
}

/// A thread that ends stops counting against `--max-threads` as it exits, not when
/// the agent's reaper next looks (a busy machine can delay that by tens of
/// milliseconds while hundreds of short threads come and go). With the reaper
/// looking only once a minute, 16 threads one after another under `--max-threads
/// 8` all run their advice: each holds one of the 16 slots (two per allowed
/// thread), though only one is alive at a time.
#[test]
fn ended_threads_free_their_place_under_the_limit_without_the_reaper() {
    let bin = build("short_threads.c", Variant::O2_PIE, &[]);
    let b = bin_str(&bin);
    let prog = churn_program(b);
    let cmd = format!("{b} 16 1 1000");
    let o = common::weft_with_input(
        &["--max-threads", "8", "-e", &prog, "-c", &cmd],
        &[("WEFT_REAP_MS", "60000")],
        b"",
        T,
    );
    assert_every_call_counted(&ok(&o), &text(&o.stderr), 16, 1000);
}

/// 4,300 threads alive at once: the agent has state for 4,096 threads. Hits on the
/// others run no advice, and are counted and reported: nothing is lost silently.
#[test]
fn hits_beyond_the_agents_thread_states_are_reported_exactly() {
    let bin = build("short_threads.c", Variant::O2_PIE, &[]);
    let b = bin_str(&bin);
    let prog = format!("uprobe:{b}:foo {{ @c = count(); }} uprobe:{b}:bar {{ @b = count(); }}");
    let o = weft(
        &[
            "--max-threads",
            "8192",
            "-e",
            &prog,
            "-c",
            &format!("{b} 4300 0 10 hold"),
        ],
        T,
    );
    let out = ok(&o);
    let err = text(&o.stderr);
    let lost = hits_lost(&err, "per-thread state was exhausted");
    assert!(lost > 0, "the pool ran out: {err}");
    let counted = map_value(&out, "@c").unwrap() + map_value(&out, "@b").unwrap();
    assert_eq!(counted as u64 + lost, 4300 * 11, "{out}\n{err}");
}

#[test]
fn recursion_depth_1000_with_return_probes() {
    for v in [
        Variant::O2_PIE,
        Variant {
            opt: "-O0",
            pie: true,
            cet: false,
        },
    ] {
        let bin = build("recurse.c", v, &[]);
        let b = bin_str(&bin);
        let prog = format!(
            "uprobe:{b}:depth {{ @in = count(); }} uretprobe:{b}:depth {{ @out = count(); @s = sum(retval); @m = max(retval); }}"
        );
        let out = ok(&weft(&["-e", &prog, "-c", &format!("{b} 1000")], T));
        assert_eq!(map_value(&out, "@in"), Some(1001), "{}: {out}", v.name());
        assert_eq!(map_value(&out, "@out"), Some(1001));
        assert_eq!(map_value(&out, "@s"), Some(500_500));
        assert_eq!(map_value(&out, "@m"), Some(1000));
        assert!(out.contains("depth=1000"));
    }
}

#[test]
fn longjmp_out_of_probed_frames() {
    let bin = build("unwind.c", Variant::O2_PIE, &[]);
    let b = bin_str(&bin);
    let prog = format!(
        "uprobe:{b}:jumper {{ @in = count(); }} uretprobe:{b}:jumper {{ @jret = count(); }} uretprobe:{b}:plain {{ @p = count(); @ps = sum(retval); }}"
    );
    let out = ok(&weft(&["-e", &prog, "-c", &format!("{b} 100")], T));
    assert_eq!(map_value(&out, "@in"), Some(400));
    // A scalar count() that never ran prints as 0, as in bpftrace.
    assert_eq!(
        map_value(&out, "@jret"),
        Some(0),
        "jumper never returns normally: {out}"
    );
    assert_eq!(map_value(&out, "@p"), Some(100));
    assert_eq!(map_value(&out, "@ps"), Some(4950 + 700));
    assert!(out.contains("s=5650"));
}

#[test]
fn cxx_exceptions_through_return_probes() {
    let bin = build("throw.cc", Variant::O2_PIE, &[]);
    let b = bin_str(&bin);
    let prog = format!(
        "uretprobe:{b}:_Z7throwerl {{ @t = count(); }} uretprobe:{b}:_Z5afterl {{ @a = count(); @s = sum(retval); }}"
    );
    let out = ok(&weft(&["-e", &prog, "-c", &format!("{b} 100")], T));
    assert!(out.contains("caught=100 s=5050"), "{out}");
    assert_eq!(map_value(&out, "@a"), Some(100));
    assert_eq!(map_value(&out, "@s"), Some(5050));
    assert_eq!(
        map_value(&out, "@t"),
        Some(0),
        "thrower frames are unwound, not returned from"
    );
}

/// `cat()` prints at most `max_cat_bytes` of a file (10240 by default, as bpftrace):
/// it read the whole file, so `cat("/dev/zero")` grew weft until memory ran out
/// (issue 24).
#[test]
fn cat_reads_at_most_max_cat_bytes() {
    let o = weft(&["-q", "-e", "BEGIN { cat(\"/dev/zero\"); exit(); }"], T);
    assert!(o.status.success(), "{}", text(&o.stderr));
    // The file's first 10240 bytes, then the blank lines weft (as bpftrace) prints at
    // exit.
    assert_eq!(o.stdout.len(), 10240 + 2, "{}", text(&o.stderr));
    assert!(o.stdout[..10240].iter().all(|&b| b == 0));
    assert_eq!(&o.stdout[10240..], b"\n\n");
    let file = std::env::temp_dir().join(format!("weft-cat-{}", std::process::id()));
    std::fs::write(&file, "0123456789").unwrap();
    let prog = format!(
        "config = {{ max_cat_bytes = 4 }} BEGIN {{ cat(\"{}\"); printf(\"|\"); cat(\"%s\", \"{}\"); exit(); }}",
        file.display(),
        file.display()
    );
    let out = ok(&weft(&["-q", "-e", &prog], T));
    assert_eq!(out, "0123|0123\n\n");
    // A file that cannot be opened: upstream's message, and the run goes on.
    let o = weft(
        &[
            "-q",
            "-e",
            "BEGIN { cat(\"/does/not/exist/file\"); printf(\"after\\n\"); exit(); }",
        ],
        T,
    );
    assert_eq!(ok(&o), "after\n\n\n");
    assert_eq!(
        text(&o.stderr),
        "ERROR: failed to open file '/does/not/exist/file' (No such file or directory)\n"
    );
    // A BPFTRACE_NAME environment variable sets config NAME over the script's block
    // (upstream tests/runtime/builtin "cat limited output", config "env var takes
    // precedence"); BPFTRACE_STRLEN is max_strlen.
    let child = std::process::Command::new(weft_bin())
        .args(["-q", "-e", &prog])
        .env("BPFTRACE_MAX_CAT_BYTES", "2")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    assert_eq!(ok(&wait_output(child, T)), "01|01\n\n");
    let child = std::process::Command::new(weft_bin())
        .args([
            "-q",
            "-e",
            "BEGIN { printf(\"%s\\n\", str(\"abcdefgh\")); exit(); }",
        ])
        .env("BPFTRACE_STRLEN", "4")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    assert_eq!(ok(&wait_output(child, T)), "abc\n\n\n");
    let _ = std::fs::remove_file(&file);
}

#[test]
fn begin_and_end_without_a_target() {
    let out = ok(&weft(
        &[
            "-e",
            "BEGIN { printf(\"hello %d\\n\", 42); @x = 5; exit(); } END { @y = 6; }",
        ],
        T,
    ));
    assert!(out.starts_with("hello 42\n"), "{out}");
    assert_eq!(map_value(&out, "@x"), Some(5));
    assert_eq!(map_value(&out, "@y"), Some(6));
}

#[test]
fn attach_collect_detach_restores_code() {
    let bin = build("spinner.c", Variant::O2_PIE, &[]);
    let b = bin_str(&bin);
    let mut t = Spawned::start(&bin, &[]);
    t.wait_line("ready", T);
    let pid = t.pid().to_string();
    // Leave once both probes fired (not after a fixed time the target may not get).
    let prog = format!(
        "uprobe:{b}:tick {{ @c = count(); }} uretprobe:{b}:square {{ @sq = count(); }} interval:ms:300 /@c && @sq/ {{ exit(); }}"
    );
    let o = weft(&["-e", &prog, "-p", &pid], T);
    let out = ok(&o);
    assert!(map_value(&out, "@c").unwrap() > 0, "{out}");
    assert!(map_value(&out, "@sq").unwrap() > 0, "{out}");
    std::thread::sleep(Duration::from_millis(100));
    t.assert_healthy();
    assert!(
        code_matches_file(t.pid(), &bin),
        "code restored byte for byte"
    );
    // Attaching again reuses the agent already in the process.
    let o = weft(&["-e", &prog, "-p", &pid], T);
    assert!(map_value(&ok(&o), "@c").unwrap() > 0);
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    let agents: std::collections::BTreeSet<&str> = maps
        .lines()
        .filter(|l| l.contains("libweft_agent.so"))
        .map(|l| l.split_whitespace().last().unwrap())
        .collect();
    assert_eq!(agents.len(), 1, "one agent loaded");
    std::thread::sleep(Duration::from_millis(200));
    t.assert_healthy();
    assert!(code_matches_file(t.pid(), &bin));
}

#[test]
fn sigkill_of_weft_leaves_target_running_and_restored() {
    let bin = build("spinner.c", Variant::O2_PIE, &[]);
    let b = bin_str(&bin);
    let mut t = Spawned::start(&bin, &[]);
    t.wait_line("ready", T);
    let prog =
        format!("uprobe:{b}:tick {{ @c = count(); }} uretprobe:{b}:square {{ @r = count(); }}");
    let mut w = std::process::Command::new(weft_bin())
        .args(["-e", &prog, "-p", &t.pid().to_string()])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Wait until the probes are in (the code differs from the file).
    let start = std::time::Instant::now();
    while code_matches_file(t.pid(), &bin) {
        assert!(start.elapsed() < T, "weft never patched the target");
        std::thread::sleep(Duration::from_millis(10));
    }
    std::thread::sleep(Duration::from_millis(200));
    w.kill().unwrap();
    w.wait().unwrap();
    // The agent sees its socket close and restores the code by itself: wait for that
    // (a ceiling, not a deadline: a busy machine may take its time).
    assert!(
        code_restored_within(t.pid(), &bin, T),
        "the agent never restored the code"
    );
    t.assert_healthy();
    std::thread::sleep(Duration::from_millis(300));
    t.assert_healthy();
}

#[test]
fn sigint_stops_prints_and_detaches() {
    let bin = build("spinner.c", Variant::O2_PIE, &[]);
    let b = bin_str(&bin);
    let mut t = Spawned::start(&bin, &[]);
    t.wait_line("ready", T);
    // SIGINT once the probe has fired (weft prints "live"), not after a sleep.
    let prog = format!("uprobe:{b}:tick {{ @c = count(); }} {LIVE}");
    let mut w = Background::start(&["-e", &prog, "-p", &t.pid().to_string()]);
    w.wait_line("live", false, T);
    w.signal(libc::SIGINT);
    let o = w.finish(T);
    let out = ok(&o);
    assert!(map_value(&out, "@c").unwrap() > 0, "{out}");
    t.assert_healthy();
    assert!(code_matches_file(t.pid(), &bin));
}

// ---------------------------------------------------------------------------------
// Bad input: one clear line, non-zero exit, target unharmed.
// ---------------------------------------------------------------------------------

fn fails_with(o: &std::process::Output, needle: &str) {
    assert!(!o.status.success(), "should fail: {}", text(&o.stdout));
    let err = text(&o.stderr);
    assert!(err.contains(needle), "stderr lacks {needle:?}:\n{err}");
}

#[test]
fn nonexistent_pid() {
    let o = weft(
        &[
            "-e",
            "uprobe:/bin/true:main { @c = count(); }",
            "-p",
            "999999999",
        ],
        T,
    );
    fails_with(&o, "no process with pid 999999999");
}

#[test]
fn unknown_function_suggests_close_names() {
    let bin = build("calls.c", Variant::O2_PIE, &[]);
    let b = bin_str(&bin);
    let o = weft(
        &[
            "-e",
            &format!("uprobe:{b}:wrok {{ @c = count(); }}"),
            "-c",
            b,
        ],
        T,
    );
    fails_with(&o, "did you mean `work`?");
}

#[test]
fn not_an_elf_target() {
    let dir = std::env::temp_dir().join(format!("weft-notelf-{}", std::process::id()));
    // No `#!` line: the kernel cannot run it (a script with one runs, see
    // first_hour.rs).
    std::fs::write(&dir, "echo hi\n").unwrap();
    let p = dir.to_str().unwrap();
    std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let o = weft(
        &["-e", "uprobe:/bin/true:main { @c = count(); }", "-c", p],
        T,
    );
    let _ = std::fs::remove_file(&dir);
    fails_with(&o, "is not an ELF file");
}

#[test]
fn static_target_is_refused_clearly() {
    let bin = build("calls.c", Variant::O2_PIE, &["-static"]);
    let b = bin_str(&bin);
    let o = weft(
        &[
            "-e",
            &format!("uprobe:{b}:work {{ @c = count(); }}"),
            "-c",
            &format!("{b} 5"),
        ],
        T,
    );
    fails_with(&o, "statically linked");
}

#[test]
fn syntax_error_is_located() {
    let o = weft(&["-e", "BEGIN { printf(\"x\") \n  @a = ; }"], T);
    assert_eq!(o.status.code(), Some(1));
    let err = text(&o.stderr);
    assert!(err.contains("-e:2:"), "{err}");
    assert!(err.contains('^'), "{err}");
}

#[test]
fn list_functions_of_a_binary_and_a_process() {
    let bin = build("calls.c", Variant::O2_PIE, &[]);
    let b = bin_str(&bin);
    let o = weft(&["list", "w*", b], T);
    assert_eq!(
        ok(&o),
        format!("uprobe:{}:work\n", bin.canonicalize().unwrap().display())
    );
    let all = ok(&weft(&["list", b], T));
    for f in ["main", "work", "tiny", "spin", "loopy", "many_args"] {
        assert!(all.contains(&format!(":{f}\n")), "{f} missing: {all}");
    }
    // bpftrace's -l spelling, against a running process's libraries.
    let spinner = build("spinner.c", Variant::O2_PIE, &[]);
    let t = Spawned::start(&spinner, &[]);
    t.wait_line("ready", T);
    let libc = ok(&weft(
        &["-l", "uprobe:*libc.so*:malloc", "-p", &t.pid().to_string()],
        T,
    ));
    assert!(
        libc.lines().any(|l| l.ends_with("libc.so.6:malloc")),
        "{libc}"
    );
}

#[test]
fn attaching_without_ptrace_rights_is_refused_with_the_reason() {
    // An unprivileged user may not ptrace root's process.
    let bin = build("spinner.c", Variant::O2_PIE, &[]);
    let mut t = Spawned::start(&bin, &[]);
    t.wait_line("ready", T);
    let b = bin_str(&bin);
    let prog = format!("uprobe:{b}:tick {{ @c = count(); }}");
    let out = std::process::Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(weft_bin())
        .args(["-e", &prog, "-p", &t.pid().to_string()])
        .output()
        .expect("setpriv (util-linux) runs weft as nobody");
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(err.to_lowercase().contains("permission denied"), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
    t.assert_healthy();
    assert!(code_matches_file(t.pid(), &bin));
}

#[test]
fn sigint_during_attach_leaves_the_target_unharmed() {
    let bin = build("spinner.c", Variant::O2_PIE, &[]);
    let b = bin_str(&bin);
    for delay_ms in [0u64, 5, 20, 60] {
        let mut t = Spawned::start(&bin, &[]);
        t.wait_line("ready", T);
        let prog =
            format!("uprobe:{b}:tick {{ @c = count(); }} uretprobe:{b}:square {{ @r = count(); }}");
        let mut cmd = std::process::Command::new(weft_bin());
        cmd.args(["-e", &prog, "-p", &t.pid().to_string()])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        // weft starts with SIGINT's default action, whatever this test inherited (a
        // suite run from a script in the background ignores SIGINT, and an ignored
        // SIGINT that comes before weft sets its handler is lost: weft would never end).
        // SAFETY: signal() is async-signal-safe.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(&mut cmd, || {
                libc::signal(libc::SIGINT, libc::SIG_DFL);
                Ok(())
            });
        }
        let w = cmd.spawn().unwrap();
        std::thread::sleep(Duration::from_millis(delay_ms));
        // SAFETY: signalling our child.
        unsafe { libc::kill(w.id() as i32, libc::SIGINT) };
        let o = wait_output(w, T);
        // Either it stopped before weaving or it wove, printed and unwove: both fine,
        // but it must end, and the target must be running with its own code.
        let _ = o;
        // Restored by weft before it ended, or by the agent once its socket closed.
        assert!(
            code_restored_within(t.pid(), &bin, T),
            "delay {delay_ms} ms"
        );
        std::thread::sleep(Duration::from_millis(300));
        t.assert_healthy();
    }
}

#[test]
fn target_exiting_while_weft_attaches() {
    // A short-lived target: whatever moment weft catches it at, weft ends with a
    // clear outcome and never hangs.
    let bin = build("calls.c", Variant::O2_PIE, &[]);
    let b = bin_str(&bin);
    for n in ["200000", "2000000", "20000000"] {
        let child = std::process::Command::new(&bin)
            .arg(n)
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let prog = format!("uprobe:{b}:work {{ @c = count(); }}");
        let o = weft(&["-e", &prog, "-p", &child.id().to_string()], T);
        let err = text(&o.stderr);
        if !o.status.success() {
            assert!(
                err.contains("exited") || err.contains("no process") || err.contains("zombie"),
                "{err}"
            );
            assert_eq!(
                err.trim()
                    .lines()
                    .filter(|l| l.starts_with("weft:"))
                    .count(),
                1,
                "{err}"
            );
        }
        let mut child = child;
        let _ = child.wait();
    }
}

#[test]
fn attach_runs_threads_out_of_the_c_library_to_their_callers() {
    // Threads inside memset (64 MiB each round) are not single-stepped out: the C
    // library's call-frame information gives the return address in the program,
    // and each thread runs there in one go (a hardware breakpoint). Whether an
    // attach finds a thread in memset is the machine's timing (nearly always: the
    // rounds are all memset), so fresh targets are attached to until one did.
    let bin = build("libcbusy.c", Variant::O2_PIE, &["-pthread"]);
    let b = bin_str(&bin);
    let prog = format!("uprobe:{b}:tick {{ @c = count(); }} interval:ms:100 /@c/ {{ exit(); }}");
    let mut lines = Vec::new();
    for _ in 0..20 {
        let child = std::process::Command::new(&bin)
            .args(["0", "2", "fill"])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let o = weft(&["-v", "-e", &prog, "-p", &child.id().to_string()], T);
        signal_when_caught(child.id(), libc::SIGUSR1);
        let got = child.wait_with_output().unwrap();
        let err = text(&o.stderr);
        assert!(
            got.status.success(),
            "target ended with {}: {err}",
            got.status
        );
        check_libcbusy(&text(&got.stdout), "fill").unwrap();
        assert!(map_value(&ok(&o), "@c").is_some_and(|c| c > 0));
        let line = err
            .lines()
            .find(|l| l.contains("agent loaded into"))
            .unwrap_or_else(|| panic!("no agent line: {err}"))
            .to_string();
        let counts: Vec<usize> = line
            .split("C library: ")
            .nth(1)
            .map(|rest| {
                rest.split(|c: char| !c.is_ascii_digit())
                    .filter(|w| !w.is_empty())
                    .map(|w| w.parse().unwrap())
                    .collect()
            })
            .unwrap_or_default();
        if let [ran, stepped] = counts[..] {
            // Threads found in memset were run out, none stepped.
            assert!(ran >= 1 && stepped == 0, "{line}");
            return;
        }
        lines.push(line);
    }
    panic!("no attach found a thread in memset in 20 tries: {lines:?}");
}

#[test]
fn attach_whose_runs_run_out_of_time_leaves_no_breakpoint() {
    // Threads inside memset are run to their return address, to a hardware
    // breakpoint, within a time budget. A run whose budget ran out just as the
    // thread reached the breakpoint left the thread half-settled, the breakpoint
    // could not be cleared, and the thread met it after the detach with no one to
    // take its SIGTRAP: the target died. A budget of a few hundred microseconds
    // (WEFT_TEST_STEP_BUDGET_US) makes runs run out at every look; before the fix
    // most of these attaches killed the target.
    let bin = build("libcbusy.c", Variant::O2_PIE, &["-pthread"]);
    let b = bin_str(&bin);
    let prog = format!("uprobe:{b}:tick {{ @c = count(); }} interval:ms:50 /@c/ {{ exit(); }}");
    for (case, budget) in ["200", "500", "1000", "2000"]
        .iter()
        .cycle()
        .take(12)
        .enumerate()
    {
        let child = std::process::Command::new(&bin)
            .args(["0", "2", "fill"])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let w = std::process::Command::new(weft_bin())
            .args(["-e", &prog, "-p", &child.id().to_string()])
            .env("WEFT_TEST_STEP_BUDGET_US", budget)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let o = wait_output(w, T);
        signal_when_caught(child.id(), libc::SIGUSR1);
        let got = child.wait_with_output().unwrap();
        assert!(
            got.status.success(),
            "case {case} ({budget} us): target ended with {} after weft said: {}",
            got.status,
            text(&o.stderr)
        );
        check_libcbusy(&text(&got.stdout), "fill")
            .unwrap_or_else(|e| panic!("case {case} ({budget} us): {e}"));
        assert!(
            map_value(&ok(&o), "@c").is_some_and(|c| c > 0),
            "case {case} ({budget} us)"
        );
    }
}

#[test]
fn attach_never_nests_in_the_c_library() {
    // The target lives inside malloc, free and atexit: a remote dlopen nested in
    // one of them corrupts the heap or deadlocks. weft must borrow a thread only at a
    // safe point, and the target must finish with its own exact result. The target
    // runs until told (SIGUSR1, sent once weft is done): the test never depends on
    // how long the attach takes on this machine.
    let bin = build("libcbusy.c", Variant::O2_PIE, &["-pthread"]);
    let b = bin_str(&bin);
    // "grow" keeps the heap growing and being trimmed: the old attach killed that
    // every time.
    for (threads, mode, cases) in [
        ("1", "churn", 5),
        ("4", "churn", 3),
        ("1", "grow", 4),
        ("4", "grow", 2),
    ] {
        for case in 0..cases {
            let child = std::process::Command::new(&bin)
                .args(["0", threads, mode])
                .stdout(std::process::Stdio::piped())
                .spawn()
                .unwrap();
            // Attach at a different point of its run each time (a sleep only varies
            // where weft finds it; nothing waits on it).
            std::thread::sleep(Duration::from_millis(15 + 25 * case));
            // Leaves once it counted (not after a fixed time a loaded machine may
            // spend attaching).
            let prog =
                format!("uprobe:{b}:tick {{ @c = count(); }} interval:ms:100 /@c/ {{ exit(); }}");
            let o = weft(&["-e", &prog, "-p", &child.id().to_string()], T);
            signal_when_caught(child.id(), libc::SIGUSR1);
            let got = child.wait_with_output().unwrap();
            assert!(
                got.status.success(),
                "{mode}, {threads} threads, case {case}: target ended with {} after weft said: {}",
                got.status,
                text(&o.stderr)
            );
            let rounds = check_libcbusy(&text(&got.stdout), mode)
                .unwrap_or_else(|e| panic!("{mode}, {threads} threads, case {case}: {e}"));
            assert_eq!(rounds.len(), threads.parse::<usize>().unwrap());
            let out = ok(&o);
            assert!(
                map_value(&out, "@c").is_some_and(|c| c > 0),
                "{mode}, {threads} threads, case {case}: {out}"
            );
        }
    }
}

/// Three processes of one program in one session (`-p A,B -p C`): each counted
/// exactly, by pid and merged, in maps the three share.
#[test]
fn one_session_over_three_processes() {
    let bin = build("member.c", Variant::O2_PIE, &[]);
    let b = bin_str(&bin);
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
        "uprobe:{b}:ping /@seen[pid] == 0/ {{ @seen[pid] = 1; printf(\"live %d %s\\n\", pid, comm); }} \
         uprobe:{b}:work {{ @w[pid] = count(); @all = count(); @sum[pid] = sum(arg0); }} \
         interval:ms:20 /@all == {total}/ {{ exit(); }}"
    );
    let first_two = format!("{},{}", pids[0], pids[1]);
    let mut w = Background::start(&["-e", &prog, "-p", &first_two, "-p", &pids[2]]);
    // The counted calls start once the probes are live in all three.
    for _ in 0..3 {
        w.wait_line("live ", false, T);
    }
    for t in &targets {
        // SAFETY: signalling our own child.
        unsafe { libc::kill(t.pid(), libc::SIGUSR1) };
    }
    let o = w.finish(T);
    let out = ok(&o);
    assert_eq!(map_value(&out, "@all"), Some(total as i64), "{out}");
    for (t, n) in targets.iter().zip(ns) {
        let pid = t.pid();
        assert!(out.contains(&format!("live {pid} member")), "{out}");
        assert_eq!(
            map_value(&out, &format!("@w[{pid}]")),
            Some(n as i64),
            "{out}"
        );
        let sum = (n * (n - 1) / 2) as i64;
        assert_eq!(map_value(&out, &format!("@sum[{pid}]")), Some(sum), "{out}");
    }
    for mut t in targets {
        t.wait_line("done", T);
        assert!(code_matches_file(t.pid(), &bin));
        // SAFETY: signalling our own child.
        unsafe { libc::kill(t.pid(), libc::SIGUSR2) };
        assert!(t.child.wait().unwrap().success());
    }
}

/// A pid that cannot be attached to among several: the others are woven and that
/// one reported; with --all-or-nothing the session is refused, nothing woven.
#[test]
fn one_bad_pid_among_several() {
    let bin = build("member.c", Variant::O2_PIE, &[]);
    let b = bin_str(&bin);
    let t = Spawned::start(&bin, &["10"]);
    t.wait_line("ready", T);
    // A pid that is no process: a child that has been reaped.
    let mut gone = std::process::Command::new("true").spawn().unwrap();
    gone.wait().unwrap();
    let prog = format!("uprobe:{b}:ping {{ @c = count(); }} interval:ms:20 /@c/ {{ exit(); }}");
    let list = format!("{},{}", t.pid(), gone.id());
    let o = weft(&["-e", &prog, "-p", &list], T);
    let err = text(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(
        err.contains(&format!(
            "process {} left out: no process with pid",
            gone.id()
        )),
        "{err}"
    );
    assert!(map_value(&ok(&o), "@c").is_some_and(|c| c > 0));
    let o = weft(&["--all-or-nothing", "-e", &prog, "-p", &list], T);
    let err = text(&o.stderr);
    assert!(!o.status.success());
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("--all-or-nothing: nothing woven"), "{err}");
    assert!(code_matches_file(t.pid(), &bin));
    let mut t = t;
    let _ = t.child.kill();
    let _ = t.child.wait();
}

/// `weft -c CMD` with its stdin piped: `line` written to it once weft runs (the
/// command reads it only after the probes are in: it starts once weft says go).
fn weft_with_input(args: &[&str], line: &str) -> std::process::Output {
    use std::io::Write;
    let mut w = std::process::Command::new(weft_bin())
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut input = w.stdin.take().unwrap();
    input.write_all(line.as_bytes()).unwrap();
    drop(input);
    wait_output(w, T)
}

/// A forking server: every call of every child it forks is counted, with the
/// parent's, exactly (the children stay woven and join the session); without
/// --follow-fork only the parent's are.
#[test]
fn follow_fork_counts_every_child() {
    let bin = build("forkserver.c", Variant::O2_PIE, &[]);
    let b = bin_str(&bin);
    let prog = format!(
        "uprobe:{b}:work {{ @all = count(); @pids[pid] = count(); }} uprobe:{b}:done {{ @done = count(); }}"
    );
    let cmd = format!("{b} 200 100");
    let o = weft_with_input(&["--follow-fork", "-e", &prog, "-c", &cmd], "go\n");
    let out = ok(&o);
    assert!(out.contains("served 200 5050"), "{out}");
    assert_eq!(map_value(&out, "@all"), Some(100 + 200 * 100), "{out}");
    assert_eq!(map_value(&out, "@done"), Some(1), "{out}");
    // 201 processes, 100 calls each.
    let per_pid: Vec<&str> = out.lines().filter(|l| l.starts_with("@pids[")).collect();
    assert_eq!(per_pid.len(), 201, "{out}");
    assert!(per_pid.iter().all(|l| l.ends_with(": 100")), "{out}");
    // Without it, the children are unwoven: only the parent's calls count.
    let o = weft_with_input(&["-e", &prog, "-c", &cmd], "go\n");
    let out = ok(&o);
    assert_eq!(map_value(&out, "@all"), Some(100), "{out}");
}

/// Attached with --follow-fork (`-p`): children forked afterwards are counted too.
#[test]
fn follow_fork_after_attach() {
    use std::io::Write;
    let bin = build("forkserver.c", Variant::O2_PIE, &[]);
    let b = bin_str(&bin);
    let mut t = std::process::Command::new(&bin)
        .args(["50", "100"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = std::io::BufReader::new(t.stdout.take().unwrap());
    let mut line = String::new();
    std::io::BufRead::read_line(&mut out, &mut line).unwrap();
    assert_eq!(line, "ready\n");
    let prog = format!(
        "uprobe:{b}:work {{ @all = count(); }} uprobe:{b}:done {{ @done = count(); }} \
         interval:ms:20 /@done/ {{ exit(); }} {LIVE}"
    )
    .replace("@c > 0", "@all >= 0");
    let mut w = Background::start(&["--follow-fork", "-e", &prog, "-p", &t.id().to_string()]);
    w.wait_line("live", false, T);
    t.stdin.take().unwrap().write_all(b"go\n").unwrap();
    let o = w.finish(T);
    let text_out = ok(&o);
    assert_eq!(
        map_value(&text_out, "@all"),
        Some(100 + 50 * 100),
        "{text_out}"
    );
    assert!(t.wait().unwrap().success());
}

/// What a launched command's processes exec (or posix_spawn) joins the session: the
/// probes are resolved against the new image, woven before its main runs.
#[test]
fn follow_fork_into_exec_and_posix_spawn() {
    let server = build("forkserver.c", Variant::O2_PIE, &[]);
    let worker = build("worker.c", Variant::O2_PIE, &[]);
    let (s, w) = (bin_str(&server), bin_str(&worker));
    let prog = format!("uprobe:{w}:step {{ @steps[comm] = count(); @n = count(); }}");
    for (mode, k, n) in [("exec", 3, 100), ("posix_spawn", 5, 1000)] {
        let cmd = format!("{s} {k} {n} {mode} {w}");
        let o = weft_with_input(&["--follow-fork", "-e", &prog, "-c", &cmd], "go\n");
        let out = ok(&o);
        assert!(out.contains(&format!("served {k} ")), "{mode}: {out}");
        assert_eq!(map_value(&out, "@n"), Some(k * n), "{mode}: {out}");
        assert_eq!(
            map_value(&out, "@steps[worker]"),
            Some(k * n),
            "{mode}: {out}"
        );
    }
}

/// `--record FILE`: every record in weft's record format, read back by a program
/// that is not weft (`scripts/weft-record-dump`, Python): printf arguments, the
/// final maps, each with the process and thread that produced it.
#[test]
fn record_file_is_read_by_another_tool() {
    let bin = build("calls.c", Variant::O2_PIE, &[]);
    let b = bin_str(&bin);
    let dir = std::env::temp_dir().join(format!("weft-record-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("session.weftrec");
    let prog = format!(
        "uprobe:{b}:work /@n < 3/ {{ @n = count(); printf(\"work %d in %s\\n\", arg0, comm); }} \
         END {{ @total = count(); }}"
    );
    let o = weft(
        &[
            "--record",
            file.to_str().unwrap(),
            "-e",
            &prog,
            "-c",
            &format!("{b} 100"),
        ],
        T,
    );
    let out = ok(&o);
    assert_eq!(out.matches("work ").count(), 3, "{out}");
    let dump = std::process::Command::new(repo_root().join("scripts/weft-record-dump"))
        .arg(&file)
        .output()
        .expect("python3 runs scripts/weft-record-dump");
    assert!(dump.status.success(), "{}", text(&dump.stderr));
    let lines: Vec<serde_json::Value> = text(&dump.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines[0]["kind"], "metadata");
    let printfs: Vec<&serde_json::Value> = lines.iter().filter(|l| l["kind"] == "printf").collect();
    assert_eq!(printfs.len(), 3, "{lines:?}");
    for p in &printfs {
        assert_eq!(p["text"], "work %d in %s\n");
        assert_eq!(p["args"][1], "calls");
        assert!(p["pid"].as_u64().unwrap() > 0 && p["tid"] == p["pid"]);
    }
    // The arguments are the first three calls' (work(i) for i = 0, 1, 2 in calls.c).
    let firsts: Vec<i64> = printfs
        .iter()
        .map(|p| p["args"][0].as_i64().unwrap())
        .collect();
    assert_eq!(
        firsts,
        out.lines()
            .filter_map(|l| l.strip_prefix("work "))
            .map(|l| l.split(' ').next().unwrap().parse().unwrap())
            .collect::<Vec<i64>>()
    );
    let finals: Vec<&serde_json::Value> =
        lines.iter().filter(|l| l["kind"] == "final_map").collect();
    let n = finals.iter().find(|m| m["name"] == "@n").unwrap();
    assert_eq!(n["entries"][0]["value"], 3);
    let total = finals.iter().find(|m| m["name"] == "@total").unwrap();
    assert_eq!(total["entries"][0]["value"], 1);
    let _ = std::fs::remove_dir_all(&dir);
}

/// `exit(code)` is weft's exit status (its low 8 bits, as a process's), from BEGIN
/// and from advice in the target; `exit()` ends the probe it is in.
#[test]
fn exit_code_is_the_exit_status() {
    let o = weft(&["-e", "BEGIN { exit(69); }"], T);
    assert_eq!(o.status.code(), Some(69), "{}", text(&o.stderr));
    let o = weft(&["-e", "BEGIN { exit(256 + 7); }"], T);
    assert_eq!(o.status.code(), Some(7));
    let bin = build("calls.c", Variant::O2_PIE, &[]);
    let b = bin_str(&bin);
    let o = weft(
        &[
            "-e",
            &format!("uprobe:{b}:work {{ @n = count(); exit(3); @after = 1; }}"),
            "-c",
            b,
        ],
        T,
    );
    assert_eq!(o.status.code(), Some(3), "{}", text(&o.stderr));
    let out = text(&o.stdout);
    // The target runs on while weft notices the exit (as with bpftrace): calls go
    // on being counted, but nothing after `exit()` ever runs.
    assert!(map_value(&out, "@n").unwrap() >= 1, "{out}");
    assert!(!out.contains("@after"), "{out}");
}

/// USDT probes one NOP apart: every one is woven (an `int3` where a jump would
/// cover the next site) and fires exactly as often as it runs, arguments intact.
#[test]
fn adjacent_usdt_sites_are_all_woven() {
    for v in all_variants() {
        let bin = build("sdt_adjacent.c", v, &[]);
        let b = bin_str(&bin);
        let o = weft(
            &[
                "-e",
                &format!(
                    "usdt:{b}:app:* {{ @[probe] = count(); }} usdt:{b}:app:p3 {{ @sum = sum(arg0 + arg9); }}"
                ),
                "-c",
                &format!("{b} 7"),
            ],
            T,
        );
        let (out, err) = (ok(&o), text(&o.stderr));
        assert!(!err.contains("not woven"), "{}: {err}", v.name());
        for p in 0..6 {
            assert_eq!(
                map_value(&out, &format!("@[usdt:{b}:app:p{p}]")),
                Some(7),
                "{}: p{p}: {out}",
                v.name()
            );
        }
        // arg0 is argc (2), arg9 is 10.
        assert_eq!(map_value(&out, "@sum"), Some(7 * 12), "{}: {out}", v.name());
    }
}

/// Upstream's command-line forms: the program on standard input (`-`), `--dry-run`
/// (checked, nothing run or touched), `--no-warnings`, `--info`.
#[test]
fn program_from_stdin_dry_run_no_warnings_info() {
    use std::io::Write;
    let mut c = std::process::Command::new(weft_bin())
        .args(["-q", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    c.stdin
        .take()
        .unwrap()
        .write_all(b"BEGIN { printf(\"from stdin\\n\"); exit(); }")
        .unwrap();
    let o = wait_output(c, T);
    assert_eq!(ok(&o), "from stdin\n\n\n");
    // --dry-run: a good program exits 0 having printed nothing and left the target
    // alone; a bad one is reported and exits 1.
    let bin = build("spinner.c", Variant::O2_PIE, &[]);
    let b = bin_str(&bin);
    let mut t = Spawned::start(&bin, &[]);
    t.wait_line("ready", T);
    let pid = t.pid().to_string();
    let prog = format!("uprobe:{b}:tick {{ printf(\"hit\\n\"); }}");
    let o = weft(&["--dry-run", "-e", &prog, "-p", &pid], T);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert_eq!(text(&o.stdout), "");
    assert!(code_matches_file(t.pid(), &bin));
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    assert!(!maps.contains("libweft_agent"), "dry run loaded the agent");
    t.assert_healthy();
    let o = weft(&["--dry-run", "-e", "BEGIN { exit() "], T);
    assert_eq!(o.status.code(), Some(1));
    // --no-warnings: the warning goes, the run does not.
    let calls = build("calls.c", Variant::O2_PIE, &[]);
    let c = bin_str(&calls);
    let prog = format!("uretprobe:{c}:work /retval < 0/ {{ @neg = count(); }}");
    let o = weft(&["--no-warnings", "-e", &prog, "-c", c], T);
    assert!(o.status.success());
    assert!(!text(&o.stderr).contains("warning"), "{}", text(&o.stderr));
    let o = weft(&["--info"], T);
    let out = ok(&o);
    assert!(out.starts_with("System\n  OS: Linux"), "{out}");
    assert!(out.contains("uprobe, uretprobe, usdt: yes"), "{out}");
}

/// Named program parameters (upstream's man page, Program Options): a
/// name the program does not read is refused (a typo would otherwise go unnoticed),
/// as is a value of the wrong type; positional parameters go on after `--`.
#[test]
fn named_parameters_after_dashes() {
    let prog =
        r#"BEGIN { printf("%d %s %s\n", getopt("n", 1), getopt("s", "x"), str($2)); exit(); }"#;
    let o = weft(&["-q", "-e", prog, "a", "--", "--n=5", "b", "--s=yes"], T);
    assert_eq!(ok(&o), "5 yes b\n\n\n");
    let o = weft(&["-q", "-e", prog, "--", "--m=5"], T);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        text(&o.stderr)
            .contains("--m: the program has no named parameter `m` (getopt); it has --n, --s"),
        "{}",
        text(&o.stderr)
    );
    let o = weft(&["-q", "-e", prog, "--", "--n=five"], T);
    assert_eq!(o.status.code(), Some(1));
    assert!(text(&o.stderr).contains("--n=five: `n` is an integer parameter"));
    // Before `--` too, as bpftrace takes them (upstream's other/"named and
    // positional params"): an option that is none of weft's is a named parameter
    // once there is a program; without one it is a usage error.
    let o = weft(&["-q", "-e", prog, "--n=7", "a", "--s=z", "--", "b"], T);
    assert_eq!(ok(&o), "7 z b\n\n\n");
    let o = weft(&["-q", "--bogus"], T);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        text(&o.stderr).contains("unexpected argument '--bogus' found"),
        "{o:?}"
    );
}

/// `-o FILE` holds what bpftrace's does: printed lines and maps, without the blank
/// lines before the maps (those go to standard output, as bpftrace writes them).
#[test]
fn output_file_has_no_extra_blank_lines() {
    let file = std::env::temp_dir().join(format!("weft-o-{}.txt", std::process::id()));
    let o = weft(
        &[
            "-q",
            "-o",
            file.to_str().unwrap(),
            "-e",
            "BEGIN { printf(\"a\\n\"); @x = 1; @y[2] = 3; exit(); }",
        ],
        T,
    );
    assert!(o.status.success(), "{}", text(&o.stderr));
    let written = std::fs::read_to_string(&file).unwrap();
    let _ = std::fs::remove_file(&file);
    assert_eq!(written, "a\n@x: 1\n@y[2]: 3\n");
    assert_eq!(text(&o.stdout), "\n\n");
}

/// Upstream bpftrace's run-time warnings (src/output/text.cpp `runtime_error`, not in
/// 0.17): a division or remainder by zero gives 1 and `stdin:L:C-C: WARNING: Divide
/// or modulo by 0 detected. ...` where it happens, with the source line (weft adds
/// their number at exit); an update a full map drops gives `WARNING: Map full; can't
/// update element. ...`, which weft prints once at exit on stderr, with the count on
/// an `Additional Info` line, and the map keeps the counts of the keys it holds. The
/// division runs in the target's inline trampoline (a scalar sum at a jump site, -O2
/// PIE), in its general advice (beside a keyed map) and in weft (BEGIN).
#[test]
fn division_by_zero_gives_1_and_a_full_map_warns_as_upstream() {
    let bin = build("calls.c", Variant::O2_PIE, &[]);
    let b = bin_str(&bin);
    let prog = format!(
        "config = {{ max_map_keys = 4 }}
         BEGIN {{ $z = 0; @b = 5 / $z; @r = 5 % $z; }}
         uprobe:{b}:work {{ @d = sum(10 / (arg0 - arg0)); @m = sum(10 % (arg0 - arg0)); }}
         uprobe:{b}:work {{ @k[arg0 % 10] = count(); @g[arg0 % 2] = sum(arg0 / (arg0 - arg0)); }}"
    );
    let o = weft(&["-e", &prog, "-c", &format!("{b} 100")], T);
    let out = ok(&o);
    let err = text(&o.stderr);
    assert_eq!(map_value(&out, "@b"), Some(1), "{out}");
    assert_eq!(map_value(&out, "@r"), Some(1), "{out}");
    assert_eq!(map_value(&out, "@d"), Some(100), "{out}");
    assert_eq!(map_value(&out, "@m"), Some(100), "{out}");
    for k in 0..4 {
        assert_eq!(map_value(&out, &format!("@k[{k}]")), Some(10), "{out}");
    }
    assert_eq!(map_value(&out, "@k[4]"), None, "{out}");
    assert_eq!(map_value(&out, "@g[0]"), Some(50), "{out}");
    assert_eq!(map_value(&out, "@g[1]"), Some(50), "{out}");
    // Each division by zero is warned where it happened (upstream's words and
    // layout: the place, the source line, `~` under the expression).
    let heads: Vec<&str> = err
        .lines()
        .filter(|l| l.contains(": WARNING: Divide or modulo by 0 detected."))
        .collect();
    assert_eq!(heads.len(), 302, "{err}");
    assert!(
        err.contains(
            "stdin:2:31-37: WARNING: Divide or modulo by 0 detected. This can lead to unexpected results. 1 is being used as the result.\n         BEGIN { $z = 0; @b = 5 / $z; @r = 5 % $z; }\n                              ~~~~~~\n"
        ),
        "{err}"
    );
    let lines: Vec<&str> = err
        .lines()
        .filter(|l| {
            !l.starts_with("Attached ")
                && !l.starts_with("stdin:")
                && !l.starts_with(' ')
                && !l.starts_with("BEGIN")
                && !l.starts_with("uprobe")
        })
        .collect();
    assert_eq!(
        lines,
        [
            "weft: 302 divisions or remainders by zero gave 1 (each warned where it happened)",
            "WARNING: Map full; can't update element. Try increasing max_map_keys config or manually setting the max entries in a map declaration e.g. `let @k = hash(5000)`",
            "Additional Info - map: @k, updates dropped: 60",
        ],
        "{err}"
    );
}

/// A script that includes `tests/targets/hdr.h` (`#include` with `-I`, and
/// `--include`) reads `hdr.c`'s structs by casting `arg0`, with the header's
/// typedefs, enum and `#define` constants, `sizeof` and `offsetof`: exact values.
#[test]
fn include_c_header_structs_casts_and_constants() {
    let bin = build("hdr.c", Variant::O2_PIE, &[]);
    let b = bin_str(&bin);
    let targets = repo_root().join("tests/targets");
    let body = format!(
        r#"uprobe:{b}:rec_show {{
  $r = (struct rec *)arg0;
  printf("%d %d %d %s %d %d %d %d\n", $r->id, $r->pos.x, $r->pos.y, $r->name, $r->kind, $r->flags, $r->vals[1], $r->kind == REC_HUGE);
  printf("%d\n", (rec_id_t)$r->id + REC_BIG);
}}
END {{ printf("%d %d %d %d %d\n", sizeof(struct rec), offsetof(struct rec, vals), REC_NAME_LEN, REC_MAGIC, sizeof(rec_id_t)); }}"#
    );
    let want = "42 1 2 first 4 3 20 0\n46\n7 -3 4 second 5 9 -200 1\n11\n48 24 12 24301 4";
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("include-e2e");
    std::fs::create_dir_all(&dir).unwrap();
    let script = dir.join("rec.bt");
    std::fs::write(&script, format!("#include \"hdr.h\"\n{body}\n")).unwrap();
    let inc = targets.to_str().unwrap();
    for args in [
        vec!["-I", inc, script.to_str().unwrap()],
        vec!["--include", "hdr.h", "-I", inc, "-e", &body],
    ] {
        let mut argv = args.clone();
        argv.extend(["-c", b]);
        let out = ok(&weft(&argv, T));
        let events: Vec<&str> = out
            .lines()
            .filter(|l| !l.is_empty() && !l.starts_with("s="))
            .collect();
        assert_eq!(events.join("\n"), want, "{args:?}: {out}");
    }
    // Without -I the header is not found, and the message says where weft looked.
    let o = weft(&[script.to_str().unwrap(), "-c", b], T);
    let err = text(&o.stderr);
    assert!(!o.status.success());
    assert!(
        err.contains("header \"hdr.h\" not found; searched ")
            && err.contains(
                "include-e2e, /usr/local/include, /usr/include/x86_64-linux-gnu, /usr/include"
            ),
        "{err}"
    );
}
