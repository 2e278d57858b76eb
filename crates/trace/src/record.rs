//! The record file: a session's records on disk, in a format other tools can read
//! (`docs/record-format.md` is its specification; `scripts/weft-record-dump` reads
//! it without weft).
//!
//! ```text
//! "WEFTREC\0"  u32 version  u32 metadata length  metadata (JSON, UTF-8)
//! frame*:      u32 length (bytes after this field)  u16 kind  u16 0
//!              u64 nsecs  u32 pid  u32 tid  payload (length - 20 bytes)
//! ```
//!
//! Little-endian throughout. The metadata describes the program: probe names,
//! formats (text, and each argument's type, offset and size in the argument bytes),
//! maps (key and value layouts). A reader skips frames of kinds it does not know.

use std::io::{self, Read, Write};

use serde_json::{json, Value as Json};
use weft_ir::{MapValue, Program, Type};

use weft_runtime::clock::TscLine;

use crate::event::{Event, MapSnapshot, Record};
use crate::sink::{Context, Sink};

/// The file's first bytes.
pub const MAGIC: &[u8; 8] = b"WEFTREC\0";
/// The version this crate writes (and the newest it reads: it reads 1 too).
pub const VERSION: u32 = 2;

/// Frame kinds.
pub mod kind {
    pub const PRINTF: u16 = 1;
    pub const CAT: u16 = 2;
    pub const SYSTEM: u16 = 3;
    pub const TIME: u16 = 4;
    pub const JOIN: u16 = 5;
    pub const PRINT: u16 = 6;
    pub const MAP: u16 = 7;
    pub const EXIT: u16 = 8;
    pub const PROCESS_JOINED: u16 = 9;
    pub const PROCESS_LEFT: u16 = 10;
    /// A map as the session ended (same payload as [`MAP`]).
    pub const FINAL_MAP: u16 = 11;
    pub const THREAD_STARTED: u16 = 12;
    pub const THREAD_ENDED: u16 = 13;
    pub const LOST: u16 = 14;
    pub const FUNCTION_ENTRY: u16 = 15;
    pub const FUNCTION_EXIT: u16 = 16;
    pub const FUNCTION: u16 = 17;
    /// A thread's function entries and exits, packed (see [`crate::event::pack`]);
    /// written by weft before ring frames, still read.
    pub const FUNCTIONS: u16 = 18;
    /// A thread's function entries and exits as its ring held them
    /// ([`crate::Event::Functions`]).
    pub const RING_FUNCTIONS: u16 = 19;
    /// A probe site's function and name ([`crate::Event::Site`]).
    pub const SITE: u16 = 20;
    /// A line of the TSC clock that ring frames' raw times are read on
    /// ([`crate::Event::Clock`]).
    pub const CLOCK: u16 = 21;
}

/// Bytes of a frame after its length field and before its payload.
const FRAME_HEAD: usize = 20;

/// What the file says about the program, as JSON.
pub fn metadata(prog: &Program) -> Json {
    let layout = |t: &Type| json!({ "type": t.to_string(), "size": t.size() });
    let formats: Vec<Json> = prog
        .formats
        .iter()
        .map(|f| {
            let tuple = Type::Tuple(f.args.clone());
            let args: Vec<Json> = f
                .args
                .iter()
                .zip(tuple.field_offsets())
                .map(|(t, off)| json!({ "type": t.to_string(), "offset": off, "size": t.size() }))
                .collect();
            let message = f.message.as_ref().map(|m| {
                let level = match m.level {
                    weft_ir::MessageLevel::Error => "error",
                    weft_ir::MessageLevel::Warning => "warning",
                };
                json!({ "level": level, "location": m.location() })
            });
            json!({ "text": f.text, "args": args, "message": message })
        })
        .collect();
    let maps: Vec<Json> = prog
        .maps
        .iter()
        .map(|m| {
            let (kind, value) = match &m.value {
                MapValue::Plain(t) => ("plain", Some(t.clone())),
                MapValue::Count => ("count", None),
                MapValue::Sum { .. } => ("sum", None),
                MapValue::Min { .. } => ("min", None),
                MapValue::Max { .. } => ("max", None),
                MapValue::Avg { .. } => ("avg", None),
                MapValue::Stats { .. } => ("stats", None),
                MapValue::Hist { .. } => ("hist", None),
                MapValue::Lhist { .. } => ("lhist", None),
                MapValue::Tseries { .. } => ("tseries", None),
            };
            json!({
                "name": m.name,
                "key": m.key.as_ref().map(layout),
                "value": kind,
                "value_type": value.as_ref().map(layout),
                "value_size": m.value.value_size(),
            })
        })
        .collect();
    json!({
        "writer": concat!("weft ", env!("CARGO_PKG_VERSION")),
        "probes": prog.probe_names,
        "formats": formats,
        "maps": maps,
    })
}

/// Writes a session's records to `out` (a [`Sink`]).
pub struct Writer<W: Write> {
    out: W,
    /// The first write error, reported by [`Writer::finish`].
    error: Option<io::Error>,
    /// Frames written.
    pub frames: u64,
}

impl<W: Write> Writer<W> {
    /// A file for the records of `prog`: its header is written at once.
    pub fn new(out: W, prog: &Program) -> io::Result<Writer<W>> {
        Writer::with_note(out, prog, None)
    }

    /// [`Writer::new`], with `note` as the metadata's `record` (what `weft
    /// record` was asked: `{"args": N, "retval": true}`).
    pub fn with_note(mut out: W, prog: &Program, note: Option<&Json>) -> io::Result<Writer<W>> {
        let mut meta = metadata(prog);
        if let Some(n) = note {
            meta["record"] = n.clone();
        }
        let meta = serde_json::to_vec(&meta).map_err(io::Error::other)?;
        out.write_all(MAGIC)?;
        out.write_all(&VERSION.to_le_bytes())?;
        out.write_all(&(meta.len() as u32).to_le_bytes())?;
        out.write_all(&meta)?;
        Ok(Writer {
            out,
            error: None,
            frames: 0,
        })
    }

    fn frame(&mut self, kind: u16, r: (u64, u32, u32), payload: &[u8]) {
        if self.error.is_some() {
            return;
        }
        let mut f = [0u8; 4 + FRAME_HEAD];
        f[..4].copy_from_slice(&((FRAME_HEAD + payload.len()) as u32).to_le_bytes());
        f[4..6].copy_from_slice(&kind.to_le_bytes());
        f[8..16].copy_from_slice(&r.0.to_le_bytes());
        f[16..20].copy_from_slice(&r.1.to_le_bytes());
        f[20..24].copy_from_slice(&r.2.to_le_bytes());
        match self
            .out
            .write_all(&f)
            .and_then(|()| self.out.write_all(payload))
        {
            Ok(()) => self.frames += 1,
            Err(e) => self.error = Some(e),
        }
    }

    /// Flush; the first error met while writing, if any.
    pub fn close(mut self) -> io::Result<W> {
        if let Some(e) = self.error.take() {
            return Err(e);
        }
        self.out.flush()?;
        Ok(self.out)
    }
}

fn with_u32(v: u32, rest: &[u8]) -> Vec<u8> {
    let mut p = v.to_le_bytes().to_vec();
    p.extend_from_slice(rest);
    p
}

fn map_payload(m: &MapSnapshot) -> Vec<u8> {
    let mut p = Vec::new();
    for v in [m.map, m.top, m.div, m.entries.len() as u32] {
        p.extend_from_slice(&v.to_le_bytes());
    }
    for (k, v) in &m.entries {
        p.extend_from_slice(&(k.len() as u32).to_le_bytes());
        p.extend_from_slice(k);
        p.extend_from_slice(&(v.len() as u32).to_le_bytes());
        p.extend_from_slice(v);
    }
    p
}

impl<W: Write> Sink for Writer<W> {
    fn record(&mut self, r: &Record, _cx: &Context<'_>) {
        let at = (r.nsecs, r.pid, r.tid);
        match &r.event {
            Event::Printf { format, args } => {
                self.frame(kind::PRINTF, at, &with_u32(*format, args))
            }
            Event::Cat { format, args } => self.frame(kind::CAT, at, &with_u32(*format, args)),
            Event::System { format, args } => {
                self.frame(kind::SYSTEM, at, &with_u32(*format, args))
            }
            Event::Time { format } => self.frame(kind::TIME, at, &with_u32(*format, &[])),
            Event::Join { format, args } => self.frame(kind::JOIN, at, &with_u32(*format, args)),
            Event::Print { format, value } => {
                self.frame(kind::PRINT, at, &with_u32(*format, value))
            }
            Event::Map(m) => self.frame(kind::MAP, at, &map_payload(m)),
            Event::Exit => self.frame(kind::EXIT, at, &[]),
            Event::ProcessJoined { pid, comm } => {
                self.frame(kind::PROCESS_JOINED, at, &with_u32(*pid, comm.as_bytes()))
            }
            Event::ProcessLeft { pid } => self.frame(kind::PROCESS_LEFT, at, &with_u32(*pid, &[])),
            Event::ThreadStarted => self.frame(kind::THREAD_STARTED, at, &[]),
            Event::ThreadEnded => self.frame(kind::THREAD_ENDED, at, &[]),
            Event::Lost { events } => self.frame(kind::LOST, at, &events.to_le_bytes()),
            Event::FunctionEntry { func, args } => {
                let mut p = Vec::with_capacity(8 * (1 + args.len()));
                for v in std::iter::once(func).chain(args) {
                    p.extend_from_slice(&v.to_le_bytes());
                }
                self.frame(kind::FUNCTION_ENTRY, at, &p)
            }
            Event::FunctionExit { func, retval } => {
                let mut p = func.to_le_bytes().to_vec();
                p.extend_from_slice(&retval.to_le_bytes());
                self.frame(kind::FUNCTION_EXIT, at, &p)
            }
            Event::Function { func, name } => {
                let mut p = func.to_le_bytes().to_vec();
                p.extend_from_slice(name.as_bytes());
                self.frame(kind::FUNCTION, at, &p)
            }
            Event::Functions { ring, .. } => self.frame(kind::RING_FUNCTIONS, at, ring),
            Event::Clock { line } => {
                let mut p = Vec::with_capacity(24);
                for w in [line.mult, line.base_tsc, line.base_ns] {
                    p.extend_from_slice(&w.to_le_bytes());
                }
                self.frame(kind::CLOCK, at, &p)
            }
            Event::Site { id, func, name } => {
                let mut p = Vec::with_capacity(16 + name.len());
                p.extend_from_slice(&id.to_le_bytes());
                p.extend_from_slice(&0u32.to_le_bytes());
                p.extend_from_slice(&func.to_le_bytes());
                p.extend_from_slice(name.as_bytes());
                self.frame(kind::SITE, at, &p)
            }
        }
    }

    fn finish(&mut self, maps: &[MapSnapshot], _cx: &Context<'_>) {
        for m in maps {
            self.frame(kind::FINAL_MAP, (0, 0, 0), &map_payload(m));
        }
    }

    fn flush(&mut self) {
        if self.error.is_none() {
            if let Err(e) = self.out.flush() {
                self.error = Some(e);
            }
        }
    }
}

/// What a frame holds, read back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Frame {
    Record(Record),
    /// A map as the session ended.
    Final(MapSnapshot),
    /// A kind this version does not know (skipped).
    Unknown(u16),
}

/// Why a file is not a record file of this version.
#[derive(Debug)]
pub enum ReadError {
    Io(io::Error),
    NotARecord,
    Version(u32),
    /// What is wrong, and the offset in the file of the frame (or header) where.
    Corrupt {
        what: &'static str,
        offset: u64,
    },
    /// The file ends inside the frame at this offset (the writer was stopped while
    /// writing it): the frames before it are whole.
    Truncated {
        offset: u64,
    },
}

impl std::fmt::Display for ReadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReadError::Io(e) => write!(f, "{e}"),
            ReadError::NotARecord => write!(f, "not a weft record file (no WEFTREC header)"),
            ReadError::Version(v) => {
                write!(
                    f,
                    "record file version {v}; this weft reads versions 1 to {VERSION}"
                )
            }
            ReadError::Corrupt { what, offset } => {
                write!(f, "corrupt record file at byte {offset}: {what}")
            }
            ReadError::Truncated { offset } => write!(
                f,
                "the record file ends inside the frame at byte {offset} (cut short while it was written)"
            ),
        }
    }
}

impl std::error::Error for ReadError {}

impl From<io::Error> for ReadError {
    fn from(e: io::Error) -> Self {
        ReadError::Io(e)
    }
}

/// Reads a record file.
pub struct Reader<R: Read> {
    input: R,
    /// The file's metadata (see [`metadata`]).
    pub metadata: Json,
    /// Bytes read so far: the offset of the next frame.
    offset: u64,
    /// The rest of a packed frame's entries and exits (returned one at a time).
    pending: std::collections::VecDeque<Record>,
    /// Sites' functions and names ([`kind::SITE`]), by id.
    sites: std::collections::HashMap<u32, (u64, String)>,
    /// Functions named so far, by process (a ring frame's first use of a function
    /// in a process comes out after its [`Event::Function`]).
    named: std::collections::HashSet<(u32, u64)>,
    /// The clock's lines so far ([`kind::CLOCK`]): ring frames' raw times are
    /// converted on them.
    lines: weft_runtime::clock::TscLines,
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

impl<R: Read> Reader<R> {
    pub fn new(mut input: R) -> Result<Reader<R>, ReadError> {
        let mut head = [0u8; 16];
        input
            .read_exact(&mut head)
            .map_err(|_| ReadError::NotARecord)?;
        if &head[..8] != MAGIC {
            return Err(ReadError::NotARecord);
        }
        let version = u32_at(&head, 8).unwrap_or(0);
        // Version 1 differs only in having no raw times (kind 21, and kinds 15
        // and 16 in a ring frame, are new in 2): this reader reads both.
        if !(1..=VERSION).contains(&version) {
            return Err(ReadError::Version(version));
        }
        let len = u32_at(&head, 12).unwrap_or(0) as usize;
        let corrupt = |what| ReadError::Corrupt { what, offset: 12 };
        if len > 1 << 30 {
            return Err(corrupt("metadata length"));
        }
        let mut meta = vec![0u8; len];
        input
            .read_exact(&mut meta)
            .map_err(|_| corrupt("the metadata is cut short"))?;
        let metadata = serde_json::from_slice(&meta).map_err(|_| corrupt("metadata"))?;
        Ok(Reader {
            input,
            metadata,
            offset: 16 + len as u64,
            pending: Default::default(),
            sites: Default::default(),
            named: Default::default(),
            lines: Default::default(),
        })
    }

    /// The offset in the file of the next frame.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// Reads all of `buf`, or as much as there is: the bytes read.
    fn fill(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let mut n = 0;
        while n < buf.len() {
            match self.input.read(&mut buf[n..]) {
                Ok(0) => break,
                Ok(k) => n += k,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(n)
    }

    /// The next frame; `None` at the end of the file.
    /// A packed frame ([`kind::FUNCTIONS`]) comes out as its entries and exits, one
    /// record each.
    pub fn next_frame(&mut self) -> Result<Option<Frame>, ReadError> {
        if let Some(r) = self.pending.pop_front() {
            return Ok(Some(Frame::Record(r)));
        }
        let offset = self.offset;
        let mut len = [0u8; 4];
        match self.fill(&mut len)? {
            0 => return Ok(None),
            4 => {}
            _ => return Err(ReadError::Truncated { offset }),
        }
        let len = u32::from_le_bytes(len) as usize;
        if !(FRAME_HEAD..1 << 30).contains(&len) {
            return Err(ReadError::Corrupt {
                what: "frame length",
                offset,
            });
        }
        let mut f = vec![0u8; len];
        if self.fill(&mut f)? < len {
            return Err(ReadError::Truncated { offset });
        }
        self.offset += 4 + len as u64;
        let kind = u16::from_le_bytes([f[0], f[1]]);
        let nsecs = u64::from_le_bytes(f[4..12].try_into().unwrap());
        let pid = u32_at(&f, 12).unwrap_or(0);
        let tid = u32_at(&f, 16).unwrap_or(0);
        let p = &f[FRAME_HEAD..];
        let bad = || ReadError::Corrupt {
            what: "frame payload",
            offset,
        };
        let id = || u32_at(p, 0).ok_or_else(bad);
        let rest = || p.get(4..).unwrap_or(&[]).to_vec();
        let event = match kind {
            kind::PRINTF => Event::Printf {
                format: id()?,
                args: rest(),
            },
            kind::CAT => Event::Cat {
                format: id()?,
                args: rest(),
            },
            kind::SYSTEM => Event::System {
                format: id()?,
                args: rest(),
            },
            kind::TIME => Event::Time { format: id()? },
            kind::JOIN => Event::Join {
                format: id()?,
                args: rest(),
            },
            kind::PRINT => Event::Print {
                format: id()?,
                value: rest(),
            },
            kind::MAP => Event::Map(read_map(p).ok_or_else(bad)?),
            kind::EXIT => Event::Exit,
            kind::PROCESS_JOINED => Event::ProcessJoined {
                pid: id()?,
                comm: String::from_utf8_lossy(&rest()).into_owned(),
            },
            kind::PROCESS_LEFT => Event::ProcessLeft { pid: id()? },
            kind::THREAD_STARTED => Event::ThreadStarted,
            kind::THREAD_ENDED => Event::ThreadEnded,
            kind::LOST => Event::Lost {
                events: u64::from_le_bytes(
                    p.get(..8).and_then(|b| b.try_into().ok()).ok_or_else(bad)?,
                ),
            },
            kind::FUNCTION_ENTRY => {
                let words = u64s(p).ok_or_else(bad)?;
                let (&func, args) = words.split_first().ok_or_else(bad)?;
                Event::FunctionEntry {
                    func,
                    args: args.to_vec(),
                }
            }
            kind::FUNCTION_EXIT => match u64s(p).as_deref() {
                Some(&[func, retval]) => Event::FunctionExit { func, retval },
                _ => return Err(bad()),
            },
            kind::FUNCTION => Event::Function {
                func: u64s(p.get(..8).unwrap_or(&[]))
                    .and_then(|w| w.first().copied())
                    .ok_or_else(bad)?,
                name: String::from_utf8_lossy(p.get(8..).unwrap_or(&[])).into_owned(),
            },
            kind::FINAL_MAP => return Ok(Some(Frame::Final(read_map(p).ok_or_else(bad)?))),
            kind::FUNCTIONS => {
                for item in crate::event::unpack(p) {
                    let (nsecs, event) = item.ok_or_else(bad)?;
                    self.pending.push_back(Record {
                        nsecs,
                        pid,
                        tid,
                        event,
                    });
                }
                let _ = nsecs;
                return self.next_frame();
            }
            kind::SITE => {
                let func = p
                    .get(8..16)
                    .map(|b| u64::from_le_bytes(b.try_into().unwrap()))
                    .ok_or_else(bad)?;
                let name = String::from_utf8_lossy(&p[16..]).into_owned();
                self.sites.insert(id()?, (func, name));
                return self.next_frame();
            }
            kind::CLOCK => {
                match u64s(p).as_deref() {
                    Some(&[mult, base_tsc, base_ns]) => self.lines.add(TscLine {
                        mult,
                        base_tsc,
                        base_ns,
                    }),
                    _ => return Err(bad()),
                };
                return self.next_frame();
            }
            kind::RING_FUNCTIONS => {
                let sites = &self.sites;
                let lines = &self.lines;
                for item in crate::event::unpack_ring(p, lines, |id| sites.get(&id).map(|s| s.0)) {
                    let (nsecs, site, event) = item.ok_or_else(bad)?;
                    let (func, name) = &sites[&site];
                    let func = *func;
                    if self.named.insert((pid, func)) {
                        let name = name.clone();
                        self.pending.push_back(Record {
                            nsecs,
                            pid,
                            tid,
                            event: Event::Function { func, name },
                        });
                    }
                    self.pending.push_back(Record {
                        nsecs,
                        pid,
                        tid,
                        event,
                    });
                }
                return self.next_frame();
            }
            other => return Ok(Some(Frame::Unknown(other))),
        };
        Ok(Some(Frame::Record(Record {
            nsecs,
            pid,
            tid,
            event,
        })))
    }
}

/// `p` as little-endian 8-byte words (`None` if its length is not a multiple of 8).
fn u64s(p: &[u8]) -> Option<Vec<u64>> {
    p.len().is_multiple_of(8).then(|| {
        p.chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
            .collect()
    })
}

fn read_map(p: &[u8]) -> Option<MapSnapshot> {
    let (map, top, div, n) = (u32_at(p, 0)?, u32_at(p, 4)?, u32_at(p, 8)?, u32_at(p, 12)?);
    let mut at = 16;
    let mut entries = Vec::new();
    for _ in 0..n {
        let kl = u32_at(p, at)? as usize;
        let k = p.get(at + 4..at + 4 + kl)?.to_vec();
        at += 4 + kl;
        let vl = u32_at(p, at)? as usize;
        let v = p.get(at + 4..at + 4 + vl)?.to_vec();
        at += 4 + vl;
        entries.push((k, v));
    }
    Some(MapSnapshot {
        map,
        top,
        div,
        entries,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    struct NoSymbols;

    impl weft_output::Resolver for NoSymbols {
        fn usym(&self, _: u64) -> Option<weft_output::Symbol> {
            None
        }
        fn probe_name(&self, id: u64) -> String {
            format!("probe{id}")
        }
        fn format(&self, _: weft_ir::FmtId) -> Option<&weft_ir::Format> {
            None
        }
    }

    fn every_event() -> Vec<Record> {
        let at = |event| Record {
            nsecs: 1_000_000_007,
            pid: 42,
            tid: 43,
            event,
        };
        vec![
            at(Event::Printf {
                format: 0,
                args: vec![1, 2, 3, 4, 5, 6, 7, 8],
            }),
            at(Event::Cat {
                format: 1,
                args: b"/etc/hostname\0".to_vec(),
            }),
            at(Event::System {
                format: 2,
                args: vec![],
            }),
            at(Event::Time { format: 3 }),
            at(Event::Join {
                format: 4,
                args: b"a\0b\0".to_vec(),
            }),
            at(Event::Print {
                format: 5,
                value: 7u64.to_le_bytes().to_vec(),
            }),
            at(Event::Map(MapSnapshot {
                map: 1,
                top: 10,
                div: 2,
                entries: vec![(vec![1; 8], vec![2; 8]), (vec![], vec![3; 16])],
            })),
            at(Event::Exit),
            at(Event::ProcessJoined {
                pid: 44,
                comm: "worker".into(),
            }),
            at(Event::ProcessLeft { pid: 44 }),
            at(Event::ThreadStarted),
            at(Event::ThreadEnded),
            at(Event::Lost { events: 12 }),
            at(Event::Function {
                func: 0x5555_0000_1234,
                name: "ns::parse".into(),
            }),
            at(Event::FunctionEntry {
                func: 0x5555_0000_1234,
                args: vec![1, u64::MAX, 3],
            }),
            at(Event::FunctionEntry {
                func: 0x5555_0000_1234,
                args: vec![],
            }),
            at(Event::FunctionExit {
                func: 0x5555_0000_1234,
                retval: (-2i64) as u64,
            }),
        ]
    }

    #[test]
    fn records_round_trip() {
        let prog = Program::default();
        let mut w = Writer::new(Vec::new(), &prog).unwrap();
        let cx = Context {
            prog: &prog,
            resolver: &NoSymbols,
        };
        let events = every_event();
        for r in &events {
            w.record(r, &cx);
        }
        let last = MapSnapshot {
            map: 0,
            top: 0,
            div: 0,
            entries: vec![(vec![], 9u64.to_le_bytes().to_vec())],
        };
        w.finish(std::slice::from_ref(&last), &cx);
        assert_eq!(w.frames, events.len() as u64 + 1);
        let bytes = w.close().unwrap();
        let mut r = Reader::new(&bytes[..]).unwrap();
        assert_eq!(r.metadata["probes"], json!([]));
        assert_eq!(r.metadata.get("record"), None);
        for want in events {
            assert_eq!(r.next_frame().unwrap(), Some(Frame::Record(want)));
        }
        assert_eq!(r.next_frame().unwrap(), Some(Frame::Final(last)));
        assert_eq!(r.next_frame().unwrap(), None);
    }

    #[test]
    fn bad_files_are_refused() {
        assert!(matches!(
            Reader::new(&b"not a record"[..]),
            Err(ReadError::NotARecord)
        ));
        let mut v = MAGIC.to_vec();
        v.extend_from_slice(&9u32.to_le_bytes());
        v.extend_from_slice(&0u32.to_le_bytes());
        assert!(matches!(Reader::new(&v[..]), Err(ReadError::Version(9))));
        // A frame cut short.
        let prog = Program::default();
        let mut w = Writer::new(Vec::new(), &prog).unwrap();
        let cx = Context {
            prog: &prog,
            resolver: &NoSymbols,
        };
        w.record(&every_event()[0], &cx);
        let mut bytes = w.close().unwrap();
        // Two frames, the second cut short.
        let whole = bytes.len() as u64;
        let first = Reader::new(&bytes[..]).unwrap().offset();
        bytes.extend_from_slice(&bytes.clone()[first as usize..]);
        bytes.truncate(bytes.len() - 3);
        let mut r = Reader::new(&bytes[..]).unwrap();
        assert!(matches!(r.next_frame(), Ok(Some(Frame::Record(_)))));
        assert_eq!(r.offset(), whole);
        assert!(matches!(
            r.next_frame(),
            Err(ReadError::Truncated { offset }) if offset == whole
        ));
        // A length field cut short is a cut too; a frame length out of range is
        // corrupt, at its offset.
        let mut r = Reader::new(&bytes[..whole as usize + 2]).unwrap();
        r.next_frame().unwrap();
        assert!(matches!(r.next_frame(), Err(ReadError::Truncated { .. })));
        let mut bad = bytes[..whole as usize].to_vec();
        bad.extend_from_slice(&3u32.to_le_bytes());
        let mut r = Reader::new(&bad[..]).unwrap();
        r.next_frame().unwrap();
        let e = r.next_frame().unwrap_err();
        assert_eq!(
            e.to_string(),
            format!("corrupt record file at byte {whole}: frame length")
        );
    }
}
