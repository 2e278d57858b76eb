//! `watchpoint:FUNC+argN:LEN:MODE` and `asyncwatchpoint:FUNC+argN:LEN:MODE`
//! (upstream bpftrace): each time FUNC of the target program is entered, the address
//! in its argument N is watched, LEN bytes, for writes (`w`) or accesses (`rw`).
//! `unwatch(ADDR)` stops watching an address (before the advice goes on, where
//! upstream's is asynchronous). weft has the pieces: an address a map
//! holds is watched by `set:addr(@MAP, LEN)`, and a store to such a map waits until
//! the watch is armed there (so the access right after the store is seen: the
//! synchronous form; the asynchronous one gets the same). So:
//!
//! ```text
//! watchpoint:increment+arg1:4:w { BODY }
//! =>
//! uprobe:TARGET:increment { @__seq_watch0 = arg1; }       (hidden)
//! set:addr(@__seq_watch0, 4) { BODY }                     (`r`/`rw`: get:addr, every access for rw)
//!
//! unwatch(E);
//! =>
//! { $__weft_unwatch = E; if (@__seq_watch0 == $__weft_unwatch) { @__seq_watch0 = 0; } ... }
//! ```
//!
//! TARGET is the program `-c` runs or `-p` names (bpftrace: "a pid or command must
//! be provided for this form"). A wildcard FUNC shares one watch among the
//! functions it names: the one entered last binds it.

use crate::ast::*;
use crate::cflow::map_ref;
use crate::diag::Diags;

/// Hidden maps (never printed): `weft_ir::HIDDEN_MAP_PREFIX`'s.
const MAP_PREFIX: &str = "@__seq_watch";
const UNWATCH_VAR: &str = "$__weft_unwatch";

/// Rewrites the function-argument watchpoints and every `unwatch()`.
pub fn desugar(program: &mut Program, target: Option<&str>, diags: &mut Diags) {
    let mut maps: Vec<String> = Vec::new();
    let mut hidden = Vec::new();
    for item in &mut program.items {
        let Item::Probe(p) = item else { continue };
        let mut attach = Vec::new();
        for a in std::mem::take(&mut p.attach) {
            let Some((func, arg, len, mode)) = function_form(&a) else {
                // `asyncwatchpoint:ADDR:LEN:MODE` is a watchpoint (weft's are armed
                // before the access either way).
                let mut a = a;
                if a.provider == "asyncwatchpoint" {
                    a.provider = "watchpoint".into();
                }
                attach.push(a);
                continue;
            };
            let Some(target) = target else {
                diags.error(
                    a.span,
                    format!(
                        "`{}`: a watchpoint on a function's argument needs a target \
                         process (-p PID or -c CMD): the function is the target program's",
                        a.raw
                    ),
                );
                attach.push(a);
                continue;
            };
            let Some(arg) = arg else {
                diags.error(
                    a.span,
                    format!(
                        "invalid watchpoint `{}`: expected FUNCTION+argN:LENGTH:MODE, N from \
                         0 to 5",
                        a.raw
                    ),
                );
                attach.push(a);
                continue;
            };
            let map = format!("{MAP_PREFIX}{}", maps.len());
            maps.push(map.clone());
            hidden.push(bind_probe(target, func, arg, &map, a.span));
            // `probe` names it as upstream does: the program's path and the function.
            let name = format!("{}:{target}:{func}:{len}:{mode}", a.provider);
            let watched = |provider: &str| AttachSpec {
                provider: provider.to_string(),
                fields: vec![format!("addr({map}, {len})")],
                raw: name.clone(),
                span: a.span,
                within: None,
            };
            match mode {
                "w" => attach.push(watched("set")),
                // The checker reads the mode from the name: every access.
                "rw" | "wr" | "r" => attach.push(watched("get")),
                m => {
                    diags.error(
                        a.span,
                        format!(
                            "invalid watchpoint `{}`: mode `{m}` is not r, w or rw (x86 \
                             hardware watchpoints do not watch execution in weft; use uprobe)",
                            a.raw
                        ),
                    );
                    attach.push(a);
                }
            }
        }
        p.attach = attach;
    }
    // The binding probes run before the others at the same function (a watch the
    // entry arms is there for the body).
    let first = program
        .items
        .iter()
        .position(|i| matches!(i, Item::Probe(_)))
        .unwrap_or(program.items.len());
    for (k, p) in hidden.into_iter().enumerate() {
        program.items.insert(first + k, Item::Probe(p));
    }
    // `unwatch(E)`: every watched address a map holds (weft's own `set:addr`/`get:addr`
    // watches too) that equals E stops being watched.
    for item in &program.items {
        if let Item::Probe(p) = item {
            for a in &p.attach {
                if let Some(m) = addr_map(a) {
                    if !maps.contains(&m) {
                        maps.push(m);
                    }
                }
            }
        }
    }
    let mut u = Unwatch { maps: &maps };
    for item in &mut program.items {
        if let Item::Probe(p) = item {
            u.block(&mut p.body);
        }
    }
}

/// `watchpoint:FUNC+argN:LEN:MODE` (or `asyncwatchpoint:`): FUNC, N (None when not
/// 0..=5), LEN and MODE.
fn function_form(a: &AttachSpec) -> Option<(&str, Option<u8>, &str, &str)> {
    if a.provider != "watchpoint" && a.provider != "asyncwatchpoint" {
        return None;
    }
    let [place, len, mode] = a.fields.as_slice() else {
        return None;
    };
    let (func, arg) = place.rsplit_once('+')?;
    if func.is_empty() || crate::lexer::parse_int(place).is_ok() {
        return None;
    }
    let n = arg
        .strip_prefix("arg")
        .and_then(|n| n.parse::<u8>().ok())
        .filter(|&n| n <= 5);
    Some((func, n, len, mode))
}

/// The map of `set:addr(@MAP, N)` / `get:addr(@MAP, N)`.
fn addr_map(a: &AttachSpec) -> Option<String> {
    if a.provider != "set" && a.provider != "get" {
        return None;
    }
    let inner = a.fields.last()?.strip_prefix("addr(")?;
    let name = inner.split(',').next()?.trim();
    name.starts_with('@').then(|| name.to_string())
}

/// `uprobe:TARGET:FUNC { @MAP = argN; }`, hidden.
fn bind_probe(target: &str, func: &str, arg: u8, map: &str, span: Span) -> Probe {
    let attach = AttachSpec {
        provider: "uprobe".into(),
        fields: vec![target.to_string(), func.to_string()],
        raw: format!("uprobe:{target}:{func}"),
        span,
        within: None,
    };
    let store = Stmt {
        kind: StmtKind::Assign {
            target: LValue::Map(map_ref(map, span)),
            op: None,
            value: Expr::new(ExprKind::Ident(format!("arg{arg}")), span),
        },
        span,
    };
    Probe {
        advice: None,
        group: None,
        attach: vec![attach],
        predicate: None,
        body: Block {
            stmts: vec![store],
            value: None,
            span,
        },
        span,
        hidden: true,
    }
}

struct Unwatch<'a> {
    maps: &'a [String],
}

impl Unwatch<'_> {
    /// The statements `unwatch(e)` becomes.
    fn replacement(&self, e: Expr, span: Span) -> Block {
        let var = VarRef {
            name: UNWATCH_VAR.into(),
            span,
            id: None,
        };
        let mut stmts = vec![Stmt {
            kind: StmtKind::Assign {
                target: LValue::Var(var.clone()),
                op: None,
                value: e,
            },
            span,
        }];
        for m in self.maps {
            let cond = crate::seq::binary(
                BinOp::Eq,
                Expr::new(ExprKind::Map(map_ref(m, span)), span),
                Expr::new(ExprKind::Var(var.clone()), span),
                span,
            );
            // Address 0 disarms the watch; a store to a watched map waits until
            // weft has done it, so an access right after the unwatch is not seen.
            let delete = Stmt {
                kind: StmtKind::Assign {
                    target: LValue::Map(map_ref(m, span)),
                    op: None,
                    value: Expr::new(ExprKind::Int(0), span),
                },
                span,
            };
            stmts.push(Stmt {
                kind: StmtKind::If {
                    cond,
                    then: Block {
                        stmts: vec![delete],
                        value: None,
                        span,
                    },
                    otherwise: None,
                },
                span,
            });
        }
        Block {
            stmts,
            value: None,
            span,
        }
    }

    fn block(&mut self, b: &mut Block) {
        for s in &mut b.stmts {
            self.stmt(s);
        }
    }

    fn stmt(&mut self, s: &mut Stmt) {
        if let StmtKind::Expr(Expr {
            kind: ExprKind::Call { name, args, .. },
            span,
            ..
        }) = &mut s.kind
        {
            if name == "unwatch" && args.len() == 1 {
                let e = args.remove(0);
                s.kind = StmtKind::Block(self.replacement(e, *span));
                return;
            }
        }
        match &mut s.kind {
            StmtKind::If {
                then, otherwise, ..
            } => {
                self.block(then);
                if let Some(o) = otherwise {
                    self.block(o);
                }
            }
            StmtKind::Unroll { body, .. }
            | StmtKind::While { body, .. }
            | StmtKind::For { body, .. } => self.block(body),
            StmtKind::Block(b) => self.block(b),
            _ => {}
        }
    }
}
