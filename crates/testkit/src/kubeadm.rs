//! What `kubeadm init` creates for kube-proxy, as manifests: the ConfigMap
//! `kube-system/kube-proxy` (`config.conf`, a kubeadm 1.32 cluster's generated
//! `KubeProxyConfiguration`, and `kubeconfig.conf`, the control plane's address with the pod's
//! service-account token and CA), the ServiceAccount `kube-system/kube-proxy`, the
//! ClusterRoleBinding `kubeadm:node-proxier` giving it `system:node-proxier`, and the
//! DaemonSet `kube-system/kube-proxy` (kubeadm's addon manifests,
//! cmd/kubeadm/app/phases/addons/proxy/manifests.go, rendered for v1.32.4). Used by the deploy
//! tests and by the `test-cluster` tool ([`crate::cluster`]).
//!
//! kubeadm also creates a Role and RoleBinding letting bootstrapping nodes read the ConfigMap;
//! the test API server does not serve Roles, and nothing here needs them, so they are left out.

/// kubeadm 1.32's generated `config.conf` (a real cluster's, fields in kubeadm's order).
pub const KUBEADM_CONFIG_CONF: &str =
    include_str!("../../../kube-proxy-rs/tests/data/kubeadm-config.conf");

/// The image kubeadm 1.32.4's DaemonSet runs.
pub const KUBE_PROXY_IMAGE: &str = "registry.k8s.io/kube-proxy:v1.32.4";

/// kubeadm's kube-proxy objects (see the module documentation) for the control plane at
/// `server` (`https://192.168.56.10:6443`), as one multi-document YAML text for `kubectl
/// create -f` or [`crate::apiserver::TestApiServer::apply_value`].
pub fn kube_proxy_objects(server: &str) -> String {
    let config: String = KUBEADM_CONFIG_CONF
        .lines()
        .map(|l| format!("    {l}\n"))
        .collect();
    format!(
        r#"kind: ConfigMap
apiVersion: v1
metadata:
  name: kube-proxy
  namespace: kube-system
  labels:
    app: kube-proxy
data:
  kubeconfig.conf: |-
    apiVersion: v1
    kind: Config
    clusters:
    - cluster:
        certificate-authority: /var/run/secrets/kubernetes.io/serviceaccount/ca.crt
        server: {server}
      name: default
    contexts:
    - context:
        cluster: default
        namespace: default
        user: default
      name: default
    current-context: default
    users:
    - name: default
      user:
        tokenFile: /var/run/secrets/kubernetes.io/serviceaccount/token
  config.conf: |-
{config}---
apiVersion: v1
kind: ServiceAccount
metadata:
  name: kube-proxy
  namespace: kube-system
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: kubeadm:node-proxier
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: system:node-proxier
subjects:
- kind: ServiceAccount
  name: kube-proxy
  namespace: kube-system
---
apiVersion: apps/v1
kind: DaemonSet
metadata:
  labels:
    k8s-app: kube-proxy
  name: kube-proxy
  namespace: kube-system
spec:
  selector:
    matchLabels:
      k8s-app: kube-proxy
  updateStrategy:
    type: RollingUpdate
  template:
    metadata:
      labels:
        k8s-app: kube-proxy
    spec:
      priorityClassName: system-node-critical
      containers:
      - name: kube-proxy
        image: {KUBE_PROXY_IMAGE}
        imagePullPolicy: IfNotPresent
        command:
        - /usr/local/bin/kube-proxy
        - --config=/var/lib/kube-proxy/config.conf
        - --hostname-override=$(NODE_NAME)
        securityContext:
          privileged: true
        volumeMounts:
        - mountPath: /var/lib/kube-proxy
          name: kube-proxy
        - mountPath: /run/xtables.lock
          name: xtables-lock
          readOnly: false
        - mountPath: /lib/modules
          name: lib-modules
          readOnly: true
        env:
          - name: NODE_NAME
            valueFrom:
              fieldRef:
                fieldPath: spec.nodeName
      hostNetwork: true
      serviceAccountName: kube-proxy
      volumes:
      - name: kube-proxy
        configMap:
          name: kube-proxy
      - name: xtables-lock
        hostPath:
          path: /run/xtables.lock
          type: FileOrCreate
      - name: lib-modules
        hostPath:
          path: /lib/modules
      tolerations:
      - key: CriticalAddonsOnly
        operator: Exists
      - operator: Exists
      nodeSelector:
        kubernetes.io/os: linux
"#
    )
}
