//! Execute compiled advice in this process against a real shared segment and the
//! real runtime helpers, and check exact results.

use std::sync::atomic::Ordering;
use weft_abi::{AgentThread, Frame, MapKind, Regs, ThreadSlot};
use weft_ir::*;
use weft_jit::{compile, Env, MapLayout};
use weft_runtime::layout::{Layout, LayoutBuilder, MapSpec};
use weft_runtime::map;
use weft_runtime::shm::Shm;

struct Exec {
    _mem: Vec<u64>,
    shm: Shm,
    layout: Layout,
    maps: Vec<MapLayout>,
    tstate: Box<AgentThread>,
    helpers: [u64; weft_abi::HELPER_COUNT],
}

fn spec_for(m: &MapDecl, p: &Program) -> MapSpec {
    let key_size = m.key.as_ref().map_or(0, |k| k.size());
    let vs = m.value.value_size();
    let max = p.config.max_map_keys;
    let (kind, signed) = match &m.value {
        MapValue::Plain(_) => (MapKind::Plain, false),
        MapValue::Count => (MapKind::Count, false),
        MapValue::Sum { signed } => (MapKind::Sum, *signed),
        MapValue::Min { signed } => (MapKind::Min, *signed),
        MapValue::Max { signed } => (MapKind::Max, *signed),
        MapValue::Avg { signed } => (MapKind::Avg, *signed),
        MapValue::Stats { signed } => (MapKind::Stats, *signed),
        MapValue::Hist { .. } => (MapKind::Hist, false),
        MapValue::Lhist { .. } => (MapKind::Lhist, true),
        MapValue::Tseries { signed, .. } => (MapKind::Tseries, *signed),
    };
    let mut s = if kind == MapKind::Plain {
        MapSpec::plain(key_size, vs, max)
    } else {
        MapSpec::agg(kind, signed, key_size, vs, max)
    };
    if let MapValue::Hist { k } = m.value {
        s.hist_k = u32::from(k);
    }
    if let MapValue::Lhist { min, max, step } = m.value {
        s.lhist = (min, max, step);
    }
    s
}

impl Exec {
    fn new(p: &Program) -> Exec {
        weft_runtime::safe::install_fault_handler().unwrap();
        let mut b = LayoutBuilder::new(2, 4096).max_sites(16);
        for m in &p.maps {
            b.add_map(spec_for(m, p));
        }
        let layout = b.finish();
        let mut mem = vec![0u64; (layout.total_size as usize).div_ceil(8)];
        let shm = unsafe { Shm::from_base(mem.as_mut_ptr() as *mut u8) };
        layout.write_header(&shm, 1);
        let maps = layout
            .maps
            .iter()
            .map(|(s, t, a, e)| MapLayout {
                kind: s.kind,
                capacity: s.capacity(),
                entry_size: *e,
                key_size: s.key_size,
                value_size: s.value_size,
                table_off: *t,
                agg_off: *a,
                hist_k: s.hist_k,
                signed: s.signed,
                thread_keyed: false,
                string_key: false,
            })
            .collect();
        let mut tstate: Box<AgentThread> = Box::new(unsafe { std::mem::zeroed() });
        tstate.tid = 4242;
        tstate.pid = 4240;
        Exec {
            _mem: mem,
            shm,
            layout,
            maps,
            tstate,
            helpers: weft_runtime::helpers::helper_table(),
        }
    }

    fn slot(&self) -> *mut ThreadSlot {
        self.shm.thread_slot(weft_abi::WEFT_SLOT)
    }

    /// Compile `f` and run it once with the given argument registers.
    fn run(&mut self, p: &Program, f: &Function, args: [u64; 6]) {
        let sym = |_: &weft_ir::SymbolRef| None;
        let env = Env {
            helpers: &self.helpers,
            maps: &self.maps,
            thread_agg_off: self.layout.agg_off,
            symbol: &sym,
            usdt_args: None,
        };
        let code = compile(f, p, &env).expect("compile");
        let exec = ExecMem::new(&code);
        let mut frame = Frame {
            regs: Regs {
                rdi: args[0],
                rsi: args[1],
                rdx: args[2],
                rcx: args[3],
                r8: args[4],
                r9: args[5],
                ..Regs::default()
            },
            thread: self.slot(),
            shm: self.shm.base(),
            site: u64::MAX,
            func: 0x1000,
            tstate: &mut *self.tstate as *mut AgentThread as *mut u8,
            probe: 7,
        };
        let func: extern "C" fn(*mut Frame) = unsafe { std::mem::transmute(exec.ptr) };
        func(&mut frame);
    }

    fn scalar(&self, map: u32) -> u64 {
        let d = self.shm.map(map);
        let i = map::find(&self.shm, d, &[]).expect("entry");
        if d.kind == MapKind::Plain as u32 {
            unsafe { (map::plain_value_ptr(&self.shm, d, i) as *const u64).read() }
        } else {
            map::merged_scalar(&self.shm, d, i)
        }
    }

    fn keyed(&self, map: u32, key: u64) -> Option<u64> {
        let d = self.shm.map(map);
        let i = map::find(&self.shm, d, &key.to_le_bytes())?;
        Some(map::merged_scalar(&self.shm, d, i))
    }

    fn error(&self, kind: ErrorKind) -> u64 {
        unsafe { (*self.slot()).errors[kind as usize].load(Ordering::Relaxed) }
    }
}

struct ExecMem {
    ptr: *mut u8,
    len: usize,
}

impl ExecMem {
    fn new(code: &[u8]) -> ExecMem {
        let len = code.len().div_ceil(4096) * 4096;
        unsafe {
            let p = libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            ) as *mut u8;
            std::ptr::copy_nonoverlapping(code.as_ptr(), p, code.len());
            assert_eq!(
                libc::mprotect(p as *mut _, len, libc::PROT_READ | libc::PROT_EXEC),
                0
            );
            ExecMem { ptr: p, len }
        }
    }
}

impl Drop for ExecMem {
    fn drop(&mut self) {
        unsafe { libc::munmap(self.ptr as *mut _, self.len) };
    }
}

fn program(maps: Vec<MapDecl>) -> Program {
    Program {
        maps,
        ..Program::default()
    }
}

fn scalar_map(name: &str, value: MapValue) -> MapDecl {
    MapDecl {
        name: name.into(),
        key: None,
        value,
    }
}

#[test]
fn arithmetic_into_plain_map() {
    // @x = arg0 * 3 + 7 - arg1 / 2
    let p = program(vec![scalar_map("@x", MapValue::Plain(Type::I64))]);
    let mut f = Function::default();
    let (a0, a1, t) = (f.new_reg(), f.new_reg(), f.new_reg());
    let (c3, c7, c2, r) = (f.new_reg(), f.new_reg(), f.new_reg(), f.new_reg());
    f.push(Inst::Ctx {
        dst: a0,
        value: CtxValue::Arg(0),
    });
    f.push(Inst::Ctx {
        dst: a1,
        value: CtxValue::Arg(1),
    });
    f.push(Inst::Const { dst: c3, value: 3 });
    f.push(Inst::Const { dst: c7, value: 7 });
    f.push(Inst::Const { dst: c2, value: 2 });
    f.push(Inst::Binary {
        op: BinOp::Mul,
        dst: t,
        a: a0,
        b: c3,
    });
    f.push(Inst::Binary {
        op: BinOp::Add,
        dst: t,
        a: t,
        b: c7,
    });
    f.push(Inst::Binary {
        op: BinOp::DivS,
        dst: r,
        a: a1,
        b: c2,
    });
    f.push(Inst::Binary {
        op: BinOp::Sub,
        dst: t,
        a: t,
        b: r,
    });
    f.push(Inst::MapStore {
        map: MapId(0),
        key: None,
        src_reg: Some(t),
        src_place: None,
    });
    let mut x = Exec::new(&p);
    x.run(&p, &f, [10, 9, 0, 0, 0, 0]);
    assert_eq!(x.scalar(0), 10 * 3 + 7 - 4);
    x.run(&p, &f, [(-5i64) as u64, (-9i64) as u64, 0, 0, 0, 0]);
    assert_eq!(x.scalar(0) as i64, -15 + 7 + 4);
}

#[test]
fn count_inline_and_sum() {
    let p = program(vec![
        scalar_map("@c", MapValue::Count),
        scalar_map("@s", MapValue::Sum { signed: false }),
    ]);
    let mut f = Function::default();
    let a0 = f.new_reg();
    f.push(Inst::Ctx {
        dst: a0,
        value: CtxValue::Arg(0),
    });
    f.push(Inst::MapAgg {
        map: MapId(0),
        key: None,
        op: AggOp::Count,
    });
    f.push(Inst::MapAgg {
        map: MapId(1),
        key: None,
        op: AggOp::Sum(a0),
    });
    let mut x = Exec::new(&p);
    for i in 0..1000u64 {
        x.run(&p, &f, [i, 0, 0, 0, 0, 0]);
    }
    assert_eq!(x.scalar(0), 1000);
    assert_eq!(x.scalar(1), 999 * 1000 / 2);
}

#[test]
fn hist_inline_buckets() {
    let p = program(vec![scalar_map("@h", MapValue::Hist { k: 0 })]);
    let mut f = Function::default();
    let a0 = f.new_reg();
    f.push(Inst::Ctx {
        dst: a0,
        value: CtxValue::Arg(0),
    });
    f.push(Inst::MapAgg {
        map: MapId(0),
        key: None,
        op: AggOp::Hist(a0),
    });
    let mut x = Exec::new(&p);
    let vals: [i64; 8] = [-3, 0, 1, 2, 3, 4, 1023, 1024];
    for v in vals {
        x.run(&p, &f, [v as u64, 0, 0, 0, 0, 0]);
    }
    let d = x.shm.map(0);
    let i = map::find(&x.shm, d, &[]).unwrap();
    let mut out = vec![0u8; d.value_size as usize];
    map::merge(&x.shm, d, i, &mut out);
    let b = |k: usize| u64::from_le_bytes(out[k * 8..k * 8 + 8].try_into().unwrap());
    for v in vals {
        let idx = weft_abi::hist_index(v, 0);
        assert!(b(idx) >= 1, "bucket of {v}");
    }
    assert_eq!(
        (b(0), b(1), b(2), b(3), b(4), b(11), b(12)),
        (1, 1, 1, 2, 1, 1, 1)
    );
}

#[test]
fn keyed_count_via_helper_and_branch() {
    // if (arg0 > 5) { @[arg0 % 3] = count() }
    let p = Program {
        maps: vec![MapDecl {
            name: "@".into(),
            key: Some(Type::U64),
            value: MapValue::Count,
        }],
        ..Program::default()
    };
    let mut f = Function::default();
    let (a0, c5, c3, cond, k) = (
        f.new_reg(),
        f.new_reg(),
        f.new_reg(),
        f.new_reg(),
        f.new_reg(),
    );
    let key = f.new_slot(8);
    let (yes, no) = (f.new_label(), f.new_label());
    f.push(Inst::Ctx {
        dst: a0,
        value: CtxValue::Arg(0),
    });
    f.push(Inst::Const { dst: c5, value: 5 });
    f.push(Inst::Const { dst: c3, value: 3 });
    f.push(Inst::Binary {
        op: BinOp::GtU,
        dst: cond,
        a: a0,
        b: c5,
    });
    f.push(Inst::Branch {
        cond,
        if_true: yes,
        if_false: no,
    });
    f.push(Inst::Label(yes));
    f.push(Inst::Binary {
        op: BinOp::ModU,
        dst: k,
        a: a0,
        b: c3,
    });
    f.push(Inst::Store {
        place: Place::new(key, 0),
        src: k,
        size: 8,
    });
    f.push(Inst::MapAgg {
        map: MapId(0),
        key: Some(Place::new(key, 0)),
        op: AggOp::Count,
    });
    f.push(Inst::Label(no));
    let mut x = Exec::new(&p);
    for i in 0..30u64 {
        x.run(&p, &f, [i, 0, 0, 0, 0, 0]);
    }
    // 6..29: 24 values; residues 0,1,2 each 8 times.
    assert_eq!(x.keyed(0, 0), Some(8));
    assert_eq!(x.keyed(0, 1), Some(8));
    assert_eq!(x.keyed(0, 2), Some(8));
    assert_eq!(x.keyed(0, 3), None);
}

#[test]
fn division_edge_cases_never_trap() {
    let p = program(vec![
        scalar_map("@a", MapValue::Plain(Type::I64)),
        scalar_map("@b", MapValue::Plain(Type::I64)),
        scalar_map("@c", MapValue::Plain(Type::I64)),
    ]);
    let mut f = Function::default();
    let (a0, a1, q, r, z) = (
        f.new_reg(),
        f.new_reg(),
        f.new_reg(),
        f.new_reg(),
        f.new_reg(),
    );
    f.push(Inst::Ctx {
        dst: a0,
        value: CtxValue::Arg(0),
    });
    f.push(Inst::Ctx {
        dst: a1,
        value: CtxValue::Arg(1),
    });
    f.push(Inst::Binary {
        op: BinOp::DivS,
        dst: q,
        a: a0,
        b: a1,
    });
    f.push(Inst::Binary {
        op: BinOp::ModS,
        dst: r,
        a: a0,
        b: a1,
    });
    f.push(Inst::Const { dst: z, value: 0 });
    f.push(Inst::Binary {
        op: BinOp::DivU,
        dst: z,
        a: a0,
        b: z,
    });
    f.push(Inst::MapStore {
        map: MapId(0),
        key: None,
        src_reg: Some(q),
        src_place: None,
    });
    f.push(Inst::MapStore {
        map: MapId(1),
        key: None,
        src_reg: Some(r),
        src_place: None,
    });
    f.push(Inst::MapStore {
        map: MapId(2),
        key: None,
        src_reg: Some(z),
        src_place: None,
    });
    let mut x = Exec::new(&p);
    x.run(&p, &f, [i64::MIN as u64, (-1i64) as u64, 0, 0, 0, 0]);
    assert_eq!(x.scalar(0) as i64, i64::MIN);
    assert_eq!(x.scalar(1), 0);
    // Division by zero gives 1, as upstream bpftrace ("1 is being used as the
    // result"), and is counted.
    assert_eq!(x.scalar(2), 1);
    assert_eq!(x.error(ErrorKind::DivZero), 1);
    x.run(&p, &f, [(-7i64) as u64, 2, 0, 0, 0, 0]);
    assert_eq!((x.scalar(0) as i64, x.scalar(1) as i64), (-3, -1));
}

#[test]
fn str_read_faults_and_printf_event() {
    // printf("%s %d\n", str(arg0), tid) -- payload: (string[16], u64)
    let fmt = Format::new("%s %d\n".into(), vec![Type::Str { cap: 16 }, Type::U64]);
    let p = Program {
        formats: vec![fmt],
        ..Program::default()
    };
    let tuple = Type::Tuple(vec![Type::Str { cap: 16 }, Type::U64]);
    let offs = tuple.field_offsets();
    let mut f = Function::default();
    let (a0, t) = (f.new_reg(), f.new_reg());
    let s = f.new_slot(tuple.size());
    f.push(Inst::Ctx {
        dst: a0,
        value: CtxValue::Arg(0),
    });
    f.push(Inst::ReadStr {
        dst: Place::new(s, offs[0]),
        addr: a0,
        max: None,
        cap: 16,
    });
    f.push(Inst::Ctx {
        dst: t,
        value: CtxValue::Tid,
    });
    f.push(Inst::Store {
        place: Place::new(s, offs[1]),
        src: t,
        size: 8,
    });
    f.push(Inst::Emit {
        kind: EventKind::Printf(FmtId(0)),
        payload: Some(Place::new(s, 0)),
        len: tuple.size(),
    });
    let mut x = Exec::new(&p);
    let text = b"hello, world, this is long\0";
    x.run(&p, &f, [text.as_ptr() as u64, 0, 0, 0, 0, 0]);
    x.run(&p, &f, [8, 0, 0, 0, 0, 0]); // bad pointer: empty string, fault counted
    let mut ev = Vec::new();
    unsafe {
        weft_runtime::ring::consume(x.slot(), x.shm.ring(x.slot()), x.layout.ring_size, &mut ev);
    }
    assert_eq!(ev.len(), 2);
    assert_eq!(ev[0].header.kind, weft_abi::EVENT_PRINTF);
    assert_eq!(&ev[0].payload[..16], b"hello, world, t\0");
    assert_eq!(
        u64::from_le_bytes(ev[0].payload[16..24].try_into().unwrap()),
        4242
    );
    assert_eq!(&ev[1].payload[..16], &[0u8; 16]);
    assert_eq!(x.error(ErrorKind::ReadFault), 1);
}

/// `printf("%s\n", str(arg0, arg1))` as the front end lowers it (bpftrace's default
/// 64-byte string), and what the printer makes of each event: the printed string,
/// and the raw 64 payload bytes.
struct StrPrintf {
    p: Program,
    f: Function,
}

impl StrPrintf {
    fn new() -> StrPrintf {
        let ty = Type::Str { cap: 64 };
        let p = Program {
            formats: vec![Format::new("%s\n".into(), vec![ty.clone()])],
            ..Program::default()
        };
        let mut f = Function::default();
        let (a0, a1) = (f.new_reg(), f.new_reg());
        let s = f.new_slot(ty.size());
        f.push(Inst::Ctx {
            dst: a0,
            value: CtxValue::Arg(0),
        });
        f.push(Inst::Ctx {
            dst: a1,
            value: CtxValue::Arg(1),
        });
        f.push(Inst::ReadStr {
            dst: Place::new(s, 0),
            addr: a0,
            max: Some(a1),
            cap: 64,
        });
        f.push(Inst::Emit {
            kind: EventKind::Printf(FmtId(0)),
            payload: Some(Place::new(s, 0)),
            len: 64,
        });
        StrPrintf { p, f }
    }

    /// Run once on (`addr`, `max`): the printed line and the payload.
    fn run(&self, x: &mut Exec, addr: u64, max: u64) -> (Vec<u8>, Vec<u8>) {
        x.run(&self.p, &self.f, [addr, max, 0, 0, 0, 0]);
        let mut ev = Vec::new();
        // SAFETY: the slot and ring of x's segment; this test is its only consumer.
        unsafe {
            weft_runtime::ring::consume(
                x.slot(),
                x.shm.ring(x.slot()),
                x.layout.ring_size,
                &mut ev,
            );
        }
        assert_eq!(ev.len(), 1);
        let fmt = &self.p.formats[0];
        let line = weft_output::format_printf(fmt, &ev[0].payload, &NoSymbols);
        (line, ev[0].payload.clone())
    }
}

struct NoSymbols;

impl weft_output::Resolver for NoSymbols {
    fn usym(&self, _: u64) -> Option<weft_output::Symbol> {
        None
    }
    fn probe_name(&self, id: u64) -> String {
        format!("probe{id}")
    }
    fn format(&self, _: FmtId) -> Option<&Format> {
        None
    }
}

/// Issue 24: a string read must never print more than 63 bytes (+ NUL), whatever
/// the string: one running into an inaccessible page right at, before or after the
/// limit, any `str(p, n)` length, including 0 and "negative" ones.
#[test]
fn str_reads_stop_at_the_limit_and_at_inaccessible_pages() {
    let sp = StrPrintf::new();
    let mut x = Exec::new(&sp.p);
    // Two pages of 'a' with no NUL; the second is then made inaccessible (PROT_NONE
    // rather than unmapped, so that no later mapping, such as the advice's code,
    // lands there).
    // SAFETY: mapping and protecting anonymous memory of our own.
    let page = unsafe {
        let p = libc::mmap(
            std::ptr::null_mut(),
            8192,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        ) as *mut u8;
        assert_ne!(p as *mut libc::c_void, libc::MAP_FAILED);
        std::ptr::write_bytes(p, b'a', 8192);
        assert_eq!(
            libc::mprotect(p.add(4096) as *mut _, 4096, libc::PROT_NONE),
            0
        );
        p as u64
    };
    let end = page + 4096;
    let mut faults = 0;
    for len in [1u64, 2, 61, 62, 63, 64, 65, 100, 4096] {
        let (line, payload) = sp.run(&mut x, end - len, u64::MAX);
        let want = len.min(63) as usize;
        assert_eq!(
            line,
            [&vec![b'a'; want][..], b"\n"].concat(),
            "{len} bytes before the hole"
        );
        assert!(payload[want..].iter().all(|&b| b == 0), "{len}: NUL-padded");
        // The bytes up to the hole are all there is: a fault, counted, when the limit
        // was not reached first.
        if len < 63 {
            faults += 1;
        }
        assert_eq!(
            x.error(ErrorKind::ReadFault),
            faults,
            "{len} bytes before the hole"
        );
    }
    let long = [b'a'; 1000];
    for (max, want) in [
        (0u64, 0usize),
        (1, 1),
        (62, 62),
        (63, 63),
        (64, 63),
        (1000, 63),
        (1 << 32, 63),
        (1 << 63, 63),
        (-1i64 as u64, 63),
        (-64i64 as u64, 63),
    ] {
        let (line, payload) = sp.run(&mut x, long.as_ptr() as u64, max);
        assert_eq!(
            line,
            [&vec![b'a'; want][..], b"\n"].concat(),
            "str(p, {max})"
        );
        assert!(
            payload[want..].iter().all(|&b| b == 0),
            "str(p, {max}): NUL-padded"
        );
    }
    assert_eq!(x.error(ErrorKind::ReadFault), faults);
    // SAFETY: unmapping the pages mapped above.
    unsafe { libc::munmap(page as *mut _, 8192) };
}

/// Issue 24: a string that another thread rewrites while advice reads it (as a
/// target's own threads may) is read as some mix of its states, never longer than
/// the limit and always NUL-terminated.
#[test]
fn str_reads_of_a_string_changing_underneath() {
    use std::sync::atomic::{AtomicBool, AtomicU8};
    use std::sync::Arc;
    let sp = StrPrintf::new();
    let mut x = Exec::new(&sp.p);
    // 1000 bytes: the writer moves a NUL through them and rewrites the rest with 'a'
    // or 'b', so the reader sees strings of every length, changing under it.
    let buf: Arc<Vec<AtomicU8>> = Arc::new((0..1001).map(|_| AtomicU8::new(b'a')).collect());
    buf[1000].store(0, Ordering::Relaxed);
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (buf, stop) = (buf.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut round = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let nul = (round * 7) as usize % 130;
                let fill = if round & 1 == 0 { b'a' } else { b'b' };
                for (i, b) in buf[..1000].iter().enumerate() {
                    b.store(if i == nul { 0 } else { fill }, Ordering::Relaxed);
                }
                round += 1;
            }
            round
        })
    };
    let addr = buf.as_ptr() as u64;
    let mut lengths = std::collections::BTreeSet::new();
    for _ in 0..3000 {
        let (line, payload) = sp.run(&mut x, addr, u64::MAX);
        let s = &line[..line.len() - 1];
        assert_eq!(line.last(), Some(&b'\n'));
        assert!(
            s.len() <= 63,
            "{} bytes: {:?}",
            s.len(),
            String::from_utf8_lossy(s)
        );
        assert!(s.iter().all(|&b| b == b'a' || b == b'b'), "{s:?}");
        assert!(payload[s.len()..].iter().all(|&b| b == 0), "NUL-padded");
        lengths.insert(s.len());
    }
    stop.store(true, Ordering::Relaxed);
    let rounds = writer.join().unwrap();
    assert!(rounds > 0);
    assert_eq!(x.error(ErrorKind::ReadFault), 0);
    assert!(lengths.iter().all(|&l| l <= 63), "{lengths:?}");
}

/// `ThreadSum` reads this thread's own accumulator of a sum map: what this thread
/// added, not what the map holds over every thread (a retired thread's 100 here).
#[test]
fn thread_sum_reads_only_this_threads_accumulator() {
    let p = program(vec![
        scalar_map("@s", MapValue::Sum { signed: true }),
        scalar_map("@mine", MapValue::Plain(Type::I64)),
    ]);
    let mut f = Function::default();
    let (a0, mine) = (f.new_reg(), f.new_reg());
    f.push(Inst::Ctx {
        dst: a0,
        value: CtxValue::Arg(0),
    });
    f.push(Inst::MapAgg {
        map: MapId(0),
        key: None,
        op: AggOp::Sum(a0),
    });
    f.push(Inst::ThreadSum {
        dst: mine,
        map: MapId(0),
    });
    f.push(Inst::MapStore {
        map: MapId(1),
        key: None,
        src_reg: Some(mine),
        src_place: None,
    });
    let mut x = Exec::new(&p);
    x.run(&p, &f, [5, 0, 0, 0, 0, 0]);
    x.run(&p, &f, [7, 0, 0, 0, 0, 0]);
    assert_eq!(x.scalar(1), 12);
    // Another slot's accumulator (the retired threads') counts in the map's value
    // only.
    let other = x.shm.agg_area(x.shm.thread_slot(0));
    // SAFETY: the map's accumulator in slot 0's aggregation area, in our segment.
    unsafe { (other.add(x.maps[0].agg_off as usize) as *mut u64).write(100) };
    x.run(&p, &f, [(-2i64) as u64, 0, 0, 0, 0, 0]);
    assert_eq!(x.scalar(1), 10);
    assert_eq!(x.scalar(0), 110);
}
