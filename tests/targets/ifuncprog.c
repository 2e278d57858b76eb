/* Calls libifunc.so's IFUNC `pick` and lib_call() (see ifunclib.c). */
#include <stdio.h>

int pick(void);
void lib_call(void);

int main(void) {
  printf("pick %d\n", pick());
  lib_call();
  return 0;
}
