//! A small reader of C headers: what `#include`d files (and `--include` files)
//! define that a script can use — `struct`/`union`/`enum` definitions, `typedef`s
//! and object-like `#define NAME <integer expression>` constants — as the same
//! AST the script's own definitions are ([`StructDef`], [`EnumDef`], [`TypeExpr`]),
//! so the checker lays them out with the same machinery.
//!
//! Not a C compiler. The preprocessor runs `#include` (through a
//! [`HeaderResolver`]: no IO here; a file is read once, which is what `#pragma
//! once` and include guards ask for), `#define`/`#undef` (object- and function-like
//! macros, `##`), and `#if`/`#ifdef`/`#ifndef`/`#elif`/`#else`/`#endif` (an
//! expression it cannot evaluate counts as false). Of the declarations it keeps
//! struct, union and enum definitions and typedefs, and skips everything else
//! (function prototypes and bodies, `extern` and variable declarations,
//! `__attribute__((...))`, `_Static_assert`) without failing. A struct whose layout
//! it cannot know (`packed`/`aligned` attributes, an unnamed bit-field, a member it
//! cannot read) is kept with the reason, an error only when a script uses it; so is
//! one with a member of an unknown type (the checker says which).

use std::collections::{HashMap, HashSet};

use crate::ast::{EnumDef, Include, Span, StructDef, TypeExpr, TypeName};
use crate::diag::Diagnostic;

/// Who includes a header: where a `"..."` name is looked for first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Includer<'a> {
    /// The script: its directory.
    Script,
    /// `--include FILE` on the command line: the working directory.
    CommandLine,
    /// Another header, by the path it was read from: its directory.
    Header(&'a str),
}

/// A header found by a [`HeaderResolver`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeaderFile {
    /// Where it was found (names it in messages; identifies it: a path is read once).
    pub path: String,
    pub text: String,
}

/// Finds and reads headers (implemented by the CLI: the script's directory, `-I`
/// directories, then the system's).
pub trait HeaderResolver {
    /// The header `name` (`angled`: written `<name>`, which skips the includer's
    /// directory). `Err`: the directories searched, in order.
    fn find(&self, name: &str, angled: bool, from: Includer<'_>)
        -> Result<HeaderFile, Vec<String>>;
}

/// What the headers define, in definition order.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CDecls {
    pub structs: Vec<HeaderStruct>,
    /// Every enumerator has its value.
    pub enums: Vec<EnumDef>,
    pub typedefs: Vec<(String, TypeExpr)>,
    /// `#define NAME <integer expression>`, by name.
    pub constants: Vec<(String, i64)>,
    /// The files read, in order.
    pub files: Vec<String>,
}

impl CDecls {
    pub fn is_empty(&self) -> bool {
        self.files.is_empty()
    }
}

/// A struct or union of a header.
#[derive(Clone, Debug, PartialEq)]
pub struct HeaderStruct {
    pub def: StructDef,
    /// `file:line` of its definition.
    pub origin: String,
    /// Why weft cannot lay it out: an error where a script uses it.
    pub unsupported: Option<String>,
}

/// How deeply headers may include each other.
pub const MAX_DEPTH: usize = 32;

/// Read the `--include` files (`command_line`, in order) and the script's
/// `#include`s. Errors (a header not found, too deep) are located at the script's
/// `#include` line they come from (a `--include` file's at the start of the text).
pub fn read(
    command_line: &[String],
    includes: &[Include],
    resolver: &dyn HeaderResolver,
) -> (CDecls, Vec<Diagnostic>) {
    let mut pre = Pre {
        resolver,
        macros: predefined(),
        seen: HashSet::new(),
        missing: HashSet::new(),
        files: Vec::new(),
        out: Vec::new(),
        diags: Vec::new(),
    };
    for name in command_line {
        pre.include(name, false, Includer::CommandLine, Span::default(), 0, "");
    }
    for inc in includes {
        pre.include(&inc.name, inc.angled, Includer::Script, inc.span, 0, "");
    }
    let Pre {
        macros,
        files,
        out,
        diags,
        ..
    } = pre;
    let mut d = DeclParser {
        toks: &out,
        pos: 0,
        files: &files,
        typedef_names: HashSet::new(),
        enumerators: HashMap::new(),
        out: CDecls::default(),
        anon: 0,
    };
    while d.pos < d.toks.len() {
        d.top_level();
    }
    let mut out = d.out;
    let enumerators = d.enumerators;
    let known = Known {
        enumerators: &enumerators,
        decls: &out,
    };
    let mut constants: Vec<(String, i64)> = macros
        .iter()
        .filter(|(_, m)| m.params.is_none() && !m.predefined && !m.body.is_empty())
        .filter_map(|(name, m)| {
            let toks = expand(&m.body, &macros, &mut vec![name.clone()], 0);
            eval_all(&toks, &known).map(|v| (name.clone(), v))
        })
        .collect();
    constants.sort();
    out.constants = constants;
    out.files = files;
    (out, diags)
}

// ---- tokens -------------------------------------------------------------------------

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum K {
    Ident,
    Num,
    Str,
    Char,
    Punct,
}

#[derive(Clone, Debug, PartialEq)]
struct CTok {
    kind: K,
    text: String,
    /// Index in the files read, and 1-based line.
    file: u32,
    line: u32,
}

impl CTok {
    fn is(&self, s: &str) -> bool {
        self.kind != K::Str && self.kind != K::Char && self.text == s
    }
    fn ident(&self) -> Option<&str> {
        (self.kind == K::Ident).then_some(self.text.as_str())
    }
}

const PUNCTS: &[&str] = &[
    "...", "<<=", ">>=", "->", "++", "--", "<<", ">>", "<=", ">=", "==", "!=", "&&", "||", "##",
    "+=", "-=", "*=", "/=", "%=", "&=", "|=", "^=",
];

/// The text without comments (each replaced by a space; the newlines of a block
/// comment kept, so lines keep their numbers).
fn strip_comments(text: &str) -> String {
    let b = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    let mut quote: Option<u8> = None;
    while i < b.len() {
        let c = b[i];
        if let Some(q) = quote {
            if c == b'\\' && i + 1 < b.len() {
                out.push_str(&text[i..i + 2]);
                i += 2;
                continue;
            }
            if c == q || c == b'\n' {
                quote = None;
            }
        } else if c == b'"' || c == b'\'' {
            quote = Some(c);
        } else if c == b'/' && b.get(i + 1) == Some(&b'/') {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
            out.push(' ');
            continue;
        } else if c == b'/' && b.get(i + 1) == Some(&b'*') {
            let end = text[i + 2..].find("*/").map_or(b.len(), |e| i + 2 + e + 2);
            out.push(' ');
            out.extend(text[i..end].chars().filter(|c| *c == '\n'));
            i = end;
            continue;
        }
        let ch = text[i..].chars().next().unwrap_or(' ');
        out.push(ch);
        i += ch.len_utf8();
    }
    out
}

/// The logical lines (backslash-newlines joined), each with its first line's number.
fn logical_lines(text: &str) -> Vec<(u32, String)> {
    let mut out = Vec::new();
    let mut cur: Option<(u32, String)> = None;
    for (i, line) in text.lines().enumerate() {
        let (n, mut acc) = cur.take().unwrap_or((i as u32 + 1, String::new()));
        match line.strip_suffix('\\') {
            Some(head) => {
                acc.push_str(head);
                acc.push(' ');
                cur = Some((n, acc));
            }
            None => {
                acc.push_str(line);
                out.push((n, acc));
            }
        }
    }
    out.extend(cur);
    out
}

fn tokenize(line: &str, file: u32, n: u32) -> Vec<CTok> {
    let b = line.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        let start = i;
        let kind = if c.is_ascii_whitespace() {
            i += 1;
            continue;
        } else if c.is_ascii_alphabetic() || c == b'_' {
            while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_') {
                i += 1;
            }
            K::Ident
        } else if c.is_ascii_digit() || (c == b'.' && b.get(i + 1).is_some_and(u8::is_ascii_digit))
        {
            while i < b.len() {
                let d = b[i];
                let sign =
                    (d == b'+' || d == b'-') && matches!(b[i - 1], b'e' | b'E' | b'p' | b'P');
                if sign || d.is_ascii_alphanumeric() || d == b'_' || d == b'.' {
                    i += 1;
                } else {
                    break;
                }
            }
            K::Num
        } else if c == b'"' || c == b'\'' {
            i += 1;
            while i < b.len() && b[i] != c {
                i += if b[i] == b'\\' { 2 } else { 1 };
            }
            i = (i + 1).min(b.len());
            if c == b'"' {
                K::Str
            } else {
                K::Char
            }
        } else {
            let p = PUNCTS
                .iter()
                .find(|p| line[i..].starts_with(**p))
                .map_or(1, |p| p.len());
            i += p;
            // A byte of a multi-byte character: take the whole character.
            while !line.is_char_boundary(i) {
                i += 1;
            }
            K::Punct
        };
        out.push(CTok {
            kind,
            text: line[start..i].to_string(),
            file,
            line: n,
        });
    }
    out
}

// ---- the preprocessor -----------------------------------------------------------------

#[derive(Clone, Debug)]
struct Macro {
    /// `None`: an object-like macro.
    params: Option<Vec<String>>,
    body: Vec<CTok>,
    predefined: bool,
}

/// What the compiler would define for x86-64 Linux (not `__GNUC__`: the C library's
/// headers then spell out fewer extensions).
fn predefined() -> HashMap<String, Macro> {
    const DEFS: &[(&str, &str)] = &[
        ("__x86_64__", "1"),
        ("__x86_64", "1"),
        ("__amd64__", "1"),
        ("__linux__", "1"),
        ("__linux", "1"),
        ("__unix__", "1"),
        ("__unix", "1"),
        ("__LP64__", "1"),
        ("_LP64", "1"),
        ("__STDC__", "1"),
        ("__STDC_VERSION__", "201710L"),
        ("__CHAR_BIT__", "8"),
        ("__SIZEOF_SHORT__", "2"),
        ("__SIZEOF_INT__", "4"),
        ("__SIZEOF_LONG__", "8"),
        ("__SIZEOF_LONG_LONG__", "8"),
        ("__SIZEOF_POINTER__", "8"),
        ("__ORDER_LITTLE_ENDIAN__", "1234"),
        ("__ORDER_BIG_ENDIAN__", "4321"),
        ("__BYTE_ORDER__", "__ORDER_LITTLE_ENDIAN__"),
    ];
    DEFS.iter()
        .map(|(n, v)| {
            let m = Macro {
                params: None,
                body: tokenize(v, 0, 0),
                predefined: true,
            };
            (n.to_string(), m)
        })
        .collect()
}

/// One `#if` level.
struct Cond {
    /// The enclosing level is active.
    parent: bool,
    /// A branch of this level was taken already.
    taken: bool,
    active: bool,
}

struct Pre<'r> {
    resolver: &'r dyn HeaderResolver,
    macros: HashMap<String, Macro>,
    seen: HashSet<String>,
    /// Names not found (reported once).
    missing: HashSet<String>,
    files: Vec<String>,
    /// The declarations' tokens, macros expanded.
    out: Vec<CTok>,
    diags: Vec<Diagnostic>,
}

impl Pre<'_> {
    /// Read `name` (included by `from`), reporting at `span` (the script's line).
    /// `chain`: ` (included from a.h:3)` for a nested include.
    fn include(
        &mut self,
        name: &str,
        angled: bool,
        from: Includer<'_>,
        span: Span,
        depth: usize,
        chain: &str,
    ) {
        if depth >= MAX_DEPTH {
            self.diags.push(Diagnostic::error(
                span,
                format!("headers include each other more than {MAX_DEPTH} deep at `{name}`{chain}"),
            ));
            return;
        }
        let file = match self.resolver.find(name, angled, from) {
            Ok(f) => f,
            Err(_) if !self.missing.insert(format!("{angled}{name}")) => return,
            Err(searched) => {
                let shown = if angled {
                    format!("<{name}>")
                } else {
                    format!("\"{name}\"")
                };
                let dirs = if searched.is_empty() {
                    "nowhere".to_string()
                } else {
                    searched.join(", ")
                };
                self.diags.push(Diagnostic::error(
                    span,
                    format!("header {shown}{chain} not found; searched {dirs}"),
                ));
                return;
            }
        };
        if !self.seen.insert(file.path.clone()) {
            return;
        }
        let index = self.files.len() as u32;
        self.files.push(file.path.clone());
        self.file(&file, index, span, depth);
    }

    fn file(&mut self, file: &HeaderFile, index: u32, span: Span, depth: usize) {
        let text = strip_comments(&file.text);
        let mut conds: Vec<Cond> = Vec::new();
        let mut pending: Vec<CTok> = Vec::new();
        for (n, line) in logical_lines(&text) {
            let active = conds.last().is_none_or(|c| c.active);
            let trimmed = line.trim_start();
            let Some(directive) = trimmed.strip_prefix('#') else {
                if active {
                    pending.extend(tokenize(&line, index, n));
                }
                continue;
            };
            self.flush(&mut pending);
            let toks = tokenize(directive, index, n);
            let word = toks.first().map_or("", |t| t.text.as_str());
            let rest = &toks[toks.len().min(1)..];
            match word {
                "if" | "ifdef" | "ifndef" => {
                    let on = active
                        && match word {
                            "if" => self.condition(rest),
                            "ifdef" => rest
                                .first()
                                .is_some_and(|t| self.macros.contains_key(&t.text)),
                            _ => rest
                                .first()
                                .is_some_and(|t| !self.macros.contains_key(&t.text)),
                        };
                    conds.push(Cond {
                        parent: active,
                        taken: on,
                        active: on,
                    });
                }
                "elif" | "elifdef" | "elifndef" => {
                    let Some(c) = conds.last() else { continue };
                    let on = c.parent
                        && !c.taken
                        && match word {
                            "elif" => self.condition(rest),
                            "elifdef" => rest
                                .first()
                                .is_some_and(|t| self.macros.contains_key(&t.text)),
                            _ => rest
                                .first()
                                .is_some_and(|t| !self.macros.contains_key(&t.text)),
                        };
                    if let Some(c) = conds.last_mut() {
                        c.active = on;
                        c.taken |= on;
                    }
                }
                "else" => {
                    if let Some(c) = conds.last_mut() {
                        c.active = c.parent && !c.taken;
                        c.taken = true;
                    }
                }
                "endif" => {
                    conds.pop();
                }
                _ if !active => {}
                "define" => self.define(directive),
                "undef" => {
                    if let Some(t) = rest.first() {
                        self.macros.remove(&t.text);
                    }
                }
                "include" | "include_next" => {
                    let arg = directive.trim_start()[word.len()..].trim();
                    let target = match arg.as_bytes().first() {
                        Some(b'<') => arg[1..].find('>').map(|e| (&arg[1..1 + e], true)),
                        Some(b'"') => arg[1..].find('"').map(|e| (&arg[1..1 + e], false)),
                        // A computed include: not followed.
                        _ => None,
                    };
                    if let Some((name, angled)) = target {
                        let chain = format!(" (included from {}:{n})", file.path);
                        self.include(
                            name,
                            angled,
                            Includer::Header(&file.path),
                            span,
                            depth + 1,
                            &chain,
                        );
                    }
                }
                // `#pragma once` holds anyway (a file is read once); `#error`,
                // `#warning`, `#line` and the rest are not weft's business.
                _ => {}
            }
        }
        self.flush(&mut pending);
    }

    fn flush(&mut self, pending: &mut Vec<CTok>) {
        if !pending.is_empty() {
            let toks = expand(pending, &self.macros, &mut Vec::new(), 0);
            self.out.extend(toks);
            pending.clear();
        }
    }

    /// `#define NAME body` or `#define NAME(a, b) body` (no space before `(`).
    fn define(&mut self, directive: &str) {
        let text = directive.trim_start()["define".len()..].trim_start();
        let name_len = text
            .bytes()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == b'_')
            .count();
        if name_len == 0 {
            return;
        }
        let name = &text[..name_len];
        let after = &text[name_len..];
        let (params, body) = match after.strip_prefix('(') {
            Some(p) => {
                let Some(close) = p.find(')') else { return };
                let params = p[..close]
                    .split(',')
                    .map(|s| s.trim().to_string())
                    .filter(|s| !s.is_empty())
                    .collect();
                (Some(params), &p[close + 1..])
            }
            None => (None, after),
        };
        self.macros.insert(
            name.to_string(),
            Macro {
                params,
                body: tokenize(body, 0, 0),
                predefined: false,
            },
        );
    }

    /// An `#if` expression: `defined` replaced, macros expanded, other names 0.
    /// One it cannot evaluate is false.
    fn condition(&self, toks: &[CTok]) -> bool {
        let mut replaced = Vec::new();
        let mut i = 0;
        while i < toks.len() {
            if toks[i].is("defined") {
                let (name, next) = if toks.get(i + 1).is_some_and(|t| t.is("(")) {
                    (toks.get(i + 2), i + 4)
                } else {
                    (toks.get(i + 1), i + 2)
                };
                let v = name.is_some_and(|t| self.macros.contains_key(&t.text));
                replaced.push(CTok {
                    kind: K::Num,
                    text: if v { "1" } else { "0" }.to_string(),
                    ..toks[i].clone()
                });
                i = next;
            } else {
                replaced.push(toks[i].clone());
                i += 1;
            }
        }
        let expanded = expand(&replaced, &self.macros, &mut Vec::new(), 0);
        eval_all(&expanded, &Preprocessing).is_some_and(|v| v != 0)
    }
}

/// How deeply macros may expand into macros.
const MAX_EXPANSION: usize = 64;

/// `toks` with the macros expanded (`disabled`: the macros being expanded, not
/// expanded again).
fn expand(
    toks: &[CTok],
    macros: &HashMap<String, Macro>,
    disabled: &mut Vec<String>,
    depth: usize,
) -> Vec<CTok> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < toks.len() {
        let t = &toks[i];
        i += 1;
        let m = match t.ident().and_then(|n| macros.get(n)) {
            Some(m) if depth < MAX_EXPANSION && !disabled.contains(&t.text) => m,
            _ => {
                out.push(t.clone());
                continue;
            }
        };
        let body = match &m.params {
            None => m.body.clone(),
            Some(params) => {
                if !toks.get(i).is_some_and(|n| n.is("(")) {
                    out.push(t.clone());
                    continue;
                }
                // The arguments, split at top-level commas.
                let mut args: Vec<Vec<CTok>> = vec![Vec::new()];
                let mut level = 0;
                i += 1;
                while i < toks.len() {
                    let a = &toks[i];
                    i += 1;
                    if a.is("(") {
                        level += 1;
                    } else if a.is(")") {
                        if level == 0 {
                            break;
                        }
                        level -= 1;
                    } else if a.is(",") && level == 0 && args.len() < params.len().max(1) {
                        args.push(Vec::new());
                        continue;
                    }
                    args.last_mut().unwrap_or(&mut Vec::new()).push(a.clone());
                }
                substitute(&m.body, params, &args, macros, disabled, depth)
            }
        };
        let body: Vec<CTok> = body
            .into_iter()
            .map(|b| CTok {
                file: t.file,
                line: t.line,
                ..b
            })
            .collect();
        disabled.push(t.text.clone());
        out.extend(expand(&body, macros, disabled, depth + 1));
        disabled.pop();
    }
    out
}

/// A function-like macro's body with its parameters replaced (`##` pastes; `#x`
/// becomes a string).
fn substitute(
    body: &[CTok],
    params: &[String],
    args: &[Vec<CTok>],
    macros: &HashMap<String, Macro>,
    disabled: &mut Vec<String>,
    depth: usize,
) -> Vec<CTok> {
    let arg_of = |t: &CTok| -> Option<&Vec<CTok>> {
        let name = t.ident()?;
        let i = params
            .iter()
            .position(|p| p == name || (p == "..." && name == "__VA_ARGS__"))?;
        args.get(i)
    };
    let mut out: Vec<CTok> = Vec::new();
    let mut i = 0;
    while i < body.len() {
        let t = &body[i];
        let pasted_after = body.get(i + 1).is_some_and(|n| n.is("##"));
        let pasted_before = i > 0 && body[i - 1].is("##");
        if t.is("#") && body.get(i + 1).and_then(&arg_of).is_some() {
            let text: Vec<String> = arg_of(&body[i + 1])
                .into_iter()
                .flatten()
                .map(|a| a.text.clone())
                .collect();
            out.push(CTok {
                kind: K::Str,
                text: format!("\"{}\"", text.join(" ")),
                ..t.clone()
            });
            i += 2;
            continue;
        }
        if t.is("##") {
            i += 1;
            continue;
        }
        let piece: Vec<CTok> = match arg_of(t) {
            Some(a) if pasted_after || pasted_before => a.clone(),
            Some(a) => expand(a, macros, disabled, depth + 1),
            None => vec![t.clone()],
        };
        if pasted_before {
            // Glue the first token of `piece` to the last of `out`.
            let mut rest = piece.into_iter();
            match (out.last_mut(), rest.next()) {
                (Some(last), Some(first)) => {
                    last.text.push_str(&first.text);
                    if last.kind == K::Punct && first.kind == K::Ident {
                        last.kind = K::Ident;
                    }
                }
                (None, Some(first)) => out.push(first),
                _ => {}
            }
            out.extend(rest);
        } else {
            out.extend(piece);
        }
        i += 1;
    }
    out
}

// ---- integer constant expressions --------------------------------------------------

/// The value of a whole integer constant expression, or None.
fn eval_all(toks: &[CTok], ctx: &dyn Names) -> Option<i64> {
    let mut e = Eval { toks, pos: 0, ctx };
    let v = e.ternary()?;
    (e.pos == toks.len()).then_some(v)
}

struct Eval<'a> {
    toks: &'a [CTok],
    pos: usize,
    ctx: &'a dyn Names,
}

/// What a constant expression's names mean.
trait Names {
    /// The value of a name.
    fn value(&self, name: &str) -> Option<i64>;
    /// A type's name (for casts).
    fn is_type(&self, name: &str) -> bool {
        is_type_word(name)
    }
    /// `sizeof(type)` of the type written `toks`.
    fn size_of(&self, _toks: &[CTok]) -> Option<u64> {
        None
    }
}

/// In `#if`: every name that is not a macro is 0.
struct Preprocessing;

impl Names for Preprocessing {
    fn value(&self, _: &str) -> Option<i64> {
        Some(0)
    }
}

/// In declarations: enumerators, typedefs and the structs read so far.
struct Known<'a> {
    enumerators: &'a HashMap<String, i64>,
    decls: &'a CDecls,
}

impl Names for Known<'_> {
    fn value(&self, name: &str) -> Option<i64> {
        self.enumerators.get(name).copied()
    }
    fn is_type(&self, name: &str) -> bool {
        is_type_word(name) || self.decls.typedefs.iter().any(|(n, _)| n == name)
    }
    fn size_of(&self, toks: &[CTok]) -> Option<u64> {
        let words: Vec<&str> = toks.iter().map(|t| t.text.as_str()).collect();
        let (base, rest) = match words.as_slice() {
            ["struct" | "union", name, rest @ ..] => (TypeName::Struct(name.to_string()), rest),
            [name, rest @ ..] if !is_int_word(name) => (TypeName::Named(name.to_string()), rest),
            _ => {
                let n = words.iter().take_while(|w| is_int_word(w)).count();
                let owned: Vec<String> = words[..n].iter().map(|w| w.to_string()).collect();
                (words_type(&owned), &words[n..])
            }
        };
        let pointer = rest.iter().take_while(|w| **w == "*").count();
        if pointer != rest.len() {
            return None;
        }
        self.layout(&type_expr(base, pointer as u32, &[]), 0)
            .map(|(size, _)| size)
    }
}

impl Known<'_> {
    /// Size and alignment of a type, as the checker would lay it out (None for a
    /// type it cannot: bit-fields, unknown names).
    fn layout(&self, t: &TypeExpr, depth: u32) -> Option<(u64, u64)> {
        if depth > 32 {
            return None;
        }
        let elem = if t.pointer > 0 {
            (8, 8)
        } else {
            match &t.base {
                TypeName::Int { bits, .. } => (u64::from(*bits / 8), u64::from(*bits / 8)),
                TypeName::Bool | TypeName::Char => (1, 1),
                TypeName::Named(n) => {
                    let (_, named) = self.decls.typedefs.iter().find(|(m, _)| m == n)?;
                    self.layout(named, depth + 1)?
                }
                TypeName::Struct(n) => {
                    let s = self.decls.structs.iter().rev().find(|s| s.def.name == *n)?;
                    if s.unsupported.is_some() {
                        return None;
                    }
                    let (mut size, mut align) = (0u64, 1u64);
                    for (ft, _, _, width) in &s.def.fields {
                        if width.is_some() {
                            return None;
                        }
                        let (fs, fa) = self.layout(ft, depth + 1)?;
                        align = align.max(fa);
                        if s.def.union {
                            size = size.max(fs);
                        } else {
                            size = size.div_ceil(fa) * fa + fs;
                        }
                    }
                    (size.div_ceil(align) * align, align)
                }
                _ => return None,
            }
        };
        let count: u64 = t
            .array
            .flatten()
            .into_iter()
            .chain(t.dims.iter().copied())
            .product();
        Some((elem.0 * count, elem.1))
    }
}

const BIN_PREC: &[(&str, u8)] = &[
    ("||", 1),
    ("&&", 2),
    ("|", 3),
    ("^", 4),
    ("&", 5),
    ("==", 6),
    ("!=", 6),
    ("<", 7),
    (">", 7),
    ("<=", 7),
    (">=", 7),
    ("<<", 8),
    (">>", 8),
    ("+", 9),
    ("-", 9),
    ("*", 10),
    ("/", 10),
    ("%", 10),
];

impl Eval<'_> {
    fn peek(&self) -> Option<&CTok> {
        self.toks.get(self.pos)
    }
    fn eat(&mut self, s: &str) -> bool {
        if self.peek().is_some_and(|t| t.is(s)) {
            self.pos += 1;
            true
        } else {
            false
        }
    }

    fn ternary(&mut self) -> Option<i64> {
        let c = self.binary(1)?;
        if !self.eat("?") {
            return Some(c);
        }
        let a = self.ternary()?;
        if !self.eat(":") {
            return None;
        }
        let b = self.ternary()?;
        Some(if c != 0 { a } else { b })
    }

    fn binary(&mut self, min: u8) -> Option<i64> {
        let mut l = self.unary()?;
        loop {
            let Some((op, prec)) = self.peek().and_then(|t| {
                (t.kind == K::Punct)
                    .then(|| BIN_PREC.iter().find(|(o, _)| *o == t.text))
                    .flatten()
                    .copied()
            }) else {
                return Some(l);
            };
            if prec < min {
                return Some(l);
            }
            self.pos += 1;
            let r = self.binary(prec + 1)?;
            l = match op {
                "||" => i64::from(l != 0 || r != 0),
                "&&" => i64::from(l != 0 && r != 0),
                "|" => l | r,
                "^" => l ^ r,
                "&" => l & r,
                "==" => i64::from(l == r),
                "!=" => i64::from(l != r),
                "<" => i64::from(l < r),
                ">" => i64::from(l > r),
                "<=" => i64::from(l <= r),
                ">=" => i64::from(l >= r),
                "<<" => l.checked_shl(u32::try_from(r).ok()?)?,
                ">>" => l.checked_shr(u32::try_from(r).ok()?)?,
                "+" => l.wrapping_add(r),
                "-" => l.wrapping_sub(r),
                "*" => l.wrapping_mul(r),
                "/" => l.checked_div(r)?,
                _ => l.checked_rem(r)?,
            };
        }
    }

    fn unary(&mut self) -> Option<i64> {
        let t = self.peek()?.clone();
        if t.kind == K::Punct {
            self.pos += 1;
            return match t.text.as_str() {
                "-" => self.unary().map(i64::wrapping_neg),
                "+" => self.unary(),
                "~" => self.unary().map(|v| !v),
                "!" => self.unary().map(|v| i64::from(v == 0)),
                "(" => {
                    // A cast to an integer type is read through.
                    let mut j = self.pos;
                    while self.toks.get(j).is_some_and(|t| {
                        t.ident().is_some_and(|n| self.ctx.is_type(n)) || t.is("*")
                    }) {
                        j += 1;
                    }
                    if j > self.pos && self.toks.get(j).is_some_and(|t| t.is(")")) {
                        self.pos = j + 1;
                        return self.unary();
                    }
                    let v = self.ternary()?;
                    self.eat(")").then_some(v)
                }
                _ => None,
            };
        }
        self.pos += 1;
        match t.kind {
            K::Num => number(&t.text),
            K::Char => char_value(&t.text),
            K::Ident if t.text == "sizeof" && self.eat("(") => {
                let start = self.pos;
                while self.peek().is_some_and(|t| !t.is(")")) {
                    self.pos += 1;
                }
                let size = self.ctx.size_of(&self.toks[start..self.pos])?;
                self.eat(")");
                i64::try_from(size).ok()
            }
            K::Ident => self.ctx.value(&t.text),
            _ => None,
        }
    }
}

fn is_type_word(w: &str) -> bool {
    matches!(
        w,
        "char" | "short" | "int" | "long" | "signed" | "unsigned" | "__signed__" | "_Bool"
    ) || w.ends_with("_t")
        && (w.starts_with("int")
            || w.starts_with("uint")
            || w.starts_with("__u")
            || w.starts_with("__s"))
        || matches!(
            w,
            "__u8" | "__u16" | "__u32" | "__u64" | "__s8" | "__s16" | "__s32" | "__s64"
        )
}

/// A C integer literal (`0x1fUL`, `017`, `0b101`, `42ll`).
fn number(text: &str) -> Option<i64> {
    let t = text.trim_end_matches(['u', 'U', 'l', 'L']);
    let (digits, radix) = if let Some(h) = t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
        (h, 16)
    } else if let Some(b) = t.strip_prefix("0b").or_else(|| t.strip_prefix("0B")) {
        (b, 2)
    } else if t.len() > 1 && t.starts_with('0') {
        (&t[1..], 8)
    } else {
        (t, 10)
    };
    u64::from_str_radix(digits, radix).ok().map(|v| v as i64)
}

/// A character literal's value (`'a'`, `'\n'`, `'\x41'`, `'\0'`).
fn char_value(text: &str) -> Option<i64> {
    let inner = text.strip_prefix('\'')?.strip_suffix('\'')?;
    let v = match inner.strip_prefix('\\') {
        None => {
            let mut cs = inner.chars();
            let c = cs.next()?;
            if cs.next().is_some() {
                return None;
            }
            c as i64
        }
        Some(esc) => match esc {
            "n" => 10,
            "t" => 9,
            "r" => 13,
            "0" => 0,
            "\\" => 92,
            "'" => 39,
            "\"" => 34,
            "a" => 7,
            "b" => 8,
            "f" => 12,
            "v" => 11,
            _ => match esc.strip_prefix('x') {
                Some(h) => i64::from_str_radix(h, 16).ok()?,
                None => i64::from_str_radix(esc, 8).ok()?,
            },
        },
    };
    Some(v)
}

// ---- declarations ----------------------------------------------------------------------

/// Words that qualify a declaration without changing its type.
fn is_qualifier(w: &str) -> bool {
    matches!(
        w,
        "const"
            | "volatile"
            | "restrict"
            | "__restrict"
            | "__restrict__"
            | "__const"
            | "__const__"
            | "__volatile"
            | "__volatile__"
            | "static"
            | "extern"
            | "inline"
            | "__inline"
            | "__inline__"
            | "register"
            | "auto"
            | "_Noreturn"
            | "__extension__"
            | "_Thread_local"
            | "__thread"
            | "__signed"
    )
}

/// Words followed by a parenthesized group that says nothing about the type.
fn is_attribute(w: &str) -> bool {
    matches!(
        w,
        "__attribute__"
            | "__attribute"
            | "__declspec"
            | "__asm__"
            | "__asm"
            | "asm"
            | "_Alignas"
            | "alignas"
            | "__typeof__"
    )
}

fn is_int_word(w: &str) -> bool {
    matches!(
        w,
        "void"
            | "char"
            | "short"
            | "int"
            | "long"
            | "signed"
            | "unsigned"
            | "__signed__"
            | "_Bool"
            | "float"
            | "double"
            | "__int128"
            | "_Complex"
            | "_Float128"
            | "__float128"
    )
}

/// C's type words to a type.
fn words_type(words: &[String]) -> TypeName {
    let has = |w: &str| words.iter().any(|x| x == w);
    for odd in [
        "float",
        "double",
        "__int128",
        "_Complex",
        "_Float128",
        "__float128",
    ] {
        if has(odd) {
            return TypeName::Named(words.join(" "));
        }
    }
    if has("void") {
        return TypeName::Void;
    }
    if has("_Bool") {
        return TypeName::Bool;
    }
    let unsigned = has("unsigned");
    let signed = has("signed") || has("__signed__");
    if has("char") {
        return if unsigned || signed {
            TypeName::Int {
                bits: 8,
                signed: !unsigned,
            }
        } else {
            TypeName::Char
        };
    }
    let bits = if has("short") {
        16
    } else if has("long") {
        64
    } else {
        32
    };
    TypeName::Int {
        bits,
        signed: !unsigned,
    }
}

/// A declarator: `*name[2][3]`, `(*fn)(int)`, `:3`.
struct Declarator {
    name: Option<String>,
    pointer: u32,
    /// Array lengths, outermost first; `None` for one it cannot evaluate.
    dims: Vec<Option<u64>>,
    /// The first is `[]` (a flexible array member).
    flexible: bool,
    /// A function (a prototype), not an object.
    function: bool,
    /// A pointer to a function.
    fn_pointer: bool,
}

struct DeclParser<'a> {
    toks: &'a [CTok],
    pos: usize,
    files: &'a [String],
    typedef_names: HashSet<String>,
    enumerators: HashMap<String, i64>,
    out: CDecls,
    anon: u32,
}

/// Declaration specifiers: the base type, and what makes a struct's layout unknown.
struct Spec {
    base: Option<TypeName>,
    typedef: bool,
    unsupported: Option<String>,
}

impl<'a> DeclParser<'a> {
    fn peek(&self, ahead: usize) -> Option<&'a CTok> {
        self.toks.get(self.pos + ahead)
    }
    fn at(&self, s: &str) -> bool {
        self.peek(0).is_some_and(|t| t.is(s))
    }
    fn eat(&mut self, s: &str) -> bool {
        let yes = self.at(s);
        if yes {
            self.pos += 1;
        }
        yes
    }
    fn origin(&self, t: &CTok) -> String {
        let file = self.files.get(t.file as usize).map_or("?", |s| s.as_str());
        format!("{file}:{}", t.line)
    }

    /// Skip a balanced `( ... )` / `[ ... ]` / `{ ... }` group starting here.
    fn skip_group(&mut self) {
        let mut level = 0usize;
        while let Some(t) = self.peek(0) {
            self.pos += 1;
            if t.is("(") || t.is("[") || t.is("{") {
                level += 1;
            } else if t.is(")") || t.is("]") || t.is("}") {
                level = level.saturating_sub(1);
                if level == 0 {
                    return;
                }
            }
            if level == 0 {
                return;
            }
        }
    }

    /// Skip `__attribute__((...))` and the like; the text of the attributes skipped.
    fn skip_attributes(&mut self) -> String {
        let mut text = String::new();
        while self.peek(0).and_then(CTok::ident).is_some_and(is_attribute) {
            self.pos += 1;
            let start = self.pos;
            if self.at("(") {
                self.skip_group();
            }
            for t in &self.toks[start..self.pos] {
                text.push_str(&t.text);
                text.push(' ');
            }
        }
        text
    }

    /// Skip the rest of a declaration: through its `;`, or a function's body.
    fn skip_declaration(&mut self) {
        while let Some(t) = self.peek(0) {
            if t.is(";") {
                self.pos += 1;
                return;
            }
            if t.is("{") {
                let body = self.pos > 0 && self.toks[self.pos - 1].is(")");
                self.skip_group();
                if body {
                    return;
                }
                continue;
            }
            if t.is("(") || t.is("[") {
                self.skip_group();
                continue;
            }
            if t.is("}") || t.is(")") || t.is("]") {
                // Unbalanced: step over it.
                self.pos += 1;
                continue;
            }
            self.pos += 1;
        }
    }

    fn top_level(&mut self) {
        if self.eat(";") {
            return;
        }
        let start = self.pos;
        let spec = self.specifiers();
        if spec.typedef && spec.base.is_some() {
            self.typedef(spec);
        } else {
            self.skip_declaration();
        }
        if self.pos == start {
            self.pos += 1;
        }
    }

    /// Declaration specifiers, recording the struct, union and enum definitions met.
    fn specifiers(&mut self) -> Spec {
        let mut spec = Spec {
            base: None,
            typedef: false,
            unsupported: None,
        };
        let mut words: Vec<String> = Vec::new();
        while let Some(w) = self.peek(0).and_then(CTok::ident).map(str::to_string) {
            if w == "typedef" {
                spec.typedef = true;
                self.pos += 1;
            } else if is_qualifier(&w) {
                self.pos += 1;
            } else if is_attribute(&w) {
                let text = self.skip_attributes();
                note_layout_attributes(&text, &mut spec.unsupported);
            } else if w == "_Atomic" {
                self.pos += 1;
                if self.at("(") {
                    self.skip_group();
                    spec.base = Some(TypeName::Named("_Atomic".into()));
                }
            } else if is_int_word(&w) && spec.base.is_none() {
                words.push(w);
                self.pos += 1;
            } else if (w == "struct" || w == "union") && spec.base.is_none() && words.is_empty() {
                spec.base = self.struct_spec(w == "union");
            } else if w == "enum" && spec.base.is_none() && words.is_empty() {
                spec.base = self.enum_spec();
            } else if spec.base.is_none()
                && words.is_empty()
                && (self.typedef_names.contains(&w)
                    || self
                        .peek(1)
                        .is_some_and(|n| n.kind == K::Ident || n.is("*")))
            {
                spec.base = Some(TypeName::Named(w));
                self.pos += 1;
            } else {
                break;
            }
        }
        if spec.base.is_none() && !words.is_empty() {
            spec.base = Some(words_type(&words));
        }
        spec
    }

    /// `struct [name] [{ members }]` (after which the caller reads declarators).
    fn struct_spec(&mut self, union: bool) -> Option<TypeName> {
        let kw = self.peek(0)?.clone();
        self.pos += 1;
        let mut unsupported = None;
        note_layout_attributes(&self.skip_attributes(), &mut unsupported);
        let name = match self.peek(0).and_then(CTok::ident) {
            Some(n) => {
                let n = n.to_string();
                self.pos += 1;
                Some(n)
            }
            None => None,
        };
        note_layout_attributes(&self.skip_attributes(), &mut unsupported);
        if !self.at("{") {
            return name.map(TypeName::Struct);
        }
        let name = name.unwrap_or_else(|| {
            self.anon += 1;
            format!("(anonymous {} at {})", self.anon, self.origin(&kw))
        });
        let mut def = StructDef {
            name: name.clone(),
            union,
            fields: Vec::new(),
            nested: Vec::new(),
            span: Span::default(),
        };
        self.members(&mut def, &mut unsupported);
        note_layout_attributes(&self.skip_attributes(), &mut unsupported);
        self.out.structs.push(HeaderStruct {
            def,
            origin: self.origin(&kw),
            unsupported,
        });
        Some(TypeName::Struct(name))
    }

    /// `{ members }` into `def`.
    fn members(&mut self, def: &mut StructDef, unsupported: &mut Option<String>) {
        self.pos += 1; // `{`
        loop {
            let Some(t) = self.peek(0).cloned() else {
                return;
            };
            if t.is("}") {
                self.pos += 1;
                return;
            }
            if t.is(";") {
                self.pos += 1;
                continue;
            }
            if t.is("_Static_assert") || t.is("static_assert") {
                self.skip_declaration();
                continue;
            }
            let start = self.pos;
            let spec = self.specifiers();
            if unsupported.is_none() {
                unsupported.clone_from(&spec.unsupported);
            }
            let Some(base) = spec.base else {
                unsupported
                    .get_or_insert(format!("weft cannot read its member at line {}", t.line));
                self.skip_member();
                if self.pos == start {
                    self.pos += 1;
                }
                continue;
            };
            // An anonymous struct or union member: its fields are the outer's.
            if self.at(";") {
                if matches!(&base, TypeName::Struct(n) if n.starts_with("(anonymous")) {
                    def.fields.push((
                        type_expr(base, 0, &[]),
                        String::new(),
                        Span::default(),
                        None,
                    ));
                }
                self.pos += 1;
                continue;
            }
            loop {
                let d = self.declarator();
                let width = if self.eat(":") {
                    let v = self.const_expr(&[",", ";"]);
                    if v.is_none() {
                        unsupported.get_or_insert(format!(
                            "weft cannot evaluate a bit-field width at line {}",
                            t.line
                        ));
                    }
                    v.map(|v| v as u64)
                } else {
                    None
                };
                note_layout_attributes(&self.skip_attributes(), unsupported);
                match d.name {
                    _ if d.function => {}
                    None if width.is_some() => {
                        unsupported
                            .get_or_insert("weft does not lay out unnamed bit-fields".into());
                    }
                    None => {}
                    // A flexible array member adds no bytes.
                    Some(_) if d.flexible => {}
                    Some(name) => {
                        if d.dims.iter().any(Option::is_none) {
                            unsupported.get_or_insert(format!(
                                "weft cannot evaluate the length of the array `{name}`"
                            ));
                        }
                        let dims: Vec<u64> = d.dims.iter().map(|d| d.unwrap_or(0)).collect();
                        let ty = if d.fn_pointer {
                            type_expr(TypeName::Void, 1, &[])
                        } else {
                            self.object_type(&base, d.pointer, &dims)
                        };
                        def.fields.push((ty, name, Span::default(), width));
                    }
                }
                if !self.eat(",") {
                    break;
                }
            }
            if !self.eat(";") {
                unsupported
                    .get_or_insert(format!("weft cannot read its member at line {}", t.line));
                self.skip_member();
            }
        }
    }

    /// Skip to the end of a member (its `;`, or the struct's `}`).
    fn skip_member(&mut self) {
        while let Some(t) = self.peek(0) {
            if t.is(";") {
                self.pos += 1;
                return;
            }
            if t.is("}") {
                return;
            }
            if t.is("(") || t.is("[") || t.is("{") {
                self.skip_group();
            } else {
                self.pos += 1;
            }
        }
    }

    fn declarator(&mut self) -> Declarator {
        let mut d = Declarator {
            name: None,
            pointer: 0,
            dims: Vec::new(),
            function: false,
            fn_pointer: false,
            flexible: false,
        };
        loop {
            if self.eat("*") {
                d.pointer += 1;
            } else if self.peek(0).and_then(CTok::ident).is_some_and(is_qualifier) {
                self.pos += 1;
            } else if self.peek(0).and_then(CTok::ident).is_some_and(is_attribute) {
                self.skip_attributes();
            } else {
                break;
            }
        }
        if self.at("(") {
            // `(*name)(params)`, `(*name[4])(params)`, or a parenthesized name.
            self.pos += 1;
            let inner = self.declarator();
            self.eat(")");
            d.name = inner.name;
            d.dims = inner.dims;
            d.flexible = inner.flexible;
            if self.at("(") {
                self.skip_group();
                d.fn_pointer = inner.pointer > 0;
                d.function = inner.pointer == 0;
            } else {
                d.pointer += inner.pointer;
            }
            return d;
        }
        if let Some(n) = self.peek(0).and_then(CTok::ident) {
            d.name = Some(n.to_string());
            self.pos += 1;
        }
        while self.eat("[") {
            if d.dims.is_empty() && self.at("]") {
                d.flexible = true;
            }
            d.dims
                .push(self.const_expr(&["]"]).and_then(|v| u64::try_from(v).ok()));
            self.eat("]");
        }
        if self.at("(") {
            self.skip_group();
            d.function = true;
        }
        self.skip_attributes();
        d
    }

    /// An integer constant expression up to one of `ends` at nesting level 0 (not
    /// consumed); None when empty or not evaluable.
    fn const_expr(&mut self, ends: &[&str]) -> Option<i64> {
        let start = self.pos;
        let mut level = 0usize;
        while let Some(t) = self.peek(0) {
            if level == 0 && (ends.iter().any(|e| t.is(e)) || t.is("}") || t.is(";")) {
                break;
            }
            if t.is("(") || t.is("[") {
                level += 1;
            } else if t.is(")") || t.is("]") {
                if level == 0 {
                    break;
                }
                level -= 1;
            }
            self.pos += 1;
        }
        let toks = &self.toks[start..self.pos];
        if toks.is_empty() {
            return None;
        }
        let known = Known {
            enumerators: &self.enumerators,
            decls: &self.out,
        };
        eval_all(toks, &known)
    }

    /// `enum [name] [{ A = 1, B }]`: an `int`.
    fn enum_spec(&mut self) -> Option<TypeName> {
        let kw = self.peek(0)?.clone();
        self.pos += 1;
        self.skip_attributes();
        let name = match self.peek(0).and_then(CTok::ident) {
            Some(n) => {
                let n = n.to_string();
                self.pos += 1;
                Some(n)
            }
            None => None,
        };
        self.skip_attributes();
        if self.eat(":") {
            // `enum x : type` (C23): the type is read past.
            while self.peek(0).is_some_and(|t| !t.is("{") && !t.is(";")) {
                self.pos += 1;
            }
        }
        if self.eat("{") {
            let mut variants = Vec::new();
            let mut next = Some(0i64);
            while let Some(t) = self.peek(0).cloned() {
                if t.is("}") {
                    self.pos += 1;
                    break;
                }
                let Some(vname) = t.ident().map(str::to_string) else {
                    self.pos += 1;
                    continue;
                };
                self.pos += 1;
                self.skip_attributes();
                let value = if self.eat("=") {
                    self.const_expr(&[","])
                } else {
                    next
                };
                if let Some(v) = value {
                    self.enumerators.insert(vname.clone(), v);
                    variants.push((vname, Some(v), Span::default()));
                }
                next = value.and_then(|v| v.checked_add(1));
                if !self.eat(",") && !self.at("}") {
                    // Something it does not understand: to the end of the enum.
                    while self.peek(0).is_some_and(|t| !t.is("}")) {
                        self.pos += 1;
                    }
                }
            }
            let _ = kw;
            self.out.enums.push(EnumDef {
                name,
                variants,
                span: Span::default(),
            });
        }
        Some(TypeName::Int {
            bits: 32,
            signed: true,
        })
    }

    /// The type of `base *...* name[a][b]`: an array of pointers is an array of a
    /// pointer type, named as C writes it (a [`TypeExpr`] puts pointers outside).
    fn object_type(&mut self, base: &TypeName, pointer: u32, dims: &[u64]) -> TypeExpr {
        if pointer == 0 || dims.is_empty() {
            return type_expr(base.clone(), pointer, dims);
        }
        let elem = type_expr(base.clone(), pointer, &[]);
        let name = elem.to_string();
        if !self.out.typedefs.iter().any(|(n, _)| *n == name) {
            self.out.typedefs.push((name.clone(), elem));
        }
        type_expr(TypeName::Named(name), 0, dims)
    }

    /// `typedef SPEC declarator, declarator;` (after the specifiers).
    fn typedef(&mut self, spec: Spec) {
        let Some(base) = spec.base else { return };
        loop {
            let d = self.declarator();
            if let (Some(name), false) = (d.name, d.function) {
                let mut ty = if d.fn_pointer {
                    type_expr(TypeName::Void, 1, &[])
                } else {
                    let dims: Vec<u64> = d.dims.iter().map(|d| d.unwrap_or(0)).collect();
                    self.object_type(&base, d.pointer, &dims)
                };
                // `typedef struct { ... } name;`: the struct takes the name.
                if let TypeName::Struct(anon) = &ty.base {
                    if anon.starts_with("(anonymous") && ty.pointer == 0 && ty.array.is_none() {
                        if let Some(s) = self.out.structs.iter_mut().find(|s| s.def.name == *anon) {
                            s.def.name = name.clone();
                            ty.base = TypeName::Struct(name.clone());
                        }
                    }
                }
                self.typedef_names.insert(name.clone());
                if TypeName::Named(name.clone()) != ty.base || ty.pointer > 0 {
                    self.out.typedefs.push((name, ty));
                }
            }
            if !self.eat(",") {
                break;
            }
        }
        self.skip_declaration();
    }
}

/// A struct's or member's attributes that change layouts weft computes.
fn note_layout_attributes(text: &str, unsupported: &mut Option<String>) {
    for word in ["packed", "aligned"] {
        if text.contains(word) && unsupported.is_none() {
            *unsupported = Some(format!(
                "weft does not lay out `__attribute__(({word}))` structs"
            ));
        }
    }
}

fn type_expr(base: TypeName, pointer: u32, dims: &[u64]) -> TypeExpr {
    TypeExpr {
        base,
        pointer,
        array: dims.first().map(|d| Some(*d)),
        dims: dims.get(1..).unwrap_or(&[]).to_vec(),
        span: Span::default(),
    }
}
