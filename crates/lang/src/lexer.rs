//! The lexer. It is driven by the parser one token at a time because bpftrace's
//! lexing depends on context: an attach point (`uprobe:/bin/bash:readline+0x10`) is
//! read as raw text ([`Lexer::scan_attach`]), everything else as tokens
//! ([`Lexer::next_token`]). Errors are collected, never fatal: a bad character is
//! reported and skipped.

use crate::ast::{BinOp, Include, Span};
use crate::diag::{Diagnostic, Diags};

#[derive(Clone, Debug, PartialEq)]
pub enum Tok {
    Int(u64),
    Str(Vec<u8>),
    Ident(String),
    /// `$name` (without the `$`).
    Var(String),
    /// `$1`
    Positional(u32),
    /// `$#`
    PositionalCount,
    /// `@name` or `@` (with the `@`).
    Map(String),
    LParen,
    RParen,
    LBrace,
    RBrace,
    LBracket,
    RBracket,
    Comma,
    Semi,
    Colon,
    Question,
    Dot,
    DotDot,
    Arrow,
    Plus,
    Minus,
    Star,
    Slash,
    Percent,
    Amp,
    Pipe,
    Caret,
    Tilde,
    Bang,
    Shl,
    Shr,
    EqEq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
    AndAnd,
    OrOr,
    Assign,
    /// `+=`, `<<=`, ...
    OpAssign(BinOp),
    PlusPlus,
    MinusMinus,
    Eof,
}

impl Tok {
    /// How the token is named in "expected X, found Y" messages.
    pub fn describe(&self) -> String {
        match self {
            Tok::Int(v) => format!("integer `{v}`"),
            Tok::Str(_) => "string literal".to_string(),
            Tok::Ident(s) => format!("`{s}`"),
            Tok::Var(s) => format!("`${s}`"),
            Tok::Positional(n) => format!("`${n}`"),
            Tok::PositionalCount => "`$#`".to_string(),
            Tok::Map(s) => format!("`{s}`"),
            Tok::Eof => "end of input".to_string(),
            other => format!("`{}`", other.punct_text()),
        }
    }

    fn punct_text(&self) -> &'static str {
        match self {
            Tok::LParen => "(",
            Tok::RParen => ")",
            Tok::LBrace => "{",
            Tok::RBrace => "}",
            Tok::LBracket => "[",
            Tok::RBracket => "]",
            Tok::Comma => ",",
            Tok::Semi => ";",
            Tok::Colon => ":",
            Tok::Question => "?",
            Tok::Dot => ".",
            Tok::DotDot => "..",
            Tok::Arrow => "->",
            Tok::Plus => "+",
            Tok::Minus => "-",
            Tok::Star => "*",
            Tok::Slash => "/",
            Tok::Percent => "%",
            Tok::Amp => "&",
            Tok::Pipe => "|",
            Tok::Caret => "^",
            Tok::Tilde => "~",
            Tok::Bang => "!",
            Tok::Shl => "<<",
            Tok::Shr => ">>",
            Tok::EqEq => "==",
            Tok::Ne => "!=",
            Tok::Lt => "<",
            Tok::Le => "<=",
            Tok::Gt => ">",
            Tok::Ge => ">=",
            Tok::AndAnd => "&&",
            Tok::OrOr => "||",
            Tok::Assign => "=",
            Tok::OpAssign(op) => match op {
                BinOp::Add => "+=",
                BinOp::Sub => "-=",
                BinOp::Mul => "*=",
                BinOp::Div => "/=",
                BinOp::Mod => "%=",
                BinOp::BitAnd => "&=",
                BinOp::BitOr => "|=",
                BinOp::BitXor => "^=",
                BinOp::Shl => "<<=",
                BinOp::Shr => ">>=",
                _ => "?=",
            },
            Tok::PlusPlus => "++",
            Tok::MinusMinus => "--",
            _ => "?",
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Token {
    pub tok: Tok,
    pub span: Span,
}

pub struct Lexer<'a> {
    src: &'a str,
    bytes: &'a [u8],
    pub pos: usize,
    pub diags: Diags,
    /// The `#include` lines met so far, in text order (each once, however often
    /// the parser re-lexes).
    pub includes: Vec<Include>,
    /// `#define NAME INTEGER` lines (each once), in text order.
    pub defines: Vec<(String, i64, Span)>,
}

/// An integer constant as C writes one: `64`, `-1`, `0x40`, `0100`, `64UL`, `(64)`.
fn define_value(v: &str) -> Option<i64> {
    let v = v.trim();
    if let Some(inner) = v.strip_prefix('(').and_then(|r| r.strip_suffix(')')) {
        return define_value(inner);
    }
    if let Some(neg) = v.strip_prefix('-') {
        return define_value(neg).map(i64::wrapping_neg);
    }
    let digits = v.trim_end_matches(['u', 'U', 'l', 'L']);
    let (radix, body) = if let Some(h) = digits.strip_prefix("0x").or(digits.strip_prefix("0X")) {
        (16, h)
    } else if digits.len() > 1 && digits.starts_with('0') {
        (8, &digits[1..])
    } else {
        (10, digits)
    };
    u64::from_str_radix(body, radix).ok().map(|n| n as i64)
}

fn is_ident_start(c: u8) -> bool {
    c.is_ascii_alphabetic() || c == b'_'
}
fn is_ident_char(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_'
}

impl<'a> Lexer<'a> {
    pub fn new(src: &'a str) -> Lexer<'a> {
        Lexer {
            src,
            bytes: src.as_bytes(),
            pos: 0,
            diags: Diags::default(),
            includes: Vec::new(),
            defines: Vec::new(),
        }
    }

    /// Length of the text in bytes.
    pub fn src_len(&self) -> usize {
        self.bytes.len()
    }

    fn peek_byte(&self, ahead: usize) -> u8 {
        *self.bytes.get(self.pos + ahead).unwrap_or(&0)
    }

    /// Skip whitespace, comments and preprocessor lines (`#include` lines are
    /// recorded in [`Lexer::includes`]; a `#!` first line is ignored).
    pub fn skip_trivia(&mut self) {
        loop {
            let c = self.peek_byte(0);
            if c == b' ' || c == b'\t' || c == b'\n' || c == b'\r' {
                self.pos += 1;
            } else if let Some(n) = self.continuation_at(self.pos) {
                // A line continuation between tokens is white space.
                self.pos += n;
            } else if c == b'/' && self.peek_byte(1) == b'/' {
                while self.pos < self.bytes.len() && self.bytes[self.pos] != b'\n' {
                    self.pos += 1;
                }
            } else if c == b'/' && self.peek_byte(1) == b'*' {
                let start = self.pos;
                match self.src[self.pos + 2..].find("*/") {
                    Some(i) => self.pos += 2 + i + 2,
                    None => {
                        self.pos = self.bytes.len();
                        self.diags
                            .error(Span::new(start, start + 2), "unterminated comment");
                    }
                }
            } else if c == b'#' && self.at_line_start() {
                // The directive goes on over line continuations, as the C
                // preprocessor reads it.
                let start = self.pos;
                while self.pos < self.bytes.len() && self.bytes[self.pos] != b'\n' {
                    match self.continuation_at(self.pos) {
                        Some(n) => self.pos += n,
                        None => self.pos += 1,
                    }
                }
                let line = self.src[start..self.pos].trim_end();
                let directive = line[1..].trim_start();
                let word: String = directive
                    .chars()
                    .take_while(|c| c.is_ascii_alphabetic())
                    .collect();
                let span = Span::new(start, start + line.len());
                if word == "include" {
                    self.include_line(directive["include".len()..].trim(), span);
                } else if word == "define" {
                    self.define_line(directive["define".len()..].trim(), span);
                } else if !line.starts_with("#!") {
                    self.diags.error(
                        span,
                        format!(
                            "preprocessor directive `#{word}` is not supported; only `#include` lines are accepted"
                        ),
                    );
                }
            } else {
                return;
            }
        }
    }

    /// The length of the line continuation at `at` (a backslash ending its line:
    /// `\` then `\n` or `\r\n`), if there is one. Continuations join lines between
    /// tokens, in strings and in preprocessor lines (C's line splicing), not inside a
    /// token or a `//` comment.
    fn continuation_at(&self, at: usize) -> Option<usize> {
        match self.bytes.get(at..at + 3) {
            Some([b'\\', b'\r', b'\n']) => Some(3),
            _ => (self.bytes.get(at..at + 2) == Some(b"\\\n")).then_some(2),
        }
    }

    /// `NAME VALUE` after `#define`: an integer constant (decimal, hex or octal,
    /// C's `u`/`l` suffixes, a sign, parentheses), usable wherever an enumerator
    /// is. Other macros are for headers (`#include`), which weft preprocesses.
    fn define_line(&mut self, rest: &str, span: Span) {
        if self.defines.iter().any(|d| d.2 == span) {
            return;
        }
        let name: String = rest
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        let value = rest[name.len()..].trim();
        let parsed = (!name.is_empty() && !name.starts_with(|c: char| c.is_ascii_digit()))
            .then(|| define_value(value))
            .flatten();
        match parsed {
            Some(v) => self.defines.push((name, v, span)),
            None => self.diags.push(
                Diagnostic::error(
                    span,
                    "a script's `#define` takes a name and an integer constant: `#define MAX 64`",
                )
                .with_help(
                    "macros with parameters or other values belong in a header (`#include`)",
                ),
            ),
        }
    }

    /// `<file.h>` or `"file.h"` after `#include`.
    fn include_line(&mut self, rest: &str, span: Span) {
        if self.includes.iter().any(|i| i.span == span) {
            return;
        }
        let name = match rest.as_bytes().first() {
            Some(b'<') => rest[1..].find('>').map(|e| (&rest[1..1 + e], true)),
            Some(b'"') => rest[1..].find('"').map(|e| (&rest[1..1 + e], false)),
            _ => None,
        };
        match name {
            Some((name, angled)) if !name.is_empty() => self.includes.push(Include {
                name: name.to_string(),
                angled,
                span,
            }),
            _ => self
                .diags
                .error(span, "expected `<FILE>` or `\"FILE\"` after `#include`"),
        }
    }

    fn at_line_start(&self) -> bool {
        self.src[..self.pos]
            .chars()
            .rev()
            .take_while(|c| *c != '\n')
            .all(|c| c == ' ' || c == '\t')
    }

    /// The next token in normal (expression) mode.
    pub fn next_token(&mut self) -> Token {
        loop {
            self.skip_trivia();
            let start = self.pos;
            if self.pos >= self.bytes.len() {
                return Token {
                    tok: Tok::Eof,
                    span: Span::new(start, start),
                };
            }
            if let Some(tok) = self.lex_one() {
                return Token {
                    tok,
                    span: Span::new(start, self.pos),
                };
            }
        }
    }

    /// One token, or None after reporting (and skipping) an invalid character.
    fn lex_one(&mut self) -> Option<Tok> {
        let start = self.pos;
        let c = self.peek_byte(0);
        if c.is_ascii_digit() {
            return Some(self.number());
        }
        if is_ident_start(c) {
            while is_ident_char(self.peek_byte(0)) {
                self.pos += 1;
            }
            return Some(Tok::Ident(self.src[start..self.pos].to_string()));
        }
        if c == b'"' {
            return Some(self.string());
        }
        if c == b'$' {
            self.pos += 1;
            let n = self.peek_byte(0);
            if n == b'#' {
                self.pos += 1;
                return Some(Tok::PositionalCount);
            }
            if n.is_ascii_digit() {
                while self.peek_byte(0).is_ascii_digit() {
                    self.pos += 1;
                }
                let text = &self.src[start + 1..self.pos];
                return match text.parse::<u32>() {
                    Ok(v) => Some(Tok::Positional(v)),
                    Err(_) => {
                        self.diags.error(
                            Span::new(start, self.pos),
                            "positional parameter number is too large",
                        );
                        Some(Tok::Positional(0))
                    }
                };
            }
            if is_ident_start(n) {
                while is_ident_char(self.peek_byte(0)) {
                    self.pos += 1;
                }
                return Some(Tok::Var(self.src[start + 1..self.pos].to_string()));
            }
            self.diags.error(
                Span::new(start, start + 1),
                "expected a variable name after `$`",
            );
            return None;
        }
        if c == b'@' {
            self.pos += 1;
            while is_ident_char(self.peek_byte(0)) {
                self.pos += 1;
            }
            return Some(Tok::Map(self.src[start..self.pos].to_string()));
        }
        let two = [c, self.peek_byte(1)];
        let three = [c, self.peek_byte(1), self.peek_byte(2)];
        let (tok, len) = match &three {
            b"<<=" => (Tok::OpAssign(BinOp::Shl), 3),
            b">>=" => (Tok::OpAssign(BinOp::Shr), 3),
            _ => match &two {
                b"==" => (Tok::EqEq, 2),
                b"!=" => (Tok::Ne, 2),
                b"<=" => (Tok::Le, 2),
                b">=" => (Tok::Ge, 2),
                b"<<" => (Tok::Shl, 2),
                b">>" => (Tok::Shr, 2),
                b"&&" => (Tok::AndAnd, 2),
                b"||" => (Tok::OrOr, 2),
                b"++" => (Tok::PlusPlus, 2),
                b"--" => (Tok::MinusMinus, 2),
                b"->" => (Tok::Arrow, 2),
                b".." => (Tok::DotDot, 2),
                b"+=" => (Tok::OpAssign(BinOp::Add), 2),
                b"-=" => (Tok::OpAssign(BinOp::Sub), 2),
                b"*=" => (Tok::OpAssign(BinOp::Mul), 2),
                b"/=" => (Tok::OpAssign(BinOp::Div), 2),
                b"%=" => (Tok::OpAssign(BinOp::Mod), 2),
                b"&=" => (Tok::OpAssign(BinOp::BitAnd), 2),
                b"|=" => (Tok::OpAssign(BinOp::BitOr), 2),
                b"^=" => (Tok::OpAssign(BinOp::BitXor), 2),
                _ => {
                    let t = match c {
                        b'(' => Tok::LParen,
                        b')' => Tok::RParen,
                        b'{' => Tok::LBrace,
                        b'}' => Tok::RBrace,
                        b'[' => Tok::LBracket,
                        b']' => Tok::RBracket,
                        b',' => Tok::Comma,
                        b';' => Tok::Semi,
                        b':' => Tok::Colon,
                        b'?' => Tok::Question,
                        b'.' => Tok::Dot,
                        b'+' => Tok::Plus,
                        b'-' => Tok::Minus,
                        b'*' => Tok::Star,
                        b'/' => Tok::Slash,
                        b'%' => Tok::Percent,
                        b'&' => Tok::Amp,
                        b'|' => Tok::Pipe,
                        b'^' => Tok::Caret,
                        b'~' => Tok::Tilde,
                        b'!' => Tok::Bang,
                        b'<' => Tok::Lt,
                        b'>' => Tok::Gt,
                        b'=' => Tok::Assign,
                        _ => {
                            let ch = self.src[self.pos..].chars().next().unwrap_or('?');
                            self.pos += ch.len_utf8();
                            if ch == '\'' {
                                // Report a whole 'c' once and read it as its code, so
                                // the parse goes on without a second error.
                                let rest = &self.src[self.pos..];
                                let close = rest
                                    .find('\'')
                                    .filter(|i| *i <= 4 && !rest[..*i].contains('\n'));
                                let code = close
                                    .and_then(|i| rest[..i].chars().next())
                                    .map(|c| c as u64);
                                if let Some(i) = close {
                                    self.pos += i + 1;
                                }
                                self.diags.error(
                                    Span::new(start, self.pos),
                                    "character literals are not supported; use the character's code (e.g. 65 for 'A')",
                                );
                                return code.map(Tok::Int);
                            }
                            let shown = if ch.is_control() {
                                ch.escape_default().to_string()
                            } else {
                                ch.to_string()
                            };
                            let msg = format!("invalid character `{shown}`");
                            self.diags.error(Span::new(start, self.pos), msg);
                            return None;
                        }
                    };
                    (t, 1)
                }
            },
        };
        self.pos += len;
        Some(tok)
    }

    /// Integer literals: decimal, `0x` hex, `0` octal, `_` separators, `1e6`, C
    /// suffixes (`u`, `l`, `ul`, `ll`, ...) and duration suffixes (`ns us ms s m h d`).
    fn number(&mut self) -> Tok {
        let start = self.pos;
        while is_ident_char(self.peek_byte(0)) {
            self.pos += 1;
        }
        let span = Span::new(start, self.pos);
        let text: String = self.src[start..self.pos]
            .chars()
            .filter(|c| *c != '_')
            .collect();
        match parse_int(&text) {
            Ok(v) => Tok::Int(v),
            Err(msg) => {
                self.diags.error(span, msg);
                Tok::Int(0)
            }
        }
    }

    fn string(&mut self) -> Tok {
        let start = self.pos;
        self.pos += 1;
        let mut out = Vec::new();
        loop {
            if self.pos >= self.bytes.len() || self.bytes[self.pos] == b'\n' {
                self.diags
                    .error(Span::new(start, self.pos), "unterminated string literal");
                return Tok::Str(out);
            }
            let c = self.bytes[self.pos];
            if c == b'"' {
                self.pos += 1;
                return Tok::Str(out);
            }
            if c != b'\\' {
                out.push(c);
                self.pos += 1;
                continue;
            }
            if let Some(n) = self.continuation_at(self.pos) {
                // A line continuation in a string: the string goes on on the next
                // line, without the backslash and the line break.
                self.pos += n;
                continue;
            }
            let esc_start = self.pos;
            self.pos += 1;
            let e = self.peek_byte(0);
            self.pos += 1;
            match e {
                b'n' => out.push(b'\n'),
                b't' => out.push(b'\t'),
                b'r' => out.push(b'\r'),
                b'a' => out.push(7),
                b'b' => out.push(8),
                b'f' => out.push(12),
                b'v' => out.push(11),
                b'e' => out.push(27),
                b'\\' => out.push(b'\\'),
                b'"' => out.push(b'"'),
                b'\'' => out.push(b'\''),
                b'?' => out.push(b'?'),
                b'0'..=b'7' => {
                    let mut v: u32 = u32::from(e - b'0');
                    for _ in 0..2 {
                        let d = self.peek_byte(0);
                        if (b'0'..=b'7').contains(&d) {
                            v = v * 8 + u32::from(d - b'0');
                            self.pos += 1;
                        } else {
                            break;
                        }
                    }
                    if v > 255 {
                        self.diags
                            .error(Span::new(esc_start, self.pos), "octal escape out of range");
                    }
                    out.push(v as u8);
                }
                b'x' => {
                    let mut v: u32 = 0;
                    let mut n = 0;
                    while n < 2 && self.peek_byte(0).is_ascii_hexdigit() {
                        v = v * 16 + (self.peek_byte(0) as char).to_digit(16).unwrap_or(0);
                        self.pos += 1;
                        n += 1;
                    }
                    if n == 0 {
                        self.diags.error(
                            Span::new(esc_start, self.pos),
                            "`\\x` escape needs hex digits",
                        );
                    }
                    out.push(v as u8);
                }
                0 => {
                    self.diags.error(
                        Span::new(start, self.pos.min(self.bytes.len())),
                        "unterminated string literal",
                    );
                    self.pos = self.bytes.len();
                    return Tok::Str(out);
                }
                _ => {
                    // Step back over a multi-byte character to keep positions on
                    // character boundaries.
                    self.pos -= 1;
                    let ch = self.src[self.pos..].chars().next().unwrap_or('?');
                    self.pos += ch.len_utf8();
                    self.diags.push(Diagnostic::error(
                        Span::new(esc_start, self.pos),
                        format!("unknown escape sequence `\\{}`", ch.escape_default()),
                    ));
                    let mut buf = [0u8; 4];
                    out.extend_from_slice(ch.encode_utf8(&mut buf).as_bytes());
                }
            }
        }
    }

    /// Read one attach point as raw text (`uprobe:/bin/a:f+0x10`, `BEGIN`,
    /// `uprobe:"/a b":f`). It ends at whitespace, `,`, `{`, `}`, `;`, at `)` when
    /// `in_parens`, and (before any `:`) at `/`. Quoted parts are kept verbatim.
    pub fn scan_attach(&mut self, in_parens: bool) -> Option<(String, Span)> {
        self.skip_trivia();
        let start = self.pos;
        let mut seen_colon = false;
        // `set:addr(@p, 8)`: spaces and commas inside parentheses are the attach
        // point's own.
        let mut depth = 0u32;
        while self.pos < self.bytes.len() {
            let c = self.bytes[self.pos];
            match c {
                b'(' if seen_colon => {
                    depth += 1;
                    self.pos += 1;
                }
                b')' if depth > 0 => {
                    depth -= 1;
                    self.pos += 1;
                }
                b' ' | b'\t' | b',' if depth > 0 => self.pos += 1,
                b' ' | b'\t' | b'\n' | b'\r' | b',' | b'{' | b'}' | b';' => break,
                b')' if in_parens => break,
                b'/' if !seen_colon => break,
                b'"' => {
                    self.pos += 1;
                    while self.pos < self.bytes.len()
                        && self.bytes[self.pos] != b'"'
                        && self.bytes[self.pos] != b'\n'
                    {
                        self.pos += 1;
                    }
                    if self.pos < self.bytes.len() && self.bytes[self.pos] == b'"' {
                        self.pos += 1;
                    } else {
                        self.diags.error(
                            Span::new(start, self.pos),
                            "unterminated quoted string in attach point",
                        );
                    }
                }
                _ => {
                    if c == b':' {
                        seen_colon = true;
                    }
                    let ch = self.src[self.pos..].chars().next().unwrap_or(' ');
                    self.pos += ch.len_utf8();
                }
            }
        }
        if self.pos == start {
            None
        } else {
            Some((
                self.src[start..self.pos].to_string(),
                Span::new(start, self.pos),
            ))
        }
    }
}

/// Parse the text of an integer literal (underscores already removed).
pub fn parse_int(text: &str) -> Result<u64, String> {
    let lower = text.to_ascii_lowercase();
    let too_large = || format!("integer literal `{text}` is too large for 64 bits");
    if let Some(hex) = lower.strip_prefix("0x") {
        let digits: String = hex.chars().take_while(|c| c.is_ascii_hexdigit()).collect();
        let suffix = &hex[digits.len()..];
        if digits.is_empty() || !is_int_suffix(suffix) {
            return Err(format!("invalid hexadecimal literal `{text}`"));
        }
        return u64::from_str_radix(&digits, 16).map_err(|_| too_large());
    }
    let digits: String = lower.chars().take_while(|c| c.is_ascii_digit()).collect();
    let mut rest = &lower[digits.len()..];
    let mut value: u64 = if digits.len() > 1 && digits.starts_with('0') {
        u64::from_str_radix(&digits[1..], 8)
            .map_err(|_| format!("invalid octal literal `{text}`"))?
    } else {
        digits.parse::<u64>().map_err(|_| too_large())?
    };
    if let Some(exp) = rest.strip_prefix('e') {
        let e: String = exp.chars().take_while(|c| c.is_ascii_digit()).collect();
        if e.is_empty() {
            return Err(format!(
                "invalid integer literal `{text}`: exponent needs digits"
            ));
        }
        rest = &exp[e.len()..];
        let e: u32 = e.parse().map_err(|_| too_large())?;
        let scale = 10u64.checked_pow(e).ok_or_else(too_large)?;
        value = value.checked_mul(scale).ok_or_else(too_large)?;
    }
    if is_int_suffix(rest) {
        return Ok(value);
    }
    let scale: u64 = match rest {
        "ns" => 1,
        "us" => 1_000,
        "ms" => 1_000_000,
        "s" => 1_000_000_000,
        "m" => 60_000_000_000,
        "h" => 3_600_000_000_000,
        "d" => 86_400_000_000_000,
        _ => return Err(format!("invalid integer literal `{text}`")),
    };
    value.checked_mul(scale).ok_or_else(too_large)
}

fn is_int_suffix(s: &str) -> bool {
    matches!(s, "" | "u" | "l" | "ul" | "lu" | "ll" | "ull" | "llu")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn toks(src: &str) -> Vec<Tok> {
        let mut lx = Lexer::new(src);
        let mut out = Vec::new();
        loop {
            let t = lx.next_token();
            if t.tok == Tok::Eof {
                break;
            }
            out.push(t.tok);
        }
        assert!(lx.diags.list.is_empty(), "{:?}", lx.diags.list);
        out
    }

    #[test]
    fn integer_forms() {
        assert_eq!(parse_int("1000"), Ok(1000));
        assert_eq!(parse_int("0x10"), Ok(16));
        assert_eq!(parse_int("010"), Ok(8));
        assert_eq!(parse_int("1e6"), Ok(1_000_000));
        assert_eq!(parse_int("10ul"), Ok(10));
        assert_eq!(parse_int("10ULL"), Ok(10));
        assert_eq!(parse_int("1ms"), Ok(1_000_000));
        assert_eq!(parse_int("2s"), Ok(2_000_000_000));
        assert_eq!(parse_int("18446744073709551615"), Ok(u64::MAX));
        assert!(parse_int("18446744073709551616").is_err());
        assert!(parse_int("0xzz").is_err());
        assert!(parse_int("12abc").is_err());
        assert_eq!(toks("1_000"), vec![Tok::Int(1000)]);
    }

    #[test]
    fn sigils_and_operators() {
        assert_eq!(
            toks("$x @m @ $1 $# <<= -> .. ++"),
            vec![
                Tok::Var("x".into()),
                Tok::Map("@m".into()),
                Tok::Map("@".into()),
                Tok::Positional(1),
                Tok::PositionalCount,
                Tok::OpAssign(BinOp::Shl),
                Tok::Arrow,
                Tok::DotDot,
                Tok::PlusPlus
            ]
        );
        assert_eq!(
            toks("$t.0.1"),
            vec![
                Tok::Var("t".into()),
                Tok::Dot,
                Tok::Int(0),
                Tok::Dot,
                Tok::Int(1)
            ]
        );
    }

    #[test]
    fn string_escapes() {
        assert_eq!(
            toks(r#""a\n\t\x41\101\"""#),
            vec![Tok::Str(b"a\n\tAA\"".to_vec())]
        );
    }

    #[test]
    fn comments_and_includes_are_trivia() {
        assert_eq!(
            toks("#include <linux/sched.h>\n// x\n/* y */ 1"),
            vec![Tok::Int(1)]
        );
    }

    #[test]
    fn include_lines_are_recorded() {
        let mut lx = Lexer::new("#include <linux/sched.h>\n  #include \"my.h\" // c\n1");
        assert_eq!(lx.next_token().tok, Tok::Int(1));
        let got: Vec<(&str, bool)> = lx
            .includes
            .iter()
            .map(|i| (i.name.as_str(), i.angled))
            .collect();
        assert_eq!(got, [("linux/sched.h", true), ("my.h", false)]);
        let mut lx = Lexer::new("#include my.h\n1");
        lx.next_token();
        assert!(lx.diags.has_errors());
    }

    #[test]
    fn attach_scanning() {
        let mut lx = Lexer::new("  uprobe:\"/a b\":f+0x10, BEGIN/pid/");
        assert_eq!(lx.scan_attach(false).unwrap().0, "uprobe:\"/a b\":f+0x10");
        assert_eq!(lx.next_token().tok, Tok::Comma);
        assert_eq!(lx.scan_attach(false).unwrap().0, "BEGIN");
        let mut lx = Lexer::new("set:addr(@p, 8), get:./a:x {");
        assert_eq!(lx.scan_attach(false).unwrap().0, "set:addr(@p, 8)");
        assert_eq!(lx.next_token().tok, Tok::Comma);
        assert_eq!(lx.scan_attach(false).unwrap().0, "get:./a:x");
    }
}
