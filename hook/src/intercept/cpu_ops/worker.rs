//! Each worker thread's state among the wrapped calls ([`Worker`], which `common` reaches
//! through a slot of initial-exec TLS): its depth, its open share, its call-site cache and the op
//! infos of the nodes it computed last (in the order it computed them, see
//! [`sequence`](super::sequence), and by address).

use std::cell::Cell;
use std::ffi::{CStr, c_void};
use std::sync::atomic::{AtomicUsize, Ordering};

use super::sequence::{CachedInfo, Known, Sequence};
use crate::base::ggml::Helpers;
use crate::base::tensor::{self, Snapshot, read_tensor};
use crate::intercept::eval_callback::node_info;
use crate::intercept::route::{Callee, Resolved, resolve_callee};
use crate::record::{OpInfo, Recorder, ThisThread};

type Ptr = *mut c_void;

/// A thread's share of a node, and the recorder it is recorded in.
pub(super) type Share = (OpInfo, &'static Recorder);

/// A share that ended, the recorder it is recorded in, and the ticks it ended at.
pub(super) type EndedAt = (OpInfo, &'static Recorder, u64);

/// What a wrapped function's arguments hold. The numbers are `common`'s: below `Marker`, a call
/// may take its fast path; from `Barrier` on, it is a barrier.
#[derive(Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(super) enum Kind {
    /// `(params, dst, …)`.
    Second,
    /// `(params, bool, dst)`: `flash_attn_back`.
    Third,
    /// `(params, first, last)`: one call computing two nodes.
    Fused,
    /// `ggml_cpu_extra_compute_forward(params, node)`: the dispatcher's first call for a node.
    Marker,
    /// `ggml_barrier(threadpool)`.
    Barrier,
    /// `GOMP_barrier()`, OpenMP's barrier (GCC's libgomp), which ggml's barrier calls in an
    /// OpenMP build: where the compiler inlined `ggml_barrier` (a ggml linked into the
    /// executable), ggml's graph loop and `mul_mat` call it directly. A barrier of ggml's where
    /// it follows a node or lies inside one; nothing otherwise (called from inside our
    /// `ggml_barrier` wrapper's call, or by OpenMP code outside any node: ggml's `omp single`
    /// before a graph's first node).
    OmpBarrier,
}

// This thread's `Worker`, where `common` can reach it in two instructions: an 8-byte slot of
// initial-exec TLS (a preloaded library's static TLS; 8 bytes also fit the surplus glibc keeps
// for a library loaded later), set by `enter` once it records on the thread, or once it knows
// nothing will be.
core::arch::global_asm!(
    ".pushsection .tbss,\"awT\",@nobits",
    ".p2align 3",
    ".globl ggml_viz_worker_slot",
    ".hidden ggml_viz_worker_slot",
    ".type ggml_viz_worker_slot, @object",
    ".size ggml_viz_worker_slot, 8",
    "ggml_viz_worker_slot:",
    ".zero 8",
    ".popsection",
);

/// Points this thread's slot at its `Worker`.
#[inline]
pub(super) fn set_worker_slot(w: &Worker) {
    // SAFETY: writes this thread's own TLS slot (defined above), nothing else.
    unsafe {
        core::arch::asm!(
            "mov {t}, qword ptr [rip + ggml_viz_worker_slot@GOTTPOFF]",
            "mov qword ptr fs:[{t}], {w}",
            t = out(reg) _,
            w = in(reg) w as *const Worker,
            options(nostack, preserves_flags),
        )
    }
}

/// This thread's place among the wrapped calls. No destructors (see `record::events`).
pub(super) struct Worker {
    /// Wrapped per-op calls open on this thread (barriers not counted).
    pub(super) depth: Cell<u32>,
    /// Return address of the outermost open call: stands in for a tail call's.
    pub(super) outer_site: Cell<usize>,
    /// This thread's open share of a node, and the recorder it is recorded in.
    pub(super) node: Cell<Option<Share>>,
    /// The tensor of `node` (0: none), where `common`'s fast path can read it.
    pub(super) open_tensor: Cell<usize>,
    /// A call computed `node` on this thread: its per-op function, or the dispatcher's marker
    /// (repacked weights). Before that, a barrier lies inside an op whose function no wrapper
    /// reaches (see [`Worker::barrier_follows_node`]).
    pub(super) node_computed: Cell<bool>,
    /// Nothing will be timed on this thread ([`record::thread_ops_never`](crate::record::thread_ops_never)): `common` sends
    /// every call from a resolved site straight to ggml.
    pub(super) passthrough: Cell<bool>,
    /// Thread index and count from the compute params of the last node.
    pub(super) ith: Cell<u32>,
    pub(super) nth: Cell<u32>,
    /// When the open barrier wait began (0: no wait open, or one not recorded): stamped by
    /// `common` before ggml's barrier of several threads, or set where the slow path records
    /// the wait.
    pub(super) barrier_start: Cell<u64>,
    /// When this thread's share ended, where `common` stamped it at a barrier of one thread
    /// after its computed node (0: none ended so), and that barrier's site. The share is no
    /// longer open (`open_tensor` is 0, for `common` as for the rest) but still in `node`: it is
    /// recorded at this thread's next call into Rust (`settle`, in `shares`), which
    /// at one thread is the next node's marker or the graph compute's return.
    pub(super) ended_at: Cell<u64>,
    pub(super) ended_site: Cell<usize>,
    /// The site of the last call of OpenMP's barrier made inside a timed `ggml_barrier`
    /// wait, and where `common` sent it: the trampoline `omp_barrier` sends the next such call
    /// from there straight on (ggml's barrier at two threads or more makes one after every node
    /// of an OpenMP build).
    pub(super) omp_site: Cell<usize>,
    pub(super) omp_real: Cell<usize>,
    /// This thread's recording state, once it recorded.
    thread: Cell<Option<ThisThread>>,
    /// The call sites this thread resolved last, in sets by (row, site): each node makes three
    /// or more wrapped calls, so the shared cache's probing is paid once per site and thread.
    pub(super) sites: [[SiteSlot; SITE_WAYS]; SITE_SETS],
    /// The op infos of the nodes this thread began shares of, in order: where a node's is found
    /// first.
    pub(super) sequence: Sequence,
    /// [`FREE_SEQUENCE`] is registered on this thread: its exit frees the sequence.
    sequence_freed_at_exit: Cell<bool>,
    /// The op infos of the nodes this thread computed last, direct-mapped by tensor address,
    /// with the tensor's fingerprint (name, op, type, shape) when it was described and the
    /// recorder whose tensor table the id is in (a child after `fork` has its own): where a
    /// node the sequence does not have next is found (a graph other than the last, or nodes in
    /// another order).
    infos: [Cell<CachedInfo>; INFOS],
    /// The addresses of the dispatcher's marker's call-site entry and route (see
    /// [`Worker::prefetch_next`]).
    pub(super) marker_lines: Cell<(usize, usize)>,
}

/// A call-site cache entry: key (return address and row) and where the call goes; `repr(C)`
/// for `common`'s fast path, which reads it. Every entry whose key is not 0 has its route
/// (`resolved` is `None` only in the empty entries, key 0, and the fast path's keys are never 0:
/// a return address is not), so the fast path reads the route of an entry it matched unchecked.
#[derive(Clone, Copy)]
#[repr(C)]
pub(super) struct SiteEntry {
    pub(super) key: usize,
    pub(super) resolved: Option<&'static Resolved>,
}

pub(super) type SiteSlot = Cell<SiteEntry>;

/// The return addresses of the `ggml_barrier` calls that follow nodes in ggml's graph loops,
/// learned (see [`Worker::barrier_follows_node`]): two per ggml copy, 0 where none yet. With
/// more copies than this holds, a node whose function is not wrapped ends its shares at its
/// first barrier, as before the sites were known.
static AFTER_NODE_SITES: [AtomicUsize; 8] = [const { AtomicUsize::new(0) }; 8];

/// Adds `site` to [`AFTER_NODE_SITES`] unless it is there or the table is full; a load only,
/// once it is there (every node), so that threads do not write the line they all read.
#[inline]
fn learn_after_node_site(site: usize) {
    for slot in &AFTER_NODE_SITES {
        match slot.load(Ordering::Relaxed) {
            known if known == site => return,
            0 => match slot.compare_exchange(0, site, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => return,
                Err(known) if known == site => return,
                Err(_) => {}
            },
            _ => {}
        }
    }
}

/// Entries of a thread's op-info cache (a power of two).
const INFOS: usize = 256;

/// Mixed into a fused call's fingerprint: its info is not its last node's.
const FUSED: u64 = 0x5EED_F05E_D000_0001;

impl Worker {
    /// The op info of `tensor`, a live node of the copy `h` belongs to.
    ///
    /// # Safety
    /// `tensor` is a live node of the copy `h` belongs to.
    #[inline]
    pub(super) unsafe fn node_info(&self, h: &Helpers, r: &Recorder, tensor: Ptr) -> OpInfo {
        // SAFETY: per the contract.
        unsafe { self.info_of(h, r, None, tensor) }
    }

    /// The op info of a fused call that computed `first` and then `last`.
    ///
    /// # Safety
    /// Both are live nodes of the copy `h` belongs to.
    #[inline]
    pub(super) unsafe fn fused_node_info(
        &self,
        h: &Helpers,
        r: &Recorder,
        first: Ptr,
        last: Ptr,
    ) -> OpInfo {
        // SAFETY: per the contract.
        unsafe { self.info_of(h, r, Some(first), last) }
    }

    /// The op info of the node `tensor` (computed after `first` by one fused call, if given):
    /// from this thread's sequence while its tensor matches its snapshot (and `first` its
    /// fingerprint: the dispatcher calls a fused function without a share of `first` before),
    /// else from the direct-mapped cache while their fingerprints are unchanged, else
    /// described; the sequence learns it in the last two cases.
    ///
    /// # Safety
    /// `tensor` and `first` are live nodes of the copy `h` belongs to.
    #[inline(always)]
    unsafe fn info_of(&self, h: &Helpers, r: &Recorder, first: Option<Ptr>, tensor: Ptr) -> OpInfo {
        let recorder = r as *const Recorder as usize;
        // SAFETY: per the contract.
        if let Some(known) = self.known_next(tensor as usize)
            && known.info.recorder == recorder
            && unsafe { known.snapshot.matches(tensor) }
            && Some(known.first) == first.map_or(Some(0), |f| unsafe { tensor::fingerprint(h, f) })
        {
            let op = known.info.op();
            self.sequence.advance();
            return op;
        }
        // SAFETY: per the contract.
        unsafe { self.learn(h, r, first, tensor) }
    }

    /// [`Worker::info_of`] where the sequence does not have the node up to date (out of line:
    /// the first sight of a node, another graph, a shape changed).
    ///
    /// # Safety
    /// `tensor` and `first` are live nodes of the copy `h` belongs to.
    #[inline(never)]
    unsafe fn learn(&self, h: &Helpers, r: &Recorder, first: Option<Ptr>, tensor: Ptr) -> OpInfo {
        // SAFETY: per the contract.
        let print = unsafe { tensor::fingerprint(h, tensor) };
        // The fused call's first node by its fingerprint; 0 for a node of its own (a
        // fingerprint is never 0).
        // SAFETY: per the contract.
        let first_print = first.map_or(Some(0), |f| unsafe { tensor::fingerprint(h, f) });
        let key = match first {
            None => print,
            Some(_) => print
                .zip(first_print)
                .map(|(last, first)| last ^ first.rotate_left(17) ^ FUSED),
        };
        // SAFETY: per the contract.
        let info = self.cached(r, tensor, key, || unsafe {
            match first {
                None => node_info(h, r, tensor, std::ptr::null_mut()),
                Some(first) => fused_info(h, r, first, tensor),
            }
        });
        // SAFETY: per the contract.
        if key.is_some()
            && let Some(first_print) = first_print
            && let Some(snapshot) = unsafe { Snapshot::take(h, tensor) }
        {
            if !self.sequence_freed_at_exit.replace(true) {
                FREE_SEQUENCE.with(|_| {});
            }
            let position = self.sequence.learn(Known {
                info,
                snapshot,
                first: first_print,
                next: 0,
            });
            // SAFETY: an entry of this thread's own cache; one field is set.
            unsafe { (*self.info_slot(tensor).as_ptr()).position = position.unwrap_or(u32::MAX) };
        }
        info.op()
    }

    /// The sequence's entry for `tensor`: next, or at the position the direct-mapped cache's
    /// entry says it was learned at (another graph computed again), or first.
    #[inline]
    fn known_next(&self, tensor: usize) -> Option<&Known> {
        self.sequence.find(tensor).or_else(|| {
            // SAFETY: an entry of this thread's own cache, read in place.
            let known = unsafe { &*self.info_slot(tensor as Ptr).as_ptr() };
            (known.tensor == tensor)
                .then(|| self.sequence.find_at(known.position, tensor))
                .flatten()
        })
    }

    /// The op-info cache entry of `tensor`.
    fn info_slot(&self, tensor: Ptr) -> &Cell<CachedInfo> {
        &self.infos[(tensor as usize >> 4).wrapping_mul(0x9E37_79B9) % INFOS]
    }

    /// When this thread's share of a node ends: asks for what the next share will read first,
    /// while ggml's barrier runs (a wait, with several threads): the next entry of the sequence
    /// and its tensor's name, and the dispatcher's marker's call-site entry and route (the
    /// op computed since their last use has usually pushed them out of the caches, and their
    /// loads were the slowest steps of a share: perf samples at `-t 2`).
    #[inline]
    fn prefetch_next(&self) {
        if let Some((entry, tensor)) = self.sequence.ahead() {
            prefetch(entry);
            prefetch((entry as *const u8).wrapping_add(64));
            prefetch((entry as *const u8).wrapping_add(128));
            if tensor != 0 {
                let tensor = tensor as *const u8;
                prefetch(tensor);
                prefetch(tensor.wrapping_add(64));
                let name = tensor.wrapping_add(tensor::NAME_AT);
                prefetch(name);
                prefetch(name.wrapping_add(tensor::NAME_FIELD - 1));
            }
        }
        let (entry, resolved) = self.marker_lines.get();
        prefetch(entry as *const u8);
        prefetch(resolved as *const u8);
    }

    /// The direct-mapped cache's entry for `tensor` while its fingerprint is `print`, else one
    /// of what `describe` says (cached when there is a fingerprint).
    fn cached(
        &self,
        r: &Recorder,
        tensor: Ptr,
        print: Option<u64>,
        describe: impl FnOnce() -> OpInfo,
    ) -> CachedInfo {
        let key = (
            tensor as usize,
            print.unwrap_or(0),
            r as *const Recorder as usize,
        );
        let slot = self.info_slot(tensor);
        let entry = slot.get();
        if print.is_some() && (entry.tensor, entry.print, entry.recorder) == key {
            return entry;
        }
        let op = describe();
        let entry = CachedInfo {
            tensor: key.0,
            print: key.1,
            recorder: key.2,
            op_size: op.op_size,
            backend: op.backend as usize,
            op_type: op.op_type,
            tensor_id: op.tensor_id,
            position: u32::MAX,
        };
        if print.is_some() {
            slot.set(entry);
        }
        entry
    }
}

/// Asks the CPU to bring the cache line of `p` closer (a hint, which never faults).
fn prefetch<T>(p: *const T) {
    use core::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
    // SAFETY: a prefetch reads nothing and cannot fault, whatever the address.
    unsafe { _mm_prefetch::<_MM_HINT_T0>(p.cast()) }
}

/// Sets of a thread's call-site cache (a power of two), and the entries of each: 512 in all,
/// for the ~150 sites a llama.cpp run calls through (64 direct-mapped entries, which sites
/// shared, missed one call in ten).
const SITE_SETS: usize = 128;
pub(super) const SITE_WAYS: usize = 4;
/// A key's set: the top bits of its product with this odd constant.
pub(super) const SITE_MIX: u64 = 0x9E37_79B9_7F4A_7C15;
pub(super) const SITE_SET_SHIFT: u32 = 64 - SITE_SETS.trailing_zeros();

impl Worker {
    /// The set of this thread's call-site cache for `row` called from `site`, and its key.
    #[inline]
    fn site_set(&self, row: usize, site: usize) -> (&[SiteSlot; SITE_WAYS], usize) {
        let key = site ^ (row << 48);
        let set = (key as u64).wrapping_mul(SITE_MIX) >> SITE_SET_SHIFT;
        (&self.sites[set as usize], key)
    }

    /// The real function of `row` called from `site`, if this thread has resolved it before.
    #[inline]
    pub(super) fn cached_site(&self, row: usize, site: usize) -> Option<&'static Resolved> {
        let (set, key) = self.site_set(row, site);
        set.iter().find_map(|slot| match slot.get() {
            SiteEntry {
                key: k,
                resolved: Some(resolved),
            } if k == key => Some(resolved),
            _ => None,
        })
    }

    /// The real function of `row` (named `name`) called from `site`, resolved and cached in its
    /// set's first entry (the others move down one, the last is forgotten).
    pub(super) fn resolve_site(
        &self,
        row: usize,
        name: &'static CStr,
        site: usize,
    ) -> Option<&'static Resolved> {
        let (resolved, _) = resolve_callee(Callee::Cpu(row as u8, name), site)?;
        let (set, key) = self.site_set(row, site);
        for way in (1..SITE_WAYS).rev() {
            set[way].set(set[way - 1].get());
        }
        set[0].set(SiteEntry {
            key,
            resolved: Some(resolved),
        });
        Some(resolved)
    }

    #[inline]
    pub(super) fn this_thread(&self) -> ThisThread {
        match self.thread.get() {
            Some(thread) => thread,
            None => {
                let thread = ThisThread::get();
                self.thread.set(Some(thread));
                thread
            }
        }
    }

    /// Opens this thread's share of the node of `op`; `computed` when the call that opens it
    /// computes the node (a per-op call, not the marker).
    #[inline]
    pub(super) fn open_node(&self, op: OpInfo, r: &'static Recorder, computed: bool) {
        self.open_tensor.set(op.tensor as usize);
        self.node_computed.set(computed);
        self.node.set(Some((op, r)));
    }

    /// This thread's open share, which ends (none where `open_tensor` says none is open): what
    /// the next share reads first is asked for ([`Worker::prefetch_next`]).
    #[inline]
    pub(super) fn take_node(&self) -> Option<Share> {
        if self.open_tensor.replace(0) == 0 {
            return None;
        }
        self.prefetch_next();
        self.node.take()
    }

    /// This thread's share that `common` ended at a barrier of one thread (see `ended_at`), with
    /// the ticks it ended at, which is recorded now; that barrier's site is learned as one after
    /// a node, as [`Worker::barrier_follows_node`] would have.
    #[inline(always)]
    pub(super) fn take_ended(&self) -> Option<EndedAt> {
        let at = self.ended_at.get();
        if at == 0 {
            return None;
        }
        self.ended_at.set(0);
        learn_after_node_site(self.ended_site.get());
        self.node.take().map(|(op, r)| (op, r, at))
    }

    /// Whether a `ggml_barrier` called at depth 0 from `site` follows the node this thread's
    /// share is open for (ggml's graph loop has one after each node and one after the last),
    /// and so ends the share, or lies inside the node's op, in a function no wrapper reaches:
    /// `mul_mat_id` (MoE models' experts) is static in ggml-cpu.c and waits for its threads
    /// once they have converted its input, before its products. A barrier after a computed call
    /// follows the node; its site is learned, for the nodes whose function is not wrapped.
    #[inline]
    pub(super) fn barrier_follows_node(&self, site: usize) -> bool {
        if self.open_tensor.get() == 0 {
            return false;
        }
        if self.node_computed.get() {
            learn_after_node_site(site);
            return true;
        }
        site != 0
            && AFTER_NODE_SITES
                .iter()
                .any(|known| known.load(Ordering::Relaxed) == site)
    }

    /// Whether a call of OpenMP's barrier is ggml's: not inside our `ggml_barrier` wrapper's call
    /// (whose wait is open), and after or inside a node (see [`Kind::OmpBarrier`]). `common`'s
    /// fast path asks the same.
    #[inline]
    pub(super) fn omp_barrier_is_ggmls(&self) -> bool {
        self.barrier_start.get() == 0 && (self.depth.get() > 0 || self.open_tensor.get() != 0)
    }

    /// Whether a call of a function of `kind` computes the node this thread's share is open
    /// for: the dispatcher's per-op call for the node its marker began.
    #[inline]
    pub(super) fn continues_node(&self, kind: Kind, arg1: Ptr, arg2: Ptr) -> bool {
        let tensor = node_tensor(kind, arg1, arg2) as usize;
        tensor != 0 && self.open_tensor.get() == tensor
    }
}

thread_local! {
    pub(super) static WORKER: Worker = const {
        Worker {
            depth: Cell::new(0),
            outer_site: Cell::new(0),
            node: Cell::new(None),
            open_tensor: Cell::new(0),
            node_computed: Cell::new(false),
            passthrough: Cell::new(false),
            ith: Cell::new(0),
            nth: Cell::new(0),
            barrier_start: Cell::new(0),
            ended_at: Cell::new(0),
            ended_site: Cell::new(0),
            omp_site: Cell::new(0),
            omp_real: Cell::new(0),
            thread: Cell::new(None),
            sites: [const {
                [const {
                    Cell::new(SiteEntry {
                        key: 0,
                        resolved: None,
                    })
                }; SITE_WAYS]
            }; SITE_SETS],
            sequence: Sequence::new(),
            sequence_freed_at_exit: Cell::new(false),
            infos: [const { Cell::new(CachedInfo::EMPTY) }; INFOS],
            marker_lines: Cell::new((0, 0)),
        }
    };
}

/// Its destructor frees this thread's sequence when the thread exits.
struct FreeSequence;

impl Drop for FreeSequence {
    fn drop(&mut self) {
        WORKER.with(|w| w.sequence.close());
    }
}

thread_local! {
    static FREE_SEQUENCE: FreeSequence = const { FreeSequence };
}

/// The node a call of a function of `kind` computes (its last, for a fused call).
#[inline]
pub(super) fn node_tensor(kind: Kind, arg1: Ptr, arg2: Ptr) -> Ptr {
    match kind {
        Kind::Third | Kind::Fused => arg2,
        _ => arg1,
    }
}

/// The op info of a fused call that computed `first` and then `last`: the last node's, with
/// both ops in its name (`RMS_NORM+MUL`) and under a tensor-info key of its own.
///
/// # Safety
/// Both are live nodes of the copy `h` belongs to.
unsafe fn fused_info(h: &Helpers, r: &Recorder, first: Ptr, last: Ptr) -> OpInfo {
    // SAFETY: per the contract.
    let (mut op, first_key) = unsafe {
        (
            node_info(h, r, last, std::ptr::null_mut()),
            tensor::identity(h, first).0,
        )
    };
    // SAFETY: per the contract.
    let (last_key, _) = unsafe { tensor::identity(h, last) };
    op.tensor_id = r.tensor_id(last_key ^ first_key.rotate_left(17) | 1, || {
        // SAFETY: per the contract.
        unsafe { read_tensor(h, last, Some(first)) }
    });
    op
}
