//! x86-64 machine code for weaving: plan how a site is patched, relocate the
//! instructions a patch displaces, and produce the patch bytes. Bytes in, bytes out:
//! no IO, no processes, so every sequence is tested byte for byte.
//!
//! The flow for one site (see ARCHITECTURE.md, "Sites and trampolines"):
//!
//! 1. [`plan_site`] takes the function's bytes from the ELF file and a site address and
//!    returns a [`SitePlan`]: [`SitePlan::Jump`] (overwrite at least 5 bytes with
//!    `jmp rel32`), [`SitePlan::Int3`] (overwrite 1 byte with `int3`, with the
//!    [`Reason`] a jump was unsafe) or [`SitePlan::Refused`]. An `endbr64` at the
//!    function start is never overwritten.
//! 2. The caller builds a trampoline (elsewhere) whose tail is [`relocate`]: the
//!    displaced instructions re-encoded at the tail's address, then a jump back. For an
//!    int3 site the same call gives the copy of the one displaced instruction the thread
//!    resumes at.
//! 3. [`patch_bytes`] gives what to write at the patch address;
//!    [`SitePlan::original_bytes`] what to write back when unweaving.
//!
//! Call sites (`call:` probes) take another path, with nothing relocated:
//! [`scan_calls`] finds the direct branches to a function, [`retarget`] gives the
//! same instruction branching to a stub, [`resume_code`] the original branch for a
//! thread that meets the transient `int3` of a rewrite.
//!
//! [`branch_targets`], [`decode_len`] and [`disassemble`] are analysis helpers for
//! other crates and for `weft trace -d` dumps.
//!
//! What callers must know:
//!
//! * Addresses are whatever space `FunctionCode::addr` is in (file or run time); plans
//!   and relocated code use it throughout, so plan with run-time addresses.
//! * A branch to the patch point itself (e.g. an -O2 loop whose head is the first
//!   instruction) is allowed, and re-enters the trampoline: entry advice runs once per
//!   iteration, like a uprobe, and a return-probe hijack may see its own return
//!   trampoline in the slot.
//! * Not checked, because not visible in one function's bytes: branches into the patch
//!   from other symbols (gcc's `foo.cold` only returns to the middle of `foo`), jump
//!   table targets (case labels), and saved PCs in signal frames.
//! * The emulated `call` (see [`relocate`]) is incompatible with a CET user shadow
//!   stack.

mod access;
mod callsite;
mod decode;
mod patch;
mod plan;
mod relocate;
mod returns;

pub use access::{
    access_epilogue, access_middle, access_prologue, scan_accesses, Access, AccessKind, AccessScan,
    ACCESS_STACK,
};
pub use callsite::{resume_code, retarget, scan_calls, CallKind, CallScan, CallSite, Slot};
pub use decode::{branch_targets, decode_len, disassemble};
pub use patch::{call_rel32, jmp_rel32, patch_bytes, INT3};
pub use plan::{plan_site, plan_site_among, FunctionCode, Reason, SitePlan, ENDBR64, JUMP_LEN};
pub use relocate::relocate;
pub use returns::{
    ends_with_ret, relocate_before_ret, return_sites, NoReturnSites, ReturnSite, ReturnSites,
};

/// Errors from encoding patches and relocated code.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum X86Error {
    /// A `rel32` from `from` cannot reach `to`.
    #[error("{to:#x} is out of rel32 range of {from:#x}")]
    OutOfRange { from: u64, to: u64 },
    /// A `[rip+disp]` operand cannot reach its address from the relocated code.
    #[error("`{insn}` at {at:#x} addresses {target:#x}, more than 2 GiB from {new_addr:#x}")]
    RipRelativeOutOfRange {
        at: u64,
        insn: String,
        target: u64,
        new_addr: u64,
    },
    /// The plan is a refused site: nothing to patch or relocate.
    #[error("site not patched: {0}")]
    Refused(Reason),
    /// iced could not encode the relocated instructions.
    #[error("cannot encode relocated instructions: {0}")]
    Encode(String),
}
