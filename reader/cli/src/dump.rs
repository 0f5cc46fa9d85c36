//! `ggml-viz dump`: every event, in file order.

use std::io::{self, BufWriter, Write};
use std::path::PathBuf;

use clap::{Args, ValueEnum};
use ggml_viz_reader::format::{EventType, Payload};
use ggml_viz_reader::{Event, Layout};
use serde_json::{Map, Value, json};

use crate::input::{Input, parse_layout};
use crate::say::Failure;

/// Print every event of a trace, in file order.
///
/// The jsonl format prints one JSON object per line with the keys type, type_code,
/// timestamp_ns, thread_id and label, plus graph_ptr, n_nodes, n_threads, backend_ptr for graph
/// events; tensor_ptr, op_type, op_size, backend_ptr for op events; ptr, size for memory events;
/// object_ptr, thread_index, n_threads, value for barrier waits and thread events (for a wait,
/// value is its duration in nanoseconds; reader/format/FORMAT.md). Integers are exact over the full u64
/// range. Types outside the spec (ggml-viz extension records among them) print as type
/// "unknown" with their type_code.
///
/// Exit status: 0 for a clean file or one whose only damage is a truncated tail (warning on
/// stderr); 2 for a corrupt or unreadable file, after printing every event before the damage.
#[derive(Args)]
#[command(
    after_help = "Examples:\n  ggml-viz dump trace.ggmlviz\n  ggml-viz dump --to jsonl trace.ggmlviz > events.jsonl\n  cat trace.ggmlviz | ggml-viz dump --to jsonl -"
)]
pub struct DumpArgs {
    /// Trace file, or - for standard input.
    file: PathBuf,
    /// What to write, as `export --to` names it.
    // Also `--format`, hidden: its name before, kept for the scripts that used it (elsewhere
    // `--format` names an input's format).
    #[arg(long = "to", alias = "format", value_enum, default_value_t = DumpStyle::Text)]
    format: DumpStyle,
    /// Read with this event layout instead of detecting it (packed: the spec's; padded: the C++ tool's).
    #[arg(long, value_parser = parse_layout)]
    layout: Option<Layout>,
}

#[derive(Clone, Copy, ValueEnum)]
enum DumpStyle {
    /// One line per event, for people.
    Text,
    /// One JSON object per line, for programs.
    Jsonl,
}

pub fn run(args: DumpArgs) -> Result<(), Failure> {
    let input = Input::open(&args.file, args.layout).map_err(Failure::Data)?;
    let mut out = BufWriter::with_capacity(1 << 16, io::stdout().lock());
    let (stop, _) = input.for_each(args.layout, |event| match args.format {
        DumpStyle::Jsonl => {
            serde_json::to_writer(&mut out, &jsonl_object(&event))?;
            out.write_all(b"\n")
        }
        DumpStyle::Text => write_text(&mut out, &event),
    })?;
    out.flush()?;
    match stop {
        Some(stop) if stop.is_warning() => {
            eprintln!("ggml-viz: warning: {}", stop.describe(&input.name()));
            Ok(())
        }
        Some(stop) => Err(Failure::Data(stop.describe(&input.name()))),
        None => Ok(()),
    }
}

/// The name `dump` prints for a type code.
pub fn type_name(event: &Event<'_>) -> &'static str {
    event.event_type().map_or("unknown", EventType::name)
}

/// The JSON object of the `dump --to jsonl` contract.
pub fn jsonl_object(event: &Event<'_>) -> Value {
    let mut obj = Map::new();
    obj.insert("type".into(), json!(type_name(event)));
    obj.insert("type_code".into(), json!(event.type_code));
    obj.insert("timestamp_ns".into(), json!(event.timestamp_ns));
    obj.insert("thread_id".into(), json!(event.thread_id));
    obj.insert("label".into(), json!(event.label_str()));
    match (event.event_type(), event.payload) {
        (
            Some(_),
            Payload::Graph {
                graph_ptr,
                n_nodes,
                n_threads,
                backend_ptr,
            },
        ) => {
            obj.insert("graph_ptr".into(), json!(graph_ptr));
            obj.insert("n_nodes".into(), json!(n_nodes));
            obj.insert("n_threads".into(), json!(n_threads));
            obj.insert("backend_ptr".into(), json!(backend_ptr));
        }
        (
            Some(_),
            Payload::Op {
                tensor_ptr,
                op_type,
                op_size,
                backend_ptr,
            },
        ) => {
            obj.insert("tensor_ptr".into(), json!(tensor_ptr));
            obj.insert("op_type".into(), json!(op_type));
            obj.insert("op_size".into(), json!(op_size));
            obj.insert("backend_ptr".into(), json!(backend_ptr));
        }
        (Some(_), Payload::Memory { ptr, size }) => {
            obj.insert("ptr".into(), json!(ptr));
            obj.insert("size".into(), json!(size));
        }
        (
            Some(_),
            Payload::Thread {
                object_ptr,
                thread_index,
                n_threads,
                value,
            },
        ) => {
            obj.insert("object_ptr".into(), json!(object_ptr));
            obj.insert("thread_index".into(), json!(thread_index));
            obj.insert("n_threads".into(), json!(n_threads));
            obj.insert("value".into(), json!(value));
        }
        _ => {}
    }
    Value::Object(obj)
}

fn write_text(out: &mut impl Write, event: &Event<'_>) -> io::Result<()> {
    write!(
        out,
        "{:>20} tid={:<8} ",
        event.timestamp_ns, event.thread_id
    )?;
    match event.payload {
        Payload::Graph {
            graph_ptr,
            n_nodes,
            n_threads,
            backend_ptr,
        } => write!(
            out,
            "{:<20} graph={graph_ptr:#x} nodes={n_nodes} threads={n_threads} backend={backend_ptr:#x}",
            type_name(event)
        )?,
        Payload::Op {
            tensor_ptr,
            op_type,
            op_size,
            backend_ptr,
        } => write!(
            out,
            "{:<20} tensor={tensor_ptr:#x} op={op_type} size={op_size} backend={backend_ptr:#x}",
            type_name(event)
        )?,
        Payload::Memory { ptr, size } => {
            write!(out, "{:<20} ptr={ptr:#x} size={size}", type_name(event))?
        }
        Payload::Thread {
            object_ptr,
            thread_index,
            n_threads,
            value,
        } => write!(
            out,
            "{:<20} object={object_ptr:#x} index={thread_index} threads={n_threads} value={value}",
            type_name(event)
        )?,
        Payload::Extension(ext) => write!(out, "{:<20}", format!("ext:{}", ext.kind.name()))?,
        Payload::Unknown { .. } => write!(out, "{:<20}", format!("unknown({})", event.type_code))?,
    }
    match event.label_str() {
        Some(label) => writeln!(out, " {label:?}"),
        None => writeln!(out),
    }
}
