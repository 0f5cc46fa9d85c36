//! Timestamps: nanoseconds since the Unix epoch that never go backwards within a thread.
//!
//! The producer reads a raw tick counter, the cheapest clock there is: on x86-64 the TSC, when
//! the kernel itself keeps time with it (its clocksource is `tsc`, which it only is when the TSC is
//! invariant and synchronized); anywhere else `CLOCK_MONOTONIC`, whose ticks are nanoseconds. The
//! flusher turns ticks into nanoseconds with [`TickConverter`]: piecewise linear through
//! (ticks, `CLOCK_MONOTONIC`) pairs it reads at every flush, offset by one realtime reading taken
//! at start. Measured here: `clock_gettime` costs ~30 ns in this VM, `rdtsc` ~11 ns.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};

use super::os::{monotonic_ns, realtime_ns};

/// Realtime minus monotonic, read once.
fn epoch_offset() -> u64 {
    static OFFSET: OnceLock<u64> = OnceLock::new();
    *OFFSET.get_or_init(|| realtime_ns().wrapping_sub(monotonic_ns()))
}

/// Whether ticks are TSC cycles (else they are monotonic nanoseconds).
fn ticks_are_tsc() -> bool {
    static TSC: OnceLock<bool> = OnceLock::new();
    *TSC.get_or_init(|| {
        let tsc = cfg!(target_arch = "x86_64")
            && std::fs::read_to_string(
                "/sys/devices/system/clocksource/clocksource0/current_clocksource",
            )
            .is_ok_and(|s| s.trim() == "tsc");
        RDTSC_TICKS.store(tsc, Ordering::Relaxed);
        tsc
    })
}

/// Ticks are known to be read with `rdtsc` (set once [`now_ticks`] knows): where the
/// per-thread trampoline's assembly reads the clock itself, it does so only then, and so does
/// [`now_ticks`] on its fast path (one load, where the `OnceLock` took two).
pub static RDTSC_TICKS: AtomicBool = AtomicBool::new(false);

/// Now, in ticks. The producer's clock.
#[inline]
pub fn now_ticks() -> u64 {
    #[cfg(target_arch = "x86_64")]
    if RDTSC_TICKS.load(Ordering::Relaxed) || ticks_are_tsc() {
        // SAFETY: rdtsc has no preconditions on x86-64.
        return unsafe { core::arch::x86_64::_rdtsc() };
    }
    monotonic_ns()
}

/// Now, in nanoseconds since the Unix epoch (for the writer's own records).
pub fn now_ns() -> u64 {
    monotonic_ns().wrapping_add(epoch_offset())
}

/// A `CLOCK_MONOTONIC` time (a device's, calibrated against it) in nanoseconds since the Unix
/// epoch, as [`TickConverter`] puts ticks there.
pub fn monotonic_epoch_ns(monotonic: u64) -> u64 {
    monotonic.wrapping_add(epoch_offset())
}

/// Reads the settings the clocks depend on, so that the first event pays nothing for them.
pub fn init() {
    epoch_offset();
    ticks_are_tsc();
}

/// Converts ticks to nanoseconds since the epoch. Owned by the flusher.
///
/// Between calibrations the conversion is the line through the last two (ticks,
/// `CLOCK_MONOTONIC`) points: events stamped before the latest point, which are the ones drained
/// after it, are interpolated. A new point can move the line down, below what was already
/// extrapolated for events stamped after the previous point, so each thread's conversions are
/// kept at least at its own latest one (`floor`, one per thread): a thread's events, drained in
/// order, never go backwards across flushes, and nothing moves another thread's events (a worker's
/// events drained in one flush and the main thread's earlier one in the next keep their order).
#[derive(Debug)]
pub struct TickConverter {
    /// Ticks are TSC cycles (else monotonic nanoseconds, converted by an offset alone).
    tsc: bool,
    /// The last two calibration points, (ticks, monotonic ns).
    previous: (u64, u64),
    latest: (u64, u64),
    /// Nanoseconds per tick between them, in units of 2^-32 ns (1 ns for nanosecond ticks, and
    /// until two points exist): integer arithmetic per event instead of two conversions to and
    /// from `f64`; truncating the slope costs under 1 ns per 2^32 ticks (a second or more of TSC).
    slope: u64,
    /// Realtime minus monotonic ([`epoch_offset`]), kept here: read per event, without the
    /// once-lock's check.
    epoch: u64,
}

/// [`TickConverter::slope`]'s unit: 2^-`SLOPE_BITS` ns.
const SLOPE_BITS: u32 = 32;

impl TickConverter {
    pub fn new() -> TickConverter {
        TickConverter::starting_at(calibration_point(), ticks_are_tsc())
    }

    fn starting_at(point: (u64, u64), tsc: bool) -> TickConverter {
        TickConverter {
            tsc,
            previous: point,
            latest: point,
            slope: 1 << SLOPE_BITS,
            epoch: epoch_offset(),
        }
    }

    /// Takes a new calibration point; call before draining events.
    pub fn recalibrate(&mut self) {
        self.calibrate_at(calibration_point());
    }

    fn calibrate_at(&mut self, point: (u64, u64)) {
        if point.0 > self.latest.0 && point.1 > self.latest.1 {
            self.previous = self.latest;
            self.latest = point;
            let ((t0, m0), (t1, m1)) = (self.previous, self.latest);
            if self.tsc {
                let slope = (u128::from(m1 - m0) << SLOPE_BITS) / u128::from(t1 - t0);
                self.slope = u64::try_from(slope).unwrap_or(u64::MAX);
            }
        }
    }

    /// A tick reading of the thread whose latest conversion is `floor` (updated) as nanoseconds
    /// since the Unix epoch.
    pub fn convert_epoch_ns(&self, ticks: u64, floor: &mut u64) -> u64 {
        self.convert_monotonic_ns(ticks, floor)
            .wrapping_add(self.epoch)
    }

    fn convert_monotonic_ns(&self, ticks: u64, floor: &mut u64) -> u64 {
        if !self.tsc {
            return ticks;
        }
        let (t1, m1) = self.latest;
        let line = if ticks >= t1 {
            m1.saturating_add(self.to_ns(ticks - t1))
        } else {
            m1.saturating_sub(self.to_ns(t1 - ticks))
        };
        let mono = line.max(*floor);
        *floor = mono;
        mono
    }

    /// A tick interval as nanoseconds: in 64 bits where the product fits (an interval of up to
    /// a few seconds of TSC, as every event's from its flush's calibration point), else in 128.
    #[inline]
    pub fn to_ns(&self, ticks: u64) -> u64 {
        match ticks.checked_mul(self.slope) {
            Some(product) => product >> SLOPE_BITS,
            None => self.to_ns_wide(ticks),
        }
    }

    /// [`TickConverter::to_ns`] of a long interval.
    #[cold]
    fn to_ns_wide(&self, ticks: u64) -> u64 {
        let ns = (u128::from(ticks) * u128::from(self.slope)) >> SLOPE_BITS;
        u64::try_from(ns).unwrap_or(u64::MAX)
    }
}

impl Default for TickConverter {
    fn default() -> Self {
        TickConverter::new()
    }
}

/// (ticks, monotonic ns) read together: the clock read between two tick readings, the pair of
/// the tightest of a few tries taken (a thread preempted between its readings would pair times
/// milliseconds apart, and bend the conversion's line through a wrong point).
fn calibration_point() -> (u64, u64) {
    let mut best = (u64::MAX, (0, 0));
    for _ in 0..4 {
        let before = now_ticks();
        let ns = monotonic_ns();
        let after = now_ticks();
        let spread = after.saturating_sub(before);
        if spread < best.0 {
            best = (spread, (before + spread / 2, ns));
        }
    }
    best.1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_convert_close_to_the_realtime_clock() {
        let mut conv = TickConverter::new();
        std::thread::sleep(std::time::Duration::from_millis(30));
        conv.recalibrate();
        let mut floor = 0;
        let converted = conv.convert_epoch_ns(now_ticks(), &mut floor);
        let real = realtime_ns();
        let diff = converted.abs_diff(real);
        assert!(
            diff < 2_000_000,
            "converted clock is {diff} ns off realtime"
        );
        let a = conv.convert_epoch_ns(now_ticks(), &mut floor);
        let b = conv.convert_epoch_ns(now_ticks(), &mut floor);
        assert!(b >= a);
    }

    /// A later calibration point below the line extrapolated from the earlier ones: events after
    /// it must not come out earlier than events of the same thread converted before it.
    #[test]
    fn a_lower_calibration_point_never_moves_a_thread_backwards() {
        let mut conv = TickConverter::starting_at((0, 0), true);
        conv.calibrate_at((1_000, 1_000)); // 1 ns per tick
        let mut floor = 0;
        // Flush 1 drains a thread's events stamped after its calibration point: extrapolated.
        let first: Vec<u64> = [1_200, 1_500]
            .iter()
            .map(|&t| conv.convert_monotonic_ns(t, &mut floor))
            .collect();
        assert_eq!(first, [1_200, 1_500]);
        // Flush 2 calibrates: the clock ran slower than extrapolated (1,600 ticks = 1,400 ns).
        conv.calibrate_at((1_600, 1_400));
        let second: Vec<u64> = [1_550, 1_580, 1_700, 2_000]
            .iter()
            .map(|&t| conv.convert_monotonic_ns(t, &mut floor))
            .collect();
        let all: Vec<u64> = first.iter().chain(&second).copied().collect();
        assert!(all.is_sorted(), "went backwards: {all:?}");
        // Past the floor, the new line is followed again: (1,600, 1,400) and 2/3 ns per tick.
        assert_eq!(second[3], 1_400 + 400 * 2 / 3);
        // Without a TSC, ticks are nanoseconds already.
        let plain = TickConverter::starting_at((5, 5), false);
        assert_eq!(plain.convert_monotonic_ns(1_234, &mut 0), 1_234);
    }

    /// The slope's fixed point keeps conversions exact to the nanosecond far from the last
    /// calibration point: a 3 GHz TSC, seconds past it, against the exact rational line; past
    /// 2^32 ticks within what the truncated slope allows, a nanosecond more per 2^32 ticks (ten
    /// seconds on, where the product takes 128 bits: 2 ns).
    #[test]
    fn conversions_far_from_the_calibration_point_stay_within_a_nanosecond() {
        let mut conv = TickConverter::starting_at((1_000, 5_000), true);
        let (t1, m1) = (1_000 + 3_000_000_007, 5_000 + 1_000_000_003);
        conv.calibrate_at((t1, m1));
        for ticks in [
            t1 + 1,
            t1 + 2_999_999_999,
            t1 + 9_000_000_123,
            // Ten seconds on: the product is past 64 bits.
            t1 + 30_000_000_021,
            t1 - 2_000_000_001,
        ] {
            let exact = |dt: u64| u128::from(dt) * 1_000_000_003 / 3_000_000_007;
            let want = if ticks >= t1 {
                u128::from(m1) + exact(ticks - t1)
            } else {
                u128::from(m1) - exact(t1 - ticks)
            };
            let got = conv.convert_monotonic_ns(ticks, &mut 0);
            let truncated = u128::from(ticks.abs_diff(t1) >> 32);
            assert!(
                u128::from(got).abs_diff(want) <= 1 + truncated,
                "{ticks} ticks: {got} ns, exactly {want}"
            );
        }
    }

    /// Events are drained a ring at a time: a worker's events stamped after the main thread's
    /// can be converted in one flush and the main thread's earlier one in the next, after a new
    /// calibration point. One thread's floor does not move another's events: the earlier tick
    /// stays earlier (before: one floor for all threads moved it past the worker's).
    #[test]
    fn an_earlier_event_drained_a_flush_later_stays_earlier() {
        let mut conv = TickConverter::starting_at((0, 0), true);
        conv.calibrate_at((1_000, 1_000));
        let (mut worker_floor, mut main_floor) = (0, 0);
        // Flush 1 drains a worker's events, stamped at 1,200 and 1,500 ticks.
        let worker = [1_200, 1_500].map(|t| conv.convert_monotonic_ns(t, &mut worker_floor));
        // Flush 2 calibrates, then drains the main thread's event stamped at 1,100 ticks.
        conv.calibrate_at((1_600, 1_600));
        let main = conv.convert_monotonic_ns(1_100, &mut main_floor);
        assert!(main < worker[0], "{main} is not before {worker:?}");
        assert_eq!(main, 1_100);
    }
}
