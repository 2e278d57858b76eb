/* Struct arguments for `args` (DWARF): dist(p, scale) reads p->x and p->y. */
#include <stdio.h>
#include <stdlib.h>
struct point { int x; int y; const char *name; };
__attribute__((noinline)) long dist(struct point *p, long scale) { __asm__ volatile(""); return (p->x + p->y) * scale; }
int main(int argc, char **argv) {
  static struct point pts[3] = {{1, 2, "one"}, {3, 4, "two"}, {5, 6, "three"}};
  long s = 0;
  for (int i = 0; i < 3; i++) s += dist(&pts[i], i + 1);
  printf("s=%ld\n", s);
  return 0;
}
