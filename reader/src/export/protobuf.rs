//! The few protobuf wire-format primitives the Perfetto writer needs: varints, tags, and
//! length-delimited fields built into a reusable buffer. Messages are encoded by hand, field by
//! field (numbers from Perfetto's own `.proto` files, checked by the tests against the
//! generated `perfetto_trace_pb2`).

/// Wire types.
const VARINT: u64 = 0;
const FIXED64: u64 = 1;
const LEN: u64 = 2;

/// An encoded message.
#[derive(Default)]
pub struct Message {
    pub bytes: Vec<u8>,
}

#[inline(always)]
fn varint(out: &mut Vec<u8>, mut v: u64) {
    if v < 0x80 {
        // Most tags and small values: one byte.
        out.push(v as u8);
        return;
    }
    let mut bytes = [0u8; 10];
    let mut n = 0;
    while v >= 0x80 {
        bytes[n] = (v as u8) | 0x80;
        v >>= 7;
        n += 1;
    }
    bytes[n] = v as u8;
    out.extend_from_slice(&bytes[..=n]);
}

impl Message {
    #[inline(always)]
    fn tag(&mut self, field: u32, wire: u64) {
        varint(&mut self.bytes, (u64::from(field) << 3) | wire);
    }

    /// `uint32`, `uint64`, `bool` and enum fields.
    #[inline(always)]
    pub fn uint(&mut self, field: u32, v: u64) -> &mut Self {
        self.tag(field, VARINT);
        varint(&mut self.bytes, v);
        self
    }

    /// `int32` and `int64` fields (two's complement, as protobuf encodes them).
    pub fn int(&mut self, field: u32, v: i64) -> &mut Self {
        self.uint(field, v as u64)
    }

    pub fn double(&mut self, field: u32, v: f64) -> &mut Self {
        self.fixed64(field, v.to_bits())
    }

    /// `fixed64` fields.
    pub fn fixed64(&mut self, field: u32, v: u64) -> &mut Self {
        self.tag(field, FIXED64);
        self.bytes.extend_from_slice(&v.to_le_bytes());
        self
    }

    pub fn string(&mut self, field: u32, s: &str) -> &mut Self {
        self.bytes_field(field, s.as_bytes())
    }

    /// `bytes` fields.
    pub fn bytes(&mut self, field: u32, b: &[u8]) -> &mut Self {
        self.bytes_field(field, b)
    }

    #[cfg(test)]
    pub fn message(&mut self, field: u32, m: &Message) -> &mut Self {
        self.bytes_field(field, &m.bytes)
    }

    /// Writes this message to `out` as field `field` of an enclosing message (a `Trace`'s
    /// packets), without copying it into one.
    pub fn write_as_field(&self, field: u32, out: &mut impl std::io::Write) -> std::io::Result<()> {
        let mut header = [0u8; 20];
        let mut at = 0;
        for v in [(u64::from(field) << 3) | LEN, self.bytes.len() as u64] {
            let mut v = v;
            while v >= 0x80 {
                header[at] = (v as u8) | 0x80;
                v >>= 7;
                at += 1;
            }
            header[at] = v as u8;
            at += 1;
        }
        out.write_all(&header[..at])?;
        out.write_all(&self.bytes)
    }

    /// Fields already encoded, appended as they are.
    pub fn encoded(&mut self, fields: &[u8]) -> &mut Self {
        self.bytes.extend_from_slice(fields);
        self
    }

    /// Empties the message, keeping its buffer.
    pub fn clear(&mut self) {
        self.bytes.clear();
    }

    fn bytes_field(&mut self, field: u32, b: &[u8]) -> &mut Self {
        self.tag(field, LEN);
        varint(&mut self.bytes, b.len() as u64);
        self.bytes.extend_from_slice(b);
        self
    }

    /// A message built by `build`, as field `field` of this one: built in place after a
    /// one-byte length (most are shorter than 128 bytes), which grows if it must.
    #[inline(always)]
    pub fn nested(&mut self, field: u32, build: impl FnOnce(&mut Message)) -> &mut Self {
        self.tag(field, LEN);
        let at = self.bytes.len();
        self.bytes.push(0);
        build(self);
        let len = self.bytes.len() - at - 1;
        if len < 0x80 {
            self.bytes[at] = len as u8;
        } else {
            let mut prefix = Vec::with_capacity(10);
            varint(&mut prefix, len as u64);
            self.bytes.splice(at..at + 1, prefix);
        }
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_encode_as_the_protobuf_documentation_shows() {
        // The encoding guide's examples: field 1 = 150 is 08 96 01; field 2 = "testing".
        let mut m = Message::default();
        m.uint(1, 150).string(2, "testing");
        assert_eq!(
            m.bytes,
            [
                0x08, 0x96, 0x01, 0x12, 0x07, b't', b'e', b's', b't', b'i', b'n', b'g'
            ]
        );
        let mut n = Message::default();
        n.int(1, -2);
        assert_eq!(n.bytes.len(), 1 + 10, "negative ints take ten bytes");
        let mut written = Vec::new();
        m.write_as_field(1, &mut written).unwrap();
        let mut nested = Message::default();
        nested.message(1, &m);
        assert_eq!(written, nested.bytes, "the same bytes as a nested message");
        // Nested in place, shorter and longer than one length byte holds.
        for len in [3, 127, 128, 300] {
            let body = "x".repeat(len);
            let mut in_place = Message::default();
            in_place.uint(1, 7).nested(2, |m| {
                m.string(3, &body);
            });
            let mut inner = Message::default();
            inner.string(3, &body);
            let mut copied = Message::default();
            copied.uint(1, 7).message(2, &inner);
            assert_eq!(in_place.bytes, copied.bytes, "{len}");
        }
        let mut d = Message::default();
        d.double(5, 1.0);
        assert_eq!(d.bytes[0], (5 << 3) | 1);
        assert_eq!(&d.bytes[1..], 1.0f64.to_le_bytes());
    }
}
