/* A CPU-bound workload for "what do placeholders cost when nothing is woven".
 *
 *   workload [ROUNDS]   runs ROUNDS rounds (default 20) of four kernels and prints
 *                       "rounds=R ns=T checksum=C" (T timed inside the process).
 *
 * The kernels are ordinary C with the call density of real programs (many small,
 * separately compiled-looking functions, some inlined by GCC at -O2): a merge sort
 * through a comparison function, an open-addressing hash table, a recursive-descent
 * expression evaluator over generated text, and a binary-tree build and walk in an
 * arena. The checksum is printed so no build can skip work, and must be identical
 * across builds (the benchmark checks it).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static uint64_t rng_state = 88172645463325252ull;

static uint64_t next_random(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

/* ---- merge sort through a comparator ------------------------------------------ */

typedef int (*cmp_fn)(const void *, const void *);

static int cmp_u32(const void *a, const void *b) {
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return (x > y) - (x < y);
}

static void merge(uint32_t *a, uint32_t *tmp, size_t lo, size_t mid, size_t hi, cmp_fn cmp) {
    size_t i = lo, j = mid, k = lo;
    while (i < mid && j < hi)
        tmp[k++] = cmp(&a[i], &a[j]) <= 0 ? a[i++] : a[j++];
    while (i < mid)
        tmp[k++] = a[i++];
    while (j < hi)
        tmp[k++] = a[j++];
    memcpy(a + lo, tmp + lo, (hi - lo) * sizeof *a);
}

static void merge_sort(uint32_t *a, uint32_t *tmp, size_t lo, size_t hi, cmp_fn cmp) {
    if (hi - lo < 2)
        return;
    size_t mid = lo + (hi - lo) / 2;
    merge_sort(a, tmp, lo, mid, cmp);
    merge_sort(a, tmp, mid, hi, cmp);
    merge(a, tmp, lo, mid, hi, cmp);
}

static uint64_t kernel_sort(void) {
    enum { N = 200000 };
    static uint32_t a[N], tmp[N];
    for (size_t i = 0; i < N; i++)
        a[i] = (uint32_t)next_random();
    merge_sort(a, tmp, 0, N, cmp_u32);
    uint64_t s = 0;
    for (size_t i = 0; i < N; i += 97)
        s = s * 31 + a[i];
    return s;
}

/* ---- open-addressing hash table ------------------------------------------------ */

#define TABLE_BITS 18
#define TABLE_SIZE (1u << TABLE_BITS)

struct slot {
    uint64_t key;
    uint64_t value;
};

static struct slot table[TABLE_SIZE];

static uint32_t hash_key(uint64_t key) {
    key ^= key >> 33;
    key *= 0xff51afd7ed558ccdull;
    key ^= key >> 33;
    return (uint32_t)(key >> (64 - TABLE_BITS));
}

static struct slot *find_slot(uint64_t key) {
    uint32_t i = hash_key(key);
    while (table[i].key != 0 && table[i].key != key)
        i = (i + 1) & (TABLE_SIZE - 1);
    return &table[i];
}

static void table_add(uint64_t key, uint64_t value) {
    struct slot *s = find_slot(key);
    s->key = key;
    s->value += value;
}

static uint64_t table_get(uint64_t key) {
    return find_slot(key)->value;
}

static uint64_t kernel_hash(void) {
    memset(table, 0, sizeof table);
    for (uint64_t i = 1; i <= 150000; i++)
        table_add((next_random() % 100000) + 1, i);
    uint64_t s = 0;
    for (uint64_t k = 1; k <= 100000; k++)
        s += table_get(k) * k;
    return s;
}

/* ---- recursive-descent expression evaluator ------------------------------------ */

struct parser {
    const char *p;
};

static long parse_expr(struct parser *ps);

static void skip_spaces(struct parser *ps) {
    while (*ps->p == ' ')
        ps->p++;
}

static long parse_number(struct parser *ps) {
    long v = 0;
    while (*ps->p >= '0' && *ps->p <= '9')
        v = v * 10 + (*ps->p++ - '0');
    return v;
}

static long parse_atom(struct parser *ps) {
    skip_spaces(ps);
    if (*ps->p == '(') {
        ps->p++;
        long v = parse_expr(ps);
        skip_spaces(ps);
        ps->p++; /* ')' */
        return v;
    }
    return parse_number(ps);
}

static long parse_term(struct parser *ps) {
    long v = parse_atom(ps);
    for (;;) {
        skip_spaces(ps);
        if (*ps->p == '*') {
            ps->p++;
            v = (v * parse_atom(ps)) % 1000003;
        } else {
            return v;
        }
    }
}

static long parse_expr(struct parser *ps) {
    long v = parse_term(ps);
    for (;;) {
        skip_spaces(ps);
        if (*ps->p == '+') {
            ps->p++;
            v += parse_term(ps);
        } else if (*ps->p == '-') {
            ps->p++;
            v -= parse_term(ps);
        } else {
            return v;
        }
    }
}

static size_t gen_expr(char *out, size_t cap, int depth) {
    size_t n = 0;
    int terms = 2 + (int)(next_random() % 3);
    for (int t = 0; t < terms && n + 64 < cap; t++) {
        if (t)
            out[n++] = "+-*"[next_random() % 3], out[n++] = ' ';
        if (depth > 0 && next_random() % 3 == 0) {
            out[n++] = '(';
            n += gen_expr(out + n, cap - n, depth - 1);
            out[n++] = ')';
        } else {
            n += (size_t)snprintf(out + n, cap - n, "%u", (unsigned)(next_random() % 1000));
        }
        out[n++] = ' ';
    }
    out[n] = 0;
    return n;
}

static uint64_t kernel_parse(void) {
    static char text[1 << 16];
    uint64_t s = 0;
    for (int i = 0; i < 400; i++) {
        gen_expr(text, sizeof text, 6);
        for (int k = 0; k < 8; k++) {
            struct parser ps = {text};
            s = s * 7 + (uint64_t)parse_expr(&ps);
        }
    }
    return s;
}

/* ---- binary tree in an arena ---------------------------------------------------- */

struct node {
    struct node *left, *right;
    long value;
};

static struct node arena[1 << 17];
static size_t arena_used;

static struct node *new_node(long value) {
    struct node *n = &arena[arena_used++];
    n->left = n->right = NULL;
    n->value = value;
    return n;
}

static struct node *build_tree(int depth, long value) {
    struct node *n = new_node(value);
    if (depth > 0) {
        n->left = build_tree(depth - 1, 2 * value);
        n->right = build_tree(depth - 1, 2 * value + 1);
    }
    return n;
}

static long tree_sum(const struct node *n) {
    return n ? n->value + tree_sum(n->left) + tree_sum(n->right) : 0;
}

static long tree_height(const struct node *n) {
    if (!n)
        return 0;
    long l = tree_height(n->left), r = tree_height(n->right);
    return 1 + (l > r ? l : r);
}

static uint64_t kernel_tree(void) {
    uint64_t s = 0;
    for (int i = 0; i < 12; i++) {
        arena_used = 0;
        struct node *root = build_tree(16, i);
        s += (uint64_t)tree_sum(root) + (uint64_t)tree_height(root);
    }
    return s;
}

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

int main(int argc, char **argv) {
    int rounds = argc > 1 ? atoi(argv[1]) : 20;
    uint64_t checksum = 0;
    uint64_t t0 = now_ns();
    for (int r = 0; r < rounds; r++) {
        checksum = checksum * 1000003 + kernel_sort();
        checksum = checksum * 1000003 + kernel_hash();
        checksum = checksum * 1000003 + kernel_parse();
        checksum = checksum * 1000003 + kernel_tree();
    }
    uint64_t t1 = now_ns();
    printf("rounds=%d ns=%llu checksum=%llu\n", rounds, (unsigned long long)(t1 - t0),
           (unsigned long long)checksum);
    return 0;
}
