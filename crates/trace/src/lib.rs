//! weft's event model: what a session produces, in one typed form for every output.
//!
//! The agent writes raw records into per-thread rings in the shared segment
//! (`weft_runtime::ring`); [`decode`] turns them into [`Record`]s — one place that
//! knows the ring format — merging threads in time order, taking map snapshots at the
//! moment advice asked to print, and applying `clear()`/`zero()` in order. Every
//! output is a [`Sink`]: the bpftrace-compatible text and JSON printers (in the
//! CLI), and the recorder ([`record`]) whose file format is specified in
//! `docs/record-format.md` so that tools other than weft can read it.
//!
//! Pure: nothing here touches another process; the segment is read through
//! `weft_runtime::shm`.

pub mod calls;
pub mod decode;
pub mod event;
pub mod losses;
pub mod record;
pub mod sink;

pub use decode::Decoder;
pub use event::{Event, MapSnapshot, Record};
pub use losses::Losses;
pub use sink::{Context, Sink};
