//! Lowering tests: the probe program (`weft_ir::Program`'s Display) of the minimum
//! language. Refresh with `UPDATE_EXPECT=1 cargo test -p weft-lang`.

use expect_test::{expect, Expect};
use weft_lang::{compile, render, Options};

fn check_with(input: &str, opts: &Options, expected: Expect) {
    let out = compile(input, "t.bt", opts);
    let text = match &out.program {
        Some(p) => p.to_string(),
        None => render(&out.diagnostics, input, "t.bt"),
    };
    expected.assert_eq(&text);
}

fn check(input: &str, expected: Expect) {
    check_with(input, &Options::default(), expected);
}

#[test]
fn begin_printf_exit() {
    check(
        r#"BEGIN { printf("hello %d\n", 42); exit(); }"#,
        expect![[r#"
            fmt 0 "hello %d\n" (int64)
            probe BEGIN (regs 1, slots [8])
                Const { dst: Reg(0), value: 42 }
                Zero { place: Place { slot: Slot(0), off: 0 }, len: 8 }
                Store { place: Place { slot: Slot(0), off: 0 }, src: Reg(0), size: 8 }
                Emit { kind: Printf(FmtId(0)), payload: Some(Place { slot: Slot(0), off: 0 }), len: 8 }
                Emit { kind: Exit, payload: None, len: 0 }
                Return
              L1:
              L0:
                Return
        "#]],
    );
}

#[test]
fn uprobe_predicate_count_by_comm() {
    check(
        "uprobe:/bin/bash:readline /pid == 42/ { @[comm] = count(); }",
        expect![[r#"
        map 0 @[string[16]]: Count
        probe uprobe:/bin/bash:readline (regs 3, slots [16, 16])
            Ctx { dst: Reg(0), value: Pid }
            Const { dst: Reg(1), value: 42 }
            Binary { op: Eq, dst: Reg(2), a: Reg(0), b: Reg(1) }
            Branch { cond: Reg(2), if_true: Label(1), if_false: Label(0) }
          L1:
            Comm { dst: Place { slot: Slot(0), off: 0 }, cap: 16 }
            Zero { place: Place { slot: Slot(1), off: 0 }, len: 16 }
            Copy { dst: Place { slot: Slot(1), off: 0 }, src: Place { slot: Slot(0), off: 0 }, len: 16 }
            MapAgg { map: MapId(0), key: Some(Place { slot: Slot(1), off: 0 }), op: Count }
          L0:
            Return
    "#]],
    );
}

#[test]
fn uretprobe_retval_and_wildcard_attach() {
    check(
        "uretprobe:/bin/a:get_* { @r[func] = sum(retval); }",
        expect![[r#"
            map 0 @r[usym]: Sum { signed: false }
            probe uretprobe:/bin/a:get_* (regs 2, slots [8])
                Ctx { dst: Reg(0), value: FuncAddr }
                Zero { place: Place { slot: Slot(0), off: 0 }, len: 8 }
                Store { place: Place { slot: Slot(0), off: 0 }, src: Reg(0), size: 8 }
                Ctx { dst: Reg(1), value: Retval }
                MapAgg { map: MapId(0), key: Some(Place { slot: Slot(0), off: 0 }), op: Sum(Reg(1)) }
              L0:
                Return
        "#]],
    );
}

#[test]
fn multiple_attach_points_share_a_body() {
    check(
        "uprobe:/bin/a:f, uprobe:/bin/a:g+16 { @[probe] = count(); }",
        expect![[r#"
        map 0 @[probe]: Count
        probe uprobe:/bin/a:f, uprobe:/bin/a:g+16 (regs 1, slots [8])
            Ctx { dst: Reg(0), value: ProbeId }
            Zero { place: Place { slot: Slot(0), off: 0 }, len: 8 }
            Store { place: Place { slot: Slot(0), off: 0 }, src: Reg(0), size: 8 }
            MapAgg { map: MapId(0), key: Some(Place { slot: Slot(0), off: 0 }), op: Count }
          L0:
            Return
    "#]],
    );
}

#[test]
fn interval_and_end() {
    check(
        "interval:ms:250 { @t = count(); } END { exit(); }",
        expect![[r#"
            map 0 @t: Count
            probe interval:ns:250000000 (regs 0, slots [])
                MapAgg { map: MapId(0), key: None, op: Count }
              L0:
                Return
            probe END (regs 0, slots [])
                Emit { kind: Exit, payload: None, len: 0 }
                Return
              L1:
              L0:
                Return
        "#]],
    );
}

#[test]
fn signed_and_unsigned_arithmetic() {
    check(
        "BEGIN { $a = -7; $b = $a / 2; $c = pid / 2; $d = $a >> 1; $e = $a < 3; $f = pid < 3; }",
        expect![[r#"
            probe BEGIN (regs 23, slots [])
                Const { dst: Reg(0), value: 0 }
                Const { dst: Reg(1), value: 0 }
                Const { dst: Reg(2), value: 0 }
                Const { dst: Reg(3), value: 0 }
                Const { dst: Reg(4), value: 0 }
                Const { dst: Reg(5), value: 0 }
                Const { dst: Reg(6), value: 7 }
                Unary { op: Neg, dst: Reg(7), a: Reg(6) }
                Mov { dst: Reg(0), src: Reg(7) }
                Mov { dst: Reg(8), src: Reg(0) }
                Const { dst: Reg(9), value: 2 }
                Binary { op: DivU, dst: Reg(10), a: Reg(8), b: Reg(9) }
                Mov { dst: Reg(1), src: Reg(10) }
                Ctx { dst: Reg(11), value: Pid }
                Const { dst: Reg(12), value: 2 }
                Binary { op: DivU, dst: Reg(13), a: Reg(11), b: Reg(12) }
                Mov { dst: Reg(2), src: Reg(13) }
                Mov { dst: Reg(14), src: Reg(0) }
                Const { dst: Reg(15), value: 1 }
                Binary { op: ShrU, dst: Reg(16), a: Reg(14), b: Reg(15) }
                Mov { dst: Reg(3), src: Reg(16) }
                Mov { dst: Reg(17), src: Reg(0) }
                Const { dst: Reg(18), value: 3 }
                Binary { op: LtS, dst: Reg(19), a: Reg(17), b: Reg(18) }
                Mov { dst: Reg(4), src: Reg(19) }
                Ctx { dst: Reg(20), value: Pid }
                Const { dst: Reg(21), value: 3 }
                Binary { op: LtU, dst: Reg(22), a: Reg(20), b: Reg(21) }
                Mov { dst: Reg(5), src: Reg(22) }
              L0:
                Return
        "#]],
    );
}

#[test]
fn short_circuit_logic() {
    check(
        "uprobe:/bin/a:f /arg0 && (arg1 || arg2)/ { @ = count(); }",
        expect![[r#"
        map 0 @: Count
        probe uprobe:/bin/a:f (regs 7, slots [])
            Const { dst: Reg(0), value: 0 }
            Ctx { dst: Reg(1), value: Arg(0) }
            Branch { cond: Reg(1), if_true: Label(1), if_false: Label(2) }
          L1:
            Const { dst: Reg(2), value: 1 }
            Ctx { dst: Reg(3), value: Arg(1) }
            Branch { cond: Reg(3), if_true: Label(4), if_false: Label(3) }
          L3:
            Ctx { dst: Reg(4), value: Arg(2) }
            Const { dst: Reg(5), value: 0 }
            Binary { op: Ne, dst: Reg(2), a: Reg(4), b: Reg(5) }
          L4:
            Const { dst: Reg(6), value: 0 }
            Binary { op: Ne, dst: Reg(0), a: Reg(2), b: Reg(6) }
          L2:
            Branch { cond: Reg(0), if_true: Label(5), if_false: Label(0) }
          L5:
            MapAgg { map: MapId(0), key: None, op: Count }
          L0:
            Return
    "#]],
    );
}

#[test]
fn if_else_chain() {
    check("uprobe:/bin/a:f { if (arg0 > 10) { @big = count(); } else if (arg0 > 5) { @mid = count(); } else { @small = count(); } }", expect![[r#"
        map 0 @big: Count
        map 1 @mid: Count
        map 2 @small: Count
        probe uprobe:/bin/a:f (regs 6, slots [])
            Ctx { dst: Reg(0), value: Arg(0) }
            Const { dst: Reg(1), value: 10 }
            Binary { op: GtU, dst: Reg(2), a: Reg(0), b: Reg(1) }
            Branch { cond: Reg(2), if_true: Label(1), if_false: Label(2) }
          L1:
            MapAgg { map: MapId(0), key: None, op: Count }
            Jump(Label(3))
          L2:
            Ctx { dst: Reg(3), value: Arg(0) }
            Const { dst: Reg(4), value: 5 }
            Binary { op: GtU, dst: Reg(5), a: Reg(3), b: Reg(4) }
            Branch { cond: Reg(5), if_true: Label(4), if_false: Label(5) }
          L4:
            MapAgg { map: MapId(1), key: None, op: Count }
            Jump(Label(6))
          L5:
            MapAgg { map: MapId(2), key: None, op: Count }
          L6:
          L3:
          L0:
            Return
    "#]]);
}

#[test]
fn scratch_variables_and_casts() {
    check(
        "uprobe:/bin/a:f { $x = (int8)arg0; $y = (uint16)arg1; $z = $x + $y; @v = $z; }",
        expect![[r#"
        map 0 @v: Plain(Int { bits: 64, signed: false })
        probe uprobe:/bin/a:f (regs 11, slots [])
            Const { dst: Reg(0), value: 0 }
            Const { dst: Reg(1), value: 0 }
            Const { dst: Reg(2), value: 0 }
            Ctx { dst: Reg(3), value: Arg(0) }
            Extend { dst: Reg(4), src: Reg(3), bits: 8, signed: true }
            Mov { dst: Reg(0), src: Reg(4) }
            Ctx { dst: Reg(5), value: Arg(1) }
            Extend { dst: Reg(6), src: Reg(5), bits: 16, signed: false }
            Mov { dst: Reg(1), src: Reg(6) }
            Mov { dst: Reg(7), src: Reg(0) }
            Mov { dst: Reg(8), src: Reg(1) }
            Binary { op: Add, dst: Reg(9), a: Reg(7), b: Reg(8) }
            Mov { dst: Reg(2), src: Reg(9) }
            Mov { dst: Reg(10), src: Reg(2) }
            MapStore { map: MapId(0), key: None, src_reg: Some(Reg(10)), src_place: None }
          L0:
            Return
    "#]],
    );
}

#[test]
fn str_and_hist() {
    check("uprobe:/bin/a:open { @paths[str(arg0)] = count(); @sizes = hist(arg1); @k = hist(arg1, 2); }", expect![[r#"
        map 0 @paths[string[64]]: Count
        map 1 @sizes: Hist { k: 0 }
        map 2 @k: Hist { k: 2 }
        probe uprobe:/bin/a:open (regs 3, slots [64])
            Ctx { dst: Reg(0), value: Arg(0) }
            ReadStr { dst: Place { slot: Slot(0), off: 0 }, addr: Reg(0), max: None, cap: 64 }
            MapAgg { map: MapId(0), key: Some(Place { slot: Slot(0), off: 0 }), op: Count }
            Ctx { dst: Reg(1), value: Arg(1) }
            MapAgg { map: MapId(1), key: None, op: Hist(Reg(1)) }
            Ctx { dst: Reg(2), value: Arg(1) }
            MapAgg { map: MapId(2), key: None, op: Hist(Reg(2)) }
          L0:
            Return
    "#]]);
}

#[test]
fn latency_map_round_trip() {
    check(
        "uprobe:/bin/a:f { @start[tid] = nsecs; } uretprobe:/bin/a:f /@start[tid]/ { @ns = hist(nsecs - @start[tid]); delete(@start[tid]); }",
        expect![[r#"
            map 0 @start[uint64]: Plain(Int { bits: 64, signed: false })
            map 1 @ns: Hist { k: 0 }
            probe uprobe:/bin/a:f (regs 2, slots [8])
                Ctx { dst: Reg(0), value: Nsecs }
                Ctx { dst: Reg(1), value: Tid }
                Zero { place: Place { slot: Slot(0), off: 0 }, len: 8 }
                Store { place: Place { slot: Slot(0), off: 0 }, src: Reg(1), size: 8 }
                MapStore { map: MapId(0), key: Some(Place { slot: Slot(0), off: 0 }), src_reg: Some(Reg(0)), src_place: None }
              L0:
                Return
            probe uretprobe:/bin/a:f (regs 8, slots [8])
                Ctx { dst: Reg(0), value: Tid }
                Zero { place: Place { slot: Slot(0), off: 0 }, len: 8 }
                Store { place: Place { slot: Slot(0), off: 0 }, src: Reg(0), size: 8 }
                MapLoad { map: MapId(0), key: Some(Place { slot: Slot(0), off: 0 }), dst_reg: Some(Reg(1)), dst_place: None }
                Branch { cond: Reg(1), if_true: Label(1), if_false: Label(0) }
              L1:
                Ctx { dst: Reg(2), value: Nsecs }
                Ctx { dst: Reg(3), value: Tid }
                Zero { place: Place { slot: Slot(0), off: 0 }, len: 8 }
                Store { place: Place { slot: Slot(0), off: 0 }, src: Reg(3), size: 8 }
                MapLoad { map: MapId(0), key: Some(Place { slot: Slot(0), off: 0 }), dst_reg: Some(Reg(4)), dst_place: None }
                Binary { op: Sub, dst: Reg(5), a: Reg(2), b: Reg(4) }
                MapAgg { map: MapId(1), key: None, op: Hist(Reg(5)) }
                Ctx { dst: Reg(6), value: Tid }
                Zero { place: Place { slot: Slot(0), off: 0 }, len: 8 }
                Store { place: Place { slot: Slot(0), off: 0 }, src: Reg(6), size: 8 }
                MapDelete { map: MapId(0), key: Some(Place { slot: Slot(0), off: 0 }), dst: Some(Reg(7)) }
              L0:
                Return
        "#]],
    );
}

#[test]
fn string_comparison() {
    check(
        r#"uprobe:/bin/a:f /comm == "bash"/ { @ = count(); }"#,
        expect![[r#"
        map 0 @: Count
        probe uprobe:/bin/a:f (regs 1, slots [16, 8, 16])
            Comm { dst: Place { slot: Slot(0), off: 0 }, cap: 16 }
            SetBytes { place: Place { slot: Slot(1), off: 0 }, bytes: [98, 97, 115, 104], len: 5 }
            Zero { place: Place { slot: Slot(2), off: 0 }, len: 16 }
            Copy { dst: Place { slot: Slot(2), off: 0 }, src: Place { slot: Slot(1), off: 0 }, len: 5 }
            StrEq { dst: Reg(0), a: Place { slot: Slot(0), off: 0 }, b: Place { slot: Slot(2), off: 0 }, len: 16 }
            Branch { cond: Reg(0), if_true: Label(1), if_false: Label(0) }
          L1:
            MapAgg { map: MapId(0), key: None, op: Count }
          L0:
            Return
    "#]],
    );
}

#[test]
fn printf_packs_strings_and_ints() {
    check(
        r#"uprobe:/bin/a:f { printf("%s %d %s\n", comm, (uint8)arg0, func); }"#,
        expect![[r#"
        fmt 0 "%s %d %s\n" (string[16], uint64, usym)
        probe uprobe:/bin/a:f (regs 3, slots [16, 32])
            Comm { dst: Place { slot: Slot(0), off: 0 }, cap: 16 }
            Ctx { dst: Reg(0), value: Arg(0) }
            Extend { dst: Reg(1), src: Reg(0), bits: 8, signed: false }
            Ctx { dst: Reg(2), value: FuncAddr }
            Zero { place: Place { slot: Slot(1), off: 0 }, len: 32 }
            Copy { dst: Place { slot: Slot(1), off: 0 }, src: Place { slot: Slot(0), off: 0 }, len: 16 }
            Store { place: Place { slot: Slot(1), off: 16 }, src: Reg(1), size: 8 }
            Store { place: Place { slot: Slot(1), off: 24 }, src: Reg(2), size: 8 }
            Emit { kind: Printf(FmtId(0)), payload: Some(Place { slot: Slot(1), off: 0 }), len: 32 }
          L0:
            Return
    "#]],
    );
}

#[test]
fn while_loop_is_bounded() {
    let opts = Options {
        config: weft_ir::Config {
            max_loop_iterations: 100,
            ..Default::default()
        },
        ..Default::default()
    };
    check_with(
        "BEGIN { $i = 0; while ($i < 10) { if ($i == 5) { break; } $i++; } }",
        &opts,
        expect![[r#"
            probe BEGIN (regs 15, slots [])
                Const { dst: Reg(0), value: 0 }
                Const { dst: Reg(1), value: 0 }
                Mov { dst: Reg(0), src: Reg(1) }
                Const { dst: Reg(2), value: 0 }
              L1:
                Mov { dst: Reg(3), src: Reg(0) }
                Const { dst: Reg(4), value: 10 }
                Binary { op: LtS, dst: Reg(5), a: Reg(3), b: Reg(4) }
                Branch { cond: Reg(5), if_true: Label(2), if_false: Label(3) }
              L2:
                Const { dst: Reg(6), value: 100 }
                Binary { op: GeU, dst: Reg(7), a: Reg(2), b: Reg(6) }
                Branch { cond: Reg(7), if_true: Label(4), if_false: Label(5) }
              L4:
                CountError(LoopBound)
                Jump(Label(3))
              L5:
                Const { dst: Reg(8), value: 1 }
                Binary { op: Add, dst: Reg(2), a: Reg(2), b: Reg(8) }
                Mov { dst: Reg(9), src: Reg(0) }
                Const { dst: Reg(10), value: 5 }
                Binary { op: Eq, dst: Reg(11), a: Reg(9), b: Reg(10) }
                Branch { cond: Reg(11), if_true: Label(6), if_false: Label(7) }
              L6:
                Jump(Label(3))
              L9:
                Jump(Label(8))
              L7:
              L8:
                Mov { dst: Reg(12), src: Reg(0) }
                Const { dst: Reg(13), value: 1 }
                Binary { op: Add, dst: Reg(14), a: Reg(0), b: Reg(13) }
                Mov { dst: Reg(0), src: Reg(14) }
                Jump(Label(1))
              L3:
              L0:
                Return
        "#]],
    );
}

#[test]
fn positional_parameters() {
    let opts = Options {
        positional: vec!["42".into(), "name".into()],
        ..Default::default()
    };
    check_with(
        r#"BEGIN { printf("%d %s %d\n", $1, $2, $#); }"#,
        &opts,
        expect![[r#"
        fmt 0 "%d %s %d\n" (int64, string[5], int64)
        probe BEGIN (regs 2, slots [8, 24])
            Const { dst: Reg(0), value: 42 }
            SetBytes { place: Place { slot: Slot(0), off: 0 }, bytes: [110, 97, 109, 101], len: 5 }
            Const { dst: Reg(1), value: 2 }
            Zero { place: Place { slot: Slot(1), off: 0 }, len: 24 }
            Store { place: Place { slot: Slot(1), off: 0 }, src: Reg(0), size: 8 }
            Copy { dst: Place { slot: Slot(1), off: 8 }, src: Place { slot: Slot(0), off: 0 }, len: 5 }
            Store { place: Place { slot: Slot(1), off: 16 }, src: Reg(1), size: 8 }
            Emit { kind: Printf(FmtId(0)), payload: Some(Place { slot: Slot(1), off: 0 }), len: 24 }
          L0:
            Return
    "#]],
    );
}

#[test]
fn config_block_sets_program_config() {
    let out = compile("config = { max_map_keys = 10; max_strlen = 32 }\nuprobe:/bin/a:f { @[str(arg0)] = count(); }", "t.bt", &Options::default());
    let p = out.program.expect("compiles");
    assert_eq!(p.config.max_map_keys, 10);
    assert_eq!(p.config.strlen, 32);
    assert_eq!(p.maps[0].key, Some(weft_ir::Type::Str { cap: 32 }));
    assert_eq!(p.config.missing_probes, weft_ir::MissingProbes::Error);
    for (v, want) in [
        ("warn", weft_ir::MissingProbes::Warn),
        ("ignore", weft_ir::MissingProbes::Ignore),
    ] {
        let out = compile(
            &format!("config = {{ missing_probes = \"{v}\" }} BEGIN {{ }}"),
            "t.bt",
            &Options::default(),
        );
        assert_eq!(out.program.expect("compiles").config.missing_probes, want);
    }
    let out = compile(
        "let @a = hash(3); let @b = lruhash(2); BEGIN { @a[1] = 1; @b[1] = 1; }",
        "t.bt",
        &Options::default(),
    );
    let c = out.program.expect("compiles").config;
    assert_eq!((c.max_keys_of("@a"), c.max_keys_of("@b")), (3, 4096));
    let out = compile(
        "config = { missing_probes = \"maybe\" }",
        "t.bt",
        &Options::default(),
    );
    assert!(out.diagnostics[0]
        .message
        .contains("missing_probes takes \"error\", \"warn\" or \"ignore\""));
}

/// A division or remainder by what may be 0 warns where it is, as upstream: a
/// branch to a located message (the source line and `~` under it); a literal
/// nonzero divisor needs none.
#[test]
fn division_by_zero_warns_where_it_happens() {
    let out = compile(
        "BEGIN { $z = 0; @a = 7 / $z; @b = 7 / 2; }",
        "-e",
        &Options::default(),
    );
    let p = out.program.expect("compiles");
    assert_eq!(p.formats.len(), 1);
    let m = p.formats[0].message.clone().expect("a located message");
    assert_eq!(m.location(), "stdin:1:22-28");
    assert_eq!(
        m.context,
        [
            "BEGIN { $z = 0; @a = 7 / $z; @b = 7 / 2; }",
            "                     ~~~~~~"
        ]
    );
    assert!(p.formats[0]
        .text
        .starts_with("Divide or modulo by 0 detected."));
}

#[test]
fn maps_are_numbered_in_order_of_appearance() {
    let out = compile(
        "uprobe:/bin/a:f { @b = @a[1]; } BEGIN { @a[1] = 2; @c = count(); }",
        "t.bt",
        &Options::default(),
    );
    let p = out.program.expect("compiles");
    let names: Vec<&str> = p.maps.iter().map(|m| m.name.as_str()).collect();
    assert_eq!(names, ["@b", "@a", "@c"]);
    assert_eq!(p.probe_names, ["uprobe:/bin/a:f", "BEGIN"]);
}

// ---- phase 2 -------------------------------------------------------------------

#[test]
fn for_range_and_map_iteration() {
    check(
        "BEGIN { @m[1] = 2; for ($i : 0..3) { @m[$i] = $i; } for ($kv : @m) { printf(\"%d %d\\n\", $kv.0, $kv.1); } }",
        expect![[r#"
            map 0 @m[int64]: Plain(Int { bits: 64, signed: true })
            fmt 0 "%d %d\n" (int64, int64)
            probe BEGIN (regs 24, slots [16, 8, 16, 16])
                Const { dst: Reg(0), value: 0 }
                Zero { place: Place { slot: Slot(0), off: 0 }, len: 16 }
                Const { dst: Reg(1), value: 2 }
                Const { dst: Reg(2), value: 1 }
                Zero { place: Place { slot: Slot(1), off: 0 }, len: 8 }
                Store { place: Place { slot: Slot(1), off: 0 }, src: Reg(2), size: 8 }
                MapStore { map: MapId(0), key: Some(Place { slot: Slot(1), off: 0 }), src_reg: Some(Reg(1)), src_place: None }
                Const { dst: Reg(3), value: 0 }
                Mov { dst: Reg(4), src: Reg(3) }
                Const { dst: Reg(5), value: 3 }
                Const { dst: Reg(6), value: 0 }
              L1:
                Binary { op: LtS, dst: Reg(7), a: Reg(4), b: Reg(5) }
                Branch { cond: Reg(7), if_true: Label(2), if_false: Label(4) }
              L2:
                Const { dst: Reg(8), value: 1048576 }
                Binary { op: GeU, dst: Reg(9), a: Reg(6), b: Reg(8) }
                Branch { cond: Reg(9), if_true: Label(5), if_false: Label(6) }
              L5:
                CountError(LoopBound)
                Jump(Label(4))
              L6:
                Const { dst: Reg(10), value: 1 }
                Binary { op: Add, dst: Reg(6), a: Reg(6), b: Reg(10) }
                Mov { dst: Reg(0), src: Reg(4) }
                Mov { dst: Reg(11), src: Reg(0) }
                Mov { dst: Reg(12), src: Reg(0) }
                Zero { place: Place { slot: Slot(1), off: 0 }, len: 8 }
                Store { place: Place { slot: Slot(1), off: 0 }, src: Reg(12), size: 8 }
                MapStore { map: MapId(0), key: Some(Place { slot: Slot(1), off: 0 }), src_reg: Some(Reg(11)), src_place: None }
              L3:
                Const { dst: Reg(13), value: 1 }
                Binary { op: Add, dst: Reg(4), a: Reg(4), b: Reg(13) }
                Jump(Label(1))
              L4:
                MapIterStart { it: Reg(14), map: MapId(0) }
                Const { dst: Reg(15), value: 0 }
              L7:
                MapIterNext { found: Reg(16), it: Reg(14), map: MapId(0), key: Some(Place { slot: Slot(1), off: 0 }), dst_reg: Some(Reg(17)), dst_place: None }
                Branch { cond: Reg(16), if_true: Label(8), if_false: Label(9) }
              L8:
                Const { dst: Reg(18), value: 1048576 }
                Binary { op: GeU, dst: Reg(19), a: Reg(15), b: Reg(18) }
                Branch { cond: Reg(19), if_true: Label(10), if_false: Label(11) }
              L10:
                CountError(LoopBound)
                Jump(Label(9))
              L11:
                Const { dst: Reg(20), value: 1 }
                Binary { op: Add, dst: Reg(15), a: Reg(15), b: Reg(20) }
                Zero { place: Place { slot: Slot(2), off: 0 }, len: 16 }
                LoadSlot { dst: Reg(21), place: Place { slot: Slot(1), off: 0 }, size: 8, signed: true }
                Store { place: Place { slot: Slot(2), off: 0 }, src: Reg(21), size: 8 }
                Store { place: Place { slot: Slot(2), off: 8 }, src: Reg(17), size: 8 }
                Copy { dst: Place { slot: Slot(0), off: 0 }, src: Place { slot: Slot(2), off: 0 }, len: 16 }
                LoadSlot { dst: Reg(22), place: Place { slot: Slot(0), off: 0 }, size: 8, signed: true }
                LoadSlot { dst: Reg(23), place: Place { slot: Slot(0), off: 8 }, size: 8, signed: true }
                Zero { place: Place { slot: Slot(3), off: 0 }, len: 16 }
                Store { place: Place { slot: Slot(3), off: 0 }, src: Reg(22), size: 8 }
                Store { place: Place { slot: Slot(3), off: 8 }, src: Reg(23), size: 8 }
                Emit { kind: Printf(FmtId(0)), payload: Some(Place { slot: Slot(3), off: 0 }), len: 16 }
                Jump(Label(7))
              L9:
              L0:
                Return
        "#]],
    );
}

#[test]
fn tuples_records_and_print() {
    check(
        r#"BEGIN { $t = (1, "ab"); $r = (x = 2, s = "long string"); @t[$t.1] = $r; print($t); print(@t); print(@t, 3, 10); }"#,
        expect![[r#"
            map 0 @t[string[3]]: Plain(Record([("x", Int { bits: 64, signed: true }), ("s", Str { cap: 12 })]))
            fmt 0 "" ((int64,string[3]))
            probe BEGIN (regs 2, slots [16, 24, 8, 16, 24])
                Zero { place: Place { slot: Slot(0), off: 0 }, len: 16 }
                Zero { place: Place { slot: Slot(1), off: 0 }, len: 24 }
                Const { dst: Reg(0), value: 1 }
                SetBytes { place: Place { slot: Slot(2), off: 0 }, bytes: [97, 98], len: 3 }
                Zero { place: Place { slot: Slot(3), off: 0 }, len: 16 }
                Store { place: Place { slot: Slot(3), off: 0 }, src: Reg(0), size: 8 }
                Copy { dst: Place { slot: Slot(3), off: 8 }, src: Place { slot: Slot(2), off: 0 }, len: 3 }
                Copy { dst: Place { slot: Slot(0), off: 0 }, src: Place { slot: Slot(3), off: 0 }, len: 16 }
                Const { dst: Reg(1), value: 2 }
                SetBytes { place: Place { slot: Slot(3), off: 0 }, bytes: [108, 111, 110, 103, 32, 115, 116, 114, 105, 110, 103], len: 12 }
                Zero { place: Place { slot: Slot(4), off: 0 }, len: 24 }
                Store { place: Place { slot: Slot(4), off: 0 }, src: Reg(1), size: 8 }
                Copy { dst: Place { slot: Slot(4), off: 8 }, src: Place { slot: Slot(3), off: 0 }, len: 12 }
                Copy { dst: Place { slot: Slot(1), off: 0 }, src: Place { slot: Slot(4), off: 0 }, len: 24 }
                Zero { place: Place { slot: Slot(2), off: 0 }, len: 3 }
                Copy { dst: Place { slot: Slot(2), off: 0 }, src: Place { slot: Slot(0), off: 8 }, len: 3 }
                MapStore { map: MapId(0), key: Some(Place { slot: Slot(2), off: 0 }), src_reg: None, src_place: Some(Place { slot: Slot(1), off: 0 }) }
                Zero { place: Place { slot: Slot(3), off: 0 }, len: 16 }
                Copy { dst: Place { slot: Slot(3), off: 0 }, src: Place { slot: Slot(0), off: 0 }, len: 16 }
                Emit { kind: PrintValue(FmtId(0)), payload: Some(Place { slot: Slot(3), off: 0 }), len: 16 }
                Emit { kind: PrintMap { map: MapId(0), top: 0, div: 0 }, payload: None, len: 0 }
                Emit { kind: PrintMap { map: MapId(0), top: 3, div: 10 }, payload: None, len: 0 }
              L0:
                Return
        "#]],
    );
}

#[test]
fn aggregations_and_map_functions() {
    check(
        "uprobe:/bin/a:f { @a = avg(arg0); @mn = min((int32)arg0); @mx = max(arg0); @s = stats(arg0); @l = lhist(arg0, 0, 100, 10); $x = @a + @mn; if (has_key(@a, 1) == 0) { } $n = len(@l); clear(@a); zero(@s); }",
        expect![[r#"
            error: `@a` has no keys
             --> t.bt:1:151
              |
            1 | uprobe:/bin/a:f { @a = avg(arg0); @mn = min((int32)arg0); @mx = max(arg0); @s = stats(arg0); @l = lhist(arg0, 0, 100, 10); $x = @a + @mn; if (has_key(@a, 1) == 0) { } $n = len(@l); clear(@a); zero(@s); }
              |                                                                                                                                                       ^^

        "#]],
    );
}

#[test]
fn stacks_symbols_time() {
    check(
        r#"uprobe:/bin/a:f { @[ustack(perf, 8)] = count(); printf("%s %s\n", usym(arg0), strftime("%H:%M", nsecs)); time("%H\n"); $a = uaddr("main"); }"#,
        expect![[r#"
            map 0 @[ustack[8]]: Count
            fmt 0 "%H:%M" ()
            fmt 1 "%s %s\n" (usym, timestamp)
            fmt 2 "%H\n" ()
            probe uprobe:/bin/a:f (regs 9, slots [72, 72, 16, 24])
                Const { dst: Reg(0), value: 0 }
                UStack { dst: Place { slot: Slot(0), off: 0 }, depth: 8 }
                Zero { place: Place { slot: Slot(1), off: 0 }, len: 72 }
                Copy { dst: Place { slot: Slot(1), off: 0 }, src: Place { slot: Slot(0), off: 0 }, len: 72 }
                MapAgg { map: MapId(0), key: Some(Place { slot: Slot(1), off: 0 }), op: Count }
                Ctx { dst: Reg(1), value: Arg(0) }
                Ctx { dst: Reg(2), value: Nsecs }
                Ctx { dst: Reg(3), value: RealtimeNsecs }
                Ctx { dst: Reg(4), value: Nsecs }
                Binary { op: Sub, dst: Reg(5), a: Reg(3), b: Reg(4) }
                Binary { op: Add, dst: Reg(6), a: Reg(2), b: Reg(5) }
                Const { dst: Reg(7), value: 0 }
                Store { place: Place { slot: Slot(2), off: 0 }, src: Reg(7), size: 8 }
                Store { place: Place { slot: Slot(2), off: 8 }, src: Reg(6), size: 8 }
                Zero { place: Place { slot: Slot(3), off: 0 }, len: 24 }
                Store { place: Place { slot: Slot(3), off: 0 }, src: Reg(1), size: 8 }
                Copy { dst: Place { slot: Slot(3), off: 8 }, src: Place { slot: Slot(2), off: 0 }, len: 16 }
                Emit { kind: Printf(FmtId(1)), payload: Some(Place { slot: Slot(3), off: 0 }), len: 24 }
                Emit { kind: Time(FmtId(2)), payload: None, len: 0 }
                SymbolAddr { dst: Reg(8), symbol: SymbolRef { name: "main", module: None, end: false } }
                Mov { dst: Reg(0), src: Reg(8) }
              L0:
                Return
        "#]],
    );
}

#[test]
fn struct_field_reads_through_pointers() {
    check(
        "struct Inner { int a; long b; }\nstruct Outer { char tag; struct Inner in; int arr[4]; }\nuprobe:/bin/a:f { $o = (struct Outer *)arg0; @b = $o->in.b; @e = $o->arr[2]; @d = *(uint16 *)arg1; }",
        expect![[r#"
            map 0 @b: Plain(Int { bits: 64, signed: true })
            map 1 @e: Plain(Int { bits: 64, signed: true })
            map 2 @d: Plain(Int { bits: 64, signed: false })
            probe uprobe:/bin/a:f (regs 18, slots [])
                Const { dst: Reg(0), value: 0 }
                Ctx { dst: Reg(1), value: Arg(0) }
                Mov { dst: Reg(0), src: Reg(1) }
                Mov { dst: Reg(2), src: Reg(0) }
                Const { dst: Reg(3), value: 8 }
                Binary { op: Add, dst: Reg(4), a: Reg(2), b: Reg(3) }
                Const { dst: Reg(5), value: 8 }
                Binary { op: Add, dst: Reg(6), a: Reg(4), b: Reg(5) }
                Load { dst: Reg(7), addr: Reg(6), size: 8, signed: true }
                MapStore { map: MapId(0), key: None, src_reg: Some(Reg(7)), src_place: None }
                Mov { dst: Reg(8), src: Reg(0) }
                Const { dst: Reg(9), value: 24 }
                Binary { op: Add, dst: Reg(10), a: Reg(8), b: Reg(9) }
                Const { dst: Reg(11), value: 2 }
                Const { dst: Reg(12), value: 4 }
                Binary { op: Mul, dst: Reg(13), a: Reg(11), b: Reg(12) }
                Binary { op: Add, dst: Reg(14), a: Reg(10), b: Reg(13) }
                Load { dst: Reg(15), addr: Reg(14), size: 4, signed: true }
                MapStore { map: MapId(1), key: None, src_reg: Some(Reg(15)), src_place: None }
                Ctx { dst: Reg(16), value: Arg(1) }
                Load { dst: Reg(17), addr: Reg(16), size: 2, signed: false }
                MapStore { map: MapId(2), key: None, src_reg: Some(Reg(17)), src_place: None }
              L0:
                Return
        "#]],
    );
}

#[test]
fn string_functions_and_casts() {
    check(
        r#"uprobe:/bin/a:f { $s = str(arg0, arg1); if (strncmp($s, "ab", 2) == 0 && strcontains($s, "x")) { @b[buf(arg0, 8)] = count(); } }"#,
        expect![[r#"
            map 0 @b[buffer[8]]: Count
            probe uprobe:/bin/a:f (regs 10, slots [64, 64, 8, 8, 64, 16, 16])
                Zero { place: Place { slot: Slot(0), off: 0 }, len: 64 }
                Ctx { dst: Reg(0), value: Arg(0) }
                Ctx { dst: Reg(1), value: Arg(1) }
                ReadStr { dst: Place { slot: Slot(1), off: 0 }, addr: Reg(0), max: Some(Reg(1)), cap: 64 }
                Copy { dst: Place { slot: Slot(0), off: 0 }, src: Place { slot: Slot(1), off: 0 }, len: 64 }
                Const { dst: Reg(2), value: 0 }
                SetBytes { place: Place { slot: Slot(2), off: 0 }, bytes: [97, 98], len: 3 }
                Zero { place: Place { slot: Slot(1), off: 0 }, len: 64 }
                Copy { dst: Place { slot: Slot(1), off: 0 }, src: Place { slot: Slot(2), off: 0 }, len: 3 }
                StrCmp { dst: Reg(3), a: Place { slot: Slot(0), off: 0 }, b: Place { slot: Slot(1), off: 0 }, len: 2 }
                Const { dst: Reg(4), value: 0 }
                Binary { op: Eq, dst: Reg(5), a: Reg(3), b: Reg(4) }
                Branch { cond: Reg(5), if_true: Label(1), if_false: Label(2) }
              L1:
                SetBytes { place: Place { slot: Slot(3), off: 0 }, bytes: [120], len: 2 }
                Zero { place: Place { slot: Slot(4), off: 0 }, len: 64 }
                Copy { dst: Place { slot: Slot(4), off: 0 }, src: Place { slot: Slot(3), off: 0 }, len: 2 }
                StrContains { dst: Reg(6), a: Place { slot: Slot(0), off: 0 }, b: Place { slot: Slot(4), off: 0 }, len: 64 }
                Const { dst: Reg(7), value: 0 }
                Binary { op: Ne, dst: Reg(2), a: Reg(6), b: Reg(7) }
              L2:
                Branch { cond: Reg(2), if_true: Label(3), if_false: Label(4) }
              L3:
                Ctx { dst: Reg(8), value: Arg(0) }
                Const { dst: Reg(9), value: 8 }
                ReadBuf { dst: Place { slot: Slot(5), off: 0 }, addr: Reg(8), len: Reg(9), cap: 8 }
                Zero { place: Place { slot: Slot(6), off: 0 }, len: 12 }
                Copy { dst: Place { slot: Slot(6), off: 0 }, src: Place { slot: Slot(5), off: 0 }, len: 12 }
                MapAgg { map: MapId(0), key: Some(Place { slot: Slot(6), off: 0 }), op: Count }
                Jump(Label(5))
              L4:
              L5:
              L0:
                Return
        "#]],
    );
}

#[test]
fn unsafe_actions() {
    let opts = Options {
        unsafe_ok: true,
        ..Default::default()
    };
    check_with(
        r#"uprobe:/bin/a:f { system("kill %d", pid); signal("SIGUSR1"); cat("/proc/%d/status", pid); }"#,
        &opts,
        expect![[r#"
        fmt 0 "kill %d" (uint64)
        fmt 1 "/proc/%d/status" (uint64)
        probe uprobe:/bin/a:f (regs 3, slots [8])
            Ctx { dst: Reg(0), value: Pid }
            Zero { place: Place { slot: Slot(0), off: 0 }, len: 8 }
            Store { place: Place { slot: Slot(0), off: 0 }, src: Reg(0), size: 8 }
            Emit { kind: System(FmtId(0)), payload: Some(Place { slot: Slot(0), off: 0 }), len: 8 }
            Const { dst: Reg(1), value: 10 }
            Signal { sig: Reg(1) }
            Ctx { dst: Reg(2), value: Pid }
            Zero { place: Place { slot: Slot(0), off: 0 }, len: 8 }
            Store { place: Place { slot: Slot(0), off: 0 }, src: Reg(2), size: 8 }
            Emit { kind: Cat(FmtId(1)), payload: Some(Place { slot: Slot(0), off: 0 }), len: 8 }
          L0:
            Return
    "#]],
    );
}

#[test]
fn macros_expand_hygienically() {
    check("macro twice(x) { x * 2 }\nmacro inc($v) { let $tmp = 1; $v += $tmp; }\nBEGIN { $tmp = 5; inc($tmp); @r = twice($tmp); }", expect![[r#"
        map 0 @r: Plain(Int { bits: 64, signed: true })
        probe BEGIN (regs 9, slots [])
            Const { dst: Reg(0), value: 0 }
            Const { dst: Reg(1), value: 0 }
            Const { dst: Reg(2), value: 5 }
            Mov { dst: Reg(0), src: Reg(2) }
            Const { dst: Reg(3), value: 1 }
            Mov { dst: Reg(1), src: Reg(3) }
            Mov { dst: Reg(4), src: Reg(1) }
            Binary { op: Add, dst: Reg(5), a: Reg(0), b: Reg(4) }
            Mov { dst: Reg(0), src: Reg(5) }
            Mov { dst: Reg(6), src: Reg(0) }
            Const { dst: Reg(7), value: 2 }
            Binary { op: Mul, dst: Reg(8), a: Reg(6), b: Reg(7) }
            MapStore { map: MapId(0), key: None, src_reg: Some(Reg(8)), src_place: None }
          L0:
            Return
    "#]]);
}

/// bpftrace 0.17 compatibility (crates/cli/tests/compat.rs found each of these).
#[test]
fn str_with_a_length_keeps_that_many_characters() {
    // Literal n: a string of n characters and its NUL; variable n: at most n characters.
    check(
        r#"uprobe:/bin/true:f { @a[str(arg0, 3)] = count(); $n = 2; @b[str(arg0, $n)] = count(); }"#,
        expect![[r#"
            map 0 @a[string[4]]: Count
            map 1 @b[string[64]]: Count
            probe uprobe:/bin/true:f (regs 5, slots [8, 64])
                Const { dst: Reg(0), value: 0 }
                Ctx { dst: Reg(1), value: Arg(0) }
                ReadStr { dst: Place { slot: Slot(0), off: 0 }, addr: Reg(1), max: None, cap: 4 }
                MapAgg { map: MapId(0), key: Some(Place { slot: Slot(0), off: 0 }), op: Count }
                Const { dst: Reg(2), value: 2 }
                Mov { dst: Reg(0), src: Reg(2) }
                Ctx { dst: Reg(3), value: Arg(0) }
                Mov { dst: Reg(4), src: Reg(0) }
                ReadStr { dst: Place { slot: Slot(1), off: 0 }, addr: Reg(3), max: Some(Reg(4)), cap: 64 }
                MapAgg { map: MapId(1), key: Some(Place { slot: Slot(1), off: 0 }), op: Count }
              L0:
                Return
        "#]],
    );
}

#[test]
fn hist_takes_values_past_2_to_the_32_as_they_are() {
    check(
        "BEGIN { @h = hist(nsecs); }",
        expect![[r#"
            map 0 @h: Hist { k: 0 }
            probe BEGIN (regs 1, slots [])
                Ctx { dst: Reg(0), value: Nsecs }
                MapAgg { map: MapId(0), key: None, op: Hist(Reg(0)) }
              L0:
                Return
        "#]],
    );
}

/// `func` in a uretprobe is the probed function, as upstream names it (bpftrace 0.17
/// named the caller, from the return address).
#[test]
fn func_in_a_uretprobe_is_the_function() {
    check(
        "uretprobe:/bin/true:f { @[func] = count(); } uprobe:/bin/true:f { @[func] = count(); }",
        expect![[r#"
            map 0 @[usym]: Count
            probe uretprobe:/bin/true:f (regs 1, slots [8])
                Ctx { dst: Reg(0), value: FuncAddr }
                Zero { place: Place { slot: Slot(0), off: 0 }, len: 8 }
                Store { place: Place { slot: Slot(0), off: 0 }, src: Reg(0), size: 8 }
                MapAgg { map: MapId(0), key: Some(Place { slot: Slot(0), off: 0 }), op: Count }
              L0:
                Return
            probe uprobe:/bin/true:f (regs 1, slots [8])
                Ctx { dst: Reg(0), value: FuncAddr }
                Zero { place: Place { slot: Slot(0), off: 0 }, len: 8 }
                Store { place: Place { slot: Slot(0), off: 0 }, src: Reg(0), size: 8 }
                MapAgg { map: MapId(0), key: Some(Place { slot: Slot(0), off: 0 }), op: Count }
              L0:
                Return
        "#]],
    );
}

#[test]
fn positional_parameters_in_attach_points() {
    let opts = Options {
        positional: vec!["/bin/true".into(), "250".into()],
        ..Options::default()
    };
    check_with(
        "uprobe:$1:main { @n = count(); } interval:ms:$2 { exit(); } uprobe:$3:f { }",
        &opts,
        expect![[r#"
            error: attach point `uprobe:$3:f` uses $3, but 2 positional parameters are given
             --> t.bt:1:61
              |
            1 | uprobe:$1:main { @n = count(); } interval:ms:$2 { exit(); } uprobe:$3:f { }
              |                                                             ^^^^^^^^^^^

        "#]],
    );
    check_with(
        "uprobe:$1:main { @n = count(); } interval:ms:$2 { exit(); }",
        &opts,
        expect![[r#"
            map 0 @n: Count
            probe uprobe:/bin/true:main (regs 0, slots [])
                MapAgg { map: MapId(0), key: None, op: Count }
              L0:
                Return
            probe interval:ns:250000000 (regs 0, slots [])
                Emit { kind: Exit, payload: None, len: 0 }
                Return
              L1:
              L0:
                Return
        "#]],
    );
}

/// `strncmp(a, b, n)` with n above 2^32 compares whole strings: the length was kept
/// mod 2^32, so 4294967296 compared no bytes and every pair was equal (issue 24).
#[test]
fn strncmp_length_does_not_wrap() {
    let out = compile(
        r#"BEGIN { @ = strncmp("ab", "ac", 4294967296); }"#,
        "t.bt",
        &Options::default(),
    );
    let text = out.program.expect("compiles").to_string();
    let cmp: Vec<&str> = text.lines().filter(|l| l.contains("StrCmp")).collect();
    assert_eq!(cmp.len(), 1, "{text}");
    assert!(cmp[0].ends_with("len: 3 }"), "{text}");
}

#[test]
fn call_site_caller_and_execution_alias() {
    check(
        "call:./app:work within ma* { @[caller] = count(); } execution:./app:work { @e = count(); }",
        expect![[r#"
            map 0 @[string[64]]: Count
            map 1 @e: Count
            probe call:./app:work within ma* (regs 0, slots [64, 64])
                FuncName { dst: Place { slot: Slot(0), off: 0 }, cap: 64 }
                Zero { place: Place { slot: Slot(1), off: 0 }, len: 64 }
                Copy { dst: Place { slot: Slot(1), off: 0 }, src: Place { slot: Slot(0), off: 0 }, len: 64 }
                MapAgg { map: MapId(0), key: Some(Place { slot: Slot(1), off: 0 }), op: Count }
              L0:
                Return
            probe uprobe:./app:work (regs 0, slots [])
                MapAgg { map: MapId(1), key: None, op: Count }
              L0:
                Return
        "#]],
    );
}

/// Which maps only ever hold each thread's own entry (`weft_ir::thread_keyed_maps`):
/// the latency idiom's `@s[tid]`, and not a map keyed otherwise, read whole,
/// counted, or used by a kernel probe.
#[test]
fn maps_keyed_only_by_the_thread() {
    let keyed = |src: &str| {
        let out = compile(src, "t.bt", &Options::default());
        let p = out
            .program
            .unwrap_or_else(|| panic!("{:?}", out.diagnostics));
        let flags = weft_ir::thread_keyed_maps(&p);
        p.maps
            .iter()
            .zip(flags)
            .map(|(m, f)| (m.name.clone(), f))
            .collect::<Vec<_>>()
    };
    let idiom = "uprobe:/bin/sh:main { @s[tid] = nsecs; } \
                 uretprobe:/bin/sh:main /@s[tid]/ { @ns = hist(nsecs - @s[tid]); delete(@s[tid]); }";
    assert_eq!(
        keyed(idiom),
        [("@s".to_string(), true), ("@ns".to_string(), false)]
    );
    for (src, why) in [
        ("uprobe:/bin/sh:main { @s[pid] = nsecs; }", "keyed by pid"),
        (
            "uprobe:/bin/sh:main { @s[tid] = nsecs; @s[arg0] = 1; }",
            "another key",
        ),
        (
            "uprobe:/bin/sh:main { @s[tid] = nsecs; } END { print(@s); }",
            "printed",
        ),
        (
            "uprobe:/bin/sh:main { @s[tid] = nsecs; } END { @n = len(@s); }",
            "counted",
        ),
        (
            "uprobe:/bin/sh:main { @s[tid] = nsecs; } END { clear(@s); }",
            "cleared",
        ),
        ("uprobe:/bin/sh:main { @s[tid] = comm; }", "not a word"),
        (
            "uprobe:/bin/sh:main { @s[tid] = count(); }",
            "an aggregation",
        ),
    ] {
        assert!(
            keyed(src).iter().all(|(m, f)| m != "@s" || !f),
            "{why}: {src}"
        );
    }
}
