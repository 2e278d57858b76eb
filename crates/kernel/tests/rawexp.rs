use weft_bpf::{KernelProbe, Options};

fn per_call() -> f64 {
    let t = std::time::Instant::now();
    for _ in 0..2_000_000 {
        // SAFETY: getppid has no preconditions.
        unsafe { libc::syscall(libc::SYS_getppid) };
    }
    t.elapsed().as_nanos() as f64 / 2e6
}

#[test]
#[ignore]
fn raw_floor() {
    let out = weft_lang::compile("uprobe:/bin/true:main { @c = count(); }", "t", &weft_lang::Options::default());
    let prog = out.program.unwrap();
    for (cat, name) in [("", "sys_enter"), ("syscalls", "sys_enter_getppid"), ("raw_syscalls", "sys_enter")] {
        let probes = vec![KernelProbe { body: &prog.probes[0].body, category: cat.into(), name: name.into(), probe_id: 0 }];
        let opts = Options { filter_pids: true, ncpus: 2, cpid: 0, start_ns: 0, realtime_offset_ns: 0, ring_bytes: 1 << 20, max_pids: 64, fork_child_pid_offset: None, user_maps: Default::default() };
        let built = weft_bpf::build(&prog, &probes, &opts).unwrap_or_else(|(_, e)| panic!("{e}"));
        let base: Vec<f64> = (0..3).map(|_| per_call()).collect();
        let k = weft_kernel::probes::KernelProbes::load(&built).unwrap_or_else(|e| panic!("{e}"));
        let with: Vec<f64> = (0..3).map(|_| per_call()).collect();
        drop(k);
        eprintln!("{cat}:{name}: plain {base:?} filtered-out {with:?}");
    }
}
