//! The names a trace gives its numbers (op types, tensors, backends), kept as its op-name,
//! tensor-info and backend-name records come: what both the GGMLVIZ importer and the op analysis
//! name nodes by.

use rustc_hash::FxHashMap;

use crate::format::ExtensionKind;
use crate::format::ext::{BackendNames, OpNames, TensorInfo, parse_payload};

/// A tensor info kept: its place in the order infos came, the info, and the record it came in.
type Kept = (u64, TensorInfo, Box<[u8]>);

/// The names a trace gives its numbers, as its op-name, tensor-info and backend-name records
/// come: what both the importer and the op analysis name nodes by.
#[derive(Clone, Debug, Default)]
pub struct NameTables {
    op_names: std::collections::HashMap<u32, String>,
    /// By tensor name, the latest info for each op type (`None`: an info that does not say its
    /// op, which applies to any), with its place in the order infos came and its record.
    infos: FxHashMap<String, Vec<Kept>>,
    infos_taken: u64,
    /// By record, the name and op type of each info kept: a record that comes again is found
    /// without parsing it.
    held: FxHashMap<Box<[u8]>, (String, Option<u32>)>,
    backends: std::collections::HashMap<u64, String>,
}

/// What a record taken in by [`NameTables::take`] changed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NamesChanged {
    /// Op or backend names: any node's name may have changed.
    All,
    /// The info of the tensor of this name.
    Tensor(String),
}

impl NameTables {
    /// Takes in an extension record of `kind` with `payload` if it is one of the tables'; what it
    /// changed (`None` for other kinds).
    pub fn take(&mut self, kind: ExtensionKind, payload: &[u8]) -> Option<NamesChanged> {
        match kind {
            ExtensionKind::OpNames => {
                let names = parse_payload::<OpNames>(payload).unwrap_or_default().names;
                for (k, v) in names {
                    if let Ok(k) = k.parse() {
                        self.op_names.insert(k, v);
                    }
                }
                Some(NamesChanged::All)
            }
            ExtensionKind::TensorInfo => {
                if let Some((name, op_type)) = self.held.get(payload)
                    && self.is_latest(name, *op_type)
                {
                    return None;
                }
                let info = parse_payload::<TensorInfo>(payload)?;
                let (name, op_type) = (info.name.clone(), info.op_type);
                self.infos_taken += 1;
                let taken = (self.infos_taken, info, payload.into());
                let of_name = self.infos.entry(name.clone()).or_default();
                match of_name.iter_mut().find(|(_, i, _)| i.op_type == op_type) {
                    Some(kept) => {
                        let replaced = std::mem::replace(kept, taken);
                        self.held.remove(&replaced.2);
                    }
                    None => of_name.push(taken),
                }
                self.held.insert(payload.into(), (name.clone(), op_type));
                Some(NamesChanged::Tensor(name))
            }
            ExtensionKind::BackendNames => {
                let names = parse_payload::<BackendNames>(payload).unwrap_or_default();
                for b in names.backends {
                    self.backends.insert(b.ptr, b.name);
                }
                Some(NamesChanged::All)
            }
            _ => None,
        }
    }

    /// Whether taking the kept info of `name` for `op_type` again would change nothing: no info
    /// it competes with came after it (any of the name's for an info without an op; the name's
    /// info without an op, for one with).
    fn is_latest(&self, name: &str, op_type: Option<u32>) -> bool {
        let Some(of_name) = self.infos.get(name) else {
            return false;
        };
        let Some(&(taken, ..)) = of_name.iter().find(|(_, i, _)| i.op_type == op_type) else {
            return false;
        };
        (of_name.iter())
            .filter(|(_, i, _)| op_type.is_none() || i.op_type.is_none())
            .all(|&(t, ..)| t <= taken)
    }

    /// The info of the node computing tensor `name` with op `op_type`, if the trace gave one:
    /// the latest for that name and op, or for that name without an op if that came later.
    pub fn info(&self, name: &str, op_type: u32) -> Option<&TensorInfo> {
        self.infos
            .get(name)?
            .iter()
            .filter(|(_, i, _)| i.op_type.is_none_or(|o| o == op_type))
            .max_by_key(|(taken, ..)| *taken)
            .map(|(_, i, _)| i)
    }

    /// What a node of op `op_type` with `info` computes: the info's op (the sub-op of a unary or
    /// GLU op, a fused call's ops), else the op's name in the trace's table, else its number.
    pub fn op<'a>(
        &'a self,
        info: Option<&'a TensorInfo>,
        op_type: u32,
    ) -> std::borrow::Cow<'a, str> {
        match info {
            Some(i) if !i.op.is_empty() => i.op.as_str().into(),
            _ => match self.op_names.get(&op_type) {
                Some(name) => name.as_str().into(),
                None => format!("op {op_type}").into(),
            },
        }
    }

    /// The name of backend `ptr`, if the trace gave one.
    pub fn backend(&self, ptr: u64) -> Option<&str> {
        self.backends.get(&ptr).map(String::as_str)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A node is named by its tensor's info when that info is for the node's op, else by the op
    /// table, else by number; a later record for a tensor replaces its info.
    #[test]
    fn nodes_are_named_from_the_latest_tables() {
        let mut t = NameTables::default();
        let ops = br#"{"names":{"29":"MUL_MAT","x":"bad"}}"#;
        assert_eq!(t.take(ExtensionKind::OpNames, ops), Some(NamesChanged::All));
        let info = br#"{"name":"ffn_out-0","op":"SILU","op_type":80,"type":"f32","ne":[8,1,1,1]}"#;
        let changed = t.take(ExtensionKind::TensorInfo, info);
        assert_eq!(changed, Some(NamesChanged::Tensor("ffn_out-0".into())));
        assert_eq!(t.take(ExtensionKind::TensorInfo, b"not json"), None);
        assert_eq!(t.take(ExtensionKind::Metadata, ops), None);
        assert_eq!(t.op(t.info("ffn_out-0", 80), 80), "SILU");
        // Another op under that name (a graph reusing it): the info is not that node's.
        assert_eq!(t.info("ffn_out-0", 29), None);
        assert_eq!(t.op(t.info("ffn_out-0", 29), 29), "MUL_MAT");
        assert_eq!(t.op(None, 7), "op 7");
        let info = br#"{"name":"ffn_out-0","op":"GELU","op_type":80}"#;
        t.take(ExtensionKind::TensorInfo, info);
        assert_eq!(t.op(t.info("ffn_out-0", 80), 80), "GELU");
        let backends = br#"{"backends":[{"ptr":4096,"name":"CUDA0"}]}"#;
        assert_eq!(
            t.take(ExtensionKind::BackendNames, backends),
            Some(NamesChanged::All)
        );
        assert_eq!((t.backend(4096), t.backend(0)), (Some("CUDA0"), None));
    }

    /// The tensor-info record of `Qcur-0` computed by `op` (`op_type`), `ne0` wide.
    fn qcur_info(op: &str, op_type: Option<u32>, ne0: i64) -> Vec<u8> {
        let info = TensorInfo {
            name: "Qcur-0".into(),
            op: op.into(),
            op_type,
            ne: [ne0, 1, 1, 1],
            ..TensorInfo::default()
        };
        serde_json::to_vec(&info).unwrap()
    }

    /// Two nodes of one name and different ops (llama.cpp's `Qcur-0`: a MUL_MAT, then the ROPE
    /// after it): each op finds its own info, in whatever order the records came; a record that
    /// does not say its op applies to every op of the name until one is given again.
    #[test]
    fn a_name_keeps_one_info_per_op() {
        let mut t = NameTables::default();
        let mut take = |op: &str, op_type: Option<u32>, ne0: i64| {
            let json = qcur_info(op, op_type, ne0);
            assert!(t.take(ExtensionKind::TensorInfo, &json).is_some());
            t.clone()
        };
        take("MUL_MAT", Some(29), 64);
        let t1 = take("ROPE", Some(45), 64);
        let op_of =
            |t: &NameTables, op_type| t.info("Qcur-0", op_type).map(|i| (i.op.clone(), i.ne[0]));
        assert_eq!(op_of(&t1, 29), Some(("MUL_MAT".into(), 64)));
        assert_eq!(op_of(&t1, 45), Some(("ROPE".into(), 64)));
        assert_eq!(op_of(&t1, 7), None);
        // A generation step's shape replaces the prompt's, for that op only.
        let t2 = take("MUL_MAT", Some(29), 1);
        assert_eq!(op_of(&t2, 29), Some(("MUL_MAT".into(), 1)));
        assert_eq!(op_of(&t2, 45), Some(("ROPE".into(), 64)));
        // Without an op: for every op, until one is given again.
        let t3 = take("?", None, 7);
        assert_eq!(
            (op_of(&t3, 29), op_of(&t3, 7)),
            (Some(("?".into(), 7)), Some(("?".into(), 7)))
        );
        let t4 = take("ROPE", Some(45), 8);
        assert_eq!(op_of(&t4, 45), Some(("ROPE".into(), 8)));
        assert_eq!(op_of(&t4, 29), Some(("?".into(), 7)));
        assert_eq!(t4.info("Kcur-0", 29), None);
    }

    /// A record the tables already hold, as the latest for its name and op, changes nothing (the
    /// hook repeats a tensor's info wherever another node of its name came between: llama.cpp's
    /// `Qcur-0` MUL_MAT and ROPE, every graph); one that would make an older info the latest again
    /// changes what a name's ops find.
    #[test]
    fn a_record_already_held_changes_nothing() {
        let mut t = NameTables::default();
        let (mul_mat, rope, any) = (
            qcur_info("MUL_MAT", Some(29), 64),
            qcur_info("ROPE", Some(48), 64),
            qcur_info("?", None, 7),
        );
        let changed = Some(NamesChanged::Tensor("Qcur-0".into()));
        let mut take = |json: &[u8]| t.take(ExtensionKind::TensorInfo, json);
        assert_eq!(take(&mul_mat), changed);
        assert_eq!(take(&rope), changed);
        for _ in 0..3 {
            assert_eq!(take(&mul_mat), None);
            assert_eq!(take(&rope), None);
        }
        // An info for any op, then the MUL_MAT's again: that one is the latest for op 29 again.
        assert_eq!(take(&any), changed);
        assert_eq!(take(&mul_mat), changed);
        assert_eq!(take(&mul_mat), None);
        let op_of = |t: &NameTables, op_type| t.info("Qcur-0", op_type).map(|i| i.op.clone());
        assert_eq!(op_of(&t, 29).as_deref(), Some("MUL_MAT"));
        assert_eq!(op_of(&t, 48).as_deref(), Some("?"));
        // The info for any op again: it is not the latest of its name, so it changes op 29's.
        assert_eq!(t.take(ExtensionKind::TensorInfo, &any), changed);
        assert_eq!(op_of(&t, 29).as_deref(), Some("?"));
        assert_eq!(t.take(ExtensionKind::TensorInfo, &any), None);
    }
}
