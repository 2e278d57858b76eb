/* Where a launched program's probes start (built with ifuncprog.c): seen_in(1) is
 * called by the resolver of the IFUNC `pick`, which the loader runs while it
 * relocates the program when that is linked `-z now` (before any constructor),
 * or at pick's first call when it is linked `-z lazy`; seen_in(2) by this
 * library's constructor; seen_in(3) by lib_call(), from main. Build with
 * -fno-semantic-interposition so that the resolver calls seen_in directly. */
__attribute__((noinline)) void seen_in(int where) {
  __asm__ volatile("" : : "r"(where) : "memory");
}

static int pick_one(void) { return 1; }

static int (*resolve_pick(void))(void) {
  seen_in(1);
  return pick_one;
}

int pick(void) __attribute__((ifunc("resolve_pick")));

__attribute__((constructor)) static void lib_ctor(void) { seen_in(2); }

void lib_call(void) { seen_in(3); }
