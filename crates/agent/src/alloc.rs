//! The agent's own allocator: every allocation of the agent's Rust code (the control
//! thread, `weft_agent_connect`, the constructor, a forked child's set-up) comes from
//! memory the agent maps itself, never from the target's `malloc`. The target's
//! allocator is the target's: calling it from the agent would make the control
//! thread's first allocation create a malloc arena (64 MiB of address space) that
//! stays after the session, and would run the target's allocator (maybe an
//! instrumented or protected one) on the agent's behalf.
//!
//! Small blocks (up to [`MAX_SMALL`] bytes) come in power-of-two classes, carved
//! from [`CHUNK`]-byte chunks and kept on one free list per class; larger ones are
//! mappings of their own (`mremap` grows them). One spin lock guards it all: the
//! control paths allocate, a probe hit or a signal handler never does.
//!
//! Every block handed out is counted ([`live`]). At the end of the last session the
//! control thread asks for the chunks to go ([`release_when_idle`]); they are
//! unmapped as the count reaches zero (the last blocks are freed as the control
//! thread ends), and mapped again by the next allocation.

use core::alloc::{GlobalAlloc, Layout};
use core::ptr::null_mut;
use core::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// Size of a chunk small blocks are carved from.
pub const CHUNK: usize = 256 * 1024;
/// The largest small block; larger ones are mapped on their own.
pub const MAX_SMALL: usize = 16 * 1024;
const MIN_SMALL: usize = 16;
const CLASSES: usize = (MAX_SMALL / MIN_SMALL).trailing_zeros() as usize + 1;
const PAGE: usize = 4096;
/// Room at the start of a chunk for the link to the next chunk.
const CHUNK_HEADER: usize = 64;

struct State {
    /// Free blocks of each class, linked through their first word.
    free: [*mut u8; CLASSES],
    /// The unused end of the newest chunk: `[bump, end)`.
    bump: usize,
    end: usize,
    /// Every chunk, linked through its first word.
    chunks: *mut u8,
    nchunks: usize,
    /// Bytes mapped for large blocks.
    large_bytes: usize,
}

struct Heap {
    lock: AtomicBool,
    state: core::cell::UnsafeCell<State>,
}

// SAFETY: `state` is only touched with `lock` held (see `Heap::with`).
unsafe impl Sync for Heap {}

static HEAP: Heap = Heap {
    lock: AtomicBool::new(false),
    state: core::cell::UnsafeCell::new(State {
        free: [null_mut(); CLASSES],
        bump: 0,
        end: 0,
        chunks: null_mut(),
        nchunks: 0,
        large_bytes: 0,
    }),
};

/// Blocks handed out and not freed yet.
static LIVE: AtomicUsize = AtomicUsize::new(0);
/// Unmap the chunks once [`LIVE`] reaches zero.
static TRIM: AtomicBool = AtomicBool::new(false);

impl Heap {
    fn lock(&self) {
        let mut spins = 0u32;
        while self
            .lock
            .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            spins += 1;
            if spins < 100 {
                core::hint::spin_loop();
            } else {
                // SAFETY: sched_yield has no preconditions.
                unsafe { libc::sched_yield() };
            }
        }
    }

    fn unlock(&self) {
        self.lock.store(false, Ordering::Release);
    }

    fn with<T>(&self, f: impl FnOnce(&mut State) -> T) -> T {
        self.lock();
        // SAFETY: the lock is held: no other reference to the state exists.
        let r = f(unsafe { &mut *self.state.get() });
        self.unlock();
        r
    }
}

fn map(len: usize) -> *mut u8 {
    // SAFETY: a fresh private anonymous mapping.
    let p = unsafe {
        libc::mmap(
            null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        null_mut()
    } else {
        p as *mut u8
    }
}

/// The class of a small block for `layout` (its size `MIN_SMALL << class`), or
/// `None` for a large one.
fn class_of(layout: &Layout) -> Option<usize> {
    let need = layout.size().max(layout.align()).max(MIN_SMALL);
    if need > MAX_SMALL {
        return None;
    }
    let size = need.next_power_of_two();
    Some((size / MIN_SMALL).trailing_zeros() as usize)
}

fn large_len(size: usize) -> usize {
    size.max(1).div_ceil(PAGE) * PAGE
}

impl State {
    fn alloc_small(&mut self, class: usize) -> *mut u8 {
        let head = self.free[class];
        if !head.is_null() {
            // SAFETY: a free block of this class: its first word links the next.
            self.free[class] = unsafe { (head as *mut *mut u8).read() };
            return head;
        }
        let size = MIN_SMALL << class;
        // Blocks are aligned to their size up to a page (a chunk is page-aligned).
        let align = size.min(PAGE);
        let mut at = self.bump.div_ceil(align) * align;
        if self.bump == 0 || at + size > self.end {
            let c = map(CHUNK);
            if c.is_null() {
                return null_mut();
            }
            // SAFETY: the chunk's first word is its link (CHUNK_HEADER bytes reserved).
            unsafe { (c as *mut *mut u8).write(self.chunks) };
            self.chunks = c;
            self.nchunks += 1;
            self.bump = c as usize + CHUNK_HEADER;
            self.end = c as usize + CHUNK;
            at = self.bump.div_ceil(align) * align;
        }
        self.bump = at + size;
        at as *mut u8
    }

    fn free_small(&mut self, p: *mut u8, class: usize) {
        // SAFETY: p is a block of this class no one uses any more: its first word
        // becomes the link.
        unsafe { (p as *mut *mut u8).write(self.free[class]) };
        self.free[class] = p;
    }

    /// A block was freed: the last one unmaps the chunks if asked to.
    fn freed(&mut self) {
        if LIVE.fetch_sub(1, Ordering::AcqRel) == 1 && TRIM.swap(false, Ordering::AcqRel) {
            self.trim();
        }
    }

    /// Unmap every chunk (no block is live).
    fn trim(&mut self) {
        let mut c = self.chunks;
        while !c.is_null() {
            // SAFETY: a chunk of ours: its first word links the next; nothing in it
            // is in use (no live block).
            let next = unsafe { (c as *mut *mut u8).read() };
            // SAFETY: as above.
            unsafe { libc::munmap(c as *mut libc::c_void, CHUNK) };
            c = next;
        }
        *self = State {
            free: [null_mut(); CLASSES],
            bump: 0,
            end: 0,
            chunks: null_mut(),
            nchunks: 0,
            large_bytes: self.large_bytes,
        };
    }
}

pub struct AgentAlloc;

// SAFETY: blocks are distinct (carved once from a chunk, or a mapping of their own,
// and reused only after `dealloc`), at least `layout.size()` bytes and aligned to
// `layout.align()` (a small block is aligned to its power-of-two size up to a page,
// and its size is at least the alignment asked for; a large block is a mapping,
// page-aligned, and an alignment above a page is refused).
unsafe impl GlobalAlloc for AgentAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        match class_of(&layout) {
            Some(class) => HEAP.with(|s| {
                let p = s.alloc_small(class);
                if !p.is_null() {
                    // Counted under the lock: a trim never sees a block handed out
                    // but not yet counted.
                    LIVE.fetch_add(1, Ordering::AcqRel);
                }
                p
            }),
            None if layout.align() <= PAGE => {
                let len = large_len(layout.size());
                let p = map(len);
                if !p.is_null() {
                    HEAP.with(|s| {
                        s.large_bytes += len;
                        LIVE.fetch_add(1, Ordering::AcqRel);
                    });
                }
                p
            }
            None => null_mut(),
        }
    }

    unsafe fn dealloc(&self, p: *mut u8, layout: Layout) {
        match class_of(&layout) {
            Some(class) => HEAP.with(|s| {
                s.free_small(p, class);
                s.freed();
            }),
            None => {
                let len = large_len(layout.size());
                // SAFETY: a mapping of ours of this length (alloc/realloc), no
                // longer used.
                unsafe { libc::munmap(p as *mut libc::c_void, len) };
                HEAP.with(|s| {
                    s.large_bytes -= len;
                    s.freed();
                });
            }
        }
    }

    unsafe fn realloc(&self, p: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller's layout with the new size is valid (GlobalAlloc).
        let new = unsafe { Layout::from_size_align_unchecked(new_size, layout.align()) };
        match (class_of(&layout), class_of(&new)) {
            // Same class: the block already fits.
            (Some(a), Some(b)) if a == b => p,
            // Both large: move or grow the mapping.
            (None, None) => {
                let (old_len, new_len) = (large_len(layout.size()), large_len(new_size));
                if old_len == new_len {
                    return p;
                }
                // SAFETY: p is a mapping of ours of old_len bytes; MREMAP_MAYMOVE
                // keeps its contents.
                let q = unsafe {
                    libc::mremap(
                        p as *mut libc::c_void,
                        old_len,
                        new_len,
                        libc::MREMAP_MAYMOVE,
                    )
                };
                if q == libc::MAP_FAILED {
                    return null_mut();
                }
                HEAP.with(|s| s.large_bytes = s.large_bytes + new_len - old_len);
                q as *mut u8
            }
            _ => {
                // SAFETY: as in GlobalAlloc's default realloc.
                let q = unsafe { self.alloc(new) };
                if !q.is_null() {
                    // SAFETY: both blocks hold at least the smaller size.
                    unsafe {
                        core::ptr::copy_nonoverlapping(p, q, layout.size().min(new_size));
                        self.dealloc(p, layout);
                    }
                }
                q
            }
        }
    }
}

/// The agent goes idle (its control thread is ending with no session left): unmap
/// the chunks once no block is live (at once if none is).
pub fn release_when_idle() {
    TRIM.store(true, Ordering::Release);
    HEAP.with(|s| {
        if LIVE.load(Ordering::Acquire) == 0 && TRIM.swap(false, Ordering::AcqRel) {
            s.trim();
        }
    });
}

/// A control thread starts: keep the chunks for it.
pub fn keep() {
    TRIM.store(false, Ordering::Release);
}

/// Before fork(): hold the lock, so the child does not inherit it held by a thread
/// it does not have.
pub fn before_fork() {
    HEAP.lock();
}

/// After fork(), in the parent and in the child (one thread).
pub fn after_fork() {
    HEAP.unlock();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_are_aligned_distinct_and_reused() {
        let a = AgentAlloc;
        let mut blocks = Vec::new();
        for (size, align) in [(1, 1), (16, 8), (24, 8), (100, 64), (4000, 4096), (9000, 8)] {
            let l = Layout::from_size_align(size, align).unwrap();
            // SAFETY: a valid layout of non-zero size.
            let p = unsafe { a.alloc(l) };
            assert!(!p.is_null());
            assert_eq!(p as usize % align, 0, "{size}/{align}");
            // SAFETY: the block holds `size` bytes.
            unsafe { core::ptr::write_bytes(p, 0xab, size) };
            blocks.push((p, l));
        }
        let mut addrs: Vec<usize> = blocks.iter().map(|b| b.0 as usize).collect();
        addrs.sort();
        addrs.dedup();
        assert_eq!(addrs.len(), blocks.len());
        let (p, l) = blocks[2];
        // SAFETY: freeing a block of ours, then asking for the same class.
        unsafe { a.dealloc(p, l) };
        // SAFETY: as above.
        let q = unsafe { a.alloc(l) };
        assert_eq!(q, p, "the free list gives the block back");
        blocks[2].0 = q;
        for (p, l) in blocks {
            // SAFETY: blocks of ours.
            unsafe { a.dealloc(p, l) };
        }
    }

    #[test]
    fn large_blocks_grow_in_place_or_move_with_their_contents() {
        let a = AgentAlloc;
        let l = Layout::from_size_align(MAX_SMALL + 1, 8).unwrap();
        // SAFETY: a valid layout.
        let p = unsafe { a.alloc(l) };
        assert!(!p.is_null());
        // SAFETY: p holds l.size() bytes.
        unsafe { core::ptr::write_bytes(p, 7, l.size()) };
        // SAFETY: growing our block.
        let q = unsafe { a.realloc(p, l, 1 << 20) };
        assert!(!q.is_null());
        // SAFETY: q holds 1 MiB, the first l.size() bytes copied.
        assert!((0..l.size()).all(|i| unsafe { *q.add(i) } == 7));
        // SAFETY: shrinking into a small block.
        let s = unsafe { a.realloc(q, Layout::from_size_align(1 << 20, 8).unwrap(), 32) };
        // SAFETY: the first 32 bytes were kept.
        assert!((0..32).all(|i| unsafe { *s.add(i) } == 7));
        // SAFETY: our block.
        unsafe { a.dealloc(s, Layout::from_size_align(32, 8).unwrap()) };
    }
}
