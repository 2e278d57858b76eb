//! Decoding helpers shared by the planner, the relocator and other crates: instruction
//! lengths, a linear sweep of a function body, its direct branch targets, and an Intel
//! syntax listing.

use iced_x86::{
    Decoder, DecoderOptions, Formatter, Instruction, IntelFormatter, MemorySizeOptions, OpKind,
    Register,
};

/// Decodes one instruction at `addr`, or `None` if the bytes are not a valid 64-bit
/// instruction (including one cut short by the end of `bytes`).
pub(crate) fn decode_one(bytes: &[u8], addr: u64) -> Option<Instruction> {
    let mut decoder = Decoder::with_ip(64, bytes, addr, DecoderOptions::NONE);
    let insn = decoder.decode();
    (!insn.is_invalid()).then_some(insn)
}

/// The result of decoding a byte run from start to end.
pub(crate) struct Sweep {
    /// Every instruction decoded, in address order.
    pub insns: Vec<Instruction>,
    /// The address of the first undecodable byte, if the sweep stopped early.
    pub error_at: Option<u64>,
}

/// Linear sweep: decodes `bytes` (loaded at `addr`) instruction after instruction and
/// stops at the first invalid one.
pub(crate) fn sweep(bytes: &[u8], addr: u64) -> Sweep {
    let mut decoder = Decoder::with_ip(64, bytes, addr, DecoderOptions::NONE);
    let mut insns = Vec::new();
    while decoder.can_decode() {
        let insn = decoder.decode();
        if insn.is_invalid() {
            return Sweep {
                insns,
                error_at: Some(insn.ip()),
            };
        }
        insns.push(insn);
    }
    Sweep {
        insns,
        error_at: None,
    }
}

/// The target of a direct (relative) branch: `jcc`, `jmp`, `call`, `loop*`, `jrcxz`,
/// `xbegin`. `None` for every other instruction, indirect branches included.
pub(crate) fn direct_target(insn: &Instruction) -> Option<u64> {
    (0..insn.op_count())
        .find(|&i| {
            matches!(
                insn.op_kind(i),
                OpKind::NearBranch16 | OpKind::NearBranch32 | OpKind::NearBranch64
            )
        })
        .map(|_| insn.near_branch_target())
}

/// True when `insn` has a `[rip+disp]` memory operand.
pub(crate) fn is_rip_relative(insn: &Instruction) -> bool {
    insn.is_ip_rel_memory_operand() && insn.memory_base() == Register::RIP
}

/// The length of the instruction at the start of `bytes` (loaded at `addr`), or `None`
/// if it is not a valid x86-64 instruction.
///
/// ```
/// // push rbp
/// assert_eq!(weft_x86::decode_len(&[0x55, 0x48, 0x89, 0xe5], 0x1000), Some(1));
/// // (truncated) mov rbp, rsp
/// assert_eq!(weft_x86::decode_len(&[0x48, 0x89], 0x1000), None);
/// ```
pub fn decode_len(bytes: &[u8], addr: u64) -> Option<usize> {
    decode_one(bytes, addr).map(|insn| insn.len())
}

/// Every direct branch target in `func` (linear sweep of the whole body, stopping at
/// the first undecodable byte): `jcc`, `jmp`, `call`, `loop*`, `jrcxz`, `xbegin`.
/// Sorted, without duplicates; targets outside the function (calls, tail calls) are
/// included.
pub fn branch_targets(func: &crate::FunctionCode) -> Vec<u64> {
    let mut targets: Vec<u64> = sweep(&func.bytes, func.addr)
        .insns
        .iter()
        .filter_map(direct_target)
        .collect();
    targets.sort_unstable();
    targets.dedup();
    targets
}

/// The Intel-syntax text of one instruction, as used in listings and reasons:
/// lower case, `0x` hex, memory sizes always shown (`qword ptr`), absolute branch
/// targets and absolute addresses for `[rip+disp]` operands.
pub(crate) fn insn_text(insn: &Instruction) -> String {
    let mut formatter = IntelFormatter::new();
    let options = formatter.options_mut();
    options.set_hex_prefix("0x");
    options.set_hex_suffix("");
    options.set_uppercase_hex(false);
    options.set_space_after_operand_separator(true);
    options.set_show_branch_size(false);
    options.set_branch_leading_zeros(false);
    options.set_rip_relative_addresses(false);
    options.set_memory_size_options(MemorySizeOptions::Always);
    let mut text = String::new();
    formatter.format(insn, &mut text);
    text
}

/// An Intel-syntax listing of `bytes` loaded at `addr`, one instruction a line:
/// address, bytes in hex, instruction, separated by (at least) two spaces. Undecodable bytes are shown one at a time as
/// `(bad)`. `[rip+disp]` operands are shown as the absolute address they reach.
///
/// ```
/// let text = weft_x86::disassemble(&[0x55, 0x48, 0x89, 0xe5], 0x401000);
/// assert_eq!(text, "0x401000  55                    push rbp\n\
///                   0x401001  48 89 e5              mov rbp, rsp\n");
/// ```
pub fn disassemble(bytes: &[u8], addr: u64) -> String {
    let mut out = String::new();
    let mut offset = 0;
    while offset < bytes.len() {
        let at = addr.wrapping_add(offset as u64);
        let (len, text) = match decode_one(&bytes[offset..], at) {
            Some(insn) => (insn.len(), insn_text(&insn)),
            None => (1, "(bad)".to_string()),
        };
        let hex: Vec<String> = bytes[offset..offset + len]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        out.push_str(&format!("{at:#x}  {:<20}  {text}\n", hex.join(" ")));
        offset += len;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::FunctionCode;

    #[test]
    fn decode_len_of_prologue_instructions() {
        // endbr64
        assert_eq!(decode_len(&[0xf3, 0x0f, 0x1e, 0xfa], 0), Some(4));
        // sub rsp, 0x18
        assert_eq!(decode_len(&[0x48, 0x83, 0xec, 0x18], 0), Some(4));
        // mov rax, qword ptr [rip+0x2fe1]
        assert_eq!(
            decode_len(&[0x48, 0x8b, 0x05, 0xe1, 0x2f, 0x00, 0x00, 0xc3], 0),
            Some(7)
        );
        // 0x06 (push es) is invalid in 64-bit mode
        assert_eq!(decode_len(&[0x06], 0), None);
        assert_eq!(decode_len(&[], 0), None);
    }

    #[test]
    fn disassemble_shows_absolute_targets_and_bad_bytes() {
        // lea rdi, [rip+0x10]; je +2; 0x06 (invalid); ret
        let bytes = [
            0x48, 0x8d, 0x3d, 0x10, 0x00, 0x00, 0x00, 0x74, 0x02, 0x06, 0xc3,
        ];
        assert_eq!(
            disassemble(&bytes, 0x1000),
            "0x1000  48 8d 3d 10 00 00 00  lea rdi, [0x1017]\n\
             0x1007  74 02                 je 0x100b\n\
             0x1009  06                    (bad)\n\
             0x100a  c3                    ret\n"
        );
    }

    #[test]
    fn branch_targets_lists_direct_branches_sorted_once() {
        // 0x1000: test edi, edi
        // 0x1002: je 0x100c
        // 0x1004: call 0x2000
        // 0x1009: jmp 0x100c      (duplicate target)
        // 0x100b: nop
        // 0x100c: jmp rax         (indirect: no target)
        // 0x100e: loop 0x1000
        let bytes = [
            0x85, 0xff, 0x74, 0x08, 0xe8, 0xf7, 0x0f, 0x00, 0x00, 0xeb, 0x01, 0x90, 0xff, 0xe0,
            0xe2, 0xf0,
        ];
        let func = FunctionCode {
            addr: 0x1000,
            bytes: bytes.to_vec(),
            size_known: true,
            padding: Vec::new(),
        };
        assert_eq!(branch_targets(&func), vec![0x1000, 0x100c, 0x2000]);
    }
}
