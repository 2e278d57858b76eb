//! USDT / SDT probes: the `.note.stapsdt` notes `<sys/sdt.h>` leaves in a binary, and
//! their argument specs (`-4@%edi`, `8@-8(%rbp)`).
//!
//! Each note (`NT_STAPSDT` = 3, owner `stapsdt`) holds three 8-byte addresses — the
//! probe's NOP (`pc`), the link-time address of the `.stapsdt.base` section (`base`)
//! and the semaphore (0 for none) — then `provider\0name\0args\0`. If the file's
//! `.stapsdt.base` section now sits elsewhere (prelink), `pc` moves by the same amount,
//! as bcc and libbpf do; semaphores are taken as recorded.

use weft_ir::MachineReg;

use crate::elf::{parse_notes, ElfFile};
use crate::error::{Error, Result};

const NT_STAPSDT: u32 = 3;

/// One USDT probe site.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UsdtProbe {
    pub provider: String,
    pub name: String,
    /// File virtual address of the probe's NOP (adjusted for `.stapsdt.base`).
    pub pc: u64,
    /// The `.stapsdt.base` address the note recorded.
    pub base: u64,
    /// File virtual address of the probe's semaphore (an `unsigned short` that the
    /// tracer must increment for `PROBE_ENABLED()` code to run), if it has one.
    pub semaphore: Option<u64>,
    /// The argument string as recorded, e.g. `-4@%edi 8@%rax`.
    pub args_spec: String,
}

impl UsdtProbe {
    /// The parsed arguments.
    pub fn args(&self) -> Result<Vec<ArgLoc>> {
        self.args_spec.split_whitespace().map(parse_arg).collect()
    }
}

/// Where a USDT argument lives at the probe site.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ArgLoc {
    /// Size in bytes: 1, 2, 4 or 8.
    pub size: u8,
    /// A negative size in the spec: sign-extend the value.
    pub signed: bool,
    pub kind: ArgKind,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ArgKind {
    /// The value is in a register (`%edi`).
    Reg(Register),
    /// A constant (`$5`).
    Imm(i64),
    /// In memory at `disp + base + index * scale` (`-8(%rbp)`, `(%rdi,%rsi,8)`).
    Mem {
        base: Option<Register>,
        index: Option<Register>,
        scale: u8,
        disp: i64,
    },
    /// In memory at `symbol + disp`, written RIP-relative (`foo(%rip)`, `foo+8(%rip)`);
    /// the address is a file virtual address (see [`ArgLoc::static_address`]). Without
    /// a symbol, `disp(%rip)` is relative to the next instruction, which the probe's
    /// NOP does not define: weft treats it as `pc + disp`.
    RipRel { symbol: Option<String>, disp: i64 },
}

/// A register as written in a spec, with the 64-bit register it is part of.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Register {
    /// As written, without `%`: `edi`, `r12d`, `ah`.
    pub name: String,
    pub reg: MachineReg,
    /// Width in bytes: 1, 2, 4 or 8.
    pub bytes: u8,
    /// `ah`, `bh`, `ch`, `dh`: bits 8..16 of the register.
    pub high_byte: bool,
}

impl ArgLoc {
    /// The file virtual address of a [`ArgKind::RipRel`] argument with a symbol.
    pub fn static_address(&self, elf: &ElfFile) -> Option<u64> {
        match &self.kind {
            ArgKind::RipRel {
                symbol: Some(s),
                disp,
            } => elf.symbol_vaddr(s).map(|v| v.wrapping_add(*disp as u64)),
            _ => None,
        }
    }
}

/// Parses the contents of a `.note.stapsdt` section. `stapsdt_base` is the address of
/// the file's `.stapsdt.base` section, if it has one. Malformed notes are skipped.
pub fn parse_stapsdt_notes(section: &[u8], stapsdt_base: Option<u64>) -> Vec<UsdtProbe> {
    let mut out = Vec::new();
    for note in parse_notes(section, 4) {
        if note.name != b"stapsdt" || note.kind != NT_STAPSDT || note.desc.len() < 24 {
            continue;
        }
        let word = |i: usize| u64::from_le_bytes(note.desc[i..i + 8].try_into().unwrap_or([0; 8]));
        let (mut pc, base, semaphore) = (word(0), word(8), word(16));
        if let Some(actual) = stapsdt_base {
            if base != 0 {
                pc = pc.wrapping_add(actual.wrapping_sub(base));
            }
        }
        let mut strings = note.desc[24..]
            .split(|&b| b == 0)
            .map(|s| String::from_utf8_lossy(s).into_owned());
        let (Some(provider), Some(name)) = (strings.next(), strings.next()) else {
            continue;
        };
        out.push(UsdtProbe {
            provider,
            name,
            pc,
            base,
            semaphore: (semaphore != 0).then_some(semaphore),
            args_spec: strings.next().unwrap_or_default(),
        });
    }
    out
}

impl ElfFile {
    /// The file's USDT probes, in note order.
    pub fn usdt_probes(&self) -> Vec<UsdtProbe> {
        let Some(notes) = self.sections().iter().find(|s| s.name == ".note.stapsdt") else {
            return Vec::new();
        };
        let base = self.section(".stapsdt.base").map(|s| s.addr);
        parse_stapsdt_notes(self.section_data(notes), base)
    }
}

/// Parses one argument spec: `[-]SIZE@LOCATION`, or a bare `LOCATION` (size 8).
pub fn parse_arg(spec: &str) -> Result<ArgLoc> {
    let err = |why| Error::UsdtArg {
        spec: spec.to_string(),
        why,
    };
    let (size, signed, loc) = match spec.split_once('@') {
        Some((sz, loc)) => {
            let n: i32 = sz.parse().map_err(|_| err("bad size"))?;
            let abs = n.unsigned_abs();
            if !matches!(abs, 1 | 2 | 4 | 8) {
                return Err(err("size must be 1, 2, 4 or 8"));
            }
            (abs as u8, n < 0, loc)
        }
        None => (8, false, spec),
    };
    let kind = if let Some(r) = loc.strip_prefix('%') {
        ArgKind::Reg(register(r).ok_or_else(|| err("unknown register"))?)
    } else if let Some(imm) = loc.strip_prefix('$') {
        ArgKind::Imm(parse_int(imm).ok_or_else(|| err("bad immediate"))?)
    } else {
        parse_mem(loc).ok_or_else(|| err("bad memory operand"))?
    };
    Ok(ArgLoc { size, signed, kind })
}

/// `DISP(%base,%index,scale)`, `SYMBOL[+-N](%rip)`, `(%base)`, `N`.
fn parse_mem(loc: &str) -> Option<ArgKind> {
    let (disp_text, inner) = match loc.find('(') {
        Some(open) => {
            let inner = loc[open + 1..].strip_suffix(')')?;
            (&loc[..open], Some(inner))
        }
        None => (loc, None),
    };
    let Some(inner) = inner else {
        return Some(ArgKind::Mem {
            base: None,
            index: None,
            scale: 1,
            disp: parse_int(disp_text)?,
        });
    };
    let parts: Vec<&str> = inner.split(',').map(str::trim).collect();
    if parts.len() > 3 {
        return None;
    }
    let reg_part = |s: &str| -> Option<Option<Register>> {
        if s.is_empty() {
            Some(None)
        } else {
            Some(Some(register(s.strip_prefix('%')?)?))
        }
    };
    let base = reg_part(parts[0])?;
    if base.as_ref().is_some_and(|b| b.reg == MachineReg::Rip) {
        if parts.len() > 1 {
            return None;
        }
        let (symbol, disp) = split_symbol(disp_text)?;
        return Some(ArgKind::RipRel { symbol, disp });
    }
    let index = match parts.get(1) {
        Some(s) => reg_part(s)?,
        None => None,
    };
    let scale = match parts.get(2) {
        Some(s) if !s.is_empty() => match s.parse::<u8>().ok()? {
            n @ (1 | 2 | 4 | 8) => n,
            _ => return None,
        },
        _ => 1,
    };
    if base.is_none() && index.is_none() {
        return None;
    }
    let disp = if disp_text.is_empty() {
        0
    } else {
        parse_int(disp_text)?
    };
    Some(ArgKind::Mem {
        base,
        index,
        scale,
        disp,
    })
}

/// `foo`, `foo+8`, `foo-8`, `16`, `` → (symbol, displacement).
fn split_symbol(text: &str) -> Option<(Option<String>, i64)> {
    if text.is_empty() {
        return Some((None, 0));
    }
    if let Some(n) = parse_int(text) {
        return Some((None, n));
    }
    let cut = text
        .char_indices()
        .skip(1)
        .find(|&(_, c)| c == '+' || c == '-')
        .map(|(i, _)| i);
    let (sym, off) = match cut {
        Some(i) => (&text[..i], parse_int(&text[i..])?),
        None => (text, 0),
    };
    let ok = sym
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '$'))
        && !sym.starts_with(|c: char| c.is_ascii_digit());
    ok.then(|| (Some(sym.to_string()), off))
}

/// Decimal or `0x` hex, with an optional sign.
fn parse_int(text: &str) -> Option<i64> {
    let (neg, digits) = match text.strip_prefix('-') {
        Some(d) => (true, d),
        None => (false, text.strip_prefix('+').unwrap_or(text)),
    };
    let v = match digits
        .strip_prefix("0x")
        .or_else(|| digits.strip_prefix("0X"))
    {
        Some(h) => u64::from_str_radix(h, 16).ok()?,
        None => digits.parse::<u64>().ok()?,
    };
    Some(if neg {
        (v as i64).wrapping_neg()
    } else {
        v as i64
    })
}

/// Looks up an x86-64 register name (without `%`).
pub fn register(name: &str) -> Option<Register> {
    use MachineReg::*;
    let legacy: [(MachineReg, [&str; 5]); 8] = [
        (Rax, ["rax", "eax", "ax", "al", "ah"]),
        (Rbx, ["rbx", "ebx", "bx", "bl", "bh"]),
        (Rcx, ["rcx", "ecx", "cx", "cl", "ch"]),
        (Rdx, ["rdx", "edx", "dx", "dl", "dh"]),
        (Rsi, ["rsi", "esi", "si", "sil", ""]),
        (Rdi, ["rdi", "edi", "di", "dil", ""]),
        (Rbp, ["rbp", "ebp", "bp", "bpl", ""]),
        (Rsp, ["rsp", "esp", "sp", "spl", ""]),
    ];
    let make = |reg, bytes, high_byte| {
        Some(Register {
            name: name.to_string(),
            reg,
            bytes,
            high_byte,
        })
    };
    for (reg, names) in legacy {
        if let Some(i) = names.iter().position(|n| !n.is_empty() && *n == name) {
            return make(reg, [8, 4, 2, 1, 1][i], i == 4);
        }
    }
    if name == "rip" || name == "eip" {
        return make(Rip, if name == "rip" { 8 } else { 4 }, false);
    }
    let num = name.strip_prefix('r')?;
    let digits = num.find(|c: char| !c.is_ascii_digit()).unwrap_or(num.len());
    let n: u8 = num[..digits].parse().ok()?;
    let bytes = match &num[digits..] {
        "" => 8,
        "d" => 4,
        "w" => 2,
        "b" | "l" => 1,
        _ => return None,
    };
    let reg = [R8, R9, R10, R11, R12, R13, R14, R15].get(usize::from(n.checked_sub(8)?))?;
    make(*reg, bytes, false)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reg(name: &str) -> Register {
        register(name).unwrap()
    }

    #[test]
    fn argument_specs() {
        let table: Vec<(&str, ArgLoc)> = vec![
            (
                "-4@%edi",
                ArgLoc {
                    size: 4,
                    signed: true,
                    kind: ArgKind::Reg(reg("edi")),
                },
            ),
            (
                "8@%rax",
                ArgLoc {
                    size: 8,
                    signed: false,
                    kind: ArgKind::Reg(reg("rax")),
                },
            ),
            (
                "4@$5",
                ArgLoc {
                    size: 4,
                    signed: false,
                    kind: ArgKind::Imm(5),
                },
            ),
            (
                "-4@$-5",
                ArgLoc {
                    size: 4,
                    signed: true,
                    kind: ArgKind::Imm(-5),
                },
            ),
            (
                "8@$0x10",
                ArgLoc {
                    size: 8,
                    signed: false,
                    kind: ArgKind::Imm(16),
                },
            ),
            (
                "8@-8(%rbp)",
                ArgLoc {
                    size: 8,
                    signed: false,
                    kind: ArgKind::Mem {
                        base: Some(reg("rbp")),
                        index: None,
                        scale: 1,
                        disp: -8,
                    },
                },
            ),
            (
                "8@8(%rsp)",
                ArgLoc {
                    size: 8,
                    signed: false,
                    kind: ArgKind::Mem {
                        base: Some(reg("rsp")),
                        index: None,
                        scale: 1,
                        disp: 8,
                    },
                },
            ),
            (
                "-4@%r12d",
                ArgLoc {
                    size: 4,
                    signed: true,
                    kind: ArgKind::Reg(reg("r12d")),
                },
            ),
            (
                "8@foo(%rip)",
                ArgLoc {
                    size: 8,
                    signed: false,
                    kind: ArgKind::RipRel {
                        symbol: Some("foo".into()),
                        disp: 0,
                    },
                },
            ),
            (
                "4@counter+4(%rip)",
                ArgLoc {
                    size: 4,
                    signed: false,
                    kind: ArgKind::RipRel {
                        symbol: Some("counter".into()),
                        disp: 4,
                    },
                },
            ),
            (
                "8@(%rdi,%rsi,8)",
                ArgLoc {
                    size: 8,
                    signed: false,
                    kind: ArgKind::Mem {
                        base: Some(reg("rdi")),
                        index: Some(reg("rsi")),
                        scale: 8,
                        disp: 0,
                    },
                },
            ),
            (
                "2@0x10(,%rcx,2)",
                ArgLoc {
                    size: 2,
                    signed: false,
                    kind: ArgKind::Mem {
                        base: None,
                        index: Some(reg("rcx")),
                        scale: 2,
                        disp: 16,
                    },
                },
            ),
            (
                "1@%al",
                ArgLoc {
                    size: 1,
                    signed: false,
                    kind: ArgKind::Reg(reg("al")),
                },
            ),
            (
                "%rdx",
                ArgLoc {
                    size: 8,
                    signed: false,
                    kind: ArgKind::Reg(reg("rdx")),
                },
            ),
        ];
        for (spec, want) in table {
            assert_eq!(parse_arg(spec).unwrap(), want, "{spec}");
        }
    }

    #[test]
    fn registers() {
        let r = reg("r12d");
        assert_eq!((r.reg, r.bytes, r.high_byte), (MachineReg::R12, 4, false));
        let r = reg("ah");
        assert_eq!((r.reg, r.bytes, r.high_byte), (MachineReg::Rax, 1, true));
        let r = reg("sil");
        assert_eq!((r.reg, r.bytes), (MachineReg::Rsi, 1));
        assert_eq!(reg("r8b").bytes, 1);
        assert_eq!(reg("r15w").bytes, 2);
        assert!(register("r16").is_none());
        assert!(register("r7").is_none());
        assert!(register("xmm0").is_none());
    }

    #[test]
    fn bad_specs_are_errors() {
        for spec in [
            "3@%eax",
            "x@%eax",
            "8@%foo",
            "8@$x",
            "8@(%rax",
            "8@()",
            "8@(%rax,%rbx,3)",
            "8@1(%rip,%rax)",
            "8@9sym(%rip)",
        ] {
            assert!(parse_arg(spec).is_err(), "{spec}");
        }
        assert_eq!(
            parse_arg("8@%foo").unwrap_err().to_string(),
            "cannot parse USDT argument `8@%foo`: unknown register"
        );
    }

    #[test]
    fn notes_with_base_adjustment() {
        let mut desc = Vec::new();
        desc.extend_from_slice(&0x1139u64.to_le_bytes());
        desc.extend_from_slice(&0x2004u64.to_le_bytes());
        desc.extend_from_slice(&0x4010u64.to_le_bytes());
        desc.extend_from_slice(b"myapp\0start\0-4@%edi 8@%rsi\0");
        let mut note = Vec::new();
        note.extend_from_slice(&8u32.to_le_bytes());
        note.extend_from_slice(&(desc.len() as u32).to_le_bytes());
        note.extend_from_slice(&3u32.to_le_bytes());
        note.extend_from_slice(b"stapsdt\0");
        note.extend_from_slice(&desc);
        while note.len() % 4 != 0 {
            note.push(0);
        }
        let probes = parse_stapsdt_notes(&note, Some(0x2004));
        assert_eq!(probes.len(), 1);
        let p = &probes[0];
        assert_eq!(
            (p.provider.as_str(), p.name.as_str(), p.pc),
            ("myapp", "start", 0x1139)
        );
        assert_eq!(p.semaphore, Some(0x4010));
        assert_eq!(p.args().unwrap().len(), 2);
        // The base section moved by 0x100: so does the pc.
        assert_eq!(parse_stapsdt_notes(&note, Some(0x2104))[0].pc, 0x1239);
        // Garbage never panics.
        assert!(parse_stapsdt_notes(&note[..20], None).is_empty());
    }
}
