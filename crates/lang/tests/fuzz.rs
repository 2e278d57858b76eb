//! Property test: random and mutated programs go through parse + check + lower
//! without a panic. Mutations start from the corpus of valid scripts.

use proptest::prelude::*;
use weft_lang::{compile, render, Options};

mod common;

static CORPUS: std::sync::OnceLock<Vec<(String, String)>> = std::sync::OnceLock::new();

/// 2000 cases per property (a few seconds); `PROPTEST_CASES` overrides.
fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2000)
}

/// Pieces random programs are built from: tokens, keywords, sigils, attach
/// points and broken fragments.
const PIECES: &[&str] = &[
    "BEGIN",
    "END",
    "uprobe:/bin/a:f",
    "uretprobe:/bin/a:f",
    "interval:s:1",
    "kprobe:x",
    "u:",
    "{",
    "}",
    "(",
    ")",
    "[",
    "]",
    ";",
    ",",
    "/",
    "*",
    "+",
    "-",
    "=",
    "==",
    "!=",
    "<",
    "<=",
    ">>=",
    "&&",
    "||",
    "!",
    "~",
    "?",
    ":",
    ".",
    "..",
    "->",
    "++",
    "--",
    "$x",
    "$y",
    "@m",
    "@",
    "$1",
    "$#",
    "0",
    "1",
    "0x10",
    "1e3",
    "\"s\"",
    "\"%d\\n\"",
    "pid",
    "comm",
    "arg0",
    "retval",
    "func",
    "probe",
    "nsecs",
    "ustack",
    "printf",
    "print",
    "count()",
    "sum",
    "hist",
    "lhist",
    "str",
    "exit()",
    "if",
    "else",
    "while",
    "for",
    "unroll",
    "let",
    "return",
    "break",
    "continue",
    "config",
    "macro",
    "struct",
    "enum",
    "(typeof($x))",
    "typeof(",
    "offsetof(struct S, a.b)",
    "enum E { A = 1, B }",
    "(enum E)",
    "comm()",
    "nsecs(boot)",
    "config().max_strlen",
    "strerror(2)",
    "ncpus",
    "usermode",
    "struct S { int a:3, b:4; long c }",
    "struct T { struct U { int x; } u; }",
    "(bool[2])",
    "macro m($x) { $x + 1 } ",
    "m(1 + 2)",
    "true",
    "false",
    "(bool)",
    "$s[0]",
    "__builtin_comm",
    "int32",
    "uint8",
    "(int8)",
    "(struct s *)",
    "sizeof",
    "before",
    "around",
    "seq",
    "cflow",
    "proceed()",
    "#include <x>\n",
    "//c\n",
    "/*",
    "*/",
    "'a'",
    "\n",
    " ",
    "true",
    "ntop",
    "pton(\"1.2.3.4\")",
    "pton(\"fe80::1\")",
    "macaddr",
    "buf",
    "\"%r %rx %rh\"",
    "getopt(\"n\", 1)",
    "getopt",
    "reg(\"sp\")",
    "reg",
    "tseries",
    "tseries(1, 100ms, 5)",
    "tseries(arg0, 1s, 3, \"avg\")",
    "(uint8[8])",
    "(int16[])",
    "(int32 *)arg0 + 1",
    "$p - 1",
    "@p++",
    "@p += 2",
    "struct S { int a; union { int b; char c; }; struct { int x; } in; }",
    "union {",
    "struct B { unsigned int a:3; int b:5; long c:40; }",
    ":3;",
    "struct G { int z[2][3]; char n[2][4]; }",
    "[1][2]",
    "(uint8[])0x0102",
    "(uint64)pton(\"1.2.3.4\")",
    "struct C { char n[4]; uint8_t b[2]; }",
    "*(struct C *)arg0",
    "print(args)",
    "args",
    "pcomm",
    "errorf(\"e %d\", 1)",
    "warnf(\"w %s\", comm)",
];

fn random_program() -> impl Strategy<Value = String> {
    prop::collection::vec(prop::sample::select(PIECES), 0..60).prop_map(|v| v.join(" "))
}

#[derive(Clone, Debug)]
enum Mutation {
    Delete(usize, usize),
    Insert(usize, &'static str),
    Duplicate(usize, usize),
    Truncate(usize),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (any::<usize>(), 1usize..12).prop_map(|(a, n)| Mutation::Delete(a, n)),
        (any::<usize>(), prop::sample::select(PIECES)).prop_map(|(a, p)| Mutation::Insert(a, p)),
        (any::<usize>(), 1usize..20).prop_map(|(a, n)| Mutation::Duplicate(a, n)),
        any::<usize>().prop_map(Mutation::Truncate),
    ]
}

fn boundary(s: &str, i: usize) -> usize {
    let mut i = i % (s.len() + 1);
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

fn apply(mut s: String, muts: &[Mutation]) -> String {
    for m in muts {
        match m {
            Mutation::Delete(a, n) => {
                let a = boundary(&s, *a);
                let b = boundary(&s, (a + n).min(s.len()));
                s.replace_range(a..b.max(a), "");
            }
            Mutation::Insert(a, p) => {
                let a = boundary(&s, *a);
                s.insert_str(a, p);
            }
            Mutation::Duplicate(a, n) => {
                let a = boundary(&s, *a);
                let b = boundary(&s, (a + n).min(s.len())).max(a);
                let piece = s[a..b].to_string();
                s.insert_str(b, &piece);
            }
            Mutation::Truncate(a) => {
                let a = boundary(&s, *a);
                s.truncate(a);
            }
        }
    }
    s
}

fn run(src: &str) {
    for unsafe_ok in [false, true] {
        let opts = Options {
            positional: vec!["7".into(), "x".into()],
            unsafe_ok,
            ..Default::default()
        };
        let out = compile(src, "fuzz.bt", &opts);
        // Rendering must not panic either.
        let _ = render(&out.diagnostics, src, "fuzz.bt");
        if out.program.is_some() {
            assert!(!out.has_errors());
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn random_token_soup_never_panics(src in random_program()) {
        run(&src);
    }

    #[test]
    fn random_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..200)) {
        run(&String::from_utf8_lossy(&bytes));
    }

    #[test]
    fn mutated_corpus_never_panics(index in any::<usize>(), muts in prop::collection::vec(mutation(), 1..6)) {
        let corpus = CORPUS.get_or_init(common::corpus);
        let (_, src) = &corpus[index % corpus.len()];
        run(&apply(src.clone(), &muts));
    }
}
