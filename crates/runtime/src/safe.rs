//! Fault-tolerant access to memory advice does not own.
//!
//! Advice reads target memory through pointers it was given (`str(arg0)`, `*p`,
//! struct fields). A bad pointer must never crash the target: the few instructions
//! that touch such memory live in the assembly below, between known labels. The
//! SIGSEGV/SIGBUS handler installed by [`install_fault_handler`] checks whether the
//! faulting instruction is one of them; if so it resumes at that routine's fixup,
//! which returns a "faulted" result. Any other fault is passed on to the handler that
//! was installed before ours (or the default action), so the target's own fault
//! handling keeps working.
//!
//! Each routine keeps its progress in `rax`, so the fixup can report how far it got.

use core::arch::global_asm;
use core::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::mem::MaybeUninit;

global_asm!(
    ".text",
    // u64 weft_safe_load(const void *addr /*rdi*/, u64 size /*rsi*/, u64 *out /*rdx*/)
    // returns 0 on success, 1 on fault; *out = zero-extended value.
    ".p2align 4",
    ".globl weft_safe_load",
    ".hidden weft_safe_load",
    "weft_safe_load:",
    "    xor eax, eax",
    "    cmp rsi, 8",
    "    je 8f",
    "    cmp rsi, 4",
    "    je 4f",
    "    cmp rsi, 2",
    "    je 2f",
    ".globl weft_safe_load_fault_begin",
    ".hidden weft_safe_load_fault_begin",
    "weft_safe_load_fault_begin:",
    "    movzx ecx, byte ptr [rdi]",
    "    jmp 9f",
    "2:  movzx ecx, word ptr [rdi]",
    "    jmp 9f",
    "4:  mov ecx, dword ptr [rdi]",
    "    jmp 9f",
    "8:  mov rcx, qword ptr [rdi]",
    ".globl weft_safe_load_fault_end",
    ".hidden weft_safe_load_fault_end",
    "weft_safe_load_fault_end:",
    "9:  mov qword ptr [rdx], rcx",
    "    ret",
    ".globl weft_safe_load_fixup",
    ".hidden weft_safe_load_fixup",
    "weft_safe_load_fixup:",
    "    mov qword ptr [rdx], 0",
    "    mov eax, 1",
    "    ret",
    //
    // u64 weft_safe_copy(void *dst /*rdi*/, const void *src /*rsi*/, u64 n /*rdx*/)
    // returns the number of bytes copied (n unless a fault stopped it).
    ".p2align 4",
    ".globl weft_safe_copy",
    ".hidden weft_safe_copy",
    "weft_safe_copy:",
    "    xor eax, eax",
    "    test rdx, rdx",
    "    jz 3f",
    "    cmp rdx, 8",
    "    jb 2f",
    "1:  lea rcx, [rax + 8]",
    "    cmp rcx, rdx",
    "    ja 2f",
    ".globl weft_safe_copyw_fault_begin",
    ".hidden weft_safe_copyw_fault_begin",
    "weft_safe_copyw_fault_begin:",
    "    mov r8, qword ptr [rsi + rax]",
    ".globl weft_safe_copyw_fault_end",
    ".hidden weft_safe_copyw_fault_end",
    "weft_safe_copyw_fault_end:",
    "    mov qword ptr [rdi + rax], r8",
    "    mov rax, rcx",
    "    jmp 1b",
    // A word that faulted may still start with readable bytes: finish byte by byte.
    ".globl weft_safe_copyw_fixup",
    ".hidden weft_safe_copyw_fixup",
    "weft_safe_copyw_fixup:",
    "2:  cmp rax, rdx",
    "    jae 3f",
    ".globl weft_safe_copy_fault_begin",
    ".hidden weft_safe_copy_fault_begin",
    "weft_safe_copy_fault_begin:",
    "    movzx ecx, byte ptr [rsi + rax]",
    ".globl weft_safe_copy_fault_end",
    ".hidden weft_safe_copy_fault_end",
    "weft_safe_copy_fault_end:",
    "    mov byte ptr [rdi + rax], cl",
    "    inc rax",
    "    jmp 2b",
    "3:  ret",
    ".globl weft_safe_copy_fixup",
    ".hidden weft_safe_copy_fixup",
    "weft_safe_copy_fixup:",
    "    ret",
    //
    // u64 weft_safe_strcpy(u8 *dst /*rdi*/, const u8 *src /*rsi*/, u64 max /*rdx*/)
    // Copies bytes until a NUL or `max` bytes; does not write the NUL, and may
    // write zeros after the string, below dst + max. Returns the number of bytes
    // copied, with bit 63 set if a fault stopped it. Changes only rax and rcx
    // (inline advice calls it with nothing else saved).
    //
    // A word at a time: the aligned word holding the next byte (never across a
    // page, so it faults exactly where a byte-by-byte copy would), shifted down to
    // that byte; its first zero byte found with the (w - 0x01..) & ~w & 0x80..
    // trick (the lowest flag is always a real zero).
    ".p2align 4",
    ".globl weft_safe_strcpy",
    ".hidden weft_safe_strcpy",
    "weft_safe_strcpy:",
    "    xor eax, eax",
    "    test rdx, rdx",
    "    jz 9f",
    "    push r8",
    "    push r9",
    "    push r10",
    "    push r11",
    // Fast path, when [src, src + max) lies in one page (any load in it faults
    // only if the first does): unaligned words from src, each stored whole until
    // the one holding the NUL, stored with zeros from the NUL up. The last bytes,
    // fewer than 8 before max, go the general way.
    "    mov ecx, esi",
    "    and ecx, 4095",
    "    add rcx, rdx",
    "    cmp rcx, 4096",
    "    ja 1f",
    "    mov r10, 0x0101010101010101",
    "    mov r11, 0x8080808080808080",
    "10: lea rcx, [rax + 8]",
    "    cmp rcx, rdx",
    "    ja 1f",
    ".globl weft_safe_strcpy_fast_fault_begin",
    ".hidden weft_safe_strcpy_fast_fault_begin",
    "weft_safe_strcpy_fast_fault_begin:",
    "    mov r8, qword ptr [rsi + rax]",
    ".globl weft_safe_strcpy_fast_fault_end",
    ".hidden weft_safe_strcpy_fast_fault_end",
    "weft_safe_strcpy_fast_fault_end:",
    "    mov r9, r8",
    "    sub r9, r10",
    "    mov rcx, r8",
    "    not rcx",
    "    and r9, rcx",
    "    and r9, r11",
    "    jnz 11f",
    "    mov qword ptr [rdi + rax], r8",
    "    add rax, 8",
    "    jmp 10b",
    // The NUL is byte k of the word (bit 8k + 7 is the lowest flag): keep the k
    // bytes below it.
    "11: bsf rcx, r9",
    "    sub ecx, 7",
    "    mov r9d, 1",
    "    shl r9, cl",
    "    dec r9",
    "    and r8, r9",
    "    mov qword ptr [rdi + rax], r8",
    "    shr ecx, 3",
    "    add rax, rcx",
    "    jmp 8f",
    // The next chunk: bytes from src + rax to the end of their aligned word.
    "1:  lea r8, [rsi + rax]",
    "    mov ecx, r8d",
    "    and ecx, 7",
    "    and r8, -8",
    ".globl weft_safe_strcpy_fault_begin",
    ".hidden weft_safe_strcpy_fault_begin",
    "weft_safe_strcpy_fault_begin:",
    "    mov r8, qword ptr [r8]",
    ".globl weft_safe_strcpy_fault_end",
    ".hidden weft_safe_strcpy_fault_end",
    "weft_safe_strcpy_fault_end:",
    "    shl ecx, 3",
    "    shr r8, cl",
    // r11: the chunk's limit in bits, 8 * min(bytes left in the word, max - rax).
    "    mov r11d, 64",
    "    sub r11d, ecx",
    "    mov r10, rdx",
    "    sub r10, rax",
    "    shl r10, 3",
    "    cmp r10, r11",
    "    cmovb r11, r10",
    // r10: 8 * the index of the first zero byte (64: none).
    "    mov r9, r8",
    "    mov r10, 0x0101010101010101",
    "    sub r9, r10",
    "    mov r10, r8",
    "    not r10",
    "    and r9, r10",
    "    mov r10, 0x8080808080808080",
    "    and r9, r10",
    "    mov r10d, 64",
    "    bsf r9, r9",
    "    jz 2f",
    "    lea r10, [r9 - 7]",
    // r9b: the NUL is inside the limit (the copy ends); r10: bits to copy.
    "2:  cmp r10, r11",
    "    setb r9b",
    "    cmova r10, r11",
    "    test r10, r10",
    "    jz 5f",
    "    lea rcx, [rax + 8]",
    "    cmp rcx, rdx",
    "    ja 6f",
    // A whole word fits below dst + max: the chunk's bytes, zeros above them.
    "    cmp r10d, 64",
    "    je 4f",
    "    mov ecx, 64",
    "    sub ecx, r10d",
    "    shl r8, cl",
    "    shr r8, cl",
    "4:  mov qword ptr [rdi + rax], r8",
    "    shr r10, 3",
    "    add rax, r10",
    "    jmp 5f",
    // Near max: byte by byte.
    "6:  shr r10, 3",
    "7:  mov byte ptr [rdi + rax], r8b",
    "    shr r8, 8",
    "    inc rax",
    "    dec r10",
    "    jnz 7b",
    "5:  test r9b, r9b",
    "    jnz 8f",
    "    cmp rax, rdx",
    "    jb 1b",
    "8:  pop r11",
    "    pop r10",
    "    pop r9",
    "    pop r8",
    "9:  ret",
    ".globl weft_safe_strcpy_fixup",
    ".hidden weft_safe_strcpy_fixup",
    "weft_safe_strcpy_fixup:",
    "    pop r11",
    "    pop r10",
    "    pop r9",
    "    pop r8",
    "    bts rax, 63",
    "    ret",
    //
    // u64 weft_safe_store(void *addr /*rdi*/, u64 value /*rsi*/, u64 size /*rdx*/)
    // returns 0 on success, 1 on fault.
    ".p2align 4",
    ".globl weft_safe_store",
    ".hidden weft_safe_store",
    "weft_safe_store:",
    "    xor eax, eax",
    "    cmp rdx, 8",
    "    je 8f",
    "    cmp rdx, 4",
    "    je 4f",
    "    cmp rdx, 2",
    "    je 2f",
    ".globl weft_safe_store_fault_begin",
    ".hidden weft_safe_store_fault_begin",
    "weft_safe_store_fault_begin:",
    "    mov byte ptr [rdi], sil",
    "    ret",
    "2:  mov word ptr [rdi], si",
    "    ret",
    "4:  mov dword ptr [rdi], esi",
    "    ret",
    "8:  mov qword ptr [rdi], rsi",
    ".globl weft_safe_store_fault_end",
    ".hidden weft_safe_store_fault_end",
    "weft_safe_store_fault_end:",
    "    ret",
    ".globl weft_safe_store_fixup",
    ".hidden weft_safe_store_fixup",
    "weft_safe_store_fixup:",
    "    mov eax, 1",
    "    ret",
);

unsafe extern "C" {
    fn weft_safe_load(addr: u64, size: u64, out: *mut u64) -> u64;
    fn weft_safe_copy(dst: *mut u8, src: u64, n: u64) -> u64;
    fn weft_safe_strcpy(dst: *mut u8, src: u64, max: u64) -> u64;
    fn weft_safe_store(addr: u64, value: u64, size: u64) -> u64;
    static weft_safe_load_fault_begin: u8;
    static weft_safe_load_fault_end: u8;
    static weft_safe_load_fixup: u8;
    static weft_safe_copyw_fault_begin: u8;
    static weft_safe_copyw_fault_end: u8;
    static weft_safe_copyw_fixup: u8;
    static weft_safe_copy_fault_begin: u8;
    static weft_safe_copy_fault_end: u8;
    static weft_safe_copy_fixup: u8;
    static weft_safe_strcpy_fault_begin: u8;
    static weft_safe_strcpy_fault_end: u8;
    static weft_safe_strcpy_fixup: u8;
    static weft_safe_strcpy_fast_fault_begin: u8;
    static weft_safe_strcpy_fast_fault_end: u8;
    static weft_safe_store_fault_begin: u8;
    static weft_safe_store_fault_end: u8;
    static weft_safe_store_fixup: u8;
}

/// Addresses below this are never read (NULL and the first page); the kernel never
/// maps them for user processes with the default `vm.mmap_min_addr`.
const MIN_ADDR: u64 = 4096;
/// Non-canonical addresses fault with SIGSEGV too, but reject them early.
const MAX_ADDR: u64 = 0x0000_8000_0000_0000;

fn plausible(addr: u64, len: u64) -> bool {
    (MIN_ADDR..MAX_ADDR).contains(&addr) && addr.checked_add(len).is_some_and(|e| e <= MAX_ADDR)
}

/// Read `size` (1, 2, 4 or 8) bytes at `addr`, zero-extended. `None` on a fault.
#[inline]
pub fn load(addr: u64, size: u8) -> Option<u64> {
    if !plausible(addr, u64::from(size)) {
        return None;
    }
    let mut out = 0u64;
    // SAFETY: weft_safe_load only dereferences `addr` at instructions covered by the
    // fault handler's fixup table, and writes `out`, a valid local.
    let faulted = unsafe { weft_safe_load(addr, u64::from(size), &mut out) };
    (faulted == 0).then_some(out)
}

/// Copy up to `dst.len()` bytes from `src`. Returns the number copied (less than
/// `dst.len()` when a fault stopped the copy).
#[inline]
pub fn copy(dst: &mut [u8], src: u64) -> usize {
    if dst.is_empty() {
        return 0;
    }
    if !plausible(src, 1) {
        return 0;
    }
    let n = (dst.len() as u64).min(MAX_ADDR - src);
    // SAFETY: dst is a valid writable buffer of at least n bytes; src is only read at
    // fault-handled instructions.
    unsafe { weft_safe_copy(dst.as_mut_ptr(), src, n) as usize }
}

/// Copy a NUL-terminated string of at most `max` bytes from `src` into `dst` (which
/// must hold `max` bytes). Returns `(len, faulted)`; the NUL is not written.
#[inline]
pub fn strcpy(dst: &mut [u8], src: u64, max: usize) -> (usize, bool) {
    let max = max.min(dst.len());
    if max == 0 {
        return (0, false);
    }
    if !plausible(src, 1) {
        return (0, true);
    }
    let max = (max as u64).min(MAX_ADDR - src);
    // SAFETY: dst holds at least `max` bytes; src is only read at fault-handled
    // instructions.
    let r = unsafe { weft_safe_strcpy(dst.as_mut_ptr(), src, max) };
    ((r & !(1 << 63)) as usize, r >> 63 != 0)
}

/// Store `size` bytes of `value` at `addr` in target memory (only for `--unsafe`
/// advice). Returns false on a fault.
pub fn store(addr: u64, value: u64, size: u8) -> bool {
    if !plausible(addr, u64::from(size)) {
        return false;
    }
    // SAFETY: the store happens at a fault-handled instruction; the caller (advice
    // under --unsafe) has accepted writing target memory.
    unsafe { weft_safe_store(addr, value, u64::from(size)) == 0 }
}

/// If `ip` is a fault-handled instruction, the address to resume at.
pub fn fixup_for(ip: u64) -> Option<u64> {
    // SAFETY: only the addresses of these linker-defined labels are taken.
    let table = unsafe {
        [
            (
                &weft_safe_load_fault_begin as *const u8 as u64,
                &weft_safe_load_fault_end as *const u8 as u64,
                &weft_safe_load_fixup as *const u8 as u64,
            ),
            (
                &weft_safe_copyw_fault_begin as *const u8 as u64,
                &weft_safe_copyw_fault_end as *const u8 as u64,
                &weft_safe_copyw_fixup as *const u8 as u64,
            ),
            (
                &weft_safe_copy_fault_begin as *const u8 as u64,
                &weft_safe_copy_fault_end as *const u8 as u64,
                &weft_safe_copy_fixup as *const u8 as u64,
            ),
            (
                &weft_safe_strcpy_fault_begin as *const u8 as u64,
                &weft_safe_strcpy_fault_end as *const u8 as u64,
                &weft_safe_strcpy_fixup as *const u8 as u64,
            ),
            (
                &weft_safe_strcpy_fast_fault_begin as *const u8 as u64,
                &weft_safe_strcpy_fast_fault_end as *const u8 as u64,
                &weft_safe_strcpy_fixup as *const u8 as u64,
            ),
            (
                &weft_safe_store_fault_begin as *const u8 as u64,
                &weft_safe_store_fault_end as *const u8 as u64,
                &weft_safe_store_fixup as *const u8 as u64,
            ),
        ]
    };
    table
        .iter()
        .find(|(b, e, _)| ip >= *b && ip < *e)
        .map(|(_, _, f)| *f)
}

// ---------------------------------------------------------------------------------
// The handler
// ---------------------------------------------------------------------------------

static INSTALLED: AtomicBool = AtomicBool::new(false);
/// Where faults that are not ours go instead of the handler replaced by
/// [`install_fault_handler`]: a `fn(sig, info, ctx)` set by the agent, which keeps the
/// target's dispositions itself (0: use the replaced handler).
pub static CHAIN: AtomicUsize = AtomicUsize::new(0);
static mut OLD_SEGV: MaybeUninit<libc::sigaction> = MaybeUninit::uninit();
static mut OLD_BUS: MaybeUninit<libc::sigaction> = MaybeUninit::uninit();

/// Install the SIGSEGV/SIGBUS handler that turns faults in the routines above into
/// error results. Idempotent. Other faults go to the previously installed handler.
pub fn install_fault_handler() -> std::io::Result<()> {
    if INSTALLED.swap(true, Ordering::AcqRel) {
        return Ok(());
    }
    for (sig, old) in [
        (libc::SIGSEGV, &raw mut OLD_SEGV),
        (libc::SIGBUS, &raw mut OLD_BUS),
    ] {
        // SAFETY: a zeroed sigaction is valid; we fill in handler, flags and mask;
        // `old` points to a static only written here, before the handler can run
        // (the handler reads it only after sigaction returned).
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_fault as *const () as usize;
            sa.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK | libc::SA_NODEFER;
            libc::sigemptyset(&mut sa.sa_mask);
            if libc::sigaction(sig, &sa, (*old).as_mut_ptr()) != 0 {
                INSTALLED.store(false, Ordering::Release);
                return Err(std::io::Error::last_os_error());
            }
        }
    }
    Ok(())
}

/// Put our handler back in front after the target replaced it; the handler it
/// replaced becomes the one we chain to.
pub fn reinstall_fault_handler() {
    INSTALLED.store(false, Ordering::Release);
    let _ = install_fault_handler();
}

/// True when our handler is still the one installed for SIGSEGV (the target may have
/// replaced it; the agent re-checks periodically).
pub fn fault_handler_installed() -> bool {
    // SAFETY: querying the current disposition with a null new action.
    unsafe {
        let mut cur: libc::sigaction = std::mem::zeroed();
        libc::sigaction(libc::SIGSEGV, std::ptr::null(), &mut cur) == 0
            && cur.sa_sigaction == on_fault as *const () as usize
    }
}

/// The SIGSEGV/SIGBUS handler: faults at the routines above resume at their fixup;
/// others go to [`CHAIN`] or the handler this one replaced.
pub extern "C" fn on_fault(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid ucontext_t for SA_SIGINFO handlers.
    let uc = unsafe { &mut *(ctx as *mut libc::ucontext_t) };
    let ip = uc.uc_mcontext.gregs[libc::REG_RIP as usize] as u64;
    if let Some(fix) = fixup_for(ip) {
        uc.uc_mcontext.gregs[libc::REG_RIP as usize] = fix as i64;
        return;
    }
    // Not ours: hand over to the target's disposition.
    let chain = CHAIN.load(Ordering::Acquire);
    if chain != 0 {
        // SAFETY: CHAIN holds a function of this signature (see its doc).
        let f: fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
            unsafe { std::mem::transmute(chain) };
        f(sig, info, ctx);
        return;
    }
    let old = if sig == libc::SIGBUS {
        &raw const OLD_BUS
    } else {
        &raw const OLD_SEGV
    };
    // SAFETY: OLD_* were initialised by install_fault_handler before this handler
    // could be invoked.
    let old = unsafe { (*old).assume_init_ref() };
    let h = old.sa_sigaction;
    if h == libc::SIG_DFL || h == libc::SIG_IGN {
        // Restore the default action and return: the faulting instruction runs again
        // and the kernel applies the default (core dump), as without weft.
        // SAFETY: resetting a signal disposition to default.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = libc::SIG_DFL;
            libc::sigaction(sig, &sa, std::ptr::null_mut());
        }
        return;
    }
    if old.sa_flags & libc::SA_SIGINFO != 0 {
        // SAFETY: the previous handler was installed with SA_SIGINFO, so it has this
        // signature.
        let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
            unsafe { std::mem::transmute(h) };
        f(sig, info, ctx);
    } else {
        // SAFETY: a plain sa_handler takes the signal number only.
        let f: extern "C" fn(libc::c_int) = unsafe { std::mem::transmute(h) };
        f(sig);
    }
}

/// The address of the fault-tolerant string copy routine (`Helper::SafeStrcpy`),
/// which inline advice calls directly.
pub fn strcpy_routine() -> usize {
    weft_safe_strcpy as *const () as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two pages of our own, the first filled with `fill`, the second unreadable: a
    /// read across the boundary faults there. (Not unmapped: a mapping made
    /// meanwhile by another test thread could land in the hole, and reads go on.)
    /// The caller unmaps the 8 KiB.
    fn guarded_page(fill: u8) -> *mut u8 {
        // SAFETY: an anonymous mapping and protection of our own memory.
        unsafe {
            let p = libc::mmap(
                std::ptr::null_mut(),
                8192,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            ) as *mut u8;
            assert!(!p.is_null());
            std::ptr::write_bytes(p, fill, 4096);
            assert_eq!(
                libc::mprotect(p.add(4096) as *mut _, 4096, libc::PROT_NONE),
                0
            );
            p
        }
    }

    #[test]
    fn loads_and_faults() {
        install_fault_handler().unwrap();
        let x: u64 = 0x1122_3344_5566_7788;
        let a = &x as *const u64 as u64;
        assert_eq!(load(a, 8), Some(0x1122_3344_5566_7788));
        assert_eq!(load(a, 4), Some(0x5566_7788));
        assert_eq!(load(a, 2), Some(0x7788));
        assert_eq!(load(a, 1), Some(0x88));
        assert_eq!(load(0, 8), None);
        assert_eq!(load(0xdead_0000_0000, 8), None, "unmapped");
        assert_eq!(load(0xffff_ffff_ffff_0000, 8), None, "non-canonical");
    }

    #[test]
    fn copy_stops_at_unmapped_page() {
        install_fault_handler().unwrap();
        let p = guarded_page(b'x');
        let mut buf = [0u8; 64];
        let n = copy(&mut buf, p as u64 + 4096 - 10);
        assert_eq!(n, 10);
        assert_eq!(&buf[..10], b"xxxxxxxxxx");
        let (len, faulted) = strcpy(&mut buf, p as u64 + 4096 - 5, 64);
        assert_eq!((len, faulted), (5, true));
        let s = b"hello\0world";
        let (len, faulted) = strcpy(&mut buf, s.as_ptr() as u64, 64);
        assert_eq!((len, faulted), (5, false));
        assert_eq!(&buf[..5], b"hello");
        let (len, _) = strcpy(&mut buf, s.as_ptr() as u64, 3);
        assert_eq!(len, 3);
        // SAFETY: unmapping what we mapped.
        unsafe { libc::munmap(p as *mut _, 8192) };
    }

    #[test]
    fn word_copies_match_a_byte_by_byte_copy() {
        install_fault_handler().unwrap();
        // Source: random nonzero bytes with a NUL at `len`, at every alignment.
        let mut src = vec![0u8; 256];
        for len in 0..80usize {
            for align in 0..8usize {
                for max in [0usize, 1, 5, 7, 8, 9, 15, 16, 17, 31, 63, 64, 100] {
                    for (i, b) in src.iter_mut().enumerate() {
                        *b = (i * 37 % 255 + 1) as u8;
                    }
                    src[align + len] = 0;
                    let mut dst = [0xaau8; 128];
                    let n = max.min(dst.len());
                    let (got, faulted) = strcpy(&mut dst[..n], src[align..].as_ptr() as u64, max);
                    let want = len.min(n);
                    assert!(!faulted);
                    assert_eq!(got, want, "len {len} align {align} max {max}");
                    assert_eq!(&dst[..want], &src[align..align + want]);
                    // Zeros may follow the string, below max; nothing past it.
                    assert!(dst[want..n].iter().all(|&b| b == 0 || b == 0xaa));
                    assert!(dst[n..].iter().all(|&b| b == 0xaa), "wrote past max");
                }
            }
        }
    }

    #[test]
    fn word_copies_stop_exactly_at_an_unreadable_page() {
        install_fault_handler().unwrap();
        let p = guarded_page(b'y');
        for back in 1..=20u64 {
            let mut buf = [0u8; 64];
            let (len, faulted) = strcpy(&mut buf, p as u64 + 4096 - back, 63);
            assert_eq!((len as u64, faulted), (back, true), "{back} bytes before");
            assert!(buf[..len].iter().all(|&b| b == b'y'));
        }
        // A NUL just before the page: no fault.
        // SAFETY: inside the readable page.
        unsafe { *p.add(4095) = 0 };
        let mut buf = [0u8; 64];
        assert_eq!(strcpy(&mut buf, p as u64 + 4090, 63), (5, false));
        // Inside the unreadable page, with the whole window in it (the fast path).
        let mut buf = [0u8; 64];
        assert_eq!(strcpy(&mut buf, p as u64 + 4096 + 100, 63), (0, true));
        // SAFETY: unmapping what we mapped.
        unsafe { libc::munmap(p as *mut _, 8192) };
    }

    #[test]
    fn store_faults_on_readonly() {
        install_fault_handler().unwrap();
        let mut v: u32 = 0;
        assert!(store(&mut v as *mut u32 as u64, 0xabcd, 4));
        assert_eq!(v, 0xabcd);
        let code = loads_and_faults as *const () as u64;
        assert!(!store(code, 0, 1), "text is read-only");
    }
}
