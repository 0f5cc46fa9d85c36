//! What the user asked for: a span per `llama_decode` / `llama_encode` / `llama_process` call,
//! with the batch's token count, so that prefill and generation can be told apart.
//!
//! `llama_batch` carries its count; the opaque `llama_batch_ext` of newer llama.cpp does not, so
//! the tokens added to each one (`llama_batch_ext_add[_token]`, which return the token's index)
//! are followed here, and `llama_batch_ext_clear` starts it over. The sequence each token was
//! added to is counted too: a server's batch says how many tokens each sequence (slot) put in it.

use std::ffi::c_void;
use std::sync::atomic::{AtomicI32, AtomicI64, AtomicU32, AtomicUsize, Ordering};

const BATCHES: usize = 64;

/// Sequences whose tokens a batch counts apart: as many as a span event carries.
const SEQS: usize = crate::record::SPAN_SEQS;

struct BatchSize {
    batch: AtomicUsize,
    tokens: AtomicI32,
    /// The first [`SEQS`] sequences tokens were added to (-1: none yet), and their tokens.
    seqs: [AtomicI64; SEQS],
    seq_tokens: [AtomicU32; SEQS],
    /// Tokens of further sequences.
    other_tokens: AtomicU32,
}

#[allow(clippy::declare_interior_mutable_const)] // a template copied into each slot
const NO_BATCH: BatchSize = BatchSize {
    batch: AtomicUsize::new(0),
    tokens: AtomicI32::new(0),
    seqs: [const { AtomicI64::new(-1) }; SEQS],
    seq_tokens: [const { AtomicU32::new(0) }; SEQS],
    other_tokens: AtomicU32::new(0),
};

/// Which sequences a batch's tokens belong to: (sequence id, tokens), and the tokens of
/// sequences beyond the first [`SEQS`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Composition {
    pub seqs: [(i32, u32); SEQS],
    pub n_seqs: usize,
    pub other_tokens: u32,
}
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

/// `llama_batch_ext_add[_token]` returned `index` for `batch`, adding a token of `seq_id`.
pub fn token_added(batch: *mut c_void, index: i32, seq_id: i32) {
    if index < 0 {
        return;
    }
    let Some(s) = slot(batch, true) else { return };
    s.tokens.fetch_max(index + 1, Ordering::Relaxed);
    let seq = i64::from(seq_id);
    let known = s.seqs.iter().position(|k| {
        k.load(Ordering::Relaxed) == seq
            || k.compare_exchange(-1, seq, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
    });
    match known {
        Some(i) => s.seq_tokens[i].fetch_add(1, Ordering::Relaxed),
        None => s.other_tokens.fetch_add(1, Ordering::Relaxed),
    };
}

/// `llama_batch_ext_clear(batch)`.
pub fn batch_cleared(batch: *mut c_void) {
    if let Some(s) = slot(batch, false) {
        s.tokens.store(0, Ordering::Relaxed);
        for (k, n) in s.seqs.iter().zip(&s.seq_tokens) {
            k.store(-1, Ordering::Relaxed);
            n.store(0, Ordering::Relaxed);
        }
        s.other_tokens.store(0, Ordering::Relaxed);
    }
}

/// The sequences of `batch`'s tokens as far as we saw them added; `None` for a batch we never saw.
pub fn batch_composition(batch: *mut c_void) -> Option<Composition> {
    let s = slot(batch, false)?;
    let mut c = Composition {
        other_tokens: s.other_tokens.load(Ordering::Relaxed),
        ..Composition::default()
    };
    for (k, n) in s.seqs.iter().zip(&s.seq_tokens) {
        let seq = k.load(Ordering::Relaxed);
        if seq >= 0 {
            c.seqs[c.n_seqs] = (seq as i32, n.load(Ordering::Relaxed));
            c.n_seqs += 1;
        }
    }
    Some(c)
}

/// Tokens in `batch` as far as we saw them added; `None` for a batch we never saw.
pub fn batch_tokens(batch: *mut c_void) -> Option<u32> {
    slot(batch, false).map(|s| s.tokens.load(Ordering::Relaxed).max(0) as u32)
}
