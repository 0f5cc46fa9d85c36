//! A push decoder: bytes go in as they arrive, complete events come out. The streaming reader
//! (any `io::Read`) and the follow reader (a file still being written) are thin shells around it.

use crate::format::{self, Event, HEADER_LEN, Layout};
use crate::format::{Damage, DamageKind, check_header};
use crate::format::{LayoutChoice, LayoutSource, choose_layout, marker_layout};

/// Without a layout marker, a stream's layout is inferred from this many buffered bytes (or from
/// all of it, if it is shorter).
pub(crate) const DETECT_WINDOW: usize = 1 << 20;

/// Decodes GGMLVIZ v1 from bytes pushed in pieces. Memory held is at most the bytes pushed and
/// not yet returned as events.
#[derive(Debug)]
pub struct Decoder {
    buf: Vec<u8>,
    /// Start of the unread part of `buf`.
    start: usize,
    /// File offset of `buf[0]`.
    base: u64,
    header_done: bool,
    layout: Option<LayoutChoice>,
    /// Corruption found: nothing more is decoded.
    failed: bool,
    /// No more bytes will come.
    ended: bool,
    /// See [`Decoder::detect_layout_early`].
    eager: bool,
}

impl Decoder {
    pub fn new(forced: Option<Layout>) -> Decoder {
        Decoder {
            buf: Vec::new(),
            start: 0,
            base: 0,
            header_done: false,

            layout: forced.map(|layout| LayoutChoice {
                layout,
                source: LayoutSource::Forced,
            }),
            failed: false,
            ended: false,
            eager: false,
        }
    }

    /// Appends newly arrived bytes.
    pub fn push(&mut self, bytes: &[u8]) {
        if self.start > 0 && self.start >= self.buf.len() / 2 {
            self.base += self.start as u64;
            self.buf.drain(..self.start);
            self.start = 0;
        }
        self.buf.extend_from_slice(bytes);
    }

    /// The layout in use, once decided.
    pub fn layout(&self) -> Option<LayoutChoice> {
        self.layout
    }

    /// File offset of the first byte not yet returned as part of an event.
    pub fn offset(&self) -> u64 {
        self.base + self.start as u64
    }

    /// Bytes pushed but not yet returned as events.
    pub fn buffered(&self) -> usize {
        self.buf.len() - self.start
    }

    /// Decides the layout from whatever is buffered when the first record is due, instead of
    /// waiting for [`DETECT_WINDOW`] bytes. For the follow reader: a live trace may grow slowly.
    pub fn detect_layout_early(&mut self) {
        self.eager = true;
    }

    fn settle_layout(&mut self) {
        if self.layout.is_none() && self.buffered() > 0 {
            self.layout = Some(choose_layout(&self.buf[self.start..], None));
        }
    }

    /// The next complete event; `None` when more bytes are needed (or after damage). Call
    /// [`Decoder::finish`] at the end of the input to learn about a truncated tail.
    pub fn next_event(&mut self) -> Option<Result<Event<'static>, Damage>> {
        if self.failed {
            return None;
        }
        if !self.header_done {
            match check_header(&self.buf[self.start..]) {
                Ok(true) => {
                    self.start += HEADER_LEN;
                    self.header_done = true;
                }
                Ok(false) => return None,
                Err(damage) => return self.fail(damage),
            }
        }
        let layout = match self.layout {
            Some(choice) => choice.layout,
            None => {
                let rest = &self.buf[self.start..];
                if let Some(layout) = marker_layout(rest) {
                    self.layout = Some(LayoutChoice {
                        layout,
                        source: LayoutSource::Marker,
                    });
                } else if self.ended || self.eager || rest.len() >= DETECT_WINDOW {
                    self.settle_layout();
                }
                self.layout?.layout
            }
        };
        let rest = &self.buf[self.start..];
        match format::decode_record(rest, layout) {
            Ok(Some((event, len))) => {
                let event = event.into_owned();
                self.start += len;
                Some(Ok(event))
            }
            Ok(None) => None,
            Err(err) => {
                let damage = Damage::record(self.offset(), err);
                self.fail(damage)
            }
        }
    }

    /// Says that no more bytes will come: the layout is then decided from what is buffered.
    pub fn end_input(&mut self) {
        self.ended = true;
    }

    /// After the input ended and [`Decoder::next_event`] returned `None`: the truncated tail, if
    /// bytes are left over.
    pub fn finish(&mut self) -> Option<Damage> {
        if self.failed {
            return None;
        }
        let leftover = self.buffered() as u64;
        // An input without a whole header is a truncated header, even an empty one.
        (leftover > 0 || !self.header_done).then(|| Damage {
            offset: self.offset(),
            kind: DamageKind::Truncated { leftover },
        })
    }

    fn fail(&mut self, damage: Damage) -> Option<Result<Event<'static>, Damage>> {
        self.failed = true;
        Some(Err(damage))
    }
}
