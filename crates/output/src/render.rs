//! One value or one map key as text or JSON, as bpftrace 0.17's `Output::value_to_str`
//! and `MapKey::argument_value` print them.

use weft_ir::{StackMode, Type};

use crate::value::{decode, Value};
use crate::{time, Resolver};

/// Text (`-f text`, the default) or JSON (`-f json`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Style {
    Text,
    Json,
}

/// `print(value)` in text: the value and a newline (`(1, abc)`, `{ .a = 1 }`, `hello`).
pub fn print_value(ty: &Type, bytes: &[u8], r: &dyn Resolver) -> Vec<u8> {
    let mut out = value_str(Style::Text, ty, &decode(ty, bytes), 1, r);
    out.push(b'\n');
    out
}

/// A (non-aggregate) value as it appears after `@map[key]: ` or in `print(value)`.
/// `div` divides integers (bpftrace's `print(@m, top, div)`).
pub(crate) fn value_str(style: Style, ty: &Type, v: &Value, div: u32, r: &dyn Resolver) -> Vec<u8> {
    let s = common_value_str(style, ty, v, div, r);
    // bpftrace 0.17's `is_quoted_type`: ustack, usym, string, buffer, probe and inet
    // values are JSON strings; everything else is written bare. A MAC address and a
    // `strftime()` timestamp are quoted too: 0.17 wrote them bare, which is not JSON
    // (`[1,11/26/26]`), and upstream's JSON output writes each as the string it
    // formats to (tests/runtime/json-output, `strftime`).
    if style == Style::Json
        && matches!(
            ty,
            Type::UStack { .. }
                | Type::USym
                | Type::Str { .. }
                | Type::Buf { .. }
                | Type::ProbeName
                | Type::Inet
                | Type::MacAddr
                | Type::Timestamp
        )
    {
        let mut q = Vec::with_capacity(s.len() + 2);
        q.push(b'"');
        q.extend_from_slice(&json_escape(&s));
        q.push(b'"');
        q
    } else {
        s
    }
}

fn common_value_str(style: Style, ty: &Type, v: &Value, div: u32, r: &dyn Resolver) -> Vec<u8> {
    match (ty, v) {
        (Type::Int { bits, signed }, _) => int_div(v.as_u64(), *bits, *signed, div).into_bytes(),
        // An enum's value by its enumerator's name; JSON keeps the number (upstream,
        // for the programs that read it).
        (_, Value::Enum { value, name }) => match (style, name) {
            (Style::Text, Some(n)) => n.clone().into_bytes(),
            _ => int_div(*value as u64, 64, true, div).into_bytes(),
        },
        // Upstream bpftrace has a real `bool`: printed `true`/`false` (bare in JSON).
        (Type::Bool, _) => bool_str(v.as_u64() != 0).to_vec(),
        (_, Value::Str(s)) => s.clone(),
        (_, Value::Buf { len, data }) => hex_format_buffer(&data[..*len as usize], true, true),
        (Type::Tuple(tys), Value::Tuple(vals)) => {
            let elems: Vec<Vec<u8>> = tys
                .iter()
                .zip(vals)
                .map(|(t, v)| value_str(style, t, v, div, r))
                .collect();
            match style {
                Style::Text => wrap(b"(", &join(&elems, b", "), b")"),
                Style::Json => wrap(b"[", &join(&elems, b","), b"]"),
            }
        }
        (Type::Record(tys), Value::Record(vals)) => {
            let elems = tys
                .iter()
                .zip(vals)
                .map(|((n, t), (_, v))| field_str(style, n, &value_str(style, t, v, div, r)));
            struct_str_as(style, elems.collect())
        }
        (Type::CStruct(s), Value::Struct { fields, .. }) => {
            let elems =
                s.fields.iter().zip(fields).map(|(f, (_, v))| {
                    field_str(style, &f.name, &value_str(style, &f.ty, v, div, r))
                });
            struct_str_as(style, elems.collect())
        }
        (Type::CStruct(s), Value::Array(vals)) => {
            let elems: Vec<Vec<u8>> = s
                .fields
                .iter()
                .zip(vals)
                .map(|(f, v)| value_str(style, &f.ty, v, div, r))
                .collect();
            wrap(b"[", &join(&elems, b","), b"]")
        }
        (_, Value::USym(addr)) => usym_str(*addr, r, false, false),
        (_, Value::UStack { mode, ips }) => stack_str(*mode, ips, 8, r),
        (_, Value::Probe(id)) => r.probe_name(*id).into_bytes(),
        (_, Value::Timestamp { fmt, nsecs }) => timestamp_str(*fmt, *nsecs, r),
        (_, Value::Inet { af, addr }) => inet_str(*af, addr),
        (_, Value::MacAddr(mac)) => mac_str(mac),
        // A pointer value: `0x…` in text, as upstream prints it (bpftrace 0.17 printed
        // it in decimal); a number in JSON (upstream tests/runtime/json-output
        // `print_hex_values`).
        (_, Value::Ptr(p)) => match style {
            Style::Text => format!("0x{p:x}").into_bytes(),
            Style::Json => ((*p as i64) / i64::from(div.max(1)))
                .to_string()
                .into_bytes(),
        },
        _ => Vec::new(),
    }
}

/// An integer map value divided by `div`, with C's promotion rules for each width as
/// bpftrace 0.17 writes them (`int32_t / (int32_t)div`, `uint16_t / div`, ...).
pub(crate) fn int_div(raw: u64, bits: u8, signed: bool, div: u32) -> String {
    let div = div.max(1);
    match (bits, signed) {
        (64, true) => (raw as i64).wrapping_div(i64::from(div)).to_string(),
        (64, false) => (raw / u64::from(div)).to_string(),
        (32, true) => checked_or((raw as i32).checked_div(div as i32), raw as i32).to_string(),
        (32, false) => ((raw as u32) / div).to_string(),
        (16, true) => checked_or(
            i32::from(raw as i16).checked_div(i32::from(div as i16)),
            i32::from(raw as i16),
        )
        .to_string(),
        (16, false) => (u32::from(raw as u16) / div).to_string(),
        (8, true) => checked_or(
            i32::from(raw as i8).checked_div(i32::from(div as i8)),
            i32::from(raw as i8),
        )
        .to_string(),
        (8, false) => (u32::from(raw as u8) / div).to_string(),
        _ => (raw as i64 / i64::from(div)).to_string(),
    }
}

/// bpftrace would trap on a divisor that truncates to 0 (e.g. `div` 256 for an int8
/// value); print the value undivided instead.
fn checked_or<T>(v: Option<T>, undivided: T) -> T {
    v.unwrap_or(undivided)
}

fn field_str(style: Style, name: &str, value: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    match style {
        Style::Text => {
            out.push(b'.');
            out.extend_from_slice(name.as_bytes());
            out.extend_from_slice(b" = ");
        }
        Style::Json => {
            out.push(b'"');
            out.extend_from_slice(name.as_bytes());
            out.extend_from_slice(b"\": ");
        }
    }
    out.extend_from_slice(value);
    out
}

/// A `bool` as upstream bpftrace prints it everywhere but `%d`.
pub(crate) fn bool_str(b: bool) -> &'static [u8] {
    if b {
        b"true"
    } else {
        b"false"
    }
}

fn struct_str(elems: Vec<Vec<u8>>) -> Vec<u8> {
    // An empty struct is `{}` (upstream).
    if elems.is_empty() {
        return b"{}".to_vec();
    }
    wrap(b"{ ", &join(&elems, b", "), b" }")
}

/// A struct or record as text (`{ .a = 1 }`) or as a JSON object (`{"a": 1}`, no
/// space inside the braces, as upstream's json.cpp writes it).
fn struct_str_as(style: Style, elems: Vec<Vec<u8>>) -> Vec<u8> {
    match style {
        Style::Text => struct_str(elems),
        Style::Json => wrap(b"{", &join(&elems, b", "), b"}"),
    }
}

/// The key fields of a map entry, each as bpftrace's `MapKey::argument_value` prints it.
/// A [`Type::Tuple`] key is a multi-key map (`@m[a, b]`): one string per field.
pub(crate) fn key_fields(key_ty: &Type, key_bytes: &[u8], r: &dyn Resolver) -> Vec<Vec<u8>> {
    key_fields_as(Style::Text, key_ty, key_bytes, r)
}

/// [`key_fields`]; in JSON an enum's value is its number (upstream keeps JSON numeric).
pub(crate) fn key_fields_as(
    style: Style,
    key_ty: &Type,
    key_bytes: &[u8],
    r: &dyn Resolver,
) -> Vec<Vec<u8>> {
    let numeric = |v: Value| match v {
        Value::Enum { value, .. } if style == Style::Json => Value::Enum { value, name: None },
        v => v,
    };
    match key_ty {
        Type::Tuple(tys) => match decode(key_ty, key_bytes) {
            Value::Tuple(vals) => tys
                .iter()
                .zip(vals)
                .map(|(t, v)| key_value_str(t, &numeric(v), r))
                .collect(),
            _ => Vec::new(),
        },
        _ => vec![key_value_str(
            key_ty,
            &numeric(decode(key_ty, key_bytes)),
            r,
        )],
    }
}

/// `[a, b]` after the map name in text.
pub(crate) fn key_text(fields: &[Vec<u8>]) -> Vec<u8> {
    wrap(b"[", &join(fields, b", "), b"]")
}

/// `"a,b"` as a JSON object key.
pub(crate) fn key_json(fields: &[Vec<u8>]) -> Vec<u8> {
    wrap(b"\"", &json_escape(&join(fields, b",")), b"\"")
}

fn key_value_str(ty: &Type, v: &Value, r: &dyn Resolver) -> Vec<u8> {
    match v {
        // By the key's type, as upstream bpftrace prints it (0.17 printed every
        // integer key as an int64: `@[(uint64)-1]` showed `-1`).
        Value::Int(n) => n.to_string().into_bytes(),
        Value::UInt(n) => n.to_string().into_bytes(),
        Value::Enum { name: Some(n), .. } => n.clone().into_bytes(),
        Value::Enum { value, .. } => value.to_string().into_bytes(),
        Value::Bool(b) => bool_str(*b).to_vec(),
        Value::Str(s) => s.clone(),
        // bpftrace 0.17 prints the whole capacity of a buffer key, not just its length.
        Value::Buf { data, .. } => hex_format_buffer(data, true, true),
        Value::USym(addr) => usym_str(*addr, r, false, false),
        Value::UStack { mode, ips } => stack_str(*mode, ips, 4, r),
        Value::Probe(id) => r.probe_name(*id).into_bytes(),
        Value::Timestamp { fmt, nsecs } => timestamp_str(*fmt, *nsecs, r),
        Value::Inet { af, addr } => inet_str(*af, addr),
        Value::MacAddr(mac) => mac_str(mac),
        Value::Ptr(p) => format!("0x{p:x}").into_bytes(),
        Value::Array(vals) => {
            let elems: Vec<Vec<u8>> = match ty {
                Type::CStruct(s) => s
                    .fields
                    .iter()
                    .zip(vals)
                    .map(|(f, v)| key_value_str(&f.ty, v, r))
                    .collect(),
                _ => Vec::new(),
            };
            wrap(b"[", &join(&elems, b","), b"]")
        }
        Value::Struct { fields, .. } => {
            let elems: Vec<Vec<u8>> = match ty {
                Type::CStruct(s) => s
                    .fields
                    .iter()
                    .zip(fields)
                    .map(|(f, (n, v))| field_str(Style::Text, n, &key_value_str(&f.ty, v, r)))
                    .collect(),
                _ => Vec::new(),
            };
            // As upstream prints a struct anywhere: `{ .a = 1, .b = 2 }` (0.17 wrote
            // keys as `{.a=1,.b=2}`).
            struct_str(elems)
        }
        // Not possible as bpftrace keys (it rejects tuple keys): printed as text values.
        Value::Tuple(_) | Value::Record(_) => value_str(Style::Text, ty, v, 1, r),
        Value::None => Vec::new(),
    }
}

/// A `usym` as bpftrace's `resolve_usym(addr, pid, show_offset, show_module)` prints it.
pub(crate) fn usym_str(
    addr: u64,
    r: &dyn Resolver,
    show_offset: bool,
    show_module: bool,
) -> Vec<u8> {
    let mut out = String::new();
    match r.usym(addr) {
        Some(sym) => {
            out.push_str(&sym.name);
            if show_offset {
                out.push_str(&format!("+{}", sym.offset));
            }
            if show_module {
                out.push_str(&format!(" ({})", sym.module));
            }
        }
        None => {
            // libstdc++ prints a null `void*` as "0".
            if addr == 0 {
                out.push('0');
            } else {
                out.push_str(&format!("0x{addr:x}"));
            }
            if show_module {
                out.push_str(" ([unknown])");
            }
        }
    }
    out.into_bytes()
}

/// A stack as bpftrace's `get_stack` prints it: a newline, then one line per frame.
pub(crate) fn stack_str(mode: StackMode, ips: &[u64], indent: usize, r: &dyn Resolver) -> Vec<u8> {
    let mut out = b"\n".to_vec();
    for (i, &ip) in ips.iter().take_while(|&&ip| ip != 0).enumerate() {
        match mode {
            StackMode::Bpftrace if r.show_debug_info() => {
                // As bpftrace with blazesym: the inlined functions first, then the
                // function, each `@file:line`. A caller's line is its call's (the
                // return address is looked up one byte back).
                let at = if i == 0 { ip } else { ip.wrapping_sub(1) };
                let frames = r.source_frames(at);
                let at_line = |f: &crate::SourceFrame| match (&f.file, f.line) {
                    (Some(file), Some(line)) => format!("@{file}:{line}"),
                    _ => String::new(),
                };
                for f in frames.iter().filter(|f| f.inlined) {
                    out.resize(out.len() + indent, b' ');
                    let name = f.function.as_deref().unwrap_or("??");
                    out.extend_from_slice(format!("[inlined] {name}{}\n", at_line(f)).as_bytes());
                }
                out.resize(out.len() + indent, b' ');
                out.extend_from_slice(&usym_str(ip, r, true, false));
                if let Some(f) = frames.iter().find(|f| !f.inlined) {
                    out.extend_from_slice(at_line(f).as_bytes());
                }
            }
            StackMode::Bpftrace => {
                out.resize(out.len() + indent, b' ');
                out.extend_from_slice(&usym_str(ip, r, true, false));
            }
            StackMode::Perf => {
                out.extend_from_slice(format!("\t{ip:x} ").as_bytes());
                out.extend_from_slice(&usym_str(ip, r, true, true));
            }
            // Not in bpftrace 0.17; newer versions print the bare hex addresses.
            StackMode::Raw => out.extend_from_slice(format!("{ip:x}").as_bytes()),
        }
        out.push(b'\n');
    }
    out
}

fn timestamp_str(fmt: weft_ir::FmtId, nsecs: u64, r: &dyn Resolver) -> Vec<u8> {
    match r.format(fmt) {
        Some(f) => time::strftime(f.text.as_bytes(), nsecs),
        None => b"(?)".to_vec(),
    }
}

/// An `ntop()` address as bpftrace prints it: glibc's `inet_ntop` of the family's
/// bytes, and nothing for a family other than AF_INET and AF_INET6.
pub(crate) fn inet_str(af: u64, addr: &[u8; 16]) -> Vec<u8> {
    match af {
        weft_ir::AF_INET => ipv4_str(&addr[..4]).into_bytes(),
        weft_ir::AF_INET6 => ipv6_str(addr).into_bytes(),
        _ => Vec::new(),
    }
}

fn ipv4_str(b: &[u8]) -> String {
    format!("{}.{}.{}.{}", b[0], b[1], b[2], b[3])
}

/// glibc's `inet_ntop6`: groups in lowercase hex without leading zeros; the longest
/// run of two or more zero groups (the first of equal ones) becomes `::`; an address
/// whose first six groups are zero, or five zero groups then `ffff`, ends with its
/// last four bytes as an IPv4 address (`::1.2.3.4`, `::ffff:1.2.3.4`), unless the
/// zero run is longer (`::1`, `::`).
pub(crate) fn ipv6_str(b: &[u8; 16]) -> String {
    let words: [u16; 8] = std::array::from_fn(|i| u16::from_be_bytes([b[2 * i], b[2 * i + 1]]));
    // The longest run of zero groups: (start, length).
    let mut best: Option<(usize, usize)> = None;
    let mut cur: Option<(usize, usize)> = None;
    for (i, &w) in words.iter().enumerate() {
        if w == 0 {
            cur = Some(match cur {
                Some((s, n)) => (s, n + 1),
                None => (i, 1),
            });
        } else if let Some(c) = cur.take() {
            if best.is_none_or(|b| c.1 > b.1) {
                best = Some(c);
            }
        }
    }
    if let Some(c) = cur {
        if best.is_none_or(|b| c.1 > b.1) {
            best = Some(c);
        }
    }
    let best = best.filter(|b| b.1 >= 2);
    let mut out = String::new();
    for (i, &w) in words.iter().enumerate() {
        if let Some((s, n)) = best {
            if i >= s && i < s + n {
                if i == s {
                    out.push(':');
                }
                continue;
            }
        }
        if i != 0 {
            out.push(':');
        }
        if i == 6 && best.is_some_and(|(s, n)| s == 0 && (n == 6 || (n == 5 && words[5] == 0xffff)))
        {
            out.push_str(&ipv4_str(&b[12..]));
            return out;
        }
        out.push_str(&format!("{w:x}"));
    }
    if best.is_some_and(|(s, n)| s + n == 8) {
        out.push(':');
    }
    out
}

/// A MAC address as bpftrace prints it: `AA:BB:CC:DD:EE:FF`.
pub(crate) fn mac_str(m: &[u8; 6]) -> Vec<u8> {
    format!(
        "{:02X}:{:02X}:{:02X}:{:02X}:{:02X}:{:02X}",
        m[0], m[1], m[2], m[3], m[4], m[5]
    )
    .into_bytes()
}

/// bpftrace's `hex_format_buffer`: printable ASCII as is (when `keep_ascii`), other bytes
/// as `\xNN` (when `escape_hex`) or as `NN` separated by spaces.
pub(crate) fn hex_format_buffer(buf: &[u8], keep_ascii: bool, escape_hex: bool) -> Vec<u8> {
    let mut out = Vec::with_capacity(buf.len() * 4);
    for (i, &b) in buf.iter().enumerate() {
        if keep_ascii && (32..=126).contains(&b) {
            out.push(b);
        } else if escape_hex {
            out.extend_from_slice(format!("\\x{b:02x}").as_bytes());
        } else if i == buf.len() - 1 {
            out.extend_from_slice(format!("{b:02x}").as_bytes());
        } else {
            out.extend_from_slice(format!("{b:02x} ").as_bytes());
        }
    }
    out
}

/// bpftrace's `json_escape`. bpftrace 0.17 (and newer) treats `char` as signed, so a
/// byte >= 0x80 comes out as `\uffffffNN`; reproduced here.
pub(crate) fn json_escape(s: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(s.len());
    for &b in s {
        match b {
            b'"' => out.extend_from_slice(b"\\\""),
            b'\\' => out.extend_from_slice(b"\\\\"),
            b'\n' => out.extend_from_slice(b"\\n"),
            b'\r' => out.extend_from_slice(b"\\r"),
            b'\t' => out.extend_from_slice(b"\\t"),
            0..=0x1f => out.extend_from_slice(format!("\\u{b:04x}").as_bytes()),
            0x80..=0xff => out.extend_from_slice(format!("\\u{:x}", b as i8 as i32).as_bytes()),
            _ => out.push(b),
        }
    }
    out
}

pub(crate) fn join(elems: &[Vec<u8>], sep: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    for (i, e) in elems.iter().enumerate() {
        if i > 0 {
            out.extend_from_slice(sep);
        }
        out.extend_from_slice(e);
    }
    out
}

fn wrap(open: &[u8], body: &[u8], close: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(open.len() + body.len() + close.len());
    out.extend_from_slice(open);
    out.extend_from_slice(body);
    out.extend_from_slice(close);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_escape_matches_bpftrace() {
        assert_eq!(
            json_escape("é\x01\t\\\"\x7f".as_bytes()),
            b"\\uffffffc3\\uffffffa9\\u0001\\t\\\\\\\"\x7f".to_vec()
        );
    }

    #[test]
    fn hex_buffers() {
        assert_eq!(
            hex_format_buffer(b"ab\x01\xffc", true, true),
            b"ab\\x01\\xffc".to_vec()
        );
        assert_eq!(
            hex_format_buffer(b"ab\x01", false, true),
            b"\\x61\\x62\\x01".to_vec()
        );
        assert_eq!(
            hex_format_buffer(b"ab\x01", false, false),
            b"61 62 01".to_vec()
        );
    }

    /// Each address as glibc's `inet_ntop` prints it (the expected texts come from
    /// `socket.inet_ntop`, which calls it).
    #[test]
    fn ipv6_as_glibc_prints_it() {
        let cases = [
            ("00000000000000000000000000000000", "::"),
            ("00000000000000000000000000000001", "::1"),
            ("00000000000000000000000000020003", "::0.2.0.3"),
            ("00000000000000000000000000010002", "::0.1.0.2"),
            ("00000000000000000000000001020304", "::1.2.3.4"),
            ("00000000000000000000ffff01020304", "::ffff:1.2.3.4"),
            ("0000000000000000ffff000001020304", "::ffff:0:102:304"),
            ("00010000000000000000000000000000", "1::"),
            ("00010000000000020000000000000003", "1:0:0:2::3"),
            ("00010000000000020000000000030004", "1::2:0:0:3:4"),
            ("fe800000000000000000000000010002", "fe80::1:2"),
            ("20010db8000000000000000000000001", "2001:db8::1"),
            ("00010002000300040005000600070008", "1:2:3:4:5:6:7:8"),
            ("00000000000100000000000000000000", "0:0:1::"),
            ("00010000000200000003000000040000", "1:0:2:0:3:0:4:0"),
            ("00000000000000000000000100000000", "::1:0:0"),
        ];
        for (hex, text) in cases {
            let b: [u8; 16] =
                std::array::from_fn(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap());
            assert_eq!(ipv6_str(&b), text, "{hex}");
        }
    }

    #[test]
    fn inet_by_family_and_mac() {
        let mut a = [0u8; 16];
        a[..4].copy_from_slice(&[127, 0, 0, 1]);
        assert_eq!(inet_str(2, &a), b"127.0.0.1");
        assert_eq!(inet_str(10, &a), b"7f00:1::");
        assert_eq!(inet_str(3, &a), b"", "another family prints nothing");
        assert_eq!(
            mac_str(&[0x18, 0xc0, 0x4d, 8, 0x2e, 0xbb]),
            b"18:C0:4D:08:2E:BB"
        );
    }

    #[test]
    fn int_division_by_width() {
        assert_eq!(int_div(-3500i64 as u64, 64, true, 1000), "-3");
        assert_eq!(int_div(u64::MAX, 64, false, 1), "18446744073709551615");
        assert_eq!(int_div(-5i64 as u64, 32, true, 1), "-5");
        assert_eq!(int_div(200, 8, false, 3), "66");
        assert_eq!(
            int_div(-100i64 as u64, 8, true, 256),
            "-100",
            "(int8)256 == 0: undivided"
        );
    }
}
