//! `strftime()` values and `time()` events, formatted with the C library's
//! `localtime_r` + `strftime` as bpftrace does (so `TZ` applies the same way).

use std::ffi::CString;

/// bpftrace formats into a `char[STRING_SIZE]` (64 bytes); longer results fail.
const STRING_SIZE: usize = 64;

/// A `strftime(fmt, nsecs)` value (`nsecs`: CLOCK_REALTIME). As in bpftrace, `%f` is
/// first replaced by the microseconds (6 digits); a result that does not fit 63 bytes
/// prints `(?)`.
pub fn strftime(fmt: &[u8], nsecs: u64) -> Vec<u8> {
    let secs = (nsecs / 1_000_000_000) as i64;
    let usecs = format!("{:06}", (nsecs % 1_000_000_000) / 1000);
    let fmt = replace_all(fmt, b"%f", usecs.as_bytes());
    local_strftime(&fmt, secs).unwrap_or_else(|| b"(?)".to_vec())
}

/// The text of a `time(fmt)` event at `secs` since the epoch, or `None` when bpftrace
/// would print nothing (the result does not fit 63 bytes). No `%f` here: bpftrace's
/// `time()` passes the format to `strftime` unchanged. No newline is added.
pub fn time_text(fmt: &[u8], secs: i64) -> Option<Vec<u8>> {
    local_strftime(fmt, secs)
}

fn local_strftime(fmt: &[u8], secs: i64) -> Option<Vec<u8>> {
    // The C format ends at its first NUL.
    let fmt = fmt.split(|&b| b == 0).next().unwrap_or_default();
    let cfmt = CString::new(fmt).ok()?;
    let t: libc::time_t = secs;
    // SAFETY: `tm` is plain old data; all-zero is a valid value.
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    // SAFETY: both pointers are valid for the call; localtime_r is thread-safe.
    if unsafe { libc::localtime_r(&t, &mut tm) }.is_null() {
        return None;
    }
    let mut buf = [0u8; STRING_SIZE];
    // SAFETY: `buf` has `STRING_SIZE` writable bytes, `cfmt` is NUL-terminated, `tm` is
    // initialized by localtime_r.
    let n = unsafe { libc::strftime(buf.as_mut_ptr().cast(), buf.len(), cfmt.as_ptr(), &tm) };
    // bpftrace treats 0 as failure (also for a format that legitimately yields "").
    (n != 0).then(|| buf[..n].to_vec())
}

/// Replace every non-overlapping `from`, left to right (`std::regex_replace`).
fn replace_all(s: &[u8], from: &[u8], to: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(s.len());
    let mut i = 0;
    while i < s.len() {
        if s[i..].starts_with(from) {
            out.extend_from_slice(to);
            i += from.len();
        } else {
            out.push(s[i]);
            i += 1;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timezone_independent_fields() {
        // 2001-09-09 01:46:40 UTC, 123456 us.
        let ns = 1_000_000_000 * 1_000_000_000 + 123_456_789;
        assert_eq!(strftime(b"%s.%f %%", ns), b"1000000000.123456 %".to_vec());
        assert_eq!(strftime(b"", ns), b"(?)".to_vec());
        assert_eq!(
            strftime(&[b'x'; 64], ns),
            b"(?)".to_vec(),
            "63 bytes at most"
        );
        assert_eq!(time_text(b"%s", 42), Some(b"42".to_vec()));
    }
}
