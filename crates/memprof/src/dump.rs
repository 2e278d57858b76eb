//! The file `libweft_memprof.so` writes at the target's exit (`c/memprof.c`,
//! `finish`): a header, the allocation sites, the objects with their merged counts,
//! and the process's `/proc/self/maps` for symbolization. Little-endian, fixed
//! records.

use anyhow::{bail, Result};

pub const MAGIC: &[u8; 8] = b"WEFTMP03";
const HEADER: usize = 14 * 8;
const SITE: usize = 8 + 4 + 4 + 16 * 8;
const OBJ: usize = 5 * 8 + 4 * 4 + 4 * 8;

/// Object flag: freed before the end.
pub const OBJ_FREED: u32 = 1;

#[derive(Clone, Debug, Default)]
pub struct Site {
    /// The site table index objects name.
    pub index: u32,
    /// Return addresses, innermost first (the allocation function's caller).
    pub pcs: Vec<u64>,
}

#[derive(Clone, Debug, Default)]
pub struct Object {
    /// 1, 2, ... in allocation order.
    pub id: u64,
    pub base: u64,
    pub size: u64,
    pub max_size: u64,
    pub t_alloc: u64,
    pub t_free: u64,
    pub site: u32,
    pub tid: u32,
    pub reallocs: u32,
    pub flags: u32,
    pub reads: u64,
    pub writes: u64,
    pub read_bytes: u64,
    pub write_bytes: u64,
}

impl Object {
    pub fn freed(&self) -> bool {
        self.flags & OBJ_FREED != 0
    }
    pub fn accesses(&self) -> u64 {
        self.reads + self.writes
    }
}

#[derive(Clone, Debug, Default)]
pub struct Dump {
    pub dropped: u64,
    pub depth: u64,
    pub t_start: u64,
    pub t_end: u64,
    pub sampled: bool,
    pub sites_dropped: u64,
    /// Sampled mode: the samples taken (signals handled).
    pub samples: u64,
    pub sample_hits: u64,
    pub sample_lost: u64,
    /// Allocation stacks came from `backtrace()` (else the frame-pointer walk).
    pub unwound: bool,
    /// Sampled mode: single steps taken to reach an access.
    pub sample_steps: u64,
    pub sites: Vec<Site>,
    pub objects: Vec<Object>,
    pub maps: String,
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}
fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

pub fn parse(b: &[u8]) -> Result<Dump> {
    if b.len() < HEADER || &b[..8] != MAGIC {
        bail!("not a weft memprof dump (bad magic)");
    }
    let nobjs = u64_at(b, 8) as usize;
    let nsites = u64_at(b, 16) as usize;
    let mut d = Dump {
        dropped: u64_at(b, 24),
        depth: u64_at(b, 32),
        t_start: u64_at(b, 40),
        t_end: u64_at(b, 48),
        sampled: u64_at(b, 56) == 1,
        sites_dropped: u64_at(b, 64),
        samples: u64_at(b, 72),
        sample_hits: u64_at(b, 80),
        sample_lost: u64_at(b, 88),
        unwound: u64_at(b, 96) == 1,
        sample_steps: u64_at(b, 104),
        ..Dump::default()
    };
    let need = HEADER + nsites * SITE + nobjs * OBJ;
    if b.len() < need {
        bail!("truncated memprof dump ({} of {need} bytes)", b.len());
    }
    let mut at = HEADER;
    for _ in 0..nsites {
        let n = (u32_at(b, at + 8) as usize).min(16);
        let pcs = (0..n).map(|k| u64_at(b, at + 16 + 8 * k)).collect();
        d.sites.push(Site {
            index: u32_at(b, at + 12),
            pcs,
        });
        at += SITE;
    }
    for i in 0..nobjs {
        d.objects.push(Object {
            id: i as u64 + 1,
            base: u64_at(b, at),
            size: u64_at(b, at + 8),
            max_size: u64_at(b, at + 16),
            t_alloc: u64_at(b, at + 24),
            t_free: u64_at(b, at + 32),
            site: u32_at(b, at + 40),
            tid: u32_at(b, at + 44),
            reallocs: u32_at(b, at + 48),
            flags: u32_at(b, at + 52),
            reads: u64_at(b, at + 56),
            writes: u64_at(b, at + 64),
            read_bytes: u64_at(b, at + 72),
            write_bytes: u64_at(b, at + 80),
        });
        at += OBJ;
    }
    d.maps = String::from_utf8_lossy(&b[at..]).into_owned();
    Ok(d)
}
