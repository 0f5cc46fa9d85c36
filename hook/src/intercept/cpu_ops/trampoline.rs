//! The exported wrappers, made from [`table`](super::table)'s list, and the one trampoline they
//! all jump to: its fast path in assembly, its slow path through [`enter`] (OpenMP's barrier's
//! wrapper through a check of its own first, [`omp_barrier`]).

use std::ffi::{CStr, c_void};

use super::shares::{
    begin_share, end_share, exit, outermost_call, threads_timed, timed_wait, wait_begins, waited,
};
use super::worker::{
    Kind, SITE_MIX, SITE_SET_SHIFT, SITE_WAYS, SiteEntry, SiteSlot, WORKER, Worker, set_worker_slot,
};
use crate::base::{clock, contained};
use crate::intercept::route::{Callee, Resolved, fallback_callee};
use crate::intercept::start::say_no_function;
use crate::record;

type Ptr = *mut c_void;

struct Function {
    name: &'static CStr,
    kind: Kind,
    /// Our exported wrapper.
    wrapper: unsafe extern "C" fn(),
}

/// Defines the exported wrappers and the table [`FUNCTIONS`] from the list
/// [`table`](super::table) gives, so that each wrapper's number is its row.
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
                wrapper_jumps!($kind, $name)
            }
        )*
    };
}

/// A wrapper's body: its row in `r11`, then a jump to its trampoline ([`omp_barrier`] for
/// OpenMP's barrier, [`common`] for the others).
macro_rules! wrapper_jumps {
    (OmpBarrier, $name:ident) => {
        wrapper_jumps!(@to omp_barrier, $name)
    };
    ($kind:ident, $name:ident) => {
        wrapper_jumps!(@to common, $name)
    };
    (@to $trampoline:ident, $name:ident) => {
        core::arch::naked_asm!(
            "mov r11d, {index}",
            "jmp {trampoline}",
            index = const Index::$name as u8,
            trampoline = sym $trampoline,
        )
    };
}

with_cpu_functions!(cpu_functions);

/// Every wrapped function: its row, C name and our wrapper (for inline hooks on an executable's
/// own ggml).
pub fn wrapped() -> impl Iterator<Item = (u8, &'static CStr, *const ())> {
    FUNCTIONS
        .iter()
        .enumerate()
        .map(|(row, f)| (row as u8, f.name, f.wrapper as *const ()))
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

/// [`push_arguments`] for the dispatcher's marker, `ggml_cpu_extra_compute_forward(params,
/// node)`: its two arguments and `r10`.
macro_rules! push_marker_arguments {
    () => {
        "push rdi\npush rsi\npush r10\nsub rsp, 8"
    };
}

/// The registers [`push_marker_arguments`] pushed, back as they were.
macro_rules! pop_marker_arguments {
    () => {
        "add rsp, 8\npop r10\npop rsi\npop rdi"
    };
}

/// The TSC into `rax`, the argument register `rdx` (which `rdtsc` takes) kept through `r12`,
/// which `common` pushed.
macro_rules! read_tsc {
    () => {
        "mov r12, rdx\nrdtsc\nshl rdx, 32\nor rax, rdx\nmov rdx, r12"
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
/// ends this thread's share if one is open (after its computed node, stamping its end for the
/// next call into Rust to record, where ticks are the TSC; else through [`end_share`]); or of a
/// barrier of several, whose wait it stamps (ticks being the TSC) and [`waited`] records after
/// the call (else [`wait_begins`] and [`exit`] around it). (OpenMP's barrier called inside such a
/// timed wait does not get here: see [`omp_barrier`].) Anything else takes the slow path,
/// through [`enter`].
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
        // The site. A tail call from one of our own calls (after label 2 or 6 below) goes the
        // slow way, its site being the outermost call's: no entry has those labels for key
        // (entries are made for the sites `enter` is given), so its lookup misses.
        "mov r13, [rsp + 24]",
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
        // The entry found, kept in rax for the marker's call below (70), which passes it on.
        // (An entry whose key matched has its route: see SiteEntry.)
        "31:",
        "mov rax, r10",
        "mov r10, [r10 + {resolved}]",
        "cmp byte ptr [r10 + {untraced}], 0",
        "jne 20f",
        "mov r10, [r10 + {real}]",
        "test r10, r10",
        "jz 20f",
        "cmp byte ptr [rbx + {passthrough}], 0",
        "jne 51f",
        "lea r12, [rip + {kinds}]",
        "movzx r12d, byte ptr [r12 + r11]",
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
        "jne 55f",
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
        // A barrier of one thread with a share open, after its computed node, where ticks are
        // the TSC: the share ends now, stamped here with the barrier's site, and is recorded
        // at this thread's next call into Rust (settle); `open` says no share is open from now
        // on.
        "cmp byte ptr [rbx + {computed}], 0",
        "je 56f",
        "cmp byte ptr [rip + {rdtsc_ticks}], 0",
        "je 56f",
        read_tsc!(),
        "mov [rbx + {ended_at}], rax",
        "mov [rbx + {ended_site}], r13",
        "mov qword ptr [rbx + {open}], 0",
        "jmp 51f",
        // Else end_share(worker, site) ends it if the barrier follows its node, then ggml's
        // barrier, with the argument registers as they came (it takes no float).
        "56:",
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
        // A barrier of several threads, where ticks are the TSC: its wait begins now, stamped
        // here, ggml's barrier is called from here, and waited(worker, site) does after it what
        // wait_begins and exit do around it below (a barrier returns nothing; rax is kept all
        // the same).
        "52:",
        "cmp byte ptr [rip + {rdtsc_ticks}], 0",
        "je 57f",
        read_tsc!(),
        "mov [rbx + {barrier_start}], rax",
        "call r10",
        "mov r12, rax",
        "mov rdi, rbx",
        "mov rsi, r13",
        "call {waited}",
        "mov rax, r12",
        "pop r13",
        "pop r12",
        "pop rbx",
        "ret",
        // Else wait_begins(worker, site) ends the share if one is open and the barrier follows
        // its node, and says whether the wait is recorded; if so, ggml's barrier is called from
        // here and exit records the wait after it.
        "57:",
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
        // OpenMP's barrier inside a timed wait: its site and real function kept for the next
        // one (which omp_barrier sends straight on), then straight on.
        "55:",
        "mov [rbx + {omp_site}], r13",
        "mov [rbx + {omp_real}], r10",
        "jmp 51b",
        // The dispatcher's marker at depth 0: begin_share(worker, site, resolved, params,
        // node, entry) begins the share (as enter would) and says whether the call is timed: if
        // so the depth goes up around it, as for the per-op calls above. The marker takes two
        // arguments: only theirs are kept across the call.
        "70:",
        "cmp dword ptr [rbx + {depth}], 0",
        "jne 20f",
        push_marker_arguments!(),
        "mov rdx, [rax + {resolved}]",
        "mov rcx, rdi",
        "mov r8, rsi",
        "mov r9, rax",
        "mov rdi, rbx",
        "mov rsi, r13",
        "call {begin_share}",
        pop_marker_arguments!(),
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
        ended_at = const std::mem::offset_of!(Worker, ended_at),
        ended_site = const std::mem::offset_of!(Worker, ended_site),
        omp_site = const std::mem::offset_of!(Worker, omp_site),
        omp_real = const std::mem::offset_of!(Worker, omp_real),
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
        waited = sym waited,
        rdtsc_ticks = sym clock::RDTSC_TICKS,
    )
}

/// OpenMP's barrier's trampoline (its row in `r11`): called inside a `ggml_barrier` wait the
/// hook times, from the site the last such call came from, it goes straight on to where that
/// one went (see `Worker::omp_site`); any other call goes through [`common`]. Its own, so that
/// the other wrappers' calls pay nothing for the check.
///
/// # Safety
/// Entered only by the wrapper's `jmp`, with the caller's argument registers and stack intact.
#[unsafe(naked)]
unsafe extern "C" fn omp_barrier() {
    core::arch::naked_asm!(
        "mov rax, qword ptr [rip + ggml_viz_worker_slot@GOTTPOFF]",
        "mov rax, qword ptr fs:[rax]",
        "test rax, rax",
        "jz 2f",
        "cmp qword ptr [rax + {barrier_start}], 0",
        "je 2f",
        "mov r10, [rsp]",
        "cmp r10, [rax + {omp_site}]",
        "jne 2f",
        "jmp qword ptr [rax + {omp_real}]",
        "2:",
        "jmp {common}",
        common = sym common,
        barrier_start = const std::mem::offset_of!(Worker, barrier_start),
        omp_site = const std::mem::offset_of!(Worker, omp_site),
        omp_real = const std::mem::offset_of!(Worker, omp_real),
    )
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
    let Some(r) = threads_timed(w) else {
        return Next::untraced(resolved.real);
    };
    // From now on `common` may take its fast path on this thread (where nothing will ever be
    // timed, `threads_timed` has set it already, with `passthrough`).
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
        outermost_call(w, r, f.kind, resolved, site, [arg0, arg1, arg2]);
    }
    worker
}
