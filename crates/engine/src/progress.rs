//! Long steps of a session (reading a big binary's symbols, weaving thousands of
//! functions), told to whoever draws a progress line. The engine draws nothing:
//! the CLI supplies a [`Progress`] (a terminal's progress bar) through
//! [`crate::Options::progress`], or none.

use std::sync::Arc;

/// Receives a session's long steps, one at a time.
pub trait Progress: Send + Sync {
    /// A step begins: `what` it is, in `total` units (0: not known in advance).
    fn begin(&self, what: &str, total: u64);
    /// `n` more units of the step are done.
    fn advance(&self, n: u64);
    /// The step is over, done or failed.
    fn end(&self);
}

/// An [`Options`](crate::Options) field: a [`Progress`] shared with the caller.
#[derive(Clone)]
pub struct ProgressHook(pub Arc<dyn Progress>);

impl std::fmt::Debug for ProgressHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ProgressHook")
    }
}

/// A step told to an optional [`Progress`], ended when dropped (also on an error).
pub(crate) struct Step<'a>(Option<&'a dyn Progress>);

impl<'a> Step<'a> {
    pub(crate) fn begin(p: Option<&'a dyn Progress>, what: &str, total: u64) -> Step<'a> {
        if let Some(p) = p {
            p.begin(what, total);
        }
        Step(p)
    }

    pub(crate) fn advance(&self, n: u64) {
        if let Some(p) = self.0 {
            p.advance(n);
        }
    }
}

impl Drop for Step<'_> {
    fn drop(&mut self) {
        if let Some(p) = self.0 {
            p.end();
        }
    }
}
