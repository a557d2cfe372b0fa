//! Sync tests of the IPVS proxier against the checking fakes (IPVS table, ipset, links,
//! iptables): what a first sync creates, that an unchanged re-sync sends nothing, that a
//! one-Service change sends only its differences, graceful termination, repair of another
//! tool's change on a full sync, failures forcing a full retry, and cleanup.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use kp_model::{Changes, IpFamily, Service};
use kp_netfilter::ipset::FakeIpset;
use kp_netfilter::{FakeIptables, IpVersion};
use kp_netlink::ipvs::{FakeIpvs, IpvsInfo, OpError};
use kp_netlink::link::{FakeLinks, LinkResult};
use kp_testkit::builders::{ServiceBuilder, SliceBuilder, ip, snapshot};

use super::*;
use crate::FakeHost;

/// A fake IPVS table the test keeps a handle on.
#[derive(Clone, Default)]
struct SharedIpvs(Arc<Mutex<FakeIpvs>>);

impl IpvsOps for SharedIpvs {
    fn info(&mut self) -> kp_netlink::Result<IpvsInfo> {
        self.0.lock().unwrap().info()
    }
    fn services(&mut self) -> kp_netlink::Result<Vec<VirtualServer>> {
        self.0.lock().unwrap().services()
    }
    fn destinations(&mut self, svc: &ServiceKey) -> kp_netlink::Result<Vec<RealServer>> {
        self.0.lock().unwrap().destinations(svc)
    }
    fn apply(&mut self, ops: &[IpvsOp]) -> kp_netlink::Result<Vec<Result<(), OpError>>> {
        self.0.lock().unwrap().apply(ops)
    }
    fn flush(&mut self) -> kp_netlink::Result<()> {
        self.0.lock().unwrap().flush()
    }
}

/// Fake links the test keeps a handle on.
#[derive(Clone)]
struct SharedLinks(Arc<Mutex<FakeLinks>>);

impl LinkOps for SharedLinks {
    fn ensure_dummy(&mut self, name: &str) -> LinkResult<u32> {
        self.0.lock().unwrap().ensure_dummy(name)
    }
    fn link_index(&mut self, name: &str) -> LinkResult<Option<u32>> {
        self.0.lock().unwrap().link_index(name)
    }
    fn addresses(&mut self, name: &str) -> LinkResult<Vec<IpAddr>> {
        self.0.lock().unwrap().addresses(name)
    }
    fn add_addresses(&mut self, name: &str, addrs: &[IpAddr]) -> LinkResult<Vec<LinkResult<()>>> {
        self.0.lock().unwrap().add_addresses(name, addrs)
    }
    fn del_addresses(&mut self, name: &str, addrs: &[IpAddr]) -> LinkResult<Vec<LinkResult<()>>> {
        self.0.lock().unwrap().del_addresses(name, addrs)
    }
    fn delete_link(&mut self, name: &str) -> LinkResult<bool> {
        self.0.lock().unwrap().delete_link(name)
    }
    fn local_addresses(&mut self) -> LinkResult<Vec<(String, IpAddr)>> {
        self.0.lock().unwrap().local_addresses()
    }
}

/// An ipset fake the test keeps a handle on.
#[derive(Clone)]
struct SharedIpset(Arc<FakeIpset>);

impl Ipset for SharedIpset {
    fn version(&self) -> Result<kp_netfilter::ipset::IpsetVersion, kp_netfilter::Error> {
        self.0.version()
    }
    fn save(&self) -> Result<Vec<SetState>, kp_netfilter::Error> {
        self.0.save()
    }
    fn restore(&self, payload: &[u8]) -> Result<(), kp_netfilter::Error> {
        self.0.restore(payload)
    }
}

struct Env {
    ipvs: SharedIpvs,
    links: SharedLinks,
    ipset: SharedIpset,
    proxier: IpvsProxier<FakeIptables>,
}

fn env(cfg: IpvsConfig) -> Env {
    let ipvs = SharedIpvs::default();
    let mut fake_links = FakeLinks::new();
    fake_links.add_link("eth0", &[ip("192.168.56.10")]);
    fake_links.add_link("lo", &[ip("127.0.0.1")]);
    let links = SharedLinks(Arc::new(Mutex::new(fake_links)));
    let ipset = SharedIpset(Arc::new(FakeIpset::new()));
    let proxier = IpvsProxier::new(
        IpFamily::V4,
        cfg,
        FakeIptables::new(IpVersion::V4),
        Box::new(ipset.clone()),
        Box::new(ipvs.clone()),
        Box::new(links.clone()),
        Arc::new(FakeHost::default()),
    )
    .unwrap();
    Env {
        ipvs,
        links,
        ipset,
        proxier,
    }
}

fn web(eps: &[&str]) -> (Service, kp_model::EndpointSlice) {
    let svc = ServiceBuilder::new("ns/web", "10.96.0.10")
        .tcp("", 80)
        .node_port(30080)
        .build();
    let mut slice = SliceBuilder::new("ns/web").port("", 8080);
    for e in eps {
        slice = slice.ready(e, "node-b");
    }
    (svc, slice.build())
}

fn snap(services: Vec<(Service, kp_model::EndpointSlice)>) -> Snapshot {
    let (s, e): (Vec<_>, Vec<_>) = services.into_iter().unzip();
    snapshot(IpFamily::V4, "node-a", s, e)
}

fn changed(name: &str) -> Changes {
    Changes {
        services: {
            let (ns, n) = name.split_once('/').unwrap();
            [kp_model::NamespacedName::service(ns, n).unwrap()]
                .into_iter()
                .collect()
        },
        ..Changes::default()
    }
}

fn key(addr: &str, port: u16) -> ServiceKey {
    ServiceKey::new(ip(addr), proto::TCP, port)
}

fn dests(e: &Env, k: &ServiceKey) -> Vec<(SocketAddr, u32)> {
    e.ipvs
        .0
        .lock()
        .unwrap()
        .dests(k)
        .map(|d| {
            let mut v: Vec<_> = d.iter().map(|r| (r.socket_addr(), r.weight)).collect();
            v.sort();
            v
        })
        .unwrap_or_default()
}

#[test]
fn first_sync_programs_everything_and_a_resync_sends_nothing() {
    let mut e = env(IpvsConfig::default());
    let s = snap(vec![web(&["10.0.1.2", "10.0.1.3"])]);
    let r = e.proxier.sync(&s, &Changes::default()).unwrap();
    assert!(r.full);
    // ClusterIP and NodePort on the node's address (not loopback).
    let cluster = key("10.96.0.10", 80);
    let nodeport = key("192.168.56.10", 30080);
    for k in [cluster, nodeport] {
        assert_eq!(
            dests(&e, &k),
            vec![
                ("10.0.1.2:8080".parse().unwrap(), 1),
                ("10.0.1.3:8080".parse().unwrap(), 1)
            ],
            "{k}"
        );
    }
    assert_eq!(e.ipvs.0.lock().unwrap().state().len(), 2);
    assert_eq!(
        e.links.0.lock().unwrap().addresses(DUMMY_DEVICE).unwrap(),
        vec![ip("10.96.0.10")]
    );
    let set = e.ipset.0.set("KUBE-CLUSTER-IP").unwrap();
    assert!(set.entries.contains("10.96.0.10,tcp:80"));
    assert!(
        e.ipset
            .0
            .set("KUBE-NODE-PORT-TCP")
            .unwrap()
            .entries
            .contains("30080")
    );
    let saved = e.proxier.runner().save(None).unwrap();
    for line in [
        "-A INPUT -m comment --comment \"kubernetes ipvs access filter\" -j KUBE-IPVS-FILTER",
        "-A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES",
        "-A KUBE-SERVICES -m addrtype --dst-type LOCAL -j KUBE-NODE-PORT",
    ] {
        assert!(saved.contains(line), "missing {line}:\n{saved}");
    }
    // A partial re-sync with nothing changed touches nothing.
    let applies = e.ipvs.0.lock().unwrap().apply_calls();
    let restores = e.ipset.0.restore_count();
    let r = e.proxier.sync(&s, &Changes::default()).unwrap();
    assert!(!r.full);
    assert_eq!(e.ipvs.0.lock().unwrap().apply_calls(), applies);
    assert_eq!(e.ipset.0.restore_count(), restores);
    // A full re-sync reads everything back and still changes nothing.
    let r = e
        .proxier
        .sync(
            &s,
            &Changes {
                full_resync_needed: true,
                ..Changes::default()
            },
        )
        .unwrap();
    assert!(r.full);
    assert_eq!(e.ipvs.0.lock().unwrap().apply_calls(), applies);
    assert_eq!(e.ipset.0.restore_count(), restores);
}

#[test]
fn a_removed_tcp_endpoint_drains_at_weight_zero_then_goes() {
    let mut e = env(IpvsConfig::default());
    e.proxier
        .sync(
            &snap(vec![web(&["10.0.1.2", "10.0.1.3"])]),
            &Changes::default(),
        )
        .unwrap();
    let cluster = key("10.96.0.10", 80);
    let gone: SocketAddr = "10.0.1.3:8080".parse().unwrap();
    e.ipvs.0.lock().unwrap().set_conns(&cluster, gone, 1, 0);
    let s = snap(vec![web(&["10.0.1.2"])]);
    e.proxier.sync(&s, &changed("ns/web")).unwrap();
    assert!(
        dests(&e, &cluster).contains(&(gone, 0)),
        "{:?}",
        dests(&e, &cluster)
    );
    assert!(e.proxier.terminating().contains(&(cluster, gone)));
    // Still busy: kept.
    e.proxier.sync(&s, &Changes::default()).unwrap();
    assert!(dests(&e, &cluster).contains(&(gone, 0)));
    // Idle: deleted at the next sync.
    e.ipvs.0.lock().unwrap().set_conns(&cluster, gone, 0, 0);
    e.proxier.sync(&s, &Changes::default()).unwrap();
    assert_eq!(
        dests(&e, &cluster),
        vec![("10.0.1.2:8080".parse().unwrap(), 1)]
    );
    assert!(e.proxier.terminating().iter().all(|(k, _)| *k != cluster));
}

#[test]
fn an_endpoint_that_returns_while_draining_gets_its_weight_back() {
    let mut e = env(IpvsConfig::default());
    let both = snap(vec![web(&["10.0.1.2", "10.0.1.3"])]);
    e.proxier.sync(&both, &Changes::default()).unwrap();
    let cluster = key("10.96.0.10", 80);
    let back: SocketAddr = "10.0.1.3:8080".parse().unwrap();
    e.ipvs.0.lock().unwrap().set_conns(&cluster, back, 3, 0);
    e.proxier
        .sync(&snap(vec![web(&["10.0.1.2"])]), &changed("ns/web"))
        .unwrap();
    assert!(dests(&e, &cluster).contains(&(back, 0)));
    e.proxier.sync(&both, &changed("ns/web")).unwrap();
    assert!(dests(&e, &cluster).contains(&(back, 1)));
    assert!(e.proxier.terminating().is_empty());
}

#[test]
fn a_deleted_service_takes_its_virtual_servers_address_and_set_entries() {
    let mut e = env(IpvsConfig::default());
    let other = ServiceBuilder::new("ns/other", "10.96.0.20")
        .tcp("", 80)
        .build();
    let other_slice = SliceBuilder::new("ns/other")
        .port("", 80)
        .ready("10.0.1.9", "x")
        .build();
    let (w, ws) = web(&["10.0.1.2"]);
    let s = snapshot(
        IpFamily::V4,
        "node-a",
        vec![w.clone(), other],
        vec![ws.clone(), other_slice],
    );
    e.proxier.sync(&s, &Changes::default()).unwrap();
    assert_eq!(e.ipvs.0.lock().unwrap().state().len(), 3);
    let s = snapshot(IpFamily::V4, "node-a", vec![w], vec![ws]);
    e.proxier.sync(&s, &changed("ns/other")).unwrap();
    assert_eq!(e.ipvs.0.lock().unwrap().state().len(), 2);
    assert_eq!(
        e.links.0.lock().unwrap().addresses(DUMMY_DEVICE).unwrap(),
        vec![ip("10.96.0.10")]
    );
    assert!(
        !e.ipset
            .0
            .set("KUBE-CLUSTER-IP")
            .unwrap()
            .entries
            .contains("10.96.0.20,tcp:80")
    );
}

#[test]
fn a_full_sync_repairs_what_another_tool_changed() {
    let mut e = env(IpvsConfig::default());
    let s = snap(vec![web(&["10.0.1.2"])]);
    e.proxier.sync(&s, &Changes::default()).unwrap();
    // Someone deletes our virtual server and an address, and adds their own VS.
    let cluster = key("10.96.0.10", 80);
    let theirs = key("10.200.0.1", 80);
    {
        let mut ipvs = e.ipvs.0.lock().unwrap();
        let r = ipvs
            .apply(&[
                IpvsOp::DelService(cluster),
                IpvsOp::AddService(VirtualServer::new(theirs, "rr")),
            ])
            .unwrap();
        assert!(r.iter().all(Result::is_ok));
    }
    e.links
        .0
        .lock()
        .unwrap()
        .del_addresses(DUMMY_DEVICE, &[ip("10.96.0.10")])
        .unwrap();
    let full = Changes {
        full_resync_needed: true,
        ..Changes::default()
    };
    e.proxier.sync(&s, &full).unwrap();
    assert_eq!(
        dests(&e, &cluster),
        vec![("10.0.1.2:8080".parse().unwrap(), 1)]
    );
    assert!(
        e.links
            .0
            .lock()
            .unwrap()
            .addresses(DUMMY_DEVICE)
            .unwrap()
            .contains(&ip("10.96.0.10"))
    );
    // A virtual server that is not ours is deleted, unless --ipvs-exclude-cidrs covers it.
    assert!(e.ipvs.0.lock().unwrap().service(&theirs).is_none());

    let mut e = env(IpvsConfig {
        exclude_cidrs: vec!["10.200.0.0/16".parse().unwrap()],
        ..IpvsConfig::default()
    });
    e.ipvs
        .0
        .lock()
        .unwrap()
        .apply(&[IpvsOp::AddService(VirtualServer::new(theirs, "rr"))])
        .unwrap();
    e.proxier.sync(&s, &Changes::default()).unwrap();
    assert!(e.ipvs.0.lock().unwrap().service(&theirs).is_some());
}

#[test]
fn a_refused_change_fails_the_sync_and_the_retry_is_full() {
    let mut e = env(IpvsConfig::default());
    let s = snap(vec![web(&["10.0.1.2"])]);
    e.ipvs.0.lock().unwrap().fail_next_apply(libc_eperm());
    assert!(e.proxier.sync(&s, &Changes::default()).is_err());
    let r = e.proxier.sync(&s, &Changes::default()).unwrap();
    assert!(r.full);
    assert_eq!(
        dests(&e, &key("10.96.0.10", 80)),
        vec![("10.0.1.2:8080".parse().unwrap(), 1)]
    );
}

fn libc_eperm() -> i32 {
    1
}

#[test]
fn affinity_and_mh_set_the_virtual_server_flags() {
    let mut e = env(IpvsConfig {
        scheduler: "mh".into(),
        ..IpvsConfig::default()
    });
    let svc = ServiceBuilder::new("ns/sticky", "10.96.0.30")
        .tcp("", 80)
        .affinity(600)
        .build();
    e.proxier
        .sync(
            &snapshot(IpFamily::V4, "n", vec![svc], vec![]),
            &Changes::default(),
        )
        .unwrap();
    let ipvs = e.ipvs.0.lock().unwrap();
    let vs = ipvs.service(&key("10.96.0.30", 80)).unwrap();
    assert_eq!(vs.scheduler, "mh");
    assert_eq!(vs.timeout, 600);
    assert_ne!(vs.flags & kp_netlink::ipvs::SVC_F_PERSISTENT, 0);
    assert_ne!(vs.flags & SOURCE_HASH, 0);
}

#[test]
fn cleanup_removes_virtual_servers_sets_and_the_dummy_link() {
    let mut e = env(IpvsConfig::default());
    e.proxier
        .sync(&snap(vec![web(&["10.0.1.2"])]), &Changes::default())
        .unwrap();
    let mut ipvs = e.ipvs.clone();
    let mut links = e.links.clone();
    let report = cleanup(&e.ipset, Some(&mut ipvs), &mut links, &[]).unwrap();
    assert_eq!(report.virtual_servers, 2);
    assert!(report.dummy_link);
    assert_eq!(report.sets, KubeSet::ALL.len());
    assert!(e.ipvs.0.lock().unwrap().state().is_empty());
    assert!(e.ipset.0.sets().is_empty());
    assert!(!has_leftovers(&e.ipset, &mut links));
}

#[test]
fn iptables_mode_leftovers_are_removed_by_the_first_full_sync() {
    let mut e = env(IpvsConfig::default());
    // What iptables mode leaves: a per-Service chain, KUBE-NODEPORTS, filter KUBE-SERVICES
    // and their jumps.
    e.proxier
        .runner()
        .restore(
            b"*filter\n:KUBE-SERVICES - [0:0]\n:KUBE-EXTERNAL-SERVICES - [0:0]\n\
-A OUTPUT -m conntrack --ctstate NEW -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n\
-A INPUT -m conntrack --ctstate NEW -m comment --comment \"kubernetes externally-visible service portals\" -j KUBE-EXTERNAL-SERVICES\n\
COMMIT\n*nat\n:KUBE-SERVICES - [0:0]\n:KUBE-NODEPORTS - [0:0]\n:KUBE-SVC-ABCDEFGHIJKLMNOP - [0:0]\n\
-A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n\
-A KUBE-SERVICES -j KUBE-SVC-ABCDEFGHIJKLMNOP\n-A KUBE-SERVICES -j KUBE-NODEPORTS\nCOMMIT\n",
        )
        .unwrap();
    e.proxier
        .sync(&snap(vec![web(&["10.0.1.2"])]), &Changes::default())
        .unwrap();
    let saved = e.proxier.runner().save(None).unwrap();
    for gone in [
        "KUBE-SVC-ABCDEFGHIJKLMNOP",
        "KUBE-NODEPORTS",
        "KUBE-EXTERNAL-SERVICES",
    ] {
        assert!(!saved.contains(gone), "{gone} left:\n{saved}");
    }
    assert!(!saved.contains("--ctstate NEW -m comment --comment \"kubernetes service portals\""));
    // The shared nat jump stays (once).
    assert_eq!(
        saved
            .matches(
                "-A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES"
            )
            .count(),
        1
    );
}

/// IPVS mode's full syncs leave the `KUBE-PROXY-CANARY` chains too (its iptables rules are
/// flushed by the same tools); an unchanged partial re-sync still writes nothing, and an
/// `iptables -t nat -F; iptables -t nat -X` is noticed by the check and repaired by the next
/// sync, which is full.
#[test]
fn a_flushed_nat_table_is_noticed_and_the_next_sync_repairs_it() {
    let mut e = env(IpvsConfig::default());
    let s = snap(vec![web(&["10.0.1.2"])]);
    assert!(
        !e.proxier.check_dataplane().unwrap(),
        "nothing to check yet"
    );
    assert!(e.proxier.sync(&s, &Changes::default()).unwrap().full);
    let good = e.proxier.runner().save(None).unwrap();
    assert_eq!(
        good.matches(":KUBE-PROXY-CANARY - [0:0]").count(),
        3,
        "{good}"
    );
    assert!(!e.proxier.check_dataplane().unwrap());
    let restores = e.proxier.runner().restore_count();
    assert!(!e.proxier.sync(&s, &Changes::default()).unwrap().full);
    assert_eq!(
        e.proxier.runner().restore_count(),
        restores,
        "an unchanged partial sync writes nothing"
    );
    e.proxier
        .runner()
        .restore(b"*nat\n-F\n-X\nCOMMIT\n")
        .unwrap();
    assert!(e.proxier.check_dataplane().unwrap());
    assert!(e.proxier.sync(&s, &Changes::default()).unwrap().full);
    assert_eq!(e.proxier.runner().save(None).unwrap(), good);
    assert!(!e.proxier.check_dataplane().unwrap());
}

/// A partial sync whose iptables rules changed (the first NodePort fills a set that was
/// empty) rewrites IPVS mode's chains but leaves the jumps from the built-in chains alone:
/// each stays there once (they used to be inserted again by every such sync).
#[test]
fn a_partial_restore_does_not_repeat_the_jumps() {
    let mut e = env(IpvsConfig::default());
    e.proxier.sync(&snap(vec![]), &Changes::default()).unwrap();
    let restores = e.proxier.runner().restore_count();
    let r = e
        .proxier
        .sync(&snap(vec![web(&["10.0.1.2"])]), &changed("ns/web"))
        .unwrap();
    assert!(!r.full);
    assert_eq!(
        e.proxier.runner().restore_count(),
        restores + 1,
        "the rules changed: one partial restore"
    );
    assert!(
        e.proxier
            .runner()
            .save(None)
            .unwrap()
            .contains("KUBE-NODE-PORT-TCP")
    );
    for (table, chain, _, target) in JUMPS {
        let saved = e.proxier.runner().save(Table::from_name(table)).unwrap();
        let n = saved
            .lines()
            .filter(|l| {
                l.starts_with(&format!("-A {chain} ")) && l.ends_with(&format!("-j {target}"))
            })
            .count();
        assert_eq!(n, 1, "{table} {chain} -> {target}:\n{saved}");
    }
}

/// 500 Services × 10 endpoints (5,500 changes on the first sync) go to the IPVS table in
/// pieces of about `OPS_PER_APPLY` changes (a virtual server's changes stay in one piece),
/// none of them held beyond its piece; the
/// result is the whole table, an unchanged re-sync sends nothing, and the state kept for
/// the next sync (sorted real-server slices) finds every real server again: removing all
/// Services deletes exactly what the first sync made.
#[test]
fn a_large_sync_sends_its_ipvs_changes_in_pieces() {
    /// Records the size of every apply.
    #[derive(Clone)]
    struct Sizes(SharedIpvs, Arc<Mutex<Vec<usize>>>);
    impl IpvsOps for Sizes {
        fn info(&mut self) -> kp_netlink::Result<IpvsInfo> {
            self.0.info()
        }
        fn services(&mut self) -> kp_netlink::Result<Vec<VirtualServer>> {
            self.0.services()
        }
        fn destinations(&mut self, svc: &ServiceKey) -> kp_netlink::Result<Vec<RealServer>> {
            self.0.destinations(svc)
        }
        fn apply(&mut self, ops: &[IpvsOp]) -> kp_netlink::Result<Vec<Result<(), OpError>>> {
            self.1.lock().unwrap().push(ops.len());
            self.0.apply(ops)
        }
        fn flush(&mut self) -> kp_netlink::Result<()> {
            self.0.flush()
        }
    }
    let mut e = env(IpvsConfig::default());
    let sizes = Sizes(e.ipvs.clone(), Arc::default());
    e.proxier.ipvs = Box::new(sizes.clone());
    let many = |n: u32| {
        let mut services = Vec::new();
        let mut slices = Vec::new();
        for i in 0..n {
            let name = format!("ns/svc-{i}");
            services.push(
                ServiceBuilder::new(&name, &format!("10.96.{}.{}", i / 250, 1 + i % 250))
                    .tcp("", 80)
                    .build(),
            );
            let mut slice = SliceBuilder::new(&name).port("", 8080);
            for j in 0..10 {
                slice = slice.ready(
                    &format!("10.1.{}.{}", i / 25, 1 + (i % 25) * 10 + j),
                    "node-b",
                );
            }
            slices.push(slice.build());
        }
        snapshot(IpFamily::V4, "node-a", services, slices)
    };
    e.proxier.sync(&many(500), &Changes::default()).unwrap();
    let first = sizes.1.lock().unwrap().clone();
    assert_eq!(first.iter().sum::<usize>(), 5500, "{first:?}");
    assert!(
        first.len() >= 2 && first.iter().all(|n| *n <= OPS_PER_APPLY + 11),
        "{first:?}"
    );
    assert_eq!(sizes.0.0.lock().unwrap().state().len(), 500);
    assert_eq!(dests(&e, &key("10.96.1.250", 80)).len(), 10);
    // Nothing changed: nothing sent.
    e.proxier.sync(&many(500), &Changes::default()).unwrap();
    assert_eq!(sizes.1.lock().unwrap().len(), first.len());
    // Every Service gone: 500 deletions, nothing left.
    e.proxier.sync(&many(0), &Changes::default()).unwrap();
    assert!(sizes.0.0.lock().unwrap().state().is_empty());
    assert_eq!(
        sizes.1.lock().unwrap()[first.len()..].iter().sum::<usize>(),
        500
    );
}

#[test]
fn dests_keep_the_last_of_one_address_and_find_by_address() {
    let rs = |a: &str, w: u32| {
        let s: SocketAddr = a.parse().unwrap();
        RealServer::new(s.ip(), s.port(), w)
    };
    let d = Dests::new([
        rs("10.0.0.3:80", 1),
        rs("10.0.0.1:80", 1),
        rs("10.0.0.3:80", 0),
        rs("10.0.0.2:80", 1),
    ]);
    let got: Vec<(SocketAddr, u32)> = d.iter().map(|(a, r)| (a, r.weight)).collect();
    assert_eq!(
        got,
        [
            ("10.0.0.1:80".parse().unwrap(), 1),
            ("10.0.0.2:80".parse().unwrap(), 1),
            ("10.0.0.3:80".parse().unwrap(), 0)
        ]
    );
    assert_eq!(
        d.get(&"10.0.0.2:80".parse().unwrap()).map(|r| r.weight),
        Some(1)
    );
    assert!(d.get(&"10.0.0.4:80".parse().unwrap()).is_none());
}
