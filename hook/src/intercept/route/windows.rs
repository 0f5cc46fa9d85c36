//! Windows: the entry points exported by ggml's DLLs carry inline hooks (put there by
//! [`crate::intercept::install`]); a call reaches our wrapper, which finds the original here: the
//! hook's trampoline. Helpers come from the same DLLs.

use std::ffi::{CStr, c_void};

use super::{Resolved, per_entry};
use crate::base::entry::Entry;
use crate::intercept::inline;

/// The DLLs that export ggml's and llama.cpp's entry points (MSVC and MinGW names).
const MODULES: [&CStr; 6] = [
    c"ggml-base.dll",
    c"ggml.dll",
    c"ggml-cpu.dll",
    c"llama.dll",
    c"libllama.dll",
    c"ggml-cuda.dll",
];

pub type Module = *mut c_void;

#[link(name = "kernel32")]
unsafe extern "system" {
    pub fn GetModuleHandleA(name: *const u8) -> Module;
    pub fn GetProcAddress(module: Module, name: *const u8) -> *const c_void;
}

/// The ggml DLLs loaded now, with their handles.
pub fn loaded_ggml_modules() -> impl Iterator<Item = (&'static CStr, Module)> {
    MODULES.into_iter().filter_map(|module| {
        // SAFETY: a NUL-terminated name; GetModuleHandle does not load anything.
        let handle = unsafe { GetModuleHandleA(module.as_ptr().cast()) };
        (!handle.is_null()).then_some((module, handle))
    })
}

/// `name` exported by the DLL `handle`.
pub fn export_of(handle: Module, name: &CStr) -> Option<usize> {
    // SAFETY: a loaded module's handle and a NUL-terminated name.
    let found = unsafe { GetProcAddress(handle, name.as_ptr().cast()) };
    (!found.is_null()).then_some(found as usize)
}

/// Any export of the ggml DLLs loaded now, for the helpers.
fn lookup(name: &CStr) -> Option<usize> {
    loaded_ggml_modules().find_map(|(_, handle)| export_of(handle, name))
}

/// The original of `entry` (its hook's trampoline), and whether this call resolved it afresh.
pub fn resolve(entry: Entry, _return_address: usize) -> Option<(&'static Resolved, bool)> {
    // By the first call, the DLLs the helpers come from are loaded.
    per_entry(entry, || {
        inline::original(entry).map(|real| (real, inline::set_helpers(lookup)))
    })
}

/// Where a call goes when [`resolve`] failed (our code panicked): the original of its inline
/// hook, untraced.
pub fn fallback(entry: Entry) -> Option<&'static Resolved> {
    inline::original(entry).map(super::untraced)
}

pub fn describe_route(entry: Entry, _return_address: usize, _resolved: &Resolved) -> String {
    format!("{} goes to its DLL through an inline hook", entry.name())
}
