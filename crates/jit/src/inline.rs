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

use std::collections::HashMap;

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
    /// The agent's `MapKey` helper (plain maps' keys the inline probes leave open).
    pub map_key: u64,
    /// The agent's fault-tolerant string copy (`Helper::SafeStrcpy`), for `str()`.
    pub safe_strcpy: u64,
    /// Where map descriptors are in the segment (`ShmHeader::maps_off`).
    pub maps_off: u64,
    /// A thread slot's event ring: its offset in the slot and its size
    /// (`ShmHeader::ring_off`, `ring_size`).
    pub ring_off: u64,
    pub ring_size: u64,
}

/// What the session offers inline code beyond the program.
#[derive(Clone, Copy, Debug, Default)]
pub struct Caps {
    /// The segment's TSC clock is calibrated: `nsecs` is read inline.
    pub tsc_clock: bool,
}

/// Whether `f` can be compiled inline at a function's entry.
pub fn eligible(f: &Function, maps: &[MapLayout], caps: Caps) -> bool {
    eligible_with(f, maps, caps, |v| {
        ctx_ok(v) || (v == CtxValue::Nsecs && caps.tsc_clock)
    })
}

/// Whether `f` can be compiled as an inline return stub.
pub fn eligible_return(f: &Function, maps: &[MapLayout], caps: Caps) -> bool {
    let sets_args = f.code.iter().any(|i| matches!(i, Inst::SetArg { .. }));
    // What an entry reads, but the return value rather than the arguments.
    !sets_args
        && eligible_with(f, maps, caps, |v| match v {
            CtxValue::Nsecs => caps.tsc_clock,
            CtxValue::Retval => true,
            CtxValue::Arg(_) | CtxValue::ReturnAddress => false,
            other => ctx_ok(other),
        })
}

/// Slots of a key table inline code looks at from a key's place before a helper
/// settles the lookup.
const KEY_PROBES: u32 = 4;

/// Bytes of stack slots inline code keeps (a string read and the key made of it).
const SLOT_BYTES: u32 = 160;

fn eligible_with(
    f: &Function,
    maps: &[MapLayout],
    caps: Caps,
    ctx_ok: impl Fn(CtxValue) -> bool,
) -> bool {
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
        Inst::Zero { len, .. } | Inst::Copy { len, .. } => *len <= SLOT_BYTES,
        // `comm`/`pcomm` as 16-byte strings: the slot's own copies, NUL-padded.
        Inst::Comm { cap: 16, .. } | Inst::PComm { cap: 16, .. } => true,
        // `str(p)`: the runtime's fault-tolerant copy, called from the trampoline.
        Inst::ReadStr { max: None, cap, .. } => (1..=128).contains(cap),
        Inst::Store { size, .. } => matches!(size, 1 | 2 | 4 | 8),
        Inst::ThreadSum { map, .. } => maps
            .get(map.0 as usize)
            .is_some_and(|m| matches!(m.kind, MapKind::Sum | MapKind::Count)),
        Inst::MapLoad {
            map,
            key: Some(_),
            dst_place: None,
            ..
        }
        | Inst::MapStore {
            map,
            key: Some(_),
            src_reg: Some(_),
            src_place: None,
        }
        | Inst::MapDelete {
            map, key: Some(_), ..
        } => maps.get(map.0 as usize).is_some_and(plain_word),
        // An event's time is the TSC clock's.
        Inst::Emit { len, .. } => *len <= SLOT_BYTES && caps.tsc_clock,
        // A constant, resolved when the code is made.
        Inst::SymbolAddr { .. } => true,
        Inst::SetArg { index, .. } => *index < 6,
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
    key_words(m.key_size).is_some()
        && m.capacity.is_power_of_two()
        && matches!(
            (op, m.kind),
            (AggOp::Count, MapKind::Count) | (AggOp::Sum(_), MapKind::Sum)
        )
}

/// Keys inline code hashes and compares: 8 to 64 bytes, whole words (integers,
/// tuples of them, `str()`'s 64 bytes). Their number of words.
fn key_words(key_size: u32) -> Option<u32> {
    (key_size.is_multiple_of(8) && (8..=64).contains(&key_size)).then_some(key_size / 8)
}

/// A plain map of 8-byte keys and 8-byte values (`@start[tid] = nsecs`): loads,
/// stores and deletes probe its table inline.
fn plain_word(m: &MapLayout) -> bool {
    m.kind == MapKind::Plain && m.key_size == 8 && m.value_size == 8 && m.capacity.is_power_of_two()
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

/// The fourth argument of a map helper called from inline code.
#[derive(Clone, Copy)]
enum HelperArg {
    /// This thread's slot (`MapIndex`, which counts a full map in it).
    Slot,
    /// `MapKey`'s operation.
    Op(u64),
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
    /// What this site knows before it runs, along the straight code since the
    /// last label: registers holding a constant (a literal, `probe`, `func`)
    /// and 8-byte frame words (by offset from rsp) holding one. A map key made
    /// only of such words is hashed here, not at every hit (`@[probe]`,
    /// `@[func, 3]`: the classic one-liners).
    known_regs: HashMap<u32, u64>,
    known_words: HashMap<i32, u64>,
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

    /// The label of the constant after the code holding map `map`'s key-table
    /// address.
    fn table(&mut self, map: MapId) -> CodeLabel {
        match self.tables.iter().find(|(id, _)| *id == map) {
            Some((_, l)) => *l,
            None => {
                let l = self.a.create_label();
                self.tables.push((map, l));
                l
            }
        }
    }

    /// Look for the 8-byte key at `[rsp + koff]` in map `map`'s table: hash it as
    /// `weft_abi::key_hash` does and look at up to four slots from its place. Goes
    /// to `found` with edx = the entry's index when a live entry holds the key, to
    /// `absent` when an empty slot proves no entry does (tombstones keep the chain
    /// going: a key's tombstone is revived in place, never shadowed), and falls
    /// through when it cannot tell (an entry being inserted, a longer chain): a
    /// helper settles those. Clobbers rax (the key), rcx (the hash) and rdx.
    fn probe_key(&mut self, map: MapId, koff: i32, found: CodeLabel, absent: CodeLabel) -> R {
        let m = self.maps[map.0 as usize];
        let table = self.table(map);
        let mask = m.capacity - 1;
        let words = m.key_size / 8;
        self.hash_words(koff, words, m.string_key)?;
        self.a.mov(rdx, rcx)?;
        self.a.shr(rdx, 33)?;
        self.a.xor(rcx, rdx)?;
        self.a.mov(rdx, weft_abi::KEY_HASH_MIX)?;
        self.a.imul_2(rcx, rdx)?;
        self.a.mov(rdx, rcx)?;
        self.a.shr(rdx, 33)?;
        self.a.xor(rcx, rdx)?;
        self.a.or(ecx, 2)?;
        if words == 1 {
            self.a.mov(rax, qword_ptr(rsp + koff))?;
        }
        let mut unsure = self.a.create_label();
        for j in 0..KEY_PROBES.min(m.capacity) {
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
            let mut same = self.a.create_label();
            if words == 1 {
                self.a.cmp(qword_ptr(rdx + 8), rax)?;
                self.a.jne(next)?;
            } else {
                for w in 0..words as i32 {
                    self.a.mov(rax, qword_ptr(rsp + koff + 8 * w))?;
                    self.a.cmp(qword_ptr(rdx + 8 + 8 * w), rax)?;
                    self.a.jne(next)?;
                    // A string's zero word: both keys are zeros from here on.
                    if m.string_key && w + 1 < words as i32 {
                        self.a.test(rax, rax)?;
                        self.a.jz(same)?;
                    }
                }
            }
            self.bind(&mut same)?;
            self.a.lea(edx, dword_ptr(rcx + j as i32))?;
            self.a.and(edx, mask as i32)?;
            self.a.jmp(found)?;
            self.bind(&mut not_live)?;
            self.past_unlive(dword_ptr(rdx), absent, unsure)?;
            self.bind(&mut next)?;
        }
        self.bind(&mut unsure)
    }

    /// rcx = `weft_abi::key_hash`'s value before its final mix (the sum of each word
    /// times its factor, the key's length) of the `words` 8-byte words at `[rsp +
    /// koff]`. A string key (NUL-padded) stops at its first zero word: the rest are
    /// zero and add nothing. Clobbers rax and rdx.
    fn hash_words(&mut self, koff: i32, words: u32, string: bool) -> R {
        let mut done = self.a.create_label();
        self.a.mov(rcx, qword_ptr(rsp + koff))?;
        self.a.mov(rdx, weft_abi::key_word_factor(0))?;
        self.a.imul_2(rcx, rdx)?;
        for w in 1..words {
            self.a.mov(rax, qword_ptr(rsp + koff + 8 * w as i32))?;
            if string {
                self.a.test(rax, rax)?;
                self.a.jz(done)?;
            }
            self.a.mov(rdx, weft_abi::key_word_factor(w as usize))?;
            self.a.imul_2(rax, rdx)?;
            self.a.add(rcx, rax)?;
        }
        self.bind(&mut done)?;
        self.a.xor(rcx, (8 * words) as i32)
    }

    /// `str(addr)` into the slot at `dst` (`cap` bytes, NUL-padded): the runtime's
    /// fault-tolerant copy called from here (it changes rax and rcx only; rdi and
    /// rsi are saved around it, rdx was saved by the head); a fault is counted.
    fn read_str(&mut self, dst: weft_ir::Place, addr: Reg, cap: u32) -> R {
        let at = self.place(dst);
        let mut o = 0;
        while o < cap as i32 {
            self.a.mov(qword_ptr(rsp + at + o), 0)?;
            o += 8;
        }
        let src = self.cell(addr);
        self.a.mov(rax, src)?;
        self.a.push(rdi)?;
        self.a.push(rsi)?;
        self.a.lea(rdi, qword_ptr(rsp + 16 + at))?;
        self.a.mov(rsi, rax)?;
        self.a.mov(edx, cap - 1)?;
        self.a.mov(rax, self.site.safe_strcpy)?;
        self.a.call(rax)?;
        self.a.pop(rsi)?;
        self.a.pop(rdi)?;
        let mut ok = self.a.create_label();
        self.a.bt(rax, 63)?;
        self.a.jnc(ok)?;
        self.count_error(weft_ir::ErrorKind::ReadFault as usize)?;
        self.bind(&mut ok)
    }

    /// A slot whose entry is not live (`state`): an empty one proves the key
    /// `absent`; a tombstone continues the chain (falls through); an entry being
    /// inserted leaves it `unsure`.
    fn past_unlive(&mut self, state: AsmMemoryOperand, absent: CodeLabel, unsure: CodeLabel) -> R {
        self.a.cmp(state, ENTRY_EMPTY as i32)?;
        self.a.je(absent)?;
        self.a.cmp(state, ENTRY_DELETED as i32)?;
        self.a.jne(unsure)
    }

    /// [`Cx::probe_key`] for a key known before the site runs (`words`, also at
    /// `[rsp + koff]` for the helper): its hash and the slots it may be in are
    /// constants here, so a hit compares the slot's state, hash and key words.
    fn probe_known_key(
        &mut self,
        map: MapId,
        words: &[u64],
        found: CodeLabel,
        absent: CodeLabel,
    ) -> R {
        let m = self.maps[map.0 as usize];
        let table = self.table(map);
        let mask = m.capacity - 1;
        let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
        let hash = weft_abi::key_hash(&bytes);
        let mut unsure = self.a.create_label();
        self.a.mov(rcx, qword_ptr(table))?;
        for j in 0..KEY_PROBES.min(m.capacity) {
            let index = hash.wrapping_add(j) & mask;
            let Ok(at) = i32::try_from(u64::from(index) * u64::from(m.entry_size)) else {
                return self.a.jmp(unsure);
            };
            let mut next = self.a.create_label();
            let mut not_live = self.a.create_label();
            self.a.cmp(dword_ptr(rcx + at), ENTRY_LIVE as i32)?;
            self.a.jne(not_live)?;
            self.a.cmp(dword_ptr(rcx + at + 4), hash as i32)?;
            self.a.jne(next)?;
            for (w, &v) in words.iter().enumerate() {
                let o = at + 8 + 8 * w as i32;
                match i32::try_from(v as i64) {
                    Ok(imm) => self.a.cmp(qword_ptr(rcx + o), imm)?,
                    Err(_) => {
                        self.a.mov(rax, v)?;
                        self.a.cmp(qword_ptr(rcx + o), rax)?;
                    }
                }
                self.a.jne(next)?;
            }
            self.a.mov(edx, index)?;
            self.a.jmp(found)?;
            self.bind(&mut not_live)?;
            self.past_unlive(dword_ptr(rcx + at), absent, unsure)?;
            self.bind(&mut next)?;
        }
        self.bind(&mut unsure)
    }

    /// edx = the index of the entry of the key at `key` in map `map`
    /// ([`Cx::probe_key`], or [`Cx::probe_known_key`] when the key is known
    /// before the site runs), inserted by the `MapIndex` helper when it is not
    /// found; to `full` when the map has no room (the helper counted it).
    fn index_or_insert(&mut self, map: MapId, key: weft_ir::Place, full: CodeLabel) -> R {
        let m = self.maps[map.0 as usize];
        let koff = self.place(key);
        let mut found = self.a.create_label();
        let mut insert = self.a.create_label();
        match self.known_key(key, m.key_size / 8) {
            Some(words) if !m.string_key && m.key_size.is_multiple_of(8) => {
                self.probe_known_key(map, &words, found, insert)?
            }
            _ => self.probe_key(map, koff, found, insert)?,
        }
        self.bind(&mut insert)?;
        self.call_map_helper(self.site.map_index, map, koff, HelperArg::Slot)?;
        self.a.test(rax, rax)?;
        self.a.js(full)?;
        self.a.mov(edx, eax)?;
        self.bind(&mut found)
    }

    /// rdx = the address of entry edx of map `map` (its header).
    fn entry_at(&mut self, map: MapId) -> R {
        let m = self.maps[map.0 as usize];
        let table = self.table(map);
        self.a.imul_3(edx, edx, m.entry_size as i32)?;
        self.a.add(rdx, qword_ptr(table))
    }

    /// `@m[key] = count()` / `sum(v)` with an 8-byte key: the entry is looked up
    /// ([`Cx::probe_key`]) and this thread's accumulator of it added to. A key not
    /// found is inserted by the `MapIndex` helper.
    fn keyed_agg(&mut self, map: MapId, key: weft_ir::Place, op: AggOp) -> Result<(), JitError> {
        let m = self.maps[map.0 as usize];
        let acc = (self.site.thread_agg_off + m.agg_off) as i32;
        let mut skip = self.a.create_label();
        self.index_or_insert(map, key, skip)?;
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

    /// Where this thread's entry of map `map` is, from its slot (r11), when the map
    /// is thread-keyed (`MapLayout::thread_keyed`: its key is always the thread's
    /// id, so the entry is `[present, value]` in the thread's own slot).
    fn own_entry(&self, map: MapId) -> Option<i32> {
        let m = self.maps[map.0 as usize];
        m.thread_keyed
            .then(|| (self.site.thread_agg_off + m.agg_off) as i32)
    }

    /// `dst = @m[key]` of a plain map of 8-byte values (0 when the key is absent).
    fn plain_load(&mut self, map: MapId, key: weft_ir::Place, dst: Option<Reg>) -> R {
        if let Some(acc) = self.own_entry(map) {
            self.a.mov(rax, qword_ptr(r11 + acc + 8))?;
            return match dst {
                Some(d) => self.store(d, rax),
                None => Ok(()),
            };
        }
        let (_, voff, _) = entry_layout(8, 8);
        let koff = self.place(key);
        let mut found = self.a.create_label();
        let mut absent = self.a.create_label();
        let mut done = self.a.create_label();
        self.probe_key(map, koff, found, absent)?;
        self.call_map_helper(self.site.map_key, map, koff, HelperArg::Op(MAP_KEY_FIND))?;
        self.a.test(rax, rax)?;
        self.a.js(absent)?;
        self.a.mov(edx, eax)?;
        self.bind(&mut found)?;
        self.entry_at(map)?;
        self.a.mov(rax, qword_ptr(rdx + voff as i32))?;
        self.a.jmp(done)?;
        self.bind(&mut absent)?;
        self.a.xor(eax, eax)?;
        self.bind(&mut done)?;
        match dst {
            Some(d) => self.store(d, rax),
            None => Ok(()),
        }
    }

    /// `@m[key] = src` of a plain map of 8-byte values; a new key is inserted by
    /// the `MapIndex` helper (which counts a full map).
    fn plain_store(&mut self, map: MapId, key: weft_ir::Place, src: Reg) -> R {
        if let Some(acc) = self.own_entry(map) {
            self.load(rax, src)?;
            self.a.mov(qword_ptr(r11 + acc + 8), rax)?;
            return self.a.mov(qword_ptr(r11 + acc), 1);
        }
        let (_, voff, _) = entry_layout(8, 8);
        let mut skip = self.a.create_label();
        self.index_or_insert(map, key, skip)?;
        self.entry_at(map)?;
        self.load(rax, src)?;
        self.a.mov(qword_ptr(rdx + voff as i32), rax)?;
        self.bind(&mut skip)
    }

    /// `delete(@m[key])` of a plain map of 8-byte values, as `weft_runtime::map::
    /// delete` does it: the live entry becomes a tombstone (compare-and-swap, so
    /// one of two deleters wins), the map's count drops, the value is zeroed.
    /// `dst` = 1 when this deleted it.
    fn plain_delete(&mut self, map: MapId, key: weft_ir::Place, dst: Option<Reg>) -> R {
        if let Some(acc) = self.own_entry(map) {
            self.a.mov(rax, qword_ptr(r11 + acc))?;
            self.a.mov(qword_ptr(r11 + acc), 0)?;
            self.a.mov(qword_ptr(r11 + acc + 8), 0)?;
            return match dst {
                Some(d) => self.store(d, rax),
                None => Ok(()),
            };
        }
        let (_, voff, _) = entry_layout(8, 8);
        let koff = self.place(key);
        let count = self.site.shm_base
            + self.site.maps_off
            + u64::from(map.0) * core::mem::size_of::<MapDesc>() as u64
            + core::mem::offset_of!(MapDesc, count) as u64;
        let mut found = self.a.create_label();
        let mut absent = self.a.create_label();
        let mut done = self.a.create_label();
        self.probe_key(map, koff, found, absent)?;
        self.call_map_helper(self.site.map_key, map, koff, HelperArg::Op(MAP_KEY_DELETE))?;
        self.a.jmp(done)?;
        self.bind(&mut found)?;
        self.entry_at(map)?;
        self.a.mov(eax, ENTRY_LIVE)?;
        self.a.mov(ecx, ENTRY_DELETED)?;
        self.a.lock().cmpxchg(dword_ptr(rdx), ecx)?;
        self.a.jne(absent)?;
        self.a.mov(qword_ptr(rdx + voff as i32), 0)?;
        self.a.mov(rcx, count)?;
        self.a.lock().dec(dword_ptr(rcx))?;
        self.a.mov(eax, 1)?;
        self.a.jmp(done)?;
        self.bind(&mut absent)?;
        self.a.xor(eax, eax)?;
        self.bind(&mut done)?;
        match dst {
            Some(d) => self.store(d, rax),
            None => Ok(()),
        }
    }

    /// rax = `helper(shm, map, &key, arg)` (`MapIndex`: arg = this thread's slot;
    /// `MapKey`: an operation). The head saved rax, rcx, rdx and the flags; the
    /// other registers a call may change (rsi, rdi, r8-r11, xmm0-15) are saved
    /// here, on a 16-aligned stack.
    fn call_map_helper(&mut self, helper: u64, map: MapId, koff: i32, arg: HelperArg) -> R {
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
        match arg {
            HelperArg::Slot => self.a.mov(rcx, r11)?,
            HelperArg::Op(op) => self.a.mov(ecx, op as u32)?,
        }
        self.a.mov(rax, helper)?;
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

    /// rax = `nsecs`, read from the TSC through the segment's clock (a seqlock:
    /// read again while weft is setting it). Clobbers rcx and rdx.
    fn tsc_nsecs(&mut self) -> R {
        let clock = self.site.shm_base + core::mem::offset_of!(ShmHeader, clock) as u64;
        let seq = core::mem::offset_of!(TscClock, seq) as i32;
        let mult = core::mem::offset_of!(TscClock, mult) as i32;
        let base_tsc = core::mem::offset_of!(TscClock, base_tsc) as i32;
        let base_ns = core::mem::offset_of!(TscClock, base_ns) as i32;
        let mut retry = self.a.create_label();
        let mut spin = self.a.create_label();
        let mut done = self.a.create_label();
        self.a.mov(rcx, clock)?;
        self.bind(&mut retry)?;
        self.a.mov(rax, qword_ptr(rcx + seq))?;
        self.a.test(al, 1)?;
        self.a.jnz(spin)?;
        self.a.push(rax)?;
        self.a.rdtsc()?;
        self.a.shl(rdx, 32)?;
        self.a.or(rax, rdx)?;
        self.a.sub(rax, qword_ptr(rcx + base_tsc))?;
        self.a.imul(qword_ptr(rcx + mult))?;
        self.a.shrd(rax, rdx, TSC_SHIFT)?;
        self.a.add(rax, qword_ptr(rcx + base_ns))?;
        self.a.pop(rdx)?;
        self.a.cmp(rdx, qword_ptr(rcx + seq))?;
        self.a.je(done)?;
        self.bind(&mut spin)?;
        self.a.pause()?;
        self.a.jmp(retry)?;
        self.bind(&mut done)
    }

    /// An event written straight into this thread's ring, as `weft_runtime::ring::
    /// produce` writes it (r11 = the thread's slot): a pad record first when the
    /// record would cross the ring's end; when the ring is full, a wait of up to
    /// `ShmHeader::ring_wait_spins` for weft to make room (unless this thread's
    /// last wait timed out), then the event is dropped and counted.
    fn emit(&mut self, kind: weft_ir::EventKind, payload: Option<weft_ir::Place>, len: u32) -> R {
        use weft_ir::EventKind;
        let (k, id, args) = match kind {
            EventKind::FuncEntry => (EVENT_FUNC_ENTRY, self.site.site_index, 0u64),
            EventKind::FuncExit => (EVENT_FUNC_EXIT, self.site.site_index, 0),
            other => other.record().expect("every other event is the program's"),
        };
        let size = self.site.ring_size;
        // An entry without arguments or an exit without a value: 16 bytes, half
        // the memory `weft record` moves (weft_abi::EVENT_FUNC_ENTRY_SHORT).
        let short = match kind {
            EventKind::FuncEntry => len == 0,
            EventKind::FuncExit => payload.is_none(),
            _ => false,
        } && id < weft_abi::SHORT_EVENT_SITES;
        if short {
            let code = if kind == EventKind::FuncEntry {
                weft_abi::EVENT_FUNC_ENTRY_TSC
            } else {
                weft_abi::EVENT_FUNC_EXIT_TSC
            };
            return self.emit_short(code | (id << 8));
        }
        let rec = u64::from(round8(EVENT_HEADER_SIZE + len));
        let ring = self.site.ring_off as i32;
        let slot = |f: usize| (f) as i32;
        let head = slot(core::mem::offset_of!(ThreadSlot, ring_head));
        let tail = slot(core::mem::offset_of!(ThreadSlot, ring_tail));
        let lost_at = slot(core::mem::offset_of!(ThreadSlot, events_lost));
        let stalled = slot(core::mem::offset_of!(ThreadSlot, ring_stalled));
        let wait = self.site.shm_base + core::mem::offset_of!(ShmHeader, ring_wait_spins) as u64;
        if kind == EventKind::Exit {
            let flag = self.site.shm_base + core::mem::offset_of!(ShmHeader, exit_requested) as u64;
            self.a.mov(rax, flag)?;
            self.a.mov(dword_ptr(rax), 1)?;
        }
        // [rsp] spins waited, [rsp+8] the time, [rsp+16] the arguments word; the
        // body's cells are `pushed` bytes further.
        let pushed: i32 = 24;
        if kind == EventKind::FuncExit {
            let m = self.at(self.fr.rax());
            self.a.push(m)?;
        } else {
            self.a.mov(rax, args)?;
            self.a.push(rax)?;
        }
        self.tsc_nsecs()?;
        self.a.push(rax)?;
        self.a.push(0)?;
        // ThreadSlot::events_produced is the runtime's; nothing reads it, and
        // inline advice leaves it alone (one read-modify-write less an event).
        let mut retry = self.a.create_label();
        let mut pad = self.a.create_label();
        let mut write = self.a.create_label();
        let mut full = self.a.create_label();
        let mut lost = self.a.create_label();
        let mut count = self.a.create_label();
        let mut done = self.a.create_label();
        self.bind(&mut retry)?;
        self.a.mov(rcx, qword_ptr(r11 + head))?;
        self.a.mov(rdx, rcx)?;
        self.a.and(rdx, (size - 1) as i32)?;
        // A record that would cross the ring's end goes after a pad (out of line).
        self.a.cmp(rdx, (size - rec) as i32)?;
        self.a.ja(pad)?;
        // Room when head - tail <= size - len.
        self.a.mov(rax, rcx)?;
        self.a.sub(rax, qword_ptr(r11 + tail))?;
        self.a.cmp(rax, (size - rec) as i32)?;
        self.a.ja(full)?;
        self.bind(&mut write)?;
        self.a.mov(rax, rec | (u64::from(k) << 32))?;
        self.a.mov(qword_ptr(r11 + rdx + ring), rax)?;
        self.a.mov(rax, u64::from(id) | (u64::from(len) << 32))?;
        self.a.mov(qword_ptr(r11 + rdx + ring + 8), rax)?;
        self.a.mov(rax, qword_ptr(rsp + 16))?;
        self.a.mov(qword_ptr(r11 + rdx + ring + 16), rax)?;
        self.a.mov(rax, qword_ptr(rsp + 8))?;
        self.a.mov(qword_ptr(r11 + rdx + ring + 24), rax)?;
        if let Some(p) = payload {
            let at = self.place(p) + pushed;
            let mut o = 0;
            while o < len as i32 {
                self.a.mov(rax, qword_ptr(rsp + at + o))?;
                self.a.mov(qword_ptr(r11 + rdx + ring + 32 + o), rax)?;
                o += 8;
            }
        }
        self.a.add(rcx, rec as i32)?;
        self.a.mov(qword_ptr(r11 + head), rcx)?;
        self.a.jmp(done)?;
        // rax = the pad; room when head + pad - tail <= size - len; then a pad
        // record (its length, kind EVENT_PAD: 0) and the record at the start.
        self.bind(&mut pad)?;
        self.a.mov(rax, size)?;
        self.a.sub(rax, rdx)?;
        self.a.add(rax, rcx)?;
        self.a.sub(rax, qword_ptr(r11 + tail))?;
        self.a.cmp(rax, (size - rec) as i32)?;
        self.a.ja(full)?;
        self.a.mov(rax, size)?;
        self.a.sub(rax, rdx)?;
        self.a.mov(qword_ptr(r11 + rdx + ring), rax)?;
        self.a.add(rcx, rax)?;
        self.a.xor(edx, edx)?;
        self.a.jmp(write)?;
        self.bind(&mut full)?;
        self.a.mov(rax, wait)?;
        self.a.mov(rax, qword_ptr(rax))?;
        self.a.cmp(qword_ptr(rsp), rax)?;
        self.a.jae(lost)?;
        self.a.cmp(qword_ptr(r11 + stalled), 0)?;
        self.a.jne(count)?;
        self.a.add(qword_ptr(rsp), 1)?;
        self.a.pause()?;
        self.a.jmp(retry)?;
        self.bind(&mut lost)?;
        // A wait that ran out: weft is not draining; drop at once from now on.
        self.a.cmp(qword_ptr(rsp), 0)?;
        self.a.je(count)?;
        self.a.mov(qword_ptr(r11 + stalled), 1)?;
        self.bind(&mut count)?;
        self.a.add(qword_ptr(r11 + lost_at), 1)?;
        self.bind(&mut done)?;
        self.a.add(rsp, pushed)?;
        Ok(())
    }

    /// A short event (16 bytes: length, `kind_id` = kind | site << 8, the raw TSC)
    /// written as [`Cx::emit`] writes one, with nothing on the stack on its way:
    /// the time stays in rax, the header goes in as two 32-bit immediates, and the
    /// head is read again rather than kept (r11 = the thread's slot; clobbers rcx
    /// and rdx). The pad, the wait for room and the count of a lost event are out
    /// of line.
    fn emit_short(&mut self, kind_id: u32) -> R {
        let size = self.site.ring_size;
        let rec = u64::from(weft_abi::SHORT_EVENT_SIZE);
        let room = (size - rec) as i32;
        let ring = self.site.ring_off as i32;
        let head = core::mem::offset_of!(ThreadSlot, ring_head) as i32;
        let tail = core::mem::offset_of!(ThreadSlot, ring_tail) as i32;
        let lost_at = core::mem::offset_of!(ThreadSlot, events_lost) as i32;
        let stalled = core::mem::offset_of!(ThreadSlot, ring_stalled) as i32;
        let wait = self.site.shm_base + core::mem::offset_of!(ShmHeader, ring_wait_spins) as u64;
        let mut retry = self.a.create_label();
        let mut pad = self.a.create_label();
        let mut write = self.a.create_label();
        let mut full = self.a.create_label();
        let mut spin = self.a.create_label();
        let mut lost = self.a.create_label();
        let mut count = self.a.create_label();
        let mut done = self.a.create_label();
        // The raw TSC (weft_abi::EVENT_FUNC_ENTRY_TSC): readers convert it on
        // the clock's line of the moment; inline advice runs only when the
        // segment's clock is the TSC (Caps::tsc_clock).
        self.a.rdtsc()?;
        self.a.shl(rdx, 32)?;
        self.a.or(rax, rdx)?;
        self.bind(&mut retry)?;
        // Room when head - tail <= size - len.
        self.a.mov(rcx, qword_ptr(r11 + head))?;
        self.a.sub(rcx, qword_ptr(r11 + tail))?;
        self.a.cmp(rcx, room)?;
        self.a.ja(full)?;
        self.a.mov(rcx, qword_ptr(r11 + head))?;
        self.a.mov(rdx, rcx)?;
        self.a.and(rdx, (size - 1) as i32)?;
        // A record that would cross the ring's end goes after a pad.
        self.a.cmp(rdx, room)?;
        self.a.ja(pad)?;
        self.bind(&mut write)?;
        self.a.mov(dword_ptr(r11 + rdx + ring), rec as u32)?;
        self.a.mov(dword_ptr(r11 + rdx + ring + 4), kind_id)?;
        self.a.mov(qword_ptr(r11 + rdx + ring + 8), rax)?;
        self.a.add(rcx, rec as i32)?;
        self.a.mov(qword_ptr(r11 + head), rcx)?;
        self.bind(&mut done)?;
        let mut end = self.a.create_label();
        self.a.jmp(end)?;
        // The pad, `size - rdx` bytes: room when head + pad - tail <= size - len;
        // then a pad record (its length, kind EVENT_PAD: 0) and the record at the
        // ring's start.
        self.bind(&mut pad)?;
        self.a.push(rax)?;
        self.a.mov(rax, size)?;
        self.a.sub(rax, rdx)?;
        self.a.add(rax, rcx)?;
        self.a.sub(rax, qword_ptr(r11 + tail))?;
        self.a.cmp(rax, room)?;
        let mut pad_full = self.a.create_label();
        self.a.ja(pad_full)?;
        self.a.mov(rax, size)?;
        self.a.sub(rax, rdx)?;
        self.a.mov(qword_ptr(r11 + rdx + ring), rax)?;
        self.a.add(rcx, rax)?;
        self.a.xor(edx, edx)?;
        self.a.pop(rax)?;
        self.a.jmp(write)?;
        self.bind(&mut pad_full)?;
        self.a.pop(rax)?;
        // No room: wait up to `ring_wait_spins` for weft (the count on the stack),
        // unless this thread's last wait timed out; then drop and count.
        self.bind(&mut full)?;
        self.a.cmp(qword_ptr(r11 + stalled), 0)?;
        self.a.jne(count)?;
        self.a.push(0)?;
        self.bind(&mut spin)?;
        self.a.mov(rcx, wait)?;
        self.a.mov(rcx, qword_ptr(rcx))?;
        self.a.cmp(qword_ptr(rsp), rcx)?;
        self.a.jae(lost)?;
        self.a.add(qword_ptr(rsp), 1)?;
        self.a.pause()?;
        // Room now (a pad's too, at most the whole ring less the record)?
        self.a.mov(rcx, qword_ptr(r11 + head))?;
        self.a.sub(rcx, qword_ptr(r11 + tail))?;
        self.a.cmp(rcx, room)?;
        self.a.ja(spin)?;
        self.a.add(rsp, 8)?;
        self.a.jmp(retry)?;
        // A wait that ran out: weft is not draining; drop at once from now on
        // (not when no wait is asked for: a lossy ring).
        self.bind(&mut lost)?;
        self.a.cmp(qword_ptr(rsp), 0)?;
        self.a.lea(rsp, qword_ptr(rsp + 8))?;
        self.a.je(count)?;
        self.a.mov(qword_ptr(r11 + stalled), 1)?;
        self.bind(&mut count)?;
        self.a.add(qword_ptr(r11 + lost_at), 1)?;
        self.a.jmp(done)?;
        self.bind(&mut end)
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
            CtxValue::Nsecs => self.tsc_nsecs(),
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
        self.forget();
        while k < code.len() {
            // `@m = sum(K - __weft_thread(@m))` (a sequence's next step, cflow's
            // counters reset): this thread's own accumulator becomes K, a store.
            if let Some((map, value)) = set_own_sum(code, k) {
                let m = self.maps[map.0 as usize];
                let acc = (self.site.thread_agg_off + m.agg_off) as i32;
                if i32::try_from(value).is_ok() {
                    self.a.mov(qword_ptr(r11 + acc), value as i32)?;
                } else {
                    self.a.mov(rax, value as u64)?;
                    self.a.mov(qword_ptr(r11 + acc), rax)?;
                }
                self.forget();
                k += 4;
                continue;
            }
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
                    self.forget();
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
        self.compile_inst(i)?;
        self.track(i);
        Ok(())
    }

    /// Note what `i` leaves known before the site runs ([`Cx::known_words`]);
    /// any instruction not understood here forgets everything.
    fn track(&mut self, i: &Inst) {
        let word_range = |at: i32, len: i32| (at.div_euclid(8) * 8..at + len).step_by(8);
        match i {
            Inst::Const { dst, value } => {
                self.known_regs.insert(dst.0, *value as u64);
            }
            Inst::Ctx { dst, value } => {
                let v = match value {
                    CtxValue::ProbeId => Some(u64::from(self.probe)),
                    CtxValue::FuncAddr => Some(self.site.func),
                    _ => None,
                };
                match v {
                    Some(v) => self.known_regs.insert(dst.0, v),
                    None => self.known_regs.remove(&dst.0),
                };
            }
            Inst::Zero { place, len } => {
                let at = self.place(*place);
                for w in word_range(at, *len as i32) {
                    if w >= at && w + 8 <= at + *len as i32 {
                        self.known_words.insert(w, 0);
                    } else {
                        self.known_words.remove(&w);
                    }
                }
            }
            Inst::Store { place, src, size } => {
                let at = self.place(*place);
                match self.known_regs.get(&src.0) {
                    Some(&v) if *size == 8 && at % 8 == 0 => {
                        self.known_words.insert(at, v);
                    }
                    _ => {
                        for w in word_range(at, i32::from(*size)) {
                            self.known_words.remove(&w);
                        }
                    }
                }
            }
            Inst::MapAgg { .. } | Inst::CountError(_) | Inst::SetArg { .. } => {}
            _ => self.forget(),
        }
    }

    fn forget(&mut self) {
        self.known_regs.clear();
        self.known_words.clear();
    }

    /// The words of an 8-byte-aligned key at `key` of `words` words when every one
    /// is known before the site runs.
    fn known_key(&self, key: weft_ir::Place, words: u32) -> Option<Vec<u64>> {
        let at = self.place(key);
        if at % 8 != 0 {
            return None;
        }
        (0..words as i32)
            .map(|w| self.known_words.get(&(at + 8 * w)).copied())
            .collect()
    }

    fn compile_inst(&mut self, i: &Inst) -> Result<(), JitError> {
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
            Inst::MapLoad {
                map,
                key: Some(k),
                dst_reg,
                ..
            } => self.plain_load(*map, *k, *dst_reg)?,
            Inst::MapStore {
                map,
                key: Some(k),
                src_reg: Some(src),
                ..
            } => self.plain_store(*map, *k, *src)?,
            Inst::MapDelete {
                map,
                key: Some(k),
                dst,
            } => self.plain_delete(*map, *k, *dst)?,
            Inst::Emit { kind, payload, len } => self.emit(*kind, *payload, *len)?,
            Inst::ReadStr {
                dst,
                addr,
                max: None,
                cap,
            } => self.read_str(*dst, *addr, *cap)?,
            Inst::Comm { dst, .. } | Inst::PComm { dst, .. } => {
                // The slot holds them NUL-padded (the thread's name when it took
                // the slot, the process's when the session reached it).
                let from = match i {
                    Inst::Comm { .. } => core::mem::offset_of!(ThreadSlot, comm),
                    _ => core::mem::offset_of!(ThreadSlot, pcomm),
                } as i32;
                let at = self.place(*dst);
                for o in [0, 8] {
                    self.a.mov(rax, qword_ptr(r11 + from + o))?;
                    self.a.mov(qword_ptr(rsp + at + o), rax)?;
                }
            }
            Inst::Copy { dst, src, len } => {
                let (d, s) = (self.place(*dst), self.place(*src));
                let mut o = 0;
                while o + 8 <= *len as i32 {
                    self.a.mov(rax, qword_ptr(rsp + s + o))?;
                    self.a.mov(qword_ptr(rsp + d + o), rax)?;
                    o += 8;
                }
                while o < *len as i32 {
                    self.a.mov(al, byte_ptr(rsp + s + o))?;
                    self.a.mov(byte_ptr(rsp + d + o), al)?;
                    o += 1;
                }
            }
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
            // Entry advice: the live argument registers the body leaves alone,
            // or the head's saved rdx and rcx, which it restores.
            Inst::SetArg { index, value } => {
                self.load(rax, *value)?;
                match index {
                    0 => self.a.mov(rdi, rax)?,
                    1 => self.a.mov(rsi, rax)?,
                    2 => {
                        let m = self.at(self.fr.rdx());
                        self.a.mov(m, rax)?
                    }
                    3 => {
                        let m = self.at(self.fr.rcx());
                        self.a.mov(m, rax)?
                    }
                    4 => self.a.mov(r8, rax)?,
                    5 => self.a.mov(r9, rax)?,
                    _ => return Err(JitError::BadProgram(format!("argument {index}"))),
                }
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
/// At `code[k..k + 4]`: `Const { a, K }`, `ThreadSum { b, m }`, `Binary { Sub, c,
/// a, b }`, `MapAgg { m, None, Sum(c) }`, with `a`, `b` and `c` read nowhere else,
/// and `m` a keyless sum: adding `K - own` to this thread's own accumulator of `m`
/// (which only this thread writes) sets it to `K`. Returns `m` and `K`.
fn set_own_sum(code: &[Inst], k: usize) -> Option<(MapId, i64)> {
    let [Inst::Const { dst: a, value }, Inst::ThreadSum { dst: b, map }, Inst::Binary {
        op: BinOp::Sub,
        dst: c,
        a: a2,
        b: b2,
    }, Inst::MapAgg {
        map: m2,
        key: None,
        op: AggOp::Sum(c2),
    }] = code.get(k..k + 4)?
    else {
        return None;
    };
    if a != a2 || b != b2 || c != c2 || map != m2 {
        return None;
    }
    // The three registers are this pattern's own: no other instruction mentions
    // them (the lowering gives each expression fresh registers).
    let mentions = |r: Reg| {
        let pat = format!("Reg({})", r.0);
        code.iter()
            .enumerate()
            .filter(|(i, _)| !(k..k + 4).contains(i))
            .any(|(_, inst)| format!("{inst:?}").contains(&pat))
    };
    if mentions(*a) || mentions(*b) || mentions(*c) {
        return None;
    }
    Some((*map, *value))
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
        known_regs: HashMap::new(),
        known_words: HashMap::new(),
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
        known_regs: HashMap::new(),
        known_words: HashMap::new(),
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
