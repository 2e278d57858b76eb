//! `weft coldpatch BINARY [-o OUT] [--strip]`: turn the `-finstrument-functions` calls
//! of a binary into NOP placeholders and record the probe list in it (see
//! `weft-coldpatch`); `weft coldpatch --list BINARY` prints that list. The file IO
//! around the pure library.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use clap::Args;

#[derive(Args, Debug, Clone)]
pub struct ColdpatchArgs {
    /// A program or shared library built with -finstrument-functions.
    pub binary: PathBuf,
    /// Write the result here instead of replacing BINARY.
    #[arg(short = 'o', value_name = "OUT")]
    pub output: Option<PathBuf>,
    /// Also remove the symbol table (.symtab, .strtab); the probe list keeps the names.
    #[arg(long)]
    pub strip: bool,
    /// Print the probe list of an already coldpatched BINARY instead.
    #[arg(long, conflicts_with_all = ["output", "strip"])]
    pub list: bool,
}

/// Runs the subcommand; the exit status is 0, or an error (exit 1) with nothing
/// written.
pub fn run(a: ColdpatchArgs) -> Result<i32> {
    if a.list {
        return list(&a.binary);
    }
    let input =
        std::fs::read(&a.binary).with_context(|| format!("cannot read {}", a.binary.display()))?;
    let options = weft_coldpatch::Options { strip: a.strip };
    let done = weft_coldpatch::coldpatch(&a.binary, &input, &options)?;
    for s in &done.skipped {
        eprintln!("weft: warning: left as it was: {s}");
    }
    if let Some(why) = &done.debug_info_error {
        eprintln!("weft: warning: no file:line in the probe list: {why}");
    }
    let out = a.output.clone().unwrap_or_else(|| a.binary.clone());
    write_replacing(&out, &done.bytes, &a.binary)?;

    let entries = done
        .probes
        .iter()
        .filter(|p| p.kind == weft_symbols::WeftProbeKind::Entry)
        .count();
    let mut stdout = std::io::stdout().lock();
    write!(
        stdout,
        "{}: {} placeholders ({} entry, {} exit) in {} functions",
        out.display(),
        done.probes.len(),
        entries,
        done.probes.len() - entries,
        done.function_count()
    )?;
    if !done.stripped.is_empty() {
        write!(stdout, "; removed {}", done.stripped.join(", "))?;
    }
    writeln!(stdout)?;
    Ok(0)
}

/// `--list`: one line per placeholder: address, kind, function, `file:line`, and
/// `tail`/`inlined` when they apply.
fn list(binary: &Path) -> Result<i32> {
    let elf = weft_symbols::ElfFile::open(binary)?;
    let probes = elf.weft_probes()?;
    if probes.is_empty() {
        anyhow::bail!(
            "{} has no probe list (it is not coldpatched)",
            binary.display()
        );
    }
    let mut stdout = std::io::stdout().lock();
    for p in probes {
        write!(
            stdout,
            "{:#x} {} {}",
            p.vaddr,
            weft_coldpatch::kind_name(p.kind),
            p.function
        )?;
        if let Some(loc) = &p.location {
            write!(stdout, " {loc}")?;
        }
        if p.tail {
            write!(stdout, " tail")?;
        }
        if p.inlined {
            write!(stdout, " inlined")?;
        }
        writeln!(stdout)?;
    }
    Ok(0)
}

/// Writes `bytes` to `path` through a temporary file in the same directory and a
/// rename, with the permissions of `like`: a reader never sees half a file, and a
/// failure leaves `path` as it was.
pub(crate) fn write_replacing(path: &Path, bytes: &[u8], like: &Path) -> Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = dir.join(format!(".{name}.weft-coldpatch.{}", std::process::id()));
    let result = (|| -> Result<()> {
        std::fs::write(&tmp, bytes).with_context(|| format!("cannot write {}", tmp.display()))?;
        let perms = std::fs::metadata(like)?.permissions();
        std::fs::set_permissions(&tmp, perms)?;
        std::fs::rename(&tmp, path).with_context(|| format!("cannot write {}", path.display()))?;
        Ok(())
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fresh directory under the system temp dir.
    fn scratch(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("weft-coldpatch-cmd-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn gcc(dir: &Path, flags: &[&str]) -> PathBuf {
        let src = dir.join("t.c");
        std::fs::write(&src, "#include <stdio.h>\nint twice(int x) { return 2 * x; }\nint main(void) { printf(\"%d\\n\", twice(21)); return 0; }\n").unwrap();
        let exe = dir.join("t");
        let ok = std::process::Command::new("gcc")
            .arg(&src)
            .args(flags)
            .arg("-o")
            .arg(&exe)
            .status()
            .unwrap();
        assert!(ok.success());
        exe
    }

    #[test]
    fn writes_in_place_or_to_out_and_refuses_bad_input() {
        let dir = scratch("run");
        let exe = gcc(&dir, &["-O2", "-finstrument-functions"]);
        let out = dir.join("out");
        let args = |binary: &Path, output: Option<&Path>, strip| ColdpatchArgs {
            binary: binary.to_path_buf(),
            output: output.map(Path::to_path_buf),
            strip,
            list: false,
        };
        assert_eq!(run(args(&exe, Some(&out), false)).unwrap(), 0);
        let ran = std::process::Command::new(&out).output().unwrap();
        assert_eq!(ran.stdout, b"42\n");
        let mode = |p: &Path| {
            std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(p).unwrap().permissions())
        };
        assert_eq!(mode(&out), mode(&exe));

        // Again: already coldpatched, and the file is left as it was.
        let before = std::fs::read(&out).unwrap();
        let e = run(args(&out, None, false)).unwrap_err();
        assert!(e.to_string().contains("already coldpatched"), "{e}");
        assert_eq!(std::fs::read(&out).unwrap(), before);

        // In place, stripped.
        assert_eq!(run(args(&exe, None, true)).unwrap(), 0);
        let ran = std::process::Command::new(&exe).output().unwrap();
        assert_eq!(ran.stdout, b"42\n");
        assert!(weft_symbols::ElfFile::open(&exe).unwrap().is_stripped());

        // No -finstrument-functions: an error, nothing written.
        let plain = gcc(&dir, &["-O2"]);
        let none = dir.join("none");
        let e = run(args(&plain, Some(&none), false)).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!(
                "no -finstrument-functions calls found in {}; nothing written",
                plain.display()
            )
        );
        assert!(!none.exists());
        let leftovers: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().contains("weft-coldpatch"))
            .collect();
        assert!(leftovers.is_empty());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
