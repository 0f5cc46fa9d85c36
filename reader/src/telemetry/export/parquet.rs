//! Parquet, so that existing engines (DuckDB, Spark, pandas) query traces of any size: one file
//! per table per input, `DIR/<table>/<input>.parquet`, so that a directory of many hosts'
//! exports is one dataset (`read_parquet('DIR/spans/*.parquet')`).
//!
//! Tables and columns (times and durations are signed 64-bit nanoseconds: Spark refuses
//! nanosecond timestamps by default and reads unsigned 64-bit as decimal):
//! - `spans`: `input`, `process` (our id, unique in one export), `pid`, `host`, `rank`,
//!   `lane` (our id), `thread` (the OS thread id), `thread_name`, `id`, `parent`, `depth`, `name`,
//!   `category` (`graph`, `op`, `wait`, `llama`, …), `op` (ops: their op), `tensor`, `backend`,
//!   `start_ns`, `duration_ns`, `self_ns`;
//! - `counters`: `input`, `process`, `pid`, `host`, `name` (a buffer type's live bytes, a
//!   device's memory), `time_ns`, `value`;
//! - `instants`: `input`, `process`, `lane`, `name`, `time_ns`;
//! - `processes`: `input`, `process`, `pid`, `name`, `host`, `job_id`, `rank`, `local_rank`,
//!   `world_size`.
//!
//! Rows are written in row groups of [`ROW_GROUP`] rows, so memory stays bounded whatever the
//! input's size; pages are Snappy-compressed.

use std::collections::HashMap;
use std::fs::File;
use std::io::{self, BufWriter};
use std::path::Path;
use std::sync::Arc;

use rustc_hash::FxHashMap;

use parquet::basic::{Compression, Repetition, Type as Physical};
use parquet::data_type::{ByteArray, ByteArrayType, DoubleType, Int32Type, Int64Type};
use parquet::file::properties::{EnabledStatistics, WriterProperties};
use parquet::file::writer::SerializedFileWriter;
use parquet::schema::parser::parse_message_type;
use parquet::schema::types::ColumnPath;

use crate::telemetry::{Arg, ByAddress, Lane, Process, Record, RecordSink, Span, Text};

/// Rows per row group: what is held in memory before it is written (~30 MB of spans).
pub const ROW_GROUP: usize = 1 << 16;

/// Distinct strings a text column keeps made (names, tensors, hosts repeat on every row).
const KEPT_TEXTS: usize = 1 << 16;

const SPANS: &str = "message spans {
  REQUIRED BYTE_ARRAY input (UTF8); REQUIRED INT32 process; REQUIRED INT64 pid;
  REQUIRED BYTE_ARRAY host (UTF8); OPTIONAL INT32 rank; REQUIRED INT32 lane;
  OPTIONAL INT64 thread; REQUIRED BYTE_ARRAY thread_name (UTF8); REQUIRED INT64 id;
  OPTIONAL INT64 parent; REQUIRED INT32 depth; REQUIRED BYTE_ARRAY name (UTF8);
  REQUIRED BYTE_ARRAY category (UTF8); OPTIONAL BYTE_ARRAY op (UTF8);
  OPTIONAL BYTE_ARRAY tensor (UTF8); OPTIONAL BYTE_ARRAY backend (UTF8);
  REQUIRED INT64 start_ns; REQUIRED INT64 duration_ns; REQUIRED INT64 self_ns; }";
const COUNTERS: &str = "message counters {
  REQUIRED BYTE_ARRAY input (UTF8); REQUIRED INT32 process; REQUIRED INT64 pid;
  REQUIRED BYTE_ARRAY host (UTF8); REQUIRED BYTE_ARRAY name (UTF8); REQUIRED INT64 time_ns;
  REQUIRED DOUBLE value; }";
const INSTANTS: &str = "message instants {
  REQUIRED BYTE_ARRAY input (UTF8); REQUIRED INT32 process; REQUIRED INT32 lane;
  REQUIRED BYTE_ARRAY name (UTF8); REQUIRED INT64 time_ns; }";
const PROCESSES: &str = "message processes {
  REQUIRED BYTE_ARRAY input (UTF8); REQUIRED INT32 process; REQUIRED INT64 pid;
  REQUIRED BYTE_ARRAY name (UTF8); REQUIRED BYTE_ARRAY host (UTF8);
  OPTIONAL BYTE_ARRAY job_id (UTF8); OPTIONAL INT32 rank; OPTIONAL INT32 local_rank;
  OPTIONAL INT32 world_size; }";

/// One value of a row, in schema order.
enum Cell<'a> {
    I32(i32),
    I64(i64),
    F64(f64),
    Text(&'a str),
    /// A text of the model: its column value is found by the text's address.
    Shared(&'a Text),
    Null,
}

fn opt_i32(v: Option<u32>) -> Cell<'static> {
    v.map_or(Cell::Null, |v| Cell::I32(v.min(i32::MAX as u32) as i32))
}

fn opt_text(v: Option<&str>) -> Cell<'_> {
    v.map_or(Cell::Null, Cell::Text)
}

fn opt_shared(v: Option<&Text>) -> Cell<'_> {
    v.map_or(Cell::Null, Cell::Shared)
}

fn ns(v: u64) -> Cell<'static> {
    Cell::I64(v.min(i64::MAX as u64) as i64)
}

enum Values {
    Int32(Vec<i32>),
    Int64(Vec<i64>),
    Double(Vec<f64>),
    Text(Vec<ByteArray>),
}

struct Column {
    values: Values,
    /// Definition levels of an OPTIONAL column (1 = present).
    levels: Option<Vec<i16>>,
    /// A text column's values made so far: a repeated string is shared, not copied per row.
    texts: FxHashMap<Box<str>, ByteArray>,
    /// The same for the model's shared texts, found by their address.
    by_addr: ByAddress<ByteArray>,
}

/// `s` as a column value, shared with the rows before that hold it.
fn shared(texts: &mut FxHashMap<Box<str>, ByteArray>, s: &str) -> ByteArray {
    if let Some(b) = texts.get(s) {
        return b.clone();
    }
    if texts.len() >= KEPT_TEXTS {
        texts.clear();
    }
    let b = ByteArray::from(s);
    texts.insert(s.into(), b.clone());
    b
}

fn err(e: parquet::errors::ParquetError) -> io::Error {
    io::Error::other(e)
}

/// One Parquet file being written, a row group at a time.
struct Table {
    file: SerializedFileWriter<BufWriter<File>>,
    columns: Vec<Column>,
    rows: usize,
}

impl Table {
    fn create(path: &Path, schema: &str) -> io::Result<Table> {
        let schema = Arc::new(parse_message_type(schema).map_err(err)?);
        let columns = schema
            .get_fields()
            .iter()
            .map(|f| Column {
                values: match f.get_physical_type() {
                    Physical::INT32 => Values::Int32(Vec::new()),
                    Physical::INT64 => Values::Int64(Vec::new()),
                    Physical::DOUBLE => Values::Double(Vec::new()),
                    _ => Values::Text(Vec::new()),
                },
                levels: (f.get_basic_info().repetition() == Repetition::OPTIONAL).then(Vec::new),
                texts: FxHashMap::default(),
                by_addr: ByAddress::default(),
            })
            .collect();
        // Min/max statistics for the numbers (times, ids: what a reader skips row groups by),
        // not for the text columns, where computing them per value costs more than all else.
        // No dictionary for the numbers: times, durations and span ids hardly repeat (a row
        // group's dictionary would hold every value, interned one by one, for nothing), and the
        // few values of the others (process, lane, depth) compress as well without one.
        let props = schema
            .get_fields()
            .iter()
            .fold(
                WriterProperties::builder().set_compression(Compression::SNAPPY),
                |props, f| {
                    let column = ColumnPath::from(f.name());
                    if f.get_physical_type() == Physical::BYTE_ARRAY {
                        props.set_column_statistics_enabled(column, EnabledStatistics::None)
                    } else {
                        props.set_column_dictionary_enabled(column, false)
                    }
                },
            )
            .build();
        let props = Arc::new(props);
        let out = BufWriter::with_capacity(1 << 20, File::create(path)?);
        let file = SerializedFileWriter::new(out, schema, props).map_err(err)?;
        Ok(Table {
            file,
            columns,
            rows: 0,
        })
    }

    fn push(&mut self, row: &[Cell<'_>]) -> io::Result<()> {
        debug_assert_eq!(row.len(), self.columns.len());
        for (column, cell) in self.columns.iter_mut().zip(row) {
            let present = !matches!(cell, Cell::Null);
            if let Some(levels) = &mut column.levels {
                levels.push(i16::from(present));
            }
            match (&mut column.values, cell) {
                (_, Cell::Null) => {}
                (Values::Int32(v), Cell::I32(x)) => v.push(*x),
                (Values::Int64(v), Cell::I64(x)) => v.push(*x),
                (Values::Double(v), Cell::F64(x)) => v.push(*x),
                (Values::Text(v), Cell::Text(x)) => v.push(shared(&mut column.texts, x)),
                (Values::Text(v), Cell::Shared(x)) => {
                    let value = match column.by_addr.get(x) {
                        Some(value) => value.clone(),
                        None => {
                            let value = shared(&mut column.texts, x);
                            column.by_addr.insert(x, value.clone());
                            value
                        }
                    };
                    v.push(value)
                }
                _ => return Err(io::Error::other("a cell of the wrong type for its column")),
            }
        }
        self.rows += 1;
        if self.rows.is_multiple_of(ROW_GROUP) {
            self.flush()?;
        }
        Ok(())
    }

    /// Writes the rows buffered as one row group.
    fn flush(&mut self) -> io::Result<()> {
        let buffered = self
            .columns
            .first()
            .map_or(0, |c| match (&c.levels, &c.values) {
                (Some(l), _) => l.len(),
                (None, Values::Int32(v)) => v.len(),
                (None, Values::Int64(v)) => v.len(),
                (None, Values::Double(v)) => v.len(),
                (None, Values::Text(v)) => v.len(),
            });
        if buffered == 0 {
            return Ok(());
        }
        let mut group = self.file.next_row_group().map_err(err)?;
        let mut columns = self.columns.iter_mut();
        while let Some(mut writer) = group.next_column().map_err(err)? {
            let column = columns
                .next()
                .ok_or_else(|| io::Error::other("more columns than the schema"))?;
            let levels = column.levels.as_deref();
            match &mut column.values {
                Values::Int32(v) => writer.typed::<Int32Type>().write_batch(v, levels, None),
                Values::Int64(v) => writer.typed::<Int64Type>().write_batch(v, levels, None),
                Values::Double(v) => writer.typed::<DoubleType>().write_batch(v, levels, None),
                Values::Text(v) => writer.typed::<ByteArrayType>().write_batch(v, levels, None),
            }
            .map_err(err)?;
            writer.close().map_err(err)?;
            match &mut column.values {
                Values::Int32(v) => v.clear(),
                Values::Int64(v) => v.clear(),
                Values::Double(v) => v.clear(),
                Values::Text(v) => v.clear(),
            }
            if let Some(l) = &mut column.levels {
                l.clear();
            }
        }
        group.close().map_err(err)?;
        Ok(())
    }

    fn finish(mut self) -> io::Result<u64> {
        self.flush()?;
        self.file.close().map_err(err)?;
        Ok(self.rows as u64)
    }
}

/// A sink that writes the four tables of one input.
pub struct ParquetWriter {
    input: String,
    spans: Table,
    counters: Table,
    instants: Table,
    processes: Table,
    process_of: HashMap<u32, Process>,
    lanes: HashMap<u32, Lane>,
    error: Option<io::Error>,
}

impl ParquetWriter {
    /// Creates `dir/<table>/<input>.parquet` for each table.
    pub fn create(dir: &Path, input: &str) -> io::Result<ParquetWriter> {
        let table = |name: &str, schema: &str| -> io::Result<Table> {
            let sub = dir.join(name);
            std::fs::create_dir_all(&sub)?;
            Table::create(&sub.join(format!("{input}.parquet")), schema)
        };
        Ok(ParquetWriter {
            input: input.to_string(),
            spans: table("spans", SPANS)?,
            counters: table("counters", COUNTERS)?,
            instants: table("instants", INSTANTS)?,
            processes: table("processes", PROCESSES)?,
            process_of: HashMap::new(),
            lanes: HashMap::new(),
            error: None,
        })
    }

    fn span(&mut self, s: &Span) -> io::Result<()> {
        let lane = self.lanes.get(&s.lane);
        let process = lane.and_then(|l| self.process_of.get(&l.process));
        let arg = |key: &str| {
            s.args
                .iter()
                .find(|(k, _)| k == key)
                .and_then(|(_, v)| match v {
                    Arg::Str(text) => Some(text),
                    _ => None,
                })
        };
        let row = [
            Cell::Text(&self.input),
            Cell::I32(process.map_or(0, |p| p.id as i32)),
            Cell::I64(process.map_or(0, |p| i64::from(p.pid))),
            Cell::Text(process.map_or("", |p| p.host.as_str())),
            opt_i32(process.and_then(|p| p.rank)),
            Cell::I32(s.lane as i32),
            lane.and_then(|l| l.tid)
                .map_or(Cell::Null, |t| Cell::I64(t.min(i64::MAX as u64) as i64)),
            Cell::Text(lane.map_or("", |l| l.name.as_str())),
            ns(s.id),
            s.parent.map_or(Cell::Null, ns),
            Cell::I32(s.depth as i32),
            Cell::Shared(&s.name),
            Cell::Shared(&s.category),
            opt_shared((s.category == "op").then_some(&s.name)),
            opt_shared(arg("tensor")),
            opt_shared(arg("backend")),
            ns(s.start_ns),
            ns(s.duration_ns()),
            ns(s.self_ns),
        ];
        self.spans.push(&row)
    }

    fn write(&mut self, record: Record) -> io::Result<()> {
        match record {
            Record::Process(p) => {
                let row = [
                    Cell::Text(&self.input),
                    Cell::I32(p.id as i32),
                    Cell::I64(i64::from(p.pid)),
                    Cell::Text(&p.name),
                    Cell::Text(&p.host),
                    opt_text(p.job_id.as_deref()),
                    opt_i32(p.rank),
                    opt_i32(p.local_rank),
                    opt_i32(p.world_size),
                ];
                self.processes.push(&row)?;
                self.process_of.insert(p.id, p);
            }
            Record::Lane(l) => {
                self.lanes.insert(l.id, l);
            }
            Record::Span(s) => self.span(&s)?,
            Record::Counter(c) => {
                let process = self.process_of.get(&c.process);
                let row = [
                    Cell::Text(&self.input),
                    Cell::I32(c.process as i32),
                    Cell::I64(process.map_or(0, |p| i64::from(p.pid))),
                    Cell::Text(process.map_or("", |p| p.host.as_str())),
                    Cell::Text(&c.name),
                    ns(c.time_ns),
                    Cell::F64(c.value),
                ];
                self.counters.push(&row)?;
            }
            Record::Instant(i) => {
                let process = self.lanes.get(&i.lane).map_or(0, |l| l.process);
                let row = [
                    Cell::Text(&self.input),
                    Cell::I32(process as i32),
                    Cell::I32(i.lane as i32),
                    Cell::Text(&i.name),
                    ns(i.time_ns),
                ];
                self.instants.push(&row)?;
            }
            Record::Warning(_) | Record::Clock(_) => {}
        }
        Ok(())
    }

    /// Closes the four files; returns the rows written.
    pub fn finish(self) -> io::Result<u64> {
        if let Some(e) = self.error {
            return Err(e);
        }
        Ok(self.spans.finish()?
            + self.counters.finish()?
            + self.instants.finish()?
            + self.processes.finish()?)
    }
}

impl RecordSink for ParquetWriter {
    fn record(&mut self, record: Record) {
        if self.error.is_none()
            && let Err(e) = self.write(record)
        {
            self.error = Some(e);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::telemetry::{Arg, Args, Text};
    use parquet::file::reader::{FileReader, SerializedFileReader};
    use parquet::record::RowAccessor;

    /// Spans enough for several row groups, read back by the parquet crate's own reader: every
    /// row, in groups of at most `ROW_GROUP`, the text columns' shared values intact.
    #[test]
    fn many_spans_make_several_row_groups_with_every_row() {
        let dir = std::env::temp_dir().join(format!("ggml-viz-parquet-{}", std::process::id()));
        let mut writer = ParquetWriter::create(&dir, "t").unwrap();
        writer.record(Record::Lane(Lane {
            id: 1,
            process: 0,
            tid: Some(7),
            name: "thread 7".into(),
        }));
        let n = 2 * ROW_GROUP as u64 + 123;
        let names: [Text; 3] = ["MUL_MAT".into(), "ADD".into(), "ROPE".into()];
        let args: Args = vec![("tensor".into(), Arg::Str("attn_out-5".into()))].into();
        for i in 0..n {
            writer.record(Record::Span(Span {
                id: i + 1,
                parent: None,
                depth: 0,
                lane: 1,
                name: names[(i % 3) as usize].clone(),
                category: "op".into(),
                start_ns: 10 * i,
                end_ns: 10 * i + i % 7,
                self_ns: i % 7,
                args: args.clone(),
            }));
        }
        assert_eq!(writer.finish().unwrap(), n);
        let file = File::open(dir.join("spans/t.parquet")).unwrap();
        let reader = SerializedFileReader::new(file).unwrap();
        let groups = reader.metadata().row_groups();
        assert_eq!(groups.len(), 3);
        assert!(groups.iter().all(|g| g.num_rows() as usize <= ROW_GROUP));
        let (mut rows, mut total, mut adds) = (0u64, 0i64, 0u64);
        for row in reader.get_row_iter(None).unwrap() {
            let row = row.unwrap();
            rows += 1;
            total += row.get_long(17).unwrap();
            assert_eq!(row.get_string(14).unwrap(), "attn_out-5");
            adds += u64::from(row.get_string(11).unwrap() == "ADD");
        }
        assert_eq!(rows, n);
        assert_eq!(total as u64, (0..n).map(|i| i % 7).sum::<u64>());
        assert_eq!(adds, (0..n).filter(|i| i % 3 == 1).count() as u64);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
