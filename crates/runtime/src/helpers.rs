//! The functions compiled advice calls (`weft_abi::Helper`), all `extern "C"`.
//!
//! Rules for everything in this module, because it runs on the target's threads in
//! the middle of arbitrary code, possibly inside a signal handler:
//! no locks, no system calls (clocks come from the vDSO), no allocation, no panics
//! (indices are checked or come from the weft-written layout), and target memory
//! is only touched through [`crate::safe`].

// Every helper is `unsafe`: compiled advice calls it with a valid `Frame` and with
// pointers into that frame's slots, sized as the code generator laid them out. That
// contract is stated here once rather than on each function.
#![allow(clippy::missing_safety_doc)]

use core::sync::atomic::Ordering;
use weft_abi::{
    AgentThread, Frame, Helper, MapKind, ThreadSlot, ERROR_KINDS, HELPER_COUNT, SITE_NAME_LEN,
};

use crate::map;
use crate::ring;
use crate::safe;
use crate::shm::Shm;

/// Error counter indices (match `weft_ir::ErrorKind`).
pub const ERR_READ_FAULT: usize = 0;
pub const ERR_DIV_ZERO: usize = 1;
pub const ERR_MAP_FULL: usize = 2;
pub const ERR_LOOP_BOUND: usize = 3;
pub const ERR_EVENT_LOST: usize = 4;
pub const ERR_WATCH_LATE: usize = 5;

#[inline]
fn frame<'a>(f: *mut Frame) -> &'a Frame {
    // SAFETY: advice is always called with a valid frame built by the trampoline,
    // the int3 handler or weft.
    unsafe { &*f }
}

#[inline]
fn shm(f: &Frame) -> Shm {
    // SAFETY: frame.shm is the live session's segment (the quiescence protocol keeps
    // it mapped while any thread can be in advice).
    unsafe { Shm::from_base(f.shm) }
}

#[inline]
fn slot<'a>(f: &Frame) -> &'a ThreadSlot {
    // SAFETY: frame.thread is this thread's slot in the segment.
    unsafe { &*f.thread }
}

#[inline]
pub fn count_error_in(slot: &ThreadSlot, kind: usize) {
    if kind < ERROR_KINDS {
        let c = &slot.errors[kind];
        c.store(c.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
    }
}

/// Map id → descriptor, or None for an out-of-range id (never from correct code).
#[inline]
fn desc(s: &Shm, id: u64) -> Option<&weft_abi::MapDesc> {
    (id < u64::from(s.map_count())).then(|| s.map(id as u32))
}

#[inline]
fn key_slice<'a>(d: &weft_abi::MapDesc, key: *const u8) -> &'a [u8] {
    if d.key_size == 0 || key.is_null() {
        &[]
    } else {
        // SAFETY: the key points into the advice frame, key_size bytes.
        unsafe { core::slice::from_raw_parts(key, d.key_size as usize) }
    }
}

// ---------------------------------------------------------------------------------
// Memory
// ---------------------------------------------------------------------------------

pub unsafe extern "C" fn weft_h_read_mem(f: *mut Frame, addr: u64, size: u64) -> u64 {
    match safe::load(addr, size as u8) {
        Some(v) => v,
        None => {
            count_error_in(slot(frame(f)), ERR_READ_FAULT);
            0
        }
    }
}

/// `str(addr[, max])` into `dst` of `cap` bytes (NUL-padded).
pub unsafe extern "C" fn weft_h_read_str(
    f: *mut Frame,
    dst: *mut u8,
    addr: u64,
    max: u64,
    cap: u64,
) {
    let cap = cap as usize;
    if cap == 0 {
        return;
    }
    // SAFETY: dst is a frame slot of cap bytes.
    let out = unsafe { core::slice::from_raw_parts_mut(dst, cap) };
    let limit = (cap - 1).min(max.min(usize::MAX as u64) as *const () as usize);
    let (len, faulted) = safe::strcpy(out, addr, limit);
    out[len..].fill(0);
    if faulted {
        count_error_in(slot(frame(f)), ERR_READ_FAULT);
    }
}

/// `buf(addr, len)` into `dst` = `{ u32 len, bytes[cap] }`.
pub unsafe extern "C" fn weft_h_read_buf(
    f: *mut Frame,
    dst: *mut u8,
    addr: u64,
    len: u64,
    cap: u64,
) {
    let want = len.min(cap) as usize;
    // SAFETY: dst is a frame slot of 4 + cap bytes.
    let out = unsafe { core::slice::from_raw_parts_mut(dst.add(4), cap as usize) };
    let got = safe::copy(&mut out[..want], addr);
    out[got..].fill(0);
    // SAFETY: the length prefix is the first 4 bytes of dst.
    unsafe { (dst as *mut u32).write_unaligned(got as u32) };
    if got < want {
        count_error_in(slot(frame(f)), ERR_READ_FAULT);
    }
}

pub unsafe extern "C" fn weft_h_store_target(f: *mut Frame, addr: u64, value: u64, size: u64) {
    if !safe::store(addr, value, size as u8) {
        count_error_in(slot(frame(f)), ERR_READ_FAULT);
    }
}

// ---------------------------------------------------------------------------------
// Context
// ---------------------------------------------------------------------------------

pub unsafe extern "C" fn weft_h_comm(f: *mut Frame, dst: *mut u8, cap: u64) {
    let comm = &slot(frame(f)).comm;
    // SAFETY: dst is a frame slot of cap bytes.
    let out = unsafe { core::slice::from_raw_parts_mut(dst, cap as usize) };
    copy_cstr(out, comm);
}

pub unsafe extern "C" fn weft_h_pcomm(f: *mut Frame, dst: *mut u8, cap: u64) {
    let pcomm = &slot(frame(f)).pcomm;
    // SAFETY: dst is a frame slot of cap bytes.
    let out = unsafe { core::slice::from_raw_parts_mut(dst, cap as usize) };
    copy_cstr(out, pcomm);
}

pub unsafe extern "C" fn weft_h_func_name(f: *mut Frame, dst: *mut u8, cap: u64) {
    let fr = frame(f);
    // SAFETY: dst is a frame slot of cap bytes.
    let out = unsafe { core::slice::from_raw_parts_mut(dst, cap as usize) };
    let s = shm(fr);
    if fr.site < u64::from(s.header().max_sites) {
        let name: [u8; SITE_NAME_LEN] = s.site(fr.site as u32).name;
        copy_cstr(out, &name);
    } else {
        out.fill(0);
    }
}

fn copy_cstr(out: &mut [u8], src: &[u8]) {
    if out.is_empty() {
        return;
    }
    let n = src
        .iter()
        .position(|&b| b == 0)
        .unwrap_or(src.len())
        .min(out.len() - 1);
    out[..n].copy_from_slice(&src[..n]);
    out[n..].fill(0);
}

pub unsafe extern "C" fn weft_h_nsecs(f: *mut Frame) -> u64 {
    crate::clock::now(shm(frame(f)).header())
}

pub unsafe extern "C" fn weft_h_realtime_nsecs() -> u64 {
    crate::clock::realtime_ns()
}

pub unsafe extern "C" fn weft_h_thread_cputime() -> u64 {
    crate::clock::thread_cputime_ns()
}

pub unsafe extern "C" fn weft_h_thread_rusage(which: u64) -> u64 {
    crate::clock::thread_rusage(which)
}

/// After advice stored an address in a map a `set:addr(@map, N)` pointcut
/// watches: wait until weft has armed the watch there (see
/// `weft_abi::Helper::WatchBind`), so the thread's next access is seen. Not the
/// hot path: one wait per binding, a few hundred microseconds while weft arms
/// (spinning briefly, then yielding the CPU, which weft may need).
pub unsafe extern "C" fn weft_h_watch_bind(f: *mut Frame) -> u64 {
    let fr = frame(f);
    let s = shm(fr);
    let h = s.header();
    let me = h.watch_bind_req.fetch_add(1, Ordering::AcqRel) + 1;
    let start = crate::clock::monotonic_ns();
    let mut spins = 0u32;
    while h.watch_bind_done.load(Ordering::Acquire) < me {
        spins = spins.wrapping_add(1);
        if spins < 4096 {
            core::hint::spin_loop();
            continue;
        }
        if crate::clock::monotonic_ns().saturating_sub(start) > weft_abi::WATCH_BIND_WAIT_NS {
            count_error_in(slot(fr), ERR_WATCH_LATE);
            return 0;
        }
        // SAFETY: sched_yield has no memory effects.
        unsafe { libc::sched_yield() };
    }
    1
}

pub unsafe extern "C" fn weft_h_cpu() -> u64 {
    crate::clock::cpu()
}

/// # Safety
/// None: reads the TSC_AUX register only.
pub unsafe extern "C" fn weft_h_numa_node() -> u64 {
    crate::clock::numa_node()
}

fn tstate<'a>(f: &Frame) -> Option<&'a mut AgentThread> {
    // SAFETY: frame.tstate is null or this thread's AgentThread, only used by it.
    unsafe { (f.tstate as *mut AgentThread).as_mut() }
}

pub unsafe extern "C" fn weft_h_rand(f: *mut Frame) -> u64 {
    let fr = frame(f);
    let Some(t) = tstate(fr) else { return 4 };
    if t.rand == 0 {
        t.rand = crate::clock::monotonic_ns() | 1;
    }
    // xorshift64*
    let mut x = t.rand;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    t.rand = x;
    (x.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 32) & 0xffff_ffff
}

pub unsafe extern "C" fn weft_h_tid(f: *mut Frame) -> u64 {
    tstate(frame(f)).map_or(0, |t| u64::from(t.tid))
}

pub unsafe extern "C" fn weft_h_pid(f: *mut Frame) -> u64 {
    tstate(frame(f)).map_or(0, |t| u64::from(t.pid))
}

/// Walk the stack into `dst` = `{ n: u64, ips: [u64; depth] }`, the probe point
/// first. Each frame's caller comes from the process's unwind table (built by weft
/// from `.eh_frame`, [`crate::unwind`]) where it covers the pc, else from the frame
/// pointer chain (at a function entry, where `rbp` is still the caller's, the
/// return address at `[rsp]`). Memory is read fault-tolerantly; no system calls,
/// no locks, no allocation.
pub unsafe extern "C" fn weft_h_ustack(f: *mut Frame, dst: *mut u8, depth: u64) {
    let fr = frame(f);
    let depth = depth as usize;
    // SAFETY: dst is a frame slot of 8 + 8 * depth bytes.
    let out = unsafe { core::slice::from_raw_parts_mut(dst as *mut u64, 1 + depth) };
    let s = shm(fr);
    let rows = tstate(fr).and_then(|t| crate::unwind::table(&s, t.pid));
    // An entry (or offset) probe reports its site's address (or its function's,
    // when the patch is after an `endbr64`); a return probe, the return address.
    let at_site = fr.site < u64::from(s.header().max_sites) && {
        let site = s.site(fr.site as u32);
        (site.func.min(site.addr)..=site.addr).contains(&fr.regs.rip)
    };
    let n = walk_stack(fr, at_site, rows, &mut out[1..]);
    out[0] = n as u64;
    for v in &mut out[1 + n..] {
        *v = 0;
    }
}

/// The walk behind [`weft_h_ustack`]: fills `out` from the start, returns how many.
/// `at_site`: the frame is an entry or offset probe's (its rip is the site's).
pub fn walk_stack(
    fr: &Frame,
    at_site: bool,
    rows: Option<&[weft_abi::UnwindRow]>,
    out: &mut [u64],
) -> usize {
    let load = |a: u64| safe::load(a, 8);
    let mut pc = fr.regs.rip;
    let mut sp = fr.regs.rsp;
    let mut bp = fr.regs.rbp;
    // `pc` is where the thread stands (an entry probe, a sample); a return address
    // is looked up one byte back, inside its call.
    let mut exact = true;
    if at_site {
        // Where the thread stands; the trampoline's own pushes are below rsp.
    } else if load(sp) == Some(pc) {
        // A return probe woven on the `ret`: rsp still holds the return address.
        sp += 8;
        exact = false;
    } else if sp >= 8 && load(sp - 8) == Some(pc) {
        // A hijacked return: the return trampoline reports rsp after the return.
        exact = false;
    }
    let mut n = 0usize;
    while n < out.len() && pc != 0 {
        out[n] = pc;
        n += 1;
        if n == out.len() {
            break;
        }
        let at = if exact { pc } else { pc - 1 };
        let step = match rows.and_then(|r| crate::unwind::lookup(r, at)) {
            Some(r) => {
                let base = if r.kind == weft_abi::UNWIND_CFA_RBP {
                    bp
                } else {
                    sp
                };
                let cfa = base.wrapping_add(r.cfa_off as i64 as u64);
                let ra = load(cfa.wrapping_sub(8));
                let nbp = if r.rbp_off == 0 {
                    Some(bp)
                } else {
                    load(cfa.wrapping_add(r.rbp_off as i64 as u64))
                };
                ra.zip(nbp).map(|(ra, nbp)| (ra, cfa, nbp))
            }
            // At a function entry `rbp` is still the caller's: the return address is
            // at [rsp].
            None if n == 1 && exact && pc.wrapping_sub(fr.func) <= 4 => {
                load(sp).map(|ra| (ra, sp + 8, bp))
            }
            None if bp >= sp && bp & 7 == 0 => match (load(bp), load(bp + 8)) {
                (Some(next), Some(ra)) => Some((ra, bp + 16, next)),
                _ => None,
            },
            None => None,
        };
        let Some((ra, nsp, nbp)) = step else { break };
        // The stack grows down: a caller's frame is above. Anything else is garbage
        // (or a loop).
        if nsp <= sp {
            break;
        }
        pc = ra;
        sp = nsp;
        bp = nbp;
        exact = false;
    }
    n
}

// ---------------------------------------------------------------------------------
// Maps
// ---------------------------------------------------------------------------------

pub unsafe extern "C" fn weft_h_map_find(f: *mut Frame, id: u64, key: *const u8) -> i64 {
    let s = shm(frame(f));
    let Some(d) = desc(&s, id) else { return -1 };
    map::find(&s, d, key_slice(d, key)).map_or(-1, i64::from)
}

pub unsafe extern "C" fn weft_h_map_insert(f: *mut Frame, id: u64, key: *const u8) -> i64 {
    let fr = frame(f);
    let s = shm(fr);
    let Some(d) = desc(&s, id) else { return -1 };
    match map::insert(&s, d, key_slice(d, key)).index() {
        Some(i) => i64::from(i),
        None => {
            count_error_in(slot(fr), ERR_MAP_FULL);
            -1
        }
    }
}

/// Read a value: plain maps copy `value_size` bytes to `dst` (if not null) and return
/// the first 8 bytes zero-extended; aggregations return the merged scalar.
/// The aggregation area of the calling thread's slot when `key` is that thread's
/// own entry of a thread-keyed map (`MAP_FLAG_THREAD_KEYED`).
fn own_entry(fr: &Frame, d: &weft_abi::MapDesc, key: *const u8) -> Option<*mut ThreadSlot> {
    if !map::thread_keyed(d) || fr.thread.is_null() {
        return None;
    }
    let k = u64::from_le_bytes(key_slice(d, key).try_into().ok()?);
    (k == u64::from(slot(fr).tid)).then_some(fr.thread)
}

pub unsafe extern "C" fn weft_h_map_load(
    f: *mut Frame,
    id: u64,
    key: *const u8,
    dst: *mut u8,
) -> u64 {
    let s = shm(frame(f));
    let Some(d) = desc(&s, id) else { return 0 };
    if let Some(area) = own_entry(frame(f), d, key) {
        let (_, v) = map::thread_entry(&s, d, area);
        if !dst.is_null() {
            // SAFETY: dst is a frame slot of the value's 8 bytes.
            unsafe { (dst as *mut u64).write_unaligned(v) };
        }
        return v;
    }
    let found = map::find(&s, d, key_slice(d, key));
    load_value(&s, d, found, dst)
}

fn load_value(s: &Shm, d: &weft_abi::MapDesc, found: Option<u32>, dst: *mut u8) -> u64 {
    let size = d.value_size as usize;
    match found {
        None => {
            if !dst.is_null() && d.kind == MapKind::Plain as u32 {
                // SAFETY: dst is a frame slot of value_size bytes.
                unsafe { core::ptr::write_bytes(dst, 0, size) };
            }
            0
        }
        Some(i) if d.kind == MapKind::Plain as u32 => {
            let v = map::plain_value_ptr(s, d, i);
            let mut w = [0u8; 8];
            // SAFETY: the entry's value has value_size bytes; dst (if any) too.
            unsafe {
                core::ptr::copy_nonoverlapping(v, w.as_mut_ptr(), size.min(8));
                if !dst.is_null() {
                    core::ptr::copy_nonoverlapping(v, dst, size);
                }
            }
            u64::from_le_bytes(w)
        }
        Some(i) => {
            let v = map::merged_scalar(s, d, i);
            if !dst.is_null() {
                // SAFETY: for aggregations the caller passes an 8-byte destination.
                unsafe { (dst as *mut u64).write_unaligned(v) };
            }
            v
        }
    }
}

/// Store a plain value: `value_size` bytes from `src`, or (src null) the low bytes of
/// `value`.
pub unsafe extern "C" fn weft_h_map_store(
    f: *mut Frame,
    id: u64,
    key: *const u8,
    src: *const u8,
    value: u64,
) {
    let fr = frame(f);
    let s = shm(fr);
    let Some(d) = desc(&s, id) else { return };
    if let Some(area) = own_entry(fr, d, key) {
        let v = if src.is_null() {
            value
        } else {
            // SAFETY: src holds the value's 8 bytes.
            unsafe { (src as *const u64).read_unaligned() }
        };
        map::set_thread_entry(&s, d, area, Some(v));
        return;
    }
    let Some(i) = map::insert(&s, d, key_slice(d, key)).index() else {
        count_error_in(slot(fr), ERR_MAP_FULL);
        return;
    };
    let v = map::plain_value_ptr(&s, d, i);
    let size = d.value_size as usize;
    // SAFETY: the entry's value has value_size bytes; src (if any) too.
    unsafe {
        if src.is_null() {
            let b = value.to_le_bytes();
            core::ptr::copy_nonoverlapping(b.as_ptr(), v, size.min(8));
        } else {
            core::ptr::copy_nonoverlapping(src, v, size);
        }
    }
}

pub unsafe extern "C" fn weft_h_map_agg(
    f: *mut Frame,
    id: u64,
    key: *const u8,
    op: u64,
    value: u64,
) {
    let fr = frame(f);
    let s = shm(fr);
    let Some(d) = desc(&s, id) else { return };
    let Some(i) = map::insert(&s, d, key_slice(d, key)).index() else {
        count_error_in(slot(fr), ERR_MAP_FULL);
        return;
    };
    let acc = map::accumulator(&s, d, fr.thread, i);
    map::aggregate(d, acc, op as u32, value);
}

/// The entry of `key` in map `id` of the segment at `shm`, inserted if new: its
/// index, or -1 when the map is full (counted in `slot`, this thread's). Called by
/// inline advice, which has no frame, when the slots it probed did not hold the key.
pub unsafe extern "C" fn weft_h_map_index(
    shm_base: *mut u8,
    id: u64,
    key: *const u8,
    slot: *const ThreadSlot,
) -> i64 {
    // SAFETY: inline advice passes the live session's segment.
    let s = unsafe { Shm::from_base(shm_base) };
    let Some(d) = desc(&s, id) else { return -1 };
    match map::insert(&s, d, key_slice(d, key)).index() {
        Some(i) => i64::from(i),
        None => {
            // SAFETY: the calling thread's slot.
            count_error_in(unsafe { &*slot }, ERR_MAP_FULL);
            -1
        }
    }
}

/// A plain map's key that inline advice did not settle in the slots it looked at
/// (a long probe chain, an entry being inserted): `op` is `MAP_KEY_FIND` (the live
/// entry's index, or -1) or `MAP_KEY_DELETE` (1 when an entry was deleted, else 0).
/// Frameless, like [`weft_h_map_index`].
pub unsafe extern "C" fn weft_h_map_key(
    shm_base: *mut u8,
    id: u64,
    key: *const u8,
    op: u64,
) -> i64 {
    // SAFETY: inline advice passes the live session's segment.
    let s = unsafe { Shm::from_base(shm_base) };
    let Some(d) = desc(&s, id) else { return -1 };
    let key = key_slice(d, key);
    match op {
        weft_abi::MAP_KEY_DELETE => i64::from(map::delete(&s, d, key)),
        _ => map::find(&s, d, key).map_or(-1, i64::from),
    }
}

pub unsafe extern "C" fn weft_h_map_delete(f: *mut Frame, id: u64, key: *const u8) -> u64 {
    let s = shm(frame(f));
    let Some(d) = desc(&s, id) else { return 0 };
    if let Some(area) = own_entry(frame(f), d, key) {
        let (present, _) = map::thread_entry(&s, d, area);
        map::set_thread_entry(&s, d, area, None);
        return u64::from(present);
    }
    u64::from(map::delete(&s, d, key_slice(d, key)))
}

pub unsafe extern "C" fn weft_h_map_len(f: *mut Frame, id: u64) -> u64 {
    let s = shm(frame(f));
    desc(&s, id).map_or(0, |d| u64::from(d.count.load(Ordering::Relaxed)))
}

/// Advance `*cursor` to the next live entry; copy its key to `key_dst` and its value
/// (as `weft_h_map_load` would) to `val_dst`. Returns 1 when an entry was found.
pub unsafe extern "C" fn weft_h_map_iter_next(
    f: *mut Frame,
    id: u64,
    cursor: *mut u64,
    key_dst: *mut u8,
    val_dst: *mut u8,
) -> u64 {
    let s = shm(frame(f));
    let Some(d) = desc(&s, id) else { return 0 };
    // SAFETY: cursor points to a register spill slot in the advice frame.
    let cur = unsafe { &mut *cursor };
    while *cur < u64::from(d.capacity) {
        let i = *cur as u32;
        *cur += 1;
        if map::entry_state(&s, d, i) != weft_abi::ENTRY_LIVE {
            continue;
        }
        if !key_dst.is_null() && d.key_size > 0 {
            let k = map::key_bytes(&s, d, i);
            // SAFETY: key_dst is a frame slot of key_size bytes.
            unsafe { core::ptr::copy_nonoverlapping(k.as_ptr(), key_dst, k.len()) };
        }
        load_value(&s, d, Some(i), val_dst);
        return 1;
    }
    0
}

// ---------------------------------------------------------------------------------
// Events and strings
// ---------------------------------------------------------------------------------

/// Send an event: `args` packs `arg0 | arg1 << 32`.
pub unsafe extern "C" fn weft_h_emit(
    f: *mut Frame,
    kind: u64,
    id: u64,
    args: u64,
    payload: *const u8,
    len: u64,
) -> u64 {
    let fr = frame(f);
    let s = shm(fr);
    let h = s.header();
    let data = if payload.is_null() || len == 0 {
        &[][..]
    } else {
        // SAFETY: payload is a frame slot of len bytes.
        unsafe { core::slice::from_raw_parts(payload, len as usize) }
    };
    if kind == u64::from(weft_abi::EVENT_EXIT) {
        h.exit_requested.store(1, Ordering::Release);
    }
    // SAFETY: fr.thread is this thread's slot; its ring is ring_size bytes.
    let ok = unsafe {
        ring::produce(
            fr.thread,
            s.ring(fr.thread),
            h.ring_size,
            kind as u32,
            id as u32,
            (args as u32, (args >> 32) as u32),
            crate::clock::now(h),
            data,
            h.ring_wait_spins,
        )
    };
    u64::from(ok)
}

pub unsafe extern "C" fn weft_h_int_to_str(dst: *mut u8, value: u64, signed: u64, cap: u64) {
    let mut buf = [0u8; 24];
    let mut n = 0;
    let neg = signed != 0 && (value as i64) < 0;
    let mut v = if neg {
        (value as i64).unsigned_abs()
    } else {
        value
    };
    loop {
        buf[n] = b'0' + (v % 10) as u8;
        n += 1;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    if neg {
        buf[n] = b'-';
        n += 1;
    }
    buf[..n].reverse();
    // SAFETY: dst is a frame slot of cap bytes.
    let out = unsafe { core::slice::from_raw_parts_mut(dst, cap as usize) };
    copy_cstr(out, &buf[..n]);
}

fn cstr<'a>(p: *const u8, len: u64) -> &'a [u8] {
    // SAFETY: p is a frame slot of at least len bytes.
    let s = unsafe { core::slice::from_raw_parts(p, len as usize) };
    let n = s.iter().position(|&b| b == 0).unwrap_or(s.len());
    &s[..n]
}

/// Compare two NUL-terminated strings of at most `len` bytes: <0, 0, >0.
pub unsafe extern "C" fn weft_h_str_cmp(a: *const u8, b: *const u8, len: u64) -> i64 {
    match cstr(a, len).cmp(cstr(b, len)) {
        core::cmp::Ordering::Less => -1,
        core::cmp::Ordering::Equal => 0,
        core::cmp::Ordering::Greater => 1,
    }
}

pub unsafe extern "C" fn weft_h_str_contains(a: *const u8, b: *const u8, len: u64) -> u64 {
    let (h, n) = (cstr(a, len), cstr(b, len));
    u64::from(n.is_empty() || h.windows(n.len()).any(|w| w == n))
}

pub unsafe extern "C" fn weft_h_signal(f: *mut Frame, sig: u64) {
    let fr = frame(f);
    if let Some(t) = tstate(fr) {
        // A system call, allowed only because `signal()` needs --unsafe.
        // SAFETY: tgkill on our own thread.
        unsafe { libc::syscall(libc::SYS_tgkill, t.pid as i64, t.tid as i64, sig as i64) };
    }
}

pub unsafe extern "C" fn weft_h_count_error(f: *mut Frame, kind: u64) {
    count_error_in(slot(frame(f)), kind as *const () as usize);
}

/// The helper table, in `weft_abi::Helper` order, as addresses in this process.
pub fn helper_table() -> [u64; HELPER_COUNT] {
    let mut t = [0u64; HELPER_COUNT];
    let set = |t: &mut [u64; HELPER_COUNT], h: Helper, f: usize| t[h as usize] = f as u64;
    set(
        &mut t,
        Helper::ReadMem,
        weft_h_read_mem as *const () as usize,
    );
    set(
        &mut t,
        Helper::ReadStr,
        weft_h_read_str as *const () as usize,
    );
    set(
        &mut t,
        Helper::ReadBuf,
        weft_h_read_buf as *const () as usize,
    );
    set(&mut t, Helper::Comm, weft_h_comm as *const () as usize);
    set(&mut t, Helper::PComm, weft_h_pcomm as *const () as usize);
    set(
        &mut t,
        Helper::FuncName,
        weft_h_func_name as *const () as usize,
    );
    set(&mut t, Helper::Nsecs, weft_h_nsecs as *const () as usize);
    set(
        &mut t,
        Helper::RealtimeNsecs,
        weft_h_realtime_nsecs as *const () as usize,
    );
    set(&mut t, Helper::Cpu, weft_h_cpu as *const () as usize);
    set(
        &mut t,
        Helper::NumaNode,
        weft_h_numa_node as *const () as usize,
    );
    set(
        &mut t,
        Helper::ThreadCpuTime,
        weft_h_thread_cputime as *const () as usize,
    );
    set(
        &mut t,
        Helper::ThreadRusage,
        weft_h_thread_rusage as *const () as usize,
    );
    set(
        &mut t,
        Helper::WatchBind,
        weft_h_watch_bind as *const () as usize,
    );
    set(&mut t, Helper::Rand, weft_h_rand as *const () as usize);
    set(&mut t, Helper::UStack, weft_h_ustack as *const () as usize);
    set(
        &mut t,
        Helper::MapFind,
        weft_h_map_find as *const () as usize,
    );
    set(
        &mut t,
        Helper::MapInsert,
        weft_h_map_insert as *const () as usize,
    );
    set(
        &mut t,
        Helper::MapLoad,
        weft_h_map_load as *const () as usize,
    );
    set(
        &mut t,
        Helper::MapStore,
        weft_h_map_store as *const () as usize,
    );
    set(&mut t, Helper::MapAgg, weft_h_map_agg as *const () as usize);
    set(
        &mut t,
        Helper::MapIndex,
        weft_h_map_index as *const () as usize,
    );
    set(&mut t, Helper::MapKey, weft_h_map_key as *const () as usize);
    set(&mut t, Helper::SafeStrcpy, crate::safe::strcpy_routine());
    set(
        &mut t,
        Helper::MapDelete,
        weft_h_map_delete as *const () as usize,
    );
    set(&mut t, Helper::MapLen, weft_h_map_len as *const () as usize);
    set(
        &mut t,
        Helper::MapIterNext,
        weft_h_map_iter_next as *const () as usize,
    );
    set(&mut t, Helper::Emit, weft_h_emit as *const () as usize);
    set(
        &mut t,
        Helper::IntToStr,
        weft_h_int_to_str as *const () as usize,
    );
    set(&mut t, Helper::StrCmp, weft_h_str_cmp as *const () as usize);
    set(
        &mut t,
        Helper::StrContains,
        weft_h_str_contains as *const () as usize,
    );
    set(&mut t, Helper::Signal, weft_h_signal as *const () as usize);
    set(
        &mut t,
        Helper::StoreTarget,
        weft_h_store_target as *const () as usize,
    );
    set(
        &mut t,
        Helper::CountError,
        weft_h_count_error as *const () as usize,
    );
    set(&mut t, Helper::Tid, weft_h_tid as *const () as usize);
    set(&mut t, Helper::Pid, weft_h_pid as *const () as usize);
    t
}
