//! weft's end of the control channel: an abstract `SOCK_SEQPACKET` socket with a
//! random name that only the target (checked by peer credentials) may use.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Result};
use weft_abi::msg::{Msg, MsgError};
use weft_abi::{Hello, ProfileDesc, WatchDesc, VERSION};
use weft_runtime::proto::{self, Received};

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
                if let Some((fd, peer)) = self.accept_one()? {
                    if peer != pid {
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

impl Listener {
    /// One pending connection, with the pid of the process at its other end, if
    /// that process runs as our user (root accepts anyone); `None` when nothing
    /// waits. Connections from other users are closed and skipped.
    fn accept_one(&self) -> Result<Option<(OwnedFd, i32)>> {
        loop {
            // SAFETY: accept4 on our listening socket; no addresses asked for.
            let raw = unsafe {
                libc::accept4(
                    self.fd.as_raw_fd(),
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                    libc::SOCK_CLOEXEC,
                )
            };
            if raw < 0 {
                return Ok(None);
            }
            // SAFETY: a fresh connected fd, owned from here on.
            let fd = unsafe { OwnedFd::from_raw_fd(raw) };
            let cred = proto::peer_cred(raw)?;
            // SAFETY: getuid has no preconditions.
            let me = unsafe { libc::getuid() };
            if me != 0 && cred.uid != me {
                continue;
            }
            return Ok(Some((fd, cred.pid)));
        }
    }

    /// A connection waiting to be accepted, if any (no wait): an agent that joins
    /// the session by itself (a followed child), checked to run as our user (or
    /// `allowed` to tell), with the pid it runs in.
    pub fn try_accept(&self, allowed: impl Fn(i32) -> bool) -> Result<Option<(Agent, i32)>> {
        loop {
            let Some((fd, peer)) = self.accept_one()? else {
                return Ok(None);
            };
            if !allowed(peer) {
                // Not one of ours: refuse it and look for the next.
                continue;
            }
            match Agent::handshake(fd) {
                Ok(a) => return Ok(Some((a, peer))),
                // Gone before it said hello (a short-lived child): nothing to do.
                Err(_) => continue,
            }
        }
    }
}

/// A connected agent.
pub struct Agent {
    fd: OwnedFd,
    pub hello: Hello,
}

impl Agent {
    fn handshake(fd: OwnedFd) -> Result<Agent> {
        let r = recv_timeout(fd.as_raw_fd(), Duration::from_secs(10))?;
        let hello = match r.msg() {
            Ok(Msg::Hello(h)) => h,
            Ok(_) | Err(MsgError::Truncated) => bail!("the agent sent no valid hello"),
            Err(e) => bail!("the agent sent no valid hello: {e}"),
        };
        if hello.version != VERSION {
            bail!(
                "the agent in the target speaks protocol version {}, this weft speaks {}; \
                 restart the target or use the matching weft",
                hello.version,
                VERSION
            );
        }
        // A followed child inherited its parent's session, which is ours.
        if hello.busy != 0 && hello.parent == 0 {
            bail!("another weft session is active in this process");
        }
        Ok(Agent { fd, hello })
    }

    pub fn raw(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// Send `msg` (with `fd`) and wait for the answer; an error answer is an error.
    fn request(&self, msg: Msg<'_>, fd: Option<RawFd>) -> Result<Received> {
        proto::send(self.raw(), &msg, fd).map_err(|e| match e.kind() {
            std::io::ErrorKind::BrokenPipe | std::io::ErrorKind::ConnectionReset => gone(e),
            _ => anyhow::Error::new(e).context("sending to the agent"),
        })?;
        let r = recv_timeout(self.raw(), Duration::from_secs(10))?;
        if let Ok(Msg::Err(e)) = r.msg() {
            bail!("agent: {e}");
        }
        Ok(r)
    }

    /// Send `msg` and expect `Ok`.
    fn command(&self, msg: Msg<'_>) -> Result<()> {
        let r = self.request(msg, None)?;
        match r.msg() {
            Ok(Msg::Ok) => Ok(()),
            other => bail!("unexpected answer {other:?} from the agent to {msg:?}"),
        }
    }

    /// Have the agent map the segment as site space `space`; returns its address in
    /// the target and the session's generation number. `pid`'s name (`pcomm`) goes
    /// with it.
    pub fn map_shm(
        &self,
        fd: RawFd,
        size: u64,
        space: u32,
        flags: u32,
        pid: i32,
    ) -> Result<(u64, u32)> {
        let name = std::fs::read(format!("/proc/{pid}/comm")).unwrap_or_default();
        let mut pcomm = [0u8; 16];
        for (d, s) in pcomm[..15]
            .iter_mut()
            .zip(name.iter().take_while(|&&b| b != b'\n'))
        {
            *d = *s;
        }
        let msg = Msg::MapShm {
            size,
            space,
            flags,
            pcomm,
        };
        let r = self.request(msg, Some(fd))?;
        match r.msg() {
            Ok(Msg::ShmMapped { addr, generation }) => Ok((addr, generation)),
            other => bail!("unexpected answer {other:?} from the agent to a segment"),
        }
    }

    /// A code region inside `[lo, hi)`: its address and the memfd to map it RW.
    pub fn alloc_code(&self, lo: u64, hi: u64, size: u64) -> Result<(u64, u64, OwnedFd)> {
        let r = self.request(Msg::AllocCode { lo, hi, size }, None)?;
        let (addr, size) = match r.msg() {
            Ok(Msg::CodeRegion { addr, size }) => (addr, size),
            other => bail!("unexpected answer {other:?} to a code region request"),
        };
        let fd =
            r.fd.ok_or_else(|| anyhow!("code region without a file descriptor"))?;
        Ok((addr, size, fd))
    }

    /// A forked child's sites are now those of site space `space`.
    pub fn adopt(&self, space: u32) -> Result<()> {
        self.command(Msg::Adopt { space })
    }

    /// Profile probe `index`, compiled for this process.
    pub fn set_profile(&self, index: u32, desc: ProfileDesc) -> Result<()> {
        self.command(Msg::SetProfile { index, desc })
    }

    /// Data watch `index` (hardware watchpoints on every thread), compiled for this
    /// process; sent again to move it, with `len == 0` to drop it.
    pub fn set_watch(&self, index: u32, desc: WatchDesc) -> Result<()> {
        self.command(Msg::SetWatch { index, desc })
    }

    /// Write the patch (`on`) or the original bytes at `sites` while the process
    /// runs (at most `SiteList::MAX` of them).
    pub fn set_sites(&self, sites: &[u32], on: bool) -> Result<()> {
        let mut bytes = vec![0u8; sites.len() * 4];
        let n = weft_abi::msg::SiteList::bytes_of(sites, &mut bytes);
        self.command(Msg::SetSites {
            on,
            sites: weft_abi::msg::SiteList::new(&bytes[..n]),
        })
    }

    pub fn go(&self) -> Result<()> {
        self.command(Msg::Go)
    }

    /// The sigaction redirect is patched: the agent puts its signal handlers back in
    /// front, with the target's as its virtual dispositions.
    pub fn take_signals(&self) -> Result<()> {
        self.command(Msg::TakeSignals)
    }

    pub fn end(&self) -> Result<()> {
        self.command(Msg::End)
    }

    pub fn free(&self) -> Result<()> {
        self.command(Msg::Free)
    }
}

fn recv_timeout(fd: RawFd, timeout: Duration) -> Result<Received> {
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
    match proto::recv(fd).map_err(gone)? {
        Some(m) => Ok(m),
        None => bail!("the target exited (its agent closed the connection)"),
    }
}

/// A socket error meaning the process's end is gone with it, said so; others as
/// they are.
fn gone(e: std::io::Error) -> anyhow::Error {
    match e.kind() {
        std::io::ErrorKind::BrokenPipe
        | std::io::ErrorKind::ConnectionReset
        | std::io::ErrorKind::UnexpectedEof => {
            anyhow!("the target exited (its agent's connection closed)")
        }
        _ => anyhow::Error::new(e),
    }
}
