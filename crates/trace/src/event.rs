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
