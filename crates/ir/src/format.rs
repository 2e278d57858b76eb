//! printf-style format strings: the conversions and the argument kind each
//! expects, found once by the front end (checking the arguments) and kept in each
//! [`crate::Format`] for the printer (`weft-output`), which formats piece by piece
//! at them, exactly as bpftrace 0.17.

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ArgKind {
    /// `%d %u %x %X %o`, with or without a length modifier
    Int,
    /// `%c`
    Char,
    /// `%s`
    Str,
    /// `%p`
    Ptr,
    /// `%r`, `%rx`, `%rh`: a buffer
    Buf,
}

impl ArgKind {
    /// What bpftrace calls the type a conversion takes, in its messages.
    pub fn type_name(self) -> &'static str {
        match self {
            ArgKind::Int | ArgKind::Char | ArgKind::Ptr => "integer",
            ArgKind::Str => "string",
            ArgKind::Buf => "buffer",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Conversion {
    /// Byte range of the conversion in the format text.
    pub start: usize,
    pub end: usize,
    /// The conversion without flags, width and precision (`lld`, `rx`).
    pub spec: &'static str,
    pub kind: ArgKind,
    /// The conversion as written (`%-20.5lld`).
    pub text: String,
}

/// The conversions bpftrace 0.17 knows, longest first (so `%rx` is not `%r` + `x`).
const SPECS: &[(&str, ArgKind)] = &{
    use ArgKind::*;
    [
        ("hhd", Int),
        ("hhu", Int),
        ("hho", Int),
        ("hhx", Int),
        ("hhX", Int),
        ("hhp", Ptr),
        ("lld", Int),
        ("llu", Int),
        ("llo", Int),
        ("llx", Int),
        ("llX", Int),
        ("llp", Ptr),
        ("rx", Buf),
        ("rh", Buf),
        ("hd", Int),
        ("hu", Int),
        ("ho", Int),
        ("hx", Int),
        ("hX", Int),
        ("hp", Ptr),
        ("ld", Int),
        ("lu", Int),
        ("lo", Int),
        ("lx", Int),
        ("lX", Int),
        ("lp", Ptr),
        ("jd", Int),
        ("ju", Int),
        ("jo", Int),
        ("jx", Int),
        ("jX", Int),
        ("jp", Ptr),
        ("zd", Int),
        ("zu", Int),
        ("zo", Int),
        ("zx", Int),
        ("zX", Int),
        ("zp", Ptr),
        ("td", Int),
        ("tu", Int),
        ("to", Int),
        ("tx", Int),
        ("tX", Int),
        ("tp", Ptr),
        ("s", Str),
        ("r", Buf),
        ("c", Char),
        ("d", Int),
        ("u", Int),
        ("o", Int),
        ("x", Int),
        ("X", Int),
        ("p", Ptr),
    ]
};

/// The conversions of a format, found as bpftrace 0.17 finds them (and as
/// `weft-output` prints them): its regex `%-?[0-9]*(\.[0-9]+)?(spec)`. So the flags
/// `+`, ` `, `#`, `*` widths and `%i`, `%e`, ... are not conversions: they take no
/// argument and print as they are (see [`not_conversions`]).
pub fn conversions(fmt: &str) -> Vec<Conversion> {
    let b = fmt.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        match conversion_at(fmt, i) {
            Some(c) => {
                i = c.end;
                out.push(c);
            }
            None => i += 1,
        }
    }
    out
}

fn conversion_at(fmt: &str, start: usize) -> Option<Conversion> {
    let b = fmt.as_bytes();
    if b.get(start) != Some(&b'%') {
        return None;
    }
    let digit = |j: usize| b.get(j).is_some_and(u8::is_ascii_digit);
    let mut j = start + 1;
    if b.get(j) == Some(&b'-') {
        j += 1;
    }
    while digit(j) {
        j += 1;
    }
    if b.get(j) == Some(&b'.') && digit(j + 1) {
        j += 1;
        while digit(j) {
            j += 1;
        }
    }
    let rest = &b[j..];
    let &(spec, kind) = SPECS.iter().find(|(s, _)| rest.starts_with(s.as_bytes()))?;
    let end = j + spec.len();
    Some(Conversion {
        start,
        end,
        spec,
        kind,
        text: fmt[start..end].to_string(),
    })
}

/// `%` sequences of a format that look like conversions but that bpftrace 0.17 does
/// not take as ones (`%i`, `%+d`, `%#x`, `%5.2f`): for a hint when the argument count
/// is wrong. `%%` is not listed.
pub fn not_conversions(fmt: &str) -> Vec<String> {
    let b = fmt.as_bytes();
    let taken: Vec<(usize, usize)> = conversions(fmt).iter().map(|c| (c.start, c.end)).collect();
    let inside = |i: usize| taken.iter().any(|&(s, e)| s <= i && i < e);
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if b[i] != b'%' || inside(i) {
            i += 1;
            continue;
        }
        if b.get(i + 1) == Some(&b'%') {
            i += 2;
            continue;
        }
        let mut j = i + 1;
        while j < b.len() && j - i < 8 && b"-+ #0*.123456789hlzjtqL".contains(&b[j]) {
            j += 1;
        }
        if j < b.len() && b[j].is_ascii_alphabetic() {
            out.push(fmt[i..=j].to_string());
        }
        i = j.max(i + 1);
    }
    out
}

/// A `%` sequence of a format with the width and precision glibc's `printf` would
/// read from it (digits only; `*` reads an argument and counts as none).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Field {
    /// The sequence from its `%` through its conversion letter, if any (`%-20.5lld`).
    pub text: String,
    /// The width as written, saturated at `u64::MAX` (0 when absent).
    pub width: u64,
    /// The precision as written, saturated at `u64::MAX`.
    pub precision: Option<u64>,
}

/// Every `%` sequence of a format (not `%%`), conversion or not: glibc pads and zero-fills
/// by what it reads there even when bpftrace would not take the sequence as a
/// conversion (`%+20d`), so the front end bounds them all
/// ([`crate::PRINTF_MAX_WIDTH`]).
pub fn fields(fmt: &str) -> Vec<Field> {
    let b = fmt.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    let number = |j: &mut usize| -> u64 {
        let mut v = 0u64;
        while let Some(&c) = b.get(*j).filter(|c| c.is_ascii_digit()) {
            v = v.saturating_mul(10).saturating_add(u64::from(c - b'0'));
            *j += 1;
        }
        v
    };
    while i < b.len() {
        if b[i] != b'%' {
            i += 1;
            continue;
        }
        if b.get(i + 1) == Some(&b'%') {
            i += 2;
            continue;
        }
        let mut j = i + 1;
        while b.get(j).is_some_and(|c| b"-+ #0'I".contains(c)) {
            j += 1;
        }
        if b.get(j) == Some(&b'*') {
            j += 1;
        }
        let width = number(&mut j);
        let mut precision = None;
        if b.get(j) == Some(&b'.') {
            j += 1;
            if b.get(j) == Some(&b'*') {
                j += 1;
            }
            precision = Some(number(&mut j));
        }
        while b.get(j).is_some_and(|c| b"hlLqjzZt".contains(c)) {
            j += 1;
        }
        if b.get(j).is_some_and(u8::is_ascii_alphabetic) {
            j += 1;
        }
        out.push(Field {
            text: fmt[i..j].to_string(),
            width,
            precision,
        });
        i = j;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_conversions() {
        let c = conversions("%-6d %s %%  %lu %rx %08.3llx");
        let kinds: Vec<ArgKind> = c.iter().map(|c| c.kind).collect();
        assert_eq!(
            kinds,
            vec![
                ArgKind::Int,
                ArgKind::Str,
                ArgKind::Int,
                ArgKind::Buf,
                ArgKind::Int
            ]
        );
        assert_eq!(c[0].text, "%-6d");
        assert!(conversions("%y").is_empty());
        assert!(conversions("abc %").is_empty());
    }

    /// bpftrace 0.17 takes neither `%i` nor the flags `+`, ` `, `#` (its printf then
    /// says "Too many arguments"); weft must count conversions the same way, or the
    /// arguments would be printed against the wrong conversions.
    #[test]
    fn only_bpftrace_conversions_take_arguments() {
        let texts =
            |f: &str| -> Vec<String> { conversions(f).into_iter().map(|c| c.text).collect() };
        assert_eq!(texts("%d %i %u %x %X %o"), ["%d", "%u", "%x", "%X", "%o"]);
        assert_eq!(texts("[%08X][%-8X][%#010x][%+d][% d]"), ["%08X", "%-8X"]);
        assert_eq!(
            texts("%.3d %5.3d %10.3s %hhd %zd %p %c"),
            ["%.3d", "%5.3d", "%10.3s", "%hhd", "%zd", "%p", "%c"]
        );
        assert_eq!(
            not_conversions("%d %i %#x %% %+d %5.2f"),
            ["%i", "%#x", "%+d", "%5.2f"]
        );
    }
}
