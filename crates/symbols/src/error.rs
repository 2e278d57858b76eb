//! The one error type of this crate. Every message is a single line meant to be shown
//! to the user verbatim (the CLI adds no context of its own to these).

use std::fmt;
use std::path::PathBuf;

/// Everything that can go wrong between a probe spec and a resolved site.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A file could not be opened or read.
    #[error("cannot read {}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    #[error("`{}` is not an ELF file", path.display())]
    NotElf { path: PathBuf },

    #[error("`{}` is a 32-bit ELF file; weft supports only 64-bit x86-64 programs", path.display())]
    Not64Bit { path: PathBuf },

    #[error("`{}` is a big-endian ELF file; weft supports only x86-64 programs", path.display())]
    BigEndian { path: PathBuf },

    #[error("`{}` is an ELF file for {machine}, not x86-64", path.display())]
    WrongMachine { path: PathBuf, machine: String },

    #[error("`{}` is {what}, not an executable or a shared library", path.display())]
    WrongType { path: PathBuf, what: &'static str },

    /// Truncated files, headers or tables pointing outside the file, and the like.
    #[error("`{}` is a malformed ELF file: {what}", path.display())]
    Malformed { path: PathBuf, what: String },

    /// [`crate::ElfFile::read_vaddr`] was asked for bytes the file does not hold.
    #[error("{len} bytes at address {vaddr:#x} are not in the file {}", path.display())]
    NoFileBytes { path: PathBuf, vaddr: u64, len: u64 },

    /// A function name or pattern matched nothing.
    #[error("{}{}", not_found_head(pattern, path), Suggestions(suggestions))]
    FunctionNotFound {
        pattern: String,
        path: PathBuf,
        suggestions: Vec<String>,
    },

    /// A USDT probe spec matched nothing.
    #[error("USDT probe `{probe}` not found in {}{}", path.display(), Suggestions(suggestions))]
    UsdtNotFound {
        probe: String,
        path: PathBuf,
        suggestions: Vec<String>,
    },

    /// The `BIN` of `uprobe:BIN:FUNC` names nothing we could find.
    #[error("cannot find `{name}` ({searched}){}", Suggestions(suggestions))]
    TargetNotFound {
        name: String,
        /// Where we looked, e.g. "not loaded in process 42".
        searched: String,
        suggestions: Vec<String>,
    },

    /// `/proc/PID/maps` could not be read (no such process, or no permission).
    #[error("cannot read the memory map of process {pid}: {source}")]
    ProcMaps {
        pid: u32,
        #[source]
        source: std::io::Error,
    },

    /// A line of a maps file we could not understand.
    #[error("malformed line {line} in a /proc/PID/maps file: `{text}`")]
    MapsSyntax { line: usize, text: String },

    /// A USDT argument spec (`-4@%edi`) we could not parse.
    #[error("cannot parse USDT argument `{spec}`: {why}")]
    UsdtArg { spec: String, why: &'static str },

    /// `BIN@FILE:LINE` on a file without DWARF line tables.
    #[error("{} has no DWARF line table to find {file}:{line} in (build it with -g, or give its separate debug file with --debuginfo=DIR)", path.display())]
    NoLineTable {
        path: PathBuf,
        file: String,
        line: u32,
    },

    /// `BIN@FILE:LINE` whose FILE no line table names.
    #[error("no source file `{file}` in the line tables of {}{}", path.display(), Suggestions(suggestions))]
    SourceFileNotFound {
        path: PathBuf,
        file: String,
        suggestions: Vec<String>,
    },

    /// `BIN@FILE:LINE` whose line has no code.
    #[error("{file}:{line} has no code in {}{}", path.display(), Nearest(*before, *after))]
    NoCodeAtLine {
        path: PathBuf,
        /// The file as the line table names it.
        file: String,
        line: u32,
        before: Option<u32>,
        after: Option<u32>,
    },

    /// `BIN@FILE:LINE` at an address no function symbol covers.
    #[error("{file}:{line} is at {vaddr:#x} in {}, which no function symbol covers", path.display())]
    LineOutsideFunctions {
        path: PathBuf,
        file: String,
        line: u32,
        vaddr: u64,
    },

    /// DWARF present but unreadable.
    #[error("cannot read the debug info of {}: {why}", path.display())]
    Dwarf { path: PathBuf, why: String },
}

fn not_found_head(pattern: &str, path: &std::path::Path) -> String {
    if crate::glob::has_wildcards(pattern) {
        format!("no function matches `{pattern}` in {}", path.display())
    } else {
        format!("function `{pattern}` not found in {}", path.display())
    }
}

/// Formats "; did you mean `a`, `b` or `c`?" (nothing for an empty list).
struct Suggestions<'a>(&'a [String]);

impl fmt::Display for Suggestions<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names = self.0;
        if names.is_empty() {
            return Ok(());
        }
        write!(f, "; did you mean ")?;
        for (i, n) in names.iter().enumerate() {
            if i > 0 {
                write!(f, "{}", if i + 1 == names.len() { " or " } else { ", " })?;
            }
            write!(f, "`{n}`")?;
        }
        write!(f, "?")
    }
}

/// "; the nearest lines with code are 20 and 24" (or the one there is).
struct Nearest(Option<u32>, Option<u32>);

impl fmt::Display for Nearest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.0, self.1) {
            (Some(a), Some(b)) => write!(f, "; the nearest lines with code are {a} and {b}"),
            (Some(l), None) | (None, Some(l)) => write!(f, "; the nearest line with code is {l}"),
            (None, None) => write!(f, "; no line of it has code"),
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suggestion_lists_read_as_english() {
        let e = |s: &[&str]| Error::FunctionNotFound {
            pattern: "pars".into(),
            path: "/path/app".into(),
            suggestions: s.iter().map(|s| s.to_string()).collect(),
        };
        assert_eq!(e(&[]).to_string(), "function `pars` not found in /path/app");
        assert_eq!(
            e(&["parse"]).to_string(),
            "function `pars` not found in /path/app; did you mean `parse`?"
        );
        assert_eq!(
            e(&["parse", "part"]).to_string(),
            "function `pars` not found in /path/app; did you mean `parse` or `part`?"
        );
        assert_eq!(
            e(&["parse", "part", "bars"]).to_string(),
            "function `pars` not found in /path/app; did you mean `parse`, `part` or `bars`?"
        );
    }

    #[test]
    fn wildcard_miss_says_no_function_matches() {
        let e = Error::FunctionNotFound {
            pattern: "zz*".into(),
            path: "/bin/app".into(),
            suggestions: vec![],
        };
        assert_eq!(e.to_string(), "no function matches `zz*` in /bin/app");
    }
}
