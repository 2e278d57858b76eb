//! `tseries()` maps, as upstream bpftrace prints them (its `src/output/text.cpp` and
//! `json.cpp`; expected outputs in `tests/runtime/outputs/tseries*.txt|json`).
//!
//! An accumulator (merged over threads) holds `intervals` places of
//! `[value, meta, epoch]` (`weft_abi::TSERIES_WORDS`): place `e % intervals` holds
//! interval `e` (wall-clock nanoseconds / `interval_ns`), 0 when never written. Which
//! intervals a key shows (upstream's `tseries_first_epoch`/`tseries_last_epoch`):
//! every key ends at the newest interval any key of the map has, and starts at its
//! own oldest interval among the last `intervals`; intervals without a value inside
//! that range print `-` (text) and are left out (JSON).

use weft_ir::TseriesAgg;

use crate::value::read_u64;

/// One key's series: `(start of the interval in wall-clock ns, value)` in time order.
pub(crate) type Series = Vec<(u64, Option<Num>)>;

/// A value of a series, signed or not as the map's values are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Num {
    Signed(i64),
    Unsigned(u64),
}

impl Num {
    fn wide(self) -> i128 {
        match self {
            Num::Signed(v) => i128::from(v),
            Num::Unsigned(v) => i128::from(v),
        }
    }

    fn text(self) -> String {
        match self {
            Num::Signed(v) => v.to_string(),
            Num::Unsigned(v) => v.to_string(),
        }
    }

    /// One less, unless at the bottom of the type (upstream's `try_dec`).
    fn dec(self) -> Num {
        match self {
            Num::Signed(v) => Num::Signed(v.checked_sub(1).unwrap_or(v)),
            Num::Unsigned(v) => Num::Unsigned(v.checked_sub(1).unwrap_or(v)),
        }
    }

    /// One more, unless at the top of the type (upstream's `try_inc`).
    fn inc(self) -> Num {
        match self {
            Num::Signed(v) => Num::Signed(v.checked_add(1).unwrap_or(v)),
            Num::Unsigned(v) => Num::Unsigned(v.checked_add(1).unwrap_or(v)),
        }
    }
}

/// The intervals an accumulator holds: `(epoch, value)`, avg already divided.
fn intervals(acc: &[u8], agg: TseriesAgg, signed: bool) -> Vec<(u64, Num)> {
    let places = acc.len() / 24;
    let mut out = Vec::new();
    for p in 0..places {
        let (v, meta, epoch) = (
            read_u64(acc, 3 * p),
            read_u64(acc, 3 * p + 1),
            read_u64(acc, 3 * p + 2),
        );
        if epoch == 0 {
            continue;
        }
        let v = match (agg, signed) {
            (TseriesAgg::Avg, true) if meta != 0 => (v as i64).wrapping_div(meta as i64) as u64,
            (TseriesAgg::Avg, false) if meta != 0 => v / meta,
            _ => v,
        };
        let n = if signed {
            Num::Signed(v as i64)
        } else {
            Num::Unsigned(v)
        };
        out.push((epoch, n));
    }
    out
}

/// The newest interval of any key of the map (0 when nothing was written).
pub(crate) fn last_epoch(accs: &[&[u8]]) -> u64 {
    accs.iter()
        .flat_map(|a| (0..a.len() / 24).map(|p| read_u64(a, 3 * p + 2)))
        .max()
        .unwrap_or(0)
}

/// One key's series, ending at the map's `last` interval.
pub(crate) fn series(
    acc: &[u8],
    last: u64,
    interval_ns: u64,
    window: u32,
    agg: TseriesAgg,
    signed: bool,
) -> Series {
    let mut have = intervals(acc, agg, signed);
    have.retain(|(e, _)| u128::from(*e) + u128::from(window) > u128::from(last) && *e <= last);
    let Some(first) = have.iter().map(|(e, _)| *e).min() else {
        return Vec::new();
    };
    (first..=last)
        .map(|e| {
            let v = have.iter().find(|(x, _)| *x == e).map(|(_, v)| *v);
            (e.wrapping_mul(interval_ns), v)
        })
        .collect()
}

/// Width of the graph between and including its two borders.
const GRAPH_WIDTH: usize = 53;
/// Width of the minimum's column above and below the graph.
const MIN_COLUMN: usize = 21;

/// Display unit of the times: seconds, or the fraction digits shown (upstream's
/// `DisplayUnit`, chosen by the interval between two points).
fn time_unit(interval_ns: u64) -> (&'static str, usize, u64) {
    match interval_ns {
        n if n >= 1_000_000_000 => ("", 0, 1_000_000_000),
        n if n >= 1_000_000 => ("ms", 3, 1_000_000),
        n if n >= 1_000 => ("μs", 6, 1_000),
        _ => ("ns", 9, 1),
    }
}

/// `upstream distance(a, b)` as a float: `a - b`.
fn distance(a: Num, b: i128) -> f32 {
    (a.wide() - b) as f32
}

/// A series as upstream's text graph (without the map name line); `<no data>` (no
/// newline) for an empty one. `local_hms` gives the local `HH:MM:SS` of a time in
/// seconds since the epoch.
pub(crate) fn text(s: &Series, local_hms: &dyn Fn(i64) -> String) -> Vec<u8> {
    let Some(&(_, Some(front))) = s.first() else {
        return b"<no data>".to_vec();
    };
    let (mut min, mut max) = (front, front);
    for v in s.iter().filter_map(|(_, v)| *v) {
        if v.wide() < min.wide() {
            min = v;
        }
        if v.wide() > max.wide() {
            max = v;
        }
    }
    if min == max {
        min = min.dec();
        max = max.inc();
    }
    let interval = (s[s.len() - 1].0 - s[0].0) / (s.len() as u64 - 1).max(1);
    let (unit, digits, scale) = time_unit(interval);
    let mut time_fmt = String::from("hh:mm:ss");
    let mut time_size = time_fmt.len();
    if digits > 0 {
        time_fmt.push('.');
        time_fmt.push_str(unit);
        time_size += 1 + digits;
    }
    let bounds = |out: &mut String| {
        let (lo, hi) = (min.text(), max.text());
        out.push_str(&format!(
            "{:>w$}{lo:<MIN_COLUMN$}{hi:>r$}\n",
            "",
            w = time_size + 1,
            r = GRAPH_WIDTH - MIN_COLUMN
        ));
    };
    let mut out = String::new();
    bounds(&mut out);
    // Padded in bytes, as iostream's setw does ("μs" is three).
    out.push_str(&time_fmt);
    out.push_str(&" ".repeat((time_size + 1).saturating_sub(time_fmt.len())));
    out.push('|');
    out.push_str(&"_".repeat(GRAPH_WIDTH - 2));
    out.push_str("|\n");
    let zero = if min.wide() < 0 && max.wide() > 0 {
        (GRAPH_WIDTH as f32 * distance(min, 0) / distance(min, max.wide())) as usize
    } else {
        0
    };
    for &(ts, v) in s {
        out.push_str(&local_hms((ts / 1_000_000_000) as i64));
        if digits > 0 {
            let frac = (ts % 1_000_000_000) / scale;
            out.push_str(&format!(".{frac:0digits$}"));
        }
        out.push(' ');
        let mut line = vec![b' '; GRAPH_WIDTH];
        line[0] = b'|';
        line[GRAPH_WIDTH - 1] = b'|';
        if zero > 0 && zero < GRAPH_WIDTH {
            line[zero] = b'.';
        }
        match v {
            Some(v) => {
                let at = if min == max {
                    (GRAPH_WIDTH / 2) as i64
                } else {
                    ((GRAPH_WIDTH - 1) as f32 * distance(min, v.wide()) / distance(min, max.wide()))
                        as i64
                };
                line[at.clamp(0, GRAPH_WIDTH as i64 - 1) as usize] = b'*';
                out.push_str(std::str::from_utf8(&line).unwrap_or_default());
                out.push(' ');
                out.push_str(&v.text());
            }
            None => {
                out.push_str(std::str::from_utf8(&line).unwrap_or_default());
                out.push_str(" -");
            }
        }
        out.push('\n');
    }
    out.push_str(&" ".repeat(time_size + 1));
    out.push('v');
    out.push_str(&"_".repeat(GRAPH_WIDTH - 2));
    out.push_str("v\n");
    bounds(&mut out);
    out.into_bytes()
}

/// A series as upstream's JSON list: `[{"interval_start":"<UTC time>","value":V},...]`
/// without the missing intervals.
pub(crate) fn json(s: &Series) -> Vec<u8> {
    let elems: Vec<String> = s
        .iter()
        .filter_map(|(ts, v)| {
            v.map(|v| {
                format!(
                    "{{\"interval_start\":\"{}\",\"value\":{}}}",
                    utc_timestamp(*ts),
                    v.text()
                )
            })
        })
        .collect();
    format!("[{}]", elems.join(",")).into_bytes()
}

/// `YYYY-MM-DD HH:MM:SS.nnnnnnnnn` in UTC: how C++20's chrono prints a
/// `system_clock` time point in nanoseconds, which upstream's JSON uses.
pub(crate) fn utc_timestamp(ns: u64) -> String {
    let secs = ns / 1_000_000_000;
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (y, m, d) = civil_from_days(days as i64);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}.{:09}",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        ns % 1_000_000_000
    )
}

/// The proleptic Gregorian date `days` after 1970-01-01 (Howard Hinnant's
/// `civil_from_days`).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `HH:MM:SS` of seconds since the epoch, in UTC: the tests' stand-in for local
    /// time (upstream's runtime tests print `%H` for the hour they cannot know).
    fn utc_hms(secs: i64) -> String {
        utc_timestamp(secs as u64 * 1_000_000_000)[11..19].to_string()
    }

    /// An accumulator of `n` places holding `(epoch, value, meta)` triples.
    fn acc(n: usize, points: &[(u64, u64, u64)]) -> Vec<u8> {
        let mut words = vec![0u64; 3 * n];
        for &(epoch, v, meta) in points {
            let p = (epoch % n as u64) as usize;
            words[3 * p..3 * p + 3].copy_from_slice(&[v, meta, epoch]);
        }
        words.iter().flat_map(|w| w.to_le_bytes()).collect()
    }

    /// Upstream's docs example two and `tests/runtime/outputs/tseries_zigzag.txt`:
    /// 20 intervals of 100ms counting -5..5 and back; the zero line is dotted.
    #[test]
    fn zigzag_as_upstream_draws_it() {
        let mut points = Vec::new();
        let mut c: i64 = -5;
        let mut dir = 1;
        for e in 1..=20u64 {
            points.push((e, c as u64, 0));
            c += dir;
            if c > 5 {
                dir = -1;
                c = 4;
            }
        }
        let a = acc(20, &points);
        let s = series(&a, 20, 100_000_000, 20, TseriesAgg::Last, true);
        let got = String::from_utf8(text(&s, &utc_hms)).unwrap();
        let expected = "             -5                                                  5
hh:mm:ss.ms  |___________________________________________________|
00:00:00.100 *                         .                         | -5
00:00:00.200 |    *                    .                         | -4
00:00:00.300 |         *               .                         | -3
00:00:00.400 |              *          .                         | -2
00:00:00.500 |                   *     .                         | -1
00:00:00.600 |                         *                         | 0
00:00:00.700 |                         .    *                    | 1
00:00:00.800 |                         .         *               | 2
00:00:00.900 |                         .              *          | 3
00:00:01.000 |                         .                   *     | 4
00:00:01.100 |                         .                         * 5
00:00:01.200 |                         .                   *     | 4
00:00:01.300 |                         .              *          | 3
00:00:01.400 |                         .         *               | 2
00:00:01.500 |                         .    *                    | 1
00:00:01.600 |                         *                         | 0
00:00:01.700 |                   *     .                         | -1
00:00:01.800 |              *          .                         | -2
00:00:01.900 |         *               .                         | -3
00:00:02.000 |    *                    .                         | -4
             v___________________________________________________v
             -5                                                  5
";
        assert_eq!(got, expected);
    }

    /// `tests/runtime/outputs/tseries_multiple.txt` and `tseries_multiple.json`: a key
    /// whose last intervals are missing shows them as `-` up to the map's newest
    /// interval (and leaves them out of JSON); the other starts at its own first one.
    #[test]
    fn keys_end_at_the_maps_newest_interval() {
        let one = acc(
            10,
            &[(10, 0, 0), (11, 5, 0), (12, 5, 0), (13, 5, 0), (14, 5, 0)],
        );
        let two = acc(10, &(15..=19).map(|e| (e, 4, 0)).collect::<Vec<_>>());
        let last = last_epoch(&[&one, &two]);
        assert_eq!(last, 19);
        let s1 = series(&one, last, 100_000_000, 10, TseriesAgg::Last, false);
        let got = String::from_utf8(text(&s1, &utc_hms)).unwrap();
        let expected = "             0                                                   5
hh:mm:ss.ms  |___________________________________________________|
00:00:01.000 *                                                   | 0
00:00:01.100 |                                                   * 5
00:00:01.200 |                                                   * 5
00:00:01.300 |                                                   * 5
00:00:01.400 |                                                   * 5
00:00:01.500 |                                                   | -
00:00:01.600 |                                                   | -
00:00:01.700 |                                                   | -
00:00:01.800 |                                                   | -
00:00:01.900 |                                                   | -
             v___________________________________________________v
             0                                                   5
";
        assert_eq!(got, expected);
        let s2 = series(&two, last, 100_000_000, 10, TseriesAgg::Last, false);
        let got = String::from_utf8(text(&s2, &utc_hms)).unwrap();
        assert!(
            got.starts_with("             3                                                   5\n")
        );
        assert!(got
            .contains("\n00:00:01.500 |                         *                         | 4\n"));
        assert_eq!(
            String::from_utf8(json(&s1)).unwrap(),
            "[{\"interval_start\":\"1970-01-01 00:00:01.000000000\",\"value\":0},\
             {\"interval_start\":\"1970-01-01 00:00:01.100000000\",\"value\":5},\
             {\"interval_start\":\"1970-01-01 00:00:01.200000000\",\"value\":5},\
             {\"interval_start\":\"1970-01-01 00:00:01.300000000\",\"value\":5},\
             {\"interval_start\":\"1970-01-01 00:00:01.400000000\",\"value\":5}]"
        );
    }

    /// Intervals older than the window are not shown; avg divides total by count;
    /// a series of one point has no interval (nanosecond times).
    #[test]
    fn window_average_and_one_point() {
        let a = acc(4, &[(3, 100, 0), (9, 10, 4)]);
        let s = series(&a, 9, 1_000_000_000, 4, TseriesAgg::Avg, true);
        assert_eq!(s, vec![(9_000_000_000, Some(Num::Signed(2)))]);
        let got = String::from_utf8(text(&s, &utc_hms)).unwrap();
        let expected = "                   1                                                   3
hh:mm:ss.ns        |___________________________________________________|
00:00:09.000000000 |                         *                         | 2
                   v___________________________________________________v
                   1                                                   3
";
        assert_eq!(got, expected);
        assert_eq!(text(&Vec::new(), &utc_hms), b"<no data>".to_vec());
        assert_eq!(json(&Vec::new()), b"[]".to_vec());
    }

    #[test]
    fn utc_dates() {
        assert_eq!(utc_timestamp(0), "1970-01-01 00:00:00.000000000");
        assert_eq!(
            utc_timestamp(1_700_000_000_123_456_789),
            "2023-11-14 22:13:20.123456789"
        );
        assert_eq!(
            utc_timestamp(951_782_400 * 1_000_000_000),
            "2000-02-29 00:00:00.000000000"
        );
    }
}
