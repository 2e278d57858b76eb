/* Weave/unweave storm target: NTHREADS threads call 100 small functions fn_00..fn_99
 * in tight loops and check every result against an independent computation.
 *
 * Function kinds (by index % 5):
 *   0  long fn(long)            plain: jump site
 *   1  long fn(long)            4 bytes of code (mov rax,rdi; ret): padding or int3
 *   2  long fn(long)            a loop branching back into its first bytes: int3 site
 *   3  double fn(double, long)  checks xmm values survive the trampolines
 *   4  long fn(long)            recursion through itself (nested return probes)
 * plus fn_sleepy (sleeps inside, so return addresses are hijacked at unweave time).
 *
 * Prints "ready", then "progress N" every 100 ms (N = loop iterations so far).
 * On any wrong result: prints "CORRUPT ..." and exits 3.
 * usage: storm [NTHREADS]   (default 8) */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#define KIND(n) ((n) % 5)

#define K0(n)                                                                      \
  __attribute__((noipa)) long fn_##n(long x) {                                     \
    __asm__ volatile("");                                                          \
    return x * (1##n + 3) + 1##n;                                                  \
  }                                                                                \
  static long want_##n(long x) { return x * (1##n + 3) + 1##n; }
#define K1(n)                                                                      \
  __attribute__((noipa)) long fn_##n(long x) { return x; }                         \
  static long want_##n(long x) { return x; }
/* loop(x): returns max(x,1) + n; the loop head is the second instruction. */
#define K2(n)                                                                      \
  long fn_##n(long x);                                                             \
  __asm__(".text\n.globl fn_" #n "\n.type fn_" #n ", @function\nfn_" #n ":\n"      \
          "  xor %eax, %eax\n"                                                     \
          "1: inc %rax\n"                                                          \
          "  cmp %rdi, %rax\n"                                                     \
          "  jl 1b\n"                                                              \
          "  add $1" #n ", %rax\n"                                                 \
          "  ret\n.size fn_" #n ", .-fn_" #n "\n");                                \
  static long want_##n(long x) { return (x > 1 ? x : 1) + 1##n; }
#define K3(n)                                                                      \
  __attribute__((noipa)) double fn_##n(double a, long b) {                         \
    __asm__ volatile("");                                                          \
    return a * 1.5 + (double)b + 1##n;                                             \
  }                                                                                \
  static long want_##n(long x) { return x * 3 + x + 1##n; }
#define K4(n)                                                                      \
  __attribute__((noipa)) long fn_##n(long d) {                                     \
    if (d <= 0) return 1##n;                                                       \
    long r = fn_##n(d - 1);                                                        \
    __asm__ volatile("" : "+r"(r));                                                \
    return r + 2;                                                                  \
  }                                                                                \
  static long want_##n(long x) { return 1##n + 2 * (x > 0 ? x : 0); }

#define DEF(n, k) DEF_(n, k)
#define DEF_(n, k) K##k(n)

/* Indices 00..99 with their kind (n % 5), written out so the preprocessor can
 * paste them. */
#define ROW(a)                                                                     \
  DEF(a##0, 0) DEF(a##1, 1) DEF(a##2, 2) DEF(a##3, 3) DEF(a##4, 4) DEF(a##5, 0)   \
  DEF(a##6, 1) DEF(a##7, 2) DEF(a##8, 3) DEF(a##9, 4)
ROW(0) ROW(1) ROW(2) ROW(3) ROW(4) ROW(5) ROW(6) ROW(7) ROW(8) ROW(9)

__attribute__((noipa)) long fn_sleepy(long x) {
  struct timespec ts = {0, 200000};
  nanosleep(&ts, 0);
  __asm__ volatile("");
  return x ^ 0x5a5a;
}

static atomic_long iterations;
static int nthreads = 8;

static void corrupt(int t, const char *fn, long x, long got, long want) {
  printf("CORRUPT thread %d %s(%ld) = %ld, want %ld\n", t, fn, x, got, want);
  fflush(stdout);
  _exit(3);
}

#define CHK0(n, t, x)                                                              \
  {                                                                                \
    long g_ = fn_##n(x), w_ = want_##n(x);                                         \
    if (g_ != w_) corrupt(t, "fn_" #n, x, g_, w_);                                 \
    sum += g_;                                                                     \
  }
#define CHK1(n, t, x) CHK0(n, t, x)
#define CHK2(n, t, x)                                                              \
  {                                                                                \
    long a_ = ((x) & 7) + 1;                                                       \
    long g_ = fn_##n(a_), w_ = want_##n(a_);                                       \
    if (g_ != w_) corrupt(t, "fn_" #n, a_, g_, w_);                                \
    sum += g_;                                                                     \
  }
/* a * 1.5 + b with a = 2x, b = x: 3x + x, exact in double for these sizes. */
#define CHK3(n, t, x)                                                              \
  {                                                                                \
    double d_ = (double)(x) * 2.0;                                                 \
    long g_ = (long)fn_##n(d_, x), w_ = want_##n(x);                               \
    if (g_ != w_ || d_ != (double)(x) * 2.0) corrupt(t, "fn_" #n, x, g_, w_);      \
    sum += g_;                                                                     \
  }
#define CHK4(n, t, x)                                                              \
  {                                                                                \
    long d_ = (x) & 15;                                                            \
    long g_ = fn_##n(d_), w_ = want_##n(d_);                                       \
    if (g_ != w_) corrupt(t, "fn_" #n, d_, g_, w_);                                \
    sum += g_;                                                                     \
  }
#define CHK(n, k, t, x) CHK_(n, k, t, x)
#define CHK_(n, k, t, x) CHK##k(n, t, x)
#define CROW(a, t, x)                                                              \
  CHK(a##0, 0, t, x) CHK(a##1, 1, t, x) CHK(a##2, 2, t, x) CHK(a##3, 3, t, x)     \
  CHK(a##4, 4, t, x) CHK(a##5, 0, t, x) CHK(a##6, 1, t, x) CHK(a##7, 2, t, x)     \
  CHK(a##8, 3, t, x) CHK(a##9, 4, t, x)

static void *worker(void *arg) {
  int t = (int)(long)arg;
  for (long i = 1;; i++) {
    long x = i * 7 + t, sum = 0;
    CROW(0, t, x) CROW(1, t, x) CROW(2, t, x) CROW(3, t, x) CROW(4, t, x)
    CROW(5, t, x) CROW(6, t, x) CROW(7, t, x) CROW(8, t, x) CROW(9, t, x)
    __asm__ volatile("" : : "r"(sum));
    if (t == nthreads - 1 && (i & 63) == 0) {
      long g = fn_sleepy(x);
      if (g != (x ^ 0x5a5a)) corrupt(t, "fn_sleepy", x, g, x ^ 0x5a5a);
    }
    atomic_fetch_add_explicit(&iterations, 1, memory_order_relaxed);
  }
  return 0;
}

int main(int argc, char **argv) {
  if (argc > 1) nthreads = atoi(argv[1]);
  pthread_t th[64];
  for (long t = 0; t < nthreads && t < 64; t++) pthread_create(&th[t], 0, worker, (void *)t);
  printf("ready\n");
  fflush(stdout);
  for (;;) {
    usleep(100000);
    printf("progress %ld\n", atomic_load(&iterations));
    fflush(stdout);
  }
}
