//! Calling a function inside the target, on one of its stopped threads.
//!
//! The thread's registers (general, and the whole x87/SSE/AVX state) are saved, then
//! set up as if it had executed `call func` with a return address in a *landing
//! pad*: a small stub weft writes into the zero padding after the code of one of the
//! target's libraries (ld.so's, usually: bytes past the end of its executable segment,
//! which nothing runs), with its data on the thread's stack:
//!
//! ```text
//!   original rsp ──▶ ┌──────────────────────┐
//!                    │ red zone (128 bytes) │  untouched: the interrupted code may use it
//!                    ├──────────────────────┤
//!                    │ pad data (64-aligned)│  result, flags, original registers and
//!                    │                      │  vector state, for the pad
//!                    ├──────────────────────┤
//!                    │ stack_data           │  ◀── CallArg::StackData (16-aligned)
//!                    ├──────────────────────┤  ◀── 16-aligned (rsp at the call)
//!   rsp at entry ──▶ │ landing pad address  │
//!                    └──────────────────────┘
//! ```
//!
//! The function returns into the pad, which stores `rax` and raises a flag in its
//! data, then waits (a `futex` wait of 50 ms, six times). weft sees the flag,
//! interrupts the thread, puts every original register back, `orig_rax` and `rax`
//! included, so a system call the stop interrupted is restarted on resume, and gives
//! the padding its bytes back at once; during the call `orig_rax` is -1 so the
//! kernel does not "restart" a system call into it.
//!
//! If weft dies during the call (killed at any point), the kernel lets the thread go
//! and it carries on with the function. When it returns, the pad, after its wait,
//! restores the original state *and* the padding's bytes itself, with no code of its
//! own left to run once the padding is restored: it raises a `leaving` flag, opens
//! `/proc/self/mem`, then leaves through three `rt_sigreturn` frames weft prepared on
//! the stack, each entered from a gadget in the target's own code (libc's), never
//! from the pad:
//!
//! ```text
//!  pad:  ... rt_sigreturn(frame A)
//!  A:    rip = `syscall; ret` gadget: pwrite(fd, saved bytes, pad)  ─ret─▶ R
//!  R:    `mov rax, 15; syscall` (libc's __restore_rt): rt_sigreturn(frame B)
//!  B:    rip = `syscall; ret` gadget: close(fd)                    ─ret─▶ R
//!  R:    rt_sigreturn(frame C)
//!  C:    every original register, rflags, vector state, signal mask, rip and rsp
//! ```
//!
//! Frames A and B block every signal. An interrupted system call is entered again
//! (`rip` back on the `syscall`, its number in `rax`); one the kernel would have
//! continued through `restart_syscall` (a relative sleep or timed wait) starts over
//! with its original arguments, since `rt_sigreturn` forgets the restart block: it
//! may last longer, never returns `EINTR`. The target never sees the call.
//!
//! What may be left behind, only when weft dies: the padding's bytes, if the target
//! has no such gadgets (then frame C is entered straight from the pad) or cannot open
//! `/proc/self/mem` (no `/proc` in its mount namespace), or if weft dies in the few
//! microseconds between writing the pad and setting the thread's registers. Those
//! bytes lie past the end of the segment's code (as the program headers give it), so
//! no instruction of the program ever jumps there.
//!
//! If weft is merely slow (it sees the flag only after the pad stopped waiting), it
//! single-steps the thread through the rest of the way home.
//!
//! If the thread blocks SIGSEGV, SIGSEGV is unblocked for the call (and the mask put
//! back after): the kernel resets the handler of a fault signal that is blocked when
//! it is raised, which would silently remove the target's own SIGSEGV handler.

use std::ops::Range;
use std::time::{Duration, Instant};

use libc::user_regs_struct;

use crate::error::{AbandonedCall, InjectError, Result};
use crate::process;
use crate::stop::{
    is_fault, Deadline, PendingSignal, StopKind, StoppedProcess, StoppedThread, GRACE,
};
use crate::sys::{self, Backoff, WaitEvent};

/// How long [`StoppedProcess::call`] lets a function run.
pub const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_secs(5);
/// The most [`StoppedProcess::call`] puts on a target thread's stack.
pub const MAX_STACK_DATA: usize = 64 * 1024;
/// Below rsp, the System V ABI lets leaf code use 128 bytes without moving rsp.
const RED_ZONE: u64 = 128;
/// EFLAGS: the direction flag must be clear at a call; the trap flag must not leak in.
const EFLAGS_DF: u64 = 1 << 10;
const EFLAGS_TF: u64 = 1 << 8;

/// One argument of a remote call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallArg {
    Value(u64),
    /// The address where the call's `stack_data` was copied.
    StackData,
}

impl From<u64> for CallArg {
    fn from(value: u64) -> Self {
        CallArg::Value(value)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RemoteCallResult {
    /// `rax` when the function returned.
    pub ret: u64,
    /// Where `stack_data` was copied (below the thread's red zone).
    pub stack_data_addr: u64,
    /// From resuming the thread into the function to its return.
    pub duration: Duration,
}

/// How a remote call ended.
enum CallEnd {
    /// The function returned `ret`. `self_restored`: the pad had already put the
    /// original registers back itself (weft was slower than its wait).
    Returned {
        ret: u64,
        self_restored: bool,
    },
    Faulted {
        signal: i32,
        pc: u64,
        addr: u64,
    },
    TimedOut,
}

/// The x87/SSE/AVX state of a thread, saved around a remote call.
#[derive(Debug, Clone)]
pub(crate) enum FpState {
    /// Standard-format `xsave` image (`NT_X86_XSTATE`).
    Xsave(Vec<u8>),
    /// `fxsave` image (`NT_PRFPREG`), when the kernel offers no xstate.
    Fx(Vec<u8>),
    None,
}

impl FpState {
    fn save(tid: i32) -> FpState {
        let mut buf = vec![0u8; 64 * 1024];
        if let Ok(n) = sys::getregset(tid, sys::NT_X86_XSTATE, &mut buf) {
            // At least the legacy area and the xsave header.
            if n >= 576 {
                buf.truncate(n);
                return FpState::Xsave(buf);
            }
        }
        buf.truncate(512);
        match sys::getregset(tid, sys::NT_PRFPREG, &mut buf) {
            Ok(512) => FpState::Fx(buf),
            _ => FpState::None,
        }
    }

    fn restore(&self, tid: i32) -> std::result::Result<(), nix::errno::Errno> {
        match self {
            FpState::Xsave(b) => sys::setregset(tid, sys::NT_X86_XSTATE, b),
            FpState::Fx(b) => sys::setregset(tid, sys::NT_PRFPREG, b),
            FpState::None => Ok(()),
        }
    }

    fn image(&self) -> &[u8] {
        match self {
            FpState::Xsave(b) | FpState::Fx(b) => b,
            FpState::None => &[],
        }
    }
}

/// Where the landing pad's code was written, and what was there before.
#[derive(Debug, Clone)]
pub(crate) struct Pad {
    pub addr: u64,
    /// The padding's bytes, put back after each call.
    pub saved: Vec<u8>,
    /// A `syscall; ret` and a `mov rax, 15; syscall` in the target's code, through
    /// which a pad left alone restores the padding (none found: it does not).
    pub gadgets: Option<Gadgets>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Gadgets {
    pub syscall_ret: u64,
    pub sigreturn: u64,
}

// The pad's data, at offsets from its (64-aligned) start on the thread's stack.
const PAD_RESULT: u64 = 0x00;
const PAD_DONE: u64 = 0x08;
const PAD_FUTEX: u64 = 0x0c;
const PAD_TIMEOUT: u64 = 0x10;
/// Set by the pad when it stops waiting and leaves on its own.
const PAD_LEAVING: u64 = 0x20;
/// "/proc/self/mem\0".
const PAD_PATH: u64 = 0x30;
/// The padding's original bytes, which the pad writes back.
const PAD_SAVED: u64 = 0x40;
/// Three `rt_sigreturn` frames (see the module docs).
const PAD_FRAME_A: u64 = 0x100;
const PAD_FRAME_B: u64 = PAD_FRAME_A + FRAME_LEN;
const PAD_FRAME_C: u64 = PAD_FRAME_B + FRAME_LEN;
/// The saved vector state (`xrstor` needs 64-byte alignment).
const PAD_FP: u64 = PAD_FRAME_C + FRAME_LEN;
/// How long the pad waits for weft, per round, and how many rounds.
pub(crate) const PAD_WAIT: Duration = Duration::from_millis(50);
const PAD_WAIT_ROUNDS: u32 = 6;

// A kernel `struct rt_sigframe` (x86-64): the return address slot `rt_sigreturn`
// finds at rsp - 8, then `struct ucontext` (uc_flags, uc_link, uc_stack, the
// `sigcontext`, an 8-byte signal mask), then siginfo, unused here.
const FRAME_LEN: u64 = 0x1c0;
const UC_STACK_FLAGS: u64 = 8 + 24;
const MC: u64 = 8 + 40;
/// `sigcontext` order: r8-r15 rdi rsi rbp rbx rdx rax rcx rsp rip eflags.
const MC_R8: u64 = MC;
const MC_R10: u64 = MC + 2 * 8;
const MC_RDI: u64 = MC + 8 * 8;
const MC_RSI: u64 = MC + 9 * 8;
const MC_RDX: u64 = MC + 12 * 8;
const MC_RAX: u64 = MC + 13 * 8;
const MC_RSP: u64 = MC + 15 * 8;
const MC_RIP: u64 = MC + 16 * 8;
const MC_EFLAGS: u64 = MC + 17 * 8;
const MC_CS: u64 = MC + 18 * 8;
const MC_SS: u64 = MC_CS + 6;
const MC_FPSTATE: u64 = MC + 23 * 8;
const UC_SIGMASK: u64 = MC + 256;
const _: () = assert!(UC_SIGMASK + 8 + 128 <= FRAME_LEN && PAD_FP.is_multiple_of(64));

/// `FP_XSTATE_MAGIC1` in the software bytes of an `xsave` image, and
/// `FP_XSTATE_MAGIC2` the kernel wants right after the state in a signal frame.
const FP_XSTATE_MAGIC1: u32 = 0x4650_5853;
const FP_XSTATE_MAGIC2: u32 = 0x4650_5845;

/// The landing pad's code, for data `k` bytes above `rsp` at landing, leaving
/// through frame A (`chain`: after opening `/proc/self/mem` into frames A and B) or
/// straight through frame C:
///
/// ```text
/// landing: mov [DATA.result], rax ; mov dword [DATA.done], 1 ; mov ecx, ROUNDS
/// wait:    push rcx ; futex(&DATA.futex, FUTEX_WAIT_PRIVATE, 0, &DATA.timeout)
///          pop rcx ; dec ecx ; jnz wait
///          mov dword [DATA.leaving], 1
/// (chain)  openat(AT_FDCWD, DATA.path, O_RDWR | O_CLOEXEC, 0)
/// (chain)  mov [DATA.A.rdi], rax ; mov [DATA.B.rdi], rax
///          lea rsp, [DATA.A + 8 (or DATA.C + 8)] ; mov eax, 15 ; syscall
/// ```
///
/// Every operand is `[rsp + disp32]` (`DATA.x` is `rsp + k + x`, 8 more while `rcx`
/// is pushed). The bytes are checked against GNU as in this module's tests.
fn pad_code(k: u32, chain: bool) -> Vec<u8> {
    let d = |off: u64| (u64::from(k) + off) as u32;
    let mut c = Vec::with_capacity(PAD_SLOT as usize);
    c.extend_from_slice(&[0x48, 0x89, 0x84, 0x24]); // mov [rsp+d], rax
    c.extend_from_slice(&d(PAD_RESULT).to_le_bytes());
    c.extend_from_slice(&[0xc7, 0x84, 0x24]); // mov dword [rsp+d], 1
    c.extend_from_slice(&d(PAD_DONE).to_le_bytes());
    c.extend_from_slice(&1u32.to_le_bytes());
    c.push(0xb9); // mov ecx, ROUNDS
    c.extend_from_slice(&PAD_WAIT_ROUNDS.to_le_bytes());
    c.push(0x51); // wait: push rcx
    c.extend_from_slice(&[0xb8, 0xca, 0x00, 0x00, 0x00]); // mov eax, 202 (futex)
    c.extend_from_slice(&[0x48, 0x8d, 0xbc, 0x24]); // lea rdi, [rsp+d]
    c.extend_from_slice(&d(8 + PAD_FUTEX).to_le_bytes());
    c.extend_from_slice(&[0xbe, 0x80, 0x00, 0x00, 0x00]); // mov esi, FUTEX_WAIT_PRIVATE
    c.extend_from_slice(&[0x31, 0xd2]); // xor edx, edx
    c.extend_from_slice(&[0x4c, 0x8d, 0x94, 0x24]); // lea r10, [rsp+d]
    c.extend_from_slice(&d(8 + PAD_TIMEOUT).to_le_bytes());
    c.extend_from_slice(&[0x0f, 0x05]); // syscall
    c.push(0x59); // pop rcx
    c.extend_from_slice(&[0xff, 0xc9]); // dec ecx
    c.extend_from_slice(&[0x75, 0xdc]); // jnz wait
    c.extend_from_slice(&[0xc7, 0x84, 0x24]); // mov dword [rsp+d], 1
    c.extend_from_slice(&d(PAD_LEAVING).to_le_bytes());
    c.extend_from_slice(&1u32.to_le_bytes());
    let first = if chain {
        c.extend_from_slice(&[0xb8, 0x01, 0x01, 0x00, 0x00]); // mov eax, 257 (openat)
        c.extend_from_slice(&[0xbf, 0x9c, 0xff, 0xff, 0xff]); // mov edi, -100 (AT_FDCWD)
        c.extend_from_slice(&[0x48, 0x8d, 0xb4, 0x24]); // lea rsi, [rsp+d]
        c.extend_from_slice(&d(PAD_PATH).to_le_bytes());
        c.extend_from_slice(&[0xba, 0x02, 0x00, 0x08, 0x00]); // mov edx, O_RDWR|O_CLOEXEC
        c.extend_from_slice(&[0x45, 0x31, 0xd2]); // xor r10d, r10d
        c.extend_from_slice(&[0x0f, 0x05]); // syscall
        for frame in [PAD_FRAME_A, PAD_FRAME_B] {
            c.extend_from_slice(&[0x48, 0x89, 0x84, 0x24]); // mov [rsp+d], rax
            c.extend_from_slice(&d(frame + MC_RDI).to_le_bytes());
        }
        PAD_FRAME_A
    } else {
        PAD_FRAME_C
    };
    c.extend_from_slice(&[0x48, 0x8d, 0xa4, 0x24]); // lea rsp, [rsp+d]
    c.extend_from_slice(&d(first + 8).to_le_bytes());
    c.extend_from_slice(&[0xb8, 0x0f, 0x00, 0x00, 0x00]); // mov eax, 15 (rt_sigreturn)
    c.extend_from_slice(&[0x0f, 0x05]); // syscall
    debug_assert!(c.len() <= PAD_SLOT as usize);
    c
}

/// Room for the pad's code (16-aligned).
const PAD_SLOT: u64 = 0x90;

/// The pad's data for one call: where it goes on the stack, and its bytes.
struct PadData {
    /// Its address (64-aligned, below the red zone).
    at: u64,
    bytes: Vec<u8>,
}

/// Where a call lands: the pad's code, its data on the stack, and where the thread
/// is when it has restored itself.
#[derive(Debug, Clone, Copy)]
struct Landing {
    code: u64,
    data: u64,
    gadgets: Option<Gadgets>,
    home_pc: u64,
    home_sp: u64,
}

impl Landing {
    /// Whether `pc` is on the pad's way home (the pad, or one of the gadgets).
    fn on_the_way(&self, pc: u64) -> bool {
        (self.code..self.code + PAD_SLOT).contains(&pc)
            || self.gadgets.is_some_and(|g| {
                (g.syscall_ret..g.syscall_ret + 3).contains(&pc)
                    || (g.sigreturn..g.sigreturn + 9).contains(&pc)
            })
    }
}

/// The pad's data for a call by a thread stopped with `original` registers, `fp`
/// vector state and signal `mask`: flags cleared, the futex timeout, the padding's
/// bytes and the frames that restore them and the thread.
fn pad_data(
    original: &user_regs_struct,
    fp: &FpState,
    mask: u64,
    pad: &Pad,
    wait: Duration,
) -> PadData {
    let (image, features) = match fp {
        FpState::Xsave(b) => {
            let (size, features) = frame_state(b, cpu_component);
            (&b[..size], features)
        }
        _ => (fp.image(), 0),
    };
    let len = PAD_FP as usize + (image.len() + 4).div_ceil(64) * 64;
    let at = (original.rsp.wrapping_sub(RED_ZONE) - len as u64) & !63;
    let mut bytes = vec![0u8; len];
    let put = |b: &mut Vec<u8>, off: u64, v: &[u8]| {
        b[off as usize..off as usize + v.len()].copy_from_slice(v);
    };
    put(&mut bytes, PAD_TIMEOUT, &wait.as_secs().to_le_bytes());
    put(
        &mut bytes,
        PAD_TIMEOUT + 8,
        &u64::from(wait.subsec_nanos()).to_le_bytes(),
    );
    put(&mut bytes, PAD_PATH, b"/proc/self/mem\0");
    put(&mut bytes, PAD_SAVED, &pad.saved);

    // Common to the three frames: user segments, flags, an invalid uc_stack (so
    // rt_sigreturn leaves the thread's sigaltstack alone).
    let eflags = original.eflags & !(EFLAGS_TF | EFLAGS_DF);
    for frame in [PAD_FRAME_A, PAD_FRAME_B, PAD_FRAME_C] {
        put(&mut bytes, frame + UC_STACK_FLAGS, &3u32.to_le_bytes());
        put(&mut bytes, frame + MC_EFLAGS, &eflags.to_le_bytes());
        put(
            &mut bytes,
            frame + MC_CS,
            &(original.cs as u16).to_le_bytes(),
        );
        put(
            &mut bytes,
            frame + MC_SS,
            &(original.ss as u16).to_le_bytes(),
        );
        put(&mut bytes, frame + UC_SIGMASK, &u64::MAX.to_le_bytes());
    }
    if let Some(g) = pad.gadgets {
        // A: pwrite64(fd, saved, len, pad), returning to R with rsp at frame B.
        let a = PAD_FRAME_A;
        put(&mut bytes, a + MC_RIP, &g.syscall_ret.to_le_bytes());
        put(&mut bytes, a + MC_RSP, &(at + PAD_FRAME_B).to_le_bytes());
        put(
            &mut bytes,
            a + MC_RAX,
            &(libc::SYS_pwrite64 as u64).to_le_bytes(),
        );
        put(&mut bytes, a + MC_RSI, &(at + PAD_SAVED).to_le_bytes());
        put(
            &mut bytes,
            a + MC_RDX,
            &(pad.saved.len() as u64).to_le_bytes(),
        );
        put(&mut bytes, a + MC_R10, &pad.addr.to_le_bytes());
        // B: close(fd), returning to R with rsp at frame C.
        let b = PAD_FRAME_B;
        put(&mut bytes, b, &g.sigreturn.to_le_bytes());
        put(&mut bytes, b + MC_RIP, &g.syscall_ret.to_le_bytes());
        put(&mut bytes, b + MC_RSP, &(at + PAD_FRAME_C).to_le_bytes());
        put(
            &mut bytes,
            b + MC_RAX,
            &(libc::SYS_close as u64).to_le_bytes(),
        );
        put(&mut bytes, PAD_FRAME_C, &g.sigreturn.to_le_bytes());
    }
    // C: the thread as it was.
    let c = PAD_FRAME_C;
    let regs = pad_regs(original);
    // pad_regs order: rax rbx rcx rdx rsi rdi rbp r8-r15 rsp, then rflags and rip.
    let slots = [
        MC_RAX,
        MC + 11 * 8,
        MC + 14 * 8,
        MC_RDX,
        MC_RSI,
        MC_RDI,
        MC + 10 * 8,
    ];
    for (i, slot) in slots.iter().enumerate() {
        put(&mut bytes, c + slot, &regs[i].to_le_bytes());
    }
    for i in 0..8 {
        put(
            &mut bytes,
            c + MC_R8 + i * 8,
            &regs[7 + i as usize].to_le_bytes(),
        );
    }
    put(&mut bytes, c + MC_RSP, &regs[15].to_le_bytes());
    put(&mut bytes, c + MC_RIP, &regs[17].to_le_bytes());
    put(&mut bytes, c + UC_SIGMASK, &mask.to_le_bytes());
    if !image.is_empty() {
        put(&mut bytes, PAD_FP, image);
        put(&mut bytes, c + MC_FPSTATE, &(at + PAD_FP).to_le_bytes());
        if let FpState::Xsave(_) = fp {
            put(
                &mut bytes,
                PAD_FP + SW_BYTES,
                &sigframe_sw_bytes(features, image.len() as u32),
            );
            let end = PAD_FP + image.len() as u64;
            put(&mut bytes, end, &FP_XSTATE_MAGIC2.to_le_bytes());
        }
    }
    PadData { at, bytes }
}

/// Where the software bytes sit in an `xsave` image (in the fxsave area's
/// reserved tail).
const SW_BYTES: u64 = 464;

/// One `xsave` state component as this CPU lays it out in the standard format:
/// its offset, its size, and whether the kernel gives it to a task only on request
/// (a component `xfd` can disable, as AMX's tile data). CPUID leaf 0xd.
fn cpu_component(i: u32) -> Option<(usize, usize, bool)> {
    // Leaf 0xd exists on any CPU with xsave, the only way an `xsave` image exists.
    let r = core::arch::x86_64::__cpuid_count(0xd, i);
    (r.eax != 0).then_some((r.ebx as usize, r.eax as usize, r.ecx & 4 != 0))
}

/// The part of a ptrace `xsave` image a signal frame carries, and its feature
/// mask. ptrace hands out every component XCR0 enables, AMX's 8 KiB of tiles
/// included; a task's own signal frames hold those only once it asked for them
/// (`ARCH_REQ_XCOMP_PERM`), and `rt_sigreturn` treats a frame larger than the
/// task's as a bare `fxsave` one: the upper halves of the vector registers are
/// reset. So a component granted on request is left out unless this thread has
/// it in use (which it cannot without the grant).
fn frame_state(
    image: &[u8],
    component: impl Fn(u32) -> Option<(usize, usize, bool)>,
) -> (usize, u64) {
    let word = |o: usize| u64::from_le_bytes(image[o..o + 8].try_into().unwrap());
    let (xcr0, in_use) = (word(464), word(512));
    let mut features = if xcr0 != 0 { xcr0 } else { in_use | 3 };
    // The legacy area and the xsave header.
    let mut end = 576;
    let mut dropped = false;
    for i in 2..64 {
        if features & (1 << i) == 0 {
            continue;
        }
        match component(i) {
            Some((_, _, true)) if in_use & (1 << i) == 0 => {
                features &= !(1 << i);
                dropped = true;
            }
            Some((off, size, _)) => end = end.max(off + size),
            None => {}
        }
    }
    let size = if dropped {
        end.min(image.len())
    } else {
        image.len()
    };
    (size, features)
}

/// The software bytes that make the kernel's `rt_sigreturn` restore a whole `xsave`
/// image (`struct _fpx_sw_bytes`: magic1, extended size, features, state size).
/// Without them it restores the fxsave part only and resets the rest (the upper
/// halves of the ymm registers, ...) to their initial state.
fn sigframe_sw_bytes(features: u64, size: u32) -> [u8; 48] {
    let mut sw = [0u8; 48];
    sw[0..4].copy_from_slice(&FP_XSTATE_MAGIC1.to_le_bytes());
    sw[4..8].copy_from_slice(&(size + 4).to_le_bytes());
    sw[8..16].copy_from_slice(&features.to_le_bytes());
    sw[16..20].copy_from_slice(&size.to_le_bytes());
    sw
}

/// The registers, in order rax rbx rcx rdx rsi rdi rbp r8-r15 rsp rflags rip, that
/// resume the thread where the stop found it, done by the pad without ptrace: a
/// system call to be restarted is entered again (`rip` back on the `syscall`, its
/// number in `rax`). `rt_sigreturn` forgets the restart block, so a call the kernel
/// would continue through `restart_syscall` is entered again from the start.
fn pad_regs(r: &user_regs_struct) -> [u64; 18] {
    let (mut rip, mut rax) = (r.rip, r.rax);
    if (r.orig_rax as i64) >= 0 {
        // ERESTARTSYS, ERESTARTNOINTR, ERESTARTNOHAND, ERESTART_RESTARTBLOCK
        if let 512..=514 | 516 = -(r.rax as i64) {
            rip = rip.wrapping_sub(2);
            rax = r.orig_rax;
        }
    }
    pad_regs_of(r, rip, rax)
}

/// The registers weft puts back after a call in a thread that the stop found in a
/// system call the kernel would continue through `restart_syscall`
/// (`ERESTART_RESTARTBLOCK`: a relative sleep, a timed wait): the call's own system
/// calls may have replaced the thread's restart block (the pad's timed `futex`
/// wait, interrupted by weft, leaves `futex_wait_restart` there, and a `sleep`
/// would then fail with `ETIMEDOUT`). So the system call is entered again from the
/// start, its original arguments in their registers (it may last longer), as the
/// pad's own way home does. Other states are put back as they were.
fn reentered(r: &user_regs_struct) -> user_regs_struct {
    let mut out = *r;
    if (r.orig_rax as i64) >= 0 && -(r.rax as i64) == 516 {
        out.rip = r.rip.wrapping_sub(2);
        out.rax = r.orig_rax;
        out.orig_rax = u64::MAX;
    }
    out
}

fn pad_regs_of(r: &user_regs_struct, rip: u64, rax: u64) -> [u64; 18] {
    [
        rax,
        r.rbx,
        r.rcx,
        r.rdx,
        r.rsi,
        r.rdi,
        r.rbp,
        r.r8,
        r.r9,
        r.r10,
        r.r11,
        r.r12,
        r.r13,
        r.r14,
        r.r15,
        r.rsp,
        r.eflags & !EFLAGS_TF,
        rip,
    ]
}

impl StoppedProcess {
    /// Calls `func(args...)` on stopped thread `tid`, giving up after
    /// [`DEFAULT_CALL_TIMEOUT`]. See [`call_with_timeout`](Self::call_with_timeout).
    pub fn call(
        &mut self,
        tid: i32,
        func: u64,
        args: &[CallArg],
        stack_data: &[u8],
    ) -> Result<RemoteCallResult> {
        self.call_with_timeout(tid, func, args, stack_data, DEFAULT_CALL_TIMEOUT)
    }

    /// Calls `func(args...)` (at most 6 integer arguments) on stopped thread `tid`,
    /// with `stack_data` copied below the thread's red zone
    /// ([`CallArg::StackData`] is its address). Only `tid` runs; the other threads
    /// stay stopped, and threads the function creates are held too.
    ///
    /// Afterwards the thread has exactly its original registers, vector registers
    /// included. Signals that arrive during the call are held and delivered on
    /// resume. If the function faults, the fault is swallowed and
    /// [`InjectError::CallFaulted`] returned. If weft dies during the call, the thread
    /// finishes the function and restores its own registers (see the module docs).
    ///
    /// If it does not return within `timeout`, the thread is interrupted wherever it
    /// is and its original registers are put back: [`InjectError::CallTimedOut`] with
    /// [`AbandonedCall::Restored`]. That abandons the function half-way: memory it
    /// wrote stays written and locks it took stay taken (after a stuck `dlopen`, the
    /// loader lock may be held for good). If the thread cannot even be interrupted,
    /// it keeps running the function ([`AbandonedCall::StillRunning`]); resume tries
    /// once more to stop it and restore its registers.
    pub fn call_with_timeout(
        &mut self,
        tid: i32,
        func: u64,
        args: &[CallArg],
        stack_data: &[u8],
        timeout: Duration,
    ) -> Result<RemoteCallResult> {
        if args.len() > 6 {
            return Err(InjectError::TooManyArguments { count: args.len() });
        }
        if stack_data.len() > MAX_STACK_DATA {
            return Err(InjectError::StackDataTooLarge {
                len: stack_data.len(),
                max: MAX_STACK_DATA,
            });
        }
        let original = *self.thread(tid)?.regs();
        let fp = FpState::save(tid);
        let mask =
            sys::getsigmask(tid).map_err(|e| self.ptrace_failed("PTRACE_GETSIGMASK", tid, e))?;
        let pad = self.landing_pad(tid)?;

        // The pad's data just below the red zone, then the stack data, then the
        // return address (see the module docs).
        let data = pad_data(&original, &fp, mask, &pad, self.pad_wait);
        let mut sp = data.at;
        if !stack_data.is_empty() {
            sp = sp.wrapping_sub(stack_data.len() as u64) & !15;
            self.write_mem(sp, stack_data)?;
        }
        let stack_data_addr = sp;
        let landing_rsp = sp & !15;
        self.write_mem(data.at, &data.bytes)?;
        sp = landing_rsp - 8;
        self.write_mem(sp, &pad.addr.to_le_bytes())?;
        let code = pad_code((data.at - landing_rsp) as u32, pad.gadgets.is_some());
        self.write_mem(pad.addr, &code)?;

        let mut regs = original;
        regs.rip = func;
        regs.rsp = sp;
        regs.rax = 0; // no vector registers used, should the function be variadic
        regs.orig_rax = u64::MAX; // -1: not in a system call
        regs.eflags &= !(EFLAGS_DF | EFLAGS_TF);
        for (i, arg) in args.iter().enumerate() {
            let value = match *arg {
                CallArg::Value(v) => v,
                CallArg::StackData => stack_data_addr,
            };
            *arg_register(&mut regs, i) = value;
        }
        let segv = 1u64 << (libc::SIGSEGV - 1);
        if mask & segv != 0 {
            sys::setsigmask(tid, mask & !segv)
                .map_err(|e| self.ptrace_failed("PTRACE_SETSIGMASK", tid, e))?;
        }
        let home = pad_regs(&original);
        let landing = Landing {
            code: pad.addr,
            data: data.at,
            gadgets: pad.gadgets,
            home_pc: home[17],
            home_sp: original.rsp,
        };
        let result = self.run_call(tid, func, &regs, &original, &fp, mask, landing, timeout);
        match &result {
            // The thread is back where it was (and the padding restored).
            Ok(_)
            | Err(InjectError::CallFaulted { .. })
            | Err(InjectError::TargetExited { .. })
            | Err(InjectError::CallTimedOut {
                outcome: AbandonedCall::Restored { .. },
                ..
            }) => {}
            // Still running, or in a state weft could not establish: the pad may
            // yet be used.
            Err(_) => self.forget_pad(),
        }
        let (ret, duration) = result?;
        Ok(RemoteCallResult {
            ret,
            stack_data_addr,
            duration,
        })
    }

    /// Runs one prepared call: set `regs`, resume, wait for the end, put `original`
    /// back. Returns rax and the time the function ran.
    #[allow(clippy::too_many_arguments)]
    fn run_call(
        &mut self,
        tid: i32,
        func: u64,
        regs: &user_regs_struct,
        original: &user_regs_struct,
        fp: &FpState,
        mask: u64,
        pad: Landing,
        timeout: Duration,
    ) -> Result<(u64, Duration)> {
        sys::setregs(tid, regs).map_err(|e| self.ptrace_failed("PTRACE_SETREGS", tid, e))?;
        let started = Instant::now();
        if let Err(e) = sys::cont(tid, 0) {
            let _ = sys::setregs(tid, original);
            return Err(self.ptrace_failed("PTRACE_CONT", tid, e));
        }

        crate::die::at("call-running");
        let deadline = Deadline::after(timeout);
        match self.wait_for_return(tid, pad, deadline)? {
            CallEnd::Returned { ret, self_restored } => {
                let duration = started.elapsed();
                if self_restored {
                    // Single-stepping through rt_sigreturn juggled the mask.
                    self.set_mask(tid, mask)?;
                    self.give_pad_back();
                    let now = self.getregs(tid)?;
                    let thread = self.thread_mut(tid)?;
                    thread.regs = now;
                    thread.stop = StopKind::Interrupted;
                } else {
                    self.restore_after_call(tid, original, fp, mask)?;
                }
                crate::die::at("call-returned");
                self.collect_new_threads()?;
                Ok((ret, duration))
            }
            CallEnd::Faulted { signal, pc, addr } => {
                self.settle_trap(tid, Deadline::after(GRACE))?;
                self.restore_after_call(tid, original, fp, mask)?;
                self.collect_new_threads()?;
                Err(InjectError::CallFaulted {
                    tid,
                    func,
                    signal,
                    pc,
                    addr,
                })
            }
            CallEnd::TimedOut => {
                let outcome = if let Some(pc) = self.interrupt_and_restore(tid, Some(original))? {
                    let _ = fp.restore(tid);
                    let _ = sys::setsigmask(tid, mask);
                    self.give_pad_back();
                    AbandonedCall::Restored { pc }
                } else {
                    self.threads.retain(|t| t.tid != tid);
                    self.lost.push((tid, Some(*original)));
                    AbandonedCall::StillRunning
                };
                self.collect_new_threads()?;
                Err(InjectError::CallTimedOut {
                    tid,
                    func,
                    after: timeout,
                    outcome,
                })
            }
        }
    }

    /// Runs the thread until the call returns into the pad, faults, or the deadline
    /// passes.
    fn wait_for_return(&mut self, tid: i32, pad: Landing, deadline: Deadline) -> Result<CallEnd> {
        let mut backoff = Backoff::new();
        let mut idle_polls = 0u32;
        let mut unreadable_since = None;
        loop {
            let event = match sys::try_wait(tid) {
                Ok(Some(event)) => event,
                Ok(None) => {
                    let flag = if self.catch_leaving {
                        PAD_LEAVING
                    } else {
                        PAD_DONE
                    };
                    match self.read_u32(pad.data + flag) {
                        Ok(0) => {}
                        Ok(_) => return self.stop_landed(tid, pad),
                        // The function exited the process: its memory is gone before
                        // its threads' exits are reported. Collect them, and give up
                        // only if the memory stays unreadable with the thread alive.
                        Err(e) => {
                            self.reap_dead_threads()?;
                            let since = *unreadable_since.get_or_insert_with(Instant::now);
                            if since.elapsed() > Duration::from_millis(200) {
                                return Err(e);
                            }
                        }
                    }
                    if deadline.passed() {
                        return Ok(CallEnd::TimedOut);
                    }
                    idle_polls = (idle_polls + 1) % 64;
                    // If the function calls exit(), the stopped threads are killed and
                    // must be reaped before the calling thread's exit is reported.
                    if idle_polls == 0 {
                        self.reap_dead_threads()?;
                    }
                    backoff.snooze();
                    continue;
                }
                Err(nix::errno::Errno::ECHILD) => return Err(self.thread_exited(tid)),
                Err(e) => return Err(sys::ptrace_error("waitpid", tid, e)),
            };
            match event {
                WaitEvent::SignalStop { signal } => {
                    let info = sys::getsiginfo(tid).ok();
                    if is_fault(signal, info.as_ref()) {
                        let regs = self.getregs(tid)?;
                        // SAFETY: si_addr is the fault address for the fault signals
                        // is_fault accepts (SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGTRAP);
                        // for SIGSYS the union member read is still plain data.
                        let addr = info.map_or(0, |i| unsafe { i.si_addr() } as u64);
                        return Ok(CallEnd::Faulted {
                            signal,
                            pc: regs.rip,
                            addr,
                        });
                    }
                    // Not for the function: hold it for resume.
                    self.thread_mut(tid)?
                        .pending
                        .push(PendingSignal { signal, info });
                }
                // A stale interrupt, or a SIGSTOP's group-stop: carry on.
                WaitEvent::EventStop { .. } | WaitEvent::OtherEvent | WaitEvent::Syscall => {}
                WaitEvent::Clone => self.note_clone(tid)?,
                WaitEvent::Exited | WaitEvent::Killed => return Err(self.thread_exited(tid)),
            }
            sys::cont(tid, 0).map_err(|e| self.ptrace_failed("PTRACE_CONT", tid, e))?;
        }
    }

    /// The call returned into the pad: stop the thread there and read the result.
    fn stop_landed(&mut self, tid: i32, pad: Landing) -> Result<CallEnd> {
        crate::die::at("call-landed");
        let deadline = Deadline::after(GRACE);
        sys::interrupt(tid).map_err(|e| self.ptrace_failed("PTRACE_INTERRUPT", tid, e))?;
        loop {
            let Some(event) = self.wait_event(tid, deadline)? else {
                return Err(InjectError::Timeout {
                    pid: self.pid,
                    what: "stopping a thread back from a remote call",
                    after: GRACE,
                });
            };
            match event {
                WaitEvent::EventStop { .. } => break,
                WaitEvent::SignalStop { signal } => {
                    let info = sys::getsiginfo(tid).ok();
                    self.thread_mut(tid)?
                        .pending
                        .push(PendingSignal { signal, info });
                    break;
                }
                WaitEvent::Clone | WaitEvent::OtherEvent | WaitEvent::Syscall => {
                    if event == WaitEvent::Clone {
                        self.note_clone(tid)?;
                    }
                    sys::cont(tid, 0).map_err(|e| self.ptrace_failed("PTRACE_CONT", tid, e))?;
                    sys::interrupt(tid)
                        .map_err(|e| self.ptrace_failed("PTRACE_INTERRUPT", tid, e))?;
                }
                WaitEvent::Exited | WaitEvent::Killed => return Err(self.thread_exited(tid)),
            }
        }
        let mut result = [0u8; 8];
        self.read_mem(pad.data + PAD_RESULT, &mut result)?;
        let ret = u64::from_le_bytes(result);
        if self.read_u32(pad.data + PAD_LEAVING)? == 0 {
            // Still waiting in the pad: weft restores it.
            return Ok(CallEnd::Returned {
                ret,
                self_restored: false,
            });
        }
        // The pad gave up waiting: the thread is on its way home, or there. Let it
        // finish by itself, one instruction at a time (a few dozen at most).
        let deadline = Deadline::after(GRACE);
        for _ in 0..256 {
            let regs = self.getregs(tid)?;
            let home = regs.rip == pad.home_pc && regs.rsp == pad.home_sp;
            if home || !pad.on_the_way(regs.rip) {
                break;
            }
            self.single_step(tid, deadline)?;
        }
        let regs = self.getregs(tid)?;
        self.thread_mut(tid)?.regs = regs;
        Ok(CallEnd::Returned {
            ret,
            self_restored: true,
        })
    }

    /// How long a landing pad waits for weft before leaving on its own, per round
    /// (six rounds). Only for tests of that path; the default is 50 ms.
    #[doc(hidden)]
    pub fn set_landing_pad_wait(&mut self, per_round: Duration) {
        self.pad_wait = per_round;
    }

    /// Tests of the pad's own way home: weft stops a thread only once its pad has
    /// given up waiting, and so (most often) on its way.
    #[doc(hidden)]
    pub fn catch_pads_leaving(&mut self) {
        self.catch_leaving = true;
    }

    fn read_u32(&self, addr: u64) -> Result<u32> {
        let mut b = [0u8; 4];
        self.read_mem(addr, &mut b)?;
        Ok(u32::from_le_bytes(b))
    }

    /// Puts the thread's state back, in the order that leaves it whole should weft
    /// die at any point: vector state and mask while it still sits in the pad
    /// (whose way home restores everything anyway), then the registers that take
    /// it out, then the padding's bytes.
    fn restore_after_call(
        &mut self,
        tid: i32,
        original: &user_regs_struct,
        fp: &FpState,
        mask: u64,
    ) -> Result<()> {
        fp.restore(tid)
            .map_err(|e| self.ptrace_failed("PTRACE_SETREGSET", tid, e))?;
        self.set_mask(tid, mask)?;
        let resumed = reentered(original);
        sys::setregs(tid, &resumed).map_err(|e| self.ptrace_failed("PTRACE_SETREGS", tid, e))?;
        self.give_pad_back();
        let thread = self.thread_mut(tid)?;
        thread.regs = resumed;
        thread.stop = StopKind::Trap;
        Ok(())
    }

    /// Where this stop's landing pad goes: found on first use, in the zero padding
    /// after the executable segment of one of the target's libraries.
    fn landing_pad(&mut self, tid: i32) -> Result<Pad> {
        if let Some(pad) = &self.pad {
            return Ok(pad.clone());
        }
        // The thread's view: a main thread that exited leaves /proc/PID/maps empty.
        let path = format!("/proc/{}/task/{tid}/maps", self.tgid_of(tid));
        let maps = std::fs::read_to_string(&path).map_err(|source| InjectError::Proc {
            path: path.clone().into(),
            source,
        })?;
        let mut files: Vec<&str> = Vec::new();
        for l in maps.lines() {
            let f: Vec<&str> = l.split_whitespace().collect();
            if f.len() >= 6 && f[1].contains('x') && f[5].starts_with('/') && !files.contains(&f[5])
            {
                files.push(f[5]);
            }
        }
        let rank = |p: &str| {
            let name = p.rsplit('/').next().unwrap_or(p);
            if name.starts_with("ld-linux") || name.starts_with("ld64") {
                0
            } else if name.starts_with("libc.so") || name.starts_with("libc-") {
                1
            } else {
                2
            }
        };
        files.sort_by_key(|p| rank(p));
        for file in &files {
            if let Some(addr) = self.padding_in(&maps, file) {
                let mut saved = vec![0; PAD_SLOT as usize];
                self.read_mem(addr, &mut saved)?;
                let pad = Pad {
                    addr,
                    saved,
                    gadgets: self.find_gadgets(&maps, &files),
                };
                self.pad = Some(pad.clone());
                return Ok(pad);
            }
        }
        Err(InjectError::NoLandingPad { pid: self.pid })
    }

    /// A `syscall; ret` and a `mov rax, 15; syscall` (glibc's and musl's
    /// `__restore_rt`) in the code of `files` (libc first), as the program headers
    /// delimit it: never in padding, where a pad may be.
    fn find_gadgets(&self, maps: &str, files: &[&str]) -> Option<Gadgets> {
        const SYSCALL_RET: &[u8] = &[0x0f, 0x05, 0xc3];
        const SIGRETURN: &[u8] = &[0x48, 0xc7, 0xc0, 0x0f, 0x00, 0x00, 0x00, 0x0f, 0x05];
        let (mut syscall_ret, mut sigreturn) = (None, None);
        for file in files {
            for code in self.code_ranges(maps, file) {
                let mut bytes = vec![0u8; (code.end - code.start) as usize];
                if self.read_mem(code.start, &mut bytes).is_err() {
                    continue;
                }
                let find = |pat: &[u8]| {
                    bytes
                        .windows(pat.len())
                        .position(|w| w == pat)
                        .map(|i| code.start + i as u64)
                };
                syscall_ret = syscall_ret.or_else(|| find(SYSCALL_RET));
                sigreturn = sigreturn.or_else(|| find(SIGRETURN));
                if let (Some(syscall_ret), Some(sigreturn)) = (syscall_ret, sigreturn) {
                    return Some(Gadgets {
                        syscall_ret,
                        sigreturn,
                    });
                }
            }
        }
        None
    }

    /// A free slot of [`PAD_SLOT`] zero bytes between the end of an executable
    /// segment of `file` (as its program headers, read from memory, say) and the end
    /// of that segment's last page. Slots still holding a pad (left by a weft that
    /// died during a call) are skipped.
    fn padding_in(&self, maps: &str, file: &str) -> Option<u64> {
        for (code, page_end) in self.code_segments(maps, file) {
            let mut slot = page_end - PAD_SLOT;
            while slot >= code.end {
                let mut bytes = vec![0u8; PAD_SLOT as usize];
                if self.read_mem(slot, &mut bytes).is_ok() && bytes.iter().all(|&b| b == 0) {
                    return Some(slot);
                }
                slot -= PAD_SLOT;
            }
        }
        None
    }

    /// The code of `file`'s executable segments.
    fn code_ranges(&self, maps: &str, file: &str) -> Vec<Range<u64>> {
        self.code_segments(maps, file)
            .into_iter()
            .map(|(code, _)| code)
            .collect()
    }

    /// `file`'s executable segments, as its program headers (read from memory) say,
    /// each with the end of its last page, when one executable mapping holds it all.
    fn code_segments(&self, maps: &str, file: &str) -> Vec<(Range<u64>, u64)> {
        let mappings: Vec<(Range<u64>, u64, bool)> = maps
            .lines()
            .filter_map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                if f.len() < 6 || f[5] != file {
                    return None;
                }
                let (a, b) = f[0].split_once('-')?;
                let range = u64::from_str_radix(a, 16).ok()?..u64::from_str_radix(b, 16).ok()?;
                Some((
                    range,
                    u64::from_str_radix(f[2], 16).ok()?,
                    f[1].contains('x'),
                ))
            })
            .collect();
        let Some(base) = mappings.iter().find(|m| m.1 == 0).map(|m| m.0.start) else {
            return Vec::new();
        };
        let mut ehdr = [0u8; 64];
        if self.read_mem(base, &mut ehdr).is_err() || ehdr[..4] != *b"\x7fELF" || ehdr[4] != 2 {
            return Vec::new();
        }
        let u16_at = |b: &[u8], o: usize| u16::from_le_bytes([b[o], b[o + 1]]);
        let u64_at = |b: &[u8], o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap());
        let (phoff, phentsize, phnum) = (
            u64_at(&ehdr, 0x20),
            u16_at(&ehdr, 0x36),
            u16_at(&ehdr, 0x38),
        );
        if phentsize != 56 || phnum == 0 || phnum > 64 {
            return Vec::new();
        }
        let mut ph = vec![0u8; 56 * phnum as usize];
        if self.read_mem(base + phoff, &mut ph).is_err() {
            return Vec::new();
        }
        let loads: Vec<&[u8]> = ph
            .chunks(56)
            .filter(|p| u32::from_le_bytes(p[0..4].try_into().unwrap()) == 1)
            .collect();
        let Some(first_vaddr) = loads.iter().map(|p| u64_at(p, 0x10)).min() else {
            return Vec::new();
        };
        let bias = if u16_at(&ehdr, 0x10) == 3 {
            base.wrapping_sub(first_vaddr & !4095)
        } else {
            0
        };
        let mut out = Vec::new();
        for p in loads {
            let flags = u32::from_le_bytes(p[4..8].try_into().unwrap());
            if flags & 1 == 0 {
                continue;
            }
            let start = bias.wrapping_add(u64_at(p, 0x10));
            let end = start.wrapping_add(u64_at(p, 0x20));
            let page_end = (end + 4095) & !4095;
            // The whole segment, and its last page, in one executable mapping.
            if start < end
                && end - start <= 1 << 30
                && mappings
                    .iter()
                    .any(|(r, _, x)| *x && r.start <= start && page_end <= r.end)
            {
                out.push((start..end, page_end));
            }
        }
        out
    }

    fn set_mask(&mut self, tid: i32, mask: u64) -> Result<()> {
        sys::setsigmask(tid, mask).map_err(|e| self.ptrace_failed("PTRACE_SETSIGMASK", tid, e))
    }

    /// Gives the padding its bytes back: no thread is on its way to the pad.
    fn give_pad_back(&mut self) {
        if let Some(pad) = &self.pad {
            if self.lost.is_empty() {
                let _ = self.write_mem(pad.addr, &pad.saved);
            }
        }
    }

    /// A call ended with its thread in an unknown state (it may still come back to
    /// the pad, which then restores the padding itself): never write the padding
    /// again, and land later calls elsewhere.
    fn forget_pad(&mut self) {
        self.pad = None;
    }

    /// Gives the padding its bytes back before the process is let go (unless a
    /// thread may still come back to the pad).
    pub(crate) fn release_pad(&mut self) {
        if self.lost.is_empty() {
            self.give_pad_back();
        }
        self.pad = None;
    }

    /// The thread best suited to run a remote call: one blocked in a system call
    /// other than `futex` (it holds no lock a `malloc` or `dlopen` could need, most
    /// likely), else the main thread, else the first. Never a thread of another
    /// process sharing the memory ([`sharers`](Self::sharers)).
    pub fn pick_call_thread(&self) -> i32 {
        let blocked = |tid: i32, regs: &user_regs_struct, in_syscall: bool| {
            let nr = process::thread_syscall(self.pid, tid).or_else(|| {
                let nr = regs.orig_rax as i64;
                (nr >= 0).then_some(nr)
            });
            in_syscall && nr.is_some_and(|nr| nr != libc::SYS_futex)
        };
        let threads: Vec<&StoppedThread> = self
            .threads()
            .iter()
            .filter(|t| self.tgid_of(t.tid()) == self.pid)
            .collect();
        threads
            .iter()
            .find(|t| blocked(t.tid(), t.regs(), t.in_syscall()))
            .or_else(|| threads.iter().find(|t| t.tid() == self.pid))
            .or(threads.first())
            .map_or(self.pid, |t| t.tid())
    }
}

fn arg_register(regs: &mut user_regs_struct, index: usize) -> &mut u64 {
    match index {
        0 => &mut regs.rdi,
        1 => &mut regs.rsi,
        2 => &mut regs.rdx,
        3 => &mut regs.rcx,
        4 => &mut regs.r8,
        _ => &mut regs.r9,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `pad_code(0x100, true)`, assembled by GNU as from this listing (Intel syntax):
    ///
    /// ```text
    /// 00: mov qword ptr [rsp+0x100], rax      3c: mov dword ptr [rsp+0x120], 1
    /// 08: mov dword ptr [rsp+0x108], 1        47: mov eax, 257
    /// 13: mov ecx, 6                          4c: mov edi, -100
    /// 18: w: push rcx                         51: lea rsi, [rsp+0x130]
    /// 19: mov eax, 202                        59: mov edx, 0x80002
    /// 1e: lea rdi, [rsp+0x114]                5e: xor r10d, r10d
    /// 26: mov esi, 0x80                       61: syscall
    /// 2b: xor edx, edx                        63: mov qword ptr [rsp+0x270], rax
    /// 2d: lea r10, [rsp+0x118]                6b: mov qword ptr [rsp+0x430], rax
    /// 35: syscall                             73: lea rsp, [rsp+0x208]
    /// 37: pop rcx ; dec ecx ; jnz w           7b: mov eax, 15
    ///                                         80: syscall
    /// ```
    #[rustfmt::skip]
    const EXPECTED: [u8; 0x82] = [
        0x48, 0x89, 0x84, 0x24, 0x00, 0x01, 0x00, 0x00, 0xc7, 0x84, 0x24, 0x08, 0x01, 0x00, 0x00, 0x01,
        0x00, 0x00, 0x00, 0xb9, 0x06, 0x00, 0x00, 0x00, 0x51, 0xb8, 0xca, 0x00, 0x00, 0x00, 0x48, 0x8d,
        0xbc, 0x24, 0x14, 0x01, 0x00, 0x00, 0xbe, 0x80, 0x00, 0x00, 0x00, 0x31, 0xd2, 0x4c, 0x8d, 0x94,
        0x24, 0x18, 0x01, 0x00, 0x00, 0x0f, 0x05, 0x59, 0xff, 0xc9, 0x75, 0xdc, 0xc7, 0x84, 0x24, 0x20,
        0x01, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0xb8, 0x01, 0x01, 0x00, 0x00, 0xbf, 0x9c, 0xff, 0xff,
        0xff, 0x48, 0x8d, 0xb4, 0x24, 0x30, 0x01, 0x00, 0x00, 0xba, 0x02, 0x00, 0x08, 0x00, 0x45, 0x31,
        0xd2, 0x0f, 0x05, 0x48, 0x89, 0x84, 0x24, 0x70, 0x02, 0x00, 0x00, 0x48, 0x89, 0x84, 0x24, 0x30,
        0x04, 0x00, 0x00, 0x48, 0x8d, 0xa4, 0x24, 0x08, 0x02, 0x00, 0x00, 0xb8, 0x0f, 0x00, 0x00, 0x00,
        0x0f, 0x05,
    ];

    #[test]
    fn pad_code_is_the_listed_instructions() {
        assert_eq!(pad_code(0x100, true), EXPECTED);
        // Without gadgets: no openat, straight to frame C.
        let direct = pad_code(0x100, false);
        assert_eq!(direct[..0x47], EXPECTED[..0x47]);
        let lea = 0x100 + PAD_FRAME_C as u32 + 8;
        assert_eq!(direct[0x47..0x4b], [0x48, 0x8d, 0xa4, 0x24]);
        assert_eq!(direct[0x4b..0x4f], lea.to_le_bytes());
        assert_eq!(direct[0x4f..], EXPECTED[0x7b..]);
    }

    #[test]
    fn frame_offsets_are_the_kernels() {
        // glibc's ucontext_t starts as the kernel's: flags, link, stack, mcontext
        // (gregs in sigcontext order, then fpregs). The frame has the return
        // address slot first.
        use std::mem::offset_of;
        let uc = |o: usize| 8 + o as u64;
        assert_eq!(
            uc(offset_of!(libc::ucontext_t, uc_stack)) + 8,
            UC_STACK_FLAGS
        );
        assert_eq!(uc(offset_of!(libc::ucontext_t, uc_mcontext)), MC);
        let greg = |r: i32| MC + 8 * r as u64;
        assert_eq!(greg(libc::REG_R8), MC_R8);
        assert_eq!(greg(libc::REG_R10), MC_R10);
        assert_eq!(greg(libc::REG_RDI), MC_RDI);
        assert_eq!(greg(libc::REG_RSI), MC_RSI);
        assert_eq!(greg(libc::REG_RBP), MC + 10 * 8);
        assert_eq!(greg(libc::REG_RBX), MC + 11 * 8);
        assert_eq!(greg(libc::REG_RDX), MC_RDX);
        assert_eq!(greg(libc::REG_RAX), MC_RAX);
        assert_eq!(greg(libc::REG_RCX), MC + 14 * 8);
        assert_eq!(greg(libc::REG_RSP), MC_RSP);
        assert_eq!(greg(libc::REG_RIP), MC_RIP);
        assert_eq!(greg(libc::REG_EFL), MC_EFLAGS);
        assert_eq!(greg(libc::REG_CSGSFS), MC_CS);
        assert_eq!(MC + offset_of!(libc::mcontext_t, fpregs) as u64, MC_FPSTATE);
        // The kernel's sigset is 8 bytes, right after the 256-byte sigcontext.
        assert_eq!(uc(offset_of!(libc::ucontext_t, uc_sigmask)), UC_SIGMASK);
    }

    fn regs_at(rsp: u64, rip: u64) -> user_regs_struct {
        // SAFETY: user_regs_struct is plain integers.
        let mut r: user_regs_struct = unsafe { std::mem::zeroed() };
        r.rsp = rsp;
        r.rip = rip;
        r.cs = 0x33;
        r.ss = 0x2b;
        r
    }

    fn u64_at(b: &[u8], off: u64) -> u64 {
        u64::from_le_bytes(b[off as usize..][..8].try_into().unwrap())
    }

    /// A CPU with AVX-512, PKRU and AMX, as leaf 0xd lays them out.
    fn amx_cpu(i: u32) -> Option<(usize, usize, bool)> {
        match i {
            2 => Some((576, 256, false)),
            5 => Some((1088, 64, false)),
            6 => Some((1152, 512, false)),
            7 => Some((1664, 1024, false)),
            9 => Some((2688, 8, false)),
            17 => Some((2752, 64, false)),
            18 => Some((2816, 8192, true)),
            _ => None,
        }
    }

    fn image(xcr0: u64, in_use: u64, len: usize) -> Vec<u8> {
        let mut b = vec![0; len];
        b[464..472].copy_from_slice(&xcr0.to_le_bytes());
        b[512..520].copy_from_slice(&in_use.to_le_bytes());
        b
    }

    #[test]
    fn a_signal_frame_leaves_out_tiles_the_thread_does_not_use() {
        // ptrace's image on an AMX machine: 11,008 bytes; a task's frame ends
        // with the tile configuration at 2,816 (what this CI machine needed: the frame was refused
        // and the ymm upper halves reset).
        let img = image(0x600e7 | 0x200, 0xa6, 11008);
        assert_eq!(frame_state(&img, amx_cpu), (2816, 0x202e7));
        // Tiles in use (the task asked for them): the whole image.
        let img = image(0x602e7, 0x400a6, 11008);
        assert_eq!(frame_state(&img, amx_cpu), (11008, 0x602e7));
        // No component granted on request: the image as it is.
        let img = image(0x2e7, 0xa6, 2696);
        assert_eq!(frame_state(&img, amx_cpu), (2696, 0x2e7));
        let img = image(0x7, 0x7, 832);
        assert_eq!(frame_state(&img, amx_cpu), (832, 0x7));
    }

    #[test]
    fn pad_data_sits_below_the_red_zone_and_chains_home() {
        let r = regs_at(0x7fff_0000_1238, 0x4000);
        // A ptrace xsave image: XCR0 in the software bytes.
        let mut fp = vec![7; 1000];
        fp[464..472].copy_from_slice(&0x207u64.to_le_bytes());
        let fp = FpState::Xsave(fp);
        let g = Gadgets {
            syscall_ret: 0x5000,
            sigreturn: 0x6000,
        };
        let pad = Pad {
            addr: 0x9000,
            saved: vec![0; PAD_SLOT as usize],
            gadgets: Some(g),
        };
        let d = pad_data(&r, &fp, 0x1234, &pad, PAD_WAIT);
        let b = &d.bytes;
        assert_eq!(d.at % 64, 0);
        assert!(d.at + b.len() as u64 <= r.rsp - RED_ZONE);
        assert_eq!(&b[PAD_FP as usize..][..464], &[7; 464][..]);
        // The signal frame's software bytes: magic1, extended size, XCR0, size.
        let sw = &b[(PAD_FP + SW_BYTES) as usize..][..20];
        assert_eq!(sw[0..4], FP_XSTATE_MAGIC1.to_le_bytes());
        assert_eq!(sw[4..8], 1004u32.to_le_bytes());
        assert_eq!(sw[8..16], 0x207u64.to_le_bytes());
        assert_eq!(sw[16..20], 1000u32.to_le_bytes());
        assert_eq!(&b[(PAD_FP + 512) as usize..][..8], &[7; 8][..]);
        assert_eq!(
            &b[(PAD_FP + 1000) as usize..][..4],
            FP_XSTATE_MAGIC2.to_le_bytes()
        );
        // A: pwrite into the pad, then R with rsp on frame B.
        assert_eq!(u64_at(b, PAD_FRAME_A + MC_RIP), 0x5000);
        assert_eq!(u64_at(b, PAD_FRAME_A + MC_RAX), libc::SYS_pwrite64 as u64);
        assert_eq!(u64_at(b, PAD_FRAME_A + MC_R10), 0x9000);
        assert_eq!(u64_at(b, PAD_FRAME_A + MC_RSP), d.at + PAD_FRAME_B);
        assert_eq!(u64_at(b, PAD_FRAME_B), 0x6000);
        assert_eq!(u64_at(b, PAD_FRAME_B + MC_RAX), libc::SYS_close as u64);
        assert_eq!(u64_at(b, PAD_FRAME_B + MC_RSP), d.at + PAD_FRAME_C);
        assert_eq!(u64_at(b, PAD_FRAME_C), 0x6000);
        // C: the original thread.
        assert_eq!(u64_at(b, PAD_FRAME_C + MC_RIP), 0x4000);
        assert_eq!(u64_at(b, PAD_FRAME_C + MC_RSP), r.rsp);
        assert_eq!(u64_at(b, PAD_FRAME_C + UC_SIGMASK), 0x1234);
        assert_eq!(u64_at(b, PAD_FRAME_C + MC_FPSTATE), d.at + PAD_FP);
        assert_eq!(u64_at(b, PAD_FRAME_A + UC_SIGMASK), u64::MAX);
    }

    #[test]
    fn a_restarted_system_call_resumes_on_its_syscall_instruction() {
        let mut r = regs_at(0x1000, 0x1002);
        r.orig_rax = libc::SYS_read as u64;
        r.rax = (-512i64) as u64; // ERESTARTSYS
        let regs = pad_regs(&r);
        assert_eq!((regs[17], regs[0]), (0x1000, libc::SYS_read as u64));
        // ERESTART_RESTARTBLOCK: rt_sigreturn forgets the restart block, so the
        // call starts over.
        r.orig_rax = libc::SYS_nanosleep as u64;
        r.rax = (-516i64) as u64;
        let regs = pad_regs(&r);
        assert_eq!((regs[17], regs[0]), (0x1000, libc::SYS_nanosleep as u64));
        r.rax = (-4i64) as u64; // EINTR: returned as is
        let regs = pad_regs(&r);
        assert_eq!((regs[17], regs[0]), (0x1002, (-4i64) as u64));
    }
}
