//! Kernel probes: weft's eBPF object (`weft_bpf::build`) loaded with aya, its
//! programs attached to their tracepoints, the processes of the session in its pid
//! filter, its ring buffer drained and its maps read back.
//!
//! aya loads the object and reads the ring buffer. The maps are read and written
//! with the `bpf(2)` map commands directly: their keys and values are byte strings
//! whose sizes the script decides, which aya's typed maps cannot name.

use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};

use anyhow::{anyhow, bail, Context, Result};
use aya::maps::{Map, MapData, RingBuf};
use aya::programs::{RawTracePoint, TracePoint};
use aya::{Ebpf, EbpfLoader};
use weft_bpf::{Built, MapRef, MapSpec, ProgramKind};

/// A kernel probe the kernel refused.
#[derive(Debug)]
pub struct Refused {
    /// Index of the probe in the order given to `weft_bpf::build`.
    pub probe: usize,
    pub message: String,
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

/// One entry of a kernel map: its key bytes and the value of each CPU.
pub type Entry = (Vec<u8>, Vec<Vec<u8>>);

/// The loaded object: programs attached, maps open.
pub struct KernelProbes {
    /// Keeps the programs and their links alive.
    ebpf: Ebpf,
    ring: RingBuf<MapData>,
    pids: MapData,
    segments: MapData,
    errors: MapData,
    maps: Vec<(u32, MapData, MapSpec)>,
    ncpus: usize,
}

/// Run the verifier on every program of `built` (loaded, not attached, then
/// unloaded): what it refuses is known before any process is touched.
pub fn verify(built: &Built) -> std::result::Result<(), Refused> {
    load_programs(built, false).map(drop)
}

/// Load every program of `built` (and attach it, when `attach`).
fn load_programs(built: &Built, attach: bool) -> std::result::Result<Ebpf, Refused> {
    let general = |message: String| Refused { probe: 0, message };
    let mut ebpf = EbpfLoader::new()
        .load(&built.object)
        .map_err(|e| general(format!("loading the kernel probes: {e}")))?;
    for (i, (sym, kind)) in built.programs.iter().enumerate() {
        let prog = ebpf
            .program_mut(sym)
            .ok_or_else(|| general(format!("internal error: program {sym} missing")))?;
        let refused = |e: aya::programs::ProgramError| Refused {
            probe: i,
            message: verifier_reason(&e),
        };
        let unattached = |what: &str, e: aya::programs::ProgramError| Refused {
            probe: i,
            message: format!("attaching to tracepoint {what}: {}", chain(&e)),
        };
        let internal =
            |e: aya::programs::ProgramError| general(format!("internal error: program {sym}: {e}"));
        match kind {
            ProgramKind::RawTracepoint(name) => {
                let prog: &mut RawTracePoint = prog.try_into().map_err(internal)?;
                prog.load().map_err(refused)?;
                if attach {
                    prog.attach(name).map_err(|e| unattached(name, e))?;
                }
            }
            ProgramKind::Tracepoint { category, name } => {
                let prog: &mut TracePoint = prog.try_into().map_err(internal)?;
                prog.load().map_err(refused)?;
                if attach {
                    prog.attach(category, name)
                        .map_err(|e| unattached(&format!("{category}:{name}"), e))?;
                }
            }
        }
    }
    Ok(ebpf)
}

/// The privileges kernel probes need, checked before anything is loaded.
pub fn check_privileges() -> Result<()> {
    // CAP_BPF is 39, CAP_PERFMON 38, CAP_SYS_ADMIN 21.
    let caps = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("CapEff:"))
                .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        })
        .unwrap_or(0);
    let has = |c: u32| caps & (1u64 << c) != 0;
    if has(21) || (has(39) && has(38)) {
        return Ok(());
    }
    bail!(
        "kernel probes need root, or CAP_BPF and CAP_PERFMON (this process has neither); \
         user-space probes do not"
    )
}

fn take(ebpf: &mut Ebpf, r: MapRef) -> Result<MapData> {
    let name = r.name();
    let map = ebpf
        .take_map(&name)
        .ok_or_else(|| anyhow!("internal error: map {name} missing from the object"))?;
    Ok(match map {
        Map::HashMap(d)
        | Map::PerCpuHashMap(d)
        | Map::PerCpuArray(d)
        | Map::Array(d)
        | Map::RingBuf(d) => d,
        _ => bail!("internal error: map {name} of an unexpected type"),
    })
}

impl KernelProbes {
    /// Load `built` and attach every program. A program the verifier refuses is
    /// named by its probe, with the verifier's reason.
    pub fn load(built: &Built) -> std::result::Result<KernelProbes, Refused> {
        let general = |message: String| Refused { probe: 0, message };
        let mut ebpf = load_programs(built, true)?;
        let ncpus =
            aya::util::nr_cpus().map_err(|(what, e)| general(format!("reading {what}: {e}")))?;
        let taken = (|| -> Result<_> {
            let ring = RingBuf::try_from(Map::RingBuf(take(&mut ebpf, MapRef::Ring)?))?;
            let pids = take(&mut ebpf, MapRef::Pids)?;
            let segments = take(&mut ebpf, MapRef::Segments)?;
            let errors = take(&mut ebpf, MapRef::Errors)?;
            let mut maps = Vec::new();
            for (r, spec) in &built.maps {
                if let MapRef::Map(id) = r {
                    maps.push((*id, take(&mut ebpf, *r)?, *spec));
                }
            }
            Ok((ring, pids, segments, errors, maps))
        })();
        let (ring, pids, segments, errors, maps) = taken.map_err(|e| general(format!("{e:#}")))?;
        Ok(KernelProbes {
            ebpf,
            ring,
            pids,
            segments,
            errors,
            maps,
            ncpus,
        })
    }

    /// Load uprobe program `p` (see [`weft_bpf::UprobeProgram`]) for a
    /// `uprobe_multi` link, its map loads given the maps of this object. The
    /// verifier's refusal is the error, with its reason.
    pub fn load_uprobe(&self, p: &weft_bpf::UprobeProgram) -> std::result::Result<OwnedFd, String> {
        let mut insns = p.insns.clone();
        for &(at, r) in &p.maps {
            let fd = self
                .map_fd(r)
                .ok_or_else(|| format!("internal error: map {} missing", r.name()))?;
            insns[at * 8 + 4..at * 8 + 8].copy_from_slice(&fd.to_le_bytes());
        }
        let license = c"GPL";
        let mut log = vec![0u8; 64 * 1024];
        let mut a = ProgLoadAttr {
            prog_type: BPF_PROG_TYPE_KPROBE,
            insn_cnt: (insns.len() / 8) as u32,
            insns: insns.as_ptr() as u64,
            license: license.as_ptr() as u64,
            log_level: 1,
            log_size: log.len() as u32,
            log_buf: log.as_mut_ptr() as u64,
            expected_attach_type: BPF_TRACE_UPROBE_MULTI,
            ..Default::default()
        };
        // SAFETY: `a` is a valid bpf_attr prefix for BPF_PROG_LOAD; the instructions,
        // license and log buffer it points to outlive the call.
        let r = unsafe { bpf_call(BPF_PROG_LOAD, &mut a) };
        let r = match r {
            Ok(fd) => fd,
            Err(e) => {
                let text =
                    String::from_utf8_lossy(&log[..log.iter().position(|&b| b == 0).unwrap_or(0)])
                        .into_owned();
                return Err(match last_verifier_line(&text) {
                    Some(l) => format!("the kernel's eBPF verifier refused it: {l}"),
                    None => format!("the kernel refused it: {e}"),
                });
            }
        };
        // SAFETY: the kernel returned a new descriptor that nothing else owns.
        Ok(unsafe { OwnedFd::from_raw_fd(r as RawFd) })
    }

    fn map_fd(&self, r: MapRef) -> Option<RawFd> {
        match r {
            MapRef::Ring => Some(self.ring.as_raw_fd()),
            MapRef::Pids => Some(fd(&self.pids)),
            MapRef::Segments => Some(fd(&self.segments)),
            MapRef::Errors => Some(fd(&self.errors)),
            MapRef::Map(id) => self
                .maps
                .iter()
                .find(|(i, _, _)| *i == id)
                .map(|(_, d, _)| fd(d)),
            other => match self.ebpf.map(&other.name())? {
                Map::HashMap(d) | Map::PerCpuHashMap(d) | Map::PerCpuArray(d) | Map::Array(d) => {
                    Some(fd(d))
                }
                _ => None,
            },
        }
    }

    /// Events from the ring buffer, each the bytes of one record.    /// Events from the ring buffer, each the bytes of one record.
    pub fn drain(&mut self, mut f: impl FnMut(&[u8])) {
        while let Some(item) = self.ring.next() {
            f(&item);
        }
    }

    /// The ring buffer's descriptor (readable when events are waiting).
    pub fn ring_fd(&self) -> RawFd {
        self.ring.as_raw_fd()
    }

    /// Let the probes count for process `pid`: its bit in the filter's bitmap (weft
    /// is the bitmap's only writer; the fork program marks children in its own).
    pub fn add_pid(&self, pid: u32) -> Result<()> {
        let fd = fd(&self.pids);
        let index = pid / 64;
        let mut word = [0u8; 8];
        lookup(fd, &index.to_ne_bytes(), &mut word)
            .with_context(|| format!("adding process {pid} to the kernel probes' filter"))?;
        let word = u64::from_ne_bytes(word) | 1u64 << (pid % 64);
        update(fd, &index.to_ne_bytes(), &word.to_ne_bytes(), 0)
            .with_context(|| format!("adding process {pid} to the kernel probes' filter"))
    }

    /// Process `pid` maps the session's segment at `addr` (kernel advice reads the
    /// maps user space writes there).
    pub fn set_segment(&self, pid: u32, addr: u64) -> Result<()> {
        update(
            fd(&self.segments),
            &pid.to_ne_bytes(),
            &addr.to_ne_bytes(),
            0,
        )
        .with_context(|| format!("telling the kernel probes where process {pid} maps the segment"))
    }

    /// Error counters by `weft_ir::ErrorKind` number, summed over CPUs.
    pub fn errors(&self) -> [u64; 8] {
        let mut out = [0u64; 8];
        for (k, o) in out.iter_mut().enumerate() {
            let mut v = vec![0u8; 8 * self.ncpus];
            if lookup(fd(&self.errors), &(k as u32).to_ne_bytes(), &mut v).is_ok() {
                *o = v
                    .chunks(8)
                    .map(|c| u64::from_ne_bytes(c.try_into().unwrap_or([0; 8])))
                    .sum();
            }
        }
        out
    }

    /// The weft maps kept in the kernel.
    pub fn map_ids(&self) -> impl Iterator<Item = u32> + '_ {
        self.maps.iter().map(|(id, _, _)| *id)
    }

    /// Every entry of weft map `id`: key bytes (a zero `u32` for a map without a
    /// key) and the value of each CPU (one value for a map that is not per-CPU).
    pub fn entries(&self, id: u32) -> Result<Vec<Entry>> {
        let Some((_, data, spec)) = self.maps.iter().find(|(m, _, _)| *m == id) else {
            return Ok(Vec::new());
        };
        let percpu = matches!(
            spec.map_type,
            weft_bpf::MAP_PERCPU_HASH | weft_bpf::MAP_PERCPU_ARRAY
        );
        let stride = spec.value_size.div_ceil(8) as usize * 8;
        let vlen = if percpu {
            stride * self.ncpus
        } else {
            spec.value_size as usize
        };
        let fd = fd(data);
        let mut out = Vec::new();
        let mut key: Option<Vec<u8>> = None;
        let mut next = vec![0u8; spec.key_size as usize];
        let mut value = vec![0u8; vlen];
        while next_key(fd, key.as_deref(), &mut next)? {
            if lookup(fd, &next, &mut value).is_ok() {
                let values = if percpu {
                    value
                        .chunks(stride)
                        .map(|c| c[..spec.value_size as usize].to_vec())
                        .collect()
                } else {
                    vec![value.clone()]
                };
                out.push((next.clone(), values));
            }
            key = Some(next.clone());
        }
        Ok(out)
    }

    /// Remove every entry of weft map `id` (`clear`), or zero its values (`zero`).
    pub fn clear(&self, id: u32, zero: bool) -> Result<()> {
        let Some((_, data, spec)) = self.maps.iter().find(|(m, _, _)| *m == id) else {
            return Ok(());
        };
        let fd = fd(data);
        let percpu = matches!(
            spec.map_type,
            weft_bpf::MAP_PERCPU_HASH | weft_bpf::MAP_PERCPU_ARRAY
        );
        let stride = spec.value_size.div_ceil(8) as usize * 8;
        let zeroes = vec![
            0u8;
            if percpu {
                stride * self.ncpus
            } else {
                spec.value_size as usize
            }
        ];
        let mut keys = Vec::new();
        let mut key: Option<Vec<u8>> = None;
        let mut next = vec![0u8; spec.key_size as usize];
        while next_key(fd, key.as_deref(), &mut next)? {
            keys.push(next.clone());
            key = Some(next.clone());
        }
        for k in keys {
            if zero || spec.map_type == weft_bpf::MAP_PERCPU_ARRAY {
                let _ = update(fd, &k, &zeroes, 0);
            } else {
                let _ = delete(fd, &k);
            }
        }
        Ok(())
    }
}

/// The kernel's `pid_max` (the pid filter has a bit for each pid).
pub fn pid_max() -> u32 {
    std::fs::read_to_string("/proc/sys/kernel/pid_max")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(1 << 22)
}

/// CPUs the kernel may run on (per-CPU maps hold a value for each).
pub fn possible_cpus() -> Result<u32> {
    aya::util::nr_cpus()
        .map(|n| n as u32)
        .map_err(|(what, e)| anyhow!("reading {what}: {e}"))
}

fn fd(d: &MapData) -> RawFd {
    d.fd().as_fd().as_raw_fd()
}

fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(c) = src {
        s.push_str(": ");
        s.push_str(&c.to_string());
        src = c.source();
    }
    s
}

/// The verifier's reason: the last lines of its log that say what was wrong.
fn verifier_reason(e: &aya::programs::ProgramError) -> String {
    if let aya::programs::ProgramError::LoadError {
        io_error,
        verifier_log,
    } = e
    {
        return match last_verifier_line(&verifier_log.to_string()) {
            Some(l) => format!("the kernel's eBPF verifier refused it: {l}"),
            None => format!("the kernel refused it: {io_error}"),
        };
    }
    chain(e)
}

/// The last line of a verifier log that says what was wrong (not its statistics).
fn last_verifier_line(log: &str) -> Option<&str> {
    log.lines().rev().map(str::trim).find(|l| {
        !l.is_empty()
            && !l.starts_with("processed ")
            && !l.starts_with("verification time")
            && !l.starts_with("stack depth")
    })
}

// ---- uprobe_multi links ----------------------------------------------------------

const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_LINK_CREATE: libc::c_long = 28;
const BPF_PROG_TYPE_KPROBE: u32 = 2;
const BPF_TRACE_UPROBE_MULTI: u32 = 48;
const BPF_F_UPROBE_MULTI_RETURN: u32 = 1;

/// `union bpf_attr` for `BPF_PROG_LOAD`, up to `expected_attach_type`.
#[repr(C)]
#[derive(Default)]
struct ProgLoadAttr {
    prog_type: u32,
    insn_cnt: u32,
    insns: u64,
    license: u64,
    log_level: u32,
    log_size: u32,
    log_buf: u64,
    kern_version: u32,
    prog_flags: u32,
    prog_name: [u8; 16],
    prog_ifindex: u32,
    expected_attach_type: u32,
}

/// `union bpf_attr` for `BPF_LINK_CREATE` of a `uprobe_multi` link.
#[repr(C)]
#[derive(Default)]
struct UprobeMultiAttr {
    prog_fd: u32,
    target_fd: u32,
    attach_type: u32,
    flags: u32,
    path: u64,
    offsets: u64,
    ref_ctr_offsets: u64,
    cookies: u64,
    cnt: u32,
    multi_flags: u32,
    pid: u32,
}

/// Set program `prog` (from [`KernelProbes::load_uprobe`]) at `offsets` of `file`
/// for process `pid` only, as one link (`ret`: uretprobes). The kernel puts the
/// breakpoints in that process's mapping of the file, now or when it maps it.
/// Closing the link takes them all out at once (before the kernel's grace
/// periods, which the close then waits for).
pub fn attach_uprobe_multi(
    prog: &OwnedFd,
    file: &std::path::Path,
    offsets: &[u64],
    ret: bool,
    pid: u32,
) -> Result<OwnedFd> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(file.as_os_str().as_bytes())?;
    let mut a = UprobeMultiAttr {
        prog_fd: prog.as_raw_fd() as u32,
        attach_type: BPF_TRACE_UPROBE_MULTI,
        path: path.as_ptr() as u64,
        offsets: offsets.as_ptr() as u64,
        cnt: offsets.len() as u32,
        multi_flags: if ret { BPF_F_UPROBE_MULTI_RETURN } else { 0 },
        pid,
        ..Default::default()
    };
    // SAFETY: `a` is a valid bpf_attr prefix for BPF_LINK_CREATE; the path and the
    // offsets it points to outlive the call.
    let r = unsafe { bpf_call(BPF_LINK_CREATE, &mut a) }.map_err(|e| {
        anyhow!(
            "setting {} kernel uprobes on {}: {e}",
            offsets.len(),
            file.display()
        )
    })?;
    // SAFETY: the kernel returned a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(r as RawFd) })
}

// ---- bpf(2) map commands -----------------------------------------------------------

const BPF_MAP_LOOKUP_ELEM: libc::c_long = 1;
const BPF_MAP_UPDATE_ELEM: libc::c_long = 2;
const BPF_MAP_DELETE_ELEM: libc::c_long = 3;
const BPF_MAP_GET_NEXT_KEY: libc::c_long = 4;

/// `union bpf_attr` for the map element commands.
#[repr(C)]
#[derive(Default)]
struct MapElemAttr {
    map_fd: u32,
    _pad: u32,
    key: u64,
    value: u64,
    flags: u64,
}

fn bpf(cmd: libc::c_long, attr: &mut MapElemAttr) -> std::io::Result<()> {
    // SAFETY: attr is a valid bpf_attr prefix for the map element commands, and the
    // buffers it points to outlive the call with the sizes the map has.
    unsafe { bpf_call(cmd, attr) }.map(drop)
}

/// `bpf(cmd, attr)`: its result, or the error.
///
/// # Safety
/// `attr` must be a valid `union bpf_attr` prefix for `cmd`, and what it points to
/// must outlive the call.
unsafe fn bpf_call<T>(cmd: libc::c_long, attr: &mut T) -> std::io::Result<libc::c_long> {
    // SAFETY: the caller's promise.
    let r = unsafe { libc::syscall(libc::SYS_bpf, cmd, attr as *mut T, std::mem::size_of::<T>()) };
    if r < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

fn lookup(fd: RawFd, key: &[u8], value: &mut [u8]) -> std::io::Result<()> {
    let mut a = MapElemAttr {
        map_fd: fd as u32,
        key: key.as_ptr() as u64,
        value: value.as_mut_ptr() as u64,
        ..Default::default()
    };
    bpf(BPF_MAP_LOOKUP_ELEM, &mut a)
}

fn update(fd: RawFd, key: &[u8], value: &[u8], flags: u64) -> Result<()> {
    let mut a = MapElemAttr {
        map_fd: fd as u32,
        key: key.as_ptr() as u64,
        value: value.as_ptr() as u64,
        flags,
        ..Default::default()
    };
    bpf(BPF_MAP_UPDATE_ELEM, &mut a)?;
    Ok(())
}

fn delete(fd: RawFd, key: &[u8]) -> std::io::Result<()> {
    let mut a = MapElemAttr {
        map_fd: fd as u32,
        key: key.as_ptr() as u64,
        ..Default::default()
    };
    bpf(BPF_MAP_DELETE_ELEM, &mut a)
}

/// The key after `key` (the first with `None`) into `next`; false at the end.
fn next_key(fd: RawFd, key: Option<&[u8]>, next: &mut [u8]) -> Result<bool> {
    let mut a = MapElemAttr {
        map_fd: fd as u32,
        key: key.map_or(0, |k| k.as_ptr() as u64),
        value: next.as_mut_ptr() as u64,
        ..Default::default()
    };
    match bpf(BPF_MAP_GET_NEXT_KEY, &mut a) {
        Ok(()) => Ok(true),
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(false),
        Err(e) => Err(e).context("reading a kernel map's keys"),
    }
}
