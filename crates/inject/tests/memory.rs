//! Reading and writing target memory through /proc/PID/mem.

mod common;

use std::os::unix::fs::FileExt;

use common::{build, elf_bytes, elf_symbol, maps, Target};
use weft_inject::{InjectError, MemOp, StoppedProcess};

const VICTIM: &str = r#"
#include <stdio.h>
#include <unistd.h>

__attribute__((noinline)) int victim(int x) { return x * 3 + 1; }

volatile int sink;

int main(void) {
    printf("ready\n");
    fflush(stdout);
    for (;;) {
        sink = victim(sink) & 0xffff;
        usleep(1000);
    }
}
"#;

#[test]
fn write_mem_patches_code_without_changing_its_protection() {
    let program = build("victim", VICTIM, &[]);
    let target = Target::start(&program.path, &[]);
    let pid = target.pid();
    let (link_addr, _) = elf_symbol(&program.path, "victim");
    let addr = target.symbol("victim");
    let page = |pid| {
        maps(pid)
            .into_iter()
            .find(|m| (m.start..m.end).contains(&addr))
            .unwrap()
    };
    assert_eq!(page(pid).perms, "r-xp");

    let stopped = StoppedProcess::stop(pid).unwrap();
    let mut original = [0u8; 16];
    stopped.read_mem(addr, &mut original).unwrap();
    assert_eq!(original.to_vec(), elf_bytes(&program.path, link_addr, 16));

    let patch: Vec<u8> = (0..16).map(|i| 0xc0 + i).collect();
    stopped.write_mem(addr, &patch).unwrap();
    let mut back = [0u8; 16];
    stopped.read_mem(addr, &mut back).unwrap();
    assert_eq!(back.to_vec(), patch);
    // Read back by another route than the handle that wrote.
    let mut direct = [0u8; 16];
    std::fs::File::open(format!("/proc/{pid}/mem"))
        .unwrap()
        .read_exact_at(&mut direct, addr)
        .unwrap();
    assert_eq!(direct.to_vec(), patch);
    assert_eq!(page(pid).perms, "r-xp");

    stopped.write_mem(addr, &original).unwrap();
    stopped.read_mem(addr, &mut back).unwrap();
    assert_eq!(back, original);
    assert_eq!(page(pid).perms, "r-xp");
    stopped.resume().unwrap();

    // The restored code runs: sink keeps changing.
    let sink = target.symbol("sink");
    let first = target.peek(sink, 4);
    assert!(common::eventually(common::CEILING, || target.peek(sink, 4) != first));
}

#[test]
fn unmapped_memory_is_an_error() {
    let program = build("victim", VICTIM, &[]);
    let target = Target::start(&program.path, &[]);
    let pid = target.pid();
    let stopped = StoppedProcess::stop(pid).unwrap();
    let mut buf = [0u8; 8];
    let err = stopped.read_mem(8, &mut buf).unwrap_err();
    assert!(matches!(
        err,
        InjectError::Memory {
            op: MemOp::Read,
            addr: 8,
            len: 8,
            ..
        }
    ));
    assert_eq!(
        err.to_string(),
        format!("cannot read 8 bytes at 0x8 in process {pid}: Input/output error (os error 5)")
    );
    let err = stopped.write_mem(16, &buf).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!("cannot write 8 bytes at 0x10 in process {pid}: Input/output error (os error 5)")
    );
}

#[test]
fn read_c_string_stops_at_nul_and_at_max() {
    let program = build("victim", VICTIM, &[]);
    let target = Target::start(&program.path, &[]);
    let stopped = StoppedProcess::stop(target.pid()).unwrap();
    // Some writable memory: the thread's stack, well below its red zone.
    let at = stopped.threads()[0].regs().rsp - 4096;
    stopped.write_mem(at, b"weft\0rest").unwrap();
    assert_eq!(stopped.read_c_string(at, 100).unwrap(), b"weft");
    assert_eq!(stopped.read_c_string(at, 3).unwrap(), b"wef");
}
