//! Timestamps: nanoseconds since the Unix epoch that never go backwards within a process.
//!
//! A monotonic clock, offset by one reading of the realtime clock taken at start. Reading either
//! clock is a vDSO call on Linux, not a system call.

use std::sync::OnceLock;

fn read(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; clock_gettime writes only it.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    (ts.tv_sec as u64)
        .wrapping_mul(1_000_000_000)
        .wrapping_add(ts.tv_nsec as u64)
}

static OFFSET: OnceLock<u64> = OnceLock::new();

/// Realtime minus monotonic, read once.
fn offset() -> u64 {
    *OFFSET.get_or_init(|| read(libc::CLOCK_REALTIME).wrapping_sub(read(libc::CLOCK_MONOTONIC)))
}

/// Now, in nanoseconds since the Unix epoch, monotone within the process.
#[inline]
pub fn now_ns() -> u64 {
    read(libc::CLOCK_MONOTONIC).wrapping_add(offset())
}

/// Fixes the offset now, so that the first event pays nothing for it.
pub fn init() {
    offset();
}
