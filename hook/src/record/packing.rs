//! What a [`RawEvent`]'s untyped fields carry where an event packs more than its record's union:
//! a span's sequences, an RPC edge's part, a device event's clock and lane. Both directions in one place: the event builders
//! (`events`) pack with it, the writer unpacks.

use ggml_viz_format::ext::RpcPart;

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
}
