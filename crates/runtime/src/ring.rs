//! Per-thread event rings: single producer (the thread), single consumer (weft).
//!
//! Positions are byte counters that only grow; the ring index is `pos & (size - 1)`.
//! A record never wraps: when it would cross the end, a pad record fills the rest and
//! the record starts at index 0. A full ring drops the record and counts it.

use core::sync::atomic::Ordering;
use weft_abi::{EventHeader, ThreadSlot, EVENT_HEADER_SIZE, EVENT_PAD};

/// Write one event. When the ring is full, wait up to `wait` spins for the consumer
/// to make room (unless this thread's last wait ran out: see
/// `ThreadSlot::ring_stalled`); returns false (and counts a lost event) when there
/// is still none.
///
/// # Safety
/// `slot` is this thread's slot and `ring` its ring of `size` bytes; only this thread
/// produces into it.
#[allow(clippy::too_many_arguments)]
pub unsafe fn produce(
    slot: *mut ThreadSlot,
    ring: *mut u8,
    size: u64,
    kind: u32,
    id: u32,
    args: (u32, u32),
    nsecs: u64,
    payload: &[u8],
    wait: u64,
) -> bool {
    // SAFETY: the caller guarantees slot is valid.
    let s = unsafe { &*slot };
    s.events_produced.store(
        s.events_produced.load(Ordering::Relaxed) + 1,
        Ordering::Relaxed,
    );
    let len = (u64::from(EVENT_HEADER_SIZE) + payload.len() as u64).div_ceil(8) * 8;
    let head = s.ring_head.load(Ordering::Relaxed);
    let pos = head & (size - 1);
    let to_end = size - pos;
    let pad = if len > to_end { to_end } else { 0 };
    let mut spins = 0;
    loop {
        let tail = s.ring_tail.load(Ordering::Acquire);
        if len <= size && head + pad + len - tail <= size {
            break;
        }
        if len > size || spins >= wait || s.ring_stalled.load(Ordering::Relaxed) != 0 {
            if spins > 0 && spins >= wait {
                s.ring_stalled.store(1, Ordering::Relaxed);
            }
            s.events_lost
                .store(s.events_lost.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
            return false;
        }
        spins += 1;
        core::hint::spin_loop();
    }
    let mut head = head;
    if pad != 0 {
        // SAFETY: pos..size is inside the ring; a pad header needs 8 bytes, and
        // records are 8-aligned so at least 8 bytes remain.
        unsafe {
            let p = ring.add(pos as usize) as *mut u32;
            p.write(pad as u32);
            p.add(1).write(EVENT_PAD);
        }
        head += pad;
    }
    let pos = (head & (size - 1)) as usize;
    let hdr = EventHeader {
        len: len as u32,
        kind,
        id,
        payload_len: payload.len() as u32,
        arg0: args.0,
        arg1: args.1,
        nsecs,
    };
    // SAFETY: pos + len <= size (no wrap), the space is free (checked against tail).
    unsafe {
        (ring.add(pos) as *mut EventHeader).write_unaligned(hdr);
        core::ptr::copy_nonoverlapping(
            payload.as_ptr(),
            ring.add(pos + EVENT_HEADER_SIZE as usize),
            payload.len(),
        );
    }
    s.ring_head.store(head + len, Ordering::Release);
    true
}

/// Whether a record of `payload_len` bytes fits in the ring now, wherever its head
/// stands (so a producer that can wait for the consumer need not lose it).
///
/// # Safety
/// `slot` is a valid thread slot whose ring has `size` bytes.
pub unsafe fn fits(slot: *mut ThreadSlot, size: u64, payload_len: usize) -> bool {
    // SAFETY: the caller guarantees slot is valid.
    let s = unsafe { &*slot };
    let len = (u64::from(EVENT_HEADER_SIZE) + payload_len as u64).div_ceil(8) * 8;
    let used = s.ring_head.load(Ordering::Relaxed) - s.ring_tail.load(Ordering::Acquire);
    // At worst a pad of almost `len` bytes goes before the record.
    used + 2 * len <= size
}

/// One event read from a ring (consumer side).
#[derive(Debug, Clone)]
pub struct Event {
    pub header: EventHeader,
    pub payload: Vec<u8>,
}

/// Drain every complete record from a ring. Returns the events in order.
///
/// # Safety
/// `slot`/`ring` describe a mapped thread slot of the current segment; only one
/// consumer drains a given ring.
pub unsafe fn consume(slot: *mut ThreadSlot, ring: *const u8, size: u64, out: &mut Vec<Event>) {
    // SAFETY: as the caller guarantees.
    unsafe {
        consume_each(slot, ring, size, |header, payload| {
            out.push(Event {
                header: *header,
                payload: payload.to_vec(),
            })
        })
    }
}

/// Drain every complete record from a ring, handing each header and payload to
/// `f` in order, in place (the space is given back to the producer after the last).
///
/// # Safety
/// As [`consume`].
pub unsafe fn consume_each(
    slot: *mut ThreadSlot,
    ring: *const u8,
    size: u64,
    mut f: impl FnMut(&EventHeader, &[u8]),
) {
    // SAFETY: caller guarantees validity.
    let s = unsafe { &*slot };
    let head = s.ring_head.load(Ordering::Acquire);
    let mut tail = s.ring_tail.load(Ordering::Relaxed);
    while tail < head {
        let pos = (tail & (size - 1)) as usize;
        // SAFETY: pos is inside the ring; the producer published up to head.
        let (len, kind) = unsafe {
            let p = ring.add(pos) as *const u32;
            (p.read(), p.add(1).read())
        };
        if len == 0 || u64::from(len) > size {
            // Corrupt ring: skip to head rather than loop.
            tail = head;
            break;
        }
        if kind != EVENT_PAD {
            // SAFETY: a complete record of `len` bytes starts at pos.
            let rec = unsafe { core::slice::from_raw_parts(ring.add(pos), len as usize) };
            if let Some((header, payload)) = parse(rec) {
                f(&header, payload);
            }
        }
        tail += u64::from(len);
    }
    s.ring_tail.store(tail, Ordering::Release);
    // Room again: a producer whose wait ran out waits again next time.
    if s.ring_stalled.load(Ordering::Relaxed) != 0 {
        s.ring_stalled.store(0, Ordering::Relaxed);
    }
}

/// Drain every complete record from a ring, as [`consume_each`] does, but hand
/// each run of consecutive records that `raw` accepts (by kind and id) to `run` as
/// the ring's own bytes, whole records back to back (pads and the ring's end cut
/// runs), and every other record to `f`. What `weft record` writes to its file
/// as it is, decoded only when the file is read.
///
/// # Safety
/// As [`consume`].
pub unsafe fn consume_runs(
    slot: *mut ThreadSlot,
    ring: *const u8,
    size: u64,
    mut raw: impl FnMut(u32, u32) -> bool,
    mut run: impl FnMut(&[u8]),
    mut f: impl FnMut(&EventHeader, &[u8]),
) {
    // SAFETY: caller guarantees validity.
    let s = unsafe { &*slot };
    let head = s.ring_head.load(Ordering::Acquire);
    let mut tail = s.ring_tail.load(Ordering::Relaxed);
    // The run being gathered: ring offsets [start, end).
    let mut open: Option<(usize, usize)> = None;
    let flush = |open: &mut Option<(usize, usize)>, run: &mut dyn FnMut(&[u8])| {
        if let Some((a, b)) = open.take() {
            // SAFETY: a..b lies inside the ring, whole records the producer published.
            run(unsafe { core::slice::from_raw_parts(ring.add(a), b - a) });
        }
    };
    while tail < head {
        let pos = (tail & (size - 1)) as usize;
        // SAFETY: pos is inside the ring; the producer published up to head.
        let (len, kind, id) = unsafe {
            let p = ring.add(pos) as *const u32;
            let (len, word) = (p.read(), p.add(1).read());
            match weft_abi::short_event_header(len, word, 0) {
                Some(h) => (len, h.kind, h.id),
                None => (len, word, p.add(2).read()),
            }
        };
        if len == 0 || u64::from(len) > size {
            tail = head;
            break;
        }
        let end = pos + len as usize;
        if kind != EVENT_PAD && raw(kind, id) {
            match &mut open {
                Some((_, b)) if *b == pos => *b = end,
                _ => {
                    flush(&mut open, &mut run);
                    open = Some((pos, end));
                }
            }
        } else {
            flush(&mut open, &mut run);
            if kind != EVENT_PAD {
                // SAFETY: a complete record of `len` bytes starts at pos.
                let rec = unsafe { core::slice::from_raw_parts(ring.add(pos), len as usize) };
                if let Some((header, payload)) = parse(rec) {
                    f(&header, payload);
                }
            }
        }
        tail += u64::from(len);
    }
    flush(&mut open, &mut run);
    s.ring_tail.store(tail, Ordering::Release);
    if s.ring_stalled.load(Ordering::Relaxed) != 0 {
        s.ring_stalled.store(0, Ordering::Relaxed);
    }
}

/// The records in `bytes` (a run [`consume_runs`] handed out, or the ring format
/// read back from a file): each header and its payload, `None` where the bytes
/// stop making sense.
pub fn records(bytes: &[u8]) -> impl Iterator<Item = Option<(EventHeader, &[u8])>> + '_ {
    let mut at = 0usize;
    core::iter::from_fn(move || {
        if at >= bytes.len() {
            return None;
        }
        let item = (|| {
            let len = u32::from_le_bytes(bytes.get(at..at + 4)?.try_into().ok()?) as usize;
            let (h, payload) = parse(bytes.get(at..at + len)?)?;
            at += len;
            Some((h, payload))
        })();
        if item.is_none() {
            at = bytes.len();
        }
        Some(item)
    })
}

/// One whole record (`rec` is exactly its bytes): its header, a short function
/// event expanded (`weft_abi::short_event_header`), and its payload. `None` for a
/// record too short for what it says it is.
pub fn parse(rec: &[u8]) -> Option<(EventHeader, &[u8])> {
    let word = |o: usize| Some(u32::from_le_bytes(rec.get(o..o + 4)?.try_into().ok()?));
    let (len, kind) = (word(0)?, word(4)?);
    if rec.len() == weft_abi::SHORT_EVENT_SIZE as usize {
        let nsecs = u64::from_le_bytes(rec.get(8..16)?.try_into().ok()?);
        if let Some(h) = weft_abi::short_event_header(len, kind, nsecs) {
            return Some((h, &[]));
        }
    }
    let hs = EVENT_HEADER_SIZE as usize;
    if rec.len() < hs {
        return None;
    }
    // SAFETY: rec holds EVENT_HEADER_SIZE bytes; any bytes are a valid header.
    let h = unsafe { (rec.as_ptr() as *const EventHeader).read_unaligned() };
    let plen = (h.payload_len as usize).min(rec.len() - hs);
    Some((h, &rec[hs..hs + plen]))
}

/// A header as its readers take it: a TSC-timed function event
/// (`weft_abi::EVENT_FUNC_ENTRY_TSC`) becomes the entry or exit it stands for,
/// its time converted on `lines`; any other header is left as it is.
#[inline]
pub fn timed(mut h: EventHeader, lines: &crate::clock::TscLines) -> EventHeader {
    if let Some(kind) = weft_abi::tsc_event_kind(h.kind) {
        h.kind = kind;
        h.nsecs = lines.ns(h.nsecs);
    }
    h
}

/// The time of the record at the start of `bytes` (whole records), short or not,
/// raw or not.
pub fn first_time(bytes: &[u8], lines: &crate::clock::TscLines) -> Option<u64> {
    records(bytes)
        .next()
        .flatten()
        .map(|(h, _)| timed(h, lines).nsecs)
}

/// Spins of [`core::hint::spin_loop`] (`pause`) that take at least about `ns`
/// nanoseconds on this machine (measured: `pause` takes from a few to over a
/// hundred cycles depending on the CPU; the fastest of several short batches, so
/// that being descheduled while measuring never shortens the wait).
pub fn spins_for(ns: u64) -> u64 {
    const N: u64 = 2_000;
    let mut per = f64::MAX;
    for _ in 0..20 {
        let t0 = crate::clock::monotonic_ns();
        for _ in 0..N {
            core::hint::spin_loop();
        }
        per = per.min((crate::clock::monotonic_ns() - t0).max(1) as f64 / N as f64);
    }
    (ns as f64 / per) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_function_events_read_as_entries_and_exits() {
        let mut bytes = Vec::new();
        // A short entry of site 70,000 at time 5, a full exit, a short exit.
        let short = |b: &mut Vec<u8>, code: u32, site: u32, t: u64| {
            b.extend_from_slice(&16u32.to_le_bytes());
            b.extend_from_slice(&(code | site << 8).to_le_bytes());
            b.extend_from_slice(&t.to_le_bytes());
        };
        short(&mut bytes, weft_abi::EVENT_FUNC_ENTRY_SHORT, 70_000, 5);
        let full = EventHeader {
            len: 32,
            kind: weft_abi::EVENT_FUNC_EXIT,
            id: 3,
            payload_len: 0,
            arg0: 9,
            arg1: 0,
            nsecs: 6,
        };
        // SAFETY: EventHeader is plain data, 32 bytes.
        bytes.extend_from_slice(unsafe {
            core::slice::from_raw_parts(&full as *const EventHeader as *const u8, 32)
        });
        short(&mut bytes, weft_abi::EVENT_FUNC_EXIT_SHORT, 70_000, 7);
        let got: Vec<(u32, u32, u64, u32)> = records(&bytes)
            .map(|r| r.map(|(h, _)| (h.kind, h.id, h.nsecs, h.arg0)).unwrap())
            .collect();
        assert_eq!(
            got,
            [
                (weft_abi::EVENT_FUNC_ENTRY, 70_000, 5, 0),
                (weft_abi::EVENT_FUNC_EXIT, 3, 6, 9),
                (weft_abi::EVENT_FUNC_EXIT, 70_000, 7, 0)
            ]
        );
        let none = crate::clock::TscLines::default();
        assert_eq!(first_time(&bytes, &none), Some(5));
        // TSC-timed ones: their own kinds, raw, until `timed` converts them on the
        // line they were read under.
        let mut raw = Vec::new();
        short(&mut raw, weft_abi::EVENT_FUNC_ENTRY_TSC, 4, 1500);
        short(&mut raw, weft_abi::EVENT_FUNC_EXIT_TSC, 4, 1600);
        let heads: Vec<EventHeader> = records(&raw).map(|r| r.unwrap().0).collect();
        assert_eq!(
            (heads[0].kind, heads[1].kind, heads[1].nsecs),
            (
                weft_abi::EVENT_FUNC_ENTRY_TSC,
                weft_abi::EVENT_FUNC_EXIT_TSC,
                1600
            )
        );
        let mut lines = crate::clock::TscLines::default();
        lines.add(crate::clock::TscLine {
            mult: 2 << weft_abi::TSC_SHIFT,
            base_tsc: 1000,
            base_ns: 50,
        });
        let exit = timed(heads[1], &lines);
        assert_eq!(
            (exit.kind, exit.id, exit.nsecs),
            (weft_abi::EVENT_FUNC_EXIT, 4, 1250)
        );
        assert_eq!(first_time(&raw, &lines), Some(1050));
        assert_eq!(timed(full, &lines), full);
        // A 16-byte record of another kind is not a function event; cut short, nothing.
        let mut odd = bytes[..16].to_vec();
        odd[4] = 1;
        assert!(records(&odd).next().unwrap().is_none());
        assert!(records(&bytes[..12]).next().unwrap().is_none());
    }

    #[test]
    fn runs_hold_whole_records_cut_by_others_and_the_ring_end() {
        let mut slot_mem = vec![0u64; 64];
        let slot = slot_mem.as_mut_ptr() as *mut ThreadSlot;
        let size = 256u64;
        let mut ring = vec![0u64; 32];
        let r = ring.as_mut_ptr() as *mut u8;
        let (mut runs, mut others) = (Vec::new(), Vec::new());
        let drain = |runs: &mut Vec<Vec<u8>>, others: &mut Vec<u32>| {
            // SAFETY: a ring and slot of this test's own.
            unsafe {
                consume_runs(
                    slot,
                    r,
                    size,
                    |k, _| k == 1,
                    |b| runs.push(b.to_vec()),
                    |h, _| others.push(h.id),
                )
            }
        };
        let mut ids = Vec::new();
        // Kinds 1 (raw) and 2 (not): 1 1 2 1, then five 1s across the ring's end.
        for (i, kind) in [1, 1, 2, 1, 1, 1, 1, 1, 1].into_iter().enumerate() {
            // SAFETY: a ring and slot of this test's own.
            let ok = unsafe { produce(slot, r, size, kind, i as u32, (0, 0), i as u64, &[], 0) };
            assert!(ok);
            if i == 3 {
                drain(&mut runs, &mut others);
            }
        }
        drain(&mut runs, &mut others);
        for run in &runs {
            ids.push(records(run).map(|x| x.unwrap().0.id).collect::<Vec<_>>());
        }
        assert_eq!(others, [2]);
        // 32-byte records: 8 fill the ring, so the 9th starts again at 0 and the
        // last run is cut there.
        assert_eq!(ids, [vec![0, 1], vec![3], vec![4, 5, 6, 7], vec![8]]);
    }

    #[test]
    fn produce_consume_wrap_and_loss() {
        let mut slot_mem = vec![0u64; 64];
        let slot = slot_mem.as_mut_ptr() as *mut ThreadSlot;
        let size = 256u64;
        let mut ring = vec![0u64; 32];
        let r = ring.as_mut_ptr() as *mut u8;
        let mut out = Vec::new();
        let mut produced = 0u32;
        // 40-byte records (32 header + 8 payload): wraps several times.
        for round in 0..10u32 {
            for _ in 0..3 {
                assert!(unsafe {
                    produce(
                        slot,
                        r,
                        size,
                        1,
                        produced,
                        (0, 0),
                        0,
                        &produced.to_le_bytes(),
                        0,
                    )
                });
                produced += 1;
            }
            unsafe { consume(slot, r, size, &mut out) };
            assert_eq!(out.len() as u32, produced, "round {round}");
        }
        for (i, e) in out.iter().enumerate() {
            assert_eq!(e.header.id, i as u32);
            assert_eq!(e.payload, (i as u32).to_le_bytes());
        }
        // Fill without consuming: some are lost, and counted.
        let mut ok = 0;
        for i in 0..20u32 {
            if unsafe { produce(slot, r, size, 1, i, (0, 0), 0, &[0u8; 8], 0) } {
                ok += 1;
            }
        }
        let s = unsafe { &*slot };
        assert_eq!(ok + s.events_lost.load(Ordering::Relaxed), 20);
        assert!(s.events_lost.load(Ordering::Relaxed) > 0);
        let mut out2 = Vec::new();
        unsafe { consume(slot, r, size, &mut out2) };
        assert_eq!(out2.len() as u64, ok);
    }

    /// A producer whose wait for room runs out (weft stopped) drops at once from
    /// then on, until the consumer drains: it never waits more than once.
    #[test]
    fn a_wait_that_runs_out_is_not_repeated_until_a_drain() {
        let mut slot_mem = vec![0u64; 64];
        let slot = slot_mem.as_mut_ptr() as *mut ThreadSlot;
        let size = 128u64;
        let mut ring = vec![0u64; 16];
        let r = ring.as_mut_ptr() as *mut u8;
        let put = |wait| unsafe { produce(slot, r, size, 1, 0, (0, 0), 0, &[0u8; 8], wait) };
        let s = unsafe { &*slot };
        // Three 40-byte records fill it.
        assert!(put(1000) && put(1000) && put(1000));
        assert!(!put(1000));
        assert_eq!(s.ring_stalled.load(Ordering::Relaxed), 1);
        assert_eq!(s.events_lost.load(Ordering::Relaxed), 1);
        // Stalled: dropped without waiting (a huge wait would hang the test).
        assert!(!put(u64::MAX));
        assert_eq!(s.events_lost.load(Ordering::Relaxed), 2);
        let mut out = Vec::new();
        unsafe { consume(slot, r, size, &mut out) };
        assert_eq!(out.len(), 3);
        assert_eq!(s.ring_stalled.load(Ordering::Relaxed), 0);
        assert!(put(1000));
        // Without a wait (bpftrace's way), a full ring drops and never stalls.
        assert!(put(0) && put(0));
        assert!(!put(0));
        assert_eq!(s.ring_stalled.load(Ordering::Relaxed), 0);
    }
}
