//! `weft memprof`: reads and writes per heap object and per allocation site.
//!
//! The target runs with `libweft_memprof.so` preloaded (`c/memprof.c`): it
//! interposes the allocation functions, keeps the object table and the shadow
//! (address → object), counts accesses from the compiler's hooks (counted mode) or
//! estimates them (sampled mode, `c/sample.h`), and at exit writes a [`dump`] that
//! [`report::Profile`] turns into the report, DHAT's JSON and weft's JSON. A binary
//! built for counted mode links `libweft_memstub.so` (inert hooks) so it runs
//! without weft.

pub mod dump;
pub mod report;

use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};

/// The preloaded runtime.
pub static RUNTIME: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/libweft_memprof.so"));
/// The inert hooks counted-mode binaries link against.
pub static STUB: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/libweft_memstub.so"));
/// The hooks as LLVM bitcode for a clang `-flto` build to inline (empty when
/// weft was built without clang).
pub static HOOKS: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/libweft_memhooks.a"));
pub const RUNTIME_FILE: &str = "libweft_memprof.so";
pub const STUB_FILE: &str = "libweft_memstub.so";
pub const HOOKS_FILE: &str = "libweft_memhooks.a";

/// Where the two libraries are written: `$WEFT_LIB_DIR`, else `weft-lib/` beside
/// the `weft` executable (a stable place: counted-mode binaries keep its path in
/// their run path), else `~/.cache/weft/lib`.
pub fn lib_dir() -> Result<PathBuf> {
    if let Some(d) = std::env::var_os("WEFT_LIB_DIR") {
        return Ok(PathBuf::from(d));
    }
    let exe = std::env::current_exe().context("finding the weft executable")?;
    let beside = exe
        .parent()
        .ok_or_else(|| anyhow!("{} has no directory", exe.display()))?
        .join("weft-lib");
    if std::fs::create_dir_all(&beside).is_ok() && writable(&beside) {
        return Ok(beside);
    }
    let home = std::env::var_os("HOME").ok_or_else(|| anyhow!("no HOME for ~/.cache/weft/lib"))?;
    Ok(PathBuf::from(home).join(".cache/weft/lib"))
}

fn writable(dir: &Path) -> bool {
    let probe = dir.join(".weft-write-test");
    let ok = std::fs::write(&probe, b"").is_ok();
    let _ = std::fs::remove_file(&probe);
    ok
}

/// Writes the libraries into [`lib_dir`] (when their bytes differ) and returns the
/// directory.
pub fn install() -> Result<PathBuf> {
    let dir = lib_dir()?;
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    for (name, bytes) in [
        (RUNTIME_FILE, RUNTIME),
        (STUB_FILE, STUB),
        (HOOKS_FILE, HOOKS),
    ] {
        if bytes.is_empty() {
            continue;
        }
        let path = dir.join(name);
        if std::fs::read(&path).ok().as_deref() == Some(bytes) {
            continue;
        }
        // Write beside and rename: a running program may have the old one mapped.
        let tmp = dir.join(format!(".{name}.{}", std::process::id()));
        std::fs::write(&tmp, bytes).with_context(|| format!("writing {}", tmp.display()))?;
        std::fs::rename(&tmp, &path).with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(dir)
}

/// Which compiler's flags `--cflags` prints.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Compiler {
    Clang,
    Gcc,
}

/// Compile flags for counted mode. clang: SanitizerCoverage's load/store hooks (no
/// sanitizer runtime is linked for them), with `-flto` when weft has the hooks as
/// bitcode ([`HOOKS`]) so the link inlines them. gcc: ThreadSanitizer's
/// instrumentation without its function entry/exit hooks; compile only with it
/// (linking with `-fsanitize=thread` would pull libtsan in).
pub fn cflags(c: Compiler) -> String {
    match c {
        Compiler::Clang => format!(
            "-fsanitize-coverage=func,trace-loads,trace-stores -fno-omit-frame-pointer{}",
            if HOOKS.is_empty() { "" } else { " -flto" }
        ),
        Compiler::Gcc => {
            "-fsanitize=thread --param tsan-instrument-func-entry-exit=0 -fno-omit-frame-pointer"
                .into()
        }
    }
}

/// Link flags: the inert hooks, found through the run path; for clang (with
/// [`HOOKS`]) also `-flto` and the bitcode hooks, which the link inlines.
pub fn ldflags(dir: &Path, c: Compiler) -> String {
    let stub = format!(
        "-L{d} -Wl,-rpath,{d} -Wl,--no-as-needed -lweft_memstub -Wl,--as-needed",
        d = dir.display()
    );
    match c {
        Compiler::Clang if !HOOKS.is_empty() => {
            format!("-flto {} {stub}", dir.join(HOOKS_FILE).display())
        }
        _ => stub,
    }
}

/// The names the access hooks have in a binary built for counted mode.
const HOOK_PREFIXES: &[&str] = &[
    // What the hooks an LTO build inlined call.
    "weft_memprof_count_slow",
    "__sanitizer_cov_load",
    "__sanitizer_cov_store",
    "__tsan_read",
    "__tsan_write",
    "__tsan_unaligned_",
];

/// Whether `path` (an ELF) imports the access hooks.
pub fn has_access_hooks(path: &Path) -> Result<bool> {
    let elf = weft_symbols::ElfFile::open(path).map_err(|e| anyhow!("{e}"))?;
    Ok(elf
        .imports()
        .iter()
        .any(|i| HOOK_PREFIXES.iter().any(|p| i.name.starts_with(p))))
}

/// How the runtime takes an allocation's stack.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stack {
    /// Frame pointers when the program was built with them ([`has_frame_pointers`]),
    /// else `Unwind`.
    Auto,
    /// The frame-pointer chain, each frame pointer checked against the thread's
    /// stack: cheap, and stops early in code without frame pointers.
    FramePointers,
    /// glibc's `backtrace()` (the unwinder, through `.eh_frame`): any code, but a
    /// few microseconds per allocation.
    Unwind,
}

/// Whether most of `path`'s functions set up a frame pointer (`push rbp; mov
/// rbp, rsp`, after an `endbr64` if any): a program built with
/// `-fno-omit-frame-pointer` (as `--cflags` asks) does in every function.
pub fn has_frame_pointers(path: &Path) -> Result<bool> {
    let elf = weft_symbols::ElfFile::open(path).map_err(|e| anyhow!("{e}"))?;
    let (mut with, mut all) = (0usize, 0usize);
    for f in elf.functions() {
        if f.ifunc || f.size < 16 || f.name().starts_with('_') {
            continue;
        }
        let Ok(b) = elf.read_vaddr(f.vaddr, 12) else {
            continue;
        };
        let b = b.strip_prefix(&[0xf3, 0x0f, 0x1e, 0xfa][..]).unwrap_or(b);
        all += 1;
        if b.starts_with(&[0x55, 0x48, 0x89, 0xe5]) {
            with += 1;
        }
    }
    Ok(all > 0 && with * 2 > all)
}

/// A launch's settings.
#[derive(Clone, Debug)]
pub struct Options {
    pub sampled: bool,
    pub depth: u32,
    /// How allocation stacks are taken (`Auto` is decided by [`environment`]'s
    /// caller through [`resolve_stack`]).
    pub stack: Stack,
    pub max_objects: u64,
    /// Sampled mode: sampling period, µs.
    pub period_us: u64,
}

/// Checks that `exe` can be profiled in this mode; the error is one line.
pub fn check(exe: &Path, opts: &Options) -> Result<()> {
    let elf = weft_symbols::ElfFile::open(exe).map_err(|e| anyhow!("{e}"))?;
    if elf.is_static() {
        bail!(
            "{} is statically linked: weft memprof preloads its allocation hooks with the \
             dynamic linker, so it needs a dynamically linked program",
            exe.display()
        );
    }
    if !opts.sampled && !has_access_hooks(exe)? {
        bail!(
            "{}: no access hooks found; rebuild with `weft memprof --cflags` or use --sampled",
            exe.display()
        );
    }
    Ok(())
}

/// `Auto` made concrete for `exe`.
pub fn resolve_stack(exe: &Path, stack: Stack) -> Stack {
    match stack {
        Stack::Auto if has_frame_pointers(exe).unwrap_or(false) => Stack::FramePointers,
        Stack::Auto => Stack::Unwind,
        s => s,
    }
}

/// The environment the launched program needs: the runtime preloaded, and where to
/// write its dump. Only the launched process (whose parent is `parent`) profiles;
/// its children, which inherit the variables, stay inert.
pub fn environment(dir: &Path, out: &Path, parent: u32, opts: &Options) -> Vec<(String, String)> {
    let runtime = dir.join(RUNTIME_FILE).display().to_string();
    let preload = match std::env::var("LD_PRELOAD") {
        Ok(p) if !p.is_empty() => format!("{runtime}:{p}"),
        _ => runtime,
    };
    vec![
        ("LD_PRELOAD".into(), preload),
        ("WEFT_MEMPROF_OUT".into(), out.display().to_string()),
        ("WEFT_MEMPROF_PARENT".into(), parent.to_string()),
        ("WEFT_MEMPROF_DEPTH".into(), opts.depth.to_string()),
        (
            "WEFT_MEMPROF_MAX_OBJECTS".into(),
            opts.max_objects.to_string(),
        ),
        (
            "WEFT_MEMPROF_MODE".into(),
            if opts.sampled { "sampled" } else { "counted" }.into(),
        ),
        ("WEFT_MEMPROF_PERIOD_US".into(), opts.period_us.to_string()),
        (
            "WEFT_MEMPROF_STACK".into(),
            if opts.stack == Stack::Unwind {
                "unwind"
            } else {
                "fp"
            }
            .into(),
        ),
    ]
}

/// Spearman's rank correlation of two equally long score lists (average ranks
/// for ties).
pub fn spearman(a: &[f64], b: &[f64]) -> f64 {
    fn ranks(v: &[f64]) -> Vec<f64> {
        let mut idx: Vec<usize> = (0..v.len()).collect();
        idx.sort_by(|&i, &j| v[i].partial_cmp(&v[j]).unwrap_or(std::cmp::Ordering::Equal));
        let mut r = vec![0.0; v.len()];
        let mut i = 0;
        while i < idx.len() {
            let mut j = i;
            while j + 1 < idx.len() && v[idx[j + 1]] == v[idx[i]] {
                j += 1;
            }
            let avg = (i + j) as f64 / 2.0 + 1.0;
            for &k in &idx[i..=j] {
                r[k] = avg;
            }
            i = j + 1;
        }
        r
    }
    let n = a.len();
    if n < 2 || b.len() != n {
        return f64::NAN;
    }
    let (ra, rb) = (ranks(a), ranks(b));
    let mean = (n as f64 + 1.0) / 2.0;
    let (mut num, mut da, mut db) = (0.0, 0.0, 0.0);
    for i in 0..n {
        num += (ra[i] - mean) * (rb[i] - mean);
        da += (ra[i] - mean).powi(2);
        db += (rb[i] - mean).powi(2);
    }
    num / (da * db).sqrt()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spearman_of_identical_and_reversed_rankings() {
        let a = [1.0, 2.0, 3.0, 4.0];
        assert!((spearman(&a, &a) - 1.0).abs() < 1e-9);
        let b = [4.0, 3.0, 2.0, 1.0];
        assert!((spearman(&a, &b) + 1.0).abs() < 1e-9);
    }

    #[test]
    fn dump_rejects_bad_magic() {
        assert!(dump::parse(b"nonsense").is_err());
    }
}
