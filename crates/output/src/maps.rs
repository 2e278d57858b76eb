//! Printing a map — at exit, or for `print(@m[, top[, div]])` — as bpftrace 0.17 does.
//!
//! **Which entries.** The caller passes every entry the map holds (key bytes in the
//! key type's layout, empty for a map without key; the merged value in
//! [`MapValue::value_size`]'s layout). As in bpftrace 0.17:
//! * a scalar `count()` map always has an entry (bpftrace keeps it in an array map), so
//!   one is printed as `@x: 0` even when none is passed;
//! * `max()` and `min()` print every entry that saw a value, as upstream bpftrace
//!   does (0.17 stored with a signed compare against the 0 of a missing entry, so it
//!   printed no negative max and no min above 0xffffffff); a signed max prints
//!   signed.
//!
//! **Order.**
//! * `count`, `sum`, `min`, `max` and integer maps: by value, ascending (signed for
//!   signed values). bpftrace's tie order comes from the kernel hash
//!   table (random per run); weft breaks ties by key as below.
//! * Other plain maps (strings, tuples, stacks, ...): by key: integer fields (compared
//!   as unsigned 64-bit) and string fields, first field first; other fields keep the
//!   order of the raw key bytes.
//! * `hist`/`lhist`: by total count; `avg`/`stats`: by average. bpftrace takes the keys
//!   in the byte order of *its* key encoding (integers as 8 little-endian bytes) and
//!   runs `std::sort` (unstable past 16 keys); both are reproduced.
//!
//! **`top`** keeps the last `top` entries (the largest), except for `stats` maps, where
//! bpftrace ignores it. **`div`** divides counts, sums, min/max, avg and integer values
//! and `hist` counts (not the bars); bpftrace ignores it for `lhist` and `stats`.
//! 0 means "none" for both.
//!
//! **Layout.** Entries are joined by a newline and the map ends with one (`stats`/`avg`
//! maps: two); `hist`/`lhist`/`tseries` entries put their rows on the lines after
//! `@h[k]:` (upstream; 0.17 wrote `@h[k]: `), so a blank line separates them. An empty map prints one newline (`stats`/`avg`: two).
//! Maps whose values are `usym`s or stacks are joined with nothing (bpftrace 0.17).

use weft_ir::{MapDecl, MapValue, Type};

use crate::hist;
use crate::render::{self, Style};
use crate::sort::std_sort;
use crate::value::{decode, read_u64, Value};
use crate::Resolver;
use crate::{time, tseries};

/// What bpftrace prints before the maps at exit: two newlines (also with `-f json`).
pub fn exit_header() -> &'static str {
    "\n\n"
}

/// The order bpftrace prints maps in at exit: by name, byte-wise (`@` < `@A` < `@_` <
/// `@a`), not in order of appearance. Returns indices into `maps`.
pub fn exit_order(maps: &[MapDecl]) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..maps.len())
        .filter(|&i| !weft_ir::is_hidden_map(&maps[i].name))
        .collect();
    idx.sort_by(|&a, &b| maps[a].name.as_bytes().cmp(maps[b].name.as_bytes()));
    idx
}

/// A map in text, as printed at exit and by `print(@m, top, div)`.
pub fn print_map(
    decl: &MapDecl,
    entries: &[(Vec<u8>, Vec<u8>)],
    top: u32,
    div: u32,
    r: &dyn Resolver,
) -> Vec<u8> {
    let rows = selected_entries(decl, entries, top);
    if decl.name.starts_with(hist::STAP_HIST_PREFIX) {
        let mut out = Vec::new();
        for (_, v) in &rows {
            match &decl.value {
                MapValue::Hist { .. } => out.extend(hist::stap_text(&u64s(v), None)),
                MapValue::Lhist { min, step, .. } => {
                    out.extend(hist::stap_text(&u64s(v), Some((*min, *step))))
                }
                _ => {}
            }
        }
        return out;
    }
    let div = div.max(1);
    let last = tseries_last(decl, &rows);
    let elems: Vec<Vec<u8>> = rows
        .iter()
        .map(|(k, v)| {
            let mut e = decl.name.as_bytes().to_vec();
            if let Some(kt) = &decl.key {
                e.extend_from_slice(&render::key_text(&render::key_fields(kt, k, r)));
            }
            if matches!(
                decl.value,
                MapValue::Hist { .. } | MapValue::Lhist { .. } | MapValue::Tseries { .. }
            ) {
                // Rows on the lines after `@h:` (upstream's text.cpp; bpftrace 0.17
                // wrote `@h: ` with a trailing space).
                e.extend_from_slice(b":\n");
            } else {
                e.extend_from_slice(b": ");
            }
            if let Some(s) = tseries_of(decl, v, last) {
                e.extend_from_slice(&tseries::text(&s, &|secs| {
                    time::time_text(b"%H:%M:%S", secs)
                        .map(|t| String::from_utf8_lossy(&t).into_owned())
                        .unwrap_or_default()
                }));
                return e;
            }
            e.extend_from_slice(&value_text(Style::Text, &decl.value, v, div, r));
            e
        })
        .collect();
    let sep: &[u8] = match &decl.value {
        MapValue::Plain(Type::USym | Type::UStack { .. }) => b"",
        _ => b"\n",
    };
    let mut out = render::join(&elems, sep);
    out.push(b'\n');
    if matches!(decl.value, MapValue::Avg { .. } | MapValue::Stats { .. }) {
        out.push(b'\n');
    }
    out
}

/// A map as one JSON record (`{"type": "map", ...}`, `"hist"` for hist/lhist, `"stats"`
/// for avg/stats), newline-terminated; nothing for an empty map, as bpftrace.
pub fn print_map_json(
    decl: &MapDecl,
    entries: &[(Vec<u8>, Vec<u8>)],
    top: u32,
    div: u32,
    r: &dyn Resolver,
) -> Vec<u8> {
    let rows = selected_entries(decl, entries, top);
    if rows.is_empty() {
        return Vec::new();
    }
    let div = div.max(1);
    let kind = match decl.value {
        MapValue::Hist { .. } | MapValue::Lhist { .. } => "hist",
        MapValue::Avg { .. } | MapValue::Stats { .. } => "stats",
        MapValue::Tseries { .. } => "tseries",
        _ => "map",
    };
    let last = tseries_last(decl, &rows);
    let elems: Vec<Vec<u8>> = rows
        .iter()
        .map(|(k, v)| {
            let mut e = Vec::new();
            if let Some(kt) = &decl.key {
                e.extend_from_slice(&render::key_json(&render::key_fields_as(
                    Style::Json,
                    kt,
                    k,
                    r,
                )));
                e.extend_from_slice(b": ");
            }
            match tseries_of(decl, v, last) {
                Some(s) => e.extend_from_slice(&tseries::json(&s)),
                None => e.extend_from_slice(&value_text(Style::Json, &decl.value, v, div, r)),
            }
            e
        })
        .collect();
    let mut out = format!("{{\"type\": \"{kind}\", \"data\": {{\"").into_bytes();
    out.extend_from_slice(&render::json_escape(decl.name.as_bytes()));
    out.extend_from_slice(b"\": ");
    let keyed = decl.key.is_some();
    if keyed {
        out.push(b'{');
    }
    out.extend_from_slice(&render::join(&elems, b", "));
    if keyed {
        out.push(b'}');
    }
    out.extend_from_slice(b"}}\n");
    out
}

/// The newest interval of a `tseries` map's entries (0 for other maps).
fn tseries_last(decl: &MapDecl, rows: &[(Vec<u8>, Vec<u8>)]) -> u64 {
    match decl.value {
        MapValue::Tseries { .. } => {
            tseries::last_epoch(&rows.iter().map(|(_, v)| v.as_slice()).collect::<Vec<_>>())
        }
        _ => 0,
    }
}

/// The series of one entry of a `tseries` map, ending at the map's `last` interval;
/// `None` for other maps.
fn tseries_of(decl: &MapDecl, v: &[u8], last: u64) -> Option<tseries::Series> {
    let MapValue::Tseries {
        interval_ns,
        intervals,
        agg,
        signed,
    } = decl.value
    else {
        return None;
    };
    Some(tseries::series(
        v,
        last,
        interval_ns,
        intervals,
        agg,
        signed,
    ))
}

/// The value part of one entry.
fn value_text(style: Style, mv: &MapValue, v: &[u8], div: u32, r: &dyn Resolver) -> Vec<u8> {
    let d = u64::from(div);
    let s = match mv {
        MapValue::Count => (read_u64(v, 0) / d).to_string(),
        MapValue::Sum { signed: true } => (read_u64(v, 0) as i64 / d as i64).to_string(),
        MapValue::Sum { signed: false } => (read_u64(v, 0) / d).to_string(),
        // `min_value()` is an int64_t; `max_value()` as its values are signed or not.
        MapValue::Min { .. } | MapValue::Max { signed: true } => {
            (read_u64(v, 1) as i64 / d as i64).to_string()
        }
        MapValue::Max { signed: false } => (read_u64(v, 1) / d).to_string(),
        MapValue::Avg { .. } => (average(v) / d as i64).to_string(),
        MapValue::Stats { .. } => {
            let (count, total) = (read_u64(v, 0) as i64, read_u64(v, 1) as i64);
            let avg = average(v);
            match style {
                Style::Text => format!("count {count}, average {avg}, total {total}"),
                Style::Json => {
                    format!("{{\"count\": {count}, \"average\": {avg}, \"total\": {total}}}")
                }
            }
        }
        MapValue::Hist { k } => {
            let buckets = u64s(v);
            return match style {
                Style::Text => hist::hist_text(&buckets, *k, div),
                Style::Json => hist::hist_json(&buckets, *k, div),
            };
        }
        MapValue::Lhist { min, max, step } => {
            let buckets = u64s(v);
            return match style {
                Style::Text => hist::lhist_text(&buckets, *min, *max, *step),
                Style::Json => hist::lhist_json(&buckets, *min, *max, *step),
            };
        }
        MapValue::Plain(ty) => return render::value_str(style, ty, &decode(ty, v), div, r),
        // Printed by `tseries::text`/`json` with the whole map's last interval.
        MapValue::Tseries { .. } => String::new(),
    };
    s.into_bytes()
}

/// `total / count` of an avg/stats accumulator, truncating toward zero (0 when empty).
fn average(v: &[u8]) -> i64 {
    let (count, total) = (read_u64(v, 0) as i64, read_u64(v, 1) as i64);
    if count == 0 {
        0
    } else {
        total.wrapping_div(count)
    }
}

fn u64s(v: &[u8]) -> Vec<u64> {
    (0..v.len() / 8).map(|i| read_u64(v, i)).collect()
}

/// The entries bpftrace prints, in its order, after `top`.
fn selected_entries(
    decl: &MapDecl,
    entries: &[(Vec<u8>, Vec<u8>)],
    top: u32,
) -> Vec<(Vec<u8>, Vec<u8>)> {
    let mut rows: Vec<(Vec<u8>, Vec<u8>)> = entries.to_vec();
    if rows.is_empty() && decl.key.is_none() && decl.value == MapValue::Count {
        rows.push((Vec::new(), vec![0; 8]));
    }
    order(decl, &mut rows);
    if top > 0 && !matches!(decl.value, MapValue::Stats { .. }) && rows.len() > top as usize {
        rows.drain(..rows.len() - top as usize);
    }
    rows
}

fn order(decl: &MapDecl, rows: &mut [(Vec<u8>, Vec<u8>)]) {
    let key_ty = decl.key.as_ref();
    match &decl.value {
        // Upstream keeps a tseries map in a `std::map` of its key bytes.
        MapValue::Tseries { .. } => sort_by_bpftrace_key_bytes(key_ty, rows),
        MapValue::Hist { .. } | MapValue::Lhist { .. } => {
            sort_by_bpftrace_key_bytes(key_ty, rows);
            let total = |v: &[u8]| u64s(v).iter().fold(0u64, |a, &b| a.wrapping_add(b));
            std_sort(rows, &|a: &(Vec<u8>, Vec<u8>), b: &(Vec<u8>, Vec<u8>)| {
                total(&a.1) < total(&b.1)
            });
        }
        MapValue::Avg { .. } | MapValue::Stats { .. } => {
            sort_by_bpftrace_key_bytes(key_ty, rows);
            std_sort(rows, &|a: &(Vec<u8>, Vec<u8>), b: &(Vec<u8>, Vec<u8>)| {
                average(&a.1) < average(&b.1)
            });
        }
        mv => {
            rows.sort_by(|a, b| a.0.cmp(&b.0));
            sort_by_key(key_ty, rows);
            if sort_value(mv, &[0; 16]).is_some() {
                rows.sort_by_cached_key(|row| sort_value(mv, &row.1));
            }
        }
    }
}

/// The value bpftrace sorts a `count`/`sum`/`min`/`max`/integer map by; `None` for
/// maps sorted by key.
fn sort_value(mv: &MapValue, v: &[u8]) -> Option<i128> {
    Some(match mv {
        MapValue::Count | MapValue::Sum { signed: false } => i128::from(read_u64(v, 0)),
        MapValue::Sum { signed: true } => i128::from(read_u64(v, 0) as i64),
        MapValue::Min { .. } | MapValue::Max { signed: true } => i128::from(read_u64(v, 1) as i64),
        MapValue::Max { signed: false } => i128::from(read_u64(v, 1)),
        MapValue::Plain(ty @ (Type::Int { .. } | Type::Bool)) => match decode(ty, v) {
            Value::Int(n) => i128::from(n),
            other => i128::from(other.as_u64()),
        },
        _ => return None,
    })
}

/// The key fields of a map key (one for a single key, several for `@m[a, b]`).
fn key_parts(key_ty: Option<&Type>, key: &[u8]) -> Vec<(Type, Value)> {
    match key_ty {
        None => Vec::new(),
        Some(t @ Type::Tuple(tys)) => match decode(t, key) {
            Value::Tuple(vals) => tys.iter().cloned().zip(vals).collect(),
            _ => Vec::new(),
        },
        Some(t) => vec![(t.clone(), decode(t, key))],
    }
}

/// The types of the key fields (one for a single key, several for `@m[a, b]`).
fn key_field_types(key_ty: Option<&Type>) -> Vec<&Type> {
    match key_ty {
        Some(Type::Tuple(t)) => t.iter().collect(),
        Some(t) => vec![t],
        None => Vec::new(),
    }
}

/// bpftrace's `sort_by_key`: stable sorts from the last key field to the first, on
/// integer (as unsigned 64-bit) and string fields only.
fn sort_by_key(key_ty: Option<&Type>, rows: &mut [(Vec<u8>, Vec<u8>)]) {
    for (i, ty) in key_field_types(key_ty).into_iter().enumerate().rev() {
        let field = |k: &[u8]| key_parts(key_ty, k).swap_remove(i).1;
        match ty {
            Type::Int { .. } | Type::Bool => rows.sort_by_cached_key(|r| field(&r.0).as_u64()),
            Type::Str { .. } => rows.sort_by_cached_key(|r| match field(&r.0) {
                Value::Str(s) => s,
                _ => Vec::new(),
            }),
            _ => {}
        }
    }
}

/// Order of bpftrace's `std::map<std::vector<uint8_t>, ...>`: byte order of its key
/// encoding, where integers are 8 little-endian bytes and fields are packed.
fn sort_by_bpftrace_key_bytes(key_ty: Option<&Type>, rows: &mut [(Vec<u8>, Vec<u8>)]) {
    let encode = |k: &[u8]| -> Vec<u8> {
        let mut out = Vec::new();
        for ((ty, v), off) in key_parts(key_ty, k).into_iter().zip(field_offsets(key_ty)) {
            match (&ty, &v) {
                (
                    _,
                    Value::Int(_)
                    | Value::UInt(_)
                    | Value::Bool(_)
                    | Value::Ptr(_)
                    | Value::Probe(_)
                    | Value::USym(_),
                ) => out.extend_from_slice(&v.as_u64().to_le_bytes()),
                (Type::Str { cap }, Value::Str(s)) => {
                    out.extend_from_slice(s);
                    out.resize(out.len() + (*cap as usize).saturating_sub(s.len()), 0);
                }
                _ => {
                    let end = (off + ty.size() as usize).min(k.len());
                    out.extend_from_slice(k.get(off..end).unwrap_or_default());
                }
            }
        }
        out
    };
    rows.sort_by_cached_key(|r| encode(&r.0));
}

fn field_offsets(key_ty: Option<&Type>) -> Vec<usize> {
    match key_ty {
        Some(t @ Type::Tuple(_)) => t.field_offsets().into_iter().map(|o| o as usize).collect(),
        Some(_) => vec![0],
        None => Vec::new(),
    }
}
