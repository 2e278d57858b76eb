//! Unwind tables for `ustack`: for each member process of a program that takes
//! user stacks, the call-frame information (`.eh_frame`) of every module it maps,
//! made into one compact table at run-time addresses (`weft_symbols::CfiRow` →
//! `weft_abi::UnwindRow`) and published in the segment for the agent's `ustack`
//! helper (`weft_runtime::unwind`). Where no row covers a pc the helper walks
//! frame pointers, as it does for every frame with `WEFT_USTACK_FP=1`.
//!
//! Modules loaded after the table was made (`dlopen`) are not covered: their frames
//! are walked with frame pointers.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};

use weft_abi::{UnwindRow, UNWIND_CFA_RBP, UNWIND_CFA_RSP, UNWIND_UNKNOWN};
use weft_ir::{Inst, Program};
use weft_symbols::{CfaBase, CfiRow, FrameTable, Module};

use crate::segment::Segment;

/// Address space reserved in the segment for the tables of a program that takes
/// stacks (sparse: only what tables fill is allocated). 2 Mi rows.
pub const AREA_BYTES: u64 = 32 << 20;

/// Whether any probe of `prog` takes a user stack.
pub fn uses_ustack(prog: &Program) -> bool {
    prog.probes
        .iter()
        .any(|p| p.body.code.iter().any(|i| matches!(i, Inst::UStack { .. })))
}

/// `WEFT_USTACK_FP=1`: publish no table, so `ustack` walks frame pointers only
/// (comparisons, benchmarks, tests).
fn frame_pointers_only() -> bool {
    std::env::var_os("WEFT_USTACK_FP").is_some_and(|v| v == "1")
}

type Key = (PathBuf, Option<(u64, u64)>);
type Cache = Mutex<HashMap<Key, Option<Arc<Vec<CfiRow>>>>>;

/// Each file's rows (file vaddrs), parsed once per weft process.
fn cache() -> &'static Cache {
    static CACHE: OnceLock<Cache> = OnceLock::new();
    CACHE.get_or_init(Default::default)
}

fn module_rows(m: &Module) -> Option<Arc<Vec<CfiRow>>> {
    let key = (m.open_path.clone(), m.identity);
    if let Some(r) = cache().lock().ok()?.get(&key) {
        return r.clone();
    }
    let rows = m
        .open()
        .ok()
        .and_then(|elf| FrameTable::of(&elf))
        .map(|t| Arc::new(t.compact_rows()))
        .filter(|r| !r.is_empty());
    cache().lock().ok()?.insert(key, rows.clone());
    rows
}

/// The table of a process mapping `modules`, sorted by run-time address.
pub fn table(modules: &[Module]) -> Vec<UnwindRow> {
    let mut rows = Vec::new();
    for m in modules {
        let Some(file_rows) = module_rows(m) else {
            continue;
        };
        rows.extend(file_rows.iter().map(|r| UnwindRow {
            addr: m.runtime_addr(r.addr),
            cfa_off: r.cfa_off,
            kind: match r.base {
                CfaBase::Rsp => UNWIND_CFA_RSP,
                CfaBase::Rbp => UNWIND_CFA_RBP,
                CfaBase::Unknown => UNWIND_UNKNOWN,
            },
            rbp_off: r.rbp_off.unwrap_or(0),
        }));
    }
    // Stable: where one module's end marker meets the next module's first row, the
    // row wins.
    rows.sort_by_key(|r| (r.addr, r.kind != UNWIND_UNKNOWN));
    rows.dedup_by(|later, earlier| {
        if later.addr == earlier.addr {
            *earlier = *later;
            true
        } else {
            false
        }
    });
    rows
}

/// Build and publish the table of process `pid` (mapping `modules`) when `prog`
/// takes stacks; `note` gets a `-v` line.
pub fn publish(
    prog: &Program,
    seg: &Segment,
    pid: u32,
    modules: &[Module],
    note: &mut dyn FnMut(String),
) {
    if !uses_ustack(prog) {
        return;
    }
    if frame_pointers_only() {
        note(format!(
            "ustack: WEFT_USTACK_FP=1, process {pid} walks frame pointers only"
        ));
        return;
    }
    let t = std::time::Instant::now();
    let rows = table(modules);
    match weft_runtime::unwind::publish(&seg.shm, pid, &rows) {
        Ok(()) => note(format!(
            "ustack: unwind table of process {pid}: {} rows in {:.1?}",
            rows.len(),
            t.elapsed()
        )),
        Err(e) => note(format!(
            "ustack: no unwind table for process {pid} ({e:?}): frame pointers only"
        )),
    }
}

/// A followed fork child (same address space) uses its parent's table.
pub fn share(prog: &Program, seg: &Segment, parent: u32, child: u32) {
    if uses_ustack(prog) {
        let _ = weft_runtime::unwind::share(&seg.shm, parent, child);
    }
}
