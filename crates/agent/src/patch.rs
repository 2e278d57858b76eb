//! Undoing patches from inside the target, when weft is gone.
//!
//! Normally weft patches and restores code with every thread stopped. If weft dies,
//! the agent restores every patched site itself while the target keeps running,
//! with the sequence that is safe for concurrent execution (as the kernel's
//! `text_poke_bp`): write `int3` over the first byte, make every core serialize,
//! write the tail, serialize, write the first byte, serialize. A thread that reaches
//! the site meanwhile traps, and the SIGTRAP handler sends it to the site's
//! relocated copy of the original instructions.
//!
//! Code is written through `/proc/self/mem`, which writes through read-only pages
//! without changing their protection.

use core::sync::atomic::{AtomicI32, AtomicU8, Ordering};
use weft_abi::{SiteKind, SITE_PATCHED, SITE_PATCHING, SITE_RESTORED};
use weft_runtime::shm::Shm;

static MEM_FD: AtomicI32 = AtomicI32::new(-1);
/// How `sync_core` serializes: not yet known (registration is done on first use),
/// a core-serializing membarrier, a plain expedited one, or none available.
static BARRIER: AtomicU8 = AtomicU8::new(BARRIER_UNKNOWN);
const BARRIER_UNKNOWN: u8 = 0;
const BARRIER_SYNC_CORE: u8 = 1;
const BARRIER_EXPEDITED: u8 = 2;
const BARRIER_NONE: u8 = 3;
const INT3: u8 = 0xcc;

const MEMBARRIER_CMD_QUERY: i32 = 0;
const MEMBARRIER_CMD_PRIVATE_EXPEDITED: i32 = 1 << 3;
const MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED: i32 = 1 << 4;
const MEMBARRIER_CMD_PRIVATE_EXPEDITED_SYNC_CORE: i32 = 1 << 5;
const MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED_SYNC_CORE: i32 = 1 << 6;

fn membarrier(cmd: i32) -> i64 {
    // SAFETY: membarrier takes no pointers.
    unsafe { libc::syscall(libc::SYS_membarrier, cmd, 0, 0) }
}

/// Opens `/proc/self/mem` for the session being served (high, see `fds`), unless
/// it is open.
pub fn open_mem() {
    if MEM_FD.load(Ordering::Acquire) >= 0 {
        return;
    }
    // SAFETY: opening our own /proc/self/mem.
    let fd = unsafe { libc::open(c"/proc/self/mem".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
    MEM_FD.store(crate::fds::high_raw(fd), Ordering::Release);
}

/// The `/proc/self/mem` descriptor (-1 when no session is served).
pub fn mem_fd() -> i32 {
    MEM_FD.load(Ordering::Acquire)
}

/// Closes `/proc/self/mem` once no session is served: between sessions the agent
/// holds no descriptor.
pub fn close_mem() {
    let fd = MEM_FD.swap(-1, Ordering::AcqRel);
    if fd >= 0 {
        // SAFETY: closing the descriptor only the agent uses.
        unsafe { libc::close(fd) };
    }
}

/// Registers the process for expedited membarriers, the first time they are needed.
/// Not in the constructor: in a process that already has several threads the
/// kernel waits for an RCU grace period to register (about 10 ms here), and a
/// remote `dlopen` runs with the whole process stopped. Only the self-unweave of a
/// session whose weft died needs the barrier, and it can wait that long.
fn barrier() -> u8 {
    let known = BARRIER.load(Ordering::Acquire);
    if known != BARRIER_UNKNOWN {
        return known;
    }
    let cmds = membarrier(MEMBARRIER_CMD_QUERY);
    let kind = if cmds > 0
        && cmds as i32 & MEMBARRIER_CMD_PRIVATE_EXPEDITED_SYNC_CORE != 0
        && membarrier(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED_SYNC_CORE) == 0
    {
        BARRIER_SYNC_CORE
    } else if cmds > 0
        && cmds as i32 & MEMBARRIER_CMD_PRIVATE_EXPEDITED != 0
        && membarrier(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED) == 0
    {
        BARRIER_EXPEDITED
    } else {
        BARRIER_NONE
    };
    // Registering twice (two threads racing here) is harmless.
    BARRIER.store(kind, Ordering::Release);
    kind
}

/// Make every thread of the process execute a serializing instruction before
/// continuing, so no core runs stale instruction bytes.
fn sync_core() {
    match barrier() {
        BARRIER_SYNC_CORE => {
            membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED_SYNC_CORE);
        }
        BARRIER_EXPEDITED => {
            // An IPI to every core running our threads; interrupt return serializes.
            membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED);
        }
        _ => {}
    }
}

/// In the child of a fork(): the inherited `/proc/self/mem` descriptor (open while
/// a session is served) still refers to the *parent's* address space (the kernel
/// binds it to the mm at open time), so writing through it would patch the parent.
/// Reopen it for the child's own memory.
/// The child's new mm is not registered for `membarrier` either: it registers on
/// first use, like the parent.
pub fn after_fork_child() {
    if MEM_FD.load(Ordering::Acquire) >= 0 {
        close_mem();
        open_mem();
    }
    BARRIER.store(BARRIER_UNKNOWN, Ordering::Release);
}

/// In the child of a fork(), while it has a single thread (this one, in the atfork
/// child handler): put the original bytes back at every site of the session, in the
/// child's own copy of the code. The child is thereby unwoven: its session belongs to
/// the parent (weft neither drains its rings nor restores its code), and its int3
/// sites would otherwise trap with no site table to resume from.
///
/// The site table is shared with the parent and weft, so nothing in it is written:
/// a site counts as patched here when the child's bytes are its patch, or an `int3`
/// followed by the patch's or the original's tail (the child was forked while the
/// parent's agent was restoring it with the int3-first sequence). Returns the number
/// of sites restored.
pub fn unweave_forked_child(shm: &Shm, space: u32) -> usize {
    let n = shm
        .header()
        .site_count
        .load(Ordering::Acquire)
        .min(shm.header().max_sites);
    let mut restored = 0;
    for i in 0..n {
        let s = shm.site(i);
        let len = s.patch_len as usize;
        let mut cur = [0u8; weft_abi::SITE_MAX_BYTES];
        if s.space != space || len == 0 || len > cur.len() || s.orig_len as usize != len {
            continue;
        }
        if !read_code(s.addr, &mut cur[..len]) || cur[..len] == s.orig[..len] {
            continue;
        }
        let ours = cur[..len] == s.patch[..len]
            || (cur[0] == INT3
                && (cur[1..len] == s.patch[1..len] || cur[1..len] == s.orig[1..len]));
        if !ours || !write_code(s.addr, &s.orig[..len]) {
            continue;
        }
        restored += 1;
        let sem = s.semaphore;
        if sem != 0 {
            // SAFETY: as in `restore_all`; the child's private copy of the semaphore.
            let w = unsafe { &*(sem as *const core::sync::atomic::AtomicU16) };
            let _ = w.fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| v.checked_sub(1));
        }
    }
    restored
}

fn write_code(addr: u64, bytes: &[u8]) -> bool {
    let fd = MEM_FD.load(Ordering::Acquire);
    if fd < 0 {
        return false;
    }
    // SAFETY: pwrite from a valid buffer to our own address space.
    let n = unsafe { libc::pwrite(fd, bytes.as_ptr() as *const _, bytes.len(), addr as i64) };
    n == bytes.len() as isize
}

fn read_code(addr: u64, out: &mut [u8]) -> bool {
    let fd = MEM_FD.load(Ordering::Acquire);
    // SAFETY: pread into a valid buffer.
    let n = unsafe { libc::pread(fd, out.as_mut_ptr() as *mut _, out.len(), addr as i64) };
    n == out.len() as isize
}

/// Restore every site of the session in this process (site space `space`) that is
/// (or may be) patched. Returns the number of sites restored.
///
/// The redirect of glibc's `sigaction` goes last, as when weft unweaves: once it is
/// gone, the target's `sigaction` reaches the kernel again and may put its own
/// SIGTRAP, SIGSEGV or SIGBUS handler in front of the agent's. A thread that hit an
/// int3 site just before it was restored, or faulted in advice, but was not yet
/// given the signal (preempted on its way back to user space) would then get weft's
/// trap or fault in the target's handler (or die of it). So the redirect is restored
/// only once no thread has such a signal pending, or after [`PENDING_PATIENCE`].
pub fn restore_all(shm: &Shm, space: u32) -> usize {
    let redirect = |s: &weft_abi::SiteDesc| {
        s.resume == crate::signals::weft_agent_sigaction as *const () as u64
    };
    let mut n = restore_sites(shm, |s| s.space == space && !redirect(s));
    let start = std::time::Instant::now();
    // A thread still inside advice may yet fault in a fault-tolerant read: that
    // fault must reach the agent's handler, not one the target installs once the
    // redirect is gone.
    while (guarded_signal_pending() || in_advice()) && start.elapsed() < PENDING_PATIENCE {
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    n += restore_sites(shm, |s| s.space == space && redirect(s));
    n
}

/// Whether another thread is inside advice or a helper (`nest`, raised by the
/// generic trampolines and the trap handler).
fn in_advice() -> bool {
    let me = crate::threads::current();
    crate::threads::all().any(|t| {
        // SAFETY: pool entries stay mapped; `nest` is read racily, as the
        // quiescence checks do.
        t != me && unsafe { core::ptr::read_volatile(core::ptr::addr_of!((*t).nest)) } != 0
    })
}

/// How long [`restore_all`] waits for weft's traps and faults to be delivered.
const PENDING_PATIENCE: std::time::Duration = std::time::Duration::from_millis(500);

/// Whether some thread of the process has a SIGTRAP, SIGSEGV or SIGBUS pending
/// (`SigPnd` in its `/proc` status).
fn guarded_signal_pending() -> bool {
    let guarded = [libc::SIGTRAP, libc::SIGSEGV, libc::SIGBUS]
        .iter()
        .fold(0u64, |m, &s| m | 1 << (s - 1));
    let Some(tasks) = crate::fds::tasks() else {
        return false;
    };
    tasks.into_iter().any(|t| {
        std::fs::read_to_string(format!("/proc/self/task/{t}/status")).is_ok_and(|st| {
            st.lines()
                .find_map(|l| l.strip_prefix("SigPnd:"))
                .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
                .is_some_and(|m| m & guarded != 0)
        })
    })
}

/// Restore the sites `which` selects that are (or may be) patched, with the
/// int3-first sequence.
fn restore_sites(shm: &Shm, which: impl Fn(&weft_abi::SiteDesc) -> bool) -> usize {
    let n = shm
        .header()
        .site_count
        .load(Ordering::Acquire)
        .min(shm.header().max_sites);
    let todo: Vec<u32> = (0..n).filter(|&i| which(shm.site(i))).collect();
    rewrite(shm, &todo, false)
}

/// While the session runs (weft asked, [`weft_abi::msg::Msg::SetSites`]): write the
/// patch (`on`) or the original bytes at `sites` of this process (site space
/// `space`). Returns how many changed.
pub fn set_sites(shm: &Shm, space: u32, sites: impl Iterator<Item = u32>, on: bool) -> usize {
    let max = shm
        .header()
        .site_count
        .load(Ordering::Acquire)
        .min(shm.header().max_sites);
    let todo: Vec<u32> = sites
        .filter(|&i| i < max && shm.site(i).space == space)
        .collect();
    rewrite(shm, &todo, on)
}

/// Write the patch (`on`) or the original bytes of `sites` with the int3-first
/// sequence, each write followed by a core-serializing barrier: int3 over the first
/// byte of multi-byte writes, then the tail, then the first byte. A thread that
/// meets the int3 meanwhile traps and the trap handler sends it to the site's
/// relocated original instructions. Only sites whose bytes are what the other state
/// says are rewritten (a site patched by someone else is left alone).
fn rewrite(shm: &Shm, sites: &[u32], on: bool) -> usize {
    let mut todo = Vec::new();
    for &i in sites {
        let s = shm.site(i);
        let st = s.state.load(Ordering::Acquire);
        let from_state = if on {
            st == SITE_RESTORED || st == weft_abi::SITE_UNUSED
        } else {
            st == SITE_PATCHED || st == SITE_PATCHING
        };
        let len = s.patch_len as usize;
        let mut cur = [0u8; weft_abi::SITE_MAX_BYTES];
        if !from_state
            || len == 0
            || len > cur.len()
            || s.orig_len != s.patch_len
            || !read_code(s.addr, &mut cur[..len])
        {
            continue;
        }
        let (from, _) = bytes_of(s, on);
        if cur[..len] == from[..len] {
            if on {
                s.state.store(SITE_PATCHING, Ordering::Release);
            }
            todo.push(i);
        } else if !on {
            // Never patched (weft died before writing), or changed by someone else.
            s.state.store(SITE_RESTORED, Ordering::Release);
        }
    }
    // 1. int3 over the first byte of multi-byte writes.
    for &i in &todo {
        let s = shm.site(i);
        if s.kind != SiteKind::Int3 as u32 && s.patch_len > 1 {
            write_code(s.addr, &[INT3]);
        }
    }
    sync_core();
    // 2. the tail.
    for &i in &todo {
        let s = shm.site(i);
        if s.kind != SiteKind::Int3 as u32 && s.patch_len > 1 {
            let (_, to) = bytes_of(s, on);
            write_code(s.addr + 1, &to[1..s.patch_len as usize]);
        }
    }
    sync_core();
    // 3. the first byte.
    for &i in &todo {
        let s = shm.site(i);
        let (_, to) = bytes_of(s, on);
        write_code(s.addr, &to[..1]);
        s.state.store(
            if on { SITE_PATCHED } else { SITE_RESTORED },
            Ordering::Release,
        );
    }
    sync_core();
    // USDT semaphores follow, so PROBE_ENABLED() code runs only while woven.
    for &i in &todo {
        let sem = shm.site(i).semaphore;
        if sem != 0 {
            // SAFETY: weft recorded the address of a 16-bit semaphore in a writable
            // data section of this process, which it incremented when patching.
            let w = unsafe { &*(sem as *const core::sync::atomic::AtomicU16) };
            let _ = w.fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| {
                if on {
                    v.checked_add(1)
                } else {
                    v.checked_sub(1)
                }
            });
        }
    }
    todo.len()
}

/// `(bytes there now, bytes to write)` of a site being patched (`on`) or restored.
fn bytes_of(s: &weft_abi::SiteDesc, on: bool) -> (&[u8], &[u8]) {
    if on {
        (&s.orig, &s.patch)
    } else {
        (&s.patch, &s.orig)
    }
}
