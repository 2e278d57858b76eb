//! Lowering: the checked tree to a [`weft_ir::Program`], following the machine model
//! documented in `weft-ir`: scalars in registers, everything else in frame slots laid
//! out by `Type::size/align/field_offsets`, explicit labels, bounded loops.
//!
//! Scratch variables get a register (scalars) or a slot of their own, zeroed at
//! probe entry. Temporaries live in slots that are reused after each statement.

use std::collections::HashMap;

use weft_ir::{
    self as ir, AggOp, BinOp as IrBin, CtxValue, EventKind, FmtId, Format, Function, Inst, Label,
    MapDecl, MapId, MapValue, Place, Reg, Slot, Type, UnOp as IrUn,
};

use crate::ast::*;
use crate::check::{
    machine_reg, signal_number, storage, Checked, NamedValue, ProbeInfo, RegSource, CALLER_CAP,
    COMM_CAP,
};
use crate::diag::{Diagnostic, Diags};
use crate::{EventField, EventFieldShape};

/// Number of array elements `join()` reads.
pub const JOIN_MAX: u32 = 16;

/// The most bytes of memory read with inline loads; a larger value (a whole struct)
/// is copied by one helper call.
const INLINE_READ_MAX: u32 = 64;

pub fn lower(ck: &Checked) -> (ir::Program, Vec<Diagnostic>) {
    let mut prog = ir::Program {
        maps: ck
            .maps
            .iter()
            .map(|m| MapDecl {
                name: m.name.clone(),
                key: m.key.clone(),
                value: m.value.clone(),
            })
            .collect(),
        config: ck.config.clone(),
        ..Default::default()
    };
    let mut diags = Diags::default();
    // The source of each probe of `prog`, for errors found once all are lowered.
    let mut spans = Vec::new();
    let probes = ck.program.items.iter().filter_map(|i| match i {
        Item::Probe(p) => Some(p),
        _ => None,
    });
    for (p, info) in probes.zip(&ck.probes) {
        prog.probe_names.extend(info.names.iter().cloned());
        // A probe that reads a tracepoint's record is lowered once per tracepoint:
        // each has its own layout.
        let bodies: Vec<(Vec<ir::AttachPoint>, Option<&[EventField]>)> = if info.events.is_empty() {
            vec![(info.attach.clone(), None)]
        } else {
            info.attach
                .iter()
                .zip(&info.events)
                .map(|(a, e)| (vec![a.clone()], Some(&e[..])))
                .collect()
        };
        for (attach, event) in bodies {
            lower_probe(ck, p, info, attach, event, &mut prog, &mut diags);
            spans.push(p.attach.first().map(|a| a.span).unwrap_or(p.span));
        }
    }
    bind_watched_maps(&mut prog);
    if diags.list.is_empty() {
        check_kernel_probes(&prog, &spans, &mut diags);
    }
    (prog, diags.list)
}

/// After each store to a map that a `set:addr(@map, N)` pointcut watches, advice
/// running in the target waits until weft has armed the watch at the address
/// stored ([`CtxValue::WatchBind`]): an access right after the store (the
/// object's first initialisation, as Arachne's alias pointcuts see it) is not
/// missed. BEGIN, END and interval probes run in weft, which arms the watch
/// before the target goes on.
fn bind_watched_maps(prog: &mut ir::Program) {
    let bound: Vec<u32> = prog
        .probes
        .iter()
        .flat_map(|p| &p.attach)
        .filter_map(|a| match a {
            ir::AttachPoint::Data {
                place: ir::DataPlace::Map { map, .. },
                ..
            } => prog.maps.iter().position(|m| &m.name == map),
            _ => None,
        })
        .map(|i| i as u32)
        .collect();
    if bound.is_empty() {
        return;
    }
    for p in &mut prog.probes {
        if !p.attach.iter().all(ir::AttachPoint::runs_in_target) {
            continue;
        }
        let code = std::mem::take(&mut p.body.code);
        for inst in code {
            let binds = matches!(&inst, Inst::MapStore { map, .. } if bound.contains(&map.0));
            p.body.code.push(inst);
            if binds {
                let dst = p.body.new_reg();
                p.body.code.push(Inst::Ctx {
                    dst,
                    value: CtxValue::WatchBind,
                });
            }
        }
    }
}

/// Kernel probes run as eBPF: what the code generator cannot compile (or a map the
/// kernel cannot share with user space) is an error here, at the probe, before any
/// process or kernel is touched. The verifier's own verdict comes when weft loads
/// them.
fn check_kernel_probes(prog: &ir::Program, spans: &[Span], diags: &mut Diags) {
    let kernel: Vec<usize> = (0..prog.probes.len())
        .filter(|&i| {
            prog.probes[i]
                .attach
                .iter()
                .any(ir::AttachPoint::runs_in_kernel)
        })
        .collect();
    if kernel.is_empty() {
        return;
    }
    let user = match weft_bpf::user_maps_read(prog, &kernel) {
        Ok(u) => u,
        Err((i, msg)) => {
            diags.push(Diagnostic::error(spans[i], msg));
            return;
        }
    };
    for &i in &kernel {
        if let Err(e) = weft_bpf::check(prog, i, &user) {
            diags.push(
                Diagnostic::error(spans[i], format!("kernel probe: {e}"))
                    .with_help("kernel probes run as eBPF in the kernel; see the README's list"),
            );
        }
    }
}

fn lower_probe(
    ck: &Checked,
    p: &Probe,
    info: &ProbeInfo,
    attach: Vec<ir::AttachPoint>,
    event: Option<&[EventField]>,
    prog: &mut ir::Program,
    diags: &mut Diags,
) {
    {
        let observing = info.around.then(|| observing(&p.body)).flatten();
        let as_entry = observing.is_some();
        let mut fx = Fx {
            ck,
            observing,
            formats: &mut prog.formats,
            f: Function::default(),
            info,
            event,
            vars: HashMap::new(),
            loops: Vec::new(),
            temps_used: Vec::new(),
            temps_free: Vec::new(),
        };
        fx.probe(p);
        let f = fx.f;
        let frame = f.frame_size();
        if frame > ck.config.max_frame {
            // frame_size saturates at u32::MAX.
            let needs = if frame == u32::MAX {
                format!("more than {frame}")
            } else {
                frame.to_string()
            };
            diags.push(
                Diagnostic::error(
                    p.attach.first().map(|a| a.span).unwrap_or(p.span),
                    format!(
                        "this probe needs {needs} bytes of stack frame; the limit is {}",
                        ck.config.max_frame
                    ),
                )
                .with_help(
                    "use smaller strings (config max_strlen, str(p, n)) or fewer large values",
                ),
            );
        }
        prog.probes.push(ir::Probe {
            attach,
            body: f,
            hidden: p.hidden,
            around: info.around && !as_entry,
            system: false,
        });
    }
}

/// Around advice woven as entry advice: what runs before the final proceed, and the
/// arguments that proceed passes (none: the caller's, untouched).
#[derive(Clone, Debug)]
struct Observing {
    /// The statements before the final proceed.
    keep: usize,
    /// `proceed(E0, E1, ...)`'s arguments: the function's first ones become them.
    args: Vec<Expr>,
}

/// Around advice that runs only before the call: it ends by proceeding and handing
/// back the result (`...; return proceed();`, `...; proceed(arg0 + 1);`, `...; $r =
/// proceed(); return $r;`), and neither proceeds nor returns anywhere else. Such
/// advice is entry advice that runs before the function — setting the arguments
/// the final proceed passes (at most the six in registers) — and is woven as such
/// (inline and at a few nanoseconds when simple enough).
fn observing(body: &Block) -> Option<Observing> {
    struct Count(usize);
    impl VisitMut for Count {
        fn expr(&mut self, e: &mut Expr) {
            if matches!(&e.kind, ExprKind::Call { name, .. } if name == "proceed") {
                self.0 += 1;
            }
            walk_expr(self, e);
        }
        fn block(&mut self, b: &mut Block) {
            self.0 += b
                .stmts
                .iter()
                .filter(|s| matches!(s.kind, StmtKind::Return(_)))
                .count();
            walk_block(self, b);
        }
    }
    let proceeding = |e: &Expr| match &e.kind {
        ExprKind::Call { name, args, .. } if name == "proceed" && args.len() <= 6 => {
            Some(args.clone())
        }
        _ => None,
    };
    if body.value.is_some() {
        return None;
    }
    let n = body.stmts.len();
    let (keep, args) = match &body.stmts.last()?.kind {
        StmtKind::Return(Some(e)) | StmtKind::Expr(e) if proceeding(e).is_some() => {
            (n - 1, proceeding(e)?)
        }
        StmtKind::Return(Some(Expr {
            kind: ExprKind::Var(r),
            ..
        })) if n >= 2 => match &body.stmts[n - 2].kind {
            StmtKind::Assign {
                target: LValue::Var(v),
                op: None,
                value,
            } if v.id == r.id && v.id.is_some() => (n - 2, proceeding(value)?),
            _ => return None,
        },
        _ => return None,
    };
    let mut rest = Block {
        stmts: body.stmts[..keep].to_vec(),
        value: None,
        span: body.span,
    };
    let mut c = Count(0);
    c.block(&mut rest);
    for a in &args {
        c.expr(&mut a.clone());
    }
    (c.0 == 0).then_some(Observing { keep, args })
}

/// Where a value is: a register (scalars), a place (everything else), or nothing.
#[derive(Clone, Copy, Debug)]
enum Val {
    Reg(Reg),
    Place(Place),
    Unit,
}

struct Fx<'a> {
    ck: &'a Checked,
    /// Around advice lowered as entry advice ([`observing`]).
    observing: Option<Observing>,
    formats: &'a mut Vec<Format>,
    f: Function,
    info: &'a ProbeInfo,
    /// The record layout of the tracepoint this body is lowered for, when it reads
    /// `args`.
    event: Option<&'a [EventField]>,
    vars: HashMap<u32, Val>,
    /// (continue target, break target) of the enclosing loops.
    loops: Vec<(Label, Label)>,
    temps_used: Vec<(Slot, u32)>,
    temps_free: Vec<(Slot, u32)>,
}

fn int_size(t: &Type) -> u8 {
    t.size().clamp(1, 8) as u8
}

impl<'a> Fx<'a> {
    // ---- plumbing ---------------------------------------------------------------

    fn emit(&mut self, i: Inst) {
        self.f.push(i);
    }
    fn reg(&mut self) -> Reg {
        self.f.new_reg()
    }
    fn label(&mut self) -> Label {
        self.f.new_label()
    }
    fn konst(&mut self, v: i64) -> Reg {
        let r = self.reg();
        self.emit(Inst::Const { dst: r, value: v });
        r
    }
    fn bin(&mut self, op: IrBin, a: Reg, b: Reg) -> Reg {
        let d = self.reg();
        self.emit(Inst::Binary { op, dst: d, a, b });
        d
    }
    /// A temporary slot of at least `size` bytes, free again after the statement.
    fn temp(&mut self, size: u32) -> Place {
        // Saturating: sizes saturate at u32::MAX (refused by the frame limit).
        let size = size.max(1).div_ceil(8).saturating_mul(8);
        let slot = match self.temps_free.iter().position(|(_, s)| *s == size) {
            Some(i) => self.temps_free.swap_remove(i).0,
            None => self.f.new_slot(size),
        };
        self.temps_used.push((slot, size));
        Place::new(slot, 0)
    }
    fn mark(&self) -> usize {
        self.temps_used.len()
    }
    fn release(&mut self, mark: usize) {
        let freed: Vec<(Slot, u32)> = self.temps_used.drain(mark..).collect();
        self.temps_free.extend(freed);
    }
    fn format(&mut self, text: String, args: Vec<Type>) -> FmtId {
        self.format_message(text, args, None)
    }
    fn format_message(
        &mut self,
        text: String,
        args: Vec<Type>,
        message: Option<ir::Message>,
    ) -> FmtId {
        let fm = Format {
            message,
            ..Format::new(text, args)
        };
        if let Some(i) = self.formats.iter().position(|f| *f == fm) {
            return FmtId(i as u32);
        }
        self.formats.push(fm);
        FmtId(self.formats.len() as u32 - 1)
    }
    fn map_id(&self, name: &str) -> MapId {
        MapId(self.ck.map_id(name).expect("checked map"))
    }
    fn map_info(&self, name: &str) -> &'a crate::check::MapInfo {
        let ck: &'a Checked = self.ck;
        &ck.maps[ck.map_id(name).expect("checked map") as usize]
    }
    fn reg_of(&mut self, v: Val) -> Reg {
        match v {
            Val::Reg(r) => r,
            // Not expected after a successful check; keep the code well-formed.
            _ => self.konst(0),
        }
    }
    fn place_of(&mut self, v: Val, ty: &Type) -> Place {
        match v {
            Val::Place(p) => p,
            // A struct or array held by its address: its bytes, copied.
            Val::Reg(addr) if matches!(ty, Type::CStruct(_)) => {
                let p = self.temp(ty.size());
                self.read_bytes(addr, p, ty.size());
                p
            }
            Val::Reg(r) => {
                let p = self.temp(ty.size().max(8));
                self.emit(Inst::Store {
                    place: p,
                    src: r,
                    size: int_size(ty),
                });
                p
            }
            Val::Unit => {
                let p = self.temp(ty.size());
                self.emit(Inst::Zero {
                    place: p,
                    len: ty.size(),
                });
                p
            }
        }
    }

    /// Store a value of type `ty` at `place`.
    fn store(&mut self, place: Place, v: Val, ty: &Type) {
        if ty.is_scalar() {
            let r = self.reg_of(v);
            self.emit(Inst::Store {
                place,
                src: r,
                size: int_size(ty),
            });
        } else if ty.size() > 0 {
            match v {
                Val::Place(p) if p == place => {}
                Val::Reg(addr) if matches!(ty, Type::CStruct(_)) => {
                    self.read_bytes(addr, place, ty.size())
                }
                Val::Place(p) => self.emit(Inst::Copy {
                    dst: place,
                    src: p,
                    len: ty.size(),
                }),
                _ => self.emit(Inst::Zero {
                    place,
                    len: ty.size(),
                }),
            }
        }
    }

    /// Read a value of type `ty` stored at `place`.
    fn load(&mut self, place: Place, ty: &Type) -> Val {
        if ty.is_scalar() {
            let d = self.reg();
            self.emit(Inst::LoadSlot {
                dst: d,
                place,
                size: int_size(ty),
                signed: ty.is_signed(),
            });
            Val::Reg(d)
        } else {
            Val::Place(place)
        }
    }

    /// Convert a value from one type to another (integer widths, string and
    /// buffer capacities, tuples field by field).
    fn convert(&mut self, v: Val, from: &Type, to: &Type) -> Val {
        if from == to || matches!(v, Val::Unit) {
            return v;
        }
        match (from, to) {
            (_, Type::Int { bits, signed }) if from.is_scalar() => {
                let r = self.reg_of(v);
                if *bits >= 64 {
                    return Val::Reg(r);
                }
                let d = self.reg();
                self.emit(Inst::Extend {
                    dst: d,
                    src: r,
                    bits: *bits,
                    signed: *signed,
                });
                Val::Reg(d)
            }
            (_, Type::Bool) if from.is_scalar() => {
                let r = self.reg_of(v);
                if *from == Type::Bool {
                    return Val::Reg(r);
                }
                let z = self.konst(0);
                Val::Reg(self.bin(IrBin::Ne, r, z))
            }
            (_, _) if from.is_scalar() && to.is_scalar() => v,
            // Not empty: its first byte is not NUL.
            (Type::Str { .. }, Type::Bool) => {
                let src = self.place_of(v, from);
                let first = self.load(
                    src,
                    &Type::Int {
                        bits: 8,
                        signed: false,
                    },
                );
                let r = self.reg_of(first);
                let z = self.konst(0);
                Val::Reg(self.bin(IrBin::Ne, r, z))
            }
            (Type::Str { cap: a }, Type::Str { cap: b }) => {
                let src = self.place_of(v, from);
                let dst = self.temp(*b);
                self.emit(Inst::Zero {
                    place: dst,
                    len: *b,
                });
                let n = (*a).min(*b - 1);
                if n > 0 {
                    self.emit(Inst::Copy { dst, src, len: n });
                }
                Val::Place(dst)
            }
            (Type::Buf { cap: a }, Type::Buf { cap: b }) => {
                let src = self.place_of(v, from);
                let dst = self.temp(4 + *b);
                self.emit(Inst::Zero {
                    place: dst,
                    len: 4 + *b,
                });
                let n = (*a).min(*b);
                self.emit(Inst::Copy {
                    dst,
                    src,
                    len: 4 + n,
                });
                if a > b {
                    let len = self.load(
                        src,
                        &Type::Int {
                            bits: 32,
                            signed: false,
                        },
                    );
                    let len = self.reg_of(len);
                    let capr = self.konst(i64::from(*b));
                    // len = min(len, cap)
                    let gt = self.bin(IrBin::GtU, len, capr);
                    let (l1, l2) = (self.label(), self.label());
                    self.emit(Inst::Branch {
                        cond: gt,
                        if_true: l1,
                        if_false: l2,
                    });
                    self.emit(Inst::Label(l1));
                    self.emit(Inst::Store {
                        place: dst,
                        src: capr,
                        size: 4,
                    });
                    self.emit(Inst::Label(l2));
                }
                Val::Place(dst)
            }
            (Type::Tuple(_) | Type::Record(_), Type::Tuple(_) | Type::Record(_)) => {
                let fs = field_types(from);
                let ts = field_types(to);
                if fs.len() != ts.len() {
                    return v;
                }
                let src = self.place_of(v, from);
                let dst = self.temp(to.size());
                self.emit(Inst::Zero {
                    place: dst,
                    len: to.size(),
                });
                let (so, dof) = (from.field_offsets(), to.field_offsets());
                for i in 0..fs.len() {
                    let x = self.load(src.at(so[i]), &fs[i]);
                    let x = self.convert(x, &fs[i], &ts[i]);
                    self.store(dst.at(dof[i]), x, &ts[i]);
                }
                Val::Place(dst)
            }
            // Array casts: an integer's bytes as an integer array, and back.
            (_, Type::CStruct(_)) if from.is_scalar() => {
                let r = self.reg_of(v);
                let dst = self.temp(to.size());
                self.emit(Inst::Store {
                    place: dst,
                    src: r,
                    size: to.size().clamp(1, 8) as u8,
                });
                Val::Place(dst)
            }
            (Type::CStruct(_), Type::Int { signed, .. }) => {
                let src = self.place_of(v, from);
                let d = self.reg();
                self.emit(Inst::LoadSlot {
                    dst: d,
                    place: src,
                    size: int_size(to),
                    signed: *signed,
                });
                Val::Reg(d)
            }
            (Type::UStack { .. }, Type::UStack { .. }) => {
                let src = self.place_of(v, from);
                let dst = self.temp(to.size());
                self.emit(Inst::Zero {
                    place: dst,
                    len: to.size(),
                });
                self.emit(Inst::Copy {
                    dst,
                    src,
                    len: from.size().min(to.size()),
                });
                Val::Place(dst)
            }
            _ => v,
        }
    }

    // ---- probe ------------------------------------------------------------------

    fn probe(&mut self, p: &Probe) {
        // Variables: a register or a zeroed slot each.
        for (id, t) in self.info.vars.iter().enumerate() {
            let v = if t.is_scalar() {
                Val::Reg(self.konst(0))
            } else {
                let slot = self.f.new_slot(t.size().max(1));
                let place = Place::new(slot, 0);
                self.emit(Inst::Zero {
                    place,
                    len: t.size().max(1),
                });
                Val::Place(place)
            };
            self.vars.insert(id as u32, v);
        }
        let exit = self.label();
        if let Some(pred) = &p.predicate {
            let m = self.mark();
            let c = self.cond(pred);
            self.release(m);
            let body = self.label();
            self.emit(Inst::Branch {
                cond: c,
                if_true: body,
                if_false: exit,
            });
            self.emit(Inst::Label(body));
        }
        match self.observing.clone() {
            // The body up to the final proceed, as entry advice; then the arguments
            // that proceed passes, all evaluated before any is set.
            Some(Observing { keep, args }) => {
                for s in &p.body.stmts[..keep] {
                    let m = self.mark();
                    self.stmt(s);
                    self.release(m);
                }
                let values = self.regs_of(&args);
                for (index, value) in values.into_iter().enumerate() {
                    self.emit(Inst::SetArg {
                        index: index as u8,
                        value,
                    });
                }
            }
            None => {
                if self.info.around {
                    self.emit(Inst::AroundEnter);
                }
                self.block(&p.body);
            }
        }
        self.emit(Inst::Label(exit));
        self.emit(Inst::Return);
    }

    /// Each expression evaluated, in order, into a register.
    fn regs_of(&mut self, exprs: &[Expr]) -> Vec<Reg> {
        exprs
            .iter()
            .map(|e| {
                let v = self.expr(e);
                self.reg_of(v)
            })
            .collect()
    }

    fn block(&mut self, b: &Block) -> Val {
        for s in &b.stmts {
            let m = self.mark();
            self.stmt(s);
            self.release(m);
        }
        match &b.value {
            Some(v) => self.expr(v),
            None => Val::Unit,
        }
    }

    /// A condition as a 0/1-or-nonzero register.
    fn cond(&mut self, e: &Expr) -> Reg {
        let v = self.expr(e);
        self.reg_of(v)
    }

    fn var_type(&self, v: &VarRef) -> Type {
        v.id.and_then(|i| self.info.vars.get(i as usize).cloned())
            .unwrap_or(Type::I64)
    }

    fn set_var(&mut self, v: &VarRef, val: Val, ty: &Type) {
        let vt = self.var_type(v);
        let val = self.convert(val, ty, &vt);
        match v.id.and_then(|i| self.vars.get(&i).copied()) {
            Some(Val::Reg(r)) => {
                let s = self.reg_of(val);
                self.emit(Inst::Mov { dst: r, src: s });
            }
            Some(Val::Place(p)) => self.store(p, val, &vt),
            _ => {}
        }
    }

    fn stmt(&mut self, s: &Stmt) {
        match &s.kind {
            StmtKind::Expr(e) => {
                self.expr(e);
            }
            StmtKind::Assign { target, op, value } => self.assign(target, *op, value),
            StmtKind::Let { var, value, .. } => match value {
                Some(v) => {
                    let x = self.expr(v);
                    self.set_var(var, x, &v.ty);
                }
                None => {
                    let vt = self.var_type(var);
                    let zero = if vt.is_scalar() {
                        Val::Reg(self.konst(0))
                    } else {
                        Val::Unit
                    };
                    self.set_var(var, zero, &vt);
                }
            },
            StmtKind::If {
                cond,
                then,
                otherwise,
            } => {
                let c = self.cond(cond);
                let (lt, le, lend) = (self.label(), self.label(), self.label());
                self.emit(Inst::Branch {
                    cond: c,
                    if_true: lt,
                    if_false: le,
                });
                self.emit(Inst::Label(lt));
                self.block(then);
                self.emit(Inst::Jump(lend));
                self.emit(Inst::Label(le));
                if let Some(o) = otherwise {
                    self.block(o);
                }
                self.emit(Inst::Label(lend));
            }
            StmtKind::Unroll { count, body } => {
                let n = match count.kind {
                    ExprKind::Int(n) => n.min(100),
                    _ => 1,
                };
                for _ in 0..n {
                    self.block(body);
                }
            }
            StmtKind::While { cond, body } => {
                let (lcond, lbody, lend) = (self.label(), self.label(), self.label());
                let counter = self.konst(0);
                self.emit(Inst::Label(lcond));
                let m = self.mark();
                let c = self.cond(cond);
                self.release(m);
                self.emit(Inst::Branch {
                    cond: c,
                    if_true: lbody,
                    if_false: lend,
                });
                self.emit(Inst::Label(lbody));
                self.loop_bound(counter, lend);
                self.loops.push((lcond, lend));
                self.block(body);
                self.loops.pop();
                self.emit(Inst::Jump(lcond));
                self.emit(Inst::Label(lend));
            }
            StmtKind::For { var, iter, body } => match iter {
                ForIter::Range(a, b) => {
                    let va = self.expr(a);
                    let start = self.reg_of(va);
                    let i = self.reg();
                    self.emit(Inst::Mov { dst: i, src: start });
                    let vb = self.expr(b);
                    let end = self.reg_of(vb);
                    let signed = sgn(&a.ty) && sgn(&b.ty);
                    let (lcond, lbody, lnext, lend) =
                        (self.label(), self.label(), self.label(), self.label());
                    let counter = self.konst(0);
                    self.emit(Inst::Label(lcond));
                    let lt = self.bin(if signed { IrBin::LtS } else { IrBin::LtU }, i, end);
                    self.emit(Inst::Branch {
                        cond: lt,
                        if_true: lbody,
                        if_false: lend,
                    });
                    self.emit(Inst::Label(lbody));
                    self.loop_bound(counter, lend);
                    let vt = self.var_type(var);
                    self.set_var(var, Val::Reg(i), &vt);
                    self.loops.push((lnext, lend));
                    self.block(body);
                    self.loops.pop();
                    self.emit(Inst::Label(lnext));
                    let one = self.konst(1);
                    self.emit(Inst::Binary {
                        op: IrBin::Add,
                        dst: i,
                        a: i,
                        b: one,
                    });
                    self.emit(Inst::Jump(lcond));
                    self.emit(Inst::Label(lend));
                }
                ForIter::Map(m) => {
                    let map = self.map_id(&m.name);
                    let info = self.map_info(&m.name);
                    let vt = self.var_type(var);
                    let (kt, valt) = match &vt {
                        Type::Tuple(ts) if ts.len() == 2 => (ts[0].clone(), ts[1].clone()),
                        _ => return,
                    };
                    let offs = vt.field_offsets();
                    let stored_val = match &info.value {
                        MapValue::Plain(t) => t.clone(),
                        MapValue::Count => Type::U64,
                        _ => valt.clone(),
                    };
                    let it = self.reg();
                    self.emit(Inst::MapIterStart { it, map });
                    let (lnext, lbody, lend) = (self.label(), self.label(), self.label());
                    let counter = self.konst(0);
                    let kv = self.temp(vt.size());
                    self.emit(Inst::Label(lnext));
                    let found = self.reg();
                    let key_t = info.key.clone().unwrap_or(Type::U64);
                    let key_place = self.temp(key_t.size());
                    let (dst_reg, dst_place) = if stored_val.is_scalar() {
                        (Some(self.reg()), None)
                    } else {
                        (None, Some(self.temp(stored_val.size())))
                    };
                    self.emit(Inst::MapIterNext {
                        found,
                        it,
                        map,
                        key: Some(key_place),
                        dst_reg,
                        dst_place,
                    });
                    self.emit(Inst::Branch {
                        cond: found,
                        if_true: lbody,
                        if_false: lend,
                    });
                    self.emit(Inst::Label(lbody));
                    self.loop_bound(counter, lend);
                    self.emit(Inst::Zero {
                        place: kv,
                        len: vt.size(),
                    });
                    let k = self.load(key_place, &key_t);
                    let k = self.convert(k, &key_t, &kt);
                    self.store(kv.at(offs[0]), k, &kt);
                    let v = match (dst_reg, dst_place) {
                        (Some(r), _) => Val::Reg(r),
                        (_, Some(p)) => Val::Place(p),
                        _ => Val::Unit,
                    };
                    let v = self.convert(v, &stored_val, &valt);
                    self.store(kv.at(offs[1]), v, &valt);
                    self.set_var(var, Val::Place(kv), &vt);
                    self.loops.push((lnext, lend));
                    self.block(body);
                    self.loops.pop();
                    self.emit(Inst::Jump(lnext));
                    self.emit(Inst::Label(lend));
                }
            },
            StmtKind::Break | StmtKind::Continue => {
                if let Some(&(c, b)) = self.loops.last() {
                    let to = if matches!(s.kind, StmtKind::Break) {
                        b
                    } else {
                        c
                    };
                    self.emit(Inst::Jump(to));
                    // Code after the jump is unreachable but stays well-formed.
                    let l = self.label();
                    self.emit(Inst::Label(l));
                }
            }
            StmtKind::Return(v) => {
                if let Some(v) = v {
                    let v = self.expr(v);
                    if self.info.around && self.observing.is_none() {
                        let value = self.reg_of(v);
                        self.emit(Inst::AroundReturn { value });
                    }
                }
                self.emit(Inst::Return);
                // Code after `return` is unreachable but must stay well-formed.
                let l = self.label();
                self.emit(Inst::Label(l));
            }
            StmtKind::Block(b) => {
                self.block(b);
            }
        }
    }

    /// Count an iteration; at the bound, count a LoopBound error and leave.
    fn loop_bound(&mut self, counter: Reg, lend: Label) {
        let max = self.konst(i64::from(self.ck.config.max_loop_iterations));
        let hit = self.bin(IrBin::GeU, counter, max);
        let (lhit, lok) = (self.label(), self.label());
        self.emit(Inst::Branch {
            cond: hit,
            if_true: lhit,
            if_false: lok,
        });
        self.emit(Inst::Label(lhit));
        self.emit(Inst::CountError(ir::ErrorKind::LoopBound));
        self.emit(Inst::Jump(lend));
        self.emit(Inst::Label(lok));
        let one = self.konst(1);
        self.emit(Inst::Binary {
            op: IrBin::Add,
            dst: counter,
            a: counter,
            b: one,
        });
    }

    fn assign(&mut self, target: &LValue, op: Option<BinOp>, value: &Expr) {
        match target {
            LValue::Var(v) => {
                let x = self.expr(value);
                match op {
                    None => self.set_var(v, x, &value.ty),
                    Some(op) => {
                        let vt = self.var_type(v);
                        let cur = match v.id.and_then(|i| self.vars.get(&i).copied()) {
                            Some(Val::Reg(r)) => r,
                            _ => return,
                        };
                        let rx = self.reg_of(x);
                        if matches!(op, BinOp::Div | BinOp::Mod) && !is_nonzero_literal(value) {
                            self.warn_if_zero(rx, value.span);
                        }
                        let r = self.arith(op, cur, rx, &vt, &value.ty);
                        let rt = arith_type(&vt, &value.ty);
                        self.set_var(v, Val::Reg(r), &rt);
                    }
                }
            }
            LValue::Map(m) => {
                let map = self.map_id(&m.name);
                let info = self.map_info(&m.name);
                if info.value.is_aggregation() {
                    if let ExprKind::Call { name, args, .. } = &value.kind {
                        let key = self.map_key(info, m.keys.as_deref());
                        let arg = match args.first() {
                            Some(a) => {
                                let x = self.expr(a);
                                let x = self.convert(x, &a.ty, &storage(&a.ty));
                                Some(self.reg_of(x))
                            }
                            None => None,
                        };
                        // Every value has its power-of-two bucket, past 2^32 too (as
                        // upstream bpftrace; 0.17 put those in `[2G, 4G)`).
                        let r = arg.unwrap_or(Reg(0));
                        let op = match name.as_str() {
                            "count" => AggOp::Count,
                            "sum" => AggOp::Sum(r),
                            "min" => AggOp::Min(r),
                            "max" => AggOp::Max(r),
                            "avg" => AggOp::Avg(r),
                            "stats" => AggOp::Stats(r),
                            "hist" => AggOp::Hist(r),
                            "lhist" => AggOp::Lhist(r),
                            "tseries" => AggOp::Tseries(r),
                            _ => return,
                        };
                        if arg.is_none() && op != AggOp::Count {
                            return;
                        }
                        self.emit(Inst::MapAgg { map, key, op });
                    }
                    return;
                }
                let MapValue::Plain(vt) = &info.value else {
                    return;
                };
                let x = self.expr(value);
                let key = self.map_key(info, m.keys.as_deref());
                let (x, xt) = match op {
                    None => (x, value.ty.clone()),
                    Some(op) => {
                        let cur = self.reg();
                        self.emit(Inst::MapLoad {
                            map,
                            key,
                            dst_reg: Some(cur),
                            dst_place: None,
                        });
                        let rx = self.reg_of(x);
                        if matches!(op, BinOp::Div | BinOp::Mod) && !is_nonzero_literal(value) {
                            self.warn_if_zero(rx, value.span);
                        }
                        let r = self.arith(op, cur, rx, vt, &value.ty);
                        (Val::Reg(r), arith_type(vt, &value.ty))
                    }
                };
                self.map_store(map, key, x, &xt, vt);
            }
        }
    }

    fn map_store(&mut self, map: MapId, key: Option<Place>, x: Val, xt: &Type, vt: &Type) {
        let x = self.convert(x, xt, vt);
        if vt.is_scalar() {
            let r = self.reg_of(x);
            self.emit(Inst::MapStore {
                map,
                key,
                src_reg: Some(r),
                src_place: None,
            });
        } else {
            let p = self.place_of(x, vt);
            self.emit(Inst::MapStore {
                map,
                key,
                src_reg: None,
                src_place: Some(p),
            });
        }
    }

    /// Build a map key in a zeroed temporary (padding and string tails are zero, so
    /// keys compare bytewise).
    fn map_key(&mut self, info: &crate::check::MapInfo, keys: Option<&[Expr]>) -> Option<Place> {
        let kt = info.key.as_ref()?;
        let keys = keys?;
        let vals: Vec<(Val, Type)> = keys.iter().map(|k| (self.expr(k), k.ty.clone())).collect();
        // A key that is one `str()` of the key's own type is its NUL-padded
        // temporary as it is: no second zeroing and copy of up to 64+ bytes a hit.
        if let ([(Val::Place(p), t)], [k]) = (&vals[..], keys) {
            if t == kt && matches!(&k.kind, ExprKind::Call { name, .. } if name == "str") {
                return Some(*p);
            }
        }
        let place = self.temp(kt.size());
        self.emit(Inst::Zero {
            place,
            len: kt.size(),
        });
        if vals.len() == 1 {
            let (v, t) = vals[0].clone();
            let v = self.convert(v, &t, kt);
            self.store(place, v, kt);
        } else {
            let fts = field_types(kt);
            let offs = kt.field_offsets();
            for (i, (v, t)) in vals.into_iter().enumerate() {
                if i >= fts.len() {
                    break;
                }
                let v = self.convert(v, &t, &fts[i]);
                self.store(place.at(offs[i]), v, &fts[i]);
            }
        }
        Some(place)
    }

    // ---- expressions ------------------------------------------------------------

    fn ctx(&mut self, value: CtxValue) -> Val {
        let d = self.reg();
        self.emit(Inst::Ctx { dst: d, value });
        Val::Reg(d)
    }

    fn expr(&mut self, e: &Expr) -> Val {
        match &e.kind {
            ExprKind::Int(v) => Val::Reg(self.konst(*v as i64)),
            ExprKind::Bool(b) => Val::Reg(self.konst(i64::from(*b))),
            ExprKind::Str(s) => {
                let cap = e.ty.size().max(s.len() as u32 + 1);
                let p = self.temp(cap);
                self.emit(Inst::SetBytes {
                    place: p,
                    bytes: s.clone(),
                    len: cap,
                });
                Val::Place(p)
            }
            ExprKind::Positional(_) | ExprKind::PositionalCount => Val::Reg(self.konst(0)),
            ExprKind::Ident(name) => self.builtin(name, &e.ty),
            ExprKind::Var(v) => {
                let vt = self.var_type(v);
                let val = match v.id.and_then(|i| self.vars.get(&i).copied()) {
                    Some(Val::Reg(r)) => {
                        let d = self.reg();
                        self.emit(Inst::Mov { dst: d, src: r });
                        Val::Reg(d)
                    }
                    Some(other) => other,
                    None => return Val::Unit,
                };
                self.convert(val, &vt, &e.ty)
            }
            ExprKind::Map(m) => {
                let map = self.map_id(&m.name);
                let info = self.map_info(&m.name);
                let key = self.map_key(info, m.keys.as_deref());
                // `-k`: a read that finds no element warns, as upstream's does.
                if let Some(k) = key
                    .filter(|_| self.ck.helper_warnings && matches!(info.value, MapValue::Plain(_)))
                {
                    let has = self.reg();
                    self.emit(Inst::MapHasKey {
                        dst: has,
                        map,
                        key: k,
                    });
                    self.warn_if_zero_text(has, e.span, LOOKUP_MISSING_TEXT);
                }
                let stored = match &info.value {
                    MapValue::Plain(t) => t.clone(),
                    _ => e.ty.clone(),
                };
                let v = if stored.is_scalar() {
                    let d = self.reg();
                    self.emit(Inst::MapLoad {
                        map,
                        key,
                        dst_reg: Some(d),
                        dst_place: None,
                    });
                    Val::Reg(d)
                } else {
                    let p = self.temp(stored.size());
                    self.emit(Inst::MapLoad {
                        map,
                        key,
                        dst_reg: None,
                        dst_place: Some(p),
                    });
                    Val::Place(p)
                };
                self.convert(v, &stored, &e.ty)
            }
            ExprKind::Call { .. } => self.call(e),
            ExprKind::Unary { op, expr } => self.unary(*op, expr, &e.ty),
            ExprKind::Binary { op, lhs, rhs } => self.binary(*op, lhs, rhs, &e.ty, e.span),
            ExprKind::IncDec {
                target,
                increment,
                prefix,
            } => self.incdec(target, *increment, *prefix, &e.ty),
            ExprKind::Ternary {
                cond,
                then,
                otherwise,
            } => {
                let c = self.cond(cond);
                let (lt, le, lend) = (self.label(), self.label(), self.label());
                let scalar = e.ty.is_scalar();
                let out_reg = self.reg();
                let out_place = if scalar || e.ty == Type::Void {
                    None
                } else {
                    Some(self.temp(e.ty.size()))
                };
                self.emit(Inst::Branch {
                    cond: c,
                    if_true: lt,
                    if_false: le,
                });
                for (l, branch) in [(lt, then), (le, otherwise)] {
                    self.emit(Inst::Label(l));
                    let v = self.expr(branch);
                    // An `if` used as a statement-like value (`void` branches).
                    if e.ty == Type::Void {
                        self.emit(Inst::Jump(lend));
                        continue;
                    }
                    let v = self.convert(v, &branch.ty, &e.ty);
                    match out_place {
                        None => {
                            let r = self.reg_of(v);
                            self.emit(Inst::Mov {
                                dst: out_reg,
                                src: r,
                            });
                        }
                        Some(p) => self.store(p, v, &e.ty),
                    }
                    self.emit(Inst::Jump(lend));
                }
                self.emit(Inst::Label(lend));
                if e.ty == Type::Void {
                    return Val::Unit;
                }
                match out_place {
                    None => Val::Reg(out_reg),
                    Some(p) => Val::Place(p),
                }
            }
            ExprKind::Cast { expr, .. } => {
                let v = self.expr(expr);
                self.convert(v, &expr.ty, &e.ty)
            }
            ExprKind::Field { expr, field, .. } if self.event_field(expr, field).is_some() => {
                let f = self.event_field(expr, field).cloned();
                f.map_or(Val::Unit, |f| self.event_value(&f, &e.ty))
            }
            ExprKind::Field { expr, field, .. } => match &expr.ty {
                Type::Record(fs) => {
                    let base = self.expr(expr);
                    let i = fs.iter().position(|(n, _)| n == field).unwrap_or(0);
                    let off = expr.ty.field_offsets().get(i).copied().unwrap_or(0);
                    let p = self.place_of(base, &expr.ty);
                    self.load(p.at(off), &e.ty)
                }
                _ => self.memory_value(e),
            },
            ExprKind::TupleIndex { expr, index } => {
                let base = self.expr(expr);
                let off = expr
                    .ty
                    .field_offsets()
                    .get(*index as usize)
                    .copied()
                    .unwrap_or(0);
                let p = self.place_of(base, &expr.ty);
                self.load(p.at(off), &e.ty)
            }
            ExprKind::Index { expr, index } => match &expr.ty {
                Type::Tuple(_) => {
                    let i = match index.kind {
                        ExprKind::Int(i) => i as usize,
                        _ => 0,
                    };
                    let base = self.expr(expr);
                    let off = expr.ty.field_offsets().get(i).copied().unwrap_or(0);
                    let p = self.place_of(base, &expr.ty);
                    self.load(p.at(off), &e.ty)
                }
                Type::Str { cap } => self.string_byte(expr, index, *cap),
                _ => self.memory_value(e),
            },
            ExprKind::Tuple(es) => {
                let vals: Vec<Val> = es.iter().map(|x| self.expr(x)).collect();
                let p = self.temp(e.ty.size());
                self.emit(Inst::Zero {
                    place: p,
                    len: e.ty.size(),
                });
                let offs = e.ty.field_offsets();
                for ((x, v), off) in es.iter().zip(vals).zip(offs) {
                    self.store(p.at(off), v, &x.ty);
                }
                Val::Place(p)
            }
            ExprKind::Record(fs) => {
                let vals: Vec<Val> = fs.iter().map(|(_, x)| self.expr(x)).collect();
                let p = self.temp(e.ty.size());
                self.emit(Inst::Zero {
                    place: p,
                    len: e.ty.size(),
                });
                let offs = e.ty.field_offsets();
                for (((_, x), v), off) in fs.iter().zip(vals).zip(offs) {
                    self.store(p.at(off), v, &x.ty);
                }
                Val::Place(p)
            }
            ExprKind::Block(b) => {
                let v = self.block(b);
                match &b.value {
                    Some(x) => self.convert(v, &x.ty, &e.ty),
                    None => Val::Unit,
                }
            }
            ExprKind::Sizeof(_) | ExprKind::Offsetof { .. } | ExprKind::Cflow(_) => {
                Val::Reg(self.konst(0))
            }
        }
    }

    /// `$s[i]`: the byte at `i` of a string (sign-extended, as `int8`); 0 when `i`
    /// is past the string's capacity.
    fn string_byte(&mut self, s: &Expr, index: &Expr, cap: u32) -> Val {
        let base = self.expr(s);
        let place = self.place_of(base, &s.ty);
        let i = self.expr(index);
        let i = self.reg_of(i);
        let out = self.konst(0);
        let limit = self.konst(i64::from(cap));
        let inside = self.bin(IrBin::LtU, i, limit);
        let (read, done) = (self.label(), self.label());
        self.emit(Inst::Branch {
            cond: inside,
            if_true: read,
            if_false: done,
        });
        self.emit(Inst::Label(read));
        let start = self.reg();
        self.emit(Inst::AddrOf { dst: start, place });
        let addr = self.bin(IrBin::Add, start, i);
        self.emit(Inst::Load {
            dst: out,
            addr,
            size: 1,
            signed: true,
        });
        self.emit(Inst::Label(done));
        Val::Reg(out)
    }

    /// The target address of an lvalue-like path into target memory:
    /// `p->f`, `s.f` (s a struct reached through a pointer), `*p`, `p[i]`.
    fn address(&mut self, e: &Expr) -> Option<Reg> {
        match &e.kind {
            // A tracepoint's array field: copied into the frame.
            ExprKind::Field { expr, field, .. } if self.event_field(expr, field).is_some() => {
                match self.expr(e) {
                    Val::Place(p) => {
                        let d = self.reg();
                        self.emit(Inst::AddrOf { dst: d, place: p });
                        Some(d)
                    }
                    Val::Reg(r) => Some(r),
                    Val::Unit => None,
                }
            }
            ExprKind::Field { expr, field, .. } => {
                let (base, st) = match &expr.ty {
                    Type::Ptr(inner) => match &**inner {
                        Type::CStruct(s) => {
                            let v = self.expr(expr);
                            (self.reg_of(v), s.clone())
                        }
                        _ => return None,
                    },
                    Type::CStruct(s) => (self.address(expr)?, s.clone()),
                    _ => return None,
                };
                let off = st.fields.iter().find(|f| f.name == *field)?.offset;
                let o = self.konst(i64::from(off));
                Some(self.bin(IrBin::Add, base, o))
            }
            ExprKind::Unary {
                op: UnOp::Deref,
                expr,
            } => {
                let v = self.expr(expr);
                Some(self.reg_of(v))
            }
            ExprKind::Index { expr, index } => {
                let (base, elem) = match &expr.ty {
                    Type::Ptr(inner) => {
                        let v = self.expr(expr);
                        (self.reg_of(v), (**inner).clone())
                    }
                    Type::CStruct(s) => (self.address(expr)?, s.fields.first()?.ty.clone()),
                    _ => return None,
                };
                let i = self.expr(index);
                let i = self.reg_of(i);
                let size = self.konst(i64::from(elem.size().max(1)));
                let off = self.bin(IrBin::Mul, i, size);
                Some(self.bin(IrBin::Add, base, off))
            }
            // Any other struct or array value (`pton(...)`, `$v`, `@m[k]`, a cast):
            // the address of its bytes, in the frame or in the target.
            _ if matches!(e.ty, Type::CStruct(_)) => match self.expr(e) {
                Val::Place(p) => {
                    let d = self.reg();
                    self.emit(Inst::AddrOf { dst: d, place: p });
                    Some(d)
                }
                Val::Reg(r) => Some(r),
                Val::Unit => None,
            },
            _ => None,
        }
    }

    /// A scalar read from target memory through `address`.
    /// A bit-field's value from its storage unit in `unit` (loaded zero-extended):
    /// `(unit << (64 - shift - width)) >> (64 - width)`, zero-extended even for a
    /// signed type, as bpftrace reads bit-fields ([`ir::BitField::extract`]).
    fn extract_bits(&mut self, unit: Reg, b: ir::BitField) -> Reg {
        let w = i64::from(b.width.clamp(1, 64));
        let up = self.konst(64 - i64::from(b.shift) - w);
        let down = self.konst(64 - w);
        let v = self.bin(IrBin::Shl, unit, up);
        self.bin(IrBin::ShrU, v, down)
    }

    fn memory_value(&mut self, e: &Expr) -> Val {
        let Some(addr) = self.address(e) else {
            return Val::Reg(self.konst(0));
        };
        if e.ty.is_scalar() {
            let d = self.reg();
            let bits = bit_field(e);
            self.emit(Inst::Load {
                dst: d,
                addr,
                size: int_size(&e.ty),
                signed: e.ty.is_signed() && bits.is_none(),
            });
            match bits {
                Some(b) => Val::Reg(self.extract_bits(d, b)),
                None => Val::Reg(d),
            }
        } else if let Type::Str { cap } = e.ty {
            // A `char[N]` in memory: its N bytes (a string without its NUL when full).
            let p = self.temp(cap);
            self.read_bytes(addr, p, cap);
            Val::Place(p)
        } else {
            // A whole struct or array: its address; copied where it is stored.
            Val::Reg(addr)
        }
    }

    fn builtin(&mut self, name: &str, ty: &Type) -> Val {
        if let Some(n) = name.strip_prefix("arg").and_then(|n| n.parse::<u8>().ok()) {
            return self.ctx(CtxValue::Arg(n));
        }
        match name {
            "pid" => self.ctx(CtxValue::Pid),
            "tid" => self.ctx(CtxValue::Tid),
            "uid" => self.ctx(CtxValue::Uid),
            "gid" => self.ctx(CtxValue::Gid),
            "cpu" => self.ctx(CtxValue::Cpu),
            "numaid" => self.ctx(CtxValue::NumaId),
            "cpid" => self.ctx(CtxValue::Cpid),
            "nsecs" => self.ctx(CtxValue::Nsecs),
            "elapsed" => self.ctx(CtxValue::Elapsed),
            "__weft_cputime" => self.ctx(CtxValue::ThreadCpuTime),
            "__weft_faults" => self.ctx(CtxValue::ThreadRusage(weft_ir::RUSAGE_FAULTS as u8)),
            "__weft_minflt" => self.ctx(CtxValue::ThreadRusage(weft_ir::RUSAGE_MINOR_FAULTS as u8)),
            "__weft_majflt" => self.ctx(CtxValue::ThreadRusage(weft_ir::RUSAGE_MAJOR_FAULTS as u8)),
            "__weft_csw" => self.ctx(CtxValue::ThreadRusage(
                weft_ir::RUSAGE_CONTEXT_SWITCHES as u8,
            )),
            "rand" => self.ctx(CtxValue::Rand),
            "retval" => self.ctx(CtxValue::Retval),
            "old" | "new" | "val" => {
                let v = self.ctx(if name == "old" {
                    CtxValue::DataOld
                } else {
                    CtxValue::DataNew
                });
                // The agent reads the watched bytes zero-extended.
                self.convert(v, &Type::U64, ty)
            }
            "ip" => self.ctx(CtxValue::Ip),
            // The probed function, in a uretprobe too, as upstream names it (bpftrace
            // 0.17 symbolized a uretprobe's return address: the caller).
            "func" => self.ctx(CtxValue::FuncAddr),
            "probe" => self.ctx(CtxValue::ProbeId),
            "comm" => {
                let p = self.temp(COMM_CAP);
                self.emit(Inst::Comm {
                    dst: p,
                    cap: COMM_CAP,
                });
                Val::Place(p)
            }
            "caller" => {
                let p = self.temp(CALLER_CAP);
                self.emit(Inst::FuncName {
                    dst: p,
                    cap: CALLER_CAP,
                });
                Val::Place(p)
            }
            "pcomm" => {
                let p = self.temp(COMM_CAP);
                self.emit(Inst::PComm {
                    dst: p,
                    cap: COMM_CAP,
                });
                Val::Place(p)
            }
            "ustack" => {
                let p = self.temp(ty.size());
                let depth = match ty {
                    Type::UStack { depth, .. } => *depth,
                    _ => crate::check::USTACK_DEPTH,
                };
                self.emit(Inst::UStack { dst: p, depth });
                Val::Place(p)
            }
            "args" if self.event.is_some() => self.event_record(ty),
            "args" => self.args_record(ty),
            _ => Val::Unit,
        }
    }

    /// The tracepoint field `args.FIELD` names, when `base` is `args` in a body
    /// lowered for a tracepoint.
    fn event_field(&self, base: &Expr, field: &str) -> Option<&'a EventField> {
        match &base.kind {
            ExprKind::Ident(n) if n == "args" => self.event?.iter().find(|f| f.name == field),
            _ => None,
        }
    }

    /// A field of the tracepoint's record, of type `ty` (the checker's
    /// `event_field_type`): an integer or a pointer in a register, a string or an
    /// array copied into a slot.
    fn event_value(&mut self, f: &EventField, ty: &Type) -> Val {
        if ty.is_scalar() {
            let d = self.reg();
            self.emit(Inst::EventField {
                dst: d,
                off: f.offset,
                size: f.size.clamp(1, 8) as u8,
                signed: ty.is_signed(),
            });
            return Val::Reg(d);
        }
        let size = ty.size();
        let p = self.temp(size);
        match (&f.shape, ty) {
            (EventFieldShape::DataLoc, Type::Str { cap }) => self.emit(Inst::EventDataLoc {
                dst: p,
                off: f.offset,
                cap: *cap,
            }),
            _ => {
                if f.size < size {
                    self.emit(Inst::Zero {
                        place: p,
                        len: size,
                    });
                }
                self.emit(Inst::EventBytes {
                    dst: p,
                    off: f.offset,
                    len: f.size.min(size),
                });
            }
        }
        Val::Place(p)
    }

    /// `args` in a tracepoint: a record of the event's fields (the checker's choice
    /// of them), each read from the record.
    fn event_record(&mut self, ty: &Type) -> Val {
        let Type::Record(fields) = ty else {
            return Val::Unit;
        };
        let p = self.temp(ty.size());
        self.emit(Inst::Zero {
            place: p,
            len: ty.size(),
        });
        for ((name, fty), off) in fields.iter().zip(ty.field_offsets()) {
            let Some(f) = self.event.and_then(|e| e.iter().find(|f| f.name == *name)) else {
                continue;
            };
            let v = self.event_value(f, fty);
            self.store(p.at(off), v, fty);
        }
        Val::Place(p)
    }

    /// `args`: a record of the probed function's parameters (types from DWARF),
    /// filled from the integer argument registers in order (SysV: each scalar or
    /// pointer parameter takes the next one). Parameters that are not passed in one
    /// integer register (structs by value, floating point) read as zero.
    fn args_record(&mut self, ty: &Type) -> Val {
        let Type::Record(fields) = ty else {
            return Val::Unit;
        };
        let p = self.temp(ty.size());
        self.emit(Inst::Zero {
            place: p,
            len: ty.size(),
        });
        let offsets = ty.field_offsets();
        let mut next = 0u8;
        for ((_, fty), off) in fields.iter().zip(offsets) {
            if !fty.is_scalar() || fty.size() > 8 {
                next = next.saturating_add(fty.size().div_ceil(8).max(1) as u8);
                continue;
            }
            let v = self.ctx(CtxValue::Arg(next));
            next = next.saturating_add(1);
            self.store(p.at(off), v, fty);
        }
        Val::Place(p)
    }

    fn unary(&mut self, op: UnOp, x: &Expr, ty: &Type) -> Val {
        match op {
            UnOp::Deref => {
                let e = Expr {
                    kind: ExprKind::Unary {
                        op,
                        expr: Box::new(x.clone()),
                    },
                    span: x.span,
                    ty: ty.clone(),
                };
                self.memory_value(&e)
            }
            UnOp::Plus => self.expr(x),
            UnOp::AddrOf => Val::Reg(self.konst(0)),
            UnOp::Neg | UnOp::BitNot | UnOp::Not => {
                let v = self.expr(x);
                let r = self.reg_of(v);
                let d = self.reg();
                let irop = match op {
                    UnOp::Neg => IrUn::Neg,
                    UnOp::BitNot => IrUn::Not,
                    _ => IrUn::LNot,
                };
                self.emit(Inst::Unary {
                    op: irop,
                    dst: d,
                    a: r,
                });
                Val::Reg(d)
            }
        }
    }

    /// Integer arithmetic (`op` is not a comparison or logical operator); pointer
    /// arithmetic scales by the pointee size.
    fn arith(&mut self, op: BinOp, a: Reg, b: Reg, ta: &Type, tb: &Type) -> Reg {
        let (a, b) = match (ta, tb) {
            (Type::Ptr(inner), _) if matches!(op, BinOp::Add | BinOp::Sub) => {
                let s = self.konst(i64::from(inner.size().max(1)));
                (a, self.bin(IrBin::Mul, b, s))
            }
            (_, Type::Ptr(inner)) if op == BinOp::Add => {
                let s = self.konst(i64::from(inner.size().max(1)));
                (self.bin(IrBin::Mul, a, s), b)
            }
            _ => (a, b),
        };
        let irop = match op {
            BinOp::Add => IrBin::Add,
            BinOp::Sub => IrBin::Sub,
            BinOp::Mul => IrBin::Mul,
            // bpftrace 0.17: `/`, `%` and `>>` are unsigned 64-bit operations whatever
            // the operands' signs (`-7 / 2` is 0x7ffffffffffffffc, `-8 >> 1` is
            // 0x7ffffffffffffffc); newer bpftrace divides signed values signed.
            BinOp::Div => IrBin::DivU,
            BinOp::Mod => IrBin::ModU,
            BinOp::BitAnd => IrBin::And,
            BinOp::BitOr => IrBin::Or,
            BinOp::BitXor => IrBin::Xor,
            BinOp::Shl => IrBin::Shl,
            BinOp::Shr => IrBin::ShrU,
            _ => IrBin::Add,
        };
        self.bin(irop, a, b)
    }

    fn binary(&mut self, op: BinOp, lhs: &Expr, rhs: &Expr, ty: &Type, span: Span) -> Val {
        match op {
            BinOp::And | BinOp::Or => {
                let out = self.konst(if op == BinOp::And { 0 } else { 1 });
                let a = self.cond(lhs);
                let (lrhs, lend) = (self.label(), self.label());
                if op == BinOp::And {
                    self.emit(Inst::Branch {
                        cond: a,
                        if_true: lrhs,
                        if_false: lend,
                    });
                } else {
                    self.emit(Inst::Branch {
                        cond: a,
                        if_true: lend,
                        if_false: lrhs,
                    });
                }
                self.emit(Inst::Label(lrhs));
                let b = self.cond(rhs);
                let z = self.konst(0);
                self.emit(Inst::Binary {
                    op: IrBin::Ne,
                    dst: out,
                    a: b,
                    b: z,
                });
                self.emit(Inst::Label(lend));
                Val::Reg(out)
            }
            _ if op.is_comparison() => {
                let (ta, tb) = (&lhs.ty, &rhs.ty);
                let va = self.expr(lhs);
                let vb = self.expr(rhs);
                match (ta, tb) {
                    (Type::Str { cap: x }, Type::Str { cap: y }) => {
                        let cap = (*x).max(*y);
                        let common = Type::Str { cap };
                        let a = self.convert(va, ta, &common);
                        let b = self.convert(vb, tb, &common);
                        let (pa, pb) = (self.place_of(a, &common), self.place_of(b, &common));
                        let d = self.reg();
                        self.emit(Inst::StrEq {
                            dst: d,
                            a: pa,
                            b: pb,
                            len: cap,
                        });
                        Val::Reg(self.eq_result(op, d))
                    }
                    _ if !ta.is_scalar() || !tb.is_scalar() => {
                        let common = storage(ta);
                        let a = self.convert(va, ta, &common);
                        let b = self.convert(vb, tb, &common);
                        let (pa, pb) = (self.place_of(a, &common), self.place_of(b, &common));
                        let d = self.reg();
                        self.emit(Inst::BytesEq {
                            dst: d,
                            a: pa,
                            b: pb,
                            len: common.size(),
                        });
                        Val::Reg(self.eq_result(op, d))
                    }
                    _ => {
                        let a = self.reg_of(va);
                        let b = self.reg_of(vb);
                        let signed = sgn(ta) && sgn(tb);
                        let irop = match (op, signed) {
                            (BinOp::Eq, _) => IrBin::Eq,
                            (BinOp::Ne, _) => IrBin::Ne,
                            (BinOp::Lt, true) => IrBin::LtS,
                            (BinOp::Lt, false) => IrBin::LtU,
                            (BinOp::Le, true) => IrBin::LeS,
                            (BinOp::Le, false) => IrBin::LeU,
                            (BinOp::Gt, true) => IrBin::GtS,
                            (BinOp::Gt, false) => IrBin::GtU,
                            (BinOp::Ge, true) => IrBin::GeS,
                            _ => IrBin::GeU,
                        };
                        Val::Reg(self.bin(irop, a, b))
                    }
                }
            }
            _ => {
                let va = self.expr(lhs);
                let vb = self.expr(rhs);
                let a = self.reg_of(va);
                let b = self.reg_of(vb);
                if matches!(op, BinOp::Div | BinOp::Mod) && !is_nonzero_literal(rhs) {
                    self.warn_if_zero(b, span);
                }
                let r = self.arith(op, a, b, &lhs.ty, &rhs.ty);
                let _ = ty;
                Val::Reg(r)
            }
        }
    }

    /// Upstream's run-time warning for a division or remainder by zero, at the
    /// place of the expression (`stdin:1:9-16: WARNING: Divide or modulo by 0
    /// detected. ...`), each time the divisor `b` is 0 (weft also counts them and
    /// says how many at exit).
    fn warn_if_zero(&mut self, b: Reg, span: Span) {
        self.warn_if_zero_text(b, span, DIV_ZERO_TEXT);
    }

    /// Upstream's run-time warning `text` at `span` (its place, the source line and
    /// `~` under it), each time `v` is 0.
    fn warn_if_zero_text(&mut self, v: Reg, span: Span, text: &str) {
        let Some(message) = self.ck.runtime_warning_at(span) else {
            return;
        };
        let id = self.format_message(text.to_string(), Vec::new(), Some(message));
        let z = self.konst(0);
        let is_zero = self.bin(IrBin::Eq, v, z);
        let (warn, done) = (self.label(), self.label());
        self.emit(Inst::Branch {
            cond: is_zero,
            if_true: warn,
            if_false: done,
        });
        self.emit(Inst::Label(warn));
        self.emit(Inst::Emit {
            kind: EventKind::Printf(id),
            payload: None,
            len: 0,
        });
        self.emit(Inst::Label(done));
    }

    fn eq_result(&mut self, op: BinOp, eq: Reg) -> Reg {
        if op == BinOp::Ne {
            let d = self.reg();
            self.emit(Inst::Unary {
                op: IrUn::LNot,
                dst: d,
                a: eq,
            });
            d
        } else {
            eq
        }
    }

    fn incdec(&mut self, target: &IncTarget, increment: bool, prefix: bool, ty: &Type) -> Val {
        let op = if increment { BinOp::Add } else { BinOp::Sub };
        match target {
            IncTarget::Var(v) => {
                let vt = self.var_type(v);
                let Some(Val::Reg(r)) = v.id.and_then(|i| self.vars.get(&i).copied()) else {
                    return Val::Unit;
                };
                let old = self.reg();
                self.emit(Inst::Mov { dst: old, src: r });
                let one = self.konst(1);
                let new = self.arith(op, r, one, &vt, &Type::I64);
                let new = self.convert(Val::Reg(new), &Type::I64, &vt);
                let new = self.reg_of(new);
                self.emit(Inst::Mov { dst: r, src: new });
                let res = if prefix { new } else { old };
                self.convert(Val::Reg(res), &vt, ty)
            }
            IncTarget::Map(m) => {
                let map = self.map_id(&m.name);
                let info = self.map_info(&m.name);
                let MapValue::Plain(vt) = &info.value else {
                    return Val::Unit;
                };
                let key = self.map_key(info, m.keys.as_deref());
                let old = self.reg();
                self.emit(Inst::MapLoad {
                    map,
                    key,
                    dst_reg: Some(old),
                    dst_place: None,
                });
                let one = self.konst(1);
                let new = self.arith(op, old, one, vt, &Type::I64);
                self.map_store(map, key, Val::Reg(new), &Type::I64, vt);
                Val::Reg(if prefix { new } else { old })
            }
        }
    }

    // ---- calls ------------------------------------------------------------------

    fn call(&mut self, e: &Expr) -> Val {
        let ExprKind::Call { name, args, .. } = &e.kind else {
            return Val::Unit;
        };
        match name.as_str() {
            "printf" => {
                let ExprKind::Str(fmt) = &args[0].kind else {
                    return Val::Unit;
                };
                let text = String::from_utf8_lossy(fmt).into_owned();
                let (payload, len, types) = self.pack(&args[1..]);
                let id = self.format(text, types);
                self.emit(Inst::Emit {
                    kind: EventKind::Printf(id),
                    payload,
                    len,
                });
                Val::Unit
            }
            // A printf whose format says it is a message, and from where.
            "errorf" | "warnf" => {
                let ExprKind::Str(fmt) = &args[0].kind else {
                    return Val::Unit;
                };
                let level = if name == "errorf" {
                    ir::MessageLevel::Error
                } else {
                    ir::MessageLevel::Warning
                };
                let message = self.ck.message_at(level, e.span);
                let text = String::from_utf8_lossy(fmt).into_owned();
                let (payload, len, types) = self.pack(&args[1..]);
                let id = self.format_message(text, types, message);
                self.emit(Inst::Emit {
                    kind: EventKind::Printf(id),
                    payload,
                    len,
                });
                Val::Unit
            }
            "system" | "cat" => {
                let ExprKind::Str(fmt) = &args[0].kind else {
                    return Val::Unit;
                };
                let text = String::from_utf8_lossy(fmt).into_owned();
                let (payload, len, types) = self.pack(&args[1..]);
                let id = self.format(text, types);
                let kind = match name.as_str() {
                    "system" => EventKind::System(id),
                    _ => EventKind::Cat(id),
                };
                self.emit(Inst::Emit { kind, payload, len });
                Val::Unit
            }
            "print" => {
                if let ExprKind::Map(MapRef {
                    name: m,
                    keys: None,
                    ..
                }) = &args[0].kind
                {
                    let map = self.map_id(m);
                    // The checker keeps both in 0..=u32::MAX.
                    let lit = |i: usize| match args.get(i).map(|a| &a.kind) {
                        Some(ExprKind::Int(v)) => u32::try_from(*v).unwrap_or(u32::MAX),
                        _ => 0,
                    };
                    self.emit(Inst::Emit {
                        kind: EventKind::PrintMap {
                            map,
                            top: lit(1),
                            div: lit(2),
                        },
                        payload: None,
                        len: 0,
                    });
                } else {
                    let (payload, len, types) = self.pack(&args[..1]);
                    let id = self.format(String::new(), types);
                    self.emit(Inst::Emit {
                        kind: EventKind::PrintValue(id),
                        payload,
                        len,
                    });
                }
                Val::Unit
            }
            "exit" => {
                // `exit(code)`: weft's exit status, carried by the event.
                let payload = args.first().map(|a| {
                    let v = self.expr(a);
                    let v = self.convert(v, &a.ty, &Type::I64);
                    let p = self.temp(8);
                    self.store(p, v, &Type::I64);
                    p
                });
                let len = if payload.is_some() { 8 } else { 0 };
                self.emit(Inst::Emit {
                    kind: EventKind::Exit,
                    payload,
                    len,
                });
                // As upstream bpftrace: the probe ends here; what follows does not
                // run (but must stay well-formed, as after `return`).
                self.emit(Inst::Return);
                let l = self.label();
                self.emit(Inst::Label(l));
                Val::Unit
            }
            "__weft_entry" => {
                let n = match &args[0].kind {
                    ExprKind::Int(v) => (*v).min(6) as u8,
                    _ => 0,
                };
                let words = u32::from(n) + args.len() as u32 - 1;
                let payload = (words > 0).then(|| {
                    let p = self.temp(8 * words);
                    for i in 0..n {
                        let v = self.ctx(CtxValue::Arg(i));
                        self.store(p.at(8 * u32::from(i)), v, &Type::U64);
                    }
                    if let Some(c) = args.get(1) {
                        let v = self.expr(c);
                        let v = self.convert(v, &c.ty, &Type::U64);
                        self.store(p.at(8 * u32::from(n)), v, &Type::U64);
                    }
                    p
                });
                self.emit(Inst::Emit {
                    kind: EventKind::FuncEntry,
                    payload,
                    len: 8 * words,
                });
                Val::Unit
            }
            // The probe ends here, as `return;` does; the value is never read.
            "__weft_stop" => {
                self.emit(Inst::Return);
                let l = self.label();
                self.emit(Inst::Label(l));
                Val::Reg(self.konst(0))
            }
            "__weft_exit" => {
                let payload = args.first().map(|c| {
                    let p = self.temp(8);
                    let v = self.expr(c);
                    let v = self.convert(v, &c.ty, &Type::U64);
                    self.store(p, v, &Type::U64);
                    p
                });
                self.emit(Inst::Emit {
                    kind: EventKind::FuncExit,
                    len: if payload.is_some() { 8 } else { 0 },
                    payload,
                });
                Val::Unit
            }
            "__weft_thread" => {
                let ExprKind::Map(m) = &args[0].kind else {
                    return Val::Unit;
                };
                let map = self.map_id(&m.name);
                let d = self.reg();
                self.emit(Inst::ThreadSum { dst: d, map });
                Val::Reg(d)
            }
            "__weft_caller_in" => {
                let (ExprKind::Str(bin), ExprKind::Str(func)) = (&args[0].kind, &args[1].kind)
                else {
                    return Val::Unit;
                };
                // return address in [start, end) of the function
                let Val::Reg(ret) = self.ctx(CtxValue::ReturnAddress) else {
                    unreachable!("ctx gives a register")
                };
                let bound = |fx: &mut Self, end: bool| {
                    let d = fx.reg();
                    fx.emit(Inst::SymbolAddr {
                        dst: d,
                        symbol: ir::SymbolRef {
                            name: String::from_utf8_lossy(func).into_owned(),
                            module: Some(String::from_utf8_lossy(bin).into_owned()),
                            end,
                        },
                    });
                    d
                };
                let lo = bound(self, false);
                let hi = bound(self, true);
                let above = self.bin(IrBin::GeU, ret, lo);
                let below = self.bin(IrBin::LtU, ret, hi);
                Val::Reg(self.bin(IrBin::And, above, below))
            }
            "clear" | "zero" => {
                let ExprKind::Map(m) = &args[0].kind else {
                    return Val::Unit;
                };
                let map = self.map_id(&m.name);
                let kind = if name == "clear" {
                    EventKind::ClearMap(map)
                } else {
                    EventKind::ZeroMap(map)
                };
                self.emit(Inst::Emit {
                    kind,
                    payload: None,
                    len: 0,
                });
                Val::Unit
            }
            "time" => {
                let text = match args.first().map(|a| &a.kind) {
                    Some(ExprKind::Str(s)) => String::from_utf8_lossy(s).into_owned(),
                    _ => "%H:%M:%S\n".to_string(),
                };
                let id = self.format(text, Vec::new());
                self.emit(Inst::Emit {
                    kind: EventKind::Time(id),
                    payload: None,
                    len: 0,
                });
                Val::Unit
            }
            "str" => {
                let a = &args[0];
                if let Type::Str { .. } = a.ty {
                    let v = self.expr(a);
                    return self.convert(v, &a.ty, &e.ty);
                }
                let cap = e.ty.size();
                let v = self.expr(a);
                let addr = self.reg_of(v);
                let max = match args.get(1) {
                    Some(n) if !matches!(n.kind, ExprKind::Int(_)) => {
                        // bpftrace 0.17: at most n characters (n does not count the NUL).
                        let nv = self.expr(n);
                        Some(self.reg_of(nv))
                    }
                    _ => None,
                };
                let dst = self.temp(cap);
                self.emit(Inst::ReadStr {
                    dst,
                    addr,
                    max,
                    cap,
                });
                Val::Place(dst)
            }
            "buf" => {
                let Type::Buf { cap } = e.ty else {
                    return Val::Unit;
                };
                let data = &args[0];
                let v = self.expr(data);
                let len = match args.get(1) {
                    Some(n) => {
                        let nv = self.expr(n);
                        self.reg_of(nv)
                    }
                    None => self.konst(i64::from(cap)),
                };
                let dst = self.temp(4 + cap);
                if let Type::Str { cap: scap } = data.ty {
                    // A string's own bytes (zeroes past its capacity), `len` of them
                    // at most the buffer's capacity.
                    let src = self.place_of(v, &data.ty);
                    self.emit(Inst::Zero {
                        place: dst,
                        len: 4 + cap,
                    });
                    let n = scap.min(cap);
                    if n > 0 {
                        self.emit(Inst::Copy {
                            dst: dst.at(4),
                            src,
                            len: n,
                        });
                    }
                    let capr = self.konst(i64::from(cap));
                    let over = self.bin(IrBin::GtU, len, capr);
                    let (clamp, keep, done) = (self.label(), self.label(), self.label());
                    self.emit(Inst::Branch {
                        cond: over,
                        if_true: clamp,
                        if_false: keep,
                    });
                    self.emit(Inst::Label(clamp));
                    self.emit(Inst::Store {
                        place: dst,
                        src: capr,
                        size: 4,
                    });
                    self.emit(Inst::Jump(done));
                    self.emit(Inst::Label(keep));
                    self.emit(Inst::Store {
                        place: dst,
                        src: len,
                        size: 4,
                    });
                    self.emit(Inst::Label(done));
                    return Val::Place(dst);
                }
                // An address, or an array's (its value is its address).
                let addr = self.reg_of(v);
                self.emit(Inst::ReadBuf {
                    dst,
                    addr,
                    len,
                    cap,
                });
                Val::Place(dst)
            }
            "delete" => {
                let ExprKind::Map(m) = &args[0].kind else {
                    return Val::Unit;
                };
                let map = self.map_id(&m.name);
                let info = self.map_info(&m.name);
                let key = if args.len() > 1 {
                    self.map_key(info, Some(&args[1..]))
                } else {
                    self.map_key(info, m.keys.as_deref())
                };
                let d = self.reg();
                self.emit(Inst::MapDelete {
                    map,
                    key,
                    dst: Some(d),
                });
                if self.ck.helper_warnings && key.is_some() {
                    self.warn_if_zero_text(d, e.span, DELETE_MISSING_TEXT);
                }
                Val::Reg(d)
            }
            "has_key" => {
                let ExprKind::Map(m) = &args[0].kind else {
                    return Val::Unit;
                };
                let map = self.map_id(&m.name);
                let info = self.map_info(&m.name);
                let d = self.reg();
                match self.map_key(info, Some(&args[1..])) {
                    Some(key) => self.emit(Inst::MapHasKey { dst: d, map, key }),
                    None => self.emit(Inst::Const { dst: d, value: 0 }),
                }
                Val::Reg(d)
            }
            "len" => {
                let ExprKind::Map(m) = &args[0].kind else {
                    return Val::Reg(self.konst(0));
                };
                let map = self.map_id(&m.name);
                let d = self.reg();
                self.emit(Inst::MapLen { dst: d, map });
                Val::Reg(d)
            }
            "strftime" => {
                let ExprKind::Str(fmt) = &args[0].kind else {
                    return Val::Unit;
                };
                let id = self.format(String::from_utf8_lossy(fmt).into_owned(), Vec::new());
                let v = self.expr(&args[1]);
                let ns = self.reg_of(v);
                // The argument is a CLOCK_MONOTONIC time (like `nsecs`); shift it to
                // CLOCK_REALTIME for printing.
                let rt = self.ctx(CtxValue::RealtimeNsecs);
                let rt = self.reg_of(rt);
                let mono = self.ctx(CtxValue::Nsecs);
                let mono = self.reg_of(mono);
                let delta = self.bin(IrBin::Sub, rt, mono);
                let real = self.bin(IrBin::Add, ns, delta);
                let p = self.temp(16);
                let f = self.konst(i64::from(id.0));
                self.emit(Inst::Store {
                    place: p,
                    src: f,
                    size: 8,
                });
                self.emit(Inst::Store {
                    place: p.at(8),
                    src: real,
                    size: 8,
                });
                Val::Place(p)
            }
            "join" => {
                let sep = match args.get(1).map(|a| &a.kind) {
                    Some(ExprKind::Str(s)) => String::from_utf8_lossy(s).into_owned(),
                    _ => " ".to_string(),
                };
                let cap = self.ck.config.strlen;
                let elem = Type::Str { cap };
                let tuple = Type::Tuple(vec![elem.clone(); JOIN_MAX as usize]);
                let id = self.format(sep, field_types(&tuple));
                let v = self.expr(&args[0]);
                let base = self.reg_of(v);
                let p = self.temp(tuple.size());
                self.emit(Inst::Zero {
                    place: p,
                    len: tuple.size(),
                });
                let end = self.label();
                let zero = self.konst(0);
                for (i, off) in tuple.field_offsets().into_iter().enumerate() {
                    let o = self.konst(8 * i as i64);
                    let a = self.bin(IrBin::Add, base, o);
                    let s = self.reg();
                    self.emit(Inst::Load {
                        dst: s,
                        addr: a,
                        size: 8,
                        signed: false,
                    });
                    let nonnull = self.bin(IrBin::Ne, s, zero);
                    let next = self.label();
                    self.emit(Inst::Branch {
                        cond: nonnull,
                        if_true: next,
                        if_false: end,
                    });
                    self.emit(Inst::Label(next));
                    self.emit(Inst::ReadStr {
                        dst: p.at(off),
                        addr: s,
                        max: None,
                        cap,
                    });
                }
                self.emit(Inst::Label(end));
                self.emit(Inst::Emit {
                    kind: EventKind::Join(id),
                    payload: Some(p),
                    len: tuple.size(),
                });
                Val::Unit
            }
            "usym" => {
                let v = self.expr(&args[0]);
                Val::Reg(self.reg_of(v))
            }
            "bswap" => {
                let bits = match &args[0].ty {
                    Type::Int { bits, .. } => *bits,
                    _ => 64,
                };
                let v = self.expr(&args[0]);
                let r = self.reg_of(v);
                if bits == 8 {
                    return Val::Reg(r);
                }
                let d = self.reg();
                self.emit(Inst::Unary {
                    op: IrUn::Bswap(bits),
                    dst: d,
                    a: r,
                });
                Val::Reg(d)
            }
            "uaddr" => {
                let ExprKind::Str(s) = &args[0].kind else {
                    return Val::Unit;
                };
                let d = self.reg();
                self.emit(Inst::SymbolAddr {
                    dst: d,
                    symbol: ir::SymbolRef::named(String::from_utf8_lossy(s)),
                });
                Val::Reg(d)
            }
            "proceed" => {
                let args = self.regs_of(args);
                let d = self.reg();
                self.emit(Inst::Proceed { dst: d, args });
                Val::Reg(d)
            }
            "override" => {
                let v = self.expr(&args[0]);
                let value = self.reg_of(v);
                self.emit(Inst::Override { value });
                Val::Unit
            }
            "__weft_set_new" => {
                let v = self.expr(&args[0]);
                let value = self.reg_of(v);
                self.emit(Inst::SetDataNew { value });
                Val::Unit
            }
            "signal" => {
                let sig = match &args[0].kind {
                    ExprKind::Str(s) => {
                        let n = signal_number(&String::from_utf8_lossy(s)).unwrap_or(0);
                        self.konst(n)
                    }
                    _ => {
                        let v = self.expr(&args[0]);
                        self.reg_of(v)
                    }
                };
                self.emit(Inst::Signal { sig });
                Val::Unit
            }
            "ustack" => {
                let Type::UStack { depth, .. } = e.ty else {
                    return Val::Unit;
                };
                let p = self.temp(e.ty.size());
                self.emit(Inst::UStack { dst: p, depth });
                Val::Place(p)
            }
            "strncmp" | "strcontains" | "__weft_strorder" => {
                let (a, b) = (&args[0], &args[1]);
                let (Type::Str { cap: ca }, Type::Str { cap: cb }) = (&a.ty, &b.ty) else {
                    return Val::Reg(self.konst(0));
                };
                let cap = (*ca).max(*cb);
                let common = Type::Str { cap };
                let va = self.expr(a);
                let vb = self.expr(b);
                let va = self.convert(va, &a.ty, &common);
                let vb = self.convert(vb, &b.ty, &common);
                let (pa, pb) = (self.place_of(va, &common), self.place_of(vb, &common));
                let d = self.reg();
                if name == "strcontains" {
                    self.emit(Inst::StrContains {
                        dst: d,
                        a: pa,
                        b: pb,
                        len: cap,
                    });
                } else if name == "__weft_strorder" {
                    self.emit(Inst::StrOrder {
                        dst: d,
                        a: pa,
                        b: pb,
                        len: cap,
                    });
                } else {
                    let n = match args[2].kind {
                        ExprKind::Int(n) => u32::try_from(n).map_or(cap, |n| n.min(cap)),
                        _ => cap,
                    };
                    self.emit(Inst::StrCmp {
                        dst: d,
                        a: pa,
                        b: pb,
                        len: n,
                    });
                }
                Val::Reg(d)
            }
            "getopt" => {
                let ExprKind::Str(name) = &args[0].kind else {
                    return Val::Unit;
                };
                let value = self.ck.named.get(String::from_utf8_lossy(name).as_ref());
                match (value, &e.ty) {
                    (Some(NamedValue::Bool(b)), _) => Val::Reg(self.konst(i64::from(*b))),
                    (Some(NamedValue::Int(v)), _) => Val::Reg(self.konst(*v)),
                    (Some(NamedValue::Str(text)), Type::Str { cap }) => {
                        let mut bytes = text.clone();
                        bytes.truncate((*cap as usize).saturating_sub(1));
                        let p = self.temp(*cap);
                        self.emit(Inst::SetBytes {
                            place: p,
                            bytes,
                            len: *cap,
                        });
                        Val::Place(p)
                    }
                    _ => Val::Unit,
                }
            }
            "ntop" => {
                let addr = &args[args.len() - 1];
                let p = self.temp(ir::INET_SIZE);
                self.emit(Inst::Zero {
                    place: p,
                    len: ir::INET_SIZE,
                });
                let af = if args.len() == 2 {
                    let v = self.expr(&args[0]);
                    self.reg_of(v)
                } else if is_int(&addr.ty) || addr.ty.size() == 4 {
                    self.konst(ir::AF_INET as i64)
                } else {
                    self.konst(ir::AF_INET6 as i64)
                };
                self.emit(Inst::Store {
                    place: p,
                    src: af,
                    size: 8,
                });
                if is_int(&addr.ty) {
                    // The low 32 bits, in memory order (so `0x0100007f` is 127.0.0.1).
                    let v = self.expr(addr);
                    let r = self.reg_of(v);
                    self.emit(Inst::Store {
                        place: p.at(8),
                        src: r,
                        size: 4,
                    });
                } else {
                    let len = addr.ty.size().min(16);
                    self.bytes_of(addr, p.at(8), len);
                }
                Val::Place(p)
            }
            // Held like any C array value: its bytes (here in the frame) and the value
            // is their address.
            "pton" => {
                let ExprKind::Str(text) = &args[0].kind else {
                    return Val::Reg(self.konst(0));
                };
                let bytes = crate::check::pton(&String::from_utf8_lossy(text)).unwrap_or_default();
                let len = bytes.len() as u32;
                let p = self.temp(len);
                self.emit(Inst::SetBytes {
                    place: p,
                    bytes,
                    len,
                });
                let d = self.reg();
                self.emit(Inst::AddrOf { dst: d, place: p });
                Val::Reg(d)
            }
            "macaddr" => {
                let p = self.temp(6);
                self.bytes_of(&args[0], p, 6);
                Val::Place(p)
            }
            "reg" => {
                let ExprKind::Str(s) = &args[0].kind else {
                    return Val::Unit;
                };
                match machine_reg(&String::from_utf8_lossy(s)) {
                    Some(RegSource::Machine(r)) => self.ctx(CtxValue::Reg(r)),
                    Some(RegSource::Constant(v)) => Val::Reg(self.konst(v)),
                    None => Val::Reg(self.konst(0)),
                }
            }
            "pcomm" => self.builtin("pcomm", &e.ty),
            _ => Val::Unit,
        }
    }

    /// Copy the first `len` bytes of a value to `dst`: a string's from its place; an
    /// array's (whose value is its address) or those at an integer or pointer address
    /// from memory, a faulting read giving zeroes.
    fn bytes_of(&mut self, e: &Expr, dst: Place, len: u32) {
        let v = self.expr(e);
        if let Type::Str { cap } = e.ty {
            let src = self.place_of(v, &e.ty);
            self.emit(Inst::Copy {
                dst,
                src,
                len: len.min(cap),
            });
            return;
        }
        // A value held in the frame (an array kept in a variable or read from a
        // map, as `$a = pton("::1")` holds it): its bytes are here, not at an
        // address in the target.
        if let (Val::Place(src), Type::CStruct(_)) = (v, &e.ty) {
            self.emit(Inst::Copy {
                dst,
                src,
                len: len.min(e.ty.size()),
            });
            return;
        }
        let addr = self.reg_of(v);
        self.read_bytes(addr, dst, len);
    }

    /// Read `len` bytes of memory at `addr` into `dst`, 8, 4, 2 and 1 bytes at a time
    /// (each read fault-tolerant); more than [`INLINE_READ_MAX`] bytes (a whole
    /// struct) with one fault-tolerant copy into a buffer, so the code stays small.
    fn read_bytes(&mut self, addr: Reg, dst: Place, len: u32) {
        if len > INLINE_READ_MAX {
            let buf = self.temp(len.saturating_add(4));
            let n = self.konst(i64::from(len));
            self.emit(Inst::ReadBuf {
                dst: buf,
                addr,
                len: n,
                cap: len,
            });
            self.emit(Inst::Copy {
                dst,
                src: buf.at(4),
                len,
            });
            return;
        }
        let mut off = 0;
        while off < len {
            let size = [8u8, 4, 2, 1]
                .into_iter()
                .find(|&s| u32::from(s) <= len - off)
                .unwrap_or(1);
            let at = if off == 0 {
                addr
            } else {
                let o = self.konst(i64::from(off));
                self.bin(IrBin::Add, addr, o)
            };
            let r = self.reg();
            self.emit(Inst::Load {
                dst: r,
                addr: at,
                size,
                signed: false,
            });
            self.emit(Inst::Store {
                place: dst.at(off),
                src: r,
                size,
            });
            off += u32::from(size);
        }
    }

    /// Evaluate arguments into a zeroed tuple of their storage types (the payload of
    /// printf-like events); integers are widened to 64 bits.
    fn pack(&mut self, args: &[Expr]) -> (Option<Place>, u32, Vec<Type>) {
        let types: Vec<Type> = args.iter().map(|a| storage(&a.ty)).collect();
        if args.is_empty() {
            return (None, 0, types);
        }
        let vals: Vec<Val> = args.iter().map(|a| self.expr(a)).collect();
        let tuple = Type::Tuple(types.clone());
        let p = self.temp(tuple.size());
        self.emit(Inst::Zero {
            place: p,
            len: tuple.size(),
        });
        for (((a, v), t), off) in args.iter().zip(vals).zip(&types).zip(tuple.field_offsets()) {
            let v = self.convert(v, &a.ty, t);
            self.store(p.at(off), v, t);
        }
        (Some(p), tuple.size(), types)
    }
}

fn field_types(t: &Type) -> Vec<Type> {
    match t {
        Type::Tuple(ts) => ts.clone(),
        Type::Record(fs) => fs.iter().map(|(_, t)| t.clone()).collect(),
        _ => Vec::new(),
    }
}

/// The type of `a op b` for integer operators (as the checker types it).
/// Upstream bpftrace's words for a division by zero at run time (`DIVIDE_BY_ZERO_MSG`).
const DIV_ZERO_TEXT: &str =
    "Divide or modulo by 0 detected. This can lead to unexpected results. 1 is being used as the result.";

/// Upstream's `-k` warnings for a map element that is not there.
const LOOKUP_MISSING_TEXT: &str = "Can't lookup map element because it does not exist.\nAdditional Info - helper: map_lookup_elem, retcode: 0";
const DELETE_MISSING_TEXT: &str = "Can't delete map element because it does not exist.\nAdditional Info - helper: map_delete_elem, retcode: -2";

/// Whether `e` is an integer literal other than 0 (a division by it needs no check).
fn is_nonzero_literal(e: &Expr) -> bool {
    matches!(e.kind, ExprKind::Int(v) if v != 0)
}

fn arith_type(a: &Type, b: &Type) -> Type {
    if let Type::Ptr(_) = a {
        return a.clone();
    }
    Type::Int {
        bits: 64,
        signed: sgn(a) && sgn(b),
    }
}

fn is_int(t: &Type) -> bool {
    matches!(t, Type::Int { .. } | Type::Bool)
}

/// Signed for integer promotion (booleans promote like C's `int`).
fn sgn(t: &Type) -> bool {
    matches!(t, Type::Int { signed: true, .. } | Type::Bool)
}

/// The bits of a struct member that is a bit-field (`$s.a`, `$p->a`).
fn bit_field(e: &Expr) -> Option<ir::BitField> {
    let ExprKind::Field { expr, field, .. } = &e.kind else {
        return None;
    };
    let s = match &expr.ty {
        Type::CStruct(s) => s,
        Type::Ptr(inner) => match &**inner {
            Type::CStruct(s) => s,
            _ => return None,
        },
        _ => return None,
    };
    s.fields.iter().find(|f| f.name == *field)?.bits
}
