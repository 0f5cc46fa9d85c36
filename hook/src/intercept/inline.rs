//! Inline hooks: an entry point's first instructions are patched (`detour`) to jump to a
//! replacement (our exported wrapper), and a trampoline runs the original. Used where the dynamic
//! loader cannot put our wrapper in front of ggml: a ggml linked into the executable itself
//! (Linux) and Windows DLLs; the installers in [`crate::intercept::install`] say where.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::base::entry::Entry;
use crate::base::ggml::Helpers;
use crate::base::say;

const ENTRIES: usize = Entry::ALL.len();

/// Per entry (by code - 1): the trampoline that runs the original, once hooked.
static ORIGINALS: [AtomicUsize; ENTRIES] = [const { AtomicUsize::new(0) }; ENTRIES];

/// The helpers (`ggml_graph_n_nodes`, …) of the hooked ggml.
static HELPERS: OnceLock<Helpers> = OnceLock::new();

/// Patches the function at `target` (ggml's `entry`) to run `replacement` instead; says so on
/// stderr when it cannot.
///
/// # Safety
/// `target` must be the start of ggml's function `entry`, `replacement` a function with the
/// same C signature, and no thread may be running inside `target`'s first bytes while they are
/// patched.
pub unsafe fn hook(entry: Entry, target: usize, replacement: *const (), whose: &str) -> bool {
    if original(entry).is_some() {
        return true;
    }
    // SAFETY: the caller's contract.
    let hooked = unsafe {
        detour::RawDetour::new(target as *const (), replacement)
            .and_then(|d| d.enable().map(|()| d))
    };
    match hooked {
        Ok(d) => {
            ORIGINALS[entry as usize - 1].store(d.trampoline() as usize, Ordering::Release);
            // Hooks stay for the life of the process.
            std::mem::forget(d);
            true
        }
        Err(err) => {
            say(format_args!(
                "cannot hook {whose} {}: {err}; its calls are not traced",
                entry.name()
            ));
            false
        }
    }
}

/// Sets the helpers, found by `lookup`; those that are hooked entry points (the eval-callback
/// setter) run the original, not our wrapper.
pub fn set_helpers(mut lookup: impl FnMut(&std::ffi::CStr) -> Option<usize>) -> &'static Helpers {
    HELPERS.get_or_init(|| {
        Helpers::load(|name| {
            let hooked = Entry::ALL
                .into_iter()
                .find(|e| e.c_name() == name)
                .and_then(original);
            hooked.or_else(|| lookup(name))
        })
    })
}

/// The trampoline to the original `entry`, when it was hooked.
pub fn original(entry: Entry) -> Option<usize> {
    let i = entry as usize - 1;
    Some(ORIGINALS[i].load(Ordering::Acquire)).filter(|&a| a != 0)
}

/// The helpers of the hooked ggml, for a real function that is one of our trampolines.
#[cfg(target_os = "linux")]
pub fn helpers_for(real: usize) -> Option<&'static Helpers> {
    ORIGINALS
        .iter()
        .any(|o| o.load(Ordering::Acquire) == real)
        .then(|| HELPERS.get())
        .flatten()
}
