//! Statically linked ggml: when the executable itself defines the ggml entry points (llama.cpp
//! built with `-DBUILD_SHARED_LIBS=OFF`), preloading cannot reach them — the executable calls
//! its own functions directly, never through the dynamic loader. When its symbol table is
//! present, each entry point it defines is patched at start-up with an inline hook (`detour`)
//! that jumps to our exported wrapper; [`crate::resolve`] then sends calls from the executable
//! to the hook's trampoline, which runs the original function.
//!
//! The patching happens in a constructor, before `main` and before any other thread exists. It
//! costs a process without ggml in its executable one open, one map and a symbol-table scan (none
//! at all for a stripped executable, which has no table to scan).

use std::collections::HashMap;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};

use object::{Object, ObjectSymbol, SymbolKind};

use crate::capture::Entry;
use crate::ggml::Helpers;

const ENTRIES: usize = Entry::ALL.len();

/// Per entry (by code - 1): the trampoline that runs the executable's original, once hooked.
static ORIGINALS: [AtomicUsize; ENTRIES] = [const { AtomicUsize::new(0) }; ENTRIES];

/// The helpers (`ggml_graph_n_nodes`, …) of the executable's own ggml, once something is hooked.
static HELPERS: OnceLock<Helpers> = OnceLock::new();

#[used]
#[unsafe(link_section = ".init_array")]
static AT_LOAD: extern "C" fn() = hook_executable_ggml;

extern "C" fn hook_executable_ggml() {
    // A panic must not leave a constructor: it would abort the host before `main`.
    let _ = std::panic::catch_unwind(install);
}

fn install() {
    if std::env::var("GGML_VIZ_DISABLE").is_ok_and(|v| v == "1" || v == "true") {
        return;
    }
    let Some(symbols) = executable_symbols() else {
        return;
    };
    for (i, entry) in Entry::ALL.into_iter().enumerate() {
        let Some(&target) = symbols.get(entry.name()) else {
            continue;
        };
        // SAFETY: `target` is the start of the executable's own function of this name (its
        // symbol table says so), our wrapper has the same C signature, and no other thread runs
        // yet (this is a constructor), so none can be inside the bytes being patched.
        let hooked = unsafe {
            detour::RawDetour::new(target as *const (), crate::exports::wrapper(entry))
                .and_then(|d| d.enable().map(|()| d))
        };
        match hooked {
            Ok(d) => {
                ORIGINALS[i].store(d.trampoline() as usize, Ordering::Release);
                // Hooks stay for the life of the process.
                std::mem::forget(d);
            }
            Err(err) => crate::say(format_args!(
                "cannot hook the executable's own {}: {err}; its calls are not traced",
                entry.name()
            )),
        }
    }
    // Helpers we call ourselves that are also hooked entry points (the eval-callback setter)
    // must run the original, not come back to our wrapper.
    let _ = HELPERS.set(Helpers::load(|name| {
        let hooked = Entry::ALL
            .into_iter()
            .find(|e| e.c_name() == name)
            .and_then(original);
        hooked.or_else(|| name.to_str().ok().and_then(|n| symbols.get(n)).copied())
    }));
}

/// The executable's defined functions named `ggml_*` or `llama_*`, at their run-time addresses;
/// `None` when it defines no entry point of ours (ggml comes from shared libraries, or none).
fn executable_symbols() -> Option<HashMap<String, usize>> {
    let file = std::fs::File::open("/proc/self/exe").ok()?;
    // SAFETY: a running executable's file cannot be written (ETXTBSY); the map is read-only and
    // dropped before we return.
    let map = unsafe { memmap2::Mmap::map(&file) }.ok()?;
    let elf = object::File::parse(&*map).ok()?;
    let bias = main_program_bias();
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

/// The trampoline to the executable's own `entry`, when it was hooked.
pub fn original(entry: Entry) -> Option<usize> {
    let i = entry as usize - 1;
    Some(ORIGINALS[i].load(Ordering::Acquire)).filter(|&a| a != 0)
}

/// The helpers of the executable's ggml, for a real function that is one of our trampolines.
pub fn helpers_for(real: usize) -> Option<&'static Helpers> {
    ORIGINALS
        .iter()
        .any(|o| o.load(Ordering::Acquire) == real)
        .then(|| HELPERS.get())
        .flatten()
}
