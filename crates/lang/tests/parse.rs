//! Parser tests: the AST dump of each construct (golden; refresh with
//! `UPDATE_EXPECT=1 cargo test -p weft-lang`).

use expect_test::{expect, Expect};
use weft_lang::{dump, parse, render, Dumpable};

/// Parse `input`; the dump (and any diagnostics, rendered) must match.
fn check(input: &str, expected: Expect) {
    let (ast, diags) = parse(input);
    let mut out = dump(Dumpable::Ast(&ast));
    if !diags.is_empty() {
        out.push_str(&render(&diags, input, "t.bt"));
    }
    expected.assert_eq(&out);
}

#[test]
fn probe_with_predicate_and_statements() {
    check(
        r#"uprobe:/bin/bash:readline /pid == 1/ { $x = 1; @m[k1, "a"] = count(); printf("%d\n", $x) }"#,
        expect![[r#"
            Program
             uprobe:/bin/bash:readline
              predicate
               ==
                builtin: pid
                int: 1
              =
               variable: $x
               int: 1
              =
               map: @m
                builtin: k1
                string: "a"
               call: count
              call: printf
               string: "%d\n"
               variable: $x
        "#]],
    );
}

#[test]
fn attach_point_forms() {
    check(
        r#"u:/bin/a:f, ur:/bin/a:g, U:/bin/a:p:n, uprobe:"/a b/c":f+0x10, uprobe:/bin/a:foo_*, begin, End, interval:s:1, interval:ms:5, profile:hz:99 { }"#,
        expect![[r#"
            Program
             uprobe:/bin/a:f, uretprobe:/bin/a:g, usdt:/bin/a:p:n, uprobe:/a b/c:f+0x10, uprobe:/bin/a:foo_*, BEGIN, END, interval:s:1, interval:ms:5, profile:hz:99
        "#]],
    );
}

#[test]
fn multi_line_attach_list() {
    check(
        "BEGIN,\n  END\n{ exit() }",
        expect![[r#"
        Program
         BEGIN, END
          call: exit
    "#]],
    );
}

#[test]
fn precedence_is_c() {
    check(
        "BEGIN { $x = 1 + 2 * 3 << 1 == 14 && 1 | 2 ^ 3 & 4 || !0 ? -1 : ~2; }",
        expect![[r#"
        Program
         BEGIN
          =
           variable: $x
           ?:
            ||
             &&
              ==
               <<
                +
                 int: 1
                 *
                  int: 2
                  int: 3
                int: 1
               int: 14
              |
               int: 1
               ^
                int: 2
                &
                 int: 3
                 int: 4
             !
              int: 0
            -
             int: 1
            ~
             int: 2
    "#]],
    );
}

#[test]
fn predicate_with_division() {
    check(
        "BEGIN /10 / 2 == 5/ { }",
        expect![[r#"
        Program
         BEGIN
          predicate
           ==
            /
             int: 10
             int: 2
            int: 5
    "#]],
    );
}

#[test]
fn assignments_and_compound_ops() {
    check(
        "BEGIN { $a = 1; $a += 1; $a -= 1; $a *= 2; $a /= 2; $a %= 3; $a &= 1; $a |= 1; $a ^= 1; $a <<= 1; $a >>= 1; @m[1] += 2; @ = 3 }",
        expect![[r#"
            Program
             BEGIN
              =
               variable: $a
               int: 1
              +=
               variable: $a
               int: 1
              -=
               variable: $a
               int: 1
              *=
               variable: $a
               int: 2
              /=
               variable: $a
               int: 2
              %=
               variable: $a
               int: 3
              &=
               variable: $a
               int: 1
              |=
               variable: $a
               int: 1
              ^=
               variable: $a
               int: 1
              <<=
               variable: $a
               int: 1
              >>=
               variable: $a
               int: 1
              +=
               map: @m
                int: 1
               int: 2
              =
               map: @
               int: 3
        "#]],
    );
}

#[test]
fn increments() {
    check(
        "BEGIN { $i++; ++$i; $i--; --$i; @m++; @n[1]--; $j = $i++ + ++$i; }",
        expect![[r#"
        Program
         BEGIN
          ++ (post)
           variable: $i
          ++ (pre)
           variable: $i
          -- (post)
           variable: $i
          -- (pre)
           variable: $i
          ++ (post)
           map: @m
          -- (post)
           map: @n
            int: 1
          =
           variable: $j
           +
            ++ (post)
             variable: $i
            ++ (pre)
             variable: $i
    "#]],
    );
}

#[test]
fn control_flow() {
    check(
        "BEGIN { if ($a) { 1 } else if ($b) { 2 } else { 3 } unroll (3) { $i++ } while ($i < 10) { if ($i == 5) { break; } continue; } for ($kv : @m) { print($kv.0); } for ($i : 0..10) { } return; }",
        expect![[r#"
            Program
             BEGIN
              if
               variable: $a
               then
                int: 1
               else
                if
                 variable: $b
                 then
                  int: 2
                 else
                  int: 3
              unroll
               int: 3
               do
                ++ (post)
                 variable: $i
              while
               <
                variable: $i
                int: 10
               do
                if
                 ==
                  variable: $i
                  int: 5
                 then
                  break
                continue
              for
               variable: $kv
               map: @m
               do
                call: print
                 .0
                  variable: $kv
              for
               variable: $i
               range
                int: 0
                int: 10
               do
              return
        "#]],
    );
}

#[test]
fn casts_pointers_fields() {
    check(
        "BEGIN { $a = (int32)arg0; $p = (struct foo *)arg1; $q = (uint8*)arg2; $b = *$q; $c = $p->x; $d = $p.y.z; $e = $q[3]; $f = (unsigned long)1; }",
        expect![[r#"
            Program
             BEGIN
              =
               variable: $a
               (int32)
                builtin: arg0
              =
               variable: $p
               (struct foo *)
                builtin: arg1
              =
               variable: $q
               (uint8 *)
                builtin: arg2
              =
               variable: $b
               *
                variable: $q
              =
               variable: $c
               ->x
                variable: $p
              =
               variable: $d
               .z
                .y
                 variable: $p
              =
               variable: $e
               []
                variable: $q
                int: 3
              =
               variable: $f
               (uint64)
                int: 1
        "#]],
    );
}

#[test]
fn tuples_records_blocks() {
    check(
        r#"BEGIN { $t = (1, "a"); $u = (1,); $e = (); $v = $t.1; $kv = $x.0.1; $r = (a = 1, b = "x"); $s = $r.a; $b = { let $z = 1; $z + 1 }; }"#,
        expect![[r#"
            Program
             BEGIN
              =
               variable: $t
               tuple:
                int: 1
                string: "a"
              =
               variable: $u
               tuple:
                int: 1
              =
               variable: $e
               tuple:
              =
               variable: $v
               .1
                variable: $t
              =
               variable: $kv
               .1
                .0
                 variable: $x
              =
               variable: $r
               record:
                a =
                 int: 1
                b =
                 string: "x"
              =
               variable: $s
               .a
                variable: $r
              =
               variable: $b
               block
                let $z
                 int: 1
                value
                 +
                  variable: $z
                  int: 1
        "#]],
    );
}

#[test]
fn literals() {
    check(
        r#"BEGIN { $a = 1_000; $b = 0x1F; $c = 010; $d = 1e6; $e = 10ul; $f = 5ms; $g = "tab\there\x41\101"; $h = true; $i = $1 + $#; }"#,
        expect![[r#"
            Program
             BEGIN
              =
               variable: $a
               int: 1000
              =
               variable: $b
               int: 31
              =
               variable: $c
               int: 8
              =
               variable: $d
               int: 1000000
              =
               variable: $e
               int: 10
              =
               variable: $f
               int: 5000000
              =
               variable: $g
               string: "tab\thereAA"
              =
               variable: $h
               bool: true
              =
               variable: $i
               +
                param: $1
                param: $#
        "#]],
    );
}

#[test]
fn let_with_types() {
    check(
        "BEGIN { let $a; let $b: uint32 = 5; let $c = \"s\"; }",
        expect![[r#"
        Program
         BEGIN
          let $a
          let $b: uint32
           int: 5
          let $c
           string: "s"
    "#]],
    );
}

#[test]
fn preamble_items() {
    check(
        "#include <linux/sched.h>\nconfig = { max_map_keys = 10; stack_mode = perf }\nstruct Point { int x; unsigned long y; char name[8]; struct Point *next; };\nlet @a = hash(100);\nmacro add(x, $y, @z) { x + $y }\nBEGIN { }",
        expect![[r#"
            Program
             config
              max_map_keys = 10
              stack_mode = perf
             struct Point
              int32 x
              uint64 y
              char[8] name
              struct Point * next
             let @a = hash(100)
             macro add(x, $y, @z)
              value
               +
                builtin: x
                variable: $y
             BEGIN
        "#]],
    );
}

#[test]
fn reserved_aspect_syntax() {
    check(
        "before uprobe:/bin/a:f { } around call:/bin/a:g { proceed(); } after K:do_x { } seq { uprobe:/bin/a:f { } } group net { uprobe:/bin/a:f { } } uprobe:/bin/a:h /cflow(uprobe:/bin/a:main)/ { }",
        expect![[r#"
            Program
             before uprobe:/bin/a:f
             around call:/bin/a:g
              call: proceed
             after kernel:do_x
             seq
              uprobe:/bin/a:f
             group net
              uprobe:/bin/a:f
             uprobe:/bin/a:h
              predicate
               cflow: uprobe:/bin/a:main
        "#]],
    );
}

#[test]
fn reserved_words_stay_usable_as_names() {
    check(
        "BEGIN { @seq = 1; $around = 2; @before[1] = $around; $group = @seq; }",
        expect![[r#"
        Program
         BEGIN
          =
           map: @seq
           int: 1
          =
           variable: $around
           int: 2
          =
           map: @before
            int: 1
           variable: $around
          =
           variable: $group
           map: @seq
    "#]],
    );
}

#[test]
fn comments_everywhere() {
    check(
        "// c\nBEGIN /* c */ { /* c */ print(/* c */ 1); // c\n}",
        expect![[r#"
        Program
         BEGIN
          call: print
           int: 1
    "#]],
    );
}

#[test]
fn sizeof_offsetof() {
    check(
        "BEGIN { $a = sizeof(uint32); $b = sizeof($a); $c = offsetof(struct S, x); }",
        expect![[r#"
        Program
         BEGIN
          =
           variable: $a
           sizeof
            type: uint32
          =
           variable: $b
           sizeof
            variable: $a
          =
           variable: $c
           offsetof(struct S, x)
    "#]],
    );
}

#[test]
fn recovers_and_reports_every_error() {
    check(
        "BEGIN { $x = ; printf(\"a\"); $y = (1 + ; } END { @a[] = 1; } interval:s:1 { 1 2 }",
        expect![[r#"
            Program
             BEGIN
              call: printf
               string: "a"
             END
             interval:s:1
              int: 1
            error: expected an expression, found `;`
             --> t.bt:1:14
              |
            1 | BEGIN { $x = ; printf("a"); $y = (1 + ; } END { @a[] = 1; } interval:s:1 { 1 2 }
              |              ^

            error: expected an expression, found `;`
             --> t.bt:1:39
              |
            1 | BEGIN { $x = ; printf("a"); $y = (1 + ; } END { @a[] = 1; } interval:s:1 { 1 2 }
              |                                       ^

            error: empty map key: write `@m` for a map without keys
             --> t.bt:1:49
              |
            1 | BEGIN { $x = ; printf("a"); $y = (1 + ; } END { @a[] = 1; } interval:s:1 { 1 2 }
              |                                                 ^^^^

            error: expected `;` or `}` after statement, found integer `2`
             --> t.bt:1:77
              |
            1 | BEGIN { $x = ; printf("a"); $y = (1 + ; } END { @a[] = 1; } interval:s:1 { 1 2 }
              |                                                                             ^
            note: this cannot continue the statement
             --> t.bt:1:78
              |
            1 | BEGIN { $x = ; printf("a"); $y = (1 + ; } END { @a[] = 1; } interval:s:1 { 1 2 }
              |                                                                              ^

        "#]],
    );
}

#[test]
fn unclosed_block() {
    check(
        "BEGIN { printf(\"x\");",
        expect![[r#"
        Program
        error: unexpected end of input: unclosed `{`
         --> t.bt:1:21
          |
        1 | BEGIN { printf("x");
          |                     ^
        note: the block starts here
         --> t.bt:1:7
          |
        1 | BEGIN { printf("x");
          |       ^

    "#]],
    );
}

#[test]
fn lexer_errors() {
    check(
        "BEGIN { $a = 'c'; $b = \"unterminated\n }",
        expect![[r#"
        Program
         BEGIN
          =
           variable: $a
           int: 99
          =
           variable: $b
           string: "unterminated"
        error: character literals are not supported; use the character's code (e.g. 65 for 'A')
         --> t.bt:1:14
          |
        1 | BEGIN { $a = 'c'; $b = "unterminated
          |              ^^^

        error: unterminated string literal
         --> t.bt:1:24
          |
        1 | BEGIN { $a = 'c'; $b = "unterminated
          |                        ^^^^^^^^^^^^^

    "#]],
    );
}

#[test]
fn missing_semicolon() {
    check(
        "BEGIN { $a = 1 $b = 2 }",
        expect![[r#"
        Program
         BEGIN
          =
           variable: $a
           int: 1
        error: expected `;` or `}` after statement, found `$b`
         --> t.bt:1:15
          |
        1 | BEGIN { $a = 1 $b = 2 }
          |               ^
        note: this cannot continue the statement
         --> t.bt:1:16
          |
        1 | BEGIN { $a = 1 $b = 2 }
          |                ^^

    "#]],
    );
}

#[test]
fn bad_assignment_target() {
    check(
        "BEGIN { 1 + 2 = 3; }",
        expect![[r#"
        Program
         BEGIN
        error: cannot assign to this expression
         --> t.bt:1:9
          |
        1 | BEGIN { 1 + 2 = 3; }
          |         ^^^^^
          = help: only scratch variables (`$x`) and maps (`@m`, `@m[k]`) can be assigned
        note: assignment here
         --> t.bt:1:15
          |
        1 | BEGIN { 1 + 2 = 3; }
          |               ^

    "#]],
    );
}

#[test]
fn a_define_that_is_no_integer_is_rejected() {
    check(
        "#define X(a) a\nBEGIN { }",
        expect![[r#"
            Program
             BEGIN
            error: a script's `#define` takes a name and an integer constant: `#define MAX 64`
             --> t.bt:1:1
              |
            1 | #define X(a) a
              | ^^^^^^^^^^^^^^
              = help: macros with parameters or other values belong in a header (`#include`)

        "#]],
    );
}

#[test]
fn checked_dump_shows_types() {
    let src =
        "uretprobe:/bin/a:f { $x = retval + 1; $y = (int8)$x < -1; @m[comm, pid] = $y; $s = $1; }";
    let (ast, _) = parse(src);
    let opts = weft_lang::Options {
        positional: vec!["abc".into()],
        ..Default::default()
    };
    let (checked, diags) = weft_lang::check(ast, &opts);
    assert!(diags.is_empty(), "{diags:?}");
    expect![[r#"
        Program
         uretprobe:/bin/a:f
          =
           variable: $x
           + :: uint64
            builtin: retval :: uint64
            int: 1 :: int64
          =
           variable: $y
           < :: bool
            (int8) :: int8
             variable: $x :: uint64
            - :: int64
             int: 1 :: int64
          =
           map: @m
            builtin: comm :: string[16]
            builtin: pid :: uint64
           variable: $y :: bool
          =
           variable: $s
           string: "abc" :: string[4]
    "#]]
    .assert_eq(&dump(Dumpable::Checked(&checked)));
}

/// Line continuations (a backslash ending its line) join lines as C's line splicing
/// does: in preprocessor lines (upstream bpftrace hands `#include` lines to clang,
/// which reads them so), between tokens and in strings (the backslash and the line
/// break are dropped).
#[test]
fn line_continuations_in_directives_code_and_strings() {
    check(
        "#include <linux/sched.h> \\\n  <linux/fs.h>\nBEGIN { $x = 1 + \\\n 2; printf(\"ab\\\ncd\\n\"); @m[1, \\\r\n 2] = $x; }",
        expect![[r#"
            Program
             BEGIN
              =
               variable: $x
               +
                int: 1
                int: 2
              call: printf
               string: "abcd\n"
              =
               map: @m
                int: 1
                int: 2
               variable: $x
        "#]],
    );
}

/// A `#define` continued over two lines is one directive, refused once.
#[test]
fn continued_define_is_one_directive() {
    check(
        "#define X 1 + \\\n 2\nBEGIN { }",
        expect![[r#"
            Program
             BEGIN
            error: a script's `#define` takes a name and an integer constant: `#define MAX 64`
             --> t.bt:1:1
              |
            1 | #define X 1 + \
              | ^^^^^^^^^^^^^^^
              = help: macros with parameters or other values belong in a header (`#include`)

        "#]],
    );
}

/// A continuation does not join a `//` comment to the next line (as bpftrace, whose
/// comments end at the line's end), nor split a token.
#[test]
fn continuation_does_not_extend_comments_or_split_tokens() {
    check(
        "BEGIN { // a comment \\\n $x = 1; @a\\\nb = 2; }",
        expect![[r#"
            Program
             BEGIN
              =
               variable: $x
               int: 1
              map: @a
            error: expected `;` or `}` after statement, found `b`
             --> t.bt:2:12
              |
            2 |  $x = 1; @a\
              |            ^
            note: this cannot continue the statement
             --> t.bt:3:1
              |
            3 | b = 2; }
              | ^

        "#]],
    );
}
