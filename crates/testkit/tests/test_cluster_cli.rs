//! The `test-cluster` binary itself (its commands end to end are
//! kube-proxy-rs/tests/test_cluster.rs): `--help` says what is simulated, and the errors a
//! user meets first name what to do.

use std::process::Command;

use kp_testkit::require_root;

const TOOL: &str = env!("CARGO_BIN_EXE_test-cluster");

fn run(args: &[&str]) -> (Option<i32>, String, String) {
    let out = Command::new(TOOL).args(args).output().unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn help_says_what_is_simulated() {
    let (code, out, _) = run(&["--help"]);
    assert_eq!(code, Some(0));
    for text in [
        "What is real:",
        "What is simulated: each node is a network namespace",
        "upstream kube-proxy's pods are not run",
        "RBAC is not enforced",
        "up ",
        "down ",
        "kubelet ",
        "job ",
        "exec ",
    ] {
        assert!(out.contains(text), "no {text:?} in:\n{out}");
    }
    let (code, out, _) = run(&["kubelet", "--help"]);
    assert_eq!(code, Some(0));
    assert!(out.contains("--wait[=<SECONDS>]"), "{out}");
    assert!(out.contains("upstream kube-proxy's are not run"), "{out}");
}

#[test]
fn commands_without_a_cluster_say_how_to_start_one() {
    if !require_root() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    let (code, _, err) = run(&["kubelet", d, "master"]);
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains(&format!(
            "none is running in {d} (start one with `test-cluster up {d}`)"
        )),
        "{err}"
    );
    let (code, _, err) = run(&["exec", d, "master", "--", "true"]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("none is running"), "{err}");
    let (code, out, _) = run(&["down", d]);
    assert_eq!(code, Some(0));
    assert!(out.contains(&format!("no test cluster in {d}")), "{out}");
    let (code, _, err) = run(&["up", d, "--workers", "0"]);
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("invalid workers: 0: between 1 and 20"),
        "{err}"
    );
    assert!(!dir.path().join("cluster.json").exists());
    let (code, _, err) = run(&["exec", d, "master"]);
    assert_eq!(code, Some(2), "a command is required: {err}");
}
