/* malloc with distinctive sizes 7000001..7000000+N (then free). usage: mallocs N */
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
  long n = argc > 1 ? atol(argv[1]) : 10;
  for (long i = 1; i <= n; i++) {
    void *volatile p = malloc(7000000 + i);
    free(p);
  }
  printf("done\n");
  return 0;
}
