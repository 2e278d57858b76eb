//! The checker: resolves names (builtins, functions, variables, maps), infers and
//! checks types, validates attach points and probe contexts, and fills
//! [`Expr::ty`] / [`VarRef::id`] in place. It reports every error it finds.
//!
//! Map types are global and may be used before (in source order) they are
//! assigned, so the checker runs silently a few times to learn every map's key and
//! value types, then once more reporting. A map's type is set by its first
//! assignment in source order; a later use that disagrees is reported there, with a
//! note pointing at the first.

use std::collections::HashMap;
use std::sync::Arc;

use weft_ir::{
    AttachPoint, BitField, CField, CStruct, Config, DataAccess, DataPlace, EnumType, MapValue,
    StackMode, TseriesAgg, Type, PRINTF_MAX_WIDTH, TSERIES_MAX_INTERVALS,
};

use crate::ast::*;
use crate::builtins;
use crate::diag::{suggest, Diagnostic, Diags};
use crate::unsupported;
use crate::{EventField, EventFieldShape, KernelOffers, Options};
use weft_ir::format::{conversions, not_conversions, ArgKind};

/// The checked program: the typed tree plus what lowering needs.
#[derive(Clone, Debug)]
pub struct Checked {
    pub program: Program,
    /// Maps in order of first appearance; a map's index is its `MapId`.
    pub maps: Vec<MapInfo>,
    /// One entry per top-level probe, in order.
    pub probes: Vec<ProbeInfo>,
    pub config: Config,
    /// Default mode of `ustack` (config `stack_mode`).
    pub stack_mode: StackMode,
    /// The value of each named parameter a `getopt()` reads: from the command line,
    /// else the call's default.
    pub named: HashMap<String, NamedValue>,
    /// The program's file name and text, for the locations `errorf`/`warnf` report
    /// (set by `compile`; without it they name the line and columns only).
    pub origin: Option<(String, String)>,
    /// [`crate::Options::helper_warnings`].
    pub helper_warnings: bool,
}

impl Checked {
    /// Where an `errorf`/`warnf` call at `span` is, as upstream reports it (without
    /// [`Self::origin`], the text counts as one line of `stdin`).
    pub fn message_at(&self, level: weft_ir::MessageLevel, span: Span) -> Option<weft_ir::Message> {
        let one_line = (String::from("-e"), String::new());
        let (file, text) = self.origin.as_ref().unwrap_or(&one_line);
        let at = |offset: u32| match self.origin {
            Some(_) => crate::diag::line_col(text, offset),
            None => (1, offset as usize + 1),
        };
        let (line, col) = at(span.start);
        let (end_line, end_col) = at(span.end);
        let end_col = if end_line == line { end_col } else { col + 1 };
        // upstream names a program given with -e (or on standard input) `stdin`.
        let file = match file.as_str() {
            "-e" | "-" => "stdin".to_string(),
            f => f.to_string(),
        };
        Some(weft_ir::Message {
            level,
            file,
            line: line as u32,
            col: col as u32,
            end_col: end_col as u32,
            context: Vec::new(),
        })
    }

    /// A run-time warning's place, as upstream reports one (a division by zero): the
    /// location line, then the source line with `~` under the expression.
    pub fn runtime_warning_at(&self, span: Span) -> Option<weft_ir::Message> {
        let mut m = self.message_at(weft_ir::MessageLevel::Warning, span)?;
        if let Some((_, text)) = &self.origin {
            let line = text.lines().nth(m.line as usize - 1).unwrap_or("");
            let width = (m.end_col.saturating_sub(m.col)).max(1) as usize;
            m.context = vec![
                line.to_string(),
                format!("{}{}", " ".repeat(m.col as usize - 1), "~".repeat(width)),
            ];
        }
        Some(m)
    }
}

/// A named program parameter's value (`getopt`), of the type its default gives it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NamedValue {
    Bool(bool),
    Int(i64),
    Str(Vec<u8>),
}

impl NamedValue {
    /// As upstream bpftrace takes it from `--NAME` (`None`) or `--NAME=VALUE`: a
    /// boolean is true without a value or with `true`/`1`, false with `false`/`0`;
    /// an integer or a string needs the `=`.
    fn with_command_line(&self, name: &str, given: Option<&str>) -> Result<NamedValue, String> {
        match (self, given) {
            (NamedValue::Bool(_), None) => Ok(NamedValue::Bool(true)),
            (NamedValue::Bool(_), Some(v)) if v == "1" || v.eq_ignore_ascii_case("true") => {
                Ok(NamedValue::Bool(true))
            }
            (NamedValue::Bool(_), Some(v)) if v == "0" || v.eq_ignore_ascii_case("false") => {
                Ok(NamedValue::Bool(false))
            }
            // An integer parameter takes a truth value too (`--cc=False` is 0, upstream).
            (NamedValue::Int(_), Some(v)) if v.eq_ignore_ascii_case("true") => {
                Ok(NamedValue::Int(1))
            }
            (NamedValue::Int(_), Some(v)) if v.eq_ignore_ascii_case("false") => {
                Ok(NamedValue::Int(0))
            }
            (NamedValue::Bool(_), Some(v)) => Err(format!(
                "--{name}={v}: `{name}` is a boolean parameter (true, false, 1 or 0)"
            )),
            (NamedValue::Int(_), Some(v)) => v
                .parse()
                .map(NamedValue::Int)
                .map_err(|_| format!("--{name}={v}: `{name}` is an integer parameter")),
            (NamedValue::Str(_), Some(v)) => Ok(NamedValue::Str(v.as_bytes().to_vec())),
            (_, None) => Err(format!(
                "--{name} needs a value (--{name}=VALUE): only boolean parameters go without one"
            )),
        }
    }

    fn describe(&self) -> String {
        match self {
            NamedValue::Bool(b) => b.to_string(),
            NamedValue::Int(v) => v.to_string(),
            NamedValue::Str(s) => format!("\"{}\"", String::from_utf8_lossy(s)),
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct MapInfo {
    pub name: String,
    pub key: Option<Type>,
    pub value: MapValue,
}

#[derive(Clone, Debug, PartialEq)]
pub struct ProbeInfo {
    pub attach: Vec<AttachPoint>,
    /// The full name of each attach point (what `probe` gives): as written, or the
    /// tracepoint a wildcard expanded to.
    pub names: Vec<String>,
    /// When the body reads a tracepoint's `args`: each attach point's record
    /// layout. Lowering then makes one probe per attach point (offsets differ).
    pub events: Vec<Arc<[EventField]>>,
    /// Types of the probe's scratch variables, indexed by [`VarRef::id`].
    pub vars: Vec<Type>,
    /// `around` advice (its attach points are function entries).
    pub around: bool,
}

impl Checked {
    pub fn map_id(&self, name: &str) -> Option<u32> {
        self.maps
            .iter()
            .position(|m| m.name == name)
            .map(|i| i as u32)
    }
}

/// Default depth of `ustack` (bpftrace: 127 frames).
pub const USTACK_DEPTH: u32 = 127;
/// Capacity of `comm` (the kernel's TASK_COMM_LEN).
pub const COMM_CAP: u32 = 16;
/// Bytes of `caller` (the site table's name field, `weft_abi::SITE_NAME_LEN`).
pub const CALLER_CAP: u32 = 64;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Begin,
    End,
    Uprobe,
    Uretprobe,
    Usdt,
    /// `call:` sites: advice runs in the caller, before the call.
    Call,
    Interval,
    Profile,
    /// Data pointcuts on writes (`set:`, `watchpoint:...:w`).
    DataSet,
    /// Data pointcuts on reads (`get:`, `watchpoint:...:r` / `rw`).
    DataGet,
    /// Kernel tracepoints (`tracepoint:`, `kernel:syscall:`): advice runs in the
    /// kernel, with no user-space frame.
    Tracepoint,
    /// Unsupported or reserved providers: context checks are skipped.
    Other,
}

impl Kind {
    fn in_target(self) -> bool {
        matches!(
            self,
            Kind::Uprobe
                | Kind::Uretprobe
                | Kind::Usdt
                | Kind::Call
                | Kind::Profile
                | Kind::DataSet
                | Kind::DataGet
                | Kind::Other
        )
    }
}

#[derive(Clone, Debug, Default)]
struct MapState {
    /// `None`: not known yet; `Some(None)`: a map without keys.
    key: Option<Option<Type>>,
    key_span: Span,
    value: Option<MapValue>,
    value_span: Span,
    first: u32,
}

#[derive(Clone, Debug)]
struct VarState {
    ty: Option<Type>,
    span: Span,
}

/// A tracepoint's record layout, or why it cannot be read.
type EventLayout = Result<Arc<[EventField]>, String>;

struct Checker<'a> {
    opts: &'a Options,
    diags: Diags,
    report: bool,
    maps: HashMap<String, MapState>,
    /// Map types learned by the previous silent pass.
    hints: HashMap<String, MapState>,
    structs: HashMap<String, CStruct>,
    /// Typedefs of included headers: name → the type it names.
    typedefs: HashMap<String, TypeExpr>,
    /// Structs of included headers weft cannot lay out: name → why (an error where
    /// the script uses one).
    broken: HashMap<String, String>,
    /// Structs the probed binaries' DWARF defines, by name, as looked up so far
    /// (`None`: not there) — a cast names them without a preamble.
    dwarf_structs: std::cell::RefCell<HashMap<String, Option<CStruct>>>,
    /// Enumerators of the program's `enum` definitions: name → value.
    enumerators: HashMap<String, i64>,
    /// The enum each enumerator of an `enum` definition belongs to (its values
    /// print by name), and the named enums (`(enum X)v`).
    enum_of: HashMap<String, EnumType>,
    enum_types: HashMap<String, EnumType>,
    config: Config,
    stack_mode: StackMode,
    /// Tracepoints' record layouts, by (category, name).
    event_fields: HashMap<(String, String), EventLayout>,
    /// What the running kernel offers, once asked.
    kernel: Option<Option<KernelOffers>>,
    // Per probe:
    kinds: Vec<(Kind, String)>,
    /// The type of a data probe's value (`old`, `new`, `val`).
    data_ty: Option<Type>,
    /// Data attach points so far in this pass (at most `MAX_DATA_POINTS`).
    data_points: usize,
    /// What the data resolver said, by (target, var, path): asked once.
    data_vars: HashMap<(String, String, String), Result<crate::DataVar, String>>,
    attach: Vec<AttachPoint>,
    names: Vec<String>,
    /// The body reads `args` of tracepoints.
    reads_event: bool,
    /// The probe being checked is `around` advice.
    around: bool,
    vars: Vec<VarState>,
    scopes: Vec<HashMap<String, u32>>,
    loop_depth: u32,
    /// Variable types learned by the previous pass, by (probe index, variable id):
    /// a variable's type is its widest assignment (strings grow), and reads before
    /// the widest assignment must already see it.
    var_hints: HashMap<(usize, u32), Type>,
    probe_index: usize,
    /// Variables declared by a plain assignment (not `let`), by name: still
    /// visible after their block closes, as in bpftrace 0.17.
    loose_vars: HashMap<String, u32>,
    /// Each `getopt()` name's default and where it was first given (this pass).
    getopt_defaults: HashMap<String, (NamedValue, Span)>,
    /// Each `getopt()` name's value.
    named: HashMap<String, NamedValue>,
}

pub fn check(mut program: Program, opts: &Options) -> (Checked, Vec<Diagnostic>) {
    let mut ck = Checker {
        opts,
        diags: Diags::default(),
        report: true,
        maps: HashMap::new(),
        hints: HashMap::new(),
        structs: HashMap::new(),
        typedefs: HashMap::new(),
        broken: HashMap::new(),
        dwarf_structs: Default::default(),
        enumerators: HashMap::new(),
        enum_of: HashMap::new(),
        enum_types: HashMap::new(),
        config: opts.config.clone(),
        stack_mode: StackMode::Bpftrace,
        event_fields: HashMap::new(),
        kernel: None,
        kinds: Vec::new(),
        data_ty: None,
        data_points: 0,
        data_vars: HashMap::new(),
        attach: Vec::new(),
        names: Vec::new(),
        reads_event: false,
        around: false,
        vars: Vec::new(),
        scopes: Vec::new(),
        loop_depth: 0,
        var_hints: HashMap::new(),
        probe_index: 0,
        loose_vars: HashMap::new(),
        getopt_defaults: HashMap::new(),
        named: HashMap::new(),
    };
    ck.config.unsafe_ok = opts.unsafe_ok || ck.config.unsafe_ok;
    positional_in_attach_points(&mut program, &opts.positional, &mut ck.diags);
    ck.preamble(&program);
    let preamble_diags = std::mem::take(&mut ck.diags);

    // Silent passes learn map types; the last pass reports.
    let mut probes = Vec::new();
    for pass in 0..4 {
        ck.report = pass == 3;
        ck.diags = Diags::default();
        ck.hints = std::mem::take(&mut ck.maps);
        ck.getopt_defaults.clear();
        ck.data_points = 0;
        probes.clear();
        ck.probe_index = 0;
        for item in &mut program.items {
            match item {
                Item::Probe(p) => probes.push(ck.probe(p)),
                Item::Reserved(r) => {
                    ck.err(
                        r.span,
                        format!("`{}` blocks are not supported yet", r.keyword),
                    );
                    for i in &mut r.items {
                        if let Item::Probe(p) = i {
                            ck.probe(p);
                        }
                    }
                }
                _ => {}
            }
        }
    }
    let mut diags = preamble_diags.list;
    diags.extend(ck.diags.list);

    // Maps, in order of first appearance.
    let mut maps: Vec<(String, MapState)> = ck.maps.into_iter().collect();
    maps.sort_by_key(|(_, m)| m.first);
    let maps = maps
        .into_iter()
        .map(|(name, m)| MapInfo {
            name,
            key: m.key.unwrap_or(None),
            value: m.value.unwrap_or(MapValue::Plain(Type::I64)),
        })
        .collect();
    let checked = Checked {
        program,
        maps,
        probes,
        config: ck.config,
        stack_mode: ck.stack_mode,
        named: ck.named,
        origin: None,
        helper_warnings: ck.opts.helper_warnings,
    };
    (checked, diags)
}

/// The builtins upstream also names `__builtin_NAME` (its parser's list).
const BUILTIN_ALIASES: &[&str] = &[
    "cgroup", "comm", "cpid", "cpu", "curtask", "elapsed", "func", "gid", "jiffies", "ncpus",
    "numaid", "probe", "rand", "retval", "uid", "usermode", "username",
];

// ---- type helpers -------------------------------------------------------------

/// The type of a tracepoint's field: an integer of the field's size (the size wins
/// over the C type; the sign is the C type's, or the format's), a pointer to what
/// the C type points to, `char[N]` a string of N bytes, other arrays as C arrays,
/// `__data_loc char[]` a string of `strlen` bytes. `Err`: why weft cannot read it.
pub fn event_field_type(f: &EventField, strlen: u32) -> Result<Type, String> {
    let (base, stars) = c_type_words(&f.c_type);
    match &f.shape {
        EventFieldShape::Scalar => Ok(match f.size {
            1 | 2 | 4 | 8 => Type::Int {
                bits: (f.size * 8) as u8,
                signed: f.signed || c_int(&base).is_some_and(|(_, s)| s),
            },
            n => byte_array(n),
        }),
        EventFieldShape::Pointer => {
            let mut t = match c_int(&base) {
                Some((bits, signed)) => Type::Int { bits, signed },
                None if base == "void" => Type::Void,
                None => match base.strip_prefix("struct ") {
                    Some(name) => Type::CStruct(CStruct {
                        name: name.to_string(),
                        size: 0,
                        fields: Vec::new().into(),
                    }),
                    None => Type::Void,
                },
            };
            for _ in 0..stars.max(1) {
                t = Type::Ptr(Box::new(t));
            }
            Ok(t)
        }
        EventFieldShape::Array { dims } => {
            let count: u64 = dims.iter().map(|&d| u64::from(d)).product();
            if dims.is_empty() || count == 0 || f.size == 0 {
                return Err(format!(
                    "`{} {}[]` is a flexible array (the record does not say its length)",
                    f.c_type, f.name
                ));
            }
            let mut dims = dims.clone();
            let esize = f.size / count as u32;
            let mut t = match (base.as_str(), dims.last()) {
                ("char", Some(&n)) if esize == 1 => {
                    dims.pop();
                    Type::Str { cap: n }
                }
                _ => match esize {
                    1 | 2 | 4 | 8 => Type::Int {
                        bits: (esize * 8) as u8,
                        signed: c_int(&base).is_some_and(|(_, s)| s),
                    },
                    n => byte_array(n),
                },
            };
            for &n in dims.iter().rev() {
                t = c_array(t, n);
            }
            Ok(t)
        }
        EventFieldShape::DataLoc if base == "char" => Ok(Type::Str { cap: strlen }),
        EventFieldShape::DataLoc => Err(format!(
            "`__data_loc {}[]` fields are not supported (only `__data_loc char[]` strings)",
            f.c_type
        )),
    }
}

/// A C type's words without qualifiers, and how many `*` follow them
/// (`const char *const *` is (`char`, 2)).
fn c_type_words(c: &str) -> (String, usize) {
    let stars = c.matches('*').count();
    let words: Vec<&str> = c
        .split(|ch: char| ch.is_whitespace() || ch == '*')
        .filter(|w| {
            !w.is_empty() && !matches!(*w, "const" | "volatile" | "restrict" | "__user" | "__rcu")
        })
        .collect();
    (words.join(" "), stars)
}

/// A C integer type's bits and sign, for the names tracepoints use.
fn c_int(name: &str) -> Option<(u8, bool)> {
    Some(match name {
        "char" | "signed char" | "s8" | "__s8" | "int8_t" => (8, true),
        "unsigned char" | "u8" | "__u8" | "uint8_t" | "bool" | "_Bool" => (8, false),
        "short" | "short int" | "signed short" | "s16" | "__s16" | "int16_t" => (16, true),
        "unsigned short" | "unsigned short int" | "u16" | "__u16" | "uint16_t" | "umode_t" => {
            (16, false)
        }
        "int" | "signed" | "signed int" | "s32" | "__s32" | "int32_t" | "pid_t" | "tid_t" => {
            (32, true)
        }
        "unsigned" | "unsigned int" | "u32" | "__u32" | "uint32_t" | "uint" | "uid_t" | "gid_t"
        | "dev_t" => (32, false),
        "long" | "long int" | "long long" | "long long int" | "s64" | "__s64" | "int64_t"
        | "ssize_t" | "loff_t" | "off_t" | "time64_t" => (64, true),
        "unsigned long" | "unsigned long int" | "unsigned long long" | "u64" | "__u64"
        | "uint64_t" | "size_t" => (64, false),
        _ => return None,
    })
}

/// An array of `n` `elem`s, as DWARF arrays are typed (a field per element).
fn c_array(elem: Type, n: u32) -> Type {
    let esize = elem.size();
    Type::CStruct(CStruct {
        name: format!("{elem}[{n}]"),
        size: esize.saturating_mul(n),
        fields: (0..n)
            .map(|i| CField {
                name: i.to_string(),
                offset: i.saturating_mul(esize),
                ty: elem.clone(),
                bits: None,
            })
            .collect(),
    })
}

fn int64(signed: bool) -> Type {
    Type::Int { bits: 64, signed }
}

fn is_int(t: &Type) -> bool {
    matches!(t, Type::Int { .. } | Type::Bool)
}

/// Usable as a condition or in `&&`, `||`, `!`.
fn is_truthy(t: &Type) -> bool {
    matches!(t, Type::Int { .. } | Type::Bool | Type::Ptr(_) | Type::USym)
}

/// Whether `e` is something other than an integer constant (`-N` or `N`).
fn signed_expr(e: &Expr) -> bool {
    !matches!(
        &e.kind,
        ExprKind::Int(_) | ExprKind::Unary { op: UnOp::Neg, .. }
    )
}

fn signed(t: &Type) -> bool {
    match t {
        Type::Int { signed, .. } => *signed,
        // Booleans promote like C's `int`.
        Type::Bool => true,
        _ => false,
    }
}

/// The type a value is stored as in a map key, a map value or an event: integers
/// widen to 64 bits (keeping their sign).
pub fn storage(t: &Type) -> Type {
    match t {
        Type::Int { signed, .. } => int64(*signed),
        Type::Tuple(ts) => Type::Tuple(ts.iter().map(storage).collect()),
        Type::Record(fs) => Type::Record(fs.iter().map(|(n, t)| (n.clone(), storage(t))).collect()),
        other => other.clone(),
    }
}

/// Can a value of type `b` be stored where `a` is (a variable or map of type `a`)?
/// Returns the widened type (strings and buffers grow to the larger capacity).
fn unify(a: &Type, b: &Type) -> Option<Type> {
    match (a, b) {
        // An enum's values and other integers together are integers (printed as
        // numbers), as upstream types them.
        (Type::Enum(x), Type::Enum(y)) if x != y => Some(Type::I64),
        (Type::Enum(_), Type::Int { .. } | Type::Bool) | (Type::Int { .. }, Type::Enum(_)) => {
            Some(Type::I64)
        }
        (Type::Int { .. }, Type::Int { .. } | Type::Bool) => Some(a.clone()),
        (Type::Bool, Type::Bool) => Some(Type::Bool),
        (Type::Str { cap: x }, Type::Str { cap: y }) => Some(Type::Str { cap: (*x).max(*y) }),
        (Type::Buf { cap: x }, Type::Buf { cap: y }) => Some(Type::Buf { cap: (*x).max(*y) }),
        (Type::Tuple(xs), Type::Tuple(ys)) if xs.len() == ys.len() => {
            let ts: Option<Vec<Type>> = xs.iter().zip(ys).map(|(x, y)| unify(x, y)).collect();
            ts.map(Type::Tuple)
        }
        (Type::Record(xs), Type::Record(ys)) if xs.len() == ys.len() => {
            let fs: Option<Vec<(String, Type)>> = xs
                .iter()
                .zip(ys)
                .map(|((n, x), (m, y))| {
                    if n == m {
                        unify(x, y).map(|t| (n.clone(), t))
                    } else {
                        None
                    }
                })
                .collect();
            fs.map(Type::Record)
        }
        (Type::UStack { depth: x, mode }, Type::UStack { depth: y, mode: m2 }) if mode == m2 => {
            Some(Type::UStack {
                depth: (*x).max(*y),
                mode: *mode,
            })
        }
        (Type::Ptr(_), Type::Ptr(_)) => Some(a.clone()),
        (Type::Ptr(_), Type::Int { .. }) => Some(a.clone()),
        _ if a == b => Some(a.clone()),
        _ => None,
    }
}

/// Types of the two branches of `?:`.
fn join_branches(a: &Type, b: &Type) -> Option<Type> {
    match (a, b) {
        (Type::Int { .. } | Type::Bool, Type::Int { .. } | Type::Bool) if a != b => {
            Some(int64(signed(a) && signed(b)))
        }
        _ => unify(a, b),
    }
}

fn agg_name(v: &MapValue) -> &'static str {
    match v {
        MapValue::Plain(_) => "value",
        MapValue::Count => "count",
        MapValue::Sum { .. } => "sum",
        MapValue::Min { .. } => "min",
        MapValue::Max { .. } => "max",
        MapValue::Avg { .. } => "avg",
        MapValue::Stats { .. } => "stats",
        MapValue::Hist { .. } => "hist",
        MapValue::Lhist { .. } => "lhist",
        MapValue::Tseries { .. } => "tseries",
    }
}

fn describe_value(v: &MapValue) -> String {
    match v {
        MapValue::Plain(t) => format!("`{t}`"),
        MapValue::Hist { k } if *k > 0 => format!("`hist(_, {k})`"),
        MapValue::Lhist { min, max, step } => format!("`lhist(_, {min}, {max}, {step})`"),
        MapValue::Tseries {
            interval_ns,
            intervals,
            agg: TseriesAgg::Last,
            ..
        } => format!("`tseries(_, {interval_ns}, {intervals})`"),
        MapValue::Tseries {
            interval_ns,
            intervals,
            agg,
            ..
        } => format!(
            "`tseries(_, {interval_ns}, {intervals}, \"{}\")`",
            agg.name()
        ),
        other => format!("`{}()`", agg_name(other)),
    }
}

fn describe_key(k: &Option<Type>) -> String {
    match k {
        None => "no key".to_string(),
        Some(t) => format!("key `{t}`"),
    }
}

/// Replace `$1`, `$2`, ... in attach points by the positional parameters, as bpftrace
/// does (`uprobe:$1:main`, `interval:ms:$2`).
fn positional_in_attach_points(program: &mut Program, positional: &[String], diags: &mut Diags) {
    for item in &mut program.items {
        let Item::Probe(p) = item else { continue };
        for a in &mut p.attach {
            if !a.raw.contains('$') {
                continue;
            }
            let mut raw = String::new();
            let mut rest = a.raw.as_str();
            let mut ok = true;
            while let Some(i) = rest.find('$') {
                raw.push_str(&rest[..i]);
                let digits = rest[i + 1..].bytes().take_while(u8::is_ascii_digit).count();
                let n: usize = rest[i + 1..i + 1 + digits].parse().unwrap_or(0);
                match positional.get(n.wrapping_sub(1)) {
                    Some(v) if digits > 0 => raw.push_str(v),
                    _ if digits == 0 => raw.push('$'),
                    _ => {
                        diags.error(
                            a.span,
                            format!(
                                "attach point `{}` uses ${n}, but {} positional parameter{} given",
                                a.raw,
                                positional.len(),
                                if positional.len() == 1 {
                                    " is"
                                } else {
                                    "s are"
                                }
                            ),
                        );
                        ok = false;
                    }
                }
                rest = &rest[i + 1 + digits..];
            }
            raw.push_str(rest);
            if ok {
                *a = crate::parser::attach_spec(raw, a.span);
            }
        }
    }
}

/// What a statement always ends its block with (`exit()`, `return`, in a loop
/// `break` and `continue`, an `if` whose branches all do), as said in a warning;
/// `None` when the next statement may run. As upstream: an `exit` with more than one
/// argument (an error) does not count, nor a `break` outside a loop.
fn jumps_away(s: &Stmt, in_loop: bool) -> Option<&'static str> {
    let block = |b: &Block| b.stmts.iter().find_map(|s| jumps_away(s, in_loop));
    match &s.kind {
        StmtKind::Return(_) => Some("`return`"),
        StmtKind::Break if in_loop => Some("`break`"),
        StmtKind::Continue if in_loop => Some("`continue`"),
        StmtKind::Expr(Expr {
            kind: ExprKind::Call { name, args, .. },
            ..
        }) if name == "exit" && args.len() <= 1 => Some("`exit()`"),
        StmtKind::If {
            then,
            otherwise: Some(o),
            ..
        } => (block(then).is_some() && block(o).is_some())
            .then_some("an `if` whose branches all end"),
        StmtKind::Block(b) | StmtKind::Unroll { body: b, .. } => block(b),
        _ => None,
    }
}

/// `let $x: T = value` where the value's type does not fit (a function's
/// parameter is one too); for a function's result (`crate::func`), in its words.
fn init_mismatch(var: &str, declared: &Type, given: &Type) -> String {
    // Variables a macro or function body declares carry `#N` (`crate::expand`).
    let name = var.split('#').next().unwrap_or(var);
    match name.strip_prefix(crate::func::RETURN_VAR) {
        Some(f) => format!("function `{f}` returns `{declared}`, not `{given}`"),
        None => format!(
            "cannot initialize `${name}` of type `{declared}` with a value of type `{given}`"
        ),
    }
}

fn literal_int(e: &Expr) -> Option<i64> {
    match &e.kind {
        ExprKind::Int(v) => Some(*v as i64),
        ExprKind::Unary {
            op: UnOp::Neg,
            expr,
        } => literal_int(expr).map(|v| v.wrapping_neg()),
        _ => None,
    }
}

/// The largest `max_map_keys`: each map's key table has twice as many entries (a power
/// of two), and an aggregation as many accumulators in every thread that uses it.
pub const MAX_MAP_KEYS: u64 = 1 << 20;

/// The largest `max_cat_bytes` (what `cat()` prints of a file; bpftrace's default is
/// 10240 and it has no upper bound).
pub const MAX_CAT_BYTES: u64 = 1 << 20;

/// The highest `profile` rate, in samples a second.
pub const MAX_PROFILE_HZ: u64 = 10_000;

/// Most data attach points in one program (`weft_abi::MAX_WATCHES`).
pub const MAX_DATA_POINTS: usize = 32;

/// `@MAP, SIZE)` of `set:addr(@MAP, SIZE)`: the map's name and the size.
fn data_addr(inner: &str) -> Option<(String, u32)> {
    let inner = inner.strip_suffix(')')?;
    let (map, size) = inner.split_once(',')?;
    let map = map.trim();
    let name = map.strip_prefix('@')?;
    if !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
        return None;
    }
    match crate::lexer::parse_int(size.trim()) {
        Ok(n) if (1..=u64::from(u32::MAX)).contains(&n) => Some((map.to_string(), n as u32)),
        _ => None,
    }
}

/// The largest `max_frame`: advice frames live on the stack of the target's thread,
/// and the code generator refuses more.
pub const MAX_FRAME: u64 = 1 << 20;

/// The most elements and fields a struct or array type may have, nested ones counted:
/// the checker represents each one (bpftrace-sized programs use a few hundred).
pub const MAX_TYPE_MEMBERS: u64 = 65536;

/// Elements and fields of a type, nested ones counted (0 for a scalar).
fn members(t: &Type) -> u64 {
    match t {
        Type::CStruct(s) => s
            .fields
            .iter()
            .map(|f| 1 + members(&f.ty))
            .fold(0, u64::saturating_add),
        _ => 0,
    }
}

/// Why a written type has no ir type.
enum TypeError {
    /// An unknown name: the caller says so in its own words.
    Unknown,
    /// Too many members or bytes: the message.
    TooLarge(String),
    /// A struct of a header weft cannot lay out: the message.
    Broken(String),
}

/// A C struct's layout; `Err(size)` when it would not fit in 32 bits.
/// An array of `n` `elem`s (written `t`), with a field per element; named as C writes
/// it (`int32[2][3]` for 2 arrays of 3).
fn array_of(elem: Type, n: u64, t: &TypeExpr) -> Result<Type, TypeError> {
    let count = n.saturating_mul(1 + members(&elem));
    if count > MAX_TYPE_MEMBERS {
        return Err(TypeError::TooLarge(format!(
            "`{t}` has too many elements, nested ones counted (at most {MAX_TYPE_MEMBERS})"
        )));
    }
    let esize = u64::from(elem.size());
    let size = n * esize;
    let Ok(size) = u32::try_from(size) else {
        return Err(TypeError::TooLarge(format!(
            "`{t}` is too large: {size} bytes (at most {})",
            u32::MAX
        )));
    };
    let elem_name = elem.to_string();
    let name = match elem_name.find('[') {
        Some(i) if matches!(elem, Type::CStruct(_)) && elem_name.ends_with(']') => {
            format!("{}[{n}]{}", &elem_name[..i], &elem_name[i..])
        }
        _ => format!("{elem_name}[{n}]"),
    };
    let fields = (0..n).map(|i| CField {
        name: i.to_string(),
        // At most `size`: fits.
        offset: (i * esize) as u32,
        ty: elem.clone(),
        bits: None,
    });
    Ok(Type::CStruct(CStruct {
        name,
        size,
        fields: fields.collect(),
    }))
}

/// C's layout (x86-64 System V) of a struct (members in order, each at its alignment)
/// or a union (every member at 0). A member with an empty name is an anonymous struct
/// or union: its fields become this one's, at its offset. A bit-field (`Some(width)`)
/// takes the next `width` bits when they fit in one aligned unit of its type, else
/// starts the next unit; it aligns the struct as its type does.
fn c_layout(
    name: &str,
    fields: &[(String, Type, Option<u8>)],
    union: bool,
) -> Result<CStruct, u64> {
    let mut bit = 0u64;
    let mut end = 0u64;
    let mut align = 1u64;
    let mut out = Vec::new();
    let fits = |v: u64| u32::try_from(v).map_err(|_| v);
    for (n, t, width) in fields {
        let a = u64::from(t.align().max(1));
        let size = u64::from(t.size());
        align = align.max(a);
        if union {
            bit = 0;
        }
        if let Some(w) = width {
            let w = u64::from(*w);
            let unit = (size * 8).max(8);
            if bit / unit != (bit + w.max(1) - 1) / unit {
                bit = bit.div_ceil(unit) * unit;
            }
            let unit_off = bit / unit * (unit / 8);
            out.push(CField {
                name: n.clone(),
                offset: fits(unit_off)?,
                ty: t.clone(),
                bits: Some(BitField {
                    shift: (bit - unit_off * 8) as u8,
                    width: w as u8,
                }),
            });
            bit += w;
            end = end.max(bit.div_ceil(8));
            continue;
        }
        let off = bit.div_ceil(8).div_ceil(a) * a;
        match t {
            Type::CStruct(inner) if n.is_empty() => {
                for f in inner.fields.iter() {
                    out.push(CField {
                        offset: fits(off + u64::from(f.offset))?,
                        ..f.clone()
                    });
                }
            }
            _ => out.push(CField {
                name: n.clone(),
                offset: fits(off)?,
                ty: t.clone(),
                bits: None,
            }),
        }
        bit = (off + size) * 8;
        end = end.max(off + size);
    }
    let size = end.div_ceil(align) * align;
    Ok(CStruct {
        name: name.to_string(),
        size: u32::try_from(size).map_err(|_| size)?,
        fields: out.into(),
    })
}

impl<'a> Checker<'a> {
    fn err(&mut self, span: Span, msg: impl Into<String>) {
        if self.report {
            self.diags.error(span, msg);
        }
    }
    fn push(&mut self, d: Diagnostic) {
        if self.report {
            self.diags.push(d);
        }
    }

    // ---- preamble ---------------------------------------------------------------

    fn preamble(&mut self, program: &Program) {
        self.header_decls(&program.c_decls);
        for (name, v) in &program.defines {
            self.enumerators.insert(name.clone(), *v);
        }
        let mut seen_probe = false;
        for item in &program.items {
            match item {
                Item::Probe(_) | Item::Reserved(_) | Item::Seq(_) => seen_probe = true,
                // Desugared before the checker (`crate::group`).
                Item::Group(_) => {}
                Item::Config(c) => {
                    if seen_probe {
                        self.err(c.span, "the config block must come before any probe");
                    }
                    self.config_block(c);
                }
                Item::Struct(s) => self.struct_def(s),
                Item::Enum(e) => self.enum_def(e),
                Item::MapDecl(m) => {
                    if !matches!(
                        m.kind.as_str(),
                        "hash" | "lruhash" | "percpuhash" | "percpulruhash"
                    ) {
                        self.err(m.span, format!("unknown map kind `{}`; expected hash, lruhash, percpuhash or percpulruhash", m.kind));
                    } else if matches!(m.kind.as_str(), "hash" | "percpuhash") {
                        // Its own number of keys, as upstream: an update past it is
                        // dropped and warned about. (An LRU map evicts instead, which
                        // weft's maps do not: it keeps `max_map_keys`.)
                        match u32::try_from(m.size) {
                            Ok(n) if (1..=MAX_MAP_KEYS as u32).contains(&n) => {
                                self.config.map_keys.retain(|(k, _)| *k != m.name);
                                self.config.map_keys.push((m.name.clone(), n));
                            }
                            _ => self.err(
                                m.span,
                                format!(
                                    "a map's number of keys must be between 1 and {MAX_MAP_KEYS}"
                                ),
                            ),
                        }
                    }
                }
                Item::Macro(_) | Item::Fn(_) | Item::Pointcut(_) => {}
            }
        }
        self.env_config();
    }

    /// `BPFTRACE_NAME=VALUE` in weft's environment sets config `NAME`, over the
    /// script's config block (upstream's precedence); `BPFTRACE_STRLEN` is
    /// `max_strlen`. A value the config would refuse is ignored.
    fn env_config(&mut self) {
        const FROM_ENV: &[&str] = &[
            "max_strlen",
            "max_map_keys",
            "max_cat_bytes",
            "stack_mode",
            "print_maps_on_exit",
            "show_debug_info",
        ];
        for (k, v) in &self.opts.env_config {
            let key = k.to_ascii_lowercase();
            let Some(key) = key.strip_prefix("bpftrace_") else {
                continue;
            };
            let key = if key == "strlen" { "max_strlen" } else { key };
            if !FROM_ENV.contains(&key) {
                continue;
            }
            let value = match crate::lexer::parse_int(v) {
                Ok(n) => ConfigValue::Int(n),
                Err(_) => ConfigValue::Str(v.clone()),
            };
            let block = ConfigBlock {
                entries: vec![(key.to_string(), value, Span::default())],
                span: Span::default(),
            };
            let before = self.diags.list.len();
            self.config_block(&block);
            self.diags.list.truncate(before);
        }
    }

    fn config_block(&mut self, c: &ConfigBlock) {
        const KNOWN: &[&str] = &[
            "max_strlen",
            "max_map_keys",
            "max_loop_iterations",
            "max_frame",
            "stack_mode",
            "unsafe",
            "cache_user_symbols",
            "cpp_demangle",
            "lazy_symbolication",
            "license",
            "log_size",
            "max_bpf_progs",
            "max_cat_bytes",
            "max_probes",
            "missing_probes",
            "on_stack_limit",
            "perf_rb_pages",
            "show_debug_info",
            "str_trunc_trailer",
            "print_maps_on_exit",
            "max_type_res_iterations",
            "max_ast_nodes",
        ];
        for (name, value, span) in &c.entries {
            let key = name.to_ascii_lowercase();
            let key = key.strip_prefix("bpftrace_").unwrap_or(&key).to_string();
            let int = match value {
                ConfigValue::Int(v) => Some(*v),
                _ => None,
            };
            let need_int =
                |ck: &mut Self| ck.err(*span, format!("config `{name}` needs an integer value"));
            match key.as_str() {
                "max_strlen" => match int {
                    Some(v) if (2..=65536).contains(&v) => self.config.strlen = v as u32,
                    Some(_) => self.err(*span, "max_strlen must be between 2 and 65536"),
                    None => need_int(self),
                },
                "max_map_keys" => match int {
                    Some(v) if (1..=MAX_MAP_KEYS).contains(&v) => {
                        self.config.max_map_keys = v as u32
                    }
                    Some(_) => self.err(
                        *span,
                        format!("max_map_keys must be between 1 and {MAX_MAP_KEYS}"),
                    ),
                    None => need_int(self),
                },
                "max_loop_iterations" => match int {
                    Some(v) if v > 0 && v <= u64::from(u32::MAX) => {
                        self.config.max_loop_iterations = v as u32
                    }
                    _ => need_int(self),
                },
                "max_frame" => match int {
                    Some(v) if (1..=MAX_FRAME).contains(&v) => self.config.max_frame = v as u32,
                    Some(_) => self.err(
                        *span,
                        format!("max_frame must be between 1 and {MAX_FRAME}"),
                    ),
                    None => need_int(self),
                },
                "show_debug_info" => {
                    let on = match value {
                        ConfigValue::Int(v) => Some(*v != 0),
                        ConfigValue::Ident(s) | ConfigValue::Str(s) => match s.as_str() {
                            "true" => Some(true),
                            "false" => Some(false),
                            _ => None,
                        },
                    };
                    match on {
                        Some(on) => self.config.show_debug_info = on,
                        None => self.err(*span, "show_debug_info takes 0 or 1 (or true or false)"),
                    }
                }
                "missing_probes" => {
                    let s = match value {
                        ConfigValue::Ident(s) | ConfigValue::Str(s) => s.as_str(),
                        ConfigValue::Int(_) => "",
                    };
                    self.config.missing_probes = match s {
                        "error" => weft_ir::MissingProbes::Error,
                        "warn" => weft_ir::MissingProbes::Warn,
                        "ignore" => weft_ir::MissingProbes::Ignore,
                        _ => {
                            self.err(
                                *span,
                                "missing_probes takes \"error\", \"warn\" or \"ignore\"",
                            );
                            continue;
                        }
                    };
                }
                "print_maps_on_exit" => {
                    let on = match value {
                        ConfigValue::Int(v) => Some(*v != 0),
                        ConfigValue::Ident(s) | ConfigValue::Str(s) => match s.as_str() {
                            "true" => Some(true),
                            "false" => Some(false),
                            _ => None,
                        },
                    };
                    match on {
                        Some(on) => self.config.print_maps_on_exit = on,
                        None => {
                            self.err(*span, "print_maps_on_exit takes 0 or 1 (or true or false)")
                        }
                    }
                }
                "max_cat_bytes" => match int {
                    Some(v) if (1..=MAX_CAT_BYTES).contains(&v) => {
                        self.config.max_cat_bytes = v as u32
                    }
                    Some(_) => self.err(
                        *span,
                        format!("max_cat_bytes must be between 1 and {MAX_CAT_BYTES}"),
                    ),
                    None => need_int(self),
                },
                "stack_mode" => {
                    let s = match value {
                        ConfigValue::Ident(s) | ConfigValue::Str(s) => s.as_str(),
                        ConfigValue::Int(_) => "",
                    };
                    match s {
                        "bpftrace" => self.stack_mode = StackMode::Bpftrace,
                        "perf" => self.stack_mode = StackMode::Perf,
                        "raw" => self.stack_mode = StackMode::Raw,
                        _ => self.err(*span, "stack_mode must be bpftrace, perf or raw"),
                    }
                }
                k if KNOWN.contains(&k) => {}
                _ => {
                    let mut d =
                        Diagnostic::error(*span, format!("unknown config variable `{name}`"));
                    if let Some(s) = suggest(&key, KNOWN.iter().copied()) {
                        d.message =
                            format!("unknown config variable `{name}`; did you mean `{s}`?");
                    }
                    self.push(d);
                }
            }
        }
    }

    /// The width of what `uaddr(sym)` points to, as upstream types it: a global
    /// variable of 1, 2 or 4 bytes gives that width, a larger one 64 bits; anything
    /// else (a function, a symbol the data resolver cannot see) a byte.
    fn uaddr_bits(&mut self, sym: &str) -> u8 {
        let Some(r) = self.opts.data.clone() else {
            return 8;
        };
        let Some(target) = self.attach.iter().find_map(|p| match p {
            AttachPoint::Uprobe { target, .. }
            | AttachPoint::SourceLine { target, .. }
            | AttachPoint::Uretprobe { target, .. }
            | AttachPoint::Usdt { target, .. } => Some(target.clone()),
            _ => None,
        }) else {
            return 8;
        };
        let key = (target.clone(), sym.to_string(), String::new());
        match self
            .data_vars
            .entry(key)
            .or_insert_with(|| r.variable(&target, sym, ""))
        {
            Ok(v) => match v.size {
                1 => 8,
                2 => 16,
                4 => 32,
                _ => 64,
            },
            Err(_) => 8,
        }
    }

    /// What included headers define, before the script's own definitions. A
    /// struct with an error (an unknown member type) is not reported here but where
    /// the script uses it.
    fn header_decls(&mut self, d: &crate::cheader::CDecls) {
        for (name, v) in &d.constants {
            self.enumerators.insert(name.clone(), *v);
        }
        for e in &d.enums {
            let mut variants = Vec::new();
            for (name, v, _) in &e.variants {
                if let Some(v) = v {
                    self.enumerators.insert(name.clone(), *v);
                    variants.push((name.clone(), *v));
                }
            }
            self.enum_type(e.name.as_deref(), variants);
        }
        for (name, ty) in &d.typedefs {
            self.typedefs.insert(name.clone(), ty.clone());
        }
        for s in &d.structs {
            let name = &s.def.name;
            let kind = if s.def.union { "union" } else { "struct" };
            if let Some(why) = &s.unsupported {
                self.broken.insert(
                    name.clone(),
                    format!("{kind} `{name}` ({}) cannot be used: {why}", s.origin),
                );
                continue;
            }
            let before = self.diags.list.len();
            self.struct_def(&s.def);
            let errors: Vec<Diagnostic> = self.diags.list.drain(before..).collect();
            if let Some(e) = errors.iter().find(|e| e.is_error()) {
                self.structs.remove(name);
                self.broken.insert(
                    name.clone(),
                    format!(
                        "{kind} `{name}` ({}) cannot be used: {}",
                        s.origin, e.message
                    ),
                );
            }
        }
    }

    /// Record the enumerators of `enum { A = 1, B }`: each is one more than the one
    /// before unless given, as in C.
    fn enum_def(&mut self, e: &EnumDef) {
        let mut next: Option<i64> = Some(0);
        let mut variants = Vec::new();
        for (name, value, span) in &e.variants {
            let Some(v) = value.or(next) else {
                self.err(
                    *span,
                    format!("the value of `{name}` does not fit in an int64"),
                );
                continue;
            };
            if self.enumerators.insert(name.clone(), v).is_some() {
                self.err(*span, format!("the enumerator `{name}` is defined twice"));
            }
            variants.push((name.clone(), v));
            next = v.checked_add(1);
        }
        self.enum_type(e.name.as_deref(), variants);
    }

    /// Record an enum's values for printing: its enumerators' values print by name.
    fn enum_type(&mut self, name: Option<&str>, variants: Vec<(String, i64)>) {
        let t = EnumType {
            name: name.unwrap_or_default().to_string(),
            variants: variants.into(),
        };
        for (v, _) in t.variants.iter() {
            self.enum_of.insert(v.clone(), t.clone());
        }
        if let Some(n) = name {
            self.enum_types.insert(n.to_string(), t);
        }
    }

    fn struct_def(&mut self, s: &StructDef) {
        for n in &s.nested {
            self.struct_def(n);
        }
        let mut fields = Vec::new();
        let mut count = 0u64;
        for (t, n, span, width) in &s.fields {
            match self.resolve_type(t) {
                Ok(ty) => {
                    if let Some(w) = *width {
                        let bits = match ty {
                            Type::Int { bits, .. } => u64::from(bits),
                            Type::Bool => 8,
                            _ => 0,
                        };
                        if bits == 0 {
                            self.err(
                                *span,
                                format!(
                                    "the bit-field `{n}` must have an integer type, not `{ty}`"
                                ),
                            );
                            continue;
                        }
                        if w == 0 || w > bits {
                            self.err(
                                *span,
                                format!(
                                    "the width of the bit-field `{n}` must be 1 to {bits} (the bits of `{ty}`), not {w}"
                                ),
                            );
                            continue;
                        }
                    }
                    let width = width.map(|w| w as u8);
                    count = count.saturating_add(1 + members(&ty));
                    if count > MAX_TYPE_MEMBERS {
                        self.err(
                            *span,
                            format!(
                                "struct `{}` has too many fields and elements, nested ones \
                                 counted (at most {MAX_TYPE_MEMBERS})",
                                s.name
                            ),
                        );
                        break;
                    }
                    fields.push((n.clone(), ty, width));
                }
                Err(TypeError::Unknown) => {
                    self.err(*span, format!("unknown type `{t}` for field `{n}`"))
                }
                Err(TypeError::TooLarge(m) | TypeError::Broken(m)) => self.err(t.span, m),
            }
        }
        let layout = match c_layout(&s.name, &fields, s.union) {
            Ok(l) => l,
            Err(size) => {
                self.err(
                    s.span,
                    format!(
                        "struct `{}` is too large: {size} bytes (at most {})",
                        s.name,
                        u32::MAX
                    ),
                );
                CStruct {
                    name: s.name.clone(),
                    size: 0,
                    fields: Vec::new().into(),
                }
            }
        };
        self.structs.insert(s.name.clone(), layout);
    }

    /// [`Self::resolve_type`] for a use of a type: a type too large is reported here,
    /// an unknown one with `unknown` (at the type).
    /// Type the expression of a `typeof(expr)` type (not evaluated: lowering never
    /// sees it).
    /// Returns false when it has no type (reported once).
    fn typeof_operand(&mut self, t: &mut TypeExpr) -> bool {
        let TypeName::Typeof(x) = &mut t.base else {
            return true;
        };
        let before = self.diags.list.len();
        if self.expr(x) != Type::Void {
            return true;
        }
        // An error in the expression was reported already; else it has no value.
        if self.diags.list.len() == before {
            self.err(x.span, "typeof() needs an expression with a value");
        }
        false
    }

    fn type_of(&mut self, t: &TypeExpr, unknown: impl FnOnce() -> String) -> Option<Type> {
        match self.resolve_type(t) {
            Ok(ty) => Some(ty),
            Err(TypeError::Unknown) => {
                let msg = unknown();
                self.err(t.span, msg);
                None
            }
            Err(TypeError::TooLarge(m) | TypeError::Broken(m)) => {
                self.err(t.span, m);
                None
            }
        }
    }

    /// A written type to an ir type.
    fn resolve_type(&self, t: &TypeExpr) -> Result<Type, TypeError> {
        self.resolve_type_in(t, 0)
    }

    /// [`Self::resolve_type`] through `depth` typedefs.
    /// Struct `name` from the DWARF of the binaries the current probe names (the
    /// first that defines it), looked up once per name.
    fn dwarf_struct(&self, name: &str) -> Option<CStruct> {
        let r = self.opts.args_resolver.as_ref()?;
        if let Some(known) = self.dwarf_structs.borrow().get(name) {
            return known.clone();
        }
        // One look per binary (a wildcard's attach points share it).
        let mut looked = std::collections::HashSet::new();
        let found = self
            .attach
            .iter()
            .filter(|a| match a {
                AttachPoint::Uprobe { target, .. }
                | AttachPoint::SourceLine { target, .. }
                | AttachPoint::Uretprobe { target, .. }
                | AttachPoint::Call { target, .. } => looked.insert(target.clone()),
                _ => false,
            })
            .find_map(|a| match r.struct_type(a, name)? {
                Type::CStruct(s) => Some(s),
                _ => None,
            });
        if !self.attach.is_empty() {
            self.dwarf_structs
                .borrow_mut()
                .insert(name.to_string(), found.clone());
        }
        found
    }

    fn resolve_type_in(&self, t: &TypeExpr, depth: u32) -> Result<Type, TypeError> {
        if let (Some(Some(n)), Some((&first, rest))) = (t.array, t.dims.split_first()) {
            // `T x[a][b]...`: an array of `a` arrays `T[b]...` (C order).
            let elem = self.resolve_type_in(
                &TypeExpr {
                    pointer: 0,
                    array: Some(Some(first)),
                    dims: rest.to_vec(),
                    ..t.clone()
                },
                depth,
            )?;
            let mut ty = array_of(elem, n, t)?;
            for _ in 0..t.pointer {
                ty = Type::Ptr(Box::new(ty));
            }
            return Ok(ty);
        }
        let mut ty = match &t.base {
            TypeName::Int { bits, signed } => Type::Int {
                bits: *bits,
                signed: *signed,
            },
            TypeName::Bool => Type::Bool,
            // `char name[N]` is a string of N bytes (as bpftrace types it).
            TypeName::Char => match t.array {
                Some(Some(n)) if t.pointer == 0 => {
                    return u32::try_from(n).map(|cap| Type::Str { cap }).map_err(|_| {
                        TypeError::TooLarge(format!(
                            "`{t}` is too large: {n} bytes (at most {})",
                            u32::MAX
                        ))
                    })
                }
                _ => Type::Int {
                    bits: 8,
                    signed: true,
                },
            },
            TypeName::Void => {
                if t.pointer == 0 {
                    return Err(TypeError::Unknown);
                }
                Type::Int {
                    bits: 8,
                    signed: false,
                }
            }
            TypeName::Str => Type::Str {
                cap: self.config.strlen,
            },
            // An enum's values print by name; through a pointer or in an array it is
            // the C int it is.
            TypeName::Enum(n) => match self.enum_types.get(n) {
                Some(e) if t.pointer == 0 && t.array.is_none() => Type::Enum(e.clone()),
                _ => Type::Int {
                    bits: 32,
                    signed: true,
                },
            },
            TypeName::Struct(n) if self.broken.contains_key(n) => {
                return Err(TypeError::Broken(self.broken[n].clone()))
            }
            TypeName::Struct(n) => match self
                .structs
                .get(n)
                .cloned()
                .or_else(|| self.dwarf_struct(n))
            {
                Some(s) => Type::CStruct(s),
                None if t.pointer > 0 => Type::CStruct(CStruct {
                    name: n.clone(),
                    size: 0,
                    fields: Vec::new().into(),
                }),
                None => return Err(TypeError::Unknown),
            },
            // A typedef of a header (a chain of them at most 32 long).
            TypeName::Named(n) => match self.typedefs.get(n) {
                Some(named) if depth < 32 => self.resolve_type_in(named, depth + 1)?,
                _ => return Err(TypeError::Unknown),
            },
            // Checked by the caller (`typed_expr`) first.
            TypeName::Typeof(x) => match &x.ty {
                Type::Void => return Err(TypeError::Unknown),
                t => t.clone(),
            },
        };
        if let Some(Some(n)) = t.array {
            ty = array_of(ty, n, t)?;
        }
        for _ in 0..t.pointer {
            ty = Type::Ptr(Box::new(ty));
        }
        Ok(ty)
    }

    // ---- probes -----------------------------------------------------------------

    fn probe(&mut self, p: &mut Probe) -> ProbeInfo {
        self.kinds.clear();
        self.data_ty = None;
        self.attach.clear();
        self.names.clear();
        self.reads_event = false;
        self.vars.clear();
        self.scopes = vec![HashMap::new()];
        self.loose_vars.clear();
        self.loop_depth = 0;
        self.around = false;
        match p.advice {
            None | Some((AdviceKind::Before, _)) => {}
            // `after` a function is its return.
            Some((AdviceKind::After, span)) => {
                for a in &mut p.attach {
                    if a.provider == "uprobe" {
                        a.provider = "uretprobe".into();
                    } else {
                        self.err(
                            span,
                            format!(
                                "`after` advice applies to functions (`uprobe:BIN:FUNC`), not `{}`",
                                a.raw
                            ),
                        );
                    }
                }
            }
            Some((AdviceKind::Around, span)) => {
                self.around = true;
                if !self.config.unsafe_ok {
                    self.push(
                        Diagnostic::error(
                            span,
                            "around advice changes what the program does: it needs --unsafe",
                        )
                        .with_help("run weft with --unsafe to allow it"),
                    );
                }
            }
        }
        for a in &p.attach {
            self.attach_point(a);
        }
        if self.around {
            for (a, ap) in p.attach.iter().zip(&self.attach.clone()) {
                if !matches!(
                    ap,
                    AttachPoint::Uprobe { offset: 0, .. } | AttachPoint::Call { .. }
                ) {
                    self.err(
                        a.span,
                        format!(
                            "around advice goes on a function's entry (`uprobe:BIN:FUNC`) or its call sites (`call:BIN:FUNC`), not `{}`",
                            a.raw
                        ),
                    );
                }
            }
        }
        if let Some(pred) = &mut p.predicate {
            let t = self.expr(pred);
            if t != Type::Void && !is_truthy(&t) {
                self.err(
                    pred.span,
                    format!("the predicate must be an integer or a boolean, not `{t}`"),
                );
            }
        }
        self.block_stmts(&mut p.body);
        let vars: Vec<Type> = self
            .vars
            .iter()
            .map(|v| v.ty.clone().unwrap_or(Type::I64))
            .collect();
        for (i, t) in vars.iter().enumerate() {
            self.var_hints
                .insert((self.probe_index, i as u32), t.clone());
        }
        self.probe_index += 1;
        let events = if self.reads_event {
            self.attach
                .clone()
                .iter()
                .filter_map(|a| match a {
                    AttachPoint::Tracepoint { category, name } => {
                        self.event_fields(category, name).ok()
                    }
                    _ => None,
                })
                .collect()
        } else {
            Vec::new()
        };
        ProbeInfo {
            attach: self.attach.clone(),
            names: self.names.clone(),
            events,
            vars,
            around: self.around,
        }
    }

    fn attach_point(&mut self, a: &AttachSpec) {
        // `probe` names BEGIN/END as written (`begin` or `BEGIN`), as upstream does.
        let name = match a.provider.as_str() {
            "BEGIN" | "END" if a.raw.eq_ignore_ascii_case(&a.provider) => a.raw.clone(),
            // A function-argument watchpoint (`watchpoint` desugars it to these).
            "set" | "get"
                if a.raw.starts_with("watchpoint:") || a.raw.starts_with("asyncwatchpoint:") =>
            {
                a.raw.clone()
            }
            _ => crate::dump::attach_text(a),
        };
        if matches!(a.provider.as_str(), "tracepoint" | "kernel") {
            match self.kernel_attach(a) {
                Ok(points) => {
                    for (p, n) in points {
                        self.attach.push(p);
                        self.names.push(n);
                    }
                }
                Err(msg) => self.err(a.span, msg),
            }
            self.kinds.push((Kind::Tracepoint, name));
            return;
        }
        if let Some((_, span)) = a.within.as_ref().filter(|_| a.provider != "call") {
            self.err(
                *span,
                format!(
                    "`within` restricts the call sites of a `call:` probe, not a {} probe",
                    a.provider
                ),
            );
        }
        let (kind, point) = match self.attach_inner(a) {
            Ok(x) => x,
            Err(msg) => {
                self.err(a.span, msg);
                (Kind::Other, None)
            }
        };
        if matches!(point, Some(AttachPoint::Data { .. })) {
            self.data_points += 1;
            if self.data_points > MAX_DATA_POINTS {
                self.err(
                    a.span,
                    format!(
                        "at most {MAX_DATA_POINTS} data pointcuts in a program; this is \
                         number {}",
                        self.data_points
                    ),
                );
            }
        }
        if let Some(p) = point {
            self.attach.push(p);
            self.names.push(name.clone());
        }
        self.kinds.push((kind, name));
    }

    /// What the running kernel offers (asked once), when there is a resolver.
    fn kernel_offers(&mut self) -> Option<KernelOffers> {
        if self.kernel.is_none() {
            self.kernel = Some(self.opts.events.as_ref().map(|r| r.kernel()));
        }
        self.kernel.clone().flatten()
    }

    /// A tracepoint's record layout (read once).
    fn event_fields(&mut self, category: &str, name: &str) -> EventLayout {
        let key = (category.to_string(), name.to_string());
        if let Some(f) = self.event_fields.get(&key) {
            return f.clone();
        }
        let f = match &self.opts.events {
            Some(r) => r.fields(category, name).map(Arc::from),
            None => Err("kernel tracepoints are not available (no tracefs)".to_string()),
        };
        self.event_fields.insert(key, f.clone());
        f
    }

    /// `tracepoint:CATEGORY:NAME` and `kernel:syscall:NAME[:exit]`: the tracepoints
    /// they name (wildcards expanded), each with its full name.
    fn kernel_attach(&mut self, a: &AttachSpec) -> Result<Vec<(AttachPoint, String)>, String> {
        let f = &a.fields;
        // (category, name pattern, the prefix `kernel:syscall:` puts before NAME).
        let (category, pattern, syscall) = match a.provider.as_str() {
            "tracepoint" => match f.as_slice() {
                [c, n] if !c.is_empty() && !n.is_empty() => (c.clone(), n.clone(), None),
                _ => {
                    return Err(format!(
                        "invalid attach point `{}`: a tracepoint is tracepoint:CATEGORY:NAME",
                        a.raw
                    ))
                }
            },
            _ => {
                let (call, exit) = match f.as_slice() {
                    [k, c] if k == "syscall" => (c, false),
                    [k, c, e] if k == "syscall" && e == "exit" => (c, true),
                    _ => {
                        return Err(format!(
                            "invalid attach point `{}`: the kernel provider has system calls: \
                             kernel:syscall:NAME (entry) and kernel:syscall:NAME:exit",
                            a.raw
                        ))
                    }
                };
                if call.is_empty() {
                    return Err(format!(
                        "invalid attach point `{}`: missing system call name",
                        a.raw
                    ));
                }
                let prefix = if exit { "sys_exit_" } else { "sys_enter_" };
                let p = format!("{prefix}{call}");
                ("syscalls".to_string(), p, Some((prefix, exit)))
            }
        };
        let Some(r) = self.opts.events.clone() else {
            return Err(format!(
                "{}: kernel tracepoints are not available (weft was given no tracefs)",
                a.raw
            ));
        };
        let found = r
            .tracepoints(&category, &pattern)
            .map_err(|e| format!("{}: {e}", a.raw))?;
        if found.is_empty() {
            return Err(self.no_tracepoint(a, &category, &pattern, syscall.map(|s| s.0)));
        }
        Ok(found
            .into_iter()
            .map(|(category, name)| {
                let full = match syscall {
                    Some((prefix, exit)) => format!(
                        "kernel:syscall:{}{}",
                        name.strip_prefix(prefix).unwrap_or(&name),
                        if exit { ":exit" } else { "" }
                    ),
                    None => format!("tracepoint:{category}:{name}"),
                };
                (AttachPoint::Tracepoint { category, name }, full)
            })
            .collect())
    }

    /// Why `category:pattern` names no tracepoint, with the closest names.
    fn no_tracepoint(
        &self,
        a: &AttachSpec,
        category: &str,
        pattern: &str,
        syscall_prefix: Option<&str>,
    ) -> String {
        let wild = |t: &str| t.contains(['*', '?', '[']);
        if wild(category) || wild(pattern) {
            return format!("no tracepoint matches `{}`", a.raw);
        }
        let all = self
            .opts
            .events
            .as_ref()
            .and_then(|r| r.tracepoints("*", "*").ok())
            .unwrap_or_default();
        if let Some(prefix) = syscall_prefix {
            let call = pattern.strip_prefix(prefix).unwrap_or(pattern);
            let calls = all
                .iter()
                .filter(|(c, _)| c == "syscalls")
                .filter_map(|(_, n)| n.strip_prefix(prefix));
            let mut msg = format!("unknown system call `{call}` in `{}`", a.raw);
            if let Some(s) = suggest(call, calls) {
                msg = format!("{msg}; did you mean `{s}`?");
            }
            return msg;
        }
        if all.iter().any(|(c, _)| c == category) {
            let names = all
                .iter()
                .filter(|(c, _)| c == category)
                .map(|(_, n)| n.as_str());
            let mut msg = format!("unknown tracepoint `{}`", a.raw);
            if let Some(s) = suggest(pattern, names) {
                msg = format!("{msg}; did you mean `tracepoint:{category}:{s}`?");
            }
            return msg;
        }
        let mut categories: Vec<&str> = all.iter().map(|(c, _)| c.as_str()).collect();
        categories.dedup();
        let mut msg = format!("unknown tracepoint category `{category}` in `{}`", a.raw);
        if let Some(s) = suggest(category, categories) {
            msg = format!("{msg}; did you mean `{s}`?");
        }
        msg
    }

    fn attach_inner(&mut self, a: &AttachSpec) -> Result<(Kind, Option<AttachPoint>), String> {
        let prov = a.provider.as_str();
        // C++ and Rust paths unquoted (`uprobe:./app:ns::Class::method*`): the
        // `::` splits into an empty field, joined back into the function's name.
        let joined;
        let f = if matches!(prov, "uprobe" | "uretprobe" | "call") {
            joined = join_scopes(&a.fields);
            &joined
        } else {
            &a.fields
        };
        let kernel = match prov {
            "kprobe" | "kretprobe" | "kfunc" | "kretfunc" | "fentry" | "fexit" => {
                self.kernel_offers()
            }
            _ => None,
        };
        if let Some(msg) = unsupported::provider(prov, kernel.as_ref()) {
            return Err(msg);
        }
        let arity = |n: &[usize]| -> Result<(), String> {
            if n.contains(&f.len()) {
                Ok(())
            } else {
                Err(format!(
                    "invalid attach point `{}`: wrong number of `:`-separated fields for {prov}",
                    a.raw
                ))
            }
        };
        match prov {
            "BEGIN" | "END" => {
                arity(&[0])?;
                let k = if prov == "BEGIN" {
                    Kind::Begin
                } else {
                    Kind::End
                };
                Ok((
                    k,
                    Some(if prov == "BEGIN" {
                        AttachPoint::Begin
                    } else {
                        AttachPoint::End
                    }),
                ))
            }
            "uprobe" | "uretprobe" => {
                arity(&[1, 2, 3])?;
                // `uprobe:bin:cpp:func` names the language; weft matches either.
                let (target, func) = match f.len() {
                    1 => (String::new(), f[0].clone()),
                    2 => (f[0].clone(), f[1].clone()),
                    _ => {
                        if !matches!(f[1].as_str(), "c" | "cpp") {
                            return Err(format!(
                                "invalid attach point `{}`: unknown language `{}`",
                                a.raw, f[1]
                            ));
                        }
                        (f[0].clone(), f[2].clone())
                    }
                };
                if func.is_empty() {
                    return Err(format!(
                        "invalid attach point `{}`: missing function name",
                        a.raw
                    ));
                }
                if let Some((target, file, line)) = source_line(&target, &func) {
                    if prov == "uretprobe" {
                        return Err(format!(
                            "uretprobe `{}`: a source line has no return; use uprobe",
                            a.raw
                        ));
                    }
                    let line = line.map_err(|why| {
                        format!("invalid line in attach point `{}`: {why}", a.raw)
                    })?;
                    let point = AttachPoint::SourceLine { target, file, line };
                    if let Some(r) = self.opts.args_resolver.as_ref() {
                        r.source_line(&point)?;
                    }
                    return Ok((Kind::Uprobe, Some(point)));
                }
                let (func, offset) = match func.rsplit_once('+') {
                    Some((fname, off)) if !fname.is_empty() => {
                        let off = crate::lexer::parse_int(off).map_err(|_| {
                            format!("invalid offset `{off}` in attach point `{}`", a.raw)
                        })?;
                        (fname.to_string(), off)
                    }
                    _ => (func, 0),
                };
                if prov == "uretprobe" {
                    if offset != 0 {
                        return Err(format!("uretprobe `{}` cannot have an offset", a.raw));
                    }
                    Ok((
                        Kind::Uretprobe,
                        Some(AttachPoint::Uretprobe { target, func }),
                    ))
                } else {
                    Ok((
                        Kind::Uprobe,
                        Some(AttachPoint::Uprobe {
                            target,
                            func,
                            offset,
                        }),
                    ))
                }
            }
            "call" => {
                arity(&[1, 2])?;
                let (target, func) = match f.len() {
                    1 => (String::new(), f[0].clone()),
                    _ => (f[0].clone(), f[1].clone()),
                };
                if func.is_empty() {
                    return Err(format!(
                        "invalid attach point `{}`: missing function name",
                        a.raw
                    ));
                }
                if func.contains('+') {
                    return Err(format!(
                        "invalid attach point `{}`: a call site has no offset",
                        a.raw
                    ));
                }
                Ok((
                    Kind::Call,
                    Some(AttachPoint::Call {
                        target,
                        func,
                        within: a.within.as_ref().map(|(w, _)| w.clone()),
                    }),
                ))
            }
            "usdt" => {
                arity(&[1, 2, 3])?;
                let p = match f.len() {
                    1 => AttachPoint::Usdt {
                        target: String::new(),
                        provider: String::new(),
                        name: f[0].clone(),
                    },
                    2 => AttachPoint::Usdt {
                        target: f[0].clone(),
                        provider: String::new(),
                        name: f[1].clone(),
                    },
                    _ => AttachPoint::Usdt {
                        target: f[0].clone(),
                        provider: f[1].clone(),
                        name: f[2].clone(),
                    },
                };
                Ok((Kind::Usdt, Some(p)))
            }
            "interval" | "profile" => {
                arity(&[1, 2])?;
                let bad = || {
                    format!(
                        "invalid {prov} `{}`: expected {prov}:UNIT:N with UNIT s, ms, us, ns or hz",
                        a.raw
                    )
                };
                let (unit, n) = if f.len() == 2 {
                    (f[0].as_str(), f[1].as_str())
                } else {
                    ("ns", f[0].as_str())
                };
                let n = crate::lexer::parse_int(&n.replace('_', "")).map_err(|_| bad())?;
                if n == 0 {
                    return Err(format!(
                        "invalid {prov} `{}`: the count must be positive",
                        a.raw
                    ));
                }
                let period_ns = match unit {
                    "s" => n.checked_mul(1_000_000_000),
                    "ms" => n.checked_mul(1_000_000),
                    "us" => n.checked_mul(1_000),
                    "ns" => Some(n),
                    "hz" => Some(1_000_000_000 / n).filter(|p| *p > 0),
                    _ => return Err(bad()),
                }
                .ok_or_else(bad)?;
                if prov == "interval" {
                    Ok((Kind::Interval, Some(AttachPoint::Interval { period_ns })))
                } else {
                    let hz = if unit == "hz" {
                        n
                    } else {
                        (1_000_000_000 / period_ns).max(1)
                    };
                    // The agent's per-thread timers (and bpftrace's perf events in
                    // practice) sample at most this often.
                    if hz > MAX_PROFILE_HZ {
                        return Err(format!(
                            "invalid profile `{}`: at most {MAX_PROFILE_HZ} samples a second \
                             (this is {hz})",
                            a.raw
                        ));
                    }
                    Ok((Kind::Profile, Some(AttachPoint::Profile { hz })))
                }
            }
            "set" | "get" => {
                arity(&[1, 2])?;
                // `watchpoint:FUNC+argN:LEN:rw` becomes one `get` on every access.
                let rw = (a.raw.starts_with("watchpoint:")
                    || a.raw.starts_with("asyncwatchpoint:"))
                    && (a.raw.ends_with(":rw") || a.raw.ends_with(":wr"));
                let access = if prov == "set" {
                    DataAccess::Write
                } else if rw {
                    DataAccess::ReadWrite
                } else {
                    DataAccess::Read
                };
                let kind = if prov == "set" {
                    Kind::DataSet
                } else {
                    Kind::DataGet
                };
                if let Some(inner) = f
                    .last()
                    .filter(|_| f.len() == 1)
                    .and_then(|x| x.strip_prefix("addr("))
                {
                    let (map, size) = data_addr(inner).ok_or_else(|| {
                        format!(
                            "invalid attach point `{}`: expected {prov}:addr(@MAP, SIZE) with \
                             a map without keys and SIZE at least 1 (bytes)",
                            a.raw
                        )
                    })?;
                    // The last pass knows every map: the one named must exist and
                    // have no keys.
                    if self.report {
                        match self.map_state(&map) {
                            None => {
                                return Err(format!(
                                    "`{}`: {map} is never assigned (assign it an address in \
                                     an earlier probe, e.g. `{map} = arg0;`)",
                                    a.raw
                                ))
                            }
                            Some(st) if matches!(st.key, Some(Some(_))) => {
                                return Err(format!(
                                    "`{}`: {map} has keys; addr() takes a map without keys",
                                    a.raw
                                ))
                            }
                            Some(_) => {}
                        }
                    }
                    // `old`/`new` are the first 8 bytes of a larger range.
                    self.data_ty = Some(Type::Int {
                        bits: (size.min(8) * 8) as u8,
                        signed: false,
                    });
                    return Ok((
                        kind,
                        Some(AttachPoint::Data {
                            place: DataPlace::Map { map, size },
                            access,
                        }),
                    ));
                }
                if f.len() == 1 {
                    return Err(format!(
                        "invalid attach point `{}`: expected {prov}:BIN:VAR (the binary that \
                         defines the variable) or {prov}:addr(@MAP, SIZE)",
                        a.raw
                    ));
                }
                let (target, text) = (f[0].clone(), f[1].as_str());
                let split = text.find(['.', '[']).unwrap_or(text.len());
                let (var, path) = text.split_at(split);
                let ident = |v: &str| {
                    v.chars()
                        .next()
                        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                        && v.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                };
                if !ident(var) {
                    return Err(format!(
                        "invalid attach point `{}`: expected {prov}:BIN:VAR, with VAR a global \
                         or static variable (maybe followed by .FIELD or [INDEX]), or \
                         {prov}:addr(@MAP, SIZE)",
                        a.raw
                    ));
                }
                if let Some(r) = self.opts.data.clone() {
                    let key = (target.clone(), var.to_string(), path.to_string());
                    let v = self
                        .data_vars
                        .entry(key)
                        .or_insert_with(|| r.variable(&target, var, path))
                        .clone()
                        .map_err(|e| format!("{}: {e}", a.raw))?;
                    self.data_ty.get_or_insert(v.ty);
                } else {
                    self.data_ty.get_or_insert(Type::U64);
                }
                Ok((
                    kind,
                    Some(AttachPoint::Data {
                        place: DataPlace::Var {
                            target,
                            var: var.to_string(),
                            path: path.to_string(),
                        },
                        access,
                    }),
                ))
            }
            "watchpoint" => {
                arity(&[3])?;
                let addr = crate::lexer::parse_int(&f[0]).ok().filter(|a| *a != 0);
                let addr = addr.ok_or_else(|| {
                    format!(
                        "invalid watchpoint `{}`: expected watchpoint:ADDR:LEN:MODE with an \
                         absolute address, or watchpoint:FUNCTION+argN:LEN:MODE",
                        a.raw
                    )
                })?;
                let len = match crate::lexer::parse_int(&f[1]) {
                    Ok(n @ (1 | 2 | 4 | 8)) => n as u8,
                    _ => {
                        return Err(format!(
                            "invalid watchpoint `{}`: the length must be 1, 2, 4 or 8",
                            a.raw
                        ))
                    }
                };
                if !addr.is_multiple_of(u64::from(len)) {
                    return Err(format!(
                        "invalid watchpoint `{}`: the address must be aligned to the length",
                        a.raw
                    ));
                }
                let (kind, access) = match f[2].as_str() {
                    "w" => (Kind::DataSet, DataAccess::Write),
                    "r" => (Kind::DataGet, DataAccess::Read),
                    "rw" | "wr" => (Kind::DataGet, DataAccess::ReadWrite),
                    m => {
                        return Err(format!(
                            "invalid watchpoint `{}`: mode `{m}` is not r, w or rw (x86 \
                             hardware watchpoints do not watch execution in weft; use uprobe)",
                            a.raw
                        ))
                    }
                };
                self.data_ty.get_or_insert(Type::Int {
                    bits: len * 8,
                    signed: false,
                });
                Ok((
                    kind,
                    Some(AttachPoint::Data {
                        place: DataPlace::Addr { addr, len },
                        access,
                    }),
                ))
            }
            _ => {
                const PROVIDERS: &[&str] = &[
                    "BEGIN",
                    "END",
                    "uprobe",
                    "uretprobe",
                    "execution",
                    "call",
                    "usdt",
                    "interval",
                    "profile",
                    "kprobe",
                    "kretprobe",
                    "tracepoint",
                    "kernel",
                    "rawtracepoint",
                    "software",
                    "hardware",
                    "watchpoint",
                    "set",
                    "get",
                ];
                let mut msg = format!("unknown probe type `{prov}`");
                if let Some(s) = suggest(prov, PROVIDERS.iter().copied()) {
                    msg = format!("{msg}; did you mean `{s}`?");
                }
                Err(msg)
            }
        }
    }

    /// Every attach point of the probe satisfies `ok` (unknown ones always do).
    fn all_kinds(&self, ok: impl Fn(Kind) -> bool) -> Option<String> {
        self.kinds
            .iter()
            .find(|(k, _)| *k != Kind::Other && !ok(*k))
            .map(|(_, n)| n.clone())
    }

    // ---- statements -------------------------------------------------------------

    fn block_stmts(&mut self, b: &mut Block) -> Type {
        self.scopes.push(HashMap::new());
        // Upstream warns at the first statement after one that always jumps away
        // (its control-flow pass: `Unreachable statement.`).
        let mut ended: Option<&'static str> = None;
        let mut warned = false;
        for s in &mut b.stmts {
            if let Some(after) = ended.filter(|_| self.report && !warned) {
                let msg = format!("unreachable statement: it follows {after}, so it never runs");
                self.diags.warning(s.span, msg);
                warned = true;
            }
            self.stmt(s);
            ended = ended.or_else(|| jumps_away(s, self.loop_depth > 0));
        }
        if let (Some(after), Some(v)) = (ended, &b.value) {
            if !warned && self.report {
                let msg = format!(
                    "unreachable expression: it follows {after}, so the block has no value"
                );
                self.diags.warning(v.span, msg);
            }
        }
        let t = match &mut b.value {
            Some(v) => self.expr(v),
            None => Type::Void,
        };
        self.scopes.pop();
        t
    }

    /// A variable in scope; else (bpftrace 0.17 compatibility: variables were
    /// probe-wide) one first assigned without `let` in a block that has closed.
    fn lookup_var(&self, name: &str) -> Option<u32> {
        self.scopes
            .iter()
            .rev()
            .find_map(|s| s.get(name).copied())
            .or_else(|| self.loose_vars.get(name).copied())
    }

    fn declare_var(&mut self, v: &mut VarRef, ty: Option<Type>) -> u32 {
        let id = self.vars.len() as u32;
        let ty = match (ty, self.var_hints.get(&(self.probe_index, id))) {
            (Some(t), Some(h)) => Some(unify(h, &t).filter(|u| *u == *h).unwrap_or(t)),
            (None, Some(h)) => Some(h.clone()),
            (t, None) => t,
        };
        self.vars.push(VarState { ty, span: v.span });
        self.scopes
            .last_mut()
            .expect("scope")
            .insert(v.name.clone(), id);
        v.id = Some(id);
        id
    }

    fn stmt(&mut self, s: &mut Stmt) {
        match &mut s.kind {
            StmtKind::Expr(e) => {
                self.expr_stmt(e);
            }
            StmtKind::Assign { target, op, value } => self.assign(target, *op, value, s.span),
            StmtKind::Let { var, ty, value } => {
                if let Some(prev) = self.scopes.last().and_then(|sc| sc.get(&var.name).copied()) {
                    let prev_span = self.vars[prev as usize].span;
                    self.push(
                        Diagnostic::error(
                            var.span,
                            format!("variable `${}` is already declared in this scope", var.name),
                        )
                        .with_note(Some(prev_span), "first declared here"),
                    );
                }
                let declared = match ty {
                    Some(t) => {
                        if self.typeof_operand(t) {
                            self.type_of(t, || format!("unknown type `{t}`"))
                        } else {
                            None
                        }
                    }
                    None => None,
                };
                let vt = match value {
                    Some(v) => {
                        let vt = self.value_expr(v);
                        match &declared {
                            Some(d) if vt != Type::Void && unify(d, &vt).is_none() => {
                                let msg = init_mismatch(&var.name, d, &vt);
                                self.err(v.span, msg);
                            }
                            _ => {}
                        }
                        Some(vt).filter(|t| *t != Type::Void)
                    }
                    None => None,
                };
                let t = declared.or(vt).or_else(|| {
                    if value.is_none() {
                        None
                    } else {
                        Some(Type::Void)
                    }
                });
                let t = t.filter(|t| *t != Type::Void);
                self.declare_var(var, t);
            }
            StmtKind::If {
                cond,
                then,
                otherwise,
            } => {
                self.condition(cond);
                self.block_stmts(then);
                if let Some(o) = otherwise {
                    self.block_stmts(o);
                }
            }
            StmtKind::Unroll { count, body } => {
                self.expr(count);
                match literal_int(count) {
                    Some(n) if (1..=100).contains(&n) => {}
                    Some(_) => self.err(count.span, "unroll count must be between 1 and 100"),
                    None => self.err(count.span, "unroll count must be an integer literal"),
                }
                self.block_stmts(body);
            }
            StmtKind::While { cond, body } => {
                self.condition(cond);
                self.loop_depth += 1;
                self.block_stmts(body);
                self.loop_depth -= 1;
            }
            StmtKind::For { var, iter, body } => {
                let vt = match iter {
                    ForIter::Map(m) => self.for_map(m),
                    ForIter::Range(a, b) => {
                        let ta = self.expr(a);
                        let tb = self.expr(b);
                        for (e, t) in [(&*a, &ta), (&*b, &tb)] {
                            if *t != Type::Void && !is_int(t) {
                                self.err(
                                    e.span,
                                    format!("range bounds must be integers, not `{t}`"),
                                );
                            }
                        }
                        Some(int64(signed(&ta) && signed(&tb)))
                    }
                };
                self.scopes.push(HashMap::new());
                self.declare_var(var, vt);
                self.loop_depth += 1;
                self.block_stmts(body);
                self.loop_depth -= 1;
                self.scopes.pop();
            }
            StmtKind::Break | StmtKind::Continue => {
                if self.loop_depth == 0 {
                    let w = if matches!(s.kind, StmtKind::Break) {
                        "break"
                    } else {
                        "continue"
                    };
                    self.err(s.span, format!("`{w}` outside of a loop"));
                }
            }
            StmtKind::Return(v) => {
                if let Some(v) = v {
                    let t = self.expr(v);
                    if t != Type::Void && !is_int(&t) && !(self.around && matches!(t, Type::Ptr(_)))
                    {
                        self.err(
                            v.span,
                            format!("a probe can only return an integer, not `{t}`"),
                        );
                    }
                }
            }
            StmtKind::Block(b) => {
                self.block_stmts(b);
            }
        }
    }

    fn expr_stmt(&mut self, e: &mut Expr) {
        self.expr(e);
    }

    fn condition(&mut self, cond: &mut Expr) {
        let t = self.expr(cond);
        if t != Type::Void && !is_truthy(&t) {
            self.err(
                cond.span,
                format!("a condition must be an integer or a boolean, not `{t}`"),
            );
        }
    }

    fn for_map(&mut self, m: &mut MapRef) -> Option<Type> {
        self.touch_map(m);
        let state = self.map_state(&m.name);
        let Some(state) = state else {
            self.undefined_map(m);
            return None;
        };
        let key = match state.key {
            Some(Some(k)) => k,
            Some(None) => {
                self.err(
                    m.span,
                    format!("cannot iterate over `{}`: it has no keys", m.name),
                );
                return None;
            }
            None => return None,
        };
        let value = match &state.value {
            Some(MapValue::Plain(t)) => t.clone(),
            Some(MapValue::Count) => Type::U64,
            Some(
                MapValue::Sum { signed }
                | MapValue::Min { signed }
                | MapValue::Max { signed }
                | MapValue::Avg { signed },
            ) => int64(*signed),
            Some(v) => {
                let v = describe_value(v);
                self.err(
                    m.span,
                    format!(
                        "cannot iterate over `{}`: its values are {v} aggregations",
                        m.name
                    ),
                );
                return None;
            }
            None => return None,
        };
        Some(Type::Tuple(vec![key, value]))
    }

    /// Check a value being assigned (aggregations are rejected here; they are
    /// handled by `assign`).
    fn value_expr(&mut self, v: &mut Expr) -> Type {
        let t = self.expr_keep(v);
        if let Some(why) = uncopyable(&t) {
            self.err(v.span, why);
            return Type::Void;
        }
        self.no_void_call(v);
        t
    }

    /// Refuse a call that returns nothing (`join()`, `printf()`, ...) where a value is
    /// needed: an assignment, or an argument (`printf("%s", join(arg1))`, which
    /// upstream refuses: "%s specifier expects a value of type string (none
    /// supplied)").
    fn no_void_call(&mut self, v: &Expr) {
        let ExprKind::Call { name, .. } = &v.kind else {
            return;
        };
        if !builtins::function(name).is_some_and(|b| b.void) {
            return;
        }
        let mut d = Diagnostic::error(v.span, format!("`{name}()` does not return a value"));
        if name == "join" {
            d = d.with_help("join() prints the joined strings itself: call it as a statement");
        }
        self.push(d);
    }

    fn assign(&mut self, target: &mut LValue, op: Option<BinOp>, value: &mut Expr, span: Span) {
        if let Some(op) = op {
            self.division_by_zero(op, value);
        }
        match target {
            LValue::Var(v) => {
                let vt = self.value_expr(value);
                if let Some(op) = op {
                    let Some(id) = self.lookup_var(&v.name) else {
                        self.err(
                            v.span,
                            format!("variable `${}` is used before it is assigned", v.name),
                        );
                        return;
                    };
                    v.id = Some(id);
                    let cur = self.vars[id as usize].ty.clone().unwrap_or(Type::I64);
                    if matches!(cur, Type::Ptr(_)) && !matches!(op, BinOp::Add | BinOp::Sub) {
                        self.err(
                            span,
                            format!(
                                "`{}=` cannot be used on `${}`, a pointer (`{cur}`); only `+=` and `-=` can",
                                op.text(),
                                v.name
                            ),
                        );
                    } else if vt != Type::Void
                        && (!is_int(&vt) || !(is_int(&cur) || matches!(cur, Type::Ptr(_))))
                    {
                        self.err(
                            span,
                            format!("`{}=` needs integers, not `{cur}` and `{vt}`", op.text()),
                        );
                    }
                    if self.vars[id as usize].ty.is_none() {
                        self.vars[id as usize].ty = Some(Type::I64);
                    }
                    return;
                }
                match self.lookup_var(&v.name) {
                    None => {
                        let t = Some(vt).filter(|t| *t != Type::Void);
                        let id = self.declare_var(v, t);
                        self.loose_vars.insert(v.name.clone(), id);
                    }
                    Some(id) => {
                        v.id = Some(id);
                        let state = self.vars[id as usize].clone();
                        match state.ty {
                            None => self.vars[id as usize].ty = Some(vt).filter(|t| *t != Type::Void),
                            Some(cur) if vt == Type::Void => {
                                let _ = cur;
                            }
                            Some(cur) => match unify(&cur, &vt) {
                                Some(t) => self.vars[id as usize].ty = Some(t),
                                None => self.push(
                                    Diagnostic::error(
                                        value.span,
                                        format!(
                                            "type mismatch for `${}`: assigning a value of type `{vt}` to a variable of type `{cur}`",
                                            v.name
                                        ),
                                    )
                                    .with_note(Some(state.span), "the variable's type was set here"),
                                ),
                            },
                        }
                    }
                }
            }
            LValue::Map(m) => {
                self.touch_map(m);
                let key = self.map_keys(m);
                if let (None, ExprKind::Call { name, .. }) = (op, &value.kind) {
                    if builtins::is_aggregation(name) {
                        let agg = self.aggregation(value);
                        self.set_map_key(m, key);
                        if let Some(agg) = agg {
                            self.set_map_value(m, agg, value.span);
                        }
                        return;
                    }
                }
                let vt = self.value_expr(value);
                self.set_map_key(m, key);
                if let (Some(op), Some(pt)) = (op, self.map_pointer(&m.name)) {
                    // `@p += n` on a map of pointers: pointer arithmetic (upstream
                    // docs/language.md, Arithmetic Operators).
                    if !matches!(op, BinOp::Add | BinOp::Sub) {
                        self.err(
                            span,
                            format!(
                                "`{}=` cannot be used on `{}`, which holds pointers (`{pt}`); only `+=` and `-=` can",
                                op.text(),
                                m.name
                            ),
                        );
                    } else if vt != Type::Void && !is_int(&vt) {
                        self.err(
                            value.span,
                            format!("`{}=` on a pointer needs an integer, not `{vt}`", op.text()),
                        );
                    }
                    return;
                }
                if op.is_some() {
                    if vt != Type::Void && !is_int(&vt) {
                        self.err(
                            value.span,
                            format!(
                                "`{}=` needs an integer, not `{vt}`",
                                op.map(|o| o.text()).unwrap_or("")
                            ),
                        );
                    }
                    // `@m += x` on a new map starts it as an integer map.
                    self.set_map_value(
                        m,
                        MapValue::Plain(int64(signed(&vt) || vt == Type::Void)),
                        m.span,
                    );
                    self.require_int_map(m);
                    return;
                }
                if vt == Type::Void {
                    return;
                }
                self.set_map_value(m, MapValue::Plain(storage(&vt)), value.span);
            }
        }
    }

    /// A warning for `x / 0`, `x % 0`, `x /= 0`, `x %= 0`: the division happens at
    /// run time, gives 0 and is counted as an error then.
    fn division_by_zero(&mut self, op: BinOp, rhs: &Expr) {
        if matches!(op, BinOp::Div | BinOp::Mod) && matches!(rhs.kind, ExprKind::Int(0)) {
            let what = if op == BinOp::Div {
                "division"
            } else {
                "modulo"
            };
            self.push(
                Diagnostic::warning(rhs.span, format!("{what} by zero"))
                    .with_help("the result is 0, and weft counts it as an error at exit"),
            );
        }
    }

    /// The pointer type a map holds, when its values are pointers (known in this
    /// pass or from the previous one).
    fn map_pointer(&self, name: &str) -> Option<Type> {
        match self.map_state(name)?.value? {
            MapValue::Plain(t @ Type::Ptr(_)) => Some(t),
            _ => None,
        }
    }

    fn require_int_map(&mut self, m: &MapRef) {
        if let Some(MapValue::Plain(t)) = self.maps.get(&m.name).and_then(|s| s.value.clone()) {
            if !is_int(&t) {
                self.err(
                    m.span,
                    format!("`{}` holds `{t}` values, not integers", m.name),
                );
            }
        }
    }

    // ---- maps -------------------------------------------------------------------

    fn touch_map(&mut self, m: &MapRef) {
        let st = self.maps.entry(m.name.clone()).or_insert_with(|| MapState {
            first: u32::MAX,
            ..Default::default()
        });
        st.first = st.first.min(m.name_span.start);
    }

    /// Current knowledge of a map: this pass's, else the previous pass's.
    fn map_state(&self, name: &str) -> Option<MapState> {
        let cur = self.maps.get(name);
        let hint = self.hints.get(name);
        let mut st = cur.cloned().unwrap_or_default();
        if let Some(h) = hint {
            if st.key.is_none() {
                st.key = h.key.clone();
                st.key_span = h.key_span;
            }
            if st.value.is_none() {
                st.value = h.value.clone();
                st.value_span = h.value_span;
            }
        }
        if st.key.is_none() && st.value.is_none() {
            None
        } else {
            Some(st)
        }
    }

    /// Check the keys of a map use; returns the key type (`Some(None)` for no key,
    /// `None` when unknown).
    fn map_keys(&mut self, m: &mut MapRef) -> Option<Option<Type>> {
        let Some(keys) = &mut m.keys else {
            return Some(None);
        };
        let mut ts = Vec::new();
        let mut unknown = false;
        for k in keys.iter_mut() {
            let t = self.value_expr(k);
            if t == Type::Void {
                unknown = true;
            }
            ts.push(storage(&t));
        }
        if unknown {
            return None;
        }
        Some(Some(if ts.len() == 1 {
            ts.pop().expect("one")
        } else {
            Type::Tuple(ts)
        }))
    }

    fn set_map_key(&mut self, m: &MapRef, key: Option<Option<Type>>) {
        let Some(key) = key else { return };
        let report = self.report;
        let st = self.maps.get_mut(&m.name).expect("touched");
        match &st.key {
            None => {
                st.key = Some(key);
                st.key_span = m.span;
            }
            Some(cur) => {
                let merged = match (cur, &key) {
                    (None, None) => Some(None),
                    (Some(a), Some(b)) => unify(a, b).map(Some),
                    _ => None,
                };
                match merged {
                    Some(k) => st.key = Some(k),
                    None if report => {
                        let d = Diagnostic::error(
                            m.span,
                            format!(
                                "`{}` is used with {} here but with {} before",
                                m.name,
                                describe_key(&key),
                                describe_key(cur)
                            ),
                        )
                        .with_note(Some(st.key_span), "first used here");
                        self.diags.push(d);
                    }
                    None => {}
                }
            }
        }
    }

    fn set_map_value(&mut self, m: &MapRef, v: MapValue, span: Span) {
        let report = self.report;
        let st = self.maps.get_mut(&m.name).expect("touched");
        match &st.value {
            None => {
                st.value = Some(v);
                st.value_span = span;
            }
            Some(cur) => {
                let merged = match (cur, &v) {
                    (MapValue::Plain(a), MapValue::Plain(b)) => unify(a, b).map(MapValue::Plain),
                    (a, b) if a == b => Some(a.clone()),
                    // Signedness of sum/min/max/avg/stats follows the first use.
                    (a, b)
                        if agg_name(a) == agg_name(b)
                            && !matches!(
                                a,
                                MapValue::Hist { .. }
                                    | MapValue::Lhist { .. }
                                    | MapValue::Tseries { .. }
                            ) =>
                    {
                        Some(a.clone())
                    }
                    _ => None,
                };
                match merged {
                    Some(x) => st.value = Some(x),
                    None if report => {
                        let d = Diagnostic::error(
                            span,
                            format!(
                                "type mismatch for `{}`: assigning {} to a map that holds {}",
                                m.name,
                                describe_value(&v),
                                describe_value(cur)
                            ),
                        )
                        .with_note(Some(st.value_span), "the map's type was set here");
                        self.diags.push(d);
                    }
                    None => {}
                }
            }
        }
    }

    fn undefined_map(&mut self, m: &MapRef) {
        let names: Vec<String> = self.maps.keys().chain(self.hints.keys()).cloned().collect();
        let mut msg = format!("undefined map `{}`: it is never assigned", m.name);
        if let Some(s) = suggest(
            &m.name,
            names.iter().map(String::as_str).filter(|n| *n != m.name),
        ) {
            msg = format!("{msg}; did you mean `{s}`?");
        }
        self.err(m.name_span, msg);
    }

    /// A map read `@m` / `@m[k]` as a value.
    fn map_read(&mut self, m: &mut MapRef) -> Type {
        self.touch_map(m);
        let key = self.map_keys(m);
        let Some(st) = self.map_state(&m.name) else {
            self.undefined_map(m);
            return Type::Void;
        };
        if let (Some(k), Some(cur)) = (&key, &st.key) {
            let ok = match (cur, k) {
                (None, None) => true,
                (Some(a), Some(b)) => unify(a, b).is_some(),
                _ => false,
            };
            if !ok {
                self.push(
                    Diagnostic::error(
                        m.span,
                        format!(
                            "`{}` is used with {} here but with {} before",
                            m.name,
                            describe_key(k),
                            describe_key(cur)
                        ),
                    )
                    .with_note(Some(st.key_span), "first used here"),
                );
            }
        }
        match st.value {
            // Assigned only from itself (`@u[1] = @u[1] + 1`): an integer, as the map
            // is declared in the end (`MapInfo`'s default) — not a value of no type,
            // which compared as zero bytes.
            None => Type::I64,
            Some(MapValue::Plain(t)) => t,
            Some(MapValue::Count) => Type::U64,
            Some(
                MapValue::Sum { signed }
                | MapValue::Min { signed }
                | MapValue::Max { signed }
                | MapValue::Avg { signed },
            ) => int64(signed),
            Some(v) => {
                self.err(
                    m.span,
                    format!(
                        "the value of `{}` ({} aggregation) cannot be read; print it with print()",
                        m.name,
                        describe_value(&v)
                    ),
                );
                Type::Void
            }
        }
    }

    /// `count()`, `sum(x)`, `hist(x, k)`, ... as the value of a map assignment.
    fn aggregation(&mut self, call: &mut Expr) -> Option<MapValue> {
        let span = call.span;
        let ExprKind::Call { name, args, .. } = &mut call.kind else {
            return None;
        };
        let name = name.clone();
        let mut tys = Vec::new();
        for a in args.iter_mut() {
            let t = match self.value_expr(a) {
                Type::Enum(_) => {
                    a.ty = Type::I64;
                    Type::I64
                }
                t => t,
            };
            tys.push(t);
        }
        call.ty = Type::Void;
        let nargs = tys.len();
        let (lo, hi) =
            builtins::function(&name).map_or((0, usize::MAX), |b| (b.min_args, b.max_args));
        let arity = |ck: &mut Self| -> bool {
            if nargs < lo || nargs > hi {
                ck.err(
                    span,
                    format!("{name}() takes {} ({nargs} given)", arity_text(lo, hi)),
                );
                false
            } else {
                true
            }
        };
        let int_arg = |ck: &mut Self, i: usize| -> bool {
            let t = &tys[i];
            if *t != Type::Void && !is_int(t) {
                let s = match &call.kind {
                    ExprKind::Call { args, .. } => args[i].span,
                    _ => span,
                };
                ck.err(s, format!("{name}() needs an integer argument, not `{t}`"));
                return false;
            }
            true
        };
        let args = match &call.kind {
            ExprKind::Call { args, .. } => args.clone(),
            _ => return None,
        };
        match name.as_str() {
            "count" => arity(self).then_some(MapValue::Count),
            "sum" | "min" | "max" | "avg" | "stats" => {
                if !arity(self) || !int_arg(self, 0) {
                    return None;
                }
                let signed = signed(&tys[0]);
                Some(match name.as_str() {
                    "sum" => MapValue::Sum { signed },
                    "min" => MapValue::Min { signed },
                    "max" => MapValue::Max { signed },
                    "avg" => MapValue::Avg { signed },
                    _ => MapValue::Stats { signed },
                })
            }
            "hist" => {
                if !arity(self) || !int_arg(self, 0) {
                    return None;
                }
                let k = if nargs == 2 {
                    match literal_int(&args[1]) {
                        Some(k) if (0..=5).contains(&k) => k as u8,
                        _ => {
                            self.err(args[1].span, "hist(): the second argument must be an integer literal from 0 to 5");
                            return None;
                        }
                    }
                } else {
                    0
                };
                Some(MapValue::Hist { k })
            }
            "lhist" => {
                if !arity(self) || !int_arg(self, 0) {
                    return None;
                }
                let mut lits = Vec::new();
                for a in &args[1..] {
                    match literal_int(a) {
                        Some(v) => lits.push(v),
                        None => {
                            self.err(
                                a.span,
                                "lhist(): min, max and step must be integer literals",
                            );
                            return None;
                        }
                    }
                }
                let (min, max, step) = (lits[0], lits[1], lits[2]);
                if min < 0 || max <= min || step <= 0 {
                    self.err(span, "lhist(): needs 0 <= min < max and step > 0");
                    return None;
                }
                if (max - min) / step > 1000 {
                    self.err(span, "lhist(): too many buckets (at most 1000)");
                    return None;
                }
                Some(MapValue::Lhist { min, max, step })
            }
            "tseries" => {
                if !arity(self) || !int_arg(self, 0) {
                    return None;
                }
                self.tseries(&args, signed(&tys[0]))
            }
            _ => None,
        }
    }

    /// The literal arguments of `tseries(v, interval, intervals[, agg])`, with
    /// upstream's rules (stdlib.md: `interval_ns` and `num_intervals` positive
    /// literals, `agg` one of avg/max/min/sum) and weft's bound on `intervals`.
    fn tseries(&mut self, args: &[Expr], signed: bool) -> Option<MapValue> {
        let interval_ns = match literal_int(&args[1]) {
            Some(v) if v >= 1 => v as u64,
            Some(v) => {
                let msg = format!("tseries() interval_ns must be >= 1 ({v} provided)");
                self.err(args[1].span, msg);
                return None;
            }
            None => {
                let msg =
                    "tseries(): the interval must be an integer literal (a duration such as 100ms)";
                self.err(args[1].span, msg);
                return None;
            }
        };
        let intervals = match literal_int(&args[2]) {
            Some(v) if (1..=i64::from(TSERIES_MAX_INTERVALS)).contains(&v) => v as u32,
            Some(v) => {
                let msg = format!(
                    "tseries(): the number of intervals must be from 1 to {TSERIES_MAX_INTERVALS} ({v} provided)"
                );
                self.err(args[2].span, msg);
                return None;
            }
            None => {
                let msg = "tseries(): the number of intervals must be an integer literal";
                self.err(args[2].span, msg);
                return None;
            }
        };
        let agg = match args.get(3).map(|a| (a, &a.kind)) {
            None => TseriesAgg::Last,
            Some((a, ExprKind::Str(s))) => {
                let name = String::from_utf8_lossy(s);
                match TseriesAgg::from_name(&name) {
                    Some(agg) => agg,
                    None => {
                        let msg = format!(
                            "tseries() expects one of the following aggregation functions: avg, max, min, sum (\"{name}\" provided)"
                        );
                        self.err(a.span, msg);
                        return None;
                    }
                }
            }
            Some((a, _)) => {
                let msg =
                    "tseries(): the aggregation must be a string literal: avg, max, min or sum";
                self.err(a.span, msg);
                return None;
            }
        };
        Some(MapValue::Tseries {
            interval_ns,
            intervals,
            agg,
            signed,
        })
    }

    // ---- expressions ------------------------------------------------------------

    /// The type of `e`. An enum's value is a plain integer here: only where it is
    /// stored or printed ([`Self::expr_keep`]) does it keep its enum.
    fn expr(&mut self, e: &mut Expr) -> Type {
        let t = self.expr_keep(e);
        if matches!(t, Type::Enum(_)) {
            e.ty = Type::I64;
            return Type::I64;
        }
        t
    }

    /// [`Self::expr`], an enum's value keeping its enum (printed by name).
    fn expr_keep(&mut self, e: &mut Expr) -> Type {
        let t = self.expr_inner(e);
        e.ty = t.clone();
        t
    }

    fn expr_inner(&mut self, e: &mut Expr) -> Type {
        let span = e.span;
        match &mut e.kind {
            // A literal past `int64`'s range is a `uint64` (as upstream types it).
            ExprKind::Int(v) if *v > i64::MAX as u64 => Type::U64,
            // An enumerator already checked (the checker visits some expressions
            // twice): it keeps its enum.
            ExprKind::Int(_) if matches!(e.ty, Type::Enum(_)) => e.ty.clone(),
            ExprKind::Int(_) => Type::I64,
            ExprKind::Str(s) => Type::Str {
                cap: s.len() as u32 + 1,
            },
            ExprKind::Bool(_) => Type::Bool,
            ExprKind::Positional(n) => {
                let n = *n;
                if n == 0 {
                    self.err(span, "positional parameters start at $1");
                    e.kind = ExprKind::Int(0);
                    return Type::I64;
                }
                match self.opts.positional.get(n as usize - 1) {
                    None => {
                        e.kind = ExprKind::Int(0);
                        Type::I64
                    }
                    Some(p) => match crate::lexer::parse_int(&p.replace('_', "")) {
                        Ok(v) => {
                            e.kind = ExprKind::Int(v);
                            Type::I64
                        }
                        Err(_) => {
                            let bytes = p.as_bytes().to_vec();
                            let cap = bytes.len() as u32 + 1;
                            e.kind = ExprKind::Str(bytes);
                            Type::Str { cap }
                        }
                    },
                }
            }
            ExprKind::PositionalCount => {
                e.kind = ExprKind::Int(self.opts.positional.len() as u64);
                Type::I64
            }
            ExprKind::Ident(name) => {
                if name == "dw_ustack" {
                    *name = "ustack".into();
                }
                // `__builtin_pid` is upstream's name of the builtin `pid`.
                if let Some(plain) = name.strip_prefix("__builtin_") {
                    if BUILTIN_ALIASES.contains(&plain) {
                        *name = plain.to_string();
                    }
                }
                let name = name.clone();
                // The machine's CPUs: a constant of the session. Advice always runs
                // in user mode (x86-64: upstream's `usermode` is 1 there).
                if name == "ncpus" || name == "usermode" {
                    let v = if name == "ncpus" {
                        self.opts.ncpus.max(1)
                    } else {
                        1
                    };
                    e.kind = ExprKind::Int(v);
                    return Type::U64;
                }
                // An enumerator is a constant; a builtin of the same name wins, as
                // upstream's builtins are keywords.
                if builtins::variable(&name).is_none() {
                    if let Some(&v) = self.enumerators.get(&name) {
                        // A negative constant stays a negated literal (as `-3` is
                        // written), so every pass types it signed.
                        e.kind = if v < 0 {
                            ExprKind::Unary {
                                op: UnOp::Neg,
                                expr: Box::new(Expr::new(ExprKind::Int(v.unsigned_abs()), span)),
                            }
                        } else {
                            ExprKind::Int(v as u64)
                        };
                        return match self.enum_of.get(&name) {
                            Some(t) => Type::Enum(t.clone()),
                            None => Type::I64,
                        };
                    }
                }
                self.builtin(&name, span)
            }
            ExprKind::Var(v) => match self.lookup_var(&v.name) {
                Some(id) => {
                    v.id = Some(id);
                    match &self.vars[id as usize].ty {
                        Some(t) => t.clone(),
                        // `let $x;` reads as 0.
                        None => {
                            self.vars[id as usize].ty = Some(Type::I64);
                            Type::I64
                        }
                    }
                }
                None => {
                    let names: Vec<String> = self
                        .scopes
                        .iter()
                        .flat_map(|s| s.keys().cloned())
                        .filter(|n| !n.contains('#'))
                        .collect();
                    let mut msg = format!("variable `${}` is used before it is assigned", v.name);
                    if let Some(s) = suggest(&v.name, names.iter().map(String::as_str)) {
                        msg = format!("{msg}; did you mean `${s}`?");
                    }
                    self.err(v.span, msg);
                    Type::Void
                }
            },
            ExprKind::Map(m) => self.map_read(m),
            ExprKind::Call { .. } => self.call(e),
            ExprKind::Unary { op, expr } => {
                let op = *op;
                let t = self.expr(expr);
                if t == Type::Void {
                    return Type::Void;
                }
                match op {
                    UnOp::Not => {
                        if !is_truthy(&t) {
                            self.err(
                                span,
                                format!("`!` needs an integer or a boolean, not `{t}`"),
                            );
                        }
                        Type::Bool
                    }
                    UnOp::Neg | UnOp::BitNot | UnOp::Plus => {
                        if !is_int(&t) {
                            self.err(span, format!("`{}` needs an integer, not `{t}`", op.text()));
                            return Type::Void;
                        }
                        if op == UnOp::Plus {
                            return t;
                        }
                        int64(signed(&t))
                    }
                    UnOp::Deref => match t {
                        Type::Ptr(inner) => {
                            if inner.is_scalar() {
                                *inner
                            } else if let Type::CStruct(s) = &*inner {
                                if s.size == 0 {
                                    self.err(span, format!("struct `{}` is not defined; define it in the preamble or use DWARF", s.name));
                                    return Type::Void;
                                }
                                // Only as the base of `.field` / `[i]`; copying a
                                // whole struct is rejected where the value is used.
                                *inner
                            } else {
                                self.err(
                                    span,
                                    format!("cannot dereference a pointer to `{inner}`"),
                                );
                                Type::Void
                            }
                        }
                        Type::Int { .. } => {
                            self.push(
                                Diagnostic::error(
                                    span,
                                    format!("cannot dereference a value of type `{t}`"),
                                )
                                .with_help("cast it to a pointer first, e.g. `*(uint64 *)arg0`"),
                            );
                            Type::Void
                        }
                        _ => {
                            self.err(span, format!("cannot dereference a value of type `{t}`"));
                            Type::Void
                        }
                    },
                    UnOp::AddrOf => {
                        // Upstream takes `&` only of a scratch variable or a map, as an
                        // unstable feature (`unstable_addr`) for passing them to external
                        // BPF functions of imports; the pointer is not meant to be read.
                        let d = if matches!(expr.kind, ExprKind::Var(_) | ExprKind::Map(_)) {
                            Diagnostic::error(
                                span,
                                "the address of a variable or a map (`&`) is not supported",
                            )
                            .with_help(
                                "bpftrace takes it only to pass a variable or map to an \
                                 imported BPF function (unstable_addr), which weft does not have",
                            )
                        } else {
                            Diagnostic::error(
                                span,
                                "`&` takes the address of a scratch variable or a map only",
                            )
                            .with_help(
                                "the address of a struct member is \
                                 `(uint64)$p + offsetof(struct T, field)`",
                            )
                        };
                        self.push(d);
                        Type::Void
                    }
                }
            }
            ExprKind::Binary { op, lhs, rhs } => {
                let op = *op;
                let a = self.expr(lhs);
                let b = self.expr(rhs);
                self.division_by_zero(op, rhs);
                if op.is_comparison() {
                    self.unsigned_against_sign(op, (&a, lhs), (&b, rhs));
                }
                self.binary(op, &a, &b, span)
            }
            ExprKind::IncDec {
                target, increment, ..
            } => {
                let w = if *increment { "++" } else { "--" };
                match target {
                    IncTarget::Var(v) => match self.lookup_var(&v.name) {
                        Some(id) => {
                            v.id = Some(id);
                            let t = self.vars[id as usize].ty.clone().unwrap_or(Type::I64);
                            if !is_int(&t) && !matches!(t, Type::Ptr(_)) {
                                self.err(
                                    span,
                                    format!(
                                        "`{w}` needs an integer variable; `${}` is `{t}`",
                                        v.name
                                    ),
                                );
                                return Type::Void;
                            }
                            t
                        }
                        None => {
                            self.err(
                                v.span,
                                format!("variable `${}` is used before it is assigned", v.name),
                            );
                            Type::Void
                        }
                    },
                    IncTarget::Map(m) => {
                        self.touch_map(m);
                        let key = self.map_keys(m);
                        self.set_map_key(m, key);
                        // `@p++` on a map of pointers steps by the pointee's size.
                        if let Some(pt) = self.map_pointer(&m.name) {
                            return pt;
                        }
                        self.set_map_value(m, MapValue::Plain(Type::I64), m.span);
                        self.require_int_map(m);
                        match self.maps.get(&m.name).and_then(|s| s.value.clone()) {
                            Some(MapValue::Plain(t)) if is_int(&t) => t,
                            _ => Type::I64,
                        }
                    }
                }
            }
            ExprKind::Ternary {
                cond,
                then,
                otherwise,
            } => {
                self.condition(cond);
                let a = self.expr(then);
                let b = self.expr(otherwise);
                if a == Type::Void || b == Type::Void {
                    return Type::Void;
                }
                match join_branches(&a, &b) {
                    Some(t) => t,
                    None => {
                        self.err(
                            span,
                            format!("the branches of `?:` have different types: `{a}` and `{b}`"),
                        );
                        Type::Void
                    }
                }
            }
            ExprKind::Cast { ty, expr } => {
                let t = self.expr(expr);
                if !self.typeof_operand(ty) {
                    return Type::Void;
                }
                if let Some(len) = ty.array {
                    let ty = ty.clone();
                    return self.array_cast(&t, expr, &ty, len, span);
                }
                let Some(target) = self.type_of(ty, || format!("unknown type `{ty}`")) else {
                    return Type::Void;
                };
                if t == Type::Void {
                    return target;
                }
                let ok = match &target {
                    // An integer array of the integer's size (upstream's array casts).
                    Type::Int { bits, .. } if int_array(&t).is_some() => {
                        let ok = t.size() == u32::from(*bits / 8);
                        if !ok {
                            self.err(
                                span,
                                format!(
                                    "cannot cast `{t}` ({} bytes) to `{target}` ({} bytes): \
                                     an array cast keeps the size",
                                    t.size(),
                                    bits / 8
                                ),
                            );
                            return Type::Void;
                        }
                        ok
                    }
                    Type::Int { .. } => is_int(&t) || matches!(t, Type::Ptr(_) | Type::USym),
                    // `(bool)"text"` is whether the string is not empty (upstream).
                    Type::Bool => {
                        is_int(&t) || matches!(t, Type::Ptr(_) | Type::USym | Type::Str { .. })
                    }
                    Type::Ptr(_) => is_int(&t) || matches!(t, Type::Ptr(_)),
                    Type::Enum(_) => is_int(&t),
                    _ => false,
                };
                if !ok {
                    self.err(span, format!("cannot cast `{t}` to `{target}`"));
                    return Type::Void;
                }
                target
            }
            // `config().NAME`: the session's config value, a constant (upstream).
            ExprKind::Field { expr, field, .. } if matches!(&expr.kind, ExprKind::Call { name, args, .. } if name == "config" && args.is_empty()) =>
            {
                let (kind, ty) = match field.as_str() {
                    "max_strlen" => (ExprKind::Int(u64::from(self.config.strlen)), Type::U64),
                    "max_map_keys" => (
                        ExprKind::Int(u64::from(self.config.max_map_keys)),
                        Type::U64,
                    ),
                    "max_cat_bytes" => (
                        ExprKind::Int(u64::from(self.config.max_cat_bytes)),
                        Type::U64,
                    ),
                    "print_maps_on_exit" => {
                        (ExprKind::Bool(self.config.print_maps_on_exit), Type::Bool)
                    }
                    "show_debug_info" => (ExprKind::Bool(self.config.show_debug_info), Type::Bool),
                    "cpp_demangle" => (ExprKind::Bool(true), Type::Bool),
                    "stack_mode" => {
                        let m = match self.stack_mode {
                            StackMode::Bpftrace => "bpftrace",
                            StackMode::Perf => "perf",
                            StackMode::Raw => "raw",
                        };
                        let cap = m.len() as u32 + 1;
                        (ExprKind::Str(m.as_bytes().to_vec()), Type::Str { cap })
                    }
                    f => {
                        self.err(span, format!("config(): weft has no config value `{f}`"));
                        return Type::Void;
                    }
                };
                e.kind = kind;
                ty
            }
            ExprKind::Field { expr, field, .. } => {
                let field = field.clone();
                if let ExprKind::Ident(n) = &expr.kind {
                    if n == "args" && self.kinds.iter().any(|(k, _)| *k == Kind::Tracepoint) {
                        let record = self.event_record_type(expr.span, false);
                        expr.ty = record;
                        return self.event_field_type(&field, span);
                    }
                    if n == "args" {
                        let t = self.args_type(expr.span);
                        expr.ty = t.clone();
                        return self.field_of(&t, &field, span);
                    }
                }
                let t = self.expr(expr);
                self.field_of(&t, &field, span)
            }
            ExprKind::TupleIndex { expr, index } => {
                let index = *index;
                let t = self.expr(expr);
                match &t {
                    Type::Tuple(ts) => match ts.get(index as usize) {
                        Some(t) => t.clone(),
                        None => {
                            self.err(
                                span,
                                format!("tuple index {index} is out of range for `{t}`"),
                            );
                            Type::Void
                        }
                    },
                    Type::Void => Type::Void,
                    _ => {
                        self.err(span, format!("`.{index}` needs a tuple, not `{t}`"));
                        Type::Void
                    }
                }
            }
            ExprKind::Index { expr, index } => {
                let t = self.expr(expr);
                let it = self.expr(index);
                if it != Type::Void && !is_int(&it) {
                    self.err(
                        index.span,
                        format!("an index must be an integer, not `{it}`"),
                    );
                }
                match &t {
                    Type::Ptr(inner) if inner.is_scalar() => (**inner).clone(),
                    // A string's bytes, as upstream indexes one: `int8`, 0 past the
                    // end of its capacity.
                    Type::Str { cap } => {
                        if let Some(i) = literal_int(index) {
                            if i < 0 || i >= i64::from(*cap) {
                                self.err(
                                    index.span,
                                    format!(
                                        "the index {i} is out of bounds for `{t}` \
                                         (indexes 0 to {})",
                                        cap - 1
                                    ),
                                );
                            }
                        }
                        Type::Int {
                            bits: 8,
                            signed: true,
                        }
                    }
                    Type::Tuple(ts) => match literal_int(index) {
                        Some(i) if i >= 0 && (i as usize) < ts.len() => ts[i as usize].clone(),
                        _ => {
                            self.err(
                                index.span,
                                "a tuple index must be an integer literal within range",
                            );
                            Type::Void
                        }
                    },
                    Type::CStruct(s) if s.name.ends_with(']') => {
                        // A constant index past a C array's end (upstream refuses it).
                        if let Some(i) = literal_int(index) {
                            if i < 0 || i as u64 >= s.fields.len() as u64 {
                                self.err(
                                    index.span,
                                    format!(
                                        "the index {i} is out of bounds for array of size {}",
                                        s.fields.len()
                                    ),
                                );
                            }
                        }
                        match s.fields.first() {
                            Some(f) => f.ty.clone(),
                            None => Type::Void,
                        }
                    }
                    Type::Void => Type::Void,
                    _ => {
                        self.err(span, format!("cannot index a value of type `{t}`"));
                        Type::Void
                    }
                }
            }
            ExprKind::Tuple(es) => {
                let mut ts = Vec::new();
                for x in es.iter_mut() {
                    let t = self.value_expr(x);
                    if t == Type::Void {
                        return Type::Void;
                    }
                    ts.push(t);
                }
                Type::Tuple(ts)
            }
            ExprKind::Record(fs) => {
                let mut out: Vec<(String, Type)> = Vec::new();
                for (n, x) in fs.iter_mut() {
                    let t = self.value_expr(x);
                    if out.iter().any(|(m, _)| m == n) {
                        self.err(x.span, format!("record field `{n}` is given twice"));
                    }
                    if t == Type::Void {
                        return Type::Void;
                    }
                    out.push((n.clone(), t));
                }
                Type::Record(out)
            }
            ExprKind::Block(b) => self.block_stmts(b),
            ExprKind::Sizeof(arg) => {
                let size = match arg {
                    SizeofArg::Type(t) => self
                        .type_of(t, || format!("unknown type `{t}`"))
                        .map(|rt| rt.size()),
                    SizeofArg::Expr(x) => {
                        let t = self.expr(x);
                        (t != Type::Void).then(|| t.size())
                    }
                };
                if let Some(s) = size {
                    e.kind = ExprKind::Int(u64::from(s));
                }
                Type::U64
            }
            ExprKind::Offsetof { ty, field } => {
                let path = field.clone();
                match self.resolve_type(ty) {
                    Ok(Type::CStruct(s)) => {
                        // Each step of `a.b.c` adds the member's offset in its struct.
                        let mut st = s;
                        let mut offset = 0u64;
                        for (i, name) in path.iter().enumerate() {
                            let Some(f) = st.fields.iter().find(|f| f.name == *name) else {
                                self.err(
                                    span,
                                    format!("struct `{}` has no field `{name}`", st.name),
                                );
                                return Type::Void;
                            };
                            offset += u64::from(f.offset);
                            match (&f.ty, path.get(i + 1)) {
                                (_, None) => {}
                                (Type::CStruct(inner), Some(_)) => st = inner.clone(),
                                (other, Some(next)) => {
                                    self.err(
                                        span,
                                        format!(
                                            "`{}` is `{other}`, not a struct: it has no \
                                             field `{next}`",
                                            path[..=i].join(".")
                                        ),
                                    );
                                    return Type::Void;
                                }
                            }
                        }
                        e.kind = ExprKind::Int(offset);
                        Type::U64
                    }
                    Err(TypeError::TooLarge(m) | TypeError::Broken(m)) => {
                        self.err(ty.span, m);
                        Type::Void
                    }
                    _ => {
                        self.err(
                            ty.span,
                            format!("offsetof needs a defined struct, not `{ty}`"),
                        );
                        Type::Void
                    }
                }
            }
            ExprKind::Cflow(_) => {
                // The expand stage replaces every cflow in a probe.
                self.err(span, "cflow(...) is only allowed in probes");
                Type::Void
            }
        }
    }

    /// Warns, as a C compiler's `-Wtype-limits`/`-Wsign-compare` would, when an
    /// unsigned value (`retval`, `arg0`, a `uint64` map value) is compared with a
    /// negative constant, or tested `< 0` / `>= 0`: the comparison is unsigned, so
    /// the test means something else than it reads (`retval < 0` is never true).
    fn unsigned_against_sign(&mut self, op: BinOp, a: (&Type, &Expr), b: (&Type, &Expr)) {
        let negative = |e: &Expr| match &e.kind {
            ExprKind::Unary {
                op: UnOp::Neg,
                expr,
            } => {
                matches!(expr.kind, ExprKind::Int(n) if n > 0)
            }
            _ => false,
        };
        let zero = |e: &Expr| matches!(e.kind, ExprKind::Int(0));
        let unsigned = |t: &Type| matches!(t, Type::Int { signed: false, .. });
        // The unsigned side, and whether the constant is on the right.
        let (u, on_right, c) = if unsigned(a.0) && !signed_expr(b.1) {
            (a, true, b.1)
        } else if unsigned(b.0) && !signed_expr(a.1) {
            (b, false, a.1)
        } else {
            return;
        };
        let sign_test = zero(c)
            && matches!(
                (op, on_right),
                (BinOp::Lt | BinOp::Ge, true) | (BinOp::Gt | BinOp::Le, false)
            );
        // `== -1` matches all ones, as it reads; an ordering does not.
        let ordering = matches!(op, BinOp::Lt | BinOp::Le | BinOp::Gt | BinOp::Ge);
        if !(ordering && negative(c) || sign_test) {
            return;
        }
        if self.report {
            self.diags.warning(
                u.1.span,
                format!(
                    "this is unsigned (`{}`), so comparing it with {} does not test its \
                     sign (the comparison is unsigned); cast it to test the sign, e.g. \
                     `(int32)retval < 0` for a function returning `int`",
                    u.0,
                    if negative(c) {
                        "a negative constant"
                    } else {
                        "0"
                    }
                ),
            );
        }
    }

    fn binary(&mut self, op: BinOp, a: &Type, b: &Type, span: Span) -> Type {
        if *a == Type::Void || *b == Type::Void {
            return if op.is_comparison() || matches!(op, BinOp::And | BinOp::Or) {
                Type::Bool
            } else {
                Type::Void
            };
        }
        match op {
            BinOp::And | BinOp::Or => {
                for t in [a, b] {
                    if !is_truthy(t) {
                        self.err(
                            span,
                            format!("`{}` needs integers or booleans, not `{t}`", op.text()),
                        );
                    }
                }
                Type::Bool
            }
            BinOp::Eq | BinOp::Ne => {
                let ok = (is_truthy(a) || matches!(a, Type::ProbeName))
                    && (is_truthy(b) || matches!(b, Type::ProbeName))
                    || matches!((a, b), (Type::Str { .. }, Type::Str { .. }))
                    || matches!((a, b), (Type::Buf { .. }, Type::Buf { .. }))
                    || matches!((a, b), (Type::Tuple(_), Type::Tuple(_)))
                        && storage(a) == storage(b)
                    // Structs and arrays of the same type, byte for byte (upstream).
                    || matches!(a, Type::CStruct(_)) && a == b && uncopyable(a).is_none();
                if !ok {
                    self.err(span, format!("cannot compare `{a}` with `{b}`"));
                }
                Type::Bool
            }
            BinOp::Lt | BinOp::Le | BinOp::Gt | BinOp::Ge => {
                if !(is_truthy(a) && is_truthy(b)) {
                    self.err(
                        span,
                        format!("`{}` needs integers, not `{a}` and `{b}`", op.text()),
                    );
                }
                Type::Bool
            }
            _ => {
                // Pointer arithmetic: ptr + int, ptr - int.
                if let Type::Ptr(_) = a {
                    if matches!(op, BinOp::Add | BinOp::Sub) && is_int(b) {
                        return a.clone();
                    }
                }
                if let Type::Ptr(_) = b {
                    if op == BinOp::Add && is_int(a) {
                        return b.clone();
                    }
                }
                if !(is_int(a) && is_int(b)) {
                    let d = Diagnostic::error(
                        span,
                        format!("`{}` needs integers, not `{a}` and `{b}`", op.text()),
                    );
                    self.push(if matches!(a, Type::Ptr(_)) || matches!(b, Type::Ptr(_)) {
                        d.with_help(
                            "a pointer takes only `+` and `-` of an integer, with the pointer on the left of `-`",
                        )
                    } else {
                        d
                    });
                    return Type::Void;
                }
                // Two booleans make a boolean (`a & b`), as upstream types them.
                if *a == Type::Bool && *b == Type::Bool {
                    return Type::Bool;
                }
                int64(signed(a) && signed(b))
            }
        }
    }

    /// `(int8[8])x`, `(uint8[])x`: an integer's bytes as an integer array of the
    /// same size (upstream's array casts; the length may be left out). An integer
    /// literal may become an array of 1, 2, 4 or 8 bytes (its low bytes).
    fn array_cast(
        &mut self,
        t: &Type,
        x: &Expr,
        ty: &TypeExpr,
        len: Option<u64>,
        span: Span,
    ) -> Type {
        if ty.pointer > 0 {
            self.err(ty.span, "casts to pointers to arrays are not supported");
            return Type::Void;
        }
        // `(char[4])x` is an array of `int8`, not a string.
        let base = match ty.base {
            TypeName::Char => TypeName::Int {
                bits: 8,
                signed: true,
            },
            ref b => b.clone(),
        };
        let elem_expr = TypeExpr {
            base: base.clone(),
            array: None,
            dims: Vec::new(),
            ..ty.clone()
        };
        let Some(elem) = self.type_of(&elem_expr, || format!("unknown type `{elem_expr}`")) else {
            return Type::Void;
        };
        // `(bool[2])(uint16)1`: bools are bytes (upstream).
        let bits = match elem {
            Type::Int { bits, .. } => bits,
            Type::Bool => 8,
            _ => {
                self.err(
                    ty.span,
                    format!("casts to arrays need an integer or bool element type, not `{elem}`"),
                );
                return Type::Void;
            }
        };
        // A length as written is checked as a type first (at most 65536 elements).
        if let Some(n) = len {
            let written = TypeExpr {
                base: base.clone(),
                array: Some(Some(n)),
                dims: Vec::new(),
                ..ty.clone()
            };
            if self
                .type_of(&written, || format!("unknown type `{written}`"))
                .is_none()
            {
                return Type::Void;
            }
        }
        if *t == Type::Void {
            return Type::Void;
        }
        if !is_int(t) && int_array(t).is_none() {
            self.err(span, format!("cannot cast `{t}` to an array"));
            return Type::Void;
        }
        let esize = u64::from(bits / 8);
        let literal = literal_int(x).is_some();
        let source = u64::from(t.size());
        // Without a length, a literal has the size of the smallest integer type that
        // holds it (upstream types literals so: `(uint8[])0x0102` has 2 elements).
        let source = match literal_int(x) {
            Some(v) if len.is_none() && *t != Type::U64 => literal_size(v),
            _ => source,
        };
        let n = match len {
            Some(n) => n,
            None if source % esize == 0 => source / esize,
            None => 0,
        };
        let size = n.saturating_mul(esize);
        let fits = size == source || literal && matches!(size, 1 | 2 | 4 | 8);
        if !fits {
            self.err(
                span,
                format!(
                    "cannot cast `{t}` ({source} bytes) to `{}[{n}]` ({size} bytes): an array \
                     cast keeps the size",
                    elem
                ),
            );
            return Type::Void;
        }
        let resolved = TypeExpr {
            base,
            array: Some(Some(n)),
            dims: Vec::new(),
            ..ty.clone()
        };
        self.type_of(&resolved, || format!("unknown type `{resolved}`"))
            .unwrap_or(Type::Void)
    }

    fn field_of(&mut self, t: &Type, field: &str, span: Span) -> Type {
        let st = match t {
            Type::Void => return Type::Void,
            Type::Record(fs) => {
                return match fs.iter().find(|(n, _)| n == field) {
                    Some((_, t)) => t.clone(),
                    None => {
                        self.err(span, format!("record `{t}` has no field `{field}`"));
                        Type::Void
                    }
                }
            }
            Type::CStruct(s) => s,
            Type::Ptr(inner) => match &**inner {
                Type::CStruct(s) => s,
                _ => {
                    self.err(span, format!("`{t}` has no fields"));
                    return Type::Void;
                }
            },
            _ => {
                self.err(span, format!("`{t}` has no field `{field}`"));
                return Type::Void;
            }
        };
        if st.size == 0 && st.fields.is_empty() {
            self.err(
                span,
                format!(
                    "struct `{}` is not defined; define it in the preamble or use DWARF",
                    st.name
                ),
            );
            return Type::Void;
        }
        match st.fields.iter().find(|f| f.name == field) {
            Some(f) => f.ty.clone(),
            None => {
                let mut msg = format!("struct `{}` has no field `{field}`", st.name);
                if let Some(s) = suggest(field, st.fields.iter().map(|f| f.name.as_str())) {
                    msg = format!("{msg}; did you mean `{s}`?");
                }
                self.err(span, msg);
                Type::Void
            }
        }
    }

    /// The fields of each tracepoint of the probe, with its full name; `None` (said
    /// at `span` when `report`) when an attach point is not a tracepoint or its
    /// fields cannot be read.
    fn tracepoints_fields(
        &mut self,
        span: Span,
        report: bool,
    ) -> Option<Vec<(String, Arc<[EventField]>)>> {
        if let Some(n) = self.all_kinds(|k| k == Kind::Tracepoint) {
            if report {
                self.err(
                    span,
                    format!(
                        "args of tracepoints needs every attach point of the probe to be a \
                         tracepoint (not `{n}`)"
                    ),
                );
            }
            return None;
        }
        let mut out = Vec::new();
        for (a, full) in self.attach.clone().iter().zip(self.names.clone()) {
            let AttachPoint::Tracepoint { category, name } = a else {
                continue;
            };
            match self.event_fields(category, name) {
                Ok(f) => out.push((full, f)),
                Err(msg) => {
                    if report {
                        self.err(span, format!("{full}: {msg}"));
                    }
                    return None;
                }
            }
        }
        Some(out)
    }

    /// `args` in a tracepoint probe: a record of the event's fields but the
    /// `common_*` ones (those weft can read), as bpftrace prints it. `report`: say
    /// what is wrong (else the field access does).
    fn event_record_type(&mut self, span: Span, report: bool) -> Type {
        let Some(each) = self.tracepoints_fields(span, report) else {
            return Type::Void;
        };
        let strlen = self.config.strlen;
        let mut common: Option<(Type, String)> = None;
        for (full, fields) in each {
            let rec = Type::Record(
                fields
                    .iter()
                    .filter(|f| !f.name.starts_with("common_"))
                    .filter_map(|f| Some((f.name.clone(), event_field_type(f, strlen).ok()?)))
                    .collect(),
            );
            match &common {
                None => common = Some((rec, full)),
                Some((c, _)) if *c == rec => {}
                Some((_, first)) => {
                    if report {
                        self.err(
                            span,
                            format!(
                                "args differs between the probe's tracepoints ({first} and \
                                 {full}): read its fields one by one, or write one probe each"
                            ),
                        );
                    }
                    return Type::Void;
                }
            }
        }
        if common.is_some() {
            self.reads_event = true;
        }
        common.map(|(t, _)| t).unwrap_or(Type::Void)
    }

    /// `args.FIELD` in a tracepoint probe: the field's type, the same in every
    /// tracepoint of the probe.
    fn event_field_type(&mut self, field: &str, span: Span) -> Type {
        let Some(each) = self.tracepoints_fields(span, true) else {
            return Type::Void;
        };
        let strlen = self.config.strlen;
        let mut common: Option<(Type, String)> = None;
        for (full, fields) in each {
            let Some(f) = fields.iter().find(|f| f.name == field) else {
                let own = || fields.iter().filter(|f| !f.name.starts_with("common_"));
                let mut msg = format!("{full} has no field `{field}`");
                match suggest(field, fields.iter().map(|f| f.name.as_str())) {
                    Some(s) => msg = format!("{msg}; did you mean `{s}`?"),
                    None => {
                        let names: Vec<&str> = own().map(|f| f.name.as_str()).collect();
                        msg = format!("{msg}; it has {}", names.join(", "));
                    }
                }
                self.err(span, msg);
                return Type::Void;
            };
            let t = match event_field_type(f, strlen) {
                Ok(t) => t,
                Err(why) => {
                    self.err(span, format!("args.{field} of {full}: {why}"));
                    return Type::Void;
                }
            };
            match &common {
                None => common = Some((t, full)),
                Some((c, _)) if *c == t => {}
                Some((c, first)) => {
                    let msg = format!(
                        "args.{field} is `{c}` in {first} but `{t}` in {full}: write one \
                         probe each"
                    );
                    self.err(span, msg);
                    return Type::Void;
                }
            }
        }
        if common.is_some() {
            self.reads_event = true;
        }
        common.map(|(t, _)| t).unwrap_or(Type::Void)
    }

    /// `args`: a record of the probed function's parameters, from DWARF.
    fn args_type(&mut self, span: Span) -> Type {
        if let Some(n) =
            self.all_kinds(|k| matches!(k, Kind::Uprobe | Kind::Uretprobe | Kind::Call))
        {
            self.err(
                span,
                format!(
                    "args can only be used in uprobe, uretprobe and call probes (not in `{n}`)"
                ),
            );
            return Type::Void;
        }
        let mut common: Option<Type> = None;
        for a in self.attach.clone() {
            let func = match &a {
                AttachPoint::Uprobe { func, .. }
                | AttachPoint::Uretprobe { func, .. }
                | AttachPoint::Call { func, .. } => func.clone(),
                AttachPoint::SourceLine { .. } => {
                    self.err(
                        span,
                        format!("args names a function's parameters; `{a}` is a source line, not a function's entry"),
                    );
                    return Type::Void;
                }
                _ => continue,
            };
            let params = self.opts.args_resolver.as_ref().and_then(|r| r.params(&a));
            let Some(params) = params else {
                self.err(span, format!("args needs DWARF debug info for {func}"));
                return Type::Void;
            };
            let rec = Type::Record(params);
            match &common {
                None => common = Some(rec),
                Some(c) if *c == rec => {}
                Some(_) => {
                    self.err(
                        span,
                        "args has different types in the probe's attach points",
                    );
                    return Type::Void;
                }
            }
        }
        common.unwrap_or(Type::Void)
    }

    fn builtin(&mut self, name: &str, span: Span) -> Type {
        if let Some(n) = name.strip_prefix("arg").and_then(|n| n.parse::<u32>().ok()) {
            if n > 255 {
                self.err(span, format!("{name}: argument number is too large"));
                return Type::Void;
            }
            if let Some(b) = builtins::variable(name) {
                self.allowed(b, name, span, span);
            }
            return Type::U64;
        }
        if let Some(b) = builtins::variable(name) {
            self.allowed(b, name, span, span);
        }
        match name {
            "pid" | "tid" | "uid" | "gid" | "cpu" | "cpid" | "nsecs" | "elapsed" | "numaid"
            | "__weft_cputime" | "__weft_faults" | "__weft_minflt" | "__weft_majflt"
            | "__weft_csw" => Type::U64,
            "rand" => Type::Int {
                bits: 32,
                signed: false,
            },
            "comm" | "pcomm" => Type::Str { cap: COMM_CAP },
            "caller" => Type::Str { cap: CALLER_CAP },
            "probe" => Type::ProbeName,
            "func" => Type::USym,
            "retval" => Type::U64,
            "old" | "new" | "val" => self.data_ty.clone().unwrap_or(Type::U64),
            "ip" => Type::U64,
            "ustack" => Type::UStack {
                depth: USTACK_DEPTH,
                mode: self.stack_mode,
            },
            // All the parameters as one value (`print(args)`, `$a = args`): a record
            // printed as upstream prints a struct, `{ .a = 1, .b = 2 }`.
            "args" if self.kinds.iter().any(|(k, _)| *k == Kind::Tracepoint) => {
                self.event_record_type(span, true)
            }
            "args" => self.args_type(span),
            _ => {
                if let Some(msg) = unsupported::builtin(name) {
                    self.err(span, msg);
                    return Type::Void;
                }
                if builtins::function(name).is_some() {
                    self.err(
                        span,
                        format!("`{name}` is a function; call it as `{name}(...)`"),
                    );
                    return Type::Void;
                }
                let mut msg = format!("unknown identifier `{name}`");
                if let Some(s) = suggest(name, builtins::variable_names()) {
                    msg = format!("{msg}; did you mean `{s}`?");
                }
                self.err(span, msg);
                Type::Void
            }
        }
    }

    /// A builtin used where the table does not allow it (in the probes it may be
    /// used in; `--unsafe`), reported at `name_span` / `span`.
    fn allowed(&mut self, b: &builtins::Builtin, shown: &str, name_span: Span, span: Span) {
        if b.needs_unsafe && !self.config.unsafe_ok {
            self.push(
                Diagnostic::error(name_span, format!("{shown} needs --unsafe"))
                    .with_help(format!("run weft with --unsafe to allow {shown}")),
            );
        }
        let ok: fn(Kind) -> bool = match b.only {
            builtins::Where::Anywhere => return,
            builtins::Where::InTarget => Kind::in_target,
            builtins::Where::InTargetOrKernel => |k| k.in_target() || k == Kind::Tracepoint,
            builtins::Where::UserSpace => |k| k != Kind::Tracepoint,
            builtins::Where::FunctionProbes => {
                |k| matches!(k, Kind::Uprobe | Kind::Uretprobe | Kind::Call)
            }
            builtins::Where::DataProbes => |k| matches!(k, Kind::DataSet | Kind::DataGet),
            builtins::Where::SetProbes => |k| k == Kind::DataSet,
            builtins::Where::CodeProbes => |k| {
                matches!(
                    k,
                    Kind::Uprobe | Kind::Uretprobe | Kind::Call | Kind::DataSet | Kind::DataGet
                )
            },
            builtins::Where::ArgumentProbes => {
                |k| matches!(k, Kind::Uprobe | Kind::Usdt | Kind::Call)
            }
            builtins::Where::CallProbes => |k| k == Kind::Call,
            builtins::Where::ReturnProbes => |k| k == Kind::Uretprobe,
            builtins::Where::EntryProbes => |k| k == Kind::Uprobe,
        };
        let kernel = self
            .kinds
            .iter()
            .find(|(k, _)| *k == Kind::Tracepoint && !ok(*k))
            .filter(|_| b.name != "signal")
            .map(|(_, n)| n.clone());
        if let Some(p) = kernel {
            // No user-space frame: say why, and what the event offers instead.
            let instead = match b.name {
                "retval" => "; in a sys_exit tracepoint the return value is args.ret",
                "argN" | "func" => "; the event's fields are args.NAME (weft -lv lists them)",
                _ => "",
            };
            self.err(
                span,
                format!(
                    "{shown} needs a user-space frame, and a tracepoint's advice runs in the \
                     kernel (`{p}`){instead}"
                ),
            );
        } else if let Some(p) = self.all_kinds(ok) {
            self.err(
                span,
                format!(
                    "{shown} can only be used in {} (not in `{p}`)",
                    b.only.describe()
                ),
            );
        }
    }

    // ---- calls ------------------------------------------------------------------

    fn call(&mut self, e: &mut Expr) -> Type {
        let span = e.span;
        // Upstream's `dw_ustack` unwinds with the binary's DWARF CFI: weft's `ustack`
        // always does (its `.eh_frame` tables, frame pointers only as the fallback).
        if let ExprKind::Call { name, .. } = &mut e.kind {
            if name == "dw_ustack" {
                *name = "ustack".into();
            }
        }
        let ExprKind::Call {
            name,
            name_span,
            args,
        } = &mut e.kind
        else {
            unreachable!()
        };
        let name = name.clone();
        let name_span = *name_span;
        let n = args.len();

        // Upstream's builtins may be called: `comm()`, `__builtin_cpu()`, and
        // `nsecs(monotonic)` (the clock `nsecs` reads).
        let plain = name
            .strip_prefix("__builtin_")
            .filter(|p| BUILTIN_ALIASES.contains(p))
            .unwrap_or(&name)
            .to_string();
        let monotonic = plain == "nsecs"
            && matches!(args.as_slice(), [a] if matches!(&a.kind, ExprKind::Ident(c) if c == "monotonic"));
        // nsecs(boot), nsecs(tai), nsecs(sw_tai): CLOCK_MONOTONIC plus that clock's
        // offset from it, taken when weft starts (exact while the machine does not
        // suspend or step its clock during the session; upstream's sw_tai is computed
        // so too).
        let clock = match args.as_slice() {
            [a] if plain == "nsecs" => match &a.kind {
                ExprKind::Ident(c) => match c.as_str() {
                    "boot" => Some(self.opts.clock_offsets.boot),
                    "tai" | "sw_tai" => Some(self.opts.clock_offsets.tai),
                    _ => None,
                },
                _ => None,
            },
            _ => None,
        };
        if let Some(off) = clock {
            let at = args[0].span;
            e.kind = ExprKind::Binary {
                op: BinOp::Add,
                lhs: Box::new(Expr::new(ExprKind::Ident("nsecs".to_string()), name_span)),
                rhs: Box::new(Expr::new(ExprKind::Int(off), at)),
            };
            self.expr_inner(e);
            return Type::U64;
        }
        if (n == 0 || monotonic)
            && builtins::function(&plain).is_none()
            && (builtins::variable(&plain).is_some() || unsupported::builtin(&plain).is_some())
        {
            e.kind = ExprKind::Ident(plain);
            return self.expr_inner(e);
        }

        // str($N): the parameter's text, even when it reads as a number (upstream).
        if name == "str" && (1..=2).contains(&n) {
            // `str($1 + 2)`: the text from its third byte (a string parameter is its
            // text's address, upstream).
            if let ExprKind::Binary {
                op: BinOp::Add,
                lhs,
                rhs,
            } = &args[0].kind
            {
                if let (ExprKind::Positional(k), ExprKind::Int(skip)) = (&lhs.kind, &rhs.kind) {
                    let text = (*k as usize)
                        .checked_sub(1)
                        .and_then(|i| self.opts.positional.get(i))
                        .filter(|t| crate::lexer::parse_int(&t.replace('_', "")).is_err())
                        .cloned();
                    if let Some(text) = text {
                        let rest = text.as_bytes().get(*skip as usize..).unwrap_or(&[]);
                        args[0].kind = ExprKind::Str(rest.to_vec());
                    }
                }
            }
            if let ExprKind::Positional(k) = args[0].kind {
                let text = (k as usize)
                    .checked_sub(1)
                    .and_then(|i| self.opts.positional.get(i))
                    .cloned()
                    .unwrap_or_default();
                args[0].kind = ExprKind::Str(text.into_bytes());
            }
        }
        // strerror(N): the C library's message for errno N, known when N is.
        if name == "strerror" && n == 1 {
            let t = self.expr(&mut args[0]);
            if t == Type::Void {
                return Type::Void;
            }
            let ExprKind::Int(v) = args[0].kind else {
                self.err(
                    args[0].span,
                    "strerror(): weft needs the error number as a constant (a literal, an \
                     enumerator or a header's #define such as EPERM)",
                );
                return Type::Void;
            };
            let msg = std::io::Error::from_raw_os_error(v as i32).to_string();
            let msg = match msg.rfind(" (os error ") {
                Some(i) => msg[..i].to_string(),
                None => msg,
            };
            let cap = msg.len() as u32 + 1;
            e.kind = ExprKind::Str(msg.into_bytes());
            return Type::Str { cap };
        }

        if builtins::is_aggregation(&name) {
            for a in args.iter_mut() {
                self.expr(a);
            }
            self.push(
                Diagnostic::error(span, format!("{name}() must be assigned directly to a map"))
                    .with_help(format!("write `@name[key] = {name}(...)`")),
            );
            return Type::Void;
        }
        let Some(builtin) = builtins::function(&name) else {
            // A clock's name is no expression.
            if name != "nsecs" {
                for a in args.iter_mut() {
                    self.expr(a);
                }
            }
            if let Some(msg) = unsupported::function(&name) {
                self.err(name_span, msg);
                return Type::Void;
            }
            let mut msg = format!("unknown function `{name}`");
            if let Some(s) = suggest(&name, builtins::function_names()) {
                msg = format!("{msg}; did you mean `{s}`?");
            }
            self.err(name_span, msg);
            return Type::Void;
        };

        // Arguments that are maps (print(@m), clear(@m), delete(@m[k]), has_key,
        // len) are checked as map references, not as map reads.
        let mut tys = Vec::with_capacity(n);
        for (i, a) in args.iter_mut().enumerate() {
            if name == "ustack"
                && matches!(&a.kind, ExprKind::Ident(m) if matches!(m.as_str(), "bpftrace" | "perf" | "raw"))
            {
                tys.push(Type::Void);
                continue;
            }
            let as_map = builtin.map_first && i == 0 && matches!(a.kind, ExprKind::Map(_));
            if as_map {
                let ExprKind::Map(m) = &mut a.kind else {
                    unreachable!()
                };
                self.touch_map(m);
                let key = self.map_keys(m);
                if self.map_state(&m.name).is_none() {
                    self.undefined_map(m);
                } else if let (Some(k), Some(st)) = (key, self.map_state(&m.name)) {
                    if m.keys.is_some() {
                        if let Some(cur) = st.key {
                            let ok = match (&cur, &k) {
                                (None, None) => true,
                                (Some(x), Some(y)) => unify(x, y).is_some(),
                                _ => false,
                            };
                            if !ok {
                                let msg = format!(
                                    "`{}` is used with {} here but with {} before",
                                    m.name,
                                    describe_key(&k),
                                    describe_key(&cur)
                                );
                                self.push(
                                    Diagnostic::error(m.span, msg)
                                        .with_note(Some(st.key_span), "first used here"),
                                );
                            }
                        }
                    }
                }
                a.ty = Type::Void;
                tys.push(Type::Void);
            } else {
                // What is printed keeps its enum (printed by name).
                let t = if matches!(name.as_str(), "print" | "printf" | "errorf" | "warnf") {
                    self.expr_keep(a)
                } else {
                    self.expr(a)
                };
                self.no_void_call(a);
                tys.push(t);
            }
        }
        let args_snapshot: Vec<Expr> = args.clone();
        self.allowed(builtin, &builtin.shown(), name_span, span);
        let (lo, hi) = (builtin.min_args, builtin.max_args);
        let arity = |ck: &mut Self| -> bool {
            if n < lo || n > hi {
                ck.err(
                    span,
                    format!("{name}() takes {} ({n} given)", arity_text(lo, hi)),
                );
                false
            } else {
                true
            }
        };
        let a = &args_snapshot;
        let int_at = |ck: &mut Self, i: usize| {
            let t = &tys[i];
            if *t != Type::Void && !is_int(t) && !matches!(t, Type::Ptr(_)) {
                ck.err(
                    a[i].span,
                    format!("{name}(): argument {} must be an integer, not `{t}`", i + 1),
                );
            }
        };
        let str_at = |ck: &mut Self, i: usize| {
            let t = &tys[i];
            if *t != Type::Void && !matches!(t, Type::Str { .. }) {
                ck.err(
                    a[i].span,
                    format!("{name}(): argument {} must be a string, not `{t}`", i + 1),
                );
            }
        };
        let map_at = |ck: &mut Self, i: usize, keyed: bool| -> bool {
            match &a[i].kind {
                ExprKind::Map(m) if !keyed && m.keys.is_some() => {
                    ck.err(
                        a[i].span,
                        format!("{name}() takes a map without keys: `{}`", m.name),
                    );
                    false
                }
                ExprKind::Map(_) => true,
                _ => {
                    ck.err(
                        a[i].span,
                        format!("{name}(): argument {} must be a map", i + 1),
                    );
                    false
                }
            }
        };
        match name.as_str() {
            "proceed" => {
                if !self.around {
                    self.push(
                        Diagnostic::error(name_span, "proceed() is only for around advice")
                            .with_help("write `around uprobe:BIN:FUNC { ... proceed() ... }`"),
                    );
                }
                if arity(self) {
                    for i in 0..n {
                        int_at(self, i);
                    }
                }
                Type::I64
            }
            "override" | "__weft_set_new" => {
                if arity(self) {
                    int_at(self, 0);
                }
                Type::Void
            }
            "printf" | "system" | "cat" | "errorf" | "warnf" => {
                if !arity(self) {
                    return Type::Void;
                }
                self.format_args(&name, a, &tys, span);
                Type::Void
            }
            "print" => {
                if !arity(self) {
                    return Type::Void;
                }
                if matches!(a[0].kind, ExprKind::Map(MapRef { keys: None, .. })) {
                    for x in a.iter().skip(1) {
                        if literal_int(x).is_none_or(|v| !(0..=i64::from(u32::MAX)).contains(&v)) {
                            self.err(
                                x.span,
                                "print(): top and div must be integer literals from 0 to 4294967295",
                            );
                        }
                    }
                } else {
                    if n > 1 {
                        self.err(span, "print() of a value takes one argument");
                    }
                    if matches!(a[0].kind, ExprKind::Map(_)) {
                        // `print(@m[k])` prints the value.
                        let ExprKind::Call { args, .. } = &mut e.kind else {
                            unreachable!()
                        };
                        let t = self.expr(&mut args[0]);
                        if t == Type::Void {
                            return Type::Void;
                        }
                    } else if tys[0] == Type::Void {
                        return Type::Void;
                    } else if let Some(why) = uncopyable(&tys[0]) {
                        self.err(a[0].span, why);
                    }
                }
                Type::Void
            }
            "exit" => {
                arity(self);
                if n == 1 {
                    int_at(self, 0);
                }
                Type::Void
            }
            "__weft_entry" => {
                if arity(self) && !matches!(literal_int(&a[0]), Some(0..=6)) {
                    self.err(
                        a[0].span,
                        format!("{name}(): the number of arguments is a constant from 0 to 6"),
                    );
                }
                if a.len() == 2 {
                    int_at(self, 1);
                }
                Type::Void
            }
            "__weft_exit" => {
                if arity(self) && a.len() == 1 {
                    int_at(self, 0);
                }
                Type::Void
            }
            "__weft_thread" => {
                if arity(self) && map_at(self, 0, false) {
                    if let ExprKind::Map(m) = &a[0].kind {
                        let sum = self
                            .map_state(&m.name)
                            .and_then(|st| st.value)
                            .is_none_or(|v| matches!(v, MapValue::Sum { .. } | MapValue::Count));
                        if !sum {
                            self.err(
                                a[0].span,
                                format!("{name}() reads a sum() or count() map: `{}`", m.name),
                            );
                        }
                    }
                }
                Type::U64
            }
            "__weft_caller_in" => {
                if arity(self) {
                    self.literal_string(&name, &a[0]);
                    self.literal_string(&name, &a[1]);
                }
                Type::Bool
            }
            "str" => {
                if !arity(self) {
                    return Type::Void;
                }
                if n == 2 {
                    int_at(self, 1);
                }
                let cap_limit = self.config.strlen;
                // bpftrace 0.17: `str(p, n)` keeps n characters (n does not count the
                // NUL; newer bpftrace keeps n - 1).
                let cap = match n {
                    2 => match literal_int(&a[1]) {
                        Some(v) if v >= 0 => {
                            (v.min(i64::from(cap_limit)) as u32 + 1).min(cap_limit)
                        }
                        _ => cap_limit,
                    },
                    _ => cap_limit,
                };
                match &tys[0] {
                    Type::Str { cap: c } => Type::Str {
                        cap: (*c).min(cap).max(1),
                    },
                    t if is_int(t) || matches!(t, Type::Ptr(_)) => Type::Str { cap },
                    Type::Void => Type::Str { cap },
                    t => {
                        self.err(a[0].span, format!("str() needs an address, not `{t}`"));
                        Type::Void
                    }
                }
            }
            // Bytes at an address, of a string, or of an array (whose length is then
            // optional: the array's). At most max_strlen bytes, as upstream.
            "buf" => {
                if !arity(self) {
                    return Type::Void;
                }
                let max = self.config.strlen;
                let data = &tys[0];
                let array = is_array(data);
                if !(*data == Type::Void
                    || is_int(data)
                    || array
                    || matches!(data, Type::Ptr(_) | Type::Str { .. }))
                {
                    self.err(
                        a[0].span,
                        format!(
                            "buf() expects an integer, string, or array argument, not `{data}`"
                        ),
                    );
                }
                let wanted = if n == 2 {
                    int_at(self, 1);
                    match literal_int(&a[1]) {
                        Some(v) if v < 0 => {
                            self.err(
                                a[1].span,
                                format!("buf() cannot use a negative length ({v})"),
                            );
                            u64::from(max)
                        }
                        Some(v) => v as u64,
                        None => u64::from(max),
                    }
                } else if array {
                    u64::from(data.size())
                } else {
                    if *data != Type::Void {
                        self.err(
                            span,
                            format!(
                                "buf() expects a length argument for a non-array type (`{data}`)"
                            ),
                        );
                    }
                    u64::from(max)
                };
                if wanted > u64::from(max) {
                    self.push(Diagnostic::warning(
                        span,
                        format!(
                            "buf() length is too long and will be shortened to {max} bytes \
                             (see config max_strlen)"
                        ),
                    ));
                }
                Type::Buf {
                    cap: wanted.min(u64::from(max)) as u32,
                }
            }
            "delete" => {
                if n == 1 {
                    match &a[0].kind {
                        ExprKind::Map(_) => {}
                        _ => self.err(
                            a[0].span,
                            "delete() takes a map element: `delete(@m[key])` or `delete(@m, key)`",
                        ),
                    }
                } else if arity(self) && map_at(self, 0, false) {
                    if let ExprKind::Map(m) = &a[0].kind {
                        let key_t = storage(&tys[1]);
                        if let Some(Some(Some(k))) = self.map_state(&m.name).map(|s| s.key) {
                            if tys[1] != Type::Void && unify(&k, &key_t).is_none() {
                                self.err(
                                    a[1].span,
                                    format!("`{}` has key `{k}`, not `{key_t}`", m.name),
                                );
                            }
                        }
                    }
                }
                Type::Bool
            }
            "has_key" => {
                if arity(self) && map_at(self, 0, false) {
                    if let ExprKind::Map(m) = &a[0].kind {
                        let key_t = if n == 2 {
                            storage(&tys[1])
                        } else {
                            Type::Tuple(tys[1..].iter().map(storage).collect())
                        };
                        match self.map_state(&m.name).map(|s| s.key) {
                            Some(Some(Some(k)))
                                if !tys[1..].contains(&Type::Void)
                                    && unify(&k, &key_t).is_none() =>
                            {
                                self.err(
                                    a[1].span,
                                    format!("`{}` has key `{k}`, not `{key_t}`", m.name),
                                );
                            }
                            Some(Some(None)) => {
                                self.err(a[0].span, format!("`{}` has no keys", m.name))
                            }
                            _ => {}
                        }
                    }
                }
                Type::Bool
            }
            "clear" | "zero" => {
                if arity(self) {
                    map_at(self, 0, false);
                }
                Type::Void
            }
            "len" => {
                if arity(self) {
                    if matches!(a[0].kind, ExprKind::Map(_)) {
                        map_at(self, 0, false);
                    } else if matches!(tys[0], Type::UStack { .. }) {
                        self.err(span, "len() of a stack is not supported yet");
                    } else {
                        self.err(a[0].span, "len() takes a map");
                    }
                }
                Type::U64
            }
            "time" => {
                arity(self);
                if n == 1 {
                    self.literal_string(&name, &a[0]);
                }
                Type::Void
            }
            "strftime" => {
                if arity(self) {
                    self.literal_string(&name, &a[0]);
                    int_at(self, 1);
                }
                Type::Timestamp
            }
            "join" => {
                if arity(self) {
                    int_at(self, 0);
                    if n == 2 {
                        self.literal_string(&name, &a[1]);
                    }
                }
                Type::Void
            }
            "usym" => {
                if arity(self) {
                    int_at(self, 0);
                }
                Type::USym
            }
            // The argument's bytes reversed, at its width (8-bit values are
            // unchanged), unsigned as upstream types it.
            "bswap" => {
                if !arity(self) {
                    return Type::Void;
                }
                int_at(self, 0);
                match &tys[0] {
                    Type::Int { bits, .. } => Type::Int {
                        bits: *bits,
                        signed: false,
                    },
                    _ => Type::U64,
                }
            }
            "uaddr" => {
                let mut bits = 8;
                if arity(self) {
                    self.literal_string(&name, &a[0]);
                    if let ExprKind::Str(sym) = &a[0].kind {
                        bits = self.uaddr_bits(&String::from_utf8_lossy(sym));
                    }
                }
                Type::Ptr(Box::new(Type::Int {
                    bits,
                    signed: false,
                }))
            }
            "signal" => {
                if arity(self) {
                    if let ExprKind::Str(s) = &a[0].kind {
                        if signal_number(&String::from_utf8_lossy(s)).is_none() {
                            self.err(a[0].span, "signal(): unknown signal name");
                        }
                    } else {
                        int_at(self, 0);
                    }
                }
                Type::Void
            }
            "ustack" => {
                if !arity(self) {
                    return Type::Void;
                }
                let mut mode = self.stack_mode;
                let mut depth = USTACK_DEPTH;
                for x in a.iter() {
                    match &x.kind {
                        ExprKind::Ident(m) if m == "bpftrace" => mode = StackMode::Bpftrace,
                        ExprKind::Ident(m) if m == "perf" => mode = StackMode::Perf,
                        ExprKind::Ident(m) if m == "raw" => mode = StackMode::Raw,
                        _ => match literal_int(x) {
                            Some(d) if (1..=1024).contains(&d) => depth = d as u32,
                            _ => self.err(x.span, "ustack(): expected a stack mode (bpftrace, perf, raw) or a depth literal from 1 to 1024"),
                        },
                    }
                }
                Type::UStack { depth, mode }
            }
            "strncmp" => {
                if arity(self) {
                    str_at(self, 0);
                    str_at(self, 1);
                    if literal_int(&a[2]).is_none_or(|v| v < 0) {
                        self.err(
                            a[2].span,
                            "strncmp(): the length must be a non-negative integer literal",
                        );
                    }
                }
                Type::I64
            }
            "strcontains" => {
                if arity(self) {
                    str_at(self, 0);
                    str_at(self, 1);
                }
                Type::Bool
            }
            "__weft_stop" => {
                arity(self);
                Type::I64
            }
            "__weft_strorder" => {
                if arity(self) {
                    str_at(self, 0);
                    str_at(self, 1);
                }
                Type::I64
            }
            // A named program parameter (`-- --NAME=VALUE`), typed by its default: a
            // boolean without one.
            "getopt" => {
                if !arity(self) {
                    return Type::Void;
                }
                let ExprKind::Str(name) = &a[0].kind else {
                    self.err(
                        a[0].span,
                        "getopt(): the first argument must be a string literal (the parameter's name)",
                    );
                    return Type::Void;
                };
                let name = String::from_utf8_lossy(name).into_owned();
                let default = match a.get(1) {
                    None => NamedValue::Bool(false),
                    Some(x) => match (&x.kind, literal_int(x)) {
                        (ExprKind::Bool(b), _) => NamedValue::Bool(*b),
                        (ExprKind::Str(s), _) => NamedValue::Str(s.clone()),
                        (_, Some(v)) => NamedValue::Int(v),
                        _ => {
                            self.err(
                                x.span,
                                "getopt(): the default value must be a string, integer or boolean literal",
                            );
                            return Type::Void;
                        }
                    },
                };
                if let Some(d) = a.get(2) {
                    if !matches!(d.kind, ExprKind::Str(_)) {
                        self.err(d.span, "getopt(): the description must be a string literal");
                    }
                }
                match self.getopt_defaults.get(&name) {
                    Some((prev, first)) if *prev != default => {
                        let msg = format!(
                            "getopt(): `{name}` needs the same default value everywhere; it was {} before",
                            prev.describe()
                        );
                        let first = *first;
                        self.push(
                            Diagnostic::error(span, msg).with_note(Some(first), "first given here"),
                        );
                    }
                    Some(_) => {}
                    None => {
                        self.getopt_defaults
                            .insert(name.clone(), (default.clone(), span));
                    }
                }
                let given = self.opts.named.iter().rev().find(|(n, _)| *n == name);
                let value = match given {
                    None => default.clone(),
                    Some((_, v)) => match default.with_command_line(&name, v.as_deref()) {
                        Ok(v) => v,
                        Err(msg) => {
                            self.err(span, msg);
                            default.clone()
                        }
                    },
                };
                self.named.insert(name, value);
                match default {
                    NamedValue::Bool(_) => Type::Bool,
                    NamedValue::Int(_) => Type::I64,
                    NamedValue::Str(_) => Type::Str {
                        cap: self.config.strlen,
                    },
                }
            }
            // An IP address as text: the family from the first argument, else from
            // the address (an integer or 4 bytes: IPv4; 16 bytes: IPv6).
            "ntop" => {
                if !arity(self) {
                    return Type::Void;
                }
                if n == 2 {
                    int_at(self, 0);
                }
                let addr = &tys[n - 1];
                let size_ok = |t: &Type| matches!(t.size(), 4 | 16);
                match addr {
                    Type::Void => {}
                    t if is_int(t) => {}
                    t if matches!(t, Type::Str { .. }) || is_array(t) => {
                        if !size_ok(t) {
                            self.err(
                                a[n - 1].span,
                                format!("ntop() argument must be 4 or 16 bytes in size, not `{t}`"),
                            );
                        }
                    }
                    t => self.err(
                        a[n - 1].span,
                        format!("ntop() expects an integer or array argument, got `{t}`"),
                    ),
                }
                Type::Inet
            }
            // A compile-time constant: the address's bytes in network order.
            "pton" => {
                if !arity(self) {
                    return Type::Void;
                }
                let ExprKind::Str(s) = &a[0].kind else {
                    if tys[0] != Type::Void {
                        self.err(
                            a[0].span,
                            format!("pton() expects a string literal, got `{}`", tys[0]),
                        );
                    }
                    return Type::Void;
                };
                match pton(&String::from_utf8_lossy(s)) {
                    Ok(bytes) => byte_array(bytes.len() as u32),
                    Err(msg) => {
                        self.err(a[0].span, msg);
                        Type::Void
                    }
                }
            }
            // Six bytes: read at an address, or an array or string of six bytes.
            "macaddr" => {
                if !arity(self) {
                    return Type::Void;
                }
                match &tys[0] {
                    Type::Void => {}
                    t if is_int(t) || matches!(t, Type::Ptr(_)) => {}
                    t if matches!(t, Type::Str { .. }) || is_array(t) => {
                        if t.size() != 6 {
                            self.err(
                                a[0].span,
                                format!("macaddr() argument must be 6 bytes in size, not `{t}`"),
                            );
                        }
                    }
                    t => self.err(
                        a[0].span,
                        format!("macaddr() only supports array or pointer arguments, not `{t}`"),
                    ),
                }
                Type::MacAddr
            }
            "reg" => {
                if arity(self) {
                    match &a[0].kind {
                        ExprKind::Str(s) if machine_reg(&String::from_utf8_lossy(s)).is_some() => {}
                        ExprKind::Str(s) => self.err(
                            a[0].span,
                            format!(
                                "'{}' is not a valid register on this architecture (x86_64); \
                                 the registers are {}",
                                String::from_utf8_lossy(s),
                                REGISTER_NAMES.join(", ")
                            ),
                        ),
                        _ => self.err(
                            a[0].span,
                            "reg(): the register name must be a string literal such as \"sp\"",
                        ),
                    }
                }
                Type::U64
            }
            // `pcomm()` is `pcomm` (upstream's stdlib has both forms; the one taking
            // a task is kernel-only).
            "pcomm" => {
                arity(self);
                Type::Str { cap: COMM_CAP }
            }
            _ => Type::Void,
        }
    }

    fn literal_string(&mut self, name: &str, e: &Expr) {
        if !matches!(e.kind, ExprKind::Str(_)) {
            self.err(
                e.span,
                format!("{name}(): the format must be a string literal"),
            );
        }
    }

    /// The printer pads to any width it is given: a format's widths and precisions are
    /// each at most [`PRINTF_MAX_WIDTH`], and add up to no more than that.
    fn format_widths(&mut self, name: &str, fmt: &str, span: Span) {
        let max = u64::from(PRINTF_MAX_WIDTH);
        let mut total = 0u64;
        let mut each_ok = true;
        for f in weft_ir::format::fields(fmt) {
            for (what, v) in [("width", Some(f.width)), ("precision", f.precision)] {
                let Some(v) = v else { continue };
                if v > max {
                    each_ok = false;
                    self.err(
                        span,
                        format!(
                            "{name}(): the {what} in `{}` is too large (at most {max})",
                            f.text
                        ),
                    );
                }
                total = total.saturating_add(v);
            }
        }
        if each_ok && total > max {
            self.err(
                span,
                format!(
                    "{name}(): the widths and precisions of this format add up to {total} (at most {max})"
                ),
            );
        }
    }

    /// Check `printf`-style arguments against the format's conversions.
    fn format_args(&mut self, name: &str, args: &[Expr], tys: &[Type], span: Span) {
        let ExprKind::Str(fmt) = &args[0].kind else {
            self.err(
                args[0].span,
                format!("{name}(): the format must be a string literal"),
            );
            return;
        };
        let fmt = String::from_utf8_lossy(fmt).into_owned();
        self.format_widths(name, &fmt, args[0].span);
        let convs = conversions(&fmt);
        let given = args.len() - 1;
        if given != convs.len() {
            let which = if given < convs.len() {
                "not enough"
            } else {
                "too many"
            };
            let mut d = Diagnostic::error(
                span,
                format!(
                    "{name}(): {which} arguments for the format ({given} given, {} expected)",
                    convs.len()
                ),
            );
            let odd = not_conversions(&fmt);
            if !odd.is_empty() {
                d = d.with_help(format!(
                    "{} {} (as in bpftrace, only `%[-][width][.precision]` with d u x X o \
                     c s p r and the length modifiers hh h l ll j z t are conversions)",
                    odd.iter()
                        .map(|o| format!("`{o}`"))
                        .collect::<Vec<_>>()
                        .join(", "),
                    if odd.len() == 1 {
                        "is not a conversion"
                    } else {
                        "are not conversions"
                    }
                ));
            }
            self.push(d);
            return;
        }
        for (i, c) in convs.iter().enumerate() {
            let t = &tys[i + 1];
            if *t == Type::Void {
                continue;
            }
            let ok = match c.kind {
                ArgKind::Int | ArgKind::Char => {
                    is_int(t) || matches!(t, Type::Ptr(_) | Type::Enum(_))
                }
                ArgKind::Ptr => is_int(t) || matches!(t, Type::Ptr(_) | Type::USym),
                // A bool prints as `true`/`false` (upstream); as bpftrace, a buffer
                // prints with %r only, and %r prints nothing else.
                ArgKind::Str => {
                    *t == Type::Bool
                        || !is_int(t)
                            && !matches!(t, Type::Ptr(_) | Type::CStruct(_) | Type::Buf { .. })
                }
                ArgKind::Buf => matches!(t, Type::Buf { .. }),
            };
            if !ok {
                let want = match c.kind {
                    ArgKind::Int | ArgKind::Char | ArgKind::Ptr => "an integer",
                    ArgKind::Str => "a string",
                    ArgKind::Buf => "a buffer",
                };
                self.push(
                    Diagnostic::error(
                        args[i + 1].span,
                        format!("{name}(): `{}` expects {want}, not `{t}`", c.text),
                    )
                    .with_note(Some(args[0].span), "in this format"),
                );
            }
            if ok && matches!(t, Type::CStruct(_)) {
                self.err(
                    args[i + 1].span,
                    format!("{name}(): a value of type `{t}` cannot be printed"),
                );
            }
        }
    }
}

/// "no arguments", "1 argument", "1 to 3 arguments", "at least 1 argument".
fn arity_text(lo: usize, hi: usize) -> String {
    let s = |n: usize| if n == 1 { "" } else { "s" };
    match (lo, hi) {
        (0, 0) => "no arguments".to_string(),
        (l, h) if l == h => format!("{l} argument{}", s(l)),
        (l, usize::MAX) => format!("at least {l} argument{}", s(l)),
        (l, h) => format!("{l} to {h} arguments"),
    }
}

pub fn signal_number(name: &str) -> Option<i64> {
    let n = name.strip_prefix("SIG").unwrap_or(name);
    let v = match n {
        "HUP" => 1,
        "INT" => 2,
        "QUIT" => 3,
        "ILL" => 4,
        "TRAP" => 5,
        "ABRT" => 6,
        "BUS" => 7,
        "FPE" => 8,
        "KILL" => 9,
        "USR1" => 10,
        "SEGV" => 11,
        "USR2" => 12,
        "PIPE" => 13,
        "ALRM" => 14,
        "TERM" => 15,
        "CHLD" => 17,
        "CONT" => 18,
        "STOP" => 19,
        "TSTP" => 20,
        _ => return None,
    };
    Some(v)
}

/// Why a value of type `t` cannot be copied (into a variable, a map, an event), or
/// None: a struct or array weft knows only by name and size (declared but not
/// defined, nested too deep in DWARF, an array of more elements than weft expands)
/// has no layout to print or compare.
fn uncopyable(t: &Type) -> Option<String> {
    /// The first struct or array without members in `t` (`t` itself included).
    fn opaque(t: &Type) -> Option<&Type> {
        match t {
            Type::CStruct(s) if s.fields.is_empty() => Some(t),
            Type::CStruct(s) => s.fields.iter().find_map(|f| opaque(&f.ty)),
            Type::Tuple(ts) => ts.iter().find_map(opaque),
            Type::Record(fs) => fs.iter().find_map(|(_, t)| opaque(t)),
            _ => None,
        }
    }
    let inner = opaque(t)?;
    Some(if inner == t {
        format!(
            "a whole `{t}` cannot be used as a value: weft does not know its members (read \
             its fields or elements one by one)"
        )
    } else {
        format!(
            "a whole `{t}` cannot be used as a value: weft does not know the members of the \
             `{inner}` in it (read its other fields one by one)"
        )
    })
}

/// Bytes of the smallest integer type holding `v` (unsigned when `v` is not
/// negative), as upstream types an integer literal.
fn literal_size(v: i64) -> u64 {
    let fits = |bits: u32| {
        if v >= 0 {
            v < 1i64 << bits.min(63)
        } else {
            v >= -(1i64 << (bits - 1).min(63))
        }
    };
    [1u64, 2, 4]
        .into_iter()
        .find(|&b| fits(b as u32 * 8))
        .unwrap_or(8)
}

/// The element type of an array of integers (what array casts convert).
fn int_array(t: &Type) -> Option<&Type> {
    match t {
        Type::CStruct(s) if is_array(t) => s.fields.first().map(|f| &f.ty).filter(|e| is_int(e)),
        _ => None,
    }
}

/// Whether `t` is a C array (`uint8[4]`, from DWARF, a cast or `pton`).
pub fn is_array(t: &Type) -> bool {
    matches!(t, Type::CStruct(s) if s.name.ends_with(']'))
}

/// The type `uint8[n]` (what `pton` returns).
pub fn byte_array(n: u32) -> Type {
    let elem = Type::Int {
        bits: 8,
        signed: false,
    };
    Type::CStruct(CStruct {
        name: format!("{elem}[{n}]"),
        size: n,
        fields: (0..n)
            .map(|i| CField {
                name: i.to_string(),
                offset: i,
                ty: elem.clone(),
                bits: None,
            })
            .collect(),
    })
}

/// `pton(text)` as upstream bpftrace computes it: a text with a `.` is an IPv4
/// address (4 bytes), else one with a `:` an IPv6 address (16 bytes), each as
/// `inet_pton` parses it (IPv4 in dotted decimal without leading zeros; so
/// `::ffff:1.2.3.4`, which has a `.`, is refused).
pub fn pton(text: &str) -> Result<Vec<u8>, String> {
    let parsed = if text.contains('.') {
        text.parse::<std::net::Ipv4Addr>()
            .map(|a| a.octets().to_vec())
    } else if text.contains(':') {
        text.parse::<std::net::Ipv6Addr>()
            .map(|a| a.octets().to_vec())
    } else {
        return Err(format!(
            "pton() expects a string argument of an IPv4/IPv6 address, got {text}"
        ));
    };
    parsed.map_err(|_| format!("pton() expects a valid IPv4/IPv6 address, got {text}"))
}

/// Where `reg(NAME)` reads from: a register saved at the probe site, or a value that
/// is the same at every user-space probe.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RegSource {
    Machine(weft_ir::MachineReg),
    Constant(i64),
}

/// The register names upstream bpftrace accepts on x86-64 (its `pt_regs` fields:
/// `src/arch/x86_64.cpp`), and 0.17's `orig_ax` for upstream's `orig_rax`.
pub const REGISTER_NAMES: &[&str] = &[
    "r15", "r14", "r13", "r12", "bp", "bx", "r11", "r10", "r9", "r8", "ax", "cx", "dx", "si", "di",
    "orig_rax", "orig_ax", "ip", "cs", "flags", "sp", "ss",
];

/// `reg(name)` on x86-64 Linux. In user space `cs` and `ss` are the 64-bit user
/// segments (`__USER_CS` 0x33, `__USER_DS` 0x2b) and `orig_rax`, the system call
/// being made, is -1 at a probe (no call is in progress), as bpftrace reads them
/// from a uprobe's registers.
pub fn machine_reg(name: &str) -> Option<RegSource> {
    use weft_ir::MachineReg as R;
    Some(RegSource::Machine(match name {
        "ax" => R::Rax,
        "bx" => R::Rbx,
        "cx" => R::Rcx,
        "dx" => R::Rdx,
        "si" => R::Rsi,
        "di" => R::Rdi,
        "bp" => R::Rbp,
        "sp" => R::Rsp,
        "r8" => R::R8,
        "r9" => R::R9,
        "r10" => R::R10,
        "r11" => R::R11,
        "r12" => R::R12,
        "r13" => R::R13,
        "r14" => R::R14,
        "r15" => R::R15,
        "ip" => R::Rip,
        "flags" => R::Flags,
        "cs" => return Some(RegSource::Constant(0x33)),
        "ss" => return Some(RegSource::Constant(0x2b)),
        "orig_rax" | "orig_ax" => return Some(RegSource::Constant(-1)),
        _ => return None,
    }))
}

/// Fields split at every `:`, with the `::` of a C++ or Rust path put back: an
/// empty field between two others joins them (`ns`, ``, `f` is `ns::f`).
/// `BIN@FILE` and `LINE` of a source-line probe (`uprobe:./app@app.c:22`): a last
/// field of decimal digits after a binary holding `@`. The binary is split at its
/// last `@`, so a path with `@` in it still names a binary (`/opt/a@b/app@x.c:3`),
/// and a function probe on such a path (`uprobe:/opt/a@b/app:main`) is untouched:
/// no function is named by digits alone.
fn source_line(target: &str, func: &str) -> Option<(String, String, Result<u32, String>)> {
    if !func.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let (bin, file) = target.rsplit_once('@')?;
    if file.is_empty() {
        return None;
    }
    let line = match func.parse::<u32>() {
        Ok(0) => Err("lines count from 1".to_string()),
        Ok(n) => Ok(n),
        Err(_) => Err(format!("`{func}` is not a line number")),
    };
    Some((bin.to_string(), file.to_string(), line))
}

fn join_scopes(fields: &[String]) -> Vec<String> {
    let mut out: Vec<String> = Vec::with_capacity(fields.len());
    let mut i = 0;
    while i < fields.len() {
        if fields[i].is_empty() && i + 1 < fields.len() {
            if let Some(last) = out.last_mut().filter(|l| !l.is_empty()) {
                last.push_str("::");
                last.push_str(&fields[i + 1]);
                i += 2;
                continue;
            }
        }
        out.push(fields[i].clone());
        i += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pton_bytes_in_network_order() {
        assert_eq!(pton("127.0.0.1"), Ok(vec![127, 0, 0, 1]));
        assert_eq!(pton("0.0.0.0"), Ok(vec![0; 4]));
        let mut one = vec![0u8; 16];
        one[15] = 1;
        assert_eq!(pton("::1"), Ok(one));
        let v6 = pton("fe80::1:2").unwrap();
        assert_eq!(
            (v6.len(), &v6[..2], &v6[12..]),
            (16, &[0xfe, 0x80][..], &[0, 1, 0, 2][..])
        );
        for bad in [
            "1.2.3",
            "1.2.3.4.5",
            "01.2.3.4",
            "1.2.3.256",
            "::ffff:1.2.3.4",
            "1::2::3",
            "abc",
            "",
        ] {
            assert!(pton(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn byte_arrays_are_c_arrays() {
        let t = byte_array(4);
        assert!(is_array(&t));
        assert_eq!(
            (t.size(), t.align(), t.to_string()),
            (4, 1, "uint8[4]".into())
        );
    }
}
