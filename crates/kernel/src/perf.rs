//! What perf events this machine offers to `weft fperf --list-events`: the PMUs
//! the kernel registered (`/sys/bus/event_source/devices`) and, for hardware
//! events, a test `perf_event_open` of the cycle counter on this thread.

/// The kernel's event sources (`cpu`, `software`, `breakpoint`, ...), sorted.
pub fn sources() -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir("/sys/bus/event_source/devices")
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// Whether hardware events can be counted here; the reason when not.
pub fn hardware() -> Result<(), String> {
    let has_pmu = ["cpu", "cpu_core", "cpu_atom", "armv8_pmuv3"]
        .iter()
        .any(|p| {
            std::path::Path::new("/sys/bus/event_source/devices")
                .join(p)
                .exists()
        });
    match open_test(PERF_TYPE_HARDWARE, PERF_COUNT_HW_CPU_CYCLES) {
        Ok(()) if has_pmu => Ok(()),
        Ok(()) => Err("the kernel registered no CPU PMU (no `cpu` in \
                       /sys/bus/event_source/devices), though it opened a cycle counter"
            .into()),
        Err(e) if has_pmu => Err(format!("perf_event_open of the cycle counter failed: {e}")),
        Err(e) => Err(format!(
            "no hardware performance counters: the kernel registered no CPU PMU (no `cpu` \
             in /sys/bus/event_source/devices: a virtual machine without a virtual PMU), \
             and perf_event_open of the cycle counter fails: {e}"
        )),
    }
}

/// Whether software events (page faults, context switches) can be opened.
pub fn software() -> Result<(), String> {
    open_test(PERF_TYPE_SOFTWARE, PERF_COUNT_SW_PAGE_FAULTS)
        .map_err(|e| format!("perf_event_open of a software event failed: {e}"))
}

const PERF_TYPE_HARDWARE: u32 = 0;
const PERF_TYPE_SOFTWARE: u32 = 1;
const PERF_COUNT_HW_CPU_CYCLES: u64 = 0;
const PERF_COUNT_SW_PAGE_FAULTS: u64 = 2;
const FLAG_DISABLED: u64 = 1;
const FLAG_EXCLUDE_KERNEL: u64 = 1 << 5;
const FLAG_EXCLUDE_HV: u64 = 1 << 6;
const PERF_FLAG_FD_CLOEXEC: u32 = 8;

/// Opens (and closes) a counting event of `type_`/`config` on this thread.
fn open_test(type_: u32, config: u64) -> Result<(), std::io::Error> {
    // `struct perf_event_attr` as of PERF_ATTR_SIZE_VER5 (112 bytes): type, size,
    // config, then the flag bits at byte 40; the rest zero.
    let mut attr = [0u64; 14];
    attr[0] = u64::from(type_) | (112u64 << 32);
    attr[1] = config;
    attr[5] = FLAG_DISABLED | FLAG_EXCLUDE_KERNEL | FLAG_EXCLUDE_HV;
    // SAFETY: perf_event_open reads the 112 bytes of `attr`; pid 0, cpu -1: this
    // thread on any CPU; no group.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_perf_event_open,
            attr.as_ptr(),
            0,
            -1,
            -1,
            libc::c_ulong::from(PERF_FLAG_FD_CLOEXEC),
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a descriptor this function opened.
    unsafe { libc::close(fd as i32) };
    Ok(())
}
