//! The probe list `weft coldpatch` leaves in a binary: the `.weft.probes` section.
//!
//! The format is defined (and written) by the `weft-coldpatch` crate; see its
//! `format` module for the layout. In short: a 24-byte header (magic
//! `"\x7fWEFTPL\0"`, version, header and entry sizes, count, string table size), then
//! `count` entries of `entry_size` bytes (placeholder address, instrumented function's
//! address, name and `file:line` offsets into the string table, kind — entry, exit, or
//! entry in a `weft prepare` stub —, length, flags),
//! then the string table. All little-endian.
//!
//! This reader accepts any `header_size >= 24` and `entry_size >= 32` (fields added
//! later are skipped), and only version 1. Anything malformed is an error, never a
//! panic.

use crate::elf::ElfFile;
use crate::error::{Error, Result};

/// The name of the section holding the probe list.
pub const WEFT_PROBES_SECTION: &str = ".weft.probes";

const MAGIC: &[u8; 8] = b"\x7fWEFTPL\0";
const VERSION: u16 = 1;
const MIN_HEADER: usize = 24;
const MIN_ENTRY: usize = 32;
const FLAG_TAIL: u8 = 1;
const FLAG_INLINED: u8 = 2;

/// Entry or exit placeholder.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WeftProbeKind {
    /// Was `call __cyg_profile_func_enter`.
    Entry,
    /// Was `call __cyg_profile_func_exit` (or a tail `jmp` to it).
    Exit,
    /// Made by `weft prepare`: the placeholder is the first instruction of a stub
    /// outside the function, which the function's entry jumps to (the stub goes on
    /// with the relocated prologue and jumps back). The machine state there is the
    /// function's entry state. `vaddr` is in the stub; `function_vaddr` is the
    /// function's own address. Kind 3 in the file: a reader that predates it refuses
    /// the whole list (and so weaves at the real entry, which jumps to the stub).
    EntryStub,
}

/// One placeholder of a coldpatched binary.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WeftProbeSite {
    /// File virtual address of the placeholder's first byte.
    pub vaddr: u64,
    pub kind: WeftProbeKind,
    /// The instrumented function: the symbol at the address the compiler passed as
    /// `this_fn`, or, when that could not be determined, the function holding the site.
    pub function: String,
    /// `this_fn`, the instrumented function's address, when it was determined.
    pub function_vaddr: Option<u64>,
    /// `file:line` of the placeholder, from DWARF, when the binary had it.
    pub location: Option<String>,
    /// Placeholder length in bytes (the replaced instruction's: 5, or 6 for
    /// `call *GOT(%rip)`).
    pub len: u8,
    /// The replaced instruction was a tail `jmp` (the placeholder is `ret` + NOPs; a
    /// hot patch writes a `jmp`, not a `call`).
    pub tail: bool,
    /// The site lies outside `function`'s own body: a copy of `function` inlined into
    /// another one.
    pub inlined: bool,
}

/// Parses the contents of a `.weft.probes` section. `Err` holds what is wrong.
pub fn parse_weft_probes(data: &[u8]) -> std::result::Result<Vec<WeftProbeSite>, String> {
    if data.len() < MIN_HEADER {
        return Err(format!("{} bytes, shorter than its header", data.len()));
    }
    if &data[..8] != MAGIC {
        return Err("bad magic".into());
    }
    let u16_at = |i: usize| u16::from_le_bytes([data[i], data[i + 1]]);
    let u32_at = |b: &[u8], i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
    let version = u16_at(8);
    if version != VERSION {
        return Err(format!(
            "version {version}, this weft reads version {VERSION}"
        ));
    }
    let header_size = usize::from(u16_at(10));
    let entry_size = usize::from(u16_at(12));
    let count = u32_at(data, 16) as usize;
    let strings_size = u32_at(data, 20) as usize;
    if header_size < MIN_HEADER || entry_size < MIN_ENTRY {
        return Err(format!(
            "header size {header_size} or entry size {entry_size} too small"
        ));
    }
    let entries_end = count
        .checked_mul(entry_size)
        .and_then(|n| n.checked_add(header_size))
        .ok_or("entry table size overflows")?;
    let strings_end = entries_end
        .checked_add(strings_size)
        .ok_or("string table size overflows")?;
    if strings_end > data.len() {
        return Err(format!(
            "{count} entries and {strings_size} bytes of strings need {strings_end} bytes, the section has {}",
            data.len()
        ));
    }
    let strings = &data[entries_end..strings_end];
    let string_at = |off: u32| -> std::result::Result<String, String> {
        let rest = strings
            .get(off as usize..)
            .ok_or_else(|| format!("string offset {off} outside the string table"))?;
        let end = rest
            .iter()
            .position(|&b| b == 0)
            .ok_or_else(|| format!("string at offset {off} is not terminated"))?;
        Ok(String::from_utf8_lossy(&rest[..end]).into_owned())
    };
    let mut out = Vec::with_capacity(count);
    for i in 0..count {
        let e = &data[header_size + i * entry_size..header_size + (i + 1) * entry_size];
        let u64_at = |j: usize| u64::from_le_bytes(e[j..j + 8].try_into().unwrap_or([0; 8]));
        let vaddr = u64_at(0);
        let kind = match e[24] {
            1 => WeftProbeKind::Entry,
            2 => WeftProbeKind::Exit,
            3 => WeftProbeKind::EntryStub,
            k => return Err(format!("entry {i}: unknown kind {k}")),
        };
        let len = e[25];
        if !(1..=15).contains(&len) {
            return Err(format!("entry {i}: placeholder length {len}"));
        }
        let flags = e[26];
        let function = string_at(u32_at(e, 16))?;
        if function.is_empty() {
            return Err(format!("entry {i}: no function name"));
        }
        let location = string_at(u32_at(e, 20))?;
        let func = u64_at(8);
        out.push(WeftProbeSite {
            vaddr,
            kind,
            function,
            function_vaddr: (func != 0).then_some(func),
            location: (!location.is_empty()).then_some(location),
            len,
            tail: flags & FLAG_TAIL != 0,
            inlined: flags & FLAG_INLINED != 0,
        });
    }
    Ok(out)
}

impl ElfFile {
    /// The probe list of a binary made by `weft coldpatch`, in address order; empty
    /// when the file has no `.weft.probes` section. A malformed list is an error.
    pub fn weft_probes(&self) -> Result<Vec<WeftProbeSite>> {
        let Some(section) = self.section(WEFT_PROBES_SECTION) else {
            return Ok(Vec::new());
        };
        parse_weft_probes(self.section_data(section)).map_err(|why| Error::Malformed {
            path: self.path().to_path_buf(),
            what: format!("its {WEFT_PROBES_SECTION} probe list: {why}"),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A list of two sites, built by hand (the writer lives in weft-coldpatch).
    fn sample() -> Vec<u8> {
        let strings = b"\0main\0t.c:3\0";
        let mut d = Vec::new();
        d.extend_from_slice(MAGIC);
        d.extend_from_slice(&1u16.to_le_bytes());
        d.extend_from_slice(&24u16.to_le_bytes());
        d.extend_from_slice(&32u16.to_le_bytes());
        d.extend_from_slice(&0u16.to_le_bytes());
        d.extend_from_slice(&2u32.to_le_bytes());
        d.extend_from_slice(&(strings.len() as u32).to_le_bytes());
        for (vaddr, kind, loc, len, flags) in
            [(0x1139u64, 1u8, 6u32, 5u8, 0u8), (0x1150, 2, 0, 6, 1)]
        {
            d.extend_from_slice(&vaddr.to_le_bytes());
            d.extend_from_slice(&0x1130u64.to_le_bytes());
            d.extend_from_slice(&1u32.to_le_bytes());
            d.extend_from_slice(&loc.to_le_bytes());
            d.extend_from_slice(&[kind, len, flags, 0, 0, 0, 0, 0]);
        }
        d.extend_from_slice(strings);
        d
    }

    #[test]
    fn reads_a_list() {
        let sites = parse_weft_probes(&sample()).unwrap();
        assert_eq!(
            sites,
            [
                WeftProbeSite {
                    vaddr: 0x1139,
                    kind: WeftProbeKind::Entry,
                    function: "main".into(),
                    function_vaddr: Some(0x1130),
                    location: Some("t.c:3".into()),
                    len: 5,
                    tail: false,
                    inlined: false,
                },
                WeftProbeSite {
                    vaddr: 0x1150,
                    kind: WeftProbeKind::Exit,
                    function: "main".into(),
                    function_vaddr: Some(0x1130),
                    location: None,
                    len: 6,
                    tail: true,
                    inlined: false,
                },
            ]
        );
    }

    #[test]
    fn truncated_or_garbled_lists_are_errors() {
        let good = sample();
        // Every truncation.
        for n in 0..good.len() {
            assert!(parse_weft_probes(&good[..n]).is_err(), "truncated to {n}");
        }
        // Every single-byte corruption: an error or a list, never a panic.
        for i in 0..good.len() {
            for v in [0u8, 0x7f, 0xff] {
                let mut bad = good.clone();
                bad[i] = v;
                let _ = parse_weft_probes(&bad);
            }
        }
        let err = |f: &dyn Fn(&mut Vec<u8>)| {
            let mut d = good.clone();
            f(&mut d);
            parse_weft_probes(&d).unwrap_err()
        };
        assert_eq!(err(&|d| d[1] = b'X'), "bad magic");
        assert_eq!(err(&|d| d[8] = 2), "version 2, this weft reads version 1");
        assert_eq!(err(&|d| d[24 + 24] = 9), "entry 0: unknown kind 9");
        assert_eq!(err(&|d| d[24 + 25] = 0), "entry 0: placeholder length 0");
        assert!(err(&|d| d[16] = 200).contains("200 entries"));
        assert!(err(&|d| d[24 + 16] = 100).contains("outside the string table"));
        assert!(err(&|d| {
            d.pop();
            d.push(b'x');
        })
        .contains("not terminated"));
    }
}
