/* For the export tests (crates/cli/tests/export.rs): prints "ready", waits for a
 * line on stdin, calls handle(i) for i in 1..=10 and tag() with known strings,
 * prints "called", waits for another line, and exits. */
#include <stdio.h>

__attribute__((noinline)) long handle(long x) {
  __asm__ volatile("");
  return x;
}

__attribute__((noinline)) int tag(const char *s) {
  __asm__ volatile("");
  return s[0];
}

int main(void) {
  char line[64];
  printf("ready\n");
  fflush(stdout);
  if (!fgets(line, sizeof line, stdin))
    return 1;
  for (long i = 1; i <= 10; i++)
    handle(i);
  tag("plain");
  tag("plain");
  tag("q\"uote\\");
  printf("called\n");
  fflush(stdout);
  if (!fgets(line, sizeof line, stdin))
    return 1;
  return 0;
}
