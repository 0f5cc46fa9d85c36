//! Per-op timing through the scheduler's eval callback, the mechanism ggml itself offers.
//!
//! Around a recorded `ggml_backend_sched_graph_compute[_async]` we install our callback. It
//! answers `ask = true` for every node, so the scheduler computes and synchronizes each node on its
//! own; the time from the ask to the `ask = false` call that follows is the node's real duration.
//! The application's own callback (remembered by our `ggml_backend_sched_set_eval_callback`) is
//! chained so that it sees exactly the calls it would have seen without us: every ask, in order,
//! and the `ask = false` call only for the nodes it asked for, whose answer (false = stop) is ours.

use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use crate::base::ggml::{EvalCallback, Helpers};
use crate::base::names::Owner;
use crate::base::say;
use crate::base::tensor::{self, read_tensor};
use crate::record::{self, OpInfo, Recorder};

type Ptr = *mut c_void;

// ---------------------------------------------------------------------------------------------
// The application's callbacks, per scheduler.

/// Schedulers whose application callback is remembered at once (slots are freed with the
/// scheduler).
const SCHEDULERS: usize = 256;

struct AppCallback {
    sched: AtomicUsize,
    callback: AtomicUsize,
    user_data: AtomicUsize,
}

#[allow(clippy::declare_interior_mutable_const)] // a template copied into each slot
const NO_CALLBACK: AppCallback = AppCallback {
    sched: AtomicUsize::new(0),
    callback: AtomicUsize::new(0),
    user_data: AtomicUsize::new(0),
};
static APP_CALLBACKS: [AppCallback; SCHEDULERS] = [NO_CALLBACK; SCHEDULERS];
/// A callback could not be remembered (every slot taken): schedulers not in the table may have
/// one we do not know, so their ops are not timed (ours would replace theirs).
static FORGOT_ONE: AtomicBool = AtomicBool::new(false);

fn slot_of(sched: Ptr) -> Option<&'static AppCallback> {
    let key = sched as usize;
    APP_CALLBACKS
        .iter()
        .find(|s| s.sched.load(Ordering::Acquire) == key)
}

/// Remembers the callback the application set on `sched` (called by our export of
/// `ggml_backend_sched_set_eval_callback`, which also forwards it).
pub fn remember_app_callback(sched: Ptr, callback: Option<EvalCallback>, user_data: Ptr) {
    let key = sched as usize;
    let slot = slot_of(sched).or_else(|| {
        APP_CALLBACKS.iter().find(|s| {
            s.sched
                .compare_exchange(0, key, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
        })
    });
    match slot {
        Some(slot) => {
            slot.callback
                .store(callback.map_or(0, |f| f as usize), Ordering::Release);
            slot.user_data.store(user_data as usize, Ordering::Release);
        }
        None => {
            if !FORGOT_ONE.swap(true, Ordering::Relaxed) {
                say(format_args!(
                    "more than {SCHEDULERS} schedulers with eval callbacks: the ops of those past \
                     the first are not timed (their callbacks are left alone)"
                ));
            }
        }
    }
}

/// `sched` is being freed: its slot, if it had one, is free again.
pub fn forget_app_callback(sched: Ptr) {
    if let Some(slot) = slot_of(sched) {
        slot.callback.store(0, Ordering::Release);
        slot.user_data.store(0, Ordering::Release);
        slot.sched.store(0, Ordering::Release);
    }
}

/// Whether we know what callback the application has on `sched` (none, or the one remembered):
/// only then may ours stand in for it during a compute.
pub fn app_callback_known(sched: Ptr) -> bool {
    !FORGOT_ONE.load(Ordering::Relaxed) || slot_of(sched).is_some()
}

fn app_callback(sched: Ptr) -> (Option<EvalCallback>, Ptr) {
    match slot_of(sched) {
        Some(slot) => {
            let callback = slot.callback.load(Ordering::Acquire);
            // SAFETY: a non-zero value was stored from an `EvalCallback`.
            let callback = (callback != 0)
                .then(|| unsafe { std::mem::transmute::<usize, EvalCallback>(callback) });
            (callback, slot.user_data.load(Ordering::Acquire) as Ptr)
        }
        None => (None, std::ptr::null_mut()),
    }
}

// ---------------------------------------------------------------------------------------------
// The driver of one graph compute.

/// Lives on the stack of one scheduler compute, as our callback's user data.
pub struct OpDriver {
    recorder: &'static Recorder,
    helpers: &'static Helpers,
    sched: Ptr,
    app: (Option<EvalCallback>, Ptr),
    /// The application's answer to the last ask.
    app_wants: bool,
}

impl OpDriver {
    pub fn new(recorder: &'static Recorder, helpers: &'static Helpers, sched: Ptr) -> OpDriver {
        OpDriver {
            recorder,
            helpers,
            sched,
            app: app_callback(sched),
            app_wants: false,
        }
    }

    /// Sets our callback on the scheduler for the next compute.
    ///
    /// # Safety
    /// `self` must stay where it is until [`OpDriver::uninstall`].
    pub unsafe fn install(&mut self) {
        let me = self as *mut OpDriver as Ptr;
        // SAFETY: the scheduler belongs to this copy; `me` outlives the compute (per the contract).
        unsafe {
            self.helpers
                .set_eval_callback(self.sched, Some(eval_callback), me)
        };
    }

    /// Gives the scheduler back the application's callback.
    pub fn uninstall(&self) {
        // SAFETY: restoring exactly what the application set (or nothing).
        unsafe {
            self.helpers
                .set_eval_callback(self.sched, self.app.0, self.app.1)
        };
    }

    fn begin(&mut self, tensor: Ptr) {
        let (h, r) = (self.helpers, self.recorder);
        // SAFETY: the scheduler passes its live node, of this copy of ggml.
        let info = unsafe { describe_node(h, r, self.sched, tensor) };
        record::op_begin(r, &info);
    }

    /// Ends the node begun last (the recording core keeps it).
    fn end(&mut self) {
        record::op_end(self.recorder);
    }
}

/// # Safety
/// `tensor` is a live node of `sched`, both of the copy `h` belongs to.
unsafe fn describe_node(h: &Helpers, r: &Recorder, sched: Ptr, tensor: Ptr) -> OpInfo {
    // SAFETY: `sched` and its live node `tensor` belong to the copy `h` belongs to.
    let backend = unsafe { h.tensor_backend(sched, tensor) };
    record::name_id(r, backend, Owner::Backend, || {
        // SAFETY: the scheduler's backend belongs to this copy.
        unsafe { h.backend_name(backend) }
    });
    // SAFETY: per the contract.
    unsafe { node_info(h, r, tensor, backend) }
}

/// What an op event says of `tensor`, computed on `backend` (null: not known).
///
/// # Safety
/// `tensor` is a live node of the copy `h` belongs to.
pub unsafe fn node_info(h: &Helpers, r: &Recorder, tensor: Ptr, backend: Ptr) -> OpInfo {
    // SAFETY: per the contract.
    let (key, op_type) = unsafe { tensor::identity(h, tensor) };
    // SAFETY: `tensor` is a live node of the copy `h` belongs to (this function's contract),
    // which is all `read_tensor` asks.
    let tensor_id = r.tensor_id(key, || unsafe { read_tensor(h, tensor, None) });
    // SAFETY: `tensor` is a live node of this copy; ggml_nbytes only reads its shape.
    let op_size = unsafe { h.nbytes(tensor) };
    OpInfo {
        tensor,
        op_type,
        op_size,
        backend,
        tensor_id,
    }
}

/// The eval callback we install.
///
/// # Safety
/// Called by ggml with a live node and the `OpDriver` we installed as user data.
unsafe extern "C-unwind" fn eval_callback(tensor: Ptr, ask: bool, user_data: Ptr) -> bool {
    // SAFETY: per the contract: the driver outlives the compute and only this thread uses it.
    let driver = unsafe { &mut *(user_data as *mut OpDriver) };
    let (app, app_data) = driver.app;
    if ask {
        // The application sees every ask, in order, as without us.
        // SAFETY: the application's callback with its own user data.
        driver.app_wants = app.is_some_and(|f| unsafe { f(tensor, true, app_data) });
        crate::base::contained(|| driver.begin(tensor));
        return true;
    }
    crate::base::contained(|| driver.end());
    match app {
        // SAFETY: the application's own callback with its own user data, called as the
        // scheduler would: only for the nodes it asked for, and its answer stops the graph.
        Some(f) if driver.app_wants => unsafe { f(tensor, false, app_data) },
        _ => true,
    }
}
