//! Finding the real function behind a wrapper, chosen once per OS: by the caller's scope on
//! Linux ([`linux`]), from dyld's interpose table on macOS (`macos`), from the inline hooks put
//! on ggml's DLLs on Windows (`windows`). Each hands the wrappers a [`Resolved`].

use std::sync::OnceLock;

#[cfg(not(target_os = "linux"))]
use crate::base::entry::Entry;
use crate::base::ggml::Helpers;

#[cfg(target_os = "linux")]
mod linux;
#[cfg(all(target_os = "linux", target_arch = "x86_64"))]
pub use linux::{
    Callee, back_call_site_cache, cpu_functions_reachable, fallback_callee, resolve_callee,
};
#[cfg(target_os = "linux")]
pub use linux::{describe_route, fallback, resolve};
#[cfg(target_os = "macos")]
mod macos;
#[cfg(target_os = "macos")]
pub use macos::{describe_route, fallback, resolve};
#[cfg(windows)]
mod windows;
#[cfg(windows)]
pub use windows::{
    GetModuleHandleA, GetProcAddress, Module, describe_route, export_of, fallback,
    loaded_ggml_modules, resolve,
};

/// Where a call goes.
#[derive(Debug)]
pub struct Resolved {
    /// Address of the real function.
    pub real: usize,
    pub helpers: &'static Helpers,
    /// The call is not recorded: several copies define the function and the caller belongs to
    /// none we could tell, so the call goes to the first (Linux only: elsewhere the loader
    /// picked one); or our resolver failed and this is its fallback.
    pub untraced: bool,
}

/// The helpers of the first copy of ggml a call was resolved to (for the trace's metadata).
static FIRST_HELPERS: OnceLock<&'static Helpers> = OnceLock::new();

pub fn first_helpers() -> Option<&'static Helpers> {
    FIRST_HELPERS.get().copied()
}

fn note_helpers(helpers: &'static Helpers) {
    let _ = FIRST_HELPERS.set(helpers);
}

/// An untraced route to `real`, with no helpers (each answers 0 or an empty name).
fn untraced(real: usize) -> &'static Resolved {
    static NO_HELPERS: Helpers = Helpers::none();
    Box::leak(Box::new(Resolved {
        real,
        helpers: &NO_HELPERS,
        untraced: true,
    }))
}

/// For platforms where each entry point has one real function whatever the caller (macOS,
/// Windows): `find` is asked once per entry; returns the result and whether this call found it.
#[cfg(not(target_os = "linux"))]
fn per_entry(
    entry: Entry,
    find: impl FnOnce() -> Option<(usize, &'static Helpers)>,
) -> Option<(&'static Resolved, bool)> {
    static RESOLVED: [OnceLock<Option<&'static Resolved>>; Entry::ALL.len()] =
        [const { OnceLock::new() }; Entry::ALL.len()];
    let mut fresh = false;
    if let Some(&found) = RESOLVED[entry as usize - 1].get() {
        return found.map(|r| (r, false));
    }
    crate::base::fault::inject(crate::base::fault::Fault::Resolve);
    let found = *RESOLVED[entry as usize - 1].get_or_init(|| {
        fresh = true;
        let (real, helpers) = find()?;
        note_helpers(helpers);
        Some(&*Box::leak(Box::new(Resolved {
            real,
            helpers,
            untraced: false,
        })))
    });
    found.map(|r| (r, fresh))
}
