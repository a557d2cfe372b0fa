//! `kp_netlink::link` against the real kernel, inside network namespaces created per test
//! (deleted on drop, even on failure; root; CI runs them). The host kernel may lack the
//! dummy link type, so addresses are exercised on a veth link; `ensure_dummy` is checked
//! to fail with `LinkError::DummyUnsupported` exactly when `ip link add ... type dummy`
//! fails too. Also checks `FakeLinks` against the same scenario. Dummy links themselves
//! are tested in `kernel_vm.rs`, in the qemu guest of `kp_testkit::vm`.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::Instant;

use kp_netlink::link::{FakeLinks, KUBE_IPVS0, LinkError, LinkOps, Links};
use kp_testkit::{Netns, require_root, veth};

fn links_in(ns: &Netns) -> Links {
    ns.in_ns(Links::new)
        .expect("enter namespace")
        .expect("open rtnetlink socket")
}

fn dummy_supported(ns: &Netns) -> bool {
    let ok = ns.ip(["link", "add", "kpprobe0", "type", "dummy"]).is_ok();
    if ok {
        ns.ip(["link", "del", "kpprobe0"]).expect("delete probe");
    }
    ok
}

#[test]
fn ensure_dummy_creates_a_down_dummy_or_says_the_kernel_cannot() {
    if !require_root() {
        return;
    }
    let ns = Netns::new("dummy").expect("netns");
    let mut links = links_in(&ns);
    let supported = dummy_supported(&ns);
    match links.ensure_dummy(KUBE_IPVS0) {
        Ok(index) => {
            assert!(supported, "created a dummy where `ip link add` could not");
            assert_eq!(links.link_index(KUBE_IPVS0).unwrap(), Some(index));
            assert_eq!(links.ensure_dummy(KUBE_IPVS0).unwrap(), index, "idempotent");
            let show = ns.ip(["-d", "link", "show", KUBE_IPVS0]).unwrap();
            assert!(show.contains("dummy"), "{show}");
            assert!(
                show.contains("state DOWN"),
                "left down like upstream: {show}"
            );
            assert!(links.delete_link(KUBE_IPVS0).unwrap());
        }
        Err(e) => {
            assert!(
                !supported,
                "ensure_dummy failed though the kernel has dummy links: {e}"
            );
            assert!(matches!(e, LinkError::DummyUnsupported { .. }), "{e:?}");
            assert_eq!(e.code(), Some(nix::errno::Errno::EOPNOTSUPP as i32));
            assert!(e.to_string().contains("no dummy link type"), "{e}");
            assert_eq!(links.link_index(KUBE_IPVS0).unwrap(), None);
        }
    }
    assert!(matches!(
        links.ensure_dummy("a/b"),
        Err(LinkError::InvalidName { .. })
    ));
}

#[test]
fn addresses_on_a_veth_link_in_bulk() {
    if !require_root() {
        return;
    }
    let node = Netns::new("node").expect("netns");
    let peer = Netns::new("peer").expect("netns");
    veth(&node, "kpv0", &peer, "kpv1").expect("veth");
    let mut links = links_in(&node);
    let index = links.link_index("kpv0").unwrap().expect("kpv0 exists");
    assert!(index > 1);
    assert_eq!(links.link_index("nope0").unwrap(), None);

    let v4: Vec<IpAddr> = (0..10_000u32)
        .map(|i| IpAddr::V4(Ipv4Addr::from(0x0a60_0000 + i)))
        .collect();
    let v6: Vec<IpAddr> = (1..=1_000u128)
        .map(|i| {
            IpAddr::V6(Ipv6Addr::from(
                0xfd00_0000_0000_0000_0000_0000_0096_0000 + i,
            ))
        })
        .collect();
    let started = Instant::now();
    let results = links.add_addresses("kpv0", &v4).unwrap();
    let took = started.elapsed();
    eprintln!("adding 10,000 IPv4 /32 addresses over rtnetlink: {took:?}");
    assert!(
        results.iter().all(Result::is_ok),
        "{:?}",
        results.iter().find(|r| r.is_err())
    );
    let started = Instant::now();
    let results = links.add_addresses("kpv0", &v6).unwrap();
    eprintln!("adding 1,000 IPv6 /128 addresses: {:?}", started.elapsed());
    assert!(results.iter().all(Result::is_ok));
    // The kernel's cost dominates (measured: `ip -batch` with the same 10,000 `addr add`
    // lines takes ~4.6 s on the CI host, this ~3.8 s): a generous bound against regressions
    // to one round trip per address.
    assert!(took.as_secs_f64() < 15.0, "10,000 adds took {took:?}");

    let mut all: Vec<IpAddr> = v4.iter().chain(&v6).copied().collect();
    all.sort();
    let started = Instant::now();
    let have = links.addresses("kpv0").unwrap();
    eprintln!("listing 11,000 addresses: {:?}", started.elapsed());
    // IPv6 link-local addresses may appear on the up veth; ours must all be there.
    let ours: Vec<IpAddr> = have
        .iter()
        .copied()
        .filter(|a| all.binary_search(a).is_ok())
        .collect();
    assert_eq!(ours, all);

    // What `ip` sees: host prefixes, scope global (as upstream's plain AddrAdd).
    let shown = node.ip(["-o", "addr", "show", "dev", "kpv0"]).unwrap();
    assert!(
        shown.contains("inet 10.96.0.0/32 scope global kpv0"),
        "{}",
        &shown[..400.min(shown.len())]
    );
    assert!(
        shown.contains("inet6 fd00::96:1/128 scope global"),
        "ipv6 missing"
    );

    // Adding again is fine (EEXIST), deleting twice is fine (EADDRNOTAVAIL).
    assert!(
        links
            .add_addresses("kpv0", &v4[..10])
            .unwrap()
            .iter()
            .all(Result::is_ok)
    );
    let started = Instant::now();
    let del = links.del_addresses("kpv0", &v4[..5_000]).unwrap();
    eprintln!("deleting 5,000 addresses: {:?}", started.elapsed());
    assert!(del.iter().all(Result::is_ok));
    assert!(
        links
            .del_addresses("kpv0", &v4[..5])
            .unwrap()
            .iter()
            .all(Result::is_ok)
    );
    assert_eq!(
        links
            .addresses("kpv0")
            .unwrap()
            .iter()
            .filter(|a| a.is_ipv4())
            .count(),
        5_000
    );

    let local = links.local_addresses().unwrap();
    assert!(local.contains(&("lo".to_string(), IpAddr::from([127, 0, 0, 1]))));
    assert!(local.contains(&("kpv0".to_string(), v4[9_999])));

    // A missing link: the whole call fails with ENODEV.
    let err = links.add_addresses("nope0", &v4[..1]).unwrap_err();
    assert!(matches!(err, LinkError::NoSuchLink { .. }), "{err:?}");
    assert_eq!(err.code(), Some(nix::errno::Errno::ENODEV as i32));
    assert!(matches!(
        links.addresses("nope0"),
        Err(LinkError::NoSuchLink { .. })
    ));

    assert!(links.delete_link("kpv0").unwrap());
    assert!(!links.delete_link("kpv0").unwrap());
}

#[test]
fn the_fake_behaves_like_the_kernel() {
    let mut fake = FakeLinks::new().without_dummy();
    assert!(matches!(
        fake.ensure_dummy(KUBE_IPVS0),
        Err(LinkError::DummyUnsupported { .. })
    ));
    let a: IpAddr = "10.96.0.1".parse().unwrap();
    assert!(matches!(
        fake.add_addresses(KUBE_IPVS0, &[a]),
        Err(LinkError::NoSuchLink { .. })
    ));
    let mut fake = FakeLinks::new();
    let eth = fake.add_link("eth0", &["192.168.1.10".parse().unwrap()]);
    let index = fake.ensure_dummy(KUBE_IPVS0).unwrap();
    assert_ne!(index, eth);
    assert_eq!(fake.ensure_dummy(KUBE_IPVS0).unwrap(), index);
    let b: IpAddr = "fd00::1".parse().unwrap();
    fake.fail_address(b, nix::errno::Errno::EACCES as i32);
    let r = fake.add_addresses(KUBE_IPVS0, &[a, a, b]).unwrap();
    assert!(r[0].is_ok() && r[1].is_ok());
    assert_eq!(
        r[2].as_ref().unwrap_err().code(),
        Some(nix::errno::Errno::EACCES as i32)
    );
    assert_eq!(fake.addresses(KUBE_IPVS0).unwrap(), [a]);
    assert!(
        fake.local_addresses()
            .unwrap()
            .contains(&("eth0".to_string(), "192.168.1.10".parse().unwrap()))
    );
    assert!(
        fake.del_addresses(KUBE_IPVS0, &[a, a])
            .unwrap()
            .iter()
            .all(Result::is_ok)
    );
    assert!(fake.addresses(KUBE_IPVS0).unwrap().is_empty());
    assert!(fake.delete_link(KUBE_IPVS0).unwrap());
    assert!(!fake.delete_link(KUBE_IPVS0).unwrap());
    assert!(fake.calls() > 0);
}
