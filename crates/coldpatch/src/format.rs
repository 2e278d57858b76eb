//! The probe list format: the contents of the `.weft.probes` section, and the
//! placeholder bytes.
//!
//! `.weft.probes` is a non-allocated `SHT_PROGBITS` section (never loaded), aligned
//! to 8. Version 1, all integers little-endian:
//!
//! ```text
//! header, header_size bytes (24 in version 1)
//!   0  [u8; 8]  magic "\x7fWEFTPL\0"
//!   8  u16      version = 1 (a reader refuses other versions)
//!  10  u16      header_size = 24 (entries start here)
//!  12  u16      entry_size = 32
//!  14  u16      flags = 0
//!  16  u32      count: number of entries
//!  20  u32      strings_size: bytes in the string table
//! entries, count * entry_size bytes, sorted by vaddr, one per placeholder
//!   0  u64      vaddr: file virtual address of the placeholder (add the load bias)
//!   8  u64      function vaddr: the instrumented function (`this_fn`), 0 if unknown
//!  16  u32      function name: offset in the string table (never empty)
//!  20  u32      location: offset of "file:line" in the string table (0 = "" = unknown)
//!  24  u8       kind: 1 = entry, 2 = exit, 3 = entry placeholder in a stub outside the
//!               function (`weft prepare`: the function's entry jumps to the stub)
//!  25  u8       length of the placeholder in bytes (5, or 6 for `call *GOT(%rip)`)
//!  26  u8       flags: bit 0 TAIL (the call was a tail `jmp`; the placeholder is
//!               `ret` + NOPs), bit 1 INLINED (the site lies outside the function's
//!               own body: an inlined copy)
//!  27  [u8; 5]  zero
//! string table, strings_size bytes: NUL-terminated UTF-8 strings; offset 0 holds ""
//! ```
//!
//! Readers must accept larger `header_size` and `entry_size` (later versions may add
//! fields at the end) and check every offset. The reader is
//! `weft_symbols::ElfFile::weft_probes`.
//!
//! Function names are symbol names as in `.symtab` (mangled for C++). When `this_fn`
//! could not be determined, the name is that of the function holding the site and the
//! function vaddr is 0.

use std::collections::HashMap;

use weft_symbols::{WeftProbeKind, WeftProbeSite};

/// The section's name.
pub const SECTION: &str = weft_symbols::WEFT_PROBES_SECTION;
pub const MAGIC: &[u8; 8] = b"\x7fWEFTPL\0";
pub const VERSION: u16 = 1;
pub const HEADER_SIZE: u16 = 24;
pub const ENTRY_SIZE: u16 = 32;
pub const FLAG_TAIL: u8 = 1;
pub const FLAG_INLINED: u8 = 2;

/// Encodes a probe list (sites sorted by address).
pub fn encode(sites: &[WeftProbeSite]) -> Vec<u8> {
    let mut strings = Strings::default();
    let mut entries = Vec::with_capacity(sites.len() * usize::from(ENTRY_SIZE));
    for s in sites {
        let name = strings.add(&s.function);
        let location = s.location.as_deref().map_or(0, |l| strings.add(l));
        entries.extend_from_slice(&s.vaddr.to_le_bytes());
        entries.extend_from_slice(&s.function_vaddr.unwrap_or(0).to_le_bytes());
        entries.extend_from_slice(&name.to_le_bytes());
        entries.extend_from_slice(&location.to_le_bytes());
        let kind = match s.kind {
            WeftProbeKind::Entry => 1,
            WeftProbeKind::Exit => 2,
            WeftProbeKind::EntryStub => 3,
        };
        let flags = if s.tail { FLAG_TAIL } else { 0 } | if s.inlined { FLAG_INLINED } else { 0 };
        entries.extend_from_slice(&[kind, s.len, flags, 0, 0, 0, 0, 0]);
    }
    let mut out =
        Vec::with_capacity(usize::from(HEADER_SIZE) + entries.len() + strings.bytes.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&VERSION.to_le_bytes());
    out.extend_from_slice(&HEADER_SIZE.to_le_bytes());
    out.extend_from_slice(&ENTRY_SIZE.to_le_bytes());
    out.extend_from_slice(&0u16.to_le_bytes());
    out.extend_from_slice(&(sites.len() as u32).to_le_bytes());
    out.extend_from_slice(&(strings.bytes.len() as u32).to_le_bytes());
    out.extend_from_slice(&entries);
    out.extend_from_slice(&strings.bytes);
    out
}

/// A string table with offset 0 = "" and each distinct string stored once.
struct Strings {
    bytes: Vec<u8>,
    offsets: HashMap<String, u32>,
}

impl Default for Strings {
    fn default() -> Strings {
        Strings {
            bytes: vec![0],
            offsets: HashMap::new(),
        }
    }
}

impl Strings {
    fn add(&mut self, s: &str) -> u32 {
        if s.is_empty() {
            return 0;
        }
        if let Some(&off) = self.offsets.get(s) {
            return off;
        }
        let off = self.bytes.len() as u32;
        // A NUL inside a name would cut it short on reading; symbol names have none.
        self.bytes.extend(s.bytes().filter(|&b| b != 0));
        self.bytes.push(0);
        self.offsets.insert(s.to_string(), off);
        off
    }
}

/// The canonical multi-byte NOPs (Intel SDM, "Recommended Multi-Byte Sequence of NOP
/// Instruction"), by length.
const NOPS: [&[u8]; 10] = [
    &[],
    &[0x90],                                                 // nop
    &[0x66, 0x90],                                           // xchg %ax,%ax
    &[0x0f, 0x1f, 0x00],                                     // nopl (%rax)
    &[0x0f, 0x1f, 0x40, 0x00],                               // nopl 0x0(%rax)
    &[0x0f, 0x1f, 0x44, 0x00, 0x00],                         // nopl 0x0(%rax,%rax,1)
    &[0x66, 0x0f, 0x1f, 0x44, 0x00, 0x00],                   // nopw 0x0(%rax,%rax,1)
    &[0x0f, 0x1f, 0x80, 0x00, 0x00, 0x00, 0x00],             // nopl 0x0(%rax)
    &[0x0f, 0x1f, 0x84, 0x00, 0x00, 0x00, 0x00, 0x00],       // nopl 0x0(%rax,%rax,1)
    &[0x66, 0x0f, 0x1f, 0x84, 0x00, 0x00, 0x00, 0x00, 0x00], // nopw 0x0(%rax,%rax,1)
];

/// The bytes that replace a call (or, with `tail`, a tail `jmp`) of `len` bytes: one
/// NOP of exactly that length, or `ret` followed by one NOP for a tail jump. `None`
/// for lengths outside 5..=9 (weft leaves such instructions alone).
pub fn placeholder(len: usize, tail: bool) -> Option<Vec<u8>> {
    if !(5..NOPS.len()).contains(&len) {
        return None;
    }
    Some(if tail {
        let mut v = vec![0xc3]; // ret
        v.extend_from_slice(NOPS[len - 1]);
        v
    } else {
        NOPS[len].to_vec()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn site(
        vaddr: u64,
        kind: WeftProbeKind,
        function: &str,
        location: Option<&str>,
    ) -> WeftProbeSite {
        WeftProbeSite {
            vaddr,
            kind,
            function: function.into(),
            function_vaddr: Some(0x1000),
            location: location.map(Into::into),
            len: 5,
            tail: false,
            inlined: false,
        }
    }

    #[test]
    fn round_trips_through_the_reader() {
        let mut sites = vec![
            site(0x1010, WeftProbeKind::Entry, "add", Some("/src/t.c:3")),
            site(0x1020, WeftProbeKind::Exit, "add", Some("/src/t.c:3")),
            site(0x1030, WeftProbeKind::Exit, "_ZN3foo3barEi", None),
        ];
        sites[2].tail = true;
        sites[2].inlined = true;
        sites[2].len = 6;
        sites[2].function_vaddr = None;
        let bytes = encode(&sites);
        assert_eq!(weft_symbols::parse_weft_probes(&bytes).unwrap(), sites);
        // Strings are stored once: "", "add", "/src/t.c:3", "_ZN3foo3barEi".
        let strings = 1 + 4 + 11 + 14;
        assert_eq!(bytes.len(), 24 + 3 * 32 + strings);
        assert_eq!(&bytes[..8], b"\x7fWEFTPL\0");
    }

    #[test]
    fn entry_stub_kind_round_trips() {
        // `weft prepare`'s placeholders: kind 3, the function's own address kept.
        let mut stub = site(0x6000, WeftProbeKind::EntryStub, "fib", None);
        stub.function_vaddr = Some(0x1250);
        let bytes = encode(std::slice::from_ref(&stub));
        assert_eq!(bytes[24 + 24], 3);
        assert_eq!(weft_symbols::parse_weft_probes(&bytes).unwrap(), [stub]);
    }

    #[test]
    fn empty_list() {
        let bytes = encode(&[]);
        assert_eq!(bytes.len(), 25);
        assert_eq!(weft_symbols::parse_weft_probes(&bytes).unwrap(), []);
    }

    #[test]
    fn placeholder_bytes() {
        // call rel32 → nopl 0x0(%rax,%rax,1)
        assert_eq!(
            placeholder(5, false).unwrap(),
            [0x0f, 0x1f, 0x44, 0x00, 0x00]
        );
        // call *disp32(%rip) → nopw 0x0(%rax,%rax,1)
        assert_eq!(
            placeholder(6, false).unwrap(),
            [0x66, 0x0f, 0x1f, 0x44, 0x00, 0x00]
        );
        // jmp rel32 → ret; nopl 0x0(%rax)
        assert_eq!(
            placeholder(5, true).unwrap(),
            [0xc3, 0x0f, 0x1f, 0x40, 0x00]
        );
        // jmp *disp32(%rip) → ret; nopl 0x0(%rax,%rax,1)
        assert_eq!(
            placeholder(6, true).unwrap(),
            [0xc3, 0x0f, 0x1f, 0x44, 0x00, 0x00]
        );
        assert_eq!(placeholder(4, false), None);
        assert_eq!(placeholder(10, true), None);
        // Every placeholder decodes to exactly the instructions named above.
        for len in 5..=9 {
            for tail in [false, true] {
                let bytes = placeholder(len, tail).unwrap();
                assert_eq!(bytes.len(), len);
                let mut d =
                    iced_x86::Decoder::with_ip(64, &bytes, 0, iced_x86::DecoderOptions::NONE);
                let first = d.decode();
                if tail {
                    assert_eq!(first.mnemonic(), iced_x86::Mnemonic::Ret);
                    assert_eq!(d.decode().mnemonic(), iced_x86::Mnemonic::Nop);
                } else {
                    assert_eq!(first.mnemonic(), iced_x86::Mnemonic::Nop);
                    assert_eq!(first.len(), len);
                }
                assert!(!d.can_decode());
            }
        }
    }
}
