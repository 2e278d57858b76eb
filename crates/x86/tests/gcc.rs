//! Real compiler output: `tests/data/functions.c` built with gcc across a flag matrix
//! (-O0/-O2, with and without -fcf-protection, PIE and not, -pg -mfentry, -fno-plt).
//! Every function symbol in each executable (crt code included) is planned; every plan
//! is relocated 1 GiB away and decoded again to check it is the same instruction
//! sequence: same instruction text with absolute addresses, so the same mnemonics,
//! registers, immediates, branch targets and `[rip+disp]` addresses; calls emulated
//! with the original return address; a jump back to the end of the displaced bytes.
//!
//! Run with `--nocapture` to see each build's plans.

use std::path::PathBuf;
use std::process::Command;

use iced_x86::{
    Code, Decoder, DecoderOptions, FlowControl, Formatter, Instruction, IntelFormatter,
    MemorySizeOptions, Mnemonic, OpKind, Register,
};
use object::{Object, ObjectSection, ObjectSymbol, SymbolKind};
use weft_x86::{
    branch_targets, patch_bytes, plan_site, relocate, FunctionCode, Reason, SitePlan, ENDBR64,
};

const SOURCE: &str = include_str!("data/functions.c");
const GIB: u64 = 1 << 30;

/// Our own functions in `functions.c` (the binaries also hold crt functions).
const OURS: &[&str] = &[
    "zero",
    "square",
    "bump",
    "lookup",
    "tls_bump",
    "gcd",
    "sum_to",
    "classify",
    "sum_ints",
    "checksum",
    "call_through",
    "say",
    "fail",
    "fib",
    "main",
];

struct Build {
    name: &'static str,
    flags: &'static [&'static str],
}

const BUILDS: &[Build] = &[
    Build {
        name: "O0-cet-pie",
        flags: &["-O0", "-fcf-protection=full", "-fPIE", "-pie"],
    },
    Build {
        name: "O0-nocet-pie",
        flags: &["-O0", "-fcf-protection=none", "-fPIE", "-pie"],
    },
    Build {
        name: "O0-cet-nopie",
        flags: &["-O0", "-fcf-protection=full", "-fno-pie", "-no-pie"],
    },
    Build {
        name: "O0-nocet-nopie",
        flags: &["-O0", "-fcf-protection=none", "-fno-pie", "-no-pie"],
    },
    Build {
        name: "O2-cet-pie",
        flags: &["-O2", "-fcf-protection=full", "-fPIE", "-pie"],
    },
    Build {
        name: "O2-nocet-pie",
        flags: &["-O2", "-fcf-protection=none", "-fPIE", "-pie"],
    },
    Build {
        name: "O2-cet-nopie",
        flags: &["-O2", "-fcf-protection=full", "-fno-pie", "-no-pie"],
    },
    Build {
        name: "O2-nocet-nopie",
        flags: &["-O2", "-fcf-protection=none", "-fno-pie", "-no-pie"],
    },
    Build {
        name: "O2-nocet-nopie-fentry",
        flags: &[
            "-O2",
            "-fcf-protection=none",
            "-fno-pie",
            "-no-pie",
            "-pg",
            "-mfentry",
        ],
    },
    Build {
        name: "O0-cet-pie-fentry",
        flags: &[
            "-O0",
            "-fcf-protection=full",
            "-fPIE",
            "-pie",
            "-pg",
            "-mfentry",
        ],
    },
    Build {
        name: "O2-cet-pie-noplt-protector",
        flags: &[
            "-O2",
            "-fcf-protection=full",
            "-fPIE",
            "-pie",
            "-fno-plt",
            "-fstack-protector-all",
        ],
    },
];

#[test]
fn every_function_of_every_build_is_planned_and_relocated_faithfully() {
    let scratch = Scratch::new();
    let dir = &scratch.0;
    let source = dir.join("functions.c");
    std::fs::write(&source, SOURCE).unwrap();
    for build in BUILDS {
        let exe = dir.join(build.name);
        let output = Command::new("gcc")
            .args(build.flags)
            .arg("-o")
            .arg(&exe)
            .arg(&source)
            .output()
            .expect("gcc must be installed to run this test");
        assert!(
            output.status.success(),
            "gcc {:?} failed: {}",
            build.flags,
            String::from_utf8_lossy(&output.stderr)
        );
        let elf = std::fs::read(&exe).unwrap();
        check_build(build, &functions(&elf));
    }
}

fn check_build(build: &Build, funcs: &[(String, FunctionCode)]) {
    let cet = build.flags.contains(&"-fcf-protection=full");
    let fentry = build.flags.contains(&"-mfentry");
    let o2 = build.flags.contains(&"-O2");
    let protector = build.flags.contains(&"-fstack-protector-all");
    println!("== {} ({} functions)", build.name, funcs.len());
    for ours in OURS {
        assert!(
            funcs.iter().any(|(name, _)| name == ours),
            "{}: no symbol {ours}",
            build.name
        );
    }

    let (mut jumps, mut emulated_calls) = (0, 0);
    for (name, f) in funcs {
        let plan = plan_site(f, f.addr);
        match &plan {
            SitePlan::Jump {
                patch_addr,
                displaced,
                ..
            } => {
                jumps += 1;
                let insns = decode_all(displaced, *patch_addr);
                let last = insns.last().unwrap().code();
                if matches!(last, Code::Call_rel32_64 | Code::Call_rm64) {
                    emulated_calls += 1;
                }
                println!("  {name:<28} jump  {}", texts(&insns));
            }
            SitePlan::Int3 { reason, .. } => println!("  {name:<28} int3  {reason}"),
            SitePlan::Refused { reason } => println!("  {name:<28} REFUSED {reason}"),
        }
        check_plan(build.name, name, f, &plan);

        if cet && OURS.contains(&name.as_str()) {
            assert!(f.bytes.starts_with(&ENDBR64), "{}: {name}", build.name);
            assert!(
                matches!(
                    plan,
                    SitePlan::Jump {
                        skipped_endbr: true,
                        ..
                    } | SitePlan::Int3 {
                        skipped_endbr: true,
                        ..
                    }
                ),
                "{}: {name}: {plan:?}",
                build.name
            );
        }
        if name == "zero" && o2 && !fentry && !protector {
            // xor eax, eax; ret
            assert_eq!(
                plan.reason(),
                Some(&Reason::TooShort { len: 3 }),
                "{}",
                build.name
            );
        }
        if name == "square" || name == "sum_to" || (name == "main" && !o2) {
            assert!(
                matches!(plan, SitePlan::Jump { .. }),
                "{}: {name}: {plan:?}",
                build.name
            );
        }
    }
    // Nearly everything is a jump site; the int3 ones are tiny crt functions and
    // `zero`. (Counted so that a planner refusing everything fails here.)
    assert!(
        jumps * 10 >= funcs.len() * 8,
        "{}: only {jumps} of {} functions are jump sites",
        build.name,
        funcs.len()
    );
    if fentry {
        // Every one of our functions starts with `call __fentry__` (`call rel32`, or
        // `call qword ptr [rip+x]` through the GOT in PIE).
        assert!(
            emulated_calls >= OURS.len(),
            "{}: {emulated_calls} fentry calls",
            build.name
        );
    }
}

/// Checks one plan against the function it was made for, then relocates it 1 GiB up
/// and checks the copy.
fn check_plan(build: &str, name: &str, f: &FunctionCode, plan: &SitePlan) {
    let ctx = format!("{build}: {name}: {plan:?}");
    let (patch_addr, displaced) = match plan {
        SitePlan::Jump {
            patch_addr,
            displaced_len,
            displaced,
            padding,
            skipped_endbr,
        } => {
            assert!(
                *displaced_len >= 5 && displaced.len() == *displaced_len,
                "{ctx}"
            );
            assert!(
                patch_addr + *displaced_len as u64 <= f.end() + *padding as u64,
                "{ctx}"
            );
            assert!(*padding <= f.padding.len(), "{ctx}");
            let displaced = &displaced[..displaced.len() - padding];
            assert_eq!(*skipped_endbr, f.bytes.starts_with(&ENDBR64), "{ctx}");
            for target in branch_targets(f) {
                assert!(
                    !(*patch_addr < target && target < patch_addr + *displaced_len as u64),
                    "{ctx}: branch to {target:#x}"
                );
            }
            // jmp trampoline; int3 padding
            let trampoline = patch_addr + GIB;
            let patch = patch_bytes(plan, trampoline).unwrap();
            let insns = decode_all(&patch, *patch_addr);
            assert_eq!(insns[0].code(), Code::Jmp_rel32_64, "{ctx}");
            assert_eq!(insns[0].near_branch_target(), trampoline, "{ctx}");
            assert!(insns[1..].iter().all(|i| i.code() == Code::Int3), "{ctx}");
            assert_eq!(patch.len(), plan.original_bytes().len(), "{ctx}");
            (*patch_addr, displaced)
        }
        SitePlan::Int3 {
            patch_addr,
            insn_len,
            displaced,
            ..
        } => {
            assert_eq!(displaced.len(), *insn_len, "{ctx}");
            assert_eq!(decode_all(displaced, *patch_addr).len(), 1, "{ctx}");
            (*patch_addr, &displaced[..])
        }
        SitePlan::Refused { .. } => panic!("{ctx}: gcc output should never be refused"),
    };
    let offset = (patch_addr - f.addr) as usize;
    assert_eq!(
        &f.bytes[offset..offset + displaced.len()],
        displaced,
        "{ctx}"
    );

    let new_addr = patch_addr + GIB;
    let code = relocate(plan, new_addr, true).unwrap_or_else(|e| panic!("{ctx}: {e}"));
    assert_equivalent(&ctx, displaced, patch_addr, &code, new_addr);
}

/// Checks that `code` at `new_addr` does what `orig` at `orig_addr` does, then jumps
/// back to the end of `orig` (unless `orig` ends in an unconditional transfer).
fn assert_equivalent(ctx: &str, orig: &[u8], orig_addr: u64, code: &[u8], new_addr: u64) {
    let orig = decode_all(orig, orig_addr);
    let relocated = decode_all(code, new_addr);
    let ctx = format!(
        "{ctx}\n  original:  {}\n  relocated: {}",
        texts(&orig),
        texts(&relocated)
    );
    let mut next = relocated.iter();
    let mut take = || {
        *next
            .next()
            .unwrap_or_else(|| panic!("{ctx}: relocated code too short"))
    };
    for o in &orig {
        if matches!(o.code(), Code::Call_rel32_64 | Code::Call_rm64) {
            // push imm32 [; mov dword ptr [rsp+4], imm32]; jmp <same operand>
            let push = take();
            assert_eq!(push.code(), Code::Pushq_imm32, "{ctx}");
            let mut pushed = push.immediate(0);
            let mut jmp = take();
            if jmp.code() == Code::Mov_rm32_imm32 {
                assert_eq!(
                    (jmp.memory_base(), jmp.memory_displacement64()),
                    (Register::RSP, 4),
                    "{ctx}"
                );
                pushed = (pushed & 0xffff_ffff) | (jmp.immediate(1) << 32);
                jmp = take();
            }
            assert_eq!(pushed, o.next_ip(), "{ctx}: return address");
            assert_eq!(jmp.mnemonic(), Mnemonic::Jmp, "{ctx}");
            assert_eq!(
                text(&jmp),
                text(o).replacen("call", "jmp", 1),
                "{ctx}: call target"
            );
            continue;
        }
        let r = take();
        assert_eq!(text(&r), text(o), "{ctx}");
        if o.op0_kind() == OpKind::NearBranch64 {
            assert_eq!(r.near_branch_target(), o.near_branch_target(), "{ctx}");
        }
        if o.is_ip_rel_memory_operand() {
            assert_eq!(r.memory_base(), Register::RIP, "{ctx}");
            assert_eq!(
                r.ip_rel_memory_address(),
                o.ip_rel_memory_address(),
                "{ctx}"
            );
        }
    }
    let last = orig.last().unwrap();
    let ends = matches!(
        last.flow_control(),
        FlowControl::Return
            | FlowControl::UnconditionalBranch
            | FlowControl::IndirectBranch
            | FlowControl::Exception
            | FlowControl::Call
            | FlowControl::IndirectCall
    ) && last.mnemonic() != Mnemonic::Syscall;
    if !ends {
        let back = take();
        assert_eq!(back.code(), Code::Jmp_rel32_64, "{ctx}: jump back");
        assert_eq!(
            back.near_branch_target(),
            last.next_ip(),
            "{ctx}: jump back"
        );
    }
    assert!(next.next().is_none(), "{ctx}: trailing instructions");
}

/// Every function symbol with a size, deduplicated by address, with its bytes.
fn functions(elf: &[u8]) -> Vec<(String, FunctionCode)> {
    let file = object::File::parse(elf).unwrap();
    let mut out: Vec<(String, FunctionCode)> = Vec::new();
    for sym in file.symbols() {
        if sym.kind() != SymbolKind::Text || !sym.is_definition() || sym.size() == 0 {
            continue;
        }
        if out.iter().any(|(_, f)| f.addr == sym.address()) {
            continue;
        }
        let section = file.section_by_index(sym.section_index().unwrap()).unwrap();
        let bytes = section
            .data_range(sym.address(), sym.size())
            .unwrap()
            .unwrap();
        out.push((
            sym.name().unwrap().to_string(),
            FunctionCode {
                addr: sym.address(),
                bytes: bytes.to_vec(),
                size_known: true,
                padding: Vec::new(),
            },
        ));
    }
    out.sort_by_key(|(_, f)| f.addr);
    out
}

fn decode_all(bytes: &[u8], addr: u64) -> Vec<Instruction> {
    let mut decoder = Decoder::with_ip(64, bytes, addr, DecoderOptions::NONE);
    let insns: Vec<Instruction> = decoder.iter().collect();
    assert!(
        insns.iter().all(|i| !i.is_invalid()),
        "undecodable bytes at {addr:#x}: {bytes:02x?}"
    );
    insns
}

/// Intel syntax with absolute addresses and no branch sizes: equal text means equal
/// instruction wherever it sits.
fn text(insn: &Instruction) -> String {
    let mut formatter = IntelFormatter::new();
    formatter.options_mut().set_hex_prefix("0x");
    formatter.options_mut().set_hex_suffix("");
    formatter.options_mut().set_rip_relative_addresses(false);
    formatter.options_mut().set_show_branch_size(false);
    formatter
        .options_mut()
        .set_memory_size_options(MemorySizeOptions::Always);
    let mut out = String::new();
    formatter.format(insn, &mut out);
    out
}

fn texts(insns: &[Instruction]) -> String {
    insns.iter().map(text).collect::<Vec<_>>().join("; ")
}

/// A temporary directory, removed when dropped (also when the test fails).
struct Scratch(PathBuf);

impl Scratch {
    fn new() -> Scratch {
        let dir = std::env::temp_dir().join(format!("weft-x86-gcc-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
