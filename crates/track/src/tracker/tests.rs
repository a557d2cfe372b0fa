//! Tracker tests: unit cases and a property test against a recompute-from-scratch model.

use std::collections::BTreeMap;
use std::net::IpAddr;

use kp_model::{
    EndpointConditions, EndpointEntry, EndpointPort, EndpointSlice, IpFamily, NamespacedName, Node,
    ObjectKind, Protocol, Service, ServiceCidr, ServicePortName, ServicePortSpec, ServiceType,
    SliceAddressType, SourceEvent,
};
use proptest::prelude::*;

use super::Tracker;

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn svc(name: &str, cluster_ip: &str, ports: &[(&str, u16)]) -> Service {
    Service::cluster_ip(
        NamespacedName::new("default", name),
        ip(cluster_ip),
        ports
            .iter()
            .map(|(n, p)| ServicePortSpec {
                name: (*n).into(),
                protocol: Protocol::Tcp,
                port: *p,
                node_port: None,
            })
            .collect(),
    )
}

fn slice(name: &str, service: &str, ports: &[(&str, u16)], eps: &[(&str, &str)]) -> EndpointSlice {
    EndpointSlice {
        name: NamespacedName::new("default", name),
        service: NamespacedName::new("default", service),
        address_type: SliceAddressType::V4,
        ports: ports
            .iter()
            .map(|(n, p)| EndpointPort {
                name: (*n).into(),
                protocol: Protocol::Tcp,
                port: *p,
            })
            .collect(),
        endpoints: eps
            .iter()
            .map(|(a, node)| EndpointEntry::ready(ip(a), Some(node)))
            .collect(),
        last_change_trigger_time: None,
    }
}

fn synced(t: &mut Tracker) {
    for k in [
        ObjectKind::Service,
        ObjectKind::EndpointSlice,
        ObjectKind::Node,
    ] {
        t.apply(SourceEvent::Synced(k));
    }
}

fn spn(service: &str, port: &str) -> ServicePortName {
    ServicePortName::new(NamespacedName::new("default", service), port, Protocol::Tcp)
}

#[test]
fn seed_example_snapshot() {
    let mut t = Tracker::new(IpFamily::V4, "k8s-master");
    assert!(!t.is_initialized());
    t.apply(SourceEvent::ServiceUpsert(svc(
        "nginx-svc",
        "10.96.138.71",
        &[("", 8080)],
    )));
    t.apply(SourceEvent::SliceUpsert(slice(
        "nginx-svc-7xk2p",
        "nginx-svc",
        &[("", 80)],
        &[("10.0.1.2", "k8s-worker"), ("10.0.0.4", "k8s-master")],
    )));
    assert!(!t.is_initialized());
    t.apply(SourceEvent::Synced(ObjectKind::Service));
    assert!(
        t.apply(SourceEvent::Synced(ObjectKind::EndpointSlice)),
        "initialization is a change"
    );
    assert!(t.is_initialized());
    let (snap, changes) = t.checkout();
    assert_eq!(changes.services.len(), 1);
    let name = spn("nginx-svc", "");
    let info = &snap.services[&name];
    assert_eq!(info.cluster_ip, ip("10.96.138.71"));
    assert_eq!(info.port, 8080);
    let eps: Vec<String> = snap
        .endpoints_of(&name)
        .iter()
        .map(|e| e.to_string())
        .collect();
    assert_eq!(eps, ["10.0.0.4:80", "10.0.1.2:80"]);
    assert!(snap.endpoints_of(&name)[0].is_local);
    assert!(!snap.endpoints_of(&name)[1].is_local);
    // Nothing pending: a second checkout reports no change and the same view.
    let (snap2, changes2) = t.checkout();
    assert!(changes2.is_empty());
    assert_eq!(*snap, *snap2);
}

#[test]
fn repeated_objects_are_no_ops() {
    let mut t = Tracker::new(IpFamily::V4, "n1");
    let s = svc("a", "10.96.0.1", &[("", 80)]);
    assert!(t.apply(SourceEvent::ServiceUpsert(s.clone())));
    t.checkout();
    assert!(!t.apply(SourceEvent::ServiceUpsert(s)));
    let sl = slice("a-1", "a", &[("", 80)], &[("10.0.0.1", "n1")]);
    assert!(t.apply(SourceEvent::SliceUpsert(sl.clone())));
    t.checkout();
    assert!(!t.apply(SourceEvent::SliceUpsert(sl)));
    assert!(!t.apply(SourceEvent::ServiceDelete(NamespacedName::new(
        "default", "nope"
    ))));
    assert!(!t.apply(SourceEvent::SliceDelete(NamespacedName::new(
        "default", "nope"
    ))));
    assert!(!t.has_pending_changes());
}

#[test]
fn endpoint_in_two_slices_counted_once_and_local_wins() {
    let mut t = Tracker::new(IpFamily::V4, "n1");
    synced(&mut t);
    t.apply(SourceEvent::ServiceUpsert(svc(
        "a",
        "10.96.0.1",
        &[("", 80)],
    )));
    t.apply(SourceEvent::SliceUpsert(slice(
        "a-1",
        "a",
        &[("", 8080)],
        &[("10.0.0.1", "n2")],
    )));
    t.apply(SourceEvent::SliceUpsert(slice(
        "a-2",
        "a",
        &[("", 8080)],
        &[("10.0.0.1", "n1"), ("10.0.0.2", "n2")],
    )));
    let (snap, _) = t.checkout();
    let eps = snap.endpoints_of(&spn("a", ""));
    assert_eq!(eps.len(), 2);
    assert!(
        eps[0].is_local,
        "the local copy of a duplicated endpoint wins"
    );
}

#[test]
fn ports_matched_by_name_and_protocol() {
    let mut t = Tracker::new(IpFamily::V4, "n1");
    synced(&mut t);
    t.apply(SourceEvent::ServiceUpsert(svc(
        "a",
        "10.96.0.1",
        &[("http", 80), ("metrics", 9090)],
    )));
    t.apply(SourceEvent::SliceUpsert(slice(
        "a-1",
        "a",
        &[("http", 8080), ("metrics", 9100), ("other", 1)],
        &[("10.0.0.1", "n1")],
    )));
    let (snap, _) = t.checkout();
    assert_eq!(snap.endpoints_of(&spn("a", "http"))[0].port, 8080);
    assert_eq!(snap.endpoints_of(&spn("a", "metrics"))[0].port, 9100);
    assert!(
        !snap.endpoints.contains_key(&spn("a", "other")),
        "slice ports without a Service port are not in the snapshot"
    );
    let udp = ServicePortName::new(NamespacedName::new("default", "a"), "http", Protocol::Udp);
    assert!(snap.endpoints_of(&udp).is_empty());
}

#[test]
fn skipped_services() {
    let mut t = Tracker::new(IpFamily::V4, "n1");
    synced(&mut t);
    let mut headless = svc("h", "10.96.0.1", &[("", 80)]);
    headless.cluster_ips.clear();
    headless.headless = true;
    let mut external = svc("e", "10.96.0.2", &[("", 80)]);
    external.service_type = ServiceType::ExternalName;
    external.cluster_ips.clear();
    let v6only = svc("six", "fd00::1", &[("", 80)]);
    for s in [headless.clone(), external, v6only] {
        assert!(
            !t.apply(SourceEvent::ServiceUpsert(s)),
            "nothing to program, nothing kept"
        );
    }
    let (snap, changes) = t.checkout();
    assert!(changes.services.is_empty());
    assert!(snap.services.is_empty() && t.services.is_empty());
    // A proxied Service that turns headless is a change: its rules go.
    let proxied = svc("h", "10.96.0.1", &[("", 80)]);
    assert!(t.apply(SourceEvent::ServiceUpsert(proxied)));
    assert_eq!(t.checkout().0.services.len(), 1);
    assert!(t.apply(SourceEvent::ServiceUpsert(headless.clone())));
    let (snap, changes) = t.checkout();
    assert!(snap.services.is_empty());
    assert!(changes.services.contains(&headless.name));
}

#[test]
fn service_deletion_and_slice_move() {
    let mut t = Tracker::new(IpFamily::V4, "n1");
    synced(&mut t);
    t.apply(SourceEvent::ServiceUpsert(svc(
        "a",
        "10.96.0.1",
        &[("", 80)],
    )));
    t.apply(SourceEvent::ServiceUpsert(svc(
        "b",
        "10.96.0.2",
        &[("", 80)],
    )));
    t.apply(SourceEvent::SliceUpsert(slice(
        "s",
        "a",
        &[("", 80)],
        &[("10.0.0.1", "n1")],
    )));
    t.checkout();
    // The slice's label now names Service b.
    t.apply(SourceEvent::SliceUpsert(slice(
        "s",
        "b",
        &[("", 80)],
        &[("10.0.0.1", "n1")],
    )));
    let (snap, changes) = t.checkout();
    assert_eq!(changes.services.len(), 2);
    assert!(snap.endpoints_of(&spn("a", "")).is_empty());
    assert_eq!(snap.endpoints_of(&spn("b", "")).len(), 1);
    t.apply(SourceEvent::ServiceDelete(NamespacedName::new(
        "default", "b",
    )));
    let (snap, _) = t.checkout();
    assert!(!snap.services.contains_key(&spn("b", "")));
    assert!(!snap.endpoints.contains_key(&spn("b", "")));
}

#[test]
fn topology_label_change_needs_full_resync() {
    let mut t = Tracker::new(IpFamily::V4, "n1");
    let mut node = Node {
        name: "n1".into(),
        ..Node::default()
    };
    node.labels
        .insert("topology.kubernetes.io/zone".into(), "a".into());
    assert!(t.apply(SourceEvent::NodeUpsert(node.clone())));
    assert!(!t.apply(SourceEvent::NodeUpsert(node.clone())));
    node.labels.insert("unrelated".into(), "x".into());
    assert!(
        !t.apply(SourceEvent::NodeUpsert(node.clone())),
        "non-topology labels do not matter"
    );
    let other = Node {
        name: "n2".into(),
        ..Node::default()
    };
    assert!(
        !t.apply(SourceEvent::NodeUpsert(other)),
        "other nodes are ignored"
    );
    node.labels
        .insert("topology.kubernetes.io/zone".into(), "b".into());
    assert!(t.apply(SourceEvent::NodeUpsert(node)));
    let (snap, changes) = t.checkout();
    assert!(changes.full_resync_needed);
    assert_eq!(snap.node_labels["topology.kubernetes.io/zone"], "b");
}

#[test]
fn conditions_carried() {
    let mut t = Tracker::new(IpFamily::V4, "n1");
    synced(&mut t);
    t.apply(SourceEvent::ServiceUpsert(svc(
        "a",
        "10.96.0.1",
        &[("", 80)],
    )));
    let mut sl = slice("s", "a", &[("", 80)], &[("10.0.0.1", "n1")]);
    sl.endpoints[0].conditions = EndpointConditions {
        ready: false,
        serving: true,
        terminating: true,
    };
    t.apply(SourceEvent::SliceUpsert(sl));
    let (snap, _) = t.checkout();
    let ep = &snap.endpoints_of(&spn("a", ""))[0];
    assert!(!ep.ready && ep.serving && ep.terminating);
}

// ---- property test: incremental tracking equals recomputation from scratch ----

#[derive(Debug, Clone)]
enum Op {
    UpsertService {
        svc: usize,
        ip_last: u8,
        two_ports: bool,
    },
    DeleteService {
        svc: usize,
    },
    UpsertSlice {
        slice: usize,
        owner: usize,
        eps: Vec<(u8, bool, bool)>,
    },
    DeleteSlice {
        slice: usize,
    },
    Checkout,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0..4usize, 1..4u8, any::<bool>()).prop_map(|(svc, ip_last, two_ports)| {
            Op::UpsertService {
                svc,
                ip_last,
                two_ports,
            }
        }),
        (0..4usize).prop_map(|svc| Op::DeleteService { svc }),
        (
            0..6usize,
            0..4usize,
            prop::collection::vec((1..6u8, any::<bool>(), any::<bool>()), 0..4)
        )
            .prop_map(|(slice, owner, eps)| Op::UpsertSlice { slice, owner, eps }),
        (0..6usize).prop_map(|slice| Op::DeleteSlice { slice }),
        Just(Op::Checkout),
    ]
}

fn make_service(i: usize, ip_last: u8, two_ports: bool) -> Service {
    let mut ports = vec![("http", 80)];
    if two_ports {
        ports.push(("dns", 53));
    }
    svc(&format!("svc{i}"), &format!("10.96.0.{ip_last}"), &ports)
}

fn make_slice(i: usize, owner: usize, eps: &[(u8, bool, bool)]) -> EndpointSlice {
    let mut s = slice(
        &format!("slice{i}"),
        &format!("svc{owner}"),
        &[("http", 8080), ("dns", 5353)],
        &[],
    );
    s.endpoints = eps
        .iter()
        .map(|(last, local, ready)| {
            let mut e = EndpointEntry::ready(
                ip(&format!("10.0.0.{last}")),
                Some(if *local { "n1" } else { "n2" }),
            );
            e.conditions.ready = *ready;
            e
        })
        .collect();
    s
}

proptest! {
    #[test]
    fn incremental_equals_from_scratch(ops in prop::collection::vec(op(), 1..40)) {
        let mut t = Tracker::new(IpFamily::V4, "n1");
        synced(&mut t);
        let mut services: BTreeMap<usize, Service> = BTreeMap::new();
        let mut slices: BTreeMap<usize, EndpointSlice> = BTreeMap::new();
        let mut last_checkout = t.checkout().0;
        for op in ops.into_iter().chain([Op::Checkout]) {
            match op {
                Op::UpsertService { svc, ip_last, two_ports } => {
                    let s = make_service(svc, ip_last, two_ports);
                    services.insert(svc, s.clone());
                    t.apply(SourceEvent::ServiceUpsert(s));
                }
                Op::DeleteService { svc } => {
                    services.remove(&svc);
                    t.apply(SourceEvent::ServiceDelete(NamespacedName::new("default", format!("svc{svc}"))));
                }
                Op::UpsertSlice { slice, owner, eps } => {
                    let s = make_slice(slice, owner, &eps);
                    slices.insert(slice, s.clone());
                    t.apply(SourceEvent::SliceUpsert(s));
                }
                Op::DeleteSlice { slice } => {
                    slices.remove(&slice);
                    t.apply(SourceEvent::SliceDelete(NamespacedName::new("default", format!("slice{slice}"))));
                }
                Op::Checkout => {
                    let (snap, changes) = t.checkout();
                    // The model: a fresh tracker fed only the final objects.
                    let mut fresh = Tracker::new(IpFamily::V4, "n1");
                    synced(&mut fresh);
                    for s in services.values() { fresh.apply(SourceEvent::ServiceUpsert(s.clone())); }
                    for s in slices.values() { fresh.apply(SourceEvent::SliceUpsert(s.clone())); }
                    let (expected, _) = fresh.checkout();
                    prop_assert_eq!(&*snap, &*expected);
                    // Every Service whose rendered view differs must be reported changed.
                    for (name, info) in snap.services.iter().chain(last_checkout.services.iter()) {
                        let before = (last_checkout.services.get(name), last_checkout.endpoints.get(name));
                        let after = (snap.services.get(name), snap.endpoints.get(name));
                        if before != after {
                            prop_assert!(changes.services.contains(&info.name.service), "{} changed but not reported", name);
                        }
                    }
                    last_checkout = snap;
                }
            }
        }
    }
}

/// Upstream's network-programming latency: each changed slice of the tracker's family with a
/// `last-change-trigger-time` gives one trigger time at the next checkout; a no-op update and
/// a slice of the other family give none.
#[test]
fn changed_slices_report_their_trigger_times() {
    let mut t = Tracker::new(IpFamily::V4, "node-a");
    t.apply(SourceEvent::ServiceUpsert(svc(
        "web",
        "10.96.0.10",
        &[("", 80)],
    )));
    let mut s = slice("web-1", "web", &[("", 80)], &[("10.0.1.4", "node-a")]);
    s.last_change_trigger_time = Some("2026-12-02T01:00:00Z".into());
    t.apply(SourceEvent::SliceUpsert(s.clone()));
    synced(&mut t);
    let (_, changes) = t.checkout();
    assert_eq!(changes.trigger_times, ["2026-12-02T01:00:00Z"]);
    t.apply(SourceEvent::SliceUpsert(s.clone()));
    let (_, changes) = t.checkout();
    assert!(changes.trigger_times.is_empty(), "a no-op update");
    let mut v6 = s.clone();
    v6.name = NamespacedName::new("default", "web-6");
    v6.address_type = SliceAddressType::V6;
    t.apply(SourceEvent::SliceUpsert(v6));
    let (_, changes) = t.checkout();
    assert!(changes.trigger_times.is_empty(), "another family's slice");
}

/// Runs `f` with a subscriber that records every event as `LEVEL message field=value...`.
fn logged<T>(f: impl FnOnce() -> T) -> (T, Vec<String>) {
    use std::fmt::Write as _;
    use std::sync::{Arc, Mutex};

    struct Capture(Arc<Mutex<Vec<String>>>);
    struct Line(String);
    impl tracing::field::Visit for Line {
        fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
            if field.name() == "message" {
                let _ = write!(self.0, " {value:?}");
            } else {
                let _ = write!(self.0, " {}={value:?}", field.name());
            }
        }
    }
    impl tracing::Subscriber for Capture {
        fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
            true
        }
        fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
            tracing::span::Id::from_u64(1)
        }
        fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
        fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
        fn event(&self, event: &tracing::Event<'_>) {
            let mut line = Line(event.metadata().level().to_string());
            event.record(&mut line);
            self.0.lock().unwrap().push(line.0);
        }
        fn enter(&self, _: &tracing::span::Id) {}
        fn exit(&self, _: &tracing::span::Id) {}
    }
    let lines = Arc::new(Mutex::new(Vec::new()));
    let out = tracing::subscriber::with_default(Capture(lines.clone()), f);
    let lines = lines.lock().unwrap().clone();
    (out, lines)
}

fn conflicts(lines: &[String]) -> Vec<&String> {
    lines.iter().filter(|l| l.contains("both claim")).collect()
}

#[test]
fn services_claiming_one_destination_are_warned_about_once() {
    let mut t = Tracker::new(IpFamily::V4, "n1");
    synced(&mut t);
    let (_, lines) = logged(|| {
        t.apply(SourceEvent::ServiceUpsert(svc(
            "a",
            "10.96.0.10",
            &[("", 80)],
        )));
        t.apply(SourceEvent::ServiceUpsert(svc(
            "b",
            "10.96.0.10",
            &[("", 80)],
        )));
        // Same IP, another port: no conflict.
        t.apply(SourceEvent::ServiceUpsert(svc(
            "c",
            "10.96.0.10",
            &[("", 81)],
        )));
        t.checkout();
    });
    assert_eq!(
        conflicts(&lines),
        [
            "WARN Services default/a and default/b both claim 10.96.0.10:80/TCP (the cluster IP \
             of default/a, the cluster IP of default/b); only one of them receives its traffic \
             family=IPv4"
        ],
        "{lines:#?}"
    );

    // Not again: not at the next syncs, nor when b changes without ending the conflict.
    let (_, lines) = logged(|| {
        t.checkout();
        let mut b = svc("b", "10.96.0.10", &[("", 80)]);
        b.external_ips = vec![ip("192.0.2.1")];
        t.apply(SourceEvent::ServiceUpsert(b));
        t.checkout();
        t.checkout();
    });
    assert!(conflicts(&lines).is_empty(), "{lines:#?}");

    // An external IP equal to another Service's cluster IP, same port: a new conflict.
    let (_, lines) = logged(|| {
        let mut d = svc("d", "10.96.0.20", &[("", 81)]);
        d.external_ips = vec![ip("10.96.0.10")];
        t.apply(SourceEvent::ServiceUpsert(d));
        t.checkout();
    });
    assert_eq!(
        conflicts(&lines),
        [
            "WARN Services default/c and default/d both claim 10.96.0.10:81/TCP (the cluster IP \
             of default/c, an external IP of default/d); only one of them receives its traffic \
             family=IPv4"
        ],
        "{lines:#?}"
    );

    // The conflict ends (b deleted) and comes back: warned again.
    let (_, lines) = logged(|| {
        t.apply(SourceEvent::ServiceDelete(NamespacedName::new(
            "default", "b",
        )));
        t.checkout();
        t.apply(SourceEvent::ServiceUpsert(svc(
            "b",
            "10.96.0.10",
            &[("", 80)],
        )));
        t.checkout();
    });
    assert_eq!(conflicts(&lines).len(), 1, "{lines:#?}");
    assert!(
        conflicts(&lines)[0].contains("default/a and default/b"),
        "{lines:#?}"
    );
}

#[test]
fn node_port_and_load_balancer_conflicts() {
    let mut t = Tracker::new(IpFamily::V4, "n1");
    synced(&mut t);
    let lb = |name: &str, cluster_ip: &str, vip: &str, node_port: u16| {
        let mut s = svc(name, cluster_ip, &[("", 443)]);
        s.service_type = ServiceType::LoadBalancer;
        s.ports[0].node_port = Some(node_port);
        s.load_balancer_ingress = vec![kp_model::LoadBalancerIngress {
            ip: ip(vip),
            ip_mode: kp_model::LoadBalancerIpMode::Vip,
        }];
        s
    };
    let (_, lines) = logged(|| {
        t.apply(SourceEvent::ServiceUpsert(lb(
            "x",
            "10.96.0.1",
            "203.0.113.7",
            30443,
        )));
        t.apply(SourceEvent::ServiceUpsert(lb(
            "y",
            "10.96.0.2",
            "203.0.113.7",
            30443,
        )));
        t.checkout();
    });
    let found = conflicts(&lines);
    assert_eq!(found.len(), 2, "{lines:#?}");
    assert!(
        found
            .iter()
            .any(|l| l.contains("203.0.113.7:443/TCP (a load-balancer IP of default/x")),
        "{lines:#?}"
    );
    assert!(
        found
            .iter()
            .any(|l| l.contains("node port 30443/TCP (a node port of default/x")),
        "{lines:#?}"
    );
    // Headless and other-family Services claim nothing.
    let (_, lines) = logged(|| {
        let mut h = svc("h", "10.96.0.1", &[("", 443)]);
        h.headless = true;
        h.cluster_ips.clear();
        t.apply(SourceEvent::ServiceUpsert(h));
        t.apply(SourceEvent::ServiceUpsert(svc(
            "v6",
            "fd00::1",
            &[("", 443)],
        )));
        t.checkout();
    });
    assert!(conflicts(&lines).is_empty(), "{lines:#?}");
}

#[test]
fn a_primary_ip_override_comes_before_the_node_objects_addresses() {
    let node = Node {
        name: "n1".into(),
        addresses: vec![ip("10.0.0.5"), ip("10.0.0.6"), ip("fd00::5")],
        ..Node::default()
    };
    // Of this family: first, and not repeated.
    let mut t = Tracker::new(IpFamily::V4, "n1").with_primary_ip(ip("10.0.0.6"));
    t.apply(SourceEvent::NodeUpsert(node.clone()));
    assert_eq!(t.checkout().0.node_ips, [ip("10.0.0.6"), ip("10.0.0.5")]);
    // Without a Node object it is still the primary IP.
    let mut t = Tracker::new(IpFamily::V4, "n1").with_primary_ip(ip("192.0.2.1"));
    synced(&mut t);
    assert_eq!(t.checkout().0.node_ips, [ip("192.0.2.1")]);
    // Another family's address, or 0.0.0.0, changes nothing.
    for other in ["fd00::9", "0.0.0.0"] {
        let mut t = Tracker::new(IpFamily::V4, "n1").with_primary_ip(ip(other));
        t.apply(SourceEvent::NodeUpsert(node.clone()));
        assert_eq!(t.checkout().0.node_ips, [ip("10.0.0.5"), ip("10.0.0.6")]);
    }
    let mut t = Tracker::new(IpFamily::V6, "n1").with_primary_ip(ip("fd00::9"));
    t.apply(SourceEvent::NodeUpsert(node));
    assert_eq!(t.checkout().0.node_ips, [ip("fd00::9"), ip("fd00::5")]);
}

/// A tracker keeps only the slices of its family: the IPv6 tracker of a dual-stack proxy
/// does not hold a copy of every IPv4 slice (they are never merged into its endpoints).
#[test]
fn a_tracker_keeps_only_slices_of_its_family() {
    let mut t = Tracker::new(IpFamily::V6, "node-a");
    t.apply(SourceEvent::ServiceUpsert(svc(
        "web",
        "10.96.0.10",
        &[("", 80)],
    )));
    let v4 = slice("web-1", "web", &[("", 80)], &[("10.0.1.4", "node-a")]);
    assert!(!t.apply(SourceEvent::SliceUpsert(v4.clone())));
    assert!(t.slices.is_empty() && t.slice_owner.is_empty());
    let mut v6 = slice("web-6", "web", &[("", 80)], &[]);
    v6.address_type = SliceAddressType::V6;
    v6.endpoints = slice("x", "web", &[], &[("fd00::4", "node-a")]).endpoints;
    assert!(t.apply(SourceEvent::SliceUpsert(v6)));
    assert_eq!(t.slices.values().map(Vec::len).sum::<usize>(), 1);
    // A delete of the foreign slice is a no-op.
    assert!(!t.apply(SourceEvent::SliceDelete(v4.name.clone())));
}

/// A tracker keeps only Services with a ClusterIP of its family: an IPv4-only Service is not
/// held by the IPv6 tracker of a dual-stack node, and a Service that loses its IPv6 ClusterIP
/// is removed from it (a change to sync).
#[test]
fn a_tracker_keeps_only_services_of_its_family() {
    let mut t = Tracker::new(IpFamily::V6, "node-a");
    let v4 = svc("web", "10.96.0.10", &[("", 80)]);
    assert!(!t.apply(SourceEvent::ServiceUpsert(v4.clone())));
    assert!(t.services.is_empty());
    let mut dual = v4.clone();
    dual.cluster_ips.push("fd00:10:96::10".parse().unwrap());
    assert!(t.apply(SourceEvent::ServiceUpsert(dual)));
    assert_eq!(t.services.len(), 1);
    let (snap, _) = t.checkout();
    assert_eq!(snap.services.len(), 1);
    // Back to IPv4 only: gone from this family, and the change is synced.
    assert!(t.apply(SourceEvent::ServiceUpsert(v4.clone())));
    assert!(t.services.is_empty());
    let (snap, changes) = t.checkout();
    assert!(snap.services.is_empty());
    assert!(changes.services.contains(&v4.name));
    // The IPv4 tracker keeps it.
    let mut t4 = Tracker::new(IpFamily::V4, "node-a");
    assert!(t4.apply(SourceEvent::ServiceUpsert(v4)));
    assert_eq!(t4.services.len(), 1);
}

/// One event of a dual-stack source, for [`split_batches_act_like_whole_ones`].
#[derive(Debug, Clone)]
enum DualOp {
    /// A Service with ClusterIPs of these families (neither: headless-like, none kept).
    Service {
        svc: usize,
        v4: bool,
        v6: bool,
    },
    DeleteService {
        svc: usize,
    },
    /// A slice of one family with endpoints `eps` (last octet / group).
    Slice {
        slice: usize,
        owner: usize,
        v6: bool,
        eps: Vec<u8>,
    },
    DeleteSlice {
        slice: usize,
    },
    Node {
        zone: u8,
    },
    ServiceCidr {
        object: usize,
        v4: Option<u8>,
        v6: bool,
    },
    DeleteServiceCidr {
        object: usize,
    },
}

fn dual_op() -> impl Strategy<Value = DualOp> {
    prop_oneof![
        (0..4usize, any::<bool>(), any::<bool>()).prop_map(|(svc, v4, v6)| DualOp::Service {
            svc,
            v4,
            v6
        }),
        (0..4usize).prop_map(|svc| DualOp::DeleteService { svc }),
        (
            0..6usize,
            0..4usize,
            any::<bool>(),
            prop::collection::vec(1..6u8, 0..3)
        )
            .prop_map(|(slice, owner, v6, eps)| DualOp::Slice {
                slice,
                owner,
                v6,
                eps
            }),
        (0..6usize).prop_map(|slice| DualOp::DeleteSlice { slice }),
        (0..2u8).prop_map(|zone| DualOp::Node { zone }),
        (0..3usize, prop::option::of(12..17u8), any::<bool>())
            .prop_map(|(object, v4, v6)| DualOp::ServiceCidr { object, v4, v6 }),
        (0..3usize).prop_map(|object| DualOp::DeleteServiceCidr { object }),
    ]
}

fn dual_event(op: &DualOp) -> SourceEvent {
    match op {
        DualOp::Service { svc: i, v4, v6 } => {
            let mut s = svc(&format!("svc{i}"), "10.96.0.1", &[("http", 80)]);
            s.cluster_ips.clear();
            if *v4 {
                s.cluster_ips.push(ip(&format!("10.96.0.{}", i + 1)));
            }
            if *v6 {
                s.cluster_ips.push(ip(&format!("fd00:96::{}", i + 1)));
            }
            SourceEvent::ServiceUpsert(s)
        }
        DualOp::DeleteService { svc } => {
            SourceEvent::ServiceDelete(NamespacedName::new("default", format!("svc{svc}")))
        }
        DualOp::Slice {
            slice: i,
            owner,
            v6,
            eps,
        } => {
            let mut s = slice(
                &format!("slice{i}"),
                &format!("svc{owner}"),
                &[("http", 8080)],
                &[],
            );
            s.endpoints = eps
                .iter()
                .map(|last| {
                    let a = if *v6 {
                        format!("fd00::{last}")
                    } else {
                        format!("10.0.0.{last}")
                    };
                    EndpointEntry::ready(ip(&a), Some("n1"))
                })
                .collect();
            if *v6 {
                s.address_type = SliceAddressType::V6;
            }
            SourceEvent::SliceUpsert(s)
        }
        DualOp::DeleteSlice { slice } => {
            SourceEvent::SliceDelete(NamespacedName::new("default", format!("slice{slice}")))
        }
        DualOp::Node { zone } => {
            let mut n = Node {
                name: "n1".into(),
                ..Default::default()
            };
            n.labels
                .insert("topology.kubernetes.io/zone".into(), format!("z{zone}"));
            SourceEvent::NodeUpsert(n)
        }
        DualOp::ServiceCidr { object, v4, v6 } => {
            let mut cidrs = Vec::new();
            if let Some(len) = v4 {
                cidrs.push(
                    format!("10.96.0.0/{len}")
                        .parse::<ipnet::IpNet>()
                        .unwrap()
                        .trunc(),
                );
            }
            if *v6 {
                cidrs.push("fd00:96::/112".parse().unwrap());
            }
            SourceEvent::ServiceCidrUpsert(ServiceCidr {
                name: format!("cidr{object}"),
                cidrs,
            })
        }
        DualOp::DeleteServiceCidr { object } => {
            SourceEvent::ServiceCidrDelete(format!("cidr{object}"))
        }
    }
}

proptest! {
    /// The dual-stack fan-out ([`crate::split_by_family`]): each family's tracker fed its
    /// share of every batch reports the same changes and checks out the same snapshot as one
    /// fed every whole batch, as the daemon did before the split.
    #[test]
    fn split_batches_act_like_whole_ones(
        batches in prop::collection::vec(prop::collection::vec(dual_op(), 0..8), 1..6),
    ) {
        let families = [IpFamily::V4, IpFamily::V6];
        let mut whole: Vec<Tracker> = families.iter().map(|f| Tracker::new(*f, "n1")).collect();
        let mut split: Vec<Tracker> = families.iter().map(|f| Tracker::new(*f, "n1")).collect();
        for t in whole.iter_mut().chain(split.iter_mut()) {
            synced(t);
        }
        for ops in batches {
            let batch: Vec<SourceEvent> = ops.iter().map(dual_event).collect();
            let shares = crate::split_by_family(batch.clone(), &families);
            prop_assert_eq!(shares.len(), 2);
            for (i, share) in shares.into_iter().enumerate() {
                prop_assert_eq!(share.len(), batch.len());
                let a = batch.iter().fold(false, |c, e| whole[i].apply(e.clone()) | c);
                let b = share.into_iter().fold(false, |c, e| split[i].apply(e) | c);
                prop_assert_eq!(a, b);
                let (snap_a, changes_a) = whole[i].checkout();
                let (snap_b, changes_b) = split[i].checkout();
                prop_assert_eq!(&*snap_a, &*snap_b);
                prop_assert_eq!(changes_a, changes_b);
            }
        }
    }
}

/// A batch for one family is passed through untouched; a dual-stack Service goes whole to
/// both families, a single-family one whole to its family and as a delete to the other.
#[test]
fn split_by_family_sends_each_object_whole_only_where_it_is_kept() {
    let v4 = svc("a", "10.96.0.1", &[("", 80)]);
    let mut dual = svc("b", "10.96.0.2", &[("", 80)]);
    dual.cluster_ips.push(ip("fd00::2"));
    let mut s6 = slice("b-1", "b", &[("", 80)], &[]);
    s6.address_type = SliceAddressType::V6;
    let batch = vec![
        SourceEvent::ServiceUpsert(v4.clone()),
        SourceEvent::ServiceUpsert(dual.clone()),
        SourceEvent::SliceUpsert(s6.clone()),
        SourceEvent::Synced(ObjectKind::Service),
    ];
    let one = crate::split_by_family(batch.clone(), &[IpFamily::V6]);
    assert_eq!(one, vec![batch]);
    let two = crate::split_by_family(
        vec![
            SourceEvent::ServiceUpsert(v4.clone()),
            SourceEvent::ServiceUpsert(dual.clone()),
            SourceEvent::SliceUpsert(s6.clone()),
            SourceEvent::Synced(ObjectKind::Service),
        ],
        &[IpFamily::V4, IpFamily::V6],
    );
    assert_eq!(
        two[0],
        vec![
            SourceEvent::ServiceUpsert(v4.clone()),
            SourceEvent::ServiceUpsert(dual.clone()),
            SourceEvent::SliceDelete(s6.name.clone()),
            SourceEvent::Synced(ObjectKind::Service),
        ]
    );
    assert_eq!(
        two[1],
        vec![
            SourceEvent::ServiceDelete(v4.name.clone()),
            SourceEvent::ServiceUpsert(dual),
            SourceEvent::SliceUpsert(s6),
            SourceEvent::Synced(ObjectKind::Service),
        ]
    );
}

fn service_cidr(name: &str, cidrs: &[&str]) -> SourceEvent {
    SourceEvent::ServiceCidrUpsert(ServiceCidr {
        name: name.into(),
        cidrs: cidrs.iter().map(|c| c.parse().unwrap()).collect(),
    })
}

fn cidrs(t: &mut Tracker) -> Vec<String> {
    t.checkout()
        .0
        .service_cidrs
        .iter()
        .map(ToString::to_string)
        .collect()
}

/// ServiceCIDRs: each family's tracker carries the CIDRs of its family, once, without those
/// another one contains; a change that leaves the union as it was asks for no sync; they
/// never hold back initialization.
#[test]
fn service_cidrs_are_tracked_per_family_as_a_union() {
    let mut v4 = Tracker::new(IpFamily::V4, "n1");
    let mut v6 = Tracker::new(IpFamily::V6, "n1");
    let dual = service_cidr("kubernetes", &["10.96.0.0/12", "fd00:96::/112"]);
    assert!(v4.apply(dual.clone()));
    assert!(v6.apply(dual.clone()));
    assert!(v4.has_pending_changes());
    assert!(
        !v4.is_initialized(),
        "ServiceCIDRs do not initialize a tracker"
    );
    synced(&mut v4);
    synced(&mut v6);
    assert_eq!(cidrs(&mut v4), ["10.96.0.0/12"]);
    assert_eq!(cidrs(&mut v6), ["fd00:96::/112"]);
    assert!(!v4.apply(dual), "the same object again changes nothing");
    assert!(!v4.has_pending_changes());

    // A second range inside the first: the union is the same.
    assert!(!v4.apply(service_cidr("inner", &["10.96.0.0/16"])));
    // A disjoint one is added, in address order; the IPv6 tracker does not care.
    let extra = service_cidr("extra", &["10.0.200.0/24"]);
    assert!(v4.apply(extra.clone()));
    assert!(!v6.apply(extra));
    assert_eq!(cidrs(&mut v4), ["10.0.200.0/24", "10.96.0.0/12"]);
    // The outer range goes: the inner one shows.
    assert!(v4.apply(SourceEvent::ServiceCidrDelete("kubernetes".into())));
    assert_eq!(cidrs(&mut v4), ["10.0.200.0/24", "10.96.0.0/16"]);
    // A change undone before the checkout: the undoing asks for nothing, and the snapshot
    // stays as it was.
    assert!(v4.apply(SourceEvent::ServiceCidrDelete("extra".into())));
    assert!(!v4.apply(service_cidr("extra", &["10.0.200.0/24"])));
    let (snap, changes) = v4.checkout();
    assert!(changes.is_empty());
    assert_eq!(snap.service_cidrs.len(), 2);
    assert!(!v4.apply(SourceEvent::ServiceCidrDelete("missing".into())));
    // Deleting everything empties the list.
    for name in ["inner", "extra"] {
        v4.apply(SourceEvent::ServiceCidrDelete(name.into()));
    }
    assert!(cidrs(&mut v4).is_empty());
}
