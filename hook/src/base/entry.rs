//! The entry points we wrap, by number: the one list every layer shares (the recorder stores the
//! number in events, the writer names labels and spans from it, the front ends export, resolve
//! and hook each of them).

use std::ffi::CStr;

/// The exported entry points; the number is stored in every event (its label's first word).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Entry {
    SchedGraphCompute = 1,
    SchedGraphComputeAsync = 2,
    BackendGraphCompute = 3,
    BackendGraphComputeAsync = 4,
    GraphCompute = 5,
    GraphComputeWithCtx = 6,
    BackendSynchronize = 7,
    SchedSynchronize = 8,
    SchedSetEvalCallback = 9,
    LlamaDecode = 10,
    LlamaEncode = 11,
    LlamaProcess = 12,
    LlamaBatchExtAdd = 13,
    LlamaBatchExtAddToken = 14,
    LlamaBatchExtClear = 15,
    BufferInit = 16,
    BufferFree = 17,
    SchedFree = 18,
    LlamaBatchExtAddEmbd = 19,
    LlamaBatchExtAddSeq = 20,
    LlamaMemorySeqRm = 21,
    LlamaBatchExtFree = 22,
    BufferSetUsage = 23,
    AllocCtxTensors = 24,
}

impl Entry {
    pub const ALL: [Entry; 24] = [
        Entry::SchedGraphCompute,
        Entry::SchedGraphComputeAsync,
        Entry::BackendGraphCompute,
        Entry::BackendGraphComputeAsync,
        Entry::GraphCompute,
        Entry::GraphComputeWithCtx,
        Entry::BackendSynchronize,
        Entry::SchedSynchronize,
        Entry::SchedSetEvalCallback,
        Entry::LlamaDecode,
        Entry::LlamaEncode,
        Entry::LlamaProcess,
        Entry::LlamaBatchExtAdd,
        Entry::LlamaBatchExtAddToken,
        Entry::LlamaBatchExtClear,
        Entry::BufferInit,
        Entry::BufferFree,
        Entry::SchedFree,
        Entry::LlamaBatchExtAddEmbd,
        Entry::LlamaBatchExtAddSeq,
        Entry::LlamaMemorySeqRm,
        Entry::LlamaBatchExtFree,
        Entry::BufferSetUsage,
        Entry::AllocCtxTensors,
    ];

    pub fn from_code(code: u8) -> Option<Entry> {
        Entry::ALL.get((code as usize).wrapping_sub(1)).copied()
    }

    pub fn c_name(self) -> &'static CStr {
        match self {
            Entry::SchedGraphCompute => c"ggml_backend_sched_graph_compute",
            Entry::SchedGraphComputeAsync => c"ggml_backend_sched_graph_compute_async",
            Entry::BackendGraphCompute => c"ggml_backend_graph_compute",
            Entry::BackendGraphComputeAsync => c"ggml_backend_graph_compute_async",
            Entry::GraphCompute => c"ggml_graph_compute",
            Entry::GraphComputeWithCtx => c"ggml_graph_compute_with_ctx",
            Entry::BackendSynchronize => c"ggml_backend_synchronize",
            Entry::SchedSynchronize => c"ggml_backend_sched_synchronize",
            Entry::SchedSetEvalCallback => c"ggml_backend_sched_set_eval_callback",
            Entry::LlamaDecode => c"llama_decode",
            Entry::LlamaEncode => c"llama_encode",
            Entry::LlamaProcess => c"llama_process",
            Entry::LlamaBatchExtAdd => c"llama_batch_ext_add",
            Entry::LlamaBatchExtAddToken => c"llama_batch_ext_add_token",
            Entry::LlamaBatchExtClear => c"llama_batch_ext_clear",
            Entry::BufferInit => c"ggml_backend_buffer_init",
            Entry::BufferFree => c"ggml_backend_buffer_free",
            Entry::SchedFree => c"ggml_backend_sched_free",
            Entry::LlamaBatchExtAddEmbd => c"llama_batch_ext_add_embd",
            Entry::LlamaBatchExtAddSeq => c"llama_batch_ext_add_seq",
            Entry::LlamaMemorySeqRm => c"llama_memory_seq_rm",
            Entry::LlamaBatchExtFree => c"llama_batch_ext_free",
            Entry::BufferSetUsage => c"ggml_backend_buffer_set_usage",
            Entry::AllocCtxTensors => c"ggml_backend_alloc_ctx_tensors_from_buft",
        }
    }

    /// The C name without its NUL (labels are built from it for every event).
    pub fn name(self) -> &'static str {
        // SAFETY: the names above are ASCII, so valid UTF-8.
        unsafe { std::str::from_utf8_unchecked(self.c_name().to_bytes()) }
    }

    /// The backend an entry point always runs on, where its arguments name none.
    pub fn implied_backend(self) -> Option<&'static str> {
        matches!(self, Entry::GraphCompute | Entry::GraphComputeWithCtx).then_some("CPU")
    }
}
