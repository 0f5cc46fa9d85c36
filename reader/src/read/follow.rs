//! Following a trace that another process is still writing.

use std::fs::File;
use std::io;
use std::path::Path;

use crate::format::Damage;
use crate::format::LayoutChoice;
use crate::format::{Event, Layout};
use crate::read::Decoder;

const CHUNK: usize = 256 << 10;
const MAX_CHUNKS_PER_POLL: usize = 256;

/// Returns, on each [`Follower::poll`], the complete records that appeared since the last call.
/// Bytes already returned are never read again; a partial record at the end waits for the next
/// poll. The file is read with positioned reads, not mapped: a file that changes under a mapping
/// can fault the reader.
pub struct Follower {
    file: File,
    /// Bytes read from the file so far.
    read_to: u64,
    decoder: Decoder,
    chunk: Vec<u8>,
}

/// What one poll found.
#[derive(Debug, Default)]
pub struct Poll {
    pub events: Vec<Event<'static>>,
    /// Corruption: the events before it are in `events`; later polls return nothing.
    pub damage: Option<Damage>,
}

impl Follower {
    pub fn open(path: impl AsRef<Path>, forced: Option<Layout>) -> io::Result<Follower> {
        let mut decoder = Decoder::new(forced);
        // A live trace may grow slowly: decide the layout on what is there rather than wait.
        decoder.detect_layout_early();
        Ok(Follower {
            file: File::open(path)?,
            read_to: 0,
            decoder,
            chunk: vec![0; CHUNK],
        })
    }

    /// The layout in use, once decided.
    pub fn layout(&self) -> Option<LayoutChoice> {
        self.decoder.layout()
    }

    /// Bytes consumed as complete records (and the header).
    pub fn offset(&self) -> u64 {
        self.decoder.offset()
    }

    /// Bytes read but not yet complete records: a record being written, or a truncated tail.
    pub fn pending(&self) -> usize {
        self.decoder.buffered()
    }

    /// Reads what was appended since the last poll and returns the records it completed.
    pub fn poll(&mut self) -> io::Result<Poll> {
        // Bounded per poll, so that a writer faster than us cannot keep one poll going forever.
        for _ in 0..MAX_CHUNKS_PER_POLL {
            let n = read_at(&self.file, &mut self.chunk, self.read_to)?;
            if n == 0 {
                break;
            }
            self.read_to += n as u64;
            self.decoder.push(&self.chunk[..n]);
        }
        let mut poll = Poll::default();
        while let Some(item) = self.decoder.next_event() {
            match item {
                Ok(event) => poll.events.push(event),
                Err(damage) => poll.damage = Some(damage),
            }
        }
        Ok(poll)
    }
}

#[cfg(unix)]
fn read_at(file: &File, buf: &mut [u8], offset: u64) -> io::Result<usize> {
    use std::os::unix::fs::FileExt;
    loop {
        match file.read_at(buf, offset) {
            Err(err) if err.kind() == io::ErrorKind::Interrupted => continue,
            other => return other,
        }
    }
}

#[cfg(windows)]
fn read_at(file: &File, buf: &mut [u8], offset: u64) -> io::Result<usize> {
    use std::os::windows::fs::FileExt;
    file.seek_read(buf, offset)
}
