//! The one byte codec under every format atou puts on the wire: packets
//! (this module's parent), session messages, the manifest and the
//! handshake. All integers are big-endian.
//!
//! [`Reader`] is a cursor over `&[u8]` that checks every length against
//! the bytes present before it reads, so no input can make it panic; it
//! also reads a fixed field by its [`Field`] range without moving. Each
//! format maps [`Truncated`] into its own error. [`Writer`] appends to a
//! `Vec<u8>` or fills a slice ([`SliceWriter`]) whose length the caller
//! has checked.

use std::ops::Range;

/// Where a fixed field lies in its packet, as smoltcp's `mod field` names
/// them: once, for both encode and decode.
pub type Field = Range<usize>;

/// A read past the end of the input: `needed` bytes from its start, of
/// which `actual` are present.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Truncated {
    pub needed: usize,
    pub actual: usize,
}

/// Reads big-endian fields in order, each checked against what is left.
#[derive(Debug, Clone)]
pub struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    pub fn new(buf: &'a [u8]) -> Reader<'a> {
        Reader { buf, pos: 0 }
    }

    /// The next `n` bytes.
    pub fn bytes(&mut self, n: usize) -> Result<&'a [u8], Truncated> {
        let Some(bytes) = self.buf[self.pos..].get(..n) else {
            return Err(Truncated {
                needed: self.pos.saturating_add(n),
                actual: self.buf.len(),
            });
        };
        self.pos += n;
        Ok(bytes)
    }

    pub fn array<const N: usize>(&mut self) -> Result<[u8; N], Truncated> {
        let mut a = [0; N];
        a.copy_from_slice(self.bytes(N)?);
        Ok(a)
    }

    pub fn u8(&mut self) -> Result<u8, Truncated> {
        let [b] = self.array()?;
        Ok(b)
    }

    pub fn u16(&mut self) -> Result<u16, Truncated> {
        self.array().map(u16::from_be_bytes)
    }

    pub fn u32(&mut self) -> Result<u32, Truncated> {
        self.array().map(u32::from_be_bytes)
    }

    pub fn u64(&mut self) -> Result<u64, Truncated> {
        self.array().map(u64::from_be_bytes)
    }

    pub fn i64(&mut self) -> Result<i64, Truncated> {
        self.array().map(i64::from_be_bytes)
    }

    /// Everything not read yet; the reader is then at the end.
    pub fn rest(&mut self) -> &'a [u8] {
        let rest = &self.buf[self.pos..];
        self.pos = self.buf.len();
        rest
    }

    /// Bytes not read yet.
    pub fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    /// The bytes of a fixed field, wherever the cursor is; it does not move.
    pub fn at(&self, field: Field) -> Result<&'a [u8], Truncated> {
        let actual = self.buf.len();
        let needed = field.end;
        self.buf.get(field).ok_or(Truncated { needed, actual })
    }

    pub fn u8_at(&self, field: Field) -> Result<u8, Truncated> {
        Ok(self.array_at::<1>(field)?[0])
    }

    pub fn u16_at(&self, field: Field) -> Result<u16, Truncated> {
        self.array_at(field).map(u16::from_be_bytes)
    }

    pub fn u32_at(&self, field: Field) -> Result<u32, Truncated> {
        self.array_at(field).map(u32::from_be_bytes)
    }

    pub fn u64_at(&self, field: Field) -> Result<u64, Truncated> {
        self.array_at(field).map(u64::from_be_bytes)
    }

    pub fn array_at<const N: usize>(&self, field: Field) -> Result<[u8; N], Truncated> {
        debug_assert_eq!(field.len(), N, "a field read as the wrong width");
        let mut a = [0; N];
        a.copy_from_slice(self.at(field.start..field.start + N)?);
        Ok(a)
    }
}

/// Writes big-endian fields in order.
pub trait Writer {
    fn put_slice(&mut self, bytes: &[u8]);

    fn put_u8(&mut self, v: u8) {
        self.put_slice(&[v]);
    }

    fn put_u16(&mut self, v: u16) {
        self.put_slice(&v.to_be_bytes());
    }

    fn put_u32(&mut self, v: u32) {
        self.put_slice(&v.to_be_bytes());
    }

    fn put_u64(&mut self, v: u64) {
        self.put_slice(&v.to_be_bytes());
    }

    fn put_i64(&mut self, v: i64) {
        self.put_slice(&v.to_be_bytes());
    }
}

impl Writer for Vec<u8> {
    fn put_slice(&mut self, bytes: &[u8]) {
        self.extend_from_slice(bytes);
    }
}

/// Fills a slice in order, or a fixed field by its [`Field`] range. The
/// caller checks the slice's length first (a packet's `emit` refuses a
/// buffer that is too small), so a write past its end is a bug, and panics.
#[derive(Debug)]
pub struct SliceWriter<'a> {
    buf: &'a mut [u8],
    pos: usize,
}

impl<'a> SliceWriter<'a> {
    pub fn new(buf: &'a mut [u8]) -> SliceWriter<'a> {
        SliceWriter { buf, pos: 0 }
    }

    /// Bytes written in order so far.
    pub fn position(&self) -> usize {
        self.pos
    }

    /// A writer over one fixed field of this one: a structure nested in a
    /// packet, written by its own field offsets.
    pub fn field(&mut self, field: Field) -> SliceWriter<'_> {
        SliceWriter::new(&mut self.buf[field])
    }

    /// Writes a fixed field; the cursor does not move.
    pub fn put_at(&mut self, field: Field, bytes: &[u8]) {
        self.buf[field].copy_from_slice(bytes);
    }

    pub fn put_u8_at(&mut self, field: Field, v: u8) {
        self.put_at(field, &[v]);
    }

    pub fn put_u16_at(&mut self, field: Field, v: u16) {
        self.put_at(field, &v.to_be_bytes());
    }

    pub fn put_u32_at(&mut self, field: Field, v: u32) {
        self.put_at(field, &v.to_be_bytes());
    }

    pub fn put_u64_at(&mut self, field: Field, v: u64) {
        self.put_at(field, &v.to_be_bytes());
    }
}

impl Writer for SliceWriter<'_> {
    fn put_slice(&mut self, bytes: &[u8]) {
        let end = self.pos + bytes.len();
        self.buf[self.pos..end].copy_from_slice(bytes);
        self.pos = end;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One field of each width, then a tail: 1 + 2 + 4 + 8 + 8 + 3 bytes.
    const SAMPLE: [u8; 26] = [
        0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, 0x09, 0x0a, 0x0b, 0x0c, 0x0d, 0x0e, 0x0f,
        0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xfe, b'x', b'y', b'z',
    ];

    /// Each field of [`SAMPLE`], as read in order.
    type Fields<'a> = (u8, u16, u32, u64, i64, &'a [u8]);

    fn read_sample(buf: &[u8]) -> Result<Fields<'_>, Truncated> {
        let mut r = Reader::new(buf);
        Ok((r.u8()?, r.u16()?, r.u32()?, r.u64()?, r.i64()?, r.bytes(3)?))
    }

    #[test]
    fn integers_are_read_big_endian_in_order() {
        let (a, b, c, d, e, tail) = read_sample(&SAMPLE).unwrap();
        assert_eq!(a, 0x01);
        assert_eq!(b, 0x0203);
        assert_eq!(c, 0x0405_0607);
        assert_eq!(d, 0x0809_0a0b_0c0d_0e0f);
        assert_eq!(e, -2);
        assert_eq!(tail, b"xyz");
    }

    #[test]
    fn every_truncation_is_refused_with_what_was_needed() {
        // The field each cut falls in ends at one of these offsets.
        let ends = [1, 3, 7, 15, 23, 26];
        for cut in 0..SAMPLE.len() {
            let needed = *ends.iter().find(|&&end| end > cut).unwrap();
            assert_eq!(
                read_sample(&SAMPLE[..cut]),
                Err(Truncated {
                    needed,
                    actual: cut
                }),
                "cut at {cut}"
            );
        }
    }

    #[test]
    fn a_failed_read_moves_nothing() {
        let mut r = Reader::new(&SAMPLE[..5]);
        assert_eq!(r.u16(), Ok(0x0102));
        assert!(r.u32().is_err());
        assert_eq!(r.remaining(), 3);
        assert_eq!(r.bytes(usize::MAX).map(<[u8]>::len).ok(), None);
        assert_eq!(r.rest(), &SAMPLE[2..5]);
        assert_eq!(r.remaining(), 0);
        assert_eq!(r.rest(), b"");
        assert_eq!(
            r.u8(),
            Err(Truncated {
                needed: 6,
                actual: 5
            })
        );
    }

    #[test]
    fn fields_are_read_where_they_lie_without_moving() {
        let r = Reader::new(&SAMPLE);
        assert_eq!(r.u8_at(2..3), Ok(0x03));
        assert_eq!(r.u16_at(1..3), Ok(0x0203));
        assert_eq!(r.u32_at(3..7), Ok(0x0405_0607));
        assert_eq!(r.u64_at(7..15), Ok(0x0809_0a0b_0c0d_0e0f));
        assert_eq!(r.at(23..26), Ok(&b"xyz"[..]));
        assert_eq!(
            r.at(24..27),
            Err(Truncated {
                needed: 27,
                actual: 26
            })
        );
        assert_eq!(r.remaining(), SAMPLE.len());
    }

    #[test]
    fn both_writers_lay_out_what_the_reader_reads() {
        let write = |w: &mut dyn Writer| {
            w.put_u8(0x01);
            w.put_u16(0x0203);
            w.put_u32(0x0405_0607);
            w.put_u64(0x0809_0a0b_0c0d_0e0f);
            w.put_i64(-2);
            w.put_slice(b"xyz");
        };
        let mut vec = Vec::new();
        write(&mut vec);
        assert_eq!(vec, SAMPLE);
        let mut buf = [0u8; SAMPLE.len()];
        let mut w = SliceWriter::new(&mut buf);
        write(&mut w);
        assert_eq!(w.position(), SAMPLE.len());
        assert_eq!(buf, SAMPLE);
    }

    #[test]
    fn fields_are_written_where_they_lie() {
        let mut buf = [0u8; 15];
        let mut w = SliceWriter::new(&mut buf);
        w.put_u64_at(7..15, 0x0809_0a0b_0c0d_0e0f);
        w.put_u32_at(3..7, 0x0405_0607);
        w.put_u16_at(1..3, 0x0203);
        w.put_u8_at(0..1, 0x01);
        assert_eq!(w.position(), 0);
        assert_eq!(buf, SAMPLE[..15]);
        let mut nested = [0u8; 6];
        SliceWriter::new(&mut nested)
            .field(2..6)
            .put_u16_at(1..3, 0x0102);
        assert_eq!(nested, [0, 0, 0, 1, 2, 0]);
    }
}
