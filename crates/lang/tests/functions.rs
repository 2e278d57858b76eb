//! User-defined functions (`fn`) and `if` used as a value: what is accepted, and the
//! errors with their rendering. Refresh with `UPDATE_EXPECT=1 cargo test -p weft-lang`.

use expect_test::{expect, Expect};
use weft_lang::{compile, render, Options};

fn check(input: &str, expected: Expect) {
    let out = compile(input, "script.bt", &Options::default());
    expected.assert_eq(&render(&out.diagnostics, input, "script.bt"));
}

fn accepted(input: &str) {
    check(input, expect![""]);
}

#[test]
fn functions_from_upstreams_runtime_tests_compile() {
    accepted("fn add($a: int64, $b: int64): int64 { return $a + $b; } BEGIN { print(add(5, 11)); exit(); }");
    accepted("fn f1(): void { printf(\"1\"); f2(); } fn f2(): void { printf(\"2\"); f3(); } fn f3(): void { printf(\"3\\n\"); } BEGIN { f1(); exit(); }");
    accepted("fn fact($x: int64): int64 { if ($x == 0) { return 1; } else { return (int64)($x * fact($x - 1)); } } BEGIN { print(fact(5)); exit(); }");
    accepted("fn p($idx: int64): void { print(@x[$idx]); } BEGIN { @x[0] = 1; p(1); exit(); }");
    accepted("fn print_cpu(): void { printf(\"cpu: %d\", cpu); } BEGIN { print_cpu(); exit(); }");
}

#[test]
fn early_returns_guards_and_blocks_compile() {
    accepted("fn f($v: int64): int64 { if ($v > 3) { return 3; } $v = $v * 2; { let $w = $v; return $w; } } BEGIN { print(f(1)); }");
    accepted("fn g($v: int64): void { if ($v) { printf(\"a\\n\"); return; } printf(\"b\\n\"); } BEGIN { g(0); }");
    // A script's own `add` hides the group builtin of that name.
    accepted("fn add($a: int64): int64 { return $a; } BEGIN { print(add(1)); }");
}

#[test]
fn if_used_as_a_value_compiles() {
    accepted("begin { let $x=1; let $y=2; let $z=3; print(if ($x) { if ($y) { if ($z) { $x } else { $y } } else { $z } } else { 0 }); }");
    accepted("BEGIN { $v = 5; $s = if ($v < 3) { \"a\" } else if ($v < 8) { \"b\" } else { \"c\" }; print($s); }");
    // Statement `if`s whose branches end with expressions of different types are
    // still statements.
    accepted("BEGIN { if (1) { 1 } else { \"s\" } if (0) { printf(\"x\") } }");
}

#[test]
fn wrong_number_of_arguments() {
    check(
        "fn add($a: int64, $b: int64): int64 { return $a + $b; }\nBEGIN { print(add(5)); }\n",
        expect![[r#"
            error: function `add` takes 2 argument(s) but 1 were given
             --> script.bt:2:15
              |
            2 | BEGIN { print(add(5)); }
              |               ^^^^^^
            note: the function is defined here
             --> script.bt:1:4
              |
            1 | fn add($a: int64, $b: int64): int64 { return $a + $b; }
              |    ^^^

        "#]],
    );
}

#[test]
fn unknown_function() {
    check(
        "BEGIN { ad(1); }",
        expect![[r#"
        error: unknown function `ad`
         --> script.bt:1:9
          |
        1 | BEGIN { ad(1); }
          |         ^^

    "#]],
    );
}

#[test]
fn defined_twice_and_named_like_a_builtin_or_macro() {
    check(
        "fn f(): void { }\nfn f(): void { }\nfn count(): void { }\nmacro m() { 1 }\nfn m(): void { }\nBEGIN { f(); }\n",
        expect![[r#"
            error: function `f` is defined twice
             --> script.bt:2:4
              |
            2 | fn f(): void { }
              |    ^
            note: first defined here
             --> script.bt:1:4
              |
            1 | fn f(): void { }
              |    ^

            error: function `count` has the name of a builtin function
             --> script.bt:3:4
              |
            3 | fn count(): void { }
              |    ^^^^^

            error: function `m` has the name of a macro
             --> script.bt:5:4
              |
            5 | fn m(): void { }
              |    ^
            note: the macro is defined here
             --> script.bt:4:7
              |
            4 | macro m() { 1 }
              |       ^

        "#]],
    );
}

#[test]
fn parameters_need_types_and_distinct_names() {
    check(
        "fn f($a): void { } BEGIN { }",
        expect![[r#"
        error: the parameter `$a` of `f` needs a type
         --> script.bt:1:8
          |
        1 | fn f($a): void { } BEGIN { }
          |        ^
          = help: write `$a: int64` (or another type)

    "#]],
    );
    check(
        "fn f($a: int64, $a: int64): void { } BEGIN { }",
        expect![[r#"
        error: parameter `$a` is declared twice
         --> script.bt:1:17
          |
        1 | fn f($a: int64, $a: int64): void { } BEGIN { }
          |                 ^^
        note: first declared here
         --> script.bt:1:6
          |
        1 | fn f($a: int64, $a: int64): void { } BEGIN { }
          |      ^^

    "#]],
    );
}

#[test]
fn argument_of_the_wrong_type() {
    check(
        "fn f($a: int64): int64 { return $a; } BEGIN { print(f(\"s\")); }",
        expect![[r#"
            error: cannot initialize `$a` of type `int64` with a value of type `string[2]`
             --> script.bt:1:55
              |
            1 | fn f($a: int64): int64 { return $a; } BEGIN { print(f("s")); }
              |                                                       ^^^

        "#]],
    );
}

#[test]
fn returns_that_do_not_fit_the_declared_type() {
    check(
        "fn f(): string { return 1; } BEGIN { print(f()); }",
        expect![[r#"
        error: function `f` returns `string[64]`, not `int64`
         --> script.bt:1:25
          |
        1 | fn f(): string { return 1; } BEGIN { print(f()); }
          |                         ^

    "#]],
    );
    check(
        "fn f(): void { return 1; } BEGIN { f(); }",
        expect![[r#"
        error: function `f` returns `void`: `return` takes no value here
         --> script.bt:1:23
          |
        1 | fn f(): void { return 1; } BEGIN { f(); }
          |                       ^
        note: the result type is declared here
         --> script.bt:1:9
          |
        1 | fn f(): void { return 1; } BEGIN { f(); }
          |         ^^^^

    "#]],
    );
    check(
        "fn f(): int64 { return; } BEGIN { f(); }",
        expect![[r#"
            error: function `f` must return a value of type `int64`
             --> script.bt:1:17
              |
            1 | fn f(): int64 { return; } BEGIN { f(); }
              |                 ^^^^^^
            note: the result type is declared here
             --> script.bt:1:9
              |
            1 | fn f(): int64 { return; } BEGIN { f(); }
              |         ^^^^^

        "#]],
    );
}

#[test]
fn a_path_without_return() {
    check(
        "fn f($x: int64): int64 {\n  if ($x) { return 1; }\n}\nBEGIN { print(f(1)); }\n",
        expect![[r#"
            error: function `f` can reach its end without returning a value of type `int64`
             --> script.bt:3:1
              |
            3 | }
              | ^
            note: the result type is declared here
             --> script.bt:1:18
              |
            1 | fn f($x: int64): int64 {
              |                  ^^^^^

        "#]],
    );
}

#[test]
fn return_in_a_loop_is_not_supported() {
    check(
        "fn f(): int64 { for ($i : 0..3) { return $i; } return 0; } BEGIN { print(f()); }",
        expect![[r#"
            error: weft cannot return from function `f` here: a `return` must end the function's body or a branch of an `if` (not a loop or an expression)
             --> script.bt:1:35
              |
            1 | fn f(): int64 { for ($i : 0..3) { return $i; } return 0; } BEGIN { print(f()); }
              |                                   ^^^^^^^^^
              = help: keep the result in a variable and return it after the loop

        "#]],
    );
}

#[test]
fn a_recursion_that_doubles_is_bounded() {
    // fib calls itself twice: weft follows it 9 calls deep (511 copies), then a
    // deeper call stops the probe at run time; compiling is fine.
    accepted("fn fib($x: int64): int64 { if ($x < 2) { return $x; } return fib($x - 1) + fib($x - 2); } BEGIN { print(fib(9)); }");
}

#[test]
fn if_without_else_is_no_value() {
    check(
        "BEGIN { print(if (1) { 2 }); }",
        expect![[r#"
        error: this `if` is used as a value, but it has none
         --> script.bt:1:15
          |
        1 | BEGIN { print(if (1) { 2 }); }
          |               ^^^^^^^^^^^^
          = help: an `if` expression needs an `else`, and each branch must end with an expression without `;`: `if (c) { 1 } else { 2 }`

    "#]],
    );
    check(
        "BEGIN { $x = if (1) { 2; } else { 3 }; }",
        expect![[r#"
        error: this `if` is used as a value, but it has none
         --> script.bt:1:14
          |
        1 | BEGIN { $x = if (1) { 2; } else { 3 }; }
          |              ^^^^^^^^^^^^^^^^^^^^^^^^
          = help: an `if` expression needs an `else`, and each branch must end with an expression without `;`: `if (c) { 1 } else { 2 }`

    "#]],
    );
}
