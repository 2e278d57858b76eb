//! The SystemTap front end's translation: what a script becomes before the checker.

use weft_lang::stap::{compile, StapOptions};
use weft_lang::{Options, Stage};

fn translated(src: &str, sopts: &StapOptions) -> String {
    let opts = Options {
        dump: vec![Stage::Parse],
        ..Options::default()
    };
    let out = compile(src, "t.stp", &opts, sopts);
    let errors: Vec<&str> = out
        .diagnostics
        .iter()
        .filter(|d| d.is_error())
        .map(|d| d.message.as_str())
        .collect();
    assert!(errors.is_empty(), "{errors:?}");
    assert!(out.program.is_some());
    out.dumps[0].1.clone()
}

#[test]
fn a_global_only_added_to_is_a_sum_and_target_is_the_pid() {
    let d = translated(
        "global n, m\nprobe process(\"/bin/true\").function(\"main\") { n[pid()] += 2; m = target() }",
        &StapOptions {
            target_pid: Some(42),
            ..Default::default()
        },
    );
    assert!(d.contains("uprobe:/bin/true:main"), "{d}");
    assert!(d.contains("call: sum"), "{d}");
    assert!(d.contains("int: 42"), "{d}");
}

#[test]
fn functions_are_inlined_and_stats_are_hidden_maps() {
    let d = translated(
        "global s\nfunction sq(x) { return x * x }\nprobe begin { s <<< sq(3); printf(\"%d\\n\", @max(s)) }",
        &StapOptions::default(),
    );
    assert!(d.contains("@__s_max"), "{d}");
    assert!(!d.contains("call: sq"), "{d}");
}

#[test]
fn kernel_probe_points_are_refused_at_their_text() {
    let out = compile(
        "probe kernel.function(\"do_sys_open\") { }",
        "t.stp",
        &Options::default(),
        &StapOptions::default(),
    );
    let d = &out.diagnostics[0];
    assert!(
        d.message.contains("is a kernel probe point"),
        "{}",
        d.message
    );
    assert_eq!((d.span.start, d.span.end), (6, 36));
}
