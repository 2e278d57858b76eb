//! Messages for bpftrace features weft does not have. Each names the feature and,
//! where there is one, what to use instead; they replace what would otherwise be a
//! generic "unknown" error.

use crate::KernelOffers;

/// Probe providers: `None` when weft supports the provider. `kernel`, when known,
/// is what the running kernel offers, so the message can say why a kernel probe is
/// not there.
pub fn provider(name: &str, kernel: Option<&KernelOffers>) -> Option<String> {
    const USE_INSTEAD: &str = "use tracepoint:CATEGORY:NAME (weft -l 'tracepoint:*' lists them), \
                               or uprobe/uretprobe on the user-space side of the call";
    let msg = match name {
        "kprobe" | "kretprobe" => match kernel {
            Some(k) if !k.kprobes => {
                let place = match &k.tracefs {
                    Ok(root) => format!("no kprobe_events in {root}"),
                    Err(_) => "no kprobe event source, and no tracefs".to_string(),
                };
                format!(
                    "{name}: this kernel has no kprobes ({place}: CONFIG_KPROBE_EVENTS is off); \
                     {USE_INSTEAD}"
                )
            }
            Some(_) => format!(
                "{name}: kernel function probes are not supported by weft yet (this kernel has \
                 kprobes); {USE_INSTEAD}"
            ),
            None => {
                format!("{name}: kernel function probes are not supported by weft; {USE_INSTEAD}")
            }
        },
        "kfunc" | "kretfunc" | "fentry" | "fexit" => {
            let btf = match kernel {
                Some(k) if k.btf => " (this kernel has BTF)",
                Some(_) => " (and this kernel has no BTF: no /sys/kernel/btf/vmlinux)",
                None => "",
            };
            format!(
                "{name}: kernel function (BTF) probes are not supported by weft{btf}; {USE_INSTEAD}"
            )
        }
        "rawtracepoint" => format!(
            "{name}: raw tracepoints are not supported by weft; use tracepoint:CATEGORY:NAME, \
             whose args are the event's fields"
        ),
        "software" | "hardware" => {
            format!("{name}: perf {name} events are not available in weft; use profile: to sample threads")
        }
        "iter" => "iter: BPF iterators over kernel objects are not available in weft".to_string(),
        "self" => "self: bpftrace runtime signal probes are not supported by weft".to_string(),
        "bench" | "test" => {
            format!("{name}: probes for `bpftrace --{name}` are not supported by weft")
        }
        _ => return None,
    };
    Some(msg)
}

/// Builtin variables.
pub fn builtin(name: &str) -> Option<String> {
    let msg = match name {
        "kstack" => "kstack: kernel stacks are not available in weft (user-space only); use ustack",
        "curtask" => "curtask: the kernel task_struct is not available in weft",
        "cgroup" => "cgroup: cgroup ids are not available in weft",
        "username" => "username is not supported yet; use uid",
        "jiffies" => "jiffies: the kernel tick counter is not available in weft; use nsecs",
        "ctx" => "ctx: the raw BPF context is not available in weft; use argN or args",
        "sarg0" | "sarg1" | "sarg2" | "sarg3" | "sarg4" | "sarg5" => {
            "sargN is not supported; use argN (stack arguments are argN with N >= 6 in weft)"
        }
        _ => return None,
    };
    Some(msg.to_string())
}

/// Builtin functions.
pub fn function(name: &str) -> Option<String> {
    let msg = match name {
        "kstack" => {
            "kstack: kernel stacks are not available in weft (user-space only); use ustack()"
        }
        "ksym" => "ksym: kernel symbols are not available in weft; use usym",
        "kaddr" => "kaddr: kernel symbol addresses are not available in weft; use uaddr",
        "kptr" | "uptr" => {
            "kptr/uptr: address-space annotations are not needed in weft (all reads are user-space)"
        }
        "cgroupid" => "cgroupid: cgroup ids are not available in weft",
        "path" => "path: kernel path resolution is not available in weft",
        "skboutput" => "skboutput: packet capture is not available in weft",
        "socket_cookie" => "socket_cookie is not available in weft",
        "percpu_kaddr" => "percpu_kaddr is not available in weft",
        "kfunc_arg" | "fentry_arg" => "kernel function arguments are not available in weft",
        "nsecs" => "nsecs(CLOCK): weft reads one clock, CLOCK_MONOTONIC (`nsecs`, `nsecs(monotonic)`); the boot, tai and sw_tai clocks are not available",
        "unwatch" => "unwatch: watchpoints are not available in weft",
        "debugf" => "debugf: the kernel trace pipe is not available in weft; use printf",
        "errorf" | "warnf" => "errorf/warnf are not supported yet; use printf",
        _ => return None,
    };
    Some(msg.to_string())
}
