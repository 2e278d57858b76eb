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
pub mod cflow;
pub mod cheader;
pub mod check;
pub mod diag;
pub mod dump;
pub mod expand;
pub mod func;
pub mod group;
pub use weft_ir::format;
pub mod lexer;
pub mod lower;
pub mod parser;
pub mod passes;
pub mod pointcut;
pub mod seq;
pub mod stap;
pub mod unsupported;
pub mod watchpoint;
pub mod wildcard;

use std::sync::Arc;

pub use cheader::{HeaderFile, HeaderResolver, Includer};
pub use check::Checked;
pub use diag::{render, Diagnostic, Note, Severity};
pub use passes::{Stage, PASSES};

/// Finds the parameters of a probed function from debug info (implemented by the
/// CLI with DWARF). Used for `args.NAME`.
pub trait ArgsResolver {
    /// Parameter names and types of the function an attach point names, or `None`
    /// when there is no debug info for it.
    fn params(&self, attach: &weft_ir::AttachPoint) -> Option<Vec<(String, weft_ir::Type)>>;
    /// The return type of the function an attach point names (`weft stap`'s
    /// `$return` takes it, as SystemTap does); `None` when unknown or `void`.
    fn return_type(&self, _attach: &weft_ir::AttachPoint) -> Option<weft_ir::Type> {
        None
    }
    /// The struct, class or union `name` as the debug info of the binary an attach
    /// point names defines it (`(struct point *)arg0` in its probe, as bpftrace
    /// takes it from the probed binary's DWARF); `None` when it does not.
    fn struct_type(&self, _attach: &weft_ir::AttachPoint, _name: &str) -> Option<weft_ir::Type> {
        None
    }
    /// Whether a source-line attach point (`uprobe:BIN@FILE:LINE`) has code: `Err`
    /// with a one-line reason (no DWARF line table, no such file, no code on the
    /// line and the nearest lines that have some) when the binary is found and it
    /// has none; `Ok` when it has, or when the binary cannot be looked at yet (the
    /// engine says why later).
    fn source_line(&self, _attach: &weft_ir::AttachPoint) -> Result<(), String> {
        Ok(())
    }
}

/// Finds the globals and statics data pointcuts name (implemented by the engine
/// with the symbol table and DWARF). Used for `set:BIN:VAR` / `get:BIN:VAR`.
pub trait DataResolver {
    /// The variable `var` of `target` with the `.field` / `[i]` steps of `path`:
    /// its size and type, or why it cannot be watched (a one-line message, with
    /// suggestions).
    fn variable(&self, target: &str, var: &str, path: &str) -> Result<DataVar, String>;
}

/// What a data pointcut watches, as [`DataResolver`] found it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DataVar {
    /// Bytes watched.
    pub size: u32,
    /// The value's type when DWARF gives an integer of that size; else an
    /// unsigned integer of the size.
    pub ty: weft_ir::Type,
}

/// The kernel's events and what the running kernel offers (implemented by the CLI
/// over tracefs). Used for `tracepoint:` probes and their `args`, and to say why
/// other kernel probes are not there.
pub trait EventResolver {
    /// The tracepoints whose category and name match the patterns (wildcards `*`,
    /// `?`, `[...]` as in uprobes), as `(category, name)`, sorted. `Err`: the
    /// kernel's tracepoints cannot be read (a one-line reason).
    fn tracepoints(&self, category: &str, name: &str) -> Result<Vec<(String, String)>, String>;
    /// The fields of one tracepoint's record, in record order (`common_*` first).
    fn fields(&self, category: &str, name: &str) -> Result<Vec<EventField>, String>;
    /// What the running kernel offers for kernel probes.
    fn kernel(&self) -> KernelOffers;
}

/// One field of a kernel event's record (a line of a tracepoint's `format` file).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EventField {
    pub name: String,
    /// The C type: of the field (`const char *`), of an array's elements (`char` for
    /// `char comm[16]`), of a `__data_loc` array's elements.
    pub c_type: String,
    /// Bytes from the start of the record.
    pub offset: u32,
    /// Bytes in the record; wins over the C type (a syscall's `int dfd` takes 8).
    pub size: u32,
    pub signed: bool,
    pub shape: EventFieldShape,
}

/// The shape of an [`EventField`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EventFieldShape {
    Scalar,
    Pointer,
    /// Dimensions, outermost first; none for a flexible array (`u32 buf[]`).
    Array {
        dims: Vec<u32>,
    },
    /// `__data_loc TYPE[] name`: data after the fixed fields, located by a u32.
    DataLoc,
}

/// What the running kernel offers for kernel probes, for messages.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelOffers {
    /// Where tracefs is mounted, or why it is not there.
    pub tracefs: Result<String, String>,
    /// The kernel has kprobes (`kprobe_events`, the kprobe event source).
    pub kprobes: bool,
    /// The kernel has BTF (`/sys/kernel/btf/vmlinux`).
    pub btf: bool,
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
    /// Globals for `set:`/`get:` probes; without it their values are `uint64`s and
    /// unknown names are found only when weaving.
    pub data: Option<Arc<dyn DataResolver + Send + Sync>>,
    /// The kernel's tracepoints; without it `tracepoint:` probes are an error.
    pub events: Option<Arc<dyn EventResolver + Send + Sync>>,
    /// Stages whose result to dump into [`Output::dumps`].
    pub dump: Vec<Stage>,
    /// Finds C headers for `#include` lines; without it they are ignored.
    pub headers: Option<Arc<dyn HeaderResolver + Send + Sync>>,
    /// `--include FILE`s: headers read before the script's `#include`s.
    pub include_files: Vec<String>,
    /// Groups named on the command line (`-p NAME=PID,...`): their initial members.
    pub groups: Vec<(String, Vec<i32>)>,
    /// The machine's possible CPUs, the value of `ncpus` (0: unknown, taken as 1).
    pub ncpus: u64,
    /// `BPFTRACE_*` variables of the environment: config settings that win over the
    /// script's config block, as upstream reads them.
    pub env_config: Vec<(String, String)>,
    /// Offsets of other clocks from CLOCK_MONOTONIC (`nsecs(boot)`, `nsecs(tai)`).
    pub clock_offsets: ClockOffsets,
    /// `-k`: warn, where it happens, when a map read finds no element or a
    /// `delete` has nothing to delete (upstream's helper-error warnings).
    pub helper_warnings: bool,
    /// The program `-c` runs or `-p` names (its executable's path): the binary of
    /// `watchpoint:FUNC+argN:...`.
    pub target_program: Option<String>,
}

/// Nanoseconds to add to CLOCK_MONOTONIC for another clock, taken once.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ClockOffsets {
    /// CLOCK_BOOTTIME - CLOCK_MONOTONIC (time spent suspended).
    pub boot: u64,
    /// CLOCK_TAI - CLOCK_MONOTONIC.
    pub tai: u64,
}

impl std::fmt::Debug for Options {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Options")
            .field("positional", &self.positional)
            .field("named", &self.named)
            .field("config", &self.config)
            .field("unsafe_ok", &self.unsafe_ok)
            .field("args_resolver", &self.args_resolver.is_some())
            .field("events", &self.events.is_some())
            .field("dump", &self.dump)
            .field("headers", &self.headers.is_some())
            .field("include_files", &self.include_files)
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

/// Stage 1 with the C headers: text to syntax tree, the `--include` files and the
/// `#include`d headers read (through [`Options::headers`]) into
/// [`ast::Program::c_decls`]. When they define typedefs the text is parsed again
/// knowing their names, so `(name)x` is a cast.
pub fn parse_with_headers(source: &str, opts: &Options) -> (ast::Program, Vec<Diagnostic>) {
    let (ast, diags) = parse(source);
    let Some(resolver) = &opts.headers else {
        return (ast, diags);
    };
    if ast.includes.is_empty() && opts.include_files.is_empty() {
        return (ast, diags);
    }
    let (decls, header_diags) = cheader::read(&opts.include_files, &ast.includes, &**resolver);
    let types: std::collections::HashSet<String> =
        decls.typedefs.iter().map(|(n, _)| n.clone()).collect();
    let (mut ast, mut diags) = if types.is_empty() {
        (ast, diags)
    } else {
        parser::parse_with_types(source, &types)
    };
    ast.c_decls = decls;
    diags.extend(header_diags);
    diags.sort_by_key(|d| d.span.start);
    (ast, diags)
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

    let (ast, diags) = parse_with_headers(source, opts);
    let failed = diags.iter().any(Diagnostic::is_error);
    out.diagnostics.extend(diags);
    if wants(Stage::Parse) {
        out.dumps.push((Stage::Parse, dump(Dumpable::Ast(&ast))));
    }
    if failed {
        return out;
    }
    compile_ast(ast, source, file, opts, out)
}

/// The stages after parsing, on a syntax tree from either front end (`source` is
/// the text its spans point into); `out` holds what parsing said.
pub fn compile_ast(
    mut ast: ast::Program,
    source: &str,
    file: &str,
    opts: &Options,
    mut out: Output,
) -> Output {
    let wants = |s: Stage| opts.dump.contains(&s);
    let mut group_diags = diag::Diags::default();
    group::desugar(&mut ast, &opts.groups, &mut group_diags);
    let mut diags = group_diags.list;
    diags.extend(expand(&mut ast));
    let mut watch_diags = diag::Diags::default();
    watchpoint::desugar(&mut ast, opts.target_program.as_deref(), &mut watch_diags);
    diags.extend(watch_diags.list);
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
