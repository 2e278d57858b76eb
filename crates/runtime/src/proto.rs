//! Control messages on the `SOCK_SEQPACKET` socket between weft and the agent: one
//! datagram per [`Msg`] (encoded by `weft_abi::msg`), file descriptors as
//! `SCM_RIGHTS`. Not on the hot path.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use weft_abi::msg::{Msg, MsgError, MAX_MSG};

/// A received datagram (and the descriptor that came with it).
#[derive(Debug)]
pub struct Received {
    bytes: Vec<u8>,
    pub fd: Option<OwnedFd>,
}

impl Received {
    /// The message it holds.
    pub fn msg(&self) -> Result<Msg<'_>, MsgError> {
        Msg::decode(&self.bytes)
    }
}

/// Send `msg`, with `fd` attached if given.
pub fn send(sock: RawFd, msg: &Msg<'_>, fd: Option<RawFd>) -> io::Result<()> {
    let mut buf = vec![0u8; MAX_MSG];
    let n = msg
        .encode(&mut buf)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "control message too long"))?;
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr() as *mut _,
        iov_len: n,
    };
    let mut cmsg_buf = [0u64; 4];
    // SAFETY: msghdr is plain data; every pointer in it refers to live locals.
    unsafe {
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        if let Some(fd) = fd {
            msg.msg_control = cmsg_buf.as_mut_ptr() as *mut _;
            msg.msg_controllen = libc::CMSG_SPACE(4) as usize;
            let c = libc::CMSG_FIRSTHDR(&msg);
            (*c).cmsg_level = libc::SOL_SOCKET;
            (*c).cmsg_type = libc::SCM_RIGHTS;
            (*c).cmsg_len = libc::CMSG_LEN(4) as usize;
            (libc::CMSG_DATA(c) as *mut i32).write_unaligned(fd);
        }
        loop {
            let r = libc::sendmsg(sock, &msg, libc::MSG_NOSIGNAL);
            if r >= 0 {
                return Ok(());
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
    }
}

/// Receive one datagram. `Ok(None)` when the peer closed the connection.
pub fn recv(sock: RawFd) -> io::Result<Option<Received>> {
    let mut buf = vec![0u8; MAX_MSG];
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr() as *mut _,
        iov_len: buf.len(),
    };
    let mut cmsg_buf = [0u64; 8];
    // SAFETY: as in `send`; the kernel fills buf and cmsg_buf within their sizes.
    unsafe {
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = cmsg_buf.as_mut_ptr() as *mut _;
        msg.msg_controllen = std::mem::size_of_val(&cmsg_buf);
        let n = loop {
            let r = libc::recvmsg(sock, &mut msg, libc::MSG_CMSG_CLOEXEC);
            if r >= 0 {
                break r as usize;
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        };
        if n == 0 {
            return Ok(None);
        }
        let mut fd = None;
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let raw = (libc::CMSG_DATA(c) as *const i32).read_unaligned();
                fd = Some(OwnedFd::from_raw_fd(raw));
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
        buf.truncate(n);
        Ok(Some(Received { bytes: buf, fd }))
    }
}

/// An abstract-namespace address for `name` (no leading NUL in `name`).
pub fn abstract_addr(name: &str) -> (libc::sockaddr_un, libc::socklen_t) {
    // SAFETY: sockaddr_un is plain data.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as u16;
    let bytes = name.as_bytes();
    let n = bytes.len().min(addr.sun_path.len() - 1);
    for (i, b) in bytes[..n].iter().enumerate() {
        addr.sun_path[1 + i] = *b as libc::c_char;
    }
    let len = std::mem::size_of::<libc::sa_family_t>() + 1 + n;
    (addr, len as libc::socklen_t)
}

/// Connect to the abstract `SOCK_SEQPACKET` socket `name`.
pub fn connect(name: &str) -> io::Result<OwnedFd> {
    // SAFETY: plain socket calls; the fd is owned on success.
    unsafe {
        let fd = libc::socket(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0);
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        let fd = OwnedFd::from_raw_fd(fd);
        let (addr, len) = abstract_addr(name);
        if libc::connect(
            fd.as_raw_fd(),
            &addr as *const _ as *const libc::sockaddr,
            len,
        ) != 0
        {
            return Err(io::Error::last_os_error());
        }
        Ok(fd)
    }
}

/// Credentials of the peer of a connected Unix socket.
pub fn peer_cred(fd: RawFd) -> io::Result<libc::ucred> {
    // SAFETY: getsockopt fills a ucred of the given size.
    unsafe {
        let mut cred: libc::ucred = std::mem::zeroed();
        let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
        if libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            &mut cred as *mut _ as *mut _,
            &mut len,
        ) != 0
        {
            return Err(io::Error::last_os_error());
        }
        Ok(cred)
    }
}
