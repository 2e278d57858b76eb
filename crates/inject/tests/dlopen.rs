//! Loading a library into a running process with a remote dlopen.

mod common;

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use common::{build, libc_function, maps, wait_in_syscall, Target};
use weft_inject::{inject_library, CallArg, InjectError, StoppedProcess};

const SLEEPER: &str = r#"
#include <stdio.h>
#include <unistd.h>

int main(void) {
    char buf[16];
    printf("ready\n");
    fflush(stdout);
    ssize_t n = read(0, buf, sizeof buf);
    printf("read %zd\n", n);
    fflush(stdout);
    return 0;
}
"#;

const LIBRARY: &str = r#"
int weft_test_loaded;

__attribute__((constructor)) static void weft_test_init(void) { weft_test_loaded = 42; }
"#;

fn sleeper() -> (common::Program, Target) {
    let program = build("sleeper", SLEEPER, &[]);
    let target = Target::start(&program.path, &[]);
    wait_in_syscall(target.pid(), target.pid(), libc::SYS_read);
    (program, target)
}

#[test]
fn dlopen_runs_the_constructor_and_dlsym_finds_its_global() {
    let library = build("libweftprobe.so", LIBRARY, &["-shared", "-fPIC"]);
    let (_program, mut target) = sleeper();
    let pid = target.pid();
    let dlopen = libc_function(pid, "dlopen");
    let dlerror = libc_function(pid, "dlerror");
    let dlsym = libc_function(pid, "dlsym");

    let mut stopped = StoppedProcess::stop(pid).unwrap();
    let tid = stopped.pick_call_thread();
    assert_eq!(tid, pid);
    let handle = inject_library(&mut stopped, tid, dlopen, dlerror, &library.path).unwrap();
    assert_ne!(handle, 0);

    let symbol = b"weft_test_loaded\0";
    let args = [CallArg::Value(handle), CallArg::StackData];
    let global = stopped.call(tid, dlsym, &args, symbol).unwrap().ret;
    assert_ne!(global, 0);
    let mut value = [0u8; 4];
    stopped.read_mem(global, &mut value).unwrap();
    assert_eq!(i32::from_le_bytes(value), 42);
    let mapping = maps(pid)
        .into_iter()
        .find(|m| (m.start..m.end).contains(&global))
        .unwrap();
    assert_eq!(
        Path::new(&mapping.path),
        library.path.canonicalize().unwrap()
    );

    // Loading it again gives the same handle.
    let again = inject_library(&mut stopped, tid, dlopen, dlerror, &library.path).unwrap();
    assert_eq!(again, handle);
    stopped.resume().unwrap();

    target.send_and_close(b"xy");
    assert_eq!(target.line(), "read 2");
    assert_eq!(target.wait(), Some(0));
}

#[test]
fn failed_dlopen_returns_the_dlerror_text() {
    let (_program, mut target) = sleeper();
    let pid = target.pid();
    let dlopen = libc_function(pid, "dlopen");
    let dlerror = libc_function(pid, "dlerror");

    let mut stopped = StoppedProcess::stop(pid).unwrap();
    let path = Path::new("/nonexistent/libweft-missing.so");
    let err = inject_library(&mut stopped, pid, dlopen, dlerror, path).unwrap_err();
    let InjectError::DlopenFailed { message, .. } = &err else {
        panic!("unexpected error: {err}");
    };
    assert_eq!(
        message,
        "/nonexistent/libweft-missing.so: cannot open shared object file: No such file or directory"
    );
    assert_eq!(
        err.to_string(),
        "dlopen(\"/nonexistent/libweft-missing.so\") failed in the target: /nonexistent/libweft-missing.so: cannot open shared object file: No such file or directory"
    );

    let bad = Path::new(OsStr::from_bytes(b"a\0b"));
    let err = inject_library(&mut stopped, pid, dlopen, dlerror, bad).unwrap_err();
    assert!(matches!(err, InjectError::InvalidPath { .. }));
    stopped.resume().unwrap();

    target.send_and_close(b"z");
    assert_eq!(target.line(), "read 1");
}
