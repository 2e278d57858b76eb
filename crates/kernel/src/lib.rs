//! Kernel event sources: what the running kernel offers, its tracepoints (tracefs),
//! and weft's eBPF programs for kernel probes — loaded, attached, their ring buffer
//! read and their maps read back. The only crate that makes BPF and perf system
//! calls (through aya).

pub mod catch;
pub mod perf;
pub mod probes;
pub mod tracefs;

/// x86-64 system call numbers, from the kernel's UAPI header at build time.
pub mod syscalls {
    include!(concat!(env!("OUT_DIR"), "/syscalls.rs"));

    /// The number of system call `name` (`getppid`), if the table has it.
    pub fn number(name: &str) -> Option<u32> {
        SYSCALLS
            .binary_search_by(|(n, _)| (*n).cmp(name))
            .ok()
            .map(|i| SYSCALLS[i].1)
    }
}
