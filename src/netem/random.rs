//! The kernel's random draws: correlated uniforms and delay distributions.

use rand_chacha::ChaCha8Rng;
use rand_core::Rng;

use super::spec::Distribution;
use crate::util::units::Probability;

/// A probability on the kernel's scale: `u32::MAX` is 100 %.
pub(super) fn scaled(p: Probability) -> u32 {
    ((u64::from(p.ppb()) * u64::from(u32::MAX) + 500_000_000) / 1_000_000_000) as u32
}

/// sch_netem's `get_crandom`: a uniform u32 pulled towards the previous
/// value by `rho`. The kernel documents this correlation as approximate: the
/// marginal distribution is no longer uniform (docs/netem.md).
#[derive(Debug, Clone, Default)]
pub(super) struct Correlated {
    rho: u32,
    last: u32,
}

impl Correlated {
    pub(super) fn new(corr: Probability) -> Correlated {
        Correlated {
            rho: scaled(corr),
            last: 0,
        }
    }

    pub(super) fn next(&mut self, rng: &mut ChaCha8Rng) -> u32 {
        let value = rng.next_u32();
        if self.rho == 0 {
            return value;
        }
        let rho = u64::from(self.rho) + 1;
        let answer =
            ((u64::from(value) * ((1u64 << 32) - rho) + u64::from(self.last) * rho) >> 32) as u32;
        self.last = answer;
        answer
    }
}

/// True with probability `p` (kernel-scaled), the kernel's `p >= rnd` test.
pub(super) fn happens(p: u32, rnd: u32) -> bool {
    p != 0 && p >= rnd
}

/// The kernel's delay tables hold standardised values in [-4, 4).
const TABLE_RANGE: f64 = 4.0;

/// `tabledist`: `mu` ± `sigma` shaped by `dist`, in nanoseconds; may be
/// negative when the jitter exceeds the delay.
pub(super) fn tabledist(mu: u64, sigma: u64, rnd: u32, dist: Option<Distribution>) -> i128 {
    if sigma == 0 {
        return i128::from(mu);
    }
    let (mu, sigma) = (i128::from(mu), i128::from(sigma));
    match dist {
        // The kernel's default: uniform in [mu - sigma, mu + sigma).
        None | Some(Distribution::Uniform) => mu - sigma + ((i128::from(rnd) * 2 * sigma) >> 32),
        Some(d) => {
            let u = (f64::from(rnd) + 0.5) / 4_294_967_296.0;
            let t = quantile(d, u).clamp(-TABLE_RANGE, TABLE_RANGE);
            mu + (t * sigma as f64).round() as i128
        }
    }
}

/// The inverse CDF, in units of sigma, of the distributions iproute2 ships
/// as tables (`normal.dist`, `pareto.dist`, `paretonormal.dist`).
fn quantile(d: Distribution, u: f64) -> f64 {
    match d {
        Distribution::Uniform => 2.0 * u - 1.0,
        Distribution::Normal => normal_quantile(u),
        Distribution::Pareto => pareto_quantile(u),
        // iproute2 builds this table as a quarter normal, three quarters
        // pareto; atou mixes the two quantiles of one draw.
        Distribution::ParetoNormal => 0.25 * normal_quantile(u) + 0.75 * pareto_quantile(u),
    }
}

/// Pareto with shape 3, shifted to mean 0 and scaled as iproute2's table:
/// (u^(-1/3) - 1.5) · 4/3.
fn pareto_quantile(u: f64) -> f64 {
    ((1.0 - u).max(f64::MIN_POSITIVE).powf(-1.0 / 3.0) - 1.5) * (4.0 / 3.0)
}

/// The standard normal's inverse CDF (Acklam's rational approximation,
/// relative error below 1.2e-9: far finer than the kernel's 1/8192 steps).
fn normal_quantile(p: f64) -> f64 {
    const A: [f64; 6] = [
        -3.969_683_028_665_376e1,
        2.209_460_984_245_205e2,
        -2.759_285_104_469_687e2,
        1.383_577_518_672_69e2,
        -3.066_479_806_614_716e1,
        2.506_628_277_459_239,
    ];
    const B: [f64; 5] = [
        -5.447_609_879_822_406e1,
        1.615_858_368_580_409e2,
        -1.556_989_798_598_866e2,
        6.680_131_188_771_972e1,
        -1.328_068_155_288_572e1,
    ];
    const C: [f64; 6] = [
        -7.784_894_002_430_293e-3,
        -3.223_964_580_411_365e-1,
        -2.400_758_277_161_838,
        -2.549_732_539_343_734,
        4.374_664_141_464_968,
        2.938_163_982_698_783,
    ];
    const D: [f64; 4] = [
        7.784_695_709_041_462e-3,
        3.224_671_290_700_398e-1,
        2.445_134_137_142_996,
        3.754_408_661_907_416,
    ];
    const LOW: f64 = 0.02425;
    let tail = |q: f64| {
        (((((C[0] * q + C[1]) * q + C[2]) * q + C[3]) * q + C[4]) * q + C[5])
            / ((((D[0] * q + D[1]) * q + D[2]) * q + D[3]) * q + 1.0)
    };
    if p < LOW {
        tail((-2.0 * p.ln()).sqrt())
    } else if p > 1.0 - LOW {
        -tail((-2.0 * (1.0 - p).ln()).sqrt())
    } else {
        let q = p - 0.5;
        let r = q * q;
        (((((A[0] * r + A[1]) * r + A[2]) * r + A[3]) * r + A[4]) * r + A[5]) * q
            / (((((B[0] * r + B[1]) * r + B[2]) * r + B[3]) * r + B[4]) * r + 1.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normal_quantile_hits_known_points() {
        for (p, z) in [
            (0.5, 0.0),
            (0.975, 1.959_964),
            (0.841_344_7, 1.0),
            (0.001, -3.090_232),
        ] {
            assert!(
                (normal_quantile(p) - z).abs() < 1e-5,
                "{p}: {}",
                normal_quantile(p)
            );
        }
    }

    #[test]
    fn pareto_has_mean_zero_and_a_long_right_tail() {
        let n = 100_000;
        let xs: Vec<f64> = (0..n)
            .map(|i| pareto_quantile((i as f64 + 0.5) / n as f64))
            .collect();
        let mean = xs.iter().sum::<f64>() / n as f64;
        assert!(mean.abs() < 0.02, "{mean}");
        assert!(
            (xs[0] + 2.0 / 3.0).abs() < 1e-3,
            "minimum is -2/3: {}",
            xs[0]
        );
        assert!(xs[n - 1] > 4.0);
    }
}
