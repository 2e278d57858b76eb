//! Calling functions inside a stopped target.

mod common;

use std::time::Duration;

use common::{build, wait_in_syscall, Program, Target};
use weft_inject::{AbandonedCall, CallArg, InjectError, StopKind, StoppedProcess};

/// Blocks in read(0) on a pipe; prints what it read and how many SIGUSR1 it got.
const READER: &str = r#"
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

volatile long usr1_count;
volatile int usr1_raised_by_self;
volatile unsigned long worker_spins;

static void on_usr1(int sig, siginfo_t *info, void *context) {
    (void)sig; (void)context;
    usr1_count++;
    usr1_raised_by_self = info->si_code == SI_TKILL && info->si_pid == getpid();
}

long add3(long a, long b, long c) { return a + b + c; }

long sum_bytes(const unsigned char *p, long n) {
    long s = 0;
    for (long i = 0; i < n; i++) s += p[i];
    return s;
}

long raise_usr1(void) { raise(SIGUSR1); return 5; }

void spin_forever(void) { for (;;) {} }

long crash(void) { return *(volatile long *)8; }

void bye(void) { _exit(7); }

static void *work(void *arg) { for (;;) worker_spins++; return arg; }

long start_worker(void) {
    pthread_t t;
    return pthread_create(&t, 0, work, 0);
}

int main(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_usr1;
    sa.sa_flags = SA_RESTART | SA_SIGINFO;
    sigaction(SIGUSR1, &sa, 0);
    printf("ready\n");
    fflush(stdout);
    char buf[64];
    ssize_t n = read(0, buf, sizeof buf);
    if (n < 0) {
        printf("read failed: %s\n", strerror(errno));
        return 1;
    }
    printf("read %.*s usr1=%ld%s\n", (int)n, buf, usr1_count,
           usr1_raised_by_self ? " raised by itself" : "");
    fflush(stdout);
    return 0;
}
"#;

fn reader() -> (Program, Target) {
    let program = build("reader", READER, &[]);
    let target = Target::start(&program.path, &[]);
    wait_in_syscall(target.pid(), target.pid(), libc::SYS_read);
    (program, target)
}

/// Feeds the target's read and checks it completed normally.
fn finish(target: Target, usr1: i64) {
    finish_with(target, &format!("read hello usr1={usr1}"));
}

fn finish_with(mut target: Target, expected: &str) {
    target.send_and_close(b"hello");
    assert_eq!(target.line(), expected);
    assert_eq!(target.wait(), Some(0));
}

#[test]
fn call_in_a_thread_blocked_in_read_then_the_read_restarts() {
    let (_program, target) = reader();
    let pid = target.pid();
    let add3 = target.symbol("add3");

    let mut stopped = StoppedProcess::stop(pid).unwrap();
    assert_eq!(stopped.pick_call_thread(), pid);
    let thread = stopped.thread(pid).unwrap();
    assert!(thread.in_syscall());
    assert_eq!(thread.regs().orig_rax, libc::SYS_read as u64);
    let before = *thread.regs();

    let args = [CallArg::Value(1), CallArg::Value(20), CallArg::Value(300)];
    let result = stopped.call(pid, add3, &args, &[]).unwrap();
    assert_eq!(result.ret, 321);
    let result = stopped
        .call(pid, add3, &[u64::MAX.into(), 2.into(), 0.into()], &[])
        .unwrap();
    assert_eq!(result.ret, 1);

    let thread = stopped.thread(pid).unwrap();
    assert_eq!(thread.regs(), &before);
    assert_eq!(stopped.threads().len(), 1);
    stopped.resume().unwrap();
    finish(target, 0);
}

#[test]
fn call_passes_stack_data_below_the_red_zone() {
    let (_program, target) = reader();
    let pid = target.pid();
    let sum_bytes = target.symbol("sum_bytes");
    let mut stopped = StoppedProcess::stop(pid).unwrap();
    let rsp = stopped.thread(pid).unwrap().regs().rsp;

    let data = [1u8, 2, 3, 250, 7];
    let args = [CallArg::StackData, CallArg::Value(data.len() as u64)];
    let result = stopped.call(pid, sum_bytes, &args, &data).unwrap();
    assert_eq!(result.ret, 263);
    assert_eq!(result.stack_data_addr % 16, 0);
    assert!(result.stack_data_addr + data.len() as u64 <= rsp - 128);
    let mut copy = [0u8; 5];
    stopped.read_mem(result.stack_data_addr, &mut copy).unwrap();
    assert_eq!(copy, data);

    let seven = [CallArg::Value(0); 7];
    let err = stopped.call(pid, sum_bytes, &seven, &[]).unwrap_err();
    assert_eq!(
        err.to_string(),
        "a remote call takes at most 6 arguments, got 7"
    );
    stopped.resume().unwrap();
    finish(target, 0);
}

#[test]
fn signal_raised_during_a_call_is_delivered_on_resume() {
    let (_program, target) = reader();
    let pid = target.pid();
    let raise_usr1 = target.symbol("raise_usr1");
    let usr1_count = target.symbol("usr1_count");
    let mut stopped = StoppedProcess::stop(pid).unwrap();

    let result = stopped.call(pid, raise_usr1, &[], &[]).unwrap();
    assert_eq!(result.ret, 5);
    let thread = stopped.thread(pid).unwrap();
    assert_eq!(thread.pending_signals(), vec![libc::SIGUSR1]);
    assert_eq!(thread.stop_kind(), StopKind::Trap);
    let mut count = [0u8; 8];
    stopped.read_mem(usr1_count, &mut count).unwrap();
    assert_eq!(
        i64::from_le_bytes(count),
        0,
        "the handler ran during the call"
    );

    stopped.resume().unwrap();
    // The handler runs, with the siginfo raise() made, then the read (SA_RESTART)
    // is restarted.
    finish_with(target, "read hello usr1=1 raised by itself");
}

#[test]
fn signal_sent_while_stopped_is_delivered_once_after_resume() {
    let (_program, target) = reader();
    let pid = target.pid();
    let add3 = target.symbol("add3");
    let mut stopped = StoppedProcess::stop(pid).unwrap();
    // Queued while the thread is stopped; the call lets the thread run, so it comes
    // due during the call and is held.
    // SAFETY: tgkill with valid ids and signal.
    let sent = unsafe { libc::syscall(libc::SYS_tgkill, pid, pid, libc::SIGUSR1) };
    assert_eq!(sent, 0);
    let args = [CallArg::Value(1), CallArg::Value(2), CallArg::Value(3)];
    assert_eq!(stopped.call(pid, add3, &args, &[]).unwrap().ret, 6);
    assert_eq!(
        stopped.thread(pid).unwrap().pending_signals(),
        vec![libc::SIGUSR1]
    );
    stopped.resume().unwrap();
    finish(target, 1);
}

#[test]
fn call_that_never_returns_times_out_and_the_thread_is_restored() {
    let (_program, target) = reader();
    let pid = target.pid();
    let spin = target.function("spin_forever");
    let mut stopped = StoppedProcess::stop(pid).unwrap();
    let before = *stopped.thread(pid).unwrap().regs();

    let timeout = Duration::from_millis(200);
    let err = stopped
        .call_with_timeout(pid, spin.start, &[], &[], timeout)
        .unwrap_err();
    let InjectError::CallTimedOut {
        tid,
        func,
        after,
        outcome: AbandonedCall::Restored { pc },
    } = err
    else {
        panic!("unexpected error: {err}");
    };
    assert_eq!((tid, func, after), (pid, spin.start, timeout));
    assert!(
        spin.contains(&pc),
        "interrupted at {pc:#x}, outside spin_forever"
    );
    assert_eq!(stopped.thread(pid).unwrap().regs(), &before);
    stopped.resume().unwrap();
    finish(target, 0);
}

#[test]
fn call_that_faults_is_reported_and_the_fault_swallowed() {
    let (_program, target) = reader();
    let pid = target.pid();
    let crash = target.function("crash");
    let mut stopped = StoppedProcess::stop(pid).unwrap();
    let before = *stopped.thread(pid).unwrap().regs();

    let err = stopped.call(pid, crash.start, &[], &[]).unwrap_err();
    let InjectError::CallFaulted {
        tid,
        signal,
        pc,
        addr,
        ..
    } = err
    else {
        panic!("unexpected error: {err}");
    };
    assert_eq!((tid, signal, addr), (pid, libc::SIGSEGV, 8));
    assert!(crash.contains(&pc));
    let thread = stopped.thread(pid).unwrap();
    assert_eq!(thread.regs(), &before);
    assert_eq!(thread.pending_signals(), Vec::<i32>::new());
    stopped.resume().unwrap();
    finish(target, 0);
}

#[test]
fn call_that_exits_the_process_is_target_exited() {
    let (_program, target) = reader();
    let pid = target.pid();
    let bye = target.symbol("bye");
    let mut stopped = StoppedProcess::stop(pid).unwrap();
    let err = stopped.call(pid, bye, &[], &[]).unwrap_err();
    assert!(
        matches!(err, InjectError::TargetExited { pid: p } if p == pid),
        "{err}"
    );
    assert_eq!(
        err.to_string(),
        format!("process {pid} exited during the operation")
    );
    assert_eq!(stopped.threads().len(), 0);
    stopped.resume().unwrap();
}

#[test]
fn thread_created_by_a_call_is_held_until_resume() {
    let (_program, target) = reader();
    let pid = target.pid();
    let start_worker = target.symbol("start_worker");
    let spins = target.symbol("worker_spins");
    let mut stopped = StoppedProcess::stop(pid).unwrap();

    let result = stopped.call(pid, start_worker, &[], &[]).unwrap();
    assert_eq!(result.ret, 0, "pthread_create failed");
    assert_eq!(stopped.threads().len(), 2);
    assert_eq!(stopped.stats().clones_caught, 1);
    let worker = stopped.threads()[1].tid();
    assert_ne!(worker, pid);
    assert_eq!(stopped.threads()[1].stop_kind(), StopKind::Interrupted);
    assert_eq!(common::task_state(pid, worker), Some('t'));
    std::thread::sleep(Duration::from_millis(20));
    let mut count = [0u8; 8];
    stopped.read_mem(spins, &mut count).unwrap();
    assert_eq!(
        u64::from_le_bytes(count),
        0,
        "the new thread ran while stopped"
    );

    stopped.resume().unwrap();
    assert!(common::eventually(common::CEILING, || target
        .peek_u64s(spins, 1)[0]
        > 0));
    finish(target, 0);
}

const PICKER: &str = r#"
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

int fds[2];
volatile unsigned long spins;
volatile long reader_tid;

static void *reader(void *arg) {
    char c;
    reader_tid = syscall(SYS_gettid);
    read(fds[0], &c, 1);
    return arg;
}

static void *spinner(void *arg) { for (;;) spins++; return arg; }

int main(int argc, char **argv) {
    pipe(fds);
    pthread_t s, r;
    pthread_create(&s, 0, spinner, 0);
    if (argc > 1 && strcmp(argv[1], "reader") == 0) {
        pthread_create(&r, 0, reader, 0);
        while (reader_tid == 0) usleep(100);
        printf("reader %ld\n", reader_tid);
    }
    while (spins == 0) usleep(100);
    printf("ready\n");
    fflush(stdout);
    pthread_join(s, 0);
    return 0;
}
"#;

#[test]
fn pick_call_thread_prefers_a_thread_blocked_outside_futex() {
    let program = build("picker", PICKER, &[]);

    // Main in futex (pthread_join), one thread spinning, one blocked in read.
    let mut target = Target::spawn(&program.path, &["reader"]);
    let reader: i32 = target
        .line()
        .strip_prefix("reader ")
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(target.line(), "ready");
    let pid = target.pid();
    wait_in_syscall(pid, reader, libc::SYS_read);
    wait_in_syscall(pid, pid, libc::SYS_futex);
    let stopped = StoppedProcess::stop(pid).unwrap();
    assert_eq!(stopped.threads().len(), 3);
    assert_eq!(stopped.pick_call_thread(), reader);
    drop(stopped);

    // Without the reader: main (in futex) rather than the spinner.
    let target = Target::start(&program.path, &[]);
    let pid = target.pid();
    wait_in_syscall(pid, pid, libc::SYS_futex);
    let stopped = StoppedProcess::stop(pid).unwrap();
    assert_eq!(stopped.threads().len(), 2);
    assert_eq!(stopped.pick_call_thread(), pid);
}

const MASKED: &str = r#"
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static void on_segv(int sig) { (void)sig; _exit(99); }

long add3(long a, long b, long c) { return a + b + c; }

/* 1 if our SIGSEGV handler is still installed. */
long handler_installed(void) {
    struct sigaction sa;
    sigaction(SIGSEGV, 0, &sa);
    return sa.sa_handler == on_segv;
}

int main(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_segv;
    sigaction(SIGSEGV, &sa, 0);
    sigset_t all;
    sigfillset(&all);
    sigprocmask(SIG_BLOCK, &all, 0);
    printf("ready\n");
    fflush(stdout);
    char buf[16];
    ssize_t n = read(0, buf, sizeof buf);
    printf("read %zd handler %ld\n", n, handler_installed());
    fflush(stdout);
    return 0;
}
"#;

fn blocked_mask(pid: i32) -> String {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find(|l| l.starts_with("SigBlk:"))
        .unwrap()
        .to_string()
}

#[test]
fn call_in_a_thread_blocking_sigsegv_keeps_the_targets_handler() {
    let program = build("masked", MASKED, &[]);
    let mut target = Target::start(&program.path, &[]);
    let pid = target.pid();
    wait_in_syscall(pid, pid, libc::SYS_read);
    let add3 = target.symbol("add3");
    let installed = target.symbol("handler_installed");
    let mask = blocked_mask(pid);
    assert_ne!(mask, "SigBlk:\t0000000000000000");

    let mut stopped = StoppedProcess::stop(pid).unwrap();
    let args = [CallArg::Value(2), CallArg::Value(3), CallArg::Value(4)];
    assert_eq!(stopped.call(pid, add3, &args, &[]).unwrap().ret, 9);
    assert_eq!(stopped.call(pid, installed, &[], &[]).unwrap().ret, 1);
    assert_eq!(blocked_mask(pid), mask);
    stopped.resume().unwrap();

    target.send_and_close(b"abcd");
    assert_eq!(target.line(), "read 4 handler 1");
    assert_eq!(blocked_mask(pid), mask);
}

/// Computes in vector registers without ever making a system call, and checks them.
const VECTORS: &str = r#"
#include <stdio.h>
#include <string.h>
#include <unistd.h>

typedef double v4d __attribute__((vector_size(32)));

/* Uses (and leaves garbage in) every xmm/ymm register. */
__attribute__((noipa)) long clobber(void) {
    volatile v4d junk = {1e300, -1e300, 3.0, 4.0};
    v4d a = junk, b = junk * 2.0, c = a + b, d = c * a;
    __asm__ volatile("vzeroall" ::: "memory");
    char buf[4096];
    memset(buf, 0x5a, sizeof buf);
    __asm__ volatile("" : "+x"(a), "+x"(b), "+x"(c), "+x"(d) : "r"(buf) : "memory");
    return (long)(a[0] + d[1]) & 1;
}

/* Called remotely by a tracer the test kills in the middle: says it is in, and
   waits for the test to tell it to go on (after the kill). */
volatile long slow_entered, slow_go;
long slow_clobber(void) {
    slow_entered++;
    while (!slow_go) usleep(1000);
    slow_go = 0;
    return clobber();
}

int main(void) {
    printf("ready\n");
    fflush(stdout);
    double x = 1.0, y = 2.0;
    v4d va = {1, 2, 3, 4}, vb = {2, 4, 6, 8};
    /* Never changes: upper halves reset to zero (a restore of the SSE part only)
       show here whenever they happen. */
    v4d vk = {5, 6, 7, 8};
    for (unsigned long i = 0;; i++) {
        x += 1.0; y += 2.0; va += 1.0; vb += 2.0;
        __asm__ volatile("" : "+x"(x), "+x"(y), "+x"(va), "+x"(vb), "+x"(vk));
        if (y != 2.0 * x || vb[0] != 2.0 * va[0] || vb[3] != 2.0 * va[3] || vk[3] != 8.0) {
            printf("CORRUPT x=%g y=%g va0=%g vb0=%g vk3=%g\n", x, y, va[0], vb[0], vk[3]);
            fflush(stdout);
            _exit(3);
        }
        if ((i & 0xfffff) == 0) { x = 1.0; y = 2.0; va = (v4d){1, 2, 3, 4}; vb = va * 2.0; }
    }
}
"#;

#[test]
fn call_preserves_the_vector_registers_of_a_computing_thread() {
    let program = build("vectors", VECTORS, &["-O2", "-mavx"]);
    let mut target = Target::start(&program.path, &[]);
    let pid = target.pid();
    let clobber = target.symbol("clobber");
    for _ in 0..20 {
        let mut stopped = StoppedProcess::stop(pid).unwrap();
        stopped.call(pid, clobber, &[], &[]).unwrap();
        stopped.resume().unwrap();
        std::thread::sleep(Duration::from_millis(5));
    }
    std::thread::sleep(Duration::from_millis(100));
    assert!(
        target.child.try_wait().unwrap().is_none(),
        "the target found its registers changed: {:?}",
        target.line()
    );
}

/// When set, `tracer_helper` is the tracer of `tracer_killed_during_a_call...`:
/// "PID FUNC" in hex.
const HELPER_ENV: &str = "WEFT_INJECT_TEST_TRACER";

/// Not a test of its own: the tracer process that the test below kills.
#[test]
fn tracer_helper() {
    let Ok(spec) = std::env::var(HELPER_ENV) else {
        return;
    };
    let mut parts = spec.split_whitespace();
    let pid: i32 = parts.next().unwrap().parse().unwrap();
    let func = u64::from_str_radix(parts.next().unwrap(), 16).unwrap();
    let mut stopped = StoppedProcess::stop(pid).unwrap();
    println!("calling");
    let _ = stopped.call_with_timeout(pid, func, &[], &[], Duration::from_secs(30));
    println!("returned");
}

const SLOW: &str = r#"
#include <stdio.h>
#include <string.h>
#include <unistd.h>

volatile long slow_calls, slow_entered, slow_go;

/* Called remotely by a tracer the test kills in the middle: says it is in, and
   waits for the test to tell it to go on (after the kill). */
long slow(void) {
    slow_entered++;
    while (!slow_go) usleep(1000);
    slow_calls++;
    return 42;
}

int main(void) {
    printf("ready\n");
    fflush(stdout);
    char buf[64];
    ssize_t n = read(0, buf, sizeof buf);
    printf("read %.*s calls=%ld\n", (int)(n > 0 ? n : 0), buf, slow_calls);
    fflush(stdout);
    return 0;
}
"#;

/// weft killed (SIGKILL) in the middle of a remote call: the thread finishes the
/// function, comes back to the landing pad, restores its own registers after the
/// pad's wait, and its interrupted read restarts as if nothing happened.
#[test]
fn tracer_killed_during_a_call_leaves_the_thread_as_it_was() {
    let program = build("slow", SLOW, &[]);
    let target = Target::start(&program.path, &[]);
    let pid = target.pid();
    wait_in_syscall(pid, pid, libc::SYS_read);
    let slow = target.symbol("slow");
    let fds = common::open_fds(pid);
    kill_tracer_during_call(&target, slow, 1);
    assert!(common::eventually(common::CEILING, || {
        target.peek_u64s(target.symbol("slow_calls"), 1)[0] == 1
    }));
    // Then the pad waits about a second for a tracer, and goes home by itself.
    let home = common::eventually(common::CEILING, || {
        common::code_differing_from_files(pid).is_empty() && common::open_fds(pid) == fds
    });
    assert!(home, "padding or descriptors not given back");
    assert_eq!(common::code_differing_from_files(pid), Vec::<String>::new());
    assert_eq!(common::open_fds(pid), fds);
    finish_with(target, "read hello calls=1");
}

/// Starts `tracer_helper` on `func` of `target`, a function that bumps `slow_entered`
/// and waits for `slow_go`; kills the helper once the call is in (the `calls`-th
/// time `slow_entered` was bumped), then lets the function go on.
fn kill_tracer_during_call(target: &Target, func: u64, calls: u64) {
    let pid = target.pid();
    let mut helper = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "tracer_helper",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(HELPER_ENV, format!("{pid} {func:x}"))
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = std::io::BufReader::new(helper.stdout.take().unwrap());
    let mut line = String::new();
    loop {
        line.clear();
        assert!(
            std::io::BufRead::read_line(&mut out, &mut line).unwrap() > 0,
            "helper ended"
        );
        if line.contains("calling") {
            break;
        }
    }
    let entered = target.symbol("slow_entered");
    assert!(
        common::eventually(common::CEILING, || target.peek_u64s(entered, 1)[0] == calls),
        "the remote call never came in"
    );
    helper.kill().unwrap();
    helper.wait().unwrap();
    target.poke(target.symbol("slow_go"), &1u64.to_le_bytes());
}

/// weft killed during a call made on a thread computing in vector registers: the
/// pad's way home (rt_sigreturn frames) restores every vector register, and the
/// padding's bytes, and leaks no file descriptor.
#[test]
fn tracer_killed_during_a_call_restores_vectors_and_padding() {
    let program = build("vectors", VECTORS, &["-O2", "-mavx"]);
    let mut target = Target::start(&program.path, &[]);
    let pid = target.pid();
    let slow = target.symbol("slow_clobber");
    let fds = common::open_fds(pid);
    for calls in 1..=3 {
        kill_tracer_during_call(&target, slow, calls);
        // slow_clobber() goes on, then the pad waits 300 ms.
        assert!(
            common::eventually(common::CEILING, || {
                common::code_differing_from_files(pid).is_empty() && common::open_fds(pid) == fds
            }),
            "padding not restored: {:?}",
            common::code_differing_from_files(pid)
        );
        std::thread::sleep(Duration::from_millis(100));
        assert!(
            target.child.try_wait().unwrap().is_none(),
            "the target found its registers changed: {:?}",
            target.line()
        );
        assert_eq!(common::open_fds(pid), fds);
    }
}

/// A weft slower than the pad's wait: the thread goes home by itself (weft finds it
/// there, or single-steps it the rest of the way), with its vector registers, and
/// the padding is given back.
#[test]
fn pad_that_stops_waiting_goes_home_by_itself() {
    let program = build("vectors", VECTORS, &["-O2", "-mavx"]);
    let mut target = Target::start(&program.path, &[]);
    let pid = target.pid();
    let clobber = target.symbol("clobber");
    let fds = common::open_fds(pid);
    for i in 0..60 {
        let mut stopped = StoppedProcess::stop(pid).unwrap();
        // From "not at all" to about as long as weft takes to notice.
        stopped.set_landing_pad_wait(Duration::from_nanos(1 + (i % 20) * 2_000));
        if i % 2 == 0 {
            stopped.catch_pads_leaving();
        }
        if let Err(e) = stopped.call(pid, clobber, &[], &[]) {
            drop(stopped);
            panic!(
                "call {i}: {e}; target: {:?} {:?}",
                target.child.wait(),
                target.line()
            );
        }
        stopped.resume().unwrap();
        assert_eq!(common::code_differing_from_files(pid), Vec::<String>::new());
    }
    std::thread::sleep(Duration::from_millis(100));
    assert!(
        target.child.try_wait().unwrap().is_none(),
        "the target found its registers changed: {:?}",
        target.line()
    );
    assert_eq!(common::open_fds(pid), fds);

    // And a thread blocked in read: the read restarts.
    let (_program, target) = reader();
    let add3 = target.symbol("add3");
    for i in 0..20 {
        let mut stopped = StoppedProcess::stop(target.pid()).unwrap();
        stopped.set_landing_pad_wait(Duration::from_nanos(1 + (i % 20) * 2_000));
        if i % 2 == 0 {
            stopped.catch_pads_leaving();
        }
        let r = stopped.call(target.pid(), add3, &[1.into(), 2.into(), 3.into()], &[]);
        assert_eq!(r.unwrap().ret, 6);
        stopped.resume().unwrap();
    }
    finish(target, 0);
}

/// Sleeps 1.5 s in one relative `nanosleep`, then says how it went.
const SLEEPER: &str = r#"
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

long add3(long a, long b, long c) { return a + b + c; }

int main(void) {
    printf("ready\n");
    fflush(stdout);
    struct timespec ts = {1, 500000000};
    int r = nanosleep(&ts, 0);
    printf("slept %d %s\n", r, r ? strerror(errno) : "ok");
    fflush(stdout);
    return 0;
}
"#;

/// A relative sleep is continued by the kernel through `restart_syscall`, from the
/// thread's restart block, which the call's own system calls may replace (the pad's
/// timed futex wait): the sleep must be entered again, not continued with the
/// pad's restart (coreutils `sleep` failed with "cannot read realtime clock:
/// Connection timed out" after an attach).
#[test]
fn a_call_in_a_thread_in_a_relative_sleep_leaves_the_sleep_whole() {
    let program = build("sleeper", SLEEPER, &[]);
    let mut target = Target::start(&program.path, &[]);
    wait_in_syscall(target.pid(), target.pid(), libc::SYS_clock_nanosleep);
    let pid = target.pid();
    let add3 = target.symbol("add3");
    for _ in 0..3 {
        let mut stopped = StoppedProcess::stop(pid).unwrap();
        let result = stopped
            .call(pid, add3, &[1.into(), 2.into(), 3.into()], &[])
            .unwrap();
        assert_eq!(result.ret, 6);
        stopped.resume().unwrap();
    }
    assert_eq!(target.line(), "slept 0 ok");
    assert_eq!(target.wait(), Some(0));
}
