//! The session's maps as metrics: one neutral model that both exporters encode
//! (Prometheus text, OTLP protobuf), so a map means the same thing to each.
//!
//! * `count()` and unsigned `sum()`: a monotonic counter; signed `sum()`,
//!   `min()`, `max()`, `avg()`, `stats()` (its average) and integer values: a
//!   gauge. Other plain values (strings, stacks, ...) and `tseries` are not
//!   exported.
//! * `hist()`/`lhist()`: a histogram with explicit, upper-inclusive bounds. weft's
//!   buckets hold integers, so each bucket's bound is the largest integer it holds:
//!   `hist`'s `[2^i, 2^(i+1))` is `le = 2^(i+1) - 1`, its bucket of negative values
//!   `le = -1` and of 0 `le = 0`; `lhist`'s `[a, a + step)` is `le = a + step - 1`.
//!   The bounds go up to the map's highest non-empty bucket (the same bounds for
//!   every key of a map); the rest is `+Inf`. weft's histograms count values and
//!   keep no sum: the exported sum is each value counted at its bucket's lower
//!   bound (a lower bound of the real sum; OTLP leaves it out).
//! * Keys become labels: `key` for one key, `key0`, `key1`, ... for a tuple, each
//!   the text bpftrace prints for it. Names are `weft_` and the map's name with
//!   every character but `[A-Za-z0-9_]` replaced by `_` (`@` alone: `weft_map`).

use weft_ir::{MapDecl, MapValue, Type};
use weft_output::{Resolver, Value};
use weft_trace::MapSnapshot;

/// What kind of metric a map is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
    Histogram,
}

/// One map as a metric family.
#[derive(Clone, Debug, PartialEq)]
pub struct Family {
    /// `weft_<name>`, sanitized.
    pub name: String,
    /// The map's name and function, for `# HELP` and the OTLP description.
    pub help: String,
    pub kind: Kind,
    pub points: Vec<Point>,
}

/// One entry of a map.
#[derive(Clone, Debug, PartialEq)]
pub struct Point {
    /// `(label, value)` pairs, from the key.
    pub labels: Vec<(String, String)>,
    pub value: PointValue,
}

#[derive(Clone, Debug, PartialEq)]
pub enum PointValue {
    Counter(u64),
    Gauge(i64),
    Histogram(Histogram),
}

/// A histogram: `counts[i]` values `<= bounds[i]` (and above `bounds[i - 1]`);
/// `counts` has one more element than `bounds`, the values above the last bound.
#[derive(Clone, Debug, PartialEq)]
pub struct Histogram {
    pub bounds: Vec<f64>,
    pub counts: Vec<u64>,
    pub count: u64,
    /// Each value at its bucket's lower bound (see the module docs).
    pub sum_lower_bound: f64,
}

impl Histogram {
    /// `(le, cumulative count)` per bound, then `+Inf`.
    pub fn cumulative(&self) -> Vec<(f64, u64)> {
        let mut total = 0u64;
        self.counts
            .iter()
            .enumerate()
            .map(|(i, &c)| {
                total = total.wrapping_add(c);
                (self.bounds.get(i).copied().unwrap_or(f64::INFINITY), total)
            })
            .collect()
    }
}

/// The metric name of map `name`.
pub fn metric_name(name: &str) -> String {
    let bare = name.trim_start_matches('@');
    let bare = if bare.is_empty() { "map" } else { bare };
    let mut out = String::from("weft_");
    out.extend(bare.chars().map(|c| {
        if c.is_ascii_alphanumeric() || c == '_' {
            c
        } else {
            '_'
        }
    }));
    out
}

/// Every exportable map of `maps` as a family, in the program's order (hidden
/// maps and maps of values that are not numbers left out).
pub fn families(decls: &[MapDecl], maps: &[MapSnapshot], r: &dyn Resolver) -> Vec<Family> {
    maps.iter()
        .filter_map(|m| {
            let decl = decls.get(m.map as usize)?;
            if weft_ir::is_hidden_map(&decl.name) {
                return None;
            }
            family(decl, &m.entries, r)
        })
        .collect()
}

fn family(decl: &MapDecl, entries: &[(Vec<u8>, Vec<u8>)], r: &dyn Resolver) -> Option<Family> {
    let (kind, what) = match &decl.value {
        MapValue::Count => (Kind::Counter, "count()"),
        MapValue::Sum { signed: false } => (Kind::Counter, "sum()"),
        MapValue::Sum { signed: true } => (Kind::Gauge, "sum()"),
        MapValue::Min { .. } => (Kind::Gauge, "min()"),
        MapValue::Max { .. } => (Kind::Gauge, "max()"),
        MapValue::Avg { .. } => (Kind::Gauge, "avg()"),
        MapValue::Stats { .. } => (Kind::Gauge, "stats(): the average"),
        MapValue::Hist { .. } => (Kind::Histogram, "hist()"),
        MapValue::Lhist { .. } => (Kind::Histogram, "lhist()"),
        MapValue::Plain(Type::Int { .. } | Type::Bool) => (Kind::Gauge, "value"),
        MapValue::Plain(_) | MapValue::Tseries { .. } => return None,
    };
    let mut entries: Vec<&(Vec<u8>, Vec<u8>)> = entries.iter().collect();
    // In key order, so a scrape reads the same from one time to the next.
    entries.sort_by(|a, b| a.0.cmp(&b.0));
    // A scalar count() always has a value (bpftrace prints `@x: 0`).
    let zero = (Vec::new(), vec![0u8; 8]);
    if entries.is_empty() && decl.key.is_none() && decl.value == MapValue::Count {
        entries.push(&zero);
    }
    // Histograms: the same bounds for every key, up to the highest bucket used.
    let used = entries
        .iter()
        .filter_map(|(_, v)| u64s(v).iter().rposition(|&c| c != 0))
        .max()
        .unwrap_or(0);
    let points = entries
        .iter()
        .filter_map(|(k, v)| {
            let value = match &decl.value {
                MapValue::Count | MapValue::Sum { signed: false } => {
                    PointValue::Counter(read_u64(v, 0))
                }
                MapValue::Sum { signed: true } => PointValue::Gauge(read_u64(v, 0) as i64),
                MapValue::Min { .. } | MapValue::Max { .. } => {
                    if read_u64(v, 0) == 0 {
                        return None;
                    }
                    PointValue::Gauge(read_u64(v, 1) as i64)
                }
                MapValue::Avg { .. } | MapValue::Stats { .. } => {
                    let (count, total) = (read_u64(v, 0) as i64, read_u64(v, 1) as i64);
                    if count == 0 {
                        return None;
                    }
                    PointValue::Gauge(total.wrapping_div(count))
                }
                MapValue::Hist { k } => PointValue::Histogram(hist(&u64s(v), *k, used)),
                MapValue::Lhist { min, max, step } => {
                    PointValue::Histogram(lhist(&u64s(v), *min, *max, *step, used))
                }
                MapValue::Plain(ty) => match weft_output::decode(ty, v) {
                    Value::Int(n) => PointValue::Gauge(n),
                    Value::UInt(n) => PointValue::Gauge(n as i64),
                    Value::Bool(b) => PointValue::Gauge(i64::from(b)),
                    _ => return None,
                },
                MapValue::Tseries { .. } => return None,
            };
            Some(Point {
                labels: labels(decl.key.as_ref(), k, r),
                value,
            })
        })
        .collect();
    Some(Family {
        name: metric_name(&decl.name),
        help: format!("weft map {} ({what})", decl.name),
        kind,
        points,
    })
}

fn labels(key: Option<&Type>, bytes: &[u8], r: &dyn Resolver) -> Vec<(String, String)> {
    let Some(ty) = key else {
        return Vec::new();
    };
    let fields = weft_output::key_strings(ty, bytes, r);
    if matches!(ty, Type::Tuple(_)) {
        fields
            .into_iter()
            .enumerate()
            .map(|(i, f)| (format!("key{i}"), f))
            .collect()
    } else {
        fields.into_iter().map(|f| ("key".to_string(), f)).collect()
    }
}

/// `hist(v, k)`'s buckets `0..=used` (see [`weft_ir::hist_buckets`]): bucket 0
/// negative values, then for k = 0 `[0]`, `[1]`, `[2, 4)`, ...; for k > 0 the
/// first `2 << k` buckets after it are single values, then each power of two is
/// split in `2^k`.
fn hist(values: &[u64], k: u8, used: usize) -> Histogram {
    let k = u32::from(k);
    // Past the single values, bucket `i` holds `[s(i - 1), s(i))`, as `output`'s
    // JSON computes it.
    let s = |idx: u32| -> i128 {
        let n = 1i128 << k;
        (1i128 << ((idx >> k) - 1)) * (n + i128::from(idx & ((1 << k) - 1)))
    };
    let last = used.min(values.len().saturating_sub(1));
    let mut bounds = Vec::new();
    let mut counts = Vec::new();
    let mut sum = 0f64;
    for (i, &c) in values.iter().enumerate().take(last + 1) {
        let i = i as u32;
        let (lo, hi) = if i == 0 {
            (-1i128, -1i128)
        } else if i <= (2 << k) {
            (i128::from(i) - 1, i128::from(i) - 1)
        } else {
            (s(i - 1), s(i) - 1)
        };
        bounds.push(hi as f64);
        counts.push(c);
        sum += lo as f64 * c as f64;
    }
    // Nothing lies above the last bucket used: +Inf holds no more.
    counts.push(0);
    Histogram {
        bounds,
        count: counts.iter().fold(0u64, |a, &c| a.wrapping_add(c)),
        counts,
        sum_lower_bound: sum,
    }
}

/// `lhist(v, min, max, step)`'s buckets `0..=used` ([`weft_ir::lhist_buckets`]):
/// below `min`, one per step (the last ends at `max`), at or above `max`.
fn lhist(values: &[u64], min: i64, max: i64, step: i64, used: usize) -> Histogram {
    let step = i128::from(step.max(1));
    let (min, max) = (i128::from(min), i128::from(max));
    let n = values.len();
    let last = used.min(n.saturating_sub(1));
    let mut bounds = Vec::new();
    let mut counts = Vec::new();
    let mut sum = 0f64;
    for (i, &c) in values.iter().enumerate().take(last + 1) {
        if i + 1 == n {
            // At or above max: the +Inf bucket.
            sum += max as f64 * c as f64;
            counts.push(c);
            break;
        }
        let (lo, hi) = if i == 0 {
            (min - 1, min - 1)
        } else {
            let lo = min + (i as i128 - 1) * step;
            (lo, (lo + step).min(max) - 1)
        };
        bounds.push(hi as f64);
        counts.push(c);
        sum += lo as f64 * c as f64;
    }
    if counts.len() == bounds.len() {
        counts.push(0);
    }
    Histogram {
        bounds,
        count: counts.iter().fold(0u64, |a, &c| a.wrapping_add(c)),
        counts,
        sum_lower_bound: sum,
    }
}

fn read_u64(v: &[u8], i: usize) -> u64 {
    v.get(8 * i..8 * i + 8)
        .map_or(0, |b| u64::from_le_bytes(b.try_into().unwrap()))
}

fn u64s(v: &[u8]) -> Vec<u64> {
    v.chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert_eq!(metric_name("@calls"), "weft_calls");
        assert_eq!(metric_name("@"), "weft_map");
        assert_eq!(metric_name("@a_B9"), "weft_a_B9");
    }

    #[test]
    fn hist_bounds_are_the_largest_integer_of_each_bucket() {
        // Values 0, 1, 2, 3, 5: buckets [0], [1], [2, 4) x2, [4, 8).
        let mut v = vec![0u64; weft_ir::hist_buckets(0) as usize];
        v[1] = 1;
        v[2] = 1;
        v[3] = 2;
        v[4] = 1;
        let h = hist(&v, 0, 4);
        assert_eq!(h.bounds, vec![-1.0, 0.0, 1.0, 3.0, 7.0]);
        assert_eq!(h.counts, vec![0, 1, 1, 2, 1, 0]);
        assert_eq!(h.count, 5);
        assert_eq!(h.sum_lower_bound, 0.0 + 1.0 + 4.0 + 4.0);
        assert_eq!(
            h.cumulative(),
            vec![
                (-1.0, 0),
                (0.0, 1),
                (1.0, 2),
                (3.0, 4),
                (7.0, 5),
                (f64::INFINITY, 5)
            ]
        );
        // k = 1: 0..=3 single values (buckets 1..=4), then [4, 6), [6, 8), [8, 12).
        let h = hist(&vec![0; weft_ir::hist_buckets(1) as usize], 1, 7);
        assert_eq!(h.bounds, vec![-1.0, 0.0, 1.0, 2.0, 3.0, 5.0, 7.0, 11.0]);
    }

    #[test]
    fn lhist_bounds() {
        // lhist(x, 0, 25, 10): below 0, [0, 10), [10, 20), [20, 25), at or above 25.
        let v = vec![1u64, 2, 3, 4, 5];
        assert_eq!(v.len() as u32, weft_ir::lhist_buckets(0, 25, 10));
        let h = lhist(&v, 0, 25, 10, 4);
        assert_eq!(h.bounds, vec![-1.0, 9.0, 19.0, 24.0]);
        assert_eq!(h.counts, vec![1, 2, 3, 4, 5]);
        assert_eq!(h.count, 15);
        let h = lhist(&v, 0, 25, 10, 2);
        assert_eq!(h.bounds, vec![-1.0, 9.0, 19.0]);
        assert_eq!(h.counts, vec![1, 2, 3, 0]);
    }
}
