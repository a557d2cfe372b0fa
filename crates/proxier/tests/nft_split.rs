//! Kernel test of the split full sync on the nf_tables backend: the real
//! `iptables-nft-restore` loads a split payload (several nat transactions) into a fresh
//! network namespace, and the kernel ends up with exactly the rules of the one-transaction
//! payload loaded into another namespace, on a cold sync and on a full resync that adds,
//! changes and deletes Services (which writes only the chains that differ). Needs root (CI
//! runs as root).

mod common;

use std::sync::Arc;

use kp_model::{IpFamily, NamespacedName, SourceEvent};
use kp_netfilter::{Backend, ExecIptables, RecordingExec, SystemExec};
use kp_proxier::Proxier;
use kp_proxier::iptables::IptablesProxier;
use kp_testkit::Netns;

use common::{recorded_proxier, tables};
use kp_testkit::builders::{ServiceBuilder, SliceBuilder};

fn proxier(
    ns: &Netns,
    split: bool,
) -> (
    IptablesProxier<ExecIptables>,
    Arc<RecordingExec<SystemExec>>,
) {
    let (mut p, rec) = recorded_proxier(ns, Backend::Nft, IpFamily::V4, &["10.0.0.0/16"]);
    if !split {
        p = p.with_split_full_syncs(None);
    }
    (p, rec)
}

fn events(from: usize, to: usize, first_endpoint: usize) -> Vec<SourceEvent> {
    let mut out = Vec::new();
    for i in from..to {
        let name = format!("svc-{i}");
        let mut b = ServiceBuilder::new(&name, &format!("10.96.{}.{}", i / 200, i % 200 + 1))
            .tcp("http", 80);
        if i.is_multiple_of(10) {
            b = b.node_port(30000 + i as u16);
        }
        if i.is_multiple_of(20) {
            b = b.external_local(None);
        }
        out.push(SourceEvent::ServiceUpsert(b.build()));
        let mut s = SliceBuilder::new(&name)
            .named(&format!("{name}-x"))
            .port("http", 8080);
        for e in first_endpoint..first_endpoint + 10 {
            let node = if e.is_multiple_of(3) {
                "node-a"
            } else {
                "node-b"
            };
            s = s.ready(&format!("10.0.{}.{}", i % 250, e + 1), node);
        }
        out.push(SourceEvent::SliceUpsert(s.build()));
    }
    out
}

fn nat_blocks(payload: &str) -> usize {
    payload.matches("*nat\n").count()
}

#[test]
fn split_full_syncs_load_the_same_rules_as_one_transaction() {
    if !kp_testkit::require_root() {
        return;
    }
    let split_ns = Netns::new("nft-split").unwrap();
    let whole_ns = Netns::new("nft-whole").unwrap();
    let (mut split, split_rec) = proxier(&split_ns, true);
    let (mut whole, whole_rec) = proxier(&whole_ns, false);
    let mut t = kp_testkit::builders::synced_tracker(IpFamily::V4, "node-a");
    // 300 Services × 10 endpoints: about 13,000 nat lines.
    for e in events(0, 300, 0) {
        t.apply(e);
    }
    let (snap, changes) = t.checkout();
    for p in [&mut split, &mut whole] {
        assert!(p.sync(&snap, &changes).expect("cold sync").full);
    }
    let sent = split_rec.last_restore().unwrap();
    assert!(nat_blocks(&sent) >= 10, "{} nat blocks", nat_blocks(&sent));
    let sent_whole = whole_rec.last_restore().unwrap();
    assert_eq!(nat_blocks(&sent_whole), 2, "the nat table and the canary");
    let loaded = tables(&split);
    assert!(
        loaded
            .lines()
            .filter(|l| l.starts_with("-A KUBE-SEP-"))
            .count()
            >= 6_000
    );
    assert_eq!(loaded, tables(&whole), "cold sync");

    // A full resync that deletes 50 Services, moves the endpoints of 50 and adds 50.
    for i in 0..50 {
        t.apply(SourceEvent::SliceDelete(NamespacedName::new(
            "default",
            format!("svc-{i}-x"),
        )));
        t.apply(SourceEvent::ServiceDelete(NamespacedName::new(
            "default",
            format!("svc-{i}"),
        )));
    }
    for e in events(50, 100, 20).into_iter().chain(events(300, 350, 0)) {
        t.apply(e);
    }
    let (snap, mut changes) = t.checkout();
    changes.full_resync_needed = true;
    let reports: Vec<_> = [&mut split, &mut whole]
        .into_iter()
        .map(|p| p.sync(&snap, &changes).expect("full resync"))
        .collect();
    assert!(reports[0].full && reports[0].deleted_chains >= 1_000);
    assert_eq!(reports[0].deleted_chains, reports[1].deleted_chains);
    let sent = split_rec.last_restore().unwrap();
    assert!(sent.contains("\n-X KUBE-SEP-"));
    assert!(nat_blocks(&sent) >= 5, "{} nat blocks", nat_blocks(&sent));
    let loaded = tables(&split);
    assert!(!loaded.contains("\"default/svc-7:http"));
    assert!(loaded.contains("\"default/svc-320:http"));
    assert_eq!(loaded, tables(&whole), "full resync");
    // And a resync without changes leaves the kernel as it was, writing nothing.
    let restores = split_rec.restore_count();
    split.sync(&snap, &changes).expect("second resync");
    assert_eq!(tables(&split), loaded);
    assert_eq!(split_rec.restore_count(), restores);
}
