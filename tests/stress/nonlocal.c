/* Non-local exits through probed frames. usage: nonlocal MODE
 *   longjmp   3 threads: co_depth-style recursion (hot_jmp) longjmps out of its
 *             deepest frame, leaving up to 9 hijacked frames behind each time; plain
 *             probed calls in between must return correctly
 *   coro      one thread runs 4 coroutines (makecontext/swapcontext); each calls a
 *             probed recursive function that yields to the scheduler at the bottom
 *             of its recursion, so hijacked frames of 4 stacks interleave
 *   migrate   as coro, but 2 threads run the coroutines, taking whichever is
 *             ready: a coroutine often resumes on another thread than the one that
 *             suspended it (as M:N schedulers do)
 *   abandon   coroutines are dropped in the middle of a probed call and their
 *             stacks reused by new ones
 * progress = completed operations. Every result is checked: CORRUPT + exit 3. */
#define _GNU_SOURCE
#include <pthread.h>
#include <setjmp.h>
#include <stdatomic.h>
#include <string.h>
#include <ucontext.h>

#include "probed.h"

static atomic_long progress;

static void *reporter(void *arg) {
  (void)arg;
  for (;;) {
    usleep(100000);
    printf("progress %ld\n", atomic_load(&progress));
    fflush(stdout);
  }
  return 0;
}

/* ---- longjmp ---- */

static __thread jmp_buf *jb;

__attribute__((noipa)) long hot_jmp(long k) {
  if (k > 1000) return k;
  if (k == 0) longjmp(*jb, 1);
  long r = hot_jmp(k - 1);
  __asm__ volatile("" : "+r"(r));
  return r + 1;
}

static void *longjmp_worker(void *arg) {
  jmp_buf env;
  jb = &env;
  for (long i = (long)arg;; i++) {
    if (setjmp(env) == 0) {
      hot_jmp(i % 9);
      printf("CORRUPT hot_jmp returned\n");
      fflush(stdout);
      _exit(3);
    }
    round_of_calls(i);
    atomic_fetch_add_explicit(&progress, 1, memory_order_relaxed);
  }
  return 0;
}

/* ---- coroutines ---- */

#define NCO 4
#define STACK (64 * 1024)

struct co {
  ucontext_t ctx;
  ucontext_t *back; /* where yield returns to (the scheduler that resumed it) */
  long id, rounds;
  int done, running;
  char *stack;
};

static __thread struct co *current;

static void yield(void) {
  struct co *c = current;
  swapcontext(&c->ctx, c->back);
}

/* co_rec(d, id) yields at the bottom, then returns id * 1000 + 3 * d. */
__attribute__((noipa)) long co_rec(long d, long id) {
  if (d == 0) {
    yield();
    return id * 1000;
  }
  long r = co_rec(d - 1, id);
  __asm__ volatile("" : "+r"(r));
  return r + 3;
}

static void co_body(int hi, int lo) {
  struct co *c = (struct co *)(((unsigned long)(unsigned)hi << 32) | (unsigned)lo);
  for (;;) {
    long d = c->rounds % 6;
    long r = co_rec(d, c->id);
    if (r != c->id * 1000 + 3 * d) {
      printf("CORRUPT coroutine %ld: co_rec(%ld) = %ld\n", c->id, d, r);
      fflush(stdout);
      _exit(3);
    }
    CHECK(hot_jump(c->rounds), want_jump(c->rounds));
    c->rounds++;
    atomic_fetch_add_explicit(&progress, 1, memory_order_relaxed);
    yield();
  }
}

static void co_init(struct co *c, long id, char *stack) {
  memset(c, 0, sizeof *c);
  c->id = id;
  c->stack = stack;
  getcontext(&c->ctx);
  c->ctx.uc_stack.ss_sp = stack;
  c->ctx.uc_stack.ss_size = STACK;
  c->ctx.uc_link = 0;
  unsigned long p = (unsigned long)c;
  makecontext(&c->ctx, (void (*)(void))co_body, 2, (int)(p >> 32), (int)(p & 0xffffffff));
}

static struct co cos[NCO];
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static long next_co;

/* Take a coroutine no thread is running. */
static struct co *take(void) {
  pthread_mutex_lock(&lock);
  struct co *c = 0;
  for (int k = 0; k < NCO && !c; k++) {
    struct co *cand = &cos[(next_co + k) % NCO];
    if (!cand->running) c = cand;
  }
  if (c) {
    c->running = 1;
    next_co++;
  }
  pthread_mutex_unlock(&lock);
  return c;
}

static void give_back(struct co *c) {
  pthread_mutex_lock(&lock);
  c->running = 0;
  pthread_mutex_unlock(&lock);
}

static void *scheduler(void *arg) {
  (void)arg;
  ucontext_t here;
  for (;;) {
    struct co *c = take();
    if (!c) {
      sched_yield();
      continue;
    }
    c->back = &here;
    current = c;
    swapcontext(&here, &c->ctx);
    current = 0;
    give_back(c);
  }
  return 0;
}

static void start_coroutines(void) {
  for (long i = 0; i < NCO; i++) co_init(&cos[i], i + 1, malloc(STACK));
}

/* abandon: run a coroutine to its yield inside co_rec, then drop it and build a new
 * one on the same stack. */
static void abandon_loop(void) {
  char *stack = malloc(STACK);
  ucontext_t here;
  for (long n = 0;; n++) {
    struct co c;
    co_init(&c, n % 100, stack);
    c.back = &here;
    current = &c;
    swapcontext(&here, &c.ctx); /* runs to the yield at the bottom of co_rec */
    if (n & 1) swapcontext(&here, &c.ctx); /* sometimes one full round first */
    current = 0;
    round_of_calls(n);
    atomic_fetch_add_explicit(&progress, 1, memory_order_relaxed);
  }
}

int main(int argc, char **argv) {
  const char *mode = argc > 1 ? argv[1] : "longjmp";
  pthread_t r;
  pthread_create(&r, 0, reporter, 0);
  printf("ready\n");
  fflush(stdout);
  if (!strcmp(mode, "longjmp")) {
    for (long t = 0; t < 2; t++) {
      pthread_t th;
      pthread_create(&th, 0, longjmp_worker, (void *)(t * 7));
    }
    longjmp_worker(0);
  }
  if (!strcmp(mode, "coro")) {
    start_coroutines();
    scheduler(0);
  }
  if (!strcmp(mode, "migrate")) {
    start_coroutines();
    pthread_t th;
    pthread_create(&th, 0, scheduler, 0);
    scheduler(0);
  }
  if (!strcmp(mode, "abandon")) abandon_loop();
  printf("CORRUPT unknown mode %s\n", mode);
  return 3;
}
