//! printf-style format strings: find the conversions and the argument kind each
//! expects.

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ArgKind {
    /// `%d %i %u %x %X %o`
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

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Conversion {
    /// Byte range of the conversion in the format text.
    pub start: usize,
    pub end: usize,
    pub kind: ArgKind,
    pub text: String,
}

/// The conversions of a format, or a message about the first malformed one.
pub fn conversions(fmt: &str) -> Result<Vec<Conversion>, String> {
    let b = fmt.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if b[i] != b'%' {
            i += 1;
            continue;
        }
        let start = i;
        i += 1;
        if i < b.len() && b[i] == b'%' {
            i += 1;
            continue;
        }
        while i < b.len() && b"-+ #0".contains(&b[i]) {
            i += 1;
        }
        while i < b.len() && b[i].is_ascii_digit() {
            i += 1;
        }
        if i < b.len() && b[i] == b'.' {
            i += 1;
            while i < b.len() && b[i].is_ascii_digit() {
                i += 1;
            }
        }
        while i < b.len() && b"hlzjtqL".contains(&b[i]) {
            i += 1;
        }
        if i >= b.len() {
            return Err(format!(
                "incomplete conversion `{}` at the end of the format",
                &fmt[start..]
            ));
        }
        let kind = match b[i] {
            b'd' | b'i' | b'u' | b'x' | b'X' | b'o' => ArgKind::Int,
            b'c' => ArgKind::Char,
            b's' => ArgKind::Str,
            b'p' => ArgKind::Ptr,
            b'r' => {
                if i + 1 < b.len() && (b[i + 1] == b'x' || b[i + 1] == b'h') {
                    i += 1;
                }
                ArgKind::Buf
            }
            _ => {
                let ch = fmt[i..].chars().next().unwrap_or('?');
                return Err(format!("invalid conversion `{}{}`", &fmt[start..i], ch));
            }
        };
        i += 1;
        out.push(Conversion {
            start,
            end: i,
            kind,
            text: fmt[start..i].to_string(),
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_conversions() {
        let c = conversions("%-6d %s %%  %lu %rx %08.3llx").unwrap();
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
        assert!(conversions("%y").is_err());
        assert!(conversions("abc %").is_err());
    }
}
