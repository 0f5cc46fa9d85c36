//! Inline hooks: an entry point's first instructions are patched (`detour`) to jump to a
//! replacement (our exported wrapper), and a trampoline runs the original. Used where the dynamic
//! loader cannot put our wrapper in front of ggml: a ggml linked into the executable itself
//! (Linux) and Windows DLLs; the installers in [`crate::intercept::install`] say where.

#[cfg(all(target_os = "linux", target_arch = "x86_64"))]
use std::ffi::{CStr, c_char};
use std::sync::OnceLock;
#[cfg(all(target_os = "linux", target_arch = "x86_64"))]
use std::sync::atomic::AtomicPtr;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::base::entry::Entry;
use crate::base::ggml::Helpers;
use crate::base::say;

const ENTRIES: usize = Entry::ALL.len();

/// Per entry (by code - 1): the trampoline that runs the original, once hooked.
static ORIGINALS: [AtomicUsize; ENTRIES] = [const { AtomicUsize::new(0) }; ENTRIES];

/// Per row of [`crate::intercept::cpu_ops`]'s table: the trampoline to the original of the
/// executable's own per-op function, and its name, once hooked.
#[cfg(all(target_os = "linux", target_arch = "x86_64"))]
static CPU_ORIGINALS: [AtomicUsize; 256] = [const { AtomicUsize::new(0) }; 256];
#[cfg(all(target_os = "linux", target_arch = "x86_64"))]
static CPU_NAMES: [AtomicPtr<c_char>; 256] = [const { AtomicPtr::new(std::ptr::null_mut()) }; 256];

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
    // SAFETY: the caller's contract.
    unsafe { patch(&ORIGINALS[entry as usize - 1], target, replacement) }
        .map_err(|err| {
            say(format_args!(
                "cannot hook {whose} {}: {err}; its calls are not traced",
                entry.name()
            ))
        })
        .is_ok()
}

/// [`hook`] for the CPU backend's per-op function `name` (row `row` of
/// [`crate::intercept::cpu_ops`]'s table), without a word when it cannot: the caller counts.
///
/// # Safety
/// As for [`hook`], with `target` the start of ggml's function `name`.
#[cfg(all(target_os = "linux", target_arch = "x86_64"))]
pub unsafe fn hook_cpu(
    row: u8,
    name: &'static CStr,
    target: usize,
    replacement: *const (),
) -> bool {
    // SAFETY: the caller's contract.
    let patched = unsafe { patch(&CPU_ORIGINALS[row as usize], target, replacement) }.is_ok();
    if patched {
        CPU_NAMES[row as usize].store(name.as_ptr() as *mut _, Ordering::Release);
    }
    patched
}

/// Patches `target` to jump to `replacement`; `slot` gets the trampoline to the original.
///
/// # Safety
/// As for [`hook`].
unsafe fn patch(
    slot: &AtomicUsize,
    target: usize,
    replacement: *const (),
) -> Result<(), detour::Error> {
    if slot.load(Ordering::Acquire) != 0 {
        return Ok(());
    }
    // SAFETY: the caller's contract.
    let d = unsafe {
        detour::RawDetour::new(target as *const (), replacement)
            .and_then(|d| d.enable().map(|()| d))
    }?;
    slot.store(d.trampoline() as usize, Ordering::Release);
    // Hooks stay for the life of the process.
    std::mem::forget(d);
    Ok(())
}

/// The trampoline to the original of the per-op function of `row`, when it was hooked.
#[cfg(all(target_os = "linux", target_arch = "x86_64"))]
pub fn cpu_original(row: u8) -> Option<usize> {
    Some(CPU_ORIGINALS[row as usize].load(Ordering::Acquire)).filter(|&a| a != 0)
}

/// Whether the per-op function `name` was hooked.
#[cfg(all(target_os = "linux", target_arch = "x86_64"))]
pub fn cpu_hooked(name: &CStr) -> bool {
    CPU_NAMES.iter().any(|n| {
        let p = n.load(Ordering::Acquire);
        // SAFETY: a non-null entry is a `&'static CStr` stored by `hook_cpu`.
        !p.is_null() && unsafe { CStr::from_ptr(p) } == name
    })
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
    // Set once the executable's functions are hooked (by the constructor, before any call):
    // without it, nothing was, and there are no tables to search.
    let helpers = HELPERS.get()?;
    let hooked = |o: &AtomicUsize| o.load(Ordering::Acquire) == real;
    #[cfg(target_arch = "x86_64")]
    let found = ORIGINALS.iter().any(hooked) || CPU_ORIGINALS.iter().any(hooked);
    #[cfg(not(target_arch = "x86_64"))]
    let found = ORIGINALS.iter().any(hooked);
    found.then_some(helpers)
}
