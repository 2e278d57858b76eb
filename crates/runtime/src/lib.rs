//! The runtime advice needs, in the agent (inside the target) and in weft (which runs
//! BEGIN, END and interval probes itself).
//!
//! * [`safe`]: fault-tolerant reads of memory advice does not own.
//! * [`shm`], [`layout`]: the shared data segment.
//! * [`map`]: lock-free key tables and per-thread accumulators.
//! * [`slots`]: thread slots claimed, given up when their thread is gone, folded
//!   into the retired slot and reused; [`queue`], the free list they go through.
//! * [`ring`]: per-thread event rings.
//! * [`helpers`]: the `extern "C"` functions compiled advice calls.
//! * [`clock`]: clocks from the vDSO.
//! * [`unwind`]: per-process unwind tables for `ustack`.

pub mod clock;
pub mod helpers;
pub mod layout;
pub mod map;
pub mod proto;
pub mod queue;
pub mod ring;
pub mod safe;
pub mod shm;
pub mod slots;
pub mod unwind;
