//! Where `#include` finds C headers, for the front end: [`weft_lang::HeaderResolver`]
//! over the file system, searching as a C compiler does. `#include "x.h"` looks
//! beside its includer first (the script's directory; the working directory for
//! `--include` and for `-e` programs; a header's own directory), then, as
//! `#include <x.h>` does, in each `-I` directory and in `/usr/local/include`,
//! `/usr/include/x86_64-linux-gnu`, `/usr/include`, and last the C compiler's own
//! (GCC's `stddef.h`, `stdarg.h`, ... which the C library's headers include).

use std::path::{Path, PathBuf};

use weft_lang::{HeaderFile, HeaderResolver, Includer};

/// The system's include directories, searched after `-I`'s.
pub const SYSTEM_DIRS: &[&str] = &[
    "/usr/local/include",
    "/usr/include/x86_64-linux-gnu",
    "/usr/include",
];

pub struct SearchPath {
    /// The script file's directory (`None` for `-e`: the working directory).
    script_dir: Option<PathBuf>,
    /// `-I` directories, in order.
    dirs: Vec<PathBuf>,
    /// GCC's include directory, when GCC is installed.
    compiler: Option<PathBuf>,
}

impl SearchPath {
    pub fn new(script_dir: Option<PathBuf>, dirs: Vec<PathBuf>) -> SearchPath {
        SearchPath {
            script_dir,
            dirs,
            compiler: compiler_dir(),
        }
    }

    /// The directories `name` is looked for in, in order.
    fn search(&self, angled: bool, from: Includer<'_>) -> Vec<PathBuf> {
        let mut out = Vec::new();
        if !angled {
            let own = match from {
                Includer::Script => self.script_dir.clone(),
                Includer::CommandLine => None,
                Includer::Header(p) => Path::new(p).parent().map(Path::to_path_buf),
            };
            out.push(match own {
                Some(d) if !d.as_os_str().is_empty() => d,
                _ => PathBuf::from("."),
            });
        }
        out.extend(self.dirs.iter().cloned());
        out.extend(SYSTEM_DIRS.iter().map(PathBuf::from));
        out.extend(self.compiler.clone());
        out
    }
}

impl HeaderResolver for SearchPath {
    fn find(
        &self,
        name: &str,
        angled: bool,
        from: Includer<'_>,
    ) -> Result<HeaderFile, Vec<String>> {
        let candidates: Vec<PathBuf> = if Path::new(name).is_absolute() {
            vec![PathBuf::from(name)]
        } else {
            self.search(angled, from)
                .iter()
                .map(|d| d.join(name))
                .collect()
        };
        for c in &candidates {
            if !c.is_file() {
                continue;
            }
            let Ok(bytes) = std::fs::read(c) else {
                continue;
            };
            // One path per file, however it was reached (a file is read once).
            let path = c.canonicalize().unwrap_or_else(|_| c.clone());
            return Ok(HeaderFile {
                path: path.display().to_string(),
                text: String::from_utf8_lossy(&bytes).into_owned(),
            });
        }
        if Path::new(name).is_absolute() {
            return Err(Vec::new());
        }
        Err(self
            .search(angled, from)
            .iter()
            .map(|d| d.display().to_string())
            .collect())
    }
}

/// The newest GCC's include directory (`/usr/lib/gcc/x86_64-linux-gnu/N/include`).
fn compiler_dir() -> Option<PathBuf> {
    let base = Path::new("/usr/lib/gcc/x86_64-linux-gnu");
    let mut found: Vec<(Vec<u32>, PathBuf)> = std::fs::read_dir(base)
        .ok()?
        .filter_map(|e| {
            let e = e.ok()?;
            let version: Vec<u32> = e
                .file_name()
                .to_str()?
                .split('.')
                .map(|p| p.parse().ok())
                .collect::<Option<_>>()?;
            let dir = e.path().join("include");
            dir.join("stddef.h").is_file().then_some((version, dir))
        })
        .collect();
    found.sort();
    found.pop().map(|(_, d)| d)
}
