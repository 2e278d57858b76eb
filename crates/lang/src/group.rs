//! Groups of processes (Arachne's placement), turned into ordinary probes and maps
//! before anything else looks at them:
//!
//! ```text
//! group web = comm("nginx"), pid(4242);      // and -p web=123,456 on the command line
//! @web uprobe:libc:open { @opens[pid] = count(); }
//! uprobe:./lb:route /ingroup(web)/ { add(web, arg0); }
//! ```
//!
//! A group's members are the keys of the hidden map `@__group_NAME[pid]` (never
//! printed): a BEGIN probe puts in the pids the declaration and the command line
//! name (and `cpid` for `command`), `add(NAME, PID)` and `remove(NAME, PID)` are
//! writes to it, and `ingroup(NAME)` reads it for the current process (or tests
//! `comm` for a `comm("...")` member). The map lives in the session's shared segment,
//! so every member process sees the same set at once; the agent copies a member's
//! entry to its forked child inside `fork()` (the map is flagged for it by its
//! name, [`weft_ir::is_inherited_map`]), so a child is a member from its first
//! instruction. A probe placed with `@NAME` gets `ingroup(NAME)` in front of its
//! predicate.

use std::collections::{BTreeMap, HashSet};

use crate::ast::*;
use crate::diag::{suggest, Diagnostic, Diags};
use crate::seq::{assign_map, binary, delete, int, map_expr};

/// A group as declared: pids known now, `comm` names, whether the `-c` process is in.
#[derive(Default)]
struct Group {
    pids: Vec<u64>,
    comms: Vec<Vec<u8>>,
    command: bool,
    span: Span,
}

/// The map holding group `name`'s members.
pub fn map_name(name: &str) -> String {
    format!("{}{name}", weft_ir::GROUP_MAP_PREFIX)
}

/// Replace group declarations, placements and the group builtins; `cli` are the
/// groups named on the command line (`-p NAME=PID,...`), declared by that alone.
pub fn desugar(program: &mut Program, cli: &[(String, Vec<i32>)], diags: &mut Diags) {
    let mut groups: BTreeMap<String, Group> = BTreeMap::new();
    for (name, pids) in cli {
        let g = groups.entry(name.clone()).or_default();
        g.pids.extend(pids.iter().map(|&p| p as u64));
    }
    for item in &program.items {
        if let Item::Group(d) = item {
            let fresh = !groups.contains_key(&d.name);
            let g = groups.entry(d.name.clone()).or_default();
            if !fresh && g.span != Span::default() {
                diags.push(
                    Diagnostic::error(d.name_span, format!("group `{}` is declared twice", d.name))
                        .with_note(Some(g.span), "first declared here"),
                );
                continue;
            }
            g.span = d.name_span;
            for m in &d.members {
                member(m, g, diags);
            }
        }
    }
    let has_groups = !groups.is_empty();
    let uses = program.items.iter().any(|i| match i {
        Item::Probe(p) => p.group.is_some(),
        _ => false,
    });
    // A script's own function or macro named `add` (say) is not the builtin.
    let own: HashSet<String> = program
        .items
        .iter()
        .filter_map(|i| match i {
            Item::Fn(f) => Some(f.name.clone()),
            Item::Macro(m) => Some(m.name.clone()),
            _ => None,
        })
        .collect();
    if !has_groups && !uses && !mentions_group_builtins(program, &own) {
        return;
    }
    let mut rw = Rewrite {
        groups: &groups,
        own: &own,
        diags,
    };
    for item in &mut program.items {
        match item {
            Item::Probe(p) => rw.probe(p),
            Item::Seq(s) => {
                for st in &mut s.steps {
                    rw.probe(&mut st.probe);
                }
                if let Some((_, b, _)) = &mut s.timeout {
                    rw.block(b);
                }
            }
            _ => {}
        }
    }
    program.items.retain(|i| !matches!(i, Item::Group(_)));
    // The members known at the start, before any probe runs.
    let span = Span::default();
    let mut stmts = Vec::new();
    for (name, g) in &groups {
        let map = map_name(name);
        // Typed even when empty: pid 0 never runs a probe.
        stmts.push(assign_map(&map, int(0, span), int(0, span), span));
        for &p in &g.pids {
            stmts.push(assign_map(&map, int(p, span), int(1, span), span));
        }
        if g.command {
            let cpid = Expr::new(ExprKind::Ident("cpid".into()), span);
            stmts.push(assign_map(&map, cpid, int(1, span), span));
        }
    }
    if !stmts.is_empty() {
        program.items.insert(
            0,
            Item::Probe(Probe {
                advice: None,
                group: None,
                attach: vec![crate::parser::attach_spec("BEGIN".into(), span)],
                predicate: None,
                body: Block {
                    stmts,
                    value: None,
                    span,
                },
                span,
                // The group's state: it runs whatever --probe-filter picks.
                hidden: true,
            }),
        );
    }
}

fn member(m: &Expr, g: &mut Group, diags: &mut Diags) {
    match &m.kind {
        ExprKind::Ident(w) if w == "command" => g.command = true,
        ExprKind::Call { name, args, .. } if name == "comm" => match args.as_slice() {
            [Expr {
                kind: ExprKind::Str(s),
                ..
            }] => g.comms.push(s.clone()),
            _ => diags.error(
                m.span,
                "comm() in a group takes one string: comm(\"nginx\")",
            ),
        },
        ExprKind::Call { name, args, .. } if name == "pid" => {
            for a in args {
                match a.kind {
                    ExprKind::Int(p) if p > 0 && p <= i32::MAX as u64 => g.pids.push(p),
                    _ => diags.error(a.span, "pid() in a group takes process ids: pid(123, 456)"),
                }
            }
        }
        _ => diags.push(
            Diagnostic::error(
                m.span,
                "a group member is comm(\"NAME\"), pid(PID, ...) or command",
            )
            .with_help("e.g. `group web = comm(\"nginx\"), pid(4242);`"),
        ),
    }
}

fn mentions_group_builtins(program: &mut Program, own: &HashSet<String>) -> bool {
    struct Finder<'a>(bool, &'a HashSet<String>);
    impl VisitMut for Finder<'_> {
        fn expr(&mut self, e: &mut Expr) {
            if matches!(&e.kind, ExprKind::Call { name, .. }
                if is_group_builtin(name) && !self.1.contains(name))
            {
                self.0 = true;
            }
            walk_expr(self, e);
        }
    }
    let mut f = Finder(false, own);
    for item in &mut program.items {
        if let Item::Probe(p) = item {
            if let Some(pred) = &mut p.predicate {
                f.expr(pred);
            }
            f.block(&mut p.body);
        }
    }
    f.0
}

fn is_group_builtin(name: &str) -> bool {
    matches!(name, "ingroup" | "add" | "remove")
}

struct Rewrite<'a> {
    groups: &'a BTreeMap<String, Group>,
    /// The script's own functions and macros, which hide the group builtins.
    own: &'a HashSet<String>,
    diags: &'a mut Diags,
}

impl Rewrite<'_> {
    fn probe(&mut self, p: &mut Probe) {
        if let Some(pred) = &mut p.predicate {
            self.expr(pred);
        }
        self.block(&mut p.body);
        if let Some((name, span)) = p.group.take() {
            if let Some(test) = self.member_test(&name, span) {
                p.predicate = Some(match p.predicate.take() {
                    None => test,
                    Some(pred) => binary(BinOp::And, test, pred, span),
                });
            }
        }
    }

    /// `ingroup(NAME)` for the current process.
    fn member_test(&mut self, name: &str, span: Span) -> Option<Expr> {
        let Some(g) = self.groups.get(name) else {
            let mut msg = format!("unknown group `{name}`");
            if let Some(s) = suggest(name, self.groups.keys().map(String::as_str)) {
                msg = format!("{msg}; did you mean `{s}`?");
            }
            self.diags.push(Diagnostic::error(span, msg).with_help(
                "declare it (`group NAME = comm(\"x\"), pid(N);`) or name it with -p NAME=PID",
            ));
            return None;
        };
        let pid = Expr::new(ExprKind::Ident("pid".into()), span);
        let mut test = map_expr(&map_name(name), pid, span);
        for c in &g.comms {
            let comm = Expr::new(ExprKind::Ident("comm".into()), span);
            let eq = binary(
                BinOp::Eq,
                comm,
                Expr::new(ExprKind::Str(c.clone()), span),
                span,
            );
            test = binary(BinOp::Or, test, eq, span);
        }
        Some(test)
    }

    /// The group a builtin's first argument names.
    fn group_arg(&mut self, call: &str, args: &[Expr], span: Span, want: usize) -> Option<String> {
        match args {
            [Expr {
                kind: ExprKind::Ident(g),
                ..
            }, ..]
                if args.len() == want =>
            {
                Some(g.clone())
            }
            _ => {
                let form = if want == 1 {
                    format!("{call}(GROUP)")
                } else {
                    format!("{call}(GROUP, PID)")
                };
                self.diags
                    .error(span, format!("{call}() takes a group's name: {form}"));
                None
            }
        }
    }
}

impl VisitMut for Rewrite<'_> {
    fn expr(&mut self, e: &mut Expr) {
        walk_expr(self, e);
        let ExprKind::Call { name, args, .. } = &e.kind else {
            return;
        };
        if self.own.contains(name) {
            return;
        }
        match name.as_str() {
            "ingroup" => {
                let args = args.clone();
                if let Some(g) = self.group_arg("ingroup", &args, e.span, 1) {
                    if let Some(test) = self.member_test(&g, args[0].span) {
                        *e = test;
                    }
                }
            }
            "add" | "remove" => {
                self.diags.error(
                    e.span,
                    format!("{name}(GROUP, PID) is a statement, not a value"),
                );
            }
            _ => {}
        }
    }

    fn block(&mut self, b: &mut Block) {
        for s in &mut b.stmts {
            let StmtKind::Expr(Expr {
                kind: ExprKind::Call { name, args, .. },
                span,
                ..
            }) = &mut s.kind
            else {
                continue;
            };
            if name != "add" && name != "remove" || self.own.contains(name.as_str()) {
                continue;
            }
            let (name, span) = (name.clone(), *span);
            let args = std::mem::take(args);
            let Some(g) = self.group_arg(&name, &args, span, 2) else {
                continue;
            };
            if self.member_test(&g, args[0].span).is_none() {
                continue;
            }
            let map = map_name(&g);
            let pid = args.into_iter().nth(1).expect("two arguments");
            *s = if name == "add" {
                assign_map(&map, pid, int(1, span), span)
            } else {
                delete(&map, pid, span)
            };
        }
        walk_block(self, b);
    }
}
