//! The 12-byte header every packet starts with: magic, version, kind,
//! connection id.

use super::codec::{Reader, SliceWriter};
use super::WireError;

/// `"AT"`: lets a receiver discard stray datagrams cheaply.
pub const MAGIC: [u8; 2] = *b"AT";
/// Bumped on any incompatible change to the layout below.
pub const VERSION: u8 = 6;
/// Bytes of the header common to every packet.
pub const HEADER_LEN: usize = field::CONN_ID.end;

pub(super) mod field {
    use super::super::codec::Field;

    pub(crate) const MAGIC: Field = 0..2;
    pub(crate) const VERSION: Field = MAGIC.end..MAGIC.end + 1;
    pub(crate) const KIND: Field = VERSION.end..VERSION.end + 1;
    pub(crate) const CONN_ID: Field = KIND.end..KIND.end + 8;
}

pub(super) const KIND_DATA: u8 = 1;
pub(super) const KIND_ACK: u8 = 2;
pub(super) const KIND_HELLO: u8 = 3;
pub(super) const KIND_WELCOME: u8 = 4;
pub(super) const KIND_CLOSE: u8 = 5;
pub(super) const KIND_CLOSE_ACK: u8 = 6;
/// The header and this kind's body are the same in every protocol version,
/// so a peer can always say which version it speaks.
pub(super) const KIND_REJECT: u8 = 7;
pub(super) const KIND_FETCH: u8 = 8;
pub(super) const KIND_REPLY: u8 = 9;
/// Path validation (RFC 9000 §8.2), only inside protected datagrams.
pub(super) const KIND_PATH_CHALLENGE: u8 = 10;
pub(super) const KIND_PATH_RESPONSE: u8 = 11;
/// Address validation for plain hellos (RFC 9000 §8.1.2's Retry).
pub(super) const KIND_RETRY: u8 = 12;
/// Path-MTU probes and their acks (RFC 8899), plain and before any
/// handshake: what they test is the path, not the peer.
pub(super) const KIND_SIZE_PROBE: u8 = 13;
pub(super) const KIND_SIZE_ACK: u8 = 14;

/// Checks that `buf` holds a `len`-byte packet, writes its header, and
/// returns a writer over the packet for the fields after it.
pub(super) fn emit_header(
    buf: &mut [u8],
    len: usize,
    kind: u8,
    conn_id: u64,
) -> Result<SliceWriter<'_>, WireError> {
    if buf.len() < len {
        return Err(WireError::BufferTooSmall {
            needed: len,
            actual: buf.len(),
        });
    }
    let mut w = SliceWriter::new(&mut buf[..len]);
    w.put_at(field::MAGIC, &MAGIC);
    w.put_u8_at(field::VERSION, VERSION);
    w.put_u8_at(field::KIND, kind);
    w.put_u64_at(field::CONN_ID, conn_id);
    Ok(w)
}

/// The kind and connection id of a packet of this version (or a reject
/// of any version).
pub(super) fn decode_header(buf: &[u8]) -> Result<(u8, u64), WireError> {
    super::check_len(buf, HEADER_LEN)?;
    let r = Reader::new(buf);
    if r.at(field::MAGIC)? != MAGIC {
        return Err(WireError::BadMagic);
    }
    let (version, kind) = (r.u8_at(field::VERSION)?, r.u8_at(field::KIND)?);
    if version != VERSION && kind != KIND_REJECT {
        return Err(WireError::UnsupportedVersion(version));
    }
    Ok((kind, r.u64_at(field::CONN_ID)?))
}

/// The fixed header fields, read without validating the rest: for
/// demultiplexing by connection and for answering a foreign version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeaderPeek {
    pub version: u8,
    pub kind: u8,
    pub conn_id: u64,
}

impl HeaderPeek {
    /// `None` unless the datagram starts with atou's magic and a full header.
    pub fn read(buf: &[u8]) -> Option<HeaderPeek> {
        let r = Reader::new(buf);
        if r.at(field::MAGIC).ok()? != MAGIC {
            return None;
        }
        Some(HeaderPeek {
            version: r.u8_at(field::VERSION).ok()?,
            kind: r.u8_at(field::KIND).ok()?,
            conn_id: r.u64_at(field::CONN_ID).ok()?,
        })
    }

    pub fn is_hello(&self) -> bool {
        self.kind == KIND_HELLO
    }
}
