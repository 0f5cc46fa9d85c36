//! The front ends: how calls get from the host program into the recording core.
//!
//! - [`exports`]: the exported trampolines and wrappers of ggml's entry points; each resolves
//!   the real function, records around it, and calls it exactly once;
//! - `in_place`: exports that leave a by-value struct in the caller's frame (x86-64 System V);
//! - [`route`]: finding the real function behind a wrapper, chosen once per OS;
//! - [`inline`] and [`install`]: inline hooks, for a ggml linked into the executable (Linux) and
//!   ggml's DLLs (Windows);
//! - `cuda`: NVIDIA's CUDA backend through CUPTI: the capture attribution is worked out on
//!   (Linux x86-64);
//! - `cpu_ops`: per-op timing on the CPU backend's worker threads (Linux x86-64);
//! - [`eval_callback`]: per-op timing through the scheduler's eval callback;
//! - [`batches`]: token counts of llama.cpp's opaque batches, for the decode spans;
//! - `rpc_transport`: ggml-rpc's transport, for the commands on both ends of a connection (Linux x86-64),
//!   and `rpc_names`, the names of its methods;
//! - [`start`]: start-up of tracing at the first wrapped call, shared by every front end;
//! - `vulkan`: a Vulkan layer that times the nodes ggml-vulkan labels on the device (built on
//!   every platform; `ggml-viz record` loads it on Linux, where it is tested).

mod batches;
#[cfg(all(target_os = "linux", target_arch = "x86_64"))]
pub mod cpu_ops;
#[cfg(all(target_os = "linux", target_arch = "x86_64"))]
mod cuda;
mod eval_callback;
pub mod exports;
#[cfg(all(target_arch = "x86_64", not(windows)))]
mod in_place;
#[cfg(any(target_os = "linux", windows))]
mod inline;
#[cfg(any(target_os = "linux", windows))]
mod install;
mod route;
#[cfg(all(target_os = "linux", target_arch = "x86_64"))]
mod rpc_names;
#[cfg(all(target_os = "linux", target_arch = "x86_64"))]
mod rpc_transport;
mod start;
mod vulkan;
