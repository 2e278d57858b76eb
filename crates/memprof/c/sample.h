/* Sampled mode (WEFT_MEMPROF_MODE=sampled): no rebuild. Every thread of the
 * process gets a perf software event counting its own CPU time (task-clock, user
 * mode only) that overflows every WEFT_MEMPROF_PERIOD_US microseconds of it and
 * then sends that thread SIGPROF (F_SETOWN_EX to the thread, F_SETSIG). The
 * handler decodes the instruction the thread was about to run (decode.h): when it
 * reads or writes memory through registers, its effective address is computed
 * from the interrupted registers and, when it falls in a tracked object, that
 * object gets one sampled read and/or write in the thread's counters (the same
 * tables counted mode uses). Nothing in the target is read but code bytes and
 * the shadow; the accessed memory itself is never touched. When the
 * instruction gives no address (it is no access, or a load into its own base
 * register, `mov (%rdx),%rdx`, so its address is gone), the thread is
 * single-stepped (the trap flag, set in the signal's saved flags) up to 8
 * instructions (WEFT_MEMPROF_STEPS) to the next access, decoded before it runs; only where SIGTRAP
 * reaches our handler (not blocked in the thread, our handler still the one
 * installed), and any SIGTRAP not ours goes to the program's disposition; no
 * step runs a pushf (it would save the trap flag for a popf to set again; a
 * stray step trap in a program without a SIGTRAP handler is dropped anyway).
 *
 * A sample lands on an instruction with a probability proportional to the time
 * the thread spends there, so an object's samples are proportional to its
 * accesses weighted by their cost (a cache miss weighs more than a hit): the
 * counts rank objects, they are not access counts. With the period P, one sample
 * stands for P of CPU time; the report says so.
 *
 * A sampler thread looks at /proc/self/task every 10 ms and opens the event for
 * each new thread (itself excepted). Only running threads get the signal (the
 * clock does not advance while a thread waits), installed with SA_RESTART; a
 * program that installs its own SIGPROF handler takes the signals over (they then
 * are its profiler's ticks) and sampling stops being accurate, nothing worse.
 */
#include <linux/perf_event.h>
#include <sys/ioctl.h>
#include <sys/uio.h>
#include <ucontext.h>
#include "decode.h"

static uint64_t sample_signals, sample_hits, sample_lost, sample_steps;
static int sample_running;
static pthread_t sampler;
static uint64_t period_ns = 50000; /* WEFT_MEMPROF_PERIOD_US */

#define MAXT 1024
struct tsample {
  pid_t tid;
  int fd;
  int seen;
};
static struct tsample ts[MAXT];
static int nts;
static pid_t sampler_tid;

/* The code bytes [pc - 16, pc + 32) into buf: read directly within pc's page
 * (mapped: the thread was running there), through process_vm_readv (which fails
 * instead of faulting) for what lies in the neighbouring pages; what cannot be
 * read stays 0 (decodes to nothing). */
static void code_bytes(const uint8_t *pc, uint8_t *buf) {
  uintptr_t start = (uintptr_t)pc - 16, page = (uintptr_t)pc & ~(uintptr_t)4095;
  for (int k = 0; k < 48; k++) {
    uintptr_t a = start + (uintptr_t)k;
    buf[k] = a >= page && a < page + 4096 ? *(const uint8_t *)a : 0;
  }
  uintptr_t lo = start < page ? start : 0, hi = start + 48 > page + 4096 ? page + 4096 : 0;
  if (lo) {
    struct iovec l = {buf, page - lo}, r = {(void *)lo, page - lo};
    syscall(SYS_process_vm_readv, syscall(SYS_getpid), &l, 1ul, &r, 1ul, 0ul);
  }
  if (hi) {
    size_t n = start + 48 - hi;
    struct iovec l = {buf + (hi - start), n}, r = {(void *)hi, n};
    syscall(SYS_process_vm_readv, syscall(SYS_getpid), &l, 1ul, &r, 1ul, 0ul);
  }
}

static void attribute(const struct access *acc, int n) {
  for (int k = 0; k < n; k++) {
    uintptr_t a = acc[k].addr;
    if (a < __atomic_load_n(&heap_lo, __ATOMIC_RELAXED) || a >= __atomic_load_n(&heap_hi, __ATOMIC_RELAXED))
      continue;
    uint32_t id = lookup(a);
    if (!id) continue;
    __atomic_fetch_add(&sample_hits, 1, __ATOMIC_RELAXED);
    if (acc[k].kind & ACC_READ) count_id(id, acc[k].bytes, 0);
    if (acc[k].kind & ACC_WRITE) count_id(id, acc[k].bytes, 1);
  }
}

/* Stepping to the next access (see the top of this file). */
static int max_steps = 8; /* WEFT_MEMPROF_STEPS (0: never step) */
#define EFLAGS_TF 0x100
static __thread int steps_left __attribute__((tls_model("initial-exec")));
static struct sigaction old_trap; /* the program's SIGTRAP disposition before ours */
static void on_trap(int sig, siginfo_t *si, void *uc_);

/* Whether the interrupted thread may be single-stepped: SIGTRAP reaches our
 * handler (not blocked there, ours still installed: a trap blocked or ignored
 * would kill the process), and nothing else is stepping it. */
static int may_step(ucontext_t *uc) {
  if (steps_left || (uc->uc_mcontext.gregs[REG_EFL] & EFLAGS_TF) || sigismember(&uc->uc_sigmask, SIGTRAP))
    return 0;
  struct sigaction cur;
  return !sigaction(SIGTRAP, 0, &cur) && (cur.sa_flags & SA_SIGINFO) && cur.sa_sigaction == on_trap;
}

static void on_sample(int sig, siginfo_t *si, void *uc_) {
  (void)sig;
  (void)si;
  int saved = errno;
  ucontext_t *uc = uc_;
  __atomic_fetch_add(&sample_signals, 1, __ATOMIC_RELAXED);
  struct access acc[2];
  uint8_t code[48];
  code_bytes((const uint8_t *)uc->uc_mcontext.gregs[REG_RIP], code);
  int n = decode_sample(code + 16, uc->uc_mcontext.gregs, acc);
  if (n > 0) {
    attribute(acc, n);
  } else if (max_steps && may_step(uc) && code[16] != 0x9c) {
    steps_left = max_steps;
    uc->uc_mcontext.gregs[REG_EFL] |= EFLAGS_TF;
  }
  errno = saved;
}

/* A single step's trap: the instruction now at pc is about to run, its registers
 * intact. Any other SIGTRAP goes where it would have gone without us. */
static void on_trap(int sig, siginfo_t *si, void *uc_) {
  ucontext_t *uc = uc_;
  if (!steps_left && si->si_code == TRAP_TRACE && !(old_trap.sa_flags & SA_SIGINFO) &&
      (old_trap.sa_handler == SIG_DFL || old_trap.sa_handler == SIG_IGN)) {
    /* A step trap nobody asked for: a trap flag of ours that the program saved
     * (pushf) and restored (popf). A program with no SIGTRAP handler does not
     * step itself: drop the flag. */
    uc->uc_mcontext.gregs[REG_EFL] &= ~EFLAGS_TF;
    return;
  }
  if (!steps_left || si->si_code != TRAP_TRACE) {
    if (old_trap.sa_flags & SA_SIGINFO) {
      if (old_trap.sa_sigaction) old_trap.sa_sigaction(sig, si, uc_);
    } else if (old_trap.sa_handler == SIG_IGN) {
    } else if (old_trap.sa_handler != SIG_DFL) {
      old_trap.sa_handler(sig);
    } else {
      /* What the default would have done: the process ends with SIGTRAP. */
      signal(SIGTRAP, SIG_DFL);
      raise(SIGTRAP);
    }
    return;
  }
  int saved = errno;
  __atomic_fetch_add(&sample_steps, 1, __ATOMIC_RELAXED);
  struct access acc[2];
  uint8_t code[48];
  int len;
  code_bytes((const uint8_t *)uc->uc_mcontext.gregs[REG_RIP], code);
  int n = decode_access(code + 16, uc->uc_mcontext.gregs, acc, &len, 0);
  /* Never step over pushf: the flags it saves would carry the trap flag. */
  int k = 0;
  while (k < 4 && (code[16 + k] == 0x66 || (code[16 + k] & 0xf0) == 0x40)) k++;
  if (code[16 + k] == 0x9c) steps_left = 1;
  if (n > 0 || --steps_left == 0) {
    if (n > 0) attribute(acc, n);
    steps_left = 0;
    uc->uc_mcontext.gregs[REG_EFL] &= ~EFLAGS_TF;
  }
  errno = saved;
}

struct dirent64_raw {
  uint64_t ino;
  int64_t off;
  unsigned short reclen;
  unsigned char type;
  char name[];
};

static int open_clock(pid_t tid) {
  struct perf_event_attr a;
  slow_set(&a, 0, sizeof a);
  a.type = PERF_TYPE_SOFTWARE;
  a.size = sizeof a;
  a.config = PERF_COUNT_SW_TASK_CLOCK;
  a.sample_period = period_ns;
  a.wakeup_events = 1;
  a.exclude_kernel = 1;
  a.exclude_hv = 1;
  a.disabled = 1;
  int fd = (int)syscall(SYS_perf_event_open, &a, tid, -1, -1, PERF_FLAG_FD_CLOEXEC);
  if (fd < 0) return -1;
  struct f_owner_ex owner = {F_OWNER_TID, tid};
  if (fcntl(fd, F_SETOWN_EX, &owner) || fcntl(fd, F_SETSIG, SIGPROF) ||
      fcntl(fd, F_SETFL, O_ASYNC | O_NONBLOCK) || ioctl(fd, PERF_EVENT_IOC_ENABLE, 0)) {
    close(fd);
    return -1;
  }
  return fd;
}

/* The process's threads (but the sampler), each with its clock. */
static void scan_threads(void) {
  int d = open("/proc/self/task", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (d < 0) return;
  for (int i = 0; i < nts; i++) ts[i].seen = 0;
  char buf[4096];
  long n;
  while ((n = syscall(SYS_getdents64, d, buf, sizeof buf)) > 0) {
    for (long at = 0; at < n;) {
      struct dirent64_raw *e = (struct dirent64_raw *)(buf + at);
      at += e->reclen;
      if (e->name[0] < '0' || e->name[0] > '9') continue;
      pid_t tid = (pid_t)strtol(e->name, 0, 10);
      if (tid == sampler_tid) continue;
      int i;
      for (i = 0; i < nts && ts[i].tid != tid; i++) {
      }
      if (i < nts) {
        ts[i].seen = 1;
        continue;
      }
      int fd = nts < MAXT ? open_clock(tid) : -1;
      if (fd < 0) {
        sample_lost++;
        continue;
      }
      ts[nts].tid = tid;
      ts[nts].fd = fd;
      ts[nts].seen = 1;
      nts++;
    }
  }
  close(d);
  for (int i = 0; i < nts;) {
    if (ts[i].seen) {
      i++;
      continue;
    }
    close(ts[i].fd);
    ts[i] = ts[--nts];
  }
}

static void sleep_ns(uint64_t ns) {
  struct timespec t = {(time_t)(ns / 1000000000ull), (long)(ns % 1000000000ull)};
  while (nanosleep(&t, &t) && errno == EINTR) {
  }
}

static void *sample_loop(void *arg) {
  (void)arg;
  sampler_tid = (pid_t)syscall(SYS_gettid);
  while (__atomic_load_n(&sample_running, __ATOMIC_ACQUIRE)) {
    scan_threads();
    sleep_ns(10000000);
  }
  for (int i = 0; i < nts; i++) {
    ioctl(ts[i].fd, PERF_EVENT_IOC_DISABLE, 0);
    close(ts[i].fd);
  }
  nts = 0;
  return 0;
}

static void sample_start(void) {
  const char *p = getenv("WEFT_MEMPROF_PERIOD_US");
  if (p && strtoull(p, 0, 10) > 0) period_ns = strtoull(p, 0, 10) * 1000ull;
  if ((p = getenv("WEFT_MEMPROF_STEPS"))) max_steps = atoi(p) < 0 ? 0 : atoi(p) > 64 ? 64 : atoi(p);
  struct sigaction sa;
  slow_set(&sa, 0, sizeof sa);
  sa.sa_sigaction = on_sample;
  sa.sa_flags = SA_SIGINFO | SA_RESTART;
  sigemptyset(&sa.sa_mask);
  /* A sample never interrupts a step's trap handler (nor the reverse): each
   * blocks the other's signal. */
  sigaddset(&sa.sa_mask, SIGPROF);
  sa.sa_sigaction = on_trap;
  if (sigaction(SIGTRAP, &sa, &old_trap)) return;
  sigemptyset(&sa.sa_mask);
  sigaddset(&sa.sa_mask, SIGTRAP);
  sa.sa_sigaction = on_sample;
  if (sigaction(SIGPROF, &sa, 0)) return;
  __atomic_store_n(&sample_running, 1, __ATOMIC_RELEASE);
  /* The main thread at once (the sampler's first scan would come a little later). */
  int fd = open_clock((pid_t)syscall(SYS_gettid));
  if (fd >= 0) {
    ts[0].tid = (pid_t)syscall(SYS_gettid);
    ts[0].fd = fd;
    nts = 1;
  }
  in_hook = 1; /* the thread's own allocations are not the program's */
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old); /* the sampler takes no signal */
  if (pthread_create(&sampler, 0, sample_loop, 0)) sample_running = 0;
  pthread_sigmask(SIG_SETMASK, &old, 0);
  in_hook = 0;
}

static void sample_stop(void) {
  if (!__atomic_exchange_n(&sample_running, 0, __ATOMIC_ACQ_REL)) return;
  pthread_join(sampler, 0);
}
