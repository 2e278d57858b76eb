//! The syntax tree. Every node carries a [`Span`]: the byte range of the source it
//! was parsed from, so every later diagnostic can point at the text.
//!
//! The checker fills in [`Expr::ty`] (and [`VarRef::id`]) in place; the same tree is
//! then "the checked AST" that lowering reads.

use weft_ir::Type;

/// A byte range `start..end` in the source text.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Span {
    pub start: u32,
    pub end: u32,
}

impl Span {
    pub fn new(start: usize, end: usize) -> Span {
        Span {
            start: start as u32,
            end: end as u32,
        }
    }
    /// The smallest span covering both.
    pub fn to(self, other: Span) -> Span {
        Span {
            start: self.start.min(other.start),
            end: self.end.max(other.end),
        }
    }
}

/// A whole script.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Program {
    pub items: Vec<Item>,
    /// The `#include` lines, in order (they come before the probes).
    pub includes: Vec<Include>,
    /// The script's `#define NAME INTEGER` lines: constants, as enumerators are.
    pub defines: Vec<(String, i64)>,
    /// What the included C headers (and `--include` files) define, read by
    /// [`crate::cheader`] before the checker runs.
    pub c_decls: crate::cheader::CDecls,
}

/// `#include <file.h>` or `#include "file.h"`.
#[derive(Clone, Debug, PartialEq)]
pub struct Include {
    pub name: String,
    /// `<...>`: not looked for beside the script.
    pub angled: bool,
    /// The whole line.
    pub span: Span,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Item {
    Probe(Probe),
    /// `config = { name = value; ... }`
    Config(ConfigBlock),
    /// `macro name(params) { body }`
    Macro(MacroDef),
    /// `fn name($a: type, ...): type { body }`: a function, inlined at each call by
    /// the expand stage (`crate::func`).
    Fn(FnDef),
    /// `let @name = hash(100);` (a map declaration in the preamble).
    MapDecl(MapDeclItem),
    /// `struct name { fields };` (a C type definition in the preamble).
    Struct(StructDef),
    /// `enum [name] { A = 1, B, ... };` (C enumerators usable as constants).
    Enum(EnumDef),
    /// Reserved for the aspect extensions: `seq { probes }` and `group name { probes }`.
    Reserved(ReservedBlock),
    /// `seq NAME[KEY] { step; step*; ...; step }`: a sequence aspect (Arachne's
    /// `seq`); the expand stage turns it into ordinary probes (`crate::seq`).
    Seq(SeqBlock),
    /// `pointcut NAME = ATTACH, ATTACH, ...;`: a named list of attach points, used
    /// by its name wherever attach points are (the expand stage replaces it:
    /// `crate::pointcut`).
    Pointcut(PointcutDef),
    /// `group NAME [= member, ...];`: a named set of processes (`crate::group`).
    Group(GroupDecl),
}

/// A named pointcut.
#[derive(Clone, Debug, PartialEq)]
pub struct PointcutDef {
    pub name: String,
    pub name_span: Span,
    pub attach: Vec<AttachSpec>,
    pub span: Span,
}

/// A group of processes (Arachne's placement): its members are the pids given on
/// the command line (`-p NAME=PID,...`), and those the declaration names:
/// `comm("nginx")`, `pid(123, 456)`, `command` (the `-c` process); forked children
/// of a member join it.
#[derive(Clone, Debug, PartialEq)]
pub struct GroupDecl {
    pub name: String,
    pub name_span: Span,
    pub members: Vec<Expr>,
    pub span: Span,
}

/// A sequence aspect: its steps are probes that fire in order, per key.
#[derive(Clone, Debug, PartialEq)]
pub struct SeqBlock {
    pub name: String,
    pub name_span: Span,
    /// Evaluated in each step: which instance the step belongs to.
    pub key: Expr,
    pub steps: Vec<SeqStep>,
    /// `timeout DURATION { advice }`: instances older than DURATION (ns) end, the
    /// advice running for each (in weft, `$key` holding its key).
    pub timeout: Option<(u64, Block, Span)>,
    pub span: Span,
}

#[derive(Clone, Debug, PartialEq)]
pub struct SeqStep {
    pub probe: Probe,
    /// `probe { ... }*`: the step may fire any number of times (zero too) before
    /// the next one.
    pub star: bool,
}

#[derive(Clone, Debug, PartialEq)]
pub struct ConfigBlock {
    pub entries: Vec<(String, ConfigValue, Span)>,
    pub span: Span,
}

#[derive(Clone, Debug, PartialEq)]
pub enum ConfigValue {
    Int(u64),
    Str(String),
    Ident(String),
}

#[derive(Clone, Debug, PartialEq)]
pub struct MacroDef {
    pub name: String,
    pub name_span: Span,
    pub params: Vec<MacroParam>,
    pub body: Block,
    pub span: Span,
}

/// A user-defined function (upstream's `fn`). Its parameters are passed by value.
#[derive(Clone, Debug, PartialEq)]
pub struct FnDef {
    pub name: String,
    pub name_span: Span,
    pub params: Vec<FnParam>,
    /// The declared result type (`void` when none is written).
    pub ret: TypeExpr,
    pub body: Block,
    pub span: Span,
}

impl FnDef {
    /// Whether the function returns nothing (`: void`).
    pub fn is_void(&self) -> bool {
        self.ret.base == TypeName::Void && self.ret.pointer == 0 && self.ret.array.is_none()
    }
}

/// `$name: type`
#[derive(Clone, Debug, PartialEq)]
pub struct FnParam {
    pub name: String,
    pub span: Span,
    pub ty: TypeExpr,
}

/// A macro parameter: `$a` (a scratch variable), `@b` (a map) or `c` (an expression).
#[derive(Clone, Debug, PartialEq)]
pub enum MacroParam {
    Var(String, Span),
    Map(String, Span),
    Expr(String, Span),
}

#[derive(Clone, Debug, PartialEq)]
pub struct MapDeclItem {
    pub name: String,
    pub kind: String,
    pub size: u64,
    pub span: Span,
}

#[derive(Clone, Debug, PartialEq)]
pub struct StructDef {
    pub name: String,
    /// `union X { ... }`: every member at offset 0.
    pub union: bool,
    /// Each member: type, name, name's span and bit-field width (`a:3`). An anonymous
    /// `struct { ... };` / `union { ... };` member has an empty name (its fields
    /// belong to this struct, at its offset).
    pub fields: Vec<(TypeExpr, String, Span, Option<u64>)>,
    /// The bodies of the members written `struct { ... }` / `union { ... }` inside
    /// this one, named `Outer::(anonymous N)`; defined before this struct.
    pub nested: Vec<StructDef>,
    pub span: Span,
}

#[derive(Clone, Debug, PartialEq)]
pub struct EnumDef {
    /// `None` for an anonymous `enum { ... }`.
    pub name: Option<String>,
    /// Each enumerator with its value as written (`None`: one more than the one
    /// before, 0 for the first).
    pub variants: Vec<(String, Option<i64>, Span)>,
    pub span: Span,
}

#[derive(Clone, Debug, PartialEq)]
pub struct ReservedBlock {
    /// `seq` or `group`.
    pub keyword: String,
    pub name: Option<String>,
    pub items: Vec<Item>,
    pub span: Span,
}

/// Aspect advice kinds (reserved syntax).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AdviceKind {
    Before,
    After,
    Around,
}

impl AdviceKind {
    pub fn keyword(self) -> &'static str {
        match self {
            AdviceKind::Before => "before",
            AdviceKind::After => "after",
            AdviceKind::Around => "around",
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Probe {
    pub advice: Option<(AdviceKind, Span)>,
    /// `@GROUP probe ...`: the probe fires only in the group's processes.
    pub group: Option<(String, Span)>,
    pub attach: Vec<AttachSpec>,
    pub predicate: Option<Expr>,
    pub body: Block,
    pub span: Span,
    /// Added by the front end to keep an aspect's state (`cflow`, a group's
    /// members): see [`weft_ir::Probe::hidden`].
    pub hidden: bool,
}

/// One attach point as written: `provider:field:field...`. The provider is already
/// mapped from its short alias (`u` → `uprobe`) and lowercased where bpftrace
/// ignores case (`BEGIN`/`begin`). Quotes around fields are removed.
#[derive(Clone, Debug, PartialEq)]
pub struct AttachSpec {
    pub provider: String,
    pub fields: Vec<String>,
    /// The text exactly as written.
    pub raw: String,
    pub span: Span,
    /// `call:BIN:FUNC within CALLER`: the callers' pattern as written, and its span.
    pub within: Option<(String, Span)>,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Block {
    pub stmts: Vec<Stmt>,
    /// A final expression without `;` makes the block a value (block expressions).
    pub value: Option<Box<Expr>>,
    pub span: Span,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Stmt {
    pub kind: StmtKind,
    pub span: Span,
}

/// The name a `*` map key is parsed as (an identifier no source can spell):
/// `delete(@m[10, *])` deletes every entry whose first key is 10
/// (`crate::wildcard`).
pub const WILDCARD_KEY: &str = "*";

/// The left side of an assignment.
#[derive(Clone, Debug, PartialEq)]
pub enum LValue {
    Var(VarRef),
    Map(MapRef),
}

#[derive(Clone, Debug, PartialEq)]
pub enum StmtKind {
    Expr(Expr),
    /// `lhs = value` or `lhs op= value` (`op` is the binary operator).
    Assign {
        target: LValue,
        op: Option<BinOp>,
        value: Expr,
    },
    /// `let $x [: type] [= value]`
    Let {
        var: VarRef,
        ty: Option<TypeExpr>,
        value: Option<Expr>,
    },
    If {
        cond: Expr,
        then: Block,
        otherwise: Option<Block>,
    },
    Unroll {
        count: Expr,
        body: Block,
    },
    While {
        cond: Expr,
        body: Block,
    },
    For {
        var: VarRef,
        iter: ForIter,
        body: Block,
    },
    Break,
    Continue,
    Return(Option<Expr>),
    /// A nested `{ ... }` block used as a statement.
    Block(Block),
}

#[derive(Clone, Debug, PartialEq)]
pub enum ForIter {
    Map(MapRef),
    Range(Box<Expr>, Box<Expr>),
}

/// A use of a scratch variable. `id` is filled by the checker: variables with the
/// same name in different scopes get different ids.
#[derive(Clone, Debug, PartialEq)]
pub struct VarRef {
    pub name: String,
    pub span: Span,
    pub id: Option<u32>,
}

/// A use of a map: `@name` or `@name[keys]`.
#[derive(Clone, Debug, PartialEq)]
pub struct MapRef {
    pub name: String,
    pub name_span: Span,
    /// `None` for `@m`, `Some(keys)` for `@m[k1, k2]`.
    pub keys: Option<Vec<Expr>>,
    pub span: Span,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Expr {
    pub kind: ExprKind,
    pub span: Span,
    /// Filled by the checker; `Void` before.
    pub ty: Type,
}

impl Expr {
    pub fn new(kind: ExprKind, span: Span) -> Expr {
        Expr {
            kind,
            span,
            ty: Type::Void,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BinOp {
    Add,
    Sub,
    Mul,
    Div,
    Mod,
    BitAnd,
    BitOr,
    BitXor,
    Shl,
    Shr,
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
    And,
    Or,
}

impl BinOp {
    pub fn text(self) -> &'static str {
        match self {
            BinOp::Add => "+",
            BinOp::Sub => "-",
            BinOp::Mul => "*",
            BinOp::Div => "/",
            BinOp::Mod => "%",
            BinOp::BitAnd => "&",
            BinOp::BitOr => "|",
            BinOp::BitXor => "^",
            BinOp::Shl => "<<",
            BinOp::Shr => ">>",
            BinOp::Eq => "==",
            BinOp::Ne => "!=",
            BinOp::Lt => "<",
            BinOp::Le => "<=",
            BinOp::Gt => ">",
            BinOp::Ge => ">=",
            BinOp::And => "&&",
            BinOp::Or => "||",
        }
    }
    pub fn is_comparison(self) -> bool {
        matches!(
            self,
            BinOp::Eq | BinOp::Ne | BinOp::Lt | BinOp::Le | BinOp::Gt | BinOp::Ge
        )
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum UnOp {
    /// `-x`
    Neg,
    /// `+x`
    Plus,
    /// `~x`
    BitNot,
    /// `!x`
    Not,
    /// `*p`
    Deref,
    /// `&x`
    AddrOf,
}

impl UnOp {
    pub fn text(self) -> &'static str {
        match self {
            UnOp::Neg => "-",
            UnOp::Plus => "+",
            UnOp::BitNot => "~",
            UnOp::Not => "!",
            UnOp::Deref => "*",
            UnOp::AddrOf => "&",
        }
    }
}

/// The target of `++` / `--`.
#[derive(Clone, Debug, PartialEq)]
pub enum IncTarget {
    Var(VarRef),
    Map(MapRef),
}

#[derive(Clone, Debug, PartialEq)]
pub enum ExprKind {
    /// An integer literal (already scaled by a duration suffix; `u64` bits).
    Int(u64),
    /// A string literal, escapes decoded.
    Str(Vec<u8>),
    Bool(bool),
    /// `$1`, `$2`, ...
    Positional(u32),
    /// `$#`
    PositionalCount,
    /// A bare identifier: a builtin (`pid`, `arg0`, `comm`), a zero-argument macro,
    /// or an unknown name.
    Ident(String),
    Var(VarRef),
    Map(MapRef),
    Call {
        name: String,
        name_span: Span,
        args: Vec<Expr>,
    },
    Unary {
        op: UnOp,
        expr: Box<Expr>,
    },
    Binary {
        op: BinOp,
        lhs: Box<Expr>,
        rhs: Box<Expr>,
    },
    /// `++x`, `x++`, `--x`, `x--`.
    IncDec {
        target: IncTarget,
        increment: bool,
        prefix: bool,
    },
    Ternary {
        cond: Box<Expr>,
        then: Box<Expr>,
        otherwise: Box<Expr>,
    },
    Cast {
        ty: TypeExpr,
        expr: Box<Expr>,
    },
    /// `e.field` (`arrow` for `e->field`).
    Field {
        expr: Box<Expr>,
        field: String,
        arrow: bool,
    },
    /// `t.0`
    TupleIndex {
        expr: Box<Expr>,
        index: u64,
    },
    /// `e[i]`
    Index {
        expr: Box<Expr>,
        index: Box<Expr>,
    },
    Tuple(Vec<Expr>),
    /// `(a = 1, b = "x")`
    Record(Vec<(String, Expr)>),
    /// `{ stmts; value }`
    Block(Box<Block>),
    /// `sizeof(type)` / `sizeof(expr)`
    Sizeof(SizeofArg),
    /// `offsetof(struct T, field)`, `offsetof(struct T, a.b.c)` (the path of
    /// fields, outermost first).
    Offsetof {
        ty: TypeExpr,
        field: Vec<String>,
    },
    /// `cflow(P1, ..., Pn)` / `cflow_strict(P1, ..., Pn)`: the thread is inside
    /// Pn's function, inside P(n-1)'s, ... (Arachne's `controlflow`). The expand
    /// stage replaces it with reads of per-thread state that probes it adds
    /// maintain (`crate::cflow`).
    Cflow(Cflow),
}

/// A control-flow pointcut as written.
#[derive(Clone, Debug, PartialEq)]
pub struct Cflow {
    /// `cflow_strict`: each function called directly by the one before.
    pub strict: bool,
    /// The functions, outermost first.
    pub elems: Vec<CflowElem>,
}

/// One element of a [`Cflow`]: an attach point, or a named pointcut (several).
#[derive(Clone, Debug, PartialEq)]
pub struct CflowElem {
    pub specs: Vec<AttachSpec>,
    /// As written (the pointcut's name for a named one).
    pub span: Span,
}

#[derive(Clone, Debug, PartialEq)]
pub enum SizeofArg {
    Type(TypeExpr),
    Expr(Box<Expr>),
}

/// A type as written in a cast, a `let` or a struct definition.
#[derive(Clone, Debug, PartialEq)]
pub struct TypeExpr {
    pub base: TypeName,
    /// Number of `*`.
    pub pointer: u32,
    /// `[N]` after the type (`Some(None)` for `[]`).
    pub array: Option<Option<u64>>,
    /// The dimensions after the first of a multi-dimensional array member
    /// (`int z[2][3]`: `array` is 2, `dims` is `[3]`).
    pub dims: Vec<u64>,
    pub span: Span,
}

#[derive(Clone, Debug, PartialEq)]
pub enum TypeName {
    Int {
        bits: u8,
        signed: bool,
    },
    Bool,
    Void,
    /// `string` or `string[N]`... (written `string`).
    Str,
    /// Plain `char`: an `int8`, but an array of them is a string (`char name[16]`
    /// is a `string[16]`, as in bpftrace; `signed char` and `int8_t` arrays are not).
    Char,
    /// `struct X`, `union X`.
    Struct(String),
    /// `enum X`: its values print as their enumerators' names.
    Enum(String),
    /// Any other identifier (a typedef from C).
    Named(String),
    /// `typeof(expr)`: the type of an expression, which is not evaluated (in casts
    /// and `let` declarations, as upstream allows it).
    Typeof(Box<Expr>),
}

impl std::fmt::Display for TypeExpr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.base {
            TypeName::Int { bits, signed } => {
                write!(f, "{}int{}", if *signed { "" } else { "u" }, bits)?
            }
            TypeName::Bool => write!(f, "bool")?,
            TypeName::Char => write!(f, "char")?,
            TypeName::Void => write!(f, "void")?,
            TypeName::Str => write!(f, "string")?,
            TypeName::Struct(n) => write!(f, "struct {n}")?,
            TypeName::Enum(n) => write!(f, "enum {n}")?,
            TypeName::Named(n) => write!(f, "{n}")?,
            TypeName::Typeof(_) => write!(f, "typeof(...)")?,
        }
        if let Some(a) = self.array {
            match a {
                Some(n) => write!(f, "[{n}]")?,
                None => write!(f, "[]")?,
            }
        }
        for n in &self.dims {
            write!(f, "[{n}]")?;
        }
        for _ in 0..self.pointer {
            write!(f, " *")?;
        }
        Ok(())
    }
}

/// A mutable walk over every expression, variable and map use in a tree. Override
/// the hooks; call the `walk_*` functions to recurse.
pub trait VisitMut {
    fn expr(&mut self, e: &mut Expr) {
        walk_expr(self, e);
    }
    fn var(&mut self, _v: &mut VarRef) {}
    fn map(&mut self, m: &mut MapRef) {
        walk_map(self, m);
    }
    fn block(&mut self, b: &mut Block) {
        walk_block(self, b);
    }
}

pub fn walk_map<V: VisitMut + ?Sized>(v: &mut V, m: &mut MapRef) {
    if let Some(keys) = &mut m.keys {
        for k in keys {
            v.expr(k);
        }
    }
}

pub fn walk_block<V: VisitMut + ?Sized>(v: &mut V, b: &mut Block) {
    for s in &mut b.stmts {
        walk_stmt(v, s);
    }
    if let Some(e) = &mut b.value {
        v.expr(e);
    }
}

pub fn walk_stmt<V: VisitMut + ?Sized>(v: &mut V, s: &mut Stmt) {
    match &mut s.kind {
        StmtKind::Expr(e) => v.expr(e),
        StmtKind::Assign { target, value, .. } => {
            match target {
                LValue::Var(x) => v.var(x),
                LValue::Map(m) => v.map(m),
            }
            v.expr(value);
        }
        StmtKind::Let { var, value, .. } => {
            v.var(var);
            if let Some(e) = value {
                v.expr(e);
            }
        }
        StmtKind::If {
            cond,
            then,
            otherwise,
        } => {
            v.expr(cond);
            v.block(then);
            if let Some(b) = otherwise {
                v.block(b);
            }
        }
        StmtKind::Unroll { count, body } => {
            v.expr(count);
            v.block(body);
        }
        StmtKind::While { cond, body } => {
            v.expr(cond);
            v.block(body);
        }
        StmtKind::For { var, iter, body } => {
            v.var(var);
            match iter {
                ForIter::Map(m) => v.map(m),
                ForIter::Range(a, b) => {
                    v.expr(a);
                    v.expr(b);
                }
            }
            v.block(body);
        }
        StmtKind::Return(Some(e)) => v.expr(e),
        StmtKind::Break | StmtKind::Continue | StmtKind::Return(None) => {}
        StmtKind::Block(b) => v.block(b),
    }
}

pub fn walk_expr<V: VisitMut + ?Sized>(v: &mut V, e: &mut Expr) {
    match &mut e.kind {
        ExprKind::Int(_)
        | ExprKind::Str(_)
        | ExprKind::Bool(_)
        | ExprKind::Positional(_)
        | ExprKind::PositionalCount
        | ExprKind::Ident(_)
        | ExprKind::Offsetof { .. }
        | ExprKind::Cflow(_) => {}
        ExprKind::Var(x) => v.var(x),
        ExprKind::Map(m) => v.map(m),
        ExprKind::Call { args, .. } => {
            for a in args {
                v.expr(a);
            }
        }
        ExprKind::Unary { expr, .. }
        | ExprKind::Cast { expr, .. }
        | ExprKind::Field { expr, .. }
        | ExprKind::TupleIndex { expr, .. } => v.expr(expr),
        ExprKind::Binary { lhs, rhs, .. } => {
            v.expr(lhs);
            v.expr(rhs);
        }
        ExprKind::IncDec { target, .. } => match target {
            IncTarget::Var(x) => v.var(x),
            IncTarget::Map(m) => v.map(m),
        },
        ExprKind::Ternary {
            cond,
            then,
            otherwise,
        } => {
            v.expr(cond);
            v.expr(then);
            v.expr(otherwise);
        }
        ExprKind::Index { expr, index } => {
            v.expr(expr);
            v.expr(index);
        }
        ExprKind::Tuple(es) => {
            for x in es {
                v.expr(x);
            }
        }
        ExprKind::Record(fs) => {
            for (_, x) in fs {
                v.expr(x);
            }
        }
        ExprKind::Block(b) => v.block(b),
        ExprKind::Sizeof(SizeofArg::Expr(x)) => v.expr(x),
        ExprKind::Sizeof(SizeofArg::Type(_)) => {}
    }
}
