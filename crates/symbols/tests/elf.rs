//! ELF files built with gcc, checked against binutils.

mod common;

use std::path::Path;

use common::{cc, nm, nm_addr, run};
use weft_symbols::{
    list, resolve, resolve_target, ElfFile, ElfKind, Error, LibrarySearch, ListSource,
    TargetContext,
};

const APP: &str = r#"
#include <stdio.h>
#include <stdlib.h>
__attribute__((noinline)) int parse(const char *s) { return atoi(s); }
__attribute__((noinline)) static int helper(int x) { return x * 3 + 1; }
__attribute__((noinline)) int my_a(int x) { return helper(x) + parse("4"); }
__attribute__((noinline)) int my_b(int x) { return my_a(x) * 2; }
int main(int argc, char **argv) { printf("%d\n", my_b(argc)); (void)argv; return 0; }
"#;

/// Every function we report is in `nm` at the same address with the same size, and
/// every code symbol `nm` shows (`T`, `t`, `i`) is one of ours.
fn check_against_nm(path: &Path, nm_extra: &[&str]) {
    let elf = ElfFile::open(path).unwrap();
    let syms = nm(path, nm_extra);
    assert!(!elf.functions().is_empty());
    for f in elf.functions() {
        for n in &f.names {
            let s = syms
                .iter()
                .find(|s| s.name == n.raw && s.addr == f.vaddr)
                .unwrap_or_else(|| panic!("{} at {:#x} not in nm", n.raw, f.vaddr));
            assert!("TtWwi".contains(s.kind), "{s:?}");
            if f.names.len() == 1 {
                assert_eq!(s.size.unwrap_or(0), f.size, "size of {}", n.raw);
            } else {
                assert!(s.size.unwrap_or(0) <= f.size);
            }
        }
    }
    for s in syms.iter().filter(|s| "Tti".contains(s.kind)) {
        let f = elf
            .functions()
            .iter()
            .find(|f| f.vaddr == s.addr)
            .unwrap_or_else(|| panic!("nm's {s:?} is not one of our functions"));
        assert!(
            f.names.iter().any(|n| n.raw == s.name),
            "{s:?} not among {:?}",
            f.names
        );
        if s.kind == 'i' {
            assert!(f.ifunc, "{s:?}");
        }
    }
}

#[test]
fn pie_functions_match_nm() {
    let dir = tempfile::tempdir().unwrap();
    let exe = cc(
        dir.path(),
        "app",
        &[("app.c", APP)],
        &["-O1", "-pie", "-fPIE"],
    );
    check_against_nm(&exe, &[]);
    let elf = ElfFile::open(&exe).unwrap();
    assert_eq!(elf.kind(), ElfKind::PieExecutable);
    assert!(
        elf.is_pie() && elf.is_position_independent() && !elf.is_static() && !elf.is_stripped()
    );
    assert_eq!(elf.needed(), ["libc.so.6"]);
    assert_eq!(elf.interpreter(), Some("/lib64/ld-linux-x86-64.so.2"));
    let helper = elf
        .functions()
        .iter()
        .find(|f| f.name() == "helper")
        .unwrap();
    assert!(helper.in_symtab && !helper.in_dynsym);
}

#[test]
fn non_pie_functions_match_nm() {
    let dir = tempfile::tempdir().unwrap();
    let exe = cc(
        dir.path(),
        "app",
        &[("app.c", APP)],
        &["-O1", "-no-pie", "-fno-pie"],
    );
    check_against_nm(&exe, &[]);
    let elf = ElfFile::open(&exe).unwrap();
    assert_eq!(elf.kind(), ElfKind::Executable);
    assert!(!elf.is_position_independent() && !elf.is_static());
    assert_eq!(
        nm_addr(&exe, "main"),
        elf.functions()
            .iter()
            .find(|f| f.name() == "main")
            .unwrap()
            .vaddr
    );
}

#[test]
fn static_executable() {
    let dir = tempfile::tempdir().unwrap();
    let exe = cc(dir.path(), "app", &[("app.c", APP)], &["-O1", "-static"]);
    let elf = ElfFile::open(&exe).unwrap();
    assert!(elf.is_static());
    assert!(elf.needed().is_empty());
    assert_eq!(elf.interpreter(), None);
    // Static glibc has IFUNCs (memcpy and friends).
    check_against_nm(&exe, &[]);
    assert!(elf.functions().iter().any(|f| f.ifunc));
}

#[test]
fn stripped_shared_library_has_only_dynsym() {
    let dir = tempfile::tempdir().unwrap();
    let lib = cc(
        dir.path(),
        "libdemo.so",
        &[("demo.c", "int demo_add(int a, int b) { return a + b; }\nstatic int hidden(int x) { return x; }\nint demo_twice(int x) { return hidden(x) * 2; }\n")],
        &["-O1", "-shared", "-fPIC", "-Wl,-soname,libdemo.so.1"],
    );
    run("strip", &[lib.to_str().unwrap()]);
    let elf = ElfFile::open(&lib).unwrap();
    assert!(elf.is_stripped());
    assert_eq!(elf.kind(), ElfKind::SharedLibrary);
    assert_eq!(elf.soname(), Some("libdemo.so.1"));
    check_against_nm(&lib, &["-D"]);
    let names: Vec<&str> = elf.functions().iter().map(|f| f.name()).collect();
    assert!(
        names.contains(&"demo_add") && names.contains(&"demo_twice") && !names.contains(&"hidden")
    );

    // A stripped executable with exported functions (-rdynamic).
    let exe = cc(dir.path(), "app", &[("app.c", APP)], &["-O1", "-rdynamic"]);
    run("strip", &[exe.to_str().unwrap()]);
    let elf = ElfFile::open(&exe).unwrap();
    assert!(elf.is_stripped() && elf.is_pie());
    check_against_nm(&exe, &["-D"]);
    assert!(elf.functions().iter().any(|f| f.name() == "my_b"));
}

#[test]
fn build_id_matches_readelf() {
    let dir = tempfile::tempdir().unwrap();
    let exe = cc(
        dir.path(),
        "app",
        &[("app.c", APP)],
        &["-Wl,--build-id=sha1"],
    );
    let notes = run("readelf", &["-n", exe.to_str().unwrap()]);
    let want = notes
        .lines()
        .find_map(|l| l.trim().strip_prefix("Build ID: "))
        .unwrap()
        .trim();
    assert_eq!(
        ElfFile::open(&exe).unwrap().build_id_hex().as_deref(),
        Some(want)
    );
}

/// `.text`'s (address, file offset) from `readelf -SW`.
fn text_section(path: &Path) -> (u64, u64) {
    let out = run("readelf", &["-SW", path.to_str().unwrap()]);
    let line = out.lines().find(|l| l.contains(" .text ")).unwrap();
    let f: Vec<&str> = line.split(']').nth(1).unwrap().split_whitespace().collect();
    (
        u64::from_str_radix(f[2], 16).unwrap(),
        u64::from_str_radix(f[3], 16).unwrap(),
    )
}

#[test]
fn read_vaddr_and_offsets() {
    let dir = tempfile::tempdir().unwrap();
    for flags in [&["-pie", "-fPIE"][..], &["-no-pie", "-fno-pie"][..]] {
        let exe = cc(dir.path(), "app", &[("app.c", APP)], flags);
        let elf = ElfFile::open(&exe).unwrap();
        let file = std::fs::read(&exe).unwrap();
        let (text_addr, text_off) = text_section(&exe);
        for f in elf.functions().iter().filter(|f| f.size > 0) {
            let off = f.vaddr - text_addr + text_off;
            if !(text_addr..text_addr + 0x10000).contains(&f.vaddr) {
                continue;
            }
            let want = &file[off as usize..(off + f.size) as usize];
            assert_eq!(
                elf.read_vaddr(f.vaddr, f.size).unwrap(),
                want,
                "{}",
                f.name()
            );
            assert_eq!(elf.vaddr_to_file_offset(f.vaddr), Some(off));
            assert_eq!(elf.file_offset_to_vaddr(off), Some(f.vaddr));
        }
        // .bss has no file bytes.
        let bss = elf.section(".bss").unwrap();
        assert!(matches!(
            elf.read_vaddr(bss.addr, 1),
            Err(Error::NoFileBytes { .. })
        ));
        assert!(elf.read_vaddr(u64::MAX - 2, 8).is_err());
        assert_eq!(elf.vaddr_to_file_offset(u64::MAX), None);
        // resolve() hands out the same bytes.
        let r = resolve(&elf, "my_b", None).unwrap();
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].bytes, elf.read_vaddr(r[0].vaddr, r[0].size).unwrap());
        assert_eq!(r[0].runtime_addr, None);
        assert_eq!(
            resolve(&elf, "my_b", Some(0x1000)).unwrap()[0].runtime_addr,
            Some(r[0].vaddr + 0x1000)
        );
    }
}

#[test]
fn glob_resolution_and_suggestions() {
    let dir = tempfile::tempdir().unwrap();
    let exe = cc(dir.path(), "app", &[("app.c", APP)], &["-O1"]);
    let elf = ElfFile::open(&exe).unwrap();
    let names = |pat: &str| -> Vec<String> {
        let mut v: Vec<String> = resolve(&elf, pat, None)
            .unwrap()
            .into_iter()
            .map(|r| r.name)
            .collect();
        v.sort();
        v
    };
    assert_eq!(names("my_*"), ["my_a", "my_b"]);
    assert_eq!(names("my_[a]"), ["my_a"]);
    assert_eq!(names("my_?"), ["my_a", "my_b"]);
    assert_eq!(names("[m]ain"), ["main"]);
    assert_eq!(names("parse"), ["parse"]);
    let err = resolve(&elf, "pars", None).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "function `pars` not found in {}; did you mean `parse`?",
            exe.display()
        )
    );
    let err = resolve(&elf, "zz*", None).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!("no function matches `zz*` in {}", exe.display())
    );
    let err = resolve(&elf, "my_c", None).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "function `my_c` not found in {}; did you mean `my_a` or `my_b`?",
            exe.display()
        )
    );
}

#[test]
fn cpp_names_match_mangled_and_demangled() {
    let dir = tempfile::tempdir().unwrap();
    let src = "namespace ns { __attribute__((noinline)) int add(int a, int b) { return a + b; } }\nint main() { return ns::add(1, 2); }\n";
    let exe = cc(dir.path(), "app", &[("app.cc", src)], &["-O1", "-x", "c++"]);
    let elf = ElfFile::open(&exe).unwrap();
    let by_mangled = resolve(&elf, "_ZN2ns3addEii", None).unwrap();
    let by_full = resolve(&elf, "ns::add(int, int)", None).unwrap();
    let by_base = resolve(&elf, "ns::add", None).unwrap();
    let by_glob = resolve(&elf, "ns::*", None).unwrap();
    for r in [&by_mangled, &by_full, &by_base, &by_glob] {
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].name, "_ZN2ns3addEii");
        assert_eq!(r[0].demangled.as_deref(), Some("ns::add(int, int)"));
        assert_eq!(r[0].vaddr, nm_addr(&exe, "_ZN2ns3addEii"));
    }
    let err = resolve(&elf, "ns::ad", None).unwrap_err();
    assert!(
        err.to_string().ends_with("did you mean `ns::add`?"),
        "{err}"
    );
}

#[test]
fn listing_like_bpftrace() {
    let dir = tempfile::tempdir().unwrap();
    let exe = cc(dir.path(), "app", &[("app.c", APP)], &["-O1"]);
    let abs = std::fs::canonicalize(&exe).unwrap();
    let lines = list(&ListSource::File(exe.clone()), "uprobe:*:my_*").unwrap();
    assert_eq!(
        lines,
        [
            format!("uprobe:{}:my_a", abs.display()),
            format!("uprobe:{}:my_b", abs.display())
        ]
    );
    let all = list(&ListSource::File(exe.clone()), "").unwrap();
    assert!(all.contains(&format!("uprobe:{}:main", abs.display())));
    assert!(all.windows(2).all(|w| w[0] < w[1]), "sorted and unique");
}

const PLACEHOLDER_SRC: &str = r#"
int f1(int x) { return x + 1; }
int f2(int x) { return f1(x) * 2; }
int main(void) { return f2(1); }
"#;

fn our_entries(exe: &Path) -> Vec<u64> {
    let mut v: Vec<u64> = ["f1", "f2", "main"]
        .iter()
        .map(|n| nm_addr(exe, n))
        .collect();
    v.sort();
    v
}

#[test]
fn patchable_function_entries_are_function_entries() {
    let dir = tempfile::tempdir().unwrap();
    for pie in [&["-pie", "-fPIE"][..], &["-no-pie", "-fno-pie"][..]] {
        let mut args = vec![
            "-O1",
            "-fcf-protection=none",
            "-fpatchable-function-entry=5",
        ];
        args.extend_from_slice(pie);
        let exe = cc(dir.path(), "app", &[("p.c", PLACEHOLDER_SRC)], &args);
        let elf = ElfFile::open(&exe).unwrap();
        assert_eq!(
            elf.patchable_function_entries(),
            our_entries(&exe),
            "{pie:?}"
        );
        for a in elf.patchable_function_entries() {
            assert_eq!(
                elf.read_vaddr(a, 5).unwrap(),
                [0x90; 5],
                "five one-byte NOPs"
            );
        }
        assert!(elf.mcount_locations().is_empty());
    }
}

#[test]
fn mcount_locations_are_function_entries() {
    let dir = tempfile::tempdir().unwrap();
    // gcc refuses -mnop-mcount with -fPIC/-fPIE: the PIE build keeps the calls, to a
    // __fentry__ of our own (glibc has none).
    let fentry = "__asm__(\".globl __fentry__\\n__fentry__: ret\");\n";
    let src = format!("{fentry}{PLACEHOLDER_SRC}");
    for pie in [
        &["-pie", "-fPIE"][..],
        &["-no-pie", "-fno-pie", "-mnop-mcount"][..],
    ] {
        let mut args = vec![
            "-O1",
            "-fcf-protection=none",
            "-pg",
            "-mfentry",
            "-mrecord-mcount",
        ];
        args.extend_from_slice(pie);
        let exe = cc(dir.path(), "app", &[("p.c", &src)], &args);
        let elf = ElfFile::open(&exe).unwrap();
        assert_eq!(elf.mcount_locations(), our_entries(&exe), "{pie:?}");
        for a in elf.mcount_locations() {
            let b = elf.read_vaddr(a, 5).unwrap();
            // A 5-byte NOP, `call __fentry__`, or the linker's relaxed `addr32 call`.
            assert!(
                b == [0x0f, 0x1f, 0x44, 0x00, 0x00] || b[0] == 0xe8 || b[..2] == [0x67, 0xe8],
                "{b:02x?}"
            );
        }
        assert!(elf.patchable_function_entries().is_empty());
    }
}

// ---------------------------------------------------------------------------------
// Bad input: errors, never panics.
// ---------------------------------------------------------------------------------

#[test]
fn not_elf_and_missing_files() {
    let dir = tempfile::tempdir().unwrap();
    let txt = dir.path().join("notes.txt");
    std::fs::write(
        &txt,
        "just some text, long enough to be more than sixty-four bytes long......\n",
    )
    .unwrap();
    assert_eq!(
        ElfFile::open(&txt).unwrap_err().to_string(),
        format!("`{}` is not an ELF file", txt.display())
    );
    let short = dir.path().join("short");
    std::fs::write(&short, "hi").unwrap();
    assert_eq!(
        ElfFile::open(&short).unwrap_err().to_string(),
        format!("`{}` is not an ELF file", short.display())
    );
    let empty = dir.path().join("empty");
    std::fs::write(&empty, "").unwrap();
    assert!(matches!(ElfFile::open(&empty), Err(Error::NotElf { .. })));
    let e = ElfFile::open("/nonexistent/app").unwrap_err();
    assert_eq!(
        e.to_string(),
        "cannot read /nonexistent/app: No such file or directory (os error 2)"
    );
    assert!(matches!(ElfFile::open(dir.path()), Err(Error::Io { .. })));
    assert!(matches!(
        ElfFile::open("/dev/zero"),
        Err(Error::NotElf { .. })
    ));
}

#[test]
fn truncated_and_corrupted_elf_are_errors() {
    let dir = tempfile::tempdir().unwrap();
    let exe = cc(dir.path(), "app", &[("app.c", APP)], &[]);
    let bytes = std::fs::read(&exe).unwrap();
    let p = dir.path().join("bad");

    std::fs::write(&p, &bytes[..100]).unwrap();
    let e = ElfFile::open(&p).unwrap_err();
    assert!(matches!(e, Error::Malformed { .. }), "{e}");
    assert!(
        e.to_string()
            .starts_with(&format!("`{}` is a malformed ELF file: ", p.display())),
        "{e}"
    );

    let mut corrupt = bytes.clone();
    corrupt[0x28..0x30].copy_from_slice(&0xffff_ff00u64.to_le_bytes()); // e_shoff
    std::fs::write(&p, &corrupt).unwrap();
    assert!(matches!(ElfFile::open(&p), Err(Error::Malformed { .. })));

    let mut aarch64 = bytes.clone();
    aarch64[18..20].copy_from_slice(&183u16.to_le_bytes()); // e_machine
    std::fs::write(&p, &aarch64).unwrap();
    assert_eq!(
        ElfFile::open(&p).unwrap_err().to_string(),
        format!("`{}` is an ELF file for AArch64, not x86-64", p.display())
    );

    // The file cut just before its section headers.
    let shoff = u64::from_le_bytes(bytes[0x28..0x30].try_into().unwrap()) as usize;
    std::fs::write(&p, &bytes[..shoff + 10]).unwrap();
    assert!(matches!(ElfFile::open(&p), Err(Error::Malformed { .. })));

    let obj = dir.path().join("x.o");
    run(
        "gcc",
        &["-c", "-x", "c", "/dev/null", "-o", obj.to_str().unwrap()],
    );
    assert_eq!(
        ElfFile::open(&obj).unwrap_err().to_string(),
        format!(
            "`{}` is a relocatable object file, not an executable or a shared library",
            obj.display()
        )
    );
}

/// A small deterministic PRNG (xorshift64*), so failures can be replayed by seed.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// Everything a caller may do with a file, on whatever parsed.
fn exercise(elf: &ElfFile) {
    for f in elf.functions() {
        let _ = elf.read_vaddr(f.vaddr, f.size);
        let _ = elf.vaddr_to_file_offset(f.vaddr);
    }
    let _ = resolve(elf, "m*", Some(0x1000));
    let _ = resolve(elf, "mian", None);
    for p in elf.usdt_probes() {
        let _ = p.args();
    }
    let _ = elf.patchable_function_entries();
    let _ = elf.mcount_locations();
    if let Ok(Some(dbg)) = elf.debug_info() {
        let _ = dbg.function_params("main");
        let _ = dbg.line_for(elf.entry());
    }
}

#[test]
fn random_mutations_never_panic() {
    let dir = tempfile::tempdir().unwrap();
    let src = format!(
        "#include <sys/sdt.h>\n{APP}\nvoid probe_me(int a) {{ DTRACE_PROBE1(p, n, a); }}\n"
    );
    let exe = cc(dir.path(), "app", &[("app.c", &src)], &["-g", "-O1"]);
    let bytes = std::fs::read(&exe).unwrap();
    exercise(&ElfFile::parse(&exe, bytes.clone()).unwrap());
    let header_end = 0x1000.min(bytes.len());
    // WEFT_FUZZ_ITERS=100000 for a longer soak.
    let iters: u64 = std::env::var("WEFT_FUZZ_ITERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(400);
    for seed in 1..=iters {
        let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15));
        let mut data = bytes.clone();
        for _ in 0..1 + rng.below(16) {
            // Mostly headers and tables, sometimes anywhere.
            let at = if rng.below(3) == 0 {
                rng.below(data.len())
            } else {
                rng.below(header_end)
            };
            data[at] = rng.next() as u8;
        }
        if rng.below(8) == 0 {
            data.truncate(rng.below(data.len()));
        }
        let outcome = std::panic::catch_unwind(|| {
            if let Ok(elf) = ElfFile::parse("/fuzz", data.clone()) {
                exercise(&elf);
            }
        });
        assert!(outcome.is_ok(), "panicked on mutation seed {seed}");
    }
}

// ---------------------------------------------------------------------------------
// Targets without a process.
// ---------------------------------------------------------------------------------

#[test]
fn library_names_resolve_through_dt_needed() {
    let dir = tempfile::tempdir().unwrap();
    let exe = cc(dir.path(), "app", &[("app.c", APP)], &[]);
    let elf = ElfFile::open(&exe).unwrap();
    let search = LibrarySearch::system();
    let ctx = TargetContext {
        process: None,
        executable: Some(&elf),
        search: &search,
    };
    let ldconfig = run("ldconfig", &["-p"]);
    let libc_path = ldconfig
        .lines()
        .find(|l| l.trim_start().starts_with("libc.so.6 ") && l.contains("x86-64"))
        .and_then(|l| l.split("=> ").nth(1))
        .unwrap()
        .trim()
        .to_string();
    for spec in ["libc", "libc.so.6", "libc.so"] {
        let t = resolve_target(spec, &ctx).unwrap();
        assert_eq!(t.path, Path::new(&libc_path), "{spec}");
        assert!(t.module.is_none());
    }
    // Not needed by the program, found in the cache.
    let libm = resolve_target("libm", &ctx).unwrap();
    assert_eq!(libm.path.file_name().unwrap(), "libm.so.6");
    // Paths.
    let t = resolve_target(exe.to_str().unwrap(), &ctx).unwrap();
    assert_eq!(t.path, std::fs::canonicalize(&exe).unwrap());
    // A typo.
    let e = resolve_target("libcc", &ctx).unwrap_err();
    match &e {
        Error::TargetNotFound { suggestions, .. } => {
            assert!(suggestions.contains(&"libc.so.6".to_string()), "{e}")
        }
        other => panic!("{other}"),
    }
    assert!(
        e.to_string().starts_with(&format!(
            "cannot find `libcc` (not needed by {}",
            exe.display()
        )),
        "{e}"
    );
    // Functions in the library found that way.
    let libc = ElfFile::open(&libc_path).unwrap();
    assert_eq!(resolve(&libc, "malloc", None).unwrap().len(), 1);
    assert!(libc.is_stripped() || !libc.functions().is_empty());
}

/// `objdump -d`'s `<name@plt>` labels: the PLT entry of each imported function.
fn objdump_plt(path: &Path) -> std::collections::BTreeMap<String, u64> {
    run("objdump", &["-d", path.to_str().unwrap()])
        .lines()
        .filter_map(|l| {
            let (addr, rest) = l.split_once(" <")?;
            let name = rest.strip_suffix("@plt>:")?;
            Some((name.to_string(), u64::from_str_radix(addr.trim(), 16).ok()?))
        })
        .collect()
}

#[test]
fn imports_have_the_plt_entries_objdump_names() {
    let dir = tempfile::tempdir().unwrap();
    for (name, flags) in [
        ("ibt", &["-O1", "-fcf-protection=full"][..]),
        ("noibt", &["-O1", "-fcf-protection=none"][..]),
        ("nopie", &["-O1", "-fno-pie", "-no-pie"][..]),
        ("now", &["-O1", "-Wl,-z,now", "-fcf-protection=full"][..]),
    ] {
        let exe = cc(dir.path(), name, &[("app.c", APP)], flags);
        let elf = ElfFile::open(&exe).unwrap();
        let ours: std::collections::BTreeMap<String, u64> = elf
            .imports()
            .iter()
            .filter_map(|i| Some((i.name.clone(), i.plt?)))
            .collect();
        let theirs = objdump_plt(&exe);
        // gcc calls strtol for atoi; a PIE's __cxa_finalize is in `.plt.got`.
        let pie = name != "nopie";
        for f in ["strtol", "printf", "__cxa_finalize"] {
            assert_eq!(
                ours.get(f),
                theirs.get(f),
                "{name}: {f}: {ours:?} vs {theirs:?}"
            );
            if f != "__cxa_finalize" || pie {
                assert!(ours.contains_key(f), "{name}: no PLT entry for {f}");
            }
        }
    }
    // -fno-plt: calls go through the GOT slot; no PLT entry uses it.
    let exe = cc(dir.path(), "noplt", &[("app.c", APP)], &["-O1", "-fno-plt"]);
    let elf = ElfFile::open(&exe).unwrap();
    let strtol = elf.imports().iter().find(|i| i.name == "strtol").unwrap();
    assert_eq!(strtol.plt, None);
    assert!(strtol.slot != 0);
}
