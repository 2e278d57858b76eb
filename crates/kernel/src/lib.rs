//! Kernel event sources: what the running kernel offers, its tracepoints (tracefs),
//! and weft's eBPF programs for kernel probes — loaded, attached, their ring buffer
//! read and their maps read back. The only crate that makes BPF and perf system
//! calls (through aya).

pub mod catch;
pub mod probes;
pub mod tracefs;
