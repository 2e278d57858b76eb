//! Stopping and resuming real processes.

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::{build, eventually, task_state, tasks, Target, CEILING};
use weft_inject::{process, InjectError, StopKind, StoppedProcess};

const COUNTERS: &str = r#"
#include <pthread.h>
#include <stdio.h>
#include <unistd.h>

volatile unsigned long counters[4];

static void *work(void *arg) {
    long i = (long)arg;
    for (;;) counters[i]++;
    return 0;
}

int main(void) {
    pthread_t t[4];
    for (long i = 0; i < 4; i++) pthread_create(&t[i], 0, work, (void *)i);
    /* Every worker has counted at least once before we say ready. */
    for (int i = 0; i < 4; i++) while (counters[i] == 0) usleep(100);
    printf("ready\n");
    fflush(stdout);
    for (;;) pause();
}
"#;

fn read_counters(stopped: &StoppedProcess, addr: u64) -> [u64; 4] {
    let mut buf = [0u8; 32];
    stopped.read_mem(addr, &mut buf).unwrap();
    std::array::from_fn(|i| u64::from_le_bytes(buf[i * 8..i * 8 + 8].try_into().unwrap()))
}

#[test]
fn stop_freezes_every_thread_and_resume_releases_them() {
    let program = build("counters", COUNTERS, &[]);
    let target = Target::start(&program.path, &[]);
    let pid = target.pid();
    let counters = target.symbol("counters");

    let stopped = StoppedProcess::stop(pid).unwrap();
    let tids: Vec<i32> = stopped.threads().iter().map(|t| t.tid()).collect();
    assert_eq!(tids.len(), 5);
    assert_eq!(tids[0], pid);
    assert_eq!(
        tids.iter().copied().collect::<BTreeSet<_>>(),
        tasks(pid).into_iter().collect()
    );
    for thread in stopped.threads() {
        assert_eq!(thread.stop_kind(), StopKind::Interrupted);
        assert_eq!(
            task_state(pid, thread.tid()),
            Some('t'),
            "thread {}",
            thread.tid()
        );
    }

    let before = read_counters(&stopped, counters);
    std::thread::sleep(Duration::from_millis(50));
    let after = read_counters(&stopped, counters);
    assert_eq!(before, after);
    assert!(before.iter().all(|&c| c > 0));

    let paused = stopped.resume().unwrap();
    assert!(paused >= Duration::from_millis(50), "paused {paused:?}");

    let all_moved = eventually(CEILING, || {
        let now = target.peek_u64s(counters, 4);
        now.iter().zip(after).all(|(&n, a)| n > a)
    });
    assert!(all_moved, "not every thread runs again after resume");
    assert!(eventually(CEILING, || tasks(pid)
        .iter()
        .all(|&t| task_state(pid, t) != Some('t'))));
}

#[test]
fn dropping_the_stopped_process_resumes_it() {
    let program = build("counters", COUNTERS, &[]);
    let target = Target::start(&program.path, &[]);
    let counters = target.symbol("counters");
    let frozen = {
        let stopped = StoppedProcess::stop(target.pid()).unwrap();
        read_counters(&stopped, counters)
    };
    let moved = eventually(CEILING, || {
        target
            .peek_u64s(counters, 4)
            .iter()
            .zip(frozen)
            .all(|(&n, f)| n > f)
    });
    assert!(moved);
}

#[test]
fn process_stopped_by_sigstop_stays_stopped_after_resume() {
    let program = build("counters", COUNTERS, &[]);
    let target = Target::start(&program.path, &[]);
    let pid = target.pid();
    let counters = target.symbol("counters");
    // SAFETY: kill(2) with a valid signal on our own child.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGSTOP) }, 0);
    assert!(eventually(CEILING, || tasks(pid)
        .iter()
        .all(|&t| task_state(pid, t) == Some('T'))));

    let stopped = StoppedProcess::stop(pid).unwrap();
    assert_eq!(stopped.threads().len(), 5);
    for thread in stopped.threads() {
        let kind = thread.stop_kind();
        assert_eq!(
            kind,
            StopKind::GroupStop {
                signal: libc::SIGSTOP
            }
        );
        assert_eq!(thread.pending_signals(), Vec::<i32>::new());
    }
    stopped.resume().unwrap();

    assert!(eventually(CEILING, || tasks(pid)
        .iter()
        .all(|&t| task_state(pid, t) == Some('T'))));
    let frozen = target.peek_u64s(counters, 4);
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(target.peek_u64s(counters, 4), frozen);
    assert_eq!(task_state(pid, pid), Some('T'));

    // SAFETY: as above.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGCONT) }, 0);
    assert!(eventually(CEILING, || {
        target
            .peek_u64s(counters, 4)
            .iter()
            .zip(&frozen)
            .all(|(n, f)| n > f)
    }));
}

#[test]
fn remote_call_in_a_stopped_process_leaves_it_stopped() {
    let program = build("counters", COUNTERS, &[]);
    let target = Target::start(&program.path, &[]);
    let pid = target.pid();
    let counters = target.symbol("counters");
    let getpid = common::libc_function(pid, "getpid");
    // SAFETY: kill(2) with a valid signal on our own child.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGSTOP) }, 0);
    assert!(eventually(CEILING, || tasks(pid)
        .iter()
        .all(|&t| task_state(pid, t) == Some('T'))));

    let mut stopped = StoppedProcess::stop(pid).unwrap();
    let worker = stopped.threads()[1].tid();
    let result = stopped.call(worker, getpid, &[], &[]).unwrap();
    assert_eq!(result.ret, pid as u64);
    stopped.resume().unwrap();

    assert!(eventually(CEILING, || tasks(pid)
        .iter()
        .all(|&t| task_state(pid, t) == Some('T'))));
    let frozen = target.peek_u64s(counters, 4);
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(target.peek_u64s(counters, 4), frozen);
    // SAFETY: as above.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGCONT) }, 0);
}

const MAIN_EXITS: &str = r#"
#include <pthread.h>
#include <stdio.h>

volatile unsigned long spins;

static void *work(void *arg) { for (;;) spins++; return arg; }

int main(void) {
    pthread_t t;
    pthread_create(&t, 0, work, 0);
    while (spins == 0) {}
    printf("ready\n");
    fflush(stdout);
    pthread_exit(0);
}
"#;

#[test]
fn process_whose_main_thread_exited_is_stopped_through_its_other_threads() {
    let program = build("main_exits", MAIN_EXITS, &[]);
    let target = Target::start(&program.path, &[]);
    let pid = target.pid();
    assert!(eventually(CEILING, || task_state(pid, pid) == Some('Z')));
    let spins = target.symbol("spins");
    let worker = *tasks(pid).iter().find(|&&t| t != pid).unwrap();

    let mut stopped = StoppedProcess::stop(pid).unwrap();
    let held: Vec<i32> = stopped.threads().iter().map(|t| t.tid()).collect();
    assert_eq!(held, vec![worker]);
    assert_eq!(stopped.pick_call_thread(), worker);
    let mut before = [0u8; 8];
    stopped.read_mem(spins, &mut before).unwrap();
    std::thread::sleep(Duration::from_millis(20));
    let mut after = [0u8; 8];
    stopped.read_mem(spins, &mut after).unwrap();
    assert_eq!(before, after);
    let getpid = common::libc_function(pid, "getpid");
    assert_eq!(
        stopped.call(worker, getpid, &[], &[]).unwrap().ret,
        pid as u64
    );
    stopped.resume().unwrap();

    let frozen = u64::from_le_bytes(after);
    assert!(eventually(CEILING, || target.peek_u64s(spins, 1)[0] > frozen));
}

const VFORK: &str = r#"
#include <stdio.h>
#include <unistd.h>

int main(void) {
    printf("ready\n");
    fflush(stdout);
    /* The parent waits, killable but not interruptible, until the child exits: when
       the test closes the pipe on stdin (or the parent is killed and the pipe goes). */
    if (vfork() == 0) {
        char c;
        (void)!read(0, &c, 1);
        _exit(0);
    }
    for (;;) pause();
}
"#;

#[test]
fn thread_that_cannot_stop_times_out() {
    let program = build("vfork", VFORK, &[]);
    let target = Target::start(&program.path, &[]);
    let pid = target.pid();
    assert!(eventually(CEILING, || task_state(pid, pid) == Some('D')));

    let started = std::time::Instant::now();
    let err = StoppedProcess::stop_within(pid, Duration::from_millis(300))
        .err()
        .unwrap();
    let elapsed = started.elapsed();
    assert_eq!(
        err.to_string(),
        format!("timed out after 300 ms waiting for every thread to stop (process {pid})")
    );
    // The budget, plus the grace period spent waiting to detach the thread (100 ms),
    // plus room for a slow, busy machine: what this bounds is a stop that ignores its
    // budget.
    assert!(elapsed < Duration::from_secs(10), "took {elapsed:?}");
}

const SPAWNER: &str = r#"
#include <pthread.h>
#include <stdio.h>

static void *brief(void *arg) {
    volatile int spin = 0;
    while (spin < 1000) spin++;
    return arg;
}

int main(void) {
    printf("ready\n");
    fflush(stdout);
    for (;;) {
        pthread_t t;
        if (pthread_create(&t, 0, brief, 0) == 0) pthread_detach(t);
    }
}
"#;

#[test]
fn threads_created_while_stopping_are_stopped_too() {
    let program = build("spawner", SPAWNER, &[]);
    let target = Target::start(&program.path, &[]);
    let pid = target.pid();
    let mut caught_late = 0;
    for _ in 0..40 {
        let stopped = StoppedProcess::stop(pid).unwrap();
        let held: BTreeSet<i32> = stopped.threads().iter().map(|t| t.tid()).collect();
        assert!(held.contains(&pid));
        // Every task that is still alive is one we hold, in a tracing stop.
        for tid in tasks(pid) {
            match task_state(pid, tid) {
                Some('t') => assert!(held.contains(&tid), "task {tid} stopped but not held"),
                None | Some('Z' | 'X') => {}
                Some(state) => panic!("task {tid} is running (state {state}) while stopped"),
            }
        }
        for &tid in &held {
            assert_eq!(task_state(pid, tid), Some('t'));
        }
        let stats = stopped.stats();
        caught_late += stats.clones_caught + stats.rounds - 1;
        stopped.resume().unwrap();
        std::thread::sleep(Duration::from_millis(2));
    }
    assert!(caught_late > 0, "no stop saw a thread created during it");
}

#[test]
fn nonexistent_pid_is_no_such_process() {
    let err = StoppedProcess::stop(i32::MAX).err().unwrap();
    assert!(matches!(err, InjectError::NoSuchProcess { pid: i32::MAX }));
    assert_eq!(err.to_string(), "no such process: 2147483647");
}

#[test]
fn thread_id_is_not_a_process() {
    let program = build("counters", COUNTERS, &[]);
    let target = Target::start(&program.path, &[]);
    let pid = target.pid();
    let tid = *tasks(pid).iter().find(|&&t| t != pid).unwrap();
    let err = StoppedProcess::stop(tid).err().unwrap();
    assert_eq!(
        err.to_string(),
        format!("{tid} is a thread of process {pid}, not a process")
    );
}

#[test]
fn zombie_is_reported() {
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let pid = child.id() as i32;
    assert!(eventually(CEILING, || task_state(pid, pid) == Some('Z')));
    let err = StoppedProcess::stop(pid).err().unwrap();
    assert!(matches!(err, InjectError::Zombie { .. }), "{err}");
    assert_eq!(
        err.to_string(),
        format!("process {pid} is a zombie: it has exited and its parent has not reaped it")
    );
    child.wait().unwrap();
}

const SHORT_LIVED: &str = r#"
#include <pthread.h>

static void *nothing(void *arg) { return arg; }

int main(void) {
    pthread_t t[8];
    for (int i = 0; i < 8; i++) pthread_create(&t[i], 0, nothing, 0);
    return 0;
}
"#;

#[test]
fn process_exiting_while_being_stopped() {
    let program = build("short", SHORT_LIVED, &[]);
    let (mut stopped_alive, mut exited, mut zombie) = (0, 0, 0);
    for i in 0..30 {
        let mut child = std::process::Command::new(&program.path).spawn().unwrap();
        let pid = child.id() as i32;
        // Spread the stops over the target's short life.
        std::thread::sleep(Duration::from_micros(i * 100));
        match StoppedProcess::stop(pid) {
            Ok(stopped) => {
                stopped_alive += 1;
                for thread in stopped.threads() {
                    assert_eq!(task_state(pid, thread.tid()), Some('t'));
                }
                stopped.resume().unwrap();
            }
            Err(InjectError::TargetExited { pid: p }) => {
                assert_eq!(p, pid);
                exited += 1;
            }
            Err(InjectError::Zombie { pid: p }) => {
                assert_eq!(p, pid);
                zombie += 1;
            }
            Err(e) => panic!("unexpected error: {e}"),
        }
        // The tracer may have reaped the exit status already.
        let _ = child.wait();
    }
    // Informational: how the races went.
    eprintln!("short-lived processes: {stopped_alive} stopped, {exited} exited while stopping, {zombie} zombies");
}

#[test]
fn already_traced_names_the_tracer() {
    let program = build("counters", COUNTERS, &[]);
    let target = Target::start(&program.path, &[]);
    let pid = target.pid();
    let stopped = StoppedProcess::stop(pid).unwrap();
    // A second tracer: another thread of this process.
    let err = std::thread::spawn(move || StoppedProcess::stop(pid).err().unwrap())
        .join()
        .unwrap();
    let me = std::process::id();
    let name = process::comm(me as i32).unwrap();
    assert_eq!(
        err.to_string(),
        format!("cannot attach to process {pid}: permission denied: already traced by process {me} ({name})")
    );
    stopped.resume().unwrap();
}

const AS_OTHER_USER: &str = "WEFT_INJECT_TEST_STOP_AS_NOBODY";

/// Not a test on its own: run by `other_user_is_permission_denied` as uid 65534.
#[test]
fn helper_stop_as_other_user() {
    if let Ok(pid) = std::env::var(AS_OTHER_USER) {
        let err = StoppedProcess::stop(pid.parse().unwrap()).err().unwrap();
        println!("ERROR: {err}");
    }
}

#[test]
fn other_user_is_permission_denied() {
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::CommandExt;

    let program = build("counters", COUNTERS, &[]);
    let target = Target::start(&program.path, &[]);
    let pid = target.pid();
    // A copy of this test binary that uid 65534 may run.
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let exe = dir.path().join("helper");
    std::fs::copy(std::env::current_exe().unwrap(), &exe).unwrap();
    std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).unwrap();
    let run = || {
        std::process::Command::new(&exe)
            .args([
                "--exact",
                "helper_stop_as_other_user",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(AS_OTHER_USER, pid.to_string())
            .uid(65534)
            .gid(65534)
            .output()
    };
    // ETXTBSY: a process another test forked meanwhile may still hold the copy's
    // write descriptor until it execs.
    let mut attempts = 0;
    let out = loop {
        match run() {
            Err(e) if e.raw_os_error() == Some(libc::ETXTBSY) && attempts < 100 => {
                attempts += 1;
                std::thread::sleep(Duration::from_millis(10));
            }
            other => break other.unwrap(),
        }
    };
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout
        .lines()
        .find_map(|l| Some(l.split_once("ERROR: ")?.1))
        .unwrap_or_else(|| panic!("helper printed no error:\n{stdout}"));
    assert_eq!(
        line,
        format!("cannot attach to process {pid}: permission denied: target runs as uid 0 and weft as uid 65534, without CAP_SYS_PTRACE")
    );
}

const CLONE_VM_CHILD: &str = r#"
#define _GNU_SOURCE
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <stdio.h>
#include <sys/mman.h>
#include <unistd.h>

volatile unsigned long counters[4];
volatile int child_pid;

static int child(void *arg) {
    (void)arg;
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    for (;;) counters[1]++;
    return 0;
}

int main(void) {
    char *stack = mmap(0, 1 << 16, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    child_pid = clone(child, stack + (1 << 16), CLONE_VM, 0);
    while (counters[1] == 0) usleep(100);
    printf("ready\n");
    fflush(stdout);
    for (;;) { counters[0]++; usleep(100); }
}
"#;

#[test]
fn stop_holds_a_clone_vm_child_sharing_the_memory() {
    let program = build("clone_vm_child", CLONE_VM_CHILD, &[]);
    let target = Target::start(&program.path, &[]);
    let pid = target.pid();
    let counters = target.symbol("counters");
    let child = target.peek_u64s(target.symbol("child_pid"), 1)[0] as u32 as i32;
    assert!(child > 0 && child != pid);

    let stopped = StoppedProcess::stop(pid).unwrap();
    assert_eq!(stopped.sharers(), vec![child]);
    assert!(stopped.threads().iter().any(|t| t.tid() == child));
    assert_eq!(stopped.tgid_of(child), child);
    assert_eq!(stopped.tgid_of(pid), pid);
    assert_ne!(stopped.pick_call_thread(), child);
    assert_eq!(task_state(child, child), Some('t'));
    let before = read_counters(&stopped, counters);
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(before, read_counters(&stopped, counters));
    stopped.resume().unwrap();

    let moved = eventually(CEILING, || target.peek_u64s(counters, 2)[1] > before[1]);
    assert!(
        moved,
        "the clone(CLONE_VM) child does not run again after resume"
    );
    // SAFETY: killing the child we made the target make.
    unsafe { libc::kill(child, libc::SIGKILL) };
}

const HELD_TRAP: &str = r#"
#include <signal.h>
#include <stdio.h>
#include <unistd.h>

volatile unsigned long traps, spins, n;

static void on_trap(int sig) { (void)sig; traps++; }

/* The test points the thread here: an int3 (its SIGTRAP is what the tracer holds),
 * then on to after(). */
__asm__(".text\n.globl gadget\n.type gadget, @function\ngadget:\n  int3\n  jmp after\n"
        ".size gadget, .-gadget\n");

/* write(2), not stdio: main may have been stopped anywhere, in stdio too. */
__attribute__((used, noreturn)) void after(void) {
    const char *m = traps == 1 ? "trapped\n" : "lost the trap\n";
    if (write(1, m, traps == 1 ? 8 : 14)) {}
    for (;;) n++;
}

int main(void) {
    signal(SIGTRAP, on_trap);
    printf("ready\n");
    fflush(stdout);
    for (;;) spins++;
}
"#;

/// In a forked child: seize the main thread of `pid`, send it to `gadget` (an
/// int3) and let it trap, leaving its signal-delivery-stop unreported; stop the
/// process (which finds that stop), then die holding it.
fn tracer_dying_holding_a_trap(pid: i32, gadget: u64) -> ! {
    // SAFETY: ptrace and waitpid on our tracee with valid pointers; this child
    // process does nothing else before it dies.
    unsafe {
        let mut st = 0;
        let none = std::ptr::null_mut::<libc::c_void>();
        if libc::ptrace(libc::PTRACE_SEIZE, pid, none, none) != 0
            || libc::ptrace(libc::PTRACE_INTERRUPT, pid, none, none) != 0
            || libc::waitpid(pid, &mut st, libc::__WALL) != pid
        {
            libc::_exit(1);
        }
        let mut regs: libc::user_regs_struct = std::mem::zeroed();
        libc::ptrace(libc::PTRACE_GETREGS, pid, none, &mut regs as *mut _);
        regs.rsp = ((regs.rsp - 4096) & !15) - 8;
        regs.rip = gadget;
        regs.orig_rax = u64::MAX;
        libc::ptrace(libc::PTRACE_SETREGS, pid, none, &regs as *const _);
        libc::ptrace(libc::PTRACE_CONT, pid, none, none);
    }
    std::thread::sleep(Duration::from_millis(100));
    let stopped = StoppedProcess::stop(pid).unwrap_or_else(|_| {
        // SAFETY: leaving the forked child.
        unsafe { libc::_exit(2) }
    });
    std::mem::forget(stopped);
    // SAFETY: dying as a killed weft would: no detach, no cleanup.
    unsafe {
        libc::kill(libc::getpid(), libc::SIGKILL);
        libc::_exit(3)
    }
}

#[test]
fn an_int3_trap_held_by_a_tracer_that_dies_is_not_lost() {
    // A tracer's exit lets a thread in a signal-delivery-stop go without its signal.
    // Held so, an int3's SIGTRAP would be lost and the thread run on from the byte
    // after the int3 (the middle of the instruction an int3 site replaced): a stop
    // puts such a thread back on the int3 instead, to trap again.
    let program = build("held_trap", HELD_TRAP, &[]);
    let mut target = Target::start(&program.path, &[]);
    let pid = target.pid();
    let gadget = target.function("gadget");
    // SAFETY: the child runs tracer_dying_holding_a_trap only, and never returns.
    let child = unsafe { libc::fork() };
    if child == 0 {
        tracer_dying_holding_a_trap(pid, gadget.start);
    }
    let mut st = 0;
    // SAFETY: waiting for our own child.
    assert_eq!(unsafe { libc::waitpid(child, &mut st, 0) }, child);
    assert!(
        libc::WIFSIGNALED(st) && libc::WTERMSIG(st) == libc::SIGKILL,
        "the tracer did not get to die holding the trap (status {st:#x})"
    );
    assert_eq!(target.line(), "trapped");
    assert_eq!(task_state(pid, pid).map(|s| s != 'Z'), Some(true));
}
