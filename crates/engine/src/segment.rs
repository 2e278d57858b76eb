//! The shared data segment for one session: laid out from the program's maps,
//! backed by a memfd that the agent maps too.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use anyhow::{bail, Context, Result};
use weft_abi::{MapKind, ENTRY_LIVE};
use weft_ir::{MapValue, Program, TseriesAgg};
use weft_jit::MapLayout;
use weft_runtime::layout::{Layout, LayoutBuilder, MapSpec};
use weft_runtime::shm::Shm;

/// Sizing knobs (command-line flags may change them).
#[derive(Clone, Copy, Debug)]
pub struct Sizes {
    /// Target threads holding a slot at once (`--max-threads`); slots of threads
    /// that exited are reused.
    pub max_threads: u32,
    pub ring_size: u64,
    pub max_sites: u32,
    /// Producers wait (up to [`RING_WAIT_NS`]) for weft to make room in a full ring
    /// instead of dropping the event (`weft record`: nothing lost while weft keeps
    /// up).
    pub lossless: bool,
}

/// The longest a producer waits for room in a full ring when rings are lossless.
pub const RING_WAIT_NS: u64 = 1_000_000_000;

impl Default for Sizes {
    fn default() -> Self {
        Sizes {
            max_threads: 1024,
            ring_size: 1 << 18,
            max_sites: 1 << 16,
            lossless: false,
        }
    }
}

pub struct Segment {
    pub fd: OwnedFd,
    pub shm: Shm,
    pub layout: Layout,
    pub maps: Vec<MapLayout>,
    /// Keeps the segment's TSC clock on CLOCK_MONOTONIC (`None`: no usable TSC,
    /// advice reads the vDSO clock).
    pub clock: Option<weft_runtime::clock::Calibrator>,
    ptr: *mut libc::c_void,
}

/// The layout entry of one map of the program.
pub fn map_spec(value: &MapValue, key_size: u32, max_entries: u32) -> MapSpec {
    let (kind, signed) = match value {
        MapValue::Plain(_) => (MapKind::Plain, false),
        MapValue::Count => (MapKind::Count, false),
        MapValue::Sum { signed } => (MapKind::Sum, *signed),
        MapValue::Min { signed } => (MapKind::Min, *signed),
        MapValue::Max { signed } => (MapKind::Max, *signed),
        MapValue::Avg { signed } => (MapKind::Avg, *signed),
        MapValue::Stats { signed } => (MapKind::Stats, *signed),
        MapValue::Hist { .. } => (MapKind::Hist, false),
        MapValue::Lhist { .. } => (MapKind::Lhist, true),
        MapValue::Tseries { signed, .. } => (MapKind::Tseries, *signed),
    };
    let vs = value.value_size();
    let mut s = if kind == MapKind::Plain {
        MapSpec::plain(key_size, vs, max_entries)
    } else {
        MapSpec::agg(kind, signed, key_size, vs, max_entries)
    };
    if let MapValue::Hist { k } = value {
        s.hist_k = u32::from(*k);
    }
    if let MapValue::Lhist { min, max, step } = value {
        s.lhist = (*min, *max, *step);
    }
    if let MapValue::Tseries {
        interval_ns,
        intervals,
        agg,
        ..
    } = value
    {
        s.tseries = (*interval_ns, *intervals, tseries_agg_code(*agg));
    }
    s
}

/// The agent's code for a `tseries` aggregation.
fn tseries_agg_code(agg: TseriesAgg) -> u32 {
    match agg {
        TseriesAgg::Last => weft_abi::TSERIES_LAST,
        TseriesAgg::Avg => weft_abi::TSERIES_AVG,
        TseriesAgg::Max => weft_abi::TSERIES_MAX,
        TseriesAgg::Min => weft_abi::TSERIES_MIN,
        TseriesAgg::Sum => weft_abi::TSERIES_SUM,
    }
}

impl Segment {
    pub fn create(prog: &Program, sizes: Sizes, target_pid: u32) -> Result<Segment> {
        let mut b =
            LayoutBuilder::new(sizes.max_threads, sizes.ring_size).max_sites(sizes.max_sites);
        if crate::unwind::uses_ustack(prog) {
            b = b.unwind(crate::unwind::AREA_BYTES);
        }
        let thread_keyed = weft_ir::thread_keyed_maps(prog);
        for (m, &tk) in prog.maps.iter().zip(&thread_keyed) {
            let key_size = m.key.as_ref().map_or(0, |k| k.size());
            let mut spec = map_spec(&m.value, key_size, prog.config.max_keys_of(&m.name));
            if weft_ir::is_inherited_map(&m.name) && key_size == 8 {
                spec.flags |= weft_abi::MAP_FLAG_INHERIT_PID;
            }
            if tk && std::env::var_os("WEFT_THREAD_KEYED").is_none_or(|v| v != "0") {
                spec.flags |= weft_abi::MAP_FLAG_THREAD_KEYED;
            }
            b.add_map(spec);
        }
        let layout = b.finish();
        // SAFETY: memfd_create with a static name; the fd is owned below.
        let raw = unsafe { libc::memfd_create(c"weft-shm".as_ptr(), libc::MFD_CLOEXEC) };
        if raw < 0 {
            bail!("memfd_create: {}", std::io::Error::last_os_error());
        }
        // SAFETY: raw is a fresh fd.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // Private to this user (memfds are created 0777): the fd is only ever passed
        // to the agent.
        // SAFETY: fchmod/ftruncate on our fd.
        unsafe {
            if libc::fchmod(raw, 0o600) != 0 {
                bail!(
                    "making the shared segment private: {}",
                    std::io::Error::last_os_error()
                );
            }
            if libc::ftruncate(raw, layout.total_size as i64) != 0 {
                bail!(
                    "sizing the shared segment ({} bytes): {}",
                    layout.total_size,
                    std::io::Error::last_os_error()
                );
            }
        }
        // SAFETY: mapping our memfd shared read-write.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                layout.total_size as usize,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_NORESERVE,
                fd.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error()).context("mapping the shared segment");
        }
        // SAFETY: a fresh zeroed mapping of total_size bytes.
        let shm = unsafe { Shm::from_base(ptr as *mut u8) };
        layout.write_header(&shm, target_pid);
        let maps = layout
            .maps
            .iter()
            .zip(&prog.maps)
            .map(|((s, t, a, e), decl)| MapLayout {
                kind: s.kind,
                capacity: s.capacity(),
                entry_size: *e,
                key_size: s.key_size,
                value_size: s.value_size,
                table_off: *t,
                agg_off: *a,
                hist_k: s.hist_k,
                signed: s.signed,
                thread_keyed: s.flags & weft_abi::MAP_FLAG_THREAD_KEYED != 0,
                string_key: matches!(decl.key, Some(weft_ir::Type::Str { .. })),
            })
            .collect();
        let clock = weft_runtime::clock::Calibrator::start(&shm.header().clock);
        let seg = Segment {
            fd,
            shm,
            layout,
            maps,
            clock,
            ptr,
        };
        seg.init_header(prog, sizes);
        // A scalar count() exists from the start (bpftrace prints `@c: 0` for one that
        // was never hit), so inline advice can add to it without a first-use check.
        for (i, m) in prog.maps.iter().enumerate() {
            if m.key.is_none() && m.value == MapValue::Count {
                weft_runtime::map::insert(&seg.shm, seg.shm.map(i as u32), &[]);
            }
        }
        Ok(seg)
    }

    fn init_header(&self, _prog: &Program, sizes: Sizes) {
        let h = self.shm.header() as *const weft_abi::ShmHeader as *mut weft_abi::ShmHeader;
        // SAFETY: the agent has not mapped the segment yet; plain fields.
        unsafe {
            (*h).start_nsecs = weft_runtime::clock::monotonic_ns();
            if sizes.lossless {
                (*h).ring_wait_spins = weft_runtime::ring::spins_for(RING_WAIT_NS);
            }
            (*h).uid = u64::from(libc::getuid());
            (*h).gid = u64::from(libc::getgid());
        }
    }

    pub fn set_target(&self, pid: u32, cpid: u64, uid: u64, gid: u64) {
        let h = self.shm.header() as *const weft_abi::ShmHeader as *mut weft_abi::ShmHeader;
        // SAFETY: written before the agent reads them (before MAP_SHM).
        unsafe {
            (*h).target_pid = pid;
            (*h).cpid = cpid;
            (*h).uid = uid;
            (*h).gid = gid;
        }
    }

    pub fn size(&self) -> u64 {
        self.layout.total_size
    }

    /// Keep the TSC clock calibrated (cheap unless a second has passed).
    pub fn tick_clock(&mut self) {
        if let Some(c) = self.clock.as_mut() {
            c.tick(&self.shm.header().clock);
        }
    }

    /// weft's own thread slot (BEGIN/END/interval advice run here).
    pub fn claim_own_slot(&self, tid: u32) -> *mut weft_abi::ThreadSlot {
        weft_runtime::slots::claim_weft(&self.shm, tid)
    }

    /// Whether entry 0 of a scalar map is live (the map has a value to print).
    pub fn scalar_live(&self, map: u32) -> bool {
        weft_runtime::map::entry_state(&self.shm, self.shm.map(map), 0) == ENTRY_LIVE
    }
}

impl Drop for Segment {
    fn drop(&mut self) {
        // SAFETY: unmapping our own mapping; nothing uses it after the session.
        unsafe { libc::munmap(self.ptr, self.layout.total_size as usize) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering;
    use weft_abi::{EVENT_FUNC_ENTRY, EVENT_FUNC_EXIT};
    use weft_trace::{Decoder, Event};

    /// Two threads of one process call the same function; the thread whose slot
    /// comes later made its calls first. Recording writes each thread's calls as
    /// its ring held them: read back, the function is named before its first call
    /// in any thread, and every call comes out once, with its thread and time.
    #[test]
    fn a_recorded_function_is_named_before_any_threads_call_to_it() {
        use weft_trace::record::{Frame, Reader, Writer};
        use weft_trace::sink::{Context, Sink};
        let prog = Program::default();
        let seg = Segment::create(&prog, Sizes::default(), 1).unwrap();
        let shm = &seg.shm;
        // SAFETY: site 0 is unused and no other thread reads the table.
        let d = unsafe { &mut *shm.site_mut(0) };
        d.func = 0x401000;
        d.name[..4].copy_from_slice(b"leaf");
        shm.header().site_count.store(1, Ordering::Release);
        let late = weft_runtime::slots::claim(shm, 7, 70).unwrap();
        let early = weft_runtime::slots::claim(shm, 7, 71).unwrap();
        let size = shm.header().ring_size;
        for (slot, at) in [(late, 2000), (early, 1000)] {
            for (kind, t, ret) in [(EVENT_FUNC_ENTRY, at, 0), (EVENT_FUNC_EXIT, at + 10, 5)] {
                // SAFETY: each slot is used by this test alone, as its thread would.
                let ok = unsafe {
                    weft_runtime::ring::produce(
                        slot,
                        shm.ring(slot),
                        size,
                        kind,
                        0,
                        (ret, 0),
                        t,
                        &[],
                        0,
                    )
                };
                assert!(ok);
            }
        }
        let mut dec = Decoder::default();
        dec.pack_functions = true;
        let out = dec.drain(shm, &prog);
        struct NoSymbols;
        impl weft_output::Resolver for NoSymbols {
            fn usym(&self, _: u64) -> Option<weft_output::Symbol> {
                None
            }
            fn probe_name(&self, id: u64) -> String {
                format!("probe{id}")
            }
            fn format(&self, _: weft_ir::FmtId) -> Option<&weft_ir::Format> {
                None
            }
        }
        let resolver = NoSymbols;
        let cx = Context {
            prog: &prog,
            resolver: &resolver,
        };
        let mut w = Writer::new(Vec::new(), &prog).unwrap();
        for r in &out {
            w.record(r, &cx);
        }
        let bytes = w.close().unwrap();
        let mut r = Reader::new(&bytes[..]).unwrap();
        let mut got = Vec::new();
        while let Some(f) = r.next_frame().unwrap() {
            let Frame::Record(rec) = f else { continue };
            match rec.event {
                Event::Function { func, name } => got.push(format!("name {func:#x} {name}")),
                Event::FunctionEntry { func, .. } => {
                    got.push(format!("{} {} enter {func:#x}", rec.tid, rec.nsecs))
                }
                Event::FunctionExit { func, retval } => {
                    got.push(format!("{} {} exit {func:#x} {retval}", rec.tid, rec.nsecs))
                }
                _ => {}
            }
        }
        assert_eq!(
            got,
            [
                "name 0x401000 leaf",
                "71 1000 enter 0x401000",
                "71 1010 exit 0x401000 5",
                "70 2000 enter 0x401000",
                "70 2010 exit 0x401000 5",
            ]
        );
    }
}
