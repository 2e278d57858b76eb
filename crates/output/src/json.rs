//! `-f json`: one function per NDJSON record kind, each returning one line.
//!
//! Records are written as bpftrace 0.17 writes them, where upstream did not change
//! them (`attached_probes`/`lost_events` gained a `count`): `{"type": "KIND", "data": ...}`
//! with a space after each colon and comma, strings escaped by bpftrace's own escaper
//! (bytes >= 0x80 come out as `\uffffffNN`).

use weft_ir::{MapDecl, Type};

use crate::render::{self, json_escape, Style};
use crate::value::decode;
use crate::Resolver;

/// `{"type": "attached_probes", "count": N, "data": {"probes": N}}`: upstream's record
/// (its `src/output/json.cpp`; 0.17 had no `count`).
pub fn attached_probes(n: u64) -> Vec<u8> {
    format!("{{\"type\": \"attached_probes\", \"count\": {n}, \"data\": {{\"probes\": {n}}}}}\n")
        .into_bytes()
}

/// `{"type": "call_sites", "count": N, "data": {"sites": N}}`: weft's record after
/// `attached_probes` when `call:` probes rewrote N calls (shaped like it).
pub fn call_sites(n: u64) -> Vec<u8> {
    format!("{{\"type\": \"call_sites\", \"count\": {n}, \"data\": {{\"sites\": {n}}}}}\n")
        .into_bytes()
}

/// `{"type": "lost_events", "count": N, "data": {"events": N}}` (upstream, as
/// [`attached_probes`]).
pub fn lost_events(n: u64) -> Vec<u8> {
    format!("{{\"type\": \"lost_events\", \"count\": {n}, \"data\": {{\"events\": {n}}}}}\n")
        .into_bytes()
}

/// `{"type": "printf", "data": "..."}` for the output of [`crate::format_printf`].
pub fn printf(text: &[u8]) -> Vec<u8> {
    message("printf", text)
}

/// `{"type": "time", "data": "..."}` for the output of [`crate::time::time_text`].
pub fn time(text: &[u8]) -> Vec<u8> {
    message("time", text)
}

/// `{"type": "cat", "data": "..."}`: the bytes `cat()` read.
pub fn cat(text: &[u8]) -> Vec<u8> {
    message("cat", text)
}

/// `{"type": "syscall", "data": "..."}`: the output of a `system()` command.
pub fn system(text: &[u8]) -> Vec<u8> {
    message("syscall", text)
}

/// `{"type": "join", "data": "..."}`: the strings joined by `sep` (up to the first
/// empty one).
pub fn join(parts: &[Vec<u8>], sep: &[u8]) -> Vec<u8> {
    let mut line = crate::join_line(parts, sep);
    line.pop();
    message("join", &line)
}

/// `{"type": "value", "data": ...}` for `print(value)`.
pub fn value(ty: &Type, bytes: &[u8], r: &dyn Resolver) -> Vec<u8> {
    let mut out = b"{\"type\": \"value\", \"data\": ".to_vec();
    out.extend_from_slice(&render::value_str(
        Style::Json,
        ty,
        &decode(ty, bytes),
        1,
        r,
    ));
    out.extend_from_slice(b"}\n");
    out
}

/// A map (`"map"`, `"hist"` or `"stats"` record); empty when the map is. Same
/// arguments as [`crate::print_map`].
pub fn map(
    decl: &MapDecl,
    entries: &[(Vec<u8>, Vec<u8>)],
    top: u32,
    div: u32,
    r: &dyn Resolver,
) -> Vec<u8> {
    crate::maps::print_map_json(decl, entries, top, div, r)
}

/// `{"type": "KIND", "data": "..."}` with `text` escaped.
/// `{"type": "errorf", "msg": "...", "filename": "stdin", "line": 1, "col": 9}`:
/// an `errorf`/`warnf` message as upstream's JSON output writes it.
pub fn located(kind: &str, text: &[u8], file: &str, line: u32, col: u32) -> Vec<u8> {
    let mut out = format!("{{\"type\": \"{kind}\", \"msg\": \"").into_bytes();
    out.extend_from_slice(&json_escape(text));
    out.extend_from_slice(b"\", \"filename\": \"");
    out.extend_from_slice(&json_escape(file.as_bytes()));
    out.extend_from_slice(format!("\", \"line\": {line}, \"col\": {col}}}\n").as_bytes());
    out
}

pub fn message(kind: &str, text: &[u8]) -> Vec<u8> {
    let mut out = format!("{{\"type\": \"{kind}\", \"data\": \"").into_bytes();
    out.extend_from_slice(&json_escape(text));
    out.extend_from_slice(b"\"}\n");
    out
}
