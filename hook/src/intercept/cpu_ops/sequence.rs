//! Each worker thread's sequence of the nodes it began shares of, in order, with their op infos:
//! a graph computed again (every token) begins its nodes' shares in the same order, so each
//! node's info is found at the position after the last one's, with one comparison, however many
//! nodes the graph has (the direct-mapped cache it falls back on holds 256, and a 32-layer
//! model's graph has over 500: most of its nodes missed there and were described again). Where
//! the next node is not there (another graph, computed in turn with this one), the position the
//! direct-mapped cache kept for it is tried, then the first.
//!
//! The entries live on the heap (their number is the graph's), and are freed when the thread
//! exits (the worker's thread-local sees to it); after that the sequence stays empty and every
//! lookup falls back.

use std::cell::Cell;
use std::ffi::c_void;

use crate::base::tensor::Snapshot;
use crate::record::OpInfo;

type Ptr = *mut c_void;

/// Entries a sequence grows to at most (a position past the last goes back to the first): the
/// nodes of several large graphs computed in turn (192 bytes each: 1.5 MiB).
const MOST: u32 = 1 << 13;

/// Entries a sequence starts with.
const FIRST: u32 = 256;

/// An entry: a node's op info, and the snapshot of its tensor taken when it was described, which
/// tells whether the info is still the node's.
#[derive(Clone, Copy)]
pub(super) struct Known {
    pub(super) info: CachedInfo,
    pub(super) snapshot: Snapshot,
    /// For a fused call's node, the fingerprint of the node the call computed first (0: a node
    /// of its own).
    pub(super) first: u64,
    /// The tensor of the entry after this one (0: none yet), read with this entry, so that what
    /// the next share will read can be asked for without waiting for a load (see `ahead`).
    pub(super) next: usize,
}

// Three cache lines: the op info's, and the snapshot's with the two words after it.
const _: () = assert!(std::mem::size_of::<Known>() == 192);

/// An entry of a thread's op-info caches: one cache line.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
pub(super) struct CachedInfo {
    /// The node's tensor (0: an empty entry).
    pub(super) tensor: usize,
    /// Its fingerprint when it was described.
    pub(super) print: u64,
    /// The recorder whose tensor table `tensor_id` is in.
    pub(super) recorder: usize,
    pub(super) op_size: u64,
    pub(super) backend: usize,
    pub(super) op_type: u32,
    pub(super) tensor_id: u16,
    /// In the direct-mapped cache: where the sequence learned the node last (`u32::MAX`: not
    /// known).
    pub(super) position: u32,
}

impl CachedInfo {
    pub(super) const EMPTY: CachedInfo = CachedInfo {
        tensor: 0,
        print: 0,
        recorder: 0,
        op_size: 0,
        backend: 0,
        op_type: 0,
        tensor_id: 0,
        position: u32::MAX,
    };

    pub(super) fn op(&self) -> OpInfo {
        OpInfo {
            tensor: self.tensor as Ptr,
            op_type: self.op_type,
            op_size: self.op_size,
            backend: self.backend as Ptr,
            tensor_id: self.tensor_id,
        }
    }
}

/// The sequence; no destructor of its own (see [`Worker`](super::worker::Worker)): its owner
/// frees the entries when the thread exits ([`Sequence::close`]).
pub(super) struct Sequence {
    entries: Cell<*mut Known>,
    len: Cell<u32>,
    capacity: Cell<u32>,
    /// The position the next share's node is looked for at (and learned at, if not there).
    at: Cell<u32>,
    /// The entries were freed (the thread is exiting): nothing more is learned.
    closed: Cell<bool>,
    /// The tensor of the entry at the current position, as the entry before it said (0: not
    /// known): the node the next share is likely for.
    ahead: Cell<usize>,
}

impl Sequence {
    pub(super) const fn new() -> Sequence {
        Sequence {
            entries: Cell::new(std::ptr::null_mut()),
            len: Cell::new(0),
            capacity: Cell::new(0),
            at: Cell::new(0),
            closed: Cell::new(false),
            ahead: Cell::new(0),
        }
    }

    /// The entry at position `i` (below `len`).
    fn entry(&self, i: u32) -> &Cell<Known> {
        debug_assert!(i < self.len.get());
        // SAFETY: `entries` holds `len` initialised entries (see `learn`), owned by this thread's
        // sequence until `close`, which sets `len` to 0; `Cell<T>` has `T`'s layout.
        unsafe { &*(self.entries.get().add(i as usize) as *const Cell<Known>) }
    }

    /// The entry for `tensor` where this thread's sequence has it next: at the current position,
    /// or at the first (a graph begins again). The position moves there when the tensor is
    /// found; the entry may be out of date (the caller compares its snapshot). The entry is
    /// read in place until the sequence learns again.
    #[inline]
    pub(super) fn find(&self, tensor: usize) -> Option<&Known> {
        let at = self.at.get();
        if at < self.len.get() {
            // SAFETY: an entry of this thread's sequence (below `len`), which only `learn`
            // and `close` change, neither while the caller reads it.
            let entry = unsafe { &*self.entry(at).as_ptr() };
            if entry.info.tensor == tensor {
                return Some(entry);
            }
        }
        self.find_first(tensor)
    }

    /// The entry at `position` if it is `tensor`'s (the position a node was learned at, kept by
    /// the direct-mapped cache): the position moves there. What finds a graph computed again
    /// that is not the sequence's first (a decoder's graph after an encoder's).
    #[inline]
    pub(super) fn find_at(&self, position: u32, tensor: usize) -> Option<&Known> {
        if position >= self.len.get() {
            return None;
        }
        // SAFETY: as in `find`.
        let entry = unsafe { &*self.entry(position).as_ptr() };
        (entry.info.tensor == tensor).then(|| {
            self.at.set(position);
            entry
        })
    }

    /// [`Sequence::find`] at the first position.
    #[cold]
    fn find_first(&self, tensor: usize) -> Option<&Known> {
        if self.len.get() == 0 || self.at.get() == 0 {
            return None;
        }
        // SAFETY: as in `find`.
        let first = unsafe { &*self.entry(0).as_ptr() };
        (first.info.tensor == tensor).then(|| {
            self.at.set(0);
            first
        })
    }

    /// The node at the current position was found up to date: the next share's is looked for
    /// after it.
    #[inline]
    pub(super) fn advance(&self) {
        let at = self.at.get();
        // SAFETY: the entry just found at `at` (below `len`); one field read in place.
        self.ahead.set(unsafe { (*self.entry(at).as_ptr()).next });
        self.at.set(at + 1);
    }

    /// Puts `info` at the current position (the sequence grows by one where that is its end)
    /// and moves on: the position it was put at (`None` once the sequence is closed).
    pub(super) fn learn(&self, info: Known) -> Option<u32> {
        let (at, len) = (self.at.get(), self.len.get());
        if at > 0 {
            // SAFETY: the entry before `at` (the position is never past `len`); one field
            // written in place.
            unsafe { (*self.entry(at - 1).as_ptr()).next = info.info.tensor };
        }
        let next = if at < len {
            // SAFETY: the entry at `at`, below `len`; one field read in place.
            unsafe { (*self.entry(at).as_ptr()).next }
        } else {
            0
        };
        self.ahead.set(next);
        let info = Known { next, ..info };
        if at < len {
            self.entry(at).set(info);
        } else if !self.make_room() {
            return None;
        } else {
            // SAFETY: `make_room` left room for one more after the `len` initialised entries.
            unsafe { self.entries.get().add(len as usize).write(info) };
            self.len.set(len + 1);
        }
        self.at.set(if at + 1 >= MOST { 0 } else { at + 1 });
        Some(at)
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
        let mut entries = if capacity == 0 {
            Vec::new()
        } else {
            // SAFETY: the sequence's allocation, made below as a `Vec<Known>` of this capacity,
            // with its `len` initialised entries; the sequence lets go of it here.
            unsafe { Vec::from_raw_parts(self.entries.get(), len as usize, capacity as usize) }
        };
        entries.reserve_exact(capacity.max(FIRST) as usize);
        let mut entries = std::mem::ManuallyDrop::new(entries);
        self.entries.set(entries.as_mut_ptr());
        self.capacity.set(entries.capacity() as u32);
        true
    }

    /// The thread is exiting: the entries are freed, the sequence stays empty.
    pub(super) fn close(&self) {
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

    /// The entry at the current position (what the next share will read first) and the tensor
    /// it is likely for, without a load from the sequence: for prefetching.
    #[inline]
    pub(super) fn ahead(&self) -> Option<(*const Known, usize)> {
        let at = self.at.get();
        (at < self.len.get()).then(|| {
            (
                self.entries.get().wrapping_add(at as usize) as *const Known,
                self.ahead.get(),
            )
        })
    }
}

/// Frees an allocation of `capacity` entries that `make_room` made.
///
/// # Safety
/// `entries` came from a `Vec<Known>` of that capacity and is not used again.
unsafe fn free(entries: *mut Known, capacity: u32) {
    // SAFETY: per the contract; a length of 0 drops no element (they are `Copy`).
    drop(unsafe { Vec::from_raw_parts(entries, 0, capacity as usize) });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(tensor: usize) -> Known {
        let mut info = CachedInfo::EMPTY;
        info.tensor = tensor;
        Known {
            info,
            snapshot: Snapshot::EMPTY,
            first: 0,
            next: 0,
        }
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
    fn a_graph_computed_again_after_another_is_found_at_the_position_it_was_learned_at() {
        let s = Sequence::new();
        let encoder: Vec<usize> = (1..=50).map(|i| 0x10_0000 + 0x170 * i).collect();
        let decoder: Vec<usize> = (1..=30).map(|i| 0x20_0000 + 0x170 * i).collect();
        let learned: Vec<Option<u32>> = encoder
            .iter()
            .chain(&decoder)
            .map(|&t| {
                assert!(s.find(t).is_none());
                s.learn(node(t))
            })
            .collect();
        assert_eq!(learned[50], Some(50), "the decoder's first node's position");
        for round in 0..3 {
            // The decoder again: not next (the sequence's end), not first (the encoder's).
            assert!(s.find(decoder[0]).is_none(), "round {round}");
            assert!(s.find_at(50, decoder[0]).is_some());
            s.advance();
            assert!(decoder[1..].iter().all(|&t| share(&s, t)), "round {round}");
        }
        assert!(s.find_at(50, encoder[0]).is_none() && s.find_at(80, decoder[0]).is_none());
        assert_eq!(s.len.get(), 80, "nothing learned twice");
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
