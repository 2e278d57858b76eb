//! The parser: hand-written recursive descent with precedence climbing (C
//! precedence). It never stops at the first error: a statement that fails to parse
//! is reported and skipped up to the next `;` or `}`, a probe header up to the end
//! of its block, and parsing goes on.

use std::collections::VecDeque;

use crate::ast::*;
use crate::diag::{Diagnostic, Diags};
use crate::lexer::{Lexer, Tok, Token};

/// Parse a whole script. Always returns a program (possibly partial) and the
/// diagnostics found on the way.
pub fn parse(source: &str) -> (Program, Vec<Diagnostic>) {
    parse_with_types(source, &Default::default())
}

/// [`parse`], knowing `types` as type names (the typedefs of included headers), so
/// `(name)x` and `sizeof(name)` read them as types.
pub fn parse_with_types(
    source: &str,
    types: &std::collections::HashSet<String>,
) -> (Program, Vec<Diagnostic>) {
    if let Some(at) = source.find('\0') {
        // The lexer reads a NUL as the end of the text; a program never holds one
        // (argv cannot carry it, so it comes from a binary or corrupt file).
        let d = Diagnostic::error(
            Span::new(at, at + 1),
            "the program contains a NUL byte: a program is UTF-8 text",
        );
        return (Program::default(), vec![d]);
    }
    let mut p = Parser::new(source);
    p.types = types.clone();
    let mut program = p.program();
    program.includes = std::mem::take(&mut p.lx.includes);
    program.defines = std::mem::take(&mut p.lx.defines)
        .into_iter()
        .map(|(n, v, _)| (n, v))
        .collect();
    // bpftrace reads C definitions only in the preamble.
    let first_probe = program.items.iter().find_map(|i| match i {
        Item::Probe(p) => Some(p.span),
        Item::Reserved(b) => Some(b.span),
        Item::Seq(b) => Some(b.span),
        _ => None,
    });
    if let Some(probe) = first_probe {
        for inc in program
            .includes
            .iter()
            .filter(|i| i.span.start > probe.start)
        {
            p.diags.push(
                Diagnostic::error(inc.span, "`#include` must come before the first probe")
                    .with_note(Some(probe), "the first probe"),
            );
        }
    }
    if let Some(i) = p
        .diags
        .list
        .iter()
        .position(|d| p.abandoned && d.message.starts_with("the program nests too deeply"))
    {
        // What was reported after giving up is about the text cut short.
        p.diags.list.truncate(i + 1);
    }
    let mut diags = p.lx.diags.list;
    diags.extend(p.diags.list);
    diags.sort_by_key(|d| d.span.start);
    (program, diags)
}

/// How deeply expressions, statements and blocks may nest (counting each level of
/// parentheses, unary operator, block, `else if`, call, index, and each operator of
/// a chain such as `a + b + c`, which nests to the left). Deeper programs would
/// overflow the stack of this recursive parser and of every stage after it (each
/// walks the tree recursively); no real program comes near it.
pub const MAX_NESTING: u32 = 100;

/// An error was reported; the caller recovers.
struct Stop;
type PResult<T> = Result<T, Stop>;

struct Parser<'a> {
    lx: Lexer<'a>,
    /// Lookahead tokens, each with the number of lexer diagnostics before it was
    /// lexed (so re-lexing after a mode switch does not report twice).
    buf: VecDeque<(Token, usize)>,
    diags: Diags,
    /// Inside `/.../`, at parenthesis depth 0: a `/` followed by `{` ends the
    /// predicate instead of dividing.
    in_predicate: bool,
    prev_end: u32,
    /// Nesting of the node being parsed (see [`MAX_NESTING`]).
    depth: u32,
    /// The deepest nesting reached by the tree being built (an upper bound of
    /// `depth` + the height of the subtree parsed so far), so the left-nested
    /// chains built by loops (`a + b + c`, `x.a.b`, `x[1][2]`) count too.
    reached: u32,
    /// Set when the nesting limit was hit: the parser reports that once and reads
    /// the rest of the text as the end of input (no cascade of errors).
    abandoned: bool,
    /// Typedef names of included headers: they start casts and `sizeof(type)`.
    types: std::collections::HashSet<String>,
}

const BINOPS: &[(Tok, BinOp, u8)] = &[
    (Tok::OrOr, BinOp::Or, 1),
    (Tok::AndAnd, BinOp::And, 2),
    (Tok::Pipe, BinOp::BitOr, 3),
    (Tok::Caret, BinOp::BitXor, 4),
    (Tok::Amp, BinOp::BitAnd, 5),
    (Tok::EqEq, BinOp::Eq, 6),
    (Tok::Ne, BinOp::Ne, 6),
    (Tok::Lt, BinOp::Lt, 7),
    (Tok::Le, BinOp::Le, 7),
    (Tok::Gt, BinOp::Gt, 7),
    (Tok::Ge, BinOp::Ge, 7),
    (Tok::Shl, BinOp::Shl, 8),
    (Tok::Shr, BinOp::Shr, 8),
    (Tok::Plus, BinOp::Add, 9),
    (Tok::Minus, BinOp::Sub, 9),
    (Tok::Star, BinOp::Mul, 10),
    (Tok::Slash, BinOp::Div, 10),
    (Tok::Percent, BinOp::Mod, 10),
];

/// Names that start a cast `(int32)x` / `(uint8 *)p`.
fn int_type_name(name: &str) -> Option<TypeName> {
    let (signed, rest) = match name.strip_prefix('u') {
        Some(r) => (false, r),
        None => (true, name),
    };
    let bits = match rest {
        "int8" => 8,
        "int16" => 16,
        "int32" => 32,
        "int64" => 64,
        _ => {
            return match name {
                "bool" => Some(TypeName::Bool),
                "char" => Some(TypeName::Char),
                "void" => Some(TypeName::Void),
                "string" => Some(TypeName::Str),
                _ => c_scalar(name),
            }
        }
    };
    Some(TypeName::Int { bits, signed })
}

/// C spellings of integer types (for casts and struct definitions).
fn c_scalar(name: &str) -> Option<TypeName> {
    let (bits, signed) = match name {
        "s8" | "__s8" | "int8_t" => (8, true),
        "u8" | "__u8" | "uint8_t" | "unsigned_char" => (8, false),
        "short" | "s16" | "__s16" | "int16_t" => (16, true),
        "u16" | "__u16" | "uint16_t" => (16, false),
        "int" | "s32" | "__s32" | "int32_t" | "signed" => (32, true),
        "u32" | "__u32" | "uint32_t" | "unsigned" => (32, false),
        "long" | "s64" | "__s64" | "int64_t" | "ssize_t" | "off_t" | "intptr_t" => (64, true),
        "u64" | "__u64" | "uint64_t" | "size_t" | "uintptr_t" => (64, false),
        "pid_t" => (32, true),
        "uid_t" | "gid_t" => (32, false),
        _ => return None,
    };
    Some(TypeName::Int { bits, signed })
}

impl<'a> Parser<'a> {
    fn new(src: &'a str) -> Parser<'a> {
        Parser {
            lx: Lexer::new(src),
            buf: VecDeque::new(),
            diags: Diags::default(),
            in_predicate: false,
            prev_end: 0,
            depth: 0,
            reached: 0,
            abandoned: false,
            types: Default::default(),
        }
    }

    // ---- nesting ----------------------------------------------------------------

    /// Report that the program nests too deeply at `span`, once, and stop reading.
    fn too_deep(&mut self, span: Span, chain: bool) -> Stop {
        if !self.abandoned {
            let mut d = Diagnostic::error(
                span,
                format!(
                    "the program nests too deeply (more than {MAX_NESTING} levels of \
                     expressions, blocks and parentheses)"
                ),
            );
            if chain {
                d = d.with_help(
                    "each operator of a chain such as `a + b + c` or `x.a.b` nests one \
                     level: split it with scratch variables",
                );
            }
            self.diags.push(d);
            self.abandoned = true;
            let end = self.lx.src_len();
            self.buf.clear();
            self.buf.push_back((
                Token {
                    tok: Tok::Eof,
                    span: Span::new(end, end),
                },
                self.lx.diags.list.len(),
            ));
        }
        Stop
    }

    /// Run `f` one level deeper.
    fn deeper<T>(&mut self, f: impl FnOnce(&mut Self) -> PResult<T>) -> PResult<T> {
        if self.abandoned {
            return Err(Stop);
        }
        if self.depth >= MAX_NESTING {
            let at = self.peek_span();
            return Err(self.too_deep(at, false));
        }
        self.depth += 1;
        self.reached = self.reached.max(self.depth);
        let r = f(self);
        self.depth -= 1;
        r
    }

    /// Start measuring the height of a subtree built by a loop: returns the mark
    /// to give [`Self::end_chain`].
    fn begin_chain(&mut self) -> u32 {
        std::mem::replace(&mut self.reached, self.depth)
    }

    /// The loop wrapped its subtree in one more node (at `span`).
    fn chain_link(&mut self, span: Span) -> PResult<()> {
        self.reached += 1;
        if self.reached > MAX_NESTING {
            return Err(self.too_deep(span, true));
        }
        Ok(())
    }

    fn end_chain(&mut self, mark: u32) {
        self.reached = self.reached.max(mark);
    }

    // ---- token plumbing ------------------------------------------------------

    fn peek_at(&mut self, n: usize) -> &Token {
        if self.abandoned {
            // Only the end of input is left (see `too_deep`).
            let eof = self.buf.back().expect("too_deep leaves an Eof").clone();
            while self.buf.len() <= n {
                self.buf.push_back(eof.clone());
            }
            return &self.buf[n].0;
        }
        while self.buf.len() <= n {
            // Trivia errors (`#define`) are kept when the token is re-read.
            self.lx.skip_trivia();
            let before = self.lx.diags.list.len();
            let t = self.lx.next_token();
            self.buf.push_back((t, before));
        }
        &self.buf[n].0
    }
    fn peek(&mut self) -> &Tok {
        &self.peek_at(0).tok
    }
    fn peek_tok(&mut self, n: usize) -> Tok {
        self.peek_at(n).tok.clone()
    }
    fn peek_span(&mut self) -> Span {
        self.peek_at(0).span
    }
    fn bump(&mut self) -> Token {
        self.peek_at(0);
        let (t, _) = self.buf.pop_front().expect("peeked");
        if t.tok != Tok::Eof {
            self.prev_end = t.span.end;
        }
        t
    }
    fn at(&mut self, tok: &Tok) -> bool {
        self.peek() == tok
    }
    fn eat(&mut self, tok: &Tok) -> bool {
        if self.at(tok) {
            self.bump();
            true
        } else {
            false
        }
    }
    fn at_ident(&mut self, name: &str) -> bool {
        matches!(self.peek(), Tok::Ident(s) if s == name)
    }
    /// Forget lookahead so the lexer can be switched to attach-point mode.
    fn reset_lookahead(&mut self) {
        if self.abandoned {
            return;
        }
        if let Some((t, diags_before)) = self.buf.front() {
            self.lx.pos = t.span.start as usize;
            self.lx.diags.list.truncate(*diags_before);
        }
        self.buf.clear();
    }
    fn error_here(&mut self, expected: &str) -> Stop {
        let t = self.peek_at(0).clone();
        self.diags.error(
            t.span,
            format!("expected {expected}, found {}", t.tok.describe()),
        );
        Stop
    }
    fn expect(&mut self, tok: &Tok) -> PResult<Token> {
        if self.at(tok) {
            Ok(self.bump())
        } else {
            Err(self.error_here(&tok.describe()))
        }
    }
    fn span_from(&self, start: Span) -> Span {
        Span {
            start: start.start,
            end: self.prev_end.max(start.end),
        }
    }

    // ---- recovery -------------------------------------------------------------

    /// Skip to the next `;` (consumed) or to a `}` closing the current block (not
    /// consumed), balancing nested braces.
    fn recover_stmt(&mut self) {
        let mut depth = 0usize;
        let diags = self.lx.diags.list.len();
        loop {
            match self.peek() {
                Tok::Eof => break,
                Tok::Semi if depth == 0 => {
                    self.bump();
                    break;
                }
                Tok::LBrace => depth += 1,
                Tok::RBrace => {
                    if depth == 0 {
                        break;
                    }
                    depth -= 1;
                    if depth == 0 {
                        self.bump();
                        // `if (...) { } garbage` — a closed block ends a statement.
                        break;
                    }
                }
                _ => {}
            }
            self.bump();
        }
        self.lx
            .diags
            .list
            .truncate(diags.min(self.lx.diags.list.len()));
    }

    /// Skip the rest of a top-level item: through the end of its `{ }` block.
    fn recover_item(&mut self) {
        let mut depth = 0usize;
        let diags = self.lx.diags.list.len();
        loop {
            match self.peek() {
                Tok::Eof => break,
                Tok::LBrace => depth += 1,
                Tok::RBrace => {
                    if depth <= 1 {
                        self.bump();
                        break;
                    }
                    depth -= 1;
                }
                _ => {}
            }
            self.bump();
        }
        self.lx
            .diags
            .list
            .truncate(diags.min(self.lx.diags.list.len()));
    }

    // ---- top level ------------------------------------------------------------

    fn program(&mut self) -> Program {
        let mut items = Vec::new();
        while !self.at(&Tok::Eof) {
            match self.item() {
                Ok(Some(item)) => items.push(item),
                Ok(None) => {}
                Err(Stop) => self.recover_item(),
            }
        }
        Program {
            items,
            ..Program::default()
        }
    }

    fn item(&mut self) -> PResult<Option<Item>> {
        let t0 = self.peek_tok(0);
        let t1 = self.peek_tok(1);
        let start = self.peek_span();
        if let Tok::Ident(word) = &t0 {
            match (word.as_str(), &t1) {
                ("config", Tok::Assign) => return self.config().map(|c| Some(Item::Config(c))),
                ("macro", Tok::Ident(_)) => return self.macro_def().map(|m| Some(Item::Macro(m))),
                ("fn", Tok::Ident(_)) => return self.fn_def().map(|f| Some(Item::Fn(f))),
                ("let", Tok::Map(_)) => return self.map_decl().map(|m| Some(Item::MapDecl(m))),
                ("struct" | "union", Tok::Ident(_)) if self.peek_tok(2) == Tok::LBrace => {
                    return self.struct_def().map(|s| Some(Item::Struct(s)))
                }
                ("enum", Tok::LBrace) => return self.enum_def().map(|e| Some(Item::Enum(e))),
                ("enum", Tok::Ident(_)) if self.peek_tok(2) == Tok::LBrace => {
                    return self.enum_def().map(|e| Some(Item::Enum(e)))
                }
                ("pointcut", Tok::Ident(_)) if self.peek_tok(2) == Tok::Assign => {
                    return self.pointcut_def().map(|d| Some(Item::Pointcut(d)))
                }
                ("seq", Tok::Ident(_)) if self.peek_tok(2) == Tok::LBracket => {
                    return self.seq_block().map(|b| Some(Item::Seq(b)))
                }
                ("group", Tok::Ident(_)) if matches!(self.peek_tok(2), Tok::Semi | Tok::Assign) => {
                    return self.group_decl().map(|g| Some(Item::Group(g)))
                }
                ("seq", Tok::LBrace) | ("group", Tok::LBrace) | ("group", Tok::Ident(_)) => {
                    return self.reserved_block().map(|b| Some(Item::Reserved(b)))
                }
                ("import", _) => {
                    self.diags.error(start, "`import` is not supported by weft");
                    self.recover_stmt();
                    return Ok(None);
                }
                ("before" | "after" | "around", t) if *t != Tok::Colon && *t != Tok::Comma => {
                    let kind = match word.as_str() {
                        "before" => AdviceKind::Before,
                        "after" => AdviceKind::After,
                        _ => AdviceKind::Around,
                    };
                    self.bump();
                    return self
                        .probe(Some((kind, start)))
                        .map(|p| Some(Item::Probe(p)));
                }
                _ => {}
            }
        }
        // `@GROUP probe`: placement on a group of processes.
        if let (Tok::Map(name), Tok::Ident(_)) = (&t0, &t1) {
            let name = name.trim_start_matches('@').to_string();
            self.bump();
            let mut p = self.probe(None)?;
            p.span = self.span_from(start);
            p.group = Some((name, start));
            return Ok(Some(Item::Probe(p)));
        }
        match t0 {
            Tok::RBrace => {
                self.diags.error(start, "unexpected `}`");
                self.bump();
                Ok(None)
            }
            Tok::Semi => {
                self.bump();
                Ok(None)
            }
            Tok::LBrace => {
                self.diags
                    .error(start, "expected an attach point before `{`");
                Err(Stop)
            }
            _ => self.probe(None).map(|p| Some(Item::Probe(p))),
        }
    }

    fn probe(&mut self, advice: Option<(AdviceKind, Span)>) -> PResult<Probe> {
        let mut attach = Vec::new();
        loop {
            self.reset_lookahead();
            match self.lx.scan_attach(false) {
                Some((raw, span)) => attach.push(attach_spec(raw, span)),
                None => return Err(self.error_here("an attach point")),
            }
            // `call:BIN:FUNC within CALLER`: the callers, a function name or pattern
            // (scanned as attach text, so `*` and `?` are part of it).
            if self.at_ident("within") {
                let kw = self.bump().span;
                self.reset_lookahead();
                match self.lx.scan_attach(false) {
                    Some((callers, span)) => {
                        if let Some(a) = attach.last_mut() {
                            a.within = Some((callers, span));
                        }
                    }
                    None => {
                        self.diags
                            .error(kw, "`within` needs a function name or pattern after it");
                        return Err(Stop);
                    }
                }
            }
            if !self.eat(&Tok::Comma) {
                break;
            }
        }
        let start = advice.map(|a| a.1).unwrap_or(attach[0].span);
        let predicate = if self.at(&Tok::Slash) {
            self.bump();
            self.in_predicate = true;
            let e = self.expr();
            self.in_predicate = false;
            let e = e?;
            self.expect(&Tok::Slash)?;
            Some(e)
        } else {
            None
        };
        if !self.at(&Tok::LBrace) {
            return Err(self.error_here("`{` or a predicate `/.../`"));
        }
        let body = self.block()?;
        Ok(Probe {
            advice,
            group: None,
            attach,
            predicate,
            body,
            span: self.span_from(start),
            hidden: false,
        })
    }

    /// `pointcut NAME = ATTACH, ATTACH, ...;`
    fn pointcut_def(&mut self) -> PResult<PointcutDef> {
        let start = self.bump().span;
        let name_tok = self.bump();
        let Tok::Ident(name) = name_tok.tok else {
            unreachable!("checked by item()")
        };
        self.expect(&Tok::Assign)?;
        let mut attach = Vec::new();
        loop {
            self.reset_lookahead();
            match self.lx.scan_attach(false) {
                Some((raw, span)) => attach.push(attach_spec(raw, span)),
                None => return Err(self.error_here("an attach point")),
            }
            if !self.eat(&Tok::Comma) {
                break;
            }
        }
        if !self.eat(&Tok::Semi) {
            return Err(self.error_here("`;` or `,` after an attach point"));
        }
        Ok(PointcutDef {
            name,
            name_span: name_tok.span,
            attach,
            span: self.span_from(start),
        })
    }

    fn config(&mut self) -> PResult<ConfigBlock> {
        let start = self.bump().span;
        self.expect(&Tok::Assign)?;
        self.expect(&Tok::LBrace)?;
        let mut entries = Vec::new();
        loop {
            if self.eat(&Tok::Semi) {
                continue;
            }
            if self.eat(&Tok::RBrace) {
                break;
            }
            let t = self.bump();
            let Tok::Ident(name) = t.tok else {
                self.diags.error(
                    t.span,
                    format!(
                        "expected a config variable name, found {}",
                        t.tok.describe()
                    ),
                );
                return Err(Stop);
            };
            self.expect(&Tok::Assign)?;
            let v = self.bump();
            let value = match v.tok {
                Tok::Int(n) => ConfigValue::Int(n),
                Tok::Str(s) => ConfigValue::Str(String::from_utf8_lossy(&s).into_owned()),
                Tok::Ident(s) => ConfigValue::Ident(s),
                other => {
                    self.diags.error(
                        v.span,
                        format!("expected a config value, found {}", other.describe()),
                    );
                    return Err(Stop);
                }
            };
            entries.push((name, value, t.span.to(v.span)));
            if !self.at(&Tok::RBrace) {
                self.expect(&Tok::Semi)?;
            }
        }
        Ok(ConfigBlock {
            entries,
            span: self.span_from(start),
        })
    }

    fn macro_def(&mut self) -> PResult<MacroDef> {
        let start = self.bump().span;
        let name_tok = self.bump();
        let Tok::Ident(name) = name_tok.tok else {
            unreachable!("checked by item()")
        };
        self.expect(&Tok::LParen)?;
        let mut params = Vec::new();
        while !self.at(&Tok::RParen) {
            let t = self.bump();
            params.push(match t.tok {
                Tok::Var(v) => MacroParam::Var(v, t.span),
                Tok::Map(m) => MacroParam::Map(m, t.span),
                Tok::Ident(i) => MacroParam::Expr(i, t.span),
                other => {
                    self.diags.error(
                        t.span,
                        format!("expected a macro parameter, found {}", other.describe()),
                    );
                    return Err(Stop);
                }
            });
            if !self.eat(&Tok::Comma) {
                break;
            }
        }
        self.expect(&Tok::RParen)?;
        let body = self.expr_block()?;
        Ok(MacroDef {
            name,
            name_span: name_tok.span,
            params,
            body,
            span: self.span_from(start),
        })
    }

    /// `fn NAME($a: TYPE, ...): TYPE { body }` (no `: TYPE` after the parameters:
    /// `void`).
    fn fn_def(&mut self) -> PResult<FnDef> {
        let start = self.bump().span;
        let name_tok = self.bump();
        let Tok::Ident(name) = name_tok.tok else {
            unreachable!("checked by item()")
        };
        self.expect(&Tok::LParen)?;
        let mut params = Vec::new();
        while !self.at(&Tok::RParen) {
            let t = self.bump();
            let Tok::Var(pname) = t.tok else {
                self.diags.push(
                    Diagnostic::error(
                        t.span,
                        format!(
                            "expected a function parameter (`$name: type`), found {}",
                            t.tok.describe()
                        ),
                    )
                    .with_help(format!("write `fn {name}($a: int64, ...)`")),
                );
                return Err(Stop);
            };
            if !self.at(&Tok::Colon) {
                let at = self.peek_span();
                self.diags.push(
                    Diagnostic::error(
                        at,
                        format!("the parameter `${pname}` of `{name}` needs a type"),
                    )
                    .with_help(format!("write `${pname}: int64` (or another type)")),
                );
                return Err(Stop);
            }
            self.bump();
            let ty = self.type_expr()?;
            params.push(FnParam {
                name: pname,
                span: t.span,
                ty,
            });
            if !self.eat(&Tok::Comma) {
                break;
            }
        }
        let close = self.expect(&Tok::RParen)?.span;
        let ret = if self.eat(&Tok::Colon) {
            self.type_expr()?
        } else {
            TypeExpr {
                base: TypeName::Void,
                pointer: 0,
                array: None,
                dims: Vec::new(),
                span: close,
            }
        };
        let body = self.block()?;
        Ok(FnDef {
            name,
            name_span: name_tok.span,
            params,
            ret,
            body,
            span: self.span_from(start),
        })
    }

    fn map_decl(&mut self) -> PResult<MapDeclItem> {
        let start = self.bump().span;
        let Tok::Map(name) = self.bump().tok else {
            unreachable!("checked by item()")
        };
        self.expect(&Tok::Assign)?;
        let kt = self.bump();
        let Tok::Ident(kind) = kt.tok else {
            self.diags
                .error(kt.span, "expected a map kind (`hash`, `lruhash`, ...)");
            return Err(Stop);
        };
        self.expect(&Tok::LParen)?;
        let st = self.bump();
        let Tok::Int(size) = st.tok else {
            self.diags
                .error(st.span, "expected the map's maximum number of entries");
            return Err(Stop);
        };
        self.expect(&Tok::RParen)?;
        self.expect(&Tok::Semi)?;
        Ok(MapDeclItem {
            name,
            kind,
            size,
            span: self.span_from(start),
        })
    }

    fn struct_def(&mut self) -> PResult<StructDef> {
        let kw = self.bump();
        let start = kw.span;
        let union = kw.tok == Tok::Ident("union".to_string());
        let Tok::Ident(name) = self.bump().tok else {
            unreachable!("checked by item()")
        };
        let mut def = self.struct_body(name, union, start)?;
        self.eat(&Tok::Semi);
        def.span = self.span_from(start);
        Ok(def)
    }

    /// `{ members }` of a struct or union named `name` (after its `{`-less head).
    fn struct_body(&mut self, name: String, union: bool, start: Span) -> PResult<StructDef> {
        self.expect(&Tok::LBrace)?;
        let mut fields = Vec::new();
        let mut nested = Vec::new();
        while !self.eat(&Tok::RBrace) {
            // `struct { ... } name;` or an anonymous `union { ... };` member.
            let inline = match (self.peek_tok(0), self.peek_tok(1)) {
                (Tok::Ident(w), Tok::LBrace) if w == "struct" || w == "union" => {
                    Some((w == "union", None))
                }
                // `struct Bar { ... } bar;`: a member whose type is defined there (its
                // tag is the program's, as in C).
                (Tok::Ident(w), Tok::Ident(tag))
                    if (w == "struct" || w == "union") && self.peek_tok(2) == Tok::LBrace =>
                {
                    Some((w == "union", Some(tag)))
                }
                _ => None,
            };
            if let Some((inner_union, tag)) = inline {
                let kw = self.bump().span;
                if tag.is_some() {
                    self.bump();
                }
                let inner_name =
                    tag.unwrap_or_else(|| format!("{name}::(anonymous {})", nested.len() + 1));
                let mut inner =
                    self.deeper(|p| p.struct_body(inner_name.clone(), inner_union, kw))?;
                inner.span = self.span_from(kw);
                let ty = TypeExpr {
                    base: TypeName::Struct(inner_name),
                    pointer: 0,
                    array: None,
                    dims: Vec::new(),
                    span: inner.span,
                };
                nested.push(inner);
                let fname = match self.peek_tok(0) {
                    Tok::Ident(f) => {
                        let sp = self.bump().span;
                        (f, sp)
                    }
                    _ => (String::new(), ty.span),
                };
                self.expect(&Tok::Semi)?;
                fields.push((ty, fname.0, fname.1, None));
                continue;
            }
            let base = self.c_type()?;
            // `unsigned int a:4, b:8;`: declarators sharing the type.
            loop {
                let mut ty = base.clone();
                let nt = self.bump();
                let Tok::Ident(fname) = nt.tok else {
                    self.diags.error(
                        nt.span,
                        format!("expected a field name, found {}", nt.tok.describe()),
                    );
                    return Err(Stop);
                };
                if self.eat(&Tok::LBracket) {
                    let n = self.bump();
                    let Tok::Int(len) = n.tok else {
                        self.diags.error(n.span, "expected an array length");
                        return Err(Stop);
                    };
                    self.expect(&Tok::RBracket)?;
                    ty.array = Some(Some(len));
                    // `int z[2][3]`: the further dimensions.
                    while self.eat(&Tok::LBracket) {
                        let n = self.bump();
                        let Tok::Int(len) = n.tok else {
                            self.diags.error(n.span, "expected an array length");
                            return Err(Stop);
                        };
                        self.expect(&Tok::RBracket)?;
                        ty.dims.push(len);
                    }
                    // `char name[N]`: the type as written, for diagnostics about its size.
                    ty.span = self.span_from(ty.span);
                }
                // `unsigned int a:3;`: a bit-field of 3 bits.
                let width = if self.eat(&Tok::Colon) {
                    let w = self.bump();
                    let Tok::Int(w) = w.tok else {
                        self.diags.error(
                            w.span,
                            format!("expected a bit-field width, found {}", w.tok.describe()),
                        );
                        return Err(Stop);
                    };
                    Some(w)
                } else {
                    None
                };
                fields.push((ty, fname, nt.span, width));
                if !self.eat(&Tok::Comma) {
                    break;
                }
            }
            // The last member's `;` may be left out (`struct x { long x }`, upstream).
            if self.peek_tok(0) != Tok::RBrace {
                self.expect(&Tok::Semi)?;
            }
        }
        Ok(StructDef {
            name,
            union,
            fields,
            nested,
            span: self.span_from(start),
        })
    }

    /// An identifier if one comes next (an optional name: `enum [name]`, `struct
    /// [name]`).
    fn optional_ident(&mut self) -> Option<String> {
        match self.peek_tok(0) {
            Tok::Ident(n) => {
                self.bump();
                Some(n)
            }
            _ => None,
        }
    }

    /// `enum [name] { A, B = 2, C = -1, }` and an optional `;`.
    fn enum_def(&mut self) -> PResult<EnumDef> {
        let start = self.bump().span;
        let name = self.optional_ident();
        self.expect(&Tok::LBrace)?;
        let mut variants = Vec::new();
        while !self.at(&Tok::RBrace) {
            let t = self.bump();
            let Tok::Ident(vname) = t.tok else {
                self.diags.error(
                    t.span,
                    format!("expected an enumerator name, found {}", t.tok.describe()),
                );
                return Err(Stop);
            };
            let value = if self.eat(&Tok::Assign) {
                let negative = self.eat(&Tok::Minus);
                let v = self.bump();
                let Tok::Int(n) = v.tok else {
                    self.diags.error(
                        v.span,
                        format!(
                            "expected an integer value for `{vname}`, found {}",
                            v.tok.describe()
                        ),
                    );
                    return Err(Stop);
                };
                let Ok(n) = i64::try_from(n) else {
                    self.diags.error(
                        v.span,
                        format!("the value of `{vname}` does not fit in an int64"),
                    );
                    return Err(Stop);
                };
                Some(if negative { -n } else { n })
            } else {
                None
            };
            variants.push((vname, value, self.span_from(t.span)));
            if !self.eat(&Tok::Comma) {
                break;
            }
        }
        self.expect(&Tok::RBrace)?;
        self.eat(&Tok::Semi);
        Ok(EnumDef {
            name,
            variants,
            span: self.span_from(start),
        })
    }

    /// A C type in a struct definition: qualifiers, a base name, `*`s.
    fn c_type(&mut self) -> PResult<TypeExpr> {
        let start = self.peek_span();
        let mut words = Vec::new();
        loop {
            match self.peek_tok(0) {
                Tok::Ident(w) if w == "const" || w == "volatile" => {
                    self.bump();
                }
                Tok::Ident(w) if w == "struct" || w == "union" || w == "enum" => {
                    self.bump();
                    let t = self.bump();
                    let Tok::Ident(n) = t.tok else {
                        return Err(self.error_here("a struct name"));
                    };
                    if w == "enum" {
                        words.push("int".to_string());
                    } else {
                        words.push(format!("struct {n}"));
                    }
                }
                // A word followed by another word (or `*`) is part of the type.
                Tok::Ident(w)
                    if words.is_empty()
                        || matches!(self.peek_tok(1), Tok::Ident(_) | Tok::Star) =>
                {
                    self.bump();
                    words.push(w);
                }
                _ => break,
            }
        }
        if words.is_empty() {
            return Err(self.error_here("a type"));
        }
        let mut pointer = 0;
        while self.eat(&Tok::Star) {
            pointer += 1;
        }
        Ok(TypeExpr {
            base: c_type_name(&words),
            pointer,
            array: None,
            dims: Vec::new(),
            span: self.span_from(start),
        })
    }

    /// `seq NAME[KEY] { probe [*] ... }`.
    /// `group NAME;` or `group NAME = member, member;`.
    fn group_decl(&mut self) -> PResult<GroupDecl> {
        let start = self.bump().span;
        let name_tok = self.bump();
        let Tok::Ident(name) = name_tok.tok else {
            unreachable!("checked by item()")
        };
        let mut members = Vec::new();
        if self.eat(&Tok::Assign) {
            loop {
                members.push(self.expr()?);
                if !self.eat(&Tok::Comma) {
                    break;
                }
            }
        }
        self.expect(&Tok::Semi)?;
        Ok(GroupDecl {
            name,
            name_span: name_tok.span,
            members,
            span: self.span_from(start),
        })
    }

    fn seq_block(&mut self) -> PResult<SeqBlock> {
        self.deeper(|p| {
            let start = p.bump().span;
            let name_tok = p.bump();
            let Tok::Ident(name) = name_tok.tok else {
                unreachable!("checked by item()")
            };
            p.expect(&Tok::LBracket)?;
            let key = p.expr()?;
            p.expect(&Tok::RBracket)?;
            p.expect(&Tok::LBrace)?;
            let mut steps = Vec::new();
            let mut timeout = None;
            while !p.at(&Tok::RBrace) && !p.at(&Tok::Eof) {
                if p.at(&Tok::Semi) {
                    p.bump();
                    continue;
                }
                if let (Tok::Ident(w), Tok::Int(_)) = (p.peek_tok(0), p.peek_tok(1)) {
                    if w == "timeout" {
                        let at = p.bump().span;
                        let Tok::Int(ns) = p.bump().tok else {
                            unreachable!("peeked")
                        };
                        let body = p.block()?;
                        timeout = Some((ns, body, p.span_from(at)));
                        continue;
                    }
                }
                let probe = p.probe(None)?;
                let star = p.eat(&Tok::Star);
                steps.push(SeqStep { probe, star });
            }
            p.expect(&Tok::RBrace)?;
            Ok(SeqBlock {
                name,
                name_span: name_tok.span,
                key,
                steps,
                timeout,
                span: p.span_from(start),
            })
        })
    }

    fn reserved_block(&mut self) -> PResult<ReservedBlock> {
        self.deeper(|p| p.reserved_block_inner())
    }

    fn reserved_block_inner(&mut self) -> PResult<ReservedBlock> {
        let kw = self.bump();
        let Tok::Ident(keyword) = kw.tok else {
            unreachable!("checked by item()")
        };
        let name = self.optional_ident();
        self.expect(&Tok::LBrace)?;
        let mut items = Vec::new();
        while !self.at(&Tok::RBrace) && !self.at(&Tok::Eof) {
            match self.item() {
                Ok(Some(i)) => items.push(i),
                Ok(None) => {}
                Err(Stop) => self.recover_item(),
            }
        }
        self.expect(&Tok::RBrace)?;
        Ok(ReservedBlock {
            keyword,
            name,
            items,
            span: self.span_from(kw.span),
        })
    }

    // ---- blocks and statements ------------------------------------------------

    /// `{ stmt; stmt; ... }` used as a statement (a trailing expression without
    /// `;` stays a statement).
    fn block(&mut self) -> PResult<Block> {
        let mut b = self.block_inner()?.0;
        if let Some(last) = b.stmts.last_mut() {
            demote(last);
        }
        Ok(b)
    }

    /// A branch of an `if`: its final expression (or `if`) without `;` is kept as
    /// its value, in case the `if` is used as one; [`demote`] puts it back when not.
    fn branch_block(&mut self) -> PResult<Block> {
        let (mut b, value) = self.block_inner()?;
        if value
            && matches!(
                b.stmts.last(),
                Some(Stmt {
                    kind: StmtKind::Expr(_),
                    ..
                })
            )
        {
            if let Some(Stmt {
                kind: StmtKind::Expr(e),
                ..
            }) = b.stmts.pop()
            {
                b.value = Some(Box::new(e));
            }
        }
        Ok(b)
    }

    /// `{ stmts; value }` used as an expression.
    fn expr_block(&mut self) -> PResult<Block> {
        let (mut b, value) = self.block_inner()?;
        if value {
            match b.stmts.pop() {
                Some(Stmt {
                    kind: StmtKind::Expr(e),
                    ..
                }) => b.value = Some(Box::new(e)),
                // `{ ...; if (c) { a } else { b } }`: the `if` is the value.
                Some(mut s) => match if_value(&mut s) {
                    Some(e) => b.value = Some(Box::new(e)),
                    None => {
                        demote(&mut s);
                        b.stmts.push(s)
                    }
                },
                None => {}
            }
        }
        if let Some(last) = b.stmts.last_mut() {
            demote(last);
        }
        Ok(b)
    }

    /// A block, and whether its last statement is an expression without `;`.
    /// Statement errors are recovered inside.
    fn block_inner(&mut self) -> PResult<(Block, bool)> {
        self.deeper(|p| p.block_inner_at_depth())
    }

    fn block_inner_at_depth(&mut self) -> PResult<(Block, bool)> {
        let start = self.expect(&Tok::LBrace)?.span;
        let mut stmts = Vec::new();
        let mut value_candidate = false;
        loop {
            if self.eat(&Tok::Semi) {
                value_candidate = false;
                continue;
            }
            if self.at(&Tok::RBrace) {
                self.bump();
                break;
            }
            if self.at(&Tok::Eof) {
                let at = self.peek_span();
                self.diags.push(
                    Diagnostic::error(at, "unexpected end of input: unclosed `{`")
                        .with_note(Some(start), "the block starts here"),
                );
                return Err(Stop);
            }
            match self.stmt() {
                Ok((s, ends_with_block)) => {
                    let is_expr = matches!(s.kind, StmtKind::Expr(_) | StmtKind::If { .. });
                    stmts.push(s);
                    value_candidate = is_expr && self.at(&Tok::RBrace);
                    if !ends_with_block && !self.at(&Tok::Semi) && !self.at(&Tok::RBrace) {
                        let t = self.peek_at(0).clone();
                        let at = Span::new(self.prev_end as usize, self.prev_end as usize);
                        self.diags.push(
                            Diagnostic::error(
                                at,
                                format!(
                                    "expected `;` or `}}` after statement, found {}",
                                    t.tok.describe()
                                ),
                            )
                            .with_note(Some(t.span), "this cannot continue the statement"),
                        );
                        self.recover_stmt();
                    }
                }
                Err(Stop) => self.recover_stmt(),
            }
        }
        // Only a final `if` without `;` may be a value; the others are statements.
        let keep = usize::from(value_candidate);
        let n = stmts.len().saturating_sub(keep);
        for s in &mut stmts[..n] {
            demote(s);
        }
        Ok((
            Block {
                stmts,
                value: None,
                span: self.span_from(start),
            },
            value_candidate,
        ))
    }

    /// One statement; the flag says it ended with a `}` (no `;` needed after it).
    fn stmt(&mut self) -> PResult<(Stmt, bool)> {
        let start = self.peek_span();
        let kw = match self.peek() {
            Tok::Ident(s) => s.clone(),
            Tok::LBrace => {
                let b = self.block()?;
                return Ok((
                    Stmt {
                        kind: StmtKind::Block(b),
                        span: self.span_from(start),
                    },
                    true,
                ));
            }
            _ => String::new(),
        };
        let next = self.peek_tok(1);
        let kind = match kw.as_str() {
            // `if (c) {` or, as upstream allows, `if c {`.
            "if" if next != Tok::Assign => return self.if_stmt(),
            "unroll" if next == Tok::LParen => {
                self.bump();
                self.expect(&Tok::LParen)?;
                let count = self.nested(|p| p.expr())?;
                self.expect(&Tok::RParen)?;
                let body = self.stmt_block()?;
                return Ok((
                    Stmt {
                        kind: StmtKind::Unroll { count, body },
                        span: self.span_from(start),
                    },
                    true,
                ));
            }
            "while" if next == Tok::LParen => {
                self.bump();
                self.expect(&Tok::LParen)?;
                let cond = self.nested(|p| p.expr())?;
                self.expect(&Tok::RParen)?;
                let body = self.stmt_block()?;
                return Ok((
                    Stmt {
                        kind: StmtKind::While { cond, body },
                        span: self.span_from(start),
                    },
                    true,
                ));
            }
            "for" if next == Tok::LParen => return self.for_stmt(),
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
                if self.at(&Tok::Semi) || self.at(&Tok::RBrace) {
                    StmtKind::Return(None)
                } else {
                    StmtKind::Return(Some(self.expr()?))
                }
            }
            "let" if matches!(next, Tok::Var(_)) => {
                self.bump();
                let vt = self.bump();
                let Tok::Var(name) = vt.tok else {
                    unreachable!()
                };
                let var = VarRef {
                    name,
                    span: vt.span,
                    id: None,
                };
                let ty = if self.eat(&Tok::Colon) {
                    Some(self.type_expr()?)
                } else {
                    None
                };
                let value = if self.eat(&Tok::Assign) {
                    Some(self.expr()?)
                } else {
                    None
                };
                StmtKind::Let { var, ty, value }
            }
            _ => {
                let e = self.expr()?;
                let op = match self.peek() {
                    Tok::Assign => Some(None),
                    Tok::OpAssign(op) => Some(Some(*op)),
                    _ => None,
                };
                match op {
                    None => StmtKind::Expr(e),
                    Some(op) => {
                        let op_span = self.bump().span;
                        let target = match e.kind {
                            ExprKind::Var(v) => LValue::Var(v),
                            ExprKind::Map(m) => LValue::Map(m),
                            // `new = EXPR` in a set probe: the value written
                            // changes (`__weft_set_new`; the checker says where it
                            // may be used, and that it needs --unsafe).
                            ExprKind::Ident(ref n) if n == "new" && op.is_none() => {
                                let value = self.expr()?;
                                let span = e.span;
                                let kind = StmtKind::Expr(Expr::new(
                                    ExprKind::Call {
                                        name: "__weft_set_new".into(),
                                        name_span: span,
                                        args: vec![value],
                                    },
                                    span,
                                ));
                                return Ok((
                                    Stmt {
                                        kind,
                                        span: self.span_from(start),
                                    },
                                    false,
                                ));
                            }
                            // `_ = f()`: the value is computed and discarded, as
                            // upstream writes "I mean to ignore this".
                            ExprKind::Ident(ref n) if n == "_" && op.is_none() => {
                                let value = self.expr()?;
                                let kind = StmtKind::Expr(value);
                                return Ok((
                                    Stmt {
                                        kind,
                                        span: self.span_from(start),
                                    },
                                    false,
                                ));
                            }
                            _ => {
                                self.diags.push(
                                    Diagnostic::error(e.span, "cannot assign to this expression")
                                        .with_note(Some(op_span), "assignment here")
                                        .with_help("only scratch variables (`$x`) and maps (`@m`, `@m[k]`) can be assigned"),
                                );
                                return Err(Stop);
                            }
                        };
                        let value = self.expr()?;
                        StmtKind::Assign { target, op, value }
                    }
                }
            }
        };
        let ends_with_block = matches!(
            &kind,
            StmtKind::Expr(Expr {
                kind: ExprKind::Block(_),
                ..
            })
        );
        Ok((
            Stmt {
                kind,
                span: self.span_from(start),
            },
            ends_with_block,
        ))
    }

    fn stmt_block(&mut self) -> PResult<Block> {
        self.block()
    }

    fn if_stmt(&mut self) -> PResult<(Stmt, bool)> {
        let start = self.bump().span;
        // The condition is any expression: `(c)` is one in parentheses.
        let cond = self.nested(|p| p.expr())?;
        // A branch keeps its final expression as its value, for an `if` used as one
        // (a statement `if` evaluates it and drops it, as a statement).
        let then = self.branch_block()?;
        let otherwise = if self.at_ident("else") {
            self.bump();
            if self.at_ident("if") {
                let s = self.peek_span();
                let (nested, _) = self.deeper(|p| p.if_stmt())?;
                Some(Block {
                    stmts: vec![nested],
                    value: None,
                    span: self.span_from(s),
                })
            } else {
                Some(self.branch_block()?)
            }
        } else {
            None
        };
        Ok((
            Stmt {
                kind: StmtKind::If {
                    cond,
                    then,
                    otherwise,
                },
                span: self.span_from(start),
            },
            true,
        ))
    }

    /// `if (c) { a } else { b }` where a value is expected.
    fn if_expr(&mut self) -> PResult<Expr> {
        let (mut s, _) = self.deeper(|p| p.if_stmt())?;
        match if_value(&mut s) {
            Some(e) => Ok(e),
            None => {
                self.diags.push(
                    Diagnostic::error(s.span, "this `if` is used as a value, but it has none")
                        .with_help(
                            "an `if` expression needs an `else`, and each branch must end with \
                             an expression without `;`: `if (c) { 1 } else { 2 }`",
                        ),
                );
                Err(Stop)
            }
        }
    }

    fn for_stmt(&mut self) -> PResult<(Stmt, bool)> {
        let start = self.bump().span;
        self.expect(&Tok::LParen)?;
        let vt = self.bump();
        let Tok::Var(name) = vt.tok else {
            self.diags.error(
                vt.span,
                format!(
                    "expected a scratch variable (`$x`), found {}",
                    vt.tok.describe()
                ),
            );
            return Err(Stop);
        };
        let var = VarRef {
            name,
            span: vt.span,
            id: None,
        };
        self.expect(&Tok::Colon)?;
        let iter = if matches!(self.peek(), Tok::Map(_)) && self.peek_tok(1) == Tok::RParen {
            let t = self.bump();
            let Tok::Map(m) = t.tok else { unreachable!() };
            ForIter::Map(MapRef {
                name: m,
                name_span: t.span,
                keys: None,
                span: t.span,
            })
        } else {
            let a = self.nested(|p| p.expr())?;
            self.expect(&Tok::DotDot)?;
            let b = self.nested(|p| p.expr())?;
            ForIter::Range(Box::new(a), Box::new(b))
        };
        self.expect(&Tok::RParen)?;
        let body = self.stmt_block()?;
        Ok((
            Stmt {
                kind: StmtKind::For { var, iter, body },
                span: self.span_from(start),
            },
            true,
        ))
    }

    // ---- expressions ----------------------------------------------------------

    /// Run `f` with `/` meaning division again (inside parentheses or brackets).
    fn nested<T>(&mut self, f: impl FnOnce(&mut Self) -> PResult<T>) -> PResult<T> {
        let saved = self.in_predicate;
        self.in_predicate = false;
        let r = f(self);
        self.in_predicate = saved;
        r
    }

    pub(crate) fn expr(&mut self) -> PResult<Expr> {
        self.deeper(|p| p.expr_inner())
    }

    fn expr_inner(&mut self) -> PResult<Expr> {
        let cond = self.binary(1)?;
        if !self.at(&Tok::Question) {
            return Ok(cond);
        }
        self.bump();
        let then = self.nested(|p| p.expr())?;
        self.expect(&Tok::Colon)?;
        let otherwise = self.expr()?;
        let span = cond.span.to(otherwise.span);
        Ok(Expr::new(
            ExprKind::Ternary {
                cond: Box::new(cond),
                then: Box::new(then),
                otherwise: Box::new(otherwise),
            },
            span,
        ))
    }

    fn binary(&mut self, min_prec: u8) -> PResult<Expr> {
        let mark = self.begin_chain();
        let r = self.binary_chain(min_prec);
        self.end_chain(mark);
        r
    }

    fn binary_chain(&mut self, min_prec: u8) -> PResult<Expr> {
        let mut lhs = self.unary()?;
        loop {
            let tok = self.peek_tok(0);
            let Some(&(_, op, prec)) = BINOPS.iter().find(|(t, _, _)| *t == tok) else {
                break;
            };
            if prec < min_prec {
                break;
            }
            if op == BinOp::Div && self.in_predicate && self.peek_tok(1) == Tok::LBrace {
                break; // the `/` closing a predicate
            }
            let op_span = self.bump().span;
            let rhs = self.binary(prec + 1)?;
            self.chain_link(op_span)?;
            let span = lhs.span.to(rhs.span);
            lhs = Expr::new(
                ExprKind::Binary {
                    op,
                    lhs: Box::new(lhs),
                    rhs: Box::new(rhs),
                },
                span,
            );
        }
        Ok(lhs)
    }

    /// The operand of a prefix operator or cast, one level deeper.
    fn operand(&mut self) -> PResult<Expr> {
        self.deeper(|p| p.unary())
    }

    fn unary(&mut self) -> PResult<Expr> {
        let start = self.peek_span();
        let op = match self.peek() {
            Tok::Minus => Some(UnOp::Neg),
            Tok::Plus => Some(UnOp::Plus),
            Tok::Bang => Some(UnOp::Not),
            Tok::Tilde => Some(UnOp::BitNot),
            Tok::Star => Some(UnOp::Deref),
            Tok::Amp => Some(UnOp::AddrOf),
            _ => None,
        };
        if let Some(op) = op {
            self.bump();
            let e = self.operand()?;
            let span = start.to(e.span);
            return Ok(Expr::new(
                ExprKind::Unary {
                    op,
                    expr: Box::new(e),
                },
                span,
            ));
        }
        if matches!(self.peek(), Tok::PlusPlus | Tok::MinusMinus) {
            let increment = self.bump().tok == Tok::PlusPlus;
            let e = self.operand()?;
            let span = start.to(e.span);
            let target = self.inc_target(e)?;
            return Ok(Expr::new(
                ExprKind::IncDec {
                    target,
                    increment,
                    prefix: true,
                },
                span,
            ));
        }
        if self.at(&Tok::LParen) && self.cast_ahead() {
            self.bump();
            let ty = self.type_expr()?;
            self.expect(&Tok::RParen)?;
            let e = self.operand()?;
            let span = start.to(e.span);
            return Ok(Expr::new(
                ExprKind::Cast {
                    ty,
                    expr: Box::new(e),
                },
                span,
            ));
        }
        self.postfix()
    }

    fn inc_target(&mut self, e: Expr) -> PResult<IncTarget> {
        match e.kind {
            ExprKind::Var(v) => Ok(IncTarget::Var(v)),
            ExprKind::Map(m) => Ok(IncTarget::Map(m)),
            _ => {
                self.diags.error(
                    e.span,
                    "`++` and `--` apply only to scratch variables and maps",
                );
                Err(Stop)
            }
        }
    }

    /// After `(`: does a type follow (`int32)`, `uint8 *)`, `struct x *)`,
    /// `typeof(...)`)?
    fn cast_ahead(&mut self) -> bool {
        let Tok::Ident(name) = self.peek_tok(1) else {
            return false;
        };
        if name == "typeof" {
            return self.peek_tok(2) == Tok::LParen;
        }
        if matches!(name.as_str(), "struct" | "union" | "enum") {
            return matches!(self.peek_tok(2), Tok::Ident(_));
        }
        if int_type_name(&name).is_none() && !self.types.contains(&name) {
            return false;
        }
        let mut i = 2;
        if name == "unsigned" || name == "signed" || name == "long" {
            while matches!(self.peek_tok(i), Tok::Ident(_)) {
                i += 1;
            }
        }
        matches!(self.peek_tok(i), Tok::RParen | Tok::Star | Tok::LBracket)
    }

    /// `int32`, `uint8 *`, `struct foo **`, `uint8[8]`, `string`.
    fn type_expr(&mut self) -> PResult<TypeExpr> {
        let start = self.peek_span();
        let t = self.bump();
        let Tok::Ident(name) = t.tok else {
            self.diags.error(
                t.span,
                format!("expected a type, found {}", t.tok.describe()),
            );
            return Err(Stop);
        };
        let base = if name == "typeof" && self.at(&Tok::LParen) {
            self.bump();
            let x = self.nested(|p| p.expr())?;
            self.expect(&Tok::RParen)?;
            TypeName::Typeof(Box::new(x))
        } else if matches!(name.as_str(), "struct" | "union" | "enum") {
            let n = self.bump();
            let Tok::Ident(sname) = n.tok else {
                self.diags.error(n.span, "expected a struct name");
                return Err(Stop);
            };
            if name == "enum" {
                TypeName::Enum(sname)
            } else {
                TypeName::Struct(sname)
            }
        } else if matches!(name.as_str(), "unsigned" | "signed" | "long") {
            let mut words = vec![name];
            while let Tok::Ident(w) = self.peek_tok(0) {
                self.bump();
                words.push(w);
            }
            c_type_name(&words)
        } else {
            match int_type_name(&name) {
                Some(tn) => tn,
                None => TypeName::Named(name),
            }
        };
        let mut array = None;
        if self.eat(&Tok::LBracket) {
            if let Tok::Int(n) = self.peek_tok(0) {
                self.bump();
                array = Some(Some(n));
            } else {
                array = Some(None);
            }
            self.expect(&Tok::RBracket)?;
        }
        let mut pointer = 0;
        while self.eat(&Tok::Star) {
            pointer += 1;
        }
        Ok(TypeExpr {
            base,
            pointer,
            array,
            dims: Vec::new(),
            span: self.span_from(start),
        })
    }

    fn postfix(&mut self) -> PResult<Expr> {
        let mark = self.begin_chain();
        let r = self.postfix_chain();
        self.end_chain(mark);
        r
    }

    fn postfix_chain(&mut self) -> PResult<Expr> {
        let mut e = self.primary()?;
        loop {
            let at = self.peek_span();
            match self.peek_tok(0) {
                Tok::Dot | Tok::Arrow | Tok::LBracket | Tok::PlusPlus | Tok::MinusMinus => {
                    self.chain_link(at)?
                }
                _ => return Ok(e),
            }
            match self.peek_tok(0) {
                Tok::Dot | Tok::Arrow => {
                    let arrow = self.bump().tok == Tok::Arrow;
                    let t = self.bump();
                    let span = e.span.to(t.span);
                    e = match t.tok {
                        Tok::Ident(field) => Expr::new(
                            ExprKind::Field {
                                expr: Box::new(e),
                                field,
                                arrow,
                            },
                            span,
                        ),
                        Tok::Int(i) if !arrow => Expr::new(
                            ExprKind::TupleIndex {
                                expr: Box::new(e),
                                index: i,
                            },
                            span,
                        ),
                        other => {
                            self.diags.error(
                                t.span,
                                format!("expected a field name, found {}", other.describe()),
                            );
                            return Err(Stop);
                        }
                    };
                }
                Tok::LBracket => {
                    self.bump();
                    let index = self.nested(|p| p.expr())?;
                    self.expect(&Tok::RBracket)?;
                    let span = self.span_from(e.span);
                    e = Expr::new(
                        ExprKind::Index {
                            expr: Box::new(e),
                            index: Box::new(index),
                        },
                        span,
                    );
                }
                Tok::PlusPlus | Tok::MinusMinus => {
                    let increment = self.bump().tok == Tok::PlusPlus;
                    let span = self.span_from(e.span);
                    let target = self.inc_target(e)?;
                    e = Expr::new(
                        ExprKind::IncDec {
                            target,
                            increment,
                            prefix: false,
                        },
                        span,
                    );
                }
                _ => return Ok(e),
            }
        }
    }

    fn primary(&mut self) -> PResult<Expr> {
        let t = self.peek_at(0).clone();
        let span = t.span;
        match t.tok {
            Tok::Int(v) => {
                self.bump();
                Ok(Expr::new(ExprKind::Int(v), span))
            }
            Tok::Str(s) => {
                self.bump();
                Ok(Expr::new(ExprKind::Str(s), span))
            }
            Tok::Var(name) => {
                self.bump();
                Ok(Expr::new(
                    ExprKind::Var(VarRef {
                        name,
                        span,
                        id: None,
                    }),
                    span,
                ))
            }
            Tok::Positional(n) => {
                self.bump();
                Ok(Expr::new(ExprKind::Positional(n), span))
            }
            Tok::PositionalCount => {
                self.bump();
                Ok(Expr::new(ExprKind::PositionalCount, span))
            }
            Tok::Map(name) => {
                self.bump();
                let keys = if self.at(&Tok::LBracket) {
                    self.bump();
                    let keys = self.nested(|p| p.key_list())?;
                    self.expect(&Tok::RBracket)?;
                    if keys.is_empty() {
                        self.diags.error(
                            self.span_from(span),
                            "empty map key: write `@m` for a map without keys",
                        );
                        return Err(Stop);
                    }
                    Some(keys)
                } else {
                    None
                };
                let full = self.span_from(span);
                Ok(Expr::new(
                    ExprKind::Map(MapRef {
                        name,
                        name_span: span,
                        keys,
                        span: full,
                    }),
                    full,
                ))
            }
            Tok::Ident(name) if name == "if" && self.peek_tok(1) != Tok::Assign => self.if_expr(),
            Tok::Ident(name) => {
                self.bump();
                match name.as_str() {
                    "true" => return Ok(Expr::new(ExprKind::Bool(true), span)),
                    "false" => return Ok(Expr::new(ExprKind::Bool(false), span)),
                    _ => {}
                }
                if !self.at(&Tok::LParen) {
                    return Ok(Expr::new(ExprKind::Ident(name), span));
                }
                match name.as_str() {
                    "cflow" => return self.cflow(span, false),
                    "cflow_strict" => return self.cflow(span, true),
                    "sizeof" => return self.sizeof(span),
                    "offsetof" => return self.offsetof(span),
                    _ => {}
                }
                self.bump();
                let args = self.nested(|p| p.expr_list(&Tok::RParen))?;
                self.expect(&Tok::RParen)?;
                Ok(Expr::new(
                    ExprKind::Call {
                        name,
                        name_span: span,
                        args,
                    },
                    self.span_from(span),
                ))
            }
            Tok::LParen => self.paren(),
            Tok::LBrace => {
                let b = self.nested(|p| p.expr_block())?;
                let s = b.span;
                Ok(Expr::new(ExprKind::Block(Box::new(b)), s))
            }
            other => {
                self.diags.error(
                    span,
                    format!("expected an expression, found {}", other.describe()),
                );
                Err(Stop)
            }
        }
    }

    /// Comma-separated expressions up to (not including) `end`; a trailing comma is
    /// allowed.
    /// A map's keys: expressions, or `*` (any value, [`WILDCARD_KEY`]) where a key
    /// is a whole element: `delete(@m[10, *])`.
    fn key_list(&mut self) -> PResult<Vec<Expr>> {
        let mut out = Vec::new();
        while !self.at(&Tok::RBracket) {
            if self.at(&Tok::Star) && matches!(self.peek_tok(1), Tok::Comma | Tok::RBracket) {
                let span = self.bump().span;
                out.push(Expr::new(ExprKind::Ident(WILDCARD_KEY.into()), span));
            } else {
                out.push(self.expr()?);
            }
            if !self.eat(&Tok::Comma) {
                break;
            }
        }
        Ok(out)
    }

    fn expr_list(&mut self, end: &Tok) -> PResult<Vec<Expr>> {
        let mut out = Vec::new();
        while !self.at(end) {
            out.push(self.expr()?);
            if !self.eat(&Tok::Comma) {
                break;
            }
        }
        Ok(out)
    }

    /// `(e)`, `()`, `(a,)`, `(a, b)`, `(x = 1, y = 2)`.
    fn paren(&mut self) -> PResult<Expr> {
        let start = self.bump().span;
        self.nested(|p| {
            if p.eat(&Tok::RParen) {
                return Ok(Expr::new(ExprKind::Tuple(Vec::new()), p.span_from(start)));
            }
            if matches!(p.peek_tok(0), Tok::Ident(_)) && p.peek_tok(1) == Tok::Assign {
                let mut fields = Vec::new();
                while !p.at(&Tok::RParen) {
                    let t = p.bump();
                    let Tok::Ident(name) = t.tok else {
                        p.diags.error(
                            t.span,
                            format!("expected a record field name, found {}", t.tok.describe()),
                        );
                        return Err(Stop);
                    };
                    p.expect(&Tok::Assign)?;
                    fields.push((name, p.expr()?));
                    if !p.eat(&Tok::Comma) {
                        break;
                    }
                }
                p.expect(&Tok::RParen)?;
                return Ok(Expr::new(ExprKind::Record(fields), p.span_from(start)));
            }
            let first = p.expr()?;
            if p.eat(&Tok::RParen) {
                return Ok(first);
            }
            p.expect(&Tok::Comma)?;
            let mut elems = vec![first];
            elems.extend(p.expr_list(&Tok::RParen)?);
            p.expect(&Tok::RParen)?;
            Ok(Expr::new(ExprKind::Tuple(elems), p.span_from(start)))
        })
    }

    /// `cflow(P1, ..., Pn)`: attach points (or pointcut names), outermost first.
    fn cflow(&mut self, start: Span, strict: bool) -> PResult<Expr> {
        self.expect(&Tok::LParen)?;
        let mut elems = Vec::new();
        loop {
            self.reset_lookahead();
            let Some((raw, span)) = self.lx.scan_attach(true) else {
                return Err(self.error_here("an attach point"));
            };
            elems.push(CflowElem {
                specs: vec![attach_spec(raw, span)],
                span,
            });
            if !self.eat(&Tok::Comma) {
                break;
            }
        }
        self.expect(&Tok::RParen)?;
        Ok(Expr::new(
            ExprKind::Cflow(Cflow { strict, elems }),
            self.span_from(start),
        ))
    }

    fn sizeof(&mut self, start: Span) -> PResult<Expr> {
        self.expect(&Tok::LParen)?;
        let is_type = match self.peek_tok(0) {
            Tok::Ident(n) => {
                matches!(n.as_str(), "struct" | "union" | "enum")
                    || (int_type_name(&n).is_some() || self.types.contains(&n)) && {
                        matches!(
                            self.peek_tok(1),
                            Tok::RParen | Tok::Star | Tok::LBracket | Tok::Ident(_)
                        )
                    }
            }
            _ => false,
        };
        let arg = if is_type {
            SizeofArg::Type(self.type_expr()?)
        } else {
            SizeofArg::Expr(Box::new(self.nested(|p| p.expr())?))
        };
        self.expect(&Tok::RParen)?;
        Ok(Expr::new(ExprKind::Sizeof(arg), self.span_from(start)))
    }

    fn offsetof(&mut self, start: Span) -> PResult<Expr> {
        self.expect(&Tok::LParen)?;
        let ty = self.type_expr()?;
        self.expect(&Tok::Comma)?;
        // `a.b.c`: a field of a member struct, as upstream allows.
        let mut field = Vec::new();
        loop {
            let t = self.bump();
            let Tok::Ident(name) = t.tok else {
                self.diags.error(
                    t.span,
                    format!("expected a field name, found {}", t.tok.describe()),
                );
                return Err(Stop);
            };
            field.push(name);
            if !self.eat(&Tok::Dot) {
                break;
            }
        }
        self.expect(&Tok::RParen)?;
        Ok(Expr::new(
            ExprKind::Offsetof { ty, field },
            self.span_from(start),
        ))
    }
}

/// An `if` statement as an expression: `cond ? {then} : {else}` when it has an
/// `else` and every branch ends with a value (`else if` chains too), taken out
/// of `s`; else `None`, `s` untouched.
pub(crate) fn if_value(s: &mut Stmt) -> Option<Expr> {
    if !has_if_value(s) {
        return None;
    }
    let StmtKind::If {
        cond,
        then,
        otherwise: Some(mut o),
    } = std::mem::replace(&mut s.kind, StmtKind::Break)
    else {
        unreachable!("checked by has_if_value")
    };
    if o.value.is_none() {
        if let Some(e) = o.stmts.pop().and_then(|mut n| if_value(&mut n)) {
            o.value = Some(Box::new(e));
        }
    }
    let mut then = then;
    if then.value.is_none() {
        if let Some(e) = then.stmts.pop().and_then(|mut n| if_value(&mut n)) {
            then.value = Some(Box::new(e));
        }
    }
    let (ts, os) = (then.span, o.span);
    Some(Expr::new(
        ExprKind::Ternary {
            cond: Box::new(cond),
            then: Box::new(Expr::new(ExprKind::Block(Box::new(then)), ts)),
            otherwise: Box::new(Expr::new(ExprKind::Block(Box::new(o)), os)),
        },
        s.span,
    ))
}

/// An `if` that is a statement: each branch's final value becomes a statement again
/// (as in a block that is not a value), in `else if` chains and final `if`s too.
fn demote(s: &mut Stmt) {
    let StmtKind::If {
        then, otherwise, ..
    } = &mut s.kind
    else {
        return;
    };
    for b in std::iter::once(then).chain(otherwise.as_mut()) {
        if let Some(v) = b.value.take() {
            let span = v.span;
            b.stmts.push(Stmt {
                kind: StmtKind::Expr(*v),
                span,
            });
        } else if let Some(last) = b.stmts.last_mut() {
            demote(last);
        }
    }
}

fn has_if_value(s: &Stmt) -> bool {
    let StmtKind::If {
        then,
        otherwise: Some(o),
        ..
    } = &s.kind
    else {
        return false;
    };
    valued(then) && valued(o)
}

/// A branch that has a value: a final expression, or a final `if` that has one.
fn valued(b: &Block) -> bool {
    b.value.is_some() || b.stmts.last().is_some_and(has_if_value)
}

fn c_type_name(words: &[String]) -> TypeName {
    if let [w] = words {
        if let Some(s) = w.strip_prefix("struct ") {
            return TypeName::Struct(s.to_string());
        }
        if let Some(t) = int_type_name(w) {
            return t;
        }
        return TypeName::Named(w.clone());
    }
    let unsigned = words.iter().any(|w| w == "unsigned");
    let longs = words.iter().filter(|w| *w == "long").count();
    let bits = if words.iter().any(|w| w == "char") {
        8
    } else if words.iter().any(|w| w == "short") {
        16
    } else if longs > 0 {
        64
    } else {
        32
    };
    TypeName::Int {
        bits,
        signed: !unsigned,
    }
}

/// Split `provider:a:b` (quotes removed) and map provider aliases.
pub fn attach_spec(raw: String, span: Span) -> AttachSpec {
    let mut fields = Vec::new();
    let mut cur = String::new();
    let mut quoted = false;
    for c in raw.chars() {
        match c {
            '"' => quoted = !quoted,
            ':' if !quoted => fields.push(std::mem::take(&mut cur)),
            _ => cur.push(c),
        }
    }
    fields.push(cur);
    let provider = fields.remove(0);
    let provider = match provider.as_str() {
        p if p.eq_ignore_ascii_case("begin") => "BEGIN",
        p if p.eq_ignore_ascii_case("end") => "END",
        "u" | "execution" => "uprobe",
        "ur" => "uretprobe",
        "U" => "usdt",
        "k" => "kprobe",
        "kr" => "kretprobe",
        "t" => "tracepoint",
        "rt" => "rawtracepoint",
        "p" => "profile",
        "i" => "interval",
        "s" => "software",
        "h" => "hardware",
        "w" => "watchpoint",
        "aw" => "asyncwatchpoint",
        "f" => "fentry",
        "fr" => "fexit",
        "it" => "iter",
        "K" => "kernel",
        other => other,
    }
    .to_string();
    AttachSpec {
        provider,
        fields,
        raw,
        span,
        within: None,
    }
}
