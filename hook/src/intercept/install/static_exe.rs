//! Statically linked ggml: when the executable itself defines the ggml entry points (llama.cpp
//! built with `-DBUILD_SHARED_LIBS=OFF`), preloading cannot reach them — the executable calls
//! its own functions directly, never through the dynamic loader. When its symbol table is
//! present, each entry point it defines, and each of the CPU backend's per-op functions (for
//! per-thread op timing), gets an inline hook ([`crate::intercept::inline`]) at start-up;
//! [`crate::intercept::route`] then sends calls from the executable to the hook's trampoline.
//!
//! The patching happens in a constructor, before `main` and before any other thread exists. It
//! costs a process without ggml in its executable one open, one map and a symbol-table scan (none
//! at all for a stripped executable, which has no table to scan); only an executable that defines
//! ggml's entry points reads the configuration.

use std::collections::HashMap;

use std::path::Path;

use object::{Object, ObjectSymbol, SymbolKind};

use ggml_viz_config::{Config, Sources};

use crate::base::entry::Entry;
use crate::base::objects;
use crate::base::say;
#[cfg(target_arch = "x86_64")]
use crate::intercept::cpu_ops;
use crate::intercept::{exports, inline};

#[used]
#[unsafe(link_section = ".init_array")]
static AT_LOAD: extern "C" fn() = hook_executable_ggml;

extern "C" fn hook_executable_ggml() {
    // A panic must not leave a constructor: it would abort the host before `main`.
    crate::base::contained(install);
}

fn install() {
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
    // An executable without ggml of its own (every child of a shell that exported LD_PRELOAD)
    // reads no configuration: nothing starts before the first ggml call.
    if !Entry::ALL
        .into_iter()
        .any(|e| symbols.contains_key(e.name()))
    {
        return;
    }
    // Disabled or misconfigured: no tracing will start, so nothing is patched (the session says
    // why, at the first call).
    let Ok(config) = Config::load(&Sources::from_process_env()) else {
        return;
    };
    if config.disable {
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
    #[cfg(target_arch = "x86_64")]
    let (cpu_hooked, cpu_failed) = hook_cpu_functions(&symbols);
    #[cfg(not(target_arch = "x86_64"))]
    let (cpu_hooked, cpu_failed) = (0, 0);
    if cpu_failed > 0 {
        say(format_args!(
            "{cpu_failed} of the executable's own per-op functions could not be hooked; their \
             calls are not timed per thread"
        ));
    }
    if config.verbose {
        say(format_args!(
            "ggml is linked into the executable: {hooked} of its entry points and \
             {cpu_hooked} of its per-op functions hooked inline"
        ));
    }
    inline::set_helpers(|name| name.to_str().ok().and_then(|n| symbols.get(n)).copied());
}

/// Inline hooks on the executable's own CPU-backend per-op functions, `ggml_barrier` and
/// `ggml_cpu_extra_compute_forward`, to our per-thread wrappers: ggml calls them directly
/// there, never through a PLT. Returns how many were hooked and how many could not be.
#[cfg(target_arch = "x86_64")]
fn hook_cpu_functions(symbols: &HashMap<String, usize>) -> (usize, usize) {
    let (mut hooked, mut failed) = (0, 0);
    for (row, name, wrapper) in cpu_ops::wrapped() {
        let Some(&target) = name.to_str().ok().and_then(|n| symbols.get(n)) else {
            continue;
        };
        // SAFETY: `target` is the start of the executable's own function of this name (its
        // symbol table says so), `wrapper` forwards every argument register and the return
        // value to the original, and no other thread runs yet (this is a constructor).
        if unsafe { inline::hook_cpu(row, name, target, wrapper) } {
            hooked += 1;
        } else {
            failed += 1;
        }
    }
    (hooked, failed)
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
