//! eBPF code generation for kernel probes: an [`weft_ir::Function`] to eBPF
//! instructions.
