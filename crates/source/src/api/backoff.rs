//! [`ExponentialBackoff`]: the retry delays of the API watchers.
//!
//! Like client-go's reflector backoff: the delay starts at the initial value, doubles after
//! each consecutive error up to the maximum, and is jittered (each delay is drawn from
//! `[d, 1.5 d)`, capped at the maximum) so that the proxies of a cluster do not retry in step
//! after an API-server outage. kube's `StreamBackoff` resets it on every successful event.

use std::hash::BuildHasher;
use std::time::Duration;

/// An exponential, jittered backoff implementing kube-runtime's `Backoff`.
#[derive(Debug)]
pub(crate) struct ExponentialBackoff {
    initial: Duration,
    max: Duration,
    /// The un-jittered delay of the last error; `None` after a reset.
    current: Option<Duration>,
    /// Randomness for the jitter, without a dependency on a random-number crate.
    random: std::collections::hash_map::RandomState,
    draws: u64,
}

impl ExponentialBackoff {
    /// Delays from `initial` doubling up to `max` (`max` is raised to `initial` if smaller).
    pub(crate) fn new(initial: Duration, max: Duration) -> Self {
        ExponentialBackoff {
            initial,
            max: max.max(initial),
            current: None,
            random: std::collections::hash_map::RandomState::new(),
            draws: 0,
        }
    }

    /// A fraction in `[0, 1)`.
    fn fraction(&mut self) -> f64 {
        self.draws = self.draws.wrapping_add(1);
        let bits = self.random.hash_one(self.draws) >> 11; // 53 bits
        bits as f64 / (1u64 << 53) as f64
    }
}

impl Iterator for ExponentialBackoff {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        let base = match self.current {
            None => self.initial,
            Some(d) => d.saturating_mul(2).min(self.max),
        };
        self.current = Some(base);
        let jitter = base.mul_f64(self.fraction() * 0.5);
        Some(base.saturating_add(jitter).min(self.max))
    }
}

impl kube::runtime::utils::Backoff for ExponentialBackoff {
    fn reset(&mut self) {
        self.current = None;
    }
}

#[cfg(test)]
mod tests {
    use kube::runtime::utils::Backoff;

    use super::*;

    #[test]
    fn delays_double_up_to_the_max_and_reset() {
        let ms = Duration::from_millis;
        let mut b = ExponentialBackoff::new(ms(100), ms(1000));
        let delays: Vec<Duration> = (0..6).filter_map(|_| b.next()).collect();
        let bases = [100, 200, 400, 800, 1000, 1000];
        for (d, base) in delays.iter().zip(bases) {
            assert!(
                *d >= ms(base) && *d < ms(base * 3 / 2).max(ms(base + 1)),
                "{d:?} vs {base}"
            );
            assert!(*d <= ms(1000));
        }
        b.reset();
        let d = b.next().unwrap_or_default();
        assert!(d >= ms(100) && d < ms(150), "{d:?}");
    }
}
