//! Every script in `tests/corpus/` compiles without a diagnostic.

mod common;

use weft_lang::{compile, render, Options};

#[test]
fn corpus_compiles_cleanly() {
    let scripts = common::corpus();
    assert!(scripts.len() >= 60, "corpus has {} scripts", scripts.len());
    let opts = Options {
        positional: vec!["1234".into()],
        ..Default::default()
    };
    let mut failures = String::new();
    for (name, src) in &scripts {
        let out = compile(src, name, &opts);
        if !out.diagnostics.is_empty() || out.program.is_none() {
            failures.push_str(&format!(
                "=== {name}\n{}",
                render(&out.diagnostics, src, name)
            ));
        }
    }
    assert!(failures.is_empty(), "{failures}");
}
