//! Kernel probes in a session (`tracepoint:`): their advice compiled to eBPF
//! (`weft-bpf`), loaded and attached (`weft-kernel`), and what they produce brought
//! into the session's segment so that everything after — the decoder, the sinks, the
//! final print — sees one program:
//!
//! * **Events** go from the kernel's ring buffer into the ring of a thread slot weft
//!   claims for the kernel, with the kernel's timestamps (`bpf_ktime_get_ns`, which
//!   is `CLOCK_MONOTONIC`, the clock advice in processes uses): the decoder orders
//!   them with the processes' events.
//! * **Maps**: the kernel keeps its share of a map in an eBPF map of the same key
//!   bytes (aggregations per CPU, in the runtime's accumulator layout). weft mirrors
//!   it into the segment: the kernel slot's accumulators hold the CPUs' merged
//!   values, as a thread's hold its own, so a map fed from both sides prints merged;
//!   a plain map's entries are copied (and removed when the kernel removed them).
//!   The mirror is refreshed right before the decoder takes a `print` or applies a
//!   `clear`/`zero` (from either side), after local advice (BEGIN, interval, END)
//!   ran, before END runs (so END reads the kernel's last counts), before the final
//!   print, and every [`SYNC_EVERY`] (what advice in the
//!   processes reads of a kernel map is at most that old). `clear`/`zero` reach the
//!   kernel's maps too.
//! * **The pid filter**: with targets, the kernel runs the advice only for the
//!   session's processes and the processes they start (a `sched_process_fork`
//!   program adds each child of a filtered process); without, for every process.

use std::collections::{HashSet, VecDeque};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Result};
use weft_abi::{EventHeader, ThreadSlot, EVENT_HEADER_SIZE};
use weft_bpf::KernelProbe;
use weft_ir::{AttachPoint, Program};
use weft_kernel::probes::KernelProbes;
use weft_runtime::map;
use weft_runtime::shm::Shm;

/// How often the mirror of the kernel's maps is refreshed when nothing asks.
pub const SYNC_EVERY: Duration = Duration::from_millis(200);

/// Bytes of the kernel's ring buffer.
const RING_BYTES: u32 = 4 << 20;

/// The kernel probes of one session.
pub struct KernelSide {
    probes: KernelProbes,
    /// The thread slot weft claimed for what the kernel produces.
    slot: *mut ThreadSlot,
    maps: Vec<Mirrored>,
    /// Records taken from the kernel's ring and not yet in the slot's ring.
    backlog: VecDeque<Vec<u8>>,
    last_sync: Instant,
    pub filtered: bool,
    /// Programs and instructions (for `-v`).
    pub programs: usize,
    /// Of those, the ones on the raw system call tracepoints.
    pub raw: usize,
    pub instructions: usize,
}

struct Mirrored {
    id: u32,
    keyless: bool,
    plain: bool,
    /// A plain map's keys copied last time (to remove those the kernel removed).
    keys: HashSet<Vec<u8>>,
}

/// The kernel probes of `prog` (those `selected`): `(probe index, tracepoint)`.
pub fn kernel_probes(
    prog: &Program,
    selected: &dyn Fn(usize) -> bool,
) -> Vec<(usize, String, String)> {
    let mut out = Vec::new();
    for (i, p) in prog.probes.iter().enumerate() {
        if !selected(i) {
            continue;
        }
        for a in &p.attach {
            if let AttachPoint::Tracepoint { category, name } = a {
                out.push((i, category.clone(), name.clone()));
            }
        }
    }
    out
}

impl KernelSide {
    /// Compile, load and attach the kernel probes `which` (from [`kernel_probes`];
    /// `names[k]` is the `probe` index of each). `filter`: only the processes given
    /// to [`KernelSide::add_pid`] (and their children) run the advice.
    pub fn start(
        prog: &Program,
        which: &[(usize, String, String)],
        names: &[u32],
        shm: &Shm,
        slot: *mut ThreadSlot,
        filter: bool,
    ) -> Result<KernelSide> {
        weft_kernel::probes::check_privileges()?;
        let built = compile(prog, which, names, shm, filter)?;
        let loaded = KernelProbes::load(&built)
            .map_err(|e| anyhow!("{}: {e}", probe_label(prog, which, e.probe)))?;
        let maps = built
            .maps
            .iter()
            .filter_map(|(r, _)| match r {
                weft_bpf::MapRef::Map(id) => Some(*id),
                _ => None,
            })
            .map(|id| {
                let d = &prog.maps[id as usize];
                Mirrored {
                    id,
                    keyless: d.key.is_none(),
                    plain: !d.value.is_aggregation(),
                    keys: HashSet::new(),
                }
            })
            .collect();
        Ok(KernelSide {
            probes: loaded,
            slot,
            maps,
            backlog: VecDeque::new(),
            last_sync: Instant::now(),
            filtered: filter,
            programs: built.programs.len(),
            raw: built
                .programs
                .iter()
                .filter(|(_, c, _)| c.is_empty())
                .count(),
            instructions: built.sizes.iter().sum(),
        })
    }

    /// Let the advice run for member `pid` (and the processes it starts), which
    /// maps the segment at `shm_base`.
    pub fn add_member(&self, pid: u32, shm_base: u64) -> Result<()> {
        if self.filtered {
            self.probes.add_pid(pid)?;
        }
        self.probes.set_segment(pid, shm_base)
    }

    /// Move the kernel's events into the kernel slot's ring, as many as fit; true
    /// when some are still waiting (the caller decodes, then calls again).
    pub fn pump(&mut self, shm: &Shm) -> bool {
        let backlog = &mut self.backlog;
        self.probes.drain(|rec| backlog.push_back(rec.to_vec()));
        let size = shm.header().ring_size;
        let ring = shm.ring(self.slot);
        while let Some(rec) = self.backlog.front() {
            let hs = EVENT_HEADER_SIZE as usize;
            if rec.len() < hs {
                self.backlog.pop_front();
                continue;
            }
            // SAFETY: rec holds at least a header (checked above).
            let h: EventHeader = unsafe { std::ptr::read_unaligned(rec.as_ptr() as *const _) };
            let payload = &rec[hs..(hs + h.payload_len as usize).min(rec.len())];
            // SAFETY: the kernel slot is weft's; only this thread produces into it.
            if !unsafe { weft_runtime::ring::fits(self.slot, size, payload.len()) } {
                return true;
            }
            // SAFETY: as above; the ring is the slot's, of `size` bytes.
            unsafe {
                weft_runtime::ring::produce(
                    self.slot,
                    ring,
                    size,
                    h.kind,
                    h.id,
                    (h.arg0, h.arg1),
                    h.nsecs,
                    payload,
                    0,
                )
            };
            self.backlog.pop_front();
        }
        false
    }

    /// Whether the mirror should be refreshed before the next decode.
    pub fn due(&self) -> bool {
        self.last_sync.elapsed() >= SYNC_EVERY
    }

    /// Refresh the mirror of the kernel's maps and error counts in the segment.
    pub fn sync(&mut self, shm: &Shm) -> Result<()> {
        self.last_sync = Instant::now();
        for m in &mut self.maps {
            let d = shm.map(m.id);
            let entries = self.probes.entries(m.id)?;
            let words = (d.value_size / 8) as usize;
            let mut seen = HashSet::new();
            for (key, per_cpu) in entries {
                let key = if m.keyless { Vec::new() } else { key };
                if m.plain {
                    let Some(i) = map::insert(shm, d, &key).index() else {
                        continue;
                    };
                    let v = map::plain_value_ptr(shm, d, i);
                    let src = &per_cpu[0];
                    let n = src.len().min(d.value_size as usize);
                    // SAFETY: the entry's value has value_size bytes.
                    unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), v, n) };
                    seen.insert(key);
                    continue;
                }
                let mut acc = vec![0u64; words];
                let mut any = false;
                for v in &per_cpu {
                    let w: Vec<u64> = v
                        .chunks_exact(8)
                        .map(|c| u64::from_le_bytes(c.try_into().unwrap_or([0; 8])))
                        .collect();
                    any |= w.iter().any(|&x| x != 0);
                    map::combine_words(d, &mut acc, &w);
                }
                // A map without a key always has its one (array) entry: it exists
                // once something was added.
                if m.keyless && !any && map::find(shm, d, &key).is_none() {
                    continue;
                }
                if let Some(i) = map::insert(shm, d, &key).index() {
                    map::set_accumulator(shm, d, self.slot, i, &acc);
                }
            }
            if m.plain {
                for gone in m.keys.difference(&seen) {
                    map::delete(shm, d, gone);
                }
                m.keys = seen;
            }
        }
        // The kernel's error counts, in the kernel slot's counters.
        let errors = self.probes.errors();
        // SAFETY: the kernel slot is weft's and lives as long as the segment.
        let slot = unsafe { &*self.slot };
        for (k, c) in slot.errors.iter().enumerate() {
            if let Some(&n) = errors.get(k) {
                c.store(n, std::sync::atomic::Ordering::Relaxed);
            }
        }
        Ok(())
    }

    /// `clear(@m)` / `zero(@m)` applied to the segment: apply it to the kernel's share.
    pub fn cleared(&mut self, id: u32, zero: bool) {
        if let Some(m) = self.maps.iter_mut().find(|m| m.id == id) {
            let _ = self.probes.clear(id, zero);
            if !zero {
                m.keys.clear();
            }
        }
    }

    /// The kernel's ring buffer descriptor (readable when events wait).
    pub fn ring_fd(&self) -> i32 {
        self.probes.ring_fd()
    }
}

/// Compile the kernel probes `which` into one object (with `cpid` as the segment
/// holds it now). Errors name the probe. [`check`] before the targets start, then
/// [`KernelSide::start`] once they are in.
fn compile(
    prog: &Program,
    which: &[(usize, String, String)],
    names: &[u32],
    shm: &Shm,
    filter: bool,
) -> Result<weft_bpf::Built> {
    let user_maps = user_maps_read_in_kernel(prog, which, shm)?;
    let h = shm.header();
    let probes: Vec<KernelProbe> = which
        .iter()
        .zip(names)
        .map(|((i, category, name), &probe_id)| KernelProbe {
            body: &prog.probes[*i].body,
            category: category.clone(),
            name: name.clone(),
            probe_id,
            raw: raw_syscall(category, name),
            system: prog.probes[*i].system,
        })
        .collect();
    let opts = weft_bpf::Options {
        filter_pids: filter,
        ncpus: weft_kernel::probes::possible_cpus()?,
        cpid: h.cpid,
        start_ns: h.start_nsecs,
        realtime_offset_ns: weft_runtime::clock::realtime_ns() as i64
            - weft_runtime::clock::monotonic_ns() as i64,
        ring_bytes: RING_BYTES,
        pid_max: weft_kernel::probes::pid_max(),
        fork_child_pid_offset: if filter {
            Some(fork_child_pid_offset()?)
        } else {
            None
        },
        user_maps,
    };
    weft_bpf::build(prog, &probes, &opts)
        .map_err(|(i, e)| anyhow!("{}: {e}", probe_label(prog, which, i)))
}

/// What can be known before any process is touched: the privileges, the maps both
/// sides use, what the code generator refuses, and the verifier's verdict (the
/// programs are loaded once, not attached, and unloaded).
pub fn check(
    prog: &Program,
    which: &[(usize, String, String)],
    names: &[u32],
    shm: &Shm,
) -> Result<()> {
    weft_kernel::probes::check_privileges()?;
    let built = compile(prog, which, names, shm, true)?;
    weft_kernel::probes::verify(&built)
        .map_err(|e| anyhow!("{}: {e}", probe_label(prog, which, e.probe)))
}

/// The maps user-space probes write and kernel probes read (`weft_bpf::user_maps_read`),
/// with where they are in the segment.
fn user_maps_read_in_kernel(
    prog: &Program,
    which: &[(usize, String, String)],
    shm: &Shm,
) -> Result<std::collections::BTreeMap<u32, weft_bpf::UserMap>> {
    let kernel: Vec<usize> = which.iter().map(|(i, _, _)| *i).collect();
    let read = weft_bpf::user_maps_read(prog, &kernel).map_err(|(i, e)| {
        let label = which
            .iter()
            .find(|(p, _, _)| *p == i)
            .map(|(_, c, n)| format!("kernel probe tracepoint:{c}:{n}"))
            .unwrap_or_else(|| "a kernel probe".into());
        anyhow!("{label}: {e}")
    })?;
    Ok(read
        .into_iter()
        .map(|m| {
            let d = shm.map(m);
            (
                m,
                weft_bpf::UserMap {
                    table_off: d.table_off,
                    entry_size: d.entry_size,
                    capacity: d.capacity,
                    key_size: d.key_size,
                    value_size: d.value_size,
                },
            )
        })
        .collect())
}

/// A `syscalls:sys_enter_NAME`/`sys_exit_NAME` tracepoint as a system call number
/// the raw `sys_enter`/`sys_exit` tracepoints can check (`WEFT_PERF_TRACEPOINTS=1`
/// keeps every probe on its perf tracepoint).
fn raw_syscall(category: &str, name: &str) -> Option<weft_bpf::RawSyscall> {
    if category != "syscalls" || std::env::var_os("WEFT_PERF_TRACEPOINTS").is_some() {
        return None;
    }
    let (call, exit) = match (
        name.strip_prefix("sys_enter_"),
        name.strip_prefix("sys_exit_"),
    ) {
        (Some(c), _) => (c, false),
        (_, Some(c)) => (c, true),
        _ => return None,
    };
    let nr = weft_kernel::syscalls::number(call)?;
    Some(weft_bpf::RawSyscall { nr, exit })
}

/// Where `sched_process_fork` keeps the child's pid in its record.
fn fork_child_pid_offset() -> Result<u32> {
    use weft_kernel::tracefs::{Tracefs, Tracepoint};
    let tp = Tracepoint {
        category: "sched".into(),
        name: "sched_process_fork".into(),
    };
    match Tracefs::find()?.format(&tp)?.field("child_pid") {
        Some(f) => Ok(f.offset),
        None => bail!("tracepoint sched:sched_process_fork has no child_pid field"),
    }
}

fn probe_label(prog: &Program, which: &[(usize, String, String)], i: usize) -> String {
    match which.get(i) {
        Some((_, c, n)) => format!("kernel probe tracepoint:{c}:{n}"),
        None => format!("kernel probes of a {}-probe program", prog.probes.len()),
    }
}
