//! One probe's advice ([`weft_ir::Function`]) to eBPF instructions.
//!
//! The machine model of `weft-ir` maps onto eBPF this way:
//!
//! * **Registers** live on the eBPF stack, 8 bytes each below `r10` (the verifier
//!   tracks values spilled there exactly, so a loop counter stays bounded); each
//!   instruction loads its operands into `r0`-`r5`, works, and stores the result.
//! * **Slots** live in the per-CPU `scratch` map (a tracing program does not nest on
//!   a CPU), whose value `r9` points to for the whole program: eBPF's stack is 512
//!   bytes, a slot may be kilobytes. The first bytes of the scratch value are a zero
//!   key, temporaries, and a zero value to insert new aggregation entries with.
//! * `r6` keeps the context (the tracepoint's record), `r7`/`r8` are temporaries that
//!   survive calls.
//! * **Maps**: a weft map that kernel probes use is an eBPF map of the same key bytes
//!   (a 4-byte zero key when the map has no key); aggregations are per-CPU and keep
//!   the runtime's accumulator layout ([`MapValue::value_size`]), so weft merges a
//!   CPU's value exactly as it merges a thread's.
//! * **Events** are reserved in the `ring` ring buffer with a
//!   [`weft_abi::EventHeader`] in front, as the agent writes them in its rings.
//! * **Errors** (read faults, full maps, lost events, ...) are counted per CPU in the
//!   `errors` array, by [`ErrorKind`] number.

use weft_ir::{
    AggOp, BinOp, CtxValue, ErrorKind, EventKind, Function, Inst, MapId, MapValue, Place, Program,
    Reg, UnOp,
};

use crate::insn::{helper, Asm, Label, B, DW, H, W};
use crate::insn::{
    ADD, AND, ARSH, DIV, JEQ, JGE, JGT, JLE, JLT, JNE, JSGE, JSGT, JSLE, JSLT, LSH, MOD, MUL, OR,
    R0, R1, R10, R2, R3, R4, R5, R6, R7, R8, R9, RSH, SUB, XOR,
};
use crate::{BpfError, Env, MapRef};

/// Scratch layout: the zero key, temporaries, the zero value, then the slots.
const ZERO_KEY: i16 = 0;
const TMP: i16 = 8;
const TMP2: i16 = 16;
const ERR_KEY: i16 = 24;
/// The address of the user-memory map entry being looked at.
const ENTRY: i16 = 32;
pub(crate) const ZERO_VALUE: u32 = 40;

/// `struct pt_regs` (x86-64): where `orig_ax` and the system call arguments
/// (`di si dx r10 r8 r9`) are saved.
const PT_REGS_ORIG_AX: i32 = 120;
const PT_REGS_ARGS: [i32; 6] = [112, 104, 96, 56, 72, 64];
/// A function's integer arguments (`di si dx cx r8 r9`), for uprobes.
const PT_REGS_CALL_ARGS: [i16; 6] = [112, 104, 96, 88, 72, 64];
const PT_REGS_AX: i16 = 80;
const PT_REGS_IP: i16 = 128;
const PT_REGS_SP: i16 = 152;

/// Where `struct pt_regs` saves machine register `r`.
fn pt_regs_offset(r: weft_ir::MachineReg) -> i16 {
    use weft_ir::MachineReg as M;
    match r {
        M::R15 => 0,
        M::R14 => 8,
        M::R13 => 16,
        M::R12 => 24,
        M::Rbp => 32,
        M::Rbx => 40,
        M::R11 => 48,
        M::R10 => 56,
        M::R9 => 64,
        M::R8 => 72,
        M::Rax => 80,
        M::Rcx => 88,
        M::Rdx => 96,
        M::Rsi => 104,
        M::Rdi => 112,
        M::Rip => 128,
        M::Flags => 144,
        M::Rsp => 152,
    }
}

/// Most entries a read of a user-space map looks at (linear probing from the
/// key's slot; the runtime keeps tables at most half full).
const USER_PROBES: u32 = 16;

/// Most registers kept on the stack (8 bytes each; eBPF's stack is 512 bytes).
const MAX_STACK_REGS: u32 = 60;
/// Largest scratch value: a per-CPU map's value is at most 32 KiB.
pub const MAX_SCRATCH: u32 = 32 * 1024;

const BPF_ANY: i32 = 0;
/// `bpf_get_stack`: the user stack, not the kernel's.
const BPF_F_USER_STACK: i64 = 1 << 8;
const BPF_NOEXIST: i32 = 1;

/// The instructions of one program and the maps its loads name.
pub struct Code {
    pub insns: Vec<crate::insn::Insn>,
    pub maps: Vec<(usize, MapRef)>,
    /// Bytes of scratch it needs.
    pub scratch: u32,
}

struct Gen<'a> {
    a: Asm<MapRef>,
    /// Scratch offset of the buffer for keys read from user memory.
    key_buf: u32,
    prog: &'a Program,
    env: &'a Env,
    slot_off: Vec<u32>,
    labels: Vec<Label>,
    out: Label,
}

type R = Result<(), BpfError>;

fn unsupported(what: &'static str) -> BpfError {
    BpfError::Unsupported(what)
}

/// Compile `f` (a kernel probe's advice).
pub fn compile(f: &Function, prog: &Program, env: &Env) -> Result<Code, BpfError> {
    if f.regs > MAX_STACK_REGS {
        return Err(BpfError::TooManyRegs(f.regs, MAX_STACK_REGS));
    }
    let mut slot_off = Vec::with_capacity(f.slots.len());
    let key_buf = ZERO_VALUE + env.zero_value;
    let mut off = key_buf + env.key_buf;
    for &s in &f.slots {
        slot_off.push(off);
        off = off.saturating_add(s);
    }
    if off > MAX_SCRATCH {
        return Err(BpfError::FrameTooLarge(off, MAX_SCRATCH));
    }
    let mut a = Asm::new();
    let labels = (0..f.labels).map(|_| a.label()).collect();
    let out = a.label();
    let mut g = Gen {
        a,
        key_buf,
        prog,
        env,
        slot_off,
        labels,
        out,
    };
    g.prologue(f.regs);
    // Only what can run: the verifier refuses unreachable instructions (the code
    // after an `exit()`'s return, say).
    let live = reachable(&f.code);
    for (inst, _) in f.code.iter().zip(&live).filter(|(_, &l)| l) {
        g.inst(inst)?;
    }
    g.a.bind(g.out);
    g.a.mov_imm(R0, 0);
    g.a.exit();
    let (insns, maps) = g.a.finish().map_err(|_| BpfError::TooLong)?;
    Ok(Code {
        insns,
        maps,
        scratch: off,
    })
}

/// Which instructions of `code` some path from its start reaches.
fn reachable(code: &[Inst]) -> Vec<bool> {
    let at: std::collections::HashMap<u32, usize> = code
        .iter()
        .enumerate()
        .filter_map(|(i, inst)| match inst {
            Inst::Label(l) => Some((l.0, i)),
            _ => None,
        })
        .collect();
    let mut live = vec![false; code.len()];
    let mut todo = vec![0usize];
    while let Some(mut i) = todo.pop() {
        while i < code.len() && !live[i] {
            live[i] = true;
            match &code[i] {
                Inst::Jump(l) => {
                    todo.extend(at.get(&l.0));
                    break;
                }
                Inst::Branch {
                    if_true, if_false, ..
                } => {
                    todo.extend(at.get(&if_true.0));
                    todo.extend(at.get(&if_false.0));
                    break;
                }
                Inst::Return => break,
                _ => i += 1,
            }
        }
    }
    live
}

/// The pid filter: leave for `out` unless the current process (tgid, saved at
/// `r10 - 8`) is in one of the two bitmaps, `weft_pids` (weft's: the members) or
/// `weft_forked` (the fork program's: their children), a bit per pid in u64 words.
/// Array lookups, which the verifier turns into a few loads: a process outside the
/// session pays a handful of instructions.
fn pid_filter(a: &mut Asm<MapRef>, out: Label) {
    let member = a.label();
    a.call(helper::GET_CURRENT_PID_TGID);
    a.alu_imm(RSH, R0, 32);
    a.store(W, R10, -8, R0);
    a.alu_imm(RSH, R0, 6);
    a.store(W, R10, -4, R0);
    for (i, map) in [MapRef::Pids, MapRef::Forked].into_iter().enumerate() {
        let next = a.label();
        a.load_map(R1, map);
        a.mov(R2, R10);
        a.alu_imm(ADD, R2, -4);
        a.call(helper::MAP_LOOKUP_ELEM);
        a.jmp_imm(JEQ, R0, 0, if i == 0 { next } else { out });
        a.load(DW, R1, R0, 0);
        a.load(W, R2, R10, -8);
        a.alu_imm(AND, R2, 63);
        a.alu(RSH, R1, R2);
        a.alu_imm(AND, R1, 1);
        a.jmp_imm(JNE, R1, 0, member);
        a.bind(next);
    }
    a.ja(out);
    a.bind(member);
}

/// `r0` = the address of the current process's word of `weft_handed` (to `miss`
/// when there is none), `r7` = the index of its bit in that word.
fn handed_word(a: &mut Asm<MapRef>, miss: Label) {
    a.call(helper::GET_CURRENT_PID_TGID);
    a.alu_imm(RSH, R0, 32);
    a.mov(R7, R0);
    a.alu_imm(RSH, R0, 6);
    a.store(W, R10, -4, R0);
    a.load_map(R1, MapRef::Handed);
    a.mov(R2, R10);
    a.alu_imm(ADD, R2, -4);
    a.call(helper::MAP_LOOKUP_ELEM);
    a.jmp_imm(JEQ, R0, 0, miss);
    a.alu_imm(AND, R7, 63);
}

/// A uprobe program's second test: leave for `out` once the current process's agent
/// has started (its bit in `weft_handed`, which [`handover_program`] sets): from
/// there on its own trampolines count, and the agent's start-up is not the
/// program's.
fn handed_check(a: &mut Asm<MapRef>, out: Label) {
    let go_on = a.label();
    handed_word(a, go_on);
    a.load(DW, R1, R0, 0);
    a.alu(RSH, R1, R7);
    a.alu_imm(AND, R1, 1);
    a.jmp_imm(JNE, R1, 0, out);
    a.bind(go_on);
}

/// The handover program, on a uprobe at the agent's initializer in a launched
/// process: sets the process's bit in `weft_handed`, so the uprobe programs that ran
/// the user's probes since `exec` leave from now on (the agent's trampolines take
/// over once weft has woven them, before the program goes on).
pub fn handover_program() -> Result<Code, BpfError> {
    let mut a: Asm<MapRef> = Asm::new();
    let out = a.label();
    handed_word(&mut a, out);
    a.mov_imm(R1, 1);
    a.alu(LSH, R1, R7);
    a.atomic_or(R0, 0, R1);
    a.bind(out);
    a.mov_imm(R0, 0);
    a.exit();
    let (insns, maps) = a.finish().map_err(|_| BpfError::TooLong)?;
    Ok(Code {
        insns,
        maps,
        scratch: 8,
    })
}

/// The pid filter's program on `sched_process_fork`: a process in the filter that
/// starts another puts it in the filter too, with its segment's address
/// (`child_off`: the child's pid in the record). It runs in the parent.
pub fn fork_program(child_off: u32) -> Result<Code, BpfError> {
    let off = i16::try_from(child_off).map_err(|_| BpfError::Bad("child_pid offset".into()))?;
    let mut a: Asm<MapRef> = Asm::new();
    let out = a.label();
    a.mov(R6, R1);
    pid_filter(&mut a, out);
    // The child's bit in weft_forked, atomically (CPUs fork at once).
    a.load(W, R7, R6, off);
    a.mov(R1, R7);
    a.alu_imm(RSH, R1, 6);
    a.store(W, R10, -12, R1);
    a.load_map(R1, MapRef::Forked);
    a.mov(R2, R10);
    a.alu_imm(ADD, R2, -12);
    a.call(helper::MAP_LOOKUP_ELEM);
    a.jmp_imm(JEQ, R0, 0, out);
    a.mov(R2, R7);
    a.alu_imm(AND, R2, 63);
    a.mov_imm(R1, 1);
    a.alu(LSH, R1, R2);
    a.atomic_or(R0, 0, R1);
    a.store(W, R10, -16, R7);
    // And where the segment is: a forked child maps it where its parent did.
    a.load_map(R1, MapRef::Segments);
    a.mov(R2, R10);
    a.alu_imm(ADD, R2, -8);
    a.call(helper::MAP_LOOKUP_ELEM);
    a.jmp_imm(JEQ, R0, 0, out);
    a.mov(R3, R0);
    a.load_map(R1, MapRef::Segments);
    a.mov(R2, R10);
    a.alu_imm(ADD, R2, -16);
    a.mov_imm(R4, i64::from(BPF_ANY));
    a.call(helper::MAP_UPDATE_ELEM);
    a.bind(out);
    a.mov_imm(R0, 0);
    a.exit();
    let (insns, maps) = a.finish().map_err(|_| BpfError::TooLong)?;
    Ok(Code {
        insns,
        maps,
        scratch: 8,
    })
}

fn reg_off(r: Reg) -> i16 {
    -8 * (r.0 as i16 + 1)
}

impl Gen<'_> {
    fn prologue(&mut self, regs: u32) {
        let a = &mut self.a;
        a.mov(R6, R1);
        if let Some(raw) = self.env.raw_syscall {
            // The system call's number first: every other one leaves at once.
            if raw.exit {
                // sys_exit's arguments: (regs, ret); the number is regs->orig_ax.
                a.mov(R1, R10);
                a.alu_imm(ADD, R1, -16);
                a.mov_imm(R2, 8);
                a.load(DW, R3, R6, 0);
                a.alu_imm(ADD, R3, PT_REGS_ORIG_AX);
                a.call(helper::PROBE_READ_KERNEL);
                a.jmp_imm(JNE, R0, 0, self.out);
                a.load(DW, R1, R10, -16);
            } else {
                // sys_enter's arguments: (regs, id).
                a.load(DW, R1, R6, 8);
            }
            a.jmp_imm(JNE, R1, raw.nr as i32, self.out);
        }
        if self.env.filter_pids {
            pid_filter(a, self.out);
        }
        if self.env.uprobe.is_some() {
            handed_check(a, self.out);
        }
        a.store_imm(W, R10, -8, 0);
        a.load_map(R1, MapRef::Scratch);
        a.mov(R2, R10);
        a.alu_imm(ADD, R2, -8);
        a.call(helper::MAP_LOOKUP_ELEM);
        a.jmp_imm(JEQ, R0, 0, self.out);
        a.mov(R9, R0);
        for i in 0..regs {
            a.store_imm(DW, R10, reg_off(Reg(i)), 0);
        }
    }

    // ---- operands ------------------------------------------------------------

    fn ld(&mut self, dst: u8, r: Reg) {
        self.a.load(DW, dst, R10, reg_off(r));
    }

    fn st(&mut self, r: Reg, src: u8) {
        self.a.store(DW, R10, reg_off(r), src);
    }

    fn poff(&self, p: Place) -> Result<i16, BpfError> {
        let off = self.slot_off[p.slot.0 as usize] + p.off;
        i16::try_from(off).map_err(|_| BpfError::FrameTooLarge(off, MAX_SCRATCH))
    }

    /// `dst = &place` (in the scratch value).
    fn place_ptr(&mut self, dst: u8, p: Place) -> R {
        let off = self.poff(p)?;
        self.a.mov(dst, R9);
        self.a.alu_imm(ADD, dst, i32::from(off));
        Ok(())
    }

    fn key_ptr(&mut self, dst: u8, key: Option<Place>) -> R {
        match key {
            Some(p) => self.place_ptr(dst, p),
            None => {
                self.a.mov(dst, R9);
                self.a.alu_imm(ADD, dst, i32::from(ZERO_KEY));
                Ok(())
            }
        }
    }

    /// Sign- or zero-extend the low `bits` of `r`.
    fn extend(&mut self, r: u8, bits: u8, signed: bool) {
        if bits >= 64 {
            return;
        }
        let sh = 64 - i32::from(bits);
        self.a.alu_imm(LSH, r, sh);
        self.a.alu_imm(if signed { ARSH } else { RSH }, r, sh);
    }

    fn size_code(size: u32) -> Option<u8> {
        Some(match size {
            1 => B,
            2 => H,
            4 => W,
            8 => DW,
            _ => return None,
        })
    }

    fn count_error(&mut self, kind: ErrorKind) {
        let skip = self.a.label();
        self.a.store_imm(W, R9, ERR_KEY, kind as i32);
        self.a.load_map(R1, MapRef::Errors);
        self.a.mov(R2, R9);
        self.a.alu_imm(ADD, R2, i32::from(ERR_KEY));
        self.a.call(helper::MAP_LOOKUP_ELEM);
        self.a.jmp_imm(JEQ, R0, 0, skip);
        self.a.load(DW, R1, R0, 0);
        self.a.alu_imm(ADD, R1, 1);
        self.a.store(DW, R0, 0, R1);
        self.a.bind(skip);
    }

    /// Copy `len` bytes between scratch offsets (or from/to the memory `r0`-`r5`
    /// registers point to, with `from`/`to` as base registers).
    fn copy(&mut self, to: u8, to_off: i16, from: u8, from_off: i16, len: u32) {
        let mut done = 0u32;
        while done < len {
            let n = match len - done {
                8.. => 8,
                4..=7 => 4,
                2..=3 => 2,
                _ => 1,
            };
            let sz = Self::size_code(n).expect("1, 2, 4 or 8");
            let d = done as i16;
            self.a.load(sz, R1, from, from_off + d);
            self.a.store(sz, to, to_off + d, R1);
            done += n;
        }
    }

    fn zero(&mut self, base: u8, off: i16, len: u32) {
        let mut done = 0u32;
        while done < len {
            let n = match len - done {
                8.. => 8,
                4..=7 => 4,
                2..=3 => 2,
                _ => 1,
            };
            let sz = Self::size_code(n).expect("1, 2, 4 or 8");
            self.a.store_imm(sz, base, off + done as i16, 0);
            done += n;
        }
    }

    fn map_of(&self, m: MapId) -> Result<&MapValue, BpfError> {
        self.prog
            .maps
            .get(m.0 as usize)
            .map(|d| &d.value)
            .ok_or_else(|| BpfError::Bad(format!("map {} out of range", m.0)))
    }

    // ---- instructions ----------------------------------------------------------

    fn inst(&mut self, inst: &Inst) -> R {
        match inst {
            Inst::Label(l) => self.a.bind(self.labels[l.0 as usize]),
            Inst::Jump(l) => self.a.ja(self.labels[l.0 as usize]),
            Inst::Branch {
                cond,
                if_true,
                if_false,
            } => {
                self.ld(R1, *cond);
                self.a.jmp_imm(JNE, R1, 0, self.labels[if_true.0 as usize]);
                self.a.ja(self.labels[if_false.0 as usize]);
            }
            Inst::Return => self.a.ja(self.out),
            Inst::AroundEnter
            | Inst::Proceed { .. }
            | Inst::AroundReturn { .. }
            | Inst::Override { .. }
            | Inst::SetArg { .. }
            | Inst::SetDataNew { .. } => {
                return Err(unsupported(
                    "around advice, override and `new =` (they change a user-space program)",
                ))
            }
            Inst::Const { dst, value } => {
                self.a.mov_imm(R0, *value);
                self.st(*dst, R0);
            }
            Inst::Mov { dst, src } => {
                self.ld(R0, *src);
                self.st(*dst, R0);
            }
            Inst::Binary { op, dst, a, b } => self.binary(*op, *dst, *a, *b),
            Inst::Unary { op, dst, a } => {
                self.ld(R0, *a);
                match op {
                    UnOp::Neg => self.a.neg(R0),
                    UnOp::Not => self.a.alu_imm(XOR, R0, -1),
                    UnOp::LNot => {
                        let z = self.a.label();
                        self.a.mov(R1, R0);
                        self.a.mov_imm(R0, 1);
                        self.a.jmp_imm(JEQ, R1, 0, z);
                        self.a.mov_imm(R0, 0);
                        self.a.bind(z);
                    }
                    UnOp::Bswap(bits) => self.a.bswap(R0, i32::from(*bits)),
                }
                self.st(*dst, R0);
            }
            Inst::Extend {
                dst,
                src,
                bits,
                signed,
            } => {
                self.ld(R0, *src);
                self.extend(R0, *bits, *signed);
                self.st(*dst, R0);
            }
            Inst::Ctx { dst, value } => {
                self.ctx(*value)?;
                self.st(*dst, R0);
            }
            Inst::Load {
                dst,
                addr,
                size,
                signed,
            } => {
                let sz = Self::size_code(u32::from(*size))
                    .ok_or_else(|| BpfError::Bad(format!("load of {size} bytes")))?;
                let (ok, done) = (self.a.label(), self.a.label());
                for h in [helper::PROBE_READ_USER, helper::PROBE_READ_KERNEL] {
                    self.a.mov(R1, R9);
                    self.a.alu_imm(ADD, R1, i32::from(TMP));
                    self.a.mov_imm(R2, i64::from(*size));
                    self.ld(R3, *addr);
                    self.a.call(h);
                    self.a.jmp_imm(JEQ, R0, 0, ok);
                }
                self.count_error(ErrorKind::ReadFault);
                self.a.mov_imm(R0, 0);
                self.a.ja(done);
                self.a.bind(ok);
                self.a.load(sz, R0, R9, TMP);
                if *signed {
                    self.extend(R0, size * 8, true);
                }
                self.a.bind(done);
                self.st(*dst, R0);
            }
            Inst::CountError(k) => self.count_error(*k),
            Inst::EventField {
                dst,
                off,
                size,
                signed,
            } if self.env.raw_syscall.is_some() => self.raw_field(*dst, *off, *size, *signed)?,
            Inst::EventField {
                dst,
                off,
                size,
                signed,
            } => {
                let sz = Self::size_code(u32::from(*size))
                    .ok_or_else(|| BpfError::Bad(format!("event field of {size} bytes")))?;
                let off = i16::try_from(*off).map_err(|_| BpfError::Bad("field offset".into()))?;
                if off < 8 {
                    self.common_field(off)?;
                } else {
                    self.a.load(sz, R0, R6, off);
                }
                if *signed {
                    self.extend(R0, size * 8, true);
                }
                self.st(*dst, R0);
            }
            Inst::EventBytes { .. } | Inst::EventDataLoc { .. }
                if self.env.raw_syscall.is_some() =>
            {
                return Err(unsupported("a record field on the raw system call path"))
            }
            Inst::EventBytes { dst, off, len } => {
                self.place_ptr(R1, *dst)?;
                self.a.mov_imm(R2, i64::from(*len));
                self.a.mov(R3, R6);
                self.a.alu_imm(ADD, R3, *off as i32);
                self.a.call(helper::PROBE_READ_KERNEL);
                let ok = self.a.label();
                self.a.jmp_imm(JEQ, R0, 0, ok);
                self.count_error(ErrorKind::ReadFault);
                self.a.bind(ok);
            }
            Inst::EventDataLoc { dst, off, cap } => {
                if *cap == 0 {
                    return Ok(());
                }
                let p = self.poff(*dst)?;
                self.zero(R9, p, *cap);
                let off = i16::try_from(*off).map_err(|_| BpfError::Bad("field offset".into()))?;
                let (fits, ok) = (self.a.label(), self.a.label());
                self.a.load(W, R3, R6, off);
                self.a.mov(R2, R3);
                self.a.alu_imm(RSH, R2, 16);
                self.a.alu_imm(AND, R3, 0xffff);
                self.a.jmp_imm(JLE, R2, (*cap - 1) as i32, fits);
                self.a.mov_imm(R2, i64::from(*cap - 1));
                self.a.bind(fits);
                self.a.mov(R4, R6);
                self.a.alu(ADD, R4, R3);
                self.a.mov(R3, R4);
                self.place_ptr(R1, *dst)?;
                self.a.call(helper::PROBE_READ_KERNEL);
                self.a.jmp_imm(JEQ, R0, 0, ok);
                self.count_error(ErrorKind::ReadFault);
                self.a.bind(ok);
            }
            Inst::Store { place, src, size } => {
                let sz = Self::size_code(u32::from(*size))
                    .ok_or_else(|| BpfError::Bad(format!("store of {size} bytes")))?;
                let off = self.poff(*place)?;
                self.ld(R1, *src);
                self.a.store(sz, R9, off, R1);
            }
            Inst::LoadSlot {
                dst,
                place,
                size,
                signed,
            } => {
                let sz = Self::size_code(u32::from(*size))
                    .ok_or_else(|| BpfError::Bad(format!("load of {size} bytes")))?;
                let off = self.poff(*place)?;
                self.a.load(sz, R0, R9, off);
                if *signed {
                    self.extend(R0, size * 8, true);
                }
                self.st(*dst, R0);
            }
            Inst::Copy { dst, src, len } => {
                let (d, s) = (self.poff(*dst)?, self.poff(*src)?);
                self.copy(R9, d, R9, s, *len);
            }
            Inst::Zero { place, len } => {
                let off = self.poff(*place)?;
                self.zero(R9, off, *len);
            }
            Inst::SetBytes { place, bytes, len } => {
                let off = self.poff(*place)?;
                self.zero(R9, off, *len);
                for (i, b) in bytes.iter().enumerate().take(*len as usize) {
                    if *b != 0 {
                        self.a.store_imm(B, R9, off + i as i16, i32::from(*b));
                    }
                }
            }
            Inst::AddrOf { dst, place } => {
                self.place_ptr(R0, *place)?;
                self.st(*dst, R0);
            }
            Inst::ReadStr {
                dst,
                addr,
                max,
                cap,
            } => self.read_str(*dst, *addr, *max, *cap)?,
            Inst::ReadBuf {
                dst,
                addr,
                len,
                cap,
            } => {
                let off = self.poff(*dst)?;
                self.zero(R9, off, cap + 4);
                let (fits, ok, done) = (self.a.label(), self.a.label(), self.a.label());
                self.ld(R7, *len);
                self.a.jmp_imm(JLE, R7, *cap as i32, fits);
                self.a.mov_imm(R7, i64::from(*cap));
                self.a.bind(fits);
                self.a.mov(R1, R9);
                self.a.alu_imm(ADD, R1, i32::from(off) + 4);
                self.a.mov(R2, R7);
                self.ld(R3, *addr);
                self.a.call(helper::PROBE_READ_USER);
                self.a.jmp_imm(JEQ, R0, 0, ok);
                self.count_error(ErrorKind::ReadFault);
                self.a.ja(done);
                self.a.bind(ok);
                self.a.store(W, R9, off, R7);
                self.a.bind(done);
            }
            Inst::Comm { dst, cap } => {
                let off = self.poff(*dst)?;
                self.zero(R9, off, *cap);
                self.a.mov(R1, R9);
                self.a.alu_imm(ADD, R1, i32::from(off));
                self.a.mov_imm(R2, i64::from((*cap).min(16)));
                self.a.call(helper::GET_CURRENT_COMM);
            }
            Inst::StrEq { dst, a, b, len } => self.str_eq(*dst, *a, *b, *len, true, true)?,
            Inst::StrCmp { dst, a, b, len } => self.str_eq(*dst, *a, *b, *len, true, false)?,
            Inst::BytesEq { dst, a, b, len } => self.str_eq(*dst, *a, *b, *len, false, true)?,
            Inst::MapLoad {
                map,
                key,
                dst_reg,
                dst_place,
            } => self.map_load(*map, *key, *dst_reg, *dst_place)?,
            Inst::MapStore {
                map,
                key,
                src_reg,
                src_place,
            } => {
                self.key_ptr(R2, *key)?;
                match (src_reg, src_place) {
                    (Some(r), _) => {
                        self.ld(R3, *r);
                        self.a.store(DW, R9, TMP, R3);
                        self.a.mov(R3, R9);
                        self.a.alu_imm(ADD, R3, i32::from(TMP));
                    }
                    (None, Some(p)) => self.place_ptr(R3, *p)?,
                    (None, None) => return Err(BpfError::Bad("map store without value".into())),
                }
                self.a.load_map(R1, MapRef::Map(map.0));
                self.a.mov_imm(R4, i64::from(BPF_ANY));
                self.a.call(helper::MAP_UPDATE_ELEM);
                let ok = self.a.label();
                self.a.jmp_imm(JEQ, R0, 0, ok);
                self.count_error(ErrorKind::MapFull);
                self.a.bind(ok);
            }
            Inst::MapAgg { map, key, op } => self.map_agg(*map, *key, *op)?,
            Inst::MapDelete { map, key, dst } => {
                if key.is_none() && self.map_of(*map)?.is_aggregation() {
                    return Err(unsupported("delete() of an aggregation without a key"));
                }
                self.a.load_map(R1, MapRef::Map(map.0));
                self.key_ptr(R2, *key)?;
                self.a.call(helper::MAP_DELETE_ELEM);
                if let Some(d) = dst {
                    self.set_bool(R0, JEQ, 0);
                    self.st(*d, R0);
                }
            }
            Inst::MapHasKey { dst, map, key } => {
                if let Some(u) = self.env.user_maps.get(&map.0).copied() {
                    return self.user_map_read(u, Some(*key), None, None, Some(*dst));
                }
                self.a.load_map(R1, MapRef::Map(map.0));
                self.key_ptr(R2, Some(*key))?;
                self.a.call(helper::MAP_LOOKUP_ELEM);
                self.set_bool(R0, JNE, 0);
                self.st(*dst, R0);
            }
            Inst::Emit { kind, payload, len } => self.emit(*kind, *payload, *len)?,
            Inst::Signal { sig } => {
                self.ld(R1, *sig);
                self.a.call(helper::SEND_SIGNAL_THREAD);
            }
            Inst::PComm { .. } => return Err(unsupported("pcomm")),
            Inst::FuncName { .. } => return Err(unsupported("func")),
            Inst::StrContains { dst, a, b, len } => self.str_contains(*dst, *a, *b, *len)?,
            Inst::StrOrder { .. } => return Err(unsupported("ordering strings")),
            Inst::IntToStr { .. } => return Err(unsupported("an integer as a string")),
            Inst::UStack { dst, depth } => {
                // The user stack of the thread that made the event.
                let off = self.poff(*dst)?;
                self.zero(R9, off, depth * 8 + 8);
                let (got, done) = (self.a.label(), self.a.label());
                self.a.mov(R1, R6);
                self.a.mov(R2, R9);
                self.a.alu_imm(ADD, R2, i32::from(off) + 8);
                self.a.mov_imm(R3, i64::from(depth * 8));
                self.a.mov_imm(R4, BPF_F_USER_STACK);
                self.a.call(helper::GET_STACK);
                self.a.jmp_imm(JSGT, R0, 0, got);
                self.a.ja(done);
                self.a.bind(got);
                self.a.alu_imm(RSH, R0, 3);
                self.a.store(DW, R9, off, R0);
                self.a.bind(done);
            }
            Inst::SymbolAddr { .. } => return Err(unsupported("uaddr()")),
            Inst::ThreadSum { .. } => return Err(unsupported("per-thread state (cflow)")),
            Inst::MapLen { .. } => return Err(unsupported("len() of a map")),
            Inst::MapIterStart { .. } | Inst::MapIterNext { .. } => {
                return Err(unsupported("for over a map"))
            }
            Inst::StoreTarget { .. } => return Err(unsupported("writing user memory")),
        }
        Ok(())
    }

    /// The record's common fields (its first 8 bytes) are not the program's to read
    /// (the kernel keeps other data there for eBPF): `common_pid` is the current
    /// thread's id, as the record would hold it; the others are refused.
    fn common_field(&mut self, off: i16) -> R {
        if off != 4 {
            return Err(unsupported(
                "reading common_type, common_flags or common_preempt_count",
            ));
        }
        self.a.call(helper::GET_CURRENT_PID_TGID);
        self.a.alu_imm(LSH, R0, 32);
        self.a.alu_imm(RSH, R0, 32);
        Ok(())
    }

    /// A field of a `syscalls:` record, on the raw path: `__syscall_nr` (8), the
    /// arguments (16, 24, ...: `di si dx r10 r8 r9` of the saved registers) or
    /// `ret` (16 at exit). The common fields are the record's only: refused (the
    /// probe then takes the perf path).
    fn raw_field(&mut self, dst: Reg, off: u32, size: u8, signed: bool) -> R {
        let raw = self.env.raw_syscall.expect("raw path");
        match (off, raw.exit) {
            (4, _) => self.common_field(4)?,
            (8, _) => self.a.mov_imm(R0, i64::from(raw.nr)),
            (16, true) => self.a.load(DW, R0, R6, 8),
            (16..=56, false) if off.is_multiple_of(8) => {
                let reg = PT_REGS_ARGS[(off as usize - 16) / 8];
                self.a.mov(R1, R9);
                self.a.alu_imm(ADD, R1, i32::from(TMP));
                self.a.mov_imm(R2, 8);
                self.a.load(DW, R3, R6, 0);
                self.a.alu_imm(ADD, R3, reg);
                self.a.call(helper::PROBE_READ_KERNEL);
                self.a.load(DW, R0, R9, TMP);
            }
            _ => return Err(unsupported("this field on the raw system call path")),
        }
        if size < 8 {
            self.extend(R0, size * 8, signed);
        }
        self.st(dst, R0);
        Ok(())
    }

    /// `r = (r OP imm)` as 0 or 1.
    fn set_bool(&mut self, r: u8, op: u8, imm: i32) {
        let t = self.a.label();
        self.a.mov(R1, r);
        self.a.mov_imm(r, 1);
        self.a.jmp_imm(op, R1, imm, t);
        self.a.mov_imm(r, 0);
        self.a.bind(t);
    }

    fn binary(&mut self, op: BinOp, dst: Reg, a: Reg, b: Reg) {
        self.ld(R0, a);
        self.ld(R1, b);
        let alu = |op: BinOp| -> Option<u8> {
            Some(match op {
                BinOp::Add => ADD,
                BinOp::Sub => SUB,
                BinOp::Mul => MUL,
                BinOp::And => AND,
                BinOp::Or => OR,
                BinOp::Xor => XOR,
                BinOp::Shl => LSH,
                BinOp::ShrS => ARSH,
                BinOp::ShrU => RSH,
                _ => return None,
            })
        };
        let cmp = |op: BinOp| -> Option<u8> {
            Some(match op {
                BinOp::Eq => JEQ,
                BinOp::Ne => JNE,
                BinOp::LtS => JSLT,
                BinOp::LtU => JLT,
                BinOp::LeS => JSLE,
                BinOp::LeU => JLE,
                BinOp::GtS => JSGT,
                BinOp::GtU => JGT,
                BinOp::GeS => JSGE,
                BinOp::GeU => JGE,
                _ => return None,
            })
        };
        if let Some(o) = alu(op) {
            if matches!(op, BinOp::Shl | BinOp::ShrS | BinOp::ShrU) {
                // As x86 shifts: the count's low 6 bits.
                self.a.alu_imm(AND, R1, 63);
            }
            self.a.alu(o, R0, R1);
        } else if let Some(j) = cmp(op) {
            let t = self.a.label();
            self.a.mov(R2, R0);
            self.a.mov_imm(R0, 1);
            self.a.jmp(j, R2, R1, t);
            self.a.mov_imm(R0, 0);
            self.a.bind(t);
        } else {
            // Division: by zero gives 1 (as upstream bpftrace) and counts; signed
            // needs kernel 6.6.
            let (nonzero, done) = (self.a.label(), self.a.label());
            self.a.jmp_imm(JNE, R1, 0, nonzero);
            self.count_error(ErrorKind::DivZero);
            self.a.mov_imm(R0, 1);
            self.a.ja(done);
            self.a.bind(nonzero);
            match op {
                BinOp::DivU => self.a.alu(DIV, R0, R1),
                BinOp::ModU => self.a.alu(MOD, R0, R1),
                BinOp::DivS => self.a.alu_signed(DIV, R0, R1),
                _ => self.a.alu_signed(MOD, R0, R1),
            }
            self.a.bind(done);
        }
        self.st(dst, R0);
    }

    fn ctx(&mut self, v: CtxValue) -> R {
        let a = &mut self.a;
        match v {
            CtxValue::Pid => {
                a.call(helper::GET_CURRENT_PID_TGID);
                a.alu_imm(RSH, R0, 32);
            }
            CtxValue::Tid => {
                a.call(helper::GET_CURRENT_PID_TGID);
                a.alu_imm(LSH, R0, 32);
                a.alu_imm(RSH, R0, 32);
            }
            CtxValue::Uid => {
                a.call(helper::GET_CURRENT_UID_GID);
                a.alu_imm(LSH, R0, 32);
                a.alu_imm(RSH, R0, 32);
            }
            CtxValue::Gid => {
                a.call(helper::GET_CURRENT_UID_GID);
                a.alu_imm(RSH, R0, 32);
            }
            CtxValue::Nsecs => a.call(helper::KTIME_GET_NS),
            CtxValue::Elapsed => {
                a.call(helper::KTIME_GET_NS);
                a.mov_imm(R1, self.env.start_ns as i64);
                a.alu(SUB, R0, R1);
            }
            CtxValue::RealtimeNsecs => {
                a.call(helper::KTIME_GET_NS);
                a.mov_imm(R1, self.env.realtime_offset_ns);
                a.alu(ADD, R0, R1);
            }
            CtxValue::Cpu => a.call(helper::GET_SMP_PROCESSOR_ID),
            CtxValue::NumaId => a.call(helper::GET_NUMA_NODE_ID),
            CtxValue::Rand => a.call(helper::GET_PRANDOM_U32),
            CtxValue::Cpid => a.mov_imm(R0, self.env.cpid as i64),
            CtxValue::ProbeId => a.mov_imm(R0, i64::from(self.env.probe_id)),
            CtxValue::Arg(n) if self.env.uprobe == Some(false) => {
                if let Some(&off) = PT_REGS_CALL_ARGS.get(usize::from(n)) {
                    a.load(DW, R0, R6, off);
                } else {
                    // On the stack: at entry, [rsp] is the return address.
                    let (ok, done) = (a.label(), a.label());
                    a.load(DW, R3, R6, PT_REGS_SP);
                    a.alu_imm(ADD, R3, 8 * (i32::from(n) - 5));
                    a.mov(R1, R9);
                    a.alu_imm(ADD, R1, i32::from(TMP));
                    a.mov_imm(R2, 8);
                    a.call(helper::PROBE_READ_USER);
                    a.jmp_imm(JEQ, R0, 0, ok);
                    self.count_error(ErrorKind::ReadFault);
                    self.a.mov_imm(R0, 0);
                    self.a.ja(done);
                    self.a.bind(ok);
                    self.a.load(DW, R0, R9, TMP);
                    self.a.bind(done);
                }
            }
            CtxValue::Retval if self.env.uprobe == Some(true) => a.load(DW, R0, R6, PT_REGS_AX),
            CtxValue::Reg(r) if self.env.uprobe.is_some() => a.load(DW, R0, R6, pt_regs_offset(r)),
            // At a function's entry the kernel has put `ip` back on the probed
            // instruction before running the handlers.
            CtxValue::FuncAddr | CtxValue::Ip if self.env.uprobe == Some(false) => {
                a.load(DW, R0, R6, PT_REGS_IP)
            }
            CtxValue::Arg(_) => return Err(unsupported("argN")),
            CtxValue::ThreadCpuTime => return Err(unsupported("a thread's CPU time")),
            CtxValue::ThreadRusage(_) => {
                return Err(unsupported("a thread's page faults or context switches"))
            }
            CtxValue::WatchBind => return Err(unsupported("binding a watched address")),
            CtxValue::Retval => return Err(unsupported("retval")),
            CtxValue::Reg(_) => return Err(unsupported("reg()")),
            CtxValue::FuncAddr => return Err(unsupported("func")),
            CtxValue::Ip => return Err(unsupported("the probe's address")),
            CtxValue::ReturnAddress => return Err(unsupported("the return address")),
            CtxValue::DataOld | CtxValue::DataNew => {
                return Err(unsupported("a data probe's value"))
            }
        }
        Ok(())
    }

    fn read_str(&mut self, dst: Place, addr: Reg, max: Option<Reg>, cap: u32) -> R {
        if cap == 0 {
            return Ok(());
        }
        let off = self.poff(dst)?;
        self.zero(R9, off, cap);
        // The helper's size counts the NUL: at most cap - 1 bytes, and `max`.
        self.a.mov_imm(R7, i64::from(cap));
        if let Some(m) = max {
            let fits = self.a.label();
            self.ld(R1, m);
            self.a.jmp_imm(JGE, R1, (cap - 1) as i32, fits);
            self.a.mov(R7, R1);
            self.a.alu_imm(ADD, R7, 1);
            self.a.bind(fits);
        }
        let ok = self.a.label();
        for h in [helper::PROBE_READ_USER_STR, helper::PROBE_READ_KERNEL_STR] {
            self.a.mov(R1, R9);
            self.a.alu_imm(ADD, R1, i32::from(off));
            self.a.mov(R2, R7);
            self.ld(R3, addr);
            self.a.call(h);
            self.a.jmp_imm(JSGE, R0, 0, ok);
        }
        self.count_error(ErrorKind::ReadFault);
        self.a.bind(ok);
        Ok(())
    }

    /// String (stop at NUL) or byte comparison of `len` bytes; `dst` = 1 when equal
    /// (`eq_one`), else the opposite (strncmp's 0 when equal).
    fn str_eq(&mut self, dst: Reg, a: Place, b: Place, len: u32, nul: bool, eq_one: bool) -> R {
        let (pa, pb) = (self.poff(a)?, self.poff(b)?);
        let (eq, ne, done) = (self.a.label(), self.a.label(), self.a.label());
        for i in 0..len as i16 {
            self.a.load(B, R1, R9, pa + i);
            self.a.load(B, R2, R9, pb + i);
            self.a.jmp(JNE, R1, R2, ne);
            if nul {
                self.a.jmp_imm(JEQ, R1, 0, eq);
            }
        }
        self.a.bind(eq);
        self.a.mov_imm(R0, i64::from(eq_one));
        self.a.ja(done);
        self.a.bind(ne);
        self.a.mov_imm(R0, i64::from(!eq_one));
        self.a.bind(done);
        self.st(dst, R0);
        Ok(())
    }

    /// Read a map user-space probes write, in the current process's mapping of
    /// the segment (as `weft_runtime::map::find` does: the key's hash, then linear
    /// probing, at most [`USER_PROBES`] entries). Outside a member process, or when
    /// the key is absent: zero (and `found` 0).
    fn user_map_read(
        &mut self,
        u: crate::UserMap,
        key: Option<Place>,
        dst_reg: Option<Reg>,
        dst_place: Option<Place>,
        found: Option<Reg>,
    ) -> R {
        let (_, value_off, _) = weft_abi::entry_layout(u.key_size, u.value_size);
        let (hit, miss, done) = (self.a.label(), self.a.label(), self.a.label());
        // r8 = the segment's address in this process.
        self.a.call(helper::GET_CURRENT_PID_TGID);
        self.a.alu_imm(RSH, R0, 32);
        self.a.store(W, R9, TMP, R0);
        self.a.load_map(R1, MapRef::Segments);
        self.a.mov(R2, R9);
        self.a.alu_imm(ADD, R2, i32::from(TMP));
        self.a.call(helper::MAP_LOOKUP_ELEM);
        self.a.jmp_imm(JEQ, R0, 0, miss);
        self.a.load(DW, R8, R0, 0);
        self.a.mov_imm(R1, u.table_off as i64);
        self.a.alu(ADD, R8, R1);
        // r7 = the key's hash (never 0 or 1).
        let kp = match key {
            Some(p) => self.poff(p)?,
            None => ZERO_KEY,
        };
        let klen = if key.is_some() { u.key_size } else { 0 };
        self.key_hash(kp, klen);
        self.a.mov(R7, R0);
        // TMP2 = the slot index (a map without a key has its one entry at 0).
        self.a.mov(R1, R7);
        self.a.alu_imm(AND, R1, (u.capacity - 1) as i32);
        if key.is_none() {
            self.a.mov_imm(R1, 0);
        }
        self.a.store(DW, R9, TMP2, R1);
        let kb = i16::try_from(self.key_buf)
            .map_err(|_| BpfError::FrameTooLarge(self.key_buf, MAX_SCRATCH))?;
        let probes = if key.is_none() {
            1
        } else {
            USER_PROBES.min(u.capacity)
        };
        for _ in 0..probes {
            let next = self.a.label();
            // r6 is the context: keep it; the entry's address in r3.
            self.a.load(DW, R3, R9, TMP2);
            self.a.mov_imm(R1, i64::from(u.entry_size));
            self.a.alu(MUL, R3, R1);
            self.a.alu(ADD, R3, R8);
            self.a.store(DW, R9, ENTRY, R3);
            self.a.mov(R1, R9);
            self.a.alu_imm(ADD, R1, i32::from(TMP));
            self.a.mov_imm(R2, 8);
            self.a.call(helper::PROBE_READ_USER);
            self.a.jmp_imm(JNE, R0, 0, miss);
            self.a.load(W, R1, R9, TMP);
            self.a.jmp_imm(
                JEQ,
                R1,
                i32::try_from(weft_abi::ENTRY_EMPTY).unwrap_or(0),
                miss,
            );
            if key.is_some() {
                self.a.load(W, R2, R9, TMP + 4);
                self.a.jmp(JNE, R2, R7, next);
            }
            if klen > 0 {
                self.a.mov(R1, R9);
                self.a.alu_imm(ADD, R1, i32::from(kb));
                self.a.mov_imm(R2, i64::from(klen));
                self.a.load(DW, R3, R9, ENTRY);
                self.a.alu_imm(ADD, R3, 8);
                self.a.call(helper::PROBE_READ_USER);
                self.a.jmp_imm(JNE, R0, 0, miss);
                for i in 0..klen as i16 {
                    self.a.load(B, R1, R9, kb + i);
                    self.a.load(B, R2, R9, kp + i);
                    self.a.jmp(JNE, R1, R2, next);
                }
            }
            // The key's entry: live, or deleted (absent).
            self.a.load(W, R1, R9, TMP);
            self.a.jmp_imm(JEQ, R1, weft_abi::ENTRY_LIVE as i32, hit);
            self.a.ja(miss);
            self.a.bind(next);
            self.a.load(DW, R1, R9, TMP2);
            self.a.alu_imm(ADD, R1, 1);
            self.a.alu_imm(AND, R1, (u.capacity - 1) as i32);
            self.a.store(DW, R9, TMP2, R1);
        }
        self.a.ja(miss);
        self.a.bind(hit);
        // The value.
        let vsize = u.value_size;
        match dst_place {
            Some(p) => {
                let off = self.poff(p)?;
                self.a.mov(R1, R9);
                self.a.alu_imm(ADD, R1, i32::from(off));
            }
            None => {
                self.a.store_imm(DW, R9, TMP, 0);
                self.a.mov(R1, R9);
                self.a.alu_imm(ADD, R1, i32::from(TMP));
            }
        }
        let want = if dst_place.is_some() {
            vsize
        } else {
            vsize.min(8)
        };
        if dst_reg.is_some() || dst_place.is_some() {
            self.a.mov_imm(R2, i64::from(want));
            self.a.load(DW, R3, R9, ENTRY);
            self.a.alu_imm(ADD, R3, value_off as i32);
            self.a.call(helper::PROBE_READ_USER);
        }
        self.a.mov_imm(R0, 1);
        self.a.ja(done);
        self.a.bind(miss);
        if let Some(p) = dst_place {
            let off = self.poff(p)?;
            self.zero(R9, off, vsize);
        }
        self.a.store_imm(DW, R9, TMP, 0);
        self.a.mov_imm(R0, 0);
        self.a.bind(done);
        if let Some(f) = found {
            self.st(f, R0);
        }
        if let Some(r) = dst_reg {
            // A scalar: its low bytes, zero-extended.
            match Self::size_code(vsize.min(8)) {
                Some(sz) if vsize <= 8 => self.a.load(sz, R0, R9, TMP),
                _ => self.a.load(DW, R0, R9, TMP),
            }
            self.st(r, R0);
        }
        Ok(())
    }

    /// `r0 = weft_abi::key_hash(scratch[off .. off + len])` (the key's bytes): the
    /// sum of each 8-byte word (the last one cut to the key's bytes) times its
    /// factor, then the length and the final mix.
    fn key_hash(&mut self, off: i16, len: u32) {
        // The sum in r1, the word in r5, its factor in r0.
        self.a.mov_imm(R1, 0);
        let mut at = 0u32;
        let mut i = 0usize;
        while at < len {
            let n = (len - at).min(8);
            self.a.load(DW, R5, R9, off + at as i16);
            if n < 8 {
                // Only the key's bytes (what follows in the slot is not the key's).
                self.a.alu_imm(LSH, R5, (64 - 8 * n) as i32);
                self.a.alu_imm(RSH, R5, (64 - 8 * n) as i32);
            }
            self.a.mov_imm(R0, weft_abi::key_word_factor(i) as i64);
            self.a.alu(MUL, R5, R0);
            self.a.alu(ADD, R1, R5);
            at += n;
            i += 1;
        }
        self.a.alu_imm(XOR, R1, len as i32);
        for step in 0..2 {
            self.a.mov(R5, R1);
            self.a.alu_imm(RSH, R5, 33);
            self.a.alu(XOR, R1, R5);
            if step == 0 {
                self.a.mov_imm(R5, weft_abi::KEY_HASH_MIX as i64);
                self.a.alu(MUL, R1, R5);
            }
        }
        self.a.alu_imm(LSH, R1, 32);
        self.a.alu_imm(RSH, R1, 32);
        self.a.alu_imm(OR, R1, 2);
        self.a.mov(R0, R1);
    }

    /// `strcontains(a, b)` over strings of at most `len` bytes (as
    /// `weft_h_str_contains`: an empty `b` is found everywhere), by the obvious
    /// nested loop; the verifier bounds both loops by `len`.
    fn str_contains(&mut self, dst: Reg, a: Place, b: Place, len: u32) -> R {
        let (pa, pb) = (self.poff(a)?, self.poff(b)?);
        let len = len as i32;
        let (outer, inner, next, found, not_found, done) = (
            self.a.label(),
            self.a.label(),
            self.a.label(),
            self.a.label(),
            self.a.label(),
            self.a.label(),
        );
        // An empty needle.
        self.a.load(B, R3, R9, pb);
        self.a.jmp_imm(JEQ, R3, 0, found);
        self.a.mov_imm(R7, 0);
        self.a.bind(outer);
        self.a.jmp_imm(JGE, R7, len, not_found);
        self.a.mov(R1, R9);
        self.a.alu(ADD, R1, R7);
        self.a.load(B, R2, R1, pa);
        // The haystack ended.
        self.a.jmp_imm(JEQ, R2, 0, not_found);
        self.a.mov_imm(R8, 0);
        self.a.bind(inner);
        self.a.jmp_imm(JGE, R8, len, found);
        self.a.mov(R1, R9);
        self.a.alu(ADD, R1, R8);
        self.a.load(B, R3, R1, pb);
        self.a.jmp_imm(JEQ, R3, 0, found);
        self.a.mov(R4, R7);
        self.a.alu(ADD, R4, R8);
        self.a.jmp_imm(JGE, R4, len, not_found);
        self.a.mov(R1, R9);
        self.a.alu(ADD, R1, R4);
        self.a.load(B, R5, R1, pa);
        self.a.jmp(JNE, R5, R3, next);
        self.a.alu_imm(ADD, R8, 1);
        self.a.ja(inner);
        self.a.bind(next);
        self.a.alu_imm(ADD, R7, 1);
        self.a.ja(outer);
        self.a.bind(found);
        self.a.mov_imm(R0, 1);
        self.a.ja(done);
        self.a.bind(not_found);
        self.a.mov_imm(R0, 0);
        self.a.bind(done);
        // r8 held a scalar; nothing may take it for a pointer later.
        self.a.mov_imm(R8, 0);
        self.st(dst, R0);
        Ok(())
    }

    fn map_load(
        &mut self,
        map: MapId,
        key: Option<Place>,
        dst_reg: Option<Reg>,
        dst_place: Option<Place>,
    ) -> R {
        let value = self.map_of(map)?.clone();
        if let Some(u) = self.env.user_maps.get(&map.0).copied() {
            return self.user_map_read(u, key, dst_reg, dst_place, None);
        }
        if value.is_aggregation() {
            return self.agg_load(map, key, &value, dst_reg, dst_place);
        }
        let size = value.value_size();
        let (found, done) = (self.a.label(), self.a.label());
        self.a.load_map(R1, MapRef::Map(map.0));
        self.key_ptr(R2, key)?;
        self.a.call(helper::MAP_LOOKUP_ELEM);
        self.a.jmp_imm(JNE, R0, 0, found);
        if let Some(p) = dst_place {
            let off = self.poff(p)?;
            self.zero(R9, off, size);
        }
        self.a.mov_imm(R0, 0);
        self.a.ja(done);
        self.a.bind(found);
        if let Some(p) = dst_place {
            let off = self.poff(p)?;
            self.a.mov(R7, R0);
            self.copy(R9, off, R7, 0, size);
            self.a.mov(R0, R7);
        }
        // A scalar: its low bytes, zero-extended (as the runtime reads them).
        match Self::size_code(size.min(8)) {
            Some(sz) if size <= 8 => self.a.load(sz, R0, R0, 0),
            _ => self.a.mov_imm(R0, 0),
        }
        self.a.bind(done);
        if let Some(r) = dst_reg {
            self.st(r, R0);
        }
        Ok(())
    }

    /// The merged integer value of an aggregation (count, sum, min, max, avg) over
    /// every CPU.
    fn agg_load(
        &mut self,
        map: MapId,
        key: Option<Place>,
        value: &MapValue,
        dst_reg: Option<Reg>,
        dst_place: Option<Place>,
    ) -> R {
        let (signed, kind) = match value {
            MapValue::Count => (false, 0),
            MapValue::Sum { signed } => (*signed, 0),
            MapValue::Min { signed } => (*signed, 1),
            MapValue::Max { signed } => (*signed, 2),
            MapValue::Avg { signed } => (*signed, 3),
            _ => return Err(unsupported("reading a stats, hist or lhist map")),
        };
        self.a.store_imm(DW, R9, TMP, 0);
        self.a.store_imm(DW, R9, TMP2, 0);
        for cpu in 0..self.env.ncpus as i32 {
            let next = self.a.label();
            self.a.load_map(R1, MapRef::Map(map.0));
            self.key_ptr(R2, key)?;
            self.a.mov_imm(R3, i64::from(cpu));
            self.a.call(helper::MAP_LOOKUP_PERCPU_ELEM);
            self.a.jmp_imm(JEQ, R0, 0, next);
            match kind {
                0 => {
                    self.a.load(DW, R1, R0, 0);
                    self.a.load(DW, R2, R9, TMP);
                    self.a.alu(ADD, R2, R1);
                    self.a.store(DW, R9, TMP, R2);
                }
                3 => {
                    self.a.load(DW, R1, R0, 8);
                    self.a.load(DW, R2, R9, TMP);
                    self.a.alu(ADD, R2, R1);
                    self.a.store(DW, R9, TMP, R2);
                    self.a.load(DW, R1, R0, 0);
                    self.a.load(DW, R2, R9, TMP2);
                    self.a.alu(ADD, R2, R1);
                    self.a.store(DW, R9, TMP2, R2);
                }
                _ => {
                    let take = self.a.label();
                    self.a.load(DW, R1, R0, 0);
                    self.a.jmp_imm(JEQ, R1, 0, next);
                    self.a.load(DW, R1, R0, 8);
                    self.a.load(DW, R2, R9, TMP2);
                    self.a.jmp_imm(JEQ, R2, 0, take);
                    self.a.load(DW, R2, R9, TMP);
                    let better = match (kind, signed) {
                        (1, true) => JSLT,
                        (1, false) => JLT,
                        (_, true) => JSGT,
                        (_, false) => JGT,
                    };
                    self.a.jmp(better, R1, R2, take);
                    self.a.ja(next);
                    self.a.bind(take);
                    self.a.store(DW, R9, TMP, R1);
                    self.a.store_imm(DW, R9, TMP2, 1);
                }
            }
            self.a.bind(next);
        }
        self.a.load(DW, R0, R9, TMP);
        if kind == 3 {
            let done = self.a.label();
            self.a.load(DW, R1, R9, TMP2);
            self.a.jmp_imm(JEQ, R1, 0, done);
            if signed {
                self.a.alu_signed(DIV, R0, R1);
            } else {
                self.a.alu(DIV, R0, R1);
            }
            self.a.bind(done);
        }
        if let Some(p) = dst_place {
            let off = self.poff(p)?;
            self.a.store(DW, R9, off, R0);
        }
        if let Some(r) = dst_reg {
            self.st(r, R0);
        }
        Ok(())
    }

    fn map_agg(&mut self, map: MapId, key: Option<Place>, op: AggOp) -> R {
        let value = self.map_of(map)?.clone();
        let words = value.value_size() / 8;
        let (have, done) = (self.a.label(), self.a.label());
        // The value operand first: loading it clobbers nothing we keep.
        let v = match op {
            AggOp::Count => None,
            AggOp::Sum(r)
            | AggOp::Min(r)
            | AggOp::Max(r)
            | AggOp::Avg(r)
            | AggOp::Stats(r)
            | AggOp::Hist(r)
            | AggOp::Lhist(r) => Some(r),
            AggOp::Tseries(_) => return Err(unsupported("tseries()")),
        };
        self.a.load_map(R1, MapRef::Map(map.0));
        self.key_ptr(R2, key)?;
        self.a.call(helper::MAP_LOOKUP_ELEM);
        self.a.jmp_imm(JNE, R0, 0, have);
        if key.is_some() {
            // A new key: insert a zero accumulator, then look it up again.
            self.a.load_map(R1, MapRef::Map(map.0));
            self.key_ptr(R2, key)?;
            self.a.mov(R3, R9);
            self.a.alu_imm(ADD, R3, ZERO_VALUE as i32);
            self.a.mov_imm(R4, i64::from(BPF_NOEXIST));
            self.a.call(helper::MAP_UPDATE_ELEM);
            self.a.load_map(R1, MapRef::Map(map.0));
            self.key_ptr(R2, key)?;
            self.a.call(helper::MAP_LOOKUP_ELEM);
            self.a.jmp_imm(JNE, R0, 0, have);
        }
        self.count_error(ErrorKind::MapFull);
        self.a.ja(done);
        self.a.bind(have);
        self.a.mov(R7, R0);
        if let Some(r) = v {
            self.ld(R3, r);
        }
        let signed = matches!(
            value,
            MapValue::Min { signed: true }
                | MapValue::Max { signed: true }
                | MapValue::Avg { signed: true }
                | MapValue::Stats { signed: true }
        );
        let less = if signed { JSLT } else { JLT };
        match op {
            AggOp::Count => self.bump(0, None),
            AggOp::Sum(_) => self.bump(0, Some(R3)),
            AggOp::Min(_) | AggOp::Max(_) => {
                let (set, inc) = (self.a.label(), self.a.label());
                self.a.load(DW, R1, R7, 0);
                self.a.jmp_imm(JEQ, R1, 0, set);
                self.a.load(DW, R2, R7, 8);
                if matches!(op, AggOp::Min(_)) {
                    self.a.jmp(less, R3, R2, set);
                } else {
                    self.a.jmp(less, R2, R3, set);
                }
                self.a.ja(inc);
                self.a.bind(set);
                self.a.store(DW, R7, 8, R3);
                self.a.bind(inc);
                self.bump(0, None);
            }
            AggOp::Avg(_) | AggOp::Stats(_) => {
                let (setmin, chkmax, setmax, inc) = (
                    self.a.label(),
                    self.a.label(),
                    self.a.label(),
                    self.a.label(),
                );
                self.bump(8, Some(R3));
                self.a.load(DW, R1, R7, 0);
                self.a.jmp_imm(JEQ, R1, 0, setmin);
                self.a.load(DW, R2, R7, 16);
                self.a.jmp(less, R3, R2, setmin);
                self.a.ja(chkmax);
                self.a.bind(setmin);
                self.a.store(DW, R7, 16, R3);
                self.a.bind(chkmax);
                self.a.jmp_imm(JEQ, R1, 0, setmax);
                self.a.load(DW, R2, R7, 24);
                self.a.jmp(less, R2, R3, setmax);
                self.a.ja(inc);
                self.a.bind(setmax);
                self.a.store(DW, R7, 24, R3);
                self.a.bind(inc);
                self.bump(0, None);
            }
            AggOp::Hist(_) => {
                let MapValue::Hist { k } = value else {
                    return Err(BpfError::Bad("hist() into another map".into()));
                };
                self.hist_index(u32::from(k));
                self.bump_index(words);
            }
            AggOp::Lhist(_) => {
                let MapValue::Lhist { min, max, step } = value else {
                    return Err(BpfError::Bad("lhist() into another map".into()));
                };
                self.lhist_index(min, max, step, words);
                self.bump_index(words);
            }
            AggOp::Tseries(_) => unreachable!("refused above"),
        }
        self.a.bind(done);
        Ok(())
    }

    /// `*(u64 *)(r7 + off) += by` (1 without a register).
    fn bump(&mut self, off: i16, by: Option<u8>) {
        self.a.load(DW, R1, R7, off);
        match by {
            Some(r) => self.a.alu(ADD, R1, r),
            None => self.a.alu_imm(ADD, R1, 1),
        }
        self.a.store(DW, R7, off, R1);
    }

    /// Add 1 to word `r2` of the accumulator at `r7` (clamped to `words - 1`).
    fn bump_index(&mut self, words: u32) {
        let ok = self.a.label();
        self.a.jmp_imm(JLT, R2, words as i32, ok);
        self.a.mov_imm(R2, i64::from(words - 1));
        self.a.bind(ok);
        self.a.alu_imm(LSH, R2, 3);
        self.a.mov(R1, R7);
        self.a.alu(ADD, R1, R2);
        self.a.load(DW, R3, R1, 0);
        self.a.alu_imm(ADD, R3, 1);
        self.a.store(DW, R1, 0, R3);
    }

    /// `r2 = weft_abi::hist_index(r3, k)`.
    fn hist_index(&mut self, k: u32) {
        let done = self.a.label();
        let pos = self.a.label();
        self.a.mov_imm(R2, 0);
        self.a.jmp_imm(JSLT, R3, 0, done);
        self.a.mov_imm(R2, 1);
        self.a.jmp_imm(JEQ, R3, 0, done);
        // r4 = floor(log2(r3)), by halving.
        self.a.mov_imm(R4, 0);
        self.a.mov(R5, R3);
        for sh in [32, 16, 8, 4, 2, 1] {
            let skip = self.a.label();
            self.a.mov(R1, R5);
            self.a.alu_imm(RSH, R1, sh);
            self.a.jmp_imm(JEQ, R1, 0, skip);
            self.a.mov(R5, R1);
            self.a.alu_imm(ADD, R4, sh);
            self.a.bind(skip);
        }
        self.a.jmp_imm(JGE, R4, k as i32, pos);
        self.a.mov(R2, R3);
        self.a.alu_imm(ADD, R2, 1);
        self.a.ja(done);
        self.a.bind(pos);
        // sub = (n >> (l - k)) & (2^k - 1); idx = 1 + 2^k + (l - k) * 2^k + sub
        self.a.alu_imm(SUB, R4, k as i32);
        self.a.mov(R5, R3);
        self.a.alu(RSH, R5, R4);
        self.a.alu_imm(AND, R5, (1i32 << k) - 1);
        self.a.mov(R2, R4);
        self.a.alu_imm(LSH, R2, k as i32);
        self.a.alu_imm(ADD, R2, 1 + (1i32 << k));
        self.a.alu(ADD, R2, R5);
        self.a.bind(done);
    }

    /// `r2 = weft_abi::lhist_index(r3, min, max, step)`.
    fn lhist_index(&mut self, min: i64, max: i64, step: i64, words: u32) {
        let done = self.a.label();
        self.a.mov_imm(R2, 0);
        self.a.mov_imm(R4, min);
        self.a.jmp(JSLT, R3, R4, done);
        self.a.mov_imm(R2, i64::from(words - 1));
        self.a.mov_imm(R5, max);
        self.a.jmp(JSGE, R3, R5, done);
        self.a.mov(R2, R3);
        self.a.alu(SUB, R2, R4);
        self.a.mov_imm(R5, step.max(1));
        self.a.alu(DIV, R2, R5);
        self.a.alu_imm(ADD, R2, 1);
        self.a.bind(done);
    }

    fn emit(&mut self, kind: EventKind, payload: Option<Place>, len: u32) -> R {
        let (k, id, args) = kind
            .record()
            .ok_or_else(|| unsupported("function entry and exit records"))?;
        let total = weft_abi::EVENT_HEADER_SIZE + len.div_ceil(8) * 8;
        if total > crate::MAX_EVENT {
            return Err(BpfError::EventTooLarge(total, crate::MAX_EVENT));
        }
        let (got, done) = (self.a.label(), self.a.label());
        self.a.load_map(R1, MapRef::Ring);
        self.a.mov_imm(R2, i64::from(total));
        self.a.mov_imm(R3, 0);
        self.a.call(helper::RINGBUF_RESERVE);
        self.a.jmp_imm(JNE, R0, 0, got);
        self.count_error(ErrorKind::EventLost);
        self.a.ja(done);
        self.a.bind(got);
        self.a.mov(R8, R0);
        let header = [total, k, id, len, args as u32, (args >> 32) as u32];
        for (i, h) in header.iter().enumerate() {
            self.a.store_imm(W, R8, 4 * i as i16, *h as i32);
        }
        self.a.call(helper::KTIME_GET_NS);
        self.a.store(DW, R8, 24, R0);
        if let Some(p) = payload {
            let off = self.poff(p)?;
            self.copy(R8, weft_abi::EVENT_HEADER_SIZE as i16, R9, off, len);
        }
        self.a.mov(R1, R8);
        self.a.mov_imm(R2, 0);
        self.a.call(helper::RINGBUF_SUBMIT);
        self.a.bind(done);
        // The reserved record's pointer is gone from every path from here on.
        self.a.mov_imm(R8, 0);
        Ok(())
    }
}
