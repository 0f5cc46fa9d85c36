//! The device-level calls this layer answers for: each forwards to the next layer and tells
//! the device's timing what happened (a command buffer begun, a label, a submit, a fence or a
//! queue seen done).

use std::collections::VecDeque;
use std::ffi::CStr;
use std::sync::{Arc, PoisonError};

use ash::vk::{self, Handle};

use super::timing::{Batch, Device};
use super::{device_of, forget_device, slice};
use crate::base::contained;

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
fn known(handle: u64) -> Arc<Device> {
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
