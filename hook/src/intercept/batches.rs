//! What the user asked for: a span per `llama_decode` / `llama_encode` / `llama_process` call,
//! with the batch's token count, so that prefill and generation can be told apart.
//!
//! `llama_batch` carries its count; the opaque `llama_batch_ext` of newer llama.cpp does not, so
//! the tokens added to each one (`llama_batch_ext_add[_token]`, which return the token's index)
//! are followed here, and `llama_batch_ext_clear` starts it over.

use std::ffi::c_void;
use std::sync::atomic::{AtomicI32, AtomicUsize, Ordering};

const BATCHES: usize = 64;

struct BatchSize {
    batch: AtomicUsize,
    tokens: AtomicI32,
}

#[allow(clippy::declare_interior_mutable_const)] // a template copied into each slot
const NO_BATCH: BatchSize = BatchSize {
    batch: AtomicUsize::new(0),
    tokens: AtomicI32::new(0),
};
static BATCH_SIZES: [BatchSize; BATCHES] = [NO_BATCH; BATCHES];

fn slot(batch: *mut c_void, create: bool) -> Option<&'static BatchSize> {
    let key = batch as usize;
    BATCH_SIZES
        .iter()
        .find(|s| s.batch.load(Ordering::Acquire) == key)
        .or_else(|| {
            create
                .then(|| {
                    BATCH_SIZES.iter().find(|s| {
                        s.batch
                            .compare_exchange(0, key, Ordering::AcqRel, Ordering::Acquire)
                            .is_ok()
                    })
                })
                .flatten()
        })
}

/// `llama_batch_ext_add[_token]` returned `index` for `batch`.
pub fn token_added(batch: *mut c_void, index: i32) {
    if index >= 0
        && let Some(s) = slot(batch, true)
    {
        s.tokens.fetch_max(index + 1, Ordering::Relaxed);
    }
}

/// `llama_batch_ext_clear(batch)`.
pub fn batch_cleared(batch: *mut c_void) {
    if let Some(s) = slot(batch, false) {
        s.tokens.store(0, Ordering::Relaxed);
    }
}

/// Tokens in `batch` as far as we saw them added; `None` for a batch we never saw.
pub fn batch_tokens(batch: *mut c_void) -> Option<u32> {
    slot(batch, false).map(|s| s.tokens.load(Ordering::Relaxed).max(0) as u32)
}
