//! weft's engine: everything between a checked program and its records.
//!
//! * [`session`]: one program woven into any number of processes, from the first
//!   agent to the last map ([`Session`]); [`member`]: one process of it.
//! * [`target`]: launching a command with the agent preloaded, or loading the agent
//!   into a running process ([`safepoint`]: when a thread may be borrowed for that).
//! * [`segment`], [`conn`]: the shared segment and the control channel to an agent.
//! * [`pointcut`]: one resolver per pointcut kind (uprobe, usdt, profile, ...).
//! * [`weave`], [`patch`]: planning sites and writing their code; patching with the
//!   target's threads stopped.
//! * [`local`]: BEGIN/END/interval advice, run in weft.
//! * [`dwarf`]: probed functions' parameters for `args`.
//! * [`watch`]: system-wide sessions: the processes that map the probed files, and
//!   the kernel (eBPF on uprobes) catching new ones as they start.
//!
//! What may touch another process: `target`, `safepoint`, `patch` (through
//! `weft_inject`), `conn` (a socket), `member`/`session` (through those). What
//! runs in the target: only the agent (`crates/agent`) and the code `weave` writes.
//! Records go out through `weft_trace::Sink`; printing is the caller's.

pub mod conn;
pub mod data;
pub mod dwarf;
pub mod kernel;
pub mod local;
pub mod member;
pub mod patch;
pub mod pointcut;
pub mod progress;
pub mod safepoint;
pub mod segment;
pub mod session;
pub mod target;
pub mod unwind;
pub mod watch;
pub mod weave;

pub use progress::{Progress, ProgressHook};
pub use session::{Finished, Options, RunEnd, Session, Weaving};
