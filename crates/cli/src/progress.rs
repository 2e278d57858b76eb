//! The progress line of long steps (reading a big binary's symbols, weaving
//! thousands of functions) on a terminal: the engine's [`weft_engine::Progress`]
//! drawn with `indicatif` on stderr. Only when stderr is a terminal (and not
//! `-q`): otherwise there is no progress object at all, so output to a pipe or a
//! file is unchanged.

use std::io::IsTerminal;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// Draws the engine's steps on stderr.
#[derive(Default)]
pub struct TermProgress {
    bar: Mutex<Option<ProgressBar>>,
}

impl TermProgress {
    /// A hook for the engine when stderr is a terminal and `quiet` is off.
    pub fn hook(quiet: bool) -> Option<weft_engine::ProgressHook> {
        (!quiet && std::io::stderr().is_terminal())
            .then(|| weft_engine::ProgressHook(Arc::new(TermProgress::default())))
    }
}

impl weft_engine::Progress for TermProgress {
    fn begin(&self, what: &str, total: u64) {
        let bar = if total == 0 {
            let b = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
            b.set_style(
                ProgressStyle::with_template("{spinner} weft: {msg} {elapsed}")
                    .unwrap_or_else(|_| ProgressStyle::default_spinner()),
            );
            b.enable_steady_tick(Duration::from_millis(100));
            b
        } else {
            let b = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
            b.set_style(
                ProgressStyle::with_template("weft: {msg} [{bar:30}] {percent}% {elapsed}")
                    .unwrap_or_else(|_| ProgressStyle::default_bar())
                    .progress_chars("=> "),
            );
            b
        };
        bar.set_message(what.to_string());
        if let Some(old) = self
            .bar
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .replace(bar)
        {
            old.finish_and_clear();
        }
    }

    fn advance(&self, n: u64) {
        if let Some(b) = self.bar.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
            b.inc(n);
        }
    }

    fn end(&self) {
        if let Some(b) = self.bar.lock().unwrap_or_else(|e| e.into_inner()).take() {
            b.finish_and_clear();
        }
    }
}
