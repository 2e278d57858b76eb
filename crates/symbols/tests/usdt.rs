//! USDT probes from `<sys/sdt.h>`, with and without semaphores.

mod common;

use common::{cc, nm_addr};
use weft_symbols::{list, resolve_usdt, ArgKind, ElfFile, Error, ListSource};

const PLAIN: &str = r#"
#include <sys/sdt.h>
__attribute__((noinline)) int nosem(int a, long b) { DTRACE_PROBE2(myprov, plain, a, b); return a; }
"#;

const GATED: &str = r#"
#define _SDT_HAS_SEMAPHORES 1
#include <sys/sdt.h>
__extension__ unsigned short myprov_gated_semaphore __attribute__((unused)) __attribute__((section(".probes")));
__attribute__((noinline)) void gated(long v) { DTRACE_PROBE1(myprov, gated, v); }
"#;

const MAIN: &str = r#"
int nosem(int a, long b);
void gated(long v);
int main(int argc, char **argv) { gated(argc); (void)argv; return nosem(argc, 7); }
"#;

#[test]
fn notes_semaphores_and_arguments() {
    let dir = tempfile::tempdir().unwrap();
    for flags in [
        &["-O2", "-pie", "-fPIE"][..],
        &["-O0", "-no-pie", "-fno-pie"][..],
    ] {
        let exe = cc(
            dir.path(),
            "app",
            &[("plain.c", PLAIN), ("gated.c", GATED), ("main.c", MAIN)],
            flags,
        );
        let elf = ElfFile::open(&exe).unwrap();
        let probes = elf.usdt_probes();
        assert_eq!(probes.len(), 2, "{probes:?}");

        let plain = probes.iter().find(|p| p.name == "plain").unwrap();
        assert_eq!(plain.provider, "myprov");
        assert_eq!(plain.semaphore, None);
        // The pc is the probe's NOP, inside nosem.
        let nosem = elf
            .functions()
            .iter()
            .find(|f| f.name() == "nosem")
            .unwrap();
        assert!(
            plain.pc >= nosem.vaddr && plain.pc < nosem.vaddr + nosem.size,
            "{flags:?}"
        );
        assert_eq!(elf.read_vaddr(plain.pc, 1).unwrap(), [0x90]);
        let args = plain.args().unwrap();
        assert_eq!(args.len(), 2, "{}", plain.args_spec);
        assert_eq!(
            (args[0].size, args[0].signed),
            (4, true),
            "{}",
            plain.args_spec
        );
        assert_eq!(
            (args[1].size, args[1].signed),
            (8, true),
            "{}",
            plain.args_spec
        );
        if flags[0] == "-O2" {
            // Arguments arrive in registers: edi and rsi.
            assert!(
                matches!(&args[0].kind, ArgKind::Reg(r) if r.name == "edi"),
                "{}",
                plain.args_spec
            );
        }

        let gated = probes.iter().find(|p| p.name == "gated").unwrap();
        assert_eq!(
            gated.semaphore,
            Some(nm_addr(&exe, "myprov_gated_semaphore"))
        );
        let g = elf
            .functions()
            .iter()
            .find(|f| f.name() == "gated")
            .unwrap();
        assert!(gated.pc >= g.vaddr && gated.pc < g.vaddr + g.size);
        let args = gated.args().unwrap();
        assert_eq!((args.len(), args[0].size, args[0].signed), (1, 8, true));

        // Resolution and listing.
        assert_eq!(resolve_usdt(&elf, "myprov", "gated").unwrap().len(), 1);
        assert_eq!(resolve_usdt(&elf, "", "*").unwrap().len(), 2);
        assert_eq!(resolve_usdt(&elf, "my*", "pl?in").unwrap()[0].pc, plain.pc);
        let e = resolve_usdt(&elf, "myprov", "gatd").unwrap_err();
        assert!(matches!(e, Error::UsdtNotFound { .. }));
        assert_eq!(
            e.to_string(),
            format!(
                "USDT probe `myprov:gatd` not found in {}; did you mean `myprov:gated`?",
                exe.display()
            )
        );
        let abs = std::fs::canonicalize(&exe).unwrap();
        assert_eq!(
            list(&ListSource::File(exe.clone()), "usdt:*").unwrap(),
            [
                format!("usdt:{}:myprov:gated", abs.display()),
                format!("usdt:{}:myprov:plain", abs.display())
            ]
        );
    }
}

#[test]
fn no_notes_no_probes() {
    let dir = tempfile::tempdir().unwrap();
    let exe = cc(
        dir.path(),
        "app",
        &[("main.c", "int main(void) { return 0; }")],
        &[],
    );
    let elf = ElfFile::open(&exe).unwrap();
    assert!(elf.usdt_probes().is_empty());
    assert_eq!(
        resolve_usdt(&elf, "", "start").unwrap_err().to_string(),
        format!("USDT probe `start` not found in {}", exe.display())
    );
}
