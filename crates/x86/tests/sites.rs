//! Site plans and relocated code for hand-written prologues, byte for byte.
//!
//! Conventions: functions sit at 0x401000-ish (non-PIE) or 0x5555_5555_5000 (PIE);
//! `T` is where the relocated code goes, 1 GiB away, so every relative operand must be
//! rewritten.

mod common;

use common::{asm, func};
use weft_x86::{plan_site, relocate, FunctionCode, Reason, SitePlan, X86Error};

const GIB: u64 = 0x4000_0000;

fn expect_jump(plan: &SitePlan) -> (u64, usize) {
    match plan {
        SitePlan::Jump {
            patch_addr,
            displaced_len,
            ..
        } => (*patch_addr, *displaced_len),
        other => panic!("expected a jump plan, got {other:?}"),
    }
}

// ---------------------------------------------------------------------------------
// Jump sites

#[test]
fn gcc_o0_cf_protection_prologue_skips_endbr64() {
    // 0x401126: endbr64
    // 0x40112a: push rbp
    // 0x40112b: mov rbp, rsp
    // 0x40112e: mov dword ptr [rbp-4], edi
    // 0x401131: mov eax, dword ptr [rbp-4]
    // 0x401134: imul eax, eax
    // 0x401137: pop rbp
    // 0x401138: ret
    let f = func(
        0x401126,
        &[
            0xf3, 0x0f, 0x1e, 0xfa, 0x55, 0x48, 0x89, 0xe5, 0x89, 0x7d, 0xfc, 0x8b, 0x45, 0xfc,
            0x0f, 0xaf, 0xc0, 0x5d, 0xc3,
        ],
    );
    let plan = plan_site(&f, 0x401126);
    assert_eq!(
        plan,
        SitePlan::Jump {
            patch_addr: 0x40112a,
            displaced_len: 7,
            displaced: vec![0x55, 0x48, 0x89, 0xe5, 0x89, 0x7d, 0xfc],
            padding: 0,
            skipped_endbr: true,
        }
    );
    let t = 0x4040_0000;
    let code = relocate(&plan, t, true).unwrap();
    // push rbp; mov rbp, rsp; mov dword ptr [rbp-4], edi; jmp 0x401131
    assert_eq!(
        code,
        [0x55, 0x48, 0x89, 0xe5, 0x89, 0x7d, 0xfc, 0xe9, 0x25, 0x11, 0x00, 0xc0]
    );
    assert_eq!(
        asm(&code, t),
        "push rbp; mov rbp, rsp; mov dword ptr [rbp-4], edi; jmp 0x401131"
    );
    // Without the jump back: only the displaced instructions.
    assert_eq!(
        relocate(&plan, t, false).unwrap(),
        [0x55, 0x48, 0x89, 0xe5, 0x89, 0x7d, 0xfc]
    );
}

#[test]
fn gcc_o0_prologue_without_endbr64() {
    // 0x401000: push rbp; mov rbp, rsp; sub rsp, 0x10; ...; leave; ret
    let f = func(
        0x401000,
        &[
            0x55, 0x48, 0x89, 0xe5, 0x48, 0x83, 0xec, 0x10, 0x31, 0xc0, 0xc9, 0xc3,
        ],
    );
    let plan = plan_site(&f, 0x401000);
    assert_eq!(
        plan,
        SitePlan::Jump {
            patch_addr: 0x401000,
            displaced_len: 8,
            displaced: vec![0x55, 0x48, 0x89, 0xe5, 0x48, 0x83, 0xec, 0x10],
            padding: 0,
            skipped_endbr: false,
        }
    );
    let t = 0x4040_1000;
    let code = relocate(&plan, t, true).unwrap();
    // push rbp; mov rbp, rsp; sub rsp, 0x10; jmp 0x401008
    assert_eq!(
        code,
        [0x55, 0x48, 0x89, 0xe5, 0x48, 0x83, 0xec, 0x10, 0xe9, 0xfb, 0xff, 0xff, 0xbf]
    );
    assert_eq!(
        asm(&code, t),
        "push rbp; mov rbp, rsp; sub rsp, 0x10; jmp 0x401008"
    );
}

#[test]
fn sub_rsp_prologue_with_stack_protector_load() {
    // 0x401000: sub rsp, 0x18
    // 0x401004: mov rax, qword ptr fs:[0x28]
    // 0x40100d: mov qword ptr [rsp+8], rax
    // 0x401012: xor eax, eax
    // 0x401014: add rsp, 0x18
    // 0x401018: ret
    let f = func(
        0x401000,
        &[
            0x48, 0x83, 0xec, 0x18, 0x64, 0x48, 0x8b, 0x04, 0x25, 0x28, 0x00, 0x00, 0x00, 0x48,
            0x89, 0x44, 0x24, 0x08, 0x31, 0xc0, 0x48, 0x83, 0xc4, 0x18, 0xc3,
        ],
    );
    let plan = plan_site(&f, 0x401000);
    assert_eq!(expect_jump(&plan), (0x401000, 13));
    let t = 0x4040_1000;
    let code = relocate(&plan, t, true).unwrap();
    // sub rsp, 0x18; mov rax, qword ptr fs:[0x28]; jmp 0x40100d
    assert_eq!(
        code,
        [
            0x48, 0x83, 0xec, 0x18, 0x64, 0x48, 0x8b, 0x04, 0x25, 0x28, 0x00, 0x00, 0x00, 0xe9,
            0xfb, 0xff, 0xff, 0xbf
        ]
    );
    assert_eq!(
        asm(&code, t),
        "sub rsp, 0x18; mov rax, qword ptr fs:[0x28]; jmp 0x40100d"
    );
}

#[test]
fn sub_rsp_imm32_alone_covers_the_jump() {
    // 0x401000: sub rsp, 0x108; ...; add rsp, 0x108; ret
    let f = func(
        0x401000,
        &[
            0x48, 0x81, 0xec, 0x08, 0x01, 0x00, 0x00, 0x48, 0x81, 0xc4, 0x08, 0x01, 0x00, 0x00,
            0xc3,
        ],
    );
    let plan = plan_site(&f, 0x401000);
    assert_eq!(expect_jump(&plan), (0x401000, 7));
    let t = 0x4040_1000;
    let code = relocate(&plan, t, true).unwrap();
    // sub rsp, 0x108; jmp 0x401007
    assert_eq!(
        code,
        [0x48, 0x81, 0xec, 0x08, 0x01, 0x00, 0x00, 0xe9, 0xfb, 0xff, 0xff, 0xbf]
    );
    assert_eq!(asm(&code, t), "sub rsp, 0x108; jmp 0x401007");
}

#[test]
fn rip_relative_load_relocated_1gib_up() {
    // 0x401000: mov rax, qword ptr [rip+0x2ff9]    ; [0x404000]
    // 0x401007: ret
    let f = func(0x401000, &[0x48, 0x8b, 0x05, 0xf9, 0x2f, 0x00, 0x00, 0xc3]);
    let plan = plan_site(&f, 0x401000);
    assert_eq!(expect_jump(&plan), (0x401000, 7));
    let t = 0x401000 + GIB;
    let code = relocate(&plan, t, true).unwrap();
    // mov rax, qword ptr [rip-0x3fffd007]    ; still [0x404000]
    // jmp 0x401007
    assert_eq!(
        code,
        [0x48, 0x8b, 0x05, 0xf9, 0x2f, 0x00, 0xc0, 0xe9, 0xfb, 0xff, 0xff, 0xbf]
    );
    assert_eq!(asm(&code, t), "mov rax, qword ptr [0x404000]; jmp 0x401007");
}

#[test]
fn rip_relative_lea_relocated_1gib_down() {
    // 0x555555555000: lea rdi, [rip+0x2ff9]    ; 0x555555558000
    // 0x555555555007: jmp 0x555555556000       ; tail call (puts@plt, say)
    let base = 0x5555_5555_5000;
    let f = func(
        base,
        &[
            0x48, 0x8d, 0x3d, 0xf9, 0x2f, 0x00, 0x00, 0xe9, 0xf4, 0x0f, 0x00, 0x00,
        ],
    );
    let plan = plan_site(&f, base);
    assert_eq!(expect_jump(&plan), (base, 7));
    let t = base - GIB;
    let code = relocate(&plan, t, true).unwrap();
    // lea rdi, [rip+0x40002ff9]    ; still 0x555555558000
    // jmp 0x555555555007
    assert_eq!(
        code,
        [0x48, 0x8d, 0x3d, 0xf9, 0x2f, 0x00, 0x40, 0xe9, 0xfb, 0xff, 0xff, 0x3f]
    );
    assert_eq!(
        asm(&code, t),
        "lea rdi, [0x555555558000]; jmp 0x555555555007"
    );
}

#[test]
fn rip_relative_store_with_immediate() {
    // The displacement is relative to the end of the instruction, after the immediate.
    // 0x401000: mov dword ptr [rip+0x2ff6], 1    ; [0x404000]
    // 0x40100a: ret
    let f = func(
        0x401000,
        &[
            0xc7, 0x05, 0xf6, 0x2f, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0xc3,
        ],
    );
    let plan = plan_site(&f, 0x401000);
    assert_eq!(expect_jump(&plan), (0x401000, 10));
    let t = 0x401000 + GIB;
    let code = relocate(&plan, t, true).unwrap();
    // mov dword ptr [rip-0x3fffd00a], 1; jmp 0x40100a
    assert_eq!(
        code,
        [
            0xc7, 0x05, 0xf6, 0x2f, 0x00, 0xc0, 0x01, 0x00, 0x00, 0x00, 0xe9, 0xfb, 0xff, 0xff,
            0xbf
        ]
    );
    assert_eq!(asm(&code, t), "mov dword ptr [0x404000], 1; jmp 0x40100a");
}

#[test]
fn test_je_at_entry_becomes_near_jcc_to_the_original_target() {
    // 0x401000: test edi, edi
    // 0x401002: je 0x401014
    // 0x401004: mov eax, 1
    // 0x401009: add eax, edi
    // 0x40100b: imul eax, edi
    // 0x40100e: add eax, 7
    // 0x401011: nop dword ptr [rax]
    // 0x401014: ret
    let f = func(
        0x401000,
        &[
            0x85, 0xff, 0x74, 0x10, 0xb8, 0x01, 0x00, 0x00, 0x00, 0x01, 0xf8, 0x0f, 0xaf, 0xc7,
            0x83, 0xc0, 0x07, 0x0f, 0x1f, 0x00, 0xc3,
        ],
    );
    let plan = plan_site(&f, 0x401000);
    assert_eq!(expect_jump(&plan), (0x401000, 9));
    let t = 0x401000 + GIB;
    let code = relocate(&plan, t, true).unwrap();
    // test edi, edi; je 0x401014 (rel32); mov eax, 1; jmp 0x401009
    assert_eq!(
        code,
        [
            0x85, 0xff, 0x0f, 0x84, 0x0c, 0x00, 0x00, 0xc0, 0xb8, 0x01, 0x00, 0x00, 0x00, 0xe9,
            0xf7, 0xff, 0xff, 0xbf
        ]
    );
    assert_eq!(
        asm(&code, t),
        "test edi, edi; je 0x401014; mov eax, 1; jmp 0x401009"
    );
}

#[test]
fn jne_rel8_as_last_displaced_instruction_then_jump_back() {
    // 0x401000: test rdi, rdi
    // 0x401003: jne 0x401008
    // 0x401005: xor eax, eax
    // 0x401007: ret
    // 0x401008: mov eax, dword ptr [rdi]
    // 0x40100a: ret
    let f = func(
        0x401000,
        &[
            0x48, 0x85, 0xff, 0x75, 0x03, 0x31, 0xc0, 0xc3, 0x8b, 0x07, 0xc3,
        ],
    );
    let plan = plan_site(&f, 0x401000);
    assert_eq!(expect_jump(&plan), (0x401000, 5));
    let t = 0x401000 + GIB;
    let code = relocate(&plan, t, true).unwrap();
    // test rdi, rdi; jne 0x401008 (rel32); jmp 0x401005
    assert_eq!(
        code,
        [0x48, 0x85, 0xff, 0x0f, 0x85, 0xff, 0xff, 0xff, 0xbf, 0xe9, 0xf7, 0xff, 0xff, 0xbf]
    );
    assert_eq!(asm(&code, t), "test rdi, rdi; jne 0x401008; jmp 0x401005");
}

#[test]
fn branch_back_to_the_patch_point_keeps_its_original_target() {
    // A loop whose head is the patch point itself: allowed (the jump is there). The
    // displaced back-edge still targets the original address, so it goes through the
    // patch again, like any other branch to the site.
    // 0x401000: dec edi
    // 0x401002: jne 0x401000
    // 0x401004: mov eax, edi
    // 0x401006: ret
    let f = func(0x401000, &[0xff, 0xcf, 0x75, 0xfc, 0x89, 0xf8, 0xc3]);
    let plan = plan_site(&f, 0x401000);
    assert_eq!(expect_jump(&plan), (0x401000, 6));
    let t = 0x401000 + GIB;
    let code = relocate(&plan, t, true).unwrap();
    // dec edi; jne 0x401000 (rel32); mov eax, edi; jmp 0x401006
    assert_eq!(
        code,
        [
            0xff, 0xcf, 0x0f, 0x85, 0xf8, 0xff, 0xff, 0xbf, 0x89, 0xf8, 0xe9, 0xf7, 0xff, 0xff,
            0xbf
        ]
    );
    assert_eq!(
        asm(&code, t),
        "dec edi; jne 0x401000; mov eax, edi; jmp 0x401006"
    );
}

#[test]
fn rip_relative_address_of_the_function_itself_is_not_redirected() {
    // `&func` taken in func's own first instruction must stay func, not the copy.
    // 0x401000: lea rdi, [rip-7]    ; 0x401000
    // 0x401007: jmp 0x402000
    let f = func(
        0x401000,
        &[
            0x48, 0x8d, 0x3d, 0xf9, 0xff, 0xff, 0xff, 0xe9, 0xf4, 0x0f, 0x00, 0x00,
        ],
    );
    let plan = plan_site(&f, 0x401000);
    assert_eq!(expect_jump(&plan), (0x401000, 7));
    let t = 0x401000 + GIB;
    let code = relocate(&plan, t, true).unwrap();
    // lea rdi, [rip-0x40000007]; jmp 0x401007
    assert_eq!(
        code,
        [0x48, 0x8d, 0x3d, 0xf9, 0xff, 0xff, 0xbf, 0xe9, 0xfb, 0xff, 0xff, 0xbf]
    );
    assert_eq!(asm(&code, t), "lea rdi, [0x401000]; jmp 0x401007");
}

#[test]
fn jmp_rel32_as_only_displaced_instruction_needs_no_jump_back() {
    // 0x401000: jmp 0x402000    ; a thunk
    let f = func(0x401000, &[0xe9, 0xfb, 0x0f, 0x00, 0x00]);
    let plan = plan_site(&f, 0x401000);
    assert_eq!(expect_jump(&plan), (0x401000, 5));
    let t = 0x401000 + GIB;
    let code = relocate(&plan, t, true).unwrap();
    // jmp 0x402000
    assert_eq!(code, [0xe9, 0xfb, 0x0f, 0x00, 0xc0]);
    assert_eq!(asm(&code, t), "jmp 0x402000");
}

#[test]
fn fentry_call_first_is_emulated_with_the_original_return_address() {
    // gcc -pg -mfentry:
    // 0x401000: call 0x401500    ; __fentry__
    // 0x401005: push rbp
    // 0x401006: mov rbp, rsp
    // 0x401009: pop rbp
    // 0x40100a: ret
    let f = func(
        0x401000,
        &[
            0xe8, 0xfb, 0x04, 0x00, 0x00, 0x55, 0x48, 0x89, 0xe5, 0x5d, 0xc3,
        ],
    );
    let plan = plan_site(&f, 0x401000);
    assert_eq!(expect_jump(&plan), (0x401000, 5));
    let t = 0x401000 + GIB;
    let code = relocate(&plan, t, true).unwrap();
    // push 0x401005; jmp 0x401500
    // (the return address fits a sign-extended imm32, so no high half to patch)
    assert_eq!(
        code,
        [0x68, 0x05, 0x10, 0x40, 0x00, 0xe9, 0xf6, 0x04, 0x00, 0xc0]
    );
    assert_eq!(asm(&code, t), "push 0x401005; jmp 0x401500");
}

#[test]
fn fentry_call_after_endbr64_in_pie_writes_the_high_half() {
    // 0x555555555000: endbr64
    // 0x555555555004: call 0x555555556000
    // 0x555555555009: ret
    let base = 0x5555_5555_5000;
    let f = func(
        base,
        &[0xf3, 0x0f, 0x1e, 0xfa, 0xe8, 0xf7, 0x0f, 0x00, 0x00, 0xc3],
    );
    let plan = plan_site(&f, base);
    assert_eq!(
        plan,
        SitePlan::Jump {
            patch_addr: base + 4,
            displaced_len: 5,
            displaced: vec![0xe8, 0xf7, 0x0f, 0x00, 0x00],
            padding: 0,
            skipped_endbr: true,
        }
    );
    let t = base - GIB;
    let code = relocate(&plan, t, true).unwrap();
    // push 0x55555009                 ; pushes 0x0000000055555009
    // mov dword ptr [rsp+4], 0x5555    ; now 0x0000555555555009
    // jmp 0x555555556000
    assert_eq!(
        code,
        [
            0x68, 0x09, 0x50, 0x55, 0x55, 0xc7, 0x44, 0x24, 0x04, 0x55, 0x55, 0x00, 0x00, 0xe9,
            0xee, 0x0f, 0x00, 0x40
        ]
    );
    assert_eq!(
        asm(&code, t),
        "push 0x55555009; mov dword ptr [rsp+4], 0x5555; jmp 0x555555556000"
    );
}

#[test]
fn call_return_address_with_bit_31_set() {
    // 0x7fffe0001000: call 0x7fffe0002000
    // 0x7fffe0001005: ret
    let base = 0x7fff_e000_1000;
    let f = func(base, &[0xe8, 0xfb, 0x0f, 0x00, 0x00, 0xc3]);
    let plan = plan_site(&f, base);
    let t = base - GIB;
    let code = relocate(&plan, t, true).unwrap();
    // push 0xffffffffe0001005          ; sign-extended
    // mov dword ptr [rsp+4], 0x7fff    ; now 0x00007fffe0001005
    // jmp 0x7fffe0002000
    assert_eq!(
        code,
        [
            0x68, 0x05, 0x10, 0x00, 0xe0, 0xc7, 0x44, 0x24, 0x04, 0xff, 0x7f, 0x00, 0x00, 0xe9,
            0xee, 0x0f, 0x00, 0x40
        ]
    );
    assert_eq!(
        asm(&code, t),
        "push 0xffffffffe0001005; mov dword ptr [rsp+4], 0x7fff; jmp 0x7fffe0002000"
    );
}

#[test]
fn indirect_call_through_got_is_emulated_as_indirect_jmp() {
    // gcc -fno-plt:
    // 0x401000: call qword ptr [rip+0x2ffa]    ; [0x404000]
    // 0x401006: ret
    let f = func(0x401000, &[0xff, 0x15, 0xfa, 0x2f, 0x00, 0x00, 0xc3]);
    let plan = plan_site(&f, 0x401000);
    assert_eq!(expect_jump(&plan), (0x401000, 6));
    let t = 0x401000 + GIB;
    let code = relocate(&plan, t, true).unwrap();
    // push 0x401006; jmp qword ptr [rip-0x3fffd00b]    ; [0x404000]
    assert_eq!(
        code,
        [0x68, 0x06, 0x10, 0x40, 0x00, 0xff, 0x25, 0xf5, 0x2f, 0x00, 0xc0]
    );
    assert_eq!(asm(&code, t), "push 0x401006; jmp qword ptr [0x404000]");
}

#[test]
fn call_through_register_as_last_displaced_instruction() {
    // 0x401000: mov eax, 7
    // 0x401005: call rdx
    // 0x401007: ret
    let f = func(0x401000, &[0xb8, 0x07, 0x00, 0x00, 0x00, 0xff, 0xd2, 0xc3]);
    let plan = plan_site(&f, 0x401000);
    // mov alone covers 5 bytes: the call stays in place.
    assert_eq!(expect_jump(&plan), (0x401000, 5));

    // 0x401000: push rbx
    // 0x401001: xor eax, eax
    // 0x401003: call rdx
    // 0x401005: pop rbx
    // 0x401006: ret
    let f = func(0x401000, &[0x53, 0x31, 0xc0, 0xff, 0xd2, 0x5b, 0xc3]);
    let plan = plan_site(&f, 0x401000);
    assert_eq!(expect_jump(&plan), (0x401000, 5));
    let t = 0x401000 + GIB;
    let code = relocate(&plan, t, true).unwrap();
    // push rbx; xor eax, eax; push 0x401005; jmp rdx
    assert_eq!(
        code,
        [0x53, 0x31, 0xc0, 0x68, 0x05, 0x10, 0x40, 0x00, 0xff, 0xe2]
    );
    assert_eq!(
        asm(&code, t),
        "push rbx; xor eax, eax; push 0x401005; jmp rdx"
    );
}

#[test]
fn site_inside_a_function_is_planned_from_there() {
    // 0x401000: endbr64
    // 0x401004: push rbp
    // 0x401005: mov rbp, rsp
    // 0x401008: sub rsp, 0x10
    // 0x40100c: leave
    // 0x40100d: ret
    let f = func(
        0x401000,
        &[
            0xf3, 0x0f, 0x1e, 0xfa, 0x55, 0x48, 0x89, 0xe5, 0x48, 0x83, 0xec, 0x10, 0xc9, 0xc3,
        ],
    );
    // At mov rbp, rsp: no endbr64 to skip; mov + sub = 7 bytes.
    assert_eq!(expect_jump(&plan_site(&f, 0x401005)), (0x401005, 7));
    // At endbr64 + 4 given explicitly: the same plan as for the function start, but
    // without `skipped_endbr`.
    let plan = plan_site(&f, 0x401004);
    assert_eq!(expect_jump(&plan), (0x401004, 8));
    assert!(matches!(
        plan,
        SitePlan::Jump {
            padding: 0,
            skipped_endbr: false,
            ..
        }
    ));
}

// ---------------------------------------------------------------------------------
// Int3 sites

#[test]
fn function_shorter_than_a_jump_is_int3_too_short() {
    // 0x401000: xor eax, eax
    // 0x401002: ret
    let f = func(0x401000, &[0x31, 0xc0, 0xc3]);
    let plan = plan_site(&f, 0x401000);
    assert_eq!(
        plan,
        SitePlan::Int3 {
            patch_addr: 0x401000,
            insn_len: 2,
            displaced: vec![0x31, 0xc0],
            skipped_endbr: false,
            reason: Reason::TooShort { len: 3 },
        }
    );
    assert_eq!(
        plan.reason().unwrap().to_string(),
        "only 3 byte(s) from the patch point to the function end, a jump needs 5"
    );
    let t = 0x401000 + GIB;
    let code = relocate(&plan, t, true).unwrap();
    // xor eax, eax; jmp 0x401002
    assert_eq!(code, [0x31, 0xc0, 0xe9, 0xfb, 0xff, 0xff, 0xbf]);
    assert_eq!(asm(&code, t), "xor eax, eax; jmp 0x401002");
}

#[test]
fn short_function_after_endbr64_is_int3_after_it() {
    // 0x401000: endbr64
    // 0x401004: mov eax, edi
    // 0x401006: ret
    let f = func(0x401000, &[0xf3, 0x0f, 0x1e, 0xfa, 0x89, 0xf8, 0xc3]);
    assert_eq!(
        plan_site(&f, 0x401000),
        SitePlan::Int3 {
            patch_addr: 0x401004,
            insn_len: 2,
            displaced: vec![0x89, 0xf8],
            skipped_endbr: true,
            reason: Reason::TooShort { len: 3 },
        }
    );
}

#[test]
fn lone_ret_relocates_without_jump_back() {
    // 0x401000: ret
    let f = func(0x401000, &[0xc3]);
    let plan = plan_site(&f, 0x401000);
    assert_eq!(plan.reason(), Some(&Reason::TooShort { len: 1 }));
    let code = relocate(&plan, 0x401000 + GIB, true).unwrap();
    // ret
    assert_eq!(code, [0xc3]);
}

#[test]
fn loop_back_edge_into_the_prologue_is_int3_branch_into_patch() {
    // 0x401000: xor eax, eax
    // 0x401002: add eax, edi        <- loop head, byte 2 of the patch
    // 0x401004: dec edi
    // 0x401006: jne 0x401002
    // 0x401008: ret
    let f = func(
        0x401000,
        &[0x31, 0xc0, 0x01, 0xf8, 0xff, 0xcf, 0x75, 0xfa, 0xc3],
    );
    let plan = plan_site(&f, 0x401000);
    assert_eq!(
        plan,
        SitePlan::Int3 {
            patch_addr: 0x401000,
            insn_len: 2,
            displaced: vec![0x31, 0xc0],
            skipped_endbr: false,
            reason: Reason::BranchIntoPatch {
                from: 0x401006,
                to: 0x401002
            },
        }
    );
    assert_eq!(
        plan.reason().unwrap().to_string(),
        "branch at 0x401006 targets 0x401002, inside the bytes a jump would replace"
    );
}

#[test]
fn branch_to_the_first_byte_after_the_patch_is_fine() {
    // Same loop, head moved to 0x401006, just past the 6 displaced bytes.
    // 0x401000: xor eax, eax
    // 0x401002: mov ecx, edi
    // 0x401004: nop
    // 0x401005: nop
    // 0x401006: add eax, ecx        <- loop head
    // 0x401008: dec ecx
    // 0x40100a: jne 0x401006
    // 0x40100c: ret
    let f = func(
        0x401000,
        &[
            0x31, 0xc0, 0x89, 0xf9, 0x90, 0x90, 0x01, 0xc8, 0xff, 0xc9, 0x75, 0xfa, 0xc3,
        ],
    );
    assert_eq!(expect_jump(&plan_site(&f, 0x401000)), (0x401000, 5));
}

#[test]
fn rip_relative_address_of_a_patched_byte_is_int3() {
    // Computed goto: the address of a label inside the patch is taken.
    // 0x401000: lea rax, [rip-5]    ; 0x401002
    // 0x401007: jmp rax
    let f = func(
        0x401000,
        &[0x48, 0x8d, 0x05, 0xfb, 0xff, 0xff, 0xff, 0xff, 0xe0],
    );
    assert_eq!(
        plan_site(&f, 0x401000).reason(),
        Some(&Reason::AddressTakenInPatch {
            from: 0x401000,
            to: 0x401002
        })
    );
}

#[test]
fn call_in_the_middle_of_the_patch_is_int3_call_not_last() {
    // 0x401000: xor eax, eax
    // 0x401002: call rax
    // 0x401004: mov ebx, eax
    // 0x401006: ret
    let f = func(0x401000, &[0x31, 0xc0, 0xff, 0xd0, 0x89, 0xc3, 0xc3]);
    let plan = plan_site(&f, 0x401000);
    assert_eq!(
        plan,
        SitePlan::Int3 {
            patch_addr: 0x401000,
            insn_len: 2,
            displaced: vec![0x31, 0xc0],
            skipped_endbr: false,
            reason: Reason::CallNotLast { at: 0x401002 },
        }
    );
    assert_eq!(
        plan.reason().unwrap().to_string(),
        "call at 0x401002 is not the last instruction a jump would displace"
    );
}

#[test]
fn call_first_but_not_last_is_int3_with_the_call_emulated() {
    // 0x401000: call rax
    // 0x401002: mov ebx, eax
    // 0x401004: pop rbx
    // 0x401005: ret
    let f = func(0x401000, &[0xff, 0xd0, 0x89, 0xc3, 0x5b, 0xc3]);
    let plan = plan_site(&f, 0x401000);
    assert_eq!(plan.reason(), Some(&Reason::CallNotLast { at: 0x401000 }));
    let t = 0x401000 + GIB;
    let code = relocate(&plan, t, true).unwrap();
    // push 0x401002; jmp rax
    assert_eq!(code, [0x68, 0x02, 0x10, 0x40, 0x00, 0xff, 0xe0]);
    assert_eq!(asm(&code, t), "push 0x401002; jmp rax");
}

#[test]
fn short_jmp_inside_the_patch_is_int3_flow_ends() {
    // 0x401000: jmp 0x401004
    // 0x401002: ud2
    // 0x401004: xor eax, eax
    // 0x401006: ret
    let f = func(0x401000, &[0xeb, 0x02, 0x0f, 0x0b, 0x31, 0xc0, 0xc3]);
    let plan = plan_site(&f, 0x401000);
    assert_eq!(
        plan.reason(),
        Some(&Reason::FlowEndsInPatch {
            at: 0x401000,
            insn: "jmp 0x401004".into()
        })
    );
    assert_eq!(
        plan.reason().unwrap().to_string(),
        "`jmp 0x401004` at 0x401000 does not fall through, and a jump needs the bytes after it"
    );
    let t = 0x401000 + GIB;
    let code = relocate(&plan, t, true).unwrap();
    // jmp 0x401004 (rel32, no jump back after it)
    assert_eq!(code, [0xe9, 0xff, 0xff, 0xff, 0xbf]);
    assert_eq!(asm(&code, t), "jmp 0x401004");
}

#[test]
fn ret_followed_by_filler_inside_the_symbol_is_a_jump() {
    // A size that covers padding after the ret: the nop is dead filler, so the jump
    // may cover it (only xor and ret are relocated).
    // 0x401000: xor eax, eax
    // 0x401002: ret
    // 0x401003: nop dword ptr [rax]
    let f = func(0x401000, &[0x31, 0xc0, 0xc3, 0x0f, 0x1f, 0x00]);
    let plan = plan_site(&f, 0x401000);
    assert!(
        matches!(
            plan,
            SitePlan::Jump {
                displaced_len: 6,
                padding: 3,
                ..
            }
        ),
        "{plan:?}"
    );
    // xor eax, eax; ret
    assert_eq!(
        relocate(&plan, 0x402000, true).unwrap(),
        vec![0x31, 0xc0, 0xc3]
    );
}

#[test]
fn unknown_size_is_int3() {
    // push rbp; mov rbp, rsp; pop rbp; ret
    let f = FunctionCode {
        size_known: false,
        ..func(0x401000, &[0x55, 0x48, 0x89, 0xe5, 0x5d, 0xc3])
    };
    let plan = plan_site(&f, 0x401000);
    assert_eq!(plan.reason(), Some(&Reason::SizeUnknown));
    assert_eq!(plan.patch_addr(), Some(0x401000));
}

#[test]
fn undecodable_byte_later_in_the_body_is_int3_decode_error() {
    // 0x401000: push rbp; mov rbp, rsp; sub rsp, 0x10
    // 0x401008: (bad) 0x06
    let f = func(
        0x401000,
        &[0x55, 0x48, 0x89, 0xe5, 0x48, 0x83, 0xec, 0x10, 0x06, 0xc3],
    );
    assert_eq!(
        plan_site(&f, 0x401000).reason(),
        Some(&Reason::DecodeError { at: 0x401008 })
    );
}

#[test]
fn to_int3_downgrades_a_jump_plan() {
    // push rbp; mov rbp, rsp; sub rsp, 0x10; leave; ret
    let f = func(
        0x401000,
        &[0x55, 0x48, 0x89, 0xe5, 0x48, 0x83, 0xec, 0x10, 0xc9, 0xc3],
    );
    let plan = plan_site(&f, 0x401000).to_int3(Reason::NoTrampolineInRange);
    assert_eq!(
        plan,
        SitePlan::Int3 {
            patch_addr: 0x401000,
            insn_len: 1,
            displaced: vec![0x55],
            skipped_endbr: false,
            reason: Reason::NoTrampolineInRange,
        }
    );
    let t = 0x401000 + GIB;
    // push rbp; jmp 0x401001
    assert_eq!(
        relocate(&plan, t, true).unwrap(),
        [0x55, 0xe9, 0xfb, 0xff, 0xff, 0xbf]
    );
}

// ---------------------------------------------------------------------------------
// Refused sites

#[test]
fn breakpoint_at_the_site_is_refused() {
    // 0x401000: int3; push rbp; ...
    let f = func(0x401000, &[0xcc, 0x55, 0x48, 0x89, 0xe5, 0x5d, 0xc3]);
    let plan = plan_site(&f, 0x401000);
    assert!(
        matches!(plan, SitePlan::Refused { reason: Reason::Unrelocatable { at: 0x401000, ref insn, .. } } if insn == "int3"),
        "{plan:?}"
    );
    assert_eq!(
        relocate(&plan, 0x2000, true),
        Err(X86Error::Refused(plan.reason().unwrap().clone()))
    );
}

#[test]
fn stack_relative_call_at_the_site_is_refused() {
    // 0x401000: call qword ptr [rsp+8]
    let f = func(0x401000, &[0xff, 0x54, 0x24, 0x08, 0xc3]);
    assert_eq!(
        plan_site(&f, 0x401000).reason().unwrap().to_string(),
        "`call qword ptr [rsp+8]` at 0x401000 cannot run out of line: the call's operand depends on the stack pointer"
    );
}

#[test]
fn site_outside_or_mid_instruction_or_undecodable_is_refused() {
    // 0x401000: push rbp; mov rbp, rsp; pop rbp; ret
    let f = func(0x401000, &[0x55, 0x48, 0x89, 0xe5, 0x5d, 0xc3]);
    assert_eq!(
        plan_site(&f, 0x401006),
        SitePlan::Refused {
            reason: Reason::OutsideFunction { site: 0x401006 }
        }
    );
    assert_eq!(
        plan_site(&f, 0x400fff).reason(),
        Some(&Reason::OutsideFunction { site: 0x400fff })
    );
    assert_eq!(
        plan_site(&f, 0x401002).reason(),
        Some(&Reason::NotInstructionBoundary { site: 0x401002 })
    );
    // 0x401000: (bad) 0x06
    assert_eq!(
        plan_site(&func(0x401000, &[0x06, 0xc3]), 0x401000),
        SitePlan::Refused {
            reason: Reason::DecodeError { at: 0x401000 }
        }
    );
    // Only an endbr64: nothing after it to patch.
    assert_eq!(
        plan_site(&func(0x401000, &[0xf3, 0x0f, 0x1e, 0xfa]), 0x401000).reason(),
        Some(&Reason::TooShort { len: 0 })
    );
}

// ---------------------------------------------------------------------------------
// Relocation errors and far targets

#[test]
fn rip_relative_operand_out_of_range_is_an_error() {
    // 0x555555555000: mov rax, qword ptr [rip+0x2ff9]    ; [0x555555558000]
    // 0x555555555007: ret
    let base = 0x5555_5555_5000;
    let f = func(base, &[0x48, 0x8b, 0x05, 0xf9, 0x2f, 0x00, 0x00, 0xc3]);
    let plan = plan_site(&f, base);
    let far = base + 3 * GIB;
    let err = relocate(&plan, far, true).unwrap_err();
    assert_eq!(
        err,
        X86Error::RipRelativeOutOfRange {
            at: base,
            insn: "mov rax, qword ptr [0x555555558000]".into(),
            target: 0x5555_5555_8000,
            new_addr: far,
        }
    );
    assert_eq!(
        err.to_string(),
        "`mov rax, qword ptr [0x555555558000]` at 0x555555555000 addresses 0x555555558000, \
         more than 2 GiB from 0x555615555000"
    );
    assert!(relocate(&plan, base - 3 * GIB, true).is_err());
    // Near the edge of the range it still works: the new displacement is near -2 GiB.
    let near_edge = 0x5555_5555_8000 + 0x7fff_0000;
    let code = relocate(&plan, near_edge, false).unwrap();
    // mov rax, qword ptr [rip-0x7fff0007]
    assert_eq!(code, [0x48, 0x8b, 0x05, 0xf9, 0xff, 0x00, 0x80]);
    assert_eq!(asm(&code, near_edge), "mov rax, qword ptr [0x555555558000]");
}

#[test]
fn rip_relative_operand_in_low_4gib_reached_from_far_away_through_eip() {
    // 0x401000: mov rax, qword ptr [rip+0x2ff9]    ; [0x404000]
    // 0x401007: ret
    let f = func(0x401000, &[0x48, 0x8b, 0x05, 0xf9, 0x2f, 0x00, 0x00, 0xc3]);
    let plan = plan_site(&f, 0x401000);
    let far = 0x7f00_0000_0000;
    let code = relocate(&plan, far, false).unwrap();
    // mov rax, qword ptr [eip+0x404000-0x8]    ; (0x7f0000000008 + disp) mod 2^32
    assert_eq!(code, [0x67, 0x48, 0x8b, 0x05, 0xf8, 0x3f, 0x40, 0x00]);
    assert_eq!(asm(&code, far), "mov rax, qword ptr [0x404000]");
}

#[test]
fn jump_back_beyond_2gib_goes_through_a_pointer() {
    // An int3 site whose resume copy could only be placed far away.
    // 0x401000: xor eax, eax; ret
    let f = func(0x401000, &[0x31, 0xc0, 0xc3]);
    let plan = plan_site(&f, 0x401000);
    let far = 0x7f00_0000_0000;
    let code = relocate(&plan, far, true).unwrap();
    // xor eax, eax
    // jmp qword ptr [rip+0]    ; the 8 bytes after it
    // dq 0x401002
    assert_eq!(
        code,
        [
            0x31, 0xc0, 0xff, 0x25, 0x00, 0x00, 0x00, 0x00, 0x02, 0x10, 0x40, 0x00, 0x00, 0x00,
            0x00, 0x00
        ]
    );
}

#[test]
fn jrcxz_at_entry_becomes_a_short_hop_over_a_near_jump() {
    // jrcxz has no rel32 form: iced branches over a near jmp to the original target.
    // 0x401000: jrcxz 0x401010
    // 0x401002: mov eax, 1
    // 0x401007: nop (x9)
    // 0x401010: ret
    let mut bytes = vec![0xe3, 0x0e, 0xb8, 0x01, 0x00, 0x00, 0x00];
    bytes.resize(0x10, 0x90);
    bytes.push(0xc3);
    let plan = plan_site(&func(0x401000, &bytes), 0x401000);
    assert_eq!(expect_jump(&plan), (0x401000, 7));
    let t = 0x401000 + GIB;
    let code = relocate(&plan, t, true).unwrap();
    // T+0: jrcxz T+4
    // T+2: jmp T+9
    // T+4: jmp 0x401010
    // T+9: mov eax, 1
    // T+e: jmp 0x401007
    assert_eq!(
        code,
        [
            0xe3, 0x02, 0xeb, 0x05, 0xe9, 0x07, 0x00, 0x00, 0xc0, 0xb8, 0x01, 0x00, 0x00, 0x00,
            0xe9, 0xf4, 0xff, 0xff, 0xbf
        ]
    );
    assert_eq!(
        asm(&code, t),
        "jrcxz 0x40401004; jmp 0x40401009; jmp 0x401010; mov eax, 1; jmp 0x401007"
    );
}

#[test]
fn xbegin_keeps_its_abort_target() {
    // 0x401000: xbegin 0x401016
    // 0x401006: nop (x26)
    // 0x401020: ret
    let mut bytes = vec![0xc7, 0xf8, 0x10, 0x00, 0x00, 0x00];
    bytes.resize(0x20, 0x90);
    bytes.push(0xc3);
    let plan = plan_site(&func(0x401000, &bytes), 0x401000);
    assert_eq!(expect_jump(&plan), (0x401000, 6));
    let t = 0x401000 + GIB;
    let code = relocate(&plan, t, true).unwrap();
    // xbegin 0x401016; jmp 0x401006
    assert_eq!(
        code,
        [0xc7, 0xf8, 0x10, 0x00, 0x00, 0xc0, 0xe9, 0xfb, 0xff, 0xff, 0xbf]
    );
    assert_eq!(asm(&code, t), "xbegin 0x401016; jmp 0x401006");
}

#[test]
fn notrack_indirect_jmp_keeps_its_prefix_and_needs_no_jump_back() {
    // 0x401000: mov rax, qword ptr [rdi]
    // 0x401003: notrack jmp rax
    let plan = plan_site(
        &func(0x401000, &[0x48, 0x8b, 0x07, 0x3e, 0xff, 0xe0]),
        0x401000,
    );
    assert_eq!(expect_jump(&plan), (0x401000, 6));
    let t = 0x401000 + GIB;
    let code = relocate(&plan, t, true).unwrap();
    // mov rax, qword ptr [rdi]; notrack jmp rax
    assert_eq!(code, [0x48, 0x8b, 0x07, 0x3e, 0xff, 0xe0]);
    assert_eq!(asm(&code, t), "mov rax, qword ptr [rdi]; notrack jmp rax");
}

#[test]
fn relocate_rechecks_a_hand_made_plan() {
    // A plan built by hand with a call before another instruction is not encoded.
    // call rax; ret
    let plan = SitePlan::Jump {
        patch_addr: 0x401000,
        displaced_len: 3,
        displaced: vec![0xff, 0xd0, 0xc3],
        padding: 0,
        skipped_endbr: false,
    };
    assert_eq!(
        relocate(&plan, 0x401000 + GIB, true),
        Err(X86Error::Refused(Reason::CallNotLast { at: 0x401000 }))
    );
}

// ---------------------------------------------------------------------------------
// Short functions and the padding after them
// ---------------------------------------------------------------------------------

fn with_padding(addr: u64, bytes: &[u8], padding: &[u8]) -> FunctionCode {
    FunctionCode {
        padding: padding.to_vec(),
        ..func(addr, bytes)
    }
}

#[test]
fn short_function_extends_into_nop_padding() {
    // mov rax, rdi; ret | nop dword [rax+rax]; nop ...
    let f = with_padding(
        0x401000,
        &[0x48, 0x89, 0xf8, 0xc3],
        &[0x0f, 0x1f, 0x44, 0x00, 0x00, 0x90, 0x90],
    );
    let plan = plan_site(&f, 0x401000);
    assert_eq!(
        plan,
        SitePlan::Jump {
            patch_addr: 0x401000,
            displaced_len: 5,
            displaced: vec![0x48, 0x89, 0xf8, 0xc3, 0x0f],
            padding: 1,
            skipped_endbr: false,
        }
    );
    // jmp 0x402000; nothing after it: the patch is exactly 5 bytes.
    assert_eq!(
        weft_x86::patch_bytes(&plan, 0x402000).unwrap(),
        vec![0xe9, 0xfb, 0x0f, 0x00, 0x00]
    );
    // mov rax, rdi; ret  -- relocated without the padding and without a jump back.
    assert_eq!(
        relocate(&plan, 0x402000, true).unwrap(),
        vec![0x48, 0x89, 0xf8, 0xc3]
    );
}

#[test]
fn endbr_short_function_extends_into_int3_padding() {
    // endbr64; xor eax, eax; ret | int3 x 8
    let f = with_padding(
        0x401000,
        &[0xf3, 0x0f, 0x1e, 0xfa, 0x31, 0xc0, 0xc3],
        &[0xcc; 8],
    );
    let plan = plan_site(&f, 0x401000);
    assert!(
        matches!(
            plan,
            SitePlan::Jump {
                patch_addr: 0x401004,
                displaced_len: 5,
                padding: 2,
                ..
            }
        ),
        "{plan:?}"
    );
    assert_eq!(
        relocate(&plan, 0x402000, true).unwrap(),
        vec![0x31, 0xc0, 0xc3]
    );
}

#[test]
fn padding_is_not_used_when_unsafe() {
    // Not enough padding.
    let f = with_padding(0x401000, &[0x31, 0xc0, 0xc3], &[0x90]);
    assert!(matches!(
        plan_site(&f, 0x401000),
        SitePlan::Int3 {
            reason: Reason::TooShort { .. },
            ..
        }
    ));
    // Padding that is code, not filler (push rbp).
    let f = with_padding(0x401000, &[0x31, 0xc0, 0xc3], &[0x55, 0x48, 0x89, 0xe5]);
    assert!(matches!(plan_site(&f, 0x401000), SitePlan::Int3 { .. }));
    // The function falls through (ends with a call to a noreturn function: call rel32).
    let f = with_padding(0x401000, &[0xe8, 0x00, 0x10, 0x00], &[0x90; 8]);
    assert!(matches!(
        plan_site(&f, 0x401000),
        SitePlan::Int3 { .. } | SitePlan::Refused { .. }
    ));
    // No padding known.
    let f = func(0x401000, &[0x48, 0x89, 0xf8, 0xc3]);
    assert!(matches!(
        plan_site(&f, 0x401000),
        SitePlan::Int3 {
            reason: Reason::TooShort { len: 4 },
            ..
        }
    ));
}

#[test]
fn ret_followed_by_nop_filler_is_a_jump_site() {
    // A coldpatched tail site: ret; nop dword [rax+0]  (was: jmp __cyg_profile_func_exit)
    // preceded by the body: mov eax, 1
    let f = func(
        0x401000,
        &[0xb8, 0x01, 0x00, 0x00, 0x00, 0xc3, 0x0f, 0x1f, 0x40, 0x00],
    );
    let plan = plan_site(&f, 0x401005);
    assert_eq!(
        plan,
        SitePlan::Jump {
            patch_addr: 0x401005,
            displaced_len: 5,
            displaced: vec![0xc3, 0x0f, 0x1f, 0x40, 0x00],
            padding: 4,
            skipped_endbr: false,
        }
    );
    // ret -- relocated alone, no jump back after it.
    assert_eq!(relocate(&plan, 0x402000, true).unwrap(), vec![0xc3]);
    // Not filler after the ret: still an int3 site.
    let g = func(0x401000, &[0xc3, 0x55, 0x48, 0x89, 0xe5, 0x5d, 0xc3]);
    assert!(matches!(plan_site(&g, 0x401000), SitePlan::Int3 { .. }));
}

#[test]
fn nop_placeholders_are_recognised() {
    // -fpatchable-function-entry=5: 5 x nop; then mov eax, edi; ret
    let f = func(0x401000, &[0x90, 0x90, 0x90, 0x90, 0x90, 0x89, 0xf8, 0xc3]);
    let p = plan_site(&f, 0x401000);
    assert!(p.is_placeholder(), "{p:?}");
    // fentry: nop dword [rax+rax+0]
    let f = func(0x401000, &[0x0f, 0x1f, 0x44, 0x00, 0x00, 0x89, 0xf8, 0xc3]);
    assert!(plan_site(&f, 0x401000).is_placeholder());
    // push rbp; mov rbp, rsp: real code
    let f = func(0x401000, &[0x55, 0x48, 0x89, 0xe5, 0x5d, 0xc3]);
    assert!(!plan_site(&f, 0x401000).is_placeholder());
}

#[test]
fn single_instruction_patches_are_told_apart() {
    // A 5-byte NOP (fentry, coldpatch): one instruction, patchable while running.
    let f = func(0x401000, &[0x0f, 0x1f, 0x44, 0x00, 0x00, 0x89, 0xf8, 0xc3]);
    assert!(plan_site(&f, 0x401000).single_instruction());
    // Five 1-byte NOPs (-fpatchable-function-entry=5): a thread may be between two.
    let f = func(0x401000, &[0x90, 0x90, 0x90, 0x90, 0x90, 0x89, 0xf8, 0xc3]);
    assert!(!plan_site(&f, 0x401000).single_instruction());
    // push rbp; mov rbp, rsp; ...: several instructions displaced.
    let f = func(0x401000, &[0x55, 0x48, 0x89, 0xe5, 0x89, 0xf8, 0x5d, 0xc3]);
    assert!(!plan_site(&f, 0x401000).single_instruction());
    // An int3 site replaces one byte of one instruction.
    let g = func(0x401000, &[0xc3, 0x55, 0x48, 0x89, 0xe5, 0x5d, 0xc3]);
    assert!(plan_site(&g, 0x401000).single_instruction());
}
