//! Which layout a trace uses. Our writer says so in its first record; for files from other
//! writers the layout is inferred by parsing in both and ranking the outcomes (FORMAT.md,
//! "Layout detection").

use std::cmp::Reverse;
use std::fmt;

use crate::{self as format, Layout, UNION_OFFSET};

/// How the layout of a trace was decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LayoutSource {
    /// Given by the user (`--layout`).
    Forced,
    /// Read from the writer's layout marker (the first record, a metadata extension).
    Marker,
    /// Inferred by parsing in both layouts.
    Inferred { other_parsed_cleanly: bool },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LayoutChoice {
    pub layout: Layout,
    pub source: LayoutSource,
}

impl fmt::Display for LayoutChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.source {
            LayoutSource::Forced => write!(f, "{} (forced by --layout)", self.layout),
            LayoutSource::Marker => write!(f, "{} (from the writer's layout marker)", self.layout),
            LayoutSource::Inferred {
                other_parsed_cleanly: false,
            } => {
                write!(f, "{} (inferred: only this layout parses)", self.layout)
            }
            LayoutSource::Inferred {
                other_parsed_cleanly: true,
            } => write!(
                f,
                "{} (inferred: both layouts parse; chosen by padding evidence, packed on a tie)",
                self.layout
            ),
        }
    }
}

/// The layout named by a layout marker at the start of `records` (the bytes after the header).
pub fn marker_layout(records: &[u8]) -> Option<Layout> {
    let union = records.get(UNION_OFFSET..UNION_OFFSET + 12)?;
    format::decode_extension(records[0], union).map(|ext| ext.layout)
}

/// How far a parse in one layout got.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Outcome {
    /// 2: clean to the end, 1: clean up to a truncated tail, 0: corrupt.
    class: u8,
    /// Bytes of valid records.
    valid: usize,
    /// Records whose padding or zero-fill bytes were not zero.
    padding_violations: u64,
}

fn parse_outcome(records: &[u8], layout: Layout) -> Outcome {
    let mut pos = 0;
    let mut padding_violations = 0;
    let class = loop {
        let rest = &records[pos..];
        if rest.is_empty() {
            break 2;
        }
        match format::record_len(rest, layout) {
            Ok(Some(len)) => {
                let union = &rest[UNION_OFFSET..UNION_OFFSET + layout.union_len()];
                padding_violations += u64::from(!format::padding_is_zero(rest[0], union, layout));
                pos += len;
            }
            Ok(None) => break 1,
            Err(_) => break 0,
        }
    };
    Outcome {
        class,
        valid: pos,
        padding_violations,
    }
}

/// Ranks the outcomes: clean to the end, then clean up to a truncated tail, then the longest
/// valid prefix; then fewer padding violations; packed wins what is left.
fn rank(o: &Outcome, layout: Layout) -> impl Ord {
    let corrupt_prefix = if o.class == 0 { o.valid } else { 0 };
    (
        o.class,
        corrupt_prefix,
        Reverse(o.padding_violations),
        o.valid,
        layout == Layout::Packed,
    )
}

/// Chooses the layout of a trace from its records (the bytes after the header). With `forced`,
/// that layout is used as given.
pub fn choose_layout(records: &[u8], forced: Option<Layout>) -> LayoutChoice {
    if let Some(layout) = forced {
        return LayoutChoice {
            layout,
            source: LayoutSource::Forced,
        };
    }
    if let Some(layout) = marker_layout(records) {
        return LayoutChoice {
            layout,
            source: LayoutSource::Marker,
        };
    }
    let packed = parse_outcome(records, Layout::Packed);
    let padded = parse_outcome(records, Layout::Padded);
    let (layout, other) = if rank(&padded, Layout::Padded) > rank(&packed, Layout::Packed) {
        (Layout::Padded, packed)
    } else {
        (Layout::Packed, padded)
    };
    LayoutChoice {
        layout,
        source: LayoutSource::Inferred {
            other_parsed_cleanly: other.class == 2,
        },
    }
}
