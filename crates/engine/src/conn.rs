//! weft's end of the control channel: an abstract `SOCK_SEQPACKET` socket with a
//! random name that only the target (checked by peer credentials) may use.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use weft_abi::*;
use weft_runtime::proto::{self, Message};

pub struct Listener {
    fd: OwnedFd,
    pub name: String,
}

impl Listener {
    pub fn new() -> Result<Listener> {
        let mut rnd = [0u8; 12];
        // SAFETY: getrandom into a local buffer.
        let n = unsafe { libc::getrandom(rnd.as_mut_ptr() as *mut _, rnd.len(), 0) };
        if n != rnd.len() as isize {
            bail!("getrandom failed");
        }
        let hex: String = rnd.iter().map(|b| format!("{b:02x}")).collect();
        // SAFETY: getpid has no preconditions.
        let name = format!("weft-{}-{hex}", unsafe { libc::getpid() });
        // SAFETY: socket/bind/listen on a fresh fd.
        unsafe {
            let raw = libc::socket(
                libc::AF_UNIX,
                libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
                0,
            );
            if raw < 0 {
                bail!("socket: {}", std::io::Error::last_os_error());
            }
            let fd = OwnedFd::from_raw_fd(raw);
            let (addr, len) = proto::abstract_addr(&name);
            if libc::bind(raw, &addr as *const _ as *const libc::sockaddr, len) != 0 {
                bail!("bind {name}: {}", std::io::Error::last_os_error());
            }
            if libc::listen(raw, 4) != 0 {
                bail!("listen: {}", std::io::Error::last_os_error());
            }
            Ok(Listener { fd, name })
        }
    }

    /// Accept the agent of process `pid`. `alive` is polled so a target that dies
    /// (or never loads the agent) ends the wait early.
    pub fn accept(
        &self,
        pid: i32,
        timeout: Duration,
        mut alive: impl FnMut() -> Result<()>,
    ) -> Result<Agent> {
        let start = Instant::now();
        loop {
            let mut pfd = libc::pollfd {
                fd: self.fd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: poll on one pollfd.
            let r = unsafe { libc::poll(&mut pfd, 1, 20) };
            if r > 0 {
                // SAFETY: accept4 on our listening socket.
                let raw = unsafe {
                    libc::accept4(
                        self.fd.as_raw_fd(),
                        std::ptr::null_mut(),
                        std::ptr::null_mut(),
                        libc::SOCK_CLOEXEC,
                    )
                };
                if raw >= 0 {
                    // SAFETY: a fresh connected fd.
                    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
                    let cred = proto::peer_cred(raw)?;
                    // SAFETY: getuid has no preconditions.
                    let me = unsafe { libc::getuid() };
                    if cred.pid != pid || (me != 0 && cred.uid != me) {
                        // Someone else found the name: refuse and keep waiting.
                        continue;
                    }
                    return Agent::handshake(fd);
                }
            }
            alive()?;
            if start.elapsed() > timeout {
                bail!(
                    "the agent in process {pid} did not connect within {} s",
                    timeout.as_secs()
                );
            }
        }
    }
}

/// A connected agent.
pub struct Agent {
    fd: OwnedFd,
    pub hello: Hello,
    /// Address of `weft_agent_on_raise`.
    pub on_raise: u64,
    /// Address of `weft_agent_sigaction` (glibc's `__libc_sigaction` is redirected
    /// there while woven); 0 from an agent without it.
    pub sigaction: u64,
    /// Address of the agent's step guard (`weft_inject`'s `set_step_guard`): the
    /// agent swallows the traps of a step weft died in; 0 from an agent without it.
    pub step_guard: u64,
}

impl Agent {
    fn handshake(fd: OwnedFd) -> Result<Agent> {
        let m = recv_timeout(fd.as_raw_fd(), Duration::from_secs(10))?;
        if m.tag != MSG_HELLO || m.payload.len() < std::mem::size_of::<Hello>() {
            bail!("the agent sent no valid hello");
        }
        // SAFETY: the payload holds a Hello (checked length); repr(C) plain data.
        let hello = unsafe { (m.payload.as_ptr() as *const Hello).read_unaligned() };
        if hello.version != VERSION {
            bail!(
                "the agent in the target speaks protocol version {}, this weft speaks {}; \
                 restart the target or use the matching weft",
                hello.version,
                VERSION
            );
        }
        if hello.busy != 0 {
            bail!("another weft session is active in this process");
        }
        let off = std::mem::size_of::<Hello>();
        let extra = |k: usize| {
            m.payload
                .get(off + 8 * k..off + 8 * k + 8)
                .map_or(0, |b| u64::from_le_bytes(b.try_into().unwrap()))
        };
        Ok(Agent {
            fd,
            hello,
            on_raise: extra(0),
            sigaction: extra(1),
            step_guard: extra(2),
        })
    }

    pub fn raw(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    fn request(&self, tag: u32, payload: &[u8], fd: Option<RawFd>) -> Result<Message> {
        proto::send(self.raw(), tag, payload, fd).context("sending to the agent")?;
        let m = recv_timeout(self.raw(), Duration::from_secs(10))?;
        if m.tag == MSG_ERR {
            bail!("agent: {}", String::from_utf8_lossy(&m.payload));
        }
        Ok(m)
    }

    /// Have the agent map the segment; returns its address in the target and the
    /// session's generation number.
    pub fn map_shm(&self, fd: RawFd, size: u64) -> Result<(u64, u32)> {
        let m = self.request(MSG_MAP_SHM, &proto::u64s(&[size]), Some(fd))?;
        Ok((m.u64_at(0), m.u64_at(1) as u32))
    }

    /// A code region inside `[lo, hi)`: its address and the memfd to map it RW.
    pub fn alloc_code(&self, lo: u64, hi: u64, size: u64) -> Result<(u64, u64, OwnedFd)> {
        let m = self.request(MSG_ALLOC_CODE, &proto::u64s(&[lo, hi, size]), None)?;
        if m.tag != MSG_CODE_REGION {
            bail!("unexpected reply {} to a code region request", m.tag);
        }
        let (addr, size) = (m.u64_at(0), m.u64_at(1));
        let fd =
            m.fd.ok_or_else(|| anyhow!("code region without a file descriptor"))?;
        Ok((addr, size, fd))
    }

    pub fn go(&self) -> Result<()> {
        self.request(MSG_GO, &[], None).map(drop)
    }

    /// The sigaction redirect is patched: the agent puts its signal handlers back in
    /// front, with the target's as its virtual dispositions.
    pub fn take_signals(&self) -> Result<()> {
        self.request(MSG_TAKE_SIGNALS, &[], None).map(drop)
    }

    pub fn end(&self) -> Result<()> {
        self.request(MSG_END, &[], None).map(drop)
    }

    pub fn free(&self) -> Result<()> {
        self.request(MSG_FREE, &[], None).map(drop)
    }
}

fn recv_timeout(fd: RawFd, timeout: Duration) -> Result<Message> {
    let mut pfd = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: poll on one pollfd.
    let r = unsafe { libc::poll(&mut pfd, 1, timeout.as_millis() as i32) };
    if r == 0 {
        bail!("the agent did not answer within {} s", timeout.as_secs());
    }
    match proto::recv(fd)? {
        Some(m) => Ok(m),
        None => bail!("the agent closed the connection (the target exited?)"),
    }
}
