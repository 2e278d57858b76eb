//! Site planning: decide how a site is patched — a 5-byte `jmp rel32`, a 1-byte `int3`,
//! or not at all — and say why.
//!
//! The checks, in the order they are made (the first that fails gives the reason):
//!
//! 1. The site lies inside the function, on an instruction boundary of a linear sweep
//!    from the function start, and the instruction there decodes. An `endbr64` at the
//!    function start is stepped over: the patch point is the instruction after it.
//! 2. That first instruction can run out of line (see [`crate::relocate`]); otherwise
//!    the site is [`SitePlan::Refused`]. Every later failure degrades to
//!    [`SitePlan::Int3`], which displaces only this instruction.
//! 3. The function's size is known ([`Reason::SizeUnknown`]), at least 5 bytes remain
//!    from the patch point to its end ([`Reason::TooShort`]), and the whole body decodes
//!    ([`Reason::DecodeError`]).
//! 4. The instructions covering the 5 bytes: none but the last ends control flow
//!    ([`Reason::FlowEndsInPatch`]), none but the last is a `call`
//!    ([`Reason::CallNotLast`]), each can run out of line ([`Reason::Unrelocatable`]).
//! 5. No direct branch in the body targets, and no `[rip+disp]` operand addresses, a
//!    byte strictly inside the displaced bytes ([`Reason::BranchIntoPatch`],
//!    [`Reason::AddressTakenInPatch`]). Branching to the patch point itself is fine:
//!    it now holds the jump.
//!
//! What the planner cannot see (documented limits): branches from *other* symbols into
//! the patch (e.g. gcc's `foo.cold` parts, which only ever return to the middle of
//! `foo`), and indirect jumps whose targets live in data (jump tables; their targets
//! are case labels, not the entry).

use std::fmt;

use iced_x86::{Code, FlowControl, Instruction, Mnemonic, OpKind, Register};

use crate::decode::{self, direct_target, is_rip_relative};
use crate::relocate;

/// The bytes of `endbr64`, which the CPU requires at indirect-branch targets under
/// CET; a patch never replaces it.
pub const ENDBR64: [u8; 4] = [0xf3, 0x0f, 0x1e, 0xfa];

/// A `jmp rel32` is this long; a jump site displaces at least this many bytes.
pub const JUMP_LEN: usize = 5;

/// One function's machine code, as it is in the ELF file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FunctionCode {
    /// Address of the first byte (link-time or run-time; every address in a plan is in
    /// the same space).
    pub addr: u64,
    /// The whole function body.
    pub bytes: Vec<u8>,
    /// False when the symbol had no size and `bytes` is only a guess at the extent;
    /// such functions are never jump-patched.
    pub size_known: bool,
    /// The file's bytes after the function up to the next function (alignment
    /// padding, at most a few dozen bytes); empty when unknown. A jump may extend into
    /// them when the function is too short for one: see [`plan_site`].
    pub padding: Vec<u8>,
}

impl FunctionCode {
    /// One past the last byte.
    pub fn end(&self) -> u64 {
        self.addr.wrapping_add(self.bytes.len() as u64)
    }
}

/// How a site is patched.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SitePlan {
    /// Overwrite `displaced_len` bytes at `patch_addr` with `jmp rel32` to a trampoline
    /// (padded with `int3`); the trampoline runs the displaced instructions relocated.
    Jump {
        patch_addr: u64,
        displaced_len: usize,
        /// The original bytes at `patch_addr..patch_addr + displaced_len`.
        displaced: Vec<u8>,
        /// How many of the last displaced bytes are alignment padding after the
        /// function (never executed; overwritten, not relocated).
        padding: usize,
        /// The site was a function start with `endbr64`; `patch_addr` is after it.
        skipped_endbr: bool,
    },
    /// Overwrite the first byte of the instruction at `patch_addr` with `int3`; after
    /// the advice, the thread resumes at a relocated copy of that one instruction.
    Int3 {
        patch_addr: u64,
        insn_len: usize,
        /// The original bytes of that instruction.
        displaced: Vec<u8>,
        skipped_endbr: bool,
        /// Why a jump could not be used.
        reason: Reason,
    },
    /// The site cannot be patched at all.
    Refused { reason: Reason },
}

impl SitePlan {
    /// The address the patch is written at; `None` when refused.
    pub fn patch_addr(&self) -> Option<u64> {
        match self {
            SitePlan::Jump { patch_addr, .. } | SitePlan::Int3 { patch_addr, .. } => {
                Some(*patch_addr)
            }
            SitePlan::Refused { .. } => None,
        }
    }

    /// Why the site is not a jump site; `None` for a jump site.
    pub fn reason(&self) -> Option<&Reason> {
        match self {
            SitePlan::Jump { .. } => None,
            SitePlan::Int3 { reason, .. } | SitePlan::Refused { reason } => Some(reason),
        }
    }

    /// The original bytes that [`crate::patch_bytes`] replaces (what unweave writes
    /// back): all displaced bytes for a jump, the first byte for an int3, nothing when
    /// refused.
    pub fn original_bytes(&self) -> &[u8] {
        match self {
            SitePlan::Jump { displaced, .. } => displaced,
            SitePlan::Int3 { displaced, .. } => &displaced[..1],
            SitePlan::Refused { .. } => &[],
        }
    }

    /// A jump whose displaced instructions are all NOPs: a compiler or hand-placed
    /// placeholder (`-fpatchable-function-entry`, fentry, coldpatch, USDT), so
    /// nothing of the program's own code moves.
    pub fn is_placeholder(&self) -> bool {
        match self {
            SitePlan::Jump {
                patch_addr,
                displaced,
                padding,
                ..
            } => {
                let code = &displaced[..displaced.len() - padding];
                let sweep = decode::sweep(code, *patch_addr);
                sweep.error_at.is_none()
                    && !sweep.insns.is_empty()
                    && sweep.insns.iter().all(|i| i.mnemonic() == Mnemonic::Nop)
            }
            _ => false,
        }
    }

    /// The patch replaces exactly one instruction (an int3 site; a jump over one
    /// instruction of at least 5 bytes, such as a 5-byte NOP placeholder, the
    /// alignment padding after it aside). No thread can then be in the middle of
    /// the replaced bytes, so the patch can be written while the process runs, with
    /// the int3-first sequence, instead of with every thread stopped.
    pub fn single_instruction(&self) -> bool {
        match self {
            SitePlan::Jump {
                patch_addr,
                displaced,
                padding,
                ..
            } => {
                let code = &displaced[..displaced.len() - padding];
                let sweep = decode::sweep(code, *patch_addr);
                sweep.error_at.is_none() && sweep.insns.len() == 1
            }
            SitePlan::Int3 { .. } => true,
            SitePlan::Refused { .. } => false,
        }
    }

    /// The int3 plan for the same site, for when a jump plan cannot be used after all
    /// (e.g. no trampoline could be placed within ±2 GiB). Int3 and refused plans are
    /// returned unchanged.
    pub fn to_int3(&self, reason: Reason) -> SitePlan {
        match self {
            SitePlan::Jump {
                patch_addr,
                displaced,
                skipped_endbr,
                ..
            } => {
                // The plan was built from a decoded instruction, so this cannot fail.
                // (With padding, the first instruction still lies in the function.)
                let first = decode::decode_one(displaced, *patch_addr)
                    .map_or(displaced.len(), |insn| insn.len());
                SitePlan::Int3 {
                    patch_addr: *patch_addr,
                    insn_len: first,
                    displaced: displaced[..first].to_vec(),
                    skipped_endbr: *skipped_endbr,
                    reason,
                }
            }
            other => other.clone(),
        }
    }
}

/// Why a site is not a jump site (for [`SitePlan::Int3`]) or not patched at all (for
/// [`SitePlan::Refused`]). `Display` gives one user-facing line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reason {
    /// The site address is not inside the function.
    OutsideFunction { site: u64 },
    /// The site address is in the middle of an instruction.
    NotInstructionBoundary { site: u64 },
    /// The bytes at `at` are not a valid instruction.
    DecodeError { at: u64 },
    /// The symbol has no size, so branches into the patch cannot be ruled out.
    SizeUnknown,
    /// Only `len` bytes from the patch point to the end of the function.
    TooShort { len: usize },
    /// A direct branch at `from` targets `to`, inside the bytes a jump would replace.
    BranchIntoPatch { from: u64, to: u64 },
    /// Another probe site at `at` lies inside the bytes a jump would replace.
    SiteInPatch { at: u64 },
    /// A `[rip+disp]` operand at `from` addresses `to`, inside the bytes a jump would
    /// replace (a computed-goto label, say).
    AddressTakenInPatch { from: u64, to: u64 },
    /// A `call` at `at` is followed by other instructions a jump would displace; its
    /// callee would return into the trampoline.
    CallNotLast { at: u64 },
    /// The instruction at `at` (`insn`) never falls through, yet a jump would need the
    /// bytes after it.
    FlowEndsInPatch { at: u64, insn: String },
    /// The instruction at `at` (`insn`) cannot run at another address.
    Unrelocatable { at: u64, insn: String, why: String },
    /// The caller could not place a trampoline within ±2 GiB of the site.
    NoTrampolineInRange,
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reason::OutsideFunction { site } => {
                write!(f, "address {site:#x} is outside the function")
            }
            Reason::NotInstructionBoundary { site } => {
                write!(f, "address {site:#x} is in the middle of an instruction")
            }
            Reason::DecodeError { at } => write!(f, "cannot decode the instruction at {at:#x}"),
            Reason::SizeUnknown => {
                write!(f, "function size unknown, cannot rule out branches into a jump patch")
            }
            Reason::TooShort { len } => write!(
                f,
                "only {len} byte(s) from the patch point to the function end, a jump needs {JUMP_LEN}"
            ),
            Reason::SiteInPatch { at } => write!(
                f,
                "another probe site at {at:#x} lies inside the bytes a jump would replace"
            ),
            Reason::BranchIntoPatch { from, to } => write!(
                f,
                "branch at {from:#x} targets {to:#x}, inside the bytes a jump would replace"
            ),
            Reason::AddressTakenInPatch { from, to } => write!(
                f,
                "instruction at {from:#x} takes the address {to:#x}, inside the bytes a jump would replace"
            ),
            Reason::CallNotLast { at } => write!(
                f,
                "call at {at:#x} is not the last instruction a jump would displace"
            ),
            Reason::FlowEndsInPatch { at, insn } => write!(
                f,
                "`{insn}` at {at:#x} does not fall through, and a jump needs the bytes after it"
            ),
            Reason::Unrelocatable { at, insn, why } => {
                write!(f, "`{insn}` at {at:#x} cannot run out of line: {why}")
            }
            Reason::NoTrampolineInRange => {
                write!(f, "no trampoline could be placed within 2 GiB of the site")
            }
        }
    }
}

/// Plans the patch for `site_addr`, an address inside `func` (usually `func.addr`).
/// See the module documentation for the rules.
pub fn plan_site(func: &FunctionCode, site_addr: u64) -> SitePlan {
    plan_site_among(func, site_addr, &[])
}

/// The addresses of `sorted` (in increasing order) in `lo..hi`: a binary search, so
/// that weaving N sites, each checked against every other, costs N log N.
pub fn in_range(sorted: &[u64], lo: u64, hi: u64) -> &[u64] {
    let a = sorted.partition_point(|&x| x < lo);
    let b = sorted.partition_point(|&x| x < hi).max(a);
    &sorted[a..b]
}

/// [`plan_site`] for a site with other sites near it (`others`: their addresses in
/// increasing order, this one's may be among them): a jump whose displaced bytes
/// would cover another site (USDT probes one NOP apart) would overwrite that site's
/// instruction, so the site takes an `int3` instead.
pub fn plan_site_among(func: &FunctionCode, site_addr: u64, others: &[u64]) -> SitePlan {
    let plan = plan_site_alone(func, site_addr);
    if let SitePlan::Jump {
        patch_addr,
        displaced_len,
        skipped_endbr,
        ref displaced,
        ..
    } = plan
    {
        let end = patch_addr + displaced_len as u64;
        if let Some(&at) = in_range(others, patch_addr + 1, end).first() {
            let offset = (patch_addr - func.addr) as usize;
            if let Some(first) = decode::decode_one(&func.bytes[offset..], patch_addr) {
                return SitePlan::Int3 {
                    patch_addr,
                    insn_len: first.len(),
                    displaced: displaced[..first.len().min(displaced.len())].to_vec(),
                    skipped_endbr,
                    reason: Reason::SiteInPatch { at },
                };
            }
        }
    }
    plan
}

fn plan_site_alone(func: &FunctionCode, site_addr: u64) -> SitePlan {
    let refused = |reason| SitePlan::Refused { reason };
    let end = func.end();
    if site_addr < func.addr || site_addr >= end {
        return refused(Reason::OutsideFunction { site: site_addr });
    }
    let skipped_endbr = site_addr == func.addr && func.bytes.starts_with(&ENDBR64);
    let patch_addr = if skipped_endbr {
        site_addr + ENDBR64.len() as u64
    } else {
        site_addr
    };
    let offset = (patch_addr - func.addr) as usize;
    let available = func.bytes.len() - offset;
    if available == 0 {
        // A function that is only `endbr64`.
        return refused(Reason::TooShort { len: 0 });
    }

    let body = decode::sweep(&func.bytes, func.addr);
    let swept_past = |addr: u64| body.error_at.is_none_or(|e| e > addr);
    if swept_past(patch_addr) && !body.insns.iter().any(|i| i.ip() == patch_addr) {
        return refused(Reason::NotInstructionBoundary { site: patch_addr });
    }
    let Some(first) = decode::decode_one(&func.bytes[offset..], patch_addr) else {
        return refused(Reason::DecodeError { at: patch_addr });
    };
    if let Err(reason) = check_out_of_line(&[first]) {
        return refused(reason);
    }
    if let Err(err) = relocate::relocate_insns(&[first], patch_addr, true) {
        return refused(Reason::Unrelocatable {
            at: patch_addr,
            insn: decode::insn_text(&first),
            why: err.to_string(),
        });
    }

    let int3 = |reason| SitePlan::Int3 {
        patch_addr,
        insn_len: first.len(),
        displaced: func.bytes[offset..offset + first.len()].to_vec(),
        skipped_endbr,
        reason,
    };
    if !func.size_known {
        return int3(Reason::SizeUnknown);
    }
    if let Some(at) = body.error_at {
        return int3(Reason::DecodeError { at });
    }
    if available < JUMP_LEN {
        return plan_into_padding(func, &body.insns, patch_addr, skipped_endbr)
            .unwrap_or_else(|| int3(Reason::TooShort { len: available }));
    }

    // The instructions covering the first JUMP_LEN bytes (on sweep boundaries, which
    // we checked the patch point is one of).
    let displaced: Vec<Instruction> = {
        let mut covered = Vec::new();
        for insn in body.insns.iter().filter(|i| i.ip() >= patch_addr) {
            covered.push(*insn);
            if insn.next_ip() - patch_addr >= JUMP_LEN as u64 {
                break;
            }
        }
        covered
    };
    let displaced_end = displaced.last().map_or(patch_addr, |i| i.next_ip());
    let displaced_len = (displaced_end - patch_addr) as usize;
    // A `ret`/`jmp` followed only by NOP/INT3 filler (e.g. a coldpatched tail site,
    // `ret; nop4`): the filler is dead, like padding; only what precedes it moves.
    let (displaced, dead) = split_dead_filler(displaced);
    if let Err(reason) = check_out_of_line(&displaced) {
        return int3(reason);
    }

    let inside = |addr: u64| patch_addr < addr && addr < displaced_end;
    for insn in &body.insns {
        if let Some(to) = direct_target(insn).filter(|&t| inside(t)) {
            return int3(Reason::BranchIntoPatch {
                from: insn.ip(),
                to,
            });
        }
        if is_rip_relative(insn) && inside(insn.ip_rel_memory_address()) {
            return int3(Reason::AddressTakenInPatch {
                from: insn.ip(),
                to: insn.ip_rel_memory_address(),
            });
        }
    }

    let bytes = func.bytes[offset..offset + displaced_len].to_vec();
    // A trial encoding, at the original address, catches anything iced cannot encode.
    if let Err(err) = relocate::relocate_insns(&displaced, patch_addr, true) {
        return int3(Reason::Unrelocatable {
            at: patch_addr,
            insn: decode::insn_text(&first),
            why: err.to_string(),
        });
    }
    SitePlan::Jump {
        patch_addr,
        displaced_len,
        displaced: bytes,
        padding: dead,
        skipped_endbr,
    }
}

/// Split off NOP/INT3 instructions that follow an instruction that never falls
/// through: they can never run (no branch targets them, which the caller checks for
/// every displaced byte), so they are overwritten but not relocated. Returns the
/// instructions to relocate and the number of dead bytes.
fn split_dead_filler(mut insns: Vec<Instruction>) -> (Vec<Instruction>, usize) {
    let Some(end_at) = insns.iter().position(|i| !falls_through(i)) else {
        return (insns, 0);
    };
    let rest = &insns[end_at + 1..];
    if rest.is_empty()
        || !rest
            .iter()
            .all(|i| matches!(i.mnemonic(), Mnemonic::Nop | Mnemonic::Int3))
    {
        return (insns, 0);
    }
    let dead: usize = rest.iter().map(|i| i.len()).sum();
    insns.truncate(end_at + 1);
    (insns, dead)
}

/// A jump over a function too short for one, extended into the padding after it.
///
/// Allowed only when every instruction from the patch point to the function's end
/// can run out of line and the last one never falls through (`ret`, `jmp`; not a
/// `call`, whose return address would point into the patch), the padding bytes the
/// jump covers decode as `nop`s or `int3`s (compilers' alignment filler, never
/// executed), and no branch in the function targets the covered bytes. The padding
/// ends where the next function begins, so no other code is touched.
fn plan_into_padding(
    func: &FunctionCode,
    body: &[Instruction],
    patch_addr: u64,
    skipped_endbr: bool,
) -> Option<SitePlan> {
    let end = func.end();
    let insns: Vec<Instruction> = body
        .iter()
        .filter(|i| i.ip() >= patch_addr)
        .copied()
        .collect();
    let last = insns.last()?;
    if last.next_ip() != end || falls_through(last) || is_near_call(last) {
        return None;
    }
    check_out_of_line(&insns).ok()?;
    let need = JUMP_LEN - (end - patch_addr) as usize;
    if func.padding.len() < need {
        return None;
    }
    let pad = decode::sweep(&func.padding, end);
    let covered_ok = pad
        .insns
        .iter()
        .take_while(|i| i.ip() < end + need as u64)
        .all(|i| matches!(i.mnemonic(), Mnemonic::Nop | Mnemonic::Int3));
    let decoded_far_enough = pad
        .insns
        .last()
        .is_some_and(|i| i.next_ip() >= end + need as u64);
    if !covered_ok || !decoded_far_enough {
        return None;
    }
    let patch_end = patch_addr + JUMP_LEN as u64;
    let inside = |addr: u64| patch_addr < addr && addr < patch_end;
    if body.iter().any(|i| direct_target(i).is_some_and(inside)) {
        return None;
    }
    relocate::relocate_insns(&insns, patch_addr, false).ok()?;
    let offset = (patch_addr - func.addr) as usize;
    let mut displaced = func.bytes[offset..].to_vec();
    displaced.extend_from_slice(&func.padding[..need]);
    Some(SitePlan::Jump {
        patch_addr,
        displaced_len: JUMP_LEN,
        displaced,
        padding: need,
        skipped_endbr,
    })
}

/// Checks that `insns`, in order, can run out of line as one sequence: each one alone
/// (see [`unrelocatable`]), a `call` or an instruction that never falls through only
/// as the last one.
pub(crate) fn check_out_of_line(insns: &[Instruction]) -> Result<(), Reason> {
    for (i, insn) in insns.iter().enumerate() {
        if let Some(why) = unrelocatable(insn) {
            return Err(Reason::Unrelocatable {
                at: insn.ip(),
                insn: decode::insn_text(insn),
                why: why.to_string(),
            });
        }
        let is_last = i + 1 == insns.len();
        if is_last {
            continue;
        }
        if is_near_call(insn) {
            return Err(Reason::CallNotLast { at: insn.ip() });
        }
        if !falls_through(insn) {
            return Err(Reason::FlowEndsInPatch {
                at: insn.ip(),
                insn: decode::insn_text(insn),
            });
        }
    }
    Ok(())
}

/// Why `insn` cannot run at another address, or `None` if it can (re-encoded by
/// iced's block encoder; a near `call` emulated, see [`crate::relocate`]).
pub(crate) fn unrelocatable(insn: &Instruction) -> Option<&'static str> {
    match insn.code() {
        Code::Int3 | Code::Int1 => {
            return Some("a breakpoint executed elsewhere would not be recognised")
        }
        _ => {}
    }
    if insn.mnemonic() == Mnemonic::Call && !is_near_call(insn) {
        return Some("a far call pushes the trampoline's address");
    }
    if is_near_call(insn) && uses_stack_pointer(insn) {
        // The emulation pushes the return address before the jump reads its operand.
        return Some("the call's operand depends on the stack pointer");
    }
    if insn.is_ip_rel_memory_operand() && !is_rip_relative(insn) {
        return Some("[eip+disp] operands are not relocated");
    }
    None
}

/// True for `call rel32`, `call reg`, `call [mem]` (not far calls, not `syscall`).
pub(crate) fn is_near_call(insn: &Instruction) -> bool {
    matches!(insn.code(), Code::Call_rel32_64 | Code::Call_rm64)
}

/// False for instructions after which execution never continues with the next one:
/// `ret`, `jmp` (direct or not), `ud0/1/2`, `hlt`.
pub(crate) fn falls_through(insn: &Instruction) -> bool {
    !matches!(
        insn.flow_control(),
        FlowControl::Return
            | FlowControl::UnconditionalBranch
            | FlowControl::IndirectBranch
            | FlowControl::Exception
    ) && insn.mnemonic() != Mnemonic::Hlt
}

fn uses_stack_pointer(insn: &Instruction) -> bool {
    let is_sp = |r: Register| r.full_register() == Register::RSP;
    match insn.op0_kind() {
        OpKind::Register => is_sp(insn.op0_register()),
        OpKind::Memory => is_sp(insn.memory_base()) || is_sp(insn.memory_index()),
        _ => false,
    }
}
