//! ggml-rpc's transport, wrapped (Linux x86-64): every command a client sends or a server serves,
//! on both ends of every connection, and nothing of any other socket in the process.
//!
//! `libggml-rpc.so` calls its transport's methods (`transport.h`: `socket_t::send_data`,
//! `recv_data`, `flush`, `accept`, the destructor, and the static `connect` and
//! `create_server`) through the PLT, so the
//! dynamic loader binds those calls to the wrappers exported here under the methods' Itanium
//! names. They carry every byte of the protocol whatever the medium (TCP, or RDMA after the
//! HELLO upgrade), and only ggml-rpc's: a libc `send`/`recv` wrapper would cost every other
//! socket of the host. Each wrapper reports the call to the recording core's protocol reader
//! ([`record::rpc_before`], [`record::rpc_after`]), which makes the spans, and forwards it
//! unchanged.
//!
//! The names are those of the ggml we build against (0.25.3, protocol 7.0). A ggml whose
//! transport changed them never calls these wrappers: [`super::rpc_names::check_names`] says so once, and no RPC
//! span is recorded rather than wrong ones.

use std::ffi::{CStr, c_char, c_int, c_void};

use super::route::{Callee, Resolved, fallback_callee, resolve_callee};
use super::rpc_names::{ACCEPT, CONNECT, CREATE_SERVER, DESTROY, FLUSH, NAMES, RECV, SEND};
use super::start::{say_no_function, start_tracing};
use crate::base::contained;
use crate::record::{self, Transfer};

type Ptr = *mut c_void;

/// An exported wrapper under a C++ name that jumps to `$imp` with the return address after the
/// method's own `$n` arguments (in `$reg`).
macro_rules! method {
    ($name:ident = $export:literal ($($arg:ident: $ty:ty),*) $(-> $ret:ty)?, $imp:ident, $reg:literal) => {
        #[doc = concat!("`", $export, "`, traced.\n\n# Safety\nggml-rpc's own contract.")]
        #[unsafe(naked)]
        #[unsafe(export_name = $export)]
        pub unsafe extern "C-unwind" fn $name($($arg: $ty),*) $(-> $ret)? {
            // The return address is at [rsp] on entry; the jump leaves the stack as the caller
            // made it, so `$imp` returns straight to the caller.
            core::arch::naked_asm!(concat!("mov ", $reg, ", [rsp]"), "jmp {imp}", imp = sym $imp)
        }
    };
}

method!(socket_send_data = "_ZN8socket_t9send_dataEPKvm"(socket: Ptr, data: *const u8, size: usize) -> bool, send_data, "rcx");
method!(socket_recv_data = "_ZN8socket_t9recv_dataEPvm"(socket: Ptr, data: *mut u8, size: usize) -> bool, recv_data, "rcx");
method!(socket_flush = "_ZN8socket_t5flushEv"(socket: Ptr) -> bool, flush, "rsi");
// The static methods return a `std::shared_ptr<socket_t>`, which the Itanium ABI returns in
// memory: the caller's slot comes first, in rdi, and is returned in rax; the socket is its
// first word.
method!(socket_connect = "_ZN8socket_t7connectEPKci"(slot: *mut Ptr, host: *const c_char, port: c_int) -> *mut Ptr, connect, "rcx");
method!(socket_create_server = "_ZN8socket_t13create_serverEPKci"(slot: *mut Ptr, host: *const c_char, port: c_int) -> *mut Ptr, create_server, "rcx");
// `accept` is a method returning one too: the slot in rdi, `this` in rsi.
method!(socket_accept = "_ZN8socket_t6acceptEv"(slot: *mut Ptr, server: Ptr) -> *mut Ptr, accept, "rdx");
// The destructor (the complete-object one, which `shared_ptr`'s deleter calls).
method!(socket_destroy = "_ZN8socket_tD1Ev"(socket: Ptr), destroy, "rsi");

/// The real method of `row` for the call site `ret`; tracing starts with the first.
fn real(row: u8, ret: usize) -> Option<&'static Resolved> {
    let callee = Callee::Rpc(row, NAMES[row as usize]);
    let found = contained(|| resolve_callee(callee, ret));
    start_tracing();
    match found {
        Some(Some((resolved, _))) => Some(resolved),
        Some(None) => None,
        None => fallback_callee(callee),
    }
    .or_else(|| {
        say_no_function(NAMES[row as usize]);
        None
    })
}

type TransferFn = unsafe extern "C-unwind" fn(Ptr, *const u8, usize) -> bool;

/// `send_data` and `recv_data`: the protocol reader hears the call before and after it.
fn transfer(
    row: u8,
    transfer: Transfer,
    socket: Ptr,
    data: *const u8,
    size: usize,
    ret: usize,
) -> bool {
    let Some(real) = real(row, ret) else {
        return false;
    };
    let traced = !real.untraced;
    if traced {
        // SAFETY: the caller's buffer of `size` bytes, readable for a send (the transport's
        // contract); a receive's bytes are not read before the call.
        contained(|| unsafe { record::rpc_before(socket as usize, transfer, data, size) });
    }
    // SAFETY: the real method, with the caller's arguments.
    let ok = unsafe { std::mem::transmute::<usize, TransferFn>(real.real)(socket, data, size) };
    if traced {
        // SAFETY: as above; after a successful receive its `size` bytes are there to read.
        contained(|| unsafe { record::rpc_after(socket as usize, transfer, data, size, ok) });
    }
    ok
}

unsafe extern "C-unwind" fn send_data(
    socket: Ptr,
    data: *const u8,
    size: usize,
    ret: usize,
) -> bool {
    transfer(SEND, Transfer::Send, socket, data, size, ret)
}

unsafe extern "C-unwind" fn recv_data(socket: Ptr, data: *mut u8, size: usize, ret: usize) -> bool {
    transfer(RECV, Transfer::Recv, socket, data, size, ret)
}

unsafe extern "C-unwind" fn flush(socket: Ptr, ret: usize) -> bool {
    let Some(real) = real(FLUSH, ret) else {
        return false;
    };
    type FlushFn = unsafe extern "C-unwind" fn(Ptr) -> bool;
    // SAFETY: the real method, with the caller's socket.
    let ok = unsafe { std::mem::transmute::<usize, FlushFn>(real.real)(socket) };
    if !real.untraced {
        // SAFETY: a flush reads no buffer.
        contained(|| unsafe {
            record::rpc_after(socket as usize, Transfer::Flush, std::ptr::null(), 0, ok)
        });
    }
    ok
}

type MakeSocketFn = unsafe extern "C-unwind" fn(*mut Ptr, *const c_char, c_int) -> *mut Ptr;

/// `connect` and `create_server`: the socket made, and the endpoint it was made for.
fn make_socket(row: u8, slot: *mut Ptr, host: *const c_char, port: c_int, ret: usize) -> *mut Ptr {
    let Some(real) = real(row, ret) else {
        // No socket: the shared_ptr the caller's slot gets is empty.
        // SAFETY: the caller's slot for a `std::shared_ptr` (two words).
        unsafe { slot.cast::<[usize; 2]>().write([0, 0]) };
        return slot;
    };
    // SAFETY: the real method, with the caller's arguments.
    let out = unsafe { std::mem::transmute::<usize, MakeSocketFn>(real.real)(slot, host, port) };
    if !real.untraced {
        contained(|| {
            // SAFETY: the returned shared_ptr's first word is the socket (null: none); `host` is
            // the caller's C string.
            let socket = unsafe { *out };
            if socket.is_null() || host.is_null() {
                return;
            }
            let host = unsafe { CStr::from_ptr(host) }.to_string_lossy();
            let endpoint = format!("{host}:{port}");
            if row == CONNECT {
                record::rpc_connected(socket as usize, &endpoint);
            } else {
                record::rpc_listening(&endpoint);
            }
        });
    }
    out
}

unsafe extern "C-unwind" fn connect(
    slot: *mut Ptr,
    host: *const c_char,
    port: c_int,
    ret: usize,
) -> *mut Ptr {
    make_socket(CONNECT, slot, host, port, ret)
}

unsafe extern "C-unwind" fn create_server(
    slot: *mut Ptr,
    host: *const c_char,
    port: c_int,
    ret: usize,
) -> *mut Ptr {
    make_socket(CREATE_SERVER, slot, host, port, ret)
}

unsafe extern "C-unwind" fn accept(slot: *mut Ptr, server: Ptr, ret: usize) -> *mut Ptr {
    let Some(real) = real(ACCEPT, ret) else {
        // SAFETY: the caller's slot for a `std::shared_ptr` (two words): an empty one.
        unsafe { slot.cast::<[usize; 2]>().write([0, 0]) };
        return slot;
    };
    type AcceptFn = unsafe extern "C-unwind" fn(*mut Ptr, Ptr) -> *mut Ptr;
    // SAFETY: the real method, with the caller's arguments.
    let out = unsafe { std::mem::transmute::<usize, AcceptFn>(real.real)(slot, server) };
    if !real.untraced {
        // SAFETY: the returned shared_ptr's first word is the socket (null: none).
        let socket = unsafe { *out };
        if !socket.is_null() {
            contained(|| record::rpc_accepted(socket as usize));
        }
    }
    out
}

/// The socket's connection ends before the real destructor runs (after it, the address may be
/// the next socket's).
unsafe extern "C-unwind" fn destroy(socket: Ptr, ret: usize) {
    let Some(real) = real(DESTROY, ret) else {
        return;
    };
    if !real.untraced {
        contained(|| record::rpc_closed(socket as usize));
    }
    type DestroyFn = unsafe extern "C-unwind" fn(Ptr);
    // SAFETY: the real destructor, with the caller's object.
    unsafe { std::mem::transmute::<usize, DestroyFn>(real.real)(socket) }
}
