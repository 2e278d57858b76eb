/* Sampled mode: filled in below. */
static uint64_t sample_windows, sample_hits, sample_lost;
static void sample_start(void) {}
static void sample_stop(void) {}
