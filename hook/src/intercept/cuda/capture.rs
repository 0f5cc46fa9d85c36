//! The CUPTI capture (`GGML_VIZ_CUPTI_CAPTURE=FILE`): started by the first graph compute of a
//! CUDA backend, it writes one JSON object a line (keys sorted; each carries its kind's key) of
//! - `graph_begin` / `graph_end`: a graph compute of a CUDA backend or scheduler, on its thread,
//!   with its ggml nodes (index, tensor, op, name, `data`, bytes) at the begin;
//! - `api`: each driver launch (`cuLaunchKernel[Ex]`, with the kernel's parameters that are
//!   1 to 8 bytes wide, read through `cuFuncGetParamInfo`), graph launch, and the runtime calls
//!   ggml makes to launch, copy, set and capture, at their entry: correlation id, thread, time;
//! - `resource`: the CUDA graph nodes a stream capture creates and an instantiation clones, and
//!   the executable graphs, by CUPTI's ids;
//! - `kernel`, `memcpy`, `memset`: CUPTI's activity records, their device times on the host's
//!   `CLOCK_MONOTONIC` (our timestamp callback), with correlation, graph and graph node ids;
//!   `dropped` where CUPTI lost records; `clock` where CUPTI refused our clock (its records then
//!   keep CUPTI's own).
//!
//! Times are `CLOCK_MONOTONIC` nanoseconds; the first line gives the offset that puts them on
//! the trace's clock. It is what the attribution of kernels to ggml nodes is worked out and
//! tested on (fixtures captured on a GPU machine); it changes nothing of the run but its speed.

use std::alloc::Layout;
use std::ffi::c_void;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::sync::{Mutex, OnceLock, PoisonError};

use serde_json::{Value, json};

use super::cupti::{
    self, ACTIVITY_KINDS, API_ENTER, CALLBACKS, Cupti, activity_kind, api_call, as_function, cbid,
    domain, graph_data, kernel, launch, read, read_str, resource, transfer,
};
use crate::base::clock::monotonic_epoch_ns;
use crate::base::ggml::Helpers;
use crate::base::os::{monotonic_ns, thread_id};
use crate::base::{contained, say, tensor};

type Ptr = *mut c_void;

/// `cuFuncGetParamInfo` (CUDA 12.4 on): a kernel parameter's offset and size by its index.
type ParamInfo = unsafe extern "C" fn(Ptr, usize, *mut usize, *mut usize) -> i32;

/// Each activity buffer handed to CUPTI: 4 MiB (its sample's size), 8-byte aligned, as CUPTI
/// asks.
const BUFFER: Layout = match Layout::from_size_align(4 << 20, 8) {
    Ok(layout) => layout,
    Err(_) => panic!("a valid layout"),
};
/// `CUPTI_ACTIVITY_FLAG_FLUSH_FORCED`.
const FLUSH_FORCED: u32 = 1;
/// Kernel parameters read at most per launch.
const MAX_PARAMS: usize = 64;

/// A capture being written.
pub struct Capture {
    cupti: Cupti,
    out: Mutex<BufWriter<File>>,
}

static CAPTURE: OnceLock<Option<Capture>> = OnceLock::new();
static ENABLED: OnceLock<bool> = OnceLock::new();

/// The capture into `path`, started on the first call (one `ggml-viz:` line if it cannot be,
/// and no capture after that).
pub fn capture(path: &str) -> Option<&'static Capture> {
    let c = CAPTURE
        .get_or_init(|| {
            let home = std::env::var("CUDA_HOME").unwrap_or_else(|_| "/usr/local/cuda".into());
            let libraries = [
                "libcupti.so.13".into(),
                format!("{home}/extras/CUPTI/lib64/libcupti.so.13"),
            ];
            Capture::open(path, &libraries)
                .map_err(|e| say(format_args!("CUPTI capture: {e}; nothing captured")))
                .ok()
        })
        .as_ref()?;
    let enabled = *ENABLED.get_or_init(|| {
        c.enable()
            .map_err(|e| say(format_args!("CUPTI capture: {e}; nothing captured")))
            .is_ok()
    });
    enabled.then_some(c)
}

/// At exit: what CUPTI still holds, written, and the file flushed.
pub fn finish() {
    if let Some(Some(c)) = CAPTURE.get()
        && ENABLED.get() == Some(&true)
    {
        c.hand_back(FLUSH_FORCED);
        c.flush();
    }
}

impl Capture {
    /// Loads the first of `libraries` that loads (`libcupti.so.13` where the loader finds it,
    /// else under `$CUDA_HOME` or `/usr/local/cuda`) and creates the file.
    fn open(path: &str, libraries: &[String]) -> Result<Capture, String> {
        let mut failures = Vec::new();
        let cupti = libraries
            .iter()
            .find_map(|l| Cupti::open(l).map_err(|e| failures.push(e)).ok())
            .ok_or_else(|| failures.join("; "))?;
        let file = File::create(path).map_err(|e| format!("cannot create {path}: {e}"))?;
        let c = Capture {
            cupti,
            out: Mutex::new(BufWriter::new(file)),
        };
        c.line(&json!({
            "capture": "ggml-viz CUPTI",
            "cupti": c.cupti.path,
            "cupti_version": cupti::API_VERSION,
            "epoch_minus_monotonic_ns": monotonic_epoch_ns(0),
        }));
        Ok(c)
    }

    /// Our clock for CUPTI's records, our buffers, our callbacks, and the activity kinds on.
    fn enable(&'static self) -> Result<(), String> {
        let c = &self.cupti;
        // SAFETY: CUPTI's functions, given functions of the signatures they take, which stay
        // valid for the process's life; `self` is 'static, as the subscriber's data must be.
        unsafe {
            // Without our clock the records keep CUPTI's own (said in the capture): the rest is
            // still worth capturing.
            let clock = (c.register_timestamp)(timestamp);
            if let Err(e) = c.check("cuptiActivityRegisterTimestampCallback", clock) {
                self.line(&json!({ "clock": "CUPTI's own", "error": e }));
            }
            c.check(
                "cuptiActivityRegisterCallbacks",
                (c.register_buffers)(buffer_requested, buffer_completed),
            )?;
            let mut subscriber: cupti::Subscriber = std::ptr::null_mut();
            let me = self as *const Capture as *mut c_void;
            c.check(
                "cuptiSubscribe",
                (c.subscribe)(&mut subscriber, api_callback, me),
            )?;
            let on = CALLBACKS
                .iter()
                .try_for_each(|&(domain, name, id)| {
                    c.check(name, (c.enable_callback)(1, subscriber, domain, id))
                })
                .and_then(|()| {
                    ACTIVITY_KINDS
                        .iter()
                        .try_for_each(|&(name, kind)| c.check(name, (c.activity_enable)(kind)))
                });
            if on.is_err() {
                self.withdraw(subscriber);
            }
            on
        }
    }

    /// After a refusal part of the way through [`Capture::enable`]: what was turned on, off
    /// again, so that "nothing captured" holds (no callback writes a line after it, no activity
    /// is recorded).
    ///
    /// # Safety
    /// `subscriber` is the subscription `enable` made.
    unsafe fn withdraw(&self, subscriber: cupti::Subscriber) {
        let c = &self.cupti;
        // SAFETY: CUPTI's functions with the subscription it handed out and the kinds it took.
        unsafe {
            for &(_, kind) in ACTIVITY_KINDS {
                // Disabling a kind that was never enabled is harmless: no result to say.
                let _ = (c.activity_disable)(kind);
            }
            if let Err(e) = c.check("cuptiUnsubscribe", (c.unsubscribe)(subscriber)) {
                self.line(&json!({ "error": e }));
            }
        }
    }

    /// CUPTI's buffers handed back through `buffer_completed` (`cuptiActivityFlushAll` with
    /// `flag`: 0 for those whose records are all complete, [`FLUSH_FORCED`] for all).
    fn hand_back(&self, flag: u32) {
        // SAFETY: CUPTI's function; the buffers come back through our callback, on this thread.
        let flushed = unsafe { (self.cupti.flush_all)(flag) };
        if let Err(e) = self.cupti.check("cuptiActivityFlushAll", flushed) {
            self.line(&json!({ "error": e }));
        }
    }

    /// The lines written so far, out of our buffer into the file.
    fn flush(&self) {
        let _ = self
            .out
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .flush();
    }

    fn line(&self, v: &Value) {
        let mut out = self.out.lock().unwrap_or_else(PoisonError::into_inner);
        // A failed write loses capture lines only; the run goes on.
        if serde_json::to_writer(&mut *out, v).is_ok() {
            let _ = out.write_all(b"\n");
        }
    }

    /// A graph compute of a CUDA backend begins: the records of the work done by now handed
    /// back (so that a process that dies at exit leaves them written), then its nodes, as ggml
    /// has them now.
    ///
    /// # Safety
    /// `graph` is the graph being computed, of the copy of ggml `h` belongs to.
    pub unsafe fn graph_begins(&self, h: &Helpers, object: &str, graph: Ptr) {
        self.hand_back(0);
        // SAFETY: per the contract.
        let n = unsafe { h.n_nodes(graph) };
        let nodes: Vec<Value> = (0..n)
            .filter_map(|i| {
                // SAFETY: i is below the graph's node count.
                let node = unsafe { h.graph_node(graph, i) };
                if node.is_null() {
                    return None;
                }
                // SAFETY: a node of the graph: a live tensor of this ggml.
                let (op, name, data, bytes) = unsafe {
                    (
                        h.op_desc_cstr(node).to_string_lossy(),
                        h.tensor_name_cstr(node).to_string_lossy(),
                        tensor::data_address(h, node),
                        h.nbytes(node),
                    )
                };
                Some(json!([i, node as usize, op, name, data, bytes]))
            })
            .collect();
        self.line(&json!({
            "graph_begin": graph as usize,
            "object": object,
            "tid": thread_id(),
            "ns": monotonic_ns(),
            "nodes": nodes,
        }));
    }

    /// The graph compute has returned (its work may still be running on the device).
    pub fn graph_ends(&self, graph: Ptr) {
        self.line(
            &json!({ "graph_end": graph as usize, "tid": thread_id(), "ns": monotonic_ns() }),
        );
        self.flush();
    }

    /// An API call's entry: what it launched with.
    ///
    /// # Safety
    /// `data` is CUPTI's `CUpti_CallbackData` for the call `id` of `domain`.
    unsafe fn api_call(&self, domain_id: u32, id: u32, data: *const u8) {
        // SAFETY: per the contract.
        if unsafe { read(data, api_call::SITE) } as u32 != API_ENTER {
            return;
        }
        // SAFETY: per the contract.
        let (correlation, function, symbol, params) = unsafe {
            (
                read(data, api_call::CORRELATION_ID),
                read_str(data, api_call::FUNCTION_NAME),
                read_str(data, api_call::SYMBOL_NAME),
                read(data, api_call::PARAMS) as *const u8,
            )
        };
        let mut line = json!({
            "api": if domain_id == domain::DRIVER_API { "driver" } else { "runtime" },
            "cbid": id,
            "function": function,
            "symbol": symbol,
            "correlation": correlation,
            "tid": thread_id(),
            "ns": monotonic_ns(),
        });
        if domain_id == domain::DRIVER_API && !params.is_null() {
            // The launch's function and parameter array, and its stream where the call has one.
            let launched = match id {
                cbid::CU_LAUNCH_KERNEL | cbid::CU_LAUNCH_KERNEL_PTSZ => Some((
                    launch::FUNCTION,
                    launch::KERNEL_PARAMS,
                    Some(launch::STREAM),
                )),
                cbid::CU_LAUNCH_KERNEL_EX | cbid::CU_LAUNCH_KERNEL_EX_PTSZ => {
                    Some((launch::EX_FUNCTION, launch::EX_KERNEL_PARAMS, None))
                }
                _ => None,
            };
            if let Some((function, kernel_params, stream)) = launched {
                if let Some(stream) = stream {
                    // SAFETY: cuLaunchKernel's parameters (the contract).
                    line["stream"] = unsafe { read(params, stream) }.into();
                }
                // SAFETY: the driver's launch parameters for this call id (the contract).
                let (f, kernel_params) =
                    unsafe { (read(params, function), read(params, kernel_params)) };
                // SAFETY: the launch's own function and parameter array, alive during the call.
                line["params"] = unsafe { kernel_params_of(f as Ptr, kernel_params as *const Ptr) };
            } else if matches!(id, cbid::CU_GRAPH_LAUNCH | cbid::CU_GRAPH_LAUNCH_PTSZ) {
                // SAFETY: cuGraphLaunch's parameters (the contract).
                unsafe {
                    line["graph_exec"] = read(params, launch::GRAPH_EXEC).into();
                    line["stream"] = read(params, launch::GRAPH_STREAM).into();
                }
            }
        }
        self.line(&line);
    }

    /// A CUDA graph node created or cloned, or an executable graph created.
    ///
    /// # Safety
    /// `data` is CUPTI's `CUpti_ResourceData` for the resource callback `id`.
    unsafe fn graph_resource(&self, id: u32, data: *const u8) {
        // SAFETY: per the contract; for these ids the descriptor is a CUpti_GraphData.
        let graph = unsafe { read(data, resource::DESCRIPTOR) } as *const u8;
        if graph.is_null() {
            return;
        }
        let node_id = |node: u64| {
            let mut id = 0u64;
            // SAFETY: CUPTI's function on a node its callback named.
            let ok = node != 0 && unsafe { (self.cupti.graph_node_id)(node as Ptr, &mut id) } == 0;
            ok.then_some(id)
        };
        let graph_id = |g: u64| {
            let mut id = 0u32;
            // SAFETY: CUPTI's function on a graph its callback named.
            let ok = g != 0 && unsafe { (self.cupti.graph_id)(g as Ptr, &mut id) } == 0;
            ok.then_some(id)
        };
        // SAFETY: the descriptor is a CUpti_GraphData (above).
        let (g, original_graph, node, original, node_type, exec) = unsafe {
            (
                read(graph, graph_data::GRAPH),
                read(graph, graph_data::ORIGINAL_GRAPH),
                read(graph, graph_data::NODE),
                read(graph, graph_data::ORIGINAL_NODE),
                read(graph, graph_data::NODE_TYPE),
                read(graph, graph_data::GRAPH_EXEC),
            )
        };
        let what = match id {
            cbid::GRAPHNODE_CREATED => "graphnode_created",
            cbid::GRAPHNODE_CLONED => "graphnode_cloned",
            _ => "graphexec_created",
        };
        self.line(&json!({
            "resource": what,
            "graph_id": graph_id(g),
            "original_graph_id": graph_id(original_graph),
            "node_id": node_id(node),
            "original_node_id": node_id(original),
            "node_type": node_type,
            "graph_exec": exec,
            "tid": thread_id(),
            "ns": monotonic_ns(),
        }));
    }

    /// One activity record.
    ///
    /// # Safety
    /// `r` is a record CUPTI handed back, of the layout its kind has in [`cupti`].
    unsafe fn record(&self, r: *const u8) {
        // SAFETY: every record starts with its kind; the rest per the contract.
        let line = unsafe {
            match read(r, cupti::RECORD_KIND) as u32 {
                activity_kind::CONCURRENT_KERNEL => json!({
                    "kernel": read_str(r, kernel::NAME),
                    "start": read(r, kernel::START),
                    "end": read(r, kernel::END),
                    "device": read(r, kernel::DEVICE_ID),
                    "context": read(r, kernel::CONTEXT_ID),
                    "stream": read(r, kernel::STREAM_ID),
                    "grid_x": read(r, kernel::GRID_X),
                    "block_x": read(r, kernel::BLOCK_X),
                    "correlation": read(r, kernel::CORRELATION_ID),
                    "graph_id": read(r, kernel::GRAPH_ID),
                    "graph_node_id": read(r, kernel::GRAPH_NODE_ID),
                }),
                kind @ (activity_kind::MEMCPY | activity_kind::MEMSET) => {
                    let mut line = json!({
                        "bytes": read(r, transfer::BYTES),
                        "start": read(r, transfer::START),
                        "end": read(r, transfer::END),
                        "device": read(r, transfer::DEVICE_ID),
                        "stream": read(r, transfer::STREAM_ID),
                        "correlation": read(r, transfer::CORRELATION_ID),
                        "graph_id": read(r, transfer::GRAPH_ID),
                        "graph_node_id": read(r, transfer::GRAPH_NODE_ID),
                    });
                    if kind == activity_kind::MEMCPY {
                        line["memcpy"] = read(r, transfer::COPY_KIND).into();
                    } else {
                        line["memset"] = true.into();
                    }
                    line
                }
                other => json!({ "activity_kind": other }),
            }
        };
        self.line(&line);
    }
}

/// The launch's parameters 1 to 8 bytes wide (a pointer, an `int`, a `float`'s bits), as
/// `[offset, size, value]`, and wider ones without a value, in order.
///
/// # Safety
/// `f` is the launch's `CUfunction` and `params` its parameter array (or null).
unsafe fn kernel_params_of(f: Ptr, params: *const Ptr) -> Value {
    static PARAM_INFO: OnceLock<Option<ParamInfo>> = OnceLock::new();
    let info = PARAM_INFO.get_or_init(|| {
        // The driver calling us is loaded: cudart opens it local to itself, so it is looked up
        // by its own handle (RTLD_NOLOAD: never loaded by us), else in the global scope.
        // SAFETY: dlopen with a valid name and RTLD_NOLOAD; dlsym on its handle or the default
        // scope with a valid name.
        let f = unsafe {
            let driver = libc::dlopen(c"libcuda.so.1".as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD);
            let scope = if driver.is_null() {
                libc::RTLD_DEFAULT
            } else {
                driver
            };
            libc::dlsym(scope, c"cuFuncGetParamInfo".as_ptr())
        };
        // SAFETY: the driver's function of that name, whose C signature is ParamInfo (cuda.h).
        (!f.is_null()).then(|| unsafe { as_function::<ParamInfo>(f) })
    });
    let (Some(info), false) = (info, params.is_null()) else {
        return Value::Null;
    };
    let mut out = Vec::new();
    for i in 0..MAX_PARAMS {
        let (mut offset, mut size) = (0usize, 0usize);
        // SAFETY: the driver's function on the launch's own kernel; it fails past the last.
        if unsafe { info(f, i, &mut offset, &mut size) } != 0 {
            break;
        }
        // SAFETY: the launch's i-th parameter exists (the driver says so) and points to a
        // value `size` bytes wide.
        let value = unsafe {
            let p = *params.add(i) as *const u8;
            match size {
                1 => Some(u64::from(p.read())),
                2 => Some(u64::from((p as *const u16).read_unaligned())),
                4 => Some(u64::from((p as *const u32).read_unaligned())),
                8 => Some((p as *const u64).read_unaligned()),
                _ => None,
            }
        };
        out.push(json!([offset, size, value]));
    }
    Value::Array(out)
}

/// CUPTI's clock: ours.
unsafe extern "C" fn timestamp() -> u64 {
    monotonic_ns()
}

/// CUPTI's callback for the API calls and resources enabled.
unsafe extern "C" fn api_callback(me: *mut c_void, domain_id: u32, id: u32, data: *const c_void) {
    contained(|| {
        // SAFETY: `me` is the 'static capture that subscribed (enable); CUPTI passes the data
        // of the domain and id it names.
        let me = unsafe { &*(me as *const Capture) };
        if data.is_null() {
            return;
        }
        match domain_id {
            // SAFETY: a resource callback's data (above).
            domain::RESOURCE => unsafe { me.graph_resource(id, data.cast()) },
            // SAFETY: an API callback's data (above).
            _ => unsafe { me.api_call(domain_id, id, data.cast()) },
        }
    });
}

/// CUPTI asks for a buffer to fill.
unsafe extern "C" fn buffer_requested(buffer: *mut *mut u8, size: *mut usize, max: *mut usize) {
    // SAFETY: a non-zero size; CUPTI's out pointers are valid.
    unsafe {
        let b = std::alloc::alloc(BUFFER);
        *buffer = b;
        *size = if b.is_null() { 0 } else { BUFFER.size() };
        *max = 0;
    }
}

/// CUPTI hands a filled buffer back: its records written, the buffer freed.
unsafe extern "C" fn buffer_completed(
    context: *mut c_void,
    stream: u32,
    buffer: *mut u8,
    _size: usize,
    valid: usize,
) {
    if buffer.is_null() {
        return;
    }
    contained(|| {
        let Some(Some(c)) = CAPTURE.get() else { return };
        let mut record: *mut u8 = std::ptr::null_mut();
        // SAFETY: CUPTI's function over the buffer it filled; each record it returns is valid
        // until the buffer is freed below.
        while unsafe { (c.cupti.next_record)(buffer, valid, &mut record) } == 0 {
            // SAFETY: as above.
            unsafe { c.record(record) };
        }
        let mut dropped = 0usize;
        // SAFETY: CUPTI's function with the context and stream it named.
        let ok = unsafe { (c.cupti.dropped_records)(context, stream, &mut dropped) } == 0;
        if ok && dropped > 0 {
            c.line(&json!({ "dropped": dropped, "stream": stream }));
        }
    });
    // SAFETY: every buffer CUPTI has came from buffer_requested with this layout.
    unsafe { std::alloc::dealloc(buffer, BUFFER) };
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::intercept::cuda::cupti::tests::wheels;

    #[test]
    fn without_a_driver_the_capture_says_which_call_failed() {
        let Some(wheels) = wheels() else { return };
        let file =
            std::env::temp_dir().join(format!("ggml-viz-capture-{}.jsonl", std::process::id()));
        let lib = wheels
            .join("lib/libcupti.so.13")
            .to_string_lossy()
            .into_owned();
        let libraries = ["/nonexistent/libcupti.so.13".to_string(), lib.clone()];
        let c: &'static Capture = Box::leak(Box::new(
            Capture::open(file.to_str().unwrap(), &libraries).unwrap(),
        ));
        // No GPU, no driver here: CUPTI refuses the subscription, and the error names the call
        // and CUPTI's result.
        let err = c.enable().unwrap_err();
        assert!(err.contains(": CUPTI_ERROR_"), "{err}");
        c.out.lock().unwrap().flush().unwrap();
        let text = std::fs::read_to_string(&file).unwrap();
        let header: Value = serde_json::from_str(text.lines().next().unwrap()).unwrap();
        assert_eq!(header["cupti"], lib.as_str());
        assert_eq!(header["cupti_version"], 130_001);
        let none = Capture::open(file.to_str().unwrap(), &libraries[..1])
            .err()
            .unwrap();
        assert!(
            none.starts_with("cannot load /nonexistent/libcupti.so.13"),
            "{none}"
        );
        std::fs::remove_file(&file).unwrap();
    }
}
