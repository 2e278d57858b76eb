//! `delete(@m[k, *])`: delete every entry whose key matches, `*` matching any value
//! of its element (upstream bpftrace). The statement becomes a loop over the map:
//!
//! ```text
//! delete(@m[10, *, $x]);
//! =>
//! { k#1 = 10; k#2 = $x;
//!   for (del#N : @m) { if (del#N.0.0 == k#1 && del#N.0.2 == k#2) { delete(@m[del#N.0]); } } }
//! ```
//!
//! The key expressions are evaluated once, before the loop, as upstream evaluates
//! them; deleting the entry a loop is on is what the map loop allows. A `*` anywhere
//! else is a located error.

use crate::ast::*;
use crate::diag::Diags;

/// Rewrites the wildcard deletes of every probe.
pub fn desugar(program: &mut Program, diags: &mut Diags) {
    let mut w = Wildcards { diags, counter: 0 };
    for item in &mut program.items {
        if let Item::Probe(p) = item {
            if let Some(pred) = &mut p.predicate {
                w.expr(pred);
            }
            w.block(&mut p.body);
        }
    }
}

struct Wildcards<'d> {
    diags: &'d mut Diags,
    counter: u32,
}

fn is_wildcard(e: &Expr) -> bool {
    matches!(&e.kind, ExprKind::Ident(n) if n == WILDCARD_KEY)
}

/// The map a `delete(@m[...])` statement with a `*` key deletes from.
fn wildcard_delete(s: &Stmt) -> Option<&MapRef> {
    let StmtKind::Expr(Expr {
        kind: ExprKind::Call { name, args, .. },
        ..
    }) = &s.kind
    else {
        return None;
    };
    let [Expr {
        kind: ExprKind::Map(m),
        ..
    }] = args.as_slice()
    else {
        return None;
    };
    (name == "delete" && m.keys.as_ref()?.iter().any(is_wildcard)).then_some(m)
}

impl Wildcards<'_> {
    fn fresh(&self, name: &str, span: Span) -> VarRef {
        VarRef {
            name: format!("{name}#{}", self.counter),
            span,
            id: None,
        }
    }

    /// The statements that replace `delete(@m[keys])`.
    fn rewrite(&mut self, m: &MapRef, span: Span) -> Stmt {
        self.counter += 1;
        let keys = m.keys.as_deref().unwrap_or(&[]);
        let e = |kind| Expr::new(kind, span);
        let entry = self.fresh("del", span);
        let key = || {
            e(ExprKind::TupleIndex {
                expr: Box::new(e(ExprKind::Var(entry.clone()))),
                index: 0,
            })
        };
        let mut stmts = Vec::new();
        let mut cond: Option<Expr> = None;
        for (i, k) in keys.iter().enumerate() {
            if is_wildcard(k) {
                continue;
            }
            let bound = VarRef {
                name: format!("k{i}#{}", self.counter),
                span: k.span,
                id: None,
            };
            stmts.push(Stmt {
                kind: StmtKind::Assign {
                    target: LValue::Var(bound.clone()),
                    op: None,
                    value: k.clone(),
                },
                span: k.span,
            });
            // One key is the entry's key itself; several are its tuple's elements.
            let element = if keys.len() == 1 {
                key()
            } else {
                e(ExprKind::TupleIndex {
                    expr: Box::new(key()),
                    index: i as u64,
                })
            };
            let eq = e(ExprKind::Binary {
                op: BinOp::Eq,
                lhs: Box::new(element),
                rhs: Box::new(e(ExprKind::Var(bound))),
            });
            cond = Some(match cond {
                None => eq,
                Some(c) => e(ExprKind::Binary {
                    op: BinOp::And,
                    lhs: Box::new(c),
                    rhs: Box::new(eq),
                }),
            });
        }
        let delete = Stmt {
            kind: StmtKind::Expr(e(ExprKind::Call {
                name: "delete".into(),
                name_span: span,
                args: vec![e(ExprKind::Map(MapRef {
                    keys: Some(vec![key()]),
                    ..m.clone()
                }))],
            })),
            span,
        };
        let block = |stmts| Block {
            stmts,
            value: None,
            span,
        };
        let body = match cond {
            None => delete,
            Some(cond) => Stmt {
                kind: StmtKind::If {
                    cond,
                    then: block(vec![delete]),
                    otherwise: None,
                },
                span,
            },
        };
        stmts.push(Stmt {
            kind: StmtKind::For {
                var: entry,
                iter: ForIter::Map(MapRef {
                    keys: None,
                    ..m.clone()
                }),
                body: block(vec![body]),
            },
            span,
        });
        Stmt {
            kind: StmtKind::Block(block(stmts)),
            span,
        }
    }
}

impl VisitMut for Wildcards<'_> {
    fn block(&mut self, b: &mut Block) {
        for s in &mut b.stmts {
            if let Some(m) = wildcard_delete(s) {
                let m = m.clone();
                *s = self.rewrite(&m, s.span);
            } else {
                walk_stmt(self, s);
            }
        }
        if let Some(e) = &mut b.value {
            self.expr(e);
        }
    }

    fn expr(&mut self, e: &mut Expr) {
        if is_wildcard(e) {
            self.diags.error(
                e.span,
                "a `*` key matches any value only in a statement `delete(@map[k1, *, ...])`",
            );
            return;
        }
        walk_expr(self, e);
    }
}
