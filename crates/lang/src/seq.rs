//! Sequence aspects (Arachne's `seq`), turned into ordinary probes before
//! anything else looks at them:
//!
//! ```text
//! seq acct[tid] {
//!     uprobe:./server:handle { $client = arg0; }
//!     tracepoint:syscalls:sys_exit_read { @bytes[$client] = sum(args.ret); }*
//!     uretprobe:./server:handle { }
//! }
//! ```
//!
//! An instance per key: the first step starts one (when none is live for its key),
//! each later step fires only when the instance is there (a `*` step any number of
//! times, zero too, until the step after it fires), and the last step ends it. The
//! instance's state is the hidden map `@__seq_NAME[KEY]`: the index of the next
//! step that must fire (the `*` steps right before it may fire too). Variables a
//! step binds and another step reads live in `@__seq_NAME_VAR[KEY]`. As maps, the
//! instances are shared by every process of the session and bounded by the map
//! size (a full map is counted and reported), and a step in the kernel reads what
//! user-space steps wrote for the same process. Hidden maps are not printed.
//!
//! A step's state change comes first in its advice (so `return` cannot skip it);
//! the last step's cleanup comes after its advice, which should not `return`.

use std::collections::BTreeSet;

use crate::ast::*;
use crate::cflow::thread as thread_value;
use crate::diag::{Diagnostic, Diags};

/// The prefix of the maps sequences keep their instances in (not printed).
pub const HIDDEN_PREFIX: &str = weft_ir::HIDDEN_MAP_PREFIX;

/// Replace each `seq` item by its steps, as probes.
pub fn desugar(program: &mut Program, diags: &mut Diags) {
    let mut out = Vec::with_capacity(program.items.len());
    for item in std::mem::take(&mut program.items) {
        match item {
            Item::Seq(s) => out.extend(steps(s, diags).into_iter().map(Item::Probe)),
            other => out.push(other),
        }
    }
    program.items = out;
}

fn steps(s: SeqBlock, diags: &mut Diags) -> Vec<Probe> {
    let n = s.steps.len();
    if n < 2 {
        diags.push(Diagnostic::error(
            s.name_span,
            format!(
                "seq `{}` needs at least two steps (a start and an end)",
                s.name
            ),
        ));
        return Vec::new();
    }
    if s.steps[0].star {
        diags.error(
            s.steps[0].probe.span,
            "the first step of a seq cannot repeat (`*`)",
        );
        return Vec::new();
    }
    if s.steps[n - 1].star {
        diags.error(
            s.steps[n - 1].probe.span,
            "the last step of a seq cannot repeat (`*`)",
        );
        return Vec::new();
    }
    // Variables one step binds and another reads.
    let mut bound = BTreeSet::new();
    let per_step: Vec<(BTreeSet<String>, BTreeSet<String>)> = s
        .steps
        .iter()
        .map(|st| {
            let mut v = Vars::default();
            let mut b = st.probe.body.clone();
            v.block(&mut b);
            if let Some(p) = &st.probe.predicate {
                v.expr(&mut p.clone());
            }
            (v.assigned, v.used)
        })
        .collect();
    // The timeout's advice reads the instance's variables too.
    let timeout_uses = match &s.timeout {
        Some((_, body, _)) => {
            let mut v = Vars::default();
            v.block(&mut body.clone());
            v.used
        }
        None => BTreeSet::new(),
    };
    for (i, (assigned, _)) in per_step.iter().enumerate() {
        for name in assigned {
            if timeout_uses.contains(name)
                || per_step
                    .iter()
                    .enumerate()
                    .any(|(j, (_, used))| j != i && used.contains(name))
            {
                bound.insert(name.clone());
            }
        }
    }
    let span = s.span;
    // Keyed by the thread without a timeout (nothing iterates the instances): the
    // state is the thread's own accumulator of a keyless sum, read and set in a load
    // and an add, not a map keyed by tid (a hash lookup per step).
    // Kernel steps cannot read a user-space thread's accumulator.
    let per_thread = matches!(&s.key.kind, ExprKind::Ident(k) if k == "tid")
        && s.timeout.is_none()
        && s.steps.iter().all(|st| {
            st.probe
                .attach
                .iter()
                .all(|a| !matches!(a.provider.as_str(), "tracepoint" | "kernel"))
        });
    let state = format!("{HIDDEN_PREFIX}{}", s.name);
    let started = format!("{HIDDEN_PREFIX}{}__t", s.name);
    let var_map = |v: &str| format!("{HIDDEN_PREFIX}{}_{v}", s.name);
    let mut probes = Vec::with_capacity(n);
    for step in s.steps {
        let mut p = step.probe;
        let key = s.key.clone();
        let mut rw = Rewrite {
            bound: &bound,
            map_of: &var_map,
            key: &key,
        };
        rw.block(&mut p.body);
        if let Some(pred) = &mut p.predicate {
            rw.expr(pred);
        }
        probes.push((p, step.star));
    }
    // The `*` flags, for each step's allowed states.
    let stars: Vec<bool> = probes.iter().map(|(_, st)| *st).collect();
    let mut out = Vec::with_capacity(n);
    for (j, (mut p, star)) in probes.into_iter().enumerate() {
        // Which states let step j fire: j, and those of the `*` steps right
        // before it (for the first step: no instance, which reads as 0).
        let mut allowed = vec![j as u64];
        let mut k = j;
        while k >= 2 && stars[k - 1] {
            k -= 1;
            allowed.push(k as u64);
        }
        let key = s.key.clone();
        let st = |key: &Expr| match per_thread {
            true => thread_value(&state, span),
            false => map_expr(&state, key.clone(), span),
        };
        // The predicate: the instance is where this step may fire.
        let mut cond: Option<Expr> = None;
        for a in &allowed {
            let e = binary(BinOp::Eq, st(&key), int(*a, span), span);
            cond = Some(match cond {
                None => e,
                Some(c) => binary(BinOp::Or, c, e, span),
            });
        }
        let cond = cond.expect("at least one allowed state");
        p.predicate = Some(match p.predicate.take() {
            None => cond,
            Some(orig) => binary(BinOp::And, cond, orig, span),
        });
        // The state change.
        let next = if j == n - 1 {
            None
        } else if star {
            // A `*` step right after a plain one leaves the state as it is.
            (allowed.len() > 1).then_some(j as u64)
        } else {
            Some(j as u64 + 1)
        };
        if let Some(v) = next {
            let set = match per_thread {
                true => set_thread_value(&state, v, span),
                false => assign_map(&state, key.clone(), int(v, span), span),
            };
            p.body.stmts.insert(0, set);
        }
        if j == 0 && s.timeout.is_some() {
            let now = Expr::new(ExprKind::Ident("nsecs".into()), span);
            p.body
                .stmts
                .insert(0, assign_map(&started, key.clone(), now, span));
        }
        if j == n - 1 {
            let end = Ending {
                state: &state,
                started: &started,
                bound: &bound,
                var_map: &var_map,
                timed: s.timeout.is_some(),
                per_thread,
            };
            p.body.stmts.extend(end.stmts(&key, span));
        }
        out.push(p);
    }
    if let Some((ns, body, tspan)) = s.timeout {
        let end = Ending {
            state: &state,
            started: &started,
            bound: &bound,
            var_map: &var_map,
            timed: true,
            per_thread: false,
        };
        out.push(timeout_probe(ns, body, tspan, &end));
    }
    out
}

/// What ends an instance: its state, start time and variables go.
struct Ending<'a> {
    state: &'a str,
    started: &'a str,
    bound: &'a BTreeSet<String>,
    var_map: &'a dyn Fn(&str) -> String,
    timed: bool,
    /// The state is the thread's own ([`thread_value`]).
    per_thread: bool,
}

impl Ending<'_> {
    fn stmts(&self, key: &Expr, span: Span) -> Vec<Stmt> {
        let mut out = vec![match self.per_thread {
            true => set_thread_value(self.state, 0, span),
            false => delete(self.state, key.clone(), span),
        }];
        if self.timed {
            out.push(delete(self.started, key.clone(), span));
        }
        for v in self.bound {
            out.push(delete(&(self.var_map)(v), key.clone(), span));
        }
        out
    }
}

/// `timeout D { advice }`: an interval probe (a quarter of D, 10 ms to 1 s) that
/// ends every instance started more than D ago, running the advice for it with
/// `$key` its key (and the instance's variables):
/// `for ($__seq_i : @started) { if (nsecs - $__seq_i.1 > D) { $key = $__seq_i.0; advice; end } }`.
fn timeout_probe(ns: u64, mut body: Block, span: Span, end: &Ending) -> Probe {
    let it = VarRef {
        name: "__seq_i".into(),
        span,
        id: None,
    };
    let field = |i: u64| {
        Expr::new(
            ExprKind::TupleIndex {
                expr: Box::new(Expr::new(ExprKind::Var(it.clone()), span)),
                index: i,
            },
            span,
        )
    };
    let key = field(0);
    let mut rw = Rewrite {
        bound: end.bound,
        map_of: end.var_map,
        key: &key,
    };
    rw.block(&mut body);
    let key_var = VarRef {
        name: "key".into(),
        span,
        id: None,
    };
    let mut stmts = vec![Stmt {
        kind: StmtKind::Assign {
            target: LValue::Var(key_var),
            op: None,
            value: key.clone(),
        },
        span,
    }];
    stmts.push(Stmt {
        kind: StmtKind::Block(body),
        span,
    });
    stmts.extend(end.stmts(&key, span));
    let now = Expr::new(ExprKind::Ident("nsecs".into()), span);
    let age = binary(BinOp::Sub, now, field(1), span);
    let stale = binary(BinOp::Gt, age, int(ns, span), span);
    let block = |stmts: Vec<Stmt>| Block {
        stmts,
        value: None,
        span,
    };
    let check = Stmt {
        kind: StmtKind::If {
            cond: stale,
            then: block(stmts),
            otherwise: None,
        },
        span,
    };
    let each = Stmt {
        kind: StmtKind::For {
            var: it,
            iter: ForIter::Map(MapRef {
                name: end.started.to_string(),
                name_span: span,
                keys: None,
                span,
            }),
            body: block(vec![check]),
        },
        span,
    };
    let period_ms = (ns / 4 / 1_000_000).clamp(10, 1000);
    Probe {
        advice: None,
        group: None,
        attach: vec![crate::parser::attach_spec(
            format!("interval:ms:{period_ms}"),
            span,
        )],
        predicate: None,
        body: block(vec![each]),
        span,
        hidden: false,
    }
}

/// Make this thread's value of the keyless sum map `name` be `v`:
/// `@name = sum(v - __weft_thread(@name))`.
fn set_thread_value(name: &str, v: u64, span: Span) -> Stmt {
    let delta = binary(BinOp::Sub, int(v, span), thread_value(name, span), span);
    crate::cflow::add(name, delta, span)
}

pub(crate) fn int(v: u64, span: Span) -> Expr {
    Expr::new(ExprKind::Int(v), span)
}

pub(crate) fn binary(op: BinOp, lhs: Expr, rhs: Expr, span: Span) -> Expr {
    Expr::new(
        ExprKind::Binary {
            op,
            lhs: Box::new(lhs),
            rhs: Box::new(rhs),
        },
        span,
    )
}

fn map_ref(name: &str, key: Expr, span: Span) -> MapRef {
    MapRef {
        name: name.to_string(),
        name_span: span,
        keys: Some(vec![key]),
        span,
    }
}

pub(crate) fn map_expr(name: &str, key: Expr, span: Span) -> Expr {
    Expr::new(ExprKind::Map(map_ref(name, key, span)), span)
}

pub(crate) fn assign_map(name: &str, key: Expr, value: Expr, span: Span) -> Stmt {
    Stmt {
        kind: StmtKind::Assign {
            target: LValue::Map(map_ref(name, key, span)),
            op: None,
            value,
        },
        span,
    }
}

pub(crate) fn delete(name: &str, key: Expr, span: Span) -> Stmt {
    Stmt {
        kind: StmtKind::Expr(Expr::new(
            ExprKind::Call {
                name: "delete".into(),
                name_span: span,
                args: vec![map_expr(name, key, span)],
            },
            span,
        )),
        span,
    }
}

/// The variables a step assigns and the ones it reads.
#[derive(Default)]
struct Vars {
    assigned: BTreeSet<String>,
    used: BTreeSet<String>,
}

impl VisitMut for Vars {
    fn expr(&mut self, e: &mut Expr) {
        if let ExprKind::Var(v) = &e.kind {
            self.used.insert(v.name.clone());
        }
        walk_expr(self, e);
    }
    fn block(&mut self, b: &mut Block) {
        for s in &b.stmts {
            match &s.kind {
                StmtKind::Assign {
                    target: LValue::Var(v),
                    op,
                    ..
                } => {
                    self.assigned.insert(v.name.clone());
                    if op.is_some() {
                        self.used.insert(v.name.clone());
                    }
                }
                StmtKind::Let { var, .. } => {
                    self.assigned.insert(var.name.clone());
                }
                _ => {}
            }
        }
        walk_block(self, b);
    }
}

/// Bound variables become the instance's maps.
struct Rewrite<'a> {
    bound: &'a BTreeSet<String>,
    map_of: &'a dyn Fn(&str) -> String,
    key: &'a Expr,
}

impl VisitMut for Rewrite<'_> {
    fn expr(&mut self, e: &mut Expr) {
        if let ExprKind::Var(v) = &e.kind {
            if self.bound.contains(&v.name) {
                e.kind = ExprKind::Map(map_ref(&(self.map_of)(&v.name), self.key.clone(), e.span));
                return;
            }
        }
        walk_expr(self, e);
    }
    fn block(&mut self, b: &mut Block) {
        for s in &mut b.stmts {
            let span = s.span;
            match &mut s.kind {
                StmtKind::Assign { target, .. } => {
                    if let LValue::Var(v) = target {
                        if self.bound.contains(&v.name) {
                            *target = LValue::Map(map_ref(
                                &(self.map_of)(&v.name),
                                self.key.clone(),
                                span,
                            ));
                        }
                    }
                }
                StmtKind::Let {
                    var,
                    value: Some(value),
                    ..
                } if self.bound.contains(&var.name) => {
                    let name = (self.map_of)(&var.name);
                    let value = value.clone();
                    s.kind = StmtKind::Assign {
                        target: LValue::Map(map_ref(&name, self.key.clone(), span)),
                        op: None,
                        value,
                    };
                }
                _ => {}
            }
        }
        walk_block(self, b);
    }
}
