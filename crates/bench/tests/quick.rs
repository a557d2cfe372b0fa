//! The quick benchmark, end to end, as root in network namespaces: every host mode at CI
//! sizes (100 Services, 200 probes), userspace mode (its relay in this process) and the
//! direct baseline included, in two interleaved rounds. Asserts that every output is
//! produced and sane; it asserts no timing, so a slow or busy CI machine cannot make it
//! fail, and it keeps `kp-bench all` from rotting.

use std::path::PathBuf;

use kp_bench::{AllOptions, run_all};

/// The kube-proxy-rs binary of this build (same target directory and profile as kp-bench),
/// built first: cargo builds only this package's binaries for its tests. Cargo holds its
/// build lock only while compiling, so this nested build does not wait for the outer one.
fn proxy_binary() -> PathBuf {
    let bench = PathBuf::from(env!("CARGO_BIN_EXE_kp-bench"));
    let release = bench
        .parent()
        .is_some_and(|d| d.file_name().is_some_and(|n| n == "release"));
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = std::process::Command::new(cargo);
    cmd.args(["build", "-p", "kube-proxy-rs", "--bin", "kube-proxy-rs"])
        .current_dir(env!("CARGO_MANIFEST_DIR"));
    if release {
        cmd.arg("--release");
    }
    let status = cmd.status().expect("cargo runs");
    assert!(status.success(), "building kube-proxy-rs: {status}");
    let binary = bench.with_file_name("kube-proxy-rs");
    assert!(binary.is_file(), "{} was built", binary.display());
    binary
}

#[test]
fn quick_benchmark_produces_sane_outputs() {
    if !kp_testkit::require_root() {
        return;
    }
    let dir = tempfile::tempdir().expect("temporary directory");
    let mut opts = AllOptions::quick();
    opts.rss_binary = Some(PathBuf::from(env!("CARGO_BIN_EXE_kp-bench")));
    opts.proxy_binary = Some(proxy_binary());
    opts.command = "quick test".into();
    let report = run_all(&opts).expect("the quick benchmark runs");
    let files = report.write(dir.path()).expect("outputs are written");

    for name in [
        "results.json",
        "results.md",
        "machine.md",
        "latency-p50.svg",
        "latency-p99.svg",
        "cpu-per-1k-connections.svg",
        "rps-new-connection.svg",
        kp_bench::report::BULK_CHART,
    ] {
        let p = dir.path().join(name);
        assert!(files.contains(&p), "{name} reported as written");
        let text = std::fs::read_to_string(&p).expect("output readable");
        assert!(!text.is_empty(), "{name} is empty");
        if name.ends_with(".svg") {
            assert!(text.contains("<svg"), "{name} is an SVG");
            for m in kp_bench::Mode::HOST {
                assert!(
                    text.contains(m.label()),
                    "{name} has a line for {}",
                    m.label()
                );
            }
        }
    }
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("results.json")).unwrap())
            .expect("results.json parses");
    let modes = kp_bench::Mode::HOST.len();
    // The direct baseline has no control plane.
    let with_rules = kp_bench::Mode::HOST
        .iter()
        .filter(|m| m.has_rules())
        .count();
    assert_eq!(json["control"].as_array().map(Vec::len), Some(with_rules));
    let md = std::fs::read_to_string(dir.path().join("results.md")).unwrap();
    for m in kp_bench::Mode::HOST {
        assert!(md.contains(m.label()), "results.md mentions {}", m.label());
    }
    for section in [
        "## Bulk throughput",
        "## Against a direct connection",
        "## Daemon peak RSS, MiB",
    ] {
        assert!(md.contains(section), "results.md has {section}");
    }
    // The report reads back from its JSON (`kp-bench report`).
    let back: kp_bench::report::RunReport =
        serde_json::from_value(json.clone()).expect("results.json reads back");
    assert_eq!(back.datapath.len(), report.datapath.len());
    assert!(
        std::fs::read_to_string(dir.path().join("machine.md"))
            .unwrap()
            .contains("Linux")
    );

    assert_eq!(
        report.control.len(),
        with_rules,
        "one control-plane point per mode with rules"
    );
    for c in &report.control {
        assert_eq!(c.services, 100);
        assert!(c.render_ms > 0.0 && c.render_ms.is_finite(), "{c:?}");
        // iptables: 5 or more lines per Service; userspace mode: a couple (its portals).
        assert!(
            c.payload_bytes > 10_000 && c.payload_lines > c.services,
            "{c:?}"
        );
        assert!(
            c.floor.ms().is_some(),
            "the kernel tool loads 100 Services: {c:?}"
        );
        assert!(c.cold_sync.ms().is_some(), "cold sync: {c:?}");
        assert!(c.resync.ms().is_some(), "resync: {c:?}");
        assert!(c.overhead_ratio.is_some_and(|r| r > 0.0));
        assert_eq!(c.changes.len(), 3, "three one-Service changes");
        for ch in &c.changes {
            assert!(ch.sync.ms().is_some(), "{ch:?}");
            // In userspace mode an endpoint change only updates the relay: no rule changes.
            let relay_only = c.mode == "userspace" && ch.what == "change one endpoint";
            assert_eq!(ch.bytes == 0, relay_only, "{} {ch:?}", c.mode);
        }
        let (peak, state) = (c.peak_rss_mib.unwrap(), c.state_rss_mib.unwrap());
        assert!(state > 0.0 && peak >= state && peak < 1024.0, "{c:?}");
        if c.mode.starts_with("iptables") {
            assert!(c.save_tool.ms().is_some() && c.save_parse_ms.is_some());
        }
    }
    assert_eq!(report.datapath.len(), 2 * modes, "two sizes × every mode");
    for d in &report.datapath {
        assert!(d.load.ms().is_some(), "rules loaded: {d:?}");
        let direct = d.mode == "direct";
        if direct {
            assert_eq!(d.positions.len(), 1, "the pods: {d:?}");
            assert_eq!(d.positions[0].position, "pod");
        } else {
            assert_eq!(d.positions.len(), 2, "first and last");
        }
        for p in &d.positions {
            let what = format!("{} {} {}", d.mode, d.services, p.position);
            assert!(p.connect.n + p.connect.failed == 200, "{what}");
            assert!(
                p.connect.n >= 190,
                "probes through the ClusterIP work: {what} {p:?}"
            );
            assert!(p.connect.p50_us > 0.0 && p.connect.p50_us <= p.connect.p99_us);
            assert!(p.request.n + p.request.failed == 200, "{what}");
            assert!(p.request.n >= 190, "requests answered: {what} {p:?}");
            assert!(p.request.p50_us > 0.0 && p.request.p50_us <= p.request.p99_us);
            assert!(
                p.keepalive.requests > 0 && p.keepalive.rps > 0.0,
                "{what} {p:?}"
            );
            assert_eq!(p.keepalive.round_rps.len(), 2, "two rounds: {what}");
            assert!(
                p.close.requests > 0 && p.close.connections > 0,
                "{what} {p:?}"
            );
            assert!(p.close.cpu_ms_per_1k.is_finite(), "{what} {p:?}");
            assert!(p.close.process_cpu_ms > 0.0, "{what} {p:?}");
            // Only userspace mode has a proxy process (the relay) whose CPU is counted.
            if d.mode == "userspace" {
                assert!(p.close.proxy_cpu_ms > 0.0, "the relay worked: {what} {p:?}");
            } else {
                assert!(p.close.proxy_cpu_ms.is_nan(), "{what} {p:?}");
            }
            assert_eq!(p.bulk.len(), 2, "1 and 4 streams: {what}");
            for b in &p.bulk {
                assert_eq!(b.failed, 0, "{what} {b:?}");
                assert!(
                    b.bytes > 0 && b.mb_per_s > 0.0,
                    "bytes streamed: {what} {b:?}"
                );
                assert_eq!(b.round_mb_per_s.len(), 2, "{what} {b:?}");
            }
        }
    }
    // The daemon's own memory: every host mode with a daemon, from every source, at 100
    // Services.
    let daemon_modes: Vec<_> = kp_bench::Mode::HOST
        .iter()
        .filter_map(|m| m.daemon_mode())
        .collect();
    assert_eq!(
        report.daemon.len(),
        daemon_modes.len() * kp_testkit::rss::Source::ALL.len()
    );
    for p in &report.daemon {
        let (hwm, rss) = (p.hwm_mib.unwrap_or_default(), p.rss_mib.unwrap_or_default());
        assert!(
            rss > 1.0 && hwm >= rss && hwm < 1024.0,
            "the daemon's memory was read: {p:?}"
        );
        assert_eq!(p.services, 100);
    }
}
