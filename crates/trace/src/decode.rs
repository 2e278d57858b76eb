//! Records from the shared segment: the one place that reads the agent's rings.

use std::sync::atomic::Ordering;

use weft_abi::*;
use weft_ir::{MapValue, Program};
use weft_runtime::map;
use weft_runtime::ring;
use weft_runtime::shm::Shm;
use weft_runtime::slots;

use crate::event::{Event, MapSnapshot, Record};

/// Drains a session's rings into records.
#[derive(Debug, Default)]
pub struct Decoder {
    /// An `exit()` was seen: later events are dropped (until [`Decoder::resume`]).
    pub exited: bool,
    /// The code given to `exit(code)` (0 without one): weft's exit status.
    pub exit_code: i64,
    raw: Vec<(u32, u32, ring::Event)>,
    /// Threads seen holding a slot (pid, tid), for their lifecycle records.
    threads: std::collections::HashSet<(u32, u32)>,
    /// Events lost so far (reported as they grow).
    lost: u64,
    /// Functions named so far, by process.
    named: std::collections::HashSet<(u32, u64)>,
    /// `clear` (false) and `zero` (true) applied since the owner last took them:
    /// maps kept elsewhere too (the kernel's) follow them.
    pub cleared: Vec<(u32, bool)>,
    /// Deliver function entries and exits as one [`Event::Functions`] per thread and
    /// drain, the ring's bytes as they are (`weft record`: tens of millions a
    /// second), rather than a record each; each site is told of once, first.
    pub pack_functions: bool,
    /// Sites already told of with an [`Event::Site`] (packing).
    sites_told: u32,
    /// The segment's clock lines seen so far: TSC-timed function events are
    /// converted on them, or (packing) kept raw with an [`Event::Clock`] per line.
    lines: weft_runtime::clock::TscLines,
    /// (process, site) pairs entered so far (packing: [`Event::Functions`] names
    /// each once).
    entered: std::collections::HashSet<(u32, u32)>,
}

impl Decoder {
    /// Every complete event in every thread's ring, in time order, as records.
    /// `print(@m)` is snapshotted and `clear(@m)`/`zero(@m)` applied in that order,
    /// as advice asked; nothing after an `exit()` is delivered or applied. Then the
    /// slots of threads that were gone before this drain began (their rings are now
    /// empty for good) are folded into the retired slot and freed for new threads.
    pub fn drain(&mut self, shm: &Shm, prog: &Program) -> Vec<Record> {
        self.drain_with(shm, prog, &mut || {})
    }

    /// [`Decoder::drain`], calling `before_maps` once, before the first `print`,
    /// `clear` or `zero` of the drain reads or changes the maps (so that maps kept
    /// elsewhere too are brought up to date first).
    pub fn drain_with(
        &mut self,
        shm: &Shm,
        prog: &Program,
        before_maps: &mut dyn FnMut(),
    ) -> Vec<Record> {
        let mut maps_ready = false;
        let dead = slots::dead(shm);
        let h = shm.header();
        let now = weft_runtime::clock::now(shm.header());
        let mut lifecycle = Vec::new();
        let mut one = Vec::new();
        let mut packed_records = Vec::new();
        let mut told = Vec::new();
        let sites = h.site_count.load(Ordering::Acquire);
        let pack = self.pack_functions;
        // The clock's line now: weft recalibrates in the loop that drains, so
        // every raw time in the rings was read under a line seen by now.
        let line = weft_runtime::clock::TscLine::read(&h.clock);
        if self.lines.add(line) && pack {
            // Time 0, as sites: before every frame that may use it.
            told.push(Record {
                nsecs: 0,
                pid: 0,
                tid: 0,
                event: Event::Clock { line },
            });
        }
        let lines = &self.lines;
        if pack {
            // Sites first (time 0: a stable sort keeps them before everything).
            for id in self.sites_told..sites {
                let site = shm.site(id);
                told.push(Record {
                    nsecs: 0,
                    pid: 0,
                    tid: 0,
                    event: Event::Site {
                        id,
                        func: site.func,
                        name: site_name(&site.name),
                    },
                });
            }
            self.sites_told = sites;
        }
        for t in 0..shm.slots_used() {
            let slot = shm.thread_slot(t);
            // SAFETY: slot t was handed out; weft is the only consumer of its ring.
            let (pid, tid) = unsafe { ((*slot).pid, (*slot).tid) };
            let mut first_packed = None;
            let mut each = |hd: &weft_abi::EventHeader, payload: &[u8]| {
                one.push(ring::Event {
                    header: ring::timed(*hd, lines),
                    payload: payload.to_vec(),
                })
            };
            // SAFETY: as above.
            unsafe {
                if pack {
                    // What a run holds, counted in the same walk that finds it
                    // (the ring's words are in hand): its entries and exits, and
                    // the sites its process entered for the first time.
                    let counts = std::cell::Cell::new((0u64, 0u64));
                    let new_sites = std::cell::RefCell::new(Vec::new());
                    let entered = &mut self.entered;
                    let mut last = None;
                    let is_func = |kind: u32, id: u32| {
                        let (e, x) = counts.get();
                        match kind {
                            EVENT_FUNC_ENTRY | EVENT_FUNC_ENTRY_TSC if id < sites => {
                                counts.set((e + 1, x));
                                if last != Some(id) {
                                    last = Some(id);
                                    if entered.insert((pid, id)) {
                                        new_sites.borrow_mut().push(id);
                                    }
                                }
                                true
                            }
                            EVENT_FUNC_EXIT | EVENT_FUNC_EXIT_TSC if id < sites => {
                                counts.set((e, x + 1));
                                true
                            }
                            _ => false,
                        }
                    };
                    ring::consume_runs(
                        slot,
                        shm.ring(slot),
                        h.ring_size,
                        is_func,
                        |bytes| {
                            // The first record's time (a run holds whole records).
                            let at = ring::first_time(bytes, lines).unwrap_or(0);
                            first_packed.get_or_insert(at);
                            packed_records.push(Record {
                                nsecs: at,
                                pid,
                                tid,
                                event: Event::Functions {
                                    ring: bytes.to_vec(),
                                    entries: counts.get().0,
                                    exits: counts.replace((0, 0)).1,
                                    new_sites: new_sites.take(),
                                },
                            });
                        },
                        &mut each,
                    )
                } else {
                    ring::consume_each(slot, shm.ring(slot), h.ring_size, &mut each)
                }
            };
            if t >= FIRST_THREAD_SLOT && pid != 0 && self.threads.insert((pid, tid)) {
                // At its first event, if it has one yet.
                let first = one
                    .iter()
                    .map(|e| e.header.nsecs)
                    .chain(first_packed)
                    .min()
                    .unwrap_or(now);
                lifecycle.push(Record {
                    nsecs: first,
                    pid,
                    tid,
                    event: Event::ThreadStarted,
                });
            }
            self.raw.extend(one.drain(..).map(|e| (pid, tid, e)));
        }
        self.raw.sort_by_key(|(_, _, e)| e.header.nsecs);
        let mut out = told;
        out.append(&mut lifecycle);
        out.append(&mut packed_records);
        for (pid, tid, e) in self.raw.drain(..) {
            if self.exited {
                break;
            }
            let h = &e.header;
            if !maps_ready && matches!(h.kind, EVENT_PRINT_MAP | EVENT_CLEAR_MAP | EVENT_ZERO_MAP) {
                maps_ready = true;
                before_maps();
            }
            let event = match h.kind {
                EVENT_PRINTF => Event::Printf {
                    format: h.id,
                    args: e.payload,
                },
                EVENT_CAT => Event::Cat {
                    format: h.id,
                    args: e.payload,
                },
                EVENT_SYSTEM => Event::System {
                    format: h.id,
                    args: e.payload,
                },
                EVENT_TIME => Event::Time { format: h.id },
                EVENT_JOIN => Event::Join {
                    format: h.id,
                    args: e.payload,
                },
                EVENT_PRINT_VALUE => Event::Print {
                    format: h.id,
                    value: e.payload,
                },
                EVENT_PRINT_MAP if (h.id as usize) < prog.maps.len() => {
                    Event::Map(snapshot(shm, prog, h.id, h.arg0, h.arg1))
                }
                EVENT_CLEAR_MAP if h.id < shm.map_count() => {
                    map::clear(shm, shm.map(h.id));
                    self.cleared.push((h.id, false));
                    continue;
                }
                EVENT_ZERO_MAP if h.id < shm.map_count() => {
                    map::zero(shm, shm.map(h.id));
                    self.cleared.push((h.id, true));
                    continue;
                }
                EVENT_EXIT => {
                    self.exited = true;
                    if let Some(code) = e.payload.get(..8) {
                        self.exit_code = i64::from_le_bytes(code.try_into().unwrap_or([0; 8]));
                    }
                    Event::Exit
                }
                EVENT_FUNC_ENTRY | EVENT_FUNC_EXIT
                    if h.id < shm.header().site_count.load(Ordering::Acquire) =>
                {
                    let site = shm.site(h.id);
                    let func = site.func;
                    if self.named.insert((pid, func)) {
                        out.push(Record {
                            nsecs: h.nsecs,
                            pid,
                            tid,
                            event: Event::Function {
                                func,
                                name: site_name(&site.name),
                            },
                        });
                    }
                    if h.kind == EVENT_FUNC_ENTRY {
                        let args = e
                            .payload
                            .chunks_exact(8)
                            .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
                            .collect();
                        Event::FunctionEntry { func, args }
                    } else {
                        Event::FunctionExit {
                            func,
                            retval: exit_value(h, &e.payload),
                        }
                    }
                }
                _ => continue,
            };
            out.push(Record {
                nsecs: h.nsecs,
                pid,
                tid,
                event,
            });
        }
        for &d in &dead {
            // SAFETY: a DEAD slot of this segment: no thread writes it any more.
            let (pid, tid) = unsafe { ((*shm.thread_slot(d)).pid, (*shm.thread_slot(d)).tid) };
            if self.threads.remove(&(pid, tid)) {
                out.push(Record {
                    nsecs: now,
                    pid,
                    tid,
                    event: Event::ThreadEnded,
                });
            }
        }
        slots::retire(shm, &dead);
        // In time order, a thread's start before its first event (a stable sort).
        out.sort_by_key(|r| r.nsecs);
        let lost = crate::Losses::of(shm, prog).events_lost;
        if lost > self.lost {
            out.push(Record {
                nsecs: now,
                pid: 0,
                tid: 0,
                event: Event::Lost {
                    events: lost - self.lost,
                },
            });
            self.lost = lost;
        }
        out
    }

    /// Deliver events again after an `exit()` (END probes run after it).
    pub fn resume(&mut self) {
        self.exited = false;
    }
}

/// A site's name: its bytes up to the first NUL.
/// What a function exit record carries: the return value, or the value its
/// advice gave in its place (`__weft_exit(VALUE)`: an 8-byte payload).
pub fn exit_value(h: &weft_abi::EventHeader, payload: &[u8]) -> u64 {
    match payload.get(..8) {
        Some(w) => u64::from_le_bytes(w.try_into().unwrap()),
        None => u64::from(h.arg0) | (u64::from(h.arg1) << 32),
    }
}

fn site_name(bytes: &[u8]) -> String {
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    String::from_utf8_lossy(&bytes[..end]).into_owned()
}

/// Map `id`'s merged entries now.
pub fn snapshot(shm: &Shm, prog: &Program, id: u32, top: u32, div: u32) -> MapSnapshot {
    let d = shm.map(id);
    let plain = matches!(prog.maps[id as usize].value, MapValue::Plain(_));
    let entries = map::live_entries(shm, d)
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
        .collect::<Vec<_>>();
    let mut entries = entries;
    if map::thread_keyed(d) {
        // Each live thread's own entry (weft's too: BEGIN, END), under its tid.
        for t in WEFT_SLOT..shm.slots_used() {
            let slot = shm.thread_slot(t);
            let (present, value) = map::thread_entry(shm, d, slot);
            if present {
                // SAFETY: a handed-out slot; tid is a plain field.
                let tid = unsafe { (*slot).tid };
                entries.push((
                    u64::from(tid).to_le_bytes().to_vec(),
                    value.to_le_bytes().to_vec(),
                ));
            }
        }
    }
    MapSnapshot {
        map: id,
        top,
        div,
        entries,
    }
}

/// Every map of the program now, in the program's order.
pub fn all_maps(shm: &Shm, prog: &Program) -> Vec<MapSnapshot> {
    (0..prog.maps.len() as u32)
        .map(|i| snapshot(shm, prog, i, 0, 0))
        .collect()
}
