//! Call-frame information (`.eh_frame`): the frame that called the one a thread
//! stopped in, so that attach can run a thread out of the C library to the
//! program's code it returns to, in one run rather than thousands of single steps.
//!
//! Only what the x86-64 ABI's frames need: a CFA that is a register (`rsp` or
//! `rbp`) plus an offset, the return address and `rbp` saved at offsets from it.
//! Anything else (a CFA given by an expression, as in PLT stubs and signal
//! trampolines) ends the walk with `None`: the caller steps instead.

use gimli::{
    BaseAddresses, CfaRule, EhFrame, EhFrameHdr, LittleEndian, RegisterRule, UnwindContext,
    UnwindSection, X86_64,
};

use crate::elf::ElfFile;

/// The registers one frame step needs (runtime addresses).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Frame {
    pub pc: u64,
    pub sp: u64,
    pub bp: u64,
}

/// A module's `.eh_frame`, with the search table of `.eh_frame_hdr` if it has one
/// (file vaddrs).
pub struct FrameTable {
    eh_frame: Vec<u8>,
    eh_frame_addr: u64,
    hdr: Option<(Vec<u8>, u64)>,
    text_addr: u64,
}

impl FrameTable {
    /// The call-frame information of `elf`, if it has any.
    pub fn of(elf: &ElfFile) -> Option<FrameTable> {
        let eh = elf.section(".eh_frame")?;
        let data = elf.section_data(eh);
        if data.is_empty() {
            return None;
        }
        let hdr = elf
            .section(".eh_frame_hdr")
            .map(|h| (elf.section_data(h).to_vec(), h.addr))
            .filter(|(d, _)| !d.is_empty());
        Some(FrameTable {
            eh_frame: data.to_vec(),
            eh_frame_addr: eh.addr,
            hdr,
            text_addr: elf.section(".text").map_or(0, |t| t.addr),
        })
    }

    /// The frame that called `frame`, in a module loaded with `bias`; `interrupted`
    /// says `frame.pc` is where the thread stopped (else a return address, looked up
    /// one byte back, inside the call). `read` reads 8 bytes of the process's memory.
    pub fn caller(
        &self,
        frame: Frame,
        bias: u64,
        interrupted: bool,
        read: impl Fn(u64) -> Option<u64>,
    ) -> Option<Frame> {
        let eh_frame = EhFrame::new(&self.eh_frame, LittleEndian);
        let mut bases = BaseAddresses::default()
            .set_eh_frame(self.eh_frame_addr)
            .set_text(self.text_addr);
        let at = frame
            .pc
            .wrapping_sub(bias)
            .wrapping_sub(u64::from(!interrupted));
        let mut ctx = Box::new(UnwindContext::new());
        let row = match &self.hdr {
            Some((hdr, hdr_addr)) => {
                bases = bases.set_eh_frame_hdr(*hdr_addr);
                let parsed = EhFrameHdr::new(hdr, LittleEndian).parse(&bases, 8).ok()?;
                let table = parsed.table()?;
                table
                    .unwind_info_for_address(
                        &eh_frame,
                        &bases,
                        &mut ctx,
                        at,
                        EhFrame::cie_from_offset,
                    )
                    .ok()?
                    .clone()
            }
            None => eh_frame
                .unwind_info_for_address(&bases, &mut ctx, at, EhFrame::cie_from_offset)
                .ok()?
                .clone(),
        };
        let cfa = match row.cfa() {
            CfaRule::RegisterAndOffset { register, offset } => {
                let base = match *register {
                    X86_64::RSP => frame.sp,
                    X86_64::RBP => frame.bp,
                    _ => return None,
                };
                base.checked_add_signed(*offset)?
            }
            CfaRule::Expression(_) => return None,
        };
        let saved = |rule: RegisterRule<usize>, current: u64| match rule {
            RegisterRule::Undefined | RegisterRule::SameValue => Some(current),
            RegisterRule::Offset(n) => read(cfa.checked_add_signed(n)?),
            RegisterRule::ValOffset(n) => cfa.checked_add_signed(n),
            _ => None,
        };
        let pc = match row.register(X86_64::RA) {
            RegisterRule::Offset(n) => read(cfa.checked_add_signed(n)?)?,
            _ => return None,
        };
        let bp = saved(row.register(X86_64::RBP), frame.bp)?;
        Some(Frame { pc, sp: cfa, bp })
    }
}

/// Where a [`CfiRow`]'s CFA comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CfaBase {
    Rsp,
    Rbp,
    /// No rule the ABI's frames use (an expression, another register, a return
    /// address not at CFA-8), or no entry at all: walk frame pointers.
    Unknown,
}

/// One row of a module's compact unwind table (file vaddrs), covering
/// `[addr, next row's addr)`: the CFA is `base + cfa_off`, the return address at
/// CFA-8, the caller's `rbp` at `CFA + rbp_off` (`None`: unchanged).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CfiRow {
    pub addr: u64,
    pub base: CfaBase,
    pub cfa_off: i32,
    pub rbp_off: Option<i16>,
}

impl FrameTable {
    /// Every row of every FDE as a sorted, compact table (the kernel's ORC idea):
    /// consecutive rows with the same rule merged, a [`CfaBase::Unknown`] row where
    /// an FDE ends and no other starts.
    pub fn compact_rows(&self) -> Vec<CfiRow> {
        let eh_frame = EhFrame::new(&self.eh_frame, LittleEndian);
        let mut bases = BaseAddresses::default()
            .set_eh_frame(self.eh_frame_addr)
            .set_text(self.text_addr);
        if let Some((_, hdr_addr)) = &self.hdr {
            bases = bases.set_eh_frame_hdr(*hdr_addr);
        }
        let mut ctx = Box::new(UnwindContext::new());
        // (start, end, row) per FDE row.
        let mut spans: Vec<(u64, u64, CfaBase, i32, Option<i16>)> = Vec::new();
        let mut entries = eh_frame.entries(&bases);
        while let Ok(Some(entry)) = entries.next() {
            let gimli::CieOrFde::Fde(partial) = entry else {
                continue;
            };
            let Ok(fde) = partial.parse(EhFrame::cie_from_offset) else {
                continue;
            };
            let Ok(mut table) = fde.rows(&eh_frame, &bases, &mut ctx) else {
                continue;
            };
            while let Ok(Some(row)) = table.next_row() {
                let (base, cfa_off) = match row.cfa() {
                    CfaRule::RegisterAndOffset { register, offset } => {
                        match (*register, i32::try_from(*offset)) {
                            (X86_64::RSP, Ok(o)) => (CfaBase::Rsp, o),
                            (X86_64::RBP, Ok(o)) => (CfaBase::Rbp, o),
                            _ => (CfaBase::Unknown, 0),
                        }
                    }
                    CfaRule::Expression(_) => (CfaBase::Unknown, 0),
                };
                let ra_ok = matches!(row.register(X86_64::RA), RegisterRule::Offset(-8));
                let rbp = match row.register(X86_64::RBP) {
                    RegisterRule::Undefined | RegisterRule::SameValue => Some(None),
                    RegisterRule::Offset(n) => i16::try_from(n).ok().filter(|&n| n != 0).map(Some),
                    _ => None,
                };
                let (base, cfa_off, rbp_off) = match (base, ra_ok, rbp) {
                    (CfaBase::Unknown, _, _) | (_, false, _) | (_, _, None) => {
                        (CfaBase::Unknown, 0, None)
                    }
                    (b, true, Some(r)) => (b, cfa_off, r),
                };
                spans.push((
                    row.start_address(),
                    row.end_address(),
                    base,
                    cfa_off,
                    rbp_off,
                ));
            }
        }
        spans.sort_by_key(|s| s.0);
        let mut rows: Vec<CfiRow> = Vec::with_capacity(spans.len());
        let mut end = 0u64;
        for (i, &(start, stop, base, cfa_off, rbp_off)) in spans.iter().enumerate() {
            if start >= stop {
                continue;
            }
            // Overlapping FDEs (rare, broken input): the earlier one wins.
            if start < end {
                continue;
            }
            let row = CfiRow {
                addr: start,
                base,
                cfa_off,
                rbp_off,
            };
            let same = rows.last().is_some_and(|l| {
                end == start && (l.base, l.cfa_off, l.rbp_off) == (base, cfa_off, rbp_off)
            });
            if !same {
                rows.push(row);
            }
            end = stop;
            let next = spans.get(i + 1).map(|s| s.0);
            if next != Some(stop) {
                rows.push(CfiRow {
                    addr: stop,
                    base: CfaBase::Unknown,
                    cfa_off: 0,
                    rbp_off: None,
                });
            }
        }
        // Drop unknown rows right before a row at the same address.
        rows.dedup_by(|b, a| {
            if a.addr == b.addr {
                *a = *b;
                true
            } else {
                false
            }
        });
        rows
    }
}
