//! Coldpatching real programs: tests/targets/prepared_calls.c and small sources, built
//! with gcc and clang across a flag matrix. Each coldpatched binary is checked against
//! objdump's disassembly of the original: identical except the replaced calls, and
//! the probe list has exactly the call sites objdump sees.

mod common;

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use common::{build, disassemble, prepared_calls, run, sections, source, symbols, tool};
use weft_coldpatch::{coldpatch, format, ColdPatched, Error, Options, SkipReason};
use weft_symbols::{ElfFile, WeftProbeKind};

/// The functions of prepared_calls.c (all out of line, all instrumented).
const FUNCTIONS: [&str; 9] = [
    "leaf", "mid", "touch", "classify", "fib", "summary", "twelve", "run", "main",
];

const EXPECTED_OUTPUT: &str = "mid total 10000
touch sink 300
classify -1:10 0:1 1:19
fib(10) 55
twelve twelve
gated runs weft 0 sdt 0
";

/// Coldpatches `exe` into `exe.cold` and returns the result and the new file.
fn coldpatch_file(exe: &Path, strip: bool) -> (ColdPatched, PathBuf) {
    let input = std::fs::read(exe).unwrap();
    let done = coldpatch(exe, &input, &Options { strip }).unwrap_or_else(|e| panic!("{e}"));
    let out = exe.with_extension(if strip { "cold-stripped" } else { "cold" });
    std::fs::write(&out, &done.bytes).unwrap();
    std::fs::set_permissions(&out, std::fs::Permissions::from_mode(0o755)).unwrap();
    (done, out)
}

/// What objdump says the original calls: address → (kind, tail, length), for calls
/// and jumps to `__cyg_profile_func_*` in `.text`.
fn objdump_call_sites(exe: &Path) -> BTreeMap<u64, (WeftProbeKind, bool, u8)> {
    disassemble(exe)
        .into_iter()
        .filter(|(_, l)| l.section == ".text")
        .filter_map(|(addr, l)| {
            let kind = if l.text.contains("<__cyg_profile_func_enter") {
                WeftProbeKind::Entry
            } else if l.text.contains("<__cyg_profile_func_exit") {
                WeftProbeKind::Exit
            } else {
                return None;
            };
            let op = l.text.trim_start_matches("bnd ");
            let tail = if op.starts_with("call") {
                false
            } else if op.starts_with("jmp") {
                true
            } else {
                panic!("unexpected reference at {addr:#x}: {}", l.text)
            };
            Some((addr, (kind, tail, l.bytes.len() as u8)))
        })
        .collect()
}

/// The central check: same output, same disassembly except the placeholders, and a
/// probe list with exactly objdump's call sites.
fn check(exe: &Path) -> ColdPatched {
    let (done, out) = coldpatch_file(exe, false);
    assert_eq!(
        run(exe, &[]),
        run(&out, &[]),
        "{}: output differs",
        exe.display()
    );

    let oracle = objdump_call_sites(exe);
    let listed: BTreeMap<u64, (WeftProbeKind, bool, u8)> = done
        .probes
        .iter()
        .map(|p| (p.vaddr, (p.kind, p.tail, p.len)))
        .collect();
    assert_eq!(listed, oracle, "{}", exe.display());
    assert!(done.skipped.is_empty(), "{:?}", done.skipped);

    let before = disassemble(exe);
    let after = disassemble(&out);
    let in_site = |a: u64| {
        done.probes
            .iter()
            .any(|p| p.vaddr <= a && a < p.vaddr + u64::from(p.len))
    };
    for (addr, line) in &before {
        if !in_site(*addr) {
            assert_eq!(
                after.get(addr),
                Some(line),
                "{}: {addr:#x} changed",
                exe.display()
            );
        }
    }
    for (addr, line) in &after {
        if in_site(*addr) {
            continue;
        }
        assert_eq!(
            before.get(addr),
            Some(line),
            "{}: {addr:#x} is new",
            exe.display()
        );
    }
    for p in &done.probes {
        let want = format::placeholder(usize::from(p.len), p.tail).unwrap();
        let got: Vec<u8> = after
            .range(p.vaddr..p.vaddr + u64::from(p.len))
            .flat_map(|(_, l)| l.bytes.clone())
            .collect();
        assert_eq!(got, want, "placeholder at {:#x}", p.vaddr);
        let first = &after[&p.vaddr].text;
        let expect = if p.tail { "ret" } else { "nop" };
        assert!(first.starts_with(expect), "{:#x}: {first}", p.vaddr);
    }

    // Sections: the same, plus the probe list; the list reads back from the file.
    let mut secs = sections(exe);
    secs.push(".weft.probes".into());
    assert_eq!(sections(&out), secs);
    let elf = ElfFile::open(&out).unwrap();
    assert_eq!(elf.weft_probes().unwrap(), done.probes);
    // Non-allocated sections (debug info, .comment, .symtab...) may have moved, but
    // hold the same bytes.
    let orig = ElfFile::open(exe).unwrap();
    for sec in orig
        .sections()
        .iter()
        .filter(|s| s.flags & 2 == 0 && s.name != ".shstrtab")
    {
        let new = elf.section(&sec.name).unwrap();
        assert_eq!(
            elf.section_data(new),
            orig.section_data(sec),
            "{}",
            sec.name
        );
    }
    let note = tool("readelf", &["-S", "-W", out.to_str().unwrap()]);
    let line = note.lines().find(|l| l.contains(".weft.probes")).unwrap();
    assert!(line.contains("PROGBITS"), "{line}");
    done
}

/// The prepared program's probe list: one entry per function, at least one exit
/// (exactly one at -O0), with the functions' addresses; `file:line` with -g.
fn check_prepared(exe: &Path, done: &ColdPatched, o0: bool, debug: bool) {
    let syms = symbols(exe);
    let src = std::fs::read_to_string(prepared_calls()).unwrap();
    for f in FUNCTIONS {
        let entries: Vec<_> = done
            .probes
            .iter()
            .filter(|p| p.function == f && p.kind == WeftProbeKind::Entry)
            .collect();
        let exits: Vec<_> = done
            .probes
            .iter()
            .filter(|p| p.function == f && p.kind == WeftProbeKind::Exit)
            .collect();
        assert_eq!(entries.len(), 1, "{}: {f}: {entries:?}", exe.display());
        assert!(!exits.is_empty(), "{}: {f}", exe.display());
        if o0 {
            assert_eq!(exits.len(), 1, "{}: {f}", exe.display());
        }
        for p in entries.iter().chain(&exits) {
            assert_eq!(p.function_vaddr, Some(syms[f]), "{f}");
            assert!(!p.inlined, "{f}");
            if debug {
                let loc = p
                    .location
                    .as_deref()
                    .unwrap_or_else(|| panic!("{f}: no location"));
                assert!(loc.contains("prepared_calls.c:"), "{loc}");
            } else {
                assert_eq!(p.location, None);
            }
        }
        if o0 && debug {
            // The entry's line is the line of the function's opening brace.
            let lines: Vec<&str> = src.lines().collect();
            let head = lines
                .iter()
                .position(|l| {
                    l.contains(&format!(" {f}("))
                        && (l.starts_with("NOINLINE") || l.starts_with("int main"))
                })
                .unwrap();
            let def = head + lines[head..].iter().position(|l| l.contains('{')).unwrap() + 1;
            let loc = entries[0].location.as_deref().unwrap();
            assert!(
                loc.ends_with(&format!("prepared_calls.c:{def}")),
                "{f}: {loc}"
            );
        }
    }
    let names: std::collections::BTreeSet<&str> =
        done.probes.iter().map(|p| p.function.as_str()).collect();
    assert_eq!(names, FUNCTIONS.iter().copied().collect());
}

#[test]
fn prepared_program_with_gcc_across_flags() {
    let dir = tempfile::tempdir().unwrap();
    let src = prepared_calls();
    let matrix: &[(&str, &[&str])] = &[
        ("o0", &["-O0", "-g"]),
        ("o2", &["-O2", "-g"]),
        ("o2noplt", &["-O2", "-g", "-fno-plt"]),
        ("o2nopie", &["-O2", "-g", "-no-pie", "-fno-pie"]),
        ("o1cet", &["-O1", "-fcf-protection=full"]),
        ("o2cetnoplt", &["-O2", "-fcf-protection=full", "-fno-plt"]),
        ("o3sdtsem", &["-O3", "-g", "-DPREPARED_SDT_SEMAPHORES"]),
    ];
    for (name, flags) in matrix {
        let mut args = vec!["-finstrument-functions"];
        args.extend_from_slice(flags);
        let exe = build("gcc", dir.path(), name, &[&src], &args);
        assert_eq!(run(&exe, &[]), (0, EXPECTED_OUTPUT.to_string()));
        let done = check(&exe);
        check_prepared(&exe, &done, flags[0] == "-O0", flags.contains(&"-g"));
        if flags.contains(&"-fno-plt") {
            assert!(
                done.probes.iter().all(|p| p.len == 6),
                "{name}: call *GOT(%rip) sites"
            );
        }
        if flags[0] == "-O2" || flags[0] == "-O3" {
            // `touch` is void: -O2 ends it with `jmp __cyg_profile_func_exit`.
            let touch_exit = done
                .probes
                .iter()
                .find(|p| p.function == "touch" && p.kind == WeftProbeKind::Exit)
                .unwrap();
            assert!(touch_exit.tail, "{name}");
        }
    }
}

#[test]
fn prepared_program_with_clang() {
    let dir = tempfile::tempdir().unwrap();
    let src = prepared_calls();
    for (name, flags) in [("c0", ["-O0", "-g"]), ("c2", ["-O2", "-g"])] {
        let mut args = vec!["-finstrument-functions"];
        args.extend_from_slice(&flags);
        let exe = build("clang", dir.path(), name, &[&src], &args);
        assert_eq!(run(&exe, &[]), (0, EXPECTED_OUTPUT.to_string()));
        let done = check(&exe);
        check_prepared(&exe, &done, false, true);
    }
}

#[test]
fn static_glibc_aliases_the_hooks() {
    // libc6-dev (scripts/setup) installs it: its absence is a broken install.
    assert!(
        Path::new("/usr/lib/x86_64-linux-gnu/libc.a").exists(),
        "no static libc (libc6-dev): scripts/setup installs it"
    );
    let dir = tempfile::tempdir().unwrap();
    let exe = build(
        "gcc",
        dir.path(),
        "static",
        &[&prepared_calls()],
        &["-O2", "-static", "-finstrument-functions"],
    );
    let e = coldpatch(&exe, &std::fs::read(&exe).unwrap(), &Options::default()).unwrap_err();
    assert_eq!(
        e.to_string(),
        format!(
            "__cyg_profile_func_enter and __cyg_profile_func_exit are one function in {} (statically linked?), so entries and exits cannot be told apart; nothing written",
            exe.display()
        )
    );
}

#[test]
fn stripping_keeps_the_probe_list() {
    let dir = tempfile::tempdir().unwrap();
    let exe = build(
        "gcc",
        dir.path(),
        "app",
        &[&prepared_calls()],
        &["-O2", "-finstrument-functions"],
    );
    let (plain, _) = coldpatch_file(&exe, false);
    let (stripped, out) = coldpatch_file(&exe, true);
    assert_eq!(stripped.stripped, [".symtab", ".strtab"]);
    assert_eq!(stripped.probes, plain.probes);
    assert_eq!(run(&out, &[]), (0, EXPECTED_OUTPUT.to_string()));
    let secs = sections(&out);
    assert!(
        !secs.iter().any(|s| s == ".symtab" || s == ".strtab"),
        "{secs:?}"
    );
    assert!(secs.iter().any(|s| s == ".weft.probes"));
    let elf = ElfFile::open(&out).unwrap();
    assert!(elf.is_stripped());
    assert_eq!(elf.weft_probes().unwrap(), plain.probes);
    // The symbol names are gone from the file, not just unreferenced.
    let bytes = std::fs::read(&out).unwrap();
    // (Names of instrumented functions stay in the probe list; crt's do not.)
    let name = b"deregister_tm_clones";
    assert!(std::fs::read(&exe)
        .unwrap()
        .windows(name.len())
        .any(|w| w == name));
    assert!(
        !bytes.windows(name.len()).any(|w| w == name),
        "a symbol name is left"
    );
    // Loaded bytes are the unstripped output's.
    let unstripped = std::fs::read(exe.with_extension("cold")).unwrap();
    for seg in elf.segments().iter().filter(|s| s.is_load()) {
        let r = seg.offset as usize..(seg.offset + seg.filesz) as usize;
        if r.start == 0 {
            continue; // the ELF header's section table fields differ
        }
        assert_eq!(bytes[r.clone()], unstripped[r]);
    }
    // The stripped binary is already coldpatched, and cannot be coldpatched again.
    let e = coldpatch(&out, &bytes, &Options::default()).unwrap_err();
    assert!(matches!(e, Error::AlreadyColdpatched { .. }), "{e}");
}

const INLINED: &str = r#"#include <stdio.h>
static int sq(int x) { return x * x; }
int add(int a, int b) { return a + b; }
int main(void) { int s = 0; for (int i = 0; i < 10; i++) s = add(s, sq(i)); printf("%d\n", s); return 0; }
"#;

#[test]
fn inlined_copies_keep_their_function() {
    let dir = tempfile::tempdir().unwrap();
    let src = source(dir.path(), "inl.c", INLINED);
    for pie in [&["-pie", "-fPIE"][..], &["-no-pie", "-fno-pie"]] {
        let mut args = vec!["-O2", "-finstrument-functions"];
        args.extend_from_slice(pie);
        let exe = build("gcc", dir.path(), "inl", &[&src], &args);
        let done = check(&exe);
        let syms = symbols(&exe);
        for f in ["add", "sq", "main"] {
            let sites: Vec<_> = done.probes.iter().filter(|p| p.function == f).collect();
            assert!(!sites.is_empty(), "{f}");
            assert!(
                sites.iter().all(|p| p.function_vaddr == Some(syms[f])),
                "{f}"
            );
        }
        // add and sq are inlined into main's loop: an entry and an exit of each there.
        let main = syms["main"];
        let inlined: Vec<_> = done.probes.iter().filter(|p| p.inlined).collect();
        assert_eq!(inlined.len(), 4, "{pie:?}: {inlined:?}");
        for f in ["add", "sq"] {
            for kind in [WeftProbeKind::Entry, WeftProbeKind::Exit] {
                let p = inlined
                    .iter()
                    .find(|p| p.function == f && p.kind == kind)
                    .unwrap();
                let elf = ElfFile::open(&exe).unwrap();
                assert_eq!(elf.function_at(p.vaddr).unwrap().vaddr, main, "{f}");
            }
        }
    }
}

const HOOKS: &str = r#"#include <stdio.h>
static int calls;
__attribute__((no_instrument_function, noinline)) void __cyg_profile_func_enter(void *f, void *site) { (void)f; (void)site; calls++; }
__attribute__((no_instrument_function, noinline)) void __cyg_profile_func_exit(void *f, void *site) { (void)f; (void)site; calls += 2; }
__attribute__((noinline)) int twice(int x) { return 2 * x; }
int main(void) { int s = twice(3); printf("s=%d hooks=%d\n", s, calls); return 0; }
"#;

#[test]
fn hooks_defined_in_the_program_are_removed() {
    let dir = tempfile::tempdir().unwrap();
    let src = source(dir.path(), "hooks.c", HOOKS);
    let exe = build(
        "gcc",
        dir.path(),
        "hooks",
        &[&src],
        &["-O1", "-finstrument-functions"],
    );
    // main's entry and twice's entry and exit ran before the printf.
    assert_eq!(run(&exe, &[]), (0, "s=6 hooks=4\n".into()));
    let (done, out) = coldpatch_file(&exe, false);
    assert_eq!(run(&out, &[]), (0, "s=6 hooks=0\n".into()));
    assert_eq!(done.probes.len(), 4);
    let syms = symbols(&exe);
    let dis = disassemble(&exe);
    for p in &done.probes {
        let target = match p.kind {
            WeftProbeKind::Entry => syms["__cyg_profile_func_enter"],
            WeftProbeKind::Exit => syms["__cyg_profile_func_exit"],
            WeftProbeKind::EntryStub => unreachable!("coldpatch writes no stubs"),
        };
        assert!(
            dis[&p.vaddr]
                .text
                .starts_with(&format!("call {target:x} <")),
            "{:?}",
            dis[&p.vaddr]
        );
    }
}

#[test]
fn shared_library() {
    let dir = tempfile::tempdir().unwrap();
    let lib_src = source(
        dir.path(),
        "lib.c",
        "int lib_add(int a, int b) { return a + b; }\nvoid lib_nothing(void) { }\n",
    );
    let main_src = source(
        dir.path(),
        "main.c",
        "#include <stdio.h>\nint lib_add(int, int); void lib_nothing(void);\nint main(void) { lib_nothing(); printf(\"%d\\n\", lib_add(2, 3)); return 0; }\n",
    );
    let lib = build(
        "gcc",
        dir.path(),
        "libx.so",
        &[&lib_src],
        &["-O2", "-fPIC", "-shared", "-finstrument-functions"],
    );
    let rpath = format!("-Wl,-rpath,{}", dir.path().display());
    let exe = build(
        "gcc",
        dir.path(),
        "app",
        &[&main_src],
        &["-O2", &lib.display().to_string(), &rpath],
    );
    assert_eq!(run(&exe, &[]), (0, "5\n".into()));
    let done = check(&lib);
    let by_fn: BTreeMap<&str, usize> = done.probes.iter().fold(BTreeMap::new(), |mut m, p| {
        *m.entry(p.function.as_str()).or_default() += 1;
        m
    });
    assert_eq!(by_fn, BTreeMap::from([("lib_add", 2), ("lib_nothing", 2)]));
    // The program runs with the coldpatched library in place.
    std::fs::copy(lib.with_extension("cold"), &lib).unwrap();
    assert_eq!(run(&exe, &[]), (0, "5\n".into()));
}

#[test]
fn bad_inputs_write_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let plain = build("gcc", dir.path(), "plain", &[&prepared_calls()], &["-O2"]);
    let bytes = std::fs::read(&plain).unwrap();
    let e = coldpatch(&plain, &bytes, &Options::default()).unwrap_err();
    assert_eq!(
        e.to_string(),
        format!(
            "no -finstrument-functions calls found in {}; nothing written",
            plain.display()
        )
    );

    let exe = build(
        "gcc",
        dir.path(),
        "cyg",
        &[&prepared_calls()],
        &["-O2", "-finstrument-functions"],
    );
    let (_, out) = coldpatch_file(&exe, false);
    let e = coldpatch(&out, &std::fs::read(&out).unwrap(), &Options::default()).unwrap_err();
    assert_eq!(
        e.to_string(),
        format!(
            "{} is already coldpatched (it has a .weft.probes section); nothing written",
            out.display()
        )
    );

    let stripped = dir.path().join("stripped");
    tool(
        "strip",
        &["-o", stripped.to_str().unwrap(), exe.to_str().unwrap()],
    );
    let e = coldpatch(
        &stripped,
        &std::fs::read(&stripped).unwrap(),
        &Options::default(),
    )
    .unwrap_err();
    assert!(matches!(e, Error::NoSymbols { .. }), "{e}");

    let text = Path::new("/x/notes.txt");
    let e = coldpatch(text, b"hello, world\n", &Options::default()).unwrap_err();
    assert_eq!(e.to_string(), "`/x/notes.txt` is not an ELF file");

    let mut arm = std::fs::read(&exe).unwrap();
    arm[18..20].copy_from_slice(&183u16.to_le_bytes()); // EM_AARCH64
    let e = coldpatch(Path::new("/x/arm"), &arm, &Options::default()).unwrap_err();
    assert_eq!(
        e.to_string(),
        "`/x/arm` is an ELF file for AArch64, not x86-64"
    );

    let mut elf32 = std::fs::read(&exe).unwrap();
    elf32[4] = 1; // ELFCLASS32
    let e = coldpatch(Path::new("/x/32"), &elf32, &Options::default()).unwrap_err();
    assert!(e.to_string().contains("32-bit"), "{e}");

    let e = coldpatch(Path::new("/x/t"), &bytes[..1000], &Options::default()).unwrap_err();
    assert!(matches!(e, Error::Elf(_)), "{e}");
}

/// A reference to `__cyg_profile_func_exit` that is not a call is left alone and
/// reported, and the rest is still coldpatched.
#[test]
fn other_uses_are_reported_and_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    let src = source(
        dir.path(),
        "addr.c",
        "#include <stdio.h>\nvoid __cyg_profile_func_exit(void *, void *);\n__attribute__((noinline)) int f(int x) { return x + 1; }\nint main(void) { void (*volatile p)(void *, void *) = __cyg_profile_func_exit; printf(\"%d %d\\n\", f(1), p != 0); return 0; }\n",
    );
    let exe = build(
        "gcc",
        dir.path(),
        "addr",
        &[&src],
        &["-O2", "-finstrument-functions"],
    );
    let input = std::fs::read(&exe).unwrap();
    let done = coldpatch(&exe, &input, &Options::default()).unwrap();
    assert_eq!(done.skipped.len(), 1, "{:?}", done.skipped);
    assert_eq!(done.skipped[0].reason, SkipReason::OtherUse);
    assert_eq!(done.skipped[0].function, "main");
    assert_eq!(done.probes.len(), 4);
}

/// Bytes after the loaded part that no section accounts for (an appended payload)
/// stay where they are.
#[test]
fn appended_payload_is_kept() {
    let dir = tempfile::tempdir().unwrap();
    let exe = build(
        "gcc",
        dir.path(),
        "payload",
        &[&prepared_calls()],
        &["-O2", "-finstrument-functions"],
    );
    let mut bytes = std::fs::read(&exe).unwrap();
    let at = bytes.len();
    bytes.extend_from_slice(b"PAYLOAD-PAYLOAD-PAYLOAD");
    std::fs::write(&exe, &bytes).unwrap();
    for strip in [false, true] {
        let (done, out) = coldpatch_file(&exe, strip);
        assert_eq!(&done.bytes[at..at + 23], b"PAYLOAD-PAYLOAD-PAYLOAD");
        assert_eq!(run(&out, &[]), (0, EXPECTED_OUTPUT.to_string()));
        assert_eq!(
            ElfFile::open(&out).unwrap().weft_probes().unwrap(),
            done.probes
        );
    }
}
