//! `weft list` and `weft -l`: the probes a pattern names, one per line, as
//! `bpftrace -l` prints them (`uprobe:/abs/path:func`, `usdt:/abs/path:provider:name`).
//!
//! A pattern is a probe (`uprobe:BIN:FUNC`, `uretprobe:…`, `usdt:BIN:[PROVIDER:]NAME`,
//! the short names `u`, `ur`, `U` too; wildcards anywhere; `BIN` a path or a library
//! name such as `libc`, found as the probes find it) or a bare function pattern over
//! the binary given or the process's modules. With `-v` each function is followed by
//! its parameters and their types, from DWARF.
//!
//! Kernel tracepoints (`tracepoint:CATEGORY:NAME`, `t:`; wildcards anywhere) come
//! from tracefs, as `bpftrace -l` lists them; `-v` adds each one's fields as its
//! `format` file declares them. Without a pattern, a binary or a process, `weft -l`
//! lists every tracepoint, and a bare pattern matches tracepoint names (as
//! `bpftrace -l` does: they are the probes there are without a binary).

use std::path::PathBuf;

use anyhow::{anyhow, bail, Context, Result};
use weft_symbols::glob::{has_wildcards, Glob};
use weft_symbols::{ElfFile, LibrarySearch, ProcMaps, TargetContext};

use crate::args::ListArgs;
use crate::events::TracefsEvents;
use weft_kernel::tracefs::Tracefs;

/// The kinds of probe a pattern lists.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    Uprobe,
    Uretprobe,
    Usdt,
    /// Kernel tracepoints: `name` is `CATEGORY:NAME`.
    Tracepoint,
    /// A bare pattern: functions (as `uprobe`) and USDT probes.
    Any,
    /// `interval` or `profile` timers: `name` is the unit pattern.
    Timer(&'static str),
}

/// The units a timer probe takes, in the order bpftrace lists them.
const TIMER_UNITS: [&str; 4] = ["hz", "us", "ms", "s"];

/// A parsed pattern: which probes, in which binary (a spec as in a probe: path,
/// library name or wildcard), and the pattern their names must match (the
/// function, or `provider:name`).
#[derive(Debug, PartialEq, Eq)]
struct Pattern {
    kind: Kind,
    binary: Option<String>,
    name: String,
}

fn parse(pattern: &str) -> Result<Pattern> {
    let Some((provider, rest)) = pattern.split_once(':') else {
        return Ok(Pattern {
            kind: Kind::Any,
            binary: None,
            name: pattern.to_string(),
        });
    };
    let kind = match provider {
        "uprobe" | "u" => Kind::Uprobe,
        "uretprobe" | "ur" => Kind::Uretprobe,
        "usdt" | "U" => Kind::Usdt,
        "kprobe" | "k" | "kretprobe" | "kr" | "kfunc" | "kretfunc" | "fentry" | "fexit"
        | "rawtracepoint" | "rt" => {
            let full = match provider {
                "k" => "kprobe",
                "kr" => "kretprobe",
                "rt" => "rawtracepoint",
                p => p,
            };
            let kernel = weft_lang::EventResolver::kernel(&TracefsEvents::default());
            let why = weft_lang::unsupported::provider(full, Some(&kernel)).unwrap_or_default();
            bail!("{why}")
        }
        "tracepoint" | "t" => {
            let (category, name) = rest.split_once(':').unwrap_or((rest, "*"));
            let or_all = |s: &str| {
                if s.is_empty() {
                    "*".to_string()
                } else {
                    s.to_string()
                }
            };
            return Ok(Pattern {
                kind: Kind::Tracepoint,
                binary: None,
                name: format!("{}:{}", or_all(category), or_all(name)),
            });
        }
        "interval" | "i" | "profile" | "p" => {
            let full = if provider.starts_with('i') {
                "interval"
            } else {
                "profile"
            };
            let unit = rest.split(':').next().unwrap_or("");
            return Ok(Pattern {
                kind: Kind::Timer(full),
                binary: None,
                name: if unit.is_empty() { "*" } else { unit }.to_string(),
            });
        }
        "software" | "s" | "hardware" | "h" => {
            bail!(
                "{pattern}: weft has no perf software or hardware events; it lists uprobe, \
                 uretprobe, usdt and tracepoint probes"
            )
        }
        // A wildcard probe type (`*:./app:*`): every kind weft lists in BIN.
        _ if provider.contains(['*', '?']) && rest.contains(':') => Kind::Any,
        _ if !pattern.contains(['/', '.']) && !provider.contains(['*', '?']) => bail!(
            "{pattern}: unknown probe type `{provider}` (weft lists uprobe, uretprobe, usdt, tracepoint, interval and profile)"
        ),
        // `./app:func`-like: a binary and a function, no probe type.
        _ => {
            return Ok(Pattern {
                kind: Kind::Any,
                binary: Some(provider.to_string()),
                name: rest.to_string(),
            })
        }
    };
    // BIN:FUNC (or BIN:PROVIDER:NAME); a lone FUNC applies to the binary or process
    // given beside the pattern. `::` is a C++ scope, not a separator.
    let split = rest
        .match_indices(':')
        .map(|(i, _)| i)
        .find(|&i| !rest[i + 1..].starts_with(':') && (i == 0 || &rest[i - 1..i] != ":"));
    let (binary, name) = match split {
        Some(i) => (Some(rest[..i].to_string()), rest[i + 1..].to_string()),
        None => (None, rest.to_string()),
    };
    let name = if kind == Kind::Usdt && !name.contains(':') {
        format!("*:{name}")
    } else {
        name
    };
    Ok(Pattern {
        kind,
        binary: binary.filter(|b| !b.is_empty()),
        name,
    })
}

/// A file to list: the path printed, the path read.
struct File {
    shown: PathBuf,
    open: PathBuf,
}

/// `-l -e PROGRAM` (or `-l FILE.bt`): each attach point of the program, listed as
/// its pattern would be (`uprobe:`, `uretprobe:` and `usdt:` ones expanded over
/// their binary or the process `pid`); other kinds as written.
pub fn program(text: &str, file: &str, pid: Option<i32>, verbose: bool) -> Result<i32> {
    let (ast, diags) = weft_lang::parse(text);
    if diags.iter().any(weft_lang::Diagnostic::is_error) {
        eprint!("{}", weft_lang::render(&diags, text, file));
        bail!("{file}: the program does not parse");
    }
    for item in &ast.items {
        let weft_lang::ast::Item::Probe(p) = item else {
            continue;
        };
        for a in &p.attach {
            let user = matches!(
                a.provider.as_str(),
                "uprobe" | "u" | "uretprobe" | "ur" | "usdt" | "U"
            );
            if user {
                run(ListArgs {
                    args: vec![a.raw.clone()],
                    binary: None,
                    pid,
                    verbose,
                })?;
            } else if let Some(unit) = timer_unit(&a.raw) {
                // A timer is listed as its type and unit, as bpftrace lists it.
                println!("{unit}");
            } else {
                println!("{}", a.raw);
            }
        }
    }
    Ok(0)
}

/// `interval:ms:100` → `interval:ms:` (and `i:`/`p:`/`profile:` alike).
fn timer_unit(raw: &str) -> Option<String> {
    let (provider, rest) = raw.split_once(':')?;
    let provider = match provider {
        "interval" | "i" => "interval",
        "profile" | "p" => "profile",
        _ => return None,
    };
    let unit = rest.split(':').next()?;
    TIMER_UNITS
        .contains(&unit)
        .then(|| format!("{provider}:{unit}:"))
}

pub fn run(l: ListArgs) -> Result<i32> {
    let (pattern, binary) = l.split();
    let text = pattern.clone().unwrap_or_else(|| "*".to_string());
    let pat = parse(&text)?;
    let without_binary = pat.binary.is_none() && binary.is_none() && l.pid.is_none();
    match pat.kind {
        // `interval:*`: the units a timer takes, as bpftrace lists them.
        Kind::Timer(provider) => {
            let unit = Glob::new(&pat.name);
            let units: Vec<&str> = TIMER_UNITS
                .into_iter()
                .filter(|u| unit.matches(u))
                .collect();
            if units.is_empty() {
                bail!("no probe matches {text}");
            }
            for u in units {
                println!("{provider}:{u}:");
            }
            return Ok(0);
        }
        Kind::Tracepoint => {
            if !tracepoints(&pat.name, l.verbose)? {
                bail!("no probe matches {text}");
            }
            return Ok(0);
        }
        // A bare pattern that names no tracepoint is a function's: it needs a binary.
        Kind::Any
            if without_binary
                && matches!(tracepoints(&format!("*:{}", pat.name), l.verbose), Ok(true)) =>
        {
            return Ok(0)
        }
        _ => {}
    }
    let files = files(&pat, binary.as_deref(), l.pid, &text)?;
    // A C++ name may be quoted, as in a probe (`"ns::over(int)"`).
    let unquoted = pat.name.replace('"', "");
    let name_glob = Glob::new(if unquoted.is_empty() { "*" } else { &unquoted });
    let mut lines: Vec<(String, Option<(PathBuf, String)>)> = Vec::new();
    for f in &files {
        let elf = match ElfFile::open(&f.open) {
            Ok(e) => e,
            // A process's module that cannot be read (vdso, deleted without rights)
            // has nothing to list; a file named outright does.
            Err(e) if l.pid.is_some() => {
                if l.verbose {
                    eprintln!("weft: {}: {e}", f.shown.display());
                }
                continue;
            }
            Err(e) => bail!("{}: {e}", f.shown.display()),
        };
        let path = f.shown.display();
        if matches!(pat.kind, Kind::Uprobe | Kind::Uretprobe | Kind::Any) {
            let kind = if pat.kind == Kind::Uretprobe {
                "uretprobe"
            } else {
                "uprobe"
            };
            for n in elf.functions().iter().flat_map(|f| &f.names) {
                if n.forms().any(|form| name_glob.matches(form)) {
                    // C++ and Rust names demangled (an overload with its parameter
                    // list), quoted as a probe takes them.
                    let shown = match &n.demangled {
                        Some(d) => format!("\"{d}\""),
                        None => n.raw.clone(),
                    };
                    lines.push((
                        format!("{kind}:{path}:{shown}"),
                        Some((f.open.clone(), n.raw.clone())),
                    ));
                }
            }
        }
        if matches!(pat.kind, Kind::Usdt | Kind::Any) {
            for p in elf.usdt_probes() {
                let full = format!("{}:{}", p.provider, p.name);
                let bare_match = pat.kind == Kind::Any && name_glob.matches(&p.name);
                if name_glob.matches(&full) || bare_match {
                    lines.push((format!("usdt:{path}:{full}"), None));
                }
            }
        }
    }
    lines.sort_by(|a, b| a.0.cmp(&b.0));
    lines.dedup_by(|a, b| a.0 == b.0);
    if lines.is_empty() {
        bail!("no probe matches {text}");
    }
    let mut out = std::io::stdout().lock();
    // The DWARF of the file listed last (loaded once per file: it may be a separate
    // debug file or many `.dwo` files).
    let mut dwarf: Option<(PathBuf, Option<weft_symbols::DebugInfo>)> = None;
    for (line, func) in lines {
        use std::io::Write;
        writeln!(out, "{line}")?;
        let (true, Some((open, name))) = (l.verbose, func) else {
            continue;
        };
        if dwarf.as_ref().is_none_or(|(p, _)| *p != open) {
            let info = ElfFile::open(&open)
                .ok()
                .and_then(|e| e.debug_info().ok().flatten());
            dwarf = Some((open.clone(), info));
        }
        let params = dwarf
            .as_ref()
            .and_then(|(_, d)| d.as_ref())
            .and_then(|d| d.function_params(&name));
        for p in params.unwrap_or_default() {
            writeln!(out, "    {} {}", p.c_type, p.name)?;
        }
    }
    Ok(0)
}

/// Prints the tracepoints `CATEGORY:NAME` (wildcards) matches, with their fields
/// (`-v`), as `bpftrace -l`/`-lv` prints them. False when none matches.
fn tracepoints(pattern: &str, verbose: bool) -> Result<bool> {
    use std::io::Write;
    let (category, name) = pattern.split_once(':').unwrap_or((pattern, "*"));
    let fs = Tracefs::find()?;
    let found = fs.matching(category, name)?;
    if found.is_empty() {
        return Ok(false);
    }
    let mut out = std::io::stdout().lock();
    for tp in found {
        writeln!(out, "tracepoint:{tp}")?;
        if !verbose {
            continue;
        }
        match fs.format(&tp) {
            Ok(f) => {
                for field in f.fields.iter().filter(|f| !f.is_common()) {
                    writeln!(out, "    {}", field.decl)?;
                }
            }
            // One unreadable format does not stop the list.
            Err(e) => eprintln!("weft: {e}"),
        }
    }
    Ok(true)
}

/// The files a pattern lists: the binary it names (resolved as a probe's is: in the
/// process with `-p`, else as a path or a library), the binary given beside it, or
/// every module of the process.
fn files(pat: &Pattern, beside: Option<&str>, pid: Option<i32>, text: &str) -> Result<Vec<File>> {
    let search = LibrarySearch::system();
    let spec = pat.binary.as_deref().or(beside);
    match (pid, spec) {
        (Some(pid), spec) => {
            let maps = ProcMaps::read(pid as u32).map_err(|e| anyhow!("{e}"))?;
            let modules = maps.modules();
            if let Some(name) = weft_engine::target::kernel_thread(pid) {
                bail!("process {pid} ({name}) is a kernel thread: it has no user-space probes");
            }
            let all = |keep: &dyn Fn(&weft_symbols::Module) -> bool| -> Vec<File> {
                modules
                    .iter()
                    .filter(|m| keep(m))
                    .map(|m| File {
                        shown: m.path.clone(),
                        open: m.open_path.clone(),
                    })
                    .collect()
            };
            match spec {
                None | Some("*") => Ok(all(&|_| true)),
                Some(s) if has_wildcards(s) => {
                    let g = Glob::new(s);
                    Ok(all(&|m| {
                        g.matches(&m.path.to_string_lossy())
                            || m.path
                                .file_name()
                                .is_some_and(|n| g.matches(&n.to_string_lossy()))
                    }))
                }
                Some(s) => {
                    let ctx = TargetContext {
                        process: Some((pid as u32, &modules)),
                        executable: None,
                        search: &search,
                    };
                    let t = weft_symbols::resolve_target(s, &ctx).map_err(|e| anyhow!("{e}"))?;
                    Ok(vec![match t.module {
                        Some(m) => File {
                            shown: m.path,
                            open: m.open_path,
                        },
                        None => File {
                            shown: t.path.clone(),
                            open: t.path,
                        },
                    }])
                }
            }
        }
        // `./dir/app*`: the files of the directory whose names match (as bpftrace
        // expands a path's wildcards), shown under the directory as written.
        (None, Some(s))
            if has_wildcards(s)
                && s.contains('/')
                && !has_wildcards(s.rsplit_once('/').map_or("", |(d, _)| d)) =>
        {
            let (dir, glob) = s.rsplit_once('/').unwrap_or((".", s));
            let g = Glob::new(glob);
            let read = std::fs::read_dir(if dir.is_empty() { "/" } else { dir })
                .with_context(|| format!("{text}: reading {dir}"))?;
            let mut found: Vec<File> = read
                .filter_map(|e| e.ok())
                .filter(|e| g.matches(&e.file_name().to_string_lossy()))
                .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
                .filter(|e| ElfFile::open(e.path()).is_ok())
                .map(|e| File {
                    shown: PathBuf::from(format!("{dir}/{}", e.file_name().to_string_lossy())),
                    open: e.path(),
                })
                .collect();
            found.sort_by(|a, b| a.shown.cmp(&b.shown));
            if found.is_empty() {
                bail!("{text}: no executable or library matches {s}");
            }
            Ok(found)
        }
        (None, Some(s)) if has_wildcards(s) => bail!(
            "{text}: a wildcard binary lists the modules of a process: give -p PID \
             (or name the binary)"
        ),
        (None, Some(s)) => {
            // A library named in a pattern is looked for beside the binary given too.
            let exe = beside
                .filter(|b| Some(*b) != pat.binary.as_deref())
                .and_then(|b| ElfFile::open(b).ok());
            let ctx = TargetContext {
                process: None,
                executable: exe.as_ref(),
                search: &search,
            };
            let t = weft_symbols::resolve_target(s, &ctx).map_err(|e| anyhow!("{e}"))?;
            // A path is shown as written (`uprobe:./app:main`, as bpftrace lists it);
            // a library name as the file it resolved to.
            let shown = if s.contains('/') {
                PathBuf::from(s)
            } else {
                t.path.clone()
            };
            Ok(vec![File {
                shown,
                open: t.path,
            }])
        }
        (None, None) => bail!(
            "{text}: list needs a binary: name it in the pattern (uprobe:BIN:FUNC), give it \
             as an argument or with --binary, or give -p PID"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(kind: Kind, binary: Option<&str>, name: &str) -> Pattern {
        Pattern {
            kind,
            binary: binary.map(str::to_string),
            name: name.to_string(),
        }
    }

    #[test]
    fn timers_list_their_units() {
        assert_eq!(
            parse("interval:*").unwrap(),
            p(Kind::Timer("interval"), None, "*")
        );
        assert_eq!(
            parse("p:m*").unwrap(),
            p(Kind::Timer("profile"), None, "m*")
        );
        assert_eq!(parse("profile").unwrap(), p(Kind::Any, None, "profile"));
        assert_eq!(
            timer_unit("interval:ms:1000").as_deref(),
            Some("interval:ms:")
        );
        assert_eq!(timer_unit("p:hz:99").as_deref(), Some("profile:hz:"));
        assert_eq!(timer_unit("uprobe:./a:f"), None);
    }

    #[test]
    fn patterns() {
        assert_eq!(parse("mall*").unwrap(), p(Kind::Any, None, "mall*"));
        assert_eq!(
            parse("uprobe:./app:*").unwrap(),
            p(Kind::Uprobe, Some("./app"), "*")
        );
        assert_eq!(
            parse("u:libc:mall*").unwrap(),
            p(Kind::Uprobe, Some("libc"), "mall*")
        );
        assert_eq!(
            parse("ur:/bin/x:ns::f*").unwrap(),
            p(Kind::Uretprobe, Some("/bin/x"), "ns::f*")
        );
        assert_eq!(
            parse("usdt:./sdt:*").unwrap(),
            p(Kind::Usdt, Some("./sdt"), "*:*")
        );
        assert_eq!(
            parse("U:./sdt:app:tick").unwrap(),
            p(Kind::Usdt, Some("./sdt"), "app:tick")
        );
        assert_eq!(parse("uprobe:main").unwrap(), p(Kind::Uprobe, None, "main"));
        assert_eq!(
            parse("./app:main").unwrap(),
            p(Kind::Any, Some("./app"), "main")
        );
        assert!(parse("kprobe:vfs_read")
            .unwrap_err()
            .to_string()
            .starts_with("kprobe: this kernel"));
        assert_eq!(
            parse("t:syscalls:sys_enter_open*").unwrap(),
            p(Kind::Tracepoint, None, "syscalls:sys_enter_open*")
        );
        assert_eq!(
            parse("tracepoint:*").unwrap(),
            p(Kind::Tracepoint, None, "*:*")
        );
        assert!(parse("bogus:x:y")
            .unwrap_err()
            .to_string()
            .contains("unknown probe type `bogus`"));
    }
}
