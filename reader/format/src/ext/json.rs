//! The payloads writers make most often, as JSON written directly from borrowed fields: the
//! bytes `serde_json::to_vec` makes of the owned types ([`SpanBoundary`](super::SpanBoundary),
//! [`TensorInfo`](super::TensorInfo)), at a fraction of serde's cost, and without making a
//! `String` or `Vec` of each field.

/// A [`SpanBoundary`](super::SpanBoundary)'s fields, borrowed: what a writer has in hand (the
/// entry point's name, the sequences it kept), written without making a `String` or a `Vec` of
/// them.
#[derive(Clone, Copy, Debug, Default)]
pub struct SpanBoundaryRef<'a> {
    pub name: &'a str,
    pub n_tokens: Option<u32>,
    pub seqs: &'a [(i32, u32)],
    pub other_seq_tokens: u32,
    pub removed: Option<(i32, i32, i32)>,
}

impl SpanBoundaryRef<'_> {
    /// Appends the record's payload to `out`: the bytes `serde_json::to_vec` makes of the
    /// [`SpanBoundary`](super::SpanBoundary), written directly (a writer makes two per decoded
    /// batch, and serde's path costs it ~3 times as much).
    pub fn write_json(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(b"{\"name\":");
        json_str(out, self.name);
        out.extend_from_slice(b",\"n_tokens\":");
        or_null(out, self.n_tokens, decimal);
        if !self.seqs.is_empty() {
            out.extend_from_slice(b",\"seqs\":[");
            for (i, &(seq, tokens)) in self.seqs.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                out.push(b'[');
                decimal(out, seq);
                out.push(b',');
                decimal(out, tokens);
                out.push(b']');
            }
            out.push(b']');
        }
        if self.other_seq_tokens != 0 {
            out.extend_from_slice(b",\"other_seq_tokens\":");
            decimal(out, self.other_seq_tokens);
        }
        if let Some((seq, p0, p1)) = self.removed {
            out.extend_from_slice(b",\"removed\":[");
            for (i, n) in [seq, p0, p1].into_iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                decimal(out, n);
            }
            out.push(b']');
        }
        out.push(b'}');
    }
}

/// A [`TensorInfo`](super::TensorInfo)'s fields, borrowed: what a writer has in hand when it
/// makes the record (ggml's own strings), without making a `String` of each.
#[derive(Clone, Copy, Debug)]
pub struct TensorInfoRef<'a> {
    pub name: &'a str,
    pub op: &'a str,
    pub op_type: Option<u32>,
    pub op_name: Option<&'a str>,
    pub type_name: &'a str,
    pub ne: [i64; 4],
    pub flops: Option<u64>,
    pub src_bytes: Option<u64>,
    pub kernels: Option<&'a str>,
}

impl TensorInfoRef<'_> {
    /// The record's payload: the bytes `serde_json::to_vec` makes of the
    /// [`TensorInfo`](super::TensorInfo), written directly (a writer makes one per distinct node,
    /// and serde's path costs it ~1.7 times as much).
    pub fn to_json(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(128 + self.name.len());
        out.extend_from_slice(b"{\"name\":");
        json_str(&mut out, self.name);
        out.extend_from_slice(b",\"op\":");
        json_str(&mut out, self.op);
        out.extend_from_slice(b",\"op_type\":");
        or_null(&mut out, self.op_type, decimal);
        out.extend_from_slice(b",\"op_name\":");
        or_null(&mut out, self.op_name, json_str);
        out.extend_from_slice(b",\"type\":");
        json_str(&mut out, self.type_name);
        out.extend_from_slice(b",\"ne\":[");
        for (i, n) in self.ne.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            decimal(&mut out, *n);
        }
        out.extend_from_slice(b"],\"flops\":");
        or_null(&mut out, self.flops, decimal);
        out.extend_from_slice(b",\"src_bytes\":");
        or_null(&mut out, self.src_bytes, decimal);
        out.extend_from_slice(b",\"kernels\":");
        or_null(&mut out, self.kernels, json_str);
        out.push(b'}');
        out
    }
}

/// An integer as JSON writes it (and serde_json, byte for byte): decimal, `-` before a negative.
trait Decimal: Copy {
    fn write_to(self, out: &mut Vec<u8>);
}

impl Decimal for u64 {
    fn write_to(self, out: &mut Vec<u8>) {
        // Two digits a step, from a table of "00" to "99" (as itoa does).
        const PAIRS: [u8; 200] = {
            let mut pairs = [0u8; 200];
            let mut i = 0;
            while i < 100 {
                pairs[2 * i] = b'0' + (i / 10) as u8;
                pairs[2 * i + 1] = b'0' + (i % 10) as u8;
                i += 1;
            }
            pairs
        };
        let mut digits = [0u8; 20];
        let (mut at, mut rest) = (digits.len(), self);
        while rest >= 100 {
            let pair = (rest % 100) as usize * 2;
            rest /= 100;
            at -= 2;
            digits[at..at + 2].copy_from_slice(&PAIRS[pair..pair + 2]);
        }
        if rest >= 10 {
            let pair = rest as usize * 2;
            at -= 2;
            digits[at..at + 2].copy_from_slice(&PAIRS[pair..pair + 2]);
        } else {
            at -= 1;
            digits[at] = b'0' + rest as u8;
        }
        out.extend_from_slice(&digits[at..]);
    }
}

impl Decimal for i64 {
    fn write_to(self, out: &mut Vec<u8>) {
        if self < 0 {
            out.push(b'-');
        }
        self.unsigned_abs().write_to(out);
    }
}

impl Decimal for u32 {
    fn write_to(self, out: &mut Vec<u8>) {
        u64::from(self).write_to(out);
    }
}

impl Decimal for i32 {
    fn write_to(self, out: &mut Vec<u8>) {
        i64::from(self).write_to(out);
    }
}

/// Appends `value` with `write`, or `null` where there is none.
fn or_null<T>(out: &mut Vec<u8>, value: Option<T>, write: impl FnOnce(&mut Vec<u8>, T)) {
    match value {
        Some(v) => write(out, v),
        None => out.extend_from_slice(b"null"),
    }
}

/// Appends `n` as JSON writes it.
fn decimal(out: &mut Vec<u8>, n: impl Decimal) {
    n.write_to(out);
}

/// `s` as a JSON string, escaped as serde_json escapes it: `"` and `\\`, the short forms of
/// backspace, form feed, newline, carriage return and tab, `\u00xx` for the other control
/// characters; everything else as it is.
fn json_str(out: &mut Vec<u8>, s: &str) {
    out.push(b'"');
    let bytes = s.as_bytes();
    // Names seldom need escaping: a scan without branches per byte finds that out first.
    if !bytes.iter().fold(false, |any, &b| {
        any | (b < 0x20) | (b == b'"') | (b == b'\\')
    }) {
        out.extend_from_slice(bytes);
        out.push(b'"');
        return;
    }
    let mut plain = 0;
    for (i, &b) in bytes.iter().enumerate() {
        let short = match b {
            b'"' => b'"',
            b'\\' => b'\\',
            0x08 => b'b',
            0x0c => b'f',
            b'\n' => b'n',
            b'\r' => b'r',
            b'\t' => b't',
            0..=0x1f => 0,
            _ => continue,
        };
        out.extend_from_slice(&bytes[plain..i]);
        plain = i + 1;
        if short != 0 {
            out.extend_from_slice(&[b'\\', short]);
        } else {
            const HEX: &[u8; 16] = b"0123456789abcdef";
            out.extend_from_slice(b"\\u00");
            out.extend_from_slice(&[HEX[usize::from(b >> 4)], HEX[usize::from(b & 15)]]);
        }
    }
    out.extend_from_slice(&bytes[plain..]);
    out.push(b'"');
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Integers come out as Rust's own `Display` writes them, at every digit count's edges.
    #[test]
    fn integers_are_written_as_display_writes_them() {
        let mut edges: Vec<u64> = vec![0, u64::MAX];
        for digits in 1..20 {
            let p = 10u64.pow(digits);
            edges.extend([p - 1, p, p + 1]);
        }
        for n in edges {
            let mut out = Vec::new();
            decimal(&mut out, n);
            assert_eq!(String::from_utf8(out).unwrap(), n.to_string());
        }
        for n in [i64::MIN, -1, -10, i64::MAX] {
            let mut out = Vec::new();
            decimal(&mut out, n);
            assert_eq!(String::from_utf8(out).unwrap(), n.to_string());
        }
    }
}
