//! Everything advice could not do, counted so that nothing is lost silently.

use std::sync::atomic::Ordering;

use weft_abi::{AGENT_POOL_THREADS, ERROR_KINDS};
use weft_ir::{ErrorKind, Program};
use weft_runtime::shm::Shm;

/// Upstream bpftrace's warning for an update dropped because map `name` is full; its
/// example declaration names the map.
pub fn map_full_warning(name: &str) -> String {
    format!(
        "WARNING: Map full; can't update element. Try increasing max_map_keys config or manually setting the max entries in a map declaration e.g. `let {name} = hash(5000)`"
    )
}

/// The state map of the sequence hidden map `name` belongs to (`@__seq_NAME` for
/// itself, `@__seq_NAME_VAR` and `@__seq_NAME__t`): the shortest sequence map name
/// that is `name` or a prefix of it followed by `_`.
fn seq_state_map<'a>(prog: &'a Program, name: &str) -> Option<&'a str> {
    if !name.starts_with(weft_ir::HIDDEN_MAP_PREFIX) {
        return None;
    }
    prog.maps
        .iter()
        .map(|m| m.name.as_str())
        .filter(|s| s.starts_with(weft_ir::HIDDEN_MAP_PREFIX))
        .filter(|s| name == *s || name.strip_prefix(s).is_some_and(|r| r.starts_with('_')))
        .min_by_key(|s| s.len())
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
    /// Sequences (`seq NAME`) whose instance table was full: the sequence's name,
    /// how many instances were not started, and the bound (the table's keys).
    pub seq_full: Vec<(String, u64, u32)>,
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
            if n == 0 {
                continue;
            }
            match seq_state_map(prog, &m.name) {
                // A sequence's own maps: its instances (the state map; a first
                // step that finds it full starts nothing) and the variables and
                // start times kept beside them, reported as one line per sequence.
                Some(state) => {
                    let seq = state[weft_ir::HIDDEN_MAP_PREFIX.len()..].to_string();
                    let bound = prog.config.max_keys_of(state);
                    match l.seq_full.iter_mut().find(|(s, _, _)| *s == seq) {
                        Some(e) if state == m.name => e.1 = n,
                        Some(_) => {}
                        None => l.seq_full.push((seq, n, bound)),
                    }
                }
                None => l.map_full.push((m.name.clone(), n)),
            }
        }
        l
    }

    /// One line per kind of loss, for stderr. A full map is reported in upstream
    /// bpftrace's words (`WARNING: ...`, src/output/text.cpp `runtime_error`),
    /// followed, as upstream's helper errors are, by an `Additional Info - ...` line:
    /// here how many updates it dropped (upstream warns at each, with the statement's
    /// location; weft counts them per thread). A division by zero is warned where it
    /// happens, in upstream's words (the advice emits the warning, `lang`'s
    /// `warn_if_zero`); here only their number.
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
            v.push(format!(
                "weft: {div_zero} divisions or remainders by zero gave 1 (each warned where it happened)"
            ));
        }
        for (seq, n, bound) in &self.seq_full {
            v.push(format!(
                "weft: seq {seq}: {n} sequence instances not started: its instance table was full ({bound} instances; raise the bound with `config = {{ max_map_keys = N }}`)"
            ));
        }
        for (m, n) in &self.map_full {
            v.push(map_full_warning(m));
            v.push(format!("Additional Info - map: {m}, updates dropped: {n}"));
        }
        let late = self.errors[ErrorKind::WatchLate as usize];
        if late > 0 {
            v.push(format!(
                "weft: {late} addresses stored for set:addr() were not watched in time (weft did not arm the watch within {} ms); accesses right after those stores may be missed",
                weft_abi::WATCH_BIND_WAIT_NS / 1_000_000
            ));
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
