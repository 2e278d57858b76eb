/* Functions with the prologue shapes weft meets in the wild; compiled by tests/gcc.rs
 * across a flag matrix, then every function is planned and relocated. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NOINLINE __attribute__((noinline))

int counter;
static long table[16];
__thread int per_thread;
int (*callback)(int);

NOINLINE int zero(void) { return 0; }

NOINLINE int square(int x) { return x * x; }

NOINLINE int bump(void) { return ++counter; }

NOINLINE long lookup(int i) { return table[i & 15]; }

NOINLINE int tls_bump(void) { return ++per_thread; }

NOINLINE int gcd(int a, int b) { return b == 0 ? a : gcd(b, a % b); }

NOINLINE long sum_to(long n) {
    long s = 0;
    for (long i = 0; i < n; i++)
        s += i * counter;
    return s;
}

NOINLINE int classify(int c) {
    switch (c) {
    case 0: return 10;
    case 1: return counter + 3;
    case 2: return counter * 7;
    case 3: return square(c);
    case 4: return bump();
    case 5: return 99;
    case 6: return -counter;
    default: return -1;
    }
}

NOINLINE int sum_ints(int n, ...) {
    va_list ap;
    int s = 0;
    va_start(ap, n);
    for (int i = 0; i < n; i++)
        s += va_arg(ap, int);
    va_end(ap);
    return s;
}

NOINLINE int checksum(const char *s) {
    char buf[200];
    strncpy(buf, s, sizeof buf - 1);
    buf[sizeof buf - 1] = 0;
    int h = 0;
    for (char *p = buf; *p; p++)
        h = h * 31 + *p;
    return h;
}

NOINLINE int call_through(int x) { return callback ? callback(x) + 1 : 0; }

NOINLINE void say(const char *who) { printf("hello, %s\n", who); }

NOINLINE void fail(const char *why) {
    fprintf(stderr, "%s\n", why);
    abort();
}

NOINLINE int fib(int n) { return n < 2 ? n : fib(n - 1) + fib(n - 2); }

int main(int argc, char **argv) {
    callback = square;
    table[3] = argc;
    if (argc > 5)
        fail("too many");
    say(argv[0]);
    return zero() + square(argc) + bump() + (int)lookup(argc) + tls_bump() + gcd(argc, 6) +
           (int)sum_to(argc) + classify(argc) + sum_ints(3, 1, 2, argc) + checksum(argv[0]) +
           call_through(argc) + fib(argc);
}
