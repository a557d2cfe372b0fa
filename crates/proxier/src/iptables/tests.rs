//! Sync tests against the checking fake: full and partial syncs, failures, stale chains,
//! cleanup.

use std::collections::BTreeSet;
use std::sync::Arc;

use kp_model::{
    Changes, EndpointSlice, IpFamily, NamespacedName, ObjectKind, Service, Snapshot, SourceEvent,
};
use kp_netfilter::{FakeIptables, IpVersion, Iptables, Table};
use kp_testkit::builders::{ServiceBuilder, SliceBuilder, ip};
use kp_testkit::golden::{assert_contains_in_chain_order, seed_expected_lines};
use kp_track::Tracker;

use super::*;
use crate::FakeHost;

fn service(name: &str, cip: &str, port: u16) -> Service {
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

fn tracker() -> Tracker {
    let mut t = Tracker::new(IpFamily::V4, "k8s-master");
    for k in [
        ObjectKind::Service,
        ObjectKind::EndpointSlice,
        ObjectKind::Node,
    ] {
        t.apply(SourceEvent::Synced(k));
    }
    t
}

fn seed_events() -> Vec<SourceEvent> {
    vec![
        SourceEvent::ServiceUpsert(service("nginx-svc", "10.96.138.71", 8080)),
        SourceEvent::SliceUpsert(slice(
            "nginx-svc",
            80,
            &[("10.0.0.4", "k8s-master"), ("10.0.1.2", "k8s-worker")],
        )),
    ]
}

fn cfg() -> IptablesConfig {
    IptablesConfig {
        local_detector: LocalDetector::Cidrs(vec!["10.0.0.0/16".parse().unwrap()]),
        ..IptablesConfig::default()
    }
}

fn proxier(fake: FakeIptables) -> IptablesProxier<FakeIptables> {
    IptablesProxier::new(IpFamily::V4, cfg(), fake, Arc::new(FakeHost::default())).unwrap()
}

fn save(p: &IptablesProxier<FakeIptables>) -> String {
    let r = p.runner();
    format!(
        "{}{}",
        r.save(Some(Table::Filter)).unwrap(),
        r.save(Some(Table::Nat)).unwrap()
    )
}

fn sync(p: &mut IptablesProxier<FakeIptables>, t: &mut Tracker) -> SyncReport {
    let (snap, changes) = t.checkout();
    p.sync(&snap, &changes).unwrap()
}

#[test]
fn first_sync_produces_upstreams_seed_rules() {
    let mut t = tracker();
    for e in seed_events() {
        t.apply(e);
    }
    let mut p = proxier(FakeIptables::new(IpVersion::V4));
    let report = sync(&mut p, &mut t);
    assert!(report.full);
    assert_eq!(report.service_ports, 1);
    assert_eq!(report.endpoints, 2);
    assert_contains_in_chain_order(&save(&p), &seed_expected_lines());
}

#[test]
fn resync_without_changes_is_identical_and_partial() {
    let mut t = tracker();
    for e in seed_events() {
        t.apply(e);
    }
    let mut p = proxier(FakeIptables::new(IpVersion::V4));
    sync(&mut p, &mut t);
    let before = save(&p);
    let report = sync(&mut p, &mut t);
    assert!(!report.full);
    assert_eq!(save(&p), before);
    // A forced full resync is identical too.
    let (snap, _) = t.checkout();
    let full = Changes {
        full_resync_needed: true,
        ..Changes::default()
    };
    let restores = p.runner().restore_count();
    let report = p.sync(&snap, &full).unwrap();
    assert!(report.full);
    assert_eq!(save(&p), before);
    // ... and writes nothing: every chain is as rendered, every canary there, so the tool
    // is not even run.
    assert_eq!(report.payload_bytes, 0);
    assert_eq!(p.runner().restore_count(), restores);
    // A missing canary is the one thing such a resync writes.
    p.runner()
        .restore(b"*mangle\n:KUBE-PROXY-CANARY - [0:0]\n-X KUBE-PROXY-CANARY\nCOMMIT\n")
        .unwrap();
    p.sync(&snap, &full).unwrap();
    assert_eq!(
        String::from_utf8(p.runner().last_payload().unwrap()).unwrap(),
        "*mangle\n:KUBE-PROXY-CANARY - [0:0]\nCOMMIT\n"
    );
    assert_eq!(save_all(&p).matches(":KUBE-PROXY-CANARY ").count(), 3);
}

#[test]
fn partial_syncs_equal_full_syncs() {
    let mut t = tracker();
    for i in 0..5u8 {
        t.apply(SourceEvent::ServiceUpsert(service(
            &format!("s{i}"),
            &format!("10.96.0.{}", i + 1),
            80,
        )));
        t.apply(SourceEvent::SliceUpsert(slice(
            &format!("s{i}"),
            8080,
            &[(&format!("10.0.{i}.1"), "a"), (&format!("10.0.{i}.2"), "b")],
        )));
    }
    let mut p = proxier(FakeIptables::new(IpVersion::V4));
    sync(&mut p, &mut t);
    let steps: Vec<Vec<SourceEvent>> = vec![
        // Remove an endpoint.
        vec![SourceEvent::SliceUpsert(slice(
            "s1",
            8080,
            &[("10.0.1.1", "a")],
        ))],
        // Remove all endpoints (REJECT), change a port, add a Service.
        vec![
            SourceEvent::SliceDelete(NamespacedName::new("default", "s2-x")),
            SourceEvent::ServiceUpsert(service("s3", "10.96.0.4", 81)),
            SourceEvent::ServiceUpsert(service("new", "10.96.0.50", 80)),
            SourceEvent::SliceUpsert(slice("new", 80, &[("10.0.9.9", "k8s-master")])),
        ],
        // Delete a Service with endpoints.
        vec![SourceEvent::ServiceDelete(NamespacedName::new(
            "default", "s4",
        ))],
    ];
    for step in steps {
        for e in step {
            t.apply(e);
        }
        let (snap, changes) = t.checkout();
        let report = p.sync(&snap, &changes).unwrap();
        assert!(!report.full);
        // The same snapshot synced fully into a fresh kernel.
        let mut fresh = proxier(FakeIptables::new(IpVersion::V4));
        fresh.sync(&snap, &Changes::default()).unwrap();
        assert_eq!(
            save(&p),
            save(&fresh),
            "partial sync diverged from a full sync"
        );
    }
    let saved = save(&p);
    assert!(saved.contains("default/s2 has no endpoints"));
    assert!(!saved.contains("10.0.1.2:8080"));
    assert!(
        !saved.contains("10.96.0.5/32"),
        "deleted Service s4 is gone"
    );
}

#[test]
fn stale_chains_from_an_earlier_run_are_deleted() {
    let fake = FakeIptables::new(IpVersion::V4);
    fake.restore(
        b"*nat\n:KUBE-SVC-AAAAAAAAAAAAAAAA - [0:0]\n:KUBE-SEP-BBBBBBBBBBBBBBBB - [0:0]\n:MY-CHAIN - [0:0]\n\
          -A KUBE-SVC-AAAAAAAAAAAAAAAA -j KUBE-SEP-BBBBBBBBBBBBBBBB\n-A MY-CHAIN -j RETURN\nCOMMIT\n",
    )
    .unwrap();
    let mut t = tracker();
    for e in seed_events() {
        t.apply(e);
    }
    let mut p = proxier(fake);
    let report = sync(&mut p, &mut t);
    assert_eq!(report.deleted_chains, 2);
    let saved = save(&p);
    assert!(!saved.contains("AAAAAAAAAAAAAAAA") && !saved.contains("BBBBBBBBBBBBBBBB"));
    assert!(
        saved.contains("-A MY-CHAIN -j RETURN"),
        "other software's chains stay"
    );
}

#[test]
fn failed_restore_keeps_the_kernel_and_forces_a_full_retry() {
    let mut t = tracker();
    for e in seed_events() {
        t.apply(e);
    }
    let mut p = proxier(FakeIptables::new(IpVersion::V4));
    sync(&mut p, &mut t);
    let before = save(&p);
    t.apply(SourceEvent::SliceUpsert(slice(
        "nginx-svc",
        80,
        &[("10.0.0.4", "k8s-master")],
    )));
    let (snap, changes) = t.checkout();
    p.runner()
        .fail_next_restore("iptables-restore: line 7 failed");
    let err = p.sync(&snap, &changes).unwrap_err();
    assert!(err.to_string().contains("line 7 failed"), "{err}");
    assert_eq!(save(&p), before, "the kernel keeps its rules");
    // The retry gets no change list (the tracker was drained) but must be full.
    let report = p.sync(&snap, &Changes::default()).unwrap();
    assert!(report.full);
    assert!(!save(&p).contains("10.0.1.2:80"));
}

#[test]
fn cleanup_leaves_the_tables_as_they_were() {
    let fake = FakeIptables::new(IpVersion::V4);
    fake.restore(b"*filter\n:FOREIGN - [0:0]\n-A INPUT -j FOREIGN\nCOMMIT\n*nat\n-A POSTROUTING -o eth9 -j MASQUERADE\nCOMMIT\n")
        .unwrap();
    let pristine = format!(
        "{}{}",
        fake.save(Some(Table::Filter)).unwrap(),
        fake.save(Some(Table::Nat)).unwrap()
    );
    let mut t = tracker();
    for e in seed_events() {
        t.apply(e);
    }
    let mut p = proxier(fake);
    sync(&mut p, &mut t);
    assert_ne!(save(&p), pristine);
    assert!(
        p.runner()
            .chain_exists(Table::Mangle, canary::KUBE_PROXY_CANARY)
            .unwrap()
    );
    let plan = cleanup(p.runner()).unwrap();
    assert!(plan.kept.is_empty(), "{:?}", plan.kept);
    assert_eq!(save(&p), pristine);
    // The canaries went too, the mangle table's included.
    for table in canary::CANARY_TABLES {
        assert!(
            !p.runner()
                .chain_exists(table, canary::KUBE_PROXY_CANARY)
                .unwrap()
        );
        assert!(
            plan.removed.contains(&format!("{table}/KUBE-PROXY-CANARY")),
            "{:?}",
            plan.removed
        );
    }
    // A second cleanup finds nothing to do.
    assert!(cleanup(p.runner()).unwrap().payload.is_none());
}

/// The cleanup of the backend a node does not use removes what `--cleanup` removes, but
/// leaves `KUBE-FIREWALL` (kubelet's on older nodes) with its jumps, and other programs'
/// rules.
#[test]
fn cleanup_of_the_other_backend_keeps_kube_firewall() {
    let fake = FakeIptables::new(IpVersion::V4);
    fake.restore(b"*filter\n:FOREIGN - [0:0]\n-A INPUT -j FOREIGN\nCOMMIT\n*nat\n-A POSTROUTING -o eth9 -j MASQUERADE\nCOMMIT\n")
        .unwrap();
    let mut t = tracker();
    for e in seed_events() {
        t.apply(e);
    }
    let mut p = proxier(fake);
    sync(&mut p, &mut t);
    assert!(save(&p).contains(":KUBE-FIREWALL - [0:0]"));
    let plan = cleanup_other_backend(p.runner()).unwrap();
    assert_eq!(
        plan.kept,
        [(
            "filter/KUBE-FIREWALL".to_string(),
            "kubelet may own it; left in the backend this node does not use".to_string()
        )]
    );
    assert!(plan.removed.contains(&"nat/KUBE-SERVICES".to_string()));
    assert!(
        plan.removed
            .contains(&"mangle/KUBE-PROXY-CANARY".to_string())
    );
    let after = save_all(&p);
    let kube: Vec<&str> = after.lines().filter(|l| l.contains("KUBE-")).collect();
    assert_eq!(
        kube,
        [
            ":KUBE-FIREWALL - [0:0]",
            "-A INPUT -j KUBE-FIREWALL",
            "-A OUTPUT -j KUBE-FIREWALL",
            reconcile::KUBE_FIREWALL_RULE,
        ],
        "{after}"
    );
    assert!(after.contains("-A INPUT -j FOREIGN") && after.contains("-o eth9 -j MASQUERADE"));
    // `--cleanup` takes KUBE-FIREWALL too, since it holds only our rule.
    let plan = cleanup(p.runner()).unwrap();
    assert_eq!(plan.removed, ["filter/KUBE-FIREWALL"]);
}

/// Both cleanups read every table with one `iptables-save` (never `-t TABLE`, which creates a
/// missing legacy table) and write only to tables that exist: an empty legacy backend gets
/// one `iptables-legacy-save` and nothing else.
#[test]
fn cleanups_never_name_a_table_that_does_not_exist() {
    use kp_netfilter::{Backend, ExecIptables, ExecOutput, ScriptedExec};
    let dump = |text: &'static str| {
        Arc::new(ScriptedExec::new(move |argv, _| {
            match argv.last().map(String::as_str) {
                Some("--version") => ExecOutput::ok("iptables v1.8.9 (legacy)\n"),
                _ if argv[0].ends_with("-save") => ExecOutput::ok(text),
                _ => ExecOutput::ok(""),
            }
        }))
    };
    for other in [false, true] {
        let exec = dump("");
        let ipt = ExecIptables::with_exec(IpVersion::V4, Backend::Legacy, exec.clone());
        let plan = if other {
            cleanup_other_backend(&ipt).unwrap()
        } else {
            cleanup(&ipt).unwrap()
        };
        assert!(plan.payload.is_none());
        let argvs: Vec<String> = exec.calls().iter().map(|c| c.argv.join(" ")).collect();
        assert_eq!(argvs, ["iptables-legacy-save"]);

        // Only nat exists (an old kube-proxy's rules): the restore names nat alone.
        let exec = dump(
            "# Generated by iptables-save v1.8.9\n*nat\n:PREROUTING ACCEPT [0:0]\n\
             :KUBE-SERVICES - [0:0]\n:KUBE-SVC-X - [0:0]\n\
             -A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n\
             -A KUBE-SERVICES -d 10.96.0.1/32 -p tcp -m tcp --dport 443 -j KUBE-SVC-X\nCOMMIT\n",
        );
        let ipt = ExecIptables::with_exec(IpVersion::V4, Backend::Legacy, exec.clone());
        let plan = if other {
            cleanup_other_backend(&ipt).unwrap()
        } else {
            cleanup(&ipt).unwrap()
        };
        assert_eq!(plan.removed, ["nat/KUBE-SERVICES", "nat/KUBE-SVC-X"]);
        let calls = exec.calls();
        let restore = calls
            .iter()
            .find(|c| c.argv[0] == "iptables-legacy-restore")
            .expect("a restore");
        let payload = String::from_utf8_lossy(restore.stdin.as_deref().unwrap()).into_owned();
        let tables: Vec<&str> = payload.lines().filter(|l| l.starts_with('*')).collect();
        assert_eq!(tables, ["*nat"], "{payload}");
        assert!(
            !calls.iter().any(|c| c.argv.contains(&"-t".to_string())),
            "{calls:?}"
        );
    }
}

#[test]
fn route_localnet_is_set_for_localhost_nodeports() {
    let host = Arc::new(FakeHost::default());
    let mut p = IptablesProxier::new(
        IpFamily::V4,
        cfg(),
        FakeIptables::new(IpVersion::V4),
        host.clone(),
    )
    .unwrap();
    let mut t = tracker();
    let (snap, changes) = t.checkout();
    p.sync(&snap, &changes).unwrap();
    assert_eq!(
        host.get_sysctl("net/ipv4/conf/all/route_localnet")
            .as_deref(),
        Some("1")
    );
    let host = Arc::new(FakeHost::default());
    let off = IptablesConfig {
        localhost_nodeports: false,
        ..cfg()
    };
    let mut p = IptablesProxier::new(
        IpFamily::V4,
        off,
        FakeIptables::new(IpVersion::V4),
        host.clone(),
    )
    .unwrap();
    p.sync(&snap, &changes).unwrap();
    assert_eq!(host.get_sysctl("net/ipv4/conf/all/route_localnet"), None);
}

#[test]
fn nodeport_addresses_use_local_addresses() {
    let host = Arc::new(FakeHost::with_addresses(vec![
        ip("127.0.0.1"),
        ip("192.168.56.10"),
        ip("10.9.9.9"),
    ]));
    let c = IptablesConfig {
        nodeport_addresses: NodePortAddresses::parse(&["192.168.56.0/24"]).unwrap(),
        ..cfg()
    };
    let mut p =
        IptablesProxier::new(IpFamily::V4, c, FakeIptables::new(IpVersion::V4), host).unwrap();
    let mut t = tracker();
    let (snap, changes) = t.checkout();
    p.sync(&snap, &changes).unwrap();
    let saved = save(&p);
    assert!(saved.contains("-A KUBE-SERVICES -d 192.168.56.10/32 -m comment --comment \"kubernetes service nodeports; NOTE: this must be the last rule in this chain\" -j KUBE-NODEPORTS"));
    assert!(!saved.contains("10.9.9.9"));
    assert!(
        !saved.contains("-A KUBE-FIREWALL"),
        "no localhost NodePorts when loopback is not a NodePort address"
    );
}

#[test]
fn bad_masquerade_bit_is_rejected() {
    let c = IptablesConfig {
        masquerade_bit: 32,
        ..cfg()
    };
    assert!(
        IptablesProxier::new(
            IpFamily::V4,
            c,
            FakeIptables::new(IpVersion::V4),
            Arc::new(FakeHost::default())
        )
        .is_err()
    );
}

#[test]
fn empty_snapshot_is_valid() {
    let mut p = proxier(FakeIptables::new(IpVersion::V4));
    let snap = Snapshot::empty(IpFamily::V4, "n");
    p.sync(&snap, &Changes::default()).unwrap();
    assert!(save(&p).contains(":KUBE-SERVICES - [0:0]"));
}

/// A conntrack fake shared with the test (the proxier owns its seam).
#[derive(Clone, Default)]
struct SharedConntrack(Arc<std::sync::Mutex<kp_netlink::FakeConntrack>>);

impl kp_netlink::ConntrackOps for SharedConntrack {
    fn dump(
        &mut self,
        family: kp_netlink::Family,
        proto: Option<u8>,
    ) -> kp_netlink::Result<Vec<kp_netlink::Flow>> {
        self.0.lock().unwrap().dump(family, proto)
    }
    fn delete(&mut self, flow: &kp_netlink::Flow) -> kp_netlink::Result<bool> {
        self.0.lock().unwrap().delete(flow)
    }
}

#[test]
fn udp_changes_clean_stale_conntrack_entries() {
    let ct = SharedConntrack::default();
    let mut p = proxier(FakeIptables::new(IpVersion::V4)).with_conntrack(Box::new(ct.clone()));
    let mut t = tracker();
    let dns = ServiceBuilder::new("dns", "10.96.0.10").udp("", 53).build();
    t.apply(SourceEvent::ServiceUpsert(dns));
    t.apply(SourceEvent::SliceUpsert(
        SliceBuilder::new("dns")
            .port_proto("", kp_model::Protocol::Udp, 5353)
            .ready("10.0.0.5", "a")
            .build(),
    ));
    t.apply(SourceEvent::ServiceUpsert(service("web", "10.96.0.20", 80)));
    sync(&mut p, &mut t);
    let client: std::net::SocketAddr = "10.0.1.9:40000".parse().unwrap();
    let flow = kp_netlink::Flow::udp(
        client,
        "10.96.0.10:53".parse().unwrap(),
        "10.0.0.5:5353".parse().unwrap(),
    );
    ct.0.lock().unwrap().insert(flow);
    let dumps = || ct.0.lock().unwrap().dumps();

    // A TCP-only change does not even look at conntrack, and reports no reconciler time.
    let before = dumps();
    t.apply(SourceEvent::SliceUpsert(slice(
        "web",
        80,
        &[("10.0.0.7", "a")],
    )));
    let report = sync(&mut p, &mut t);
    assert_eq!(report.conntrack_deleted, 0);
    assert_eq!(report.conntrack_time, None);
    assert_eq!(dumps(), before);

    // The UDP endpoint moves: the entry to the old one goes.
    t.apply(SourceEvent::SliceUpsert(
        SliceBuilder::new("dns")
            .port_proto("", kp_model::Protocol::Udp, 5353)
            .ready("10.0.0.6", "a")
            .build(),
    ));
    let report = sync(&mut p, &mut t);
    assert_eq!(report.conntrack_deleted, 1);
    assert!(
        report.conntrack_time.is_some(),
        "the reconciler ran and was timed"
    );
    assert!(ct.0.lock().unwrap().flows().is_empty());
}

/// `…iptables_last`: a sync reports the rules it sent per table, counted in the payload the
/// runner received; a partial sync sends the changed Service's chains (and the top-level
/// ones), fewer than the table holds; a full sync with nothing to change sends nothing.
#[test]
fn syncs_report_the_rules_they_wrote() {
    let mut t = tracker();
    for e in seed_events() {
        t.apply(e);
    }
    t.apply(SourceEvent::ServiceUpsert(service("web", "10.96.0.20", 80)));
    t.apply(SourceEvent::SliceUpsert(slice(
        "web",
        80,
        &[("10.0.0.7", "a")],
    )));
    let mut p = proxier(FakeIptables::new(IpVersion::V4));
    let first = sync(&mut p, &mut t);
    assert!(first.full);
    assert_eq!(first.nat_rules_written, first.nat_rules);
    assert_eq!(first.filter_rules_written, first.filter_rules);
    t.apply(SourceEvent::SliceUpsert(slice(
        "web",
        80,
        &[("10.0.0.8", "a")],
    )));
    let partial = sync(&mut p, &mut t);
    assert!(!partial.full);
    let payload = String::from_utf8(p.runner().last_payload().unwrap()).unwrap();
    let count = |table: &str| {
        let mut inside = false;
        payload
            .lines()
            .filter(|l| {
                if let Some(t) = l.strip_prefix('*') {
                    inside = t == table;
                }
                inside
                    && l.starts_with("-A ")
                    && !["INPUT", "FORWARD", "OUTPUT", "PREROUTING", "POSTROUTING"]
                        .contains(&l[3..].split(' ').next().unwrap_or(""))
            })
            .count()
    };
    assert_eq!(partial.nat_rules_written, count("nat"), "{payload}");
    assert_eq!(partial.filter_rules_written, count("filter"), "{payload}");
    assert!(
        partial.nat_rules_written < partial.nat_rules,
        "{} of {}",
        partial.nat_rules_written,
        partial.nat_rules
    );
    // A forced full sync of an unchanged kernel sends nothing.
    let (snap, _) = t.checkout();
    let full = Changes {
        full_resync_needed: true,
        ..Changes::default()
    };
    let report = p.sync(&snap, &full).unwrap();
    assert!(report.full);
    assert_eq!(
        (report.nat_rules_written, report.filter_rules_written),
        (0, 0)
    );
}

#[test]
fn rule_counts_follow_the_tables_of_a_payload() {
    let payload = b"*filter\n:KUBE-SERVICES - [0:0]\n-A KUBE-SERVICES -j ACCEPT\n-A FORWARD -j KUBE-FORWARD\nCOMMIT\n*nat\n-A POSTROUTING -m comment --comment \"kubernetes postrouting rules\" -j KUBE-POSTROUTING\n-A KUBE-SERVICES -j KUBE-SVC-X\n-A KUBE-SVC-X -j KUBE-SEP-Y\n-X KUBE-SEP-OLD\nCOMMIT\n*mangle\n-A KUBE-PROXY-CANARY -j RETURN\nCOMMIT\n";
    assert_eq!(RuleCount::of(payload), RuleCount { filter: 1, nat: 2 });
}

/// Every table the fake holds (mangle, filter, nat), as `iptables-save` prints them.
fn save_all(p: &IptablesProxier<FakeIptables>) -> String {
    p.runner().save(None).unwrap()
}

/// The first full sync leaves upstream's empty `KUBE-PROXY-CANARY` chain in mangle, nat and
/// filter; a check lists just those three chains and writes nothing. When someone runs
/// `iptables -t TABLE -F; iptables -t TABLE -X` (for each of the three tables in turn), the
/// check reports it, and the next sync, without any change of Services, is full and puts
/// back exactly what was there, canaries included.
#[test]
fn a_flushed_table_is_noticed_and_the_next_sync_repairs_it() {
    let mut t = tracker();
    for e in seed_events() {
        t.apply(e);
    }
    let mut p = proxier(FakeIptables::new(IpVersion::V4));
    assert!(
        !p.check_dataplane().unwrap(),
        "nothing to check before the first sync"
    );
    assert_eq!(p.runner().chain_check_count(), 0);
    sync(&mut p, &mut t);
    let fake = p.runner();
    for table in canary::CANARY_TABLES {
        let rules = fake.table(table);
        let chain = rules
            .chains
            .get(canary::KUBE_PROXY_CANARY)
            .unwrap_or_else(|| panic!("no canary in {table}"));
        assert!(chain.rules.is_empty() && chain.policy.is_none());
    }
    assert!(save_all(&p).contains("*mangle\n"));
    let good = save_all(&p);
    let restores = p.runner().restore_count();
    assert!(!p.check_dataplane().unwrap());
    assert_eq!(p.runner().chain_check_count(), 3, "one listing per table");
    assert_eq!(
        p.runner().restore_count(),
        restores,
        "a check writes nothing"
    );

    for table in canary::CANARY_TABLES {
        p.runner()
            .restore(format!("*{table}\n-F\n-X\nCOMMIT\n").as_bytes())
            .unwrap();
        assert_ne!(save_all(&p), good);
        assert!(p.check_dataplane().unwrap(), "{table} flush not noticed");
        // Until the repair, the next sync is full: nothing more to check.
        let checks = p.runner().chain_check_count();
        assert!(!p.check_dataplane().unwrap());
        assert_eq!(p.runner().chain_check_count(), checks);
        let (snap, changes) = t.checkout();
        assert!(changes.services.is_empty() && !changes.full_resync_needed);
        let report = p.sync(&snap, &changes).unwrap();
        assert!(report.full, "{table}: the repair is a full sync");
        assert_eq!(save_all(&p), good, "{table}: everything is back");
        assert_contains_in_chain_order(&save(&p), &seed_expected_lines());
        assert!(!p.check_dataplane().unwrap());
    }
}

/// Partial syncs never name the canaries, so one deleted by someone else is not quietly
/// re-created before the check sees it (the other rules it went with would stay missing).
#[test]
fn partial_syncs_leave_the_canaries_to_full_syncs() {
    let mut t = tracker();
    for e in seed_events() {
        t.apply(e);
    }
    let mut p = proxier(FakeIptables::new(IpVersion::V4));
    sync(&mut p, &mut t);
    assert!(
        String::from_utf8(p.runner().last_payload().unwrap())
            .unwrap()
            .ends_with(canary::CANARY_BLOCKS)
    );
    p.runner()
        .restore(b"*mangle\n-X KUBE-PROXY-CANARY\nCOMMIT\n")
        .unwrap();
    t.apply(SourceEvent::ServiceUpsert(service(
        "other",
        "10.96.0.7",
        80,
    )));
    let report = sync(&mut p, &mut t);
    assert!(!report.full);
    let payload = String::from_utf8(p.runner().last_payload().unwrap()).unwrap();
    assert!(!payload.contains("CANARY"), "{payload}");
    assert!(
        p.check_dataplane().unwrap(),
        "the missing mangle canary is still noticed"
    );
}

/// A check that cannot run (here: iptables fails with status 4, the xtables lock) is an
/// error, not a reason to resync.
#[test]
fn a_check_that_cannot_run_is_an_error() {
    use kp_netfilter::{Backend, ExecIptables, ExecOutput, ScriptedExec};
    let exec = Arc::new(ScriptedExec::new(|argv, _| {
        if argv.last().is_some_and(|a| a == "--version") {
            ExecOutput::ok("iptables v1.8.9 (legacy)\n")
        } else if argv[0] == "iptables" {
            ExecOutput::failed(4, "Another app is currently holding the xtables lock.")
        } else {
            ExecOutput::ok("")
        }
    }));
    let ipt = ExecIptables::with_exec(IpVersion::V4, Backend::Default, exec);
    let mut p =
        IptablesProxier::new(IpFamily::V4, cfg(), ipt, Arc::new(FakeHost::default())).unwrap();
    let (snap, changes) = tracker().checkout();
    p.sync(&snap, &changes).unwrap();
    let err = p.check_dataplane().unwrap_err();
    assert!(err.to_string().contains("xtables lock"), "{err}");
}

fn nodeport_events() -> Vec<SourceEvent> {
    vec![
        SourceEvent::ServiceUpsert(
            ServiceBuilder::new("web", "10.96.0.20")
                .tcp("", 80)
                .node_port(30080)
                .build(),
        ),
        SourceEvent::SliceUpsert(slice("web", 8080, &[("10.0.0.4", "k8s-master")])),
    ]
}

/// Upstream's full-sync "ensure the nfacct counters": the first sync creates both counters,
/// then writes the rules that count into them; partial syncs keep them.
#[test]
fn full_sync_creates_the_nfacct_counters_and_matches_them() {
    let nfacct = kp_netlink::FakeNfacct::new();
    let mut p = proxier(FakeIptables::new(IpVersion::V4)).with_nfacct(Box::new(nfacct.clone()));
    let mut t = tracker();
    for e in nodeport_events() {
        t.apply(e);
    }
    assert!(sync(&mut p, &mut t).full);
    let names: Vec<String> = nfacct.counters().into_keys().collect();
    assert_eq!(
        names,
        [
            "ct_state_invalid_dropped_pkts",
            "localhost_nps_accepted_pkts"
        ]
    );
    assert_eq!(
        p.nfacct_counters(),
        NfacctCounters {
            ct_state_invalid_dropped: true,
            localhost_nodeports_accepted: true
        }
    );
    let saved = save(&p);
    assert!(saved.contains("-A KUBE-FORWARD -m conntrack --ctstate INVALID -m nfacct --nfacct-name ct_state_invalid_dropped_pkts -j DROP"), "{saved}");
    assert!(saved.contains("-A KUBE-NODEPORTS -d 127.0.0.0/8 -p tcp -m comment --comment \"default/web\" -m tcp --dport 30080 -m nfacct --nfacct-name localhost_nps_accepted_pkts -j KUBE-EXT-"), "{saved}");
    // Counts the kernel kept are not reset by later syncs.
    nfacct.set("localhost_nps_accepted_pkts", 3, 180);
    t.apply(SourceEvent::ServiceUpsert(service(
        "other",
        "10.96.0.21",
        80,
    )));
    assert!(!sync(&mut p, &mut t).full);
    assert!(save(&p).contains("localhost_nps_accepted_pkts -j KUBE-EXT-"));
    assert_eq!(nfacct.counters()["localhost_nps_accepted_pkts"].packets, 3);
}

/// A kernel without nfacct (or no handle at all): the rules are upstream's for such a node,
/// the seed's.
#[test]
fn without_nfacct_the_rules_are_the_seeds() {
    for p in [
        proxier(FakeIptables::new(IpVersion::V4))
            .with_nfacct(Box::new(kp_netlink::FakeNfacct::unsupported())),
        proxier(FakeIptables::new(IpVersion::V4)),
    ] {
        let mut p = p;
        let mut t = tracker();
        for e in seed_events().into_iter().chain(nodeport_events()) {
            t.apply(e);
        }
        sync(&mut p, &mut t);
        assert_eq!(p.nfacct_counters(), NfacctCounters::default());
        let saved = save(&p);
        assert!(!saved.contains("nfacct"), "{saved}");
        assert_contains_in_chain_order(&saved, &seed_expected_lines());
    }
}

/// `n` Services `big-i` (10.96.1.i:80) with 10 endpoints each: about 45 nat lines per Service.
fn big_cluster_events(n: usize) -> Vec<SourceEvent> {
    let mut out = Vec::new();
    for i in 0..n {
        let name = format!("big-{i}");
        out.push(SourceEvent::ServiceUpsert(
            ServiceBuilder::new(&name, &format!("10.96.{}.{}", 1 + i / 250, i % 250))
                .tcp("", 80)
                .build(),
        ));
        let mut s = SliceBuilder::new(&name)
            .named(&format!("{name}-x"))
            .port("", 8080);
        for e in 0..10 {
            s = s.ready(&format!("10.0.{}.{}", i % 250, 10 + e), "k8s-worker");
        }
        out.push(SourceEvent::SliceUpsert(s.build()));
    }
    out
}

/// `big-i`'s slice with its 10 endpoints moved to 10.0.(i % 250).(first..first + 10).
fn big_moved(i: usize, first: usize) -> SourceEvent {
    let name = format!("big-{i}");
    let mut s = SliceBuilder::new(&name)
        .named(&format!("{name}-x"))
        .port("", 8080);
    for e in 0..10 {
        s = s.ready(&format!("10.0.{}.{}", i % 250, first + e), "k8s-worker");
    }
    SourceEvent::SliceUpsert(s.build())
}

fn nat_blocks(payload: &[u8]) -> usize {
    String::from_utf8_lossy(payload).matches("*nat\n").count()
}

fn legacy() -> kp_netfilter::IptablesVersion {
    kp_netfilter::IptablesVersion::parse("iptables v1.8.9 (legacy)").unwrap()
}

#[test]
fn the_legacy_backend_keeps_one_transaction_and_nft_splits_large_full_syncs() {
    let mut t = tracker();
    for e in big_cluster_events(100) {
        t.apply(e);
    }
    let (snap, changes) = t.checkout();
    let mut nft = proxier(FakeIptables::new(IpVersion::V4));
    let mut leg = proxier(FakeIptables::new(IpVersion::V4).with_version(legacy()));
    for p in [&mut nft, &mut leg] {
        assert!(p.sync(&snap, &changes).unwrap().full);
    }
    let nft_payload = nft.runner().last_payload().unwrap();
    let leg_payload = leg.runner().last_payload().unwrap();
    assert!(
        nat_blocks(&leg_payload) == 2,
        "legacy: the nat table and its canary, one transaction each"
    );
    assert!(
        nat_blocks(&nft_payload) >= 5,
        "nf_tables: {} nat blocks",
        nat_blocks(&nft_payload)
    );
    assert_eq!(save(&nft), save(&leg), "the same rules either way");
    // A full resync over the unchanged table writes nothing.
    let full = Changes {
        full_resync_needed: true,
        ..Changes::default()
    };
    let restores = nft.runner().restore_count();
    assert_eq!(nft.sync(&snap, &full).unwrap().payload_bytes, 0);
    assert_eq!(nft.runner().restore_count(), restores);
    // One that rewrites many Services is split too; a partial sync never is.
    for i in 0..90 {
        t.apply(big_moved(i, 30));
    }
    let (snap, _) = t.checkout();
    for p in [&mut nft, &mut leg] {
        assert!(p.sync(&snap, &full).unwrap().full);
    }
    assert!(nat_blocks(&nft.runner().last_payload().unwrap()) >= 3);
    // One nat transaction, and no canary block: the canary is there.
    assert_eq!(nat_blocks(&leg.runner().last_payload().unwrap()), 1);
    assert_eq!(save(&nft), save(&leg));
    t.apply(SourceEvent::ServiceDelete(NamespacedName::new(
        "default", "big-7",
    )));
    let (snap, changes) = t.checkout();
    assert!(!nft.sync(&snap, &changes).unwrap().full);
    assert_eq!(nat_blocks(&nft.runner().last_payload().unwrap()), 1);
    // Splitting can be turned off, and `-Z` payloads are sent whole.
    let mut off = proxier(FakeIptables::new(IpVersion::V4)).with_split_full_syncs(None);
    off.sync(&snap, &Changes::default()).unwrap();
    assert_eq!(nat_blocks(&off.runner().last_payload().unwrap()), 2);
    let mut zero = proxier(FakeIptables::new(IpVersion::V4)).with_zero_counters_on_full_sync(true);
    zero.sync(&snap, &Changes::default()).unwrap();
    assert_eq!(nat_blocks(&zero.runner().last_payload().unwrap()), 2);
}

#[test]
fn a_failed_transaction_of_a_split_sync_leaves_a_correct_state_and_forces_a_full_retry() {
    let mut t = tracker();
    for e in big_cluster_events(100) {
        t.apply(e);
    }
    let mut p = proxier(FakeIptables::new(IpVersion::V4));
    sync(&mut p, &mut t);
    // Another program jumps to big-3's KUBE-SVC chain, so that deleting it fails (the last
    // transactions of the split sync delete the stale chains).
    let nat = p.runner().save(Some(Table::Nat)).unwrap();
    let svc3 = nat
        .lines()
        .find(|l| l.contains("default/big-3 cluster IP") && l.starts_with("-A KUBE-SERVICES"))
        .and_then(|l| l.rsplit(' ').next())
        .unwrap()
        .to_string();
    p.runner()
        .restore(format!("*nat\n:FOREIGN - [0:0]\n-A FOREIGN -j {svc3}\nCOMMIT\n").as_bytes())
        .unwrap();
    t.apply(SourceEvent::ServiceDelete(NamespacedName::new(
        "default", "big-3",
    )));
    t.apply(SourceEvent::ServiceUpsert(
        ServiceBuilder::new("new-svc", "10.96.9.9")
            .tcp("", 80)
            .build(),
    ));
    t.apply(SourceEvent::SliceUpsert(slice(
        "new-svc",
        80,
        &[("10.0.9.9", "k8s-worker")],
    )));
    // Enough other changes for the resync to be split.
    for i in 10..90 {
        t.apply(big_moved(i, 30));
    }
    let (snap, mut changes) = t.checkout();
    changes.full_resync_needed = true;
    let err = p.sync(&snap, &changes).unwrap_err();
    assert!(err.to_string().contains("failed"), "{err}");
    assert!(nat_blocks(&p.runner().last_payload().unwrap()) >= 5);
    // The transactions before the failing one are in place, and they are a correct state:
    // the new Service is reachable, the deleted one no longer is, its chain still exists.
    let nat = p.runner().save(Some(Table::Nat)).unwrap();
    assert!(nat.contains("-d 10.96.9.9/32"), "new Service programmed");
    assert!(
        !nat.lines()
            .any(|l| l.starts_with("-A KUBE-SERVICES") && l.contains("default/big-3 cluster IP"))
    );
    assert!(nat.contains(&format!(":{svc3} ")));
    // The retry, without a change list, is full and finishes the job once nothing blocks it.
    p.runner()
        .restore(b"*nat\n:FOREIGN - [0:0]\n-X FOREIGN\nCOMMIT\n")
        .unwrap();
    let report = p.sync(&snap, &Changes::default()).unwrap();
    assert!(report.full);
    assert!(report.deleted_chains >= 11, "{}", report.deleted_chains);
    let mut fresh = proxier(FakeIptables::new(IpVersion::V4));
    fresh.sync(&snap, &Changes::default()).unwrap();
    assert_eq!(save(&p), save(&fresh));
    assert!(!p.runner().save(Some(Table::Nat)).unwrap().contains(&svc3));
}

fn tree_proxier(fake: FakeIptables, leaf_rules: usize) -> IptablesProxier<FakeIptables> {
    proxier(fake).with_dispatch(tree::Dispatch::Tree { leaf_rules })
}

/// Lines of `payload`'s nat table that write into a chain with `prefix`.
fn lines_into(payload: &str, prefix: &str) -> usize {
    let nat = payload.split_once("*nat\n").map_or(payload, |(_, n)| n);
    nat.lines()
        .filter(|l| l.starts_with("-A ") && l[3..].starts_with(prefix))
        .count()
}

#[test]
fn tree_layout_partial_syncs_equal_full_syncs_and_rewrite_only_the_path() {
    let mut t = tracker();
    for e in big_cluster_events(200) {
        t.apply(e);
    }
    let mut p = tree_proxier(FakeIptables::new(IpVersion::V4), 4);
    let mut up = proxier(FakeIptables::new(IpVersion::V4));
    let (snap, changes) = t.checkout();
    assert!(p.sync(&snap, &changes).unwrap().full);
    up.sync(&snap, &changes).unwrap();
    let nat = p.runner().save(Some(Table::Nat)).unwrap();
    let tree_lines = lines_into(&nat, "KUBE-SVT-");
    assert!(tree_lines > 200, "{tree_lines} tree lines");
    assert!(
        lines_into(&nat, "KUBE-SERVICES ") <= 3,
        "KUBE-SERVICES holds the root only:\n{nat}"
    );
    // The per-Service chains are upstream's, rule for rule.
    let per_service = |s: &str| -> Vec<String> {
        s.lines()
            .filter(|l| {
                l.starts_with("-A ") && names::is_service_chain(l[3..].split(' ').next().unwrap())
            })
            .map(str::to_string)
            .collect()
    };
    let upstream_nat = up.runner().save(Some(Table::Nat)).unwrap();
    assert_eq!(per_service(&nat), per_service(&upstream_nat));

    let steps: Vec<Vec<SourceEvent>> = vec![
        vec![SourceEvent::ServiceDelete(NamespacedName::new(
            "default", "big-7",
        ))],
        vec![
            SourceEvent::ServiceUpsert(service("new", "10.96.0.200", 80)),
            SourceEvent::SliceUpsert(slice("new", 80, &[("10.0.9.9", "k8s-master")])),
        ],
        // No endpoints: the entry leaves the nat table for filter's REJECT.
        vec![SourceEvent::SliceDelete(NamespacedName::new(
            "default", "big-20-x",
        ))],
        // Endpoints change only: no dispatch chain changes.
        vec![SourceEvent::SliceUpsert(slice(
            "big-30",
            8080,
            &[("10.0.30.99", "k8s-worker")],
        ))],
        vec![SourceEvent::ServiceDelete(NamespacedName::new(
            "default", "new",
        ))],
    ];
    for (i, step) in steps.into_iter().enumerate() {
        for e in step {
            t.apply(e);
        }
        let (snap, changes) = t.checkout();
        let report = p.sync(&snap, &changes.clone()).unwrap();
        assert!(!report.full);
        let payload = String::from_utf8(p.runner().last_payload().unwrap()).unwrap();
        let up_report = up.sync(&snap, &changes).unwrap();
        let mut fresh = tree_proxier(FakeIptables::new(IpVersion::V4), 4);
        fresh.sync(&snap, &Changes::default()).unwrap();
        assert_eq!(
            save(&p),
            save(&fresh),
            "step {i}: partial diverged from full"
        );
        // Only the chains on the changed entry's path: a leaf and a few ancestors.
        let written = lines_into(&payload, "KUBE-SVT-") + lines_into(&payload, "KUBE-SERVICES ");
        assert!(
            written <= 12,
            "step {i}: {written} dispatch lines\n{payload}"
        );
        assert_eq!(lines_into(&payload, "KUBE-NODEPORTS "), 0, "step {i}");
        if i == 3 {
            assert_eq!(
                written, 0,
                "an endpoint change rewrites no dispatch chain:\n{payload}"
            );
        }
        assert!(
            report.payload_bytes * 5 < up_report.payload_bytes,
            "step {i}: tree {} bytes, upstream {}",
            report.payload_bytes,
            up_report.payload_bytes
        );
    }
    // Same rules in nat as upstream's layout once the tree is flattened: every entry of
    // upstream's KUBE-SERVICES is in some tree chain.
    let nat = p.runner().save(Some(Table::Nat)).unwrap();
    let upstream_nat = up.runner().save(Some(Table::Nat)).unwrap();
    let entries = |s: &str| -> BTreeSet<String> {
        s.lines()
            .filter(|l| l.starts_with("-A KUBE-SERVICES -d ") || l.starts_with("-A KUBE-SVT-"))
            .filter(|l| !l.contains(" -j KUBE-SVT-") && !l.contains(" -g KUBE-SVT-"))
            .map(|l| l.split_once(" -d ").unwrap().1.to_string())
            .collect()
    };
    assert_eq!(entries(&nat), entries(&upstream_nat));
    assert!(nat.contains("-A KUBE-SERVICES -m comment --comment \"kubernetes service nodeports"));
}

#[test]
fn switching_dispatch_layouts_deletes_the_other_layouts_chains() {
    let mut t = tracker();
    for e in big_cluster_events(60) {
        t.apply(e);
    }
    let (snap, changes) = t.checkout();
    let mut p = tree_proxier(FakeIptables::new(IpVersion::V4), 4);
    p.sync(&snap, &changes).unwrap();
    let dump = p.runner().save(None).unwrap();
    assert!(dump.contains(":KUBE-SVT-"));
    // A restart in upstream's layout over the tree's rules: a full sync removes the tree.
    let fake = FakeIptables::new(IpVersion::V4);
    fake.restore(dump.as_bytes()).unwrap();
    let mut up = proxier(fake);
    let report = up.sync(&snap, &Changes::default()).unwrap();
    assert!(report.deleted_chains > 10, "{}", report.deleted_chains);
    let mut fresh = proxier(FakeIptables::new(IpVersion::V4));
    fresh.sync(&snap, &Changes::default()).unwrap();
    assert_eq!(save(&up), save(&fresh));
    // And back; then --cleanup removes every chain of ours, tree chains included.
    let fake = FakeIptables::new(IpVersion::V4);
    fake.restore(up.runner().save(None).unwrap().as_bytes())
        .unwrap();
    let mut back = tree_proxier(fake, 4);
    back.sync(&snap, &Changes::default()).unwrap();
    assert_eq!(save(&back), save(&p));
    cleanup(back.runner()).unwrap();
    assert!(!back.runner().save(None).unwrap().contains("KUBE-"));
}

#[test]
fn small_clusters_get_upstreams_rules_in_the_tree_layout() {
    let mut t = tracker();
    for e in seed_events() {
        t.apply(e);
    }
    let (snap, changes) = t.checkout();
    let mut p = tree_proxier(FakeIptables::new(IpVersion::V4), tree::DEFAULT_LEAF_RULES);
    p.sync(&snap, &changes).unwrap();
    let mut up = proxier(FakeIptables::new(IpVersion::V4));
    up.sync(&snap, &changes).unwrap();
    assert_eq!(save(&p), save(&up));
    assert_contains_in_chain_order(&save(&p), &seed_expected_lines());
}

/// 1,200 Services × 4 endpoints, every third with a NodePort: a payload of about 2 MiB.
fn many_services(t: &mut Tracker) {
    for i in 0..1200u32 {
        let name = format!("svc-{i}");
        let cip = format!("10.96.{}.{}", i / 250, i % 250 + 1);
        let mut b = ServiceBuilder::new(&name, &cip).tcp("", 80);
        if i % 3 == 0 {
            b = b.node_port(30000 + i as u16);
        }
        t.apply(SourceEvent::ServiceUpsert(b.build()));
        let eps: Vec<(String, &str)> = (0..4)
            .map(|j| {
                (
                    format!("10.1.{}.{}", i / 60, (i % 60) * 4 + j + 1),
                    "k8s-master",
                )
            })
            .collect();
        let eps: Vec<(&str, &str)> = eps.iter().map(|(a, n)| (a.as_str(), *n)).collect();
        t.apply(SourceEvent::SliceUpsert(slice(&name, 8080, &eps)));
    }
}

#[test]
fn a_streamed_full_sync_writes_the_payload_of_one_buffer() {
    for dispatch in [
        tree::Dispatch::Upstream,
        tree::Dispatch::Tree { leaf_rules: 16 },
    ] {
        let fake = FakeIptables::new(IpVersion::V4);
        fake.restore(
            b"*nat\n:KUBE-SVC-AAAAAAAAAAAAAAAA - [0:0]\n:MY-CHAIN - [0:0]\n\
              -A MY-CHAIN -j RETURN\nCOMMIT\n",
        )
        .unwrap();
        let kernel = KernelTables {
            filter: kernel_table_for_sync(&fake.save(Some(Table::Filter)).unwrap(), Table::Filter)
                .unwrap(),
            nat: kernel_table_for_sync(&fake.save(Some(Table::Nat)).unwrap(), Table::Nat).unwrap(),
            ..KernelTables::default()
        };
        let mut t = tracker();
        many_services(&mut t);
        // One transaction per table, as on the legacy backend: the streamed path.
        let mut p = proxier(fake)
            .with_dispatch(dispatch)
            .with_split_full_syncs(None);
        let (snap, changes) = t.checkout();
        let report = p.sync(&snap, &changes).unwrap();
        let sent = p.runner().last_payload().unwrap();
        let cfg = p.render_config(&snap).unwrap();
        let (expected, stale) =
            reconcile::full_payload(&render::render(&snap, &cfg, None), Some(&kernel));
        assert!(sent.len() > 1 << 20, "{} bytes", sent.len());
        assert_eq!(
            String::from_utf8(sent.clone()).unwrap(),
            expected,
            "{dispatch:?}"
        );
        assert_eq!(report.payload_bytes, sent.len());
        assert_eq!((report.deleted_chains, stale.len()), (1, 1));
        // The next sync is partial and sees the chains of this one.
        t.apply(SourceEvent::SliceUpsert(slice(
            "svc-7",
            8080,
            &[("10.1.0.99", "k8s-master")],
        )));
        let (snap, changes) = t.checkout();
        let report = p.sync(&snap, &changes).unwrap();
        assert!(!report.full);
        assert_eq!(report.deleted_chains, 4, "svc-7's four old endpoint chains");
    }
}

/// A runner that records how a restore's payload arrives (the largest single write, and
/// whether it came through [`Iptables::restore_with`]) and how the tables are read (whole
/// dumps through [`Iptables::save`], as opposed to [`Iptables::save_with`]).
struct Pieces {
    inner: FakeIptables,
    largest_write: std::sync::Mutex<Option<usize>>,
    whole_saves: std::sync::atomic::AtomicUsize,
}

impl Pieces {
    fn new(inner: FakeIptables) -> Self {
        Pieces {
            inner,
            largest_write: std::sync::Mutex::new(None),
            whole_saves: std::sync::atomic::AtomicUsize::new(0),
        }
    }
}

struct Largest<'a>(&'a mut Vec<u8>, usize);

impl std::io::Write for Largest<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.1 = self.1.max(buf.len());
        self.0.extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Iptables for Pieces {
    fn ip_version(&self) -> IpVersion {
        self.inner.ip_version()
    }
    fn restore(&self, payload: &[u8]) -> Result<(), kp_netfilter::Error> {
        self.inner.restore(payload)
    }
    fn restore_with(
        &self,
        payload: &mut kp_netfilter::PayloadWriter<'_>,
    ) -> Result<(), kp_netfilter::Error> {
        let mut buf = Vec::new();
        let mut w = Largest(&mut buf, 0);
        payload(&mut w).unwrap();
        let mut largest = self.largest_write.lock().unwrap();
        *largest = Some(largest.unwrap_or(0).max(w.1));
        self.inner.restore(&buf)
    }
    fn save(&self, table: Option<Table>) -> Result<String, kp_netfilter::Error> {
        self.whole_saves
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.inner.save(table)
    }
    fn save_with(
        &self,
        table: Option<Table>,
        output: &mut kp_netfilter::OutputReader<'_>,
    ) -> Result<(), kp_netfilter::Error> {
        self.inner.save_with(table, output)
    }
    fn version(&self) -> Result<kp_netfilter::IptablesVersion, kp_netfilter::Error> {
        self.inner.version()
    }
    fn chain_exists(&self, table: Table, chain: &str) -> Result<bool, kp_netfilter::Error> {
        self.inner.chain_exists(table, chain)
    }
}

#[test]
fn a_full_sync_on_the_legacy_backend_never_writes_its_payload_whole() {
    let mut t = tracker();
    many_services(&mut t);
    let runner = Pieces::new(FakeIptables::new(IpVersion::V4).with_version(legacy()));
    let mut p =
        IptablesProxier::new(IpFamily::V4, cfg(), runner, Arc::new(FakeHost::default())).unwrap();
    let (snap, changes) = t.checkout();
    let report = p.sync(&snap, &changes).unwrap();
    let largest = p.runner().largest_write.lock().unwrap().take();
    let largest = largest.expect("the full sync went through restore_with");
    assert!(report.payload_bytes > 1 << 20);
    // The largest piece is the chain declarations, which the render holds anyway.
    assert!(
        largest < report.payload_bytes / 3,
        "largest write {largest} of {} bytes",
        report.payload_bytes
    );
    assert_eq!(nat_blocks(&p.runner().inner.last_payload().unwrap()), 2);
    assert_eq!(
        p.runner()
            .whole_saves
            .load(std::sync::atomic::Ordering::Relaxed),
        0
    );
}

/// The chains a payload declares (creating or flushing them), as `table/chain`, but for the
/// canaries.
fn declared(payload: &str) -> BTreeSet<String> {
    let mut table = "";
    let mut out = BTreeSet::new();
    for l in payload.lines() {
        if let Some(t) = l.strip_prefix('*') {
            table = t;
        } else if let Some(d) = l.strip_prefix(':') {
            let name = d.split(' ').next().unwrap();
            if name != canary::KUBE_PROXY_CANARY {
                out.insert(format!("{table}/{name}"));
            }
        }
    }
    out
}

/// A rule of `chain` in `nat`'s dump: its position (from 1) and its text after the chain.
fn rule_of(nat: &str, chain: &str, nth: usize) -> String {
    nat.lines()
        .filter_map(|l| l.strip_prefix(&format!("-A {chain} ")))
        .nth(nth)
        .unwrap()
        .to_string()
}

/// The chain the `KUBE-SERVICES` rule of `ip` jumps to.
fn service_chain(nat: &str, ip: &str) -> String {
    nat.lines()
        .find(|l| l.starts_with("-A KUBE-SERVICES") && l.contains(&format!("-d {ip}/32 ")))
        .and_then(|l| l.rsplit(' ').next())
        .unwrap()
        .to_string()
}

#[test]
fn a_full_resync_repairs_drift_anywhere_and_rewrites_only_the_drifted_chains() {
    for version in [None, Some(legacy())] {
        let mut t = tracker();
        for e in big_cluster_events(100) {
            t.apply(e);
        }
        let fake = match version {
            Some(v) => FakeIptables::new(IpVersion::V4).with_version(v),
            None => FakeIptables::new(IpVersion::V4),
        };
        let mut p = proxier(fake);
        let (snap, changes) = t.checkout();
        p.sync(&snap, &changes).unwrap();
        let clean = save(&p);
        let nat = p.runner().save(Some(Table::Nat)).unwrap();
        // Drift: a rule changed inside one Service's endpoint chain, a rule deleted from
        // another Service's chain, a rule someone else added to one of ours (a per-Service
        // chain and KUBE-SERVICES), a chain flushed, and a rule of filter changed.
        let svc1 = service_chain(&nat, "10.96.1.1");
        let sep1 = rule_of(&nat, &svc1, 3)
            .rsplit(' ')
            .next()
            .unwrap()
            .to_string();
        let svc2 = service_chain(&nat, "10.96.1.2");
        let svc3 = service_chain(&nat, "10.96.1.3");
        let sep4 = rule_of(&nat, &service_chain(&nat, "10.96.1.4"), 1)
            .rsplit(' ')
            .next()
            .unwrap()
            .to_string();
        let drift = format!(
            "*filter\n-R KUBE-FORWARD 2 -m comment --comment \"kubernetes forwarding rules\" -m mark --mark 0x4000/0x4000 -j DROP\nCOMMIT\n\
             *nat\n-R {sep1} 2 -p tcp -m tcp -j DNAT --to-destination 10.9.9.9:1\n-D {svc2} 3\n\
             -I {svc3} 1 -s 192.0.2.1/32 -j RETURN\n-A KUBE-SERVICES -d 192.0.2.2/32 -j RETURN\n\
             -F {sep4}\nCOMMIT\n"
        );
        p.runner().restore(drift.as_bytes()).unwrap();
        let drifted = p.runner().save(None).unwrap();
        assert_ne!(save(&p), clean);

        // The resync restores exactly what upstream's full sync (every chain rewritten) gives.
        let reference = FakeIptables::new(IpVersion::V4);
        reference.restore(drifted.as_bytes()).unwrap();
        let kernel = KernelTables {
            filter: kernel_table(&drifted, Table::Filter).unwrap(),
            nat: kernel_table(&drifted, Table::Nat).unwrap(),
            ..KernelTables::default()
        };
        let cfg = p.render_config(&snap).unwrap();
        let upstream = reconcile::full_payload(&render::render(&snap, &cfg, None), Some(&kernel)).0;
        reference.restore(upstream.as_bytes()).unwrap();
        let full = Changes {
            full_resync_needed: true,
            ..Changes::default()
        };
        let report = p.sync(&snap, &full).unwrap();
        assert!(report.full);
        assert_eq!(save(&p), clean, "{version:?}");
        assert_eq!(
            p.runner().save(None).unwrap(),
            reference.save(None).unwrap()
        );
        // Only the chains that differ were named: flushed and written again.
        let sent = String::from_utf8(p.runner().last_payload().unwrap()).unwrap();
        let expected: BTreeSet<String> = [
            "filter/KUBE-FORWARD".to_string(),
            format!("nat/{sep1}"),
            format!("nat/{svc2}"),
            format!("nat/{svc3}"),
            "nat/KUBE-SERVICES".to_string(),
            format!("nat/{sep4}"),
        ]
        .into();
        assert_eq!(declared(&sent), expected, "{version:?}:\n{sent}");
        // And a resync now writes nothing.
        let restores = p.runner().restore_count();
        assert_eq!(p.sync(&snap, &full).unwrap().payload_bytes, 0);
        assert_eq!(p.runner().restore_count(), restores);
    }
}

#[test]
fn a_resync_of_the_tree_layout_rewrites_nothing_that_is_unchanged() {
    let mut t = tracker();
    for e in big_cluster_events(200) {
        t.apply(e);
    }
    let mut p = tree_proxier(FakeIptables::new(IpVersion::V4), 4);
    sync(&mut p, &mut t);
    let before = save(&p);
    let full = Changes {
        full_resync_needed: true,
        ..Changes::default()
    };
    let (snap, _) = t.checkout();
    let restores = p.runner().restore_count();
    assert_eq!(p.sync(&snap, &full).unwrap().payload_bytes, 0);
    assert_eq!(p.runner().restore_count(), restores);
    // One Service gone: its chains are stale, its leaf and KUBE-SERVICES' path rewritten.
    t.apply(SourceEvent::ServiceDelete(NamespacedName::new(
        "default", "big-7",
    )));
    let (snap, _) = t.checkout();
    p.sync(&snap, &full).unwrap();
    let sent = String::from_utf8(p.runner().last_payload().unwrap()).unwrap();
    let written = declared(&sent);
    assert!(
        written.iter().any(|c| c.starts_with("nat/KUBE-SVT-")),
        "{written:?}"
    );
    assert!(
        written
            .iter()
            .all(|c| !c.starts_with("nat/KUBE-SEP-") || sent.contains(&format!("-X {}", &c[4..]))),
        "{sent}"
    );
    assert!(written.len() < 30, "{written:?}");
    assert_ne!(save(&p), before);
    let mut fresh = tree_proxier(FakeIptables::new(IpVersion::V4), 4);
    fresh.sync(&snap, &Changes::default()).unwrap();
    assert_eq!(save(&p), save(&fresh));
}

#[test]
fn a_full_sync_on_the_nft_backend_never_writes_its_payload_whole_nor_reads_the_tables_whole() {
    let mut t = tracker();
    many_services(&mut t);
    let runner = Pieces::new(FakeIptables::new(IpVersion::V4));
    let mut p =
        IptablesProxier::new(IpFamily::V4, cfg(), runner, Arc::new(FakeHost::default())).unwrap();
    let (snap, changes) = t.checkout();
    // A cold sync, then a full resync that rewrites every Service's endpoints.
    let cold = p.sync(&snap, &changes).unwrap();
    let cold_payload = p.runner().inner.last_payload().unwrap();
    for i in 0..1200u32 {
        let eps: Vec<(String, &str)> = (0..4)
            .map(|j| {
                (
                    format!("10.2.{}.{}", i / 60, (i % 60) * 4 + j + 1),
                    "k8s-master",
                )
            })
            .collect();
        let eps: Vec<(&str, &str)> = eps.iter().map(|(a, n)| (a.as_str(), *n)).collect();
        t.apply(SourceEvent::SliceUpsert(slice(
            &format!("svc-{i}"),
            8080,
            &eps,
        )));
    }
    let (snap, mut changes) = t.checkout();
    changes.full_resync_needed = true;
    let resync = p.sync(&snap, &changes).unwrap();
    let resync_payload = p.runner().inner.last_payload().unwrap();
    for (report, payload) in [(&cold, cold_payload), (&resync, resync_payload)] {
        assert!(report.full);
        assert!(
            nat_blocks(&payload) >= 10,
            "split: {}",
            nat_blocks(&payload)
        );
        assert_eq!(report.payload_bytes, payload.len());
        assert!(report.payload_bytes > 1 << 20);
    }
    let largest = p.runner().largest_write.lock().unwrap().take();
    let largest = largest.expect("the full syncs went through restore_with");
    // The largest piece is a block of the split or the entry chains' rules.
    assert!(
        largest < resync.payload_bytes / 8,
        "largest write {largest} of {} bytes",
        resync.payload_bytes
    );
    // The tables were read through save_with, never as one dump.
    assert_eq!(
        p.runner()
            .whole_saves
            .load(std::sync::atomic::Ordering::Relaxed),
        0
    );
}
