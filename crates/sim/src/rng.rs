//! A small seeded PRNG (splitmix64). Written here rather than taken from a
//! crate so that a seed gives the same stream forever, whatever a
//! dependency's next version does to its algorithm.

#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed ^ 0x6a09_e667_f3bc_c909)
    }

    /// splitmix64 (Steele, Lea, Flood 2014): passes BigCrush, one add and
    /// three multiply-xorshifts per draw.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        mix(self.0)
    }

    /// Uniform in [0, 1), 53 bits.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    pub fn range(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * self.unit()
    }

    /// Uniform in [0, n); 0 when n is 0.
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            return 0;
        }
        self.next_u64() % n
    }

    /// Exponential with the given mean.
    pub fn exp(&mut self, mean: f64) -> f64 {
        -mean * (1.0 - self.unit()).ln()
    }

    /// Pareto with scale `min` and shape `alpha`: heavy-tailed sizes.
    pub fn pareto(&mut self, min: f64, alpha: f64) -> f64 {
        min / (1.0 - self.unit()).powf(1.0 / alpha)
    }

    /// An independent stream (for one node's workload), so adding a draw in
    /// one place does not shift every other node's trace.
    pub fn fork(&mut self) -> Rng {
        Rng(self.next_u64())
    }
}

/// The splitmix64 finaliser: a bijection on u64 (distinct inputs, distinct
/// outputs), also used for node ids.
pub fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_stream() {
        let (mut a, mut b) = (Rng::new(7), Rng::new(7));
        for _ in 0..100 {
            assert_eq!(a.next_u64(), b.next_u64());
        }
        let u = Rng::new(1).unit();
        assert!((0.0..1.0).contains(&u));
    }
}
