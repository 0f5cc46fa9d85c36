//! The kinds of raw events the writer turns into extension records (FORMAT.md): what a buffer
//! holds, application spans, `llama_memory_seq_rm`, ggml-rpc command parts.

use ggml_viz_format::ext::{self, RpcPart};

use super::{Kind, slot};
use crate::base::entry::Entry;
use crate::base::ring::RawEvent;

/// What the program told ggml a backend buffer holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BufferUse<'a> {
    /// `ggml_backend_buffer_set_usage`'s `enum ggml_backend_buffer_usage`.
    Usage(u32),
    /// The name of the first tensor `ggml_backend_alloc_ctx_tensors_from_buft` put in it.
    FirstTensor(&'a [u8]),
}

/// What `buffer` holds: its usage, or the first [`ext::BufferUse::FIRST_TENSOR_BYTES`] bytes of
/// its first tensor's name (NUL-padded).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BufferHeld<'a> {
    pub buffer: u64,
    pub what: BufferUse<'a>,
}

impl BufferHeld<'_> {
    pub fn event(&self) -> RawEvent {
        let mut event = RawEvent {
            words: [self.buffer, 0, 0],
            ..slot(Kind::BufferUse)
        };
        match self.what {
            BufferUse::Usage(usage) => event.halves[0] = usage,
            BufferUse::FirstTensor(name) => {
                let mut bytes = [0u8; ext::BufferUse::FIRST_TENSOR_BYTES];
                let n = name.len().min(bytes.len());
                bytes[..n].copy_from_slice(&name[..n]);
                let (low, high) = bytes.split_at(8);
                event.tag = 1;
                event.words[1] = u64::from_le_bytes(low.try_into().unwrap_or_default());
                event.words[2] = u64::from_le_bytes(high.try_into().unwrap_or_default());
            }
        }
        event
    }

    /// The record payload of a [`Kind::BufferUse`] slot.
    pub fn of(e: &RawEvent) -> ext::BufferUse {
        let mut out = ext::BufferUse {
            buffer: e.words[0],
            ..ext::BufferUse::default()
        };
        if e.tag == 0 {
            out.usage = Some(ext::BufferUse::usage_name(e.halves[0]));
        } else {
            let mut bytes = [0u8; ext::BufferUse::FIRST_TENSOR_BYTES];
            bytes[..8].copy_from_slice(&e.words[1].to_le_bytes());
            bytes[8..].copy_from_slice(&e.words[2].to_le_bytes());
            let len = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
            out.first_tensor = Some(String::from_utf8_lossy(&bytes[..len]).into_owned());
        }
        out
    }
}

/// Sequences a span event names with their tokens (the rest are counted together).
pub const SPAN_SEQS: usize = 6;

/// An application span's begin or end (`llama_decode`, `llama_encode`), made by the wrapper of
/// `entry`: its tokens (`u32::MAX`: unknown), up to [`SPAN_SEQS`] (sequence id, tokens) pairs,
/// and the tokens of the sequences beyond them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SpanEdge {
    pub begin: bool,
    pub entry: u8,
    pub n_tokens: u32,
    /// The pairs, two to a word: each the sequence id + 1 (0: no pair) and the tokens, 16 bits
    /// each.
    seq_words: [u64; 3],
    pub other_tokens: u16,
}

impl SpanEdge {
    pub fn new(
        begin: bool,
        entry: Entry,
        n_tokens: u32,
        seqs: &[(i32, u32)],
        other_tokens: u32,
    ) -> SpanEdge {
        let mut seq_words = [0u64; 3];
        for (i, &(seq, tokens)) in seqs.iter().take(SPAN_SEQS).enumerate() {
            let pair = (u64::from((seq.clamp(0, 0xfffe) + 1) as u16) << 16)
                | u64::from(tokens.min(0xffff) as u16);
            seq_words[i / 2] |= pair << (32 * (i % 2));
        }
        SpanEdge {
            begin,
            entry: entry as u8,
            n_tokens,
            seq_words,
            other_tokens: other_tokens.min(u32::from(u16::MAX)) as u16,
        }
    }

    /// The (sequence id, tokens) pairs, as [`SpanEdge::new`] was given them (at most
    /// [`SPAN_SEQS`], each clamped to 16 bits), in `into`.
    pub fn seqs<'a>(&self, into: &'a mut [(i32, u32); SPAN_SEQS]) -> &'a [(i32, u32)] {
        let pairs = self
            .seq_words
            .iter()
            .flat_map(|w| [w & 0xffff_ffff, w >> 32])
            .filter(|pair| pair >> 16 != 0);
        let mut n = 0;
        for (slot, pair) in into.iter_mut().zip(pairs) {
            *slot = (((pair >> 16) - 1) as i32, (pair & 0xffff) as u32);
            n += 1;
        }
        &into[..n]
    }

    pub fn event(&self) -> RawEvent {
        RawEvent {
            words: self.seq_words,
            halves: [self.n_tokens, 0],
            tag: self.entry,
            short: self.other_tokens,
            ..slot(Kind::edge(self.begin, Kind::SpanBegin, Kind::SpanEnd))
        }
    }

    pub fn of(e: &RawEvent) -> SpanEdge {
        SpanEdge {
            begin: e.kind == Kind::SpanBegin as u8,
            entry: e.tag,
            n_tokens: e.halves[0],
            seq_words: e.words,
            other_tokens: e.short,
        }
    }
}

/// `llama_memory_seq_rm(seq, p0, p1)` begins or ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SeqRemoved {
    pub begin: bool,
    pub seq: i32,
    pub p0: i32,
    pub p1: i32,
}

impl SeqRemoved {
    pub fn event(&self) -> RawEvent {
        RawEvent {
            words: [self.seq, self.p0, self.p1].map(|v| u64::from(v as u32)),
            ..slot(Kind::edge(self.begin, Kind::SeqRmBegin, Kind::SeqRmEnd))
        }
    }

    pub fn of(e: &RawEvent) -> SeqRemoved {
        let [seq, p0, p1] = e.words.map(|w| w as u32 as i32);
        SeqRemoved {
            begin: e.kind == Kind::SeqRmBegin as u8,
            seq,
            p0,
            p1,
        }
    }
}

/// A part of a ggml-rpc command begins or ends: command `command`, the `index`th on its
/// `connection`; at its end, the bytes `sent` and `received`; `endpoint_id` the peer's interned
/// address (0: none).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RpcEdge {
    pub begin: bool,
    pub part: RpcPart,
    pub command: u8,
    pub connection: u32,
    pub index: u32,
    pub sent: u64,
    pub received: u64,
    pub endpoint_id: u16,
}

impl RpcEdge {
    const PARTS: [RpcPart; 3] = [RpcPart::Request, RpcPart::Answer, RpcPart::Serve];

    pub fn event(&self) -> RawEvent {
        let part = Self::PARTS.iter().position(|&p| p == self.part);
        RawEvent {
            words: [
                (u64::from(self.connection) << 32) | u64::from(self.index),
                self.sent,
                self.received,
            ],
            halves: [u32::from(self.command), 0],
            tag: part.unwrap_or_default() as u8,
            short: self.endpoint_id,
            ..slot(Kind::edge(self.begin, Kind::RpcBegin, Kind::RpcEnd))
        }
    }

    pub fn of(e: &RawEvent) -> RpcEdge {
        RpcEdge {
            begin: e.kind == Kind::RpcBegin as u8,
            part: Self::PARTS[usize::from(e.tag) % Self::PARTS.len()],
            command: e.halves[0] as u8,
            connection: (e.words[0] >> 32) as u32,
            index: e.words[0] as u32,
            sent: e.words[1],
            received: e.words[2],
            endpoint_id: e.short,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn span_sequences_come_back_as_given() {
        let seqs = [(0, 5), (3, 1), (7, 65535)];
        let edge = SpanEdge::new(true, Entry::LlamaDecode, 42, &seqs, 70_000);
        let back = SpanEdge::of(&edge.event());
        assert_eq!(back, edge);
        assert_eq!(back.seqs(&mut [(0, 0); SPAN_SEQS]), seqs);
        assert_eq!((back.n_tokens, back.other_tokens), (42, u16::MAX));
        // More pairs than a slot holds: the first SPAN_SEQS.
        let many: Vec<(i32, u32)> = (0..9).map(|s| (s, 1)).collect();
        let kept = SpanEdge::new(false, Entry::LlamaDecode, 9, &many, 0);
        assert_eq!(kept.seqs(&mut [(0, 0); SPAN_SEQS]), &many[..SPAN_SEQS]);
    }

    #[test]
    fn what_a_buffer_holds_comes_back_as_it_went() {
        let held = |what| BufferHeld::of(&BufferHeld { buffer: 0x10, what }.event());
        let usage = held(BufferUse::Usage(1));
        assert_eq!(
            (usage.buffer, usage.usage, usage.first_tensor),
            (0x10, Some("weights".into()), None)
        );
        let kv = held(BufferUse::FirstTensor(b"cache_k_l0"));
        assert_eq!(kv.first_tensor.as_deref(), Some("cache_k_l0"));
        assert_eq!(kv.usage, None);
        // A long name keeps its first 16 bytes.
        let long = held(BufferUse::FirstTensor(b"blk.10.attn_norm.weight"));
        assert_eq!(long.first_tensor.as_deref(), Some("blk.10.attn_norm"));
    }
}
