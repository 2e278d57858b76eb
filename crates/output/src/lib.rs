//! Formats what weft prints — `printf`, maps, `hist`/`lhist`/`stats`, values, stacks —
//! byte for byte as **bpftrace v0.17.0** prints them, as text or as JSON (NDJSON).
//!
//! Pure: values come in as bytes in the [`weft_ir`] layouts (already merged across
//! threads), output goes out as bytes. Nothing here reads files or talks to a process;
//! symbols and probe names come from the caller through [`Resolver`].
//!
//! Output is `Vec<u8>`, not `String`: strings read from a target need not be UTF-8 and
//! bpftrace writes their bytes unchanged.
//!
//! Where this crate reproduces a bpftrace 0.17 quirk on purpose, the code says so with
//! a `bpftrace 0.17:` comment; where newer bpftrace differs, the comment says that too.
//!
//! Layout of the crate:
//! * `value`: [`decode`] bytes of a [`Type`] into a [`Value`].
//! * `printf`: bpftrace's format-string splitting and a glibc-compatible `snprintf`
//!   for one argument ([`format_printf`]); [`validate_printf`] for the checker.
//! * `render`: one value or map key as text or JSON; [`print_value`].
//! * `maps`: which entries of a map are printed, in which order (bpftrace's sorting,
//!   `top`, `div`): [`print_map`], [`exit_order`]. Its module docs list the rules.
//! * `hist`: `hist`/`lhist` ASCII art and JSON bucket lists.
//! * [`json`]: one function per NDJSON record kind.
//! * [`time`]: `strftime()` values and `time()` events.
//! * `sort`: libstdc++'s `std::sort`, whose tie order bpftrace's output shows.
//! * `tseries`: `tseries()` graphs and JSON lists, as upstream bpftrace prints them
//!   (0.17 has no `tseries`).
//!
//! A session in text mode prints [`attached_line`] (on stderr), then events as they come
//! ([`format_printf`], [`print_value`], [`print_map`], [`time::time_text`], ...), then at
//! exit [`exit_header`] and every map in [`exit_order`]. With `-f json` the same
//! sequence uses the [`json`] functions (the exit header is still two bare newlines).

pub mod json;
pub mod time;

mod hist;
mod maps;
mod printf;
mod render;
mod sort;
mod tseries;
mod value;

pub use maps::{exit_header, exit_order, print_map, print_map_json};
pub use printf::{format_printf, format_text, validate_format, validate_printf};
pub use render::print_value;

/// A map entry's key as one text per field (one for a single key, one per
/// element of a tuple key), each as bpftrace prints it inside `@m[...]`: for
/// exporters that label a value with its key.
pub fn key_strings(key_ty: &weft_ir::Type, key_bytes: &[u8], r: &dyn Resolver) -> Vec<String> {
    render::key_fields(key_ty, key_bytes, r)
        .into_iter()
        .map(|f| String::from_utf8_lossy(&f).into_owned())
        .collect()
}
pub use value::{decode, Value};

use weft_ir::{FmtId, Format};

#[cfg(doc)]
use weft_ir::Type;

/// A resolved code address in the target.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Symbol {
    /// Symbol name, demangled if the caller wants it demangled.
    pub name: String,
    /// `addr - symbol start`.
    pub offset: u64,
    /// Path of the module (executable or library) the address is in; shown by
    /// `ustack(perf)`.
    pub module: String,
}

/// What the printer needs to know about the running session. Implemented by the driver.
pub trait Resolver {
    /// Symbolize a code address in the target; `None` when no symbol covers it
    /// (bpftrace then prints the address in hex).
    fn usym(&self, addr: u64) -> Option<Symbol>;
    /// Full name of probe `id` (an index into `Program::probe_names`).
    fn probe_name(&self, id: u64) -> String;
    /// The format string `id` (`strftime` formats of [`Type::Timestamp`] values).
    fn format(&self, id: FmtId) -> Option<&Format>;
    /// Stacks show source lines (config `show_debug_info`).
    fn show_debug_info(&self) -> bool {
        false
    }
    /// The source-level frames at a code address, from its module's DWARF: the
    /// functions inlined there (innermost first), then the function holding the
    /// code; empty without DWARF.
    fn source_frames(&self, _addr: u64) -> Vec<SourceFrame> {
        Vec::new()
    }
}

/// One source-level frame of a code address (see [`Resolver::source_frames`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SourceFrame {
    /// The function's name (demangled when it can be).
    pub function: Option<String>,
    /// `dir/file:line`, when DWARF has it.
    pub file: Option<String>,
    pub line: Option<u32>,
    /// Inlined into the next frame.
    pub inlined: bool,
}

/// `Attached N probe(s)\n`, upstream bpftrace's line ("probe" for exactly one; on
/// stderr, `src/output/text.cpp`). bpftrace 0.17 printed `Attaching N probes...` on
/// stdout instead.
pub fn attached_line(n: u64) -> String {
    if n == 1 {
        format!("Attached {n} probe\n")
    } else {
        format!("Attached {n} probes\n")
    }
}

/// `Woven N call site(s)\n`: weft's line after [`attached_line`] when `call:` probes
/// rewrote N calls (on stderr, like it).
pub fn call_sites_line(n: u64) -> String {
    if n == 1 {
        format!("Woven {n} call site\n")
    } else {
        format!("Woven {n} call sites\n")
    }
}

/// `Lost N events\n`, printed when events were dropped.
pub fn lost_events_line(n: u64) -> String {
    format!("Lost {n} events\n")
}

/// Text output of `join(array, sep)`: the strings joined, then a newline (bpftrace stops
/// at the first empty string).
pub fn join_line(parts: &[Vec<u8>], sep: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    for (i, p) in parts.iter().enumerate() {
        if p.is_empty() {
            break;
        }
        if i > 0 {
            out.extend_from_slice(sep);
        }
        out.extend_from_slice(p);
    }
    out.push(b'\n');
    out
}
