//! The per-listener load balancer: round robin over a shuffled endpoint order, with optional
//! ClientIP session affinity, the way upstream's userspace proxier balances.
//!
//! The endpoint list is shuffled whenever its *set* changes (so many proxies do not all start
//! at the same endpoint), and one index advances per pick: every new connection or flow, and
//! every retry, takes the next endpoint. With affinity, a client IP reuses the endpoint it was
//! last given while that entry was used less than the timeout ago (each use refreshes it); a
//! retry after a failed dial skips the affinity entry and records the endpoint it picks
//! instead (upstream's "session affinity reset").

use std::collections::{BTreeSet, HashMap};
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

/// An affinity entry: the endpoint a client IP was last given, and when it last used it.
#[derive(Debug, Clone, Copy)]
struct Sticky {
    endpoint: SocketAddr,
    last_used: Instant,
}

/// Round robin with optional affinity; see the module docs.
#[derive(Debug)]
pub(crate) struct Balancer {
    /// Distinct endpoints in shuffled order.
    order: Vec<SocketAddr>,
    /// Index into `order` of the next pick.
    next: usize,
    affinity: Option<Duration>,
    sticky: HashMap<IpAddr, Sticky>,
    /// When expired affinity entries were last swept out.
    last_sweep: Instant,
}

/// Affinity entries are swept at most this often (and at least the affinity timeout apart).
const MIN_SWEEP_INTERVAL: Duration = Duration::from_secs(1);

fn shuffled(endpoints: &[SocketAddr]) -> Vec<SocketAddr> {
    let mut seen = BTreeSet::new();
    let mut order: Vec<SocketAddr> = endpoints
        .iter()
        .copied()
        .filter(|e| seen.insert(*e))
        .collect();
    fastrand::shuffle(&mut order);
    order
}

impl Balancer {
    /// A balancer over `endpoints` (duplicates count once) in a random order.
    pub(crate) fn new(endpoints: &[SocketAddr], affinity: Option<Duration>) -> Balancer {
        Balancer {
            order: shuffled(endpoints),
            next: 0,
            affinity,
            sticky: HashMap::new(),
            last_sweep: Instant::now(),
        }
    }

    /// The session affinity timeout in force.
    pub(crate) fn affinity(&self) -> Option<Duration> {
        self.affinity
    }

    /// Replaces endpoints and affinity. When the endpoint set changed, reshuffles, restarts
    /// the round robin and drops affinity entries of removed endpoints; when affinity is
    /// turned off, drops all entries. Returns whether the set changed.
    pub(crate) fn update(&mut self, endpoints: &[SocketAddr], affinity: Option<Duration>) -> bool {
        let old: BTreeSet<SocketAddr> = self.order.iter().copied().collect();
        let new: BTreeSet<SocketAddr> = endpoints.iter().copied().collect();
        let changed = old != new;
        if changed {
            self.order = shuffled(endpoints);
            self.next = 0;
            self.sticky.retain(|_, s| new.contains(&s.endpoint));
        }
        self.affinity = affinity;
        if affinity.is_none() {
            self.sticky.clear();
        }
        changed
    }

    /// The endpoint for a connection attempt from `client` at `now`, never one of `tried`;
    /// `None` when every endpoint was tried or there are none. `reset` (a retry after a failed
    /// dial) skips the client's affinity entry.
    pub(crate) fn next(
        &mut self,
        client: IpAddr,
        reset: bool,
        tried: &[SocketAddr],
        now: Instant,
    ) -> Option<SocketAddr> {
        if let Some(timeout) = self.affinity {
            self.sweep(timeout, now);
            if !reset
                && let Some(s) = self.sticky.get_mut(&client)
                && now.saturating_duration_since(s.last_used) < timeout
                && !tried.contains(&s.endpoint)
            {
                s.last_used = now;
                return Some(s.endpoint);
            }
        }
        let n = self.order.len();
        for _ in 0..n {
            let endpoint = self.order[self.next % n];
            self.next = (self.next + 1) % n;
            if tried.contains(&endpoint) {
                continue;
            }
            if self.affinity.is_some() {
                self.sticky.insert(
                    client,
                    Sticky {
                        endpoint,
                        last_used: now,
                    },
                );
            }
            return Some(endpoint);
        }
        None
    }

    /// Forgets `client`'s affinity entry (its endpoint was found dead).
    pub(crate) fn forget(&mut self, client: IpAddr) {
        self.sticky.remove(&client);
    }

    /// Whether there is no endpoint at all.
    pub(crate) fn is_empty(&self) -> bool {
        self.order.is_empty()
    }

    /// Drops expired affinity entries, at most once per max(timeout, 1 s).
    fn sweep(&mut self, timeout: Duration, now: Instant) {
        if now.saturating_duration_since(self.last_sweep) < timeout.max(MIN_SWEEP_INTERVAL) {
            return;
        }
        self.last_sweep = now;
        self.sticky
            .retain(|_, s| now.saturating_duration_since(s.last_used) < timeout);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn eps(n: u16) -> Vec<SocketAddr> {
        (0..n)
            .map(|i| SocketAddr::from(([10, 0, 0, 1 + i as u8], 80)))
            .collect()
    }

    fn ip(last: u8) -> IpAddr {
        IpAddr::from([192, 168, 0, last])
    }

    #[test]
    fn round_robin_visits_every_endpoint_equally() {
        let mut b = Balancer::new(&eps(3), None);
        let now = Instant::now();
        let mut counts = BTreeMap::new();
        for i in 0..30 {
            let e = b.next(ip(i), false, &[], now).unwrap();
            *counts.entry(e).or_insert(0) += 1;
        }
        assert_eq!(counts.len(), 3);
        assert!(counts.values().all(|&c| c == 10), "{counts:?}");
    }

    #[test]
    fn duplicates_count_once_and_empty_gives_none() {
        let e = eps(2);
        let mut b = Balancer::new(&[e[0], e[1], e[0]], None);
        let now = Instant::now();
        let picks: BTreeSet<_> = (0..4)
            .map(|_| b.next(ip(1), false, &[], now).unwrap())
            .collect();
        assert_eq!(picks.len(), 2);
        let mut empty = Balancer::new(&[], Some(Duration::from_secs(10)));
        assert!(empty.is_empty());
        assert_eq!(empty.next(ip(1), false, &[], now), None);
    }

    #[test]
    fn tried_endpoints_are_skipped_until_none_is_left() {
        let mut b = Balancer::new(&eps(3), None);
        let now = Instant::now();
        let mut tried = Vec::new();
        while let Some(e) = b.next(ip(1), !tried.is_empty(), &tried, now) {
            assert!(!tried.contains(&e));
            tried.push(e);
        }
        assert_eq!(tried.len(), 3);
    }

    #[test]
    fn affinity_keeps_a_client_ip_on_its_endpoint_until_it_expires() {
        let timeout = Duration::from_secs(10);
        let mut b = Balancer::new(&eps(3), Some(timeout));
        let t0 = Instant::now();
        let first: Vec<_> = (1..=3)
            .map(|c| b.next(ip(c), false, &[], t0).unwrap())
            .collect();
        // Three clients got three different endpoints, and each keeps its own.
        assert_eq!(first.iter().collect::<BTreeSet<_>>().len(), 3);
        for round in 1..5 {
            let t = t0 + Duration::from_secs(round);
            for c in 1..=3 {
                assert_eq!(b.next(ip(c), false, &[], t), Some(first[c as usize - 1]));
            }
        }
        // Another client moves the round robin on: its next pick is first[1].
        assert_eq!(
            b.next(ip(9), false, &[], t0 + Duration::from_secs(4)),
            Some(first[0])
        );
        // Refreshed at t0+4s; idle for a full timeout after that, the entry no longer holds:
        // client 1 gets the round robin's next endpoint and keeps that one.
        let late = t0 + Duration::from_secs(4) + timeout;
        assert_eq!(b.next(ip(1), false, &[], late), Some(first[1]));
        assert_eq!(b.next(ip(1), false, &[], late), Some(first[1]));
    }

    #[test]
    fn reset_skips_affinity_and_records_the_new_endpoint() {
        let mut b = Balancer::new(&eps(3), Some(Duration::from_secs(10)));
        let now = Instant::now();
        let first = b.next(ip(1), false, &[], now).unwrap();
        let retry = b.next(ip(1), true, &[first], now).unwrap();
        assert_ne!(retry, first);
        assert_eq!(b.next(ip(1), false, &[], now), Some(retry));
        b.forget(ip(1));
        // Without an entry the client takes the round robin's next endpoint.
        let after = b.next(ip(1), false, &[], now).unwrap();
        assert_eq!(b.next(ip(1), false, &[], now), Some(after));
    }

    #[test]
    fn update_reshuffles_only_when_the_set_changes() {
        let e = eps(4);
        let mut b = Balancer::new(&e, Some(Duration::from_secs(10)));
        let now = Instant::now();
        let sticky = b.next(ip(1), false, &[], now).unwrap();
        let order = b.order.clone();
        let mut reversed = e.clone();
        reversed.reverse();
        assert!(!b.update(&reversed, Some(Duration::from_secs(10))));
        assert_eq!(b.order, order);
        assert_eq!(b.next, 1, "same set: the round robin goes on where it was");
        assert_eq!(b.next(ip(1), false, &[], now), Some(sticky));

        // Removing the sticky endpoint drops its entry; the others survive.
        let other = b.next(ip(2), false, &[], now).unwrap();
        let kept: Vec<_> = e.iter().copied().filter(|x| *x != sticky).collect();
        assert!(b.update(&kept, Some(Duration::from_secs(10))));
        assert_eq!(b.next, 0);
        assert!(!b.order.contains(&sticky));
        assert!(!b.sticky.contains_key(&ip(1)));
        assert_eq!(b.sticky.get(&ip(2)).map(|s| s.endpoint), Some(other));

        // Turning affinity off forgets every entry.
        assert!(!b.update(&kept, None));
        assert!(b.sticky.is_empty());
        assert_eq!(b.affinity(), None);
    }

    #[test]
    fn expired_entries_are_swept() {
        let timeout = Duration::from_secs(2);
        let mut b = Balancer::new(&eps(2), Some(timeout));
        let t0 = Instant::now();
        for c in 0..100 {
            b.next(ip(c), false, &[], t0);
        }
        assert_eq!(b.sticky.len(), 100);
        b.next(ip(200), false, &[], t0 + Duration::from_secs(3));
        assert_eq!(b.sticky.len(), 1);
    }

    #[test]
    fn shuffle_varies_the_order() {
        let e = eps(8);
        let orders: BTreeSet<Vec<SocketAddr>> =
            (0..20).map(|_| Balancer::new(&e, None).order).collect();
        assert!(orders.len() > 1);
    }
}
