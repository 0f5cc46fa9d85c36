//! Nodes a GPU computed, timed by the device itself: a front end reads the device's timestamps
//! once the work is done (for Vulkan, when the application's fence says so) and hands each
//! node here with its begin and end already on `CLOCK_MONOTONIC`. Each device queue is a lane
//! of its own (a thread id no OS thread has, named by a THREAD_BEGIN record); a node is one ring
//! slot, written as the node's OP_COMPUTE_BEGIN and OP_COMPUTE_END (the writer converts its
//! monotonic times, known by their kind, without the thread's tick conversion).
//!
//! The event goes into the ring of the thread that read the timestamps, stamped with the
//! device's time: the writer keeps each lane's own order, which the device gave.

use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

use ggml_viz_format::ext::TensorInfoRef;

use super::events::store_as_given;
use super::raw::{DeviceLaneNamed, DeviceOp, OpInfo};
use super::recorder::{OpMode, Recorder};
use super::session::active;
use crate::base::names::Owner;
use crate::base::tensor::{TensorRecord, tensor_key};

/// Device lanes' thread ids start here (above any Linux thread id, which stays below 2^22).
const FIRST_LANE: u32 = 0xD000_0000;

/// Whether device nodes are wanted now: a trace is being recorded and its nodes are timed, not
/// by the scheduler's eval callback (which computes and waits for each node on its own).
pub fn device_nodes_wanted() -> bool {
    active().is_some_and(|r| {
        r.op_mode() != OpMode::Off && r.config.op_timing != ggml_viz_config::OpTiming::Sched
    })
}

/// A device queue's lane: its thread id, and whether its THREAD_BEGIN is written.
pub struct DeviceLane {
    tid: u32,
    named: AtomicBool,
    name: String,
}

impl DeviceLane {
    /// A new lane, named `name` (`Vulkan0 queue`).
    pub fn new(name: String) -> DeviceLane {
        static NEXT: AtomicU32 = AtomicU32::new(FIRST_LANE);
        DeviceLane {
            tid: NEXT.fetch_add(1, Ordering::Relaxed),
            named: AtomicBool::new(false),
            name,
        }
    }
}

/// One node as the device timed it.
pub struct DeviceNode<'a> {
    /// The node's (first) tensor name, as the backend labelled it.
    pub name: &'a str,
    /// Its op as labelled: `MUL_MAT`, or a fused group's `RMS_NORM+MUL`.
    pub op: &'a str,
    /// The number of its (first) op, where the ggml that runs could say.
    pub op_type: Option<u32>,
    /// The kernels it ran, `, `-separated (empty: none known).
    pub kernels: &'a str,
    pub begin_ns: u64,
    pub end_ns: u64,
}

/// Records `node`, computed on `lane` of the device `device` (any pointer-sized key unique to
/// it; `backend` names it: `Vulkan0`), when a trace is being recorded.
pub fn device_node(lane: &DeviceLane, device: usize, backend: &str, node: &DeviceNode<'_>) {
    let Some(r) = active() else { return };
    if !lane.named.swap(true, Ordering::Relaxed) {
        let name_id = r
            .names
            .intern(lane.tid as usize, Owner::Thread, || lane.name.clone());
        let begin = DeviceLaneNamed {
            lane: lane.tid,
            name_id,
        }
        .event();
        store_as_given(r, begin, node.begin_ns, 1);
    }
    // Named as a backend: the writer's backend names then name the device the op events carry.
    r.names
        .intern(device, Owner::Backend, || backend.to_string());
    let tensor_id = tensor_of(r, node);
    // One slot for both records: the end, with the duration (as a whole share).
    let took = node
        .end_ns
        .saturating_sub(node.begin_ns)
        .min(u64::from(u32::MAX));
    let end = DeviceOp {
        op: OpInfo {
            tensor: tensor_key(&[node.name.as_bytes()], 0, 0, [0; 4]) as *mut c_void,
            op_type: node.op_type.unwrap_or(u32::MAX),
            op_size: 0,
            backend: device as *mut c_void,
            tensor_id,
        },
        lane: lane.tid,
        took: took as u32,
    }
    .event();
    store_as_given(r, end, node.begin_ns + took, 2);
}

/// The tensor info of a device node, from its label: its name and op, and the kernels it ran (no
/// type or shape).
fn tensor_of(r: &Recorder, node: &DeviceNode<'_>) -> u16 {
    let key = tensor_key(
        &[
            node.name.as_bytes(),
            node.op.as_bytes(),
            node.kernels.as_bytes(),
        ],
        node.op_type.unwrap_or(u32::MAX),
        u32::MAX,
        [0; 4],
    );
    r.tensor_id(key, || {
        let op_name = node.op.split('+').next().unwrap_or(node.op);
        let info = TensorInfoRef {
            name: node.name,
            op: node.op,
            op_type: node.op_type,
            op_name: node.op_type.map(|_| op_name),
            type_name: "",
            ne: [0; 4],
            flops: None,
            src_bytes: None,
            kernels: (!node.kernels.is_empty()).then_some(node.kernels),
        };
        TensorRecord {
            json: info.to_json(),
            name: node.name.into(),
            op_type: node.op_type,
            op_name: op_name.into(),
            group: 0,
        }
    })
}
