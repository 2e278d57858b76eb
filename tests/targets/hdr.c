/* Structs from hdr.h passed to rec_show(), which scripts read through the header
 * (`(struct rec *)arg0`), not through DWARF. */
#include <stdio.h>
#include "hdr.h"

int rec_show(struct rec *r) {
  __asm__ volatile("");
  return (int)r->id;
}

int main(void) {
  static struct rec b = {7, {-3, 4}, "second", REC_HUGE, 9, {100, -200}, 0};
  static struct rec a = {42, {1, 2}, "first", REC_BIG, 3, {10, 20}, &b};
  long s = rec_show(&a) + rec_show(&b) + rec_sum(&a);
  printf("s=%ld\n", s);
  return 0;
}
