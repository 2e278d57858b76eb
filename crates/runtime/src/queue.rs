//! A bounded queue of indices with one producer and any number of consumers, over
//! memory laid out by someone else (the shared segment, or the agent's statics).
//!
//! Positions are 64-bit counters that only grow (no ABA); the cell of position `p` is
//! `ring[p % ring.len()]`. The queue never overflows because every index is below
//! `ring.len()` and is in the queue at most once: whoever pushes an index owns it
//! (weft pushes a slot it has just freed, the control thread an `AgentThread` whose
//! thread is gone), and whoever pops it owns it next.
//!
//! Consumers take the head with a compare-and-swap: a consumer that read the cell of
//! position `h` and then lost the race retries; one that wins read the value the
//! producer wrote for `h`, since the producer only reuses that cell for position
//! `h + len`, which needs the head past `h` first. No locks, no system calls: the
//! agent pops on a thread's first hit.

use core::sync::atomic::{AtomicU32, AtomicU64, Ordering};

pub struct IndexQueue<'a> {
    head: &'a AtomicU64,
    tail: &'a AtomicU64,
    ring: &'a [AtomicU32],
}

impl<'a> IndexQueue<'a> {
    pub fn new(head: &'a AtomicU64, tail: &'a AtomicU64, ring: &'a [AtomicU32]) -> Self {
        IndexQueue { head, tail, ring }
    }

    /// Push `index` (< `ring.len()`, not in the queue). Single producer only.
    pub fn push(&self, index: u32) {
        debug_assert!((index as usize) < self.ring.len());
        let t = self.tail.load(Ordering::Relaxed);
        self.ring[(t % self.ring.len() as u64) as usize].store(index, Ordering::Relaxed);
        self.tail.store(t + 1, Ordering::Release);
    }

    /// Take the oldest index, if any. Any number of consumers.
    pub fn pop(&self) -> Option<u32> {
        if self.ring.is_empty() {
            return None;
        }
        loop {
            let h = self.head.load(Ordering::Acquire);
            let t = self.tail.load(Ordering::Acquire);
            if h >= t {
                return None;
            }
            let v = self.ring[(h % self.ring.len() as u64) as usize].load(Ordering::Relaxed);
            if self
                .head
                .compare_exchange_weak(h, h + 1, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
            {
                return Some(v);
            }
        }
    }

    /// Indices in the queue now (a snapshot).
    pub fn len(&self) -> u64 {
        let t = self.tail.load(Ordering::Acquire);
        t.saturating_sub(self.head.load(Ordering::Acquire))
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;
    use std::sync::atomic::AtomicBool;

    fn cells(n: usize) -> Vec<AtomicU32> {
        (0..n).map(|_| AtomicU32::new(0)).collect()
    }

    #[test]
    fn fifo_and_wraps_around() {
        let (h, t) = (AtomicU64::new(0), AtomicU64::new(0));
        let ring = cells(4);
        let q = IndexQueue::new(&h, &t, &ring);
        assert_eq!(q.pop(), None);
        for round in 0..10u32 {
            for i in 0..4 {
                q.push((i + round) % 4);
            }
            assert_eq!(q.len(), 4);
            for i in 0..4 {
                assert_eq!(q.pop(), Some((i + round) % 4));
            }
            assert_eq!(q.pop(), None);
        }
    }

    /// Consumers on several threads recycle indices through one producer: every
    /// index is owned by exactly one party at any time, and none is lost.
    #[test]
    fn consumers_race_and_each_index_is_taken_once() {
        const N: usize = 64;
        let (h, t) = (AtomicU64::new(0), AtomicU64::new(0));
        let ring = cells(N);
        let owned: Vec<AtomicU32> = cells(N);
        let returned = std::sync::Mutex::new(Vec::<u32>::new());
        let stop = AtomicBool::new(false);
        let q = IndexQueue::new(&h, &t, &ring);
        for i in 0..N as u32 {
            q.push(i);
        }
        std::thread::scope(|s| {
            for _ in 0..3 {
                s.spawn(|| {
                    let mut taken = 0u64;
                    while taken < 5_000 {
                        if let Some(i) = q.pop() {
                            assert_eq!(owned[i as usize].swap(1, Ordering::AcqRel), 0);
                            owned[i as usize].store(0, Ordering::Release);
                            returned.lock().unwrap().push(i);
                            taken += 1;
                        } else {
                            std::thread::yield_now();
                        }
                    }
                });
            }
            s.spawn(|| {
                // The producer: gives back what the consumers returned.
                while !stop.load(Ordering::Acquire) {
                    let back: Vec<u32> = std::mem::take(&mut *returned.lock().unwrap());
                    if back.is_empty() {
                        std::thread::yield_now();
                    }
                    for i in back {
                        q.push(i);
                    }
                }
            });
            // The consumers finish, then the producer.
            while h.load(Ordering::Acquire) < 15_000 {
                std::thread::yield_now();
            }
            stop.store(true, Ordering::Release);
        });
        for i in std::mem::take(&mut *returned.lock().unwrap()) {
            q.push(i);
        }
        let mut seen = HashSet::new();
        while let Some(i) = q.pop() {
            assert!(seen.insert(i), "index {i} twice in the queue");
        }
        assert_eq!(seen.len(), N);
    }
}
