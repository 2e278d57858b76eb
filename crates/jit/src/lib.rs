//! Code generation: probe bodies (`weft_ir::Function`) to x86-64 machine code, and the
//! trampolines that connect patched sites to that code.
//!
//! * [`advice`]: one probe body → `extern "C" fn(*mut weft_abi::Frame)`.
//! * [`trampoline`]: entry trampolines for jump sites (save registers into a `Frame`,
//!   find the thread state, call advice, hijack the return address for return
//!   probes, restore, run the relocated instructions, jump back).
//!
//! Pure: bytes out, no IO. The caller decides where code goes and passes the
//! addresses it needs.

pub mod advice;
pub mod inline;
pub mod trampoline;

pub use advice::{compile, Env, MapLayout, UsdtArg};

#[derive(Debug, thiserror::Error)]
pub enum JitError {
    #[error("code generation failed: {0}")]
    Asm(#[from] iced_x86::IcedError),
    #[error("advice needs a {0}-byte stack frame; the limit is 1 MiB")]
    FrameTooLarge(u32),
    #[error("symbol `{0}` not found in the target")]
    UnknownSymbol(String),
    #[error("internal error: {0}")]
    BadProgram(String),
    #[error("{0}")]
    Relocation(String),
}
