/* Signals and weaving. usage: signals MODE
 *   reenter   a 20 kHz SIGPROF timer whose handler (SA_NODEFER) calls the probed
 *             functions the interrupted threads are calling; progress = handlers run
 *   altstack  as reenter, on SIGUSR1 sent to each thread by a timer thread, with the
 *             handler on an alternate signal stack (sigaltstack, SA_ONSTACK)
 *   faults    the target's own SIGSEGV and SIGTRAP handlers: it faults on purpose
 *             (reads address 0x10) and recovers with siglongjmp, and executes its
 *             own int3; both handlers must see exactly their own signals. Also calls
 *             take_ptr() with bad pointers, for advice that reads through them.
 *             progress = faults recovered
 *   reinstall as faults, re-installing its handlers every millisecond (as programs
 *             that set handlers lazily do)
 * Every result is checked: CORRUPT + exit 3. */
#define _GNU_SOURCE
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/time.h>
#include <sys/syscall.h>

#include "probed.h"

static atomic_long progress;
static atomic_long round_count;

static void *reporter(void *arg) {
  (void)arg;
  for (;;) {
    usleep(100000);
    printf("progress %ld\n", atomic_load(&progress));
    fflush(stdout);
  }
  return 0;
}

/* ---- reenter / altstack ---- */

static void on_signal(int sig) {
  (void)sig;
  long i = atomic_fetch_add_explicit(&progress, 1, memory_order_relaxed);
  round_of_calls(i);
}

static void *worker(void *arg) {
  if (arg) {
    stack_t ss = {.ss_sp = malloc(1 << 16), .ss_size = 1 << 16, .ss_flags = 0};
    sigaltstack(&ss, 0);
  }
  for (long i = 0;; i++) {
    round_of_calls(i);
    atomic_fetch_add_explicit(&round_count, 1, memory_order_relaxed);
  }
  return 0;
}

static pid_t worker_tids[3];

static void *tid_worker(void *arg) {
  worker_tids[(long)arg] = gettid();
  return worker(0);
}

static void mode_reenter(void) {
  struct sigaction sa = {0};
  sa.sa_handler = on_signal;
  sa.sa_flags = SA_NODEFER | SA_RESTART;
  sigaction(SIGPROF, &sa, 0);
  sigaction(SIGUSR2, &sa, 0);
  for (long t = 0; t < 3; t++) {
    pthread_t th;
    pthread_create(&th, 0, tid_worker, (void *)t);
  }
  struct itimerval it = {{0, 1000}, {0, 1000}};
  setitimer(ITIMER_PROF, &it, 0);
  /* SIGUSR2 at a high rate, often twice in a row (nested handlers). */
  for (long k = 0;; k++) {
    pid_t tid = worker_tids[k % 3];
    if (tid) {
      syscall(SYS_tgkill, getpid(), tid, SIGUSR2);
      if (k & 1) syscall(SYS_tgkill, getpid(), tid, SIGUSR2);
    }
    usleep(20);
  }
}

static pthread_t workers[3];

static void mode_altstack(void) {
  struct sigaction sa = {0};
  sa.sa_handler = on_signal;
  sa.sa_flags = SA_ONSTACK | SA_RESTART;
  sigaction(SIGUSR1, &sa, 0);
  for (int t = 0; t < 3; t++) pthread_create(&workers[t], 0, worker, (void *)1);
  for (long k = 0;; k++) {
    pthread_kill(workers[k % 3], SIGUSR1);
    usleep(50);
  }
}

/* ---- faults / reinstall ---- */

static __thread sigjmp_buf *recover;
/* Per thread: the handler runs on the thread that executed the int3. */
static __thread long own_traps, traps_executed;

static void on_segv(int sig, siginfo_t *si, void *ctx) {
  (void)sig;
  (void)ctx;
  if (si->si_addr != (void *)0x10 || !recover) {
    char buf[128];
    int n = snprintf(buf, sizeof buf, "CORRUPT unexpected SIGSEGV at %p (code %d)\n",
                     si->si_addr, si->si_code);
    if (write(1, buf, n)) {}
    _exit(3);
  }
  siglongjmp(*recover, 1);
}

static void on_trap(int sig, siginfo_t *si, void *ctx) {
  (void)sig;
  ucontext_t *uc = ctx;
  extern char own_int3_after[];
  if (si->si_code != 0x80 /* SI_KERNEL */ ||
      (char *)uc->uc_mcontext.gregs[REG_RIP] != own_int3_after) {
    char buf[128];
    int n = snprintf(buf, sizeof buf, "CORRUPT unexpected SIGTRAP at %p (code %d)\n",
                     (void *)uc->uc_mcontext.gregs[REG_RIP], si->si_code);
    if (write(1, buf, n)) {}
    _exit(3);
  }
  own_traps++;
}

static void install_handlers(void) {
  struct sigaction sa = {0};
  sa.sa_sigaction = on_segv;
  sa.sa_flags = SA_SIGINFO | SA_NODEFER;
  sigaction(SIGSEGV, &sa, 0);
  sa.sa_sigaction = on_trap;
  sigaction(SIGTRAP, &sa, 0);
}

/* Advice reads through arg0 here: bad pointers must not reach the target's handler. */
__attribute__((noipa)) long take_ptr(const char *p, long n) {
  __asm__ volatile("");
  return n + (p == 0);
}

static char *unmapped;

static void *fault_worker(void *arg) {
  (void)arg;
  sigjmp_buf env;
  recover = &env;
  const char *ptrs[] = {(char *)1, (char *)-1L, (char *)0x10, unmapped, "fine", 0};
  for (long i = 0;; i++) {
    round_of_calls(i);
    CHECK(take_ptr(ptrs[i % 6], i), i + (ptrs[i % 6] == 0));
    if ((i & 255) == 0) {
      if (sigsetjmp(env, 1) == 0) {
        volatile long *bad = (volatile long *)0x10;
        __asm__ volatile("" : "+r"(bad));
        (void)*bad;
        printf("CORRUPT no fault at 0x10\n");
        fflush(stdout);
        _exit(3);
      }
      atomic_fetch_add(&progress, 1);
      traps_executed++;
      __asm__ volatile("int3\n.globl own_int3_after\nown_int3_after:\n" ::: "memory");
      if (own_traps != traps_executed) {
        printf("CORRUPT own traps seen %ld, executed %ld\n", own_traps, traps_executed);
        fflush(stdout);
        _exit(3);
      }
    }
  }
  return 0;
}

static void mode_faults(int reinstall) {
  unmapped = mmap(0, 4096, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  install_handlers();
  for (int t = 0; t < 2; t++) {
    pthread_t th;
    pthread_create(&th, 0, fault_worker, 0);
  }
  for (;;) {
    usleep(1000);
    if (reinstall) install_handlers();
  }
}

int main(int argc, char **argv) {
  const char *mode = argc > 1 ? argv[1] : "reenter";
  pthread_t r;
  pthread_create(&r, 0, reporter, 0);
  printf("ready\n");
  fflush(stdout);
  if (!strcmp(mode, "reenter")) mode_reenter();
  if (!strcmp(mode, "altstack")) mode_altstack();
  if (!strcmp(mode, "faults")) mode_faults(0);
  if (!strcmp(mode, "reinstall")) mode_faults(1);
  printf("CORRUPT unknown mode %s\n", mode);
  return 3;
}
