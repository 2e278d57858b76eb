//! SystemTap syntax tree → weft's (bpftrace's) syntax tree, before the checker.
//! Every node keeps the span of the `.stp` text it came from, so the checker's and
//! lowering's diagnostics point into the script too.
//!
//! What has no bpftrace counterpart is rewritten here: globals become maps (`@g`,
//! `@g[k, ...]`); a global only ever added to becomes a `sum()` (exact across
//! threads and CPUs); statistics (`<<<`) become hidden `count`/`sum`/`min`/`max`/
//! `hist`/`lhist` maps; sorted `foreach` becomes a selection over the map (each
//! round scans it for the next entry in order, ties broken by scan position);
//! functions are inlined; `@entry(e)` is a thread-keyed map written by a hidden
//! entry probe; `syscall.*` and `process.mark("*")` are expanded to one probe per
//! system call or SDT note so `name`/`$$name` are constants.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use super::syntax::{self as s, ExprKind as SK, Lit, StmtKind as SS};
use super::StapOptions;
use crate::ast::{
    self, AttachSpec, BinOp, Block, Expr, ExprKind, ForIter, IncTarget, Item, LValue, MapRef, Span,
    Stmt, StmtKind, UnOp, VarRef,
};
use crate::diag::Diagnostic;
use crate::Options;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ty {
    Int,
    Str,
}

#[derive(Clone, Debug, Default)]
struct GlobalInfo {
    /// Indexed somewhere: an associative array (number of keys).
    keys: Option<usize>,
    /// Target of `<<<`: statistics.
    stat: bool,
    /// `@op(g)` extractors used on it.
    ops: BTreeSet<String>,
    /// `@hist_linear(g, lo, hi, step)` parameters.
    linear: Option<(i64, i64, i64)>,
    /// Read anywhere (else SystemTap prints it at the end).
    read: bool,
    /// Written other than by `+=`/`++`/`-=`/`--`/`delete`: not a counter.
    plain_write: bool,
    /// Written by `+=` and friends.
    added: bool,
    ty: Option<Ty>,
    key_tys: Vec<Option<Ty>>,
    span: Span,
}

/// What a probe point became.
#[derive(Clone, Debug)]
enum Ctx {
    Begin,
    End,
    Timer,
    Function {
        target: String,
        func: String,
        ret: bool,
    },
    Mark {
        provider: String,
        name: String,
    },
    Syscall {
        name: String,
        ret: bool,
    },
    CpuOn,
    CpuOff,
    ProcessBegin,
    ProcessEnd,
}

struct Gen<'a> {
    opts: &'a Options,
    sopts: &'a StapOptions,
    script: &'a s::Script,
    globals: BTreeMap<String, GlobalInfo>,
    functions: HashMap<String, &'a s::Function>,
    diags: Vec<Diagnostic>,
    tmp: u32,
    /// Hidden probes to put first (entry probes of `@entry`, the tgid table).
    hidden: Vec<ast::Probe>,
    // Per probe:
    ctx: Ctx,
    locals: HashMap<String, Ty>,
    /// Inlined functions being translated: (name, prefix, done var, ret var).
    inline: Vec<(String, String, String, String)>,
    entry_n: u32,
    need_tgid: bool,
    in_sorted_foreach: u32,
    /// Loops open in the function being inlined.
    loops: u32,
}

pub fn translate(
    script: &s::Script,
    opts: &Options,
    sopts: &StapOptions,
) -> (ast::Program, Vec<Diagnostic>, Vec<usize>) {
    let mut g = Gen {
        opts,
        sopts,
        script,
        globals: BTreeMap::new(),
        functions: HashMap::new(),
        diags: Vec::new(),
        tmp: 0,
        hidden: Vec::new(),
        ctx: Ctx::Begin,
        locals: HashMap::new(),
        inline: Vec::new(),
        entry_n: 0,
        need_tgid: false,
        in_sorted_foreach: 0,
        loops: 0,
    };
    for f in &script.functions {
        if g.functions.insert(f.name.clone(), f).is_some() {
            g.diags.push(Diagnostic::error(
                f.span,
                format!("function '{}' is defined twice", f.name),
            ));
        }
    }
    for gl in &script.globals {
        g.globals.insert(
            gl.name.clone(),
            GlobalInfo {
                span: gl.span,
                ..Default::default()
            },
        );
    }
    g.scan();
    let mut probes = Vec::new();
    // Global initializers: a BEGIN probe first.
    let inits: Vec<&s::Global> = script.globals.iter().filter(|x| x.init.is_some()).collect();
    if !inits.is_empty() {
        g.ctx = Ctx::Begin;
        g.locals.clear();
        let mut stmts = Vec::new();
        for gl in inits {
            let init = gl.init.as_ref().unwrap();
            let v = g.expr(init);
            let m = g.map_ref(&gl.name, gl.span, None);
            stmts.push(stmt(
                StmtKind::Assign {
                    target: LValue::Map(m),
                    op: None,
                    value: v,
                },
                gl.span,
            ));
        }
        probes.push(probe(
            vec![spec("BEGIN", &[], "BEGIN", Span::default())],
            stmts,
            Span::default(),
            false,
        ));
    }
    let mut system = Vec::new();
    for p in &script.probes {
        for pp in &p.points {
            for (attach, ctx) in g.probe_point(pp) {
                g.ctx = ctx.clone();
                g.locals = g.infer_locals(&p.body);
                let body = g.stmts_of(&p.body);
                if matches!(ctx, Ctx::CpuOn) {
                    system.push(probes.len());
                }
                probes.push(probe(vec![attach], body, p.span, false));
            }
        }
    }
    if let Some(end) = g.autoprint() {
        probes.push(end);
    }
    if g.need_tgid {
        g.hidden.push(probe(
            vec![spec(
                "tracepoint",
                &["sched", "sched_switch"],
                "scheduler.cpu_off",
                Span::default(),
            )],
            vec![stmt(
                StmtKind::Assign {
                    target: LValue::Map(MapRef {
                        name: "@__stap_tgid".into(),
                        name_span: Span::default(),
                        keys: Some(vec![ident("tid", Span::default())]),
                        span: Span::default(),
                    }),
                    op: None,
                    value: ident("pid", Span::default()),
                },
                Span::default(),
            )],
            Span::default(),
            false,
        ));
    }
    let nh = g.hidden.len();
    let mut items: Vec<Item> = g.hidden.drain(..).map(Item::Probe).collect();
    items.extend(probes.into_iter().map(Item::Probe));
    let system = system.into_iter().map(|i| i + nh).collect();
    let prog = ast::Program {
        items,
        ..Default::default()
    };
    (prog, g.diags, system)
}

// ---------------------------------------------------------------------------
// Small builders

fn e(kind: ExprKind, span: Span) -> Expr {
    Expr::new(kind, span)
}
fn int(v: i64, span: Span) -> Expr {
    e(ExprKind::Int(v as u64), span)
}
fn string(v: &str, span: Span) -> Expr {
    e(ExprKind::Str(v.as_bytes().to_vec()), span)
}
fn string_lit(v: &str, span: Span) -> Expr {
    string(v, span)
}
fn ident(n: &str, span: Span) -> Expr {
    e(ExprKind::Ident(n.to_string()), span)
}
fn var(n: &str, span: Span) -> VarRef {
    VarRef {
        name: n.to_string(),
        span,
        id: None,
    }
}
fn var_e(n: &str, span: Span) -> Expr {
    e(ExprKind::Var(var(n, span)), span)
}
fn call(n: &str, args: Vec<Expr>, span: Span) -> Expr {
    e(
        ExprKind::Call {
            name: n.to_string(),
            name_span: span,
            args,
        },
        span,
    )
}
fn bin(op: BinOp, a: Expr, b: Expr, span: Span) -> Expr {
    e(
        ExprKind::Binary {
            op,
            lhs: Box::new(a),
            rhs: Box::new(b),
        },
        span,
    )
}
fn not(a: Expr, span: Span) -> Expr {
    e(
        ExprKind::Unary {
            op: UnOp::Not,
            expr: Box::new(a),
        },
        span,
    )
}
fn tidx(a: Expr, i: u64, span: Span) -> Expr {
    e(
        ExprKind::TupleIndex {
            expr: Box::new(a),
            index: i,
        },
        span,
    )
}
fn stmt(kind: StmtKind, span: Span) -> Stmt {
    Stmt { kind, span }
}
fn assign(n: &str, v: Expr, span: Span) -> Stmt {
    stmt(
        StmtKind::Assign {
            target: LValue::Var(var(n, span)),
            op: None,
            value: v,
        },
        span,
    )
}
fn block(stmts: Vec<Stmt>, span: Span) -> Block {
    Block {
        stmts,
        value: None,
        span,
    }
}
fn if_(c: Expr, then: Vec<Stmt>, otherwise: Option<Vec<Stmt>>, span: Span) -> Stmt {
    stmt(
        StmtKind::If {
            cond: c,
            then: block(then, span),
            otherwise: otherwise.map(|o| block(o, span)),
        },
        span,
    )
}
fn spec(provider: &str, fields: &[&str], raw: &str, span: Span) -> AttachSpec {
    AttachSpec {
        provider: provider.to_string(),
        fields: fields.iter().map(|f| f.to_string()).collect(),
        raw: raw.to_string(),
        span,
        within: None,
    }
}
fn probe(attach: Vec<AttachSpec>, stmts: Vec<Stmt>, span: Span, hidden: bool) -> ast::Probe {
    ast::Probe {
        advice: None,
        group: None,
        attach,
        predicate: None,
        body: block(stmts, span),
        span,
        hidden,
    }
}

/// `*`, `?` and `[...]` glob match.
pub fn glob(pat: &str, s: &str) -> bool {
    fn go(p: &[u8], s: &[u8]) -> bool {
        match p.first() {
            None => s.is_empty(),
            Some(b'*') => (0..=s.len()).any(|i| go(&p[1..], &s[i..])),
            Some(b'?') => !s.is_empty() && go(&p[1..], &s[1..]),
            Some(&c) => s.first() == Some(&c) && go(&p[1..], &s[1..]),
        }
    }
    go(pat.as_bytes(), s.as_bytes())
}

// ---------------------------------------------------------------------------
// The pre-pass: what each global is.

impl Gen<'_> {
    fn scan(&mut self) {
        let script = self.script;
        for p in &script.probes {
            self.scan_stmt(&p.body);
        }
        for f in &script.functions {
            self.scan_stmt(&f.body);
        }
        for gl in &script.globals {
            if let Some(i) = &gl.init {
                let t = self.ty_static(i);
                if let Some(g) = self.globals.get_mut(&gl.name) {
                    g.plain_write = true;
                    g.ty = Some(t);
                }
            }
        }
        // Types of globals from what is stored into them (two rounds: a global
        // assigned from another).
        for _ in 0..2 {
            for p in &script.probes {
                // `name` in a syscall probe is a string.
                let first = p.points.first().and_then(|pp| pp.comps.first());
                self.ctx = match first.map(|c| c.name.as_str()) {
                    Some("syscall" | "nd_syscall") => Ctx::Syscall {
                        name: String::new(),
                        ret: false,
                    },
                    _ => Ctx::Begin,
                };
                self.scan_types(&p.body);
            }
            self.ctx = Ctx::Begin;
            for f in &script.functions {
                self.scan_types(&f.body);
            }
        }
    }

    fn scan_stmt(&mut self, st: &s::Stmt) {
        match &st.kind {
            SS::Block(v) => v.iter().for_each(|x| self.scan_stmt(x)),
            SS::Expr(x) | SS::Delete(x) => {
                if let SS::Delete(_) = &st.kind {
                    // delete is neither a read nor a plain write
                    if let SK::Index(_, _, ks) = &x.kind {
                        ks.iter().for_each(|k| self.scan_expr(k));
                    }
                    return;
                }
                self.scan_expr(x)
            }
            SS::If(c, t, o) => {
                self.scan_expr(c);
                self.scan_stmt(t);
                if let Some(o) = o {
                    self.scan_stmt(o);
                }
            }
            SS::While(c, b) => {
                self.scan_expr(c);
                self.scan_stmt(b);
            }
            SS::For(a, b, c, d) => {
                for x in [a, b, c].into_iter().flatten() {
                    self.scan_expr(x);
                }
                self.scan_stmt(d);
            }
            SS::Foreach(f) => {
                if let Some(g) = self.globals.get_mut(&f.array) {
                    g.read = true;
                    if g.keys.is_none() {
                        g.keys = Some(f.keys.len());
                    }
                }
                if let Some(l) = &f.limit {
                    self.scan_expr(l);
                }
                self.scan_stmt(&f.body);
            }
            SS::Return(Some(x)) => self.scan_expr(x),
            _ => {}
        }
    }

    fn scan_expr(&mut self, x: &s::Expr) {
        match &x.kind {
            SK::Assign(op, l, r) => {
                self.scan_expr(r);
                let (name, keys) = match &l.kind {
                    SK::Ident(n) => (n, None),
                    SK::Index(n, _, ks) => (n, Some(ks)),
                    _ => {
                        self.scan_expr(l);
                        return;
                    }
                };
                if let Some(ks) = keys {
                    ks.iter().for_each(|k| self.scan_expr(k));
                }
                if let Some(g) = self.globals.get_mut(name) {
                    if let Some(ks) = keys {
                        g.keys = Some(ks.len());
                    }
                    match *op {
                        "<<<" => g.stat = true,
                        "+=" | "-=" => g.added = true,
                        "=" => g.plain_write = true,
                        _ => {
                            g.plain_write = true;
                            g.read = true;
                        }
                    }
                }
            }
            SK::IncDec(_, prefix, t) => {
                let (name, keys) = match &t.kind {
                    SK::Ident(n) => (n, None),
                    SK::Index(n, _, ks) => (n, Some(ks)),
                    _ => return,
                };
                if let Some(ks) = keys {
                    ks.iter().for_each(|k| self.scan_expr(k));
                }
                if let Some(g) = self.globals.get_mut(name) {
                    if let Some(ks) = keys {
                        g.keys = Some(ks.len());
                    }
                    g.added = true;
                    // `x++` used as a value reads it; the statement form is
                    // handled as `+= 1` (marked by the caller never reading).
                    let _ = prefix;
                }
            }
            SK::Index(n, _, ks) => {
                ks.iter().for_each(|k| self.scan_expr(k));
                if let Some(g) = self.globals.get_mut(n) {
                    g.keys = Some(ks.len());
                    g.read = true;
                }
            }
            SK::Ident(n) => {
                if let Some(g) = self.globals.get_mut(n) {
                    g.read = true;
                }
            }
            SK::In(ks, n, _) => {
                ks.iter().for_each(|k| self.scan_expr(k));
                if let Some(g) = self.globals.get_mut(n) {
                    g.keys = Some(ks.len());
                    g.read = true;
                }
            }
            SK::At(op, args) => {
                let name = match args.first().map(|a| &a.kind) {
                    Some(SK::Ident(n)) | Some(SK::Index(n, _, _)) => Some(n.clone()),
                    _ => None,
                };
                if let Some(SK::Index(_, _, ks)) = args.first().map(|a| &a.kind) {
                    ks.iter().for_each(|k| self.scan_expr(k));
                }
                match name.and_then(|n| self.globals.get_mut(&n)) {
                    Some(g) if op != "entry" && op != "defined" => {
                        g.read = true;
                        g.ops.insert(op.clone());
                        if op == "hist_linear" && args.len() == 4 {
                            let lit = |a: &s::Expr| match a.kind {
                                SK::Num(n) => Some(n),
                                _ => None,
                            };
                            if let (Some(a), Some(b), Some(c)) =
                                (lit(&args[1]), lit(&args[2]), lit(&args[3]))
                            {
                                g.linear = Some((a, b, c));
                            }
                        }
                    }
                    _ => args.iter().for_each(|a| self.scan_expr(a)),
                }
            }
            SK::Call(_, _, a) => a.iter().for_each(|x| self.scan_expr(x)),
            SK::Unary(_, a) => self.scan_expr(a),
            SK::Binary(_, a, b) => {
                self.scan_expr(a);
                self.scan_expr(b);
            }
            SK::Ternary(a, b, c) => {
                self.scan_expr(a);
                self.scan_expr(b);
                self.scan_expr(c);
            }
            _ => {}
        }
    }

    fn scan_types(&mut self, st: &s::Stmt) {
        let mut todo = vec![st];
        while let Some(st) = todo.pop() {
            match &st.kind {
                SS::Block(v) => todo.extend(v.iter()),
                SS::If(_, t, o) => {
                    todo.push(t);
                    if let Some(o) = o {
                        todo.push(o);
                    }
                }
                SS::While(_, b) | SS::For(_, _, _, b) => todo.push(b),
                SS::Foreach(f) => todo.push(&f.body),
                SS::Expr(x) => {
                    if let SK::Assign("=", l, r) = &x.kind {
                        let t = self.ty_static(r);
                        let (name, keys) = match &l.kind {
                            SK::Ident(n) => (n, None),
                            SK::Index(n, _, ks) => (n, Some(ks)),
                            _ => continue,
                        };
                        let kts: Option<Vec<Ty>> =
                            keys.map(|ks| ks.iter().map(|k| self.ty_static(k)).collect());
                        if let Some(g) = self.globals.get_mut(name) {
                            if g.ty.is_none() || t == Ty::Str {
                                g.ty = Some(t);
                            }
                            if let Some(kts) = kts {
                                g.key_tys = kts.into_iter().map(Some).collect();
                            }
                        }
                    } else if let SK::Assign(_, l, _) | SK::IncDec(_, _, l) = &x.kind {
                        if let SK::Index(n, _, ks) = &l.kind {
                            let kts: Vec<Option<Ty>> =
                                ks.iter().map(|k| Some(self.ty_static(k))).collect();
                            if let Some(g) = self.globals.get_mut(n) {
                                if g.key_tys.is_empty() {
                                    g.key_tys = kts;
                                }
                            }
                        }
                    }
                }
                _ => {}
            }
        }
    }

    /// The type of an expression as far as it can be told without the checker
    /// (for print's and println's formats, and the end-of-run print).
    fn ty_static(&self, x: &s::Expr) -> Ty {
        match &x.kind {
            SK::Str(_) | SK::Special(_) => Ty::Str,
            SK::Binary(".", _, _) => Ty::Str,
            SK::Call(n, _, _) => match n.as_str() {
                "execname" | "user_string" | "user_string_n" | "sprintf" | "pp" | "ppfunc"
                | "probefunc" | "usymname" | "usymdata" | "kernel_string" | "pexecname" => Ty::Str,
                f => match self.functions.get(f) {
                    Some(func) if self.returns_str(&func.body) => Ty::Str,
                    _ => Ty::Int,
                },
            },
            SK::Ident(n) => {
                if let Some(t) = self.locals.get(n) {
                    *t
                } else if let Some(g) = self.globals.get(n) {
                    g.ty.unwrap_or(Ty::Int)
                } else if n == "name" && matches!(self.ctx, Ctx::Syscall { .. }) {
                    Ty::Str
                } else {
                    Ty::Int
                }
            }
            SK::Index(n, _, _) => self.globals.get(n).and_then(|g| g.ty).unwrap_or(Ty::Int),
            SK::Ternary(_, a, _) => self.ty_static(a),
            SK::Assign(_, _, r) => self.ty_static(r),
            SK::At(op, a) if op == "entry" => a.first().map_or(Ty::Int, |x| self.ty_static(x)),
            SK::At(op, _) if op.bytes().all(|b| b.is_ascii_digit()) => Ty::Str,
            _ => Ty::Int,
        }
    }

    fn returns_str(&self, st: &s::Stmt) -> bool {
        match &st.kind {
            SS::Return(Some(x)) => {
                matches!(x.kind, SK::Str(_))
                    || matches!(&x.kind, SK::Call(n, _, _) if matches!(n.as_str(), "execname" | "user_string" | "user_string_n" | "sprintf"))
            }
            SS::Block(v) => v.iter().any(|x| self.returns_str(x)),
            SS::If(_, t, o) => {
                self.returns_str(t) || o.as_ref().is_some_and(|o| self.returns_str(o))
            }
            SS::While(_, b) | SS::For(_, _, _, b) => self.returns_str(b),
            _ => false,
        }
    }

    /// Locals of a probe body and their types, from assignments in order.
    fn infer_locals(&mut self, body: &s::Stmt) -> HashMap<String, Ty> {
        let saved = std::mem::take(&mut self.locals);
        for _ in 0..2 {
            let mut todo = vec![body];
            while let Some(st) = todo.pop() {
                match &st.kind {
                    SS::Block(v) => todo.extend(v.iter().rev()),
                    SS::If(_, t, o) => {
                        todo.push(t);
                        if let Some(o) = o {
                            todo.push(o);
                        }
                    }
                    SS::While(_, b) => todo.push(b),
                    SS::For(init, _, _, b) => {
                        if let Some(x) = init {
                            self.note_local(x);
                        }
                        todo.push(b);
                    }
                    SS::Foreach(f) => {
                        let g = self.globals.get(&f.array).cloned().unwrap_or_default();
                        for (i, (k, _)) in f.keys.iter().enumerate() {
                            let t = g.key_tys.get(i).copied().flatten().unwrap_or(Ty::Int);
                            self.locals.insert(k.clone(), t);
                        }
                        if let Some((v, _)) = &f.value {
                            self.locals.insert(v.clone(), g.ty.unwrap_or(Ty::Int));
                        }
                        todo.push(&f.body);
                    }
                    SS::Expr(x) => self.note_local(x),
                    _ => {}
                }
            }
        }
        std::mem::replace(&mut self.locals, saved)
    }

    fn note_local(&mut self, x: &s::Expr) {
        if let SK::Assign(_, l, r) = &x.kind {
            if let SK::Ident(n) = &l.kind {
                if !self.globals.contains_key(n) {
                    let t = self.ty_static(r);
                    self.locals.insert(n.clone(), t);
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------
// Probe points

impl Gen<'_> {
    fn err(&mut self, span: Span, m: impl Into<String>) {
        self.diags.push(Diagnostic::error(span, m));
    }

    fn target_binary(&mut self, span: Span, what: &str) -> Option<String> {
        match &self.sopts.target_binary {
            Some(b) => Some(b.clone()),
            None => {
                self.err(
                    span,
                    format!("{what} without a path needs the target's program: give -c CMD or -x PID, or write process(\"PATH\")"),
                );
                None
            }
        }
    }

    fn probe_point(&mut self, pp: &s::ProbePoint) -> Vec<(AttachSpec, Ctx)> {
        let c = &pp.comps;
        let name = |i: usize| c.get(i).map(|x| x.name.as_str());
        let text = pp.text();
        let sp = pp.span;
        let str_arg = |i: usize| match c.get(i).and_then(|x| x.arg.as_ref()) {
            Some(Lit::Str(s)) => Some(s.clone()),
            _ => None,
        };
        let num_arg = |i: usize| match c.get(i).and_then(|x| x.arg.as_ref()) {
            Some(Lit::Num(n)) => Some(*n),
            _ => None,
        };
        let one = |a: AttachSpec, ctx: Ctx| vec![(a, ctx)];
        match name(0).unwrap_or("") {
            "begin" if c.len() == 1 => one(spec("BEGIN", &[], &text, sp), Ctx::Begin),
            "end" if c.len() == 1 => one(spec("END", &[], &text, sp), Ctx::End),
            "error" if c.len() == 1 => {
                self.err(sp, "probe point 'error' is not supported by weft stap");
                vec![]
            }
            "never" => vec![],
            "timer" => {
                let unit = name(1).unwrap_or("");
                let n = num_arg(1);
                let iv = |u: &str, n: i64| {
                    let n = n.to_string();
                    spec("interval", &[u, &n], &text, sp)
                };
                match (unit, n) {
                    ("s" | "sec", Some(n)) if n > 0 && c.len() == 2 => one(iv("s", n), Ctx::Timer),
                    ("ms" | "msec", Some(n)) if n > 0 && c.len() == 2 => {
                        one(iv("ms", n), Ctx::Timer)
                    }
                    ("us" | "usec", Some(n)) if n > 0 && c.len() == 2 => {
                        one(iv("us", n), Ctx::Timer)
                    }
                    ("ns" | "nsec", Some(n)) if n > 0 && c.len() == 2 => {
                        one(iv("ns", n), Ctx::Timer)
                    }
                    ("hz", Some(n)) if n > 0 && c.len() == 2 => one(iv("hz", n), Ctx::Timer),
                    ("profile", None) if c.len() == 2 => {
                        one(spec("profile", &["hz", "100"], &text, sp), Ctx::Timer)
                    }
                    _ => {
                        self.err(sp, format!("probe point '{text}' not recognised: weft stap has timer.s(N), timer.ms(N), timer.us(N), timer.ns(N), timer.hz(N) and timer.profile"));
                        vec![]
                    }
                }
            }
            "process" => self.process_point(pp, &text),
            "syscall" | "nd_syscall" => {
                let pat = name(1).unwrap_or("*").to_string();
                let ret = name(2) == Some("return");
                if c.len() < 2 || c.len() > 3 || (c.len() == 3 && !ret) || c[1].arg.is_some() {
                    self.err(sp, format!("probe point '{text}' not recognised: weft stap has syscall.NAME, syscall.* and their .return"));
                    return vec![];
                }
                let names: Vec<String> = if pat.contains(['*', '?', '[']) {
                    let Some(ev) = self.opts.events.clone() else {
                        self.err(sp, "syscall.* needs the kernel's tracepoints, which are not available here");
                        return vec![];
                    };
                    let dir = if ret { "sys_exit_" } else { "sys_enter_" };
                    match ev.tracepoints("syscalls", &format!("{dir}{pat}")) {
                        Ok(v) => v
                            .into_iter()
                            .filter_map(|(_, n)| n.strip_prefix(dir).map(str::to_string))
                            .collect(),
                        Err(why) => {
                            self.err(sp, format!("probe point '{text}': {why}"));
                            return vec![];
                        }
                    }
                } else {
                    vec![pat]
                };
                if names.is_empty() && !pp.optional {
                    self.err(sp, format!("probe point '{text}' matched no system call"));
                }
                names
                    .into_iter()
                    .map(|n| {
                        let tp = format!("{}{n}", if ret { "sys_exit_" } else { "sys_enter_" });
                        (
                            spec("tracepoint", &["syscalls", &tp], &text, sp),
                            Ctx::Syscall { name: n, ret },
                        )
                    })
                    .collect()
            }
            "scheduler" if c.len() == 2 => match name(1) {
                Some("cpu_on") => {
                    self.need_tgid = true;
                    one(
                        spec("tracepoint", &["sched", "sched_switch"], &text, sp),
                        Ctx::CpuOn,
                    )
                }
                Some("cpu_off") => one(
                    spec("tracepoint", &["sched", "sched_switch"], &text, sp),
                    Ctx::CpuOff,
                ),
                _ => {
                    self.err(sp, format!("probe point '{text}' not recognised: weft stap has scheduler.cpu_on and scheduler.cpu_off"));
                    vec![]
                }
            },
            "kernel" | "module" | "kprobe" | "netfilter" | "perf" | "procfs" | "tty" | "vfs"
            | "ioblock" | "socket" | "tcp" | "udp" | "signal" | "nfs" | "irq_handler"
            | "softirq" | "workqueue" | "kprocess" | "hrtimer" => {
                let _ = str_arg;
                self.err(
                    sp,
                    format!(
                        "probe point '{text}' is a kernel probe point: weft stap runs in user space \
                         (it has process(...), syscall.* and scheduler.cpu_on/off from the kernel's tracepoints)"
                    ),
                );
                vec![]
            }
            _ => {
                self.err(sp, format!("probe point '{text}' not recognised"));
                vec![]
            }
        }
    }

    fn process_point(&mut self, pp: &s::ProbePoint, text: &str) -> Vec<(AttachSpec, Ctx)> {
        let c = &pp.comps;
        let sp = pp.span;
        let path = match &c[0].arg {
            Some(Lit::Str(p)) => p.clone(),
            Some(Lit::Num(_)) => {
                self.err(c[0].span, "process(PID) is not supported: give -x PID and use process(\"PATH\") or process");
                return vec![];
            }
            None => match self.target_binary(c[0].span, "process") {
                Some(b) => b,
                None => return vec![],
            },
        };
        let what = c.get(1).map(|x| x.name.as_str()).unwrap_or("");
        let arg = |i: usize| match c.get(i).and_then(|x| x.arg.as_ref()) {
            Some(Lit::Str(s)) => Some(s.clone()),
            _ => None,
        };
        match what {
            "function" => {
                let Some(func) = arg(1) else {
                    self.err(
                        c[1].span,
                        "process(...).function needs a name: .function(\"NAME\")",
                    );
                    return vec![];
                };
                if func.contains('@') || func.contains(':') {
                    self.err(c[1].span, format!("function(\"{func}\"): weft stap takes function names (wildcards allowed), not FUNC@FILE:LINE"));
                    return vec![];
                }
                let suffix = c.get(2).map(|x| x.name.as_str());
                if c.len() > 3 {
                    self.err(sp, format!("probe point '{text}' not recognised"));
                    return vec![];
                }
                let ret = match suffix {
                    None | Some("call") => false,
                    Some("return") => true,
                    Some("inline") => {
                        self.err(c[2].span, "'.inline' probes need inlined copies of a function: weft probes a function's entry and return (use .call)");
                        return vec![];
                    }
                    Some(s) => {
                        self.err(c[2].span, format!("'.{s}' not recognised after function(...): weft stap has .call and .return"));
                        return vec![];
                    }
                };
                let prov = if ret { "uretprobe" } else { "uprobe" };
                vec![(
                    spec(prov, &[&path, &func], text, sp),
                    Ctx::Function {
                        target: path,
                        func,
                        ret,
                    },
                )]
            }
            "statement" => {
                self.err(c[1].span, "statement probes (FUNC@FILE:LINE) need line-level probe sites, which weft does not have; use .function(\"NAME\")");
                vec![]
            }
            "mark" => {
                let Some(pat) = arg(1) else {
                    self.err(c[1].span, "process(...).mark needs a name: .mark(\"NAME\")");
                    return vec![];
                };
                if c.len() > 2 {
                    self.err(sp, format!("probe point '{text}' not recognised"));
                    return vec![];
                }
                let marks = match &self.sopts.marks {
                    Some(r) => match r.marks(&path) {
                        Ok(m) => m,
                        Err(why) => {
                            self.err(sp, format!("probe point '{text}': {why}"));
                            return vec![];
                        }
                    },
                    None => {
                        return vec![(
                            spec("usdt", &[&path, &pat], text, sp),
                            Ctx::Mark {
                                provider: String::new(),
                                name: pat,
                            },
                        )]
                    }
                };
                let mut seen = BTreeSet::new();
                let out: Vec<(AttachSpec, Ctx)> = marks
                    .into_iter()
                    .filter(|(_, n)| glob(&pat, n))
                    .filter(|m| seen.insert(m.clone()))
                    .map(|(prov, n)| {
                        (
                            spec("usdt", &[&path, &prov, &n], text, sp),
                            Ctx::Mark {
                                provider: prov,
                                name: n,
                            },
                        )
                    })
                    .collect();
                if out.is_empty() && !pp.optional {
                    self.err(
                        sp,
                        format!("probe point '{text}' matched no SDT probe in {path}"),
                    );
                }
                out
            }
            "begin" if c.len() == 2 => vec![(
                spec("uprobe", &[&path, "_start"], text, sp),
                Ctx::ProcessBegin,
            )],
            "end" if c.len() == 2 => vec![(
                spec("uprobe", &["libc", "_exit"], text, sp),
                Ctx::ProcessEnd,
            )],
            _ => {
                self.err(sp, format!("probe point '{text}' not recognised: weft stap has process(\"PATH\").function(\"NAME\")[.call|.return], .mark(\"NAME\"), .begin and .end"));
                vec![]
            }
        }
    }
}

// ---------------------------------------------------------------------------
// Statements

impl Gen<'_> {
    fn stmts_of(&mut self, st: &s::Stmt) -> Vec<Stmt> {
        let mut out = Vec::new();
        self.stmt(st, &mut out);
        out
    }

    fn local_name(&self, n: &str) -> String {
        match self.inline.last() {
            Some((_, prefix, _, _)) => format!("{prefix}{n}"),
            None => n.to_string(),
        }
    }

    fn fresh(&mut self, what: &str) -> String {
        self.tmp += 1;
        format!("__{what}{}", self.tmp)
    }

    fn stmt(&mut self, st: &s::Stmt, out: &mut Vec<Stmt>) {
        let sp = st.span;
        match &st.kind {
            SS::Empty => {}
            SS::Block(v) => {
                // Inside an inlined function, what follows a statement that may
                // return runs only when it did not.
                let mut i = 0;
                while i < v.len() {
                    self.stmt(&v[i], out);
                    if !self.inline.is_empty() && returns(&v[i]) && i + 1 < v.len() {
                        let done = self.inline.last().unwrap().2.clone();
                        let mut rest = Vec::new();
                        for x in &v[i + 1..] {
                            self.stmt(x, &mut rest);
                        }
                        // (the recursion above guarded deeper returns itself)
                        out.push(if_(not(var_e(&done, sp), sp), rest, None, sp));
                        return;
                    }
                    i += 1;
                }
            }
            SS::Expr(x) => self.expr_stmt(x, out),
            SS::If(c, t, o) => {
                let c = self.expr(c);
                let t = self.stmts_of(t);
                let o = o.as_ref().map(|o| self.stmts_of(o));
                out.push(if_(c, t, o, sp));
            }
            SS::While(c, b) => {
                let mut c = self.expr(c);
                if let Some((_, _, done, _)) = self.inline.last() {
                    if returns(b) {
                        c = bin(BinOp::And, not(var_e(done, sp), sp), c, sp);
                    }
                }
                self.loops += 1;
                let body = self.stmts_of(b);
                self.loops -= 1;
                out.push(stmt(
                    StmtKind::While {
                        cond: c,
                        body: block(body, sp),
                    },
                    sp,
                ));
            }
            SS::For(init, cond, step, b) => {
                if let Some(i) = init {
                    self.expr_stmt(i, out);
                }
                let mut c = cond.as_ref().map_or(int(1, sp), |c| self.expr(c));
                if let Some((_, _, done, _)) = self.inline.last() {
                    if returns(b) {
                        c = bin(BinOp::And, not(var_e(done, sp), sp), c, sp);
                    }
                }
                if has_continue(b) && step.is_some() {
                    self.err(sp, "'continue' in a for loop with a step expression is not supported by weft stap (use while)");
                }
                self.loops += 1;
                let mut body = self.stmts_of(b);
                self.loops -= 1;
                if let Some(s) = step {
                    self.expr_stmt(s, &mut body);
                }
                out.push(stmt(
                    StmtKind::While {
                        cond: c,
                        body: block(body, sp),
                    },
                    sp,
                ));
            }
            SS::Foreach(f) => self.foreach(f, sp, out),
            SS::Delete(x) => match &x.kind {
                SK::Index(n, nsp, ks) if self.globals.contains_key(n) => {
                    let m = self.global_ref(n, *nsp, Some(ks), x.span);
                    for m in m {
                        out.push(stmt(StmtKind::Expr(call("delete", vec![m], sp)), sp));
                    }
                }
                SK::Ident(n) if self.globals.contains_key(n) => {
                    for name in self.maps_of(n) {
                        let m = e(
                            ExprKind::Map(MapRef {
                                name,
                                name_span: x.span,
                                keys: None,
                                span: x.span,
                            }),
                            x.span,
                        );
                        let keyed = self.globals[n].keys.is_some();
                        out.push(stmt(
                            StmtKind::Expr(call(
                                if keyed { "clear" } else { "delete" },
                                vec![m],
                                sp,
                            )),
                            sp,
                        ));
                    }
                }
                _ => self.err(
                    x.span,
                    "delete takes a global: `delete arr[k]`, `delete arr` or `delete scalar`",
                ),
            },
            SS::Next => out.push(stmt(StmtKind::Return(None), sp)),
            SS::Break => {
                if self.in_sorted_foreach > 0 {
                    self.err(
                        sp,
                        "'break' in a sorted foreach is not supported by weft stap (use `limit N`)",
                    );
                }
                out.push(stmt(StmtKind::Break, sp))
            }
            SS::Continue => out.push(stmt(StmtKind::Continue, sp)),
            SS::Return(v) => match self.inline.last().cloned() {
                Some((_, _, done, ret)) => {
                    if let Some(v) = v {
                        let v = self.expr(v);
                        out.push(assign(&ret, v, sp));
                    }
                    out.push(assign(&done, int(1, sp), sp));
                    if self.in_loop_of_inline(st) {
                        out.push(stmt(StmtKind::Break, sp));
                    }
                }
                None => self.err(
                    sp,
                    "'return' outside a function (use 'next' to leave a probe)",
                ),
            },
        }
    }

    fn in_loop_of_inline(&self, _st: &s::Stmt) -> bool {
        // A return inside a loop breaks out of it; the loop's condition tests `done`.
        self.loops > 0
    }
}

fn returns(st: &s::Stmt) -> bool {
    match &st.kind {
        SS::Return(_) => true,
        SS::Block(v) => v.iter().any(returns),
        SS::If(_, t, o) => returns(t) || o.as_deref().is_some_and(returns),
        SS::While(_, b) | SS::For(_, _, _, b) => returns(b),
        SS::Foreach(f) => returns(&f.body),
        _ => false,
    }
}

fn has_continue(st: &s::Stmt) -> bool {
    match &st.kind {
        SS::Continue => true,
        SS::Block(v) => v.iter().any(has_continue),
        SS::If(_, t, o) => has_continue(t) || o.as_deref().is_some_and(has_continue),
        _ => false,
    }
}

// ---------------------------------------------------------------------------
// Globals as maps

const STAT_OPS: &[&str] = &["count", "sum", "min", "max", "hist_log", "hist_linear"];

impl Gen<'_> {
    fn is_counter(&self, n: &str) -> bool {
        self.globals
            .get(n)
            .is_some_and(|g| g.added && !g.plain_write && !g.stat)
    }

    /// The maps a global is kept in: itself, or a statistic's hidden maps.
    fn maps_of(&self, n: &str) -> Vec<String> {
        let Some(g) = self.globals.get(n) else {
            return vec![];
        };
        if !g.stat {
            return vec![format!("@{n}")];
        }
        self.stat_parts(g)
            .into_iter()
            .map(|op| stat_map(n, op))
            .collect()
    }

    fn stat_parts(&self, g: &GlobalInfo) -> Vec<&'static str> {
        let mut want: BTreeSet<&str> = BTreeSet::new();
        for op in &g.ops {
            match op.as_str() {
                "avg" => {
                    want.insert("count");
                    want.insert("sum");
                }
                o => {
                    if let Some(k) = STAT_OPS.iter().find(|k| **k == o) {
                        want.insert(k);
                    }
                }
            }
        }
        if g.ops.is_empty() {
            want.extend(["count", "sum", "min", "max"]);
        }
        STAT_OPS
            .iter()
            .copied()
            .filter(|k| want.contains(k))
            .collect()
    }

    fn map_ref(&mut self, n: &str, span: Span, keys: Option<Vec<Expr>>) -> MapRef {
        MapRef {
            name: format!("@{n}"),
            name_span: span,
            keys,
            span,
        }
    }

    fn keys(&mut self, ks: &[s::Expr]) -> Vec<Expr> {
        ks.iter().map(|k| self.value(k)).collect()
    }

    /// An expression whose value is kept (a key, a stored value): SystemTap's
    /// comparisons are numbers, bpftrace's booleans, so they are cast.
    fn value(&mut self, x: &s::Expr) -> Expr {
        let v = self.expr(x);
        let boolean = match &v.kind {
            ExprKind::Binary { op, .. } => {
                op.is_comparison() || matches!(op, BinOp::And | BinOp::Or)
            }
            ExprKind::Unary { op: UnOp::Not, .. } => true,
            ExprKind::Call { name, .. } => name == "has_key" || name == "strcontains",
            _ => false,
        };
        if !boolean {
            return v;
        }
        let span = v.span;
        e(
            ExprKind::Cast {
                ty: ast::TypeExpr {
                    base: ast::TypeName::Int {
                        bits: 64,
                        signed: true,
                    },
                    pointer: 0,
                    array: None,
                    dims: vec![],
                    span,
                },
                expr: Box::new(v),
            },
            span,
        )
    }

    /// `g[ks]` as map expressions (one per hidden map of a statistic).
    fn global_ref(
        &mut self,
        n: &str,
        nsp: Span,
        ks: Option<&Vec<s::Expr>>,
        span: Span,
    ) -> Vec<Expr> {
        let keys = ks.map(|k| self.keys(k));
        self.maps_of(n)
            .into_iter()
            .map(|m| {
                e(
                    ExprKind::Map(MapRef {
                        name: m,
                        name_span: nsp,
                        keys: keys.clone(),
                        span,
                    }),
                    span,
                )
            })
            .collect()
    }

    fn check_global_shape(&mut self, n: &str, keyed: bool, span: Span) -> bool {
        let Some(g) = self.globals.get(n) else {
            return false;
        };
        match (g.keys.is_some(), keyed) {
            (true, false) => {
                self.err(span, format!("'{n}' is an array: index it, as {n}[...]"));
                false
            }
            (false, true) => {
                self.err(span, format!("'{n}' is a scalar, not an array"));
                false
            }
            _ => true,
        }
    }

    fn assign_global(
        &mut self,
        op: &'static str,
        l: &s::Expr,
        r: &s::Expr,
        sp: Span,
        out: &mut Vec<Stmt>,
    ) {
        let (n, nsp, ks) = match &l.kind {
            SK::Ident(n) => (n.clone(), l.span, None),
            SK::Index(n, nsp, ks) => (n.clone(), *nsp, Some(ks)),
            _ => unreachable!(),
        };
        if !self.check_global_shape(&n, ks.is_some(), l.span) {
            return;
        }
        let keys = ks.map(|k| self.keys(k));
        let mref = |name: String| MapRef {
            name,
            name_span: nsp,
            keys: keys.clone(),
            span: l.span,
        };
        if op == "<<<" {
            let g = self.globals[&n].clone();
            let v = self.expr(r);
            let t = self.fresh("v");
            out.push(assign(&t, v, sp));
            for part in self.stat_parts(&g) {
                let x = var_e(&t, sp);
                let value = match part {
                    "count" => call("count", vec![], sp),
                    "sum" => call("sum", vec![x], sp),
                    "min" => call("min", vec![x], sp),
                    "max" => call("max", vec![x], sp),
                    "hist_log" => call("hist", vec![x], sp),
                    _ => {
                        // SystemTap's buckets: [start, stop + interval) in steps, under
                        // and over: lhist's with max = stop + interval.
                        let (a, b, c) = g.linear.unwrap_or((0, 100, 10));
                        call("lhist", vec![x, int(a, sp), int(b + c, sp), int(c, sp)], sp)
                    }
                };
                out.push(stmt(
                    StmtKind::Assign {
                        target: LValue::Map(mref(stat_map(&n, part))),
                        op: None,
                        value,
                    },
                    sp,
                ));
            }
            return;
        }
        if self.globals[&n].stat {
            self.err(
                l.span,
                format!("'{n}' holds statistics: add to it with '<<<'"),
            );
            return;
        }
        let v = self.expr(r);
        let target = LValue::Map(mref(format!("@{n}")));
        if self.is_counter(&n) {
            let v = if op == "-=" {
                e(
                    ExprKind::Unary {
                        op: UnOp::Neg,
                        expr: Box::new(v),
                    },
                    r.span,
                )
            } else {
                v
            };
            out.push(stmt(
                StmtKind::Assign {
                    target,
                    op: None,
                    value: call("sum", vec![v], sp),
                },
                sp,
            ));
            return;
        }
        let op = match assign_op(op) {
            Ok(o) => o,
            Err(m) => {
                self.err(sp, m);
                return;
            }
        };
        out.push(stmt(
            StmtKind::Assign {
                target,
                op,
                value: v,
            },
            sp,
        ));
    }
}

/// The hidden map keeping one part of a statistic (histograms under the prefix the
/// printer prints as SystemTap does).
fn stat_map(n: &str, part: &str) -> String {
    if part.starts_with("hist") {
        format!("@__stap_{part}_{n}")
    } else {
        format!("@__{n}_{part}")
    }
}

fn assign_op(op: &str) -> Result<Option<BinOp>, String> {
    Ok(Some(match op {
        "=" => return Ok(None),
        "+=" => BinOp::Add,
        "-=" => BinOp::Sub,
        "*=" => BinOp::Mul,
        "/=" => BinOp::Div,
        "%=" => BinOp::Mod,
        "&=" => BinOp::BitAnd,
        "|=" => BinOp::BitOr,
        "^=" => BinOp::BitXor,
        "<<=" => BinOp::Shl,
        ">>=" => BinOp::Shr,
        ".=" => return Err("string concatenation ('.=') is not supported by weft stap".into()),
        o => return Err(format!("'{o}' cannot be used here")),
    }))
}

fn bin_op(op: &str) -> Option<BinOp> {
    Some(match op {
        "+" => BinOp::Add,
        "-" => BinOp::Sub,
        "*" => BinOp::Mul,
        "/" => BinOp::Div,
        "%" => BinOp::Mod,
        "&" => BinOp::BitAnd,
        "|" => BinOp::BitOr,
        "^" => BinOp::BitXor,
        "<<" => BinOp::Shl,
        ">>" => BinOp::Shr,
        "==" => BinOp::Eq,
        "!=" => BinOp::Ne,
        "<" => BinOp::Lt,
        "<=" => BinOp::Le,
        ">" => BinOp::Gt,
        ">=" => BinOp::Ge,
        "&&" => BinOp::And,
        "||" => BinOp::Or,
        _ => return None,
    })
}

// ---------------------------------------------------------------------------
// Expressions

impl Gen<'_> {
    fn expr_stmt(&mut self, x: &s::Expr, out: &mut Vec<Stmt>) {
        let sp = x.span;
        match &x.kind {
            SK::Assign(op, l, r) => match &l.kind {
                SK::Ident(n) | SK::Index(n, _, _) if self.globals.contains_key(n) => {
                    self.assign_global(op, l, r, sp, out)
                }
                SK::Ident(n) => {
                    if *op == "<<<" {
                        self.err(
                            l.span,
                            format!("'<<<' needs a global statistic; '{n}' is a local"),
                        );
                        return;
                    }
                    let v = self.value(r);
                    match assign_op(op) {
                        Ok(o) => out.push(stmt(
                            StmtKind::Assign {
                                target: LValue::Var(var(&self.local_name(n), l.span)),
                                op: o,
                                value: v,
                            },
                            sp,
                        )),
                        Err(m) => self.err(sp, m),
                    }
                }
                SK::Index(n, nsp, _) => self.err(
                    *nsp,
                    format!("unknown array '{n}': declare it with 'global {n}'"),
                ),
                SK::Target(..) => self.err(
                    l.span,
                    "writing target variables needs guru mode, which weft stap does not have",
                ),
                _ => self.err(l.span, "cannot assign to this expression"),
            },
            SK::IncDec(inc, _, t) => match &t.kind {
                SK::Ident(n) | SK::Index(n, _, _) if self.is_counter(n) => {
                    let one = s::Expr {
                        kind: SK::Num(1),
                        span: sp,
                    };
                    self.assign_global(if *inc { "+=" } else { "-=" }, t, &one, sp, out)
                }
                _ => {
                    let v = self.expr(x);
                    out.push(stmt(StmtKind::Expr(v), sp));
                }
            },
            SK::Call(n, nsp, args) if self.functions.contains_key(n) && !is_builtin(n) => {
                if let Some((stmts, _)) = self.inline_call(n, *nsp, args, sp) {
                    out.push(stmt(StmtKind::Block(block(stmts, sp)), sp));
                }
            }
            _ => {
                let v = self.expr(x);
                out.push(stmt(StmtKind::Expr(v), sp));
            }
        }
    }

    fn expr(&mut self, x: &s::Expr) -> Expr {
        let sp = x.span;
        match &x.kind {
            SK::Num(n) => int(*n, sp),
            SK::Str(v) => e(ExprKind::Str(v.clone()), sp),
            SK::Ident(n) => self.ident(n, sp),
            SK::Index(n, nsp, ks) => {
                if !self.globals.contains_key(n) {
                    self.err(
                        *nsp,
                        format!("unknown array '{n}': declare it with 'global {n}'"),
                    );
                    return int(0, sp);
                }
                if self.globals[n].stat {
                    self.err(sp, format!("'{n}' holds statistics: read it with @count({n}[...]), @sum, @min, @max or @avg"));
                    return int(0, sp);
                }
                if !self.check_global_shape(n, true, sp) {
                    return int(0, sp);
                }
                let keys = self.keys(ks);
                e(
                    ExprKind::Map(MapRef {
                        name: format!("@{n}"),
                        name_span: *nsp,
                        keys: Some(keys),
                        span: sp,
                    }),
                    sp,
                )
            }
            SK::Call(n, nsp, args) => self.call(n, *nsp, args, sp),
            SK::Target(n, fields) => self.target_var(n, fields, sp),
            SK::Special(n) => match (&self.ctx, n.trim_end_matches('$')) {
                (Ctx::Mark { name, .. }, "$name") => string(&name.clone(), sp),
                (Ctx::Mark { provider, .. }, "$provider") => string(&provider.clone(), sp),
                _ => {
                    self.err(sp, format!("'${n}' is a string weft stap can only print: use it in print, println or printf (\"%s\")"));
                    string("", sp)
                }
            },
            SK::At(op, args) => self.at(op, args, sp),
            SK::Unary(op, a) => {
                let a = self.expr(a);
                let op = match *op {
                    "!" => UnOp::Not,
                    "~" => UnOp::BitNot,
                    "-" => UnOp::Neg,
                    _ => UnOp::Plus,
                };
                e(
                    ExprKind::Unary {
                        op,
                        expr: Box::new(a),
                    },
                    sp,
                )
            }
            SK::Binary(op, a, b) => {
                let Some(o) = bin_op(op) else {
                    self.err(sp, "string concatenation ('.') as a value is not supported by weft stap: use it as an argument of print, println or printf");
                    return int(0, sp);
                };
                let a = self.expr(a);
                let b = self.expr(b);
                bin(o, a, b, sp)
            }
            SK::Ternary(c, a, b) => {
                let c = self.expr(c);
                let a = self.expr(a);
                let b = self.expr(b);
                e(
                    ExprKind::Ternary {
                        cond: Box::new(c),
                        then: Box::new(a),
                        otherwise: Box::new(b),
                    },
                    sp,
                )
            }
            SK::Assign(..) => {
                self.err(sp, "an assignment used as a value is not supported by weft stap: make it a statement");
                int(0, sp)
            }
            SK::IncDec(inc, prefix, t) => {
                let target = match &t.kind {
                    SK::Ident(n) if self.globals.contains_key(n) => {
                        if self.is_counter(n) {
                            self.err(sp, format!("'{n}' is only ever added to (kept as a sum): use '{n}++' as a statement"));
                        }
                        IncTarget::Map(self.map_ref(n, t.span, None))
                    }
                    SK::Index(n, nsp, ks) if self.globals.contains_key(n) => {
                        if self.is_counter(n) {
                            self.err(sp, format!("'{n}' is only ever added to (kept as a sum): use '{n}[...]++' as a statement"));
                        }
                        let keys = self.keys(ks);
                        IncTarget::Map(MapRef {
                            name: format!("@{n}"),
                            name_span: *nsp,
                            keys: Some(keys),
                            span: t.span,
                        })
                    }
                    SK::Ident(n) => IncTarget::Var(var(&self.local_name(n), t.span)),
                    _ => {
                        self.err(t.span, "'++'/'--' need a variable or an array element");
                        return int(0, sp);
                    }
                };
                e(
                    ExprKind::IncDec {
                        target,
                        increment: *inc,
                        prefix: *prefix,
                    },
                    sp,
                )
            }
            SK::In(ks, n, nsp) => {
                if !self.globals.contains_key(n) {
                    self.err(
                        *nsp,
                        format!("unknown array '{n}': declare it with 'global {n}'"),
                    );
                    return int(0, sp);
                }
                let maps = self.global_ref(n, *nsp, None, *nsp);
                let mut args = vec![maps[0].clone()];
                args.extend(self.keys(ks));
                call("has_key", args, sp)
            }
        }
    }

    fn ident(&mut self, n: &str, sp: Span) -> Expr {
        if self.locals.contains_key(n)
            || self
                .inline
                .last()
                .is_some_and(|_| self.locals.contains_key(n))
        {
            return var_e(&self.local_name(n), sp);
        }
        if self.globals.contains_key(n) {
            if self.globals[n].stat {
                self.err(sp, format!("'{n}' holds statistics: read it with @count({n}), @sum, @min, @max or @avg"));
                return int(0, sp);
            }
            if !self.check_global_shape(n, false, sp) {
                return int(0, sp);
            }
            return e(ExprKind::Map(self.map_ref(n, sp, None)), sp);
        }
        if let Ctx::Syscall { name, ret } = self.ctx.clone() {
            if n == "name" {
                return string(&name, sp);
            }
            if let Some(ev) = &self.opts.events {
                let tp = format!("{}{name}", if ret { "sys_exit_" } else { "sys_enter_" });
                if let Ok(fields) = ev.fields("syscalls", &tp) {
                    if fields.iter().any(|f| f.name == n) {
                        return args_field(n, sp);
                    }
                }
            }
        }
        self.err(
            sp,
            format!("unresolved symbol '{n}': not a local assigned in this probe, nor a global"),
        );
        int(0, sp)
    }

    /// `$N` (a number) and `@N` (a string): the script's arguments.
    fn script_arg(&mut self, n: &str, string: bool, sp: Span) -> Expr {
        let i: usize = n.parse().unwrap_or(0);
        let Some(v) = i.checked_sub(1).and_then(|i| self.opts.positional.get(i)) else {
            self.err(
                sp,
                format!(
                    "command line argument index {i} out of range [1-{}]",
                    self.opts.positional.len()
                ),
            );
            return int(0, sp);
        };
        if string {
            return string_lit(v, sp);
        }
        match crate::lexer::parse_int(v) {
            Ok(x) => e(ExprKind::Int(x), sp),
            Err(_) => {
                self.err(
                    sp,
                    format!("'${n}' is {v:?}, not a number (use @{n} for a string)"),
                );
                int(0, sp)
            }
        }
    }

    fn target_var(&mut self, n: &str, fields: &[String], sp: Span) -> Expr {
        if n.bytes().all(|b| b.is_ascii_digit()) {
            return self.script_arg(n, false, sp);
        }
        let base = match self.ctx.clone() {
            Ctx::Function {
                ret: true,
                target,
                func,
            } if n == "return" => self.typed_retval(&target, &func, sp),
            Ctx::Function { ret: true, .. } => {
                // As SystemTap: a parameter in a return probe is its value at entry.
                let inner = s::Expr {
                    kind: SK::Target(n.to_string(), fields.to_vec()),
                    span: sp,
                };
                return self.entry(&inner, sp);
            }
            Ctx::Function { ret: false, .. } if n == "return" => {
                self.err(sp, "'$return' is only in .return probes");
                return int(0, sp);
            }
            Ctx::Function { .. } => args_field(n, sp),
            Ctx::Mark { .. } => match n.strip_prefix("arg").and_then(|d| d.parse::<u32>().ok()) {
                Some(i) if (1..=12).contains(&i) => ident(&format!("arg{}", i - 1), sp),
                _ => {
                    self.err(
                        sp,
                        format!("'${n}': a mark probe has $arg1 ... $arg12, $$name and $$provider"),
                    );
                    return int(0, sp);
                }
            },
            Ctx::Syscall { ret, .. } if n == "return" => {
                if !ret {
                    self.err(sp, "'$return' is only in .return probes");
                }
                args_field("ret", sp)
            }
            Ctx::Syscall { .. } => args_field(n, sp),
            _ => {
                self.err(
                    sp,
                    format!("'${n}': this probe point has no target variables"),
                );
                return int(0, sp);
            }
        };
        let mut x = base;
        for f in fields {
            x = e(
                ExprKind::Field {
                    expr: Box::new(x),
                    field: f.clone(),
                    arrow: true,
                },
                sp,
            );
        }
        x
    }

    /// `$return` as the function's DWARF type says (an `int` returning -1 is -1, as in
    /// SystemTap), else the raw register.
    fn typed_retval(&mut self, target: &str, func: &str, sp: Span) -> Expr {
        let raw = ident("retval", sp);
        if func.contains(['*', '?', '[']) {
            return raw;
        }
        let ap = weft_ir::AttachPoint::Uretprobe {
            target: target.to_string(),
            func: func.to_string(),
        };
        let ty = self
            .opts
            .args_resolver
            .as_ref()
            .and_then(|r| r.return_type(&ap));
        match ty {
            Some(weft_ir::Type::Int { bits, signed }) if bits < 64 => e(
                ExprKind::Cast {
                    ty: ast::TypeExpr {
                        base: ast::TypeName::Int { bits, signed },
                        pointer: 0,
                        array: None,
                        dims: vec![],
                        span: sp,
                    },
                    expr: Box::new(raw),
                },
                sp,
            ),
            _ => raw,
        }
    }

    fn entry(&mut self, inner: &s::Expr, sp: Span) -> Expr {
        let Ctx::Function {
            target,
            func,
            ret: true,
        } = self.ctx.clone()
        else {
            self.err(sp, "@entry(...) is only in .return probes");
            return int(0, sp);
        };
        self.entry_n += 1;
        let map = format!("@__stap_entry{}", self.entry_n);
        let saved_ctx = std::mem::replace(
            &mut self.ctx,
            Ctx::Function {
                target: target.clone(),
                func: func.clone(),
                ret: false,
            },
        );
        let saved_locals = std::mem::take(&mut self.locals);
        let v = self.expr(inner);
        self.ctx = saved_ctx;
        self.locals = saved_locals;
        let tid_key = || Some(vec![ident("tid", sp)]);
        self.hidden.push(probe(
            vec![spec(
                "uprobe",
                &[&target, &func],
                &format!("@entry at {func}"),
                sp,
            )],
            vec![stmt(
                StmtKind::Assign {
                    target: LValue::Map(MapRef {
                        name: map.clone(),
                        name_span: sp,
                        keys: tid_key(),
                        span: sp,
                    }),
                    op: None,
                    value: v,
                },
                sp,
            )],
            sp,
            true,
        ));
        e(
            ExprKind::Map(MapRef {
                name: map,
                name_span: sp,
                keys: tid_key(),
                span: sp,
            }),
            sp,
        )
    }

    fn at(&mut self, op: &str, args: &[s::Expr], sp: Span) -> Expr {
        if op.bytes().all(|b| b.is_ascii_digit()) {
            return self.script_arg(op, true, sp);
        }
        if op == "entry" {
            if args.len() != 1 {
                self.err(sp, "@entry takes one expression");
                return int(0, sp);
            }
            return self.entry(&args[0], sp);
        }
        if !matches!(
            op,
            "count" | "sum" | "min" | "max" | "avg" | "hist_log" | "hist_linear"
        ) {
            self.err(sp, format!("unknown operator '@{op}': weft stap has @entry, @count, @sum, @min, @max, @avg, @hist_log and @hist_linear"));
            return int(0, sp);
        }
        let (n, nsp, ks) = match args.first().map(|a| &a.kind) {
            Some(SK::Ident(n)) => (n.clone(), args[0].span, None),
            Some(SK::Index(n, nsp, ks)) => (n.clone(), *nsp, Some(ks)),
            _ => {
                self.err(
                    sp,
                    format!("@{op} takes a global statistic: @{op}(s) or @{op}(s[k])"),
                );
                return int(0, sp);
            }
        };
        if !self.globals.get(&n).is_some_and(|g| g.stat) {
            self.err(
                nsp,
                format!("'{n}' is not a statistic (add to it with '<<<')"),
            );
            return int(0, sp);
        }
        if op.starts_with("hist") {
            self.err(
                sp,
                format!("@{op}(...) can only be printed: print(@{op}({n}))"),
            );
            return int(0, sp);
        }
        let keys = ks.map(|k| self.keys(k));
        let m = |part: &str| {
            e(
                ExprKind::Map(MapRef {
                    name: format!("@__{n}_{part}"),
                    name_span: nsp,
                    keys: keys.clone(),
                    span: sp,
                }),
                sp,
            )
        };
        if op == "avg" {
            return bin(BinOp::Div, m("sum"), m("count"), sp);
        }
        m(op)
    }

    fn call(&mut self, n: &str, nsp: Span, args: &[s::Expr], sp: Span) -> Expr {
        let arity = |g: &mut Self, k: usize| {
            if args.len() != k {
                g.err(
                    sp,
                    format!("{n}() takes {k} argument{}", if k == 1 { "" } else { "s" }),
                );
                false
            } else {
                true
            }
        };
        let target = |g: &mut Self| match (g.sopts.target_pid, g.sopts.command) {
            (Some(p), _) => int(i64::from(p), sp),
            (None, true) => ident("cpid", sp),
            (None, false) => {
                g.err(sp, "target() needs -x PID or -c CMD");
                int(0, sp)
            }
        };
        let simple = |name: &str| -> Option<&'static str> {
            Some(match name {
                "pid" => "pid",
                "tid" => "tid",
                "uid" | "euid" => "uid",
                "gid" | "egid" => "gid",
                "cpu" => "cpu",
                "execname" => "comm",
                "local_clock_ns" | "cpu_clock_ns" | "ktime_get_ns" | "get_cycles" => "nsecs",
                "probefunc" | "ppfunc" => "func",
                "pp" => "probe",
                "ppid" => return None,
                _ => return None,
            })
        };
        // The incoming task's context in scheduler.cpu_on (the tracepoint runs in
        // the outgoing one's).
        if matches!(self.ctx, Ctx::CpuOn) && args.is_empty() {
            match n {
                "tid" => return args_field("next_pid", sp),
                "pid" => {
                    return e(
                        ExprKind::Map(MapRef {
                            name: "@__stap_tgid".into(),
                            name_span: sp,
                            keys: Some(vec![args_field("next_pid", sp)]),
                            span: sp,
                        }),
                        sp,
                    )
                }
                "execname" => return args_field("next_comm", sp),
                _ => {}
            }
        }
        if let Some(b) = simple(n) {
            if !arity(self, 0) {
                return int(0, sp);
            }
            return ident(b, sp);
        }
        let clock = |div: u64| {
            bin(
                BinOp::Div,
                call("nsecs", vec![ident("tai", sp)], sp),
                int(div as i64, sp),
                sp,
            )
        };
        let local = |div: u64| bin(BinOp::Div, ident("nsecs", sp), int(div as i64, sp), sp);
        match n {
            "target" => {
                arity(self, 0);
                target(self)
            }
            "gettimeofday_ns" => call("nsecs", vec![ident("tai", sp)], sp),
            "gettimeofday_us" => clock(1_000),
            "gettimeofday_ms" => clock(1_000_000),
            "gettimeofday_s" => clock(1_000_000_000),
            "local_clock_us" | "cpu_clock_us" => local(1_000),
            "local_clock_ms" | "cpu_clock_ms" => local(1_000_000),
            "local_clock_s" | "cpu_clock_s" => local(1_000_000_000),
            "user_string" | "user_string_n" | "user_string2" => {
                if args.is_empty() || args.len() > 2 {
                    self.err(sp, format!("{n}() takes an address (and a length)"));
                    return string("", sp);
                }
                let a: Vec<Expr> = args.iter().map(|x| self.expr(x)).collect();
                call(
                    "str",
                    if n == "user_string_n" {
                        a
                    } else {
                        a[..1].to_vec()
                    },
                    sp,
                )
            }
            "exit" => {
                arity(self, 0);
                call("exit", vec![], sp)
            }
            "printf" | "print" | "println" | "printd" | "printdln" => self.print_call(n, args, sp),
            "sprintf" | "sprint" | "sprintln" => {
                self.err(sp, format!("{n}() as a value is not supported by weft stap: use it as an argument of print, println or printf"));
                string("", sp)
            }
            "isinstr" if args.len() == 2 => {
                let a = self.expr(&args[0]);
                let b = self.expr(&args[1]);
                call("strcontains", vec![a, b], sp)
            }
            "abs" if args.len() == 1 => {
                let a = self.expr(&args[0]);
                let a2 = a.clone();
                e(
                    ExprKind::Ternary {
                        cond: Box::new(bin(BinOp::Lt, a.clone(), int(0, sp), sp)),
                        then: Box::new(e(
                            ExprKind::Unary {
                                op: UnOp::Neg,
                                expr: Box::new(a),
                            },
                            sp,
                        )),
                        otherwise: Box::new(a2),
                    },
                    sp,
                )
            }
            _ => {
                if self.functions.contains_key(n) {
                    return match self.inline_call(n, nsp, args, sp) {
                        Some((stmts, value)) => e(
                            ExprKind::Block(Box::new(Block {
                                stmts,
                                value: Some(Box::new(value)),
                                span: sp,
                            })),
                            sp,
                        ),
                        None => int(0, sp),
                    };
                }
                self.err(nsp, format!("unresolved function '{n}'"));
                int(0, sp)
            }
        }
    }

    fn inline_call(
        &mut self,
        n: &str,
        nsp: Span,
        args: &[s::Expr],
        sp: Span,
    ) -> Option<(Vec<Stmt>, Expr)> {
        let f = self.functions[n];
        if self.inline.iter().any(|(m, ..)| m == n) {
            self.err(nsp, format!("'{n}' calls itself: weft stap inlines functions, so recursion is not supported"));
            return None;
        }
        if f.params.len() != args.len() {
            self.err(
                sp,
                format!(
                    "'{n}' takes {} argument(s), given {}",
                    f.params.len(),
                    args.len()
                ),
            );
            return None;
        }
        let prefix = format!("{}_", self.fresh(&format!("{n}_")));
        let done = format!("{prefix}done");
        let ret = format!("{prefix}ret");
        let mut stmts = Vec::new();
        let mut param_tys = HashMap::new();
        for ((p, psp), a) in f.params.iter().zip(args) {
            let t = self.ty_static(a);
            param_tys.insert(p.clone(), t);
            let v = self.expr(a);
            stmts.push(assign(&format!("{prefix}{p}"), v, *psp));
        }
        let rt = if self.returns_str(&f.body) {
            Ty::Str
        } else {
            Ty::Int
        };
        stmts.push(assign(&done, int(0, sp), sp));
        stmts.push(assign(
            &ret,
            if rt == Ty::Str {
                string("", sp)
            } else {
                int(0, sp)
            },
            sp,
        ));
        let saved_locals = std::mem::replace(&mut self.locals, param_tys);
        let fl = self.infer_locals_keep(&f.body);
        self.locals = fl;
        let saved_loops = std::mem::replace(&mut self.loops, 0);
        self.inline.push((n.to_string(), prefix, done, ret.clone()));
        self.stmt(&f.body, &mut stmts);
        self.inline.pop();
        self.loops = saved_loops;
        self.locals = saved_locals;
        Some((stmts, var_e(&ret, sp)))
    }

    /// `infer_locals` starting from the locals already known (parameters).
    fn infer_locals_keep(&mut self, body: &s::Stmt) -> HashMap<String, Ty> {
        let known = self.locals.clone();
        let mut found = self.infer_locals(body);
        for (k, v) in known {
            found.entry(k).or_insert(v);
        }
        found
    }
}

fn args_field(n: &str, sp: Span) -> Expr {
    e(
        ExprKind::Field {
            expr: Box::new(ident("args", sp)),
            field: n.to_string(),
            arrow: false,
        },
        sp,
    )
}

fn is_builtin(n: &str) -> bool {
    matches!(n, "printf" | "print" | "println" | "exit")
}

// ---------------------------------------------------------------------------
// Printing

/// One piece of a generated format: its text and its arguments.
type Piece = (String, Vec<Expr>);

impl Gen<'_> {
    fn print_call(&mut self, n: &str, args: &[s::Expr], sp: Span) -> Expr {
        if n == "printf" {
            let Some((fmt, rest)) = args.split_first() else {
                self.err(sp, "printf() needs a format");
                return int(0, sp);
            };
            let SK::Str(f) = &fmt.kind else {
                self.err(fmt.span, "printf()'s format must be a string literal");
                return int(0, sp);
            };
            let (text, a) = self.format(&String::from_utf8_lossy(f), rest, fmt.span);
            return self.printf(text, a, sp);
        }
        // print(@hist_log(s)) / println(@hist_linear(s)): the histogram.
        if args.len() == 1 {
            if let SK::At(op, inner) = &args[0].kind {
                if op.starts_with("hist") {
                    return self.print_hist(op, inner, sp);
                }
            }
        }
        let (delim, items) = match n {
            "printd" | "printdln" => match args.split_first() {
                Some((d, rest)) => match &d.kind {
                    SK::Str(s) => (String::from_utf8_lossy(s).into_owned(), rest),
                    _ => {
                        self.err(
                            d.span,
                            format!("{n}()'s delimiter must be a string literal"),
                        );
                        return int(0, sp);
                    }
                },
                None => {
                    self.err(sp, format!("{n}() needs a delimiter"));
                    return int(0, sp);
                }
            },
            _ => (String::new(), args),
        };
        let mut text = String::new();
        let mut all = Vec::new();
        for (i, a) in items.iter().enumerate() {
            if i > 0 {
                text.push_str(&delim.replace('%', "%%"));
            }
            let (t, v) = self.piece(a);
            text.push_str(&t);
            all.extend(v);
        }
        if n.ends_with("ln") {
            text.push('\n');
        }
        self.printf(text, all, sp)
    }

    fn printf(&mut self, text: String, args: Vec<Expr>, sp: Span) -> Expr {
        let mut a = vec![e(ExprKind::Str(text.into_bytes()), sp)];
        a.extend(args);
        call("printf", a, sp)
    }

    /// A value printed as SystemTap's print does: `%d` or `%s`, or the text of a
    /// `sprintf`/`$$parms` spliced in.
    fn piece(&mut self, a: &s::Expr) -> Piece {
        match &a.kind {
            SK::Str(s) => (String::from_utf8_lossy(s).replace('%', "%%"), vec![]),
            SK::Num(n) => (n.to_string(), vec![]),
            SK::Call(n, _, args) if n == "sprintf" => match args.split_first() {
                Some((f, rest)) => match &f.kind {
                    SK::Str(s) => self.format(&String::from_utf8_lossy(s), rest, f.span),
                    _ => {
                        self.err(f.span, "sprintf()'s format must be a string literal");
                        (String::new(), vec![])
                    }
                },
                None => {
                    self.err(a.span, "sprintf() needs a format");
                    (String::new(), vec![])
                }
            },
            SK::Special(n) => self.special(n, a.span),
            // `a . b` printed: the pieces one after the other.
            SK::Binary(".", l, r) => {
                let (mut t, mut v) = self.piece(l);
                let (t2, v2) = self.piece(r);
                t.push_str(&t2);
                v.extend(v2);
                (t, v)
            }
            _ => {
                let t = self.ty_static(a);
                let v = self.expr(a);
                (if t == Ty::Str { "%s" } else { "%d" }.to_string(), vec![v])
            }
        }
    }

    /// `$$parms`, `$$vars`, `$$return`, `$$name`, `$$provider` as format text.
    fn special(&mut self, n: &str, sp: Span) -> Piece {
        let bare = n.trim_end_matches('$');
        match (self.ctx.clone(), bare) {
            (Ctx::Mark { name, .. }, "$name") => (name.replace('%', "%%"), vec![]),
            (Ctx::Mark { provider, .. }, "$provider") => (provider.replace('%', "%%"), vec![]),
            (Ctx::Function { ret: true, .. }, "$return") => {
                ("return=0x%x".to_string(), vec![ident("retval", sp)])
            }
            (Ctx::Function { target, func, ret }, "$parms" | "$vars") => {
                if func.contains(['*', '?', '[']) {
                    self.err(
                        sp,
                        format!(
                            "${n} needs one function (its parameters from DWARF), not a wildcard"
                        ),
                    );
                    return (String::new(), vec![]);
                }
                let ap = weft_ir::AttachPoint::Uprobe {
                    target: target.clone(),
                    func: func.clone(),
                    offset: 0,
                };
                let params = self.opts.args_resolver.as_ref().and_then(|r| r.params(&ap));
                let Some(params) = params else {
                    self.err(sp, format!("${n}: no debug info (DWARF) for the parameters of '{func}' in {target}"));
                    return (String::new(), vec![]);
                };
                let mut text = Vec::new();
                let mut args = Vec::new();
                for (p, ty) in params {
                    if ty.is_scalar() {
                        text.push(format!("{p}=0x%x"));
                        let x = s::Expr {
                            kind: SK::Target(p.clone(), vec![]),
                            span: sp,
                        };
                        let v = if ret {
                            self.target_var(&p, &[], sp)
                        } else {
                            self.expr(&x)
                        };
                        args.push(v);
                    } else {
                        text.push(format!("{p}=?"));
                    }
                }
                (text.join(" "), args)
            }
            (_, "$locals") => {
                self.err(
                    sp,
                    "$$locals: weft reads parameters from DWARF, not local variables",
                );
                (String::new(), vec![])
            }
            _ => {
                self.err(sp, format!("'${n}' is not available in this probe"));
                (String::new(), vec![])
            }
        }
    }

    /// A SystemTap format with its arguments as weft's: `%#x` spelled out, `%i` as
    /// `%d`, a `%s` whose argument is `sprintf(...)` or `$$parms` spliced in.
    fn format(&mut self, fmt: &str, args: &[s::Expr], fsp: Span) -> Piece {
        let b = fmt.as_bytes();
        let mut out = String::new();
        let mut vals = Vec::new();
        let mut ai = 0;
        let mut i = 0;
        while i < b.len() {
            if b[i] != b'%' {
                let ch = fmt[i..].chars().next().unwrap();
                out.push(ch);
                i += ch.len_utf8();
                continue;
            }
            if b.get(i + 1) == Some(&b'%') {
                out.push_str("%%");
                i += 2;
                continue;
            }
            let start = i;
            i += 1;
            let mut flags = String::new();
            while i < b.len() && b"-+ #0".contains(&b[i]) {
                flags.push(b[i] as char);
                i += 1;
            }
            let ws = i;
            while i < b.len() && (b[i].is_ascii_digit() || b[i] == b'.') {
                i += 1;
            }
            let width = &fmt[ws..i];
            while i < b.len() && matches!(b[i], b'l' | b'h' | b'z' | b'j') {
                i += 1;
            }
            let Some(&conv) = b.get(i) else {
                self.err(
                    fsp,
                    format!("printf format: incomplete conversion '{}'", &fmt[start..]),
                );
                break;
            };
            i += 1;
            let Some(arg) = args.get(ai) else {
                self.err(
                    fsp,
                    format!("printf format: '{}' has no argument", &fmt[start..i]),
                );
                break;
            };
            ai += 1;
            let alt = flags.contains('#');
            let flags: String = flags.chars().filter(|c| *c == '-' || *c == '0').collect();
            match conv {
                b's' => {
                    let spliced = match &arg.kind {
                        SK::Call(n, _, _) | SK::Special(n) => n == "sprintf" || n.starts_with('$'),
                        SK::Binary(op, _, _) => *op == ".",
                        _ => false,
                    };
                    {
                        if spliced {
                            if !flags.is_empty() || !width.is_empty() {
                                self.err(
                                    arg.span,
                                    "a padded %s of sprintf()/$$... is not supported by weft stap",
                                );
                            }
                            let (t, v) = self.piece(arg);
                            out.push_str(&t);
                            vals.extend(v);
                            continue;
                        }
                    }
                    out.push_str(&format!("%{flags}{width}s"));
                    vals.push(self.expr(arg));
                }
                b'd' | b'i' | b'u' | b'x' | b'X' | b'o' | b'c' | b'p' => {
                    let conv = if conv == b'i' { 'd' } else { conv as char };
                    if alt && matches!(conv, 'x' | 'X') {
                        out.push_str("0x");
                    } else if alt && conv == 'o' {
                        out.push('0');
                    }
                    out.push_str(&format!("%{flags}{width}{conv}"));
                    vals.push(self.expr(arg));
                }
                other => {
                    self.err(
                        fsp,
                        format!(
                            "printf format: conversion '%{}' is not supported by weft stap",
                            other as char
                        ),
                    );
                    vals.push(self.expr(arg));
                }
            }
        }
        if ai < args.len() {
            self.err(
                args[ai].span,
                "printf: more arguments than the format has conversions",
            );
        }
        (out, vals)
    }

    fn print_hist(&mut self, op: &str, inner: &[s::Expr], sp: Span) -> Expr {
        let n = match inner.first().map(|a| &a.kind) {
            Some(SK::Ident(n))
                if self
                    .globals
                    .get(n)
                    .is_some_and(|g| g.stat && g.keys.is_none()) =>
            {
                n.clone()
            }
            _ => {
                self.err(
                    sp,
                    format!("print(@{op}(...)) takes a global statistic without keys"),
                );
                return int(0, sp);
            }
        };
        let m = e(
            ExprKind::Map(MapRef {
                name: stat_map(&n, op),
                name_span: inner[0].span,
                keys: None,
                span: inner[0].span,
            }),
            sp,
        );
        call("print", vec![m], sp)
    }
}

// ---------------------------------------------------------------------------
// foreach

impl Gen<'_> {
    fn foreach(&mut self, f: &s::Foreach, sp: Span, out: &mut Vec<Stmt>) {
        let Some(g) = self.globals.get(&f.array).cloned() else {
            self.err(
                f.array_span,
                format!(
                    "unknown array '{}': declare it with 'global {}'",
                    f.array, f.array
                ),
            );
            return;
        };
        let Some(nk) = g.keys else {
            self.err(
                f.array_span,
                format!("'{}' is a scalar: foreach needs an array", f.array),
            );
            return;
        };
        if nk != f.keys.len() {
            self.err(
                f.array_span,
                format!(
                    "'{}' has {nk} key(s), the foreach names {}",
                    f.array,
                    f.keys.len()
                ),
            );
            return;
        }
        let map = if g.stat {
            self.maps_of(&f.array)
                .into_iter()
                .next()
                .unwrap_or_default()
        } else {
            format!("@{}", f.array)
        };
        if let (true, Some((_, vsp))) = (g.stat, &f.value) {
            self.err(*vsp, "the value of a statistic is read with @count(...), @sum(...), ...: name only its keys");
            return;
        }
        let kv = self.fresh("kv");
        let mref = || MapRef {
            name: map.clone(),
            name_span: f.array_span,
            keys: None,
            span: f.array_span,
        };
        let key = |i: usize| {
            if nk == 1 {
                tidx(var_e(&kv, sp), 0, sp)
            } else {
                tidx(tidx(var_e(&kv, sp), 0, sp), i as u64, sp)
            }
        };
        let mut bind = Vec::new();
        for (i, (k, ksp)) in f.keys.iter().enumerate() {
            bind.push(assign(&self.local_name(k), key(i), *ksp));
        }
        if let Some((v, vsp)) = &f.value {
            bind.push(assign(
                &self.local_name(v),
                tidx(var_e(&kv, sp), 1, sp),
                *vsp,
            ));
        }
        let limit = f.limit.as_ref().map(|l| self.expr(l));
        let count = self.fresh("n");
        let for_map = |body: Vec<Stmt>| {
            stmt(
                StmtKind::For {
                    var: var(&kv, sp),
                    iter: ForIter::Map(mref()),
                    body: block(body, sp),
                },
                sp,
            )
        };
        if let Some(l) = &limit {
            out.push(assign(&count, int(0, sp), sp));
            let _ = l;
        }
        let limit_check = |lim: &Option<Expr>| {
            lim.as_ref().map(|l| {
                if_(
                    bin(BinOp::Ge, var_e(&count, sp), l.clone(), sp),
                    vec![stmt(StmtKind::Break, sp)],
                    None,
                    sp,
                )
            })
        };
        let incr = |name: &str| {
            stmt(
                StmtKind::Assign {
                    target: LValue::Var(var(name, sp)),
                    op: Some(BinOp::Add),
                    value: int(1, sp),
                },
                sp,
            )
        };
        // Strings sort bytewise through the hidden `__weft_strorder` (-1, 0, 1).
        let by_string = f.sort.is_some_and(|(col, _, _)| {
            let t = if col == 0 {
                g.ty
            } else {
                g.key_tys.get(col - 1).copied().flatten()
            };
            t == Some(Ty::Str) && !g.stat
        });
        let Some((col, asc, ssp)) = f.sort else {
            let mut body = Vec::new();
            if let Some(c) = limit_check(&limit) {
                body.push(c);
                body.push(incr(&count));
            }
            body.extend(bind);
            self.loops += 1;
            self.stmt(&f.body, &mut body);
            self.loops -= 1;
            out.push(for_map(body));
            return;
        };
        // Sorted: each round scans the map for the next entry in order (the sort
        // column, then scan position), then runs the body on it.
        let column = |c: usize| {
            if c == 0 {
                tidx(var_e(&kv, ssp), 1, ssp)
            } else {
                let k = key(c - 1);
                Expr { span: ssp, ..k }
            }
        };
        let t = |x: &str| format!("{kv}_{x}");
        let (have, pv, pidx, found, bv, best, pos, c) = (
            t("have"),
            t("pv"),
            t("pidx"),
            t("found"),
            t("bv"),
            t("best"),
            t("pos"),
            t("c"),
        );
        let (before, better) = if asc {
            (BinOp::Gt, BinOp::Lt)
        } else {
            (BinOp::Lt, BinOp::Gt)
        };
        let v = |n: &str| var_e(n, ssp);
        // `a OP b` on the sort column: numbers as they are, strings by their order.
        let cmp = |op: BinOp, a: Expr, b: Expr| {
            if by_string {
                bin(
                    op,
                    call("__weft_strorder", vec![a, b], ssp),
                    int(0, ssp),
                    ssp,
                )
            } else {
                bin(op, a, b, ssp)
            }
        };
        out.push(assign(&have, int(0, sp), sp));
        out.push(assign(&pidx, int(0, sp), sp));
        // The sort column's zero value, typed from the first entry.
        let mut round = Vec::new();
        if let Some(ch) = limit_check(&limit) {
            round.push(ch);
        }
        round.push(assign(&found, int(0, sp), sp));
        round.push(assign(&best, int(0, sp), sp));
        round.push(assign(&pos, int(0, sp), sp));
        let after_prev = bin(
            BinOp::Or,
            not(v(&have), ssp),
            bin(
                BinOp::Or,
                cmp(before, v(&c), v(&pv)),
                bin(
                    BinOp::And,
                    bin(BinOp::Eq, v(&c), v(&pv), ssp),
                    bin(BinOp::Gt, v(&pos), v(&pidx), ssp),
                    ssp,
                ),
                ssp,
            ),
            ssp,
        );
        let beats = bin(
            BinOp::Or,
            not(v(&found), ssp),
            cmp(better, v(&c), v(&bv)),
            ssp,
        );
        let scan = for_map(vec![
            incr(&pos),
            assign(&c, column(col), ssp),
            if_(
                bin(BinOp::And, after_prev, beats, ssp),
                vec![
                    assign(&found, int(1, sp), sp),
                    assign(&bv, v(&c), sp),
                    assign(&best, v(&pos), sp),
                ],
                None,
                sp,
            ),
        ]);
        round.push(scan);
        round.push(if_(
            not(v(&found), sp),
            vec![stmt(StmtKind::Break, sp)],
            None,
            sp,
        ));
        round.push(assign(&have, int(1, sp), sp));
        round.push(assign(&pv, v(&bv), sp));
        round.push(assign(&pidx, v(&best), sp));
        if limit.is_some() {
            round.push(incr(&count));
        }
        round.push(assign(&pos, int(0, sp), sp));
        let mut hit = bind;
        self.in_sorted_foreach += 1;
        self.loops += 1;
        self.stmt(&f.body, &mut hit);
        self.loops -= 1;
        self.in_sorted_foreach -= 1;
        round.push(for_map(vec![
            incr(&pos),
            if_(bin(BinOp::Eq, v(&pos), v(&best), sp), hit, None, sp),
        ]));
        // `pv` and `bv` get the column's type: declared from a first scan that
        // stops at once (so a string key sorts too where the checker allows).
        out.push(for_map(vec![
            assign(&pv, column(col), ssp),
            assign(&bv, column(col), ssp),
            stmt(StmtKind::Break, sp),
        ]));
        out.push(stmt(
            StmtKind::While {
                cond: int(1, sp),
                body: block(round, sp),
            },
            sp,
        ));
    }
}

// ---------------------------------------------------------------------------
// The end-of-run print of globals the script never reads (as SystemTap does): a
// SystemTap `probe end` written here and translated like the script's. Scalars as
// `x=5` / `x="s"`, arrays as `a[k,"s"]=v` by value, most first (as SystemTap's
// `@prints` emulation of this printer sorts), statistics as
// `s @count=N @min=N @max=N @sum=N @avg=N`.

impl Gen<'_> {
    fn autoprint(&mut self) -> Option<ast::Probe> {
        let globals: Vec<(String, GlobalInfo)> = self
            .script
            .globals
            .iter()
            .filter_map(|g| {
                self.globals
                    .get(&g.name)
                    .map(|i| (g.name.clone(), i.clone()))
            })
            .filter(|(_, g)| !g.read)
            .collect();
        if globals.is_empty() {
            return None;
        }
        let sp = globals[0].1.span;
        let x = |kind: SK, span: Span| s::Expr { kind, span };
        let st = |kind: SS, span: Span| s::Stmt { kind, span };
        let mut body = Vec::new();
        self.ctx = Ctx::End;
        self.locals.clear();
        for (n, g) in globals {
            let sp = g.span;
            let conv = |t: Option<Ty>| if t == Some(Ty::Str) { "\"%s\"" } else { "%d" };
            let nk = g.keys.unwrap_or(0);
            let keys: Vec<String> = (0..nk).map(|i| format!("__ap_{n}_{i}")).collect();
            for (i, k) in keys.iter().enumerate() {
                let t = g.key_tys.get(i).copied().flatten().unwrap_or(Ty::Int);
                self.locals.insert(k.clone(), t);
            }
            let key_exprs: Vec<s::Expr> =
                keys.iter().map(|k| x(SK::Ident(k.clone()), sp)).collect();
            let place = if nk == 0 {
                x(SK::Ident(n.clone()), sp)
            } else {
                x(SK::Index(n.clone(), sp, key_exprs.clone()), sp)
            };
            let key_fmt = if nk == 0 {
                String::new()
            } else {
                let kf: Vec<&str> = (0..nk)
                    .map(|i| conv(g.key_tys.get(i).copied().flatten()))
                    .collect();
                format!("[{}]", kf.join(","))
            };
            let (fmt, mut args) = if g.stat {
                if !["count", "sum", "min", "max"]
                    .iter()
                    .all(|p| self.stat_parts(&g).contains(p))
                {
                    continue;
                }
                let ops = ["count", "min", "max", "sum", "avg"];
                (
                    format!("{n}{key_fmt} @count=%d @min=%d @max=%d @sum=%d @avg=%d\n"),
                    ops.iter()
                        .map(|op| x(SK::At(op.to_string(), vec![place.clone()]), sp))
                        .collect::<Vec<_>>(),
                )
            } else {
                (
                    format!("{n}{key_fmt}={}\n", conv(g.ty)),
                    vec![place.clone()],
                )
            };
            let mut all = key_exprs.clone();
            all.append(&mut args);
            let mut call_args = vec![x(SK::Str(fmt.into_bytes()), sp)];
            call_args.extend(all);
            let print = st(
                SS::Expr(x(SK::Call("printf".into(), sp, call_args), sp)),
                sp,
            );
            if nk == 0 {
                // An empty statistic has nothing to print (SystemTap would say so).
                if g.stat {
                    let count = x(SK::At("count".into(), vec![place.clone()]), sp);
                    let cond = x(
                        SK::Binary(">", Box::new(count), Box::new(x(SK::Num(0), sp))),
                        sp,
                    );
                    body.push(st(SS::If(cond, Box::new(print), None), sp));
                } else {
                    body.push(print);
                }
                continue;
            }
            let by_value = g.stat || g.ty != Some(Ty::Str);
            body.push(st(
                SS::Foreach(Box::new(s::Foreach {
                    value: None,
                    keys: keys.iter().map(|k| (k.clone(), sp)).collect(),
                    array: n.clone(),
                    array_span: sp,
                    sort: by_value.then_some((0, false, sp)),
                    limit: None,
                    body: print,
                })),
                sp,
            ));
        }
        let mut out = Vec::new();
        self.stmt(&st(SS::Block(body), sp), &mut out);
        Some(probe(vec![spec("END", &[], "end", sp)], out, sp, false))
    }
}
