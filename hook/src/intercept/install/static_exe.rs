//! Statically linked ggml: when the executable itself defines the ggml entry points (llama.cpp
//! built with `-DBUILD_SHARED_LIBS=OFF`), preloading cannot reach them — the executable calls
//! its own functions directly, never through the dynamic loader. When its symbol table is
//! present, each entry point it defines gets an inline hook ([`crate::intercept::inline`]) at start-up;
//! [`crate::intercept::route`] then sends calls from the executable to the hook's trampoline.
//!
//! The patching happens in a constructor, before `main` and before any other thread exists. It
//! costs a process without ggml in its executable one open, one map and a symbol-table scan (none
//! at all for a stripped executable, which has no table to scan).

use std::collections::HashMap;

use std::path::Path;

use object::{Object, ObjectSymbol, SymbolKind};

use ggml_viz_config::{Config, Sources};

use crate::base::entry::Entry;
use crate::base::objects;
use crate::base::say;
use crate::intercept::{exports, inline};

#[used]
#[unsafe(link_section = ".init_array")]
static AT_LOAD: extern "C" fn() = hook_executable_ggml;

extern "C" fn hook_executable_ggml() {
    // A panic must not leave a constructor: it would abort the host before `main`.
    crate::base::contained(install);
}

fn install() {
    // Disabled or misconfigured: no tracing will start, so nothing is patched (the session says
    // why, at the first call).
    let Ok(config) = Config::load(&Sources::from_process_env()) else {
        return;
    };
    if config.disable {
        return;
    }
    let Some(symbols) = executable_symbols() else {
        return;
    };
    // An executable that links this crate itself (our tests and benchmarks): its ggml-named
    // functions are our own wrappers.
    if Entry::ALL
        .into_iter()
        .any(|e| symbols.get(e.name()) == Some(&(exports::wrapper(e) as usize)))
    {
        return;
    }
    let mut hooked = 0;
    for entry in Entry::ALL {
        if let Some(&target) = symbols.get(entry.name()) {
            // SAFETY: `target` is the start of the executable's own function of this name (its
            // symbol table says so), and no other thread runs yet (this is a constructor).
            let replacement = exports::wrapper(entry);
            hooked += usize::from(unsafe {
                inline::hook(entry, target, replacement, "the executable's own")
            });
        }
    }
    if config.verbose {
        say(format_args!(
            "ggml is linked into the executable: {hooked} of its entry points hooked inline"
        ));
    }
    inline::set_helpers(|name| name.to_str().ok().and_then(|n| symbols.get(n)).copied());
}

/// The executable's defined functions named `ggml_*` or `llama_*`, at their run-time addresses;
/// `None` when it defines no entry point of ours (ggml comes from shared libraries, or none).
fn executable_symbols() -> Option<HashMap<String, usize>> {
    let bias = main_program_bias();
    let found = objects::with_elf(Path::new("/proc/self/exe"), |elf| {
        let mut found = HashMap::new();
        for symbol in elf.symbols() {
            if symbol.kind() != SymbolKind::Text || !symbol.is_definition() {
                continue;
            }
            if let Ok(name) = symbol.name()
                && (name.starts_with("ggml_") || name.starts_with("llama_"))
            {
                found.insert(
                    name.to_string(),
                    bias.wrapping_add(symbol.address() as usize),
                );
            }
        }
        found
    })?;
    Entry::ALL
        .iter()
        .any(|e| found.contains_key(e.name()))
        .then_some(found)
}

/// Where the executable was loaded relative to its link-time addresses (0 unless it is PIE).
fn main_program_bias() -> usize {
    unsafe extern "C" fn first(
        info: *mut libc::dl_phdr_info,
        _size: usize,
        data: *mut std::ffi::c_void,
    ) -> std::ffi::c_int {
        // SAFETY: dl_iterate_phdr passes a valid info and our usize; the first object it visits
        // is the main program.
        unsafe { *(data as *mut usize) = (*info).dlpi_addr as usize };
        1
    }
    let mut bias = 0usize;
    // SAFETY: the callback writes only `bias`, which outlives the call.
    unsafe {
        libc::dl_iterate_phdr(
            Some(first),
            &mut bias as *mut usize as *mut std::ffi::c_void,
        )
    };
    bias
}
