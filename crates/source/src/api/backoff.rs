//! [`ExponentialBackoff`]: the retry delays of one kind's list/watch loop.
//!
//! Like client-go's reflector backoff (`NewExponentialBackoffManager(800ms, 30s, 2min, 2.0,
//! 1.0)`): the delay starts at the initial value, doubles after each consecutive failure up to
//! the maximum, and is jittered (each delay is drawn from `[d, 1.5 d)`, capped at the maximum)
//! so that the proxies of a cluster do not retry in step after an API-server outage.
//!
//! It starts again from the initial delay once the kind has been healthy (every request
//! since the last failure succeeded) for the reset duration, 2 minutes by default as in
//! client-go: after an outage that drove the delay to its cap, one later failure (a dropped
//! watch whose re-watch fails once) costs the initial delay, not the cap. The time is
//! tokio's, so paused-time tests can drive it.

use std::hash::BuildHasher;
use std::time::Duration;

use tokio::time::Instant;

/// An exponential, jittered backoff that resets after a healthy period.
#[derive(Debug)]
pub(crate) struct ExponentialBackoff {
    initial: Duration,
    max: Duration,
    reset_after: Duration,
    /// The un-jittered delay of the last failure; `None` after a reset.
    current: Option<Duration>,
    /// When the kind became healthy again after its last failure (its first success since).
    healthy_since: Option<Instant>,
    /// Randomness for the jitter, without a dependency on a random-number crate.
    random: std::collections::hash_map::RandomState,
    draws: u64,
}

impl ExponentialBackoff {
    /// Delays from `initial` doubling up to `max` (`max` is raised to `initial` if smaller),
    /// back to `initial` after `reset_after` of health.
    pub(crate) fn new(initial: Duration, max: Duration, reset_after: Duration) -> Self {
        ExponentialBackoff {
            initial,
            max: max.max(initial),
            reset_after,
            current: None,
            healthy_since: None,
            random: std::collections::hash_map::RandomState::new(),
            draws: 0,
        }
    }

    /// A fraction in `[0, 1)`.
    pub(crate) fn fraction(&mut self) -> f64 {
        self.draws = self.draws.wrapping_add(1);
        let bits = self.random.hash_one(self.draws) >> 11; // 53 bits
        bits as f64 / (1u64 << 53) as f64
    }

    /// A request succeeded at `now`: the healthy period starts, unless it already runs.
    pub(crate) fn succeeded(&mut self, now: Instant) {
        self.healthy_since.get_or_insert(now);
    }

    /// A request failed at `now`: the delay before the next attempt. The delay starts over
    /// from the initial one when the kind had been healthy for the reset duration.
    pub(crate) fn failed(&mut self, now: Instant) -> Duration {
        if let Some(since) = self.healthy_since.take()
            && now.saturating_duration_since(since) >= self.reset_after
        {
            self.current = None;
        }
        let base = match self.current {
            None => self.initial,
            Some(d) => d.saturating_mul(2).min(self.max),
        };
        self.current = Some(base);
        let jitter = base.mul_f64(self.fraction() * 0.5);
        base.saturating_add(jitter).min(self.max)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn assert_jittered(d: Duration, base: u64, max: u64) {
        assert!(
            d >= ms(base) && d < ms(base * 3 / 2).max(ms(base + 1)) && d <= ms(max),
            "{d:?} vs {base}"
        );
    }

    #[test]
    fn delays_double_up_to_the_max() {
        let now = Instant::now();
        let mut b = ExponentialBackoff::new(ms(100), ms(1000), ms(5000));
        for base in [100, 200, 400, 800, 1000, 1000] {
            assert_jittered(b.failed(now), base, 1000);
        }
    }

    #[test]
    fn a_healthy_period_resets_the_delay_and_a_short_one_does_not() {
        let t0 = Instant::now();
        let mut b = ExponentialBackoff::new(ms(100), ms(1000), ms(5000));
        for _ in 0..6 {
            b.failed(t0);
        }
        // Healthy for less than the reset duration: still at the cap.
        b.succeeded(t0 + ms(1000));
        b.succeeded(t0 + ms(3000));
        assert_jittered(b.failed(t0 + ms(5999)), 1000, 1000);
        // Healthy for the reset duration (counted from its first success): the initial delay.
        b.succeeded(t0 + ms(7000));
        b.succeeded(t0 + ms(11000));
        assert_jittered(b.failed(t0 + ms(12000)), 100, 1000);
        assert_jittered(b.failed(t0 + ms(12100)), 200, 1000);
        // Failures without a success in between never reset.
        assert_jittered(b.failed(t0 + ms(60000)), 400, 1000);
    }
}
