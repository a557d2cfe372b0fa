//! Conntrack over netlink against the real kernel, inside network namespaces (root; CI
//! runs them).
//!
//! Every test builds its own namespaces with `kp_testkit` and opens [`Conntrack`] on a
//! thread inside the node namespace (`Netns::in_ns`), so the socket talks to that
//! namespace's table. iptables rules and `conntrack` CLI calls run through
//! `ip netns exec`. The root namespace's table is only read (`conntrack -L` with a
//! filter), to check that none of the test's entries ever appear there.

use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use kp_netlink::{Conntrack, ConntrackOps, Error, Family, Flow, Tuple, proto};
use kp_testkit::{Netns, Topology, UdpClient, UdpEchoBackend, require_root};

const ASK_TIMEOUT: Duration = Duration::from_millis(1500);
const FAIL_TIMEOUT: Duration = Duration::from_millis(600);

fn addr(s: &str) -> SocketAddr {
    s.parse().expect("socket address")
}

fn ip(s: &str) -> IpAddr {
    s.parse().expect("IP address")
}

/// A conntrack handle for `ns`'s table (the socket is created inside `ns`).
fn conntrack_in(ns: &Netns) -> Conntrack {
    ns.in_ns(Conntrack::new)
        .expect("enter namespace")
        .expect("open ctnetlink socket")
}

fn iptables(ns: &Netns, family: Family, args: &[&str]) {
    let binary = match family {
        Family::V4 => "iptables",
        Family::V6 => "ip6tables",
    };
    ns.run(binary, args)
        .unwrap_or_else(|e| panic!("{binary} {args:?} in {}: {e}", ns.name()));
}

/// The reply's text (the backend's name), or `None` if no answer came.
fn ask(client: &UdpClient, target: SocketAddr, timeout: Duration) -> Option<String> {
    client.request(target, b"q", timeout).ok().map(|r| r.text())
}

fn family_ip(ips: &[IpAddr], family: Family) -> IpAddr {
    *ips.iter()
        .find(|a| family.contains(a))
        .expect("an address of the family")
}

/// Flows of `family` whose original destination is `service` and source port `sport`.
fn flows_to(ct: &mut Conntrack, family: Family, service: SocketAddr, sport: u16) -> Vec<Flow> {
    ct.dump(family, Some(proto::UDP))
        .expect("dump")
        .into_iter()
        .filter(|f| f.original_dst() == service && f.original.src_port == sport)
        .collect()
}

/// Read-only check of the root namespace: how many entries `conntrack -L` shows there
/// whose original destination is one of the test's service IPs. Run in the test process
/// (the root namespace) and never modifies anything.
fn root_entries_to(services: &[IpAddr]) -> usize {
    services
        .iter()
        .map(|s| {
            let out = std::process::Command::new("conntrack")
                .args(["-L", "-d", &s.to_string()])
                .output()
                .expect("run conntrack -L in the root namespace");
            assert!(out.status.success(), "conntrack -L -d {s}: {out:?}");
            String::from_utf8_lossy(&out.stdout).lines().count()
        })
        .sum()
}

/// The endpoint-change case for one family: a client with a fixed source port keeps
/// reaching the old backend through the stale entry after the DNAT rule moved, until
/// `delete_matching` removes it.
fn stale_entry_after_endpoint_change(family: Family) {
    let builder = Topology::builder().backends(2);
    let builder = match family {
        Family::V4 => builder,
        Family::V6 => builder.ipv6_only(),
    };
    let topology = builder.build().expect("topology");
    let (service, sport, bind) = match family {
        Family::V4 => (addr("10.96.0.53:53"), 40053, addr("0.0.0.0:40053")),
        Family::V6 => (addr("[fd00:10:96::35]:53"), 40063, addr("[::]:40063")),
    };
    let roots_before = root_entries_to(&[service.ip()]);
    let a = family_ip(topology.backend(0).ips(), family);
    let b = family_ip(topology.backend(1).ips(), family);
    let _be_a = UdpEchoBackend::start(topology.backend(0).ns(), SocketAddr::new(a, 53), "A")
        .expect("backend A");
    let _be_b = UdpEchoBackend::start(topology.backend(1).ns(), SocketAddr::new(b, 53), "B")
        .expect("backend B");
    let node = topology.node();
    let dnat_to = |ip: IpAddr| SocketAddr::new(ip, 53).to_string();
    let rule = |to: &str| -> Vec<String> {
        [
            "-d",
            &service.ip().to_string(),
            "-p",
            "udp",
            "--dport",
            "53",
            "-j",
            "DNAT",
            "--to-destination",
            to,
        ]
        .map(str::to_owned)
        .to_vec()
    };
    let with = |head: &[&str], tail: &[String]| -> Vec<String> {
        head.iter()
            .map(|s| s.to_string())
            .chain(tail.iter().cloned())
            .collect()
    };
    let run = |args: Vec<String>| {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        iptables(node, family, &args);
    };
    run(with(&["-t", "nat", "-A", "PREROUTING"], &rule(&dnat_to(a))));

    let client = UdpClient::bind(topology.client(), bind).expect("client");
    for _ in 0..3 {
        assert_eq!(ask(&client, service, ASK_TIMEOUT).as_deref(), Some("A"));
    }

    let mut ct = conntrack_in(node);
    let flows = flows_to(&mut ct, family, service, sport);
    assert_eq!(flows.len(), 1, "{flows:#?}");
    let flow = &flows[0];
    assert_eq!(flow.family, family);
    assert_eq!(flow.reply.src, a, "reply source is backend A: {flow}");
    assert!(flow.is_dnat());
    assert!(
        flow.status
            .contains(kp_netlink::Status::DST_NAT | kp_netlink::Status::SEEN_REPLY)
    );
    assert!(flow.id.is_some() && flow.timeout.is_some());

    // The endpoint moves to B: new flows would go there, the client's does not.
    run(with(
        &["-t", "nat", "-R", "PREROUTING", "1"],
        &rule(&dnat_to(b)),
    ));
    for _ in 0..2 {
        assert_eq!(
            ask(&client, service, ASK_TIMEOUT).as_deref(),
            Some("A"),
            "the stale entry still leads to A"
        );
    }

    let deleted = ct
        .delete_matching(family, |f| {
            f.original.proto == proto::UDP && f.original_dst() == service && f.reply.src != b
        })
        .expect("delete_matching");
    assert_eq!(deleted, 1);
    assert!(flows_to(&mut ct, family, service, sport).is_empty());

    // The same socket (same source port) now reaches B.
    assert_eq!(client.local_addr().port(), sport);
    assert_eq!(ask(&client, service, ASK_TIMEOUT).as_deref(), Some("B"));
    let flows = flows_to(&mut ct, family, service, sport);
    assert_eq!(flows.len(), 1);
    assert_eq!(flows[0].reply.src, b);
    assert_eq!(_be_b.peers().last().map(|p| p.port()), Some(sport));

    assert_eq!(root_entries_to(&[service.ip()]), roots_before);
}

#[test]
fn stale_entry_after_endpoint_change_ipv4() {
    if !require_root() {
        return;
    }
    stale_entry_after_endpoint_change(Family::V4);
}

#[test]
fn stale_entry_after_endpoint_change_ipv6() {
    if !require_root() {
        return;
    }
    stale_entry_after_endpoint_change(Family::V6);
}

/// The "first endpoint" case. While the Service has no endpoints:
///
/// * with a REJECT in the node's FORWARD chain the client is refused and *no* entry is
///   left (a rejected packet's entry is never confirmed);
/// * without it (a window before the proxy's rules, or a route that simply forwards), the
///   datagram is routed on un-NATed and black-holed, and its entry is confirmed with
///   reply source == original destination.
///
/// When a DNAT to A appears, that un-NATed entry keeps black-holing the client's datagrams
/// until it is deleted.
#[test]
fn entry_created_without_endpoints_blackholes_until_deleted() {
    if !require_root() {
        return;
    }
    let topology = Topology::builder().backends(1).build().expect("topology");
    let service = addr("10.96.0.54:53");
    let roots_before = root_entries_to(&[service.ip()]);
    let a = family_ip(topology.backend(0).ips(), Family::V4);
    let backend =
        UdpEchoBackend::start(topology.backend(0).ns(), SocketAddr::new(a, 53), "A").unwrap();
    let node = topology.node();
    // Conntrack is active in the node, as with a proxy's rules (kube-proxy drops INVALID
    // packets in KUBE-FORWARD). An empty nat chain alone does not enable it: with
    // iptables-nft only rules that use conntrack (DNAT, MASQUERADE, `-m conntrack`) do.
    iptables(
        node,
        Family::V4,
        &[
            "-A",
            "FORWARD",
            "-m",
            "conntrack",
            "--ctstate",
            "INVALID",
            "-j",
            "DROP",
        ],
    );
    iptables(node, Family::V4, &["-t", "nat", "-N", "KUBE-SERVICES"]);
    iptables(
        node,
        Family::V4,
        &["-t", "nat", "-A", "PREROUTING", "-j", "KUBE-SERVICES"],
    );
    let reject = [
        "FORWARD",
        "-d",
        "10.96.0.54/32",
        "-p",
        "udp",
        "--dport",
        "53",
        "-j",
        "REJECT",
    ];
    let mut args = vec!["-A"];
    args.extend(reject);
    iptables(node, Family::V4, &args);

    let client = UdpClient::bind(topology.client(), addr("0.0.0.0:40054")).unwrap();
    let refused = client.request(service, b"q", ASK_TIMEOUT);
    assert!(
        matches!(refused, Err(kp_testkit::ClientError::Refused)),
        "{refused:?}"
    );
    let mut ct = conntrack_in(node);
    assert!(
        flows_to(&mut ct, Family::V4, service, 40054).is_empty(),
        "a REJECTed datagram leaves no entry"
    );

    // No REJECT: the datagram is routed out eth0 to a neighbour that never answers.
    let mut args = vec!["-D"];
    args.extend(reject);
    iptables(node, Family::V4, &args);
    node.ip([
        "neigh",
        "replace",
        "10.96.0.54",
        "lladdr",
        "02:00:0a:60:00:36",
        "dev",
        "eth0",
        "nud",
        "permanent",
    ])
    .unwrap();
    assert_eq!(ask(&client, service, FAIL_TIMEOUT), None);
    let flows = flows_to(&mut ct, Family::V4, service, 40054);
    assert_eq!(flows.len(), 1, "{flows:#?}");
    assert!(!flows[0].is_dnat(), "not DNATed: {}", flows[0]);
    assert_eq!(flows[0].reply.src, service.ip());

    // The Service gets endpoint A; the client's entry still bypasses the DNAT.
    iptables(
        node,
        Family::V4,
        &[
            "-t",
            "nat",
            "-A",
            "KUBE-SERVICES",
            "-d",
            "10.96.0.54/32",
            "-p",
            "udp",
            "--dport",
            "53",
            "-j",
            "DNAT",
            "--to-destination",
            "10.244.1.10:53",
        ],
    );
    assert_eq!(a, ip("10.244.1.10"));
    for _ in 0..2 {
        assert_eq!(
            ask(&client, service, FAIL_TIMEOUT),
            None,
            "still black-holed"
        );
    }
    assert_eq!(backend.requests(), 0);

    let endpoints = [a];
    let deleted = ct
        .delete_matching(Family::V4, |f| {
            f.original.proto == proto::UDP
                && f.original_dst() == service
                && !endpoints.contains(&f.reply.src)
        })
        .unwrap();
    assert_eq!(deleted, 1);
    assert_eq!(ask(&client, service, ASK_TIMEOUT).as_deref(), Some("A"));
    assert_eq!(backend.requests(), 1);
    let flows = flows_to(&mut ct, Family::V4, service, 40054);
    assert_eq!(flows.len(), 1);
    assert!(flows[0].is_dnat() && flows[0].reply.src == a);

    assert_eq!(root_entries_to(&[service.ip()]), roots_before);
}

/// One entry as `conntrack -L` prints it: protocol, original and reply tuples, zone.
fn parse_cli_line(line: &str) -> Option<(Tuple, Tuple, u16)> {
    let mut words = line.split_whitespace();
    let _name = words.next()?;
    let number: u8 = words.next()?.parse().ok()?;
    let mut values: Vec<(&str, &str)> = Vec::new();
    let mut zone = 0;
    for word in words {
        if let Some((k, v)) = word.split_once('=') {
            match k {
                "src" | "dst" | "sport" | "dport" => values.push((k, v)),
                "zone" => zone = v.parse().ok()?,
                _ => {}
            }
        }
    }
    let tuple = |i: usize| -> Option<Tuple> {
        let get = |key: &str| {
            values
                .iter()
                .filter(|(k, _)| *k == key)
                .nth(i)
                .map(|(_, v)| *v)
        };
        Some(Tuple {
            src: get("src")?.parse().ok()?,
            dst: get("dst")?.parse().ok()?,
            proto: number,
            src_port: get("sport").map_or(Some(0), |p| p.parse().ok())?,
            dst_port: get("dport").map_or(Some(0), |p| p.parse().ok())?,
        })
    };
    Some((tuple(0)?, tuple(1)?, zone))
}

fn cli_entries(ns: &Netns, args: &[&str]) -> BTreeSet<String> {
    let mut full = vec!["-L"];
    full.extend(args);
    let out = ns.run("conntrack", &full).expect("conntrack -L");
    out.lines()
        .map(|l| {
            let (o, r, zone) =
                parse_cli_line(l).unwrap_or_else(|| panic!("unparsable conntrack line {l:?}"));
            key(&o, &r, zone)
        })
        .collect()
}

fn key(original: &Tuple, reply: &Tuple, zone: u16) -> String {
    format!("{} {original} | {reply} zone={zone}", original.proto)
}

fn dump_entries(ct: &mut Conntrack, family: Family, proto: Option<u8>) -> BTreeSet<String> {
    ct.dump(family, proto)
        .expect("dump")
        .iter()
        .map(|f| key(&f.original, &f.reply, f.zone))
        .collect()
}

/// `dump` and `conntrack -L` list the same entries in the node namespace: real DNATed
/// UDP flows, 600 bulk-loaded UDP entries (a dump of many datagrams), a TCP entry, a
/// zoned entry, an ICMP entry and IPv6 entries.
#[test]
fn dump_agrees_with_conntrack_cli() {
    if !require_root() {
        return;
    }
    let topology = Topology::builder().backends(1).build().expect("topology");
    let node = topology.node();
    let a = family_ip(topology.backend(0).ips(), Family::V4);
    let _backend = UdpEchoBackend::start(topology.backend(0).ns(), SocketAddr::new(a, 53), "A");
    iptables(
        node,
        Family::V4,
        &[
            "-t",
            "nat",
            "-A",
            "PREROUTING",
            "-d",
            "10.96.0.53/32",
            "-p",
            "udp",
            "--dport",
            "53",
            "-j",
            "DNAT",
            "--to-destination",
            "10.244.1.10:53",
        ],
    );
    for port in [41000, 41001, 41002] {
        let client =
            UdpClient::bind(topology.client(), SocketAddr::new(ip("0.0.0.0"), port)).unwrap();
        assert_eq!(
            ask(&client, addr("10.96.0.53:53"), ASK_TIMEOUT).as_deref(),
            Some("A")
        );
    }

    let mut load = String::new();
    for i in 0..600u32 {
        load.push_str(&format!(
            "-I -p udp -s 192.168.56.{} -d 10.96.{}.{} --sport {} --dport 53 --timeout 600\n",
            100 + i % 50,
            1 + i / 250,
            i % 250 + 1,
            20000 + i
        ));
    }
    load.push_str(
        "-I -p tcp -s 192.168.56.100 -d 10.96.0.80 --sport 41000 --dport 80 --state \
         ESTABLISHED --timeout 600 -u ASSURED,SEEN_REPLY\n\
         -I -p udp -s 192.168.56.101 -d 10.96.0.53 --sport 40003 --dport 53 --timeout 600 \
         --zone 7\n\
         -I -p icmp -s 192.168.56.100 -d 10.96.0.9 --icmp-type 8 --icmp-code 0 --icmp-id 77 \
         --timeout 600\n\
         -I -p udp -s fd00:56::100 -d fd00:10:96::35 --sport 40001 --dport 53 --timeout 600 \
         -r fd00:10:244::1:10 -q fd00:56::100 --reply-port-src 53 --reply-port-dst 40001\n\
         -I -p tcp -s fd00:56::100 -d fd00:10:96::50 --sport 40002 --dport 80 --state \
         SYN_SENT --timeout 600\n",
    );
    let file = std::env::temp_dir().join(format!("kp-netlink-load-{}.txt", std::process::id()));
    std::fs::write(&file, load).unwrap();
    let loaded = node.run("conntrack", ["-R", file.to_str().unwrap()]);
    let _ = std::fs::remove_file(&file);
    loaded.expect("conntrack -R");

    let mut ct = conntrack_in(node);
    let udp4 = dump_entries(&mut ct, Family::V4, Some(proto::UDP));
    assert_eq!(udp4, cli_entries(node, &["-f", "ipv4", "-p", "udp"]));
    assert_eq!(udp4.len(), 3 + 600 + 1, "3 real flows, 600 loaded, 1 zoned");
    let all4 = dump_entries(&mut ct, Family::V4, None);
    assert_eq!(all4, cli_entries(node, &["-f", "ipv4"]));
    assert_eq!(all4.len(), udp4.len() + 2, "plus TCP and ICMP");
    let all6 = dump_entries(&mut ct, Family::V6, None);
    assert_eq!(all6, cli_entries(node, &["-f", "ipv6"]));
    assert_eq!(all6.len(), 2);

    let flows = ct.dump(Family::V4, None).unwrap();
    let icmp = flows
        .iter()
        .find(|f| f.original.proto == proto::ICMP)
        .expect("ICMP entry");
    assert!(matches!(ct.delete(icmp), Err(Error::Unsupported { .. })));
    let real: Vec<_> = flows
        .iter()
        .filter(|f| f.original_dst() == addr("10.96.0.53:53") && f.is_dnat())
        .collect();
    assert_eq!(real.len(), 3, "{real:#?}");
    assert!(real.iter().all(|f| f.reply.src == a));
}

/// Delete semantics against the kernel, in a bare namespace with entries made by
/// `conntrack -I`: ENOENT is `Ok(false)`, a stale id deletes nothing, zones and IPv6
/// work, and the CLI sees the result.
#[test]
fn delete_semantics_match_the_kernel() {
    if !require_root() {
        return;
    }
    let ns = Netns::new("ct").expect("namespace");
    let roots_before = root_entries_to(&[ip("10.96.0.53"), ip("fd00:10:96::35")]);
    let mut ct = conntrack_in(&ns);
    assert!(ct.dump(Family::V4, None).unwrap().is_empty());
    assert!(ct.dump(Family::V6, None).unwrap().is_empty());

    let insert = |args: &str| {
        let mut full = vec!["-I"];
        full.extend(args.split_whitespace());
        ns.run("conntrack", &full)
            .unwrap_or_else(|e| panic!("conntrack -I {args}: {e}"));
    };
    let v4 = "-p udp -s 192.168.56.100 -d 10.96.0.53 --sport 40000 --dport 53 --timeout 300 \
              -r 10.244.1.10 -q 192.168.56.100 --reply-port-src 53 --reply-port-dst 40000";
    insert(v4);
    insert(&format!("{v4} --zone 7"));
    insert(
        "-p udp -s fd00:56::100 -d fd00:10:96::35 --sport 40001 --dport 53 --timeout 300 \
         -r fd00:10:244::1:10 -q fd00:56::100 --reply-port-src 53 --reply-port-dst 40001",
    );

    let flows = ct.dump(Family::V4, Some(proto::UDP)).unwrap();
    assert_eq!(flows.len(), 2, "{flows:#?}");
    let plain = flows.iter().find(|f| f.zone == 0).unwrap().clone();
    let zoned = flows.iter().find(|f| f.zone == 7).unwrap().clone();
    assert_eq!(plain.original, zoned.original);
    assert_eq!(plain.reply_src(), addr("10.244.1.10:53"));

    // A stale id (the entry was replaced since the dump) deletes nothing.
    let mut stale = plain.clone();
    stale.id = plain.id.map(|id| id.wrapping_add(1));
    assert!(!ct.delete(&stale).unwrap());
    assert_eq!(cli_entries(&ns, &["-f", "ipv4"]).len(), 2);

    assert!(ct.delete(&plain).unwrap());
    assert!(!ct.delete(&plain).unwrap(), "ENOENT the second time");
    let left = cli_entries(&ns, &["-f", "ipv4"]);
    assert_eq!(left.len(), 1);
    assert!(left.iter().all(|e| e.ends_with("zone=7")), "{left:?}");

    // Without an id the tuple and zone are enough.
    let mut by_tuple = zoned.clone();
    by_tuple.id = None;
    assert!(ct.delete(&by_tuple).unwrap());
    assert!(cli_entries(&ns, &["-f", "ipv4"]).is_empty());

    let deleted = ct
        .delete_matching(Family::V6, |f| {
            f.original_dst() == addr("[fd00:10:96::35]:53")
                && f.reply.src != ip("fd00:10:244::1:11")
        })
        .unwrap();
    assert_eq!(deleted, 1);
    assert!(cli_entries(&ns, &["-f", "ipv6"]).is_empty());
    assert_eq!(ct.delete_matching(Family::V6, |_| true).unwrap(), 0);

    assert_eq!(
        root_entries_to(&[ip("10.96.0.53"), ip("fd00:10:96::35")]),
        roots_before
    );
}

#[test]
fn cli_lines_are_parsed() {
    let (o, r, zone) = parse_cli_line(
        "udp      17 99 src=192.168.56.101 dst=10.96.0.53 sport=40003 dport=53 packets=0 \
         bytes=0 [UNREPLIED] src=10.96.0.53 dst=192.168.56.101 sport=53 dport=40003 packets=0 \
         bytes=0 mark=0 zone=7 use=1",
    )
    .unwrap();
    assert_eq!(
        o,
        Tuple::udp(addr("192.168.56.101:40003"), addr("10.96.0.53:53"))
    );
    assert_eq!(r, o.reversed());
    assert_eq!(zone, 7);
    let (o, _, _) = parse_cli_line(
        "icmp     1 29 src=192.168.56.100 dst=10.96.0.9 type=8 code=0 id=77 src=10.96.0.9 \
         dst=192.168.56.100 type=0 code=0 id=77 mark=0 use=1",
    )
    .unwrap();
    assert_eq!((o.proto, o.src_port, o.dst_port), (proto::ICMP, 0, 0));
}
