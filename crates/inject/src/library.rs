//! Loading a shared library into a stopped process: a remote `dlopen`.

use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use crate::call::CallArg;
use crate::error::{InjectError, Result};
use crate::stop::StoppedProcess;

/// The longest `dlerror` message read back from the target.
const MAX_DLERROR: usize = 4096;

/// Makes thread `tid` call `dlopen(path, RTLD_NOW)` and returns the handle. On failure
/// the message of a remote `dlerror()` is returned in [`InjectError::DlopenFailed`].
///
/// `dlopen_addr` and `dlerror_addr` are the functions' addresses in the target
/// (resolving them is the caller's business); `dlerror_addr` may be 0 if there is
/// none. `path` is as the target sees it (its
/// mount namespace and root). The library's constructors run in `tid`, before this
/// returns; threads they create are held stopped until the process is resumed.
///
/// `tid` must not be inside `malloc` or hold a lock `dlopen` needs (malloc's, the
/// loader's, the exit handlers'): a nested `malloc` corrupts a single-threaded heap.
/// [`StoppedProcess::pick_call_thread`] only lowers the odds; weft's CLI waits for a
/// safe point (`weft::safepoint`).
pub fn inject_library(
    stopped: &mut StoppedProcess,
    tid: i32,
    dlopen_addr: u64,
    dlerror_addr: u64,
    path: &Path,
) -> Result<u64> {
    let bytes = path.as_os_str().as_bytes();
    if bytes.contains(&0) {
        return Err(InjectError::InvalidPath {
            path: path.display().to_string(),
        });
    }
    let mut c_path = bytes.to_vec();
    c_path.push(0);
    let args = [CallArg::StackData, CallArg::Value(libc::RTLD_NOW as u64)];
    let handle = stopped.call(tid, dlopen_addr, &args, &c_path)?.ret;
    if handle != 0 {
        return Ok(handle);
    }
    if dlerror_addr == 0 {
        return Err(InjectError::DlopenFailed {
            path: path.display().to_string(),
            message: "dlopen returned NULL (no dlerror in the target to ask why)".to_string(),
        });
    }
    let message = match stopped.call(tid, dlerror_addr, &[], &[])?.ret {
        0 => "dlopen returned NULL and dlerror() gave no message".to_string(),
        addr => {
            let text = stopped.read_c_string(addr, MAX_DLERROR)?;
            String::from_utf8_lossy(&text).replace('\n', " ")
        }
    };
    Err(InjectError::DlopenFailed {
        path: path.display().to_string(),
        message,
    })
}
