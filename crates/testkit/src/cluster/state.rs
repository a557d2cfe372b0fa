//! The files a test cluster keeps in its directory, which every `test-cluster` command reads:
//!
//! | path | what |
//! |---|---|
//! | `DIR/cluster.json` | [`State`]: the daemon's pid, the namespaces, the server's addresses (written as soon as the namespaces exist, so a killed daemon's can be removed) |
//! | `DIR/test-cluster.pid` | the daemon's pid, written once the cluster is ready, removed when it stops |
//! | `DIR/test-cluster.log` | the daemon's output when started with `--detach` |
//! | `DIR/kubeconfig` | the admin kubeconfig (`KUBECONFIG=DIR/kubeconfig kubectl get nodes`) |
//! | `DIR/pki/` | the cluster's CA (`ca.crt`, `ca.key`) and the server's certificate |
//! | `DIR/kubeadm.yaml` | the objects the cluster was created with |
//! | `DIR/bin/kube-proxy-rs` | a link to the binary the kubelet runs for kube-proxy-rs's image |
//! | `DIR/pods/NODE/` | one record per pod the kubelet started on NODE, and the pod's files |
//! | `DIR/logs/NODE-DAEMONSET.log` | each pod's output (what `kubectl logs` would show) |

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::{Error, Result};

/// The state file's name in the cluster's directory.
pub const STATE_FILE: &str = "cluster.json";
/// The pid file's name in the cluster's directory.
pub const PID_FILE: &str = "test-cluster.pid";

/// One node of the cluster.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct NodeState {
    /// The Node's name (`master`, `worker-1`, ...).
    pub name: String,
    /// Its network namespace (`ip netns list`).
    pub namespace: String,
    /// Its address on the LAN (the Node's InternalIP).
    pub ip: Ipv4Addr,
    /// Its pod CIDR (`10.244.i.0/24`).
    pub pod_cidr: String,
    /// Whether it is the control plane (the API server listens on its address).
    pub control_plane: bool,
}

/// One of the sample workload's pods (an HTTP server answering its name).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct WorkloadPod {
    /// The pod's name (`web-worker-1`), which is also what it answers.
    pub name: String,
    /// The node it runs behind.
    pub node: String,
    /// Its network namespace.
    pub namespace: String,
    /// Its pod IP.
    pub ip: Ipv4Addr,
}

/// What a running test cluster consists of; `DIR/cluster.json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct State {
    /// The cluster's directory (absolute; not stored, set when loaded).
    #[serde(skip)]
    pub dir: PathBuf,
    /// The daemon's pid.
    pub pid: u32,
    /// The LAN namespace (the bridge between the nodes).
    pub lan: String,
    /// The nodes, control plane first.
    pub nodes: Vec<NodeState>,
    /// The sample workload's pods.
    pub pods: Vec<WorkloadPod>,
    /// The API server's URL for this machine's `kubectl` (`https://127.0.0.1:PORT`).
    pub server_local: String,
    /// The API server's URL for the nodes (`https://192.168.56.10:6443`).
    pub server_nodes: String,
}

impl State {
    /// Every namespace of the cluster, the LAN last.
    pub fn namespaces(&self) -> Vec<String> {
        self.pods
            .iter()
            .map(|p| p.namespace.clone())
            .chain(self.nodes.iter().map(|n| n.namespace.clone()))
            .chain([self.lan.clone()])
            .collect()
    }

    /// The node named `name`.
    ///
    /// # Errors
    /// [`Error::Invalid`] naming the nodes there are.
    pub fn node(&self, name: &str) -> Result<&NodeState> {
        self.nodes.iter().find(|n| n.name == name).ok_or_else(|| {
            Error::invalid(
                "node",
                format!(
                    "{name:?}: the test cluster in {} has the nodes {}",
                    self.dir.display(),
                    self.nodes
                        .iter()
                        .map(|n| n.name.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            )
        })
    }

    /// The namespace of the node or workload pod named `name`.
    ///
    /// # Errors
    /// [`Error::Invalid`] naming the nodes and pods there are.
    pub fn namespace_of(&self, name: &str) -> Result<&str> {
        if let Some(n) = self.nodes.iter().find(|n| n.name == name) {
            return Ok(&n.namespace);
        }
        if let Some(p) = self.pods.iter().find(|p| p.name == name) {
            return Ok(&p.namespace);
        }
        Err(Error::invalid(
            "node",
            format!(
                "{name:?}: the test cluster in {} has the nodes {} and the pods {}",
                self.dir.display(),
                self.nodes
                    .iter()
                    .map(|n| n.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
                self.pods
                    .iter()
                    .map(|n| n.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        ))
    }

    /// Writes `DIR/cluster.json`.
    ///
    /// # Errors
    /// [`Error::Io`].
    pub fn save(&self) -> Result<()> {
        let path = self.dir.join(STATE_FILE);
        let text = serde_json::to_string_pretty(self)
            .map_err(|e| Error::invalid("cluster state", e.to_string()))?;
        write_atomic(&path, &text)
    }

    /// Reads `DIR/cluster.json`, whether the daemon runs or not; `None` when there is none.
    ///
    /// # Errors
    /// [`Error::Io`] when it cannot be read, [`Error::Invalid`] when it is not one.
    pub fn load(dir: &Path) -> Result<Option<State>> {
        let dir = absolute(dir)?;
        let path = dir.join(STATE_FILE);
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(Error::io(path.display().to_string(), e)),
        };
        let mut state: State = serde_json::from_str(&text)
            .map_err(|e| Error::invalid("cluster state", format!("{}: {e}", path.display())))?;
        state.dir = dir;
        Ok(Some(state))
    }

    /// The state of the cluster whose daemon runs in `dir`.
    ///
    /// # Errors
    /// [`Error::Invalid`] saying how to start one when none runs there.
    pub fn load_running(dir: &Path) -> Result<State> {
        let shown = dir.display();
        let Some(pid) = daemon_pid(dir)? else {
            return Err(Error::invalid(
                "test cluster",
                format!("none is running in {shown} (start one with `test-cluster up {shown}`)"),
            ));
        };
        if !process_alive(pid) {
            return Err(Error::invalid(
                "test cluster",
                format!(
                    "its daemon (pid {pid}) in {shown} is gone; `test-cluster down {shown}` \
                     removes what it left"
                ),
            ));
        }
        let state = State::load(dir)?.ok_or_else(|| {
            Error::invalid("test cluster", format!("{shown}/{STATE_FILE} is missing"))
        })?;
        Ok(state)
    }
}

/// The pid in `DIR/test-cluster.pid`, if there is one.
///
/// # Errors
/// [`Error::Io`] when it cannot be read, [`Error::Invalid`] when it holds no pid.
pub fn daemon_pid(dir: &Path) -> Result<Option<u32>> {
    let path = dir.join(PID_FILE);
    match std::fs::read_to_string(&path) {
        Ok(t) => t.trim().parse().map(Some).map_err(|_| {
            Error::invalid(
                "pid file",
                format!("{}: {:?} is not a pid", path.display(), t),
            )
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(Error::io(path.display().to_string(), e)),
    }
}

/// `dir` made absolute (against the current directory), without resolving links.
///
/// # Errors
/// [`Error::Io`] when the current directory is unknown.
pub fn absolute(dir: &Path) -> Result<PathBuf> {
    std::path::absolute(dir).map_err(|e| Error::io(format!("resolving {}", dir.display()), e))
}

/// Writes `text` to `path` through a temporary file and a rename, so a reader never sees
/// half of it.
///
/// # Errors
/// [`Error::Io`].
pub fn write_atomic(path: &Path, text: &str) -> Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).map_err(|e| Error::io(format!("writing {}", tmp.display()), e))?;
    std::fs::rename(&tmp, path).map_err(|e| {
        Error::io(
            format!("renaming {} to {}", tmp.display(), path.display()),
            e,
        )
    })
}

/// The start time of process `pid` (field 22 of `/proc/PID/stat`, in clock ticks since
/// boot), which with the pid identifies one process (a pid is reused, the pair is not);
/// `None` when there is no such process or it is a zombie.
pub fn process_start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may hold spaces: fields after the
    // last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // fields[0] is field 3 (the state), so field 22 is fields[19].
    if matches!(fields.first(), Some(&"Z" | &"X")) {
        return None;
    }
    fields.get(19)?.parse().ok()
}

/// Whether process `pid` exists and is not a zombie.
pub fn process_alive(pid: u32) -> bool {
    process_start_time(pid).is_some()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_time_identifies_a_live_process() {
        let me = std::process::id();
        let t = process_start_time(me).unwrap();
        assert_eq!(process_start_time(me), Some(t));
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        // Exited but not waited for: a zombie, which does not count as running.
        std::thread::sleep(std::time::Duration::from_millis(200));
        assert!(!process_alive(pid));
        child.wait().unwrap();
        assert!(!process_alive(pid));
    }

    #[test]
    fn names_resolve_to_namespaces() {
        let state = State {
            dir: "/tmp/c".into(),
            pid: 1,
            lan: "kp1x0-lan".into(),
            nodes: vec![NodeState {
                name: "master".into(),
                namespace: "kp1x1-master".into(),
                ip: Ipv4Addr::new(192, 168, 56, 10),
                pod_cidr: "10.244.0.0/24".into(),
                control_plane: true,
            }],
            pods: vec![WorkloadPod {
                name: "web-worker-1".into(),
                node: "worker-1".into(),
                namespace: "kp1x3-web-worker-1".into(),
                ip: Ipv4Addr::new(10, 244, 1, 10),
            }],
            server_local: String::new(),
            server_nodes: String::new(),
        };
        assert_eq!(state.namespace_of("master").unwrap(), "kp1x1-master");
        assert_eq!(
            state.namespace_of("web-worker-1").unwrap(),
            "kp1x3-web-worker-1"
        );
        let err = state.namespace_of("worker-9").unwrap_err().to_string();
        assert!(
            err.contains("has the nodes master and the pods web-worker-1"),
            "{err}"
        );
        assert_eq!(
            state.namespaces(),
            ["kp1x3-web-worker-1", "kp1x1-master", "kp1x0-lan"]
        );
    }
}
