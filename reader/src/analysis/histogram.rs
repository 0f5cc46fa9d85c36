//! Durations in buckets 1 % wide: bounded memory, quantiles within 1 %, for any number of
//! spans (summary rows, op groups, the live view's figures).

/// 1.01^k for every k whose power a 64-bit duration can reach (4460 of them: 1.01^4459 > 2^64).
static POWERS: [f64; 4460] = {
    let mut powers = [1.0; 4460];
    let mut k = 1;
    while k < powers.len() {
        powers[k] = powers[k - 1] * 1.01;
        k += 1;
    }
    powers
};

/// Bits after a duration's leading one that choose its cell: 128 cells per doubling, each less
/// than 1 % wide, so that at most one power of 1.01 lies inside a cell.
const CELL_BITS: u32 = 7;

/// The cell of `ns` > 0: its leading bit's position, then the [`CELL_BITS`] bits after it.
fn cell(ns: u64) -> usize {
    let zeros = ns.leading_zeros();
    let octave = 63 - zeros as usize;
    let next = ((ns << zeros) << 1) >> (64 - CELL_BITS);
    (octave << CELL_BITS) | next as usize
}

/// For each cell, the number of powers of 1.01 not above the cell's smallest duration.
static CELL_BUCKETS: [u16; 64 << CELL_BITS] = {
    let mut counts = [0u16; 64 << CELL_BITS];
    let mut c = 0;
    while c < counts.len() {
        let (octave, next) = ((c >> CELL_BITS) as u32, (c & ((1 << CELL_BITS) - 1)) as u64);
        // Below 2^CELL_BITS a cell holds one duration at most (cells no duration has are unused).
        let start = if octave >= CELL_BITS {
            ((1 << CELL_BITS) | next) << (octave - CELL_BITS)
        } else {
            (1 << octave) | (next >> (CELL_BITS - octave))
        };
        // Powers not above `start`: a binary search.
        let (mut lo, mut hi) = (0, POWERS.len());
        while lo < hi {
            let mid = (lo + hi) / 2;
            if POWERS[mid] <= start as f64 {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        counts[c] = lo as u16;
        c += 1;
    }
    counts
};

/// Durations in buckets 1 % wide: bounded memory, percentiles within 1 %.
#[derive(Clone, Debug, Default)]
pub struct Histogram {
    /// Spans per bucket, indexed by bucket (at most ~4460 of them for 64-bit durations).
    buckets: Vec<u64>,
    count: u64,
    min: u64,
    max: u64,
}

impl Histogram {
    /// 0 for 0; else 1 + floor(log_1.01(ns)): the number of powers 1.01^k (k ≥ 0) not above
    /// `ns`. The cell of `ns` (its leading bit and the next [`CELL_BITS`]) gives the count at the
    /// cell's start; one comparison with the power after it makes it exact: no logarithm per span.
    #[inline]
    fn bucket(ns: u64) -> usize {
        if ns == 0 {
            return 0;
        }
        let first = CELL_BUCKETS[cell(ns)] as usize;
        first + (first < POWERS.len() && POWERS[first] <= ns as f64) as usize
    }

    fn value(bucket: usize) -> u64 {
        if bucket == 0 {
            0
        } else {
            1.01f64.powi(bucket as i32 - 1).round() as u64
        }
    }

    fn add_to(&mut self, bucket: usize, n: u64) {
        if bucket >= self.buckets.len() {
            self.buckets.resize(bucket + 1, 0);
        }
        self.buckets[bucket] += n;
    }

    #[inline]
    pub fn add(&mut self, ns: u64) {
        self.add_to(Self::bucket(ns), 1);
        self.min = if self.count == 0 {
            ns
        } else {
            self.min.min(ns)
        };
        self.max = self.max.max(ns);
        self.count += 1;
    }

    /// Adds every duration of `other`.
    pub fn merge(&mut self, other: &Histogram) {
        if other.count == 0 {
            return;
        }
        for (b, &n) in other.buckets.iter().enumerate().filter(|(_, n)| **n > 0) {
            self.add_to(b, n);
        }
        self.min = if self.count == 0 {
            other.min
        } else {
            self.min.min(other.min)
        };
        self.max = self.max.max(other.max);
        self.count += other.count;
    }

    /// The shortest duration added (0 when none was).
    #[inline]
    pub fn min(&self) -> u64 {
        self.min
    }

    /// The longest duration added.
    #[inline]
    pub fn max(&self) -> u64 {
        self.max
    }

    #[inline]
    pub fn count(&self) -> u64 {
        self.count
    }

    /// The `q` quantile (nearest rank), clamped to the exact min and max.
    pub fn quantile(&self, q: f64) -> u64 {
        let rank = ((q * self.count as f64).ceil() as u64).clamp(1, self.count.max(1));
        if rank == self.count {
            return self.max;
        }
        if rank == 1 {
            return self.min;
        }
        let mut seen = 0;
        for (b, &n) in self.buckets.iter().enumerate() {
            seen += n;
            if seen >= rank {
                return Self::value(b).clamp(self.min, self.max);
            }
        }
        self.max
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The bucket found among the powers of 1.01 is the one the logarithm gives, away from the
    /// bucket edges (where rounding of either may differ), from 1 ns to the largest durations.
    #[test]
    fn buckets_agree_with_the_logarithm() {
        let mut ns = 1u64;
        let mut checked = 0;
        while ns < u64::MAX / 3 {
            let exact = (ns as f64).ln() / 1.01f64.ln();
            if (exact - exact.round()).abs() > 1e-6 {
                assert_eq!(Histogram::bucket(ns), 1 + exact as usize, "{ns}");
                checked += 1;
            }
            ns = ns + ns / 7 + 1;
        }
        assert!(checked > 200, "{checked}");
        assert_eq!(Histogram::bucket(0), 0);
        assert_eq!(Histogram::bucket(1), 1);
        assert!(Histogram::bucket(u64::MAX) <= POWERS.len());
        assert!(
            POWERS[POWERS.len() - 1] > u64::MAX as f64
                && POWERS[POWERS.len() - 2] < u64::MAX as f64
        );
    }

    /// Next to each power of 1.01 and between them: the bucket is the number of powers not above
    /// the duration, counted one by one.
    #[test]
    fn buckets_count_the_powers_not_above() {
        let counted = |ns: u64| POWERS.iter().take_while(|&&p| p <= ns as f64).count();
        let mut checked = 0;
        for &p in POWERS.iter().take_while(|&&p| p < 1e19) {
            let near = p as u64;
            for ns in [near.saturating_sub(1), near, near + 1, near + near / 300] {
                assert_eq!(Histogram::bucket(ns), counted(ns), "{ns}");
                checked += 1;
            }
        }
        for ns in (1..5000).chain([u64::MAX, u64::MAX - 1, 1 << 63, (1 << 53) + 1]) {
            assert_eq!(Histogram::bucket(ns), counted(ns), "{ns}");
        }
        assert!(checked > 4 * 4000, "{checked}");
    }

    #[test]
    fn histogram_quantiles_are_within_one_percent() {
        let mut h = Histogram::default();
        for ns in 1..=10_000u64 {
            h.add(ns * 1000);
        }
        let p50 = h.quantile(0.5) as f64;
        assert!((p50 / 5_000_000.0 - 1.0).abs() < 0.011, "{p50}");
        assert_eq!(h.quantile(1.0), 10_000_000);
    }
}
