//! Probes that run in weft itself (BEGIN, END, interval): their advice is compiled
//! for weft's own helper addresses and called with a frame on weft's thread slot.

use anyhow::{bail, Result};
use weft_abi::{AgentThread, Frame, Regs, ThreadSlot};
use weft_ir::{Function, Program};
use weft_jit::{Env, MapLayout};
use weft_runtime::shm::Shm;

/// Executable memory holding compiled advice.
pub struct ExecCode {
    ptr: *mut u8,
    len: usize,
    pub funcs: Vec<usize>,
}

impl ExecCode {
    pub fn new(blobs: &[Vec<u8>]) -> Result<ExecCode> {
        let total: usize = blobs.iter().map(|b| b.len().div_ceil(16) * 16).sum();
        let len = total.max(1).div_ceil(4096) * 4096;
        // SAFETY: a fresh private anonymous mapping.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            bail!("mmap for local advice: {}", std::io::Error::last_os_error());
        }
        let ptr = ptr as *mut u8;
        let mut funcs = Vec::new();
        let mut off = 0usize;
        for b in blobs {
            // SAFETY: off + len <= total <= mapping size.
            unsafe { std::ptr::copy_nonoverlapping(b.as_ptr(), ptr.add(off), b.len()) };
            funcs.push(ptr as usize + off);
            off += b.len().div_ceil(16) * 16;
        }
        // SAFETY: W^X: the mapping becomes read+exec once written.
        if unsafe { libc::mprotect(ptr as *mut _, len, libc::PROT_READ | libc::PROT_EXEC) } != 0 {
            bail!(
                "mprotect for local advice: {}",
                std::io::Error::last_os_error()
            );
        }
        Ok(ExecCode { ptr, len, funcs })
    }
}

impl Drop for ExecCode {
    fn drop(&mut self) {
        // SAFETY: our own mapping; nothing runs it after drop.
        unsafe { libc::munmap(self.ptr as *mut _, self.len) };
    }
}

/// Runs local probes on weft's own thread slot.
pub struct Local {
    code: ExecCode,
    tstate: Box<AgentThread>,
    slot: *mut ThreadSlot,
    shm: Shm,
}

impl Local {
    /// Compile `bodies` (indices into `prog.probes`) for this process.
    pub fn new(
        prog: &Program,
        bodies: &[&Function],
        maps: &[MapLayout],
        thread_agg_off: u64,
        shm: Shm,
        slot: *mut ThreadSlot,
    ) -> Result<Local> {
        weft_runtime::safe::install_fault_handler()?;
        let helpers = weft_runtime::helpers::helper_table();
        let no_symbols = |_: &weft_ir::SymbolRef| None;
        let env = Env {
            helpers: &helpers,
            maps,
            thread_agg_off,
            symbol: &no_symbols,
            usdt_args: None,
        };
        let blobs = bodies
            .iter()
            .map(|f| weft_jit::compile(f, prog, &env))
            .collect::<Result<Vec<_>, _>>()?;
        // SAFETY: AgentThread is plain data; zero is a valid initial state.
        let mut tstate: Box<AgentThread> = Box::new(unsafe { std::mem::zeroed() });
        // SAFETY: gettid/getpid have no preconditions.
        unsafe {
            tstate.tid = libc::gettid() as u32;
            tstate.pid = libc::getpid() as u32;
        }
        Ok(Local {
            code: ExecCode::new(&blobs)?,
            tstate,
            slot,
            shm,
        })
    }

    /// Run body `i` (in the order given to `new`) with `probe` as its probe index.
    pub fn run(&mut self, i: usize, probe: u32) {
        let mut frame = Frame {
            regs: Regs::default(),
            thread: self.slot,
            shm: self.shm.base(),
            site: u64::MAX,
            func: 0,
            tstate: &mut *self.tstate as *mut AgentThread as *mut u8,
            probe: u64::from(probe),
        };
        // SAFETY: funcs[i] is compiled advice for this process's helpers and segment.
        let f: extern "C" fn(*mut Frame) = unsafe { std::mem::transmute(self.code.funcs[i]) };
        f(&mut frame);
    }
}
