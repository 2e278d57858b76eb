//! DWARF: function parameters as [`weft_ir::Type`]s (for `args`), and source lines.
//!
//! Types map as follows:
//!
//! * base types of 1, 2, 4, 8 bytes → [`Type::Int`] (signed for signed encodings).
//!   `_Bool` is an unsigned 8-bit int; **floats are their raw bits as unsigned ints**
//!   (the IR has no float type); other sizes (`__int128`, `long double`) → an opaque
//!   [`CStruct`] of that size.
//! * pointers and C++ references → [`Type::Ptr`]; `void *` and function pointers →
//!   `Ptr(Void)`.
//! * `typedef`, `const`, `volatile`, `restrict`, `_Atomic` → the underlying type (an
//!   anonymous struct takes its typedef's name).
//! * enums → `Int` of the enum's size (signedness of its underlying type).
//! * structs, classes, unions → [`CStruct`] with each member's name, byte offset and
//!   type; members of anonymous struct/union members are lifted into the parent (as C
//!   lets you name them); **bitfields are left out**; union members all sit at 0.
//!   A struct already being expanded (`struct node *next`), one more than 8 levels
//!   deep, or only declared, is an opaque `CStruct` (name and size, no fields).
//! * arrays → a `CStruct` named like `int[4]` with one field per element (`[0]`,
//!   `[1]`, …); arrays of more than 64 elements are opaque (size only). An array of
//!   plain `char` is a [`Type::Str`] of its length (bpftrace's `string[N]`), so
//!   `char name[16]` prints as text; `signed char` and `unsigned char` arrays do not.
//!
//! Where the DWARF comes from (the file itself, compressed or not; a separate debug
//! file; `.dwo` files and `.dwp` packages for split DWARF) is `debugfile`'s business;
//! this module reads the units it hands over.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use addr2line::LookupContinuation;
use gimli::{AttributeValue, DebuggingInformationEntry, Reader, UnitOffset};
use weft_ir::{CField, CStruct, Type};

use crate::debugfile::{self, DebugSearch, MissingDwo, R};
use crate::elf::{ElfFile, SharedBytes};
use crate::error::{Error, Result};

const MAX_DEPTH: u32 = 8;
const MAX_ARRAY_FIELDS: u64 = 64;

/// A function parameter.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Param {
    /// The name in the source, or `argN` for an unnamed parameter.
    pub name: String,
    pub ty: Type,
    /// The type as C spells it (`const char*`, `struct Foo*`, `size_t`), as
    /// `bpftrace -lv` lists it.
    pub c_type: String,
}

/// One unit and the DWARF it is read from (the file's, or its `.dwo`'s for a split
/// unit).
struct DebugUnit {
    dwarf: Arc<gimli::Dwarf<R>>,
    unit: gimli::Unit<R>,
}

/// The DWARF of one ELF file (from wherever it lives), owning what it reads.
pub struct DebugInfo {
    path: PathBuf,
    units: Vec<DebugUnit>,
    missing: Vec<MissingDwo>,
    /// The split units' DWARF by DWO id, handed to addr2line when it asks.
    split: HashMap<gimli::DwoId, Arc<gimli::Dwarf<R>>>,
    lines: addr2line::Context<R>,
    /// The DWARF of the file itself (or its separate debug file): its units, the
    /// skeletons of split ones too, hold the line tables ([`DebugInfo::line_sites`]).
    pub(crate) main: Arc<gimli::Dwarf<R>>,
}

/// One frame of the source-level call chain at an address (see
/// [`DebugInfo::frames`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SourceFrame {
    /// The function's name as DWARF gives it (its linkage name when it has one).
    pub function: Option<String>,
    /// The C++ (or Rust) demangling of `function`, when it is a mangled name.
    pub demangled: Option<String>,
    /// The source file (with its directory) and line of the address in this frame:
    /// for an inlined frame, where its code is; for the frames around it, the call
    /// site of the frame inside.
    pub file: Option<String>,
    pub line: Option<u32>,
    /// Inlined into the next frame (every frame but the last).
    pub inlined: bool,
}

impl std::fmt::Debug for DebugInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DebugInfo")
            .field("path", &self.path)
            .field("units", &self.units.len())
            .field("missing", &self.missing)
            .finish()
    }
}

impl ElfFile {
    /// The file's DWARF (see [`ElfFile::debug_info_in`]), separate debug files looked
    /// for in [`DebugSearch::system`].
    pub fn debug_info(&self) -> Result<Option<DebugInfo>> {
        self.debug_info_in(&DebugSearch::system())
    }

    /// The file's DWARF: its own `.debug_info` (compressed or not), else the separate
    /// debug file `search` finds; split units replaced by their `.dwo` or `.dwp`
    /// contribution. `None` when there is none.
    pub fn debug_info_in(&self, search: &DebugSearch) -> Result<Option<DebugInfo>> {
        let (path, bytes) = if debugfile::file_has_debug_info(self.data()) {
            (self.path().to_path_buf(), self.shared_data())
        } else {
            let Some(path) = search.find_separate(self) else {
                return Ok(None);
            };
            let bytes = SharedBytes::map(&path).map_err(|source| Error::Io {
                path: path.clone(),
                source,
            })?;
            (path, bytes)
        };
        let err = |why: String| Error::Dwarf {
            path: path.clone(),
            why,
        };
        let dwarf = Arc::new(debugfile::load_dwarf(&bytes, false).map_err(err)?);
        let mut skeletons = Vec::new();
        let mut headers = dwarf.units();
        while let Some(header) = headers.next().map_err(|e| err(e.to_string()))? {
            skeletons.push(dwarf.unit(header).map_err(|e| err(e.to_string()))?);
        }
        let mut units = Vec::new();
        let mut missing = Vec::new();
        let mut split = HashMap::new();
        if skeletons.iter().any(|u| u.dwo_id.is_some()) {
            let package = [self.path(), &path]
                .into_iter()
                .find_map(|p| debugfile::load_package(&debugfile::package_path(p)));
            let file_dir = self.path().parent().unwrap_or(Path::new("."));
            for unit in skeletons {
                if unit.dwo_id.is_none() {
                    units.push(DebugUnit {
                        dwarf: dwarf.clone(),
                        unit,
                    });
                    continue;
                }
                match debugfile::split_unit(&dwarf, &unit, package.as_ref(), file_dir) {
                    Ok(found) => {
                        if let Some(id) = unit.dwo_id {
                            split.insert(id, found.dwarf.clone());
                        }
                        units.push(DebugUnit {
                            dwarf: found.dwarf,
                            unit: found.unit,
                        });
                    }
                    Err(m) => missing.push(m),
                }
            }
        } else {
            units.extend(skeletons.into_iter().map(|unit| DebugUnit {
                dwarf: dwarf.clone(),
                unit,
            }));
        }
        let lines =
            addr2line::Context::from_arc_dwarf(dwarf.clone()).map_err(|e| err(e.to_string()))?;
        Ok(Some(DebugInfo {
            path,
            units,
            missing,
            split,
            lines,
            main: dwarf,
        }))
    }
}

/// A variable declared inside a function ([`DebugInfo::local_variable`]).
#[derive(Clone, Debug)]
pub struct LocalVariable {
    /// The function it is declared in (its source name).
    pub function: String,
    /// A formal parameter.
    pub parameter: bool,
    /// A function's `static`: its address (as in the file's symbol table).
    pub static_addr: Option<u64>,
    /// Its type, when DWARF gives one.
    pub ty: Option<Type>,
}

/// A DIE: unit index and offset in it.
type DieRef = (usize, UnitOffset);

/// State of one type conversion: structs being expanded (to cut cycles), and limits
/// that keep malformed or huge DWARF from recursing without end.
#[derive(Default)]
struct Walk {
    expanding: Vec<DieRef>,
    /// Current recursion depth (typedef chains included).
    hops: u32,
    /// Types converted so far.
    nodes: u32,
    /// An array too large to expand keeps its element type as one field named
    /// [`ARRAY_ELEMENT`] (data pointcuts compute an element's offset from it).
    element_fields: bool,
}

/// The one field of a large array's type in [`DebugInfo::data_variable_type`]:
/// its element type, at offset 0.
pub const ARRAY_ELEMENT: &str = "[]";

const MAX_HOPS: u32 = 64;
const MAX_NODES: u32 = 20_000;

impl DebugInfo {
    /// The file the DWARF was read from (the ELF file itself, or its separate debug
    /// file).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Split units whose `.dwo` was found neither in a package nor on disk: their
    /// functions and types are unknown.
    pub fn missing_dwo(&self) -> &[MissingDwo] {
        &self.missing
    }

    /// The source file and line of a file virtual address.
    pub fn line_for(&self, vaddr: u64) -> Option<(String, u32)> {
        let loc = self.lines.find_location(vaddr).ok()??;
        Some((loc.file?.to_string(), loc.line?))
    }

    /// The source-level frames at a file virtual address, innermost first: the
    /// functions inlined there (each marked `inlined`), then the function the code
    /// belongs to. Empty when no DWARF describes the address.
    pub fn frames(&self, vaddr: u64) -> Vec<SourceFrame> {
        let mut lookup = self.lines.find_frames(vaddr);
        let found = loop {
            match lookup {
                addr2line::LookupResult::Output(found) => break found,
                addr2line::LookupResult::Load { load, continuation } => {
                    lookup = continuation.resume(self.split.get(&load.dwo_id).cloned());
                }
            }
        };
        // addr2line 0.24 fails (UnexpectedEof) on gcc 12's DWARF 5 split units here;
        // their types and lines read fine, their frames are then unknown.
        let Ok(mut iter) = found else {
            return Vec::new();
        };
        let mut out: Vec<SourceFrame> = Vec::new();
        while let Ok(Some(frame)) = iter.next() {
            let function = frame
                .function
                .as_ref()
                .and_then(|f| f.raw_name().ok().map(|n| n.into_owned()));
            let demangled = frame
                .function
                .as_ref()
                .and_then(|f| f.demangle().ok().map(|n| n.into_owned()))
                .filter(|d| Some(d) != function.as_ref());
            out.push(SourceFrame {
                function,
                demangled,
                file: frame
                    .location
                    .as_ref()
                    .and_then(|l| l.file.map(str::to_string)),
                line: frame.location.as_ref().and_then(|l| l.line),
                inlined: true,
            });
        }
        if let Some(last) = out.last_mut() {
            last.inlined = false;
        }
        out
    }

    /// The parameters of the function named `name` (its source name, or its linkage
    /// name for C++), from its defining DIE; `None` when no such function is
    /// described.
    pub fn function_params(&self, name: &str) -> Option<Vec<Param>> {
        let mut fallback = None;
        for (ui, u) in self.units.iter().enumerate() {
            let mut entries = u.unit.entries();
            while let Ok(Some((_, entry))) = entries.next_dfs() {
                if entry.tag() != gimli::DW_TAG_subprogram || !entry.has_children() {
                    continue;
                }
                if !self.names_of(ui, entry, 0).iter().any(|n| n == name) {
                    continue;
                }
                let params = self.params_of((ui, entry.offset()));
                let declaration = matches!(entry.attr_value(gimli::DW_AT_declaration), Ok(Some(_)));
                if !declaration && params.iter().all(|p| p.is_some()) {
                    return Some(params.into_iter().flatten().collect());
                }
                fallback.get_or_insert(params);
            }
        }
        fallback.map(|ps| {
            ps.into_iter()
                .enumerate()
                .map(|(i, p)| {
                    p.unwrap_or(Param {
                        name: format!("arg{i}"),
                        ty: Type::Void,
                        c_type: "void".into(),
                    })
                })
                .collect()
        })
    }

    /// The return type of the function named `name` (as [`Self::function_params`]
    /// finds it); `None` for a `void` function or one DWARF does not describe.
    pub fn function_return_type(&self, name: &str) -> Option<Type> {
        for (ui, u) in self.units.iter().enumerate() {
            let mut entries = u.unit.entries();
            while let Ok(Some((_, entry))) = entries.next_dfs() {
                if entry.tag() != gimli::DW_TAG_subprogram
                    || !self.names_of(ui, entry, 0).iter().any(|n| n == name)
                {
                    continue;
                }
                let origin = self.reference(ui, entry, gimli::DW_AT_abstract_origin);
                let ty = self.reference(ui, entry, gimli::DW_AT_type).or_else(|| {
                    let (uj, o) = origin?;
                    self.reference(uj, &self.units[uj].unit.entry(o).ok()?, gimli::DW_AT_type)
                });
                if let Some(t) = ty {
                    return Some(self.type_of(t, 0, &mut Walk::default(), None));
                }
            }
        }
        None
    }

    /// The type of the global or static variable named `name` (a variable DIE
    /// with that name and a type, its definition preferred); `None` when DWARF does
    /// not describe it.
    pub fn variable_type(&self, name: &str) -> Option<Type> {
        self.variable_type_with(name, false)
    }

    /// [`Self::variable_type`] for a data pointcut, which may index any element:
    /// an array too large to list its elements has one field, [`ARRAY_ELEMENT`],
    /// the element type (so `big[600]` is `600 * size` bytes in).
    pub fn data_variable_type(&self, name: &str) -> Option<Type> {
        self.variable_type_with(name, true)
    }

    fn variable_type_with(&self, name: &str, element_fields: bool) -> Option<Type> {
        let mut fallback = None;
        for (ui, u) in self.units.iter().enumerate() {
            let mut entries = u.unit.entries();
            let mut depth = 0isize;
            while let Ok(Some((delta, entry))) = entries.next_dfs() {
                depth += delta;
                // Globals and file statics at the unit's top level; function
                // statics inside a subprogram (they have a static location too).
                if entry.tag() != gimli::DW_TAG_variable || depth < 1 {
                    continue;
                }
                if self.string_attr(ui, entry, gimli::DW_AT_name).as_deref() != Some(name) {
                    continue;
                }
                let ty = self.reference(ui, entry, gimli::DW_AT_type).or_else(|| {
                    let (uj, o) = self.reference(ui, entry, gimli::DW_AT_specification)?;
                    self.reference(uj, &self.units[uj].unit.entry(o).ok()?, gimli::DW_AT_type)
                });
                let Some(t) = ty else { continue };
                let has_location = matches!(entry.attr_value(gimli::DW_AT_location), Ok(Some(_)));
                let mut walk = Walk {
                    element_fields,
                    ..Walk::default()
                };
                let ty = self.type_of(t, 0, &mut walk, None);
                if has_location {
                    return Some(ty);
                }
                fallback.get_or_insert(ty);
            }
        }
        fallback
    }

    /// The struct, class or union named `name` (`struct point` in a cast): a
    /// complete definition's type (one only declared here is skipped); `None`
    /// when DWARF does not define it.
    pub fn struct_type(&self, name: &str) -> Option<Type> {
        for (ui, u) in self.units.iter().enumerate() {
            let mut entries = u.unit.entries();
            while let Ok(Some((_, entry))) = entries.next_dfs() {
                if !matches!(
                    entry.tag(),
                    gimli::DW_TAG_structure_type
                        | gimli::DW_TAG_class_type
                        | gimli::DW_TAG_union_type
                ) || matches!(entry.attr_value(gimli::DW_AT_declaration), Ok(Some(_)))
                {
                    continue;
                }
                if self.string_attr(ui, entry, gimli::DW_AT_name).as_deref() != Some(name) {
                    continue;
                }
                let ty = self.type_of((ui, entry.offset()), 0, &mut Walk::default(), None);
                if matches!(&ty, Type::CStruct(c) if !c.fields.is_empty()) {
                    return Some(ty);
                }
            }
        }
        None
    }

    /// A variable or parameter named `name` declared inside a function, as DWARF
    /// describes it (data pointcuts explain what cannot be watched, and find a
    /// function's `static`, which the symbol table names `name.N`): a static one
    /// (`DW_OP_addr`) first, else the first found.
    pub fn local_variable(&self, name: &str) -> Option<LocalVariable> {
        let mut first = None;
        for (ui, u) in self.units.iter().enumerate() {
            let mut entries = u.unit.entries();
            let mut depth = 0isize;
            // The enclosing functions' names, with the depth of their DIEs.
            let mut functions: Vec<(isize, String)> = Vec::new();
            while let Ok(Some((delta, entry))) = entries.next_dfs() {
                depth += delta;
                while functions.last().is_some_and(|(d, _)| *d >= depth) {
                    functions.pop();
                }
                let tag = entry.tag();
                if tag == gimli::DW_TAG_subprogram {
                    let f = self.names_of(ui, entry, 0).into_iter().next();
                    functions.push((depth, f.unwrap_or_default()));
                    continue;
                }
                if tag != gimli::DW_TAG_variable && tag != gimli::DW_TAG_formal_parameter {
                    continue;
                }
                let Some((_, function)) = functions.last() else {
                    continue;
                };
                if !self.names_of(ui, entry, 0).iter().any(|n| n == name) {
                    continue;
                }
                let static_addr = match entry.attr_value(gimli::DW_AT_location) {
                    Ok(Some(AttributeValue::Exprloc(expr))) => {
                        let mut r = expr.0;
                        match (r.read_u8(), r.read_u64()) {
                            (Ok(op), Ok(a)) if op == gimli::DW_OP_addr.0 && r.is_empty() => Some(a),
                            _ => None,
                        }
                    }
                    _ => None,
                };
                let ty = self
                    .reference(ui, entry, gimli::DW_AT_type)
                    .map(|t| self.type_of(t, 0, &mut Walk::default(), None));
                let found = LocalVariable {
                    function: function.clone(),
                    parameter: tag == gimli::DW_TAG_formal_parameter,
                    static_addr,
                    ty,
                };
                if found.static_addr.is_some() {
                    return Some(found);
                }
                first.get_or_insert(found);
            }
        }
        first
    }

    /// The DW_AT_name and DW_AT_linkage_name of a DIE, following abstract origins
    /// and specifications.
    fn names_of(
        &self,
        ui: usize,
        entry: &DebuggingInformationEntry<'_, '_, R>,
        depth: u32,
    ) -> Vec<String> {
        let mut out = Vec::new();
        for at in [
            gimli::DW_AT_name,
            gimli::DW_AT_linkage_name,
            gimli::DW_AT_MIPS_linkage_name,
        ] {
            if let Some(s) = self.string_attr(ui, entry, at) {
                out.push(s);
            }
        }
        if out.is_empty() && depth < 4 {
            for at in [gimli::DW_AT_abstract_origin, gimli::DW_AT_specification] {
                if let Some((uj, off)) = self.reference(ui, entry, at) {
                    if let Ok(e) = self.units[uj].unit.entry(off) {
                        out.extend(self.names_of(uj, &e, depth + 1));
                    }
                }
            }
        }
        out
    }

    /// The formal parameters of a subprogram; `None` for one without a name or type.
    fn params_of(&self, die: DieRef) -> Vec<Option<Param>> {
        let (ui, off) = die;
        let unit = &self.units[ui].unit;
        let Ok(mut tree) = unit.entries_tree(Some(off)) else {
            return Vec::new();
        };
        let Ok(root) = tree.root() else {
            return Vec::new();
        };
        let mut children = root.children();
        let mut out = Vec::new();
        while let Ok(Some(child)) = children.next() {
            let e = child.entry();
            if e.tag() != gimli::DW_TAG_formal_parameter {
                continue;
            }
            let index = out.len();
            // A concrete instance may hold only DW_AT_abstract_origin.
            let origin = self.reference(ui, e, gimli::DW_AT_abstract_origin);
            let name = self.string_attr(ui, e, gimli::DW_AT_name).or_else(|| {
                let (uj, o) = origin?;
                self.string_attr(uj, &self.units[uj].unit.entry(o).ok()?, gimli::DW_AT_name)
            });
            let ty = self.reference(ui, e, gimli::DW_AT_type).or_else(|| {
                let (uj, o) = origin?;
                self.reference(uj, &self.units[uj].unit.entry(o).ok()?, gimli::DW_AT_type)
            });
            out.push(ty.map(|t| Param {
                name: name.unwrap_or_else(|| format!("arg{index}")),
                ty: self.type_of(t, 0, &mut Walk::default(), None),
                c_type: self.c_name(t, 0),
            }));
        }
        out
    }

    /// The type at `die` as C spells it: base types and typedefs by name, `struct X`,
    /// `union X`, `enum X`, `T*`, `const T`, `T[N]`, a function pointer as
    /// `R (*)(...)`.
    fn c_name(&self, die: DieRef, depth: u32) -> String {
        let (ui, off) = die;
        let Some(e) = (depth < 32)
            .then(|| self.units[ui].unit.entry(off).ok())
            .flatten()
        else {
            return "?".into();
        };
        let name = self.string_attr(ui, &e, gimli::DW_AT_name);
        let inner = || {
            self.reference(ui, &e, gimli::DW_AT_type)
                .map_or_else(|| "void".to_string(), |t| self.c_name(t, depth + 1))
        };
        let named = |kw: &str| format!("{kw} {}", name.as_deref().unwrap_or("(anonymous)"));
        match e.tag() {
            gimli::DW_TAG_structure_type => named("struct"),
            gimli::DW_TAG_class_type => named("class"),
            gimli::DW_TAG_union_type => named("union"),
            gimli::DW_TAG_enumeration_type => named("enum"),
            gimli::DW_TAG_pointer_type => {
                let to = inner();
                match to.strip_suffix(" (*)(...)") {
                    // A pointer to a function is written `R (*)(...)` already.
                    Some(_) => to,
                    None => format!("{to}*"),
                }
            }
            gimli::DW_TAG_reference_type => format!("{}&", inner()),
            gimli::DW_TAG_rvalue_reference_type => format!("{}&&", inner()),
            gimli::DW_TAG_const_type => format!("const {}", inner()),
            gimli::DW_TAG_volatile_type => format!("volatile {}", inner()),
            gimli::DW_TAG_restrict_type | gimli::DW_TAG_atomic_type => inner(),
            gimli::DW_TAG_subroutine_type => format!("{} (*)(...)", inner()),
            gimli::DW_TAG_array_type => {
                let n = self.array_len(die);
                format!(
                    "{}[{}]",
                    inner(),
                    n.map_or(String::new(), |n| n.to_string())
                )
            }
            _ => name.unwrap_or_else(|| "void".into()),
        }
    }

    /// The element count of the array type at `die` (its first dimension).
    fn array_len(&self, die: DieRef) -> Option<u64> {
        let (ui, off) = die;
        let unit = &self.units[ui].unit;
        let mut tree = unit.entries_tree(Some(off)).ok()?;
        let root = tree.root().ok()?;
        let mut children = root.children();
        while let Ok(Some(child)) = children.next() {
            let e = child.entry();
            if e.tag() != gimli::DW_TAG_subrange_type {
                continue;
            }
            if let Some(n) = e.attr_value(gimli::DW_AT_count).ok().flatten() {
                return n.udata_value();
            }
            let upper = e.attr_value(gimli::DW_AT_upper_bound).ok().flatten()?;
            return upper.udata_value().map(|u| u + 1);
        }
        None
    }

    fn string_attr(
        &self,
        ui: usize,
        e: &DebuggingInformationEntry<'_, '_, R>,
        at: gimli::DwAt,
    ) -> Option<String> {
        let v = e.attr_value(at).ok()??;
        let u = &self.units[ui];
        let s = u.dwarf.attr_string(&u.unit, v).ok()?;
        Some(String::from_utf8_lossy(&s).into_owned())
    }

    /// Follows a reference attribute to a DIE, possibly in another unit.
    fn reference(
        &self,
        ui: usize,
        e: &DebuggingInformationEntry<'_, '_, R>,
        at: gimli::DwAt,
    ) -> Option<DieRef> {
        match e.attr_value(at).ok()?? {
            AttributeValue::UnitRef(off) => Some((ui, off)),
            AttributeValue::DebugInfoRef(off) => {
                // An offset in the `.debug_info` this unit was read from.
                let dwarf = &self.units[ui].dwarf;
                self.units.iter().enumerate().find_map(|(uj, u)| {
                    if !Arc::ptr_eq(&u.dwarf, dwarf) {
                        return None;
                    }
                    Some((uj, off.to_unit_offset(&u.unit.header)?))
                })
            }
            _ => None,
        }
    }

    fn udata(&self, e: &DebuggingInformationEntry<'_, '_, R>, at: gimli::DwAt) -> Option<u64> {
        e.attr_value(at).ok()??.udata_value()
    }

    /// The IR type of a type DIE. `depth` counts pointer and aggregate nesting;
    /// `typedef_name` names an anonymous struct.
    fn type_of(
        &self,
        die: DieRef,
        depth: u32,
        walk: &mut Walk,
        typedef_name: Option<&str>,
    ) -> Type {
        if walk.hops >= MAX_HOPS || walk.nodes >= MAX_NODES {
            return Type::Void;
        }
        walk.hops += 1;
        walk.nodes += 1;
        let t = self.convert_type(die, depth, walk, typedef_name);
        walk.hops -= 1;
        t
    }

    fn convert_type(
        &self,
        die: DieRef,
        depth: u32,
        walk: &mut Walk,
        typedef_name: Option<&str>,
    ) -> Type {
        let (ui, off) = die;
        let Ok(e) = self.units[ui].unit.entry(off) else {
            return Type::Void;
        };
        let name = self.string_attr(ui, &e, gimli::DW_AT_name);
        let size = self.udata(&e, gimli::DW_AT_byte_size);
        let inner = |this: &Self, walk: &mut Walk, d: u32, tn: Option<&str>| match this.reference(
            ui,
            &e,
            gimli::DW_AT_type,
        ) {
            Some(t) => this.type_of(t, d, walk, tn),
            None => Type::Void,
        };
        let opaque = |n: Option<String>, size: Option<u64>| {
            Type::CStruct(CStruct {
                name: n.unwrap_or_else(|| "(anonymous)".into()),
                size: size.unwrap_or(0).min(u64::from(u32::MAX)) as u32,
                fields: Vec::new().into(),
            })
        };
        match e.tag() {
            gimli::DW_TAG_base_type => {
                let signed = matches!(
                    e.attr_value(gimli::DW_AT_encoding),
                    Ok(Some(AttributeValue::Encoding(
                        gimli::DW_ATE_signed | gimli::DW_ATE_signed_char
                    )))
                );
                match size {
                    Some(s @ (1 | 2 | 4 | 8)) => Type::Int {
                        bits: (s * 8) as u8,
                        signed,
                    },
                    _ => opaque(name, size),
                }
            }
            gimli::DW_TAG_enumeration_type => {
                let signed = inner(self, walk, depth, None).is_signed();
                match size {
                    Some(s @ (1 | 2 | 4 | 8)) => Type::Int {
                        bits: (s * 8) as u8,
                        signed,
                    },
                    _ => opaque(name, size),
                }
            }
            gimli::DW_TAG_pointer_type
            | gimli::DW_TAG_reference_type
            | gimli::DW_TAG_rvalue_reference_type
            | gimli::DW_TAG_ptr_to_member_type => {
                if depth >= MAX_DEPTH {
                    return Type::Ptr(Box::new(Type::Void));
                }
                Type::Ptr(Box::new(inner(self, walk, depth + 1, None)))
            }
            gimli::DW_TAG_typedef => inner(self, walk, depth, name.as_deref()),
            gimli::DW_TAG_const_type
            | gimli::DW_TAG_volatile_type
            | gimli::DW_TAG_restrict_type
            | gimli::DW_TAG_atomic_type => inner(self, walk, depth, typedef_name),
            gimli::DW_TAG_structure_type | gimli::DW_TAG_class_type | gimli::DW_TAG_union_type => {
                let name = name.or_else(|| typedef_name.map(str::to_string));
                let declaration = matches!(e.attr_value(gimli::DW_AT_declaration), Ok(Some(_)));
                if declaration || depth >= MAX_DEPTH || walk.expanding.contains(&die) {
                    return opaque(name, size);
                }
                walk.expanding.push(die);
                let fields = self.members(die, depth, walk);
                walk.expanding.pop();
                Type::CStruct(CStruct {
                    name: name.unwrap_or_else(|| "(anonymous)".into()),
                    size: size.unwrap_or(0).min(u64::from(u32::MAX)) as u32,
                    fields: fields.into(),
                })
            }
            gimli::DW_TAG_array_type => {
                let mut dims = self.array_dims(die);
                // `char name[N]` is a string of N bytes, as bpftrace types it (the last
                // dimension of `char names[4][16]`: an array of strings).
                let plain_char = self
                    .reference(ui, &e, gimli::DW_AT_type)
                    .is_some_and(|t| self.is_plain_char(t, 0));
                let elem = match dims.last() {
                    Some(&n) if plain_char && n > 0 => {
                        dims.pop();
                        Type::Str {
                            cap: n.min(u64::from(u32::MAX)) as u32,
                        }
                    }
                    _ => inner(self, walk, depth + 1, None),
                };
                if dims.is_empty() {
                    return elem;
                }
                build_array(elem, &dims, walk.element_fields)
            }
            _ => Type::Void,
        }
    }

    /// Whether a type DIE is C's plain `char` (through typedefs and qualifiers);
    /// `signed char` and `unsigned char` (`int8_t`, `uint8_t`) are not.
    fn is_plain_char(&self, die: DieRef, hops: u32) -> bool {
        let (ui, off) = die;
        let Ok(e) = self.units[ui].unit.entry(off) else {
            return false;
        };
        match e.tag() {
            gimli::DW_TAG_base_type => {
                self.string_attr(ui, &e, gimli::DW_AT_name).as_deref() == Some("char")
            }
            gimli::DW_TAG_typedef
            | gimli::DW_TAG_const_type
            | gimli::DW_TAG_volatile_type
            | gimli::DW_TAG_restrict_type
            | gimli::DW_TAG_atomic_type
                if hops < 16 =>
            {
                self.reference(ui, &e, gimli::DW_AT_type)
                    .is_some_and(|t| self.is_plain_char(t, hops + 1))
            }
            _ => false,
        }
    }

    /// The data members of a struct or union DIE (anonymous members lifted).
    fn members(&self, die: DieRef, depth: u32, walk: &mut Walk) -> Vec<CField> {
        let (ui, off) = die;
        let unit = &self.units[ui].unit;
        let Ok(mut tree) = unit.entries_tree(Some(off)) else {
            return Vec::new();
        };
        let Ok(root) = tree.root() else {
            return Vec::new();
        };
        let mut children = root.children();
        let mut fields = Vec::new();
        while let Ok(Some(child)) = children.next() {
            let m = child.entry();
            if m.tag() != gimli::DW_TAG_member {
                continue;
            }
            let is_static = matches!(m.attr_value(gimli::DW_AT_external), Ok(Some(_)))
                || matches!(m.attr_value(gimli::DW_AT_declaration), Ok(Some(_)));
            if is_static || m.attr_value(gimli::DW_AT_bit_size).ok().flatten().is_some() {
                continue;
            }
            let offset = member_offset(m).unwrap_or(0);
            let Some(t) = self.reference(ui, m, gimli::DW_AT_type) else {
                continue;
            };
            let ty = self.type_of(t, depth + 1, walk, None);
            match self.string_attr(ui, m, gimli::DW_AT_name) {
                Some(name) => fields.push(CField {
                    name,
                    offset: offset as u32,
                    ty,
                    bits: None,
                }),
                None => {
                    if let Type::CStruct(inner) = ty {
                        for f in inner.fields.iter() {
                            fields.push(CField {
                                offset: f.offset + offset as u32,
                                ..f.clone()
                            });
                        }
                    }
                }
            }
        }
        fields
    }

    /// Element counts of an array DIE's dimensions (0 for an unknown bound).
    fn array_dims(&self, die: DieRef) -> Vec<u64> {
        let (ui, off) = die;
        let Ok(mut tree) = self.units[ui].unit.entries_tree(Some(off)) else {
            return Vec::new();
        };
        let Ok(root) = tree.root() else {
            return Vec::new();
        };
        let mut children = root.children();
        let mut dims = Vec::new();
        while let Ok(Some(child)) = children.next() {
            let s = child.entry();
            if s.tag() != gimli::DW_TAG_subrange_type {
                continue;
            }
            let count = self
                .udata(s, gimli::DW_AT_count)
                .or_else(|| {
                    let upper = self.udata(s, gimli::DW_AT_upper_bound)?;
                    let lower = self.udata(s, gimli::DW_AT_lower_bound).unwrap_or(0);
                    (upper.checked_add(1)?).checked_sub(lower)
                })
                .unwrap_or(0);
            dims.push(count);
        }
        if dims.is_empty() {
            dims.push(0);
        }
        if dims.len() > 8 {
            // Absurdly many dimensions: one flat dimension of the same size.
            let total = dims.iter().fold(1u64, |a, &d| a.saturating_mul(d));
            dims = vec![total];
        }
        dims
    }
}

/// `DW_AT_data_member_location` as a constant, or as `DW_OP_plus_uconst N`.
fn member_offset(m: &DebuggingInformationEntry<'_, '_, R>) -> Option<u64> {
    match m.attr_value(gimli::DW_AT_data_member_location).ok()?? {
        AttributeValue::Exprloc(expr) => {
            let mut r = expr.0;
            if r.read_u8().ok()? != gimli::DW_OP_plus_uconst.0 {
                return None;
            }
            r.read_uleb128().ok()
        }
        v => v.udata_value(),
    }
}

/// An array type (outermost dimension first) as a `CStruct` of elements.
fn build_array(elem: Type, dims: &[u64], element_fields: bool) -> Type {
    let Some((&n, rest)) = dims.split_first() else {
        return elem;
    };
    let elem = build_array(elem, rest, element_fields);
    let elem_size = u64::from(elem.size());
    let size = elem_size.saturating_mul(n).min(u64::from(u32::MAX)) as u32;
    // C order: the outer dimension comes first (`int16[2][3]`).
    let elem_name = type_name(&elem);
    let name = match elem_name.find('[') {
        Some(i) if elem_name.ends_with(']') => {
            format!("{}[{n}]{}", &elem_name[..i], &elem_name[i..])
        }
        _ => format!("{elem_name}[{n}]"),
    };
    // Expand only small arrays (counting the elements of nested arrays too).
    let inner_count = match &elem {
        Type::CStruct(s) if s.name.ends_with(']') => s.fields.len().max(1) as u64,
        _ => 1,
    };
    let fields = if n.saturating_mul(inner_count) <= MAX_ARRAY_FIELDS {
        (0..n)
            .map(|i| CField {
                name: format!("[{i}]"),
                offset: (i * elem_size) as u32,
                ty: elem.clone(),
                bits: None,
            })
            .collect()
    } else if element_fields {
        vec![CField {
            name: ARRAY_ELEMENT.to_string(),
            offset: 0,
            ty: elem.clone(),
            bits: None,
        }]
    } else {
        Vec::new()
    };
    Type::CStruct(CStruct {
        name,
        size,
        fields: fields.into(),
    })
}

fn type_name(t: &Type) -> String {
    match t {
        Type::CStruct(s) => s.name.clone(),
        other => other.to_string(),
    }
}
