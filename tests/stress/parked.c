/* Threads parked in system calls at the first instructions of probed functions, so
 * that a weave deterministically meets them there (the tests of SIGKILL of weft at
 * chosen points, crates/cli/tests/stress.rs):
 *
 *   nop   a thread waits in epoll_wait(-1) at wait_nop, a `syscall` followed by
 *         NOPs: every stop of weft interrupts it (EINTR, never restarted), and it
 *         sits inside the 5 bytes a jump would replace, so patching single-steps
 *         it out.
 *   call  the same at wait_call, a `syscall` then a `call`: patching runs it over
 *         the call to a hardware breakpoint.
 *   park  on SIGUSR1 a thread calls park(), whose first instruction is a `read`
 *         of an empty pipe (restarted after every stop): woven, it blocks in the
 *         relocated copy, inside weft's code region, until SIGUSR2 writes a byte.
 *   handler  as park; besides, on SIGWINCH the parked thread is sent SIGURG, whose
 *         handler (SA_RESTART) blocks reading another pipe until SIGHUP writes a
 *         byte to it: the thread then runs the target's own code, in a handler that
 *         will return into weft's code, where the read is restarted.
 *
 * SIGUSR2 writes a byte to a pipe: the waiter's epoll set holds it (it reads it
 * and counts a wake-up), the parked read gets it. A worker thread computes and
 * checks. main prints "ready", "tid N" (the parked or waiting thread), then
 * "progress ITERATIONS WAKEUPS HANDLED" every 100 ms (HANDLED: SIGURG handlers
 * entered, and returned). usage: parked nop|call|park|handler */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/syscall.h>
#include <time.h>

#include "probed.h"

long wait_nop_entry(int epfd, struct epoll_event *ev);
long wait_call_entry(int epfd, struct epoll_event *ev);
long park(int fd, void *buf, long n);
__asm__(".text\n"
        /* epoll_wait(epfd, ev, 1, -1) through wait_nop / wait_call */
        ".globl wait_nop_entry\n.type wait_nop_entry, @function\nwait_nop_entry:\n"
        "  mov $232, %eax\n  mov $1, %edx\n  mov $-1, %r10\n  call wait_nop\n  ret\n"
        ".size wait_nop_entry, .-wait_nop_entry\n"
        ".globl wait_call_entry\n.type wait_call_entry, @function\nwait_call_entry:\n"
        "  mov $232, %eax\n  mov $1, %edx\n  mov $-1, %r10\n  call wait_call\n  ret\n"
        ".size wait_call_entry, .-wait_call_entry\n"
        ".globl wait_nop\n.type wait_nop, @function\nwait_nop:\n"
        "  syscall\n  nop\n  nop\n  nop\n  ret\n.size wait_nop, .-wait_nop\n"
        ".globl wait_call\n.type wait_call, @function\nwait_call:\n"
        "  syscall\n  call after_wait\n  ret\n.size wait_call, .-wait_call\n"
        /* returns rax unchanged */
        ".globl after_wait\n.type after_wait, @function\nafter_wait:\n"
        "  ret\n.size after_wait, .-after_wait\n"
        /* read(fd, buf, n) */
        ".globl park\n.type park, @function\npark:\n"
        "  xor %eax, %eax\n  syscall\n  nop\n  ret\n.size park, .-park\n");

static atomic_long iterations, wakeups, handlers_in, handlers_out;
static atomic_int parked_tid;
static int epfd;
static int go_pipe[2], data_pipe[2], handler_pipe[2];
static pthread_t parked_thread;

static void on_urg(int sig) {
  (void)sig;
  char c;
  atomic_fetch_add(&handlers_in, 1);
  CHECK(read(handler_pipe[0], &c, 1), 1);
  atomic_fetch_add(&handlers_out, 1);
}

static void *worker(void *arg) {
  (void)arg;
  for (long i = 0;; i++) {
    CHECK(hot_jump(i), want_jump(i));
    atomic_fetch_add_explicit(&iterations, 1, memory_order_relaxed);
  }
  return 0;
}

static void *waiter(void *arg) {
  long (*wait)(int, struct epoll_event *) = arg;
  struct epoll_event ev;
  atomic_store(&parked_tid, (int)syscall(SYS_gettid));
  for (;;) {
    long r = wait(epfd, &ev);
    /* A byte from SIGUSR2, or a stop of weft's (EINTR). */
    if (r == 1) {
      char c;
      CHECK(read(data_pipe[0], &c, 1), 1);
      CHECK(c, 'd');
      atomic_fetch_add(&wakeups, 1);
    } else {
      CHECK(r, -EINTR);
    }
  }
  return 0;
}

static void *parker(void *arg) {
  (void)arg;
  char c;
  atomic_store(&parked_tid, (int)syscall(SYS_gettid));
  /* Wait for SIGUSR1 (main writes go_pipe), then park in the probed read. */
  CHECK(read(go_pipe[0], &c, 1), 1);
  CHECK(park(data_pipe[0], &c, 1), 1);
  CHECK(c, 'd');
  atomic_fetch_add(&wakeups, 1);
  return 0;
}

static void start(void *(*f)(void *), void *arg) {
  pthread_t th;
  CHECK(pthread_create(&th, 0, f, arg), 0);
}

int main(int argc, char **argv) {
  const char *mode = argc > 1 ? argv[1] : "nop";
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGUSR1);
  sigaddset(&set, SIGUSR2);
  sigaddset(&set, SIGWINCH);
  sigaddset(&set, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &set, 0);
  struct sigaction sa = {.sa_handler = on_urg, .sa_flags = SA_RESTART};
  sigemptyset(&sa.sa_mask);
  CHECK(sigaction(SIGURG, &sa, 0), 0);
  epfd = epoll_create1(0);
  CHECK(epfd >= 0, 1);
  CHECK(pipe(go_pipe), 0);
  CHECK(pipe(data_pipe), 0);
  CHECK(pipe(handler_pipe), 0);
  struct epoll_event ev = {.events = EPOLLIN};
  CHECK(epoll_ctl(epfd, EPOLL_CTL_ADD, data_pipe[0], &ev), 0);
  start(worker, 0);
  if (strcmp(mode, "park") == 0 || strcmp(mode, "handler") == 0) {
    CHECK(pthread_create(&parked_thread, 0, parker, 0), 0);
  } else {
    start(waiter, strcmp(mode, "call") == 0 ? (void *)wait_call_entry : (void *)wait_nop_entry);
  }
  while (!atomic_load(&parked_tid)) usleep(1000);
  printf("ready\ntid %d\n", atomic_load(&parked_tid));
  fflush(stdout);
  struct timespec tick = {0, 100 * 1000 * 1000};
  for (;;) {
    int sig = sigtimedwait(&set, 0, &tick);
    if (sig == SIGUSR1) CHECK(write(go_pipe[1], "g", 1), 1);
    if (sig == SIGUSR2) CHECK(write(data_pipe[1], "d", 1), 1);
    if (sig == SIGWINCH) CHECK(pthread_kill(parked_thread, SIGURG), 0);
    if (sig == SIGHUP) CHECK(write(handler_pipe[1], "h", 1), 1);
    printf("progress %ld %ld %ld %ld\n", atomic_load(&iterations), atomic_load(&wakeups),
           atomic_load(&handlers_in), atomic_load(&handlers_out));
    fflush(stdout);
  }
}
