//! Access sites (data pointcuts by instruction rewriting, Arachne's
//! readGlobal/writeGlobal): the instructions of a function whose memory operand
//! names a fixed address (`[rip+disp]`, or an absolute address with no base and no
//! index register) overlapping a watched range, and the code around the relocated
//! access in its trampoline.
//!
//! An access site's trampoline, at `T` (the patch is the usual `jmp rel32` over the
//! one access instruction, which is at least 6 bytes):
//!
//! ```text
//! T:  lea rsp,[rsp-128]        ; the red zone is live inside a function
//!     push rax
//!     mov rax,[moffs VAR]      ; old (zero-extended: movzx eax,al|ax; 4 bytes: mov eax)
//!     push rax
//!     mov rax,[rsp+8]
//!     <the access, relocated>
//!     push rax
//!     mov rax,[moffs VAR]      ; new
//!     push rax
//!     mov rax,[rsp+8]
//!     <the data head: [rsp] = new, [rsp+16] = old, the site's rsp at rsp+160>
//!     lea rsp,[rsp+160]
//!     jmp back                 ; the instruction after the access
//! ```
//!
//! None of these instructions touches the flags (the access's own flags survive).
//! The access runs with `rsp` 144 bytes lower, so one that uses `rsp` (explicitly
//! or by pushing and popping) is not rewritten, nor is a branch through memory.

use iced_x86::{FlowControl, InstructionInfoFactory, OpAccess, Register};

use crate::decode::{self, is_rip_relative};
use crate::plan::FunctionCode;
use crate::X86Error;

/// How an instruction uses the watched bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AccessKind {
    Read,
    Write,
    /// A read-modify-write (`add [x], 1`, `xchg`, `cmpxchg`).
    ReadWrite,
}

impl AccessKind {
    /// As `-v` says it.
    pub fn name(self) -> &'static str {
        match self {
            AccessKind::Read => "read",
            AccessKind::Write => "write",
            AccessKind::ReadWrite => "read-write",
        }
    }

    pub fn writes(self) -> bool {
        self != AccessKind::Read
    }

    pub fn reads(self) -> bool {
        self != AccessKind::Write
    }
}

/// One instruction that names watched bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Access {
    pub addr: u64,
    pub len: usize,
    pub kind: AccessKind,
    /// Intel syntax, for `-v`.
    pub text: String,
    /// Why it cannot be rewritten (`None`: it can).
    pub refused: Option<String>,
}

/// What [`scan_accesses`] found in one function.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AccessScan {
    pub accesses: Vec<Access>,
    /// Instructions that take an address inside the range (`lea`): accesses through
    /// the pointer they make are not seen.
    pub address_taken: usize,
    /// Accesses with an index register on a fixed base (`[arr+rax*4]` in non-PIE
    /// code): which element they touch is known only when they run; not rewritten.
    pub indexed: usize,
}

/// The instructions of `code` whose fixed-address memory operand overlaps
/// `lo..hi` (addresses in `code.addr`'s space). A function that does not decode to
/// its end is scanned as far as it does.
pub fn scan_accesses(code: &FunctionCode, lo: u64, hi: u64) -> AccessScan {
    let sweep = decode::sweep(&code.bytes, code.addr);
    let mut info = InstructionInfoFactory::new();
    let mut out = AccessScan::default();
    let overlaps = |a: u64, n: u64| a < hi && lo < a.wrapping_add(n.max(1));
    for insn in &sweep.insns {
        let fixed = if is_rip_relative(insn) {
            Some(insn.ip_rel_memory_address())
        } else if (0..insn.op_count()).any(|i| insn.op_kind(i) == iced_x86::OpKind::Memory)
            && insn.memory_base() == Register::None
            && insn.segment_prefix() == Register::None
        {
            Some(insn.memory_displacement64())
        } else {
            None
        };
        let Some(at) = fixed else {
            continue;
        };
        let i = info.info(insn);
        let mut kind: Option<AccessKind> = None;
        let mut touches = false;
        for m in i.used_memory() {
            let size = m.memory_size().size() as u64;
            if !overlaps(at, size) {
                continue;
            }
            touches = true;
            let k = match m.access() {
                OpAccess::Read | OpAccess::CondRead => AccessKind::Read,
                OpAccess::Write | OpAccess::CondWrite => AccessKind::Write,
                OpAccess::ReadWrite | OpAccess::ReadCondWrite => AccessKind::ReadWrite,
                _ => continue,
            };
            kind = Some(match kind {
                None => k,
                Some(prev) if prev == k => k,
                Some(_) => AccessKind::ReadWrite,
            });
        }
        if insn.memory_index() != Register::None {
            if touches || overlaps(at, 1) {
                out.indexed += 1;
            }
            continue;
        }
        let Some(kind) = kind else {
            // `lea` (no memory access) taking the address.
            if touches || overlaps(at, 1) {
                out.address_taken += 1;
            }
            continue;
        };
        let uses_rsp = i
            .used_registers()
            .iter()
            .any(|r| r.register().full_register() == Register::RSP)
            || insn.stack_pointer_increment() != 0;
        let refused = if insn.flow_control() != FlowControl::Next {
            Some("a branch through the variable".to_string())
        } else if uses_rsp {
            Some("it uses rsp, which its trampoline moves".to_string())
        } else if insn.len() < crate::JUMP_LEN {
            Some(format!(
                "{} bytes, a jump needs {}",
                insn.len(),
                crate::JUMP_LEN
            ))
        } else {
            None
        };
        out.accesses.push(Access {
            addr: insn.ip(),
            len: insn.len(),
            kind,
            text: decode::insn_text(insn),
            refused,
        });
    }
    out
}

/// `mov rax|eax|ax|al,[moffs64 var]`, zero-extended to rax: the first 8 bytes of a
/// value of `size` bytes (a smaller power of two for sizes below 8).
fn load(var: u64, size: u32) -> Vec<u8> {
    let mut b = Vec::with_capacity(13);
    match size {
        s if s >= 8 => b.extend_from_slice(&[0x48, 0xa1]),
        4..=7 => b.push(0xa1),
        2 | 3 => b.extend_from_slice(&[0x66, 0xa1]),
        _ => b.push(0xa0),
    }
    b.extend_from_slice(&var.to_le_bytes());
    match size {
        2 | 3 => b.extend_from_slice(&[0x0f, 0xb7, 0xc0]), // movzx eax,ax
        0 | 1 => b.extend_from_slice(&[0x0f, 0xb6, 0xc0]), // movzx eax,al
        _ => {}
    }
    b
}

const LEA_RSP_MINUS_128: [u8; 5] = [0x48, 0x8d, 0x64, 0x24, 0x80];
const PUSH_RAX: u8 = 0x50;
const MOV_RAX_RSP_8: [u8; 5] = [0x48, 0x8b, 0x44, 0x24, 0x08];
/// `lea rsp,[rsp+160]`.
const LEA_RSP_PLUS_160: [u8; 8] = [0x48, 0x8d, 0xa4, 0x24, 0xa0, 0, 0, 0];

/// Bytes the trampoline keeps below the site's `rsp` while its head runs: the red
/// zone, the saved `rax` twice, `old` and `new` (the data head's `regs.rsp` is its
/// saved-flags pointer plus 16 plus this).
pub const ACCESS_STACK: u32 = 128 + 32;

/// What comes before the relocated access: the red zone skipped, `old` pushed.
pub fn access_prologue(var: u64, size: u32) -> Vec<u8> {
    let mut b = LEA_RSP_MINUS_128.to_vec();
    b.push(PUSH_RAX);
    b.extend(load(var, size));
    b.push(PUSH_RAX);
    b.extend_from_slice(&MOV_RAX_RSP_8);
    b
}

/// What comes after the relocated access, before the data head: `rax` as the
/// access left it and `new` pushed.
pub fn access_middle(var: u64, size: u32) -> Vec<u8> {
    let mut b = vec![PUSH_RAX];
    b.extend(load(var, size));
    b.push(PUSH_RAX);
    b.extend_from_slice(&MOV_RAX_RSP_8);
    b
}

/// After the data head (at `at`): the stack back to the site's and a jump to
/// `back`, the instruction after the access.
pub fn access_epilogue(at: u64, back: u64) -> Result<Vec<u8>, X86Error> {
    let mut b = LEA_RSP_PLUS_160.to_vec();
    b.extend_from_slice(&crate::jmp_rel32(at + b.len() as u64, back)?);
    Ok(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn func(addr: u64, bytes: &[u8]) -> FunctionCode {
        FunctionCode {
            addr,
            bytes: bytes.to_vec(),
            size_known: true,
            padding: vec![],
        }
    }

    #[test]
    fn finds_rip_relative_reads_writes_and_rmw() {
        // 0x1000: mov eax,[rip+0xffa]   (0x2000, 4 bytes)   read
        // 0x1006: mov [rip+0xff4],eax   (0x2000)            write
        // 0x100c: add dword [rip+0xfed],1 (0x2000)          rmw
        // 0x1013: mov eax,[rip+0xfeb]   (0x2004)            other bytes
        // 0x1019: lea rax,[rip+0xfe0]   (0x2000)            address taken
        // 0x1020: ret
        let bytes = [
            0x8b, 0x05, 0xfa, 0x0f, 0x00, 0x00, // mov eax,[rip+0xffa]
            0x89, 0x05, 0xf4, 0x0f, 0x00, 0x00, // mov [rip+0xff4],eax
            0x83, 0x05, 0xed, 0x0f, 0x00, 0x00, 0x01, // add dword [rip+0xfed],1
            0x8b, 0x05, 0xeb, 0x0f, 0x00, 0x00, // mov eax,[rip+0xfeb]
            0x48, 0x8d, 0x05, 0xe0, 0x0f, 0x00, 0x00, // lea rax,[rip+0xfe0]
            0xc3,
        ];
        let s = scan_accesses(&func(0x1000, &bytes), 0x2000, 0x2004);
        let got: Vec<_> = s.accesses.iter().map(|a| (a.addr, a.kind)).collect();
        assert_eq!(
            got,
            [
                (0x1000, AccessKind::Read),
                (0x1006, AccessKind::Write),
                (0x100c, AccessKind::ReadWrite)
            ]
        );
        assert!(s.accesses.iter().all(|a| a.refused.is_none()));
        assert_eq!(s.address_taken, 1);
    }

    #[test]
    fn a_neighbour_is_not_an_access() {
        // mov qword [rip+0xff9],rax at 0x1000 writes 0x2000..0x2008; watch 0x2008..0x2010.
        let bytes = [0x48, 0x89, 0x05, 0xf9, 0x0f, 0x00, 0x00, 0xc3];
        let s = scan_accesses(&func(0x1000, &bytes), 0x2008, 0x2010);
        assert!(s.accesses.is_empty());
        let s = scan_accesses(&func(0x1000, &bytes), 0x2007, 0x2008);
        assert_eq!(s.accesses.len(), 1);
    }

    #[test]
    fn push_from_memory_and_branches_are_refused() {
        // push qword [rip+0xffa] (0x2000); call qword [rip+0xff4] (0x2000)
        let bytes = [
            0xff, 0x35, 0xfa, 0x0f, 0x00, 0x00, 0xff, 0x15, 0xf4, 0x0f, 0x00, 0x00, 0xc3,
        ];
        let s = scan_accesses(&func(0x1000, &bytes), 0x2000, 0x2008);
        assert_eq!(s.accesses.len(), 2);
        assert!(s.accesses.iter().all(|a| a.refused.is_some()), "{s:?}");
    }

    #[test]
    fn prologue_and_middle_bytes() {
        assert_eq!(
            access_prologue(0x1122_3344_5566_7788, 8),
            [
                0x48, 0x8d, 0x64, 0x24, 0x80, 0x50, 0x48, 0xa1, 0x88, 0x77, 0x66, 0x55, 0x44, 0x33,
                0x22, 0x11, 0x50, 0x48, 0x8b, 0x44, 0x24, 0x08
            ]
        );
        assert_eq!(
            access_middle(0x10, 1),
            [
                0x50, 0xa0, 0x10, 0, 0, 0, 0, 0, 0, 0, 0x0f, 0xb6, 0xc0, 0x50, 0x48, 0x8b, 0x44,
                0x24, 0x08
            ]
        );
        let e = access_epilogue(0x1000, 0x2000).unwrap();
        assert_eq!(&e[..8], &LEA_RSP_PLUS_160);
        assert_eq!(e[8], 0xe9);
    }
}
