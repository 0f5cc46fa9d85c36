//! What a [`RawEvent`]'s untyped fields carry where an event packs more than its record's union:
//! a span's sequences, an RPC edge's part, a device event's clock and lane, what a buffer holds. Both directions in one place: the event builders
//! (`events`) pack with it, the writer unpacks.

use ggml_viz_format::EXTENSION_TYPE_CODE;
use ggml_viz_format::ext::{self, RpcPart};

use crate::base::entry::Entry;
use crate::base::ring::RawEvent;

/// Sequences a span event names with their tokens (the rest are counted together).
pub const SPAN_SEQS: usize = 6;

/// Up to [`SPAN_SEQS`] (sequence id, tokens) pairs, two to a word: the span event's `a`, `d`
/// and `size`. Each pair is the sequence id + 1 (0: no pair) and the tokens, 16 bits each.
pub fn span_words(seqs: &[(i32, u32)]) -> [u64; 3] {
    let mut words = [0u64; 3];
    for (i, &(seq, tokens)) in seqs.iter().take(SPAN_SEQS).enumerate() {
        let pair = (u64::from((seq.clamp(0, 0xfffe) + 1) as u16) << 16)
            | u64::from(tokens.min(0xffff) as u16);
        words[i / 2] |= pair << (32 * (i % 2));
    }
    words
}

/// The (sequence id, tokens) pairs [`span_words`] packed into `event`.
pub fn span_seqs(event: &RawEvent) -> Vec<(i32, u32)> {
    [event.a, event.d, event.size]
        .iter()
        .flat_map(|w| [w & 0xffff_ffff, w >> 32])
        .filter(|pair| pair >> 16 != 0)
        .map(|pair| (((pair >> 16) - 1) as i32, (pair & 0xffff) as u32))
        .collect()
}

/// The `entry` of a device event (`device`): its `ticks` are `CLOCK_MONOTONIC` nanoseconds (the
/// device's time, calibrated), not the thread's ticks; its lane's thread id is in `size`.
pub const DEVICE_ENTRY: u8 = 0xD0;

/// `entry` of an RPC event: this plus the part's number.
const RPC_ENTRY: u8 = 0xE0;

/// The `entry` of an RPC event of `part`.
pub fn rpc_entry(part: RpcPart) -> u8 {
    RPC_ENTRY
        + match part {
            RpcPart::Request => 0,
            RpcPart::Answer => 1,
            RpcPart::Serve => 2,
        }
}

/// The part an RPC event's `entry` names, if it is one.
pub fn rpc_part(entry: u8) -> Option<RpcPart> {
    match entry.checked_sub(RPC_ENTRY)? {
        0 => Some(RpcPart::Request),
        1 => Some(RpcPart::Answer),
        2 => Some(RpcPart::Serve),
        _ => None,
    }
}

/// What the program told ggml a backend buffer holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BufferUse<'a> {
    /// `ggml_backend_buffer_set_usage`'s `enum ggml_backend_buffer_usage`.
    Usage(u32),
    /// The name of the first tensor `ggml_backend_alloc_ctx_tensors_from_buft` put in it.
    FirstTensor(&'a [u8]),
}

/// The event saying that `buffer` holds `what`: entry `ggml_backend_buffer_set_usage` with the
/// usage in `b`, or entry `ggml_backend_alloc_ctx_tensors_from_buft` with the first
/// [`ext::BufferUse::FIRST_TENSOR_BYTES`] bytes of the name in `d` and `size` (NUL-padded).
pub fn buffer_use_event(buffer: u64, what: BufferUse<'_>) -> RawEvent {
    let mut event = RawEvent {
        type_code: EXTENSION_TYPE_CODE,
        a: buffer,
        ..RawEvent::default()
    };
    match what {
        BufferUse::Usage(usage) => {
            event.entry = Entry::BufferSetUsage as u8;
            event.b = usage;
        }
        BufferUse::FirstTensor(name) => {
            event.entry = Entry::AllocCtxTensors as u8;
            let mut bytes = [0u8; ext::BufferUse::FIRST_TENSOR_BYTES];
            let n = name.len().min(bytes.len());
            bytes[..n].copy_from_slice(&name[..n]);
            let (low, high) = bytes.split_at(8);
            event.d = u64::from_le_bytes(low.try_into().unwrap_or_default());
            event.size = u64::from_le_bytes(high.try_into().unwrap_or_default());
        }
    }
    event
}

/// The record payload of a [`buffer_use_event`]; `None` for any other event.
pub fn buffer_use(event: &RawEvent) -> Option<ext::BufferUse> {
    if event.type_code != EXTENSION_TYPE_CODE {
        return None;
    }
    let mut out = ext::BufferUse {
        buffer: event.a,
        ..ext::BufferUse::default()
    };
    match Entry::from_code(event.entry)? {
        Entry::BufferSetUsage => out.usage = Some(ext::BufferUse::usage_name(event.b)),
        Entry::AllocCtxTensors => {
            let mut bytes = [0u8; ext::BufferUse::FIRST_TENSOR_BYTES];
            bytes[..8].copy_from_slice(&event.d.to_le_bytes());
            bytes[8..].copy_from_slice(&event.size.to_le_bytes());
            let len = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
            out.first_tensor = Some(String::from_utf8_lossy(&bytes[..len]).into_owned());
        }
        _ => return None,
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn span_sequences_and_rpc_parts_unpack_as_packed() {
        let seqs = [(0, 5), (3, 1), (7, 65535)];
        let words = span_words(&seqs);
        let event = RawEvent {
            a: words[0],
            d: words[1],
            size: words[2],
            ..RawEvent::ZERO
        };
        assert_eq!(span_seqs(&event), seqs);
        for part in [RpcPart::Request, RpcPart::Answer, RpcPart::Serve] {
            assert_eq!(rpc_part(rpc_entry(part)), Some(part));
        }
        assert_eq!(rpc_part(0), None);
    }

    #[test]
    fn what_a_buffer_holds_comes_back_as_it_went() {
        let usage = buffer_use(&buffer_use_event(0x10, BufferUse::Usage(1)));
        assert_eq!(
            usage.map(|u| (u.buffer, u.usage, u.first_tensor)),
            Some((0x10, Some("weights".into()), None))
        );
        let kv = buffer_use(&buffer_use_event(
            0x20,
            BufferUse::FirstTensor(b"cache_k_l0"),
        ));
        assert_eq!(
            kv.and_then(|u| u.first_tensor).as_deref(),
            Some("cache_k_l0")
        );
        // A long name keeps its first 16 bytes.
        let long = buffer_use(&buffer_use_event(
            0x30,
            BufferUse::FirstTensor(b"blk.10.attn_norm.weight"),
        ));
        assert_eq!(
            long.and_then(|u| u.first_tensor).as_deref(),
            Some("blk.10.attn_norm")
        );
        let span = RawEvent {
            type_code: EXTENSION_TYPE_CODE,
            entry: Entry::LlamaDecode as u8,
            ..RawEvent::default()
        };
        assert_eq!(buffer_use(&span), None);
    }
}
