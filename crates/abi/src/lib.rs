//! The binary contract between `weft` (outside the target) and the agent (inside it).
//!
//! Three things cross the boundary:
//!
//! 1. **The shared data segment** (a memfd created by weft, mapped by both): a
//!    [`ShmHeader`], then map descriptors ([`MapDesc`]) and key tables, the site table
//!    ([`SiteDesc`]) with its address hash, and one [`ThreadSlot`] per target thread
//!    (event ring + per-thread aggregation accumulators). Offsets, never pointers, so
//!    each process maps it where it likes.
//! 2. **Code regions** (memfds created by the agent near the code it must reach within
//!    ±2 GiB, mapped RX in the target and RW in weft): trampolines and compiled advice.
//! 3. **Control messages** on a `SOCK_SEQPACKET` Unix socket ([`msg::Msg`]), with
//!    file descriptors passed as `SCM_RIGHTS`.
//!
//! Advice runs as `extern "C" fn(*mut Frame)`; [`Frame`] is built on the stack by the
//! trampoline. Everything here is `#[repr(C)]` and versioned by [`VERSION`].

#![no_std]

#[cfg(test)]
extern crate std;

use core::sync::atomic::{AtomicU32, AtomicU64};

pub const SHM_MAGIC: u64 = u64::from_le_bytes(*b"WEFTSHM1");
/// Bumped whenever any layout or message in this crate changes.
pub const VERSION: u32 = 22;

/// Number of error counters per thread (indexed by `weft_ir::ErrorKind as usize`).
pub const ERROR_KINDS: usize = 8;

// ---------------------------------------------------------------------------------
// Shared data segment
// ---------------------------------------------------------------------------------

#[repr(C)]
pub struct ShmHeader {
    pub magic: u64,
    pub version: u32,
    /// Process id of the target (written by weft).
    pub target_pid: u32,
    pub total_size: u64,

    /// Offset of the first of `slot_count` [`ThreadSlot`]s; slots are
    /// `thread_slot_size` apart. Slot [`RETIRED_SLOT`] holds what threads that exited
    /// left, [`WEFT_SLOT`] is weft's own; the others go to the target's threads and
    /// are reused (see [`ThreadSlot`]).
    pub threads_off: u64,
    pub thread_slot_size: u64,
    pub slot_count: u32,
    /// Slots `[0, slots_used)` have been handed out at least once: readers iterate
    /// these. A slot never used before is taken by bumping it (compare-and-swap,
    /// never beyond `slot_count`).
    pub slots_used: AtomicU32,
    /// Offset and size of the event ring inside each thread slot.
    pub ring_off: u64,
    pub ring_size: u64,
    /// Offset of the aggregation area inside each thread slot.
    pub agg_off: u64,

    /// Offset of `map_count` [`MapDesc`]s.
    pub maps_off: u64,
    pub map_count: u32,

    /// Site table: `max_sites` [`SiteDesc`]s at `sites_off`; an open-addressing hash
    /// of `site_hash_cap` u32 (site index + 1, 0 = empty) keyed by `SiteDesc::addr`,
    /// used by the int3 handler.
    pub max_sites: u32,
    pub sites_off: u64,
    pub site_count: AtomicU32,
    pub site_hash_cap: u32,
    pub site_hash_off: u64,

    /// Set by advice (`exit()`), read by weft.
    pub exit_requested: AtomicU32,
    /// [`SessionState`] as u32.
    pub session_state: AtomicU32,
    /// CLOCK_MONOTONIC at program start (for `elapsed`).
    pub start_nsecs: u64,
    /// Pid of the command launched with `-c`, else 0.
    pub cpid: u64,
    /// Real uid and gid of the target (for `uid`/`gid`).
    pub uid: u64,
    pub gid: u64,
    /// Hits on threads that found no free thread slot (their advice did not run):
    /// `max_live` threads held one, or no slot was free.
    pub threads_dropped: AtomicU64,
    /// Most target threads holding a slot at once (`--max-threads`).
    pub max_live: u32,
    /// Target threads holding a slot now (raised by a claim, lowered when the agent
    /// finds the thread gone), and the most there ever were.
    pub threads_live: AtomicU32,
    pub threads_live_peak: AtomicU32,
    /// Odd while weft folds drained slots into the retired slot: readers and
    /// deleters of aggregations in advice retry across a fold (a seqlock), so a
    /// slot's counts are never seen in neither place or missed by a delete.
    pub retire_seq: AtomicU32,
    /// Free-slot queue (see [`ThreadSlot`]): `slot_count` u32 slot indices at
    /// `free_off`, a ring with one producer (weft, `free_tail`) and many consumers
    /// (the agent's threads, `free_head`, taken by compare-and-swap).
    pub free_off: u64,
    pub free_head: AtomicU64,
    pub free_tail: AtomicU64,
    /// Slots weft folded into the retired slot and freed.
    pub threads_retired: AtomicU64,
    /// Hits on threads the agent had no per-thread state for (its pool of
    /// [`AGENT_POOL_THREADS`] was exhausted): their advice did not run.
    pub pool_dropped: AtomicU64,
    /// Errors counted outside any thread slot.
    pub global_errors: [AtomicU64; ERROR_KINDS],
    /// Unwind tables for `ustack` (see [`UnwindProc`]): `unwind_size` bytes at
    /// `unwind_off` (0 when the program takes no stack), starting with
    /// [`MAX_UNWIND_PROCS`] directory entries; weft alone writes it, bumping
    /// `unwind_used` (bytes taken, directory included).
    pub unwind_off: u64,
    pub unwind_size: u64,
    pub unwind_used: AtomicU64,
    /// `nsecs` without a system call: see [`TscClock`].
    pub clock: TscClock,
    /// Spins a producer waits for weft to free room in a full ring before the event
    /// is dropped (0: drop at once, as bpftrace does). `weft record` sets it, so
    /// nothing is lost while weft keeps up; see [`ThreadSlot::ring_stalled`].
    pub ring_wait_spins: u64,
    /// `set:addr(@map, N)` bindings: advice that stored an address in such a map
    /// takes a number by raising `watch_bind_req` and waits until weft, having
    /// armed the watches at the maps' addresses as they were when it looked,
    /// raises `watch_bind_done` to the request it saw (see [`Helper::WatchBind`]).
    pub watch_bind_req: AtomicU64,
    pub watch_bind_done: AtomicU64,
}

/// CLOCK_MONOTONIC read from the TSC: `base_ns + ((tsc - base_tsc) * mult) >> 32`,
/// the product signed and 128 bits wide. weft calibrates it against the vDSO clock
/// when it creates the segment and again about every second, continuously (the new
/// line starts where the old one is) and slewed so that it converges on the system
/// clock: it never goes back. `mult` is 0 when the TSC is not usable (no invariant
/// TSC): readers then call `clock_gettime`. A seqlock: weft makes `seq` odd, writes
/// the three words, makes it even again; a reader retries while `seq` is odd or
/// changed across its reads.
#[repr(C)]
pub struct TscClock {
    pub seq: AtomicU64,
    pub mult: AtomicU64,
    pub base_tsc: AtomicU64,
    pub base_ns: AtomicU64,
}

/// Fixed point of [`TscClock::mult`]: nanoseconds per tick × 2^32.
pub const TSC_SHIFT: u32 = 32;

// ---------------------------------------------------------------------------------
// Unwind tables (`ustack` without frame pointers)
// ---------------------------------------------------------------------------------

/// Processes with an unwind table in one segment (a directory entry each).
pub const MAX_UNWIND_PROCS: usize = 64;

/// One process's unwind table: `count` [`UnwindRow`]s at `rows_off` (from the
/// segment's base), sorted by address. weft writes the rows, then `rows_off` and
/// `count`, then publishes with a release store of `pid` (0: free entry); the rows
/// never change once published (a new table takes new rows). Forked children
/// (same address space) get an entry pointing at their parent's rows.
#[repr(C)]
pub struct UnwindProc {
    /// The process (tgid) the table is for, 0 when the entry is free.
    pub pid: AtomicU32,
    pub count: u32,
    pub rows_off: u64,
}

/// The CFA (canonical frame address: `rsp` just before the call that made the
/// frame) is `rsp + cfa_off`.
pub const UNWIND_CFA_RSP: u16 = 1;
/// The CFA is `rbp + cfa_off`.
pub const UNWIND_CFA_RBP: u16 = 2;
/// No rule weft can follow here (no `.eh_frame` entry, a CFA given by an
/// expression, as in PLT stubs and signal trampolines): walk frame pointers.
pub const UNWIND_UNKNOWN: u16 = 0;

/// How to find the caller's frame from anywhere in `[addr, next row's addr)`
/// (runtime addresses), the kernel's ORC idea built from `.eh_frame`: the return
/// address is at CFA-8, the caller's `rsp` is the CFA, its `rbp` is at
/// `CFA + rbp_off` (0: unchanged).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UnwindRow {
    pub addr: u64,
    pub cfa_off: i32,
    /// `UNWIND_*`.
    pub kind: u16,
    pub rbp_off: i16,
}

const _: () = assert!(core::mem::size_of::<UnwindRow>() == 16);

/// Most `profile:hz:N` probes in one program.
pub const MAX_PROFILES: usize = 4;

/// One `profile:hz:N` probe (`hz == 0`: unused).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProfileDesc {
    pub hz: u32,
    /// Probe name index for `probe`.
    pub probe: u32,
    /// Compiled advice (`extern "C" fn(*mut Frame)`).
    pub advice: u64,
}

/// Most data watches in one program (hardware watchpoints and page-protection
/// watches together).
pub const MAX_WATCHES: usize = 32;
/// Most hardware watchpoints in one program: x86-64 has four debug registers per
/// thread; more watches fall back to page protection.
pub const MAX_HW_WATCHES: usize = 4;

/// [`WatchDesc::access`]: writes (`HW_BREAKPOINT_W`).
pub const WATCH_W: u32 = 2;
/// [`WatchDesc::access`]: reads and writes (`HW_BREAKPOINT_RW`).
pub const WATCH_RW: u32 = 3;
/// [`WatchDesc::access`] flag: run the advice only when the value did not change
/// (`get`: x86 cannot watch reads alone).
pub const WATCH_UNCHANGED_ONLY: u32 = 0x100;
/// [`WatchDesc::access`] flag: watch by page protection (the agent's `page`), not
/// a hardware watchpoint; any length, any alignment. `get` (with
/// [`WATCH_UNCHANGED_ONLY`]) then runs its advice on the accesses that read
/// without writing.
pub const WATCH_PAGE: u32 = 0x200;

/// One data watch (`len == 0`: unused): `len` bytes at `addr`; for a hardware
/// watchpoint 1, 2, 4 or 8, aligned to `len`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WatchDesc {
    pub addr: u64,
    pub len: u32,
    /// [`WATCH_W`] or [`WATCH_RW`], maybe with [`WATCH_UNCHANGED_ONLY`].
    pub access: u32,
    /// Probe name index for `probe`.
    pub probe: u32,
    /// Compiled advice (`extern "C" fn(*mut Frame)`), called with a [`Frame`]
    /// followed by the old and new values ([`DATA_OLD_OFF`], [`DATA_NEW_OFF`]).
    pub advice: u64,
}

/// A data probe's advice reads the value before the access here, from its frame.
pub const DATA_OLD_OFF: usize = FRAME_SIZE;
/// ... and the value after it.
pub const DATA_NEW_OFF: usize = FRAME_SIZE + 8;

/// `sig_data` of weft's hardware watchpoints (perf events) in its high 16 bits, so
/// the SIGTRAP handler knows the trap is weft's; the rest: the session's generation
/// (bits 8..40) and the watch index (bits 0..8).
pub const WATCH_SIG_MAGIC: u64 = 0x5746;

#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SessionState {
    Preparing = 0,
    Running = 1,
    Ending = 2,
}

/// Kinds of map values, as stored in [`MapDesc::kind`].
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MapKind {
    Plain = 0,
    Count = 1,
    Sum = 2,
    Min = 3,
    Max = 4,
    Avg = 5,
    Stats = 6,
    Hist = 7,
    Lhist = 8,
    Tseries = 9,
}

/// Aggregation op codes: what advice passes to the `MapAgg` helper (and what the
/// runtime's `aggregate` applies), here once for the code generator and the runtime.
pub const AGG_COUNT: u32 = 0;
pub const AGG_SUM: u32 = 1;
pub const AGG_MIN: u32 = 2;
pub const AGG_MAX: u32 = 3;
pub const AGG_AVG: u32 = 4;
pub const AGG_STATS: u32 = 5;
pub const AGG_HIST: u32 = 6;
pub const AGG_LHIST: u32 = 7;
pub const AGG_TSERIES: u32 = 8;

/// How a `tseries` interval combines the values written in it ([`MapDesc::tseries_agg`]):
/// the last one (upstream's default), or their average, maximum, minimum or sum.
pub const TSERIES_LAST: u32 = 0;
pub const TSERIES_AVG: u32 = 1;
pub const TSERIES_MAX: u32 = 2;
pub const TSERIES_MIN: u32 = 3;
pub const TSERIES_SUM: u32 = 4;

/// Words of one `tseries` interval in an accumulator: `[value, meta, epoch]`. `epoch`
/// is the interval's number (`CLOCK_REALTIME / interval_ns`; 0: never written);
/// `meta` is the write's time for [`TSERIES_LAST`] (so merging keeps the latest),
/// the number of values for [`TSERIES_AVG`], else 0. Interval `e` lives at index
/// `e % intervals`.
pub const TSERIES_WORDS: usize = 3;

#[repr(C)]
pub struct MapDesc {
    /// [`MapKind`] as u32.
    pub kind: u32,
    /// Nonzero for signed sums/min/max/avg/stats.
    pub signed: u32,
    /// Key size in bytes (0 for a scalar map).
    pub key_size: u32,
    /// Plain maps: value bytes stored in the entry. Aggregations: bytes of one
    /// per-thread accumulator.
    pub value_size: u32,
    /// Bytes of one key-table entry (see [`entry_layout`]).
    pub entry_size: u32,
    /// Key-table slots, a power of two (1 for a scalar map).
    pub capacity: u32,
    /// Most live entries allowed; inserts beyond are dropped and counted.
    pub max_entries: u32,
    /// hist `k`, or 0.
    pub hist_k: u32,
    pub lhist_min: i64,
    pub lhist_max: i64,
    pub lhist_step: i64,
    /// `tseries`: nanoseconds per interval, number of intervals kept, `TSERIES_*`.
    pub tseries_interval_ns: u64,
    pub tseries_intervals: u32,
    pub tseries_agg: u32,
    /// Offset of the key table in the segment.
    pub table_off: u64,
    /// Offset of this map's accumulators inside each thread's aggregation area
    /// (`capacity * value_size` bytes; entry `i`'s accumulator is at `i * value_size`).
    pub agg_off: u64,
    /// Live entries.
    pub count: AtomicU32,
    /// `MAP_FLAG_*`.
    pub flags: u32,
    /// Updates dropped because the map was full.
    pub full_drops: AtomicU64,
    /// Bumped by `clear`/`zero` so readers can tell a table was reset.
    pub generation: AtomicU64,
}

/// A plain map keyed by pid (8 bytes) whose entry for a process is copied to the
/// process's forked children, inside `fork()` (a group's members).
pub const MAP_FLAG_INHERIT_PID: u32 = 1;
/// A plain map each thread only uses at its own tid (`weft_ir::thread_keyed_maps`):
/// a thread's entry lives in its own slot, an accumulator of two words `[present,
/// value]` (`agg_off`), not in the key table; the key table holds only the entries
/// of threads that ended (weft moves them there when it drains their slot).
pub const MAP_FLAG_THREAD_KEYED: u32 = 2;

/// Key-table entry states (`EntryHeader::state`).
pub const ENTRY_EMPTY: u32 = 0;
/// A thread is writing the key; readers spin briefly or treat it as absent.
pub const ENTRY_BUSY: u32 = 1;
pub const ENTRY_LIVE: u32 = 2;
/// Deleted; the slot may be reused by the same key only (keeps probe chains intact).
pub const ENTRY_DELETED: u32 = 3;

/// Header of each key-table entry; followed by the key (`key_size` bytes rounded up
/// to 8) and, for plain maps, the value (`value_size` rounded up to 8).
#[repr(C)]
pub struct EntryHeader {
    pub state: AtomicU32,
    pub hash: u32,
}

/// `(key offset, value offset, entry size)` within an entry for the given sizes.
pub const fn entry_layout(key_size: u32, plain_value_size: u32) -> (u32, u32, u32) {
    let key_off = 8;
    let value_off = key_off + round8(key_size);
    let size = value_off + round8(plain_value_size);
    (key_off, value_off, size)
}

pub const fn round8(n: u32) -> u32 {
    (n + 7) & !7
}

/// The hash used for map keys, by weft, the agent and the eBPF programs alike: the
/// key as little-endian 8-byte words (the last one zero-padded), each times its
/// position's odd factor ([`key_word_factor`]), summed, then the key's length and a
/// final mix ([`key_hash_finish`]). The multiplies are independent (a 64-byte key
/// costs one multiply's latency plus one a cycle), and a zero word adds nothing: a
/// string key, NUL-padded, needs only the words up to its first zero word. Never 0
/// or 1 so it can be told from an empty slot.
#[inline]
pub fn key_hash(key: &[u8]) -> u32 {
    let mut sum = 0u64;
    let mut chunks = key.chunks_exact(8);
    let mut i = 0;
    for c in &mut chunks {
        let w = u64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]);
        sum = sum.wrapping_add(w.wrapping_mul(key_word_factor(i)));
        i += 1;
    }
    let rest = chunks.remainder();
    if !rest.is_empty() {
        let mut b = [0u8; 8];
        b[..rest.len()].copy_from_slice(rest);
        sum = sum.wrapping_add(u64::from_le_bytes(b).wrapping_mul(key_word_factor(i)));
    }
    key_hash_finish(sum, key.len() as u32)
}

/// The factor of a key's word `i` in [`key_hash`]: odd (so a word's product tells
/// the word apart) and unrelated to the others' (splitmix64 of `i + 1`), so words
/// that differ do not cancel out in the sum.
#[inline]
pub const fn key_word_factor(i: usize) -> u64 {
    if i < KEY_WORD_FACTORS.len() {
        KEY_WORD_FACTORS[i]
    } else {
        splitmix_factor(i)
    }
}

const fn splitmix_factor(i: usize) -> u64 {
    let mut z = (i as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    (z ^ (z >> 31)) | 1
}

const KEY_WORD_FACTORS: [u64; 64] = {
    let mut t = [0u64; 64];
    let mut i = 0;
    while i < 64 {
        t[i] = splitmix_factor(i);
        i += 1;
    }
    t
};

/// [`key_hash`]'s last step, from the sum of its words' products and the key's
/// length in bytes.
#[inline]
pub const fn key_hash_finish(sum: u64, len: u32) -> u32 {
    let mut h = sum ^ len as u64;
    h ^= h >> 33;
    h = h.wrapping_mul(KEY_HASH_MIX);
    h ^= h >> 33;
    (h as u32) | 2
}

/// The multiplier of [`key_hash_finish`]'s mix.
pub const KEY_HASH_MIX: u64 = 0xff51_afd7_ed55_8ccd;

#[cfg(test)]
mod hash_tests {
    use super::key_hash;
    use std::vec;

    #[test]
    fn distinguishes_nearby_keys_and_never_collides_with_states() {
        let mut seen = std::collections::HashSet::new();
        for len in [0usize, 1, 7, 8, 9, 31, 32, 33, 64, 72] {
            for v in 0..64u8 {
                let mut k = vec![0u8; len];
                if len > 0 {
                    k[(v as usize) % len] = v;
                }
                let h = key_hash(&k);
                assert!(h >= 2);
                seen.insert((len, v, h));
            }
        }
        // Same bytes, different lengths hash differently.
        assert_ne!(key_hash(&[0u8; 8]), key_hash(&[0u8; 16]));
        assert_ne!(key_hash(b"alpha\0\0\0"), key_hash(b"beta\0\0\0\0"));
    }

    /// A string key's zero words add nothing, so the words up to the first zero one
    /// give the hash of the whole NUL-padded key.
    #[test]
    fn zero_words_add_nothing() {
        let mut k = [0u8; 64];
        k[..3].copy_from_slice(b"get");
        let mut sum = 0u64;
        let w = u64::from_le_bytes(k[..8].try_into().unwrap());
        sum = sum.wrapping_add(w.wrapping_mul(super::key_word_factor(0)));
        assert_eq!(super::key_hash_finish(sum, 64), key_hash(&k));
        // Past the factor table too.
        let long = vec![0u8; 1024];
        assert_eq!(key_hash(&long), super::key_hash_finish(0, 1024));
        assert_eq!(super::key_word_factor(64), super::splitmix_factor(64));
    }

    /// Keys that differ in two words (small integers in a tuple) do not collide
    /// more than chance would have them.
    #[test]
    fn tuples_of_small_integers_spread() {
        let mut seen = std::collections::HashSet::new();
        for a in 0..256u64 {
            for b in 0..256u64 {
                let mut k = [0u8; 16];
                k[..8].copy_from_slice(&a.to_le_bytes());
                k[8..].copy_from_slice(&b.to_le_bytes());
                // Bit 1 is always set: the 16 bits above it.
                seen.insert((key_hash(&k) >> 2) & 0xffff);
            }
        }
        // 65,536 keys into 65,536 buckets: about 1 - 1/e of them hit.
        assert!(seen.len() > 38_000, "{} buckets used", seen.len());
    }
}

// ---------------------------------------------------------------------------------
// Threads and events
// ---------------------------------------------------------------------------------

/// The slot is free: never used, or folded into the retired slot by weft.
pub const THREAD_FREE: u32 = 0;
/// A thread owns the slot.
pub const THREAD_LIVE: u32 = 1;
/// Its thread is gone for the kernel (the agent checked): weft drains the ring,
/// folds the accumulators and counters into [`RETIRED_SLOT`], zeroes them and frees
/// the slot.
pub const THREAD_DEAD: u32 = 2;
/// [`RETIRED_SLOT`]: what exited threads left. Written by weft only (and zeroed by
/// `clear`/`zero`/`delete` like any slot); merged like any slot.
pub const THREAD_RETIRED: u32 = 3;

/// The slot that accumulates the aggregations, errors and event counts of threads
/// whose slots were reused.
pub const RETIRED_SLOT: u32 = 0;
/// weft's own slot (BEGIN, END and interval advice).
pub const WEFT_SLOT: u32 = 1;
/// The first slot for the target's threads.
pub const FIRST_THREAD_SLOT: u32 = 2;

/// Start of each thread's area in the segment.
///
/// Life of a slot: FREE → LIVE when a thread's first hit claims it (from the free
/// queue, else a slot never used) → DEAD when the agent's control thread finds the
/// thread gone for the kernel (its clear-child-tid word was cleared, or its `/proc`
/// entry is gone) → FREE when weft has drained it. While LIVE only the owning thread
/// writes it (except `ring_tail`, written by weft, and accumulators zeroed by
/// `clear`/`zero`/`delete`); once DEAD no thread can write it, so weft folds and
/// zeroes it, then publishes FREE (release) and pushes it on the free queue.
#[repr(C)]
pub struct ThreadSlot {
    pub tid: u32,
    pub state: AtomicU32,
    /// Error counters, indexed by `weft_ir::ErrorKind`.
    pub errors: [AtomicU64; ERROR_KINDS],
    /// Events the runtime's `ring::produce` wrote (including those later lost);
    /// inline advice does not count here. Nothing reports it.
    pub events_produced: AtomicU64,
    /// Events dropped because the ring was full.
    pub events_lost: AtomicU64,
    /// Producer position (bytes, monotonically increasing), written by the thread.
    pub ring_head: AtomicU64,
    /// Consumer position, written by weft.
    pub ring_tail: AtomicU64,
    /// `comm` of the thread, NUL-padded, captured when the slot was claimed.
    pub comm: [u8; 16],
    /// Hits of target probes on this thread.
    pub hits: AtomicU64,
    /// Process of the thread (a session may span several processes).
    pub pid: u32,
    /// 1 while the slot counts in `ShmHeader::threads_live`: set when a thread
    /// claims it, taken back (swapped to 0, so once) by whichever comes first of the
    /// thread's own exit (its thread-specific data destructor) and the slot's
    /// release by the agent's reaper. The limit is on threads that have not ended,
    /// however late the reaper looks.
    pub counted: AtomicU32,
    /// `pcomm`: the name of the thread's process (its main thread's `comm`),
    /// NUL-padded, as the agent read it when the session reached the process.
    pub pcomm: [u8; 16],
    /// Set by the producer when it waited `ShmHeader::ring_wait_spins` for room
    /// and weft did not make any: it then drops events at once instead of waiting
    /// for each, until weft's next drain clears it (a stopped weft never slows the
    /// target more than once).
    pub ring_stalled: AtomicU64,
    /// Reserved.
    pub _reserved: [u64; 4],
}

/// Size reserved for the [`ThreadSlot`] header before the ring.
pub const THREAD_HEADER_SIZE: u64 = 256;

/// Event record header in a ring. Records are 8-byte aligned and never wrap: a
/// record that would cross the end of the ring is preceded by an [`EVENT_PAD`] record
/// filling the rest.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EventHeader {
    /// Total bytes of the record, header included, rounded up to 8.
    pub len: u32,
    /// One of the `EVENT_*` kinds.
    pub kind: u32,
    /// Format id, map id, ... depending on the kind.
    pub id: u32,
    /// Payload bytes (before rounding).
    pub payload_len: u32,
    /// Extra arguments (top/div of `print(@m, top, div)`).
    pub arg0: u32,
    pub arg1: u32,
    /// CLOCK_MONOTONIC time the event was produced.
    pub nsecs: u64,
}

pub const EVENT_HEADER_SIZE: u32 = core::mem::size_of::<EventHeader>() as u32;

pub const EVENT_PAD: u32 = 0;
pub const EVENT_PRINTF: u32 = 1;
pub const EVENT_SYSTEM: u32 = 2;
pub const EVENT_CAT: u32 = 3;
pub const EVENT_TIME: u32 = 4;
pub const EVENT_JOIN: u32 = 5;
pub const EVENT_PRINT_MAP: u32 = 6;
pub const EVENT_PRINT_VALUE: u32 = 7;
pub const EVENT_CLEAR_MAP: u32 = 8;
pub const EVENT_ZERO_MAP: u32 = 9;
pub const EVENT_EXIT: u32 = 10;
/// A function was entered: `id` is the site, the payload the arguments asked for
/// (8 bytes each).
pub const EVENT_FUNC_ENTRY: u32 = 11;
/// A function returned: `id` is the site, `arg0 | arg1 << 32` the return value.
pub const EVENT_FUNC_EXIT: u32 = 12;
/// A function entry (no arguments) or exit (no return value) in 16 bytes, as
/// inline advice writes them for `weft record`: `u32` length 16, a `u32` whose low
/// byte is this kind and whose upper 24 bits are the site, the `u64` time. Readers
/// see them as [`EVENT_FUNC_ENTRY`] / [`EVENT_FUNC_EXIT`] headers
/// ([`short_event_header`]).
pub const EVENT_FUNC_ENTRY_SHORT: u32 = 13;
pub const EVENT_FUNC_EXIT_SHORT: u32 = 14;
/// As [`EVENT_FUNC_ENTRY_SHORT`] / [`EVENT_FUNC_EXIT_SHORT`], but timed by the raw
/// TSC: what inline advice writes when the segment's clock is the TSC, so that
/// nothing converts it on the hot path, nor in weft's drain. They stay so in the
/// record file, which carries the clock's lines (`weft_runtime::clock::TscLines`);
/// readers convert where they read. [`short_event_header`] gives their header
/// these kinds, the time still raw ([`tsc_event_kind`] tells them apart).
pub const EVENT_FUNC_ENTRY_TSC: u32 = 15;
pub const EVENT_FUNC_EXIT_TSC: u32 = 16;
/// Bytes of a short function event.
pub const SHORT_EVENT_SIZE: u32 = 16;
/// Sites a short function event can name (24 bits).
pub const SHORT_EVENT_SITES: u32 = 1 << 24;

/// The header a short function event stands for, from its first two words and
/// its time; `None` when the record is not one. A TSC-timed one keeps its kind
/// ([`EVENT_FUNC_ENTRY_TSC`], [`EVENT_FUNC_EXIT_TSC`]) and its raw time.
pub fn short_event_header(len: u32, word: u32, nsecs: u64) -> Option<EventHeader> {
    let kind = match word & 0xff {
        EVENT_FUNC_ENTRY_SHORT => EVENT_FUNC_ENTRY,
        EVENT_FUNC_EXIT_SHORT => EVENT_FUNC_EXIT,
        k @ (EVENT_FUNC_ENTRY_TSC | EVENT_FUNC_EXIT_TSC) => k,
        _ => return None,
    };
    (len == SHORT_EVENT_SIZE).then_some(EventHeader {
        len,
        kind,
        id: word >> 8,
        payload_len: 0,
        arg0: 0,
        arg1: 0,
        nsecs,
    })
}

/// The kind a TSC-timed function event stands for ([`EVENT_FUNC_ENTRY`] or
/// [`EVENT_FUNC_EXIT`]), `None` for any other kind.
pub fn tsc_event_kind(kind: u32) -> Option<u32> {
    match kind {
        EVENT_FUNC_ENTRY_TSC => Some(EVENT_FUNC_ENTRY),
        EVENT_FUNC_EXIT_TSC => Some(EVENT_FUNC_EXIT),
        _ => None,
    }
}

// ---------------------------------------------------------------------------------
// Sites
// ---------------------------------------------------------------------------------

/// How a site is patched.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SiteKind {
    /// A 5-byte `jmp rel32` to a trampoline over relocated instructions.
    Jump = 1,
    /// A 1-byte `int3`; the agent's SIGTRAP handler runs the advice.
    Int3 = 2,
    /// A compiler placeholder (NOPs) replaced by a call or jump.
    Placeholder = 3,
}

pub const SITE_UNUSED: u32 = 0;
/// weft is writing the patch; the bytes are either `orig` or `patch`.
pub const SITE_PATCHING: u32 = 1;
pub const SITE_PATCHED: u32 = 2;
pub const SITE_RESTORED: u32 = 3;

pub const SITE_MAX_BYTES: usize = 16;

#[repr(C)]
pub struct SiteDesc {
    /// First patched byte in the target.
    pub addr: u64,
    /// Entry address of the function the site belongs to.
    pub func: u64,
    /// [`SiteKind`] as u32.
    pub kind: u32,
    /// `SITE_*` state.
    pub state: AtomicU32,
    pub orig_len: u32,
    pub patch_len: u32,
    /// The process the site is in ([`msg::Msg::MapShm`]'s `space`): one segment
    /// serves every process of a session, and the same address may be a site in
    /// several of them.
    pub space: u32,
    pub _space_pad: u32,
    pub orig: [u8; SITE_MAX_BYTES],
    pub patch: [u8; SITE_MAX_BYTES],
    /// Entry advice (`extern "C" fn(*mut Frame)`) or 0.
    pub entry_advice: u64,
    /// Return advice, or 0; nonzero means the entry hijacks the return address.
    pub return_advice: u64,
    /// Inline form of the return advice (see [`ShadowEntry::stub`]), or 0.
    pub return_stub: u64,
    /// Where execution continues after an int3 site's advice: the relocated displaced
    /// instruction followed by a jump back.
    pub resume: u64,
    /// Index into the program's probe names for the entry and the return probe.
    pub entry_probe: u32,
    pub return_probe: u32,
    /// Name of the function (NUL-padded, truncated), for `func` used as a string.
    pub name: [u8; SITE_NAME_LEN],
    /// Address of a USDT semaphore (`unsigned short`) incremented while the site is
    /// patched, or 0.
    pub semaphore: u64,
}

pub const SITE_NAME_LEN: usize = 64;

// ---------------------------------------------------------------------------------
// Advice frame
// ---------------------------------------------------------------------------------

/// General-purpose registers at the probe site, in `weft_ir::MachineReg` order.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Regs {
    pub rax: u64,
    pub rbx: u64,
    pub rcx: u64,
    pub rdx: u64,
    pub rsi: u64,
    pub rdi: u64,
    pub rbp: u64,
    /// `rsp` as it was at the site (before the trampoline moved it).
    pub rsp: u64,
    pub r8: u64,
    pub r9: u64,
    pub r10: u64,
    pub r11: u64,
    pub r12: u64,
    pub r13: u64,
    pub r14: u64,
    pub r15: u64,
    /// Address of the site (entry probes) or the return address (return probes).
    pub rip: u64,
    pub flags: u64,
}

pub const REGS_COUNT: usize = 18;

/// What advice receives. Built by the trampoline (or the int3 handler, or weft for
/// BEGIN/END/interval probes).
#[repr(C)]
pub struct Frame {
    pub regs: Regs,
    /// This thread's slot in the shared segment.
    pub thread: *mut ThreadSlot,
    /// Base of the shared segment in this process.
    pub shm: *mut u8,
    /// Site index (into the site table), or u32::MAX for probes that run in weft.
    pub site: u64,
    /// Entry address of the probed function.
    pub func: u64,
    /// Private per-thread state of the agent (opaque to advice).
    pub tstate: *mut u8,
    /// Probe name index for `probe`.
    pub probe: u64,
}

pub const FRAME_REGS_OFF: usize = 0;
pub const FRAME_THREAD_OFF: usize = 8 * REGS_COUNT;
pub const FRAME_SHM_OFF: usize = FRAME_THREAD_OFF + 8;
pub const FRAME_SITE_OFF: usize = FRAME_SHM_OFF + 8;
pub const FRAME_FUNC_OFF: usize = FRAME_SITE_OFF + 8;
pub const FRAME_TSTATE_OFF: usize = FRAME_FUNC_OFF + 8;
pub const FRAME_PROBE_OFF: usize = FRAME_TSTATE_OFF + 8;
pub const FRAME_SIZE: usize = FRAME_PROBE_OFF + 8;

const _: () = assert!(core::mem::size_of::<Frame>() == FRAME_SIZE);

// An entry trampoline's stack area past the `Frame` (weft-jit's `trampoline`):
// the pointer back to the site's stack, xmm0-15, then the state of an around
// advice. Advice run by such a head may address these through its `*mut Frame`;
// the around instructions (`Proceed`...) are only compiled for advice that is.

/// Saved xmm0-15 (16 bytes each), from the frame.
pub const HEAD_XMM_OFF: usize = FRAME_SIZE + 16;
/// The around state, from the frame.
pub const AROUND_OFF: usize = HEAD_XMM_OFF + 256;
/// Where the original function starts running (the relocated instructions).
pub const AROUND_ORIG_OFF: usize = AROUND_OFF;
/// Nonzero once the advice took the call (its predicate held).
pub const AROUND_TAKEN_OFF: usize = AROUND_OFF + 8;
/// Nonzero once `proceed` has called the original.
pub const AROUND_PROCEEDED_OFF: usize = AROUND_OFF + 16;
/// The value the caller gets in rax.
pub const AROUND_RAX_OFF: usize = AROUND_OFF + 24;
/// The original's rdx, xmm0 and xmm1 (two-register and floating-point results),
/// handed back when it ran.
pub const AROUND_RDX_OFF: usize = AROUND_OFF + 32;
pub const AROUND_XMM0_OFF: usize = AROUND_OFF + 48;
pub const AROUND_XMM1_OFF: usize = AROUND_OFF + 64;
pub const AROUND_SIZE: usize = 80;
/// Stack words above the site's return address `proceed` copies for the call of
/// the original (arguments passed on the stack: the 7th integer argument on).
pub const PROCEED_STACK_WORDS: usize = 8;

// ---------------------------------------------------------------------------------
// Helpers the compiled advice calls
// ---------------------------------------------------------------------------------

/// Functions compiled advice calls, by index into the helper table the agent sends in
/// [`Hello`] (and weft builds for its own process). Signatures are in
/// `weft-runtime::helpers`; all take `*mut Frame` first.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Helper {
    ReadMem = 0,
    ReadStr,
    ReadBuf,
    Comm,
    FuncName,
    Nsecs,
    RealtimeNsecs,
    Cpu,
    Rand,
    UStack,
    MapFind,
    MapInsert,
    MapLoad,
    MapStore,
    MapAgg,
    MapDelete,
    MapLen,
    MapIterNext,
    Emit,
    IntToStr,
    StrCmp,
    StrContains,
    Signal,
    StoreTarget,
    CountError,
    Tid,
    Pid,
    PComm,
    /// `(shm, map, key, slot) -> index or -1`: inline advice's key not found in
    /// the slots it looked at (a first insert), frameless.
    MapIndex,
    /// `(shm, map, key, op) -> i64`, frameless: inline advice's plain-map key that
    /// the slots it looked at did not settle. `op` [`MAP_KEY_FIND`]: the live
    /// entry's index or -1; [`MAP_KEY_DELETE`]: 1 when an entry was deleted, else 0.
    MapKey,
    /// Not a helper but the runtime's fault-tolerant string copy, called by inline
    /// advice: `rdi` destination, `rsi` source, `rdx` most bytes; copies up to a
    /// NUL (not written) and returns in `rax` the bytes copied, bit 63 set when a
    /// fault stopped it. It changes only `rax` and `rcx`.
    SafeStrcpy,
    /// `() -> u64`: the calling thread's CPU time in ns (`CLOCK_THREAD_CPUTIME_ID`:
    /// a system call; only `weft fperf -e cputime`'s sampled calls read it).
    ThreadCpuTime,
    /// `(which) -> u64`: one of the calling thread's resource counters
    /// (`getrusage(RUSAGE_THREAD)`, a system call; only `weft fperf`'s sampled
    /// calls read it): `which` is a [`RUSAGE_FAULTS`].. constant.
    ThreadRusage,
    /// `(frame) -> u64`: advice just stored an address in a map that a
    /// `set:addr(@map, N)` pointcut watches; wait (up to
    /// [`WATCH_BIND_WAIT_NS`]) until weft has armed the watch there, so that no
    /// access after the store is missed. 1 when armed in time, 0 (counted as
    /// `ErrorKind::WatchLate`) when not.
    WatchBind,
    /// `() -> u64`: the NUMA node of the CPU the thread runs on (Linux keeps it
    /// above the CPU number in TSC_AUX).
    NumaNode,
}

pub const HELPER_COUNT: usize = Helper::NumaNode as usize + 1;
/// The longest a [`Helper::WatchBind`] waits for weft (a stopped weft must not
/// stop the target for long).
pub const WATCH_BIND_WAIT_NS: u64 = 200_000_000;
/// [`Helper::ThreadRusage`]'s counters: page faults (minor and major), minor
/// faults, major faults, context switches (voluntary and involuntary).
pub const RUSAGE_FAULTS: u64 = 0;
pub const RUSAGE_MINOR_FAULTS: u64 = 1;
pub const RUSAGE_MAJOR_FAULTS: u64 = 2;
pub const RUSAGE_CONTEXT_SWITCHES: u64 = 3;
pub const MAP_KEY_FIND: u64 = 0;
pub const MAP_KEY_DELETE: u64 = 1;

// ---------------------------------------------------------------------------------
// Control messages
// ---------------------------------------------------------------------------------

/// Agent → weft, first message on a new connection ([`msg::Msg::Hello`]).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hello {
    pub version: u32,
    pub pid: u32,
    /// Offset of the agent's TLS slot from the thread pointer (`fs:[off]`).
    pub tls_offset: i64,
    /// Address of the shared return trampoline.
    pub return_trampoline: u64,
    /// Address of `weft_agent_thread_attach` (thread attach slow path, returns
    /// [`ThreadAttach`] in rax:rdx).
    pub thread_attach: u64,
    /// Address of `weft_agent_hijack(frame)`: push a shadow entry and replace the
    /// return address at `frame.regs.rsp` with the return trampoline.
    pub hijack: u64,
    /// The agent's executable mapping: a thread stopped with its PC here may be
    /// using the session (signal handlers, attach slow path, return path), so weft
    /// waits for it to leave before the session is freed.
    pub text_start: u64,
    pub text_end: u64,
    /// Nonzero when a previous session is still active (attach refused).
    pub busy: u32,
    pub _pad: u32,
    pub helpers: [u64; HELPER_COUNT],
    /// Address of `weft_agent_on_raise` (the unwinder hooks' advice).
    pub on_raise: u64,
    /// Address of `weft_agent_sigaction` (glibc's `__libc_sigaction` is redirected
    /// there while woven).
    pub sigaction: u64,
    /// Address of the agent's step guard (`weft_inject`'s `set_step_guard`): the
    /// agent swallows the traps of a step weft died in.
    pub step_guard: u64,
    /// A child forked by a member of a session that follows forks: its parent's pid
    /// and the site space it inherited (its code is the parent's, woven); 0
    /// otherwise.
    pub parent: u32,
    pub parent_space: u32,
}

pub mod msg;

/// Name of the environment variable that tells an `LD_PRELOAD`ed agent which
/// abstract socket to connect to.
pub const ENV_SOCKET: &str = "WEFT_SOCKET";
/// Set in a launched command's environment when the session follows its children:
/// the agent then leaves `LD_PRELOAD` and [`ENV_SOCKET`] in place, so that the
/// programs they exec load the agent too and join the session. Its value is
/// [`FOLLOW_ALL`] (`--follow-fork`: every image keeps them) or
/// `wrappers[:PROGRAM]...` ([`FOLLOW_WRAPPERS`]: weft followed a wrapper on its
/// own). Then the program the wrapper runs takes them out of its environment, as
/// an unfollowed launch does, and the images before it keep them: the program is
/// the first image whose executable is one of the PROGRAMs (the probed programs by
/// path, canonical), or with none given, the first that is not one of
/// [`WRAPPERS`] ([`follow_keeps`]).
pub const ENV_FOLLOW: &str = "WEFT_FOLLOW";
/// [`ENV_FOLLOW`]'s value for `--follow-fork`.
pub const FOLLOW_ALL: &str = "1";
/// [`ENV_FOLLOW`]'s value when weft follows through a wrapper command.
pub const FOLLOW_WRAPPERS: &str = "wrappers";
/// File names of the programs that only run another one (shells, `env` and its
/// kind): `-c` through one of them follows the programs it executes.
pub const WRAPPERS: &[&str] = &[
    "sh", "dash", "bash", "zsh", "ksh", "mksh", "busybox", "env", "nice", "nohup", "timeout",
    "stdbuf", "setsid", "taskset", "chrt", "ionice", "time",
];

/// `path`'s file name is one of [`WRAPPERS`].
pub fn is_wrapper(path: &str) -> bool {
    let name = path.rsplit('/').next().unwrap_or(path);
    WRAPPERS.contains(&name)
}

/// Whether an image whose executable is `exe` (canonical) keeps `LD_PRELOAD` and
/// `WEFT_*` for what it runs, given [`ENV_FOLLOW`]'s value `follow`.
pub fn follow_keeps(follow: &str, exe: &str) -> bool {
    let Some(rest) = follow.strip_prefix(FOLLOW_WRAPPERS) else {
        return true;
    };
    let mut programs = rest.split(':').filter(|p| !p.is_empty()).peekable();
    if programs.peek().is_none() {
        is_wrapper(exe)
    } else {
        !programs.any(|p| p == exe)
    }
}

// ---------------------------------------------------------------------------------
// Agent-private thread state (read by trampolines at fixed offsets)
// ---------------------------------------------------------------------------------

/// Per-thread state of the agent, found through the agent's initial-exec TLS slot
/// (`fs:[Hello::tls_offset]`). Lives in the agent's own memory, not in the shared
/// segment, so it survives sessions (pending return addresses outlive a session).
/// Cache-line aligned: the agent keeps them in one pool, and each is written by its
/// own thread on every advice call (`nest`), so two must never share a line.
#[repr(C, align(64))]
pub struct AgentThread {
    /// This thread's slot in the current session's segment; null when there is no
    /// session or the thread has not been seen in it yet (→ slow path).
    pub slot: *mut ThreadSlot,
    /// Nonzero while the thread is inside advice or a helper (quiescence check).
    pub nest: u32,
    /// `THREAD_FLAG_*`.
    pub flags: u32,
    pub tid: u32,
    pub pid: u32,
    /// Session generation `slot` belongs to.
    pub session: u64,
    /// Shadow stack of hijacked return addresses.
    pub shadow_depth: u32,
    pub shadow_cap: u32,
    pub shadow: *mut ShadowEntry,
    /// State of `rand`.
    pub rand: u64,
    /// Return probes skipped because the shadow stack was full, or entries discarded
    /// as stale (longjmp) or restored (exceptions).
    pub shadow_overflows: u64,
    pub shadow_discarded: u64,
    /// Nonzero while this thread holds a pointer into the session outside advice
    /// (SIGTRAP handler, the trampolines' attach slow path): weft does not free the
    /// session meanwhile.
    pub busy: u32,
    /// Calls of the original function under way from around advice (`proceed`):
    /// the advice's code is on this thread's stack, so weft does not free it.
    pub around: u32,
    /// Nonzero while this thread compacts its shadow stack (moves entries).
    pub shadow_gc: u32,
    /// Other threads looking for a migrated frame's entry in this shadow stack
    /// (coroutines resumed on another thread); compaction waits for none.
    pub shadow_thieves: u32,
}

/// `AgentThread`s in the agent's pool: the most threads with agent state at once
/// (an entry is reused once its thread is gone). Hits on threads beyond it run no
/// advice and are counted (`ShmHeader::pool_dropped`).
pub const AGENT_POOL_THREADS: usize = 4096;

pub const AGENT_THREAD_SLOT_OFF: i32 = 0;
pub const AGENT_THREAD_NEST_OFF: i32 = 8;
pub const AGENT_THREAD_FLAGS_OFF: i32 = 12;
pub const AGENT_THREAD_AROUND_OFF: i32 = core::mem::offset_of!(AgentThread, around) as i32;

/// The agent's control thread: advice never runs on it.
pub const THREAD_FLAG_IGNORE: u32 = 1;

/// One hijacked return address: everything the return path needs, so that its fast
/// path (assembly in the agent) never looks at the site table.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ShadowEntry {
    /// The real return address.
    pub ret: u64,
    /// Stack address of the return-address slot (the site's `rsp`).
    pub slot: u64,
    /// Return advice (`extern "C" fn(*mut Frame)`), or 0.
    pub advice: u64,
    /// Entry address of the function.
    pub func: u64,
    /// Site index.
    pub site: u32,
    /// Session generation the advice belongs to (advice of another session is not run).
    pub session: u32,
    /// Probe name index for `probe`.
    pub probe: u32,
    pub _pad: u32,
    /// Inline return stub (no frame; see `weft_jit::inline::return_stub`), or 0.
    /// Called with rcx = thread state; returns 0 when it ran the advice, nonzero when
    /// the full `advice` must run instead.
    pub stub: u64,
    /// Base of the session's segment (for the frame).
    pub shm: u64,
}

pub const SHADOW_ENTRY_SIZE: usize = 64;
pub const SHADOW_STUB_OFF: i32 = 48;
pub const SHADOW_RET_OFF: i32 = 0;
pub const SHADOW_SLOT_OFF: i32 = 8;
pub const SHADOW_ADVICE_OFF: i32 = 16;
pub const SHADOW_FUNC_OFF: i32 = 24;
pub const SHADOW_SITE_OFF: i32 = 32;
pub const SHADOW_SESSION_OFF: i32 = 36;
pub const SHADOW_PROBE_OFF: i32 = 40;
pub const SHADOW_SHM_OFF: i32 = 56;
const _: () = assert!(core::mem::size_of::<ShadowEntry>() == SHADOW_ENTRY_SIZE);
const _: () = assert!(core::mem::offset_of!(ShadowEntry, shm) == SHADOW_SHM_OFF as usize);
const _: () = assert!(core::mem::offset_of!(ShadowEntry, probe) == SHADOW_PROBE_OFF as usize);
const _: () = assert!(core::mem::offset_of!(ShadowEntry, stub) == SHADOW_STUB_OFF as usize);

pub const AGENT_THREAD_SHADOW_DEPTH_OFF: i32 =
    core::mem::offset_of!(AgentThread, shadow_depth) as i32;
pub const AGENT_THREAD_SHADOW_CAP_OFF: i32 = core::mem::offset_of!(AgentThread, shadow_cap) as i32;
pub const AGENT_THREAD_SHADOW_OFF: i32 = core::mem::offset_of!(AgentThread, shadow) as i32;
pub const AGENT_THREAD_OVERFLOWS_OFF: i32 =
    core::mem::offset_of!(AgentThread, shadow_overflows) as i32;
pub const AGENT_THREAD_TID_OFF: i32 = core::mem::offset_of!(AgentThread, tid) as i32;
pub const AGENT_THREAD_PID_OFF: i32 = core::mem::offset_of!(AgentThread, pid) as i32;

/// Value returned in `rax:rdx` by the thread-attach slow path.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ThreadAttach {
    pub thread: *mut AgentThread,
    pub slot: *mut ThreadSlot,
}

// ---------------------------------------------------------------------------------
// Histogram buckets (shared by the agent, which fills them, and the printer)
// ---------------------------------------------------------------------------------

/// Bucket of `v` in a `hist(v, k)` accumulator of `2 + (64 << k)` buckets:
/// 0 for negative values, 1 for zero, then for `1 <= v < 2^k` one bucket per value,
/// then each power of two `[2^l, 2^(l+1))` (l >= k) split into 2^k equal sub-buckets.
/// For k = 0 this is bpftrace's `hist`: bucket `2 + floor(log2(v))`.
#[inline]
pub fn hist_index(v: i64, k: u32) -> usize {
    if v < 0 {
        return 0;
    }
    if v == 0 {
        return 1;
    }
    let n = v as u64;
    let l = 63 - n.leading_zeros();
    if l < k {
        return 1 + n as usize;
    }
    let sub = ((n >> (l - k)) & ((1u64 << k) - 1)) as usize;
    1 + (1usize << k) + ((l - k) as usize) * (1usize << k) + sub
}

/// Inclusive lower and exclusive upper bound of bucket `idx` of `hist(v, k)`
/// (`None` upper bound for the last power of two). Bucket 0 is `(-inf, 0)`.
pub fn hist_bucket_bounds(idx: usize, k: u32) -> (i128, Option<i128>) {
    match idx {
        0 => (i128::MIN, Some(0)),
        1 => (0, Some(1)),
        _ => {
            let per = 1usize << k;
            if idx < 1 + per {
                let n = (idx - 1) as i128;
                return (n, Some(n + 1));
            }
            let rel = idx - 1 - per;
            let l = (rel / per) as u32 + k;
            let sub = (rel % per) as i128;
            let width = 1i128 << (l - k);
            let lo = (1i128 << l) + sub * width;
            let hi = lo + width;
            (
                lo,
                if hi > u64::MAX as i128 {
                    None
                } else {
                    Some(hi)
                },
            )
        }
    }
}

/// Bucket of `v` in `lhist(v, min, max, step)`: 0 below `min`, `1 + (v - min) / step`
/// inside, the last bucket at or above `max`.
#[inline]
pub fn lhist_index(v: i64, min: i64, max: i64, step: i64) -> usize {
    if v < min {
        0
    } else if v >= max {
        // In i128: `max - min + step - 1` overflows i64 near its bounds.
        let step = i128::from(step.max(1));
        let steps = (i128::from(max) - i128::from(min) + step - 1) / step;
        steps as usize + 1
    } else {
        1 + ((v - min) / step) as usize
    }
}

#[cfg(test)]
mod hist_tests {
    use super::*;

    #[test]
    fn log2_buckets_k0() {
        assert_eq!(hist_index(-5, 0), 0);
        assert_eq!(hist_index(0, 0), 1);
        assert_eq!(hist_index(1, 0), 2);
        assert_eq!(hist_index(2, 0), 3);
        assert_eq!(hist_index(3, 0), 3);
        assert_eq!(hist_index(4, 0), 4);
        assert_eq!(hist_index(1023, 0), 11);
        assert_eq!(hist_index(1024, 0), 12);
        assert_eq!(hist_index(i64::MAX, 0), 64);
        assert_eq!(hist_bucket_bounds(4, 0), (4, Some(8)));
        assert_eq!(hist_bucket_bounds(12, 0), (1024, Some(2048)));
    }

    #[test]
    fn buckets_with_k_cover_their_bounds() {
        for k in 0..=5u32 {
            for v in [
                1i64,
                2,
                3,
                5,
                7,
                8,
                9,
                31,
                32,
                33,
                100,
                1000,
                4095,
                4096,
                1 << 40,
            ] {
                let i = hist_index(v, k);
                let (lo, hi) = hist_bucket_bounds(i, k);
                assert!(
                    lo <= v as i128 && hi.is_none_or(|h| (v as i128) < h),
                    "k={k} v={v} i={i} {lo} {hi:?}"
                );
                assert!(i < 2 + (64usize << k));
            }
        }
    }

    #[test]
    fn lhist_buckets() {
        assert_eq!(lhist_index(-1, 0, 100, 10), 0);
        assert_eq!(lhist_index(0, 0, 100, 10), 1);
        assert_eq!(lhist_index(9, 0, 100, 10), 1);
        assert_eq!(lhist_index(10, 0, 100, 10), 2);
        assert_eq!(lhist_index(99, 0, 100, 10), 10);
        assert_eq!(lhist_index(100, 0, 100, 10), 11);
    }

    /// Bounds near i64::MAX (issue 24): `max - min + step - 1` overflowed, putting
    /// values at or above `max` in an in-range bucket (or panicking in debug builds).
    #[test]
    fn lhist_buckets_at_the_extremes() {
        let m = i64::MAX;
        assert_eq!(lhist_index(m - 1, 0, m, m), 1);
        assert_eq!(lhist_index(m, 0, m, m), 2);
        assert_eq!(lhist_index(m, 0, m - 1, m - 1000), 3);
        assert_eq!(lhist_index(m, 0, m, 1), (m as usize) + 1);
    }
}

#[cfg(test)]
mod layout_tests {
    use super::*;

    /// What threads write on the hot path never shares a cache line with another
    /// thread's: agent thread states are whole lines, and a thread slot's header
    /// (hits, ring head) is whole lines before its ring and accumulators (slots
    /// themselves are page-aligned, see `weft_runtime::layout`).
    #[test]
    fn per_thread_state_is_cache_line_separated() {
        assert_eq!(core::mem::align_of::<AgentThread>() % 64, 0);
        assert_eq!(core::mem::size_of::<AgentThread>() % 64, 0);
        assert!(core::mem::size_of::<ThreadSlot>() as u64 <= THREAD_HEADER_SIZE);
        assert_eq!(THREAD_HEADER_SIZE % 64, 0);
    }
}

#[cfg(test)]
mod follow_tests {
    use super::*;

    #[test]
    fn follow_keeps_until_the_wrapped_program() {
        // --follow-fork: everyone keeps the variables.
        assert!(follow_keeps(FOLLOW_ALL, "/usr/bin/app"));
        // Through wrappers, no program named: the first non-wrapper is the end.
        assert!(follow_keeps("wrappers", "/usr/bin/dash"));
        assert!(follow_keeps("wrappers", "/usr/bin/env"));
        assert!(!follow_keeps("wrappers", "/tmp/app"));
        assert!(!follow_keeps("wrappers", "/usr/bin/python3.11"));
        // A probed program by path: everything before it keeps them (a python
        // script that runs it too), the program itself does not.
        let v = "wrappers:/tmp/app:/tmp/other";
        assert!(follow_keeps(v, "/usr/bin/python3.11"));
        assert!(follow_keeps(v, "/usr/bin/dash"));
        assert!(!follow_keeps(v, "/tmp/app"));
        assert!(!follow_keeps(v, "/tmp/other"));
    }
}
