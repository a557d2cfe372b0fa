//! kp-netlink against a real kernel with IPVS and dummy links: the qemu guest of
//! `kp_testkit::vm` (docs/vm.md), booted once for all trials by `cargo test -p kp-netlink`
//! (as root) on a host whose kernel lacks them, or run directly on one that has them.
//! Never skipped: without root or a prepared guest kernel the target fails.
//!
//! Every trial works in network namespaces it creates (IPVS tables, IPVS timeouts and links
//! are per namespace); the netlink sockets are opened on a thread inside the namespace
//! (`Netns::in_ns`) and used from the trial's thread afterwards.
//!
//! * the IPVS scripted round trip on the kernel equals [`FakeIpvs`]'s, step by step;
//! * persistent IPv4 and IPv6 virtual servers read back with timeout and netmask;
//! * every scheduler upstream kube-proxy lists is found by `scheduler_probe`; an unknown
//!   one is `ENOENT`;
//! * 10,000 virtual servers with 10 real servers each applied in one batch and dumped back
//!   (times printed: the proxier's full sync at 10k Services depends on them);
//! * entries made by `ipvsadm` with options kube-proxy never uses (firewall marks, tunnels,
//!   thresholds, one-packet scheduling, scheduler flags) are read or skipped, never a panic;
//! * the IPVS timeouts (`ipvsadm --set`) set and read back, agreeing with `ipvsadm -L
//!   --timeout` and with the fake;
//! * the datagrams of a known table are captured; with `KP_IPVS_PRINT_GOLDEN=1` they are
//!   printed in the `src/ipvs/testdata/*.hex` format the host-side unit tests decode;
//! * `kube-ipvs0`: `ensure_dummy` makes a dummy link, idempotently; 1,000 IPv4 and 100
//!   IPv6 addresses added and deleted in bulk; `delete_link`.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Instant;

use kp_netlink::ipvs::{
    Captured, Direction, SVC_F_HASHED, SVC_F_ONEPACKET, SVC_F_PERSISTENT, SVC_F_SCHED1,
    SVC_F_SCHED2, TIMEOUT_MAX, netmask_v4, scripted_round_trip,
};
use kp_netlink::link::{KUBE_IPVS0, LinkOps, Links};
use kp_netlink::{
    FakeIpvs, Forward, Ipvs, IpvsOp, IpvsOps, IpvsTimeouts, RealServer, ServiceKey, VirtualServer,
    dump_all, parse_save_text, proto, scheduler_probe,
};
use kp_testkit::Netns;
use libtest_mimic::{Failed, Trial};
use nix::errno::Errno;

/// The schedulers upstream kube-proxy accepts for `--ipvs-scheduler`
/// (pkg/proxy/ipvs/util: rr wrr lc wlc lblc lblcr sh dh sed nq mh).
const UPSTREAM_SCHEDULERS: &[&str] = &[
    "rr", "wrr", "lc", "wlc", "lblc", "lblcr", "sh", "dh", "sed", "nq", "mh",
];

fn check(ok: bool, what: impl FnOnce() -> String) -> Result<(), Failed> {
    if ok { Ok(()) } else { Err(what().into()) }
}

fn ipvs_in(ns: &Netns) -> Result<Ipvs, Failed> {
    Ok(ns.in_ns(Ipvs::new)??)
}

fn links_in(ns: &Netns) -> Result<Links, Failed> {
    Ok(ns.in_ns(Links::new)??)
}

fn key(s: &str, protocol: u8) -> ServiceKey {
    let a: SocketAddr = s.parse().expect("socket address");
    ServiceKey::new(a.ip(), protocol, a.port())
}

fn rs(s: &str, weight: u32) -> RealServer {
    let a: SocketAddr = s.parse().expect("socket address");
    RealServer::new(a.ip(), a.port(), weight)
}

fn all_ok(results: &[Result<(), kp_netlink::OpError>]) -> Result<(), Failed> {
    match results.iter().find_map(|r| r.as_ref().err()) {
        Some(e) => Err(format!("{e}").into()),
        None => Ok(()),
    }
}

/// The table sorted like `scripted_round_trip` sorts it.
fn sorted(
    mut state: Vec<(VirtualServer, Vec<RealServer>)>,
) -> Vec<(VirtualServer, Vec<RealServer>)> {
    for (_, dests) in &mut state {
        dests.sort_by_key(|d| (d.addr, d.port));
    }
    state.sort_by_key(|(vs, _)| vs.key);
    state
}

/// The kernel answers the scripted round trip exactly as the fake does, and every request
/// we sent was answered (no timeouts, every datagram captured both ways).
fn ipvs_round_trip_equals_the_fake() -> Result<(), Failed> {
    let ns = Netns::new("vm-rt")?;
    let mut ipvs = ipvs_in(&ns)?;
    let info = ipvs.info()?;
    check(info.version.0 == 1, || format!("version {info:?}"))?;
    eprintln!("IPVS {info:?}, family id {:#x}", ipvs.family_id());
    ipvs.set_capture(true);
    let kernel = scripted_round_trip(&mut ipvs)?;
    let fake = scripted_round_trip(&mut FakeIpvs::new())?;
    for (k, f) in kernel.iter().zip(&fake) {
        check(k == f, || {
            format!("step {}: kernel\n{k:#?}\nfake\n{f:#?}", k.name)
        })?;
    }
    check(kernel.len() == fake.len(), || "step count".into())?;
    let captured = ipvs.take_captured();
    let sent = captured
        .iter()
        .filter(|c| c.direction == Direction::Sent)
        .count();
    check(sent > 10 && captured.len() > sent, || {
        format!("{} datagrams captured, {sent} sent", captured.len())
    })
}

/// Persistence (timeout, IPv4 /24 and IPv6 /64 granularity) and IPv6 virtual servers read
/// back as written, and `ipvsadm -Sn` in the namespace agrees.
fn persistent_and_ipv6_services_read_back() -> Result<(), Failed> {
    let ns = Netns::new("vm-persist")?;
    let mut ipvs = ipvs_in(&ns)?;
    let v4 = VirtualServer {
        netmask: netmask_v4(Ipv4Addr::new(255, 255, 255, 0)),
        ..VirtualServer::new(key("10.96.0.1:443", proto::TCP), "rr").persistent(10800)
    };
    let v6 = VirtualServer {
        netmask: 64,
        ..VirtualServer::new(key("[fd00:10:96::1]:443", proto::TCP), "wrr").persistent(60)
    };
    let v6_udp = VirtualServer::new(key("[fd00:10:96::a]:53", proto::UDP), "rr");
    let dests6 = [
        rs("[fd00:10:244::5]:8443", 2),
        rs("[fd00:10:244::6]:8443", 3),
    ];
    let mut ops = vec![
        IpvsOp::AddService(v4.clone()),
        IpvsOp::AddService(v6.clone()),
        IpvsOp::AddService(v6_udp.clone()),
        IpvsOp::AddDest(v4.key, rs("10.244.1.5:6443", 1)),
        IpvsOp::AddDest(v6_udp.key, rs("[fd00:10:244::53]:53", 1)),
    ];
    ops.extend(dests6.iter().map(|d| IpvsOp::AddDest(v6.key, d.clone())));
    all_ok(&ipvs.apply(&ops)?)?;

    let state = sorted(dump_all(&mut ipvs)?);
    check(state.len() == 3, || format!("{state:#?}"))?;
    let find = |k: &ServiceKey| state.iter().find(|(vs, _)| vs.key == *k);
    for want in [&v4, &v6, &v6_udp] {
        let Some((got, _)) = find(&want.key) else {
            return Err(format!("{} missing", want.key).into());
        };
        check(
            got.same_config(want) && got.flags & SVC_F_HASHED != 0,
            || format!("read back {got:?}, wrote {want:?}"),
        )?;
    }
    let (_, got6) = find(&v6.key).expect("checked");
    check(*got6 == dests6, || format!("IPv6 real servers {got6:?}"))?;

    let saved = ns.run("ipvsadm", ["-Sn"])?;
    let parsed = sorted(parse_save_text(&saved).map_err(|e| format!("{e}: {saved}"))?);
    let ours: Vec<_> = state
        .iter()
        .map(|(vs, d)| {
            (
                VirtualServer {
                    flags: vs.flags & !SVC_F_HASHED,
                    ..vs.clone()
                },
                d.clone(),
            )
        })
        .collect();
    check(parsed == ours, || {
        format!("ipvsadm -Sn:\n{saved}\nparsed {parsed:#?}\nours {ours:#?}")
    })?;
    let listing = ns.run("ipvsadm", ["-Ln"])?;
    check(
        listing.contains("persistent 10800 mask 255.255.255.0")
            && listing.contains("persistent 60 mask 64"),
        || format!("ipvsadm -Ln:\n{listing}"),
    )
}

/// Every upstream scheduler is present (the guest loads every `ip_vs_*` module); an
/// unknown name is `ENOENT`, both through the probe and directly.
fn every_upstream_scheduler_is_probed() -> Result<(), Failed> {
    let ns = Netns::new("vm-sched")?;
    let mut ipvs = ipvs_in(&ns)?;
    let mut missing = Vec::new();
    for sched in UPSTREAM_SCHEDULERS {
        if !scheduler_probe(&mut ipvs, sched)? {
            missing.push(*sched);
        }
    }
    check(missing.is_empty(), || {
        format!("schedulers not found: {missing:?}")
    })?;
    check(!scheduler_probe(&mut ipvs, "nosuch")?, || {
        "nosuch accepted".into()
    })?;
    let op = IpvsOp::AddService(VirtualServer::new(
        key("10.96.0.9:80", proto::TCP),
        "nosuch",
    ));
    let results = ipvs.apply(&[op])?;
    let code = results[0].as_ref().err().map(|e| e.errno());
    check(code == Some(Errno::ENOENT), || format!("{results:?}"))?;
    check(ipvs.services()?.is_empty(), || {
        "probes left services behind".into()
    })
}

/// 10,000 virtual servers × 10 real servers: one `apply` of 110,000 ops, then a full dump,
/// then a flush; times printed.
fn ten_thousand_services_with_ten_dests() -> Result<(), Failed> {
    const SERVICES: u32 = 10_000;
    const DESTS: u32 = 10;
    let ns = Netns::new("vm-10k")?;
    let mut ipvs = ipvs_in(&ns)?;
    let vip = |i: u32| IpAddr::V4(Ipv4Addr::from(0x0a60_0000 + i));
    let mut ops = Vec::with_capacity((SERVICES * (DESTS + 1)) as usize);
    for i in 0..SERVICES {
        let key = ServiceKey::new(vip(i), proto::TCP, 80);
        ops.push(IpvsOp::AddService(VirtualServer::new(key, "rr")));
        for d in 0..DESTS {
            let addr = IpAddr::V4(Ipv4Addr::from(0x0af4_0000 + i * DESTS + d));
            ops.push(IpvsOp::AddDest(key, RealServer::new(addr, 8080, 1)));
        }
    }
    let started = Instant::now();
    let results = ipvs.apply(&ops)?;
    let apply = started.elapsed();
    all_ok(&results)?;

    let started = Instant::now();
    let services = ipvs.services()?;
    let services_dump = started.elapsed();
    let started = Instant::now();
    let mut dests = 0;
    for vs in &services {
        let got = ipvs.destinations(&vs.key)?;
        check(got.len() == DESTS as usize, || {
            format!("{}: {} real servers", vs.key, got.len())
        })?;
        dests += got.len();
    }
    let dests_dump = started.elapsed();
    let started = Instant::now();
    ipvs.flush()?;
    let flush = started.elapsed();
    eprintln!(
        "IPVS in the guest (software emulation): apply {} ops {apply:.2?} ({:.1} µs/op); \
         dump {} services {services_dump:.2?}; dump their {dests} real servers \
         ({} dumps) {dests_dump:.2?}; flush {flush:.2?}",
        ops.len(),
        apply.as_secs_f64() * 1e6 / ops.len() as f64,
        services.len(),
        services.len(),
    );
    check(services.len() == SERVICES as usize, || {
        format!("{} services dumped", services.len())
    })?;
    check(ipvs.services()?.is_empty(), || "flush left services".into())
}

/// What `ipvsadm` can make but kube-proxy never does: a firewall-mark service (skipped
/// with a warning), scheduler flags, one-packet scheduling, tunnel and direct-routing real
/// servers with connection thresholds. Read without panics, as the kernel reports them.
fn odd_entries_made_by_ipvsadm_are_read() -> Result<(), Failed> {
    let ns = Netns::new("vm-odd")?;
    for args in [
        "-A -f 7 -s rr",
        "-a -f 7 -r 10.1.0.9 -g",
        "-A -t 10.96.0.30:80 -s sh -b sh-port,sh-fallback",
        "-a -t 10.96.0.30:80 -r 10.1.0.1:80 -i -w 2 -x 100 -y 10",
        "-a -t 10.96.0.30:80 -r 10.1.0.2:80 -g -w 0",
        "-A -u 10.96.0.31:53 -s rr -o",
        "-A -t [fd00::31]:80 -s mh -b mh-port -p 60 -M 64",
        "-a -t [fd00::31]:80 -r 10.1.0.3:80 -i",
    ] {
        ns.run("ipvsadm", args.split(' '))?;
    }
    let mut ipvs = ipvs_in(&ns)?;
    let state = sorted(dump_all(&mut ipvs)?);
    let summary: Vec<_> = state
        .iter()
        .map(|(vs, d)| (vs.key.to_string(), vs.scheduler.clone(), vs.flags, d.len()))
        .collect();
    check(state.len() == 3, || {
        format!("fwmark not skipped? {summary:?}")
    })?;
    let (sh, sh_dests) = &state[0];
    check(
        sh.scheduler == "sh"
            && sh.flags & (SVC_F_SCHED1 | SVC_F_SCHED2) == SVC_F_SCHED1 | SVC_F_SCHED2,
        || format!("{sh:?}"),
    )?;
    let tunnel = sh_dests
        .iter()
        .find(|d| d.port == 80 && d.addr == IpAddr::from([10, 1, 0, 1]));
    check(
        tunnel.is_some_and(|d| d.forward == Forward::Tunnel && d.weight == 2),
        || format!("{sh_dests:?}"),
    )?;
    check(
        sh_dests
            .iter()
            .any(|d| d.forward == Forward::Route && d.weight == 0),
        || format!("{sh_dests:?}"),
    )?;
    let (udp, _) = &state[1];
    check(udp.flags & SVC_F_ONEPACKET != 0, || format!("{udp:?}"))?;
    let (mh, mh_dests) = &state[2];
    check(
        mh.flags & SVC_F_PERSISTENT != 0 && mh.timeout == 60 && mh.netmask == 64,
        || format!("{mh:?}"),
    )?;
    // An IPv4 tunnel real server on an IPv6 service: the kernel reports its own family.
    check(
        mh_dests.len() == 1 && mh_dests[0].addr.is_ipv4() && mh_dests[0].forward == Forward::Tunnel,
        || format!("{mh_dests:?}"),
    )?;
    // The real servers of something that does not exist: an empty dump, not an error.
    let none = ipvs.destinations(&key("10.96.0.99:1", proto::TCP))?;
    check(none.is_empty(), || format!("{none:?}"))?;
    // Our flush removes what ipvsadm made, firewall marks included.
    ipvs.flush()?;
    let listing = ns.run("ipvsadm", ["-Ln"])?;
    check(!listing.contains("FWM"), || listing.clone())
}

/// `ipvsadm --set` over netlink: a fresh namespace has the kernel defaults; 0 leaves a
/// timeout; `ipvsadm -L --timeout` agrees; above `INT_MAX / HZ` is `EINVAL`; the fake
/// answers the same sequence the same way.
fn timeouts_set_and_read_back() -> Result<(), Failed> {
    let ns = Netns::new("vm-timeout")?;
    let mut ipvs = ipvs_in(&ns)?;
    let mut fake = FakeIpvs::new();
    let mut ops: [&mut dyn IpvsOps; 2] = [&mut ipvs, &mut fake];
    let mut seen = Vec::new();
    for ops in &mut ops {
        let mut steps = vec![ops.timeouts()?];
        ops.set_timeouts(IpvsTimeouts::new(3600, 0, 60))?;
        steps.push(ops.timeouts()?);
        ops.set_timeouts(IpvsTimeouts::new(0, 30, 0))?;
        steps.push(ops.timeouts()?);
        let err = ops
            .set_timeouts(IpvsTimeouts::new(i32::MAX as u32, 1, 1))
            .err()
            .and_then(|e| e.code());
        steps.push(ops.timeouts()?);
        ops.set_timeouts(IpvsTimeouts::new(TIMEOUT_MAX, 0, 0))?;
        steps.push(ops.timeouts()?);
        ops.set_timeouts(IpvsTimeouts::new(900, 0, 0))?;
        seen.push((steps, err));
    }
    check(seen[0] == seen[1], || {
        format!("kernel {:?}\nfake {:?}", seen[0], seen[1])
    })?;
    let (steps, err) = &seen[0];
    check(
        steps[..3]
            == [
                IpvsTimeouts::KERNEL_DEFAULTS,
                IpvsTimeouts::new(3600, 120, 60),
                IpvsTimeouts::new(3600, 30, 60),
            ]
            && *err == Some(Errno::EINVAL as i32),
        || format!("{seen:?}"),
    )?;
    let listed = ns.run("ipvsadm", ["-L", "--timeout"])?;
    let ours = ipvs.timeouts()?;
    check(
        listed.trim() == ours.to_string() && ours == IpvsTimeouts::new(900, 30, 60),
        || format!("ipvsadm says {listed:?}, we read {ours}"),
    )?;
    // ipvsadm's --set reaches what we read, and per namespace only.
    ns.run("ipvsadm", ["--set", "100", "20", "30"])?;
    check(ipvs.timeouts()? == IpvsTimeouts::new(100, 20, 30), || {
        "ipvsadm --set not read back".into()
    })?;
    let other = Netns::new("vm-timeout2")?;
    let fresh = ipvs_in(&other)?.timeouts()?;
    check(fresh == IpvsTimeouts::KERNEL_DEFAULTS, || {
        format!("another namespace has {fresh}")
    })
}

/// Hex in the `src/ipvs/testdata/*.hex` format: `# datagram <direction> <n> bytes`, then
/// 16 bytes a line.
fn hex_datagrams(captured: &[Captured]) -> String {
    let mut out = String::new();
    for c in captured {
        let dir = match c.direction {
            Direction::Sent => "sent",
            Direction::Received => "received",
        };
        out.push_str(&format!("# datagram {dir} {} bytes\n", c.bytes.len()));
        for line in c.bytes.chunks(16) {
            let hex: Vec<String> = line.iter().map(|b| format!("{b:02x}")).collect();
            out.push_str(&hex.join(" "));
            out.push('\n');
        }
    }
    out
}

/// Builds the known table the host-side tests expect (src/ipvs/wire/kernel_tests.rs) and
/// captures: the batch that made it and its acknowledgements, the services dump, the
/// real-server dumps of two services, `IPVS_CMD_GET_INFO` and `IPVS_CMD_GET_CONFIG`. The
/// dumps must decode to the table here too; with `KP_IPVS_PRINT_GOLDEN=1` the captures are
/// printed between `=== golden NAME ===` and `=== end ===`.
fn golden_captures_of_a_known_table() -> Result<(), Failed> {
    let ns = Netns::new("vm-golden")?;
    let mut ipvs = ipvs_in(&ns)?;
    let api = VirtualServer {
        netmask: netmask_v4(Ipv4Addr::new(255, 255, 255, 0)),
        ..VirtualServer::new(key("10.96.0.1:443", proto::TCP), "rr").persistent(10800)
    };
    let dns6 = VirtualServer {
        flags: SVC_F_SCHED1 | SVC_F_SCHED2,
        ..VirtualServer::new(key("[fd00:10:96::a]:53", proto::UDP), "sh")
    };
    let sctp = VirtualServer::new(key("10.96.0.20:7777", proto::SCTP), "wlc");
    let api_dests = [
        rs("192.168.56.10:6443", 1),
        RealServer {
            forward: Forward::Route,
            ..rs("192.168.56.11:6443", 0)
        },
        RealServer {
            forward: Forward::Tunnel,
            ..rs("192.168.56.12:6443", 5)
        },
    ];
    let dns6_dest = rs("[fd00:10:244::5]:53", 3);
    let mut ops = vec![
        IpvsOp::AddService(api.clone()),
        IpvsOp::AddService(dns6.clone()),
        IpvsOp::AddService(sctp.clone()),
    ];
    ops.extend(
        api_dests
            .iter()
            .map(|d| IpvsOp::AddDest(api.key, d.clone())),
    );
    ops.push(IpvsOp::AddDest(dns6.key, dns6_dest.clone()));
    ipvs.set_timeouts(IpvsTimeouts::new(3600, 0, 60))?;

    ipvs.set_capture(true);
    all_ok(&ipvs.apply(&ops)?)?;
    let apply = ipvs.take_captured();
    let services = ipvs.services()?;
    let services_dump = ipvs.take_captured();
    let got_api = ipvs.destinations(&api.key)?;
    let api_dump = ipvs.take_captured();
    let got_dns6 = ipvs.destinations(&dns6.key)?;
    let dns6_dump = ipvs.take_captured();
    let info = ipvs.info()?;
    let info_capture = ipvs.take_captured();
    let timeouts = ipvs.timeouts()?;
    let config_capture = ipvs.take_captured();
    ipvs.set_capture(false);

    let mut services_sorted = services.clone();
    services_sorted.sort_by_key(|vs| vs.key);
    let want = [&api, &sctp, &dns6];
    check(
        services_sorted.len() == 3
            && services_sorted
                .iter()
                .zip(want)
                .all(|(g, w)| g.same_config(w)),
        || format!("{services:#?}"),
    )?;
    let mut sorted_api = got_api.clone();
    sorted_api.sort_by_key(|d| (d.addr, d.port));
    check(sorted_api == api_dests, || format!("{got_api:#?}"))?;
    check(got_dns6 == [dns6_dest], || format!("{got_dns6:#?}"))?;
    check(timeouts == IpvsTimeouts::new(3600, 120, 60), || {
        format!("{timeouts}")
    })?;
    eprintln!(
        "captured {} + {} + {} + {} + {} + {} datagrams; {info:?}; kernel order: services \
         {:?}, api real servers {:?}",
        apply.len(),
        services_dump.len(),
        api_dump.len(),
        dns6_dump.len(),
        info_capture.len(),
        config_capture.len(),
        services
            .iter()
            .map(|s| s.key.to_string())
            .collect::<Vec<_>>(),
        got_api.iter().map(|d| d.socket_addr()).collect::<Vec<_>>(),
    );
    if std::env::var_os("KP_IPVS_PRINT_GOLDEN").is_some_and(|v| v == "1") {
        let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
        for (name, capture) in [
            ("kernel_apply", &apply),
            ("kernel_services_dump", &services_dump),
            ("kernel_dests_api", &api_dump),
            ("kernel_dests_dns6", &dns6_dump),
            ("kernel_info", &info_capture),
            ("kernel_config", &config_capture),
        ] {
            println!(
                "=== golden {name} ===\n# captured with Ipvs::set_capture in the kp_testkit::vm \
                 guest (Linux {}), family id {:#x}\n{}=== end ===",
                release.trim(),
                ipvs.family_id(),
                hex_datagrams(capture)
            );
        }
    }
    Ok(())
}

/// `ensure_dummy("kube-ipvs0")` makes a dummy (`ip -d link show` says so), left down,
/// idempotent; 1,000 IPv4 and 100 IPv6 host addresses added and deleted in bulk;
/// `delete_link`.
fn kube_ipvs0_dummy_with_addresses_in_bulk() -> Result<(), Failed> {
    let ns = Netns::new("vm-dummy")?;
    let mut links = links_in(&ns)?;
    let index = links.ensure_dummy(KUBE_IPVS0)?;
    check(links.ensure_dummy(KUBE_IPVS0)? == index, || {
        "ensure_dummy not idempotent".into()
    })?;
    check(links.link_index(KUBE_IPVS0)? == Some(index), || {
        "link_index".into()
    })?;
    let show = ns.ip(["-d", "link", "show", KUBE_IPVS0])?;
    check(
        show.contains("\n    dummy") || show.contains(" dummy "),
        || format!("not a dummy: {show}"),
    )?;
    check(show.contains("state DOWN"), || format!("not down: {show}"))?;

    let v4: Vec<IpAddr> = (0..1_000u32)
        .map(|i| IpAddr::V4(Ipv4Addr::from(0x0a60_0000 + i)))
        .collect();
    let v6: Vec<IpAddr> = (1..=100u128)
        .map(|i| {
            IpAddr::V6(Ipv6Addr::from(
                0xfd00_0000_0000_0000_0000_0000_0096_0000 + i,
            ))
        })
        .collect();
    let all: Vec<IpAddr> = v4.iter().chain(&v6).copied().collect();
    let started = Instant::now();
    let added = links.add_addresses(KUBE_IPVS0, &all)?;
    let add = started.elapsed();
    check(added.iter().all(Result::is_ok), || {
        format!("{:?}", added.iter().find(|r| r.is_err()))
    })?;
    let mut have = links.addresses(KUBE_IPVS0)?;
    have.sort();
    let mut want = all.clone();
    want.sort();
    check(have == want, || {
        format!("{} addresses listed, {} added", have.len(), want.len())
    })?;
    let shown = ns.ip(["-o", "addr", "show", "dev", KUBE_IPVS0])?;
    check(
        shown.contains("inet 10.96.3.231/32 scope global kube-ipvs0")
            && shown.contains("inet6 fd00::96:64/128 scope global"),
        || format!("ip addr show: {}", &shown[..600.min(shown.len())]),
    )?;
    let again = links.add_addresses(KUBE_IPVS0, &all[..10])?;
    check(again.iter().all(Result::is_ok), || "re-adding".into())?;
    let started = Instant::now();
    let deleted = links.del_addresses(KUBE_IPVS0, &all)?;
    let del = started.elapsed();
    check(deleted.iter().all(Result::is_ok), || "deleting".into())?;
    check(links.addresses(KUBE_IPVS0)?.is_empty(), || {
        "addresses left".into()
    })?;
    eprintln!("kube-ipvs0 in the guest: add 1,100 addresses {add:.2?}, delete them {del:.2?}");
    check(links.delete_link(KUBE_IPVS0)?, || "delete_link".into())?;
    check(!links.delete_link(KUBE_IPVS0)?, || "deleted twice".into())?;
    check(links.link_index(KUBE_IPVS0)?.is_none(), || {
        "still there".into()
    })
}

fn main() {
    kp_testkit::vm::run_tests(vec![
        Trial::test(
            "ipvs_round_trip_equals_the_fake",
            ipvs_round_trip_equals_the_fake,
        ),
        Trial::test(
            "persistent_and_ipv6_services_read_back",
            persistent_and_ipv6_services_read_back,
        ),
        Trial::test(
            "every_upstream_scheduler_is_probed",
            every_upstream_scheduler_is_probed,
        ),
        Trial::test(
            "ten_thousand_services_with_ten_dests",
            ten_thousand_services_with_ten_dests,
        ),
        Trial::test(
            "odd_entries_made_by_ipvsadm_are_read",
            odd_entries_made_by_ipvsadm_are_read,
        ),
        Trial::test("timeouts_set_and_read_back", timeouts_set_and_read_back),
        Trial::test(
            "golden_captures_of_a_known_table",
            golden_captures_of_a_known_table,
        ),
        Trial::test(
            "kube_ipvs0_dummy_with_addresses_in_bulk",
            kube_ipvs0_dummy_with_addresses_in_bulk,
        ),
    ]);
}
