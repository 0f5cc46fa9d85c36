//! The importers: each turns one input format into [`Record`](crate::telemetry::Record)s for a [`RecordSink`].
//!
//! - [`ggmlviz`]: GGMLVIZ v1 traces (ours), with a lane per sequence of a batching server
//!   (`sequences`);
//! - [`ge_log`]: Ascend GE profiling logs;
//! - [`event_v2`]: TelemetryEvent v2 records (gpu-memory-profiler);
//! - [`comma`]: CoMMA's NCCL JSON.
//!
//! [`detect`] recognises a file's format by its first bytes; [`import_path`] imports a file.

pub mod comma;
pub mod event_v2;
pub mod ge_log;
pub mod ggmlviz;
mod sequences;

/// The category of the spans on a sequence's lane (`request`, `prefill`, `generate`).
pub use sequences::CATEGORY as SEQUENCE_CATEGORY;

use crate::telemetry::{Ids, RecordSink};

/// Input formats, recognised by content.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Ggmlviz,
    GeLog,
    TelemetryV2,
    Comma,
}

impl std::fmt::Display for Format {
    /// What a file of the format is, for messages: `… is a GE profiling log`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Format::Ggmlviz => "a GGMLVIZ trace",
            Format::GeLog => "a GE profiling log",
            Format::TelemetryV2 => "TelemetryEvent v2 JSON",
            Format::Comma => "CoMMA NCCL JSON",
        })
    }
}

impl std::str::FromStr for Format {
    type Err = String;
    fn from_str(s: &str) -> Result<Format, String> {
        match s {
            "ggmlviz" => Ok(Format::Ggmlviz),
            "ge-log" => Ok(Format::GeLog),
            other => Err(format!(
                "unknown input format {other:?}: expected ggmlviz or ge-log"
            )),
        }
    }
}

/// What an import found wrong that makes it fail (after everything before it was delivered).
#[derive(Debug)]
pub struct ImportError(pub String);

/// The format of the file at `path`, recognised by its first bytes.
pub fn detect(path: &std::path::Path) -> Result<Format, ImportError> {
    let name = path.display().to_string();
    let fail = |e: std::io::Error| ImportError(format!("cannot read {name}: {e}"));
    let mut head = [0u8; 256];
    let mut file = std::fs::File::open(path).map_err(fail)?;
    let n = std::io::Read::read(&mut file, &mut head).map_err(fail)?;
    let head = &head[..n];
    Ok(
        if head.starts_with(&crate::format::MAGIC[..head.len().min(8)]) && !head.is_empty() {
            // A version this reader cannot read is no trace to it.
            crate::format::check_header(head)
                .map_err(|damage| ImportError(format!("{name}: {damage}")))?;
            Format::Ggmlviz
        } else if ge_log::looks_like(
            String::from_utf8_lossy(head)
                .lines()
                .next()
                .unwrap_or_default(),
        ) {
            Format::GeLog
        } else if head
            .iter()
            .find(|b| !b.is_ascii_whitespace())
            .is_some_and(|&b| b == b'[' || b == b'{')
        {
            // CoMMA records are Chrome-trace-like: `cat` and `ph`; v2 records are not.
            let text = String::from_utf8_lossy(head);
            if text.contains("\"cat\"") || text.contains("\"ph\"") {
                Format::Comma
            } else {
                Format::TelemetryV2
            }
        } else {
            return Err(ImportError(format!(
                "{name}: format not recognised: {} (read: GGMLVIZ traces, GE profiling logs, \
                 TelemetryEvent v2 JSON, CoMMA NCCL JSON)",
                unrecognised(head)
            )));
        },
    )
}

/// What an unrecognised file looked like, and the likely cause.
fn unrecognised(head: &[u8]) -> String {
    if head.is_empty() {
        return "the file is empty".into();
    }
    let text = String::from_utf8_lossy(head);
    let printable = head
        .iter()
        .all(|&b| b.is_ascii_graphic() || b.is_ascii_whitespace() || b >= 0x80);
    if !printable {
        let bytes: Vec<String> = head.iter().take(8).map(|b| format!("{b:02x}")).collect();
        return format!("binary data beginning {}", bytes.join(" "));
    }
    let first = text.lines().next().unwrap_or_default().trim();
    let shown: String = first.chars().take(60).collect();
    // llama.cpp's and ggml's own log lines: what a program printed, not a trace of it.
    let llama_log = [
        "llama_",
        "load_tensors:",
        "main:",
        "ggml_",
        "print_info:",
        "build:",
        "system_info:",
    ]
    .iter()
    .any(|p| first.starts_with(p));
    if llama_log {
        format!(
            "it looks like llama.cpp's log output (its first line: \"{shown}\"), not a trace: \
             record the program with `ggml-viz record -- PROGRAM ARGS` and give the .ggmlviz file \
             it writes"
        )
    } else {
        format!("text whose first line is \"{shown}\"")
    }
}

/// Imports the file at `path` into `sink`, recognising its format unless `format` is given.
/// Corruption is an error (what came before it was delivered); a truncated tail is a warning.
pub fn import_path<S: RecordSink>(
    path: &std::path::Path,
    format: Option<Format>,
    layout: Option<crate::format::Layout>,
    ids: &mut Ids,
    sink: &mut S,
) -> Result<(), ImportError> {
    import_path_reporting(path, format, layout, ids, sink, &mut |_| {}, &mut ())
}

/// What reads a GGMLVIZ trace's records beside the importer, as they lie in the read buffer
/// (decoded as far as it asks): the same bytes, read once, feed the telemetry model and, through
/// a tap, a caller's own counts (`TraceStats`) or node analysis (`OpCollector`). `()` taps
/// nothing.
pub trait RecordTap {
    /// A record, in file order.
    fn record(&mut self, record: crate::RecordView<'_>);
    /// The damage that ended the read (a truncated tail is one too).
    fn damage(&mut self, damage: &crate::Damage);
}

impl RecordTap for () {
    fn record(&mut self, _: crate::RecordView<'_>) {}
    fn damage(&mut self, _: &crate::Damage) {}
}

/// Bytes read between two calls of an import's progress callback.
const REPORT_EVERY: u64 = 4 << 20;

/// A reader that tells `report` how many bytes it has read, every [`REPORT_EVERY`] bytes.
struct Counting<'a, R> {
    inner: R,
    read: u64,
    reported: u64,
    report: &'a mut dyn FnMut(u64),
}

impl<'a, R> Counting<'a, R> {
    fn new(inner: R, report: &'a mut dyn FnMut(u64)) -> Self {
        Counting {
            inner,
            read: 0,
            reported: 0,
            report,
        }
    }
}

impl<R: std::io::Read> std::io::Read for Counting<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.read += n as u64;
        if self.read - self.reported >= REPORT_EVERY || n == 0 {
            self.reported = self.read;
            (self.report)(self.read);
        }
        Ok(n)
    }
}

/// [`import_path`], telling `progress` how many bytes of the file were read so far (for a
/// progress bar): every few megabytes, and at the end; and, for a GGMLVIZ trace, handing `tap`
/// each record and the damage that ended the read (see [`RecordTap`]).
pub fn import_path_reporting<S: RecordSink>(
    path: &std::path::Path,
    format: Option<Format>,
    layout: Option<crate::format::Layout>,
    ids: &mut Ids,
    sink: &mut S,
    progress: &mut dyn FnMut(u64),
    tap: &mut impl RecordTap,
) -> Result<(), ImportError> {
    let name = path.display().to_string();
    let fail = |e: std::io::Error| ImportError(format!("cannot read {name}: {e}"));
    let format = match format {
        Some(f) => f,
        None => detect(path)?,
    };
    match format {
        Format::Ggmlviz => {
            // Streamed, not mapped: memory stays bounded whatever the trace's size. Events borrow
            // the reader's buffer: nothing is allocated per event.
            let file = std::fs::File::open(path).map_err(fail)?;
            let mut reader = crate::StreamReader::new(Counting::new(file, progress), layout);
            let mut io_error = None;
            let mut import = ggmlviz::Import::new(&name, ids, sink);
            let ended = reader.for_each_record(|offset, record| {
                tap.record(record);
                import.record(offset, record)
            });
            match ended {
                Ok(()) => {}
                Err(crate::StreamError::Damage(d)) => {
                    tap.damage(&d);
                    import.item(d.offset, Err(d));
                }
                Err(crate::StreamError::Io(e)) => io_error = Some(e),
            }
            let damage = import.finish();
            if let Some(e) = io_error {
                return Err(fail(e));
            }
            match damage {
                Some(d) if !d.is_truncation() => Err(ImportError(format!("{name}: {d}"))),
                _ => Ok(()),
            }
        }
        Format::GeLog => {
            let file = std::fs::File::open(path).map_err(fail)?;
            let counted = std::io::BufReader::new(Counting::new(file, progress));
            ge_log::import(counted, &name, ids, sink).map_err(fail)
        }
        Format::TelemetryV2 => {
            let text = std::fs::read_to_string(path).map_err(fail)?;
            progress(text.len() as u64);
            event_v2::import(&text, &name, ids, sink).map_err(ImportError)
        }
        Format::Comma => {
            let text = std::fs::read_to_string(path).map_err(fail)?;
            progress(text.len() as u64);
            comma::import(&text, &name, ids, sink).map_err(ImportError)
        }
    }
}
