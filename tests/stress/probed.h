/* Functions the stress targets share, with the value each must return.
 *   hot_jump   plain function: a jump site
 *   hot_int3   a loop branching back into its first bytes: always an int3 site
 *   hot_rec    recursion: nested return probes
 *   hot_ret    a leaf called from hot_rec's callers
 * CHECK(expr, want) prints "CORRUPT ..." and exits 3 on a wrong result. */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

__attribute__((noipa)) long hot_jump(long x) {
  __asm__ volatile("");
  return x * 3 + 1;
}
static inline long want_jump(long x) { return x * 3 + 1; }

/* hot_int3(n) = max(n, 1) + 1000. */
long hot_int3(long n);
__asm__(".text\n.globl hot_int3\n.type hot_int3, @function\nhot_int3:\n"
        "  xor %eax, %eax\n"
        "1: inc %rax\n"
        "  cmp %rdi, %rax\n"
        "  jl 1b\n"
        "  add $1000, %rax\n"
        "  ret\n.size hot_int3, .-hot_int3\n");
static inline long want_int3(long n) { return (n > 1 ? n : 1) + 1000; }

__attribute__((noipa)) long hot_rec(long d) {
  if (d <= 0) return 7;
  long r = hot_rec(d - 1);
  __asm__ volatile("" : "+r"(r));
  return r + 2;
}
static inline long want_rec(long d) { return 7 + 2 * (d > 0 ? d : 0); }

static void corrupt_at(const char *what, long got, long want, const char *file, int line) {
  char buf[256];
  int n = snprintf(buf, sizeof buf, "CORRUPT %s = %ld, want %ld (%s:%d, pid %d)\n", what,
                   got, want, file, line, (int)getpid());
  if (write(1, buf, n)) {}
  _exit(3);
}
#define CHECK(expr, want)                                                          \
  do {                                                                             \
    long g_ = (expr), w_ = (want);                                                 \
    if (g_ != w_) corrupt_at(#expr, g_, w_, __FILE__, __LINE__);                   \
  } while (0)

/* One round of calls to every probed function; returns a value to keep. */
static inline long round_of_calls(long i) {
  CHECK(hot_jump(i), want_jump(i));
  CHECK(hot_int3((i & 7) + 1), want_int3((i & 7) + 1));
  CHECK(hot_rec(i & 7), want_rec(i & 7));
  return i;
}
