//! `printf` (and `system`/`cat`) formatting, as bpftrace 0.17 does it.
//!
//! bpftrace finds conversions with the regex `%-?[0-9]*(\.[0-9]+)?(spec)` where `spec`
//! is one of `s r rx rh c d u o x X p` and `d u o x X p` with a length modifier
//! `hh h l ll j z t`. It cuts the format after each conversion and hands each piece,
//! with its one argument, to glibc's `snprintf`; the text after the last conversion is
//! printed as is. So, exactly as in bpftrace 0.17:
//!
//! * flags are `-` and `0` only, width and precision are digits (no `*`); `%+d`, `% d`,
//!   `%#x`, `%*d` are not conversions (they count as no argument);
//! * `%%` becomes `%` only in a piece that ends with a conversion; after the last
//!   conversion (or in a format without arguments) it stays `%%`;
//! * `%c` of 0 ends its piece (the C string stops at the NUL);
//! * `%d %u %x %o %c` take the low 32 bits, `%hd` 16, `%hhd` 8, `%ld %lld %jd %zd %td`
//!   all 64; `%p` prints `0x…` or `(nil)`;
//! * `%r` prints a buffer with non-printable bytes as `\xNN`, `%rx` every byte as
//!   `\xNN`, `%rh` as `NN NN`; with a width (`%10r`) glibc sees an unknown conversion and
//!   prints it literally.

use weft_ir::format::{conversions, ArgKind, Conversion};
use weft_ir::{Format, Type};

use crate::render::{self, hex_format_buffer, Style};
use crate::value::{decode, Value};
use crate::Resolver;

/// What bpftrace calls the type of a printf argument in its error messages.
fn arg_kind_name(ty: &Type) -> &'static str {
    match ty {
        Type::Int { .. } | Type::Bool | Type::Ptr(_) | Type::Enum(_) => "integer",
        Type::Str { .. }
        | Type::USym
        | Type::UStack { .. }
        | Type::ProbeName
        | Type::Timestamp
        | Type::Inet
        | Type::MacAddr => "string",
        Type::Buf { .. } => "buffer",
        Type::Tuple(_) => "tuple",
        Type::Record(_) => "record",
        Type::CStruct(s) if crate::value::is_c_array(&s.name) => "array",
        Type::CStruct(_) => "record",
        Type::Void => "none",
    }
}

/// Check a `printf` format against its arguments; the error is bpftrace's message
/// (without location), e.g. `printf: %s specifier expects a value of type string
/// (integer supplied)`.
pub fn validate_printf(text: &str, args: &[Type]) -> Result<(), String> {
    validate_format("printf", text, args)
}

/// [`validate_printf`] for any function taking a format (`printf`, `system`, `cat`):
/// `func` prefixes the message.
pub fn validate_format(func: &str, text: &str, args: &[Type]) -> Result<(), String> {
    let toks = conversions(text);
    if args.len() < toks.len() {
        return Err(format!(
            "{func}: Not enough arguments for format string ({} supplied, {} expected)",
            args.len(),
            toks.len()
        ));
    }
    if args.len() > toks.len() {
        return Err(format!(
            "{func}: Too many arguments for format string ({} supplied, {} expected)",
            args.len(),
            toks.len()
        ));
    }
    for (tok, ty) in toks.iter().zip(args) {
        let supplied = arg_kind_name(ty);
        if supplied != tok.kind.type_name() {
            return Err(format!(
                "{func}: %{} specifier expects a value of type {} ({supplied} supplied)",
                tok.spec,
                tok.kind.type_name()
            ));
        }
    }
    Ok(())
}

/// Format a `printf` of format `f`: `payload` is the argument tuple laid out as
/// `Type::Tuple(f.args)`. Returns the bytes bpftrace prints (no newline is added).
pub fn format_printf(f: &Format, payload: &[u8], r: &dyn Resolver) -> Vec<u8> {
    format_at(&f.text, &f.conversions, &f.args, payload, r)
}

/// [`format_printf`] of a format given as text (parsed here).
pub fn format_text(text: &str, args: &[Type], payload: &[u8], r: &dyn Resolver) -> Vec<u8> {
    format_at(text, &conversions(text), args, payload, r)
}

fn format_at(
    text: &str,
    toks: &[Conversion],
    args: &[Type],
    payload: &[u8],
    r: &dyn Resolver,
) -> Vec<u8> {
    let tuple = Type::Tuple(args.to_vec());
    let values = match decode(&tuple, payload) {
        Value::Tuple(v) => v,
        _ => Vec::new(),
    };
    let text = text.as_bytes();

    // bpftrace's FormatString::split: each piece ends with a conversion; the rest of
    // the text, if any, is a last piece.
    let mut pieces = Vec::new();
    let mut last = 0;
    for t in toks {
        pieces.push(&text[last..t.end]);
        last = t.end;
    }
    if last != text.len() {
        pieces.push(&text[last..]);
    }

    let mut out = Vec::new();
    let n = args.len().min(toks.len());
    for i in 0..n {
        let piece = pieces[i];
        let arg = match (&values[i], toks[i].kind) {
            // `%s` of a bool is its name (upstream); `%d` its value, 1 or 0.
            (Value::Bool(b), ArgKind::Str) => Printable::Str(render::bool_str(*b).to_vec()),
            // `%s` of an enum is its enumerator's name (the number if it has none);
            // `%d` its value (upstream, text and JSON alike).
            (Value::Enum { value, name }, ArgKind::Str) => Printable::Str(
                name.clone()
                    .unwrap_or_else(|| value.to_string())
                    .into_bytes(),
            ),
            (v, _) => printable(&args[i], v, r),
        };
        let mut formatted = match (&arg, buffer_spec(piece)) {
            (Printable::Buffer(bytes), Some(spec)) => {
                let hex = hex_format_buffer(bytes, spec == "%r", spec != "%rh");
                c_snprintf(&replace_r_specs(piece), Some(CArg::Str(&hex)))
            }
            (Printable::Buffer(bytes), None) => {
                let hex = hex_format_buffer(bytes, true, true);
                c_snprintf(piece, Some(CArg::Str(&hex)))
            }
            (Printable::Int(v), _) => c_snprintf(piece, Some(CArg::Int(*v))),
            (Printable::Str(s), _) => c_snprintf(piece, Some(CArg::Str(s))),
        };
        // bpftrace writes each piece as a C string: a NUL (`%c` of 0) ends it.
        if let Some(nul) = formatted.iter().position(|&b| b == 0) {
            formatted.truncate(nul);
        }
        out.extend_from_slice(&formatted);
    }
    if n < pieces.len() {
        out.extend_from_slice(pieces[n]);
    }
    out
}

/// An argument as bpftrace passes it to `snprintf`.
enum Printable {
    Int(u64),
    Str(Vec<u8>),
    Buffer(Vec<u8>),
}

fn printable(ty: &Type, v: &Value, r: &dyn Resolver) -> Printable {
    match v {
        Value::Int(_) | Value::UInt(_) | Value::Bool(_) | Value::Ptr(_) | Value::Enum { .. } => {
            Printable::Int(v.as_u64())
        }
        Value::Str(s) => Printable::Str(s.clone()),
        Value::Buf { len, data } => Printable::Buffer(data[..*len as usize].to_vec()),
        _ => Printable::Str(render::value_str(Style::Text, ty, v, 1, r)),
    }
}

/// bpftrace 0.17 looks at the piece from its last `%`: exactly `%r`, `%rx` or `%rh`
/// selects the buffer printing.
fn buffer_spec(piece: &[u8]) -> Option<&'static str> {
    let pct = piece.iter().rposition(|&b| b == b'%')?;
    match &piece[pct..] {
        b"%r" => Some("%r"),
        b"%rx" => Some("%rx"),
        b"%rh" => Some("%rh"),
        _ => None,
    }
}

/// bpftrace: `std::regex_replace(piece, std::regex("%r[x|h]?"), "%s")`.
fn replace_r_specs(piece: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(piece.len());
    let mut i = 0;
    while i < piece.len() {
        if piece[i] == b'%' && piece.get(i + 1) == Some(&b'r') {
            out.extend_from_slice(b"%s");
            i += 2;
            if matches!(piece.get(i), Some(b'x' | b'|' | b'h')) {
                i += 1;
            }
        } else {
            out.push(piece[i]);
            i += 1;
        }
    }
    out
}

// ---------------------------------------------------------------------------------
// glibc snprintf with one argument
// ---------------------------------------------------------------------------------

/// The argument of one `snprintf` call: integers travel as 64-bit values (bpftrace
/// passes `int64_t`/`uint64_t`), the conversion decides how many bits it reads.
#[derive(Clone, Copy)]
pub(crate) enum CArg<'a> {
    Int(u64),
    Str(&'a [u8]),
}

#[derive(Default)]
struct Spec {
    minus: bool,
    plus: bool,
    space: bool,
    hash: bool,
    zero: bool,
    width: usize,
    precision: Option<usize>,
    length: &'static str,
    conv: u8,
}

/// glibc's `snprintf(buf, size, fmt, arg)` for a format with (at most) one conversion
/// that takes an argument. Conversions beyond the first, or of a kind the argument
/// does not fit, would read garbage in C; here they are printed literally.
pub(crate) fn c_snprintf(fmt: &[u8], arg: Option<CArg<'_>>) -> Vec<u8> {
    let mut out = Vec::new();
    let mut arg = arg;
    let mut i = 0;
    while i < fmt.len() {
        if fmt[i] != b'%' {
            out.push(fmt[i]);
            i += 1;
            continue;
        }
        let (spec, end, star) = parse_spec(fmt, i);
        let literal = &fmt[i..end];
        i = end;
        match spec.conv {
            b'%' => out.push(b'%'),
            b'd' | b'i' | b'u' | b'o' | b'x' | b'X' | b'c' | b'p' if !star => match arg {
                Some(CArg::Int(v)) => {
                    arg = None;
                    format_int(&mut out, &spec, v);
                }
                _ => out.extend_from_slice(literal),
            },
            b's' if !star => match arg {
                Some(CArg::Str(s)) => {
                    arg = None;
                    let s = match spec.precision {
                        Some(p) if p < s.len() => &s[..p],
                        _ => s,
                    };
                    pad(&mut out, &spec, s);
                }
                _ => out.extend_from_slice(literal),
            },
            // Unknown conversions are printed as written; other valid ones (floats,
            // `%n`, a second argument) are undefined in bpftrace and printed as written
            // here.
            _ => out.extend_from_slice(literal),
        }
    }
    out
}

/// Parse a conversion at `fmt[start] == '%'`: the spec, the index after it, and whether
/// it uses `*` (an extra argument).
fn parse_spec(fmt: &[u8], start: usize) -> (Spec, usize, bool) {
    let mut s = Spec::default();
    let mut star = false;
    let mut j = start + 1;
    while let Some(&c) = fmt.get(j) {
        match c {
            b'-' => s.minus = true,
            b'+' => s.plus = true,
            b' ' => s.space = true,
            b'#' => s.hash = true,
            b'0' => s.zero = true,
            b'\'' | b'I' => {}
            _ => break,
        }
        j += 1;
    }
    if fmt.get(j) == Some(&b'*') {
        star = true;
        j += 1;
    }
    while let Some(&c) = fmt.get(j).filter(|c| c.is_ascii_digit()) {
        s.width = s
            .width
            .saturating_mul(10)
            .saturating_add(usize::from(c - b'0'));
        j += 1;
    }
    if fmt.get(j) == Some(&b'.') {
        j += 1;
        let mut p = 0usize;
        if fmt.get(j) == Some(&b'*') {
            star = true;
            j += 1;
        }
        while let Some(&c) = fmt.get(j).filter(|c| c.is_ascii_digit()) {
            p = p.saturating_mul(10).saturating_add(usize::from(c - b'0'));
            j += 1;
        }
        s.precision = Some(p);
    }
    // The front end refuses more; clamped here too, so no format pads without limit.
    let max = weft_ir::PRINTF_MAX_WIDTH as usize;
    s.width = s.width.min(max);
    s.precision = s.precision.map(|p| p.min(max));
    for len in ["hh", "h", "ll", "l", "L", "q", "j", "z", "Z", "t"] {
        if fmt[j.min(fmt.len())..].starts_with(len.as_bytes()) {
            s.length = len;
            j += len.len();
            break;
        }
    }
    match fmt.get(j) {
        Some(&c) => {
            s.conv = c;
            (s, j + 1, star)
        }
        None => (s, fmt.len(), star),
    }
}

fn format_int(out: &mut Vec<u8>, spec: &Spec, v: u64) {
    let wide = !matches!(spec.length, "" | "h" | "hh");
    match spec.conv {
        b'c' => pad(out, spec, &[v as u8]),
        b'p' if v == 0 => {
            // glibc prints a null pointer as the string "(nil)", whatever the precision.
            let nil_spec = Spec {
                precision: None,
                zero: false,
                ..*spec
            };
            pad(out, &nil_spec, b"(nil)");
        }
        b'p' => {
            let digits = format!("{v:x}").into_bytes();
            number(out, spec, b"0x", digits, false);
        }
        b'd' | b'i' => {
            let n: i64 = match spec.length {
                "hh" => i64::from(v as u8 as i8),
                "h" => i64::from(v as u16 as i16),
                _ if wide => v as i64,
                _ => i64::from(v as u32 as i32),
            };
            let sign: &[u8] = if n < 0 {
                b"-"
            } else if spec.plus {
                b"+"
            } else if spec.space {
                b" "
            } else {
                b""
            };
            let digits = n.unsigned_abs().to_string().into_bytes();
            number(out, spec, sign, digits, n == 0);
        }
        _ => {
            let n: u64 = match spec.length {
                "hh" => u64::from(v as u8),
                "h" => u64::from(v as u16),
                _ if wide => v,
                _ => u64::from(v as u32),
            };
            let (digits, prefix): (String, &[u8]) = match spec.conv {
                b'o' => (format!("{n:o}"), b""),
                b'x' => (
                    format!("{n:x}"),
                    if spec.hash && n != 0 { b"0x" } else { b"" },
                ),
                b'X' => (
                    format!("{n:X}"),
                    if spec.hash && n != 0 { b"0X" } else { b"" },
                ),
                _ => (n.to_string(), b""),
            };
            let mut digits = digits.into_bytes();
            if spec.conv == b'o' && spec.hash && digits[0] != b'0' {
                digits.insert(0, b'0');
            }
            number(out, spec, prefix, digits, n == 0);
        }
    }
}

/// Lay out a number: `prefix` (sign or `0x`), digits padded to the precision, then to
/// the width with spaces or (flag `0`, no precision) zeros after the prefix.
fn number(out: &mut Vec<u8>, spec: &Spec, prefix: &[u8], mut digits: Vec<u8>, is_zero: bool) {
    if let Some(p) = spec.precision {
        if p == 0 && is_zero && !(spec.conv == b'o' && spec.hash) {
            digits.clear();
        }
        if digits.len() < p {
            let mut padded = vec![b'0'; p - digits.len()];
            padded.extend_from_slice(&digits);
            digits = padded;
        }
    }
    let len = prefix.len() + digits.len();
    let fill = spec.width.saturating_sub(len);
    if spec.minus {
        out.extend_from_slice(prefix);
        out.extend_from_slice(&digits);
        out.resize(out.len() + fill, b' ');
    } else if spec.zero && spec.precision.is_none() {
        out.extend_from_slice(prefix);
        out.resize(out.len() + fill, b'0');
        out.extend_from_slice(&digits);
    } else {
        out.resize(out.len() + fill, b' ');
        out.extend_from_slice(prefix);
        out.extend_from_slice(&digits);
    }
}

/// Pad `s` with spaces to the width (glibc pads `%s` and `%c` with spaces even with the
/// `0` flag).
fn pad(out: &mut Vec<u8>, spec: &Spec, s: &[u8]) {
    let fill = spec.width.saturating_sub(s.len());
    if spec.minus {
        out.extend_from_slice(s);
        out.resize(out.len() + fill, b' ');
    } else {
        out.resize(out.len() + fill, b' ');
        out.extend_from_slice(s);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn int(fmt: &str, v: i64) -> String {
        String::from_utf8(c_snprintf(fmt.as_bytes(), Some(CArg::Int(v as u64)))).unwrap()
    }

    fn s(fmt: &str, v: &str) -> String {
        String::from_utf8(c_snprintf(fmt.as_bytes(), Some(CArg::Str(v.as_bytes())))).unwrap()
    }

    #[test]
    fn glibc_integers() {
        assert_eq!(int("%d", 1 << 33 | 5), "5");
        assert_eq!(int("%ld", -1), "-1");
        assert_eq!(int("%u", -1), "4294967295");
        assert_eq!(int("%hhd", 300), "44");
        assert_eq!(int("%hd", 70000), "4464");
        assert_eq!(int("%05d", -42), "-0042");
        assert_eq!(int("%-5d|", 42), "42   |");
        assert_eq!(int("%.3d", 7), "007");
        assert_eq!(int("%08.3d", 7), "     007");
        assert_eq!(int("%.0d", 0), "");
        assert_eq!(int("%x %X", 255), "ff %X");
        assert_eq!(int("%+d", 5), "+5");
        assert_eq!(int("%#x", 255), "0xff");
        assert_eq!(int("%#o", 8), "010");
        assert_eq!(int("%p", 0), "(nil)");
        assert_eq!(int("%10p", 0), "     (nil)");
        assert_eq!(int("%010p", 255), "0x000000ff");
        assert_eq!(int("%.5p", 255), "0x000ff");
        assert_eq!(int("%c", 256 + 66), "B");
        assert_eq!(int("%5c", 65), "    A");
    }

    #[test]
    fn glibc_strings_and_literals() {
        assert_eq!(s("[%10s][%-4s]", "hi"), "[        hi][%-4s]");
        assert_eq!(s("%.2s", "hello"), "he");
        assert_eq!(s("%6.3s", "hello"), "   hel");
        assert_eq!(s("%05s", "ab"), "   ab");
        assert_eq!(s("100%% %y %s", "x"), "100% %y x");
        assert_eq!(s("%%s", "x"), "%s", "the %% pairs first, so no conversion");
        assert_eq!(s("%10r", "x"), "%10r");
    }

    #[test]
    fn tokens_follow_bpftrace_regex() {
        let specs = |t: &str| conversions(t).iter().map(|t| t.spec).collect::<Vec<_>>();
        assert_eq!(
            specs("%d %-5s %05.2lld %rx %rh %r %hhu"),
            ["d", "s", "lld", "rx", "rh", "r", "hhu"]
        );
        assert_eq!(
            specs("%+d %#x %*d %ls %5.2f"),
            [] as [&str; 0],
            "flags other than - are no conversion"
        );
        assert_eq!(specs("%%d"), ["d"], "bpftrace's regex sees %d inside %%d");
    }

    #[test]
    fn validation_messages() {
        let int = Type::I64;
        let st = Type::Str { cap: 8 };
        assert_eq!(validate_printf("%d %s", &[int.clone(), st.clone()]), Ok(()));
        assert_eq!(
            validate_printf("%d %d", std::slice::from_ref(&int)),
            Err("printf: Not enough arguments for format string (1 supplied, 2 expected)".into())
        );
        assert_eq!(
            validate_printf("%d", &[int.clone(), int.clone()]),
            Err("printf: Too many arguments for format string (2 supplied, 1 expected)".into())
        );
        assert_eq!(
            validate_printf("%s", std::slice::from_ref(&int)),
            Err("printf: %s specifier expects a value of type string (integer supplied)".into())
        );
        assert_eq!(
            validate_printf("%-5lld", std::slice::from_ref(&st)),
            Err("printf: %lld specifier expects a value of type integer (string supplied)".into())
        );
        assert_eq!(
            validate_format("system", "%r", &[Type::Tuple(vec![int])]),
            Err("system: %r specifier expects a value of type buffer (tuple supplied)".into())
        );
        assert_eq!(
            validate_printf(
                "%s",
                &[Type::UStack {
                    depth: 3,
                    mode: weft_ir::StackMode::Perf
                }]
            ),
            Ok(())
        );
        assert_eq!(
            validate_printf("%d", &[Type::Ptr(Box::new(Type::U64))]),
            Ok(())
        );
    }

    /// The checker bounds widths and precisions (issue 24); should a format get here
    /// without that check, the printer clamps them instead of allocating without limit.
    #[test]
    fn huge_widths_and_precisions_are_clamped() {
        let max = weft_ir::PRINTF_MAX_WIDTH as usize;
        assert_eq!(int("%-9223372036854775808d", 7).len(), max);
        assert_eq!(int("%99999999999999999999999d", 7).len(), max);
        assert_eq!(int("%.99999999999d", 7).len(), max);
        assert_eq!(s("%-9223372036854775808s|", "x").len(), max + 1);
        assert_eq!(s("%.99999999999s", "xy"), "xy");
    }
}
