/* Start-up code of every kind before main, each calling malloc(5555): its own
 * .preinit_array entry (once), a constructor (twice), libctor.so's constructor
 * (five times, built from ctorlib.c), then main (once): 9 in all. */
#include <stdio.h>
#include <stdlib.h>

void lib_touch(void);

static void one(void) {
  void *volatile p = malloc(5555);
  free(p);
}

static void pre(int argc, char **argv, char **envp) {
  (void)argc, (void)argv, (void)envp;
  one();
}
__attribute__((section(".preinit_array"), used)) static void (*pre_p)(int, char **, char **) = pre;

__attribute__((constructor)) static void ctor(void) {
  one();
  one();
}

int main(void) {
  lib_touch();
  one();
  printf("main\n");
  return 0;
}
