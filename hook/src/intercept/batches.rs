//! What the user asked for: a span per `llama_decode` / `llama_encode` / `llama_process` call,
//! with the batch's token count, so that prefill and generation can be told apart.
//!
//! `llama_batch` carries its count, and its tokens' sequences in arrays read at the call; the
//! opaque `llama_batch_ext` of newer llama.cpp does not, so the tokens added to each one
//! (`llama_batch_ext_add[_token]`, which return the token's index) are followed here
//! (`_add_embd` too: an input embedding is one entry), and `llama_batch_ext_clear` starts it
//! over, and `llama_batch_ext_free` forgets it (its slot, one of 64, is then free for the next
//! batch, which may be made at its address). The sequence each token was added to is counted too
//! (and each further sequence `llama_batch_ext_add_seq` puts it in): a server's batch says how
//! many tokens each sequence (slot) put in it.

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

impl Composition {
    /// `tokens` more of sequence `seq`.
    fn add(&mut self, seq: i32, tokens: u32) {
        match self.seqs[..self.n_seqs].iter().position(|&(s, _)| s == seq) {
            Some(i) => self.seqs[i].1 += tokens,
            None if self.n_seqs < SEQS => {
                self.seqs[self.n_seqs] = (seq, tokens);
                self.n_seqs += 1;
            }
            None => self.other_tokens += tokens,
        }
    }
}

/// Tokens a classic `llama_batch` may hold for its sequences to be counted (beyond, none are).
const CLASSIC_MAX_TOKENS: i32 = 1 << 20;
/// Sequences one token of it may belong to.
const CLASSIC_MAX_SEQS: i32 = 1 << 12;

/// The sequences of a classic `llama_batch` (`llama_decode`): token `i` belongs to the
/// `n_seq_id[i]` sequences in `seq_id[i]` (each counts it). `None` when the batch names none
/// (`llama_batch_get_one`: llama.cpp puts every token in sequence 0) or a count is out of range.
///
/// # Safety
/// The arrays are the caller's batch's, valid for `n_tokens` entries as `llama_decode` requires.
pub unsafe fn classic_composition(
    n_tokens: i32,
    n_seq_id: *const i32,
    seq_id: *const *const i32,
) -> Option<Composition> {
    if n_seq_id.is_null() || seq_id.is_null() || !(1..=CLASSIC_MAX_TOKENS).contains(&n_tokens) {
        return None;
    }
    let mut c = Composition::default();
    for i in 0..n_tokens as usize {
        // SAFETY: `i` < n_tokens, per the contract.
        let (n, ids) = unsafe { (*n_seq_id.add(i), *seq_id.add(i)) };
        if ids.is_null() || !(0..=CLASSIC_MAX_SEQS).contains(&n) {
            return None;
        }
        for j in 0..n as usize {
            // SAFETY: token i's `n` sequence ids, per the contract.
            c.add(unsafe { *ids.add(j) }, 1);
        }
    }
    Some(c)
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

/// `llama_batch_ext_add[_token|_embd]` returned `index` for `batch`, adding a token of `seq_id`.
pub fn token_added(batch: *mut c_void, index: i32, seq_id: i32) {
    if index < 0 {
        return;
    }
    let Some(s) = slot(batch, true) else { return };
    s.tokens.fetch_max(index + 1, Ordering::Relaxed);
    count_for(s, seq_id);
}

/// `llama_batch_ext_add_seq` put a token of `batch` in `seq_id` too: a token of that sequence
/// as well (a prompt shared by several sequences counts for each of them).
pub fn seq_added(batch: *mut c_void, seq_id: i32) {
    if let Some(s) = slot(batch, true) {
        count_for(s, seq_id);
    }
}

/// One more token of `seq_id` in the batch `s`.
fn count_for(s: &BatchSize, seq_id: i32) {
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
        forget_counts(s);
    }
}

/// `llama_batch_ext_free(batch)`: its slot is emptied and released.
pub fn batch_freed(batch: *mut c_void) {
    if let Some(s) = slot(batch, false) {
        forget_counts(s);
        s.batch.store(0, Ordering::Release);
    }
}

fn forget_counts(s: &BatchSize) {
    s.tokens.store(0, Ordering::Relaxed);
    for (k, n) in s.seqs.iter().zip(&s.seq_tokens) {
        k.store(-1, Ordering::Relaxed);
        n.store(0, Ordering::Relaxed);
    }
    s.other_tokens.store(0, Ordering::Relaxed);
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Eight tokens, one each of sequences 0..8 but token 0 also in sequence 1: the first six
    /// sequences by name, the last two's tokens together; a batch without sequence arrays, or
    /// with a count out of range, names none.
    #[test]
    fn a_classic_batch_counts_each_token_in_each_of_its_sequences() {
        let ids: Vec<[i32; 2]> = (0..8).map(|i| [i, 1]).collect();
        let mut n_seq_id = [1; 8];
        n_seq_id[0] = 2;
        let seq_id: Vec<*const i32> = ids.iter().map(|s| s.as_ptr()).collect();
        // SAFETY: eight entries each.
        let c = unsafe { classic_composition(8, n_seq_id.as_ptr(), seq_id.as_ptr()) }.unwrap();
        assert_eq!(
            &c.seqs[..c.n_seqs],
            [(0, 1), (1, 2), (2, 1), (3, 1), (4, 1), (5, 1)]
        );
        assert_eq!(c.other_tokens, 2);
        // SAFETY: null arrays are not read.
        assert_eq!(
            unsafe { classic_composition(8, std::ptr::null(), seq_id.as_ptr()) },
            None
        );
        n_seq_id[3] = -1;
        // SAFETY: as above.
        assert_eq!(
            unsafe { classic_composition(8, n_seq_id.as_ptr(), seq_id.as_ptr()) },
            None
        );
    }
}
