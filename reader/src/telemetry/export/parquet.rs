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
//! RLE. The crate writes the page headers and the file's metadata.

use std::fs::File;
use std::io::{self, BufWriter};
use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use rustc_hash::FxHashMap;

use parquet::basic::{Compression, Encoding, Repetition, Type as Physical};
use parquet::column::page::{CompressedPage, Page, PageWriter};
use parquet::column::writer::ColumnCloseResult;
use parquet::file::metadata::ColumnChunkMetaData;
use parquet::file::properties::WriterProperties;
use parquet::file::statistics::Statistics;
use parquet::file::writer::{SerializedFileWriter, SerializedPageWriter, TrackedWrite};
use parquet::schema::parser::parse_message_type;
use parquet::schema::types::ColumnDescPtr;

use crate::telemetry::{Arg, ByAddress, Lane, Process, Record, RecordSink, Span, Text};

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

/// One value of a row, in schema order.
enum Cell<'a> {
    I32(i32),
    I64(i64),
    F64(f64),
    Text(&'a str),
    Null,
}

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

fn wrong_type() -> io::Error {
    io::Error::other("a cell of the wrong type for its column")
}

fn err(e: parquet::errors::ParquetError) -> io::Error {
    io::Error::other(e)
}

/// The distinct texts of one column chunk, in the order of first sight: a value is its index.
struct Dictionary {
    /// The texts PLAIN-encoded (each a 4-byte little-endian length, then its bytes): the
    /// dictionary page as it is written.
    plain: Vec<u8>,
    /// Where each text's bytes begin in `plain`.
    plain_at: Vec<usize>,
    len: u32,
    by_text: FxHashMap<Box<str>, u32>,
    /// The model's shared texts' indices, by address.
    by_addr: ByAddress<u32>,
    /// The last other text's index and where its bytes lie in `plain`: the same for the input's
    /// name or a process's host on every row.
    last_str: Option<(u32, usize, usize)>,
}

impl Dictionary {
    fn new() -> Dictionary {
        Dictionary {
            plain: Vec::new(),
            plain_at: Vec::new(),
            len: 0,
            by_text: FxHashMap::default(),
            by_addr: ByAddress::default(),
            last_str: None,
        }
    }

    fn index(&mut self, s: &str) -> u32 {
        if let Some((i, from, to)) = self.last_str
            && &self.plain[from..to] == s.as_bytes()
        {
            return i;
        }
        let i = self.interned(s);
        let at = self.plain_at[i as usize];
        self.last_str = Some((i, at, at + s.len()));
        i
    }

    /// `s`'s index, added if new.
    fn interned(&mut self, s: &str) -> u32 {
        if let Some(&i) = self.by_text.get(s) {
            return i;
        }
        let i = self.len;
        self.len += 1;
        self.plain
            .extend_from_slice(&(s.len() as u32).to_le_bytes());
        self.plain_at.push(self.plain.len());
        self.plain.extend_from_slice(s.as_bytes());
        self.by_text.insert(s.into(), i);
        i
    }

    fn shared_index(&mut self, t: &Text) -> u32 {
        if let Some(i) = self.by_addr.get(t) {
            return i;
        }
        let i = self.interned(t);
        self.by_addr.insert(t, i);
        i
    }

    fn clear(&mut self) {
        self.plain.clear();
        self.plain_at.clear();
        self.len = 0;
        self.by_text.clear();
        self.by_addr.clear();
        self.last_str = None;
    }
}

/// A column's values in the row group being built.
enum Values {
    Int32(Vec<i32>),
    Int64(Vec<i64>),
    Double(Vec<f64>),
    /// Each value's index in the dictionary.
    Text(Vec<u32>, Box<Dictionary>),
}

struct Column {
    descr: ColumnDescPtr,
    /// An OPTIONAL column's definition levels: whether each row has a value.
    present: Option<Vec<u32>>,
    values: Values,
}

/// Appends `values` to `out` in the RLE / bit-packing hybrid encoding, `width` bits a value:
/// a run of 8 or more equal values as one RLE run, the rest bit-packed in groups of 8 (at most
/// 63 groups a run, as parquet-mr writes them; the last group padded with zeros).
fn rle_hybrid(values: &[u32], width: u8, out: &mut Vec<u8>) {
    const MAX_GROUPS: usize = 63;
    let value_bytes = usize::from(width).div_ceil(8);
    let mut at = 0;
    // Where the pending bit-packed groups begin.
    let mut packed_from = 0;
    let flush_packed = |out: &mut Vec<u8>, from: usize, to: usize| {
        for run in values[from..to].chunks(8 * MAX_GROUPS) {
            let groups = run.len().div_ceil(8);
            varint(out, ((groups as u64) << 1) | 1);
            let (mut acc, mut bits) = (0u64, 0u32);
            for i in 0..groups * 8 {
                acc |= u64::from(run.get(i).copied().unwrap_or(0)) << bits;
                bits += u32::from(width);
                while bits >= 8 {
                    out.push(acc as u8);
                    acc >>= 8;
                    bits -= 8;
                }
            }
        }
    };
    while at < values.len() {
        let v = values[at];
        let run = values[at..].iter().take_while(|&&x| x == v).count();
        if run >= 8 {
            flush_packed(out, packed_from, at);
            varint(out, (run as u64) << 1);
            out.extend_from_slice(&v.to_le_bytes()[..value_bytes]);
            at += run;
            packed_from = at;
        } else {
            at = (at + 8).min(values.len());
        }
    }
    flush_packed(out, packed_from, values.len());
}

fn varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// Bits a value up to `max` needs (at least 1).
fn width_of(max: u32) -> u8 {
    (32 - max.leading_zeros()).max(1) as u8
}

/// Appends `v` PLAIN-encoded (`bytes` of each, one after another) to `page`; their min and max
/// (`None` when empty).
fn plain<T: Plain, const N: usize>(
    v: &[T],
    bytes: fn(T) -> [u8; N],
    page: &mut Vec<u8>,
) -> (Option<T>, Option<T>) {
    debug_assert_eq!(size_of::<T>(), N);
    if cfg!(target_endian = "little") {
        // SAFETY: `T` is a plain number (the `Plain` contract): its `v.len() * N` bytes are
        // initialised, without padding, and on a little-endian machine they are what
        // `to_le_bytes` gives, one value after another.
        page.extend_from_slice(unsafe {
            std::slice::from_raw_parts(v.as_ptr().cast::<u8>(), std::mem::size_of_val(v))
        });
    } else {
        for &x in v {
            page.extend_from_slice(&bytes(x));
        }
    }
    let mut it = v.iter().copied();
    let Some(first) = it.next() else {
        return (None, None);
    };
    let (min, max) = it.fold((first, first), |(lo, hi), x| {
        (if x < lo { x } else { lo }, if x > hi { x } else { hi })
    });
    (Some(min), Some(max))
}

/// The numbers of number columns, which a PLAIN page holds as their little-endian bytes: `i32`,
/// `i64`, `f64`.
///
/// # Safety
/// Implemented only for primitive numbers: no padding, every byte initialised.
unsafe trait Plain: Copy + PartialOrd {
    /// A column's values, if they are of this type.
    fn values(values: &mut Values) -> Option<&mut Vec<Self>>;
}

/// `Plain` for a primitive number and the `Values` variant of its columns.
macro_rules! plain {
    ($($number:ty: $variant:ident),*) => {$(
        // SAFETY: a primitive number.
        unsafe impl Plain for $number {
            fn values(values: &mut Values) -> Option<&mut Vec<$number>> {
                match values {
                    Values::$variant(v) => Some(v),
                    _ => None,
                }
            }
        }
    )*};
}

plain!(i32: Int32, i64: Int64, f64: Double);

impl Column {
    fn push(&mut self, cell: &Cell<'_>) -> io::Result<()> {
        let fits = match *cell {
            Cell::I32(x) => self.number(x),
            Cell::I64(x) => self.number(x),
            Cell::F64(x) => self.number(x),
            Cell::Text(x) => self.text(x),
            Cell::Null => self.null(),
        };
        if fits { Ok(()) } else { Err(wrong_type()) }
    }

    /// A value present in this row (an OPTIONAL column's level 1).
    #[inline]
    fn present(&mut self) {
        if let Some(levels) = &mut self.present {
            levels.push(1);
        }
    }

    /// The typed pushes: false (nothing pushed) when the column is of another type.
    #[inline]
    fn number<T: Plain>(&mut self, x: T) -> bool {
        let Some(v) = T::values(&mut self.values) else {
            return false;
        };
        v.push(x);
        self.present();
        true
    }

    #[inline]
    fn text(&mut self, x: &str) -> bool {
        self.dictionary(|d| d.index(x))
    }

    /// A text of the model, found in the column's dictionary by its address.
    #[inline]
    fn shared(&mut self, x: &Text) -> bool {
        self.dictionary(|d| d.shared_index(x))
    }

    /// A text column's push of the index `index` gives.
    #[inline(always)]
    fn dictionary(&mut self, index: impl FnOnce(&mut Dictionary) -> u32) -> bool {
        let Values::Text(v, d) = &mut self.values else {
            return false;
        };
        v.push(index(d));
        self.present();
        true
    }

    /// No value in this row: only an OPTIONAL column takes it.
    #[inline]
    fn null(&mut self) -> bool {
        let Some(levels) = &mut self.present else {
            return false;
        };
        levels.push(0);
        true
    }

    /// The previous row's value again, `n` times (there is one in this row group).
    fn repeat(&mut self, n: usize) {
        if let Some(levels) = &mut self.present {
            let present = levels.last().copied().unwrap_or(0);
            levels.resize(levels.len() + n, present);
            if present == 0 {
                return;
            }
        }
        fn again<T: Copy>(v: &mut Vec<T>, n: usize) {
            if let Some(&last) = v.last() {
                v.resize(v.len() + n, last);
            }
        }
        match &mut self.values {
            Values::Int32(v) => again(v, n),
            Values::Int64(v) => again(v, n),
            Values::Double(v) => again(v, n),
            Values::Text(v, _) => again(v, n),
        }
    }

    /// The row group's chunk of this column, encoded, and its metadata; the column is then
    /// emptied for the next group.
    fn chunk(
        &mut self,
        rows: usize,
        scratch: &mut Scratch,
    ) -> io::Result<(Bytes, ColumnCloseResult)> {
        let Scratch {
            snappy,
            page,
            compressed: out,
        } = scratch;
        let mut sink = TrackedWrite::new(Vec::new());
        let mut pages = SerializedPageWriter::new(&mut sink);
        let (mut compressed, mut uncompressed) = (0, 0);
        let mut compress = |page: &[u8]| -> io::Result<Bytes> {
            let need = snap::raw::max_compress_len(page.len());
            if out.len() < need {
                out.resize(need, 0);
            }
            let len = snappy.compress(page, out).map_err(io::Error::other)?;
            Ok(Bytes::copy_from_slice(&out[..len]))
        };
        let mut dictionary_at = None;
        let mut encodings = vec![Encoding::PLAIN, Encoding::RLE];
        if let Values::Text(_, d) = &self.values {
            let page = Page::DictionaryPage {
                buf: compress(&d.plain)?,
                num_values: d.len,
                encoding: Encoding::PLAIN,
                is_sorted: false,
            };
            let spec = pages
                .write_page(CompressedPage::new(page, d.plain.len()))
                .map_err(err)?;
            dictionary_at = Some(spec.offset as i64);
            compressed += spec.compressed_size;
            uncompressed += spec.uncompressed_size;
            encodings.push(Encoding::RLE_DICTIONARY);
        }
        page.clear();
        let mut nulls = 0;
        if let Some(levels) = &self.present {
            let mut encoded = Vec::new();
            rle_hybrid(levels, 1, &mut encoded);
            page.extend_from_slice(&(encoded.len() as u32).to_le_bytes());
            page.extend_from_slice(&encoded);
            nulls = levels.iter().filter(|&&l| l == 0).count() as u64;
        }
        let (encoding, statistics) = match &self.values {
            Values::Int32(v) => {
                let (lo, hi) = plain(v, i32::to_le_bytes, page);
                let stats = Statistics::int32(lo, hi, None, Some(nulls), false);
                (Encoding::PLAIN, Some(stats))
            }
            Values::Int64(v) => {
                let (lo, hi) = plain(v, i64::to_le_bytes, page);
                let stats = Statistics::int64(lo, hi, None, Some(nulls), false);
                (Encoding::PLAIN, Some(stats))
            }
            Values::Double(v) => {
                let (lo, hi) = plain(v, f64::to_le_bytes, page);
                let stats = Statistics::double(lo, hi, None, Some(nulls), false);
                (Encoding::PLAIN, Some(stats))
            }
            Values::Text(v, d) => {
                let width = width_of(d.len.saturating_sub(1));
                page.push(width);
                rle_hybrid(v, width, page);
                (Encoding::RLE_DICTIONARY, None)
            }
        };
        let data = Page::DataPage {
            buf: compress(page)?,
            num_values: rows as u32,
            encoding,
            def_level_encoding: Encoding::RLE,
            rep_level_encoding: Encoding::RLE,
            statistics: None,
        };
        let spec = pages
            .write_page(CompressedPage::new(data, page.len()))
            .map_err(err)?;
        compressed += spec.compressed_size;
        uncompressed += spec.uncompressed_size;
        pages.close().map_err(err)?;
        let mut metadata = ColumnChunkMetaData::builder(self.descr.clone())
            .set_encodings(encodings)
            .set_compression(Compression::SNAPPY)
            .set_num_values(rows as i64)
            .set_total_compressed_size(compressed as i64)
            .set_total_uncompressed_size(uncompressed as i64)
            .set_data_page_offset(spec.offset as i64)
            .set_dictionary_page_offset(dictionary_at);
        if let Some(statistics) = statistics {
            metadata = metadata.set_statistics(statistics);
        }
        let metadata = metadata.build().map_err(err)?;
        let bytes_written = sink.bytes_written() as u64;
        let chunk = Bytes::from(sink.into_inner().map_err(err)?);
        self.clear();
        Ok((
            chunk,
            ColumnCloseResult {
                bytes_written,
                rows_written: rows as u64,
                metadata,
                bloom_filter: None,
                column_index: None,
                offset_index: None,
            },
        ))
    }

    fn clear(&mut self) {
        if let Some(levels) = &mut self.present {
            levels.clear();
        }
        match &mut self.values {
            Values::Int32(v) => v.clear(),
            Values::Int64(v) => v.clear(),
            Values::Double(v) => v.clear(),
            Values::Text(v, d) => {
                v.clear();
                d.clear();
            }
        }
    }
}

/// Buffers a table reuses from chunk to chunk: the Snappy encoder, a page as built, compressed.
struct Scratch {
    snappy: snap::raw::Encoder,
    page: Vec<u8>,
    compressed: Vec<u8>,
}

/// One Parquet file being written, a row group at a time.
struct Table {
    file: SerializedFileWriter<BufWriter<File>>,
    columns: Vec<Column>,
    /// Rows buffered for the next row group, and all rows pushed.
    buffered: usize,
    rows: u64,
    /// The last rows pushed whose first `repeat_width` cells repeat the row before them: not
    /// yet put into those columns (done at once, by [`Table::apply_repeats`]).
    repeats: usize,
    repeat_width: usize,
    scratch: Scratch,
}

impl Table {
    fn create(path: &Path, schema: &str) -> io::Result<Table> {
        let schema = Arc::new(parse_message_type(schema).map_err(err)?);
        let props = Arc::new(WriterProperties::builder().build());
        let out = BufWriter::with_capacity(1 << 20, File::create(path)?);
        let file = SerializedFileWriter::new(out, schema, props).map_err(err)?;
        let descr = file.schema_descr();
        let columns = (0..descr.num_columns())
            .map(|i| {
                let descr = descr.column(i);
                Column {
                    present: (descr.self_type().get_basic_info().repetition()
                        == Repetition::OPTIONAL)
                        .then(Vec::new),
                    values: match descr.physical_type() {
                        Physical::INT32 => Values::Int32(Vec::new()),
                        Physical::INT64 => Values::Int64(Vec::new()),
                        Physical::DOUBLE => Values::Double(Vec::new()),
                        _ => Values::Text(Vec::new(), Box::new(Dictionary::new())),
                    },
                    descr,
                }
            })
            .collect();
        Ok(Table {
            file,
            columns,
            buffered: 0,
            rows: 0,
            repeats: 0,
            repeat_width: 0,
            scratch: Scratch {
                snappy: snap::raw::Encoder::new(),
                page: Vec::new(),
                compressed: Vec::new(),
            },
        })
    }

    fn push(&mut self, row: &[Cell<'_>]) -> io::Result<()> {
        debug_assert_eq!(row.len(), self.columns.len());
        self.begin_row(0)?;
        for (column, cell) in self.columns.iter_mut().zip(row) {
            column.push(cell)?;
        }
        self.end_row()
    }

    /// Whether a row can repeat cells of the previous one: a row group has begun.
    fn can_repeat(&self) -> bool {
        self.buffered > 0
    }

    /// Begins a row whose first `same` cells are known to equal the previous row's: those are
    /// repeated from it, and the caller pushes the others, one to each column after them (with
    /// [`Column`]'s typed pushes), then calls [`Table::end_row`]. Only where
    /// [`Table::can_repeat`], or `same` is 0.
    #[inline]
    fn begin_row(&mut self, same: usize) -> io::Result<()> {
        if same > 0 && !self.can_repeat() {
            return Err(io::Error::other("no previous row to repeat"));
        }
        if same != self.repeat_width {
            self.apply_repeats();
            self.repeat_width = same;
        }
        if same > 0 {
            self.repeats += 1;
        }
        Ok(())
    }

    /// The row begun is complete: a row group is written when it is full.
    #[inline]
    fn end_row(&mut self) -> io::Result<()> {
        self.buffered += 1;
        self.rows += 1;
        if self.buffered == ROW_GROUP {
            self.flush()?;
        }
        Ok(())
    }

    /// Puts the repeated cells of the rows pushed since the last call into their columns.
    fn apply_repeats(&mut self) {
        let n = std::mem::take(&mut self.repeats);
        if n > 0 {
            for column in &mut self.columns[..self.repeat_width] {
                column.repeat(n);
            }
        }
    }

    /// Writes the rows buffered as one row group.
    fn flush(&mut self) -> io::Result<()> {
        if self.buffered == 0 {
            return Ok(());
        }
        self.apply_repeats();
        let mut group = self.file.next_row_group().map_err(err)?;
        for column in &mut self.columns {
            let (chunk, close) = column.chunk(self.buffered, &mut self.scratch)?;
            group.append_column(&chunk, close).map_err(err)?;
        }
        group.close().map_err(err)?;
        self.buffered = 0;
        Ok(())
    }

    fn finish(mut self) -> io::Result<u64> {
        self.flush()?;
        self.file.close().map_err(err)?;
        Ok(self.rows)
    }
}

/// A sink that writes the four tables of one input.
pub struct ParquetWriter {
    input: String,
    spans: Table,
    counters: Table,
    instants: Table,
    processes: Table,
    process_of: FxHashMap<u32, Process>,
    lanes: FxHashMap<u32, Lane>,
    /// The lane of the last span row, while its first [`LANE_COLUMNS`] cells still hold.
    last_lane: Option<u32>,
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
                Cell::I32(process.map_or(0, |p| p.id as i32)),
                Cell::I64(process.map_or(0, |p| i64::from(p.pid))),
                Cell::Text(process.map_or("", |p| p.host.as_str())),
                opt_i32(process.and_then(|p| p.rank)),
                Cell::I32(s.lane as i32),
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
                self.last_lane = None;
                self.lanes.insert(l.id, l);
            }
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
    use parquet::file::reader::{FileReader, SerializedFileReader};
    use parquet::record::RowAccessor;

    /// The hybrid encoding's bytes as the Parquet specification spells them out: its example of
    /// a bit-packed run (0 to 7 at 3 bits: `10001000 11000110 11111010`, after the header
    /// `(1 group << 1) | 1`), an RLE run (header `run << 1` as a ULEB128, then the value in
    /// ceil(width / 8) bytes), and a run of more than 63 groups split as parquet-mr splits it.
    #[test]
    fn the_hybrid_encoding_is_the_specifications() {
        let mut out = Vec::new();
        rle_hybrid(&[0, 1, 2, 3, 4, 5, 6, 7], 3, &mut out);
        assert_eq!(out, [0x03, 0b1000_1000, 0b1100_0110, 0b1111_1010]);
        out.clear();
        rle_hybrid(&[5; 100], 3, &mut out);
        assert_eq!(out, [200, 1, 5]);
        out.clear();
        // Three values then a run of ten: a group of the three and the run's first five, then
        // the run's other five (fewer than 8) in a second group, padded with zeros.
        rle_hybrid(&[1, 2, 3, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9], 4, &mut out);
        assert_eq!(out, [0x05, 0x21, 0x93, 0x99, 0x99, 0x99, 0x99, 0x09, 0x00]);
        out.clear();
        // A group, then a run of ten: the group, then an RLE run.
        rle_hybrid(
            &[1, 2, 3, 4, 5, 6, 7, 8, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9],
            4,
            &mut out,
        );
        assert_eq!(out, [0x03, 0x21, 0x43, 0x65, 0x87, 20, 9]);
        out.clear();
        // 64 groups of distinct values at 1 bit: 63 groups, then 1.
        let alternating: Vec<u32> = (0..512).map(|i| i % 2).collect();
        rle_hybrid(&alternating, 1, &mut out);
        assert_eq!(out.len(), 1 + 63 + 1 + 1);
        assert_eq!((out[0], out[64]), ((63 << 1) | 1, (1 << 1) | 1));
        assert!(
            out[1..64]
                .iter()
                .chain(&out[65..])
                .all(|&b| b == 0b1010_1010)
        );
    }

    /// Rows of alternating lanes, and of a lane renamed between two of its spans, carry their
    /// own lane's columns (which repeat the previous row's only while the lane does).
    #[test]
    fn each_row_has_its_own_lanes_columns() {
        let dir =
            std::env::temp_dir().join(format!("ggml-viz-parquet-lanes-{}", std::process::id()));
        let mut writer = ParquetWriter::create(&dir, "t").unwrap();
        let lane = |id: u32, name: &str| {
            Record::Lane(Lane {
                id,
                process: 0,
                tid: Some(u64::from(id) * 10),
                name: name.into(),
            })
        };
        let span = |i: u64, lane: u32| Span {
            id: i,
            parent: None,
            depth: 0,
            lane,
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
            id: 1,
            process: 0,
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
                lane: 1,
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
