//! Typed records of a session.

/// One event with where and when it happened.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    /// CLOCK_MONOTONIC time the event was produced (the session's clock: weft's own
    /// events, lifecycle ones, use the same clock).
    pub nsecs: u64,
    /// Process and thread that produced it (0 for weft's own BEGIN/END/interval
    /// advice and for the session's lifecycle records).
    pub pid: u32,
    pub tid: u32,
    pub event: Event,
}

/// What happened. Argument bytes are as advice laid them out (the layout of the
/// format's argument types, `weft_ir::Type`); the program's format table says how to
/// read them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// `printf(FMT, args...)`: format `format` of the program.
    Printf { format: u32, args: Vec<u8> },
    /// `cat(FMT, args...)`: print the file the formatted path names.
    Cat { format: u32, args: Vec<u8> },
    /// `system(FMT, args...)`: run the formatted command, print its output.
    System { format: u32, args: Vec<u8> },
    /// `time(FMT)`: print the wall-clock time, formatted, when the event is handled.
    Time { format: u32 },
    /// `join(array, sep)`: the strings of the array (format `format` holds the
    /// separator and the element types).
    Join { format: u32, args: Vec<u8> },
    /// `print(value)`: format `format`'s single argument type says how to read it.
    Print { format: u32, value: Vec<u8> },
    /// `print(@map, top, div)`: the map's contents when advice asked.
    Map(MapSnapshot),
    /// `exit()`: the session ends; no later event of the same drain is delivered.
    Exit,
    /// A process joined the session (attached, launched, or a followed child).
    ProcessJoined { pid: u32, comm: String },
    /// A process left the session (it exited, or was unwoven).
    ProcessLeft { pid: u32 },
    /// A thread of a target ran advice for the first time in the session (the
    /// record's pid and tid are the thread's).
    ThreadStarted,
    /// A thread that ran advice is gone (its slot was drained).
    ThreadEnded,
    /// Events were dropped because a thread's ring was full: how many since the
    /// last such record.
    Lost { events: u64 },
    /// The record's thread entered function `func` (its address in the record's
    /// process), with the first arguments when they were asked for.
    FunctionEntry { func: u64, args: Vec<u64> },
    /// The record's thread returned from function `func` with `retval`.
    FunctionExit { func: u64, retval: u64 },
    /// Function `func` of the record's process is called `name` (delivered once per
    /// process and function, before its first entry or exit).
    Function { func: u64, name: String },
    /// The record's thread's function entries and exits of one drain, in order,
    /// as its ring held them (sessions that pack them: `weft record`, whose rate a
    /// record per event could not keep up with): whole `EventHeader` records back
    /// to back, `EVENT_FUNC_ENTRY` (the arguments as payload) or `EVENT_FUNC_EXIT`
    /// (the return value in `arg0`, `arg1`), each `id` a probe site an earlier
    /// [`Event::Site`] named, or 16-byte short ones, whose time may be the raw
    /// TSC (`weft_abi::EVENT_FUNC_ENTRY_TSC`: read on the lines of the
    /// [`Event::Clock`]s before it). The record's time is the first one's, in ns.
    /// See [`unpack_ring`].
    Functions {
        ring: Vec<u8>,
        /// Its entries and exits.
        entries: u64,
        exits: u64,
        /// The sites (see [`Event::Site`]) the record's process enters here for
        /// the first time in the session.
        new_sites: Vec<u32>,
    },
    /// A line of the segment's TSC clock (weft recalibrates about every second):
    /// the raw times of the [`Event::Functions`] after it are converted on the
    /// line current when each was read ([`weft_runtime::clock::TscLines`]).
    Clock { line: weft_runtime::clock::TscLine },
    /// Probe site `id` is in function `func` (an address in the processes whose
    /// [`Event::Functions`] name it), called `name`; before the first use.
    Site { id: u32, func: u64, name: String },
}

/// The entries and exits of an [`Event::Functions`] with their times (raw ones
/// converted on `lines`) and site ids, through `site` (a site id's function), as
/// `FunctionEntry`/`FunctionExit`;
/// `None` where the bytes stop making sense or a site is unknown.
pub fn unpack_ring<'a>(
    ring: &'a [u8],
    lines: &'a weft_runtime::clock::TscLines,
    site: impl Fn(u32) -> Option<u64> + 'a,
) -> impl Iterator<Item = Option<(u64, u32, Event)>> + 'a {
    weft_runtime::ring::records(ring).map(move |r| {
        let (h, payload) = r?;
        let h = weft_runtime::ring::timed(h, lines);
        let func = site(h.id)?;
        let event = match h.kind {
            weft_abi::EVENT_FUNC_ENTRY => Event::FunctionEntry {
                func,
                args: payload
                    .chunks_exact(8)
                    .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
                    .collect(),
            },
            weft_abi::EVENT_FUNC_EXIT => Event::FunctionExit {
                func,
                retval: crate::decode::exit_value(&h, payload),
            },
            _ => return None,
        };
        Some((h.nsecs, h.id, event))
    })
}

/// Append one entry (`exit` false: `words` are its arguments) or exit (`words` is
/// `[retval]`) to a packed frame of the record format's old kind 18: `u64` time, `u64` function, `u32`
/// 1 (entry) or 2 (exit), `u32` n, n `u64` words.
pub fn pack(out: &mut Vec<u8>, nsecs: u64, func: u64, exit: bool, words: &[u64]) {
    out.extend_from_slice(&nsecs.to_le_bytes());
    out.extend_from_slice(&func.to_le_bytes());
    out.extend_from_slice(&(if exit { 2u32 } else { 1 }).to_le_bytes());
    out.extend_from_slice(&(words.len() as u32).to_le_bytes());
    for w in words {
        out.extend_from_slice(&w.to_le_bytes());
    }
}

/// The events of a packed frame (the record format's old kind 18) with their times, as
/// `FunctionEntry`/`FunctionExit`; `None` where the bytes stop making sense.
pub fn unpack(packed: &[u8]) -> impl Iterator<Item = Option<(u64, Event)>> + '_ {
    let mut at = 0;
    std::iter::from_fn(move || {
        if at >= packed.len() {
            return None;
        }
        let word = |i: usize| -> Option<u64> {
            Some(u64::from_le_bytes(packed.get(i..i + 8)?.try_into().ok()?))
        };
        let item = (|| {
            let nsecs = word(at)?;
            let func = word(at + 8)?;
            let kind = u32::from_le_bytes(packed.get(at + 16..at + 20)?.try_into().ok()?);
            let n = u32::from_le_bytes(packed.get(at + 20..at + 24)?.try_into().ok()?) as usize;
            let words = (0..n)
                .map(|k| word(at + 24 + 8 * k))
                .collect::<Option<Vec<u64>>>()?;
            let event = match (kind, words.as_slice()) {
                (1, _) => Event::FunctionEntry { func, args: words },
                (2, &[retval]) => Event::FunctionExit { func, retval },
                _ => return None,
            };
            at += 24 + 8 * n;
            Some((nsecs, event))
        })();
        if item.is_none() {
            at = packed.len();
        }
        Some(item)
    })
}

/// A map's merged entries (every thread's, retired threads' included).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MapSnapshot {
    /// Index of the map in the program.
    pub map: u32,
    /// `print(@m, top, div)`'s arguments (0: all entries, no division).
    pub top: u32,
    pub div: u32,
    /// `(key bytes, value bytes)` per live entry, in the table's order.
    pub entries: Vec<(Vec<u8>, Vec<u8>)>,
}
