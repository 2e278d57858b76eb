//! The fixed patch sequences: `jmp rel32`, `call rel32`, `int3`, and the bytes written
//! for a plan.

mod common;

use common::{asm, func};
use weft_x86::{call_rel32, jmp_rel32, patch_bytes, plan_site, Reason, SitePlan, X86Error, INT3};

#[test]
fn jmp_rel32_backward_and_forward() {
    // jmp 0x1000 (from 0x2000)
    assert_eq!(
        jmp_rel32(0x2000, 0x1000).unwrap(),
        [0xe9, 0xfb, 0xef, 0xff, 0xff]
    );
    // jmp 0x40001000 (from 0x1000)
    assert_eq!(
        jmp_rel32(0x1000, 0x4000_1000).unwrap(),
        [0xe9, 0xfb, 0xff, 0xff, 0x3f]
    );
    // jmp 0x1005 (from 0x1000): the next instruction
    assert_eq!(
        jmp_rel32(0x1000, 0x1005).unwrap(),
        [0xe9, 0x00, 0x00, 0x00, 0x00]
    );
    assert_eq!(
        asm(&jmp_rel32(0x2000, 0x1000).unwrap(), 0x2000),
        "jmp 0x1000"
    );
}

#[test]
fn call_rel32_forward() {
    // call 0x2000 (from 0x1000)
    assert_eq!(
        call_rel32(0x1000, 0x2000).unwrap(),
        [0xe8, 0xfb, 0x0f, 0x00, 0x00]
    );
    assert_eq!(
        asm(&call_rel32(0x1000, 0x2000).unwrap(), 0x1000),
        "call 0x2000"
    );
}

#[test]
fn rel32_range_edges() {
    let from = 0x7f00_0000_0000u64;
    let next = from + 5;
    // jmp next+0x7fffffff: the farthest forward target
    assert_eq!(
        jmp_rel32(from, next + i32::MAX as u64).unwrap(),
        [0xe9, 0xff, 0xff, 0xff, 0x7f]
    );
    // jmp next-0x80000000: the farthest backward target
    assert_eq!(
        jmp_rel32(from, next - 0x8000_0000).unwrap(),
        [0xe9, 0x00, 0x00, 0x00, 0x80]
    );
    assert_eq!(
        jmp_rel32(from, next + 0x8000_0000),
        Err(X86Error::OutOfRange {
            from,
            to: next + 0x8000_0000
        })
    );
    assert_eq!(
        call_rel32(from, next - 0x8000_0001),
        Err(X86Error::OutOfRange {
            from,
            to: next - 0x8000_0001
        })
    );
    // Wrapping around the address space is not a way in.
    assert!(jmp_rel32(0xffff_ffff_ffff_fff0, 0x10).is_err());
}

#[test]
fn patch_bytes_for_jump_pads_with_int3() {
    // endbr64; push rbp; mov rbp, rsp; mov dword ptr [rbp-4], edi; pop rbp; ret
    let f = func(
        0x401126,
        &[
            0xf3, 0x0f, 0x1e, 0xfa, 0x55, 0x48, 0x89, 0xe5, 0x89, 0x7d, 0xfc, 0x5d, 0xc3,
        ],
    );
    let plan = plan_site(&f, 0x401126);
    // jmp 0x40400000 (from 0x40112a); int3; int3
    let patch = patch_bytes(&plan, 0x4040_0000).unwrap();
    assert_eq!(patch, [0xe9, 0xd1, 0xee, 0xff, 0x3f, 0xcc, 0xcc]);
    assert_eq!(asm(&patch, 0x40112a), "jmp 0x40400000; int3; int3");
    // What unweave writes back: push rbp; mov rbp, rsp; mov dword ptr [rbp-4], edi
    assert_eq!(
        plan.original_bytes(),
        [0x55, 0x48, 0x89, 0xe5, 0x89, 0x7d, 0xfc]
    );
    assert_eq!(
        patch_bytes(&plan, 0x1_4040_0000),
        Err(X86Error::OutOfRange {
            from: 0x40112a,
            to: 0x1_4040_0000
        })
    );
}

#[test]
fn patch_bytes_for_int3_and_refused() {
    // xor eax, eax; ret
    let plan = plan_site(&func(0x1000, &[0x31, 0xc0, 0xc3]), 0x1000);
    // int3
    assert_eq!(patch_bytes(&plan, 0xdead_0000).unwrap(), [INT3]);
    assert_eq!(INT3, 0xcc);
    // xor eax, eax (first byte)
    assert_eq!(plan.original_bytes(), [0x31]);

    let refused = SitePlan::Refused {
        reason: Reason::DecodeError { at: 0x1000 },
    };
    assert_eq!(
        patch_bytes(&refused, 0x2000),
        Err(X86Error::Refused(Reason::DecodeError { at: 0x1000 }))
    );
    assert!(refused.original_bytes().is_empty());
}
