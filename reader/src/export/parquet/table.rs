//! One Parquet file of a table being written, a row group of [`ROW_GROUP`] rows at a time,
//! each of its columns a [`Column`] chunk.

use std::fs::File;
use std::io::{self, BufWriter};
use std::path::Path;
use std::sync::Arc;

use parquet::file::properties::WriterProperties;
use parquet::file::writer::SerializedFileWriter;
use parquet::schema::parser::parse_message_type;

use super::ROW_GROUP;
use super::column::{Cell, Column, Scratch, err};

/// One Parquet file being written, a row group at a time.
pub(super) struct Table {
    file: SerializedFileWriter<BufWriter<File>>,
    pub(super) columns: Vec<Column>,
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
    pub(super) fn create(path: &Path, schema: &str) -> io::Result<Table> {
        let schema = Arc::new(parse_message_type(schema).map_err(err)?);
        let props = Arc::new(WriterProperties::builder().build());
        let out = BufWriter::with_capacity(1 << 20, File::create(path)?);
        let file = SerializedFileWriter::new(out, schema, props).map_err(err)?;
        let descr = file.schema_descr();
        let columns = (0..descr.num_columns())
            .map(|i| Column::new(descr.column(i)))
            .collect();
        Ok(Table {
            file,
            columns,
            buffered: 0,
            rows: 0,
            repeats: 0,
            repeat_width: 0,
            scratch: Scratch::new(),
        })
    }

    pub(super) fn push(&mut self, row: &[Cell<'_>]) -> io::Result<()> {
        debug_assert_eq!(row.len(), self.columns.len());
        self.begin_row(0)?;
        for (column, cell) in self.columns.iter_mut().zip(row) {
            column.push(cell)?;
        }
        self.end_row()
    }

    /// Whether a row can repeat cells of the previous one: a row group has begun.
    pub(super) fn can_repeat(&self) -> bool {
        self.buffered > 0
    }

    /// Begins a row whose first `same` cells are known to equal the previous row's: those are
    /// repeated from it, and the caller pushes the others, one to each column after them (with
    /// [`Column`]'s typed pushes), then calls [`Table::end_row`]. Only where
    /// [`Table::can_repeat`], or `same` is 0.
    #[inline]
    pub(super) fn begin_row(&mut self, same: usize) -> io::Result<()> {
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
    pub(super) fn end_row(&mut self) -> io::Result<()> {
        self.buffered += 1;
        self.rows += 1;
        if self.buffered == ROW_GROUP {
            self.flush()?;
        }
        Ok(())
    }

    /// Puts the repeated cells of the rows pushed since the last call into their columns.
    pub(super) fn apply_repeats(&mut self) {
        let n = std::mem::take(&mut self.repeats);
        if n > 0 {
            for column in &mut self.columns[..self.repeat_width] {
                column.repeat(n);
            }
        }
    }

    /// Writes the rows buffered as one row group.
    pub(super) fn flush(&mut self) -> io::Result<()> {
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

    pub(super) fn finish(mut self) -> io::Result<u64> {
        self.flush()?;
        self.file.close().map_err(err)?;
        Ok(self.rows)
    }
}
