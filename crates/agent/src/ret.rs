//! Return probes: return-address replacement with a per-thread shadow stack.
//!
//! At the entry of a function with a return probe, [`weft_agent_hijack`] pushes
//! `(real return address, stack slot, site)` and writes the address of
//! `weft_agent_return_trampoline` into the slot. When the function returns there,
//! [`on_return`] finds the topmost entry for that slot, runs the return advice and
//! hands back the real address, to which the trampoline returns.
//!
//! * Recursion: each activation has its own slot, so entries pair up exactly.
//! * `longjmp` out of hijacked frames leaves their entries behind; they are never
//!   matched (the topmost entry for a slot is always the latest hijack of it) and are
//!   collected when the stack fills up (`gc`).
//! * Coroutines (`swapcontext`): entries of several stacks interleave on one thread;
//!   matching by slot address keeps them apart.
//! * C++ exceptions: the unwinder must see real return addresses, so
//!   [`weft_agent_on_raise`] (run at the entry of `_Unwind_RaiseException` and
//!   friends) writes them back first; those frames report no return event.

use core::arch::global_asm;
use core::sync::atomic::{AtomicU64, Ordering};
use weft_abi::{AgentThread, Frame, ShadowEntry, FRAME_SIZE};

use crate::{session, threads};

/// Frame + saved xmm0/xmm1, 16-aligned.
const AREA: usize = (FRAME_SIZE + 32).div_ceil(16) * 16;

global_asm!(
    ".text",
    ".p2align 4",
    ".globl weft_agent_return_trampoline",
    ".type weft_agent_return_trampoline,@function",
    "weft_agent_return_trampoline:",
    // Entered by `ret` from a hijacked function: rsp = slot + 8.
    "    sub rsp, 8",
    "    push rbp",
    "    mov rbp, rsp",
    "    sub rsp, {area}",
    "    and rsp, -16",
    "    mov [rsp + 0], rax",
    "    mov [rsp + 8], rbx",
    "    mov [rsp + 16], rcx",
    "    mov [rsp + 24], rdx",
    "    mov [rsp + 32], rsi",
    "    mov [rsp + 40], rdi",
    "    mov rax, [rbp]",
    "    mov [rsp + 48], rax",
    "    lea rax, [rbp + 16]",
    "    mov [rsp + 56], rax",
    "    mov [rsp + 64], r8",
    "    mov [rsp + 72], r9",
    "    mov [rsp + 80], r10",
    "    mov [rsp + 88], r11",
    "    mov [rsp + 96], r12",
    "    mov [rsp + 104], r13",
    "    mov [rsp + 112], r14",
    "    mov [rsp + 120], r15",
    "    movdqu [rsp + {frame}], xmm0",
    "    movdqu [rsp + {frame} + 16], xmm1",
    "    mov rdi, rsp",
    "    call {on_return}",
    "    mov [rbp + 8], rax",
    "    movdqu xmm0, [rsp + {frame}]",
    "    movdqu xmm1, [rsp + {frame} + 16]",
    "    mov rax, [rsp + 0]",
    "    mov rbx, [rsp + 8]",
    "    mov rcx, [rsp + 16]",
    "    mov rdx, [rsp + 24]",
    "    mov rsi, [rsp + 32]",
    "    mov rdi, [rsp + 40]",
    "    mov r8, [rsp + 64]",
    "    mov r9, [rsp + 72]",
    "    mov r10, [rsp + 80]",
    "    mov r11, [rsp + 88]",
    "    mov r12, [rsp + 96]",
    "    mov r13, [rsp + 104]",
    "    mov r14, [rsp + 112]",
    "    mov r15, [rsp + 120]",
    "    mov rsp, rbp",
    "    pop rbp",
    "    ret",
    ".globl weft_agent_return_trampoline_end",
    "weft_agent_return_trampoline_end:",
    ".size weft_agent_return_trampoline, . - weft_agent_return_trampoline",
    area = const AREA,
    frame = const FRAME_SIZE,
    on_return = sym on_return,
);

unsafe extern "C" {
    fn weft_agent_return_trampoline();
    static weft_agent_return_trampoline_end: u8;
}

pub fn trampoline_addr() -> u64 {
    weft_agent_return_trampoline as *const () as u64
}

pub fn trampoline_range() -> (u64, u64) {
    // SAFETY: only the address of the end label is taken.
    (trampoline_addr(), unsafe {
        &weft_agent_return_trampoline_end as *const u8 as u64
    })
}

/// A hijacked return arrived without a matching shadow entry.
pub static LOST_RETURNS: AtomicU64 = AtomicU64::new(0);

fn entries<'a>(t: &AgentThread) -> &'a mut [ShadowEntry] {
    // SAFETY: the shadow stack has shadow_cap entries, owned by this thread.
    unsafe { core::slice::from_raw_parts_mut(t.shadow, t.shadow_cap as usize) }
}

/// Push a shadow entry for the function entered at `frame` and replace its return
/// address. Called by entry trampolines (with `frame.tstate` set) and the int3
/// handler.
#[unsafe(no_mangle)]
pub extern "C" fn weft_agent_hijack(frame: *mut Frame) {
    // SAFETY: called with a valid frame whose tstate is this thread's AgentThread.
    let f = unsafe { &mut *frame };
    // SAFETY: as above.
    let Some(t) = (unsafe { (f.tstate as *mut AgentThread).as_mut() }) else {
        return;
    };
    if t.shadow_depth >= t.shadow_cap {
        gc(t);
        if t.shadow_depth >= t.shadow_cap {
            t.shadow_overflows += 1;
            return;
        }
    }
    let slot = f.regs.rsp;
    // SAFETY: at a function entry rsp points at the return address, in this
    // thread's live stack.
    let ret = unsafe { (slot as *const u64).read() };
    let generation = session::current().map_or(0, |s| s.generation as u32);
    entries(t)[t.shadow_depth as usize] = ShadowEntry {
        ret,
        slot,
        site: f.site as u32,
        session: generation,
        entry_nsecs: 0,
    };
    t.shadow_depth += 1;
    // SAFETY: as above; the slot now returns into our trampoline.
    unsafe { (slot as *mut u64).write(trampoline_addr()) };
}

/// Drop entries that can no longer be returned through: their slot no longer holds
/// the trampoline's address, or a later entry hijacked the same slot.
fn gc(t: &mut AgentThread) {
    let tramp = trampoline_addr();
    let depth = t.shadow_depth as usize;
    let e = entries(t);
    let mut keep = 0;
    for i in 0..depth {
        let live = weft_runtime::safe::load(e[i].slot, 8) == Some(tramp)
            && !e[i + 1..depth].iter().any(|later| later.slot == e[i].slot);
        if live {
            e[keep] = e[i];
            keep += 1;
        }
    }
    t.shadow_discarded += (depth - keep) as u64;
    t.shadow_depth = keep as u32;
}

extern "C" fn on_return(frame: *mut Frame) -> u64 {
    // SAFETY: the return trampoline passes its frame area.
    let f = unsafe { &mut *frame };
    let t = threads::current();
    // SAFETY: a hijack happened on this thread, so its AgentThread exists.
    let Some(t) = (unsafe { t.as_mut() }) else {
        fatal()
    };
    t.nest += 1;
    let slot = f.regs.rsp - 8;
    let depth = t.shadow_depth as usize;
    let e = entries(t);
    let Some(pos) = e[..depth].iter().rposition(|x| x.slot == slot) else {
        LOST_RETURNS.fetch_add(1, Ordering::Relaxed);
        fatal()
    };
    let entry = e[pos];
    e.copy_within(pos + 1..depth, pos);
    t.shadow_depth -= 1;
    f.regs.rip = entry.ret;
    if let Some(s) = session::current() {
        if s.generation as u32 == entry.session && entry.site < s.shm.header().max_sites {
            let site = s.shm.site(entry.site);
            let advice = site.return_advice;
            if advice != 0 && t.flags & weft_abi::THREAD_FLAG_IGNORE == 0 && t.nest == 1 {
                let slot_ptr = threads::attach_slot(t);
                if !slot_ptr.is_null() {
                    f.thread = slot_ptr;
                    f.shm = s.shm.base();
                    f.site = u64::from(entry.site);
                    f.func = site.func;
                    f.tstate = t as *mut AgentThread as *mut u8;
                    f.probe = u64::from(site.return_probe);
                    // SAFETY: return_advice is compiled advice weft wrote into a code
                    // region of this session.
                    let func: extern "C" fn(*mut Frame) = unsafe { core::mem::transmute(advice) };
                    func(f);
                }
            }
        }
    }
    t.nest -= 1;
    entry.ret
}

/// No shadow entry matches a hijacked return: there is no address to return to.
/// This cannot happen unless the stack was copied behind our back; say so clearly.
fn fatal() -> ! {
    const MSG: &[u8] = b"weft agent: a hijacked return address has no shadow entry; aborting\n";
    // SAFETY: write(2) to stderr and abort are async-signal-safe.
    unsafe {
        libc::write(2, MSG.as_ptr() as *const _, MSG.len());
        libc::abort()
    }
}

/// Entry advice of `_Unwind_RaiseException`, `_Unwind_Resume_or_Rethrow` and
/// `_Unwind_ForcedUnwind`: give every hijacked frame of this thread its real return
/// address back before the unwinder walks the stack.
#[unsafe(no_mangle)]
pub extern "C" fn weft_agent_on_raise(_frame: *mut Frame) {
    let t = threads::current();
    // SAFETY: our own AgentThread, if any.
    let Some(t) = (unsafe { t.as_mut() }) else {
        return;
    };
    restore_all(t);
}

/// Write back every pending return address of `t` and empty its shadow stack.
pub fn restore_all(t: &mut AgentThread) {
    let tramp = trampoline_addr();
    let depth = t.shadow_depth as usize;
    let e = entries(t);
    // Newest first, so a slot hijacked twice ends with its oldest real value.
    for x in e[..depth].iter().rev() {
        if weft_runtime::safe::load(x.slot, 8) == Some(tramp) {
            weft_runtime::safe::store(x.slot, x.ret, 8);
        }
    }
    t.shadow_discarded += depth as u64;
    t.shadow_depth = 0;
}
