//! tracefs: where it is mounted, the kernel's tracepoints (`CATEGORY:NAME`), the
//! layout of each one's record (its `format` file), and what the running kernel
//! offers for kernel probes ([`features`]).
//!
//! Parsing is pure ([`parse_format`], [`Field::parse`]); [`Tracefs`] reads the files.
//! Wildcards in tracepoint patterns are weft's (and bpftrace's) attach-point
//! wildcards: [`weft_symbols::glob`].

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};

use weft_symbols::glob::Glob;

/// Where tracefs usually is, in the order looked at.
pub const MOUNT_POINTS: &[&str] = &["/sys/kernel/tracing", "/sys/kernel/debug/tracing"];

/// Where the kernel's BTF type information is, when it has it.
pub const BTF_VMLINUX: &str = "/sys/kernel/btf/vmlinux";

/// The perf event source of kprobes, when the kernel has them.
pub const KPROBE_PMU: &str = "/sys/bus/event_source/devices/kprobe";

/// What can go wrong; every message is one line for the user.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(
        "tracefs is not mounted (not at /sys/kernel/tracing, /sys/kernel/debug/tracing, \
         nor in /proc/mounts): mount it with `mount -t tracefs nodev /sys/kernel/tracing`"
    )]
    NotMounted,
    #[error("{}: permission denied (kernel tracepoints need root, or CAP_SYS_ADMIN or CAP_PERFMON and read access to tracefs)", path.display())]
    NotPermitted { path: PathBuf },
    #[error("cannot read {}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("no tracepoint {0}")]
    NoSuchTracepoint(Tracepoint),
    #[error("{}: line {line}: {why}", path.display())]
    Malformed {
        path: PathBuf,
        line: usize,
        why: String,
    },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

fn io_error(path: &Path, source: io::Error) -> Error {
    if source.kind() == io::ErrorKind::PermissionDenied {
        Error::NotPermitted {
            path: path.to_path_buf(),
        }
    } else {
        Error::Io {
            path: path.to_path_buf(),
            source,
        }
    }
}

/// One tracepoint: `CATEGORY:NAME` (`syscalls:sys_enter_openat`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Tracepoint {
    pub category: String,
    pub name: String,
}

impl fmt::Display for Tracepoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.category, self.name)
    }
}

/// A tracefs mount.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tracefs {
    root: PathBuf,
}

impl Tracefs {
    /// The mounted tracefs: [`MOUNT_POINTS`], else the first `tracefs` in
    /// `/proc/mounts`.
    pub fn find() -> Result<Tracefs> {
        for p in MOUNT_POINTS {
            let root = Path::new(p);
            if root.join("events").is_dir() {
                return Ok(Tracefs::at(root));
            }
        }
        let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
        mount_point(&mounts)
            .map(Tracefs::at)
            .ok_or(Error::NotMounted)
    }

    /// The tracefs mounted at `root`.
    pub fn at(root: impl Into<PathBuf>) -> Tracefs {
        Tracefs { root: root.into() }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    fn read(&self, rel: impl AsRef<Path>) -> Result<String> {
        let path = self.root.join(rel);
        std::fs::read_to_string(&path).map_err(|e| io_error(&path, e))
    }

    /// Every tracepoint, sorted by `category:name`: `available_events` (what bpftrace lists; it leaves
    /// out the `ftrace` category, whose events are no tracepoints), else each
    /// `events/CATEGORY/NAME` with a `format` file.
    pub fn tracepoints(&self) -> Result<Vec<Tracepoint>> {
        let mut all = match self.read("available_events") {
            Ok(text) => parse_available_events(&text),
            Err(Error::Io { .. }) => self.events_dir()?,
            Err(e) => return Err(e),
        };
        // As `bpftrace -l` orders them: by `category:name` (`fib6:…` before `fib:…`).
        all.sort_by_cached_key(Tracepoint::to_string);
        all.dedup();
        Ok(all)
    }

    fn events_dir(&self) -> Result<Vec<Tracepoint>> {
        let events = self.root.join("events");
        let dir = |p: &Path| std::fs::read_dir(p).map_err(|e| io_error(p, e));
        let mut all = Vec::new();
        for cat in dir(&events)?.flatten() {
            let category = cat.file_name().to_string_lossy().into_owned();
            if category == "ftrace" || !cat.path().is_dir() {
                continue;
            }
            for ev in dir(&cat.path())?.flatten() {
                if ev.path().join("format").is_file() {
                    all.push(Tracepoint {
                        category: category.clone(),
                        name: ev.file_name().to_string_lossy().into_owned(),
                    });
                }
            }
        }
        Ok(all)
    }

    /// The tracepoints whose category and name match the wildcard patterns, sorted
    /// as [`Tracefs::tracepoints`].
    pub fn matching(&self, category: &str, name: &str) -> Result<Vec<Tracepoint>> {
        let (c, n) = (Glob::new(category), Glob::new(name));
        if c.is_literal() && n.is_literal() {
            // One exact name: its directory says, without the whole list.
            let tp = Tracepoint {
                category: category.to_string(),
                name: name.to_string(),
            };
            let format = self.format_path(&tp);
            return match std::fs::metadata(&format) {
                Ok(_) => Ok(vec![tp]),
                Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Vec::new()),
                Err(e) => Err(io_error(&format, e)),
            };
        }
        Ok(self
            .tracepoints()?
            .into_iter()
            .filter(|t| c.matches(&t.category) && n.matches(&t.name))
            .collect())
    }

    fn format_path(&self, tp: &Tracepoint) -> PathBuf {
        self.root
            .join("events")
            .join(&tp.category)
            .join(&tp.name)
            .join("format")
    }

    /// The layout of a tracepoint's record.
    pub fn format(&self, tp: &Tracepoint) -> Result<Format> {
        let path = self.format_path(tp);
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Err(Error::NoSuchTracepoint(tp.clone()))
            }
            Err(e) => return Err(io_error(&path, e)),
        };
        parse_format(&text).map_err(|(line, why)| Error::Malformed { path, line, why })
    }
}

/// The mount point of the first `tracefs` in `/proc/mounts` text.
pub fn mount_point(mounts: &str) -> Option<PathBuf> {
    mounts.lines().find_map(|l| {
        let mut f = l.split_whitespace();
        let (_, dir, fstype) = (f.next()?, f.next()?, f.next()?);
        // Spaces in mount points are written `\040`.
        (fstype == "tracefs").then(|| PathBuf::from(dir.replace("\\040", " ")))
    })
}

/// `available_events` text (`category:name` lines).
pub fn parse_available_events(text: &str) -> Vec<Tracepoint> {
    text.lines()
        .filter_map(|l| {
            let (c, n) = l.trim().split_once(':')?;
            Some(Tracepoint {
                category: c.to_string(),
                name: n.to_string(),
            })
        })
        .collect()
}

/// A tracepoint's `format` file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Format {
    pub name: String,
    /// The tracepoint's ID (what `perf_event_open` takes).
    pub id: u32,
    /// The record's fields in order, the `common_*` ones first.
    pub fields: Vec<Field>,
}

impl Format {
    pub fn field(&self, name: &str) -> Option<&Field> {
        self.fields.iter().find(|f| f.name == name)
    }
}

/// One field of a tracepoint's record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Field {
    /// The declaration as the format file writes it (`const char * filename`,
    /// `char prev_comm[16]`, `__data_loc char[] name`): what `bpftrace -lv` prints.
    pub decl: String,
    pub name: String,
    /// The C type: of the field (`const char *`, `unsigned long`), of an array's
    /// elements (`char` for `char comm[16]`), of a `__data_loc` array's elements
    /// (`char` for `__data_loc char[] name`).
    pub c_type: String,
    /// Bytes from the start of the record.
    pub offset: u32,
    /// Bytes the field takes in the record. It wins over the C type: a syscall's
    /// `int dfd` takes 8 bytes.
    pub size: u32,
    pub signed: bool,
    pub kind: FieldKind,
}

/// The shape of a field.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FieldKind {
    /// An integer (or an enum, a `bool`, a typedef of one).
    Scalar,
    /// A pointer (`const char * filename`): its value, an address.
    Pointer,
    /// A fixed array (`char comm[16]`, `u8 addr[4][4]`): its dimensions, outermost
    /// first; empty for a flexible array (`u32 buf[]`, size 0).
    Array { dims: Vec<u32> },
    /// `__data_loc TYPE[] name`: a u32 in the record (offset | length << 16) locating
    /// the data, stored after the fixed fields.
    DataLoc,
}

impl Field {
    /// A `common_*` field: the header every record starts with.
    pub fn is_common(&self) -> bool {
        self.name.starts_with("common_")
    }

    /// Parses a declaration (`field:` to `;` without them) with its offset, size and
    /// signedness.
    pub fn parse(decl: &str, offset: u32, size: u32, signed: bool) -> Result<Field, String> {
        let decl = decl.trim();
        let bad = || format!("cannot read the field declaration `{decl}`");
        let (kind, c_type, name) = if let Some(rest) = decl.strip_prefix("__data_loc ") {
            // `__data_loc char[] name` (or, rarely, `__data_loc cpumask_t name`).
            let (ty, name) = rest.rsplit_once(char::is_whitespace).ok_or_else(bad)?;
            let ty = ty.trim();
            let elem = ty.strip_suffix("[]").unwrap_or(ty).trim();
            (FieldKind::DataLoc, elem.to_string(), name.to_string())
        } else if let Some(open) = decl.find('[').filter(|_| decl.ends_with(']')) {
            let (head, dims_text) = decl.split_at(open);
            let (ty, name) = split_name(head).ok_or_else(bad)?;
            let mut dims = Vec::new();
            for d in dims_text
                .trim_start_matches('[')
                .trim_end_matches(']')
                .split("][")
            {
                if d.is_empty() && dims_text == "[]" {
                    break;
                }
                dims.push(d.trim().parse::<u32>().map_err(|_| bad())?);
            }
            (FieldKind::Array { dims }, ty, name)
        } else {
            let (ty, name) = split_name(decl).ok_or_else(bad)?;
            let kind = if ty.ends_with('*') {
                FieldKind::Pointer
            } else {
                FieldKind::Scalar
            };
            (kind, ty, name)
        };
        if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            return Err(bad());
        }
        Ok(Field {
            decl: decl.to_string(),
            name,
            c_type,
            offset,
            size,
            signed,
            kind,
        })
    }
}

/// `const char * filename` → (`const char *`, `filename`).
fn split_name(decl: &str) -> Option<(String, String)> {
    let decl = decl.trim();
    let at = decl.rfind(|c: char| c.is_whitespace() || c == '*')?;
    let (ty, name) = decl.split_at(at + 1);
    Some((ty.trim().to_string(), name.trim().to_string()))
}

/// Parses a `format` file. `Err` holds the (1-based) line and what is wrong.
pub fn parse_format(text: &str) -> Result<Format, (usize, String)> {
    let mut name = None;
    let mut id = None;
    let mut fields = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        let at = |why: String| (i + 1, why);
        if let Some(n) = line.strip_prefix("name:") {
            name = Some(n.trim().to_string());
        } else if let Some(n) = line.strip_prefix("ID:") {
            id = Some(
                n.trim()
                    .parse::<u32>()
                    .map_err(|_| at(format!("bad ID `{}`", n.trim())))?,
            );
        } else if line.starts_with("field:") {
            let mut decl = None;
            let (mut offset, mut size, mut signed) = (None, None, None);
            for part in line.split(';').map(str::trim).filter(|p| !p.is_empty()) {
                let (key, value) = part
                    .split_once(':')
                    .ok_or_else(|| at(format!("expected `key:value`, found `{part}`")))?;
                let number = || {
                    value
                        .trim()
                        .parse::<u32>()
                        .map_err(|_| at(format!("bad {key} `{value}`")))
                };
                match key {
                    "field" => decl = Some(value),
                    "offset" => offset = Some(number()?),
                    "size" => size = Some(number()?),
                    "signed" => signed = Some(number()? != 0),
                    _ => {}
                }
            }
            let (Some(decl), Some(offset), Some(size)) = (decl, offset, size) else {
                return Err(at("a field without its offset or size".to_string()));
            };
            fields.push(Field::parse(decl, offset, size, signed.unwrap_or(false)).map_err(at)?);
        } else if line.starts_with("print fmt:") {
            break;
        }
    }
    Ok(Format {
        name: name.ok_or((1, "no `name:` line".to_string()))?,
        id: id.ok_or((1, "no `ID:` line".to_string()))?,
        fields,
    })
}

/// What the running kernel offers for kernel probes, so that messages can say it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Features {
    /// The tracefs mount, or why there is none (its message).
    pub tracefs: Result<PathBuf, String>,
    /// kprobes: the file that shows them (`kprobe_events` in tracefs, or the kprobe
    /// perf event source), `None` when the kernel has none (CONFIG_KPROBE_EVENTS off).
    pub kprobes: Option<PathBuf>,
    /// The kernel's BTF ([`BTF_VMLINUX`]), what kfunc/fentry probes need.
    pub btf: Option<PathBuf>,
}

/// Looks at the running kernel.
pub fn features() -> Features {
    let tracefs = Tracefs::find();
    let exists = |p: PathBuf| p.exists().then_some(p);
    let kprobes = tracefs
        .as_ref()
        .ok()
        .and_then(|t| exists(t.root().join("kprobe_events")))
        .or_else(|| exists(PathBuf::from(KPROBE_PMU)));
    Features {
        tracefs: tracefs.map(|t| t.root).map_err(|e| e.to_string()),
        kprobes,
        btf: exists(PathBuf::from(BTF_VMLINUX)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const OPENAT: &str = "name: sys_enter_openat
ID: 782
format:
\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;
\tfield:unsigned char common_flags;\toffset:2;\tsize:1;\tsigned:0;
\tfield:unsigned char common_preempt_count;\toffset:3;\tsize:1;\tsigned:0;
\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;

\tfield:int __syscall_nr;\toffset:8;\tsize:4;\tsigned:1;
\tfield:int dfd;\toffset:16;\tsize:8;\tsigned:0;
\tfield:const char * filename;\toffset:24;\tsize:8;\tsigned:0;
\tfield:int flags;\toffset:32;\tsize:8;\tsigned:0;
\tfield:umode_t mode;\toffset:40;\tsize:8;\tsigned:0;

print fmt: \"dfd: 0x%08lx, filename: 0x%08lx\", ((unsigned long)(REC->dfd))
";

    #[test]
    fn openat() {
        let f = parse_format(OPENAT).unwrap();
        assert_eq!((f.name.as_str(), f.id), ("sys_enter_openat", 782));
        assert_eq!(f.fields.len(), 9);
        assert!(f.fields[3].is_common() && !f.fields[4].is_common());
        let dfd = f.field("dfd").unwrap();
        assert_eq!(
            (dfd.c_type.as_str(), dfd.offset, dfd.size, dfd.signed),
            ("int", 16, 8, false)
        );
        let name = f.field("filename").unwrap();
        assert_eq!(name.kind, FieldKind::Pointer);
        assert_eq!(name.c_type, "const char *");
        assert_eq!(name.decl, "const char * filename");
    }

    #[test]
    fn arrays_and_data_loc() {
        let f = Field::parse("char prev_comm[16]", 8, 16, false).unwrap();
        assert_eq!(f.kind, FieldKind::Array { dims: vec![16] });
        assert_eq!((f.c_type.as_str(), f.name.as_str()), ("char", "prev_comm"));
        let f = Field::parse("u8 addr[4][4]", 8, 16, false).unwrap();
        assert_eq!(f.kind, FieldKind::Array { dims: vec![4, 4] });
        let f = Field::parse("u32 buf[]", 24, 0, false).unwrap();
        assert_eq!(f.kind, FieldKind::Array { dims: vec![] });
        let f = Field::parse("__data_loc char[] filename", 8, 4, false).unwrap();
        assert_eq!(f.kind, FieldKind::DataLoc);
        assert_eq!((f.c_type.as_str(), f.name.as_str()), ("char", "filename"));
        let f = Field::parse("__data_loc cpumask_t cpumask", 8, 4, false).unwrap();
        assert_eq!(
            (f.c_type.as_str(), f.kind),
            ("cpumask_t", FieldKind::DataLoc)
        );
        let f = Field::parse("struct open_how * how", 8, 8, false).unwrap();
        assert_eq!(
            (f.c_type.as_str(), f.kind),
            ("struct open_how *", FieldKind::Pointer)
        );
        let f = Field::parse("void *ptr", 8, 8, false).unwrap();
        assert_eq!((f.c_type.as_str(), f.name.as_str()), ("void *", "ptr"));
        assert!(Field::parse("int", 0, 4, true).is_err());
        assert!(Field::parse("char x[N]", 0, 4, true).is_err());
    }

    #[test]
    fn malformed() {
        assert_eq!(
            parse_format("name: x\nID: y\n").unwrap_err(),
            (2, "bad ID `y`".to_string())
        );
        assert!(parse_format("name: x\nID: 1\n\tfield:int a;\tsize:4;\n").is_err());
    }

    #[test]
    fn mounts_and_events() {
        let m = "sysfs /sys sysfs rw 0 0\nnodev /mnt/my\\040trace tracefs rw 0 0\n";
        assert_eq!(mount_point(m), Some(PathBuf::from("/mnt/my trace")));
        assert_eq!(mount_point("sysfs /sys sysfs rw 0 0\n"), None);
        let e = parse_available_events("sched:sched_switch\nsyscalls:sys_enter_openat\n");
        assert_eq!(e[1].to_string(), "syscalls:sys_enter_openat");
    }
}
