//! Data pointcuts by hardware watchpoints (`set:`, `get:`, `watchpoint:`).
//!
//! Each watch is a perf breakpoint event (`PERF_TYPE_BREAKPOINT`, `HW_BREAKPOINT_W`
//! or `_RW`, 1/2/4/8 bytes) opened by the control thread on every thread of the
//! process but itself (`pid = tid`), with `sigtrap`: the kernel then sends the
//! accessing thread a synchronous SIGTRAP (`si_code == TRAP_PERF`, `si_perf_data`
//! = the event's `sig_data`) right after the access, before its next instruction.
//! The SIGTRAP handler ([`on_trap`], called first by `trap::on_trap`) runs the
//! advice with a frame from the signal context and the old and new values after it.
//!
//! Threads made later are covered by `inherit` + `inherit_thread` (a `fork` child is
//! not: it is unwoven); `remove_on_exec` drops the events at `exec`, and closing them
//! (a watch moved, the session's end, weft gone) drops them everywhere, the
//! inherited copies included. A thread created while the events are being opened
//! may be listed after it inherited its creator's event and get a second one (its
//! hits then count twice): arm watches before the threads they are to see start.
//!
//! `sig_data` carries [`WATCH_SIG_MAGIC`], the session's generation and the watch
//! index, so a trap of a watch closed meanwhile (or of an older session) is known
//! as weft's and swallowed, never passed to the target. A trap raised while SIGTRAP
//! was blocked (`TRAP_PERF_FLAG_ASYNC`: inside this handler, or the target's own
//! handlers) is dropped: it is not synchronous with its access.

use core::sync::atomic::{AtomicI32, AtomicU32, AtomicU64, Ordering};
use std::os::fd::{FromRawFd, OwnedFd};
use weft_abi::{
    Frame, WatchDesc, MAX_WATCHES, THREAD_FLAG_IGNORE, WATCH_PAGE, WATCH_RW, WATCH_SIG_MAGIC,
    WATCH_UNCHANGED_ONLY, WATCH_W,
};

use iced_x86::{Decoder, DecoderOptions, OpKind};

use crate::{fds, session, threads, trap};

/// `si_code` of a perf event's SIGTRAP.
pub const TRAP_PERF: i32 = 6;
const TRAP_PERF_FLAG_ASYNC: u32 = 1 << 31;
const PERF_TYPE_BREAKPOINT: u32 = 5;

/// One watch of the session (`len == 0`: none).
#[derive(Default)]
pub struct Watch {
    pub addr: AtomicU64,
    pub len: AtomicU32,
    pub access: AtomicU32,
    pub probe: AtomicU32,
    pub advice: AtomicU64,
    /// The value as of the last hit (or the arming): `old` of the next write.
    pub last: AtomicU64,
    /// The last hardware trap's `rip` and how many bytes before it the accessing
    /// instruction starts, `(rip << 4) | k` (0: none), so that a loop's hits decode
    /// it once ([`accessing_ip`]).
    pub last_site: AtomicU64,
}

/// `struct perf_event_attr` up to `sig_data` (PERF_ATTR_SIZE_VER7 and later).
#[repr(C)]
#[derive(Default)]
struct PerfEventAttr {
    kind: u32,
    size: u32,
    config: u64,
    sample_period: u64,
    sample_type: u64,
    read_format: u64,
    flags: u64,
    wakeup_events: u32,
    bp_type: u32,
    bp_addr: u64,
    bp_len: u64,
    branch_sample_type: u64,
    sample_regs_user: u64,
    sample_stack_user: u32,
    clockid: i32,
    sample_regs_intr: u64,
    aux_watermark: u32,
    sample_max_stack: u16,
    reserved_2: u16,
    aux_sample_size: u32,
    aux_action: u32,
    sig_data: u64,
    config3: u64,
}

const FLAG_INHERIT: u64 = 1 << 1;
const FLAG_EXCLUDE_KERNEL: u64 = 1 << 5;
const FLAG_EXCLUDE_HV: u64 = 1 << 6;
const FLAG_INHERIT_THREAD: u64 = 1 << 35;
const FLAG_REMOVE_ON_EXEC: u64 = 1 << 36;
const FLAG_SIGTRAP: u64 = 1 << 37;

/// The perf events, owned by the control thread: per watch, one per thread.
#[derive(Default)]
pub struct Events {
    fds: [Vec<OwnedFd>; MAX_WATCHES],
}

/// Every open event's descriptor (+1; 0: free), where the child of a `fork()` finds
/// its copies to close them ([`after_fork_child`]): a copy held by a child would
/// keep the parent's watchpoints alive after the session closed its own.
static OPEN: [AtomicI32; MAX_OPEN] = [const { AtomicI32::new(0) }; MAX_OPEN];
const MAX_OPEN: usize = 4096;

fn remember(fd: i32) {
    for e in &OPEN {
        if e.compare_exchange(0, fd + 1, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
        {
            return;
        }
    }
}

fn forget(fd: i32) {
    for e in &OPEN {
        if e.compare_exchange(fd + 1, 0, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
        {
            return;
        }
    }
}

/// In the child of a `fork()` (one thread, the atfork handler): close the copies
/// of the parent's events (the child has none of its own: they are not inherited
/// across fork). Raw system calls only.
pub fn after_fork_child() {
    for e in &OPEN {
        let v = e.swap(0, Ordering::AcqRel);
        if v > 0 {
            // SAFETY: closing this process's copy of a descriptor the agent opened.
            unsafe { threads::raw_syscall(libc::SYS_close, (v - 1) as u64, 0) };
        }
    }
}

impl Events {
    fn close(&mut self, i: usize) {
        for fd in self.fds[i].drain(..) {
            forget(std::os::fd::AsRawFd::as_raw_fd(&fd));
        }
    }
}

impl Events {
    /// Store `desc` as watch `index` of the current session and (re)arm it on
    /// every thread. `Err`: the kernel refused the first thread's event.
    pub fn set(&mut self, index: u32, desc: WatchDesc) -> Result<(), String> {
        let i = index as usize;
        let Some(s) = session::current() else {
            return Err("no session".into());
        };
        let Some(w) = s.watches.get(i) else {
            return Err(format!("no watch {index}"));
        };
        // Close first: no trap of the old address runs the new advice.
        self.close(i);
        let was_page = w.access.load(Ordering::Acquire) & WATCH_PAGE != 0;
        w.len.store(0, Ordering::Release);
        if was_page {
            crate::page::protect(s)?;
        }
        if desc.len == 0 || desc.addr == 0 {
            return Ok(());
        }
        if desc.access & WATCH_PAGE != 0 {
            let last = weft_runtime::safe::load(desc.addr, desc.len.min(8) as u8).unwrap_or(0);
            w.addr.store(desc.addr, Ordering::Release);
            w.access.store(desc.access, Ordering::Release);
            w.probe.store(desc.probe, Ordering::Release);
            w.advice.store(desc.advice, Ordering::Release);
            w.last.store(last, Ordering::Release);
            w.len.store(desc.len, Ordering::Release);
            return crate::page::protect(s).inspect_err(|_| {
                w.len.store(0, Ordering::Release);
                let _ = crate::page::protect(s);
            });
        }
        if !matches!(desc.len, 1 | 2 | 4 | 8) || !desc.addr.is_multiple_of(u64::from(desc.len)) {
            return Err(format!(
                "{} bytes at {:#x}: a hardware watchpoint takes 1, 2, 4 or 8 aligned bytes",
                desc.len, desc.addr
            ));
        }
        // iced's decoder builds its tables (on the heap) at its first use: here,
        // not in the trap handler, which decodes the accessing instruction.
        let _ = Decoder::with_ip(64, &[0x90], 0, DecoderOptions::NONE).decode();
        let last = weft_runtime::safe::load(desc.addr, desc.len as u8).unwrap_or(0);
        w.last_site.store(0, Ordering::Release);
        w.addr.store(desc.addr, Ordering::Release);
        w.access.store(desc.access, Ordering::Release);
        w.probe.store(desc.probe, Ordering::Release);
        w.advice.store(desc.advice, Ordering::Release);
        w.last.store(last, Ordering::Release);
        w.len.store(desc.len, Ordering::Release);
        let sig_data = (WATCH_SIG_MAGIC << 48) | ((s.generation & 0xffff_ffff) << 8) | i as u64;
        // SAFETY: gettid has no preconditions.
        let me = unsafe { libc::gettid() };
        let mut armed: Vec<i32> = Vec::new();
        // Threads made meanwhile by a thread not yet armed: look again until none.
        for _ in 0..8 {
            let tids: Vec<i32> = crate::fds::tasks().unwrap_or_default();
            let new: Vec<i32> = tids
                .into_iter()
                .filter(|t| *t != me && !armed.contains(t))
                .collect();
            if new.is_empty() {
                break;
            }
            for tid in new {
                match open(tid, &desc, sig_data) {
                    Ok(fd) => {
                        remember(std::os::fd::AsRawFd::as_raw_fd(&fd));
                        self.fds[i].push(fd);
                    }
                    // Gone meanwhile.
                    Err(e) if e.raw_os_error() == Some(libc::ESRCH) => {}
                    Err(e) if armed.is_empty() => {
                        w.len.store(0, Ordering::Release);
                        self.close(i);
                        return Err(format!(
                            "perf_event_open (hardware watchpoint, {} bytes at {:#x}): {e}",
                            desc.len, desc.addr
                        ));
                    }
                    Err(_) => {}
                }
                armed.push(tid);
            }
        }
        Ok(())
    }

    /// Close every event (the session's end, weft gone).
    pub fn stop(&mut self) {
        for i in 0..MAX_WATCHES {
            self.close(i);
        }
        if let Some(s) = session::current() {
            for w in &s.watches {
                w.len.store(0, Ordering::Release);
            }
        }
        crate::page::restore_all();
    }
}

fn open(tid: i32, desc: &WatchDesc, sig_data: u64) -> std::io::Result<OwnedFd> {
    let bp_type = if desc.access & 0xff == WATCH_RW {
        WATCH_RW
    } else {
        WATCH_W
    };
    let attr = PerfEventAttr {
        kind: PERF_TYPE_BREAKPOINT,
        size: core::mem::size_of::<PerfEventAttr>() as u32,
        sample_period: 1,
        flags: FLAG_INHERIT
            | FLAG_EXCLUDE_KERNEL
            | FLAG_EXCLUDE_HV
            | FLAG_INHERIT_THREAD
            | FLAG_REMOVE_ON_EXEC
            | FLAG_SIGTRAP,
        bp_type,
        bp_addr: desc.addr,
        bp_len: u64::from(desc.len),
        sig_data,
        ..Default::default()
    };
    // SAFETY: a valid attr for the duration of the call; the result is a new fd.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_perf_event_open,
            &attr as *const PerfEventAttr,
            tid,
            -1i32,
            -1i32,
            8u64, // PERF_FLAG_FD_CLOEXEC
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a descriptor the kernel just gave us.
    Ok(fds::high(unsafe { OwnedFd::from_raw_fd(fd as i32) }))
}

/// `si_perf_data` and `si_perf_flags` of a TRAP_PERF siginfo (the `_perf` member of
/// `_sigfault`, after `si_addr`).
fn perf_fields(si: &libc::siginfo_t) -> (u64, u32, u32) {
    let base = si as *const libc::siginfo_t as *const u8;
    // SAFETY: siginfo_t is 128 bytes; these offsets are inside it.
    unsafe {
        (
            core::ptr::read_unaligned(base.add(24) as *const u64),
            core::ptr::read_unaligned(base.add(32) as *const u32),
            core::ptr::read_unaligned(base.add(36) as *const u32),
        )
    }
}

/// The frame a data probe's advice gets: the values after it
/// (`weft_abi::DATA_OLD_OFF`, `DATA_NEW_OFF`).
#[repr(C)]
struct DataFrame {
    frame: Frame,
    old: u64,
    new: u64,
}

const _: () = assert!(core::mem::offset_of!(DataFrame, old) == weft_abi::DATA_OLD_OFF);
const _: () = assert!(core::mem::offset_of!(DataFrame, new) == weft_abi::DATA_NEW_OFF);

/// Reads `len` bytes at `addr` through the kernel (`process_vm_readv` on this
/// process): an access the kernel makes on our behalf does not hit a user
/// watchpoint, where a plain load would hit a read-write one again.
fn read_quietly(addr: u64, len: u32) -> Option<u64> {
    let mut v = 0u64;
    let local = libc::iovec {
        iov_base: &mut v as *mut u64 as *mut libc::c_void,
        iov_len: len as usize,
    };
    let remote = libc::iovec {
        iov_base: addr as *mut libc::c_void,
        iov_len: len as usize,
    };
    // SAFETY: one iovec each, `local` points at `v` (8 bytes >= len).
    let n = unsafe { libc::process_vm_readv(libc::getpid(), &local, 1, &remote, 1, 0) };
    (n == len as isize).then_some(v)
}

/// A SIGTRAP of weft's watchpoints: run the watch's advice. `false`: not ours.
pub fn on_trap(si: &libc::siginfo_t, uc: &mut libc::ucontext_t) -> bool {
    if si.si_code != TRAP_PERF {
        return false;
    }
    let (data, kind, flags) = perf_fields(si);
    if kind != PERF_TYPE_BREAKPOINT || data >> 48 != WATCH_SIG_MAGIC {
        return false;
    }
    if flags & TRAP_PERF_FLAG_ASYNC != 0 {
        return true;
    }
    let index = (data & 0xff) as usize;
    let generation = (data >> 8) & 0xffff_ffff;
    // Marked before the session is loaded: weft frees no session while we hold it.
    let _using = threads::hold_session();
    let Some(s) = session::current() else {
        return true;
    };
    if s.generation & 0xffff_ffff != generation {
        return true;
    }
    // Hardware watches on the same bytes trap on the same access, but their perf
    // events' SIGTRAPs merge into one (a standard signal does not queue): each of
    // them gets the hit, in the order of the program's probes.
    let Some(w) = s.watches.get(index) else {
        return true;
    };
    let same = |v: &Watch| {
        v.addr.load(Ordering::Acquire) == w.addr.load(Ordering::Acquire)
            && v.len.load(Ordering::Acquire) == w.len.load(Ordering::Acquire)
            && v.access.load(Ordering::Acquire) == w.access.load(Ordering::Acquire)
    };
    for (i, v) in s.watches.iter().enumerate() {
        if i == index || (v.access.load(Ordering::Acquire) & WATCH_PAGE == 0 && same(v)) {
            hit(s, i, uc);
        }
    }
    true
}

/// A hardware watch's trap that reached the process without perf's word on which
/// watch it was: `si_code` `TRAP_BRKPT`, what the kernel sends for a debug
/// exception whose DR6 names no cause. Seen on a KVM host: in about one run in 60
/// of 200,000 watched writes, one hit came so, right after the write, and ended the
/// program (its default action). It is weft's when the instruction ending at `rip`
/// accesses the bytes of one of the session's hardware watches (and is not an
/// `int1` of the program's own): that watch's hit.
pub fn on_unclaimed_trap(si: &libc::siginfo_t, uc: &mut libc::ucontext_t) -> bool {
    const TRAP_BRKPT: i32 = 1;
    if si.si_code != TRAP_BRKPT {
        return false;
    }
    let rip = uc.uc_mcontext.gregs[libc::REG_RIP as usize] as u64;
    if weft_runtime::safe::load(rip.wrapping_sub(1), 1) == Some(0xf1) {
        return false;
    }
    let _using = threads::hold_session();
    let Some(s) = session::current() else {
        return false;
    };
    for (i, w) in s.watches.iter().enumerate() {
        let (len, access) = (
            w.len.load(Ordering::Acquire),
            w.access.load(Ordering::Acquire),
        );
        if len == 0 || access & WATCH_PAGE != 0 {
            continue;
        }
        let addr = w.addr.load(Ordering::Acquire);
        if accessing_ip(uc, rip, addr, len).is_some_and(|ip| ip != rip) {
            hit(s, i, uc);
            return true;
        }
    }
    false
}

/// Watch `index`'s advice for the access that trapped with `uc`.
fn hit(s: &session::Session, index: usize, uc: &mut libc::ucontext_t) {
    let Some(w) = s.watches.get(index) else {
        return;
    };
    let (len, advice) = (
        w.len.load(Ordering::Acquire),
        w.advice.load(Ordering::Acquire),
    );
    if len == 0 || advice == 0 {
        return;
    }
    let t = threads::get_or_create();
    // SAFETY: this thread's own AgentThread.
    let Some(th) = (unsafe { t.as_ref() }) else {
        threads::note_pool_miss();
        return;
    };
    if th.flags & THREAD_FLAG_IGNORE != 0 || th.nest != 0 {
        return;
    }
    let access = w.access.load(Ordering::Acquire);
    let addr = w.addr.load(Ordering::Acquire);
    let new = if access & 0xff == WATCH_RW {
        read_quietly(addr, len)
    } else {
        weft_runtime::safe::load(addr, len as u8)
    };
    let Some(new) = new else { return };
    let old = w.last.swap(new, Ordering::AcqRel);
    if access & WATCH_UNCHANGED_ONLY != 0 && old != new {
        return;
    }
    // The trap comes after the access, at the next instruction: `ip` is the
    // accessing one, found ending there.
    let rip = uc.uc_mcontext.gregs[libc::REG_RIP as usize] as u64;
    let site = w.last_site.load(Ordering::Acquire);
    let ip = if site >> 4 == rip && site & 0xf != 0 {
        rip - (site & 0xf)
    } else {
        let ip = accessing_ip(uc, rip, addr, len).unwrap_or(rip);
        if ip != rip && rip < 1 << 60 {
            w.last_site
                .store((rip << 4) | (rip - ip), Ordering::Release);
        }
        ip
    };
    let func = if ip == rip { rip.wrapping_sub(1) } else { ip };
    if let Some(v) = run_advice(uc, s, w, advice, ip, func, old, new) {
        write_new(addr, len, v);
        w.last.store(v, Ordering::Release);
    }
}

/// The instruction whose access of `len` bytes at `addr` trapped with `rip` at the
/// one after it: of the instructions that decode to end exactly at `rip`, the
/// longest whose memory operand (computed with the registers now) overlaps the
/// watched bytes (a `[rip+disp]` or absolute operand always can be), else the only
/// one that accesses memory at all; `None` when that is still ambiguous (its own base
/// register changed, as `mov rax, [rax]`, with another candidate), and then the
/// caller keeps `rip`.
fn accessing_ip(uc: &libc::ucontext_t, rip: u64, addr: u64, len: u32) -> Option<u64> {
    const MAX: usize = 15;
    let mut bytes = [0u8; MAX];
    // The bytes before `rip`: up to 15, not before the start of its page if the
    // page before is not readable.
    let mut back = MAX;
    if weft_runtime::safe::copy(&mut bytes, rip.wrapping_sub(MAX as u64)) != MAX {
        back = (rip & 0xfff) as usize;
        if back == 0 || back > MAX {
            return None;
        }
        bytes = [0u8; MAX];
        if weft_runtime::safe::copy(&mut bytes[MAX - back..], rip - back as u64) != back {
            return None;
        }
    }
    let (mut only, mut accessing) = (None, 0);
    // Longest first: an instruction with a prefix (REX.W) decodes without it too,
    // to the same operand, ending at the same place.
    for k in (1..=back).rev() {
        let at = rip - k as u64;
        let mut dec = Decoder::with_ip(64, &bytes[MAX - k..], at, DecoderOptions::NONE);
        let ins = dec.decode();
        if ins.is_invalid() || ins.len() != k {
            continue;
        }
        let mut memory = false;
        for op in 0..ins.op_count() {
            let kind = ins.op_kind(op);
            if kind == OpKind::Memory {
                memory = true;
                let size = ins.memory_size().size().max(1) as u64;
                let ea = ins.virtual_address(op, 0, |r, _, _| crate::page::register_value(uc, r));
                if ea.is_some_and(|ea| ea < addr + u64::from(len) && addr < ea + size) {
                    return Some(at);
                }
            } else if crate::page::is_implicit_memory(kind) {
                memory = true;
            }
        }
        if memory || ins.is_stack_instruction() {
            accessing += 1;
            only = Some(at);
        }
    }
    if accessing == 1 {
        only
    } else {
        None
    }
}

/// `new = EXPR` (`--unsafe`): the watched bytes take `v` after the access, written
/// through `/proc/self/mem` (past a page watch's protection, unseen by the debug
/// registers: no trap of weft's own). At most the first 8 bytes.
pub(crate) fn write_new(addr: u64, len: u32, v: u64) {
    let fd = crate::patch::mem_fd();
    if fd < 0 {
        return;
    }
    // SAFETY: `v` holds 8 readable bytes; at most 8 are written.
    unsafe {
        libc::pwrite(
            fd,
            &v as *const u64 as *const libc::c_void,
            len.min(8) as usize,
            addr as i64,
        )
    };
}

/// Run watch `w`'s advice on this thread (from a signal handler, the session held)
/// with the frame's `ip` and `func` and the values before and after the access.
/// The value the advice gave `new` when it changed it (`new = EXPR`), for the
/// caller to write.
#[allow(clippy::too_many_arguments)]
pub(crate) fn run_advice(
    uc: &libc::ucontext_t,
    s: &session::Session,
    w: &Watch,
    advice: u64,
    ip: u64,
    func: u64,
    old: u64,
    new: u64,
) -> Option<u64> {
    let t = threads::get_or_create();
    // SAFETY: this thread's own AgentThread.
    let Some(th) = (unsafe { t.as_mut() }) else {
        threads::note_pool_miss();
        return None;
    };
    if th.flags & THREAD_FLAG_IGNORE != 0 || th.nest != 0 {
        return None;
    }
    let slot = threads::attach_slot(th);
    if slot.is_null() {
        return None;
    }
    let mut df = DataFrame {
        frame: trap::frame_from(uc, ip, s, slot, t),
        old,
        new,
    };
    df.frame.site = u64::MAX;
    df.frame.func = func;
    df.frame.probe = u64::from(w.probe.load(Ordering::Acquire));
    th.nest += 1;
    // SAFETY: compiled advice in a code region of this session; it reads the frame
    // and the two values after it.
    let f: extern "C" fn(*mut Frame) = unsafe { core::mem::transmute(advice) };
    f(&mut df as *mut DataFrame as *mut Frame);
    th.nest -= 1;
    (df.new != new).then_some(df.new)
}
