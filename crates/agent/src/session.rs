//! The current session: the shared segment and the code regions weft gave us.
//!
//! Sessions are published through an atomic pointer. A session that ends normally
//! is freed only after weft has checked, with every thread stopped, that no thread
//! is inside advice or a trampoline (`MSG_FREE`). One that ends because weft died
//! is leaked: no one can prove it quiescent any more. So is one weft ended
//! (`MSG_END`) but never freed, because it died or gave up waiting for a thread to
//! leave the session's code: it is *abandoned* ([`abandon`]), and its sites still
//! patched are restored by the agent.

use core::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicU64, Ordering};
use weft_runtime::shm::Shm;

pub struct Session {
    pub shm: Shm,
    pub shm_size: usize,
    pub generation: u64,
    /// This process's site space in the segment (one segment serves every process
    /// of a session): its sites are those of this space.
    pub space: AtomicU32,
    /// `weft_abi::msg::SESSION_*` flags.
    pub flags: u32,
    /// The site entries of `space` are this process's own. Not yet in the child of
    /// a fork() that weft has not adopted: its sites are still its parent's entries
    /// (same addresses, same code), which it reads but never writes.
    pub adopted: AtomicBool,
    /// The profile probes, compiled for this process (set before advice runs).
    pub profiles: [Profile; weft_abi::MAX_PROFILES],
    /// The data watches (hardware watchpoints), compiled for this process.
    pub watches: [crate::watch::Watch; weft_abi::MAX_WATCHES],
    /// Code regions mapped for this session: (address, size).
    pub code: Vec<(u64, usize)>,
    /// The process's name (`pcomm`) when weft reached it, NUL-padded; each thread's
    /// slot gets a copy when it is claimed (a forked child keeps its parent's, which
    /// is its own name too until it renames itself).
    pub pcomm: [u8; 16],
}

/// A `profile:hz:N` probe of the session; `hz == 0`: none.
#[derive(Default)]
pub struct Profile {
    pub hz: AtomicU32,
    pub probe: AtomicU32,
    pub advice: AtomicU64,
}

static CURRENT: AtomicPtr<Session> = AtomicPtr::new(core::ptr::null_mut());
/// Generation of the published session (low 32 bits), 0 when there is none. Read by
/// the return trampoline's fast path: return advice runs only for its own session.
pub static CURRENT_GENERATION: AtomicU32 = AtomicU32::new(0);
static GENERATION: AtomicU64 = AtomicU64::new(0);
/// The latest abandoned session (leaked: never freed, never unmapped).
static ABANDONED: AtomicPtr<Session> = AtomicPtr::new(core::ptr::null_mut());
/// A session was leaked ([`leak`], [`abandon`]): its code stays mapped, and a
/// thread may still run through it (and so into the thread pool) at any time.
static LEAKED: AtomicBool = AtomicBool::new(false);

impl Session {
    pub fn space(&self) -> u32 {
        self.space.load(Ordering::Acquire)
    }

    pub fn follows_forks(&self) -> bool {
        self.flags & weft_abi::msg::SESSION_FOLLOW_FORK != 0
    }
}

pub fn current() -> Option<&'static Session> {
    let p = CURRENT.load(Ordering::Acquire);
    // SAFETY: a published session stays valid until `take` and the quiescence check.
    unsafe { p.as_ref() }
}

pub fn next_generation() -> u64 {
    GENERATION.fetch_add(1, Ordering::AcqRel) + 1
}

pub fn publish(s: Box<Session>) {
    let generation = s.generation as u32;
    CURRENT.store(Box::into_raw(s), Ordering::Release);
    CURRENT_GENERATION.store(generation, Ordering::Release);
}

/// Unpublish the current session; the caller decides when it can be freed.
pub fn take() -> Option<Box<Session>> {
    CURRENT_GENERATION.store(0, Ordering::Release);
    let p = CURRENT.swap(core::ptr::null_mut(), Ordering::AcqRel);
    // SAFETY: p came from Box::into_raw in `publish`.
    (!p.is_null()).then(|| unsafe { Box::from_raw(p) })
}

/// Leak a session no one can prove quiescent (weft died; a forked child's copy of
/// its parent's): its mappings stay.
pub fn leak(s: Box<Session>) {
    LEAKED.store(true, Ordering::Release);
    std::mem::forget(s);
}

/// Whether a session was ever leaked or abandoned in this process.
pub fn leaked() -> bool {
    LEAKED.load(Ordering::Acquire)
}

/// Leak an ended session that will never be freed, and make it the one
/// [`abandoned`] returns: the SIGTRAP handler finds its sites there while the agent
/// restores them.
pub fn abandon(s: Box<Session>) -> &'static Session {
    LEAKED.store(true, Ordering::Release);
    let s: &'static Session = Box::leak(s);
    ABANDONED.store(s as *const Session as *mut Session, Ordering::Release);
    s
}

/// The latest abandoned session, if any.
pub fn abandoned() -> Option<&'static Session> {
    let p = ABANDONED.load(Ordering::Acquire);
    // SAFETY: abandoned sessions are leaked, so valid for the life of the process.
    unsafe { p.as_ref() }
}

impl Drop for Session {
    fn drop(&mut self) {
        // SAFETY: these mappings were created for this session and, by the time a
        // Session is dropped, weft has verified no thread uses them.
        unsafe {
            libc::munmap(self.shm.base() as *mut _, self.shm_size);
            for (addr, size) in &self.code {
                libc::munmap(*addr as *mut _, *size);
            }
        }
    }
}
