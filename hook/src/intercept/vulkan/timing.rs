//! The nodes ggml-vulkan labels, timed by the device: with `GGML_VK_DEBUG_MARKERS` set it wraps
//! each node's commands in `vkCmdBeginDebugUtilsLabelEXT("<OP>[+<OP>…] <tensor name>")` …
//! `vkCmdEndDebugUtilsLabelEXT`, inside a `submit N` label per command buffer, with a label per
//! dispatch inside the node (lowercase pipeline names). At a node's label this layer resets two
//! queries of a timestamp pool of its own and writes the first (`TOP_OF_PIPE`); at the label's
//! end, the second (`BOTTOM_OF_PIPE`). Nothing else: no barrier, no submit, no wait.
//!
//! The timestamps are read once the application knows the work is done: when its fence
//! signalled (`vkGetFenceStatus`, `vkWaitForFences`: every batch submitted on that queue up to
//! the fence's), or its queue or device went idle. They are put on `CLOCK_MONOTONIC` with
//! `VK_EXT_calibrated_timestamps` (one calibration per read), and handed to the recording core.
//!
//! A node ggml splits across command buffers (its labels are closed at a buffer's end and
//! reopened in the next) is one node: its last part in one buffer and its first in the next,
//! under the same label, are joined.
//!
//! What is exact: ggml puts a barrier between nodes only where one reads what another wrote, so
//! on a GPU the nodes between two barriers may overlap; an end timestamp waits for every earlier
//! command. A serial driver (lavapipe) gives each node its own time.

use std::collections::{HashMap, VecDeque};
use std::ffi::{CStr, c_void};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock, PoisonError};

use ash::vk::{self, Handle};

use super::plan::Plan;
use super::{cast, slice};
use crate::base::say_once;
use crate::intercept::route::first_helpers;
use crate::record::{self, DeviceLane, DeviceNode};

/// Timestamp query pairs per device: nodes recorded and not yet read at once.
const PAIRS: usize = 4096;

/// The next layer's device functions this layer calls.
pub(super) struct Next {
    pub(super) lookup: vk::PFN_vkGetDeviceProcAddr,
    pub(super) destroy_device: vk::PFN_vkDestroyDevice,
    pub(super) begin_command_buffer: vk::PFN_vkBeginCommandBuffer,
    pub(super) queue_submit: vk::PFN_vkQueueSubmit,
    pub(super) get_fence_status: vk::PFN_vkGetFenceStatus,
    pub(super) wait_for_fences: vk::PFN_vkWaitForFences,
    pub(super) queue_wait_idle: vk::PFN_vkQueueWaitIdle,
    pub(super) device_wait_idle: vk::PFN_vkDeviceWaitIdle,
    pub(super) begin_label: Option<vk::PFN_vkCmdBeginDebugUtilsLabelEXT>,
    pub(super) end_label: Option<vk::PFN_vkCmdEndDebugUtilsLabelEXT>,
}

/// The timing side of a device: its pool, lane and calibration, and what is in flight.
pub(super) struct Timing {
    backend: String,
    lane: DeviceLane,
    period_ns: f64,
    mask: u64,
    pub(super) pool: vk::QueryPool,
    reset: vk::PFN_vkCmdResetQueryPool,
    write: vk::PFN_vkCmdWriteTimestamp,
    results: vk::PFN_vkGetQueryPoolResults,
    calibrate: vk::PFN_vkGetCalibratedTimestampsKHR,
    pub(super) destroy_pool: vk::PFN_vkDestroyQueryPool,
    state: Mutex<State>,
    /// The last node read, when its command buffer ended with it: it may go on in the next.
    held: Mutex<Option<Held>>,
}

/// A node read, on `CLOCK_MONOTONIC`.
struct Held {
    label: String,
    /// The kernels it ran, `, `-separated.
    kernels: String,
    begin_ns: u64,
    end_ns: u64,
    /// Its part read last was the last node of its command buffer.
    ends_buffer: bool,
}

/// A device this layer sits in.
pub struct Device {
    pub(super) key: usize,
    pub(super) handle: vk::Device,
    pub(super) next: Next,
    pub(super) timing: Option<Timing>,
}

#[derive(Default)]
struct State {
    /// Each query pair: held by a node not yet read.
    busy: Vec<bool>,
    next_pair: usize,
    recording: HashMap<u64, Recording>,
    /// Command buffers submitted and not yet read, in submission order.
    pending: VecDeque<Batch>,
}

/// A command buffer being recorded: its label depth, the node open in it, the nodes closed.
#[derive(Default)]
struct Recording {
    depth: u32,
    open: Option<Open>,
    nodes: Vec<Timed>,
}

/// A node whose label is open: its label, query pair, depth, and the dispatches so far.
struct Open {
    label: String,
    pair: usize,
    depth: u32,
    kernels: Vec<String>,
}

/// A node recorded: its label, query pair and kernels (`, `-separated).
struct Timed {
    label: String,
    pair: usize,
    kernels: String,
}

/// A submitted command buffer's nodes, with its queue and fence.
pub(super) struct Batch {
    pub(super) queue: u64,
    pub(super) fence: u64,
    nodes: Vec<Timed>,
}

impl Device {
    /// The device `handle`, its next layer's lookup `lookup`, timed where `plan` says.
    ///
    /// # Safety
    /// `handle` is a live device; `lookup` is the next layer's device lookup.
    pub unsafe fn new(
        handle: vk::Device,
        lookup: vk::PFN_vkGetDeviceProcAddr,
        plan: Option<Plan>,
    ) -> Device {
        // SAFETY: lookups of device functions, each cast to its own type; the core ones exist
        // on every device.
        let next = unsafe {
            let get = |name: &CStr| lookup(handle, name.as_ptr());
            Next {
                lookup,
                destroy_device: cast(get(c"vkDestroyDevice")).expect("core"),
                begin_command_buffer: cast(get(c"vkBeginCommandBuffer")).expect("core"),
                queue_submit: cast(get(c"vkQueueSubmit")).expect("core"),
                get_fence_status: cast(get(c"vkGetFenceStatus")).expect("core"),
                wait_for_fences: cast(get(c"vkWaitForFences")).expect("core"),
                queue_wait_idle: cast(get(c"vkQueueWaitIdle")).expect("core"),
                device_wait_idle: cast(get(c"vkDeviceWaitIdle")).expect("core"),
                begin_label: cast(get(c"vkCmdBeginDebugUtilsLabelEXT")),
                end_label: cast(get(c"vkCmdEndDebugUtilsLabelEXT")),
            }
        };
        // SAFETY: a live device handle.
        let key = unsafe { super::dispatch_key(handle.as_raw()) };
        // SAFETY: as above.
        let timing = plan.and_then(|plan| unsafe { Timing::new(handle, lookup, plan) });
        if timing.is_some() {
            record::device_timing_on();
        }
        Device {
            key,
            handle,
            next,
            timing,
        }
    }

    pub fn key(&self) -> usize {
        self.key
    }

    pub fn next_lookup(&self) -> vk::PFN_vkGetDeviceProcAddr {
        self.next.lookup
    }
}

impl Timing {
    /// # Safety
    /// As [`Device::new`].
    unsafe fn new(
        handle: vk::Device,
        lookup: vk::PFN_vkGetDeviceProcAddr,
        plan: Plan,
    ) -> Option<Timing> {
        // SAFETY: lookups of device functions, each cast to its own type.
        let (create_pool, destroy_pool, reset, write, results, calibrate) = unsafe {
            let get = |name: &CStr| lookup(handle, name.as_ptr());
            (
                cast::<vk::PFN_vkCreateQueryPool>(get(c"vkCreateQueryPool"))?,
                cast::<vk::PFN_vkDestroyQueryPool>(get(c"vkDestroyQueryPool"))?,
                cast::<vk::PFN_vkCmdResetQueryPool>(get(c"vkCmdResetQueryPool"))?,
                cast::<vk::PFN_vkCmdWriteTimestamp>(get(c"vkCmdWriteTimestamp"))?,
                cast::<vk::PFN_vkGetQueryPoolResults>(get(c"vkGetQueryPoolResults"))?,
                cast::<vk::PFN_vkGetCalibratedTimestampsKHR>(get(c"vkGetCalibratedTimestampsEXT"))?,
            )
        };
        let info = vk::QueryPoolCreateInfo::default()
            .query_type(vk::QueryType::TIMESTAMP)
            .query_count(2 * PAIRS as u32);
        let mut pool = vk::QueryPool::null();
        // SAFETY: a valid create info and a writable handle.
        if unsafe { create_pool(handle, &info, std::ptr::null(), &mut pool) } != vk::Result::SUCCESS
        {
            return None;
        }
        static DEVICES: AtomicUsize = AtomicUsize::new(0);
        let index = DEVICES.fetch_add(1, Ordering::Relaxed);
        let backend = format!("Vulkan{index}");
        let lane = DeviceLane::new(format!("{backend} queue"));
        Some(Timing {
            backend,
            lane,
            period_ns: plan.period_ns,
            mask: if plan.valid_bits >= 64 {
                u64::MAX
            } else {
                (1u64 << plan.valid_bits) - 1
            },
            pool,
            reset,
            write,
            results,
            calibrate,
            destroy_pool,
            state: Mutex::new(State {
                busy: vec![false; PAIRS],
                ..State::default()
            }),
            held: Mutex::new(None),
        })
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A node's label begins in `cb`: its first timestamp, where the label is a node's.
    pub(super) fn label_begins(&self, cb: vk::CommandBuffer, label: &str) {
        let mut state = self.state();
        let State {
            busy,
            next_pair,
            recording,
            ..
        } = &mut *state;
        let rec = recording.entry(cb.as_raw()).or_default();
        rec.depth += 1;
        if let Some(open) = &mut rec.open {
            // A dispatch inside the node: `pipeline (x,y,z)`, its pipeline named once.
            let pipeline = label.split(" (").next().unwrap_or(label);
            if !is_node_label(label) && open.kernels.last().is_none_or(|k| k != pipeline) {
                open.kernels.push(pipeline.to_string());
            }
            return;
        }
        if !is_node_label(label) || !record::device_nodes_wanted() {
            return;
        }
        let Some(pair) = (0..PAIRS)
            .map(|i| (*next_pair + i) % PAIRS)
            .find(|&p| !busy[p])
        else {
            return;
        };
        busy[pair] = true;
        *next_pair = (pair + 1) % PAIRS;
        // SAFETY: a command buffer being recorded (the application's contract for the label
        // call), our pool, queries within it.
        unsafe {
            (self.reset)(cb, self.pool, 2 * pair as u32, 2);
            (self.write)(
                cb,
                vk::PipelineStageFlags::TOP_OF_PIPE,
                self.pool,
                2 * pair as u32,
            );
        }
        rec.open = Some(Open {
            label: label.to_string(),
            pair,
            depth: rec.depth,
            kernels: Vec::new(),
        });
    }

    /// A label ends in `cb`: a node's second timestamp, where it is the open node's.
    pub(super) fn label_ends(&self, cb: vk::CommandBuffer) {
        let mut state = self.state();
        let Some(rec) = state.recording.get_mut(&cb.as_raw()) else {
            return;
        };
        if let Some(open) = &rec.open
            && open.depth == rec.depth
        {
            // SAFETY: as in `label_begins`.
            unsafe {
                (self.write)(
                    cb,
                    vk::PipelineStageFlags::BOTTOM_OF_PIPE,
                    self.pool,
                    2 * open.pair as u32 + 1,
                );
            }
            let open = rec.open.take().expect("checked");
            rec.nodes.push(Timed {
                label: open.label,
                pair: open.pair,
                kernels: open.kernels.join(", "),
            });
        }
        rec.depth = rec.depth.saturating_sub(1);
    }

    /// `cb` is begun (again): what it recorded before and was never submitted is forgotten.
    pub(super) fn buffer_begins(&self, cb: vk::CommandBuffer) {
        let mut state = self.state();
        if let Some(old) = state.recording.remove(&cb.as_raw()) {
            let open = old.open.as_ref().map(|o| o.pair);
            for pair in old.nodes.iter().map(|t| t.pair).chain(open) {
                state.busy[pair] = false;
            }
        }
    }

    /// The command buffers of `submits` went to `queue`, with `fence`: their nodes wait there
    /// to be read.
    ///
    /// # Safety
    /// `submits` holds `count` valid submit infos.
    pub(super) unsafe fn submitted(
        &self,
        queue: vk::Queue,
        count: u32,
        submits: *const vk::SubmitInfo<'_>,
        fence: vk::Fence,
    ) {
        let mut state = self.state();
        // SAFETY: per the contract.
        let submits = unsafe { slice(submits, count) };
        for submit in submits {
            // SAFETY: a valid submit info holds this many command buffers.
            for cb in unsafe { slice(submit.p_command_buffers, submit.command_buffer_count) } {
                let Some(rec) = state.recording.get_mut(&cb.as_raw()) else {
                    continue;
                };
                let nodes = std::mem::take(&mut rec.nodes);
                if !nodes.is_empty() {
                    state.pending.push_back(Batch {
                        queue: queue.as_raw(),
                        fence: fence.as_raw(),
                        nodes,
                    });
                }
            }
        }
        // The fence marks what was submitted before it, whatever this call held (ggml's last
        // submission of a graph waits on semaphores and holds no command buffer).
        if fence != vk::Fence::null() {
            state.pending.push_back(Batch {
                queue: queue.as_raw(),
                fence: fence.as_raw(),
                nodes: Vec::new(),
            });
        }
    }

    /// The batches `done` says are complete are read, and their nodes recorded.
    pub(super) fn complete(
        &self,
        device: vk::Device,
        done: impl Fn(&VecDeque<Batch>) -> Vec<usize>,
    ) {
        let mut state = self.state();
        let indices = done(&state.pending);
        if indices.is_empty() {
            return;
        }
        let mut batches = Vec::with_capacity(indices.len());
        for (taken, i) in indices.into_iter().enumerate() {
            if let Some(b) = state.pending.remove(i - taken) {
                batches.push(b);
            }
        }
        let mut read = Vec::new();
        for batch in &batches {
            let last = batch.nodes.len().saturating_sub(1);
            for (k, node) in batch.nodes.iter().enumerate() {
                let pair = &node.pair;
                let mut ticks = [0u64; 2];
                // SAFETY: our pool, two queries of it, into a buffer of two u64s.
                let result = unsafe {
                    (self.results)(
                        device,
                        self.pool,
                        2 * *pair as u32,
                        2,
                        size_of_val(&ticks),
                        ticks.as_mut_ptr().cast::<c_void>(),
                        8,
                        vk::QueryResultFlags::TYPE_64,
                    )
                };
                state.busy[*pair] = false;
                if result == vk::Result::SUCCESS {
                    let kernels = node.kernels.clone();
                    read.push((node.label.clone(), kernels, ticks, k == 0, k == last));
                }
            }
        }
        drop(state);
        let Some((device_now, monotonic_now)) = self.calibration(device) else {
            return;
        };
        let to_monotonic = |t: u64| {
            let ago = device_now.wrapping_sub(t) & self.mask;
            monotonic_now.saturating_sub((ago as f64 * self.period_ns) as u64)
        };
        // A node split across command buffers: its last part in one, its first in the next.
        // The last node read is held until the next read says whether it goes on.
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        let mut nodes: Vec<Held> = held.take().into_iter().collect();
        for (label, kernels, [t0, t1], first, last) in read {
            let (begin, end) = (to_monotonic(t0), to_monotonic(t1));
            match nodes.last_mut() {
                Some(prev) if first && prev.ends_buffer && prev.label == label => {
                    prev.end_ns = end.max(prev.end_ns);
                    prev.ends_buffer = last;
                    if !kernels.is_empty() {
                        if !prev.kernels.is_empty() {
                            prev.kernels.push_str(", ");
                        }
                        prev.kernels.push_str(&kernels);
                    }
                }
                _ => nodes.push(Held {
                    label,
                    kernels,
                    begin_ns: begin,
                    end_ns: end.max(begin),
                    ends_buffer: last,
                }),
            }
        }
        *held = nodes.pop_if(|n| n.ends_buffer);
        drop(held);
        for node in &nodes {
            self.emit(device, node);
        }
    }

    /// Records a node read off the device.
    fn emit(&self, device: vk::Device, node: &Held) {
        let (op, name) = node.label.split_once(' ').unwrap_or((&node.label, ""));
        let timed = DeviceNode {
            name,
            op,
            op_type: op_number(op.split('+').next().unwrap_or(op)),
            kernels: &node.kernels,
            begin_ns: node.begin_ns,
            end_ns: node.end_ns,
        };
        record::device_node(&self.lane, device.as_raw() as usize, &self.backend, &timed);
    }

    /// Records the node held back, if there is one (at exit).
    pub(super) fn hand_over_held(&self, device: vk::Device) {
        let held = self
            .held
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(node) = held {
            self.emit(device, &node);
        }
    }

    /// The device's clock and `CLOCK_MONOTONIC` read together.
    fn calibration(&self, device: vk::Device) -> Option<(u64, u64)> {
        let infos = [
            vk::CalibratedTimestampInfoEXT::default().time_domain(vk::TimeDomainEXT::DEVICE),
            vk::CalibratedTimestampInfoEXT::default()
                .time_domain(vk::TimeDomainEXT::CLOCK_MONOTONIC),
        ];
        let mut times = [0u64; 2];
        let mut deviation = 0u64;
        // SAFETY: two valid infos, two writable results.
        let result = unsafe {
            (self.calibrate)(
                device,
                2,
                infos.as_ptr(),
                times.as_mut_ptr(),
                &mut deviation,
            )
        };
        if result != vk::Result::SUCCESS {
            static SAID: AtomicBool = AtomicBool::new(false);
            say_once(
                &SAID,
                format_args!(
                    "a Vulkan device's clock could not be calibrated: its nodes are not recorded"
                ),
            );
            return None;
        }
        Some((times[0], times[1]))
    }
}

/// The number of ggml's op named `name`, from the ggml that runs (its op name table).
fn op_number(name: &str) -> Option<u32> {
    static TABLE: OnceLock<HashMap<String, u32>> = OnceLock::new();
    if TABLE.get().is_none() {
        let h = first_helpers()?;
        let n = h.op_count()?;
        let table = (0..n)
            // SAFETY: op numbers below the op count.
            .map(|op| {
                (
                    unsafe { h.op_name_cstr(op) }.to_string_lossy().into_owned(),
                    op,
                )
            })
            .collect();
        let _ = TABLE.set(table);
    }
    TABLE.get()?.get(name).copied()
}

/// Whether a label names a node: its first word is an op (`MUL_MAT`, `RMS_NORM+MUL`: capitals,
/// digits, `_` and `+`), not `submit N` or a dispatch's pipeline (lowercase).
fn is_node_label(label: &str) -> bool {
    let op = label.split(' ').next().unwrap_or_default();
    !op.is_empty()
        && op.bytes().next().is_some_and(|b| b.is_ascii_uppercase())
        && op
            .bytes()
            .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_' || b == b'+')
}
