/* Control-flow pointcuts (crates/cli/tests/cflow.rs): calls nested in known
 * ways, which the program counts itself (the depth of each function, who called
 * it) so a test compares weft's counts with the program's.
 *
 *   cflow N [wait]   N rounds, then one line of counts; with `wait`, first reads
 *                    a line from stdin (a test attaching with -p starts it so).
 *
 * One round:
 *   zoo() -> foo(0)                         foo called by zoo
 *         -> bar() -> foo(0)                foo in bar, called by zoo
 *         -> via() -> bar() -> foo(0)       the same, bar called by via
 *         -> foo(2) -> foo(1) -> foo(0)     a direct recursion
 *   foo(1) -> foo(0)                        outside zoo
 *   bar() -> foo(0)                         outside zoo
 *   rec(4) -> rec(3) -> mid(2) -> rec(2) -> rec(1) -> mid(0) -> rec(0)
 *                                           a recursion, direct and through mid
 * and every foo() calls leaf() first.
 *
 * Each call is followed by a compiler barrier, so none becomes a tail call (a jump
 * leaves no frame of its caller).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NOINLINE __attribute__((noinline, noclone))
#define BARRIER() __asm__ volatile("" ::: "memory")

enum { MAIN, ZOO, VIA, BAR, FOO, REC, MID };

static long foo_calls, foo_in_zoo, foo_by_zoo, foo_in_bar_in_zoo, foo_by_bar_by_zoo,
    foo_in_foo, leaf_calls, leaf_in_foo_in_zoo, bar_calls, rec_calls, rec_in_rec, rec_by_rec;
static int zoo_depth, foo_depth, rec_depth;
/* bar frames entered inside zoo; foo frames entered inside zoo. */
static int bar_in_zoo, foo_in_zoo_depth;
/* The innermost bar was called by zoo. */
static int bar_by_zoo;
volatile long sink;

NOINLINE void leaf(void) {
  leaf_calls++;
  if (foo_in_zoo_depth > 0) leaf_in_foo_in_zoo++;
  sink++;
  BARRIER();
}

NOINLINE void foo(int n, int from) {
  int inside = zoo_depth > 0;
  foo_calls++;
  foo_in_zoo += inside;
  foo_by_zoo += from == ZOO;
  foo_in_bar_in_zoo += bar_in_zoo > 0;
  foo_by_bar_by_zoo += from == BAR && bar_by_zoo;
  foo_in_foo += foo_depth > 0;
  foo_depth++;
  foo_in_zoo_depth += inside;
  leaf();
  BARRIER();
  if (n > 0) foo(n - 1, FOO);
  BARRIER();
  foo_in_zoo_depth -= inside;
  foo_depth--;
}

NOINLINE void bar(int from) {
  int inside = zoo_depth > 0, saved = bar_by_zoo;
  bar_calls++;
  bar_in_zoo += inside;
  bar_by_zoo = from == ZOO;
  foo(0, BAR);
  BARRIER();
  bar_by_zoo = saved;
  bar_in_zoo -= inside;
}

NOINLINE void via(void) {
  bar(VIA);
  BARRIER();
}

NOINLINE void zoo(void) {
  zoo_depth++;
  foo(0, ZOO);
  BARRIER();
  bar(ZOO);
  BARRIER();
  via();
  BARRIER();
  foo(2, ZOO);
  BARRIER();
  zoo_depth--;
}

NOINLINE void mid(int n);

NOINLINE void rec(int n, int from) {
  rec_calls++;
  rec_in_rec += rec_depth > 0;
  rec_by_rec += from == REC;
  rec_depth++;
  if (n > 0) {
    if (n % 2 == 0)
      rec(n - 1, REC);
    else
      mid(n - 1);
    BARRIER();
  }
  rec_depth--;
}

NOINLINE void mid(int n) {
  rec(n, MID);
  BARRIER();
}

int main(int argc, char **argv) {
  long n = argc > 1 ? atol(argv[1]) : 1000;
  if (argc > 2 && strcmp(argv[2], "wait") == 0) {
    char line[64];
    if (!fgets(line, sizeof line, stdin)) return 1;
  }
  for (long i = 0; i < n; i++) {
    zoo();
    BARRIER();
    foo(1, MAIN);
    BARRIER();
    bar(MAIN);
    BARRIER();
    rec(4, MAIN);
    BARRIER();
  }
  printf("foo=%ld foo_in_zoo=%ld foo_by_zoo=%ld foo_in_bar_in_zoo=%ld foo_by_bar_by_zoo=%ld "
         "foo_in_foo=%ld leaf=%ld leaf_in_foo_in_zoo=%ld bar=%ld rec=%ld rec_in_rec=%ld "
         "rec_by_rec=%ld\n",
         foo_calls, foo_in_zoo, foo_by_zoo, foo_in_bar_in_zoo, foo_by_bar_by_zoo, foo_in_foo,
         leaf_calls, leaf_in_foo_in_zoo, bar_calls, rec_calls, rec_in_rec, rec_by_rec);
  fflush(stdout);
  return 0;
}
