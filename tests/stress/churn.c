/* Processes and threads coming and going while woven. usage: churn MODE
 *   threads [ROUNDS]  batches of short-lived threads (each calls thread_begins, does
 *             ROUNDS rounds, 2000 by default, and exits), plus detached threads that
 *             exit at once; progress = threads finished
 *   fork      2 hammering threads; the main thread forks children that do 20000
 *             rounds and exit (also from inside a probed function, fork_inside);
 *             progress = children reaped, each of which must exit 0
 *   vfork     2 hammering threads; the main thread vforks children that call a
 *             probed function then _exit, or exec /bin/true; progress = children
 *   clonevm   2 hammering threads, and a child made with clone(CLONE_VM | SIGCHLD)
 *             only (no CLONE_THREAD, no CLONE_SIGHAND, no new TLS) that calls the
 *             probed functions in a loop; progress = the child's rounds
 *   clonevm-churn  2 hammering threads; the main thread makes clone(CLONE_VM | SIGCHLD)
 *             children one after another (each does 2000 rounds and exits), so some
 *             are made while weft weaves or unweaves; progress = children reaped
 *   exec      2 hammering threads; on SIGUSR1 the process execs itself in mode
 *             "after-exec", which prints "ready after exec" and hammers on
 * Every result is checked (CORRUPT + exit 3); a child's failure is reported by its
 * parent. */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>

#include "probed.h"

static atomic_long progress;
static atomic_long rounds;

static void *hammer(void *arg) {
  for (long i = (long)arg;; i++) {
    round_of_calls(i);
    atomic_fetch_add_explicit(&rounds, 1, memory_order_relaxed);
  }
  return 0;
}

static void start_hammers(void) {
  for (long t = 0; t < 2; t++) {
    pthread_t th;
    pthread_create(&th, 0, hammer, (void *)(t * 100));
  }
}

static void *reporter(void *arg) {
  (void)arg;
  for (;;) {
    usleep(100000);
    printf("progress %ld\n", atomic_load(&progress));
    fflush(stdout);
  }
  return 0;
}

static long short_rounds = 2000;

/* Called once by each short-lived thread, first thing: weft counts threads here. */
__attribute__((noipa)) long thread_begins(long k) {
  __asm__ volatile("");
  return k;
}

static void *short_lived(void *arg) {
  thread_begins((long)arg);
  for (long i = (long)arg; i < (long)arg + short_rounds; i++) round_of_calls(i);
  return 0;
}

static void *exits_at_once(void *arg) { return arg; }

static void mode_threads(void) {
  for (long k = 0;; k++) {
    pthread_t th[4];
    for (long t = 0; t < 4; t++) pthread_create(&th[t], 0, short_lived, (void *)(k * 4 + t));
    pthread_attr_t at;
    pthread_attr_init(&at);
    pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
    pthread_t d;
    pthread_create(&d, &at, exits_at_once, 0);
    pthread_attr_destroy(&at);
    for (int t = 0; t < 4; t++) pthread_join(th[t], 0);
    atomic_fetch_add(&progress, 4);
  }
}

static void reap(pid_t pid) {
  int st;
  while (waitpid(pid, &st, 0) < 0) {}
  if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
    printf("CORRUPT child %d ended with status %#x (%s %d)\n", pid, st,
           WIFSIGNALED(st) ? "signal" : "exit",
           WIFSIGNALED(st) ? WTERMSIG(st) : WEXITSTATUS(st));
    fflush(stdout);
    _exit(3);
  }
  atomic_fetch_add(&progress, 1);
}

static void child_work(long seed) {
  for (long i = seed; i < seed + 20000; i++) round_of_calls(i);
  _exit(0);
}

/* fork() from inside a probed function: the child returns through the return
 * address the parent's return probe replaced. */
__attribute__((noipa)) long fork_inside(long x) {
  pid_t pid = fork();
  if (pid == 0) {
    /* still inside fork_inside: return normally, then work */
    return -1;
  }
  __asm__ volatile("");
  return pid > 0 ? pid + x * 0 : 0;
}

static void mode_fork(void) {
  start_hammers();
  for (long k = 0;; k++) {
    pid_t pid;
    if (k & 1) {
      pid = fork();
      if (pid == 0) child_work(k);
    } else {
      pid = fork_inside(k);
      if (pid == -1) child_work(k);
    }
    if (pid < 0) continue;
    reap(pid);
    usleep(2000);
  }
}

static char *const true_argv[] = {"/bin/true", 0};

static void mode_vfork(void) {
  start_hammers();
  for (long k = 0;; k++) {
    pid_t pid = vfork();
    if (pid == 0) {
      if (k & 1) {
        execv("/bin/true", true_argv);
        _exit(4);
      }
      _exit(hot_jump(k) == want_jump(k) ? 0 : 3);
    }
    if (pid > 0) reap(pid);
    usleep(1000);
  }
}

static int clone_child(void *arg) {
  (void)arg;
  syscall(SYS_prctl, PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
  for (long i = 0;; i++) {
    /* No libc here beyond the probed functions (the child shares the parent's
     * TLS): report a wrong result by exit code. */
    if (hot_jump(i) != want_jump(i)) syscall(SYS_exit, 3);
    if (hot_int3((i & 7) + 1) != want_int3((i & 7) + 1)) syscall(SYS_exit, 4);
    if (hot_rec(i & 7) != want_rec(i & 7)) syscall(SYS_exit, 5);
    atomic_fetch_add_explicit(&progress, 1, memory_order_relaxed);
  }
  return 0;
}

static void mode_clonevm(void) {
  start_hammers();
  size_t sz = 1 << 20;
  char *stack = mmap(0, sz, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0);
  pid_t pid = clone(clone_child, stack + sz, CLONE_VM | SIGCHLD, 0);
  if (pid < 0) {
    printf("CORRUPT clone failed\n");
    fflush(stdout);
    _exit(3);
  }
  reap(pid); /* never returns normally: the child loops forever */
  printf("CORRUPT clone child exited\n");
  fflush(stdout);
  _exit(3);
}

static int short_clone_child(void *arg) {
  long seed = (long)arg;
  for (long i = seed; i < seed + 2000; i++) {
    if (hot_jump(i) != want_jump(i)) syscall(SYS_exit, 3);
    if (hot_int3((i & 7) + 1) != want_int3((i & 7) + 1)) syscall(SYS_exit, 4);
    if (hot_rec(i & 7) != want_rec(i & 7)) syscall(SYS_exit, 5);
  }
  syscall(SYS_exit, 0);
  return 0;
}

static void mode_clonevm_churn(void) {
  start_hammers();
  size_t sz = 1 << 20;
  char *stack = mmap(0, sz, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0);
  for (long k = 0;; k++) {
    /* One child at a time: they all share the main thread's TLS and the stack. */
    pid_t pid = clone(short_clone_child, stack + sz, CLONE_VM | SIGCHLD, (void *)k);
    if (pid < 0) {
      printf("CORRUPT clone failed\n");
      fflush(stdout);
      _exit(3);
    }
    reap(pid);
  }
}

static volatile sig_atomic_t exec_now;
static void on_usr1(int sig) { (void)sig; exec_now = 1; }

static void mode_exec(char *self) {
  signal(SIGUSR1, on_usr1);
  start_hammers();
  while (!exec_now) usleep(1000);
  char *const argv[] = {self, "after-exec", 0};
  execv("/proc/self/exe", argv);
  printf("CORRUPT exec failed\n");
  fflush(stdout);
  _exit(3);
}

static void mode_after_exec(void) {
  printf("ready after exec\n");
  fflush(stdout);
  for (long i = 0;; i++) {
    round_of_calls(i);
    if ((i & 1023) == 0) atomic_fetch_add(&progress, 1);
  }
}

int main(int argc, char **argv) {
  const char *mode = argc > 1 ? argv[1] : "threads";
  pthread_t r;
  pthread_create(&r, 0, reporter, 0);
  if (strcmp(mode, "after-exec") != 0) {
    printf("ready\n");
    fflush(stdout);
  }
  if (!strcmp(mode, "threads")) {
    if (argc > 2) short_rounds = atol(argv[2]);
    mode_threads();
  }
  if (!strcmp(mode, "fork")) mode_fork();
  if (!strcmp(mode, "vfork")) mode_vfork();
  if (!strcmp(mode, "clonevm")) mode_clonevm();
  if (!strcmp(mode, "clonevm-churn")) mode_clonevm_churn();
  if (!strcmp(mode, "exec")) mode_exec(argv[0]);
  if (!strcmp(mode, "after-exec")) mode_after_exec();
  printf("CORRUPT unknown mode %s\n", mode);
  return 3;
}
