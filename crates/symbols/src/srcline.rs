//! Source lines to addresses: where `uprobe:BIN@FILE:LINE` attaches.
//!
//! The DWARF line tables of the file (for split DWARF, the skeleton units' tables,
//! which stay in the executable) are read row by row with gimli. A row belongs to
//! the probe when its file is `FILE` (the whole path as the table names it, or a
//! suffix of it that starts at a `/`: `app.c`, `src/app.c`) and its line is `LINE`.
//!
//! **Which addresses.** Each place where the line's code *starts*: the first
//! `is_stmt` row of every run of consecutive rows of the line in a sequence. Code of
//! one line split in two (a loop's condition placed after its body, each inlined
//! copy of a function) is two runs, so two sites; the rows of one run after its
//! first are inside the same stretch of the line's code and are not sites of their
//! own (a probe there would fire twice for one execution of the line). A function's
//! opening line starts at the function's first instruction (its `low_pc`), so a
//! probe on that line and one on the function fire at the same address, as
//! upstream's do; no prologue is skipped.

use std::collections::{BTreeSet, HashMap};

use gimli::Reader;

use crate::debugfile::R;
use crate::dwarf::DebugInfo;

/// Why `FILE:LINE` gives no address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LineMiss {
    /// No line table names a file `FILE` (suggestions: close file names).
    NoFile { suggestions: Vec<String> },
    /// The file is there but no statement of it is on `LINE`: the nearest lines
    /// before and after that have code.
    NoCode {
        file: String,
        before: Option<u32>,
        after: Option<u32>,
    },
}

impl DebugInfo {
    /// The file virtual addresses where code of `file:line` starts (sorted, see the
    /// module's notes), or why there is none.
    pub fn line_sites(&self, file: &str, line: u32) -> Result<Vec<u64>, LineMiss> {
        let want = file.strip_prefix("./").unwrap_or(file);
        let dwarf = &*self.main;
        let mut addrs = BTreeSet::new();
        let mut code_lines = BTreeSet::new();
        let mut matched_file: Option<String> = None;
        let mut names = BTreeSet::new();
        let mut headers = dwarf.units();
        while let Ok(Some(header)) = headers.next() {
            let Ok(unit) = dwarf.unit(header) else {
                continue;
            };
            let Some(program) = unit.line_program.clone() else {
                continue;
            };
            let mut matches: HashMap<u64, bool> = HashMap::new();
            let mut rows = program.rows();
            let mut in_run = false;
            while let Ok(Some((header, row))) = rows.next_row() {
                if row.end_sequence() {
                    in_run = false;
                    continue;
                }
                let index = row.file_index();
                let is_file = *matches.entry(index).or_insert_with(|| {
                    let Some(path) = file_path(dwarf, &unit, header, index) else {
                        return false;
                    };
                    let hit = path_matches(&path, want);
                    if hit && matched_file.is_none() {
                        matched_file = Some(path.clone());
                    }
                    if let Some(base) = path.rsplit('/').next() {
                        names.insert(base.to_string());
                    }
                    hit
                });
                let row_line = row.line().map(|l| l.get());
                if !is_file {
                    in_run = false;
                    continue;
                }
                // Rows of discarded code (a removed COMDAT, gc'd sections) keep
                // address 0 or a linker's tombstone.
                let live = row.address() != 0 && row.address() < u64::MAX - 1;
                if row.is_stmt() && live {
                    if let Some(l) = row_line.and_then(|l| u32::try_from(l).ok()) {
                        code_lines.insert(l);
                    }
                }
                if row_line != Some(u64::from(line)) {
                    in_run = false;
                } else if row.is_stmt() && !in_run && live {
                    addrs.insert(row.address());
                    in_run = true;
                }
            }
        }
        if !addrs.is_empty() {
            return Ok(addrs.into_iter().collect());
        }
        let Some(file) = matched_file else {
            return Err(LineMiss::NoFile {
                suggestions: crate::glob::suggest(
                    want.rsplit('/').next().unwrap_or(want),
                    names.iter().map(String::as_str),
                ),
            });
        };
        Err(LineMiss::NoCode {
            file,
            before: code_lines.range(..line).next_back().copied(),
            after: code_lines.range(line..).next().copied(),
        })
    }
}

/// The path a line table gives for its file `index`: its directory joined to its
/// name, under the unit's compilation directory when still relative.
fn file_path(
    dwarf: &gimli::Dwarf<R>,
    unit: &gimli::Unit<R>,
    header: &gimli::LineProgramHeader<R>,
    index: u64,
) -> Option<String> {
    let text = |v: gimli::AttributeValue<R>| -> Option<String> {
        let s = dwarf.attr_string(unit, v).ok()?;
        Some(String::from_utf8_lossy(&s.to_slice().ok()?).into_owned())
    };
    let entry = header.file(index)?;
    let name = text(entry.path_name())?;
    if name.starts_with('/') {
        return Some(name);
    }
    let mut path = match entry.directory(header).and_then(text) {
        Some(dir) if !dir.is_empty() => format!("{}/{name}", dir.trim_end_matches('/')),
        _ => name,
    };
    if !path.starts_with('/') {
        if let Some(comp) = unit
            .comp_dir
            .as_ref()
            .and_then(|d| d.to_slice().ok())
            .map(|d| String::from_utf8_lossy(&d).into_owned())
        {
            path = format!("{}/{path}", comp.trim_end_matches('/'));
        }
    }
    Some(path)
}

/// Whether `path` (from a line table) is the file `want` names: the same path, or
/// one ending in `/want`.
pub(crate) fn path_matches(path: &str, want: &str) -> bool {
    let path = path.replace("/./", "/");
    path == want
        || path
            .strip_suffix(want)
            .is_some_and(|head| head.ends_with('/'))
}

#[cfg(test)]
mod tests {
    use super::path_matches;

    #[test]
    fn a_file_is_matched_by_its_name_or_a_path_suffix() {
        assert!(path_matches("/src/app/main.c", "main.c"));
        assert!(path_matches("/src/app/main.c", "app/main.c"));
        assert!(path_matches("/src/app/main.c", "/src/app/main.c"));
        assert!(path_matches("/src/app/./main.c", "app/main.c"));
        assert!(!path_matches("/src/app/domain.c", "main.c"));
        assert!(!path_matches("/src/app/main.c", "pp/main.c"));
    }
}
