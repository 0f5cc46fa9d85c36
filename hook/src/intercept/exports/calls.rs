//! What every wrapper does first: finds the real function (and starts tracing on the first
//! call), and names the objects its events carry.

use std::sync::atomic::Ordering;

use crate::base::VERBOSE;
use crate::base::entry::Entry;
use crate::base::ggml::Helpers;
use crate::base::names::Owner;
use crate::base::say;
use crate::intercept::route::{Resolved, describe_route, fallback, resolve};
use crate::intercept::start::{say_no_function, start_tracing};
use crate::record::{self, Recorder};

type Ptr = *mut std::ffi::c_void;

pub(super) use crate::base::contained as guarded;

/// The real function, resolved before tracing starts (so that the trace's metadata can name the
/// ggml version of the copy that is called); then tracing is started if this is the first call.
/// When our resolver fails, the call still goes to ggml, untraced ([`fallback`]).
pub(super) fn real_function(entry: Entry, return_address: usize) -> Option<&'static Resolved> {
    let found = guarded(|| resolve(entry, return_address));
    start_tracing();
    match found {
        Some(Some((resolved, fresh))) => {
            if fresh && VERBOSE.load(Ordering::Relaxed) {
                say(format_args!(
                    "{}",
                    describe_route(entry, return_address, resolved)
                ));
            }
            Some(resolved)
        }
        Some(None) => {
            say_no_function(entry.c_name());
            None
        }
        None => {
            let real = fallback(entry);
            if real.is_none() {
                say_no_function(entry.c_name());
            }
            real
        }
    }
}

pub(super) fn name_of(r: &Recorder, helpers: &Helpers, object: Ptr, owner: Owner) -> u16 {
    record::name_id(r, object, owner, || match owner {
        // SAFETY: the object came from this copy of ggml through the call we are wrapping.
        Owner::Backend => unsafe { helpers.backend_name(object) },
        // SAFETY: a scheduler passed to the call we are wrapping, of this copy of ggml.
        Owner::Scheduler => unsafe { helpers.sched_name(object) },
        // SAFETY: a buffer type passed to the call we are wrapping (or the one of the buffer it
        // passed), of this copy of ggml.
        Owner::BufferType => unsafe { helpers.buft_name(object) },
        Owner::Thread | Owner::Endpoint => String::new(),
    })
}
