//! `weft_kernel::tracefs` on the running kernel's tracefs (required: every machine
//! weft's suite runs on has one, and a missing one fails the tests).

use weft_kernel::tracefs::{features, FieldKind, Tracefs};

fn tracefs() -> Option<Tracefs> {
    match Tracefs::find() {
        Ok(t) => Some(t),
        Err(e) => panic!("tracefs is required for these tests: {e}"),
    }
}

#[test]
fn every_format_parses() {
    let Some(fs) = tracefs() else { return };
    let all = fs.tracepoints().unwrap();
    assert!(!all.is_empty());
    let names: Vec<String> = all.iter().map(|t| t.to_string()).collect();
    assert!(
        names.windows(2).all(|w| w[0] < w[1]),
        "sorted, no duplicates"
    );
    for tp in &all {
        match fs.format(tp) {
            Ok(f) => assert_eq!(f.name, tp.name),
            // A few events' formats may not be readable; none may be malformed.
            Err(e @ weft_kernel::tracefs::Error::Malformed { .. }) => panic!("{e}"),
            Err(_) => {}
        }
    }
}

#[test]
fn openat_and_wildcards() {
    let Some(fs) = tracefs() else { return };
    let found = fs.matching("syscalls", "sys_enter_open*").unwrap();
    let names: Vec<String> = found.iter().map(|t| t.to_string()).collect();
    assert!(
        names.contains(&"syscalls:sys_enter_openat".to_string()),
        "{names:?}"
    );
    assert!(names
        .iter()
        .all(|n| n.starts_with("syscalls:sys_enter_open")));
    let f = fs.format(&found[names.iter().position(|n| n.ends_with("openat")).unwrap()]);
    let f = f.unwrap();
    assert_eq!(f.field("filename").unwrap().kind, FieldKind::Pointer);
    assert_eq!(
        fs.matching("sy[s]calls", "sys_enter_opena?").unwrap().len(),
        1
    );
    assert!(fs
        .matching("syscalls", "sys_enter_opnat")
        .unwrap()
        .is_empty());
    assert!(fs.matching("nosuch*", "*").unwrap().is_empty());
    let e = fs
        .format(&weft_kernel::tracefs::Tracepoint {
            category: "syscalls".into(),
            name: "nosuch".into(),
        })
        .unwrap_err();
    assert_eq!(e.to_string(), "no tracepoint syscalls:nosuch");
}

#[test]
fn features_name_tracefs() {
    let Some(fs) = tracefs() else { return };
    let f = features();
    assert_eq!(f.tracefs.as_deref().ok(), Some(fs.root()));
    assert_eq!(
        f.kprobes.is_some(),
        fs.root().join("kprobe_events").exists()
            || std::path::Path::new(weft_kernel::tracefs::KPROBE_PMU).exists()
    );
}
