//! Typed access to the shared data segment (layout in `weft_abi`).
//!
//! [`Shm`] wraps the segment's base address in this process. All offsets come from
//! the header, which weft writes before any advice can run and never changes while
//! the session lives, so readers need no synchronisation for it.

use core::sync::atomic::{AtomicU32, Ordering};
use weft_abi::{MapDesc, ShmHeader, SiteDesc, ThreadSlot};

use crate::queue::IndexQueue;

/// The shared segment as mapped in this process.
#[derive(Clone, Copy, Debug)]
pub struct Shm {
    base: *mut u8,
}

// SAFETY: Shm is a base pointer to shared memory whose mutable parts are atomics or
// per-thread areas written only by their owner; it may be used from any thread.
unsafe impl Send for Shm {}
// SAFETY: as above.
unsafe impl Sync for Shm {}

impl Shm {
    /// # Safety
    /// `base` must point to a mapped segment initialised by weft (valid header and
    /// offsets) that stays mapped as long as this value is used.
    pub unsafe fn from_base(base: *mut u8) -> Shm {
        Shm { base }
    }

    pub fn base(&self) -> *mut u8 {
        self.base
    }

    pub fn header(&self) -> &ShmHeader {
        // SAFETY: from_base's contract: the header is valid.
        unsafe { &*(self.base as *const ShmHeader) }
    }

    /// Pointer to `off` bytes into the segment.
    #[inline]
    pub fn at(&self, off: u64) -> *mut u8 {
        // SAFETY: callers pass offsets inside the segment (derived from the header).
        unsafe { self.base.add(off as usize) }
    }

    #[inline]
    pub fn map(&self, id: u32) -> &MapDesc {
        let h = self.header();
        debug_assert!(id < h.map_count);
        // SAFETY: map descriptors are laid out at maps_off, map_count of them.
        unsafe { &*(self.at(h.maps_off) as *const MapDesc).add(id as usize) }
    }

    pub fn map_count(&self) -> u32 {
        self.header().map_count
    }

    #[inline]
    pub fn thread_slot(&self, index: u32) -> *mut ThreadSlot {
        let h = self.header();
        self.at(h.threads_off + u64::from(index) * h.thread_slot_size) as *mut ThreadSlot
    }

    /// Slots `[0, n)` have been handed out at least once (the retired slot and
    /// weft's included; some may be free or dead now): iterate these.
    pub fn slots_used(&self) -> u32 {
        let h = self.header();
        h.slots_used.load(Ordering::Acquire).min(h.slot_count)
    }

    /// The free-slot queue (weft pushes, the agent pops).
    pub fn free_slots(&self) -> IndexQueue<'_> {
        let h = self.header();
        // SAFETY: the queue's cells are `slot_count` u32s at `free_off`, 4-aligned,
        // and live as long as the segment.
        let ring = unsafe {
            core::slice::from_raw_parts(
                self.at(h.free_off) as *const AtomicU32,
                h.slot_count as usize,
            )
        };
        IndexQueue::new(&h.free_head, &h.free_tail, ring)
    }

    /// Base of a thread slot's aggregation area.
    #[inline]
    pub fn agg_area(&self, slot: *mut ThreadSlot) -> *mut u8 {
        // SAFETY: the aggregation area lies inside each thread slot.
        unsafe { (slot as *mut u8).add(self.header().agg_off as usize) }
    }

    /// Base of a thread slot's event ring.
    #[inline]
    pub fn ring(&self, slot: *mut ThreadSlot) -> *mut u8 {
        // SAFETY: the ring lies inside each thread slot.
        unsafe { (slot as *mut u8).add(self.header().ring_off as usize) }
    }

    pub fn site(&self, index: u32) -> &SiteDesc {
        let h = self.header();
        // SAFETY: sites are laid out at sites_off, max_sites of them.
        unsafe { &*(self.at(h.sites_off) as *const SiteDesc).add(index as usize) }
    }

    pub fn site_mut(&self, index: u32) -> *mut SiteDesc {
        let h = self.header();
        // SAFETY: as for `site`.
        unsafe { (self.at(h.sites_off) as *mut SiteDesc).add(index as usize) }
    }

    fn site_hash(&self) -> *mut u32 {
        self.at(self.header().site_hash_off) as *mut u32
    }

    /// Index of the site patched at `addr` in the process of site space `space`,
    /// for the int3 handler.
    pub fn site_by_addr(&self, addr: u64, space: u32) -> Option<u32> {
        let h = self.header();
        let cap = h.site_hash_cap as usize;
        if cap == 0 {
            return None;
        }
        let table = self.site_hash();
        let mut i = (addr_hash(addr) as usize) & (cap - 1);
        // A site woven, unwoven and woven again in one session has several entries:
        // the one patched now is the one to follow.
        let mut first = None;
        for _ in 0..cap {
            // SAFETY: i < cap; the table has cap entries.
            let v = unsafe { core::ptr::read_volatile(table.add(i)) };
            if v == 0 {
                break;
            }
            let site = self.site(v - 1);
            if site.addr == addr && site.space == space {
                let st = site.state.load(core::sync::atomic::Ordering::Acquire);
                if st == weft_abi::SITE_PATCHED || st == weft_abi::SITE_PATCHING {
                    return Some(v - 1);
                }
                first.get_or_insert(v - 1);
            }
            i = (i + 1) & (cap - 1);
        }
        first
    }

    /// Record site `index` in the address hash (weft side, before patching).
    pub fn site_hash_insert(&self, index: u32) {
        let h = self.header();
        let cap = h.site_hash_cap as usize;
        let table = self.site_hash();
        let addr = self.site(index).addr;
        let mut i = (addr_hash(addr) as usize) & (cap - 1);
        for _ in 0..cap {
            // SAFETY: i < cap.
            unsafe {
                let v = core::ptr::read_volatile(table.add(i));
                if v == 0 || v == index + 1 {
                    core::ptr::write_volatile(table.add(i), index + 1);
                    return;
                }
            }
            i = (i + 1) & (cap - 1);
        }
    }
}

fn addr_hash(addr: u64) -> u64 {
    addr.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32
}
