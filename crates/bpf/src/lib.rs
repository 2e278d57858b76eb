//! eBPF code generation for kernel probes: each kernel probe's advice
//! ([`weft_ir::Function`]) to eBPF instructions ([`codegen`]), and all of a program's
//! kernel probes with the maps they use to one ELF object ([`build`]) in the form
//! eBPF loaders read (programs in `tracepoint/CATEGORY/NAME` sections, maps in a
//! `maps` section, map references as relocations), which `weft-kernel` loads with
//! aya. Bytes in, bytes out: no system calls here.

pub mod codegen;
pub mod insn;

use std::collections::BTreeSet;

use object::write::{Object, Relocation, StandardSegment, Symbol, SymbolSection};
use object::{
    Architecture, BinaryFormat, Endianness, RelocationFlags, SectionKind, SymbolFlags, SymbolKind,
    SymbolScope,
};
use weft_ir::{Function, Inst, Program};

/// Kernel map types (`enum bpf_map_type`).
pub const MAP_HASH: u32 = 1;
pub const MAP_ARRAY: u32 = 2;

/// Most processes whose segment address the kernel keeps (members and their forked
/// children).
pub const MAX_MEMBERS: u32 = 1 << 14;
pub const MAP_PERCPU_HASH: u32 = 5;
pub const MAP_PERCPU_ARRAY: u32 = 6;
pub const MAP_RINGBUF: u32 = 27;

/// Largest event record (header included) a kernel probe may send.
pub const MAX_EVENT: u32 = 16 * 1024;

/// Why a kernel probe cannot be compiled.
#[derive(Debug, thiserror::Error)]
pub enum BpfError {
    #[error("{0} is not available in kernel probes yet")]
    Unsupported(&'static str),
    #[error("the advice needs {0} registers; a kernel probe has room for {1}")]
    TooManyRegs(u32, u32),
    #[error("the advice needs {0} bytes of values; a kernel probe has room for {1}")]
    FrameTooLarge(u32, u32),
    #[error("an event of {0} bytes; a kernel probe sends at most {1}")]
    EventTooLarge(u32, u32),
    #[error("the advice is too long for eBPF's jumps")]
    TooLong,
    #[error("internal error: {0}")]
    Bad(String),
}

/// A map the programs refer to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum MapRef {
    /// The ring buffer events go to.
    Ring,
    /// The processes whose events count, when filtered: a bit per pid (u64 words),
    /// the members weft puts there.
    Pids,
    /// The same for the children of those processes, which the fork program marks.
    Forked,
    /// Where each member process maps the session's segment (tgid → address).
    Segments,
    /// Per-CPU scratch: slots, temporaries, the zero value.
    Scratch,
    /// Per-CPU error counters by [`weft_ir::ErrorKind`].
    Errors,
    /// Processes whose agent has started (a bit per pid, set by the handover
    /// program at the agent's initializer): uprobe programs leave at once for them,
    /// the agent's own trampolines count from there on.
    Handed,
    /// weft map `i`.
    Map(u32),
}

impl MapRef {
    /// The map's symbol in the object (and its name in the kernel).
    pub fn name(self) -> String {
        match self {
            MapRef::Ring => "weft_ring".into(),
            MapRef::Pids => "weft_pids".into(),
            MapRef::Forked => "weft_forked".into(),
            MapRef::Segments => "weft_segs".into(),
            MapRef::Scratch => "weft_scratch".into(),
            MapRef::Errors => "weft_errors".into(),
            MapRef::Handed => "weft_handed".into(),
            MapRef::Map(i) => format!("weft_m{i}"),
        }
    }
}

/// How the kernel creates a map (`struct bpf_map_def` of the `maps` section).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MapSpec {
    pub map_type: u32,
    pub key_size: u32,
    pub value_size: u32,
    pub max_entries: u32,
}

/// What code generation needs to know about the session.
#[derive(Clone, Debug)]
pub struct Env {
    /// Only the processes in [`MapRef::Pids`] run the advice.
    pub filter_pids: bool,
    /// Possible CPUs (for reading per-CPU values in advice).
    pub ncpus: u32,
    /// `cpid`.
    pub cpid: u64,
    /// CLOCK_MONOTONIC time the session started (`elapsed`).
    pub start_ns: u64,
    /// CLOCK_REALTIME minus CLOCK_MONOTONIC (`time`, `strftime`).
    pub realtime_offset_ns: i64,
    /// `probe`: index into [`Program::probe_names`].
    pub probe_id: u32,
    /// Bytes of the zero value kept in scratch.
    pub zero_value: u32,
    /// Maps user-space probes write that kernel probes read: read from the current
    /// process's mapping of the session's segment.
    pub user_maps: std::collections::BTreeMap<u32, UserMap>,
    /// Bytes kept in scratch for a key read from user memory.
    pub key_buf: u32,
    /// A `syscalls:` tracepoint run from the raw `sys_enter`/`sys_exit` tracepoint.
    pub raw_syscall: Option<RawSyscall>,
    /// A user-space probe run from a kernel uprobe (`Some(true)`: a uretprobe) until
    /// the agent takes over: the context is the probed thread's `struct pt_regs`.
    pub uprobe: Option<bool>,
}

/// A `syscalls:sys_enter_NAME`/`sys_exit_NAME` probe compiled for the raw
/// `sys_enter`/`sys_exit` tracepoint: the program sees every system call, checks the
/// number first, and reads the arguments from the saved registers. No record is
/// built for it, so a process the program leaves out pays less (the perf path
/// builds the record before any program runs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RawSyscall {
    pub nr: u32,
    pub exit: bool,
}

/// Where a map written in user space lives in the session's segment (its key table:
/// `weft_abi::MapDesc`), for kernel advice that reads it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UserMap {
    pub table_off: u64,
    pub entry_size: u32,
    /// A power of two.
    pub capacity: u32,
    pub key_size: u32,
    pub value_size: u32,
}

/// One kernel probe: its advice and its tracepoint.
pub struct KernelProbe<'a> {
    pub body: &'a Function,
    pub category: String,
    pub name: String,
    pub probe_id: u32,
    /// For a `syscalls:` tracepoint whose number is known: try the raw tracepoint
    /// first (the perf tracepoint when the advice needs what only the record has).
    pub raw: Option<RawSyscall>,
    /// Runs for every process, whatever `Options::filter_pids` says.
    pub system: bool,
    /// A user-space probe's advice on a kernel uprobe (`Some(true)`: a uretprobe),
    /// run in a launched program until its agent starts; `category`/`name` then only
    /// label it.
    pub uprobe: Option<bool>,
}

/// Where a program of [`Built`] attaches.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProgramKind {
    Tracepoint {
        category: String,
        name: String,
    },
    /// `sys_enter`/`sys_exit`: the system call's arguments, no record.
    RawTracepoint(String),
}

/// A program for kernel uprobes, kept out of the object: it is loaded for a
/// `uprobe_multi` link (every site of a file in one link, which the kernel takes
/// out at once), which the object loader cannot ask for. Its map loads hold no
/// descriptor yet: the loader puts each map's in.
#[derive(Clone, Debug)]
pub struct UprobeProgram {
    /// Index into [`build`]'s `probes`; `usize::MAX` for the handover program.
    pub probe: usize,
    /// A uretprobe.
    pub ret: bool,
    /// Encoded instructions.
    pub insns: Vec<u8>,
    /// The instruction index of each map load (`BPF_LD_IMM64` with
    /// `BPF_PSEUDO_MAP_FD`) and its map.
    pub maps: Vec<(usize, MapRef)>,
}

/// The session-wide inputs of [`build`].
#[derive(Clone, Debug)]
pub struct Options {
    pub filter_pids: bool,
    pub ncpus: u32,
    pub cpid: u64,
    pub start_ns: u64,
    pub realtime_offset_ns: i64,
    /// Bytes of the ring buffer (a power of two, a multiple of the page size).
    pub ring_bytes: u32,
    /// The kernel's `pid_max`: the pid filter's bitmaps have a bit for each pid.
    pub pid_max: u32,
    /// With a pid filter: where `sched_process_fork` records the child's pid, so a
    /// program there adds the children of filtered processes to the filter.
    pub fork_child_pid_offset: Option<u32>,
    /// See [`Env::user_maps`].
    pub user_maps: std::collections::BTreeMap<u32, UserMap>,
}

/// An object ready to load.
pub struct Built {
    pub object: Vec<u8>,
    /// Program symbol and where it attaches; in the order of the probes (but those
    /// on uprobes), then the filter's own program on `sched_process_fork`, when
    /// there is one.
    pub programs: Vec<(String, ProgramKind)>,
    /// The uprobe programs, then the handover program when there are any (see
    /// [`handover_program`](codegen::handover_program)).
    pub uprobes: Vec<UprobeProgram>,
    /// Every map of the object.
    pub maps: Vec<(MapRef, MapSpec)>,
    /// Instructions per program (for `-v`).
    pub sizes: Vec<usize>,
}

/// The weft maps a function uses.
fn maps_used(f: &Function, out: &mut BTreeSet<u32>) {
    for inst in &f.code {
        let m = match inst {
            Inst::MapLoad { map, .. }
            | Inst::MapStore { map, .. }
            | Inst::MapAgg { map, .. }
            | Inst::MapDelete { map, .. }
            | Inst::MapHasKey { map, .. }
            | Inst::MapLen { map, .. }
            | Inst::MapIterStart { map, .. }
            | Inst::MapIterNext { map, .. } => map,
            _ => continue,
        };
        out.insert(m.0);
    }
}

/// The weft maps kernel probes keep in the kernel (weft mirrors them into its own
/// maps): those they use but `user` (maps user space writes, which they only read).
pub fn kernel_maps(
    probes: &[KernelProbe],
    user: &std::collections::BTreeMap<u32, UserMap>,
) -> BTreeSet<u32> {
    let mut used = BTreeSet::new();
    for p in probes {
        maps_used(p.body, &mut used);
    }
    used.retain(|m| !user.contains_key(m));
    used
}

/// The maps user-space probes write that the kernel probes (`kernel`: indices
/// into `prog.probes`) read — kernel advice reads them in the current process's
/// mapping of the segment. `Err((probe, message))` for a map that cannot be shared
/// so: one kernel probes write too (each side would see only its own writes), or an
/// aggregation.
pub fn user_maps_read(prog: &Program, kernel: &[usize]) -> Result<BTreeSet<u32>, (usize, String)> {
    let writes = |inst: &Inst| match inst {
        Inst::MapStore { map, .. } | Inst::MapAgg { map, .. } | Inst::MapDelete { map, .. } => {
            Some(map.0)
        }
        _ => None,
    };
    let mut user_written = BTreeSet::new();
    let mut kernel_written = BTreeSet::new();
    for (i, p) in prog.probes.iter().enumerate() {
        let in_kernel = kernel.contains(&i);
        if !in_kernel && !p.attach.iter().any(weft_ir::AttachPoint::runs_in_target) {
            continue;
        }
        for m in p.body.code.iter().filter_map(writes) {
            if in_kernel {
                kernel_written.insert(m);
            } else {
                user_written.insert(m);
            }
        }
    }
    let mut out = BTreeSet::new();
    for &i in kernel {
        for inst in &prog.probes[i].body.code {
            let (Inst::MapLoad { map, .. } | Inst::MapHasKey { map, .. }) = inst else {
                continue;
            };
            if !user_written.contains(&map.0) {
                continue;
            }
            let decl = &prog.maps[map.0 as usize];
            if kernel_written.contains(&map.0) {
                return Err((
                    i,
                    format!(
                        "this kernel probe reads {}, which both user-space and kernel probes \
                         write: not supported (each side would see only its own writes)",
                        decl.name
                    ),
                ));
            }
            if decl.value.is_aggregation() {
                return Err((
                    i,
                    format!(
                        "this kernel probe reads aggregation {}, which user-space probes \
                         write: not supported yet",
                        decl.name
                    ),
                ));
            }
            out.insert(map.0);
        }
    }
    Ok(out)
}

/// Whether kernel probe `probe` compiles (`user`: from [`user_maps_read`]), before
/// any kernel sees it: what the code generator refuses, with the reason.
pub fn check(prog: &Program, probe: usize, user: &BTreeSet<u32>) -> Result<(), BpfError> {
    check_as(prog, probe, user, None)
}

/// Whether user-space probe `probe` compiles for a kernel uprobe (`ret`: a
/// uretprobe), to run before a launched program's agent starts.
pub fn check_uprobe(prog: &Program, probe: usize, ret: bool) -> Result<(), BpfError> {
    check_as(prog, probe, &BTreeSet::new(), Some(ret))
}

fn check_as(
    prog: &Program,
    probe: usize,
    user: &BTreeSet<u32>,
    uprobe: Option<bool>,
) -> Result<(), BpfError> {
    let user_maps = user
        .iter()
        .map(|&m| {
            let d = &prog.maps[m as usize];
            (
                m,
                UserMap {
                    table_off: 0,
                    entry_size: weft_abi::entry_layout(
                        d.key.as_ref().map_or(0, weft_ir::Type::size),
                        d.value.value_size(),
                    )
                    .2,
                    capacity: 1,
                    key_size: d.key.as_ref().map_or(0, weft_ir::Type::size),
                    value_size: d.value.value_size(),
                },
            )
        })
        .collect();
    let env = Env {
        filter_pids: true,
        ncpus: 1,
        cpid: 0,
        start_ns: 0,
        realtime_offset_ns: 0,
        probe_id: 0,
        zero_value: 8,
        user_maps,
        key_buf: 8,
        raw_syscall: None,
        uprobe,
    };
    codegen::compile(&prog.probes[probe].body, prog, &env).map(|_| ())
}

/// How weft map `decl` is kept in the kernel.
pub fn map_spec(prog: &Program, id: u32) -> MapSpec {
    let decl = &prog.maps[id as usize];
    let value_size = decl.value.value_size();
    let max_entries = prog.config.max_keys_of(&decl.name).max(1);
    match (&decl.key, decl.value.is_aggregation()) {
        (Some(k), true) => MapSpec {
            map_type: MAP_PERCPU_HASH,
            key_size: k.size().max(1),
            value_size,
            max_entries,
        },
        (None, true) => MapSpec {
            map_type: MAP_PERCPU_ARRAY,
            key_size: 4,
            value_size,
            max_entries: 1,
        },
        (Some(k), false) => MapSpec {
            map_type: MAP_HASH,
            key_size: k.size().max(1),
            value_size,
            max_entries,
        },
        (None, false) => MapSpec {
            map_type: MAP_HASH,
            key_size: 4,
            value_size,
            max_entries: 1,
        },
    }
}

/// Compile every kernel probe and lay out the object. On an error, the index of
/// the probe that caused it.
pub fn build(
    prog: &Program,
    probes: &[KernelProbe],
    opts: &Options,
) -> Result<Built, (usize, BpfError)> {
    let used = kernel_maps(probes, &opts.user_maps);
    let key_buf = opts
        .user_maps
        .values()
        .map(|m| m.key_size.div_ceil(8) * 8)
        .max()
        .unwrap_or(0);
    // The zero value new keyed aggregation entries start from.
    let zero_value = used
        .iter()
        .filter(|&&m| {
            let d = &prog.maps[m as usize];
            d.key.is_some() && d.value.is_aggregation()
        })
        .map(|&m| prog.maps[m as usize].value.value_size())
        .max()
        .unwrap_or(8)
        .div_ceil(8)
        * 8;
    let mut codes = Vec::new();
    let mut programs = Vec::new();
    let mut uprobes = Vec::new();
    let mut scratch_needed = 8;
    for (i, p) in probes.iter().enumerate() {
        let mut env = Env {
            // A uprobe's link names its one process already.
            filter_pids: opts.filter_pids && !p.system && p.uprobe.is_none(),
            ncpus: opts.ncpus,
            cpid: opts.cpid,
            start_ns: opts.start_ns,
            realtime_offset_ns: opts.realtime_offset_ns,
            probe_id: p.probe_id,
            zero_value,
            user_maps: opts.user_maps.clone(),
            key_buf,
            raw_syscall: None,
            uprobe: p.uprobe,
        };
        let sym = format!("weft_p{i}");
        if let Some(ret) = p.uprobe {
            let code = codegen::compile(p.body, prog, &env).map_err(|e| (i, e))?;
            scratch_needed = scratch_needed.max(code.scratch);
            uprobes.push(UprobeProgram {
                probe: i,
                ret,
                insns: code.insns.iter().flat_map(|i| i.encode()).collect(),
                maps: code.maps,
            });
            continue;
        }
        if let Some(raw) = p.raw {
            env.raw_syscall = Some(raw);
            if let Ok(code) = codegen::compile(p.body, prog, &env) {
                codes.push(code);
                let tp = if raw.exit { "sys_exit" } else { "sys_enter" };
                programs.push((sym, ProgramKind::RawTracepoint(tp.to_string())));
                continue;
            }
            env.raw_syscall = None;
        }
        codes.push(codegen::compile(p.body, prog, &env).map_err(|e| (i, e))?);
        programs.push((
            sym,
            ProgramKind::Tracepoint {
                category: p.category.clone(),
                name: p.name.clone(),
            },
        ));
    }
    let any_uprobe = probes.iter().any(|p| p.uprobe.is_some());
    let scratch = codes
        .iter()
        .map(|c| c.scratch)
        .max()
        .unwrap_or(8)
        .max(scratch_needed)
        .div_ceil(8)
        * 8;
    let fork = match (opts.filter_pids, opts.fork_child_pid_offset) {
        (true, Some(off)) => Some(codegen::fork_program(off).map_err(|e| (0, e))?),
        _ => None,
    };
    let mut maps = vec![
        (
            MapRef::Ring,
            MapSpec {
                map_type: MAP_RINGBUF,
                key_size: 0,
                value_size: 0,
                max_entries: opts.ring_bytes,
            },
        ),
        (
            MapRef::Pids,
            MapSpec {
                map_type: MAP_ARRAY,
                key_size: 4,
                value_size: 8,
                max_entries: opts.pid_max.div_ceil(64).max(1),
            },
        ),
        (
            MapRef::Forked,
            MapSpec {
                map_type: MAP_ARRAY,
                key_size: 4,
                value_size: 8,
                max_entries: opts.pid_max.div_ceil(64).max(1),
            },
        ),
        (
            MapRef::Segments,
            MapSpec {
                map_type: MAP_HASH,
                key_size: 4,
                value_size: 8,
                max_entries: MAX_MEMBERS,
            },
        ),
        (
            MapRef::Scratch,
            MapSpec {
                map_type: MAP_PERCPU_ARRAY,
                key_size: 4,
                value_size: scratch,
                max_entries: 1,
            },
        ),
        (
            MapRef::Errors,
            MapSpec {
                map_type: MAP_PERCPU_ARRAY,
                key_size: 4,
                value_size: 8,
                max_entries: 8,
            },
        ),
    ];
    if any_uprobe {
        maps.push((
            MapRef::Handed,
            MapSpec {
                map_type: MAP_ARRAY,
                key_size: 4,
                value_size: 8,
                max_entries: opts.pid_max.div_ceil(64).max(1),
            },
        ));
    }
    for &m in &used {
        maps.push((MapRef::Map(m), map_spec(prog, m)));
    }
    if let Some(f) = fork {
        codes.push(f);
        programs.push((
            "weft_fork".into(),
            ProgramKind::Tracepoint {
                category: "sched".into(),
                name: "sched_process_fork".into(),
            },
        ));
    }
    if any_uprobe {
        let code = codegen::handover_program().map_err(|e| (0, e))?;
        uprobes.push(UprobeProgram {
            probe: usize::MAX,
            ret: false,
            insns: code.insns.iter().flat_map(|i| i.encode()).collect(),
            maps: code.maps,
        });
    }
    let sizes = codes.iter().map(|c| c.insns.len()).collect();
    let object = write_object(&codes, &programs, &maps);
    Ok(Built {
        object,
        programs,
        uprobes,
        maps,
        sizes,
    })
}

/// The ELF object: a `license`, a `maps` section of `struct bpf_map_def` (7 u32s),
/// one section per program, and `R_BPF_64_64` relocations of map loads.
fn write_object(
    codes: &[codegen::Code],
    programs: &[(String, ProgramKind)],
    maps: &[(MapRef, MapSpec)],
) -> Vec<u8> {
    let mut obj = Object::new(BinaryFormat::Elf, Architecture::Bpf, Endianness::Little);
    let license = obj.add_section(Vec::new(), b"license".to_vec(), SectionKind::Data);
    obj.append_section_data(license, b"GPL\0", 1);
    let maps_sec = obj.add_section(Vec::new(), b"maps".to_vec(), SectionKind::Data);
    let mut syms = std::collections::HashMap::new();
    for (r, spec) in maps {
        let mut def = Vec::with_capacity(28);
        for v in [
            spec.map_type,
            spec.key_size,
            spec.value_size,
            spec.max_entries,
            0,
            0,
            0,
        ] {
            def.extend_from_slice(&v.to_le_bytes());
        }
        let off = obj.append_section_data(maps_sec, &def, 4);
        let sym = obj.add_symbol(Symbol {
            name: r.name().into_bytes(),
            value: off,
            size: def.len() as u64,
            kind: SymbolKind::Data,
            scope: SymbolScope::Dynamic,
            weak: false,
            section: SymbolSection::Section(maps_sec),
            flags: SymbolFlags::None,
        });
        syms.insert(*r, sym);
    }
    for (code, (name, kind)) in codes.iter().zip(programs) {
        let sec = obj.add_section(
            obj.segment_name(StandardSegment::Text).to_vec(),
            match kind {
                // A raw tracepoint (`sys_enter`, `sys_exit`): its arguments, no record.
                ProgramKind::RawTracepoint(tp) => format!("raw_tracepoint/{tp}"),
                ProgramKind::Tracepoint { category, name } => {
                    format!("tracepoint/{category}/{name}")
                }
            }
            .into_bytes(),
            SectionKind::Text,
        );
        let bytes: Vec<u8> = code.insns.iter().flat_map(|i| i.encode()).collect();
        obj.append_section_data(sec, &bytes, 8);
        obj.add_symbol(Symbol {
            name: name.clone().into_bytes(),
            value: 0,
            size: bytes.len() as u64,
            kind: SymbolKind::Text,
            scope: SymbolScope::Dynamic,
            weak: false,
            section: SymbolSection::Section(sec),
            flags: SymbolFlags::None,
        });
        for &(at, r) in &code.maps {
            obj.add_relocation(
                sec,
                Relocation {
                    offset: at as u64 * 8,
                    symbol: syms[&r],
                    addend: 0,
                    // R_BPF_64_64: a 64-bit immediate load of the symbol.
                    flags: RelocationFlags::Elf { r_type: 1 },
                },
            )
            .expect("a relocation in a section of this object");
        }
    }
    obj.write().expect("an in-memory ELF object")
}
