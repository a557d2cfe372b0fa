//! Shared helpers for the integration tests: a network namespace guard for tests that
//! run the real iptables binaries (never in the root namespace).

#![allow(dead_code)]

use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};

/// Whether we run as root (required to create network namespaces).
pub fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(2).map(|euid| euid == "0"))
        })
        .unwrap_or(false)
}

/// Whether `program` is on PATH.
pub fn have(program: &str) -> bool {
    std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join(program).is_file()))
        .unwrap_or(false)
}

/// A fresh network namespace `kpnf-<pid>-<n>`, deleted on drop (even if the test
/// panics).
pub struct Netns {
    name: String,
}

static COUNTER: AtomicUsize = AtomicUsize::new(0);

impl Netns {
    /// Creates the namespace; panics if `ip netns add` fails.
    pub fn new() -> Netns {
        let n = COUNTER.fetch_add(1, Ordering::SeqCst);
        let name = format!("kpnf-{}-{n}", std::process::id());
        let out = Command::new("ip")
            .args(["netns", "add", &name])
            .output()
            .expect("run ip netns add");
        assert!(
            out.status.success(),
            "ip netns add {name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Netns { name }
    }

    /// The namespace name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// `["ip", "netns", "exec", NAME]`, for `SystemExec::with_prefix`.
    pub fn prefix(&self) -> Vec<String> {
        ["ip", "netns", "exec", &self.name]
            .iter()
            .map(|s| s.to_string())
            .collect()
    }

    /// Runs `argv` inside the namespace with `stdin`.
    pub fn run(&self, argv: &[&str], stdin: Option<&[u8]>) -> Output {
        use std::io::Write as _;
        let mut child = Command::new("ip")
            .args(["netns", "exec", &self.name])
            .args(argv)
            .stdin(if stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn ip netns exec");
        if let (Some(mut pipe), Some(data)) = (child.stdin.take(), stdin) {
            let _ = pipe.write_all(data);
        }
        child.wait_with_output().expect("wait")
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

/// Skips (returns false, with a message) when not root or without `ip`.
pub fn kernel_tests_possible(test: &str) -> bool {
    if !is_root() || !have("ip") {
        eprintln!("skipping {test}: needs root and iproute2 to create a network namespace");
        return false;
    }
    true
}

/// Lines of an iptables-save text without `#` comments.
pub fn save_lines(text: &str) -> Vec<String> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(str::to_string)
        .collect()
}
