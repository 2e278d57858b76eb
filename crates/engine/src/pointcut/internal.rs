//! The agent's own sites in every woven process: the unwinder hooks and the
//! `sigaction` redirect. Not pointcuts of the program; the session adds them.

use weft_symbols::ProcMaps;

use crate::weave::{Call, SiteSpec, INTERNAL};

/// Internal sites that give hijacked frames their return addresses back before a C++
/// exception (or thread cancellation) unwinds the stack.
pub fn unwind_hooks(maps: &ProcMaps, on_raise: u64) -> Vec<SiteSpec> {
    let mut out = Vec::new();
    for m in maps.modules() {
        if !m.file_name().starts_with("libgcc_s") {
            continue;
        }
        for name in [
            "_Unwind_RaiseException",
            "_Unwind_Resume_or_Rethrow",
            "_Unwind_ForcedUnwind",
        ] {
            let Ok(funcs) = weft_symbols::resolve_in_module(&m, name) else {
                continue;
            };
            for f in funcs {
                let Some(addr) = f.runtime_addr else { continue };
                out.push(SiteSpec {
                    func: weft_x86::FunctionCode {
                        addr,
                        bytes: f.bytes.clone(),
                        size_known: f.size > 0,
                        padding: f.padding.clone(),
                    },
                    name: f.name.clone(),
                    site_addr: addr,
                    entry: vec![Call {
                        advice: on_raise,
                        probe: 0,
                        body: None,
                    }],
                    ret: Vec::new(),
                    around: None,
                    label: format!("{INTERNAL}{}:{}", m.path.display(), f.name),
                    usdt_args: None,
                    semaphore: None,
                    stub_of: None,
                    call: None,
                });
            }
        }
    }
    out
}

/// The redirect of glibc's `__libc_sigaction` (which `sigaction`, `signal` and glibc
/// itself call) to the agent's `weft_agent_sigaction`; `__sigaction` where the former
/// is not exported.
pub fn sigaction_redirect(maps: &ProcMaps) -> Option<SiteSpec> {
    for m in maps.modules() {
        if !m.file_name().starts_with("libc.so") {
            continue;
        }
        for name in ["__libc_sigaction", "__sigaction"] {
            let Ok(funcs) = weft_symbols::resolve_in_module(&m, name) else {
                continue;
            };
            for f in funcs {
                let Some(addr) = f.runtime_addr else { continue };
                if f.ifunc || f.size == 0 {
                    continue;
                }
                return Some(SiteSpec {
                    func: weft_x86::FunctionCode {
                        addr,
                        bytes: f.bytes.clone(),
                        size_known: true,
                        padding: f.padding.clone(),
                    },
                    name: f.name.clone(),
                    site_addr: addr,
                    entry: Vec::new(),
                    ret: Vec::new(),
                    around: None,
                    label: format!("{INTERNAL}{}:{}", m.path.display(), f.name),
                    usdt_args: None,
                    semaphore: None,
                    stub_of: None,
                    call: None,
                });
            }
        }
    }
    None
}
