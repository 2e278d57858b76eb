//! `ElfFile::weft_probes` on real files: a `.weft.probes` section added with objcopy,
//! well-formed, truncated or garbled.

mod common;

use common::{cc, run};
use weft_symbols::{ElfFile, Error, WeftProbeKind};

/// A version-1 list of one entry site in `main`, at `vaddr`.
fn list(vaddr: u64) -> Vec<u8> {
    let strings = b"\0main\0app.c:2\0";
    let mut d = Vec::new();
    d.extend_from_slice(b"\x7fWEFTPL\0");
    for v in [1u16, 24, 32, 0] {
        d.extend_from_slice(&v.to_le_bytes());
    }
    d.extend_from_slice(&1u32.to_le_bytes());
    d.extend_from_slice(&(strings.len() as u32).to_le_bytes());
    d.extend_from_slice(&vaddr.to_le_bytes());
    d.extend_from_slice(&vaddr.to_le_bytes());
    d.extend_from_slice(&1u32.to_le_bytes());
    d.extend_from_slice(&6u32.to_le_bytes());
    d.extend_from_slice(&[1, 5, 0, 0, 0, 0, 0, 0]);
    d.extend_from_slice(strings);
    d
}

#[test]
fn reads_and_rejects_lists_in_real_files() {
    let dir = tempfile::tempdir().unwrap();
    let exe = cc(
        dir.path(),
        "app",
        &[("app.c", "int main(void) { return 0; }\n")],
        &["-O2"],
    );
    let elf = ElfFile::open(&exe).unwrap();
    assert_eq!(elf.weft_probes().unwrap(), []);
    let main = elf
        .functions()
        .iter()
        .find(|f| f.name() == "main")
        .unwrap()
        .vaddr;

    let with = |name: &str, data: &[u8]| {
        let section = dir.path().join(format!("{name}.bin"));
        std::fs::write(&section, data).unwrap();
        let out = dir.path().join(name);
        run(
            "objcopy",
            &[
                "--add-section",
                &format!(".weft.probes={}", section.display()),
                exe.to_str().unwrap(),
                out.to_str().unwrap(),
            ],
        );
        ElfFile::open(&out).unwrap()
    };

    let good = list(main);
    let sites = with("good", &good).weft_probes().unwrap();
    assert_eq!(sites.len(), 1);
    assert_eq!(
        (
            sites[0].vaddr,
            sites[0].kind,
            sites[0].function.as_str(),
            sites[0].location.as_deref()
        ),
        (main, WeftProbeKind::Entry, "main", Some("app.c:2"))
    );

    let truncated = with("truncated", &good[..good.len() - 4]);
    let e = truncated.weft_probes().unwrap_err();
    assert!(matches!(e, Error::Malformed { .. }), "{e}");
    assert!(
        e.to_string().ends_with(
            "is a malformed ELF file: its .weft.probes probe list: 1 entries and 14 bytes of strings need 70 bytes, the section has 66"
        ),
        "{e}"
    );

    let mut garbled = good.clone();
    garbled[24..56].fill(0xff);
    let e = with("garbled", &garbled).weft_probes().unwrap_err();
    assert!(e.to_string().contains("entry 0: unknown kind 255"), "{e}");

    let e = with("empty", &[]).weft_probes().unwrap_err();
    assert!(e.to_string().contains("shorter than its header"), "{e}");
}
