//! Compiling one probe body (`weft_ir::Function`) to an `extern "C" fn(*mut Frame)`.
//!
//! A template compiler: each IR register lives in an 8-byte stack cell and each slot
//! in a stack area; every instruction loads its operands into scratch registers,
//! computes, and stores the result. `rbx` holds the `Frame` pointer for the whole
//! body. Helpers are called through absolute addresses (`mov rax, imm64; call rax`),
//! so the code is position-independent and can be copied anywhere.
//!
//! Frame of the compiled function (rsp 16-aligned after the prologue):
//! ```text
//!   [rsp + 0 ..)               register cells, 8 bytes each
//!   [rsp + 8*regs ..)          slots, 8-aligned
//!   [rsp + frame ..)           saved rbx, rbp, return address
//! ```
//!
//! Hot aggregations on maps without keys (`@c = count()`, `@s = sum(x)`,
//! `@h = hist(x)`) are inlined: they add to this thread's accumulator directly and
//! only call the helper the first time, to create the map's single entry.

use iced_x86::code_asm::*;
use weft_abi::{
    Frame, Helper, MapKind, AGENT_THREAD_AROUND_OFF, AGENT_THREAD_NEST_OFF, AROUND_ORIG_OFF,
    AROUND_PROCEEDED_OFF, AROUND_RAX_OFF, AROUND_RDX_OFF, AROUND_TAKEN_OFF, AROUND_XMM0_OFF,
    AROUND_XMM1_OFF, ENTRY_LIVE, FRAME_FUNC_OFF, FRAME_PROBE_OFF, FRAME_SHM_OFF, FRAME_THREAD_OFF,
    FRAME_TSTATE_OFF, HEAD_XMM_OFF, PROCEED_STACK_WORDS,
};
use weft_ir::{
    AggOp, BinOp, CtxValue, EventKind, Function, Inst, MachineReg, MapValue, Place, Program, Reg,
    SymbolRef, Type, UnOp,
};

use crate::JitError;

/// What the compiled code needs to know about the process and the segment.
pub struct Env<'a> {
    /// Helper addresses in the process the code will run in.
    pub helpers: &'a [u64; weft_abi::HELPER_COUNT],
    /// Per map: the layout weft chose (same order as `Program::maps`).
    pub maps: &'a [MapLayout],
    /// `ShmHeader::agg_off`: offset of the aggregation area in a thread slot.
    pub thread_agg_off: u64,
    /// Offset of `ShmHeader::start_nsecs` etc. are fixed by `weft_abi`.
    /// Resolves symbols ([`Inst::SymbolAddr`]: `uaddr("sym")`, the code ranges of
    /// `cflow_strict`): an address, or the end of the symbol's bytes.
    pub symbol: &'a dyn Fn(&SymbolRef) -> Option<u64>,
    /// How to read USDT argument `n` at this site (None: not a USDT probe).
    pub usdt_args: Option<&'a [UsdtArg]>,
}

/// Where weft put a map in the segment.
#[derive(Clone, Copy, Debug)]
pub struct MapLayout {
    pub kind: MapKind,
    pub key_size: u32,
    pub value_size: u32,
    pub table_off: u64,
    /// Offset of the map's accumulators inside the thread aggregation area.
    pub agg_off: u64,
    pub hist_k: u32,
    /// Signed min/max/sum/avg/stats.
    pub signed: bool,
    /// Key-table slots (a power of two) and bytes per slot: inline code probes the
    /// table itself.
    pub capacity: u32,
    pub entry_size: u32,
    /// A thread's entry is `[present, value]` at `agg_off` in its own slot
    /// (`weft_abi::MAP_FLAG_THREAD_KEYED`).
    pub thread_keyed: bool,
    /// The key is one string (NUL-padded: after its first zero word, every word is
    /// zero), so inline code hashes and compares it only up to that word.
    pub string_key: bool,
}

/// Location of a USDT argument, as the note's argument string says.
#[derive(Clone, Debug, PartialEq)]
pub enum UsdtArg {
    Reg {
        reg: MachineReg,
        size: u8,
        signed: bool,
    },
    Imm(i64),
    Mem {
        base: Option<MachineReg>,
        index: Option<(MachineReg, u8)>,
        disp: i64,
        size: u8,
        signed: bool,
    },
}

const CELL: u32 = 8;

struct Cx<'a> {
    a: CodeAssembler,
    /// Instruction count when the last label was bound (iced allows one label per
    /// instruction, so a second label at the same place gets a `nop` to sit on).
    last_label_at: Option<usize>,
    f: &'a Function,
    prog: &'a Program,
    env: &'a Env<'a>,
    slot_off: Vec<u32>,
    labels: Vec<CodeLabel>,
    exit: CodeLabel,
}

fn gpr(r: MachineReg) -> usize {
    // Index of the register in weft_abi::Regs (MachineReg order).
    r as usize
}

type R = Result<(), IcedError>;

impl<'a> Cx<'a> {
    fn bind(&mut self, label: &mut CodeLabel) -> R {
        let n = self.a.instructions().len();
        if self.last_label_at == Some(n) {
            self.a.nop()?;
        }
        self.last_label_at = Some(self.a.instructions().len());
        self.a.set_label(label)
    }

    fn reg(&self, r: Reg) -> AsmMemoryOperand {
        qword_ptr(rsp + (r.0 * CELL) as i32)
    }

    fn place_disp(&self, p: Place) -> i32 {
        (self.slot_off[p.slot.0 as usize] + p.off) as i32
    }

    fn lea_place(&mut self, dst: AsmRegister64, p: Place) -> R {
        let d = self.place_disp(p);
        self.a.lea(dst, qword_ptr(rsp + d))
    }

    fn frame_field(&self, off: usize) -> AsmMemoryOperand {
        qword_ptr(rbx + off as i32)
    }

    fn regs_field(&self, r: MachineReg) -> AsmMemoryOperand {
        qword_ptr(rbx + (gpr(r) * 8) as i32)
    }

    fn call(&mut self, h: Helper) -> R {
        let addr = self.env.helpers[h as usize];
        self.a.mov(rax, addr)?;
        self.a.call(rax)
    }

    fn load(&mut self, dst: AsmRegister64, r: Reg) -> R {
        let m = self.reg(r);
        self.a.mov(dst, m)
    }

    fn store(&mut self, r: Reg, src: AsmRegister64) -> R {
        let m = self.reg(r);
        self.a.mov(m, src)
    }

    fn imm(&mut self, dst: AsmRegister64, v: i64) -> R {
        if v == 0 {
            let d32 = low32(dst);
            self.a.xor(d32, d32)
        } else if (0..=u32::MAX as i64).contains(&v) {
            self.a.mov(low32(dst), v as u32)
        } else {
            self.a.mov(dst, v as u64)
        }
    }

    /// Zero- or sign-extend the low `bits` of rax in place.
    fn extend_rax(&mut self, bits: u8, signed: bool) -> R {
        match (bits, signed) {
            (8, true) => self.a.movsx(rax, al),
            (8, false) => self.a.movzx(eax, al),
            (16, true) => self.a.movsx(rax, ax),
            (16, false) => self.a.movzx(eax, ax),
            (32, true) => self.a.movsxd(rax, eax),
            (32, false) => self.a.mov(eax, eax),
            _ => Ok(()),
        }
    }

    fn map_layout(&self, id: weft_ir::MapId) -> Result<MapLayout, JitError> {
        self.env
            .maps
            .get(id.0 as usize)
            .copied()
            .ok_or(JitError::BadProgram(format!("map {} has no layout", id.0)))
    }

    fn map_value_type(&self, id: weft_ir::MapId) -> Option<&Type> {
        match &self.prog.maps.get(id.0 as usize)?.value {
            MapValue::Plain(t) => Some(t),
            _ => None,
        }
    }
}

fn low32(r: AsmRegister64) -> AsmRegister32 {
    match r {
        x if x == rax => eax,
        x if x == rcx => ecx,
        x if x == rdx => edx,
        x if x == rsi => esi,
        x if x == rdi => edi,
        x if x == r8 => r8d,
        x if x == r9 => r9d,
        x if x == r10 => r10d,
        x if x == r11 => r11d,
        _ => eax,
    }
}

/// Compile `f` (a body of `prog`) for the process described by `env`.
pub fn compile(f: &Function, prog: &Program, env: &Env) -> Result<Vec<u8>, JitError> {
    // In u64, checked against the limit before any offset is used as a u32: a sum that
    // wrapped would place slots outside the frame.
    let mut slot_off = Vec::with_capacity(f.slots.len());
    let mut off = u64::from(f.regs) * u64::from(CELL);
    for s in &f.slots {
        slot_off.push(off);
        off += u64::from(s.div_ceil(8)) * 8;
    }
    let mut frame = off;
    // Entry rsp ≡ 8 (mod 16); after pushing rbp and rbx it is ≡ 8 again, so the frame
    // must be ≡ 8 (mod 16) for helper calls to see an aligned stack.
    if frame % 16 != 8 {
        frame += 8;
    }
    if frame > 1 << 20 {
        return Err(JitError::FrameTooLarge(
            u32::try_from(frame).unwrap_or(u32::MAX),
        ));
    }
    // Below 1 MiB: every offset fits.
    let frame = frame as u32;
    let slot_off: Vec<u32> = slot_off.into_iter().map(|o| o as u32).collect();
    let mut a = CodeAssembler::new(64)?;
    let labels = (0..f.labels).map(|_| a.create_label()).collect();
    let exit = a.create_label();
    let mut g = Cx {
        a,
        last_label_at: None,
        f,
        prog,
        env,
        slot_off,
        labels,
        exit,
    };
    g.prologue(frame)?;
    for inst in &f.code {
        g.inst(inst)?;
    }
    g.epilogue(frame)?;
    Ok(g.a.assemble(0)?)
}

impl Cx<'_> {
    /// Call the original function from around advice (see [`Inst::Proceed`]): the
    /// site's stack arguments copied below, xmm0-7, rax (a variadic callee's vector
    /// count), r10 and the argument registers as the caller set them, `args`
    /// replacing the first. The thread counts as outside advice meanwhile (probes in
    /// the original fire), but inside an around call (weft keeps this code mapped).
    fn proceed(&mut self, dst: Reg, args: &[Reg]) -> Result<(), JitError> {
        const ARG_REGS: [(AsmRegister64, MachineReg); 6] = [
            (rdi, MachineReg::Rdi),
            (rsi, MachineReg::Rsi),
            (rdx, MachineReg::Rdx),
            (rcx, MachineReg::Rcx),
            (r8, MachineReg::R8),
            (r9, MachineReg::R9),
        ];
        if args.len() > ARG_REGS.len() {
            return Err(JitError::BadProgram(
                "proceed() takes at most six arguments".into(),
            ));
        }
        let mut done = self.a.create_label();
        let copy = (PROCEED_STACK_WORDS * 8) as i32;
        self.a
            .cmp(qword_ptr(rbx + AROUND_PROCEEDED_OFF as i32), 0)?;
        self.a.jne(done)?;
        self.a.mov(rax, self.frame_field(FRAME_TSTATE_OFF))?;
        self.a.dec(dword_ptr(rax + AGENT_THREAD_NEST_OFF))?;
        self.a.inc(dword_ptr(rax + AGENT_THREAD_AROUND_OFF))?;
        self.a.sub(rsp, copy)?;
        let site_rsp = self.regs_field(MachineReg::Rsp);
        self.a.mov(rax, site_rsp)?;
        for k in 0..PROCEED_STACK_WORDS as i32 {
            self.a.mov(rcx, qword_ptr(rax + 8 + 8 * k))?;
            self.a.mov(qword_ptr(rsp + 8 * k), rcx)?;
        }
        let xmms = [xmm0, xmm1, xmm2, xmm3, xmm4, xmm5, xmm6, xmm7];
        for (i, x) in xmms.into_iter().enumerate() {
            self.a
                .movdqu(x, xmmword_ptr(rbx + (HEAD_XMM_OFF + 16 * i) as i32))?;
        }
        for (i, (r, m)) in ARG_REGS.into_iter().enumerate() {
            match args.get(i) {
                Some(a) => {
                    let cell = qword_ptr(rsp + (a.0 * CELL) as i32 + copy);
                    self.a.mov(r, cell)?
                }
                None => {
                    let f = self.regs_field(m);
                    self.a.mov(r, f)?
                }
            }
        }
        let r10_in = self.regs_field(MachineReg::R10);
        self.a.mov(r10, r10_in)?;
        self.a.mov(r11, qword_ptr(rbx + AROUND_ORIG_OFF as i32))?;
        let rax_in = self.regs_field(MachineReg::Rax);
        self.a.mov(rax, rax_in)?;
        self.a.call(r11)?;
        self.a.add(rsp, copy)?;
        self.a.mov(qword_ptr(rbx + AROUND_RAX_OFF as i32), rax)?;
        // rdx is the original's unless `args` replaced it (the third argument): a
        // callee that leaves rdx alone would otherwise hand the caller our value.
        if args.len() >= 3 {
            let f = self.regs_field(MachineReg::Rdx);
            self.a.mov(rdx, f)?;
        }
        self.a.mov(qword_ptr(rbx + AROUND_RDX_OFF as i32), rdx)?;
        self.a
            .movdqu(xmmword_ptr(rbx + AROUND_XMM0_OFF as i32), xmm0)?;
        self.a
            .movdqu(xmmword_ptr(rbx + AROUND_XMM1_OFF as i32), xmm1)?;
        self.a
            .mov(qword_ptr(rbx + AROUND_PROCEEDED_OFF as i32), 1)?;
        self.a.mov(rax, self.frame_field(FRAME_TSTATE_OFF))?;
        self.a.inc(dword_ptr(rax + AGENT_THREAD_NEST_OFF))?;
        self.a.dec(dword_ptr(rax + AGENT_THREAD_AROUND_OFF))?;
        self.bind(&mut done)?;
        self.a.mov(rax, qword_ptr(rbx + AROUND_RAX_OFF as i32))?;
        self.store(dst, rax)?;
        Ok(())
    }

    fn prologue(&mut self, frame: u32) -> R {
        // Only rbx (the frame pointer of the body) and rbp are callee-saved registers
        // the compiled code uses.
        self.a.push(rbp)?;
        self.a.mov(rbp, rsp)?;
        self.a.push(rbx)?;
        self.a.sub(rsp, frame as i32)?;
        self.a.mov(rbx, rdi)
    }

    fn epilogue(&mut self, frame: u32) -> R {
        let mut exit = self.exit;
        self.bind(&mut exit)?;
        self.a.add(rsp, frame as i32)?;
        self.a.pop(rbx)?;
        self.a.pop(rbp)?;
        self.a.ret()
    }

    fn inst(&mut self, inst: &Inst) -> Result<(), JitError> {
        let _ = self.f;
        match inst {
            Inst::Label(l) => {
                let mut lab = self.labels[l.0 as usize];
                self.bind(&mut lab)?;
                self.labels[l.0 as usize] = lab;
            }
            Inst::Jump(l) => self.a.jmp(self.labels[l.0 as usize])?,
            Inst::Branch {
                cond,
                if_true,
                if_false,
            } => {
                let m = self.reg(*cond);
                self.a.cmp(m, 0)?;
                self.a.jne(self.labels[if_true.0 as usize])?;
                self.a.jmp(self.labels[if_false.0 as usize])?;
            }
            Inst::Return => self.a.jmp(self.exit)?,
            Inst::AroundEnter => {
                // Until `proceed` or `return EXPR` says otherwise, rax stays as the
                // caller left it: a skipped void function must not clobber it (a
                // caller compiled with -fipa-ra may keep a value there).
                self.a.mov(qword_ptr(rbx + AROUND_TAKEN_OFF as i32), 1)?;
                let rax_in = self.regs_field(MachineReg::Rax);
                self.a.mov(rax, rax_in)?;
                self.a.mov(qword_ptr(rbx + AROUND_RAX_OFF as i32), rax)?;
                self.a
                    .mov(qword_ptr(rbx + AROUND_PROCEEDED_OFF as i32), 0)?;
            }
            Inst::Proceed { dst, args } => self.proceed(*dst, args)?,
            Inst::AroundReturn { value } => {
                self.load(rax, *value)?;
                self.a.mov(qword_ptr(rbx + AROUND_RAX_OFF as i32), rax)?;
            }
            Inst::Override { value } => {
                self.load(rax, *value)?;
                let m = self.regs_field(MachineReg::Rax);
                self.a.mov(m, rax)?;
            }
            // The head restores the registers from the frame after the advice.
            Inst::SetArg { index, value } => {
                let r = MachineReg::arg(*index)
                    .ok_or_else(|| JitError::BadProgram(format!("argument {index}")))?;
                self.load(rax, *value)?;
                let m = self.regs_field(r);
                self.a.mov(m, rax)?;
            }
            // The mechanism writes it to the watched bytes after the advice.
            Inst::SetDataNew { value } => {
                self.load(rax, *value)?;
                let m = self.frame_field(weft_abi::DATA_NEW_OFF);
                self.a.mov(m, rax)?;
            }
            Inst::Const { dst, value } => {
                let m = self.reg(*dst);
                if i32::try_from(*value).is_ok() {
                    self.a.mov(m, *value as i32)?;
                } else {
                    self.a.mov(rax, *value as u64)?;
                    self.a.mov(m, rax)?;
                }
            }
            Inst::Mov { dst, src } => {
                self.load(rax, *src)?;
                self.store(*dst, rax)?;
            }
            Inst::Binary { op, dst, a, b } => self.binary(*op, *dst, *a, *b)?,
            Inst::Unary { op, dst, a } => {
                self.load(rax, *a)?;
                match op {
                    UnOp::Neg => self.a.neg(rax)?,
                    UnOp::Not => self.a.not(rax)?,
                    UnOp::LNot => {
                        self.a.test(rax, rax)?;
                        self.a.sete(al)?;
                        self.a.movzx(eax, al)?;
                    }
                    UnOp::Bswap(64) => self.a.bswap(rax)?,
                    UnOp::Bswap(32) => self.a.bswap(eax)?,
                    UnOp::Bswap(_) => {
                        self.a.rol(ax, 8)?;
                        self.a.movzx(eax, ax)?;
                    }
                }
                self.store(*dst, rax)?;
            }
            Inst::Extend {
                dst,
                src,
                bits,
                signed,
            } => {
                self.load(rax, *src)?;
                self.extend_rax(*bits, *signed)?;
                self.store(*dst, rax)?;
            }
            Inst::Ctx { dst, value } => {
                self.ctx(*value)?;
                self.store(*dst, rax)?;
            }
            Inst::Load {
                dst,
                addr,
                size,
                signed,
            } => {
                self.a.mov(rdi, rbx)?;
                self.load(rsi, *addr)?;
                self.a.mov(edx, u32::from(*size))?;
                self.call(Helper::ReadMem)?;
                self.extend_rax(size * 8, *signed)?;
                self.store(*dst, rax)?;
            }
            Inst::CountError(kind) => {
                self.a.mov(rdi, rbx)?;
                self.a.mov(esi, *kind as u32)?;
                self.call(Helper::CountError)?;
            }
            Inst::Store { place, src, size } => {
                self.load(rax, *src)?;
                let d = self.place_disp(*place);
                match size {
                    1 => self.a.mov(byte_ptr(rsp + d), al)?,
                    2 => self.a.mov(word_ptr(rsp + d), ax)?,
                    4 => self.a.mov(dword_ptr(rsp + d), eax)?,
                    _ => self.a.mov(qword_ptr(rsp + d), rax)?,
                }
            }
            Inst::LoadSlot {
                dst,
                place,
                size,
                signed,
            } => {
                let d = self.place_disp(*place);
                match (size, signed) {
                    (1, true) => self.a.movsx(rax, byte_ptr(rsp + d))?,
                    (1, false) => self.a.movzx(eax, byte_ptr(rsp + d))?,
                    (2, true) => self.a.movsx(rax, word_ptr(rsp + d))?,
                    (2, false) => self.a.movzx(eax, word_ptr(rsp + d))?,
                    (4, true) => self.a.movsxd(rax, dword_ptr(rsp + d))?,
                    (4, false) => self.a.mov(eax, dword_ptr(rsp + d))?,
                    _ => self.a.mov(rax, qword_ptr(rsp + d))?,
                }
                self.store(*dst, rax)?;
            }
            Inst::Copy { dst, src, len } => self.copy(*dst, *src, *len)?,
            Inst::Zero { place, len } => self.zero(*place, *len)?,
            Inst::SetBytes { place, bytes, len } => {
                let mut data = bytes.clone();
                data.resize(*len as usize, 0);
                self.set_bytes(*place, &data)?;
            }
            Inst::AddrOf { dst, place } => {
                self.lea_place(rax, *place)?;
                self.store(*dst, rax)?;
            }
            Inst::ReadStr {
                dst,
                addr,
                max,
                cap,
            } => {
                self.a.mov(rdi, rbx)?;
                self.lea_place(rsi, *dst)?;
                self.load(rdx, *addr)?;
                match max {
                    Some(m) => self.load(rcx, *m)?,
                    None => self.a.mov(rcx, u64::MAX)?,
                }
                self.a.mov(r8d, *cap)?;
                self.call(Helper::ReadStr)?;
            }
            Inst::ReadBuf {
                dst,
                addr,
                len,
                cap,
            } => {
                self.a.mov(rdi, rbx)?;
                self.lea_place(rsi, *dst)?;
                self.load(rdx, *addr)?;
                self.load(rcx, *len)?;
                self.a.mov(r8d, *cap)?;
                self.call(Helper::ReadBuf)?;
            }
            Inst::Comm { dst, cap } => {
                self.a.mov(rdi, rbx)?;
                self.lea_place(rsi, *dst)?;
                self.a.mov(edx, *cap)?;
                self.call(Helper::Comm)?;
            }
            Inst::PComm { dst, cap } => {
                self.a.mov(rdi, rbx)?;
                self.lea_place(rsi, *dst)?;
                self.a.mov(edx, *cap)?;
                self.call(Helper::PComm)?;
            }
            Inst::FuncName { dst, cap } => {
                self.a.mov(rdi, rbx)?;
                self.lea_place(rsi, *dst)?;
                self.a.mov(edx, *cap)?;
                self.call(Helper::FuncName)?;
            }
            Inst::StrEq { dst, a, b, len } => {
                self.lea_place(rdi, *a)?;
                self.lea_place(rsi, *b)?;
                self.a.mov(edx, *len)?;
                self.call(Helper::StrCmp)?;
                self.a.test(rax, rax)?;
                self.a.sete(al)?;
                self.a.movzx(eax, al)?;
                self.store(*dst, rax)?;
            }
            Inst::BytesEq { dst, a, b, len } => self.bytes_eq(*dst, *a, *b, *len)?,
            Inst::StrCmp { dst, a, b, len } => {
                self.lea_place(rdi, *a)?;
                self.lea_place(rsi, *b)?;
                self.a.mov(edx, *len)?;
                self.call(Helper::StrCmp)?;
                self.a.test(rax, rax)?;
                self.a.setne(al)?;
                self.a.movzx(eax, al)?;
                self.store(*dst, rax)?;
            }
            Inst::StrOrder { dst, a, b, len } => {
                self.lea_place(rdi, *a)?;
                self.lea_place(rsi, *b)?;
                self.a.mov(edx, *len)?;
                // The helper orders them: -1, 0 or 1.
                self.call(Helper::StrCmp)?;
                self.store(*dst, rax)?;
            }
            Inst::StrContains { dst, a, b, len } => {
                self.lea_place(rdi, *a)?;
                self.lea_place(rsi, *b)?;
                self.a.mov(edx, *len)?;
                self.call(Helper::StrContains)?;
                self.store(*dst, rax)?;
            }
            Inst::IntToStr {
                dst,
                src,
                signed,
                cap,
            } => {
                self.lea_place(rdi, *dst)?;
                self.load(rsi, *src)?;
                self.a.mov(edx, u32::from(*signed))?;
                self.a.mov(ecx, *cap)?;
                self.call(Helper::IntToStr)?;
            }
            Inst::UStack { dst, depth } => {
                self.a.mov(rdi, rbx)?;
                self.lea_place(rsi, *dst)?;
                self.a.mov(edx, *depth)?;
                self.call(Helper::UStack)?;
            }
            Inst::SymbolAddr { dst, symbol } => {
                let addr = (self.env.symbol)(symbol).ok_or_else(|| {
                    JitError::UnknownSymbol(match &symbol.module {
                        Some(m) => format!("{m}:{}", symbol.name),
                        None => symbol.name.clone(),
                    })
                })?;
                self.a.mov(rax, addr)?;
                self.store(*dst, rax)?;
            }
            Inst::ThreadSum { dst, map } => {
                // This thread's accumulator of the map's single entry: written only
                // by this thread, there whether or not the entry was created.
                let layout = self.map_layout(*map)?;
                if !matches!(layout.kind, MapKind::Sum | MapKind::Count) {
                    return Err(JitError::BadProgram(format!(
                        "map {} is not a sum() or count() map",
                        map.0
                    )));
                }
                let thread = self.frame_field(FRAME_THREAD_OFF);
                self.a.mov(rcx, thread)?;
                let acc = (self.env.thread_agg_off + layout.agg_off) as i32;
                self.a.mov(rax, qword_ptr(rcx + acc))?;
                self.store(*dst, rax)?;
            }
            Inst::MapLoad {
                map,
                key,
                dst_reg,
                dst_place,
            } => {
                self.a.mov(rdi, rbx)?;
                self.a.mov(esi, map.0)?;
                self.key_arg(rdx, *key)?;
                match dst_place {
                    Some(p) => self.lea_place(rcx, *p)?,
                    None => self.a.xor(ecx, ecx)?,
                }
                self.call(Helper::MapLoad)?;
                if let Some(d) = dst_reg {
                    if let Some(Type::Int { bits, signed }) = self.map_value_type(*map).cloned() {
                        self.extend_rax(bits, signed)?;
                    }
                    self.store(*d, rax)?;
                }
            }
            Inst::MapStore {
                map,
                key,
                src_reg,
                src_place,
            } => {
                self.a.mov(rdi, rbx)?;
                self.a.mov(esi, map.0)?;
                self.key_arg(rdx, *key)?;
                match src_place {
                    Some(p) => self.lea_place(rcx, *p)?,
                    None => self.a.xor(ecx, ecx)?,
                }
                match src_reg {
                    Some(r) => self.load(r8, *r)?,
                    None => self.a.xor(r8d, r8d)?,
                }
                self.call(Helper::MapStore)?;
            }
            Inst::MapAgg { map, key, op } => self.map_agg(*map, *key, *op)?,
            Inst::MapDelete { map, key, dst } => {
                self.a.mov(rdi, rbx)?;
                self.a.mov(esi, map.0)?;
                self.key_arg(rdx, *key)?;
                self.call(Helper::MapDelete)?;
                if let Some(d) = dst {
                    self.store(*d, rax)?;
                }
            }
            Inst::MapHasKey { dst, map, key } => {
                self.a.mov(rdi, rbx)?;
                self.a.mov(esi, map.0)?;
                self.lea_place(rdx, *key)?;
                self.call(Helper::MapFind)?;
                self.a.not(rax)?;
                self.a.shr(rax, 63)?;
                self.store(*dst, rax)?;
            }
            Inst::MapLen { dst, map } => {
                self.a.mov(rdi, rbx)?;
                self.a.mov(esi, map.0)?;
                self.call(Helper::MapLen)?;
                self.store(*dst, rax)?;
            }
            Inst::MapIterStart { it, map: _ } => {
                let m = self.reg(*it);
                self.a.mov(m, 0)?;
            }
            Inst::MapIterNext {
                found,
                it,
                map,
                key,
                dst_reg,
                dst_place,
            } => {
                self.a.mov(rdi, rbx)?;
                self.a.mov(esi, map.0)?;
                self.a.lea(rdx, qword_ptr(rsp + (it.0 * CELL) as i32))?;
                self.key_arg(rcx, *key)?;
                match (dst_place, dst_reg) {
                    (Some(p), _) => self.lea_place(r8, *p)?,
                    // A scalar value goes through the destination register's cell.
                    (None, Some(r)) => self.a.lea(r8, qword_ptr(rsp + (r.0 * CELL) as i32))?,
                    (None, None) => self.a.xor(r8d, r8d)?,
                }
                if let Some(r) = dst_reg {
                    // Values narrower than 8 bytes only overwrite their low bytes.
                    let m = self.reg(*r);
                    self.a.mov(m, 0)?;
                }
                self.call(Helper::MapIterNext)?;
                self.store(*found, rax)?;
                if let (Some(r), None) = (dst_reg, dst_place) {
                    if let Some(Type::Int { bits, signed }) = self.map_value_type(*map).cloned() {
                        self.load(rax, *r)?;
                        self.extend_rax(bits, signed)?;
                        self.store(*r, rax)?;
                    }
                }
            }
            Inst::Emit { kind, payload, len } => self.emit(*kind, *payload, *len)?,
            Inst::Signal { sig } => {
                self.a.mov(rdi, rbx)?;
                self.load(rsi, *sig)?;
                self.call(Helper::Signal)?;
            }
            Inst::StoreTarget { addr, src, size } => {
                self.a.mov(rdi, rbx)?;
                self.load(rsi, *addr)?;
                self.load(rdx, *src)?;
                self.a.mov(ecx, u32::from(*size))?;
                self.call(Helper::StoreTarget)?;
            }
            Inst::EventField { .. } | Inst::EventBytes { .. } | Inst::EventDataLoc { .. } => {
                return Err(JitError::BadProgram(
                    "a kernel event's field in advice that runs in user space".into(),
                ))
            }
        }
        Ok(())
    }

    fn key_arg(&mut self, dst: AsmRegister64, key: Option<Place>) -> R {
        match key {
            Some(p) => self.lea_place(dst, p),
            None => {
                let d = low32(dst);
                self.a.xor(d, d)
            }
        }
    }

    fn binary(&mut self, op: BinOp, dst: Reg, a: Reg, b: Reg) -> Result<(), JitError> {
        self.load(rax, a)?;
        self.load(rcx, b)?;
        match op {
            BinOp::Add => self.a.add(rax, rcx)?,
            BinOp::Sub => self.a.sub(rax, rcx)?,
            BinOp::Mul => self.a.imul_2(rax, rcx)?,
            BinOp::And => self.a.and(rax, rcx)?,
            BinOp::Or => self.a.or(rax, rcx)?,
            BinOp::Xor => self.a.xor(rax, rcx)?,
            BinOp::Shl => self.a.shl(rax, cl)?,
            BinOp::ShrS => self.a.sar(rax, cl)?,
            BinOp::ShrU => self.a.shr(rax, cl)?,
            BinOp::DivS | BinOp::DivU | BinOp::ModS | BinOp::ModU => self.divide(op)?,
            cmp => {
                self.a.cmp(rax, rcx)?;
                match cmp {
                    BinOp::Eq => self.a.sete(al)?,
                    BinOp::Ne => self.a.setne(al)?,
                    BinOp::LtS => self.a.setl(al)?,
                    BinOp::LtU => self.a.setb(al)?,
                    BinOp::LeS => self.a.setle(al)?,
                    BinOp::LeU => self.a.setbe(al)?,
                    BinOp::GtS => self.a.setg(al)?,
                    BinOp::GtU => self.a.seta(al)?,
                    BinOp::GeS => self.a.setge(al)?,
                    BinOp::GeU => self.a.setae(al)?,
                    _ => unreachable!("arithmetic handled above"),
                }
                self.a.movzx(eax, al)?;
            }
        }
        self.store(dst, rax)?;
        Ok(())
    }

    /// rax = rax op rcx; division by zero yields 1 (as upstream bpftrace) and counts an
    /// error;
    /// i64::MIN / -1 (which traps on x86) yields i64::MIN (remainder 0).
    fn divide(&mut self, op: BinOp) -> R {
        let mut zero = self.a.create_label();
        let mut done = self.a.create_label();
        self.a.test(rcx, rcx)?;
        self.a.je(zero)?;
        match op {
            BinOp::DivS | BinOp::ModS => {
                let mut normal = self.a.create_label();
                self.a.cmp(rcx, -1)?;
                self.a.jne(normal)?;
                if op == BinOp::DivS {
                    self.a.neg(rax)?;
                } else {
                    self.a.xor(eax, eax)?;
                }
                self.a.jmp(done)?;
                self.bind(&mut normal)?;
                self.a.cqo()?;
                self.a.idiv(rcx)?;
                if op == BinOp::ModS {
                    self.a.mov(rax, rdx)?;
                }
            }
            _ => {
                self.a.xor(edx, edx)?;
                self.a.div(rcx)?;
                if op == BinOp::ModU {
                    self.a.mov(rax, rdx)?;
                }
            }
        }
        self.a.jmp(done)?;
        self.bind(&mut zero)?;
        self.a.mov(rdi, rbx)?;
        self.a.mov(esi, weft_ir::ErrorKind::DivZero as u32)?;
        self.call(Helper::CountError)?;
        self.a.mov(eax, 1)?;
        self.bind(&mut done)
    }

    fn ctx(&mut self, v: CtxValue) -> Result<(), JitError> {
        match v {
            CtxValue::Arg(n) => {
                if let Some(args) = self.env.usdt_args {
                    return self.usdt_arg(args.get(n as usize).cloned());
                }
                if let Some(r) = MachineReg::arg(n) {
                    let m = self.regs_field(r);
                    self.a.mov(rax, m)?;
                } else {
                    // Stack arguments: at entry, arg6 is at [rsp + 8].
                    let m = self.regs_field(MachineReg::Rsp);
                    self.a.mov(rsi, m)?;
                    self.a.add(rsi, 8 * (i32::from(n) - 5))?;
                    self.a.mov(rdi, rbx)?;
                    self.a.mov(edx, 8)?;
                    self.call(Helper::ReadMem)?;
                }
            }
            CtxValue::Retval => {
                let m = self.regs_field(MachineReg::Rax);
                self.a.mov(rax, m)?;
            }
            CtxValue::Reg(r) => {
                let m = self.regs_field(r);
                self.a.mov(rax, m)?;
            }
            CtxValue::Ip => {
                let m = self.regs_field(MachineReg::Rip);
                self.a.mov(rax, m)?;
            }
            CtxValue::ReturnAddress => {
                let m = self.regs_field(MachineReg::Rsp);
                self.a.mov(rax, m)?;
                self.a.mov(rax, qword_ptr(rax))?;
            }
            CtxValue::FuncAddr => {
                let m = self.frame_field(FRAME_FUNC_OFF);
                self.a.mov(rax, m)?;
            }
            CtxValue::ProbeId => {
                let m = self.frame_field(FRAME_PROBE_OFF);
                self.a.mov(rax, m)?;
            }
            // Data probes: the agent's watch handler passes the values after the
            // frame (the front end allows these only there).
            CtxValue::DataOld => {
                let m = self.frame_field(weft_abi::DATA_OLD_OFF);
                self.a.mov(rax, m)?;
            }
            CtxValue::DataNew => {
                let m = self.frame_field(weft_abi::DATA_NEW_OFF);
                self.a.mov(rax, m)?;
            }
            CtxValue::Tid | CtxValue::Pid => {
                let m = self.frame_field(FRAME_TSTATE_OFF);
                self.a.mov(rax, m)?;
                let off = if v == CtxValue::Tid {
                    TSTATE_TID_OFF
                } else {
                    TSTATE_PID_OFF
                };
                self.a.mov(eax, dword_ptr(rax + off))?;
            }
            CtxValue::Uid | CtxValue::Gid | CtxValue::Cpid => {
                let m = self.frame_field(FRAME_SHM_OFF);
                self.a.mov(rax, m)?;
                let off = match v {
                    CtxValue::Uid => HEADER_UID_OFF,
                    CtxValue::Gid => HEADER_GID_OFF,
                    _ => HEADER_CPID_OFF,
                };
                self.a.mov(rax, qword_ptr(rax + off))?;
            }
            CtxValue::Nsecs => {
                self.a.mov(rdi, rbx)?;
                self.call(Helper::Nsecs)?
            }
            CtxValue::RealtimeNsecs => self.call(Helper::RealtimeNsecs)?,
            CtxValue::ThreadCpuTime => self.call(Helper::ThreadCpuTime)?,
            CtxValue::ThreadRusage(which) => {
                self.a.mov(edi, u32::from(which))?;
                self.call(Helper::ThreadRusage)?
            }
            CtxValue::WatchBind => {
                self.a.mov(rdi, rbx)?;
                self.call(Helper::WatchBind)?
            }
            CtxValue::Elapsed => {
                self.a.mov(rdi, rbx)?;
                self.call(Helper::Nsecs)?;
                let m = self.frame_field(FRAME_SHM_OFF);
                self.a.mov(rcx, m)?;
                self.a.sub(rax, qword_ptr(rcx + HEADER_START_OFF))?;
            }
            CtxValue::Cpu => self.call(Helper::Cpu)?,
            CtxValue::NumaId => self.call(Helper::NumaNode)?,
            CtxValue::Rand => {
                self.a.mov(rdi, rbx)?;
                self.call(Helper::Rand)?;
            }
        }
        Ok(())
    }

    fn usdt_arg(&mut self, arg: Option<UsdtArg>) -> Result<(), JitError> {
        match arg {
            None => self.a.xor(eax, eax)?,
            Some(UsdtArg::Imm(v)) => self.imm(rax, v)?,
            Some(UsdtArg::Reg { reg, size, signed }) => {
                let m = self.regs_field(reg);
                self.a.mov(rax, m)?;
                self.extend_rax(size * 8, signed)?;
            }
            Some(UsdtArg::Mem {
                base,
                index,
                disp,
                size,
                signed,
            }) => {
                self.imm(rsi, disp)?;
                if let Some(b) = base {
                    let m = self.regs_field(b);
                    self.a.add(rsi, m)?;
                }
                if let Some((ix, scale)) = index {
                    let m = self.regs_field(ix);
                    self.a.mov(rax, m)?;
                    self.a.imul_3(rax, rax, i32::from(scale))?;
                    self.a.add(rsi, rax)?;
                }
                self.a.mov(rdi, rbx)?;
                self.a.mov(edx, u32::from(size))?;
                self.call(Helper::ReadMem)?;
                self.extend_rax(size * 8, signed)?;
            }
        }
        Ok(())
    }

    fn copy(&mut self, dst: Place, src: Place, len: u32) -> R {
        let (d, s) = (self.place_disp(dst), self.place_disp(src));
        let mut i = 0i32;
        let len = len as i32;
        while i + 8 <= len {
            self.a.mov(rax, qword_ptr(rsp + s + i))?;
            self.a.mov(qword_ptr(rsp + d + i), rax)?;
            i += 8;
        }
        while i < len {
            self.a.mov(al, byte_ptr(rsp + s + i))?;
            self.a.mov(byte_ptr(rsp + d + i), al)?;
            i += 1;
        }
        Ok(())
    }

    fn zero(&mut self, p: Place, len: u32) -> R {
        let d = self.place_disp(p);
        self.a.xor(eax, eax)?;
        let mut i = 0i32;
        let len = len as i32;
        while i + 8 <= len {
            self.a.mov(qword_ptr(rsp + d + i), rax)?;
            i += 8;
        }
        while i < len {
            self.a.mov(byte_ptr(rsp + d + i), al)?;
            i += 1;
        }
        Ok(())
    }

    fn set_bytes(&mut self, p: Place, data: &[u8]) -> R {
        let d = self.place_disp(p);
        let mut i = 0usize;
        while i + 8 <= data.len() {
            let v = u64::from_le_bytes(data[i..i + 8].try_into().unwrap());
            self.a.mov(rax, v)?;
            self.a.mov(qword_ptr(rsp + d + i as i32), rax)?;
            i += 8;
        }
        while i < data.len() {
            self.a
                .mov(byte_ptr(rsp + d + i as i32), u32::from(data[i]))?;
            i += 1;
        }
        Ok(())
    }

    fn bytes_eq(&mut self, dst: Reg, a: Place, b: Place, len: u32) -> R {
        let (da, db) = (self.place_disp(a), self.place_disp(b));
        let mut ne = self.a.create_label();
        let mut done = self.a.create_label();
        let mut i = 0i32;
        let len = len as i32;
        while i + 8 <= len {
            self.a.mov(rax, qword_ptr(rsp + da + i))?;
            self.a.cmp(rax, qword_ptr(rsp + db + i))?;
            self.a.jne(ne)?;
            i += 8;
        }
        while i < len {
            self.a.mov(al, byte_ptr(rsp + da + i))?;
            self.a.cmp(al, byte_ptr(rsp + db + i))?;
            self.a.jne(ne)?;
            i += 1;
        }
        self.a.mov(eax, 1)?;
        self.a.jmp(done)?;
        self.bind(&mut ne)?;
        self.a.xor(eax, eax)?;
        self.bind(&mut done)?;
        self.store(dst, rax)
    }

    fn map_agg(
        &mut self,
        map: weft_ir::MapId,
        key: Option<Place>,
        op: AggOp,
    ) -> Result<(), JitError> {
        let (code, value) = match op {
            AggOp::Count => (weft_abi::AGG_COUNT, None),
            AggOp::Sum(r) => (weft_abi::AGG_SUM, Some(r)),
            AggOp::Min(r) => (weft_abi::AGG_MIN, Some(r)),
            AggOp::Max(r) => (weft_abi::AGG_MAX, Some(r)),
            AggOp::Avg(r) => (weft_abi::AGG_AVG, Some(r)),
            AggOp::Stats(r) => (weft_abi::AGG_STATS, Some(r)),
            AggOp::Hist(r) => (weft_abi::AGG_HIST, Some(r)),
            AggOp::Lhist(r) => (weft_abi::AGG_LHIST, Some(r)),
            AggOp::Tseries(r) => (weft_abi::AGG_TSERIES, Some(r)),
        };
        let layout = self.map_layout(map)?;
        let inline = key.is_none()
            && matches!(
                (op, layout.kind),
                (AggOp::Count, MapKind::Count)
                    | (AggOp::Sum(_), MapKind::Sum)
                    | (AggOp::Hist(_), MapKind::Hist)
            )
            && (layout.kind != MapKind::Hist || layout.hist_k == 0);
        if !inline {
            self.a.mov(rdi, rbx)?;
            self.a.mov(esi, map.0)?;
            self.key_arg(rdx, key)?;
            self.a.mov(ecx, code)?;
            match value {
                Some(r) => self.load(r8, r)?,
                None => self.a.xor(r8d, r8d)?,
            }
            self.call(Helper::MapAgg)?;
            return Ok(());
        }
        // Scalar map fast path: the single entry 0 must be live (created once by the
        // helper); then add to this thread's accumulator.
        let mut slow = self.a.create_label();
        let mut done = self.a.create_label();
        let shm = self.frame_field(FRAME_SHM_OFF);
        self.a.mov(rcx, shm)?;
        self.a
            .cmp(dword_ptr(rcx + layout.table_off as i32), ENTRY_LIVE)?;
        self.a.jne(slow)?;
        let thread = self.frame_field(FRAME_THREAD_OFF);
        self.a.mov(rcx, thread)?;
        let acc = (self.env.thread_agg_off + layout.agg_off) as i32;
        match op {
            AggOp::Count => self.a.add(qword_ptr(rcx + acc), 1)?,
            AggOp::Sum(r) => {
                self.load(rax, r)?;
                self.a.add(qword_ptr(rcx + acc), rax)?;
            }
            AggOp::Hist(r) => {
                // bucket = v < 0 ? 0 : v == 0 ? 1 : 2 + floor(log2 v)
                let mut neg = self.a.create_label();
                let mut bump = self.a.create_label();
                self.load(rax, r)?;
                self.a.test(rax, rax)?;
                self.a.js(neg)?;
                self.a.mov(edx, 1)?;
                self.a.je(bump)?;
                self.a.bsr(rdx, rax)?;
                self.a.add(edx, 2)?;
                self.a.jmp(bump)?;
                self.bind(&mut neg)?;
                self.a.xor(edx, edx)?;
                self.bind(&mut bump)?;
                self.a.add(qword_ptr(rcx + rdx * 8 + acc), 1)?;
            }
            _ => unreachable!("only count/sum/hist are inlined"),
        }
        self.a.jmp(done)?;
        self.bind(&mut slow)?;
        self.a.mov(rdi, rbx)?;
        self.a.mov(esi, map.0)?;
        self.a.xor(edx, edx)?;
        self.a.mov(ecx, code)?;
        match value {
            Some(r) => self.load(r8, r)?,
            None => self.a.xor(r8d, r8d)?,
        }
        self.call(Helper::MapAgg)?;
        self.bind(&mut done)?;
        Ok(())
    }

    fn emit(&mut self, kind: EventKind, payload: Option<Place>, len: u32) -> R {
        use weft_abi::*;
        let (k, id, args) = match kind {
            EventKind::FuncEntry => (EVENT_FUNC_ENTRY, 0, 0u64),
            EventKind::FuncExit => (EVENT_FUNC_EXIT, 0, 0),
            other => other.record().expect("every other event is the program's"),
        };
        self.a.mov(rdi, rbx)?;
        self.a.mov(esi, k)?;
        match kind {
            // The site and the return value are the frame's, not constants.
            EventKind::FuncEntry | EventKind::FuncExit => {
                let site = self.frame_field(FRAME_SITE_OFF);
                self.a.mov(edx, site)?;
            }
            _ => self.a.mov(edx, id)?,
        }
        if kind == EventKind::FuncExit {
            let rax_at = self.regs_field(MachineReg::Rax);
            self.a.mov(rcx, rax_at)?;
        } else {
            self.a.mov(rcx, args)?;
        }
        match payload {
            Some(p) => self.lea_place(r8, p)?,
            None => self.a.xor(r8d, r8d)?,
        }
        self.a.mov(r9d, len)?;
        self.call(Helper::Emit)
    }
}

const TSTATE_TID_OFF: i32 = core::mem::offset_of!(weft_abi::AgentThread, tid) as i32;
const TSTATE_PID_OFF: i32 = core::mem::offset_of!(weft_abi::AgentThread, pid) as i32;
const HEADER_START_OFF: i32 = core::mem::offset_of!(weft_abi::ShmHeader, start_nsecs) as i32;
const HEADER_CPID_OFF: i32 = core::mem::offset_of!(weft_abi::ShmHeader, cpid) as i32;
const HEADER_UID_OFF: i32 = core::mem::offset_of!(weft_abi::ShmHeader, uid) as i32;
const HEADER_GID_OFF: i32 = core::mem::offset_of!(weft_abi::ShmHeader, gid) as i32;

/// Size of [`Frame`], re-exported for the trampoline.
pub const FRAME_BYTES: usize = core::mem::size_of::<Frame>();
