//! One-time node settings upstream kube-proxy applies when it starts: the conntrack sysctls
//! (`--conntrack-*`) and the process's `oom_score_adj` (`--oom-score-adj`).
//!
//! As upstream, a value of 0 leaves a setting as it is, and a setting that cannot be
//! written (a read-only `/proc/sys` or `/sys`, `nf_conntrack_max` inside a network namespace
//! other than the initial one, the module not loaded) gets a warning, not an error: the
//! proxy works without them. The conntrack sysctls are applied by the daemon and by
//! `--init-only`; `oom_score_adj` by the daemon only (upstream sets it in `Run`). Neither
//! is applied by `--dry-run`, `--once`, `--cleanup` or `--write-config-to`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use tracing::{info, warn};

use crate::cli::ProxyArgs;

/// The conntrack settings of `--conntrack-*` (and the config file's `conntrack`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConntrackSettings {
    /// `--conntrack-max-per-core` (0: leave `nf_conntrack_max` as it is).
    pub max_per_core: u32,
    /// `--conntrack-min`.
    pub min: u32,
    /// `--conntrack-tcp-timeout-established` (0: leave as is).
    pub tcp_established: Duration,
    /// `--conntrack-tcp-timeout-close-wait` (0: leave as is).
    pub tcp_close_wait: Duration,
    /// `--conntrack-udp-timeout` (0: leave as is).
    pub udp: Duration,
    /// `--conntrack-udp-timeout-stream` (0: leave as is).
    pub udp_stream: Duration,
    /// `--conntrack-tcp-be-liberal`: also sets `nf_conntrack_tcp_be_liberal` to 1.
    pub tcp_be_liberal: bool,
}

impl ConntrackSettings {
    /// The settings the flags give.
    pub fn from_args(args: &ProxyArgs) -> Self {
        ConntrackSettings {
            max_per_core: u32::try_from(args.conntrack_max_per_core).unwrap_or(0),
            min: u32::try_from(args.conntrack_min).unwrap_or(0),
            tcp_established: args.conntrack_tcp_timeout_established,
            tcp_close_wait: args.conntrack_tcp_timeout_close_wait,
            udp: args.conntrack_udp_timeout,
            udp_stream: args.conntrack_udp_timeout_stream,
            tcp_be_liberal: args.conntrack_tcp_be_liberal,
        }
    }

    /// The `nf_conntrack_max` to set on a node with `cpus` CPUs: `max(max_per_core × cpus,
    /// min)`, or `None` when `max_per_core` is 0 (leave it).
    pub fn conntrack_max(&self, cpus: u64) -> Option<u64> {
        (self.max_per_core > 0)
            .then(|| (u64::from(self.max_per_core) * cpus).max(u64::from(self.min)))
    }

    /// The sysctls (names under `net/netfilter/`) and values in seconds to write, leaving out
    /// the ones that are 0. `nf_conntrack_max` comes first when it is set.
    pub fn sysctls(&self, cpus: u64) -> Vec<(&'static str, u64)> {
        let mut out = Vec::new();
        if let Some(max) = self.conntrack_max(cpus) {
            out.push(("nf_conntrack_max", max));
        }
        for (name, d) in [
            ("nf_conntrack_tcp_timeout_established", self.tcp_established),
            ("nf_conntrack_tcp_timeout_close_wait", self.tcp_close_wait),
            ("nf_conntrack_udp_timeout", self.udp),
            ("nf_conntrack_udp_timeout_stream", self.udp_stream),
        ] {
            if d.as_secs() > 0 {
                out.push((name, d.as_secs()));
            }
            if name == "nf_conntrack_tcp_timeout_close_wait" && self.tcp_be_liberal {
                out.push(("nf_conntrack_tcp_be_liberal", 1));
            }
        }
        out
    }
}

/// Counts the CPUs of a kernel CPU list such as `0-3,8,10-11`.
pub fn count_cpu_list(list: &str) -> Option<u64> {
    let mut n = 0u64;
    for part in list.trim().split(',').filter(|p| !p.is_empty()) {
        n += match part.split_once('-') {
            Some((a, b)) => {
                let (a, b) = (a.parse::<u64>().ok()?, b.parse::<u64>().ok()?);
                b.checked_sub(a)? + 1
            }
            None => {
                part.parse::<u64>().ok()?;
                1
            }
        };
    }
    (n > 0).then_some(n)
}

/// The node's CPU count, as upstream counts it: the machine's online CPUs
/// (`/sys/devices/system/cpu/online`), else the CPUs this process may run on.
pub fn cpu_count() -> u64 {
    if let Some(n) = std::fs::read_to_string("/sys/devices/system/cpu/online")
        .ok()
        .and_then(|t| count_cpu_list(&t))
    {
        return n;
    }
    match nix::sched::sched_getaffinity(nix::unistd::Pid::from_raw(0)) {
        Ok(set) => {
            let n = (0..nix::sched::CpuSet::count())
                .filter(|&i| set.is_set(i).unwrap_or(false))
                .count();
            u64::try_from(n.max(1)).unwrap_or(1)
        }
        Err(_) => std::thread::available_parallelism()
            .map(|n| u64::try_from(n.get()).unwrap_or(1))
            .unwrap_or(1),
    }
}

/// Whether this process is in the initial network namespace (the same as PID 1's).
fn in_initial_netns() -> bool {
    match (
        std::fs::metadata("/proc/self/ns/net"),
        std::fs::metadata("/proc/1/ns/net"),
    ) {
        (Ok(a), Ok(b)) => {
            use std::os::unix::fs::MetadataExt;
            a.ino() == b.ino() && a.dev() == b.dev()
        }
        _ => false,
    }
}

/// Writes one sysctl under `dir` (`/proc/sys/net/netfilter`) when its value differs.
/// Returns whether it was written.
fn set_sysctl(dir: &Path, name: &str, value: u64) -> std::io::Result<bool> {
    let path = dir.join(name);
    let current = std::fs::read_to_string(&path)?;
    if current.trim().parse::<u64>().ok() == Some(value) {
        return Ok(false);
    }
    std::fs::write(&path, format!("{value}\n"))?;
    Ok(true)
}

/// Applies the conntrack sysctls under `dir` (normally `/proc/sys/net/netfilter`), each
/// failure a warning. Returns the names that could not be set.
pub fn apply_conntrack_in(dir: &Path, settings: &ConntrackSettings, cpus: u64) -> Vec<String> {
    let mut failed = Vec::new();
    for (name, value) in settings.sysctls(cpus) {
        match set_sysctl(dir, name, value) {
            Ok(true) => info!(sysctl = %format!("net/netfilter/{name}"), value, "set sysctl"),
            Ok(false) => {}
            Err(e) => {
                warn!(sysctl = %format!("net/netfilter/{name}"), value, error = %e, "cannot set sysctl; leaving it as it is");
                failed.push(name.to_string());
            }
        }
    }
    failed
}

/// The conntrack hash table size upstream asks for with `nf_conntrack_max = max`: `max / 4`
/// when the current size is smaller, else `None`.
pub fn wanted_hashsize(current: u64, max: u64) -> Option<u64> {
    (current < max / 4).then_some(max / 4)
}

/// Applies the conntrack settings to this node: the sysctls, then (as upstream) raises
/// `/sys/module/nf_conntrack/parameters/hashsize` to `nf_conntrack_max / 4` when it is
/// smaller. The hash size is global; the kernel accepts it from the initial network
/// namespace only, so elsewhere it is left alone with a warning.
pub fn apply_conntrack(settings: &ConntrackSettings) {
    let cpus = cpu_count();
    let dir = Path::new("/proc/sys/net/netfilter");
    let failed = apply_conntrack_in(dir, settings, cpus);
    let Some(max) = settings.conntrack_max(cpus) else {
        return;
    };
    if failed.iter().any(|n| n == "nf_conntrack_max") {
        return;
    }
    let hashsize = PathBuf::from("/sys/module/nf_conntrack/parameters/hashsize");
    let Some(current) = std::fs::read_to_string(&hashsize)
        .ok()
        .and_then(|t| t.trim().parse::<u64>().ok())
    else {
        return;
    };
    let Some(wanted) = wanted_hashsize(current, max) else {
        return;
    };
    if !in_initial_netns() {
        warn!(
            current,
            wanted, "not in the initial network namespace: leaving the conntrack hashsize as it is"
        );
        return;
    }
    match std::fs::write(&hashsize, format!("{wanted}\n")) {
        Ok(()) => info!(hashsize = wanted, "set conntrack hashsize"),
        Err(e) => {
            warn!(current, wanted, error = %e, "cannot set the conntrack hashsize (is /sys read-only?)")
        }
    }
}

/// Writes `value` to `path` (`/proc/self/oom_score_adj`) unless it holds that value already;
/// a warning if it cannot.
pub fn apply_oom_score_adj_at(path: &Path, value: i32) -> bool {
    if std::fs::read_to_string(path).is_ok_and(|cur| cur.trim() == value.to_string()) {
        return true;
    }
    match std::fs::write(path, format!("{value}\n")) {
        Ok(()) => {
            info!(oom_score_adj = value, "set oom_score_adj");
            true
        }
        Err(e) => {
            warn!(oom_score_adj = value, error = %e, "cannot set oom_score_adj; leaving it as it is");
            false
        }
    }
}

/// `--oom-score-adj`: sets this process's `oom_score_adj`, a warning if it cannot.
pub fn apply_oom_score_adj(value: i32) {
    apply_oom_score_adj_at(Path::new("/proc/self/oom_score_adj"), value);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn defaults() -> ConntrackSettings {
        ConntrackSettings {
            max_per_core: 32768,
            min: 131072,
            tcp_established: Duration::from_secs(86400),
            tcp_close_wait: Duration::from_secs(3600),
            udp: Duration::ZERO,
            udp_stream: Duration::ZERO,
            tcp_be_liberal: false,
        }
    }

    #[test]
    fn cpu_lists() {
        assert_eq!(count_cpu_list("0-1\n"), Some(2));
        assert_eq!(count_cpu_list("0-3,8,10-11"), Some(7));
        assert_eq!(count_cpu_list("0"), Some(1));
        assert_eq!(count_cpu_list(""), None);
        assert_eq!(count_cpu_list("x"), None);
    }

    #[test]
    fn conntrack_max_is_per_core_times_cpus_at_least_min() {
        let s = defaults();
        assert_eq!(s.conntrack_max(2), Some(131072));
        assert_eq!(s.conntrack_max(8), Some(262144));
        let off = ConntrackSettings {
            max_per_core: 0,
            ..s
        };
        assert_eq!(off.conntrack_max(64), None);
        assert_eq!(wanted_hashsize(1024, 262144), Some(65536));
        assert_eq!(wanted_hashsize(65536, 262144), None);
    }

    #[test]
    fn zero_values_are_left_out() {
        let s = ConntrackSettings {
            max_per_core: 0,
            udp: Duration::from_secs(30),
            ..defaults()
        };
        assert_eq!(
            s.sysctls(4),
            [
                ("nf_conntrack_tcp_timeout_established", 86400),
                ("nf_conntrack_tcp_timeout_close_wait", 3600),
                ("nf_conntrack_udp_timeout", 30),
            ]
        );
        let liberal = ConntrackSettings {
            tcp_be_liberal: true,
            ..defaults()
        };
        assert!(
            liberal
                .sysctls(1)
                .contains(&("nf_conntrack_tcp_be_liberal", 1))
        );
    }

    #[test]
    fn unwritable_sysctls_are_warnings() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("nf_conntrack_tcp_timeout_established"),
            "432000\n",
        )
        .unwrap();
        std::fs::write(
            dir.path().join("nf_conntrack_tcp_timeout_close_wait"),
            "3600\n",
        )
        .unwrap();
        // nf_conntrack_max is missing: a warning, the others are still set.
        let failed = apply_conntrack_in(dir.path(), &defaults(), 2);
        assert_eq!(failed, ["nf_conntrack_max"]);
        let read = |n: &str| std::fs::read_to_string(dir.path().join(n)).unwrap();
        assert_eq!(read("nf_conntrack_tcp_timeout_established").trim(), "86400");
        assert_eq!(read("nf_conntrack_tcp_timeout_close_wait").trim(), "3600");
        assert!(!apply_oom_score_adj_at(
            &dir.path().join("no/such/file"),
            -999
        ));
    }
}
