//! A node's share as copies of its two records: every share of one tensor id writes the same
//! `OP_COMPUTE_BEGIN` (its label the tensor's name) and `OP_COMPUTE_END` but for their times,
//! thread and tensor address (an id stands for a tensor's name, op, type and shape: a graph built
//! again elsewhere has its nodes at other addresses), so the writer encodes the pair once per id
//! and then copies it, with those fields set: one copy of ~100 bytes a share instead of two
//! records assembled field by field, the tensor table looked up and the label found.
//!
//! The copy is the records the format's encoder made, so a trace reads the same either way; a
//! pair is made again where a share of its id has another op type, size or backend. Here too:
//! the writer's `encode_op`, which writes every share's records this way where it can.

use ggml_viz_format::{self as format, Layout, THREAD_ID_OFFSET, TIMESTAMP_OFFSET, UNION_OFFSET};

use super::{Drain, OP_BEGIN, OP_END, TraceWriter, op_payload};
use crate::record::raw::OpInfo;

/// The pairs, by tensor id (id 0, a tensor without info, has none).
#[derive(Default)]
pub(super) struct ShareRecords(Vec<Option<ShareRecord>>);

/// One tensor's pair of records, times and thread 0.
struct ShareRecord {
    /// The op fields it was made for, but the tensor's address: op type, op size and backend.
    op: [u64; 3],
    /// The group of its tensor info (the tensor info a reader keeps for its name and op: see
    /// `TraceWriter::info_of_group`).
    group: usize,
    /// The begin record, then the end record.
    bytes: Box<[u8]>,
    /// Where the end record begins.
    end_at: usize,
}

/// The bytes of a record that hold the fields a copy sets: its time, thread and tensor address.
const SET: usize = UNION_OFFSET + 8;

/// The op fields a pair is made for.
#[inline(always)]
fn fields(op: &OpInfo) -> [u64; 3] {
    [u64::from(op.op_type), op.op_size, op.backend as u64]
}

impl TraceWriter {
    /// A node's op share, begun at `begin_ns` and ended at `end_ns` on thread `thread_id`: both
    /// records, copied from its tensor's pair where its tensor info is the latest written of
    /// its group (else encoded, after the tensor info, and the pair made).
    #[inline(always)]
    pub(super) fn encode_op(
        &mut self,
        op: &OpInfo,
        thread_id: u32,
        begin_ns: u64,
        end_ns: u64,
        d: &Drain<'_>,
    ) {
        if let Some(pair) = self.share_records.get(op)
            && self.info_of_group.get(pair.group) == Some(&op.tensor_id)
        {
            pair.write(&mut self.buf, op.tensor as u64, thread_id, begin_ns, end_ns);
            return;
        }
        self.encode_op_records(op, thread_id, begin_ns, end_ns, d);
    }

    /// [`TraceWriter::encode_op`] where its tensor's pair is not made for these op fields or its
    /// tensor info is to be written (out of line: a tensor's first share, another op size of its
    /// id, another tensor info of its group written since).
    #[inline(never)]
    fn encode_op_records(
        &mut self,
        op: &OpInfo,
        thread_id: u32,
        begin_ns: u64,
        end_ns: u64,
        d: &Drain<'_>,
    ) {
        self.encode_op_begin(op, thread_id, begin_ns, d);
        self.encode_op_end(op, thread_id, end_ns);
        if let Some(info) = d.tensors.get(op.tensor_id) {
            let label = self.tensor_names.then_some(info.name.as_bytes());
            self.share_records.make(self.layout, op, info.group, label);
        }
    }
}

impl ShareRecords {
    /// The pair for a share of `op`, if one was made for its tensor id and op fields.
    #[inline(always)]
    fn get(&self, op: &OpInfo) -> Option<&ShareRecord> {
        self.0
            .get(usize::from(op.tensor_id))?
            .as_ref()
            .filter(|pair| pair.op == fields(op))
    }

    /// Makes the pair of `op` (a tensor id other than 0), in `group`, its begin labelled
    /// `label`, in `layout`.
    fn make(&mut self, layout: Layout, op: &OpInfo, group: u32, label: Option<&[u8]>) {
        let id = usize::from(op.tensor_id);
        if id == 0 {
            return;
        }
        let mut bytes = Vec::new();
        let payload = op_payload(op);
        format::encode_record(&mut bytes, layout, OP_BEGIN, 0, 0, &payload, label);
        let end_at = bytes.len();
        format::encode_record(&mut bytes, layout, OP_END, 0, 0, &payload, None);
        if self.0.len() <= id {
            self.0.resize_with(id + 1, || None);
        }
        self.0[id] = Some(ShareRecord {
            op: fields(op),
            group: group as usize,
            bytes: bytes.into_boxed_slice(),
            end_at,
        });
    }
}

impl ShareRecord {
    /// Appends the pair to `buf`, for the node `tensor`: the begin at `begin_ns`, the end at
    /// `end_ns`, on thread `thread_id`.
    #[inline(always)]
    fn write(&self, buf: &mut Vec<u8>, tensor: u64, thread_id: u32, begin_ns: u64, end_ns: u64) {
        let at = buf.len();
        buf.extend_from_slice(&self.bytes);
        let pair = &mut buf[at..];
        let (begin, end) = pair.split_at_mut(self.end_at);
        for (record, ns) in [(begin, begin_ns), (end, end_ns)] {
            // The fields set are in each record's first `SET` bytes (every record is longer: its
            // union follows), one bounds check a record.
            let Some(head) = record.first_chunk_mut::<SET>() else {
                continue;
            };
            head[TIMESTAMP_OFFSET..THREAD_ID_OFFSET].copy_from_slice(&ns.to_le_bytes());
            head[THREAD_ID_OFFSET..UNION_OFFSET].copy_from_slice(&thread_id.to_le_bytes());
            // The op payload's first field (FORMAT.md, both layouts).
            head[UNION_OFFSET..SET].copy_from_slice(&tensor.to_le_bytes());
        }
    }
}

#[cfg(test)]
mod tests {
    use std::ffi::c_void;

    use ggml_viz_config::Config;
    use ggml_viz_format::ext::{Counters, Metadata};
    use ggml_viz_format::{EXTENSION_TYPE_CODE, Event, Layout, Payload, decode_record};

    use super::super::{Drain, TraceWriter, op_payload};
    use crate::base::names::Names;
    use crate::base::tensor::TensorRecord;
    use crate::record::raw::OpInfo;
    use crate::record::tensors::Tensors;

    fn writer(layout: Layout, tensor_names: bool) -> TraceWriter {
        let path = std::env::temp_dir().join(format!(
            "ggml-viz-share-records-{}-{layout:?}-{tensor_names}",
            std::process::id()
        ));
        let file = std::fs::File::create(&path).unwrap();
        let w = TraceWriter::create(
            file,
            path.clone(),
            layout,
            &Config {
                tensor_names,
                ..Config::default()
            },
            &Metadata::default(),
        )
        .unwrap_or_else(|(path, e)| panic!("{}: {e}", path.display()));
        std::fs::remove_file(&path).unwrap();
        w
    }

    fn info(name: &str, json: &str) -> TensorRecord {
        TensorRecord {
            json: json.as_bytes().to_vec(),
            name: name.into(),
            op_type: Some(1),
            op_name: "ADD".into(),
            group: 0,
        }
    }

    fn op(tensor_id: u16, tensor: usize, op_size: u64) -> OpInfo {
        OpInfo {
            tensor: tensor as *mut c_void,
            op_type: 1,
            op_size,
            backend: 0x5000 as *mut c_void,
            tensor_id,
        }
    }

    /// What a record says, shortly: an op record's type, time, thread, payload and label; a
    /// tensor info's JSON (other extension records left out).
    #[derive(Debug, PartialEq)]
    enum Said {
        Op(u8, u64, u32, Payload, Option<Vec<u8>>),
        Info(String),
    }

    fn said(e: Event<'_>) -> Option<Said> {
        let label = e.label.map(|l| l.into_owned());
        match (e.type_code, e.payload) {
            (EXTENSION_TYPE_CODE, Payload::Extension(x)) => (x.kind
                == ggml_viz_format::ExtensionKind::TensorInfo)
                .then(|| Said::Info(String::from_utf8(label.unwrap()).unwrap())),
            (code, payload) => Some(Said::Op(code, e.timestamp_ns, e.thread_id, payload, label)),
        }
    }

    fn begin(o: &OpInfo, ns: u64, thread: u32, label: Option<&str>) -> Said {
        Said::Op(
            2,
            ns,
            thread,
            op_payload(o),
            label.map(|l| l.as_bytes().to_vec()),
        )
    }

    fn end(o: &OpInfo, ns: u64, thread: u32) -> Said {
        Said::Op(3, ns, thread, op_payload(o), None)
    }

    /// Shares written from their tensors' pairs read as the format's encoder writes each record:
    /// times, threads and tensor addresses of their own, each tensor's info before its first
    /// share and again where another of its group came between, a pair made again for another
    /// op size, and a tensor without info written without a label.
    #[test]
    fn shares_copied_from_pairs_read_as_records_encoded_one_by_one() {
        let ways = [
            (Layout::Packed, true),
            (Layout::Padded, true),
            (Layout::Packed, false),
        ];
        for (layout, tensor_names) in ways {
            let tensors = Tensors::new(false);
            let a = tensors.intern(1 << 20, || info("a", r#"{"a":1}"#));
            let a2 = tensors.intern(2 << 20, || info("a", r#"{"a":2}"#));
            let b = tensors.intern(3 << 20, || info("b", r#"{"b":1}"#));
            let names = Names::new();
            let d = Drain {
                rings: Vec::new(),
                names: &names,
                tensors: &tensors,
                counters: Counters::default(),
            };
            let (oa, oa2, ob) = (op(a, 0xa0, 4), op(a2, 0xa0, 4), op(b, 0xb0, 8));
            let (oa_other, bare) = (op(a, 0xa0, 12), op(0, 0xc0, 16));
            // a's node in a graph built again elsewhere.
            let oa_moved = op(a, 0xd0, 4);
            let shares = [
                (oa, 1, 10, 20),
                (oa, 2, 30, 40),
                (ob, 1, 50, 60),
                (oa, 1, 70, 80),
                (oa2, 1, 90, 100),
                (oa, 2, 110, 120),
                (oa, 2, 130, 140),
                (oa_other, 1, 150, 160),
                (oa, 1, 170, 180),
                (oa_moved, 2, 180, 190),
                (bare, 3, 190, 200),
                (bare, 3, 210, 220),
            ];
            let mut w = writer(layout, tensor_names);
            let at = w.buf.len();
            for (o, thread, begun, ended) in shares {
                w.encode_op(&o, thread, begun, ended, &d);
            }
            let mut rest = &w.buf[at..];
            let mut got = Vec::new();
            while let Some((e, len)) = decode_record(rest, layout).unwrap() {
                got.extend(said(e));
                rest = &rest[len..];
            }
            assert!(rest.is_empty());
            // Op records carry their tensor's name where tensor names are on.
            let label = |o: &OpInfo| {
                match o.tensor_id {
                    0 => None,
                    id if id == b => Some("b"),
                    _ => Some("a"),
                }
                .filter(|_| tensor_names)
            };
            // The tensor infos, before the shares they precede (by index in `shares`): a's
            // first, b's, a2's (a's group: its other shape), then a's again.
            let infos = [
                (0, r#"{"a":1}"#),
                (2, r#"{"b":1}"#),
                (4, r#"{"a":2}"#),
                (5, r#"{"a":1}"#),
            ];
            let mut expected = Vec::new();
            for (i, (o, thread, begun, ended)) in shares.iter().enumerate() {
                let before = infos.iter().filter(|&&(at, _)| at == i);
                expected.extend(before.map(|(_, json)| Said::Info(json.to_string())));
                expected.push(begin(o, *begun, *thread, label(o)));
                expected.push(end(o, *ended, *thread));
            }
            assert_eq!(got, expected, "{layout:?}, tensor names {tensor_names}");
            // The pairs were made: a's (made again for its other op size, and again after), b's.
            assert!(w.share_records.get(&oa).is_some() && w.share_records.get(&ob).is_some());
            assert!(w.share_records.get(&oa_other).is_none());
            assert!(w.share_records.get(&bare).is_none());
        }
    }
}
