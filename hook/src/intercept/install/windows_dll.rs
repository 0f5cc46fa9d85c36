//! Windows: `ggml_viz_hook.dll`, injected into the program (`ggml-viz record` starts it
//! suspended and loads the DLL into it), puts inline hooks ([`crate::intercept::inline`]) on the
//! entry points exported by ggml's DLLs — those loaded when the DLL arrives, and those loaded
//! later (a loader notification). Calls then reach our wrappers.

use std::ffi::c_void;

use crate::base::entry::Entry;
use crate::intercept::route::{
    GetModuleHandleA, GetProcAddress, Module, export_of, loaded_ggml_modules,
};
use crate::intercept::{exports, inline};

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

/// Hooks every entry point, not hooked yet, exported by a ggml DLL that is loaded now.
fn hook_loaded_modules() {
    for (module, handle) in loaded_ggml_modules() {
        for entry in Entry::ALL {
            if let Some(target) = export_of(handle, entry.c_name()) {
                // SAFETY: `target` is the DLL's export of this name. The program's threads are
                // suspended (`record` injects before resuming it) or it is loading this DLL
                // under the loader lock, which it holds, so no thread runs the patched bytes.
                unsafe {
                    inline::hook(
                        entry,
                        target,
                        exports::wrapper(entry),
                        module.to_str().unwrap_or(""),
                    )
                };
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
