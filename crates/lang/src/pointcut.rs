//! Named pointcuts (KLAS's reuse of a pointcut, `ip_input || tcp_input`):
//!
//! ```text
//! pointcut net = uprobe:./server:ip_input, uprobe:./server:tcp_input;
//! net { @[probe] = count(); }
//! net, uprobe:./server:udp_input /pid == 42/ { ... }
//! uprobe:./server:deliver /cflow(net, uprobe:./server:deliver)/ { ... }
//! ```
//!
//! A definition names a list of attach points; its name stands for them wherever an
//! attach point may be written (a probe's list, alone or among others, a `seq`
//! step, a `cflow` element). A definition may use the names defined before it. The
//! expand stage replaces every use by the definition's attach points, which keep
//! their own spans (an error about one points at the definition).

use std::collections::HashMap;

use crate::ast::*;
use crate::diag::{suggest, Diagnostic, Diags};
use crate::parser::attach_spec;

/// The providers (and their aliases) a pointcut may not be named after.
const PROVIDERS: &[&str] = &[
    "BEGIN",
    "END",
    "uprobe",
    "uretprobe",
    "usdt",
    "interval",
    "profile",
    "kprobe",
    "kretprobe",
    "kfunc",
    "kretfunc",
    "fentry",
    "fexit",
    "tracepoint",
    "kernel",
    "rawtracepoint",
    "software",
    "hardware",
    "watchpoint",
    "asyncwatchpoint",
    "iter",
    "self",
    "call",
    "get",
    "set",
];

/// The program's pointcut definitions, by name.
#[derive(Default)]
pub struct Pointcuts {
    defs: HashMap<String, (Vec<AttachSpec>, Span)>,
    /// Names in definition order (for messages).
    order: Vec<String>,
}

/// Whether `a` is written as a bare name (no `:`), which a pointcut may be.
fn bare(a: &AttachSpec) -> bool {
    a.fields.is_empty() && !matches!(a.provider.as_str(), "BEGIN" | "END")
}

impl Pointcuts {
    /// Take the program's definitions out of it (reporting a name defined twice,
    /// one that is a probe type, and unknown names in the definitions).
    pub fn take(program: &mut Program, diags: &mut Diags) -> Pointcuts {
        let mut pc = Pointcuts::default();
        let mut rest = Vec::with_capacity(program.items.len());
        for item in std::mem::take(&mut program.items) {
            let Item::Pointcut(def) = item else {
                rest.push(item);
                continue;
            };
            if let Some((_, first)) = pc.defs.get(&def.name) {
                diags.push(
                    Diagnostic::error(
                        def.name_span,
                        format!("pointcut `{}` is defined twice", def.name),
                    )
                    .with_note(Some(*first), "first defined here"),
                );
                continue;
            }
            let as_provider = attach_spec(def.name.clone(), def.name_span).provider;
            if PROVIDERS.contains(&as_provider.as_str()) {
                diags.error(
                    def.name_span,
                    format!(
                        "pointcut `{}` has the name of a probe type: choose another name",
                        def.name
                    ),
                );
                continue;
            }
            let attach = pc.expand_list(&def.attach, diags);
            pc.order.push(def.name.clone());
            pc.defs.insert(def.name, (attach, def.name_span));
        }
        program.items = rest;
        pc
    }

    pub fn is_empty(&self) -> bool {
        self.defs.is_empty()
    }

    /// The attach points `a` stands for: itself, or a pointcut's. `None`: a bare
    /// name that is no pointcut (reported) when the program has pointcuts, or
    /// `in_cflow`, where only function entries and pointcuts may be written.
    pub fn resolve(
        &self,
        a: &AttachSpec,
        in_cflow: bool,
        diags: &mut Diags,
    ) -> Option<Vec<AttachSpec>> {
        if !bare(a) {
            return Some(vec![a.clone()]);
        }
        if let Some((specs, _)) = self.defs.get(&a.raw) {
            return Some(specs.clone());
        }
        if self.defs.is_empty() && !in_cflow {
            // The checker says what an unknown probe type is.
            return Some(vec![a.clone()]);
        }
        let mut d = Diagnostic::error(a.span, format!("unknown pointcut `{}`", a.raw));
        match suggest(&a.raw, self.order.iter().map(String::as_str)) {
            Some(s) => d.message = format!("{}; did you mean `{s}`?", d.message),
            None if self.order.is_empty() => {
                d = d.with_help("define it first: `pointcut NAME = uprobe:BIN:FUNC, ...;`")
            }
            None => d = d.with_help(format!("the pointcuts are: {}", self.order.join(", "))),
        }
        diags.push(d);
        None
    }

    /// A list of attach points with the pointcuts in it replaced.
    pub fn expand_list(&self, list: &[AttachSpec], diags: &mut Diags) -> Vec<AttachSpec> {
        let mut out = Vec::with_capacity(list.len());
        for a in list {
            if let Some(specs) = self.resolve(a, false, diags) {
                out.extend(specs);
            }
        }
        out
    }
}

/// Replace the pointcuts used in probes' attach lists (top-level probes, `seq`
/// steps, reserved blocks). `cflow` elements are replaced by [`crate::cflow`].
pub fn substitute(program: &mut Program, pc: &Pointcuts, diags: &mut Diags) {
    fn probe(p: &mut Probe, pc: &Pointcuts, diags: &mut Diags) {
        p.attach = pc.expand_list(&p.attach, diags);
    }
    fn items(list: &mut [Item], pc: &Pointcuts, diags: &mut Diags) {
        for item in list {
            match item {
                Item::Probe(p) => probe(p, pc, diags),
                Item::Seq(s) => {
                    for st in &mut s.steps {
                        probe(&mut st.probe, pc, diags);
                    }
                }
                Item::Reserved(r) => items(&mut r.items, pc, diags),
                _ => {}
            }
        }
    }
    items(&mut program.items, pc, diags);
}
