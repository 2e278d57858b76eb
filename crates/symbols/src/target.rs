//! The `BIN` of `uprobe:BIN:FUNC`: a path, or a library name (`libc`, `libc.so.6`,
//! `libpthread`).
//!
//! A name without `/` matches a file name when it is equal to it, or is followed in it
//! by `.` and a digit or `so` (`libc` → `libc.so.6`, `libc.so` → `libc.so.6`), or by
//! `-` and a digit (`libc` → `libc-2.36.so`). So `libc` never matches `libcrypt.so.1`.
//!
//! With a process, only its mapped modules count (advice runs only in mapped code).
//! Without one, a name is looked for, in order: in the executable's `DT_NEEDED`
//! (located through `/etc/ld.so.cache`, then the standard directories), as a file in
//! the current directory, in `/etc/ld.so.cache`, in the standard directories, and
//! finally as a program in `$PATH`.

use std::path::{Path, PathBuf};

use crate::elf::ElfFile;
use crate::error::{Error, Result};
use crate::glob::suggest;
use crate::maps::Module;

/// Directories searched for libraries when `/etc/ld.so.cache` does not name them.
pub const STANDARD_LIBRARY_DIRS: [&str; 4] = [
    "/lib/x86_64-linux-gnu",
    "/usr/lib/x86_64-linux-gnu",
    "/lib64",
    "/usr/lib",
];

/// Where libraries are found without a process: ld.so.cache entries and directories.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LibrarySearch {
    /// `(file name, path)` from the cache, in cache order (x86-64 entries only).
    pub cache: Vec<(String, PathBuf)>,
    pub dirs: Vec<PathBuf>,
}

impl LibrarySearch {
    /// `/etc/ld.so.cache` (if readable) and [`STANDARD_LIBRARY_DIRS`].
    pub fn system() -> LibrarySearch {
        let cache = std::fs::read("/etc/ld.so.cache")
            .map(|b| parse_ld_so_cache(&b))
            .unwrap_or_default();
        LibrarySearch {
            cache,
            dirs: STANDARD_LIBRARY_DIRS.iter().map(PathBuf::from).collect(),
        }
    }

    /// The path of a library by exact file name (`libc.so.6`).
    pub fn locate(&self, file_name: &str) -> Option<PathBuf> {
        if let Some((_, p)) = self
            .cache
            .iter()
            .find(|(n, p)| n == file_name && p.is_file())
        {
            return Some(p.clone());
        }
        self.dirs
            .iter()
            .map(|d| d.join(file_name))
            .find(|p| p.is_file())
    }

    /// Every cached or on-disk x86-64 ELF library whose name matches `spec` (see
    /// module docs), best first: cache entries before directory entries, each by
    /// exact name, then shorter names, then search order. (Directory entries such
    /// as `libm.so` may be linker scripts; those are skipped.)
    pub fn matching(&self, spec: &str) -> Vec<PathBuf> {
        let mut cached: Vec<&(String, PathBuf)> = self
            .cache
            .iter()
            .filter(|(n, _)| library_name_matches(spec, n))
            .collect();
        cached.sort_by_key(|(n, _)| (n != spec, n.len()));
        let mut found: Vec<PathBuf> = cached.into_iter().map(|(_, p)| p.clone()).collect();
        for dir in &self.dirs {
            let Ok(entries) = std::fs::read_dir(dir) else {
                continue;
            };
            let mut names: Vec<String> = entries
                .filter_map(|e| e.ok()?.file_name().into_string().ok())
                .filter(|n| library_name_matches(spec, n))
                .collect();
            names.sort_by(|a, b| (a != spec, a.len(), a).cmp(&(b != spec, b.len(), b)));
            found.extend(names.into_iter().map(|n| dir.join(n)));
        }
        let mut out: Vec<PathBuf> = Vec::new();
        for p in found {
            if !out.contains(&p) && crate::elf::read_segments(&p).is_ok() {
                out.push(p);
            }
        }
        out
    }
}

/// Does the library name `spec` name the file `file_name`? (See the module docs.)
pub fn library_name_matches(spec: &str, file_name: &str) -> bool {
    let Some(rest) = file_name.strip_prefix(spec) else {
        return false;
    };
    let mut chars = rest.chars();
    match chars.next() {
        None => true,
        Some('.') => {
            rest[1..].starts_with("so") || chars.next().is_some_and(|c| c.is_ascii_digit())
        }
        Some('-') => chars.next().is_some_and(|c| c.is_ascii_digit()),
        Some(_) => false,
    }
}

/// The x86-64 entries of an `/etc/ld.so.cache` file (glibc's "new" format, alone or
/// after the old one): `(file name, path)`. Malformed input yields what could be read.
pub fn parse_ld_so_cache(data: &[u8]) -> Vec<(String, PathBuf)> {
    const OLD_MAGIC: &[u8] = b"ld.so-1.7.0";
    const NEW_MAGIC: &[u8] = b"glibc-ld.so.cache1.1";
    const FLAG_ELF_LIBC6: i32 = 0x0003;
    const FLAG_X8664_LIB64: i32 = 0x0300;
    let u32_at = |i: usize| -> Option<u32> {
        Some(u32::from_le_bytes(data.get(i..i + 4)?.try_into().ok()?))
    };
    let mut start = 0usize;
    if data.starts_with(OLD_MAGIC) {
        let Some(n) = u32_at(12) else {
            return Vec::new();
        };
        // Old header (16 bytes) and 12-byte entries, then the new cache aligned to 8.
        let end = 16usize.saturating_add((n as usize).saturating_mul(12));
        start = end.div_ceil(8).saturating_mul(8);
    }
    let Some(header) = data.get(start..) else {
        return Vec::new();
    };
    if !header.starts_with(NEW_MAGIC) {
        return Vec::new();
    }
    let Some(nlibs) = u32_at(start + 20) else {
        return Vec::new();
    };
    let string_at = |off: u32| -> Option<String> {
        let rest = header.get(off as usize..)?;
        let end = rest.iter().position(|&b| b == 0)?;
        Some(String::from_utf8_lossy(&rest[..end]).into_owned())
    };
    let mut out = Vec::new();
    for i in 0..nlibs as usize {
        let e = start + 48 + i * 24;
        let (Some(flags), Some(key), Some(value)) = (u32_at(e), u32_at(e + 4), u32_at(e + 8))
        else {
            break;
        };
        let flags = flags as i32;
        if flags & 0xff != FLAG_ELF_LIBC6 || flags & 0xff00 != FLAG_X8664_LIB64 {
            continue;
        }
        if let (Some(name), Some(path)) = (string_at(key), string_at(value)) {
            out.push((name, PathBuf::from(path)));
        }
    }
    out
}

/// What a target name is resolved against.
#[derive(Clone, Copy, Debug)]
pub struct TargetContext<'a> {
    /// A process's modules (with its pid, for messages).
    pub process: Option<(u32, &'a [Module])>,
    /// The executable whose `DT_NEEDED` names libraries (when there is no process).
    pub executable: Option<&'a ElfFile>,
    pub search: &'a LibrarySearch,
}

/// A resolved target: the file, and its module when a process was given.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    pub path: PathBuf,
    pub module: Option<Module>,
}

/// Resolves the `BIN` of a probe spec (see the module docs).
pub fn resolve_target(spec: &str, ctx: &TargetContext<'_>) -> Result<Target> {
    if let Some((pid, modules)) = ctx.process {
        return resolve_in_process(spec, pid, modules);
    }
    if spec.contains('/') {
        let path = std::fs::canonicalize(spec).map_err(|source| Error::Io {
            path: spec.into(),
            source,
        })?;
        return Ok(Target { path, module: None });
    }
    let found = |path: PathBuf| Ok(Target { path, module: None });
    if let Some(exe) = ctx.executable {
        for needed in exe
            .needed()
            .iter()
            .filter(|n| library_name_matches(spec, n))
        {
            if let Some(p) = ctx.search.locate(needed) {
                return found(p);
            }
        }
    }
    if Path::new(spec).is_file() {
        if let Ok(p) = std::fs::canonicalize(spec) {
            return found(p);
        }
    }
    if let Some(p) = ctx.search.matching(spec).into_iter().next() {
        return found(p);
    }
    if let Some(p) = find_in_path(spec) {
        return found(p);
    }
    let mut candidates: Vec<String> = ctx
        .executable
        .map(|e| e.needed().to_vec())
        .unwrap_or_default();
    candidates.extend(ctx.search.cache.iter().map(|(n, _)| n.clone()));
    let searched = match ctx.executable {
        Some(exe) => format!(
            "not needed by {}, not a file, not in ld.so.cache, the library directories or $PATH",
            exe.path().display()
        ),
        None => "not a file, not in ld.so.cache, the library directories or $PATH".to_string(),
    };
    Err(Error::TargetNotFound {
        name: spec.to_string(),
        searched,
        suggestions: suggest_libraries(spec, &candidates),
    })
}

fn resolve_in_process(spec: &str, pid: u32, modules: &[Module]) -> Result<Target> {
    let hit = |m: &Module| {
        Ok(Target {
            path: m.path.clone(),
            module: Some(m.clone()),
        })
    };
    if spec.contains('/') {
        let canonical = std::fs::canonicalize(spec).ok();
        if let Some(m) = modules
            .iter()
            .find(|m| m.path == Path::new(spec) || Some(&m.path) == canonical.as_ref())
        {
            return hit(m);
        }
    } else {
        if let Some(m) = modules.iter().find(|m| m.file_name() == spec) {
            return hit(m);
        }
        if let Some(m) = modules
            .iter()
            .find(|m| library_name_matches(spec, m.file_name()))
        {
            return hit(m);
        }
    }
    let names: Vec<String> = modules.iter().map(|m| m.file_name().to_string()).collect();
    let wanted = Path::new(spec)
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or(spec);
    Err(Error::TargetNotFound {
        name: spec.to_string(),
        searched: format!("not mapped in process {pid}"),
        suggestions: suggest_libraries(wanted, &names),
    })
}

/// Close library names: by the whole file name, or by its stem (`libc` of
/// `libc.so.6`).
fn suggest_libraries(wanted: &str, names: &[String]) -> Vec<String> {
    let stem = |n: &str| -> String { n.split(".so").next().unwrap_or(n).to_string() };
    let mut out = suggest(wanted, names.iter().map(String::as_str));
    let stems: Vec<String> = names.iter().map(|n| stem(n)).collect();
    for s in suggest(&stem(wanted), stems.iter().map(String::as_str)) {
        for full in names.iter().filter(|n| stem(n) == s) {
            if !out.contains(full) {
                out.push(full.clone());
            }
        }
    }
    out.truncate(3);
    out
}

fn find_in_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
        .and_then(|p| std::fs::canonicalize(p).ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn library_names() {
        let yes = [
            ("libc", "libc.so.6"),
            ("libc", "libc-2.36.so"),
            ("libc.so.6", "libc.so.6"),
            ("libc.so", "libc.so.6"),
            ("libpthread", "libpthread.so.0"),
            ("libstdc++", "libstdc++.so.6"),
            ("libfoo", "libfoo.so"),
        ];
        for (spec, name) in yes {
            assert!(library_name_matches(spec, name), "{spec} {name}");
        }
        let no = [
            ("libc", "libcrypt.so.1"),
            ("libc", "libc_malloc_debug.so.0"),
            ("libfoo", "libfoo-bar.so"),
            ("libc.so.6", "libc.so"),
            ("c", "libc.so.6"),
        ];
        for (spec, name) in no {
            assert!(!library_name_matches(spec, name), "{spec} {name}");
        }
    }

    fn cache_bytes(entries: &[(i32, &str, &str)], with_old: bool) -> Vec<u8> {
        let mut strings = Vec::new();
        let header_len = 48 + 24 * entries.len();
        let mut table = Vec::new();
        for &(flags, name, path) in entries {
            let key = header_len + strings.len();
            strings.extend_from_slice(name.as_bytes());
            strings.push(0);
            let value = header_len + strings.len();
            strings.extend_from_slice(path.as_bytes());
            strings.push(0);
            table.extend_from_slice(&flags.to_le_bytes());
            table.extend_from_slice(&(key as u32).to_le_bytes());
            table.extend_from_slice(&(value as u32).to_le_bytes());
            table.extend_from_slice(&0u32.to_le_bytes());
            table.extend_from_slice(&0u64.to_le_bytes());
        }
        let mut new = Vec::new();
        new.extend_from_slice(b"glibc-ld.so.cache1.1");
        new.extend_from_slice(&(entries.len() as u32).to_le_bytes());
        new.extend_from_slice(&(strings.len() as u32).to_le_bytes());
        new.extend_from_slice(&[0; 4]);
        new.extend_from_slice(&[0; 16]);
        new.extend_from_slice(&table);
        new.extend_from_slice(&strings);
        if !with_old {
            return new;
        }
        let mut old = Vec::new();
        old.extend_from_slice(b"ld.so-1.7.0\0");
        old.extend_from_slice(&1u32.to_le_bytes());
        old.extend_from_slice(&[0; 12]);
        while old.len() % 8 != 0 {
            old.push(0);
        }
        old.extend_from_slice(&new);
        old
    }

    #[test]
    fn ld_so_cache() {
        let entries = [
            (0x0303, "libc.so.6", "/lib/x86_64-linux-gnu/libc.so.6"),
            (0x0003, "libc.so.6", "/lib32/libc.so.6"),
            (0x0303, "libm.so.6", "/lib/x86_64-linux-gnu/libm.so.6"),
        ];
        for with_old in [false, true] {
            let parsed = parse_ld_so_cache(&cache_bytes(&entries, with_old));
            assert_eq!(
                parsed,
                vec![
                    (
                        "libc.so.6".to_string(),
                        PathBuf::from("/lib/x86_64-linux-gnu/libc.so.6")
                    ),
                    (
                        "libm.so.6".to_string(),
                        PathBuf::from("/lib/x86_64-linux-gnu/libm.so.6")
                    ),
                ]
            );
        }
        let bytes = cache_bytes(&entries, false);
        for cut in 0..bytes.len() {
            let _ = parse_ld_so_cache(&bytes[..cut]);
        }
        assert!(parse_ld_so_cache(b"garbage").is_empty());
    }

    #[test]
    fn system_cache_has_libc() {
        let s = LibrarySearch::system();
        if std::path::Path::new("/etc/ld.so.cache").exists() {
            assert!(
                s.cache.iter().any(|(n, _)| n == "libc.so.6"),
                "{:?}",
                &s.cache[..s.cache.len().min(5)]
            );
        }
        assert!(s.locate("libc.so.6").is_some());
    }

    #[test]
    fn library_suggestions() {
        let names = vec![
            "libc.so.6".to_string(),
            "libm.so.6".to_string(),
            "ld-linux-x86-64.so.2".to_string(),
        ];
        assert_eq!(suggest_libraries("libcc", &names), vec!["libc.so.6"]);
        assert_eq!(
            suggest_libraries("libc.so.7", &names),
            vec!["libc.so.6", "libm.so.6"]
        );
    }
}
