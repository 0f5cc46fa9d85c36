//! Backend buffers: made (`ggml_backend_buffer_init`), told what they hold
//! (`ggml_backend_buffer_set_usage`, `ggml_backend_alloc_ctx_tensors_from_buft`) and freed.

use std::ffi::{c_int, c_void};

use super::calls::{guarded, name_of, real_function};
use crate::base::entry::Entry;
use crate::base::ggml::Helpers;
use crate::base::names::Owner;
#[cfg(all(target_arch = "x86_64", not(windows)))]
use crate::intercept::in_place;
use crate::record;

type Ptr = *mut c_void;

/// A pointer to the caller's copy of `struct ggml_backend_buffer_i` (how aarch64 and Windows
/// pass that struct by value).
#[cfg(any(windows, not(target_arch = "x86_64")))]
pub(super) type IfaceRef = *const c_void;

#[cfg(any(windows, not(target_arch = "x86_64")))]
pub(super) unsafe extern "C-unwind" fn buffer_init(
    buft: Ptr,
    iface: IfaceRef,
    context: Ptr,
    size: usize,
    ret: usize,
) -> Ptr {
    let Some(real) = real_function(Entry::BufferInit, ret) else {
        return std::ptr::null_mut();
    };
    type InitFn = unsafe extern "C-unwind" fn(Ptr, IfaceRef, Ptr, usize) -> Ptr;
    // SAFETY: the real ggml_backend_buffer_init, with the caller's arguments (the interface by
    // reference, as it came).
    let buffer =
        unsafe { std::mem::transmute::<usize, InitFn>(real.real)(buft, iface, context, size) };
    if !real.untraced {
        buffer_made(real.helpers, buft, buffer);
    }
    buffer
}

/// Records a buffer `ggml_backend_buffer_init` made (null: it failed, nothing to record).
pub(super) fn buffer_made(helpers: &Helpers, buft: Ptr, buffer: Ptr) {
    if buffer.is_null() {
        return;
    }
    guarded(|| {
        // SAFETY: the buffer was just made by this copy of ggml.
        let (base, size, _) = unsafe { helpers.buffer(buffer) };
        record::buffer_event(true, buffer, size, base, |r| {
            name_of(r, helpers, buft, Owner::BufferType)
        });
    });
}

/// Before `ggml_backend_buffer_init(buft, iface, context, size)` on x86-64 System V: `buft` is
/// the first register argument; the interface struct on the stack is not looked at.
#[cfg(all(target_arch = "x86_64", not(windows)))]
pub(super) extern "C" fn buffer_init_enter(
    registers: &in_place::SavedRegisters,
    stack_args: *const c_void,
    return_address: usize,
) -> in_place::Next {
    let Some(real) = real_function(Entry::BufferInit, return_address) else {
        return in_place::Next::NONE;
    };
    let pending = in_place::Pending::Buffer {
        buft: registers[0] as Ptr,
        helpers: real.helpers,
    };
    let frame = if real.untraced {
        std::ptr::null_mut()
    } else {
        in_place::push(stack_args as usize - 8, return_address, pending)
    };
    in_place::Next {
        real: real.real,
        frame,
    }
}

pub(super) unsafe extern "C-unwind" fn buffer_free(buffer: Ptr, ret: usize) {
    let Some(real) = real_function(Entry::BufferFree, ret) else {
        return;
    };
    if !buffer.is_null() && !real.untraced {
        guarded(|| {
            // SAFETY: the buffer is still live: it is freed below.
            let (base, size, buft) = unsafe { real.helpers.buffer(buffer) };
            record::buffer_event(false, buffer, size, base, |r| {
                name_of(r, real.helpers, buft, Owner::BufferType)
            });
        });
    }
    type FreeFn = unsafe extern "C-unwind" fn(Ptr);
    // SAFETY: the real ggml_backend_buffer_free, with the caller's argument.
    unsafe { std::mem::transmute::<usize, FreeFn>(real.real)(buffer) }
}

/// The program tells ggml what a buffer is for (llama.cpp: its weights, ggml's graph allocator:
/// compute buffers): recorded after the call, with memory tracking on.
pub(super) unsafe extern "C-unwind" fn buffer_set_usage(buffer: Ptr, usage: c_int, ret: usize) {
    let Some(real) = real_function(Entry::BufferSetUsage, ret) else {
        return;
    };
    type SetUsageFn = unsafe extern "C-unwind" fn(Ptr, c_int);
    // SAFETY: the real ggml_backend_buffer_set_usage, with the caller's arguments.
    unsafe { std::mem::transmute::<usize, SetUsageFn>(real.real)(buffer, usage) };
    if !buffer.is_null() && !real.untraced {
        guarded(|| record::buffer_use(buffer, record::BufferUse::Usage(usage as u32)));
    }
}

/// A buffer made for a context's tensors (llama.cpp's KV cache, a model's weights): recorded
/// after the call with the name of the context's first tensor, with memory tracking on.
pub(super) unsafe extern "C-unwind" fn alloc_ctx_tensors(ctx: Ptr, buft: Ptr, ret: usize) -> Ptr {
    let Some(real) = real_function(Entry::AllocCtxTensors, ret) else {
        return std::ptr::null_mut();
    };
    type AllocFn = unsafe extern "C-unwind" fn(Ptr, Ptr) -> Ptr;
    // SAFETY: the real ggml_backend_alloc_ctx_tensors_from_buft, with the caller's arguments.
    let buffer = unsafe { std::mem::transmute::<usize, AllocFn>(real.real)(ctx, buft) };
    if !buffer.is_null() && !real.untraced {
        guarded(|| {
            // SAFETY: the caller's context, live for its call, of this copy of ggml; its first
            // tensor (when it has one) is live with it.
            let name = unsafe {
                let first = real.helpers.first_tensor(ctx);
                (!first.is_null()).then(|| real.helpers.tensor_name_cstr(first))
            };
            if let Some(name) = name {
                record::buffer_use(buffer, record::BufferUse::FirstTensor(name.to_bytes()));
            }
        });
    }
    buffer
}
