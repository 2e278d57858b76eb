//! The bytes written over a site: `jmp rel32` to the trampoline or a single `int3`.
//! These are fixed sequences, encoded by hand.

use crate::plan::SitePlan;
use crate::X86Error;

/// The `int3` opcode.
pub const INT3: u8 = 0xcc;

/// `jmp rel32` at `from` to `to`.
///
/// # Errors
///
/// [`X86Error::OutOfRange`] when `to` is not within ±2 GiB of the end of the jump.
pub fn jmp_rel32(from: u64, to: u64) -> Result<[u8; 5], X86Error> {
    rel32(0xe9, from, to)
}

/// `call rel32` at `from` to `to`.
///
/// # Errors
///
/// [`X86Error::OutOfRange`] when `to` is not within ±2 GiB of the end of the call.
pub fn call_rel32(from: u64, to: u64) -> Result<[u8; 5], X86Error> {
    rel32(0xe8, from, to)
}

fn rel32(opcode: u8, from: u64, to: u64) -> Result<[u8; 5], X86Error> {
    // No wrapping around the address space: user code never sits at its ends.
    let diff = i128::from(to) - (i128::from(from) + 5);
    let rel = i32::try_from(diff).map_err(|_| X86Error::OutOfRange { from, to })?;
    let [a, b, c, d] = rel.to_le_bytes();
    Ok([opcode, a, b, c, d])
}

/// The bytes to write at the plan's patch address, as long as
/// [`SitePlan::original_bytes`]: for a jump site, `jmp rel32` to `trampoline` padded
/// with `int3` over the rest of the displaced bytes (so a stray jump into them traps
/// instead of running half an instruction); for an int3 site, `int3` (`trampoline` is
/// not used).
///
/// # Errors
///
/// [`X86Error::Refused`] for a refused plan, [`X86Error::OutOfRange`] when the
/// trampoline is out of `jmp rel32` range.
pub fn patch_bytes(plan: &SitePlan, trampoline: u64) -> Result<Vec<u8>, X86Error> {
    match plan {
        SitePlan::Jump {
            patch_addr,
            displaced_len,
            ..
        } => {
            let mut bytes = jmp_rel32(*patch_addr, trampoline)?.to_vec();
            bytes.resize(*displaced_len, INT3);
            Ok(bytes)
        }
        SitePlan::Int3 { .. } => Ok(vec![INT3]),
        SitePlan::Refused { reason } => Err(X86Error::Refused(reason.clone())),
    }
}
