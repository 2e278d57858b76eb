//! Return sites: a function's `ret` instructions patched in place, so return probes
//! run without touching the return address.
//!
//! The usual return probe replaces the return address with a trampoline's (the
//! hijack). The CPU's return-stack predictor then misses on every such return, which
//! is most of a return probe's cost. When every way out of a function is one of its
//! own `ret`s, each can carry the return advice instead: a 5-byte window ending at
//! the `ret` (the `ret` and the instructions before it, or the `ret` and the
//! alignment padding after the function's last byte) becomes a `jmp` to a trampoline
//! that runs the relocated instructions, the advice, and the `ret` itself — calls and
//! returns stay paired.
//!
//! [`return_sites`] says whether a function qualifies, and where its windows are. The
//! rules, in order (the first that fails gives the [`NoReturnSites`] reason, and the
//! caller keeps the hijack):
//!
//! 1. The size is known and the whole body decodes.
//! 2. No exit but `ret`: no indirect jump (a jump table or a tail call through a
//!    pointer), no direct jump leaving the function (a tail call, or a `.cold` part,
//!    whose code the symbol does not cover), no `xbegin`, and the last instruction
//!    does not fall through (a `call` to a function that does not return may end it).
//!    A function that can leave only through its `ret`s cannot be entered in the
//!    middle by a `.cold` part either: such parts are reached from the function.
//! 3. No `[rip+disp]` operand takes the address of a byte inside the function (a
//!    computed `goto` label), and no other probe site lies in it but at its start.
//! 4. Each `ret` has a window: at least 5 bytes ending at the `ret` (or starting at
//!    the last `ret` and running into NOP/INT3 padding after the function), no byte of
//!    which but the first is a branch target (direct branches, and `endbr64`s, which
//!    mark indirect targets), of instructions that fall through (no call, no branch)
//!    and run out of line, outside the entry site's patch. A `ret` inside the entry
//!    site's displaced bytes needs no window: it runs relocated in the entry's
//!    trampoline, which puts the return advice before it ([`ReturnSites::in_entry`]).
//!
//! Exception landing pads are reached by the unwinder, not by branches, so the
//! decoder cannot see them; but a landing pad's code always calls (to begin the
//! catch or resume unwinding) before it can reach a `ret`, and a window holds no
//! call, so none starts inside a window.

use std::collections::HashSet;
use std::fmt;

use iced_x86::{FlowControl, Instruction, Mnemonic};

use crate::decode::{self, direct_target, is_rip_relative};
use crate::plan::{check_out_of_line, falls_through, is_near_call, FunctionCode, SitePlan};
use crate::relocate::relocate_insns;
use crate::{X86Error, JUMP_LEN};

/// Where a function's return advice goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReturnSites {
    /// One per `ret` outside the entry site.
    pub sites: Vec<ReturnSite>,
    /// The address of a `ret` in the entry site's displaced bytes (a function of a
    /// few bytes): the entry's trampoline runs the return advice before its
    /// relocated `ret`.
    pub in_entry: Option<u64>,
}

/// One `ret`'s window.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReturnSite {
    /// A jump plan over the window's bytes, the last instruction (before any
    /// padding) being the `ret`.
    pub plan: SitePlan,
    /// The `ret`'s address.
    pub ret: u64,
}

/// Why a function keeps the return-address hijack.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NoReturnSites {
    SizeUnknown,
    DecodeError { at: u64 },
    IndirectJump { at: u64 },
    LeavesFunction { at: u64, to: u64 },
    Transaction { at: u64 },
    FallsOffEnd { at: u64 },
    AddressTaken { at: u64, to: u64 },
    OtherSite { at: u64 },
    NoWindow { ret: u64, why: String },
    EntryNotJump,
}

impl fmt::Display for NoReturnSites {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NoReturnSites::SizeUnknown => write!(f, "the function's size is unknown"),
            NoReturnSites::DecodeError { at } => write!(f, "cannot decode the code at {at:#x}"),
            NoReturnSites::IndirectJump { at } => {
                write!(f, "indirect jump at {at:#x} (a jump table or a tail call)")
            }
            NoReturnSites::LeavesFunction { at, to } => {
                write!(f, "jump at {at:#x} leaves the function (to {to:#x})")
            }
            NoReturnSites::Transaction { at } => write!(f, "transaction at {at:#x}"),
            NoReturnSites::FallsOffEnd { at } => {
                write!(f, "the last instruction, at {at:#x}, falls through")
            }
            NoReturnSites::AddressTaken { at, to } => {
                write!(f, "instruction at {at:#x} takes the code address {to:#x}")
            }
            NoReturnSites::OtherSite { at } => write!(f, "another probe site at {at:#x}"),
            NoReturnSites::NoWindow { ret, why } => {
                write!(f, "no 5-byte window for the ret at {ret:#x}: {why}")
            }
            NoReturnSites::EntryNotJump => write!(f, "the entry is not a jump site"),
        }
    }
}

/// The return sites of `func`, whose entry is patched by `entry` (a jump plan);
/// `others` are the addresses of other probe sites in the process, in increasing
/// order. See the module
/// documentation.
pub fn return_sites(
    func: &FunctionCode,
    entry: &SitePlan,
    others: &[u64],
) -> Result<ReturnSites, NoReturnSites> {
    let SitePlan::Jump {
        patch_addr: entry_at,
        displaced,
        padding: entry_padding,
        ..
    } = entry
    else {
        return Err(NoReturnSites::EntryNotJump);
    };
    let entry_end = entry_at + (displaced.len() - entry_padding) as u64;
    if !func.size_known {
        return Err(NoReturnSites::SizeUnknown);
    }
    let body = decode::sweep(&func.bytes, func.addr);
    if let Some(at) = body.error_at {
        return Err(NoReturnSites::DecodeError { at });
    }
    let (start, end) = (func.addr, func.end());
    let inside = |a: u64| start < a && a < end;
    let mut targets: HashSet<u64> = HashSet::new();
    let mut rets = Vec::new();
    for (k, insn) in body.insns.iter().enumerate() {
        let at = insn.ip();
        match insn.flow_control() {
            FlowControl::IndirectBranch => return Err(NoReturnSites::IndirectJump { at }),
            FlowControl::XbeginXabortXend => return Err(NoReturnSites::Transaction { at }),
            FlowControl::UnconditionalBranch | FlowControl::ConditionalBranch => {
                let to = direct_target(insn).unwrap_or(0);
                if !(start <= to && to < end) {
                    return Err(NoReturnSites::LeavesFunction { at, to });
                }
            }
            FlowControl::Return => rets.push(k),
            _ => {}
        }
        if let Some(to) = direct_target(insn) {
            targets.insert(to);
        }
        if k > 0 && insn.mnemonic() == Mnemonic::Endbr64 {
            targets.insert(at);
        }
        if is_rip_relative(insn) && inside(insn.ip_rel_memory_address()) {
            return Err(NoReturnSites::AddressTaken {
                at,
                to: insn.ip_rel_memory_address(),
            });
        }
    }
    if let Some(last) = body.insns.last() {
        if falls_through(last) && !is_near_call(last) {
            return Err(NoReturnSites::FallsOffEnd { at: last.ip() });
        }
    }
    let padded_end = end + func.padding.len() as u64;
    if let Some(&at) = crate::plan::in_range(others, start, padded_end)
        .iter()
        .find(|&&a| a != start && a != *entry_at)
    {
        return Err(NoReturnSites::OtherSite { at });
    }
    let mut out = ReturnSites {
        sites: Vec::new(),
        in_entry: None,
    };
    for k in rets {
        let ret = &body.insns[k];
        if *entry_at <= ret.ip() && ret.ip() < entry_end {
            out.in_entry = Some(ret.ip());
            continue;
        }
        let plan = window(func, &body.insns, k, &targets, entry_end)
            .map_err(|why| NoReturnSites::NoWindow { ret: ret.ip(), why })?;
        out.sites.push(ReturnSite {
            plan,
            ret: ret.ip(),
        });
    }
    Ok(out)
}

/// The window of the `ret` at `insns[k]`: the `ret`, the dead filler after it (NOPs
/// and INT3s up to the next branch target, and the padding after the function when
/// the filler reaches its end), and as many instructions before it as it takes to
/// make 5 bytes.
fn window(
    func: &FunctionCode,
    insns: &[Instruction],
    k: usize,
    targets: &HashSet<u64>,
    entry_end: u64,
) -> Result<SitePlan, String> {
    let ret = &insns[k];
    let filler = |i: &Instruction| matches!(i.mnemonic(), Mnemonic::Nop | Mnemonic::Int3);
    let mut after = 0usize;
    let mut reached_end = true;
    for i in &insns[k + 1..] {
        if !filler(i) || targets.contains(&i.ip()) {
            reached_end = false;
            break;
        }
        after += i.len();
    }
    if reached_end {
        after += padding_filler(func);
    }
    let mut first = k;
    let mut len = ret.len();
    while len + after < JUMP_LEN {
        let at = insns[first].ip();
        if targets.contains(&at) {
            return Err(format!("{at:#x} is a branch target"));
        }
        if first == 0 {
            return Err("the function is too short".into());
        }
        let prev = &insns[first - 1];
        if prev.ip() < entry_end {
            return Err("it would overlap the entry site".into());
        }
        if !falls_through(prev) || is_near_call(prev) {
            return Err(format!(
                "`{}` at {:#x} does not fall through",
                decode::insn_text(prev),
                prev.ip()
            ));
        }
        first -= 1;
        len += prev.len();
    }
    let window = &insns[first..=k];
    check_out_of_line(window).map_err(|r| r.to_string())?;
    relocate_insns(&window[..window.len() - 1], window[0].ip(), false)
        .map_err(|e| e.to_string())?;
    let dead = JUMP_LEN.saturating_sub(len);
    let patch_addr = window[0].ip();
    let offset = (patch_addr - func.addr) as usize;
    let mut displaced = func.bytes[offset..].to_vec();
    displaced.extend_from_slice(&func.padding);
    displaced.truncate(len + dead);
    Ok(SitePlan::Jump {
        patch_addr,
        displaced_len: len + dead,
        displaced,
        padding: dead,
        skipped_endbr: false,
    })
}

/// How many bytes of NOP/INT3 filler the padding after the function starts with
/// (whole instructions).
fn padding_filler(func: &FunctionCode) -> usize {
    decode::sweep(&func.padding, func.end())
        .insns
        .iter()
        .take_while(|i| matches!(i.mnemonic(), Mnemonic::Nop | Mnemonic::Int3))
        .map(|i| i.len())
        .sum()
}

/// A plan whose relocated instructions end with a `ret` (a return site's window, or
/// an entry site over a whole short function), split for a return trampoline: the
/// instructions before the `ret` re-encoded at `new_addr` (no jump back), and the
/// `ret`'s own bytes, which the trampoline puts after the advice.
///
/// # Errors
///
/// [`X86Error::Refused`] when the plan is not a jump whose last relocated
/// instruction is a `ret`; encoding errors as [`crate::relocate`].
pub fn relocate_before_ret(plan: &SitePlan, new_addr: u64) -> Result<(Vec<u8>, Vec<u8>), X86Error> {
    let not_ret = || {
        X86Error::Refused(crate::Reason::FlowEndsInPatch {
            at: plan.patch_addr().unwrap_or(0),
            insn: "(no ret at the end of the window)".into(),
        })
    };
    let SitePlan::Jump {
        patch_addr,
        displaced,
        padding,
        ..
    } = plan
    else {
        return Err(not_ret());
    };
    let code = &displaced[..displaced.len() - padding];
    let sweep = decode::sweep(code, *patch_addr);
    let insns = sweep.insns;
    let last = insns.last().ok_or_else(not_ret)?;
    if sweep.error_at.is_some() || last.flow_control() != FlowControl::Return {
        return Err(not_ret());
    }
    let ret_bytes = code[(last.ip() - patch_addr) as usize..].to_vec();
    let prefix = &insns[..insns.len() - 1];
    let relocated = if prefix.is_empty() {
        Vec::new()
    } else {
        relocate_insns(prefix, new_addr, false)?
    };
    Ok((relocated, ret_bytes))
}

/// Whether the plan's relocated instructions end with a `ret` (an entry site over a
/// whole short function).
pub fn ends_with_ret(plan: &SitePlan) -> bool {
    let SitePlan::Jump {
        patch_addr,
        displaced,
        padding,
        ..
    } = plan
    else {
        return false;
    };
    let sweep = decode::sweep(&displaced[..displaced.len() - padding], *patch_addr);
    sweep.error_at.is_none()
        && sweep
            .insns
            .last()
            .is_some_and(|i| i.flow_control() == FlowControl::Return)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan_site;

    fn func(addr: u64, bytes: &[u8], padding: &[u8]) -> FunctionCode {
        FunctionCode {
            addr,
            bytes: bytes.to_vec(),
            size_known: true,
            padding: padding.to_vec(),
        }
    }

    #[test]
    fn a_one_byte_function_has_its_ret_in_the_entry() {
        let f = func(0x1000, &[0xc3], &[0x66, 0x0f, 0x1f, 0x44, 0x00, 0x00]);
        let entry = plan_site(&f, 0x1000);
        let r = return_sites(&f, &entry, &[0x1000]).unwrap();
        assert_eq!(r.in_entry, Some(0x1000));
        assert!(r.sites.is_empty());
        assert!(ends_with_ret(&entry));
        let (prefix, ret) = relocate_before_ret(&entry, 0x5000).unwrap();
        assert!(prefix.is_empty());
        assert_eq!(ret, vec![0xc3]);
    }

    #[test]
    fn a_call_never_goes_in_a_window() {
        // push rbx; mov ebx, edi; call 0x2000; mov eax, ebx; pop rbx; ret: the four
        // bytes before the call are too few, and the call cannot be displaced.
        let code = [
            0x53, 0x89, 0xfb, 0xe8, 0xf8, 0x0f, 0x00, 0x00, 0x89, 0xd8, 0x5b, 0xc3,
        ];
        let f = func(0x1000, &code, &[]);
        let entry = plan_site(&f, 0x1000);
        let e = return_sites(&f, &entry, &[0x1000]).unwrap_err();
        assert!(
            matches!(&e, NoReturnSites::NoWindow { ret: 0x100b, .. }),
            "{e}"
        );
    }

    #[test]
    fn a_window_may_end_in_the_filler_after_a_ret() {
        // 0: mov ecx, edi; 2: test ecx, ecx; 4: jne 0x10; 6: xor eax, eax; 8: mov eax, ecx
        // 0xa: ret; 0xb: nop5 (filler before a branch target); 0x10: neg eax; 0x12: ret
        let code = [
            0x89, 0xf9, 0x85, 0xc9, 0x75, 0x0a, 0x31, 0xc0, 0x89, 0xc8, 0xc3, 0x0f, 0x1f, 0x44,
            0x00, 0x00, 0xf7, 0xd8, 0xc3,
        ];
        let f = func(0x1000, &code, &[0xcc, 0xcc, 0xcc, 0xcc]);
        let entry = plan_site(&f, 0x1000);
        let r = return_sites(&f, &entry, &[]).unwrap();
        let at: Vec<(u64, u64, usize)> = r
            .sites
            .iter()
            .map(|s| match &s.plan {
                SitePlan::Jump {
                    patch_addr,
                    padding,
                    ..
                } => (*patch_addr, s.ret, *padding),
                _ => panic!(),
            })
            .collect();
        // Each `ret` and four dead bytes: of the filler before the branch target, and
        // of the padding after the function. Nothing is relocated.
        assert_eq!(at, vec![(0x100a, 0x100a, 4), (0x1012, 0x1012, 4)]);
        let (prefix, ret) = relocate_before_ret(&r.sites[0].plan, 0x9000).unwrap();
        assert_eq!((prefix, ret), (vec![], vec![0xc3]));
        // With less filler (a 3-byte nop, then the 2 bytes of `neg`'s block moved
        // down: the target is now 0x100e), the first takes the `mov` before it.
        let short = [
            0x89, 0xf9, 0x85, 0xc9, 0x75, 0x08, 0x31, 0xc0, 0x89, 0xc8, 0xc3, 0x0f, 0x1f, 0x00,
            0xf7, 0xd8, 0xc3,
        ];
        let f = func(0x1000, &short, &[0xcc, 0xcc, 0xcc, 0xcc]);
        let r = return_sites(&f, &plan_site(&f, 0x1000), &[]).unwrap();
        assert!(matches!(
            r.sites[0].plan,
            SitePlan::Jump {
                patch_addr: 0x1008,
                padding: 2,
                ..
            }
        ));
    }

    #[test]
    fn a_tail_call_keeps_the_hijack() {
        // push rbx; pop rbx; nop dword [rax]; jmp 0x3000
        let code = [
            0x53, 0x5b, 0x0f, 0x1f, 0x40, 0x00, 0xe9, 0xf5, 0x1f, 0x00, 0x00,
        ];
        let f = func(0x1000, &code, &[]);
        let entry = plan_site(&f, 0x1000);
        assert!(matches!(
            return_sites(&f, &entry, &[]),
            Err(NoReturnSites::LeavesFunction { .. })
        ));
    }

    #[test]
    fn a_branch_into_the_window_refuses_it() {
        // 0: test edi, edi; 2: je 0x0d; 4: add edi, 1; 7: mov eax, edi; 9: add rsp, 8 (4)
        // 0x0d: ret -- `je` targets the ret: window impossible
        let code = [
            0x85, 0xff, 0x74, 0x09, 0x83, 0xc7, 0x01, 0x89, 0xf8, 0x48, 0x83, 0xc4, 0x08, 0xc3,
        ];
        let f = func(0x1000, &code, &[]);
        let entry = plan_site(&f, 0x1000);
        let e = return_sites(&f, &entry, &[]).unwrap_err();
        assert!(
            matches!(e, NoReturnSites::NoWindow { ret: 0x100d, .. }),
            "{e}"
        );
    }

    #[test]
    fn a_window_over_an_epilogue() {
        // 0: push rbx (1); 1: mov ebx, edi (2); 3: nop5 (5); 8: mov eax, ebx (2)
        // 0xa: add rsp, 8 (4); 0xe: pop rbx (1); 0xf: ret
        let code = [
            0x53, 0x89, 0xfb, 0x0f, 0x1f, 0x44, 0x00, 0x00, 0x89, 0xd8, 0x48, 0x83, 0xc4, 0x08,
            0x5b, 0xc3,
        ];
        let f = func(0x1000, &code, &[]);
        let entry = plan_site(&f, 0x1000);
        let r = return_sites(&f, &entry, &[0x1000]).unwrap();
        assert_eq!(r.sites.len(), 1);
        assert_eq!(r.sites[0].ret, 0x100f);
        let SitePlan::Jump {
            patch_addr,
            displaced,
            ..
        } = &r.sites[0].plan
        else {
            panic!()
        };
        assert_eq!(*patch_addr, 0x100a);
        assert_eq!(displaced, &vec![0x48, 0x83, 0xc4, 0x08, 0x5b, 0xc3]);
        let (prefix, ret) = relocate_before_ret(&r.sites[0].plan, 0x9000).unwrap();
        assert_eq!(prefix, vec![0x48, 0x83, 0xc4, 0x08, 0x5b]);
        assert_eq!(ret, vec![0xc3]);
        // Another probe inside the function: the hijack stays.
        assert!(matches!(
            return_sites(&f, &entry, &[0x1000, 0x1008]),
            Err(NoReturnSites::OtherSite { at: 0x1008 })
        ));
    }
}
