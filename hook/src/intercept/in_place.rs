//! Exports whose arguments are never copied (x86-64 System V): for a function that takes a struct
//! by value in the caller's stack frame, whose size depends on the host's version of the library
//! (`ggml_backend_buffer_init`'s interface, `llama_decode`'s `llama_batch`: 56 bytes today, 72
//! before llama.cpp #9745). A wrapper that took the struct as a Rust argument would copy the size
//! it was compiled with and pass on that copy: too few bytes to an older callee, which then reads
//! our stack (before: `all_pos_0` and the fields after it arrived as garbage), and too many read
//! from the caller.
//!
//! [`in_place_export!`] makes such an export: it saves the argument registers, lets an `enter`
//! function look at them and at the caller's stack arguments in place, restores them, and enters
//! the real function by a jump with the caller's stack exactly as the caller made it. When `enter`
//! asks for it, the return address is swapped for ours first, so that the real function returns
//! to the export, which hands its result to an `exit` function ([`pop`] says what was under way)
//! and jumps back to the caller. The calls under way are kept per thread, innermost last.

use std::cell::Cell;
use std::ffi::c_void;

use super::batches::Composition;
use crate::base::entry::Entry;
use crate::base::ggml::Helpers;

/// The integer argument registers as the export saved them: rdi, rsi, rdx, rcx, r8, r9.
pub type SavedRegisters = [usize; 6];

/// What `enter` tells the export: the real function (0: none, and the export returns its
/// `missing` value), and whether to swap the return address (0: a plain jump, untraced).
#[repr(C)]
pub struct Next {
    pub real: usize,
    pub swap: usize,
}

/// What to record when a call under way returns.
#[derive(Clone, Copy)]
pub enum Pending {
    /// `ggml_backend_buffer_init`: the buffer it made, of this buffer type.
    Buffer {
        buft: *mut c_void,
        helpers: &'static Helpers,
    },
    /// A llama span's end (`name`, its tokens and their sequences), begun in `enter`.
    Span {
        name: Entry,
        n_tokens: u32,
        composition: Option<Composition>,
    },
}

/// Calls nested deeper than this on one thread (ggml and llama.cpp nest at most a decode and the
/// buffers it makes) are entered untraced.
const DEPTH: usize = 4;

/// A call under way: where it returns to, and what to record then.
type Call = (usize, Pending);

thread_local! {
    /// This thread's calls under way, innermost last, and how many there are.
    static UNDER_WAY: Cell<([Option<Call>; DEPTH], usize)> = const { Cell::new(([None; DEPTH], 0)) };
}

/// Notes a call under way, returning to `return_address`; false when calls are nested too deep
/// (the caller then enters the real function untraced, its return address untouched).
pub fn push(return_address: usize, pending: Pending) -> bool {
    UNDER_WAY.with(|calls| {
        let (mut stack, depth) = calls.get();
        if depth == DEPTH {
            return false;
        }
        stack[depth] = Some((return_address, pending));
        calls.set((stack, depth + 1));
        true
    })
}

/// The innermost call under way, removed: where it returns to, and what to record.
pub fn pop() -> Call {
    let call = UNDER_WAY.with(|calls| {
        let (mut stack, depth) = calls.get();
        let top = depth.checked_sub(1)?;
        let call = stack[top].take();
        calls.set((stack, top));
        call
    });
    // An export's return path runs only after its `enter` pushed the call (the swapped return
    // address brought it there), so the call is there; without it there is nowhere to return.
    call.unwrap_or_else(|| std::process::abort())
}

/// Defines the export `$name`: `$enter(&SavedRegisters, stack_args, return_address) -> Next`
/// before the real function, `$exit(result) -> return address` after it (only when `enter`
/// swapped), and `$missing` returned when no loaded object defines the function.
macro_rules! in_place_export {
    ($(#[$doc:meta])* $name:ident, enter: $enter:path, exit: $exit:path, missing: $missing:literal) => {
        $(#[$doc])*
        ///
        /// # Safety
        /// The C function's own contract, with the caller's copy of the library.
        #[unsafe(naked)]
        #[cfg_attr(not(target_os = "macos"), unsafe(no_mangle))]
        #[cfg_attr(target_os = "macos", unsafe(export_name = concat!("ggml_viz_", stringify!($name))))]
        pub unsafe extern "C" fn $name() {
            core::arch::naked_asm!(
                // On entry rsp ≡ 8 (mod 16); six pushes and 8 bytes leave it 16-byte aligned.
                "push r9",
                "push r8",
                "push rcx",
                "push rdx",
                "push rsi",
                "push rdi",
                "sub rsp, 8",
                // enter(saved registers, the caller's stack arguments, the return address)
                "lea rdi, [rsp + 8]",
                "lea rsi, [rsp + 64]",
                "mov rdx, [rsp + 56]",
                "call {enter}",
                "mov r11, rdx",
                "add rsp, 8",
                "pop rdi",
                "pop rsi",
                "pop rdx",
                "pop rcx",
                "pop r8",
                "pop r9",
                "test rax, rax",
                "jz 3f",
                "test r11, r11",
                "jz 2f",
                "lea r11, [rip + 1f]",
                "mov [rsp], r11",
                "2:",
                "jmp rax",
                // Back from the real function (rsp is 16-byte aligned here), its result in rax.
                "1:",
                "push rax",
                "sub rsp, 8",
                "mov rdi, rax",
                "call {exit}",
                "mov r11, rax",
                "add rsp, 8",
                "pop rax",
                "jmp r11",
                // No loaded object defines it.
                "3:",
                "mov rax, {missing}",
                "ret",
                enter = sym $enter,
                exit = sym $exit,
                missing = const $missing,
            )
        }
    };
}

pub(crate) use in_place_export;
