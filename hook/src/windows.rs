//! Windows: `ggml_viz_hook.dll`, injected into the program (`ggml-viz record` starts it
//! suspended and loads the DLL into it), puts inline hooks ([`crate::inline`]) on the entry
//! points exported by ggml's DLLs — those loaded when the DLL arrives, and those loaded later
//! (a loader notification). Calls then reach our wrappers, which find the original here.

use std::ffi::{CStr, c_void};

use crate::capture::Entry;
use crate::resolved::per_entry;
pub use crate::resolved::{Resolved, first_helpers};

/// The DLLs that export ggml's and llama.cpp's entry points (MSVC and MinGW names).
const MODULES: [&CStr; 6] = [
    c"ggml-base.dll",
    c"ggml.dll",
    c"ggml-cpu.dll",
    c"llama.dll",
    c"libllama.dll",
    c"ggml-cuda.dll",
];

type Module = *mut c_void;

#[link(name = "kernel32")]
unsafe extern "system" {
    fn GetModuleHandleA(name: *const u8) -> Module;
    fn GetProcAddress(module: Module, name: *const u8) -> *const c_void;
}

const DLL_PROCESS_ATTACH: u32 = 1;

/// Runs when the DLL is loaded into the program: hooks what is there, and asks to hear of DLLs
/// loaded later.
#[unsafe(no_mangle)]
extern "system" fn DllMain(_module: Module, reason: u32, _reserved: *mut c_void) -> i32 {
    if reason == DLL_PROCESS_ATTACH {
        // A panic must not leave DllMain.
        let _ = std::panic::catch_unwind(|| {
            hook_loaded_modules();
            watch_later_loads();
        });
    }
    1
}

/// The ggml DLLs loaded now, with their handles.
fn loaded_modules() -> impl Iterator<Item = (&'static CStr, Module)> {
    MODULES.into_iter().filter_map(|module| {
        // SAFETY: a NUL-terminated name; GetModuleHandle does not load anything.
        let handle = unsafe { GetModuleHandleA(module.as_ptr().cast()) };
        (!handle.is_null()).then_some((module, handle))
    })
}

/// `name` exported by the DLL `handle`.
fn export_of(handle: Module, name: &CStr) -> Option<usize> {
    // SAFETY: a loaded module's handle and a NUL-terminated name.
    let found = unsafe { GetProcAddress(handle, name.as_ptr().cast()) };
    (!found.is_null()).then_some(found as usize)
}

/// Hooks every entry point, not hooked yet, exported by a ggml DLL that is loaded now.
fn hook_loaded_modules() {
    for (module, handle) in loaded_modules() {
        for entry in Entry::ALL {
            if let Some(target) = export_of(handle, entry.c_name()) {
                // SAFETY: `target` is the DLL's export of this name. The program's threads are
                // suspended (`record` injects before resuming it) or it is loading this DLL
                // under the loader lock, which it holds, so no thread runs the patched bytes.
                unsafe { crate::inline::hook(entry, target, module.to_str().unwrap_or("")) };
            }
        }
    }
}

/// `LdrRegisterDllNotification` (ntdll): a DLL loaded later (ggml loads its CPU backend at run
/// time) is hooked when it arrives.
fn watch_later_loads() {
    type Callback = unsafe extern "system" fn(u32, *const c_void, *mut c_void);
    type Register = unsafe extern "system" fn(u32, Callback, *mut c_void, *mut *mut c_void) -> i32;
    unsafe extern "system" fn on_load(reason: u32, _data: *const c_void, _context: *mut c_void) {
        const LOADED: u32 = 1;
        if reason == LOADED {
            let _ = std::panic::catch_unwind(hook_loaded_modules);
        }
    }
    // SAFETY: ntdll is always loaded; names are NUL-terminated.
    let register = unsafe {
        GetProcAddress(
            GetModuleHandleA(c"ntdll.dll".as_ptr().cast()),
            c"LdrRegisterDllNotification".as_ptr().cast(),
        )
    };
    if register.is_null() {
        return;
    }
    let mut cookie = std::ptr::null_mut();
    // SAFETY: the export has this signature; the callback lives as long as the process.
    unsafe {
        std::mem::transmute::<*const c_void, Register>(register)(
            0,
            on_load,
            std::ptr::null_mut(),
            &mut cookie,
        )
    };
}

/// Any export of the ggml DLLs loaded now, for the helpers.
fn lookup(name: &CStr) -> Option<usize> {
    loaded_modules().find_map(|(_, handle)| export_of(handle, name))
}

/// The original of `entry` (its hook's trampoline), and whether this call resolved it afresh.
pub fn resolve(entry: Entry, _return_address: usize) -> Option<(&'static Resolved, bool)> {
    // By the first call, the DLLs the helpers come from are loaded.
    per_entry(entry, || {
        crate::inline::original(entry).map(|real| (real, crate::inline::set_helpers(lookup)))
    })
}

pub fn describe_route(entry: Entry, _return_address: usize, _resolved: &Resolved) -> String {
    format!("{} goes to its DLL through an inline hook", entry.name())
}
