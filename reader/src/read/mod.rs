//! Reading GGMLVIZ v1: a whole trace in memory ([`TraceFile`], [`Events`]), a stream from any
//! `io::Read` ([`StreamReader`]), a file another process is still writing ([`Follower`]), and
//! the push decoder the last two share ([`Decoder`]); the names a trace gives its numbers
//! ([`NameTables`]). No input makes any of them panic: damage
//! is returned with its byte offset, after every complete record before it.

mod decoder;
mod follow;
mod mmap;
mod names;
mod stream;

pub use decoder::Decoder;
pub use follow::{Follower, Poll};
pub use mmap::{Events, TraceFile, TypeCounts, count_types};
pub use names::{NameTables, NamesChanged};
pub use stream::{StreamError, StreamReader};
