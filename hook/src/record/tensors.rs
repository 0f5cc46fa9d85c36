//! The tensors seen by op timing, interned by name, op, type and shape: an op event carries the
//! id, the writer writes each info once before the first event that needs it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU16, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock, PoisonError};

use crate::base::tensor::TensorInfo;

const TENSOR_SLOTS: usize = 1 << 14;
/// Ids run from 1 to this; beyond, op events carry no tensor info.
pub const MAX_TENSORS: usize = 8191;

pub struct Tensors {
    /// Open addressing: key hash (never 0) and id.
    keys: Box<[AtomicU64]>,
    ids: Box<[AtomicU16]>,
    infos: Box<[OnceLock<TensorInfo>]>,
    used: AtomicUsize,
    /// Lookups refused because the table was full (op events without tensor info).
    refused: AtomicU64,
    /// Held while adding; maps each distinct name and op type to its group (the tensors a
    /// reader tells apart by an op event's label and op type: FORMAT.md).
    adding: Mutex<HashMap<(String, Option<u32>), u32>>,
}

impl Tensors {
    pub fn new() -> Tensors {
        Tensors {
            keys: (0..TENSOR_SLOTS).map(|_| AtomicU64::new(0)).collect(),
            ids: (0..TENSOR_SLOTS).map(|_| AtomicU16::new(0)).collect(),
            infos: (0..MAX_TENSORS).map(|_| OnceLock::new()).collect(),
            used: AtomicUsize::new(0),
            refused: AtomicU64::new(0),
            adding: Mutex::new(HashMap::new()),
        }
    }

    pub fn get(&self, id: u16) -> Option<&TensorInfo> {
        self.infos.get((id as usize).checked_sub(1)?)?.get()
    }

    fn find(&self, key: u64) -> Option<u16> {
        let start = first_slot(key);
        for i in 0..TENSOR_SLOTS {
            let slot = (start + i) % TENSOR_SLOTS;
            match self.keys[slot].load(Ordering::Acquire) {
                0 => return None,
                k if k == key => return Some(self.ids[slot].load(Ordering::Acquire)),
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
    /// full, which then costs a lookup and no lock.
    pub fn intern(&self, key: u64, info: impl FnOnce() -> TensorInfo) -> u16 {
        if let Some(id) = self.find(key) {
            return id;
        }
        if self.used.load(Ordering::Acquire) >= MAX_TENSORS {
            self.refused.fetch_add(1, Ordering::Relaxed);
            return 0;
        }
        let mut groups = self.adding.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(id) = self.find(key) {
            return id;
        }
        let n = self.used.load(Ordering::Relaxed);
        if n >= MAX_TENSORS {
            return 0;
        }
        let mut info = info();
        let next = groups.len() as u32;
        info.group = *groups
            .entry((info.name.clone(), info.op_type))
            .or_insert(next);
        let _ = self.infos[n].set(info);
        let id = n as u16 + 1;
        let start = first_slot(key);
        if let Some(slot) = (0..TENSOR_SLOTS)
            .map(|i| (start + i) % TENSOR_SLOTS)
            .find(|&s| self.keys[s].load(Ordering::Relaxed) == 0)
        {
            self.ids[slot].store(id, Ordering::Release);
            self.keys[slot].store(key, Ordering::Release);
        }
        self.used.store(n + 1, Ordering::Release);
        id
    }
}

/// Where probing for `key` starts: its bits mixed (Fibonacci hashing), top bits taken.
fn first_slot(key: u64) -> usize {
    (key.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - TENSOR_SLOTS.trailing_zeros())) as usize
}

impl Default for Tensors {
    fn default() -> Self {
        Tensors::new()
    }
}
