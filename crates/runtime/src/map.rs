//! Maps in the shared segment.
//!
//! Every map has one key table: open addressing, linear probing, a power-of-two
//! number of entries, each `EntryHeader { state, hash }` + key (+ value for plain
//! maps). Keys are inserted with a compare-and-swap on `state` (EMPTY → BUSY → LIVE),
//! so threads never take a lock. Aggregations keep their values per thread: entry
//! `i`'s accumulator for thread `t` is at `agg_area(t) + desc.agg_off + i *
//! value_size`, written only by thread `t` (plain loads and stores, no atomic
//! read-modify-write) and summed by weft when it reads the map.
//!
//! A deleted entry becomes a tombstone that only the same key may revive, so probe
//! chains stay intact without rehashing.

use core::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use weft_abi::{
    entry_layout, hist_index, key_hash, lhist_index, EntryHeader, MapDesc, MapKind, ThreadSlot,
    ENTRY_BUSY, ENTRY_DELETED, ENTRY_EMPTY, ENTRY_LIVE, TSERIES_AVG, TSERIES_LAST, TSERIES_MAX,
    TSERIES_MIN, TSERIES_SUM, TSERIES_WORDS,
};

use crate::shm::Shm;

/// Bounded spin on an entry another thread is inserting (it may be stopped).
const BUSY_SPINS: u32 = 10_000;
/// Then yields to it, at most this many times.
const BUSY_YIELDS: u32 = 100_000;

#[inline]
fn entry_ptr(shm: &Shm, d: &MapDesc, i: u32) -> *mut u8 {
    shm.at(d.table_off + u64::from(i) * u64::from(d.entry_size))
}

#[inline]
fn header(e: *mut u8) -> &'static EntryHeader {
    // SAFETY: every entry starts with an EntryHeader, 8-aligned.
    unsafe { &*(e as *const EntryHeader) }
}

#[inline]
fn key_of<'a>(e: *mut u8, key_size: u32) -> &'a [u8] {
    // SAFETY: the key follows the 8-byte header.
    unsafe { core::slice::from_raw_parts(e.add(8), key_size as usize) }
}

/// Pointer to the value of a plain map's entry.
#[inline]
pub fn plain_value_ptr(shm: &Shm, d: &MapDesc, i: u32) -> *mut u8 {
    let (_, voff, _) = entry_layout(d.key_size, d.value_size);
    // SAFETY: the value lies inside the entry.
    unsafe { entry_ptr(shm, d, i).add(voff as usize) }
}

/// In a forked child: copy every `MAP_FLAG_INHERIT_PID` map's entry for `parent`
/// to `child` (a group member's child is a member). Plain maps keyed by an 8-byte
/// pid; a full map counts the drop as any insert does. Returns the entries copied.
pub fn inherit(shm: &Shm, parent: u32, child: u32) -> usize {
    let mut copied = 0;
    for id in 0..shm.map_count() {
        let d = shm.map(id);
        if d.flags & weft_abi::MAP_FLAG_INHERIT_PID == 0
            || d.kind != MapKind::Plain as u32
            || d.key_size != 8
        {
            continue;
        }
        let Some(from) = find(shm, d, &u64::from(parent).to_le_bytes()) else {
            continue;
        };
        let Some(to) = insert(shm, d, &u64::from(child).to_le_bytes()).index() else {
            continue;
        };
        // SAFETY: both are live entries of this plain map; values do not overlap.
        unsafe {
            core::ptr::copy_nonoverlapping(
                plain_value_ptr(shm, d, from),
                plain_value_ptr(shm, d, to),
                d.value_size as usize,
            );
        }
        copied += 1;
    }
    copied
}

/// Key bytes of entry `i` (valid while the entry is LIVE).
pub fn key_bytes<'a>(shm: &'a Shm, d: &MapDesc, i: u32) -> &'a [u8] {
    key_of(entry_ptr(shm, d, i), d.key_size)
}

pub fn entry_state(shm: &Shm, d: &MapDesc, i: u32) -> u32 {
    header(entry_ptr(shm, d, i)).state.load(Ordering::Acquire)
}

/// Find a live entry for `key`.
pub fn find(shm: &Shm, d: &MapDesc, key: &[u8]) -> Option<u32> {
    if d.key_size == 0 {
        return (entry_state(shm, d, 0) == ENTRY_LIVE).then_some(0);
    }
    let mask = d.capacity - 1;
    let h = key_hash(key);
    let mut i = h & mask;
    for _ in 0..d.capacity {
        let e = entry_ptr(shm, d, i);
        let hd = header(e);
        match hd.state.load(Ordering::Acquire) {
            ENTRY_EMPTY => return None,
            st => {
                if hd.hash == h && key_of(e, d.key_size) == key {
                    return (st == ENTRY_LIVE).then_some(i);
                }
            }
        }
        i = (i + 1) & mask;
    }
    None
}

/// Outcome of [`insert`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Insert {
    Existing(u32),
    New(u32),
    Full,
}

impl Insert {
    pub fn index(self) -> Option<u32> {
        match self {
            Insert::Existing(i) | Insert::New(i) => Some(i),
            Insert::Full => None,
        }
    }
}

fn claim_count(d: &MapDesc) -> bool {
    let mut n = d.count.load(Ordering::Relaxed);
    loop {
        if n >= d.max_entries {
            return false;
        }
        match d
            .count
            .compare_exchange_weak(n, n + 1, Ordering::AcqRel, Ordering::Relaxed)
        {
            Ok(_) => return true,
            Err(cur) => n = cur,
        }
    }
}

/// Find or insert `key`. A full map counts the drop in `full_drops`.
pub fn insert(shm: &Shm, d: &MapDesc, key: &[u8]) -> Insert {
    if d.key_size == 0 {
        let hd = header(entry_ptr(shm, d, 0));
        let st = hd.state.load(Ordering::Acquire);
        if st == ENTRY_LIVE {
            return Insert::Existing(0);
        }
        if hd
            .state
            .compare_exchange(st, ENTRY_LIVE, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            d.count.store(1, Ordering::Relaxed);
            return Insert::New(0);
        }
        return Insert::Existing(0);
    }
    let mask = d.capacity - 1;
    let h = key_hash(key);
    let mut i = h & mask;
    let mut probes = 0;
    while probes < d.capacity {
        let e = entry_ptr(shm, d, i);
        let hd = header(e);
        let mut st = hd.state.load(Ordering::Acquire);
        if st == ENTRY_BUSY {
            let mut spins = 0;
            while st == ENTRY_BUSY && spins < BUSY_SPINS {
                core::hint::spin_loop();
                st = hd.state.load(Ordering::Acquire);
                spins += 1;
            }
            // Its inserter is descheduled: it may be inserting this very key, so
            // moving on would put the key in a second entry (and a load would find
            // the first before its value is written). Yield to it, a bounded while;
            // if it never publishes (it died there), drop the update, counted.
            let mut yields = 0;
            while st == ENTRY_BUSY && yields < BUSY_YIELDS {
                // SAFETY: sched_yield has no preconditions (the contended path
                // only: an inserter descheduled between two stores).
                unsafe { libc::sched_yield() };
                st = hd.state.load(Ordering::Acquire);
                yields += 1;
            }
            if st == ENTRY_BUSY {
                d.full_drops.fetch_add(1, Ordering::Relaxed);
                return Insert::Full;
            }
        }
        match st {
            ENTRY_EMPTY => {
                if !claim_count(d) {
                    d.full_drops.fetch_add(1, Ordering::Relaxed);
                    return Insert::Full;
                }
                if hd
                    .state
                    .compare_exchange(ENTRY_EMPTY, ENTRY_BUSY, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
                {
                    // SAFETY: we own the entry while it is BUSY; header and key lie in it.
                    unsafe {
                        let hp = e as *mut EntryHeader;
                        core::ptr::addr_of_mut!((*hp).hash).write(h);
                        core::ptr::copy_nonoverlapping(key.as_ptr(), e.add(8), key.len());
                    }
                    hd.state.store(ENTRY_LIVE, Ordering::Release);
                    return Insert::New(i);
                }
                // Lost the race for this entry: give the count back and look again.
                d.count.fetch_sub(1, Ordering::Relaxed);
                continue;
            }
            ENTRY_LIVE | ENTRY_DELETED if hd.hash == h && key_of(e, d.key_size) == key => {
                if st == ENTRY_LIVE {
                    return Insert::Existing(i);
                }
                if !claim_count(d) {
                    d.full_drops.fetch_add(1, Ordering::Relaxed);
                    return Insert::Full;
                }
                if hd
                    .state
                    .compare_exchange(
                        ENTRY_DELETED,
                        ENTRY_LIVE,
                        Ordering::AcqRel,
                        Ordering::Acquire,
                    )
                    .is_ok()
                {
                    return Insert::New(i);
                }
                d.count.fetch_sub(1, Ordering::Relaxed);
                continue;
            }
            _ => {}
        }
        i = (i + 1) & mask;
        probes += 1;
    }
    d.full_drops.fetch_add(1, Ordering::Relaxed);
    Insert::Full
}

/// Delete `key` (or the scalar entry). Accumulators of all threads are zeroed so a
/// revived key starts from nothing. Returns true when an entry was deleted.
pub fn delete(shm: &Shm, d: &MapDesc, key: &[u8]) -> bool {
    let Some(i) = find(shm, d, key) else {
        return false;
    };
    let hd = header(entry_ptr(shm, d, i));
    if hd
        .state
        .compare_exchange(
            ENTRY_LIVE,
            ENTRY_DELETED,
            Ordering::AcqRel,
            Ordering::Acquire,
        )
        .is_err()
    {
        return false;
    }
    d.count.fetch_sub(1, Ordering::Relaxed);
    zero_entry_values(shm, d, i);
    true
}

fn zero_entry_values(shm: &Shm, d: &MapDesc, i: u32) {
    if d.kind == MapKind::Plain as u32 {
        let v = plain_value_ptr(shm, d, i);
        // SAFETY: the value area of the entry, value_size bytes.
        unsafe { core::ptr::write_bytes(v, 0, d.value_size as usize) };
        return;
    }
    across_folds(shm, || {
        for t in 0..shm.slots_used() {
            let p = accumulator(shm, d, shm.thread_slot(t), i);
            zero_words(p, d.value_size);
        }
    });
}

fn zero_words(p: *mut u8, size: u32) {
    for w in 0..(size / 8) as usize {
        // SAFETY: accumulators are 8-aligned and `size` bytes long.
        unsafe { (*(p as *const AtomicU64).add(w)).store(0, Ordering::Relaxed) };
    }
}

/// Whether a map is a scalar `count()`: its single entry always exists (bpftrace
/// prints `@c: 0` even when it was never hit), and inline advice relies on that.
fn permanent_entry(d: &MapDesc) -> bool {
    d.key_size == 0 && d.kind == MapKind::Count as u32
}

/// `clear(@m)`: remove every entry (a scalar count is zeroed instead).
pub fn clear(shm: &Shm, d: &MapDesc) {
    if permanent_entry(d) {
        zero(shm, d);
        return;
    }
    for i in 0..d.capacity {
        let hd = header(entry_ptr(shm, d, i));
        let st = hd.state.load(Ordering::Acquire);
        if st == ENTRY_LIVE {
            zero_entry_values(shm, d, i);
        }
        if st != ENTRY_EMPTY {
            hd.state.store(ENTRY_EMPTY, Ordering::Release);
        }
    }
    d.count.store(0, Ordering::Relaxed);
    d.generation.fetch_add(1, Ordering::Relaxed);
}

/// `zero(@m)`: keep the keys, zero the values.
pub fn zero(shm: &Shm, d: &MapDesc) {
    for i in 0..d.capacity {
        if entry_state(shm, d, i) == ENTRY_LIVE {
            zero_entry_values(shm, d, i);
        }
    }
    d.generation.fetch_add(1, Ordering::Relaxed);
}

/// Pointer to thread `slot`'s accumulator for entry `i`.
#[inline]
pub fn accumulator(shm: &Shm, d: &MapDesc, slot: *mut ThreadSlot, i: u32) -> *mut u8 {
    // SAFETY: the accumulators of this map lie in the slot's aggregation area.
    unsafe {
        shm.agg_area(slot)
            .add((d.agg_off + u64::from(i) * u64::from(d.value_size)) as usize)
    }
}

#[inline]
fn word(p: *mut u8, i: usize) -> &'static AtomicU64 {
    // SAFETY: accumulators are 8-aligned arrays of u64 words.
    unsafe { &*(p as *const AtomicU64).add(i) }
}

#[inline]
fn bump(w: &AtomicU64, by: u64) {
    // Only the owning thread writes: load + store, no locked instruction.
    w.store(
        w.load(Ordering::Relaxed).wrapping_add(by),
        Ordering::Relaxed,
    );
}

/// Aggregation operations, as passed to the `MapAgg` helper (`weft_abi::AGG_*`).
pub use weft_abi::{
    AGG_AVG, AGG_COUNT, AGG_HIST, AGG_LHIST, AGG_MAX, AGG_MIN, AGG_STATS, AGG_SUM, AGG_TSERIES,
};

/// Apply an aggregation to this thread's accumulator `acc` of map `d`.
#[inline]
pub fn aggregate(d: &MapDesc, acc: *mut u8, op: u32, v: u64) {
    let signed = d.signed != 0;
    let less = |a: u64, b: u64| {
        if signed {
            (a as i64) < (b as i64)
        } else {
            a < b
        }
    };
    match op {
        AGG_COUNT => bump(word(acc, 0), 1),
        AGG_SUM => bump(word(acc, 0), v),
        AGG_MIN | AGG_MAX => {
            let n = word(acc, 0).load(Ordering::Relaxed);
            let cur = word(acc, 1).load(Ordering::Relaxed);
            let better = if op == AGG_MIN {
                less(v, cur)
            } else {
                less(cur, v)
            };
            if n == 0 || better {
                word(acc, 1).store(v, Ordering::Relaxed);
            }
            word(acc, 0).store(n + 1, Ordering::Relaxed);
        }
        AGG_AVG | AGG_STATS => {
            let n = word(acc, 0).load(Ordering::Relaxed);
            bump(word(acc, 1), v);
            if n == 0 || less(v, word(acc, 2).load(Ordering::Relaxed)) {
                word(acc, 2).store(v, Ordering::Relaxed);
            }
            if n == 0 || less(word(acc, 3).load(Ordering::Relaxed), v) {
                word(acc, 3).store(v, Ordering::Relaxed);
            }
            word(acc, 0).store(n + 1, Ordering::Relaxed);
        }
        AGG_HIST => bump(word(acc, hist_index(v as i64, d.hist_k)), 1),
        AGG_LHIST => bump(
            word(
                acc,
                lhist_index(v as i64, d.lhist_min, d.lhist_max, d.lhist_step),
            ),
            1,
        ),
        AGG_TSERIES => tseries_write(d, acc, v, crate::clock::realtime_ns()),
        _ => {}
    }
}

/// `tseries(v, ...)` at time `now` (CLOCK_REALTIME ns): into the interval `now`
/// falls in, which replaces whatever older interval held its place (see
/// [`weft_abi::TSERIES_WORDS`]).
#[inline]
fn tseries_write(d: &MapDesc, acc: *mut u8, v: u64, now: u64) {
    let interval = d.tseries_interval_ns.max(1);
    let intervals = u64::from(d.tseries_intervals.max(1));
    let epoch = now / interval;
    let base = (epoch % intervals) as usize * TSERIES_WORDS;
    let (val, meta, ep) = (word(acc, base), word(acc, base + 1), word(acc, base + 2));
    let first_meta = match d.tseries_agg {
        TSERIES_LAST => now,
        TSERIES_AVG => 1,
        _ => 0,
    };
    if ep.load(Ordering::Relaxed) != epoch {
        val.store(v, Ordering::Relaxed);
        meta.store(first_meta, Ordering::Relaxed);
        ep.store(epoch, Ordering::Relaxed);
        return;
    }
    let signed = d.signed != 0;
    let cur = val.load(Ordering::Relaxed);
    let new = match d.tseries_agg {
        TSERIES_AVG => {
            bump(meta, 1);
            cur.wrapping_add(v)
        }
        TSERIES_SUM => cur.wrapping_add(v),
        TSERIES_MIN if less(signed, v, cur) => v,
        TSERIES_MAX if less(signed, cur, v) => v,
        TSERIES_MIN | TSERIES_MAX => cur,
        _ => {
            meta.store(now, Ordering::Relaxed);
            v
        }
    };
    val.store(new, Ordering::Relaxed);
}

#[inline]
fn less(signed: bool, a: u64, b: u64) -> bool {
    if signed {
        (a as i64) < (b as i64)
    } else {
        a < b
    }
}

/// Merge interval by interval: the newer interval wins a place; two threads'
/// values of the same interval combine as the aggregation does (the last write by
/// its time, avg by adding totals and counts).
fn tseries_combine(d: &MapDesc, acc: &mut [u64], src: impl Fn(usize) -> u64) {
    let signed = d.signed != 0;
    for base in (0..acc.len() / TSERIES_WORDS).map(|i| i * TSERIES_WORDS) {
        let (v, meta, epoch) = (src(base), src(base + 1), src(base + 2));
        if epoch == 0 || epoch < acc[base + 2] {
            continue;
        }
        if epoch > acc[base + 2] {
            acc[base..base + TSERIES_WORDS].copy_from_slice(&[v, meta, epoch]);
            continue;
        }
        let cur = acc[base];
        match d.tseries_agg {
            TSERIES_AVG => {
                acc[base] = cur.wrapping_add(v);
                acc[base + 1] = acc[base + 1].wrapping_add(meta);
            }
            TSERIES_SUM => acc[base] = cur.wrapping_add(v),
            TSERIES_MIN if less(signed, v, cur) => acc[base] = v,
            TSERIES_MAX if less(signed, cur, v) => acc[base] = v,
            TSERIES_MIN | TSERIES_MAX => {}
            _ if meta > acc[base + 1] => {
                acc[base] = v;
                acc[base + 1] = meta;
            }
            _ => {}
        }
    }
}

/// Fold one accumulator (words read through `src`) into `acc`, both in `d`'s layout:
/// what merging two threads' accumulators means for each kind. Sums, counts and
/// histogram buckets add; min/max add their counts and keep the better value;
/// avg/stats add counts and totals and keep the extreme minimum and maximum. An
/// accumulator with a count of 0 contributes nothing.
fn combine(d: &MapDesc, acc: &mut [u64], src: impl Fn(usize) -> u64) {
    let signed = d.signed != 0;
    let lt = |a: u64, b: u64| {
        if signed {
            (a as i64) < (b as i64)
        } else {
            a < b
        }
    };
    match d.kind {
        k if k == MapKind::Tseries as u32 => tseries_combine(d, acc, src),
        k if k == MapKind::Min as u32 || k == MapKind::Max as u32 => {
            let n = src(0);
            if n == 0 {
                return;
            }
            let v = src(1);
            let better = if k == MapKind::Min as u32 {
                lt(v, acc[1])
            } else {
                lt(acc[1], v)
            };
            if acc[0] == 0 || better {
                acc[1] = v;
            }
            acc[0] += n;
        }
        k if k == MapKind::Avg as u32 || k == MapKind::Stats as u32 => {
            let n = src(0);
            if n == 0 {
                return;
            }
            let (mn, mx) = (src(2), src(3));
            if acc[0] == 0 || lt(mn, acc[2]) {
                acc[2] = mn;
            }
            if acc[0] == 0 || lt(acc[3], mx) {
                acc[3] = mx;
            }
            acc[1] = acc[1].wrapping_add(src(1));
            acc[0] += n;
        }
        _ => {
            for (k, a) in acc.iter_mut().enumerate() {
                *a = a.wrapping_add(src(k));
            }
        }
    }
}

/// Merge the accumulators of entry `i` over every slot into `acc` (`value_size / 8`
/// zeroed words): live threads, threads that exited but are not drained yet, and the
/// retired slot, which holds what drained threads left.
/// Merge one accumulator (`src`, words in the map's layout) into `acc`, as values of
/// two threads merge.
pub fn combine_words(d: &MapDesc, acc: &mut [u64], src: &[u64]) {
    combine(d, acc, |k| src.get(k).copied().unwrap_or(0));
}

/// Set slot `slot`'s accumulator of entry `i` to `words` (weft: the kernel's share
/// of an aggregation, in weft's kernel slot).
pub fn set_accumulator(shm: &Shm, d: &MapDesc, slot: *mut ThreadSlot, i: u32, words: &[u64]) {
    let p = accumulator(shm, d, slot, i);
    for (k, w) in words.iter().enumerate().take((d.value_size / 8) as usize) {
        word(p, k).store(*w, Ordering::Relaxed);
    }
}

/// Sum entry `i`'s accumulators of every thread into `acc` (zeroed first).
fn merge_words(shm: &Shm, d: &MapDesc, i: u32, acc: &mut [u64]) {
    across_folds(shm, || {
        acc.fill(0);
        for t in 0..shm.slots_used() {
            let p = accumulator(shm, d, shm.thread_slot(t), i);
            combine(d, acc, |k| word(p, k).load(Ordering::Relaxed));
        }
    });
}

/// Run `f` (a read or a zeroing of every thread's accumulators) so that no fold of
/// drained slots into the retired slot overlaps it (`ShmHeader::retire_seq`): it
/// waits out a fold in progress and runs again if one happened meanwhile. A fold
/// takes microseconds, but weft may be descheduled in the middle of one (a busy
/// machine): past a short spin, the thread yields to it, as an insert yields to an
/// inserter. Bounded: weft stopped in the middle of a fold must not hang advice.
fn across_folds(shm: &Shm, mut f: impl FnMut()) {
    let seq = &shm.header().retire_seq;
    let mut waits = 0u32;
    while waits < 10_000 + BUSY_YIELDS {
        let before = seq.load(Ordering::Acquire);
        if before & 1 == 1 {
            waits += 1;
            if waits < 10_000 {
                core::hint::spin_loop();
            } else {
                // SAFETY: sched_yield has no preconditions (only while weft is in
                // the middle of a fold: not the hot path).
                unsafe { libc::sched_yield() };
            }
            continue;
        }
        f();
        if seq.load(Ordering::Acquire) == before {
            return;
        }
        waits += 1;
    }
    f();
}

/// Merge the accumulators of entry `i` over all threads into `out` (value_size
/// bytes), in the same layout.
pub fn merge(shm: &Shm, d: &MapDesc, i: u32, out: &mut [u8]) {
    let mut acc = vec![0u64; (d.value_size / 8) as usize];
    merge_words(shm, d, i, &mut acc);
    for (k, a) in acc.iter().enumerate() {
        out[k * 8..k * 8 + 8].copy_from_slice(&a.to_le_bytes());
    }
}

/// The entries of a map whose accumulators a drained slot may hold: `live` ones are
/// folded into the retired slot; every entry in use (live, deleted or being
/// inserted) is zeroed. Computed once per map for all the slots drained together.
pub struct FoldPlan {
    pub live: Vec<u32>,
    pub used: Vec<u32>,
}

/// What [`fold_into_retired`] does for map `d` now; `None` for a plain map (no
/// per-thread values).
pub fn fold_plan(shm: &Shm, d: &MapDesc) -> Option<FoldPlan> {
    if thread_keyed(d) {
        return Some(FoldPlan {
            live: Vec::new(),
            used: Vec::new(),
        });
    }
    if d.kind == MapKind::Plain as u32 {
        return None;
    }
    let mut plan = FoldPlan {
        live: Vec::new(),
        used: Vec::new(),
    };
    for i in 0..d.capacity {
        match entry_state(shm, d, i) {
            ENTRY_EMPTY => {}
            st => {
                if st == ENTRY_LIVE {
                    plan.live.push(i);
                }
                plan.used.push(i);
            }
        }
    }
    Some(plan)
}

/// Fold the accumulators of slot `from` (of a thread that is gone: nobody writes
/// them any more) into the retired slot, then zero them for the slot's next thread.
/// weft only: the retired slot has no other writer (but `clear`/`zero`/`delete`,
/// which zero it like any slot).
///
/// A `delete` or `clear` running in the target between the read of `from` and the
/// store into the retired slot may see the value survive, as it may for a live
/// thread's concurrent update.
pub fn fold_into_retired(shm: &Shm, d: &MapDesc, plan: &FoldPlan, from: *mut ThreadSlot, tid: u32) {
    if thread_keyed(d) {
        // The ended thread (`tid`)'s entry joins the key table, under its tid.
        let (present, value) = thread_entry(shm, d, from);
        if present {
            if let Some(i) = insert(shm, d, &u64::from(tid).to_le_bytes()).index() {
                // SAFETY: the live entry's value, 8 bytes (thread-keyed maps hold words).
                unsafe { (plain_value_ptr(shm, d, i) as *mut u64).write_volatile(value) };
            }
        }
        set_thread_entry(shm, d, from, None);
        return;
    }
    let words = (d.value_size / 8) as usize;
    let mut acc = vec![0u64; words];
    let retired = shm.thread_slot(weft_abi::RETIRED_SLOT);
    for &i in &plan.live {
        let src = accumulator(shm, d, from, i);
        let dst = accumulator(shm, d, retired, i);
        for (k, a) in acc.iter_mut().enumerate() {
            *a = word(dst, k).load(Ordering::Relaxed);
        }
        combine(d, &mut acc, |k| word(src, k).load(Ordering::Relaxed));
        for (k, a) in acc.iter().enumerate() {
            word(dst, k).store(*a, Ordering::Relaxed);
        }
    }
    for &i in &plan.used {
        zero_words(accumulator(shm, d, from, i), d.value_size);
    }
}

/// The merged scalar a map read (`@c` where `@c = count()`) yields: count, sum, min,
/// max, or avg (total / count, truncated toward zero).
pub fn merged_scalar(shm: &Shm, d: &MapDesc, i: u32) -> u64 {
    // On the stack: advice in the target calls this, and must not allocate.
    let mut buf = [0u64; 4];
    let words = (d.value_size / 8) as usize;
    if words > buf.len() {
        return 0;
    }
    merge_words(shm, d, i, &mut buf[..words]);
    let w = |k: usize| buf[k];
    match d.kind {
        k if k == MapKind::Count as u32 || k == MapKind::Sum as u32 => w(0),
        k if k == MapKind::Min as u32 || k == MapKind::Max as u32 => w(1),
        k if k == MapKind::Avg as u32 || k == MapKind::Stats as u32 => {
            let n = w(0);
            if n == 0 {
                0
            } else if d.signed != 0 {
                ((w(1) as i64) / (n as i64)) as u64
            } else {
                w(1) / n
            }
        }
        _ => 0,
    }
}

/// Whether map `d` keeps each thread's entry in the thread's slot
/// (`MAP_FLAG_THREAD_KEYED`).
#[inline]
pub fn thread_keyed(d: &MapDesc) -> bool {
    d.flags & weft_abi::MAP_FLAG_THREAD_KEYED != 0
}

/// A thread-keyed map's entry in thread slot `slot`: whether there is one, and its
/// value.
pub fn thread_entry(shm: &Shm, d: &MapDesc, slot: *mut ThreadSlot) -> (bool, u64) {
    let p = accumulator(shm, d, slot, 0);
    (
        word(p, 0).load(Ordering::Relaxed) != 0,
        word(p, 1).load(Ordering::Relaxed),
    )
}

/// Set (or with `None` remove) a thread-keyed map's entry in thread slot `slot`
/// (the calling thread's own, or one no thread owns).
pub fn set_thread_entry(shm: &Shm, d: &MapDesc, slot: *mut ThreadSlot, value: Option<u64>) {
    let p = accumulator(shm, d, slot, 0);
    word(p, 1).store(value.unwrap_or(0), Ordering::Relaxed);
    word(p, 0).store(u64::from(value.is_some()), Ordering::Relaxed);
}

/// Live entries in table order (weft side, for printing).
pub fn live_entries(shm: &Shm, d: &MapDesc) -> Vec<u32> {
    (0..d.capacity)
        .filter(|&i| entry_state(shm, d, i) == ENTRY_LIVE)
        .collect()
}

/// Keep the unused import of AtomicU32 meaningful for readers of EntryHeader.
#[allow(dead_code)]
type State = AtomicU32;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::{LayoutBuilder, MapSpec};

    fn segment(specs: &[MapSpec]) -> (Vec<u64>, Shm) {
        let mut b = LayoutBuilder::new(4, 4096);
        for s in specs {
            b.add_map(*s);
        }
        let layout = b.finish();
        let mut mem = vec![0u64; (layout.total_size as usize).div_ceil(8)];
        let shm = unsafe { Shm::from_base(mem.as_mut_ptr() as *mut u8) };
        layout.write_header(&shm, 1);
        (mem, shm)
    }

    #[test]
    fn insert_find_delete_revive() {
        let (_mem, shm) = segment(&[MapSpec::plain(8, 8, 16)]);
        let d = shm.map(0);
        let k1 = 5u64.to_le_bytes();
        let k2 = 6u64.to_le_bytes();
        assert_eq!(find(&shm, d, &k1), None);
        let i1 = insert(&shm, d, &k1);
        assert!(matches!(i1, Insert::New(_)));
        assert_eq!(insert(&shm, d, &k1), Insert::Existing(i1.index().unwrap()));
        assert!(insert(&shm, d, &k2).index().is_some());
        assert_eq!(d.count.load(Ordering::Relaxed), 2);
        assert!(delete(&shm, d, &k1));
        assert_eq!(find(&shm, d, &k1), None);
        assert!(find(&shm, d, &k2).is_some());
        assert_eq!(d.count.load(Ordering::Relaxed), 1);
        assert_eq!(insert(&shm, d, &k1), Insert::New(i1.index().unwrap()));
    }

    #[test]
    fn full_map_drops_and_counts() {
        let (_mem, shm) = segment(&[MapSpec::plain(8, 8, 4)]);
        let d = shm.map(0);
        for k in 0..4u64 {
            assert!(insert(&shm, d, &k.to_le_bytes()).index().is_some());
        }
        assert_eq!(insert(&shm, d, &99u64.to_le_bytes()), Insert::Full);
        assert_eq!(d.full_drops.load(Ordering::Relaxed), 1);
        assert!(
            insert(&shm, d, &3u64.to_le_bytes()).index().is_some(),
            "existing key still found"
        );
    }

    /// Two threads write `tseries(v, 100ns, 4)`: a newer interval replaces the
    /// older one in its place, values of one interval combine per aggregation, and
    /// the merge keeps the newest interval of each place.
    #[test]
    fn tseries_intervals_rotate_and_merge() {
        for (agg, expect) in [
            (TSERIES_LAST, 7u64),
            (TSERIES_AVG, 4 + 7 + 5),
            (TSERIES_MIN, 4),
            (TSERIES_MAX, 7),
            (TSERIES_SUM, 4 + 7 + 5),
        ] {
            let mut spec = MapSpec::agg(MapKind::Tseries, true, 0, 8 * 3 * 4, 1);
            spec.tseries = (100, 4, agg);
            let (_mem, shm) = segment(&[spec]);
            let d = shm.map(0);
            let i = insert(&shm, d, &[]).index().unwrap();
            shm.header().slots_used.store(4, Ordering::Relaxed);
            let (a, b) = (
                accumulator(&shm, d, shm.thread_slot(2), i),
                accumulator(&shm, d, shm.thread_slot(3), i),
            );
            tseries_write(d, a, 9, 1_000); // epoch 10, place 2
            tseries_write(d, a, 4, 1_410); // epoch 14 replaces it
            tseries_write(d, b, 5, 1_420);
            tseries_write(d, a, 7, 1_430);
            tseries_write(d, b, 1, 1_100); // epoch 11, place 3
            let mut out = [0u8; 96];
            merge(&shm, d, i, &mut out);
            let w: Vec<u64> = out
                .chunks(8)
                .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
                .collect();
            assert_eq!(&w[6..9], &[expect, w[7], 14], "agg {agg}");
            assert_eq!(&w[9..12], &[1, w[10], 11], "agg {agg}");
            assert_eq!(&w[..6], &[0; 6], "agg {agg}: places 0 and 1 unused");
            if agg == TSERIES_AVG {
                assert_eq!(w[7], 3, "three values in interval 14");
            }
        }
    }

    #[test]
    fn per_thread_accumulators_merge() {
        let (_mem, shm) = segment(&[MapSpec::agg(MapKind::Stats, true, 8, 32, 16)]);
        let d = shm.map(0);
        let i = insert(&shm, d, &1u64.to_le_bytes()).index().unwrap();
        for (t, vals) in [(2u32, [5i64, -3]), (3, [10, 2])] {
            shm.header().slots_used.store(t + 1, Ordering::Relaxed);
            let acc = accumulator(&shm, d, shm.thread_slot(t), i);
            for v in vals {
                aggregate(d, acc, AGG_STATS, v as u64);
            }
        }
        let mut out = [0u8; 32];
        merge(&shm, d, i, &mut out);
        let w: Vec<i64> = out
            .chunks(8)
            .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
            .collect();
        assert_eq!(w, vec![4, 14, -3, 10]);
        assert_eq!(merged_scalar(&shm, d, i) as i64, 3);
    }
}
