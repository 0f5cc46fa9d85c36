//! What we read of a `struct ggml_tensor`: its name, op, type, shape and FLOP count, at offsets
//! that are checked against ggml's own `ggml_op_desc` before any of them is trusted.

use std::borrow::Cow;
use std::ffi::c_void;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};

use ggml_viz_format::ext;

use super::ggml::{Helpers, text};
use super::say;

type Ptr = *mut c_void;

/// Offsets in `struct ggml_tensor` (ggml.h, unchanged since 2023): `type` at 0, `ne[4]` at 16,
/// `op` at 80, `src[10]` at 152. The `op` offset is checked against `ggml_op_desc` on the first
/// nodes before any of them is trusted.
const TYPE_AT: usize = 0;
const NE_AT: usize = 16;
const OP_AT: usize = 80;
const SRC_AT: usize = 152;
/// `GGML_MAX_SRC`: the `src` array's length.
const MAX_SRC: usize = 10;
/// Where `name[64]` lies in the ggml of 2024 on (after `src[10]`, `view_src`, `view_offs` and
/// `data`): a hint for prefetching only, never read at this offset (ggml_get_name says where the
/// name is).
#[cfg(all(target_os = "linux", target_arch = "x86_64"))]
pub const NAME_AT: usize = 256;

/// Where `data` lies: just before the name, in the same ggml (read only where ggml_get_name
/// puts the name at [`NAME_AT`]).
#[cfg(all(target_os = "linux", target_arch = "x86_64"))]
const DATA_AT: usize = NAME_AT - 8;

const LAYOUT_UNCHECKED: u8 = 0;
const LAYOUT_OK: u8 = 1;
const LAYOUT_WRONG: u8 = 2;
/// Nodes checked before the struct offsets are trusted.
const NODES_TO_CHECK: u64 = 32;
/// Ops every ggml with `ggml_op_desc` (late 2023 on) defines.
const OPS_IN_EVERY_GGML: u32 = 64;

static LAYOUT: AtomicU8 = AtomicU8::new(LAYOUT_UNCHECKED);
static CHECKED: AtomicU64 = AtomicU64::new(0);

/// # Safety
/// `tensor` points to a live `struct ggml_tensor` and `at + size_of::<T>()` lies inside it.
unsafe fn field<T: Copy>(tensor: Ptr, at: usize) -> T {
    // SAFETY: per the contract; unaligned reads are fine for any T.
    unsafe { std::ptr::read_unaligned((tensor as *const u8).add(at) as *const T) }
}

/// Whether `t->op` can be read at its offset: checked on the first nodes against `ggml_op_desc`
/// (which names unary and GLU sub-ops, so `UNARY` and `GLU` also pass).
///
/// # Safety
/// `tensor` is a live tensor of the copy `h` belongs to.
unsafe fn layout_ok(h: &Helpers, tensor: Ptr, desc: &str) -> bool {
    match LAYOUT.load(Ordering::Relaxed) {
        LAYOUT_OK => return true,
        LAYOUT_WRONG => return false,
        _ => {}
    }
    // SAFETY: per the contract.
    let op: u32 = unsafe { field(tensor, OP_AT) };
    // Bounded before ggml_op_name indexes its table with it: by this ggml's op count, else by
    // the count every ggml has had since 2023 (a node past it is left unchecked).
    let name = match h.op_count() {
        // SAFETY: below this ggml's op count.
        Some(n) if op < n => unsafe { h.op_name(op) },
        Some(_) => String::new(),
        // SAFETY: below every ggml's op count.
        None if op < OPS_IN_EVERY_GGML => unsafe { h.op_name(op) },
        None => return false,
    };
    let agrees = !name.is_empty() && (name == desc || name == "UNARY" || name == "GLU");
    if !agrees {
        LAYOUT.store(LAYOUT_WRONG, Ordering::Relaxed);
        say(format_args!(
            "this ggml's struct ggml_tensor does not have `op` where expected ({desc} read as {op}); \
             ops are recorded by name only"
        ));
        return false;
    }
    if CHECKED.fetch_add(1, Ordering::Relaxed) + 1 >= NODES_TO_CHECK {
        LAYOUT.store(LAYOUT_OK, Ordering::Relaxed);
    }
    true
}

/// `tensor->data`, where ggml's own `ggml_get_name` confirms the struct's layout up to it (the
/// name right after it, at [`NAME_AT`]); `None` elsewhere.
///
/// # Safety
/// `tensor` is a live tensor of the copy `h` belongs to.
#[cfg(all(target_os = "linux", target_arch = "x86_64"))]
pub unsafe fn data_address(h: &Helpers, tensor: Ptr) -> Option<usize> {
    // SAFETY: per the contract.
    let name = unsafe { h.tensor_name_ptr(tensor) }?;
    // SAFETY: the name lies at NAME_AT, so the struct is the 2024-on layout, with `data` at
    // DATA_AT inside it.
    (name as usize == tensor as usize + NAME_AT).then(|| unsafe { field(tensor, DATA_AT) })
}

/// A hash of a node's name, op, type and shape, without asking ggml to describe its op (what
/// a cache of [`identity`]s checks an entry against); `None` until the struct layout has been
/// confirmed on the first nodes.
///
/// # Safety
/// `tensor` is a live tensor of the copy `h` belongs to.
#[cfg(all(target_os = "linux", target_arch = "x86_64"))]
pub unsafe fn fingerprint(h: &Helpers, tensor: Ptr) -> Option<u64> {
    if LAYOUT.load(Ordering::Relaxed) != LAYOUT_OK {
        return None;
    }
    // SAFETY: per the contract; the layout was checked, so these fields lie inside the tensor.
    let (name, op, ty, ne) = unsafe {
        (
            h.tensor_name_ptr(tensor),
            field::<u32>(tensor, OP_AT),
            field::<u32>(tensor, TYPE_AT),
            field::<[i64; 4]>(tensor, NE_AT),
        )
    };
    let mut h = Mix::default();
    if let Some(name) = name {
        // SAFETY: ggml's name field of the live tensor (per the contract).
        unsafe { eat_name(name, &mut h) };
    }
    h.eat(((op as u64) << 32) | ty as u64);
    for n in ne {
        h.eat(n as u64);
    }
    Some(h.0 | 1)
}

/// The bytes a node's description is made from, copied: its whole name field, its op with the
/// first op parameter (which selects a `UNARY` or `GLU` node's function), its type and shape. A
/// node found again is compared with its snapshot byte for byte (a few 16-byte compares, no
/// hashing, no call into ggml): what [`fingerprint`] hashes, and more.
#[cfg(all(target_os = "linux", target_arch = "x86_64"))]
#[derive(Clone, Copy)]
#[repr(C, align(16))]
pub struct Snapshot {
    name: [u8; NAME_FIELD],
    ne: [u8; 32],
    op: u64,
    ty: u32,
    /// Where the name field lies in the tensor (what `ggml_get_name` said when it was taken).
    name_at: u32,
}

#[cfg(all(target_os = "linux", target_arch = "x86_64"))]
impl Snapshot {
    /// A snapshot of no tensor: what tests of a cache's positions put in its entries.
    #[cfg(test)]
    pub const EMPTY: Snapshot = Snapshot {
        name: [0; NAME_FIELD],
        ne: [0; 32],
        op: 0,
        ty: 0,
        name_at: 0,
    };

    /// The snapshot of `tensor`; `None` until the struct layout has been confirmed on the first
    /// nodes, or where ggml cannot say where the name lies.
    ///
    /// # Safety
    /// `tensor` is a live tensor of the copy `h` belongs to.
    pub unsafe fn take(h: &Helpers, tensor: Ptr) -> Option<Snapshot> {
        if LAYOUT.load(Ordering::Relaxed) != LAYOUT_OK {
            return None;
        }
        // SAFETY: per the contract.
        let name = unsafe { h.tensor_name_ptr(tensor) }?;
        // Past `op` and its first parameter, within a struct of a few hundred bytes (336 in
        // the ggml of 2024 on): else the name is not in the tensor where this reads.
        let name_at = (name as usize).wrapping_sub(tensor as usize);
        if !(OP_AT + 8..=1024).contains(&name_at) {
            return None;
        }
        // SAFETY: the layout was checked, so these fields lie inside the tensor; the name field
        // is ggml's (`NAME_FIELD` bytes at what ggml_get_name returned).
        Some(unsafe { Snapshot::read(tensor, name_at) })
    }

    /// The snapshot of the tensor at `tensor`, whose name field lies at `name_at`.
    ///
    /// # Safety
    /// `tensor` points to a live `struct ggml_tensor` with its fields at the offsets above.
    unsafe fn read(tensor: Ptr, name_at: usize) -> Snapshot {
        // SAFETY: per the contract.
        unsafe {
            Snapshot {
                name: field(tensor, name_at),
                ne: field(tensor, NE_AT),
                op: field(tensor, OP_AT),
                ty: field(tensor, TYPE_AT),
                name_at: name_at as u32,
            }
        }
    }

    /// Whether `tensor` still has the bytes this snapshot of it took.
    ///
    /// # Safety
    /// `tensor` is a live tensor of the copy of ggml the snapshot was taken with (which has its
    /// name field where the snapshot says).
    #[inline]
    pub unsafe fn matches(&self, tensor: Ptr) -> bool {
        use core::arch::x86_64::{
            __m128i, _mm_cmpeq_epi8, _mm_loadu_si128, _mm_movemask_epi8, _mm_or_si128,
            _mm_setzero_si128, _mm_xor_si128,
        };
        let t = tensor as *const u8;
        // SAFETY: SSE2 is in every x86-64; the loads read the tensor's fields (inside it, per the
        // contract and the snapshot's offsets) and this snapshot's own bytes, unaligned.
        unsafe {
            let differ = |a: *const u8, b: *const u8| {
                _mm_xor_si128(
                    _mm_loadu_si128(a as *const __m128i),
                    _mm_loadu_si128(b as *const __m128i),
                )
            };
            let name = t.add(self.name_at as usize);
            let mine = self.name.as_ptr();
            let mut acc = _mm_or_si128(differ(name, mine), differ(name.add(16), mine.add(16)));
            acc = _mm_or_si128(acc, differ(name.add(32), mine.add(32)));
            acc = _mm_or_si128(acc, differ(name.add(48), mine.add(48)));
            acc = _mm_or_si128(acc, differ(t.add(NE_AT), self.ne.as_ptr()));
            acc = _mm_or_si128(acc, differ(t.add(NE_AT + 16), self.ne.as_ptr().add(16)));
            let rest = (field::<u64>(tensor, OP_AT) ^ self.op)
                | u64::from(field::<u32>(tensor, TYPE_AT) ^ self.ty);
            _mm_movemask_epi8(_mm_cmpeq_epi8(acc, _mm_setzero_si128())) == 0xFFFF && rest == 0
        }
    }
}

/// Bytes of ggml's tensor names: `char name[GGML_MAX_NAME]`, 64 in every ggml, NUL-terminated.
#[cfg(all(target_os = "linux", target_arch = "x86_64"))]
pub const NAME_FIELD: usize = 64;

/// Eats the name at `name` up to its NUL, a word at a time, without finding its length first:
/// the word that holds the NUL is eaten with the bytes from the NUL on cleared, so that what
/// follows the NUL in the field (a longer name written there before) does not count.
///
/// # Safety
/// `name` is the start of a tensor's name field ([`NAME_FIELD`] readable bytes).
#[cfg(all(target_os = "linux", target_arch = "x86_64"))]
unsafe fn eat_name(name: *const u8, h: &mut Mix) {
    const LOW: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    for i in 0..NAME_FIELD / 8 {
        // SAFETY: per the contract, word `i` lies inside the field.
        let word = u64::from_le(unsafe { std::ptr::read_unaligned(name.add(8 * i).cast::<u64>()) });
        // The lowest set bit marks the first zero byte (bits above it can be false alarms).
        let zeros = word.wrapping_sub(LOW) & !word & HIGH;
        if zeros != 0 {
            let before = zeros.trailing_zeros() / 8;
            h.eat(word & ((1u64 << (8 * before)) - 1));
            return;
        }
        h.eat(word);
    }
}

/// The rotate-xor-multiply step of [`tensor_key`].
#[derive(Default)]
struct Mix(u64);

impl Mix {
    fn eat(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(0x517c_c1b7_2722_0a95);
    }
}

/// A node's tensor-info record, encoded (`ext::TensorInfo`'s JSON payload, written as it is:
/// its name, op, type, shape and FLOP count), what the writer needs of it besides, and the group
/// it belongs to.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorRecord {
    pub json: Vec<u8>,
    /// The node's name: its op events' label.
    pub name: Box<str>,
    /// `t->op` and `ggml_op_name` of it, when the struct could be read.
    pub op_type: Option<u32>,
    pub op_name: Box<str>,
    /// Index of the distinct name and op type, in order of first sight (one can have several
    /// infos: shapes differ between graphs).
    pub group: u32,
}

/// The tensor info of `tensor`; of a fused call's last node when `fused_first` is the node it
/// computed first (op `FIRST+LAST`, no FLOP count). Reads ggml's strings in place: only the
/// name and op name are copied.
///
/// # Safety
/// `tensor` and `fused_first` are live tensors of the copy `h` belongs to.
pub unsafe fn read_tensor(h: &Helpers, tensor: Ptr, fused_first: Option<Ptr>) -> TensorRecord {
    // SAFETY: per the contract; the name lives in the tensor, the description is static.
    let (name, desc) = unsafe {
        (
            text(h.tensor_name_cstr(tensor)),
            text(h.op_desc_cstr(tensor)),
        )
    };
    // SAFETY: per the contract.
    let op: Cow<'_, str> = match fused_first.map(|f| unsafe { h.op_desc_cstr(f) }) {
        Some(first) => format!("{}+{desc}", text(first)).into(),
        None => Cow::Borrowed(&desc),
    };
    let mut info = ext::TensorInfoRef {
        name: &name,
        op: &op,
        op_type: None,
        op_name: None,
        type_name: "",
        ne: [0; 4],
        flops: None,
        src_bytes: None,
        kernels: None,
    };
    // SAFETY: `tensor` is a live tensor of the copy `h` belongs to (the contract).
    if !unsafe { layout_ok(h, tensor, &desc) } {
        return TensorRecord {
            json: info.to_json(),
            name: name.into(),
            op_type: None,
            op_name: "".into(),
            group: 0,
        };
    }
    // SAFETY: the layout was checked; these fields lie inside the tensor.
    let (op_type, ty, ne) = unsafe {
        (
            field::<u32>(tensor, OP_AT),
            field::<u32>(tensor, TYPE_AT),
            field::<[i64; 4]>(tensor, NE_AT),
        )
    };
    // SAFETY: `ty` and `op_type` were read from a live tensor whose layout was checked, and
    // `op_type` is below the op count where it is known.
    let (type_name, op_name) = unsafe {
        (
            text(h.type_name_cstr(ty)),
            if h.op_count().is_some_and(|n| op_type >= n) {
                Cow::Borrowed("")
            } else {
                text(h.op_name_cstr(op_type))
            },
        )
    };
    info.op_type = Some(op_type);
    info.op_name = Some(&op_name);
    info.type_name = &type_name;
    info.ne = ne;
    // SAFETY: a live MUL_MAT or MUL_MAT_ID tensor (its op description says so) whose layout
    // was checked.
    if fused_first.is_none() && (desc == "MUL_MAT" || desc == "MUL_MAT_ID") {
        info.flops = unsafe { mul_mat_flops(tensor, ne) };
    }
    // SAFETY: a live tensor whose layout was checked; its sources are live tensors.
    if fused_first.is_none() {
        info.src_bytes = Some(unsafe { source_bytes(h, tensor) });
    }
    TensorRecord {
        json: info.to_json(),
        name: name.into(),
        op_type: Some(op_type),
        op_name: op_name.into(),
        group: 0,
    }
}

/// `ggml_nbytes` of each of `tensor`'s sources, summed: what computing it reads.
///
/// # Safety
/// `tensor` is a live tensor of the copy `h` belongs to, whose layout was checked.
unsafe fn source_bytes(h: &Helpers, tensor: Ptr) -> u64 {
    (0..MAX_SRC)
        .map(|i| {
            // SAFETY: per the contract; `src` holds MAX_SRC pointers, null past the last source.
            let src: Ptr = unsafe { field(tensor, SRC_AT + 8 * i) };
            if src.is_null() {
                0
            } else {
                // SAFETY: a non-null source of a live node is a live tensor of the same copy.
                unsafe { h.nbytes(src) }
            }
        })
        .fold(0u64, u64::saturating_add)
}

/// 2·K·M·N for `dst = src0ᵀ·src1` (src0: K×M, src1: K×N), when the shapes agree. The same for
/// MUL_MAT_ID, whose `src0` holds the experts' K×M matrices and whose result has M rows for each
/// expert used by each token: 2·K per element of the result.
///
/// # Safety
/// `tensor` is a live MUL_MAT or MUL_MAT_ID tensor whose layout was checked.
unsafe fn mul_mat_flops(tensor: Ptr, ne: [i64; 4]) -> Option<u64> {
    // SAFETY: per the contract; sources of a live node are live tensors.
    let (src0, src1): (Ptr, Ptr) = unsafe { (field(tensor, SRC_AT), field(tensor, SRC_AT + 8)) };
    if src0.is_null() || src1.is_null() {
        return None;
    }
    // SAFETY: non-null sources of a live node are live tensors; `ne` lies inside each.
    let (a, b): ([i64; 4], [i64; 4]) = unsafe { (field(src0, NE_AT), field(src1, NE_AT)) };
    let k = a[0];
    (k == b[0] && a[1] == ne[0] && k > 0)
        .then(|| 2 * (k as u64) * ne.iter().map(|&n| n.max(0) as u64).product::<u64>())
}

/// What makes a node's tensor info distinct (name, op, type, shape), hashed, and its op number
/// (`u32::MAX` until the struct layout is confirmed). Reads borrowed C strings, not copies: this
/// runs for every node.
///
/// # Safety
/// `tensor` is a live tensor of the copy `h` belongs to.
pub unsafe fn identity(h: &Helpers, tensor: Ptr) -> (u64, u32) {
    // `desc` is a static string; the name lives in the tensor.
    // SAFETY: per the contract.
    let (name, desc) = unsafe { (h.tensor_name_cstr(tensor), h.op_desc_cstr(tensor)) };
    let checked = match LAYOUT.load(Ordering::Relaxed) {
        LAYOUT_OK => true,
        LAYOUT_WRONG => false,
        // SAFETY: `tensor` is a live tensor of the copy `h` belongs to (the contract).
        _ => unsafe { layout_ok(h, tensor, &desc.to_string_lossy()) },
    };
    // SAFETY: fields are read only once the layout was checked.
    let (op_type, ty, ne) = if checked {
        unsafe {
            (
                field::<u32>(tensor, OP_AT),
                field::<u32>(tensor, TYPE_AT),
                field::<[i64; 4]>(tensor, NE_AT),
            )
        }
    } else {
        (u32::MAX, 0, [0; 4])
    };
    let key = tensor_key(&[name.to_bytes(), desc.to_bytes()], op_type, ty, ne);
    (key, op_type)
}

/// A hash of what makes a tensor info distinct (never 0). It runs for every node on every
/// thread, so it takes eight bytes at a time (FxHash's rotate-xor-multiply step); each string is
/// followed by its length, so that `("ab", "c")` and `("a", "bc")` differ.
pub fn tensor_key(strings: &[&[u8]], op: u32, ty: u32, ne: [i64; 4]) -> u64 {
    let mut h = Mix::default();
    for bytes in strings {
        let mut chunks = bytes.chunks_exact(8);
        for chunk in &mut chunks {
            h.eat(u64::from_le_bytes(chunk.try_into().expect("8 bytes")));
        }
        let mut last = [0u8; 8];
        last[..chunks.remainder().len()].copy_from_slice(chunks.remainder());
        h.eat(u64::from_le_bytes(last));
        h.eat(bytes.len() as u64);
    }
    h.eat(((op as u64) << 32) | ty as u64);
    for n in ne {
        h.eat(n as u64);
    }
    h.0 | 1
}

#[cfg(test)]
mod tests {
    use super::tensor_key;

    /// A name field's hash as the fingerprint takes it: up to the NUL, whatever follows it.
    #[cfg(all(target_os = "linux", target_arch = "x86_64"))]
    fn name_hash(field: &[u8; super::NAME_FIELD]) -> u64 {
        let mut h = super::Mix::default();
        // SAFETY: `field` is a whole name field.
        unsafe { super::eat_name(field.as_ptr(), &mut h) };
        h.0
    }

    #[cfg(all(target_os = "linux", target_arch = "x86_64"))]
    fn field(name: &[u8], after: u8) -> [u8; super::NAME_FIELD] {
        let mut field = [after; super::NAME_FIELD];
        field[..name.len()].copy_from_slice(name);
        field[name.len()] = 0;
        field
    }

    #[test]
    #[cfg(all(target_os = "linux", target_arch = "x86_64"))]
    fn a_name_is_hashed_up_to_its_nul() {
        for name in [
            &b""[..],
            b"a",
            b"Qcur-0",
            b"ffn_up-1",
            b"ffn_gate-12",
            b"a_name_of_exactly_24_ch.",
            &[b'x'; 63],
        ] {
            // What a longer name left after the NUL does not count.
            assert_eq!(
                name_hash(&field(name, 0)),
                name_hash(&field(name, b'z')),
                "{name:?}"
            );
        }
        let names: Vec<&[u8]> = vec![
            b"",
            b"a",
            b"b",
            b"ab",
            b"ffn_up-1",
            b"ffn_up-10",
            b"ffn_up-1\x01",
            b"Qcur-0",
            b"Kcur-0",
            &[b'x'; 63],
        ];
        for (i, a) in names.iter().enumerate() {
            for b in &names[i + 1..] {
                assert_ne!(
                    name_hash(&field(a, 0)),
                    name_hash(&field(b, 0)),
                    "{a:?} {b:?}"
                );
            }
        }
    }

    #[test]
    fn keys_tell_apart_what_makes_infos_distinct() {
        let base = tensor_key(&[b"attn_norm-0", b"MUL"], 7, 0, [64, 1, 1, 1]);
        assert_eq!(
            base,
            tensor_key(&[b"attn_norm-0", b"MUL"], 7, 0, [64, 1, 1, 1])
        );
        assert_ne!(base & 1, 0);
        for other in [
            tensor_key(&[b"attn_norm-1", b"MUL"], 7, 0, [64, 1, 1, 1]),
            tensor_key(&[b"attn_norm-0M", b"UL"], 7, 0, [64, 1, 1, 1]),
            tensor_key(&[b"attn_norm-0", b"ADD"], 7, 0, [64, 1, 1, 1]),
            tensor_key(&[b"attn_norm-0", b"MUL"], 8, 0, [64, 1, 1, 1]),
            tensor_key(&[b"attn_norm-0", b"MUL"], 7, 1, [64, 1, 1, 1]),
            tensor_key(&[b"attn_norm-0", b"MUL"], 7, 0, [64, 2, 1, 1]),
            tensor_key(&[b"a_long_tensor_name_of_24", b"MUL"], 7, 0, [64, 1, 1, 1]),
        ] {
            assert_ne!(base, other);
        }
    }

    /// A tensor's bytes as ggml lays them out, with a name; `matches` answers for each field a
    /// description is made of, and for nothing else.
    #[test]
    #[cfg(all(target_os = "linux", target_arch = "x86_64"))]
    fn a_snapshot_matches_until_a_field_of_the_description_changes() {
        use super::{NE_AT, OP_AT, Ptr, SRC_AT, Snapshot, TYPE_AT};
        #[repr(C, align(16))]
        struct Bytes([u8; 336]);
        let mut t = Bytes([0xA5; 336]);
        t.0[super::NAME_AT..super::NAME_AT + 8].copy_from_slice(b"Qcur-12\0");
        let tensor = t.0.as_mut_ptr() as Ptr;
        // SAFETY: 336 bytes, the struct's size in the ggml of 2024 on; the name at NAME_AT.
        let snapshot = unsafe { Snapshot::read(tensor, super::NAME_AT) };
        // SAFETY: as above.
        let matches = |t: &mut Bytes| unsafe { snapshot.matches(t.0.as_mut_ptr() as Ptr) };
        assert!(matches(&mut t));
        // A byte of each field the description is made of: type, ne[0], ne[3], op, its first
        // parameter, the name, the name field past its NUL.
        for at in [
            TYPE_AT,
            NE_AT,
            NE_AT + 31,
            OP_AT,
            OP_AT + 4,
            super::NAME_AT + 3,
            super::NAME_AT + 63,
        ] {
            let was = t.0[at];
            t.0[at] ^= 0x10;
            assert!(!matches(&mut t), "a change at {at} is not seen");
            t.0[at] = was;
        }
        // Fields it is not made of: nb, the second op parameter, src, data.
        for at in [48, OP_AT + 8, SRC_AT, 248] {
            t.0[at] ^= 0x10;
            assert!(matches(&mut t), "a change at {at} is seen");
        }
    }
}
