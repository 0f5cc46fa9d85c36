//! What can be wrong with a trace, always with the byte offset where it starts.

use std::fmt;

use crate::{MAGIC, RecordError};

/// Damage found while reading a trace. Everything before `offset` was read and returned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Damage {
    /// Byte offset, from the start of the file, of the first byte that could not be used.
    pub offset: u64,
    pub kind: DamageKind,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DamageKind {
    /// The input ends inside a header or a record: the normal state of a trace whose writer was
    /// killed. Only a warning.
    Truncated { leftover: u64 },
    /// The first eight bytes are not `GGMLVIZ1`.
    BadMagic,
    /// The header names a version this reader does not implement.
    UnsupportedVersion(u32),
    /// A record's framing is impossible.
    Record(RecordError),
}

impl Damage {
    /// The damage of a record at byte `offset` that failed to decode with `err`.
    pub fn record(offset: u64, err: RecordError) -> Damage {
        Damage {
            offset,
            kind: DamageKind::Record(err),
        }
    }

    /// A truncated tail is a warning; everything else is corruption.
    pub fn is_truncation(&self) -> bool {
        matches!(self.kind, DamageKind::Truncated { .. })
    }
}

impl fmt::Display for Damage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let at = self.offset;
        match &self.kind {
            DamageKind::Truncated { leftover: 0 } if at == 0 => {
                write!(
                    f,
                    "empty: no GGMLVIZ header yet (a writer that never wrote one, or not a trace)"
                )
            }
            DamageKind::Truncated { leftover } => write!(
                f,
                "truncated at byte offset {at}: {leftover} byte(s) left over after the last complete record"
            ),
            DamageKind::BadMagic => write!(
                f,
                "not a GGMLVIZ file: byte offset 0 does not start with {:?}",
                String::from_utf8_lossy(&MAGIC)
            ),
            DamageKind::UnsupportedVersion(v) => {
                write!(
                    f,
                    "unsupported GGMLVIZ version {v} at byte offset {at} (this reader knows version 1)"
                )
            }
            DamageKind::Record(err) => write!(f, "corrupt record at byte offset {at}: {err}"),
        }
    }
}

impl std::error::Error for Damage {}

/// Checks the 12-byte header at the start of `buf`. `Ok(false)` means `buf` is a clean prefix of
/// a header (more bytes needed).
pub fn check_header(buf: &[u8]) -> Result<bool, Damage> {
    let n = buf.len().min(MAGIC.len());
    if buf[..n] != MAGIC[..n] {
        return Err(Damage {
            offset: 0,
            kind: DamageKind::BadMagic,
        });
    }
    let Some(version) = buf.get(8..12) else {
        return Ok(false);
    };
    let version = u32::from_le_bytes(version.try_into().expect("4 bytes"));
    if version != crate::VERSION {
        return Err(Damage {
            offset: 8,
            kind: DamageKind::UnsupportedVersion(version),
        });
    }
    Ok(true)
}
