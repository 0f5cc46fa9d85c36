//! llama.cpp's calls: `llama_decode` / `llama_encode` (and `llama_process`) as spans with their
//! batch's tokens and sequences, the `llama_batch_ext` builders followed, and
//! `llama_memory_seq_rm`.

use std::ffi::{c_int, c_void};

#[cfg(all(target_arch = "x86_64", not(windows)))]
use super::buffers::buffer_made;
use super::calls::{guarded, real_function};
use crate::base::entry::Entry;
use crate::intercept::batches::{self, Composition};
#[cfg(all(target_arch = "x86_64", not(windows)))]
use crate::intercept::in_place;
use crate::intercept::route::Resolved;
use crate::record;

type Ptr = *mut c_void;

/// The fields of `struct llama_batch` (llama.h) that are read: the first seven, at the same
/// offsets in every layout (the struct had three more fields before llama.cpp #9745). Only ever
/// read through a pointer to the caller's batch, never copied or passed by value.
#[repr(C)]
pub struct LlamaBatch {
    n_tokens: i32,
    token: Ptr,
    embd: Ptr,
    pos: Ptr,
    n_seq_id: Ptr,
    seq_id: Ptr,
    logits: Ptr,
}

/// A pointer to the caller's `llama_batch` (how aarch64 and Windows pass it by value).
#[cfg(any(windows, not(target_arch = "x86_64")))]
pub(super) type BatchRef = *const LlamaBatch;

/// A decode or encode span's details, read from the caller's batch: its tokens (`u32::MAX`:
/// unknown) and, for a decode, their sequences.
///
/// # Safety
/// `batch` points at the caller's `llama_batch`, whose arrays are valid for its tokens (as
/// llama_decode requires).
unsafe fn batch_span(name: Entry, batch: *const LlamaBatch) -> (u32, Option<Composition>) {
    // SAFETY: per the contract; the first field is at offset 0 in every layout.
    let n_tokens = unsafe { (*batch).n_tokens };
    let composition = if name == Entry::LlamaDecode {
        // SAFETY: the batch's arrays, valid for its tokens, per the contract.
        guarded(|| unsafe {
            batches::classic_composition(
                n_tokens,
                (*batch).n_seq_id as *const i32,
                (*batch).seq_id as *const *const i32,
            )
        })
        .flatten()
    } else {
        None
    };
    (n_tokens.max(0) as u32, composition)
}

/// Calls the real function (`call` gets its address) between `mark(true)` and `mark(false)`;
/// untraced, the call alone.
fn around<T>(real: &Resolved, mark: impl Fn(bool), call: impl FnOnce(usize) -> T) -> T {
    if real.untraced {
        return call(real.real);
    }
    guarded(|| mark(true));
    let out = call(real.real);
    guarded(|| mark(false));
    out
}

/// A span around one llama call (`name` says which), with `n_tokens` (`u32::MAX`: unknown) and
/// the batch's sequences where known.
fn traced_span(
    name: Entry,
    n_tokens: u32,
    composition: Option<Composition>,
    real: &Resolved,
    call: impl FnOnce(usize) -> i32,
) -> i32 {
    around(
        real,
        |begin| span_mark(name, begin, n_tokens, composition),
        call,
    )
}

/// A llama span's begin or end.
fn span_mark(name: Entry, begin: bool, n_tokens: u32, composition: Option<Composition>) {
    let c = composition.unwrap_or_default();
    guarded(|| record::span(name, begin, n_tokens, &c.seqs[..c.n_seqs], c.other_tokens));
}

/// `llama_decode`/`llama_encode` where the batch comes by reference: the reference is handed on.
#[cfg(any(windows, not(target_arch = "x86_64")))]
fn traced_batch_call(name: Entry, ctx: Ptr, batch: BatchRef, ret: usize) -> i32 {
    let Some(real) = real_function(name, ret) else {
        return -1;
    };
    let (n_tokens, composition) = if real.untraced {
        (0, None)
    } else {
        // SAFETY: the caller's batch, per llama_decode's contract.
        guarded(|| unsafe { batch_span(name, batch) }).unwrap_or((u32::MAX, None))
    };
    type LlamaFn = unsafe extern "C-unwind" fn(Ptr, BatchRef) -> i32;
    // SAFETY: the real function, with the caller's arguments (the batch's reference as it came).
    traced_span(name, n_tokens, composition, real, |f| unsafe {
        std::mem::transmute::<usize, LlamaFn>(f)(ctx, batch)
    })
}

#[cfg(any(windows, not(target_arch = "x86_64")))]
pub(super) unsafe extern "C-unwind" fn llama_decode_impl(
    ctx: Ptr,
    batch: BatchRef,
    ret: usize,
) -> i32 {
    traced_batch_call(Entry::LlamaDecode, ctx, batch, ret)
}

#[cfg(any(windows, not(target_arch = "x86_64")))]
pub(super) unsafe extern "C-unwind" fn llama_encode_impl(
    ctx: Ptr,
    batch: BatchRef,
    ret: usize,
) -> i32 {
    traced_batch_call(Entry::LlamaEncode, ctx, batch, ret)
}

/// Before `llama_decode`/`llama_encode` on x86-64 System V: the batch is the first stack
/// argument; its span begins here and ends in [`in_place_exit`].
#[cfg(all(target_arch = "x86_64", not(windows)))]
fn batch_enter(name: Entry, batch: *const LlamaBatch, return_address: usize) -> in_place::Next {
    let Some(real) = real_function(name, return_address) else {
        return in_place::Next::NONE;
    };
    let mut frame = std::ptr::null_mut();
    if !real.untraced {
        // SAFETY: the caller's batch, in its frame, per llama_decode's contract.
        let (n_tokens, composition) =
            guarded(|| unsafe { batch_span(name, batch) }).unwrap_or((u32::MAX, None));
        let pending = in_place::Pending::Span {
            name,
            n_tokens,
            composition,
        };
        // The stack pointer at the export's entry: just below the stack arguments.
        let entry_sp = batch as usize - 8;
        frame = in_place::push(entry_sp, return_address, pending);
        if !frame.is_null() {
            span_mark(name, true, n_tokens, composition);
        }
    }
    in_place::Next {
        real: real.real,
        frame,
    }
}

#[cfg(all(target_arch = "x86_64", not(windows)))]
pub(super) extern "C" fn decode_enter(
    _registers: &in_place::SavedRegisters,
    stack_args: *const LlamaBatch,
    return_address: usize,
) -> in_place::Next {
    batch_enter(Entry::LlamaDecode, stack_args, return_address)
}

#[cfg(all(target_arch = "x86_64", not(windows)))]
pub(super) extern "C" fn encode_enter(
    _registers: &in_place::SavedRegisters,
    stack_args: *const LlamaBatch,
    return_address: usize,
) -> in_place::Next {
    batch_enter(Entry::LlamaEncode, stack_args, return_address)
}

/// After an in-place export's real function: records what was under way.
#[cfg(all(target_arch = "x86_64", not(windows)))]
pub(super) extern "C" fn in_place_exit(result: usize) {
    match in_place::pop() {
        Some(in_place::Pending::Buffer { buft, helpers }) => {
            buffer_made(helpers, buft, result as Ptr)
        }
        Some(in_place::Pending::Span {
            name,
            n_tokens,
            composition,
        }) => span_mark(name, false, n_tokens, composition),
        None => {}
    }
}

/// `llama_process(ctx, LLAMA_PROCESS_TYPE_{ENCODE,DECODE}, batch_ext)`: recorded as the
/// llama_encode / llama_decode span it stands for.
pub(super) unsafe extern "C-unwind" fn llama_process_impl(
    ctx: Ptr,
    kind: c_int,
    batch: Ptr,
    ret: usize,
) -> i32 {
    let Some(real) = real_function(Entry::LlamaProcess, ret) else {
        return -1;
    };
    let name = if kind == 0 {
        Entry::LlamaEncode
    } else {
        Entry::LlamaDecode
    };
    let n_tokens = guarded(|| batches::batch_tokens(batch))
        .flatten()
        .unwrap_or(u32::MAX);
    let composition = guarded(|| batches::batch_composition(batch)).flatten();
    type ProcessFn = unsafe extern "C-unwind" fn(Ptr, c_int, Ptr) -> i32;
    // SAFETY: the real llama_process, with the caller's arguments.
    traced_span(name, n_tokens, composition, real, |f| unsafe {
        std::mem::transmute::<usize, ProcessFn>(f)(ctx, kind, batch)
    })
}

pub(super) unsafe extern "C-unwind" fn batch_ext_add(batch: Ptr, seq_id: i32, ret: usize) -> i32 {
    let Some(real) = real_function(Entry::LlamaBatchExtAdd, ret) else {
        return -1;
    };
    type AddFn = unsafe extern "C-unwind" fn(Ptr, i32) -> i32;
    // SAFETY: the real llama_batch_ext_add, with the caller's arguments.
    let index = unsafe { std::mem::transmute::<usize, AddFn>(real.real)(batch, seq_id) };
    if !real.untraced {
        guarded(|| batches::token_added(batch, index, seq_id));
    }
    index
}

pub(super) unsafe extern "C-unwind" fn batch_ext_add_token(
    batch: Ptr,
    seq_id: i32,
    token: i32,
    ret: usize,
) -> i32 {
    let Some(real) = real_function(Entry::LlamaBatchExtAddToken, ret) else {
        return -1;
    };
    type AddTokenFn = unsafe extern "C-unwind" fn(Ptr, i32, i32) -> i32;
    // SAFETY: the real llama_batch_ext_add_token, with the caller's arguments.
    let index =
        unsafe { std::mem::transmute::<usize, AddTokenFn>(real.real)(batch, seq_id, token) };
    if !real.untraced {
        guarded(|| batches::token_added(batch, index, seq_id));
    }
    index
}

/// `struct llama_embd` (llama.h): rows of an input embedding, passed by value to
/// `llama_batch_ext_add_embd` (one batch entry whatever its rows).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct LlamaEmbd {
    data: *const f32,
    n_rows: usize,
    n_embd: usize,
}

pub(super) unsafe extern "C-unwind" fn batch_ext_add_embd(
    batch: Ptr,
    seq_id: i32,
    embd: LlamaEmbd,
    ret: usize,
) -> i32 {
    let Some(real) = real_function(Entry::LlamaBatchExtAddEmbd, ret) else {
        return -1;
    };
    type AddEmbdFn = unsafe extern "C-unwind" fn(Ptr, i32, LlamaEmbd) -> i32;
    // SAFETY: the real llama_batch_ext_add_embd, with the caller's arguments.
    let index = unsafe { std::mem::transmute::<usize, AddEmbdFn>(real.real)(batch, seq_id, embd) };
    if !real.untraced {
        guarded(|| batches::token_added(batch, index, seq_id));
    }
    index
}

pub(super) unsafe extern "C-unwind" fn batch_ext_add_seq(
    batch: Ptr,
    idx: i32,
    seq_id: i32,
    ret: usize,
) -> bool {
    let Some(real) = real_function(Entry::LlamaBatchExtAddSeq, ret) else {
        return false;
    };
    type AddSeqFn = unsafe extern "C-unwind" fn(Ptr, i32, i32) -> bool;
    // SAFETY: the real llama_batch_ext_add_seq, with the caller's arguments.
    let added = unsafe { std::mem::transmute::<usize, AddSeqFn>(real.real)(batch, idx, seq_id) };
    if added && !real.untraced {
        guarded(|| batches::seq_added(batch, seq_id));
    }
    added
}

/// A span around `llama_memory_seq_rm`: a server clears a slot's sequence (from position 0) when
/// its next request starts, which tells where a request begins.
pub(super) unsafe extern "C-unwind" fn memory_seq_rm(
    mem: Ptr,
    seq_id: i32,
    p0: i32,
    p1: i32,
    ret: usize,
) -> bool {
    let Some(real) = real_function(Entry::LlamaMemorySeqRm, ret) else {
        return false;
    };
    type SeqRmFn = unsafe extern "C-unwind" fn(Ptr, i32, i32, i32) -> bool;
    around(
        real,
        |begin| record::seq_removed(begin, seq_id, p0, p1),
        // SAFETY: the real llama_memory_seq_rm, with the caller's arguments.
        |f| unsafe { std::mem::transmute::<usize, SeqRmFn>(f)(mem, seq_id, p0, p1) },
    )
}

pub(super) unsafe extern "C-unwind" fn batch_ext_clear(batch: Ptr, ret: usize) {
    let Some(real) = real_function(Entry::LlamaBatchExtClear, ret) else {
        return;
    };
    type ClearFn = unsafe extern "C-unwind" fn(Ptr);
    // SAFETY: the real llama_batch_ext_clear, with the caller's argument.
    unsafe { std::mem::transmute::<usize, ClearFn>(real.real)(batch) };
    if !real.untraced {
        guarded(|| batches::batch_cleared(batch));
    }
}

/// A batch is freed: what was counted for it is forgotten, its slot free for the next (which may
/// be made at the same address).
pub(super) unsafe extern "C-unwind" fn batch_ext_free(batch: Ptr, ret: usize) {
    let Some(real) = real_function(Entry::LlamaBatchExtFree, ret) else {
        return;
    };
    if !real.untraced {
        guarded(|| batches::batch_freed(batch));
    }
    type FreeFn = unsafe extern "C-unwind" fn(Ptr);
    // SAFETY: the real llama_batch_ext_free, with the caller's argument.
    unsafe { std::mem::transmute::<usize, FreeFn>(real.real)(batch) };
}
