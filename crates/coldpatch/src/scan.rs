//! Finding the `-finstrument-functions` calls: what the instrumentation functions are
//! called through (their own address, PLT stubs, GOT slots), then every function's
//! instructions, decoded with iced-x86.

use std::collections::{BTreeMap, HashMap, HashSet};

use iced_x86::{
    Code, Decoder, DecoderOptions, FlowControl, Instruction, InstructionInfoFactory, OpAccess,
    OpKind, Register,
};
use object::read::elf::{ElfFile64, SectionHeader};
use object::{
    LittleEndian as LE, Object, ObjectSymbol, ObjectSymbolTable, RelocationFlags, RelocationTarget,
};
use weft_symbols::{ElfFile, Function, WeftProbeKind};

use crate::{SkipReason, Skipped};

const ENTER: &str = "__cyg_profile_func_enter";
const EXIT: &str = "__cyg_profile_func_exit";
const PF_X: u32 = 1;

fn kind_of(name: &str) -> Option<WeftProbeKind> {
    match name {
        ENTER => Some(WeftProbeKind::Entry),
        EXIT => Some(WeftProbeKind::Exit),
        _ => None,
    }
}

/// Where the instrumentation functions can be reached from.
#[derive(Debug, Default)]
pub(crate) struct Targets {
    /// Addresses a direct `call`/`jmp` reaches them at: their definitions in this
    /// file, and the PLT stubs that jump through their GOT slots.
    pub direct: HashMap<u64, WeftProbeKind>,
    /// GOT slots holding their addresses (`call *slot(%rip)` with -fno-plt).
    pub slots: HashMap<u64, WeftProbeKind>,
    /// The address of a definition that is both functions (static glibc aliases
    /// them): calls to it cannot be told apart.
    pub aliased: Option<u64>,
}

impl Targets {
    pub fn is_empty(&self) -> bool {
        self.direct.is_empty() && self.slots.is_empty() && self.aliased.is_none()
    }

    /// Finds the instrumentation functions' addresses, PLT stubs and GOT slots.
    pub fn find(elf: &ElfFile) -> Targets {
        let mut t = Targets::default();
        for f in elf.functions() {
            let mut kinds = f.names.iter().filter_map(|n| kind_of(&n.raw));
            match (kinds.next(), kinds.next()) {
                (Some(a), Some(b)) if a != b => t.aliased = Some(f.vaddr),
                (Some(kind), _) => {
                    t.direct.insert(f.vaddr, kind);
                }
                _ => {}
            }
        }
        t.find_slots(elf);
        t.find_plt_stubs(elf);
        t
    }

    /// GOT slots: dynamic relocations against the functions' symbols (`JUMP_SLOT`,
    /// `GLOB_DAT`, `64`), or `RELATIVE` ones whose value is a definition in this file.
    fn find_slots(&mut self, elf: &ElfFile) {
        let Ok(obj) = ElfFile64::<LE>::parse(elf.data()) else {
            return;
        };
        let Some(relocs) = obj.dynamic_relocations() else {
            return;
        };
        let dynsyms = obj.dynamic_symbol_table();
        for (slot, rel) in relocs {
            let kind = match rel.target() {
                RelocationTarget::Symbol(idx) => dynsyms
                    .as_ref()
                    .and_then(|t| t.symbol_by_index(idx).ok())
                    .and_then(|s| s.name().ok().and_then(kind_of)),
                RelocationTarget::Absolute => match rel.flags() {
                    RelocationFlags::Elf { r_type } if r_type == object::elf::R_X86_64_RELATIVE => {
                        self.direct.get(&(rel.addend() as u64)).copied()
                    }
                    _ => None,
                },
                _ => None,
            };
            if let Some(kind) = kind {
                self.slots.insert(slot, kind);
            }
        }
    }

    /// PLT stubs (`.plt`, `.plt.sec`, `.plt.got`): each `jmp *slot(%rip)` through one
    /// of the slots, entered at the jump or at the `endbr64` just before it.
    fn find_plt_stubs(&mut self, elf: &ElfFile) {
        let Ok(obj) = ElfFile64::<LE>::parse(elf.data()) else {
            return;
        };
        for sec in obj.elf_section_table().iter() {
            let name = obj
                .elf_section_table()
                .section_name(LE, sec)
                .unwrap_or_default();
            let executable = sec.sh_flags(LE) & u64::from(object::elf::SHF_EXECINSTR) != 0;
            if !executable || !name.starts_with(b".plt") && name != b".iplt" {
                continue;
            }
            let Ok(bytes) = sec.data(LE, elf.data()) else {
                continue;
            };
            let mut prev: Option<Instruction> = None;
            let mut decoder = Decoder::with_ip(64, bytes, sec.sh_addr(LE), DecoderOptions::NONE);
            for ins in &mut decoder {
                if ins.code() == Code::Jmp_rm64 && ins.is_ip_rel_memory_operand() {
                    if let Some(&kind) = self.slots.get(&ins.ip_rel_memory_address()) {
                        self.direct.insert(ins.ip(), kind);
                        if let Some(p) =
                            prev.filter(|p| p.code() == Code::Endbr64 && p.next_ip() == ins.ip())
                        {
                            self.direct.insert(p.ip(), kind);
                        }
                    }
                }
                prev = Some(ins);
            }
        }
    }

    /// The slot at `addr` when it holds an instrumentation function's address: a
    /// relocated slot, or (static executables) one whose file content is a definition.
    fn slot(&self, elf: &ElfFile, addr: u64) -> Option<WeftProbeKind> {
        if let Some(&k) = self.slots.get(&addr) {
            return Some(k);
        }
        let word = elf.read_vaddr(addr, 8).ok()?;
        let value = u64::from_le_bytes(word.try_into().ok()?);
        self.direct.get(&value).copied()
    }
}

/// A call (or tail jump) to an instrumentation function, found in `container`.
#[derive(Clone, Debug)]
pub(crate) struct Call {
    pub vaddr: u64,
    pub len: usize,
    pub kind: WeftProbeKind,
    pub tail: bool,
    /// The value the compiler put in %rdi (`this_fn`), when it could be determined.
    pub this_fn: Option<u64>,
    /// The function whose bytes hold the call.
    pub container: u64,
}

/// Decodes every function of `elf` in an executable segment and returns the calls,
/// by address, and the references to the instrumentation functions left alone.
pub(crate) fn scan(elf: &ElfFile, targets: &Targets) -> (BTreeMap<u64, Call>, Vec<Skipped>) {
    let mut calls = BTreeMap::new();
    let mut skipped: BTreeMap<u64, Skipped> = BTreeMap::new();
    let mut info = InstructionInfoFactory::new();
    for f in elf.functions() {
        if f.size == 0 || f.names.iter().any(|n| kind_of(&n.raw).is_some()) || !executable(elf, f) {
            continue;
        }
        let Ok(bytes) = elf.read_vaddr(f.vaddr, f.size) else {
            continue;
        };
        scan_function(elf, targets, f, bytes, &mut info, &mut calls, &mut skipped);
    }
    (calls, skipped.into_values().collect())
}

fn executable(elf: &ElfFile, f: &Function) -> bool {
    elf.segments().iter().any(|s| {
        s.is_load() && s.flags & PF_X != 0 && s.vaddr <= f.vaddr && f.vaddr - s.vaddr < s.filesz
    })
}

fn scan_function(
    elf: &ElfFile,
    targets: &Targets,
    f: &Function,
    bytes: &[u8],
    info: &mut InstructionInfoFactory,
    calls: &mut BTreeMap<u64, Call>,
    skipped: &mut BTreeMap<u64, Skipped>,
) {
    let mut insns = Vec::new();
    let mut decoder = Decoder::with_ip(64, bytes, f.vaddr, DecoderOptions::NONE);
    for ins in &mut decoder {
        if ins.is_invalid() {
            // Data in the code, or a symbol size that is too large: stop here.
            skipped.entry(ins.ip()).or_insert_with(|| Skipped {
                vaddr: ins.ip(),
                function: f.name().to_string(),
                reason: SkipReason::Undecodable,
            });
            break;
        }
        insns.push(ins);
    }
    let leaders: HashSet<u64> = insns
        .iter()
        .filter(|i| {
            matches!(
                i.flow_control(),
                FlowControl::ConditionalBranch | FlowControl::UnconditionalBranch
            )
        })
        .filter_map(near_target)
        .collect();

    for (idx, ins) in insns.iter().enumerate() {
        let found = match (ins.code(), ins.flow_control()) {
            (Code::Call_rel32_64, _) => targets
                .direct
                .get(&ins.near_branch64())
                .map(|&k| (k, false)),
            (Code::Jmp_rel32_64, _) => targets.direct.get(&ins.near_branch64()).map(|&k| (k, true)),
            (Code::Call_rm64, _) if ins.is_ip_rel_memory_operand() => targets
                .slot(elf, ins.ip_rel_memory_address())
                .map(|k| (k, false)),
            (Code::Jmp_rm64, _) if ins.is_ip_rel_memory_operand() => targets
                .slot(elf, ins.ip_rel_memory_address())
                .map(|k| (k, true)),
            _ => None,
        };
        if let Some((kind, tail)) = found {
            if crate::format::placeholder(ins.len(), tail).is_none() {
                skip(skipped, ins, f, SkipReason::UnusualLength(ins.len() as u8));
                continue;
            }
            calls.entry(ins.ip()).or_insert_with(|| Call {
                vaddr: ins.ip(),
                len: ins.len(),
                kind,
                tail,
                this_fn: this_fn(&insns, idx, &leaders, info),
                container: f.vaddr,
            });
            continue;
        }
        // Any other use of the functions' addresses or slots: leave it, and say so.
        if let Some(t) = near_target(ins) {
            if targets.direct.contains_key(&t) {
                let reason = if ins.flow_control() == FlowControl::ConditionalBranch {
                    SkipReason::ConditionalJump
                } else {
                    SkipReason::OtherUse
                };
                skip(skipped, ins, f, reason);
            }
        } else if ins.is_ip_rel_memory_operand() {
            let a = ins.ip_rel_memory_address();
            if targets.slots.contains_key(&a) || targets.direct.contains_key(&a) {
                skip(skipped, ins, f, SkipReason::OtherUse);
            }
        } else if (0..ins.op_count()).any(|i| {
            matches!(
                ins.op_kind(i),
                OpKind::Immediate32 | OpKind::Immediate32to64 | OpKind::Immediate64
            ) && targets.direct.contains_key(&ins.immediate(i))
        }) {
            skip(skipped, ins, f, SkipReason::OtherUse);
        }
    }
}

fn skip(skipped: &mut BTreeMap<u64, Skipped>, ins: &Instruction, f: &Function, reason: SkipReason) {
    skipped.entry(ins.ip()).or_insert_with(|| Skipped {
        vaddr: ins.ip(),
        function: f.name().to_string(),
        reason,
    });
}

fn near_target(ins: &Instruction) -> Option<u64> {
    (0..ins.op_count())
        .any(|i| matches!(ins.op_kind(i), OpKind::NearBranch64))
        .then(|| ins.near_branch64())
}

/// Callee-saved registers (System V): values the compiler keeps across calls.
fn callee_saved(r: Register) -> bool {
    matches!(
        r,
        Register::RBX
            | Register::RBP
            | Register::R12
            | Register::R13
            | Register::R14
            | Register::R15
    )
}

fn writes(info: &mut InstructionInfoFactory, ins: &Instruction, reg: Register) -> bool {
    info.info(ins).used_registers().iter().any(|u| {
        u.register().full_register() == reg
            && matches!(
                u.access(),
                OpAccess::Write
                    | OpAccess::CondWrite
                    | OpAccess::ReadWrite
                    | OpAccess::ReadCondWrite
            )
    })
}

/// What an instruction that writes `reg` puts there.
enum Value {
    Const(u64),
    /// A copy of another register; `narrow`: a 32-bit move (the value must fit).
    Copy {
        from: Register,
        narrow: bool,
    },
    Unknown,
}

fn value_written(ins: &Instruction, reg: Register) -> Value {
    let op0 = ins.op0_register().full_register();
    if ins.op0_kind() != OpKind::Register || op0 != reg {
        return Value::Unknown;
    }
    let reg_src =
        || (ins.op1_kind() == OpKind::Register).then(|| ins.op1_register().full_register());
    match ins.code() {
        Code::Lea_r64_m if ins.memory_base() == Register::RIP => {
            Value::Const(ins.ip_rel_memory_address())
        }
        Code::Mov_r32_imm32 => Value::Const(u64::from(ins.immediate32())),
        Code::Mov_rm64_imm32 => Value::Const(ins.immediate32to64() as u64),
        Code::Mov_r64_imm64 => Value::Const(ins.immediate64()),
        Code::Mov_r64_rm64 | Code::Mov_rm64_r64 => match reg_src() {
            Some(from) => Value::Copy {
                from,
                narrow: false,
            },
            None => Value::Unknown,
        },
        Code::Mov_r32_rm32 | Code::Mov_rm32_r32 => match reg_src() {
            Some(from) => Value::Copy { from, narrow: true },
            None => Value::Unknown,
        },
        _ => Value::Unknown,
    }
}

/// The value of %rdi at the call `insns[at]`: `this_fn`, the instrumented function's
/// address, which the compiler loads with `lea f(%rip)` or `mov $f`, directly or
/// through other registers. Followed backwards through straight-line code (no branch
/// target in between); a callee-saved register not set there is resolved when the
/// function sets it exactly once (epilogue `pop`s aside) to a constant — how -O2 code
/// keeps `this_fn` across a loop. Anything else is unknown.
fn this_fn(
    insns: &[Instruction],
    at: usize,
    leaders: &HashSet<u64>,
    info: &mut InstructionInfoFactory,
) -> Option<u64> {
    let mut want = Register::RDI;
    let mut narrow = false;
    let mut i = at;
    let fits = |v: u64, narrow: bool| (!narrow || v <= u64::from(u32::MAX)).then_some(v);
    while i > 0 && !leaders.contains(&insns[i].ip()) {
        i -= 1;
        let ins = &insns[i];
        match ins.flow_control() {
            FlowControl::Next | FlowControl::ConditionalBranch => {}
            FlowControl::Call | FlowControl::IndirectCall => {
                if callee_saved(want) {
                    continue;
                }
                return None;
            }
            // insns[i + 1] is reached only by jumps we did not follow.
            _ => break,
        }
        if !writes(info, ins, want) {
            continue;
        }
        match value_written(ins, want) {
            Value::Const(v) => return fits(v, narrow),
            Value::Copy { from, narrow: n } => {
                want = from;
                narrow |= n;
            }
            Value::Unknown => return None,
        }
    }
    if !callee_saved(want) {
        return None;
    }
    let mut defs = insns
        .iter()
        .filter(|ins| !matches!(ins.code(), Code::Pop_r64 | Code::Leaveq))
        .filter(|ins| writes(info, ins, want));
    match (defs.next(), defs.next()) {
        (Some(def), None) => match value_written(def, want) {
            Value::Const(v) => fits(v, narrow),
            _ => None,
        },
        _ => None,
    }
}
