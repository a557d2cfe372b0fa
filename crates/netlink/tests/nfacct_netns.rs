//! nfacct over netlink against the real kernel, inside network namespaces (root; CI runs
//! them): counters are created and read through [`Nfacct`], fed by an iptables rule with
//! `-m nfacct`, and are per namespace (one namespace's counter is invisible in another).

use kp_netlink::{Nfacct, NfacctOps};
use kp_testkit::{Netns, require_root};

/// An nfacct handle for `ns`'s counters (the socket is created inside `ns`).
fn nfacct_in(ns: &Netns) -> Nfacct {
    ns.in_ns(Nfacct::new)
        .expect("enter namespace")
        .expect("the kernel has nfacct")
}

#[test]
fn counters_are_created_read_and_fed_by_iptables() {
    if !require_root() {
        return;
    }
    let ns = Netns::new("nfacct").unwrap();
    let mut n = nfacct_in(&ns);
    assert_eq!(n.get("ct_state_invalid_dropped_pkts").unwrap(), None);
    // A rule cannot name a counter that does not exist (xt_nfacct: ENOENT).
    assert!(
        ns.run(
            "iptables",
            [
                "-A",
                "OUTPUT",
                "-m",
                "nfacct",
                "--nfacct-name",
                "kp_test_pkts"
            ]
        )
        .is_err()
    );
    assert!(n.add("kp_test_pkts").unwrap(), "created");
    assert!(!n.add("kp_test_pkts").unwrap(), "EBUSY the second time");
    n.ensure("kp_test_pkts").unwrap();
    let c = n.get("kp_test_pkts").unwrap().expect("exists");
    assert_eq!(
        (c.name.as_str(), c.packets, c.bytes),
        ("kp_test_pkts", 0, 0)
    );

    // Three datagrams to the namespace's loopback through a counting rule.
    ns.ip(["link", "set", "lo", "up"]).unwrap();
    ns.run(
        "iptables",
        [
            "-A",
            "OUTPUT",
            "-o",
            "lo",
            "-p",
            "udp",
            "--dport",
            "9",
            "-m",
            "nfacct",
            "--nfacct-name",
            "kp_test_pkts",
        ],
    )
    .unwrap();
    let save = ns.run("iptables-save", ["-t", "filter"]).unwrap();
    assert!(save.contains("kp_test_pkts"), "{save}");
    ns.in_ns(|| {
        let s = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        for _ in 0..3 {
            s.send_to(b"0123456789", "127.0.0.1:9").unwrap();
        }
    })
    .unwrap();
    let c = n.get("kp_test_pkts").unwrap().expect("exists");
    assert_eq!(c.packets, 3, "{c:?}");
    assert_eq!(
        c.bytes,
        3 * (20 + 8 + 10),
        "IPv4 + UDP headers + 10 bytes: {c:?}"
    );
    // Names the kernel would refuse are refused before a request is sent.
    assert!(n.get(&"x".repeat(32)).is_err());

    // Per namespace: a second namespace does not see it.
    let other = Netns::new("nfacct2").unwrap();
    let mut m = nfacct_in(&other);
    assert_eq!(m.get("kp_test_pkts").unwrap(), None);
}
