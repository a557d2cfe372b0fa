//! What a kubelet does for a DaemonSet's pod, as far as a proxy's pod needs it, without a
//! container runtime: whether the pod goes on a node ([`schedules`], [`why_not_scheduled`]:
//! the DaemonSet controller's node selector, required node affinity and taint/toleration
//! checks), and the pod's process ([`Pod`]): its command with `$(VAR)` references expanded,
//! its environment (the kubelet's `KUBERNETES_SERVICE_*` variables, then the container's own,
//! with downward-API `fieldRef`s), and its files at the paths a container sees them (its
//! ConfigMap volumes at their mount paths, the service account's token, CA and namespace
//! under [`SERVICE_ACCOUNT_DIR`]), given to one process in a network namespace through
//! [`PodFiles`].
//!
//! What is not simulated: the image (the caller chooses the binary that stands for the
//! image's), a pod network (only `hostNetwork: true` pods: the process runs in the node's
//! namespace), volumes other than ConfigMaps and hostPaths (a hostPath is the machine's own
//! path, as every node shares the machine's file system), probes, restarts and resource
//! limits. Anything else in a pod template that would change how the process runs is an
//! error naming the field, never ignored.

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::net::IpAddr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{
    ConfigMap, Container, Node, NodeSelectorRequirement, PodSpec, Taint, Toleration,
};

use crate::pod::PodFiles;
use crate::{ChildGuard, Error, Netns, Result};

/// Where the kubelet mounts a pod's service-account token (`token`), the cluster's CA
/// (`ca.crt`) and the pod's namespace (`namespace`).
pub const SERVICE_ACCOUNT_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// The variables the kubelet gives every container for the `kubernetes` Service at
/// `ip:port` (the Service's ClusterIP, 10.96.0.1:443 on kubeadm): `KUBERNETES_SERVICE_HOST`,
/// `KUBERNETES_SERVICE_PORT`, `KUBERNETES_SERVICE_PORT_HTTPS`, `KUBERNETES_PORT` and the
/// `KUBERNETES_PORT_<port>_TCP*` family, as the kubelet's service-link environment names them.
pub fn kubernetes_service_env(ip: IpAddr, port: u16) -> Vec<(String, String)> {
    let host = ip.to_string();
    let url_host = if ip.is_ipv6() {
        format!("[{ip}]")
    } else {
        host.clone()
    };
    let url = format!("tcp://{url_host}:{port}");
    let p = format!("KUBERNETES_PORT_{port}_TCP");
    vec![
        ("KUBERNETES_SERVICE_HOST".into(), host.clone()),
        ("KUBERNETES_SERVICE_PORT".into(), port.to_string()),
        ("KUBERNETES_SERVICE_PORT_HTTPS".into(), port.to_string()),
        ("KUBERNETES_PORT".into(), url.clone()),
        (p.clone(), url),
        (format!("{p}_PROTO"), "tcp".into()),
        (format!("{p}_PORT"), port.to_string()),
        (format!("{p}_ADDR"), host),
    ]
}

/// Whether the DaemonSet controller puts a pod of `template` on `node`: see
/// [`why_not_scheduled`].
///
/// # Errors
/// As [`why_not_scheduled`].
pub fn schedules(template: &PodSpec, node: &Node) -> Result<bool> {
    Ok(why_not_scheduled(template, node)?.is_none())
}

/// Why the DaemonSet controller would not put a pod of `template` on `node`, or `None` when
/// it would: every `nodeSelector` label must match; one of the required node affinity's
/// `nodeSelectorTerms` must match (its `matchExpressions` ANDed: `In`, `NotIn`, `Exists`,
/// `DoesNotExist`, `Gt`, `Lt`; `matchFields` on `metadata.name`); every `NoSchedule` and
/// `NoExecute` taint of the node must be tolerated. (The tolerations the DaemonSet
/// controller adds by itself, for the `node.kubernetes.io/*` condition taints, are added
/// here too.)
///
/// # Errors
/// [`Error::Invalid`] naming the field for an operator the API server would not accept.
pub fn why_not_scheduled(template: &PodSpec, node: &Node) -> Result<Option<String>> {
    let empty = BTreeMap::new();
    let labels = node.metadata.labels.as_ref().unwrap_or(&empty);
    let node_name = node.metadata.name.as_deref().unwrap_or("");
    if let Some(selector) = &template.node_selector {
        for (k, v) in selector {
            if labels.get(k) != Some(v) {
                return Ok(Some(format!(
                    "nodeSelector {k}={v}: the node's label is {}",
                    labels
                        .get(k)
                        .map_or_else(|| "absent".to_string(), |l| format!("{k}={l}"))
                )));
            }
        }
    }
    let terms = template
        .affinity
        .as_ref()
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|n| {
            n.required_during_scheduling_ignored_during_execution
                .as_ref()
        })
        .map(|r| r.node_selector_terms.as_slice());
    if let Some(terms) = terms {
        let mut matched = false;
        for (t, term) in terms.iter().enumerate() {
            let mut all = true;
            for (e, expr) in term.match_expressions.iter().flatten().enumerate() {
                let field = || {
                    format!(
                        "affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.\
                         nodeSelectorTerms[{t}].matchExpressions[{e}]"
                    )
                };
                all &= requirement(expr, labels.get(&expr.key).map(String::as_str), field)?;
            }
            for (e, expr) in term.match_fields.iter().flatten().enumerate() {
                let field = || {
                    format!(
                        "affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.\
                         nodeSelectorTerms[{t}].matchFields[{e}]"
                    )
                };
                if expr.key != "metadata.name" {
                    return Err(Error::invalid(
                        "pod template",
                        format!("{}.key: {:?}: only metadata.name", field(), expr.key),
                    ));
                }
                all &= requirement(expr, Some(node_name), field)?;
            }
            matched |= all;
        }
        if !matched {
            return Ok(Some(format!(
                "its required node affinity: {}",
                terms
                    .iter()
                    .map(describe_term)
                    .collect::<Vec<_>>()
                    .join(" or ")
            )));
        }
    }
    let mut tolerations = template.tolerations.clone().unwrap_or_default();
    tolerations.extend(daemonset_tolerations());
    for taint in node
        .spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .into_iter()
        .flatten()
    {
        if taint.effect == "PreferNoSchedule" {
            continue;
        }
        if !tolerations.iter().any(|t| tolerates(t, taint)) {
            return Ok(Some(format!(
                "the node's taint {}{}:{} is not tolerated",
                taint.key,
                taint
                    .value
                    .as_deref()
                    .map(|v| format!("={v}"))
                    .unwrap_or_default(),
                taint.effect
            )));
        }
    }
    Ok(None)
}

fn describe_term(term: &k8s_openapi::api::core::v1::NodeSelectorTerm) -> String {
    term.match_expressions
        .iter()
        .flatten()
        .chain(term.match_fields.iter().flatten())
        .map(|e| {
            let values = e.values.as_deref().unwrap_or_default();
            if values.is_empty() {
                format!("{} {}", e.key, e.operator)
            } else {
                format!("{} {} [{}]", e.key, e.operator, values.join(", "))
            }
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// One node selector requirement against the label's (or field's) value.
fn requirement(
    expr: &NodeSelectorRequirement,
    value: Option<&str>,
    field: impl Fn() -> String,
) -> Result<bool> {
    let values = expr.values.as_deref().unwrap_or_default();
    let number = |s: &str| s.parse::<i64>().ok();
    Ok(match expr.operator.as_str() {
        "In" => value.is_some_and(|v| values.iter().any(|w| w == v)),
        "NotIn" => value.is_none_or(|v| values.iter().all(|w| w != v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        op @ ("Gt" | "Lt") => {
            let Some(bound) = values.first().and_then(|v| number(v)) else {
                return Err(Error::invalid(
                    "pod template",
                    format!("{}.values: {op} needs one integer", field()),
                ));
            };
            match value.and_then(number) {
                Some(v) if op == "Gt" => v > bound,
                Some(v) => v < bound,
                None => false,
            }
        }
        op => {
            return Err(Error::invalid(
                "pod template",
                format!("{}.operator: unknown operator {op:?}", field()),
            ));
        }
    })
}

/// The tolerations the DaemonSet controller adds to every DaemonSet pod.
fn daemonset_tolerations() -> Vec<Toleration> {
    [
        ("node.kubernetes.io/not-ready", "NoExecute"),
        ("node.kubernetes.io/unreachable", "NoExecute"),
        ("node.kubernetes.io/disk-pressure", "NoSchedule"),
        ("node.kubernetes.io/memory-pressure", "NoSchedule"),
        ("node.kubernetes.io/pid-pressure", "NoSchedule"),
        ("node.kubernetes.io/unschedulable", "NoSchedule"),
    ]
    .into_iter()
    .map(|(key, effect)| Toleration {
        key: Some(key.into()),
        operator: Some("Exists".into()),
        effect: Some(effect.into()),
        ..Toleration::default()
    })
    .collect()
}

/// Whether `t` tolerates `taint`, as the scheduler matches them.
fn tolerates(t: &Toleration, taint: &Taint) -> bool {
    if t.effect
        .as_deref()
        .is_some_and(|e| !e.is_empty() && e != taint.effect)
    {
        return false;
    }
    let key = t.key.as_deref().unwrap_or("");
    match t.operator.as_deref().unwrap_or("Equal") {
        "Exists" => key.is_empty() || key == taint.key,
        _ => {
            key == taint.key
                && t.value.as_deref().unwrap_or("") == taint.value.as_deref().unwrap_or("")
        }
    }
}

/// The service account's files as the kubelet projects them into a pod.
#[derive(Debug, Clone)]
pub struct ServiceAccountFiles {
    /// The token (`token`): what the API server accepts as the pod's credentials.
    pub token: String,
    /// The cluster's CA certificate, PEM (`ca.crt`).
    pub ca_pem: String,
}

/// Where a pod runs and what it can read: the inputs of [`Pod::new`] besides its template.
#[derive(Debug, Clone, Copy)]
pub struct PodContext<'a> {
    /// The pod's namespace (its DaemonSet's): the service account's `namespace` file and the
    /// `metadata.namespace` field reference.
    pub namespace: &'a str,
    /// The pod's name (`metadata.name`).
    pub pod_name: &'a str,
    /// The node's name (`spec.nodeName`).
    pub node_name: &'a str,
    /// The node's address (`status.hostIP`, and `status.podIP` of a host-network pod).
    pub node_ip: Option<IpAddr>,
    /// The ConfigMaps of the pod's namespace the template's volumes name, by name.
    pub config_maps: &'a BTreeMap<String, ConfigMap>,
    /// The service account's token and CA.
    pub service_account: &'a ServiceAccountFiles,
    /// The kubelet's own variables, set before the container's
    /// ([`kubernetes_service_env`]).
    pub kubelet_env: &'a [(String, String)],
}

/// A pod's one container as a process: see the module documentation.
#[derive(Debug)]
pub struct Pod {
    /// The image (`image:`), for messages: the process runs a binary on this machine
    /// instead.
    pub image: String,
    /// The command's program as the image has it (`/usr/local/bin/kube-proxy-rs`).
    pub program: String,
    /// The rest of the command and the container's `args`, `$(VAR)` expanded.
    pub args: Vec<String>,
    /// The environment: the kubelet's variables, then the container's in order.
    pub env: Vec<(String, String)>,
    /// The files at the container's paths.
    pub files: PodFiles,
}

impl Pod {
    /// The names of the ConfigMaps `template`'s volumes mount (for the caller to fetch
    /// before [`Pod::new`]).
    pub fn config_map_names(template: &PodSpec) -> Vec<String> {
        template
            .volumes
            .iter()
            .flatten()
            .filter_map(|v| v.config_map.as_ref().map(|c| c.name.clone()))
            .collect()
    }

    /// The pod of `template` on the node `ctx` names, its files kept under `dir` (which must
    /// exist). The container must have a `command` (the image's entrypoint is unknown
    /// here), and the pod must use the host's network.
    ///
    /// # Errors
    /// [`Error::Invalid`] naming the field (`spec.template.spec.containers[0].command`,
    /// `...volumes[1]`, ...) for what cannot be run this way: more than one container or any
    /// init container, no `command`, no `hostNetwork`, a volume other than a ConfigMap or
    /// hostPath, a `subPath` mount, a missing ConfigMap or key, an environment source other
    /// than `value` and the field references `spec.nodeName`, `metadata.name`,
    /// `metadata.namespace`, `status.hostIP` and `status.podIP`. [`Error::Io`] when a file
    /// cannot be written.
    pub fn new(template: &PodSpec, ctx: &PodContext<'_>, dir: &Path) -> Result<Pod> {
        let bad = |field: String, message: &str| {
            Error::invalid(
                "pod template",
                format!("spec.template.spec.{field}: {message}"),
            )
        };
        if template.containers.len() != 1 {
            return Err(bad(
                "containers".into(),
                &format!(
                    "{} containers; only pods of one container are run",
                    template.containers.len()
                ),
            ));
        }
        if template
            .init_containers
            .as_ref()
            .is_some_and(|c| !c.is_empty())
        {
            return Err(bad("initContainers".into(), "init containers are not run"));
        }
        if template.host_network != Some(true) {
            return Err(bad(
                "hostNetwork".into(),
                "only host-network pods are run (in the node's network namespace)",
            ));
        }
        let container: &Container = &template.containers[0];
        let image = container.image.clone().unwrap_or_default();

        let mut env = ctx.kubelet_env.to_vec();
        for (i, e) in container.env.iter().flatten().enumerate() {
            let value = match (&e.value, &e.value_from) {
                (_, Some(from)) => {
                    let Some(path) = from.field_ref.as_ref().map(|f| f.field_path.as_str()) else {
                        return Err(bad(
                            format!("containers[0].env[{i}].valueFrom"),
                            "only fieldRef is supported",
                        ));
                    };
                    match path {
                        "spec.nodeName" => ctx.node_name.to_string(),
                        "metadata.name" => ctx.pod_name.to_string(),
                        "metadata.namespace" => ctx.namespace.to_string(),
                        "status.hostIP" | "status.podIP" => match ctx.node_ip {
                            Some(ip) => ip.to_string(),
                            None => {
                                return Err(bad(
                                    format!("containers[0].env[{i}].valueFrom.fieldRef"),
                                    &format!("{path}: the node has no InternalIP"),
                                ));
                            }
                        },
                        other => {
                            return Err(bad(
                                format!("containers[0].env[{i}].valueFrom.fieldRef.fieldPath"),
                                &format!("{other:?} is not supported"),
                            ));
                        }
                    }
                }
                (Some(v), None) => v.clone(),
                (None, None) => String::new(),
            };
            env.push((e.name.clone(), value));
        }
        let vars: BTreeMap<&str, &str> =
            env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let expand = |a: &String| {
            let mut a = a.clone();
            for (k, v) in &vars {
                a = a.replace(&format!("$({k})"), v);
            }
            a
        };
        let mut command = container.command.iter().flatten().map(expand);
        let Some(program) = command.next() else {
            return Err(bad(
                "containers[0].command".into(),
                "absent: the image's entrypoint is not known here",
            ));
        };
        let args: Vec<String> = command
            .chain(container.args.iter().flatten().map(expand))
            .collect();

        let mut files = PodFiles::new(dir);
        let volumes = template.volumes.as_deref().unwrap_or_default();
        for (m, mount) in container.volume_mounts.iter().flatten().enumerate() {
            if mount.sub_path.as_ref().is_some_and(|s| !s.is_empty())
                || mount.sub_path_expr.as_ref().is_some_and(|s| !s.is_empty())
            {
                return Err(bad(
                    format!("containers[0].volumeMounts[{m}].subPath"),
                    "subPath mounts are not supported",
                ));
            }
            let Some((v, volume)) = volumes
                .iter()
                .enumerate()
                .find(|(_, v)| v.name == mount.name)
            else {
                return Err(bad(
                    format!("containers[0].volumeMounts[{m}].name"),
                    &format!("no volume {:?}", mount.name),
                ));
            };
            if volume.host_path.is_some() {
                continue; // the machine's own path, which every node namespace sees
            }
            let Some(source) = &volume.config_map else {
                return Err(bad(
                    format!("volumes[{v}]"),
                    "only configMap and hostPath volumes are supported",
                ));
            };
            let optional = source.optional == Some(true);
            let Some(cm) = ctx.config_maps.get(&source.name) else {
                if optional {
                    continue;
                }
                return Err(bad(
                    format!("volumes[{v}].configMap.name"),
                    &format!("ConfigMap {}/{} not found", ctx.namespace, source.name),
                ));
            };
            let data = cm.data.clone().unwrap_or_default();
            let items: Vec<(String, String)> = match &source.items {
                Some(items) => items
                    .iter()
                    .map(|i| (i.key.clone(), i.path.clone()))
                    .collect(),
                None => data.keys().map(|k| (k.clone(), k.clone())).collect(),
            };
            for (key, path) in items {
                let Some(text) = data.get(&key) else {
                    return Err(bad(
                        format!("volumes[{v}].configMap.items"),
                        &format!(
                            "ConfigMap {}/{} has no key {key:?}",
                            ctx.namespace, source.name
                        ),
                    ));
                };
                files.file(
                    &format!("{}/{path}", mount.mount_path.trim_end_matches('/')),
                    text,
                )?;
            }
        }
        if template.automount_service_account_token != Some(false) {
            let sa = SERVICE_ACCOUNT_DIR;
            files.file(&format!("{sa}/token"), &ctx.service_account.token)?;
            files.file(&format!("{sa}/ca.crt"), &ctx.service_account.ca_pem)?;
            files.file(&format!("{sa}/namespace"), ctx.namespace)?;
        }
        Ok(Pod {
            image,
            program,
            args,
            env,
            files,
        })
    }

    /// The pod's process in `ns`, running `binary` (the stand-in for the image's program)
    /// with the pod's arguments, exactly the pod's environment (plus the caller's `PATH`, for
    /// the tools the binary runs) and its files.
    ///
    /// # Errors
    /// As [`PodFiles::command`].
    pub fn command(&self, ns: &Netns, binary: impl AsRef<OsStr>) -> Result<Command> {
        let mut cmd = self.files.command(ns, binary)?;
        cmd.args(&self.args).env_clear();
        cmd.env("PATH", std::env::var("PATH").unwrap_or_default());
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        Ok(cmd)
    }

    /// The command line a real kubelet would run in the container (for messages).
    pub fn command_line(&self) -> String {
        std::iter::once(&self.program)
            .chain(&self.args)
            .map(|a| shell_quote(a))
            .collect::<Vec<_>>()
            .join(" ")
    }

    /// Runs [`Pod::command`] to completion in `ns`, killed after `limit`; returns the exit
    /// code (`None` when killed), the time taken, and the standard output and error (kept in
    /// `dir/run.out` and `dir/run.err`).
    ///
    /// # Errors
    /// [`Error::Io`] / [`Error::Spawn`] when the process cannot be started or its output read.
    pub fn run_bounded(
        &self,
        ns: &Netns,
        binary: impl AsRef<OsStr>,
        dir: &Path,
        limit: Duration,
    ) -> Result<(Option<i32>, Duration, String, String)> {
        let (out_path, err_path) = (dir.join("run.out"), dir.join("run.err"));
        let create =
            |p: &Path| std::fs::File::create(p).map_err(|e| Error::io(p.display().to_string(), e));
        let mut cmd = self.command(ns, binary)?;
        cmd.stdin(Stdio::null())
            .stdout(create(&out_path)?)
            .stderr(create(&err_path)?);
        let started = Instant::now();
        let mut child = ChildGuard::spawn(&mut cmd, &self.program)?;
        let code = loop {
            if let Some(status) = child.try_wait()? {
                break status.code();
            }
            if started.elapsed() > limit {
                break None;
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        let took = started.elapsed();
        drop(child);
        let read = |p: &Path| {
            std::fs::read_to_string(p).map_err(|e| Error::io(p.display().to_string(), e))
        };
        Ok((code, took, read(&out_path)?, read(&err_path)?))
    }
}

/// `s` as one `sh` word: as is when it holds only characters no shell treats specially,
/// single-quoted otherwise.
pub fn shell_quote(s: &str) -> String {
    let plain = !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_./=:,@%+".contains(&b));
    if plain {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', "'\\''"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(yaml: &str) -> Node {
        serde_saphyr::from_str(yaml).unwrap()
    }

    fn template(yaml: &str) -> PodSpec {
        serde_saphyr::from_str(yaml).unwrap()
    }

    const MASTER: &str = "metadata:\n  name: master\n  labels:\n    kubernetes.io/os: linux\n    \
                          kube-proxy-rs/proxy: kube-proxy-rs\nspec:\n  taints:\n  - key: \
                          node-role.kubernetes.io/control-plane\n    effect: NoSchedule\n";

    #[test]
    fn selectors_affinity_and_taints_decide_placement() {
        let master = node(MASTER);
        let plain = "containers: [{name: c}]\nnodeSelector: {kubernetes.io/os: linux}\n";
        // The control plane's taint: not tolerated without a toleration.
        let why = why_not_scheduled(&template(plain), &master)
            .unwrap()
            .unwrap();
        assert!(
            why.contains("node-role.kubernetes.io/control-plane:NoSchedule"),
            "{why}"
        );
        let tolerant = format!("{plain}tolerations: [{{operator: Exists}}]\n");
        assert!(schedules(&template(&tolerant), &master).unwrap());
        let keyed = format!(
            "{plain}tolerations: [{{key: node-role.kubernetes.io/control-plane, operator: Exists, effect: NoSchedule}}]\n"
        );
        assert!(schedules(&template(&keyed), &master).unwrap());
        let other_effect = format!(
            "{plain}tolerations: [{{key: node-role.kubernetes.io/control-plane, operator: Exists, effect: NoExecute}}]\n"
        );
        assert!(!schedules(&template(&other_effect), &master).unwrap());

        let affinity = |op: &str| {
            format!(
                "{tolerant}affinity:\n  nodeAffinity:\n    requiredDuringSchedulingIgnoredDuringExecution:\n      \
                 nodeSelectorTerms:\n      - matchExpressions:\n        - {{key: kube-proxy-rs/proxy, operator: {op}, values: [kube-proxy-rs]}}\n"
            )
        };
        assert!(schedules(&template(&affinity("In")), &master).unwrap());
        let why = why_not_scheduled(&template(&affinity("NotIn")), &master)
            .unwrap()
            .unwrap();
        assert_eq!(
            why,
            "its required node affinity: kube-proxy-rs/proxy NotIn [kube-proxy-rs]"
        );
        let err = schedules(&template(&affinity("Near")), &master).unwrap_err();
        assert!(
            err.to_string().contains("matchExpressions[0].operator"),
            "{err}"
        );

        let selector = "containers: [{name: c}]\nnodeSelector: {kubernetes.io/os: windows}\n\
                        tolerations: [{operator: Exists}]\n";
        let why = why_not_scheduled(&template(selector), &master)
            .unwrap()
            .unwrap();
        assert_eq!(
            why,
            "nodeSelector kubernetes.io/os=windows: the node's label is kubernetes.io/os=linux"
        );
    }

    #[test]
    fn a_pod_gets_its_command_environment_and_files() {
        let dir = tempfile::tempdir().unwrap();
        let spec = template(
            "hostNetwork: true\ncontainers:\n- name: p\n  image: img:1\n  command: [/bin/p, --name=$(NODE_NAME)]\n  \
             args: [--ns=$(NS)]\n  env:\n  - {name: NODE_NAME, valueFrom: {fieldRef: {fieldPath: spec.nodeName}}}\n  \
             - {name: NS, valueFrom: {fieldRef: {fieldPath: metadata.namespace}}}\n  \
             - {name: IP, valueFrom: {fieldRef: {fieldPath: status.hostIP}}}\n  \
             volumeMounts:\n  - {name: cfg, mountPath: /var/lib/p}\n  - {name: lock, mountPath: /run/xtables.lock}\n\
             volumes:\n- {name: cfg, configMap: {name: p}}\n- {name: lock, hostPath: {path: /run/xtables.lock}}\n",
        );
        let cms: BTreeMap<String, ConfigMap> = [(
            "p".to_string(),
            serde_saphyr::from_str::<ConfigMap>("metadata: {name: p}\ndata: {a.conf: hello}\n")
                .unwrap(),
        )]
        .into();
        let sa = ServiceAccountFiles {
            token: "t".into(),
            ca_pem: "ca".into(),
        };
        let env = kubernetes_service_env("10.96.0.1".parse().unwrap(), 443);
        let ctx = PodContext {
            namespace: "kube-system",
            pod_name: "p-master",
            node_name: "master",
            node_ip: Some("192.168.56.10".parse().unwrap()),
            config_maps: &cms,
            service_account: &sa,
            kubelet_env: &env,
        };
        let pod = Pod::new(&spec, &ctx, dir.path()).unwrap();
        assert_eq!(pod.program, "/bin/p");
        assert_eq!(pod.args, ["--name=master", "--ns=kube-system"]);
        assert_eq!(pod.image, "img:1");
        let get = |k: &str| {
            pod.env
                .iter()
                .find(|(n, _)| n == k)
                .map(|(_, v)| v.as_str())
        };
        assert_eq!(get("IP"), Some("192.168.56.10"));
        assert_eq!(get("KUBERNETES_SERVICE_HOST"), Some("10.96.0.1"));
        assert_eq!(get("KUBERNETES_PORT_443_TCP_ADDR"), Some("10.96.0.1"));

        // A missing ConfigMap, an unsupported volume, no command: errors naming the field.
        let empty = BTreeMap::new();
        let err = Pod::new(
            &spec,
            &PodContext {
                config_maps: &empty,
                ..ctx
            },
            dir.path(),
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("volumes[0].configMap.name: ConfigMap kube-system/p not found"),
            "{err}"
        );
        let secret = template(
            "hostNetwork: true\ncontainers:\n- name: p\n  command: [/bin/p]\n  volumeMounts: [{name: s, mountPath: /s}]\n\
             volumes: [{name: s, secret: {secretName: s}}]\n",
        );
        let err = Pod::new(&secret, &ctx, dir.path()).unwrap_err().to_string();
        assert!(
            err.contains("spec.template.spec.volumes[0]: only configMap"),
            "{err}"
        );
        let no_command = template("hostNetwork: true\ncontainers: [{name: p}]\n");
        let err = Pod::new(&no_command, &ctx, dir.path())
            .unwrap_err()
            .to_string();
        assert!(err.contains("containers[0].command: absent"), "{err}");
        let pod_network = template("containers: [{name: p, command: [/bin/p]}]\n");
        let err = Pod::new(&pod_network, &ctx, dir.path())
            .unwrap_err()
            .to_string();
        assert!(err.contains("hostNetwork"), "{err}");
    }
}
