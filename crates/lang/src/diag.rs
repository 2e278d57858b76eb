//! Diagnostics: located errors and warnings, rendered like rustc's.
//!
//! ```text
//! error: unknown function `prinft`; did you mean `printf`?
//!  --> script.bt:3:5
//!   |
//! 3 |     prinft("%d\n", pid);
//!   |     ^^^^^^
//! ```

use crate::ast::Span;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Severity {
    Error,
    Warning,
}

/// A secondary message: with a span it is rendered as its own located `note:`,
/// without one as `= note: ...` under the main snippet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Note {
    pub span: Option<Span>,
    pub message: String,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Diagnostic {
    pub severity: Severity,
    pub span: Span,
    pub message: String,
    pub notes: Vec<Note>,
    pub help: Option<String>,
}

impl Diagnostic {
    pub fn error(span: Span, message: impl Into<String>) -> Diagnostic {
        Diagnostic {
            severity: Severity::Error,
            span,
            message: message.into(),
            notes: Vec::new(),
            help: None,
        }
    }
    pub fn warning(span: Span, message: impl Into<String>) -> Diagnostic {
        Diagnostic {
            severity: Severity::Warning,
            ..Diagnostic::error(span, message)
        }
    }
    pub fn with_note(mut self, span: Option<Span>, message: impl Into<String>) -> Diagnostic {
        self.notes.push(Note {
            span,
            message: message.into(),
        });
        self
    }
    pub fn with_help(mut self, help: impl Into<String>) -> Diagnostic {
        self.help = Some(help.into());
        self
    }
    pub fn is_error(&self) -> bool {
        self.severity == Severity::Error
    }
}

/// A list of diagnostics being collected by a stage.
#[derive(Clone, Debug, Default)]
pub struct Diags {
    pub list: Vec<Diagnostic>,
}

impl Diags {
    pub fn push(&mut self, d: Diagnostic) {
        self.list.push(d);
    }
    pub fn error(&mut self, span: Span, message: impl Into<String>) {
        self.list.push(Diagnostic::error(span, message));
    }
    pub fn warning(&mut self, span: Span, message: impl Into<String>) {
        self.list.push(Diagnostic::warning(span, message));
    }
    pub fn has_errors(&self) -> bool {
        self.list.iter().any(Diagnostic::is_error)
    }
}

/// 1-based line and column (in characters) of a byte offset.
pub fn line_col(source: &str, offset: u32) -> (usize, usize) {
    let offset = (offset as usize).min(source.len());
    let offset = floor_char_boundary(source, offset);
    let before = &source[..offset];
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map(|i| i + 1).unwrap_or(0);
    let col = source[line_start..offset].chars().count() + 1;
    (line, col)
}

fn floor_char_boundary(s: &str, mut i: usize) -> usize {
    while i > 0 && !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

/// Render diagnostics as text, one after the other, each followed by a blank line.
pub fn render(diags: &[Diagnostic], source: &str, file_name: &str) -> String {
    let mut out = String::new();
    for d in diags {
        render_one(&mut out, d, source, file_name);
        out.push('\n');
    }
    out
}

fn render_one(out: &mut String, d: &Diagnostic, source: &str, file: &str) {
    let label = match d.severity {
        Severity::Error => "error",
        Severity::Warning => "warning",
    };
    out.push_str(&format!("{label}: {}\n", d.message));
    // The gutter is as wide as the largest line number shown.
    let mut width = digits(line_col(source, d.span.start).0);
    for n in &d.notes {
        if let Some(s) = n.span {
            width = width.max(digits(line_col(source, s.start).0));
        }
    }
    snippet(out, source, file, d.span, width);
    let pad = " ".repeat(width);
    for n in d.notes.iter().filter(|n| n.span.is_none()) {
        out.push_str(&format!("{pad} = note: {}\n", n.message));
    }
    if let Some(h) = &d.help {
        out.push_str(&format!("{pad} = help: {h}\n"));
    }
    for n in &d.notes {
        if let Some(s) = n.span {
            out.push_str(&format!("note: {}\n", n.message));
            snippet(out, source, file, s, width);
        }
    }
}

fn digits(n: usize) -> usize {
    n.to_string().len()
}

/// ` --> file:line:col`, the source line and a caret line under the span (only the
/// first line of a multi-line span is shown). A very long line is shown as a window
/// around the span; control characters are shown as their Unicode pictures (`␀`).
fn snippet(out: &mut String, source: &str, file: &str, span: Span, width: usize) {
    let (line, col) = line_col(source, span.start);
    let pad = " ".repeat(width);
    out.push_str(&format!("{pad}--> {file}:{line}:{col}\n"));
    out.push_str(&format!("{pad} |\n"));
    let text = source.lines().nth(line - 1).unwrap_or("");
    let text = text.trim_end_matches('\r');
    let chars: Vec<char> = text.chars().map(visible).collect();
    let start = col - 1;
    let span_chars = {
        let s = floor_char_boundary(source, (span.start as usize).min(source.len()));
        let e = floor_char_boundary(source, (span.end as usize).min(source.len()).max(s));
        source[s..e].chars().take_while(|c| *c != '\n').count()
    };
    let len = span_chars.min(chars.len().saturating_sub(start)).max(1);
    // The window shown: the whole line unless it is long.
    let (from, to) = if chars.len() <= MAX_SHOWN {
        (0, chars.len())
    } else {
        let from = start.saturating_sub(MAX_SHOWN / 3).min(chars.len());
        (from, (from + MAX_SHOWN).min(chars.len()))
    };
    let before = if from > 0 { "…" } else { "" };
    let after = if to < chars.len() { "…" } else { "" };
    let shown: String = chars[from..to].iter().collect();
    out.push_str(&format!("{line:>width$} | {before}{shown}{after}\n"));
    let len = len.min(to.saturating_sub(start)).max(1);
    // Tabs in the source line are kept in the caret line so columns line up.
    let lead: String = before
        .chars()
        .map(|_| ' ')
        .chain(
            chars[from..start.clamp(from, to)]
                .iter()
                .map(|&c| if c == '\t' { '\t' } else { ' ' }),
        )
        .collect();
    out.push_str(&format!("{pad} | {lead}{}\n", "^".repeat(len)));
}

/// The longest part of a source line a snippet shows, in characters.
const MAX_SHOWN: usize = 400;

/// A control character's Unicode picture (`␀`, `␛`, `␡`), so snippets never send
/// control codes to the terminal; other characters as they are.
fn visible(c: char) -> char {
    match c {
        '\t' => c,
        '\0'..='\x1f' => char::from_u32(0x2400 + c as u32).unwrap_or('?'),
        '\x7f' => '\u{2421}',
        _ => c,
    }
}

/// Edit distance counting insertions, deletions, substitutions and transpositions
/// of adjacent characters (optimal string alignment), for "did you mean".
pub fn edit_distance(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    let mut d = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for (i, row) in d.iter_mut().enumerate() {
        row[0] = i;
    }
    for (j, cell) in d[0].iter_mut().enumerate() {
        *cell = j;
    }
    for i in 1..=a.len() {
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            let mut v = (d[i - 1][j] + 1)
                .min(d[i][j - 1] + 1)
                .min(d[i - 1][j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                v = v.min(d[i - 2][j - 2] + 1);
            }
            d[i][j] = v;
        }
    }
    d[a.len()][b.len()]
}

/// The closest candidate within a distance of a third of the name's length (at least
/// 1, at most 3); ties go to the candidate whose length is closest to the name's.
pub fn suggest<'a>(name: &str, candidates: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    let len = name.chars().count();
    let limit = (len / 3).clamp(1, 3);
    let mut best: Option<((usize, usize), &str)> = None;
    for c in candidates {
        if c == name {
            continue;
        }
        // The distance is at least the difference in length: skip the quadratic
        // computation when that alone is too far (names can be megabytes long).
        if c.chars().count().abs_diff(len) > limit {
            continue;
        }
        let score = (edit_distance(name, c), c.chars().count().abs_diff(len));
        if score.0 <= limit && best.is_none_or(|(b, _)| score < b) {
            best = Some((score, c));
        }
    }
    best.map(|(_, c)| c)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suggestions() {
        assert_eq!(edit_distance("prinft", "printf"), 1);
        assert_eq!(
            suggest("prinft", ["print", "printf", "pid"]),
            Some("printf")
        );
        assert_eq!(suggest("cuont", ["count", "sum"]), Some("count"));
        assert_eq!(suggest("zzzzzz", ["count", "sum"]), None);
    }

    #[test]
    fn long_lines_and_control_characters() {
        let src = format!("{}\u{1}{}", "a".repeat(1000), "b".repeat(1000));
        let r = render(&[Diagnostic::error(Span::new(1000, 1001), "x")], &src, "f");
        assert!(r.lines().all(|l| l.chars().count() < MAX_SHOWN + 10), "{r}");
        let lines: Vec<&str> = r.lines().collect();
        let picture = lines[3].chars().position(|c| c == '\u{2401}');
        let caret = lines[4].chars().position(|c| c == '^');
        assert!(picture.is_some() && picture == caret, "{r}");
        assert!(!r.contains('\u{1}'));
    }

    #[test]
    fn line_and_column() {
        let src = "ab\ncd\n\tx";
        assert_eq!(line_col(src, 0), (1, 1));
        assert_eq!(line_col(src, 4), (2, 2));
        assert_eq!(line_col(src, 7), (3, 2));
    }
}
