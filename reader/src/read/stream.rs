//! Reading a trace from any `io::Read`: a pipe, stdin, a socket.

use std::io::{self, Read};

use crate::format::Damage;
use crate::format::LayoutChoice;
use crate::format::{Event, Layout, RecordView};
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
        Some(
            self.next_record()?
                .map(|(offset, record)| (offset, record.event())),
        )
    }

    /// [`StreamReader::next_borrowed`], the record as it lies.
    fn next_record(&mut self) -> Option<Result<(u64, RecordView<'_>), StreamError>> {
        if self.done {
            return None;
        }
        loop {
            match self.decoder.advance() {
                Some(Ok(layout)) => {
                    self.last_offset = self.decoder.returned_offset();
                    let record = self.decoder.returned_record(layout);
                    return Some(Ok((self.last_offset, record)));
                }
                Some(Err(damage)) => {
                    self.done = true;
                    return Some(Err(StreamError::Damage(damage)));
                }
                None => {}
            }
            match self.read_more() {
                Ok(true) => {}
                Ok(false) => return None,
                Err(err) => return Some(Err(err)),
            }
        }
    }

    /// After the decoder found no whole record: reads the next chunk of the input into it (at
    /// the input's end, tells it so). False once the input has ended and everything was
    /// returned; the truncated tail, if bytes are left over then.
    fn read_more(&mut self) -> Result<bool, StreamError> {
        if self.ended {
            self.done = true;
            return self
                .decoder
                .finish()
                .map_or(Ok(false), |d| Err(StreamError::Damage(d)));
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
                return Err(StreamError::Io(err));
            }
        }
        Ok(true)
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
        let ended = self.for_each_record(|offset, record| each(offset, Ok(&record.event())));
        if let Err(err) = ended {
            each(self.decoder.offset(), Err(err));
        }
    }

    /// Hands `each` every record as it lies with the byte offset where it begins, until `each`
    /// returns false; then the error that ended the input, if any. The fastest way through a
    /// whole input: `each` is called from one place, where the records lie in the buffer, and
    /// decodes them as far as it needs.
    #[inline]
    pub fn for_each_record(
        &mut self,
        mut each: impl FnMut(u64, RecordView<'_>) -> bool,
    ) -> Result<(), StreamError> {
        while !self.done {
            let mut last = None;
            let go_on = self.decoder.each_record(|offset, record| {
                last = Some(offset);
                each(offset, record)
            });
            if let Some(offset) = last {
                self.last_offset = offset;
            }
            if !go_on {
                return Ok(());
            }
            // No whole record is buffered (or the header and layout are still to be read).
            match self.decoder.ready() {
                Some(Ok(())) => {}
                Some(Err(damage)) => {
                    self.done = true;
                    return Err(StreamError::Damage(damage));
                }
                None => {
                    if !self.read_more()? {
                        return Ok(());
                    }
                }
            }
        }
        Ok(())
    }
}

impl<R: Read> Iterator for StreamReader<R> {
    type Item = Result<Event<'static>, StreamError>;

    fn next(&mut self) -> Option<Self::Item> {
        Some(self.next_borrowed()?.map(|(_, event)| event.into_owned()))
    }
}
