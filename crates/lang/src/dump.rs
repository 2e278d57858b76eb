//! Text dumps of the syntax tree (`-d ast`, and `-d checked` with each expression's
//! type), one node per line, children indented by one space — like bpftrace `-d`.

use std::fmt::Write;

use crate::ast::*;

pub fn program(p: &Program, types: bool) -> String {
    let mut d = Dumper {
        out: String::new(),
        types,
    };
    d.line(0, "Program");
    for item in &p.items {
        d.item(1, item);
    }
    d.out
}

struct Dumper {
    out: String,
    types: bool,
}

fn escape(bytes: &[u8]) -> String {
    let mut s = String::new();
    for &b in bytes {
        match b {
            b'\n' => s.push_str("\\n"),
            b'\t' => s.push_str("\\t"),
            b'\r' => s.push_str("\\r"),
            b'"' => s.push_str("\\\""),
            b'\\' => s.push_str("\\\\"),
            0x20..=0x7e => s.push(b as char),
            _ => {
                let _ = write!(s, "\\x{b:02x}");
            }
        }
    }
    s
}

impl Dumper {
    fn line(&mut self, depth: usize, text: &str) {
        let _ = writeln!(self.out, "{}{}", " ".repeat(depth), text);
    }

    fn struct_def(&mut self, d: usize, s: &StructDef) {
        for n in &s.nested {
            self.struct_def(d, n);
        }
        let kw = if s.union { "union" } else { "struct" };
        self.line(d, &format!("{kw} {}", s.name));
        for (t, n, _, width) in &s.fields {
            match width {
                Some(w) => self.line(d + 1, &format!("{t} {n}:{w}")),
                None => self.line(d + 1, &format!("{t} {n}")),
            }
        }
    }

    fn item(&mut self, d: usize, item: &Item) {
        match item {
            Item::Probe(p) => self.probe(d, p),
            Item::Config(c) => {
                self.line(d, "config");
                for (k, v, _) in &c.entries {
                    let v = match v {
                        ConfigValue::Int(n) => n.to_string(),
                        ConfigValue::Str(s) => format!("\"{}\"", escape(s.as_bytes())),
                        ConfigValue::Ident(s) => s.clone(),
                    };
                    self.line(d + 1, &format!("{k} = {v}"));
                }
            }
            Item::Macro(m) => {
                let params: Vec<String> = m
                    .params
                    .iter()
                    .map(|p| match p {
                        MacroParam::Var(n, _) => format!("${n}"),
                        MacroParam::Map(n, _) | MacroParam::Expr(n, _) => n.clone(),
                    })
                    .collect();
                self.line(d, &format!("macro {}({})", m.name, params.join(", ")));
                self.block(d + 1, &m.body);
            }
            Item::Fn(f) => {
                let params: Vec<String> = f
                    .params
                    .iter()
                    .map(|p| format!("${}: {}", p.name, p.ty))
                    .collect();
                self.line(
                    d,
                    &format!("fn {}({}): {}", f.name, params.join(", "), f.ret),
                );
                self.block(d + 1, &f.body);
            }
            Item::MapDecl(m) => self.line(d, &format!("let {} = {}({})", m.name, m.kind, m.size)),
            Item::Struct(s) => self.struct_def(d, s),
            Item::Enum(e) => {
                self.line(d, &format!("enum {}", e.name.as_deref().unwrap_or("")));
                for (n, v, _) in &e.variants {
                    match v {
                        Some(v) => self.line(d + 1, &format!("{n} = {v}")),
                        None => self.line(d + 1, n),
                    }
                }
            }
            Item::Seq(s) => {
                self.line(d, &format!("seq {}", s.name));
                for st in &s.steps {
                    self.probe(d + 1, &st.probe);
                    if st.star {
                        self.line(d + 1, "*");
                    }
                }
            }
            Item::Pointcut(pc) => {
                let names: Vec<String> = pc.attach.iter().map(attach_text).collect();
                self.line(d, &format!("pointcut {} = {}", pc.name, names.join(", ")));
            }
            Item::Group(g) => self.line(d, &format!("group {}", g.name)),
            Item::Reserved(r) => {
                let name = r
                    .name
                    .as_deref()
                    .map(|n| format!(" {n}"))
                    .unwrap_or_default();
                self.line(d, &format!("{}{name}", r.keyword));
                for i in &r.items {
                    self.item(d + 1, i);
                }
            }
        }
    }

    fn probe(&mut self, d: usize, p: &Probe) {
        let names: Vec<String> = p.attach.iter().map(attach_text).collect();
        let advice = p
            .advice
            .map(|(a, _)| format!("{} ", a.keyword()))
            .unwrap_or_default();
        self.line(d, &format!("{advice}{}", names.join(", ")));
        if let Some(pred) = &p.predicate {
            self.line(d + 1, "predicate");
            self.expr(d + 2, pred);
        }
        for s in &p.body.stmts {
            self.stmt(d + 1, s);
        }
    }

    fn block(&mut self, d: usize, b: &Block) {
        for s in &b.stmts {
            self.stmt(d, s);
        }
        if let Some(v) = &b.value {
            self.line(d, "value");
            self.expr(d + 1, v);
        }
    }

    fn stmt(&mut self, d: usize, s: &Stmt) {
        match &s.kind {
            StmtKind::Expr(e) => self.expr(d, e),
            StmtKind::Assign { target, op, value } => {
                let op = op
                    .map(|o| format!("{}=", o.text()))
                    .unwrap_or_else(|| "=".to_string());
                self.line(d, &op);
                match target {
                    LValue::Var(v) => self.var(d + 1, v, None),
                    LValue::Map(m) => self.map(d + 1, m, None),
                }
                self.expr(d + 1, value);
            }
            StmtKind::Let { var, ty, value } => {
                let ty = ty.as_ref().map(|t| format!(": {t}")).unwrap_or_default();
                self.line(d, &format!("let ${}{ty}", var.name));
                if let Some(v) = value {
                    self.expr(d + 1, v);
                }
            }
            StmtKind::If {
                cond,
                then,
                otherwise,
            } => {
                self.line(d, "if");
                self.expr(d + 1, cond);
                self.line(d + 1, "then");
                self.block(d + 2, then);
                if let Some(e) = otherwise {
                    self.line(d + 1, "else");
                    self.block(d + 2, e);
                }
            }
            StmtKind::Unroll { count, body } => {
                self.line(d, "unroll");
                self.expr(d + 1, count);
                self.line(d + 1, "do");
                self.block(d + 2, body);
            }
            StmtKind::While { cond, body } => {
                self.line(d, "while");
                self.expr(d + 1, cond);
                self.line(d + 1, "do");
                self.block(d + 2, body);
            }
            StmtKind::For { var, iter, body } => {
                self.line(d, "for");
                self.var(d + 1, var, None);
                match iter {
                    ForIter::Map(m) => self.map(d + 1, m, None),
                    ForIter::Range(a, b) => {
                        self.line(d + 1, "range");
                        self.expr(d + 2, a);
                        self.expr(d + 2, b);
                    }
                }
                self.line(d + 1, "do");
                self.block(d + 2, body);
            }
            StmtKind::Break => self.line(d, "break"),
            StmtKind::Continue => self.line(d, "continue"),
            StmtKind::Return(v) => {
                self.line(d, "return");
                if let Some(v) = v {
                    self.expr(d + 1, v);
                }
            }
            StmtKind::Block(b) => {
                self.line(d, "block");
                self.block(d + 1, b);
            }
        }
    }

    fn ty(&self, e: &Expr) -> String {
        if self.types {
            format!(" :: {}", e.ty)
        } else {
            String::new()
        }
    }

    fn var(&mut self, d: usize, v: &VarRef, e: Option<&Expr>) {
        let ty = e.map(|e| self.ty(e)).unwrap_or_default();
        self.line(d, &format!("variable: ${}{ty}", v.name));
    }

    fn map(&mut self, d: usize, m: &MapRef, e: Option<&Expr>) {
        let ty = e.map(|e| self.ty(e)).unwrap_or_default();
        self.line(d, &format!("map: {}{ty}", m.name));
        if let Some(keys) = &m.keys {
            for k in keys {
                self.expr(d + 1, k);
            }
        }
    }

    fn expr(&mut self, d: usize, e: &Expr) {
        let ty = self.ty(e);
        match &e.kind {
            ExprKind::Int(v) => self.line(d, &format!("int: {}{ty}", *v as i64)),
            ExprKind::Str(s) => self.line(d, &format!("string: \"{}\"{ty}", escape(s))),
            ExprKind::Bool(b) => self.line(d, &format!("bool: {b}{ty}")),
            ExprKind::Positional(n) => self.line(d, &format!("param: ${n}{ty}")),
            ExprKind::PositionalCount => self.line(d, &format!("param: $#{ty}")),
            ExprKind::Ident(n) => self.line(d, &format!("builtin: {n}{ty}")),
            ExprKind::Var(v) => self.var(d, v, Some(e)),
            ExprKind::Map(m) => self.map(d, m, Some(e)),
            ExprKind::Call { name, args, .. } => {
                self.line(d, &format!("call: {name}{ty}"));
                for a in args {
                    self.expr(d + 1, a);
                }
            }
            ExprKind::Unary { op, expr } => {
                self.line(d, &format!("{}{ty}", op.text()));
                self.expr(d + 1, expr);
            }
            ExprKind::Binary { op, lhs, rhs } => {
                self.line(d, &format!("{}{ty}", op.text()));
                self.expr(d + 1, lhs);
                self.expr(d + 1, rhs);
            }
            ExprKind::IncDec {
                target,
                increment,
                prefix,
            } => {
                let op = if *increment { "++" } else { "--" };
                let text = if *prefix {
                    format!("{op} (pre)")
                } else {
                    format!("{op} (post)")
                };
                self.line(d, &format!("{text}{ty}"));
                match target {
                    IncTarget::Var(v) => self.var(d + 1, v, None),
                    IncTarget::Map(m) => self.map(d + 1, m, None),
                }
            }
            ExprKind::Ternary {
                cond,
                then,
                otherwise,
            } => {
                self.line(d, &format!("?:{ty}"));
                self.expr(d + 1, cond);
                self.expr(d + 1, then);
                self.expr(d + 1, otherwise);
            }
            ExprKind::Cast { ty: t, expr } => {
                self.line(d, &format!("({t}){ty}"));
                self.expr(d + 1, expr);
            }
            ExprKind::Field { expr, field, arrow } => {
                let op = if *arrow { "->" } else { "." };
                self.line(d, &format!("{op}{field}{ty}"));
                self.expr(d + 1, expr);
            }
            ExprKind::TupleIndex { expr, index } => {
                self.line(d, &format!(".{index}{ty}"));
                self.expr(d + 1, expr);
            }
            ExprKind::Index { expr, index } => {
                self.line(d, &format!("[]{ty}"));
                self.expr(d + 1, expr);
                self.expr(d + 1, index);
            }
            ExprKind::Tuple(es) => {
                self.line(d, &format!("tuple:{ty}"));
                for x in es {
                    self.expr(d + 1, x);
                }
            }
            ExprKind::Record(fs) => {
                self.line(d, &format!("record:{ty}"));
                for (n, x) in fs {
                    self.line(d + 1, &format!("{n} ="));
                    self.expr(d + 2, x);
                }
            }
            ExprKind::Block(b) => {
                self.line(d, &format!("block{ty}"));
                self.block(d + 1, b);
            }
            ExprKind::Sizeof(arg) => {
                self.line(d, &format!("sizeof{ty}"));
                match arg {
                    SizeofArg::Type(t) => self.line(d + 1, &format!("type: {t}")),
                    SizeofArg::Expr(x) => self.expr(d + 1, x),
                }
            }
            ExprKind::Offsetof { ty: t, field } => {
                self.line(d, &format!("offsetof({t}, {}){ty}", field.join(".")))
            }
            ExprKind::Cflow(c) => {
                let elems: Vec<String> = c
                    .elems
                    .iter()
                    .map(|e| {
                        let names: Vec<String> = e.specs.iter().map(attach_text).collect();
                        match names.as_slice() {
                            [one] => one.clone(),
                            _ => format!("({})", names.join(" || ")),
                        }
                    })
                    .collect();
                let kw = if c.strict { "cflow_strict" } else { "cflow" };
                self.line(d, &format!("{kw}: {}{ty}", elems.join(", ")))
            }
        }
    }
}

/// The provider (alias resolved) and the fields as written.
pub fn attach_text(a: &AttachSpec) -> String {
    let mut s = a.provider.clone();
    for f in &a.fields {
        s.push(':');
        s.push_str(f);
    }
    if let Some((w, _)) = &a.within {
        s.push_str(" within ");
        s.push_str(w);
    }
    s
}
