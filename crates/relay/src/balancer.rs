//! The per-listener load balancer: round robin over a shuffled endpoint order, with optional
//! ClientIP session affinity, the way upstream's userspace proxier balances.
//!
//! The endpoint list is shuffled whenever its *set* changes (so many proxies do not all start
//! at the same endpoint), and one index advances per pick: every new connection or flow, and
//! every retry, takes the next endpoint. With affinity, a client IP reuses the endpoint it was
//! last given while that entry was used less than the timeout ago (each use refreshes it); a
//! retry after a failed dial skips the affinity entry and records the endpoint it picks
//! instead (upstream's "session affinity reset").

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// An affinity entry: the endpoint a client IP was last given, and when it last used it.
#[derive(Debug, Clone, Copy)]
struct Sticky {
    endpoint: SocketAddr,
    last_used: Instant,
}

/// Round robin with optional affinity; see the module docs.
///
/// The endpoints are the caller's list as given (shared, not copied: the proxier, the relay
/// and the balancer hold one allocation); the round-robin order is a shuffled list of
/// indices into it, one per distinct endpoint.
#[derive(Debug)]
pub(crate) struct Balancer {
    /// The endpoints as given (duplicates included).
    endpoints: Arc<[SocketAddr]>,
    /// Indices into `endpoints` of the distinct endpoints (each one's first), shuffled.
    order: Box<[u32]>,
    /// Index into `order` of the next pick.
    next: usize,
    affinity: Option<Duration>,
    sticky: HashMap<IpAddr, Sticky>,
    /// When expired affinity entries were last swept out.
    last_sweep: Instant,
}

/// Affinity entries are swept at most this often (and at least the affinity timeout apart).
const MIN_SWEEP_INTERVAL: Duration = Duration::from_secs(1);

/// The index of each distinct endpoint's first occurrence, by endpoint.
fn first_indices(endpoints: &[SocketAddr]) -> BTreeMap<SocketAddr, u32> {
    let mut first = BTreeMap::new();
    for (i, e) in endpoints.iter().enumerate() {
        // A list longer than u32::MAX cannot be given (it would need 128 GiB).
        first
            .entry(*e)
            .or_insert(u32::try_from(i).unwrap_or(u32::MAX));
    }
    first
}

fn shuffled(endpoints: &[SocketAddr]) -> Box<[u32]> {
    let mut order: Vec<u32> = first_indices(endpoints).into_values().collect();
    order.sort_unstable();
    fastrand::shuffle(&mut order);
    order.into_boxed_slice()
}

impl Balancer {
    /// A balancer over `endpoints` (duplicates count once) in a random order.
    pub(crate) fn new(endpoints: Arc<[SocketAddr]>, affinity: Option<Duration>) -> Balancer {
        Balancer {
            order: shuffled(&endpoints),
            endpoints,
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

    /// The endpoints as last given.
    pub(crate) fn endpoints(&self) -> &Arc<[SocketAddr]> {
        &self.endpoints
    }

    /// The endpoint at `order[k]`.
    fn at(&self, k: usize) -> SocketAddr {
        self.endpoints[self.order[k] as usize]
    }

    /// The distinct endpoints in round-robin order.
    #[cfg(test)]
    fn order_addrs(&self) -> Vec<SocketAddr> {
        (0..self.order.len()).map(|k| self.at(k)).collect()
    }

    /// Replaces endpoints and affinity. When the endpoint set changed, reshuffles, restarts
    /// the round robin and drops affinity entries of removed endpoints; when affinity is
    /// turned off, drops all entries. Returns whether the set changed.
    pub(crate) fn update(
        &mut self,
        endpoints: Arc<[SocketAddr]>,
        affinity: Option<Duration>,
    ) -> bool {
        let old: BTreeSet<SocketAddr> = (0..self.order.len()).map(|k| self.at(k)).collect();
        let first = first_indices(&endpoints);
        let changed = first.len() != old.len() || !old.iter().all(|e| first.contains_key(e));
        if changed {
            self.order = shuffled(&endpoints);
            self.next = 0;
            self.sticky.retain(|_, s| first.contains_key(&s.endpoint));
        } else if !Arc::ptr_eq(&self.endpoints, &endpoints) {
            // The same set, perhaps in another order: the same round robin, re-pointed.
            let order: Box<[u32]> = (0..self.order.len())
                .map(|k| first.get(&self.at(k)).copied().unwrap_or_default())
                .collect();
            self.order = order;
        }
        self.endpoints = endpoints;
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
            let endpoint = self.at(self.next % n);
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

    fn eps(n: u16) -> Arc<[SocketAddr]> {
        (0..n)
            .map(|i| SocketAddr::from(([10, 0, 0, 1 + i as u8], 80)))
            .collect()
    }

    fn ip(last: u8) -> IpAddr {
        IpAddr::from([192, 168, 0, last])
    }

    #[test]
    fn round_robin_visits_every_endpoint_equally() {
        let mut b = Balancer::new(eps(3), None);
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
        let mut b = Balancer::new(Arc::from([e[0], e[1], e[0]]), None);
        let now = Instant::now();
        let picks: BTreeSet<_> = (0..4)
            .map(|_| b.next(ip(1), false, &[], now).unwrap())
            .collect();
        assert_eq!(picks.len(), 2);
        let mut empty = Balancer::new(Arc::from([]), Some(Duration::from_secs(10)));
        assert!(empty.is_empty());
        assert_eq!(empty.next(ip(1), false, &[], now), None);
    }

    #[test]
    fn tried_endpoints_are_skipped_until_none_is_left() {
        let mut b = Balancer::new(eps(3), None);
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
        let mut b = Balancer::new(eps(3), Some(timeout));
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
        let mut b = Balancer::new(eps(3), Some(Duration::from_secs(10)));
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
        let mut b = Balancer::new(e.clone(), Some(Duration::from_secs(10)));
        let now = Instant::now();
        let sticky = b.next(ip(1), false, &[], now).unwrap();
        let order = b.order_addrs();
        let mut reversed = e.to_vec();
        reversed.reverse();
        assert!(!b.update(reversed.clone().into(), Some(Duration::from_secs(10))));
        assert_eq!(b.order_addrs(), order);
        assert_eq!(**b.endpoints(), reversed[..], "the list as given");
        assert_eq!(b.next, 1, "same set: the round robin goes on where it was");
        assert_eq!(b.next(ip(1), false, &[], now), Some(sticky));

        // Removing the sticky endpoint drops its entry; the others survive.
        let other = b.next(ip(2), false, &[], now).unwrap();
        let kept: Arc<[SocketAddr]> = e.iter().copied().filter(|x| *x != sticky).collect();
        assert!(b.update(kept.clone(), Some(Duration::from_secs(10))));
        assert_eq!(b.next, 0);
        assert!(!b.order_addrs().contains(&sticky));
        assert!(!b.sticky.contains_key(&ip(1)));
        assert_eq!(b.sticky.get(&ip(2)).map(|s| s.endpoint), Some(other));

        // Turning affinity off forgets every entry.
        assert!(!b.update(kept, None));
        assert!(b.sticky.is_empty());
        assert_eq!(b.affinity(), None);
    }

    #[test]
    fn expired_entries_are_swept() {
        let timeout = Duration::from_secs(2);
        let mut b = Balancer::new(eps(2), Some(timeout));
        let t0 = Instant::now();
        for c in 0..100 {
            b.next(ip(c), false, &[], t0);
        }
        assert_eq!(b.sticky.len(), 100);
        b.next(ip(200), false, &[], t0 + Duration::from_secs(3));
        assert_eq!(b.sticky.len(), 1);
    }

    #[test]
    fn the_order_is_one_index_per_distinct_endpoint_and_the_list_is_shared() {
        let e = eps(10);
        let doubled: Arc<[SocketAddr]> = e.iter().chain(e.iter()).copied().collect();
        let b = Balancer::new(doubled.clone(), None);
        assert!(Arc::ptr_eq(b.endpoints(), &doubled), "not copied");
        assert_eq!(b.order.len(), 10);
        assert!(b.order.iter().all(|i| *i < 10), "first occurrences");
        let mut sorted = b.order_addrs();
        sorted.sort();
        assert_eq!(sorted, e.to_vec());
    }

    #[test]
    fn shuffle_varies_the_order() {
        let e = eps(8);
        let orders: BTreeSet<Vec<SocketAddr>> = (0..20)
            .map(|_| Balancer::new(e.clone(), None).order_addrs())
            .collect();
        assert!(orders.len() > 1);
    }
}
