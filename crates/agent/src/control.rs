//! The agent's control thread: talks to weft, maps what weft asks for, and restores
//! every patch if weft goes away.
//!
//! It waits for a connection request (`weft_agent_connect`, called by weft through
//! ptrace, or the `WEFT_SOCKET` variable of a launched command), connects to weft's
//! abstract socket, checks weft runs as our user (or root), and serves the session.
//! A closed socket means weft is gone: the sites are restored at once.

use core::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::{Duration, Instant};
use weft_abi::msg::Msg;
use weft_abi::*;
use weft_runtime::proto;
use weft_runtime::shm::Shm;

use crate::{patch, profile, reap, ret, session, signals, threads, trap, watch};

static REQUEST: AtomicU32 = AtomicU32::new(0);
/// A control thread is alive (serving, waiting for a request, or started). It ends
/// once no session is left to serve, so that between sessions the agent holds no
/// thread; `weft_agent_connect` starts the next one.
static CONTROL: AtomicBool = AtomicBool::new(false);
/// What the reaper learned, kept from one control thread to the next while the
/// thread pool stays (with the pool's epoch it was learnt in: see `take_reaper`).
static REAPER: std::sync::Mutex<Option<(u32, reap::Reaper)>> = std::sync::Mutex::new(None);
/// The socket name of the latest connection request.
struct RequestName(std::cell::UnsafeCell<[u8; 108]>);
// SAFETY: written by `weft_agent_connect` before it bumps REQUEST (Release), read by
// the control thread after it sees the bump (Acquire).
unsafe impl Sync for RequestName {}
static REQUEST_NAME: RequestName = RequestName(std::cell::UnsafeCell::new([0; 108]));
/// Set when a launched target may run `main` (weaving done, or weft gone).
pub static RELEASED: AtomicU32 = AtomicU32::new(0);
/// Bumped at every release (a session's `GO`, weft gone, a session or a connection
/// attempt over): a thread held in [`weft_agent_hold`] goes on once it passes
/// [`HOLD_UNTIL`].
static RELEASES: AtomicU32 = AtomicU32::new(0);
static HOLD_UNTIL: AtomicU32 = AtomicU32::new(0);

/// `weft_agent_connect`'s `flags`: the borrowed thread may start a control thread.
pub const CONNECT_MAY_START: i32 = 1;
/// `weft_agent_connect`'s `flags`: weft will send the borrowed thread into
/// [`weft_agent_hold`] until this session says `GO` (a process caught as it
/// starts, woven before it runs on).
pub const CONNECT_HOLD: i32 = 2;

fn futex_wait(word: &AtomicU32, expected: u32, timeout_ms: Option<u64>) {
    let ts = timeout_ms.map(|ms| libc::timespec {
        tv_sec: (ms / 1000) as i64,
        tv_nsec: ((ms % 1000) * 1_000_000) as i64,
    });
    let tsp = ts
        .as_ref()
        .map_or(core::ptr::null(), |t| t as *const libc::timespec);
    // SAFETY: futex wait on a valid aligned u32.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG,
            expected,
            tsp,
        );
    }
}

fn futex_wake(word: &AtomicU32) {
    // SAFETY: futex wake on a valid aligned u32.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG,
            i32::MAX,
        );
    }
}

/// Called by weft (through ptrace, in a hijacked thread) with the name of its
/// abstract socket. Copies the name and wakes the control thread; when there is
/// none (between sessions the agent keeps no thread), starts one if `flags` has
/// [`CONNECT_MAY_START`]: weft says so only when the thread it borrowed is at a safe
/// point (starting a thread allocates). With [`CONNECT_HOLD`], a thread entering
/// [`weft_agent_hold`] from now on waits for the next release. Returns 0, -1 for a
/// null name, -2 when the thread could not be started, -3 when one is needed and
/// may not be started.
///
/// # Safety
/// `name` is null or a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn weft_agent_connect(name: *const libc::c_char, flags: i32) -> i32 {
    if name.is_null() {
        return -1;
    }
    if flags & CONNECT_HOLD != 0 {
        HOLD_UNTIL.store(
            RELEASES.load(Ordering::Acquire).wrapping_add(1),
            Ordering::Release,
        );
    }
    let may_start = flags & CONNECT_MAY_START;
    // SAFETY: weft passes a NUL-terminated string; we copy at most 107 bytes into a
    // buffer only the control thread reads, after the REQUEST increment below.
    unsafe {
        let dst = REQUEST_NAME.0.get();
        let mut i = 0;
        while i < 107 {
            let c = *name.add(i) as u8;
            (*dst)[i] = c;
            if c == 0 {
                break;
            }
            i += 1;
        }
        (*dst)[i] = 0;
    }
    let seen = REQUEST.fetch_add(1, Ordering::AcqRel);
    if CONTROL.swap(true, Ordering::AcqRel) {
        futex_wake(&REQUEST);
        return 0;
    }
    if may_start == 0 {
        // As if never asked: the process is stopped around this call, so a control
        // thread that was ending (and may look at REQUEST again) has not moved.
        REQUEST.fetch_sub(1, Ordering::AcqRel);
        CONTROL.store(false, Ordering::Release);
        return -3;
    }
    if start_control(None, seen) {
        0
    } else {
        CONTROL.store(false, Ordering::Release);
        -2
    }
}

/// Starts a control thread that serves `initial` (a launched target's connection),
/// then the requests after the `seen`-th, and ends when none is left.
pub fn start_control(initial: Option<OwnedFd>, seen: u32) -> bool {
    CONTROL.store(true, Ordering::Release);
    spawn_control(move || main(initial, seen))
}

/// Starts the thread named `weft-agent` running `body` (panics caught), with every
/// signal blocked from its first instruction (see [`with_signals_blocked`]).
///
/// A plain detached `pthread_create`, not `std::thread`: the standard library's
/// thread start registers a thread-local destructor through the C library's
/// `__cxa_thread_atexit_impl`, which `calloc`s, and that first `malloc` on the thread
/// would give it a malloc arena the process keeps (the agent allocates from its
/// own memory, see `alloc`). Its 256 KiB stack is glibc's, cached by glibc for the
/// program's next thread when this one ends.
fn spawn_control(body: impl FnOnce() + Send + 'static) -> bool {
    type Body = Box<dyn FnOnce() + Send>;
    extern "C" fn start(arg: *mut libc::c_void) -> *mut libc::c_void {
        // SAFETY: naming this thread (PR_SET_NAME copies at most 16 bytes).
        unsafe {
            libc::prctl(
                libc::PR_SET_NAME,
                c"weft-agent".as_ptr() as libc::c_ulong,
                0,
                0,
                0,
            )
        };
        // SAFETY: `arg` is the box `spawn_control` leaked for this thread alone.
        let body = unsafe { Box::from_raw(arg as *mut Body) };
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || (*body)()));
        core::ptr::null_mut()
    }
    crate::alloc::keep();
    let arg = Box::into_raw(Box::new(Box::new(body) as Body));
    let started = with_signals_blocked(|| {
        // SAFETY: a default attribute object, given a stack size and the detached
        // state, used once and destroyed; `start` takes ownership of `arg` only if
        // the thread was created.
        unsafe {
            let mut attr: libc::pthread_attr_t = core::mem::zeroed();
            if libc::pthread_attr_init(&mut attr) != 0 {
                return false;
            }
            libc::pthread_attr_setstacksize(&mut attr, 256 * 1024);
            libc::pthread_attr_setdetachstate(&mut attr, libc::PTHREAD_CREATE_DETACHED);
            let mut thread: libc::pthread_t = 0;
            let r = libc::pthread_create(&mut thread, &attr, start, arg as *mut libc::c_void);
            libc::pthread_attr_destroy(&mut attr);
            r == 0
        }
    });
    if !started {
        // SAFETY: the thread was not created: the box is still ours.
        drop(unsafe { Box::from_raw(arg) });
    }
    started
}

/// Runs `f` (which starts a thread) with every signal blocked in the calling thread,
/// so the new thread starts with them blocked: a signal meant for the target's
/// threads is never delivered to the agent's before it has blocked them itself.
/// Signals that arrive meanwhile are held, and delivered when the mask comes back.
fn with_signals_blocked<T>(f: impl FnOnce() -> T) -> T {
    // SAFETY: sigset_t is plain data; pthread_sigmask only changes this thread's mask,
    // which is put back before returning.
    unsafe {
        let mut all: libc::sigset_t = core::mem::zeroed();
        let mut old: libc::sigset_t = core::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_BLOCK, &all, &mut old);
        let r = f();
        libc::pthread_sigmask(libc::SIG_SETMASK, &old, core::ptr::null_mut());
        r
    }
}

/// In a fork()ed child: the parent's control thread is not here.
pub fn after_fork_child() {
    CONTROL.store(false, Ordering::Release);
}

fn request_name() -> String {
    // SAFETY: read after observing REQUEST change (Acquire).
    let bytes = unsafe { *REQUEST_NAME.0.get() };
    let n = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    String::from_utf8_lossy(&bytes[..n]).into_owned()
}

/// The calling thread is the agent's control thread: advice never runs on it, and
/// the target's signals go to its own threads.
fn mark_control_thread() {
    threads::mark_ignored();
    // SAFETY: blocking every signal on this thread so the target's signals go to its
    // own threads; prctl names the thread for `ps`/`top`.
    unsafe {
        let mut all: libc::sigset_t = core::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_BLOCK, &all, core::ptr::null_mut());
        // But not the faults and traps of its own instructions: it may touch a
        // page protected for a data watch (`page`; the C library's code it calls
        // may, though the agent's own heap is never watched), whose fault and
        // emulation trap must reach the agent's handlers (blocked, they kill), and
        // its fault-tolerant reads fault.
        let mut sync: libc::sigset_t = core::mem::zeroed();
        libc::sigemptyset(&mut sync);
        libc::sigaddset(&mut sync, libc::SIGSEGV);
        libc::sigaddset(&mut sync, libc::SIGTRAP);
        libc::pthread_sigmask(libc::SIG_UNBLOCK, &sync, core::ptr::null_mut());
        libc::prctl(
            libc::PR_SET_NAME,
            c"weft-agent".as_ptr() as libc::c_ulong,
            0,
            0,
            0,
        );
    }
}

/// Body of the control thread. `initial` is the connection of a launched target.
fn main(initial: Option<OwnedFd>, seen: u32) {
    // The thread pool, given back at the end of the last session, is mapped again
    // (without it threads run no advice: their hits are counted as dropped).
    let _ = threads::ensure();
    mark_control_thread();
    // Threads that ended between sessions are found at the next one.
    let mut reaper = take_reaper();
    if let Some(fd) = initial {
        serve(fd, &mut reaper, None);
        release_launch();
    }
    // A request made before this thread ran counts (weft asks right after dlopen).
    serve_requests(&mut reaper, seen);
    end_control(reaper);
}

fn take_reaper() -> reap::Reaper {
    let epoch = threads::epoch();
    // try_lock: in the child of a fork() the lock may be held by a thread the
    // child does not have.
    REAPER
        .try_lock()
        .ok()
        .and_then(|mut r| r.take())
        // What it learnt of an earlier pool's entries is not about this one's.
        .filter(|(e, _)| *e == epoch)
        .map(|(_, r)| r)
        .unwrap_or_default()
}

fn keep_reaper(reaper: reap::Reaper) {
    if let Ok(mut r) = REAPER.try_lock() {
        *r = Some((threads::epoch(), reaper));
    }
}

/// The control thread is ending (no request left). If no session is left either
/// and none is coming, the agent gives back what it holds for sessions: the thread
/// pool (when nothing can reach it any more, see `threads::release`; kept
/// otherwise, with the reaper's knowledge of its entries) and its heap's chunks
/// (unmapped as the last block is freed, when this thread's own are).
fn end_control(reaper: reap::Reaper) {
    let idle = || !CONTROL.load(Ordering::Acquire) && session::current().is_none();
    match threads::release(idle, session::leaked()) {
        Ok(()) => drop(reaper),
        Err(_) => keep_reaper(reaper),
    }
    if idle() {
        forget_socket();
        crate::alloc::release_when_idle();
    }
}

/// Serve one session per connection request (`weft_agent_connect`) after the
/// `seen`-th; return (the thread ends) once none is waiting. A request that comes
/// while the thread is ending is served by it if it can take `CONTROL` back, else
/// by the thread that request started.
fn serve_requests(reaper: &mut reap::Reaper, mut seen: u32) {
    loop {
        let now = REQUEST.load(Ordering::Acquire);
        if now == seen {
            CONTROL.store(false, Ordering::Release);
            if REQUEST.load(Ordering::Acquire) == seen || CONTROL.swap(true, Ordering::AcqRel) {
                return;
            }
            continue;
        }
        seen = now;
        let name = request_name();
        if let Ok(fd) = proto::connect(&name).map(crate::fds::high) {
            if peer_allowed(fd.as_raw_fd()) {
                remember_socket(&name);
                serve(fd, reaper, None);
            }
        }
        // Served or not, a thread held for this request goes on.
        release_launch();
    }
}

/// The name of weft's socket of the current session (a forked child reconnects to
/// it), NUL-padded: a fixed buffer, so that nothing stays allocated between
/// sessions.
static SOCKET: std::sync::Mutex<[u8; 108]> = std::sync::Mutex::new([0; 108]);

/// Remember the socket of the session being served.
pub fn remember_socket(name: &str) {
    if let Ok(mut s) = SOCKET.lock() {
        *s = [0; 108];
        let n = name.len().min(107);
        s[..n].copy_from_slice(&name.as_bytes()[..n]);
    }
}

/// No session is left: no forked child will look for weft's socket.
fn forget_socket() {
    if let Ok(mut s) = SOCKET.try_lock() {
        *s = [0; 108];
    }
}

fn socket_name(bytes: &[u8; 108]) -> String {
    let n = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    String::from_utf8_lossy(&bytes[..n]).into_owned()
}

/// In the child of a fork() of a process whose session follows forks (see
/// `after_fork_child`): a control thread of the child's own connects to weft, says
/// it is `parent`'s child with its sites in `parent_space`, and serves the session
/// weft adopts it into. If weft cannot be reached, the child unweaves itself.
pub fn start_forked(parent: u32, parent_space: u32) -> bool {
    // The child has one thread: the lock is free (a parent thread that held it is
    // not here), but its state may be poisoned or held: take it without waiting.
    let name = match SOCKET.try_lock() {
        Ok(s) => socket_name(&s),
        Err(std::sync::TryLockError::Poisoned(p)) => socket_name(&p.into_inner()),
        Err(std::sync::TryLockError::WouldBlock) => return false,
    };
    if name.is_empty() {
        return false;
    }
    let seen_at_fork = REQUEST.load(Ordering::Acquire);
    CONTROL.store(true, Ordering::Release);
    spawn_control(move || {
        let _ = threads::ensure();
        mark_control_thread();
        let mut reaper = reap::Reaper::default();
        match proto::connect(&name).map(crate::fds::high) {
            Ok(fd) if peer_allowed(fd.as_raw_fd()) => {
                serve(fd, &mut reaper, Some((parent, parent_space)));
            }
            _ => {
                weft_gone(None);
                patch::close_mem();
            }
        }
        // Later sessions (`weft -p CHILD`) are served as in any process
        // (requests the parent had are not the child's).
        serve_requests(&mut reaper, seen_at_fork);
        end_control(reaper);
    })
}

pub fn release_launch() {
    RELEASED.store(1, Ordering::Release);
    futex_wake(&RELEASED);
    RELEASES.fetch_add(1, Ordering::AcqRel);
    futex_wake(&RELEASES);
}

// A thread weft sends here (its pc set to `weft_agent_hold`, its original pc pushed
// 128 bytes below its stack pointer, past the red zone) waits for the session's `GO`
// with every register, the flags and the x87/SSE state kept, then returns to where
// it was with `ret 128`. weft does this to a process it caught as it started (a
// kernel uprobe stopped it at its entry point, at __libc_start_main or where dlopen
// returned): its one thread stays here while the probes are woven, so the program
// runs no probed code before they are in.
#[unsafe(naked)]
#[unsafe(no_mangle)]
pub extern "C" fn weft_agent_hold() {
    core::arch::naked_asm!(
        "pushfq",
        "cld",
        "push rax", "push rcx", "push rdx", "push rsi", "push rdi",
        "push r8", "push r9", "push r10", "push r11", "push rbp",
        "mov rbp, rsp",
        "and rsp, -64",
        "sub rsp, 512",
        "fxsave64 [rsp]",
        "call {wait}",
        "fxrstor64 [rsp]",
        "mov rsp, rbp",
        "pop rbp", "pop r11", "pop r10", "pop r9", "pop r8",
        "pop rdi", "pop rsi", "pop rdx", "pop rcx", "pop rax",
        "popfq",
        "ret 128",
        wait = sym hold_wait,
    );
}

/// The body of `weft_agent_hold`: wait for the release the connect request asked for.
extern "C" fn hold_wait() {
    loop {
        let now = RELEASES.load(Ordering::Acquire);
        if now.wrapping_sub(HOLD_UNTIL.load(Ordering::Acquire)) as i32 >= 0 {
            return;
        }
        futex_wait(&RELEASES, now, Some(1000));
    }
}

/// Wait (in the constructor of a launched target) until weft says go or goes away.
pub fn wait_released() {
    while RELEASED.load(Ordering::Acquire) == 0 {
        futex_wait(&RELEASED, 0, Some(1000));
    }
}

fn peer_allowed(fd: i32) -> bool {
    match proto::peer_cred(fd) {
        // SAFETY: getuid has no preconditions.
        Ok(c) => c.uid == 0 || c.uid == unsafe { libc::getuid() },
        Err(_) => false,
    }
}

/// The agent's executable mapping (the one holding the return trampoline): a thread
/// whose PC is anywhere in it may hold a pointer into the session (signal handlers,
/// the trampolines' attach slow path, the return path), so weft does not free a
/// session while one is there. Falls back to the return path alone.
fn agent_text() -> (u64, u64) {
    let at = ret::trampoline_addr();
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
    for l in maps.lines() {
        let Some((a, b)) = l.split_whitespace().next().and_then(|r| r.split_once('-')) else {
            continue;
        };
        let (Ok(a), Ok(b)) = (u64::from_str_radix(a, 16), u64::from_str_radix(b, 16)) else {
            continue;
        };
        if (a..b).contains(&at) {
            return (a, b);
        }
    }
    ret::trampoline_range()
}

fn hello(parent: u32, parent_space: u32) -> Hello {
    let (text_start, text_end) = agent_text();
    Hello {
        version: VERSION,
        // SAFETY: getpid has no preconditions.
        pid: unsafe { libc::getpid() } as u32,
        tls_offset: threads::tls_offset(),
        return_trampoline: ret::trampoline_addr(),
        thread_attach: threads::weft_agent_thread_attach as *const () as u64,
        hijack: ret::weft_agent_hijack as *const () as u64,
        text_start,
        text_end,
        busy: u32::from(session::current().is_some()),
        _pad: 0,
        helpers: weft_runtime::helpers::helper_table(),
        on_raise: ret::weft_agent_on_raise as *const () as u64,
        sigaction: signals::weft_agent_sigaction as *const () as u64,
        step_guard: &trap::STEP_GUARD as *const trap::StepGuard as u64,
        parent,
        parent_space,
    }
}

/// Serve one session on `fd` until weft closes it. Between messages: look for
/// threads that are gone (`reap`, every few milliseconds while threads come and go),
/// keep weft's signal handlers in front (every 500 ms) and give new threads their
/// profile timers (every 100 ms while profiling).
fn serve(fd: OwnedFd, reaper: &mut reap::Reaper, forked: Option<(u32, u32)>) {
    patch::open_mem();
    serve_session(fd, reaper, forked);
    // Sites are restored (by weft, or by `weft_gone`): nothing is written any more.
    patch::close_mem();
}

fn serve_session(fd: OwnedFd, reaper: &mut reap::Reaper, forked: Option<(u32, u32)>) {
    let sock = fd.as_raw_fd();
    let (parent, parent_space) = forked.unwrap_or((0, 0));
    if proto::send(sock, &Msg::Hello(hello(parent, parent_space)), None).is_err() {
        // A forked child that cannot reach weft is unwoven at once.
        if forked.is_some() {
            weft_gone(None);
        }
        return;
    }
    let mut regions: Vec<(u64, usize)> = Vec::new();
    let mut ending: Option<Box<session::Session>> = None;
    let mut timers = profile::Timers::default();
    let mut watches = watch::Events::default();
    // A forked child's session is running already (its profile timers, per thread,
    // were not inherited).
    let mut running = forked.is_some();
    let now = Instant::now();
    let (mut next_reap, mut next_handlers, mut timers_at) = (now, now, now);
    loop {
        let now = Instant::now();
        if now >= next_reap {
            reaper.tick();
            next_reap = now + Duration::from_millis(reaper.interval_ms());
        }
        if now >= next_handlers {
            keep_handlers();
            next_handlers = now + Duration::from_millis(500);
        }
        // Profiling picks up new threads every 100 ms.
        let timers_every = Duration::from_millis(if timers.active() { 100 } else { 500 });
        let mut next_timers = timers_at + timers_every;
        if now >= next_timers {
            if running {
                timers.refresh();
            }
            timers_at = now;
            next_timers = now + timers_every;
        }
        let wait = next_reap
            .min(next_handlers)
            .min(next_timers)
            .saturating_duration_since(Instant::now());
        let mut pfd = libc::pollfd {
            fd: sock,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: poll on one valid pollfd.
        let r = unsafe { libc::poll(&mut pfd, 1, wait.as_millis().max(1) as i32) };
        if r == 0 {
            continue;
        }
        let received = match proto::recv(sock) {
            Ok(Some(m)) => m,
            _ => {
                timers.stop();
                watches.stop();
                weft_gone(ending.take());
                return;
            }
        };
        let reply = match received.msg() {
            Ok(Msg::MapShm {
                size,
                space,
                flags,
                pcomm,
            }) => match map_shm(received.fd.as_ref(), size, space, flags, pcomm) {
                Ok(addr) => {
                    let generation = session::current().map_or(0, |s| s.generation as u32);
                    let _ = proto::send(sock, &Msg::ShmMapped { addr, generation }, None);
                    continue;
                }
                Err(e) => Err(e),
            },
            Ok(Msg::AllocCode { lo, hi, size }) => match alloc_code(lo, hi, size) {
                Ok((addr, size, memfd)) => {
                    regions.push((addr, size));
                    let _ = proto::send(
                        sock,
                        &Msg::CodeRegion {
                            addr,
                            size: size as u64,
                        },
                        Some(memfd.as_raw_fd()),
                    );
                    continue;
                }
                Err(e) => Err(e),
            },
            Ok(Msg::SetProfile { index, desc }) => {
                match session::current().and_then(|s| s.profiles.get(index as usize)) {
                    Some(p) => {
                        p.probe.store(desc.probe, Ordering::Release);
                        p.advice.store(desc.advice, Ordering::Release);
                        p.hz.store(desc.hz, Ordering::Release);
                        Ok(())
                    }
                    None => Err(format!("no profile probe {index} (or no session)")),
                }
            }
            Ok(Msg::SetWatch { index, desc }) => watches.set(index, desc),
            Ok(Msg::SetSites { on, sites }) => match session::current() {
                Some(s) => {
                    patch::set_sites(&s.shm, s.space(), sites.iter(), on);
                    Ok(())
                }
                None => Err("no session".to_string()),
            },
            Ok(Msg::Adopt { space }) => match session::current() {
                Some(s) => {
                    s.space.store(space, Ordering::Release);
                    s.adopted.store(true, Ordering::Release);
                    Ok(())
                }
                None => Err("no session to adopt".to_string()),
            },
            Ok(Msg::Go) => {
                // Timers first, then reply, then release: a launched program may run
                // to its end at once.
                running = true;
                timers.refresh();
                timers_at = Instant::now();
                let _ = proto::send(sock, &Msg::Ok, None);
                release_launch();
                continue;
            }
            Ok(Msg::End) => {
                running = false;
                timers.stop();
                watches.stop();
                threads::detach_all();
                ending = session::take();
                if let Some(s) = ending.as_mut() {
                    s.code.append(&mut regions);
                }
                Ok(())
            }
            Ok(Msg::TakeSignals) => {
                signals::take_over();
                Ok(())
            }
            Ok(Msg::Free) => {
                drop(ending.take());
                Ok(())
            }
            Ok(other) => Err(format!("unexpected message {other:?}")),
            Err(e) => Err(e.to_string()),
        };
        let _ = match reply {
            Ok(()) => proto::send(sock, &Msg::Ok, None),
            Err(e) => proto::send(sock, &Msg::Err(&e), None),
        };
    }
}

/// weft closed the connection (exited, crashed or was killed): restore every site
/// and stop running advice. The segment and code stay mapped: without weft no one
/// can check that no thread is still inside them. That holds for a session weft
/// already ended (`ending`) but did not free as well: weft died between `MSG_END`
/// and `MSG_FREE`, or gave up waiting for a thread to leave its code; the sites it
/// left patched (the unwinder hooks, restored last) are restored here.
fn weft_gone(ending: Option<Box<session::Session>>) {
    if let Some(s) = session::current() {
        if s.adopted.load(Ordering::Acquire) {
            patch::restore_all(&s.shm, s.space());
        } else {
            // A forked child weft never adopted: its sites are its parent's entries,
            // which it must not write.
            patch::unweave_forked_child(&s.shm, s.space());
        }
    }
    // Threads keep their slots: one may be inside advice (or return advice, through
    // a hijacked return) right now, and would write through a slot pointer nulled
    // under it. The session is leaked, so the slots stay valid; a later session has
    // another generation, and threads claim new slots in it.
    if let Some(s) = session::take() {
        // Keep the mappings: the trap handler may still resume threads through the
        // relocated code of restored sites.
        session::leak(s);
    }
    if let Some(s) = ending {
        // Abandoned (leaked) first: the trap handler finds the sites being restored
        // there, and resumes threads in their relocated code, which stays mapped.
        let s = session::abandon(s);
        patch::restore_all(&s.shm, s.space());
    }
    release_launch();
}

fn map_shm(
    fd: Option<&OwnedFd>,
    size: u64,
    space: u32,
    flags: u32,
    pcomm: [u8; 16],
) -> Result<u64, String> {
    let fd = fd.ok_or("MapShm without a file descriptor")?;
    let size = size as usize;
    if session::current().is_some() {
        return Err("a session is already active in this process".into());
    }
    // SAFETY: mapping the memfd weft sent, shared, read-write.
    let p = unsafe {
        libc::mmap(
            core::ptr::null_mut(),
            size,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd.as_raw_fd(),
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(format!(
            "mmap of the shared segment failed: {}",
            std::io::Error::last_os_error()
        ));
    }
    // SAFETY: the mapping is at least `size` bytes; the header is checked below
    // before anything else reads it.
    let shm = unsafe { Shm::from_base(p as *mut u8) };
    let h = shm.header();
    if size < core::mem::size_of::<ShmHeader>()
        || h.magic != SHM_MAGIC
        || h.version != VERSION
        || h.total_size as usize != size
    {
        // SAFETY: unmapping what we just mapped.
        unsafe { libc::munmap(p, size) };
        return Err("shared segment has the wrong magic, version or size".into());
    }
    // A new weft cleared every debug register when it attached: a step guard a
    // weft that died left behind guards nothing any more.
    trap::STEP_GUARD.clear();
    session::publish(Box::new(session::Session {
        shm,
        shm_size: size,
        generation: session::next_generation(),
        space: AtomicU32::new(space),
        flags,
        adopted: core::sync::atomic::AtomicBool::new(true),
        profiles: Default::default(),
        watches: Default::default(),
        code: Vec::new(),
        pcomm,
    }));
    Ok(p as u64)
}

/// Map a code region (RX here, RW in weft) of `size` bytes inside `[lo, hi)`.
fn alloc_code(lo: u64, hi: u64, size: u64) -> Result<(u64, usize, OwnedFd), String> {
    let size = (size.max(4096)).div_ceil(4096) * 4096;
    // SAFETY: memfd_create with a static name.
    let raw = unsafe { libc::memfd_create(c"weft-code".as_ptr(), libc::MFD_CLOEXEC) };
    if raw < 0 {
        return Err(format!("memfd_create: {}", std::io::Error::last_os_error()));
    }
    // SAFETY: raw is a fresh fd we own.
    let memfd = unsafe { OwnedFd::from_raw_fd(raw) };
    // memfds are created 0777: make the code region private to its owner before it
    // holds anything (its fd is visible in /proc/PID/fd and map_files).
    // SAFETY: fchmod on our own fd.
    if unsafe { libc::fchmod(raw, 0o600) } != 0 {
        return Err(format!("fchmod: {}", std::io::Error::last_os_error()));
    }
    // SAFETY: sizing our memfd.
    if unsafe { libc::ftruncate(raw, size as i64) } != 0 {
        return Err(format!("ftruncate: {}", std::io::Error::last_os_error()));
    }
    let maps = std::fs::read_to_string("/proc/self/maps").map_err(|e| e.to_string())?;
    for addr in candidates(&maps, lo, hi, size) {
        // SAFETY: MAP_FIXED_NOREPLACE never replaces an existing mapping.
        let p = unsafe {
            libc::mmap(
                addr as *mut _,
                size as usize,
                libc::PROT_READ | libc::PROT_EXEC,
                libc::MAP_SHARED | libc::MAP_FIXED_NOREPLACE,
                raw,
                0,
            )
        };
        if p != libc::MAP_FAILED {
            if p as u64 == addr {
                return Ok((addr, size as usize, memfd));
            }
            // Old kernels ignore NOREPLACE and treat it as a hint.
            // SAFETY: unmapping what we just mapped.
            unsafe { libc::munmap(p, size as usize) };
        }
    }
    Err(format!(
        "no free address space for {size} bytes of trampolines within ±2 GiB of the probed code"
    ))
}

/// Start addresses of free gaps inside `[lo, hi)` that fit `size`, nearest to the
/// middle of the range first.
fn candidates(maps: &str, lo: u64, hi: u64, size: u64) -> Vec<u64> {
    let mut used: Vec<(u64, u64)> = maps
        .lines()
        .filter_map(|l| {
            let range = l.split_whitespace().next()?;
            let (a, b) = range.split_once('-')?;
            Some((
                u64::from_str_radix(a, 16).ok()?,
                u64::from_str_radix(b, 16).ok()?,
            ))
        })
        .collect();
    used.sort();
    let lo = lo.max(0x10000).div_ceil(4096) * 4096;
    let mid = lo / 2 + hi / 2;
    let mut out = Vec::new();
    let mut prev_end = 0x10000u64;
    let guard = 1 << 20;
    for (start, end) in used
        .iter()
        .copied()
        .chain(std::iter::once((0x7fff_ffff_f000, 0x7fff_ffff_f000)))
    {
        let g0 = prev_end.max(lo);
        let g1 = start.min(hi);
        if g1 > g0 && g1 - g0 >= size + 2 * guard {
            // Prefer the end of the gap nearest the probed code.
            if g1 <= mid {
                out.push((g1 - guard - size) & !4095);
            } else {
                out.push((g0 + guard).div_ceil(4096) * 4096);
            }
        }
        prev_end = prev_end.max(end);
    }
    out.sort_by_key(|&a| a.abs_diff(mid));
    out
}

/// The target may install its own SIGSEGV/SIGTRAP handlers with a raw system call,
/// past the redirected `sigaction`: put ours back in front (the target's become its
/// virtual dispositions, see `signals`).
fn keep_handlers() {
    if session::current().is_none() {
        return;
    }
    signals::take_over();
}

#[cfg(test)]
mod tests {
    use super::candidates;

    #[test]
    fn gap_candidates_stay_in_range() {
        let maps = "555555554000-555555556000 r-xp 00000000 08:01 1 /bin/x\n\
                    555555756000-555555777000 rw-p 00000000 00:00 0 [heap]\n\
                    7ffff7dd3000-7ffff7dfc000 r-xp 00000000 08:01 2 /lib/ld.so\n";
        let lo = 0x5555_5555_4000u64 - (1 << 31) + (1 << 24);
        let hi = 0x5555_5555_6000u64 + (1 << 31) - (1 << 24);
        let c = candidates(maps, lo, hi, 1 << 16);
        assert!(!c.is_empty());
        for a in c {
            assert!(a >= lo && a + (1 << 16) <= hi, "{a:x}");
            assert_eq!(a % 4096, 0);
        }
    }
}
