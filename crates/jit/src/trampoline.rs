//! Entry trampolines for jump sites.
//!
//! A patched site jumps here. The head saves every general-purpose register, the
//! arithmetic flags and xmm0–15 into a [`weft_abi::Frame`] on an aligned stack area,
//! finds the thread's agent state through the TLS slot, runs each entry advice (and
//! the return-address hijack for return probes), restores everything and falls
//! through into the relocated displaced instructions, which the caller appends (they
//! end with the jump back).
//!
//! Nothing may be assumed dead, not even at a function's entry: with GCC's
//! interprocedural register allocation (`-fipa-ra`, on at -O2) a caller keeps values
//! in "caller-saved" registers across a call to a function it knows leaves them
//! alone. Flags are saved with `lahf`/`seto` (`pushfq`/`popfq` costs ~7 ns here).
//!
//! ```text
//!   [lea rsp,[rsp-128]]              only off function entry: skip the red zone
//!   push rax; lahf; seto al; push rax
//!   mov rax,rsp; and rsp,-16; sub rsp,AREA   P = rax
//!   save registers, xmm0-7, P, rip, flags
//!   mov rax,fs:[tls]; test; jz slow; cmp [rax+nest],0; jne skip
//!   mov rcx,[rax+slot]; test; jz slow
//! have: fill frame; inc nest; call advice...; [call hijack]; dec nest; jmp skip
//! slow: call thread_attach → rax=thread, rdx=slot; test rdx; jz skip; jmp have
//! skip: restore; mov rsp,P; pop rax; add al,0x7f; sahf; pop rax; [lea rsp,[rsp+128]]
//!   <relocated instructions, jump back>
//! ```
//!
//! Re-entrancy: advice never runs while the thread is already inside advice
//! (`nest != 0`): a probed function called by a helper, or from a signal handler
//! that interrupted advice, is skipped.
//!
//! Everything is addressed absolutely, so the head is position-independent.

use iced_x86::code_asm::*;
use weft_abi::{
    AGENT_THREAD_NEST_OFF, AGENT_THREAD_SLOT_OFF, AROUND_OFF, AROUND_ORIG_OFF,
    AROUND_PROCEEDED_OFF, AROUND_RAX_OFF, AROUND_RDX_OFF, AROUND_SIZE, AROUND_TAKEN_OFF,
    AROUND_XMM0_OFF, AROUND_XMM1_OFF, DATA_NEW_OFF, DATA_OLD_OFF, FRAME_FUNC_OFF, FRAME_PROBE_OFF,
    FRAME_SHM_OFF, FRAME_SITE_OFF, FRAME_SIZE, FRAME_THREAD_OFF, FRAME_TSTATE_OFF, HEAD_XMM_OFF,
};

use crate::JitError;

/// What a trampoline head needs to know.
#[derive(Clone, Debug)]
pub struct EntryTrampoline {
    /// Address of the patched instruction (reported as `regs.rip`).
    pub site_addr: u64,
    /// Entry address of the function.
    pub func: u64,
    /// Index of the site in the shared site table.
    pub site_index: u32,
    /// Entry advice to call, in order, each with its probe name index.
    pub calls: Vec<(u64, u32)>,
    /// The agent's hijack function, for sites with return probes.
    pub hijack: Option<u64>,
    /// Around advice and its probe name index (a function entry only): run after
    /// the entry advice and the hijack; when it takes the call, the head returns to
    /// the caller with its value instead of falling into the relocated instructions
    /// (which `proceed` calls as the original function).
    pub around: Option<(u64, u32)>,
    /// The site is a function entry: flags, r11 and the red zone are dead.
    pub at_entry: bool,
    pub shm_base: u64,
    pub tls_offset: i64,
    pub thread_attach: u64,
    /// Call the advice on every thread, with or without a session or a thread slot,
    /// and without raising `nest` (the agent's internal unwinder hooks, which must
    /// work until the last hijacked frame is gone; the callee guards itself).
    pub unconditional: bool,
    /// A return site (the head runs just before a `ret`): `regs.rip` is the return
    /// address, where the thread goes next, as a return probe reports it.
    pub return_site: bool,
    /// An access site (a data pointcut by instruction rewriting): the head follows
    /// `weft_x86::access_middle` (see `weft_x86::access`), not a jump.
    pub data: Option<DataHead>,
}

/// The head of an access site. Its entry stack, above the saved flags and rax it
/// pushes itself: `new`, `rax` again, `old`, `rax` before the access, the skipped red
/// zone, then the site's stack. The advice finds `old` and `new` after its frame
/// (`weft_abi::DATA_OLD_OFF`, `DATA_NEW_OFF`; the word at `DATA_OLD_OFF` is the
/// head's saved-stack pointer otherwise, kept in the around state meanwhile, which
/// an access site never uses).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DataHead {
    /// The watched bytes' address (where a changed `new` is written).
    pub var: u64,
    /// How many bytes `new` covers when written back (1, 2, 4 or 8).
    pub size: u32,
    /// After the advice, write `new` to the variable if the advice changed it (`new =
    /// EXPR` under `--unsafe`).
    pub write_back: bool,
}

/// Where the head's stack above its frame starts, relative to its saved-flags
/// pointer P, for an access site: P+16 `new`, P+32 `old`.
const DATA_NEW_AT: i32 = 16;
const DATA_OLD_AT: i32 = 32;
/// Site `rsp` = P + this at an access site (flags and rax, the four words of the
/// access code, the red zone).
const DATA_EXTRA: i32 = 16 + 32 + 128;

const OFF_P: i32 = FRAME_SIZE as i32;
const OFF_XMM: i32 = HEAD_XMM_OFF as i32;
/// Frame, P, all sixteen xmm registers (helpers are ordinary compiled code and may
/// use any of them; a `-fipa-ra` caller may keep values in any of them), and the
/// state of an around advice.
const AREA: i32 = ((AROUND_OFF + AROUND_SIZE) as i32 + 15) & !15;
const _: () = assert!(HEAD_XMM_OFF == FRAME_SIZE + 16);
/// An access site's P while the advice runs (the around state is free there).
const DATA_P_SAVE: i32 = AROUND_RAX_OFF as i32;
const _: () = assert!(DATA_OLD_OFF == FRAME_SIZE && DATA_NEW_OFF == FRAME_SIZE + 8);

fn reg_off(i: usize) -> i32 {
    (i * 8) as i32
}

// Indices into weft_abi::Regs.
const RAX: usize = 0;
const RDX: usize = 3;
const RSP: usize = 7;
const RIP: usize = 16;
const FLAGS: usize = 17;

/// The registers saved and restored by index (all but rax and rsp).
fn saved_regs() -> [(usize, AsmRegister64); 14] {
    [
        (1, rbx),
        (2, rcx),
        (3, rdx),
        (4, rsi),
        (5, rdi),
        (6, rbp),
        (8, r8),
        (9, r9),
        (10, r10),
        (11, r11),
        (12, r12),
        (13, r13),
        (14, r14),
        (15, r15),
    ]
}

pub(crate) fn xmms() -> [AsmRegisterXmm; 16] {
    [
        xmm0, xmm1, xmm2, xmm3, xmm4, xmm5, xmm6, xmm7, xmm8, xmm9, xmm10, xmm11, xmm12, xmm13,
        xmm14, xmm15,
    ]
}

/// Emit the head. The relocated instructions must follow it immediately.
///
/// Heads of the same shape differ only in a few constants, and assembling one costs
/// ~20 µs, so each shape is assembled once with sentinel constants, the sentinels'
/// byte offsets are recorded, and every site gets a copy with its own values written
/// in (whole-program weaving of 10,000 functions would otherwise spend 0.2-0.3 s
/// here). A shape whose sentinels are not each found exactly once is assembled
/// directly instead.
pub fn entry_head(t: &EntryTrampoline) -> Result<Vec<u8>, JitError> {
    let shape = Shape {
        at_entry: t.at_entry,
        calls: t.calls.len(),
        hijack: t.hijack,
        around: t.around.is_some(),
        shm_base: t.shm_base,
        tls_offset: t.tls_offset,
        thread_attach: t.thread_attach,
        unconditional: t.unconditional,
        return_site: t.return_site,
        data: t.data.map(|d| (d.size, d.write_back)),
    };
    let cached = TEMPLATES.with(|c| c.borrow().get(&shape).cloned());
    let template = match cached {
        Some(tpl) => tpl,
        None => {
            let tpl = Template::build(&shape)?;
            TEMPLATES.with(|c| c.borrow_mut().insert(shape, tpl.clone()));
            tpl
        }
    };
    match template {
        Some(tpl) => Ok(tpl.instantiate(t)),
        None => assemble_entry_head(t),
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Shape {
    at_entry: bool,
    calls: usize,
    hijack: Option<u64>,
    around: bool,
    shm_base: u64,
    tls_offset: i64,
    thread_attach: u64,
    unconditional: bool,
    return_site: bool,
    /// An access site: the size written back and whether it is.
    data: Option<(u32, bool)>,
}

/// Byte offsets of the per-site constants in an assembled head.
#[derive(Clone, Debug)]
struct Template {
    bytes: Vec<u8>,
    site_addr: usize,
    func: usize,
    site_index: usize,
    /// (advice imm64, probe imm32) per call.
    calls: Vec<(usize, usize)>,
    /// (advice imm64, probe imm32) of the around advice.
    around: Option<(usize, usize)>,
    /// The variable's address (imm64), at an access site that writes back.
    var: Option<usize>,
}

const S_SITE: u64 = 0x5EED_5EED_0000_0001;
const S_FUNC: u64 = 0x5EED_5EED_0000_0002;
const S_ADVICE: u64 = 0x5EED_5EED_0000_0100;
const S_INDEX: u32 = 0x5EED_0001;
const S_PROBE: u32 = 0x5EED_0100;
const S_AROUND: u64 = 0x5EED_5EED_0000_0200;
const S_AROUND_PROBE: u32 = 0x5EED_0200;
const S_VAR: u64 = 0x5EED_5EED_0000_0400;

thread_local! {
    static TEMPLATES: std::cell::RefCell<std::collections::HashMap<Shape, Option<Template>>> =
        Default::default();
}

fn find_once(hay: &[u8], needle: &[u8]) -> Option<usize> {
    let mut hits = hay
        .windows(needle.len())
        .enumerate()
        .filter(|(_, w)| *w == needle);
    let first = hits.next()?.0;
    hits.next().is_none().then_some(first)
}

impl Template {
    /// Assemble `shape` with sentinels; None when they cannot be located uniquely.
    fn build(shape: &Shape) -> Result<Option<Template>, JitError> {
        let spec = EntryTrampoline {
            site_addr: S_SITE,
            func: S_FUNC,
            site_index: S_INDEX,
            calls: (0..shape.calls)
                .map(|i| (S_ADVICE + i as u64, S_PROBE + i as u32))
                .collect(),
            hijack: shape.hijack,
            around: shape.around.then_some((S_AROUND, S_AROUND_PROBE)),
            at_entry: shape.at_entry,
            shm_base: shape.shm_base,
            tls_offset: shape.tls_offset,
            thread_attach: shape.thread_attach,
            unconditional: shape.unconditional,
            return_site: shape.return_site,
            data: shape.data.map(|(size, write_back)| DataHead {
                var: S_VAR,
                size,
                write_back,
            }),
        };
        let bytes = assemble_entry_head(&spec)?;
        let q = |v: u64| find_once(&bytes, &v.to_le_bytes());
        let d = |v: u32| find_once(&bytes, &v.to_le_bytes());
        let (Some(site_addr), Some(func), Some(site_index)) = (q(S_SITE), q(S_FUNC), d(S_INDEX))
        else {
            return Ok(None);
        };
        let mut calls = Vec::new();
        for i in 0..shape.calls {
            let (Some(a), Some(p)) = (q(S_ADVICE + i as u64), d(S_PROBE + i as u32)) else {
                return Ok(None);
            };
            calls.push((a, p));
        }
        let around = match shape.around {
            false => None,
            true => {
                let (Some(a), Some(p)) = (q(S_AROUND), d(S_AROUND_PROBE)) else {
                    return Ok(None);
                };
                Some((a, p))
            }
        };
        let var = match shape.data {
            Some((_, true)) => match q(S_VAR) {
                Some(v) => Some(v),
                None => return Ok(None),
            },
            _ => None,
        };
        Ok(Some(Template {
            bytes,
            site_addr,
            func,
            site_index,
            calls,
            around,
            var,
        }))
    }

    fn instantiate(&self, t: &EntryTrampoline) -> Vec<u8> {
        let mut b = self.bytes.clone();
        let mut put = |off: usize, v: &[u8]| b[off..off + v.len()].copy_from_slice(v);
        put(self.site_addr, &t.site_addr.to_le_bytes());
        put(self.func, &t.func.to_le_bytes());
        put(self.site_index, &t.site_index.to_le_bytes());
        for (&(a, p), &(advice, probe)) in self.calls.iter().zip(&t.calls) {
            put(a, &advice.to_le_bytes());
            put(p, &probe.to_le_bytes());
        }
        if let (Some((a, p)), Some((advice, probe))) = (self.around, t.around) {
            put(a, &advice.to_le_bytes());
            put(p, &probe.to_le_bytes());
        }
        if let (Some(v), Some(d)) = (self.var, t.data) {
            put(v, &d.var.to_le_bytes());
        }
        b
    }
}

/// Assemble a head directly, without the template cache (see [`entry_head`]).
pub fn assemble_entry_head(t: &EntryTrampoline) -> Result<Vec<u8>, JitError> {
    if t.around.is_some() && (!t.at_entry || t.unconditional) {
        return Err(JitError::BadProgram(
            "around advice needs a function's entry".into(),
        ));
    }
    if t.data.is_some() && (t.around.is_some() || t.hijack.is_some() || t.unconditional) {
        return Err(JitError::BadProgram(
            "an access site has only data advice".into(),
        ));
    }
    // The red zone is skipped by the access code before an access site's head.
    let skip_red_zone = !t.at_entry && t.data.is_none();
    let mut a = CodeAssembler::new(64)?;
    let mut start = a.create_label();
    let mut have = a.create_label();
    let mut slow = a.create_label();
    let mut skip = a.create_label();
    // P points at the saved flags word; the saved rax is above it, then the site's
    // stack (past the red zone off function entry).
    let extra = if t.data.is_some() {
        DATA_EXTRA
    } else if t.at_entry {
        16
    } else {
        16 + 128
    };
    a.set_label(&mut start)?;
    if skip_red_zone {
        a.lea(rsp, qword_ptr(rsp - 128))?;
    }
    save_flags(&mut a)?;
    a.mov(rax, rsp)?;
    a.and(rsp, -16)?;
    a.sub(rsp, AREA)?;
    a.mov(qword_ptr(rsp + OFF_P), rax)?;
    for (i, r) in saved_regs() {
        a.mov(qword_ptr(rsp + reg_off(i)), r)?;
    }
    a.mov(rcx, qword_ptr(rax + 8))?;
    a.mov(qword_ptr(rsp + reg_off(RAX)), rcx)?;
    a.lea(rcx, qword_ptr(rax + extra))?;
    a.mov(qword_ptr(rsp + reg_off(RSP)), rcx)?;
    // rflags as the site saw them: SF ZF AF PF CF from ah, OF from al, bit 1 set.
    a.movzx(ecx, byte_ptr(rax + 1))?;
    a.movzx(edx, byte_ptr(rax))?;
    a.shl(edx, 11)?;
    a.or(ecx, edx)?;
    a.or(ecx, 0x202)?;
    a.mov(qword_ptr(rsp + reg_off(FLAGS)), rcx)?;
    for (i, x) in xmms().into_iter().enumerate() {
        a.movdqu(xmmword_ptr(rsp + OFF_XMM + 16 * i as i32), x)?;
    }
    a.mov(rax, t.site_addr)?;
    a.mov(qword_ptr(rsp + reg_off(RIP)), rax)?;
    if t.return_site {
        a.mov(rax, qword_ptr(rsp + reg_off(RSP)))?;
        a.mov(rax, qword_ptr(rax))?;
        a.mov(qword_ptr(rsp + reg_off(RIP)), rax)?;
    }
    if t.unconditional {
        for &(advice, probe) in &t.calls {
            a.mov(qword_ptr(rsp + FRAME_PROBE_OFF as i32), probe as i32)?;
            a.mov(qword_ptr(rsp + FRAME_TSTATE_OFF as i32), 0)?;
            a.mov(rdi, rsp)?;
            a.mov(rax, advice)?;
            a.call(rax)?;
        }
        a.jmp(skip)?;
    }
    // Thread state.
    let tls = i32::try_from(t.tls_offset).map_err(|_| JitError::BadProgram("TLS offset".into()))?;
    a.mov(rax, qword_ptr(tls).fs())?;
    a.test(rax, rax)?;
    a.jz(slow)?;
    a.cmp(dword_ptr(rax + AGENT_THREAD_NEST_OFF), 0)?;
    a.jne(skip)?;
    a.mov(rcx, qword_ptr(rax + AGENT_THREAD_SLOT_OFF))?;
    a.test(rcx, rcx)?;
    a.jz(slow)?;
    a.set_label(&mut have)?;
    a.mov(qword_ptr(rsp + FRAME_TSTATE_OFF as i32), rax)?;
    a.mov(qword_ptr(rsp + FRAME_THREAD_OFF as i32), rcx)?;
    a.inc(dword_ptr(rax + AGENT_THREAD_NEST_OFF))?;
    a.mov(rax, t.shm_base)?;
    a.mov(qword_ptr(rsp + FRAME_SHM_OFF as i32), rax)?;
    a.mov(rax, t.func)?;
    a.mov(qword_ptr(rsp + FRAME_FUNC_OFF as i32), rax)?;
    a.mov(qword_ptr(rsp + FRAME_SITE_OFF as i32), t.site_index as i32)?;
    if t.data.is_some() {
        // P moves to the around state while old and new sit after the frame.
        a.mov(rax, qword_ptr(rsp + OFF_P))?;
        a.mov(qword_ptr(rsp + DATA_P_SAVE), rax)?;
        a.mov(rcx, qword_ptr(rax + DATA_OLD_AT))?;
        a.mov(qword_ptr(rsp + DATA_OLD_OFF as i32), rcx)?;
        a.mov(rcx, qword_ptr(rax + DATA_NEW_AT))?;
        a.mov(qword_ptr(rsp + DATA_NEW_OFF as i32), rcx)?;
    }
    for &(advice, probe) in &t.calls {
        a.mov(qword_ptr(rsp + FRAME_PROBE_OFF as i32), probe as i32)?;
        a.mov(rdi, rsp)?;
        a.mov(rax, advice)?;
        a.call(rax)?;
    }
    if let Some(d) = t.data {
        a.mov(rax, qword_ptr(rsp + DATA_P_SAVE))?;
        if d.write_back {
            // `new = EXPR`: the variable takes the advice's value when it differs
            // from what the access wrote.
            let mut same = a.create_label();
            a.mov(rcx, qword_ptr(rsp + DATA_NEW_OFF as i32))?;
            a.cmp(rcx, qword_ptr(rax + DATA_NEW_AT))?;
            a.je(same)?;
            a.mov(rdx, d.var)?;
            match d.size {
                1 => a.mov(byte_ptr(rdx), cl)?,
                2 => a.mov(word_ptr(rdx), cx)?,
                4 => a.mov(dword_ptr(rdx), ecx)?,
                _ => a.mov(qword_ptr(rdx), rcx)?,
            }
            a.set_label(&mut same)?;
        }
        a.mov(qword_ptr(rsp + OFF_P), rax)?;
    }
    if let Some(h) = t.hijack {
        a.mov(rdi, rsp)?;
        a.mov(rax, h)?;
        a.call(rax)?;
    }
    if let Some((advice, probe)) = t.around {
        // The original starts right after the head: `start` + the head's length,
        // written over the sentinel once the head is assembled.
        a.mov(qword_ptr(rsp + AROUND_TAKEN_OFF as i32), 0)?;
        a.lea(rax, qword_ptr(start))?;
        a.mov(ecx, HEAD_LEN_SENTINEL)?;
        a.add(rax, rcx)?;
        a.mov(qword_ptr(rsp + AROUND_ORIG_OFF as i32), rax)?;
        a.mov(qword_ptr(rsp + FRAME_PROBE_OFF as i32), probe as i32)?;
        a.mov(rdi, rsp)?;
        a.mov(rax, advice)?;
        a.call(rax)?;
    }
    a.mov(rax, qword_ptr(rsp + FRAME_TSTATE_OFF as i32))?;
    a.dec(dword_ptr(rax + AGENT_THREAD_NEST_OFF))?;
    if t.around.is_some() {
        // Taken: return to the caller with the advice's value in rax (through the
        // saved-rax word restore_flags pops), and the original's rdx, xmm0 and xmm1
        // if it ran; every other register as the caller left it.
        let mut restore_ret = a.create_label();
        a.cmp(qword_ptr(rsp + AROUND_TAKEN_OFF as i32), 0)?;
        a.je(skip)?;
        a.mov(rax, qword_ptr(rsp + AROUND_RAX_OFF as i32))?;
        a.mov(rcx, qword_ptr(rsp + OFF_P))?;
        a.mov(qword_ptr(rcx + 8), rax)?;
        a.cmp(qword_ptr(rsp + AROUND_PROCEEDED_OFF as i32), 0)?;
        a.je(restore_ret)?;
        a.mov(rax, qword_ptr(rsp + AROUND_RDX_OFF as i32))?;
        a.mov(qword_ptr(rsp + reg_off(RDX)), rax)?;
        a.movdqu(xmm0, xmmword_ptr(rsp + AROUND_XMM0_OFF as i32))?;
        a.movdqu(xmmword_ptr(rsp + OFF_XMM), xmm0)?;
        a.movdqu(xmm0, xmmword_ptr(rsp + AROUND_XMM1_OFF as i32))?;
        a.movdqu(xmmword_ptr(rsp + OFF_XMM + 16), xmm0)?;
        a.set_label(&mut restore_ret)?;
        restore_all(&mut a)?;
        a.ret()?;
    } else {
        a.jmp(skip)?;
    }
    a.set_label(&mut slow)?;
    a.mov(rdi, rsp)?;
    a.mov(rax, t.thread_attach)?;
    a.call(rax)?;
    a.test(rdx, rdx)?;
    a.jz(skip)?;
    a.mov(rcx, rdx)?;
    a.jmp(have)?;
    a.set_label(&mut skip)?;
    restore_all(&mut a)?;
    if skip_red_zone {
        a.lea(rsp, qword_ptr(rsp + 128))?;
    }
    let mut bytes = a.assemble(0)?;
    if t.around.is_some() {
        let len = u32::try_from(bytes.len()).map_err(|_| JitError::BadProgram("head".into()))?;
        let at = find_once(&bytes, &HEAD_LEN_SENTINEL.to_le_bytes())
            .ok_or_else(|| JitError::BadProgram("around head: length not found".into()))?;
        bytes[at..at + 4].copy_from_slice(&len.to_le_bytes());
    }
    Ok(bytes)
}

/// Stands for the head's length until it is known (`mov ecx, imm32` keeps its
/// size whatever the value).
const HEAD_LEN_SENTINEL: u32 = 0x5EED_0300;

/// Registers, xmm0-15 and flags back as saved; rsp back to the site's.
fn restore_all(a: &mut CodeAssembler) -> Result<(), IcedError> {
    for (i, x) in xmms().into_iter().enumerate() {
        a.movdqu(x, xmmword_ptr(rsp + OFF_XMM + 16 * i as i32))?;
    }
    for (i, r) in saved_regs() {
        a.mov(r, qword_ptr(rsp + reg_off(i)))?;
    }
    a.mov(rax, qword_ptr(rsp + OFF_P))?;
    a.mov(rsp, rax)?;
    restore_flags(a)
}

/// `push rax; lahf; seto al; push rax`: the arithmetic flags, without `pushfq`.
pub fn save_flags(a: &mut CodeAssembler) -> Result<(), IcedError> {
    a.push(rax)?;
    a.lahf()?;
    a.seto(al)?;
    a.push(rax)
}

/// Undo [`save_flags`]: `pop rax; add al,0x7f; sahf; pop rax` (the add recreates OF
/// from the saved bit, sahf the other flags). Leaves rsp 16 bytes higher.
pub fn restore_flags(a: &mut CodeAssembler) -> Result<(), IcedError> {
    a.pop(rax)?;
    a.add(al, 0x7f)?;
    a.sahf()?;
    a.pop(rax)
}

/// A thunk that calls several return advice functions in order, each with its probe
/// name index in `frame.probe`: `extern "C" fn(*mut Frame)`.
pub fn multi_call(calls: &[(u64, u32)]) -> Result<Vec<u8>, JitError> {
    let mut a = CodeAssembler::new(64)?;
    a.push(rbx)?;
    a.mov(rbx, rdi)?;
    for &(advice, probe) in calls {
        a.mov(qword_ptr(rbx + FRAME_PROBE_OFF as i32), probe as i32)?;
        a.mov(rdi, rbx)?;
        a.mov(rax, advice)?;
        a.call(rax)?;
    }
    a.pop(rbx)?;
    a.ret()?;
    Ok(a.assemble(0)?)
}
