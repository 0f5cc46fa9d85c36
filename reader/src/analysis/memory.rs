//! Backend buffers: what the TENSOR_ALLOC / TENSOR_FREE events add up to, and what each buffer
//! held (its `buffer_use` records: the usage the program gave ggml, the first tensor put in it),
//! as a table of weights, KV cache and compute buffers by buffer type, at their peak and at the
//! end of the trace.

use std::collections::HashMap;

use crate::format::ext::BufferUse;

/// What a buffer was for, from what the program told ggml about it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum BufferRole {
    /// Usage `weights` (llama.cpp's model buffers, mapped or loaded).
    Weights,
    /// Made for a context whose first tensor is `cache_k…` or `cache_v…` (llama.cpp's KV cache).
    KvCache,
    /// Made for a context whose first tensor is `cache_r…` or `cache_s…` (llama.cpp's recurrent
    /// state).
    RecurrentState,
    /// Usage `compute` (ggml's graph allocator: the scheduler's compute buffers).
    Compute,
    /// Nothing said (llama.cpp's output buffer, a program's own buffers).
    Other,
}

impl BufferRole {
    pub fn name(self) -> &'static str {
        match self {
            BufferRole::Weights => "weights",
            BufferRole::KvCache => "KV cache",
            BufferRole::RecurrentState => "recurrent state",
            BufferRole::Compute => "compute",
            BufferRole::Other => "other",
        }
    }

    fn of(usage: Option<&str>, first_tensor: Option<&str>) -> BufferRole {
        let cache =
            |kinds: [&str; 2]| first_tensor.is_some_and(|t| kinds.iter().any(|k| t.starts_with(k)));
        match usage {
            Some("weights") => BufferRole::Weights,
            Some("compute") => BufferRole::Compute,
            _ if cache(["cache_k", "cache_v"]) => BufferRole::KvCache,
            _ if cache(["cache_r", "cache_s"]) => BufferRole::RecurrentState,
            _ => BufferRole::Other,
        }
    }
}

/// One row of [`MemoryStats::by_role`]: the buffers of one role and buffer type.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemoryRow {
    pub role: BufferRole,
    pub buffer_type: String,
    pub buffers: u64,
    /// The most bytes these buffers held at once.
    pub peak_bytes: u64,
    /// Bytes still allocated at the end of the trace.
    pub end_bytes: u64,
}

/// One buffer's life: allocated, told what it holds, perhaps freed.
#[derive(Clone, Debug)]
struct BufferLife {
    buffer_type: String,
    size: u64,
    usage: Option<String>,
    first_tensor: Option<String>,
}

/// What the TENSOR_ALLOC / TENSOR_FREE events of backend buffers add up to.
#[derive(Clone, Debug, Default)]
pub struct MemoryStats {
    pub allocs: u64,
    pub frees: u64,
    pub allocated_bytes: u64,
    pub peak_live_bytes: u64,
    /// Bytes allocated and not freed by the end of the trace.
    pub live_bytes: u64,
    /// Buffers the writer reported still allocated when it closed the trace.
    pub live_at_exit: Option<u64>,
    /// Live buffers: handle to size and, for a buffer of some size, its index into `lives`.
    live: HashMap<u64, (u64, Option<usize>)>,
    /// Every buffer of a non-zero size, in the order allocated.
    lives: Vec<BufferLife>,
    /// Allocations (true) and frees, in trace order, by index into `lives`.
    changes: Vec<(usize, bool)>,
}

impl MemoryStats {
    /// A TENSOR_ALLOC of buffer `ptr` of `size` bytes, labelled `label` (`<type>@<base>`).
    pub(crate) fn alloc(&mut self, ptr: u64, size: u64, label: &[u8]) {
        // Sizes come from the file: saturate rather than overflow on hostile input.
        self.allocs += 1;
        self.allocated_bytes = self.allocated_bytes.saturating_add(size);
        let replaced = self.forget(ptr).map_or(0, |(size, _)| size);
        self.live_bytes = self
            .live_bytes
            .saturating_sub(replaced)
            .saturating_add(size);
        self.peak_live_bytes = self.peak_live_bytes.max(self.live_bytes);
        let index = (size > 0).then_some(self.lives.len());
        if let Some(index) = index {
            let label = String::from_utf8_lossy(label);
            self.lives.push(BufferLife {
                buffer_type: crate::format::buffer_type_of(&label).to_string(),
                size,
                usage: None,
                first_tensor: None,
            });
            self.changes.push((index, true));
        }
        self.live.insert(ptr, (size, index));
    }

    /// A TENSOR_FREE of buffer `ptr`.
    pub(crate) fn free(&mut self, ptr: u64) {
        self.frees += 1;
        if let Some((size, _)) = self.forget(ptr) {
            self.live_bytes = self.live_bytes.saturating_sub(size);
        }
    }

    /// Takes live buffer `ptr` out of the live set (its free, in the changes).
    fn forget(&mut self, ptr: u64) -> Option<(u64, Option<usize>)> {
        let (size, index) = self.live.remove(&ptr)?;
        if let Some(index) = index {
            self.changes.push((index, false));
        }
        Some((size, index))
    }

    /// A `buffer_use` record: what the live buffer it names holds.
    pub(crate) fn use_of(&mut self, used: BufferUse) {
        let Some(&(_, Some(index))) = self.live.get(&used.buffer) else {
            return;
        };
        let life = &mut self.lives[index];
        if used.usage.is_some() {
            life.usage = used.usage;
        }
        if used.first_tensor.is_some() {
            life.first_tensor = used.first_tensor;
        }
    }

    /// The buffers by role and buffer type, with their peak and end-of-trace bytes: weights
    /// first, then KV cache, recurrent state, compute and the rest; the largest type first.
    pub fn by_role(&self) -> Vec<MemoryRow> {
        let key_of: Vec<(BufferRole, &str)> = self
            .lives
            .iter()
            .map(|l| {
                let role = BufferRole::of(l.usage.as_deref(), l.first_tensor.as_deref());
                (role, l.buffer_type.as_str())
            })
            .collect();
        let mut rows: HashMap<(BufferRole, &str), MemoryRow> = HashMap::new();
        for &(role, buffer_type) in &key_of {
            let row = rows
                .entry((role, buffer_type))
                .or_insert_with(|| MemoryRow {
                    role,
                    buffer_type: buffer_type.to_string(),
                    buffers: 0,
                    peak_bytes: 0,
                    end_bytes: 0,
                });
            row.buffers += 1;
        }
        for &(index, allocated) in &self.changes {
            let row = rows
                .get_mut(&key_of[index])
                .expect("every buffer has its row");
            let size = self.lives[index].size;
            row.end_bytes = if allocated {
                row.end_bytes.saturating_add(size)
            } else {
                row.end_bytes.saturating_sub(size)
            };
            row.peak_bytes = row.peak_bytes.max(row.end_bytes);
        }
        let mut rows: Vec<MemoryRow> = rows.into_values().collect();
        rows.sort_by(|a, b| {
            (a.role, std::cmp::Reverse(a.peak_bytes), &a.buffer_type).cmp(&(
                b.role,
                std::cmp::Reverse(b.peak_bytes),
                &b.buffer_type,
            ))
        });
        rows
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn used(buffer: u64, usage: Option<&str>, first_tensor: Option<&str>) -> BufferUse {
        BufferUse {
            buffer,
            usage: usage.map(Into::into),
            first_tensor: first_tensor.map(Into::into),
        }
    }

    #[test]
    fn buffers_are_told_apart_by_what_the_program_said() {
        let mut m = MemoryStats::default();
        m.alloc(1, 1000, b"CPU_Mapped@0x7f00");
        m.use_of(used(1, Some("weights"), None));
        m.alloc(2, 300, b"CPU@0x1");
        m.use_of(used(2, None, Some("cache_k_l0")));
        m.alloc(3, 50, b"CPU@0x2");
        m.use_of(used(3, Some("compute"), None));
        // The compute buffer grows: freed, made again larger (at the same handle).
        m.free(3);
        m.alloc(3, 80, b"CPU@0x3");
        m.use_of(used(3, Some("compute"), None));
        m.alloc(4, 7, b"CPU@0x4");
        // A zero-size buffer is in no row.
        m.alloc(5, 0, b"CPU@0x0");
        m.use_of(used(5, Some("weights"), None));
        m.free(2);
        let rows = m.by_role();
        let rows: Vec<(BufferRole, &str, u64, u64, u64)> = rows
            .iter()
            .map(|r| {
                (
                    r.role,
                    r.buffer_type.as_str(),
                    r.buffers,
                    r.peak_bytes,
                    r.end_bytes,
                )
            })
            .collect();
        assert_eq!(
            rows,
            [
                (BufferRole::Weights, "CPU_Mapped", 1, 1000, 1000),
                (BufferRole::KvCache, "CPU", 1, 300, 0),
                (BufferRole::Compute, "CPU", 2, 80, 80),
                (BufferRole::Other, "CPU", 1, 7, 7),
            ]
        );
    }

    #[test]
    fn a_record_for_a_buffer_not_live_changes_nothing() {
        let mut m = MemoryStats::default();
        m.alloc(1, 10, b"CPU@0x1");
        m.free(1);
        m.use_of(used(1, Some("weights"), None));
        assert_eq!(m.by_role()[0].role, BufferRole::Other);
    }
}
