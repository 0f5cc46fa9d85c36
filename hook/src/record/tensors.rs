//! The tensors seen by op timing, interned by name, op, type and shape: an op event carries the
//! id, the writer writes each info once before the first event that needs it.

use std::sync::atomic::{AtomicPtr, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError};

use rustc_hash::FxHashMap;

use crate::base::os::Zeroed;
use crate::base::tensor::TensorRecord;

const TENSOR_SLOTS: usize = 1 << 14;
/// Ids run from 1 to this; beyond, op events carry no tensor info.
pub const MAX_TENSORS: usize = 8191;
/// A slot's low bits hold the id; the rest, the key's tag.
const ID_BITS: u32 = 16;
const ID_MASK: u64 = (1 << ID_BITS) - 1;

/// Each distinct tensor name and op type, and its group.
type Groups = FxHashMap<(Box<str>, Option<u32>), u32>;

pub struct Tensors {
    /// Open addressing, one word per slot: the key's [`tag`] and the id (0: a free slot). Both
    /// tables start as zeroed pages: a recorder that times no op never touches them.
    slots: Option<Zeroed<AtomicU64>>,
    /// By id - 1: each info, leaked from a `Box` when added, freed with the table.
    infos: Option<Zeroed<AtomicPtr<TensorRecord>>>,
    used: AtomicUsize,
    /// Lookups refused because the table was full (op events without tensor info).
    refused: AtomicU64,
    /// Held while adding; maps each distinct name and op type to its group (the tensors a
    /// reader tells apart by an op event's label and op type: FORMAT.md).
    adding: Mutex<Groups>,
}

impl Tensors {
    /// The tables; without memory for them every lookup is refused (counted as op events
    /// without tensor info). `back`: their pages are backed for writing now (192 KiB), for a
    /// recorder that times ops. A slot is read before it is written (a lookup, then the insert
    /// after a miss): the read of an untouched page maps the shared zero page, and the write
    /// faults again to replace it, which makes the kernel flush the TLBs of every other CPU
    /// running a thread of the process. ggml's worker threads meet a graph's nodes together,
    /// in its first timed compute: with the tables left unbacked it took 3.7 ms, backed 2.9 ms
    /// (`llama-bench -t 2` on the 512x8 model; op timing off: 2.5 ms).
    pub fn new(back: bool) -> Tensors {
        // SAFETY: a zeroed atomic integer or pointer is a valid one.
        let (slots, infos) = unsafe { (Zeroed::new(TENSOR_SLOTS), Zeroed::new(MAX_TENSORS)) };
        if back {
            slots.iter().for_each(Zeroed::back_for_writing);
            infos.iter().for_each(Zeroed::back_for_writing);
        }
        Tensors {
            slots,
            infos,
            used: AtomicUsize::new(0),
            refused: AtomicU64::new(0),
            adding: Mutex::new(FxHashMap::default()),
        }
    }

    pub fn get(&self, id: u16) -> Option<&TensorRecord> {
        let info = self
            .infos
            .as_ref()?
            .get((id as usize).checked_sub(1)?)?
            .load(Ordering::Acquire);
        // SAFETY: a non-null info is a leaked `Box`, published (Release) once complete and
        // freed only when `self` is dropped.
        (!info.is_null()).then(|| unsafe { &*info })
    }

    fn find(slots: &[AtomicU64], key: u64) -> Option<u16> {
        let start = first_slot(key);
        for i in 0..TENSOR_SLOTS {
            match slots[(start + i) % TENSOR_SLOTS].load(Ordering::Acquire) {
                0 => return None,
                word if word & !ID_MASK == tag(key) => return Some((word & ID_MASK) as u16),
                _ => {}
            }
        }
        None
    }

    /// Lookups refused so far because the table was full.
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }

    /// The id of `info` (key `key`), adding it on first sight; 0 (counted) when the table is
    /// full, which then costs a lookup and no lock. `info` is made before the lock is taken, so
    /// that threads meeting new tensors together (ggml's worker threads, each node of a graph's
    /// first timed compute) do not wait for each other's descriptions; two that describe the
    /// same tensor get one id, the first insert's (the other description is dropped).
    pub fn intern(&self, key: u64, info: impl FnOnce() -> TensorRecord) -> u16 {
        let (Some(slots), Some(infos)) = (&self.slots, &self.infos) else {
            self.refused.fetch_add(1, Ordering::Relaxed);
            return 0;
        };
        if let Some(id) = Tensors::find(slots, key) {
            return id;
        }
        if self.used.load(Ordering::Acquire) >= MAX_TENSORS {
            self.refused.fetch_add(1, Ordering::Relaxed);
            return 0;
        }
        let mut info = info();
        let mut groups = self.adding.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(id) = Tensors::find(slots, key) {
            return id;
        }
        let n = self.used.load(Ordering::Relaxed);
        if n >= MAX_TENSORS {
            return 0;
        }
        let next = groups.len() as u32;
        info.group = *groups
            .entry((info.name.clone(), info.op_type))
            .or_insert(next);
        infos[n].store(Box::into_raw(Box::new(info)), Ordering::Release);
        let id = n as u16 + 1;
        let start = first_slot(key);
        if let Some(slot) = (0..TENSOR_SLOTS)
            .map(|i| &slots[(start + i) % TENSOR_SLOTS])
            .find(|s| s.load(Ordering::Relaxed) == 0)
        {
            slot.store(tag(key) | u64::from(id), Ordering::Release);
        }
        self.used.store(n + 1, Ordering::Release);
        id
    }
}

impl Drop for Tensors {
    fn drop(&mut self) {
        for info in self.infos.iter().flat_map(|infos| infos.iter()) {
            let info = info.load(Ordering::Acquire);
            if !info.is_null() {
                // SAFETY: leaked from a `Box` by `intern`, and no reference outlives `self`.
                drop(unsafe { Box::from_raw(info) });
            }
        }
    }
}

#[cfg(all(test, target_os = "linux", not(loom)))]
mod tests {
    use super::*;
    use crate::base::os::backed_pages;

    /// Which pages of each table are backed by memory.
    fn backed(t: &Tensors) -> [Vec<bool>; 2] {
        let slots = t.slots.as_ref().expect("the slots' memory");
        let infos = t.infos.as_ref().expect("the infos' memory");
        [
            backed_pages(slots.as_ptr().cast(), size_of_val(&**slots)),
            backed_pages(infos.as_ptr().cast(), size_of_val(&**infos)),
        ]
    }

    fn info(name: &str) -> TensorRecord {
        TensorRecord {
            json: Vec::new(),
            name: name.into(),
            op_type: Some(1),
            op_name: "ADD".into(),
            group: 0,
        }
    }

    /// A thread describing a new tensor holds up no other thread's: one interns another tensor
    /// while the first is inside its description (before: the description ran under the lock,
    /// and the second waited for it), and a third describes the first's tensor meanwhile: it
    /// inserts first, and both get its id.
    #[test]
    fn a_description_keeps_no_other_thread_waiting() {
        use std::sync::mpsc::channel;
        use std::time::Duration;
        let tensors = &Tensors::new(false);
        let (inside, describing) = channel();
        let (done, others_done) = channel();
        std::thread::scope(|s| {
            let first = s.spawn(move || {
                tensors.intern(1 << 20, || {
                    inside.send(()).unwrap();
                    // Waits for the other two (at most 10 s each: a failure is not a hang).
                    let others = (0..2)
                        .filter(|_| others_done.recv_timeout(Duration::from_secs(10)).is_ok())
                        .count();
                    assert_eq!(others, 2, "the other threads waited for this description");
                    info("first")
                })
            });
            describing.recv().unwrap();
            let other = tensors.intern(2 << 20, || info("other"));
            done.send(()).unwrap();
            let same = s.spawn(|| tensors.intern(1 << 20, || info("first, again")));
            let same = same.join().unwrap();
            done.send(()).unwrap();
            let first = first.join().unwrap();
            assert_eq!((other, same, first), (1, 2, 2));
        });
        assert_eq!(tensors.used.load(Ordering::Relaxed), 2);
        assert_eq!(&*tensors.get(2).unwrap().name, "first, again");
    }

    /// A recorder that times ops has both tables backed from the start (the first timed graph
    /// compute's worker threads then fault none of their pages in); one that does not leaves
    /// them as fresh mappings, none of it backed, until a slot is used.
    #[test]
    fn tables_are_backed_only_for_a_recorder_that_times_ops() {
        for back in [false, true] {
            let tensors = Tensors::new(back);
            for pages in backed(&tensors) {
                assert!(pages.len() >= 15, "{} pages", pages.len());
                assert!(pages.iter().all(|&b| b == back), "back {back}: {pages:?}");
            }
        }
    }
}

/// What a slot keeps of a key: all but its low bits (which hold the id), never zero. Two keys
/// of the 8191 tensors a table holds share a tag with a chance below one in a million.
fn tag(key: u64) -> u64 {
    (key & !ID_MASK) | (1 << 63)
}

/// Where probing for `key` starts: its bits mixed (Fibonacci hashing), top bits taken.
fn first_slot(key: u64) -> usize {
    (key.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - TENSOR_SLOTS.trailing_zeros())) as usize
}
