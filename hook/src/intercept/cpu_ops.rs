//! Per-op timing on the CPU backend's worker threads (`GGML_VIZ_OP_TIMING=threads`, the default
//! where it works): nothing of the run changes, no callback, no extra synchronization, fusion
//! stays on.
//!
//! ggml's CPU backend exports its per-op functions (`ggml_compute_forward_mul_mat`, …),
//! `ggml_barrier` and `ggml_cpu_extra_compute_forward`, and calls them through the PLT, so the
//! dynamic loader binds those calls to the wrappers exported here. Every wrapper enters one
//! common trampoline that saves every argument register, asks [`enter`] for the real function
//! (resolved by the caller's scope, as for the entry points), calls it with the registers as
//! they came, takes the thread's depth down (after a recorded barrier wait, keeps its return
//! value and tells [`exit`]), and returns that value: whatever the function's signature (the
//! fused functions take three arguments, `mul_mat_id_tiled` six and returns `bool`), nothing is
//! changed. None of these functions takes arguments on the stack.
//! From a call site a thread has resolved before, the dispatcher's marker, the calls that only
//! continue what is open (its per-op call after the marker, a call nested in an op), the
//! barriers, and every call where nothing is timed per thread take a fast path in the
//! trampoline itself, without `enter`.
//!
//! What a thread records (only while a recorded, sampled graph compute is running, see
//! [`record::thread_ops`]):
//! - its share of a node: begun when `ggml_cpu_extra_compute_forward` is called for it (once
//!   per computed node, at the top of ggml's dispatcher: it also computes the repacked
//!   quantized weights, which call no per-op function) or, where that is not called (a fused
//!   call, an older ggml), by the outermost per-op call for another tensor; ended at the
//!   `ggml_barrier` that follows the node in ggml's graph loop: the thread's next one once a
//!   call computed the node, else the next one from a call site known to follow nodes (a
//!   barrier before any such call lies inside an op whose function is static, `mul_mat_id`).
//!   Calls nested in an op (`mul_mat` calling `mul_mat_tiled`, `unary` tail-calling `abs`) are
//!   not spans of their own;
//! - a fused call (`ggml_compute_forward_rms_norm_mul_fused`) is one span on the node it
//!   computed last, named for both ops (`RMS_NORM+MUL`);
//! - each `ggml_barrier` as a `BARRIER_WAIT` with the thread's index and count (read from
//!   ggml's `struct ggml_compute_params`, whose first two `int`s are `ith` and `nth`), when
//!   there is more than one thread; the barriers inside an op (`mul_mat`'s, `mul_mat_id`'s)
//!   are inside its span.
//!
//! Where ggml is linked into the executable, its per-op functions get inline hooks to these
//! wrappers (`install::static_exe`), and the compiler may have inlined `ggml_barrier` into the
//! graph loop: in an OpenMP build the loop then calls OpenMP's `GOMP_barrier`, wrapped here as
//! well (see [`Kind::OmpBarrier`]); at one thread it calls nothing, and the graph compute's
//! return ends the last share ([`graph_compute_returned`]).
//!
//! A tail call (`unary` jumping to `abs`) reaches a wrapper with a return address inside our
//! own trampoline; the trampoline passes 0 then, and the thread's outermost call site stands in
//! for resolving it.

use std::cell::Cell;
use std::ffi::{CStr, c_void};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use super::eval_callback::node_info;
use super::route::{Callee, Resolved, fallback_callee, resolve_callee};
use super::start::say_no_function;
use crate::base::clock;
use crate::base::ggml::Helpers;
use crate::base::tensor::{self, read_tensor};
use crate::base::{contained, say_once};
use crate::record::{self, OpInfo, Recorder, ThisThread};

type Ptr = *mut c_void;

/// What a wrapped function's arguments hold. The numbers are `common`'s: below `Marker`, a call
/// may take its fast path; from `Barrier` on, it is a barrier.
#[derive(Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
enum Kind {
    /// `(params, dst, …)`.
    Second,
    /// `(params, bool, dst)`: `flash_attn_back`.
    Third,
    /// `(params, first, last)`: one call computing two nodes.
    Fused,
    /// `ggml_cpu_extra_compute_forward(params, node)`: the dispatcher's first call for a node.
    Marker,
    /// `ggml_barrier(threadpool)`.
    Barrier,
    /// `GOMP_barrier()`, OpenMP's barrier (GCC's libgomp), which ggml's barrier calls in an
    /// OpenMP build: where the compiler inlined `ggml_barrier` (a ggml linked into the
    /// executable), ggml's graph loop and `mul_mat` call it directly. A barrier of ggml's where
    /// it follows a node or lies inside one; nothing otherwise (called from inside our
    /// `ggml_barrier` wrapper's call, or by OpenMP code outside any node: ggml's `omp single`
    /// before a graph's first node).
    OmpBarrier,
}

struct Function {
    name: &'static CStr,
    kind: Kind,
    /// Our exported wrapper.
    wrapper: unsafe extern "C" fn(),
}

/// Defines the exported wrappers and the table [`FUNCTIONS`] from one list of names, so that
/// each wrapper's number is its row. The list is this ggml's (0.25.3) exported per-op
/// functions (`nm -D libggml-cpu.so`; the e2e tests check it against the build), less the
/// helpers it only calls from inside another op (`mul_mat_tiled`, `mul_mat_id_tiled`,
/// `add_non_quantized`, `fwht`: never the start of a node, and a wrapped call costs every
/// node that makes it), plus the names earlier ggml versions declared in `ggml-cpu/ops.h`
/// since the CPU backend's split (ggml's history, November 2024 to v0.21.0: `map_unary`,
/// `map_binary`, `map_custom{1,2,3}_f32`, and `view`, `reshape`, `permute`, `transpose`, which
/// those versions' dispatchers still called for no-op nodes), all with the node second; a name
/// that the running ggml lacks is never called. And OpenMP's `GOMP_barrier`, which ggml's
/// barrier is where the compiler inlined it (see [`Kind::OmpBarrier`]).
macro_rules! cpu_functions {
    ($($name:ident: $kind:ident,)*) => {
        #[allow(non_camel_case_types, clippy::enum_variant_names)]
        #[repr(u8)]
        enum Index { $($name,)* }

        static FUNCTIONS: &[Function] = &[$(Function {
            name: match CStr::from_bytes_with_nul(concat!(stringify!($name), "\0").as_bytes()) {
                Ok(name) => name,
                Err(_) => panic!("a C name"),
            },
            kind: Kind::$kind,
            wrapper: $name,
        },)*];

        /// Each row's [`Kind`], for `common`'s fast path.
        static KINDS: [Kind; [$(stringify!($name)),*].len()] = [$(Kind::$kind,)*];

        // Each row has a resolver code of its own (64 + row, below the RPC methods' 240).
        const _: () = assert!(KINDS.len() <= 240 - 64);

        $(
            #[doc = concat!("`", stringify!($name), "`, timed per thread.\n\n# Safety\nggml's own contract.")]
            #[unsafe(naked)]
            #[unsafe(no_mangle)]
            pub unsafe extern "C" fn $name() {
                core::arch::naked_asm!(
                    "mov r11d, {index}",
                    "jmp {common}",
                    index = const Index::$name as u8,
                    common = sym common,
                )
            }
        )*
    };
}

cpu_functions! {
    GOMP_barrier: OmpBarrier,
    ggml_barrier: Barrier,
    ggml_cpu_extra_compute_forward: Marker,
    ggml_compute_forward_abs: Second,
    ggml_compute_forward_acc: Second,
    ggml_compute_forward_add: Second,
    ggml_compute_forward_add1: Second,
    ggml_compute_forward_add_id: Second,
    ggml_compute_forward_add_rel_pos: Second,
    ggml_compute_forward_arange: Second,
    ggml_compute_forward_argmax: Second,
    ggml_compute_forward_argsort: Second,
    ggml_compute_forward_ceil: Second,
    ggml_compute_forward_clamp: Second,
    ggml_compute_forward_col2im_1d: Second,
    ggml_compute_forward_concat: Second,
    ggml_compute_forward_cont: Second,
    ggml_compute_forward_conv_2d: Second,
    ggml_compute_forward_conv_2d_dw: Second,
    ggml_compute_forward_conv_3d: Second,
    ggml_compute_forward_conv_transpose_1d: Second,
    ggml_compute_forward_conv_transpose_2d: Second,
    ggml_compute_forward_cos: Second,
    ggml_compute_forward_count_equal: Second,
    ggml_compute_forward_cpy: Second,
    ggml_compute_forward_cross_entropy_loss: Second,
    ggml_compute_forward_cross_entropy_loss_back: Second,
    ggml_compute_forward_cumsum: Second,
    ggml_compute_forward_custom: Second,
    ggml_compute_forward_diag: Second,
    ggml_compute_forward_diag_mask_inf: Second,
    ggml_compute_forward_diag_mask_zero: Second,
    ggml_compute_forward_div: Second,
    ggml_compute_forward_dsv4_hc_comb: Second,
    ggml_compute_forward_dsv4_hc_post: Second,
    ggml_compute_forward_dsv4_hc_pre: Second,
    ggml_compute_forward_dup: Second,
    ggml_compute_forward_elu: Second,
    ggml_compute_forward_exp: Second,
    ggml_compute_forward_expm1: Second,
    ggml_compute_forward_fill: Second,
    ggml_compute_forward_flash_attn_back: Third,
    ggml_compute_forward_flash_attn_ext: Second,
    ggml_compute_forward_floor: Second,
    ggml_compute_forward_gated_delta_net: Second,
    ggml_compute_forward_get_rel_pos: Second,
    ggml_compute_forward_get_rows: Second,
    ggml_compute_forward_get_rows_back: Second,
    ggml_compute_forward_gla: Second,
    ggml_compute_forward_glu: Second,
    ggml_compute_forward_group_norm: Second,
    ggml_compute_forward_hardsigmoid: Second,
    ggml_compute_forward_hardswish: Second,
    ggml_compute_forward_im2col: Second,
    ggml_compute_forward_im2col_3d: Second,
    ggml_compute_forward_im2col_back_f32: Second,
    ggml_compute_forward_l2_norm: Second,
    ggml_compute_forward_leaky_relu: Second,
    ggml_compute_forward_lightning_indexer: Second,
    ggml_compute_forward_log: Second,
    ggml_compute_forward_map_binary: Second,
    ggml_compute_forward_map_custom1: Second,
    ggml_compute_forward_map_custom1_f32: Second,
    ggml_compute_forward_map_custom2: Second,
    ggml_compute_forward_map_custom2_f32: Second,
    ggml_compute_forward_map_custom3: Second,
    ggml_compute_forward_map_custom3_f32: Second,
    ggml_compute_forward_map_unary: Second,
    ggml_compute_forward_mean: Second,
    ggml_compute_forward_mul: Second,
    ggml_compute_forward_mul_mat: Second,
    ggml_compute_forward_neg: Second,
    ggml_compute_forward_norm: Second,
    ggml_compute_forward_opt_step_adamw: Second,
    ggml_compute_forward_opt_step_sgd: Second,
    ggml_compute_forward_out_prod: Second,
    ggml_compute_forward_pad: Second,
    ggml_compute_forward_pad_reflect_1d: Second,
    ggml_compute_forward_permute: Second,
    ggml_compute_forward_pool_1d: Second,
    ggml_compute_forward_pool_2d: Second,
    ggml_compute_forward_pool_2d_back: Second,
    ggml_compute_forward_relu: Second,
    ggml_compute_forward_repeat: Second,
    ggml_compute_forward_repeat_back: Second,
    ggml_compute_forward_reshape: Second,
    ggml_compute_forward_rms_norm: Second,
    ggml_compute_forward_rms_norm_back: Second,
    ggml_compute_forward_rms_norm_mul_fused: Fused,
    ggml_compute_forward_roll: Second,
    ggml_compute_forward_rope: Second,
    ggml_compute_forward_rope_back: Second,
    ggml_compute_forward_round: Second,
    ggml_compute_forward_rwkv_wkv6: Second,
    ggml_compute_forward_rwkv_wkv7: Second,
    ggml_compute_forward_scale: Second,
    ggml_compute_forward_set: Second,
    ggml_compute_forward_set_rows: Second,
    ggml_compute_forward_sgn: Second,
    ggml_compute_forward_sigmoid: Second,
    ggml_compute_forward_silu_back: Second,
    ggml_compute_forward_sin: Second,
    ggml_compute_forward_soft_max: Second,
    ggml_compute_forward_soft_max_ext_back: Second,
    ggml_compute_forward_softplus: Second,
    ggml_compute_forward_solve_tri: Second,
    ggml_compute_forward_sqr: Second,
    ggml_compute_forward_sqrt: Second,
    ggml_compute_forward_ssm_conv: Second,
    ggml_compute_forward_ssm_scan: Second,
    ggml_compute_forward_step: Second,
    ggml_compute_forward_sub: Second,
    ggml_compute_forward_sum: Second,
    ggml_compute_forward_sum_rows: Second,
    ggml_compute_forward_tanh: Second,
    ggml_compute_forward_timestep_embedding: Second,
    ggml_compute_forward_top_k: Second,
    ggml_compute_forward_transpose: Second,
    ggml_compute_forward_tri: Second,
    ggml_compute_forward_trunc: Second,
    ggml_compute_forward_unary: Second,
    ggml_compute_forward_upscale: Second,
    ggml_compute_forward_view: Second,
    ggml_compute_forward_win_part: Second,
    ggml_compute_forward_win_unpart: Second,
    ggml_compute_forward_xielu: Second,
}

/// Every wrapped function: its row, C name and our wrapper (for inline hooks on an executable's
/// own ggml).
pub fn wrapped() -> impl Iterator<Item = (u8, &'static CStr, *const ())> {
    FUNCTIONS
        .iter()
        .enumerate()
        .map(|(row, f)| (row as u8, f.name, f.wrapper as *const ()))
}

// This thread's `Worker`, where `common` can reach it in two instructions: an 8-byte slot of
// initial-exec TLS (a preloaded library's static TLS; 8 bytes also fit the surplus glibc keeps
// for a library loaded later), set by `enter` once it records on the thread, or once it knows
// nothing will be.
core::arch::global_asm!(
    ".pushsection .tbss,\"awT\",@nobits",
    ".p2align 3",
    ".globl ggml_viz_worker_slot",
    ".hidden ggml_viz_worker_slot",
    ".type ggml_viz_worker_slot, @object",
    ".size ggml_viz_worker_slot, 8",
    "ggml_viz_worker_slot:",
    ".zero 8",
    ".popsection",
);

/// Points this thread's slot at its `Worker`.
fn set_worker_slot(w: &Worker) {
    // SAFETY: writes this thread's own TLS slot (defined above), nothing else.
    unsafe {
        core::arch::asm!(
            "mov {t}, qword ptr [rip + ggml_viz_worker_slot@GOTTPOFF]",
            "mov qword ptr fs:[{t}], {w}",
            t = out(reg) _,
            w = in(reg) w as *const Worker,
            options(nostack, preserves_flags),
        )
    }
}

/// Around a call into Rust from `common`'s fast path: the argument registers the real function
/// will get (and `r10`, its address) pushed, the stack 16-byte aligned for the call.
macro_rules! push_arguments {
    () => {
        "push rdi\npush rsi\npush rdx\npush rcx\npush r8\npush r9\npush r10\nsub rsp, 8"
    };
}

/// The registers [`push_arguments`] pushed, back as they were.
macro_rules! pop_arguments {
    () => {
        "add rsp, 8\npop r10\npop r9\npop r8\npop rcx\npop rdx\npop rsi\npop rdi"
    };
}

/// The trampoline every wrapper jumps to, with its row in `r11`.
///
/// Its fast path touches only `rax`, `r10` and the callee-saved registers it pushes, and calls
/// Rust only where a share begins or ends (with the argument registers pushed around the call),
/// for a call from a site this thread has resolved before: any call where nothing will be timed (op timing off or by the eval callback, or
/// tracing stopped), or nothing is timed now (a graph compute `op_sample` leaves untimed, as
/// [`record::THREAD_OPS_NOW`] says) and this thread has no share or call open, which goes
/// straight to ggml; of a per-op function (not the marker) nested
/// in an op (this thread's depth is above 0) or the dispatcher's call for the node this
/// thread's share is open for, where it does what [`enter`] and the slow path would (the depth
/// up around the call, the outermost call site kept); of the dispatcher's marker at depth 0,
/// whose share [`begin_share`] begins; of a barrier of one thread, which records no wait and
/// ends this thread's share if one is open (through [`end_share`]); or of a barrier of several,
/// whose wait [`wait_begins`] and [`exit`] record around the call. Anything else takes the slow
/// path, through [`enter`].
///
/// # Safety
/// Entered only by a wrapper's `jmp`, with the caller's argument registers and stack intact.
#[unsafe(naked)]
unsafe extern "C" fn common() {
    core::arch::naked_asm!(
        // Three pushes: the stack is 16-byte aligned for the call below.
        "push rbx",
        "push r12",
        "push r13",
        "mov rbx, qword ptr [rip + ggml_viz_worker_slot@GOTTPOFF]",
        "mov rbx, qword ptr fs:[rbx]",
        "test rbx, rbx",
        "jz 20f",
        "lea r10, [rip + {kinds}]",
        "movzx r12d, byte ptr [r10 + r11]",
        // The site; a tail call from one of our own calls goes the slow way (its site is the
        // outermost call's).
        "mov r13, [rsp + 24]",
        "lea r10, [rip + 2f]",
        "cmp r13, r10",
        "je 20f",
        "lea r10, [rip + 6f]",
        "cmp r13, r10",
        "je 20f",
        // key = site ^ (row << 48); its set: the top bits of key * SITE_MIX.
        "mov rax, r11",
        "shl rax, 48",
        "xor rax, r13",
        "movabs r10, {mix}",
        "imul r10, rax",
        "shr r10, {shift}",
        "imul r10, r10, {set_size}",
        "lea r10, [rbx + r10 + {sites}]",
        "cmp [r10 + {key}], rax",
        "je 31f",
        "add r10, {slot_size}",
        "cmp [r10 + {key}], rax",
        "je 31f",
        "add r10, {slot_size}",
        "cmp [r10 + {key}], rax",
        "je 31f",
        "add r10, {slot_size}",
        "cmp [r10 + {key}], rax",
        "jne 20f",
        "31:",
        "mov r10, [r10 + {resolved}]",
        "test r10, r10",
        "jz 20f",
        "cmp byte ptr [r10 + {untraced}], 0",
        "jne 20f",
        "mov rax, r10",
        "mov r10, [r10 + {real}]",
        "test r10, r10",
        "jz 20f",
        "cmp byte ptr [rbx + {passthrough}], 0",
        "jne 51f",
        // Nothing is timed per thread now (the graph compute running is one that op_sample
        // leaves untimed) and this thread has no share open, nor a call: straight to ggml.
        "cmp byte ptr [rip + {thread_ops_now}], 0",
        "jne 53f",
        "cmp dword ptr [rbx + {depth}], 0",
        "jne 53f",
        "cmp qword ptr [rbx + {open}], 0",
        "je 51f",
        "53:",
        // OpenMP's barrier: ggml's, unless it is called inside our ggml_barrier wrapper's call
        // (a wait is open) or outside any node (depth 0, no share open): then straight on.
        "cmp r12d, {omp_barrier}",
        "jne 54f",
        "cmp qword ptr [rbx + {barrier_start}], 0",
        "jne 51f",
        "cmp dword ptr [rbx + {depth}], 0",
        "jne 50f",
        "cmp qword ptr [rbx + {open}], 0",
        "je 51f",
        "jmp 50f",
        "54:",
        "cmp r12d, {barrier}",
        "je 50f",
        "cmp r12d, {marker}",
        "je 70f",
        "cmp dword ptr [rbx + {depth}], 0",
        "jne 40f",
        // Depth 0: only the call for the node this thread's share is open for (its tensor is
        // the second argument, or the third for flash_attn_back and fused calls).
        "mov rax, rsi",
        "test r12d, r12d",
        "jz 41f",
        "mov rax, rdx",
        "41:",
        "test rax, rax",
        "jz 20f",
        "cmp rax, [rbx + {open}]",
        "jne 20f",
        "mov [rbx + {outer}], r13",
        "mov byte ptr [rbx + {computed}], 1",
        "40:",
        "inc dword ptr [rbx + {depth}]",
        "call r10",
        "6:",
        "dec dword ptr [rbx + {depth}]",
        // The marker says whether it computed the node (repacked weights): a bool, in al.
        "cmp r12d, {marker}",
        "jne 61f",
        "mov byte ptr [rbx + {computed}], al",
        "61:",
        "pop r13",
        "pop r12",
        "pop rbx",
        "ret",
        // A barrier of one thread, which ends no share (nested in an op, or none is open):
        // nothing is recorded, nothing follows.
        "50:",
        "cmp dword ptr [rbx + {nth}], 1",
        "ja 52f",
        "cmp dword ptr [rbx + {depth}], 0",
        "jne 51f",
        "cmp qword ptr [rbx + {open}], 0",
        "je 51f",
        // A barrier of one thread with a share open: end_share(worker, site) ends it if the
        // barrier follows its node, then ggml's barrier, with the argument registers as they
        // came (it takes no float).
        push_arguments!(),
        "mov rdi, rbx",
        "mov rsi, r13",
        "call {end_share}",
        pop_arguments!(),
        "51:",
        "pop r13",
        "pop r12",
        "pop rbx",
        "jmp r10",
        // A barrier of several threads: wait_begins(worker, site) ends the share if one is
        // open and the barrier follows its node, and says whether the wait is recorded; if so,
        // ggml's barrier is called from here and exit records the wait after it (a barrier
        // returns nothing; rax is kept all the same).
        "52:",
        push_arguments!(),
        "mov rdi, rbx",
        "mov rsi, r13",
        "call {wait_begins}",
        pop_arguments!(),
        "test al, al",
        "jz 51b",
        "call r10",
        "mov r12, rax",
        "mov rdi, rbx",
        "call {exit}",
        "mov rax, r12",
        "pop r13",
        "pop r12",
        "pop rbx",
        "ret",
        // The dispatcher's marker at depth 0: begin_share(worker, site, resolved, params,
        // node, row) begins the share (as enter would) and says whether the call is timed: if
        // so the depth goes up around it, as for the per-op calls above.
        "70:",
        "cmp dword ptr [rbx + {depth}], 0",
        "jne 20f",
        push_arguments!(),
        "mov rdx, rax",
        "mov rcx, rdi",
        "mov r8, rsi",
        "mov r9, r11",
        "mov rdi, rbx",
        "mov rsi, r13",
        "call {begin_share}",
        pop_arguments!(),
        "test al, al",
        "jz 51b",
        "jmp 40b",
        // The slow path, through enter.
        "20:",
        "pop r13",
        "pop r12",
        "pop rbx",
        // A frame of 208 bytes keeps the stack 16-byte aligned for the calls below.
        "push rbp",
        "mov rbp, rsp",
        "sub rsp, 208",
        "mov [rsp], rdi",
        "mov [rsp + 8], rsi",
        "mov [rsp + 16], rdx",
        "mov [rsp + 24], rcx",
        "mov [rsp + 32], r8",
        "mov [rsp + 40], r9",
        "mov [rsp + 48], r11",
        "movaps [rsp + 64], xmm0",
        "movaps [rsp + 80], xmm1",
        "movaps [rsp + 96], xmm2",
        "movaps [rsp + 112], xmm3",
        "movaps [rsp + 128], xmm4",
        "movaps [rsp + 144], xmm5",
        "movaps [rsp + 160], xmm6",
        "movaps [rsp + 176], xmm7",
        // enter(row, arg0, arg1, arg2, return address or 0 for a tail call from our own call below)
        "mov rdi, r11",
        "mov rsi, [rsp]",
        "mov rdx, [rsp + 8]",
        "mov rcx, [rsp + 16]",
        "mov r8, [rbp + 8]",
        "lea rax, [rip + 2f]",
        "cmp r8, rax",
        "je 7f",
        "lea rax, [rip + 6b]",
        "cmp r8, rax",
        "jne 3f",
        "7:",
        "xor r8d, r8d",
        "3:",
        "call {enter}",
        "mov r11, rax",
        "mov [rsp + 56], rdx",
        "mov rdi, [rsp]",
        "mov rsi, [rsp + 8]",
        "mov rdx, [rsp + 16]",
        "mov rcx, [rsp + 24]",
        "mov r8, [rsp + 32]",
        "mov r9, [rsp + 40]",
        "movaps xmm0, [rsp + 64]",
        "movaps xmm1, [rsp + 80]",
        "movaps xmm2, [rsp + 96]",
        "movaps xmm3, [rsp + 112]",
        "movaps xmm4, [rsp + 128]",
        "movaps xmm5, [rsp + 144]",
        "movaps xmm6, [rsp + 160]",
        "movaps xmm7, [rsp + 176]",
        "test r11, r11",
        "jz 4f",
        // Nothing to do after it: the real function returns straight to our caller.
        "cmp qword ptr [rsp + 56], 0",
        "je 5f",
        "call r11",
        "2:",
        // After any call but a barrier's (ggml's or OpenMP's), only the depth goes down.
        "mov r10, [rsp + 48]",
        "lea r11, [rip + {kinds}]",
        "cmp byte ptr [r11 + r10], {barrier}",
        "jae 8f",
        "mov r10, [rsp + 56]",
        "dec dword ptr [r10 + {depth}]",
        "leave",
        "ret",
        // A recorded barrier wait ends: keep the return value (rax:rdx, xmm0:xmm1) across
        // exit(worker).
        "8:",
        "mov [rsp], rax",
        "mov [rsp + 8], rdx",
        "movaps [rsp + 64], xmm0",
        "movaps [rsp + 80], xmm1",
        "mov rdi, [rsp + 56]",
        "call {exit}",
        "mov rax, [rsp]",
        "mov rdx, [rsp + 8]",
        "movaps xmm0, [rsp + 64]",
        "movaps xmm1, [rsp + 80]",
        "leave",
        "ret",
        // No real function (no loaded ggml defines it): nothing to call.
        "4:",
        "xor eax, eax",
        "leave",
        "ret",
        "5:",
        "leave",
        "jmp r11",
        enter = sym enter,
        exit = sym exit,
        kinds = sym KINDS,
        marker = const Kind::Marker as u8,
        barrier = const Kind::Barrier as u8,
        omp_barrier = const Kind::OmpBarrier as u8,
        barrier_start = const std::mem::offset_of!(Worker, barrier_start),
        mix = const SITE_MIX,
        shift = const SITE_SET_SHIFT,
        set_size = const std::mem::size_of::<[SiteSlot; SITE_WAYS]>(),
        slot_size = const std::mem::size_of::<SiteSlot>(),
        sites = const std::mem::offset_of!(Worker, sites),
        key = const std::mem::offset_of!(SiteEntry, key),
        resolved = const std::mem::offset_of!(SiteEntry, resolved),
        untraced = const std::mem::offset_of!(Resolved, untraced),
        real = const std::mem::offset_of!(Resolved, real),
        depth = const std::mem::offset_of!(Worker, depth),
        open = const std::mem::offset_of!(Worker, open_tensor),
        outer = const std::mem::offset_of!(Worker, outer_site),
        computed = const std::mem::offset_of!(Worker, node_computed),
        nth = const std::mem::offset_of!(Worker, nth),
        passthrough = const std::mem::offset_of!(Worker, passthrough),
        thread_ops_now = sym record::THREAD_OPS_NOW,
        end_share = sym end_share,
        begin_share = sym begin_share,
        wait_begins = sym wait_begins,
    )
}

/// This thread's place among the wrapped calls. No destructors (see `record::events`).
struct Worker {
    /// Wrapped per-op calls open on this thread (barriers not counted).
    depth: Cell<u32>,
    /// Return address of the outermost open call: stands in for a tail call's.
    outer_site: Cell<usize>,
    /// This thread's open share of a node, and the recorder it is recorded in.
    node: Cell<Option<(OpInfo, &'static Recorder)>>,
    /// The tensor of `node` (0: none), where `common`'s fast path can read it.
    open_tensor: Cell<usize>,
    /// A call computed `node` on this thread: its per-op function, or the dispatcher's marker
    /// (repacked weights). Before that, a barrier lies inside an op whose function no wrapper
    /// reaches (see [`Worker::barrier_follows_node`]).
    node_computed: Cell<bool>,
    /// Nothing will be timed on this thread ([`record::thread_ops_never`]): `common` sends
    /// every call from a resolved site straight to ggml.
    passthrough: Cell<bool>,
    /// Thread index and count from the compute params of the last node.
    ith: Cell<u32>,
    nth: Cell<u32>,
    /// When the open barrier wait began (0: not recorded).
    barrier_start: Cell<u64>,
    /// This thread's recording state, once it recorded.
    thread: Cell<Option<ThisThread>>,
    /// The call sites this thread resolved last, in sets by (row, site): each node makes three
    /// or more wrapped calls, so the shared cache's probing is paid once per site and thread.
    sites: [[SiteSlot; SITE_WAYS]; SITE_SETS],
    /// The op infos of the nodes this thread computed last, direct-mapped by tensor address,
    /// with the tensor's fingerprint (name, op, type, shape) when it was described and the
    /// recorder whose tensor table the id is in (a child after `fork` has its own): a graph
    /// computed again (every token) reuses them instead of describing each node again.
    infos: [Cell<CachedInfo>; INFOS],
    /// The entry of the node this thread's last share was for.
    last_info: Cell<*mut CachedInfo>,
    /// The node that followed that node last time (0: not known).
    next_tensor: Cell<usize>,
    /// The addresses of the dispatcher's marker's call-site entry and route (see
    /// [`Worker::prefetch_next`]).
    marker_lines: Cell<(usize, usize)>,
}

/// A call-site cache entry: key (return address and row) and where the call goes; `repr(C)`
/// for `common`'s fast path, which reads it.
#[derive(Clone, Copy)]
#[repr(C)]
struct SiteEntry {
    key: usize,
    resolved: Option<&'static Resolved>,
}

type SiteSlot = Cell<SiteEntry>;

/// An entry of a thread's op-info cache: one cache line.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct CachedInfo {
    /// The node's tensor (0: an empty entry).
    tensor: usize,
    /// Its fingerprint when it was described.
    print: u64,
    /// The recorder whose tensor table `tensor_id` is in.
    recorder: usize,
    /// The node this thread's share after this node's was for, the last time (0: none yet):
    /// what is asked for ahead when this node's share ends (see [`Worker::prefetch_next`]).
    next: usize,
    op_size: u64,
    backend: usize,
    op_type: u32,
    tensor_id: u16,
}

impl CachedInfo {
    const EMPTY: CachedInfo = CachedInfo {
        tensor: 0,
        print: 0,
        recorder: 0,
        next: 0,
        op_size: 0,
        backend: 0,
        op_type: 0,
        tensor_id: 0,
    };

    fn op(&self) -> OpInfo {
        OpInfo {
            tensor: self.tensor as Ptr,
            op_type: self.op_type,
            op_size: self.op_size,
            backend: self.backend as Ptr,
            tensor_id: self.tensor_id,
        }
    }
}

/// The return addresses of the `ggml_barrier` calls that follow nodes in ggml's graph loops,
/// learned (see [`Worker::barrier_follows_node`]): two per ggml copy, 0 where none yet. With
/// more copies than this holds, a node whose function is not wrapped ends its shares at its
/// first barrier, as before the sites were known.
static AFTER_NODE_SITES: [AtomicUsize; 8] = [const { AtomicUsize::new(0) }; 8];

/// Adds `site` to [`AFTER_NODE_SITES`] unless it is there or the table is full; a load only,
/// once it is there (every node), so that threads do not write the line they all read.
fn learn_after_node_site(site: usize) {
    for slot in &AFTER_NODE_SITES {
        match slot.load(Ordering::Relaxed) {
            known if known == site => return,
            0 => match slot.compare_exchange(0, site, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => return,
                Err(known) if known == site => return,
                Err(_) => {}
            },
            _ => {}
        }
    }
}

/// Entries of a thread's op-info cache (a power of two).
const INFOS: usize = 256;

/// Mixed into a fused call's fingerprint: its info is not its last node's.
const FUSED: u64 = 0x5EED_F05E_D000_0001;

impl Worker {
    /// The op info of `tensor`, from this thread's cache while its fingerprint is unchanged.
    ///
    /// # Safety
    /// `tensor` is a live node of the copy `h` belongs to.
    unsafe fn node_info(&self, h: &Helpers, r: &Recorder, tensor: Ptr) -> OpInfo {
        // SAFETY: per the contract.
        let print = unsafe { tensor::fingerprint(h, tensor) };
        // SAFETY: per the contract.
        self.cached(r, tensor, print, || unsafe {
            node_info(h, r, tensor, std::ptr::null_mut())
        })
    }

    /// [`Worker::node_info`] of a fused call that computed `first` and then `last`.
    ///
    /// # Safety
    /// Both are live nodes of the copy `h` belongs to.
    unsafe fn fused_node_info(&self, h: &Helpers, r: &Recorder, first: Ptr, last: Ptr) -> OpInfo {
        // SAFETY: per the contract.
        let print = unsafe { tensor::fingerprint(h, last).zip(tensor::fingerprint(h, first)) }
            .map(|(last, first)| last ^ first.rotate_left(17) ^ FUSED);
        // SAFETY: per the contract.
        self.cached(r, last, print, || unsafe { fused_info(h, r, first, last) })
    }

    /// The op-info cache entry of `tensor`.
    fn info_slot(&self, tensor: Ptr) -> &Cell<CachedInfo> {
        &self.infos[(tensor as usize >> 4).wrapping_mul(0x9E37_79B9) % INFOS]
    }

    /// Asks the CPU for `tensor`'s op-info cache entry ahead of its use (a hint): the op computed
    /// since the entry's last use has usually pushed it out of the caches, and its load was the
    /// slowest step of a share (perf samples at `-t 2`).
    fn prefetch_info(&self, tensor: Ptr) {
        prefetch(self.info_slot(tensor).as_ptr());
    }

    /// When this thread's share of a node ends: asks for what the next share will read first,
    /// while ggml's barrier runs (a wait, with several threads): the entry of the node that
    /// followed last time and its tensor's name, and the dispatcher's marker's call-site entry
    /// and route.
    fn prefetch_next(&self) {
        let next = self.next_tensor.get();
        if next != 0 {
            self.prefetch_info(next as Ptr);
            let name = (next as *const u8).wrapping_add(tensor::NAME_AT);
            prefetch(name);
            prefetch(name.wrapping_add(tensor::NAME_FIELD - 1));
        }
        let (set, resolved) = self.marker_lines.get();
        prefetch(set as *const u8);
        prefetch(resolved as *const u8);
    }

    /// The cached op info of `tensor` while its fingerprint is `print`, else `describe`d (and
    /// cached when there is a fingerprint). The entry learns that this node followed the one
    /// before, and tells which one followed this node last time.
    fn cached(
        &self,
        r: &Recorder,
        tensor: Ptr,
        print: Option<u64>,
        describe: impl FnOnce() -> OpInfo,
    ) -> OpInfo {
        let Some(print) = print else {
            return describe();
        };
        let slot = self.info_slot(tensor);
        let before = self.last_info.replace(slot.as_ptr());
        if !before.is_null() {
            // SAFETY: an entry of this thread's own cache (`last_info` holds nothing else); a
            // store to one field, so that the entry's line is not waited for.
            unsafe { (*before).next = tensor as usize };
        }
        let recorder = r as *const Recorder as usize;
        let entry = slot.get();
        if (entry.tensor, entry.print, entry.recorder) == (tensor as usize, print, recorder) {
            self.next_tensor.set(entry.next);
            return entry.op();
        }
        self.next_tensor.set(0);
        let op = describe();
        slot.set(CachedInfo {
            tensor: tensor as usize,
            print,
            recorder,
            next: 0,
            op_size: op.op_size,
            backend: op.backend as usize,
            op_type: op.op_type,
            tensor_id: op.tensor_id,
        });
        op
    }
}

/// Asks the CPU to bring the cache line of `p` closer (a hint, which never faults).
fn prefetch<T>(p: *const T) {
    use core::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
    // SAFETY: a prefetch reads nothing and cannot fault, whatever the address.
    unsafe { _mm_prefetch::<_MM_HINT_T0>(p.cast()) }
}

/// Sets of a thread's call-site cache (a power of two), and the entries of each: 512 in all,
/// for the ~150 sites a llama.cpp run calls through (64 direct-mapped entries, which sites
/// shared, missed one call in ten).
const SITE_SETS: usize = 128;
const SITE_WAYS: usize = 4;
/// A key's set: the top bits of its product with this odd constant.
const SITE_MIX: u64 = 0x9E37_79B9_7F4A_7C15;
const SITE_SET_SHIFT: u32 = 64 - SITE_SETS.trailing_zeros();

impl Worker {
    /// The set of this thread's call-site cache for `row` called from `site`, and its key.
    fn site_set(&self, row: usize, site: usize) -> (&[SiteSlot; SITE_WAYS], usize) {
        let key = site ^ (row << 48);
        let set = (key as u64).wrapping_mul(SITE_MIX) >> SITE_SET_SHIFT;
        (&self.sites[set as usize], key)
    }

    /// The real function of `row` called from `site`, if this thread has resolved it before.
    fn cached_site(&self, row: usize, site: usize) -> Option<&'static Resolved> {
        let (set, key) = self.site_set(row, site);
        set.iter().find_map(|slot| match slot.get() {
            SiteEntry {
                key: k,
                resolved: Some(resolved),
            } if k == key => Some(resolved),
            _ => None,
        })
    }

    /// The real function of `row` (named `name`) called from `site`, resolved and cached in its
    /// set's first entry (the others move down one, the last is forgotten).
    fn resolve_site(
        &self,
        row: usize,
        name: &'static CStr,
        site: usize,
    ) -> Option<&'static Resolved> {
        let (resolved, _) = resolve_callee(Callee::Cpu(row as u8, name), site)?;
        let (set, key) = self.site_set(row, site);
        for way in (1..SITE_WAYS).rev() {
            set[way].set(set[way - 1].get());
        }
        set[0].set(SiteEntry {
            key,
            resolved: Some(resolved),
        });
        Some(resolved)
    }

    fn this_thread(&self) -> ThisThread {
        match self.thread.get() {
            Some(thread) => thread,
            None => {
                let thread = ThisThread::get();
                self.thread.set(Some(thread));
                thread
            }
        }
    }

    /// Opens this thread's share of the node of `op`; `computed` when the call that opens it
    /// computes the node (a per-op call, not the marker).
    fn open_node(&self, op: OpInfo, r: &'static Recorder, computed: bool) {
        self.open_tensor.set(op.tensor as usize);
        self.node_computed.set(computed);
        self.node.set(Some((op, r)));
    }

    fn take_node(&self) -> Option<(OpInfo, &'static Recorder)> {
        self.open_tensor.set(0);
        self.node.take()
    }

    /// Whether a `ggml_barrier` called at depth 0 from `site` follows the node this thread's
    /// share is open for (ggml's graph loop has one after each node and one after the last),
    /// and so ends the share, or lies inside the node's op, in a function no wrapper reaches:
    /// `mul_mat_id` (MoE models' experts) is static in ggml-cpu.c and waits for its threads
    /// once they have converted its input, before its products. A barrier after a computed call
    /// follows the node; its site is learned, for the nodes whose function is not wrapped.
    fn barrier_follows_node(&self, site: usize) -> bool {
        if self.open_tensor.get() == 0 {
            return false;
        }
        if self.node_computed.get() {
            learn_after_node_site(site);
            return true;
        }
        site != 0
            && AFTER_NODE_SITES
                .iter()
                .any(|known| known.load(Ordering::Relaxed) == site)
    }

    /// Whether a call of OpenMP's barrier is ggml's: not inside our `ggml_barrier` wrapper's call
    /// (whose wait is open), and after or inside a node (see [`Kind::OmpBarrier`]). `common`'s
    /// fast path asks the same.
    fn omp_barrier_is_ggmls(&self) -> bool {
        self.barrier_start.get() == 0 && (self.depth.get() > 0 || self.open_tensor.get() != 0)
    }

    /// Whether a call of a function of `kind` computes the node this thread's share is open
    /// for: the dispatcher's per-op call for the node its marker began.
    fn continues_node(&self, kind: Kind, arg1: Ptr, arg2: Ptr) -> bool {
        self.node
            .get()
            .is_some_and(|(open, _)| open.tensor == node_tensor(kind, arg1, arg2))
    }
}

thread_local! {
    static WORKER: Worker = const {
        Worker {
            depth: Cell::new(0),
            outer_site: Cell::new(0),
            node: Cell::new(None),
            open_tensor: Cell::new(0),
            node_computed: Cell::new(false),
            passthrough: Cell::new(false),
            ith: Cell::new(0),
            nth: Cell::new(0),
            barrier_start: Cell::new(0),
            thread: Cell::new(None),
            sites: [const {
                [const {
                    Cell::new(SiteEntry {
                        key: 0,
                        resolved: None,
                    })
                }; SITE_WAYS]
            }; SITE_SETS],
            infos: [const { Cell::new(CachedInfo::EMPTY) }; INFOS],
            last_info: Cell::new(std::ptr::null_mut()),
            next_tensor: Cell::new(0),
            marker_lines: Cell::new((0, 0)),
        }
    };
}

/// What [`enter`] tells `common`: the real function (0: none), and this thread's [`Worker`] for
/// after the call (its depth down, or [`exit`] after a barrier wait; null: nothing to do after
/// the call, which then returns straight to its caller).
#[repr(C)]
struct Next {
    real: usize,
    worker: *const Worker,
}

impl Next {
    fn untraced(real: usize) -> Next {
        Next {
            real,
            worker: std::ptr::null(),
        }
    }
}

/// Before the real function: records what begins. `WORKER` is const-initialized and has no
/// destructor, so reaching it cannot fail; what can (resolving a call site, recording) runs in
/// [`contained`], which a call nested in an op, or the dispatcher's per-op call for the node its
/// marker began, does not need.
extern "C" fn enter(row: usize, arg0: Ptr, arg1: Ptr, arg2: Ptr, site: usize) -> Next {
    let Some(f) = FUNCTIONS.get(row) else {
        return Next::untraced(0);
    };
    // SAFETY: the thread's own `WORKER`, which lives as long as the thread: longer than this
    // call, the only place the reference is used (as in `exit`). Taking it out of `with`
    // keeps the arguments in registers instead of a closure's captures.
    let w = WORKER.with(|w| unsafe { &*(w as *const Worker) });
    let site = if site == 0 { w.outer_site.get() } else { site };
    let resolved = match w.cached_site(row, site) {
        Some(resolved) => resolved,
        None => match contained(|| w.resolve_site(row, f.name, site)) {
            Some(Some(resolved)) => resolved,
            Some(None) => {
                say_no_function(f.name);
                return Next::untraced(0);
            }
            // Our code failed: the call still goes to ggml, untraced.
            None => {
                return Next::untraced(
                    fallback_callee(Callee::Cpu(row as u8, f.name)).map_or(0, |r| r.real),
                );
            }
        },
    };
    if resolved.untraced {
        return Next::untraced(resolved.real);
    }
    if !threads_timed(w) {
        return Next::untraced(resolved.real);
    }
    // From now on `common` may take its fast path on this thread (op timing off leaves the
    // slot empty, and every call the slow path after three instructions).
    set_worker_slot(w);
    let worker = Next {
        real: resolved.real,
        worker: w as *const Worker,
    };
    if f.kind == Kind::OmpBarrier && !w.omp_barrier_is_ggmls() {
        return Next::untraced(resolved.real);
    }
    if matches!(f.kind, Kind::Barrier | Kind::OmpBarrier) {
        return if timed_wait(w, site) {
            worker
        } else {
            Next::untraced(resolved.real)
        };
    }
    let depth = w.depth.get();
    w.depth.set(depth + 1);
    if depth == 0 {
        outermost_call(w, f.kind, resolved, site, [arg0, arg1, arg2]);
    }
    worker
}

/// Whether calls are timed per thread now. When not (op timing off or by the eval callback, or
/// not tracing), there is nothing to keep, but a share left open when that began is ended; and
/// where nothing will be timed for the rest of the process, the thread's calls go straight to
/// ggml from now on.
fn threads_timed(w: &Worker) -> bool {
    if record::thread_ops().is_some() {
        return true;
    }
    if w.depth.get() == 0 && w.node.get().is_some() {
        contained(|| end_node(w));
    } else if w.depth.get() == 0 && record::thread_ops_never() {
        w.passthrough.set(true);
        set_worker_slot(w);
    }
    false
}

/// A timed call at depth 0 (the depth already counts it): its site stands in for tail calls
/// from inside it, and unless it continues the node this thread's share is open for, a share
/// begins.
fn outermost_call(w: &Worker, kind: Kind, resolved: &Resolved, site: usize, args: [Ptr; 3]) {
    w.outer_site.set(site);
    if !w.continues_node(kind, args[1], args[2]) {
        contained(|| node_begins(w, kind, resolved.helpers, args[0], args[1], args[2]));
    } else if kind != Kind::Marker {
        w.node_computed.set(true);
    }
}

/// `common`'s fast path at the dispatcher's marker (`ggml_cpu_extra_compute_forward(params,
/// node)`) at depth 0, from a site this thread resolved before: what [`enter`] would do, less
/// the depth, which `common` takes up around the call when this says the call is timed.
extern "C" fn begin_share(
    worker: *const Worker,
    site: usize,
    resolved: *const Resolved,
    params: Ptr,
    node: Ptr,
    row: usize,
) -> bool {
    // SAFETY: `common` passes this thread's own `WORKER` (from its TLS slot), which lives as
    // long as the thread, and only this thread uses it; and a `Resolved` from its call-site
    // cache, leaked and never freed.
    let (w, resolved) = unsafe { (&*worker, &*resolved) };
    w.prefetch_info(node);
    let (set, _) = w.site_set(row, site);
    w.marker_lines
        .set((set.as_ptr() as usize, resolved as *const Resolved as usize));
    if !threads_timed(w) {
        return false;
    }
    outermost_call(
        w,
        Kind::Marker,
        resolved,
        site,
        [params, node, std::ptr::null_mut()],
    );
    true
}

/// `common`'s fast path at a barrier of one thread, called from `site` with a share open: the
/// share ends if the barrier follows its node (what [`enter`] would do there, whether or not
/// per-thread timing goes on).
extern "C" fn end_share(worker: *const Worker, site: usize) {
    // SAFETY: `common` passes this thread's own `WORKER` (from its TLS slot), which lives as
    // long as the thread, and only this thread uses it.
    let w = unsafe { &*worker };
    if w.barrier_follows_node(site) {
        contained(|| end_node(w));
    }
}

/// `common`'s fast path at a barrier of several threads, called from `site`: what [`enter`]
/// would do there (the share ends if the barrier follows its node; the wait begins if it is
/// recorded, and then [`exit`] follows the call).
extern "C" fn wait_begins(worker: *const Worker, site: usize) -> bool {
    // SAFETY: `common` passes this thread's own `WORKER` (from its TLS slot), which lives as
    // long as the thread, and only this thread uses it.
    let w = unsafe { &*worker };
    threads_timed(w) && timed_wait(w, site)
}

/// A barrier call from `site` while threads are timed: whether its wait is recorded.
fn timed_wait(w: &Worker, site: usize) -> bool {
    contained(|| barrier_begins(w, site)) == Some(true)
}

/// After a recorded barrier wait, on the thread whose `worker` [`enter`] returned (after any
/// other call, `common` itself takes the depth down).
extern "C" fn exit(worker: *const Worker) {
    // SAFETY: `enter` returned this thread's own `WORKER` (thread-local storage lives as long as
    // the thread, which is still in the call), and only this thread uses it.
    let w = unsafe { &*worker };
    contained(|| barrier_ends(w));
}

/// An outermost per-op call (or the dispatcher's marker) on this thread for another node than
/// the one its share is open for.
fn node_begins(w: &Worker, kind: Kind, h: &'static Helpers, params: Ptr, arg1: Ptr, arg2: Ptr) {
    let tensor = node_tensor(kind, arg1, arg2);
    end_node(w);
    let Some(r) = record::thread_ops() else {
        return;
    };
    if tensor.is_null() || params.is_null() {
        return;
    }
    // SAFETY: `params` is ggml's `struct ggml_compute_params *` for this call, which starts
    // with `int ith, nth`.
    let (ith, nth) = unsafe { (*(params as *const i32), *(params as *const i32).add(1)) };
    if !(0..=65536).contains(&nth) || ith < 0 || ith >= nth {
        static SAID: AtomicBool = AtomicBool::new(false);
        say_once(
            &SAID,
            format_args!(
                "this ggml's compute params do not start with the thread index and count \
                 (read {ith} of {nth}); per-thread op timing stops, nodes are timed with the \
                 scheduler's eval callback from the next graph on"
            ),
        );
        r.threads_mode_failed();
        return;
    }
    w.ith.set(ith as u32);
    w.nth.set(nth as u32);
    // SAFETY: `tensor` is the node this call of the copy `h` belongs to computes: live.
    let op = unsafe {
        if kind == Kind::Fused {
            w.fused_node_info(h, r, arg1, arg2)
        } else {
            w.node_info(h, r, tensor)
        }
    };
    record::thread_op(w.this_thread(), r, true, &op);
    w.open_node(op, r, kind != Kind::Marker);
}

/// A graph compute returned on this thread: a share still open here ends with it. ggml's graph
/// loop ends each share at its barrier after the node, but where the compiler inlined that
/// barrier into the loop (a ggml linked into the executable), a graph of one thread calls none,
/// and its last node's share would run on into the next graph compute.
pub fn graph_compute_returned() {
    WORKER.with(|w| {
        if w.depth.get() == 0 {
            contained(|| end_node(w));
        }
    });
}

/// The node a call of a function of `kind` computes (its last, for a fused call).
fn node_tensor(kind: Kind, arg1: Ptr, arg2: Ptr) -> Ptr {
    match kind {
        Kind::Third | Kind::Fused => arg2,
        _ => arg1,
    }
}

/// Ends this thread's open share of a node, if any: when it was recorded ending, in ticks.
fn end_node(w: &Worker) -> Option<u64> {
    let (op, r) = w.take_node()?;
    w.prefetch_next();
    record::active()
        .is_some_and(|a| std::ptr::eq(a, r))
        .then(|| record::thread_op(w.this_thread(), r, false, &op))
}

/// The op info of a fused call that computed `first` and then `last`: the last node's, with
/// both ops in its name (`RMS_NORM+MUL`) and under a tensor-info key of its own.
///
/// # Safety
/// Both are live nodes of the copy `h` belongs to.
unsafe fn fused_info(h: &Helpers, r: &Recorder, first: Ptr, last: Ptr) -> OpInfo {
    // SAFETY: per the contract.
    let (mut op, first_key) = unsafe {
        (
            node_info(h, r, last, std::ptr::null_mut()),
            tensor::identity(h, first).0,
        )
    };
    // SAFETY: per the contract.
    let (last_key, _) = unsafe { tensor::identity(h, last) };
    op.tensor_id = r.tensor_id(last_key ^ first_key.rotate_left(17) | 1, || {
        // SAFETY: per the contract.
        unsafe { read_tensor(h, last, Some(first)) }
    });
    op
}

/// A barrier called from `site`: whether its wait is recorded (else nothing is to be done when
/// it ends).
fn barrier_begins(w: &Worker, site: usize) -> bool {
    // The node before this barrier is done, on this thread, unless the barrier is inside its
    // op: a call nested in its per-op function, or one from a function no wrapper reaches.
    let ended = if w.depth.get() == 0 && w.barrier_follows_node(site) {
        end_node(w)
    } else {
        None
    };
    let recorded = w.nth.get() > 1 && record::thread_ops().is_some();
    // The wait begins when the share ends (one clock read for both).
    w.barrier_start.set(if recorded {
        ended.unwrap_or_else(clock::now_ticks)
    } else {
        0
    });
    recorded
}

fn barrier_ends(w: &Worker) {
    let start = w.barrier_start.replace(0);
    if start != 0
        && let Some(r) = record::thread_ops()
    {
        record::barrier_wait(
            w.this_thread(),
            r,
            std::ptr::null_mut(),
            w.ith.get(),
            w.nth.get(),
            start,
        );
    }
}
