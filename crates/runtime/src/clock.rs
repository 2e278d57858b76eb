//! Clocks and CPU number without system calls (vDSO `clock_gettime`, `rdtscp`).

/// CLOCK_MONOTONIC in nanoseconds (bpftrace `nsecs`).
#[inline]
pub fn monotonic_ns() -> u64 {
    read(libc::CLOCK_MONOTONIC)
}

/// CLOCK_REALTIME in nanoseconds.
#[inline]
pub fn realtime_ns() -> u64 {
    read(libc::CLOCK_REALTIME)
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

/// The CPU this thread runs on: Linux stores it in the low 12 bits of TSC_AUX.
#[inline]
pub fn cpu() -> u64 {
    let aux: u32;
    // SAFETY: rdtscp only reads the TSC and TSC_AUX; it clobbers eax/edx/ecx.
    unsafe {
        core::arch::asm!("rdtscp", out("eax") _, out("edx") _, out("ecx") aux, options(nomem, nostack));
    }
    u64::from(aux & 0xfff)
}
