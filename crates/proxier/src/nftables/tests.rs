//! Sync tests with the real `nft` and kernel, each in network namespaces it creates (root;
//! CI runs them as root): full and partial syncs, identical re-syncs, partial == fresh full,
//! stale objects, a rejected transaction, cleanup, and the size of partial payloads.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use kp_model::{
    Changes, EndpointSlice, IpFamily, NamespacedName, ObjectKind, Protocol, Service, SourceEvent,
};
use kp_netfilter::{ExecNft, IpVersion, Nft, NftVersion, SystemExec, TableObjects};
use kp_testkit::builders::{ServiceBuilder, SliceBuilder, ip};
use kp_testkit::{Netns, require_root};
use kp_track::Tracker;

use super::*;
use crate::FakeHost;

/// The real runner inside a namespace, recording payloads; `fail_next` makes the kernel
/// reject the next transaction (an extra command referencing a chain that does not exist is
/// appended, so the whole payload must be rolled back). `streamed` records, per payload,
/// whether it came through [`Nft::apply_with`] (it is then passed on to nft's stdin through
/// the real runner's streaming path).
struct TestNft {
    inner: ExecNft,
    fail_next: AtomicBool,
    payloads: Mutex<Vec<String>>,
    streamed: Mutex<Vec<bool>>,
}

impl TestNft {
    fn new(ns: &Netns) -> Self {
        TestNft {
            inner: ExecNft::with_exec(Arc::new(SystemExec::with_prefix(vec![
                "ip".into(),
                "netns".into(),
                "exec".into(),
                ns.name().into(),
            ]))),
            fail_next: AtomicBool::new(false),
            payloads: Mutex::new(Vec::new()),
            streamed: Mutex::new(Vec::new()),
        }
    }

    /// Records `payload` and adds the failing command when asked to.
    fn record(&self, payload: &[u8], streamed: bool) -> String {
        let mut text = String::from_utf8_lossy(payload).into_owned();
        self.payloads.lock().unwrap().push(text.clone());
        self.streamed.lock().unwrap().push(streamed);
        if self.fail_next.swap(false, Ordering::SeqCst) {
            text.push_str("add rule ip kube-proxy services jump no-such-chain\n");
        }
        text
    }

    fn last_payload(&self) -> String {
        self.payloads
            .lock()
            .unwrap()
            .last()
            .cloned()
            .unwrap_or_default()
    }
}

impl Nft for TestNft {
    fn apply(&self, payload: &[u8]) -> Result<(), kp_netfilter::Error> {
        let text = self.record(payload, false);
        self.inner.apply(text.as_bytes())
    }
    fn apply_with(
        &self,
        payload: &mut kp_netfilter::PayloadWriter<'_>,
    ) -> Result<(), kp_netfilter::Error> {
        let mut buf = Vec::new();
        payload(&mut buf).map_err(|source| kp_netfilter::Error::Io {
            command: "test payload".into(),
            source,
        })?;
        let text = self.record(&buf, true);
        self.inner.apply_with(&mut |w| w.write_all(text.as_bytes()))
    }
    fn list_table(&self, f: IpVersion, t: &str) -> Result<Option<String>, kp_netfilter::Error> {
        self.inner.list_table(f, t)
    }
    fn list_chain(
        &self,
        f: IpVersion,
        t: &str,
        c: &str,
    ) -> Result<Option<String>, kp_netfilter::Error> {
        self.inner.list_chain(f, t, c)
    }
    fn list_objects(&self, f: IpVersion, t: &str) -> Result<TableObjects, kp_netfilter::Error> {
        self.inner.list_objects(f, t)
    }
    fn delete_table(&self, f: IpVersion, t: &str) -> Result<bool, kp_netfilter::Error> {
        self.inner.delete_table(f, t)
    }
    fn version(&self) -> Result<NftVersion, kp_netfilter::Error> {
        self.inner.version()
    }
}

const NODE: &str = "k8s-master";

fn cfg() -> NftablesConfig {
    NftablesConfig {
        local_detector: LocalDetector::Cidrs(vec!["10.0.0.0/16".parse().unwrap()]),
        nodeport_addresses: NodePortAddresses::all(),
        ..NftablesConfig::default()
    }
}

fn proxier(ns: &Netns, family: IpFamily, cfg: NftablesConfig) -> NftablesProxier<TestNft> {
    let host = FakeHost::with_addresses(vec![ip("192.168.56.10"), ip("fd00:56::10")]);
    NftablesProxier::new(family, cfg, TestNft::new(ns), Arc::new(host)).unwrap()
}

fn tracker(family: IpFamily) -> Tracker {
    let mut t = Tracker::new(family, NODE);
    for k in [
        ObjectKind::Service,
        ObjectKind::EndpointSlice,
        ObjectKind::Node,
    ] {
        t.apply(SourceEvent::Synced(k));
    }
    t.apply(SourceEvent::NodeUpsert(kp_model::Node {
        name: NODE.to_string(),
        addresses: vec![ip("192.168.56.10"), ip("fd00:56::10")],
        ..kp_model::Node::default()
    }));
    t
}

fn listing<N: Nft>(p: &NftablesProxier<N>) -> String {
    p.runner()
        .list_table(ip_version(p.family()), names::TABLE)
        .unwrap()
        .unwrap_or_default()
}

fn canonical<N: Nft>(p: &NftablesProxier<N>) -> String {
    kp_netfilter::canonical_listing(&listing(p))
}

fn sync<N: Nft>(p: &mut NftablesProxier<N>, t: &mut Tracker) -> SyncReport {
    let (snap, changes) = t.checkout();
    p.sync(&snap, &changes).unwrap()
}

/// A fresh namespace, fully synced with the tracker's current snapshot: what a partial sync
/// must converge to.
fn fresh_listing(t: &mut Tracker, family: IpFamily, cfg: NftablesConfig) -> String {
    let ns = Netns::new("nft-fresh").unwrap();
    let mut p = proxier(&ns, family, cfg);
    // Called right after a sync: no change is pending, checking out only reads.
    let snap = t.checkout().0;
    p.sync(&snap, &Changes::default()).unwrap();
    canonical(&p)
}

fn svc(name: &str, cip: &str, port: u16) -> Service {
    ServiceBuilder::new(name, cip).tcp("", port).build()
}

fn slice(svc: &str, port: u16, eps: &[(&str, &str)]) -> EndpointSlice {
    let mut b = SliceBuilder::new(svc)
        .named(&format!("{svc}-x"))
        .port("", port);
    for (a, n) in eps {
        b = b.ready(a, n);
    }
    b.build()
}

fn service_cidr(name: &str, cidrs: &[&str]) -> SourceEvent {
    SourceEvent::ServiceCidrUpsert(kp_model::ServiceCidr {
        name: name.into(),
        cidrs: cidrs.iter().map(|c| c.parse().unwrap()).collect(),
    })
}

fn seed_events() -> Vec<SourceEvent> {
    vec![
        SourceEvent::ServiceUpsert(svc("nginx-svc", "10.96.138.71", 8080)),
        SourceEvent::SliceUpsert(slice(
            "nginx-svc",
            80,
            &[("10.0.0.4", NODE), ("10.0.1.2", "k8s-worker")],
        )),
    ]
}

#[test]
fn full_sync_then_identical_resyncs() {
    if !require_root() {
        return;
    }
    let ns = Netns::new("nft-seed").unwrap();
    let mut t = tracker(IpFamily::V4);
    for e in seed_events() {
        t.apply(e);
    }
    let mut p = proxier(&ns, IpFamily::V4, cfg());
    let report = sync(&mut p, &mut t);
    assert!(report.full);
    assert_eq!((report.service_ports, report.endpoints), (1, 2));
    let first = listing(&p);
    for needle in [
        "table ip kube-proxy {",
        "comment \"rules for kube-proxy\"",
        "type filter hook prerouting priority dstnat - 10; policy accept;",
        "type nat hook postrouting priority srcnat; policy accept;",
        "chain service-O4TPQO6D-default/nginx-svc/tcp/ {",
        // What nft prints for upstream's `dnat ip addr . port to numgen … map { … }`.
        "meta l4proto tcp dnat ip to numgen random mod 2 map { 0 : 10.0.0.4 . 80, 1 : 10.0.1.2 . 80 }",
        "10.96.138.71 . tcp . 8080 : goto service-O4TPQO6D-default/nginx-svc/tcp/",
        "masquerade fully-random",
    ] {
        assert!(first.contains(needle), "missing {needle:?} in\n{first}");
    }
    // The parser understands what the kernel prints.
    let objects = p
        .runner()
        .list_objects(IpVersion::V4, names::TABLE)
        .unwrap();
    assert!(objects.exists);
    assert_eq!(
        objects.chains[names::FILTER_PREROUTING_PRE_DNAT]
            .as_ref()
            .and_then(|s| s.priority),
        Some(-110)
    );
    assert_eq!(objects.chains.len(), 8 + 7 + 1);

    // No change: a partial sync with nothing to do.
    let report = sync(&mut p, &mut t);
    assert!(!report.full);
    assert_eq!(report.payload_bytes, 0);
    assert_eq!(listing(&p), first);
    // A forced full sync rewrites everything and leaves the same table, byte for byte.
    let snap = t.checkout().0;
    let forced = Changes {
        full_resync_needed: true,
        ..Changes::default()
    };
    assert!(p.sync(&snap, &forced).unwrap().full);
    assert_eq!(listing(&p), first);
    // So does a new proxier (a restart), whose first sync is full.
    let mut restarted = proxier(&ns, IpFamily::V4, cfg());
    assert!(restarted.sync(&snap, &Changes::default()).unwrap().full);
    assert_eq!(listing(&restarted), first);
}

fn feature_services() -> Vec<SourceEvent> {
    vec![
        SourceEvent::ServiceUpsert(
            ServiceBuilder::new("shop/web", "10.96.0.10")
                .tcp("http", 80)
                .node_port(30080)
                .udp("metrics", 9125)
                .port("diameter", Protocol::Sctp, 3868)
                .external_ips(&["203.0.113.10"])
                .load_balancer(&["198.51.100.7"])
                .source_ranges(&["192.168.56.0/24", "203.0.113.0/24"])
                .external_local(Some(32000))
                .affinity(600)
                .build(),
        ),
        SourceEvent::SliceUpsert(
            SliceBuilder::new("shop/web")
                .port("http", 8080)
                .port_proto("metrics", Protocol::Udp, 9125)
                .port_proto("diameter", Protocol::Sctp, 3868)
                .ready("10.0.1.4", NODE)
                .ready("10.0.2.5", "node-b")
                .build(),
        ),
        SourceEvent::ServiceUpsert(
            ServiceBuilder::new("shop/empty", "10.96.0.11")
                .tcp("", 80)
                .node_port(30081)
                .build(),
        ),
        SourceEvent::ServiceUpsert(
            ServiceBuilder::new("shop/itp", "10.96.0.12")
                .tcp("", 80)
                .internal_local()
                .build(),
        ),
        SourceEvent::SliceUpsert(slice("shop/itp", 80, &[("10.0.2.6", "node-b")])),
    ]
}

#[test]
fn partial_syncs_equal_a_fresh_full_sync() {
    if !require_root() {
        return;
    }
    let ns = Netns::new("nft-partial").unwrap();
    let mut t = tracker(IpFamily::V4);
    for i in 0..4u8 {
        t.apply(SourceEvent::ServiceUpsert(svc(
            &format!("s{i}"),
            &format!("10.96.0.{}", 100 + i),
            80,
        )));
        t.apply(SourceEvent::SliceUpsert(slice(
            &format!("s{i}"),
            8080,
            &[
                (&format!("10.0.{i}.1"), NODE),
                (&format!("10.0.{i}.2"), "b"),
            ],
        )));
    }
    let mut p = proxier(&ns, IpFamily::V4, cfg());
    assert!(sync(&mut p, &mut t).full);
    let steps: Vec<(&str, Vec<SourceEvent>)> = vec![
        ("every feature at once", feature_services()),
        (
            "remove an endpoint",
            vec![SourceEvent::SliceUpsert(slice(
                "s1",
                8080,
                &[("10.0.1.1", NODE)],
            ))],
        ),
        (
            "no endpoints left, a new port, a new Service",
            vec![
                SourceEvent::SliceDelete(NamespacedName::new("default", "s2-x")),
                SourceEvent::ServiceUpsert(svc("s3", "10.96.0.103", 81)),
                SourceEvent::ServiceUpsert(svc("new", "10.96.0.50", 80)),
                SourceEvent::SliceUpsert(slice("new", 80, &[("10.0.9.9", NODE)])),
            ],
        ),
        (
            "two Services claim one external IP and port",
            vec![
                SourceEvent::ServiceUpsert(
                    ServiceBuilder::new("s0", "10.96.0.100")
                        .tcp("", 80)
                        .external_ips(&["203.0.113.50"])
                        .build(),
                ),
                SourceEvent::ServiceUpsert(
                    ServiceBuilder::new("s1", "10.96.0.101")
                        .tcp("", 80)
                        .external_ips(&["203.0.113.50"])
                        .build(),
                ),
            ],
        ),
        (
            "the winning claim goes away",
            vec![SourceEvent::ServiceDelete(NamespacedName::new(
                "default", "s0",
            ))],
        ),
        (
            "affinity timeout and policy change, a port goes away",
            vec![SourceEvent::ServiceUpsert(
                ServiceBuilder::new("shop/web", "10.96.0.10")
                    .tcp("http", 80)
                    .node_port(30080)
                    .load_balancer(&["198.51.100.7"])
                    .affinity(60)
                    .build(),
            )],
        ),
        (
            "affinity off, Services deleted",
            vec![
                SourceEvent::ServiceUpsert(
                    ServiceBuilder::new("shop/web", "10.96.0.10")
                        .tcp("http", 80)
                        .build(),
                ),
                SourceEvent::ServiceDelete(NamespacedName::new("shop", "itp")),
                SourceEvent::ServiceDelete(NamespacedName::new("default", "s1")),
            ],
        ),
        (
            "a ServiceCIDR appears",
            vec![service_cidr(
                "kubernetes",
                &["10.96.0.0/12", "fd00:96::/112"],
            )],
        ),
        (
            "a disjoint ServiceCIDR, one inside the first, and a Service change",
            vec![
                service_cidr("extra", &["10.0.200.0/24"]),
                service_cidr("inner", &["10.96.0.0/16"]),
                SourceEvent::ServiceUpsert(svc("s3", "10.96.0.103", 82)),
            ],
        ),
        (
            "the first ServiceCIDR goes",
            vec![SourceEvent::ServiceCidrDelete("kubernetes".into())],
        ),
        (
            "every ServiceCIDR goes",
            vec![
                SourceEvent::ServiceCidrDelete("extra".into()),
                SourceEvent::ServiceCidrDelete("inner".into()),
            ],
        ),
    ];
    for (what, events) in steps {
        let cidr_step = events.iter().any(|e| {
            matches!(
                e,
                SourceEvent::ServiceCidrUpsert(_) | SourceEvent::ServiceCidrDelete(_)
            )
        });
        for e in events {
            t.apply(e);
        }
        let report = sync(&mut p, &mut t);
        assert!(!report.full, "{what}: expected a partial sync");
        if cidr_step {
            assert!(
                p.runner()
                    .last_payload()
                    .starts_with("flush chain ip kube-proxy cluster-ips-check\n"),
                "{what}: {}",
                p.runner().last_payload()
            );
        }
        assert_eq!(
            canonical(&p),
            fresh_listing(&mut t, IpFamily::V4, cfg()),
            "{what}: the partial sync differs from a fresh full sync; payload:\n{}",
            p.runner().last_payload()
        );
    }
}

#[test]
fn ipv6_and_other_settings_load() {
    if !require_root() {
        return;
    }
    let ns = Netns::new("nft-v6").unwrap();
    let mut t = tracker(IpFamily::V6);
    t.apply(SourceEvent::ServiceUpsert(
        ServiceBuilder::new("dns", "fd00:96::a")
            .udp("dns", 53)
            .node_port(30053)
            .external_local(None)
            .affinity(100)
            .build(),
    ));
    t.apply(SourceEvent::SliceUpsert(
        SliceBuilder::new("dns")
            .ipv6()
            .port_proto("dns", Protocol::Udp, 5353)
            .ready("fd00:10:1::4", NODE)
            .ready("fd00:10:2::5", "node-b")
            .build(),
    ));
    let settings = [
        cfg(),
        NftablesConfig {
            masquerade_all: true,
            masquerade_bit: 3,
            local_detector: LocalDetector::InterfaceNamePrefix("veth".into()),
            nodeport_addresses: NodePortAddresses::parse(&["fd00:56::/64"]).unwrap(),
        },
        NftablesConfig {
            local_detector: LocalDetector::BridgeInterface("cbr0".into()),
            ..NftablesConfig::default()
        },
    ];
    for c in settings {
        // Switching settings in place: the next sync is full, and equals a fresh one.
        let mut p = proxier(&ns, IpFamily::V6, c.clone());
        let report = p.sync(&t.checkout().0, &Changes::default()).unwrap();
        assert!(report.full && report.endpoints == 2);
        assert_eq!(canonical(&p), fresh_listing(&mut t, IpFamily::V6, c));
        assert!(listing(&p).contains("dnat to [fd00:10:1::4]:5353"));
    }
}

#[test]
fn a_full_sync_removes_stale_and_foreign_objects() {
    if !require_root() {
        return;
    }
    let ns = Netns::new("nft-stale").unwrap();
    let nft = TestNft::new(&ns);
    // Objects of an earlier run and of another layout: a stale Service chain referenced from
    // a map element and from another stale chain, a stale affinity set, a base chain with the
    // wrong priority, a foreign base chain, a foreign map and set, a foreign regular chain.
    nft.apply(
        b"add table ip kube-proxy { comment \"rules for kube-proxy\" ; }\n\
          add chain ip kube-proxy nat-prerouting { type nat hook prerouting priority 0 ; }\n\
          add chain ip kube-proxy filter-output-post-dnat { type filter hook output priority -90 ; }\n\
          add chain ip kube-proxy mark-for-masquerade\n\
          add rule ip kube-proxy mark-for-masquerade mark set mark or 0x4000\n\
          add map ip kube-proxy service-ips { type ipv4_addr . inet_proto . inet_service : verdict ; }\n\
          add map ip kube-proxy old-map { type inet_service : verdict ; }\n\
          add set ip kube-proxy old-set { type ipv4_addr ; }\n\
          add set ip kube-proxy affinity-AAAAAAAA-default/gone/tcp/__10.0.0.9/80 { type ipv4_addr ; flags dynamic,timeout ; timeout 3h ; }\n\
          add chain ip kube-proxy service-AAAAAAAA-default/gone/tcp/\n\
          add chain ip kube-proxy endpoint-AAAAAAAA-default/gone/tcp/__10.0.0.9/80\n\
          add rule ip kube-proxy endpoint-AAAAAAAA-default/gone/tcp/__10.0.0.9/80 update @affinity-AAAAAAAA-default/gone/tcp/__10.0.0.9/80 { ip saddr }\n\
          add rule ip kube-proxy service-AAAAAAAA-default/gone/tcp/ goto endpoint-AAAAAAAA-default/gone/tcp/__10.0.0.9/80\n\
          add rule ip kube-proxy filter-output-post-dnat jump mark-for-masquerade\n\
          add element ip kube-proxy service-ips { 10.96.9.9 . tcp . 80 : goto service-AAAAAAAA-default/gone/tcp/ }\n\
          add element ip kube-proxy old-map { 80 : goto mark-for-masquerade }\n",
    )
    .unwrap();
    let mut t = tracker(IpFamily::V4);
    for e in seed_events().into_iter().chain(feature_services()) {
        t.apply(e);
    }
    let mut p = NftablesProxier::new(
        IpFamily::V4,
        cfg(),
        nft,
        Arc::new(FakeHost::with_addresses(vec![ip("192.168.56.10")])),
    )
    .unwrap();
    let report = sync(&mut p, &mut t);
    assert!(report.full);
    assert_eq!(report.deleted_chains, 3, "{}", p.runner().last_payload());
    let text = listing(&p);
    for gone in [
        "gone",
        "old-map",
        "old-set",
        "post-dnat",
        "mark-for-masquerade",
        "priority filter; policy accept;\n\t\tjump services",
    ] {
        assert!(!text.contains(gone), "{gone:?} is still there:\n{text}");
    }
    assert_eq!(canonical(&p), fresh_listing(&mut t, IpFamily::V4, cfg()));
}

#[test]
fn a_rejected_transaction_changes_nothing_and_the_next_sync_is_full() {
    if !require_root() {
        return;
    }
    let ns = Netns::new("nft-fail").unwrap();
    let mut t = tracker(IpFamily::V4);
    for e in seed_events() {
        t.apply(e);
    }
    let mut p = proxier(&ns, IpFamily::V4, cfg());
    sync(&mut p, &mut t);
    let before = listing(&p);
    // A change whose transaction the kernel rejects.
    t.apply(SourceEvent::SliceUpsert(slice(
        "nginx-svc",
        80,
        &[("10.0.0.5", NODE)],
    )));
    t.apply(SourceEvent::ServiceUpsert(svc("other", "10.96.0.77", 80)));
    p.runner().fail_next.store(true, Ordering::SeqCst);
    let (snap, changes) = t.checkout();
    let err = p.sync(&snap, &changes).unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("nft -f -") && text.contains("no-such-chain"),
        "{text}"
    );
    assert_eq!(
        listing(&p),
        before,
        "a rejected transaction must change nothing"
    );
    // The next sync (no new changes) is a full one and applies the change.
    let report = sync(&mut p, &mut t);
    assert!(report.full);
    let after = listing(&p);
    assert!(after.contains("0 : 10.0.0.5 . 80 }") && !after.contains("10.0.1.2 . 80"));
    assert!(after.contains("10.96.0.77 . tcp . 80"));
    assert_eq!(canonical(&p), fresh_listing(&mut t, IpFamily::V4, cfg()));
}

#[test]
fn cleanup_deletes_both_tables() {
    if !require_root() {
        return;
    }
    let ns = Netns::new("nft-cleanup").unwrap();
    let mut t4 = tracker(IpFamily::V4);
    let mut t6 = tracker(IpFamily::V6);
    for e in seed_events() {
        t4.apply(e);
    }
    let mut p4 = proxier(&ns, IpFamily::V4, cfg());
    let mut p6 = proxier(&ns, IpFamily::V6, cfg());
    sync(&mut p4, &mut t4);
    sync(&mut p6, &mut t6);
    // Rules of other software stay.
    let nft = TestNft::new(&ns);
    nft.apply(
        b"add table inet other\nadd chain inet other c { type filter hook input priority 0 ; }\n",
    )
    .unwrap();
    assert!(listing(&p6).contains("table ip6 kube-proxy"));
    assert_eq!(cleanup(&nft).unwrap(), [IpFamily::V4, IpFamily::V6]);
    assert_eq!(nft.list_table(IpVersion::V4, names::TABLE).unwrap(), None);
    assert_eq!(nft.list_table(IpVersion::V6, names::TABLE).unwrap(), None);
    assert!(
        cleanup(&nft).unwrap().is_empty(),
        "a second cleanup is a no-op"
    );
    let rest = ns.run("nft", ["list", "ruleset"]).unwrap();
    assert!(rest.contains("table inet other"), "{rest}");
}

#[test]
fn partial_payloads_do_not_grow_with_the_number_of_services() {
    if !require_root() {
        return;
    }
    let mut sizes: Vec<Vec<usize>> = Vec::new();
    for others in [10usize, 2000] {
        let ns = Netns::new("nft-scale").unwrap();
        let mut t = tracker(IpFamily::V4);
        for i in 0..others {
            let name = format!("bulk-{i}");
            t.apply(SourceEvent::ServiceUpsert(svc(
                &name,
                &format!("10.97.{}.{}", i / 256, i % 256),
                80,
            )));
            t.apply(SourceEvent::SliceUpsert(slice(
                &name,
                8080,
                &[
                    (&format!("10.1.{}.{}", i / 256, i % 256), NODE),
                    (&format!("10.2.{}.{}", i / 256, i % 256), "b"),
                ],
            )));
        }
        for e in seed_events() {
            t.apply(e);
        }
        let mut p = proxier(&ns, IpFamily::V4, cfg());
        assert!(sync(&mut p, &mut t).full);
        let mut step = Vec::new();
        // Change one endpoint.
        t.apply(SourceEvent::SliceUpsert(slice(
            "nginx-svc",
            80,
            &[("10.0.0.4", NODE), ("10.0.1.3", "k8s-worker")],
        )));
        step.push(sync(&mut p, &mut t));
        // Add one Service.
        t.apply(SourceEvent::ServiceUpsert(svc("added", "10.96.5.5", 80)));
        t.apply(SourceEvent::SliceUpsert(slice(
            "added",
            80,
            &[("10.0.5.5", "b")],
        )));
        step.push(sync(&mut p, &mut t));
        // Delete one Service.
        t.apply(SourceEvent::ServiceDelete(NamespacedName::new(
            "default", "added",
        )));
        step.push(sync(&mut p, &mut t));
        assert!(step.iter().all(|r| !r.full));
        sizes.push(step.iter().map(|r| r.payload_bytes).collect());
        assert_eq!(canonical(&p), fresh_listing(&mut t, IpFamily::V4, cfg()));
    }
    assert_eq!(
        sizes[0], sizes[1],
        "one-Service payloads with 10 and with 2,000 other Services"
    );
    assert!(sizes[0].iter().all(|s| *s > 0 && *s < 2000), "{sizes:?}");
}

#[test]
fn every_payload_is_one_transaction() {
    if !require_root() {
        return;
    }
    // Stale chains are deleted in the same transaction that removes their last reference
    // (kernel >= 6.2); a partial sync that deletes a Service is accepted at once.
    let ns = Netns::new("nft-onetx").unwrap();
    let mut t = tracker(IpFamily::V4);
    for e in seed_events().into_iter().chain(feature_services()) {
        t.apply(e);
    }
    let mut p = proxier(&ns, IpFamily::V4, cfg());
    let first = sync(&mut p, &mut t);
    // The full sync is written into nft's stdin as it is rendered; its report counts the
    // bytes written.
    assert!(first.full);
    assert_eq!(*p.runner().streamed.lock().unwrap(), [true]);
    assert_eq!(first.payload_bytes, p.runner().last_payload().len());
    let applied_before = p.runner().payloads.lock().unwrap().len();
    t.apply(SourceEvent::ServiceDelete(NamespacedName::new(
        "shop", "web",
    )));
    let report = sync(&mut p, &mut t);
    assert!(!report.full);
    assert!(report.deleted_chains >= 8, "{report:?}");
    assert_eq!(
        p.runner().payloads.lock().unwrap().len(),
        applied_before + 1
    );
    // A partial payload is small and goes in one buffer.
    assert_eq!(*p.runner().streamed.lock().unwrap(), [true, false]);
    let payload = p.runner().last_payload();
    let flushes = payload.find("flush chain").unwrap();
    let deletes = payload.find("delete chain").unwrap();
    assert!(flushes < deletes);
    assert!(!listing(&p).contains("shop/web"));
    let changed: BTreeSet<NamespacedName> = [NamespacedName::new("shop", "web")].into();
    assert!(!p.state().fixed().is_empty() && !changed.is_empty());
}

/// The check between syncs lists `nat-prerouting` only: nothing to report while the table
/// is intact (and nothing written); `nft delete table` and `nft flush table` (which keeps
/// chains, sets and elements but no rule) are both noticed, in both families, and the next
/// sync, with no change of Services, is full and leaves the table exactly as it was.
#[test]
fn a_deleted_or_flushed_table_is_noticed_and_the_next_sync_repairs_it() {
    if !require_root() {
        return;
    }
    for (family, fam, cip, ep) in [
        (IpFamily::V4, "ip", "10.96.0.10", "10.0.1.4"),
        (IpFamily::V6, "ip6", "fd00:10:96::a", "fd00:10:244::4"),
    ] {
        let ns = Netns::new("nft-canary").unwrap();
        let mut t = tracker(family);
        t.apply(SourceEvent::ServiceUpsert(svc("web", cip, 80)));
        let mut sl = slice("web", 8080, &[(ep, NODE)]);
        if family == IpFamily::V6 {
            sl.address_type = kp_model::SliceAddressType::V6;
        }
        t.apply(SourceEvent::SliceUpsert(sl));
        let mut p = proxier(&ns, family, cfg());
        assert!(
            !p.check_dataplane().unwrap(),
            "nothing to check before the first sync"
        );
        let report = sync(&mut p, &mut t);
        assert!(report.full && report.endpoints == 1, "{report:?}");
        let good = canonical(&p);
        let applied = p.runner().payloads.lock().unwrap().len();
        assert!(!p.check_dataplane().unwrap());
        assert_eq!(p.runner().payloads.lock().unwrap().len(), applied);
        for command in ["delete", "flush"] {
            ns.run("nft", [command, "table", fam, names::TABLE])
                .unwrap();
            assert_ne!(canonical(&p), good);
            assert!(p.check_dataplane().unwrap(), "{fam}: nft {command} table");
            // The next sync is full anyway: nothing more to check until it ran.
            assert!(!p.check_dataplane().unwrap());
            let report = sync(&mut p, &mut t);
            assert!(
                report.full,
                "{fam}: the repair after {command} is a full sync"
            );
            assert_eq!(canonical(&p), good, "{fam}: {command}");
            assert!(!p.check_dataplane().unwrap());
        }
    }
}
