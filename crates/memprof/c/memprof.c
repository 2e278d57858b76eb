/* libweft_memprof.so: preloaded by `weft memprof` into the program it launches.
 *
 * - Allocation tracking: malloc, calloc, realloc, free, posix_memalign,
 *   aligned_alloc, memalign, valloc, pvalloc are interposed (glibc's supported way
 *   of replacing malloc; C++ new/delete reach them through libstdc++). Each object
 *   gets an id (1, 2, ... in allocation order), its allocation site (the call stack,
 *   WEFT_MEMPROF_DEPTH frames, interned in a site table: a hash of the return
 *   addresses, equal stacks share one record), its times. The stack is a
 *   frame-pointer walk (WEFT_MEMPROF_STACK=fp, weft's choice for a program built
 *   with frame pointers): every frame pointer checked against the thread's stack
 *   bounds before it is read, so a program without them ends the walk early,
 *   never faults; WEFT_MEMPROF_STACK=unwind takes glibc's backtrace() instead.
 * - Address -> object: a two-level shadow table, one u32 object id per 16-byte
 *   granule (glibc's objects are 16-aligned and two never share a granule), L1 by
 *   4 MiB region. O(1): two loads. Before it, the heap range filter: [heap_lo,
 *   heap_hi) spans every object handed out so far (it only grows), and an address
 *   outside it (the stack, globals) is rejected with two compares.
 * - Counted mode: the compiler's access hooks (clang -fsanitize-coverage
 *   trace-loads/trace-stores, gcc/clang -fsanitize=thread) count reads and writes
 *   per object in per-thread tables (an initial-exec TLS pointer to a flat array
 *   indexed by object id: no locks, no atomics), merged at exit; memcpy, memmove,
 *   memset count one access per object touched, with its bytes.
 * - Sampled mode (WEFT_MEMPROF_MODE=sampled): see sample.h.
 * - At exit (in the process weft launched, not in its children) everything is
 *   written to WEFT_MEMPROF_OUT with raw system calls; weft reads it, symbolizes and
 *   reports.
 *
 * Nothing here calls the program's malloc: tables are mmap'ed. Memory allocated
 * before this library's constructor, or by this library's own callees
 * (backtrace's first dlopen, pthread_getattr_np), is not tracked; freeing it is
 * fine.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <execinfo.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define V __attribute__((visibility("default")))
#define LIKELY(x) __builtin_expect(!!(x), 1)
#define UNLIKELY(x) __builtin_expect(!!(x), 0)

extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void __libc_free(void *);
extern void *__libc_memalign(size_t, size_t);
extern void *__libc_valloc(size_t);
extern void *__libc_pvalloc(size_t);

/* ---- the dump format (crates/memprof/src/dump.rs reads it) ---- */
#define MAGIC "WEFTMP03"
#define MAX_DEPTH 16
struct site {
  uint64_t hash;
  uint32_t nframes, pad;
  uint64_t pcs[MAX_DEPTH];
};
#define OBJ_FREED 1u
struct obj {
  uint64_t base, size, max_size, t_alloc, t_free;
  uint32_t site, tid, reallocs, flags;
  uint64_t reads, writes, rbytes, wbytes; /* filled at exit */
};

/* ---- state ---- */
static int active;          /* tracking on (the root process under weft) */
static int counted;         /* access hooks count */
static int depth = 8;
static uint64_t max_objs = 1u << 24;
static struct obj *objs;    /* [max_objs], id 0 unused */
static uint64_t next_id = 1;
static uint64_t dropped;
static struct site *sites;  /* [MAX_SITES] open addressing; index 0 = unknown */
#define MAX_SITES (1u << 16)
static uint32_t nsites = 1, sites_dropped;
static int sites_lock;
static uint64_t t_start;
static pid_t root_pid;

#define L2_SHIFT 22
#define L2_SIZE (1u << (L2_SHIFT - 4))
#define L1_SIZE (1ull << (47 - L2_SHIFT))
V uint32_t **weft_memprof_shadow; /* [L1_SIZE] */
#define shadow weft_memprof_shadow

/* Per-thread counters: 4 per object (reads, writes, read bytes, written bytes),
 * a flat array indexed by id, mapped lazily (MAP_NORESERVE) on the thread's
 * first count. */
struct tstate {
  struct tstate *next;
  uint64_t *c; /* [max_objs * 4] */
};
static struct tstate *threads;
/* Exported (with the heap range and the shadow below) for the hooks a clang LTO
 * build inlines into the program (c/hooks.c); libweft_memstub.so defines inert
 * ones for a run without weft. Accessed through the GOT here too, so the program
 * and this library agree on one copy. */
V __thread uint64_t *weft_memprof_ctr __attribute__((tls_model("initial-exec")));
#define ctr weft_memprof_ctr
static __thread int in_hook __attribute__((tls_model("initial-exec")));
/* The thread's id, once (a system call per allocation was a good part of create's
 * cost); a fork child's thread forgets it. */
static __thread uint32_t my_tid __attribute__((tls_model("initial-exec")));
static void forget_tid(void) { my_tid = 0; }

/* The heap range: every tracked object lies in [heap_lo, heap_hi). */
V uintptr_t weft_memprof_heap_lo = UINTPTR_MAX, weft_memprof_heap_hi;
#define heap_lo weft_memprof_heap_lo
#define heap_hi weft_memprof_heap_hi

static void *(*real_memcpy)(void *, const void *, size_t);
static void *(*real_memmove)(void *, const void *, size_t);
static void *(*real_memset)(void *, int, size_t);

static void *map(size_t n) {
  void *p = mmap(0, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  return p == MAP_FAILED ? 0 : p;
}

static uint64_t now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void lock(int *l) {
  while (__atomic_exchange_n(l, 1, __ATOMIC_ACQUIRE))
    while (__atomic_load_n(l, __ATOMIC_RELAXED)) __builtin_ia32_pause();
}
static void unlock(int *l) { __atomic_store_n(l, 0, __ATOMIC_RELEASE); }

/* ---- shadow ---- */
static inline uint32_t lookup(uintptr_t a) {
  if (UNLIKELY(a >> 47) || UNLIKELY(!shadow)) return 0;
  uint32_t *l2 = __atomic_load_n(&shadow[a >> L2_SHIFT], __ATOMIC_RELAXED);
  return l2 ? __atomic_load_n(&l2[(a >> 4) & (L2_SIZE - 1)], __ATOMIC_RELAXED) : 0;
}

static void shadow_set(uintptr_t base, size_t size, uint32_t id) {
  uintptr_t g = base >> 4, last = (base + (size ? size : 1) - 1) >> 4;
  if (last >> (47 - 4)) return;
  for (; g <= last; g++) {
    uintptr_t i1 = g >> (L2_SHIFT - 4);
    uint32_t *l2 = __atomic_load_n(&shadow[i1], __ATOMIC_ACQUIRE);
    if (!l2) {
      if (!id) { g |= L2_SIZE - 1; continue; }
      uint32_t *fresh = map(L2_SIZE * sizeof(uint32_t)), *want = 0;
      if (!fresh) return;
      if (__atomic_compare_exchange_n(&shadow[i1], &want, fresh, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
        l2 = fresh;
      } else {
        munmap(fresh, L2_SIZE * sizeof(uint32_t));
        l2 = want;
      }
    }
    __atomic_store_n(&l2[g & (L2_SIZE - 1)], id, __ATOMIC_RELAXED);
  }
}

static void range_add(uintptr_t p, size_t n) {
  uintptr_t lo = __atomic_load_n(&heap_lo, __ATOMIC_RELAXED), end = p + (n ? n : 1);
  while (p < lo && !__atomic_compare_exchange_n(&heap_lo, &lo, p, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
  }
  uintptr_t hi = __atomic_load_n(&heap_hi, __ATOMIC_RELAXED);
  while (end > hi && !__atomic_compare_exchange_n(&heap_hi, &hi, end, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
  }
}

/* ---- per-thread counters ---- */
static __attribute__((noinline)) uint64_t *tstate_new(void) {
  struct tstate *t = map(sizeof *t);
  uint64_t *c = map(max_objs * 4 * sizeof(uint64_t));
  if (!t || !c) {
    if (t) munmap(t, sizeof *t);
    if (c) munmap(c, max_objs * 4 * sizeof(uint64_t));
    return 0;
  }
  t->c = c;
  struct tstate *head = __atomic_load_n(&threads, __ATOMIC_RELAXED);
  do t->next = head;
  while (!__atomic_compare_exchange_n(&threads, &head, t, 1, __ATOMIC_RELEASE, __ATOMIC_RELAXED));
  ctr = c;
  return c;
}

static inline void count_id(uint32_t id, uint64_t bytes, int w) {
  uint64_t *c = ctr;
  if (UNLIKELY(!c) && !(c = tstate_new())) return;
  c += (uint64_t)id * 4;
  c[w] += 1;
  c[2 + w] += bytes;
}

/* The inlined hooks' way in when the thread has no counters yet. */
V void weft_memprof_count_slow(uint32_t id, uint64_t bytes, int w) { count_id(id, bytes, w); }

/* The hooks' path: the range filter first (stack and globals end here), then the
 * shadow. */
static inline void count(const void *p, uint64_t bytes, int w) {
  uintptr_t a = (uintptr_t)p;
  if (LIKELY(a < __atomic_load_n(&heap_lo, __ATOMIC_RELAXED) ||
             a >= __atomic_load_n(&heap_hi, __ATOMIC_RELAXED)))
    return;
  /* In the range: a user address whose object was tracked, so the shadow exists. */
  uint32_t *l2 = __atomic_load_n(&shadow[a >> L2_SHIFT], __ATOMIC_RELAXED);
  uint32_t id = l2 ? __atomic_load_n(&l2[(a >> 4) & (L2_SIZE - 1)], __ATOMIC_RELAXED) : 0;
  if (id) count_id(id, bytes, w);
}

/* Counts of object `id` summed over threads (racy reads of other threads' counters:
 * a snapshot, exact once they stopped). */
static void totals(uint32_t id, uint64_t out[4]) {
  out[0] = out[1] = out[2] = out[3] = 0;
  for (struct tstate *t = __atomic_load_n(&threads, __ATOMIC_ACQUIRE); t; t = t->next) {
    uint64_t *c = t->c + (uint64_t)id * 4;
    for (int i = 0; i < 4; i++) out[i] += __atomic_load_n(&c[i], __ATOMIC_RELAXED);
  }
}

/* ---- sites ---- */
static uint32_t site_of(void **pcs, int n) {
  uint64_t h = 1469598103934665603ull;
  for (int i = 0; i < n; i++) h = (h ^ (uint64_t)pcs[i]) * 1099511628211ull;
  h |= 1;
  lock(&sites_lock);
  uint32_t i = (uint32_t)(h >> 20) & (MAX_SITES - 1), found = 0;
  for (uint32_t probe = 0; probe < MAX_SITES; probe++, i = (i + 1) & (MAX_SITES - 1)) {
    if (i == 0) continue;
    struct site *s = &sites[i];
    if (s->hash == 0) {
      if (nsites >= MAX_SITES * 3 / 4) { sites_dropped++; break; }
      s->hash = h;
      s->nframes = (uint32_t)n;
      for (int k = 0; k < n; k++) s->pcs[k] = (uint64_t)pcs[k];
      nsites++;
      found = i;
      break;
    }
    if (s->hash == h && s->nframes == (uint32_t)n) {
      int same = 1;
      for (int k = 0; k < n && same; k++) same = s->pcs[k] == (uint64_t)pcs[k];
      if (same) { found = i; break; }
    }
  }
  unlock(&sites_lock);
  return found;
}

/* The stack from ra (the allocation function's return address) outwards, `depth`
 * frames. */
#define SKIP_MAX 6
static int use_backtrace; /* WEFT_MEMPROF_STACK=unwind */
static __thread uintptr_t stack_lo __attribute__((tls_model("initial-exec")));
static __thread uintptr_t stack_hi __attribute__((tls_model("initial-exec")));

/* The thread's stack bounds, once (pthread_getattr_np may allocate: called under
 * in_hook). A thread it cannot tell gets the empty range: its walks stop at once. */
static void stack_bounds(void) {
  pthread_attr_t at;
  void *addr;
  size_t size;
  stack_lo = UINTPTR_MAX;
  stack_hi = 1;
  if (pthread_getattr_np(pthread_self(), &at)) return;
  if (!pthread_attr_getstack(&at, &addr, &size)) {
    stack_lo = (uintptr_t)addr;
    stack_hi = (uintptr_t)addr + size;
  }
  pthread_attr_destroy(&at);
}

/* The frame-pointer chain from this function's frame: the frames up to the one
 * returning to ra are this library's (skipped), then `max` frames from ra. Each
 * frame pointer must lie in the thread's stack, 8-aligned, above the previous
 * one: a program (or a library) without frame pointers ends the walk, it never
 * makes it read outside the stack. Returns the frames taken, 0 when ra was not
 * met. */
static __attribute__((noinline)) int fp_walk(void **pcs, int max, void *ra) {
  if (UNLIKELY(!stack_hi)) stack_bounds();
  uintptr_t fp = (uintptr_t)__builtin_frame_address(0), lo = stack_lo, hi = stack_hi;
  int n = 0, skipped = 0;
  while (n < max) {
    if (fp < lo || fp > hi - 16 || (fp & 7)) break;
    uintptr_t next = ((uintptr_t *)fp)[0];
    void *pc = (void *)((uintptr_t *)fp)[1];
    if (n == 0 && pc != ra) {
      if (++skipped > SKIP_MAX) return 0;
    } else {
      if ((uintptr_t)pc < 4096) break;
      pcs[n++] = pc;
    }
    if (next <= fp) break;
    fp = next;
  }
  return n;
}

static uint32_t capture_site(void *ra) {
  void *pcs[MAX_DEPTH + SKIP_MAX];
  if (!use_backtrace) {
    int n = fp_walk(pcs, depth, ra);
    return n ? site_of(pcs, n) : site_of(&ra, 1);
  }
  int n = backtrace(pcs, depth + SKIP_MAX);
  for (int i = 0; i < n && i < SKIP_MAX; i++) {
    if (pcs[i] != ra) continue;
    int k = n - i < depth ? n - i : depth;
    return site_of(pcs + i, k);
  }
  return site_of(&ra, 1);
}

/* ---- objects ---- */
static __attribute__((noinline)) void track_new(void *p, size_t n, void *ra) {
  in_hook = 1;
  uint32_t site = capture_site(ra);
  in_hook = 0;
  uint64_t id = __atomic_fetch_add(&next_id, 1, __ATOMIC_RELAXED);
  if (UNLIKELY(id >= max_objs)) {
    __atomic_fetch_add(&dropped, 1, __ATOMIC_RELAXED);
    return;
  }
  struct obj *o = &objs[id];
  o->base = (uint64_t)p;
  o->size = o->max_size = n;
  o->t_alloc = now();
  o->site = site;
  if (UNLIKELY(!my_tid)) my_tid = (uint32_t)syscall(SYS_gettid);
  o->tid = my_tid;
  range_add((uintptr_t)p, n);
  shadow_set((uintptr_t)p, n, (uint32_t)id);
}

/* The object whose base is p, or 0. */
static uint32_t object_at(void *p) {
  uint32_t id = lookup((uintptr_t)p);
  if (id && objs[id].base == (uint64_t)p && !(objs[id].flags & OBJ_FREED)) return id;
  return 0;
}

static void track_free(void *p) {
  uint32_t id = object_at(p);
  if (!id) return;
  struct obj *o = &objs[id];
  shadow_set(o->base, o->size, 0);
  o->t_free = now();
  o->flags |= OBJ_FREED;
}


/* ---- interposed allocation functions ---- */
#define RA __builtin_return_address(0)

V void *malloc(size_t n) {
  void *p = __libc_malloc(n);
  if (active && p && !in_hook) track_new(p, n, RA);
  return p;
}

V void *calloc(size_t k, size_t n) {
  void *p = __libc_calloc(k, n);
  if (active && p && !in_hook) track_new(p, k * n, RA);
  return p;
}

V void free(void *p) {
  if (p && active) track_free(p);
  __libc_free(p);
}

V void cfree(void *p) { free(p); }

/* realloc keeps the object's identity: same id, same allocation site, its counts go
 * on; base and size become the new ones (max_size keeps the largest), reallocs
 * counts the calls. realloc(NULL, n) is a malloc (a new object, this call's site);
 * realloc(p, 0) frees p (glibc's behaviour) and ends the object. */
V void *realloc(void *p, size_t n) {
  if (!active || in_hook) return __libc_realloc(p, n);
  if (!p) {
    void *q = __libc_realloc(0, n);
    if (q) track_new(q, n, RA);
    return q;
  }
  uint32_t id = object_at(p);
  if (n == 0) {
    if (id) track_free(p);
    return __libc_realloc(p, 0);
  }
  if (id) shadow_set((uintptr_t)p, objs[id].size, 0);
  void *q = __libc_realloc(p, n);
  if (!id) {
    if (q) track_new(q, n, RA);
    return q;
  }
  struct obj *o = &objs[id];
  if (q) {
    range_add((uintptr_t)q, n);
    o->base = (uint64_t)q;
    o->size = n;
    if (n > o->max_size) o->max_size = n;
    o->reallocs++;
  }
  shadow_set(o->base, o->size, id);
  return q;
}

V void *memalign(size_t align, size_t n) {
  void *p = __libc_memalign(align, n);
  if (active && p && !in_hook) track_new(p, n, RA);
  return p;
}

V void *aligned_alloc(size_t align, size_t n) {
  void *p = __libc_memalign(align, n);
  if (active && p && !in_hook) track_new(p, n, RA);
  return p;
}

V int posix_memalign(void **out, size_t align, size_t n) {
  if (align % sizeof(void *) || (align & (align - 1)) || !align) return EINVAL;
  void *p = __libc_memalign(align, n);
  if (!p) return ENOMEM;
  if (active && !in_hook) track_new(p, n, RA);
  *out = p;
  return 0;
}

V void *valloc(size_t n) {
  void *p = __libc_valloc(n);
  if (active && p && !in_hook) track_new(p, n, RA);
  return p;
}

V void *pvalloc(size_t n) {
  void *p = __libc_pvalloc(n);
  if (active && p && !in_hook) track_new(p, n, RA);
  return p;
}

/* ---- memcpy & co: one access per object touched, with its bytes ---- */
__attribute__((optimize("no-tree-loop-distribute-patterns"))) static void *
slow_copy(void *d, const void *s, size_t n) {
  unsigned char *dd = d;
  const unsigned char *ss = s;
  if (dd < ss)
    for (size_t i = 0; i < n; i++) dd[i] = ss[i];
  else
    for (size_t i = n; i-- > 0;) dd[i] = ss[i];
  return d;
}
__attribute__((optimize("no-tree-loop-distribute-patterns"))) static void *
slow_set(void *d, int c, size_t n) {
  unsigned char *dd = d;
  for (size_t i = 0; i < n; i++) dd[i] = (unsigned char)c;
  return d;
}

#include "sample.h"

V void *memcpy(void *d, const void *s, size_t n) {
  if (counted && n) { count(s, n, 0); count(d, n, 1); }
  return real_memcpy ? real_memcpy(d, s, n) : slow_copy(d, s, n);
}
V void *memmove(void *d, const void *s, size_t n) {
  if (counted && n) { count(s, n, 0); count(d, n, 1); }
  return real_memmove ? real_memmove(d, s, n) : slow_copy(d, s, n);
}
V void *memset(void *d, int c, size_t n) {
  if (counted && n) count(d, n, 1);
  return real_memset ? real_memset(d, c, n) : slow_set(d, c, n);
}

/* ---- the compilers' access hooks ---- */
/* The hooks need no frame of their own (the allocation stack's walk never passes
 * through them). */
#define HOOK V __attribute__((optimize("omit-frame-pointer")))
#define SANCOV(n)                                                          \
  HOOK void __sanitizer_cov_load##n(void *a) { count(a, n, 0); }          \
  HOOK void __sanitizer_cov_store##n(void *a) { count(a, n, 1); }
SANCOV(1) SANCOV(2) SANCOV(4) SANCOV(8) SANCOV(16)
#define TSAN(n)                                                            \
  HOOK void __tsan_read##n(void *a) { count(a, n, 0); }                   \
  HOOK void __tsan_write##n(void *a) { count(a, n, 1); }                  \
  HOOK void __tsan_unaligned_read##n(void *a) { count(a, n, 0); }         \
  HOOK void __tsan_unaligned_write##n(void *a) { count(a, n, 1); }        \
  HOOK void __tsan_volatile_read##n(void *a) { count(a, n, 0); }          \
  HOOK void __tsan_volatile_write##n(void *a) { count(a, n, 1); }
TSAN(1) TSAN(2) TSAN(4) TSAN(8) TSAN(16)
V void __tsan_init(void) {}
V void __tsan_func_entry(void *p) { (void)p; }
V void __tsan_func_exit(void) {}
V void __tsan_read_range(void *a, size_t n) { if (n) count(a, n, 0); }
V void __tsan_write_range(void *a, size_t n) { if (n) count(a, n, 1); }
V void __tsan_vptr_update(void **p, void *v) { (void)v; count(p, 8, 1); }
V void __tsan_vptr_read(void **p) { count(p, 8, 0); }
#define COUNT_ACCESS(a, n, w) count((const void *)(a), n, w)
#include "atomics.h"

/* ---- the program's API (include/weft.h) ---- */
V unsigned long weft_memprof_access_count(const void *p, unsigned long *reads,
                                          unsigned long *writes) {
  uint32_t id = active && shadow ? lookup((uintptr_t)p) : 0;
  uint64_t t[4] = {0, 0, 0, 0};
  if (id) totals(id, t);
  if (reads) *reads = t[0];
  if (writes) *writes = t[1];
  return t[0] + t[1];
}

struct weft_mem_stats {
  unsigned long objects, live_objects, live_bytes, reads, writes;
};
V unsigned long weft_memprof_stat(struct weft_mem_stats *s) {
  if (!active || !s) return 0;
  uint64_t n = __atomic_load_n(&next_id, __ATOMIC_RELAXED);
  if (n > max_objs) n = max_objs;
  s->objects = n - 1;
  s->live_objects = s->live_bytes = s->reads = s->writes = 0;
  for (uint64_t id = 1; id < n; id++) {
    uint64_t t[4];
    totals((uint32_t)id, t);
    s->reads += t[0];
    s->writes += t[1];
    if (!(objs[id].flags & OBJ_FREED)) {
      s->live_objects++;
      s->live_bytes += objs[id].size;
    }
  }
  return s->objects;
}

/* ---- start and end ---- */
static void write_all(int fd, const void *p, size_t n) {
  const char *c = p;
  while (n) {
    ssize_t w = write(fd, c, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return;
    c += w;
    n -= (size_t)w;
  }
}

static const char *out_path;

static __attribute__((destructor(101))) void finish(void) {
  if (!active || getpid() != root_pid) return;
  uint64_t end = now();
  sample_stop();
  active = 0;
  int fd = open(out_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return;
  uint64_t n = __atomic_load_n(&next_id, __ATOMIC_RELAXED);
  if (n > max_objs) n = max_objs;
  uint64_t hdr[14] = {0};
  real_memcpy ? real_memcpy(hdr, MAGIC, 8) : slow_copy(hdr, MAGIC, 8);
  hdr[1] = n - 1;
  hdr[2] = nsites - 1;
  hdr[3] = dropped;
  hdr[4] = (uint64_t)depth;
  hdr[5] = t_start;
  hdr[6] = end;
  hdr[7] = counted ? 0 : 1;
  hdr[8] = sites_dropped;
  hdr[9] = sample_signals;
  hdr[10] = sample_hits;
  hdr[11] = sample_lost;
  hdr[12] = use_backtrace;
  hdr[13] = sample_steps;
  write_all(fd, hdr, sizeof hdr);
  for (uint32_t i = 1; i < MAX_SITES; i++) {
    if (!sites[i].hash) continue;
    sites[i].pad = i; /* the record carries its index: objects name sites by it */
    write_all(fd, &sites[i], sizeof sites[i]);
  }
  for (uint64_t id = 1; id < n; id++) {
    uint64_t t[4];
    totals((uint32_t)id, t); /* sampled mode: the samples */
    objs[id].reads = t[0];
    objs[id].writes = t[1];
    objs[id].rbytes = t[2];
    objs[id].wbytes = t[3];
  }
  write_all(fd, &objs[1], (n - 1) * sizeof(struct obj));
  int m = open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
  if (m >= 0) {
    char buf[4096];
    ssize_t r;
    while ((r = read(m, buf, sizeof buf)) > 0) write_all(fd, buf, (size_t)r);
    close(m);
  }
  close(fd);
}

/* Called from the constructor only: what is allocated before it is not tracked. */
static void init(void) {
  const char *out = getenv("WEFT_MEMPROF_OUT");
  const char *parent = getenv("WEFT_MEMPROF_PARENT");
  if (!out || !parent || getppid() != (pid_t)strtol(parent, 0, 10)) return;
  const char *s;
  if ((s = getenv("WEFT_MEMPROF_DEPTH"))) {
    depth = atoi(s);
    if (depth < 1) depth = 1;
    if (depth > MAX_DEPTH) depth = MAX_DEPTH;
  }
  if ((s = getenv("WEFT_MEMPROF_MAX_OBJECTS"))) max_objs = strtoull(s, 0, 10) + 1;
  use_backtrace = (s = getenv("WEFT_MEMPROF_STACK")) && !strcmp(s, "unwind");
  const char *mode = getenv("WEFT_MEMPROF_MODE");
  int sampled = mode && !strcmp(mode, "sampled");
  objs = map(max_objs * sizeof(struct obj));
  sites = map(MAX_SITES * sizeof(struct site));
  shadow = map(L1_SIZE * sizeof(uint32_t *));
  if (!objs || !sites || !shadow) return;
  out_path = out;
  root_pid = getpid();
  t_start = now();
  /* backtrace's first call loads libgcc_s (which mallocs): do it now, untracked. */
  void *pcs[2];
  in_hook = 1;
  if (use_backtrace) backtrace(pcs, 2);
  stack_bounds();
  in_hook = 0;
  pthread_atfork(0, 0, forget_tid);
  counted = !sampled;
  active = 1;
  if (sampled) sample_start();
}

static __attribute__((constructor(101))) void ctor(void) {
  real_memcpy = dlsym(RTLD_NEXT, "memcpy");
  real_memmove = dlsym(RTLD_NEXT, "memmove");
  real_memset = dlsym(RTLD_NEXT, "memset");
  init();
}
