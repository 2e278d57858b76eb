//! Relocation: the displaced instructions re-encoded to run at another address (the
//! trampoline's tail, or the int3 resume slot), followed by a jump back.
//!
//! iced's `BlockEncoder` does the work: `[rip+disp]` operands get a new displacement
//! that reaches the same absolute address, relative branches keep their absolute
//! target (short forms become near ones when the target is far away; a target beyond
//! ±2 GiB becomes `jmp qword ptr [rip+x]` with the 8-byte address after the code).
//! Every target keeps its original absolute address, even one that is itself a
//! displaced instruction: a branch back to the patch point goes through the patch
//! again, like any other branch there.
//!
//! A `[rip+disp]` operand whose data is beyond ±2 GiB of the new address is
//! re-encoded `[eip+disp]` if the data lies in the low 4 GiB (the address wraps to 32
//! bits, which is exact there), and is an error otherwise.
//!
//! A near `call` (only ever the last displaced instruction) is emulated rather than
//! re-encoded, so that the callee returns into the *original* code, right after the
//! displaced bytes, and stack unwinders see a real return address:
//!
//! ```text
//! push <return address, low 32 bits sign-extended>
//! mov dword ptr [rsp+4], <high 32 bits>     ; only if sign-extension got them wrong
//! jmp <the call's target, operand unchanged: rel32, register or memory>
//! ```
//!
//! Neither flags nor registers are touched. A call whose operand uses `rsp` is refused
//! by the planner (the push would move it). Limitation: a process running with a CET
//! user shadow stack would fault on the callee's `ret`, since no `call` pushed it.

use iced_x86::{
    BlockEncoder, BlockEncoderOptions, Code, Instruction, InstructionBlock, MemoryOperand, Register,
};

use crate::decode::{self, is_rip_relative};
use crate::plan::{check_out_of_line, falls_through, is_near_call, Reason, SitePlan};
use crate::X86Error;

/// The instructions a plan displaces (a jump plan: all of them; an int3 plan: its one
/// instruction), re-encoded to run at `new_addr`, followed — when `jump_back` is true
/// and the last instruction can fall through — by a jump back to the first byte after
/// the displaced ones in the original code.
///
/// This is both the tail of a jump site's trampoline and the copy an int3 site resumes
/// at after its advice.
///
/// # Errors
///
/// [`X86Error::Refused`] for a refused plan; [`X86Error::RipRelativeOutOfRange`] when
/// a `[rip+disp]` operand cannot reach its address from `new_addr`;
/// [`X86Error::Encode`] for any other encoder failure.
pub fn relocate(plan: &SitePlan, new_addr: u64, jump_back: bool) -> Result<Vec<u8>, X86Error> {
    let (patch_addr, displaced) = match plan {
        SitePlan::Jump {
            patch_addr,
            displaced,
            padding,
            ..
        } => (*patch_addr, &displaced[..displaced.len() - padding]),
        SitePlan::Int3 {
            patch_addr,
            displaced,
            ..
        } => (*patch_addr, &displaced[..]),
        SitePlan::Refused { reason } => return Err(X86Error::Refused(reason.clone())),
    };
    let sweep = decode::sweep(displaced, patch_addr);
    if let Some(at) = sweep.error_at {
        return Err(X86Error::Refused(Reason::DecodeError { at }));
    }
    // Plans come from `plan_site`, but their fields are public: re-check the one rule
    // the encoding depends on (a call, emulated, only last).
    check_out_of_line(&sweep.insns).map_err(X86Error::Refused)?;
    relocate_insns(&sweep.insns, new_addr, jump_back)
}

/// Re-encodes `insns` (decoded at their original addresses, contiguous, only the last
/// one may be a near call) at `new_addr`; see [`relocate`].
pub(crate) fn relocate_insns(
    insns: &[Instruction],
    new_addr: u64,
    jump_back: bool,
) -> Result<Vec<u8>, X86Error> {
    let Some(last) = insns.last() else {
        return Ok(Vec::new());
    };
    let mut block = Vec::with_capacity(insns.len() + 3);
    for insn in insns {
        if is_near_call(insn) {
            block.extend(emulated_call(insn)?);
        } else {
            // IP 0: see `synthetic`.
            let mut copy = *insn;
            copy.set_ip(0);
            block.push(copy);
        }
    }
    if jump_back && falls_through(last) && !is_near_call(last) {
        block.push(synthetic(Instruction::with_branch(
            Code::Jmp_rel32_64,
            last.next_ip(),
        ))?);
    }
    match BlockEncoder::encode(
        64,
        InstructionBlock::new(&block, new_addr),
        BlockEncoderOptions::NONE,
    ) {
        Ok(result) => Ok(result.code_buffer),
        Err(err) => Err(out_of_range(insns, new_addr).unwrap_or(X86Error::Encode(err.to_string()))),
    }
}

/// The `push; [mov]; jmp` sequence that stands for `call` (see the module docs).
fn emulated_call(call: &Instruction) -> Result<Vec<Instruction>, X86Error> {
    let ret = call.next_ip();
    let low = ret as u32 as i32;
    let mut out = Vec::with_capacity(3);
    out.push(synthetic(Instruction::with1(Code::Pushq_imm32, low))?);
    if low as i64 as u64 != ret {
        out.push(synthetic(Instruction::with2(
            Code::Mov_rm32_imm32,
            MemoryOperand::with_base_displ(Register::RSP, 4),
            (ret >> 32) as u32,
        ))?);
    }
    let jmp = match call.code() {
        Code::Call_rel32_64 => synthetic(Instruction::with_branch(
            Code::Jmp_rel32_64,
            call.near_branch_target(),
        ))?,
        _ => {
            // call reg / call [mem]: the same operand (and prefixes), as a jump.
            let mut jmp = *call;
            jmp.set_code(Code::Jmp_rm64);
            jmp.set_ip(0);
            jmp
        }
    };
    out.push(jmp);
    Ok(out)
}

/// An instruction for the block encoder, with IP 0. The encoder resolves a branch or
/// `[rip+disp]` target equal to the IP of an instruction in the block to that
/// instruction's *new* address; with every IP 0, each target stays the original
/// absolute address. (Otherwise `lea rdi, [rip-7]` taking the function's own address
/// would hand the program a trampoline address.)
fn synthetic(made: Result<Instruction, iced_x86::IcedError>) -> Result<Instruction, X86Error> {
    let mut insn = made.map_err(|e| X86Error::Encode(e.to_string()))?;
    insn.set_ip(0);
    Ok(insn)
}

/// After an encoder failure: the first `[rip+disp]` operand that cannot reach its
/// address from `new_addr` (give or take the size of the relocated code).
fn out_of_range(insns: &[Instruction], new_addr: u64) -> Option<X86Error> {
    const SLACK: i64 = 256;
    insns
        .iter()
        .filter(|insn| is_rip_relative(insn))
        .find(|insn| {
            let diff = insn.ip_rel_memory_address().wrapping_sub(new_addr) as i64;
            diff < i32::MIN as i64 + SLACK || diff > i32::MAX as i64 - SLACK
        })
        .map(|insn| X86Error::RipRelativeOutOfRange {
            at: insn.ip(),
            insn: decode::insn_text(insn),
            target: insn.ip_rel_memory_address(),
            new_addr,
        })
}
