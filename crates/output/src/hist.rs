//! `hist()` and `lhist()` rendering: bpftrace's ASCII art (text) and bucket lists (JSON).
//!
//! Inputs are the merged bucket arrays of the ir layouts ([`weft_ir::hist_buckets`],
//! [`weft_ir::lhist_buckets`]).

/// Width of the bar of the largest bucket.
const BAR_WIDTH: usize = 52;

/// First and last non-empty bucket and the largest count, as bpftrace's `hist_prepare`
/// (which reads counts into an `int`).
fn hist_prepare(values: &[u64]) -> Option<(usize, usize, i32)> {
    let mut range = None;
    let mut max_value = 0i32;
    for (i, &v) in values.iter().enumerate() {
        let v = v as i32;
        if v > 0 {
            range = Some(match range {
                None => (i, i),
                Some((lo, _)) => (lo, i),
            });
        }
        max_value = max_value.max(v);
    }
    range.map(|(lo, hi)| (lo, hi, max_value))
}

/// One line: label (16 columns, left), count (8 columns, right), `|bar|`.
fn row(out: &mut Vec<u8>, label: &str, count: u64, value: u64, max_value: i32) {
    // bpftrace: `int bar_width = values.at(i)/(float)max_value*max_width;`
    let bar = ((value as f32) / (max_value as f32) * BAR_WIDTH as f32) as i32;
    let bar = bar.clamp(0, BAR_WIDTH as i32) as usize;
    let line = format!("{label:<16}{count:>8} |{:<BAR_WIDTH$}|\n", "@".repeat(bar));
    out.extend_from_slice(line.as_bytes());
}

/// The label for `2^power`: `1`, `2`, ..., `512`, `1K`, ..., `1M`, `1G`, `1T`, `1P`,
/// `1E` (upstream bpftrace; 0.17 stopped at `T`, which its 32-bit buckets never
/// reached).
fn pow2_label(power: u32) -> String {
    let (power, suffix) = match power {
        60.. => (power - 60, "E"),
        50.. => (power - 50, "P"),
        40.. => (power - 40, "T"),
        30.. => (power - 30, "G"),
        20.. => (power - 20, "M"),
        10.. => (power - 10, "K"),
        _ => (power, ""),
    };
    format!("{}{suffix}", 1u64 << power.min(63))
}

/// Newer bpftrace's label for bucket start `index` of `hist(n, k)` with k > 0 (not in
/// 0.17): each power of two split into 2^k intervals.
fn pow2k_label(index: u32, k: u32) -> String {
    let n = 1u32 << k;
    let interval = index & (n - 1);
    let mut power = (index >> k) - 1;
    let decade = power / 10;
    let suffix = ["", "K", "M", "G", "T", "P", "E"]
        .get(decade as usize)
        .copied()
        .unwrap_or("");
    power -= 10 * decade;
    format!("{}{suffix}", (1u32 << power).wrapping_mul(n + interval))
}

fn hist_label(i: usize, k: u8) -> String {
    let k = u32::from(k);
    let i = i as u32;
    if i == 0 {
        "(..., 0)".to_string()
    } else if i <= (2 << k) {
        format!("[{}]", i - 1)
    } else if k == 0 {
        format!("[{}, {})", pow2_label(i - 2), pow2_label(i - 1))
    } else {
        format!("[{}, {})", pow2k_label(i - 1, k), pow2k_label(i, k))
    }
}

/// The rows of a `hist` (nothing when all buckets are empty). Counts are divided by
/// `div`; bars are not.
pub fn hist_text(values: &[u64], k: u8, div: u32) -> Vec<u8> {
    let mut out = Vec::new();
    let Some((lo, hi, max_value)) = hist_prepare(values) else {
        return out;
    };
    for (i, &v) in values.iter().enumerate().take(hi + 1).skip(lo) {
        row(
            &mut out,
            &hist_label(i, k),
            v / u64::from(div.max(1)),
            v,
            max_value,
        );
    }
    out
}

/// `[{"min": 4, "max": 7, "count": 1}, ...]` for a `hist` (`[]` when empty).
pub fn hist_json(values: &[u64], k: u8, div: u32) -> Vec<u8> {
    let Some((lo, hi, _)) = hist_prepare(values) else {
        return b"[]".to_vec();
    };
    let k = u32::from(k);
    let mut elems = Vec::new();
    for (i, &v) in values.iter().enumerate().take(hi + 1).skip(lo) {
        let i = i as u32;
        let range = if i == 0 {
            "\"max\": -1, ".to_string()
        } else if i <= (2 << k) {
            format!("\"min\": {0}, \"max\": {0}, ", i - 1)
        } else {
            // 64-bit bounds, as upstream bpftrace prints them (0.17 computed them in an
            // `int`: the bucket of 2^31 printed `"min": -2147483648, "max": 0`).
            let n = 1u64 << k;
            let start = |idx: u32| {
                let power = (idx >> k) - 1;
                1u64.wrapping_shl(power)
                    .wrapping_mul(n + u64::from(idx & (n as u32 - 1))) as i64
            };
            format!(
                "\"min\": {}, \"max\": {}, ",
                start(i - 1),
                start(i).wrapping_sub(1)
            )
        };
        elems.push(format!(
            "{{{range}\"count\": {}}}",
            v / u64::from(div.max(1))
        ));
    }
    format!("[{}]", elems.join(", ")).into_bytes()
}

/// bpftrace 0.17's number of in-range `lhist` buckets: `(max - min) / step`, rounded
/// down; its "above" bucket is the next one and is labelled `[max, ...)`.
fn lhist_017_buckets(min: i64, max: i64, step: i64) -> usize {
    ((max - min) / step.max(1)).max(0) as usize
}

/// The ir's lhist array folded into bpftrace 0.17's: when `max - min` is not a multiple
/// of `step` the ir has one more in-range bucket than bpftrace, whose last in-range
/// bucket then counts as "above" (bpftrace labels it `[max, ...)`).
fn lhist_017_values(values: &[u64], min: i64, max: i64, step: i64) -> Vec<u64> {
    let b = lhist_017_buckets(min, max, step);
    let mut out = vec![0u64; b + 2];
    for (i, &v) in values.iter().enumerate() {
        let slot = i.min(b + 1);
        out[slot] = out[slot].wrapping_add(v);
    }
    out
}

/// bpftrace 0.17's `lhist_prepare`: the first and last non-empty bucket and the largest
/// count.
fn lhist_prepare(values: &[u64]) -> Option<(usize, usize, i32)> {
    let max_value = values.iter().map(|&v| v as i32).max().unwrap_or(0);
    if values.iter().all(|&v| v as i32 == 0) {
        return None;
    }
    let lo = values.iter().position(|&v| v > 0).unwrap_or(0);
    let hi = values.iter().rposition(|&v| v > 0).unwrap_or(0);
    Some((lo, hi, max_value))
}

/// bpftrace 0.17's `lhist_index_label`: multiples of 1M and 1K get a suffix (newer
/// bpftrace does so only when the step is a multiple of 1K).
fn lhist_label(number: i64) -> String {
    const KILO: i64 = 1024;
    const MEGA: i64 = 1024 * 1024;
    if number == 0 {
        "0".to_string()
    } else if number % MEGA == 0 {
        format!("{}M", number / MEGA)
    } else if number % KILO == 0 {
        format!("{}K", number / KILO)
    } else {
        number.to_string()
    }
}

/// The rows of an `lhist` (bpftrace applies no `div` to lhist counts).
pub fn lhist_text(values: &[u64], min: i64, max: i64, step: i64) -> Vec<u8> {
    let values = lhist_017_values(values, min, max, step);
    let b = lhist_017_buckets(min, max, step);
    let mut out = Vec::new();
    let Some((lo, hi, max_value)) = lhist_prepare(&values) else {
        return out;
    };
    for (i, &v) in values.iter().enumerate().take(hi + 1).skip(lo) {
        let label = if i == 0 {
            format!("(..., {})", lhist_label(min))
        } else if i == b + 1 {
            format!("[{}, ...)", lhist_label(max))
        } else {
            let i = i as i64;
            format!(
                "[{}, {})",
                lhist_label((i - 1) * step + min),
                lhist_label(i * step + min)
            )
        };
        row(&mut out, &label, v, v, max_value);
    }
    out
}

/// `[{"max": -1, "count": 1}, {"min": 0, "max": 9, "count": 2}, {"min": 100, "count": 1}]`
/// for an `lhist` (`[]` when empty).
pub fn lhist_json(values: &[u64], min: i64, max: i64, step: i64) -> Vec<u8> {
    let values = lhist_017_values(values, min, max, step);
    let b = lhist_017_buckets(min, max, step);
    let Some((lo, hi, _)) = lhist_prepare(&values) else {
        return b"[]".to_vec();
    };
    let mut elems = Vec::new();
    for (i, &v) in values.iter().enumerate().take(hi + 1).skip(lo) {
        let range = if i == 0 {
            format!("\"max\": {}, ", min - 1)
        } else if i == b + 1 {
            format!("\"min\": {max}, ")
        } else {
            let i = i as i64;
            format!(
                "\"min\": {}, \"max\": {}, ",
                (i - 1) * step + min,
                i * step + min - 1
            )
        };
        elems.push(format!("{{{range}\"count\": {v}}}"));
    }
    format!("[{}]", elems.join(", ")).into_bytes()
}

/// Maps named so (SystemTap's `@hist_log`/`@hist_linear` under `weft stap`) print
/// as SystemTap prints a histogram, without the map's name.
pub const STAP_HIST_PREFIX: &str = "@__stap_hist_";

/// Characters `v` takes in decimal (SystemTap's `needed_space`).
fn needed_space(v: i64) -> usize {
    if v == 0 {
        return 1;
    }
    let sign = usize::from(v < 0);
    sign + v.unsigned_abs().to_string().len()
}

/// SystemTap's histogram (`_stp_stat_print_histogram`): `hist` buckets as
/// `@hist_log` (the ir's power-of-two buckets; the ir keeps every negative value in
/// one bucket, printed as SystemTap's -1 bucket), or `lhist` buckets as `@hist_linear(start, stop, interval)`
/// (`linear`: `(start, interval)`; the ir's layout is SystemTap's: underflow, the
/// intervals from `start`, overflow).
pub fn stap_text(values: &[u64], linear: Option<(i64, i64)>) -> Vec<u8> {
    const WIDTH: usize = 50;
    const BUCKET0: usize = 64;
    let hist: Vec<i64> = match linear {
        Some(_) => values.iter().map(|&v| v as i64).collect(),
        None => {
            // ir index 0: negative; 1: 0; 2: 1; i >= 3: [2^(i-2), 2^(i-1)).
            let mut h = vec![0i64; 128];
            for (i, &v) in values.iter().enumerate() {
                let b = if i == 0 {
                    BUCKET0 - 1
                } else {
                    (BUCKET0 + i - 1).min(127)
                };
                h[b] += v as i64;
            }
            h
        }
    };
    let bucket_val = |i: usize| -> i64 {
        match linear {
            Some((start, interval)) => {
                if i == 0 {
                    start
                } else if i == hist.len() - 1 {
                    start + (i as i64 - 2) * interval
                } else {
                    start + (i as i64 - 1) * interval
                }
            }
            None => {
                if i == BUCKET0 {
                    0
                } else if i < BUCKET0 {
                    // SystemTap's `_stp_bucket_to_val`: -1, -2, -4, ... below 0.
                    i64::MIN >> i
                } else {
                    1i64 << (i - BUCKET0 - 1).min(62)
                }
            }
        }
    };
    let n = hist.len();
    let Some(first) = hist.iter().position(|&v| v > 0) else {
        return Vec::new();
    };
    let mut low = first as i64;
    let mut high = hist.iter().rposition(|&v| v > 0).unwrap_or(0);
    let valmax = hist.iter().copied().max().unwrap_or(0);
    for _ in 0..2 {
        if linear.is_none() {
            if low != BUCKET0 as i64 && low > 0 {
                low -= 1;
            }
        } else if low > 0 {
            low -= 1;
        }
        if high < n - 1 {
            high += 1;
        }
    }
    let (mut under, mut over) = (false, false);
    if linear.is_some() {
        if low == 0 && hist[0] == 0 {
            low += 1;
        }
        if high == n - 1 && hist[high] == 0 {
            high -= 1;
        }
        under = low == 0;
        over = high == n - 1;
    }
    let low = low as usize;
    let scale = if valmax <= WIDTH as i64 {
        1
    } else {
        (valmax + WIDTH as i64 - 1) / WIDTH as i64
    };
    let cnt_space = needed_space(valmax);
    let val_space = match linear {
        Some((start, interval)) => (needed_space(start) + usize::from(under))
            .max(needed_space(start + interval * high as i64) + usize::from(over)),
        None => needed_space(bucket_val(high)).max(needed_space(bucket_val(low))),
    }
    .max(5);
    let mut out = format!("{:>val_space$} |{} count\n", "value", "-".repeat(WIDTH));
    let mut eliding = false;
    for i in low..=high {
        let (lo, hi) = (i.saturating_sub(2).max(low), (i + 2).min(high));
        if (lo..=hi).all(|k| hist[k] == 0) {
            eliding = true;
            continue;
        }
        if eliding {
            out.push_str(&format!("{:>val_space$} ~\n", ""));
            eliding = false;
        }
        let prefix = match linear {
            Some(_) if i == 0 => "<",
            Some(_) if i == n - 1 => ">",
            _ => "",
        };
        let val = bucket_val(i);
        let pad = val_space.saturating_sub(needed_space(val));
        let v = (hist[i] / scale).max(0) as usize;
        out.push_str(&format!(
            "{prefix:>pad$}{val} |{}{:>w$}\n",
            "@".repeat(v),
            hist[i],
            w = WIDTH - v.min(WIDTH) + 1 + cnt_space
        ));
    }
    out.push('\n');
    out.into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels() {
        assert_eq!(hist_label(0, 0), "(..., 0)");
        assert_eq!(hist_label(1, 0), "[0]");
        assert_eq!(hist_label(2, 0), "[1]");
        assert_eq!(hist_label(3, 0), "[2, 4)");
        assert_eq!(hist_label(11, 0), "[512, 1K)");
        assert_eq!(hist_label(33, 0), "[2G, 4G)");
        assert_eq!(hist_label(42, 0), "[1T, 2T)");
        // k = 2: values 0..7 one per bucket, then 4 buckets per power of two.
        assert_eq!(hist_label(8, 2), "[7]");
        assert_eq!(hist_label(9, 2), "[8, 10)");
        assert_eq!(hist_label(28, 2), "[224, 256)");
        assert_eq!(lhist_label(2048), "2K");
        assert_eq!(lhist_label(3 * 1024 * 1024), "3M");
        assert_eq!(lhist_label(1000), "1000");
    }

    #[test]
    fn lhist_fold_for_uneven_range() {
        // lhist(x, 0, 95, 10): the ir has 10 in-range buckets, bpftrace 0.17 has 9.
        let mut v = vec![0u64; weft_ir::lhist_buckets(0, 95, 10) as usize];
        v[10] = 1; // [90, 100)
        v[11] = 2; // >= 95
        assert_eq!(lhist_017_values(&v, 0, 95, 10)[10], 3);
    }

    /// SystemTap's `_stp_stat_print_histogram`: two empty buckets each side (none
    /// below 0 for log), runs of empty ones elided with `~`.
    #[test]
    fn stap_histograms() {
        // hist(): 1 at 0, 3 at [1], 1 at [2^10, 2^11).
        let mut v = vec![0u64; 20];
        v[1] = 1;
        v[2] = 3;
        v[12] = 1;
        let want = "value |-------------------------------------------------- count
    0 |@                                                  1
    1 |@@@                                                3
    2 |                                                   0
    4 |                                                   0
      ~
  256 |                                                   0
  512 |                                                   0
 1024 |@                                                  1
 2048 |                                                   0
 4096 |                                                   0

";
        assert_eq!(String::from_utf8(stap_text(&v, None)).unwrap(), want);
        // 120 in one bucket: bars scaled by ceil(120 / 50) = 3.
        let lin = [0u64, 120, 5, 0, 0];
        let want = "value |-------------------------------------------------- count
    0 |@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@           120
   10 |@                                                    5
   20 |                                                     0

";
        assert_eq!(
            String::from_utf8(stap_text(&lin, Some((0, 10)))).unwrap(),
            want
        );
        assert!(stap_text(&[0, 0, 0], None).is_empty());
    }
}
