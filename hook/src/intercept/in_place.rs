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
//! asks for it (it hands back a [`Frame`]), the return address is swapped for ours first, so that
//! the real function returns to the export, which puts the caller's return address back, hands
//! the result to an `exit` function ([`pop`] says what was under way) and returns.
//!
//! While the real function runs, the caller's return address and `rbx` are in the [`Frame`], and
//! `rbx` points at it (the callee preserves it). The export's unwind information says so, so a
//! C++ exception the real function throws toward the caller unwinds through the export to the
//! caller's handler as it would without us (before: no unwind information, and the unwinder,
//! finding our address where the return address was, terminated the host). Such a call leaves
//! its entry behind: the next call on the thread drops entries whose frames are gone.

use std::cell::{Cell, UnsafeCell};
use std::ffi::c_void;

use super::batches::Composition;
use crate::base::entry::Entry;
use crate::base::ggml::Helpers;

/// The integer argument registers as the export saved them: rdi, rsi, rdx, rcx, r8, r9.
pub type SavedRegisters = [usize; 6];

/// What a swapped call keeps for its caller, at offsets the export's code and unwind
/// information name: the return address (0), the caller's `rbx` (8).
#[repr(C)]
pub struct Frame {
    return_address: usize,
    rbx: usize,
    /// The stack pointer at the export's entry: a later call made from a shallower frame means
    /// this one is gone (it unwound).
    entry_sp: usize,
}

/// What `enter` tells the export: the real function (0: none, and the export returns its
/// `missing` value), and the frame of a swapped call (null: a plain jump, untraced).
#[repr(C)]
pub struct Next {
    pub real: usize,
    pub frame: *mut Frame,
}

impl Next {
    pub const NONE: Next = Next {
        real: 0,
        frame: std::ptr::null_mut(),
    };
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

thread_local! {
    /// This thread's calls under way, innermost last: what to record, and how many there are.
    static UNDER_WAY: Cell<([Option<Pending>; DEPTH], usize)> = const { Cell::new(([None; DEPTH], 0)) };
    /// Their frames, at addresses that stay put while the calls run (the export's `rbx`).
    static FRAMES: UnsafeCell<[Frame; DEPTH]> = const {
        UnsafeCell::new([const { Frame { return_address: 0, rbx: 0, entry_sp: 0 } }; DEPTH])
    };
}

/// Notes a call under way, entered with the stack pointer `entry_sp` and returning to
/// `return_address`; its frame, or null when calls are nested too deep (the caller then enters
/// the real function untraced, its return address untouched).
pub fn push(entry_sp: usize, return_address: usize, pending: Pending) -> *mut Frame {
    FRAMES.with(|frames| {
        let frames = frames.get().cast::<Frame>();
        UNDER_WAY.with(|calls| {
            let (mut stack, mut depth) = calls.get();
            // Calls whose frames are gone (a C++ exception unwound through them): their stack
            // lay below this one's entry. Their spans stay without an end.
            // SAFETY: `depth` ≤ DEPTH entries of this thread's frames.
            while depth > 0 && unsafe { (*frames.add(depth - 1)).entry_sp } <= entry_sp {
                depth -= 1;
                stack[depth] = None;
            }
            if depth == DEPTH {
                calls.set((stack, depth));
                return std::ptr::null_mut();
            }
            stack[depth] = Some(pending);
            // SAFETY: entry `depth` < DEPTH of this thread's frames; the export writes `rbx` there.
            let frame = unsafe { frames.add(depth) };
            unsafe {
                (*frame).return_address = return_address;
                (*frame).entry_sp = entry_sp;
            }
            calls.set((stack, depth + 1));
            frame
        })
    })
}

/// The innermost call under way, removed: what to record.
pub fn pop() -> Option<Pending> {
    UNDER_WAY.with(|calls| {
        let (mut stack, depth) = calls.get();
        let top = depth.checked_sub(1)?;
        let pending = stack[top].take();
        calls.set((stack, top));
        pending
    })
}

/// Defines the export `$name`: `$enter(&SavedRegisters, stack_args, return_address) -> Next`
/// before the real function, `$exit(result)` after it (only when `enter` gave a frame), and
/// `$missing` returned when no loaded object defines the function.
macro_rules! in_place_export {
    ($(#[$doc:meta])* $name:ident, enter: $enter:path, exit: $exit:path, missing: $missing:literal) => {
        $(#[$doc])*
        ///
        /// # Safety
        /// The C function's own contract, with the caller's copy of the library.
        #[unsafe(naked)]
        #[cfg_attr(not(target_os = "macos"), unsafe(no_mangle))]
        #[cfg_attr(target_os = "macos", unsafe(export_name = concat!("ggml_viz_", stringify!($name))))]
        pub unsafe extern "C-unwind" fn $name() {
            core::arch::naked_asm!(
                ".cfi_startproc",
                // A frame without stack of its own has the CFA of the function it jumped to; the
                // unwinder tells frames apart by CFA, less one for a signal frame: marked so, this
                // one is not taken for its caller (whose CFA it shares) when a handler is sought.
                ".cfi_signal_frame",
                // On entry rsp ≡ 8 (mod 16); six pushes and 8 bytes leave it 16-byte aligned.
                "push r9",
                ".cfi_adjust_cfa_offset 8",
                "push r8",
                ".cfi_adjust_cfa_offset 8",
                "push rcx",
                ".cfi_adjust_cfa_offset 8",
                "push rdx",
                ".cfi_adjust_cfa_offset 8",
                "push rsi",
                ".cfi_adjust_cfa_offset 8",
                "push rdi",
                ".cfi_adjust_cfa_offset 8",
                "sub rsp, 8",
                ".cfi_adjust_cfa_offset 8",
                // enter(saved registers, the caller's stack arguments, the return address)
                "lea rdi, [rsp + 8]",
                "lea rsi, [rsp + 64]",
                "mov rdx, [rsp + 56]",
                "call {enter}",
                "mov r11, rdx",
                "add rsp, 8",
                ".cfi_adjust_cfa_offset -8",
                "pop rdi",
                ".cfi_adjust_cfa_offset -8",
                "pop rsi",
                ".cfi_adjust_cfa_offset -8",
                "pop rdx",
                ".cfi_adjust_cfa_offset -8",
                "pop rcx",
                ".cfi_adjust_cfa_offset -8",
                "pop r8",
                ".cfi_adjust_cfa_offset -8",
                "pop r9",
                ".cfi_adjust_cfa_offset -8",
                "test rax, rax",
                "jz 3f",
                "test r11, r11",
                "jz 2f",
                // Swap: the caller's rbx into the frame, rbx = the frame, our return address.
                "mov [r11 + 8], rbx",
                "mov rbx, r11",
                "lea r11, [rip + 1f]",
                "mov [rsp], r11",
                "2:",
                // What the unwinder meets when the real function unwinds (its return address is
                // `1:`, this jump's end): our frame has no stack of its own (CFA = rsp); the
                // caller's return address is at [rbx], its rbx at [rbx + 8] (DW_CFA_expression,
                // DW_OP_breg3).
                ".cfi_def_cfa 7, 0",
                ".cfi_escape 0x10, 0x10, 0x02, 0x73, 0x00",
                ".cfi_escape 0x10, 0x03, 0x02, 0x73, 0x08",
                "jmp rax",
                // Back from the real function (rsp as at entry + 8), its result in rax: the
                // caller's rbx and return address put back, and a plain frame again.
                "1:",
                "mov r11, rbx",
                ".cfi_escape 0x10, 0x10, 0x02, 0x7b, 0x00",
                ".cfi_escape 0x10, 0x03, 0x02, 0x7b, 0x08",
                "mov rbx, [r11 + 8]",
                ".cfi_same_value 3",
                "push qword ptr [r11]",
                ".cfi_def_cfa_offset 8",
                ".cfi_offset 16, -8",
                "push rax",
                ".cfi_adjust_cfa_offset 8",
                "mov rdi, rax",
                "call {exit}",
                "pop rax",
                ".cfi_adjust_cfa_offset -8",
                "ret",
                // No loaded object defines it (the rules here are the entry's again).
                "3:",
                "mov rax, {missing}",
                "ret",
                ".cfi_endproc",
                enter = sym $enter,
                exit = sym $exit,
                missing = const $missing,
            )
        }
    };
}

pub(crate) use in_place_export;
