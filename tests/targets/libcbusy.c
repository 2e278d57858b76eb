/* Spends nearly all its time inside the C library's allocator and atexit
 * bookkeeping, the state a borrowed thread must never be nested in: a remote
 * dlopen run in the middle of malloc corrupts the heap (a single-threaded malloc
 * takes no lock), one run while __exit_funcs_lock is held deadlocks.
 * usage: libcbusy ROUNDS [THREADS [grow|fill|idle]]  -- prints "sum S" where S depends
 * only on the arguments, then exits 0. ROUNDS 0: each thread runs until the process
 * gets SIGUSR1 (so a test never races weft against the target's run time), then it
 * prints "rounds R0 R1 ..." (each thread's rounds, in thread order) before the sum,
 * which is the same function of each thread's rounds. With "grow", each round callocs 16384 blocks
 * of 1 KiB and frees them all, so the heap grows and is trimmed all the time (the
 * allocator's most fragile path: before weft waited for a safe point, an attach
 * to this killed it every time). With "fill", each round is one memset of 64 MiB,
 * a single `rep stos` that no single-stepping gets out of in time. With "idle", each
 * round sleeps a millisecond (the threads are blocked nearly all the time). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <signal.h>

static long rounds;
static int grow, fill, idle;
static volatile sig_atomic_t stop;
static long done[64]; /* rounds each thread ran */

static void on_usr1(int sig) {
  (void)sig;
  stop = 1;
}

/* Another round? ROUNDS of them, or (ROUNDS 0) until SIGUSR1. */
static int more(long r) { return rounds ? r < rounds : !stop; }

static void nothing(void) {}

__attribute__((noinline)) long tick(long x) {
  __asm__ volatile("");
  return x + 1;
}

static void *grow_and_trim(void *arg) {
  long seed = (long)arg, sum = 0;
  enum { N = 16384 };
  void **blocks = malloc(N * sizeof *blocks);
  long r;
  for (r = 0; more(r); r++) {
    for (int k = 0; k < N; k++) {
      blocks[k] = calloc(1, 1040);
      sum += ((unsigned char *)blocks[k])[k % 1040] + seed;
    }
    for (int k = N - 1; k >= 0; k--)
      free(blocks[k]);
    sum = tick(sum);
  }
  done[seed] = r;
  free(blocks);
  return (void *)sum;
}

static void *fill_big(void *arg) {
  long seed = (long)arg, sum = 0;
  size_t n = 64 << 20;
  unsigned char *buf = malloc(n);
  long r;
  for (r = 0; more(r); r++) {
    memset(buf, (int)(r + seed), n);
    sum = tick(sum + buf[(size_t)r * 4099 % n]);
  }
  done[seed] = r;
  free(buf);
  return (void *)sum;
}

static void *sleepy(void *arg) {
  long seed = (long)arg, sum = 0, r;
  struct timespec ms = {0, 1000000};
  for (r = 0; more(r); r++) {
    nanosleep(&ms, NULL);
    sum = tick(sum + seed);
  }
  done[seed] = r;
  return (void *)sum;
}

static void *churn(void *arg) {
  if (idle)
    return sleepy(arg);
  if (grow)
    return grow_and_trim(arg);
  if (fill)
    return fill_big(arg);
  long seed = (long)arg, sum = 0;
  void *keep[64] = {0};
  long i;
  for (i = 0; more(i); i++) {
    size_t size = 16 + (size_t)((i * 7919 + seed) % 4000);
    unsigned char *p = malloc(size);
    memset(p, (int)(i & 0xff), size);
    sum += p[size - 1] + (long)size;
    long k = i % 64;
    free(keep[k]);
    keep[k] = p;
    if (seed == 0 && i % 64 == 0)
      atexit(nothing); /* __exit_funcs_lock, and a calloc under it */
    sum = tick(sum);
  }
  done[seed] = i;
  for (int k = 0; k < 64; k++)
    free(keep[k]);
  return (void *)sum;
}

int main(int argc, char **argv) {
  rounds = argc > 1 ? atol(argv[1]) : 1000;
  int threads = argc > 2 ? atoi(argv[2]) : 1;
  grow = argc > 3 && strcmp(argv[3], "grow") == 0;
  fill = argc > 3 && strcmp(argv[3], "fill") == 0;
  idle = argc > 3 && strcmp(argv[3], "idle") == 0;
  signal(SIGUSR1, on_usr1);
  pthread_t t[64];
  long total = 0;
  for (int i = 1; i < threads && i < 64; i++)
    pthread_create(&t[i], NULL, churn, (void *)(long)i);
  total += (long)churn(0);
  for (int i = 1; i < threads && i < 64; i++) {
    void *r;
    pthread_join(t[i], &r);
    total += (long)r;
  }
  if (rounds == 0) {
    printf("rounds");
    for (int i = 0; i < threads && i < 64; i++)
      printf(" %ld", done[i]);
    printf("\n");
  }
  printf("sum %ld\n", total);
  return 0;
}
