//! Patch a real function in this process with a jump to a trampoline built by
//! `entry_head` + `weft_x86::relocate`, call it, and check both its results and what
//! the advice counted.

use std::arch::{asm, global_asm};
use weft_abi::{AgentThread, MapKind, ThreadAttach};
use weft_ir::*;
use weft_jit::trampoline::{entry_head, EntryTrampoline};
use weft_jit::{compile, Env, MapLayout};
use weft_runtime::layout::{LayoutBuilder, MapSpec};
use weft_runtime::map;
use weft_runtime::shm::Shm;

global_asm!(
    ".section .tbss,\"awT\",@nobits",
    ".p2align 3",
    ".globl weft_test_tls",
    ".hidden weft_test_tls",
    "weft_test_tls: .zero 8",
    ".text",
);

fn tls_offset() -> i64 {
    let off: i64;
    unsafe { asm!("mov {}, qword ptr [rip + weft_test_tls@GOTTPOFF]", out(reg) off) };
    off
}

fn set_tls(v: u64) {
    let off = tls_offset();
    unsafe { asm!("mov qword ptr fs:[{}], {}", in(reg) off, in(reg) v) };
}

static mut SLOT: u64 = 0;

extern "C" fn attach(_f: *mut weft_abi::Frame) -> ThreadAttach {
    let t: &'static mut AgentThread = Box::leak(Box::new(unsafe { std::mem::zeroed() }));
    t.tid = 77;
    t.slot = unsafe { SLOT } as *mut _;
    set_tls(t as *mut AgentThread as u64);
    ThreadAttach {
        thread: t,
        slot: t.slot,
    }
}

/// endbr64; lea rax,[rdi+rdi]; add rax,rsi; ret   -- f(a, b) = 2a + b
const FUNC: [u8; 12] = [
    0xf3, 0x0f, 0x1e, 0xfa, 0x48, 0x8d, 0x04, 0x3f, 0x48, 0x01, 0xf0, 0xc3,
];

#[test]
fn patched_function_runs_advice_and_keeps_its_result() {
    weft_runtime::safe::install_fault_handler().unwrap();
    // Segment with @c = count() and @s = sum(arg0 + arg1).
    let mut b = LayoutBuilder::new(2, 4096).max_sites(4);
    b.add_map(MapSpec::agg(MapKind::Count, false, 0, 8, 16));
    b.add_map(MapSpec::agg(MapKind::Sum, false, 0, 8, 16));
    let layout = b.finish();
    let mut mem = vec![0u64; (layout.total_size as usize).div_ceil(8)];
    let shm = unsafe { Shm::from_base(mem.as_mut_ptr() as *mut u8) };
    layout.write_header(&shm, 1);
    // SAFETY: set once, before any thread reads it.
    unsafe { SLOT = shm.thread_slot(weft_abi::WEFT_SLOT) as u64 };

    let prog = Program {
        maps: vec![
            MapDecl {
                name: "@c".into(),
                key: None,
                value: MapValue::Count,
            },
            MapDecl {
                name: "@s".into(),
                key: None,
                value: MapValue::Sum { signed: false },
            },
        ],
        ..Program::default()
    };
    let mut f = Function::default();
    let (a0, a1, s) = (f.new_reg(), f.new_reg(), f.new_reg());
    f.push(Inst::Ctx {
        dst: a0,
        value: CtxValue::Arg(0),
    });
    f.push(Inst::Ctx {
        dst: a1,
        value: CtxValue::Arg(1),
    });
    f.push(Inst::Binary {
        op: BinOp::Add,
        dst: s,
        a: a0,
        b: a1,
    });
    f.push(Inst::MapAgg {
        map: MapId(0),
        key: None,
        op: AggOp::Count,
    });
    f.push(Inst::MapAgg {
        map: MapId(1),
        key: None,
        op: AggOp::Sum(s),
    });
    let maps: Vec<MapLayout> = layout
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
            hist_k: 0,
            signed: s.signed,
            thread_keyed: false,
            string_key: false,
        })
        .collect();
    let helpers = weft_runtime::helpers::helper_table();
    let sym = |_: &weft_ir::SymbolRef| None;
    let env = Env {
        helpers: &helpers,
        maps: &maps,
        thread_agg_off: layout.agg_off,
        symbol: &sym,
        usdt_args: None,
    };
    let advice = compile(&f, &prog, &env).unwrap();

    // One RWX-free region: page 0 = function, page 1 = advice, page 2 = trampoline.
    let region = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            3 * 4096,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        ) as *mut u8
    };
    let base = region as u64;
    let (func_addr, advice_addr, tramp_addr) = (base, base + 4096, base + 8192);
    let code = weft_x86::FunctionCode {
        addr: func_addr,
        bytes: FUNC.to_vec(),
        size_known: true,
        padding: Vec::new(),
    };
    let plan = weft_x86::plan_site(&code, func_addr);
    assert!(
        matches!(plan, weft_x86::SitePlan::Jump { patch_addr, .. } if patch_addr == func_addr + 4),
        "{plan:?}"
    );
    let head = entry_head(&EntryTrampoline {
        site_addr: plan.patch_addr().unwrap(),
        func: func_addr,
        site_index: 0,
        calls: vec![(advice_addr, 0)],
        hijack: None,
        around: None,
        at_entry: true,
        shm_base: shm.base() as u64,
        tls_offset: tls_offset(),
        thread_attach: attach as *const () as u64,
        unconditional: false,
        return_site: false,
        data: None,
    })
    .unwrap();
    let reloc = weft_x86::relocate(&plan, tramp_addr + head.len() as u64, true).unwrap();
    let patch = weft_x86::patch_bytes(&plan, tramp_addr).unwrap();
    unsafe {
        std::ptr::copy_nonoverlapping(FUNC.as_ptr(), region, FUNC.len());
        std::ptr::copy_nonoverlapping(advice.as_ptr(), region.add(4096), advice.len());
        std::ptr::copy_nonoverlapping(head.as_ptr(), region.add(8192), head.len());
        std::ptr::copy_nonoverlapping(reloc.as_ptr(), region.add(8192 + head.len()), reloc.len());
        std::ptr::copy_nonoverlapping(patch.as_ptr(), region.add(4), patch.len());
        assert_eq!(
            libc::mprotect(
                region as *mut _,
                3 * 4096,
                libc::PROT_READ | libc::PROT_EXEC
            ),
            0
        );
    }
    let func: extern "C" fn(i64, i64) -> i64 = unsafe { std::mem::transmute(func_addr) };
    let mut expect_sum = 0u64;
    for i in 0..100i64 {
        assert_eq!(
            func(i, 3),
            2 * i + 3,
            "the function still computes its result"
        );
        expect_sum += (i + 3) as u64;
    }
    let read = |m: u32| {
        let d = shm.map(m);
        map::merged_scalar(&shm, d, map::find(&shm, d, &[]).unwrap())
    };
    assert_eq!(read(0), 100);
    assert_eq!(read(1), expect_sum);

    // Re-entrancy guard: while the thread is "inside advice", hits are skipped.
    let t = {
        let off = tls_offset();
        let v: u64;
        unsafe { asm!("mov {}, qword ptr fs:[{}]", out(reg) v, in(reg) off) };
        v as *mut AgentThread
    };
    unsafe { (*t).nest = 1 };
    assert_eq!(func(1, 1), 3);
    unsafe { (*t).nest = 0 };
    assert_eq!(read(0), 100);
    assert_eq!(func(1, 1), 3);
    assert_eq!(read(0), 101);
}

#[test]
fn templated_heads_equal_directly_assembled_ones() {
    // Instantiating the cached template must give exactly the bytes a fresh
    // assembly of the same head gives, for every shape.
    for at_entry in [true, false] {
        for calls in 0..3usize {
            for (hijack, around) in [None, Some(0x7f00_0000_1234u64)]
                .into_iter()
                .flat_map(|h| [(h, None), (h, Some((0x7f11_4455_0000u64, 3u32)))])
                .filter(|(_, around)| at_entry || around.is_none())
            {
                for (site, func, index) in [
                    (0x401000u64, 0x401000u64, 0u32),
                    (0x5555_5555_1234, 0x5555_5555_1230, 77),
                ] {
                    let t = EntryTrampoline {
                        site_addr: site,
                        func,
                        site_index: index,
                        calls: (0..calls)
                            .map(|i| (0x7f11_2233_0000 + i as u64 * 64, 9 + i as u32))
                            .collect(),
                        hijack,
                        around,
                        at_entry,
                        shm_base: 0x7fee_0000_0000,
                        tls_offset: -200,
                        thread_attach: 0x7f55_0000_0000,
                        unconditional: false,
                        return_site: false,
                        data: None,
                    };
                    let a = entry_head(&t).unwrap();
                    let b = weft_jit::trampoline::assemble_entry_head(&t).unwrap();
                    assert_eq!(a, b, "template instance differs from a direct assembly");
                    // A different site of the same shape differs only in its constants.
                    let mut t2 = t.clone();
                    t2.site_addr += 16;
                    let c = entry_head(&t2).unwrap();
                    assert_eq!(a.len(), c.len());
                    assert_eq!(
                        a.iter().zip(&c).filter(|(x, y)| x != y).count(),
                        1,
                        "only the site address byte changed"
                    );
                }
            }
        }
    }
}

#[test]
fn templated_access_heads_equal_directly_assembled_ones() {
    for size in [1u32, 2, 4, 8] {
        for write_back in [false, true] {
            for (site, var) in [
                (0x401000u64, 0x404010u64),
                (0x5555_5555_1234, 0x5555_5556_0008),
            ] {
                let t = EntryTrampoline {
                    site_addr: site,
                    func: site - 4,
                    site_index: 5,
                    calls: vec![(0x7f11_2233_0000, 9)],
                    hijack: None,
                    around: None,
                    at_entry: false,
                    shm_base: 0x7fee_0000_0000,
                    tls_offset: -200,
                    thread_attach: 0x7f55_0000_0000,
                    unconditional: false,
                    return_site: false,
                    data: Some(weft_jit::trampoline::DataHead {
                        var,
                        size,
                        write_back,
                    }),
                };
                let a = entry_head(&t).unwrap();
                let b = weft_jit::trampoline::assemble_entry_head(&t).unwrap();
                assert_eq!(a, b, "template instance differs from a direct assembly");
            }
        }
    }
}
