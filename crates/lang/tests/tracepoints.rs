//! Kernel tracepoint probes in the front end, with a fixed event resolver (two
//! syscall tracepoints and a sched one, laid out as the kernel's format files say):
//! attach points, wildcards, `args`, builtins that need a user-space frame, and the
//! messages. Refresh with `UPDATE_EXPECT=1 cargo test -p weft-lang`. The same
//! against the running kernel's tracefs: `crates/cli/tests/tracepoints.rs`.

use std::sync::Arc;

use expect_test::{expect, Expect};
use weft_lang::{
    compile, render, EventField, EventFieldShape, EventResolver, KernelOffers, Options,
};

struct Fixed;

fn field(
    decl: (&str, &str),
    offset: u32,
    size: u32,
    signed: bool,
    shape: EventFieldShape,
) -> EventField {
    EventField {
        c_type: decl.0.to_string(),
        name: decl.1.to_string(),
        offset,
        size,
        signed,
        shape,
    }
}

fn common() -> Vec<EventField> {
    use EventFieldShape::Scalar;
    vec![
        field(("unsigned short", "common_type"), 0, 2, false, Scalar),
        field(("unsigned char", "common_flags"), 2, 1, false, Scalar),
        field(
            ("unsigned char", "common_preempt_count"),
            3,
            1,
            false,
            Scalar,
        ),
        field(("int", "common_pid"), 4, 4, true, Scalar),
    ]
}

const TRACEPOINTS: &[(&str, &str)] = &[
    ("sched", "sched_process_exec"),
    ("sched", "sched_switch"),
    ("syscalls", "sys_enter_openat"),
    ("syscalls", "sys_enter_openat2"),
    ("syscalls", "sys_exit_openat"),
];

impl EventResolver for Fixed {
    fn tracepoints(&self, category: &str, name: &str) -> Result<Vec<(String, String)>, String> {
        let glob = |p: &str, s: &str| match p.strip_suffix('*') {
            Some(pre) => s.starts_with(pre),
            None => p == s,
        };
        Ok(TRACEPOINTS
            .iter()
            .filter(|(c, n)| glob(category, c) && glob(name, n))
            .map(|(c, n)| (c.to_string(), n.to_string()))
            .collect())
    }

    fn fields(&self, category: &str, name: &str) -> Result<Vec<EventField>, String> {
        use EventFieldShape::*;
        let mut f = common();
        match (category, name) {
            ("syscalls", "sys_enter_openat") | ("syscalls", "sys_enter_openat2") => {
                f.push(field(("int", "__syscall_nr"), 8, 4, true, Scalar));
                f.push(field(("int", "dfd"), 16, 8, false, Scalar));
                f.push(field(("const char *", "filename"), 24, 8, false, Pointer));
                if name == "sys_enter_openat" {
                    f.push(field(("int", "flags"), 32, 8, false, Scalar));
                } else {
                    f.push(field(("struct open_how *", "how"), 32, 8, false, Pointer));
                }
            }
            ("syscalls", "sys_exit_openat") => {
                f.push(field(("int", "__syscall_nr"), 8, 4, true, Scalar));
                f.push(field(("long", "ret"), 16, 8, true, Scalar));
            }
            ("sched", "sched_switch") => {
                f.push(field(
                    ("char", "prev_comm"),
                    8,
                    16,
                    false,
                    Array { dims: vec![16] },
                ));
                f.push(field(("pid_t", "prev_pid"), 24, 4, true, Scalar));
                f.push(field(("u8", "addr"), 28, 4, false, Array { dims: vec![4] }));
            }
            ("sched", "sched_process_exec") => {
                f.push(field(("char", "filename"), 8, 4, false, DataLoc));
                f.push(field(("pid_t", "pid"), 12, 4, true, Scalar));
            }
            _ => return Err(format!("no tracepoint {category}:{name}")),
        }
        Ok(f)
    }

    fn kernel(&self) -> KernelOffers {
        KernelOffers {
            tracefs: Ok("/sys/kernel/tracing".into()),
            kprobes: false,
            btf: true,
        }
    }
}

fn opts() -> Options {
    Options {
        events: Some(Arc::new(Fixed)),
        ..Options::default()
    }
}

/// The program, or the diagnostics.
fn check(input: &str, expected: Expect) {
    let out = compile(input, "t.bt", &opts());
    let text = match &out.program {
        Some(p) => format!("names {:?}\n{p}", p.probe_names),
        None => render(&out.diagnostics, input, "t.bt"),
    };
    expected.assert_eq(&text);
}

#[test]
fn field_reads_are_event_fields() {
    check(
        "tracepoint:syscalls:sys_enter_openat { @[str(args.filename)] = count(); $d = args->dfd; $p = args.common_pid; }",
        expect![[r#"
            names ["tracepoint:syscalls:sys_enter_openat"]
            map 0 @[string[64]]: Count
            probe tracepoint:syscalls:sys_enter_openat (regs 5, slots [64])
                Const { dst: Reg(0), value: 0 }
                Const { dst: Reg(1), value: 0 }
                EventField { dst: Reg(2), off: 24, size: 8, signed: false }
                ReadStr { dst: Place { slot: Slot(0), off: 0 }, addr: Reg(2), max: None, cap: 64 }
                MapAgg { map: MapId(0), key: Some(Place { slot: Slot(0), off: 0 }), op: Count }
                EventField { dst: Reg(3), off: 16, size: 8, signed: true }
                Mov { dst: Reg(0), src: Reg(3) }
                EventField { dst: Reg(4), off: 4, size: 4, signed: true }
                Mov { dst: Reg(1), src: Reg(4) }
              L0:
                Return
        "#]],
    );
}

#[test]
fn short_provider_and_kernel_syscalls() {
    check(
        "t:syscalls:sys_exit_openat, kernel:syscall:openat:exit { @ = hist(args.ret); } kernel:syscall:openat { printf(\"%s\\n\", probe); }",
        expect![[r#"
            names ["tracepoint:syscalls:sys_exit_openat", "kernel:syscall:openat:exit", "kernel:syscall:openat"]
            map 0 @: Hist { k: 0 }
            fmt 0 "%s\n" (probe)
            probe tracepoint:syscalls:sys_exit_openat (regs 1, slots [])
                EventField { dst: Reg(0), off: 16, size: 8, signed: true }
                MapAgg { map: MapId(0), key: None, op: Hist(Reg(0)) }
              L0:
                Return
            probe tracepoint:syscalls:sys_exit_openat (regs 1, slots [])
                EventField { dst: Reg(0), off: 16, size: 8, signed: true }
                MapAgg { map: MapId(0), key: None, op: Hist(Reg(0)) }
              L0:
                Return
            probe tracepoint:syscalls:sys_enter_openat (regs 1, slots [8])
                Ctx { dst: Reg(0), value: ProbeId }
                Zero { place: Place { slot: Slot(0), off: 0 }, len: 8 }
                Store { place: Place { slot: Slot(0), off: 0 }, src: Reg(0), size: 8 }
                Emit { kind: Printf(FmtId(0)), payload: Some(Place { slot: Slot(0), off: 0 }), len: 8 }
              L0:
                Return
        "#]],
    );
}

#[test]
fn wildcards_expand_one_probe_per_tracepoint_when_args_is_read() {
    check(
        "t:syscalls:sys_enter_openat* { @[probe] = count(); } t:syscalls:sys_enter_openat* { @f[args.dfd] = count(); }",
        expect![[r#"
            names ["tracepoint:syscalls:sys_enter_openat", "tracepoint:syscalls:sys_enter_openat2", "tracepoint:syscalls:sys_enter_openat", "tracepoint:syscalls:sys_enter_openat2"]
            map 0 @[probe]: Count
            map 1 @f[int64]: Count
            probe tracepoint:syscalls:sys_enter_openat, tracepoint:syscalls:sys_enter_openat2 (regs 1, slots [8])
                Ctx { dst: Reg(0), value: ProbeId }
                Zero { place: Place { slot: Slot(0), off: 0 }, len: 8 }
                Store { place: Place { slot: Slot(0), off: 0 }, src: Reg(0), size: 8 }
                MapAgg { map: MapId(0), key: Some(Place { slot: Slot(0), off: 0 }), op: Count }
              L0:
                Return
            probe tracepoint:syscalls:sys_enter_openat (regs 1, slots [8])
                EventField { dst: Reg(0), off: 16, size: 8, signed: true }
                Zero { place: Place { slot: Slot(0), off: 0 }, len: 8 }
                Store { place: Place { slot: Slot(0), off: 0 }, src: Reg(0), size: 8 }
                MapAgg { map: MapId(1), key: Some(Place { slot: Slot(0), off: 0 }), op: Count }
              L0:
                Return
            probe tracepoint:syscalls:sys_enter_openat2 (regs 1, slots [8])
                EventField { dst: Reg(0), off: 16, size: 8, signed: true }
                Zero { place: Place { slot: Slot(0), off: 0 }, len: 8 }
                Store { place: Place { slot: Slot(0), off: 0 }, src: Reg(0), size: 8 }
                MapAgg { map: MapId(1), key: Some(Place { slot: Slot(0), off: 0 }), op: Count }
              L0:
                Return
        "#]],
    );
}

#[test]
fn strings_arrays_and_the_whole_record() {
    check(
        "t:sched:sched_switch { @[args.prev_comm] = count(); $a = args.addr[1]; print(args); } t:sched:sched_process_exec { @e[args.filename] = count(); }",
        expect![[r#"
            names ["tracepoint:sched:sched_switch", "tracepoint:sched:sched_process_exec"]
            map 0 @[string[16]]: Count
            map 1 @e[string[64]]: Count
            fmt 0 "" ((prev_comm=string[16],prev_pid=int64,addr=uint8[4]))
            probe tracepoint:sched:sched_switch (regs 9, slots [16, 16, 8, 24, 32, 32])
                Const { dst: Reg(0), value: 0 }
                EventBytes { dst: Place { slot: Slot(0), off: 0 }, off: 8, len: 16 }
                Zero { place: Place { slot: Slot(1), off: 0 }, len: 16 }
                Copy { dst: Place { slot: Slot(1), off: 0 }, src: Place { slot: Slot(0), off: 0 }, len: 16 }
                MapAgg { map: MapId(0), key: Some(Place { slot: Slot(1), off: 0 }), op: Count }
                EventBytes { dst: Place { slot: Slot(2), off: 0 }, off: 28, len: 4 }
                AddrOf { dst: Reg(1), place: Place { slot: Slot(2), off: 0 } }
                Const { dst: Reg(2), value: 1 }
                Const { dst: Reg(3), value: 1 }
                Binary { op: Mul, dst: Reg(4), a: Reg(2), b: Reg(3) }
                Binary { op: Add, dst: Reg(5), a: Reg(1), b: Reg(4) }
                Load { dst: Reg(6), addr: Reg(5), size: 1, signed: false }
                Mov { dst: Reg(0), src: Reg(6) }
                Zero { place: Place { slot: Slot(3), off: 0 }, len: 24 }
                EventBytes { dst: Place { slot: Slot(0), off: 0 }, off: 8, len: 16 }
                Copy { dst: Place { slot: Slot(3), off: 0 }, src: Place { slot: Slot(0), off: 0 }, len: 16 }
                EventField { dst: Reg(7), off: 24, size: 4, signed: true }
                Store { place: Place { slot: Slot(3), off: 16 }, src: Reg(7), size: 4 }
                EventBytes { dst: Place { slot: Slot(2), off: 0 }, off: 28, len: 4 }
                Copy { dst: Place { slot: Slot(3), off: 20 }, src: Place { slot: Slot(2), off: 0 }, len: 4 }
                Zero { place: Place { slot: Slot(4), off: 0 }, len: 32 }
                Zero { place: Place { slot: Slot(5), off: 0 }, len: 32 }
                Copy { dst: Place { slot: Slot(5), off: 0 }, src: Place { slot: Slot(3), off: 0 }, len: 16 }
                LoadSlot { dst: Reg(8), place: Place { slot: Slot(3), off: 16 }, size: 4, signed: true }
                Store { place: Place { slot: Slot(5), off: 16 }, src: Reg(8), size: 8 }
                Copy { dst: Place { slot: Slot(5), off: 24 }, src: Place { slot: Slot(3), off: 20 }, len: 4 }
                Copy { dst: Place { slot: Slot(4), off: 0 }, src: Place { slot: Slot(5), off: 0 }, len: 32 }
                Emit { kind: PrintValue(FmtId(0)), payload: Some(Place { slot: Slot(4), off: 0 }), len: 32 }
              L0:
                Return
            probe tracepoint:sched:sched_process_exec (regs 0, slots [64, 64])
                EventDataLoc { dst: Place { slot: Slot(0), off: 0 }, off: 8, cap: 64 }
                Zero { place: Place { slot: Slot(1), off: 0 }, len: 64 }
                Copy { dst: Place { slot: Slot(1), off: 0 }, src: Place { slot: Slot(0), off: 0 }, len: 64 }
                MapAgg { map: MapId(1), key: Some(Place { slot: Slot(1), off: 0 }), op: Count }
              L0:
                Return
        "#]],
    );
}

#[test]
fn unknown_tracepoints_suggest() {
    check(
        "tracepoint:syscalls:sys_enter_opnat { } t:syscals:sys_enter_openat { } kernel:syscall:opnat { } t:syscalls:nosuch* { } kernel:sched { } tracepoint:x { }",
        expect![[r#"
            error: unknown tracepoint `tracepoint:syscalls:sys_enter_opnat`; did you mean `tracepoint:syscalls:sys_enter_openat`?
             --> t.bt:1:1
              |
            1 | tracepoint:syscalls:sys_enter_opnat { } t:syscals:sys_enter_openat { } kernel:syscall:opnat { } t:syscalls:nosuch* { } kernel:sched { } tracepoint:x { }
              | ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^

            error: unknown tracepoint category `syscals` in `t:syscals:sys_enter_openat`; did you mean `syscalls`?
             --> t.bt:1:41
              |
            1 | tracepoint:syscalls:sys_enter_opnat { } t:syscals:sys_enter_openat { } kernel:syscall:opnat { } t:syscalls:nosuch* { } kernel:sched { } tracepoint:x { }
              |                                         ^^^^^^^^^^^^^^^^^^^^^^^^^^

            error: unknown system call `opnat` in `kernel:syscall:opnat`; did you mean `openat`?
             --> t.bt:1:72
              |
            1 | tracepoint:syscalls:sys_enter_opnat { } t:syscals:sys_enter_openat { } kernel:syscall:opnat { } t:syscalls:nosuch* { } kernel:sched { } tracepoint:x { }
              |                                                                        ^^^^^^^^^^^^^^^^^^^^

            error: no tracepoint matches `t:syscalls:nosuch*`
             --> t.bt:1:97
              |
            1 | tracepoint:syscalls:sys_enter_opnat { } t:syscals:sys_enter_openat { } kernel:syscall:opnat { } t:syscalls:nosuch* { } kernel:sched { } tracepoint:x { }
              |                                                                                                 ^^^^^^^^^^^^^^^^^^

            error: invalid attach point `kernel:sched`: the kernel provider has system calls: kernel:syscall:NAME (entry) and kernel:syscall:NAME:exit
             --> t.bt:1:120
              |
            1 | tracepoint:syscalls:sys_enter_opnat { } t:syscals:sys_enter_openat { } kernel:syscall:opnat { } t:syscalls:nosuch* { } kernel:sched { } tracepoint:x { }
              |                                                                                                                        ^^^^^^^^^^^^

            error: invalid attach point `tracepoint:x`: a tracepoint is tracepoint:CATEGORY:NAME
             --> t.bt:1:137
              |
            1 | tracepoint:syscalls:sys_enter_opnat { } t:syscals:sys_enter_openat { } kernel:syscall:opnat { } t:syscalls:nosuch* { } kernel:sched { } tracepoint:x { }
              |                                                                                                                                         ^^^^^^^^^^^^

        "#]],
    );
}

#[test]
fn missing_fields_and_differing_types() {
    check(
        "t:syscalls:sys_enter_openat { $x = args.nosuch; $y = args.flag; } t:syscalls:sys_enter_openat* { $z = args.flags; } t:syscalls:sys_enter_openat, BEGIN { $w = args.dfd; }",
        expect![[r#"
            error: tracepoint:syscalls:sys_enter_openat has no field `nosuch`; it has __syscall_nr, dfd, filename, flags
             --> t.bt:1:36
              |
            1 | t:syscalls:sys_enter_openat { $x = args.nosuch; $y = args.flag; } t:syscalls:sys_enter_openat* { $z = args.flags; } t:syscalls:sys_enter_openat, BEGIN { $w = args.dfd; }
              |                                    ^^^^^^^^^^^

            error: tracepoint:syscalls:sys_enter_openat has no field `flag`; did you mean `flags`?
             --> t.bt:1:54
              |
            1 | t:syscalls:sys_enter_openat { $x = args.nosuch; $y = args.flag; } t:syscalls:sys_enter_openat* { $z = args.flags; } t:syscalls:sys_enter_openat, BEGIN { $w = args.dfd; }
              |                                                      ^^^^^^^^^

            error: tracepoint:syscalls:sys_enter_openat2 has no field `flags`; it has __syscall_nr, dfd, filename, how
             --> t.bt:1:103
              |
            1 | t:syscalls:sys_enter_openat { $x = args.nosuch; $y = args.flag; } t:syscalls:sys_enter_openat* { $z = args.flags; } t:syscalls:sys_enter_openat, BEGIN { $w = args.dfd; }
              |                                                                                                       ^^^^^^^^^^

            error: args of tracepoints needs every attach point of the probe to be a tracepoint (not `BEGIN`)
             --> t.bt:1:159
              |
            1 | t:syscalls:sys_enter_openat { $x = args.nosuch; $y = args.flag; } t:syscalls:sys_enter_openat* { $z = args.flags; } t:syscalls:sys_enter_openat, BEGIN { $w = args.dfd; }
              |                                                                                                                                                               ^^^^^^^^

        "#]],
    );
}

#[test]
fn user_space_builtins_are_refused() {
    check(
        "t:syscalls:sys_exit_openat { $a = retval; $b = arg0; $c = func; $e = usym(1); $f = reg(\"ip\"); $g = uaddr(\"main\"); }",
        expect![[r#"
            error: retval needs a user-space frame, and a tracepoint's advice runs in the kernel (`tracepoint:syscalls:sys_exit_openat`); in a sys_exit tracepoint the return value is args.ret
             --> t.bt:1:35
              |
            1 | t:syscalls:sys_exit_openat { $a = retval; $b = arg0; $c = func; $e = usym(1); $f = reg("ip"); $g = uaddr("main"); }
              |                                   ^^^^^^

            error: arg0 needs a user-space frame, and a tracepoint's advice runs in the kernel (`tracepoint:syscalls:sys_exit_openat`); the event's fields are args.NAME (weft -lv lists them)
             --> t.bt:1:48
              |
            1 | t:syscalls:sys_exit_openat { $a = retval; $b = arg0; $c = func; $e = usym(1); $f = reg("ip"); $g = uaddr("main"); }
              |                                                ^^^^

            error: func needs a user-space frame, and a tracepoint's advice runs in the kernel (`tracepoint:syscalls:sys_exit_openat`); the event's fields are args.NAME (weft -lv lists them)
             --> t.bt:1:59
              |
            1 | t:syscalls:sys_exit_openat { $a = retval; $b = arg0; $c = func; $e = usym(1); $f = reg("ip"); $g = uaddr("main"); }
              |                                                           ^^^^

            error: usym() needs a user-space frame, and a tracepoint's advice runs in the kernel (`tracepoint:syscalls:sys_exit_openat`)
             --> t.bt:1:70
              |
            1 | t:syscalls:sys_exit_openat { $a = retval; $b = arg0; $c = func; $e = usym(1); $f = reg("ip"); $g = uaddr("main"); }
              |                                                                      ^^^^^^^

            error: reg() needs a user-space frame, and a tracepoint's advice runs in the kernel (`tracepoint:syscalls:sys_exit_openat`)
             --> t.bt:1:84
              |
            1 | t:syscalls:sys_exit_openat { $a = retval; $b = arg0; $c = func; $e = usym(1); $f = reg("ip"); $g = uaddr("main"); }
              |                                                                                    ^^^^^^^^^

            error: uaddr() needs a user-space frame, and a tracepoint's advice runs in the kernel (`tracepoint:syscalls:sys_exit_openat`)
             --> t.bt:1:100
              |
            1 | t:syscalls:sys_exit_openat { $a = retval; $b = arg0; $c = func; $e = usym(1); $f = reg("ip"); $g = uaddr("main"); }
              |                                                                                                    ^^^^^^^^^^^^^

        "#]],
    );
}

#[test]
fn kernel_builtins_are_fine() {
    let out = compile(
        "t:syscalls:sys_enter_openat { @[pid, tid, comm, cpu, uid, gid, probe, cpid] = count(); @t = nsecs + elapsed + rand; }",
        "t.bt",
        &opts(),
    );
    assert!(out.program.is_some(), "{:?}", out.diagnostics);
}

#[test]
fn kernel_function_probes_say_what_the_kernel_offers() {
    check(
        "kprobe:do_sys_open { } kfunc:vfs_read { } rawtracepoint:sched_switch { }",
        expect![[r#"
            error: kprobe: this kernel has no kprobes (no kprobe_events in /sys/kernel/tracing: CONFIG_KPROBE_EVENTS is off); use tracepoint:CATEGORY:NAME (weft -l 'tracepoint:*' lists them), or uprobe/uretprobe on the user-space side of the call
             --> t.bt:1:1
              |
            1 | kprobe:do_sys_open { } kfunc:vfs_read { } rawtracepoint:sched_switch { }
              | ^^^^^^^^^^^^^^^^^^

            error: kfunc: kernel function (BTF) probes are not supported by weft (this kernel has BTF); use tracepoint:CATEGORY:NAME (weft -l 'tracepoint:*' lists them), or uprobe/uretprobe on the user-space side of the call
             --> t.bt:1:24
              |
            1 | kprobe:do_sys_open { } kfunc:vfs_read { } rawtracepoint:sched_switch { }
              |                        ^^^^^^^^^^^^^^

            error: rawtracepoint: raw tracepoints are not supported by weft; use tracepoint:CATEGORY:NAME, whose args are the event's fields
             --> t.bt:1:43
              |
            1 | kprobe:do_sys_open { } kfunc:vfs_read { } rawtracepoint:sched_switch { }
              |                                           ^^^^^^^^^^^^^^^^^^^^^^^^^^

        "#]],
    );
}

#[test]
fn without_a_resolver() {
    let out = compile(
        "t:syscalls:sys_enter_openat { }",
        "t.bt",
        &Options::default(),
    );
    let text = render(&out.diagnostics, "t:syscalls:sys_enter_openat { }", "t.bt");
    assert!(
        text.contains("kernel tracepoints are not available"),
        "{text}"
    );
}
