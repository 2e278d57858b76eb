//! Computing the shared segment's layout (weft side) and writing its header.
//!
//! The segment is sparse: it is sized for its thread slots and full key tables, but
//! the memfd only allocates the pages threads actually touch.
//!
//! Thread slots: the retired slot, weft's own, then two per live thread allowed
//! (`max_live`): slots of threads that exited wait for weft to drain them (a few
//! milliseconds) before they are reused, and a burst of short-lived threads must not
//! run out meanwhile.

use core::sync::atomic::Ordering;
use weft_abi::{
    entry_layout, MapDesc, MapKind, ShmHeader, SiteDesc, FIRST_THREAD_SLOT, MAP_FLAG_THREAD_KEYED,
    RETIRED_SLOT, SHM_MAGIC, THREAD_HEADER_SIZE, THREAD_RETIRED, VERSION,
};

use crate::shm::Shm;

const PAGE: u64 = 4096;

fn page_up(n: u64) -> u64 {
    n.div_ceil(PAGE) * PAGE
}

/// What weft knows about a map when laying out the segment.
#[derive(Clone, Copy, Debug)]
pub struct MapSpec {
    pub kind: MapKind,
    pub signed: bool,
    pub key_size: u32,
    /// Plain maps: value bytes in the entry. Aggregations: accumulator bytes.
    pub value_size: u32,
    pub max_entries: u32,
    pub hist_k: u32,
    pub lhist: (i64, i64, i64),
    /// `tseries`: (interval in ns, intervals, `TSERIES_*` aggregation).
    pub tseries: (u64, u32, u32),
    /// `MAP_FLAG_*`.
    pub flags: u32,
}

impl MapSpec {
    pub fn plain(key_size: u32, value_size: u32, max_entries: u32) -> MapSpec {
        MapSpec {
            kind: MapKind::Plain,
            signed: false,
            key_size,
            value_size,
            max_entries,
            hist_k: 0,
            lhist: (0, 0, 1),
            tseries: (1, 1, 0),
            flags: 0,
        }
    }

    pub fn agg(
        kind: MapKind,
        signed: bool,
        key_size: u32,
        value_size: u32,
        max_entries: u32,
    ) -> MapSpec {
        MapSpec {
            kind,
            signed,
            key_size,
            value_size,
            max_entries,
            hist_k: 0,
            lhist: (0, 0, 1),
            tseries: (1, 1, 0),
            flags: 0,
        }
    }

    /// Key-table entries: one for a scalar map, else a power of two at least twice
    /// the maximum number of entries (keeps probe chains short).
    pub fn capacity(&self) -> u32 {
        if self.key_size == 0 {
            1
        } else {
            // In u64: twice a count above 2^31 does not fit in u32 (the front end
            // allows at most 2^20 keys; this keeps any count from wrapping to 0).
            let want = (u64::from(self.max_entries.max(1)) * 2).next_power_of_two();
            want.min(1 << 31) as u32
        }
    }
}

/// A thread-keyed map's accumulator in each thread's slot: `[present, value]`.
pub const THREAD_KEYED_BYTES: u64 = 16;

pub struct LayoutBuilder {
    max_live: u32,
    ring_size: u64,
    max_sites: u32,
    unwind_size: u64,
    maps: Vec<MapSpec>,
}

/// The computed layout; [`Layout::write_header`] initialises a zeroed segment.
#[derive(Clone, Debug)]
pub struct Layout {
    pub total_size: u64,
    pub maps_off: u64,
    pub maps: Vec<(
        MapSpec,
        u64, /*table_off*/
        u64, /*agg_off*/
        u32, /*entry_size*/
    )>,
    pub sites_off: u64,
    pub max_sites: u32,
    pub site_hash_off: u64,
    pub site_hash_cap: u32,
    pub threads_off: u64,
    pub thread_slot_size: u64,
    pub slot_count: u32,
    pub max_live: u32,
    /// The free-slot queue: `slot_count` u32s.
    pub free_off: u64,
    pub ring_off: u64,
    pub ring_size: u64,
    pub agg_off: u64,
    /// The unwind tables' area (`ustack`), 0 bytes when no stack is taken.
    pub unwind_off: u64,
    pub unwind_size: u64,
}

impl LayoutBuilder {
    /// Room for `max_live` target threads alive at once; `ring_size` must be a power
    /// of two.
    pub fn new(max_live: u32, ring_size: u64) -> LayoutBuilder {
        assert!(ring_size.is_power_of_two());
        LayoutBuilder {
            max_live: max_live.max(1),
            ring_size,
            max_sites: 1 << 16,
            unwind_size: 0,
            maps: Vec::new(),
        }
    }

    pub fn max_sites(mut self, n: u32) -> Self {
        self.max_sites = n;
        self
    }

    /// Room for unwind tables (`ustack`): `bytes` of address space (the segment is
    /// sparse: only the pages tables fill are allocated).
    pub fn unwind(mut self, bytes: u64) -> Self {
        self.unwind_size = bytes;
        self
    }

    pub fn add_map(&mut self, spec: MapSpec) -> u32 {
        self.maps.push(spec);
        self.maps.len() as u32 - 1
    }

    pub fn finish(self) -> Layout {
        let mut off = page_up(core::mem::size_of::<ShmHeader>() as u64);
        let maps_off = off;
        off += (self.maps.len() * core::mem::size_of::<MapDesc>()) as u64;
        off = page_up(off);
        let mut maps = Vec::new();
        let mut agg_total = 0u64;
        for spec in &self.maps {
            let plain_value = if spec.kind == MapKind::Plain {
                spec.value_size
            } else {
                0
            };
            let (_, _, entry_size) = entry_layout(spec.key_size, plain_value);
            let table_off = off;
            off = page_up(off + u64::from(entry_size) * u64::from(spec.capacity()));
            let agg_off = agg_total;
            if spec.kind != MapKind::Plain {
                agg_total += u64::from(spec.value_size) * u64::from(spec.capacity());
                agg_total = agg_total.div_ceil(64) * 64;
            } else if spec.flags & MAP_FLAG_THREAD_KEYED != 0 {
                agg_total += THREAD_KEYED_BYTES;
                agg_total = agg_total.div_ceil(64) * 64;
            }
            maps.push((*spec, table_off, agg_off, entry_size));
        }
        let sites_off = off;
        off = page_up(off + u64::from(self.max_sites) * core::mem::size_of::<SiteDesc>() as u64);
        let site_hash_cap = (self.max_sites * 2).next_power_of_two();
        let site_hash_off = off;
        off = page_up(off + u64::from(site_hash_cap) * 4);
        // Twice the live limit (a gone thread's slot waits for weft to drain it),
        // and one for the kernel's events (`slots::claim_uncounted`).
        let slot_count = FIRST_THREAD_SLOT + 2 * self.max_live + 1;
        let free_off = off;
        off = page_up(off + u64::from(slot_count) * 4);
        let ring_off = THREAD_HEADER_SIZE;
        let agg_off = page_up(ring_off + self.ring_size);
        let thread_slot_size = page_up(agg_off + agg_total);
        let threads_off = off;
        off += thread_slot_size * u64::from(slot_count);
        let unwind_off = off;
        off = page_up(off + self.unwind_size);
        Layout {
            total_size: off,
            maps_off,
            maps,
            sites_off,
            max_sites: self.max_sites,
            site_hash_off,
            site_hash_cap,
            threads_off,
            thread_slot_size,
            slot_count,
            max_live: self.max_live,
            free_off,
            ring_off,
            ring_size: self.ring_size,
            agg_off,
            unwind_off,
            unwind_size: self.unwind_size,
        }
    }
}

impl Layout {
    /// Initialise the header and map descriptors of a zeroed segment.
    pub fn write_header(&self, shm: &Shm, target_pid: u32) {
        let h = shm.base() as *mut ShmHeader;
        // SAFETY: the segment is at least total_size bytes, zeroed, and not yet shared
        // with a running agent; we write the plain fields before publishing it.
        unsafe {
            (*h).magic = SHM_MAGIC;
            (*h).version = VERSION;
            (*h).target_pid = target_pid;
            (*h).total_size = self.total_size;
            (*h).threads_off = self.threads_off;
            (*h).thread_slot_size = self.thread_slot_size;
            (*h).slot_count = self.slot_count;
            (*h).max_live = self.max_live;
            (*h).free_off = self.free_off;
            (*h).slots_used.store(FIRST_THREAD_SLOT, Ordering::Relaxed);
            (*h).ring_off = self.ring_off;
            (*h).ring_size = self.ring_size;
            (*h).agg_off = self.agg_off;
            (*h).maps_off = self.maps_off;
            (*h).map_count = self.maps.len() as u32;
            (*h).max_sites = self.max_sites;
            (*h).sites_off = self.sites_off;
            (*h).site_hash_cap = self.site_hash_cap;
            (*h).site_hash_off = self.site_hash_off;
            (*h).unwind_off = self.unwind_off;
            (*h).unwind_size = self.unwind_size;
            for (i, (spec, table_off, agg_off, entry_size)) in self.maps.iter().enumerate() {
                let d = (shm.at(self.maps_off) as *mut MapDesc).add(i);
                (*d).kind = spec.kind as u32;
                (*d).signed = u32::from(spec.signed);
                (*d).key_size = spec.key_size;
                (*d).value_size = spec.value_size;
                (*d).entry_size = *entry_size;
                (*d).capacity = spec.capacity();
                (*d).max_entries = if spec.key_size == 0 {
                    1
                } else {
                    spec.max_entries
                };
                (*d).hist_k = spec.hist_k;
                (*d).lhist_min = spec.lhist.0;
                (*d).lhist_max = spec.lhist.1;
                (*d).lhist_step = spec.lhist.2;
                (*d).tseries_interval_ns = spec.tseries.0;
                (*d).tseries_intervals = spec.tseries.1;
                (*d).tseries_agg = spec.tseries.2;
                (*d).flags = spec.flags;
                (*d).table_off = *table_off;
                (*d).agg_off = *agg_off;
            }
            (*shm.thread_slot(RETIRED_SLOT))
                .state
                .store(THREAD_RETIRED, Ordering::Relaxed);
            (*h).session_state.store(0, Ordering::Release);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `max_map_keys` near u32::MAX overflowed `2 * max_entries` (issue 24): a panic in
    /// debug builds, a capacity of 0 (a map that is always full) in release ones.
    #[test]
    fn capacity_does_not_overflow() {
        let cap = |n| MapSpec::plain(8, 8, n).capacity();
        assert_eq!(cap(1), 2);
        assert_eq!(cap(4096), 8192);
        assert_eq!(cap(1 << 30), 1 << 31);
        assert_eq!(cap((1 << 30) + 1), 1 << 31);
        assert_eq!(cap(u32::MAX), 1 << 31);
    }
}
