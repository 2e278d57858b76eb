//! Checker errors and their rendering (exact text with carets). Refresh with
//! `UPDATE_EXPECT=1 cargo test -p weft-lang`.

use expect_test::{expect, Expect};
use weft_lang::{compile, render, Options};

fn check_with(input: &str, opts: &Options, expected: Expect) {
    let out = compile(input, "script.bt", opts);
    expected.assert_eq(&render(&out.diagnostics, input, "script.bt"));
}

fn check(input: &str, expected: Expect) {
    check_with(input, &Options::default(), expected);
}

#[test]
fn unknown_function_suggests() {
    check(
        "BEGIN {\n    exit();\n    prinft(\"%d\\n\", pid);\n}\n",
        expect![[r#"
            warning: unreachable statement: it follows `exit()`, so it never runs
             --> script.bt:3:5
              |
            3 |     prinft("%d\n", pid);
              |     ^^^^^^^^^^^^^^^^^^^

            error: unknown function `prinft`; did you mean `printf`?
             --> script.bt:3:5
              |
            3 |     prinft("%d\n", pid);
              |     ^^^^^^

        "#]],
    );
}

#[test]
fn map_type_conflict_points_at_first_use() {
    check(
        "BEGIN { @x = count(); }\nEND { @x = 5; }\n",
        expect![[r#"
        error: type mismatch for `@x`: assigning `int64` to a map that holds `count()`
         --> script.bt:2:12
          |
        2 | END { @x = 5; }
          |            ^
        note: the map's type was set here
         --> script.bt:1:14
          |
        1 | BEGIN { @x = count(); }
          |              ^^^^^^^

    "#]],
    );
}

#[test]
fn map_key_conflict() {
    check(
        "BEGIN { @x[1] = 1; @x[\"a\"] = 2; @y = 1; @y[1] = 2; }",
        expect![[r#"
        error: `@x` is used with key `string[2]` here but with key `int64` before
         --> script.bt:1:20
          |
        1 | BEGIN { @x[1] = 1; @x["a"] = 2; @y = 1; @y[1] = 2; }
          |                    ^^^^^^^
        note: first used here
         --> script.bt:1:9
          |
        1 | BEGIN { @x[1] = 1; @x["a"] = 2; @y = 1; @y[1] = 2; }
          |         ^^^^^

        error: `@y` is used with key `int64` here but with no key before
         --> script.bt:1:41
          |
        1 | BEGIN { @x[1] = 1; @x["a"] = 2; @y = 1; @y[1] = 2; }
          |                                         ^^^^^
        note: first used here
         --> script.bt:1:33
          |
        1 | BEGIN { @x[1] = 1; @x["a"] = 2; @y = 1; @y[1] = 2; }
          |                                 ^^

    "#]],
    );
}

#[test]
fn aggregation_conflicts() {
    check(
        "BEGIN { @ = hist(1); @ = count(); @l = lhist(1, 0, 10, 1); @l = lhist(1, 0, 20, 1); }",
        expect![[r#"
        error: type mismatch for `@`: assigning `count()` to a map that holds `hist()`
         --> script.bt:1:26
          |
        1 | BEGIN { @ = hist(1); @ = count(); @l = lhist(1, 0, 10, 1); @l = lhist(1, 0, 20, 1); }
          |                          ^^^^^^^
        note: the map's type was set here
         --> script.bt:1:13
          |
        1 | BEGIN { @ = hist(1); @ = count(); @l = lhist(1, 0, 10, 1); @l = lhist(1, 0, 20, 1); }
          |             ^^^^^^^

        error: type mismatch for `@l`: assigning `lhist(_, 0, 20, 1)` to a map that holds `lhist(_, 0, 10, 1)`
         --> script.bt:1:65
          |
        1 | BEGIN { @ = hist(1); @ = count(); @l = lhist(1, 0, 10, 1); @l = lhist(1, 0, 20, 1); }
          |                                                                 ^^^^^^^^^^^^^^^^^^
        note: the map's type was set here
         --> script.bt:1:40
          |
        1 | BEGIN { @ = hist(1); @ = count(); @l = lhist(1, 0, 10, 1); @l = lhist(1, 0, 20, 1); }
          |                                        ^^^^^^^^^^^^^^^^^^

    "#]],
    );
}

#[test]
fn printf_argument_checks() {
    check(
        "BEGIN { printf(\"%d %d\\n\", 1); printf(\"%d\\n\", 1, 2); printf(\"%s\\n\", 1); printf(\"%d\\n\", comm); printf(\"%y\"); printf(pid); }",
        expect![[r#"
            error: printf(): not enough arguments for the format (1 given, 2 expected)
             --> script.bt:1:9
              |
            1 | BEGIN { printf("%d %d\n", 1); printf("%d\n", 1, 2); printf("%s\n", 1); printf("%d\n", comm); printf("%y"); printf(pid); }
              |         ^^^^^^^^^^^^^^^^^^^^

            error: printf(): too many arguments for the format (2 given, 1 expected)
             --> script.bt:1:31
              |
            1 | BEGIN { printf("%d %d\n", 1); printf("%d\n", 1, 2); printf("%s\n", 1); printf("%d\n", comm); printf("%y"); printf(pid); }
              |                               ^^^^^^^^^^^^^^^^^^^^

            error: printf(): `%s` expects a string, not `int64`
             --> script.bt:1:68
              |
            1 | BEGIN { printf("%d %d\n", 1); printf("%d\n", 1, 2); printf("%s\n", 1); printf("%d\n", comm); printf("%y"); printf(pid); }
              |                                                                    ^
            note: in this format
             --> script.bt:1:60
              |
            1 | BEGIN { printf("%d %d\n", 1); printf("%d\n", 1, 2); printf("%s\n", 1); printf("%d\n", comm); printf("%y"); printf(pid); }
              |                                                            ^^^^^^

            error: printf(): `%d` expects an integer, not `string[16]`
             --> script.bt:1:87
              |
            1 | BEGIN { printf("%d %d\n", 1); printf("%d\n", 1, 2); printf("%s\n", 1); printf("%d\n", comm); printf("%y"); printf(pid); }
              |                                                                                       ^^^^
            note: in this format
             --> script.bt:1:79
              |
            1 | BEGIN { printf("%d %d\n", 1); printf("%d\n", 1, 2); printf("%s\n", 1); printf("%d\n", comm); printf("%y"); printf(pid); }
              |                                                                               ^^^^^^

            error: printf(): the format must be a string literal
             --> script.bt:1:115
              |
            1 | BEGIN { printf("%d %d\n", 1); printf("%d\n", 1, 2); printf("%s\n", 1); printf("%d\n", comm); printf("%y"); printf(pid); }
              |                                                                                                                   ^^^

        "#]],
    );
}

#[test]
fn variables() {
    check(
        "BEGIN { $x = $y + 1; $s = 1; $s = \"a\"; if (1) { let $in = 1; $old = 2; } print($in); print($old); }",
        expect![[r#"
            error: variable `$y` is used before it is assigned
             --> script.bt:1:14
              |
            1 | BEGIN { $x = $y + 1; $s = 1; $s = "a"; if (1) { let $in = 1; $old = 2; } print($in); print($old); }
              |              ^^

            error: type mismatch for `$s`: assigning a value of type `string[2]` to a variable of type `int64`
             --> script.bt:1:35
              |
            1 | BEGIN { $x = $y + 1; $s = 1; $s = "a"; if (1) { let $in = 1; $old = 2; } print($in); print($old); }
              |                                   ^^^
            note: the variable's type was set here
             --> script.bt:1:22
              |
            1 | BEGIN { $x = $y + 1; $s = 1; $s = "a"; if (1) { let $in = 1; $old = 2; } print($in); print($old); }
              |                      ^^

            error: variable `$in` is used before it is assigned
             --> script.bt:1:80
              |
            1 | BEGIN { $x = $y + 1; $s = 1; $s = "a"; if (1) { let $in = 1; $old = 2; } print($in); print($old); }
              |                                                                                ^^^

        "#]],
    );
}

#[test]
fn context_builtins() {
    check(
        "BEGIN { print(arg0); print(retval); print(func); } uprobe:/bin/a:f { print(retval); } uretprobe:/bin/a:f { print(arg1); print(retval); }",
        expect![[r#"
            error: arg0 can only be used in uprobe, usdt and call probes (not in `BEGIN`)
             --> script.bt:1:15
              |
            1 | BEGIN { print(arg0); print(retval); print(func); } uprobe:/bin/a:f { print(retval); } uretprobe:/bin/a:f { print(arg1); print(retval); }
              |               ^^^^

            error: retval can only be used in uretprobe probes (not in `BEGIN`)
             --> script.bt:1:28
              |
            1 | BEGIN { print(arg0); print(retval); print(func); } uprobe:/bin/a:f { print(retval); } uretprobe:/bin/a:f { print(arg1); print(retval); }
              |                            ^^^^^^

            error: func can only be used in uprobe, uretprobe, call, set, get and watchpoint probes (not in `BEGIN`)
             --> script.bt:1:43
              |
            1 | BEGIN { print(arg0); print(retval); print(func); } uprobe:/bin/a:f { print(retval); } uretprobe:/bin/a:f { print(arg1); print(retval); }
              |                                           ^^^^

            error: retval can only be used in uretprobe probes (not in `uprobe:/bin/a:f`)
             --> script.bt:1:76
              |
            1 | BEGIN { print(arg0); print(retval); print(func); } uprobe:/bin/a:f { print(retval); } uretprobe:/bin/a:f { print(arg1); print(retval); }
              |                                                                            ^^^^^^

            error: arg1 can only be used in uprobe, usdt and call probes (not in `uretprobe:/bin/a:f`)
             --> script.bt:1:114
              |
            1 | BEGIN { print(arg0); print(retval); print(func); } uprobe:/bin/a:f { print(retval); } uretprobe:/bin/a:f { print(arg1); print(retval); }
              |                                                                                                                  ^^^^

        "#]],
    );
}

#[test]
fn unknown_identifiers() {
    check(
        "BEGIN { print(pdi); print(nope); $x = comm + 1; }",
        expect![[r#"
        error: unknown identifier `pdi`; did you mean `pid`?
         --> script.bt:1:15
          |
        1 | BEGIN { print(pdi); print(nope); $x = comm + 1; }
          |               ^^^

        error: unknown identifier `nope`
         --> script.bt:1:27
          |
        1 | BEGIN { print(pdi); print(nope); $x = comm + 1; }
          |                           ^^^^

        error: `+` needs integers, not `string[16]` and `int64`
         --> script.bt:1:39
          |
        1 | BEGIN { print(pdi); print(nope); $x = comm + 1; }
          |                                       ^^^^^^^^

    "#]],
    );
}

#[test]
fn builtin_arity_and_types() {
    check(
        "BEGIN { exit(1, 2); @a = count(1); @b = sum(); @c = sum(\"s\"); @d = hist(1, 9); $s = str(); count(); }",
        expect![[r#"
            error: exit() takes 0 to 1 arguments (2 given)
             --> script.bt:1:9
              |
            1 | BEGIN { exit(1, 2); @a = count(1); @b = sum(); @c = sum("s"); @d = hist(1, 9); $s = str(); count(); }
              |         ^^^^^^^^^^

            error: count() takes no arguments (1 given)
             --> script.bt:1:26
              |
            1 | BEGIN { exit(1, 2); @a = count(1); @b = sum(); @c = sum("s"); @d = hist(1, 9); $s = str(); count(); }
              |                          ^^^^^^^^

            error: sum() takes 1 argument (0 given)
             --> script.bt:1:41
              |
            1 | BEGIN { exit(1, 2); @a = count(1); @b = sum(); @c = sum("s"); @d = hist(1, 9); $s = str(); count(); }
              |                                         ^^^^^

            error: sum() needs an integer argument, not `string[2]`
             --> script.bt:1:57
              |
            1 | BEGIN { exit(1, 2); @a = count(1); @b = sum(); @c = sum("s"); @d = hist(1, 9); $s = str(); count(); }
              |                                                         ^^^

            error: hist(): the second argument must be an integer literal from 0 to 5
             --> script.bt:1:76
              |
            1 | BEGIN { exit(1, 2); @a = count(1); @b = sum(); @c = sum("s"); @d = hist(1, 9); $s = str(); count(); }
              |                                                                            ^

            error: str() takes 1 to 2 arguments (0 given)
             --> script.bt:1:85
              |
            1 | BEGIN { exit(1, 2); @a = count(1); @b = sum(); @c = sum("s"); @d = hist(1, 9); $s = str(); count(); }
              |                                                                                     ^^^^^

            error: count() must be assigned directly to a map
             --> script.bt:1:92
              |
            1 | BEGIN { exit(1, 2); @a = count(1); @b = sum(); @c = sum("s"); @d = hist(1, 9); $s = str(); count(); }
              |                                                                                            ^^^^^^^
              = help: write `@name[key] = count(...)`

        "#]],
    );
}

#[test]
fn unsupported_probes() {
    check(
        "kprobe:do_nanosleep { } kretprobe:f { } kfunc:f { } tracepoint:syscalls:sys_enter_open { } software:faults:1 { } hardware:cycles:1 { } watchpoint:0x1:8:w { } iter:task { } uprob:/bin/a:f { }",
        expect![[r#"
            error: kprobe: kernel function probes are not supported by weft; use tracepoint:CATEGORY:NAME (weft -l 'tracepoint:*' lists them), or uprobe/uretprobe on the user-space side of the call
             --> script.bt:1:1
              |
            1 | kprobe:do_nanosleep { } kretprobe:f { } kfunc:f { } tracepoint:syscalls:sys_enter_open { } software:faults:1 { } hardware:cycles:1 { } watchpoint:0x1:8:w { } iter:task { } uprob:/bin/a:f { }
              | ^^^^^^^^^^^^^^^^^^^

            error: kretprobe: kernel function probes are not supported by weft; use tracepoint:CATEGORY:NAME (weft -l 'tracepoint:*' lists them), or uprobe/uretprobe on the user-space side of the call
             --> script.bt:1:25
              |
            1 | kprobe:do_nanosleep { } kretprobe:f { } kfunc:f { } tracepoint:syscalls:sys_enter_open { } software:faults:1 { } hardware:cycles:1 { } watchpoint:0x1:8:w { } iter:task { } uprob:/bin/a:f { }
              |                         ^^^^^^^^^^^

            error: kfunc: kernel function (BTF) probes are not supported by weft; use tracepoint:CATEGORY:NAME (weft -l 'tracepoint:*' lists them), or uprobe/uretprobe on the user-space side of the call
             --> script.bt:1:41
              |
            1 | kprobe:do_nanosleep { } kretprobe:f { } kfunc:f { } tracepoint:syscalls:sys_enter_open { } software:faults:1 { } hardware:cycles:1 { } watchpoint:0x1:8:w { } iter:task { } uprob:/bin/a:f { }
              |                                         ^^^^^^^

            error: tracepoint:syscalls:sys_enter_open: kernel tracepoints are not available (weft was given no tracefs)
             --> script.bt:1:53
              |
            1 | kprobe:do_nanosleep { } kretprobe:f { } kfunc:f { } tracepoint:syscalls:sys_enter_open { } software:faults:1 { } hardware:cycles:1 { } watchpoint:0x1:8:w { } iter:task { } uprob:/bin/a:f { }
              |                                                     ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^

            error: software: perf software events are not available in weft; use profile: to sample threads
             --> script.bt:1:92
              |
            1 | kprobe:do_nanosleep { } kretprobe:f { } kfunc:f { } tracepoint:syscalls:sys_enter_open { } software:faults:1 { } hardware:cycles:1 { } watchpoint:0x1:8:w { } iter:task { } uprob:/bin/a:f { }
              |                                                                                            ^^^^^^^^^^^^^^^^^

            error: hardware: perf hardware events are not available in weft; use profile: to sample threads
             --> script.bt:1:114
              |
            1 | kprobe:do_nanosleep { } kretprobe:f { } kfunc:f { } tracepoint:syscalls:sys_enter_open { } software:faults:1 { } hardware:cycles:1 { } watchpoint:0x1:8:w { } iter:task { } uprob:/bin/a:f { }
              |                                                                                                                  ^^^^^^^^^^^^^^^^^

            error: invalid watchpoint `watchpoint:0x1:8:w`: the address must be aligned to the length
             --> script.bt:1:136
              |
            1 | kprobe:do_nanosleep { } kretprobe:f { } kfunc:f { } tracepoint:syscalls:sys_enter_open { } software:faults:1 { } hardware:cycles:1 { } watchpoint:0x1:8:w { } iter:task { } uprob:/bin/a:f { }
              |                                                                                                                                        ^^^^^^^^^^^^^^^^^^

            error: iter: BPF iterators over kernel objects are not available in weft
             --> script.bt:1:159
              |
            1 | kprobe:do_nanosleep { } kretprobe:f { } kfunc:f { } tracepoint:syscalls:sys_enter_open { } software:faults:1 { } hardware:cycles:1 { } watchpoint:0x1:8:w { } iter:task { } uprob:/bin/a:f { }
              |                                                                                                                                                               ^^^^^^^^^

            error: unknown probe type `uprob`; did you mean `uprobe`?
             --> script.bt:1:173
              |
            1 | kprobe:do_nanosleep { } kretprobe:f { } kfunc:f { } tracepoint:syscalls:sys_enter_open { } software:faults:1 { } hardware:cycles:1 { } watchpoint:0x1:8:w { } iter:task { } uprob:/bin/a:f { }
              |                                                                                                                                                                             ^^^^^^^^^^^^^^

        "#]],
    );
}

#[test]
fn unsupported_builtins_and_functions() {
    check(
        "BEGIN { print(kstack); print(curtask); print(cgroup); print(ksym(1)); print(kaddr(\"x\")); print(ntop(1)); print(macaddr(1)); override(1); }",
        expect![[r#"
            error: kstack: kernel stacks are not available in weft (user-space only); use ustack
             --> script.bt:1:15
              |
            1 | BEGIN { print(kstack); print(curtask); print(cgroup); print(ksym(1)); print(kaddr("x")); print(ntop(1)); print(macaddr(1)); override(1); }
              |               ^^^^^^

            error: curtask: the kernel task_struct is not available in weft
             --> script.bt:1:30
              |
            1 | BEGIN { print(kstack); print(curtask); print(cgroup); print(ksym(1)); print(kaddr("x")); print(ntop(1)); print(macaddr(1)); override(1); }
              |                              ^^^^^^^

            error: cgroup: cgroup ids are not available in weft
             --> script.bt:1:46
              |
            1 | BEGIN { print(kstack); print(curtask); print(cgroup); print(ksym(1)); print(kaddr("x")); print(ntop(1)); print(macaddr(1)); override(1); }
              |                                              ^^^^^^

            error: ksym: kernel symbols are not available in weft; use usym
             --> script.bt:1:61
              |
            1 | BEGIN { print(kstack); print(curtask); print(cgroup); print(ksym(1)); print(kaddr("x")); print(ntop(1)); print(macaddr(1)); override(1); }
              |                                                             ^^^^

            error: kaddr: kernel symbol addresses are not available in weft; use uaddr
             --> script.bt:1:77
              |
            1 | BEGIN { print(kstack); print(curtask); print(cgroup); print(ksym(1)); print(kaddr("x")); print(ntop(1)); print(macaddr(1)); override(1); }
              |                                                                             ^^^^^

            error: override() needs --unsafe
             --> script.bt:1:125
              |
            1 | BEGIN { print(kstack); print(curtask); print(cgroup); print(ksym(1)); print(kaddr("x")); print(ntop(1)); print(macaddr(1)); override(1); }
              |                                                                                                                             ^^^^^^^^
              = help: run weft with --unsafe to allow override()

            error: override() can only be used in uretprobe probes (not in `BEGIN`)
             --> script.bt:1:125
              |
            1 | BEGIN { print(kstack); print(curtask); print(cgroup); print(ksym(1)); print(kaddr("x")); print(ntop(1)); print(macaddr(1)); override(1); }
              |                                                                                                                             ^^^^^^^^^^^

        "#]],
    );
}

#[test]
fn reserved_aspect_syntax_is_not_supported_yet() {
    check(
        "before uprobe:/bin/a:f { } around uprobe:/bin/a:g { proceed(); } call:/bin/a:f { } get:/bin/a:v { } set:/bin/a:v { } kernel:x { } K:y { } seq { uprobe:/bin/a:f { } } uprobe:/bin/a:h /cflow(uprobe:/bin/a:main, uprobe:/bin/a:h)/ { }",
        expect![[r#"
            error: around advice changes what the program does: it needs --unsafe
             --> script.bt:1:28
              |
            1 | before uprobe:/bin/a:f { } around uprobe:/bin/a:g { proceed(); } call:/bin/a:f { } get:/bin/a:v { } set:/bin/a:v { } kernel:x { } K:y { } seq { uprobe:/bin/a:f { } } uprobe:/bin/a:h /cflow(uprobe:/bin/a:main, uprobe:/bin/a:h)/ { }
              |                            ^^^^^^
              = help: run weft with --unsafe to allow it

            error: invalid attach point `kernel:x`: the kernel provider has system calls: kernel:syscall:NAME (entry) and kernel:syscall:NAME:exit
             --> script.bt:1:118
              |
            1 | before uprobe:/bin/a:f { } around uprobe:/bin/a:g { proceed(); } call:/bin/a:f { } get:/bin/a:v { } set:/bin/a:v { } kernel:x { } K:y { } seq { uprobe:/bin/a:f { } } uprobe:/bin/a:h /cflow(uprobe:/bin/a:main, uprobe:/bin/a:h)/ { }
              |                                                                                                                      ^^^^^^^^

            error: invalid attach point `K:y`: the kernel provider has system calls: kernel:syscall:NAME (entry) and kernel:syscall:NAME:exit
             --> script.bt:1:131
              |
            1 | before uprobe:/bin/a:f { } around uprobe:/bin/a:g { proceed(); } call:/bin/a:f { } get:/bin/a:v { } set:/bin/a:v { } kernel:x { } K:y { } seq { uprobe:/bin/a:f { } } uprobe:/bin/a:h /cflow(uprobe:/bin/a:main, uprobe:/bin/a:h)/ { }
              |                                                                                                                                   ^^^

            error: `seq` blocks are not supported yet
             --> script.bt:1:139
              |
            1 | before uprobe:/bin/a:f { } around uprobe:/bin/a:g { proceed(); } call:/bin/a:f { } get:/bin/a:v { } set:/bin/a:v { } kernel:x { } K:y { } seq { uprobe:/bin/a:f { } } uprobe:/bin/a:h /cflow(uprobe:/bin/a:main, uprobe:/bin/a:h)/ { }
              |                                                                                                                                           ^^^^^^^^^^^^^^^^^^^^^^^^^^^

        "#]],
    );
}

#[test]
fn unsafe_functions_need_unsafe() {
    check(
        "uprobe:/bin/a:f { system(\"ls\"); signal(\"KILL\"); }",
        expect![[r#"
        error: system() needs --unsafe
         --> script.bt:1:19
          |
        1 | uprobe:/bin/a:f { system("ls"); signal("KILL"); }
          |                   ^^^^^^
          = help: run weft with --unsafe to allow system()

        error: signal() needs --unsafe
         --> script.bt:1:33
          |
        1 | uprobe:/bin/a:f { system("ls"); signal("KILL"); }
          |                                 ^^^^^^
          = help: run weft with --unsafe to allow signal()

    "#]],
    );
    let opts = Options {
        unsafe_ok: true,
        ..Default::default()
    };
    check_with(
        "uprobe:/bin/a:f { system(\"ls %d\", pid); signal(\"KILL\"); }",
        &opts,
        expect![[""]],
    );
}

#[test]
fn args_needs_dwarf() {
    check(
        "uprobe:/bin/a:parse { print(args.len); }",
        expect![[r#"
        error: args needs DWARF debug info for parse
         --> script.bt:1:29
          |
        1 | uprobe:/bin/a:parse { print(args.len); }
          |                             ^^^^

    "#]],
    );
}

#[test]
fn loops_and_control() {
    check(
        "BEGIN { break; unroll ($x) { } unroll (0) { } for ($kv : @nope) { } @s = 1; for ($kv : @s) { } while (\"s\") { continue; } }",
        expect![[r#"
            error: `break` outside of a loop
             --> script.bt:1:9
              |
            1 | BEGIN { break; unroll ($x) { } unroll (0) { } for ($kv : @nope) { } @s = 1; for ($kv : @s) { } while ("s") { continue; } }
              |         ^^^^^

            error: variable `$x` is used before it is assigned
             --> script.bt:1:24
              |
            1 | BEGIN { break; unroll ($x) { } unroll (0) { } for ($kv : @nope) { } @s = 1; for ($kv : @s) { } while ("s") { continue; } }
              |                        ^^

            error: unroll count must be an integer literal
             --> script.bt:1:24
              |
            1 | BEGIN { break; unroll ($x) { } unroll (0) { } for ($kv : @nope) { } @s = 1; for ($kv : @s) { } while ("s") { continue; } }
              |                        ^^

            error: unroll count must be between 1 and 100
             --> script.bt:1:40
              |
            1 | BEGIN { break; unroll ($x) { } unroll (0) { } for ($kv : @nope) { } @s = 1; for ($kv : @s) { } while ("s") { continue; } }
              |                                        ^

            error: undefined map `@nope`: it is never assigned
             --> script.bt:1:58
              |
            1 | BEGIN { break; unroll ($x) { } unroll (0) { } for ($kv : @nope) { } @s = 1; for ($kv : @s) { } while ("s") { continue; } }
              |                                                          ^^^^^

            error: cannot iterate over `@s`: it has no keys
             --> script.bt:1:88
              |
            1 | BEGIN { break; unroll ($x) { } unroll (0) { } for ($kv : @nope) { } @s = 1; for ($kv : @s) { } while ("s") { continue; } }
              |                                                                                        ^^

            error: a condition must be an integer or a boolean, not `string[2]`
             --> script.bt:1:103
              |
            1 | BEGIN { break; unroll ($x) { } unroll (0) { } for ($kv : @nope) { } @s = 1; for ($kv : @s) { } while ("s") { continue; } }
              |                                                                                                       ^^^

        "#]],
    );
}

#[test]
fn undefined_map_suggests() {
    check(
        "BEGIN { @count = 1; print(@cuont); }",
        expect![[r#"
        error: undefined map `@cuont`: it is never assigned; did you mean `@count`?
         --> script.bt:1:27
          |
        1 | BEGIN { @count = 1; print(@cuont); }
          |                           ^^^^^^

    "#]],
    );
}

#[test]
fn aggregation_reads() {
    check(
        "BEGIN { @c = count(); @h = hist(1); $x = @c + 1; $y = @h; }",
        expect![[r#"
        error: the value of `@h` (`hist()` aggregation) cannot be read; print it with print()
         --> script.bt:1:55
          |
        1 | BEGIN { @c = count(); @h = hist(1); $x = @c + 1; $y = @h; }
          |                                                       ^^

    "#]],
    );
}

#[test]
fn config_errors() {
    check(
        "config = { max_map_key = 5; stack_mode = fancy; max_strlen = \"x\" }\nBEGIN { }",
        expect![[r#"
        error: unknown config variable `max_map_key`; did you mean `max_map_keys`?
         --> script.bt:1:12
          |
        1 | config = { max_map_key = 5; stack_mode = fancy; max_strlen = "x" }
          |            ^^^^^^^^^^^^^^^

        error: stack_mode must be bpftrace, perf or raw
         --> script.bt:1:29
          |
        1 | config = { max_map_key = 5; stack_mode = fancy; max_strlen = "x" }
          |                             ^^^^^^^^^^^^^^^^^^

        error: config `max_strlen` needs an integer value
         --> script.bt:1:49
          |
        1 | config = { max_map_key = 5; stack_mode = fancy; max_strlen = "x" }
          |                                                 ^^^^^^^^^^^^^^^^

    "#]],
    );
}

#[test]
fn attach_point_errors() {
    check(
        "uprobe:/bin/a: { } interval:x:1 { } interval:s:0 { } uretprobe:/bin/a:f+4 { } BEGIN:x { }",
        expect![[r#"
        error: invalid attach point `uprobe:/bin/a:`: missing function name
         --> script.bt:1:1
          |
        1 | uprobe:/bin/a: { } interval:x:1 { } interval:s:0 { } uretprobe:/bin/a:f+4 { } BEGIN:x { }
          | ^^^^^^^^^^^^^^

        error: invalid interval `interval:x:1`: expected interval:UNIT:N with UNIT s, ms, us, ns or hz
         --> script.bt:1:20
          |
        1 | uprobe:/bin/a: { } interval:x:1 { } interval:s:0 { } uretprobe:/bin/a:f+4 { } BEGIN:x { }
          |                    ^^^^^^^^^^^^

        error: invalid interval `interval:s:0`: the count must be positive
         --> script.bt:1:37
          |
        1 | uprobe:/bin/a: { } interval:x:1 { } interval:s:0 { } uretprobe:/bin/a:f+4 { } BEGIN:x { }
          |                                     ^^^^^^^^^^^^

        error: uretprobe `uretprobe:/bin/a:f+4` cannot have an offset
         --> script.bt:1:54
          |
        1 | uprobe:/bin/a: { } interval:x:1 { } interval:s:0 { } uretprobe:/bin/a:f+4 { } BEGIN:x { }
          |                                                      ^^^^^^^^^^^^^^^^^^^^

        error: invalid attach point `BEGIN:x`: wrong number of `:`-separated fields for BEGIN
         --> script.bt:1:79
          |
        1 | uprobe:/bin/a: { } interval:x:1 { } interval:s:0 { } uretprobe:/bin/a:f+4 { } BEGIN:x { }
          |                                                                               ^^^^^^^

    "#]],
    );
}

#[test]
fn stage_stops_after_parse_errors() {
    // The checker would report `nope`, but it does not run after a parse error.
    check(
        "BEGIN { $x = ; print(nope); }",
        expect![[r#"
        error: expected an expression, found `;`
         --> script.bt:1:14
          |
        1 | BEGIN { $x = ; print(nope); }
          |              ^

    "#]],
    );
}

#[test]
fn warnings_do_not_stop_compilation() {
    let out = compile("BEGIN { printf(\"hi\\n\"); }", "s.bt", &Options::default());
    assert!(out.program.is_some());
    assert!(out.diagnostics.is_empty());
}

#[test]
fn multibyte_and_tabs_render_aligned() {
    check(
        "BEGIN {\n\t$é = 1; print(nöpe);\n}",
        expect![[r#"
        error: expected a variable name after `$`
         --> script.bt:2:2
          |
        2 | 	$é = 1; print(nöpe);
          | 	^

        error: invalid character `é`
         --> script.bt:2:3
          |
        2 | 	$é = 1; print(nöpe);
          | 	 ^

        error: expected an expression, found `=`
         --> script.bt:2:5
          |
        2 | 	$é = 1; print(nöpe);
          | 	   ^

        error: invalid character `ö`
         --> script.bt:2:17
          |
        2 | 	$é = 1; print(nöpe);
          | 	               ^

        error: expected `)`, found `pe`
         --> script.bt:2:18
          |
        2 | 	$é = 1; print(nöpe);
          | 	                ^^

    "#]],
    );
}

#[test]
fn frame_size_limit() {
    let opts = Options {
        config: weft_ir::Config {
            max_frame: 64,
            ..Default::default()
        },
        ..Default::default()
    };
    check_with(
        "uprobe:/bin/a:f { printf(\"%s %s\\n\", str(arg0), str(arg1)); }",
        &opts,
        expect![[r#"
        error: this probe needs 256 bytes of stack frame; the limit is 64
         --> script.bt:1:1
          |
        1 | uprobe:/bin/a:f { printf("%s %s\n", str(arg0), str(arg1)); }
          | ^^^^^^^^^^^^^^^
          = help: use smaller strings (config max_strlen, str(p, n)) or fewer large values

    "#]],
    );
}

#[test]
fn printf_counts_conversions_as_bpftrace() {
    check(
        r#"BEGIN { printf("%d %i %#x\n", 1, 2, 3); }"#,
        expect![[r#"
            error: printf(): too many arguments for the format (3 given, 1 expected)
             --> script.bt:1:9
              |
            1 | BEGIN { printf("%d %i %#x\n", 1, 2, 3); }
              |         ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
              = help: `%i`, `%#x` are not conversions (as in bpftrace, only `%[-][width][.precision]` with d u x X o c s p r and the length modifiers hh h l ll j z t are conversions)

        "#]],
    );
}

#[test]
fn printf_widths_and_precisions_are_bounded() {
    check(
        r#"BEGIN { printf("%d %-9223372036854775808s\n", 1, "x"); printf("%.65537d %65536d\n", 1, 2); }
BEGIN { printf("%+99999999999d %d\n", 1); cat("%99999999999d", 1); printf("%.65536s\n", "x"); }
BEGIN { printf("%40000d %40000d\n", 1, 2); }"#,
        expect![[r#"
            error: printf(): the width in `%-9223372036854775808s` is too large (at most 65536)
             --> script.bt:1:16
              |
            1 | BEGIN { printf("%d %-9223372036854775808s\n", 1, "x"); printf("%.65537d %65536d\n", 1, 2); }
              |                ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^

            error: printf(): the precision in `%.65537d` is too large (at most 65536)
             --> script.bt:1:63
              |
            1 | BEGIN { printf("%d %-9223372036854775808s\n", 1, "x"); printf("%.65537d %65536d\n", 1, 2); }
              |                                                               ^^^^^^^^^^^^^^^^^^^^

            error: printf(): the width in `%+99999999999d` is too large (at most 65536)
             --> script.bt:2:16
              |
            2 | BEGIN { printf("%+99999999999d %d\n", 1); cat("%99999999999d", 1); printf("%.65536s\n", "x"); }
              |                ^^^^^^^^^^^^^^^^^^^^^

            error: cat(): the width in `%99999999999d` is too large (at most 65536)
             --> script.bt:2:47
              |
            2 | BEGIN { printf("%+99999999999d %d\n", 1); cat("%99999999999d", 1); printf("%.65536s\n", "x"); }
              |                                               ^^^^^^^^^^^^^^^

            error: printf(): the widths and precisions of this format add up to 80000 (at most 65536)
             --> script.bt:3:16
              |
            3 | BEGIN { printf("%40000d %40000d\n", 1, 2); }
              |                ^^^^^^^^^^^^^^^^^^^

        "#]],
    );
}

#[test]
fn array_lengths_and_struct_sizes_are_bounded() {
    check(
        "struct X { int8 a[4294967295]; }
struct A { int8 a[40000]; int8 b[40000]; }
struct Z { char z[0]; }
struct Y { struct Z y[30000]; }
struct W { struct Y w[2]; }
BEGIN { $x = (int8[99999999999])0; let $y: int64[70000]; @s = sizeof(uint8[65536]); exit(); }",
        expect![[r#"
            error: `int8[4294967295]` has too many elements, nested ones counted (at most 65536)
             --> script.bt:1:12
              |
            1 | struct X { int8 a[4294967295]; }
              |            ^^^^^^^^^^^^^^^^^^

            error: struct `A` has too many fields and elements, nested ones counted (at most 65536)
             --> script.bt:2:32
              |
            2 | struct A { int8 a[40000]; int8 b[40000]; }
              |                                ^

            error: `struct Y[2]` has too many elements, nested ones counted (at most 65536)
             --> script.bt:5:12
              |
            5 | struct W { struct Y w[2]; }
              |            ^^^^^^^^^^^^^

            error: `int8[99999999999]` has too many elements, nested ones counted (at most 65536)
             --> script.bt:6:15
              |
            6 | BEGIN { $x = (int8[99999999999])0; let $y: int64[70000]; @s = sizeof(uint8[65536]); exit(); }
              |               ^^^^^^^^^^^^^^^^^

            error: `int64[70000]` has too many elements, nested ones counted (at most 65536)
             --> script.bt:6:44
              |
            6 | BEGIN { $x = (int8[99999999999])0; let $y: int64[70000]; @s = sizeof(uint8[65536]); exit(); }
              |                                            ^^^^^^^^^^^^

        "#]],
    );
}

#[test]
fn type_sizes_do_not_wrap() {
    check(
        "config = { max_strlen = 65536 }
struct S { string s[65536]; }
BEGIN { exit(); }",
        expect![[r#"
            error: `string[65536]` is too large: 4294967296 bytes (at most 4294967295)
             --> script.bt:2:12
              |
            2 | struct S { string s[65536]; }
              |            ^^^^^^^^^^^^^^^

        "#]],
    );
}

#[test]
fn tuple_index_does_not_wrap() {
    check(
        "BEGIN { $t = (1, 2); printf(\"%d\\n\", $t.4294967296); exit(); }",
        expect![[r#"
            error: tuple index 4294967296 is out of range for `(int64,int64)`
             --> script.bt:1:37
              |
            1 | BEGIN { $t = (1, 2); printf("%d\n", $t.4294967296); exit(); }
              |                                     ^^^^^^^^^^^^^

        "#]],
    );
}

#[test]
fn frame_size_does_not_wrap() {
    let strs = vec!["str(0)"; 65536].join(",\n");
    let out = compile(
        &format!("config = {{ max_strlen = 65536 }}\nBEGIN {{\n@t = ({strs}); exit(); }}"),
        "script.bt",
        &Options::default(),
    );
    let msgs: Vec<&str> = out.diagnostics.iter().map(|d| d.message.as_str()).collect();
    assert_eq!(
        msgs,
        ["this probe needs more than 4294967295 bytes of stack frame; the limit is 4096"]
    );
}

#[test]
fn print_top_and_div_are_bounded() {
    check(
        "BEGIN { @m[1] = count(); print(@m, 4294967297, 1); print(@m, 1, 4294967296); print(@m, 4294967295, 4294967295); }",
        expect![[r#"
            error: print(): top and div must be integer literals from 0 to 4294967295
             --> script.bt:1:36
              |
            1 | BEGIN { @m[1] = count(); print(@m, 4294967297, 1); print(@m, 1, 4294967296); print(@m, 4294967295, 4294967295); }
              |                                    ^^^^^^^^^^

            error: print(): top and div must be integer literals from 0 to 4294967295
             --> script.bt:1:65
              |
            1 | BEGIN { @m[1] = count(); print(@m, 4294967297, 1); print(@m, 1, 4294967296); print(@m, 4294967295, 4294967295); }
              |                                                                 ^^^^^^^^^^

        "#]],
    );
}

#[test]
fn buf_length_does_not_wrap() {
    check(
        "uprobe:/bin/a:f { printf(\"%d\\n\", buf(arg0, 4294967297)); }",
        expect![[r#"
            warning: buf() length is too long and will be shortened to 64 bytes (see config max_strlen)
             --> script.bt:1:34
              |
            1 | uprobe:/bin/a:f { printf("%d\n", buf(arg0, 4294967297)); }
              |                                  ^^^^^^^^^^^^^^^^^^^^^

            error: printf(): `%d` expects an integer, not `buffer[64]`
             --> script.bt:1:34
              |
            1 | uprobe:/bin/a:f { printf("%d\n", buf(arg0, 4294967297)); }
              |                                  ^^^^^^^^^^^^^^^^^^^^^
            note: in this format
             --> script.bt:1:26
              |
            1 | uprobe:/bin/a:f { printf("%d\n", buf(arg0, 4294967297)); }
              |                          ^^^^^^

        "#]],
    );
}

#[test]
fn config_sizes_are_bounded() {
    check(
        "config = { max_map_keys = 4294967295; max_frame = 4294967295 }\nconfig = { max_map_keys = 1048577; max_frame = 1048577 }\nconfig = { max_map_keys = 1048576; max_frame = 1048576 }\nconfig = { max_cat_bytes = 1048577 }\nBEGIN { exit(); }",
        expect![[r#"
            error: max_map_keys must be between 1 and 1048576
             --> script.bt:1:12
              |
            1 | config = { max_map_keys = 4294967295; max_frame = 4294967295 }
              |            ^^^^^^^^^^^^^^^^^^^^^^^^^

            error: max_frame must be between 1 and 1048576
             --> script.bt:1:39
              |
            1 | config = { max_map_keys = 4294967295; max_frame = 4294967295 }
              |                                       ^^^^^^^^^^^^^^^^^^^^^^

            error: max_map_keys must be between 1 and 1048576
             --> script.bt:2:12
              |
            2 | config = { max_map_keys = 1048577; max_frame = 1048577 }
              |            ^^^^^^^^^^^^^^^^^^^^^^

            error: max_frame must be between 1 and 1048576
             --> script.bt:2:36
              |
            2 | config = { max_map_keys = 1048577; max_frame = 1048577 }
              |                                    ^^^^^^^^^^^^^^^^^^^

            error: max_cat_bytes must be between 1 and 1048576
             --> script.bt:4:12
              |
            4 | config = { max_cat_bytes = 1048577 }
              |            ^^^^^^^^^^^^^^^^^^^^^^^

        "#]],
    );
}

#[test]
fn profile_rate_is_bounded() {
    check(
        "profile:hz:10001 { } profile:us:10 { } profile:hz:10000 { } profile:s:1 { }",
        expect![[r#"
            error: invalid profile `profile:hz:10001`: at most 10000 samples a second (this is 10001)
             --> script.bt:1:1
              |
            1 | profile:hz:10001 { } profile:us:10 { } profile:hz:10000 { } profile:s:1 { }
              | ^^^^^^^^^^^^^^^^

            error: invalid profile `profile:us:10`: at most 10000 samples a second (this is 100000)
             --> script.bt:1:22
              |
            1 | profile:hz:10001 { } profile:us:10 { } profile:hz:10000 { } profile:s:1 { }
              |                      ^^^^^^^^^^^^^

        "#]],
    );
}

#[test]
fn unsigned_compared_with_sign_warns() {
    check(
        "uretprobe:/bin/a:f /retval < 0/ { } uprobe:/bin/a:g /-1 >= arg0/ { } uretprobe:/bin/a:h /retval == -1 || (int32)retval < 0 || retval > 0/ { }",
        expect![[r#"
            warning: this is unsigned (`uint64`), so comparing it with 0 does not test its sign (the comparison is unsigned); cast it to test the sign, e.g. `(int32)retval < 0` for a function returning `int`
             --> script.bt:1:21
              |
            1 | uretprobe:/bin/a:f /retval < 0/ { } uprobe:/bin/a:g /-1 >= arg0/ { } uretprobe:/bin/a:h /retval == -1 || (int32)retval < 0 || retval > 0/ { }
              |                     ^^^^^^

            warning: this is unsigned (`uint64`), so comparing it with a negative constant does not test its sign (the comparison is unsigned); cast it to test the sign, e.g. `(int32)retval < 0` for a function returning `int`
             --> script.bt:1:60
              |
            1 | uretprobe:/bin/a:f /retval < 0/ { } uprobe:/bin/a:g /-1 >= arg0/ { } uretprobe:/bin/a:h /retval == -1 || (int32)retval < 0 || retval > 0/ { }
              |                                                            ^^^^

        "#]],
    );
}

#[test]
fn string_index_out_of_bounds() {
    check(
        "BEGIN { $s = \"abc\"; printf(\"%d\\n\", $s[4]); }",
        expect![[r#"
            error: the index 4 is out of bounds for `string[4]` (indexes 0 to 3)
             --> script.bt:1:39
              |
            1 | BEGIN { $s = "abc"; printf("%d\n", $s[4]); }
              |                                       ^

        "#]],
    );
}

#[test]
fn string_index_needs_an_integer() {
    check(
        "BEGIN { $s = \"abc\"; print($s[\"x\"]); }",
        expect![[r#"
            error: an index must be an integer, not `string[2]`
             --> script.bt:1:30
              |
            1 | BEGIN { $s = "abc"; print($s["x"]); }
              |                              ^^^

        "#]],
    );
}

#[test]
fn enumerator_defined_twice() {
    check(
        "enum A { X, Y }\nenum B { Y = 3 }\nBEGIN { print(Y); }",
        expect![[r#"
            error: the enumerator `Y` is defined twice
             --> script.bt:2:10
              |
            2 | enum B { Y = 3 }
              |          ^^^^^

        "#]],
    );
}

#[test]
fn enumerator_value_must_be_an_integer() {
    check(
        "enum A { X = \"a\" } BEGIN { print(X); }",
        expect![[r#"
        error: expected an integer value for `X`, found string literal
         --> script.bt:1:14
          |
        1 | enum A { X = "a" } BEGIN { print(X); }
          |              ^^^

    "#]],
    );
}

#[test]
fn enumerator_past_int64() {
    check(
        "enum A { X = 9223372036854775807, Y } BEGIN { print(Y); }",
        expect![[r#"
            error: the value of `Y` does not fit in an int64
             --> script.bt:1:35
              |
            1 | enum A { X = 9223372036854775807, Y } BEGIN { print(Y); }
              |                                   ^

            error: unknown identifier `Y`
             --> script.bt:1:53
              |
            1 | enum A { X = 9223372036854775807, Y } BEGIN { print(Y); }
              |                                                     ^

        "#]],
    );
}

#[test]
fn bool_cast_of_a_tuple() {
    check(
        "BEGIN { print((bool)(1, 2)); }",
        expect![[r#"
        error: cannot cast `(int64,int64)` to `bool`
         --> script.bt:1:15
          |
        1 | BEGIN { print((bool)(1, 2)); }
          |               ^^^^^^^^^^^^

    "#]],
    );
}

#[test]
fn builtin_alias_of_unknown_builtin() {
    check(
        "BEGIN { print(__builtin_nope); }",
        expect![[r#"
        error: unknown identifier `__builtin_nope`
         --> script.bt:1:15
          |
        1 | BEGIN { print(__builtin_nope); }
          |               ^^^^^^^^^^^^^^

    "#]],
    );
}

#[test]
fn offsetof_path_through_a_scalar() {
    check(
        "struct In { int d; } struct Out { int a; struct In i; }\nBEGIN { print(offsetof(struct Out, i.d.x)); }",
        expect![[r#"
            error: `i.d` is `int32`, not a struct: it has no field `x`
             --> script.bt:2:15
              |
            2 | BEGIN { print(offsetof(struct Out, i.d.x)); }
              |               ^^^^^^^^^^^^^^^^^^^^^^^^^^^

        "#]],
    );
}

#[test]
fn offsetof_path_ends_in_a_dot() {
    check(
        "struct Out { int a; }\nBEGIN { print(offsetof(struct Out, a.)); }",
        expect![[r#"
            error: expected a field name, found `)`
             --> script.bt:2:38
              |
            2 | BEGIN { print(offsetof(struct Out, a.)); }
              |                                      ^

        "#]],
    );
}

#[test]
fn typeof_of_an_expression_without_a_value() {
    check(
        "BEGIN { $p = (typeof(printf(\"x\")))1; let $q: typeof($nope); }",
        expect![[r#"
            error: typeof() needs an expression with a value
             --> script.bt:1:22
              |
            1 | BEGIN { $p = (typeof(printf("x")))1; let $q: typeof($nope); }
              |                      ^^^^^^^^^^^

            error: variable `$nope` is used before it is assigned
             --> script.bt:1:53
              |
            1 | BEGIN { $p = (typeof(printf("x")))1; let $q: typeof($nope); }
              |                                                     ^^^^^

        "#]],
    );
}

#[test]
fn pton_invalid_addresses() {
    check(
        r#"BEGIN { $a = pton("1.2.3"); $b = pton("1.2.3.04"); $c = pton("256.1.1.1"); $d = pton("fe80::1::2"); $e = pton("abc"); $f = pton("::ffff:1.2.3.4"); $g = pton(""); }"#,
        expect![[r#"
            error: pton() expects a valid IPv4/IPv6 address, got 1.2.3
             --> script.bt:1:19
              |
            1 | BEGIN { $a = pton("1.2.3"); $b = pton("1.2.3.04"); $c = pton("256.1.1.1"); $d = pton("fe80::1::2"); $e = pton("abc"); $f = pton("::ffff:1.2.3.4"); $g = pton(""); }
              |                   ^^^^^^^

            error: pton() expects a valid IPv4/IPv6 address, got 1.2.3.04
             --> script.bt:1:39
              |
            1 | BEGIN { $a = pton("1.2.3"); $b = pton("1.2.3.04"); $c = pton("256.1.1.1"); $d = pton("fe80::1::2"); $e = pton("abc"); $f = pton("::ffff:1.2.3.4"); $g = pton(""); }
              |                                       ^^^^^^^^^^

            error: pton() expects a valid IPv4/IPv6 address, got 256.1.1.1
             --> script.bt:1:62
              |
            1 | BEGIN { $a = pton("1.2.3"); $b = pton("1.2.3.04"); $c = pton("256.1.1.1"); $d = pton("fe80::1::2"); $e = pton("abc"); $f = pton("::ffff:1.2.3.4"); $g = pton(""); }
              |                                                              ^^^^^^^^^^^

            error: pton() expects a valid IPv4/IPv6 address, got fe80::1::2
             --> script.bt:1:86
              |
            1 | BEGIN { $a = pton("1.2.3"); $b = pton("1.2.3.04"); $c = pton("256.1.1.1"); $d = pton("fe80::1::2"); $e = pton("abc"); $f = pton("::ffff:1.2.3.4"); $g = pton(""); }
              |                                                                                      ^^^^^^^^^^^^

            error: pton() expects a string argument of an IPv4/IPv6 address, got abc
             --> script.bt:1:111
              |
            1 | BEGIN { $a = pton("1.2.3"); $b = pton("1.2.3.04"); $c = pton("256.1.1.1"); $d = pton("fe80::1::2"); $e = pton("abc"); $f = pton("::ffff:1.2.3.4"); $g = pton(""); }
              |                                                                                                               ^^^^^

            error: pton() expects a valid IPv4/IPv6 address, got ::ffff:1.2.3.4
             --> script.bt:1:129
              |
            1 | BEGIN { $a = pton("1.2.3"); $b = pton("1.2.3.04"); $c = pton("256.1.1.1"); $d = pton("fe80::1::2"); $e = pton("abc"); $f = pton("::ffff:1.2.3.4"); $g = pton(""); }
              |                                                                                                                                 ^^^^^^^^^^^^^^^^

            error: pton() expects a string argument of an IPv4/IPv6 address, got 
             --> script.bt:1:158
              |
            1 | BEGIN { $a = pton("1.2.3"); $b = pton("1.2.3.04"); $c = pton("256.1.1.1"); $d = pton("fe80::1::2"); $e = pton("abc"); $f = pton("::ffff:1.2.3.4"); $g = pton(""); }
              |                                                                                                                                                              ^^

        "#]],
    );
}

#[test]
fn pton_needs_a_literal() {
    check(
        r#"BEGIN { $s = "1.2.3.4"; $a = pton($s); $b = pton(1); }"#,
        expect![[r#"
            error: pton() expects a string literal, got `string[8]`
             --> script.bt:1:35
              |
            1 | BEGIN { $s = "1.2.3.4"; $a = pton($s); $b = pton(1); }
              |                                   ^^

            error: pton() expects a string literal, got `int64`
             --> script.bt:1:50
              |
            1 | BEGIN { $s = "1.2.3.4"; $a = pton($s); $b = pton(1); }
              |                                                  ^

        "#]],
    );
}

#[test]
fn ntop_and_macaddr_sizes() {
    check(
        r#"struct S { uint8_t m[5]; uint32_t w[4]; } BEGIN { $p = (struct S *)0; $a = ntop("abcdefgh"); $b = ntop($p->m); $c = ntop($p->w); $d = macaddr(pton("1.2.3.4")); $e = macaddr($p->m); $f = macaddr("abcde"); $g = ntop(ntop(1)); $h = ntop("ab", 1); $i = macaddr(ntop(1)); }"#,
        expect![[r#"
            error: ntop() argument must be 4 or 16 bytes in size, not `string[9]`
             --> script.bt:1:81
              |
            1 | struct S { uint8_t m[5]; uint32_t w[4]; } BEGIN { $p = (struct S *)0; $a = ntop("abcdefgh"); $b = ntop($p->m); $c = ntop($p->w); $d = macaddr(pton("1.2.3.4")); $e = macaddr($p->m); $f = macaddr("abcde"); $g = ntop(ntop(1)); $h = ntop("ab", 1); $i = macaddr(ntop(1)); }
              |                                                                                 ^^^^^^^^^^

            error: ntop() argument must be 4 or 16 bytes in size, not `uint8[5]`
             --> script.bt:1:104
              |
            1 | struct S { uint8_t m[5]; uint32_t w[4]; } BEGIN { $p = (struct S *)0; $a = ntop("abcdefgh"); $b = ntop($p->m); $c = ntop($p->w); $d = macaddr(pton("1.2.3.4")); $e = macaddr($p->m); $f = macaddr("abcde"); $g = ntop(ntop(1)); $h = ntop("ab", 1); $i = macaddr(ntop(1)); }
              |                                                                                                        ^^^^^

            error: macaddr() argument must be 6 bytes in size, not `uint8[4]`
             --> script.bt:1:143
              |
            1 | struct S { uint8_t m[5]; uint32_t w[4]; } BEGIN { $p = (struct S *)0; $a = ntop("abcdefgh"); $b = ntop($p->m); $c = ntop($p->w); $d = macaddr(pton("1.2.3.4")); $e = macaddr($p->m); $f = macaddr("abcde"); $g = ntop(ntop(1)); $h = ntop("ab", 1); $i = macaddr(ntop(1)); }
              |                                                                                                                                               ^^^^^^^^^^^^^^^

            error: macaddr() argument must be 6 bytes in size, not `uint8[5]`
             --> script.bt:1:174
              |
            1 | struct S { uint8_t m[5]; uint32_t w[4]; } BEGIN { $p = (struct S *)0; $a = ntop("abcdefgh"); $b = ntop($p->m); $c = ntop($p->w); $d = macaddr(pton("1.2.3.4")); $e = macaddr($p->m); $f = macaddr("abcde"); $g = ntop(ntop(1)); $h = ntop("ab", 1); $i = macaddr(ntop(1)); }
              |                                                                                                                                                                              ^^^^^

            error: ntop() expects an integer or array argument, got `inet`
             --> script.bt:1:215
              |
            1 | struct S { uint8_t m[5]; uint32_t w[4]; } BEGIN { $p = (struct S *)0; $a = ntop("abcdefgh"); $b = ntop($p->m); $c = ntop($p->w); $d = macaddr(pton("1.2.3.4")); $e = macaddr($p->m); $f = macaddr("abcde"); $g = ntop(ntop(1)); $h = ntop("ab", 1); $i = macaddr(ntop(1)); }
              |                                                                                                                                                                                                                       ^^^^^^^

            error: ntop(): argument 1 must be an integer, not `string[3]`
             --> script.bt:1:235
              |
            1 | struct S { uint8_t m[5]; uint32_t w[4]; } BEGIN { $p = (struct S *)0; $a = ntop("abcdefgh"); $b = ntop($p->m); $c = ntop($p->w); $d = macaddr(pton("1.2.3.4")); $e = macaddr($p->m); $f = macaddr("abcde"); $g = ntop(ntop(1)); $h = ntop("ab", 1); $i = macaddr(ntop(1)); }
              |                                                                                                                                                                                                                                           ^^^^

            error: macaddr() only supports array or pointer arguments, not `inet`
             --> script.bt:1:258
              |
            1 | struct S { uint8_t m[5]; uint32_t w[4]; } BEGIN { $p = (struct S *)0; $a = ntop("abcdefgh"); $b = ntop($p->m); $c = ntop($p->w); $d = macaddr(pton("1.2.3.4")); $e = macaddr($p->m); $f = macaddr("abcde"); $g = ntop(ntop(1)); $h = ntop("ab", 1); $i = macaddr(ntop(1)); }
              |                                                                                                                                                                                                                                                                  ^^^^^^^

        "#]],
    );
}

#[test]
fn buf_lengths_and_formats() {
    check(
        r#"BEGIN { $a = buf(1); $b = buf(1, -1); $c = buf(ntop(1), 4); $d = buf("abc"); $e = buf(pton("::1")); $f = buf(1, 65); printf("%s %r\n", buf("a", 1), "a"); }"#,
        expect![[r#"
            error: buf() expects a length argument for a non-array type (`int64`)
             --> script.bt:1:14
              |
            1 | BEGIN { $a = buf(1); $b = buf(1, -1); $c = buf(ntop(1), 4); $d = buf("abc"); $e = buf(pton("::1")); $f = buf(1, 65); printf("%s %r\n", buf("a", 1), "a"); }
              |              ^^^^^^

            error: buf() cannot use a negative length (-1)
             --> script.bt:1:34
              |
            1 | BEGIN { $a = buf(1); $b = buf(1, -1); $c = buf(ntop(1), 4); $d = buf("abc"); $e = buf(pton("::1")); $f = buf(1, 65); printf("%s %r\n", buf("a", 1), "a"); }
              |                                  ^^

            error: buf() expects an integer, string, or array argument, not `inet`
             --> script.bt:1:48
              |
            1 | BEGIN { $a = buf(1); $b = buf(1, -1); $c = buf(ntop(1), 4); $d = buf("abc"); $e = buf(pton("::1")); $f = buf(1, 65); printf("%s %r\n", buf("a", 1), "a"); }
              |                                                ^^^^^^^

            error: buf() expects a length argument for a non-array type (`string[4]`)
             --> script.bt:1:66
              |
            1 | BEGIN { $a = buf(1); $b = buf(1, -1); $c = buf(ntop(1), 4); $d = buf("abc"); $e = buf(pton("::1")); $f = buf(1, 65); printf("%s %r\n", buf("a", 1), "a"); }
              |                                                                  ^^^^^^^^^^

            warning: buf() length is too long and will be shortened to 64 bytes (see config max_strlen)
             --> script.bt:1:106
              |
            1 | BEGIN { $a = buf(1); $b = buf(1, -1); $c = buf(ntop(1), 4); $d = buf("abc"); $e = buf(pton("::1")); $f = buf(1, 65); printf("%s %r\n", buf("a", 1), "a"); }
              |                                                                                                          ^^^^^^^^^^

            error: printf(): `%s` expects a string, not `buffer[1]`
             --> script.bt:1:136
              |
            1 | BEGIN { $a = buf(1); $b = buf(1, -1); $c = buf(ntop(1), 4); $d = buf("abc"); $e = buf(pton("::1")); $f = buf(1, 65); printf("%s %r\n", buf("a", 1), "a"); }
              |                                                                                                                                        ^^^^^^^^^^^
            note: in this format
             --> script.bt:1:125
              |
            1 | BEGIN { $a = buf(1); $b = buf(1, -1); $c = buf(ntop(1), 4); $d = buf("abc"); $e = buf(pton("::1")); $f = buf(1, 65); printf("%s %r\n", buf("a", 1), "a"); }
              |                                                                                                                             ^^^^^^^^^

            error: printf(): `%r` expects a buffer, not `string[2]`
             --> script.bt:1:149
              |
            1 | BEGIN { $a = buf(1); $b = buf(1, -1); $c = buf(ntop(1), 4); $d = buf("abc"); $e = buf(pton("::1")); $f = buf(1, 65); printf("%s %r\n", buf("a", 1), "a"); }
              |                                                                                                                                                     ^^^
            note: in this format
             --> script.bt:1:125
              |
            1 | BEGIN { $a = buf(1); $b = buf(1, -1); $c = buf(ntop(1), 4); $d = buf("abc"); $e = buf(pton("::1")); $f = buf(1, 65); printf("%s %r\n", buf("a", 1), "a"); }
              |                                                                                                                             ^^^^^^^^^

        "#]],
    );
}

#[test]
fn getopt_literals_defaults_and_values() {
    let opts = Options {
        named: vec![
            ("i".into(), Some("x".into())),
            ("b".into(), Some("maybe".into())),
            ("s".into(), None),
        ],
        ..Options::default()
    };
    check_with(
        r#"BEGIN { $n = "a"; $a = getopt($n); $b = getopt("a", $n); $c = getopt("d", 1, 2); $d = getopt("e", 1); $e = getopt("e", 2); $f = getopt("i", 1); $g = getopt("b"); $h = getopt("s", "x"); }"#,
        &opts,
        expect![[r#"
            error: getopt(): the first argument must be a string literal (the parameter's name)
             --> script.bt:1:31
              |
            1 | BEGIN { $n = "a"; $a = getopt($n); $b = getopt("a", $n); $c = getopt("d", 1, 2); $d = getopt("e", 1); $e = getopt("e", 2); $f = getopt("i", 1); $g = getopt("b"); $h = getopt("s", "x"); }
              |                               ^^

            error: getopt(): the default value must be a string, integer or boolean literal
             --> script.bt:1:53
              |
            1 | BEGIN { $n = "a"; $a = getopt($n); $b = getopt("a", $n); $c = getopt("d", 1, 2); $d = getopt("e", 1); $e = getopt("e", 2); $f = getopt("i", 1); $g = getopt("b"); $h = getopt("s", "x"); }
              |                                                     ^^

            error: getopt(): the description must be a string literal
             --> script.bt:1:78
              |
            1 | BEGIN { $n = "a"; $a = getopt($n); $b = getopt("a", $n); $c = getopt("d", 1, 2); $d = getopt("e", 1); $e = getopt("e", 2); $f = getopt("i", 1); $g = getopt("b"); $h = getopt("s", "x"); }
              |                                                                              ^

            error: getopt(): `e` needs the same default value everywhere; it was 1 before
             --> script.bt:1:108
              |
            1 | BEGIN { $n = "a"; $a = getopt($n); $b = getopt("a", $n); $c = getopt("d", 1, 2); $d = getopt("e", 1); $e = getopt("e", 2); $f = getopt("i", 1); $g = getopt("b"); $h = getopt("s", "x"); }
              |                                                                                                            ^^^^^^^^^^^^^^
            note: first given here
             --> script.bt:1:87
              |
            1 | BEGIN { $n = "a"; $a = getopt($n); $b = getopt("a", $n); $c = getopt("d", 1, 2); $d = getopt("e", 1); $e = getopt("e", 2); $f = getopt("i", 1); $g = getopt("b"); $h = getopt("s", "x"); }
              |                                                                                       ^^^^^^^^^^^^^^

            error: --i=x: `i` is an integer parameter
             --> script.bt:1:129
              |
            1 | BEGIN { $n = "a"; $a = getopt($n); $b = getopt("a", $n); $c = getopt("d", 1, 2); $d = getopt("e", 1); $e = getopt("e", 2); $f = getopt("i", 1); $g = getopt("b"); $h = getopt("s", "x"); }
              |                                                                                                                                 ^^^^^^^^^^^^^^

            error: --b=maybe: `b` is a boolean parameter (true, false, 1 or 0)
             --> script.bt:1:150
              |
            1 | BEGIN { $n = "a"; $a = getopt($n); $b = getopt("a", $n); $c = getopt("d", 1, 2); $d = getopt("e", 1); $e = getopt("e", 2); $f = getopt("i", 1); $g = getopt("b"); $h = getopt("s", "x"); }
              |                                                                                                                                                      ^^^^^^^^^^^

            error: --s needs a value (--s=VALUE): only boolean parameters go without one
             --> script.bt:1:168
              |
            1 | BEGIN { $n = "a"; $a = getopt($n); $b = getopt("a", $n); $c = getopt("d", 1, 2); $d = getopt("e", 1); $e = getopt("e", 2); $f = getopt("i", 1); $g = getopt("b"); $h = getopt("s", "x"); }
              |                                                                                                                                                                        ^^^^^^^^^^^^^^^^

        "#]],
    );
}

#[test]
fn reg_names_as_upstream() {
    check(
        r#"uprobe:/bin/a:f { $a = reg("rip"); $b = reg("eflags"); $c = reg(1); $d = reg("orig_rax") + reg("cs") + reg("ss") + reg("r15") + reg("flags"); }"#,
        expect![[r#"
            error: 'rip' is not a valid register on this architecture (x86_64); the registers are r15, r14, r13, r12, bp, bx, r11, r10, r9, r8, ax, cx, dx, si, di, orig_rax, orig_ax, ip, cs, flags, sp, ss
             --> script.bt:1:28
              |
            1 | uprobe:/bin/a:f { $a = reg("rip"); $b = reg("eflags"); $c = reg(1); $d = reg("orig_rax") + reg("cs") + reg("ss") + reg("r15") + reg("flags"); }
              |                            ^^^^^

            error: 'eflags' is not a valid register on this architecture (x86_64); the registers are r15, r14, r13, r12, bp, bx, r11, r10, r9, r8, ax, cx, dx, si, di, orig_rax, orig_ax, ip, cs, flags, sp, ss
             --> script.bt:1:45
              |
            1 | uprobe:/bin/a:f { $a = reg("rip"); $b = reg("eflags"); $c = reg(1); $d = reg("orig_rax") + reg("cs") + reg("ss") + reg("r15") + reg("flags"); }
              |                                             ^^^^^^^^

            error: reg(): the register name must be a string literal such as "sp"
             --> script.bt:1:65
              |
            1 | uprobe:/bin/a:f { $a = reg("rip"); $b = reg("eflags"); $c = reg(1); $d = reg("orig_rax") + reg("cs") + reg("ss") + reg("r15") + reg("flags"); }
              |                                                                 ^

        "#]],
    );
}

#[test]
fn tseries_arguments() {
    check(
        "BEGIN { @a = tseries(1, 0, 10); @b = tseries(1, 1s, 0); @c = tseries(1, 1s, 5, \"stats\");\n@d = tseries(1, $1 + 1, 5); @e = tseries(\"x\", 1s, 5); @f = tseries(1, 1s, 5); @f = tseries(1, 1s, 6, \"max\"); }",
        expect![[r#"
            error: tseries() interval_ns must be >= 1 (0 provided)
             --> script.bt:1:25
              |
            1 | BEGIN { @a = tseries(1, 0, 10); @b = tseries(1, 1s, 0); @c = tseries(1, 1s, 5, "stats");
              |                         ^

            error: tseries(): the number of intervals must be from 1 to 1000 (0 provided)
             --> script.bt:1:53
              |
            1 | BEGIN { @a = tseries(1, 0, 10); @b = tseries(1, 1s, 0); @c = tseries(1, 1s, 5, "stats");
              |                                                     ^

            error: tseries() expects one of the following aggregation functions: avg, max, min, sum ("stats" provided)
             --> script.bt:1:80
              |
            1 | BEGIN { @a = tseries(1, 0, 10); @b = tseries(1, 1s, 0); @c = tseries(1, 1s, 5, "stats");
              |                                                                                ^^^^^^^

            error: tseries(): the interval must be an integer literal (a duration such as 100ms)
             --> script.bt:2:17
              |
            2 | @d = tseries(1, $1 + 1, 5); @e = tseries("x", 1s, 5); @f = tseries(1, 1s, 5); @f = tseries(1, 1s, 6, "max"); }
              |                 ^^^^^^

            error: tseries() needs an integer argument, not `string[2]`
             --> script.bt:2:42
              |
            2 | @d = tseries(1, $1 + 1, 5); @e = tseries("x", 1s, 5); @f = tseries(1, 1s, 5); @f = tseries(1, 1s, 6, "max"); }
              |                                          ^^^

            error: type mismatch for `@f`: assigning `tseries(_, 1000000000, 6, "max")` to a map that holds `tseries(_, 1000000000, 5)`
             --> script.bt:2:84
              |
            2 | @d = tseries(1, $1 + 1, 5); @e = tseries("x", 1s, 5); @f = tseries(1, 1s, 5); @f = tseries(1, 1s, 6, "max"); }
              |                                                                                    ^^^^^^^^^^^^^^^^^^^^^^^^
            note: the map's type was set here
             --> script.bt:2:60
              |
            2 | @d = tseries(1, $1 + 1, 5); @e = tseries("x", 1s, 5); @f = tseries(1, 1s, 5); @f = tseries(1, 1s, 6, "max"); }
              |                                                            ^^^^^^^^^^^^^^^^^

        "#]],
    );
}

#[test]
fn void_call_as_argument() {
    check(
        "uprobe:/bin/sh:main { printf(\"%s\\n\", join(arg1)); print(join(arg1, \",\")); $x = join(arg1); join(arg1); }",
        expect![[r#"
            error: `join()` does not return a value
             --> script.bt:1:38
              |
            1 | uprobe:/bin/sh:main { printf("%s\n", join(arg1)); print(join(arg1, ",")); $x = join(arg1); join(arg1); }
              |                                      ^^^^^^^^^^
              = help: join() prints the joined strings itself: call it as a statement

            error: `join()` does not return a value
             --> script.bt:1:57
              |
            1 | uprobe:/bin/sh:main { printf("%s\n", join(arg1)); print(join(arg1, ",")); $x = join(arg1); join(arg1); }
              |                                                         ^^^^^^^^^^^^^^^
              = help: join() prints the joined strings itself: call it as a statement

            error: `join()` does not return a value
             --> script.bt:1:80
              |
            1 | uprobe:/bin/sh:main { printf("%s\n", join(arg1)); print(join(arg1, ",")); $x = join(arg1); join(arg1); }
              |                                                                                ^^^^^^^^^^
              = help: join() prints the joined strings itself: call it as a statement

        "#]],
    );
}

#[test]
fn unreachable_statements_warn() {
    check(
        "BEGIN { @a = 1; exit(); @b = 2; @c = 3; }\nEND { if (pid) { return; } else { exit(); } @d = 1; }\ninterval:s:1 { while (1) { break; @e = 1; } if (pid) { return; } @f = 1; }",
        expect![[r#"
            warning: unreachable statement: it follows `exit()`, so it never runs
             --> script.bt:1:25
              |
            1 | BEGIN { @a = 1; exit(); @b = 2; @c = 3; }
              |                         ^^^^^^

            warning: unreachable statement: it follows an `if` whose branches all end, so it never runs
             --> script.bt:2:45
              |
            2 | END { if (pid) { return; } else { exit(); } @d = 1; }
              |                                             ^^^^^^

            warning: unreachable statement: it follows `break`, so it never runs
             --> script.bt:3:35
              |
            3 | interval:s:1 { while (1) { break; @e = 1; } if (pid) { return; } @f = 1; }
              |                                   ^^^^^^

        "#]],
    );
}

#[test]
fn struct_and_array_values() {
    check(
        r#"struct S { uint8_t b[4]; char n[4]; } BEGIN { $p = (struct S *)0; $a = (uint8[3])(uint32)1; $b = (uint64)pton("1.2.3.4"); printf("%s %s\n", pton("1.2.3.4"), $p->n); if (pton("::1") == pton("1.2.3.4")) { } $c = pton("1.2.3.4"); $c = pton("::1"); $d = (struct S[2])1; $e = (uint8[])"ab"; }"#,
        expect![[r#"
            error: cannot cast `uint32` (4 bytes) to `uint8[3]` (3 bytes): an array cast keeps the size
             --> script.bt:1:72
              |
            1 | struct S { uint8_t b[4]; char n[4]; } BEGIN { $p = (struct S *)0; $a = (uint8[3])(uint32)1; $b = (uint64)pton("1.2.3.4"); printf("%s %s\n", pton("1.2.3.4"), $p->n); if (pton("::1") == pton("1.2.3.4")) { } $c = pton("1.2.3.4"); $c = pton("::1"); $d = (struct S[2])1; $e = (uint8[])"ab"; }
              |                                                                        ^^^^^^^^^^^^^^^^^^^

            error: cannot cast `uint8[4]` (4 bytes) to `uint64` (8 bytes): an array cast keeps the size
             --> script.bt:1:98
              |
            1 | struct S { uint8_t b[4]; char n[4]; } BEGIN { $p = (struct S *)0; $a = (uint8[3])(uint32)1; $b = (uint64)pton("1.2.3.4"); printf("%s %s\n", pton("1.2.3.4"), $p->n); if (pton("::1") == pton("1.2.3.4")) { } $c = pton("1.2.3.4"); $c = pton("::1"); $d = (struct S[2])1; $e = (uint8[])"ab"; }
              |                                                                                                  ^^^^^^^^^^^^^^^^^^^^^^^

            error: printf(): `%s` expects a string, not `uint8[4]`
             --> script.bt:1:141
              |
            1 | struct S { uint8_t b[4]; char n[4]; } BEGIN { $p = (struct S *)0; $a = (uint8[3])(uint32)1; $b = (uint64)pton("1.2.3.4"); printf("%s %s\n", pton("1.2.3.4"), $p->n); if (pton("::1") == pton("1.2.3.4")) { } $c = pton("1.2.3.4"); $c = pton("::1"); $d = (struct S[2])1; $e = (uint8[])"ab"; }
              |                                                                                                                                             ^^^^^^^^^^^^^^^
            note: in this format
             --> script.bt:1:130
              |
            1 | struct S { uint8_t b[4]; char n[4]; } BEGIN { $p = (struct S *)0; $a = (uint8[3])(uint32)1; $b = (uint64)pton("1.2.3.4"); printf("%s %s\n", pton("1.2.3.4"), $p->n); if (pton("::1") == pton("1.2.3.4")) { } $c = pton("1.2.3.4"); $c = pton("::1"); $d = (struct S[2])1; $e = (uint8[])"ab"; }
              |                                                                                                                                  ^^^^^^^^^

            error: cannot compare `uint8[16]` with `uint8[4]`
             --> script.bt:1:170
              |
            1 | struct S { uint8_t b[4]; char n[4]; } BEGIN { $p = (struct S *)0; $a = (uint8[3])(uint32)1; $b = (uint64)pton("1.2.3.4"); printf("%s %s\n", pton("1.2.3.4"), $p->n); if (pton("::1") == pton("1.2.3.4")) { } $c = pton("1.2.3.4"); $c = pton("::1"); $d = (struct S[2])1; $e = (uint8[])"ab"; }
              |                                                                                                                                                                          ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^

            error: type mismatch for `$c`: assigning a value of type `uint8[16]` to a variable of type `uint8[4]`
             --> script.bt:1:233
              |
            1 | struct S { uint8_t b[4]; char n[4]; } BEGIN { $p = (struct S *)0; $a = (uint8[3])(uint32)1; $b = (uint64)pton("1.2.3.4"); printf("%s %s\n", pton("1.2.3.4"), $p->n); if (pton("::1") == pton("1.2.3.4")) { } $c = pton("1.2.3.4"); $c = pton("::1"); $d = (struct S[2])1; $e = (uint8[])"ab"; }
              |                                                                                                                                                                                                                                         ^^^^^^^^^^^
            note: the variable's type was set here
             --> script.bt:1:206
              |
            1 | struct S { uint8_t b[4]; char n[4]; } BEGIN { $p = (struct S *)0; $a = (uint8[3])(uint32)1; $b = (uint64)pton("1.2.3.4"); printf("%s %s\n", pton("1.2.3.4"), $p->n); if (pton("::1") == pton("1.2.3.4")) { } $c = pton("1.2.3.4"); $c = pton("::1"); $d = (struct S[2])1; $e = (uint8[])"ab"; }
              |                                                                                                                                                                                                              ^^

            error: casts to arrays need an integer or bool element type, not `struct S`
             --> script.bt:1:252
              |
            1 | struct S { uint8_t b[4]; char n[4]; } BEGIN { $p = (struct S *)0; $a = (uint8[3])(uint32)1; $b = (uint64)pton("1.2.3.4"); printf("%s %s\n", pton("1.2.3.4"), $p->n); if (pton("::1") == pton("1.2.3.4")) { } $c = pton("1.2.3.4"); $c = pton("::1"); $d = (struct S[2])1; $e = (uint8[])"ab"; }
              |                                                                                                                                                                                                                                                            ^^^^^^^^^^^

            error: cannot cast `string[3]` to an array
             --> script.bt:1:272
              |
            1 | struct S { uint8_t b[4]; char n[4]; } BEGIN { $p = (struct S *)0; $a = (uint8[3])(uint32)1; $b = (uint64)pton("1.2.3.4"); printf("%s %s\n", pton("1.2.3.4"), $p->n); if (pton("::1") == pton("1.2.3.4")) { } $c = pton("1.2.3.4"); $c = pton("::1"); $d = (struct S[2])1; $e = (uint8[])"ab"; }
              |                                                                                                                                                                                                                                                                                ^^^^^^^^^^^^^

        "#]],
    );
}

#[test]
fn opaque_struct_values_are_refused() {
    use std::sync::Arc;
    use weft_ir::{CField, CStruct, Type};
    struct Fake;
    impl weft_lang::ArgsResolver for Fake {
        fn params(&self, _: &weft_ir::AttachPoint) -> Option<Vec<(String, Type)>> {
            let opaque = Type::CStruct(CStruct {
                name: "uint8[100]".into(),
                size: 100,
                fields: Vec::new().into(),
            });
            let outer = Type::CStruct(CStruct {
                name: "outer".into(),
                size: 104,
                fields: vec![
                    CField {
                        name: "big".into(),
                        offset: 0,
                        ty: opaque,
                        bits: None,
                    },
                    CField {
                        name: "n".into(),
                        offset: 100,
                        ty: Type::Int {
                            bits: 32,
                            signed: true,
                        },
                        bits: None,
                    },
                ]
                .into(),
            });
            Some(vec![("o".into(), Type::Ptr(Box::new(outer)))])
        }
    }
    let opts = Options {
        args_resolver: Some(Arc::new(Fake)),
        ..Options::default()
    };
    check_with(
        "uprobe:/bin/a:f { $n = args.o->n; print(args.o->big); @o = *args.o; }",
        &opts,
        expect![[r#"
            error: a whole `uint8[100]` cannot be used as a value: weft does not know its members (read its fields or elements one by one)
             --> script.bt:1:41
              |
            1 | uprobe:/bin/a:f { $n = args.o->n; print(args.o->big); @o = *args.o; }
              |                                         ^^^^^^^^^^^

            error: a whole `struct outer` cannot be used as a value: weft does not know the members of the `uint8[100]` in it (read its other fields one by one)
             --> script.bt:1:60
              |
            1 | uprobe:/bin/a:f { $n = args.o->n; print(args.o->big); @o = *args.o; }
              |                                                            ^^^^^^^

        "#]],
    );
}

#[test]
fn errorf_warnf_pcomm_arguments() {
    check(
        r#"BEGIN { errorf("%d %s\n", 1); warnf(); warnf("%s", 5); $p = pcomm(1); $q = pcomm; $r = pcomm(); }"#,
        expect![[r#"
            error: errorf(): not enough arguments for the format (1 given, 2 expected)
             --> script.bt:1:9
              |
            1 | BEGIN { errorf("%d %s\n", 1); warnf(); warnf("%s", 5); $p = pcomm(1); $q = pcomm; $r = pcomm(); }
              |         ^^^^^^^^^^^^^^^^^^^^

            error: warnf() takes at least 1 argument (0 given)
             --> script.bt:1:31
              |
            1 | BEGIN { errorf("%d %s\n", 1); warnf(); warnf("%s", 5); $p = pcomm(1); $q = pcomm; $r = pcomm(); }
              |                               ^^^^^^^

            error: warnf(): `%s` expects a string, not `int64`
             --> script.bt:1:52
              |
            1 | BEGIN { errorf("%d %s\n", 1); warnf(); warnf("%s", 5); $p = pcomm(1); $q = pcomm; $r = pcomm(); }
              |                                                    ^
            note: in this format
             --> script.bt:1:46
              |
            1 | BEGIN { errorf("%d %s\n", 1); warnf(); warnf("%s", 5); $p = pcomm(1); $q = pcomm; $r = pcomm(); }
              |                                              ^^^^

            error: pcomm() takes no arguments (1 given)
             --> script.bt:1:61
              |
            1 | BEGIN { errorf("%d %s\n", 1); warnf(); warnf("%s", 5); $p = pcomm(1); $q = pcomm; $r = pcomm(); }
              |                                                             ^^^^^^^^

        "#]],
    );
}

#[test]
fn pointer_arithmetic_only_adds_and_subtracts() {
    check(
        r#"BEGIN { $p = (int16 *)8; $p *= 2; @p = $p; @p <<= 1; $d = $p - $p; $e = 1 - $p; @p++; @p += "s"; }"#,
        expect![[r#"
            error: `*=` cannot be used on `$p`, a pointer (`int16 *`); only `+=` and `-=` can
             --> script.bt:1:26
              |
            1 | BEGIN { $p = (int16 *)8; $p *= 2; @p = $p; @p <<= 1; $d = $p - $p; $e = 1 - $p; @p++; @p += "s"; }
              |                          ^^^^^^^

            error: `<<=` cannot be used on `@p`, which holds pointers (`int16 *`); only `+=` and `-=` can
             --> script.bt:1:44
              |
            1 | BEGIN { $p = (int16 *)8; $p *= 2; @p = $p; @p <<= 1; $d = $p - $p; $e = 1 - $p; @p++; @p += "s"; }
              |                                            ^^^^^^^^

            error: `-` needs integers, not `int16 *` and `int16 *`
             --> script.bt:1:59
              |
            1 | BEGIN { $p = (int16 *)8; $p *= 2; @p = $p; @p <<= 1; $d = $p - $p; $e = 1 - $p; @p++; @p += "s"; }
              |                                                           ^^^^^^^
              = help: a pointer takes only `+` and `-` of an integer, with the pointer on the left of `-`

            error: `-` needs integers, not `int64` and `int16 *`
             --> script.bt:1:73
              |
            1 | BEGIN { $p = (int16 *)8; $p *= 2; @p = $p; @p <<= 1; $d = $p - $p; $e = 1 - $p; @p++; @p += "s"; }
              |                                                                         ^^^^^^
              = help: a pointer takes only `+` and `-` of an integer, with the pointer on the left of `-`

            error: `+=` on a pointer needs an integer, not `string[2]`
             --> script.bt:1:93
              |
            1 | BEGIN { $p = (int16 *)8; $p *= 2; @p = $p; @p <<= 1; $d = $p - $p; $e = 1 - $p; @p++; @p += "s"; }
              |                                                                                             ^^^

        "#]],
    );
}

#[test]
fn nested_struct_members_are_checked_where_written() {
    check(
        "struct S { int a; union { foo_t b; char c; }; struct { int x; } in; }\nBEGIN { $s = (struct S *)0; $v = $s->c + $s->in.x + $s->in.z; }",
        expect![[r#"
            error: unknown type `foo_t` for field `b`
             --> script.bt:1:33
              |
            1 | struct S { int a; union { foo_t b; char c; }; struct { int x; } in; }
              |                                 ^

            error: struct `S::(anonymous 2)` has no field `z`; did you mean `x`?
             --> script.bt:2:53
              |
            2 | BEGIN { $s = (struct S *)0; $v = $s->c + $s->in.x + $s->in.z; }
              |                                                     ^^^^^^^^

        "#]],
    );
}

#[test]
fn bit_field_widths_are_checked() {
    check(
        "struct S { int a:33; unsigned char b:0; char *p:3; int c:; }",
        expect![[r#"
            error: expected a bit-field width, found `;`
             --> script.bt:1:58
              |
            1 | struct S { int a:33; unsigned char b:0; char *p:3; int c:; }
              |                                                          ^

        "#]],
    );
    check(
        "struct S { int a:33; unsigned char b:0; char *p:3; }\nBEGIN { $s = (struct S *)0; }",
        expect![[r#"
            error: the width of the bit-field `a` must be 1 to 32 (the bits of `int32`), not 33
             --> script.bt:1:16
              |
            1 | struct S { int a:33; unsigned char b:0; char *p:3; }
              |                ^

            error: the width of the bit-field `b` must be 1 to 8 (the bits of `uint8`), not 0
             --> script.bt:1:36
              |
            1 | struct S { int a:33; unsigned char b:0; char *p:3; }
              |                                    ^

            error: the bit-field `p` must have an integer type, not `int8 *`
             --> script.bt:1:47
              |
            1 | struct S { int a:33; unsigned char b:0; char *p:3; }
              |                                               ^

        "#]],
    );
}

#[test]
fn multi_dimensional_array_members() {
    check(
        "struct G { int z[2][x]; }",
        expect![[r#"
            error: expected an array length
             --> script.bt:1:21
              |
            1 | struct G { int z[2][x]; }
              |                     ^

        "#]],
    );
}

#[test]
fn division_by_constant_zero_warns() {
    check(
        "BEGIN { $a = 5; $b = $a / 0; $c = $a % 0; $a /= 0; @m %= 0; $d = $a / 00; $e = $a / 1; }",
        expect![[r#"
            warning: division by zero
             --> script.bt:1:27
              |
            1 | BEGIN { $a = 5; $b = $a / 0; $c = $a % 0; $a /= 0; @m %= 0; $d = $a / 00; $e = $a / 1; }
              |                           ^
              = help: the result is 0, and weft counts it as an error at exit

            warning: modulo by zero
             --> script.bt:1:40
              |
            1 | BEGIN { $a = 5; $b = $a / 0; $c = $a % 0; $a /= 0; @m %= 0; $d = $a / 00; $e = $a / 1; }
              |                                        ^
              = help: the result is 0, and weft counts it as an error at exit

            warning: division by zero
             --> script.bt:1:49
              |
            1 | BEGIN { $a = 5; $b = $a / 0; $c = $a % 0; $a /= 0; @m %= 0; $d = $a / 00; $e = $a / 1; }
              |                                                 ^
              = help: the result is 0, and weft counts it as an error at exit

            warning: modulo by zero
             --> script.bt:1:58
              |
            1 | BEGIN { $a = 5; $b = $a / 0; $c = $a % 0; $a /= 0; @m %= 0; $d = $a / 00; $e = $a / 1; }
              |                                                          ^
              = help: the result is 0, and weft counts it as an error at exit

            warning: division by zero
             --> script.bt:1:71
              |
            1 | BEGIN { $a = 5; $b = $a / 0; $c = $a % 0; $a /= 0; @m %= 0; $d = $a / 00; $e = $a / 1; }
              |                                                                       ^^
              = help: the result is 0, and weft counts it as an error at exit

        "#]],
    );
}

#[test]
fn address_of_is_refused_where_written() {
    check(
        "struct S { int a; }\nBEGIN { $x = 1; $p = &$x; @m = 1; $q = &@m; $s = (struct S *)0; $r = &$s->a; $t = &1; }",
        expect![[r#"
            error: the address of a variable or a map (`&`) is not supported
             --> script.bt:2:22
              |
            2 | BEGIN { $x = 1; $p = &$x; @m = 1; $q = &@m; $s = (struct S *)0; $r = &$s->a; $t = &1; }
              |                      ^^^
              = help: bpftrace takes it only to pass a variable or map to an imported BPF function (unstable_addr), which weft does not have

            error: the address of a variable or a map (`&`) is not supported
             --> script.bt:2:40
              |
            2 | BEGIN { $x = 1; $p = &$x; @m = 1; $q = &@m; $s = (struct S *)0; $r = &$s->a; $t = &1; }
              |                                        ^^^
              = help: bpftrace takes it only to pass a variable or map to an imported BPF function (unstable_addr), which weft does not have

            error: `&` takes the address of a scratch variable or a map only
             --> script.bt:2:70
              |
            2 | BEGIN { $x = 1; $p = &$x; @m = 1; $q = &@m; $s = (struct S *)0; $r = &$s->a; $t = &1; }
              |                                                                      ^^^^^^
              = help: the address of a struct member is `(uint64)$p + offsetof(struct T, field)`

            error: `&` takes the address of a scratch variable or a map only
             --> script.bt:2:83
              |
            2 | BEGIN { $x = 1; $p = &$x; @m = 1; $q = &@m; $s = (struct S *)0; $r = &$s->a; $t = &1; }
              |                                                                                   ^^
              = help: the address of a struct member is `(uint64)$p + offsetof(struct T, field)`

        "#]],
    );
}

#[test]
fn call_probes() {
    check(
        "call:/bin/a:f within main { print(retval); print(caller); print(arg6); print(func); }\n\
         uprobe:/bin/a:f within main { print(caller); }\n\
         call:/bin/a:f+4 { }\n\
         call:a:b:c { }\n",
        expect![[r#"
            error: retval can only be used in uretprobe probes (not in `call:/bin/a:f within main`)
             --> script.bt:1:35
              |
            1 | call:/bin/a:f within main { print(retval); print(caller); print(arg6); print(func); }
              |                                   ^^^^^^

            error: `within` restricts the call sites of a `call:` probe, not a uprobe probe
             --> script.bt:2:24
              |
            2 | uprobe:/bin/a:f within main { print(caller); }
              |                        ^^^^

            error: caller can only be used in call probes (not in `uprobe:/bin/a:f within main`)
             --> script.bt:2:37
              |
            2 | uprobe:/bin/a:f within main { print(caller); }
              |                                     ^^^^^^

            error: invalid attach point `call:/bin/a:f+4`: a call site has no offset
             --> script.bt:3:1
              |
            3 | call:/bin/a:f+4 { }
              | ^^^^^^^^^^^^^^^

            error: invalid attach point `call:a:b:c`: wrong number of `:`-separated fields for call
             --> script.bt:4:1
              |
            4 | call:a:b:c { }
              | ^^^^^^^^^^

        "#]],
    );
}

#[test]
fn within_needs_a_pattern() {
    check(
        "call:/bin/a:f within { }\n",
        expect![[r#"
            error: `within` needs a function name or pattern after it
             --> script.bt:1:15
              |
            1 | call:/bin/a:f within { }
              |               ^^^^^^

        "#]],
    );
}

#[test]
fn data_pointcut_errors() {
    check(
        "get:/bin/a:v { print(old); print(val); } set:/bin/a:v { print(new); print(ip); } \
         watchpoint:0x1000:3:w { } watchpoint:0x1000:8:x { } set:addr(@q, 8) { } \
         set:addr(@m, 0) { } set:/bin/a:9x { } get:v { } BEGIN { print(val); @m[1] = 2; }",
        expect![[r#"
            error: old can only be used in set probes (write watchpoints) (not in `get:/bin/a:v`)
             --> script.bt:1:22
              |
            1 | get:/bin/a:v { print(old); print(val); } set:/bin/a:v { print(new); print(ip); } watchpoint:0x1000:3:w { } watchpoint:0x1000:8:x { } set:addr(@q, 8) { } set:addr(@m, 0) { } set:/bin/a:9x { } get:v { } BEGIN { print(val); @m[1] = 2; }
              |                      ^^^

            error: invalid watchpoint `watchpoint:0x1000:3:w`: the length must be 1, 2, 4 or 8
             --> script.bt:1:82
              |
            1 | get:/bin/a:v { print(old); print(val); } set:/bin/a:v { print(new); print(ip); } watchpoint:0x1000:3:w { } watchpoint:0x1000:8:x { } set:addr(@q, 8) { } set:addr(@m, 0) { } set:/bin/a:9x { } get:v { } BEGIN { print(val); @m[1] = 2; }
              |                                                                                  ^^^^^^^^^^^^^^^^^^^^^

            error: invalid watchpoint `watchpoint:0x1000:8:x`: mode `x` is not r, w or rw (x86 hardware watchpoints do not watch execution in weft; use uprobe)
             --> script.bt:1:108
              |
            1 | get:/bin/a:v { print(old); print(val); } set:/bin/a:v { print(new); print(ip); } watchpoint:0x1000:3:w { } watchpoint:0x1000:8:x { } set:addr(@q, 8) { } set:addr(@m, 0) { } set:/bin/a:9x { } get:v { } BEGIN { print(val); @m[1] = 2; }
              |                                                                                                            ^^^^^^^^^^^^^^^^^^^^^

            error: `set:addr(@q, 8)`: @q is never assigned (assign it an address in an earlier probe, e.g. `@q = arg0;`)
             --> script.bt:1:134
              |
            1 | get:/bin/a:v { print(old); print(val); } set:/bin/a:v { print(new); print(ip); } watchpoint:0x1000:3:w { } watchpoint:0x1000:8:x { } set:addr(@q, 8) { } set:addr(@m, 0) { } set:/bin/a:9x { } get:v { } BEGIN { print(val); @m[1] = 2; }
              |                                                                                                                                      ^^^^^^^^^^^^^^^

            error: invalid attach point `set:addr(@m, 0)`: expected set:addr(@MAP, SIZE) with a map without keys and SIZE at least 1 (bytes)
             --> script.bt:1:154
              |
            1 | get:/bin/a:v { print(old); print(val); } set:/bin/a:v { print(new); print(ip); } watchpoint:0x1000:3:w { } watchpoint:0x1000:8:x { } set:addr(@q, 8) { } set:addr(@m, 0) { } set:/bin/a:9x { } get:v { } BEGIN { print(val); @m[1] = 2; }
              |                                                                                                                                                          ^^^^^^^^^^^^^^^

            error: invalid attach point `set:/bin/a:9x`: expected set:BIN:VAR, with VAR a global or static variable (maybe followed by .FIELD or [INDEX]), or set:addr(@MAP, SIZE)
             --> script.bt:1:174
              |
            1 | get:/bin/a:v { print(old); print(val); } set:/bin/a:v { print(new); print(ip); } watchpoint:0x1000:3:w { } watchpoint:0x1000:8:x { } set:addr(@q, 8) { } set:addr(@m, 0) { } set:/bin/a:9x { } get:v { } BEGIN { print(val); @m[1] = 2; }
              |                                                                                                                                                                              ^^^^^^^^^^^^^

            error: invalid attach point `get:v`: expected get:BIN:VAR (the binary that defines the variable) or get:addr(@MAP, SIZE)
             --> script.bt:1:192
              |
            1 | get:/bin/a:v { print(old); print(val); } set:/bin/a:v { print(new); print(ip); } watchpoint:0x1000:3:w { } watchpoint:0x1000:8:x { } set:addr(@q, 8) { } set:addr(@m, 0) { } set:/bin/a:9x { } get:v { } BEGIN { print(val); @m[1] = 2; }
              |                                                                                                                                                                                                ^^^^^

            error: val can only be used in set, get and watchpoint probes (not in `BEGIN`)
             --> script.bt:1:216
              |
            1 | get:/bin/a:v { print(old); print(val); } set:/bin/a:v { print(new); print(ip); } watchpoint:0x1000:3:w { } watchpoint:0x1000:8:x { } set:addr(@q, 8) { } set:addr(@m, 0) { } set:/bin/a:9x { } get:v { } BEGIN { print(val); @m[1] = 2; }
              |                                                                                                                                                                                                                        ^^^

        "#]],
    );
}

#[test]
fn data_pointcuts_at_most_32() {
    // Hardware watchpoints take 4; the rest fall back to page protection.
    let mut text = String::from("uprobe:/bin/a:f { @p = arg0; } ");
    for _ in 0..32 {
        text.push_str("set:/bin/a:a, ");
    }
    text.push_str("watchpoint:0x1000:8:rw { }");
    let out = compile(&text, "script.bt", &Options::default());
    let msgs: Vec<String> = out.diagnostics.iter().map(|d| d.message.clone()).collect();
    assert_eq!(
        msgs,
        ["at most 32 data pointcuts in a program; this is number 33"],
        "{msgs:?}"
    );
}

#[test]
fn a_script_define_takes_an_integer() {
    check(
        "#define F(x) x\n#define G abc\nBEGIN { }",
        expect![[r#"
            error: a script's `#define` takes a name and an integer constant: `#define MAX 64`
             --> script.bt:1:1
              |
            1 | #define F(x) x
              | ^^^^^^^^^^^^^^
              = help: macros with parameters or other values belong in a header (`#include`)

            error: a script's `#define` takes a name and an integer constant: `#define MAX 64`
             --> script.bt:2:1
              |
            2 | #define G abc
              | ^^^^^^^^^^^^^
              = help: macros with parameters or other values belong in a header (`#include`)

        "#]],
    );
}

#[test]
fn a_wildcard_key_only_in_delete() {
    check(
        "BEGIN { @m[1, 2] = 1; @x = @m[1, *]; delete(@m[*, 2]); }\n",
        expect![[r#"
            error: a `*` key matches any value only in a statement `delete(@map[k1, *, ...])`
             --> script.bt:1:34
              |
            1 | BEGIN { @m[1, 2] = 1; @x = @m[1, *]; delete(@m[*, 2]); }
              |                                  ^

        "#]],
    );
}

#[test]
fn source_line_probes_are_checked_where_written() {
    check(
        "uretprobe:./app@app.c:3 { }\nuprobe:./app@app.c:0 { }\nuprobe:./app@app.c:9 { print(args); }\n",
        expect![[r#"
            error: uretprobe `uretprobe:./app@app.c:3`: a source line has no return; use uprobe
             --> script.bt:1:1
              |
            1 | uretprobe:./app@app.c:3 { }
              | ^^^^^^^^^^^^^^^^^^^^^^^

            error: invalid line in attach point `uprobe:./app@app.c:0`: lines count from 1
             --> script.bt:2:1
              |
            2 | uprobe:./app@app.c:0 { }
              | ^^^^^^^^^^^^^^^^^^^^

            error: args names a function's parameters; `uprobe:./app@app.c:9` is a source line, not a function's entry
             --> script.bt:3:30
              |
            3 | uprobe:./app@app.c:9 { print(args); }
              |                              ^^^^

        "#]],
    );
}
