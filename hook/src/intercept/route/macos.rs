//! macOS: finding the real ggml functions behind our wrappers, through dyld interposing.
//!
//! With `DYLD_INSERT_LIBRARIES`, dyld reads our `__DATA,__interpose` section: pairs of
//! (replacement, original). Every image's references to an original are bound to our
//! replacement — except our own image's, so the original slot of each pair, read here, holds the
//! real function. (Exporting functions of the same name, as on Linux, does nothing on macOS:
//! images bind symbols to the library they were linked against, two-level namespaces.)
//!
//! The originals are weak references: in a process without ggml (a shell inheriting the
//! variable) they bind to null and dyld skips the pair, instead of refusing to start the program.
//! Helpers (`ggml_graph_n_nodes`, …) are looked up in the image that defines the real function.
//!
//! Type-checked in CI for x86_64 and aarch64; not run (no macOS here).

use std::ffi::{CStr, CString};

use super::{Resolved, per_entry};
use crate::base::entry::Entry;
use crate::base::ggml::Helpers;

// The interpose pairs, in the order of `Entry::ALL`; our wrappers are exported with a
// `ggml_viz_` prefix so that the originals' names refer to ggml's functions.
macro_rules! interpose_table {
    ($($name:literal),* $(,)?) => {
        core::arch::global_asm!(
            ".section __DATA,__interpose",
            ".p2align 3",
            ".private_extern _ggml_viz_interpose_table",
            "_ggml_viz_interpose_table:",
            $(
                concat!(".quad _ggml_viz_", $name),
                concat!(".quad _", $name),
                concat!(".weak_reference _", $name),
            )*
        );
    };
}

interpose_table!(
    "ggml_backend_sched_graph_compute",
    "ggml_backend_sched_graph_compute_async",
    "ggml_backend_graph_compute",
    "ggml_backend_graph_compute_async",
    "ggml_graph_compute",
    "ggml_graph_compute_with_ctx",
    "ggml_backend_synchronize",
    "ggml_backend_sched_synchronize",
    "ggml_backend_sched_set_eval_callback",
    "llama_decode",
    "llama_encode",
    "llama_process",
    "llama_batch_ext_add",
    "llama_batch_ext_add_token",
    "llama_batch_ext_clear",
    "ggml_backend_buffer_init",
    "ggml_backend_buffer_free",
    "ggml_backend_sched_free",
    "llama_batch_ext_add_embd",
    "llama_batch_ext_add_seq",
    "llama_memory_seq_rm",
    "llama_batch_ext_free",
    "ggml_backend_buffer_set_usage",
    "ggml_backend_alloc_ctx_tensors_from_buft",
);

unsafe extern "C" {
    /// (replacement, original) per entry, as dyld bound them for our image.
    static ggml_viz_interpose_table: [[usize; 2]; Entry::ALL.len()];
}

/// The real function for `entry`, and whether this call resolved it afresh; `None` if no loaded
/// image defines it. The return address does not matter here: dyld bound every caller.
pub fn resolve(entry: Entry, _return_address: usize) -> Option<(&'static Resolved, bool)> {
    per_entry(entry, || {
        // SAFETY: the table is in our image, written by dyld before any of our code runs.
        let real = unsafe { ggml_viz_interpose_table[entry as usize - 1][1] };
        (real != 0).then(|| (real, &*Box::leak(Box::new(helpers_of(real)))))
    })
}

/// Where a call goes when [`resolve`] failed (our code panicked): the original dyld bound,
/// untraced.
pub fn fallback(entry: Entry) -> Option<&'static Resolved> {
    // SAFETY: the table is in our image, written by dyld before any of our code runs.
    let real = unsafe { ggml_viz_interpose_table[entry as usize - 1][1] };
    (real != 0).then(|| super::untraced(real))
}

/// The image containing `address`, by path.
fn image_of(address: usize) -> Option<CString> {
    // SAFETY: Dl_info is plain data that dladdr fills.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: any address may be asked about; `info` is writable.
    if unsafe { libc::dladdr(address as *const libc::c_void, &mut info) } == 0
        || info.dli_fname.is_null()
    {
        return None;
    }
    // SAFETY: dli_fname is a NUL-terminated path owned by dyld.
    Some(unsafe { CStr::from_ptr(info.dli_fname) }.to_owned())
}

/// The helpers of the image that defines `real`.
fn helpers_of(real: usize) -> Helpers {
    let handle = image_of(real)
        // SAFETY: RTLD_NOLOAD only returns a handle for an image that is already loaded.
        .map(|path| unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOLOAD | libc::RTLD_LAZY) })
        .filter(|h| !h.is_null())
        .unwrap_or(libc::RTLD_DEFAULT);
    Helpers::load(|name| {
        // SAFETY: a valid handle and C string.
        let found = unsafe { libc::dlsym(handle, name.as_ptr()) } as usize;
        (found != 0).then_some(found)
    })
}

/// Where a call goes, for `verbose`.
pub fn describe_route(entry: Entry, _return_address: usize, resolved: &Resolved) -> String {
    let image = image_of(resolved.real)
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_else(|| format!("{:#x}", resolved.real));
    format!("{} goes to {image} (interposed by dyld)", entry.name())
}
