//! Upstream kube-proxy's command line is accepted as it is: a kubeadm-style DaemonSet
//! command line with every upstream flag, the bind-address checks, and the conntrack
//! sysctls applied inside a network namespace the test creates (never the root one).

mod common;

use std::process::Command;

use common::{BIN, Daemon, Mode, NODE_ARGS, SEED_MANIFEST as SEED, run_code as run};
use kp_testkit::{Netns, require_root};
/// Every upstream Linux flag, in upstream's syntax, as a DaemonSet might pass them.
const UPSTREAM_FLAGS: &[&str] = &[
    "--hostname-override=k8s-master",
    "--v=2",
    "--bind-address=0.0.0.0",
    "--bind-address-hard-fail=false",
    "--cluster-cidr=10.0.0.0/16",
    "--config-sync-period=15m0s",
    "--conntrack-max-per-core=32768",
    "--conntrack-min=131072",
    "--conntrack-tcp-be-liberal=false",
    "--conntrack-tcp-timeout-close-wait=1h0m0s",
    "--conntrack-tcp-timeout-established=24h0m0s",
    "--conntrack-udp-timeout=0s",
    "--conntrack-udp-timeout-stream=0s",
    "--detect-local-mode=ClusterCIDR",
    "--feature-gates=NFTablesProxyMode=true,AllAlpha=false,SomeFutureGate=true",
    "--healthz-bind-address=0.0.0.0:10256",
    "--healthz-port=10256",
    "--metrics-port=10249",
    "--init-only=false",
    "--iptables-localhost-nodeports=true",
    "--iptables-masquerade-bit=14",
    "--iptables-min-sync-period=1s",
    "--iptables-sync-period=30s",
    "--ipvs-exclude-cidrs=10.1.0.0/16,10.2.0.0/16",
    "--ipvs-min-sync-period=0s",
    "--ipvs-scheduler=rr",
    "--ipvs-strict-arp=false",
    "--ipvs-sync-period=30s",
    "--ipvs-tcp-timeout=0s",
    "--ipvs-tcpfin-timeout=0s",
    "--ipvs-udp-timeout=0s",
    "--kube-api-burst=10",
    "--kube-api-content-type=application/vnd.kubernetes.protobuf",
    "--kube-api-qps=5",
    "--log-flush-frequency=5s",
    "--log-json-info-buffer-size=0",
    "--log-json-split-stream=false",
    "--log-text-info-buffer-size=0",
    "--log-text-split-stream=false",
    "--logging-format=text",
    "--masquerade-all=false",
    "--metrics-bind-address=127.0.0.1:10249",
    "--nodeport-addresses=0.0.0.0/0",
    "--oom-score-adj=-999",
    "--pod-bridge-interface=cbr0",
    "--pod-interface-name-prefix=veth",
    "--profiling=false",
    "--proxy-mode=iptables",
    "--proxy-port-range=",
    "--show-hidden-metrics-for-version=",
    "--vmodule=proxier*=4",
    "--logtostderr=true",
    "--alsologtostderr",
    "--skip_headers=false",
    "--stderrthreshold=2",
];

#[test]
fn kubeadm_daemonset_command_line_is_accepted() {
    let dir = tempfile::tempdir().unwrap();
    // kubeadm's ConfigMap: a KubeProxyConfiguration at /var/lib/kube-proxy/config.conf.
    let config = dir.path().join("config.conf");
    std::fs::write(
        &config,
        "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n\
         clusterCIDR: 10.244.0.0/16\nmode: iptables\nconntrack:\n  maxPerCore: 1000\n\
         oomScoreAdj: -500\nfeatureGates:\n  TopologyAwareHints: true\n",
    )
    .unwrap();
    let config_flag = format!("--config={}", config.display());

    // kubeadm's own two flags plus every other upstream flag. As upstream, the file is the
    // configuration: only --hostname-override and the logging flags override it; every
    // other upstream flag is ignored, each with a warning.
    let written = dir.path().join("effective.conf");
    let write_flag = format!("--write-config-to={}", written.display());
    let mut args = vec![config_flag.as_str(), write_flag.as_str()];
    args.extend(UPSTREAM_FLAGS);
    let (rc, _, err) = run(&args);
    assert_eq!(rc, Some(0), "{err}");
    let text = std::fs::read_to_string(&written).unwrap();
    assert!(text.contains("clusterCIDR: 10.244.0.0/16"), "{text}");
    assert!(text.contains("maxPerCore: 1000"), "{text}");
    assert!(text.contains("oomScoreAdj: -500"), "{text}");
    assert!(text.contains("TopologyAwareHints: true"), "{text}");
    assert!(!text.contains("NFTablesProxyMode"), "{text}");
    assert!(text.contains("hostnameOverride: k8s-master"), "{text}");
    assert!(
        text.contains("verbosity: 2"),
        "-v overrides the file: {text}"
    );
    for flag in [
        "--cluster-cidr",
        "--conntrack-max-per-core",
        "--feature-gates",
        "--proxy-mode",
    ] {
        assert!(
            err.contains(&format!("{flag} is ignored: with --config")),
            "{flag}: {err}"
        );
    }
    assert!(!err.contains("--hostname-override is ignored"), "{err}");

    // Without the flags, the same file's values, and no warning.
    let (rc, _, err) = run(&[config_flag.as_str(), write_flag.as_str()]);
    assert_eq!(rc, Some(0), "{err}");
    assert!(!err.contains("is ignored"), "{err}");
    let text = std::fs::read_to_string(&written).unwrap();
    assert!(text.contains("maxPerCore: 1000"), "{text}");
    assert!(text.contains("oomScoreAdj: -500"), "{text}");
    assert!(text.contains("TopologyAwareHints: true"), "{text}");

    // The same command line runs (--dry-run against the seed manifests): ignored flags and
    // no-op flags are logged, not fatal.
    let mut args = vec!["--manifests", SEED, "--dry-run", config_flag.as_str()];
    args.extend(UPSTREAM_FLAGS);
    let (rc, out, err) = run(&args);
    assert_eq!(rc, Some(0), "{err}");
    assert!(out.contains("KUBE-SERVICES"), "{out}");
    assert!(err.contains("--feature-gates is ignored"), "{err}");
    assert!(err.contains("--vmodule"), "{err}");

    // Without --config every flag counts: unknown gates are logged, not fatal.
    let mut args = vec!["--manifests", SEED, "--dry-run"];
    args.extend(UPSTREAM_FLAGS);
    let (rc, out, err) = run(&args);
    assert_eq!(rc, Some(0), "{err}");
    assert!(out.contains("! -s 10.0.0.0/16"), "{out}");
    assert!(err.contains("SomeFutureGate"), "{err}");
}

#[test]
fn version_prints_and_exits() {
    let (rc, out, _) = run(&["--version"]);
    assert_eq!(rc, Some(0));
    assert!(out.starts_with("kube-proxy-rs "), "{out}");
}

#[test]
fn bad_values_are_rejected_naming_the_flag() {
    for (flag, value) in [
        ("--healthz-bind-address", "notanaddr"),
        ("--metrics-bind-address", "127.0.0.1:notaport"),
    ] {
        let arg = format!("{flag}={value}");
        for mode in [&["--dry-run"][..], &["--once"], &["--cleanup"], &[]] {
            let mut args = vec!["--manifests", SEED, arg.as_str()];
            args.extend(mode);
            let (rc, _, err) = run(&args);
            assert_eq!(rc, Some(1), "{args:?} was accepted: {err}");
            assert!(err.contains(flag) && err.contains(value), "{err}");
        }
    }
    for args in [
        &["--bind-address=notanip"][..],
        &["--oom-score-adj=-1001"],
        &["--conntrack-max-per-core=-1"],
        &["--feature-gates=NFTablesProxyMode=yes"],
        &["--conntrack-udp-timeout=30"],
    ] {
        let (rc, _, err) = run(args);
        assert_eq!(rc, Some(2), "{args:?}: {err}");
        let name = args[0].split('=').next().unwrap();
        assert!(err.contains(name), "{err}");
    }
    // A negative duration is a bad value, not an unknown flag, in either spelling.
    for args in [
        &["--iptables-min-sync-period", "-1s"][..],
        &["--iptables-min-sync-period=-1s"],
        &["--config-sync-period", "-15m"],
    ] {
        let (rc, _, err) = run(args);
        assert_eq!(rc, Some(2), "{args:?}: {err}");
        assert!(
            err.contains("durations cannot be negative")
                && err.contains(args[0].split('=').next().unwrap()),
            "{args:?}: {err}"
        );
        assert!(!err.contains("unexpected argument"), "{err}");
    }
}

#[test]
fn init_only_sets_conntrack_sysctls_in_its_namespace() {
    if !require_root() {
        return;
    }
    let key = "net.netfilter.nf_conntrack_tcp_timeout_established";
    let _ = Command::new("modprobe")
        .arg("nf_conntrack")
        .stderr(std::process::Stdio::null())
        .status();
    let ns = Netns::new("conntrack").unwrap();
    let Ok(before) = ns.read_sysctl(key) else {
        eprintln!("skipped: no nf_conntrack in this kernel");
        return;
    };
    let root_before =
        std::fs::read_to_string("/proc/sys/net/netfilter/nf_conntrack_tcp_timeout_established")
            .unwrap();
    let wanted = if before.trim() == "4321" {
        "4322"
    } else {
        "4321"
    };
    let established = format!("--conntrack-tcp-timeout-established={wanted}s");
    let out = ns
        .command(BIN)
        .args([
            "--init-only",
            established.as_str(),
            "--conntrack-tcp-timeout-close-wait=0",
            "--conntrack-udp-timeout=33s",
            "--conntrack-udp-timeout-stream=2m30s",
            "--conntrack-tcp-be-liberal",
            // nf_conntrack_max is global: left alone here, whatever the kernel allows.
            "--conntrack-max-per-core=0",
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert_eq!(ns.read_sysctl(key).unwrap().trim(), wanted);
    assert_eq!(
        ns.read_sysctl("net.netfilter.nf_conntrack_udp_timeout")
            .unwrap()
            .trim(),
        "33"
    );
    assert_eq!(
        ns.read_sysctl("net.netfilter.nf_conntrack_udp_timeout_stream")
            .unwrap()
            .trim(),
        "150"
    );
    assert_eq!(
        ns.read_sysctl("net.netfilter.nf_conntrack_tcp_be_liberal")
            .unwrap()
            .trim(),
        "1"
    );
    // The root namespace's value is untouched.
    assert_eq!(
        std::fs::read_to_string("/proc/sys/net/netfilter/nf_conntrack_tcp_timeout_established")
            .unwrap(),
        root_before
    );

    // With the defaults (what every daemon in a test namespace does): nf_conntrack_max is
    // read-only outside the initial namespace on most kernels, and the hash size is left
    // alone there; both are warnings, not failures.
    let out = ns.command(BIN).arg("--init-only").output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(ns.read_sysctl(key).unwrap().trim(), "86400");
}

#[test]
fn daemon_sets_conntrack_sysctls_and_oom_score_adj() {
    if !require_root() {
        return;
    }
    let ns = Netns::new("ct-daemon").unwrap();
    let key = "net.netfilter.nf_conntrack_tcp_timeout_close_wait";
    if ns.read_sysctl(key).is_err() {
        eprintln!("skipped: no nf_conntrack in this kernel");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut args = vec![
        "--manifests",
        SEED,
        // Raising needs no privilege (lowering needs CAP_SYS_RESOURCE, which a CI
        // container may not have: then it is a warning, see nodesetup's unit tests).
        "--oom-score-adj=500",
        "--conntrack-tcp-timeout-close-wait=1234s",
        "--conntrack-max-per-core=0",
    ];
    args.extend(NODE_ARGS);
    let mut proxy = Daemon::start(Mode::Iptables, &ns, dir.path(), &args, None);
    proxy.wait_programmed(&ns);
    assert_eq!(ns.read_sysctl(key).unwrap().trim(), "1234");
    // The default established timeout (24h) is applied too.
    assert_eq!(
        ns.read_sysctl("net.netfilter.nf_conntrack_tcp_timeout_established")
            .unwrap()
            .trim(),
        "86400"
    );
    let oom = std::fs::read_to_string(format!("/proc/{}/oom_score_adj", proxy.guard.id())).unwrap();
    assert_eq!(oom.trim(), "500", "{}", proxy.log());
    assert!(proxy.is_running(), "{}", proxy.log());
}

#[test]
fn cleanup_has_no_dry_run_and_ipvs_settings_are_checked_in_ipvs_mode_only() {
    let (rc, _, err) = run(&["--cleanup", "--dry-run"]);
    assert_eq!(rc, Some(1), "{err}");
    assert!(
        err.contains("--cleanup") && err.contains("--dry-run"),
        "{err}"
    );
    // A leftover IPVS typo does not stop iptables mode.
    let (rc, out, err) = run(&["--manifests", SEED, "--dry-run", "--ipvs-scheduler=bogus"]);
    assert_eq!(rc, Some(0), "{err}");
    assert!(out.contains("KUBE-SERVICES"), "{out}");
    for (bad, flag) in [
        (&["--ipvs-sync-period=0s"][..], "--ipvs-sync-period"),
        (
            &["--ipvs-min-sync-period=1m", "--ipvs-sync-period=30s"],
            "--ipvs-sync-period",
        ),
        (&["--ipvs-scheduler=fastest"], "--ipvs-scheduler"),
        (
            &["--ipvs-exclude-cidrs=10.0.0.0/33"],
            "--ipvs-exclude-cidrs",
        ),
    ] {
        let mut args = vec!["--proxy-mode=ipvs", "--manifests", SEED, "--dry-run"];
        args.extend(bad);
        let (rc, _, err) = run(&args);
        assert_eq!(rc, Some(1), "{args:?}: {err}");
        assert!(err.contains(flag), "{err}");
    }
}

/// `--dry-run` prints what the daemon would write on this node: `MASQUERADE --random-fully`
/// only where iptables has it (1.6.2 and later), as the daemon checks. iptables 1.6 has no
/// `iptables-nft`/`iptables-legacy` binaries, so the daemon runs `iptables` itself: the fake
/// is the only program on `PATH`.
#[test]
fn dry_run_checks_this_nodes_iptables_for_random_fully() {
    let fakes = tempfile::tempdir().unwrap();
    let script = fakes.path().join("iptables");
    std::fs::write(&script, "#!/bin/sh\necho 'iptables v1.6.1'\n").unwrap();
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    let dry = |path: Option<&std::path::Path>| {
        let mut cmd = Command::new(BIN);
        cmd.args(["--manifests", SEED, "--dry-run"]).args(NODE_ARGS);
        if let Some(p) = path {
            cmd.env("PATH", p);
        }
        let out = cmd.output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        text.split("# IPv6").next().unwrap().to_string()
    };
    let old = dry(Some(fakes.path()));
    assert!(old.contains("-j MASQUERADE"), "{old}");
    assert!(
        !old.contains("--random-fully"),
        "iptables 1.6.1 has no --random-fully:\n{old}"
    );
    if Command::new("iptables")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
    {
        let here = dry(None);
        assert!(here.contains("-j MASQUERADE --random-fully"), "{here}");
    }
}

/// `--bind-address` is upstream's override of the node's primary IP: NodePorts with
/// `--nodeport-addresses primary` (nftables mode's default) are served on it rather than on
/// the Node object's InternalIP. Checked on the dry run, which prints the daemon's rules.
#[test]
fn bind_address_overrides_the_primary_node_ip() {
    let dry = |extra: &[&str]| {
        let mut args = vec!["--manifests", SEED, "--dry-run", "--proxy-mode=nftables"];
        args.extend(NODE_ARGS);
        args.extend(extra);
        let (rc, out, err) = run(&args);
        assert_eq!(rc, Some(0), "{err}");
        out
    };
    // The IPv4 elements of `nodeport-ips` (`add element ip kube-proxy nodeport-ips {`, one
    // address a line, `}`).
    let node_ip_set = |out: &str| {
        out.split("add element ip kube-proxy nodeport-ips {")
            .nth(1)
            .and_then(|rest| rest.split('}').next())
            .unwrap_or_default()
            .to_string()
    };
    let default = dry(&[]);
    assert!(node_ip_set(&default).contains("192.168.56.10"), "{default}");
    let bound = dry(&["--bind-address=192.168.56.99"]);
    let set = node_ip_set(&bound);
    assert!(set.contains("192.168.56.99"), "{bound}");
    assert!(!set.contains("192.168.56.10"), "{set}");
}

/// An empty `--proxy-mode` is upstream's default mode (iptables on Linux), in both spellings.
#[test]
fn an_empty_proxy_mode_is_the_default_mode() {
    for mode in [&["--proxy-mode", ""][..], &["--proxy-mode="]] {
        let mut args = vec!["--manifests", SEED, "--dry-run"];
        args.extend(NODE_ARGS);
        args.extend(mode);
        let (rc, out, err) = run(&args);
        assert_eq!(rc, Some(0), "{mode:?}: {err}");
        assert!(
            out.contains("-A KUBE-SERVICES"),
            "{mode:?}: not iptables rules:\n{out}"
        );
    }
}

/// A dry run programs nothing, so it never says that the programmed rules stay in place.
#[test]
fn a_dry_run_does_not_announce_a_shutdown() {
    for mode in ["iptables", "nftables"] {
        let flag = format!("--proxy-mode={mode}");
        let mut args = vec!["--manifests", SEED, "--dry-run", flag.as_str()];
        args.extend(NODE_ARGS);
        let (rc, _, err) = run(&args);
        assert_eq!(rc, Some(0), "{err}");
        assert!(!err.contains("shutting down"), "{mode}: {err}");
    }
}
