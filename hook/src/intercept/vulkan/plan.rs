//! What timing a device needs, worked out before the device is created: the extensions it is
//! created with (the application's and `VK_EXT_calibrated_timestamps`), the timestamp period
//! and the valid bits of its queues' timestamps; none where ggml labels nothing or the device
//! cannot time (said once).

use std::ffi::{CStr, c_char};
use std::sync::atomic::AtomicBool;

use ash::vk;

use super::cast;
use crate::base::say_once;

const CALIBRATED_TIMESTAMPS: &CStr = c"VK_EXT_calibrated_timestamps";

/// What timing a device needs, worked out before it is created: the extensions it is created
/// with (the application's and the calibrated timestamps'), the timestamp period and valid bits.
pub struct Plan {
    extensions: Vec<*const c_char>,
    pub(super) period_ns: f64,
    pub(super) valid_bits: u32,
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
