//! Unwind tables for `ustack` in the shared segment (layout in `weft_abi`:
//! [`UnwindProc`], [`UnwindRow`]).
//!
//! weft publishes a table per member process ([`publish`], [`share`]); the agent's
//! `ustack` helper finds its process's table ([`table`]) and the row covering a pc
//! ([`lookup`]) by binary search: no system calls, no locks, no allocation.

use core::sync::atomic::Ordering;
use weft_abi::{UnwindProc, UnwindRow, MAX_UNWIND_PROCS, UNWIND_UNKNOWN};

use crate::shm::Shm;

/// Bytes the directory takes at the start of the unwind area.
pub const DIR_BYTES: u64 = (MAX_UNWIND_PROCS * core::mem::size_of::<UnwindProc>()) as u64;

fn dir(s: &Shm) -> Option<&[UnwindProc]> {
    let h = s.header();
    if h.unwind_size < DIR_BYTES {
        return None;
    }
    // SAFETY: the directory is MAX_UNWIND_PROCS entries at unwind_off (8-aligned,
    // inside the segment), alive as long as the segment.
    Some(unsafe {
        core::slice::from_raw_parts(s.at(h.unwind_off) as *const UnwindProc, MAX_UNWIND_PROCS)
    })
}

/// The published rows of process `pid`, if weft made a table for it.
#[inline]
pub fn table(s: &Shm, pid: u32) -> Option<&[UnwindRow]> {
    if pid == 0 {
        return None;
    }
    let e = dir(s)?
        .iter()
        .find(|e| e.pid.load(Ordering::Acquire) == pid)?;
    let h = s.header();
    let bytes = u64::from(e.count) * core::mem::size_of::<UnwindRow>() as u64;
    if e.rows_off < h.unwind_off || e.rows_off + bytes > h.unwind_off + h.unwind_size {
        return None;
    }
    // SAFETY: checked inside the unwind area; rows are 8-aligned and immutable once
    // their entry is published (the acquire load above orders the reads after).
    Some(unsafe {
        core::slice::from_raw_parts(s.at(e.rows_off) as *const UnwindRow, e.count as usize)
    })
}

/// The row covering `pc`: the last one at or below it, unless that one says
/// [`UNWIND_UNKNOWN`] (a gap between functions, or a rule weft cannot follow).
#[inline]
pub fn lookup(rows: &[UnwindRow], pc: u64) -> Option<UnwindRow> {
    let i = rows.partition_point(|r| r.addr <= pc).checked_sub(1)?;
    let r = rows[i];
    (r.kind != UNWIND_UNKNOWN).then_some(r)
}

/// Why a table could not be published.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PublishError {
    /// The program takes no stacks: the segment has no unwind area.
    NoArea,
    /// The area is full (its rows are kept: the process walks frame pointers).
    Full,
    /// Every directory entry is taken.
    NoEntry,
}

fn set_entry(s: &Shm, pid: u32, rows_off: u64, count: u32) -> Result<(), PublishError> {
    let dir = dir(s).ok_or(PublishError::NoArea)?;
    // The process's own entry if it has one (a new table replaces it), else a free
    // one. Only weft writes the directory (from one thread).
    let e = dir
        .iter()
        .find(|e| e.pid.load(Ordering::Relaxed) == pid)
        .or_else(|| dir.iter().find(|e| e.pid.load(Ordering::Relaxed) == 0))
        .ok_or(PublishError::NoEntry)?;
    e.pid.store(0, Ordering::Release);
    let p = e as *const UnwindProc as *mut UnwindProc;
    // SAFETY: the entry is unpublished (pid 0) while its plain fields change; only
    // weft writes them, readers look at them only after an acquire load of pid.
    unsafe {
        (*p).count = count;
        (*p).rows_off = rows_off;
    }
    e.pid.store(pid, Ordering::Release);
    Ok(())
}

/// Copy `rows` (sorted by address) into the unwind area and publish them for `pid`
/// (weft side).
pub fn publish(s: &Shm, pid: u32, rows: &[UnwindRow]) -> Result<(), PublishError> {
    let h = s.header();
    if h.unwind_size < DIR_BYTES {
        return Err(PublishError::NoArea);
    }
    let used = h.unwind_used.load(Ordering::Relaxed).max(DIR_BYTES);
    let bytes = core::mem::size_of_val(rows) as u64;
    if used + bytes > h.unwind_size || rows.len() > u32::MAX as usize {
        return Err(PublishError::Full);
    }
    let rows_off = h.unwind_off + used;
    // SAFETY: [rows_off, rows_off + bytes) is inside the unwind area and not yet
    // published to any reader.
    unsafe {
        core::ptr::copy_nonoverlapping(rows.as_ptr(), s.at(rows_off) as *mut UnwindRow, rows.len())
    };
    h.unwind_used.store(used + bytes, Ordering::Relaxed);
    set_entry(s, pid, rows_off, rows.len() as u32)
}

/// Give `child` the table of `parent` (a forked child: same address space).
pub fn share(s: &Shm, parent: u32, child: u32) -> Result<(), PublishError> {
    let dir = dir(s).ok_or(PublishError::NoArea)?;
    let e = dir
        .iter()
        .find(|e| e.pid.load(Ordering::Relaxed) == parent)
        .ok_or(PublishError::NoEntry)?;
    set_entry(s, child, e.rows_off, e.count)
}

#[cfg(test)]
mod tests {
    use super::*;
    use weft_abi::UNWIND_CFA_RSP;

    fn row(addr: u64, kind: u16) -> UnwindRow {
        UnwindRow {
            addr,
            cfa_off: 8,
            kind,
            rbp_off: 0,
        }
    }

    #[test]
    fn lookup_finds_the_covering_row() {
        let rows = [
            row(0x1000, UNWIND_CFA_RSP),
            row(0x1004, UNWIND_CFA_RSP),
            row(0x1010, UNWIND_UNKNOWN),
            row(0x2000, UNWIND_CFA_RSP),
        ];
        assert_eq!(lookup(&rows, 0xfff), None);
        assert_eq!(lookup(&rows, 0x1000).unwrap().addr, 0x1000);
        assert_eq!(lookup(&rows, 0x100f).unwrap().addr, 0x1004);
        assert_eq!(lookup(&rows, 0x1010), None);
        assert_eq!(lookup(&rows, 0x1fff), None);
        assert_eq!(lookup(&rows, 0x9000).unwrap().addr, 0x2000);
    }
}
