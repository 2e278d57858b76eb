//! The eBPF program that stops processes as they start, for system-wide sessions
//! (`bpf/catch.bpf.c`, built by `build.rs`; `weft_engine::watch` decides where it
//! goes and what to do with the processes it catches).
//!
//! Its programs: `weft_catch`, `weft_mark`, `weft_catch_marked` and
//! `weft_catch_marked_return` on kernel uprobes; `weft_exec` and `weft_exit` on the
//! `sched_process_exec`/`exit` tracepoints, which forget a process's marks. A caught
//! process gets `SIGSTOP` and its pid goes down the `caught` ring buffer, once per
//! program image (`seen`). It stays in `stopped` until weft lets it go; weft's
//! guardian holds that map's descriptor ([`Catcher::stopped_fd`]).

use std::collections::BTreeSet;
use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::path::PathBuf;

use anyhow::{anyhow, Context, Result};
use aya::maps::{HashMap as BpfHashMap, MapData, RingBuf};
use aya::programs::uprobe::UProbeScope;
use aya::programs::{TracePoint, UProbe};

/// The eBPF object built from `bpf/catch.bpf.c`.
static CATCH_OBJECT: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/catch.bpf.o"));

/// One kernel uprobe: a file, a file offset, and the program that runs there
/// (`weft_catch`, `weft_mark`, `weft_catch_marked`, `weft_catch_marked_return`).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Uprobe {
    pub file: PathBuf,
    pub offset: u64,
    pub program: &'static str,
}

/// The loaded program, its uprobes set. Dropping it (or [`Catcher::detach`]) takes
/// them out.
pub struct Catcher {
    caught: RingBuf<MapData>,
    seen: BpfHashMap<MapData, u32, u32>,
    stopped: BpfHashMap<MapData, u32, u32>,
    stopped_fd: RawFd,
    /// Keeps the programs (and their links) loaded.
    ebpf: Option<aya::Ebpf>,
}

impl Catcher {
    /// Load the program and set `uprobes` (each once).
    pub fn start(uprobes: &[Uprobe]) -> Result<Catcher> {
        let cant = "loading weft's eBPF program (kernel uprobes and the sched \
                    tracepoints; needs root or CAP_BPF+CAP_PERFMON)";
        let mut ebpf = aya::Ebpf::load(CATCH_OBJECT).with_context(|| cant.to_string())?;
        for (name, event) in [
            ("weft_exec", "sched_process_exec"),
            ("weft_exit", "sched_process_exit"),
        ] {
            let tp: &mut TracePoint = ebpf
                .program_mut(name)
                .ok_or_else(|| anyhow!("the eBPF object has no {name}"))?
                .try_into()?;
            tp.load().with_context(|| cant.to_string())?;
            tp.attach("sched", event)
                .with_context(|| format!("attaching to the tracepoint sched:{event}"))?;
        }
        let mut done = BTreeSet::new();
        for p in uprobes {
            if !done.insert(p.clone()) {
                continue;
            }
            let prog: &mut UProbe = ebpf
                .program_mut(p.program)
                .ok_or_else(|| anyhow!("the eBPF object has no {}", p.program))?
                .try_into()?;
            if prog.fd().is_err() {
                prog.load().with_context(|| cant.to_string())?;
            }
            prog.attach(p.offset, &p.file, UProbeScope::AllProcesses)
                .with_context(|| {
                    format!(
                        "setting a kernel uprobe on {} at {:#x}",
                        p.file.display(),
                        p.offset
                    )
                })?;
        }
        let caught = RingBuf::try_from(
            ebpf.take_map("caught")
                .ok_or_else(|| anyhow!("the eBPF object has no map `caught`"))?,
        )?;
        let seen = BpfHashMap::try_from(
            ebpf.take_map("seen")
                .ok_or_else(|| anyhow!("the eBPF object has no map `seen`"))?,
        )?;
        let stopped = ebpf
            .take_map("stopped")
            .ok_or_else(|| anyhow!("the eBPF object has no map `stopped`"))?;
        let stopped_fd = match &stopped {
            aya::maps::Map::HashMap(d) => d.fd().as_fd().as_raw_fd(),
            _ => return Err(anyhow!("the eBPF map `stopped` is not a hash map")),
        };
        let stopped = BpfHashMap::try_from(stopped)?;
        Ok(Catcher {
            caught,
            seen,
            stopped,
            stopped_fd,
            ebpf: Some(ebpf),
        })
    }

    /// Process `pid` is not to be caught again (until it execs).
    pub fn seen(&mut self, pid: u32) {
        let _ = self.seen.insert(pid, 1, 0);
    }

    /// Process `pid`, caught, is let go: it is no longer the guardian's to continue.
    pub fn released(&mut self, pid: u32) {
        let _ = self.stopped.remove(&pid);
    }

    /// The descriptor of the map of processes caught and not let go (a hash map of
    /// pids; valid while the catcher lives), for weft's guardian.
    pub fn stopped_fd(&self) -> RawFd {
        self.stopped_fd
    }

    /// The pids caught since the last call, in order, each once.
    pub fn caught(&mut self) -> Vec<i32> {
        let mut out = Vec::new();
        while let Some(item) = self.caught.next() {
            if let Some(b) = item.get(..4) {
                let pid = i32::from_ne_bytes([b[0], b[1], b[2], b[3]]);
                if !out.contains(&pid) {
                    out.push(pid);
                }
            }
        }
        out
    }

    /// The ring buffer's descriptor (readable when a process was caught).
    pub fn ring_fd(&self) -> RawFd {
        self.caught.as_raw_fd()
    }

    /// Take the uprobes and tracepoints out (the maps stay readable).
    pub fn detach(&mut self) {
        self.ebpf = None;
    }
}
