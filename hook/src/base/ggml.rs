//! The ggml functions we call ourselves, from one copy of ggml, and what we read of its structs.
//!
//! Every function is looked up at run time, in the copy of ggml a call was routed to; any may be
//! missing in an old ggml, and then the event carries 0 or no name.

use std::borrow::Cow;
use std::ffi::{CStr, c_char, c_int, c_void};
use std::sync::atomic::{AtomicU32, Ordering};

#[cfg(target_os = "linux")]
use super::objects;
use super::{VERBOSE, say};

type Ptr = *mut c_void;

/// The eval callback of `ggml_backend_sched` (`ggml_backend_sched_eval_callback`).
pub type EvalCallback = unsafe extern "C-unwind" fn(Ptr, bool, Ptr) -> bool;

/// The functions, by index into [`Helpers::fns`].
#[derive(Clone, Copy)]
enum F {
    GraphNNodes,
    BackendName,
    SchedGetNBackends,
    SchedGetBackend,
    Version,
    SchedSetEvalCallback,
    SchedGetTensorBackend,
    Nbytes,
    OpName,
    OpDesc,
    GetName,
    TypeName,
    BuftName,
    BufferGetBase,
    BufferGetSize,
    BufferGetType,
    GraphNode,
    GetFirstTensor,
}

const NAMES: [&CStr; 18] = [
    c"ggml_graph_n_nodes",
    c"ggml_backend_name",
    c"ggml_backend_sched_get_n_backends",
    c"ggml_backend_sched_get_backend",
    c"ggml_version",
    c"ggml_backend_sched_set_eval_callback",
    c"ggml_backend_sched_get_tensor_backend",
    c"ggml_nbytes",
    c"ggml_op_name",
    c"ggml_op_desc",
    c"ggml_get_name",
    c"ggml_type_name",
    c"ggml_backend_buft_name",
    c"ggml_backend_buffer_get_base",
    c"ggml_backend_buffer_get_size",
    c"ggml_backend_buffer_get_type",
    c"ggml_graph_node",
    c"ggml_get_first_tensor",
];

#[derive(Debug, Default)]
pub struct Helpers {
    /// Addresses, 0 where the function is missing.
    fns: [usize; NAMES.len()],
    /// [`Helpers::op_count`], once found: 0 not yet looked for, `u32::MAX` unknown.
    op_count: AtomicU32,
}

/// `GGML_OP_COUNT` of the ggml versions we know (`ggml_version()`), for a ggml whose symbol
/// table does not have its `GGML_OP_NAME` table (a stripped library, macOS, Windows).
const KNOWN_OP_COUNTS: [(&str, u32); 1] = [("0.25.3", 101)];

/// # Safety
/// `p` is null or a NUL-terminated string.
unsafe fn c_string(p: *const c_char) -> String {
    if p.is_null() {
        return String::new();
    }
    // SAFETY: per the contract.
    text(unsafe { CStr::from_ptr(p) }).into_owned()
}

/// `s` as text: borrowed when it is UTF-8 (every name ggml makes; checked a word at a time),
/// else with U+FFFD for each bad sequence (the lossy way, which walks it in chunks).
pub fn text(s: &CStr) -> Cow<'_, str> {
    s.to_str()
        .map_or_else(|_| s.to_string_lossy(), Cow::Borrowed)
}

/// # Safety
/// `p`, when given and not null, is a NUL-terminated string that outlives `'a`.
unsafe fn borrowed<'a>(p: Option<*const c_char>) -> &'a CStr {
    match p {
        // SAFETY: per the contract.
        Some(p) if !p.is_null() => unsafe { CStr::from_ptr(p) },
        _ => c"",
    }
}

/// Generates a typed accessor for one function: `None` if missing.
macro_rules! function {
    ($method:ident, $f:expr, fn($($arg:ty),*) -> $ret:ty) => {
        fn $method(&self) -> Option<unsafe extern "C" fn($($arg),*) -> $ret> {
            let address = self.fns[$f as usize];
            // SAFETY: a non-zero address is the named ggml function, whose C signature this is.
            (address != 0).then(|| unsafe { std::mem::transmute::<usize, unsafe extern "C" fn($($arg),*) -> $ret>(address) })
        }
    };
}

impl Helpers {
    /// No function: every helper answers 0 or an empty name.
    pub const fn none() -> Helpers {
        Helpers {
            fns: [0; NAMES.len()],
            op_count: AtomicU32::new(u32::MAX),
        }
    }

    /// Looks every function up with `lookup` (in the scope of one copy of ggml).
    pub fn load(mut lookup: impl FnMut(&CStr) -> Option<usize>) -> Helpers {
        let mut fns = [0; NAMES.len()];
        for (slot, name) in fns.iter_mut().zip(NAMES) {
            *slot = lookup(name).unwrap_or(0);
        }
        Helpers {
            fns,
            op_count: AtomicU32::new(0),
        }
    }

    /// How many ops this ggml's `enum ggml_op` has (`GGML_OP_COUNT`, which ggml does not
    /// export), so that `ggml_op_name` is never asked past its table: the size of that table
    /// (`GGML_OP_NAME`) in the symbol table of the file that defines `ggml_op_name` (Linux), else
    /// the count of a version we know; `None` when neither tells. Said once with `verbose`.
    pub fn op_count(&self) -> Option<u32> {
        let known = match self.op_count.load(Ordering::Relaxed) {
            0 => {
                let (count, from) = match self.op_table_len() {
                    Some(n) => (Some(n), "the size of its GGML_OP_NAME table".to_string()),
                    None => {
                        let version = self.version().unwrap_or_default();
                        let known = KNOWN_OP_COUNTS.iter().find(|(v, _)| *v == version);
                        (known.map(|k| k.1), format!("ggml {version}"))
                    }
                };
                static SAID: std::sync::atomic::AtomicBool =
                    std::sync::atomic::AtomicBool::new(false);
                if VERBOSE.load(Ordering::Relaxed) && !SAID.swap(true, Ordering::Relaxed) {
                    match count {
                        Some(n) => say(format_args!("this ggml has {n} ops ({from})")),
                        None => say(format_args!(
                            "this ggml's op count is unknown ({from}, no GGML_OP_NAME symbol)"
                        )),
                    }
                }
                let count = count.unwrap_or(u32::MAX);
                self.op_count.store(count, Ordering::Relaxed);
                count
            }
            n => n,
        };
        (known != u32::MAX).then_some(known)
    }

    /// The entries of the `GGML_OP_NAME` table, from the symbol table of the file defining
    /// `ggml_op_name`.
    #[cfg(target_os = "linux")]
    fn op_table_len(&self) -> Option<u32> {
        let object = objects::object_of(self.op_name_fn()? as usize)?;
        let bytes = objects::symbol_size(objects::file_of(&object.path), "GGML_OP_NAME")?;
        let n = bytes / std::mem::size_of::<usize>() as u64;
        u32::try_from(n).ok().filter(|&n| n > 0 && n < 65536)
    }

    #[cfg(not(target_os = "linux"))]
    fn op_table_len(&self) -> Option<u32> {
        None
    }

    function!(graph_n_nodes_fn, F::GraphNNodes, fn(Ptr) -> c_int);
    function!(backend_name_fn, F::BackendName, fn(Ptr) -> *const c_char);
    function!(sched_n_backends_fn, F::SchedGetNBackends, fn(Ptr) -> c_int);
    function!(sched_backend_fn, F::SchedGetBackend, fn(Ptr, c_int) -> Ptr);
    function!(version_fn, F::Version, fn() -> *const c_char);
    function!(
        set_eval_callback_fn,
        F::SchedSetEvalCallback,
        fn(Ptr, Option<EvalCallback>, Ptr) -> ()
    );
    function!(
        tensor_backend_fn,
        F::SchedGetTensorBackend,
        fn(Ptr, Ptr) -> Ptr
    );
    function!(nbytes_fn, F::Nbytes, fn(Ptr) -> usize);
    function!(op_name_fn, F::OpName, fn(c_int) -> *const c_char);
    function!(op_desc_fn, F::OpDesc, fn(Ptr) -> *const c_char);
    function!(get_name_fn, F::GetName, fn(Ptr) -> *const c_char);
    function!(type_name_fn, F::TypeName, fn(c_int) -> *const c_char);
    function!(buft_name_fn, F::BuftName, fn(Ptr) -> *const c_char);
    function!(buffer_base_fn, F::BufferGetBase, fn(Ptr) -> Ptr);
    function!(buffer_size_fn, F::BufferGetSize, fn(Ptr) -> usize);
    function!(buffer_type_fn, F::BufferGetType, fn(Ptr) -> Ptr);
    function!(graph_node_fn, F::GraphNode, fn(Ptr, c_int) -> Ptr);
    function!(first_tensor_fn, F::GetFirstTensor, fn(Ptr) -> Ptr);

    /// `ggml_graph_n_nodes(graph)`, or 0.
    ///
    /// # Safety
    /// `graph` must be a graph of this copy of ggml (it is: the caller passed it to this copy).
    pub unsafe fn n_nodes(&self, graph: Ptr) -> u32 {
        match self.graph_n_nodes_fn() {
            // SAFETY: the function belongs to the copy that owns `graph`.
            Some(f) if !graph.is_null() => unsafe { f(graph) }.max(0) as u32,
            _ => 0,
        }
    }

    /// `ggml_graph_node(graph, i)`, or null.
    ///
    /// # Safety
    /// `graph` must be a graph of this copy of ggml and `i` below its node count.
    #[cfg(all(target_os = "linux", target_arch = "x86_64"))]
    pub unsafe fn graph_node(&self, graph: Ptr, i: u32) -> Ptr {
        match self.graph_node_fn() {
            // SAFETY: per the contract.
            Some(f) => unsafe { f(graph, i as c_int) },
            None => std::ptr::null_mut(),
        }
    }

    /// `ggml_backend_name(backend)`.
    ///
    /// # Safety
    /// `backend` must be a backend of this copy of ggml.
    pub unsafe fn backend_name(&self, backend: Ptr) -> String {
        match self.backend_name_fn() {
            // SAFETY: the function belongs to the copy that owns `backend` (the contract); the
            // name it returns is a NUL-terminated string owned by the backend.
            Some(f) if !backend.is_null() => unsafe { c_string(f(backend)) },
            _ => String::new(),
        }
    }

    /// The names of a scheduler's backends, joined with `+` (`CUDA0+CPU`).
    ///
    /// # Safety
    /// `sched` must be a scheduler of this copy of ggml.
    pub unsafe fn sched_name(&self, sched: Ptr) -> String {
        let (Some(count), Some(get)) = (self.sched_n_backends_fn(), self.sched_backend_fn()) else {
            return String::new();
        };
        // SAFETY: the function belongs to the copy that owns `sched` (the contract).
        let n = unsafe { count(sched) }.clamp(0, 16);
        // SAFETY: indices are below the scheduler's backend count.
        (0..n)
            .map(|i| unsafe { self.backend_name(get(sched, i)) })
            .collect::<Vec<_>>()
            .join("+")
    }

    /// Whether the CPU backend (named `CPU`) computes every node of `graph` on `sched`: every
    /// backend of the scheduler is the CPU, or the scheduler assigned every node of the graph
    /// to it (a CUDA build running its layers on the CPU); a node not assigned yet counts as the
    /// CPU's. Only then are all its nodes computed by the CPU backend's per-op functions.
    ///
    /// # Safety
    /// `sched` must be a scheduler of this copy of ggml, `graph` a graph being computed on it.
    pub unsafe fn sched_graph_only_cpu(&self, sched: Ptr, graph: Ptr) -> bool {
        let (Some(count), Some(get), Some(name)) = (
            self.sched_n_backends_fn(),
            self.sched_backend_fn(),
            self.backend_name_fn(),
        ) else {
            return false;
        };
        // SAFETY: the functions belong to the copy that owns `sched` (the contract); indices
        // are below its backend count; backend names are static strings.
        let is_cpu = |backend: Ptr| unsafe { borrowed(Some(name(backend))).to_bytes() == b"CPU" };
        // SAFETY: as above.
        if unsafe { (0..count(sched).clamp(0, 16)).all(|i| is_cpu(get(sched, i))) } {
            return true;
        }
        let (Some(node), Some(backend_of)) = (self.graph_node_fn(), self.tensor_backend_fn())
        else {
            return false;
        };
        // The CPU backends of the scheduler, by address (a node's backend is one of them).
        let mut cpu = [std::ptr::null_mut(); 16];
        // SAFETY: as above.
        for i in 0..unsafe { count(sched) }.clamp(0, 16) {
            let backend = unsafe { get(sched, i) };
            if is_cpu(backend) {
                cpu[i as usize] = backend;
            }
        }
        // SAFETY: indices below the graph's node count, nodes of the caller's graph on `sched`.
        (0..unsafe { self.n_nodes(graph) } as c_int).all(|i| {
            let backend = unsafe { backend_of(sched, node(graph, i)) };
            backend.is_null() || cpu.contains(&backend)
        })
    }

    /// `ggml_version()`, where this ggml has it.
    pub fn version(&self) -> Option<String> {
        // SAFETY: ggml_version takes nothing and returns a static string.
        self.version_fn()
            .map(|f| unsafe { c_string(f()) })
            .filter(|v| !v.is_empty())
    }

    /// Whether per-op timing can work with this ggml: it needs these functions.
    pub fn can_time_ops(&self) -> bool {
        self.set_eval_callback_fn().is_some()
            && self.op_desc_fn().is_some()
            && self.nbytes_fn().is_some()
    }

    /// `ggml_backend_sched_set_eval_callback`.
    ///
    /// # Safety
    /// `sched` must be a scheduler of this copy of ggml; `callback` must accept `user_data`.
    pub unsafe fn set_eval_callback(
        &self,
        sched: Ptr,
        callback: Option<EvalCallback>,
        user_data: Ptr,
    ) {
        if let Some(f) = self.set_eval_callback_fn() {
            // SAFETY: per the contract.
            unsafe { f(sched, callback, user_data) }
        }
    }

    /// The backend the scheduler ran `tensor` on, or null.
    ///
    /// # Safety
    /// `sched` and `tensor` must belong to this copy of ggml.
    pub unsafe fn tensor_backend(&self, sched: Ptr, tensor: Ptr) -> Ptr {
        // SAFETY: per the contract.
        self.tensor_backend_fn()
            .map_or(std::ptr::null_mut(), |f| unsafe { f(sched, tensor) })
    }

    /// `ggml_nbytes(tensor)`.
    ///
    /// # Safety
    /// `tensor` must be a tensor of this copy of ggml.
    pub unsafe fn nbytes(&self, tensor: Ptr) -> u64 {
        // SAFETY: per the contract.
        self.nbytes_fn().map_or(0, |f| unsafe { f(tensor) } as u64)
    }

    /// `ggml_op_name(op)`. Only for an `op` read from a live tensor whose offset was checked.
    ///
    /// # Safety
    /// `op` must be a value of this ggml's `enum ggml_op`.
    pub unsafe fn op_name(&self, op: u32) -> String {
        // SAFETY: per the contract.
        text(unsafe { self.op_name_cstr(op) }).into_owned()
    }

    /// [`Helpers::op_name`], a static string (empty if the function is missing).
    ///
    /// # Safety
    /// As for [`Helpers::op_name`].
    pub unsafe fn op_name_cstr(&self, op: u32) -> &'static CStr {
        // SAFETY: per the contract; ggml returns a static string.
        unsafe { borrowed(self.op_name_fn().map(|f| f(op as c_int))) }
    }

    /// `ggml_get_name(tensor)`, borrowed from the tensor (empty if the function is missing).
    ///
    /// # Safety
    /// `tensor` must be a live tensor of this copy of ggml; the result lives as long as it.
    pub unsafe fn tensor_name_cstr<'t>(&self, tensor: Ptr) -> &'t CStr {
        // SAFETY: per the contract; ggml returns the tensor's NUL-terminated name.
        unsafe { borrowed(self.get_name_fn().map(|f| f(tensor))) }
    }

    /// `ggml_get_name(tensor)`: where the tensor's name field starts (`None` if the function is
    /// missing or gives null).
    ///
    /// # Safety
    /// `tensor` must be a live tensor of this copy of ggml.
    #[cfg(all(target_os = "linux", target_arch = "x86_64"))]
    pub unsafe fn tensor_name_ptr(&self, tensor: Ptr) -> Option<*const u8> {
        // SAFETY: per the contract; ggml returns a pointer into the tensor.
        let name = unsafe { self.get_name_fn().map(|f| f(tensor)) }?;
        (!name.is_null()).then_some(name.cast())
    }

    /// `ggml_op_desc(tensor)`, a static string (empty if the function is missing).
    ///
    /// # Safety
    /// `tensor` must be a live tensor of this copy of ggml.
    pub unsafe fn op_desc_cstr(&self, tensor: Ptr) -> &'static CStr {
        // SAFETY: per the contract; ggml returns a static string.
        unsafe { borrowed(self.op_desc_fn().map(|f| f(tensor))) }
    }

    /// `ggml_type_name(type)`, a static string (empty if the function is missing).
    ///
    /// # Safety
    /// `ty` must be a value of this ggml's `enum ggml_type` (read from a live tensor).
    pub unsafe fn type_name_cstr(&self, ty: u32) -> &'static CStr {
        // SAFETY: per the contract; ggml returns a static string.
        unsafe { borrowed(self.type_name_fn().map(|f| f(ty as c_int))) }
    }

    /// `ggml_backend_buft_name(buft)`.
    ///
    /// # Safety
    /// `buft` is null or a buffer type of this copy of ggml.
    pub unsafe fn buft_name(&self, buft: Ptr) -> String {
        match self.buft_name_fn() {
            // SAFETY: per the contract.
            Some(f) if !buft.is_null() => unsafe { c_string(f(buft)) },
            _ => String::new(),
        }
    }

    /// The first tensor of context `ctx` (null: none, or no `ggml_get_first_tensor`).
    ///
    /// # Safety
    /// `ctx` is a live context of this copy of ggml.
    pub unsafe fn first_tensor(&self, ctx: Ptr) -> Ptr {
        match self.first_tensor_fn() {
            // SAFETY: per the contract.
            Some(f) if !ctx.is_null() => unsafe { f(ctx) },
            _ => std::ptr::null_mut(),
        }
    }

    /// A buffer's base address, size and buffer type.
    ///
    /// # Safety
    /// `buffer` is a live buffer of this copy of ggml.
    pub unsafe fn buffer(&self, buffer: Ptr) -> (u64, u64, Ptr) {
        // SAFETY: per the contract.
        unsafe {
            (
                self.buffer_base_fn().map_or(0, |f| f(buffer) as u64),
                self.buffer_size_fn().map_or(0, |f| f(buffer) as u64),
                self.buffer_type_fn()
                    .map_or(std::ptr::null_mut(), |f| f(buffer)),
            )
        }
    }
}
