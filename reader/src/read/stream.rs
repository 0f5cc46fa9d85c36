//! Reading a trace from any `io::Read`: a pipe, stdin, a socket.

use std::io::{self, Read};

use crate::format::Damage;
use crate::format::LayoutChoice;
use crate::format::{Event, Layout};
use crate::read::Decoder;

const CHUNK: usize = 64 << 10;

/// An error while streaming: the input failed, or the trace is damaged.
#[derive(Debug)]
pub enum StreamError {
    Io(io::Error),
    Damage(Damage),
}

impl std::fmt::Display for StreamError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StreamError::Io(err) => write!(f, "read failed: {err}"),
            StreamError::Damage(damage) => damage.fmt(f),
        }
    }
}

impl std::error::Error for StreamError {}

/// Decodes events from a reader as they arrive: `Ok` events, then at most one `Err`.
///
/// ```
/// let bytes: &[u8] = b"GGMLVIZ1\x01\x00\x00\x00";
/// let events: Vec<_> = ggml_viz_reader::StreamReader::new(bytes, None).collect();
/// assert!(events.is_empty());
/// ```
pub struct StreamReader<R> {
    input: R,
    decoder: Decoder,
    ended: bool,
    done: bool,
    /// File offset where the last returned event began.
    last_offset: u64,
}

impl<R: Read> StreamReader<R> {
    pub fn new(input: R, forced: Option<Layout>) -> StreamReader<R> {
        StreamReader {
            input,
            decoder: Decoder::new(forced),
            last_offset: 0,
            ended: false,
            done: false,
        }
    }

    /// Byte offset in the input where the last event returned began.
    pub fn last_offset(&self) -> u64 {
        self.last_offset
    }

    /// The layout in use, once decided (after the first event at the latest).
    pub fn layout(&self) -> Option<LayoutChoice> {
        self.decoder.layout()
    }
}

impl<R: Read> StreamReader<R> {
    /// The next event without copying its label (it borrows the reader until the next call),
    /// with the byte offset where it begins: what [`Iterator::next`] returns, owned.
    pub fn next_borrowed(&mut self) -> Option<Result<(u64, Event<'_>), StreamError>> {
        if self.done {
            return None;
        }
        loop {
            match self.decoder.advance() {
                Some(Ok(layout)) => {
                    self.last_offset = self.decoder.returned_offset();
                    let event = self.decoder.returned_event(layout);
                    return Some(Ok((self.last_offset, event)));
                }
                Some(Err(damage)) => {
                    self.done = true;
                    return Some(Err(StreamError::Damage(damage)));
                }
                None => {}
            }
            if self.ended {
                self.done = true;
                return self.decoder.finish().map(|d| Err(StreamError::Damage(d)));
            }
            match self.decoder.fill(&mut self.input, CHUNK) {
                Ok(0) => {
                    self.ended = true;
                    self.decoder.end_input();
                }
                Ok(_) => {}
                Err(err) if err.kind() == io::ErrorKind::Interrupted => {}
                Err(err) => {
                    self.done = true;
                    return Some(Err(StreamError::Io(err)));
                }
            }
        }
    }
}

impl<R: Read> StreamReader<R> {
    /// Hands `each` every event with the byte offset where it begins, then the error that ended
    /// the input if any, until `each` returns false: what [`StreamReader::next_borrowed`] returns
    /// one by one, at a fraction of the cost per event (the decoder's state is checked per buffer
    /// read, not per event).
    pub fn for_each_borrowed(
        &mut self,
        mut each: impl FnMut(u64, Result<&Event<'_>, StreamError>) -> bool,
    ) {
        loop {
            let mut last = None;
            let go_on = self.decoder.each_buffered(|offset, event| {
                last = Some(offset);
                each(offset, Ok(event))
            });
            if let Some(offset) = last {
                self.last_offset = offset;
            }
            if !go_on {
                return;
            }
            let go_on = match self.next_borrowed() {
                None => return,
                Some(Ok((offset, event))) => each(offset, Ok(&event)),
                Some(Err(err)) => each(self.decoder.offset(), Err(err)),
            };
            if !go_on {
                return;
            }
        }
    }
}

impl<R: Read> Iterator for StreamReader<R> {
    type Item = Result<Event<'static>, StreamError>;

    fn next(&mut self) -> Option<Self::Item> {
        Some(self.next_borrowed()?.map(|(_, event)| event.into_owned()))
    }
}
