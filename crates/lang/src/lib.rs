//! The weft language front end: script text → AST → checked AST →
//! [`weft_ir::Program`]. The language is bpftrace's (existing one-liners work
//! unchanged) with reserved syntax for aspect-oriented extensions.
//!
//! The pipeline is an ordered list of named stages ([`passes::PASSES`]):
//! [`parse`] → [`expand`] (macros) → [`check`] → [`lower`]. No stage stops at its
//! first error, and [`compile`] runs no stage after one that reported an error.
//! Diagnostics carry byte spans; [`render`] prints them like rustc.
//!
//! No IO: text in, program and diagnostics out.

pub mod ast;
pub mod builtins;
pub mod check;
pub mod diag;
pub mod dump;
pub mod expand;
pub use weft_ir::format;
pub mod lexer;
pub mod lower;
pub mod parser;
pub mod passes;
pub mod unsupported;

use std::sync::Arc;

pub use check::Checked;
pub use diag::{render, Diagnostic, Note, Severity};
pub use passes::{Stage, PASSES};

/// Finds the parameters of a probed function from debug info (implemented by the
/// CLI with DWARF). Used for `args.NAME`.
pub trait ArgsResolver {
    /// Parameter names and types of the function an attach point names, or `None`
    /// when there is no debug info for it.
    fn params(&self, attach: &weft_ir::AttachPoint) -> Option<Vec<(String, weft_ir::Type)>>;
}

/// Inputs of a compilation besides the text.
#[derive(Clone, Default)]
pub struct Options {
    /// Positional parameters: `$1` is `positional[0]`; `$#` is the count.
    pub positional: Vec<String>,
    /// Named parameters, for `getopt()`: `--NAME` is `(NAME, None)`, `--NAME=VALUE`
    /// is `(NAME, Some(VALUE))`; the last of a name counts.
    pub named: Vec<(String, Option<String>)>,
    /// Limits; a script's `config = { ... }` block overrides them.
    pub config: weft_ir::Config,
    /// `--unsafe`: allows `system()` and `signal()`.
    pub unsafe_ok: bool,
    /// Debug info for `args`; without it `args` is an error.
    pub args_resolver: Option<Arc<dyn ArgsResolver + Send + Sync>>,
    /// Stages whose result to dump into [`Output::dumps`].
    pub dump: Vec<Stage>,
}

impl std::fmt::Debug for Options {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Options")
            .field("positional", &self.positional)
            .field("named", &self.named)
            .field("config", &self.config)
            .field("unsafe_ok", &self.unsafe_ok)
            .field("args_resolver", &self.args_resolver.is_some())
            .field("dump", &self.dump)
            .finish()
    }
}

/// The result of [`compile`].
#[derive(Clone, Debug)]
pub struct Output {
    /// The probe program, when no stage reported an error.
    pub program: Option<weft_ir::Program>,
    /// Every diagnostic of the stages that ran, in stage order.
    pub diagnostics: Vec<Diagnostic>,
    /// The dumps asked for in [`Options::dump`], for the stages that ran.
    pub dumps: Vec<(Stage, String)>,
    /// The names `getopt()` reads, once the checker ran (so the caller can refuse a
    /// named parameter the program does not have).
    pub getopt_names: Vec<String>,
}

impl Output {
    pub fn has_errors(&self) -> bool {
        self.diagnostics.iter().any(Diagnostic::is_error)
    }
}

/// Stage 1: text to syntax tree.
pub fn parse(source: &str) -> (ast::Program, Vec<Diagnostic>) {
    parser::parse(source)
}

/// Stage 2: expand macro calls in place.
pub fn expand(program: &mut ast::Program) -> Vec<Diagnostic> {
    expand::expand(program)
}

/// Stage 3: names and types.
pub fn check(program: ast::Program, opts: &Options) -> (Checked, Vec<Diagnostic>) {
    check::check(program, opts)
}

/// Stage 4: checked tree to probe program.
pub fn lower(checked: &Checked) -> (weft_ir::Program, Vec<Diagnostic>) {
    lower::lower(checked)
}

/// The text dump of a stage's result (`weft trace -d ast|checked|program`).
pub enum Dumpable<'a> {
    Ast(&'a ast::Program),
    Checked(&'a Checked),
    Program(&'a weft_ir::Program),
}

pub fn dump(what: Dumpable<'_>) -> String {
    match what {
        Dumpable::Ast(p) => dump::program(p, false),
        Dumpable::Checked(c) => dump::program(&c.program, true),
        Dumpable::Program(p) => p.to_string(),
    }
}

/// Run every stage, stopping after the first that reports an error.
pub fn compile(source: &str, file: &str, opts: &Options) -> Output {
    let mut out = Output {
        program: None,
        diagnostics: Vec::new(),
        dumps: Vec::new(),
        getopt_names: Vec::new(),
    };
    let wants = |s: Stage| opts.dump.contains(&s);

    let (mut ast, diags) = parse(source);
    let failed = diags.iter().any(Diagnostic::is_error);
    out.diagnostics.extend(diags);
    if wants(Stage::Parse) {
        out.dumps.push((Stage::Parse, dump(Dumpable::Ast(&ast))));
    }
    if failed {
        return out;
    }

    let diags = expand(&mut ast);
    let failed = diags.iter().any(Diagnostic::is_error);
    out.diagnostics.extend(diags);
    if wants(Stage::Expand) {
        out.dumps.push((Stage::Expand, dump(Dumpable::Ast(&ast))));
    }
    if failed {
        return out;
    }

    let (mut checked, diags) = check(ast, opts);
    checked.origin = Some((file.to_string(), source.to_string()));
    out.getopt_names = checked.named.keys().cloned().collect();
    out.getopt_names.sort();
    let failed = diags.iter().any(Diagnostic::is_error);
    out.diagnostics.extend(diags);
    if wants(Stage::Check) {
        out.dumps
            .push((Stage::Check, dump(Dumpable::Checked(&checked))));
    }
    if failed {
        return out;
    }

    let (program, diags) = lower(&checked);
    let failed = diags.iter().any(Diagnostic::is_error);
    out.diagnostics.extend(diags);
    if wants(Stage::Lower) {
        out.dumps
            .push((Stage::Lower, dump(Dumpable::Program(&program))));
    }
    if !failed {
        out.program = Some(program);
    }
    out
}
