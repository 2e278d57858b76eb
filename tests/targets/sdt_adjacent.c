/* USDT probes one NOP apart (no arguments, or arguments already in registers):
 * a 5-byte jump at one would cover the next ones. Each fires ROUNDS times (3 by
 * default); prints "done". */
#include <stdio.h>
#include <stdlib.h>
#include <sys/sdt.h>

int main(int argc, char **argv) {
  long rounds = argc > 1 ? atol(argv[1]) : 3;
  long a = argc, b = 2, c = 3, d = 4, e = 5, f = 6, g = 7, h = 8, i = 9, j = 10;
  for (long k = 0; k < rounds; k++) {
    DTRACE_PROBE(app, p0);
    DTRACE_PROBE(app, p1);
    DTRACE_PROBE10(app, p2, a, b, c, d, e, f, g, h, i, j);
    DTRACE_PROBE10(app, p3, a, b, c, d, e, f, g, h, i, j);
    DTRACE_PROBE1(app, p4, a);
    DTRACE_PROBE1(app, p5, b);
  }
  printf("done\n");
  return 0;
}
