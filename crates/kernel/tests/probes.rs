//! Kernel probes end to end without the session: advice compiled by weft's front
//! end, moved onto a tracepoint, built into eBPF, loaded, attached, and driven by
//! this process's own system calls. Needs root (CI runs as root) and fails without.

use weft_bpf::{KernelProbe, Options};
use weft_ir::Program;
use weft_kernel::probes::KernelProbes;

fn compile(text: &str) -> Program {
    let out = weft_lang::compile(text, "test.bt", &weft_lang::Options::default());
    assert!(
        out.program.is_some(),
        "{text}: {:?}",
        out.diagnostics
            .iter()
            .map(|d| d.message.clone())
            .collect::<Vec<_>>()
    );
    out.program.unwrap()
}

fn load(prog: &Program, filter: bool) -> KernelProbes {
    let probes: Vec<KernelProbe> = prog
        .probes
        .iter()
        .map(|p| KernelProbe {
            body: &p.body,
            category: "syscalls".into(),
            name: "sys_enter_getppid".into(),
            probe_id: 0,
            raw: None,
            system: false,
            uprobe: None,
        })
        .collect();
    let opts = Options {
        filter_pids: filter,
        ncpus: aya::util::nr_cpus().unwrap() as u32,
        cpid: 0,
        start_ns: 0,
        realtime_offset_ns: 0,
        ring_bytes: 1 << 20,
        pid_max: weft_kernel::probes::pid_max(),
        fork_child_pid_offset: None,
        user_maps: Default::default(),
    };
    let built =
        weft_bpf::build(prog, &probes, &opts).unwrap_or_else(|(i, e)| panic!("probe {i}: {e}"));
    match KernelProbes::load(&built) {
        Ok(k) => k,
        Err(e) => panic!("probe {}: {e}", e.probe),
    }
}

/// The tests count this process's system calls: one at a time.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn word(v: &[u8], i: usize) -> u64 {
    u64::from_le_bytes(v[i * 8..i * 8 + 8].try_into().unwrap())
}

/// Sum of word `i` over the CPUs of every entry.
fn total(k: &KernelProbes, map: u32, i: usize) -> u64 {
    k.entries(map)
        .unwrap()
        .iter()
        .flat_map(|(_, per_cpu)| per_cpu.iter().map(|v| word(v, i)))
        .sum()
}

#[test]
fn count_and_sum_in_the_kernel_for_this_process_only() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let prog = compile("uprobe:/bin/true:main { @c = count(); @s = sum(pid); @h = hist(5); }");
    let k = load(&prog, true);
    let me = std::process::id();
    // Nothing counts before this process is in the filter.
    for _ in 0..10 {
        // SAFETY: getppid has no preconditions.
        unsafe { libc::getppid() };
    }
    assert_eq!(total(&k, 0, 0), 0);
    k.add_pid(me).unwrap();
    for _ in 0..1000 {
        // SAFETY: as above.
        unsafe { libc::getppid() };
    }
    assert_eq!(total(&k, 0, 0), 1000);
    assert_eq!(total(&k, 1, 0), 1000 * u64::from(me));
    // hist(5): bucket of 5 is 2 + floor(log2 5) = 4.
    let h: Vec<u64> = (0..66).map(|b| total(&k, 2, b)).collect();
    assert_eq!(h[weft_abi::hist_index(5, 0)], 1000);
    assert_eq!(h.iter().sum::<u64>(), 1000);
}

#[test]
fn keyed_maps_strings_and_events() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let prog = compile(
        r#"uprobe:/bin/true:main { @[comm, tid] = count(); @last = nsecs; if (comm == "nosuch") { @no = 1; } printf("%d %s\n", pid, comm); }"#,
    );
    let k = load(&prog, true);
    k.add_pid(std::process::id()).unwrap();
    let t = std::thread::Builder::new()
        .name("kprobes-t".into())
        .spawn(|| {
            for _ in 0..7 {
                // SAFETY: getppid has no preconditions.
                unsafe { libc::getppid() };
            }
            // SAFETY: gettid has no preconditions.
            unsafe { libc::gettid() as u32 }
        })
        .unwrap();
    let tid = t.join().unwrap();
    let entries = k.entries(0).unwrap();
    assert_eq!(entries.len(), 1, "one key: (comm, tid)");
    let (key, per_cpu) = &entries[0];
    assert_eq!(&key[..9], b"kprobes-t");
    assert!(key[9..16].iter().all(|&b| b == 0));
    // The key is a tuple (string[16], u64? no: tid is u32) laid out naturally.
    let tid_off = key.len() - 8;
    assert_eq!(
        u32::from_le_bytes(key[tid_off..tid_off + 4].try_into().unwrap()),
        tid
    );
    assert_eq!(per_cpu.iter().map(|v| word(v, 0)).sum::<u64>(), 7);
    assert!(k.entries(2).unwrap().is_empty(), "@no never set");
    let mut events = 0;
    let mut k = k;
    k.drain(|rec| {
        assert!(rec.len() >= 32);
        assert_eq!(
            u32::from_le_bytes(rec[4..8].try_into().unwrap()),
            weft_abi::EVENT_PRINTF
        );
        events += 1;
    });
    assert_eq!(events, 7);
}
