//! Kernel test of `--iptables-dispatch tree` on both iptables backends: the real
//! `iptables-restore` loads the dispatch tree into the node namespace of a test topology,
//! `iptables-save` prints every tree rule back as we wrote it, TCP connections from the
//! client to ClusterIPs first, in the middle of and last in the Service order reach the
//! backends through the tree, and a one-Service change is a partial sync whose payload
//! rewrites only the chains on the changed entry's path, after which the kernel holds what a
//! fresh full sync writes. Needs root (CI runs as root); every namespace is the test's own.

mod common;

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use kp_model::{IpFamily, NamespacedName, SourceEvent};
use kp_netfilter::{Backend, ExecIptables, RecordingExec, SystemExec};
use kp_proxier::Proxier;
use kp_proxier::iptables::IptablesProxier;
use kp_proxier::iptables::tree::Dispatch;
use kp_testkit::builders::{ServiceBuilder, SliceBuilder};
use kp_testkit::{Netns, Topology, http_get, require_root};
use kp_track::Tracker;

use common::{recorded_proxier, tables};

fn proxier(
    ns: &Netns,
    backend: Backend,
) -> (
    IptablesProxier<ExecIptables>,
    Arc<RecordingExec<SystemExec>>,
) {
    let (p, rec) = recorded_proxier(ns, backend, IpFamily::V4, &["10.244.0.0/16"]);
    (p.with_dispatch(Dispatch::Tree { leaf_rules: 4 }), rec)
}

const SERVICES: usize = 300;

/// ClusterIP of Service `i`, spread over the service CIDR (10.96.0.0/12).
fn cluster_ip(i: usize) -> String {
    format!(
        "10.{}.{}.{}",
        96 + (i * 7) % 16,
        (i * 37) % 256,
        1 + i % 250
    )
}

fn service_events(i: usize, backends: &[IpAddr]) -> Vec<SourceEvent> {
    let name = format!("svc-{i:03}");
    let mut b = ServiceBuilder::new(&name, &cluster_ip(i)).tcp("http", 80);
    if i.is_multiple_of(10) {
        b = b.node_port(30000 + i as u16);
    }
    let mut s = SliceBuilder::new(&name)
        .named(&format!("{name}-x"))
        .port("http", 80);
    for ip in backends {
        s = s.ready(&ip.to_string(), "other-node");
    }
    vec![
        SourceEvent::ServiceUpsert(b.build()),
        SourceEvent::SliceUpsert(s.build()),
    ]
}

fn tracker() -> Tracker {
    let mut t = Tracker::new(IpFamily::V4, "test-node");
    for k in [
        kp_model::ObjectKind::Service,
        kp_model::ObjectKind::EndpointSlice,
        kp_model::ObjectKind::Node,
    ] {
        t.apply(SourceEvent::Synced(k));
    }
    t
}

/// Lines of the payload's nat table that write into `KUBE-SVT-` chains or `KUBE-SERVICES`.
fn dispatch_lines(payload: &str) -> Vec<&str> {
    let nat = payload.split_once("*nat\n").map_or("", |(_, n)| n);
    nat.lines()
        .filter(|l| l.starts_with("-A KUBE-SVT-") || l.starts_with("-A KUBE-SERVICES "))
        .collect()
}

fn answers(client: &Netns, ip: &str, names: &[String]) -> bool {
    let target = SocketAddr::new(ip.parse().unwrap(), 80);
    (0..4).all(|_| {
        http_get(client, target, Duration::from_secs(2))
            .is_ok_and(|r| names.iter().any(|n| r.body.trim() == n))
    })
}

fn run(backend: Backend) {
    let topology = Topology::builder().backends(2).build().unwrap();
    let _servers = topology.start_http(80).unwrap();
    let backend_ips: Vec<IpAddr> = topology
        .backends()
        .iter()
        .map(|b| b.ip(IpFamily::V4).unwrap())
        .collect();
    let names: Vec<String> = topology.backends().iter().map(|b| b.name()).collect();
    let mut t = tracker();
    for i in 0..SERVICES {
        for e in service_events(i, &backend_ips) {
            t.apply(e);
        }
    }
    let (mut p, rec) = proxier(topology.node(), backend);
    let (snap, changes) = t.checkout();
    // The xtables lock is shared with every other legacy iptables run on the machine (other
    // tests, other namespaces): a first sync that loses it for the 5 s of `--wait` is retried,
    // as the daemon would (a failed sync is retried in full).
    let mut attempt = 0;
    let report = loop {
        match p.sync(&snap, &changes) {
            Ok(r) => break r,
            Err(e) if attempt < 2 => {
                eprintln!("{backend:?}: first sync failed, retrying: {e}");
                attempt += 1;
            }
            Err(e) => panic!("{backend:?}: first sync failed three times: {e}"),
        }
    };
    assert!(report.full);

    // The kernel prints every dispatch rule back exactly as it was written.
    let saved = tables(&p);
    let full = rec.last_restore().unwrap();
    let written = dispatch_lines(&full);
    assert!(
        written
            .iter()
            .filter(|l| l.starts_with("-A KUBE-SVT-"))
            .count()
            > SERVICES
    );
    for l in &written {
        assert!(
            saved.lines().any(|s| s == *l),
            "the kernel printed {l:?} differently"
        );
    }
    let root = saved
        .lines()
        .filter(|l| l.starts_with("-A KUBE-SERVICES "))
        .count();
    assert!(root <= 3, "KUBE-SERVICES holds {root} rules");

    // Traffic through the tree: the first, a middle and the last Service.
    for i in [0, SERVICES / 2, SERVICES - 1] {
        assert!(
            answers(topology.client(), &cluster_ip(i), &names),
            "{backend:?}: svc-{i:03} ({}) does not answer through the tree",
            cluster_ip(i)
        );
    }

    // One-Service changes: add one, delete one (neither has a NodePort). Each is a partial sync that writes only the
    // chains on that entry's path, and the kernel ends up as a fresh full sync leaves it.
    let steps: Vec<(Vec<SourceEvent>, Option<usize>)> = vec![
        (
            service_events(SERVICES + 1, &backend_ips),
            Some(SERVICES + 1),
        ),
        (
            vec![SourceEvent::ServiceDelete(NamespacedName::new(
                "default",
                format!("svc-{:03}", SERVICES / 2 + 1),
            ))],
            None,
        ),
    ];
    for (events, probe) in steps {
        for e in events {
            t.apply(e);
        }
        let (snap, changes) = t.checkout();
        let report = p.sync(&snap, &changes).unwrap();
        assert!(!report.full);
        let partial = rec.last_restore().unwrap();
        let lines = dispatch_lines(&partial);
        assert!(
            !lines.is_empty() && lines.len() <= 12,
            "{backend:?}: {} dispatch lines in a one-Service change:\n{}",
            lines.len(),
            lines.join("\n")
        );
        assert!(
            !partial.contains("-A KUBE-NODEPORTS"),
            "KUBE-NODEPORTS is unchanged"
        );
        assert!(
            partial.len() * 20 < full.len(),
            "{} of {} bytes",
            partial.len(),
            full.len()
        );
        if let Some(i) = probe {
            assert!(answers(topology.client(), &cluster_ip(i), &names));
        }
        let fresh_ns = Netns::new("tree-fresh").unwrap();
        let (mut fresh, _) = proxier(&fresh_ns, backend);
        fresh.sync(&snap, &kp_model::Changes::default()).unwrap();
        assert_eq!(tables(&p), tables(&fresh), "{backend:?}: partial != full");
    }
    let saved = tables(&p);
    assert!(!saved.contains(&format!("-d {}/32", cluster_ip(SERVICES / 2 + 1))));
}

#[test]
fn the_dispatch_tree_carries_traffic_and_changes_only_its_path_legacy() {
    if !require_root() {
        return;
    }
    run(Backend::Legacy);
}

#[test]
fn the_dispatch_tree_carries_traffic_and_changes_only_its_path_nft() {
    if !require_root() {
        return;
    }
    run(Backend::Nft);
}
