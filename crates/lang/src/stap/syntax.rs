//! SystemTap's script language: tokens, syntax tree and parser. Spans are byte
//! ranges of the `.stp` text, so every later diagnostic points into the script.

use crate::ast::Span;
use crate::diag::Diagnostic;

#[derive(Clone, Debug, PartialEq)]
pub enum Tok {
    Ident(String),
    /// `$name` (a target variable), `$$name` (`$$parms`, `$$name`, ...: the `$$` kept).
    Target(String),
    /// `@entry`, `@count`, ...: the name without `@`.
    At(String),
    Num(i64),
    Str(Vec<u8>),
    /// Punctuation and operators, longest first.
    Punct(&'static str),
    Eof,
}

impl Tok {
    pub fn describe(&self) -> String {
        match self {
            Tok::Ident(s) => format!("identifier '{s}'"),
            Tok::Target(s) => format!("'${s}'"),
            Tok::At(s) => format!("'@{s}'"),
            Tok::Num(n) => format!("number '{n}'"),
            Tok::Str(_) => "string".to_string(),
            Tok::Punct(p) => format!("operator '{p}'"),
            Tok::Eof => "end of input".to_string(),
        }
    }
}

const PUNCTS: &[&str] = &[
    "<<<", "<<=", ">>=", "->", "++", "--", "+=", "-=", "*=", "/=", "%=", "&=", "|=", "^=", ".=",
    "==", "!=", "<=", ">=", "&&", "||", "<<", ">>", "{", "}", "(", ")", "[", "]", ",", ";", ".",
    "?", ":", "=", "+", "-", "*", "/", "%", "<", ">", "!", "~", "&", "|", "^",
];

pub fn lex(src: &str) -> Result<Vec<(Tok, Span)>, Diagnostic> {
    let b = src.as_bytes();
    let mut i = 0;
    let mut out = Vec::new();
    let err = |at: usize, len: usize, m: String| Diagnostic::error(Span::new(at, at + len), m);
    while i < b.len() {
        let c = b[i];
        if c.is_ascii_whitespace() {
            i += 1;
            continue;
        }
        if c == b'#' || (c == b'/' && b.get(i + 1) == Some(&b'/')) {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
            continue;
        }
        if c == b'/' && b.get(i + 1) == Some(&b'*') {
            let start = i;
            i += 2;
            while i + 1 < b.len() && !(b[i] == b'*' && b[i + 1] == b'/') {
                i += 1;
            }
            if i + 1 >= b.len() {
                return Err(err(start, 2, "unterminated comment".into()));
            }
            i += 2;
            continue;
        }
        let start = i;
        let ident_at = |j: usize| {
            let mut k = j;
            while k < b.len() && (b[k].is_ascii_alphanumeric() || b[k] == b'_') {
                k += 1;
            }
            k
        };
        if c.is_ascii_alphabetic() || c == b'_' {
            i = ident_at(i);
            out.push((Tok::Ident(src[start..i].to_string()), Span::new(start, i)));
            continue;
        }
        if c == b'$' {
            let mut j = i + 1;
            if b.get(j) == Some(&b'$') {
                j += 1;
            }
            let e = ident_at(j);
            if e == j {
                return Err(err(start, j - start, "expected a name after '$'".into()));
            }
            let mut e2 = e;
            // `$$vars$`, `$$parms$$`: the pretty-printing suffixes.
            while b.get(e2) == Some(&b'$') && j == i + 2 {
                e2 += 1;
            }
            out.push((
                Tok::Target(src[i + 1..e2].to_string()),
                Span::new(start, e2),
            ));
            i = e2;
            continue;
        }
        if c == b'@' {
            let e = ident_at(i + 1);
            if e == i + 1 {
                return Err(err(start, 1, "expected a name after '@'".into()));
            }
            out.push((Tok::At(src[i + 1..e].to_string()), Span::new(start, e)));
            i = e;
            continue;
        }
        if c.is_ascii_digit() {
            let e = ident_at(i);
            let text = &src[i..e];
            let v = if let Some(h) = text.strip_prefix("0x").or(text.strip_prefix("0X")) {
                u64::from_str_radix(h, 16).map(|v| v as i64).ok()
            } else if text.len() > 1 && text.starts_with('0') {
                i64::from_str_radix(&text[1..], 8).ok()
            } else {
                text.parse::<u64>().map(|v| v as i64).ok()
            };
            match v {
                Some(v) => out.push((Tok::Num(v), Span::new(i, e))),
                None => return Err(err(i, e - i, format!("invalid number '{text}'"))),
            }
            i = e;
            continue;
        }
        if c == b'"' {
            let mut s = Vec::new();
            i += 1;
            loop {
                match b.get(i) {
                    None | Some(b'\n') => {
                        return Err(err(start, 1, "unterminated string".into()));
                    }
                    Some(b'"') => {
                        i += 1;
                        break;
                    }
                    Some(b'\\') => {
                        let e = b.get(i + 1).copied().unwrap_or(b'\\');
                        i += 2;
                        match e {
                            b'n' => s.push(b'\n'),
                            b't' => s.push(b'\t'),
                            b'r' => s.push(b'\r'),
                            b'0'..=b'7' => {
                                let mut v = u32::from(e - b'0');
                                let mut k = 0;
                                while k < 2 && matches!(b.get(i), Some(b'0'..=b'7')) {
                                    v = v * 8 + u32::from(b[i] - b'0');
                                    i += 1;
                                    k += 1;
                                }
                                s.push(v as u8);
                            }
                            other => s.push(other),
                        }
                    }
                    Some(&x) => {
                        s.push(x);
                        i += 1;
                    }
                }
            }
            out.push((Tok::Str(s), Span::new(start, i)));
            continue;
        }
        match PUNCTS.iter().find(|p| src[i..].starts_with(**p)) {
            Some(p) => {
                i += p.len();
                out.push((Tok::Punct(p), Span::new(start, i)));
            }
            None => {
                let ch = src[i..].chars().next().unwrap_or('?');
                return Err(err(
                    i,
                    ch.len_utf8(),
                    format!("unexpected character '{ch}'"),
                ));
            }
        }
    }
    out.push((Tok::Eof, Span::new(b.len(), b.len())));
    Ok(out)
}

// ---------------------------------------------------------------------------
// Syntax tree

#[derive(Clone, Debug, PartialEq)]
pub struct Script {
    pub globals: Vec<Global>,
    pub probes: Vec<Probe>,
    pub functions: Vec<Function>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Global {
    pub name: String,
    pub span: Span,
    pub init: Option<Expr>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Probe {
    pub points: Vec<ProbePoint>,
    pub body: Stmt,
    pub span: Span,
}

/// `process("a").function("b").return`: its components.
#[derive(Clone, Debug, PartialEq)]
pub struct ProbePoint {
    pub comps: Vec<Comp>,
    /// `?` or `!` after it: optional.
    pub optional: bool,
    pub span: Span,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Comp {
    pub name: String,
    pub arg: Option<Lit>,
    pub span: Span,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Lit {
    Num(i64),
    Str(String),
}

impl ProbePoint {
    pub fn text(&self) -> String {
        self.comps
            .iter()
            .map(|c| match &c.arg {
                None => c.name.clone(),
                Some(Lit::Num(n)) => format!("{}({n})", c.name),
                Some(Lit::Str(s)) => format!("{}(\"{s}\")", c.name),
            })
            .collect::<Vec<_>>()
            .join(".")
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Function {
    pub name: String,
    pub params: Vec<(String, Span)>,
    pub body: Stmt,
    pub span: Span,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Stmt {
    pub kind: StmtKind,
    pub span: Span,
}

#[derive(Clone, Debug, PartialEq)]
pub enum StmtKind {
    Block(Vec<Stmt>),
    Expr(Expr),
    If(Expr, Box<Stmt>, Option<Box<Stmt>>),
    While(Expr, Box<Stmt>),
    For(Option<Expr>, Option<Expr>, Option<Expr>, Box<Stmt>),
    Foreach(Box<Foreach>),
    Delete(Expr),
    Next,
    Break,
    Continue,
    Return(Option<Expr>),
    Empty,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Foreach {
    /// `v = ...`: the value's variable.
    pub value: Option<(String, Span)>,
    pub keys: Vec<(String, Span)>,
    pub array: String,
    pub array_span: Span,
    /// Sort: 0 is the value, 1.. the keys (1-based); `true` ascending.
    pub sort: Option<(usize, bool, Span)>,
    pub limit: Option<Expr>,
    pub body: Stmt,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Expr {
    pub kind: ExprKind,
    pub span: Span,
}

#[derive(Clone, Debug, PartialEq)]
pub enum ExprKind {
    Num(i64),
    Str(Vec<u8>),
    Ident(String),
    /// `name[k, ...]`
    Index(String, Span, Vec<Expr>),
    Call(String, Span, Vec<Expr>),
    /// `$name`, then `->field`s (or `.field`).
    Target(String, Vec<String>),
    /// `$$name`, `$$parms`, ...
    Special(String),
    /// `@entry(e)`, `@count(e)`, ...
    At(String, Vec<Expr>),
    Unary(&'static str, Box<Expr>),
    Binary(&'static str, Box<Expr>, Box<Expr>),
    Ternary(Box<Expr>, Box<Expr>, Box<Expr>),
    /// `lhs op rhs` where op is `=`, `+=`, ..., `<<<`.
    Assign(&'static str, Box<Expr>, Box<Expr>),
    /// `++x` / `x++` (`inc`, `prefix`)
    IncDec(bool, bool, Box<Expr>),
    /// `[k, ...] in name` / `k in name`
    In(Vec<Expr>, String, Span),
}

// ---------------------------------------------------------------------------
// Parser

pub struct Parser<'a> {
    toks: &'a [(Tok, Span)],
    pos: usize,
}

type R<T> = Result<T, Diagnostic>;

pub fn parse(src: &str) -> R<Script> {
    let toks = lex(src)?;
    let mut p = Parser {
        toks: &toks,
        pos: 0,
    };
    p.script()
}

impl Parser<'_> {
    fn peek(&self) -> &Tok {
        &self.toks[self.pos].0
    }
    fn peek_at(&self, n: usize) -> &Tok {
        &self.toks[(self.pos + n).min(self.toks.len() - 1)].0
    }
    fn span(&self) -> Span {
        self.toks[self.pos].1
    }
    fn prev_end(&self) -> u32 {
        self.toks[self.pos.saturating_sub(1)].1.end
    }
    fn bump(&mut self) -> (Tok, Span) {
        let t = self.toks[self.pos].clone();
        if self.pos + 1 < self.toks.len() {
            self.pos += 1;
        }
        t
    }
    fn is(&self, p: &str) -> bool {
        matches!(self.peek(), Tok::Punct(q) if *q == p)
    }
    fn is_kw(&self, k: &str) -> bool {
        matches!(self.peek(), Tok::Ident(s) if s == k)
    }
    fn eat(&mut self, p: &str) -> bool {
        if self.is(p) {
            self.bump();
            true
        } else {
            false
        }
    }
    fn unexpected(&self, wanted: &str) -> Diagnostic {
        Diagnostic::error(
            self.span(),
            format!(
                "parse error: expected {wanted}, saw {}",
                self.peek().describe()
            ),
        )
    }
    fn expect(&mut self, p: &str) -> R<Span> {
        if self.is(p) {
            Ok(self.bump().1)
        } else {
            Err(self.unexpected(&format!("'{p}'")))
        }
    }
    fn ident(&mut self) -> R<(String, Span)> {
        match self.peek().clone() {
            Tok::Ident(s) => {
                let sp = self.bump().1;
                Ok((s, sp))
            }
            _ => Err(self.unexpected("an identifier")),
        }
    }

    fn script(&mut self) -> R<Script> {
        let mut s = Script {
            globals: Vec::new(),
            probes: Vec::new(),
            functions: Vec::new(),
        };
        loop {
            match self.peek().clone() {
                Tok::Eof => return Ok(s),
                Tok::Ident(k) if k == "global" => {
                    self.bump();
                    loop {
                        let (name, span) = self.ident()?;
                        // `global a[100]`: a size, ignored.
                        if self.eat("[") {
                            while !self.is("]") && !matches!(self.peek(), Tok::Eof) {
                                self.bump();
                            }
                            self.expect("]")?;
                        }
                        let init = if self.eat("=") {
                            Some(self.unary()?)
                        } else {
                            None
                        };
                        s.globals.push(Global { name, span, init });
                        if !self.eat(",") {
                            break;
                        }
                    }
                    self.eat(";");
                }
                Tok::Ident(k) if k == "probe" => {
                    let start = self.bump().1;
                    let mut points = vec![self.probe_point()?];
                    if self.is("=") {
                        return Err(Diagnostic::error(
                            self.span(),
                            "probe aliases (`probe NAME = POINT`) are not supported by weft stap",
                        ));
                    }
                    while self.eat(",") {
                        points.push(self.probe_point()?);
                    }
                    let body = self.block()?;
                    let span = start.to(body.span);
                    s.probes.push(Probe { points, body, span });
                }
                Tok::Ident(k) if k == "function" => {
                    let start = self.bump().1;
                    let (name, _) = self.ident()?;
                    self.type_suffix()?;
                    self.expect("(")?;
                    let mut params = Vec::new();
                    if !self.is(")") {
                        loop {
                            params.push(self.ident()?);
                            self.type_suffix()?;
                            if !self.eat(",") {
                                break;
                            }
                        }
                    }
                    self.expect(")")?;
                    let body = self.block()?;
                    let span = start.to(body.span);
                    s.functions.push(Function {
                        name,
                        params,
                        body,
                        span,
                    });
                }
                Tok::Punct("%") if matches!(self.peek_at(1), Tok::Punct("{")) => {
                    return Err(Diagnostic::error(
                        self.span(),
                        "embedded C (`%{ ... %}`) cannot run in user space: weft stap refuses it",
                    ));
                }
                _ => return Err(self.unexpected("'probe', 'global' or 'function'")),
            }
        }
    }

    /// `:long`, `:string` after a function or parameter name.
    fn type_suffix(&mut self) -> R<()> {
        if self.eat(":") {
            self.ident()?;
        }
        Ok(())
    }

    fn probe_point(&mut self) -> R<ProbePoint> {
        let start = self.span();
        let mut comps = Vec::new();
        loop {
            let cstart = self.span();
            let name = match self.peek().clone() {
                Tok::Ident(s) => {
                    self.bump();
                    let mut s = s;
                    // `sys*`, `*`: wildcards glued to the name.
                    while self.is("*") && self.span().start == self.prev_end() {
                        self.bump();
                        s.push('*');
                        if let Tok::Ident(more) = self.peek().clone() {
                            if self.span().start == self.prev_end() {
                                self.bump();
                                s.push_str(&more);
                            }
                        }
                    }
                    s
                }
                Tok::Punct("*") => {
                    self.bump();
                    let mut s = "*".to_string();
                    if let Tok::Ident(more) = self.peek().clone() {
                        if self.span().start == self.prev_end() {
                            self.bump();
                            s.push_str(&more);
                        }
                    }
                    s
                }
                _ => return Err(self.unexpected("a probe point")),
            };
            let arg = if self.eat("(") {
                let a = match self.bump() {
                    (Tok::Num(n), _) => Lit::Num(n),
                    (Tok::Str(s), _) => Lit::Str(String::from_utf8_lossy(&s).into_owned()),
                    (Tok::Punct("-"), _) => match self.bump() {
                        (Tok::Num(n), _) => Lit::Num(-n),
                        (t, sp) => {
                            return Err(Diagnostic::error(
                                sp,
                                format!("parse error: expected a literal, saw {}", t.describe()),
                            ))
                        }
                    },
                    (t, sp) => {
                        return Err(Diagnostic::error(
                            sp,
                            format!("parse error: expected a literal, saw {}", t.describe()),
                        ))
                    }
                };
                self.expect(")")?;
                Some(a)
            } else {
                None
            };
            comps.push(Comp {
                name,
                arg,
                span: Span::new(cstart.start as usize, self.prev_end() as usize),
            });
            if !self.eat(".") {
                break;
            }
        }
        let mut optional = false;
        while self.is("?") || self.is("!") {
            self.bump();
            optional = true;
        }
        if self.is_kw("if") {
            return Err(Diagnostic::error(
                self.span(),
                "probe point conditions (`if (...)` after a probe point) are not supported by weft stap",
            ));
        }
        let span = Span::new(start.start as usize, self.prev_end() as usize);
        Ok(ProbePoint {
            comps,
            optional,
            span,
        })
    }

    fn block(&mut self) -> R<Stmt> {
        let start = self.expect("{")?;
        let mut stmts = Vec::new();
        while !self.is("}") {
            if matches!(self.peek(), Tok::Eof) {
                return Err(self.unexpected("'}'"));
            }
            stmts.push(self.stmt()?);
        }
        let end = self.bump().1;
        Ok(Stmt {
            kind: StmtKind::Block(stmts),
            span: start.to(end),
        })
    }

    fn stmt(&mut self) -> R<Stmt> {
        let start = self.span();
        let mk = |p: &Self, kind| Stmt {
            kind,
            span: Span::new(start.start as usize, p.prev_end() as usize),
        };
        if self.is("{") {
            return self.block();
        }
        if self.eat(";") {
            return Ok(mk(self, StmtKind::Empty));
        }
        let kw = match self.peek() {
            Tok::Ident(s) => s.clone(),
            _ => String::new(),
        };
        let kind = match kw.as_str() {
            "if" => {
                self.bump();
                self.expect("(")?;
                let c = self.expr()?;
                self.expect(")")?;
                let t = self.stmt()?;
                let e = if self.is_kw("else") {
                    self.bump();
                    Some(Box::new(self.stmt()?))
                } else {
                    None
                };
                StmtKind::If(c, Box::new(t), e)
            }
            "while" => {
                self.bump();
                self.expect("(")?;
                let c = self.expr()?;
                self.expect(")")?;
                StmtKind::While(c, Box::new(self.stmt()?))
            }
            "for" => {
                self.bump();
                self.expect("(")?;
                let init = if self.is(";") {
                    None
                } else {
                    Some(self.expr()?)
                };
                self.expect(";")?;
                let cond = if self.is(";") {
                    None
                } else {
                    Some(self.expr()?)
                };
                self.expect(";")?;
                let step = if self.is(")") {
                    None
                } else {
                    Some(self.expr()?)
                };
                self.expect(")")?;
                StmtKind::For(init, cond, step, Box::new(self.stmt()?))
            }
            "foreach" => {
                self.bump();
                StmtKind::Foreach(Box::new(self.foreach()?))
            }
            "delete" => {
                self.bump();
                StmtKind::Delete(self.expr()?)
            }
            "next" => {
                self.bump();
                StmtKind::Next
            }
            "break" => {
                self.bump();
                StmtKind::Break
            }
            "continue" => {
                self.bump();
                StmtKind::Continue
            }
            "return" => {
                self.bump();
                if self.is(";") || self.is("}") {
                    StmtKind::Return(None)
                } else {
                    StmtKind::Return(Some(self.expr()?))
                }
            }
            _ => StmtKind::Expr(self.expr()?),
        };
        self.eat(";");
        Ok(mk(self, kind))
    }

    fn foreach(&mut self) -> R<Foreach> {
        self.expect("(")?;
        let sort_mark = |p: &mut Self| -> Option<(bool, Span)> {
            if p.is("+") || p.is("-") {
                let (t, sp) = p.bump();
                Some((t == Tok::Punct("+"), sp))
            } else {
                None
            }
        };
        let mut sort = None;
        let mut value = None;
        // `v = [a, b] in ...` / `v = k in ...`
        // `v = ...`, `v+ = ...`: the value's variable (and its sort order).
        let named_value = matches!(self.peek(), Tok::Ident(_))
            && (matches!(self.peek_at(1), Tok::Punct("="))
                || matches!(self.peek_at(1), Tok::Punct("+") | Tok::Punct("-"))
                    && matches!(self.peek_at(2), Tok::Punct("=")));
        if named_value {
            let v = self.ident()?;
            if let Some((asc, sp)) = sort_mark(self) {
                sort = Some((0, asc, sp));
            }
            self.expect("=")?;
            value = Some(v);
        }
        let mut keys = Vec::new();
        let key_mark = |p: &mut Self, i: usize, sort: &mut Option<(usize, bool, Span)>| -> R<()> {
            if let Some((asc, sp)) = sort_mark(p) {
                if sort.is_some() {
                    return Err(Diagnostic::error(sp, "only one sort order in a foreach"));
                }
                *sort = Some((i, asc, sp));
            }
            Ok(())
        };
        if self.eat("[") {
            loop {
                keys.push(self.ident()?);
                key_mark(self, keys.len(), &mut sort)?;
                if !self.eat(",") {
                    break;
                }
            }
            self.expect("]")?;
        } else {
            keys.push(self.ident()?);
            key_mark(self, 1, &mut sort)?;
        }
        if !self.is_kw("in") {
            return Err(self.unexpected("'in'"));
        }
        self.bump();
        let (array, array_span) = self.ident()?;
        if let Some((asc, sp)) = sort_mark(self) {
            if sort.is_some() {
                return Err(Diagnostic::error(sp, "only one sort order in a foreach"));
            }
            sort = Some((0, asc, sp));
        }
        let limit = if self.is_kw("limit") {
            self.bump();
            Some(self.expr()?)
        } else {
            None
        };
        self.expect(")")?;
        let body = self.stmt()?;
        Ok(Foreach {
            value,
            keys,
            array,
            array_span,
            sort,
            limit,
            body,
        })
    }

    pub fn expr(&mut self) -> R<Expr> {
        let lhs = self.ternary()?;
        const ASSIGN: &[&str] = &[
            "=", "+=", "-=", "*=", "/=", "%=", "&=", "|=", "^=", "<<=", ">>=", ".=", "<<<",
        ];
        if let Tok::Punct(p) = self.peek().clone() {
            if ASSIGN.contains(&p) {
                self.bump();
                let rhs = self.expr()?;
                let span = lhs.span.to(rhs.span);
                return Ok(Expr {
                    kind: ExprKind::Assign(p, Box::new(lhs), Box::new(rhs)),
                    span,
                });
            }
        }
        Ok(lhs)
    }

    fn ternary(&mut self) -> R<Expr> {
        let c = self.binary(0)?;
        if self.eat("?") {
            let t = self.expr()?;
            self.expect(":")?;
            let e = self.ternary()?;
            let span = c.span.to(e.span);
            return Ok(Expr {
                kind: ExprKind::Ternary(Box::new(c), Box::new(t), Box::new(e)),
                span,
            });
        }
        Ok(c)
    }

    fn binary(&mut self, level: usize) -> R<Expr> {
        const LEVELS: &[&[&str]] = &[
            &["||"],
            &["&&"],
            &["|"],
            &["^"],
            &["&"],
            &["==", "!="],
            &["<", ">", "<=", ">="],
            &["<<", ">>"],
            &["."],
            &["+", "-"],
            &["*", "/", "%"],
        ];
        if level == LEVELS.len() {
            return self.in_expr();
        }
        let mut lhs = self.binary(level + 1)?;
        loop {
            let op = match self.peek() {
                Tok::Punct(p) if LEVELS[level].contains(p) => *p,
                _ => return Ok(lhs),
            };
            self.bump();
            let rhs = self.binary(level + 1)?;
            let span = lhs.span.to(rhs.span);
            lhs = Expr {
                kind: ExprKind::Binary(op, Box::new(lhs), Box::new(rhs)),
                span,
            };
        }
    }

    /// `[a, b] in arr`, `a in arr`, or a unary expression.
    fn in_expr(&mut self) -> R<Expr> {
        let start = self.span();
        let keys = if self.is("[") {
            self.bump();
            let mut ks = Vec::new();
            loop {
                ks.push(self.expr()?);
                if !self.eat(",") {
                    break;
                }
            }
            self.expect("]")?;
            if !self.is_kw("in") {
                return Err(self.unexpected("'in'"));
            }
            ks
        } else {
            let e = self.unary()?;
            if !self.is_kw("in") {
                return Ok(e);
            }
            vec![e]
        };
        self.bump();
        let (arr, asp) = self.ident()?;
        Ok(Expr {
            kind: ExprKind::In(keys, arr, asp),
            span: start.to(asp),
        })
    }

    fn unary(&mut self) -> R<Expr> {
        let start = self.span();
        if let Tok::Punct(p) = self.peek().clone() {
            if matches!(p, "!" | "~" | "-" | "+" | "++" | "--") {
                self.bump();
                let e = self.unary()?;
                let span = start.to(e.span);
                let kind = if p == "++" || p == "--" {
                    ExprKind::IncDec(p == "++", true, Box::new(e))
                } else if p == "-" {
                    if let ExprKind::Num(n) = e.kind {
                        ExprKind::Num(n.wrapping_neg())
                    } else {
                        ExprKind::Unary(p, Box::new(e))
                    }
                } else {
                    ExprKind::Unary(p, Box::new(e))
                };
                return Ok(Expr { kind, span });
            }
        }
        let mut e = self.primary()?;
        while self.is("++") || self.is("--") {
            let (t, sp) = self.bump();
            let span = e.span.to(sp);
            e = Expr {
                kind: ExprKind::IncDec(t == Tok::Punct("++"), false, Box::new(e)),
                span,
            };
        }
        Ok(e)
    }

    fn args(&mut self) -> R<Vec<Expr>> {
        self.expect("(")?;
        let mut a = Vec::new();
        if !self.is(")") {
            loop {
                a.push(self.expr()?);
                if !self.eat(",") {
                    break;
                }
            }
        }
        self.expect(")")?;
        Ok(a)
    }

    fn primary(&mut self) -> R<Expr> {
        let (tok, sp) = self.bump();
        let done = |p: &Self, kind| Expr {
            kind,
            span: Span::new(sp.start as usize, p.prev_end() as usize),
        };
        match tok {
            Tok::Num(n) => Ok(done(self, ExprKind::Num(n))),
            Tok::Str(s) => Ok(done(self, ExprKind::Str(s))),
            Tok::Punct("(") => {
                let e = self.expr()?;
                self.expect(")")?;
                Ok(Expr {
                    kind: e.kind,
                    span: Span::new(sp.start as usize, self.prev_end() as usize),
                })
            }
            Tok::Ident(name) => {
                if self.is("(") {
                    let a = self.args()?;
                    Ok(done(self, ExprKind::Call(name, sp, a)))
                } else if self.is("[") {
                    self.bump();
                    let mut ks = Vec::new();
                    loop {
                        ks.push(self.expr()?);
                        if !self.eat(",") {
                            break;
                        }
                    }
                    self.expect("]")?;
                    Ok(done(self, ExprKind::Index(name, sp, ks)))
                } else {
                    Ok(done(self, ExprKind::Ident(name)))
                }
            }
            Tok::Target(name) => {
                if name.starts_with('$') {
                    return Ok(done(self, ExprKind::Special(name)));
                }
                let mut fields = Vec::new();
                while self.is("->")
                    || (self.is(".")
                        && matches!(self.peek_at(1), Tok::Ident(_))
                        && self.span().start == self.prev_end())
                {
                    self.bump();
                    fields.push(self.ident()?.0);
                }
                if self.is("[") {
                    return Err(Diagnostic::error(
                        self.span(),
                        "indexing a target variable (`$var[i]`) is not supported by weft stap",
                    ));
                }
                Ok(done(self, ExprKind::Target(name, fields)))
            }
            Tok::At(name) => {
                // `@1`: the first script argument, as a string.
                if name.bytes().all(|b| b.is_ascii_digit()) {
                    return Ok(done(self, ExprKind::At(name, vec![])));
                }
                let a = self.args()?;
                Ok(done(self, ExprKind::At(name, a)))
            }
            t => Err(Diagnostic::error(
                sp,
                format!("parse error: expected an expression, saw {}", t.describe()),
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one_probe(src: &str) -> Probe {
        let s = parse(src).unwrap_or_else(|d| panic!("{}", d.message));
        s.probes.into_iter().next().unwrap()
    }

    fn body(src: &str) -> Vec<Stmt> {
        match one_probe(&format!("probe begin {{ {src} }}")).body.kind {
            StmtKind::Block(v) => v,
            _ => unreachable!(),
        }
    }

    #[test]
    fn probe_points_with_arguments_wildcards_and_suffixes() {
        let s = parse(
            "probe process(\"/bin/x\").function(\"foo*\").return, syscall.*, timer.ms(100)? { }",
        )
        .unwrap();
        let pts = &s.probes[0].points;
        assert_eq!(pts.len(), 3);
        assert_eq!(
            pts[0].text(),
            "process(\"/bin/x\").function(\"foo*\").return"
        );
        assert_eq!(pts[1].text(), "syscall.*");
        assert_eq!(pts[2].comps[1].arg, Some(Lit::Num(100)));
        assert!(pts[2].optional && !pts[0].optional);
        assert_eq!(
            one_probe("probe syscall.open* { }").points[0].text(),
            "syscall.open*"
        );
    }

    #[test]
    fn globals_functions_and_comments() {
        let s = parse(
            "# comment\nglobal a, b = 5, c[100] // more\n/* block */ function f:long(x:long, y) { return x + y }\nprobe end { }",
        )
        .unwrap();
        let names: Vec<&str> = s.globals.iter().map(|g| g.name.as_str()).collect();
        assert_eq!(names, ["a", "b", "c"]);
        assert_eq!(s.globals[1].init.as_ref().unwrap().kind, ExprKind::Num(5));
        assert_eq!(s.functions[0].params.len(), 2);
    }

    #[test]
    fn foreach_forms() {
        let f = |src: &str| match &body(src)[0].kind {
            StmtKind::Foreach(f) => (**f).clone(),
            k => panic!("{k:?}"),
        };
        let a = f("foreach (count = name in syscount - limit 10) x = 1");
        assert_eq!(a.value.as_ref().unwrap().0, "count");
        assert_eq!(a.keys[0].0, "name");
        assert_eq!((a.sort.unwrap().0, a.sort.unwrap().1), (0, false));
        assert_eq!(a.limit.unwrap().kind, ExprKind::Num(10));
        let b = f("foreach ([x, y+] in arr) { }");
        assert_eq!(b.keys.len(), 2);
        assert_eq!((b.sort.unwrap().0, b.sort.unwrap().1), (2, true));
        let c = f("foreach (v- = [k] in arr) { }");
        assert_eq!((c.sort.unwrap().0, c.sort.unwrap().1), (0, false));
        assert!(f("foreach (k in arr) { }").sort.is_none());
    }

    #[test]
    fn precedence_in_assignments_and_targets() {
        let st = body("x = 1 + 2 * 3 < 7 && [a, b] in m");
        let StmtKind::Expr(Expr {
            kind: ExprKind::Assign("=", _, rhs),
            ..
        }) = &st[0].kind
        else {
            panic!("{st:?}")
        };
        let ExprKind::Binary("&&", l, r) = &rhs.kind else {
            panic!("{rhs:?}")
        };
        assert!(matches!(l.kind, ExprKind::Binary("<", _, _)));
        assert!(matches!(&r.kind, ExprKind::In(k, m, _) if k.len() == 2 && m == "m"));
        let st = body("s <<< $p->x->y; n++; t = @entry($a) + $$parms");
        assert!(
            matches!(&st[0].kind, StmtKind::Expr(Expr { kind: ExprKind::Assign("<<<", _, r), .. })
            if matches!(&r.kind, ExprKind::Target(n, f) if n == "p" && f == &["x", "y"]))
        );
        assert!(matches!(
            &st[1].kind,
            StmtKind::Expr(Expr {
                kind: ExprKind::IncDec(true, false, _),
                ..
            })
        ));
    }

    #[test]
    fn errors_say_what_was_expected_where() {
        let e = parse("probe begin { x = ; }").unwrap_err();
        assert_eq!(
            e.message,
            "parse error: expected an expression, saw operator ';'"
        );
        assert_eq!((e.span.start, e.span.end), (18, 19));
        let e = parse("probe begin { \"abc }").unwrap_err();
        assert_eq!(e.message, "unterminated string");
        let e = parse("global x probe").unwrap_err();
        assert!(e.message.contains("expected"), "{}", e.message);
        let e = parse("probe begin { foreach (k of m) {} }").unwrap_err();
        assert_eq!(e.message, "parse error: expected 'in', saw identifier 'of'");
        let e = parse("%{ int x; %}").unwrap_err();
        assert!(e.message.contains("embedded C"), "{}", e.message);
    }
}
