//! Reading a whole trace held in memory: a mapped file ([`TraceFile`]) or any byte slice.

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};

use memmap2::Mmap;

use crate::format::{self, Event, HEADER_LEN, Layout};
use crate::format::{Damage, DamageKind, check_header};
use crate::format::{LayoutChoice, choose_layout};

/// The damage of the header at the start of `file`, if any.
pub(crate) fn header_damage(file: &[u8]) -> Option<Damage> {
    match check_header(file) {
        Ok(true) => None,
        Ok(false) => Some(Damage {
            offset: 0,
            kind: DamageKind::Truncated {
                leftover: file.len() as u64,
            },
        }),
        Err(damage) => Some(damage),
    }
}

/// Iterates over the events of a trace in a byte slice: `Ok` events in file order, then at most
/// one `Err` with the damage that stopped it. Labels borrow from the slice.
#[derive(Clone, Debug)]
pub struct Events<'a> {
    buf: &'a [u8],
    pos: usize,
    layout: Layout,
    /// Damage to report next, after which iteration ends.
    stop: Option<Damage>,
    done: bool,
}

impl<'a> Events<'a> {
    /// Starts at the first record of `file` (the whole trace, header included).
    pub fn new(file: &'a [u8], layout: Layout) -> Events<'a> {
        let stop = header_damage(file);
        let pos = if stop.is_some() {
            file.len()
        } else {
            HEADER_LEN
        };
        Events {
            buf: file,
            pos,
            layout,
            stop,
            done: false,
        }
    }

    /// Byte offset of the next record.
    pub fn offset(&self) -> u64 {
        self.pos as u64
    }
}

impl<'a> Iterator for Events<'a> {
    type Item = Result<Event<'a>, Damage>;

    #[inline]
    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        if let Some(damage) = self.stop.take() {
            self.done = true;
            return Some(Err(damage));
        }
        let rest = &self.buf[self.pos..];
        if rest.is_empty() {
            self.done = true;
            return None;
        }
        match format::decode_record(rest, self.layout) {
            Ok(Some((event, len))) => {
                self.pos += len;
                Some(Ok(event))
            }
            Ok(None) => {
                self.done = true;
                let leftover = rest.len() as u64;
                Some(Err(Damage {
                    offset: self.pos as u64,
                    kind: DamageKind::Truncated { leftover },
                }))
            }
            Err(err) => {
                self.done = true;
                Some(Err(Damage::record(self.pos as u64, err)))
            }
        }
    }
}

/// Events per type code, counted without decoding payloads: the fast path of `ggml-viz info`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TypeCounts {
    pub by_code: [u64; 256],
    pub damage: Option<Damage>,
}

impl TypeCounts {
    pub fn total(&self) -> u64 {
        self.by_code.iter().sum()
    }
}

/// Counts the records of `file` per type code.
pub fn count_types(file: &[u8], layout: Layout) -> TypeCounts {
    let mut by_code = [0u64; 256];
    if let Some(damage) = header_damage(file) {
        return TypeCounts {
            by_code,
            damage: Some(damage),
        };
    }
    let fixed = layout.fixed_len();
    let mut pos = HEADER_LEN;
    let damage = loop {
        let rest = &file[pos..];
        // Fast path: an unlabelled record, entirely in the buffer.
        if rest.len() >= fixed && rest[fixed - 1] == 0 {
            by_code[rest[0] as usize] += 1;
            pos += fixed;
            continue;
        }
        if rest.is_empty() {
            break None;
        }
        match format::record_len(rest, layout) {
            Ok(Some(len)) => {
                by_code[rest[0] as usize] += 1;
                pos += len;
            }
            Ok(None) => {
                let leftover = rest.len() as u64;
                break Some(Damage {
                    offset: pos as u64,
                    kind: DamageKind::Truncated { leftover },
                });
            }
            Err(err) => break Some(Damage::record(pos as u64, err)),
        }
    };
    TypeCounts { by_code, damage }
}

/// A finished trace file, memory-mapped.
///
/// Only for files that are no longer being written: a mapped file that shrinks raises `SIGBUS`.
/// Use [`crate::Follower`] for a trace that is still growing.
///
/// ```no_run
/// let trace = ggml_viz_reader::TraceFile::open("trace.ggmlviz", None)?;
/// for event in trace.events() {
///     match event {
///         Ok(event) => println!("{} at {} ns", event.type_code, event.timestamp_ns),
///         Err(damage) => eprintln!("{damage}"),
///     }
/// }
/// # Ok::<(), std::io::Error>(())
/// ```
pub struct TraceFile {
    path: PathBuf,
    bytes: Bytes,
    layout: LayoutChoice,
}

enum Bytes {
    Mapped(Mmap),
    /// Mapping an empty file fails on some systems; nothing is needed for it anyway.
    Empty,
}

impl TraceFile {
    /// Maps `path` and decides its layout (`forced`, else the marker, else inference).
    pub fn open(path: impl AsRef<Path>, forced: Option<Layout>) -> io::Result<TraceFile> {
        let path = path.as_ref().to_path_buf();
        let file = File::open(&path)?;
        let len = file.metadata()?.len();
        let bytes = if len == 0 {
            Bytes::Empty
        } else {
            // SAFETY: the mapping is read-only and the file is a finished trace; a concurrent
            // writer that truncated it would fault us, which is why growing traces are read by
            // `Follower` with plain reads instead.
            let map = unsafe { memmap2::MmapOptions::new().populate().map(&file)? };
            #[cfg(unix)]
            let _ = map.advise(memmap2::Advice::Sequential);
            Bytes::Mapped(map)
        };
        let layout = choose_layout(bytes_of(&bytes).get(HEADER_LEN..).unwrap_or(&[]), forced);
        Ok(TraceFile {
            path,
            bytes,
            layout,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The whole file, header included.
    pub fn bytes(&self) -> &[u8] {
        bytes_of(&self.bytes)
    }

    pub fn layout(&self) -> LayoutChoice {
        self.layout
    }

    pub fn events(&self) -> Events<'_> {
        Events::new(self.bytes(), self.layout.layout)
    }

    pub fn count_types(&self) -> TypeCounts {
        count_types(self.bytes(), self.layout.layout)
    }
}

fn bytes_of(bytes: &Bytes) -> &[u8] {
    match bytes {
        Bytes::Mapped(map) => map,
        Bytes::Empty => &[],
    }
}
