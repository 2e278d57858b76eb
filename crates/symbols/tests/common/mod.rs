//! Helpers for tests that build real binaries with gcc and compare with binutils.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

/// Writes each `(file name, source)` into `dir`, compiles them with gcc and `args`
/// into `dir/out`, and returns the output path.
pub fn cc(dir: &Path, out: &str, sources: &[(&str, &str)], args: &[&str]) -> PathBuf {
    let mut cmd = Command::new("gcc");
    for (name, src) in sources {
        let p = dir.join(name);
        std::fs::write(&p, src).unwrap();
        cmd.arg(p);
    }
    let out = dir.join(out);
    cmd.args(args).arg("-o").arg(&out);
    let res = cmd.output().expect("gcc runs");
    assert!(
        res.status.success(),
        "gcc failed: {}",
        String::from_utf8_lossy(&res.stderr)
    );
    out
}

pub fn run(prog: &str, args: &[&str]) -> String {
    let res = Command::new(prog)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{prog}: {e}"));
    assert!(
        res.status.success(),
        "{prog} {args:?}: {}",
        String::from_utf8_lossy(&res.stderr)
    );
    String::from_utf8(res.stdout).unwrap()
}

/// One `nm -S` line: name (version suffix removed), type letter, address, size
/// (`None` when nm prints none).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NmSym {
    pub name: String,
    pub kind: char,
    pub addr: u64,
    pub size: Option<u64>,
}

/// `nm -S --defined-only [extra] path`.
pub fn nm(path: &Path, extra: &[&str]) -> Vec<NmSym> {
    let mut args = vec!["-S", "--defined-only"];
    args.extend_from_slice(extra);
    let p = path.to_str().unwrap();
    args.push(p);
    run("nm", &args)
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let (addr, size, kind, name) = match f.as_slice() {
                [a, s, k, n] => (a, Some(u64::from_str_radix(s, 16).unwrap()), k, n),
                [a, k, n] => (a, None, k, n),
                _ => return None,
            };
            let name = name.split('@').next().unwrap().to_string();
            Some(NmSym {
                name,
                kind: kind.chars().next().unwrap(),
                addr: u64::from_str_radix(addr, 16).unwrap(),
                size,
            })
        })
        .collect()
}

pub fn nm_addr(path: &Path, name: &str) -> u64 {
    nm(path, &[])
        .into_iter()
        .find(|s| s.name == name)
        .unwrap_or_else(|| panic!("{name} in nm"))
        .addr
}

/// Like [`cc`], with `dir` as gcc's working directory: where `-gsplit-dwarf` writes
/// its `.dwo` files (and the `DW_AT_comp_dir` they are found under).
pub fn cc_in(dir: &Path, out: &str, sources: &[(&str, &str)], args: &[&str]) -> PathBuf {
    let mut cmd = Command::new("gcc");
    cmd.current_dir(dir);
    for (name, src) in sources {
        std::fs::write(dir.join(name), src).unwrap();
        cmd.arg(name);
    }
    cmd.args(args).arg("-o").arg(out);
    let res = cmd.output().expect("gcc runs");
    assert!(
        res.status.success(),
        "gcc failed: {}",
        String::from_utf8_lossy(&res.stderr)
    );
    dir.join(out)
}

/// Runs a tool with `dir` as its working directory; panics if it fails or takes
/// more than a minute.
pub fn run_in(dir: &Path, prog: &str, args: &[&str]) {
    let res = Command::new("timeout")
        .current_dir(dir)
        .arg("60")
        .arg(prog)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{prog}: {e}"));
    assert!(
        res.status.success(),
        "{prog} {args:?}: {}",
        String::from_utf8_lossy(&res.stderr)
    );
}
