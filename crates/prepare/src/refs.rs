//! Every address in the file that something may jump to or load as a code pointer:
//! a superset, so that a displaced prologue whose inside bytes (after the patch
//! point) anyone names is left alone.
//!
//! The planner (`weft_x86::plan_site`) checks the function's own branches and
//! `[rip+disp]` operands. A rewrite on disk is permanent, so `prepare` also refuses a
//! function when any of these lands strictly inside its displaced bytes:
//!
//! * a direct branch target, `[rip+disp]` address or (non-PIE) immediate, decoded from
//!   every function's start and by a linear sweep of every executable section
//!   (`foo.cold` parts jumping back into `foo`, code no symbol covers);
//! * a symbol's address (any type: local labels, another function's start);
//! * a relocation's target (symbol + addend, or the addend of `R_X86_64_RELATIVE`):
//!   function pointers in data of position-independent files;
//! * in a non-PIE file, every aligned 8-byte word of the loaded data (absolute code
//!   pointers and jump tables need no relocation there);
//! * PIE jump tables: 32-bit offsets after each `[rip+disp]` address that lands in
//!   data, taken while they reach executable code (gcc's `lea table; movsxd; add`).
//!
//! And where dynamic relocations write: a text relocation (`-z notext`) inside the
//! displaced bytes would overwrite the jump at load time.

use iced_x86::{Decoder, DecoderOptions, OpKind, Register};
use object::{Object, ObjectSection, ObjectSymbol, RelocationTarget};

/// Sorted, deduplicated addresses.
pub(crate) struct Refs {
    targets: Vec<u64>,
    /// Where dynamic relocations write (a text relocation inside a displaced prologue
    /// would overwrite the jump).
    written: Vec<u64>,
}

impl Refs {
    /// Some reference strictly between `lo` and `hi`.
    pub fn inside(&self, lo: u64, hi: u64) -> Option<u64> {
        let i = self.targets.partition_point(|&r| r <= lo);
        self.targets.get(i).copied().filter(|&r| r < hi)
    }

    /// Some dynamic relocation writing at an address in `lo..hi`.
    pub fn written_in(&self, lo: u64, hi: u64) -> Option<u64> {
        let i = self.written.partition_point(|&r| r < lo);
        self.written.get(i).copied().filter(|&r| r < hi)
    }
}

const SHF_EXECINSTR: u64 = 4;
const SHF_ALLOC: u64 = 2;
const SHT_PROGBITS: u32 = 1;

pub(crate) fn collect(elf: &weft_symbols::ElfFile) -> Refs {
    let data = elf.data();
    let absolute = !elf.is_position_independent();
    let mut out = Vec::new();
    let exec: Vec<(u64, u64)> = elf
        .sections()
        .iter()
        .filter(|s| s.flags & SHF_EXECINSTR != 0 && s.kind == SHT_PROGBITS)
        .map(|s| (s.addr, s.addr + s.size))
        .collect();
    let in_exec = |a: u64| exec.iter().any(|&(lo, hi)| lo <= a && a < hi);
    let mut table_bases = Vec::new();
    let mut written = Vec::new();

    // Code: from every function's start, and a linear sweep of each executable
    // section (resynchronizing after undecodable bytes).
    let mut runs: Vec<(u64, &[u8])> = Vec::new();
    for f in elf.functions() {
        if f.size > 0 {
            if let Ok(bytes) = elf.read_vaddr(f.vaddr, f.size) {
                runs.push((f.vaddr, bytes));
            }
        }
    }
    for s in elf
        .sections()
        .iter()
        .filter(|s| s.flags & SHF_EXECINSTR != 0 && s.kind == SHT_PROGBITS)
    {
        runs.push((s.addr, elf.section_data(s)));
    }
    for (addr, bytes) in runs {
        let mut d = Decoder::with_ip(64, bytes, addr, DecoderOptions::NONE);
        while d.can_decode() {
            let insn = d.decode();
            if insn.is_invalid() {
                // Step one byte past the start of what failed.
                let pos = (insn.ip() - addr + 1) as usize;
                if pos >= bytes.len() {
                    break;
                }
                let _ = d.set_position(pos);
                d.set_ip(addr + pos as u64);
                continue;
            }
            for i in 0..insn.op_count() {
                match insn.op_kind(i) {
                    OpKind::NearBranch16 | OpKind::NearBranch32 | OpKind::NearBranch64 => {
                        out.push(insn.near_branch_target());
                    }
                    OpKind::Memory if insn.memory_base() == Register::RIP => {
                        let t = insn.ip_rel_memory_address();
                        out.push(t);
                        if !in_exec(t) {
                            table_bases.push(t);
                        }
                    }
                    OpKind::Memory if absolute => {
                        out.push(insn.memory_displacement64());
                    }
                    OpKind::Immediate32 | OpKind::Immediate32to64 | OpKind::Immediate64
                        if absolute =>
                    {
                        out.push(insn.immediate(i));
                    }
                    _ => {}
                }
            }
        }
    }

    // Symbols and relocations.
    if let Ok(file) = object::File::parse(data) {
        let table = |syms: object::SymbolIterator<'_, '_>| {
            syms.map(|s| (s.index(), s.address()))
                .collect::<std::collections::HashMap<_, _>>()
        };
        let (stat, dynamic) = (table(file.symbols()), table(file.dynamic_symbols()));
        out.extend(stat.values().chain(dynamic.values()));
        let target = |r: &object::Relocation, syms: &std::collections::HashMap<_, u64>| {
            let base = match r.target() {
                RelocationTarget::Symbol(i) => syms.get(&i).copied().unwrap_or(0),
                _ => 0,
            };
            base.wrapping_add(r.addend() as u64)
        };
        if let Some(relocs) = file.dynamic_relocations() {
            for (at, r) in relocs {
                out.push(target(&r, &dynamic));
                written.push(at);
            }
        }
        for s in file.sections() {
            for (_, r) in s.relocations() {
                out.push(target(&r, &stat));
            }
        }
    }

    // Data: absolute code pointers (non-PIE), PIE jump tables.
    for s in elf
        .sections()
        .iter()
        .filter(|s| s.flags & SHF_ALLOC != 0 && s.flags & SHF_EXECINSTR == 0)
        .filter(|s| s.kind != 8)
    {
        let bytes = elf.section_data(s);
        if absolute {
            let skip = ((8 - s.addr % 8) % 8) as usize;
            for w in bytes.get(skip..).unwrap_or(&[]).chunks_exact(8) {
                let v = u64::from_le_bytes(w.try_into().unwrap_or([0; 8]));
                if in_exec(v) {
                    out.push(v);
                }
            }
        }
        for &t in table_bases
            .iter()
            .filter(|&&t| s.addr <= t && t < s.addr + s.size)
        {
            let start = (t - s.addr) as usize;
            for w in bytes[start..].chunks_exact(4).take(4096) {
                let e = i32::from_le_bytes(w.try_into().unwrap_or([0; 4]));
                let v = t.wrapping_add(e as i64 as u64);
                if !in_exec(v) {
                    break;
                }
                out.push(v);
            }
        }
    }
    out.push(elf.entry());
    out.sort_unstable();
    out.dedup();
    written.sort_unstable();
    written.dedup();
    Refs {
        targets: out,
        written,
    }
}
