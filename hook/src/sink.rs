//! The consumer side: opening the trace, the flusher thread, and the last flush at exit.
//!
//! Records are encoded by the reader crate's `format` module (one definition of the format).
//! The first record is the metadata extension record (which is also the layout marker); counters
//! records carry the events that could not be recorded, as running totals.

use std::fs::File;
use std::io::{self, Write};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, Once, PoisonError};
use std::time::Duration;

use ggml_viz_config::{Config, Sources};
use ggml_viz_reader::format::ext::{self, Counters};
use ggml_viz_reader::format::{self, ExtensionKind, Layout, Payload};

use crate::capture::{self, Entry, Recorder};
use crate::names::{Names, Owner};
use crate::ring::RawEvent;

/// Name ids an event can carry: the name table's slots and 0 for none.
const NAME_IDS: usize = crate::names::SLOTS + 1;

pub struct Sink {
    file: io::BufWriter<File>,
    pub path: PathBuf,
    layout: Layout,
    /// Encoding buffer, reused.
    buf: Vec<u8>,
    /// For each tensor-name group, the tensor info last written (the reader keeps the latest).
    info_of_group: Vec<u16>,
    /// Buffers allocated and not yet freed: handle to size and buffer type.
    live_buffers: std::collections::BTreeMap<u64, (u64, String)>,
    /// Op types whose names were written.
    op_names_written: std::collections::HashSet<u32>,
    /// Labels by entry point and name id (index `entry * NAME_IDS + name_id`): built once, not
    /// per event; empty until built.
    labels: Vec<Vec<u8>>,
    /// Names already written in a backend_names record.
    names_written: usize,
    counters_written: Counters,
    closed: bool,
    clock: crate::clock::TickConverter,
}

/// Starts tracing in this process: configuration, output file, metadata record, flusher thread,
/// exit and fork handlers. `None` (after one line on stderr, where something failed) leaves the
/// program running untraced.
pub fn start() -> Option<Box<Recorder>> {
    crate::clock::init();
    let config = match Config::load(&Sources::from_process_env()) {
        Ok(config) => config,
        Err(err) => {
            crate::say(format_args!("{err}; the program runs untraced"));
            return None;
        }
    };
    crate::VERBOSE.store(config.verbose, std::sync::atomic::Ordering::Relaxed);
    if config.disable {
        if config.verbose {
            crate::say(format_args!("disabled by configuration"));
        }
        return None;
    }
    let layout: Layout = config.layout.parse().unwrap_or(Layout::Packed);
    let (file, path) = match open_output(&config.output) {
        Ok(opened) => opened,
        Err((path, err)) => {
            crate::say(format_args!(
                "cannot write the trace to {path}: {err}; the program runs untraced"
            ));
            return None;
        }
    };
    let mut sink = Sink {
        file: io::BufWriter::with_capacity(1 << 16, file),
        path,
        layout,
        buf: Vec::with_capacity(1 << 16),
        labels: vec![Vec::new(); 256 * NAME_IDS],
        info_of_group: Vec::new(),
        live_buffers: Default::default(),
        op_names_written: Default::default(),
        names_written: 0,
        counters_written: Counters::default(),
        closed: false,
        clock: crate::clock::TickConverter::new(),
    };
    let ggml_version = crate::resolve::first_helpers().and_then(|h| h.version());
    let metadata = crate::metadata::collect(&config, ggml_version);
    format::encode_header(&mut sink.buf);
    ext::encode_extension(
        &mut sink.buf,
        layout,
        ExtensionKind::Metadata,
        crate::clock::now_ns(),
        0,
        &metadata,
    );
    if let Err(err) = sink.write_buf() {
        crate::say(format_args!(
            "cannot write the trace to {}: {err}; the program runs untraced",
            sink.path.display()
        ));
        return None;
    }
    if config.verbose {
        crate::say(format_args!("tracing to {}", sink.path.display()));
    }
    let recorder = Box::new(Recorder {
        generation: capture::next_generation(),
        rings: Mutex::new(Vec::new()),
        names: Names::new(),
        reserved: AtomicU64::new(0),
        over_max_events: AtomicU64::new(0),
        graphs_begun: AtomicU64::new(0),
        op_timed_graphs: AtomicU64::new(0),
        tensors: crate::ops::Tensors::new(),
        sink: Mutex::new(sink),
        config,
    });
    install_process_handlers();
    Some(recorder)
}

/// Spawns the flusher of the recorder just made active.
pub fn spawn_flusher(recorder: &'static Recorder) {
    let interval = Duration::from_millis(recorder.config.flush_interval_ms);
    let spawned = std::thread::Builder::new()
        .name("ggml-viz-flush".into())
        .spawn(move || {
            loop {
                std::thread::sleep(interval);
                let mut sink = recorder.sink.lock().unwrap_or_else(PoisonError::into_inner);
                if sink.closed {
                    return;
                }
                let _ = catch_unwind(AssertUnwindSafe(|| sink.flush(recorder)));
            }
        });
    if let Err(err) = spawned {
        crate::say(format_args!(
            "cannot start the flusher thread ({err}); events are written at exit only"
        ));
    }
}

/// `%p` becomes the pid, `%h` the host name, `%%` a percent sign.
pub fn expand_path(template: &str) -> String {
    let mut out = String::new();
    let mut chars = template.chars();
    while let Some(c) = chars.next() {
        match (c, chars.clone().next()) {
            ('%', Some('p')) => out.push_str(&std::process::id().to_string()),
            ('%', Some('h')) => out.push_str(&crate::metadata::host_name()),
            ('%', Some('%')) => out.push('%'),
            _ => {
                out.push(c);
                continue;
            }
        }
        chars.next();
    }
    out
}

/// Opens the trace for writing. A file that another live process is tracing into (it holds the
/// lock on it) is left alone: we write `PATH.PID` instead, and say so.
fn open_output(template: &str) -> Result<(File, PathBuf), (String, io::Error)> {
    let path = PathBuf::from(expand_path(template));
    let fail = |path: &PathBuf, err| (path.display().to_string(), err);
    let file = crate::os::open_locked(&path).map_err(|err| fail(&path, err))?;
    if let Some(file) = file {
        return Ok((file, path));
    }
    let alternative = PathBuf::from(format!("{}.{}", path.display(), std::process::id()));
    crate::say(format_args!(
        "{} is being written by another live process; writing {} instead",
        path.display(),
        alternative.display()
    ));
    match crate::os::open_locked(&alternative) {
        Ok(Some(file)) => Ok((file, alternative)),
        Ok(None) => Err(fail(
            &alternative,
            io::Error::new(io::ErrorKind::WouldBlock, "locked by another process"),
        )),
        Err(err) => Err(fail(&alternative, err)),
    }
}

fn install_process_handlers() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| crate::os::install_process_handlers(at_exit, after_fork_in_child));
}

extern "C" fn at_exit() {
    let _ = catch_unwind(|| {
        let Some(recorder) = capture::active() else {
            return;
        };
        // The flusher holds the lock for a flush at most (milliseconds). On Windows the exit
        // handlers run after the process's other threads were stopped, possibly the flusher
        // inside a flush: then the lock is never released, and waiting would hang the exit.
        let deadline = std::time::Instant::now() + Duration::from_secs(2);
        loop {
            match recorder.sink.try_lock() {
                Ok(mut sink) => return sink.close(recorder),
                Err(std::sync::TryLockError::Poisoned(p)) => return p.into_inner().close(recorder),
                Err(std::sync::TryLockError::WouldBlock)
                    if std::time::Instant::now() < deadline =>
                {
                    std::thread::sleep(Duration::from_millis(1))
                }
                Err(std::sync::TryLockError::WouldBlock) => {
                    return crate::say(format_args!(
                        "the writer was stopped in the middle of a flush; the trace ends before the program did"
                    ));
                }
            }
        }
    });
}

extern "C" fn after_fork_in_child() {
    let _ = catch_unwind(capture::reset_after_fork);
}

impl Sink {
    /// Writes what was encoded; nothing at all (no system call) when nothing was.
    fn write_buf(&mut self) -> io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        crate::os::without_sigxfsz(|| {
            self.file.write_all(&self.buf)?;
            self.buf.clear();
            self.file.flush()
        })
    }

    /// Drains every ring into the file, with new names and changed counters.
    pub fn flush(&mut self, r: &Recorder) {
        if self.closed {
            return;
        }
        // Before draining: every event drained now is older than this calibration point, or a
        // few microseconds newer.
        self.clock.recalibrate();
        let rings: Vec<_> = r
            .rings
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let events_at = self.buf.len();
        for ring in rings {
            // SAFETY: the sink lock is held, so this is the only consumer.
            unsafe { ring.drain(|event| self.encode(event, r)) };
        }
        // Names are interned before the events that use them are pushed, so the names known
        // now cover every event drained; they go in front of those events, so that a reader
        // knows each backend by name when it first meets it.
        let names_at = self.buf.len();
        self.encode_new_names(&r.names);
        let names_len = self.buf.len() - names_at;
        self.buf[events_at..].rotate_right(names_len);
        let counters = Counters {
            dropped_ring_full: r.dropped_ring_full(),
            over_max_events: r.over_max_events.load(Ordering::Relaxed),
            missed_while_starting: capture::missed_while_starting(),
        };
        if counters != self.counters_written {
            self.encode_counters(counters);
        }
        if let Err(err) = self.write_buf() {
            crate::say(format_args!(
                "writing the trace to {} failed: {err}; tracing stops, the program runs on",
                self.path.display()
            ));
            self.closed = true;
            capture::go_inert();
        }
    }

    /// The last flush: final counters, said on stderr when events were lost.
    pub fn close(&mut self, r: &Recorder) {
        if self.closed {
            return;
        }
        self.flush(r);
        if self.closed {
            return;
        }
        let counters = self.counters_written;
        if r.config.memory_tracking {
            let buffers = self
                .live_buffers
                .iter()
                .map(|(&ptr, (size, buft))| ext::LiveBuffer {
                    ptr,
                    size: *size,
                    buffer_type: buft.clone(),
                })
                .collect();
            let live = ext::LiveBuffers { buffers };
            self.encode_own(ExtensionKind::LiveBuffers, &live);
        }
        // Always end with a counters record: "nothing lost" is then written, not assumed.
        self.encode_counters(counters);
        let _ = self.write_buf();
        self.closed = true;
        if counters.lost() > 0 {
            crate::say(format_args!(
                "{} event(s) were not recorded in {}: {} dropped with a full ring (raise GGML_VIZ_BUFFER_SIZE), \
                 {} over GGML_VIZ_MAX_EVENTS, {} while tracing started",
                counters.lost(),
                self.path.display(),
                counters.dropped_ring_full,
                counters.over_max_events,
                counters.missed_while_starting
            ));
        }
    }

    fn encode(&mut self, e: &RawEvent, r: &Recorder) {
        let timestamp_ns = self.clock.to_epoch_ns(e.ticks);
        let payload = match e.type_code {
            0 | 1 => Payload::Graph {
                graph_ptr: e.a,
                n_nodes: e.b,
                n_threads: e.c,
                backend_ptr: e.d,
            },
            2 | 3 => return self.encode_op(e, timestamp_ns, r),
            4 | 5 => return self.encode_buffer(e, timestamp_ns, r),
            format::EXTENSION_TYPE_CODE => return self.encode_span(e, timestamp_ns),
            _ => Payload::Thread {
                object_ptr: e.a,
                thread_index: e.b,
                n_threads: e.c,
                value: self.clock.to_ns(e.d),
            },
        };
        let label = &mut self.labels[e.entry as usize * NAME_IDS + (e.name_id as usize % NAME_IDS)];
        if label.is_empty() {
            *label = label_of(e.entry, e.name_id, &r.names);
        }
        format::encode_record(
            &mut self.buf,
            self.layout,
            e.type_code,
            timestamp_ns,
            e.thread_id,
            &payload,
            (!label.is_empty()).then_some(label.as_slice()),
        );
    }

    /// An op event, preceded by the tensor-info (and op-name) records it needs.
    fn encode_op(&mut self, e: &RawEvent, timestamp_ns: u64, r: &Recorder) {
        let info = r.tensors.get(e.name_id);
        if let Some(info) = info.filter(|_| e.type_code == 2) {
            let group = info.group as usize;
            if self.info_of_group.len() <= group {
                self.info_of_group.resize(group + 1, 0);
            }
            if self.info_of_group[group] != e.name_id {
                self.info_of_group[group] = e.name_id;
                self.encode_tensor_info(info, timestamp_ns, e.thread_id);
            }
        }
        let payload = Payload::Op {
            tensor_ptr: e.a,
            op_type: e.b,
            op_size: e.size,
            backend_ptr: e.d,
        };
        let label = info
            .filter(|_| r.config.tensor_names)
            .map(|i| i.name.as_bytes());
        format::encode_record(
            &mut self.buf,
            self.layout,
            e.type_code,
            timestamp_ns,
            e.thread_id,
            &payload,
            label,
        );
    }

    fn encode_tensor_info(
        &mut self,
        info: &crate::ops::TensorInfo,
        timestamp_ns: u64,
        thread_id: u32,
    ) {
        if let Some(op_type) = info.op_type
            && self.op_names_written.insert(op_type)
        {
            let mut names = ext::OpNames::default();
            names
                .names
                .insert(op_type.to_string(), info.op_name.clone());
            ext::encode_extension(
                &mut self.buf,
                self.layout,
                ExtensionKind::OpNames,
                timestamp_ns,
                thread_id,
                &names,
            );
        }
        let payload = ext::TensorInfo {
            name: info.name.clone(),
            op: info.op.clone(),
            op_type: info.op_type,
            op_name: info.op_type.map(|_| info.op_name.clone()),
            type_name: info.type_name.clone(),
            ne: info.ne,
            flops: info.flops,
        };
        ext::encode_extension(
            &mut self.buf,
            self.layout,
            ExtensionKind::TensorInfo,
            timestamp_ns,
            thread_id,
            &payload,
        );
    }

    /// TENSOR_ALLOC / TENSOR_FREE of a backend buffer: label `<buffer type>@<base address>`.
    fn encode_buffer(&mut self, e: &RawEvent, timestamp_ns: u64, r: &Recorder) {
        let buft = r.names.get(e.name_id).map_or("", |(_, _, name)| name);
        if e.type_code == 4 {
            self.live_buffers.insert(e.a, (e.size, buft.to_string()));
        } else {
            self.live_buffers.remove(&e.a);
        }
        let label = format!("{buft}@{:#x}", e.d);
        let payload = Payload::Memory {
            ptr: e.a,
            size: e.size,
        };
        format::encode_record(
            &mut self.buf,
            self.layout,
            e.type_code,
            timestamp_ns,
            e.thread_id,
            &payload,
            Some(label.as_bytes()),
        );
    }

    fn encode_span(&mut self, e: &RawEvent, timestamp_ns: u64) {
        let kind = if e.c == 1 {
            ExtensionKind::SpanBegin
        } else {
            ExtensionKind::SpanEnd
        };
        let name = Entry::from_code(e.entry).map_or("span", Entry::name);
        let span = ext::SpanBoundary {
            name: name.into(),
            n_tokens: (e.b != u32::MAX).then_some(e.b),
        };
        ext::encode_extension(
            &mut self.buf,
            self.layout,
            kind,
            timestamp_ns,
            e.thread_id,
            &span,
        );
    }

    fn encode_new_names(&mut self, names: &Names) {
        let n = names.len();
        if n == self.names_written {
            return;
        }
        let backends: Vec<_> = (self.names_written..n)
            .filter_map(|i| names.get(i as u16 + 1))
            .filter(|(_, owner, _)| *owner != Owner::Thread)
            .map(|(ptr, owner, name)| ext::BackendName {
                ptr: ptr as u64,
                name: name.into(),
                kind: owner.name().into(),
            })
            .collect();
        let payload = ext::BackendNames { backends };
        self.encode_own(ExtensionKind::BackendNames, &payload);
        self.names_written = n;
    }

    /// One of the writer's own extension records (thread 0, stamped now).
    fn encode_own<T: serde::Serialize>(&mut self, kind: ExtensionKind, payload: &T) {
        ext::encode_extension(
            &mut self.buf,
            self.layout,
            kind,
            crate::clock::now_ns(),
            0,
            payload,
        );
    }

    fn encode_counters(&mut self, counters: Counters) {
        self.encode_own(ExtensionKind::Counters, &counters);
        self.counters_written = counters;
    }
}

/// An event's label: the entry point and the backend or scheduler name (`ggml_backend_graph_compute_async CPU`).
fn label_of(entry: u8, name_id: u16, names: &Names) -> Vec<u8> {
    let entry = Entry::from_code(entry);
    let mut label = entry.map(Entry::name).unwrap_or_default().to_string();
    let interned = names
        .get(name_id)
        .map(|(_, _, name)| name)
        .filter(|n| !n.is_empty());
    if let Some(name) = interned.or_else(|| entry.and_then(Entry::implied_backend)) {
        if !label.is_empty() {
            label.push(' ');
        }
        label.push_str(name);
    }
    label.into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_patterns_expand() {
        let pid = std::process::id().to_string();
        assert_eq!(expand_path("t-%p.ggmlviz"), format!("t-{pid}.ggmlviz"));
        assert_eq!(
            expand_path("100%%-%h"),
            format!("100%-{}", crate::metadata::host_name())
        );
        assert_eq!(expand_path("plain%"), "plain%");
    }
}
