//! Wall-clock time for health and metrics, injectable for tests.
//!
//! Upstream reads `clock.Now()` (a Go `time.Time`, wall and monotonic) for both the health
//! timeout and the timestamps it reports. Here a [`Clock`] returns a [`SystemTime`];
//! [`TokioClock`] derives it from Tokio's monotonic clock (so paused-time tests control it and
//! it never goes backwards), [`ManualClock`] is set by hand.
//!
//! [`go_time_string`] prints a time the way Go's `time.Time` marshals to JSON: RFC 3339 with
//! up to nine fractional digits, trailing zeros dropped (`2006-01-02T15:04:05.999999999Z07:00`),
//! in UTC (`Z`).

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A source of wall-clock time.
pub trait Clock: Send + Sync + fmt::Debug {
    /// The current time.
    fn now(&self) -> SystemTime;
}

/// A clock shared between the health state, the metrics and the servers.
pub type SharedClock = Arc<dyn Clock>;

/// Wall time = the system time at creation + the Tokio time elapsed since.
///
/// With `tokio::time::pause()` the clock stands still until the test advances it.
#[derive(Debug, Clone)]
pub struct TokioClock {
    wall: SystemTime,
    start: tokio::time::Instant,
}

impl TokioClock {
    /// A clock starting at the current system time.
    pub fn new() -> Self {
        Self::starting_at(SystemTime::now())
    }

    /// A clock reading `wall` now (for tests that compare exact timestamps).
    pub fn starting_at(wall: SystemTime) -> Self {
        TokioClock {
            wall,
            start: tokio::time::Instant::now(),
        }
    }
}

impl Default for TokioClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for TokioClock {
    fn now(&self) -> SystemTime {
        let elapsed = self.start.elapsed();
        self.wall.checked_add(elapsed).unwrap_or(self.wall)
    }
}

/// A clock that moves only when told to.
#[derive(Debug)]
pub struct ManualClock {
    now: Mutex<SystemTime>,
}

impl ManualClock {
    /// A clock reading `start`.
    pub fn new(start: SystemTime) -> Self {
        ManualClock {
            now: Mutex::new(start),
        }
    }

    /// Sets the time.
    pub fn set(&self, t: SystemTime) {
        *self.now.lock().unwrap_or_else(|e| e.into_inner()) = t;
    }

    /// Moves the time forward by `d` (saturating at the largest representable time).
    pub fn advance(&self, d: Duration) {
        let mut now = self.now.lock().unwrap_or_else(|e| e.into_inner());
        *now = now.checked_add(d).unwrap_or(*now);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> SystemTime {
        *self.now.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Seconds since the Unix epoch as `f64` (negative before it), the value of upstream's
/// `*_timestamp_seconds` gauges.
pub fn unix_seconds(t: SystemTime) -> f64 {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => d.as_secs_f64(),
        Err(e) => -e.duration().as_secs_f64(),
    }
}

/// Formats `t` as Go's `time.Time` JSON (without the quotes): RFC 3339 in UTC with the
/// fraction trimmed of trailing zeros, e.g. `2026-07-21T10:00:00.5Z`. `None` is Go's zero
/// time, `0001-01-01T00:00:00Z`.
pub fn go_time_string(t: Option<SystemTime>) -> String {
    let Some(t) = t else {
        return "0001-01-01T00:00:00Z".to_string();
    };
    let (secs, nanos) = match t.duration_since(UNIX_EPOCH) {
        Ok(d) => (
            i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
            d.subsec_nanos(),
        ),
        Err(e) => {
            let d = e.duration();
            let secs = i64::try_from(d.as_secs()).map_or(i64::MIN, |s| -s);
            match d.subsec_nanos() {
                0 => (secs, 0),
                n => (secs.saturating_sub(1), 1_000_000_000 - n),
            }
        }
    };
    let days = secs.div_euclid(86_400);
    let sod = secs.rem_euclid(86_400);
    let (year, month, day) = civil_from_days(days);
    let mut out = format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}",
        sod / 3600,
        sod % 3600 / 60,
        sod % 60
    );
    if nanos > 0 {
        let frac = format!("{nanos:09}");
        out.push('.');
        out.push_str(frac.trim_end_matches('0'));
    }
    out.push('Z');
    out
}

/// Days since 1970-01-01 to a proleptic Gregorian (year, month, day) (H. Hinnant's algorithm).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days.saturating_add(719_468);
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097); // [0, 146096]
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365; // [0, 399]
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100); // [0, 365]
    let mp = (5 * doy + 2) / 153; // [0, 11]
    let day = doy - (153 * mp + 2) / 5 + 1; // [1, 31]
    let month = if mp < 10 { mp + 3 } else { mp - 9 }; // [1, 12]
    let year = yoe + era.saturating_mul(400) + i64::from(month <= 2);
    // Both are in range by construction.
    (
        year,
        u32::try_from(month).unwrap_or(1),
        u32::try_from(day).unwrap_or(1),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: u64, nanos: u32) -> SystemTime {
        UNIX_EPOCH + Duration::new(secs, nanos)
    }

    #[test]
    fn go_time_format_matches_rfc3339nano() {
        assert_eq!(go_time_string(Some(at(0, 0))), "1970-01-01T00:00:00Z");
        assert_eq!(go_time_string(None), "0001-01-01T00:00:00Z");
        // 2026-07-21T10:11:12Z = 1784628672
        assert_eq!(
            go_time_string(Some(at(1_784_628_672, 0))),
            "2026-07-21T10:11:12Z"
        );
        assert_eq!(
            go_time_string(Some(at(1_784_628_672, 500_000_000))),
            "2026-07-21T10:11:12.5Z"
        );
        assert_eq!(
            go_time_string(Some(at(1_784_628_672, 123_456_789))),
            "2026-07-21T10:11:12.123456789Z"
        );
        assert_eq!(
            go_time_string(Some(at(1_784_628_672, 1_000))),
            "2026-07-21T10:11:12.000001Z"
        );
        // Leap day and end of year.
        assert_eq!(
            go_time_string(Some(at(951_782_400, 0))),
            "2000-02-29T00:00:00Z"
        );
        assert_eq!(
            go_time_string(Some(at(1_735_689_599, 0))),
            "2024-12-31T23:59:59Z"
        );
        // Before the epoch.
        assert_eq!(
            go_time_string(Some(UNIX_EPOCH - Duration::from_millis(1500))),
            "1969-12-31T23:59:58.5Z"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn tokio_clock_follows_paused_time() {
        let clock = TokioClock::starting_at(at(1000, 0));
        assert_eq!(clock.now(), at(1000, 0));
        tokio::time::advance(Duration::from_millis(2500)).await;
        assert_eq!(clock.now(), at(1002, 500_000_000));
    }

    #[test]
    fn manual_clock_moves_when_told() {
        let clock = ManualClock::new(at(5, 0));
        clock.advance(Duration::from_secs(2));
        assert_eq!(clock.now(), at(7, 0));
        clock.set(at(1, 0));
        assert_eq!(clock.now(), at(1, 0));
        assert_eq!(unix_seconds(at(1, 500_000_000)), 1.5);
    }
}
