//! Source-line probes (`uprobe:BIN@FILE:LINE`) and `--debuginfo=DIR`. Target:
//! tests/targets/srcline.c, whose lines the tests find by their marker comments.
//! Each site weft attaches to is checked against binutils (`objdump
//! --dwarf=decodedline` for where the line's code starts, `addr2line` back to the
//! line, `nm` for a function's entry), and each count against what the program
//! runs: step(i) for i = 1..10.

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::*;

const T: Duration = Duration::from_secs(120);

const O0_NOPIE: Variant = Variant {
    opt: "-O0",
    pie: false,
    cet: false,
};

const O0_PIE: Variant = Variant {
    opt: "-O0",
    pie: true,
    cet: true,
};

/// The line of `srcline.c` that carries `/* MARKER */`.
fn line_of(marker: &str) -> u32 {
    let src = std::fs::read_to_string(repo_root().join("tests/targets/srcline.c")).unwrap();
    let want = format!("/* {marker} */");
    let found: Vec<usize> = src
        .lines()
        .enumerate()
        .filter(|(_, l)| l.contains(&want))
        .map(|(i, _)| i + 1)
        .collect();
    assert_eq!(found.len(), 1, "marker {marker}");
    found[0] as u32
}

fn tool(cmd: &str, args: &[&str]) -> String {
    let o = Command::new(cmd).args(args).output().expect(cmd);
    assert!(o.status.success(), "{cmd} {args:?}: {}", text(&o.stderr));
    text(&o.stdout)
}

/// Where binutils says `line`'s code starts: the first `is_stmt` row of each run
/// of consecutive rows of the line in `objdump --dwarf=decodedline`.
fn objdump_starts(bin: &Path, line: u32) -> Vec<u64> {
    let out = tool("objdump", &["--dwarf=decodedline", bin.to_str().unwrap()]);
    let mut starts = Vec::new();
    let mut in_run = false;
    for l in out.lines() {
        let f: Vec<&str> = l.split_whitespace().collect();
        if f.len() < 3 || !f[0].ends_with("srcline.c") || !f[2].starts_with("0x") {
            in_run = false;
            continue;
        }
        let here = f[1].parse::<u32>().ok() == Some(line);
        if here && !in_run && f.last() == Some(&"x") {
            starts.push(u64::from_str_radix(&f[2][2..], 16).unwrap());
            in_run = true;
        } else if !here {
            in_run = false;
        }
    }
    starts
}

/// `addr2line`'s `FILE:LINE` for an address (the file's base name).
fn addr2line(bin: &Path, addr: u64) -> String {
    let out = tool(
        "addr2line",
        &["-e", bin.to_str().unwrap(), &format!("{addr:#x}")],
    );
    let first = out.lines().next().unwrap_or("");
    let place = first.split(' ').next().unwrap();
    place.rsplit('/').next().unwrap().to_string()
}

fn nm_addr(bin: &Path, sym: &str) -> u64 {
    let out = tool("nm", &[bin.to_str().unwrap()]);
    let line = out
        .lines()
        .find(|l| l.ends_with(&format!(" {sym}")))
        .unwrap();
    u64::from_str_radix(line.split(' ').next().unwrap(), 16).unwrap()
}

/// A map keyed by addresses (`@m[4198710]: 10`), by address.
fn by_addr(out: &str, map: &str) -> BTreeMap<u64, i64> {
    keyed(out, map)
        .into_iter()
        .map(|(k, v)| (k.parse().unwrap(), v))
        .collect()
}

fn run(bin: &Path, prog: &str, extra: &[&str]) -> std::process::Output {
    let cmd = format!("{} 10", bin.display());
    let mut args = vec!["-e", prog, "-c", &cmd];
    args.extend(extra);
    weft(&args, T)
}

#[test]
fn line_probes_fire_where_the_line_table_starts_each_line() {
    let bin = build("srcline.c", O0_NOPIE, &[]);
    let b = bin.display();
    let lines = [
        ("SL_ADD", "@add"),
        ("SL_IF", "@cond"),
        ("SL_THIRD", "@third"),
        ("SL_LOOP", "@loop"),
    ];
    let prog: String = lines
        .iter()
        .map(|(m, map)| {
            format!(
                "uprobe:{b}@srcline.c:{} {{ {map}[reg(\"ip\")] = count(); }} ",
                line_of(m)
            )
        })
        .collect();
    let out = ok(&run(&bin, &prog, &[]));
    assert!(out.contains("total=355\n"), "{out}");
    for (marker, map) in lines {
        let line = line_of(marker);
        let got = by_addr(&out, map);
        let starts = objdump_starts(&bin, line);
        assert_eq!(
            got.keys().copied().collect::<Vec<_>>(),
            starts,
            "{marker} (line {line}): {out}"
        );
        for a in got.keys() {
            assert_eq!(addr2line(&bin, *a), format!("srcline.c:{line}"), "{out}");
        }
    }
    // What the program runs: step(i) ten times, i % 3 == 0 three times, the loop
    // line started once and incremented (and tested) ten times.
    let counts = |map: &str| by_addr(&out, map).into_values().collect::<Vec<_>>();
    assert_eq!(counts("@add"), [10], "{out}");
    assert_eq!(counts("@cond"), [10], "{out}");
    assert_eq!(counts("@third"), [3], "{out}");
    assert_eq!(counts("@loop"), [1, 10], "{out}");
}

/// Upstream's "source line to address validation": a function's opening line and
/// the function's entry are one address.
#[test]
fn a_functions_opening_line_is_its_entry() {
    let bin = build("srcline.c", O0_NOPIE, &[]);
    let b = bin.display();
    let prog = format!(
        "uprobe:{b}@srcline.c:{} {{ @a = reg(\"ip\"); @line = count(); }} \
         uprobe:{b}:step {{ @b = reg(\"ip\"); @func = count(); \
           if (@b == @a) {{ printf(\"0x%lx == 0x%lx\\n\", @a, @b); exit(); }} }}",
        line_of("SL_OPEN")
    );
    let out = ok(&run(&bin, &prog, &[]));
    let entry = nm_addr(&bin, "step");
    assert!(
        out.lines()
            .any(|l| l == format!("0x{entry:x} == 0x{entry:x}")),
        "{out}"
    );
    // The program is not stopped by `exit()`: both probes saw every call.
    assert_eq!(map_value(&out, "@line"), Some(10), "{out}");
    assert_eq!(map_value(&out, "@func"), Some(10), "{out}");
}

#[test]
fn line_probes_in_a_pie_count_what_runs() {
    let bin = build("srcline.c", O0_PIE, &[]);
    let b = bin.display();
    let prog = format!(
        "uprobe:{b}@srcline.c:{} {{ @open[func] = count(); }} \
         uprobe:{b}@srcline.c:{} {{ @add[probe] = count(); }} \
         uprobe:{b}@srcline.c:{} {{ @third = count(); }}",
        line_of("SL_OPEN"),
        line_of("SL_ADD"),
        line_of("SL_THIRD")
    );
    let out = ok(&run(&bin, &prog, &[]));
    assert_eq!(keyed(&out, "@open").get("step"), Some(&10), "{out}");
    let add = format!("uprobe:{b}@srcline.c:{}", line_of("SL_ADD"));
    assert_eq!(keyed(&out, "@add").get(&add), Some(&10), "{out}");
    assert_eq!(map_value(&out, "@third"), Some(3), "{out}");
}

/// Upstream's DWO test: with `-gsplit-dwarf` the line table stays in the
/// executable's skeleton unit (the `.dwo` has the rest).
#[test]
fn split_dwarf_line_tables_are_in_the_skeleton() {
    let dir = scratch_dir("srcline-split");
    let src = repo_root().join("tests/targets/srcline.c");
    let o = Command::new("gcc")
        .current_dir(&dir)
        .args(["-g", "-O0", "-no-pie", "-gsplit-dwarf", "-o", "srcline"])
        .arg(&src)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o.stderr));
    let dwo: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.path().extension().is_some_and(|x| x == "dwo"))
        .collect();
    assert_eq!(dwo.len(), 1, "one .dwo beside the program");
    let bin = dir.join("srcline");
    let b = bin.display();
    let prog = format!(
        "uprobe:{b}@srcline.c:{} {{ @add[reg(\"ip\")] = count(); }} \
         uprobe:{b}@srcline.c:{} {{ @third = count(); }}",
        line_of("SL_ADD"),
        line_of("SL_THIRD")
    );
    let out = ok(&run(&bin, &prog, &[]));
    let add = by_addr(&out, "@add");
    assert_eq!(
        add.keys().copied().collect::<Vec<_>>(),
        objdump_starts(&bin, line_of("SL_ADD")),
        "{out}"
    );
    assert_eq!(add.into_values().collect::<Vec<_>>(), [10], "{out}");
    assert_eq!(map_value(&out, "@third"), Some(3), "{out}");
}

#[test]
fn a_line_without_code_names_the_nearest_lines_that_have_some() {
    let bin = build("srcline.c", O0_NOPIE, &[]);
    let b = bin.display();
    let src = repo_root().join("tests/targets/srcline.c");
    // A comment before any code: the next line with code is the function's opening.
    let nocode = line_of("SL_NOCODE");
    let o = run(&bin, &format!("uprobe:{b}@srcline.c:{nocode} {{ }}"), &[]);
    assert!(!o.status.success());
    let err = text(&o.stderr);
    assert!(
        err.contains(&format!(
            "{}:{nocode} has no code in {b}; the nearest line with code is {}\n",
            src.display(),
            line_of("SL_OPEN")
        )),
        "{err}"
    );
    assert!(err.contains(" --> -e:1:1\n"), "located: {err}");
    // Between two lines with code: both.
    let blank = line_of("SL_RETURN") + 1 + 1; // the blank line after step's `}`
    let o = run(&bin, &format!("uprobe:{b}@srcline.c:{blank} {{ }}"), &[]);
    let err = text(&o.stderr);
    assert!(
        err.contains(&format!(
            "{}:{blank} has no code in {b}; the nearest lines with code are {} and {}\n",
            src.display(),
            blank - 1,
            blank + 2
        )),
        "{err}"
    );
}

#[test]
fn an_unknown_file_or_a_binary_without_dwarf_is_an_error() {
    let bin = build("srcline.c", O0_NOPIE, &[]);
    let b = bin.display();
    let o = run(&bin, &format!("uprobe:{b}@srclin.c:3 {{ }}"), &[]);
    let err = text(&o.stderr);
    assert!(!o.status.success());
    assert!(
        err.contains(&format!(
            "no source file `srclin.c` in the line tables of {b}; did you mean `srcline.c`?\n"
        )),
        "{err}"
    );
    let dir = scratch_dir("srcline-nodwarf");
    let plain = dir.join("srcline");
    let c = Command::new("gcc")
        .args(["-O0", "-no-pie", "-o"])
        .arg(&plain)
        .arg(repo_root().join("tests/targets/srcline.c"))
        .output()
        .unwrap();
    assert!(c.status.success());
    let p = plain.display();
    let o = run(&plain, &format!("uprobe:{p}@srcline.c:16 {{ }}"), &[]);
    assert!(!o.status.success());
    let err = text(&o.stderr);
    assert!(
        err.contains(&format!("{p} has no DWARF line table to find srcline.c:16")),
        "{err}"
    );
}

/// A `@` in a path still names the binary: a function probe on it is untouched,
/// and a line probe's binary ends at the last `@`.
#[test]
fn an_at_sign_in_the_binarys_path_still_names_it() {
    let bin = build("srcline.c", O0_PIE, &[]);
    let dir = scratch_dir("srcline-at").join("v@1");
    std::fs::create_dir_all(&dir).unwrap();
    let copy = dir.join("srcline");
    std::fs::copy(&bin, &copy).unwrap();
    let c = copy.display();
    let prog = format!(
        "uprobe:{c}:step {{ @func = count(); }} \
         uprobe:{c}@srcline.c:{} {{ @line = count(); }}",
        line_of("SL_THIRD")
    );
    let out = ok(&run(&copy, &prog, &[]));
    assert_eq!(map_value(&out, "@func"), Some(10), "{out}");
    assert_eq!(map_value(&out, "@line"), Some(3), "{out}");
}

/// Upstream's "parse stripped debuginfo": a stripped binary's DWARF in a
/// directory given with `--debuginfo` (by build-id, and by the file's path).
#[test]
fn debuginfo_dir_holds_a_stripped_binarys_debug_file() {
    let bin = build("srcline.c", O0_NOPIE, &[]);
    let dir = scratch_dir("srcline-debuginfo");
    let stripped = dir.join("srcline-stripped");
    std::fs::copy(&bin, &stripped).unwrap();
    let s = stripped.to_str().unwrap();
    tool("strip", &["--strip-debug", s]);
    let notes = tool("readelf", &["-n", s]);
    let id = notes
        .lines()
        .find_map(|l| l.trim().strip_prefix("Build ID: "))
        .unwrap()
        .to_string();
    let by_id = dir.join("debug");
    let xx = by_id.join(".build-id").join(&id[..2]);
    std::fs::create_dir_all(&xx).unwrap();
    let debug_file = xx.join(format!("{}.debug", &id[2..]));
    tool(
        "objcopy",
        &[
            "--only-keep-debug",
            bin.to_str().unwrap(),
            debug_file.to_str().unwrap(),
        ],
    );
    let prog = format!(
        "uprobe:{s}@srcline.c:{} {{ @third = count(); }}",
        line_of("SL_THIRD")
    );
    // Without the directory: no DWARF, and weft says so.
    let o = run(&stripped, &prog, &[]);
    assert!(!o.status.success());
    assert!(
        text(&o.stderr).contains("has no DWARF line table"),
        "{}",
        text(&o.stderr)
    );
    let flag = format!("--debuginfo={}", by_id.display());
    let out = ok(&run(&stripped, &prog, &[&flag]));
    assert_eq!(map_value(&out, "@third"), Some(3), "{out}");
    // `args` of the stripped binary's functions, listed and used.
    let list = ok(&weft(&["-lv", &format!("uprobe:{s}:step"), &flag], T));
    assert!(list.ends_with(":step\n    long int i\n"), "{list}");
    // DIR/<the file's path>.debug (no build-id directory, no debuglink).
    let by_path = dir.join("bypath");
    let target = by_path.join(format!("{}.debug", &s[1..]));
    std::fs::create_dir_all(target.parent().unwrap()).unwrap();
    std::fs::rename(&debug_file, &target).unwrap();
    let flag = format!("--debuginfo={}", by_path.display());
    let out = ok(&run(
        &stripped,
        &format!("uprobe:{s}:step {{ @i[args.i] = count(); }}"),
        &[&flag],
    ));
    assert_eq!(keyed(&out, "@i").len(), 10, "{out}");
}
