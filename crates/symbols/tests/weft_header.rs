//! include/weft.h: its probes are USDT probes as sys/sdt.h makes them — weft reads
//! them, with the right argument locations and semaphores, and so do readelf and
//! bpftrace. Built from tests/targets/prepared_calls.c, which has both kinds.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::{nm_addr, run};
use weft_symbols::{ElfFile, UsdtProbe};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap()
}

fn build(compiler: &str, dir: &Path, out: &str, args: &[&str]) -> PathBuf {
    let out = dir.join(out);
    let res = Command::new(compiler)
        .arg("-I")
        .arg(root().join("include"))
        .arg(root().join("tests/targets/prepared_calls.c"))
        .args(args)
        .arg("-o")
        .arg(&out)
        .output()
        .unwrap();
    assert!(
        res.status.success(),
        "{}",
        String::from_utf8_lossy(&res.stderr)
    );
    out
}

/// The 5 bytes of a weft.h probe: `nop; nopl 0x0(%rax)`.
const WEFT_NOPS: [u8; 5] = [0x90, 0x0f, 0x1f, 0x40, 0x00];

fn probe<'a>(probes: &'a [UsdtProbe], provider: &str, name: &str) -> &'a UsdtProbe {
    probes
        .iter()
        .find(|p| p.provider == provider && p.name == name)
        .unwrap_or_else(|| panic!("no probe {provider}:{name} in {probes:?}"))
}

/// (size, signed) of each argument.
fn shapes(p: &UsdtProbe) -> Vec<(u8, bool)> {
    p.args()
        .unwrap_or_else(|e| panic!("{}: {e}", p.args_spec))
        .iter()
        .map(|a| (a.size, a.signed))
        .collect()
}

#[test]
fn probes_semaphores_and_argument_shapes() {
    let dir = tempfile::tempdir().unwrap();
    let builds: &[(&str, &str, &[&str])] = &[
        ("gcc", "g0", &["-O0"]),
        ("gcc", "g2", &["-O2"]),
        ("gcc", "g2nopie", &["-O2", "-no-pie", "-fno-pie"]),
        ("gcc", "g2sem", &["-O2", "-DPREPARED_SDT_SEMAPHORES"]),
        ("gcc", "g2cyg", &["-O2", "-finstrument-functions"]),
        ("clang", "c2", &["-O2"]),
    ];
    for (cc, name, flags) in builds {
        let exe = build(cc, dir.path(), name, flags);
        let elf = ElfFile::open(&exe).unwrap();
        let probes = elf.usdt_probes();
        assert_eq!(probes.len(), 7, "{name}: {probes:?}");
        let base = elf.section(".stapsdt.base").expect(".stapsdt.base").addr;
        let func = |f: &str| {
            elf.functions()
                .iter()
                .find(|x| x.name() == f)
                .unwrap_or_else(|| panic!("{f}"))
                .clone()
        };
        let inside = |p: &UsdtProbe, f: &str| {
            let f = func(f);
            assert!(
                p.pc >= f.vaddr && p.pc < f.vaddr + f.size,
                "{name}: {}:{} not in {}",
                p.provider,
                p.name,
                f.name()
            );
        };
        for p in &probes {
            assert_eq!(p.base, base, "{name}");
            let nops = elf.read_vaddr(p.pc, 5).unwrap();
            if p.provider == "prepared" {
                assert_eq!(nops, WEFT_NOPS, "{name}: {}", p.name);
            } else {
                assert_eq!(nops[0], 0x90, "{name}: {}", p.name);
            }
        }

        let start = probe(&probes, "prepared", "start");
        inside(start, "run");
        assert_eq!((start.args_spec.as_str(), start.semaphore), ("", None));

        let tick = probe(&probes, "prepared", "tick");
        inside(tick, "run");
        assert_eq!(shapes(tick), [(4, true), (8, true), (4, true)], "{name}");
        assert_eq!(tick.semaphore, None);

        let mid = probe(&probes, "prepared", "mid_done");
        inside(mid, "mid");
        assert_eq!(shapes(mid), [(4, true), (8, true)], "{name}");

        // The semaphore: an unsigned short in .probes, named provider_name_semaphore.
        let gated = probe(&probes, "prepared", "gated");
        inside(gated, "run");
        assert_eq!(shapes(gated), [(4, true), (8, true)], "{name}");
        let sem = nm_addr(&exe, "prepared_gated_semaphore");
        assert_eq!(gated.semaphore, Some(sem), "{name}");
        let probes_sec = elf.section(".probes").expect(".probes");
        assert!(sem >= probes_sec.addr && sem + 2 <= probes_sec.addr + probes_sec.size);

        let twelve = probe(&probes, "prepared", "twelve");
        inside(twelve, "twelve");
        assert_eq!(
            shapes(twelve),
            [
                (1, true),
                (1, false),
                (2, true),
                (2, false),
                (4, true),
                (4, false),
                (8, true),
                (8, false),
                (8, false),
                (4, true),
                (8, true),
                (1, false),
            ],
            "{name}: {}",
            twelve.args_spec
        );

        // sys/sdt.h's probes, beside weft.h's.
        let pair = probe(&probes, "prepared_sdt", "pair");
        inside(pair, "run");
        assert_eq!(shapes(pair), [(4, true), (4, true)]);
        let triple = probe(&probes, "prepared_sdt", "triple");
        assert_eq!(shapes(triple), [(4, true), (8, true), (8, false)]);
        if flags.contains(&"-DPREPARED_SDT_SEMAPHORES") {
            assert_eq!(
                pair.semaphore,
                Some(nm_addr(&exe, "prepared_sdt_pair_semaphore"))
            );
            assert_eq!(
                triple.semaphore,
                Some(nm_addr(&exe, "prepared_sdt_triple_semaphore"))
            );
        } else {
            assert_eq!((pair.semaphore, triple.semaphore), (None, None));
        }
    }
}

/// At -O2 gcc leaves the arguments where the calling convention put them: the probe
/// notes say exactly that.
#[test]
fn argument_locations_at_o2() {
    let dir = tempfile::tempdir().unwrap();
    let exe = build("gcc", dir.path(), "app", &["-O2"]);
    let probes = ElfFile::open(&exe).unwrap().usdt_probes();
    assert_eq!(
        probe(&probes, "prepared", "twelve").args_spec,
        "-1@%dil 1@%sil -2@%dx 2@%cx -4@%r8d 4@%r9d -8@8(%rsp) 8@16(%rsp) 8@24(%rsp) -4@32(%rsp) -8@40(%rsp) 1@48(%rsp)"
    );
    let args = probe(&probes, "prepared", "twelve").args().unwrap();
    use weft_ir::MachineReg::*;
    let regs: Vec<_> = args[..6]
        .iter()
        .map(|a| match &a.kind {
            weft_symbols::ArgKind::Reg(r) => (r.reg, r.bytes),
            k => panic!("{k:?}"),
        })
        .collect();
    assert_eq!(
        regs,
        [(Rdi, 1), (Rsi, 1), (Rdx, 2), (Rcx, 2), (R8, 4), (R9, 4)]
    );
    for (i, a) in args[6..].iter().enumerate() {
        assert_eq!(
            a.kind,
            weft_symbols::ArgKind::Mem {
                base: Some(weft_symbols::register("rsp").unwrap()),
                index: None,
                scale: 1,
                disp: 8 * (i as i64 + 1),
            }
        );
    }
    // Constants stay constants.
    assert_eq!(
        probe(&probes, "prepared_sdt", "triple")
            .args_spec
            .split(' ')
            .next(),
        Some("-4@$7")
    );
}

/// readelf decodes the notes; bpftrace lists them and, when it can attach (root),
/// reads their arguments and enables the semaphore-guarded probe.
#[test]
fn readelf_and_bpftrace_see_the_probes() {
    let dir = tempfile::tempdir().unwrap();
    let exe = build("gcc", dir.path(), "app", &["-O2"]);
    let path = exe.to_str().unwrap();
    let notes = run("readelf", &["-n", path]);
    assert_eq!(notes.matches("NT_STAPSDT").count(), 7, "{notes}");
    assert!(
        notes.contains("Provider: prepared\n    Name: gated"),
        "{notes}"
    );

    // bpftrace is installed by scripts/setup: its absence is a broken install.
    let list = Command::new("bpftrace")
        .args(["-l", &format!("usdt:{path}:*")])
        .output()
        .expect("bpftrace (scripts/setup installs it)");
    let list = String::from_utf8_lossy(&list.stdout);
    let mut names: Vec<&str> = list.lines().collect();
    names.sort_unstable();
    let want: Vec<String> = [
        "prepared:gated",
        "prepared:mid_done",
        "prepared:start",
        "prepared:tick",
        "prepared:twelve",
        "prepared_sdt:pair",
        "prepared_sdt:triple",
    ]
    .iter()
    .map(|p| format!("usdt:{path}:{p}"))
    .collect();
    assert_eq!(names, want);

    // Tracing needs root (or CAP_BPF) and a kernel with uprobes.
    let script = format!(
        "usdt:{path}:prepared:tick {{ @tick = count(); @tick1 = sum(arg1); @tick2 = sum(arg2); }}
         usdt:{path}:prepared:gated {{ @gated = count(); @gated1 = sum(arg1); }}
         usdt:{path}:prepared:mid_done {{ @mid = sum(arg1); }}
         usdt:{path}:prepared_sdt:pair {{ @pair = sum(arg1); }}
         usdt:{path}:prepared:twelve {{ printf(\"twelve %d %u %d %u %d %u\\n\", arg0, arg1, arg2, arg3, arg4, arg5); }}"
    );
    let out = Command::new("bpftrace")
        .args(["-e", &script, "-c", path])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() || !text.contains("Attaching") {
        eprintln!(
            "bpftrace cannot trace here: skipped\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        return;
    }
    for line in [
        "gated runs weft 10 sdt 0",
        "twelve -1 200 -300 60000 -70000 4000000000",
        "@tick: 10",
        "@tick1: 285",
        // bpftrace's sum() prints unsigned: -45 and -135, sign-extended from 32 bits.
        "@tick2: 18446744073709551571",
        "@gated: 10",
        "@gated1: 45070",
        "@mid: 10000",
        "@pair: 18446744073709551481",
    ] {
        assert!(text.lines().any(|l| l == line), "no `{line}` in:\n{text}");
    }
}

const CXX: &str = r#"#include <cstdio>
#include "weft.h"
namespace app {
WEFT_SEMAPHORE(cxx, gated);
enum class Level : short { Low = -1, High = 1 };
enum Plain : unsigned { A = 1 };
template <typename T> T twice(T x) {
    WEFT_PROBE(cxx, in_template, x);
    return 2 * x;
}
void gate(int v) {
    if (WEFT_PROBE_ENABLED(cxx, gated))
        WEFT_PROBE(cxx, gated, v);
}
}
int main(int argc, char **) {
    char buf[8] = "cxx";
    app::Level lv = app::Level::Low;
    WEFT_PROBE(cxx, kinds, argc, lv, app::A, buf, 2.5, true, (unsigned char)7);
    app::gate(argc);
    std::printf("%d %ld\n", app::twice(argc), app::twice(3L));
    return 0;
}
"#;

/// C++11: the semaphore keeps its C name inside a namespace, enums take their
/// underlying type's sign, arrays are pointers, probes in templates work.
#[test]
fn cxx_probes() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("t.cc");
    std::fs::write(&src, CXX).unwrap();
    for cxx in ["g++", "clang++"] {
        let exe = dir.path().join(cxx);
        let res = Command::new(cxx)
            .args([
                "-std=c++11",
                "-O2",
                "-Wall",
                "-Wextra",
                "-Werror",
                "-pedantic",
                "-I",
            ])
            .arg(root().join("include"))
            .arg(&src)
            .arg("-o")
            .arg(&exe)
            .output()
            .unwrap();
        assert!(
            res.status.success(),
            "{cxx}: {}",
            String::from_utf8_lossy(&res.stderr)
        );
        let out = Command::new(&exe).output().unwrap();
        assert_eq!(out.stdout, b"2 6\n");
        let elf = ElfFile::open(&exe).unwrap();
        let probes = elf.usdt_probes();
        let kinds = probe(&probes, "cxx", "kinds");
        assert_eq!(
            shapes(kinds),
            [
                (4, true),
                (2, true),
                (4, false),
                (8, false),
                (8, false),
                (1, false),
                (1, false)
            ],
            "{cxx}: {}",
            kinds.args_spec
        );
        let gated = probe(&probes, "cxx", "gated");
        assert_eq!(
            gated.semaphore,
            Some(nm_addr(&exe, "cxx_gated_semaphore")),
            "{cxx}"
        );
        // One probe per template instantiation (int and long).
        let inst: Vec<_> = probes.iter().filter(|p| p.name == "in_template").collect();
        assert_eq!(inst.len(), 2, "{cxx}");
        let mut sizes: Vec<_> = inst.iter().map(|p| shapes(p)[0]).collect();
        sizes.sort_unstable();
        assert_eq!(sizes, [(4, true), (8, true)], "{cxx}");
    }
}
