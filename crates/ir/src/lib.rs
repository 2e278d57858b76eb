//! The probe program: what the language front end (`weft-lang`) produces and what the
//! code generator (`weft-jit`) and the printer (`weft-output`) consume.
//!
//! A [`Program`] is a list of maps, format strings and probes. Each probe has one or
//! more attach points and a body: a [`Function`] of register-machine instructions.
//!
//! The machine model, which every consumer relies on:
//!
//! * **Registers** ([`Reg`]) hold 64-bit integers. Narrower integer types are kept
//!   sign- or zero-extended to 64 bits according to their [`Type`]; [`Inst::Extend`]
//!   re-establishes that after arithmetic that may overflow the narrow type.
//! * **Slots** ([`Slot`]) are byte arrays in the advice's stack frame, declared with a
//!   size in [`Function::slots`]. Every value that does not fit a register (strings,
//!   buffers, tuples, records, map keys, stacks, printf argument packs) lives in a slot
//!   at a byte offset, laid out by [`Type::size`] / [`Type::align`] /
//!   [`Type::field_offsets`]. Slots start zeroed only where an instruction says so
//!   ([`Inst::SlotZero`]); the front end zeroes what it reads before writing it fully.
//! * **Control flow** is explicit: [`Inst::Label`], [`Inst::Jump`], [`Inst::Branch`].
//!   Every loop the front end emits is bounded (it counts iterations in a register and
//!   leaves the loop when the bound is hit, bumping [`ErrorKind::LoopBound`]).
//! * **Target memory** is only read through fault-tolerant instructions
//!   ([`Inst::Load`], [`Inst::ReadStr`], [`Inst::ReadBuf`], [`Inst::UStack`]); a fault
//!   yields zeroes and counts an error, it never crashes the target.
//! * **Output** is asynchronous: [`Inst::Emit`] copies a slot into the thread's event
//!   ring; weft formats it later ([`EventKind`]). Nothing in a body does I/O.
//!
//! Layout of values in slots and in events is little-endian, natural alignment, and
//! described entirely by [`Type`], so a reader of an event or a map key needs only the
//! type to decode it.

use std::fmt;

// ---------------------------------------------------------------------------------
// Types
// ---------------------------------------------------------------------------------

pub mod format;

/// The type of a value, as the checker inferred it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Type {
    /// No value (statements, `printf(...)` used as an expression).
    Void,
    /// An integer of `bits` (8, 16, 32 or 64) bits; carried in a 64-bit register.
    Int { bits: u8, signed: bool },
    /// A boolean (`true`, `false`, comparisons, `!`, `strcontains`, ...); prints as
    /// upstream bpftrace prints it: `true`/`false`, except 1/0 with printf's `%d`.
    /// Carried as 0 or 1 in a register, stored as 1 byte.
    Bool,
    /// A NUL-padded string of at most `cap - 1` bytes plus NUL (bpftrace `string[cap]`).
    Str { cap: u32 },
    /// Bytes read with `buf()`: layout `{ len: u32, bytes: [u8; cap] }`.
    Buf { cap: u32 },
    /// A tuple: fields laid out in order with natural alignment.
    Tuple(Vec<Type>),
    /// A record (named tuple), laid out like a tuple of its field types.
    Record(Vec<(String, Type)>),
    /// A code address in the target, printed as `symbol+off` (bpftrace `usym`).
    USym,
    /// A user stack: layout `{ n: u64, ips: [u64; depth] }`; printed like bpftrace.
    UStack { depth: u32, mode: StackMode },
    /// The probe that fired, as an index into [`Program::probe_names`]; prints the
    /// probe's full name (`uprobe:/bin/app:main`). Stored as u64.
    ProbeName,
    /// A point in time to be printed with a strftime format: layout
    /// `{ fmt: u64 (FmtId into Program::formats), nsecs: u64 (CLOCK_REALTIME) }`.
    Timestamp,
    /// A pointer to a value of the given type in the target (DWARF-typed or cast).
    Ptr(Box<Type>),
    /// A C struct, union or array known from DWARF or a cast; layout from the target.
    CStruct(CStruct),
    /// An IP address from `ntop()` (bpftrace `inet`): layout `{ af: u64 (AF_INET 2 or
    /// AF_INET6 10), addr: [u8; 16] }` (an IPv4 address in the first 4 bytes); printed
    /// as `inet_ntop` prints it, and as nothing for another family.
    Inet,
    /// A MAC address from `macaddr()`: its 6 bytes, printed `AA:BB:CC:DD:EE:FF`.
    MacAddr,
    /// A value of an enum (an enumerator, a variable holding one, a cast to `enum
    /// X`): a signed 64-bit integer in registers and storage, printed as its
    /// enumerator's name where it has one (upstream symbolizes them; JSON keeps the
    /// number). Arithmetic on it gives a plain integer.
    Enum(EnumType),
}

/// An enum's name and enumerators, for printing its values.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct EnumType {
    /// Empty for an anonymous `enum { ... }`.
    pub name: String,
    pub variants: std::sync::Arc<[(String, i64)]>,
}

impl EnumType {
    /// The enumerator named for `v`: the first one with that value.
    pub fn name_of(&self, v: i64) -> Option<&str> {
        self.variants
            .iter()
            .find(|(_, x)| *x == v)
            .map(|(n, _)| n.as_str())
    }
}

/// Bytes of a [`Type::Inet`]: the family (8) and room for an IPv6 address (16).
pub const INET_SIZE: u32 = 24;
/// Address families of a [`Type::Inet`], as Linux numbers them.
pub const AF_INET: u64 = 2;
pub const AF_INET6: u64 = 10;

/// Stack printing modes (bpftrace `ustack(mode, n)`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StackMode {
    Bpftrace,
    Perf,
    Raw,
}

/// A C aggregate known from DWARF or from a cast to a struct pointer.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct CStruct {
    pub name: String,
    pub size: u32,
    /// Shared: every expression of the type holds a copy of it, and an array has a
    /// field per element (at most 65536 in all, `weft_lang::check::MAX_TYPE_MEMBERS`).
    pub fields: std::sync::Arc<[CField]>,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct CField {
    pub name: String,
    /// Bytes from the start of the struct; for a bit-field, of its storage unit (an
    /// integer of `ty`'s size).
    pub offset: u32,
    pub ty: Type,
    /// A bit-field (`unsigned int a:3`): its bits in the storage unit.
    pub bits: Option<BitField>,
}

/// Where a bit-field's bits sit in its storage unit, counted from the least
/// significant bit (x86-64 is little-endian: the first bit-field takes the low bits).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BitField {
    pub shift: u8,
    pub width: u8,
}

impl BitField {
    /// The field's value from its storage unit's value: its bits, zero-extended even
    /// for a signed type (as bpftrace reads them: 0.17 prints `int c:4` holding -1
    /// as 15).
    pub fn extract(self, unit: u64) -> u64 {
        let v = unit >> self.shift;
        match self.width {
            0 | 64.. => v,
            w => v & ((1u64 << w) - 1),
        }
    }
}

impl Type {
    pub const U64: Type = Type::Int {
        bits: 64,
        signed: false,
    };
    pub const I64: Type = Type::Int {
        bits: 64,
        signed: true,
    };

    /// Size in bytes when stored in a slot, a map key, a map value or an event.
    pub fn size(&self) -> u32 {
        match self {
            Type::Void => 0,
            Type::Int { bits, .. } => u32::from(*bits) / 8,
            Type::Bool => 1,
            Type::Str { cap } => *cap,
            Type::Buf { cap } => cap.saturating_add(4),
            Type::Tuple(fields) => layout(fields.iter()).1,
            Type::Record(fields) => layout(fields.iter().map(|(_, t)| t)).1,
            Type::USym | Type::ProbeName | Type::Ptr(_) | Type::Enum(_) => 8,
            Type::UStack { depth, .. } => depth.saturating_mul(8).saturating_add(8),
            Type::Timestamp => 16,
            Type::CStruct(s) => s.size,
            Type::Inet => INET_SIZE,
            Type::MacAddr => 6,
        }
    }

    /// Alignment in bytes (a power of two, at most 8).
    pub fn align(&self) -> u32 {
        match self {
            Type::Void | Type::Bool | Type::Str { .. } | Type::MacAddr => 1,
            Type::Int { bits, .. } => u32::from(*bits) / 8,
            Type::Buf { .. } => 4,
            Type::Tuple(fields) => fields.iter().map(Type::align).max().unwrap_or(1),
            Type::Record(fields) => fields.iter().map(|(_, t)| t.align()).max().unwrap_or(1),
            Type::USym
            | Type::ProbeName
            | Type::Ptr(_)
            | Type::UStack { .. }
            | Type::Timestamp
            | Type::Inet
            | Type::Enum(_) => 8,
            // As C lays it out: its strictest member (an array: its element's).
            Type::CStruct(s) => s.fields.iter().map(|f| f.ty.align()).max().unwrap_or(1),
        }
    }

    /// Byte offsets of the fields of a tuple or record (empty for other types).
    pub fn field_offsets(&self) -> Vec<u32> {
        match self {
            Type::Tuple(fields) => layout(fields.iter()).0,
            Type::Record(fields) => layout(fields.iter().map(|(_, t)| t)).0,
            _ => Vec::new(),
        }
    }

    /// True for types that live in a register (integers, bools, addresses).
    pub fn is_scalar(&self) -> bool {
        matches!(
            self,
            Type::Int { .. }
                | Type::Bool
                | Type::USym
                | Type::ProbeName
                | Type::Ptr(_)
                | Type::Enum(_)
        )
    }

    pub fn is_signed(&self) -> bool {
        matches!(self, Type::Int { signed: true, .. } | Type::Enum(_))
    }
}

/// Field offsets and total size (rounded up to the alignment) of a sequence of types.
/// Sizes saturate at `u32::MAX` (more than any frame may hold, so the front end
/// refuses the program) instead of wrapping to a small size.
fn layout<'a>(fields: impl Iterator<Item = &'a Type>) -> (Vec<u32>, u32) {
    let mut offsets = Vec::new();
    let mut off = 0u64;
    let mut max_align = 1u64;
    let sat = |v: u64| u32::try_from(v).unwrap_or(u32::MAX);
    for t in fields {
        let a = u64::from(t.align().max(1));
        max_align = max_align.max(a);
        off = off.div_ceil(a) * a;
        offsets.push(sat(off));
        off += u64::from(t.size());
    }
    (offsets, sat(off.div_ceil(max_align) * max_align))
}

impl fmt::Display for Type {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Type::Void => write!(f, "none"),
            Type::Int { bits, signed } => {
                write!(f, "{}int{}", if *signed { "" } else { "u" }, bits)
            }
            Type::Bool => write!(f, "bool"),
            Type::Str { cap } => write!(f, "string[{cap}]"),
            Type::Buf { cap } => write!(f, "buffer[{cap}]"),
            Type::Tuple(ts) => {
                write!(f, "(")?;
                for (i, t) in ts.iter().enumerate() {
                    if i > 0 {
                        write!(f, ",")?;
                    }
                    write!(f, "{t}")?;
                }
                write!(f, ")")
            }
            Type::Record(fs) => {
                write!(f, "(")?;
                for (i, (n, t)) in fs.iter().enumerate() {
                    if i > 0 {
                        write!(f, ",")?;
                    }
                    write!(f, "{n}={t}")?;
                }
                write!(f, ")")
            }
            Type::USym => write!(f, "usym"),
            Type::UStack { depth, .. } => write!(f, "ustack[{depth}]"),
            Type::ProbeName => write!(f, "probe"),
            Type::Timestamp => write!(f, "timestamp"),
            Type::Ptr(t) => write!(f, "{t} *"),
            // An array is named by its element type and length (`uint8[4]`).
            Type::CStruct(s) if s.name.ends_with(']') => write!(f, "{}", s.name),
            Type::CStruct(s) => write!(f, "struct {}", s.name),
            Type::Inet => write!(f, "inet"),
            Type::MacAddr => write!(f, "macaddr"),
            Type::Enum(e) if e.name.is_empty() => write!(f, "enum"),
            Type::Enum(e) => write!(f, "enum {}", e.name),
        }
    }
}

// ---------------------------------------------------------------------------------
// Program
// ---------------------------------------------------------------------------------

/// A checked, lowered program, ready for code generation.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Program {
    /// Maps, indexed by [`MapId`]. Order is the order of first appearance in the
    /// source, which is also the order bpftrace prints them in at exit.
    pub maps: Vec<MapDecl>,
    /// Format strings of `printf`, `time`, `strftime`, `system`, `cat`, indexed by
    /// [`FmtId`].
    pub formats: Vec<Format>,
    /// Probes in source order. A probe with several attach points shares one body.
    pub probes: Vec<Probe>,
    /// Full probe names for `probe` (the [`Type::ProbeName`] value indexes this),
    /// filled in by the front end for every attach point as written (wildcards are
    /// expanded later; the code generator appends expanded names and patches the
    /// constants).
    pub probe_names: Vec<String>,
    pub config: Config,
}

/// The largest width or precision a `printf` (`system`, `cat`) format may give, and
/// the most the widths and precisions of one format may add up to: the front end
/// refuses more, the printer clamps to it. (bpftrace has no limit: glibc pads to any
/// width up to `INT_MAX`; 65536 is also the largest `max_strlen`.)
pub const PRINTF_MAX_WIDTH: u32 = 65536;

/// Limits and options that shape code and memory layout.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// Default capacity of strings from `str()`, `comm`, `func` names (bpftrace: 64).
    pub strlen: u32,
    /// Maximum number of keys in one map (bpftrace: 4096).
    pub max_map_keys: u32,
    /// Maximum iterations of a `while` loop or `for` over a range.
    pub max_loop_iterations: u32,
    /// Maximum bytes of stack frame an advice body may use.
    pub max_frame: u32,
    /// Maximum bytes `cat()` prints of a file (bpftrace: 10240).
    pub max_cat_bytes: u32,
    /// `--unsafe` given: `system`, `signal` and writes to target memory are allowed.
    pub unsafe_ok: bool,
    /// Print every map when the session ends (bpftrace's `print_maps_on_exit`).
    pub print_maps_on_exit: bool,
    /// Stacks in `bpftrace` mode show each frame's source file and line, and the
    /// functions inlined there (bpftrace's `show_debug_info`; weft's default: off,
    /// so output stays that of bpftrace without it).
    pub show_debug_info: bool,
    /// What a probe on a function or USDT probe the binary does not have does
    /// (bpftrace's `missing_probes`).
    pub missing_probes: MissingProbes,
    /// Maps declared with their own number of keys (`let @a = hash(N)`): name, N.
    /// Others hold `max_map_keys`.
    pub map_keys: Vec<(String, u32)>,
}

impl Config {
    /// The number of keys map `name` holds.
    pub fn max_keys_of(&self, name: &str) -> u32 {
        self.map_keys
            .iter()
            .find(|(n, _)| n == name)
            .map_or(self.max_map_keys, |(_, k)| *k)
    }
}

/// bpftrace's `missing_probes`: a probe that names what its binary lacks is an error
/// (the default), is skipped with a warning, or is skipped silently.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum MissingProbes {
    #[default]
    Error,
    Warn,
    Ignore,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            strlen: 64,
            max_map_keys: 4096,
            max_loop_iterations: 1 << 20,
            max_frame: 4096,
            max_cat_bytes: 10240,
            unsafe_ok: false,
            print_maps_on_exit: true,
            show_debug_info: false,
            missing_probes: MissingProbes::Error,
            map_keys: Vec::new(),
        }
    }
}

/// Index into [`Program::maps`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MapId(pub u32);

/// Index into [`Program::formats`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FmtId(pub u32);

#[derive(Clone, Debug, PartialEq)]
pub struct MapDecl {
    /// Name including the `@` (`@` alone for the anonymous map).
    pub name: String,
    /// Key type: `None` for a map used without `[...]` (a "scalar" map); a single key
    /// type for `@m[k]`; a [`Type::Tuple`] for `@m[k1, k2]`.
    pub key: Option<Type>,
    pub value: MapValue,
}

/// Maps whose name starts with this are the front end's own (a sequence aspect's
/// instances and bound variables): never printed at exit.
pub const HIDDEN_MAP_PREFIX: &str = "@__seq_";
/// A group's members (`@__group_NAME[pid]`): hidden too, and inherited: a forked
/// child of a member gets its parent's entry inside `fork()`.
pub const GROUP_MAP_PREFIX: &str = "@__group_";
/// The maps that keep a control-flow pointcut's per-thread state (`cflow`): hidden
/// too.
pub const CFLOW_MAP_PREFIX: &str = "@__cflow_";

/// Maps the front end made for itself (sequences, groups, cflow): never printed.
pub fn is_hidden_map(name: &str) -> bool {
    name.starts_with(HIDDEN_MAP_PREFIX)
        || name.starts_with(GROUP_MAP_PREFIX)
        || name.starts_with(CFLOW_MAP_PREFIX)
}

/// Maps keyed by pid whose entry a forked child copies from its parent.
pub fn is_inherited_map(name: &str) -> bool {
    name.starts_with(GROUP_MAP_PREFIX)
}

/// The map an instruction reads or changes, if any.
pub fn map_of(inst: &Inst) -> Option<MapId> {
    Some(match inst {
        Inst::ThreadSum { map, .. }
        | Inst::MapLoad { map, .. }
        | Inst::MapStore { map, .. }
        | Inst::MapAgg { map, .. }
        | Inst::MapDelete { map, .. }
        | Inst::MapHasKey { map, .. }
        | Inst::MapLen { map, .. }
        | Inst::MapIterStart { map, .. }
        | Inst::MapIterNext { map, .. } => *map,
        Inst::Emit {
            kind:
                EventKind::PrintMap { map, .. } | EventKind::ClearMap(map) | EventKind::ZeroMap(map),
            ..
        } => *map,
        _ => return None,
    })
}

/// Maps each thread only ever touches at its own id: plain maps of 8-byte values
/// whose every use, in every probe, is a load, store or delete keyed by `tid` in
/// user space (`@start[tid] = nsecs` … `nsecs - @start[tid]` … `delete(@start[tid])`):
/// nothing iterates, counts, prints or clears them while the session runs, and no
/// kernel probe uses them. A thread's entry of such a map can live in the thread's
/// own slot, read and written without a lookup or an atomic operation (weft prints
/// them with the rest at exit).
pub fn thread_keyed_maps(prog: &Program) -> Vec<bool> {
    let mut ok: Vec<bool> = prog
        .maps
        .iter()
        .map(|m| {
            matches!(&m.value, MapValue::Plain(t) if t.size() == 8)
                && m.key.as_ref().is_some_and(|k| k.size() == 8)
        })
        .collect();
    for p in &prog.probes {
        let kernel = p.attach.iter().any(AttachPoint::runs_in_kernel);
        let code = &p.body.code;
        for (i, inst) in code.iter().enumerate() {
            let Some(m) = map_of(inst) else { continue };
            let Some(flag) = ok.get_mut(m.0 as usize) else {
                continue;
            };
            let key = match inst {
                Inst::MapLoad {
                    key: Some(k),
                    dst_place: None,
                    ..
                }
                | Inst::MapStore {
                    key: Some(k),
                    src_reg: Some(_),
                    src_place: None,
                    ..
                }
                | Inst::MapDelete { key: Some(k), .. } => Some(*k),
                _ => None,
            };
            if kernel || !key.is_some_and(|k| i > 0 && holds_tid(&p.body, &code[i - 1], k)) {
                *flag = false;
            }
        }
    }
    ok
}

/// Whether `prev` (the instruction before a map access keyed at `key`) stores the
/// thread's id there: `Store { key, r, 8 }` with `r` defined once, by `Ctx Tid`.
fn holds_tid(f: &Function, prev: &Inst, key: Place) -> bool {
    let Inst::Store {
        place,
        src,
        size: 8,
    } = prev
    else {
        return false;
    };
    if *place != key {
        return false;
    }
    let mut defs = f.code.iter().filter(|i| defines(i, *src));
    matches!(
        (defs.next(), defs.next()),
        (
            Some(Inst::Ctx {
                value: CtxValue::Tid,
                ..
            }),
            None
        )
    )
}

/// Whether `inst` writes register `r` (for [`holds_tid`]: any instruction with a
/// destination register counts, so an unknown one makes the answer "no").
fn defines(inst: &Inst, r: Reg) -> bool {
    match inst {
        Inst::Ctx { dst, .. }
        | Inst::Const { dst, .. }
        | Inst::Mov { dst, .. }
        | Inst::Binary { dst, .. }
        | Inst::Unary { dst, .. }
        | Inst::Extend { dst, .. }
        | Inst::ThreadSum { dst, .. }
        | Inst::SymbolAddr { dst, .. } => *dst == r,
        Inst::MapLoad { dst_reg, .. } => *dst_reg == Some(r),
        Inst::MapDelete { dst, .. } => *dst == Some(r),
        Inst::Store { .. }
        | Inst::Zero { .. }
        | Inst::MapStore { .. }
        | Inst::MapAgg { .. }
        | Inst::Label(_)
        | Inst::Jump(_)
        | Inst::Branch { .. }
        | Inst::Return
        | Inst::Emit { .. }
        | Inst::CountError(_) => false,
        // Anything else may write any register, as far as this check knows.
        _ => format!("{inst:?}").contains(&format!("Reg({})", r.0)),
    }
}

/// What a map stores per key.
#[derive(Clone, Debug, PartialEq)]
pub enum MapValue {
    /// `@m[k] = expr`: the last value written, shared by all threads.
    Plain(Type),
    /// Aggregations: one accumulator per thread, merged when read.
    Count,
    Sum {
        signed: bool,
    },
    Min {
        signed: bool,
    },
    Max {
        signed: bool,
    },
    Avg {
        signed: bool,
    },
    Stats {
        signed: bool,
    },
    /// Power-of-two histogram; `k` is bpftrace's second argument (0..=5).
    Hist {
        k: u8,
    },
    /// Linear histogram.
    Lhist {
        min: i64,
        max: i64,
        step: i64,
    },
    /// `tseries(v, interval, intervals[, agg])`: the last `intervals` intervals of
    /// `interval_ns` nanoseconds (wall clock), each holding one value.
    Tseries {
        interval_ns: u64,
        intervals: u32,
        agg: TseriesAgg,
        signed: bool,
    },
}

/// How a `tseries` interval combines the values written in it (its fourth argument).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TseriesAgg {
    /// No fourth argument: the last value written.
    Last,
    Avg,
    Max,
    Min,
    Sum,
}

impl TseriesAgg {
    /// The aggregation named by `tseries`'s fourth argument.
    pub fn from_name(name: &str) -> Option<TseriesAgg> {
        Some(match name {
            "avg" => TseriesAgg::Avg,
            "max" => TseriesAgg::Max,
            "min" => TseriesAgg::Min,
            "sum" => TseriesAgg::Sum,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            TseriesAgg::Last => "",
            TseriesAgg::Avg => "avg",
            TseriesAgg::Max => "max",
            TseriesAgg::Min => "min",
            TseriesAgg::Sum => "sum",
        }
    }
}

/// Most intervals of one `tseries` (each thread keeps 24 bytes per interval and key).
pub const TSERIES_MAX_INTERVALS: u32 = 1000;

impl MapValue {
    pub fn is_aggregation(&self) -> bool {
        !matches!(self, MapValue::Plain(_))
    }

    /// Size of one per-thread accumulator (or of the shared value for `Plain`).
    /// Layouts (all u64/i64 little-endian):
    /// * Count: `[count]`; Sum: `[sum]`
    /// * Min/Max: `[count, value]` (count > 0 when a value is present)
    /// * Avg/Stats: `[count, total, min, max]` (min/max only meaningful for Stats)
    /// * Hist: `[bucket; hist_buckets(k)]`; Lhist: `[bucket; lhist_buckets(..)]`
    /// * Tseries: `[value, meta, epoch; intervals]` (see `weft_abi::TSERIES_WORDS`)
    pub fn value_size(&self) -> u32 {
        match self {
            MapValue::Plain(t) => t.size().max(1),
            MapValue::Count | MapValue::Sum { .. } => 8,
            MapValue::Min { .. } | MapValue::Max { .. } => 16,
            MapValue::Avg { .. } | MapValue::Stats { .. } => 32,
            MapValue::Hist { k } => 8 * hist_buckets(*k),
            MapValue::Lhist { min, max, step } => 8 * lhist_buckets(*min, *max, *step),
            MapValue::Tseries { intervals, .. } => 24 * intervals,
        }
    }
}

/// Number of buckets of a `hist(v, k)` accumulator: bucket 0 holds negative values,
/// bucket 1 holds 0, then for k = 0 bucket 2 + i holds values in `[2^i, 2^(i+1))`;
/// with k > 0 each power of two is split into 2^k linear sub-buckets (bpftrace's
/// layout). Always `2 + (64 << k)` buckets, so any u64 has a bucket.
pub fn hist_buckets(k: u8) -> u32 {
    2 + (64u32 << k)
}

/// Number of buckets of an `lhist(min, max, step)` accumulator: one for values below
/// `min`, one per step, one for values at or above `max`.
pub fn lhist_buckets(min: i64, max: i64, step: i64) -> u32 {
    // In i128: `max - min + step - 1` overflows i64 near its bounds.
    let step = i128::from(step.max(1));
    let steps = ((i128::from(max) - i128::from(min)).max(0) + step - 1) / step;
    u32::try_from(steps + 2).unwrap_or(u32::MAX)
}

#[derive(Clone, Debug, PartialEq)]
pub struct Format {
    /// The format string exactly as written (escapes already decoded).
    pub text: String,
    /// Types of the arguments, in order; the event payload is a [`Type::Tuple`] of
    /// these.
    pub args: Vec<Type>,
    /// The conversions of `text` (parsed once, by [`Format::new`]).
    pub conversions: Vec<format::Conversion>,
    /// `errorf`/`warnf`: the formatted text is a message of this level from this
    /// place in the program (upstream prints `stdin:1:9-62: ERROR: text` on
    /// standard error); `None` for every other format.
    pub message: Option<Message>,
}

/// Where and how an `errorf`/`warnf` message is reported.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Message {
    pub level: MessageLevel,
    /// The program's name as upstream reports it (`stdin` for `-e` and standard
    /// input, else the file as given).
    pub file: String,
    /// 1-based line and columns of the call; `end_col` is one past its last
    /// character on its first line.
    pub line: u32,
    pub col: u32,
    pub end_col: u32,
    /// Lines printed under the location line: for a run-time warning, the source
    /// line and `~` under the statement, as upstream shows them; empty for
    /// `errorf`/`warnf`.
    pub context: Vec<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MessageLevel {
    Error,
    Warning,
}

impl Message {
    /// `stdin:1:9-62`, as upstream writes a location.
    pub fn location(&self) -> String {
        format!("{}:{}:{}-{}", self.file, self.line, self.col, self.end_col)
    }
}

impl Format {
    pub fn new(text: String, args: Vec<Type>) -> Format {
        let conversions = format::conversions(&text);
        Format {
            text,
            args,
            conversions,
            message: None,
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Probe {
    pub attach: Vec<AttachPoint>,
    pub body: Function,
    /// Added by the front end to keep an aspect's state (`cflow`'s entry and
    /// return probes), not written by the user: not counted in "Attached N
    /// probes", and woven at a function's real entry and return (never at a
    /// placeholder), so the program's advice at the same function runs after its
    /// entry and before its return.
    pub hidden: bool,
    /// Around advice (`around uprobe:BIN:FUNC`): the body runs in place of the
    /// function and decides what happens ([`Inst::AroundEnter`], [`Inst::Proceed`],
    /// [`Inst::AroundReturn`]). Its attach points are function entries.
    pub around: bool,
    /// A kernel probe that runs for every process even when the session traces
    /// some (`-p`/`-c`): SystemTap's `scheduler.cpu_on`, whose tracepoint fires in
    /// the context of the task leaving the CPU.
    pub system: bool,
}

/// Where a probe fires. Providers that later issues add (`call:`, `get:`, `set:`,
/// `tracepoint:`, `kernel:`, around/seq/cflow constructs) extend this enum.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum AttachPoint {
    Begin,
    End,
    /// Entry of a function, or `func+offset` when `offset` is nonzero. `func` may hold
    /// wildcards (`*`, `?`, `[...]`). `target` is a path or a library name (`libc`).
    Uprobe {
        target: String,
        func: String,
        offset: u64,
    },
    /// The code of a source line (`uprobe:BIN@FILE:LINE`): each address where the
    /// DWARF line table of `target` says the line's code starts (`file` is a file
    /// name or a path suffix). The advice runs there, before the line.
    SourceLine {
        target: String,
        file: String,
        line: u32,
    },
    /// Return of a function.
    Uretprobe {
        target: String,
        func: String,
    },
    /// Each call site of `func` in `target`'s code (`call:BIN:FUNC [within CALLER]`):
    /// the direct calls and tail jumps to the function, or to its PLT entry when it is
    /// a library function `target` calls. `func` and `within` (the calling functions,
    /// every one when `None`) may hold wildcards. The advice runs at the site, before
    /// the call.
    Call {
        target: String,
        func: String,
        within: Option<String>,
    },
    /// A USDT / SDT / WEFT_PROBE site. `provider` may be empty (any provider).
    Usdt {
        target: String,
        provider: String,
        name: String,
    },
    /// Runs in the weft process every `period_ns`.
    Interval {
        period_ns: u64,
    },
    /// Samples the target's threads `hz` times a second.
    Profile {
        hz: u64,
    },
    /// A kernel tracepoint (`tracepoint:CATEGORY:NAME`, no wildcards: the front end
    /// expands them). Its advice is compiled to eBPF and runs in the kernel
    /// (`weft-bpf`, `weft-kernel`); `args.FIELD` reads the event's record
    /// ([`Inst::EventField`] and friends).
    Tracepoint {
        category: String,
        name: String,
    },
    /// A data pointcut: advice on accesses to memory (`set:BIN:VAR`, `get:BIN:VAR`,
    /// `set:addr(@p, 8)`, `watchpoint:ADDR:LEN:MODE`). The advice runs in the
    /// accessing thread, after the access (`old`/`new`/`val` read the value).
    Data {
        place: DataPlace,
        access: DataAccess,
    },
}

/// What a data pointcut watches.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum DataPlace {
    /// A global or static of `target` by name, with an optional path into it
    /// (`counter`, `cfg.limit`, `table[3]`, as written after the name). Its
    /// address and size come from the symbol table and DWARF, in the engine.
    Var {
        target: String,
        var: String,
        /// `.field` / `[i]` steps as written (empty for the whole variable).
        path: String,
    },
    /// `addr(@map, SIZE)`: the address a key-less map holds, watched (again) each
    /// time weft sees the map's value change; nothing while it is 0.
    Map { map: String, size: u32 },
    /// An absolute address (`watchpoint:ADDR:LEN:MODE`).
    Addr { addr: u64, len: u8 },
}

/// Which accesses a data pointcut takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DataAccess {
    /// Writes (`set`, `watchpoint:...:w`).
    Write,
    /// Reads (`get`): accesses that leave the value unchanged (x86 debug registers
    /// cannot watch reads alone, see the engine's `data` resolver).
    Read,
    /// Reads and writes (`watchpoint:...:rw`).
    ReadWrite,
}

impl DataAccess {
    /// The form a `watchpoint:` mode takes (`w`, `r`, `rw`).
    pub fn mode(self) -> &'static str {
        match self {
            DataAccess::Write => "w",
            DataAccess::Read => "r",
            DataAccess::ReadWrite => "rw",
        }
    }
}

impl AttachPoint {
    /// True for probes whose advice runs inside the target process.
    pub fn runs_in_target(&self) -> bool {
        matches!(
            self,
            AttachPoint::Uprobe { .. }
                | AttachPoint::SourceLine { .. }
                | AttachPoint::Uretprobe { .. }
                | AttachPoint::Call { .. }
                | AttachPoint::Usdt { .. }
                | AttachPoint::Profile { .. }
                | AttachPoint::Data { .. }
        )
    }

    /// A function's entry (`uprobe`) or return (`uretprobe`): its binary, function
    /// pattern, offset in the function, and whether it is the return.
    pub fn function(&self) -> Option<(&str, &str, u64, bool)> {
        match self {
            AttachPoint::Uprobe {
                target,
                func,
                offset,
            } => Some((target, func, *offset, false)),
            AttachPoint::Uretprobe { target, func } => Some((target, func, 0, true)),
            _ => None,
        }
    }

    /// True for probes whose advice runs in the kernel (compiled to eBPF).
    pub fn runs_in_kernel(&self) -> bool {
        matches!(self, AttachPoint::Tracepoint { .. })
    }
}

impl fmt::Display for AttachPoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AttachPoint::Begin => write!(f, "BEGIN"),
            AttachPoint::End => write!(f, "END"),
            AttachPoint::Uprobe {
                target,
                func,
                offset: 0,
            } => write!(f, "uprobe:{target}:{func}"),
            AttachPoint::Uprobe {
                target,
                func,
                offset,
            } => {
                write!(f, "uprobe:{target}:{func}+{offset}")
            }
            AttachPoint::SourceLine { target, file, line } => {
                write!(f, "uprobe:{target}@{file}:{line}")
            }
            AttachPoint::Uretprobe { target, func } => write!(f, "uretprobe:{target}:{func}"),
            AttachPoint::Call {
                target,
                func,
                within,
            } => {
                write!(f, "call:{target}:{func}")?;
                match within {
                    Some(w) => write!(f, " within {w}"),
                    None => Ok(()),
                }
            }
            AttachPoint::Usdt {
                target,
                provider,
                name,
            } if provider.is_empty() => {
                write!(f, "usdt:{target}:{name}")
            }
            AttachPoint::Usdt {
                target,
                provider,
                name,
            } => write!(f, "usdt:{target}:{provider}:{name}"),
            AttachPoint::Interval { period_ns } => write!(f, "interval:ns:{period_ns}"),
            AttachPoint::Profile { hz } => write!(f, "profile:hz:{hz}"),
            AttachPoint::Tracepoint { category, name } => {
                write!(f, "tracepoint:{category}:{name}")
            }
            AttachPoint::Data { place, access } => {
                let kind = if *access == DataAccess::Write {
                    "set"
                } else {
                    "get"
                };
                match place {
                    DataPlace::Var { target, var, path } => {
                        write!(f, "{kind}:{target}:{var}{path}")
                    }
                    DataPlace::Map { map, size } => write!(f, "{kind}:addr({map}, {size})"),
                    DataPlace::Addr { addr, len } => {
                        write!(f, "watchpoint:{addr:#x}:{len}:{}", access.mode())
                    }
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------
// Functions and instructions
// ---------------------------------------------------------------------------------

/// A virtual register holding a 64-bit integer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Reg(pub u32);

/// A byte array in the advice's frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Slot(pub u32);

/// A jump target.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Label(pub u32);

/// A place in a slot: `(slot, byte offset)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Place {
    pub slot: Slot,
    pub off: u32,
}

impl Place {
    pub fn new(slot: Slot, off: u32) -> Place {
        Place { slot, off }
    }
    pub fn at(self, extra: u32) -> Place {
        Place {
            slot: self.slot,
            off: self.off + extra,
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Function {
    /// Number of registers used (`Reg(0)..Reg(regs)`).
    pub regs: u32,
    /// Sizes in bytes of the slots (`Slot(i)` has `slots[i]` bytes, 8-byte aligned).
    pub slots: Vec<u32>,
    /// Number of labels used (`Label(0)..Label(labels)`).
    pub labels: u32,
    pub code: Vec<Inst>,
}

/// Binary operators on 64-bit registers. Comparisons yield 0 or 1.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BinOp {
    Add,
    Sub,
    Mul,
    /// Division and remainder by zero yield 1 (upstream bpftrace's result) and count
    /// [`ErrorKind::DivZero`].
    DivS,
    DivU,
    ModS,
    ModU,
    And,
    Or,
    Xor,
    Shl,
    ShrS,
    ShrU,
    Eq,
    Ne,
    LtS,
    LtU,
    LeS,
    LeU,
    GtS,
    GtU,
    GeS,
    GeU,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum UnOp {
    /// Two's complement negation.
    Neg,
    /// Bitwise not (`~`).
    Not,
    /// Logical not (`!`): 1 if zero, else 0.
    LNot,
    /// Byte order reversed in the low `bits` (16, 32 or 64) bits; the result is
    /// zero-extended.
    Bswap(u8),
}

/// [`CtxValue::ThreadRusage`]'s counters (the runtime's helper reads them).
pub use weft_abi::{
    RUSAGE_CONTEXT_SWITCHES, RUSAGE_FAULTS, RUSAGE_MAJOR_FAULTS, RUSAGE_MINOR_FAULTS,
};

/// Values from the probe's context, read into a register.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CtxValue {
    /// Integer argument `n` of the probed function per the SysV ABI (0..=5 in
    /// registers, then on the stack at entry `rsp + 8 * (n - 5)`); for a USDT probe,
    /// the n-th note argument.
    Arg(u8),
    /// Return value (`rax`) in a return probe.
    Retval,
    /// A machine register at the probe site (`reg("rsp")`).
    Reg(MachineReg),
    /// Address of the probed function (entry address, also in return probes); prints
    /// as `func` does when typed [`Type::USym`].
    FuncAddr,
    /// Address where the probe fired (`reg("ip")`).
    Ip,
    /// The word at the site's rsp: at a function's entry, the return address the
    /// call pushed (read directly, not fault-tolerantly: rsp points into the
    /// thread's stack). For `cflow_strict`'s caller test.
    ReturnAddress,
    Pid,
    Tid,
    Uid,
    Gid,
    /// CLOCK_MONOTONIC nanoseconds.
    Nsecs,
    /// CLOCK_REALTIME nanoseconds (for `time`/`strftime`).
    RealtimeNsecs,
    /// The thread's CPU time in nanoseconds (`__weft_cputime`, for `weft fperf -e
    /// cputime`: a system call a read).
    ThreadCpuTime,
    /// One of the thread's resource counters, a `weft_abi::RUSAGE_*` value
    /// (`__weft_faults`, `__weft_minflt`, `__weft_majflt`, `__weft_csw`, for `weft
    /// fperf -e page-faults`...: a system call a read).
    ThreadRusage(u8),
    /// Wait until weft has armed the `set:addr(@map, N)` watches at the address
    /// just stored in such a map (the lowering adds it after each such store in
    /// advice that runs in the target): 1 when armed in time, else 0.
    WatchBind,
    /// Nanoseconds since the program started.
    Elapsed,
    Cpu,
    /// The NUMA node of the CPU the thread runs on (`numaid`).
    NumaId,
    /// Pid of the command launched with `-c`, else 0.
    Cpid,
    /// A pseudo-random u32.
    Rand,
    /// The probe that fired, as an index into [`Program::probe_names`].
    ProbeId,
    /// In a data probe: the value before the write (`old`).
    DataOld,
    /// In a data probe: the value after the access (`new`, `val`).
    DataNew,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MachineReg {
    Rax,
    Rbx,
    Rcx,
    Rdx,
    Rsi,
    Rdi,
    Rbp,
    Rsp,
    R8,
    R9,
    R10,
    R11,
    R12,
    R13,
    R14,
    R15,
    Rip,
    Flags,
}

impl MachineReg {
    /// The register of integer argument `index` (System V AMD64: rdi, rsi, rdx,
    /// rcx, r8, r9); `None` past the sixth.
    pub fn arg(index: u8) -> Option<MachineReg> {
        const ARGS: [MachineReg; 6] = [
            MachineReg::Rdi,
            MachineReg::Rsi,
            MachineReg::Rdx,
            MachineReg::Rcx,
            MachineReg::R8,
            MachineReg::R9,
        ];
        ARGS.get(usize::from(index)).copied()
    }
}

/// An aggregation update.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AggOp {
    Count,
    Sum(Reg),
    Min(Reg),
    Max(Reg),
    Avg(Reg),
    Stats(Reg),
    Hist(Reg),
    Lhist(Reg),
    Tseries(Reg),
}

/// Asynchronous actions; each becomes one record in the thread's event ring, handled
/// by weft in order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EventKind {
    /// `printf(fmt, args...)`: payload is the tuple of the format's args. Also
    /// `errorf`/`warnf`, whose format carries a [`Message`].
    Printf(FmtId),
    /// `system(fmt, args...)` (needs `--unsafe`).
    System(FmtId),
    /// `cat(fmt, args...)`.
    Cat(FmtId),
    /// `time(fmt)`: payload empty; weft prints local time with the format.
    Time(FmtId),
    /// `join(array[, sep])`: payload is the strings read, a tuple of `Str` fields; the
    /// separator is format `FmtId`'s text.
    Join(FmtId),
    /// `print(@map[, top[, div]])`.
    PrintMap { map: MapId, top: u32, div: u32 },
    /// `print(value)`: payload is the value; its type is `Program::formats[fmt].args[0]`
    /// (the front end registers a format with empty text for it).
    PrintValue(FmtId),
    /// `clear(@map)`.
    ClearMap(MapId),
    /// `zero(@map)`.
    ZeroMap(MapId),
    /// `exit()`: weft stops after the events before this one.
    Exit,
    /// The probed function was entered (`weft record`): payload is the arguments
    /// asked for, 8 bytes each; the site comes from the frame.
    FuncEntry,
    /// The probed function returned (`weft record`): no payload; the site comes from
    /// the frame, the return value from the registers.
    FuncExit,
}

impl EventKind {
    /// The record's header fields for this event, as every code generator writes
    /// them: `(kind, id, arg0 | arg1 << 32)` (`weft_abi::EVENT_*`). `None` for
    /// function entry and exit, whose id (the site) and argument (the return value)
    /// come from the frame, not the program.
    pub fn record(self) -> Option<(u32, u32, u64)> {
        use weft_abi::*;
        Some(match self {
            EventKind::Printf(f) => (EVENT_PRINTF, f.0, 0),
            EventKind::System(f) => (EVENT_SYSTEM, f.0, 0),
            EventKind::Cat(f) => (EVENT_CAT, f.0, 0),
            EventKind::Time(f) => (EVENT_TIME, f.0, 0),
            EventKind::Join(f) => (EVENT_JOIN, f.0, 0),
            EventKind::PrintMap { map, top, div } => (
                EVENT_PRINT_MAP,
                map.0,
                u64::from(top) | (u64::from(div) << 32),
            ),
            EventKind::PrintValue(f) => (EVENT_PRINT_VALUE, f.0, 0),
            EventKind::ClearMap(m) => (EVENT_CLEAR_MAP, m.0, 0),
            EventKind::ZeroMap(m) => (EVENT_ZERO_MAP, m.0, 0),
            EventKind::Exit => (EVENT_EXIT, 0, 0),
            EventKind::FuncEntry | EventKind::FuncExit => return None,
        })
    }
}

/// Error counters that advice may bump; reported by weft at exit when nonzero.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum ErrorKind {
    /// A read of target memory faulted.
    ReadFault = 0,
    /// Division or remainder by zero.
    DivZero = 1,
    /// A map was full; the update was dropped.
    MapFull = 2,
    /// A loop hit its iteration bound.
    LoopBound = 3,
    /// The event ring was full; the event was dropped.
    EventLost = 4,
    /// An address stored for a `set:addr(@map, N)` pointcut was not watched
    /// within `weft_abi::WATCH_BIND_WAIT_NS`: accesses right after may be missed.
    WatchLate = 5,
}

/// One instruction. `dst` is written; other registers and places are read.
#[derive(Clone, Debug, PartialEq)]
pub enum Inst {
    Label(Label),
    Jump(Label),
    /// Jump to `if_true` when `cond != 0`, else to `if_false`.
    Branch {
        cond: Reg,
        if_true: Label,
        if_false: Label,
    },
    /// End the advice.
    Return,

    /// Around advice whose predicate held: from here the call is the advice's (the
    /// function runs only if [`Inst::Proceed`] calls it; the caller gets the value
    /// of [`Inst::AroundReturn`], else the original's, else rax as it was: nothing,
    /// as a void function returns).
    AroundEnter,
    /// Around advice: call the original function with the arguments it was called
    /// with, `args` replacing the first ones (`proceed(arg0, 42)`); its return value
    /// into `dst`. At most once per call: a second `proceed` returns the first's value.
    Proceed {
        dst: Reg,
        args: Vec<Reg>,
    },
    /// Around advice: the value the caller gets (`return EXPR`).
    AroundReturn {
        value: Reg,
    },
    /// Return probe: replace the function's return value (`override(EXPR)`).
    Override {
        value: Reg,
    },
    /// Entry advice: the function receives `value` as its argument `index` (0 to
    /// 5, the integer argument registers). What around advice that ends by
    /// proceeding with new arguments (`...; return proceed(arg0 + 1);`) is woven
    /// as: it runs before the function, which then runs with them.
    SetArg {
        index: u8,
        value: Reg,
    },
    /// `set` probe: the value the watched bytes take instead of what the access
    /// wrote (`new = EXPR`, `--unsafe`); `new` reads it from then on.
    SetDataNew {
        value: Reg,
    },

    Const {
        dst: Reg,
        value: i64,
    },
    Mov {
        dst: Reg,
        src: Reg,
    },
    Binary {
        op: BinOp,
        dst: Reg,
        a: Reg,
        b: Reg,
    },
    Unary {
        op: UnOp,
        dst: Reg,
        a: Reg,
    },
    /// Truncate `src` to `bits` and sign- or zero-extend back to 64 bits.
    Extend {
        dst: Reg,
        src: Reg,
        bits: u8,
        signed: bool,
    },
    Ctx {
        dst: Reg,
        value: CtxValue,
    },
    /// Read `size` (1, 2, 4, 8) bytes of target memory at `addr` and extend.
    /// On a fault, `dst = 0` and [`ErrorKind::ReadFault`] is counted.
    Load {
        dst: Reg,
        addr: Reg,
        size: u8,
        signed: bool,
    },
    /// Bump an error counter (used by the front end for loop bounds).
    CountError(ErrorKind),

    /// A field of the kernel event's record (a tracepoint's `args.FIELD`, kernel
    /// probes only): `size` (1, 2, 4, 8) bytes at byte `off` of the record, extended.
    EventField {
        dst: Reg,
        off: u32,
        size: u8,
        signed: bool,
    },
    /// `len` bytes of the kernel event's record at `off` into `dst` (a `char[N]`
    /// field, an array).
    EventBytes {
        dst: Place,
        off: u32,
        len: u32,
    },
    /// A `__data_loc` field of the kernel event's record (a string the kernel stores
    /// after the fixed fields): the u32 at `off` holds the data's offset in the
    /// record (low 16 bits) and its length (high 16 bits). At most `cap - 1` bytes
    /// are copied into `dst`, NUL-padded.
    EventDataLoc {
        dst: Place,
        off: u32,
        cap: u32,
    },

    /// Store the low `size` bytes of `src` at `place`.
    Store {
        place: Place,
        src: Reg,
        size: u8,
    },
    /// Load `size` bytes from `place`, extended to 64 bits.
    LoadSlot {
        dst: Reg,
        place: Place,
        size: u8,
        signed: bool,
    },
    /// Copy `len` bytes between places (they do not overlap).
    Copy {
        dst: Place,
        src: Place,
        len: u32,
    },
    /// Fill `len` bytes with zero.
    Zero {
        place: Place,
        len: u32,
    },
    /// Write constant bytes (string literals: the bytes then NUL padding up to `len`).
    SetBytes {
        place: Place,
        bytes: Vec<u8>,
        len: u32,
    },
    /// Write the address of a place into a register (for pointers to frame values,
    /// e.g. to pass to `Load`; rarely needed).
    AddrOf {
        dst: Reg,
        place: Place,
    },

    /// `str(addr[, max])`: copy a NUL-terminated string of at most `cap - 1` bytes
    /// (and at most `max` bytes when given) from the target into `dst` (cap bytes,
    /// NUL-padded). A NULL or faulting address yields the bytes read so far and counts
    /// a read fault.
    ReadStr {
        dst: Place,
        addr: Reg,
        max: Option<Reg>,
        cap: u32,
    },
    /// `buf(addr, len)`: `dst` gets `{len: u32, bytes}`; at most `cap` bytes.
    ReadBuf {
        dst: Place,
        addr: Reg,
        len: Reg,
        cap: u32,
    },
    /// `comm` into a `Str` of `cap` bytes.
    Comm {
        dst: Place,
        cap: u32,
    },
    /// `pcomm` (the process's name: its main thread's `comm`) into a `Str` of `cap`
    /// bytes.
    PComm {
        dst: Place,
        cap: u32,
    },
    /// The name of the site's function into a `Str` of `cap` bytes: the probed
    /// function, or at a call site (`call:`) the calling function (`caller`).
    FuncName {
        dst: Place,
        cap: u32,
    },
    /// Compare two strings of at most `len` bytes (stopping at NUL): `dst = 1` when
    /// equal, else 0.
    StrEq {
        dst: Reg,
        a: Place,
        b: Place,
        len: u32,
    },
    /// Compare the first `len` bytes of two places: `dst = 1` when equal.
    BytesEq {
        dst: Reg,
        a: Place,
        b: Place,
        len: u32,
    },
    /// `strncmp` as bpftrace defines it: `dst` = 0 when the first `len` bytes (up to
    /// a NUL) are equal, 1 otherwise (not an ordering: bpftrace returns 1 both ways).
    StrCmp {
        dst: Reg,
        a: Place,
        b: Place,
        len: u32,
    },
    /// Order two strings of at most `len` bytes (stopping at NUL), bytewise: `dst` =
    /// -1, 0 or 1 (`weft stap`'s sorted `foreach` on a string).
    StrOrder {
        dst: Reg,
        a: Place,
        b: Place,
        len: u32,
    },
    /// `strcontains(a, b)`: `dst = 1` when b occurs in a.
    StrContains {
        dst: Reg,
        a: Place,
        b: Place,
        len: u32,
    },
    /// Format an integer in decimal into a `Str` of `cap` bytes.
    IntToStr {
        dst: Place,
        src: Reg,
        signed: bool,
        cap: u32,
    },
    /// Walk the user stack with frame pointers from the probe site into `dst`
    /// (`UStack` layout, `depth` entries at most).
    UStack {
        dst: Place,
        depth: u32,
    },
    /// A symbol's address (`uaddr("symbol")`), or its end (the code range of a
    /// `cflow_strict` element): resolved by the code generator to a constant.
    SymbolAddr {
        dst: Reg,
        symbol: SymbolRef,
    },
    /// This thread's own accumulator of a `sum()` map without keys, not the merged
    /// value of every thread that [`Inst::MapLoad`] gives: per-thread state for
    /// one load (the counters of `cflow`). 0 until the thread adds to it.
    ThreadSum {
        dst: Reg,
        map: MapId,
    },

    /// Read a map value: for scalar value types into `dst_reg`; for other plain value
    /// types, into `dst_place` (`value.size()` bytes). Absent keys read as zero. For
    /// aggregations (`@c` where `@c = count()`), reads the merged integer value
    /// (count, sum, min, max, avg).
    MapLoad {
        map: MapId,
        key: Option<Place>,
        dst_reg: Option<Reg>,
        dst_place: Option<Place>,
    },
    /// `@m[key] = value` for a plain map: from `src_reg` for scalars, else `src_place`.
    MapStore {
        map: MapId,
        key: Option<Place>,
        src_reg: Option<Reg>,
        src_place: Option<Place>,
    },
    /// Aggregation update on this thread's accumulator.
    MapAgg {
        map: MapId,
        key: Option<Place>,
        op: AggOp,
    },
    /// `delete(@m[key])` (or the whole scalar map when `key` is None); `dst` (if any)
    /// gets 1 when an entry was deleted.
    MapDelete {
        map: MapId,
        key: Option<Place>,
        dst: Option<Reg>,
    },
    /// `has_key(@m, key)` / membership.
    MapHasKey {
        dst: Reg,
        map: MapId,
        key: Place,
    },
    /// `len(@m)`.
    MapLen {
        dst: Reg,
        map: MapId,
    },
    /// Start iterating a map: `it` gets an opaque cursor.
    MapIterStart {
        it: Reg,
        map: MapId,
    },
    /// Advance: `found = 1` and the key/value written (value as for `MapLoad`) when
    /// there is another entry; else `found = 0`. The cursor is updated in place.
    MapIterNext {
        found: Reg,
        it: Reg,
        map: MapId,
        key: Option<Place>,
        dst_reg: Option<Reg>,
        dst_place: Option<Place>,
    },

    /// Send an event; the payload is `len` bytes at `payload` (None: empty payload).
    Emit {
        kind: EventKind,
        payload: Option<Place>,
        len: u32,
    },
    /// `signal(sig)` to the current thread (needs `--unsafe`).
    Signal {
        sig: Reg,
    },
    /// Store the low `size` bytes of `src` into target memory at `addr` (needs
    /// `--unsafe`); faults are counted.
    StoreTarget {
        addr: Reg,
        src: Reg,
        size: u8,
    },
}

/// A symbol of the target for [`Inst::SymbolAddr`].
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SymbolRef {
    pub name: String,
    /// The binary as an attach point names it (`./app`, `/usr/bin/app`, `libc`);
    /// `None`: the binary of the probe's own attach point (`uaddr`), else the
    /// program.
    pub module: Option<String>,
    /// The address just past the symbol's last byte (its start plus its size)
    /// instead of its start.
    pub end: bool,
}

impl SymbolRef {
    /// `uaddr("name")`: the start of `name` in the probe's own binary.
    pub fn named(name: impl Into<String>) -> SymbolRef {
        SymbolRef {
            name: name.into(),
            module: None,
            end: false,
        }
    }
}

impl Function {
    pub fn new_reg(&mut self) -> Reg {
        self.regs += 1;
        Reg(self.regs - 1)
    }
    pub fn new_slot(&mut self, size: u32) -> Slot {
        self.slots.push(size.div_ceil(8).saturating_mul(8));
        Slot(self.slots.len() as u32 - 1)
    }
    pub fn new_label(&mut self) -> Label {
        self.labels += 1;
        Label(self.labels - 1)
    }
    pub fn push(&mut self, inst: Inst) {
        self.code.push(inst);
    }
    /// Total frame bytes needed by the slots.
    pub fn frame_size(&self) -> u32 {
        // Saturating: a sum that wrapped would pass the front end's frame limit.
        self.slots.iter().fold(0, |a, &s| a.saturating_add(s))
    }
}

// ---------------------------------------------------------------------------------
// Dumping (`weft trace -d program`)
// ---------------------------------------------------------------------------------

impl fmt::Display for Reg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "r{}", self.0)
    }
}
impl fmt::Display for Label {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "L{}", self.0)
    }
}
impl fmt::Display for Place {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "s{}+{}", self.slot.0, self.off)
    }
}

impl fmt::Display for Program {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, m) in self.maps.iter().enumerate() {
            let key = m.key.as_ref().map(|k| format!("[{k}]")).unwrap_or_default();
            writeln!(f, "map {i} {}{key}: {:?}", m.name, m.value)?;
        }
        for (i, fm) in self.formats.iter().enumerate() {
            let args: Vec<String> = fm.args.iter().map(|t| t.to_string()).collect();
            writeln!(f, "fmt {i} {:?} ({})", fm.text, args.join(", "))?;
        }
        for p in &self.probes {
            let names: Vec<String> = p.attach.iter().map(|a| a.to_string()).collect();
            writeln!(
                f,
                "probe {} (regs {}, slots {:?})",
                names.join(", "),
                p.body.regs,
                p.body.slots
            )?;
            for inst in &p.body.code {
                match inst {
                    Inst::Label(l) => writeln!(f, "  {l}:")?,
                    other => writeln!(f, "    {other:?}")?,
                }
            }
        }
        Ok(())
    }
}

/// Whether `f` assigns `new` ([`Inst::SetDataNew`]): its data pointcut's mechanism
/// then writes the value back.
pub fn writes_data_new(f: &Function) -> bool {
    f.code.iter().any(|i| matches!(i, Inst::SetDataNew { .. }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tuple_layout_is_natural() {
        let t = Type::Tuple(vec![
            Type::Int {
                bits: 8,
                signed: false,
            },
            Type::U64,
            Type::Str { cap: 5 },
            Type::Int {
                bits: 32,
                signed: true,
            },
        ]);
        assert_eq!(t.field_offsets(), vec![0, 8, 16, 24]);
        assert_eq!(t.size(), 32);
        assert_eq!(t.align(), 8);
    }

    #[test]
    fn lhist_bucket_count() {
        // lhist(x, 0, 100, 10): <0, 10 steps, >=100
        assert_eq!(lhist_buckets(0, 100, 10), 12);
        assert_eq!(lhist_buckets(0, 95, 10), 12);
        // Bounds near i64::MAX (issue 24): the rounding up overflowed.
        assert_eq!(lhist_buckets(0, i64::MAX, i64::MAX), 3);
        assert_eq!(lhist_buckets(0, i64::MAX - 1, i64::MAX - 1000), 4);
        assert_eq!(lhist_buckets(1, i64::MAX, 1 << 62), 4);
    }

    /// Sizes saturate instead of wrapping (issue 24): a tuple of 65536 strings of 65536
    /// bytes is 4 GiB, which wrapped to 0, and so did the frame holding it.
    #[test]
    fn sizes_saturate() {
        let t = Type::Tuple(vec![Type::Str { cap: 65536 }; 65536]);
        assert_eq!(t.size(), u32::MAX);
        let mut f = Function::default();
        f.new_slot(u32::MAX);
        f.new_slot(1 << 31);
        f.new_slot(1 << 31);
        assert_eq!(f.frame_size(), u32::MAX);
    }
}
