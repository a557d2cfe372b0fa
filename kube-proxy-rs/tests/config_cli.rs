//! `--config` and `--write-config-to` with upstream's KubeProxyConfiguration format, and
//! what `--dry-run` says about the flags it was given (a `--hostname-override` naming no Node).

mod common;

use common::{SEED_MANIFEST as SEED, run};

#[test]
fn write_config_to_writes_loadable_upstream_format() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.conf");
    let (ok, _, err) = run(&[
        "--write-config-to",
        path.to_str().unwrap(),
        "--cluster-cidr=10.244.0.0/16",
        "--masquerade-all",
    ]);
    assert!(ok, "{err}");
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(
        text.contains("apiVersion: kubeproxy.config.k8s.io/v1alpha1"),
        "{text}"
    );
    assert!(text.contains("kind: KubeProxyConfiguration"));
    assert!(text.contains("clusterCIDR: 10.244.0.0/16"), "{text}");
    assert!(text.contains("masqueradeAll: true"), "{text}");
    assert!(
        text.contains("syncPeriod: 30s") && text.contains("minSyncPeriod: 1s"),
        "{text}"
    );
    // And it is accepted back.
    let (ok, out, err) = run(&[
        "--config",
        path.to_str().unwrap(),
        "--manifests",
        SEED,
        "--dry-run",
        "--hostname-override=k8s-master",
    ]);
    assert!(ok, "{err}");
    assert!(
        out.contains("-A KUBE-SVC-HL5LMXD5JFHQZ6LN -d 10.96.138.71/32"),
        "masquerade-all from the file: {out}"
    );
}

#[test]
fn config_values_apply_and_flags_override_them() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.conf");
    std::fs::write(
        &path,
        "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nclusterCIDR: 10.0.0.0/16\nhostnameOverride: k8s-master\niptables:\n  masqueradeBit: 5\n",
    )
    .unwrap();
    let (ok, out, err) = run(&[
        "--config",
        path.to_str().unwrap(),
        "--manifests",
        SEED,
        "--dry-run",
    ]);
    assert!(ok, "{err}");
    assert!(
        out.contains("! -s 10.0.0.0/16"),
        "clusterCIDR from the file: {out}"
    );
    assert!(
        out.contains("--set-xmark 0x20/0x20"),
        "masqueradeBit from the file: {out}"
    );
    let (ok, out, _) = run(&[
        "--config",
        path.to_str().unwrap(),
        "--manifests",
        SEED,
        "--dry-run",
        "--iptables-masquerade-bit=14",
    ]);
    assert!(ok);
    assert!(
        out.contains("--set-xmark 0x4000/0x4000"),
        "the command line wins: {out}"
    );
}

#[test]
fn unknown_fields_are_rejected_with_their_path() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.conf");
    std::fs::write(&path, "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\niptables:\n  masqueradeBitt: 14\n").unwrap();
    let (ok, _, err) = run(&[
        "--config",
        path.to_str().unwrap(),
        "--manifests",
        SEED,
        "--dry-run",
    ]);
    assert!(!ok);
    assert!(
        err.contains("iptables") && err.contains("masqueradeBitt"),
        "{err}"
    );
}

/// A `--hostname-override` that names no Node of the manifest is warned about once, not once
/// per IP family.
#[test]
fn a_missing_own_node_is_warned_about_once() {
    let (ok, _, err) = run(&["--manifests", SEED, "--dry-run", "--hostname-override=vm"]);
    assert!(ok, "{err}");
    assert_eq!(
        err.matches("no Node object named \"vm\"").count(),
        1,
        "{err}"
    );
}

/// The file kubeadm generates works as docs/deploy.md says: checked with `--dry-run` against
/// manifests (its kubeconfig does not count as a second source then), and its zero values
/// are upstream's defaults in the effective configuration.
#[test]
fn kubeadms_generated_config_checks_with_dry_run() {
    let kubeadm = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/kubeadm-config.conf"
    );
    let (ok, out, err) = run(&[
        "--config",
        kubeadm,
        "--manifests",
        SEED,
        "--dry-run",
        "--hostname-override=k8s-master",
    ]);
    assert!(ok, "{err}");
    assert!(out.contains("-A KUBE-SVC-HL5LMXD5JFHQZ6LN"), "{out}");
    let dir = tempfile::tempdir().unwrap();
    let written = dir.path().join("effective.conf");
    let (ok, _, err) = run(&[
        "--config",
        kubeadm,
        "--write-config-to",
        written.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    let text = std::fs::read_to_string(&written).unwrap();
    for line in [
        "healthzBindAddress: 0.0.0.0:10256",
        "metricsBindAddress: 127.0.0.1:10249",
        "  syncPeriod: 30s",
        "  minSyncPeriod: 1s",
    ] {
        assert!(text.lines().any(|l| l == line), "{line:?} in\n{text}");
    }
}
