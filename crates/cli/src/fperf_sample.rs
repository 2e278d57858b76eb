//! Where the target's CPU time goes, sampled, for `weft fperf`'s budget: a
//! task-clock perf event on each thread of the target records the interrupted pc
//! every `period` of the thread's own CPU time into a ring weft reads (no signal,
//! nothing runs in the target). The samples that land in weft's code inside the
//! target — the trampolines and inline advice (`memfd:weft-code`) and the agent
//! library (helpers, the return trampoline) — are the probes' share of its time,
//! whatever it is made of: the trampolines, the advice, their cache misses.
//!
//! The advice's own timing misses part of that (the heads, the return-address
//! hijack, the clock reads around it), and on some programs most of it: on a
//! Python loop the probes cost three times what the advice timed. The controller
//! takes the larger of the two.

use std::collections::HashMap;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use perf_event_open_sys::bindings;

/// Data pages of each thread's ring (a power of two), besides the header page.
const RING_PAGES: usize = 16;

/// One thread's event and its mapped ring.
struct Ring {
    _fd: OwnedFd,
    base: *mut u8,
    len: usize,
}

impl Drop for Ring {
    fn drop(&mut self) {
        // SAFETY: `base` is the mapping of `len` bytes made in `Ring::open`, used by
        // nothing else once the ring is dropped.
        unsafe { libc::munmap(self.base.cast(), self.len) };
    }
}

impl Ring {
    /// The task-clock event of thread `tid`, sampling its pc every `period_ns` of
    /// its user-mode CPU time, and its ring.
    fn open(tid: i32, period_ns: u64) -> Option<Ring> {
        let mut attr = bindings::perf_event_attr {
            type_: bindings::PERF_TYPE_SOFTWARE,
            size: std::mem::size_of::<bindings::perf_event_attr>() as u32,
            config: bindings::PERF_COUNT_SW_TASK_CLOCK as u64,
            sample_type: bindings::PERF_SAMPLE_IP as u64,
            ..Default::default()
        };
        attr.__bindgen_anon_1.sample_period = period_ns;
        attr.set_exclude_kernel(1);
        attr.set_exclude_hv(1);
        // SAFETY: `attr` is a fully initialised perf_event_attr of its own size.
        let fd = unsafe {
            perf_event_open_sys::perf_event_open(
                &mut attr,
                tid,
                -1,
                -1,
                bindings::PERF_FLAG_FD_CLOEXEC as libc::c_ulong,
            )
        };
        if fd < 0 {
            return None;
        }
        // SAFETY: a descriptor perf_event_open just returned, owned here.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let page = page_size();
        let len = (RING_PAGES + 1) * page;
        // SAFETY: mapping the event's ring, shared read-write as perf requires.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return None;
        }
        Some(Ring {
            _fd: fd,
            base: base.cast(),
            len,
        })
    }

    /// The pcs of the samples written since the last read, and the samples the
    /// kernel dropped for want of room.
    fn read(&mut self, mut pc: impl FnMut(u64)) -> u64 {
        let page = page_size();
        let size = (RING_PAGES * page) as u64;
        let hdr = self.base as *mut bindings::perf_event_mmap_page;
        // SAFETY: the header page of our mapping; the kernel publishes data_head
        // (read with acquire order after it), we own data_tail.
        let (head, tail) = unsafe {
            let head = std::ptr::addr_of!((*hdr).data_head).read_volatile();
            std::sync::atomic::fence(std::sync::atomic::Ordering::Acquire);
            (head, std::ptr::addr_of!((*hdr).data_tail).read_volatile())
        };
        // SAFETY: the data pages follow the header page in our mapping.
        let data = unsafe { std::slice::from_raw_parts(self.base.add(page), size as usize) };
        let byte = |at: u64| data[(at % size) as usize];
        let word = |at: u64| {
            let mut b = [0u8; 8];
            for (k, x) in b.iter_mut().enumerate() {
                *x = byte(at + k as u64);
            }
            u64::from_le_bytes(b)
        };
        let mut lost = 0;
        let mut at = tail;
        while at + 8 <= head {
            let kind = u32::from_le_bytes([byte(at), byte(at + 1), byte(at + 2), byte(at + 3)]);
            let len = u64::from(u16::from_le_bytes([byte(at + 6), byte(at + 7)]));
            if len < 8 || at + len > head {
                break;
            }
            match kind {
                bindings::PERF_RECORD_SAMPLE if len >= 16 => pc(word(at + 8)),
                bindings::PERF_RECORD_LOST if len >= 24 => lost += word(at + 16),
                _ => {}
            }
            at += len;
        }
        std::sync::atomic::fence(std::sync::atomic::Ordering::Release);
        // SAFETY: as above; telling the kernel the records up to `at` are read.
        unsafe { std::ptr::addr_of_mut!((*hdr).data_tail).write_volatile(at) };
        lost
    }
}

fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    unsafe { libc::sysconf(libc::_SC_PAGESIZE) as usize }
}

/// The pc samples of one process's threads.
pub struct PcSampler {
    pid: i32,
    period_ns: u64,
    threads: HashMap<i32, Ring>,
    /// weft's code in the target: `[start, end)` ranges.
    ranges: Vec<(u64, u64)>,
    /// Samples read, and those in weft's code.
    pub total: u64,
    pub in_probes: u64,
    /// Samples the kernel dropped (a ring full between two reads).
    pub lost: u64,
}

impl PcSampler {
    /// Samples of process `pid`'s threads every `period_ns` of each one's CPU
    /// time; `None` when perf events cannot be opened on it (not permitted here).
    pub fn new(pid: i32, period_ns: u64) -> Option<PcSampler> {
        let mut s = PcSampler {
            pid,
            period_ns,
            threads: HashMap::new(),
            ranges: Vec::new(),
            total: 0,
            in_probes: 0,
            lost: 0,
        };
        s.refresh();
        (!s.threads.is_empty()).then_some(s)
    }

    /// Open the threads started since the last look, close those gone, and read
    /// where weft's code is now.
    pub fn refresh(&mut self) {
        self.read();
        let Ok(dir) = std::fs::read_dir(format!("/proc/{}/task", self.pid)) else {
            self.threads.clear();
            return;
        };
        let tids: Vec<i32> = dir
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse().ok())
            .collect();
        self.threads.retain(|t, _| tids.contains(t));
        for t in tids {
            if let std::collections::hash_map::Entry::Vacant(e) = self.threads.entry(t) {
                if let Some(r) = Ring::open(t, self.period_ns) {
                    e.insert(r);
                }
            }
        }
        if let Ok(maps) = std::fs::read_to_string(format!("/proc/{}/maps", self.pid)) {
            self.ranges = weft_code(&maps);
        }
    }

    /// Read every ring.
    pub fn read(&mut self) {
        let ranges = &self.ranges;
        let (mut total, mut inside) = (0, 0);
        let mut lost = 0;
        for r in self.threads.values_mut() {
            lost += r.read(|pc| {
                total += 1;
                if ranges.iter().any(|&(a, b)| pc >= a && pc < b) {
                    inside += 1;
                }
            });
        }
        self.total += total;
        self.in_probes += inside;
        self.lost += lost;
    }

    /// CPU time the samples in weft's code stand for, in ns.
    pub fn probe_ns(&self) -> f64 {
        self.in_probes as f64 * self.period_ns as f64
    }
}

/// The executable mappings of weft's code in a process: its generated code and
/// the agent library.
fn weft_code(maps: &str) -> Vec<(u64, u64)> {
    maps.lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let range = f.next()?;
            let perms = f.next()?;
            let path = f.nth(3).unwrap_or("");
            let ours =
                path.contains("weft-code") || path.ends_with(weft_engine::target::AGENT_FILE);
            if !perms.contains('x') || !ours {
                return None;
            }
            let (a, b) = range.split_once('-')?;
            Some((
                u64::from_str_radix(a, 16).ok()?,
                u64::from_str_radix(b, 16).ok()?,
            ))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weft_code_is_the_generated_code_and_the_agent() {
        let maps = "\
55d0c0000000-55d0c0001000 r-xp 00000000 08:01 1 /usr/bin/python3.11
7f0000000000-7f0000010000 r-xp 00000000 00:01 2 /memfd:weft-code (deleted)
7f0000100000-7f0000200000 r-xp 00001000 08:01 3 /opt/weft/libweft_agent.so
7f0000200000-7f0000300000 r--p 00101000 08:01 3 /opt/weft/libweft_agent.so
7f0000400000-7f0000500000 rw-s 00000000 00:01 4 /memfd:weft-shm (deleted)
";
        assert_eq!(
            weft_code(maps),
            vec![
                (0x7f00_0000_0000, 0x7f00_0001_0000),
                (0x7f00_0010_0000, 0x7f00_0020_0000)
            ]
        );
    }

    /// The sampler sees a thread of this process spend its time: a spinning
    /// thread's samples arrive, none of them in weft's code (there is none here).
    #[test]
    fn samples_arrive_from_a_running_thread() {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let s2 = stop.clone();
        let spin = std::thread::spawn(move || {
            let mut x = 0u64;
            while !s2.load(std::sync::atomic::Ordering::Relaxed) {
                x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
            }
            x
        });
        let pid = std::process::id() as i32;
        let mut s = PcSampler::new(pid, 100_000).expect("perf events (the suite runs as root)");
        let t0 = std::time::Instant::now();
        while s.total < 20 && t0.elapsed() < std::time::Duration::from_secs(20) {
            std::thread::sleep(std::time::Duration::from_millis(10));
            s.refresh();
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        spin.join().unwrap();
        assert!(s.total >= 20, "{} samples", s.total);
        assert_eq!(s.in_probes, 0);
    }
}
