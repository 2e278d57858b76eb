//! Preparing real programs: tests/targets/prepared_calls.c built with gcc and clang
//! across a flag matrix (PIE and not, -O0/-O2/-O3, CET), and small assembly functions
//! that must be refused. Each prepared binary runs and prints exactly what the
//! original prints, its file layout is checked field by field, and `readelf -a`
//! reads it without a complaint.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use weft_prepare::{prepare, Error, Options, Prepared, PLACEHOLDER};
use weft_symbols::{ElfFile, WeftProbeKind};

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn scratch() -> PathBuf {
    let d = Path::new(env!("CARGO_TARGET_TMPDIR")).join("prepare-crate");
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Compiles `src` (a path, or C text when it contains a newline) with `cc` and flags.
fn build(name: &str, cc: &str, flags: &[&str], src: &str) -> PathBuf {
    let dir = scratch();
    let out = dir.join(name);
    let src_path = if src.contains('\n') {
        let p = dir.join(format!("{name}.c"));
        std::fs::write(&p, src).unwrap();
        p
    } else {
        repo_root().join(src)
    };
    let st = Command::new(cc)
        .args(flags)
        .arg("-I")
        .arg(repo_root().join("include"))
        .arg(&src_path)
        .arg("-o")
        .arg(&out)
        .status()
        .unwrap();
    assert!(st.success(), "{cc} {flags:?} {src}");
    out
}

fn prepare_file(exe: &Path, functions: Option<&str>) -> (Prepared, PathBuf) {
    let input = std::fs::read(exe).unwrap();
    let done = prepare(
        exe,
        &input,
        &Options {
            functions: functions.map(Into::into),
        },
    )
    .unwrap_or_else(|e| panic!("{}: {e}", exe.display()));
    let out = exe.with_extension("prep");
    std::fs::write(&out, &done.bytes).unwrap();
    std::fs::set_permissions(&out, std::fs::Permissions::from_mode(0o755)).unwrap();
    (done, out)
}

fn run(exe: &Path) -> Vec<u8> {
    let o = Command::new(exe).output().unwrap();
    assert!(o.status.success(), "{} failed", exe.display());
    o.stdout
}

const PT_LOAD: u32 = 1;
const PT_PHDR: u32 = 6;

/// The layout rules of `write`: the new program header table and the stubs are two
/// new PT_LOADs after the old ones, above every old segment, PT_PHDR points at the
/// table inside the first of them, and every PT_LOAD keeps `vaddr - offset` when the
/// original's is uniform.
fn check_layout(orig: &ElfFile, out: &ElfFile, done: &Prepared) {
    let old_loads: Vec<_> = orig
        .segments()
        .iter()
        .filter(|s| s.kind == PT_LOAD)
        .collect();
    let loads: Vec<_> = out
        .segments()
        .iter()
        .filter(|s| s.kind == PT_LOAD)
        .collect();
    assert_eq!(loads.len(), old_loads.len() + 2);
    let top = old_loads.iter().map(|s| s.vaddr + s.memsz).max().unwrap();
    let (ph, stubs) = (loads[old_loads.len()], loads[old_loads.len() + 1]);
    assert!(ph.vaddr >= top && stubs.vaddr > ph.vaddr);
    assert_eq!(ph.flags, 4, "program headers: R");
    assert_eq!(stubs.flags, 5, "stubs: R+X");
    assert_eq!((stubs.vaddr, stubs.filesz), done.stubs);
    for w in loads.windows(2) {
        assert!(w[0].vaddr < w[1].vaddr, "PT_LOADs in address order");
    }
    let phoff = u64::from_le_bytes(out.data()[0x20..0x28].try_into().unwrap());
    assert_eq!(phoff, ph.offset);
    if let Some(p) = out.segments().iter().find(|s| s.kind == PT_PHDR) {
        assert_eq!((p.offset, p.vaddr), (ph.offset, ph.vaddr));
        assert_eq!(p.filesz, out.segments().len() as u64 * 56);
    }
    let delta = |s: &weft_symbols::Segment| s.vaddr.wrapping_sub(s.offset);
    assert_eq!(delta(ph), delta(old_loads[0]), "AT_PHDR for old kernels");
    // Old segments: unchanged.
    for (a, b) in old_loads.iter().zip(&loads) {
        assert_eq!(a, b);
    }
    let text = out.section(".weft.text").expect(".weft.text");
    assert_eq!((text.addr, text.size), done.stubs);
}

/// `readelf -a` prints no warning or error.
fn readelf_clean(exe: &Path) {
    let o = Command::new("readelf")
        .arg("-a")
        .arg("-W")
        .arg(exe)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        o.status.success() && err.trim().is_empty(),
        "readelf: {err}"
    );
}

#[test]
fn prepared_builds_run_identically() {
    let src = "tests/targets/prepared_calls.c";
    let builds: &[(&str, &str, &[&str])] = &[
        ("gcc-O2", "gcc", &["-O2"]),
        ("gcc-O2-g", "gcc", &["-O2", "-g"]),
        ("gcc-O0-cet", "gcc", &["-O0", "-fcf-protection=full"]),
        ("gcc-O2-cet", "gcc", &["-O2", "-fcf-protection=full"]),
        ("gcc-O3-nopie", "gcc", &["-O3", "-no-pie", "-fno-pie"]),
        ("clang-O2", "clang", &["-O2"]),
        ("clang-O0", "clang", &["-O0"]),
    ];
    for &(name, cc, flags) in builds {
        let exe = build(name, cc, flags, src);
        let (done, out) = prepare_file(&exe, None);
        assert_eq!(run(&exe), run(&out), "{name}: output differs");
        let orig = ElfFile::open(&exe).unwrap();
        let prep = ElfFile::open(&out).unwrap();
        check_layout(&orig, &prep, &done);
        readelf_clean(&out);
        // Every prepared function: its entry (after endbr64) jumps to its stub, which
        // starts with the placeholder; named and addressed as the symbol.
        let names: Vec<&str> = done.probes.iter().map(|p| p.function.as_str()).collect();
        for f in [
            "leaf", "mid", "touch", "classify", "fib", "summary", "run", "main",
        ] {
            assert!(
                names.contains(&f),
                "{name}: {f} not prepared: {:?}",
                done.skipped
            );
        }
        for p in &done.probes {
            assert_eq!(p.kind, WeftProbeKind::EntryStub);
            let f = prep
                .functions()
                .iter()
                .find(|f| f.name() == p.function)
                .unwrap();
            assert_eq!(p.function_vaddr, Some(f.vaddr));
            assert_eq!(prep.read_vaddr(p.vaddr, 5).unwrap(), PLACEHOLDER);
            let mut at = f.vaddr;
            if prep.read_vaddr(at, 4).unwrap() == weft_x86::ENDBR64 {
                at += 4;
            }
            let j = prep.read_vaddr(at, 5).unwrap();
            assert_eq!(j[0], 0xe9, "{name}: {}", p.function);
            let rel = i32::from_le_bytes(j[1..5].try_into().unwrap());
            assert_eq!((at + 5).wrapping_add(rel as i64 as u64), p.vaddr);
        }
        // The same functions, the same symbols: only the new sections are added.
        assert_eq!(orig.functions(), prep.functions(), "{name}");
        assert_eq!(orig.sections().len() + 2, prep.sections().len());
    }
}

#[test]
fn functions_pattern_selects() {
    let exe = build("pattern", "gcc", &["-O2"], "tests/targets/prepared_calls.c");
    let (done, out) = prepare_file(&exe, Some("f*b"));
    let names: Vec<&str> = done.probes.iter().map(|p| p.function.as_str()).collect();
    assert_eq!(names, ["fib"]);
    assert!(done.skipped.is_empty());
    assert_eq!(run(&exe), run(&out));
    let input = std::fs::read(&exe).unwrap();
    let e = prepare(
        &exe,
        &input,
        &Options {
            functions: Some("nothing_like_this".into()),
        },
    )
    .unwrap_err();
    assert!(matches!(e, Error::NoMatch { .. }), "{e}");
}

/// Functions whose displaced bytes someone else names, or that call first, are left
/// alone with the reason; the others around them are prepared and still run.
#[test]
fn unsafe_prologues_are_refused_with_reasons() {
    let src = r#"
#include <stdio.h>
__asm__(
    ".text\n"
    ".globl victim\n.type victim,@function\n"
    "victim: xor %eax,%eax\n"
    "victim_inner: inc %eax\n"
    "  add $3,%eax\n"
    "  ret\n"
    ".size victim, .-victim\n"
    ".globl jumper\n.type jumper,@function\n"
    "jumper: mov $10,%eax\n"
    "  jmp victim_inner\n"
    ".size jumper, .-jumper\n"
    ".globl selfloop\n.type selfloop,@function\n"
    "selfloop: mov %edi,%eax\n"
    "1: dec %eax\n"
    "  jnz 1b\n"
    "  add $5,%eax\n"
    "  ret\n"
    ".size selfloop, .-selfloop\n"
    ".globl caller_first\n.type caller_first,@function\n"
    "caller_first: call victim\n"
    "  add $1,%eax\n"
    "  ret\n"
    ".size caller_first, .-caller_first\n"
    ".globl noret\n.type noret,@function\n"
    "noret: mov $1, %eax\n"
    "  mov $2, %edx\n"
    "  ud2\n"
    ".size noret, .-noret\n"
);
int victim(void); int jumper(void); int selfloop(int); int caller_first(void);
int main(void) {
    printf("%d %d %d %d\n", victim(), jumper(), selfloop(7), caller_first());
    return 0;
}
"#;
    let exe = build("refusals", "gcc", &["-O2"], src);
    let (done, out) = prepare_file(&exe, None);
    assert_eq!(run(&exe), run(&out));
    assert_eq!(String::from_utf8(run(&out)).unwrap(), "4 14 5 5\n");
    let reason = |f: &str| {
        done.skipped
            .iter()
            .find(|s| s.function == f)
            .map(|s| s.reason.clone())
            .unwrap_or_else(|| panic!("{f} was prepared: {:?}", done.probes))
    };
    assert!(
        reason("victim").contains("refers to"),
        "{}",
        reason("victim")
    );
    assert!(
        reason("selfloop").contains("targets"),
        "{}",
        reason("selfloop")
    );
    assert!(
        reason("caller_first").contains("call"),
        "{}",
        reason("caller_first")
    );
    assert!(
        reason("noret").contains("never returns"),
        "{}",
        reason("noret")
    );
    assert!(reason("_start").contains("entry point") || reason("_start").contains("never returns"));
    assert!(done.probes.iter().any(|p| p.function == "jumper"));
}

#[test]
fn refuses_what_it_cannot_prepare() {
    let exe = build("refuse", "gcc", &["-O2"], "tests/targets/prepared_calls.c");
    let (_, out) = prepare_file(&exe, None);
    let msg = |p: &Path| {
        let input = std::fs::read(p).unwrap();
        prepare(p, &input, &Options::default()).unwrap_err()
    };
    // Already prepared.
    let e = msg(&out);
    assert!(matches!(e, Error::AlreadyPrepared { .. }), "{e}");
    // Coldpatched.
    let inst = build(
        "refuse-inst",
        "gcc",
        &["-O2", "-finstrument-functions"],
        "tests/targets/prepared_calls.c",
    );
    let input = std::fs::read(&inst).unwrap();
    let cold = weft_coldpatch::coldpatch(&inst, &input, &Default::default()).unwrap();
    let cold_path = inst.with_extension("cold");
    std::fs::write(&cold_path, cold.bytes).unwrap();
    let e = msg(&cold_path);
    assert!(matches!(e, Error::Coldpatched { .. }), "{e}");
    // Statically linked.
    let stat = build(
        "refuse-static",
        "gcc",
        &["-O2", "-static"],
        "tests/targets/prepared_calls.c",
    );
    let e = msg(&stat);
    assert!(matches!(e, Error::Static { .. }), "{e}");
    // Stripped with nothing in .dynsym.
    let stripped = scratch().join("refuse-stripped");
    std::fs::copy(&exe, &stripped).unwrap();
    assert!(Command::new("strip")
        .arg(&stripped)
        .status()
        .unwrap()
        .success());
    let e = msg(&stripped);
    assert!(matches!(e, Error::NoFunctions { .. }), "{e}");
    assert!(e.to_string().contains("stripped beyond .dynsym"), "{e}");
    // Not x86-64: the same file claiming to be AArch64.
    let mut bytes = std::fs::read(&exe).unwrap();
    bytes[18..20].copy_from_slice(&183u16.to_le_bytes());
    let e = prepare(&exe, &bytes, &Options::default()).unwrap_err();
    assert!(
        e.to_string().contains("AArch64") || e.to_string().contains("x86-64"),
        "{e}"
    );
    // Not ELF.
    let e = prepare(Path::new("notes.txt"), b"hello\n", &Options::default()).unwrap_err();
    assert!(matches!(e, Error::Elf(_)), "{e}");
}

/// A shared library known only by its `.dynsym` (a stripped distribution library):
/// its exported functions are prepared, and a program using it runs as before.
#[test]
fn stripped_shared_library_through_dynsym() {
    let lib_src = r#"
int lib_twice(int x) { int s = 0; for (int i = 0; i < x; i++) s += 2; return s; }
int lib_sum(const int *v, int n) { long s = 0; for (int i = 0; i < n; i++) s += v[i]; return (int)s; }
static int hidden(int x) { return x * 3; }
int lib_hidden(int x) { return hidden(x) + 1; }
"#;
    let dir = scratch().join("dynsym");
    std::fs::create_dir_all(&dir).unwrap();
    let lib = build(
        "dynsym/libdemo.so",
        "gcc",
        &["-O2", "-shared", "-fPIC", "-s"],
        lib_src,
    );
    let main_src = r#"
#include <stdio.h>
int lib_twice(int); int lib_sum(const int *, int); int lib_hidden(int);
int main(void) { int v[] = {1, 2, 3, 4}; printf("%d %d %d\n", lib_twice(21), lib_sum(v, 4), lib_hidden(5)); return 0; }
"#;
    let main_path = dir.join("main.c");
    std::fs::write(&main_path, main_src).unwrap();
    let exe = dir.join("main");
    assert!(Command::new("gcc")
        .arg(&main_path)
        .arg("-L")
        .arg(&dir)
        .args(["-ldemo", "-o"])
        .arg(&exe)
        .status()
        .unwrap()
        .success());
    let input = std::fs::read(&lib).unwrap();
    let done = prepare(&lib, &input, &Options::default()).unwrap();
    assert!(done.dynsym_only);
    let mut names: Vec<&str> = done.probes.iter().map(|p| p.function.as_str()).collect();
    names.sort_unstable();
    assert_eq!(names, ["lib_hidden", "lib_sum", "lib_twice"]);
    let run_with = |d: &Path| {
        let o = Command::new(&exe)
            .env("LD_LIBRARY_PATH", d)
            .output()
            .unwrap();
        assert!(o.status.success());
        o.stdout
    };
    let before = run_with(&dir);
    let prep_dir = dir.join("prepared");
    std::fs::create_dir_all(&prep_dir).unwrap();
    std::fs::write(prep_dir.join("libdemo.so"), &done.bytes).unwrap();
    assert_eq!(before, b"42 10 16\n");
    assert_eq!(run_with(&prep_dir), before);
    readelf_clean(&prep_dir.join("libdemo.so"));
}

/// A bss far larger than the file: the new segments go above it, and the file is not
/// padded to keep `vaddr - offset` uniform (more than 16 MiB of fill), so the kernel
/// finds the moved program headers through the PT_LOAD that holds them.
#[test]
fn big_bss_puts_the_new_segments_above_it() {
    let src = r#"
#include <stdio.h>
static char big[64 << 20];
__attribute__((noinline)) int touch(int i) { big[i << 20] = (char)i; return big[i << 20] + 1; }
int main(void) { int s = 0; for (int i = 0; i < 64; i++) s += touch(i); printf("%d\n", s); return 0; }
"#;
    for (name, flags) in [
        ("bss-pie", &["-O2"][..]),
        ("bss-nopie", &["-O2", "-no-pie", "-fno-pie"][..]),
    ] {
        let exe = build(name, "gcc", flags, src);
        let (done, out) = prepare_file(&exe, None);
        assert!(done.probes.iter().any(|p| p.function == "touch"));
        assert_eq!(run(&exe), run(&out), "{name}");
        assert_eq!(String::from_utf8(run(&out)).unwrap(), "2080\n");
        let orig = ElfFile::open(&exe).unwrap();
        let prep = ElfFile::open(&out).unwrap();
        let top = orig
            .segments()
            .iter()
            .filter(|s| s.kind == PT_LOAD)
            .map(|s| s.vaddr + s.memsz)
            .max()
            .unwrap();
        assert!(done.stubs.0 > top);
        assert!(done.bytes.len() < (1 << 20), "{name}: no fill for the bss");
        readelf_clean(&out);
        let _ = prep;
    }
}

/// A text relocation (a shared library linked with `-z notext`) inside a prologue:
/// the loader would write over the jump, so the function is left alone.
#[test]
fn text_relocations_in_a_prologue_are_refused() {
    let src = r#"
int datum = 7;
__asm__(
    ".text\n"
    ".globl absolute\n.type absolute,@function\n"
    "absolute: movabs $datum, %rax\n"
    "  mov (%rax), %eax\n"
    "  ret\n"
    ".size absolute, .-absolute\n"
);
int plain_function(int x) { int s = 0; for (int i = 0; i < x; i++) s += i ^ datum; return s; }
"#;
    let lib = build(
        "libtextrel.so",
        "gcc",
        &["-O2", "-shared", "-fPIC", "-Wl,-z,notext"],
        src,
    );
    let input = std::fs::read(&lib).unwrap();
    let done = prepare(&lib, &input, &Options::default()).unwrap();
    let why = done
        .skipped
        .iter()
        .find(|s| s.function == "absolute")
        .map(|s| s.reason.clone())
        .unwrap_or_else(|| panic!("absolute was prepared: {:?}", done.probes));
    assert!(why.contains("dynamic relocation"), "{why}");
    assert!(done.probes.iter().any(|p| p.function == "plain_function"));
}

/// C++ exceptions unwind through prepared functions: their frames' return addresses
/// are in the original code (no call is ever moved), where the unwind tables hold.
#[test]
fn cxx_exceptions_unwind_through_prepared_functions() {
    let src = r#"
#include <cstdio>
#include <stdexcept>
#include <string>
struct Guard { int *n; ~Guard() { ++*n; } };
__attribute__((noinline)) int deep(int d, int *dtors) {
    Guard g{dtors};
    if (d == 0) throw std::runtime_error("bottom " + std::to_string(*dtors));
    return deep(d - 1, dtors) + 1;
}
__attribute__((noinline)) int middle(int d, int *dtors) {
    std::string s(d, 'x');
    return deep(d, dtors) + (int)s.size();
}
int main() {
    int dtors = 0, caught = 0;
    for (int i = 0; i < 50; i++) {
        try { middle(i % 7, &dtors); } catch (const std::exception &e) { caught++; }
    }
    std::printf("caught %d dtors %d\n", caught, dtors);
    return 0;
}
"#;
    let dir = scratch();
    let src_path = dir.join("cxx.cc");
    std::fs::write(&src_path, src).unwrap();
    let exe = dir.join("cxx");
    assert!(Command::new("g++")
        .args(["-O2", "-fcf-protection=full"])
        .arg(&src_path)
        .arg("-o")
        .arg(&exe)
        .status()
        .unwrap()
        .success());
    let (done, out) = prepare_file(&exe, None);
    for f in ["_Z4deepiPi", "_Z6middleiPi"] {
        assert!(
            done.probes.iter().any(|p| p.function == f),
            "{f} not prepared: {:?}",
            done.skipped
        );
    }
    assert_eq!(
        String::from_utf8(run(&exe)).unwrap(),
        "caught 50 dtors 197\n"
    );
    assert_eq!(run(&exe), run(&out));
}
