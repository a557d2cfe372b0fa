//! Userspace proxier: the sync sequence against the checking fake (listeners first, then
//! one restore; nothing written when nothing changed; a full sync repairs the jumps and
//! removes another mode's chains), failures, and cleanup.

use std::sync::Arc;

use kp_model::{Changes, IpFamily};
use kp_netfilter::{FakeIptables, IpVersion, Iptables, Table};
use kp_testkit::builders::{ServiceBuilder, SliceBuilder, ip, snapshot};

use super::*;
use crate::FakeHost;

fn proxier() -> UserspaceProxier<FakeIptables, FakeRelay> {
    UserspaceProxier::new(
        IpFamily::V4,
        UserspaceConfig::default(),
        FakeIptables::new(IpVersion::V4),
        FakeRelay::new(36000),
        Arc::new(FakeHost::with_addresses(vec![
            ip("127.0.0.1"),
            ip("192.168.56.10"),
        ])),
    )
}

fn web_snapshot(endpoints: &[&str]) -> Snapshot {
    let web = ServiceBuilder::new("ns/web", "10.96.0.10")
        .tcp("http", 80)
        .node_port(30080)
        .build();
    let mut slice = SliceBuilder::new("ns/web").port("http", 8080);
    for e in endpoints {
        slice = slice.ready(e, "node-b");
    }
    snapshot(IpFamily::V4, "node-a", vec![web], vec![slice.build()])
}

fn nat(p: &UserspaceProxier<FakeIptables, FakeRelay>) -> String {
    p.runner().save(Some(Table::Nat)).unwrap()
}

#[test]
fn sync_serves_listeners_then_writes_portals() {
    let mut p = proxier();
    let report = p
        .sync(
            &web_snapshot(&["10.0.2.5", "10.0.2.6"]),
            &Changes::default(),
        )
        .unwrap();
    assert!(report.full);
    assert_eq!(p.relay().served.len(), 1);
    assert_eq!(
        *p.relay().served[0].endpoints,
        [ip_port("10.0.2.5:8080"), ip_port("10.0.2.6:8080")]
    );
    let saved = nat(&p);
    for line in [
        "-A PREROUTING -m comment --comment \"handle ClusterIPs; NOTE: this must be before the NodePort rules\" -j KUBE-PORTALS-CONTAINER",
        "-A OUTPUT -m addrtype --dst-type LOCAL -m comment --comment \"handle service NodePorts; NOTE: this must be the last rule in the chain\" -j KUBE-NODEPORT-HOST",
        "-A KUBE-PORTALS-HOST -d 10.96.0.10/32 -p tcp -m comment --comment \"ns/web:http\" -m tcp --dport 80 -j DNAT --to-destination 192.168.56.10:36000",
        "-A KUBE-NODEPORT-CONTAINER -p tcp -m comment --comment \"ns/web:http\" -m tcp --dport 30080 -j REDIRECT --to-ports 36000",
    ] {
        assert!(saved.contains(line), "missing {line} in\n{saved}");
    }
    let filter = p.runner().save(Some(Table::Filter)).unwrap();
    assert!(filter.contains("-A KUBE-NODEPORT-NON-LOCAL -p tcp -m comment --comment \"ns/web:http\" -m tcp --dport 36000 -j ACCEPT"), "{filter}");
    assert_eq!(p.portals().len(), 1);

    // The same snapshot again: no restore. New endpoints: the relay is updated, the port
    // (and so the rules) stay, still no restore.
    let restores = p.runner().restore_count();
    p.sync(
        &web_snapshot(&["10.0.2.5", "10.0.2.6"]),
        &Changes::default(),
    )
    .unwrap();
    p.sync(&web_snapshot(&["10.0.2.7"]), &Changes::default())
        .unwrap();
    assert_eq!(p.runner().restore_count(), restores);
    assert_eq!(*p.relay().served[0].endpoints, [ip_port("10.0.2.7:8080")]);

    // The Service goes: the listener is closed and the rules removed.
    let empty = snapshot(IpFamily::V4, "node-a", vec![], vec![]);
    p.sync(&empty, &Changes::default()).unwrap();
    assert!(p.relay().served.is_empty());
    assert!(!nat(&p).contains("ns/web"));
    assert!(nat(&p).contains(":KUBE-PORTALS-CONTAINER"));
}

fn ip_port(s: &str) -> std::net::SocketAddr {
    s.parse().unwrap()
}

#[test]
fn full_sync_repairs_jumps_and_removes_other_modes() {
    let mut p = proxier();
    // Leftovers of iptables mode, and a deleted jump of ours.
    p.runner()
        .restore(
            b"*nat\n:KUBE-SERVICES - [0:0]\n:KUBE-SVC-ABCDEFGHIJKLMNOP - [0:0]\n-A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n-A KUBE-SERVICES -j KUBE-SVC-ABCDEFGHIJKLMNOP\nCOMMIT\n",
        )
        .unwrap();
    p.sync(&web_snapshot(&["10.0.2.5"]), &Changes::default())
        .unwrap();
    let saved = nat(&p);
    assert!(!saved.contains("KUBE-SERVICES"), "{saved}");
    assert!(!saved.contains("KUBE-SVC-"), "{saved}");
    p.runner()
        .restore(b"*nat\n-D PREROUTING -m comment --comment \"handle ClusterIPs; NOTE: this must be before the NodePort rules\" -j KUBE-PORTALS-CONTAINER\nCOMMIT\n")
        .unwrap();
    // A partial sync with nothing changed does not notice; a full one repairs it, once.
    p.sync(&web_snapshot(&["10.0.2.5"]), &Changes::default())
        .unwrap();
    assert!(!nat(&p).contains("-j KUBE-PORTALS-CONTAINER"));
    let full = Changes {
        full_resync_needed: true,
        ..Changes::default()
    };
    p.sync(&web_snapshot(&["10.0.2.5"]), &full).unwrap();
    p.sync(&web_snapshot(&["10.0.2.5"]), &full).unwrap();
    let saved = nat(&p);
    assert_eq!(
        saved.matches("-j KUBE-PORTALS-CONTAINER").count(),
        1,
        "{saved}"
    );
    assert_eq!(saved.matches("-j KUBE-NODEPORT-CONTAINER").count(), 1);
}

#[test]
fn a_failed_restore_is_retried_in_full() {
    let mut p = proxier();
    p.runner()
        .fail_next_restore("iptables-restore: line 3 failed");
    assert!(
        p.sync(&web_snapshot(&["10.0.2.5"]), &Changes::default())
            .is_err()
    );
    let r = p
        .sync(&web_snapshot(&["10.0.2.5"]), &Changes::default())
        .unwrap();
    assert!(r.full);
    assert!(nat(&p).contains("--to-ports 36000"));
}

#[test]
fn a_listener_that_cannot_open_gets_no_rules() {
    let mut p = proxier();
    p.relay.failing.insert("ns/web:http".into());
    p.sync(&web_snapshot(&["10.0.2.5"]), &Changes::default())
        .unwrap();
    assert!(!nat(&p).contains("ns/web"));
    // The periodic check asks for a sync while a socket is missing, even with no change.
    assert!(p.check_dataplane().unwrap());
    p.sync(&web_snapshot(&["10.0.2.5"]), &Changes::default())
        .unwrap();
    p.relay.failing.clear();
    assert!(p.check_dataplane().unwrap());
    p.sync(&web_snapshot(&["10.0.2.5"]), &Changes::default())
        .unwrap();
    assert!(nat(&p).contains("ns/web"));
    assert!(
        !p.check_dataplane().unwrap(),
        "all sockets open: nothing to retry"
    );
}

#[test]
fn sctp_is_skipped() {
    let svc = ServiceBuilder::new("ns/s", "10.96.0.20")
        .port("x", kp_model::Protocol::Sctp, 9)
        .build();
    let snap = snapshot(IpFamily::V4, "node-a", vec![svc], vec![]);
    let (ls, sctp) = listeners(&snap);
    assert!(ls.is_empty());
    assert_eq!(sctp.len(), 1);
}

#[test]
fn cleanup_removes_only_userspace_chains() {
    let mut p = proxier();
    p.sync(&web_snapshot(&["10.0.2.5"]), &Changes::default())
        .unwrap();
    p.runner()
        .restore(b"*nat\n:OTHER - [0:0]\n-A PREROUTING -j OTHER\nCOMMIT\n")
        .unwrap();
    assert!(has_leftovers(p.runner()).unwrap());
    let removed = cleanup(p.runner()).unwrap();
    assert_eq!(removed.len(), 8, "{removed:?}");
    for table in ["mangle", "nat", "filter"] {
        assert!(
            removed.contains(&format!("{table}/KUBE-PROXY-CANARY")),
            "{removed:?}"
        );
    }
    assert!(!has_leftovers(p.runner()).unwrap());
    let saved = nat(&p);
    assert!(saved.contains("-A PREROUTING -j OTHER"), "{saved}");
    assert!(!saved.contains("KUBE-"), "{saved}");
    assert!(cleanup(p.runner()).unwrap().is_empty());
}

/// Userspace mode's portal rules get the canaries of iptables mode: a full sync writes them,
/// the check notices a flushed nat table, and the next sync (full) puts the portals back.
#[test]
fn a_flushed_nat_table_is_noticed_and_the_next_sync_repairs_it() {
    let mut p = proxier();
    let snap = web_snapshot(&["10.0.2.5"]);
    assert!(!p.check_dataplane().unwrap(), "nothing to check yet");
    p.sync(&snap, &Changes::default()).unwrap();
    let good = p.runner().save(None).unwrap();
    assert_eq!(
        good.matches(":KUBE-PROXY-CANARY - [0:0]").count(),
        3,
        "{good}"
    );
    assert!(!p.check_dataplane().unwrap());
    p.runner().restore(b"*nat\n-F\n-X\nCOMMIT\n").unwrap();
    assert!(!nat(&p).contains("KUBE-PORTALS"));
    assert!(p.check_dataplane().unwrap());
    assert!(p.sync(&snap, &Changes::default()).unwrap().full);
    assert_eq!(p.runner().save(None).unwrap(), good);
    assert!(!p.check_dataplane().unwrap());
}

/// A partial sync whose rules changed (a Service replaced by another) rewrites the portal
/// chains but leaves the jumps from the built-in chains alone: each stays there once (they
/// used to be inserted again by every such sync).
#[test]
fn a_partial_restore_does_not_repeat_the_jumps() {
    let mut p = proxier();
    p.sync(&web_snapshot(&["10.0.2.5"]), &Changes::default())
        .unwrap();
    let other = ServiceBuilder::new("ns/other", "10.96.0.11")
        .tcp("", 81)
        .build();
    let snap = snapshot(IpFamily::V4, "node-a", vec![other], vec![]);
    let restores = p.runner().restore_count();
    assert!(!p.sync(&snap, &Changes::default()).unwrap().full);
    assert_eq!(p.runner().restore_count(), restores + 1);
    let saved = nat(&p);
    assert!(saved.contains("ns/other"), "{saved}");
    for target in [
        "KUBE-PORTALS-CONTAINER",
        "KUBE-PORTALS-HOST",
        "KUBE-NODEPORT-CONTAINER",
        "KUBE-NODEPORT-HOST",
    ] {
        assert_eq!(
            saved.matches(&format!("-j {target}\n")).count(),
            1,
            "{target}:\n{saved}"
        );
    }
    let filter = p.runner().save(Some(Table::Filter)).unwrap();
    assert_eq!(
        filter.matches("-j KUBE-NODEPORT-NON-LOCAL\n").count(),
        1,
        "{filter}"
    );
}

/// Partial syncs that change rules write no jumps (the full sync checked them); a full sync
/// removes duplicated jumps, leaving one of each.
#[test]
fn jumps_are_written_once_and_duplicates_removed() {
    let mut p = proxier();
    p.sync(&web_snapshot(&["10.0.2.5"]), &Changes::default())
        .unwrap();
    let other = ServiceBuilder::new("ns/other", "10.96.0.11")
        .tcp("http", 80)
        .build();
    let web = ServiceBuilder::new("ns/web", "10.96.0.10")
        .tcp("http", 80)
        .node_port(30080)
        .build();
    for n in 0..3 {
        let mut services = vec![web.clone()];
        if n % 2 == 0 {
            services.push(other.clone());
        }
        let snap = snapshot(IpFamily::V4, "node-a", services, vec![]);
        let before = p.runner().restore_count();
        p.sync(&snap, &Changes::default()).unwrap();
        assert_eq!(p.runner().restore_count(), before + 1, "the rules changed");
    }
    let count = |p: &UserspaceProxier<FakeIptables, FakeRelay>| {
        let nat = nat(p);
        let filter = p.runner().save(Some(Table::Filter)).unwrap();
        (
            nat.matches("-j KUBE-PORTALS-CONTAINER\n").count(),
            nat.matches("-j KUBE-NODEPORT-HOST\n").count(),
            filter.matches("-j KUBE-NODEPORT-NON-LOCAL\n").count(),
        )
    };
    assert_eq!(count(&p), (1, 1, 1));
    // Duplicates (as an older build left them): a full sync leaves one of each.
    p.runner()
        .restore(b"*nat\n-A PREROUTING -m comment --comment \"handle ClusterIPs; NOTE: this must be before the NodePort rules\" -j KUBE-PORTALS-CONTAINER\n-A OUTPUT -m addrtype --dst-type LOCAL -m comment --comment \"handle service NodePorts; NOTE: this must be the last rule in the chain\" -j KUBE-NODEPORT-HOST\nCOMMIT\n")
        .unwrap();
    assert_eq!(count(&p), (2, 2, 1));
    let full = Changes {
        full_resync_needed: true,
        ..Changes::default()
    };
    p.sync(&web_snapshot(&["10.0.2.5"]), &full).unwrap();
    assert_eq!(count(&p), (1, 1, 1));
}

/// The checking fake behind a [`Iptables::restore_with`] that counts the writes it is given:
/// the userspace proxier's restores must come through it, in pieces.
struct Streaming {
    fake: FakeIptables,
    writes: std::sync::Mutex<Vec<usize>>,
}

impl Iptables for Streaming {
    fn ip_version(&self) -> IpVersion {
        self.fake.ip_version()
    }
    fn restore(&self, _: &[u8]) -> Result<(), kp_netfilter::Error> {
        panic!("the payload was built whole");
    }
    fn restore_with(
        &self,
        payload: &mut kp_netfilter::PayloadWriter<'_>,
    ) -> Result<(), kp_netfilter::Error> {
        struct Counting(Vec<u8>, usize);
        impl std::io::Write for Counting {
            fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
                self.0.extend_from_slice(b);
                self.1 += 1;
                Ok(b.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let mut w = Counting(Vec::new(), 0);
        payload(&mut w).unwrap();
        self.writes.lock().unwrap().push(w.1);
        self.fake.restore(&w.0)
    }
    fn save(&self, table: Option<Table>) -> Result<String, kp_netfilter::Error> {
        self.fake.save(table)
    }
    fn version(&self) -> Result<kp_netfilter::IptablesVersion, kp_netfilter::Error> {
        self.fake.version()
    }
    fn chain_exists(&self, table: Table, chain: &str) -> Result<bool, kp_netfilter::Error> {
        self.fake.chain_exists(table, chain)
    }
}

/// 300 Service ports (one in three with a NodePort): the portal rules go into
/// iptables-restore's stdin as they are rendered, and are the rules `render` gives whole;
/// the rules are kept as a digest, so an unchanged snapshot writes nothing and a changed
/// one writes again.
#[test]
fn portal_rules_are_streamed_and_only_a_digest_is_kept() {
    let snap = many_services(300);
    let mut p = UserspaceProxier::new(
        IpFamily::V4,
        UserspaceConfig::default(),
        Streaming {
            fake: FakeIptables::new(IpVersion::V4),
            writes: std::sync::Mutex::new(Vec::new()),
        },
        FakeRelay::new(36000),
        Arc::new(FakeHost::with_addresses(vec![ip("192.168.56.10")])),
    );
    let report = p.sync(&snap, &Changes::default()).unwrap();
    let payload = String::from_utf8(p.runner().fake.last_payload().unwrap()).unwrap();
    let npa = NodePortAddresses::default();
    let local = [ip("192.168.56.10")];
    let node = NodeView {
        node_ip: Some(ip("192.168.56.10")),
        nodeport_addresses: &npa,
        local_addrs: &local,
        local: None,
    };
    let whole = render::render(&snap, p.portals(), &node);
    assert!(whole.nat.len() > 50_000, "{}", whole.nat.len());
    assert!(payload.contains(&format!("{}COMMIT\n", whole.nat)));
    assert!(payload.contains(&format!("{}COMMIT\n*nat", whole.filter)));
    assert_eq!(report.payload_bytes, payload.len());
    assert_eq!(
        (report.filter_rules, report.nat_rules),
        (whole.filter.lines().count(), whole.nat.lines().count())
    );
    let writes = p.runner().writes.lock().unwrap().clone();
    assert!(writes[0] > 1000, "written in {writes:?} pieces");
    // Nothing changed: nothing written.
    p.sync(&snap, &Changes::default()).unwrap();
    assert_eq!(p.runner().writes.lock().unwrap().len(), 1);
    // One Service fewer: written again (the digest differs).
    p.sync(&many_services(299), &Changes::default()).unwrap();
    assert_eq!(p.runner().writes.lock().unwrap().len(), 2);
}

/// `n` Service ports (one in three with a NodePort), one endpoint each.
fn many_services(n: u32) -> Snapshot {
    let mut services = Vec::new();
    let mut slices = Vec::new();
    for i in 0..n {
        let name = format!("ns/svc-{i}");
        let mut svc = ServiceBuilder::new(&name, &format!("10.96.{}.{}", i / 250, 1 + i % 250))
            .tcp("http", 80);
        if i % 3 == 0 {
            svc = svc.node_port(30000 + i as u16);
        }
        services.push(svc.build());
        slices.push(
            SliceBuilder::new(&name)
                .port("http", 8080)
                .ready(&format!("10.1.{}.{}", i / 250, 1 + i % 250), "node-b")
                .build(),
        );
    }
    snapshot(IpFamily::V4, "node-a", services, slices)
}
