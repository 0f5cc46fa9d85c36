//! Figures computed from a trace's events: counts and durations in one pass ([`stats`]),
//! per-op timings ([`op_timings`]) and how busy each GPU was ([`device_use`]).

pub mod device_use;
pub mod op_timings;
pub mod stats;
