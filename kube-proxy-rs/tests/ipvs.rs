//! IPVS mode end to end, with real traffic, on a kernel with IPVS and dummy links: this
//! machine's kernel has neither, so `kp_testkit::vm::run_tests` boots Debian's kernel under
//! qemu once for the whole file and runs the trials there (docs/vm.md). Every trial builds
//! its own network namespaces (node, client, backend pods) inside the guest.
//!
//! What is proved: the seed cluster programmed as upstream's IPVS mode does (`ipvsadm -Ln`
//! like seeds 001/003, kube-ipvs0 holding the ClusterIP, the ipsets), balanced traffic to the
//! ClusterIP from a client and from the node, a NodePort, an externalIP, a ping to the
//! ClusterIP answered in IPVS mode and not in iptables mode, endpoint removal while running
//! with graceful termination (weight 0 while a connection is open), a Service without
//! endpoints refused, session affinity, a non-default scheduler, UDP following an endpoint
//! move, Local traffic policy keeping the client's address, and mode switches ipvs →
//! iptables → ipvs → nftables → iptables → ipvs, each removing the others' leftovers, and
//! `--cleanup`; and a client that never sees a failed connection while the node switches to and
//! from IPVS mode.

mod common;

use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use common::{
    Daemon, Mode, NODE_ARGS, SEED_EXTRA_SERVICES, counts, feature_cluster, feature_topology, names,
    seed_topology, start_udp_echo, tempdir, write,
};
use kp_testkit::golden::SEED_CLUSTER;
use kp_testkit::{ClientError, Netns, UdpClient, http_get, http_get_many, udp_request};
use libtest_mimic::{Failed, Trial};

/// Per request: generous, everything is slow under emulation.
const T: Duration = Duration::from_secs(5);

fn run(ns: &Netns, program: &str, args: &[&str]) -> String {
    ns.run(program, args.iter().copied()).unwrap_or_default()
}

/// Whether `ns` answers one ICMP echo to `ip` within 2 s (busybox's ping: the guest runs the
/// host's programs, and iputils may be absent).
fn ping(ns: &Netns, ip: &str) -> bool {
    ns.run("busybox", ["ping", "-c", "1", "-W", "2", ip])
        .is_ok()
}

fn wait(what: &str, timeout: Duration, mut cond: impl FnMut() -> bool) -> Result<(), Failed> {
    let start = Instant::now();
    while start.elapsed() < timeout {
        if cond() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    Err(format!("timed out waiting for {what}").into())
}

/// Sends one keep-alive request on `s` and returns the body (the backend's name).
fn poke(s: &mut std::net::TcpStream) -> String {
    use std::io::{Read, Write};
    let _ = s.set_read_timeout(Some(T));
    if s.write_all(b"GET / HTTP/1.1\r\nHost: t\r\nConnection: keep-alive\r\n\r\n")
        .is_err()
    {
        return String::new();
    }
    let mut buf = Vec::new();
    let mut chunk = [0u8; 512];
    while let Ok(n) = s.read(&mut chunk) {
        if n == 0 {
            break;
        }
        buf.extend_from_slice(&chunk[..n]);
        let text = String::from_utf8_lossy(&buf);
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            let len = head
                .lines()
                .find_map(|l| l.strip_prefix("Content-Length: "))
                .and_then(|v| v.trim().parse::<usize>().ok())
                .unwrap_or(0);
            if body.len() >= len {
                return body[..len].trim().to_string();
            }
        }
    }
    String::new()
}

/// The weight of real server `rs` in an `ipvsadm -Ln` listing, if listed.
fn weight(listing: &str, rs: &str) -> Option<u32> {
    listing.lines().find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        (f.len() >= 4 && f[0] == "->" && f[1] == rs).then(|| f[3].parse().ok())?
    })
}

fn seed_manifest(dir: &std::path::Path, extra: &str) -> String {
    write(
        dir,
        "cluster.yaml",
        &format!("{SEED_CLUSTER}\n---\n{SEED_EXTRA_SERVICES}\n---\n{extra}"),
    )
    .to_str()
    .unwrap()
    .to_string()
}

/// An externalIP Service on the seed's Pods: `ext` at 10.96.0.77 and externalIP 172.30.0.7.
const EXTERNAL_IP_SERVICE: &str = r#"
apiVersion: v1
kind: Service
metadata: {name: ext, namespace: default}
spec:
  clusterIP: 10.96.0.77
  externalIPs: [172.30.0.7]
  ports: [{port: 80, targetPort: 80, protocol: TCP}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: ext-1
  namespace: default
  labels: {kubernetes.io/service-name: ext}
addressType: IPv4
endpoints:
- addresses: [10.0.0.4]
  nodeName: k8s-master
- addresses: [10.0.1.2]
  nodeName: k8s-worker
ports: [{name: "", port: 80, protocol: TCP}]
"#;

/// The seed cluster in IPVS mode: layout, traffic, ping, no-endpoint refusal, endpoint
/// removal with graceful termination; then the same node switched to iptables mode (no ping
/// answer any more), nftables mode, and back to iptables mode.
fn seed_cluster_and_mode_switches() -> Result<(), Failed> {
    let (topology, servers) = seed_topology();
    let node = topology.node();
    let client = topology.client();
    // The client reaches the externalIP through the node.
    client.ip(["route", "add", "172.30.0.7/32", "via", "192.168.56.10"])?;
    let dir = tempdir();
    let manifest = seed_manifest(dir.path(), EXTERNAL_IP_SERVICE);
    let mut args = vec![
        "--manifests",
        manifest.as_str(),
        "--ipvs-sync-period=3s",
        "--ipvs-min-sync-period=200ms",
    ];
    args.extend(NODE_ARGS);
    let mut proxy = Daemon::start(Mode::Ipvs, node, dir.path(), &args, None);
    proxy.wait_programmed(node);

    // The layout the seeds show.
    let list = run(node, "ipvsadm", &["-L", "-n"]);
    for needle in [
        "TCP  10.96.138.71:8080 rr",
        "-> 10.0.0.4:80",
        "-> 10.0.1.2:80",
        "TCP  192.168.56.10:30080 rr",
        "TCP  172.30.0.7:80 rr",
        "Masq    1",
    ] {
        assert!(
            list.contains(needle),
            "ipvsadm -Ln lacks {needle:?}:\n{list}"
        );
    }
    let addrs = run(node, "ip", &["-d", "addr", "show", "kube-ipvs0"]);
    assert!(addrs.contains("dummy"), "{addrs}");
    assert!(addrs.contains("10.96.138.71/32"), "{addrs}");
    assert!(addrs.contains("172.30.0.7/32"), "{addrs}");
    let sets = run(node, "ipset", &["list", "-n"]);
    for set in [
        "KUBE-CLUSTER-IP",
        "KUBE-LOOP-BACK",
        "KUBE-NODE-PORT-TCP",
        "KUBE-IPVS-IPS",
    ] {
        assert!(sets.contains(set), "{set} missing: {sets}");
    }
    assert!(run(node, "ipset", &["list", "KUBE-CLUSTER-IP"]).contains("10.96.138.71,tcp:8080"));

    // Balanced traffic: client and node to the ClusterIP, the client to the NodePort and the
    // externalIP.
    let vip: SocketAddr = "10.96.138.71:8080".parse().unwrap();
    for (who, ns, target) in [
        ("client", client, vip),
        ("node", node, vip),
        ("client", client, "192.168.56.10:30080".parse().unwrap()),
        ("client", client, "172.30.0.7:80".parse().unwrap()),
    ] {
        let c = counts(http_get_many(ns, target, 20, T));
        assert!(
            c.get("be0").is_some_and(|n| *n >= 5) && c.get("be1").is_some_and(|n| *n >= 5),
            "{who} -> {target}: {c:?}\n{}",
            proxy.log()
        );
    }
    // A ClusterIP answers ping in IPVS mode (it is an address of kube-ipvs0).
    assert!(
        ping(client, "10.96.138.71"),
        "no ping answer from the ClusterIP"
    );
    // A Service without endpoints: IPVS answers ICMP port unreachable.
    let empty = http_get(client, "10.96.0.99:80".parse().unwrap(), T);
    assert!(matches!(empty, Err(ClientError::Refused)), "{empty:?}");
    // A port of a ClusterIP that no Service uses: KUBE-IPVS-FILTER rejects it (host ports
    // must not be reachable through a VIP, kubernetes#72236).
    let other = http_get(client, "10.96.138.71:22".parse().unwrap(), T);
    assert!(matches!(other, Err(ClientError::Refused)), "{other:?}");

    // Endpoint removal while connections are open: the real server drains at weight 0,
    // new connections go to the other endpoint, and it is deleted once its connections end.
    let web = "10.96.0.80:80";
    let web_addr: SocketAddr = web.parse().unwrap();
    let mut open: Vec<std::net::TcpStream> = (0..2)
        .filter_map(|_| {
            client
                .in_ns(|| std::net::TcpStream::connect_timeout(&web_addr, T))
                .ok()?
                .ok()
        })
        .collect();
    assert_eq!(open.len(), 2, "could not open two connections to {web}");
    // Round robin put one on each backend (the answer names it).
    let mut on: Vec<String> = open.iter_mut().map(poke).collect();
    on.sort();
    assert_eq!(on, ["be0", "be1"], "connections");
    let removed =
        SEED_EXTRA_SERVICES.replace("- addresses: [10.0.1.2]\n  nodeName: k8s-worker\n", "");
    assert_ne!(removed, SEED_EXTRA_SERVICES);
    write(
        dir.path(),
        "cluster.yaml",
        &format!("{SEED_CLUSTER}\n---\n{removed}\n---\n{EXTERNAL_IP_SERVICE}"),
    );
    let mut last_poke = Instant::now();
    wait(
        "the removed real server at weight 0",
        Duration::from_secs(60),
        || {
            if last_poke.elapsed() > Duration::from_secs(2) {
                // Keep the connections busy: the backends close idle ones after 5 s.
                open.iter_mut().for_each(|s| {
                    poke(s);
                });
                last_poke = Instant::now();
            }
            weight(
                &run(node, "ipvsadm", &["-L", "-n", "-t", web]),
                "10.0.1.2:80",
            ) == Some(0)
        },
    )?;
    open.iter_mut().for_each(|s| {
        poke(s);
    });
    let c = counts(http_get_many(client, web_addr, 10, T));
    assert_eq!(
        c.get("be0"),
        Some(&10),
        "new connections while draining: {c:?}"
    );
    open.iter_mut().for_each(|s| {
        poke(s);
    });
    let l = run(node, "ipvsadm", &["-L", "-n", "-t", web]);
    assert_eq!(
        weight(&l, "10.0.1.2:80"),
        Some(0),
        "deleted while a connection was open:\n{l}"
    );
    // Reset the connections (SO_LINGER 0): IPVS's CLOSE state lasts 10 s, then the real
    // server has no connections and the next sync deletes it.
    for s in &open {
        let _ = nix::sys::socket::setsockopt(
            s,
            nix::sys::socket::sockopt::Linger,
            &nix::libc::linger {
                l_onoff: 1,
                l_linger: 0,
            },
        );
    }
    drop(open);
    wait(
        "the drained real server deleted",
        Duration::from_secs(90),
        || {
            weight(
                &run(node, "ipvsadm", &["-L", "-n", "-t", web]),
                "10.0.1.2:80",
            )
            .is_none()
        },
    )?;

    // Switch to iptables mode on the same node: IPVS leftovers go, and a ClusterIP no longer
    // answers ping, while traffic still flows.
    drop(proxy);
    let mut ipt_args = vec!["--manifests", manifest.as_str()];
    ipt_args.extend(NODE_ARGS);
    write(
        dir.path(),
        "cluster.yaml",
        &std::fs::read_to_string(&manifest)?,
    );
    let mut proxy = Daemon::start(Mode::Iptables, node, dir.path(), &ipt_args, None);
    proxy.wait_programmed(node);
    wait("IPVS leftovers removed", Duration::from_secs(60), || {
        run(node, "ipvsadm", &["-S", "-n"]).trim().is_empty()
            && node.ip(["link", "show", "kube-ipvs0"]).is_err()
            && !run(node, "ipset", &["list", "-n"]).contains("KUBE-")
    })?;
    // IPVS mode's KUBE-POSTROUTING may have satisfied `wait_programmed`; the leftovers go
    // after iptables mode's first sync, so its rules are there by now.
    proxy.wait_nat_rules_contain(node, "-A KUBE-SVC-");
    let c = counts(http_get_many(client, vip, 10, T));
    assert_eq!(c.values().sum::<usize>(), 10, "{c:?}");
    assert!(c.keys().all(|k| !k.starts_with("error")), "{c:?}");
    assert!(
        !ping(client, "10.96.138.71"),
        "iptables mode: a ClusterIP answered ping"
    );
    let save = run(node, "iptables-save", &[]);
    assert!(
        !save.contains("KUBE-IPVS-FILTER") && !save.contains("match-set"),
        "{save}"
    );

    // iptables → IPVS: iptables mode's per-Service chains go in IPVS mode's first restore.
    assert!(run(node, "iptables-save", &["-t", "nat"]).contains("-A KUBE-SVC-"));
    drop(proxy);
    let mut proxy = Daemon::start(Mode::Ipvs, node, dir.path(), &args, None);
    proxy.wait_programmed(node);
    let nat = run(node, "iptables-save", &["-t", "nat"]);
    assert!(
        !nat.contains("KUBE-SVC-") && !nat.contains("KUBE-SEP-") && !nat.contains("KUBE-NODEPORTS"),
        "{nat}"
    );
    let filter = run(node, "iptables-save", &["-t", "filter"]);
    assert!(!filter.contains("KUBE-EXTERNAL-SERVICES"), "{filter}");
    let c = counts(http_get_many(client, vip, 10, T));
    assert!(c.keys().all(|k| !k.starts_with("error")), "{c:?}");
    assert!(
        ping(client, "10.96.138.71"),
        "IPVS mode again: no ping answer"
    );

    // IPVS → nftables: the iptables chains, ipsets, virtual servers and kube-ipvs0 go.
    drop(proxy);
    let mut proxy = Daemon::start(Mode::Nftables, node, dir.path(), &ipt_args, None);
    proxy.wait_programmed(node);
    // The old mode's objects go once the new mode's first sync is done.
    wait(
        "IPVS mode's objects removed",
        Duration::from_secs(60),
        || {
            !run(node, "iptables-save", &[]).contains("KUBE-")
                && run(node, "ipvsadm", &["-S", "-n"]).trim().is_empty()
                && node.ip(["link", "show", "kube-ipvs0"]).is_err()
                && !run(node, "ipset", &["list", "-n"]).contains("KUBE-")
        },
    )?;
    let c = counts(http_get_many(client, vip, 10, T));
    assert!(c.keys().all(|k| !k.starts_with("error")), "{c:?}");

    // nftables → iptables: the nftables table goes.
    drop(proxy);
    let mut proxy = Daemon::start(Mode::Iptables, node, dir.path(), &ipt_args, None);
    proxy.wait_programmed(node);
    wait(
        "the nftables tables removed",
        Duration::from_secs(60),
        || !run(node, "nft", &["list", "tables"]).contains("kube-proxy"),
    )?;
    let c = counts(http_get_many(client, vip, 10, T));
    assert!(c.keys().all(|k| !k.starts_with("error")), "{c:?}");

    // Back to IPVS mode for the cleanup.
    drop(proxy);
    let mut proxy = Daemon::start(Mode::Ipvs, node, dir.path(), &args, None);
    proxy.wait_programmed(node);

    // --cleanup removes every IPVS-mode object.
    drop(proxy);
    let (ok, _, err) = common::run_in(node, &["--cleanup"]);
    assert!(ok, "{err}");
    assert!(run(node, "ipvsadm", &["-S", "-n"]).trim().is_empty());
    assert!(node.ip(["link", "show", "kube-ipvs0"]).is_err());
    assert!(!run(node, "ipset", &["list", "-n"]).contains("KUBE-"));
    assert!(!run(node, "iptables-save", &[]).contains("KUBE-"));
    drop(servers);
    Ok(())
}

/// How many Services the mode-switch probe trial programs besides the seed's: a fortieth of
/// the host test's 2,000 (tests/netns.rs), as everything in the guest is 10-30 times slower.
const SWITCH_SERVICES: usize = 50;

/// Mode switches to and from IPVS mode leave no moment without rules: a client connects to the
/// seed's ClusterIP over and over (a new connection each time) while the daemon is stopped and
/// started in the other mode: nftables → IPVS → iptables → IPVS → nftables (every direction to
/// and from IPVS mode), on the seed plus 50 Services. Each new mode writes its rules before the old mode's are removed
/// (crate::takeover), so not one connection fails; the old mode's objects are gone after each.
fn mode_switches_to_and_from_ipvs_drop_no_connection() -> Result<(), Failed> {
    let (topology, servers) = seed_topology();
    let (node, client) = (topology.node(), topology.client());
    let dir = tempdir();
    let manifest = write(
        dir.path(),
        "cluster.yaml",
        &format!(
            "{SEED_CLUSTER}\n{}",
            common::filler_services(SWITCH_SERVICES)
        ),
    );
    let mut args = vec![
        "--manifests",
        manifest.to_str().unwrap(),
        "--ipvs-sync-period=30s",
    ];
    args.extend(NODE_ARGS);
    let vip: SocketAddr = "10.96.138.71:8080".parse().unwrap();
    let ipvs_gone = || {
        run(node, "ipvsadm", &["-S", "-n"]).trim().is_empty()
            && node.ip(["link", "show", "kube-ipvs0"]).is_err()
            && !run(node, "ipset", &["list", "-n"]).contains("KUBE-")
    };
    let iptables_mode_gone = || {
        let nat = run(node, "iptables-save", &["-t", "nat"]);
        !nat.contains("KUBE-SVC-") && !nat.contains("KUBE-NODEPORTS")
    };
    let nftables_gone = || !run(node, "nft", &["list", "tables"]).contains("kube-proxy");
    let iptables_all_gone = || !run(node, "iptables-save", &[]).contains("KUBE-");
    let mut proxy = Daemon::start(Mode::Nftables, node, dir.path(), &args, None);
    proxy.wait_programmed(node);
    proxy.wait_nat_rules_contain(node, "10.97.0.50");
    let mut failures = Vec::new();
    let steps: [(Mode, &dyn Fn() -> bool); 4] = [
        (Mode::Ipvs, &nftables_gone),
        (Mode::Iptables, &ipvs_gone),
        (Mode::Ipvs, &iptables_mode_gone),
        (Mode::Nftables, &|| ipvs_gone() && iptables_all_gone()),
    ];
    for (to, old_gone) in steps {
        let started = Instant::now();
        let (log, probes) = common::probe_during(
            client,
            vip,
            Duration::from_secs(2),
            Duration::from_millis(100),
            || {
                std::thread::sleep(Duration::from_secs(1));
                drop(std::mem::replace(
                    &mut proxy,
                    Daemon::start(to, node, dir.path(), &args, None),
                ));
                wait(
                    "the new mode's rules and the old mode's removal",
                    Duration::from_secs(120),
                    || to.programmed(node) && old_gone(),
                )?;
                std::thread::sleep(Duration::from_secs(1));
                Ok::<String, Failed>(proxy.log())
            },
        );
        let log = log?;
        let (failed, span) = common::failures(&probes);
        eprintln!(
            "switching to {to:?}: {} of {} connections failed, in {:?}",
            failed.len(),
            probes.len(),
            started.elapsed()
        );
        if !failed.is_empty() {
            failures.push(format!(
                "switching to {to:?}: {} of {} connections failed over {span:?}; first: {:?}\n{log}",
                failed.len(),
                probes.len(),
                failed[0]
            ));
        }
        if probes.len() < 10 {
            return Err(format!("switching to {to:?}: only {} probes", probes.len()).into());
        }
    }
    drop(proxy);
    drop(servers);
    if failures.is_empty() {
        Ok(())
    } else {
        Err(failures.join("\n").into())
    }
}

/// Affinity, Local policy keeping the client's address, a non-default scheduler and UDP
/// following an endpoint move.
fn service_features() -> Result<(), Failed> {
    let mut topology = feature_topology();
    topology.add_client(true)?;
    let http = topology.start_http(80)?;
    let _udp = start_udp_echo(&topology, 5353);
    let dir = tempdir();
    let manifest = write(dir.path(), "cluster.yaml", &feature_cluster(Mode::Ipvs));
    let mut args = vec![
        "--manifests",
        manifest.to_str().unwrap(),
        "--ipvs-scheduler=wrr",
        "--ipvs-udp-timeout=77s",
        "--ipvs-min-sync-period=200ms",
    ];
    args.extend(NODE_ARGS);
    let node = topology.node();
    let client = topology.client();
    let mut proxy = Daemon::start(Mode::Ipvs, node, dir.path(), &args, None);
    proxy.wait_programmed(node);
    let list = run(node, "ipvsadm", &["-L", "-n"]);
    assert!(
        list.contains("TCP  10.96.0.90:80 wrr persistent 600"),
        "{list}"
    );
    // The kernel prints back every rule IPVS mode writes, unchanged (the tracer and
    // operators read the same text), including `-m ipvs` in KUBE-IPVS-OUT-FILTER (the `fw`
    // load balancer's source range excludes the node).
    let mut dry = vec!["--proxy-mode=ipvs", "--dry-run"];
    dry.extend(&args);
    let (ok, out, err) = common::run_in(node, &dry);
    assert!(ok, "{err}");
    let ipv4 = out
        .split("# IPv4: iptables-restore input")
        .nth(1)
        .and_then(|t| t.split("\n# IPv").next())
        .unwrap_or_default()
        .to_string();
    let saved = format!(
        "{}{}",
        run(node, "iptables-save", &["-t", "filter"]),
        run(node, "iptables-save", &["-t", "nat"])
    );
    let rules: Vec<&str> = ipv4.lines().filter(|l| l.starts_with("-A KUBE-")).collect();
    assert!(rules.iter().any(|l| l.contains("-m ipvs")), "{ipv4}");
    for line in rules {
        assert!(
            saved.lines().any(|l| l == line),
            "the kernel does not print back {line:?}:\n{saved}"
        );
    }
    let timeouts = run(node, "ipvsadm", &["-L", "--timeout"]);
    assert!(
        timeouts.contains("900 120 77"),
        "--ipvs-udp-timeout: {timeouts}"
    );

    // Session affinity: one client sticks to one backend.
    let sticky = names(
        http_get_many(client, "10.96.0.90:80".parse().unwrap(), 15, T),
        "sticky",
    );
    assert!(sticky.iter().all(|n| *n == sticky[0]), "{sticky:?}");

    // externalTrafficPolicy Local on the NodePort: only the local endpoint, and it sees the
    // client's own address.
    let be0 = &http[0];
    be0.clear_peers();
    let local = names(
        http_get_many(client, "192.168.56.10:30070".parse().unwrap(), 10, T),
        "Local NodePort",
    );
    assert!(local.iter().all(|n| n == "be0"), "{local:?}");
    let client_ip: IpAddr = "192.168.56.100".parse().unwrap();
    assert!(
        !be0.peer_ips().is_empty() && be0.peer_ips().iter().all(|ip| *ip == client_ip),
        "source not preserved: {:?}",
        be0.peer_ips()
    );

    // UDP balanced over both backends.
    let vip: SocketAddr = "10.96.0.53:53".parse().unwrap();
    let mut seen = BTreeSet::new();
    for _ in 0..20 {
        if let Ok(r) = udp_request(client, vip, b"q", T, None) {
            seen.insert(r.text());
        }
    }
    assert_eq!(seen.len(), 2, "{seen:?}");
    // One resolver-like socket follows its endpoint when it moves away.
    let socket = UdpClient::bind(client, "0.0.0.0:45353".parse().unwrap())?;
    let first = socket.request(vip, b"q", T)?.text();
    let keep = if first == "be0" {
        ("10.0.2.5", "node-b", "be1")
    } else {
        ("10.0.1.4", "k8s-master", "be0")
    };
    // The dns Service keeps only the other endpoint.
    let cluster = feature_cluster(Mode::Ipvs);
    let (head, dns) = cluster.split_at(cluster.find("name: dns-1").unwrap());
    let other = if keep.2 == "be0" {
        "- addresses: [10.0.2.5]\n  nodeName: node-b\n"
    } else {
        "- addresses: [10.0.1.4]\n  nodeName: k8s-master\n"
    };
    assert!(dns.contains(other));
    write(
        dir.path(),
        "cluster.yaml",
        &format!("{head}{}", dns.replace(other, "")),
    );
    wait(
        "the UDP client to reach the remaining endpoint",
        Duration::from_secs(60),
        || {
            socket
                .request(vip, b"q", Duration::from_secs(1))
                .is_ok_and(|r| r.text() == keep.2)
        },
    )?;
    drop(proxy);
    Ok(())
}

fn main() {
    kp_testkit::vm::run_tests(vec![
        Trial::test(
            "seed_cluster_and_mode_switches",
            seed_cluster_and_mode_switches,
        ),
        Trial::test("service_features", service_features),
        Trial::test(
            "mode_switches_to_and_from_ipvs_drop_no_connection",
            mode_switches_to_and_from_ipvs_drop_no_connection,
        ),
        Trial::test("ipv6_cluster_ip_and_node_port", || {
            common::ipv6_cluster_ip_and_node_port(Mode::Ipvs);
            Ok(())
        }),
    ]);
}
