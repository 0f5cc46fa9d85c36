//! The commands' inputs: opening the FILE argument (a mapped file, or `-` for standard input),
//! `--layout`'s parser; the options the telemetry commands share and reading several inputs
//! ([`reading`]); progress bars of long reads ([`progress`]).

pub mod progress;
pub mod reading;

use std::path::Path;

use ggml_viz_reader::{Damage, Event, Layout, LayoutChoice, StreamError, StreamReader, TraceFile};
use ggml_viz_reader::{Format, detect};
use indicatif::ProgressBar;

/// One input: a mapped regular file, or a stream (standard input, a pipe, a device) read as it
/// comes. Only regular files are mapped.
pub enum Input {
    File(TraceFile),
    Stdin,
    Stream(std::fs::File, String),
}

/// Why reading stopped before the end of the input.
pub enum ReadStop {
    Damage(Damage),
    Io(String),
}

impl ReadStop {
    /// A truncated tail is only a warning.
    pub fn is_warning(&self) -> bool {
        matches!(self, ReadStop::Damage(d) if d.is_truncation())
    }

    pub fn describe(&self, name: &str) -> String {
        match self {
            ReadStop::Damage(d) => format!("{name}: {d}"),
            ReadStop::Io(e) => format!("{name}: {e}"),
        }
    }
}

impl Input {
    pub fn open(path: &Path, layout: Option<Layout>) -> Result<Input, String> {
        Input::open_as(path, layout, false)
    }

    /// [`Input::open`], a regular file too read as a stream: for a reader that looks at each
    /// event once, so that memory does not grow with the file (a mapping counts the pages read).
    pub fn open_streamed(path: &Path) -> Result<Input, String> {
        Input::open_as(path, None, true)
    }

    fn open_as(path: &Path, layout: Option<Layout>, streamed: bool) -> Result<Input, String> {
        if path.as_os_str() == "-" {
            return Ok(Input::Stdin);
        }
        let name = path.display().to_string();
        let meta = std::fs::metadata(path).map_err(|err| format!("cannot open {name}: {err}"))?;
        if meta.is_dir() {
            return Err(format!("{name} is a directory, not a trace"));
        }
        // A file that is something else fails at once, before any output (an empty one is a
        // trace whose writer has not written its header yet: reading it says so).
        if meta.is_file() && meta.len() > 0 {
            match detect(path) {
                Ok(Format::Ggmlviz) => {}
                Ok(format) => {
                    return Err(format!(
                        "{name} is {format}, not a GGMLVIZ trace (`ggml-viz summary`, `export` \
                         and `report` read it)"
                    ));
                }
                Err(e) => return Err(e.0),
            }
        }
        if streamed || !meta.is_file() || being_written(path) {
            // Streamed with read(): a mapped file that shrinks faults the reader.
            let file =
                std::fs::File::open(path).map_err(|err| format!("cannot open {name}: {err}"))?;
            return Ok(Input::Stream(file, name));
        }
        TraceFile::open(path, layout)
            .map(Input::File)
            .map_err(|err| format!("cannot open {}: {err}", path.display()))
    }

    pub fn name(&self) -> String {
        match self {
            Input::File(f) => f.path().display().to_string(),
            Input::Stdin => "<stdin>".into(),
            Input::Stream(_, name) => name.clone(),
        }
    }

    /// Visits every event; returns what stopped reading, if anything, and the layout used.
    pub fn for_each(
        &self,
        layout: Option<Layout>,
        visit: impl FnMut(Event<'_>) -> std::io::Result<()>,
    ) -> std::io::Result<(Option<ReadStop>, Option<LayoutChoice>)> {
        self.for_each_showing(layout, &ProgressBar::hidden(), visit)
    }

    /// [`Input::for_each`], moving `bar` to the bytes read as a stream is read (a mapped file
    /// is read too fast to need it).
    pub fn for_each_showing(
        &self,
        layout: Option<Layout>,
        bar: &ProgressBar,
        mut visit: impl FnMut(Event<'_>) -> std::io::Result<()>,
    ) -> std::io::Result<(Option<ReadStop>, Option<LayoutChoice>)> {
        match self {
            Input::File(file) => {
                for item in file.events() {
                    match item {
                        Ok(event) => visit(event)?,
                        Err(damage) => {
                            return Ok((Some(ReadStop::Damage(damage)), Some(file.layout())));
                        }
                    }
                }
                Ok((None, Some(file.layout())))
            }
            Input::Stdin => stream(std::io::stdin().lock(), layout, bar, visit),
            Input::Stream(file, _) => stream(file, layout, bar, visit),
        }
    }
}

/// Visits every event of a stream, `bar` at the bytes read; returns what stopped it and the
/// layout found.
fn stream(
    input: impl std::io::Read,
    layout: Option<Layout>,
    bar: &ProgressBar,
    mut visit: impl FnMut(Event<'_>) -> std::io::Result<()>,
) -> std::io::Result<(Option<ReadStop>, Option<LayoutChoice>)> {
    let mut reader = StreamReader::new(input, layout);
    let mut failed = None;
    let mut records = 0u32;
    let ended = reader.for_each_record(|offset, record| {
        // The bar moves every 65,536 records: a few times a second at any speed worth a bar.
        records = records.wrapping_add(1);
        if records.is_multiple_of(1 << 16) {
            bar.set_position(offset);
        }
        match visit(record.event()) {
            Ok(()) => true,
            Err(e) => {
                failed = Some(e);
                false
            }
        }
    });
    bar.finish_and_clear();
    let stop = match ended {
        Ok(()) => None,
        Err(StreamError::Damage(d)) => Some(ReadStop::Damage(d)),
        Err(StreamError::Io(e)) => Some(ReadStop::Io(e.to_string())),
    };
    match failed {
        Some(e) => Err(e),
        None => Ok((stop, reader.layout())),
    }
}

/// Whether a live writer holds the file: the hook keeps an exclusive lock on its trace while the
/// program runs (`flock`). Such a file may still change, so it is read, not mapped.
#[cfg(unix)]
pub fn being_written(path: &std::path::Path) -> bool {
    let Ok(file) = std::fs::File::open(path) else {
        return false;
    };
    // A shared lock we get is released when `file` closes.
    matches!(
        file.try_lock_shared(),
        Err(std::fs::TryLockError::WouldBlock)
    )
}

/// Whether a live writer has the file open: on Windows the hook shares its trace for reading
/// only, so opening it for writing fails with a sharing violation while it runs.
#[cfg(windows)]
pub fn being_written(path: &std::path::Path) -> bool {
    const ERROR_SHARING_VIOLATION: i32 = 32;
    std::fs::OpenOptions::new()
        .append(true)
        .open(path)
        .is_err_and(|e| e.raw_os_error() == Some(ERROR_SHARING_VIOLATION))
}

/// A `--layout` value: `packed` or `padded` (the two event layouts found in the wild).
pub fn parse_layout(s: &str) -> Result<Layout, String> {
    s.parse()
}
