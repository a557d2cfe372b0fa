//! The quick benchmark, end to end, as root in network namespaces: every mode at CI sizes
//! (100 Services, 200 probes). Asserts that every output is produced and sane; it asserts
//! no timing, so a slow or busy CI machine cannot make it fail, and it keeps `kp-bench all`
//! from rotting.

use std::path::PathBuf;

use kp_bench::{AllOptions, run_all};

#[test]
fn quick_benchmark_produces_sane_outputs() {
    if !kp_testkit::require_root() {
        return;
    }
    let dir = tempfile::tempdir().expect("temporary directory");
    let mut opts = AllOptions::quick();
    opts.rss_binary = Some(PathBuf::from(env!("CARGO_BIN_EXE_kp-bench")));
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
    assert_eq!(json["control"].as_array().map(Vec::len), Some(modes));
    let md = std::fs::read_to_string(dir.path().join("results.md")).unwrap();
    for m in kp_bench::Mode::HOST {
        assert!(md.contains(m.label()), "results.md mentions {}", m.label());
    }
    assert!(
        std::fs::read_to_string(dir.path().join("machine.md"))
            .unwrap()
            .contains("Linux")
    );

    assert_eq!(
        report.control.len(),
        modes,
        "one control-plane point per mode"
    );
    for c in &report.control {
        assert_eq!(c.services, 100);
        assert!(c.render_ms > 0.0 && c.render_ms.is_finite(), "{c:?}");
        assert!(c.payload_bytes > 10_000 && c.payload_lines > 500, "{c:?}");
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
            assert!(ch.bytes > 0, "{ch:?}");
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
        assert_eq!(d.positions.len(), 2, "first and last");
        for p in &d.positions {
            assert!(p.connect.n + p.connect.failed == 200);
            assert!(
                p.connect.n >= 190,
                "probes through the ClusterIP work: {p:?}"
            );
            assert!(p.connect.p50_us > 0.0 && p.connect.p50_us <= p.connect.p99_us);
            assert!(p.keepalive.requests > 0 && p.keepalive.rps > 0.0, "{p:?}");
            assert!(p.close.requests > 0 && p.close.connections > 0, "{p:?}");
            assert!(p.close.cpu_ms_per_1k.is_finite(), "{p:?}");
        }
    }
}
