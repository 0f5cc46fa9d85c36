//! The names of ggml-rpc's transport methods that [`super::rpc_transport`] wraps (Itanium names of the
//! ggml we build against), and the start-up check that this process's calls reach them.

use std::ffi::CStr;
use std::sync::atomic::AtomicBool;

use crate::base::say_once;

/// The wrapped methods, by row.
pub const NAMES: [&CStr; 7] = [
    c"_ZN8socket_t9send_dataEPKvm",
    c"_ZN8socket_t9recv_dataEPvm",
    c"_ZN8socket_t5flushEv",
    c"_ZN8socket_t7connectEPKci",
    c"_ZN8socket_t13create_serverEPKci",
    c"_ZN8socket_t6acceptEv",
    c"_ZN8socket_tD1Ev",
];
pub const SEND: u8 = 0;
pub const RECV: u8 = 1;
pub const FLUSH: u8 = 2;
pub const CONNECT: u8 = 3;
pub const CREATE_SERVER: u8 = 4;
pub const ACCEPT: u8 = 5;
pub const DESTROY: u8 = 6;

/// Said once, at the start of tracing, when this process has ggml-rpc (its C API is there) but
/// none of the transport methods wrapped here: its calls will not reach us.
pub fn check_names() {
    // SAFETY: dlsym with RTLD_DEFAULT and valid C strings.
    let has_rpc = unsafe {
        !libc::dlsym(libc::RTLD_DEFAULT, c"ggml_backend_rpc_add_server".as_ptr()).is_null()
    };
    if !has_rpc {
        return;
    }
    // SAFETY: as above; RTLD_NEXT finds a definition other than ours.
    let ours_reached = NAMES[..3]
        .iter()
        .all(|name| unsafe { !libc::dlsym(libc::RTLD_NEXT, name.as_ptr()).is_null() });
    if !ours_reached {
        static SAID: AtomicBool = AtomicBool::new(false);
        say_once(
            &SAID,
            format_args!(
                "this ggml-rpc's transport is not the one this hook knows (no {}): its commands \
                 are not recorded",
                NAMES[..3]
                    .iter()
                    .map(|n| n.to_string_lossy())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        );
    }
}
