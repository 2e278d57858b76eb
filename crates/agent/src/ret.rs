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
//!   matching by slot address keeps them apart. A coroutine resumed on another
//!   thread returns through entries of the thread that suspended it: they are
//!   claimed from that thread's stack (`steal`).
//! * C++ exceptions: the unwinder must see real return addresses, so
//!   [`weft_agent_on_raise`] (run at the entry of `_Unwind_RaiseException` and
//!   friends) writes them back first; those frames report no return event.
//! * At unweave weft writes every pending return address back itself, with the
//!   world stopped, and tombstones the entries: no trampoline address outlives a
//!   session (the unwinder hooks do not either).

use core::arch::global_asm;
use core::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use weft_abi::*;

use crate::{session, threads};

/// Frame + saved xmm0-15, 16-aligned. The advice may call helpers that use any xmm
/// register, and a caller compiled with -fipa-ra may keep values in any of them.
const AREA: usize = (FRAME_SIZE + 256).div_ceil(16) * 16;

// The return trampoline. Entered by `ret` from a hijacked function: rsp = S + 8,
// where S is the slot that held the return address. Every register and the
// arithmetic flags are preserved (callers compiled with -fipa-ra keep values in
// "caller-saved" registers across calls to functions that do not touch them).
//
// Fast path: the top shadow entry is this slot's (the common case). Pop it, run the
// return advice with a frame if there is one, put the real return address back in S
// and `jmp` to it (a `jmp` keeps the return-stack predictor in step with the calls).
// Anything else (stale entries above, no thread state) goes to the slow path.
//
// Stack in the fast path (rsp after the pushes = S - 32):
//   [S] real return address   [S-8] rax   [S-16] flags (lahf/seto)   [S-24] rdx
//   [S-32] rcx
global_asm!(
    ".text",
    ".p2align 4",
    ".globl weft_agent_return_trampoline",
    ".type weft_agent_return_trampoline,@function",
    "weft_agent_return_trampoline:",
    "    lea rsp, [rsp - 8]",
    "    push rax",
    "    lahf",
    "    seto al",
    "    push rax",
    "    push rdx",
    "    push rcx",
    "    mov rcx, qword ptr [rip + weft_agent_tls@GOTTPOFF]",
    "    mov rcx, qword ptr fs:[rcx]",
    "    test rcx, rcx",
    "    jz 8f",
    "    mov edx, dword ptr [rcx + {depth}]",
    "    test edx, edx",
    "    jz 8f",
    "    dec edx",
    "    shl rdx, 6",
    "    add rdx, qword ptr [rcx + {shadow}]",
    "    lea rax, [rsp + 32]",
    "    cmp qword ptr [rdx + {e_slot}], rax",
    "    jne 8f",
    // The real return address goes back into S before anything else can happen.
    "    mov rax, qword ptr [rdx + {e_ret}]",
    "    mov qword ptr [rsp + 32], rax",
    "    cmp qword ptr [rdx + {e_advice}], 0",
    "    je 5f",
    "    cmp dword ptr [rcx + {nest}], 0",
    "    jne 5f",
    "    cmp qword ptr [rcx + {tslot}], 0",
    "    je 5f",
    "    mov eax, dword ptr [rip + {generation}]",
    "    cmp dword ptr [rdx + {e_session}], eax",
    "    jne 5f",
    // Raise nest before popping: from here a signal handler on this thread runs no
    // advice, so nothing pushes over the entry we still read.
    "    inc dword ptr [rcx + {nest}]",
    "    dec dword ptr [rcx + {depth}]",
    "    mov rax, qword ptr [rdx + {e_stub}]",
    "    test rax, rax",
    "    jz 6f",
    "    push rcx",
    "    push rdx",
    "    call rax",
    "    pop rdx",
    "    pop rcx",
    "    test eax, eax",
    "    jz 4f",
    "6:",
    // Run the advice with a frame: registers as returned, rip = real return address.
    // rbp = S - 40: [rbp] rbp, [rbp+8] rcx, [rbp+16] rdx, [rbp+24] flags, [rbp+32] rax.
    "    push rbp",
    "    mov rbp, rsp",
    "    sub rsp, {area}",
    "    and rsp, -16",
    // The slot is read once: the control thread nulls it when the session ends,
    // concurrently with this path (the session stays mapped while we are here).
    "    mov rax, qword ptr [rcx + {tslot}]",
    "    test rax, rax",
    "    jz 9f",
    "    mov qword ptr [rsp + {f_thread}], rax",
    "    mov rax, qword ptr [rbp + 32]",
    "    mov qword ptr [rsp + 0], rax",
    "    mov qword ptr [rsp + 8], rbx",
    "    mov rax, qword ptr [rbp + 8]",
    "    mov qword ptr [rsp + 16], rax",
    "    mov rax, qword ptr [rbp + 16]",
    "    mov qword ptr [rsp + 24], rax",
    "    mov qword ptr [rsp + 32], rsi",
    "    mov qword ptr [rsp + 40], rdi",
    "    mov rax, qword ptr [rbp]",
    "    mov qword ptr [rsp + 48], rax",
    "    lea rax, [rbp + 48]",
    "    mov qword ptr [rsp + 56], rax",
    "    mov qword ptr [rsp + 64], r8",
    "    mov qword ptr [rsp + 72], r9",
    "    mov qword ptr [rsp + 80], r10",
    "    mov qword ptr [rsp + 88], r11",
    "    mov qword ptr [rsp + 96], r12",
    "    mov qword ptr [rsp + 104], r13",
    "    mov qword ptr [rsp + 112], r14",
    "    mov qword ptr [rsp + 120], r15",
    "    mov rax, qword ptr [rdx + {e_ret}]",
    "    mov qword ptr [rsp + 128], rax",
    "    mov qword ptr [rsp + 136], 0",
    "    mov rax, qword ptr [rdx + {e_shm}]",
    "    mov qword ptr [rsp + {f_shm}], rax",
    "    mov eax, dword ptr [rdx + {e_site}]",
    "    mov qword ptr [rsp + {f_site}], rax",
    "    mov rax, qword ptr [rdx + {e_func}]",
    "    mov qword ptr [rsp + {f_func}], rax",
    "    mov qword ptr [rsp + {f_tstate}], rcx",
    "    mov eax, dword ptr [rdx + {e_probe}]",
    "    mov qword ptr [rsp + {f_probe}], rax",
    "    movdqu xmmword ptr [rsp + {frame} + 0], xmm0",
    "    movdqu xmmword ptr [rsp + {frame} + 16], xmm1",
    "    movdqu xmmword ptr [rsp + {frame} + 32], xmm2",
    "    movdqu xmmword ptr [rsp + {frame} + 48], xmm3",
    "    movdqu xmmword ptr [rsp + {frame} + 64], xmm4",
    "    movdqu xmmword ptr [rsp + {frame} + 80], xmm5",
    "    movdqu xmmword ptr [rsp + {frame} + 96], xmm6",
    "    movdqu xmmword ptr [rsp + {frame} + 112], xmm7",
    "    movdqu xmmword ptr [rsp + {frame} + 128], xmm8",
    "    movdqu xmmword ptr [rsp + {frame} + 144], xmm9",
    "    movdqu xmmword ptr [rsp + {frame} + 160], xmm10",
    "    movdqu xmmword ptr [rsp + {frame} + 176], xmm11",
    "    movdqu xmmword ptr [rsp + {frame} + 192], xmm12",
    "    movdqu xmmword ptr [rsp + {frame} + 208], xmm13",
    "    movdqu xmmword ptr [rsp + {frame} + 224], xmm14",
    "    movdqu xmmword ptr [rsp + {frame} + 240], xmm15",
    "    mov rax, qword ptr [rdx + {e_advice}]",
    // The advice may clobber rsi, rdi, r8-r11 (reloaded below from the frame); rdx
    // (the entry) is kept on the stack, twice for alignment.
    "    push rdx",
    "    push rdx",
    "    lea rdi, [rsp + 16]",
    "    call rax",
    "    pop rdx",
    "    pop rdx",
    // The return value as the advice left it (`override`).
    "    mov rax, qword ptr [rsp + 0]",
    "    mov qword ptr [rbp + 32], rax",
    "    movdqu xmm0, xmmword ptr [rsp + {frame} + 0]",
    "    movdqu xmm1, xmmword ptr [rsp + {frame} + 16]",
    "    movdqu xmm2, xmmword ptr [rsp + {frame} + 32]",
    "    movdqu xmm3, xmmword ptr [rsp + {frame} + 48]",
    "    movdqu xmm4, xmmword ptr [rsp + {frame} + 64]",
    "    movdqu xmm5, xmmword ptr [rsp + {frame} + 80]",
    "    movdqu xmm6, xmmword ptr [rsp + {frame} + 96]",
    "    movdqu xmm7, xmmword ptr [rsp + {frame} + 112]",
    "    movdqu xmm8, xmmword ptr [rsp + {frame} + 128]",
    "    movdqu xmm9, xmmword ptr [rsp + {frame} + 144]",
    "    movdqu xmm10, xmmword ptr [rsp + {frame} + 160]",
    "    movdqu xmm11, xmmword ptr [rsp + {frame} + 176]",
    "    movdqu xmm12, xmmword ptr [rsp + {frame} + 192]",
    "    movdqu xmm13, xmmword ptr [rsp + {frame} + 208]",
    "    movdqu xmm14, xmmword ptr [rsp + {frame} + 224]",
    "    movdqu xmm15, xmmword ptr [rsp + {frame} + 240]",
    "    mov rsi, qword ptr [rsp + 32]",
    "    mov rdi, qword ptr [rsp + 40]",
    "    mov r8, qword ptr [rsp + 64]",
    "    mov r9, qword ptr [rsp + 72]",
    "    mov r10, qword ptr [rsp + 80]",
    "    mov r11, qword ptr [rsp + 88]",
    "    mov rcx, qword ptr [rsp + {f_tstate}]",
    "9:  mov rsp, rbp",
    "    pop rbp",
    "4:  dec dword ptr [rcx + {nest}]",
    "    jmp 7f",
    "5:  dec dword ptr [rcx + {depth}]",
    "7:  pop rcx",
    "    pop rdx",
    "    pop rax",
    "    add al, 0x7f",
    "    sahf",
    "    pop rax",
    "    lea rsp, [rsp + 8]",
    "    jmp qword ptr [rsp - 8]",
    // Slow path: back to the entry state, then the general routine.
    "8:  pop rcx",
    "    pop rdx",
    "    pop rax",
    "    add al, 0x7f",
    "    sahf",
    "    pop rax",
    "    lea rsp, [rsp + 8]",
    "    jmp weft_agent_return_slow",
    ".globl weft_agent_return_trampoline_end",
    "weft_agent_return_trampoline_end:",
    ".size weft_agent_return_trampoline, . - weft_agent_return_trampoline",
    //
    // The general routine: full register and flags save, `on_return` finds the entry
    // for this slot wherever it is, runs the advice, and returns the real address.
    // rbp = S - 24: [rbp] rbp, [rbp+8] flags, [rbp+16] rax, [rbp+24] = S.
    ".p2align 4",
    ".hidden weft_agent_return_slow",
    ".globl weft_agent_return_slow",
    "weft_agent_return_slow:",
    "    lea rsp, [rsp - 8]",
    "    push rax",
    "    lahf",
    "    seto al",
    "    push rax",
    "    push rbp",
    "    mov rbp, rsp",
    "    sub rsp, {area}",
    "    and rsp, -16",
    "    mov rax, [rbp + 16]",
    "    mov [rsp + 0], rax",
    "    mov [rsp + 8], rbx",
    "    mov [rsp + 16], rcx",
    "    mov [rsp + 24], rdx",
    "    mov [rsp + 32], rsi",
    "    mov [rsp + 40], rdi",
    "    mov rax, [rbp]",
    "    mov [rsp + 48], rax",
    "    lea rax, [rbp + 32]",
    "    mov [rsp + 56], rax",
    "    mov [rsp + 64], r8",
    "    mov [rsp + 72], r9",
    "    mov [rsp + 80], r10",
    "    mov [rsp + 88], r11",
    "    mov [rsp + 96], r12",
    "    mov [rsp + 104], r13",
    "    mov [rsp + 112], r14",
    "    mov [rsp + 120], r15",
    "    mov qword ptr [rsp + 136], 0",
    "    movdqu xmmword ptr [rsp + {frame} + 0], xmm0",
    "    movdqu xmmword ptr [rsp + {frame} + 16], xmm1",
    "    movdqu xmmword ptr [rsp + {frame} + 32], xmm2",
    "    movdqu xmmword ptr [rsp + {frame} + 48], xmm3",
    "    movdqu xmmword ptr [rsp + {frame} + 64], xmm4",
    "    movdqu xmmword ptr [rsp + {frame} + 80], xmm5",
    "    movdqu xmmword ptr [rsp + {frame} + 96], xmm6",
    "    movdqu xmmword ptr [rsp + {frame} + 112], xmm7",
    "    movdqu xmmword ptr [rsp + {frame} + 128], xmm8",
    "    movdqu xmmword ptr [rsp + {frame} + 144], xmm9",
    "    movdqu xmmword ptr [rsp + {frame} + 160], xmm10",
    "    movdqu xmmword ptr [rsp + {frame} + 176], xmm11",
    "    movdqu xmmword ptr [rsp + {frame} + 192], xmm12",
    "    movdqu xmmword ptr [rsp + {frame} + 208], xmm13",
    "    movdqu xmmword ptr [rsp + {frame} + 224], xmm14",
    "    movdqu xmmword ptr [rsp + {frame} + 240], xmm15",
    "    mov rdi, rsp",
    "    call {on_return}",
    "    mov [rbp + 24], rax",
    "    movdqu xmm0, xmmword ptr [rsp + {frame} + 0]",
    "    movdqu xmm1, xmmword ptr [rsp + {frame} + 16]",
    "    movdqu xmm2, xmmword ptr [rsp + {frame} + 32]",
    "    movdqu xmm3, xmmword ptr [rsp + {frame} + 48]",
    "    movdqu xmm4, xmmword ptr [rsp + {frame} + 64]",
    "    movdqu xmm5, xmmword ptr [rsp + {frame} + 80]",
    "    movdqu xmm6, xmmword ptr [rsp + {frame} + 96]",
    "    movdqu xmm7, xmmword ptr [rsp + {frame} + 112]",
    "    movdqu xmm8, xmmword ptr [rsp + {frame} + 128]",
    "    movdqu xmm9, xmmword ptr [rsp + {frame} + 144]",
    "    movdqu xmm10, xmmword ptr [rsp + {frame} + 160]",
    "    movdqu xmm11, xmmword ptr [rsp + {frame} + 176]",
    "    movdqu xmm12, xmmword ptr [rsp + {frame} + 192]",
    "    movdqu xmm13, xmmword ptr [rsp + {frame} + 208]",
    "    movdqu xmm14, xmmword ptr [rsp + {frame} + 224]",
    "    movdqu xmm15, xmmword ptr [rsp + {frame} + 240]",
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
    "    pop rax",
    "    add al, 0x7f",
    "    sahf",
    "    pop rax",
    "    lea rsp, [rsp + 8]",
    "    jmp qword ptr [rsp - 8]",
    ".globl weft_agent_return_slow_end",
    "weft_agent_return_slow_end:",
    area = const AREA,
    frame = const FRAME_SIZE,
    depth = const AGENT_THREAD_SHADOW_DEPTH_OFF,
    shadow = const AGENT_THREAD_SHADOW_OFF,
    nest = const AGENT_THREAD_NEST_OFF,
    tslot = const AGENT_THREAD_SLOT_OFF,
    e_ret = const SHADOW_RET_OFF,
    e_slot = const SHADOW_SLOT_OFF,
    e_advice = const SHADOW_ADVICE_OFF,
    e_func = const SHADOW_FUNC_OFF,
    e_site = const SHADOW_SITE_OFF,
    e_session = const SHADOW_SESSION_OFF,
    e_probe = const SHADOW_PROBE_OFF,
    e_stub = const SHADOW_STUB_OFF,
    e_shm = const SHADOW_SHM_OFF,
    f_thread = const FRAME_THREAD_OFF,
    f_shm = const FRAME_SHM_OFF,
    f_site = const FRAME_SITE_OFF,
    f_func = const FRAME_FUNC_OFF,
    f_tstate = const FRAME_TSTATE_OFF,
    f_probe = const FRAME_PROBE_OFF,
    generation = sym session::CURRENT_GENERATION,
    on_return = sym on_return,
);

unsafe extern "C" {
    fn weft_agent_return_trampoline();
    static weft_agent_return_slow_end: u8;
}

pub fn trampoline_addr() -> u64 {
    weft_agent_return_trampoline as *const () as u64
}

/// The return path's code (the fast and slow routines are contiguous).
pub fn trampoline_range() -> (u64, u64) {
    // SAFETY: only the address of the end label is taken.
    (trampoline_addr(), unsafe {
        &weft_agent_return_slow_end as *const u8 as u64
    })
}

/// A hijacked return arrived without a matching shadow entry anywhere.
pub static LOST_RETURNS: AtomicU64 = AtomicU64::new(0);
/// Returns whose entry was found in another thread's shadow stack: a coroutine
/// suspended inside a hijacked frame and resumed on another thread.
pub static MIGRATED_RETURNS: AtomicU64 = AtomicU64::new(0);

// Shadow stacks are written by their own thread, except for one field: another
// thread may claim an entry by swapping its `slot` to 0 (see `steal`). A slot of 0
// is a tombstone: it never matches a return, and is dropped when it reaches the top
// or when the stack is compacted. Entries are moved only by `gc`, which no thief may
// overlap (`shadow_gc` / `shadow_thieves`, a Dekker-style handshake in which the
// owner gives up rather than waits).

fn entry(t: *const AgentThread, i: usize) -> *mut ShadowEntry {
    // SAFETY: callers pass i < shadow_cap of a pool thread; shadow is its array.
    unsafe { (*t).shadow.add(i) }
}

fn slot_of<'a>(e: *mut ShadowEntry) -> &'a AtomicU64 {
    // SAFETY: e points into a shadow stack (pool memory, mapped while it can be reached: see `threads::release`); the slot
    // field is 8-aligned and accessed atomically wherever threads may share it.
    unsafe { AtomicU64::from_ptr(core::ptr::addr_of_mut!((*e).slot)) }
}

fn depth_of<'a>(t: *mut AgentThread) -> &'a AtomicU32 {
    // SAFETY: t is a pool AgentThread (mapped while reachable); the field is 4-aligned.
    unsafe { AtomicU32::from_ptr(core::ptr::addr_of_mut!((*t).shadow_depth)) }
}

fn flag<'a>(p: *mut u32) -> &'a AtomicU32 {
    // SAFETY: p is a 4-aligned field of a pool AgentThread (mapped while reachable).
    unsafe { AtomicU32::from_ptr(p) }
}

/// The stack slots of `t`'s shadow entries not claimed yet (control thread: the
/// reaper asks before reusing a gone thread's stack).
pub fn pending_slots(t: *mut AgentThread) -> Vec<u64> {
    // SAFETY: a pool AgentThread (mapped while reachable); cap is fixed once set.
    let cap = unsafe { core::ptr::read_volatile(core::ptr::addr_of!((*t).shadow_cap)) };
    // SAFETY: as above.
    let base = unsafe { core::ptr::read_volatile(core::ptr::addr_of!((*t).shadow)) };
    if base.is_null() {
        return Vec::new();
    }
    let depth = depth_of(t).load(Ordering::Acquire).min(cap) as usize;
    (0..depth)
        .map(|i| slot_of(entry(t, i)).load(Ordering::Acquire))
        .filter(|&s| s != 0)
        .collect()
}

/// Push a shadow entry for the function entered at `frame` and replace its return
/// address. Called by entry trampolines (with `frame.tstate` set) and the int3
/// handler.
#[unsafe(no_mangle)]
pub extern "C" fn weft_agent_hijack(frame: *mut Frame) {
    // SAFETY: called with a valid frame whose tstate is this thread's AgentThread.
    let f = unsafe { &mut *frame };
    let t = f.tstate as *mut AgentThread;
    if t.is_null() {
        return;
    }
    // SAFETY: our own AgentThread (only shadow_depth and entry slots are shared,
    // and those are accessed atomically below).
    let (depth, cap) = unsafe { ((*t).shadow_depth, (*t).shadow_cap) };
    if depth >= cap {
        gc(t);
        // SAFETY: as above.
        if unsafe { (*t).shadow_depth } >= cap {
            // SAFETY: as above.
            unsafe { (*t).shadow_overflows += 1 };
            return;
        }
    }
    let slot = f.regs.rsp;
    // SAFETY: at a function entry rsp points at the return address, in this
    // thread's live stack.
    let ret = unsafe { (slot as *const u64).read() };
    let (generation, shm, advice, stub, probe) = match session::current() {
        Some(s) if f.site < u64::from(s.shm.header().max_sites) => {
            let site = s.shm.site(f.site as u32);
            (
                s.generation as u32,
                s.shm.base() as u64,
                site.return_advice,
                site.return_stub,
                site.return_probe,
            )
        }
        _ => (0, 0, 0, 0, 0),
    };
    // SAFETY: as above.
    let depth = unsafe { (*t).shadow_depth };
    // SAFETY: depth < cap: a free entry of our own stack, invisible to other threads
    // until the depth store below publishes it.
    unsafe {
        entry(t, depth as usize).write(ShadowEntry {
            ret,
            slot,
            advice,
            func: f.func,
            site: f.site as u32,
            session: generation,
            probe,
            _pad: 0,
            stub,
            shm,
        })
    };
    depth_of(t).store(depth + 1, Ordering::Release);
    // SAFETY: as above; the slot now returns into our trampoline.
    unsafe { (slot as *mut u64).write(trampoline_addr()) };
}

/// Drop entries that can no longer be returned through: tombstones, entries whose
/// slot no longer holds the trampoline's address, or that a later entry hijacked
/// again. Skipped (the stack stays full) while another thread searches it.
fn gc(t: *mut AgentThread) {
    // SAFETY: pool fields of our own AgentThread.
    let (gcf, thieves) = unsafe {
        (
            flag(core::ptr::addr_of_mut!((*t).shadow_gc)),
            flag(core::ptr::addr_of_mut!((*t).shadow_thieves)),
        )
    };
    gcf.store(1, Ordering::SeqCst);
    if thieves.load(Ordering::SeqCst) != 0 {
        gcf.store(0, Ordering::Release);
        return;
    }
    let tramp = trampoline_addr();
    let depth = depth_of(t).load(Ordering::Relaxed) as usize;
    let mut keep = 0;
    for i in 0..depth {
        let s = slot_of(entry(t, i)).load(Ordering::Relaxed);
        let live = s != 0
            && weft_runtime::safe::load(s, 8) == Some(tramp)
            && !(i + 1..depth).any(|j| slot_of(entry(t, j)).load(Ordering::Relaxed) == s);
        if live {
            // SAFETY: both indices are below depth in our own stack; no thief is
            // looking (handshake above).
            unsafe { entry(t, keep).write(entry(t, i).read()) };
            keep += 1;
        }
    }
    // SAFETY: our own AgentThread.
    unsafe { (*t).shadow_discarded += (depth - keep) as u64 };
    depth_of(t).store(keep as u32, Ordering::Release);
    gcf.store(0, Ordering::Release);
}

/// Claim the entry for `slot` in another thread's shadow stack: a coroutine that
/// was suspended inside hijacked frames on that thread returns through them here.
/// The claim is a compare-and-swap of the entry's slot to 0, so exactly one thread
/// gets it (another thief, or its owner's `restore_all`).
fn steal(me: *mut AgentThread, slot: u64) -> Option<ShadowEntry> {
    for other in threads::all() {
        if other == me {
            continue;
        }
        // SAFETY: pool fields (mapped: a hijacked return is outstanding).
        let (gcf, thieves) = unsafe {
            (
                flag(core::ptr::addr_of_mut!((*other).shadow_gc)),
                flag(core::ptr::addr_of_mut!((*other).shadow_thieves)),
            )
        };
        loop {
            thieves.fetch_add(1, Ordering::SeqCst);
            if gcf.load(Ordering::SeqCst) == 0 {
                break;
            }
            // The owner is compacting: wait for it (it never waits for us).
            thieves.fetch_sub(1, Ordering::SeqCst);
            while gcf.load(Ordering::Acquire) != 0 {
                core::hint::spin_loop();
            }
        }
        // SAFETY: pool fields; a thread not yet set up reads as zeros (no stack).
        let (base, cap) = unsafe {
            (
                core::ptr::read_volatile(core::ptr::addr_of!((*other).shadow)),
                core::ptr::read_volatile(core::ptr::addr_of!((*other).shadow_cap)),
            )
        };
        let mut got = None;
        if !base.is_null() {
            let depth = depth_of(other).load(Ordering::Acquire).min(cap) as usize;
            for i in (0..depth).rev() {
                let e = entry(other, i);
                if slot_of(e).load(Ordering::Acquire) != slot {
                    continue;
                }
                // While the slot reads `slot` the owner does not rewrite the entry:
                // it only pops or tombstones its own live slots, and `slot` is ours.
                // SAFETY: an entry of a pool shadow stack.
                let copy = unsafe { core::ptr::read_volatile(e) };
                if slot_of(e)
                    .compare_exchange(slot, 0, Ordering::SeqCst, Ordering::Relaxed)
                    .is_ok()
                {
                    got = Some(ShadowEntry { slot, ..copy });
                    break;
                }
            }
        }
        thieves.fetch_sub(1, Ordering::Release);
        if got.is_some() {
            MIGRATED_RETURNS.fetch_add(1, Ordering::Relaxed);
            return got;
        }
    }
    None
}

extern "C" fn on_return(frame: *mut Frame) -> u64 {
    // SAFETY: the return trampoline passes its frame area.
    let f = unsafe { &mut *frame };
    let tp = threads::get_or_create();
    // SAFETY: this thread's AgentThread; a coroutine resumed on a thread that never
    // hijacked anything may have none yet (then tp is still usable once created).
    let Some(t) = (unsafe { tp.as_mut() }) else {
        fatal()
    };
    t.nest += 1;
    let slot = f.regs.rsp - 8;
    let depth = t.shadow_depth as usize;
    let pos = (0..depth)
        .rev()
        .find(|&i| slot_of(entry(tp, i)).load(Ordering::Relaxed) == slot);
    let found = match pos {
        Some(pos) => {
            // SAFETY: an entry of our own stack, below depth.
            let e = unsafe { entry(tp, pos).read() };
            // Tombstone it, then pop the tombstones at the top (entries are never
            // moved here: another thread may be searching this stack).
            slot_of(entry(tp, pos)).store(0, Ordering::Release);
            let mut d = depth;
            while d > 0 && slot_of(entry(tp, d - 1)).load(Ordering::Relaxed) == 0 {
                d -= 1;
            }
            depth_of(tp).store(d as u32, Ordering::Release);
            Some(e)
        }
        None => steal(tp, slot),
    };
    let Some(entry) = found else {
        // No entry anywhere: if the slot no longer holds our address, someone gave
        // the frame its real return address back after we left it (`restore_all`
        // of the thread that hijacked it, or weft at unweave): return there.
        match weft_runtime::safe::load(slot, 8) {
            Some(v) if v != trampoline_addr() => {
                t.nest -= 1;
                return v;
            }
            _ => {
                LOST_RETURNS.fetch_add(1, Ordering::Relaxed);
                fatal()
            }
        }
    };
    f.regs.rip = entry.ret;
    let live = session::CURRENT_GENERATION.load(Ordering::Acquire);
    // Read once: the control thread nulls it when the session ends.
    // SAFETY: a field of our own AgentThread.
    let tslot = unsafe { core::ptr::read_volatile(core::ptr::addr_of!(t.slot)) };
    if entry.advice != 0
        && entry.session == live
        && live != 0
        && t.flags & THREAD_FLAG_IGNORE == 0
        && t.nest == 1
        && !tslot.is_null()
    {
        f.thread = tslot;
        f.shm = entry.shm as *mut u8;
        f.site = u64::from(entry.site);
        f.func = entry.func;
        f.tstate = t as *mut AgentThread as *mut u8;
        f.probe = u64::from(entry.probe);
        // SAFETY: the advice of the live session, compiled by weft into one of its
        // code regions (kept mapped while any thread is inside advice).
        let func: extern "C" fn(*mut Frame) = unsafe { core::mem::transmute(entry.advice) };
        func(f);
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
    // Called on every thread, with or without a session, without `nest` raised by
    // the trampoline. A thread already inside the agent (`nest != 0`: a signal
    // handler interrupted a push or pop, and throws) must not touch its stack.
    let t = threads::current();
    // SAFETY: our own AgentThread, if any.
    let Some(th) = (unsafe { t.as_mut() }) else {
        return;
    };
    if th.nest != 0 {
        return;
    }
    th.nest += 1;
    restore_all(t);
    // SAFETY: as above (restore_all does not keep a reference).
    unsafe { (*t).nest -= 1 };
}

/// Write back every pending return address of `t` (this thread's) and empty its
/// shadow stack. Each entry is claimed (slot → 0) after its address is written
/// back, so a thread that took it first returns to the same address.
pub fn restore_all(t: *mut AgentThread) {
    let tramp = trampoline_addr();
    let depth = depth_of(t).load(Ordering::Relaxed) as usize;
    let mut n = 0;
    // Newest first, so a slot hijacked twice ends with its oldest real value.
    for i in (0..depth).rev() {
        let e = entry(t, i);
        let s = slot_of(e).load(Ordering::Acquire);
        if s == 0 {
            continue;
        }
        // SAFETY: an entry of our own stack; `ret` is not written by others.
        let ret = unsafe { core::ptr::read_volatile(core::ptr::addr_of!((*e).ret)) };
        if weft_runtime::safe::load(s, 8) == Some(tramp) {
            weft_runtime::safe::store(s, ret, 8);
        }
        if slot_of(e)
            .compare_exchange(s, 0, Ordering::SeqCst, Ordering::Relaxed)
            .is_ok()
        {
            n += 1;
        }
    }
    // SAFETY: our own AgentThread.
    unsafe { (*t).shadow_discarded += n };
    depth_of(t).store(0, Ordering::Release);
}
