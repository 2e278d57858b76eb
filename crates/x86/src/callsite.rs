//! Call sites (`call:` probes, Arachne's strategy): the direct branches to a function
//! found in other functions' code. Each is rewritten into the same instruction with
//! another `rel32` — a `call` to a per-site stub instead of the callee — so the patch
//! covers exactly one instruction, nothing is relocated and no branch target can land
//! inside it.
//!
//! Besides `call rel32`, a tail call (`jmp rel32`, and GCC's conditional tail call
//! `jcc rel32`) to the function is a call site: when it branches, the stack is exactly
//! what the callee's entry sees, as after a `call` to a stub, so the same stub serves.
//! Short forms (`jmp`/`jcc rel8`) cannot reach a stub; indirect calls (`call rax`,
//! `call [rip+GOT]` under `-fno-plt`) have no target to rewrite. Both are counted, not
//! woven.
//!
//! ```text
//! site:  call FUNC        →  call stub            (same 5 bytes but the rel32)
//! stub:  <entry trampoline head: advice>
//!        jmp FUNC                                 (FUNC returns to the site's next
//!                                                  instruction, as before)
//! ```

use iced_x86::{FlowControl, Instruction, OpKind};

use crate::decode::{self, is_rip_relative};
use crate::{FunctionCode, X86Error};

/// How a call site branches to the callee.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CallKind {
    /// `call rel32`.
    Call,
    /// `jmp rel32`: a tail call.
    TailJump,
    /// `jcc rel32`: a conditional tail call.
    CondTailJump,
}

/// One rewritable call site.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CallSite {
    /// Address of the branch instruction.
    pub addr: u64,
    /// The instruction's bytes (what unweave writes back); its last four are the
    /// `rel32`.
    pub bytes: Vec<u8>,
    pub kind: CallKind,
    /// Where it branches: the callee, or its PLT entry.
    pub target: u64,
}

/// What an indirect call's `[rip+disp]` operand reads, as the caller of [`scan_calls`]
/// knows it from the relocations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Slot {
    /// The callee's own GOT slot: the call certainly reaches it.
    Callee,
    /// The GOT slot of another function: the call never reaches the callee.
    Other,
    /// Anything else: it may.
    Unknown,
}

/// The call sites of one function, and what reaches the callee without being one.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CallScan {
    pub sites: Vec<CallSite>,
    /// Indirect calls that may reach the callee (`call reg`, `call [mem]`, except
    /// through another function's GOT slot), and tail jumps through its GOT slot.
    pub indirect: usize,
    /// `jmp rel8`/`jcc rel8` tail calls to the callee: too short to reach a stub.
    pub short: usize,
    /// The first byte that did not decode: the scan stopped there.
    pub error_at: Option<u64>,
}

impl CallScan {
    /// Adds another function's scan to this one.
    pub fn merge(&mut self, other: CallScan) {
        self.sites.extend(other.sites);
        self.indirect += other.indirect;
        self.short += other.short;
        self.error_at = self.error_at.or(other.error_at);
    }
}

/// Finds the branches in `func` whose target `is_callee` accepts (linear sweep of the
/// body, stopping at the first undecodable byte), and counts the calls to the callee
/// that cannot be rewritten. `slot` tells what a `[rip+disp]` operand of an indirect
/// call or jump reads (see [`Slot`]).
pub fn scan_calls(
    func: &FunctionCode,
    is_callee: impl Fn(u64) -> bool,
    slot: impl Fn(u64) -> Slot,
) -> CallScan {
    let sweep = decode::sweep(&func.bytes, func.addr);
    let mut out = CallScan {
        error_at: sweep.error_at,
        ..CallScan::default()
    };
    for insn in &sweep.insns {
        let flow = insn.flow_control();
        let direct = matches!(
            insn.op0_kind(),
            OpKind::NearBranch16 | OpKind::NearBranch32 | OpKind::NearBranch64
        );
        if direct {
            let target = insn.near_branch_target();
            if !is_callee(target) {
                continue;
            }
            let kind = match flow {
                FlowControl::Call => Some(CallKind::Call),
                FlowControl::UnconditionalBranch => Some(CallKind::TailJump),
                FlowControl::ConditionalBranch => Some(CallKind::CondTailJump),
                _ => None,
            };
            match kind {
                Some(kind) if has_rel32(insn) => {
                    let start = (insn.ip() - func.addr) as usize;
                    out.sites.push(CallSite {
                        addr: insn.ip(),
                        bytes: func.bytes[start..start + insn.len()].to_vec(),
                        kind,
                        target,
                    });
                }
                _ => out.short += 1,
            }
            continue;
        }
        let through = || {
            if insn.op0_kind() == OpKind::Memory && is_rip_relative(insn) {
                slot(insn.ip_rel_memory_address())
            } else {
                Slot::Unknown
            }
        };
        match flow {
            FlowControl::IndirectCall if through() != Slot::Other => out.indirect += 1,
            // A jump through a register or a table is a switch, not a call; through
            // the callee's GOT slot it is a `-fno-plt` tail call.
            FlowControl::IndirectBranch if through() == Slot::Callee => out.indirect += 1,
            _ => {}
        }
    }
    out
}

/// A near branch whose displacement is 32 bits (the last four bytes).
fn has_rel32(insn: &Instruction) -> bool {
    insn.is_call_near() || insn.is_jmp_near() || insn.is_jcc_near()
}

/// The bytes that make `site` branch to `to` instead: the same instruction, its
/// `rel32` changed.
///
/// # Errors
///
/// [`X86Error::OutOfRange`] when `to` is not within ±2 GiB of the instruction's end.
pub fn retarget(site: &CallSite, to: u64) -> Result<Vec<u8>, X86Error> {
    let n = site.bytes.len();
    let end = site.addr + n as u64;
    let diff = i128::from(to) - i128::from(end);
    let rel = i32::try_from(diff).map_err(|_| X86Error::OutOfRange {
        from: site.addr,
        to,
    })?;
    let mut bytes = site.bytes.clone();
    bytes[n - 4..].copy_from_slice(&rel.to_le_bytes());
    Ok(bytes)
}

/// The original branch of `site` re-encoded to run at `at`, for a thread that meets
/// the transient `int3` while the site is being rewritten: a `call` is emulated (the
/// callee returns to the site's next instruction), a `jcc` is followed by a jump back.
///
/// # Errors
///
/// [`X86Error::Encode`] when the bytes are not the branch they were, or the callee
/// is out of reach of `at`.
pub fn resume_code(site: &CallSite, at: u64) -> Result<Vec<u8>, X86Error> {
    let insn = decode::decode_one(&site.bytes, site.addr)
        .filter(|i| i.len() == site.bytes.len())
        .ok_or_else(|| X86Error::Encode(format!("no branch at {:#x}", site.addr)))?;
    crate::relocate::relocate_insns(&[insn], at, true)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn code(addr: u64, bytes: &[u8]) -> FunctionCode {
        FunctionCode {
            addr,
            bytes: bytes.to_vec(),
            size_known: true,
            padding: Vec::new(),
        }
    }

    #[test]
    fn finds_calls_tail_jumps_and_counts_what_it_cannot_weave() {
        // 0x1000: call 0x2000          e8 fb 0f 00 00
        // 0x1005: call 0x3000          e8 f6 1f 00 00     (another function)
        // 0x100a: call rax             ff d0
        // 0x100c: call [rip+0x100]     ff 15 00 01 00 00  (0x1112: callee's slot)
        // 0x1012: call [rip+0x200]     ff 15 00 02 00 00  (0x1218: another's slot)
        // 0x1018: je 0x2000            0f 84 e2 0f 00 00
        // 0x101e: jmp rax              ff e0              (a switch: not counted)
        // 0x1020: jmp 0x2000           e9 db 0f 00 00
        let bytes = [
            0xe8, 0xfb, 0x0f, 0x00, 0x00, 0xe8, 0xf6, 0x1f, 0x00, 0x00, 0xff, 0xd0, 0xff, 0x15,
            0x00, 0x01, 0x00, 0x00, 0xff, 0x15, 0x00, 0x02, 0x00, 0x00, 0x0f, 0x84, 0xe2, 0x0f,
            0x00, 0x00, 0xff, 0xe0, 0xe9, 0xdb, 0x0f, 0x00, 0x00,
        ];
        let scan = scan_calls(
            &code(0x1000, &bytes),
            |t| t == 0x2000,
            |m| match m {
                0x1112 => Slot::Callee,
                0x1218 => Slot::Other,
                _ => Slot::Unknown,
            },
        );
        let got: Vec<(u64, CallKind)> = scan.sites.iter().map(|s| (s.addr, s.kind)).collect();
        assert_eq!(
            got,
            vec![
                (0x1000, CallKind::Call),
                (0x1018, CallKind::CondTailJump),
                (0x1020, CallKind::TailJump)
            ]
        );
        assert_eq!(scan.sites[0].bytes, vec![0xe8, 0xfb, 0x0f, 0x00, 0x00]);
        assert!(scan.sites.iter().all(|s| s.target == 0x2000));
        // call rax and the call through the callee's slot.
        assert_eq!(scan.indirect, 2);
        assert_eq!(scan.short, 0);
        assert_eq!(scan.error_at, None);
    }

    #[test]
    fn short_tail_jumps_are_counted_not_woven() {
        // 0x1000: jmp 0x1010 (rel8)  eb 0e;  0x1002: jne 0x1010 (rel8)  75 0c
        let scan = scan_calls(
            &code(0x1000, &[0xeb, 0x0e, 0x75, 0x0c]),
            |t| t == 0x1010,
            |_| Slot::Unknown,
        );
        assert!(scan.sites.is_empty());
        assert_eq!(scan.short, 2);
    }

    #[test]
    fn a_tail_jump_through_the_callee_slot_is_counted() {
        // 0x1000: jmp [rip+0x10]  ff 25 10 00 00 00  (0x1016: the callee's slot)
        let scan = scan_calls(
            &code(0x1000, &[0xff, 0x25, 0x10, 0x00, 0x00, 0x00]),
            |_| false,
            |m| {
                if m == 0x1016 {
                    Slot::Callee
                } else {
                    Slot::Unknown
                }
            },
        );
        assert_eq!(scan.indirect, 1);
    }

    #[test]
    fn retarget_changes_only_the_rel32() {
        let call = CallSite {
            addr: 0x1000,
            bytes: vec![0xe8, 0xfb, 0x0f, 0x00, 0x00],
            kind: CallKind::Call,
            target: 0x2000,
        };
        // call 0x7000_0000: rel32 = 0x7000_0000 - 0x1005
        assert_eq!(
            retarget(&call, 0x7000_0000).unwrap(),
            vec![0xe8, 0xfb, 0xef, 0xff, 0x6f]
        );
        // je 0x900 from 0x1018: rel32 = 0x900 - 0x101e = -0x71e
        let jcc = CallSite {
            addr: 0x1018,
            bytes: vec![0x0f, 0x84, 0xe2, 0x0f, 0x00, 0x00],
            kind: CallKind::CondTailJump,
            target: 0x2000,
        };
        assert_eq!(
            retarget(&jcc, 0x900).unwrap(),
            vec![0x0f, 0x84, 0xe2, 0xf8, 0xff, 0xff]
        );
        assert!(matches!(
            retarget(&call, 0x1_0000_1005),
            Err(X86Error::OutOfRange { .. })
        ));
    }

    #[test]
    fn resume_code_emulates_the_original_branch() {
        let call = CallSite {
            addr: 0x40_1000,
            bytes: vec![0xe8, 0xfb, 0x0f, 0x00, 0x00],
            kind: CallKind::Call,
            target: 0x40_2000,
        };
        // push 0x401005; jmp 0x402000 (from 0x40_8005: rel32 = -0x6005)
        assert_eq!(
            resume_code(&call, 0x40_8000).unwrap(),
            vec![0x68, 0x05, 0x10, 0x40, 0x00, 0xe9, 0xf6, 0x9f, 0xff, 0xff]
        );
        let jmp = CallSite {
            addr: 0x40_1000,
            bytes: vec![0xe9, 0xfb, 0x0f, 0x00, 0x00],
            kind: CallKind::TailJump,
            target: 0x40_2000,
        };
        // jmp 0x402000 (from 0x40_8000: rel32 = -0x6005)
        assert_eq!(
            resume_code(&jmp, 0x40_8000).unwrap(),
            vec![0xe9, 0xfb, 0x9f, 0xff, 0xff]
        );
        let jcc = CallSite {
            addr: 0x40_1000,
            bytes: vec![0x0f, 0x84, 0xfa, 0x0f, 0x00, 0x00],
            kind: CallKind::CondTailJump,
            target: 0x40_2000,
        };
        // je 0x402000; jmp 0x401006
        assert_eq!(
            resume_code(&jcc, 0x40_8000).unwrap(),
            vec![0x0f, 0x84, 0xfa, 0x9f, 0xff, 0xff, 0xe9, 0xfb, 0x8f, 0xff, 0xff]
        );
    }
}
