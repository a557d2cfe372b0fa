//! Kernel test of the full resync (restart, hourly, retry) on both iptables backends, in a
//! network namespace: the real `iptables-save` prints back every chain of ours so that a full
//! resync over an unchanged table names none of them (both families; comments on and off;
//! NodePorts, Local policies, affinity, load-balancer source ranges, external IPs, UDP, and
//! the nfacct matches where the kernel has nfacct), nor runs the tool; drift anywhere (a rule changed inside a
//! per-Service chain, a rule deleted, a foreign rule added to a `KUBE-` chain, a chain
//! flushed, a filter rule changed) is repaired to exactly the rendered ruleset, writing only
//! the drifted chains; and the packet counters of the chains it leaves alone (counted by UDP
//! datagrams sent to a Service from inside the namespace) stay. Needs root.

mod common;

use std::collections::BTreeSet;
use std::sync::Arc;

use kp_model::{Changes, IpFamily, Snapshot, SourceEvent};
use kp_netfilter::{Backend, ExecIptables, Iptables, RecordingExec, SystemExec, Table};
use kp_proxier::Proxier;
use kp_proxier::iptables::IptablesProxier;
use kp_testkit::Netns;
use kp_testkit::builders::{ServiceBuilder, SliceBuilder, synced_tracker};

use common::{recorded_proxier, tables};

/// A proxier of `family` on `backend` inside `ns`, with nfacct where the kernel has it.
fn proxier(
    ns: &Netns,
    backend: Backend,
    family: IpFamily,
) -> (
    IptablesProxier<ExecIptables>,
    Arc<RecordingExec<SystemExec>>,
) {
    let (mut p, rec) = recorded_proxier(ns, backend, family, &["10.0.0.0/16", "fd00:10::/64"]);
    if let Ok(Ok(nfacct)) = ns.in_ns(kp_netlink::Nfacct::new) {
        p = p.with_nfacct(Box::new(nfacct));
    }
    (p, rec)
}

/// Service `svc-i` of `family` with `eps` endpoints, its features varying with `i`.
fn events(family: IpFamily, i: usize, eps: usize) -> Vec<SourceEvent> {
    let v6 = family == IpFamily::V6;
    let name = format!("svc-{i}");
    let addr = |prefix: &str, a: usize, b: usize| {
        if v6 {
            format!("{prefix}{a:x}:{b:x}")
        } else {
            format!("{}.{}.{}", prefix, a % 250, b % 250)
        }
    };
    let (cip, ext, lb, range, ep_net) = if v6 {
        (
            addr("fd00:96::", i / 200 + 1, i % 200 + 1),
            addr("2001:db8:1::", 1, i + 1),
            addr("2001:db8:2::", 1, i + 1),
            "2001:db8:ff::/48",
            "fd00:10::",
        )
    } else {
        (
            addr("10.96", i / 200 + 1, i % 200 + 1),
            addr("192.0", 2, i + 1),
            addr("198.51", 100, i + 1),
            "203.0.113.0/24",
            "10.0",
        )
    };
    let mut b = ServiceBuilder::new(&name, &cip);
    b = if i % 9 == 4 {
        b.udp("dns", 53)
    } else {
        b.tcp("http", 80)
    };
    if i.is_multiple_of(3) {
        b = b.node_port(30000 + i as u16);
    }
    if i.is_multiple_of(5) {
        b = b.external_local(Some(31000 + i as u16));
    }
    if i.is_multiple_of(7) {
        b = b.load_balancer(&[&lb]).source_ranges(&[range]);
    }
    if i.is_multiple_of(11) {
        b = b.external_ips(&[&ext]);
    }
    if i % 4 == 1 {
        b = b.affinity(10800);
    }
    if i % 13 == 2 {
        b = b.internal_local();
    }
    let port = if i % 9 == 4 { "dns" } else { "http" };
    let mut s = SliceBuilder::new(&name).named(&format!("{name}-x"));
    if v6 {
        s = s.ipv6();
    }
    s = if i % 9 == 4 {
        s.port_proto(port, kp_model::Protocol::Udp, 5353)
    } else {
        s.port(port, 8080)
    };
    for e in 0..eps {
        let node = if e % 3 == 0 { "node-a" } else { "node-b" };
        s = s.ready(&addr(ep_net, i, e + 1), node);
    }
    vec![
        SourceEvent::ServiceUpsert(b.build()),
        SourceEvent::SliceUpsert(s.build()),
    ]
}

/// A sync, retried twice: the xtables lock of the legacy backend is shared with every other
/// legacy run on the machine, and a sync that loses it for the 5 s of `--wait` fails (the
/// daemon retries a failed sync in full as well).
fn sync(p: &mut IptablesProxier<ExecIptables>, snap: &Snapshot, full: bool) {
    let changes = Changes {
        full_resync_needed: full,
        ..Changes::default()
    };
    for attempt in 0.. {
        match p.sync(snap, &changes) {
            Ok(r) => {
                assert!(r.full || !full);
                return;
            }
            Err(e) if attempt < 2 => eprintln!("sync failed, retrying: {e}"),
            Err(e) => panic!("sync failed three times: {e}"),
        }
    }
}

/// Our chains a payload declares (creating or flushing them), as `table/chain`, but for the
/// canaries.
fn declared(payload: &str) -> BTreeSet<String> {
    let mut table = "";
    let mut out = BTreeSet::new();
    for l in payload.lines() {
        if let Some(t) = l.strip_prefix('*') {
            table = t;
        } else if let Some(d) = l.strip_prefix(':') {
            let name = d.split(' ').next().unwrap();
            if name != "KUBE-PROXY-CANARY" {
                out.insert(format!("{table}/{name}"));
            }
        }
    }
    out
}

/// The rules of `chain` in a dump, without the `-A CHAIN ` prefix.
fn rules_of<'a>(dump: &'a str, chain: &str) -> Vec<&'a str> {
    let prefix = format!("-A {chain} ");
    dump.lines()
        .filter_map(|l| l.strip_prefix(prefix.as_str()))
        .collect()
}

/// The chain the `KUBE-SERVICES` rule of a cluster IP jumps to.
fn service_chain(nat: &str, cip: &str) -> String {
    nat.lines()
        .find(|l| l.starts_with("-A KUBE-SERVICES ") && l.contains(&format!("-d {cip}/")))
        .and_then(|l| l.rsplit(' ').next())
        .unwrap_or_else(|| panic!("no KUBE-SERVICES rule for {cip}"))
        .to_string()
}

fn run(backend: Backend, family: IpFamily) {
    let what = format!("{backend:?} {family}");
    let ns = Netns::new("resync").unwrap();
    let (mut p, rec) = proxier(&ns, backend, family);
    let mut t = synced_tracker(family, "node-a");
    // 60 Services × 4 endpoints: per-endpoint comments on.
    for i in 0..60 {
        for e in events(family, i, 4) {
            t.apply(e);
        }
    }
    let (snap, _) = t.checkout();
    sync(&mut p, &snap, true);
    let loaded = tables(&p);
    assert!(
        loaded.contains("-m recent --rcheck"),
        "{what}: affinity rules"
    );
    if p.nfacct_counters().ct_state_invalid_dropped {
        // xt_nfacct prints two spaces before the counter's name.
        assert!(loaded.contains("--nfacct-name  ct_state"), "{what}");
    } else {
        eprintln!("{what}: this kernel has no nfacct; its spelling is not checked");
    }
    // A resync over the unchanged table writes nothing (the tool is not run): the kernel
    // printed every chain back as it was rendered, and the canaries are there.
    let restores = rec.restore_count();
    sync(&mut p, &snap, true);
    assert_eq!(
        rec.restore_count(),
        restores,
        "{what}: {:?}",
        rec.last_restore()
    );
    assert_eq!(tables(&p), loaded, "{what}");

    // 120 Services × 10 endpoints: above 1,000 endpoints, comments are left out, so every
    // per-Service chain is rewritten once, and then none again.
    for i in 0..120 {
        for e in events(family, i, 10) {
            t.apply(e);
        }
    }
    let (snap, _) = t.checkout();
    sync(&mut p, &snap, true);
    let sent = rec.last_restore().unwrap();
    assert!(
        declared(&sent).len() > 120 * 11,
        "{what}: {}",
        declared(&sent).len()
    );
    let loaded = tables(&p);
    assert!(!loaded.contains("-> "), "{what}: no per-endpoint comments");
    let restores = rec.restore_count();
    sync(&mut p, &snap, true);
    assert_eq!(
        rec.restore_count(),
        restores,
        "{what}: {:?}",
        rec.last_restore()
    );

    // Drift, and counters on a chain left alone.
    let nat = p.runner().save(Some(Table::Nat)).unwrap();
    let cip = |i: usize| match family {
        IpFamily::V4 => format!("10.96.1.{}", i + 1),
        IpFamily::V6 => format!("fd00:96::1:{:x}", i + 1),
    };
    let svc1 = service_chain(&nat, &cip(1));
    let sep1 = rules_of(&nat, &svc1)
        .iter()
        .filter_map(|r| r.rsplit(' ').next())
        .find(|c| c.starts_with("KUBE-SEP-"))
        .unwrap()
        .to_string();
    let svc2 = service_chain(&nat, &cip(2));
    let svc3 = service_chain(&nat, &cip(3));
    let sep6 = rules_of(&nat, &service_chain(&nat, &cip(6)))
        .iter()
        .filter_map(|r| r.rsplit(' ').next())
        .find(|c| c.starts_with("KUBE-SEP-"))
        .unwrap()
        .to_string();
    // svc-13 (UDP): its chains stay as they are; traffic through them counts.
    let kept = service_chain(&nat, &cip(13));
    send_udp(&ns, &cip(13), 53, 20);
    let (dnat_to, foreign) = match family {
        IpFamily::V4 => ("10.9.9.9:1", "192.0.2.250/32"),
        IpFamily::V6 => ("[fd00:9::9]:1", "2001:db8:9::1/128"),
    };
    let sep1_dnat = rules_of(&nat, &sep1)
        .into_iter()
        .position(|r| r.contains("DNAT"))
        .unwrap()
        + 1;
    let proto = if rules_of(&nat, &sep1).iter().any(|r| r.contains("-p udp")) {
        "udp"
    } else {
        "tcp"
    };
    let counted_before = counters(&ns, backend, family, &kept);
    assert_eq!(
        counted_before.first().map(|c| c.0),
        Some(20),
        "{what}: {counted_before:?}"
    );
    let drift = format!(
        "*filter\n-R KUBE-FORWARD 2 -m comment --comment \"kubernetes forwarding rules\" -m mark --mark 0x4000/0x4000 -j DROP\nCOMMIT\n\
         *nat\n-R {sep1} {sep1_dnat} -p {proto} -m {proto} -j DNAT --to-destination {dnat_to}\n\
         -D {svc2} 2\n-I {svc3} 1 -s {foreign} -j RETURN\n-A KUBE-SERVICES -d {foreign} -j RETURN\n\
         -F {sep6}\nCOMMIT\n"
    );
    p.runner()
        .restore(drift.as_bytes())
        .unwrap_or_else(|e| panic!("{what}: drift: {e}\n{drift}"));
    assert_ne!(tables(&p), loaded, "{what}");
    sync(&mut p, &snap, true);
    // Exactly the rendered ruleset again, with only the drifted chains written.
    assert_eq!(tables(&p), loaded, "{what}");
    let sent = rec.last_restore().unwrap();
    let expected: BTreeSet<String> = [
        "filter/KUBE-FORWARD".to_string(),
        format!("nat/{sep1}"),
        format!("nat/{svc2}"),
        format!("nat/{svc3}"),
        "nat/KUBE-SERVICES".to_string(),
        format!("nat/{sep6}"),
    ]
    .into();
    assert_eq!(declared(&sent), expected, "{what}:\n{sent}");
    // The chain left alone kept its counters.
    assert_eq!(
        counters(&ns, backend, family, &kept),
        counted_before,
        "{what}"
    );
}

/// Sends `n` UDP datagrams to `ip:port` from inside `ns`, each from its own socket (a new
/// connection for conntrack, so each goes through the nat rules). The routes make the
/// Service's address reachable through `lo`; after the DNAT the endpoint is not, which does
/// not matter: the nat rules have counted the packet by then.
fn send_udp(ns: &Netns, ip: &str, port: u16, n: usize) {
    let v6 = ip.contains(':');
    ns.ip(["link", "set", "lo", "up"]).unwrap();
    let route = if v6 {
        ["-6", "route", "replace", "fd00:96::/64", "dev", "lo"]
    } else {
        ["-4", "route", "replace", "10.96.0.0/16", "dev", "lo"]
    };
    ns.ip(route).unwrap();
    let dst: std::net::SocketAddr = if v6 {
        format!("[{ip}]:{port}")
    } else {
        format!("{ip}:{port}")
    }
    .parse()
    .unwrap();
    ns.in_ns(|| {
        for _ in 0..n {
            let s = std::net::UdpSocket::bind(if v6 { "[::]:0" } else { "0.0.0.0:0" }).unwrap();
            let _ = s.send_to(b"x", dst);
        }
    })
    .unwrap();
}

/// The packet and byte counters of `chain`'s rules in the nat table (`iptables-save -c`).
fn counters(ns: &Netns, backend: Backend, family: IpFamily, chain: &str) -> Vec<(u64, u64)> {
    let save = match (backend, family) {
        (Backend::Legacy, IpFamily::V4) => "iptables-legacy-save",
        (Backend::Legacy, IpFamily::V6) => "ip6tables-legacy-save",
        (_, IpFamily::V4) => "iptables-nft-save",
        (_, IpFamily::V6) => "ip6tables-nft-save",
    };
    let dump = ns.run(save, ["-c", "-t", "nat"]).unwrap();
    let rule = format!(" -A {chain} ");
    dump.lines()
        .filter(|l| l.contains(&rule))
        .filter_map(|l| {
            let (p, b) = l.strip_prefix('[')?.split(']').next()?.split_once(':')?;
            Some((p.parse().ok()?, b.parse().ok()?))
        })
        .collect()
}

fn require() -> bool {
    kp_testkit::require_root()
}

#[test]
fn full_resync_on_the_nft_backend_writes_only_what_differs() {
    if !require() {
        return;
    }
    run(Backend::Nft, IpFamily::V4);
    run(Backend::Nft, IpFamily::V6);
}

#[test]
fn full_resync_on_the_legacy_backend_writes_only_what_differs() {
    if !require() {
        return;
    }
    run(Backend::Legacy, IpFamily::V4);
    run(Backend::Legacy, IpFamily::V6);
}
