//! Backend buffers' events (memory tracking): made or freed, and what the program said one holds.

use std::ffi::c_void;

use super::{Claim, local, push};
use crate::record::raw::{BufferEdge, BufferHeld, BufferUse};
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
    let event = BufferEdge {
        alloc,
        buffer: buffer as u64,
        size,
        base,
        name_id: buft_name(r),
    }
    .event();
    local(r, |l| push(l, r, event, Claim::Plain));
}

/// The program told ggml what backend buffer `buffer` holds: recorded with memory tracking on.
pub fn buffer_use(buffer: *mut c_void, what: BufferUse<'_>) {
    let Some(r) = tracking_memory() else { return };
    let buffer = buffer as u64;
    let event = BufferHeld { buffer, what }.event();
    local(r, |l| push(l, r, event, Claim::Plain));
}

/// The recorder, if one records this call with memory tracking on.
fn tracking_memory() -> Option<&'static Recorder> {
    current(1).filter(|r| r.config.memory_tracking)
}
