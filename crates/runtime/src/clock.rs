//! Clocks and CPU number without system calls (the TSC, vDSO `clock_gettime`,
//! `rdtscp`).
//!
//! `nsecs` is CLOCK_MONOTONIC read from the TSC through the segment's [`TscClock`]
//! (about 2.5× cheaper than the vDSO here), which weft keeps calibrated
//! ([`Calibrator`]). Without an invariant TSC it is the vDSO's.

use core::sync::atomic::{fence, Ordering};
use weft_abi::{ShmHeader, TscClock, TSC_SHIFT};

/// CLOCK_MONOTONIC in nanoseconds from the vDSO.
#[inline]
pub fn monotonic_ns() -> u64 {
    read(libc::CLOCK_MONOTONIC)
}

/// CLOCK_REALTIME in nanoseconds.
#[inline]
pub fn realtime_ns() -> u64 {
    read(libc::CLOCK_REALTIME)
}

/// The calling thread's CPU time (user and system), in ns: a system call (the
/// vDSO does not serve per-thread clocks).
pub fn thread_cputime_ns() -> u64 {
    read(libc::CLOCK_THREAD_CPUTIME_ID)
}

/// One of the calling thread's resource counters (`weft_abi::RUSAGE_*`), from
/// `getrusage(RUSAGE_THREAD)`: a system call. 0 for an unknown counter.
pub fn thread_rusage(which: u64) -> u64 {
    // SAFETY: rusage is plain data, zeroed is a valid value.
    let mut ru: libc::rusage = unsafe { core::mem::zeroed() };
    // SAFETY: ru is a valid rusage for the kernel to fill.
    unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut ru) };
    let n = match which {
        weft_abi::RUSAGE_FAULTS => ru.ru_minflt + ru.ru_majflt,
        weft_abi::RUSAGE_MINOR_FAULTS => ru.ru_minflt,
        weft_abi::RUSAGE_MAJOR_FAULTS => ru.ru_majflt,
        weft_abi::RUSAGE_CONTEXT_SWITCHES => ru.ru_nvcsw + ru.ru_nivcsw,
        _ => 0,
    };
    n as u64
}

#[inline]
fn read(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: ts is a valid timespec; glibc serves these clocks from the vDSO.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

#[inline]
fn tsc() -> u64 {
    // SAFETY: rdtsc only reads the time-stamp counter.
    unsafe { core::arch::x86_64::_rdtsc() }
}

/// The line's value at `tsc`, exactly as inline advice computes it.
#[inline]
fn line(mult: u64, base_tsc: u64, base_ns: u64, tsc: u64) -> u64 {
    let d = tsc.wrapping_sub(base_tsc) as i64 as i128;
    let p = (d * i128::from(mult as i64)) >> TSC_SHIFT;
    base_ns.wrapping_add(p as i64 as u64)
}

/// CLOCK_MONOTONIC in nanoseconds as the session's advice reads it (`nsecs`): the
/// segment's TSC clock, or the vDSO's when it has none.
#[inline]
pub fn now(h: &ShmHeader) -> u64 {
    let l = TscLine::read(&h.clock);
    if l.mult == 0 {
        return monotonic_ns();
    }
    l.ns(tsc())
}

/// One line of a [`TscClock`]: `base_ns + ((tsc - base_tsc) * mult) >> 32`
/// (`mult` 0: the clock is not the TSC).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TscLine {
    pub mult: u64,
    pub base_tsc: u64,
    pub base_ns: u64,
}

impl TscLine {
    /// The clock's line now (a seqlock read).
    pub fn read(c: &TscClock) -> TscLine {
        loop {
            let s = c.seq.load(Ordering::Acquire);
            if s & 1 == 0 {
                let l = TscLine {
                    mult: c.mult.load(Ordering::Relaxed),
                    base_tsc: c.base_tsc.load(Ordering::Relaxed),
                    base_ns: c.base_ns.load(Ordering::Relaxed),
                };
                fence(Ordering::Acquire);
                if c.seq.load(Ordering::Relaxed) == s {
                    return l;
                }
            }
            core::hint::spin_loop();
        }
    }

    /// CLOCK_MONOTONIC ns of a TSC reading on this line, exactly as inline
    /// advice computes it.
    #[inline]
    pub fn ns(&self, tsc: u64) -> u64 {
        line(self.mult, self.base_tsc, self.base_ns, tsc)
    }
}

/// Every line a segment's clock has had, for TSC readings kept raw
/// (`weft_abi::EVENT_FUNC_ENTRY_TSC`): weft's drain notes each new line, the record
/// file carries them, and a reading is converted on the line that was current
/// when it was read — the last one starting at or before it. weft recalibrates
/// continuously (a new line starts where the old one is, and never goes back), so
/// converted times are the ones advice reading `nsecs` would have seen, in order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TscLines(Vec<TscLine>);

impl TscLines {
    /// Note a line; `true` when it is new. A line without a TSC is ignored.
    pub fn add(&mut self, l: TscLine) -> bool {
        if l.mult == 0 {
            return false;
        }
        match self.0.binary_search_by_key(&l.base_tsc, |x| x.base_tsc) {
            Ok(i) if self.0[i] == l => false,
            Ok(i) => {
                self.0[i] = l;
                true
            }
            Err(i) => {
                self.0.insert(i, l);
                true
            }
        }
    }

    /// CLOCK_MONOTONIC ns of a raw TSC reading (the reading itself with no line
    /// known: a file cut before its first clock frame).
    pub fn ns(&self, tsc: u64) -> u64 {
        let i = self.0.partition_point(|l| l.base_tsc <= tsc);
        match self.0.get(i.saturating_sub(1)) {
            Some(l) => l.ns(tsc),
            None => tsc,
        }
    }

    pub fn lines(&self) -> &[TscLine] {
        &self.0
    }
}

/// Whether the TSC can serve as CLOCK_MONOTONIC on this machine: it ticks at a
/// constant rate in every power state (`constant_tsc` and `nonstop_tsc`), and
/// `WEFT_CLOCK=vdso` does not ask for the vDSO.
pub fn tsc_usable() -> bool {
    if std::env::var("WEFT_CLOCK").is_ok_and(|v| v == "vdso") {
        return false;
    }
    let Ok(info) = std::fs::read_to_string("/proc/cpuinfo") else {
        return false;
    };
    let flags = info
        .lines()
        .find(|l| l.starts_with("flags"))
        .unwrap_or_default();
    let has = |f: &str| flags.split_whitespace().any(|w| w == f);
    has("constant_tsc") && has("nonstop_tsc")
}

/// One reading of both clocks: the TSC halfway between two reads that bracket a
/// `clock_gettime`, taken from the tightest of a few tries, and that bracket's
/// width in ticks (the reading's uncertainty).
fn pair() -> (u64, u64, u64) {
    let mut best = (0, 0, u64::MAX);
    for _ in 0..7 {
        let t0 = tsc();
        let ns = monotonic_ns();
        let t1 = tsc();
        let w = t1.wrapping_sub(t0);
        if w < best.2 {
            best = (t0 + w / 2, ns, w);
        }
    }
    best
}

/// Keeps a segment's [`TscClock`] on CLOCK_MONOTONIC (weft's side: it alone writes
/// the clock). [`Calibrator::start`] spins 2 ms for a first rate; each
/// [`Calibrator::tick`] after a second has passed measures the rate over the whole
/// run and sets a line that starts where the current one is and meets the system
/// clock a second later (a slew of at most 0.1 %), so `nsecs` never goes back.
#[derive(Debug)]
pub struct Calibrator {
    first: (u64, u64),
    last_ns: u64,
    /// Time to the next update, in ns: 50 ms after the start, doubling to
    /// [`PERIOD`] (the rate measured over a longer run is a better one).
    period: u64,
    /// The largest distance from CLOCK_MONOTONIC found at an update, in ns.
    pub worst_error: u64,
}

/// How often the line is set again once the run is long, in ns.
const PERIOD: u64 = 1_000_000_000;

impl Calibrator {
    /// Calibrate `c` and keep it (None, and `c` left at 0 so readers use the vDSO,
    /// when the TSC cannot serve).
    pub fn start(c: &TscClock) -> Option<Calibrator> {
        if !tsc_usable() {
            return None;
        }
        let (t0, n0, _) = pair();
        let mut t1;
        let mut n1;
        loop {
            (t1, n1, _) = pair();
            if n1.saturating_sub(n0) >= 2_000_000 {
                break;
            }
            core::hint::spin_loop();
        }
        if t1 <= t0 {
            return None;
        }
        let rate = (n1 - n0) as f64 / (t1 - t0) as f64;
        // The first line starts a little ahead of the vDSO clock (by the reading's
        // uncertainty), so a time taken from the vDSO before it is never later than
        // one taken from it after.
        let (t, n, w) = pair();
        let ahead = (w as f64 * rate).ceil() as u64;
        set(c, mult_of(rate), t, n + ahead);
        Some(Calibrator {
            first: (t0, n0),
            last_ns: n,
            period: PERIOD / 20,
            worst_error: ahead,
        })
    }

    /// Set the line again when a period has passed.
    pub fn tick(&mut self, c: &TscClock) {
        if monotonic_ns().saturating_sub(self.last_ns) < self.period {
            return;
        }
        self.period = (self.period * 2).min(PERIOD);
        let (t, n, _) = pair();
        let (mult, base_tsc, base_ns) = (
            c.mult.load(Ordering::Relaxed),
            c.base_tsc.load(Ordering::Relaxed),
            c.base_ns.load(Ordering::Relaxed),
        );
        if t <= self.first.0 || mult == 0 {
            return;
        }
        let ours = line(mult, base_tsc, base_ns, t);
        let err = ours as i64 - n as i64;
        self.worst_error = self.worst_error.max(err.unsigned_abs());
        let rate = (n - self.first.1) as f64 / (t - self.first.0) as f64;
        // Meet the system clock one period from now.
        let correction = (-(err as f64) / self.period as f64).clamp(-1e-3, 1e-3);
        // The new line starts where the old one is *now*, not at the reading `t`
        // (weft may have been descheduled since): started in the past with a
        // smaller slope, it would lie below what advice read a moment ago.
        let now = tsc();
        set(
            c,
            mult_of(rate * (1.0 + correction)),
            now,
            line(mult, base_tsc, base_ns, now),
        );
        self.last_ns = n;
    }
}

fn mult_of(ns_per_tick: f64) -> u64 {
    (ns_per_tick * (1u64 << TSC_SHIFT) as f64).round() as u64
}

fn set(c: &TscClock, mult: u64, base_tsc: u64, base_ns: u64) {
    let s = c.seq.load(Ordering::Relaxed);
    c.seq.store(s + 1, Ordering::Relaxed);
    fence(Ordering::Release);
    c.base_tsc.store(base_tsc, Ordering::Relaxed);
    c.base_ns.store(base_ns, Ordering::Relaxed);
    c.mult.store(mult, Ordering::Relaxed);
    c.seq.store(s + 2, Ordering::Release);
}

/// TSC_AUX, where Linux keeps the CPU this thread runs on (low 12 bits) and that
/// CPU's NUMA node (the bits above).
#[inline]
fn tsc_aux() -> u32 {
    let aux: u32;
    // SAFETY: rdtscp only reads the TSC and TSC_AUX; it clobbers eax/edx/ecx.
    unsafe {
        core::arch::asm!("rdtscp", out("eax") _, out("edx") _, out("ecx") aux, options(nomem, nostack));
    }
    aux
}

/// The CPU this thread runs on.
#[inline]
pub fn cpu() -> u64 {
    u64::from(tsc_aux() & 0xfff)
}

/// The NUMA node of the CPU this thread runs on.
#[inline]
pub fn numa_node() -> u64 {
    u64::from(tsc_aux() >> 12)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cpu_and_its_node_are_what_getcpu_says() {
        // The thread may move between the reads: take a reading the CPU did not
        // change around.
        for _ in 0..1000 {
            let (mut c, mut n) = (0u32, 0u32);
            let before = cpu();
            // SAFETY: getcpu writes two u32s through valid pointers.
            let r = unsafe { libc::syscall(libc::SYS_getcpu, &mut c, &mut n, 0usize) };
            assert_eq!(r, 0);
            let node = numa_node();
            if before == u64::from(c) && cpu() == before {
                assert_eq!(node, u64::from(n));
                return;
            }
        }
        panic!("the thread never stayed on one CPU across three reads");
    }

    #[test]
    fn a_raw_reading_is_converted_on_the_line_it_was_read_under() {
        // 1 ns a tick from tsc 0; from tsc 1000 (where the first was at 1000 ns),
        // 2 ns a tick; from tsc 2000 (at 3000 ns), 1 ns a tick again.
        let a = TscLine {
            mult: 1 << TSC_SHIFT,
            base_tsc: 0,
            base_ns: 0,
        };
        let b = TscLine {
            mult: 2 << TSC_SHIFT,
            base_tsc: 1000,
            base_ns: 1000,
        };
        let c = TscLine {
            mult: 1 << TSC_SHIFT,
            base_tsc: 2000,
            base_ns: 3000,
        };
        let mut l = TscLines::default();
        assert_eq!(l.ns(7), 7);
        // Noted out of order, twice, and one without a TSC: three lines.
        assert!(l.add(c) && l.add(a) && l.add(b));
        assert!(!l.add(b));
        assert!(!l.add(TscLine::default()));
        assert_eq!(l.lines(), &[a, b, c]);
        assert_eq!(l.ns(999), 999);
        assert_eq!(l.ns(1000), 1000);
        assert_eq!(l.ns(1010), 1020);
        assert_eq!(l.ns(1999), 2998);
        assert_eq!(l.ns(2000), 3000);
        assert_eq!(l.ns(2500), 3500);
    }
    use core::sync::atomic::AtomicU64;

    fn clock() -> TscClock {
        TscClock {
            seq: AtomicU64::new(0),
            mult: AtomicU64::new(0),
            base_tsc: AtomicU64::new(0),
            base_ns: AtomicU64::new(0),
        }
    }

    fn read_line(c: &TscClock) -> u64 {
        line(
            c.mult.load(Ordering::Relaxed),
            c.base_tsc.load(Ordering::Relaxed),
            c.base_ns.load(Ordering::Relaxed),
            tsc(),
        )
    }

    /// The TSC clock stays within 100 µs of CLOCK_MONOTONIC across updates and
    /// never goes back (this machine kind has an invariant TSC: the test needs it).
    #[test]
    fn tsc_clock_follows_the_system_clock_and_never_goes_back() {
        let c = clock();
        let mut cal = Calibrator::start(&c).expect("an invariant TSC");
        let mut last = 0;
        let end = monotonic_ns() + 2_500_000_000;
        let mut worst: i64 = 0;
        while monotonic_ns() < end {
            cal.tick(&c);
            let before = monotonic_ns();
            let ours = read_line(&c);
            let after = monotonic_ns();
            assert!(ours >= last, "went back: {ours} < {last}");
            last = ours;
            // Preemption between the three reads only widens [before, after].
            if ours < before {
                worst = worst.max((before - ours) as i64);
            } else if ours > after {
                worst = worst.max((ours - after) as i64);
            }
        }
        assert!(worst < 100_000, "{worst} ns from CLOCK_MONOTONIC");
    }

    #[test]
    fn the_line_is_continuous_where_it_is_set_again() {
        let c = clock();
        set(&c, mult_of(0.5), 1000, 5_000_000);
        let at = line(c.mult.load(Ordering::Relaxed), 1000, 5_000_000, 11_000);
        assert_eq!(at, 5_005_000);
        // Before the base (another CPU's TSC a little behind): signed.
        assert_eq!(line(mult_of(0.5), 1000, 5_000_000, 990), 4_999_995);
        assert_eq!(c.seq.load(Ordering::Relaxed), 2);
    }
}
