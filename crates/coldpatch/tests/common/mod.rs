//! Building the prepared test programs with gcc/clang, running them, and reading
//! their disassembly with objdump.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The repository root.
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap()
}

/// `tests/targets/prepared_calls.c`.
pub fn prepared_calls() -> PathBuf {
    root().join("tests/targets/prepared_calls.c")
}

/// Compiles `sources` with `compiler` and `args` (plus `-I include`) into `dir/out`.
pub fn build(compiler: &str, dir: &Path, out: &str, sources: &[&Path], args: &[&str]) -> PathBuf {
    let out = dir.join(out);
    let res = Command::new(compiler)
        .arg("-I")
        .arg(root().join("include"))
        .args(sources)
        .args(args)
        .arg("-o")
        .arg(&out)
        .output()
        .unwrap_or_else(|e| panic!("{compiler}: {e}"));
    assert!(
        res.status.success(),
        "{compiler} {args:?} failed: {}",
        String::from_utf8_lossy(&res.stderr)
    );
    out
}

/// Writes `src` to `dir/name` and returns its path.
pub fn source(dir: &Path, name: &str, src: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, src).unwrap();
    p
}

/// Runs a program; its exit status and stdout.
pub fn run(prog: &Path, env: &[(&str, &str)]) -> (i32, String) {
    let res = Command::new(prog)
        .envs(env.iter().copied())
        .output()
        .unwrap_or_else(|e| panic!("{}: {e}", prog.display()));
    (
        res.status.code().unwrap_or(-1),
        String::from_utf8(res.stdout).unwrap(),
    )
}

/// Runs a tool and returns its stdout (it must succeed).
pub fn tool(prog: &str, args: &[&str]) -> String {
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

/// One instruction of `objdump -d -w`: its bytes and its text (symbolic operands
/// included, e.g. `call 1050 <__cyg_profile_func_enter@plt>`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Line {
    pub section: String,
    pub bytes: Vec<u8>,
    pub text: String,
}

/// `objdump -d -w` of every executable section, by address.
pub fn disassemble(path: &Path) -> BTreeMap<u64, Line> {
    let text = tool("objdump", &["-d", "-w", path.to_str().unwrap()]);
    let mut out = BTreeMap::new();
    let mut section = String::new();
    for l in text.lines() {
        if let Some(name) = l.strip_prefix("Disassembly of section ") {
            section = name.trim_end_matches(':').to_string();
            continue;
        }
        let mut parts = l.splitn(3, '\t');
        let (Some(addr), Some(bytes)) = (parts.next(), parts.next()) else {
            continue;
        };
        let Some(addr) = addr.trim().strip_suffix(':') else {
            continue;
        };
        let Ok(addr) = u64::from_str_radix(addr, 16) else {
            continue;
        };
        let bytes: Vec<u8> = bytes
            .split_whitespace()
            .filter_map(|b| u8::from_str_radix(b, 16).ok())
            .collect();
        let text = parts
            .next()
            .unwrap_or("")
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ");
        out.insert(
            addr,
            Line {
                section: section.clone(),
                bytes,
                text,
            },
        );
    }
    out
}

/// Section names in file order (`objdump -h`).
pub fn sections(path: &Path) -> Vec<String> {
    tool("readelf", &["-S", "-W", path.to_str().unwrap()])
        .lines()
        .filter_map(|l| {
            let l = l.trim_start();
            let rest = l.strip_prefix('[')?;
            let (_, after) = rest.split_once(']')?;
            let name = after.split_whitespace().next()?;
            Some(name.to_string())
        })
        .filter(|n| n != "Nr")
        .collect()
}

/// Symbols defined in the file: name → address (`nm`).
pub fn symbols(path: &Path) -> BTreeMap<String, u64> {
    tool("nm", &["--defined-only", path.to_str().unwrap()])
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            match f.as_slice() {
                [a, _, n] => Some((n.to_string(), u64::from_str_radix(a, 16).ok()?)),
                _ => None,
            }
        })
        .collect()
}
