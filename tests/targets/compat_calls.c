/* The target of the bpftrace compatibility corpus (crates/cli/tests/compat.rs):
 * deterministic calls with known arguments and return values, on one thread pinned to
 * one CPU (so bpftrace's per-CPU event buffers keep the order), printing nothing.
 * usage: compat_calls [N [linger]]   -- N rounds (default 5), then finish(); with
 * `linger`, stay alive 300 ms after finish() (programs that symbolize addresses end
 * with `uprobe:...:finish { exit(); }` so that bpftrace prints while the process is
 * still there to be symbolized). */
#define _GNU_SOURCE
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* noipa: no clones (`add.constprop.0`), no inlining, real calls with real arguments. */
#define PROBED __attribute__((noipa))

struct point {
  int x;
  int y;
  long z;
};

volatile long sink;

PROBED int add(int a, int b) { return a + b; }
PROBED long mul(long a, long b) { return a * b; }
PROBED int neg(int x) { return -x; }
PROBED unsigned long big(unsigned long x) { return x * 1000000007UL + 0x8000000000000000UL; }
PROBED int greet(const char *name) { return (int)strlen(name); }
static const char *names[] = {"zero", "one", "two", "three", "four"};
static const char *literals[] = {"secret", "public", "/usr/lib"};
PROBED const char *name_of(int i) { return names[i % 5]; }
PROBED int fib(int n) { return n < 2 ? n : fib(n - 1) + fib(n - 2); }
PROBED void noop(void) { sink++; }
PROBED long six(long a, long b, long c, long d, long e, long f) { return a + b + c + d + e + f; }
PROBED int point_sum(const struct point *p) { return p->x + p->y + (int)p->z; }
PROBED int fill(char *buf, int n, char c) {
  for (int i = 0; i < n; i++) buf[i] = c + i;
  buf[n] = 0;
  return n;
}
PROBED int check(const char *key, int len) { return strncmp(key, "secret", len) == 0; }
PROBED signed char small(signed char c) { return (signed char)(c * 3); }
PROBED short half(short s) { return s / 2; }
PROBED long sizes(long n) { return n * n * n * n; }
PROBED void finish(void) { sink++; }
/* Called 1, 2, 3, 4 times for names[0..3] in every 4 rounds: maps keyed by its
 * arguments get distinct counts (bpftrace prints equal values in random order). */
PROBED int tally(const char *word, int index) { return index + (int)strlen(word); }
PROBED int path_len(const char *dir, const char *file) { return (int)(strlen(dir) + strlen(file)); }
/* Network addresses as they sit in memory, for ntop/macaddr/buf. */
struct endpoint {
  unsigned char mac[6];
  unsigned char v4[4];
  unsigned char v6[16];
  unsigned int ip;
};
PROBED int endpoint_id(const struct endpoint *e) { return e->mac[5] + e->v4[3]; }
/* Bytes of every kind for buf() and %r: printable, the edges of the printable range,
 * control bytes, NUL, high bytes. */
static const unsigned char blob_bytes[16] = {'a', ' ', '~', 0x7f, 0x1f, '\\', '"', 0,
                                             '\t', '\n', 0x80, 0xff, 'Z', '%', 0x01, '0'};
PROBED int blob(const unsigned char *data, int n) { return data[0] + n; }
/* Nested and anonymous members, for program-defined structs that mirror them. */
struct shape {
  char tag;
  struct {
    int x;
    short y;
  } pos;
  union {
    long l;
    unsigned char b[12];
  };
  int last;
};
PROBED int shape_tag(const struct shape *sh) { return sh->tag + sh->pos.x + sh->last; }
/* Bit-fields: unsigned and signed, across a unit boundary (f starts a new unit). */
struct flags {
  unsigned int a : 3;
  unsigned int b : 5;
  int c : 4;
  unsigned char d : 1;
  int e;
  long long f : 40;
  long long g : 30;
};
PROBED int flags_sum(const struct flags *f) { return (int)(f->a + f->b + f->c + f->e); }
/* Multi-dimensional arrays. */
struct grid {
  char tag;
  int z[2][3];
  short w[2][2][2];
  long last;
};
PROBED int grid_sum(const struct grid *g) { return g->z[1][2] + g->w[1][1][1]; }

int main(int argc, char **argv) {
  int n = argc > 1 ? atoi(argv[1]) : 5;
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(0, &one);
  sched_setaffinity(0, sizeof one, &one);
  char buf[64];
  long s = 0;
  /* Fault in every string the probes read: bpftrace's str() reads nothing from a page
   * that is not yet mapped in. */
  for (int i = 0; i < 8; i++) {
    const char *volatile str = i < 5 ? names[i] : literals[i - 5];
    for (const volatile char *c = str; *c; c++) s += *c;
  }
  for (int i = 0; i < 16; i++) s += ((const volatile unsigned char *)blob_bytes)[i];
  for (int i = 0; i < n; i++) {
    s += add(i, 2 * i);
    s += mul(i, -3);
    s += neg(i);
    s += (long)big((unsigned long)i);
    s += greet(name_of(i));
    noop();
    s += six(i, i + 1, i + 2, i + 3, i + 4, i + 5);
    struct point p = {i, -i * 2, 100L * i};
    s += point_sum(&p);
    s += fill(buf, i % 8 + 1, 'a' + i);
    s += check(literals[i % 2], 6);
    s += small((signed char)(i * 20 - 50));
    s += half((short)(i * 1000 - 3000));
    s += sizes(1L << (i * 4));
    s += path_len(literals[2], name_of(i + 1));
    for (int j = 0; j <= i % 4; j++) s += tally(names[i % 4], i % 4);
    struct endpoint e = {{0x18, 0xc0, 0x4d, 0x08, 0x2e, (unsigned char)(0xb0 + i)},
                         {192, 168, 1, (unsigned char)(10 + i)},
                         {0xfe, 0x80, [14] = (unsigned char)i, [15] = 1},
                         0x0100007fu + ((unsigned)i << 24)};
    s += endpoint_id(&e);
    s += blob(blob_bytes, i * 4);
    struct shape sh = {(char)('A' + i), {i * 7, (short)-i}, {.l = 0x0102030405060708L * i}, 1000 + i};
    s += shape_tag(&sh);
    struct flags fl = {(unsigned)i, 31u - (unsigned)i, -i, (unsigned char)(i & 1), 100 + i, -(1LL << 38) + i, -3 * i};
    s += flags_sum(&fl);
    struct grid g = {'g', {{i, i + 1, i + 2}, {10 * i, 10 * i + 1, 10 * i + 2}}, {{{1, 2}, {3, 4}}, {{5, 6}, {7, (short)(8 + i)}}}, -i};
    s += grid_sum(&g);
  }
  s += fib(7);
  sink = s;
  finish();
  if (argc > 2) usleep(300000);
  return 0;
}
