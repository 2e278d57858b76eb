//! The C-header reader (`weft_lang::cheader`) and what scripts do with what it
//! reads: structs in casts, `sizeof`, `offsetof`, typedefs, enum and `#define`
//! constants; the things it must skip; the errors. Refresh with
//! `UPDATE_EXPECT=1 cargo test -p weft-lang --test headers`.

use std::collections::HashMap;
use std::sync::Arc;

use expect_test::{expect, Expect};
use weft_lang::cheader::{self, CDecls};
use weft_lang::{compile, render, HeaderFile, HeaderResolver, Includer, Options, Stage};

/// Headers by name; `<...>` ones are found under `sys/`.
struct Files(HashMap<String, String>);

impl HeaderResolver for Files {
    fn find(
        &self,
        name: &str,
        angled: bool,
        _from: Includer<'_>,
    ) -> Result<HeaderFile, Vec<String>> {
        let path = if angled {
            format!("sys/{name}")
        } else {
            name.to_string()
        };
        match self.0.get(&path) {
            Some(text) => Ok(HeaderFile {
                path,
                text: text.clone(),
            }),
            None if angled => Err(vec!["/usr/include".into()]),
            None => Err(vec![".".into(), "/usr/include".into()]),
        }
    }
}

const FOO_H: &str = r#"
/* A header as a C program's: guards, includes, macros, prototypes. */
#ifndef FOO_H
#define FOO_H
#include "inner.h"
#include <sys/types.h>

#define BUF_LEN 16
#define FLAG_A (1 << 3)
#define NAME "str"          // not an integer: not a constant
#define MAX(a, b) ((a) > (b) ? (a) : (b))
#define BIGGER MAX(BUF_LEN, 8) * 2
#define LONG_ONE \
    0x10UL

typedef unsigned int u32;
typedef u32 myid_t;
enum color { RED, GREEN = 5, BLUE, };
typedef enum { SMALL = -1, BIG = BUF_LEN + GREEN } size_kind;

struct foo {
    myid_t id;
    struct inner in;
    char name[BUF_LEN];
    unsigned int a : 3, b : 5;
    long vals[2];
    union { int i; unsigned char c; };
    struct foo *next;
    void (*cb)(int, char *);
    const char *labels[2];
};
typedef struct { int x, y; } point_t;

extern int foo_count;
int foo_init(struct foo *f, const char *name) __attribute__((nonnull(1)));
static inline int foo_twice(int x) { struct hidden { int z; } h = { x }; return h.z * 2; }
_Static_assert(sizeof(int) == 4, "int");

#ifdef __x86_64__
#define ARCH 64
#else
#define ARCH 32
#endif
#if defined(NOT_DEFINED) || UNKNOWN_FN(3)
#define WRONG 1
#endif
#if BUF_LEN > 8 && FLAG_A == 8
#define RIGHT 1
#elif 1
#define WRONG 2
#endif

struct has_double { int a; double d; };
struct __attribute__((packed)) packed_s { char a; int b; };
struct uses_double { struct has_double h; };
#endif
"#;

const INNER_H: &str = r#"
#pragma once
#include "foo.h"   /* a cycle: foo.h is not read again */
struct inner { int x; short y; };
"#;

const TYPES_H: &str = "typedef long ssize_t;\n";

fn files() -> Files {
    Files(
        [
            ("foo.h", FOO_H),
            ("inner.h", INNER_H),
            ("sys/sys/types.h", TYPES_H),
        ]
        .into_iter()
        .map(|(n, t)| (n.to_string(), t.to_string()))
        .collect(),
    )
}

fn opts() -> Options {
    Options {
        headers: Some(Arc::new(files())),
        dump: vec![Stage::Check],
        ..Options::default()
    }
}

/// The checked program's dump (constants folded), or the diagnostics.
fn check_with(input: &str, opts: &Options, expected: Expect) {
    let out = compile(input, "t.bt", opts);
    let text = if out.has_errors() {
        render(&out.diagnostics, input, "t.bt")
    } else {
        out.dumps
            .iter()
            .find(|(s, _)| *s == Stage::Check)
            .map(|(_, d)| d.clone())
            .unwrap_or_default()
    };
    expected.assert_eq(&text);
}

fn check(input: &str, expected: Expect) {
    check_with(input, &opts(), expected);
}

fn read(names: &[&str]) -> CDecls {
    let includes: Vec<weft_lang::ast::Include> = names
        .iter()
        .map(|n| weft_lang::ast::Include {
            name: n.to_string(),
            angled: false,
            span: Default::default(),
        })
        .collect();
    let (decls, diags) = cheader::read(&[], &includes, &files());
    assert!(diags.is_empty(), "{diags:?}");
    decls
}

#[test]
fn reads_definitions_and_skips_the_rest() {
    let d = read(&["foo.h", "foo.h"]);
    assert_eq!(d.files, ["foo.h", "inner.h", "sys/sys/types.h"]);
    let structs: Vec<&str> = d.structs.iter().map(|s| s.def.name.as_str()).collect();
    assert_eq!(
        structs,
        [
            "inner",
            "(anonymous 1 at foo.h:27)",
            "foo",
            "point_t",
            "has_double",
            "packed_s",
            "uses_double"
        ]
    );
    let foo = &d.structs[2];
    assert_eq!(foo.origin, "foo.h:21");
    let fields: Vec<String> = foo
        .def
        .fields
        .iter()
        .map(|(t, n, _, w)| format!("{t} {n}{}", w.map(|w| format!(":{w}")).unwrap_or_default()))
        .collect();
    assert_eq!(
        fields,
        [
            "myid_t id",
            "struct inner in",
            "char[16] name",
            "uint32 a:3",
            "uint32 b:5",
            "int64[2] vals",
            "struct (anonymous 1 at foo.h:27) ",
            "struct foo * next",
            "void * cb",
            "char *[2] labels"
        ]
    );
    assert_eq!(
        d.structs[5].unsupported.as_deref(),
        Some("weft does not lay out `__attribute__((packed))` structs")
    );
    let typedefs: Vec<String> = d
        .typedefs
        .iter()
        .map(|(n, t)| format!("{n} = {t}"))
        .collect();
    assert_eq!(
        typedefs,
        [
            "ssize_t = int64",
            "u32 = uint32",
            "myid_t = u32",
            "size_kind = int32",
            "char * = char *",
            "point_t = struct point_t"
        ]
    );
    let enums: Vec<Vec<(String, Option<i64>)>> = d
        .enums
        .iter()
        .map(|e| e.variants.iter().map(|(n, v, _)| (n.clone(), *v)).collect())
        .collect();
    assert_eq!(
        enums,
        [
            vec![
                ("RED".into(), Some(0)),
                ("GREEN".into(), Some(5)),
                ("BLUE".into(), Some(6))
            ],
            vec![("SMALL".into(), Some(-1)), ("BIG".into(), Some(21))],
        ]
    );
    assert_eq!(
        d.constants,
        [
            ("ARCH".to_string(), 64),
            ("BIGGER".to_string(), 32),
            ("BUF_LEN".to_string(), 16),
            ("FLAG_A".to_string(), 8),
            ("LONG_ONE".to_string(), 16),
            ("RIGHT".to_string(), 1),
        ]
    );
}

#[test]
fn sizes_offsets_and_constants() {
    check(
        r#"#include "foo.h"
BEGIN {
  printf("%d %d %d %d %d\n", sizeof(struct foo), offsetof(struct foo, vals), offsetof(struct foo, in.y), offsetof(struct foo, next), offsetof(struct foo, labels));
  printf("%d %d %d %d %d %d\n", sizeof(myid_t), sizeof(point_t), BUF_LEN, FLAG_A | BLUE, BIG, SMALL);
}"#,
        expect![[r#"
            Program
             BEGIN
              call: printf :: none
               string: "%d %d %d %d %d\n" :: string[16]
               int: 88 :: int64
               int: 32 :: int64
               int: 8 :: int64
               int: 56 :: int64
               int: 72 :: int64
              call: printf :: none
               string: "%d %d %d %d %d %d\n" :: string[19]
               int: 4 :: int64
               int: 8 :: int64
               int: 16 :: int64
               | :: int64
                int: 8 :: int64
                int: 6 :: int64
               int: 21 :: enum
               - :: int64
                int: 1 :: int64
        "#]],
    );
}

#[test]
fn casts_through_header_types() {
    check(
        r#"#include "foo.h"
uprobe:/bin/true:f {
  $f = (struct foo *)arg0;
  printf("%d %s %d %d\n", $f->id, $f->name, $f->in.y, $f->b);
  printf("%d %d\n", ((myid_t)arg1), ((point_t *)arg2)->y);
  printf("%s\n", str($f->labels[1]));
}"#,
        expect![[r#"
            Program
             uprobe:/bin/true:f
              =
               variable: $f
               (struct foo *) :: struct foo *
                builtin: arg0 :: uint64
              call: printf :: none
               string: "%d %s %d %d\n" :: string[13]
               ->id :: uint32
                variable: $f :: struct foo *
               ->name :: string[16]
                variable: $f :: struct foo *
               .y :: int16
                ->in :: struct inner
                 variable: $f :: struct foo *
               ->b :: uint32
                variable: $f :: struct foo *
              call: printf :: none
               string: "%d %d\n" :: string[7]
               (myid_t) :: uint32
                builtin: arg1 :: uint64
               ->y :: int32
                (point_t *) :: struct point_t *
                 builtin: arg2 :: uint64
              call: printf :: none
               string: "%s\n" :: string[4]
               call: str :: string[64]
                [] :: int8 *
                 ->labels :: int8 *[2]
                  variable: $f :: struct foo *
                 int: 1 :: int64
        "#]],
    );
}

#[test]
fn a_struct_with_an_unknown_member_type_is_an_error_where_it_is_used() {
    // Unused, it is no error.
    check(
        r#"#include "foo.h"
BEGIN { print(sizeof(struct inner)); }"#,
        expect![[r#"
    Program
     BEGIN
      call: print :: none
       int: 8 :: int64
"#]],
    );
    check(
        r#"#include "foo.h"
BEGIN { print(sizeof(struct has_double)); print(sizeof(struct uses_double)); print(sizeof(struct packed_s)); }"#,
        expect![[r#"
            error: struct `has_double` (foo.h:53) cannot be used: unknown type `double` for field `d`
             --> t.bt:2:22
              |
            2 | BEGIN { print(sizeof(struct has_double)); print(sizeof(struct uses_double)); print(sizeof(struct packed_s)); }
              |                      ^^^^^^^^^^^^^^^^^

            error: struct `uses_double` (foo.h:55) cannot be used: struct `has_double` (foo.h:53) cannot be used: unknown type `double` for field `d`
             --> t.bt:2:56
              |
            2 | BEGIN { print(sizeof(struct has_double)); print(sizeof(struct uses_double)); print(sizeof(struct packed_s)); }
              |                                                        ^^^^^^^^^^^^^^^^^^

            error: struct `packed_s` (foo.h:54) cannot be used: weft does not lay out `__attribute__((packed))` structs
             --> t.bt:2:91
              |
            2 | BEGIN { print(sizeof(struct has_double)); print(sizeof(struct uses_double)); print(sizeof(struct packed_s)); }
              |                                                                                           ^^^^^^^^^^^^^^^

        "#]],
    );
}

#[test]
fn missing_header_names_the_directories_searched() {
    check(
        "#include \"nope.h\"\n#include <nope.h>\nBEGIN { }",
        expect![[r#"
            error: header "nope.h" not found; searched ., /usr/include
             --> t.bt:1:1
              |
            1 | #include "nope.h"
              | ^^^^^^^^^^^^^^^^^

            error: header <nope.h> not found; searched /usr/include
             --> t.bt:2:1
              |
            2 | #include <nope.h>
              | ^^^^^^^^^^^^^^^^^

        "#]],
    );
    let f = Files(
        [("a.h", "#include \"b.h\"\n")]
            .into_iter()
            .map(|(n, t)| (n.to_string(), t.to_string()))
            .collect(),
    );
    let o = Options {
        headers: Some(Arc::new(f)),
        ..Options::default()
    };
    check_with(
        "#include \"a.h\"\nBEGIN { }",
        &o,
        expect![[r#"
        error: header "b.h" (included from a.h:1) not found; searched ., /usr/include
         --> t.bt:1:1
          |
        1 | #include "a.h"
          | ^^^^^^^^^^^^^^

    "#]],
    );
}

#[test]
fn include_after_a_probe_is_an_error() {
    check(
        "#include \"foo.h\"\nBEGIN { }\n#include \"inner.h\"\nEND { }",
        expect![[r#"
            error: `#include` must come before the first probe
             --> t.bt:3:1
              |
            3 | #include "inner.h"
              | ^^^^^^^^^^^^^^^^^^
            note: the first probe
             --> t.bt:2:1
              |
            2 | BEGIN { }
              | ^^^^^^^^^

        "#]],
    );
}

#[test]
fn include_files_from_the_command_line_come_first() {
    let o = Options {
        include_files: vec!["foo.h".into()],
        ..opts()
    };
    check_with(
        "BEGIN { print(RED + GREEN + ARCH); }",
        &o,
        expect![[r#"
        Program
         BEGIN
          call: print :: none
           + :: int64
            + :: int64
             int: 0 :: int64
             int: 5 :: int64
            int: 64 :: int64
    "#]],
    );
}
