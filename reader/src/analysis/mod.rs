//! Figures computed from a trace's events: counts and durations in one pass ([`stats`]) and
//! per-op timings ([`op_timings`]).

pub mod op_timings;
pub mod stats;
