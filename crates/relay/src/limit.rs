//! Log rate limiting: a burst of identical problems (a full connection table, `EMFILE` from
//! accept, a Service whose endpoints all refuse) gives one log line per interval that says how
//! many occurrences it stands for, instead of one line per occurrence.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::lock;

/// Allows one log line per `interval`; see [`RateLimit::hit`].
pub(crate) struct RateLimit {
    interval: Duration,
    state: Mutex<State>,
}

struct State {
    /// When the last line was allowed; `None` before the first.
    last: Option<Instant>,
    /// Occurrences since that line, including the current one.
    pending: u64,
}

impl RateLimit {
    /// A limiter allowing one line per `interval`.
    pub(crate) fn new(interval: Duration) -> RateLimit {
        RateLimit {
            interval,
            state: Mutex::new(State {
                last: None,
                pending: 0,
            }),
        }
    }

    /// Records one occurrence. Returns `Some(n)` when a line may be logged now, `n` being the
    /// occurrences since the previous line (this one included); `None` otherwise.
    pub(crate) fn hit(&self) -> Option<u64> {
        self.hit_at(Instant::now())
    }

    fn hit_at(&self, now: Instant) -> Option<u64> {
        let mut s = lock(&self.state);
        s.pending += 1;
        let due = s
            .last
            .is_none_or(|last| now.saturating_duration_since(last) >= self.interval);
        if !due {
            return None;
        }
        s.last = Some(now);
        Some(std::mem::take(&mut s.pending))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_per_interval_with_the_count_it_stands_for() {
        let r = RateLimit::new(Duration::from_secs(10));
        let t0 = Instant::now();
        assert_eq!(r.hit_at(t0), Some(1));
        for i in 1..=4 {
            assert_eq!(r.hit_at(t0 + Duration::from_secs(i)), None);
        }
        assert_eq!(r.hit_at(t0 + Duration::from_secs(10)), Some(5));
        assert_eq!(r.hit_at(t0 + Duration::from_secs(11)), None);
    }
}
