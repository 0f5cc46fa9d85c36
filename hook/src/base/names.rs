//! Names of backends and schedulers, interned once per pointer so that an event carries a
//! 16-bit id instead of a string.
//!
//! Lookups are a scan of atomics (no lock); adding a name takes a lock, once per pointer.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};

/// Names the table holds; ids run from 1 to this.
pub const SLOTS: usize = 256;

/// What kind of object a name belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Owner {
    Backend,
    Scheduler,
    /// A buffer type (`CPU`, `CPU_Mapped`, `CUDA0`): keyed by its pointer.
    BufferType,
    /// A thread's name: keyed by its OS thread id.
    Thread,
    /// A ggml-rpc endpoint (`host:port`): keyed by a hash of the text.
    Endpoint,
}

impl Owner {
    pub fn name(self) -> &'static str {
        match self {
            Owner::Backend => "backend",
            Owner::Scheduler => "scheduler",
            Owner::BufferType => "buffer_type",
            Owner::Thread => "thread",
            Owner::Endpoint => "endpoint",
        }
    }
}

struct Slot {
    /// The backend or scheduler pointer; 0 while the slot is free. Published last.
    ptr: AtomicUsize,
    name: OnceLock<(Owner, String)>,
}

pub struct Names {
    /// On the heap: the table is ~12 KB, which every move of a struct holding it would copy.
    slots: Box<[Slot]>,
    used: AtomicUsize,
    /// Lookups refused because the table was full (events without their object's name).
    refused: AtomicU64,
    adding: Mutex<()>,
}

impl Names {
    pub fn new() -> Names {
        let free = |_| Slot {
            ptr: AtomicUsize::new(0),
            name: OnceLock::new(),
        };
        Names {
            slots: (0..SLOTS).map(free).collect(),
            used: AtomicUsize::new(0),
            refused: AtomicU64::new(0),
            adding: Mutex::new(()),
        }
    }

    fn find(&self, ptr: usize) -> Option<usize> {
        let used = self.used.load(Ordering::Acquire);
        (0..used).find(|&i| self.slots[i].ptr.load(Ordering::Acquire) == ptr)
    }

    /// The id (1-based) of `ptr`'s name, interning it with `name()` on first sight. 0 when the
    /// pointer is null, or when the table is full (counted; it then costs a scan and no lock).
    pub fn intern(&self, ptr: usize, owner: Owner, name: impl FnOnce() -> String) -> u16 {
        if ptr == 0 {
            return 0;
        }
        if let Some(i) = self.find(ptr) {
            return i as u16 + 1;
        }
        if self.used.load(Ordering::Acquire) == SLOTS {
            self.refused.fetch_add(1, Ordering::Relaxed);
            return 0;
        }
        let _guard = self.adding.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(i) = self.find(ptr) {
            return i as u16 + 1;
        }
        let i = self.used.load(Ordering::Relaxed);
        if i == SLOTS {
            self.refused.fetch_add(1, Ordering::Relaxed);
            return 0;
        }
        let slot = &self.slots[i];
        let _ = slot.name.set((owner, name()));
        slot.ptr.store(ptr, Ordering::Release);
        self.used.store(i + 1, Ordering::Release);
        i as u16 + 1
    }

    /// The name behind an id from [`Names::intern`].
    pub fn get(&self, id: u16) -> Option<(usize, Owner, &str)> {
        let i = (id as usize).checked_sub(1)?;
        if i >= self.used.load(Ordering::Acquire) {
            return None;
        }
        let slot = &self.slots[i];
        slot.name
            .get()
            .map(|(owner, name)| (slot.ptr.load(Ordering::Acquire), *owner, name.as_str()))
    }

    /// Lookups refused so far because the table was full.
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }

    /// Names interned so far.
    pub fn len(&self) -> usize {
        self.used.load(Ordering::Acquire)
    }
}

impl Default for Names {
    fn default() -> Self {
        Names::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interns_once_per_pointer() {
        let names = Names::new();
        assert_eq!(names.intern(0, Owner::Backend, || unreachable!()), 0);
        let a = names.intern(0x10, Owner::Backend, || "CPU".into());
        let b = names.intern(0x20, Owner::Scheduler, || "CPU+CUDA0".into());
        assert_eq!(names.intern(0x10, Owner::Backend, || unreachable!()), a);
        assert_eq!(names.get(a), Some((0x10, Owner::Backend, "CPU")));
        assert_eq!(names.get(b), Some((0x20, Owner::Scheduler, "CPU+CUDA0")));
    }
}
