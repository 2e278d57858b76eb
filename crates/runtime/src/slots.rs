//! Thread slots: claimed by a thread's first hit, given up when the thread is gone,
//! drained and reused (the states are documented at [`weft_abi::ThreadSlot`]).
//!
//! Who does what:
//! * a target thread, on its first hit in a session ([`claim`]): a slot from the free
//!   queue, else one never used, within the `max_live` limit — no lock, no system
//!   call, no allocation;
//! * the agent's control thread, once the thread is gone for the kernel
//!   ([`release`]): LIVE → DEAD;
//! * weft, after draining the rings of slots it saw DEAD ([`dead`], [`retire`]):
//!   folds their accumulators and counters into the retired slot, zeroes them,
//!   marks them FREE and pushes them on the free queue.

use core::sync::atomic::{AtomicU64, Ordering};
use weft_abi::{
    ThreadSlot, FIRST_THREAD_SLOT, RETIRED_SLOT, THREAD_DEAD, THREAD_FREE, THREAD_LIVE, WEFT_SLOT,
};

use crate::map;
use crate::shm::Shm;

/// A slot for the calling thread (`tid` of process `pid`), LIVE on return; `None`
/// when `max_live` threads hold one or none is free (the caller counts the hit as
/// dropped).
pub fn claim(shm: &Shm, pid: u32, tid: u32) -> Option<*mut ThreadSlot> {
    let h = shm.header();
    let mut live = h.threads_live.load(Ordering::Relaxed);
    loop {
        if live >= h.max_live {
            return None;
        }
        match h.threads_live.compare_exchange_weak(
            live,
            live + 1,
            Ordering::AcqRel,
            Ordering::Relaxed,
        ) {
            Ok(_) => break,
            Err(now) => live = now,
        }
    }
    h.threads_live_peak.fetch_max(live + 1, Ordering::Relaxed);
    let Some(idx) = shm.free_slots().pop().or_else(|| never_used(shm)) else {
        h.threads_live.fetch_sub(1, Ordering::Relaxed);
        return None;
    };
    let slot = shm.thread_slot(idx);
    // SAFETY: slot idx is ours alone: popped from the free queue (weft published it
    // FREE, zeroed, before pushing it) or taken fresh past `slots_used`.
    unsafe {
        (*slot).tid = tid;
        (*slot).pid = pid;
        (*slot).counted.store(1, Ordering::Relaxed);
        (*slot).state.store(THREAD_LIVE, Ordering::Release);
    }
    Some(slot)
}

/// weft: a slot for what the kernel produces (`tid` a pseudo thread of weft's
/// process `pid`), not counted against `max_live`: the target's threads keep all
/// of `--max-threads`.
pub fn claim_uncounted(shm: &Shm, pid: u32, tid: u32) -> Option<*mut ThreadSlot> {
    let idx = shm.free_slots().pop().or_else(|| never_used(shm))?;
    let slot = shm.thread_slot(idx);
    // SAFETY: slot idx is ours alone, as in `claim`.
    unsafe {
        (*slot).tid = tid;
        (*slot).pid = pid;
        (*slot).counted.store(0, Ordering::Relaxed);
        (*slot).state.store(THREAD_LIVE, Ordering::Release);
    }
    Some(slot)
}

/// The next slot never handed out, if any is left.
fn never_used(shm: &Shm) -> Option<u32> {
    let h = shm.header();
    let mut n = h.slots_used.load(Ordering::Relaxed);
    loop {
        if n >= h.slot_count {
            return None;
        }
        match h
            .slots_used
            .compare_exchange_weak(n, n + 1, Ordering::AcqRel, Ordering::Relaxed)
        {
            Ok(_) => return Some(n),
            Err(now) => n = now,
        }
    }
}

/// The index of `slot` if it is a thread slot of this segment.
pub fn index_of(shm: &Shm, slot: *const ThreadSlot) -> Option<u32> {
    let h = shm.header();
    let off = (slot as u64).checked_sub(shm.thread_slot(0) as u64)?;
    let idx = off / h.thread_slot_size;
    (off % h.thread_slot_size == 0 && idx < u64::from(h.slot_count)).then_some(idx as u32)
}

/// The agent's control thread: `slot`'s thread is gone for the kernel (it runs no
/// more user code), so weft may drain the slot. Only a LIVE slot of a target thread
/// changes.
pub fn release(shm: &Shm, slot: *const ThreadSlot) {
    let Some(idx) = index_of(shm, slot).filter(|&i| i >= FIRST_THREAD_SLOT) else {
        return;
    };
    // SAFETY: idx is a slot of this segment.
    let st = unsafe { &(*shm.thread_slot(idx)).state };
    if st
        .compare_exchange(
            THREAD_LIVE,
            THREAD_DEAD,
            Ordering::AcqRel,
            Ordering::Relaxed,
        )
        .is_ok()
    {
        uncount(shm, idx);
    }
}

/// `slot`'s thread is ending (its thread-specific data destructors run): it no
/// longer counts against `max_live`, though it keeps its slot (LIVE, written by it
/// alone) until the reaper finds it gone, since it may still hit probes on its way
/// out (glibc frees its malloc cache after the destructors).
pub fn thread_ending(shm: &Shm, slot: *const ThreadSlot) {
    if let Some(idx) = index_of(shm, slot).filter(|&i| i >= FIRST_THREAD_SLOT) {
        uncount(shm, idx);
    }
}

/// Take slot `idx` out of `threads_live`, once.
fn uncount(shm: &Shm, idx: u32) {
    // SAFETY: idx is a slot of this segment.
    let counted = unsafe { &(*shm.thread_slot(idx)).counted };
    if counted.swap(0, Ordering::AcqRel) != 0 {
        shm.header().threads_live.fetch_sub(1, Ordering::Relaxed);
    }
}

/// weft: the LIVE slots of target threads, with their process ids.
pub fn live(shm: &Shm) -> Vec<(u32, u32)> {
    (FIRST_THREAD_SLOT..shm.slots_used())
        .filter_map(|i| {
            // SAFETY: i < slots_used: a slot of this segment.
            let s = unsafe { &*shm.thread_slot(i) };
            (s.state.load(Ordering::Acquire) == THREAD_LIVE).then_some((i, s.pid))
        })
        .collect()
}

/// weft: slot `idx`'s process is gone (its agent cannot say so any more): the slot
/// may be drained, as [`release`] does for a thread the agent found gone.
pub fn release_index(shm: &Shm, idx: u32) {
    if idx >= FIRST_THREAD_SLOT && idx < shm.slots_used() {
        release(shm, shm.thread_slot(idx));
    }
}

/// weft: its own slot (BEGIN, END and interval advice run on it).
pub fn claim_weft(shm: &Shm, tid: u32) -> *mut ThreadSlot {
    let slot = shm.thread_slot(WEFT_SLOT);
    // SAFETY: the layout reserves WEFT_SLOT for weft; the agent never claims it.
    unsafe {
        (*slot).tid = tid;
        (*slot).comm = *b"weft\0\0\0\0\0\0\0\0\0\0\0\0";
        (*slot).pcomm = *b"weft\0\0\0\0\0\0\0\0\0\0\0\0";
        (*slot).state.store(THREAD_LIVE, Ordering::Release);
    }
    slot
}

/// weft: the slots whose threads are gone. Read before their rings are drained for
/// the last time: a DEAD slot's ring gets no more events.
pub fn dead(shm: &Shm) -> Vec<u32> {
    (FIRST_THREAD_SLOT..shm.slots_used())
        .filter(|&i| {
            // SAFETY: i < slots_used: a slot of this segment.
            let s = unsafe { &*shm.thread_slot(i) };
            s.state.load(Ordering::Acquire) == THREAD_DEAD
        })
        .collect()
}

/// weft: fold the DEAD slots `slots` (their rings drained since [`dead`] returned
/// them) into the retired slot, zero them and free them for reuse.
pub fn retire(shm: &Shm, slots: &[u32]) {
    if slots.is_empty() {
        return;
    }
    let plans: Vec<_> = (0..shm.map_count())
        .map(|m| map::fold_plan(shm, shm.map(m)))
        .collect();
    let h = shm.header();
    // SAFETY: the retired slot exists in every layout; weft alone writes its counters.
    let retired = unsafe { &*shm.thread_slot(RETIRED_SLOT) };
    h.retire_seq.fetch_add(1, Ordering::AcqRel);
    retire_each(shm, slots, &plans, retired);
    h.retire_seq.fetch_add(1, Ordering::Release);
}

fn retire_each(shm: &Shm, slots: &[u32], plans: &[Option<map::FoldPlan>], retired: &ThreadSlot) {
    let h = shm.header();
    for &idx in slots {
        let slot = shm.thread_slot(idx);
        // SAFETY: a DEAD slot: its thread is gone, no one else writes it.
        let s = unsafe { &*slot };
        debug_assert_eq!(s.state.load(Ordering::Acquire), THREAD_DEAD);
        debug_assert_eq!(
            s.ring_head.load(Ordering::Acquire),
            s.ring_tail.load(Ordering::Acquire),
            "slot {idx} retired with events in its ring"
        );
        for (m, plan) in plans.iter().enumerate() {
            if let Some(plan) = plan {
                map::fold_into_retired(shm, shm.map(m as u32), plan, slot, s.tid);
            }
        }
        let fold = |to: &AtomicU64, from: &AtomicU64| {
            to.fetch_add(from.swap(0, Ordering::Relaxed), Ordering::Relaxed);
        };
        for (to, from) in retired.errors.iter().zip(&s.errors) {
            fold(to, from);
        }
        fold(&retired.events_produced, &s.events_produced);
        fold(&retired.events_lost, &s.events_lost);
        fold(&retired.hits, &s.hits);
        // SAFETY: as above; plain fields of a slot no thread owns.
        unsafe {
            (*slot).tid = 0;
            (*slot).pid = 0;
            (*slot).comm = [0; 16];
            (*slot).pcomm = [0; 16];
        }
        s.state.store(THREAD_FREE, Ordering::Release);
        shm.free_slots().push(idx);
        h.threads_retired.fetch_add(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::{LayoutBuilder, MapSpec};
    use crate::map::{self, aggregate, AGG_COUNT, AGG_HIST, AGG_MAX, AGG_STATS};
    use weft_abi::MapKind;

    /// A segment in plain memory for `live` threads with the maps `specs`.
    fn segment(live: u32, specs: &[MapSpec]) -> (Vec<u64>, Shm) {
        let mut b = LayoutBuilder::new(live, 4096).max_sites(4);
        for s in specs {
            b.add_map(*s);
        }
        let layout = b.finish();
        let mut mem = vec![0u64; (layout.total_size as usize).div_ceil(8)];
        // SAFETY: a zeroed buffer of the layout's size, kept alive by the caller.
        let shm = unsafe { Shm::from_base(mem.as_mut_ptr() as *mut u8) };
        layout.write_header(&shm, 1);
        (mem, shm)
    }

    fn merged(shm: &Shm, m: u32, key: &[u8]) -> Vec<i64> {
        let d = shm.map(m);
        let i = map::find(shm, d, key).expect("key is live");
        let mut out = vec![0u8; d.value_size as usize];
        map::merge(shm, d, i, &mut out);
        out.chunks(8)
            .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
            .collect()
    }

    fn slot_index(shm: &Shm, slot: *mut ThreadSlot) -> u32 {
        index_of(shm, slot).unwrap()
    }

    #[test]
    fn live_limit_and_reuse_after_retire() {
        let (_m, shm) = segment(2, &[]);
        let a = claim(&shm, 7, 100).unwrap();
        let b = claim(&shm, 7, 101).unwrap();
        assert_eq!(slot_index(&shm, a), FIRST_THREAD_SLOT);
        assert_eq!(slot_index(&shm, b), FIRST_THREAD_SLOT + 1);
        assert!(claim(&shm, 7, 102).is_none(), "two live threads at most");
        release(&shm, a);
        release(&shm, a);
        assert_eq!(shm.header().threads_live.load(Ordering::Relaxed), 1);
        // The released slot waits for weft; another never-used slot serves meanwhile.
        let c = claim(&shm, 7, 102).unwrap();
        assert_eq!(slot_index(&shm, c), FIRST_THREAD_SLOT + 2);
        assert_eq!(dead(&shm), vec![FIRST_THREAD_SLOT]);
        retire(&shm, &dead(&shm));
        assert!(dead(&shm).is_empty());
        release(&shm, b);
        let d = claim(&shm, 7, 103).unwrap();
        assert_eq!(d, a, "the retired slot is reused first");
        // SAFETY: a slot of the segment.
        assert_eq!(unsafe { (*d).tid }, 103);
        assert_eq!(shm.header().threads_retired.load(Ordering::Relaxed), 1);
        assert_eq!(shm.header().threads_live_peak.load(Ordering::Relaxed), 2);
    }

    /// A thread that ends stops counting against the limit at once, while it keeps
    /// its (LIVE) slot; the reaper's release later does not count it out twice.
    #[test]
    fn an_ending_thread_frees_its_place_before_the_reaper_sees_it() {
        let (_m, shm) = segment(2, &[]);
        let a = claim(&shm, 7, 100).unwrap();
        let _b = claim(&shm, 7, 101).unwrap();
        assert!(claim(&shm, 7, 102).is_none());
        thread_ending(&shm, a);
        thread_ending(&shm, a);
        assert_eq!(shm.header().threads_live.load(Ordering::Relaxed), 1);
        // SAFETY: a slot of the segment.
        assert_eq!(unsafe { (*a).state.load(Ordering::Relaxed) }, THREAD_LIVE);
        let c = claim(&shm, 7, 102).unwrap();
        assert_eq!(shm.header().threads_live.load(Ordering::Relaxed), 2);
        release(&shm, a);
        assert_eq!(shm.header().threads_live.load(Ordering::Relaxed), 2);
        assert_eq!(dead(&shm), vec![slot_index(&shm, a)]);
        release(&shm, c);
        assert_eq!(shm.header().threads_live.load(Ordering::Relaxed), 1);
        // Weft's own slot and the retired slot are never counted.
        thread_ending(&shm, shm.thread_slot(WEFT_SLOT));
        assert_eq!(shm.header().threads_live.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn slots_run_out_when_weft_does_not_drain() {
        let (_m, shm) = segment(1, &[]);
        // Two slots per live thread: the second serves while the first is not
        // drained; and one for the kernel's events, here taken by the kernel.
        assert!(claim_uncounted(&shm, 1, u32::MAX - 1).is_some());
        let a = claim(&shm, 7, 1).unwrap();
        release(&shm, a);
        let b = claim(&shm, 7, 2).unwrap();
        release(&shm, b);
        assert!(claim(&shm, 7, 3).is_none());
        assert!(claim_uncounted(&shm, 1, u32::MAX - 1).is_none());
        assert_eq!(shm.header().threads_live.load(Ordering::Relaxed), 0);
        retire(&shm, &dead(&shm));
        assert!(claim(&shm, 7, 3).is_some());
    }

    /// Values of exited threads stay in every map's merged value, with each kind's
    /// merge rule, and the reused slot starts from zero.
    #[test]
    fn retired_values_merge_like_a_live_thread() {
        let (_m, shm) = segment(
            4,
            &[
                MapSpec::agg(MapKind::Count, false, 0, 8, 1),
                MapSpec::agg(MapKind::Max, true, 8, 16, 16),
                MapSpec::agg(MapKind::Stats, true, 0, 32, 1),
                MapSpec::agg(MapKind::Hist, false, 0, 8 * 66, 1),
            ],
        );
        let key = 7u64.to_le_bytes();
        let run = |slot: *mut ThreadSlot, vals: &[i64]| {
            for (m, key) in [(0u32, &[][..]), (1, &key[..]), (2, &[]), (3, &[])] {
                let d = shm.map(m);
                let i = map::insert(&shm, d, key).index().unwrap();
                let acc = map::accumulator(&shm, d, slot, i);
                let op = [AGG_COUNT, AGG_MAX, AGG_STATS, AGG_HIST][m as usize];
                for &v in vals {
                    aggregate(d, acc, op, v as u64);
                }
            }
        };
        let a = claim(&shm, 7, 1).unwrap();
        run(a, &[5, -3, 9]);
        // SAFETY: the slot of a thread we just claimed for.
        unsafe { (*a).errors[1].store(2, Ordering::Relaxed) };
        release(&shm, a);
        retire(&shm, &dead(&shm));
        let b = claim(&shm, 7, 2).unwrap();
        assert_eq!(b, a);
        // The reused slot starts from zero.
        let d = shm.map(0);
        let acc = map::accumulator(&shm, d, b, 0) as *const AtomicU64;
        // SAFETY: an 8-aligned accumulator word of the segment.
        assert_eq!(unsafe { (*acc).load(Ordering::Relaxed) }, 0, "zeroed");
        // SAFETY: as above.
        assert_eq!(unsafe { (*b).errors[1].load(Ordering::Relaxed) }, 0);
        run(b, &[-10, 1]);
        assert_eq!(merged(&shm, 0, &[]), vec![5]);
        assert_eq!(merged(&shm, 1, &key), vec![5, 9]);
        assert_eq!(merged(&shm, 2, &[]), vec![5, 2, -10, 9]);
        let h = merged(&shm, 3, &[]);
        assert_eq!(h.iter().sum::<i64>(), 5);
        assert_eq!(h[0], 2, "two negative values");
        assert_eq!(map::merged_scalar(&shm, shm.map(0), 0), 5);
        // SAFETY: the retired slot.
        let r = unsafe { &*shm.thread_slot(RETIRED_SLOT) };
        assert_eq!(r.errors[1].load(Ordering::Relaxed), 2);

        // zero, clear and delete reach what the retired slot holds.
        release(&shm, b);
        retire(&shm, &dead(&shm));
        map::zero(&shm, shm.map(0));
        assert_eq!(merged(&shm, 0, &[]), vec![0]);
        assert!(map::delete(&shm, shm.map(1), &key));
        assert!(map::insert(&shm, shm.map(1), &key).index().is_some());
        assert_eq!(merged(&shm, 1, &key), vec![0, 0]);
        map::clear(&shm, shm.map(2));
        assert!(map::find(&shm, shm.map(2), &[]).is_none());
        let i = map::insert(&shm, shm.map(2), &[]).index().unwrap();
        assert_eq!(merged(&shm, 2, &[]), vec![0, 0, 0, 0]);
        assert_eq!(i, 0);
    }
}
