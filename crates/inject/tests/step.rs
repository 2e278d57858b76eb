//! Single-stepping threads out of bytes about to be replaced.

mod common;

use std::time::Duration;

use common::{build, wait_in_syscall, Target};
use weft_inject::{InjectError, StopKind, StoppedProcess};

const SPIN: &str = r#"
#include <pthread.h>
#include <stdio.h>

volatile unsigned long n;

__attribute__((noinline)) void spin(void) {
    for (;;) { n++; n++; n++; n++; n++; n++; n++; n++; }
}

static void *run(void *arg) { spin(); return arg; }

int main(void) {
    pthread_t t;
    pthread_create(&t, 0, run, 0);
    while (n == 0) {}
    printf("ready\n");
    fflush(stdout);
    pthread_join(t, 0);
    return 0;
}
"#;

#[test]
fn step_out_leaves_a_range_in_a_hot_loop() {
    let program = build("spin", SPIN, &[]);
    let target = Target::start(&program.path, &[]);
    let pid = target.pid();
    let spin = target.function("spin");
    let n = target.symbol("n");

    let mut stopped = StoppedProcess::stop(pid).unwrap();
    let spinner = stopped
        .threads()
        .iter()
        .find(|t| spin.contains(&t.pc()))
        .expect("no thread inside spin()")
        .tid();
    let pc = stopped.thread(spinner).unwrap().pc();
    let range = pc..pc + 16;
    assert_eq!(
        stopped.threads_in(std::slice::from_ref(&range)),
        vec![spinner]
    );

    // Steps counted, not timed: a busy machine may take its time over each step
    // (step_out alone gives up after 2 s).
    let steps = stopped
        .step_out_within(
            spinner,
            std::slice::from_ref(&range),
            1000,
            common::CEILING,
            None,
        )
        .unwrap();
    assert!(steps >= 1);
    let thread = stopped.thread(spinner).unwrap();
    assert!(
        !range.contains(&thread.pc()),
        "pc {:#x} still in range",
        thread.pc()
    );
    assert!(
        spin.contains(&thread.pc()),
        "pc {:#x} left spin()",
        thread.pc()
    );
    assert_eq!(thread.stop_kind(), StopKind::Trap);
    assert_eq!(thread.pending_signals(), Vec::<i32>::new());
    assert!(stopped.threads_in(&[range]).is_empty());
    // Already outside: no step at all.
    let outside = thread.pc() + 0x1000..thread.pc() + 0x1010;
    assert_eq!(stopped.step_out(spinner, &[outside], 1000).unwrap(), 0);

    // A range covering the whole loop cannot be left.
    let err = stopped
        .step_out_within(
            spinner,
            std::slice::from_ref(&spin),
            50,
            common::CEILING,
            None,
        )
        .unwrap_err();
    let InjectError::StepOutLimit { tid, steps, pc } = err else {
        panic!("unexpected error: {err}");
    };
    assert_eq!((tid, steps), (spinner, 50));
    assert!(spin.contains(&pc));

    stopped.resume().unwrap();
    let counted = target.peek_u64s(n, 1)[0];
    assert!(common::eventually(common::CEILING, || target
        .peek_u64s(n, 1)[0]
        > counted));
}

const READER: &str = r#"
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

#[test]
fn step_out_refuses_a_thread_whose_syscall_restart_lands_in_the_range() {
    let program = build("reader", READER, &[]);
    let mut target = Target::start(&program.path, &[]);
    let pid = target.pid();
    wait_in_syscall(pid, pid, libc::SYS_read);

    let mut stopped = StoppedProcess::stop(pid).unwrap();
    let thread = stopped.thread(pid).unwrap();
    let restart = thread.restart_pc().expect("read is restarted on resume");
    assert_eq!(restart, thread.pc() - 2);
    let mut insn = [0u8; 2];
    stopped.read_mem(restart, &mut insn).unwrap();
    assert_eq!(insn, [0x0f, 0x05], "syscall");

    let range = restart..restart + 2;
    assert_eq!(stopped.threads_in(std::slice::from_ref(&range)), vec![pid]);
    let err = stopped.step_out(pid, &[range], 10).unwrap_err();
    assert!(
        matches!(err, InjectError::StepOutInSyscall { tid, pc } if tid == pid && pc == restart)
    );
    stopped.resume().unwrap();

    target.send_and_close(b"abc");
    assert_eq!(target.line(), "read 3");
}

const GADGET: &str = r#"
#include <stdio.h>

volatile unsigned long n;

/* A bare system call, for the test to point a thread at. */
__asm__(".text\n.globl gadget\n.type gadget, @function\ngadget:\n  syscall\n  ret\n");

int main(void) {
    printf("ready\n");
    fflush(stdout);
    for (;;) n++;
}
"#;

#[test]
fn a_step_cut_short_in_a_blocking_call_leaves_no_trap_behind() {
    // A step into a read that blocks is cut short by the timeout; the step's
    // SIGTRAP, raised when the read is interrupted, must not survive the detach
    // (the target has no SIGTRAP handler: it would die).
    let program = build("gadget", GADGET, &[]);
    let target = Target::start(&program.path, &[]);
    let pid = target.pid();
    let gadget = target.function("gadget");
    let n = target.symbol("n");

    let mut stopped = StoppedProcess::stop(pid).unwrap();
    let saved = *stopped.thread(pid).unwrap().regs();
    let mut regs = saved;
    regs.rip = gadget.start;
    regs.rax = libc::SYS_read as u64;
    regs.rdi = 0; // stdin: a pipe nobody writes to
    regs.rsi = saved.rsp - 512;
    regs.rdx = 1;
    regs.orig_rax = u64::MAX;
    stopped.set_regs(pid, &regs).unwrap();
    let call = gadget.start..gadget.start + 2;
    let err = stopped
        .step_out_within(
            pid,
            std::slice::from_ref(&call),
            10,
            Duration::from_millis(200),
            None,
        )
        .unwrap_err();
    assert!(matches!(err, InjectError::Timeout { .. }), "{err}");
    stopped.set_regs(pid, &saved).unwrap();
    stopped.resume().unwrap();

    let counted = target.peek_u64s(n, 1)[0];
    assert!(common::eventually(common::CEILING, || target
        .peek_u64s(n, 1)[0]
        > counted + 1000));
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(common::task_state(pid, pid).map(|s| s != 'Z'), Some(true));
}

const UNBLOCK: &str = r#"
#include <signal.h>
#include <stdio.h>

volatile unsigned long n, handled;
unsigned long empty_mask; /* an all-clear sigset for rt_sigprocmask */

static void on_usr1(int sig) { (void)sig; handled++; }

/* Where the thread goes after the test's system call returns. */
__attribute__((noinline, noreturn)) void back(void) {
    for (;;) n++;
}

__asm__(".text\n.globl gadget\n.type gadget, @function\ngadget:\n  syscall\n  ret\n");

int main(void) {
    signal(SIGUSR1, on_usr1);
    sigset_t s;
    sigemptyset(&s);
    sigaddset(&s, SIGUSR1);
    sigprocmask(SIG_BLOCK, &s, 0);
    raise(SIGUSR1); /* pending, blocked */
    printf("ready\n");
    fflush(stdout);
    for (;;) n++;
}
"#;

#[test]
fn a_step_into_a_signal_handler_is_not_a_sigtrap_for_the_target() {
    // A step over a sigprocmask that unblocks a pending signal enters the handler;
    // the kernel reports that as a SIGTRAP stop (ptrace_notify, si_code SIGTRAP),
    // which is weft's, not a signal to hand to the target on resume (it has no
    // SIGTRAP handler: it would die).
    let program = build("unblock", UNBLOCK, &[]);
    let target = Target::start(&program.path, &[]);
    let pid = target.pid();
    let gadget = target.function("gadget");
    let back = target.function("back");
    let (n, handled, empty) = (
        target.symbol("n"),
        target.symbol("handled"),
        target.symbol("empty_mask"),
    );

    let mut stopped = StoppedProcess::stop(pid).unwrap();
    let saved = *stopped.thread(pid).unwrap().regs();
    let mut regs = saved;
    regs.rsp = (saved.rsp - 512) & !15;
    stopped
        .write_mem(regs.rsp, &back.start.to_le_bytes())
        .unwrap();
    regs.rip = gadget.start;
    regs.rax = libc::SYS_rt_sigprocmask as u64;
    regs.rdi = libc::SIG_SETMASK as u64;
    regs.rsi = empty;
    regs.rdx = 0;
    regs.r10 = 8;
    regs.orig_rax = u64::MAX;
    stopped.set_regs(pid, &regs).unwrap();
    let call = gadget.start..gadget.start + 2;
    stopped
        .step_out_within(pid, std::slice::from_ref(&call), 10, common::CEILING, None)
        .unwrap();
    assert_eq!(
        stopped.thread(pid).unwrap().pending_signals(),
        Vec::<i32>::new()
    );
    stopped.resume().unwrap();

    assert!(common::eventually(common::CEILING, || target
        .peek_u64s(handled, 1)[0]
        == 1));
    let counted = target.peek_u64s(n, 1)[0];
    assert!(common::eventually(common::CEILING, || target
        .peek_u64s(n, 1)[0]
        > counted + 1000));
    assert_eq!(common::task_state(pid, pid).map(|s| s != 'Z'), Some(true));
}

const OVER: &str = r#"
#include <stdio.h>

volatile unsigned long n, spins;
static char buf[1 << 20];

/* A `rep stosb` over 1 MiB: a million single steps, or one step over it. */
__attribute__((noinline)) void outer(void) {
    void *d = buf;
    unsigned long c = sizeof buf;
    __asm__ volatile("rep stosb" : "+D"(d), "+c"(c) : "a"(0x5a) : "memory");
}

/* Where the thread goes after the test's detour through outer(): calling outer()
 * again and again (a breakpoint left armed in it would kill the process). */
__attribute__((noinline, noreturn)) void back(void) {
    for (;;) { outer(); n++; }
}

int main(void) {
    printf("ready\n");
    fflush(stdout);
    for (;;) spins++;
}
"#;

#[test]
fn step_out_runs_over_rep_string_instructions() {
    let program = build("over", OVER, &[]);
    let target = Target::start(&program.path, &[]);
    let pid = target.pid();
    let outer = target.function("outer");
    let back = target.function("back");
    let n = target.symbol("n");

    let mut stopped = StoppedProcess::stop(pid).unwrap();
    let mut regs = *stopped.thread(pid).unwrap().regs();
    // As if main had called outer(), returning to back().
    regs.rsp = ((regs.rsp - 4096) & !15) - 8;
    stopped
        .write_mem(regs.rsp, &back.start.to_le_bytes())
        .unwrap();
    regs.rip = outer.start;
    regs.orig_rax = u64::MAX;
    stopped.set_regs(pid, &regs).unwrap();
    // A hundred steps are plenty: the rep stosb counts as one (single-stepping it
    // would take a million).
    let steps = stopped
        .step_out_within(
            pid,
            std::slice::from_ref(&outer),
            100,
            common::CEILING,
            None,
        )
        .unwrap();
    assert!(steps < 100, "{steps} steps");
    let thread = stopped.thread(pid).unwrap();
    assert!(
        back.contains(&thread.pc()),
        "pc {:#x} not in back()",
        thread.pc()
    );
    assert_eq!(thread.pending_signals(), Vec::<i32>::new());
    stopped.resume().unwrap();
    // outer() runs again and again with no tracer: no breakpoint was left in it.
    assert!(common::eventually(common::CEILING, || target
        .peek_u64s(n, 1)[0]
        > 3));
    assert_eq!(common::task_state(pid, pid).map(|s| s != 'Z'), Some(true));
}

const UNMASK: &str = r#"
#include <signal.h>
#include <stdio.h>

volatile unsigned long n, spins;

/* What glibc's start_thread does: a thread created with every signal blocked
 * puts its own mask back before it runs the program's code. */
__attribute__((noinline)) void unmask(void) {
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, 0);
}

__attribute__((noinline)) void starting(void) {
    unmask();
    __asm__ volatile("nop");
}

/* Where the thread goes after the test's detour through starting(). */
__attribute__((noinline, noreturn)) void back(void) {
    for (;;) n++;
}

int main(void) {
    sigset_t all;
    sigfillset(&all);
    sigprocmask(SIG_BLOCK, &all, 0);
    printf("ready\n");
    fflush(stdout);
    for (;;) spins++;
}
"#;

/// The signals a thread blocks (`SigBlk` in its `/proc` status).
fn blocked_signals(pid: i32, tid: i32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("SigBlk:")).unwrap();
    u64::from_str_radix(line.split_whitespace().nth(1).unwrap(), 16).unwrap()
}

#[test]
fn a_mask_the_thread_sets_during_a_step_is_kept() {
    // SIGTRAP is unblocked for a step; a thread run over a call that sets its own
    // mask (a new thread leaving pthread_create's all-blocked mask) must keep that
    // mask, not get the stale one back: with SIGTRAP blocked again, its next int3
    // would reset the SIGTRAP handler and kill the process.
    let program = build("unmask", UNMASK, &[]);
    let target = Target::start(&program.path, &[]);
    let pid = target.pid();
    let starting = target.function("starting");
    let back = target.function("back");
    let n = target.symbol("n");
    let trap = 1u64 << (libc::SIGTRAP - 1);
    assert_ne!(blocked_signals(pid, pid) & trap, 0);

    let mut stopped = StoppedProcess::stop(pid).unwrap();
    let mut regs = *stopped.thread(pid).unwrap().regs();
    // As if main had called starting(), returning to back().
    regs.rsp = ((regs.rsp - 4096) & !15) - 8;
    stopped
        .write_mem(regs.rsp, &back.start.to_le_bytes())
        .unwrap();
    regs.rip = starting.start;
    regs.orig_rax = u64::MAX;
    stopped.set_regs(pid, &regs).unwrap();
    stopped
        .step_out_within(
            pid,
            std::slice::from_ref(&starting),
            100,
            Duration::from_secs(10),
            None,
        )
        .unwrap();
    let thread = stopped.thread(pid).unwrap();
    assert!(
        back.contains(&thread.pc()),
        "pc {:#x} not in back()",
        thread.pc()
    );
    assert_eq!(blocked_signals(pid, pid), 0);
    stopped.resume().unwrap();
    assert!(common::eventually(Duration::from_secs(10), || target
        .peek_u64s(n, 1)[0]
        > 3));
    assert_eq!(blocked_signals(pid, pid), 0);
}

const BLOCKTRAP: &str = r#"
#include <signal.h>
#include <stdio.h>

volatile unsigned long n, spins;

/* Blocks SIGTRAP: a run over a call to this must stop before the system call (a
 * step's trap raised blocked would make the kernel reset the SIGTRAP handler). */
__attribute__((noinline)) void block_trap(void) {
    sigset_t s;
    sigemptyset(&s);
    sigaddset(&s, SIGTRAP);
    sigprocmask(SIG_BLOCK, &s, 0);
}

__attribute__((noinline)) void starting(void) {
    block_trap();
    __asm__ volatile("nop");
}

/* Where the thread goes after the test's detour through starting(). */
__attribute__((noinline, noreturn)) void back(void) {
    for (;;) n++;
}

int main(void) {
    printf("ready\n");
    fflush(stdout);
    for (;;) spins++;
}
"#;

#[test]
fn a_run_over_a_call_stops_before_a_system_call_it_may_not_make() {
    // The callee's rt_sigprocmask is refused: the thread is put back at its
    // `syscall` instruction with the call not made, and makes it once resumed.
    let program = build("blocktrap", BLOCKTRAP, &[]);
    let target = Target::start(&program.path, &[]);
    let pid = target.pid();
    let starting = target.function("starting");
    let back = target.function("back");
    let n = target.symbol("n");
    let trap = 1u64 << (libc::SIGTRAP - 1);
    assert_eq!(blocked_signals(pid, pid) & trap, 0);

    let mut stopped = StoppedProcess::stop(pid).unwrap();
    let mut regs = *stopped.thread(pid).unwrap().regs();
    // As if main had called starting(), returning to back().
    regs.rsp = ((regs.rsp - 4096) & !15) - 8;
    stopped
        .write_mem(regs.rsp, &back.start.to_le_bytes())
        .unwrap();
    regs.rip = starting.start;
    regs.orig_rax = u64::MAX;
    stopped.set_regs(pid, &regs).unwrap();
    let no_sigprocmask = |r: &libc::user_regs_struct| r.rax != libc::SYS_rt_sigprocmask as u64;
    let err = stopped
        .step_out_within(
            pid,
            std::slice::from_ref(&starting),
            100,
            Duration::from_secs(10),
            Some(&no_sigprocmask),
        )
        .unwrap_err();
    let InjectError::StepOutAtSyscall { tid, pc } = err else {
        panic!("unexpected error: {err}");
    };
    assert_eq!(tid, pid);
    let thread = stopped.thread(pid).unwrap();
    assert_eq!(thread.pc(), pc);
    assert!(!starting.contains(&pc), "stopped in starting() at {pc:#x}");
    assert_eq!(thread.regs().rax, libc::SYS_rt_sigprocmask as u64);
    assert!(!thread.in_syscall());
    assert_eq!(thread.stop_kind(), StopKind::Trap);
    let mut insn = [0u8; 2];
    stopped.read_mem(pc, &mut insn).unwrap();
    assert_eq!(insn, [0x0f, 0x05]);
    // Not made: SIGTRAP is not blocked yet.
    assert_eq!(blocked_signals(pid, pid) & trap, 0);
    stopped.resume().unwrap();
    // The thread makes the call itself, returns through starting() into back().
    assert!(common::eventually(Duration::from_secs(10), || target
        .peek_u64s(n, 1)[0]
        > 3));
    assert_ne!(blocked_signals(pid, pid) & trap, 0);
    assert_eq!(common::task_state(pid, pid).map(|s| s != 'Z'), Some(true));
}

#[test]
fn guarded_steps_end_settled_like_any_other() {
    // Under a trap guard the steps are not each traded for an interrupt stop; the
    // last one is, so the thread ends in the same state, nothing pending.
    let program = build("spin", SPIN, &[]);
    let target = Target::start(&program.path, &[]);
    let pid = target.pid();
    let spin = target.function("spin");
    let n = target.symbol("n");

    let mut stopped = StoppedProcess::stop(pid).unwrap();
    let spinner = stopped
        .threads()
        .iter()
        .find(|t| spin.contains(&t.pc()))
        .expect("no thread inside spin()")
        .tid();
    let pc = stopped.thread(spinner).unwrap().pc();
    let range = pc..pc + 16;
    stopped.set_trap_guarded(true);
    let steps = stopped
        .step_out_within(
            spinner,
            std::slice::from_ref(&range),
            1000,
            common::CEILING,
            None,
        )
        .unwrap();
    stopped.set_trap_guarded(false);
    assert!(steps >= 1);
    let thread = stopped.thread(spinner).unwrap();
    assert!(!range.contains(&thread.pc()));
    assert_eq!(thread.stop_kind(), StopKind::Trap);
    assert_eq!(thread.pending_signals(), Vec::<i32>::new());
    // An interrupt stop (PTRACE_EVENT_STOP), not the step's SIGTRAP
    // signal-delivery-stop (TRAP_TRACE), which a dying weft would let through.
    let mut info = std::mem::MaybeUninit::<libc::siginfo_t>::zeroed();
    // SAFETY: PTRACE_GETSIGINFO writes one siginfo_t through `data`; this thread is
    // the tracer.
    let r = unsafe {
        libc::ptrace(
            libc::PTRACE_GETSIGINFO,
            spinner,
            0,
            info.as_mut_ptr() as *mut libc::c_void,
        )
    };
    assert_eq!(r, 0);
    // SAFETY: the call succeeded and filled it.
    let info = unsafe { info.assume_init() };
    assert_eq!(
        info.si_code,
        libc::SIGTRAP | (libc::PTRACE_EVENT_STOP << 8),
        "not an interrupt stop"
    );
    stopped.resume().unwrap();
    let counted = target.peek_u64s(n, 1)[0];
    assert!(common::eventually(common::CEILING, || target
        .peek_u64s(n, 1)[0]
        > counted));
    assert_eq!(
        common::task_state(pid, spinner).map(|s| s != 'Z'),
        Some(true)
    );
}

#[test]
fn run_until_reaches_a_return_address_in_one_run() {
    // What attach does with a thread inside the C library whose caller the
    // call-frame information names: one run to that address, through the callee's
    // calls (here sigprocmask), SIGTRAP unblocked meanwhile and the mask put back.
    let program = build("unmask", UNMASK, &[]);
    let target = Target::start(&program.path, &[]);
    let pid = target.pid();
    let starting = target.function("starting");
    let back = target.function("back");
    let n = target.symbol("n");

    let mut stopped = StoppedProcess::stop(pid).unwrap();
    let mut regs = *stopped.thread(pid).unwrap().regs();
    regs.rsp = ((regs.rsp - 4096) & !15) - 8;
    stopped
        .write_mem(regs.rsp, &back.start.to_le_bytes())
        .unwrap();
    regs.rip = starting.start;
    regs.orig_rax = u64::MAX;
    stopped.set_regs(pid, &regs).unwrap();
    stopped
        .run_until(pid, back.start, Duration::from_secs(10), None)
        .unwrap();
    let thread = stopped.thread(pid).unwrap();
    assert_eq!(thread.pc(), back.start);
    assert_eq!(thread.stop_kind(), StopKind::Trap);
    assert_eq!(thread.pending_signals(), Vec::<i32>::new());
    // The thread's own new mask (all clear) stands.
    assert_eq!(blocked_signals(pid, pid), 0);
    stopped.resume().unwrap();
    assert!(common::eventually(Duration::from_secs(10), || target
        .peek_u64s(n, 1)[0]
        > 3));
    assert_eq!(common::task_state(pid, pid).map(|s| s != 'Z'), Some(true));
}
