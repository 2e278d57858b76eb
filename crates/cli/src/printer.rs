//! Draining event rings and printing: events in time order, maps merged across
//! threads, all through `weft-output` so the text is bpftrace's.

use std::cell::RefCell;
use std::io::{Read, Write};
use std::sync::atomic::Ordering;

use weft_abi::*;
use weft_ir::{FmtId, Format, MapValue, Program};
use weft_output::{Resolver, Symbol};
use weft_runtime::map;
use weft_runtime::ring::{self, Event};
use weft_runtime::shm::Shm;
use weft_runtime::slots;
use weft_symbols::Symbolizer;

/// Symbolizes target addresses and names probes for the printer.
pub struct SessionResolver {
    pub symbolizer: RefCell<Option<Symbolizer>>,
    pub probe_names: Vec<String>,
    pub formats: Vec<Format>,
}

impl Resolver for SessionResolver {
    fn usym(&self, addr: u64) -> Option<Symbol> {
        let mut s = self.symbolizer.borrow_mut();
        let s = s.as_mut()?;
        let sym = s.symbolize(addr)?;
        Some(Symbol {
            name: sym.demangled.or(sym.name)?,
            offset: sym.offset,
            module: sym.module.display().to_string(),
        })
    }

    fn probe_name(&self, id: u64) -> String {
        self.probe_names
            .get(id as usize)
            .cloned()
            .unwrap_or_else(|| format!("probe{id}"))
    }

    fn format(&self, id: FmtId) -> Option<&Format> {
        self.formats.get(id.0 as usize)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OutputFormat {
    Text,
    Json,
}

pub struct Printer<'a> {
    pub out: Box<dyn Write + 'a>,
    pub format: OutputFormat,
    pub prog: &'a Program,
    pub resolver: SessionResolver,
    /// Set once an `exit()` event has been seen: later events are dropped.
    pub exited: bool,
    /// `system()` allowed (`--unsafe`).
    pub unsafe_ok: bool,
}

impl<'a> Printer<'a> {
    /// Drain every thread's ring and handle the events in time order. Then the slots
    /// of threads that were gone before this drain began (their rings are now empty
    /// for good) are folded into the retired slot and freed for new threads.
    pub fn drain(&mut self, shm: &Shm) {
        let dead = slots::dead(shm);
        let mut events: Vec<Event> = Vec::new();
        let h = shm.header();
        for t in 0..shm.slots_used() {
            let slot = shm.thread_slot(t);
            // SAFETY: slot t was handed out; weft is the only consumer of its ring.
            unsafe { ring::consume(slot, shm.ring(slot), h.ring_size, &mut events) };
        }
        events.sort_by_key(|e| e.header.nsecs);
        for e in &events {
            if self.exited {
                break;
            }
            self.event(e, shm);
        }
        let _ = self.out.flush();
        slots::retire(shm, &dead);
    }

    fn event(&mut self, e: &Event, shm: &Shm) {
        let h = &e.header;
        let fmt = |id: u32| self.prog.formats.get(id as usize);
        match h.kind {
            EVENT_PRINTF => {
                if let Some(f) = fmt(h.id) {
                    let text =
                        weft_output::format_printf(&f.text, &f.args, &e.payload, &self.resolver);
                    match self.format {
                        OutputFormat::Text => {
                            let _ = self.out.write_all(&text);
                        }
                        OutputFormat::Json => {
                            let _ = self.out.write_all(&weft_output::json::printf(&text));
                        }
                    }
                }
            }
            EVENT_CAT | EVENT_SYSTEM => {
                if let Some(f) = fmt(h.id) {
                    let arg =
                        weft_output::format_printf(&f.text, &f.args, &e.payload, &self.resolver);
                    let arg = String::from_utf8_lossy(&arg).into_owned();
                    if h.kind == EVENT_CAT {
                        // At most max_cat_bytes, as bpftrace: `cat("/dev/zero")` or a
                        // growing log must not grow weft.
                        let max = u64::from(self.prog.config.max_cat_bytes);
                        let mut bytes = Vec::new();
                        match std::fs::File::open(&arg)
                            .and_then(|f| f.take(max).read_to_end(&mut bytes))
                        {
                            Ok(_) => {
                                let _ = self.out.write_all(&bytes);
                            }
                            Err(err) => eprintln!("weft: cat {arg}: {err}"),
                        }
                    } else if self.unsafe_ok {
                        let _ = self.out.flush();
                        if let Ok(o) = std::process::Command::new("/bin/sh")
                            .arg("-c")
                            .arg(&arg)
                            .output()
                        {
                            let _ = self.out.write_all(&o.stdout);
                        }
                    }
                }
            }
            EVENT_TIME => {
                if let Some(f) = fmt(h.id) {
                    let secs = std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .map_or(0, |d| d.as_secs() as i64);
                    if let Some(text) = weft_output::time::time_text(f.text.as_bytes(), secs) {
                        let _ = self.out.write_all(&text);
                    }
                }
            }
            EVENT_JOIN => {
                if let Some(f) = fmt(h.id) {
                    let parts = join_parts(&f.args, &e.payload);
                    let _ = self
                        .out
                        .write_all(&weft_output::join_line(&parts, f.text.as_bytes()));
                }
            }
            EVENT_PRINT_VALUE => {
                if let Some(f) = fmt(h.id) {
                    if let Some(ty) = f.args.first() {
                        let text = match self.format {
                            // The value and its newline.
                            OutputFormat::Text => {
                                weft_output::print_value(ty, &e.payload, &self.resolver)
                            }
                            OutputFormat::Json => {
                                weft_output::json::value(ty, &e.payload, &self.resolver)
                            }
                        };
                        let _ = self.out.write_all(&text);
                    }
                }
            }
            EVENT_PRINT_MAP => self.print_map(shm, h.id, h.arg0, h.arg1),
            EVENT_CLEAR_MAP if h.id < shm.map_count() => map::clear(shm, shm.map(h.id)),
            EVENT_ZERO_MAP if h.id < shm.map_count() => map::zero(shm, shm.map(h.id)),
            EVENT_EXIT => self.exited = true,
            _ => {}
        }
    }

    /// Merged entries of a map: `(key bytes, value bytes)`.
    pub fn entries(&self, shm: &Shm, id: u32) -> Vec<(Vec<u8>, Vec<u8>)> {
        let d = shm.map(id);
        let plain = matches!(self.prog.maps[id as usize].value, MapValue::Plain(_));
        map::live_entries(shm, d)
            .into_iter()
            .map(|i| {
                let key = map::key_bytes(shm, d, i).to_vec();
                let mut value = vec![0u8; d.value_size as usize];
                if plain {
                    let v = map::plain_value_ptr(shm, d, i);
                    // SAFETY: the entry's value holds value_size bytes.
                    unsafe { std::ptr::copy_nonoverlapping(v, value.as_mut_ptr(), value.len()) };
                } else {
                    map::merge(shm, d, i, &mut value);
                }
                (key, value)
            })
            .collect()
    }

    pub fn print_map(&mut self, shm: &Shm, id: u32, top: u32, div: u32) {
        let Some(decl) = self.prog.maps.get(id as usize) else {
            return;
        };
        let entries = self.entries(shm, id);
        let text = match self.format {
            OutputFormat::Text => weft_output::print_map(decl, &entries, top, div, &self.resolver),
            OutputFormat::Json => {
                weft_output::print_map_json(decl, &entries, top, div, &self.resolver)
            }
        };
        let _ = self.out.write_all(&text);
        let _ = self.out.flush();
    }

    /// Every map, as bpftrace prints them when it exits: the exit header (also
    /// when there is no map, and also with `-f json`), then each map in bpftrace's order.
    pub fn print_all(&mut self, shm: &Shm) {
        let _ = self.out.write_all(weft_output::exit_header().as_bytes());
        for i in weft_output::exit_order(&self.prog.maps) {
            // Empty maps too: bpftrace prints their newline (and `@x: 0` for a
            // scalar count()).
            self.print_map(shm, i as u32, 0, 0);
        }
    }
}

/// Totals of everything advice could not do, summed over threads (those whose slots
/// were reused included: the retired slot holds their counts).
#[derive(Debug, Default)]
pub struct Losses {
    pub errors: [u64; ERROR_KINDS],
    pub events_lost: u64,
    /// Hits on threads beyond the live-thread limit (`max_live` of them).
    pub threads_dropped: u64,
    pub max_live: u32,
    /// Hits on threads the agent had no state for (its pool was exhausted).
    pub pool_dropped: u64,
    pub map_full: Vec<(String, u64)>,
}

pub fn losses(shm: &Shm, prog: &Program) -> Losses {
    let mut l = Losses::default();
    for t in 0..shm.slots_used() {
        // SAFETY: slots below slots_used are valid.
        let s = unsafe { &*shm.thread_slot(t) };
        for (k, e) in s.errors.iter().enumerate() {
            l.errors[k] += e.load(Ordering::Relaxed);
        }
        l.events_lost += s.events_lost.load(Ordering::Relaxed);
    }
    let h = shm.header();
    l.threads_dropped = h.threads_dropped.load(Ordering::Relaxed);
    l.max_live = h.max_live;
    l.pool_dropped = h.pool_dropped.load(Ordering::Relaxed);
    for (i, m) in prog.maps.iter().enumerate() {
        let n = shm.map(i as u32).full_drops.load(Ordering::Relaxed);
        if n > 0 {
            l.map_full.push((m.name.clone(), n));
        }
    }
    l
}

impl Losses {
    /// One line per kind of loss, for stderr.
    pub fn report(&self) -> Vec<String> {
        let mut v = Vec::new();
        let names = [
            "reads of target memory faulted (str, buf, pointer or field reads); their values are zero or truncated",
            "divisions by zero (results are 0)",
            "map updates dropped because a map was full",
            "loops stopped at their iteration bound",
            "events dropped because a ring was full",
        ];
        for (k, n) in self.errors.iter().enumerate() {
            if *n > 0 && k < names.len() && k != 2 && k != 4 {
                v.push(format!("weft: {n} {}", names[k]));
            }
        }
        for (m, n) in &self.map_full {
            v.push(format!("weft: map {m} is full: {n} updates dropped (raise the limit with config = {{ max_map_keys = N }})"));
        }
        if self.threads_dropped > 0 {
            v.push(format!(
                "weft: {} probe hits ran no advice: more than {} threads were running advice at once (raise the limit with --max-threads N)",
                self.threads_dropped, self.max_live
            ));
        }
        if self.pool_dropped > 0 {
            v.push(format!(
                "weft: {} probe hits ran no advice: the agent's per-thread state was exhausted (more than {} threads at once)",
                self.pool_dropped, AGENT_POOL_THREADS
            ));
        }
        v
    }
}

/// The strings of a `join()` payload (a tuple of strings).
fn join_parts(args: &[weft_ir::Type], payload: &[u8]) -> Vec<Vec<u8>> {
    let tuple = weft_ir::Type::Tuple(args.to_vec());
    let offs = tuple.field_offsets();
    args.iter()
        .zip(offs)
        .map(|(t, off)| {
            let off = off as usize;
            let end = (off + t.size() as usize).min(payload.len());
            let field = payload.get(off..end).unwrap_or(&[]);
            let n = field.iter().position(|&b| b == 0).unwrap_or(field.len());
            field[..n].to_vec()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::segment::{Segment, Sizes};

    /// What `print_all` writes at exit for `program` when no probe has run.
    fn exit_text(program: &str, format: OutputFormat) -> String {
        let out = weft_lang::compile(program, "-e", &weft_lang::Options::default());
        let prog = out.program.expect("program compiles");
        let seg = Segment::create(&prog, Sizes::default(), 0).unwrap();
        let mut text = Vec::new();
        let mut p = Printer {
            out: Box::new(&mut text),
            format,
            prog: &prog,
            resolver: SessionResolver {
                symbolizer: RefCell::new(None),
                probe_names: prog.probe_names.clone(),
                formats: prog.formats.clone(),
            },
            exited: false,
            unsafe_ok: false,
        };
        p.print_all(&seg.shm);
        drop(p);
        String::from_utf8(text).unwrap()
    }

    /// bpftrace 0.17 prints the two newlines at exit also without maps (and with
    /// `-f json`), and prints every map, an empty one as its newline.
    #[test]
    fn exit_prints_the_header_and_empty_maps() {
        let t = OutputFormat::Text;
        assert_eq!(exit_text("BEGIN { exit(); }", t), "\n\n");
        assert_eq!(exit_text("BEGIN { exit(); }", OutputFormat::Json), "\n\n");
        assert_eq!(
            exit_text("BEGIN { @b[1] = 1; @a = count(); @s = stats(1); }", t),
            "\n\n@a: 0\n\n\n\n"
        );
    }
}
