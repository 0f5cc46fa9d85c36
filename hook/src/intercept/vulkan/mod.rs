//! A Vulkan layer, `VK_LAYER_GGMLVIZ_timing`: the same library, named in a layer manifest that
//! `ggml-viz record` writes (`VK_ADD_LAYER_PATH`, `VK_INSTANCE_LAYERS`). ggml-vulkan calls every
//! `vkCmd*` through the loader (its dispatcher knows only the instance), and a layer is Vulkan's
//! own way into that path: the library exports only the loader's negotiation entry, never an
//! unprefixed Vulkan name, which would interpose ggml's own direct calls.
//!
//! This module is the layer's plumbing (loader interface version 2): negotiation, the instance
//! and device chains, the procedure-address lookups. [`plan`] works out what a device needs for
//! timing before it is created; [`calls`] are the device-level calls the layer answers for;
//! [`timing`] does the work: it times the nodes ggml-vulkan labels (`GGML_VK_DEBUG_MARKERS`)
//! with timestamps of its own.
//!
//! Everything else passes through untouched; in a process without ggml the layer only forwards.

mod calls;
mod plan;
mod timing;

use std::ffi::{CStr, c_char, c_void};
use std::sync::{Arc, Mutex, PoisonError};

use ash::vk::{self, Handle};

use crate::base::contained;
pub use calls::hand_over_held;
use timing::Device;

/// `VkNegotiateLayerInterface` (vk_layer.h).
#[repr(C)]
pub struct NegotiateLayerInterface {
    s_type: u32,
    p_next: *mut c_void,
    loader_layer_interface_version: u32,
    pfn_get_instance_proc_addr: Option<vk::PFN_vkGetInstanceProcAddr>,
    pfn_get_device_proc_addr: Option<vk::PFN_vkGetDeviceProcAddr>,
    pfn_get_physical_device_proc_addr: *const c_void,
}

/// `VkLayerInstanceCreateInfo` and `VkLayerDeviceCreateInfo` (vk_layer.h), as far as the link
/// to the next layer: `u` is the link when `function` is `VK_LAYER_LINK_INFO` (0).
#[repr(C)]
struct LayerCreateInfo<Link> {
    s_type: vk::StructureType,
    p_next: *const c_void,
    function: u32,
    u: *mut Link,
}

/// `VkLayerInstanceLink`.
#[repr(C)]
struct InstanceLink {
    p_next: *mut InstanceLink,
    next_get_instance_proc_addr: vk::PFN_vkGetInstanceProcAddr,
    next_get_physical_device_proc_addr: *const c_void,
}

/// `VkLayerDeviceLink`.
#[repr(C)]
struct DeviceLink {
    p_next: *mut DeviceLink,
    next_get_instance_proc_addr: vk::PFN_vkGetInstanceProcAddr,
    next_get_device_proc_addr: vk::PFN_vkGetDeviceProcAddr,
}

/// `VK_STRUCTURE_TYPE_LOADER_INSTANCE_CREATE_INFO` and `..._DEVICE_CREATE_INFO`.
const LOADER_INSTANCE_CREATE_INFO: i32 = 47;
const LOADER_DEVICE_CREATE_INFO: i32 = 48;
const LAYER_LINK_INFO: u32 = 0;

/// The loader's first call into the layer: agrees on interface version 2 and hands over our
/// lookups.
///
/// # Safety
/// The loader's contract: `version` points to a valid, writable struct.
#[unsafe(no_mangle)]
pub unsafe extern "system" fn vkNegotiateLoaderLayerInterfaceVersion(
    version: *mut NegotiateLayerInterface,
) -> vk::Result {
    // SAFETY: the loader passes a valid struct (the contract); a null one is refused.
    let Some(v) = (unsafe { version.as_mut() }) else {
        return vk::Result::ERROR_INITIALIZATION_FAILED;
    };
    if v.loader_layer_interface_version < 2 {
        return vk::Result::ERROR_INITIALIZATION_FAILED;
    }
    v.loader_layer_interface_version = 2;
    v.pfn_get_instance_proc_addr = Some(get_instance_proc_addr);
    v.pfn_get_device_proc_addr = Some(get_device_proc_addr);
    v.pfn_get_physical_device_proc_addr = std::ptr::null();
    vk::Result::SUCCESS
}

/// An instance this layer sits in, with the next layer's lookup.
struct Instance {
    key: usize,
    handle: vk::Instance,
    next: vk::PFN_vkGetInstanceProcAddr,
}

static INSTANCES: Mutex<Vec<Instance>> = Mutex::new(Vec::new());
static DEVICES: Mutex<Vec<Arc<Device>>> = Mutex::new(Vec::new());

/// The loader's dispatch pointer, the first word of every dispatchable handle: the same for a
/// device and its queues and command buffers, and for an instance and its physical devices.
///
/// # Safety
/// `handle` is a live dispatchable handle.
unsafe fn dispatch_key(handle: u64) -> usize {
    // SAFETY: per the contract, the handle points to the loader's object, whose first word is
    // its dispatch table pointer.
    unsafe { *(handle as usize as *const usize) }
}

/// The next layer's lookup of the instance whose key `key` is (the only one, where the key
/// is not known: a physical device's key is its instance's).
fn instance_next(key: usize) -> Option<(vk::Instance, vk::PFN_vkGetInstanceProcAddr)> {
    let instances = INSTANCES.lock().unwrap_or_else(PoisonError::into_inner);
    instances
        .iter()
        .find(|i| i.key == key)
        .or(instances.last())
        .map(|i| (i.handle, i.next))
}

/// The device whose handles have dispatch key `key` (every device this layer sits in, timed or
/// not: the next layer's lookup is kept with it).
fn device(key: usize) -> Option<Arc<Device>> {
    let devices = DEVICES.lock().unwrap_or_else(PoisonError::into_inner);
    devices.iter().find(|d| d.key() == key).cloned()
}

/// The device of dispatchable handle `handle` (a device, queue or command buffer).
fn device_of(handle: u64) -> Option<Arc<Device>> {
    // SAFETY: the application passed a live dispatchable handle to a Vulkan function.
    device(unsafe { dispatch_key(handle) })
}

/// A function pointer of type `F` from a lookup's answer.
///
/// # Safety
/// `F` is the function pointer type of the function looked up.
unsafe fn cast<F: Copy>(f: vk::PFN_vkVoidFunction) -> Option<F> {
    // SAFETY: per the contract; function pointers are all of one size.
    f.map(|f| unsafe { std::mem::transmute_copy::<unsafe extern "system" fn(), F>(&f) })
}

/// The layer-link entry of a create info's chain whose type is `s_type`, if there is one.
///
/// # Safety
/// `next` is the `pNext` of a valid create info.
unsafe fn link_info<Link>(
    mut next: *const c_void,
    s_type: i32,
) -> Option<*mut LayerCreateInfo<Link>> {
    while !next.is_null() {
        let info = next as *mut LayerCreateInfo<Link>;
        // SAFETY: every struct in a pNext chain starts with sType and pNext.
        let (ty, function, p_next) = unsafe { ((*info).s_type, (*info).function, (*info).p_next) };
        if ty == vk::StructureType::from_raw(s_type) && function == LAYER_LINK_INFO {
            return Some(info);
        }
        next = p_next;
    }
    None
}

unsafe extern "system" fn create_instance(
    info: *const vk::InstanceCreateInfo<'_>,
    allocator: *const vk::AllocationCallbacks<'_>,
    instance: *mut vk::Instance,
) -> vk::Result {
    // SAFETY: the loader's chain info is in the create info it passes (the layer contract).
    let Some(link) =
        (unsafe { link_info::<InstanceLink>((*info).p_next, LOADER_INSTANCE_CREATE_INFO) })
    else {
        return vk::Result::ERROR_INITIALIZATION_FAILED;
    };
    // SAFETY: the link info is valid; the next layer's entry is advanced for it, as the layer
    // contract asks.
    let next = unsafe {
        let layer = (*link).u;
        let next = (*layer).next_get_instance_proc_addr;
        (*link).u = (*layer).p_next;
        next
    };
    // SAFETY: a lookup of the global vkCreateInstance, of its type.
    let Some(create) = (unsafe {
        cast::<vk::PFN_vkCreateInstance>(next(vk::Instance::null(), c"vkCreateInstance".as_ptr()))
    }) else {
        return vk::Result::ERROR_INITIALIZATION_FAILED;
    };
    // SAFETY: the application's arguments, passed on.
    let result = unsafe { create(info, allocator, instance) };
    if result == vk::Result::SUCCESS {
        // SAFETY: the instance was just created.
        let handle = unsafe { *instance };
        contained(|| {
            // SAFETY: a live instance handle.
            let key = unsafe { dispatch_key(handle.as_raw()) };
            let mut instances = INSTANCES.lock().unwrap_or_else(PoisonError::into_inner);
            instances.push(Instance { key, handle, next });
        });
    }
    result
}

unsafe extern "system" fn destroy_instance(
    instance: vk::Instance,
    allocator: *const vk::AllocationCallbacks<'_>,
) {
    // SAFETY: a live instance handle (the application's contract).
    let key = unsafe { dispatch_key(instance.as_raw()) };
    let Some((_, next)) = instance_next(key) else {
        return;
    };
    // SAFETY: the next layer's vkDestroyInstance, of its type.
    if let Some(destroy) =
        unsafe { cast::<vk::PFN_vkDestroyInstance>(next(instance, c"vkDestroyInstance".as_ptr())) }
    {
        // SAFETY: the application's arguments, passed on.
        unsafe { destroy(instance, allocator) };
    }
    INSTANCES
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .retain(|i| i.key != key);
}

unsafe extern "system" fn create_device(
    physical: vk::PhysicalDevice,
    info: *const vk::DeviceCreateInfo<'_>,
    allocator: *const vk::AllocationCallbacks<'_>,
    device: *mut vk::Device,
) -> vk::Result {
    // SAFETY: as in `create_instance`.
    let Some(link) =
        (unsafe { link_info::<DeviceLink>((*info).p_next, LOADER_DEVICE_CREATE_INFO) })
    else {
        return vk::Result::ERROR_INITIALIZATION_FAILED;
    };
    // SAFETY: as in `create_instance`.
    let (next_instance, next_device) = unsafe {
        let layer = (*link).u;
        let next = (
            (*layer).next_get_instance_proc_addr,
            (*layer).next_get_device_proc_addr,
        );
        (*link).u = (*layer).p_next;
        next
    };
    // SAFETY: a live physical device handle (the application's contract).
    let instance = instance_next(unsafe { dispatch_key(physical.as_raw()) }).map(|(i, _)| i);
    let instance = instance.unwrap_or_else(vk::Instance::null);
    // SAFETY: the next layer's vkCreateDevice, of its type.
    let Some(create) = (unsafe {
        cast::<vk::PFN_vkCreateDevice>(next_instance(instance, c"vkCreateDevice".as_ptr()))
    }) else {
        return vk::Result::ERROR_INITIALIZATION_FAILED;
    };
    // What timing needs of the device, asked for in a copy of the create info.
    let plan = contained(|| {
        // SAFETY: live handles and the application's valid create info.
        unsafe { plan::Plan::for_device(instance, physical, next_instance, &*info) }
    })
    .flatten();
    let result = match &plan {
        // SAFETY: the application's arguments, with the plan's extensions added.
        Some(plan) => unsafe { create(physical, &plan.create_info(&*info), allocator, device) },
        // SAFETY: the application's arguments, passed on.
        None => unsafe { create(physical, info, allocator, device) },
    };
    if result == vk::Result::SUCCESS {
        // SAFETY: the device was just created.
        let handle = unsafe { *device };
        contained(|| {
            // SAFETY: a live device and the next layer's lookup for it.
            let known = unsafe { Device::new(handle, next_device, plan) };
            DEVICES
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(Arc::new(known));
        });
    }
    result
}

/// Forgets a destroyed device (after the next layer destroyed it).
fn forget_device(key: usize) {
    DEVICES
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .retain(|d| d.key() != key);
}

/// The functions this layer answers for, by name (instance-level ones first).
fn ours(name: &CStr) -> vk::PFN_vkVoidFunction {
    let f: *const () = match name.to_bytes() {
        b"vkGetInstanceProcAddr" => get_instance_proc_addr as *const (),
        b"vkGetDeviceProcAddr" => get_device_proc_addr as *const (),
        b"vkCreateInstance" => create_instance as *const (),
        b"vkDestroyInstance" => destroy_instance as *const (),
        b"vkCreateDevice" => create_device as *const (),
        _ => return calls::intercepted(name),
    };
    // SAFETY: a function pointer, cast to the loader's generic function pointer type.
    Some(unsafe { std::mem::transmute::<*const (), unsafe extern "system" fn()>(f) })
}

unsafe extern "system" fn get_instance_proc_addr(
    instance: vk::Instance,
    name: *const c_char,
) -> vk::PFN_vkVoidFunction {
    // SAFETY: the caller passes a NUL-terminated name (the Vulkan contract).
    let cname = unsafe { CStr::from_ptr(name) };
    if let Some(f) = ours(cname) {
        return Some(f);
    }
    if instance == vk::Instance::null() {
        return None;
    }
    // SAFETY: a live instance handle.
    let (_, next) = instance_next(unsafe { dispatch_key(instance.as_raw()) })?;
    // SAFETY: the next layer's lookup, with the caller's arguments.
    unsafe { next(instance, name) }
}

unsafe extern "system" fn get_device_proc_addr(
    device: vk::Device,
    name: *const c_char,
) -> vk::PFN_vkVoidFunction {
    // SAFETY: the caller passes a NUL-terminated name (the Vulkan contract).
    let cname = unsafe { CStr::from_ptr(name) };
    let known = device_of(device.as_raw())?;
    if cname.to_bytes() == b"vkGetDeviceProcAddr" {
        return ours(cname);
    }
    if let Some(f) = calls::intercepted(cname) {
        return Some(f);
    }
    // SAFETY: the next layer's lookup, with the caller's arguments.
    unsafe { (known.next_lookup())(device, name) }
}

/// `count` items at `items` (none when the pointer is null).
///
/// # Safety
/// A non-null `items` points to `count` valid items.
pub(super) unsafe fn slice<'a, T>(items: *const T, count: u32) -> &'a [T] {
    if items.is_null() || count == 0 {
        return &[];
    }
    // SAFETY: per the contract.
    unsafe { std::slice::from_raw_parts(items, count as usize) }
}
