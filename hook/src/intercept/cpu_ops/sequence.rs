//! Each worker thread's sequence of the nodes it began shares of, in order, with their op infos:
//! a graph computed again (every token) begins its nodes' shares in the same order, so each
//! node's info is found at the position after the last one's, with one comparison, however many
//! nodes the graph has (the direct-mapped cache it falls back on holds 256, and a 32-layer
//! model's graph has over 500: most of its nodes missed there and were described again).
//!
//! The entries live on the heap (their number is the graph's), and are freed when the thread
//! exits; after that the sequence stays empty and every lookup falls back.

use std::cell::Cell;

use super::worker::{CachedInfo, WORKER};

/// Entries a sequence grows to at most (a position past the last goes back to the first): the
/// nodes of several large graphs computed in turn.
const MOST: u32 = 1 << 14;

/// Entries a sequence starts with.
const FIRST: u32 = 256;

/// The sequence; no destructor of its own (see [`Worker`](super::worker::Worker)): a
/// thread-local of its own frees the entries when the thread exits ([`Free`]).
pub(super) struct Sequence {
    entries: Cell<*mut CachedInfo>,
    len: Cell<u32>,
    capacity: Cell<u32>,
    /// The position the next share's node is looked for at (and learned at, if not there).
    at: Cell<u32>,
    /// The entries were freed (the thread is exiting): nothing more is learned.
    closed: Cell<bool>,
}

impl Sequence {
    pub(super) const fn new() -> Sequence {
        Sequence {
            entries: Cell::new(std::ptr::null_mut()),
            len: Cell::new(0),
            capacity: Cell::new(0),
            at: Cell::new(0),
            closed: Cell::new(false),
        }
    }

    /// The entry at position `i` (below `len`).
    fn entry(&self, i: u32) -> &Cell<CachedInfo> {
        debug_assert!(i < self.len.get());
        // SAFETY: `entries` holds `len` initialised entries (see `learn`), owned by this thread's
        // sequence until `close`, which sets `len` to 0; `Cell<T>` has `T`'s layout.
        unsafe { &*(self.entries.get().add(i as usize) as *const Cell<CachedInfo>) }
    }

    /// The entry for `tensor` where this thread's sequence has it next: at the current position,
    /// or at the first (a graph begins again). The position moves there when the tensor is
    /// found; the entry may be out of date (the caller compares its fingerprint). The entry is
    /// read in place until the sequence learns again.
    #[inline]
    pub(super) fn find(&self, tensor: usize) -> Option<&CachedInfo> {
        let at = self.at.get();
        if at < self.len.get() {
            // SAFETY: an entry of this thread's sequence (below `len`), which only `learn`
            // and `close` change, neither while the caller reads it.
            let entry = unsafe { &*self.entry(at).as_ptr() };
            if entry.tensor == tensor {
                return Some(entry);
            }
        }
        self.find_first(tensor)
    }

    /// [`Sequence::find`] at the first position.
    #[cold]
    fn find_first(&self, tensor: usize) -> Option<&CachedInfo> {
        if self.len.get() == 0 || self.at.get() == 0 {
            return None;
        }
        // SAFETY: as in `find`.
        let first = unsafe { &*self.entry(0).as_ptr() };
        (first.tensor == tensor).then(|| {
            self.at.set(0);
            first
        })
    }

    /// The node at the current position was found up to date: the next share's is looked for
    /// after it.
    #[inline]
    pub(super) fn advance(&self) {
        self.at.set(self.at.get() + 1);
    }

    /// Puts `info` at the current position (the sequence grows by one where that is its end)
    /// and moves on.
    pub(super) fn learn(&self, info: CachedInfo) {
        let (at, len) = (self.at.get(), self.len.get());
        if at < len {
            self.entry(at).set(info);
        } else if !self.make_room() {
            return;
        } else {
            // SAFETY: `make_room` left room for one more after the `len` initialised entries.
            unsafe { self.entries.get().add(len as usize).write(info) };
            self.len.set(len + 1);
        }
        self.at.set(if at + 1 >= MOST { 0 } else { at + 1 });
    }

    /// Room for one more entry (the first allocation, or twice the room): false where the
    /// sequence is closed or can take no more.
    fn make_room(&self) -> bool {
        let (len, capacity) = (self.len.get(), self.capacity.get());
        if len < capacity {
            return true;
        }
        if self.closed.get() || capacity >= MOST {
            return false;
        }
        let grown = if capacity == 0 { FIRST } else { capacity * 2 };
        let mut entries = Vec::<CachedInfo>::with_capacity(grown as usize);
        if len > 0 {
            // SAFETY: the old allocation holds `len` initialised entries, the new one has room
            // for more; they do not overlap.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    self.entries.get(),
                    entries.as_mut_ptr(),
                    len as usize,
                );
                free(self.entries.get(), capacity);
            }
        } else {
            // The first allocation: the thread's exit frees it.
            FREE.with(|_| {});
        }
        let mut entries = std::mem::ManuallyDrop::new(entries);
        self.entries.set(entries.as_mut_ptr());
        self.capacity.set(grown);
        true
    }

    /// The thread is exiting: the entries are freed, the sequence stays empty.
    fn close(&self) {
        let (entries, capacity) = (
            self.entries.replace(std::ptr::null_mut()),
            self.capacity.get(),
        );
        self.len.set(0);
        self.capacity.set(0);
        self.at.set(0);
        self.closed.set(true);
        if !entries.is_null() {
            // SAFETY: the allocation `make_room` made, not used again (the pointer is cleared).
            unsafe { free(entries, capacity) };
        }
    }

    /// The entry after the current position's, if the sequence has one: what the next share
    /// will read first.
    #[inline]
    pub(super) fn next(&self) -> Option<&Cell<CachedInfo>> {
        let at = self.at.get();
        (at < self.len.get()).then(|| self.entry(at))
    }
}

/// Frees an allocation of `capacity` entries that `make_room` made.
///
/// # Safety
/// `entries` came from a `Vec<CachedInfo>` of that capacity and is not used again.
unsafe fn free(entries: *mut CachedInfo, capacity: u32) {
    // SAFETY: per the contract; a length of 0 drops no element (they are `Copy`).
    drop(unsafe { Vec::from_raw_parts(entries, 0, capacity as usize) });
}

/// Its destructor frees this thread's sequence when the thread exits.
struct Free;

impl Drop for Free {
    fn drop(&mut self) {
        WORKER.with(|w| w.sequence.close());
    }
}

thread_local! {
    static FREE: Free = const { Free };
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(tensor: usize) -> CachedInfo {
        let mut entry = CachedInfo::EMPTY;
        entry.tensor = tensor;
        entry
    }

    /// Looks `tensor` up as a share would: found next (and moved past), or learned in place.
    fn share(s: &Sequence, tensor: usize) -> bool {
        if s.find(tensor).is_some() {
            s.advance();
            true
        } else {
            s.learn(node(tensor));
            false
        }
    }

    #[test]
    fn a_graph_computed_again_finds_every_node_next_however_many() {
        let s = Sequence::new();
        // 600 nodes: more than the first allocation and the direct-mapped cache.
        let graph: Vec<usize> = (1..=600).map(|i| 0x1000 + 0x170 * i).collect();
        assert!(
            graph.iter().all(|&t| !share(&s, t)),
            "a first compute finds nothing"
        );
        for round in 0..3 {
            let found = graph.iter().filter(|&&t| share(&s, t)).count();
            assert_eq!(found, graph.len(), "compute {round} again");
        }
        assert_eq!(s.len.get(), 600);
        s.close();
    }

    #[test]
    fn another_graph_is_learned_in_place_and_both_are_found_in_turn() {
        let s = Sequence::new();
        let a: Vec<usize> = (1..=50).map(|i| 0x10_0000 + 0x170 * i).collect();
        // The same first node (a graph rebuilt where the last was), then other nodes.
        let b: Vec<usize> = std::iter::once(a[0])
            .chain((1..=30).map(|i| 0x20_0000 + 0x170 * i))
            .collect();
        for t in &a {
            share(&s, *t);
        }
        // b begins where a did: its first node is found at the first position, the rest are
        // learned over a's.
        let found: Vec<bool> = b.iter().map(|&t| share(&s, t)).collect();
        assert!(found[0] && found[1..].iter().all(|f| !f));
        assert!(b.iter().all(|&t| share(&s, t)), "b again");
        // a's nodes after b's length are still where they were; the first 31 are learned again.
        let found_a = a.iter().filter(|&&t| share(&s, t)).count();
        assert_eq!(found_a, 1 + (a.len() - b.len()));
        assert!(a.iter().all(|&t| share(&s, t)), "a again");
        s.close();
    }

    #[test]
    fn a_closed_sequence_finds_and_keeps_nothing() {
        let s = Sequence::new();
        share(&s, 0x100);
        s.close();
        assert!(!share(&s, 0x100) && !share(&s, 0x100));
        assert_eq!((s.len.get(), s.capacity.get()), (0, 0));
        assert!(s.entries.get().is_null());
    }
}
