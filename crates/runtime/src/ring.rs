//! Per-thread event rings: single producer (the thread), single consumer (weft).
//!
//! Positions are byte counters that only grow; the ring index is `pos & (size - 1)`.
//! A record never wraps: when it would cross the end, a pad record fills the rest and
//! the record starts at index 0. A full ring drops the record and counts it.

use core::sync::atomic::Ordering;
use weft_abi::{EventHeader, ThreadSlot, EVENT_HEADER_SIZE, EVENT_PAD};

/// Write one event. Returns false (and counts a lost event) when the ring is full.
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
) -> bool {
    // SAFETY: the caller guarantees slot is valid.
    let s = unsafe { &*slot };
    s.events_produced.store(
        s.events_produced.load(Ordering::Relaxed) + 1,
        Ordering::Relaxed,
    );
    let len = (u64::from(EVENT_HEADER_SIZE) + payload.len() as u64).div_ceil(8) * 8;
    let head = s.ring_head.load(Ordering::Relaxed);
    let tail = s.ring_tail.load(Ordering::Acquire);
    let pos = head & (size - 1);
    let to_end = size - pos;
    let pad = if len > to_end { to_end } else { 0 };
    if len > size || head + pad + len - tail > size {
        s.events_lost
            .store(s.events_lost.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
        return false;
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
            let header = unsafe { (ring.add(pos) as *const EventHeader).read_unaligned() };
            let plen = (header.payload_len as usize).min(len as usize - EVENT_HEADER_SIZE as usize);
            let mut payload = vec![0u8; plen];
            // SAFETY: the payload follows the header inside the record.
            unsafe {
                core::ptr::copy_nonoverlapping(
                    ring.add(pos + EVENT_HEADER_SIZE as usize),
                    payload.as_mut_ptr(),
                    plen,
                )
            };
            out.push(Event { header, payload });
        }
        tail += u64::from(len);
    }
    s.ring_tail.store(tail, Ordering::Release);
}

#[cfg(test)]
mod tests {
    use super::*;

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
            if unsafe { produce(slot, r, size, 1, i, (0, 0), 0, &[0u8; 8]) } {
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
}
