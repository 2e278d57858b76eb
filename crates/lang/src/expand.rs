//! Macro expansion (bpftrace `macro name(params) { body }`): every call of a macro
//! is replaced by a block expression holding a copy of its body, with
//! * expression parameters (`x`) replaced by the argument expression,
//! * variable parameters (`$a`) renamed to the argument variable,
//! * map parameters (`@b`) renamed to the argument map,
//! * variables local to the body renamed so they cannot capture the caller's.
//!
//! Macros are hygienic: a body may use only the maps passed to it.

use std::collections::HashMap;

use crate::ast::*;
use crate::diag::{Diagnostic, Diags};

const MAX_DEPTH: u32 = 32;

/// How tall (in expressions and blocks) a probe may be after expansion. The parser
/// keeps what is written within [`crate::parser::MAX_NESTING`] levels; nested macro
/// calls can stack bodies deeper, and every later stage walks the tree
/// recursively, so a taller tree is refused here instead of overflowing a stack.
pub const MAX_HEIGHT: u32 = 4 * crate::parser::MAX_NESTING;

pub fn expand(program: &mut Program) -> Vec<Diagnostic> {
    let mut macros = HashMap::new();
    let mut diags = Diags::default();
    // Named pointcuts are replaced where probes name them (errors in source order).
    let pointcuts = crate::pointcut::Pointcuts::take(program, &mut diags);
    crate::pointcut::substitute(program, &pointcuts, &mut diags);
    diags.list.sort_by_key(|d| d.span.start);
    // Sequence aspects become ordinary probes first (their bodies may call macros).
    crate::seq::desugar(program, &mut diags);
    for item in &program.items {
        if let Item::Macro(m) = item {
            if let Some(prev) = macros.insert(m.name.clone(), m.clone()) {
                diags.push(
                    Diagnostic::error(m.name_span, format!("macro `{}` is defined twice", m.name))
                        .with_note(Some(prev.name_span), "first defined here"),
                );
            }
        }
    }
    // Check hygiene once per definition.
    for m in macros.values() {
        let params: Vec<&str> = m
            .params
            .iter()
            .filter_map(|p| match p {
                MacroParam::Map(n, _) => Some(n.as_str()),
                _ => None,
            })
            .collect();
        let mut body = m.body.clone();
        let mut maps = MapCollector { found: Vec::new() };
        maps.block(&mut body);
        for (name, span) in maps.found {
            if !params.contains(&name.as_str()) {
                diags.push(
                    Diagnostic::error(
                        span,
                        format!(
                            "macro `{}` uses map `{name}`, which is not one of its parameters",
                            m.name
                        ),
                    )
                    .with_help(format!("pass the map in: `macro {}(..., {name})`", m.name)),
                );
            }
        }
    }
    let mut macro_names: Vec<(String, Span)> = macros
        .values()
        .map(|m| (m.name.clone(), m.name_span))
        .collect();
    macro_names.sort_by_key(|(_, at)| at.start);
    let funcs = crate::func::take(program, &macro_names, &mut diags);
    let mut ex = Expander {
        macros,
        funcs,
        active: Vec::new(),
        copies: 0,
        diags,
        counter: 0,
        depth: 0,
    };
    for item in &mut program.items {
        match item {
            Item::Probe(p) => {
                if let Some(pred) = &mut p.predicate {
                    ex.expr(pred);
                }
                ex.block(&mut p.body);
            }
            Item::Reserved(r) => {
                for i in &mut r.items {
                    if let Item::Probe(p) = i {
                        ex.block(&mut p.body);
                    }
                }
            }
            _ => {}
        }
    }
    // `delete(@m[k, *])` (also from macros) becomes a loop over the map.
    crate::wildcard::desugar(program, &mut ex.diags);
    // Control-flow pointcuts (also those macros brought in) read state that
    // probes added here keep.
    crate::cflow::desugar(program, &pointcuts, &mut ex.diags);
    let mut height = Height {
        depth: 0,
        found: None,
    };
    for item in &mut program.items {
        if let Item::Probe(p) = item {
            if let Some(pred) = &mut p.predicate {
                height.expr(pred);
            }
            height.block(&mut p.body);
        }
        if let Some(at) = height.found.take() {
            ex.diags.error(
                at,
                format!(
                    "expanding macros here nests the program too deeply (more than \
                     {MAX_HEIGHT} levels of expressions and blocks)"
                ),
            );
            break;
        }
    }
    ex.diags.list
}

/// A call of a macro or function (`what`) with the wrong number of arguments.
fn arity(what: &str, name: &str, want: usize, got: usize, at: Span, def: Span) -> Diagnostic {
    Diagnostic::error(
        at,
        format!("{what} `{name}` takes {want} argument(s) but {got} were given"),
    )
    .with_note(Some(def), format!("the {what} is defined here"))
}

/// Finds the first node deeper than [`MAX_HEIGHT`] without going deeper itself.
struct Height {
    depth: u32,
    found: Option<Span>,
}

impl Height {
    fn enter(&mut self, span: Span) -> bool {
        if self.found.is_some() {
            return false;
        }
        if self.depth >= MAX_HEIGHT {
            self.found = Some(span);
            return false;
        }
        self.depth += 1;
        true
    }
}

impl VisitMut for Height {
    fn expr(&mut self, e: &mut Expr) {
        if self.enter(e.span) {
            walk_expr(self, e);
            self.depth -= 1;
        }
    }
    fn block(&mut self, b: &mut Block) {
        if self.enter(b.span) {
            walk_block(self, b);
            self.depth -= 1;
        }
    }
}

struct MapCollector {
    found: Vec<(String, Span)>,
}

impl VisitMut for MapCollector {
    fn map(&mut self, m: &mut MapRef) {
        self.found.push((m.name.clone(), m.name_span));
        walk_map(self, m);
    }
}

struct Expander {
    macros: HashMap<String, MacroDef>,
    funcs: HashMap<String, crate::func::Func>,
    /// The functions being inlined, outermost first (a recursive one is there
    /// more than once).
    active: Vec<String>,
    /// Function bodies inlined for the current outermost call (see
    /// [`crate::func::MAX_COPIES`]).
    copies: u32,
    diags: Diags,
    counter: u32,
    depth: u32,
}

impl VisitMut for Expander {
    fn expr(&mut self, e: &mut Expr) {
        walk_expr(self, e);
        if let ExprKind::Call {
            name, name_span, ..
        } = &e.kind
        {
            if self.funcs.contains_key(name) && !self.macros.contains_key(name) {
                let (name, at) = (name.clone(), *name_span);
                self.call_fn(e, &name, at);
                return;
            }
        }
        let (name, args, span) = match &e.kind {
            ExprKind::Call {
                name,
                args,
                name_span,
            } if self.macros.contains_key(name) => (name.clone(), args.clone(), *name_span),
            ExprKind::Ident(name) if self.macros.get(name).is_some_and(|m| m.params.is_empty()) => {
                (name.clone(), Vec::new(), e.span)
            }
            _ => return,
        };
        if self.depth >= MAX_DEPTH {
            self.diags.error(
                span,
                format!("macro `{name}` expands too deeply (recursive macro?)"),
            );
            return;
        }
        let m = self.macros[&name].clone();
        if m.params.len() != args.len() {
            self.diags.push(arity(
                "macro",
                &name,
                m.params.len(),
                args.len(),
                e.span,
                m.name_span,
            ));
            return;
        }
        self.counter += 1;
        let mut sub = Substitute::new(self.counter);
        for (p, a) in m.params.iter().zip(args) {
            match p {
                MacroParam::Expr(n, _) => {
                    sub.exprs.insert(n.clone(), a);
                }
                MacroParam::Var(n, _) => match &a.kind {
                    ExprKind::Var(v) => {
                        sub.vars.insert(n.clone(), v.name.clone());
                    }
                    // Any other expression stands in for the parameter where it is
                    // read, evaluated at each use (upstream's macros substitute it).
                    _ => {
                        sub.var_exprs.insert(n.clone(), a);
                    }
                },
                MacroParam::Map(n, _) => match &a.kind {
                    ExprKind::Map(MapRef {
                        name: mn,
                        keys: None,
                        ..
                    }) => {
                        sub.maps.insert(n.clone(), mn.clone());
                    }
                    _ => self.diags.push(
                        Diagnostic::error(
                            a.span,
                            format!("macro `{name}` expects a map (without keys) for `{n}`"),
                        )
                        .with_note(Some(m.name_span), "the macro is defined here"),
                    ),
                },
            }
        }
        let mut body = m.body.clone();
        sub.block(&mut body);
        let mut expanded = Expr::new(ExprKind::Block(Box::new(body)), e.span);
        self.depth += 1;
        self.expr(&mut expanded);
        self.depth -= 1;
        *e = expanded;
    }
}

impl Expander {
    /// A call of a user-defined function becomes a block expression: the
    /// parameters declared from the arguments, then the rewritten body
    /// ([`crate::func`]).
    fn call_fn(&mut self, e: &mut Expr, name: &str, name_span: Span) {
        let ExprKind::Call { args, .. } = &mut e.kind else {
            return;
        };
        let f = &self.funcs[name];
        let def = f.def.clone();
        if def.params.len() != args.len() {
            self.diags.push(arity(
                "function",
                name,
                def.params.len(),
                args.len(),
                e.span,
                def.name_span,
            ));
            return;
        }
        let depth = f.max_depth;
        if self.active.iter().filter(|n| *n == name).count() >= depth {
            *e = crate::func::too_deep(&def, depth, e.span, &mut self.diags);
            return;
        }
        if self.active.is_empty() {
            self.copies = 0;
        }
        self.copies += 1;
        if self.copies == crate::func::MAX_COPIES + 1 {
            self.diags.error(
                name_span,
                format!(
                    "inlining the calls here takes more than {} copies of function bodies \
                     (weft inlines functions, and follows recursion {} calls deep)",
                    crate::func::MAX_COPIES,
                    crate::func::MAX_RECURSION
                ),
            );
        }
        if self.copies > crate::func::MAX_COPIES {
            return;
        }
        if self.depth >= MAX_DEPTH + crate::func::MAX_RECURSION as u32 {
            self.diags.error(
                name_span,
                format!("function `{name}` is called too deeply nested in other calls"),
            );
            return;
        }
        self.counter += 1;
        let mut sub = Substitute::new(self.counter);
        let mut body = f.inline.clone();
        sub.block(&mut body);
        // By value: each parameter a fresh variable of its declared type.
        let mut stmts = Vec::with_capacity(def.params.len() + body.stmts.len());
        for (p, a) in def.params.iter().zip(std::mem::take(args)) {
            let span = a.span;
            stmts.push(Stmt {
                kind: StmtKind::Let {
                    var: VarRef {
                        name: format!("{}{}", p.name, sub.suffix),
                        span: p.span,
                        id: None,
                    },
                    ty: Some(p.ty.clone()),
                    value: Some(a),
                },
                span,
            });
        }
        stmts.append(&mut body.stmts);
        let block = Block {
            stmts,
            value: body.value,
            span: e.span,
        };
        let mut expanded = Expr::new(ExprKind::Block(Box::new(block)), e.span);
        self.active.push(name.to_string());
        self.depth += 1;
        self.expr(&mut expanded);
        self.depth -= 1;
        self.active.pop();
        *e = expanded;
    }
}

struct Substitute {
    exprs: HashMap<String, Expr>,
    vars: HashMap<String, String>,
    /// `$param`s given an expression that is not a variable: the expression.
    var_exprs: HashMap<String, Expr>,
    maps: HashMap<String, String>,
    suffix: String,
}

impl Substitute {
    /// Nothing substituted yet; local names get the suffix `#n`.
    fn new(n: u32) -> Substitute {
        Substitute {
            exprs: HashMap::new(),
            vars: HashMap::new(),
            var_exprs: HashMap::new(),
            maps: HashMap::new(),
            suffix: format!("#{n}"),
        }
    }
}

impl VisitMut for Substitute {
    fn expr(&mut self, e: &mut Expr) {
        let given = match &e.kind {
            ExprKind::Ident(n) => self.exprs.get(n),
            ExprKind::Var(v) => self.var_exprs.get(&v.name),
            _ => None,
        };
        if let Some(a) = given {
            *e = a.clone();
            return;
        }
        walk_expr(self, e);
    }
    fn var(&mut self, v: &mut VarRef) {
        match self.vars.get(&v.name) {
            Some(n) => v.name = n.clone(),
            None => v.name = format!("{}{}", v.name, self.suffix),
        }
    }
    fn map(&mut self, m: &mut MapRef) {
        if let Some(n) = self.maps.get(&m.name) {
            m.name = n.clone();
        }
        walk_map(self, m);
    }
}

/// Names of defined macros (for suggestions when a call is unknown).
pub fn macro_names(program: &Program) -> Vec<String> {
    program
        .items
        .iter()
        .filter_map(|i| match i {
            Item::Macro(m) => Some(m.name.clone()),
            _ => None,
        })
        .collect()
}
