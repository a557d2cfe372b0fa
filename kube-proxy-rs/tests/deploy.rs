//! The deployment files in `deploy/` are valid Kubernetes objects, and the ConfigMap's
//! KubeProxyConfiguration is accepted by the binary.

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{ConfigMap, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};

const DEPLOY: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy");

fn docs(file: &str) -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(format!("{DEPLOY}/{file}")).unwrap();
    text.split("\n---\n")
        .map(|d| {
            serde_saphyr::from_str::<serde_json::Value>(d).unwrap_or_else(|e| panic!("{file}: {e}"))
        })
        .collect()
}

fn typed<T: serde::de::DeserializeOwned>(v: serde_json::Value, what: &str) -> T {
    serde_path_to_error::deserialize(v)
        .unwrap_or_else(|e| panic!("{what}: {} at {}", e.inner(), e.path()))
}

#[test]
fn rbac_matches_upstream_node_proxier_permissions() {
    let mut sa = None;
    let mut role = None;
    let mut binding = None;
    for d in docs("rbac.yaml") {
        match d["kind"].as_str().unwrap() {
            "ServiceAccount" => sa = Some(typed::<ServiceAccount>(d, "ServiceAccount")),
            "ClusterRole" => role = Some(typed::<ClusterRole>(d, "ClusterRole")),
            "ClusterRoleBinding" => {
                binding = Some(typed::<ClusterRoleBinding>(d, "ClusterRoleBinding"))
            }
            k => panic!("unexpected kind {k}"),
        }
    }
    let (sa, role, binding) = (sa.unwrap(), role.unwrap(), binding.unwrap());
    let rules = role.rules.unwrap();
    let allows = |group: &str, resource: &str, verb: &str| {
        rules.iter().any(|r| {
            r.api_groups
                .as_ref()
                .is_some_and(|g| g.iter().any(|x| x == group))
                && r.resources
                    .as_ref()
                    .is_some_and(|x| x.iter().any(|x| x == resource))
                && r.verbs.iter().any(|x| x == verb)
        })
    };
    for (g, r, v) in [
        ("", "services", "list"),
        ("", "services", "watch"),
        ("", "nodes", "get"),
        ("", "nodes", "watch"),
        ("discovery.k8s.io", "endpointslices", "list"),
        ("discovery.k8s.io", "endpointslices", "watch"),
        ("networking.k8s.io", "servicecidrs", "list"),
        ("networking.k8s.io", "servicecidrs", "watch"),
        ("events.k8s.io", "events", "create"),
    ] {
        assert!(allows(g, r, v), "{v} {g}/{r} missing");
    }
    assert!(
        !allows("", "services", "update"),
        "no write access to Services"
    );
    let subject = &binding.subjects.unwrap()[0];
    assert_eq!(subject.name, sa.metadata.name.unwrap());
    assert_eq!(binding.role_ref.name, role.metadata.name.unwrap());
}

#[test]
fn daemonset_and_configmap() {
    let ds: DaemonSet = typed(docs("daemonset.yaml").remove(0), "DaemonSet");
    let pod = ds.spec.unwrap().template.spec.unwrap();
    assert_eq!(pod.host_network, Some(true));
    assert_eq!(pod.service_account_name.as_deref(), Some("kube-proxy-rs"));
    let c = &pod.containers[0];
    assert!(
        c.security_context
            .as_ref()
            .and_then(|s| s.privileged)
            .unwrap_or(false)
    );
    assert!(
        c.command
            .as_ref()
            .unwrap()
            .iter()
            .any(|a| a.starts_with("--config="))
    );
    assert_eq!(
        c.liveness_probe
            .as_ref()
            .unwrap()
            .http_get
            .as_ref()
            .unwrap()
            .path
            .as_deref(),
        Some("/livez")
    );

    let cm: ConfigMap = typed(docs("configmap.yaml").remove(0), "ConfigMap");
    let conf = cm.data.unwrap().remove("config.conf").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.conf");
    std::fs::write(&path, conf).unwrap();
    let seed = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../examples/seed-nginx/cluster.yaml"
    );
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_kube-proxy-rs"))
        .args([
            "--config",
            path.to_str().unwrap(),
            "--manifests",
            seed,
            "--dry-run",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
