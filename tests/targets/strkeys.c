/* String keys on the hot path (crates/cli/tests/hotpath.rs).
 *
 *   strkeys N   waits for a line on stdin, then 4 threads each call named(i, s) for
 *               i in 0..N, s cycling through five strings: four names (one of 63
 *               bytes, one of 64: longer than str()'s 63 characters) and a bad
 *               pointer, whose read faults.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

static volatile long sink;
static long n;
static const char *names[5] = {
    "get",
    "a-name-of-sixty-three-characters-xxxxxxxxxxxxxxxxxxxxxxxxxxxxxx",
    "a-name-of-sixty-four-characters-xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx",
    "put",
    (const char *)8,
};

__attribute__((noinline)) void named(long i, const char *s) { sink = i + (long)s; }

static void *worker(void *arg) {
    (void)arg;
    for (long i = 0; i < n; i++)
        named(i, names[i % 5]);
    return NULL;
}

int main(int argc, char **argv) {
    n = argc > 1 ? atol(argv[1]) : 1000;
    char line[16];
    if (!fgets(line, sizeof line, stdin))
        return 1;
    pthread_t th[4];
    for (int i = 0; i < 4; i++)
        pthread_create(&th[i], NULL, worker, NULL);
    for (int i = 0; i < 4; i++)
        pthread_join(th[i], NULL);
    puts("done");
    return 0;
}
