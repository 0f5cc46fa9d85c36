//! Figures computed from a trace's events: counts and durations in one pass ([`stats`]),
//! durations bucketed for their quantiles ([`histogram`]),
//! per-op timings ([`op_timings`]: threads' shares joined into the nodes of [`nodes`]), their
//! groups ([`op_groups`]), changes between runs ([`op_change`]), how they were timed ([`timing_mode`]), how busy each GPU was
//! ([`device_use`]) and what the backend buffers held ([`memory`]); spans aggregated per name and
//! category ([`summary`]); ggml-rpc clients and servers joined across traces, with their clock
//! offsets ([`rpc_join`]).

pub mod device_use;
pub mod histogram;
pub mod memory;
pub mod nodes;
pub mod op_change;
pub mod op_groups;
pub mod op_timings;
pub mod rpc_join;
pub mod stats;
pub mod summary;
pub mod timing_mode;
