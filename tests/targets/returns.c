/* Return-probe shapes for the return-site tests (crates/cli/tests/returns.rs).
 *
 *   returns N   waits for a line on stdin (weft is in), then runs every shape N
 *               times in 4 threads and prints the totals it computed itself.
 *
 * Shapes: `tiny` (its ret lies in the entry's 5 bytes), `epilogue` (a ret after
 * pops), `two_exits` (an early return and a loop), `fib` (recursion), `tail`
 * (a tail call: keeps the return-address hijack), `table` (a switch, possibly a jump
 * table), `jumps_out` (left by longjmp: no return).
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>

#define NOINLINE __attribute__((noinline))

static volatile long sink;

NOINLINE long tiny(long x) { return x + 1; }

NOINLINE long epilogue(long a, long b) {
    long s = 0;
    for (long i = 0; i < a; i++) {
        sink = i;
        s += i * b;
    }
    return s;
}

NOINLINE long two_exits(long x) {
    if (x & 1)
        return -x;
    long s = 0;
    for (long i = 0; i < x; i++)
        s += i;
    sink = s;
    return s;
}

NOINLINE long fib(long n) { return n < 2 ? n : fib(n - 1) + fib(n - 2); }

NOINLINE long callee(long x) {
    sink = x;
    return x * 3;
}

NOINLINE long tail(long x) { return callee(x + 1); }

NOINLINE long table(long x) {
    switch (x % 7) {
    case 0: return 11;
    case 1: return sink + 22;
    case 2: return 33;
    case 3: return sink * 44;
    case 4: return 55;
    case 5: return sink - 66;
    default: return 77;
    }
}

static __thread jmp_buf *escape;

NOINLINE long jumps_out(long x) {
    sink = x;
    if (x % 3 == 0)
        longjmp(*escape, 1);
    return x;
}

struct totals {
    long tiny, epilogue, two_exits, fib, tail, table, jumps_out, jumped;
};

static long n_iter;

static void *worker(void *arg) {
    struct totals *t = arg;
    jmp_buf jb;
    escape = &jb;
    for (long i = 0; i < n_iter; i++) {
        t->tiny += tiny(i);
        t->epilogue += epilogue(i % 5, i);
        t->two_exits += two_exits(i % 9);
        t->tail += tail(i);
        sink = 0;
        t->table += table(i);
        if (setjmp(jb) == 0)
            t->jumps_out += jumps_out(i);
        else
            t->jumped++;
    }
    t->fib = fib(12);
    return NULL;
}

int main(int argc, char **argv) {
    n_iter = argc > 1 ? atol(argv[1]) : 1000;
    char line[16];
    if (!fgets(line, sizeof line, stdin))
        return 1;
    pthread_t th[4];
    struct totals t[4] = {0};
    for (int i = 0; i < 4; i++)
        pthread_create(&th[i], NULL, worker, &t[i]);
    struct totals sum = {0};
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        sum.tiny += t[i].tiny;
        sum.epilogue += t[i].epilogue;
        sum.two_exits += t[i].two_exits;
        sum.fib += t[i].fib;
        sum.tail += t[i].tail;
        sum.table += t[i].table;
        sum.jumps_out += t[i].jumps_out;
        sum.jumped += t[i].jumped;
    }
    printf("tiny=%ld epilogue=%ld two_exits=%ld fib=%ld tail=%ld table=%ld jumps_out=%ld jumped=%ld\n",
           sum.tiny, sum.epilogue, sum.two_exits, sum.fib, sum.tail, sum.table, sum.jumps_out,
           sum.jumped);
    return 0;
}
