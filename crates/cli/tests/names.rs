//! C++ and Rust names: matched in probes (quoted, unquoted with `::`, wildcards),
//! demangled in `probe`, `func`, `usym`, `ustack` and `weft -l` (overloads with
//! their parameter lists), with exact counts per overload.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::*;

const T: Duration = Duration::from_secs(120);

fn cxx() -> PathBuf {
    build("names.cc", Variant::O2_PIE, &[])
}

#[test]
fn cpp_probes_by_demangled_name_count_each_overload() {
    let bin = cxx();
    let b = bin.display();
    let prog = format!(
        "uprobe:{b}:\"ns::Class::method\" {{ @method = count(); }} \
         uprobe:{b}:\"ns::over(int)\" {{ @over_int = count(); }} \
         uprobe:{b}:ns::over* {{ @over[probe] = count(); @sym[usym(reg(\"ip\"))] = count(); }} \
         uprobe:{b}:cpp:ns::twice* {{ @twice[func] = count(); @stack[ustack(1)] = count(); }}"
    );
    let o = weft(&["-e", &prog, "-c", &b.to_string()], T);
    let out = ok(&o);
    assert_eq!(map_value(&out, "@method"), Some(3), "{out}");
    assert_eq!(map_value(&out, "@over_int"), Some(5), "{out}");
    let probe = |sig: &str| format!("uprobe:{b}:ns::over({sig})");
    let over = keyed(&out, "@over");
    assert_eq!(over.get(&probe("int")), Some(&5), "{out}");
    assert_eq!(over.get(&probe("double")), Some(&7), "{out}");
    assert_eq!(over.get(&probe("char const*, int")), Some(&1), "{out}");
    let sym = keyed(&out, "@sym");
    assert_eq!(sym.get("ns::over(int)"), Some(&5), "{out}");
    assert_eq!(sym.get("ns::over(double)"), Some(&7), "{out}");
    assert_eq!(sym.get("ns::over(char const*, int)"), Some(&1), "{out}");
    let twice = keyed(&out, "@twice");
    assert_eq!(twice.get("int ns::twice<int>(int)"), Some(&2), "{out}");
    assert_eq!(twice.get("long ns::twice<long>(long)"), Some(&1), "{out}");
    assert!(
        out.contains("@stack[\n    int ns::twice<int>(int)+0\n]: 2\n"),
        "{out}"
    );
}

#[test]
fn list_shows_overloads_demangled_with_their_parameters() {
    let bin = cxx();
    let b = bin.display();
    let o = weft(&["-l", &format!("uprobe:{b}:ns::over*")], T);
    let out = ok(&o);
    let path = bin.canonicalize().unwrap();
    let p = path.display();
    assert_eq!(
        out,
        format!(
            "uprobe:{p}:\"ns::over(char const*, int)\"\nuprobe:{p}:\"ns::over(double)\"\nuprobe:{p}:\"ns::over(int)\"\n"
        )
    );
    let o = weft(
        &["-l", &format!("uprobe:{b}:\"ns::Class::method(int)\"")],
        T,
    );
    assert_eq!(ok(&o), format!("uprobe:{p}:\"ns::Class::method(int)\"\n"));
}

/// `rsapp.rs` built with rustc, with the given symbol mangling (the legacy one
/// checked by its `17h<hash>E` ending).
fn rust(mangling: &str) -> PathBuf {
    let src = repo_root().join("tests/targets/rsapp.rs");
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("targets/rust");
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join(format!("rsapp-{mangling}"));
    let tmp = dir.join(format!(".rsapp-{mangling}.{}", std::process::id()));
    let mut cmd = Command::new("rustc");
    cmd.args(["-O", "-g", "-C", "force-frame-pointers=yes"]);
    // Legacy is stable rustc's default (naming it needs -Z unstable-options).
    if mangling != "legacy" {
        cmd.arg(format!("-Csymbol-mangling-version={mangling}"));
    }
    let o = cmd
        .arg("-o")
        .arg(&tmp)
        .arg(&src)
        .output()
        .expect("running rustc");
    assert!(o.status.success(), "rustc failed:\n{}", text(&o.stderr));
    std::fs::rename(&tmp, &out).unwrap();
    let nm = Command::new("nm").arg(&out).output().unwrap();
    let step = text(&nm.stdout)
        .lines()
        .find(|l| l.contains("6worker4step"))
        .map(str::to_string)
        .unwrap_or_default();
    let want = if mangling == "legacy" {
        " _ZN5rsapp"
    } else {
        " _R"
    };
    assert!(step.contains(want), "{mangling}: {step}");
    out
}

#[test]
fn rust_paths_match_and_print_demangled_legacy_and_v0() {
    for mangling in ["legacy", "v0"] {
        let bin = rust(mangling);
        let b = bin.display();
        let prog = format!(
            "uprobe:{b}:rsapp::worker::step {{ @n = count(); @f[func] = count(); \
             @s[usym(reg(\"ip\"))] = count(); }} \
             uprobe:{b}:\"rsapp::worker::st*\" {{ @w = count(); }}"
        );
        let o = weft(&["-e", &prog, "-c", &b.to_string()], T);
        let out = ok(&o);
        assert_eq!(map_value(&out, "@n"), Some(6), "{mangling}: {out}");
        assert_eq!(map_value(&out, "@w"), Some(6), "{mangling}: {out}");
        assert_eq!(
            keyed(&out, "@f").get("rsapp::worker::step"),
            Some(&6),
            "{mangling}: {out}"
        );
        assert_eq!(
            keyed(&out, "@s").get("rsapp::worker::step"),
            Some(&6),
            "{mangling}: {out}"
        );
        let o = weft(&["-l", &format!("uprobe:{b}:rsapp::worker::*")], T);
        let l = ok(&o);
        assert!(l.contains(":\"rsapp::worker::step\"\n"), "{mangling}: {l}");
    }
}
