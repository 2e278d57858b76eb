//! Writing the output file: the input's bytes (function entries patched) unchanged in
//! place, then, appended:
//!
//! ```text
//! [zero fill to a page boundary]
//! new program header table   ← PT_LOAD R   (PT_PHDR points here)
//! [fill to the next page]
//! stubs                      ← PT_LOAD R+X (section .weft.text)
//! .weft.probes               (not loaded)
//! .shstrtab with the two new names
//! section header table: the old headers, .weft.text, .weft.probes
//! ```
//!
//! The program header table must grow by two entries and there is no room after the
//! old one (the first section follows it), so it moves to the end of the file, in a
//! loaded segment of its own (as E9Patch does): the loader finds it through `AT_PHDR`,
//! which the kernel computes from the PT_LOAD holding `e_phoff`, and ld.so takes the
//! load bias from PT_PHDR. The new segments' file offsets are chosen so that
//! `vaddr - offset` is the first PT_LOAD's (when that costs at most 16 MiB of fill):
//! then kernels older than 5.18, which computed `AT_PHDR` as the first segment's
//! address plus `e_phoff`, find it too. The new PT_LOADs go right after the last old
//! one (the loader wants them in address order), above every old segment's end (bss
//! included). The old program header table stays where it was, unused. Nothing that
//! was loaded moves; only the function entries and the ELF header's
//! `e_phoff`/`e_phnum`/`e_shoff`/`e_shnum` change.
//!
//! Written by hand rather than with `object::write`: that crate writes relocatable
//! objects, and its ELF builder re-lays out the whole file, which would move loaded
//! bytes; this needs the file kept as it is with a few fields changed.

const PAGE: u64 = 0x1000;
const PHDR_SIZE: u64 = 56;
const SHDR_SIZE: usize = 64;
const PT_LOAD: u32 = 1;
const PT_PHDR: u32 = 6;
const PF_X: u32 = 1;
const PF_R: u32 = 4;
const SHT_PROGBITS: u32 = 1;
const SHF_ALLOC: u64 = 2;
const SHF_EXECINSTR: u64 = 4;
const SHN_LORESERVE: u16 = 0xff00;
/// Largest zero fill spent to keep `vaddr - offset` uniform.
const MAX_FILL: u64 = 16 << 20;

/// Where the stubs will be loaded, decided before they are encoded.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Layout {
    /// File offset and address of the new program header table.
    pub phdr_offset: u64,
    pub phdr_vaddr: u64,
    /// Its size in bytes.
    pub phdr_size: u64,
    /// File offset and address of the stub segment.
    pub stub_offset: u64,
    pub stub_vaddr: u64,
}

fn u16_at(d: &[u8], i: usize) -> u16 {
    u16::from_le_bytes([d[i], d[i + 1]])
}
fn u32_at(d: &[u8], i: usize) -> u32 {
    u32::from_le_bytes(d[i..i + 4].try_into().unwrap_or([0; 4]))
}
fn u64_at(d: &[u8], i: usize) -> u64 {
    u64::from_le_bytes(d[i..i + 8].try_into().unwrap_or([0; 8]))
}
fn align_up(v: u64, a: u64) -> u64 {
    v.div_ceil(a) * a
}

#[derive(Clone, Copy, Debug)]
struct Phdr {
    kind: u32,
    flags: u32,
    offset: u64,
    vaddr: u64,
    paddr: u64,
    filesz: u64,
    memsz: u64,
    align: u64,
}

impl Phdr {
    fn parse(b: &[u8]) -> Phdr {
        Phdr {
            kind: u32_at(b, 0),
            flags: u32_at(b, 4),
            offset: u64_at(b, 8),
            vaddr: u64_at(b, 16),
            paddr: u64_at(b, 24),
            filesz: u64_at(b, 32),
            memsz: u64_at(b, 40),
            align: u64_at(b, 48),
        }
    }
    fn write(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.kind.to_le_bytes());
        out.extend_from_slice(&self.flags.to_le_bytes());
        for v in [
            self.offset,
            self.vaddr,
            self.paddr,
            self.filesz,
            self.memsz,
            self.align,
        ] {
            out.extend_from_slice(&v.to_le_bytes());
        }
    }
}

fn phdrs(data: &[u8]) -> Result<Vec<Phdr>, String> {
    let phoff = u64_at(data, 0x20) as usize;
    let phnum = usize::from(u16_at(data, 0x38));
    (0..phnum)
        .map(|i| {
            data.get(phoff + i * 56..phoff + (i + 1) * 56)
                .map(Phdr::parse)
                .ok_or_else(|| "the program header table is cut short".to_string())
        })
        .collect()
}

/// Plans where the new parts go in a file of `data`.
pub(crate) fn layout(data: &[u8]) -> Result<Layout, String> {
    let ph = phdrs(data)?;
    let loads: Vec<&Phdr> = ph.iter().filter(|p| p.kind == PT_LOAD).collect();
    let first = loads
        .iter()
        .min_by_key(|p| p.vaddr)
        .ok_or("no loadable segment")?;
    let delta = first.vaddr.wrapping_sub(first.offset);
    let max_end = loads.iter().map(|p| p.vaddr + p.memsz).max().unwrap_or(0);
    let file_end = align_up(data.len() as u64, PAGE);
    let phdr_size = (ph.len() as u64 + 2) * PHDR_SIZE;
    let mut vaddr = align_up(max_end, PAGE).max(file_end.wrapping_add(delta));
    let mut offset = vaddr.wrapping_sub(delta);
    if delta % PAGE != 0 || offset < file_end || offset - file_end > MAX_FILL {
        offset = file_end;
        vaddr = align_up(max_end, PAGE);
    }
    let stub_offset = offset + align_up(phdr_size, PAGE);
    Ok(Layout {
        phdr_offset: offset,
        phdr_vaddr: vaddr,
        phdr_size,
        stub_offset,
        stub_vaddr: vaddr + (stub_offset - offset),
    })
}

/// Builds the output: `patched` (the input with its entries patched, same length),
/// then the parts of [`layout`] with `stubs` and the probe list `probes`.
pub(crate) fn write(
    patched: &[u8],
    l: &Layout,
    stubs: &[u8],
    probes: &[u8],
) -> Result<Vec<u8>, String> {
    let data = patched;
    let ph = phdrs(data)?;
    let shoff = u64_at(data, 0x28) as usize;
    let shentsize = usize::from(u16_at(data, 0x3a));
    let shnum = u16_at(data, 0x3c);
    let shstrndx = u16_at(data, 0x3e);
    if shoff == 0 || shnum == 0 || shentsize != SHDR_SIZE {
        return Err("it has no usable section header table".into());
    }
    if shnum >= SHN_LORESERVE - 2 || shstrndx == 0 || shstrndx >= shnum {
        return Err("its section table uses extended numbering".into());
    }
    let shdr = |i: usize| data.get(shoff + i * SHDR_SIZE..shoff + (i + 1) * SHDR_SIZE);
    let mut shdrs: Vec<Vec<u8>> = (0..usize::from(shnum))
        .map(|i| shdr(i).map(<[u8]>::to_vec))
        .collect::<Option<_>>()
        .ok_or("the section header table is cut short")?;

    // Program headers: PT_PHDR moved, two PT_LOADs after the last one.
    let mut table = Vec::with_capacity(l.phdr_size as usize);
    let last_load = ph.iter().rposition(|p| p.kind == PT_LOAD).unwrap_or(0);
    for (i, p) in ph.iter().enumerate() {
        let mut p = *p;
        if p.kind == PT_PHDR {
            p.offset = l.phdr_offset;
            p.vaddr = l.phdr_vaddr;
            p.paddr = l.phdr_vaddr;
            p.filesz = l.phdr_size;
            p.memsz = l.phdr_size;
        }
        p.write(&mut table);
        if i == last_load {
            Phdr {
                kind: PT_LOAD,
                flags: PF_R,
                offset: l.phdr_offset,
                vaddr: l.phdr_vaddr,
                paddr: l.phdr_vaddr,
                filesz: l.phdr_size,
                memsz: l.phdr_size,
                align: PAGE,
            }
            .write(&mut table);
            Phdr {
                kind: PT_LOAD,
                flags: PF_R | PF_X,
                offset: l.stub_offset,
                vaddr: l.stub_vaddr,
                paddr: l.stub_vaddr,
                filesz: stubs.len() as u64,
                memsz: stubs.len() as u64,
                align: PAGE,
            }
            .write(&mut table);
        }
    }
    debug_assert_eq!(table.len() as u64, l.phdr_size);

    let mut out = data.to_vec();
    out.resize(l.phdr_offset as usize, 0);
    out.extend_from_slice(&table);
    out.resize(l.stub_offset as usize, 0);
    out.extend_from_slice(stubs);

    // The probe list.
    out.resize(align_up(out.len() as u64, 8) as usize, 0);
    let probes_offset = out.len() as u64;
    out.extend_from_slice(probes);

    // The section name table, copied with the new names added.
    let strtab_hdr = &shdrs[usize::from(shstrndx)];
    let (str_off, str_size) = (
        u64_at(strtab_hdr, 24) as usize,
        u64_at(strtab_hdr, 32) as usize,
    );
    let mut names = data
        .get(str_off..str_off + str_size)
        .ok_or("the section name table is cut short")?
        .to_vec();
    let text_name = names.len() as u32;
    names.extend_from_slice(b".weft.text\0");
    let probes_name = names.len() as u32;
    names.extend_from_slice(weft_coldpatch::format::SECTION.as_bytes());
    names.push(0);
    let names_offset = out.len() as u64;
    out.extend_from_slice(&names);
    {
        let h = &mut shdrs[usize::from(shstrndx)];
        h[24..32].copy_from_slice(&names_offset.to_le_bytes());
        h[32..40].copy_from_slice(&(names.len() as u64).to_le_bytes());
    }

    let section = |name: u32, flags: u64, addr: u64, offset: u64, size: u64, align: u64| {
        let mut h = Vec::with_capacity(SHDR_SIZE);
        h.extend_from_slice(&name.to_le_bytes());
        h.extend_from_slice(&SHT_PROGBITS.to_le_bytes());
        for v in [flags, addr, offset, size] {
            h.extend_from_slice(&v.to_le_bytes());
        }
        h.extend_from_slice(&0u32.to_le_bytes()); // link
        h.extend_from_slice(&0u32.to_le_bytes()); // info
        h.extend_from_slice(&align.to_le_bytes());
        h.extend_from_slice(&0u64.to_le_bytes()); // entsize
        h
    };
    shdrs.push(section(
        text_name,
        SHF_ALLOC | SHF_EXECINSTR,
        l.stub_vaddr,
        l.stub_offset,
        stubs.len() as u64,
        16,
    ));
    shdrs.push(section(
        probes_name,
        0,
        0,
        probes_offset,
        probes.len() as u64,
        8,
    ));

    out.resize(align_up(out.len() as u64, 8) as usize, 0);
    let new_shoff = out.len() as u64;
    for h in &shdrs {
        out.extend_from_slice(h);
    }

    // ELF header.
    out[0x20..0x28].copy_from_slice(&l.phdr_offset.to_le_bytes());
    out[0x28..0x30].copy_from_slice(&new_shoff.to_le_bytes());
    out[0x38..0x3a].copy_from_slice(&((ph.len() + 2) as u16).to_le_bytes());
    out[0x3c..0x3e].copy_from_slice(&(shnum + 2).to_le_bytes());
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn align() {
        assert_eq!(align_up(0, PAGE), 0);
        assert_eq!(align_up(1, PAGE), PAGE);
        assert_eq!(align_up(PAGE, PAGE), PAGE);
    }
}
