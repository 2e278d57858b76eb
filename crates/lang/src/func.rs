//! User-defined functions (upstream's `fn name($a: type, ...): type { body }`).
//!
//! weft inlines a function at each call, in the expand stage, as it expands macros:
//! the call becomes a block expression that declares each parameter as a fresh
//! variable assigned from its argument (`let $a: int64 = ARG;`: by value, the
//! declared type checked by the checker), followed by the body with its variables
//! renamed apart from the caller's. A `return` becomes the value of the block it
//! ends; [`take`] rewrites each body once so that every `return` is in a tail
//! position:
//!
//! * `return E;` ends its block: the statements after it never run, so they go;
//! * an `if` with a `return` in a branch gets the statements after it copied into
//!   each branch that does not return, and becomes the block's value
//!   (`cond ? {then} : {else}`); a function returning `void` keeps the `if` as a
//!   statement;
//! * a `return` anywhere else (in a loop, in an expression) is a located error.
//!
//! A returned value is assigned to a variable of the declared type
//! ([`RETURN_VAR`]), so the checker says when its type does not fit.
//!
//! Recursion is followed [`MAX_RECURSION`] calls deep (less when a body calls itself
//! more than once: [`MAX_COPIES`] bounds the copies); the call one deeper becomes
//! a run-time error (`errorf`, located at the call) that stops the probe
//! (`__weft_stop`), so a deeper recursion never yields a value at all.

use std::collections::HashMap;

use crate::ast::*;
use crate::diag::{Diagnostic, Diags};

/// How many calls of one function may be active at once: a recursive call made
/// deeper stops the probe at run time with an error.
pub const MAX_RECURSION: usize = 16;

/// How many function bodies one call (not inside another function) may inline in
/// all (a function that calls itself twice doubles at each level).
pub const MAX_COPIES: u32 = 512;

/// The variable a `return`ed value is assigned to, before the function's name: the
/// checker names the function when the value's type does not fit.
pub const RETURN_VAR: &str = "__fn_return_of_";

/// A function, ready to be inlined.
#[derive(Clone, Debug)]
pub struct Func {
    pub def: FnDef,
    /// The body with every `return` rewritten into a value ([`tail`]): a block whose
    /// value is the result (`None` for a `void` function).
    pub inline: Block,
    /// How many calls of it may be active at once ([`MAX_RECURSION`], less for a
    /// body that calls itself more than once, so its copies stay within
    /// [`MAX_COPIES`]).
    pub max_depth: usize,
}

/// How deep recursion is followed for a body that calls itself `k` times: the
/// `1 + k + ... + k^(d-1)` copies of depth `d` must stay within [`MAX_COPIES`].
fn recursion_depth(k: usize) -> usize {
    if k <= 1 {
        return MAX_RECURSION;
    }
    let (mut d, mut level, mut total) = (1, 1usize, 1usize);
    while d < MAX_RECURSION {
        level = level.saturating_mul(k);
        total = total.saturating_add(level);
        if total > MAX_COPIES as usize {
            break;
        }
        d += 1;
    }
    d
}

/// Calls of `name` in a tree.
struct CallsOf<'a> {
    name: &'a str,
    count: usize,
}

impl VisitMut for CallsOf<'_> {
    fn expr(&mut self, e: &mut Expr) {
        if matches!(&e.kind, ExprKind::Call { name, .. } if name == self.name) {
            self.count += 1;
        }
        walk_expr(self, e);
    }
}

/// The program's functions, by name, each checked and rewritten once (errors in
/// source order). `macros` are the macro names (a function may not reuse one).
pub fn take(
    program: &Program,
    macros: &[(String, Span)],
    diags: &mut Diags,
) -> HashMap<String, Func> {
    let mut funcs: HashMap<String, Func> = HashMap::new();
    for item in &program.items {
        let Item::Fn(def) = item else { continue };
        if let Some(prev) = funcs.get(&def.name) {
            diags.push(
                Diagnostic::error(
                    def.name_span,
                    format!("function `{}` is defined twice", def.name),
                )
                .with_note(Some(prev.def.name_span), "first defined here"),
            );
            continue;
        }
        if let Some((_, at)) = macros.iter().find(|(n, _)| *n == def.name) {
            diags.push(
                Diagnostic::error(
                    def.name_span,
                    format!("function `{}` has the name of a macro", def.name),
                )
                .with_note(Some(*at), "the macro is defined here"),
            );
            continue;
        }
        if crate::builtins::function(&def.name).is_some() {
            diags.error(
                def.name_span,
                format!("function `{}` has the name of a builtin function", def.name),
            );
            continue;
        }
        let mut ok = true;
        for (i, p) in def.params.iter().enumerate() {
            if let Some(prev) = def.params[..i].iter().find(|q| q.name == p.name) {
                diags.push(
                    Diagnostic::error(p.span, format!("parameter `${}` is declared twice", p.name))
                        .with_note(Some(prev.span), "first declared here"),
                );
                ok = false;
            }
            if p.ty.base == TypeName::Void && p.ty.pointer == 0 {
                diags.error(
                    p.ty.span,
                    format!("parameter `${}` cannot be `void`", p.name),
                );
                ok = false;
            }
        }
        let mut tail = Tail {
            def,
            diags,
            falls_off: false,
        };
        let inline = tail.block(def.body.stmts.clone(), def.body.span);
        if tail.falls_off {
            let end = Span::new(def.body.span.end as usize - 1, def.body.span.end as usize);
            diags.push(
                Diagnostic::error(
                    end,
                    format!(
                        "function `{}` can reach its end without returning a value of type `{}`",
                        def.name, def.ret
                    ),
                )
                .with_note(Some(def.ret.span), "the result type is declared here"),
            );
            ok = false;
        }
        let mut stray = StrayReturns { found: Vec::new() };
        let mut copy = inline.clone();
        stray.block(&mut copy);
        for at in stray.found {
            diags.push(
                Diagnostic::error(
                    at,
                    format!(
                        "weft cannot return from function `{}` here: a `return` must end \
                         the function's body or a branch of an `if` (not a loop or an \
                         expression)",
                        def.name
                    ),
                )
                .with_help("keep the result in a variable and return it after the loop"),
            );
            ok = false;
        }
        if ok {
            let mut calls = CallsOf {
                name: &def.name,
                count: 0,
            };
            calls.block(&mut def.body.clone());
            let max_depth = recursion_depth(calls.count);
            let def = def.clone();
            funcs.insert(
                def.name.clone(),
                Func {
                    def,
                    inline,
                    max_depth,
                },
            );
        } else {
            // Known, so calls are not also reported as unknown; never inlined.
            funcs.insert(
                def.name.clone(),
                Func {
                    def: def.clone(),
                    inline: Block::default(),
                    max_depth: 0,
                },
            );
        }
    }
    funcs
}

/// Rewrites a function body so that each `return` is the value of the block it ends.
struct Tail<'a> {
    def: &'a FnDef,
    diags: &'a mut Diags,
    /// A path of a non-`void` function ends without `return`.
    falls_off: bool,
}

impl Tail<'_> {
    /// `stmts` as a block whose value is the function's result on every path (a
    /// `void` function's has none).
    fn block(&mut self, stmts: Vec<Stmt>, span: Span) -> Block {
        let mut out = Vec::new();
        let mut rest = stmts.into_iter();
        while let Some(s) = rest.next() {
            match s.kind {
                StmtKind::Return(v) => {
                    let value = self.returned(v, s.span);
                    return Block {
                        stmts: out,
                        value: value.map(Box::new),
                        span,
                    };
                }
                StmtKind::If {
                    cond,
                    then,
                    otherwise,
                } if returns(&then) || otherwise.as_ref().is_some_and(returns) => {
                    let after: Vec<Stmt> = rest.collect();
                    let then = self.branch(then, &after);
                    let otherwise = match otherwise {
                        Some(o) => self.branch(o, &after),
                        None => {
                            let span = after.last().map_or(s.span, |l| l.span);
                            self.block(after, span)
                        }
                    };
                    if self.def.is_void() {
                        out.push(Stmt {
                            kind: StmtKind::If {
                                cond,
                                then,
                                otherwise: Some(otherwise),
                            },
                            span: s.span,
                        });
                        return Block {
                            stmts: out,
                            value: None,
                            span,
                        };
                    }
                    let (ts, os) = (then.span, otherwise.span);
                    let value = Expr::new(
                        ExprKind::Ternary {
                            cond: Box::new(cond),
                            then: Box::new(Expr::new(ExprKind::Block(Box::new(then)), ts)),
                            otherwise: Box::new(Expr::new(
                                ExprKind::Block(Box::new(otherwise)),
                                os,
                            )),
                        },
                        s.span,
                    );
                    return Block {
                        stmts: out,
                        value: Some(Box::new(value)),
                        span,
                    };
                }
                // `{ ...; return x; }`: the statements after the block join it.
                StmtKind::Block(b) if returns(&b) => {
                    let mut stmts = b.stmts;
                    stmts.extend(rest);
                    let inner = self.block(stmts, b.span);
                    if self.def.is_void() {
                        out.push(Stmt {
                            kind: StmtKind::Block(inner),
                            span: s.span,
                        });
                        return Block {
                            stmts: out,
                            value: None,
                            span,
                        };
                    }
                    let value = Expr::new(ExprKind::Block(Box::new(inner)), s.span);
                    return Block {
                        stmts: out,
                        value: Some(Box::new(value)),
                        span,
                    };
                }
                kind => out.push(Stmt { kind, span: s.span }),
            }
        }
        if !self.def.is_void() {
            self.falls_off = true;
        }
        Block {
            stmts: out,
            value: None,
            span,
        }
    }

    /// A branch of an `if` that has a `return`, followed by what comes after it.
    fn branch(&mut self, b: Block, after: &[Stmt]) -> Block {
        let mut stmts = b.stmts;
        if let Some(v) = b.value {
            let span = v.span;
            stmts.push(Stmt {
                kind: StmtKind::Expr(*v),
                span,
            });
        }
        stmts.extend(after.iter().cloned());
        self.block(stmts, b.span)
    }

    /// `return [E]`: the function's result, assigned to a variable of its type.
    fn returned(&mut self, v: Option<Expr>, span: Span) -> Option<Expr> {
        let name = &self.def.name;
        match (v, self.def.is_void()) {
            (None, true) => None,
            (Some(e), true) => {
                self.diags.push(
                    Diagnostic::error(
                        e.span,
                        format!("function `{name}` returns `void`: `return` takes no value here"),
                    )
                    .with_note(Some(self.def.ret.span), "the result type is declared here"),
                );
                None
            }
            (None, false) => {
                self.diags.push(
                    Diagnostic::error(
                        span,
                        format!(
                            "function `{name}` must return a value of type `{}`",
                            self.def.ret
                        ),
                    )
                    .with_note(Some(self.def.ret.span), "the result type is declared here"),
                );
                None
            }
            (Some(e), false) => {
                let var = VarRef {
                    name: format!("{RETURN_VAR}{name}"),
                    span: e.span,
                    id: None,
                };
                let at = e.span;
                let block = Block {
                    stmts: vec![Stmt {
                        kind: StmtKind::Let {
                            var: var.clone(),
                            ty: Some(self.def.ret.clone()),
                            value: Some(e),
                        },
                        span,
                    }],
                    value: Some(Box::new(Expr::new(ExprKind::Var(var), at))),
                    span,
                };
                Some(Expr::new(ExprKind::Block(Box::new(block)), at))
            }
        }
    }
}

/// Whether a `return` statement is anywhere in `b`.
fn returns(b: &Block) -> bool {
    let mut s = StrayReturns { found: Vec::new() };
    s.block(&mut b.clone());
    !s.found.is_empty()
}

/// The `return` statements in a tree.
struct StrayReturns {
    found: Vec<Span>,
}

impl VisitMut for StrayReturns {
    fn block(&mut self, b: &mut Block) {
        for s in &b.stmts {
            if let StmtKind::Return(_) = s.kind {
                self.found.push(s.span);
            }
        }
        walk_block(self, b);
    }
}

/// The expression a call of `f` becomes when `f` already has `depth` calls active
/// ([`Func::max_depth`]): a located run-time error, then the probe stops.
pub fn too_deep(f: &FnDef, depth: usize, call: Span, diags: &mut Diags) -> Expr {
    let text = format!(
        "function `{}` recursed more than {depth} calls deep (weft inlines \
         functions); the probe stops here",
        f.name
    );
    let call_expr = |name: &str, args: Vec<Expr>| {
        Expr::new(
            ExprKind::Call {
                name: name.to_string(),
                name_span: call,
                args,
            },
            call,
        )
    };
    let report = Stmt {
        kind: StmtKind::Expr(call_expr(
            "errorf",
            vec![Expr::new(ExprKind::Str(text.into_bytes()), call)],
        )),
        span: call,
    };
    let stop = call_expr("__weft_stop", Vec::new());
    let value = if f.is_void() {
        None
    } else {
        let scalar = f.ret.pointer > 0
            || (f.ret.array.is_none()
                && matches!(f.ret.base, TypeName::Int { .. } | TypeName::Bool));
        if !scalar {
            diags.push(
                Diagnostic::error(
                    call,
                    format!(
                        "weft follows recursive calls only of functions that return an \
                         integer, a boolean or a pointer; `{}` returns `{}`",
                        f.name, f.ret
                    ),
                )
                .with_note(Some(f.name_span), "the function is defined here"),
            );
        }
        Some(Box::new(Expr::new(
            ExprKind::Cast {
                ty: f.ret.clone(),
                expr: Box::new(stop.clone()),
            },
            call,
        )))
    };
    let mut stmts = vec![report];
    if value.is_none() {
        stmts.push(Stmt {
            kind: StmtKind::Expr(stop),
            span: call,
        });
    }
    Expr::new(
        ExprKind::Block(Box::new(Block {
            stmts,
            value,
            span: call,
        })),
        call,
    )
}
