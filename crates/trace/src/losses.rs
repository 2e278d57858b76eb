//! Everything advice could not do, counted so that nothing is lost silently.

use std::sync::atomic::Ordering;

use weft_abi::{AGENT_POOL_THREADS, ERROR_KINDS};
use weft_ir::{ErrorKind, Program};
use weft_runtime::shm::Shm;

/// Upstream bpftrace's warning for a division or remainder by zero at run time
/// (`DIVIDE_BY_ZERO_MSG`); the result is 1, in weft too.
pub const DIV_ZERO_WARNING: &str = "WARNING: Divide or modulo by 0 detected. This can lead to unexpected results. 1 is being used as the result.";

/// Upstream bpftrace's warning for an update dropped because map `name` is full; its
/// example declaration names the map.
pub fn map_full_warning(name: &str) -> String {
    format!(
        "WARNING: Map full; can't update element. Try increasing max_map_keys config or manually setting the max entries in a map declaration e.g. `let {name} = hash(5000)`"
    )
}

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

    /// One line per kind of loss, for stderr. A division by zero and a full map are
    /// reported in upstream bpftrace's words (`WARNING: ...`, src/output/text.cpp
    /// `runtime_error`), each followed, as upstream's helper errors are, by an
    /// `Additional Info - ...` line: here how many times it happened (and the map).
    /// Upstream prints them as they happen with the statement's location; weft counts
    /// them per thread and prints them once, at exit.
    pub fn report(&self) -> Vec<String> {
        let mut v = Vec::new();
        let read_faults = self.errors[ErrorKind::ReadFault as usize];
        if read_faults > 0 {
            v.push(format!(
                "weft: {read_faults} reads of target memory faulted (str, buf, pointer or field reads); their values are zero or truncated"
            ));
        }
        let div_zero = self.errors[ErrorKind::DivZero as usize];
        if div_zero > 0 {
            v.push(DIV_ZERO_WARNING.to_string());
            v.push(format!("Additional Info - divisions by zero: {div_zero}"));
        }
        for (m, n) in &self.map_full {
            v.push(map_full_warning(m));
            v.push(format!("Additional Info - map: {m}, updates dropped: {n}"));
        }
        let loop_bound = self.errors[ErrorKind::LoopBound as usize];
        if loop_bound > 0 {
            v.push(format!(
                "weft: {loop_bound} loops stopped at their iteration bound"
            ));
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
