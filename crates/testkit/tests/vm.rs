//! IPVS in the qemu guest (`kp_testkit::vm`): dummy links; an IPVS virtual server with two
//! HTTP backends answering round robin through the VIP, first with the client's address
//! kept, then masqueraded by an ipset-matched iptables-legacy rule; ipset with
//! iptables-nft. Run as root; the trials run in the guest unless this kernel has IPVS
//! itself (docs/vm.md). Everything happens in namespaces the trials create.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use kp_model::IpFamily;
use kp_testkit::{Netns, Topology, http_get_many};
use libtest_mimic::{Failed, Trial};

/// Per request: generous, everything is slow under emulation.
const T: Duration = Duration::from_secs(10);

fn check(ok: bool, what: impl FnOnce() -> String) -> Result<(), Failed> {
    if ok { Ok(()) } else { Err(what().into()) }
}

/// `ip link add ... type dummy` works (the host kernel here has no dummy links).
fn dummy_link() -> Result<(), Failed> {
    let ns = Netns::new("t-dummy")?;
    ns.ip(["link", "add", "kube-ipvs0", "type", "dummy"])?;
    ns.ip(["addr", "add", "10.96.0.10/32", "dev", "kube-ipvs0"])?;
    let out = ns.ip(["-d", "addr", "show", "kube-ipvs0"])?;
    check(
        out.contains("dummy") && out.contains("10.96.0.10/32"),
        || format!("no dummy link with the address: {out}"),
    )
}

/// The names of the backends that answered `n` requests from the client to `vip`.
fn answers(topology: &Topology, vip: SocketAddr, n: usize) -> Result<Vec<String>, Failed> {
    http_get_many(topology.client(), vip, n, T)
        .into_iter()
        .map(|r| r.map(|reply| reply.name().to_owned()))
        .collect::<Result<_, _>>()
        .map_err(|e| format!("request to {vip}: {e}").into())
}

/// `ipvsadm -A -s rr` with two masquerading real servers: the client's requests to the VIP
/// alternate between the backends, which see the client's address. Then, as kube-proxy's
/// IPVS mode does: the VIP in an ipset, packets to it marked in nat PREROUTING and marked
/// packets masqueraded in POSTROUTING (iptables-legacy), `net.ipv4.vs.conntrack=1`; the
/// backends see the node's address instead.
fn ipvs_round_robin_through_vip() -> Result<(), Failed> {
    let topology = Topology::builder().backends(2).build()?;
    let servers = topology.start_http(8080)?;
    let node = topology.node();
    let plan = topology.plan(IpFamily::V4).expect("IPv4 plan");
    let vip_ip = plan.service_ip(10).expect("service IP");
    let vip = SocketAddr::new(vip_ip, 80);
    let vip_s = vip.to_string();

    node.ip(["link", "add", "kube-ipvs0", "type", "dummy"])?;
    node.ip(["addr", "add", &format!("{vip_ip}/32"), "dev", "kube-ipvs0"])?;
    node.run("ipvsadm", ["-A", "-t", &vip_s, "-s", "rr"])?;
    for be in topology.backends() {
        let real = SocketAddr::new(be.ip(IpFamily::V4).expect("pod IP"), 8080).to_string();
        node.run("ipvsadm", ["-a", "-t", &vip_s, "-r", &real, "-m"])?;
    }
    let listing = node.run("ipvsadm", ["-Ln", "-t", &vip_s])?;
    check(
        listing.contains("rr") && listing.matches("Masq").count() == 2,
        || format!("unexpected virtual server: {listing}"),
    )?;

    let got = answers(&topology, vip, 4)?;
    let mut sorted = got.clone();
    sorted.sort();
    check(
        sorted == ["be0", "be0", "be1", "be1"] && got[0] != got[1],
        || format!("not round robin: {got:?}"),
    )?;
    let client_ip = topology.client_ip(IpFamily::V4).expect("client IP");
    for s in &servers {
        check(s.peer_ips().iter().all(|ip| *ip == client_ip), || {
            format!(
                "{} saw {:?}, want the client {client_ip}",
                s.name(),
                s.peer_ips()
            )
        })?;
        s.clear_peers();
    }

    // kube-proxy's masquerading: the ClusterIP set, one iptables rule, IPVS conntrack.
    node.run(
        "ipset",
        [
            "create",
            "KUBE-CLUSTER-IP",
            "hash:ip,port",
            "family",
            "inet",
        ],
    )?;
    node.run(
        "ipset",
        ["add", "KUBE-CLUSTER-IP", &format!("{vip_ip},tcp:80")],
    )?;
    node.sysctl("net.ipv4.vs.conntrack", "1")?;
    // As kube-proxy does: mark in PREROUTING, where the destination is still the VIP
    // (IPVS rewrites it before POSTROUTING), masquerade marked packets in POSTROUTING.
    for rule in [
        "-A PREROUTING -m set --match-set KUBE-CLUSTER-IP dst,dst -j MARK --set-xmark 0x4000/0x4000",
        "-A POSTROUTING -m mark --mark 0x4000/0x4000 -j MASQUERADE",
    ] {
        node.run(
            "iptables-legacy",
            ["-w", "-t", "nat"].into_iter().chain(rule.split(' ')),
        )?;
    }
    let got = answers(&topology, vip, 2)?;
    check(got[0] != got[1], || format!("not round robin: {got:?}"))?;
    let node_ip: IpAddr = topology.node_ip(IpFamily::V4).expect("node IP");
    for s in &servers {
        check(s.peer_ips() == [node_ip], || {
            format!(
                "{} saw {:?}, want the node {node_ip} once",
                s.name(),
                s.peer_ips()
            )
        })?;
    }
    let rules = node.run("iptables-legacy-save", ["-t", "nat"])?;
    check(
        rules.contains("--match-set KUBE-CLUSTER-IP dst,dst -j MARK"),
        || format!("rule not listed: {rules}"),
    )
}

/// Every ipset type kube-proxy uses can be made, and iptables-nft matches on a set.
fn ipset_and_iptables_nft() -> Result<(), Failed> {
    let ns = Netns::new("t-ipset")?;
    for (name, kind) in [
        ("KUBE-IP", "hash:ip"),
        ("KUBE-IP-PORT", "hash:ip,port"),
        ("KUBE-IP-PORT-IP", "hash:ip,port,ip"),
        ("KUBE-IP-PORT-NET", "hash:ip,port,net"),
        ("KUBE-NET", "hash:net"),
        ("KUBE-PORT", "bitmap:port"),
    ] {
        let mut args = vec!["create", name, kind];
        if kind == "bitmap:port" {
            args.extend(["range", "0-65535"]);
        }
        ns.run("ipset", args)?;
    }
    ns.run("ipset", ["add", "KUBE-IP-PORT", "10.96.0.1,tcp:443"])?;
    ns.run(
        "iptables-nft",
        [
            "-w",
            "-t",
            "filter",
            "-A",
            "INPUT",
            "-m",
            "set",
            "--match-set",
            "KUBE-IP-PORT",
            "dst,dst",
            "-m",
            "comment",
            "--comment",
            "kp-vm",
            "-j",
            "ACCEPT",
        ],
    )?;
    let saved = ns.run("iptables-nft-save", ["-t", "filter"])?;
    check(saved.contains("--match-set KUBE-IP-PORT dst,dst"), || {
        format!("rule not listed: {saved}")
    })?;
    let listed = ns.run("ipset", ["list", "-n"])?;
    check(listed.lines().count() == 6, || format!("sets: {listed}"))
}

fn main() {
    kp_testkit::vm::run_tests(vec![
        Trial::test("dummy_link", dummy_link),
        Trial::test("ipvs_round_robin_through_vip", ipvs_round_robin_through_vip),
        Trial::test("ipset_and_iptables_nft", ipset_and_iptables_nft),
    ]);
}
