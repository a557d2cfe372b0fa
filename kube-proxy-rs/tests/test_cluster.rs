//! docs/deploy.md's "Trying the migration without a cluster", walked end to end as a new user
//! walks it: bash runs the page's tagged blocks as written (`test-cluster up`, steps 1 to 4,
//! the pre-flight Job, the canary's kubelet, the checks on the canary, rolling the node back,
//! `test-cluster down`), with `test-cluster` on `PATH`; then nothing of the cluster is left
//! (no namespace, no daemon, no pod process). A second trial stops a foreground cluster with
//! SIGINT (Ctrl-C) and checks the same.
//!
//! This test binary is also the tool: with `KP_TEST_CLUSTER_TOOL=1` its `main` is
//! `kp_testkit::cluster::cli::main_from`, exactly the `test-cluster` binary's `main` (cargo
//! builds only this package's binaries for its tests, so kp-testkit's `test-cluster` binary
//! is not available here, while `kube-proxy-rs` is). `PATH` gets a `test-cluster` script that
//! runs it so, adding `--binary` (this package's kube-proxy-rs) to `up`.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use kp_testkit::cluster::state::{State, process_alive};
use kp_testkit::{list_namespaces, require_root};
use libtest_mimic::{Arguments, Failed, Trial};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::Value;

const TOOL_ENV: &str = "KP_TEST_CLUSTER_TOOL";
const BIN: &str = env!("CARGO_BIN_EXE_kube-proxy-rs");

fn main() -> ExitCode {
    if std::env::var_os(TOOL_ENV).is_some() {
        return kp_testkit::cluster::cli::main_from(std::env::args_os());
    }
    let args = Arguments::from_args();
    let trials = vec![
        Trial::test("the_migration_walks_end_to_end_on_test_cluster", walk),
        Trial::test("ctrl_c_in_the_foreground_removes_everything", ctrl_c),
    ];
    libtest_mimic::run(&args, trials).exit_code()
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// docs/deploy.md's ```` ```sh TAG ```` block.
fn doc_block(tag: &str) -> String {
    let doc = read(&repo().join("docs/deploy.md"));
    let mut lines = doc
        .lines()
        .skip_while(|l| l.trim() != format!("```sh {tag}"));
    assert!(
        lines.next().is_some(),
        "docs/deploy.md has no ```sh {tag} block"
    );
    let block: Vec<&str> = lines.take_while(|l| l.trim() != "```").collect();
    block.join("\n") + "\n"
}

/// A user's shell: `test-cluster` on `PATH`, `CLUSTER` set, and (after `up`) `KUBECONFIG`.
struct Shell {
    bin: PathBuf,
    cluster: PathBuf,
}

impl Shell {
    fn new(dir: &Path) -> Shell {
        let bin = dir.join("bin");
        std::fs::create_dir_all(&bin).unwrap();
        let me = std::env::current_exe().unwrap();
        let script = bin.join("test-cluster");
        std::fs::write(
            &script,
            format!(
                "#!/bin/sh\nexport {TOOL_ENV}=1\n\
                 if [ \"$1\" = up ]; then exec '{me}' \"$@\" --binary '{BIN}'; fi\n\
                 exec '{me}' \"$@\"\n",
                me = me.display()
            ),
        )
        .unwrap();
        std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
        Shell {
            bin,
            cluster: dir.join("cluster"),
        }
    }

    fn path(&self) -> String {
        format!(
            "{}:{}",
            self.bin.display(),
            std::env::var("PATH").unwrap_or_default()
        )
    }

    /// Runs `script` with `bash -euo pipefail` in `cwd`; (success, stdout + stderr).
    fn try_script(&self, script: &str, cwd: &Path, env: &[(&str, &str)]) -> (bool, String) {
        let out = Command::new("bash")
            .args(["-euo", "pipefail", "-c", script])
            .current_dir(cwd)
            .env("PATH", self.path())
            .env("CLUSTER", &self.cluster)
            .env("KUBECONFIG", self.cluster.join("kubeconfig"))
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .output()
            .unwrap();
        (
            out.status.success(),
            format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        )
    }

    fn script(&self, script: &str, cwd: &Path, env: &[(&str, &str)]) -> String {
        let (ok, out) = self.try_script(script, cwd, env);
        assert!(ok, "{script}\n{out}");
        out
    }

    /// docs/deploy.md's block `tag`, as written.
    fn block(&self, tag: &str, cwd: &Path, env: &[(&str, &str)]) -> String {
        let script = doc_block(tag);
        let (ok, out) = self.try_script(&script, cwd, env);
        assert!(ok, "docs/deploy.md block {tag}:\n{script}\n{out}");
        out
    }
}

fn contains(out: &str, what: &str, when: &str) {
    assert!(out.contains(what), "{when}: no {what:?} in:\n{out}");
}

/// The pid of the pod the kubelet started for `daemonset` on `node`.
fn pod_pid(cluster: &Path, node: &str, daemonset: &str) -> u32 {
    let record: Value = serde_json::from_str(&read(
        &cluster
            .join("pods")
            .join(node)
            .join(format!("kube-system_{daemonset}.json")),
    ))
    .unwrap();
    u32::try_from(record["pid"].as_u64().unwrap()).unwrap()
}

/// Nothing of the cluster whose state was `state` is left: no daemon, none of its
/// namespaces, none of `pods`, no pid or state file.
fn nothing_left(state: &State, pods: &[u32]) {
    assert!(
        !process_alive(state.pid),
        "the daemon {} still runs",
        state.pid
    );
    for pid in pods {
        assert!(!process_alive(*pid), "the pod process {pid} still runs");
    }
    let now: BTreeSet<String> = list_namespaces().unwrap().into_iter().collect();
    for ns in state.namespaces() {
        assert!(!now.contains(&ns), "namespace {ns} is left");
    }
    let prefix = format!("kp{}x", state.pid);
    assert!(
        !now.iter().any(|n| n.starts_with(&prefix)),
        "a namespace of the daemon is left: {now:?}"
    );
    for file in ["cluster.json", "test-cluster.pid"] {
        assert!(!state.dir.join(file).exists(), "{file} is left");
    }
}

fn tools_installed() -> bool {
    for tool in ["kubectl", "curl", "openssl"] {
        let found = Command::new("sh")
            .args(["-c", &format!("command -v {tool}")])
            .output()
            .is_ok_and(|o| o.status.success());
        assert!(
            found,
            "{tool} is not installed: scripts/install-deps installs it"
        );
    }
    true
}

fn walk() -> Result<(), Failed> {
    if !require_root() || !tools_installed() {
        return Ok(());
    }
    let tmp = tempfile::Builder::new()
        .prefix("kp-test-cluster-")
        .tempdir()
        .unwrap();
    let sh = Shell::new(tmp.path());
    let cluster = sh.cluster.clone();

    // Up: kubectl reaches the server; kubeadm's cluster is there.
    let out = sh.block("test-cluster-up", &repo(), &[]);
    for node in ["master", "worker-1", "worker-2"] {
        contains(&out, node, "kubectl get nodes");
    }
    let state = State::load(&cluster).unwrap().expect("cluster.json");
    let result = std::panic::catch_unwind(|| walk_up_cluster(&sh, &cluster));
    if result.is_err() {
        // Leave nothing behind for the next run, whatever failed.
        let _ = sh.try_script("test-cluster down \"$CLUSTER\"", &cluster, &[]);
    }
    let pods = match result {
        Ok(pods) => pods,
        Err(panic) => std::panic::resume_unwind(panic),
    };

    // Down: nothing left.
    let out = sh.block("test-cluster-down", &cluster, &[]);
    contains(&out, "stopped the daemon", "down");
    contains(&out, "is down", "down");
    nothing_left(&state, &pods);
    Ok(())
}

/// Everything between `up` and `down`; the pids of the pods it started.
fn walk_up_cluster(sh: &Shell, cluster: &Path) -> Vec<u32> {
    // Before the migration: kubeadm's kube-proxy is placed on every node and said not to
    // run (its image is not here), with the command it would run.
    let out = sh.script("test-cluster kubelet \"$CLUSTER\" master", cluster, &[]);
    contains(
        &out,
        "kube-system/kube-proxy: on master but not run: its image registry.k8s.io/kube-proxy:v1.32.4 \
         is not on this machine (test-cluster runs only kube-proxy-rs); its pod would run: \
         /usr/local/bin/kube-proxy --config=/var/lib/kube-proxy/config.conf --hostname-override=master",
        "kubelet before the migration",
    );

    // Steps 1 and 2, and the pre-flight check, run by `test-cluster job`.
    sh.block("copy-config", cluster, &[]);
    contains(
        &read(&cluster.join("deploy/configmap.yaml")),
        "server: https://192.168.56.10:6443",
        "step 1's ConfigMap",
    );
    let out = sh.block("apply", cluster, &[]);
    contains(&out, "daemonset.apps/kube-proxy-rs created", "step 2");
    let out = sh.block("test-cluster-preflight", cluster, &[]);
    contains(
        &out,
        "job.batch/kube-proxy-rs-preflight created",
        "pre-flight",
    );
    contains(&out, "-A KUBE-SVC-", "the pre-flight check's rules");
    contains(
        &out,
        "Job kube-system/kube-proxy-rs-preflight on worker-1: Complete (exit 0)",
        "pre-flight",
    );

    // Steps 3 and 4: the canary's kubelet runs kube-proxy-rs, Ready.
    sh.block("kube-proxy-leaves-labelled-nodes", cluster, &[]);
    sh.block("canary", cluster, &[("CANARY", "worker-1")]);
    let out = sh.block("test-cluster-kubelet", cluster, &[("CANARY", "worker-1")]);
    contains(
        &out,
        "kube-system/kube-proxy: not on worker-1: its required node affinity: kube-proxy-rs/proxy NotIn [kube-proxy-rs]",
        "the canary's kubelet",
    );
    contains(
        &out,
        "kube-system/kube-proxy-rs: started on worker-1",
        "the canary's kubelet",
    );
    contains(
        &out,
        "--config=/var/lib/kube-proxy/config.conf --hostname-override=worker-1",
        "the canary's kubelet",
    );
    contains(
        &out,
        "kube-system/kube-proxy-rs on worker-1: Ready after",
        "the canary's kubelet --wait",
    );
    let canary_pid = pod_pid(cluster, "worker-1", "kube-proxy-rs");
    assert!(process_alive(canary_pid));

    // Step 4's checks on the canary: health, readiness, mode, the kubernetes Service to the
    // API server and a sample Service through the canary's rules, the trace, the log.
    let out = sh.block("test-cluster-canary", cluster, &[("CANARY", "worker-1")]);
    contains(&out, "\"healthy\":true", "/healthz");
    contains(&out, "}} 200\n", "/healthz");
    contains(&out, "\nok\n 200\n", "/readyz");
    contains(&out, "\niptables 200\n", "/proxyMode");
    contains(&out, "\nok 200\n", "the kubernetes Service's /livez");
    contains(&out, "web-worker-", "the web Service");
    contains(&out, "DNAT 10.244.1.10:8080", "the trace");
    contains(&out, "DNAT 10.244.2.10:8080", "the trace");
    contains(
        &out,
        "API server https://192.168.56.10:6443 (from --kubeconfig /var/lib/kube-proxy/kubeconfig.conf)",
        "the log",
    );
    let livez = sh.script(
        "test-cluster exec \"$CLUSTER\" worker-1 -- curl -sk https://10.96.0.1/livez",
        cluster,
        &[],
    );
    assert_eq!(livez, "ok", "the kubernetes Service through the canary");
    // Both endpoints of the web Service answer through the canary.
    let answers = sh.script(
        "for i in $(seq 30); do test-cluster exec \"$CLUSTER\" worker-1 -- curl -s -m 2 10.96.0.100; done",
        cluster,
        &[],
    );
    let seen: BTreeSet<&str> = answers.lines().collect();
    assert_eq!(
        seen,
        ["web-worker-1", "web-worker-2"].into(),
        "web Service answers: {answers}"
    );
    // Before the rules, the same request fails: on worker-2 nothing programs them.
    let (ok, out) = sh.try_script(
        "test-cluster exec \"$CLUSTER\" worker-2 -- curl -s -m 2 10.96.0.100",
        cluster,
        &[],
    );
    assert!(!ok, "worker-2 runs no proxy: {out}");

    // A second pass changes nothing.
    let out = sh.block("test-cluster-kubelet", cluster, &[("CANARY", "worker-1")]);
    contains(
        &out,
        &format!("kube-system/kube-proxy-rs: running on worker-1 (pid {canary_pid})"),
        "a second pass",
    );

    // Rolling the canary back: its kubelet stops kube-proxy-rs's pod.
    sh.block("rollback-node", cluster, &[("NODE", "worker-1")]);
    let out = sh.block("test-cluster-kubelet", cluster, &[("CANARY", "worker-1")]);
    contains(
        &out,
        &format!("kube-system/kube-proxy-rs on worker-1: stopped (pid {canary_pid})"),
        "the rollback's kubelet",
    );
    contains(
        &out,
        "kube-system/kube-proxy: on worker-1 but not run",
        "the rollback's kubelet",
    );
    assert!(!process_alive(canary_pid), "the canary's pod is stopped");

    // Another canary: a ConfigMap edit restarts its pod at the next pass; --stop stops it;
    // the last one is left running for `down` to stop.
    sh.block("canary", cluster, &[("CANARY", "worker-2")]);
    let out = sh.block("test-cluster-kubelet", cluster, &[("CANARY", "worker-2")]);
    contains(
        &out,
        "kube-system/kube-proxy-rs on worker-2: Ready after",
        "worker-2",
    );
    let first = pod_pid(cluster, "worker-2", "kube-proxy-rs");
    sh.script(
        "kubectl -n kube-system patch configmap kube-proxy-rs --type merge -p '{\"data\":{\"note\":\"edited\"}}'",
        cluster,
        &[],
    );
    let out = sh.block("test-cluster-kubelet", cluster, &[("CANARY", "worker-2")]);
    contains(
        &out,
        &format!(
            "kube-system/kube-proxy-rs on worker-2: stopped (pid {first}) (its DaemonSet, \
             ConfigMaps or binary changed; starting it again)"
        ),
        "a pass after a ConfigMap edit",
    );
    contains(
        &out,
        "kube-system/kube-proxy-rs on worker-2: Ready after",
        "the restart",
    );
    let second = pod_pid(cluster, "worker-2", "kube-proxy-rs");
    assert!(second != first && !process_alive(first));
    assert!(
        cluster
            .join("logs/worker-2-kube-proxy-rs.previous.log")
            .exists()
    );
    let out = sh.script(
        "test-cluster kubelet \"$CLUSTER\" worker-2 --stop",
        cluster,
        &[],
    );
    contains(
        &out,
        &format!("kube-system/kube-proxy-rs on worker-2: stopped (pid {second})"),
        "--stop",
    );
    assert!(!process_alive(second));
    let out = sh.block("test-cluster-kubelet", cluster, &[("CANARY", "worker-2")]);
    contains(
        &out,
        "kube-system/kube-proxy-rs: started on worker-2",
        "after --stop",
    );
    vec![
        canary_pid,
        first,
        second,
        pod_pid(cluster, "worker-2", "kube-proxy-rs"),
    ]
}

/// `up` in the foreground, a pod running, SIGINT (what Ctrl-C sends): the daemon stops the
/// pod, the API server and every namespace, and exits 0.
fn ctrl_c() -> Result<(), Failed> {
    if !require_root() || !tools_installed() {
        return Ok(());
    }
    let tmp = tempfile::Builder::new()
        .prefix("kp-test-cluster-")
        .tempdir()
        .unwrap();
    let sh = Shell::new(tmp.path());
    let cluster = sh.cluster.clone();
    let out_path = tmp.path().join("up.out");
    let mut up = Command::new(std::env::current_exe().unwrap())
        .env(TOOL_ENV, "1")
        .args([
            "up",
            cluster.to_str().unwrap(),
            "--workers",
            "1",
            "--binary",
            BIN,
        ])
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out_path).unwrap())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let started = Instant::now();
    while !cluster.join("test-cluster.pid").exists() {
        if let Some(status) = up.try_wait().unwrap() {
            panic!("up exited ({status}):\n{}", read(&out_path));
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "not up in 60 s"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let state = State::load(&cluster).unwrap().unwrap();
    assert_eq!(state.pid, up.id());
    assert_eq!(state.nodes.len(), 2);

    let run = std::panic::catch_unwind(|| {
        sh.script(
            &format!("cp -r '{}/deploy' .", repo().display()),
            &cluster,
            &[],
        );
        sh.block("copy-config", &cluster, &[]);
        sh.block("apply", &cluster, &[]);
        sh.block("canary", &cluster, &[("CANARY", "master")]);
        sh.block("test-cluster-kubelet", &cluster, &[("CANARY", "master")]);
        pod_pid(&cluster, "master", "kube-proxy-rs")
    });
    kill(Pid::from_raw(up.id() as i32), Signal::SIGINT).unwrap();
    let started = Instant::now();
    let status = loop {
        if let Some(status) = up.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > Duration::from_secs(60) {
            let _ = up.kill();
            panic!("still running 60 s after SIGINT:\n{}", read(&out_path));
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let pod = match run {
        Ok(pid) => pid,
        Err(panic) => std::panic::resume_unwind(panic),
    };
    let out = read(&out_path);
    assert!(status.success(), "{status}:\n{out}");
    contains(&out, "SIGINT: stopping the cluster", "the daemon's output");
    contains(
        &out,
        &format!("kube-system/kube-proxy-rs on master: stopped (pid {pod})"),
        "the daemon's output",
    );
    nothing_left(&state, &[pod]);
    Ok(())
}
