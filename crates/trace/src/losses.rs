//! Everything advice could not do, counted so that nothing is lost silently.

use std::sync::atomic::Ordering;

use weft_abi::{AGENT_POOL_THREADS, ERROR_KINDS};
use weft_ir::Program;
use weft_runtime::shm::Shm;

/// Totals of everything advice could not do, summed over threads (those whose slots
/// were reused included: the retired slot holds their counts).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Losses {
    pub errors: [u64; ERROR_KINDS],
    pub events_lost: u64,
    /// Hits on threads beyond the live-thread limit (`max_live` of them).
    pub threads_dropped: u64,
    pub max_live: u32,
    /// Hits on threads the agent had no state for (its pool was exhausted).
    pub pool_dropped: u64,
    pub map_full: Vec<(String, u64)>,
}

impl Losses {
    /// The losses counted in a session's segment.
    pub fn of(shm: &Shm, prog: &Program) -> Losses {
        let mut l = Losses::default();
        for t in 0..shm.slots_used() {
            // SAFETY: slots below slots_used are valid.
            let s = unsafe { &*shm.thread_slot(t) };
            for (k, e) in s.errors.iter().enumerate() {
                l.errors[k] += e.load(Ordering::Relaxed);
            }
            l.events_lost += s.events_lost.load(Ordering::Relaxed);
        }
        let h = shm.header();
        l.threads_dropped = h.threads_dropped.load(Ordering::Relaxed);
        l.max_live = h.max_live;
        l.pool_dropped = h.pool_dropped.load(Ordering::Relaxed);
        for (i, m) in prog.maps.iter().enumerate() {
            let n = shm.map(i as u32).full_drops.load(Ordering::Relaxed);
            if n > 0 {
                l.map_full.push((m.name.clone(), n));
            }
        }
        l
    }

    /// One line per kind of loss, for stderr.
    pub fn report(&self) -> Vec<String> {
        let mut v = Vec::new();
        let names = [
            "reads of target memory faulted (str, buf, pointer or field reads); their values are zero or truncated",
            "divisions by zero (results are 0)",
            "map updates dropped because a map was full",
            "loops stopped at their iteration bound",
            "events dropped because a ring was full",
        ];
        for (k, n) in self.errors.iter().enumerate() {
            if *n > 0 && k < names.len() && k != 2 && k != 4 {
                v.push(format!("weft: {n} {}", names[k]));
            }
        }
        for (m, n) in &self.map_full {
            v.push(format!("weft: map {m} is full: {n} updates dropped (raise the limit with config = {{ max_map_keys = N }})"));
        }
        if self.threads_dropped > 0 {
            v.push(format!(
                "weft: {} probe hits ran no advice: more than {} threads were running advice at once (raise the limit with --max-threads N)",
                self.threads_dropped, self.max_live
            ));
        }
        if self.pool_dropped > 0 {
            v.push(format!(
                "weft: {} probe hits ran no advice: the agent's per-thread state was exhausted (more than {} threads at once)",
                self.pool_dropped, AGENT_POOL_THREADS
            ));
        }
        v
    }
}
