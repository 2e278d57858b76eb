//! `libweft_agent.so`: the part of weft that lives inside the target process.
//!
//! It is loaded before `main` (`LD_PRELOAD`, for `weft trace -c`) or into a running
//! process (`dlopen` called by weft through ptrace, for `weft trace -p`). It does not
//! patch code itself while weft is alive; it provides what patched code needs:
//!
//! * [`threads`]: per-thread state behind an initial-exec TLS slot, and the slow path
//!   that gives a thread its slot in the session's shared segment;
//! * [`reap`]: finds threads that are gone, so their slot and state serve new ones;
//! * [`ret`]: the return trampoline and shadow stacks for return probes;
//! * [`trap`]: the SIGTRAP handler for int3 sites;
//! * [`signals`]: SIGTRAP/SIGSEGV/SIGBUS stay the agent's; the target's own handlers
//!   for them are kept and called for every signal that is not weft's;
//! * [`control`]: the control thread that maps the segment and code regions weft
//!   asks for, and restores every patch ([`patch`]) the moment weft goes away.
//!
//! The fault-tolerant memory access and the advice helpers come from
//! `weft-runtime`, which weft links too.
//!
//! No Rust panic may unwind into the target: entry points catch unwinding.

mod alloc;
mod control;
mod fds;
mod page;
mod patch;
mod profile;
mod reap;
mod ret;
mod session;
mod signals;
mod threads;
mod trap;
mod watch;

use std::os::fd::OwnedFd;

/// The agent allocates from its own memory, never with the target's `malloc`.
#[global_allocator]
static ALLOC: alloc::AgentAlloc = alloc::AgentAlloc;

/// The constructor. glibc calls `.init_array` entries with `(argc, argv, envp)`.
type Init = extern "C" fn(libc::c_int, *const *const libc::c_char, *mut *mut libc::c_char);

#[used]
#[unsafe(link_section = ".init_array")]
static INIT: Init = weft_agent_init;

unsafe extern "C" {
    static mut environ: *mut *mut libc::c_char;
}

/// Exported: in a launched program, weft's kernel uprobe on its first instruction
/// marks where the agent takes over from the uprobes that ran the probes since
/// `exec` (`weft_bpf`'s handover program).
#[unsafe(no_mangle)]
pub extern "C" fn weft_agent_init(
    _argc: libc::c_int,
    _argv: *const *const libc::c_char,
    envp: *mut *mut libc::c_char,
) {
    // Linked `-z initfirst` (see build.rs), the agent starts before the C library's
    // own initializer, which sets `environ` from the same `envp` a moment later:
    // set it now so the environment can be read (and edited in place) already.
    // SAFETY: single-threaded program start-up; `envp` is the process's environment
    // array, the value libc stores there itself.
    unsafe {
        if environ.is_null() && !envp.is_null() {
            environ = envp;
        }
    }
    let _ = std::panic::catch_unwind(init);
}

fn init() {
    if threads::init().is_err() {
        return;
    }
    threads::init_exit_hook();
    fds::grow_table();
    // Faults that are not weft's go to the target's (virtual) disposition.
    let chain: fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) = signals::chain;
    weft_runtime::safe::CHAIN.store(chain as usize, core::sync::atomic::Ordering::Release);
    let _ = signals::init();
    // SAFETY: registering fork handlers; they only touch our own state.
    unsafe {
        libc::pthread_atfork(
            Some(before_fork),
            Some(after_fork_parent),
            Some(after_fork_child),
        )
    };
    // A launched target's control thread serves its session at once; an attached
    // one's is started by `weft_agent_connect`, right after this `dlopen`.
    if let Some(fd) = launch_socket() {
        if control::start_control(Some(fd), 0) {
            // A launched target waits here, before main, until its probes are in.
            control::wait_released();
        }
    }
}

/// For `weft trace -c`: connect to the socket named in `WEFT_SOCKET`, and remove
/// the variables and the agent from `LD_PRELOAD` so children start clean — unless
/// the session follows children (`WEFT_FOLLOW`): then what they exec loads the
/// agent too and joins the session. When weft follows only through a wrapper
/// (`WEFT_FOLLOW=wrappers...`), the images before the program it runs keep them
/// and that program takes them out (`weft_abi::follow_keeps`).
fn launch_socket() -> Option<OwnedFd> {
    let name = std::env::var(weft_abi::ENV_SOCKET).ok()?;
    let follow = match std::env::var(weft_abi::ENV_FOLLOW) {
        Err(_) => false,
        Ok(v) => std::fs::read_link("/proc/self/exe").map_or(true, |exe| {
            weft_abi::follow_keeps(&v, &exe.to_string_lossy())
        }),
    };
    // SAFETY: the constructor of a launched program runs before main, with no other
    // thread of the program reading the environment.
    unsafe {
        if !follow {
            std::env::remove_var(weft_abi::ENV_SOCKET);
            std::env::remove_var(weft_abi::ENV_FOLLOW);
            if let Ok(pre) = std::env::var("LD_PRELOAD") {
                let rest: Vec<&str> = pre
                    .split([':', ' '])
                    .filter(|p| !p.is_empty() && !p.ends_with("libweft_agent.so"))
                    .collect();
                if rest.is_empty() {
                    std::env::remove_var("LD_PRELOAD");
                } else {
                    shorten_in_place("LD_PRELOAD", &rest.join(":"));
                }
            }
        }
    }
    control::remember_socket(&name);
    weft_runtime::proto::connect(&name).ok().map(fds::high)
}

/// Replaces the value of `name` with the shorter `value` in the environment
/// string itself. `setenv` would allocate a new environment array, which the C
/// library's initializer, running after the agent's (`-z initfirst`), replaces with
/// the original one; `unsetenv` and this edit work in place and stay.
///
/// # Safety
/// Single-threaded start-up: nothing else reads or writes the environment.
unsafe fn shorten_in_place(name: &str, value: &str) {
    // SAFETY: `environ` is the process's NUL-terminated array of NUL-terminated
    // strings; an entry `NAME=OLD` is overwritten with `NAME=VALUE` only when VALUE
    // is no longer than OLD, so the write stays inside the string.
    unsafe {
        let mut ep = environ;
        while !ep.is_null() && !(*ep).is_null() {
            let entry = std::ffi::CStr::from_ptr(*ep).to_bytes();
            if let Some(old) = entry
                .strip_prefix(name.as_bytes())
                .and_then(|r| r.strip_prefix(b"="))
            {
                if value.len() <= old.len() {
                    let dst = (*ep).add(name.len() + 1) as *mut u8;
                    std::ptr::copy_nonoverlapping(value.as_ptr(), dst, value.len());
                    *dst.add(value.len()) = 0;
                }
                return;
            }
            ep = ep.add(1);
        }
    }
}

/// Before fork(): the agent's heap is locked, so that the child does not inherit it
/// locked by a thread it does not have (glibc does the same for its `malloc`).
extern "C" fn before_fork() {
    alloc::before_fork();
}

extern "C" fn after_fork_parent() {
    alloc::after_fork();
}

/// In a child after fork(), while it has a single thread.
///
/// If the session follows forks, the child stays woven: its code, its trampolines
/// (shared memory) and its segment are its parent's, so advice runs in it at once;
/// its thread takes a slot of its own at its next hit, and a control thread of its
/// own connects to weft, which adopts it as a member of the session
/// (`control::start_forked`). Until then its sites are its parent's entries, which
/// it reads and never writes.
///
/// Otherwise the child is unwoven: its session belongs to the parent (weft neither
/// reads its rings nor restores its code), so before anything else the child puts
/// the original bytes back in its own copy of every patched site. Pending return
/// addresses replaced by the parent's return probes still work (the return
/// trampoline and the shadow stack are the child's own copies; no advice runs for
/// them). Code regions stay mapped: the forking thread may return into a
/// trampoline's relocated instructions. Children made without the `fork()` wrapper
/// (a raw `clone` system call) do not run this handler.
extern "C" fn after_fork_child() {
    alloc::after_fork();
    control::after_fork_child();
    watch::after_fork_child();
    page::after_fork_child();
    threads::after_fork_child();
    patch::after_fork_child();
    if let Some(s) = session::current() {
        if s.follows_forks() {
            s.adopted
                .store(false, core::sync::atomic::Ordering::Release);
            threads::adopt_fork();
            // SAFETY: getppid and getpid have no preconditions.
            let (parent, child) = unsafe { (libc::getppid() as u32, libc::getpid() as u32) };
            // A group's member forks a member, before the child runs a probe.
            weft_runtime::map::inherit(&s.shm, parent, child);
            if control::start_forked(parent, s.space()) {
                return;
            }
        }
        patch::unweave_forked_child(&s.shm, s.space());
    }
    threads::detach_all();
    if let Some(s) = session::take() {
        // The mappings are the parent's too (MAP_SHARED): never unmap them here.
        // The forking thread may return into a trampoline's relocated code.
        session::leak(s);
    }
    patch::close_mem();
}

/// Start address of the agent's ELF image, for weft's symbol lookups.
#[unsafe(no_mangle)]
pub extern "C" fn weft_agent_version() -> u32 {
    weft_abi::VERSION
}

pub use control::{weft_agent_connect, weft_agent_hold};
