//! `weft memprof`: exact per-object and per-site read/write counts in counted mode
//! (clang's SanitizerCoverage hooks and gcc's ThreadSanitizer hooks), one and four
//! threads, realloc's identity rule, memcpy counted, DHAT's JSON, sampled mode's
//! ranking, and the bad inputs.
//!
//! The target (tests/targets/memprof.c) allocates each object from its own
//! function, so a site's label names the object: A (alloc_a) read 1000 times per
//! thread, B (alloc_b) written 10 times per thread, C (alloc_c) never touched, D
//! (alloc_d) written 5 times, realloc'ed (moved) and written 5 times more, memcpy
//! from F (alloc_f) to G (alloc_g), three H (alloc_h) allocated and freed, E
//! (chain_inner ← chain_middle ← chain_outer) written 3 times, BIG (alloc_big, 64
//! MiB, mmap'ed far from the rest) written 7 times and AFTER (alloc_after) read 13
//! times. tests/targets/memprof_rates.c: 20 objects read at rates 1.3× apart, for
//! sampled mode's ranking.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::*;
use serde_json::Value;

const T: Duration = Duration::from_secs(120);

/// The link flags `weft memprof --ldflags --cc CC` prints.
fn ldflags(cc: &str) -> Vec<String> {
    let o = weft(&["memprof", "--ldflags", "--cc", cc], T);
    ok(&o).split_whitespace().map(String::from).collect()
}

fn cflags(cc: &str) -> Vec<String> {
    let o = weft(&["memprof", "--cflags", "--cc", cc], T);
    ok(&o).split_whitespace().map(String::from).collect()
}

/// Builds the target for counted mode: `cc` compiles with `weft memprof --cflags`
/// and links with `--ldflags` (separately for gcc: linking with -fsanitize=thread
/// would pull libtsan in). clang's build is an LTO one whose hooks are inlined.
fn build_counted(cc: &'static str) -> PathBuf {
    static BUILT: std::sync::Mutex<Vec<(&str, PathBuf)>> = std::sync::Mutex::new(Vec::new());
    let mut built = BUILT.lock().unwrap();
    if let Some((_, p)) = built.iter().find(|(c, _)| *c == cc) {
        return p.clone();
    }
    let root = repo_root();
    let src = root.join("tests/targets/memprof.c");
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("memprof");
    std::fs::create_dir_all(&dir).unwrap();
    let obj = dir.join(format!("memprof-{cc}.o"));
    let out = dir.join(format!("memprof-{cc}"));
    let st = Command::new(cc)
        .args(["-O2", "-g", "-c"])
        .args(cflags(cc))
        .arg("-I")
        .arg(root.join("include"))
        .arg(&src)
        .arg("-o")
        .arg(&obj)
        .status()
        .unwrap();
    assert!(st.success(), "compiling {} with {cc}", src.display());
    let st = Command::new(cc)
        .arg(&obj)
        .arg("-o")
        .arg(&out)
        .args(ldflags(cc))
        .arg("-lpthread")
        .status()
        .unwrap();
    assert!(st.success(), "linking {}", out.display());
    built.push((cc, out.clone()));
    out
}

/// Runs `weft memprof ARGS -- BIN PARGS` writing weft's JSON; (stdout, JSON).
fn memprof(bin: &Path, args: &[&str], pargs: &[&str], tag: &str) -> (String, Value) {
    let json = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("memprof-{tag}.json"));
    let mut all: Vec<String> = vec![
        "memprof".into(),
        "--json".into(),
        json.display().to_string(),
    ];
    all.extend(args.iter().map(|s| s.to_string()));
    all.push("--".into());
    all.push(bin.display().to_string());
    all.extend(pargs.iter().map(|s| s.to_string()));
    let refs: Vec<&str> = all.iter().map(String::as_str).collect();
    let o = weft(&refs, T);
    let out = ok(&o);
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    (out, v)
}

fn site<'a>(v: &'a Value, label: &str) -> &'a Value {
    v["sites"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["label"] == label)
        .unwrap_or_else(|| panic!("no site {label} in {v:#}"))
}

fn objects<'a>(v: &'a Value, label: &str) -> Vec<&'a Value> {
    v["objects"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|o| o["label"] == label)
        .collect()
}

fn one<'a>(v: &'a Value, label: &str) -> &'a Value {
    let o = objects(v, label);
    assert_eq!(o.len(), 1, "objects of {label}: {o:#?}");
    o[0]
}

fn rw(x: &Value) -> (u64, u64) {
    (x["reads"].as_u64().unwrap(), x["writes"].as_u64().unwrap())
}

/// The exact counts of the target run with `threads` threads.
fn check_counts(out: &str, v: &Value, threads: u64) {
    assert_eq!(v["mode"], "counted");
    for label in ["alloc_a", "alloc_b", "alloc_c"] {
        let o = one(v, label);
        assert_eq!(rw(o), rw(site(v, label)), "{label}: object and site agree");
    }
    assert_eq!(rw(one(v, "alloc_a")), (1000 * threads, 0));
    assert_eq!(one(v, "alloc_a")["read_bytes"], 8000 * threads);
    assert_eq!(rw(one(v, "alloc_b")), (0, 10 * threads));
    assert_eq!(rw(one(v, "alloc_c")), (0, 0));
    // realloc keeps the object: one object of alloc_d's site, both halves' writes.
    let d = one(v, "alloc_d");
    assert_eq!(rw(d), (0, 10));
    assert_eq!(
        (d["size"].as_u64(), d["reallocs"].as_u64()),
        (Some(4096), Some(1))
    );
    // memcpy: one read of the source, one write of the destination, 40 bytes each.
    assert_eq!(rw(one(v, "alloc_f")), (1, 0));
    assert_eq!(one(v, "alloc_f")["read_bytes"], 40);
    assert_eq!(rw(one(v, "alloc_g")), (0, 1));
    assert_eq!(one(v, "alloc_g")["write_bytes"], 40);
    // Three objects, all freed (one site per call stack: the compiler may have
    // unrolled the loop; see `depth_one_merges_call_stacks`).
    let h = objects(v, "alloc_h");
    assert_eq!(h.len(), 3);
    assert!(h.iter().all(|o| !o["free_ns"].is_null()));
    // The heap range grew with the mmap'ed BIG: nothing before or after it is lost.
    assert_eq!(rw(one(v, "chain_inner")), (0, 3));
    assert_eq!(rw(one(v, "alloc_big")), (0, 7));
    assert_eq!(rw(one(v, "alloc_after")), (13, 0));
    // The program's own view (include/weft.h), and the report's order.
    assert!(
        out.contains(&format!("A accesses {}\n", 1000 * threads)),
        "{out}"
    );
    let sites = out.split("Top allocation sites:").nth(1).unwrap();
    let first = sites.lines().nth(2).unwrap();
    assert!(first.starts_with("alloc_a "), "{out}");
    assert!(out.contains("Hottest objects:"), "{out}");
}

#[test]
fn counted_clang_one_thread_exact() {
    let bin = build_counted("clang");
    // The LTO build inlined the hooks: no call to them is left, only their slow
    // path's (a thread's first count).
    let elf = weft_symbols::ElfFile::open(&bin).unwrap();
    let imports: Vec<&str> = elf.imports().iter().map(|i| i.name.as_str()).collect();
    assert!(imports.contains(&"weft_memprof_count_slow"), "{imports:?}");
    assert!(
        !imports
            .iter()
            .any(|i| i.starts_with("__sanitizer_cov_load")),
        "{imports:?}"
    );
    let (out, v) = memprof(&bin, &[], &["1"], "clang1");
    check_counts(&out, &v, 1);
}

/// With one frame a site is the allocating call alone: alloc_h's three objects
/// are one site, never more than one of them live.
#[test]
fn depth_one_merges_call_stacks() {
    let bin = build_counted("clang");
    let (out, v) = memprof(&bin, &["--depth", "1"], &["1"], "depth1");
    check_counts(&out, &v, 1);
    let h = site(&v, "alloc_h");
    assert_eq!(
        (h["objects"].as_u64(), h["peak_objects"].as_u64()),
        (Some(3), Some(1))
    );
    assert_eq!(h["frames"].as_array().unwrap().len(), 1);
}

#[test]
fn counted_clang_four_threads_exact() {
    let bin = build_counted("clang");
    let (out, v) = memprof(&bin, &[], &["4"], "clang4");
    check_counts(&out, &v, 4);
}

#[test]
fn counted_gcc_tsan_hooks_exact() {
    let bin = build_counted("gcc");
    let (out, v) = memprof(&bin, &[], &["4"], "gcc4");
    check_counts(&out, &v, 4);
}

#[test]
fn counted_binary_runs_without_weft() {
    let bin = build_counted("clang");
    let o = Command::new(&bin).arg("2").output().unwrap();
    assert!(o.status.success());
    assert_eq!(text(&o.stdout), "A accesses 0\nstat 0 objects\n");
}

#[test]
fn dhat_file_has_what_the_viewer_needs() {
    let bin = build_counted("clang");
    let dhat = Path::new(env!("CARGO_TARGET_TMPDIR")).join("memprof-dhat.json");
    let o = weft(
        &[
            "memprof",
            "-o",
            dhat.to_str().unwrap(),
            "--",
            bin.to_str().unwrap(),
            "1",
        ],
        T,
    );
    ok(&o);
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&dhat).unwrap()).unwrap();
    // dh_view.js's buildTree and checkPP.
    for f in [
        "dhatFileVersion",
        "mode",
        "verb",
        "bklt",
        "bkacc",
        "tu",
        "Mtu",
        "cmd",
        "pid",
        "te",
        "pps",
        "ftbl",
        "tg",
        "tuth",
    ] {
        assert!(v.get(f).is_some(), "no {f}");
    }
    assert_eq!(v["dhatFileVersion"], 2);
    assert_eq!(v["mode"], "heap");
    let ftbl = v["ftbl"].as_array().unwrap();
    assert_eq!(ftbl[0], "[root]");
    let pps = v["pps"].as_array().unwrap();
    assert!(!pps.is_empty());
    for pp in pps {
        for f in [
            "tb", "tbk", "tl", "mb", "mbk", "gb", "gbk", "eb", "ebk", "rb", "wb", "fs",
        ] {
            assert!(pp.get(f).is_some(), "pp without {f}: {pp}");
        }
        for i in pp["fs"].as_array().unwrap() {
            assert!((i.as_u64().unwrap() as usize) < ftbl.len());
        }
    }
    // alloc_a's program point: 128 bytes, one block, 1000 8-byte reads.
    let a = pps
        .iter()
        .find(|pp| {
            ftbl[pp["fs"][0].as_u64().unwrap() as usize]
                .as_str()
                .unwrap()
                .starts_with("alloc_a+")
        })
        .expect("alloc_a's program point");
    assert_eq!((a["tb"].as_u64(), a["tbk"].as_u64()), (Some(128), Some(1)));
    assert_eq!((a["rb"].as_u64(), a["wb"].as_u64()), (Some(8000), Some(0)));
}

#[test]
fn refuses_binary_without_hooks() {
    let inc = repo_root().join("include");
    let bin = build("memprof.c", Variant::O2_PIE, &["-I", inc.to_str().unwrap()]);
    let o = weft(&["memprof", "--", bin.to_str().unwrap()], T);
    assert!(!o.status.success());
    let err = text(&o.stderr);
    assert!(
        err.contains(
            "no access hooks found; rebuild with `weft memprof --cflags` or use --sampled"
        ),
        "{err}"
    );
    assert_eq!(err.lines().count(), 1, "{err}");
}

#[test]
fn refuses_static_binary() {
    let inc = repo_root().join("include");
    let plain = Variant {
        opt: "-O2",
        pie: false,
        cet: false,
    };
    let bin = build(
        "memprof.c",
        plain,
        &["-I", inc.to_str().unwrap(), "-static"],
    );
    let o = weft(&["memprof", "--sampled", "--", bin.to_str().unwrap()], T);
    assert!(!o.status.success());
    let err = text(&o.stderr);
    assert!(err.contains("is statically linked"), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
}

/// Sampled mode on the plain binary (no hooks): A (read 50 million times) ranks
/// above B (written 500,000 times) above C (never touched, estimated 0).
#[test]
fn sampled_ranks_a_above_b_above_c() {
    let inc = repo_root().join("include");
    let bin = build("memprof.c", Variant::O2_PIE, &["-I", inc.to_str().unwrap()]);
    let (out, v) = memprof(&bin, &["--sampled"], &["1", "50000"], "sampled");
    assert_eq!(v["mode"], "sampled");
    assert!(v["sample"]["samples"].as_u64().unwrap() > 0, "{out}");
    let acc = |l: &str| {
        let o = one(&v, l);
        o["reads"].as_u64().unwrap() + o["writes"].as_u64().unwrap()
    };
    let (a, b, c) = (acc("alloc_a"), acc("alloc_b"), acc("alloc_c"));
    assert!(a > b && b > c && c == 0, "A {a}, B {b}, C {c}\n{out}");
    assert!(out.contains("mode: sampled"), "{out}");
}

fn address(o: &Value) -> u64 {
    u64::from_str_radix(o["address"].as_str().unwrap().trim_start_matches("0x"), 16).unwrap()
}

/// The frame-pointer walk (chosen by `--stack auto` for a `--cflags` build, which
/// keeps frame pointers) names the allocation's call chain exactly, innermost
/// first; `--stack unwind` (glibc's backtrace) gives the same frames.
#[test]
fn frame_pointer_stack_names_the_call_chain() {
    let bin = build_counted("clang");
    for (args, stacks) in [(&[][..], "fp"), (&["--stack", "unwind"][..], "unwind")] {
        let (out, v) = memprof(&bin, args, &["1"], &format!("stack-{stacks}"));
        assert_eq!(v["stacks"], stacks, "{out}");
        let frames: Vec<&str> = site(&v, "chain_inner")["frames"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| f.as_str().unwrap())
            .collect();
        assert!(frames.len() >= 3, "{frames:?}");
        for (f, name) in frames
            .iter()
            .zip(["chain_inner+", "chain_middle+", "chain_outer+"])
        {
            assert!(f.starts_with(name), "{stacks}: {frames:?}");
        }
        check_counts(&out, &v, 1);
    }
}

/// The hooks drop every address outside the heap range before looking it up;
/// the range follows the heap: a 64 MiB object (mmap'ed by malloc, far above the
/// other objects) and one allocated after it are counted exactly, as are those
/// allocated before.
#[test]
fn heap_range_filter_keeps_every_heap_access() {
    let bin = build_counted("clang");
    let (out, v) = memprof(&bin, &[], &["2"], "range");
    let (a, big, after) = (
        address(one(&v, "alloc_a")),
        address(one(&v, "alloc_big")),
        address(one(&v, "alloc_after")),
    );
    assert!(big.abs_diff(a) > 1 << 30, "BIG {big:#x} is near A {a:#x}");
    assert!(
        big.abs_diff(after) > 1 << 30,
        "BIG {big:#x}, AFTER {after:#x}"
    );
    check_counts(&out, &v, 2);
}

/// Sampled mode ranks 20 objects read at rates 1.3× apart (the first 4 reads per
/// round, the last 585) in their known order: Spearman's ρ ≥ 0.9. About 5,000
/// samples at the default period.
#[test]
fn sampled_ranks_twenty_objects_in_order() {
    let bin = build("memprof_rates.c", Variant::O2_PIE, &[]);
    let (out, v) = memprof(&bin, &["--sampled"], &["200000"], "rates");
    let known: Vec<f64> = out
        .lines()
        .next()
        .unwrap()
        .split_whitespace()
        .map(|n| n.parse().unwrap())
        .collect();
    assert_eq!(known.len(), 20, "{out}");
    let mut objs = objects(&v, "alloc_rate");
    objs.sort_by_key(|o| o["id"].as_u64().unwrap());
    let sampled: Vec<f64> = objs
        .iter()
        .map(|o| (o["reads"].as_u64().unwrap() + o["writes"].as_u64().unwrap()) as f64)
        .collect();
    assert_eq!(sampled.len(), 20, "{out}");
    let rho = weft_memprof::spearman(&known, &sampled);
    assert!(rho >= 0.9, "rho {rho}: {sampled:?}\n{out}");
}
