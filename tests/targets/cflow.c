/* Control-flow pointcuts (crates/cli/tests/cflow.rs): calls nested in known
 * ways, which the program counts itself (the depth of each function, who called
 * it) so a test compares weft's counts with the program's.
 *
 *   cflow N [wait]   N rounds, then one line of counts; with `wait`, first reads
 *                    a line from stdin (a test attaching with -p starts it so).
 *   cflow N threads  the same in 4 threads at once (the counts of all four): each
 *                    thread's nesting is its own.
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
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NOINLINE __attribute__((noinline, noclone))
#define BARRIER() __asm__ volatile("" ::: "memory")

enum { MAIN, ZOO, VIA, BAR, FOO, REC, MID };

/* Each thread's counts and nesting. */
static __thread long foo_calls, foo_in_zoo, foo_by_zoo, foo_in_bar_in_zoo, foo_by_bar_by_zoo,
    foo_in_foo, leaf_calls, leaf_in_foo_in_zoo, bar_calls, rec_calls, rec_in_rec, rec_by_rec;
static __thread int zoo_depth, foo_depth, rec_depth;
/* bar frames entered inside zoo; foo frames entered inside zoo. */
static __thread int bar_in_zoo, foo_in_zoo_depth;
/* The innermost bar was called by zoo. */
static __thread int bar_by_zoo;
volatile long sink;

/* Every thread's counts, added up as each finishes. */
static long total[12];
static pthread_mutex_t total_lock = PTHREAD_MUTEX_INITIALIZER;

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

static long rounds;

static void *run(void *arg) {
  (void)arg;
  for (long i = 0; i < rounds; i++) {
    zoo();
    BARRIER();
    foo(1, MAIN);
    BARRIER();
    bar(MAIN);
    BARRIER();
    rec(4, MAIN);
    BARRIER();
  }
  long mine[12] = {foo_calls,  foo_in_zoo,         foo_by_zoo, foo_in_bar_in_zoo,
                   foo_by_bar_by_zoo, foo_in_foo, leaf_calls, leaf_in_foo_in_zoo,
                   bar_calls,  rec_calls,          rec_in_rec, rec_by_rec};
  pthread_mutex_lock(&total_lock);
  for (int k = 0; k < 12; k++) total[k] += mine[k];
  pthread_mutex_unlock(&total_lock);
  return NULL;
}

int main(int argc, char **argv) {
  rounds = argc > 1 ? atol(argv[1]) : 1000;
  if (argc > 2 && strcmp(argv[2], "wait") == 0) {
    char line[64];
    if (!fgets(line, sizeof line, stdin)) return 1;
  }
  if (argc > 2 && strcmp(argv[2], "threads") == 0) {
    pthread_t t[4];
    for (int k = 0; k < 4; k++)
      if (pthread_create(&t[k], NULL, run, NULL) != 0) return 1;
    for (int k = 0; k < 4; k++) pthread_join(t[k], NULL);
  } else {
    run(NULL);
  }
  printf("foo=%ld foo_in_zoo=%ld foo_by_zoo=%ld foo_in_bar_in_zoo=%ld foo_by_bar_by_zoo=%ld "
         "foo_in_foo=%ld leaf=%ld leaf_in_foo_in_zoo=%ld bar=%ld rec=%ld rec_in_rec=%ld "
         "rec_by_rec=%ld\n",
         total[0], total[1], total[2], total[3], total[4], total[5], total[6], total[7],
         total[8], total[9], total[10], total[11]);
  fflush(stdout);
  return 0;
}
