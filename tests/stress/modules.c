/* Two small libraries for the /proc/PID/root test: built with -DINSIDE, the one the
 * target really maps; without, the one it must not be able to make weft read. */
#ifdef INSIDE
int inside_fn(int x) { return x + 1; }
#else
int outside_fn(int x) { return x + 2; }
#endif
