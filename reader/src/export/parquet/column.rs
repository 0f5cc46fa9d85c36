//! One column chunk of a Parquet table, encoded here rather than by the parquet crate's generic
//! column writer: one Snappy-compressed data page (format v1) per chunk; numbers PLAIN with
//! min/max statistics; texts dictionary-encoded, the dictionary keyed by the address of the
//! model's shared texts; definition levels of OPTIONAL columns RLE. The crate writes the page
//! headers and the file's metadata.

use std::io;

use bytes::Bytes;
use parquet::basic::{Compression, Encoding, Repetition, Type as Physical};
use parquet::column::page::{CompressedPage, Page, PageWriter};
use parquet::column::writer::ColumnCloseResult;
use parquet::file::metadata::ColumnChunkMetaData;
use parquet::file::statistics::Statistics;
use parquet::file::writer::{SerializedPageWriter, TrackedWrite};
use parquet::schema::types::ColumnDescPtr;
use rustc_hash::FxHashMap;

use crate::telemetry::{ByAddress, Text};

/// One value of a row, in schema order.
pub(super) enum Cell<'a> {
    I32(i32),
    I64(i64),
    F64(f64),
    Text(&'a str),
    Null,
}

pub(super) fn wrong_type() -> io::Error {
    io::Error::other("a cell of the wrong type for its column")
}

pub(super) fn err(e: parquet::errors::ParquetError) -> io::Error {
    io::Error::other(e)
}

/// The distinct texts of one column chunk, in the order of first sight: a value is its index.
pub(super) struct Dictionary {
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
pub(super) enum Values {
    Int32(Vec<i32>),
    Int64(Vec<i64>),
    Double(Vec<f64>),
    /// Each value's index in the dictionary.
    Text(Vec<u32>, Box<Dictionary>),
}

pub(super) struct Column {
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
pub(super) unsafe trait Plain: Copy + PartialOrd {
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
    pub(super) fn push(&mut self, cell: &Cell<'_>) -> io::Result<()> {
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
    pub(super) fn present(&mut self) {
        if let Some(levels) = &mut self.present {
            levels.push(1);
        }
    }

    /// The typed pushes: false (nothing pushed) when the column is of another type.
    #[inline]
    pub(super) fn number<T: Plain>(&mut self, x: T) -> bool {
        let Some(v) = T::values(&mut self.values) else {
            return false;
        };
        v.push(x);
        self.present();
        true
    }

    #[inline]
    pub(super) fn text(&mut self, x: &str) -> bool {
        self.dictionary(|d| d.index(x))
    }

    /// A text of the model, found in the column's dictionary by its address.
    #[inline]
    pub(super) fn shared(&mut self, x: &Text) -> bool {
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
    pub(super) fn null(&mut self) -> bool {
        let Some(levels) = &mut self.present else {
            return false;
        };
        levels.push(0);
        true
    }

    /// The previous row's value again, `n` times (there is one in this row group).
    pub(super) fn repeat(&mut self, n: usize) {
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
    pub(super) fn chunk(
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

    pub(super) fn clear(&mut self) {
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

impl Column {
    /// An empty column of the column `descr` describes.
    pub(super) fn new(descr: ColumnDescPtr) -> Column {
        Column {
            present: (descr.self_type().get_basic_info().repetition() == Repetition::OPTIONAL)
                .then(Vec::new),
            values: match descr.physical_type() {
                Physical::INT32 => Values::Int32(Vec::new()),
                Physical::INT64 => Values::Int64(Vec::new()),
                Physical::DOUBLE => Values::Double(Vec::new()),
                _ => Values::Text(Vec::new(), Box::new(Dictionary::new())),
            },
            descr,
        }
    }
}

impl Scratch {
    pub(super) fn new() -> Scratch {
        Scratch {
            snappy: snap::raw::Encoder::new(),
            page: Vec::new(),
            compressed: Vec::new(),
        }
    }
}

/// Buffers a table reuses from chunk to chunk: the Snappy encoder, a page as built, compressed.
pub(super) struct Scratch {
    snappy: snap::raw::Encoder,
    page: Vec<u8>,
    compressed: Vec<u8>,
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
