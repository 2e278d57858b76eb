//! Inline advice: simple probe bodies compiled straight into the trampoline of a site
//! at a function's entry. No frame is built and nothing is called: the body reads
//! arguments from the live registers, keeps its values in a few stack cells and adds
//! to this thread's accumulators directly. The return-address hijack of a return
//! probe is inlined the same way.
//!
//! Every register the head touches is saved and restored, flags included (with
//! `lahf`/`seto`): even at a function's entry, a caller compiled with `-fipa-ra` may
//! keep values in registers the callee is known not to touch.
//!
//! ```text
//! inline: push rax; lahf; seto al; push rax; push r11; [push rcx; push rdx]
//!         [guards: scalar maps not yet created → fallback]
//!         mov r11, fs:[tls]; test; jz fallback; cmp [r11+nest],0; jne done
//!         [push r11 (thread state)]; mov r11,[r11+slot]; test; jz fallback2
//!         sub rsp, CELLS; <body>; [hijack]; add rsp, CELLS [+8]
//! done:   [pop rdx; pop rcx]; pop r11; pop rax; add al,0x7f; sahf; pop rax
//!         jmp end
//! fallback2: add rsp, 8
//! fallback:  (the same restores); jmp generic
//! end:    nop                      ← the relocated instructions follow
//! ```
//!
//! Anything the inline path cannot do (first use of a map, a thread without a slot
//! yet) falls back to the site's generic trampoline before any side effect, so advice
//! runs exactly once either way.

use iced_x86::code_asm::*;
use weft_abi::*;
use weft_ir::{
    AggOp, BinOp, CtxValue, Function, Inst, MachineReg, MapId, Program, Reg, SymbolRef, UnOp,
};

use crate::advice::MapLayout;
use crate::JitError;

/// The return-address hijack of a site with return probes.
#[derive(Clone, Copy, Debug)]
pub struct Hijack {
    /// Return advice (or a thunk calling several).
    pub advice: u64,
    /// Its inline stub (see [`return_stub`]), or 0.
    pub stub: u64,
    pub probe: u32,
    /// Session generation the agent reported.
    pub generation: u32,
    pub return_trampoline: u64,
}

/// One probe's advice in a site's inline code. A site's bodies run one after the
/// other, in order (as the generic trampoline calls them): a body's `return` ends
/// that body only.
#[derive(Clone, Copy)]
pub struct Body<'a> {
    pub f: &'a Function,
    /// Its probe name index (`probe`).
    pub probe: u32,
    /// Resolves its symbols ([`Inst::SymbolAddr`]), as [`crate::Env::symbol`].
    pub symbol: &'a dyn Fn(&SymbolRef) -> Option<u64>,
}

/// A site whose trampoline gets an inline head.
#[derive(Clone, Debug)]
pub struct InlineSite {
    pub site_addr: u64,
    pub func: u64,
    pub site_index: u32,
    pub shm_base: u64,
    pub tls_offset: i64,
    pub thread_agg_off: u64,
    pub hijack: Option<Hijack>,
    /// Where the generic trampoline of the same site starts (the fallback).
    pub generic: u64,
    /// The site is a function's entry. Elsewhere the head first steps over the red
    /// zone (the function may keep data below rsp), and argN are whatever the
    /// registers hold, as for any probe off an entry.
    pub at_entry: bool,
    /// A return site (the head runs just before a `ret`): `ip` is the return
    /// address, where the thread goes next, as a return probe reports it.
    pub at_return: bool,
    /// The agent's `MapIndex` helper (keyed aggregations' first inserts).
    pub map_index: u64,
}

/// Whether `f` can be compiled inline at a function's entry.
pub fn eligible(f: &Function, maps: &[MapLayout]) -> bool {
    eligible_with(f, maps, ctx_ok)
}

/// Whether `f` can be compiled as an inline return stub.
pub fn eligible_return(f: &Function, maps: &[MapLayout]) -> bool {
    eligible_with(f, maps, |v| match v {
        CtxValue::Retval
        | CtxValue::Tid
        | CtxValue::Pid
        | CtxValue::FuncAddr
        | CtxValue::ProbeId
        | CtxValue::Ip
        | CtxValue::Uid
        | CtxValue::Gid
        | CtxValue::Cpid => true,
        CtxValue::Reg(r) => !matches!(r, MachineReg::Flags),
        _ => false,
    })
}

/// Bytes of stack slots inline code keeps (a key or two).
const SLOT_BYTES: u32 = 64;

fn eligible_with(f: &Function, maps: &[MapLayout], ctx_ok: impl Fn(CtxValue) -> bool) -> bool {
    if f.slots.iter().sum::<u32>() > SLOT_BYTES || f.regs > 64 {
        return false;
    }
    f.code.iter().all(|i| match i {
        Inst::Label(_)
        | Inst::Jump(_)
        | Inst::Branch { .. }
        | Inst::Return
        | Inst::Const { .. }
        | Inst::Mov { .. }
        | Inst::Binary { .. }
        | Inst::Unary { .. }
        | Inst::Extend { .. }
        | Inst::CountError(_) => true,
        Inst::Ctx { value, .. } => ctx_ok(*value),
        Inst::MapAgg { map, key: None, op } => {
            maps.get(map.0 as usize).is_some_and(|m| agg_ok(m, op))
        }
        Inst::MapAgg {
            map,
            key: Some(_),
            op,
        } => maps.get(map.0 as usize).is_some_and(|m| keyed_ok(m, op)),
        Inst::Zero { len, .. } => *len <= SLOT_BYTES,
        Inst::Store { size, .. } => matches!(size, 1 | 2 | 4 | 8),
        Inst::ThreadSum { map, .. } => maps
            .get(map.0 as usize)
            .is_some_and(|m| matches!(m.kind, MapKind::Sum | MapKind::Count)),
        // A constant, resolved when the code is made.
        Inst::SymbolAddr { .. } => true,
        _ => false,
    })
}

fn ctx_ok(v: CtxValue) -> bool {
    match v {
        CtxValue::Arg(_)
        | CtxValue::ReturnAddress
        | CtxValue::Tid
        | CtxValue::Pid
        | CtxValue::FuncAddr
        | CtxValue::ProbeId
        | CtxValue::Ip
        | CtxValue::Uid
        | CtxValue::Gid
        | CtxValue::Cpid => true,
        CtxValue::Reg(r) => r != MachineReg::Flags,
        _ => false,
    }
}

fn agg_ok(m: &MapLayout, op: &AggOp) -> bool {
    match (op, m.kind) {
        (AggOp::Count, MapKind::Count) | (AggOp::Sum(_), MapKind::Sum) => true,
        (AggOp::Min(_), MapKind::Min) | (AggOp::Max(_), MapKind::Max) => true,
        (AggOp::Hist(_), MapKind::Hist) => m.hist_k == 0,
        _ => false,
    }
}

/// A keyed aggregation inline: an 8-byte key (integers: `@[tid]`, `@[arg0]`), a
/// count or a sum. The table is probed in the head; a key not found there (not yet
/// inserted, or displaced far) is inserted by a helper call.
fn keyed_ok(m: &MapLayout, op: &AggOp) -> bool {
    m.key_size == 8
        && m.capacity.is_power_of_two()
        && matches!(
            (op, m.kind),
            (AggOp::Count, MapKind::Count) | (AggOp::Sum(_), MapKind::Sum)
        )
}

/// Maps that must already have their single entry before the inline path may add to
/// them (all but `count()` maps, whose entry weft creates up front).
pub fn guarded_maps(f: &Function, maps: &[MapLayout]) -> Vec<MapId> {
    guarded(&[f], maps)
}

/// [`guarded_maps`] of several bodies.
fn guarded(bodies: &[&Function], maps: &[MapLayout]) -> Vec<MapId> {
    let mut v: Vec<MapId> = bodies
        .iter()
        .flat_map(|f| &f.code)
        .filter_map(|i| match i {
            Inst::MapAgg { map, key: None, .. } if maps[map.0 as usize].kind != MapKind::Count => {
                Some(*map)
            }
            _ => None,
        })
        .collect();
    v.sort();
    v.dedup();
    v
}

/// Where the inline code keeps what it saved, as offsets from rsp while the body
/// runs.
#[derive(Clone, Copy)]
struct Frame {
    cells: i32,
    /// The thread state pointer.
    tstate: Option<i32>,
    rax: i32,
    rcx: i32,
    rdx: i32,
    r11: i32,
    /// At an entry: the site's rsp (the return-address slot).
    entry_rsp: Option<i32>,
    /// At a return: where the real return address is (the site's rip), and rsp after
    /// the return is 8 above it.
    ret_slot: Option<i32>,
}

impl Frame {
    fn tstate(&self) -> i32 {
        self.tstate.expect("thread state saved")
    }
    fn rdx(&self) -> i32 {
        self.rdx
    }
    fn rcx(&self) -> i32 {
        self.rcx
    }
    fn r11(&self) -> i32 {
        self.r11
    }
    fn rax(&self) -> i32 {
        self.rax
    }
    fn entry_rsp(&self) -> i32 {
        self.entry_rsp.expect("entry frame")
    }

    /// The entry head: [skips the red zone], pushes rax, flags, r11, [rcx, rdx],
    /// [thread state], then cells.
    fn entry(cells: i32, scratch: bool, tstate: bool, red_zone: bool) -> Frame {
        let after_tstate = cells + if tstate { 8 } else { 0 };
        let r11_at = after_tstate + if scratch { 16 } else { 0 };
        Frame {
            cells,
            tstate: tstate.then_some(cells),
            rdx: after_tstate,
            rcx: after_tstate + 8,
            r11: r11_at,
            rax: r11_at + 16,
            entry_rsp: Some(r11_at + 24 + if red_zone { 128 } else { 0 }),
            ret_slot: None,
        }
    }

    /// A return stub, called by the return trampoline (see `weft-agent`'s ret.rs):
    /// above the stub's return address are the entry pointer, the thread state, the
    /// saved rcx, rdx, flags, rax and the real return address; the stub pushes r11.
    fn ret(cells: i32) -> Frame {
        Frame {
            cells,
            tstate: Some(cells + 24),
            rcx: cells + 32,
            rdx: cells + 40,
            r11: cells,
            rax: cells + 56,
            entry_rsp: None,
            ret_slot: Some(cells + 64),
        }
    }
}

struct Cx<'a> {
    a: CodeAssembler,
    fr: Frame,
    site: &'a InlineSite,
    maps: &'a [MapLayout],
    /// The body being compiled: its labels, where its `return` goes, its probe
    /// name index and its symbols.
    labels: Vec<CodeLabel>,
    epilogue: CodeLabel,
    probe: u32,
    symbol: &'a dyn Fn(&SymbolRef) -> Option<u64>,
    last_label_at: Option<usize>,
    /// The body's slots: offset of each from rsp.
    slots: Vec<i32>,
    /// Each map's key-table address, as a constant after the code.
    tables: Vec<(MapId, CodeLabel)>,
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

    fn cell(&self, r: Reg) -> AsmMemoryOperand {
        qword_ptr(rsp + (r.0 as i32) * 8)
    }
    fn place(&self, p: weft_ir::Place) -> i32 {
        self.slots[p.slot.0 as usize] + p.off as i32
    }

    /// `@m[key] = count()` / `sum(v)` with an 8-byte key: hash it as
    /// `weft_abi::key_hash` does, look at up to four slots from its place, and add
    /// to this thread's accumulator of the entry found. A key not found there (its
    /// first use, or displaced far) is looked up and inserted by the `MapIndex`
    /// helper, called with every register the head did not save saved around it.
    fn keyed_agg(&mut self, map: MapId, key: weft_ir::Place, op: AggOp) -> Result<(), JitError> {
        const PROBES: u32 = 4;
        let m = self.maps[map.0 as usize];
        let table = match self.tables.iter().find(|(id, _)| *id == map) {
            Some((_, l)) => *l,
            None => {
                let l = self.a.create_label();
                self.tables.push((map, l));
                l
            }
        };
        let (c0, cmix) = key8_hash_constants();
        let mask = m.capacity - 1;
        let acc = (self.site.thread_agg_off + m.agg_off) as i32;
        let koff = self.place(key);
        self.a.mov(rax, qword_ptr(rsp + koff))?;
        self.a.mov(rcx, c0)?;
        self.a.xor(rcx, rax)?;
        self.a.mov(rdx, 0x9E37_79B9_7F4A_7C15u64)?;
        self.a.imul_2(rcx, rdx)?;
        self.a.mov(rdx, cmix)?;
        self.a.xor(rcx, rdx)?;
        self.a.mov(rdx, rcx)?;
        self.a.shr(rdx, 33)?;
        self.a.xor(rcx, rdx)?;
        self.a.mov(rdx, 0xff51_afd7_ed55_8ccdu64)?;
        self.a.imul_2(rcx, rdx)?;
        self.a.mov(rdx, rcx)?;
        self.a.shr(rdx, 33)?;
        self.a.xor(rcx, rdx)?;
        self.a.or(ecx, 2)?;
        let mut found = self.a.create_label();
        let mut insert = self.a.create_label();
        let mut skip = self.a.create_label();
        for j in 0..PROBES.min(m.capacity) {
            let mut next = self.a.create_label();
            let mut not_live = self.a.create_label();
            self.a.lea(edx, dword_ptr(rcx + j as i32))?;
            self.a.and(edx, mask as i32)?;
            self.a.imul_3(edx, edx, m.entry_size as i32)?;
            self.a.add(rdx, qword_ptr(table))?;
            self.a.cmp(dword_ptr(rdx), ENTRY_LIVE as i32)?;
            self.a.jne(not_live)?;
            self.a.cmp(dword_ptr(rdx + 4), ecx)?;
            self.a.jne(next)?;
            self.a.cmp(qword_ptr(rdx + 8), rax)?;
            self.a.jne(next)?;
            self.a.lea(edx, dword_ptr(rcx + j as i32))?;
            self.a.and(edx, mask as i32)?;
            self.a.jmp(found)?;
            self.bind(&mut not_live)?;
            // A tombstone keeps the chain going; an empty slot (never inserted) or
            // one being inserted goes to the helper.
            self.a.cmp(dword_ptr(rdx), ENTRY_DELETED as i32)?;
            self.a.jne(insert)?;
            self.bind(&mut next)?;
        }
        self.bind(&mut insert)?;
        self.call_map_index(map, koff)?;
        self.a.test(rax, rax)?;
        self.a.js(skip)?;
        self.a.mov(edx, eax)?;
        self.bind(&mut found)?;
        self.a.imul_3(edx, edx, m.value_size as i32)?;
        match op {
            AggOp::Count => self.a.add(qword_ptr(r11 + rdx + acc), 1)?,
            AggOp::Sum(r) => {
                self.load(rax, r)?;
                self.a.add(qword_ptr(r11 + rdx + acc), rax)?;
            }
            _ => return Err(JitError::BadProgram("keyed aggregation inline".into())),
        }
        self.bind(&mut skip)?;
        Ok(())
    }

    /// rax = `MapIndex(shm, map, &key, slot)`. The head saved rax, rcx, rdx and the
    /// flags; the other registers a call may change (rsi, rdi, r8-r11, xmm0-15) are
    /// saved here, on a 16-aligned stack.
    fn call_map_index(&mut self, map: MapId, koff: i32) -> R {
        const PUSHED: i32 = 7 * 8;
        for r in [rsi, rdi, r8, r9, r10, r11, rbx] {
            self.a.push(r)?;
        }
        self.a.mov(rbx, rsp)?;
        self.a.and(rsp, -16)?;
        self.a.sub(rsp, 256)?;
        for (i, x) in crate::trampoline::xmms().into_iter().enumerate() {
            self.a.movdqu(xmmword_ptr(rsp + 16 * i as i32), x)?;
        }
        self.a.mov(rdi, self.site.shm_base)?;
        self.a.mov(esi, map.0)?;
        self.a.lea(rdx, qword_ptr(rbx + PUSHED + koff))?;
        self.a.mov(rcx, r11)?;
        self.a.mov(rax, self.site.map_index)?;
        self.a.call(rax)?;
        for (i, x) in crate::trampoline::xmms().into_iter().enumerate() {
            self.a.movdqu(x, xmmword_ptr(rsp + 16 * i as i32))?;
        }
        self.a.mov(rsp, rbx)?;
        for r in [rbx, r11, r10, r9, r8, rdi, rsi] {
            self.a.pop(r)?;
        }
        Ok(())
    }
    fn at(&self, off: i32) -> AsmMemoryOperand {
        qword_ptr(rsp + off)
    }
    fn entry_rsp(&self) -> i32 {
        self.fr.entry_rsp()
    }

    /// rsp as the probe point saw it.
    fn site_rsp(&self) -> i32 {
        match self.fr.ret_slot {
            Some(r) => r + 8,
            None => self.fr.entry_rsp(),
        }
    }

    fn load(&mut self, dst: AsmRegister64, r: Reg) -> R {
        let m = self.cell(r);
        self.a.mov(dst, m)
    }
    fn store(&mut self, r: Reg, src: AsmRegister64) -> R {
        let m = self.cell(r);
        self.a.mov(m, src)
    }

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

    fn count_error(&mut self, kind: usize) -> R {
        let off = (core::mem::offset_of!(ThreadSlot, errors) + 8 * kind) as i32;
        self.a.add(qword_ptr(r11 + off), 1)
    }

    fn ctx(&mut self, v: CtxValue) -> R {
        let reg_at = |r: MachineReg| -> Option<AsmRegister64> {
            Some(match r {
                MachineReg::Rbx => rbx,
                MachineReg::Rsi => rsi,
                MachineReg::Rdi => rdi,
                MachineReg::Rbp => rbp,
                MachineReg::R8 => r8,
                MachineReg::R9 => r9,
                MachineReg::R10 => r10,
                MachineReg::R12 => r12,
                MachineReg::R13 => r13,
                MachineReg::R14 => r14,
                MachineReg::R15 => r15,
                _ => return None,
            })
        };
        match v {
            CtxValue::Arg(n) => match n {
                0 => self.a.mov(rax, rdi),
                1 => self.a.mov(rax, rsi),
                2 => {
                    let m = self.at(self.fr.rdx());
                    self.a.mov(rax, m)
                }
                3 => {
                    let m = self.at(self.fr.rcx());
                    self.a.mov(rax, m)
                }
                4 => self.a.mov(rax, r8),
                5 => self.a.mov(rax, r9),
                n => {
                    // Stack arguments: at entry arg6 is at [rsp + 8].
                    let off = self.entry_rsp() + 8 * (i32::from(n) - 5);
                    self.a.mov(rax, qword_ptr(rsp + off))
                }
            },
            CtxValue::Reg(MachineReg::Rax) => {
                let m = self.at(self.fr.rax());
                self.a.mov(rax, m)
            }
            CtxValue::Reg(MachineReg::Rcx) => {
                let m = self.at(self.fr.rcx());
                self.a.mov(rax, m)
            }
            CtxValue::Reg(MachineReg::Rdx) => {
                let m = self.at(self.fr.rdx());
                self.a.mov(rax, m)
            }
            CtxValue::Reg(MachineReg::R11) => {
                let m = self.at(self.fr.r11());
                self.a.mov(rax, m)
            }
            CtxValue::Reg(MachineReg::Rsp) => {
                let off = self.site_rsp();
                self.a.lea(rax, qword_ptr(rsp + off))
            }
            CtxValue::ReturnAddress => {
                let off = self.site_rsp();
                self.a.mov(rax, qword_ptr(rsp + off))
            }
            CtxValue::Reg(MachineReg::Rip) | CtxValue::Ip => match self.fr.ret_slot {
                Some(r) => self.a.mov(rax, qword_ptr(rsp + r)),
                None if self.site.at_return => {
                    let off = self.site_rsp();
                    self.a.mov(rax, qword_ptr(rsp + off))
                }
                None => self.a.mov(rax, self.site.site_addr),
            },
            CtxValue::Retval => {
                let m = self.at(self.fr.rax());
                self.a.mov(rax, m)
            }
            CtxValue::Reg(r) => match reg_at(r) {
                Some(src) => self.a.mov(rax, src),
                None => self.a.xor(eax, eax),
            },
            CtxValue::FuncAddr => self.a.mov(rax, self.site.func),
            CtxValue::ProbeId => self.a.mov(eax, self.probe),
            CtxValue::Tid | CtxValue::Pid => {
                let m = self.at(self.fr.tstate());
                self.a.mov(rax, m)?;
                let off = if v == CtxValue::Tid {
                    AGENT_THREAD_TID_OFF
                } else {
                    AGENT_THREAD_PID_OFF
                };
                self.a.mov(eax, dword_ptr(rax + off))
            }
            CtxValue::Uid | CtxValue::Gid | CtxValue::Cpid => {
                let off = match v {
                    CtxValue::Uid => core::mem::offset_of!(ShmHeader, uid),
                    CtxValue::Gid => core::mem::offset_of!(ShmHeader, gid),
                    _ => core::mem::offset_of!(ShmHeader, cpid),
                };
                self.a.mov(rax, self.site.shm_base + off as u64)?;
                self.a.mov(rax, qword_ptr(rax))
            }
            _ => unreachable!("checked by eligible()"),
        }
    }

    fn binary(&mut self, op: BinOp, dst: Reg, a: Reg, b: Reg) -> R {
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
            BinOp::DivS | BinOp::DivU | BinOp::ModS | BinOp::ModU => {
                let mut zero = self.a.create_label();
                let mut done = self.a.create_label();
                self.a.test(rcx, rcx)?;
                self.a.je(zero)?;
                if matches!(op, BinOp::DivS | BinOp::ModS) {
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
                } else {
                    self.a.xor(edx, edx)?;
                    self.a.div(rcx)?;
                }
                if matches!(op, BinOp::ModS | BinOp::ModU) {
                    self.a.mov(rax, rdx)?;
                }
                self.a.jmp(done)?;
                self.bind(&mut zero)?;
                self.count_error(weft_ir::ErrorKind::DivZero as usize)?;
                self.a.mov(eax, 1)?;
                self.bind(&mut done)?;
            }
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
                    _ => unreachable!(),
                }
                self.a.movzx(eax, al)?;
            }
        }
        self.store(dst, rax)
    }

    fn agg(&mut self, map: MapId, op: AggOp) -> R {
        let m = self.maps[map.0 as usize];
        let acc = (self.site.thread_agg_off + m.agg_off) as i32;
        let signed = matches!(m.kind, MapKind::Min | MapKind::Max);
        let _ = signed;
        match op {
            AggOp::Count => self.a.add(qword_ptr(r11 + acc), 1),
            AggOp::Sum(r) => {
                self.load(rax, r)?;
                self.a.add(qword_ptr(r11 + acc), rax)
            }
            AggOp::Min(r) | AggOp::Max(r) => {
                // acc = [count, value]; value replaced when count == 0 or better.
                let mut set = self.a.create_label();
                let mut done = self.a.create_label();
                self.load(rax, r)?;
                self.a.cmp(qword_ptr(r11 + acc), 0)?;
                self.a.je(set)?;
                self.a.cmp(rax, qword_ptr(r11 + acc + 8))?;
                // The runtime's MapDesc::signed decides signedness; weft's lang lowers
                // min/max of signed values as signed maps: compare by the layout flag.
                let is_min = matches!(op, AggOp::Min(_));
                if m.signed {
                    if is_min {
                        self.a.jl(set)?;
                    } else {
                        self.a.jg(set)?;
                    }
                } else if is_min {
                    self.a.jb(set)?;
                } else {
                    self.a.ja(set)?;
                }
                self.a.jmp(done)?;
                self.bind(&mut set)?;
                self.a.mov(qword_ptr(r11 + acc + 8), rax)?;
                self.bind(&mut done)?;
                self.a.add(qword_ptr(r11 + acc), 1)
            }
            AggOp::Hist(r) => {
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
                self.a.add(qword_ptr(r11 + rdx * 8 + acc), 1)
            }
            _ => unreachable!("checked by eligible()"),
        }
    }

    /// Compile one body (its `return` ends it, not the site's code).
    fn body(&mut self, b: &Body<'a>) -> Result<(), JitError> {
        self.labels = (0..b.f.labels).map(|_| self.a.create_label()).collect();
        self.slots = slot_offsets(b.f);
        self.epilogue = self.a.create_label();
        self.probe = b.probe;
        self.symbol = b.symbol;
        let code = &b.f.code;
        let mut k = 0;
        while k < code.len() {
            // A comparison whose result a branch tests next: the branch follows the
            // comparison's flags (the result is still stored, for any other reader).
            if let (
                Inst::Binary { op, dst, a, b },
                Some(Inst::Branch {
                    cond,
                    if_true,
                    if_false,
                }),
            ) = (&code[k], code.get(k + 1))
            {
                if cond == dst && is_comparison(*op) {
                    self.binary(*op, *dst, *a, *b)?;
                    let (t, f) = (
                        self.labels[if_true.0 as usize],
                        self.labels[if_false.0 as usize],
                    );
                    match op {
                        BinOp::Eq => self.a.je(t)?,
                        BinOp::Ne => self.a.jne(t)?,
                        BinOp::LtS => self.a.jl(t)?,
                        BinOp::LtU => self.a.jb(t)?,
                        BinOp::LeS => self.a.jle(t)?,
                        BinOp::LeU => self.a.jbe(t)?,
                        BinOp::GtS => self.a.jg(t)?,
                        BinOp::GtU => self.a.ja(t)?,
                        BinOp::GeS => self.a.jge(t)?,
                        _ => self.a.jae(t)?,
                    }
                    self.a.jmp(f)?;
                    k += 2;
                    continue;
                }
            }
            self.inst(&code[k])?;
            k += 1;
        }
        let mut ep = self.epilogue;
        self.bind(&mut ep)?;
        Ok(())
    }

    fn inst(&mut self, i: &Inst) -> Result<(), JitError> {
        match i {
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
                let m = self.cell(*cond);
                self.a.cmp(m, 0)?;
                self.a.jne(self.labels[if_true.0 as usize])?;
                self.a.jmp(self.labels[if_false.0 as usize])?;
            }
            Inst::Return => self.a.jmp(self.epilogue)?,
            Inst::Const { dst, value } => {
                let m = self.cell(*dst);
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
            Inst::CountError(k) => self.count_error(*k as usize)?,
            Inst::MapAgg { map, key: None, op } => self.agg(*map, *op)?,
            Inst::MapAgg {
                map,
                key: Some(k),
                op,
            } => self.keyed_agg(*map, *k, *op)?,
            Inst::Zero { place, len } => {
                let at = self.place(*place);
                let mut o = 0;
                while o + 8 <= *len as i32 {
                    self.a.mov(qword_ptr(rsp + at + o), 0)?;
                    o += 8;
                }
                while o < *len as i32 {
                    self.a.mov(byte_ptr(rsp + at + o), 0)?;
                    o += 1;
                }
            }
            Inst::Store { place, src, size } => {
                let at = self.place(*place);
                self.load(rax, *src)?;
                match size {
                    1 => self.a.mov(byte_ptr(rsp + at), al)?,
                    2 => self.a.mov(word_ptr(rsp + at), ax)?,
                    4 => self.a.mov(dword_ptr(rsp + at), eax)?,
                    _ => self.a.mov(qword_ptr(rsp + at), rax)?,
                }
            }
            Inst::ThreadSum { dst, map } => {
                // The accumulator is there before the map's entry is: no guard.
                let m = self.maps[map.0 as usize];
                let acc = (self.site.thread_agg_off + m.agg_off) as i32;
                self.a.mov(rax, qword_ptr(r11 + acc))?;
                self.store(*dst, rax)?;
            }
            Inst::SymbolAddr { dst, symbol } => {
                let addr = (self.symbol)(symbol).ok_or_else(|| {
                    JitError::UnknownSymbol(match &symbol.module {
                        Some(m) => format!("{m}:{}", symbol.name),
                        None => symbol.name.clone(),
                    })
                })?;
                self.a.mov(rax, addr)?;
                self.store(*dst, rax)?;
            }
            _ => unreachable!("checked by eligible()"),
        }
        Ok(())
    }

    fn hijack(&mut self, h: Hijack) -> R {
        let mut overflow = self.a.create_label();
        let mut done = self.a.create_label();
        let slot = self.entry_rsp();
        let ts = self.at(self.fr.tstate());
        self.a.mov(rax, ts)?;
        self.a
            .mov(ecx, dword_ptr(rax + AGENT_THREAD_SHADOW_DEPTH_OFF))?;
        self.a
            .cmp(ecx, dword_ptr(rax + AGENT_THREAD_SHADOW_CAP_OFF))?;
        self.a.jae(overflow)?;
        self.a.shl(rcx, 6)?;
        self.a.add(rcx, qword_ptr(rax + AGENT_THREAD_SHADOW_OFF))?;
        self.a.mov(rdx, qword_ptr(rsp + slot))?;
        self.a.mov(qword_ptr(rcx + SHADOW_RET_OFF), rdx)?;
        self.a.lea(rdx, qword_ptr(rsp + slot))?;
        self.a.mov(qword_ptr(rcx + SHADOW_SLOT_OFF), rdx)?;
        self.a.mov(rdx, h.advice)?;
        self.a.mov(qword_ptr(rcx + SHADOW_ADVICE_OFF), rdx)?;
        self.a.mov(rdx, self.site.func)?;
        self.a.mov(qword_ptr(rcx + SHADOW_FUNC_OFF), rdx)?;
        self.a
            .mov(dword_ptr(rcx + SHADOW_SITE_OFF), self.site.site_index)?;
        self.a
            .mov(dword_ptr(rcx + SHADOW_SESSION_OFF), h.generation)?;
        self.a.mov(dword_ptr(rcx + SHADOW_PROBE_OFF), h.probe)?;
        self.a.mov(rdx, self.site.shm_base)?;
        self.a.mov(qword_ptr(rcx + SHADOW_SHM_OFF), rdx)?;
        self.a.mov(rdx, h.stub)?;
        self.a.mov(qword_ptr(rcx + SHADOW_STUB_OFF), rdx)?;
        self.a.inc(dword_ptr(rax + AGENT_THREAD_SHADOW_DEPTH_OFF))?;
        self.a.mov(rdx, h.return_trampoline)?;
        self.a.mov(qword_ptr(rsp + slot), rdx)?;
        self.a.jmp(done)?;
        self.bind(&mut overflow)?;
        self.a.add(qword_ptr(rax + AGENT_THREAD_OVERFLOWS_OFF), 1)?;
        self.bind(&mut done)
    }
}

/// The constants keyed aggregations read (`Cx::tables`), at the current point.
fn emit_tables(g: &mut Cx<'_>, maps: &[MapLayout], shm_base: u64) -> R {
    for (m, mut l) in std::mem::take(&mut g.tables) {
        g.a.set_label(&mut l)?;
        g.a.dq(&[shm_base + maps[m.0 as usize].table_off])?;
    }
    Ok(())
}

/// `weft_abi::key_hash` of an 8-byte key `w`, before its final mix, is
/// `((L0 ^ 8 << 56 ^ w) * K) ^ C`: the two constants.
fn key8_hash_constants() -> (u64, u64) {
    const LANES: [u64; 4] = [
        0x243F_6A88_85A3_08D3,
        0x1319_8A2E_0370_7344,
        0xA409_3822_299F_31D0,
        0x082E_FA98_EC4E_6C89,
    ];
    let c0 = LANES[0] ^ (8u64 << 56);
    let cmix = LANES[1].rotate_left(17) ^ LANES[2].rotate_left(31) ^ LANES[3].rotate_left(47) ^ 8;
    (c0, cmix)
}

/// A comparison: [`Cx::binary`] ends it with `cmp`, then only `setcc`, `movzx`
/// and the store, which leave the flags alone.
fn is_comparison(op: BinOp) -> bool {
    matches!(
        op,
        BinOp::Eq
            | BinOp::Ne
            | BinOp::LtS
            | BinOp::LtU
            | BinOp::LeS
            | BinOp::LeU
            | BinOp::GtS
            | BinOp::GtU
            | BinOp::GeS
            | BinOp::GeU
    )
}

/// Where a body's slots are, from rsp: after its registers' cells.
fn slot_offsets(f: &Function) -> Vec<i32> {
    let mut at = (f.regs * 8) as i32;
    f.slots
        .iter()
        .map(|&n| {
            let o = at;
            at += ((n + 7) & !7) as i32;
            o
        })
        .collect()
}

/// Bytes of cells a body needs: its registers and slots.
fn cells_of(f: &Function) -> i32 {
    (f.regs * 8 + f.slots.iter().map(|n| (n + 7) & !7).sum::<u32>()) as i32
}

/// Whether the body needs rcx/rdx as scratch (anything beyond counting).
fn needs_scratch(f: &Function) -> bool {
    f.code.iter().any(|i| {
        !matches!(
            i,
            Inst::Label(_)
                | Inst::Jump(_)
                | Inst::Return
                | Inst::MapAgg {
                    op: AggOp::Count,
                    ..
                }
        )
    })
}

fn needs_tstate(f: &Function) -> bool {
    f.code.iter().any(|i| {
        matches!(
            i,
            Inst::Ctx {
                value: CtxValue::Tid | CtxValue::Pid,
                ..
            }
        )
    })
}

/// Emit the inline head for `site`, assembled at address `at` (its fallback jumps to
/// `site.generic`). `bodies` are the entry advice, run in order (none: return probes
/// only). The relocated instructions must follow the head immediately.
pub fn inline_head(
    bodies: &[Body<'_>],
    prog: &Program,
    maps: &[MapLayout],
    site: &InlineSite,
    at: u64,
) -> Result<Vec<u8>, JitError> {
    let _ = prog;
    let tls =
        i32::try_from(site.tls_offset).map_err(|_| JitError::BadProgram("TLS offset".into()))?;
    let cells = bodies.iter().map(|b| cells_of(b.f)).max().unwrap_or(0);
    let scratch = site.hijack.is_some() || bodies.iter().any(|b| needs_scratch(b.f));
    let fr = Frame::entry(
        (cells + 15) & !15,
        scratch,
        site.hijack.is_some() || bodies.iter().any(|b| needs_tstate(b.f)),
        !site.at_entry,
    );
    let mut a = CodeAssembler::new(64)?;
    let epilogue = a.create_label();
    let no_symbols = |_: &SymbolRef| None;
    let mut g = Cx {
        a,
        fr,
        site,
        maps,
        labels: Vec::new(),
        epilogue,
        probe: 0,
        symbol: &no_symbols,
        last_label_at: None,
        slots: Vec::new(),
        tables: Vec::new(),
    };
    let mut fallback = g.a.create_label();
    let mut fallback_tstate = g.a.create_label();
    let mut done = g.a.create_label();
    let mut end = g.a.create_label();
    if !site.at_entry {
        g.a.lea(rsp, qword_ptr(rsp - 128))?;
    }
    crate::trampoline::save_flags(&mut g.a)?;
    g.a.push(r11)?;
    if scratch {
        g.a.push(rcx)?;
        g.a.push(rdx)?;
    }
    // Every fallback comes before the first body runs: the generic trampoline then
    // runs them all.
    let funcs: Vec<&Function> = bodies.iter().map(|b| b.f).collect();
    for m in guarded(&funcs, maps) {
        let table = maps[m.0 as usize].table_off;
        g.a.mov(r11, site.shm_base + table)?;
        g.a.cmp(dword_ptr(r11), ENTRY_LIVE)?;
        g.a.jne(fallback)?;
    }
    g.a.mov(r11, qword_ptr(tls).fs())?;
    g.a.test(r11, r11)?;
    g.a.jz(fallback)?;
    g.a.cmp(dword_ptr(r11 + AGENT_THREAD_NEST_OFF), 0)?;
    g.a.jne(done)?;
    // A hijack pushes onto the shadow stack: raise nest around it so a signal
    // handler on this thread cannot push in between (it runs no advice).
    let guard_nest = site.hijack.is_some();
    if guard_nest {
        g.a.inc(dword_ptr(r11 + AGENT_THREAD_NEST_OFF))?;
    }
    if fr.tstate.is_some() {
        g.a.push(r11)?;
    }
    g.a.mov(r11, qword_ptr(r11 + AGENT_THREAD_SLOT_OFF))?;
    g.a.test(r11, r11)?;
    g.a.jz(if fr.tstate.is_some() {
        fallback_tstate
    } else {
        fallback
    })?;
    if fr.cells > 0 {
        g.a.sub(rsp, fr.cells)?;
    }
    for b in bodies {
        g.body(b)?;
    }
    if let Some(h) = site.hijack {
        g.hijack(h)?;
    }
    if guard_nest {
        let ts = g.at(fr.tstate());
        g.a.mov(r11, ts)?;
        g.a.dec(dword_ptr(r11 + AGENT_THREAD_NEST_OFF))?;
    }
    let pop = fr.cells + if fr.tstate.is_some() { 8 } else { 0 };
    if pop > 0 {
        g.a.add(rsp, pop)?;
    }
    let restore = |g: &mut Cx| -> R {
        if scratch {
            g.a.pop(rdx)?;
            g.a.pop(rcx)?;
        }
        g.a.pop(r11)?;
        crate::trampoline::restore_flags(&mut g.a)?;
        if !site.at_entry {
            g.a.lea(rsp, qword_ptr(rsp + 128))?;
        }
        Ok(())
    };
    g.bind(&mut done)?;
    restore(&mut g)?;
    g.a.jmp(end)?;
    g.bind(&mut fallback_tstate)?;
    if guard_nest {
        g.a.mov(r11, qword_ptr(rsp))?;
        g.a.dec(dword_ptr(r11 + AGENT_THREAD_NEST_OFF))?;
    }
    g.a.add(rsp, 8)?;
    g.bind(&mut fallback)?;
    restore(&mut g)?;
    g.a.jmp(site.generic)?;
    // The key tables' addresses, read by keyed aggregations: after the fallback's
    // jump, never run.
    emit_tables(&mut g, maps, site.shm_base)?;
    g.bind(&mut end)?;
    g.a.nop()?;
    Ok(g.a.assemble(at)?)
}

/// Compile `bodies` (return advice accepted by [`eligible_return`], run in order) as
/// a stub the agent's return trampoline calls with rcx = thread state. It returns 0
/// in eax when it ran, 1 when a map they use has no entry yet (then the trampoline
/// runs the full advice, which creates it). It preserves every register but rax,
/// rcx, rdx and the flags, which the trampoline restores.
pub fn return_stub(
    bodies: &[Body<'_>],
    maps: &[MapLayout],
    site: &InlineSite,
) -> Result<Vec<u8>, JitError> {
    let cells = (bodies.iter().map(|b| cells_of(b.f)).max().unwrap_or(0) + 15) & !15;
    let fr = Frame::ret(cells);
    let mut a = CodeAssembler::new(64)?;
    let epilogue = a.create_label();
    let no_symbols = |_: &SymbolRef| None;
    let mut g = Cx {
        a,
        fr,
        site,
        maps,
        labels: Vec::new(),
        epilogue,
        probe: 0,
        symbol: &no_symbols,
        last_label_at: None,
        slots: Vec::new(),
        tables: Vec::new(),
    };
    let mut fallback = g.a.create_label();
    g.a.push(r11)?;
    let funcs: Vec<&Function> = bodies.iter().map(|b| b.f).collect();
    for m in guarded(&funcs, maps) {
        let table = maps[m.0 as usize].table_off;
        g.a.mov(r11, site.shm_base + table)?;
        g.a.cmp(dword_ptr(r11), ENTRY_LIVE)?;
        g.a.jne(fallback)?;
    }
    // The control thread detaches every thread at the end of a session (slot =
    // null) concurrently with this stub: read the slot once, and check it.
    g.a.mov(r11, qword_ptr(rcx + AGENT_THREAD_SLOT_OFF))?;
    g.a.test(r11, r11)?;
    g.a.jz(fallback)?;
    if cells > 0 {
        g.a.sub(rsp, cells)?;
    }
    for b in bodies {
        g.body(b)?;
    }
    if cells > 0 {
        g.a.add(rsp, cells)?;
    }
    g.a.pop(r11)?;
    g.a.xor(eax, eax)?;
    g.a.ret()?;
    g.bind(&mut fallback)?;
    g.a.pop(r11)?;
    g.a.mov(eax, 1)?;
    g.a.ret()?;
    emit_tables(&mut g, maps, site.shm_base)?;
    Ok(g.a.assemble(0)?)
}
