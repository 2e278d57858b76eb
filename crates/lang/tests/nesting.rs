//! Deeply nested programs: the front end refuses them with one located error
//! (never a stack overflow), and accepts the deepest programs it allows on a
//! modest stack. Every shape of nesting the grammar has is covered.

use weft_lang::{compile, parser::MAX_NESTING, Options};

/// A program builder: the program nested `n` levels deep.
type Builder = fn(usize) -> String;

/// Each shape, built `n` levels deep.
fn shapes() -> Vec<(&'static str, Builder)> {
    vec![
        ("nested struct members", |n| {
            format!(
                "struct S {{ {}int a; {} }} BEGIN {{ @x = 1; }}",
                "struct { ".repeat(n),
                "} m; ".repeat(n)
            )
        }),
        ("parentheses", |n| {
            format!("BEGIN {{ @x = {}1{}; }}", "(".repeat(n), ")".repeat(n))
        }),
        ("unary operators", |n| {
            format!("BEGIN {{ @x = {}1; }}", "- ".repeat(n))
        }),
        ("casts", |n| {
            format!("BEGIN {{ @x = {}1; }}", "(int32)".repeat(n))
        }),
        ("binary chain", |n| {
            format!("BEGIN {{ @x = 1{}; }}", "+1".repeat(n))
        }),
        ("nested chains", |n| {
            format!("BEGIN {{ @x = {}1{}; }}", "(1+".repeat(n), "+1)".repeat(n))
        }),
        ("ternaries", |n| {
            format!("BEGIN {{ @x = {}3; }}", "1 ? 2 : ".repeat(n))
        }),
        ("if blocks", |n| {
            format!(
                "BEGIN {{ {}@x = 1; {} }}",
                "if (1) { ".repeat(n),
                "}".repeat(n)
            )
        }),
        ("else if chain", |n| {
            format!(
                "BEGIN {{ if (0) {{ }} {} }}",
                "else if (0) { @x = 1; } ".repeat(n)
            )
        }),
        ("blocks", |n| {
            format!("BEGIN {{ {}@x = 1; {} }}", "{ ".repeat(n), "}".repeat(n))
        }),
        ("block expressions", |n| {
            format!("BEGIN {{ @x = {}1{}; }}", "{ ".repeat(n), " }".repeat(n))
        }),
        ("map keys", |n| {
            format!(
                "BEGIN {{ @a[1] = 1; @x = {}1{}; }}",
                "@a[".repeat(n),
                "]".repeat(n)
            )
        }),
        ("calls", |n| {
            format!(
                "BEGIN {{ @x = {}\"a\"{}; }}",
                "str(".repeat(n),
                ")".repeat(n)
            )
        }),
        ("tuple fields", |n| {
            format!("BEGIN {{ $t = (1, 2); @x = $t{}; }}", ".0".repeat(n))
        }),
        ("loops", |n| {
            format!(
                "BEGIN {{ $i = 0; {}$i++; {} }}",
                "while ($i < 1) { ".repeat(n),
                "}".repeat(n)
            )
        }),
        ("seq blocks", |n| {
            format!(
                "{}BEGIN {{ @x = 1; }}{}",
                "seq { ".repeat(n),
                " }".repeat(n)
            )
        }),
    ]
}

fn too_deep(src: &str) -> bool {
    compile(src, "t.bt", &Options::default())
        .diagnostics
        .iter()
        .any(|d| d.message.contains("nests too deeply"))
}

/// 50,000 levels of each shape: one error, located inside the text, nothing else.
#[test]
fn far_too_deep_gives_one_error() {
    for (name, build) in shapes() {
        let src = build(50_000);
        let src2 = src.clone();
        let out = std::thread::Builder::new()
            .stack_size(8 << 20)
            .spawn(move || compile(&src2, "t.bt", &Options::default()))
            .unwrap()
            .join()
            .unwrap_or_else(|_| panic!("{name}: the front end panicked"));
        let errors: Vec<_> = out.diagnostics.iter().filter(|d| d.is_error()).collect();
        assert_eq!(errors.len(), 1, "{name}: {:?}", out.diagnostics);
        assert!(
            errors[0].message.contains("nests too deeply"),
            "{name}: {}",
            errors[0].message
        );
        assert!((errors[0].span.start as usize) < src.len(), "{name}");
        assert!(out.program.is_none(), "{name}");
    }
}

/// The deepest program of each shape the parser accepts goes through every stage
/// on an 8 MiB stack (the main thread's usual size; weft gives its front end
/// more), and real nesting (20 levels) is never refused.
#[test]
fn the_deepest_accepted_programs_compile() {
    // Searching runs the parser at the limit too: give it the same stack.
    std::thread::Builder::new()
        .stack_size(8 << 20)
        .spawn(deepest_accepted_programs)
        .unwrap()
        .join()
        .unwrap();
}

fn deepest_accepted_programs() {
    for (name, build) in shapes() {
        assert!(!too_deep(&build(20)), "{name}: 20 levels refused");
        let deepest = (20..=MAX_NESTING as usize + 1)
            .take_while(|&n| !too_deep(&build(n)))
            .last()
            .unwrap();
        assert!(too_deep(&build(deepest + 1)), "{name}");
        let src = build(deepest);
        let out = std::thread::Builder::new()
            .stack_size(8 << 20)
            .spawn(move || compile(&src, "t.bt", &Options::default()))
            .unwrap()
            .join()
            .unwrap_or_else(|_| panic!("{name}: the front end panicked"));
        assert!(
            out.diagnostics.iter().all(|d| !d.message.contains("nests")),
            "{name} at {deepest}: {:?}",
            out.diagnostics
        );
    }
}

/// Macros calling macros stack their bodies: too tall a result is refused after
/// expansion.
#[test]
fn nested_macro_expansion_is_bounded() {
    let body = format!("{}x{}", "(1 + ".repeat(40), ")".repeat(40));
    let mut src = String::new();
    src.push_str(&format!("macro m0(x) {{ {body} }}\n"));
    for i in 1..32 {
        src.push_str(&format!("macro m{i}(x) {{ m{}({body}) }}\n", i - 1));
    }
    src.push_str("BEGIN { @x = m31(1); }");
    let out = std::thread::Builder::new()
        .stack_size(8 << 20)
        .spawn(move || compile(&src, "t.bt", &Options::default()))
        .unwrap()
        .join()
        .expect("the front end panicked");
    assert!(
        out.diagnostics
            .iter()
            .any(|d| d.message.contains("nests the program too deeply")),
        "{:?}",
        out.diagnostics
    );
}

/// A NUL byte (which only a file can hold) is one located error.
#[test]
fn nul_byte_is_one_located_error() {
    let out = compile("BEGIN {\n @x \0= 1; }", "t.bt", &Options::default());
    assert_eq!(out.diagnostics.len(), 1, "{:?}", out.diagnostics);
    assert!(out.diagnostics[0].message.contains("NUL"));
    assert_eq!(out.diagnostics[0].span.start, 12);
}
