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
//! input's size. Each column chunk is encoded here, not by the parquet crate's generic column
//! writer (whose dictionary hashed every string of every row, the most of an export's time):
//! one Snappy-compressed data page (format v1) per chunk; numbers PLAIN, with min/max statistics
//! (what a reader skips row groups by); texts dictionary-encoded (a PLAIN dictionary page, then
//! `RLE_DICTIONARY` indices), the dictionary built by the address of the model's shared texts, so
//! a repeated name costs a lookup, not a hash of its bytes; definition levels of OPTIONAL columns
//! RLE. The crate writes the page headers and the file's metadata (`column`); `table` writes a
//! table's file a row group at a time.

mod column;
mod table;

use std::io;
use std::path::Path;

use rustc_hash::FxHashMap;

use crate::telemetry::{Arg, Lane, Process, Record, RecordSink, Span, Text};
use crate::telemetry::{LaneId, ProcessId};
use column::{Cell, Column, wrong_type};
use table::Table;

/// Rows per row group: what is held in memory before it is written (~10 MB of spans).
pub const ROW_GROUP: usize = 1 << 16;

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

fn opt_i32(v: Option<u32>) -> Cell<'static> {
    v.map_or(Cell::Null, |v| Cell::I32(v.min(i32::MAX as u32) as i32))
}

fn opt_text(v: Option<&str>) -> Cell<'_> {
    v.map_or(Cell::Null, Cell::Text)
}

fn ns(v: u64) -> Cell<'static> {
    Cell::I64(clamped(v))
}

/// A time, duration or id as a signed 64-bit integer (what engines read), clamped.
fn clamped(v: u64) -> i64 {
    v.min(i64::MAX as u64) as i64
}

/// A sink that writes the four tables of one input.
pub struct ParquetWriter {
    input: String,
    spans: Table,
    counters: Table,
    instants: Table,
    processes: Table,
    process_of: FxHashMap<ProcessId, Process>,
    lanes: FxHashMap<LaneId, Lane>,
    /// The lane of the last span row, while its first [`LANE_COLUMNS`] cells still hold.
    last_lane: Option<LaneId>,
    error: Option<io::Error>,
}

/// The span columns that follow from the lane (input, process, pid, host, rank, lane, thread,
/// thread_name): repeated, not looked up again, while spans of one lane follow one another.
const LANE_COLUMNS: usize = 8;

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
            process_of: FxHashMap::default(),
            lanes: FxHashMap::default(),
            last_lane: None,
            error: None,
        })
    }

    fn span_row(&mut self, s: &Span) -> io::Result<()> {
        // The lane's columns repeat the previous row's: not looked up (their cells are ignored).
        let same = self.last_lane == Some(s.lane) && self.spans.can_repeat();
        self.last_lane = Some(s.lane);
        let lane = (!same).then(|| self.lanes.get(&s.lane)).flatten();
        let process = lane.and_then(|l| self.process_of.get(&l.process));
        let (mut tensor, mut backend) = (None, None);
        for (key, value) in s.args.iter() {
            if let Arg::Str(text) = value {
                match key.as_str() {
                    "tensor" => tensor = tensor.or(Some(text)),
                    "backend" => backend = backend.or(Some(text)),
                    _ => {}
                }
            }
        }
        let table = &mut self.spans;
        table.begin_row(if same { LANE_COLUMNS } else { 0 })?;
        // Typed pushes, column by column in schema order (no row of cells to build and match):
        // spans are most of an export's rows.
        let c = &mut table.columns[..];
        let mut fits = true;
        if !same {
            let lane_cells = [
                Cell::Text(&self.input),
                Cell::I32(process.map_or(0, |p| p.id.0 as i32)),
                Cell::I64(process.map_or(0, |p| i64::from(p.pid))),
                Cell::Text(process.map_or("", |p| p.host.as_str())),
                opt_i32(process.and_then(|p| p.rank)),
                Cell::I32(s.lane.0 as i32),
                lane.and_then(|l| l.tid).map_or(Cell::Null, ns),
                Cell::Text(lane.map_or("", |l| l.name.as_str())),
            ];
            for (column, cell) in c.iter_mut().zip(&lane_cells) {
                column.push(cell)?;
            }
        }
        let opt_shared = |column: &mut Column, text: Option<&Text>| match text {
            Some(text) => column.shared(text),
            None => column.null(),
        };
        fits &= c[8].number(clamped(s.id));
        fits &= match s.parent {
            Some(parent) => c[9].number(clamped(parent)),
            None => c[9].null(),
        };
        fits &= c[10].number(s.depth as i32);
        fits &= c[11].shared(&s.name);
        fits &= c[12].shared(&s.category);
        fits &= opt_shared(&mut c[13], (s.category == "op").then_some(&s.name));
        fits &= opt_shared(&mut c[14], tensor);
        fits &= opt_shared(&mut c[15], backend);
        fits &= c[16].number(clamped(s.start_ns));
        fits &= c[17].number(clamped(s.duration_ns()));
        fits &= c[18].number(clamped(s.self_ns));
        if !fits {
            return Err(wrong_type());
        }
        table.end_row()
    }

    fn write(&mut self, record: Record) -> io::Result<()> {
        match record {
            Record::Process(p) => {
                self.last_lane = None;
                let row = [
                    Cell::Text(&self.input),
                    Cell::I32(p.id.0 as i32),
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
                self.last_lane = None;
                self.lanes.insert(l.id, l);
            }
            Record::Counter(c) => {
                let process = self.process_of.get(&c.process);
                let row = [
                    Cell::Text(&self.input),
                    Cell::I32(c.process.0 as i32),
                    Cell::I64(process.map_or(0, |p| i64::from(p.pid))),
                    Cell::Text(process.map_or("", |p| p.host.as_str())),
                    Cell::Text(&c.name),
                    ns(c.time_ns),
                    Cell::F64(c.value),
                ];
                self.counters.push(&row)?;
            }
            Record::Instant(i) => {
                let process = self.lanes.get(&i.lane).map_or(0, |l| l.process.0);
                let row = [
                    Cell::Text(&self.input),
                    Cell::I32(process as i32),
                    Cell::I32(i.lane.0 as i32),
                    Cell::Text(&i.name),
                    ns(i.time_ns),
                ];
                self.instants.push(&row)?;
            }
            // Its bytes are in the live-bytes counters' rows.
            Record::Buffer(_) | Record::Warning(_) | Record::Clock(_) => {}
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
    fn span(&mut self, span: &Span) {
        if self.error.is_none()
            && let Err(e) = self.span_row(span)
        {
            self.error = Some(e);
        }
    }

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
    use crate::telemetry::{LaneId, ProcessId};
    use parquet::file::reader::{FileReader, SerializedFileReader};
    use parquet::record::RowAccessor;
    use std::fs::File;

    /// Rows of alternating lanes, and of a lane renamed between two of its spans, carry their
    /// own lane's columns (which repeat the previous row's only while the lane does).
    #[test]
    fn each_row_has_its_own_lanes_columns() {
        let dir =
            std::env::temp_dir().join(format!("ggml-viz-parquet-lanes-{}", std::process::id()));
        let mut writer = ParquetWriter::create(&dir, "t").unwrap();
        let lane = |id: u32, name: &str| {
            Record::Lane(Lane {
                id: LaneId(id),
                process: ProcessId(0),
                tid: Some(u64::from(id) * 10),
                name: name.into(),
            })
        };
        let span = |i: u64, lane: u32| Span {
            id: i,
            parent: None,
            depth: 0,
            lane: LaneId(lane),
            name: "op".into(),
            category: "op".into(),
            start_ns: i,
            end_ns: i + 1,
            self_ns: 1,
            args: Args::default(),
        };
        writer.record(lane(1, "one"));
        writer.record(lane(2, "two"));
        let mut expected = Vec::new();
        for (i, l) in [1, 1, 2, 2, 1].into_iter().enumerate() {
            writer.span(&span(i as u64, l));
            expected.push((
                l as i32,
                i64::from(l) * 10,
                if l == 1 { "one" } else { "two" },
            ));
        }
        writer.record(lane(1, "renamed"));
        writer.span(&span(5, 1));
        expected.push((1, 10, "renamed"));
        writer.finish().unwrap();
        let file = File::open(dir.join("spans/t.parquet")).unwrap();
        let reader = SerializedFileReader::new(file).unwrap();
        let rows: Vec<(i32, i64, String)> = reader
            .get_row_iter(None)
            .unwrap()
            .map(|r| {
                let r = r.unwrap();
                (
                    r.get_int(5).unwrap(),
                    r.get_long(6).unwrap(),
                    r.get_string(7).unwrap().clone(),
                )
            })
            .collect();
        let expected: Vec<(i32, i64, String)> = expected
            .into_iter()
            .map(|(l, t, n)| (l, t, n.to_string()))
            .collect();
        assert_eq!(rows, expected);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Spans enough for several row groups, read back by the parquet crate's own reader: every
    /// row, in groups of at most `ROW_GROUP`, the text columns' shared values intact.
    #[test]
    fn many_spans_make_several_row_groups_with_every_row() {
        let dir = std::env::temp_dir().join(format!("ggml-viz-parquet-{}", std::process::id()));
        let mut writer = ParquetWriter::create(&dir, "t").unwrap();
        writer.record(Record::Lane(Lane {
            id: LaneId(1),
            process: ProcessId(0),
            tid: Some(7),
            name: "thread 7".into(),
        }));
        let n = 2 * ROW_GROUP as u64 + 123;
        let names: [Text; 3] = ["MUL_MAT".into(), "ADD".into(), "ROPE".into()];
        let args: Args = vec![("tensor".into(), Arg::Str("attn_out-5".into()))].into();
        for i in 0..n {
            writer.span(&Span {
                id: i + 1,
                parent: None,
                depth: 0,
                lane: LaneId(1),
                name: names[(i % 3) as usize].clone(),
                category: "op".into(),
                start_ns: 10 * i,
                end_ns: 10 * i + i % 7,
                self_ns: i % 7,
                args: args.clone(),
            });
        }
        assert_eq!(writer.finish().unwrap(), n);
        let file = File::open(dir.join("spans/t.parquet")).unwrap();
        let reader = SerializedFileReader::new(file).unwrap();
        let groups = reader.metadata().row_groups();
        assert_eq!(groups.len(), 3);
        assert!(groups.iter().all(|g| g.num_rows() as usize <= ROW_GROUP));
        // Each group's start_ns statistics: its first and last rows' (10 ns apart, in order).
        let mut first = 0;
        for g in groups {
            let Some(parquet::file::statistics::Statistics::Int64(stats)) =
                g.column(16).statistics()
            else {
                panic!("no int64 statistics for start_ns");
            };
            let last = first + g.num_rows() as u64 - 1;
            let want = (Some(10 * first as i64), Some(10 * last as i64));
            assert_eq!((stats.min_opt().copied(), stats.max_opt().copied()), want);
            first = last + 1;
        }
        let (mut rows, mut total, mut adds) = (0u64, 0i64, 0u64);
        for row in reader.get_row_iter(None).unwrap() {
            let row = row.unwrap();
            rows += 1;
            total += row.get_long(17).unwrap();
            assert_eq!(row.get_string(14).unwrap(), "attn_out-5");
            // The lane's columns, on every row (each row group's first included).
            assert_eq!(row.get_int(5).unwrap(), 1);
            assert_eq!(row.get_long(6).unwrap(), 7);
            assert_eq!(row.get_string(7).unwrap(), "thread 7");
            adds += u64::from(row.get_string(11).unwrap() == "ADD");
        }
        assert_eq!(rows, n);
        assert_eq!(total as u64, (0..n).map(|i| i % 7).sum::<u64>());
        assert_eq!(adds, (0..n).filter(|i| i % 3 == 1).count() as u64);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
