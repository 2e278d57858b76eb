//! Control messages between weft and the agent, encoded and decoded here only.
//!
//! One message per `SOCK_SEQPACKET` datagram: a `u32` tag, then the fields in order,
//! little-endian (`u32`, `u64`), strings as their UTF-8 bytes to the end of the
//! datagram. File descriptors ride along as `SCM_RIGHTS` (`weft_runtime::proto`).
//! [`Hello`] is sent as its `repr(C)` bytes. The protocol is versioned by
//! [`crate::VERSION`], which the agent announces in its hello; weft refuses an agent
//! of another version.

use crate::{Hello, ProfileDesc, WatchDesc};

/// A control message.
// The hello is large; messages are made and read one at a time, on no hot path,
// and `no_std` without an allocator has no box to put it in.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Msg<'a> {
    /// Agent → weft, first message on a new connection.
    Hello(Hello),
    /// weft → agent: map the session's shared segment (a memfd, attached) of `size`
    /// bytes; `space` identifies this process's sites in the segment's site table;
    /// `flags` are `SESSION_*`; `pcomm` is the process's name (its main thread's
    /// `comm`, NUL-padded) for `pcomm`, read by weft from `/proc` so the agent opens
    /// nothing. Answered by [`Msg::ShmMapped`].
    MapShm {
        size: u64,
        space: u32,
        flags: u32,
        pcomm: [u8; 16],
    },
    /// Agent → weft: where the segment is mapped, and the agent's generation number
    /// for this session (return probes check it).
    ShmMapped { addr: u64, generation: u32 },
    /// weft → agent: map a code region of `size` bytes inside `[lo, hi)`.
    /// Answered by [`Msg::CodeRegion`].
    AllocCode { lo: u64, hi: u64, size: u64 },
    /// Agent → weft: a code region (its memfd attached, to map read-write).
    CodeRegion { addr: u64, size: u64 },
    /// weft → agent: profile probe `index` (`hz == 0`: none), compiled for this
    /// process. Answered by [`Msg::Ok`].
    SetProfile { index: u32, desc: ProfileDesc },
    /// weft → agent: data watch `index` (hardware watchpoints on every thread;
    /// `desc.len == 0` or `desc.addr == 0`: none), compiled for this process. Sent
    /// again to move it (`set:addr(@p, N)`). Answered by [`Msg::Ok`], or
    /// [`Msg::Err`] when the kernel refused the watchpoint.
    SetWatch { index: u32, desc: WatchDesc },
    /// weft → agent: write the patch (`on`) or the original bytes (`!on`) at the
    /// listed sites of this process while it runs, with the int3-first sequence;
    /// answered by [`Msg::Ok`]. `on` only for sites whose patch replaces one
    /// instruction (no thread can be inside it); the others are patched by weft
    /// with the process stopped.
    SetSites { on: bool, sites: SiteList<'a> },
    /// weft → agent (a forked child's, which inherited its parent's session): the
    /// session's sites in this process are now those of site space `space` (weft
    /// copied the parent's into it). Answered by [`Msg::Ok`].
    Adopt { space: u32 },
    /// weft → agent: the sites are patched, advice may run (releases a launched
    /// target).
    Go,
    /// weft → agent: glibc's `sigaction` now goes through the agent (the redirect is
    /// patched); make the kernel hold the agent's SIGTRAP/SIGSEGV/SIGBUS handlers,
    /// the target's becoming its virtual dispositions.
    TakeSignals,
    /// weft → agent: the session is over in this process and all its sites are
    /// restored; keep the segment and code until [`Msg::Free`].
    End,
    /// weft → agent: no thread is inside the session's code any more: unmap it.
    Free,
    /// Agent → weft: done.
    Ok,
    /// Agent → weft: the request failed; why.
    Err(&'a str),
}

/// Site indices, little-endian `u32`s (at most [`SiteList::MAX`] in one message).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SiteList<'a>(&'a [u8]);

impl<'a> SiteList<'a> {
    /// Most indices in one message.
    pub const MAX: usize = (MAX_MSG - 8) / 4;

    /// The list held in `bytes` (from [`SiteList::bytes_of`]).
    pub fn new(bytes: &'a [u8]) -> SiteList<'a> {
        SiteList(bytes)
    }

    /// The bytes of `indices`, for [`SiteList::new`].
    pub fn bytes_of(indices: &[u32], out: &mut [u8]) -> usize {
        let mut n = 0;
        for (i, v) in indices.iter().enumerate() {
            if let Some(b) = out.get_mut(i * 4..i * 4 + 4) {
                b.copy_from_slice(&v.to_le_bytes());
                n = i * 4 + 4;
            }
        }
        n
    }

    pub fn len(&self) -> usize {
        self.0.len() / 4
    }

    pub fn is_empty(&self) -> bool {
        self.0.len() < 4
    }

    pub fn iter(&self) -> impl Iterator<Item = u32> + 'a {
        self.0
            .chunks_exact(4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
}

/// `MapShm` flag: children this process forks stay woven and join the session.
pub const SESSION_FOLLOW_FORK: u32 = 1;

const HELLO: u32 = 1;
const MAP_SHM: u32 = 2;
const ALLOC_CODE: u32 = 3;
const CODE_REGION: u32 = 4;
const GO: u32 = 5;
const END: u32 = 6;
const FREE: u32 = 7;
const OK: u32 = 8;
const ERR: u32 = 9;
const TAKE_SIGNALS: u32 = 10;
const SHM_MAPPED: u32 = 11;
const SET_PROFILE: u32 = 12;
const SET_SITES: u32 = 13;
const ADOPT: u32 = 14;
const SET_WATCH: u32 = 15;

/// Largest encoded message (the hello, with room to spare).
pub const MAX_MSG: usize = 4096;

/// Why a datagram is not a message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MsgError {
    /// Shorter than its tag and fields.
    Truncated,
    /// A tag this version does not know.
    UnknownTag(u32),
    /// An error text that is not UTF-8.
    NotUtf8,
}

impl core::fmt::Display for MsgError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            MsgError::Truncated => write!(f, "truncated control message"),
            MsgError::UnknownTag(t) => write!(f, "unknown control message {t}"),
            MsgError::NotUtf8 => write!(f, "control message text is not UTF-8"),
        }
    }
}

struct Writer<'b> {
    buf: &'b mut [u8],
    at: usize,
}

impl Writer<'_> {
    fn bytes(&mut self, b: &[u8]) -> Option<()> {
        let end = self.at.checked_add(b.len())?;
        self.buf.get_mut(self.at..end)?.copy_from_slice(b);
        self.at = end;
        Some(())
    }
    fn u32(&mut self, v: u32) -> Option<()> {
        self.bytes(&v.to_le_bytes())
    }
    fn u64(&mut self, v: u64) -> Option<()> {
        self.bytes(&v.to_le_bytes())
    }
}

struct Reader<'b> {
    buf: &'b [u8],
    at: usize,
}

impl<'b> Reader<'b> {
    fn take(&mut self, n: usize) -> Result<&'b [u8], MsgError> {
        let end = self.at.checked_add(n).ok_or(MsgError::Truncated)?;
        let b = self.buf.get(self.at..end).ok_or(MsgError::Truncated)?;
        self.at = end;
        Ok(b)
    }
    fn u32(&mut self) -> Result<u32, MsgError> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn u64(&mut self) -> Result<u64, MsgError> {
        let b = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_le_bytes(a))
    }
    fn rest(&mut self) -> &'b [u8] {
        let b = &self.buf[self.at.min(self.buf.len())..];
        self.at = self.buf.len();
        b
    }
}

impl<'a> Msg<'a> {
    /// Encode into `buf`; the length used, `None` if it does not fit.
    pub fn encode(&self, buf: &mut [u8]) -> Option<usize> {
        let mut w = Writer { buf, at: 0 };
        match *self {
            Msg::Hello(h) => {
                w.u32(HELLO)?;
                // SAFETY: Hello is repr(C) plain data; its bytes are its encoding.
                let bytes = unsafe {
                    core::slice::from_raw_parts(
                        &h as *const Hello as *const u8,
                        core::mem::size_of::<Hello>(),
                    )
                };
                w.bytes(bytes)?;
            }
            Msg::MapShm {
                size,
                space,
                flags,
                pcomm,
            } => {
                w.u32(MAP_SHM)?;
                w.u64(size)?;
                w.u32(space)?;
                w.u32(flags)?;
                w.bytes(&pcomm)?;
            }
            Msg::ShmMapped { addr, generation } => {
                w.u32(SHM_MAPPED)?;
                w.u64(addr)?;
                w.u32(generation)?;
            }
            Msg::AllocCode { lo, hi, size } => {
                w.u32(ALLOC_CODE)?;
                w.u64(lo)?;
                w.u64(hi)?;
                w.u64(size)?;
            }
            Msg::CodeRegion { addr, size } => {
                w.u32(CODE_REGION)?;
                w.u64(addr)?;
                w.u64(size)?;
            }
            Msg::SetProfile { index, desc } => {
                w.u32(SET_PROFILE)?;
                w.u32(index)?;
                w.u32(desc.hz)?;
                w.u32(desc.probe)?;
                w.u64(desc.advice)?;
            }
            Msg::SetWatch { index, desc } => {
                w.u32(SET_WATCH)?;
                w.u32(index)?;
                w.u64(desc.addr)?;
                w.u32(desc.len)?;
                w.u32(desc.access)?;
                w.u32(desc.probe)?;
                w.u32(0)?;
                w.u64(desc.advice)?;
            }
            Msg::SetSites { on, sites } => {
                w.u32(SET_SITES)?;
                w.u32(u32::from(on))?;
                w.bytes(sites.0)?;
            }
            Msg::Adopt { space } => {
                w.u32(ADOPT)?;
                w.u32(space)?;
            }
            Msg::Go => w.u32(GO)?,
            Msg::TakeSignals => w.u32(TAKE_SIGNALS)?,
            Msg::End => w.u32(END)?,
            Msg::Free => w.u32(FREE)?,
            Msg::Ok => w.u32(OK)?,
            Msg::Err(text) => {
                w.u32(ERR)?;
                w.bytes(text.as_bytes())?;
            }
        }
        Some(w.at)
    }

    /// Decode one datagram.
    pub fn decode(buf: &'a [u8]) -> Result<Msg<'a>, MsgError> {
        let mut r = Reader { buf, at: 0 };
        let tag = r.u32()?;
        Ok(match tag {
            HELLO => {
                let b = r.take(core::mem::size_of::<Hello>())?;
                // SAFETY: `b` holds size_of::<Hello>() bytes; Hello is plain data for
                // which every bit pattern is valid.
                Msg::Hello(unsafe { (b.as_ptr() as *const Hello).read_unaligned() })
            }
            MAP_SHM => Msg::MapShm {
                size: r.u64()?,
                space: r.u32()?,
                flags: r.u32()?,
                pcomm: {
                    let b = r.take(16)?;
                    core::array::from_fn(|i| b[i])
                },
            },
            SHM_MAPPED => Msg::ShmMapped {
                addr: r.u64()?,
                generation: r.u32()?,
            },
            ALLOC_CODE => Msg::AllocCode {
                lo: r.u64()?,
                hi: r.u64()?,
                size: r.u64()?,
            },
            CODE_REGION => Msg::CodeRegion {
                addr: r.u64()?,
                size: r.u64()?,
            },
            SET_PROFILE => Msg::SetProfile {
                index: r.u32()?,
                desc: ProfileDesc {
                    hz: r.u32()?,
                    probe: r.u32()?,
                    advice: r.u64()?,
                },
            },
            SET_WATCH => {
                let index = r.u32()?;
                let (addr, len, access, probe) = (r.u64()?, r.u32()?, r.u32()?, r.u32()?);
                let _pad = r.u32()?;
                Msg::SetWatch {
                    index,
                    desc: WatchDesc {
                        addr,
                        len,
                        access,
                        probe,
                        advice: r.u64()?,
                    },
                }
            }
            SET_SITES => {
                let on = r.u32()? != 0;
                let rest = r.rest();
                if !rest.len().is_multiple_of(4) {
                    return Err(MsgError::Truncated);
                }
                Msg::SetSites {
                    on,
                    sites: SiteList(rest),
                }
            }
            ADOPT => Msg::Adopt { space: r.u32()? },
            GO => Msg::Go,
            TAKE_SIGNALS => Msg::TakeSignals,
            END => Msg::End,
            FREE => Msg::Free,
            OK => Msg::Ok,
            ERR => Msg::Err(core::str::from_utf8(r.rest()).map_err(|_| MsgError::NotUtf8)?),
            other => return Err(MsgError::UnknownTag(other)),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hello() -> Hello {
        Hello {
            version: crate::VERSION,
            pid: 42,
            tls_offset: -64,
            return_trampoline: 1,
            thread_attach: 2,
            hijack: 3,
            text_start: 4,
            text_end: 5,
            busy: 0,
            _pad: 0,
            helpers: [7; crate::HELPER_COUNT],
            on_raise: 8,
            sigaction: 9,
            step_guard: 10,
            parent: 0,
            parent_space: 0,
        }
    }

    #[test]
    fn every_message_round_trips() {
        let all = [
            Msg::Hello(hello()),
            Msg::MapShm {
                size: 1 << 30,
                space: 3,
                flags: SESSION_FOLLOW_FORK,
                pcomm: *b"app\0\0\0\0\0\0\0\0\0\0\0\0\0",
            },
            Msg::ShmMapped {
                addr: 0x7f00_0000_0000,
                generation: 9,
            },
            Msg::AllocCode {
                lo: 1,
                hi: u64::MAX,
                size: 4096,
            },
            Msg::CodeRegion {
                addr: 0x5555_0000_0000,
                size: 1 << 20,
            },
            Msg::SetProfile {
                index: 2,
                desc: ProfileDesc {
                    hz: 99,
                    probe: 4,
                    advice: 0xdead_beef,
                },
            },
            Msg::SetWatch {
                index: 3,
                desc: WatchDesc {
                    addr: 0x5555_0000_1000,
                    len: 8,
                    access: crate::WATCH_RW,
                    probe: 7,
                    advice: 0xfeed,
                },
            },
            Msg::SetSites {
                on: true,
                sites: SiteList::new(&[1, 0, 0, 0, 9, 0, 0, 0]),
            },
            Msg::Adopt { space: 5 },
            Msg::Go,
            Msg::TakeSignals,
            Msg::End,
            Msg::Free,
            Msg::Ok,
            Msg::Err("no free address space"),
        ];
        let mut buf = [0u8; MAX_MSG];
        for m in all {
            let n = m.encode(&mut buf).unwrap();
            assert_eq!(Msg::decode(&buf[..n]), Ok(m));
            // Every strict prefix of a message with fields is refused, never
            // misread.
            if n > 4 && !matches!(m, Msg::Err(_) | Msg::SetSites { .. }) {
                for k in 0..n {
                    assert!(Msg::decode(&buf[..k]).is_err(), "{m:?} cut at {k}");
                }
            }
        }
    }

    #[test]
    fn site_lists_hold_u32s() {
        let mut b = [0u8; 16];
        let n = SiteList::bytes_of(&[7, 0x0102_0304, 0], &mut b);
        let l = SiteList::new(&b[..n]);
        assert_eq!(l.len(), 3);
        assert_eq!(l.iter().collect::<std::vec::Vec<_>>(), [7, 0x0102_0304, 0]);
        // A list cut inside an index is refused.
        let mut buf = [0u8; MAX_MSG];
        let m = Msg::SetSites {
            on: false,
            sites: l,
        };
        let len = m.encode(&mut buf).unwrap();
        assert!(Msg::decode(&buf[..len - 1]).is_err());
    }

    #[test]
    fn bad_datagrams_are_refused() {
        assert_eq!(Msg::decode(&[]), Err(MsgError::Truncated));
        assert_eq!(
            Msg::decode(&99u32.to_le_bytes()),
            Err(MsgError::UnknownTag(99))
        );
        let mut err = ERR.to_le_bytes().to_vec();
        err.push(0xff);
        assert_eq!(Msg::decode(&err), Err(MsgError::NotUtf8));
        // A buffer too small to encode into.
        assert_eq!(Msg::Hello(hello()).encode(&mut [0u8; 16]), None);
    }
}
