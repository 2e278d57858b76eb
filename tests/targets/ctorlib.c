/* A library whose constructor calls malloc(5555) five times (what libselinux's
 * start-up does to `ls`): weft must see those calls from a launched program. */
#include <stdlib.h>

__attribute__((constructor)) static void lib_ctor(void) {
  for (int i = 0; i < 5; i++) {
    void *volatile p = malloc(5555);
    free(p);
  }
}

void lib_touch(void) {}
