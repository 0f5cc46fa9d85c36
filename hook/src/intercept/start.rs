//! Start-up of tracing, at the first wrapped call of any front end: the configuration read and
//! checked, the metadata's facts gathered, the recording core started once; and the line said
//! when no loaded library defines a function we wrap.

use std::ffi::CStr;
use std::sync::atomic::AtomicBool;

use ggml_viz_config::{Config, Sources};

use super::route::first_helpers;
use crate::base::contained as guarded;
use crate::base::{say, say_once};
use crate::record::{self, Setup};

#[cfg(all(target_os = "linux", target_arch = "x86_64"))]
use super::route::cpu_functions_reachable;

/// Per-thread op timing is built for Linux x86-64 only.
#[cfg(not(all(target_os = "linux", target_arch = "x86_64")))]
fn cpu_functions_reachable() -> Result<(), String> {
    Err("per-thread op timing is built for Linux x86-64 only".into())
}

/// Starts tracing if this is the first wrapped call (after resolving it, so that the metadata
/// can name the ggml version of the copy that is called).
pub fn start_tracing() {
    if record::started() {
        return;
    }
    guarded(|| {
        record::start_once(|| {
            #[cfg(all(target_os = "linux", target_arch = "x86_64"))]
            super::rpc_names::check_names();
            let sources = Sources::from_process_env();
            for (var, setting) in sources.misspelt() {
                say(format_args!(
                    "{var} is not a setting and is ignored (did you mean {setting}?)"
                ));
            }
            Setup {
                config: Config::load(&sources),
                ggml_version: first_helpers().and_then(|h| h.version()),
                cpu_functions: cpu_functions_reachable(),
                prepare_op_timing,
                before_last_flush,
            }
        })
    });
}

/// Before the first timed graph compute, on the thread that starts tracing: what that compute
/// would otherwise do inside its span, on its worker threads at once.
/// - The op count of the ggml that calls go to, which every node description needs: read from
///   the symbol table of its file (an ELF file mapped and parsed), by each worker thread that
///   described a node before it was known.
/// - Per thread: the call-site cache's pages backed ([`super::route::back_call_site_cache`]).
fn prepare_op_timing(per_thread: bool) {
    if let Some(h) = first_helpers() {
        h.op_count();
    }
    #[cfg(all(target_os = "linux", target_arch = "x86_64"))]
    if per_thread {
        super::route::back_call_site_cache();
    }
    #[cfg(not(all(target_os = "linux", target_arch = "x86_64")))]
    let _ = per_thread;
}

/// At exit, before the last flush: what the front ends still hold.
fn before_last_flush() {
    super::vulkan::hand_over_held();
    #[cfg(all(target_os = "linux", target_arch = "x86_64"))]
    super::cuda::finish();
}

/// Said once when no loaded library defines a function we wrap.
pub fn say_no_function(name: &CStr) {
    static SAID: AtomicBool = AtomicBool::new(false);
    say_once(
        &SAID,
        format_args!(
            "no loaded library defines {}; the call does nothing",
            name.to_string_lossy()
        ),
    );
}
