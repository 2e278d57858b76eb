//! Named die points, for tests of what a SIGKILL of weft at a chosen instant does
//! to its target.
//!
//! `WEFT_TEST_DIE_AT=<point>` makes weft send itself SIGKILL when it reaches that
//! point, exactly as a `kill -9` arriving at that instant would. A point may be
//! qualified by the phase weft is in (`patch:step-trap`: a single step while
//! patching, not while attaching) and by a count (`<point>#<n>`: the n-th time it
//! is reached, from 1). Every point is a boundary between two steps of attaching,
//! weaving or unweaving; ARCHITECTURE.md ("Dying at any point") lists them.
//! Without the variable a point costs one load. Compiled into release builds: the
//! tests run the binary that ships.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, OnceLock};

/// The variable that names the point to die at.
pub const ENV: &str = "WEFT_TEST_DIE_AT";

struct Wanted {
    phase: Option<String>,
    point: String,
    nth: u32,
    seen: AtomicU32,
}

fn wanted() -> Option<&'static Wanted> {
    static W: OnceLock<Option<Wanted>> = OnceLock::new();
    W.get_or_init(|| {
        let v = std::env::var(ENV).ok()?;
        let (name, nth) = match v.split_once('#') {
            Some((p, n)) => (p, n.parse().ok().filter(|&n| n > 0)?),
            None => (v.as_str(), 1),
        };
        let (phase, point) = match name.split_once(':') {
            Some((ph, p)) => (Some(ph.to_string()), p.to_string()),
            None => (None, name.to_string()),
        };
        Some(Wanted {
            phase,
            point,
            nth,
            seen: AtomicU32::new(0),
        })
    })
    .as_ref()
}

static PHASE: Mutex<&'static str> = Mutex::new("");

/// Weft enters a phase (`attach`, `patch`, `unweave`...): points reached from now
/// on also answer to `<phase>:<point>`.
pub fn phase(name: &'static str) {
    if wanted().is_some() {
        *PHASE.lock().unwrap_or_else(|e| e.into_inner()) = name;
    }
}

/// Die here (SIGKILL, no cleanup of any kind) if this is the point named by
/// [`ENV`], in its phase if one is named, and the count is reached.
pub fn at(point: &str) {
    let Some(w) = wanted() else { return };
    if w.point != point {
        return;
    }
    if let Some(ph) = &w.phase {
        if *PHASE.lock().unwrap_or_else(|e| e.into_inner()) != ph.as_str() {
            return;
        }
    }
    if w.seen.fetch_add(1, Ordering::Relaxed) + 1 != w.nth {
        return;
    }
    // SAFETY: sending SIGKILL to our own process; it does not return.
    unsafe {
        libc::kill(libc::getpid(), libc::SIGKILL);
    }
    loop {
        std::thread::park();
    }
}
