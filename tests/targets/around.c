// Functions for around advice and override: a password check to bypass, a
// computation to time or feed new arguments, stack arguments, a floating-point
// result, a recursion, a function whose only effect is a side effect, and one
// that blocks on stdin. Prints every result, so a test compares them with what
// the advice should make of them.
//
//   around            run the workload once
//   around wait       print "ready", wait for a line on stdin, then block in
//                     wait_line() until another line arrives; print what it
//                     returned and what compute() gives after it
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int side_effects;

__attribute__((noinline)) int check_password(const char *pw) {
    return strcmp(pw, "secret") == 0;
}

__attribute__((noinline)) long compute(long a, long b) { return a * 100 + b; }

__attribute__((noinline)) long many(long a, long b, long c, long d, long e, long f,
                                    long g, long h) {
    return a + 2 * b + 3 * c + 4 * d + 5 * e + 6 * f + 7 * g + 8 * h;
}

__attribute__((noinline)) double scale(double x, double y) { return x * y; }

__attribute__((noinline)) long fact(long n) { return n <= 1 ? 1 : n * fact(n - 1); }

__attribute__((noinline)) void touch(void) { side_effects++; }

__attribute__((noinline)) long wait_line(void) {
    char buf[64];
    ssize_t n = read(0, buf, sizeof buf);
    return n;
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc > 1 && strcmp(argv[1], "wait") == 0) {
        char go[64];
        printf("ready\n");
        if (read(0, go, sizeof go) <= 0)
            return 1;
        long n = wait_line();
        printf("read %ld\n", n);
        printf("compute %ld\n", compute(3, 4));
        return 0;
    }
    const char *pws[] = {"test", "secret", "wrong"};
    for (int i = 0; i < 3; i++)
        printf("check %s %d\n", pws[i], check_password(pws[i]));
    long sum = 0;
    for (long i = 0; i < 10; i++)
        sum += compute(i, 7);
    printf("compute sum %ld\n", sum);
    printf("many %ld\n", many(1, 2, 3, 4, 5, 6, 7, 8));
    printf("scale %g\n", scale(1.5, 4.0));
    printf("fact %ld\n", fact(5));
    for (int i = 0; i < 10; i++)
        touch();
    printf("touched %d\n", side_effects);
    return 0;
}
