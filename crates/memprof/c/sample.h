/* Sampled mode (WEFT_MEMPROF_MODE=sampled): no rebuild. A sampler thread rotates
 * the 4 hardware watchpoints over the live objects: every period
 * (WEFT_MEMPROF_PERIOD_US) it watches one 8-byte word of each of 4 objects, in
 * every thread of the process, for a fifth of the period, as perf breakpoint
 * events in counting mode (the kernel counts the hits: no signal, nothing in the
 * target's signal handling), then reads the counts. Objects are taken in
 * allocation order, round robin; each watch alternates between read-or-write and
 * write-only, so reads and writes are estimated apart.
 *
 * Estimate of an object's accesses: (hits / watched time) for one word, times its
 * words, times its lifetime: exact for accesses spread evenly over the object's
 * words and lifetime; an object never watched estimates 0. The program is slowed
 * only while a watched word is hit (a debug exception each), at most for the
 * watched fifth of the time. Threads beyond the first 64 are not watched (their
 * windows count as lost).
 */
#include <linux/hw_breakpoint.h>
#include <linux/perf_event.h>
#include <pthread.h>
#include <sys/ioctl.h>

struct samp {
  uint64_t hits_rw, ns_rw, hits_w, ns_w, watches;
};
static struct samp *samp; /* [max_objs] */
static uint64_t sample_windows, sample_hits, sample_lost;
static int sample_running;
static pthread_t sampler;
static uint64_t period_ns = 1000000;

#define MAXT 64
struct twatch {
  pid_t tid;
  int fd[4];
  int seen;
};
static struct twatch tw[MAXT];
static int ntw;
static pid_t sampler_tid;

static struct perf_event_attr bp_attr(uint64_t addr, int type) {
  struct perf_event_attr a;
  slow_set(&a, 0, sizeof a);
  a.type = PERF_TYPE_BREAKPOINT;
  a.size = sizeof a;
  a.bp_type = type;
  a.bp_addr = addr;
  a.bp_len = HW_BREAKPOINT_LEN_8;
  a.exclude_kernel = 1;
  a.exclude_hv = 1;
  a.disabled = 1;
  return a;
}

struct dirent64_raw {
  uint64_t ino;
  int64_t off;
  unsigned short reclen;
  unsigned char type;
  char name[];
};

/* The process's threads (but the sampler), each with 4 breakpoint events. */
static void scan_threads(void) {
  int d = open("/proc/self/task", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (d < 0) return;
  for (int i = 0; i < ntw; i++) tw[i].seen = 0;
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
      for (i = 0; i < ntw && tw[i].tid != tid; i++) {
      }
      if (i < ntw) {
        tw[i].seen = 1;
        continue;
      }
      if (ntw == MAXT) {
        sample_lost++;
        continue;
      }
      struct twatch *t = &tw[ntw];
      struct perf_event_attr a = bp_attr((uint64_t)&sample_windows, HW_BREAKPOINT_RW);
      int ok = 1;
      for (int k = 0; k < 4; k++) {
        t->fd[k] = (int)syscall(SYS_perf_event_open, &a, tid, -1, -1, PERF_FLAG_FD_CLOEXEC);
        if (t->fd[k] < 0) ok = 0;
      }
      if (!ok) {
        for (int k = 0; k < 4; k++)
          if (t->fd[k] >= 0) close(t->fd[k]);
        sample_lost++;
        continue;
      }
      t->tid = tid;
      t->seen = 1;
      ntw++;
    }
  }
  close(d);
  for (int i = 0; i < ntw;) {
    if (tw[i].seen) {
      i++;
      continue;
    }
    for (int k = 0; k < 4; k++) close(tw[i].fd[k]);
    tw[i] = tw[--ntw];
  }
}

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint64_t next_rand(void) {
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  return rng;
}

static void sleep_ns(uint64_t ns) {
  struct timespec ts = {(time_t)(ns / 1000000000ull), (long)(ns % 1000000000ull)};
  while (nanosleep(&ts, &ts) && errno == EINTR) {
  }
}

static void *sample_loop(void *arg) {
  (void)arg;
  sampler_tid = (pid_t)syscall(SYS_gettid);
  uint64_t cursor = 1;
  while (__atomic_load_n(&sample_running, __ATOMIC_ACQUIRE)) {
    uint64_t watch = period_ns / 5;
    scan_threads();
    uint32_t ids[4];
    uint64_t words[4];
    int types[4], n = 0;
    uint64_t last = __atomic_load_n(&next_id, __ATOMIC_RELAXED);
    if (last > max_objs) last = max_objs;
    for (uint64_t scanned = 0; n < 4 && scanned < 4096 && last > 1; scanned++) {
      if (cursor >= last) cursor = 1;
      uint64_t id = cursor++;
      struct obj *o = &objs[id];
      if (!o->t_alloc || (o->flags & OBJ_FREED)) continue;
      int dup = 0;
      for (int k = 0; k < n; k++) dup |= ids[k] == id;
      if (dup) break; /* fewer than 4 live objects */
      uint64_t nwords = o->size >= 8 ? o->size / 8 : 1;
      ids[n] = (uint32_t)id;
      words[n] = o->base + 8 * (next_rand() % nwords);
      types[n] = samp[id].watches++ & 1 ? HW_BREAKPOINT_W : HW_BREAKPOINT_RW;
      n++;
    }
    if (n && ntw) {
      for (int i = 0; i < ntw; i++)
        for (int k = 0; k < n; k++) {
          struct perf_event_attr a = bp_attr(words[k], types[k]);
          a.disabled = 0;
          ioctl(tw[i].fd[k], PERF_EVENT_IOC_MODIFY_ATTRIBUTES, &a);
          ioctl(tw[i].fd[k], PERF_EVENT_IOC_RESET, 0);
          ioctl(tw[i].fd[k], PERF_EVENT_IOC_ENABLE, 0);
        }
      uint64_t t0 = now();
      sleep_ns(watch);
      uint64_t hits[4] = {0, 0, 0, 0};
      for (int i = 0; i < ntw; i++)
        for (int k = 0; k < n; k++) {
          uint64_t c = 0;
          ioctl(tw[i].fd[k], PERF_EVENT_IOC_DISABLE, 0);
          if (read(tw[i].fd[k], &c, sizeof c) == sizeof c) hits[k] += c;
        }
      uint64_t dt = now() - t0;
      for (int k = 0; k < n; k++) {
        struct samp *s = &samp[ids[k]];
        if (types[k] == HW_BREAKPOINT_W) {
          s->hits_w += hits[k];
          s->ns_w += dt;
        } else {
          s->hits_rw += hits[k];
          s->ns_rw += dt;
        }
        sample_hits += hits[k];
      }
      sample_windows++;
      sleep_ns(period_ns - watch);
    } else {
      sleep_ns(period_ns);
    }
  }
  for (int i = 0; i < ntw; i++)
    for (int k = 0; k < 4; k++) close(tw[i].fd[k]);
  ntw = 0;
  return 0;
}

static void sample_start(void) {
  const char *p = getenv("WEFT_MEMPROF_PERIOD_US");
  if (p && strtoull(p, 0, 10) > 0) period_ns = strtoull(p, 0, 10) * 1000ull;
  samp = map(max_objs * sizeof(struct samp));
  if (!samp) return;
  __atomic_store_n(&sample_running, 1, __ATOMIC_RELEASE);
  in_hook = 1; /* the thread's own allocations are not the program's */
  if (pthread_create(&sampler, 0, sample_loop, 0)) sample_running = 0;
  in_hook = 0;
}

static void sample_stop(void) {
  if (!__atomic_exchange_n(&sample_running, 0, __ATOMIC_ACQ_REL)) return;
  pthread_join(sampler, 0);
}

/* The estimated reads and writes of object id (see the top of this file). */
static void sample_estimate(uint64_t id, uint64_t end, uint64_t out[4]) {
  struct obj *o = &objs[id];
  struct samp *s = &samp[id];
  double life = (double)(((o->flags & OBJ_FREED) ? o->t_free : end) - o->t_alloc);
  double words = o->max_size >= 8 ? (double)(o->max_size / 8) : 1.0;
  double acc = s->ns_rw ? (double)s->hits_rw / (double)s->ns_rw * words * life : 0;
  double w = s->ns_w ? (double)s->hits_w / (double)s->ns_w * words * life : 0;
  if (!s->ns_rw && s->ns_w) acc = w;
  if (w > acc) w = acc;
  out[0] = (uint64_t)(acc - w + 0.5);
  out[1] = (uint64_t)(w + 0.5);
  out[2] = out[0] * 8;
  out[3] = out[1] * 8;
}
