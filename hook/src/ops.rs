//! Per-op timing through the scheduler's eval callback, the mechanism ggml itself offers.
//!
//! Around a recorded `ggml_backend_sched_graph_compute[_async]` we install our callback. It
//! answers `ask = true` for every node, so the scheduler computes and synchronizes each node on its
//! own; the time from the ask to the `ask = false` call that follows is the node's real duration.
//! The application's own callback (remembered by our `ggml_backend_sched_set_eval_callback`) is
//! chained so that it sees exactly the calls it would have seen without us: every ask, in order,
//! and the `ask = false` call only for the nodes it asked for, whose answer (false = stop) is ours.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::atomic::{AtomicU8, AtomicU16, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock, PoisonError};

use crate::capture::{self, OpInfo, Recorder};
use crate::ggml::{EvalCallback, Helpers};
use crate::names::Owner;

type Ptr = *mut c_void;

// ---------------------------------------------------------------------------------------------
// The application's callbacks, per scheduler.

const SCHEDULERS: usize = 64;

struct AppCallback {
    sched: AtomicUsize,
    callback: AtomicUsize,
    user_data: AtomicUsize,
}

#[allow(clippy::declare_interior_mutable_const)] // a template copied into each slot
const NO_CALLBACK: AppCallback = AppCallback {
    sched: AtomicUsize::new(0),
    callback: AtomicUsize::new(0),
    user_data: AtomicUsize::new(0),
};
static APP_CALLBACKS: [AppCallback; SCHEDULERS] = [NO_CALLBACK; SCHEDULERS];

/// Remembers the callback the application set on `sched` (called by our export of
/// `ggml_backend_sched_set_eval_callback`, which also forwards it).
pub fn remember_app_callback(sched: Ptr, callback: Option<EvalCallback>, user_data: Ptr) {
    let key = sched as usize;
    let slot = APP_CALLBACKS
        .iter()
        .find(|s| s.sched.load(Ordering::Acquire) == key)
        .or_else(|| {
            APP_CALLBACKS.iter().find(|s| {
                s.sched
                    .compare_exchange(0, key, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
            })
        });
    if let Some(slot) = slot {
        slot.callback
            .store(callback.map_or(0, |f| f as usize), Ordering::Release);
        slot.user_data.store(user_data as usize, Ordering::Release);
    }
}

fn app_callback(sched: Ptr) -> (Option<EvalCallback>, Ptr) {
    let key = sched as usize;
    match APP_CALLBACKS
        .iter()
        .find(|s| s.sched.load(Ordering::Acquire) == key)
    {
        Some(slot) => {
            let callback = slot.callback.load(Ordering::Acquire);
            // SAFETY: a non-zero value was stored from an `EvalCallback`.
            let callback = (callback != 0)
                .then(|| unsafe { std::mem::transmute::<usize, EvalCallback>(callback) });
            (callback, slot.user_data.load(Ordering::Acquire) as Ptr)
        }
        None => (None, std::ptr::null_mut()),
    }
}

// ---------------------------------------------------------------------------------------------
// What we read of a tensor.

/// Offsets in `struct ggml_tensor` (ggml.h, unchanged since 2023): `type` at 0, `ne[4]` at 16,
/// `op` at 80, `src[10]` at 152. The `op` offset is checked against `ggml_op_desc` on the first
/// nodes before any of them is trusted.
const TYPE_AT: usize = 0;
const NE_AT: usize = 16;
const OP_AT: usize = 80;
const SRC_AT: usize = 152;

const LAYOUT_UNCHECKED: u8 = 0;
const LAYOUT_OK: u8 = 1;
const LAYOUT_WRONG: u8 = 2;
/// Nodes checked before the struct offsets are trusted.
const NODES_TO_CHECK: u64 = 32;
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
    // Bounded before ggml_op_name indexes its table with it.
    // SAFETY: op is bounded by the size of every ggml's op table so far.
    let name = if op < 128 {
        unsafe { h.op_name(op) }
    } else {
        String::new()
    };
    let agrees = !name.is_empty() && (name == desc || name == "UNARY" || name == "GLU");
    if !agrees {
        LAYOUT.store(LAYOUT_WRONG, Ordering::Relaxed);
        crate::say(format_args!(
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

/// A node's name, op, type, shape and FLOP count: what a tensor-info record says.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorInfo {
    pub name: String,
    /// Index of the distinct name, in order of first sight (a name can have several infos).
    pub group: u32,
    /// `ggml_op_desc`: the op's name, or the unary / GLU sub-op's.
    pub op: String,
    /// `t->op`, when the struct layout was confirmed, and `ggml_op_name` of it.
    pub op_type: Option<u32>,
    pub op_name: String,
    pub type_name: String,
    pub ne: [i64; 4],
    /// Floating-point operations, where well defined (MUL_MAT: 2·K·M·N).
    pub flops: Option<u64>,
}

/// # Safety
/// `tensor` is a live tensor of the copy `h` belongs to.
unsafe fn read_tensor(h: &Helpers, tensor: Ptr) -> TensorInfo {
    // SAFETY: per the contract.
    let (name, op) = unsafe { (h.tensor_name(tensor), h.op_desc(tensor)) };
    // SAFETY: as above.
    if !unsafe { layout_ok(h, tensor, &op) } {
        return TensorInfo {
            name,
            group: 0,
            op,
            op_type: None,
            op_name: String::new(),
            type_name: String::new(),
            ne: [0; 4],
            flops: None,
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
    // SAFETY: `ty` and `op_type` were read from a live tensor whose layout was checked.
    let (type_name, op_name) = unsafe { (h.type_name(ty), h.op_name(op_type)) };
    // SAFETY: as above.
    let flops = if op == "MUL_MAT" {
        unsafe { mul_mat_flops(tensor, ne) }
    } else {
        None
    };
    TensorInfo {
        name,
        group: 0,
        op,
        op_type: Some(op_type),
        op_name,
        type_name,
        ne,
        flops,
    }
}

/// 2·K·M·N for `dst = src0ᵀ·src1` (src0: K×M, src1: K×N), when the shapes agree.
///
/// # Safety
/// `tensor` is a live MUL_MAT tensor whose layout was checked.
unsafe fn mul_mat_flops(tensor: Ptr, ne: [i64; 4]) -> Option<u64> {
    // SAFETY: per the contract; sources of a live node are live tensors.
    let (src0, src1): (Ptr, Ptr) = unsafe { (field(tensor, SRC_AT), field(tensor, SRC_AT + 8)) };
    if src0.is_null() || src1.is_null() {
        return None;
    }
    // SAFETY: as above.
    let (a, b): ([i64; 4], [i64; 4]) = unsafe { (field(src0, NE_AT), field(src1, NE_AT)) };
    let k = a[0];
    (k == b[0] && a[1] == ne[0] && k > 0)
        .then(|| 2 * (k as u64) * ne.iter().map(|&n| n.max(0) as u64).product::<u64>())
}

// ---------------------------------------------------------------------------------------------
// Tensors seen, interned by name, op, type and shape.

const TENSOR_SLOTS: usize = 1 << 14;
/// Ids run from 1 to this; beyond, op events carry no tensor info.
pub const MAX_TENSORS: usize = 8191;

pub struct Tensors {
    /// Open addressing: key hash (never 0) and id.
    keys: Box<[AtomicU64]>,
    ids: Box<[AtomicU16]>,
    infos: Box<[OnceLock<TensorInfo>]>,
    used: AtomicUsize,
    /// Held while adding; maps each distinct name to its group.
    adding: Mutex<HashMap<String, u32>>,
}

impl Tensors {
    pub fn new() -> Tensors {
        Tensors {
            keys: (0..TENSOR_SLOTS).map(|_| AtomicU64::new(0)).collect(),
            ids: (0..TENSOR_SLOTS).map(|_| AtomicU16::new(0)).collect(),
            infos: (0..MAX_TENSORS).map(|_| OnceLock::new()).collect(),
            used: AtomicUsize::new(0),
            adding: Mutex::new(HashMap::new()),
        }
    }

    /// Tensor infos added so far (ids 1 to this).
    pub fn len(&self) -> usize {
        self.used.load(Ordering::Acquire)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn get(&self, id: u16) -> Option<&TensorInfo> {
        self.infos.get((id as usize).checked_sub(1)?)?.get()
    }

    fn find(&self, key: u64) -> Option<u16> {
        let start = key as usize % TENSOR_SLOTS;
        for i in 0..TENSOR_SLOTS {
            let slot = (start + i) % TENSOR_SLOTS;
            match self.keys[slot].load(Ordering::Acquire) {
                0 => return None,
                k if k == key => return Some(self.ids[slot].load(Ordering::Acquire)),
                _ => {}
            }
        }
        None
    }

    /// The id of `info` (key `key`), adding it on first sight; 0 when the table is full.
    fn intern(&self, key: u64, info: impl FnOnce() -> TensorInfo) -> u16 {
        if let Some(id) = self.find(key) {
            return id;
        }
        let mut groups = self.adding.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(id) = self.find(key) {
            return id;
        }
        let n = self.used.load(Ordering::Relaxed);
        if n >= MAX_TENSORS {
            return 0;
        }
        let mut info = info();
        let next = groups.len() as u32;
        info.group = *groups.entry(info.name.clone()).or_insert(next);
        let _ = self.infos[n].set(info);
        let id = n as u16 + 1;
        let start = key as usize % TENSOR_SLOTS;
        if let Some(slot) = (0..TENSOR_SLOTS)
            .map(|i| (start + i) % TENSOR_SLOTS)
            .find(|&s| self.keys[s].load(Ordering::Relaxed) == 0)
        {
            self.ids[slot].store(id, Ordering::Release);
            self.keys[slot].store(key, Ordering::Release);
        }
        self.used.store(n + 1, Ordering::Release);
        id
    }
}

impl Default for Tensors {
    fn default() -> Self {
        Tensors::new()
    }
}

/// FNV-1a over the bytes that make a tensor info distinct (never 0).
fn tensor_key(strings: &[&[u8]], op: u32, ty: u32, ne: [i64; 4]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut eat = |bytes: &[u8]| {
        for &b in bytes {
            h = (h ^ b as u64).wrapping_mul(0x0100_0000_01b3);
        }
    };
    for bytes in strings {
        eat(bytes);
        eat(&[0]);
    }
    eat(&op.to_le_bytes());
    eat(&ty.to_le_bytes());
    for n in ne {
        eat(&n.to_le_bytes());
    }
    h | 1
}

// ---------------------------------------------------------------------------------------------
// The driver of one graph compute.

/// Lives on the stack of one scheduler compute, as our callback's user data.
pub struct OpDriver {
    recorder: &'static Recorder,
    helpers: &'static Helpers,
    sched: Ptr,
    app: (Option<EvalCallback>, Ptr),
    /// The application's answer to the last ask.
    app_wants: bool,
    /// The node being computed, for its end event.
    open: Option<OpInfo>,
}

impl OpDriver {
    pub fn new(recorder: &'static Recorder, helpers: &'static Helpers, sched: Ptr) -> OpDriver {
        OpDriver {
            recorder,
            helpers,
            sched,
            app: app_callback(sched),
            app_wants: false,
            open: None,
        }
    }

    /// Sets our callback on the scheduler for the next compute.
    ///
    /// # Safety
    /// `self` must stay where it is until [`OpDriver::uninstall`].
    pub unsafe fn install(&mut self) {
        let me = self as *mut OpDriver as Ptr;
        // SAFETY: the scheduler belongs to this copy; `me` outlives the compute (per the contract).
        unsafe {
            self.helpers
                .set_eval_callback(self.sched, Some(eval_callback), me)
        };
    }

    /// Gives the scheduler back the application's callback.
    pub fn uninstall(&self) {
        // SAFETY: restoring exactly what the application set (or nothing).
        unsafe {
            self.helpers
                .set_eval_callback(self.sched, self.app.0, self.app.1)
        };
    }

    fn begin(&mut self, tensor: Ptr) {
        let (h, r) = (self.helpers, self.recorder);
        // SAFETY: the scheduler passes its live node, of this copy of ggml.
        let info = unsafe { describe_node(h, r, self.sched, tensor) };
        capture::op_begin(r, &info);
        self.open = Some(info);
    }

    fn end(&mut self) {
        if let Some(info) = self.open.take() {
            capture::op_end(self.recorder, &info);
        }
    }
}

/// # Safety
/// `tensor` is a live node of `sched`, both of the copy `h` belongs to.
unsafe fn describe_node(h: &Helpers, r: &Recorder, sched: Ptr, tensor: Ptr) -> OpInfo {
    // Borrowed C strings, not copies: this runs for every node. `desc` is a static string; the
    // name lives in the tensor.
    // SAFETY: per the contract.
    let (name, desc) = unsafe { (h.tensor_name_cstr(tensor), h.op_desc_cstr(tensor)) };
    let checked = match LAYOUT.load(Ordering::Relaxed) {
        LAYOUT_OK => true,
        LAYOUT_WRONG => false,
        // SAFETY: as above.
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
    // SAFETY: as above.
    let tensor_id = r.tensors.intern(key, || unsafe { read_tensor(h, tensor) });
    // SAFETY: as above.
    let backend = unsafe { h.tensor_backend(sched, tensor) };
    capture::name_id(r, backend, Owner::Backend, || {
        // SAFETY: the scheduler's backend belongs to this copy.
        unsafe { h.backend_name(backend) }
    });
    // SAFETY: as above.
    let op_size = unsafe { h.nbytes(tensor) };
    OpInfo {
        tensor,
        op_type,
        op_size,
        backend,
        tensor_id,
    }
}

/// The eval callback we install.
///
/// # Safety
/// Called by ggml with a live node and the `OpDriver` we installed as user data.
unsafe extern "C" fn eval_callback(tensor: Ptr, ask: bool, user_data: Ptr) -> bool {
    // SAFETY: per the contract: the driver outlives the compute and only this thread uses it.
    let driver = unsafe { &mut *(user_data as *mut OpDriver) };
    let (app, app_data) = driver.app;
    if ask {
        // The application sees every ask, in order, as without us.
        // SAFETY: the application's callback with its own user data.
        driver.app_wants = app.is_some_and(|f| unsafe { f(tensor, true, app_data) });
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| driver.begin(tensor)));
        return true;
    }
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| driver.end()));
    match app {
        // SAFETY: as above; only for the nodes it asked for, and its answer stops the graph.
        Some(f) if driver.app_wants => unsafe { f(tensor, false, app_data) },
        _ => true,
    }
}
