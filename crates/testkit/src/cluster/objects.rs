//! What a fresh kubeadm cluster with kube-proxy holds, for the test cluster's nodes: the
//! four namespaces `kubeadm init` leaves, the bootstrap ClusterRole `system:node-proxier`,
//! the Nodes (the control plane labelled and tainted as kubeadm does), the `kubernetes`
//! Service and its EndpointSlice (the control plane's `:6443`), kubeadm's kube-proxy objects
//! ([`crate::kubeadm`]), and a sample workload:
//!
//! | Service | ClusterIP | ports | endpoints |
//! |---|---|---|---|
//! | `default/kubernetes` | 10.96.0.1 | 443 → 6443 | the control plane, `192.168.56.10:6443` |
//! | `default/web` | 10.96.0.100 | 80 → 8080, NodePort 30080 | every worker's `web-<node>` pod |
//! | `default/web-local` | 10.96.0.101 | 80 → 8080, `LoadBalancer` (no load balancer: NodePort 30081), `externalTrafficPolicy: Local`, health check NodePort 32000 | `worker-1`'s pod only |
//!
//! Each workload pod answers `GET /` with its name (`web-worker-1`).

use std::fmt::Write as _;

use super::net::{API_PORT, KUBERNETES_SERVICE_IP, WEB_PORT};
use super::state::{NodeState, WorkloadPod};

/// The `web` Service's ClusterIP.
pub const WEB_IP: &str = "10.96.0.100";
/// The `web` Service's NodePort.
pub const WEB_NODE_PORT: u16 = 30080;
/// The `web-local` Service's ClusterIP.
pub const WEB_LOCAL_IP: &str = "10.96.0.101";
/// The `web-local` Service's NodePort.
pub const WEB_LOCAL_NODE_PORT: u16 = 30081;
/// The `web-local` Service's health check NodePort.
pub const WEB_LOCAL_HEALTH_PORT: u16 = 32000;

/// The cluster's objects as one multi-document YAML text (see the module documentation),
/// with kubeadm's kube-proxy configuration naming `server` as the control-plane endpoint.
pub fn cluster_objects(nodes: &[NodeState], pods: &[WorkloadPod], server: &str) -> String {
    let mut out = String::new();
    for ns in ["default", "kube-system", "kube-public", "kube-node-lease"] {
        let _ = write!(
            out,
            "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {ns}\n---\n"
        );
    }
    out.push_str(
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata:\n  \
         name: system:node-proxier\n  labels:\n    kubernetes.io/bootstrapping: rbac-defaults\n\
         rules:\n- apiGroups: [\"\"]\n  resources: [endpoints, services]\n  verbs: [list, watch]\n\
         - apiGroups: [\"\"]\n  resources: [nodes]\n  verbs: [get, list, watch]\n\
         - apiGroups: [\"\", events.k8s.io]\n  resources: [events]\n  verbs: [create, patch, update]\n\
         - apiGroups: [discovery.k8s.io]\n  resources: [endpointslices]\n  verbs: [list, watch]\n---\n",
    );
    for node in nodes {
        let (role, taints) = if node.control_plane {
            (
                "\n    node-role.kubernetes.io/control-plane: \"\"",
                "\n  taints:\n  - key: node-role.kubernetes.io/control-plane\n    effect: NoSchedule",
            )
        } else {
            ("", "")
        };
        let _ = write!(
            out,
            "apiVersion: v1\nkind: Node\nmetadata:\n  name: {name}\n  labels:\n    \
             kubernetes.io/os: linux\n    kubernetes.io/arch: amd64\n    \
             kubernetes.io/hostname: {name}{role}\nspec:\n  podCIDR: {cidr}\n  podCIDRs: [{cidr}]{taints}\n\
             status:\n  addresses:\n  - {{type: InternalIP, address: {ip}}}\n  - {{type: Hostname, address: {name}}}\n  \
             conditions:\n  - {{type: Ready, status: \"True\", reason: KubeletReady, message: \"a test-cluster network namespace\"}}\n  \
             nodeInfo:\n    architecture: amd64\n    bootID: \"\"\n    containerRuntimeVersion: \"none (test-cluster)\"\n    \
             kernelVersion: \"\"\n    kubeProxyVersion: \"\"\n    kubeletVersion: v1.32.4\n    machineID: \"\"\n    \
             operatingSystem: linux\n    osImage: \"test-cluster network namespace\"\n    systemUUID: \"\"\n---\n",
            name = node.name,
            cidr = node.pod_cidr,
            ip = node.ip,
        );
    }
    let control_plane = nodes
        .iter()
        .find(|n| n.control_plane)
        .map(|n| n.ip.to_string())
        .unwrap_or_default();
    let _ = write!(
        out,
        "apiVersion: v1\nkind: Service\nmetadata:\n  name: kubernetes\n  namespace: default\n  labels:\n    \
         component: apiserver\n    provider: kubernetes\nspec:\n  type: ClusterIP\n  clusterIP: {KUBERNETES_SERVICE_IP}\n  \
         clusterIPs: [{KUBERNETES_SERVICE_IP}]\n  ports:\n  - {{name: https, port: 443, protocol: TCP, targetPort: {API_PORT}}}\n---\n\
         apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: kubernetes\n  namespace: default\n  labels:\n    \
         kubernetes.io/service-name: kubernetes\naddressType: IPv4\nendpoints:\n- addresses: [{control_plane}]\n  \
         conditions: {{ready: true}}\nports:\n- {{name: https, port: {API_PORT}, protocol: TCP}}\n---\n"
    );
    // A health check NodePort exists only for LoadBalancer Services with the Local policy
    // (the API server refuses it elsewhere, and kube-proxy serves it only then).
    let web = |name: &str, ip: &str, node_port: u16, local: bool| {
        let (kind, local) = if local {
            (
                "LoadBalancer",
                format!(
                    "\n  externalTrafficPolicy: Local\n  healthCheckNodePort: {WEB_LOCAL_HEALTH_PORT}"
                ),
            )
        } else {
            ("NodePort", String::new())
        };
        format!(
            "apiVersion: v1\nkind: Service\nmetadata:\n  name: {name}\n  namespace: default\nspec:\n  type: {kind}\n  clusterIP: {ip}\n  clusterIPs: [{ip}]\n  \
             selector: {{app: web}}{local}\n  ports:\n  \
             - {{name: http, port: 80, protocol: TCP, targetPort: {WEB_PORT}, nodePort: {node_port}}}\n---\n"
        )
    };
    let slice = |name: &str, pods: &[&WorkloadPod]| {
        let mut s = format!(
            "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: {name}-1\n  \
             namespace: default\n  labels:\n    kubernetes.io/service-name: {name}\naddressType: IPv4\nendpoints:\n"
        );
        for p in pods {
            let _ = writeln!(
                s,
                "- addresses: [{}]\n  nodeName: {}\n  conditions: {{ready: true, serving: true, terminating: false}}\n  \
                 targetRef: {{kind: Pod, namespace: default, name: {}}}",
                p.ip, p.node, p.name
            );
        }
        let _ = write!(
            s,
            "ports:\n- {{name: http, port: {WEB_PORT}, protocol: TCP}}\n---\n"
        );
        s
    };
    let all: Vec<&WorkloadPod> = pods.iter().collect();
    out.push_str(&web("web", WEB_IP, WEB_NODE_PORT, false));
    out.push_str(&slice("web", &all));
    out.push_str(&web("web-local", WEB_LOCAL_IP, WEB_LOCAL_NODE_PORT, true));
    out.push_str(&slice("web-local", &all[..all.len().min(1)]));
    out.push_str(&crate::kubeadm::kube_proxy_objects(server));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    #[tokio::test]
    async fn every_object_decodes_strictly() {
        let nodes = vec![
            NodeState {
                name: "master".into(),
                namespace: "kp1x1-master".into(),
                ip: "192.168.56.10".parse().unwrap(),
                pod_cidr: "10.244.0.0/24".into(),
                control_plane: true,
            },
            NodeState {
                name: "worker-1".into(),
                namespace: "kp1x2-worker-1".into(),
                ip: "192.168.56.11".parse().unwrap(),
                pod_cidr: "10.244.1.0/24".into(),
                control_plane: false,
            },
        ];
        let pods = vec![WorkloadPod {
            name: "web-worker-1".into(),
            node: "worker-1".into(),
            namespace: "kp1x3-web-worker-1".into(),
            ip: "10.244.1.10".parse().unwrap(),
        }];
        let text = cluster_objects(&nodes, &pods, "https://192.168.56.10:6443");
        let server = crate::apiserver::TestApiServer::start().await.unwrap();
        let mut kinds = Vec::new();
        for doc in text.split("\n---\n").filter(|d| !d.trim().is_empty()) {
            let v: Value = serde_saphyr::from_str(doc).unwrap_or_else(|e| panic!("{e}\n{doc}"));
            let kind = v["kind"].as_str().unwrap().to_string();
            server
                .apply_value(v)
                .unwrap_or_else(|e| panic!("{kind}: {e}"));
            kinds.push(kind);
        }
        assert_eq!(kinds.iter().filter(|k| *k == "Node").count(), 2);
        assert_eq!(kinds.iter().filter(|k| *k == "Service").count(), 3);
        assert!(kinds.contains(&"DaemonSet".to_string()));
    }
}
