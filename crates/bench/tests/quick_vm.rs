//! The IPVS part of the quick benchmark, in the qemu guest of `kp_testkit::vm` (this
//! machine's kernel has no IPVS; docs/vm.md): IPVS mode at tiny sizes (20 Services, 20
//! probes, the probed Service last), control plane and datapath, through the same
//! [`run_all`] that `kp-bench vm` runs in the guest, and the report's JSON round trip and
//! outputs (with the guest-only charts). Asserts that everything is produced and sane, no
//! timing, so it cannot rot; one boot, about a minute.

use std::path::PathBuf;
use std::time::Duration;

use kp_bench::report::RunReport;
use kp_bench::{AllOptions, Mode, run_all};
use libtest_mimic::{Failed, Trial};

const SERVICES: usize = 20;

fn ipvs_quick_benchmark() -> Result<(), Failed> {
    let opts = AllOptions {
        modes: vec![Mode::Ipvs],
        control_sizes: vec![SERVICES],
        datapath_sizes: vec![SERVICES],
        runs: 1,
        probes: 20,
        probe_endpoints: kp_bench::datapath::DEFAULT_PROBE_ENDPOINTS,
        rps_seconds: 0.3,
        concurrency: 1,
        tool_timeout: Duration::from_secs(120),
        rss_binary: Some(PathBuf::from(env!("CARGO_BIN_EXE_kp-bench"))),
        positions: vec!["last".into()],
        keepalive: false,
        bulk_seconds: 0.0,
        bulk_streams: Vec::new(),
        rounds: 1,
        // The daemon's memory is not measured in the guest here.
        daemon_sizes: Vec::new(),
        daemon_sources: Vec::new(),
        proxy_binary: None,
        daemon_timeout: Duration::from_secs(120),
        daemon_settle: Duration::from_secs(1),
        quick: true,
        command: "quick_vm test".into(),
    };
    let report = run_all(&opts)?;
    assert!(
        report.environment.is_some(),
        "a report made in the guest says so"
    );

    assert_eq!(report.control.len(), 1, "{:?}", report.control);
    let c = &report.control[0];
    assert_eq!(c.mode, "ipvs");
    // 20 ClusterIPs and 2 NodePorts (one Service in ten) on the node address, 10 real
    // servers each.
    assert_eq!(c.ipvs_requests, Some(22 * 11), "{c:?}");
    assert!(c.render_ms.is_finite() && c.payload_bytes > 1000, "{c:?}");
    assert!(
        c.floor.ms().is_some(),
        "ipset restore + ipvsadm --restore: {c:?}"
    );
    assert!(c.cold_sync.ms().is_some(), "cold sync: {c:?}");
    assert!(c.resync.ms().is_some(), "resync: {c:?}");
    assert!(c.save_tool.ms().is_some(), "ipvsadm -S -n: {c:?}");
    assert_eq!(c.changes.len(), 3, "three one-Service changes: {c:?}");
    for ch in &c.changes {
        assert!(ch.sync.ms().is_some() && ch.bytes > 0, "{ch:?}");
    }
    let (peak, state) = (c.peak_rss_mib.unwrap(), c.state_rss_mib.unwrap());
    assert!(state > 0.0 && peak >= state && peak < 1024.0, "{c:?}");

    assert_eq!(report.datapath.len(), 1, "{:?}", report.datapath);
    for d in &report.datapath {
        assert!(d.load.ms().is_some(), "rules loaded: {d:?}");
        assert_eq!(d.positions.len(), 1, "last only: {d:?}");
        let p = &d.positions[0];
        assert_eq!(p.position, "last");
        assert_eq!(p.connect.n + p.connect.failed, 20);
        assert!(p.connect.n >= 18, "probes through IPVS work: {p:?}");
        assert!(p.connect.p50_us > 0.0 && p.connect.p50_us <= p.connect.p99_us);
        assert!(
            p.close.requests > 0 && p.close.cpu_ms_per_1k.is_finite(),
            "{p:?}"
        );
        assert!(p.keepalive.rps.is_nan(), "no keepalive run: {p:?}");
    }

    // What `kp-bench vm` does with the guest's report: JSON there and back, then the files.
    let json = serde_json::to_string(&report)?;
    let back: RunReport = serde_json::from_str(&json)?;
    assert_eq!(back.control.len(), 1);
    assert_eq!(back.datapath.len(), 1);
    assert!(back.datapath[0].positions[0].keepalive.rps.is_nan());
    let dir = tempfile::tempdir()?;
    let files = back.write(dir.path())?;
    for name in ["results.md", "ipvs-vm-datapath.svg", "ipvs-vm-cpu.svg"] {
        let p = dir.path().join(name);
        assert!(files.contains(&p), "{name} written");
        let text = std::fs::read_to_string(&p)?;
        assert!(text.contains("ipvs"), "{name} mentions ipvs");
    }
    Ok(())
}

fn main() {
    kp_testkit::vm::run_tests(vec![Trial::test(
        "ipvs_quick_benchmark",
        ipvs_quick_benchmark,
    )]);
}
