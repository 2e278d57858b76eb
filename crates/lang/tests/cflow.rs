//! Control-flow pointcuts (`cflow`, `cflow_strict`) and named pointcuts: how they
//! parse, what the expand stage turns them into, and their errors (golden; refresh
//! with `UPDATE_EXPECT=1 cargo test -p weft-lang --test cflow`).

use expect_test::{expect, Expect};
use weft_lang::{compile, dump, expand, parse, render, Dumpable, Options};

/// The AST after parsing (and any diagnostics).
fn parsed(input: &str, expected: Expect) {
    let (ast, diags) = parse(input);
    let mut out = dump(Dumpable::Ast(&ast));
    out.push_str(&render(&diags, input, "t.bt"));
    expected.assert_eq(&out);
}

/// The AST after the expand stage (and its diagnostics).
fn expanded(input: &str, expected: Expect) {
    let (mut ast, diags) = parse(input);
    assert!(diags.is_empty(), "{}", render(&diags, input, "t.bt"));
    let diags = expand(&mut ast);
    let mut out = dump(Dumpable::Ast(&ast));
    out.push_str(&render(&diags, input, "t.bt"));
    expected.assert_eq(&out);
}

/// Every diagnostic of a whole compilation.
fn diagnosed(input: &str, expected: Expect) {
    let out = compile(input, "t.bt", &Options::default());
    expected.assert_eq(&render(&out.diagnostics, input, "t.bt"));
}

#[test]
fn cflow_parses_elements_outermost_first() {
    parsed(
        "uprobe:./t:foo /cflow(uprobe:./t:zoo, uprobe:./t:bar, uprobe:./t:foo) && \
         !cflow_strict(u:./t:zoo,\n    u:./t:foo)/ { }",
        expect![[r#"
            Program
             uprobe:./t:foo
              predicate
               &&
                cflow: uprobe:./t:zoo, uprobe:./t:bar, uprobe:./t:foo
                !
                 cflow_strict: uprobe:./t:zoo, uprobe:./t:foo
        "#]],
    );
}

#[test]
fn pointcut_definitions_parse() {
    parsed(
        "pointcut net = uprobe:./s:ip_input, uprobe:./s:tcp_input;\n\
         pointcut all = net, uprobe:./s:udp_input;\n\
         net, uprobe:./s:x /cflow(all, uprobe:./s:deliver)/ { }",
        expect![[r#"
            Program
             pointcut net = uprobe:./s:ip_input, uprobe:./s:tcp_input
             pointcut all = net, uprobe:./s:udp_input
             net, uprobe:./s:x
              predicate
               cflow: all, uprobe:./s:deliver
        "#]],
    );
}

/// Named pointcuts are replaced where they are used, nested ones too.
#[test]
fn pointcuts_are_replaced_by_their_attach_points() {
    expanded(
        "pointcut net = uprobe:./s:ip_input, uprobe:./s:tcp_input;\n\
         pointcut all = net, uprobe:./s:udp_input;\n\
         all { @[probe] = count(); }\n\
         net, uprobe:./s:x /pid == 1/ { }",
        expect![[r#"
            Program
             uprobe:./s:ip_input, uprobe:./s:tcp_input, uprobe:./s:udp_input
              =
               map: @
                builtin: probe
               call: count
             uprobe:./s:ip_input, uprobe:./s:tcp_input, uprobe:./s:x
              predicate
               ==
                builtin: pid
                int: 1
        "#]],
    );
}

/// Non-strict: a counter per level, entries first (innermost level first),
/// returns last (outermost first). At the innermost function's own entry the
/// probe reads the level before it, and that level's function needs no probes.
#[test]
fn cflow_becomes_counters() {
    expanded(
        "uprobe:./t:foo /cflow(uprobe:./t:zoo, uprobe:./t:bar, uprobe:./t:foo)/ { @a = count(); }",
        expect![[r#"
            Program
             uprobe:./t:bar
              predicate
               !=
                call: __weft_thread
                 map: @__cflow_0_1
                int: 0
              =
               map: @__cflow_0_2
               call: sum
                int: 1
             uprobe:./t:zoo
              =
               map: @__cflow_0_1
               call: sum
                int: 1
             uprobe:./t:foo
              predicate
               !=
                call: __weft_thread
                 map: @__cflow_0_2
                int: 0
              =
               map: @a
               call: count
             uretprobe:./t:zoo
              predicate
               !=
                call: __weft_thread
                 map: @__cflow_0_1
                int: 0
              =
               map: @__cflow_0_1
               call: sum
                -
                 int: 1
             uretprobe:./t:bar
              predicate
               !=
                call: __weft_thread
                 map: @__cflow_0_1
                int: 0
              =
               map: @__cflow_0_2
               call: sum
                -
                 int: 1
        "#]],
    );
}

/// Elsewhere (another function, a return probe) the innermost level keeps its
/// own counter; the same cflow written twice shares its state.
#[test]
fn cflow_elsewhere_counts_the_innermost_level() {
    expanded(
        "uprobe:./t:leaf /cflow(uprobe:./t:zoo, uprobe:./t:foo)/ { @a = count(); }\n\
         uretprobe:./t:foo /cflow(uprobe:./t:zoo, uprobe:./t:foo)/ { @b = count(); }",
        expect![[r#"
            Program
             uprobe:./t:foo
              predicate
               !=
                call: __weft_thread
                 map: @__cflow_0_1
                int: 0
              =
               map: @__cflow_0_2
               call: sum
                int: 1
             uprobe:./t:zoo
              =
               map: @__cflow_0_1
               call: sum
                int: 1
             uprobe:./t:leaf
              predicate
               !=
                call: __weft_thread
                 map: @__cflow_0_2
                int: 0
              =
               map: @a
               call: count
             uretprobe:./t:foo
              predicate
               !=
                call: __weft_thread
                 map: @__cflow_0_2
                int: 0
              =
               map: @b
               call: count
             uretprobe:./t:zoo
              predicate
               !=
                call: __weft_thread
                 map: @__cflow_0_1
                int: 0
              =
               map: @__cflow_0_1
               call: sum
                -
                 int: 1
             uretprobe:./t:foo
              predicate
               !=
                call: __weft_thread
                 map: @__cflow_0_1
                int: 0
              =
               map: @__cflow_0_2
               call: sum
                -
                 int: 1
        "#]],
    );
}

/// Strict: bit stacks from level 2, each bit the caller test (the return address
/// in the level before's code) of a chained activation. Two levels at the inner
/// function's entry are the caller test alone, with no probes.
#[test]
fn cflow_strict_becomes_bit_stacks() {
    expanded(
        "uprobe:./t:foo /cflow_strict(uprobe:./t:zoo, uprobe:./t:foo)/ { @a = count(); }\n\
         uprobe:./t:leaf /cflow_strict(uprobe:./t:zoo, uprobe:./t:bar, uprobe:./t:foo)/ { @b = count(); }",
        expect![[r#"
            Program
             uprobe:./t:foo
              =
               map: @__cflow_1_3
               call: sum
                +
                 call: __weft_thread
                  map: @__cflow_1_3
                 ?:
                  &&
                   call: __weft_caller_in
                    string: "./t"
                    string: "bar"
                   !=
                    &
                     call: __weft_thread
                      map: @__cflow_1_2
                     int: 1
                    int: 0
                  int: 1
                  int: 0
             uprobe:./t:bar
              =
               map: @__cflow_1_2
               call: sum
                +
                 call: __weft_thread
                  map: @__cflow_1_2
                 ?:
                  call: __weft_caller_in
                   string: "./t"
                   string: "zoo"
                  int: 1
                  int: 0
             uprobe:./t:foo
              predicate
               call: __weft_caller_in
                string: "./t"
                string: "zoo"
              =
               map: @a
               call: count
             uprobe:./t:leaf
              predicate
               !=
                &
                 call: __weft_thread
                  map: @__cflow_1_3
                 int: 1
                int: 0
              =
               map: @b
               call: count
             uretprobe:./t:bar
              =
               map: @__cflow_1_2
               call: sum
                -
                 >>
                  call: __weft_thread
                   map: @__cflow_1_2
                  int: 1
                 call: __weft_thread
                  map: @__cflow_1_2
             uretprobe:./t:foo
              =
               map: @__cflow_1_3
               call: sum
                -
                 >>
                  call: __weft_thread
                   map: @__cflow_1_3
                  int: 1
                 call: __weft_thread
                  map: @__cflow_1_3
        "#]],
    );
}

/// A recursion (`cflow(rec, rec)`) cannot read the level before at its own
/// entry: that level is the same function, counted already.
#[test]
fn a_recursion_keeps_the_innermost_level() {
    expanded(
        "uprobe:./t:rec /cflow(uprobe:./t:rec, uprobe:./t:rec)/ { @a = count(); }",
        expect![[r#"
            Program
             uprobe:./t:rec
              predicate
               !=
                call: __weft_thread
                 map: @__cflow_0_1
                int: 0
              =
               map: @__cflow_0_2
               call: sum
                int: 1
             uprobe:./t:rec
              =
               map: @__cflow_0_1
               call: sum
                int: 1
             uprobe:./t:rec
              predicate
               !=
                call: __weft_thread
                 map: @__cflow_0_2
                int: 0
              =
               map: @a
               call: count
             uretprobe:./t:rec
              predicate
               !=
                call: __weft_thread
                 map: @__cflow_0_1
                int: 0
              =
               map: @__cflow_0_1
               call: sum
                -
                 int: 1
             uretprobe:./t:rec
              predicate
               !=
                call: __weft_thread
                 map: @__cflow_0_1
                int: 0
              =
               map: @__cflow_0_2
               call: sum
                -
                 int: 1
        "#]],
    );
}

/// BEGIN, END and interval probes run on no thread of the target: false there.
#[test]
fn cflow_is_false_where_no_target_thread_runs() {
    expanded(
        "BEGIN { @a = cflow(uprobe:./t:zoo, uprobe:./t:foo); }",
        expect![[r#"
            Program
             BEGIN
              =
               map: @a
               bool: false
        "#]],
    );
}

#[test]
fn cflow_errors() {
    diagnosed(
        "uprobe:./t:foo /cflow(uprobe:./t:foo)/ { }\n\
         uprobe:./t:foo /cflow(uretprobe:./t:zoo, usdt:./t:p, uprobe:./t:foo+4, uprobe:./t:foo)/ { }\n\
         uprobe:./t:foo /cflow_strict(uprobe:./t:z*, uprobe:./t:f*)/ { }\n\
         tracepoint:syscalls:sys_enter_read /cflow(uprobe:./t:zoo, uprobe:./t:foo)/ { }\n\
         uprobe:./t:foo /cflow(zoo, uprobe:./t:foo)/ { }",
        expect![[r#"
            error: cflow() needs at least two functions, outermost first: cflow(uprobe:BIN:OUTER, uprobe:BIN:INNER)
             --> t.bt:1:17
              |
            1 | uprobe:./t:foo /cflow(uprobe:./t:foo)/ { }
              |                 ^^^^^^^^^^^^^^^^^^^^^

            error: `uretprobe:./t:zoo` in cflow(): an element is a function's entry, uprobe:BIN:FUNC (weft follows its returns itself)
             --> t.bt:2:23
              |
            2 | uprobe:./t:foo /cflow(uretprobe:./t:zoo, usdt:./t:p, uprobe:./t:foo+4, uprobe:./t:foo)/ { }
              |                       ^^^^^^^^^^^^^^^^^

            error: `usdt:./t:p` in cflow(): an element is a function's entry, uprobe:BIN:FUNC (weft follows its returns itself)
             --> t.bt:2:42
              |
            2 | uprobe:./t:foo /cflow(uretprobe:./t:zoo, usdt:./t:p, uprobe:./t:foo+4, uprobe:./t:foo)/ { }
              |                                          ^^^^^^^^^^

            error: `uprobe:./t:foo+4` in cflow(): an element is a whole function, not an offset in it
             --> t.bt:2:54
              |
            2 | uprobe:./t:foo /cflow(uretprobe:./t:zoo, usdt:./t:p, uprobe:./t:foo+4, uprobe:./t:foo)/ { }
              |                                                      ^^^^^^^^^^^^^^^^

            error: `uprobe:./t:z*` in cflow_strict(): the caller's code is compared with return addresses, so it names one function (no wildcards)
             --> t.bt:3:30
              |
            3 | uprobe:./t:foo /cflow_strict(uprobe:./t:z*, uprobe:./t:f*)/ { }
              |                              ^^^^^^^^^^^^^

            error: cflow() cannot be used in a kernel probe: it reads the state of the target's thread, which kernel probes do not run on
             --> t.bt:4:37
              |
            4 | tracepoint:syscalls:sys_enter_read /cflow(uprobe:./t:zoo, uprobe:./t:foo)/ { }
              |                                     ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^

            error: unknown pointcut `zoo`
             --> t.bt:5:23
              |
            5 | uprobe:./t:foo /cflow(zoo, uprobe:./t:foo)/ { }
              |                       ^^^
              = help: define it first: `pointcut NAME = uprobe:BIN:FUNC, ...;`

        "#]],
    );
}

#[test]
fn pointcut_errors() {
    diagnosed(
        "pointcut net = uprobe:./s:ip_input;\n\
         pointcut net = uprobe:./s:tcp_input;\n\
         pointcut uprobe = uprobe:./s:x;\n\
         pointcut u = uprobe:./s:x;\n\
         nett { }\n\
         pointcut io = disk;\n\
         uprobe:./s:y /cflow(nte, uprobe:./s:y)/ { }",
        expect![[r#"
            error: pointcut `net` is defined twice
             --> t.bt:2:10
              |
            2 | pointcut net = uprobe:./s:tcp_input;
              |          ^^^
            note: first defined here
             --> t.bt:1:10
              |
            1 | pointcut net = uprobe:./s:ip_input;
              |          ^^^

            error: pointcut `uprobe` has the name of a probe type: choose another name
             --> t.bt:3:10
              |
            3 | pointcut uprobe = uprobe:./s:x;
              |          ^^^^^^

            error: pointcut `u` has the name of a probe type: choose another name
             --> t.bt:4:10
              |
            4 | pointcut u = uprobe:./s:x;
              |          ^

            error: unknown pointcut `nett`; did you mean `net`?
             --> t.bt:5:1
              |
            5 | nett { }
              | ^^^^

            error: unknown pointcut `disk`
             --> t.bt:6:15
              |
            6 | pointcut io = disk;
              |               ^^^^
              = help: the pointcuts are: net

            error: unknown pointcut `nte`; did you mean `net`?
             --> t.bt:7:21
              |
            7 | uprobe:./s:y /cflow(nte, uprobe:./s:y)/ { }
              |                     ^^^

        "#]],
    );
}

/// An element from a pointcut is reported at the definition, and its use.
#[test]
fn a_bad_element_from_a_pointcut_points_at_both() {
    diagnosed(
        "pointcut outer = uretprobe:./s:zoo;\nuprobe:./s:y /cflow(outer, uprobe:./s:y)/ { }",
        expect![[r#"
            error: `uretprobe:./s:zoo` in cflow(): an element is a function's entry, uprobe:BIN:FUNC (weft follows its returns itself)
             --> t.bt:1:18
              |
            1 | pointcut outer = uretprobe:./s:zoo;
              |                  ^^^^^^^^^^^^^^^^^
            note: used here
             --> t.bt:2:21
              |
            2 | uprobe:./s:y /cflow(outer, uprobe:./s:y)/ { }
              |                     ^^^^^

        "#]],
    );
}
