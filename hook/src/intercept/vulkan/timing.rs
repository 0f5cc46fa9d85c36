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
use std::ffi::{CStr, c_char, c_void};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock, PoisonError};

use ash::vk::{self, Handle};

use super::{cast, device_of, forget_device};
use crate::base::{contained, say_once};
use crate::intercept::route::first_helpers;
use crate::record::{self, DeviceLane, DeviceNode};

/// Timestamp query pairs per device: nodes recorded and not yet read at once.
const PAIRS: usize = 4096;

const CALIBRATED_TIMESTAMPS: &CStr = c"VK_EXT_calibrated_timestamps";

/// What timing a device needs, worked out before it is created: the extensions it is created
/// with (the application's and the calibrated timestamps'), the timestamp period and valid bits.
pub struct Plan {
    extensions: Vec<*const c_char>,
    period_ns: f64,
    valid_bits: u32,
}

impl Plan {
    /// The plan for a device of `physical`, or none where ggml labels nothing
    /// (`GGML_VK_DEBUG_MARKERS` unset) or the device cannot time (said once).
    ///
    /// # Safety
    /// Live handles; `next` is the next layer's instance lookup; `info` is the application's.
    pub unsafe fn for_device(
        instance: vk::Instance,
        physical: vk::PhysicalDevice,
        next: vk::PFN_vkGetInstanceProcAddr,
        info: &vk::DeviceCreateInfo<'_>,
    ) -> Option<Plan> {
        std::env::var_os("GGML_VK_DEBUG_MARKERS")?;
        static SAID: AtomicBool = AtomicBool::new(false);
        let refuse = |why: &str| {
            say_once(
                &SAID,
                format_args!(
                    "a Vulkan device cannot time ggml's nodes ({why}): they are not recorded"
                ),
            );
            None
        };
        // SAFETY: lookups of instance functions, of their types.
        let (enumerate, properties, families) = unsafe {
            (
                cast::<vk::PFN_vkEnumerateDeviceExtensionProperties>(next(
                    instance,
                    c"vkEnumerateDeviceExtensionProperties".as_ptr(),
                ))?,
                cast::<vk::PFN_vkGetPhysicalDeviceProperties>(next(
                    instance,
                    c"vkGetPhysicalDeviceProperties".as_ptr(),
                ))?,
                cast::<vk::PFN_vkGetPhysicalDeviceQueueFamilyProperties>(next(
                    instance,
                    c"vkGetPhysicalDeviceQueueFamilyProperties".as_ptr(),
                ))?,
            )
        };
        let mut count = 0u32;
        // SAFETY: the two-call idiom, with a buffer of the count asked for.
        let offered = unsafe {
            let _ = enumerate(physical, std::ptr::null(), &mut count, std::ptr::null_mut());
            let mut all = vec![vk::ExtensionProperties::default(); count as usize];
            // INCOMPLETE leaves the ones written: `count` says how many.
            let _ = enumerate(physical, std::ptr::null(), &mut count, all.as_mut_ptr());
            all.truncate(count as usize);
            all
        };
        let has = |name: &CStr| {
            offered
                .iter()
                .any(|e| e.extension_name_as_c_str() == Ok(name))
        };
        if !has(CALIBRATED_TIMESTAMPS) {
            return refuse("no VK_EXT_calibrated_timestamps");
        }
        let mut props = vk::PhysicalDeviceProperties::default();
        // SAFETY: a writable struct of the type asked for.
        unsafe { properties(physical, &mut props) };
        let period_ns = f64::from(props.limits.timestamp_period);
        if period_ns <= 0.0 {
            return refuse("no timestamps");
        }
        // SAFETY: the two-call idiom, with a buffer of the count asked for.
        let queue_families = unsafe {
            families(physical, &mut count, std::ptr::null_mut());
            let mut all = vec![vk::QueueFamilyProperties::default(); count as usize];
            families(physical, &mut count, all.as_mut_ptr());
            all.truncate(count as usize);
            all
        };
        // SAFETY: the application's create info holds this many queue create infos.
        let queues = unsafe {
            std::slice::from_raw_parts(
                info.p_queue_create_infos,
                info.queue_create_info_count as usize,
            )
        };
        let valid_bits = queues
            .iter()
            .filter_map(|q| queue_families.get(q.queue_family_index as usize))
            .map(|f| f.timestamp_valid_bits)
            .min()
            .unwrap_or(0);
        if valid_bits == 0 {
            return refuse("its queues keep no timestamps");
        }
        // SAFETY: the application's create info holds this many extension names.
        let mut extensions = unsafe {
            std::slice::from_raw_parts(
                info.pp_enabled_extension_names,
                info.enabled_extension_count as usize,
            )
        }
        .to_vec();
        // SAFETY: the application's extension names are NUL-terminated strings.
        if !extensions
            .iter()
            .any(|&e| unsafe { CStr::from_ptr(e) } == CALIBRATED_TIMESTAMPS)
        {
            extensions.push(CALIBRATED_TIMESTAMPS.as_ptr());
        }
        Some(Plan {
            extensions,
            period_ns,
            valid_bits,
        })
    }

    /// The application's create info, with this plan's extensions.
    pub fn create_info<'a>(&'a self, info: &vk::DeviceCreateInfo<'a>) -> vk::DeviceCreateInfo<'a> {
        let mut copy = *info;
        copy.enabled_extension_count = self.extensions.len() as u32;
        copy.pp_enabled_extension_names = self.extensions.as_ptr();
        copy
    }
}

/// The next layer's device functions this layer calls.
struct Next {
    lookup: vk::PFN_vkGetDeviceProcAddr,
    destroy_device: vk::PFN_vkDestroyDevice,
    begin_command_buffer: vk::PFN_vkBeginCommandBuffer,
    queue_submit: vk::PFN_vkQueueSubmit,
    get_fence_status: vk::PFN_vkGetFenceStatus,
    wait_for_fences: vk::PFN_vkWaitForFences,
    queue_wait_idle: vk::PFN_vkQueueWaitIdle,
    device_wait_idle: vk::PFN_vkDeviceWaitIdle,
    begin_label: Option<vk::PFN_vkCmdBeginDebugUtilsLabelEXT>,
    end_label: Option<vk::PFN_vkCmdEndDebugUtilsLabelEXT>,
}

/// The timing side of a device: its pool, lane and calibration, and what is in flight.
struct Timing {
    backend: String,
    lane: DeviceLane,
    period_ns: f64,
    mask: u64,
    pool: vk::QueryPool,
    reset: vk::PFN_vkCmdResetQueryPool,
    write: vk::PFN_vkCmdWriteTimestamp,
    results: vk::PFN_vkGetQueryPoolResults,
    calibrate: vk::PFN_vkGetCalibratedTimestampsKHR,
    destroy_pool: vk::PFN_vkDestroyQueryPool,
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
    key: usize,
    handle: vk::Device,
    next: Next,
    timing: Option<Timing>,
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
struct Batch {
    queue: u64,
    fence: u64,
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
    fn label_begins(&self, cb: vk::CommandBuffer, label: &str) {
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
    fn label_ends(&self, cb: vk::CommandBuffer) {
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
    fn buffer_begins(&self, cb: vk::CommandBuffer) {
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
    unsafe fn submitted(
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
    fn complete(&self, device: vk::Device, done: impl Fn(&VecDeque<Batch>) -> Vec<usize>) {
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
    fn hand_over_held(&self, device: vk::Device) {
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

/// `count` items at `items` (none when the pointer is null).
///
/// # Safety
/// A non-null `items` points to `count` valid items.
unsafe fn slice<'a, T>(items: *const T, count: u32) -> &'a [T] {
    if items.is_null() || count == 0 {
        return &[];
    }
    // SAFETY: per the contract.
    unsafe { std::slice::from_raw_parts(items, count as usize) }
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

/// At exit: every device's node held back is recorded.
pub fn hand_over_held() {
    let devices = super::DEVICES
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone();
    for d in devices {
        if let Some(t) = &d.timing {
            t.hand_over_held(d.handle);
        }
    }
}

/// The device-level functions this layer answers for, by name.
pub fn intercepted(name: &CStr) -> vk::PFN_vkVoidFunction {
    let f: *const () = match name.to_bytes() {
        b"vkDestroyDevice" => destroy_device as *const (),
        b"vkBeginCommandBuffer" => begin_command_buffer as *const (),
        b"vkCmdBeginDebugUtilsLabelEXT" => cmd_begin_label as *const (),
        b"vkCmdEndDebugUtilsLabelEXT" => cmd_end_label as *const (),
        b"vkQueueSubmit" => queue_submit as *const (),
        b"vkGetFenceStatus" => get_fence_status as *const (),
        b"vkWaitForFences" => wait_for_fences as *const (),
        b"vkQueueWaitIdle" => queue_wait_idle as *const (),
        b"vkDeviceWaitIdle" => device_wait_idle as *const (),
        _ => return None,
    };
    // SAFETY: a function pointer, cast to the loader's generic function pointer type.
    Some(unsafe { std::mem::transmute::<*const (), unsafe extern "system" fn()>(f) })
}

/// The device of `handle`; the layer was never told of it when none (then the call cannot go on:
/// the loader only hands our functions out for devices created through the layer).
fn known(handle: u64) -> std::sync::Arc<Device> {
    device_of(handle).expect("a device created through this layer")
}

unsafe extern "system" fn destroy_device(
    device: vk::Device,
    allocator: *const vk::AllocationCallbacks<'_>,
) {
    let d = known(device.as_raw());
    if let Some(t) = &d.timing {
        // SAFETY: our pool, on the device it was made on.
        unsafe { (t.destroy_pool)(device, t.pool, std::ptr::null()) };
    }
    forget_device(d.key);
    // SAFETY: the application's arguments, passed on.
    unsafe { (d.next.destroy_device)(device, allocator) }
}

unsafe extern "system" fn begin_command_buffer(
    cb: vk::CommandBuffer,
    info: *const vk::CommandBufferBeginInfo<'_>,
) -> vk::Result {
    let d = known(cb.as_raw());
    if let Some(t) = &d.timing {
        contained(|| t.buffer_begins(cb));
    }
    // SAFETY: the application's arguments, passed on.
    unsafe { (d.next.begin_command_buffer)(cb, info) }
}

unsafe extern "system" fn cmd_begin_label(
    cb: vk::CommandBuffer,
    label: *const vk::DebugUtilsLabelEXT<'_>,
) {
    let d = known(cb.as_raw());
    if let Some(begin) = d.next.begin_label {
        // SAFETY: the application's arguments, passed on.
        unsafe { begin(cb, label) };
    }
    if let Some(t) = &d.timing {
        contained(|| {
            // SAFETY: a valid label whose name is a NUL-terminated string (or null).
            let name = unsafe { label.as_ref() }
                .filter(|l| !l.p_label_name.is_null())
                .map(|l| unsafe { CStr::from_ptr(l.p_label_name) }.to_string_lossy());
            t.label_begins(cb, name.as_deref().unwrap_or_default());
        });
    }
}

unsafe extern "system" fn cmd_end_label(cb: vk::CommandBuffer) {
    let d = known(cb.as_raw());
    if let Some(t) = &d.timing {
        contained(|| t.label_ends(cb));
    }
    if let Some(end) = d.next.end_label {
        // SAFETY: the application's arguments, passed on.
        unsafe { end(cb) };
    }
}

unsafe extern "system" fn queue_submit(
    queue: vk::Queue,
    count: u32,
    submits: *const vk::SubmitInfo<'_>,
    fence: vk::Fence,
) -> vk::Result {
    let d = known(queue.as_raw());
    // SAFETY: the application's arguments, passed on.
    let result = unsafe { (d.next.queue_submit)(queue, count, submits, fence) };
    if result == vk::Result::SUCCESS
        && let Some(t) = &d.timing
    {
        // SAFETY: the application's valid submit infos.
        contained(|| unsafe { t.submitted(queue, count, submits, fence) });
    }
    result
}

/// Everything on `queue` submitted up to the last batch with `fence`.
fn up_to_fence(fence: u64) -> impl Fn(&VecDeque<Batch>) -> Vec<usize> {
    move |pending| {
        let Some(at) = pending.iter().rposition(|b| b.fence == fence) else {
            return Vec::new();
        };
        let queue = pending[at].queue;
        (0..=at).filter(|&i| pending[i].queue == queue).collect()
    }
}

unsafe extern "system" fn get_fence_status(device: vk::Device, fence: vk::Fence) -> vk::Result {
    let d = known(device.as_raw());
    // SAFETY: the application's arguments, passed on.
    let result = unsafe { (d.next.get_fence_status)(device, fence) };
    if result == vk::Result::SUCCESS
        && let Some(t) = &d.timing
    {
        contained(|| t.complete(device, up_to_fence(fence.as_raw())));
    }
    result
}

unsafe extern "system" fn wait_for_fences(
    device: vk::Device,
    count: u32,
    fences: *const vk::Fence,
    wait_all: vk::Bool32,
    timeout: u64,
) -> vk::Result {
    let d = known(device.as_raw());
    // SAFETY: the application's arguments, passed on.
    let result = unsafe { (d.next.wait_for_fences)(device, count, fences, wait_all, timeout) };
    if result == vk::Result::SUCCESS
        && (wait_all == vk::TRUE || count == 1)
        && let Some(t) = &d.timing
    {
        contained(|| {
            // SAFETY: the application's fences, `count` of them.
            for fence in unsafe { slice(fences, count) } {
                t.complete(device, up_to_fence(fence.as_raw()));
            }
        });
    }
    result
}

unsafe extern "system" fn queue_wait_idle(queue: vk::Queue) -> vk::Result {
    let d = known(queue.as_raw());
    // SAFETY: the application's arguments, passed on.
    let result = unsafe { (d.next.queue_wait_idle)(queue) };
    if result == vk::Result::SUCCESS
        && let Some(t) = &d.timing
    {
        let raw = queue.as_raw();
        contained(|| {
            t.complete(d.handle, |pending| {
                (0..pending.len())
                    .filter(|&i| pending[i].queue == raw)
                    .collect()
            })
        });
    }
    result
}

unsafe extern "system" fn device_wait_idle(device: vk::Device) -> vk::Result {
    let d = known(device.as_raw());
    // SAFETY: the application's arguments, passed on.
    let result = unsafe { (d.next.device_wait_idle)(device) };
    if result == vk::Result::SUCCESS
        && let Some(t) = &d.timing
    {
        contained(|| t.complete(device, |pending| (0..pending.len()).collect()));
    }
    result
}
