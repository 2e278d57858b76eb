// Catching processes as they start, for system-wide sessions (crates/engine/src/watch.rs).
//
// The programs run on kernel uprobes weft sets (see src/watch.rs for where). Catching
// a process stops it (SIGSTOP) and tells weft its pid through the `caught` ring, once
// per program image: the pid goes into `seen`, where weft also puts the processes it
// attached to itself. A probed library's initializer only marks the process; it is
// caught once the loading is over (`__libc_start_main`, or the return of `dlopen`).
// Every process stopped and not yet let go is in `stopped`, which weft's guardian
// holds too: should weft die, the guardian continues each one left there, those
// still in the ring included. An exec or the process's end takes the pid out of
// every map.
//
// Built by crates/engine/build.rs with `clang -target bpf`; no kernel headers needed.

typedef unsigned int __u32;
typedef unsigned long long __u64;

#define SEC(name) __attribute__((section(name), used))
#define __uint(name, val) int (*name)[val]
#define __type(name, val) typeof(val) *name

#define BPF_MAP_TYPE_HASH 1
#define BPF_MAP_TYPE_RINGBUF 27
#define BPF_ANY 0
#define SIGSTOP 19

static void *(*bpf_map_lookup_elem)(void *map, const void *key) = (void *)1;
static long (*bpf_map_update_elem)(void *map, const void *key, const void *value, __u64 flags) = (void *)2;
static long (*bpf_map_delete_elem)(void *map, const void *key) = (void *)3;
static __u64 (*bpf_get_current_pid_tgid)(void) = (void *)14;
static long (*bpf_send_signal)(__u32 sig) = (void *)109;
static long (*bpf_ringbuf_output)(void *ringbuf, void *data, __u64 size, __u64 flags) = (void *)130;

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 256 * 1024);
} caught SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, __u32);
	__type(value, __u32);
} seen SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, __u32);
	__type(value, __u32);
} marked SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, __u32);
	__type(value, __u32);
} stopped SEC(".maps");

/// What weft reads from `caught`.
struct caught_event {
	__u32 pid;
	__u32 tid;
};

static __attribute__((always_inline)) int catch_current(void)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 pid = id >> 32;
	__u32 one = 1;
	struct caught_event e = { .pid = pid, .tid = (__u32)id };

	if (bpf_map_lookup_elem(&seen, &pid))
		return 0;
	if (bpf_map_update_elem(&seen, &pid, &one, BPF_ANY))
		return 0;
	// Known to the guardian before it stops: none stays stopped if weft dies.
	if (bpf_map_update_elem(&stopped, &pid, &one, BPF_ANY))
		return 0;
	// Stop first: the process is stopped (or about to be, on its way back to user
	// space) whenever weft reads the event.
	bpf_send_signal(SIGSTOP);
	bpf_ringbuf_output(&caught, &e, sizeof(e), 0);
	return 0;
}

static __attribute__((always_inline)) int catch_if_marked(void)
{
	__u32 pid = bpf_get_current_pid_tgid() >> 32;

	if (!bpf_map_lookup_elem(&marked, &pid))
		return 0;
	bpf_map_delete_elem(&marked, &pid);
	return catch_current();
}

// A program's entry point, or `__libc_start_main` when the C library is probed.
SEC("uprobe")
int weft_catch(void *ctx)
{
	return catch_current();
}

// A probed library's initializer: the process loads it (at start-up or in
// `dlopen`); it is caught where that ends, below.
SEC("uprobe")
int weft_mark(void *ctx)
{
	__u32 pid = bpf_get_current_pid_tgid() >> 32;
	__u32 one = 1;

	if (!bpf_map_lookup_elem(&seen, &pid))
		bpf_map_update_elem(&marked, &pid, &one, BPF_ANY);
	return 0;
}

// `__libc_start_main` (start-up done: libraries loaded and initialized).
SEC("uprobe")
int weft_catch_marked(void *ctx)
{
	return catch_if_marked();
}

// The return of `dlopen`, in the program that called it.
SEC("uretprobe")
int weft_catch_marked_return(void *ctx)
{
	return catch_if_marked();
}

// A new program image: catch it again.
SEC("tracepoint/sched/sched_process_exec")
int weft_exec(void *ctx)
{
	__u32 pid = bpf_get_current_pid_tgid() >> 32;

	bpf_map_delete_elem(&seen, &pid);
	bpf_map_delete_elem(&marked, &pid);
	bpf_map_delete_elem(&stopped, &pid);
	return 0;
}

// The process's main thread ended: its pid is free for reuse once the others have.
SEC("tracepoint/sched/sched_process_exit")
int weft_exit(void *ctx)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 pid = id >> 32;

	if (pid == (__u32)id) {
		bpf_map_delete_elem(&seen, &pid);
		bpf_map_delete_elem(&marked, &pid);
		bpf_map_delete_elem(&stopped, &pid);
	}
	return 0;
}

char _license[] SEC("license") = "GPL";
