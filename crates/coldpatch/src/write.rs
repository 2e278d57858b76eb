//! Writing the output file: the input's bytes with the placeholders in, then a new
//! section (`.weft.probes`) and a new section header table at the end.
//!
//! Nothing that is loaded moves or changes, apart from the placeholders and three
//! fields of the ELF header (`e_shoff`, `e_shnum`, `e_shstrndx`, which the loader does
//! not read). After the loaded bytes, the non-allocated sections (debug info,
//! `.comment`, `.symtab`...) are copied in their order, without the ones `strip`
//! removes, followed by the section name table with ".weft.probes" added, the probe
//! list, and the section header table. (When the file holds unaccounted bytes after
//! its loaded part, nothing moves: the new parts are appended after everything and
//! the stripped sections are zeroed where they are.)

const SHT_PROGBITS: u32 = 1;
const SHT_SYMTAB: u32 = 2;
const SHT_STRTAB: u32 = 3;
const SHT_NOBITS: u32 = 8;
const SHT_SYMTAB_SHNDX: u32 = 18;
const SHF_ALLOC: u64 = 2;
const SHF_INFO_LINK: u64 = 0x40;
const SHN_LORESERVE: usize = 0xff00;
const SHDR_SIZE: usize = 64;

/// One section header, decoded.
#[derive(Clone, Debug)]
struct Shdr {
    name: u32,
    kind: u32,
    flags: u64,
    addr: u64,
    offset: u64,
    size: u64,
    link: u32,
    info: u32,
    align: u64,
    entsize: u64,
}

impl Shdr {
    fn parse(b: &[u8]) -> Shdr {
        let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().unwrap_or([0; 4]));
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap_or([0; 8]));
        Shdr {
            name: u32_at(0),
            kind: u32_at(4),
            flags: u64_at(8),
            addr: u64_at(16),
            offset: u64_at(24),
            size: u64_at(32),
            link: u32_at(40),
            info: u32_at(44),
            align: u64_at(48),
            entsize: u64_at(56),
        }
    }

    fn write(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.name.to_le_bytes());
        out.extend_from_slice(&self.kind.to_le_bytes());
        out.extend_from_slice(&self.flags.to_le_bytes());
        out.extend_from_slice(&self.addr.to_le_bytes());
        out.extend_from_slice(&self.offset.to_le_bytes());
        out.extend_from_slice(&self.size.to_le_bytes());
        out.extend_from_slice(&self.link.to_le_bytes());
        out.extend_from_slice(&self.info.to_le_bytes());
        out.extend_from_slice(&self.align.to_le_bytes());
        out.extend_from_slice(&self.entsize.to_le_bytes());
    }

    /// The file bytes it occupies, if any.
    fn file_range(&self) -> Option<(u64, u64)> {
        (self.kind != SHT_NOBITS && self.kind != 0 && self.size > 0)
            .then(|| (self.offset, self.offset.saturating_add(self.size)))
    }
}

fn overlaps(a: (u64, u64), b: (u64, u64)) -> bool {
    a.0 < b.1 && b.0 < a.1
}

/// `(offset, end)` file ranges of the program headers.
fn segment_ranges(data: &[u8]) -> Vec<(u64, u64)> {
    let phoff = u64_at(data, 0x20) as usize;
    let phnum = usize::from(u16_at(data, 0x38));
    (0..phnum)
        .filter_map(|i| {
            let p = data.get(phoff + i * 56..phoff + (i + 1) * 56)?;
            let off = u64::from_le_bytes(p[8..16].try_into().ok()?);
            let filesz = u64::from_le_bytes(p[32..40].try_into().ok()?);
            Some((off, off.saturating_add(filesz)))
        })
        .collect()
}

fn u16_at(d: &[u8], i: usize) -> u16 {
    u16::from_le_bytes([d[i], d[i + 1]])
}

fn u64_at(d: &[u8], i: usize) -> u64 {
    u64::from_le_bytes(d[i..i + 8].try_into().unwrap_or([0; 8]))
}

/// What was done to the section table.
pub(crate) struct Written {
    pub bytes: Vec<u8>,
    /// Names of the sections removed by `strip`.
    pub stripped: Vec<String>,
}

/// Builds the output file from `data` (already validated as a 64-bit little-endian
/// ELF file) with `patched` (same length, placeholders in), the section contents
/// `section` named `name`, and, with `strip`, `.symtab` and its string table removed.
/// `Err` says why the file's section table cannot be rewritten.
pub(crate) fn append_section(
    data: &[u8],
    mut patched: Vec<u8>,
    name: &str,
    section: &[u8],
    strip: bool,
) -> Result<Written, String> {
    let shoff = u64_at(data, 0x28) as usize;
    let shentsize = usize::from(u16_at(data, 0x3a));
    let shnum = usize::from(u16_at(data, 0x3c));
    let shstrndx = usize::from(u16_at(data, 0x3e));
    if shoff == 0 || shnum == 0 {
        return Err("it has no section header table".into());
    }
    if shentsize != SHDR_SIZE {
        return Err(format!("section headers of {shentsize} bytes"));
    }
    if shstrndx == 0 || shstrndx >= shnum {
        return Err("no section name table (or extended section numbering)".into());
    }
    let table_end = shnum
        .checked_mul(SHDR_SIZE)
        .and_then(|n| n.checked_add(shoff))
        .filter(|&end| end <= data.len())
        .ok_or("the section header table lies outside the file")?;
    let mut shdrs: Vec<Shdr> = data[shoff..table_end]
        .chunks_exact(SHDR_SIZE)
        .map(Shdr::parse)
        .collect();

    let section_name = |names: &[u8], off: u32| -> String {
        let rest = names.get(off as usize..).unwrap_or(&[]);
        let end = rest.iter().position(|&b| b == 0).unwrap_or(rest.len());
        String::from_utf8_lossy(&rest[..end]).into_owned()
    };
    let shstr = &shdrs[shstrndx];
    let old_names = data
        .get(shstr.offset as usize..(shstr.offset as usize).saturating_add(shstr.size as usize))
        .ok_or("the section name table lies outside the file")?
        .to_vec();
    if shdrs
        .iter()
        .any(|s| section_name(&old_names, s.name) == name)
    {
        return Err(format!("it already has a {name} section"));
    }

    // Sections to remove: every symbol table, the string table it uses (unless
    // something else uses it too, or it is allocated), and its index tables.
    let mut remove = vec![false; shnum];
    let mut stripped = Vec::new();
    if strip {
        for (i, s) in shdrs.iter().enumerate() {
            if s.kind == SHT_SYMTAB && s.flags & SHF_ALLOC == 0 {
                remove[i] = true;
            }
        }
        for (i, s) in shdrs.iter().enumerate() {
            if s.kind == SHT_SYMTAB_SHNDX && remove.get(s.link as usize) == Some(&true) {
                remove[i] = true;
            }
        }
        let strtabs: Vec<usize> = shdrs
            .iter()
            .enumerate()
            .filter(|(i, _)| remove[*i])
            .map(|(_, s)| s.link as usize)
            .collect();
        for t in strtabs {
            let Some(s) = shdrs.get(t) else { continue };
            let shared = shdrs
                .iter()
                .enumerate()
                .any(|(i, o)| !remove[i] && o.link as usize == t);
            if s.kind == SHT_STRTAB && s.flags & SHF_ALLOC == 0 && t != shstrndx && !shared {
                remove[t] = true;
            }
        }
        for (i, s) in shdrs.iter().enumerate() {
            if remove[i] {
                stripped.push(section_name(&old_names, s.name));
            }
        }
    }
    let mut new_index = vec![0u32; shnum];
    let mut next = 0u32;
    for i in 0..shnum {
        if !remove[i] {
            new_index[i] = next;
            next += 1;
        }
    }
    let remap = |idx: u32| -> u32 {
        match new_index.get(idx as usize) {
            Some(&n) if !remove[idx as usize] => n,
            _ => 0,
        }
    };
    for s in shdrs.iter_mut() {
        if s.link != 0 {
            s.link = remap(s.link);
        }
        if s.flags & SHF_INFO_LINK != 0 && s.info != 0 {
            s.info = remap(s.info);
        }
    }
    let kept: Vec<usize> = (0..shnum).filter(|&i| !remove[i]).collect();
    let new_shnum = kept.len() + 1;
    if new_shnum >= SHN_LORESERVE {
        return Err(format!(
            "{new_shnum} sections need extended section numbering"
        ));
    }
    let new_shstrndx = new_index[shstrndx] as usize;
    let mut names = old_names.clone();
    if names.last() != Some(&0) {
        names.push(0);
    }
    let name_offset = names.len() as u32;
    names.extend_from_slice(name.as_bytes());
    names.push(0);

    // The tail: the bytes after everything the program headers cover. Non-allocated
    // sections there (debug info, .comment, .symtab, the name table) are laid out
    // anew, without the removed ones. If the tail holds bytes that neither such a
    // section nor the section header table accounts for (an archive appended to the
    // program, say), everything stays where it is and the new parts are appended.
    let load_end = segment_ranges(data)
        .iter()
        .map(|r| r.1)
        .max()
        .unwrap_or(0)
        .min(data.len() as u64);
    let in_tail = |s: &Shdr| {
        s.kind != 0 && s.kind != SHT_NOBITS && s.flags & SHF_ALLOC == 0 && s.offset >= load_end
    };
    let mut accounted: Vec<(u64, u64)> = shdrs
        .iter()
        .filter(|s| in_tail(s))
        .filter_map(Shdr::file_range)
        .collect();
    accounted.push((shoff as u64, table_end as u64));
    let compact = (load_end..data.len() as u64)
        .all(|at| data[at as usize] == 0 || accounted.iter().any(|&(lo, hi)| lo <= at && at < hi));

    let mut out;
    let mut headers: Vec<Shdr> = kept.iter().map(|&i| shdrs[i].clone()).collect();
    if compact {
        out = patched;
        out.truncate(load_end as usize);
        let mut order: Vec<usize> = (0..kept.len()).collect();
        order.sort_by_key(|&k| headers[k].offset);
        for k in order {
            let h = &mut headers[k];
            if k == new_shstrndx || !in_tail(h) {
                continue;
            }
            let align = if h.align.is_power_of_two() && h.align <= 4096 {
                h.align as usize
            } else {
                1
            };
            pad_to(&mut out, align);
            let bytes = data
                .get(h.offset as usize..(h.offset + h.size) as usize)
                .ok_or("a section lies outside the file")?;
            h.offset = out.len() as u64;
            out.extend_from_slice(bytes);
        }
    } else {
        // Blank the removed sections' bytes when nothing else lives there.
        let segments = segment_ranges(data);
        for (i, s) in shdrs.iter().enumerate() {
            let Some(range) = s.file_range().filter(|_| remove[i]) else {
                continue;
            };
            let alone = !segments.iter().any(|&g| overlaps(g, range))
                && !shdrs
                    .iter()
                    .enumerate()
                    .any(|(j, o)| !remove[j] && o.file_range().is_some_and(|r| overlaps(r, range)));
            if alone {
                if let Some(bytes) = patched.get_mut(range.0 as usize..range.1 as usize) {
                    bytes.fill(0);
                }
            }
        }
        out = patched;
    }

    let names_offset = out.len() as u64;
    out.extend_from_slice(&names);
    headers[new_shstrndx].offset = names_offset;
    headers[new_shstrndx].size = names.len() as u64;
    pad_to(&mut out, 8);
    let section_offset = out.len() as u64;
    out.extend_from_slice(section);
    pad_to(&mut out, 8);
    let new_shoff = out.len() as u64;
    for h in &headers {
        h.write(&mut out);
    }
    Shdr {
        name: name_offset,
        kind: SHT_PROGBITS,
        flags: 0,
        addr: 0,
        offset: section_offset,
        size: section.len() as u64,
        link: 0,
        info: 0,
        align: 8,
        entsize: 0,
    }
    .write(&mut out);

    out[0x28..0x30].copy_from_slice(&new_shoff.to_le_bytes());
    out[0x3c..0x3e].copy_from_slice(&(new_shnum as u16).to_le_bytes());
    out[0x3e..0x40].copy_from_slice(&(new_shstrndx as u16).to_le_bytes());
    Ok(Written {
        bytes: out,
        stripped,
    })
}

fn pad_to(v: &mut Vec<u8>, align: usize) {
    while !v.len().is_multiple_of(align) {
        v.push(0);
    }
}
