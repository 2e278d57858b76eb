//! DWARF wherever gcc and binutils put it: split DWARF (`.dwo` files, `.dwp`
//! packages), compressed sections, separate debug files found by `.gnu_debuglink`
//! and by build-id. Each form must give exactly the parameters plain `-g` gives.

mod common;

use std::path::{Path, PathBuf};

use common::{cc_in, run_in};
use weft_ir::{CField, CStruct, Type};
use weft_symbols::{DebugInfo, DebugSearch, ElfFile, Param};

const SRC: &str = r#"struct inner { char tag; short code; };
struct rec { int id; long total; struct inner in; const char *name; };

__attribute__((noinline)) int visit(struct rec *r, unsigned n, char c) {
    return r->id + (int)n + c + r->in.code;
}

int main(void) {
    struct rec r = { 1, 2, { 'x', 3 }, "r" };
    return visit(&r, 4, 'y') == 0;
}
"#;

fn int(bits: u8, signed: bool) -> Type {
    Type::Int { bits, signed }
}

fn field(name: &str, offset: u32, ty: Type) -> CField {
    CField {
        name: name.into(),
        offset,
        ty,
        bits: None,
    }
}

/// `visit`'s parameters, as every form must describe them.
fn visit_params() -> Vec<Param> {
    let inner = Type::CStruct(CStruct {
        name: "inner".into(),
        size: 4,
        fields: vec![
            field("tag", 0, int(8, true)),
            field("code", 2, int(16, true)),
        ]
        .into(),
    });
    let rec = Type::CStruct(CStruct {
        name: "rec".into(),
        size: 32,
        fields: vec![
            field("id", 0, int(32, true)),
            field("total", 8, int(64, true)),
            field("in", 16, inner),
            field("name", 24, Type::Ptr(Box::new(int(8, true)))),
        ]
        .into(),
    });
    vec![
        Param {
            name: "r".into(),
            ty: Type::Ptr(Box::new(rec)),
            c_type: "struct rec*".into(),
        },
        Param {
            name: "n".into(),
            ty: int(32, false),
            c_type: "unsigned int".into(),
        },
        Param {
            name: "c".into(),
            ty: int(8, true),
            c_type: "char".into(),
        },
    ]
}

/// No debug-file directory: only what is next to the file counts.
fn nowhere() -> DebugSearch {
    DebugSearch { dirs: vec![] }
}

fn debug_info(exe: &Path, search: &DebugSearch) -> Option<DebugInfo> {
    ElfFile::open(exe).unwrap().debug_info_in(search).unwrap()
}

/// The parameters and the source line of `visit` (its opening line, 4, at -O0).
fn check_visit(exe: &Path, search: &DebugSearch, what: &str) {
    let elf = ElfFile::open(exe).unwrap();
    let dbg = elf
        .debug_info_in(search)
        .unwrap()
        .unwrap_or_else(|| panic!("{what}: no DWARF"));
    assert_eq!(dbg.missing_dwo(), &[], "{what}");
    assert_eq!(dbg.function_params("visit"), Some(visit_params()), "{what}");
    assert_eq!(dbg.function_params("main"), Some(vec![]), "{what}");
    let vaddr = elf
        .functions()
        .iter()
        .find(|f| f.name() == "visit")
        .unwrap()
        .vaddr;
    let (file, line) = dbg.line_for(vaddr).unwrap();
    assert!(file.ends_with("t.c"), "{what}: {file}");
    assert_eq!(line, 4, "{what}");
}

fn build(dir: &Path, flags: &[&str]) -> PathBuf {
    let mut args = vec!["-O0"];
    args.extend_from_slice(flags);
    cc_in(dir, "app", &[("t.c", SRC)], &args)
}

#[test]
fn plain_dwarf_is_the_reference() {
    let dir = tempfile::tempdir().unwrap();
    let exe = build(dir.path(), &["-g"]);
    check_visit(&exe, &nowhere(), "-g");
    assert_eq!(debug_info(&exe, &nowhere()).unwrap().path(), exe);
}

#[test]
fn split_dwarf_reads_the_dwo_beside_the_objects() {
    for version in ["-gdwarf-5", "-gdwarf-4"] {
        let dir = tempfile::tempdir().unwrap();
        let exe = build(dir.path(), &["-g", version, "-gsplit-dwarf"]);
        let dwo = dir.path().join("app-t.dwo");
        assert!(dwo.is_file(), "{version}: gcc wrote {dwo:?}");
        check_visit(&exe, &nowhere(), version);

        // Without its .dwo the skeleton says what is missing and describes nothing.
        std::fs::remove_file(&dwo).unwrap();
        let dbg = debug_info(&exe, &nowhere()).unwrap();
        let missing: Vec<&str> = dbg.missing_dwo().iter().map(|m| m.name.as_str()).collect();
        assert_eq!(missing, ["app-t.dwo"], "{version}");
        assert_eq!(dbg.function_params("visit"), None, "{version}");
    }
}

#[test]
fn split_dwarf_dwo_found_beside_a_moved_binary() {
    // The compilation directory is gone: the .dwo is looked for beside the binary.
    let dir = tempfile::tempdir().unwrap();
    let build_dir = dir.path().join("build");
    let moved = dir.path().join("moved");
    std::fs::create_dir_all(&build_dir).unwrap();
    std::fs::create_dir_all(&moved).unwrap();
    build(&build_dir, &["-g", "-gsplit-dwarf"]);
    for f in ["app", "app-t.dwo"] {
        std::fs::rename(build_dir.join(f), moved.join(f)).unwrap();
    }
    std::fs::remove_dir_all(&build_dir).unwrap();
    check_visit(&moved.join("app"), &nowhere(), "moved");
}

#[test]
fn split_dwarf_from_a_dwp_package_gnu_dwp() {
    // GNU dwp packages DWARF 4 (it crashes on gcc 12's DWARF 5).
    let dir = tempfile::tempdir().unwrap();
    let exe = build(dir.path(), &["-g", "-gdwarf-4", "-gsplit-dwarf"]);
    run_in(dir.path(), "dwp", &["-e", "app", "-o", "app.dwp"]);
    std::fs::remove_file(dir.path().join("app-t.dwo")).unwrap();
    check_visit(&exe, &nowhere(), "dwp");
}

#[test]
fn split_dwarf_from_a_dwp_package_llvm_dwp() {
    // llvm-dwp 14 loops for ever on most of gcc 12's DWARF 5 units (in its
    // abbreviation reader: gcc's DW_FORM_implicit_const); this small one it packages.
    let src = "struct s { int a; long b; };\n\
               int f(struct s *p, int n) { return p->a + n; }\n\
               int main(void) { struct s x = { 1, 2 }; return f(&x, 3); }\n";
    let dir = tempfile::tempdir().unwrap();
    let exe = cc_in(
        dir.path(),
        "app",
        &[("t.c", src)],
        &["-O0", "-g", "-gdwarf-5", "-gsplit-dwarf"],
    );
    run_in(dir.path(), "llvm-dwp", &["-e", "app", "-o", "app.dwp"]);
    std::fs::remove_file(dir.path().join("app-t.dwo")).unwrap();
    let dbg = debug_info(&exe, &nowhere()).unwrap();
    assert_eq!(dbg.missing_dwo(), &[]);
    let s = Type::CStruct(CStruct {
        name: "s".into(),
        size: 16,
        fields: vec![field("a", 0, int(32, true)), field("b", 8, int(64, true))].into(),
    });
    assert_eq!(
        dbg.function_params("f"),
        Some(vec![
            Param {
                name: "p".into(),
                ty: Type::Ptr(Box::new(s)),
                c_type: "struct s*".into(),
            },
            Param {
                name: "n".into(),
                ty: int(32, true),
                c_type: "int".into(),
            },
        ])
    );
}

/// `ch_type` of a compressed section's `Elf64_Chdr` (1 zlib, 2 zstd).
fn compression(exe: &Path, name: &str) -> Option<u32> {
    let elf = ElfFile::open(exe).unwrap();
    let s = elf.section(name)?;
    (s.flags & 0x800 != 0).then(|| {
        let d = elf.section_data(s);
        u32::from_le_bytes(d[..4].try_into().unwrap())
    })
}

#[test]
fn compressed_debug_sections() {
    let forms: [(&[&str], u32); 2] = [
        (&["-g", "-gz=zlib"], 1),
        // gcc 12 has no -gz=zstd; the linker compresses with zstd.
        (&["-g", "-Wl,--compress-debug-sections=zstd"], 2),
    ];
    for (flags, kind) in forms {
        let dir = tempfile::tempdir().unwrap();
        let exe = build(dir.path(), flags);
        assert_eq!(compression(&exe, ".debug_info"), Some(kind), "{flags:?}");
        assert_eq!(compression(&exe, ".debug_abbrev"), Some(kind), "{flags:?}");
        check_visit(&exe, &nowhere(), &format!("{flags:?}"));
    }
}

/// Splits `app`'s DWARF into `app.debug` (`objcopy --only-keep-debug`) and strips it
/// from `app`, adding a `.gnu_debuglink` to `app.debug` when `link`.
fn separate(dir: &Path, link: bool) -> PathBuf {
    let exe = build(dir, &["-g", "-Wl,--build-id"]);
    run_in(dir, "objcopy", &["--only-keep-debug", "app", "app.debug"]);
    if link {
        run_in(
            dir,
            "objcopy",
            &["--strip-debug", "--add-gnu-debuglink=app.debug", "app"],
        );
    } else {
        run_in(dir, "objcopy", &["--strip-debug", "app"]);
    }
    assert!(!ElfFile::open(&exe).unwrap().has_debug_info());
    exe
}

#[test]
fn debuglink_beside_the_binary_and_in_dot_debug() {
    let dir = tempfile::tempdir().unwrap();
    let exe = separate(dir.path(), true);
    let debug = dir.path().join("app.debug");
    check_visit(&exe, &nowhere(), "beside");
    assert_eq!(debug_info(&exe, &nowhere()).unwrap().path(), debug);

    std::fs::create_dir(dir.path().join(".debug")).unwrap();
    let dot = dir.path().join(".debug/app.debug");
    std::fs::rename(&debug, &dot).unwrap();
    check_visit(&exe, &nowhere(), ".debug/");
    assert_eq!(debug_info(&exe, &nowhere()).unwrap().path(), dot);
}

#[test]
fn debuglink_under_a_debug_file_directory() {
    let dir = tempfile::tempdir().unwrap();
    let exe = separate(dir.path(), true);
    // DIR/<the binary's directory>/NAME, as /usr/lib/debug/usr/bin/app.debug.
    let root = tempfile::tempdir().unwrap();
    let canonical = dir.path().canonicalize().unwrap();
    let under = root.path().join(canonical.strip_prefix("/").unwrap());
    std::fs::create_dir_all(&under).unwrap();
    std::fs::rename(dir.path().join("app.debug"), under.join("app.debug")).unwrap();
    assert!(debug_info(&exe, &nowhere()).is_none());
    let search = DebugSearch {
        dirs: vec![root.path().to_path_buf()],
    };
    check_visit(&exe, &search, "debug-file directory");
    assert_eq!(
        debug_info(&exe, &search).unwrap().path(),
        under.join("app.debug")
    );
}

#[test]
fn debuglink_with_a_wrong_crc_is_not_used() {
    let dir = tempfile::tempdir().unwrap();
    let exe = separate(dir.path(), true);
    // Another build's debug file under the same name (different CRC).
    let other = tempfile::tempdir().unwrap();
    cc_in(
        other.path(),
        "app",
        &[("t.c", &SRC.replace("4, 'y'", "5, 'z'"))],
        &["-O0", "-g"],
    );
    run_in(
        other.path(),
        "objcopy",
        &["--only-keep-debug", "app", "app.debug"],
    );
    std::fs::copy(other.path().join("app.debug"), dir.path().join("app.debug")).unwrap();
    assert!(debug_info(&exe, &nowhere()).is_none());
}

#[test]
fn build_id_under_a_debug_file_directory() {
    let dir = tempfile::tempdir().unwrap();
    let exe = separate(dir.path(), false);
    let id = ElfFile::open(&exe).unwrap().build_id_hex().unwrap();
    let root = tempfile::tempdir().unwrap();
    let in_ids = root.path().join(".build-id").join(&id[..2]);
    std::fs::create_dir_all(&in_ids).unwrap();
    let debug = in_ids.join(format!("{}.debug", &id[2..]));
    std::fs::rename(dir.path().join("app.debug"), &debug).unwrap();
    assert!(debug_info(&exe, &nowhere()).is_none());
    let search = DebugSearch {
        dirs: vec![root.path().to_path_buf()],
    };
    check_visit(&exe, &search, "build-id");
    assert_eq!(debug_info(&exe, &search).unwrap().path(), debug);
}

const INLINED: &str = r#"__attribute__((noinline)) int leaf(int x) { __asm__ volatile(""); return x * 3; }
static inline __attribute__((always_inline)) int middle(int x) {
    return leaf(x) + 1;
}
int outer(int x) {
    return middle(x) * 2;
}
int main(int argc, char **argv) { (void)argv; return outer(argc); }
"#;

/// The address of `outer`'s `call leaf` (the call `middle` inlined into it).
fn call_to_leaf(elf: &ElfFile) -> u64 {
    let f = |name: &str| {
        elf.functions()
            .iter()
            .find(|f| f.name() == name)
            .unwrap()
            .clone()
    };
    let (outer, leaf) = (f("outer"), f("leaf"));
    let code = elf.read_vaddr(outer.vaddr, outer.size).unwrap();
    (0..code.len().saturating_sub(4))
        .find(|&i| {
            let rel = i32::from_le_bytes(code[i + 1..i + 5].try_into().unwrap());
            code[i] == 0xe8
                && (outer.vaddr + i as u64 + 5).wrapping_add(rel as i64 as u64) == leaf.vaddr
        })
        .map(|i| outer.vaddr + i as u64)
        .expect("outer calls leaf")
}

#[test]
fn inlined_frames_at_an_address() {
    // Not DWARF 5 split units: addr2line 0.24's find_frames fails on gcc 12's
    // (UnexpectedEof); DebugInfo::frames is then empty.
    for flags in [
        &["-g"][..],
        &["-g", "-gdwarf-4", "-gsplit-dwarf"],
        &["-g", "-gz=zlib"],
    ] {
        let dir = tempfile::tempdir().unwrap();
        let mut args = vec!["-O2"];
        args.extend_from_slice(flags);
        let exe = cc_in(dir.path(), "app", &[("t.c", INLINED)], &args);
        let elf = ElfFile::open(&exe).unwrap();
        let dbg = elf.debug_info_in(&nowhere()).unwrap().unwrap();
        let frames: Vec<(String, String, u32, bool)> = dbg
            .frames(call_to_leaf(&elf))
            .into_iter()
            .map(|f| {
                let file = f.file.unwrap();
                let base = Path::new(&file)
                    .file_name()
                    .unwrap()
                    .to_str()
                    .unwrap()
                    .to_string();
                (f.function.unwrap(), base, f.line.unwrap(), f.inlined)
            })
            .collect();
        // middle's call of leaf is line 3; outer's call of middle line 6.
        assert_eq!(
            frames,
            [
                ("middle".to_string(), "t.c".to_string(), 3, true),
                ("outer".to_string(), "t.c".to_string(), 6, false),
            ],
            "{flags:?}"
        );
        assert_eq!(dbg.frames(0), vec![], "{flags:?}");
    }
}
