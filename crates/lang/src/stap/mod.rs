//! `weft stap`: SystemTap scripts on weft's engine. A second front end: the `.stp`
//! text is parsed ([`syntax`]) and translated ([`translate`]) into the same syntax
//! tree the bpftrace parser produces, with spans into the `.stp` text; from there
//! the pipeline is the bpftrace one (expand, check, lower), so the engine, the
//! printer and everything after are shared.

pub mod syntax;
pub mod translate;

use std::sync::Arc;

use crate::{Output, Stage};

/// The SDT notes of a program (implemented by the CLI over its ELF notes), for
/// `process.mark("*")`.
pub trait MarkResolver {
    /// Every `(provider, name)` of the binary's SDT notes.
    fn marks(&self, binary: &str) -> Result<Vec<(String, String)>, String>;
}

/// What a SystemTap script is run against.
#[derive(Clone, Default)]
pub struct StapOptions {
    /// `-x PID`: `target()`.
    pub target_pid: Option<i32>,
    /// `-c CMD` given: `target()` is the command's pid (`cpid`).
    pub command: bool,
    /// The target's program, for `process.function(...)` and `process.mark(...)`
    /// without a path.
    pub target_binary: Option<String>,
    pub marks: Option<Arc<dyn MarkResolver + Send + Sync>>,
}

/// Run every stage on a SystemTap script, as [`crate::compile`] does on bpftrace's.
/// `Stage::Parse`'s dump is the translated tree. The probes of
/// `scheduler.cpu_on` run for every process (their event is in the context of the
/// task leaving the CPU): [`weft_ir::Probe::system`].
pub fn compile(source: &str, file: &str, opts: &crate::Options, sopts: &StapOptions) -> Output {
    let mut out = Output {
        program: None,
        diagnostics: Vec::new(),
        dumps: Vec::new(),
        getopt_names: Vec::new(),
    };
    let script = match syntax::parse(source) {
        Ok(s) => s,
        Err(d) => {
            out.diagnostics.push(d);
            return out;
        }
    };
    let (ast, diags, system) = translate::translate(&script, opts, sopts);
    let failed = diags.iter().any(crate::Diagnostic::is_error);
    out.diagnostics.extend(diags);
    if opts.dump.contains(&Stage::Parse) {
        out.dumps
            .push((Stage::Parse, crate::dump(crate::Dumpable::Ast(&ast))));
    }
    if failed {
        return out;
    }
    let mut opts = opts.clone();
    // SystemTap prints only what the script prints (and, at the end, the globals
    // it never reads: `translate` adds that).
    opts.config.print_maps_on_exit = false;
    let nprobes = ast.items.len();
    let mut out = crate::compile_ast(ast, source, file, &opts, out);
    if let Some(p) = &mut out.program {
        if p.probes.len() == nprobes {
            for i in system {
                p.probes[i].system = true;
            }
        } else if !system.is_empty() {
            out.diagnostics.push(crate::Diagnostic::warning(
                crate::ast::Span::default(),
                "scheduler.cpu_on runs only for the traced processes' switches",
            ));
        }
    }
    out
}
