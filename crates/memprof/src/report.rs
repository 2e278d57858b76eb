//! From a [`Dump`] to what `weft memprof` prints and writes: per-site totals, the
//! hottest objects, DHAT's JSON (`dhatFileVersion` 2, what `dh_view.html` opens)
//! and weft's own JSON with every object.

use std::collections::HashMap;
use std::fmt::Write as _;

use serde_json::{json, Value};
use weft_symbols::{ProcMaps, Symbolizer};

use crate::dump::{Dump, Object};

/// Per allocation site.
#[derive(Clone, Debug, Default)]
pub struct SiteStats {
    pub index: u32,
    /// The frames, symbolized: `function+0xOFF (module)`, innermost first.
    pub frames: Vec<String>,
    /// The function of the first frame that is not an allocation wrapper
    /// (`operator new`), or `?`.
    pub label: String,
    pub objects: u64,
    /// The objects' sizes summed (each at its largest, for realloc'ed ones).
    pub bytes: u64,
    pub peak_bytes: u64,
    pub peak_objects: u64,
    pub at_gmax_bytes: u64,
    pub at_gmax_objects: u64,
    pub at_end_bytes: u64,
    pub at_end_objects: u64,
    pub reads: u64,
    pub writes: u64,
    pub read_bytes: u64,
    pub write_bytes: u64,
    /// Lifetimes summed, ns (objects alive at the end live until the end).
    pub lifetimes: u64,
}

impl SiteStats {
    pub fn accesses(&self) -> u64 {
        self.reads + self.writes
    }
    pub fn per_byte(&self) -> f64 {
        if self.bytes == 0 {
            0.0
        } else {
            self.accesses() as f64 / self.bytes as f64
        }
    }
    pub fn mean_lifetime(&self) -> u64 {
        self.lifetimes.checked_div(self.objects).unwrap_or(0)
    }
}

/// A dump, analysed.
pub struct Profile {
    pub dump: Dump,
    /// Sorted by accesses, then bytes (descending).
    pub sites: Vec<SiteStats>,
    /// Site table index → position in `sites`.
    pub site_pos: HashMap<u32, usize>,
    /// Time of the global peak of live bytes (ns since start) and that peak.
    pub t_gmax: u64,
    pub gmax_bytes: u64,
    pub command: String,
    pub pid: u32,
}

fn lifetime(o: &Object, t_end: u64) -> u64 {
    let end = if o.freed() { o.t_free } else { t_end };
    end.saturating_sub(o.t_alloc)
}

/// Strips allocation wrappers off a frame's name (C++ `operator new` variants).
fn is_wrapper(name: &str) -> bool {
    name.starts_with("operator new") || name.starts_with("_Zn")
}

impl Profile {
    pub fn new(mut dump: Dump, command: String, pid: u32) -> Profile {
        dump.objects.retain(|o| o.t_alloc != 0);
        let modules = ProcMaps::parse(&dump.maps)
            .map(|m| m.modules())
            .unwrap_or_default();
        let mut sym = Symbolizer::new(modules);
        let mut sites: Vec<SiteStats> = Vec::new();
        let mut site_pos = HashMap::new();
        // Site 0: the site table was full, or the stack could not be taken.
        let unknown = std::iter::once(crate::dump::Site {
            index: 0,
            pcs: Vec::new(),
        });
        for s in unknown.chain(dump.sites.iter().cloned()) {
            let mut frames = Vec::new();
            let mut label = None;
            for &pc in &s.pcs {
                // A return address: the call is the byte before.
                let (text, func) = match sym.symbolize(pc.wrapping_sub(1)) {
                    Some(sy) => {
                        let module = sy
                            .module
                            .file_name()
                            .map(|f| f.to_string_lossy().into_owned())
                            .unwrap_or_default();
                        let func = sy.demangled.clone().or(sy.name.clone());
                        let text = match &func {
                            Some(f) => format!("{f}+{:#x} ({module})", sy.offset + 1),
                            None => format!("{pc:#x} ({module})"),
                        };
                        (text, func)
                    }
                    None => (format!("{pc:#x}"), None),
                };
                if label.is_none() {
                    if let Some(f) = &func {
                        if !is_wrapper(f) {
                            label = Some(f.clone());
                        }
                    }
                }
                frames.push(text);
            }
            site_pos.insert(s.index, sites.len());
            sites.push(SiteStats {
                index: s.index,
                frames,
                label: label.unwrap_or_else(|| {
                    if s.index == 0 {
                        "(unknown site)".into()
                    } else {
                        "?".into()
                    }
                }),
                ..SiteStats::default()
            });
        }
        let t0 = dump.t_start;
        let t_end = dump.t_end;
        // Events for the peaks: (time, site position, +/- bytes).
        let mut events: Vec<(u64, usize, i64)> = Vec::new();
        for o in &dump.objects {
            let Some(&p) = site_pos.get(&o.site) else {
                continue;
            };
            let s = &mut sites[p];
            s.objects += 1;
            s.bytes += o.max_size;
            s.reads += o.reads;
            s.writes += o.writes;
            s.read_bytes += o.read_bytes;
            s.write_bytes += o.write_bytes;
            s.lifetimes += lifetime(o, t_end);
            if !o.freed() {
                s.at_end_bytes += o.size;
                s.at_end_objects += 1;
            }
            events.push((o.t_alloc, p, o.max_size as i64));
            if o.freed() {
                events.push((o.t_free, p, -(o.max_size as i64)));
            }
        }
        // Frees before allocations at the same instant.
        events.sort_by_key(|&(t, _, d)| (t, d));
        let mut live = vec![(0i64, 0i64); sites.len()];
        let (mut total, mut gmax, mut t_gmax) = (0i64, 0i64, 0u64);
        for &(t, p, d) in &events {
            live[p].0 += d;
            live[p].1 += d.signum();
            total += d;
            let s = &mut sites[p];
            s.peak_bytes = s.peak_bytes.max(live[p].0 as u64);
            s.peak_objects = s.peak_objects.max(live[p].1 as u64);
            if total > gmax {
                gmax = total;
                t_gmax = t;
            }
        }
        // Live at the global peak: allocated at or before it, not freed by then.
        for o in &dump.objects {
            if o.t_alloc <= t_gmax && (!o.freed() || o.t_free > t_gmax) {
                if let Some(&p) = site_pos.get(&o.site) {
                    sites[p].at_gmax_bytes += o.max_size;
                    sites[p].at_gmax_objects += 1;
                }
            }
        }
        let mut order: Vec<usize> = (0..sites.len()).collect();
        order.retain(|&i| sites[i].objects > 0);
        order.sort_by(|&a, &b| {
            let (x, y) = (&sites[a], &sites[b]);
            y.accesses()
                .cmp(&x.accesses())
                .then(y.bytes.cmp(&x.bytes))
                .then(x.index.cmp(&y.index))
        });
        let sites: Vec<SiteStats> = order.into_iter().map(|i| sites[i].clone()).collect();
        let site_pos = sites
            .iter()
            .enumerate()
            .map(|(i, s)| (s.index, i))
            .collect();
        Profile {
            dump,
            sites,
            site_pos,
            t_gmax: t_gmax.saturating_sub(t0),
            gmax_bytes: gmax as u64,
            command,
            pid,
        }
    }

    pub fn site(&self, index: u32) -> Option<&SiteStats> {
        self.site_pos.get(&index).map(|&i| &self.sites[i])
    }

    /// Objects by accesses (descending), then id.
    pub fn hottest(&self) -> Vec<&Object> {
        let mut v: Vec<&Object> = self.dump.objects.iter().collect();
        v.sort_by(|a, b| b.accesses().cmp(&a.accesses()).then(a.id.cmp(&b.id)));
        v
    }

    fn mode(&self) -> String {
        if self.dump.sampled {
            format!(
                "sampled ({} samples, {} on objects, {} single steps, {} threads not sampled; \
                 reads and writes are samples: accesses seen at instants spread evenly over each \
                 thread's CPU time, so they rank objects by accesses weighted by their cost, they \
                 do not count them)",
                self.dump.samples,
                self.dump.sample_hits,
                self.dump.sample_steps,
                self.dump.sample_lost
            )
        } else {
            "counted (exact: compiler access hooks, memcpy/memmove/memset)".into()
        }
    }

    /// The report `weft memprof` prints at the target's exit.
    pub fn text(&self, top: usize) -> String {
        let d = &self.dump;
        let mut out = String::new();
        let freed = d.objects.iter().filter(|o| o.freed()).count();
        let bytes: u64 = d.objects.iter().map(|o| o.max_size).sum();
        let _ = writeln!(
            out,
            "weft memprof: {} objects ({} freed), {} bytes, {} sites, peak {} bytes live; {} ms",
            d.objects.len(),
            freed,
            bytes,
            self.sites.len(),
            self.gmax_bytes,
            d.t_end.saturating_sub(d.t_start) / 1_000_000
        );
        let _ = writeln!(out, "mode: {}", self.mode());
        let _ = writeln!(
            out,
            "stacks: {}",
            if d.unwound {
                "unwound (backtrace)"
            } else {
                "frame pointers"
            }
        );
        if d.dropped > 0 {
            let _ = writeln!(
                out,
                "warning: {} objects not tracked: the object table is full (raise --max-objects)",
                d.dropped
            );
        }
        if d.sites_dropped > 0 {
            let _ = writeln!(
                out,
                "warning: {} allocations have no site: the site table is full",
                d.sites_dropped
            );
        }
        let _ = writeln!(out, "\nTop allocation sites:");
        let _ = writeln!(
            out,
            "{:<28} {:>8} {:>10} {:>10} {:>12} {:>12} {:>9} {:>12}",
            "SITE", "OBJECTS", "BYTES", "PEAK", "READS", "WRITES", "ACC/BYTE", "LIFETIME"
        );
        for s in self.sites.iter().take(top) {
            let _ = writeln!(
                out,
                "{:<28} {:>8} {:>10} {:>10} {:>12} {:>12} {:>9.2} {:>12}",
                s.label,
                s.objects,
                s.bytes,
                s.peak_bytes,
                s.reads,
                s.writes,
                s.per_byte(),
                duration(s.mean_lifetime())
            );
            for f in s.frames.iter().take(4) {
                let _ = writeln!(out, "    {f}");
            }
        }
        let _ = writeln!(out, "\nHottest objects:");
        let _ = writeln!(
            out,
            "{:>8} {:<28} {:>10} {:>12} {:>12} {:>9}",
            "ID", "SITE", "SIZE", "READS", "WRITES", "REALLOCS"
        );
        for o in self.hottest().into_iter().take(top) {
            let label = self.site(o.site).map_or("?", |s| s.label.as_str());
            let _ = writeln!(
                out,
                "{:>8} {:<28} {:>10} {:>12} {:>12} {:>9}",
                o.id, label, o.size, o.reads, o.writes, o.reallocs
            );
        }
        out
    }

    /// weft's own JSON: every site and every object.
    pub fn json(&self) -> Value {
        let d = &self.dump;
        let sites: Vec<Value> = self
            .sites
            .iter()
            .map(|s| {
                json!({
                    "site": s.index, "label": s.label, "frames": s.frames,
                    "objects": s.objects, "bytes": s.bytes, "peak_bytes": s.peak_bytes,
                    "peak_objects": s.peak_objects, "reads": s.reads, "writes": s.writes,
                    "read_bytes": s.read_bytes, "write_bytes": s.write_bytes,
                    "accesses_per_byte": s.per_byte(), "mean_lifetime_ns": s.mean_lifetime(),
                })
            })
            .collect();
        let objects: Vec<Value> = d
            .objects
            .iter()
            .map(|o| {
                json!({
                    "id": o.id, "site": o.site,
                    "label": self.site(o.site).map_or("?", |s| s.label.as_str()),
                    "address": format!("{:#x}", o.base), "size": o.size,
                    "max_size": o.max_size, "reallocs": o.reallocs, "tid": o.tid,
                    "alloc_ns": o.t_alloc.saturating_sub(d.t_start),
                    "free_ns": if o.freed() { Some(o.t_free.saturating_sub(d.t_start)) } else { None },
                    "reads": o.reads, "writes": o.writes,
                    "read_bytes": o.read_bytes, "write_bytes": o.write_bytes,
                })
            })
            .collect();
        json!({
            "weftMemprofVersion": 1,
            "mode": if d.sampled { "sampled" } else { "counted" },
            "cmd": self.command, "pid": self.pid,
            "duration_ns": d.t_end.saturating_sub(d.t_start),
            "dropped_objects": d.dropped,
            "stacks": if d.unwound { "unwind" } else { "fp" },
            "sample": { "samples": d.samples, "hits": d.sample_hits, "steps": d.sample_steps, "lost": d.sample_lost },
            "sites": sites,
            "objects": objects,
        })
    }

    /// DHAT's heap-mode JSON (`dhatFileVersion` 2), for Valgrind's `dh_view.html`.
    /// Time unit: microseconds. Each site is a program point; its frames go to the
    /// frame table (`ftbl[0]` is DHAT's `[root]`).
    pub fn dhat(&self) -> Value {
        let d = &self.dump;
        let us = |ns: u64| ns / 1000;
        let mut ftbl: Vec<String> = vec!["[root]".into()];
        let mut fidx: HashMap<String, usize> = HashMap::new();
        let mut pps = Vec::new();
        for s in &self.sites {
            let mut fs = Vec::new();
            let frames = if s.frames.is_empty() {
                vec![s.label.clone()]
            } else {
                s.frames.clone()
            };
            for f in frames {
                let i = *fidx.entry(f.clone()).or_insert_with(|| {
                    ftbl.push(f);
                    ftbl.len() - 1
                });
                fs.push(i);
            }
            pps.push(json!({
                "tb": s.bytes, "tbk": s.objects, "tl": us(s.lifetimes),
                "mb": s.peak_bytes, "mbk": s.peak_objects,
                "gb": s.at_gmax_bytes, "gbk": s.at_gmax_objects,
                "eb": s.at_end_bytes, "ebk": s.at_end_objects,
                "rb": s.read_bytes, "wb": s.write_bytes,
                "fs": fs,
            }));
        }
        json!({
            "dhatFileVersion": 2,
            "mode": "heap",
            "verb": "Allocated",
            "bklt": true,
            "bkacc": true,
            "tu": "µs",
            "Mtu": "s",
            "tuth": 500,
            "cmd": self.command,
            "pid": self.pid,
            "tg": us(self.t_gmax),
            "te": us(d.t_end.saturating_sub(d.t_start)),
            "pps": pps,
            "ftbl": ftbl,
        })
    }
}

fn duration(ns: u64) -> String {
    if ns >= 1_000_000_000 {
        format!("{:.2}s", ns as f64 / 1e9)
    } else if ns >= 1_000_000 {
        format!("{:.2}ms", ns as f64 / 1e6)
    } else if ns >= 1_000 {
        format!("{:.2}us", ns as f64 / 1e3)
    } else {
        format!("{ns}ns")
    }
}
