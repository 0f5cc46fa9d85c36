//! Backend buffers' events (memory tracking): made or freed, and what the program said one holds.

use std::ffi::c_void;

use ggml_viz_format::EventType;

use super::{Claim, local, push};
use crate::base::ring::RawEvent;
use crate::record::packing;
use crate::record::recorder::Recorder;
use crate::record::session::current;

/// A backend buffer was made (`alloc`, after `ggml_backend_buffer_init` returned it) or is about
/// to be freed: TENSOR_ALLOC / TENSOR_FREE keyed by the buffer handle, with its real size, its
/// base address and its buffer type's name. Only with memory tracking on.
pub fn buffer_event(
    alloc: bool,
    buffer: *mut c_void,
    size: u64,
    base: u64,
    buft_name: impl FnOnce(&Recorder) -> u16,
) {
    let Some(r) = tracking_memory() else { return };
    let ty = if alloc {
        EventType::TensorAlloc
    } else {
        EventType::TensorFree
    };
    let event = RawEvent {
        type_code: ty.code(),
        a: buffer as u64,
        size,
        d: base,
        name_id: buft_name(r),
        ..RawEvent::default()
    };
    local(r, |l| push(l, r, event, Claim::Plain));
}

/// The program told ggml what backend buffer `buffer` holds: recorded with memory tracking on.
pub fn buffer_use(buffer: *mut c_void, what: packing::BufferUse<'_>) {
    let Some(r) = tracking_memory() else { return };
    let event = packing::buffer_use_event(buffer as u64, what);
    local(r, |l| push(l, r, event, Claim::Plain));
}

/// The recorder, if one records this call with memory tracking on.
fn tracking_memory() -> Option<&'static Recorder> {
    current(1).filter(|r| r.config.memory_tracking)
}
