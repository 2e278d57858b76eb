//! Control-flow pointcuts (Arachne's `controlflow`), turned into ordinary probes
//! and reads of per-thread state before the checker sees them:
//!
//! ```text
//! uprobe:./app:foo /cflow(uprobe:./app:zoo, uprobe:./app:bar, uprobe:./app:foo)/ { ... }
//! uprobe:./app:foo /cflow_strict(uprobe:./app:zoo, uprobe:./app:foo)/ { ... }
//! ```
//!
//! `cflow(P1, ..., Pn)` is true when the thread is inside Pn's function, which is
//! inside P(n-1)'s, ... inside P1's, other frames may lie between; `cflow_strict`
//! wants each called directly by the one before. An element is a function entry
//! (`uprobe:BIN:FUNC`) or a named pointcut (any of its functions).
//!
//! **State.** Hidden probes on each element's entry and return keep, per thread:
//! * `cflow`: a counter per level, `@__cflow_K_i`: level 1 counts the active frames
//!   of f1; level i the frames of fi entered while level i-1 was non-zero. At fi's
//!   return level i-1 has the value it had at fi's entry (frames return in LIFO
//!   order), so the same test decides whether to count down: no per-frame marks.
//!   `cflow(...)` is level n non-zero.
//! * `cflow_strict`: a bit stack per level from 2, `@__cflow_K_i`: at fi's entry
//!   the bit pushed says whether the return address lies in f(i-1)'s code and (for
//!   i > 2) that f(i-1) activation's own bit is set; its return pops it.
//!   `cflow_strict(...)` is level n's top bit. A stack holds 64 bits: in a
//!   recursion of fi deeper than 64 frames the bits of the frames below the 64
//!   innermost read as not chained once those return.
//!
//! The state lives in `sum()` maps without keys, whose per-thread accumulators a
//! thread reads with `__weft_thread(@m)` (one load: [`weft_ir::Inst::ThreadSum`])
//! and updates with `@m = sum(delta)` (one add). Hidden maps are not printed.
//!
//! **Order.** Advice at a site runs in program order, so the hidden entry probes go
//! before every other probe (innermost level first, so that a level reads the level
//! before it without the current activation when two levels are the same function)
//! and the hidden return probes after every other (outermost first, the reverse):
//! a probe on Pn's function, entry or return, sees the current call counted.
//!
//! **At Pn's own entry** (a probe whose only attach point is Pn, when no other
//! element can name the same function) the current call is inside the chain when
//! level n-1 is: `cflow` reads level n-1 and `cflow_strict` tests the return
//! address directly, and level n needs no probes of its own (unless another use
//! needs it). `cflow_strict` of two levels at the inner function's entry is then a
//! return-address test alone.
//!
//! **Where.** In BEGIN, END and interval probes (which run in weft, on no thread of
//! the target) `cflow` is false. Kernel probes cannot read it (an error).
//!
//! **Limits.** A frame whose return weft does not see (left by `longjmp`, unwound
//! by an exception, entered before the probes were woven, or beyond the shadow
//! stack) leaves its counts as they were. A tail call (`jmp`) to fi leaves no frame
//! of its caller: for `cflow_strict` fi is then called by its caller's caller. A
//! function's code, for `cflow_strict`, is its symbol's bytes: a call from a part
//! the compiler moved out of it (`f.cold`) is not from f.

use std::collections::HashMap;

use crate::ast::*;
use crate::diag::Diags;
use crate::pointcut::Pointcuts;
use crate::seq::{binary, int};

/// The prefix of the hidden maps (not printed).
pub const PREFIX: &str = weft_ir::CFLOW_MAP_PREFIX;

/// Replace every `cflow(...)` of the program's probes, adding the probes that keep
/// their state.
pub fn desugar(program: &mut Program, pc: &Pointcuts, diags: &mut Diags) {
    let mut cx = Desugar {
        pc,
        diags,
        chains: Vec::new(),
        by_key: HashMap::new(),
    };
    for item in &mut program.items {
        if let Item::Probe(p) = item {
            let site = ProbeSite::of(p);
            let mut v = Visit { cx: &mut cx, site };
            if let Some(pred) = &mut p.predicate {
                v.expr(pred);
            }
            v.block(&mut p.body);
        }
    }
    if cx.chains.is_empty() {
        return;
    }
    let (mut entries, mut returns) = (Vec::new(), Vec::new());
    for (k, c) in cx.chains.iter().enumerate().filter(|(_, c)| c.used) {
        c.probes(k, &mut entries, &mut returns);
    }
    let mut items: Vec<Item> = entries.into_iter().map(Item::Probe).collect();
    items.append(&mut program.items);
    items.extend(returns.into_iter().map(Item::Probe));
    program.items = items;
}

/// Where a `cflow` is evaluated.
#[derive(Clone)]
enum ProbeSite {
    /// BEGIN, END, interval: on weft's own thread.
    Local,
    /// A kernel probe.
    Kernel,
    /// A probe whose only attach point is a function's entry `(target, func)`.
    Entry(String, String),
    Other,
}

impl ProbeSite {
    fn of(p: &Probe) -> ProbeSite {
        let provs: Vec<&str> = p.attach.iter().map(|a| a.provider.as_str()).collect();
        if !provs.is_empty()
            && provs
                .iter()
                .all(|p| matches!(*p, "BEGIN" | "END" | "interval"))
        {
            return ProbeSite::Local;
        }
        if provs.iter().any(|p| matches!(*p, "tracepoint" | "kernel")) {
            return ProbeSite::Kernel;
        }
        match p.attach.as_slice() {
            [a] if a.provider == "uprobe" => match function(a) {
                Some((t, f)) if !f.contains('+') => ProbeSite::Entry(t, f),
                _ => ProbeSite::Other,
            },
            _ => ProbeSite::Other,
        }
    }
}

/// `(target, function)` of `uprobe:[BIN:][LANG:]FUNC`.
fn function(a: &AttachSpec) -> Option<(String, String)> {
    match a.fields.as_slice() {
        [f] => Some((String::new(), f.clone())),
        [t, f] | [t, _, f] => Some((t.clone(), f.clone())),
        _ => None,
    }
}

fn wild(name: &str) -> bool {
    name.contains(['*', '?', '['])
}

/// One control-flow pointcut (every `cflow` written the same way shares it).
struct Chain {
    strict: bool,
    /// Each level's functions, outermost first: `(spec, target, func)`.
    levels: Vec<Vec<(AttachSpec, String, String)>>,
    /// A use needs the innermost level's own state.
    inner: bool,
    /// Used in a probe that runs in the target (else it needs no state).
    used: bool,
    span: Span,
}

struct Desugar<'a> {
    pc: &'a Pointcuts,
    diags: &'a mut Diags,
    chains: Vec<Chain>,
    by_key: HashMap<(bool, Vec<Vec<String>>), usize>,
}

impl Desugar<'_> {
    /// Check a `cflow` and find (or make) its chain.
    fn chain(&mut self, c: &Cflow, span: Span) -> Option<usize> {
        let kw = if c.strict { "cflow_strict" } else { "cflow" };
        if c.elems.len() < 2 {
            self.diags.error(
                span,
                format!(
                    "{kw}() needs at least two functions, outermost first: \
                     {kw}(uprobe:BIN:OUTER, uprobe:BIN:INNER)"
                ),
            );
            return None;
        }
        let n = c.elems.len();
        let mut levels = Vec::with_capacity(n);
        let mut ok = true;
        for (i, e) in c.elems.iter().enumerate() {
            let mut level = Vec::new();
            for written in &e.specs {
                let Some(specs) = self.pc.resolve(written, true, self.diags) else {
                    ok = false;
                    continue;
                };
                for a in specs {
                    match self.element(&a, c.strict && i + 1 < n, kw) {
                        Ok((t, f)) => level.push((a, t, f)),
                        Err(msg) => {
                            // An element from a pointcut: point at its use too.
                            let mut d = crate::diag::Diagnostic::error(a.span, msg);
                            if a.span != e.span {
                                d = d.with_note(Some(e.span), "used here");
                            }
                            self.diags.push(d);
                            ok = false;
                        }
                    }
                }
            }
            levels.push(level);
        }
        if !ok {
            return None;
        }
        let key = (
            c.strict,
            levels
                .iter()
                .map(|l| l.iter().map(|(a, _, _)| a.raw.clone()).collect())
                .collect(),
        );
        if let Some(&k) = self.by_key.get(&key) {
            return Some(k);
        }
        self.chains.push(Chain {
            strict: c.strict,
            levels,
            inner: false,
            used: false,
            span,
        });
        self.by_key.insert(key, self.chains.len() - 1);
        Some(self.chains.len() - 1)
    }

    /// A `cflow` element's function, or why it cannot be one. `ranged`: its code
    /// range is compared with return addresses (`cflow_strict`, all but the last).
    fn element(&self, a: &AttachSpec, ranged: bool, kw: &str) -> Result<(String, String), String> {
        if a.provider != "uprobe" {
            return Err(format!(
                "`{}` in {kw}(): an element is a function's entry, uprobe:BIN:FUNC (weft \
                 follows its returns itself)",
                a.raw
            ));
        }
        let Some((t, f)) = function(a).filter(|(_, f)| !f.is_empty()) else {
            return Err(format!(
                "invalid attach point `{}`: expected uprobe:BIN:FUNC",
                a.raw
            ));
        };
        if f.contains('+') {
            return Err(format!(
                "`{}` in {kw}(): an element is a whole function, not an offset in it",
                a.raw
            ));
        }
        if ranged && wild(&f) {
            return Err(format!(
                "`{}` in {kw}(): the caller's code is compared with return addresses, so \
                 it names one function (no wildcards)",
                a.raw
            ));
        }
        Ok((t, f))
    }

    /// What a `cflow` of chain `k` reads, at `site`.
    fn value(&mut self, k: usize, site: &ProbeSite, span: Span) -> Expr {
        self.chains[k].used = true;
        let c = &self.chains[k];
        let n = c.levels.len();
        // At the innermost function's own entry, when no other level can be it.
        let own_entry = match (site, c.levels[n - 1].as_slice()) {
            (ProbeSite::Entry(t, f), [(_, lt, lf)]) => {
                t == lt
                    && f == lf
                    && !wild(f)
                    && c.levels[..n - 1]
                        .iter()
                        .flatten()
                        .all(|(_, _, g)| g != f && !wild(g))
            }
            _ => false,
        };
        if own_entry {
            return if c.strict {
                c.pushed(k, n, span)
            } else {
                nonzero(thread(&map_name(k, n - 1), span), span)
            };
        }
        self.chains[k].inner = true;
        if self.chains[k].strict {
            top_bit(&map_name(k, n), span)
        } else {
            nonzero(thread(&map_name(k, n), span), span)
        }
    }
}

/// The hidden map of level `i` (1-based) of chain `k`.
fn map_name(k: usize, i: usize) -> String {
    format!("{PREFIX}{k}_{i}")
}

impl Chain {
    /// At the entry of level `i`'s function (2 ≤ i): the bit its bit stack pushes,
    /// whether the caller is level i-1's function in a chained activation.
    fn pushed(&self, k: usize, i: usize, span: Span) -> Expr {
        let mut caller: Option<Expr> = None;
        for (_, t, f) in &self.levels[i - 2] {
            let call = Expr::new(
                ExprKind::Call {
                    name: "__weft_caller_in".into(),
                    name_span: span,
                    args: vec![string(t, span), string(f, span)],
                },
                span,
            );
            caller = Some(match caller {
                None => call,
                Some(c) => binary(BinOp::Or, c, call, span),
            });
        }
        let caller = caller.unwrap_or_else(|| Expr::new(ExprKind::Bool(false), span));
        if i == 2 {
            caller
        } else {
            binary(BinOp::And, caller, top_bit(&map_name(k, i - 1), span), span)
        }
    }

    /// The hidden probes of chain `k`: entries (innermost level first) and returns
    /// (outermost first).
    fn probes(&self, k: usize, entries: &mut Vec<Probe>, returns: &mut Vec<Probe>) {
        let span = self.span;
        let n = self.levels.len();
        let last = if self.inner { n } else { n - 1 };
        let first = if self.strict { 2 } else { 1 };
        let mut rets = Vec::new();
        for i in (first..=last).rev() {
            let map = map_name(k, i);
            let attach = |prov: &str| -> Vec<AttachSpec> {
                self.levels[i - 1]
                    .iter()
                    .map(|(a, _, _)| {
                        let mut a = a.clone();
                        a.provider = prov.to_string();
                        a.raw = crate::dump::attach_text(&a);
                        a
                    })
                    .collect()
            };
            let (entry, ret) = if self.strict {
                // push: st = st << 1 | bit; pop: st >>= 1 (as what the sum adds:
                // st + bit, (st >> 1) - st).
                let bit = Expr::new(
                    ExprKind::Ternary {
                        cond: Box::new(self.pushed(k, i, span)),
                        then: Box::new(int(1, span)),
                        otherwise: Box::new(int(0, span)),
                    },
                    span,
                );
                let st = || thread(&map, span);
                let push = binary(BinOp::Add, st(), bit, span);
                let half = binary(BinOp::Shr, st(), int(1, span), span);
                let pop = binary(BinOp::Sub, half, st(), span);
                ((None, add(&map, push, span)), (None, add(&map, pop, span)))
            } else {
                // Level 1 counts every frame; level i those inside level i-1.
                let inside = (i > 1).then(|| nonzero(thread(&map_name(k, i - 1), span), span));
                let down = match &inside {
                    Some(c) => c.clone(),
                    None => nonzero(thread(&map, span), span),
                };
                let minus_one = Expr::new(
                    ExprKind::Unary {
                        op: UnOp::Neg,
                        expr: Box::new(int(1, span)),
                    },
                    span,
                );
                (
                    (inside, add(&map, int(1, span), span)),
                    (Some(down), add(&map, minus_one, span)),
                )
            };
            entries.push(hidden_probe(attach("uprobe"), entry.0, entry.1, span));
            rets.push(hidden_probe(attach("uretprobe"), ret.0, ret.1, span));
        }
        rets.reverse();
        returns.extend(rets);
    }
}

fn hidden_probe(attach: Vec<AttachSpec>, predicate: Option<Expr>, stmt: Stmt, span: Span) -> Probe {
    Probe {
        advice: None,
        group: None,
        attach,
        predicate,
        body: Block {
            stmts: vec![stmt],
            value: None,
            span,
        },
        span,
        hidden: true,
    }
}

/// Replaces `cflow` expressions, knowing the probe they are in.
struct Visit<'a, 'b> {
    cx: &'a mut Desugar<'b>,
    site: ProbeSite,
}

impl VisitMut for Visit<'_, '_> {
    fn expr(&mut self, e: &mut Expr) {
        let ExprKind::Cflow(c) = &e.kind else {
            walk_expr(self, e);
            return;
        };
        let span = e.span;
        let Some(k) = self.cx.chain(c, span) else {
            e.kind = ExprKind::Bool(false);
            return;
        };
        let kw = if c.strict { "cflow_strict" } else { "cflow" };
        e.kind = match &self.site {
            ProbeSite::Kernel => {
                self.cx.diags.error(
                    span,
                    format!(
                        "{kw}() cannot be used in a kernel probe: it reads the state of the \
                         target's thread, which kernel probes do not run on"
                    ),
                );
                ExprKind::Bool(false)
            }
            // No thread of the target: never inside its functions.
            ProbeSite::Local => ExprKind::Bool(false),
            site => {
                let site = site.clone();
                self.cx.value(k, &site, span).kind
            }
        };
    }
}

// ---- building expressions -----------------------------------------------------

fn string(s: &str, span: Span) -> Expr {
    Expr::new(ExprKind::Str(s.as_bytes().to_vec()), span)
}

pub(crate) fn map_ref(name: &str, span: Span) -> MapRef {
    MapRef {
        name: name.to_string(),
        name_span: span,
        keys: None,
        span,
    }
}

/// This thread's value of hidden map `name`.
pub(crate) fn thread(name: &str, span: Span) -> Expr {
    Expr::new(
        ExprKind::Call {
            name: "__weft_thread".into(),
            name_span: span,
            args: vec![Expr::new(ExprKind::Map(map_ref(name, span)), span)],
        },
        span,
    )
}

fn nonzero(e: Expr, span: Span) -> Expr {
    binary(BinOp::Ne, e, int(0, span), span)
}

/// The top bit of bit stack `name`.
fn top_bit(name: &str, span: Span) -> Expr {
    nonzero(
        binary(BinOp::BitAnd, thread(name, span), int(1, span), span),
        span,
    )
}

/// `@name = sum(delta)`.
pub(crate) fn add(name: &str, delta: Expr, span: Span) -> Stmt {
    Stmt {
        kind: StmtKind::Assign {
            target: LValue::Map(map_ref(name, span)),
            op: None,
            value: Expr::new(
                ExprKind::Call {
                    name: "sum".into(),
                    name_span: span,
                    args: vec![delta],
                },
                span,
            ),
        },
        span,
    }
}
