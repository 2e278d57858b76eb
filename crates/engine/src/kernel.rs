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
//! * **Early probes**: a launched program runs its loader's start-up (IFUNC
//!   resolvers, `__libc_early_init`) before its agent can start. Each user-space
//!   probe whose advice eBPF can run ([`early_probes`]) runs there on kernel uprobes
//!   set in that one process at `exec`; a uprobe at the agent's initializer marks
//!   the hand-over (the programs leave from there), and weft takes the uprobes out
//!   before it weaves. Their maps are kernel maps like a tracepoint's, merged the
//!   same way, so a count is the sum of both sides, each call counted once.

use std::collections::{HashSet, VecDeque};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Result};
use std::os::fd::OwnedFd;
use weft_abi::{EventHeader, ThreadSlot, EVENT_HEADER_SIZE};
use weft_bpf::KernelProbe;
use weft_ir::{AttachPoint, CtxValue, Inst, Program};
use weft_kernel::probes::{attach_uprobe_multi, KernelProbes};
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
    /// Early probes' programs (loaded for `uprobe_multi` links), whether each is a
    /// uretprobe, and their sites by file; the handover program.
    early: Vec<EarlyProgram>,
    handover: Option<OwnedFd>,
    /// The links set in a launched process until its agent takes over.
    links: Vec<OwnedFd>,
    /// The early probes the kernel refused, each with its reason (for `-v`).
    pub refused: Vec<String>,
    /// Uprobes set in a launched process until its agent takes over.
    pub early_sites: usize,
    /// That process, and each uprobe's place as (device, inode, file offset) with
    /// the file's byte there: how weft sees the kernel's breakpoints gone.
    early_pid: u32,
    early_bytes: Vec<(u64, u64, u64, u8)>,
}

/// Most kernel uprobes set for a launched program's start-up (each is a
/// breakpoint the kernel puts in and takes out of the process's code).
const MAX_EARLY_SITES: usize = 4096;

/// Longest wait for the kernel to take the early uprobes' breakpoints out.
const EARLY_REMOVAL: Duration = Duration::from_secs(3);

/// An early probe's program, loaded: a uretprobe or not, and its sites by file.
struct EarlyProgram {
    prog: OwnedFd,
    ret: bool,
    files: Vec<(PathBuf, Vec<u64>)>,
}

/// A user-space probe's advice on kernel uprobes, in a launched program from its
/// `exec` until its agent starts.
#[derive(Clone, Debug)]
pub struct EarlyProbe {
    /// Index into the program's probes, and its `probe` name index.
    pub probe: usize,
    pub name: u32,
    /// A uretprobe.
    pub ret: bool,
    /// The attach point, for messages.
    pub label: String,
    /// Each site: the file and the file offset.
    pub sites: Vec<(PathBuf, u64)>,
}

/// The user-space probes among `selected` that can run from the first instruction
/// of launched program `exe` on kernel uprobes (see [`EarlyProbe`]), with one line
/// for each that cannot, saying why (for `-v`). Such a probe's advice only
/// aggregates and sends events (what eBPF runs and weft merges exactly); it is a
/// function's entry or return in a file known without a process.
pub fn early_probes(
    prog: &Program,
    selected: &[usize],
    names: &[Vec<u32>],
    exe: &Path,
) -> (Vec<EarlyProbe>, Vec<String>) {
    let mut out = Vec::new();
    let mut notes = Vec::new();
    let Ok(exe_elf) = weft_symbols::ElfFile::open(exe) else {
        return (out, notes);
    };
    let search = weft_symbols::LibrarySearch::system();
    let ctx = weft_symbols::TargetContext {
        process: None,
        executable: Some(&exe_elf),
        search: &search,
    };
    let mut total = 0;
    for &i in selected {
        let p = &prog.probes[i];
        for (a, &name) in p.attach.iter().zip(&names[i]) {
            let Some((target, func, offset, ret)) = a.function() else {
                if matches!(
                    a,
                    AttachPoint::Call { .. }
                        | AttachPoint::Usdt { .. }
                        | AttachPoint::SourceLine { .. }
                ) {
                    notes.push(format!("{a}: not a function's entry or return"));
                }
                continue;
            };
            let why = early_refusal(prog, i, func).or_else(|| {
                weft_bpf::check_uprobe(prog, i, ret)
                    .err()
                    .map(|e| e.to_string())
            });
            if let Some(why) = why {
                notes.push(format!("{a}: {why}"));
                continue;
            }
            if target.contains(['*', '?', '[']) {
                notes.push(format!("{a}: a wildcard binary is known only in a process"));
                continue;
            }
            let Ok(t) = weft_symbols::resolve_target(target, &ctx) else {
                continue;
            };
            let Ok(elf) = weft_symbols::ElfFile::open(&t.path) else {
                continue;
            };
            let Ok(found) = weft_symbols::match_functions(&elf, func) else {
                continue;
            };
            let sites: Vec<(PathBuf, u64)> = found
                .iter()
                // An IFUNC's symbol is its resolver; in a process weft probes what
                // the resolver chose.
                .filter(|(f, _)| !f.ifunc)
                .filter_map(|(f, _)| elf.vaddr_to_file_offset(f.vaddr + offset))
                .map(|off| (t.path.clone(), off))
                .collect();
            if sites.is_empty() {
                continue;
            }
            if total + sites.len() > MAX_EARLY_SITES {
                notes.push(format!(
                    "{a}: {} functions, more than the {MAX_EARLY_SITES} kernel uprobes set \
                     for a program's start-up",
                    sites.len()
                ));
                continue;
            }
            total += sites.len();
            out.push(EarlyProbe {
                probe: i,
                name,
                ret,
                label: a.to_string(),
                sites,
            });
        }
    }
    (out, notes)
}

/// `sites` grouped by file, for one link per file.
fn by_file(sites: &[(PathBuf, u64)]) -> Vec<(PathBuf, Vec<u64>)> {
    let mut out: Vec<(PathBuf, Vec<u64>)> = Vec::new();
    for (f, off) in sites {
        match out.iter_mut().find(|(g, _)| g == f) {
            Some((_, v)) => v.push(*off),
            None => out.push((f.clone(), vec![*off])),
        }
    }
    out
}

/// Where a uprobe is: the file's device and inode, the offset, and the file's
/// byte there.
fn file_byte(path: &Path, off: u64) -> Result<(u64, u64, u64, u8)> {
    use std::os::unix::fs::{FileExt, MetadataExt};
    let f = std::fs::File::open(path)?;
    let m = f.metadata()?;
    let mut b = [0u8; 1];
    f.read_exact_at(&mut b, off)?;
    Ok((m.dev(), m.ino(), off, b[0]))
}

/// Whether process `pid`'s code holds the file's byte at every place of `bytes`
/// it maps (a place it does not map holds no breakpoint).
fn breakpoints_gone(pid: u32, bytes: &[(u64, u64, u64, u8)]) -> bool {
    use std::os::unix::fs::FileExt;
    let (Ok(maps), Ok(mem)) = (
        weft_symbols::ProcMaps::read(pid),
        std::fs::File::open(format!("/proc/{pid}/mem")),
    ) else {
        // Gone: nothing of it to weave.
        return true;
    };
    bytes.iter().all(|&(dev, ino, off, want)| {
        maps.mappings
            .iter()
            .filter(|m| {
                m.inode == ino
                    && libc::makedev(m.dev.0, m.dev.1) == dev
                    && m.offset <= off
                    && off < m.offset + (m.end - m.start)
            })
            .all(|m| {
                let mut b = [0u8; 1];
                mem.read_exact_at(&mut b, m.start + (off - m.offset))
                    .is_err()
                    || b[0] == want
            })
    })
}

/// Why probe `i` (attached at function pattern `func`) cannot run on kernel
/// uprobes before the agent starts, if it cannot.
fn early_refusal(prog: &Program, i: usize, func: &str) -> Option<String> {
    let p = &prog.probes[i];
    if p.hidden || p.around {
        return Some("an aspect's own probe".into());
    }
    for inst in &p.body.code {
        match inst {
            Inst::MapLoad { .. }
            | Inst::MapHasKey { .. }
            | Inst::MapLen { .. }
            | Inst::MapIterStart { .. }
            | Inst::MapIterNext { .. }
            | Inst::MapStore { .. }
            | Inst::MapDelete { .. } => {
                return Some(
                    "its advice reads or assigns a map (only aggregations run before the agent)"
                        .into(),
                )
            }
            Inst::Ctx {
                value: CtxValue::ProbeId,
                ..
            } if func.contains(['*', '?', '[']) => {
                return Some("`probe` of a wildcard names each function in a process".into())
            }
            _ => {}
        }
    }
    None
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
        early: &[EarlyProbe],
        shm: &Shm,
        slot: *mut ThreadSlot,
        filter: bool,
    ) -> Result<KernelSide> {
        weft_kernel::probes::check_privileges()?;
        let built = compile(prog, which, names, early, shm, filter)?;
        let loaded = KernelProbes::load(&built)
            .map_err(|e| anyhow!("{}: {e}", probe_label(prog, which, early, e.probe)))?;
        // An early probe the verifier refuses is left out (it runs once the agent
        // is in), and so are all of them without the handover program.
        let mut progs = Vec::new();
        let mut handover = None;
        let mut refused = Vec::new();
        for u in &built.uprobes {
            let fd = loaded.load_uprobe(u);
            match (
                u.probe.checked_sub(which.len()).and_then(|k| early.get(k)),
                fd,
            ) {
                (Some(e), Ok(prog)) => progs.push(EarlyProgram {
                    prog,
                    ret: e.ret,
                    files: by_file(&e.sites),
                }),
                (Some(e), Err(why)) => refused.push(format!("{}: {why}", e.label)),
                (None, Ok(fd)) => handover = Some(fd),
                (None, Err(why)) => {
                    refused.push(format!("the hand-over program: {why}"));
                    progs.clear();
                }
            }
        }
        if handover.is_none() {
            progs.clear();
        }
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
                .filter(|(_, k)| matches!(k, weft_bpf::ProgramKind::RawTracepoint(_)))
                .count(),
            instructions: built.sizes.iter().sum(),
            early_sites: 0,
            early_pid: 0,
            early_bytes: Vec::new(),
            early: progs,
            handover,
            links: Vec::new(),
            refused,
        })
    }

    /// Set the early probes' uprobes in launched process `pid` (stopped at its
    /// `exec`), and the hand-over uprobe at the first instruction of the agent
    /// (`agent`, the library it preloads). On an error none stays set.
    pub fn attach_early(&mut self, pid: u32, agent: &Path) -> Result<()> {
        let Some(handover) = self.handover.as_ref().filter(|_| !self.early.is_empty()) else {
            return Ok(());
        };
        let elf = weft_symbols::ElfFile::open(agent)?;
        let init = elf
            .symbol_vaddr("weft_agent_init")
            .and_then(|v| elf.vaddr_to_file_offset(v))
            .ok_or_else(|| anyhow!("{} has no weft_agent_init", agent.display()))?;
        let mut links = vec![attach_uprobe_multi(handover, agent, &[init], false, pid)?];
        let mut bytes = vec![file_byte(agent, init)?];
        for e in &self.early {
            for (file, offsets) in &e.files {
                for &off in offsets {
                    bytes.push(file_byte(file, off)?);
                }
                // On an error, the links made so far close as `links` drops.
                links.push(attach_uprobe_multi(&e.prog, file, offsets, e.ret, pid)?);
            }
        }
        self.early_sites = bytes.len() - 1;
        self.early_bytes = bytes;
        self.early_pid = pid;
        self.links = links;
        Ok(())
    }

    /// The agent has taken over: take the early uprobes out of the process, before
    /// weft reads or weaves it. What they counted stays in the kernel's maps.
    /// Closing a link takes its breakpoints out at once, then waits for the
    /// kernel's grace periods (about 75 ms here): the links close in threads of
    /// their own, and weft goes on when the process's code is the file's again.
    pub fn end_early(&mut self) -> Result<()> {
        if self.links.is_empty() {
            return Ok(());
        }
        self.early_sites = 0;
        // The programs too: they run no more, and a program's last close waits as
        // well.
        let progs: Vec<OwnedFd> = std::mem::take(&mut self.early)
            .into_iter()
            .map(|e| e.prog)
            .chain(self.handover.take())
            .collect();
        for fds in std::mem::take(&mut self.links)
            .into_iter()
            .map(|l| vec![l])
            .chain([progs])
        {
            let spawned = std::thread::Builder::new()
                .name("weft-unprobe".into())
                .stack_size(64 * 1024)
                .spawn(move || drop(fds));
            if let Err(e) = spawned {
                bail!("taking the kernel uprobes out: {e}");
            }
        }
        let start = Instant::now();
        let bytes = std::mem::take(&mut self.early_bytes);
        while !breakpoints_gone(self.early_pid, &bytes) {
            if start.elapsed() > EARLY_REMOVAL {
                bail!(
                    "the kernel has not taken its uprobes out of process {} after {:?}",
                    self.early_pid,
                    EARLY_REMOVAL
                );
            }
            std::thread::sleep(Duration::from_micros(100));
        }
        Ok(())
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
    early: &[EarlyProbe],
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
            uprobe: None,
        })
        .chain(early.iter().map(|e| KernelProbe {
            body: &prog.probes[e.probe].body,
            category: String::new(),
            name: e.label.clone(),
            probe_id: e.name,
            raw: None,
            system: false,
            uprobe: Some(e.ret),
        }))
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
        .map_err(|(i, e)| anyhow!("{}: {e}", probe_label(prog, which, early, i)))
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
    let built = compile(prog, which, names, &[], shm, true)?;
    weft_kernel::probes::verify(&built)
        .map_err(|e| anyhow!("{}: {e}", probe_label(prog, which, &[], e.probe)))
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

fn probe_label(
    prog: &Program,
    which: &[(usize, String, String)],
    early: &[EarlyProbe],
    i: usize,
) -> String {
    match (
        which.get(i),
        i.checked_sub(which.len()).and_then(|k| early.get(k)),
    ) {
        (Some((_, c, n)), _) => format!("kernel probe tracepoint:{c}:{n}"),
        (_, Some(e)) => format!("{} (on a kernel uprobe before the agent starts)", e.label),
        _ => format!("kernel probes of a {}-probe program", prog.probes.len()),
    }
}
