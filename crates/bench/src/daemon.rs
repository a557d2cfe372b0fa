//! The daemon's own memory: the real `kube-proxy-rs` binary, run as an operator runs it, on
//! the synthetic cluster of [`kp_testkit::rss::Cluster`], one daemon at a time.
//!
//! For every size, source ([`Source`]: manifest documents, one `kind: List` manifest, the
//! API server) and mode, [`kp_testkit::rss::measure`] starts the daemon in a fresh network
//! namespace, waits for its first sync, and reads `VmHWM` (the peak) and `VmRSS` (the steady
//! state after the first sync) from `/proc/PID/status`. A point that fails or times out is
//! recorded with the reason, and the larger sizes of the same mode and source are skipped.
//! IPVS mode is measured only where the kernel has IPVS (the qemu guest); elsewhere it is
//! recorded as skipped.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use kp_testkit::rss::{Cluster, DaemonMode, MeasureOptions, Source, measure};
use serde::{Deserialize, Serialize};

/// Settings of [`run`].
#[derive(Debug, Clone)]
pub struct DaemonOptions {
    /// Services (× [`DaemonOptions::endpoints`] endpoints).
    pub sizes: Vec<usize>,
    /// Endpoints per Service.
    pub endpoints: usize,
    /// Modes.
    pub modes: Vec<DaemonMode>,
    /// Sources.
    pub sources: Vec<Source>,
    /// The `kube-proxy-rs` binary.
    pub binary: PathBuf,
    /// How long one daemon may take to complete its first sync.
    pub timeout: Duration,
    /// How long to wait after the first sync before reading `/proc/PID/status`.
    pub settle: Duration,
}

impl DaemonOptions {
    /// The published run's settings: 1k, 5k and 10k Services × 10 endpoints, every host mode
    /// (and IPVS mode where the kernel has it), every source, 600 s per daemon, 2 s to settle.
    pub fn full(binary: PathBuf) -> Self {
        DaemonOptions {
            sizes: vec![1000, 5000, 10_000],
            endpoints: 10,
            modes: DaemonMode::ALL.to_vec(),
            sources: Source::ALL.to_vec(),
            binary,
            timeout: Duration::from_secs(600),
            settle: Duration::from_secs(2),
        }
    }
}

/// One measured (or skipped) daemon.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct DaemonPoint {
    /// The mode label (`iptables-legacy`, ...).
    pub mode: String,
    /// The source label (`manifests`, `manifests-list`, `api`).
    pub source: String,
    /// Services.
    pub services: usize,
    /// Endpoints per Service.
    pub endpoints: usize,
    /// `VmHWM` after the first sync, MiB.
    pub hwm_mib: Option<f64>,
    /// `VmRSS` after the first sync and the settle time, MiB.
    pub rss_mib: Option<f64>,
    /// From the daemon's start to its first completed sync, seconds.
    pub first_sync_s: Option<f64>,
    /// Why there is no measurement (failed, timed out, skipped).
    pub error: Option<String>,
}

impl DaemonPoint {
    /// The table cell: `HWM / RSS`, or why not measured.
    pub fn cell(&self) -> String {
        match (self.hwm_mib, self.rss_mib, &self.error) {
            (Some(h), Some(r), _) => format!("{h:.1} / {r:.1}"),
            (_, _, Some(e)) if e.starts_with("skipped") => "skipped".into(),
            (_, _, Some(e)) if e.contains("within") => "timeout".into(),
            _ => "failed".into(),
        }
    }
}

/// The `kube-proxy-rs` binary next to `exe` (the same cargo target directory), if present.
pub fn sibling_proxy_binary(exe: &Path) -> Option<PathBuf> {
    let p = exe.with_file_name("kube-proxy-rs");
    p.is_file().then_some(p)
}

/// Measures every (size, source, mode), one daemon at a time. Progress goes to stderr.
pub fn run(opts: &DaemonOptions) -> Vec<DaemonPoint> {
    let mut points: Vec<DaemonPoint> = Vec::new();
    for &services in &opts.sizes {
        for &source in &opts.sources {
            for &mode in &opts.modes {
                let point = |error: Option<String>| DaemonPoint {
                    mode: mode.label().into(),
                    source: source.label().into(),
                    services,
                    endpoints: opts.endpoints,
                    hwm_mib: None,
                    rss_mib: None,
                    first_sync_s: None,
                    error,
                };
                if let Err(reason) = mode.available() {
                    points.push(point(Some(format!("skipped: {reason}"))));
                    continue;
                }
                let failed_before = points.iter().find(|p| {
                    p.mode == mode.label()
                        && p.source == source.label()
                        && p.services < services
                        && p.hwm_mib.is_none()
                });
                if let Some(p) = failed_before {
                    points.push(point(Some(format!(
                        "skipped: {} Services already failed",
                        p.services
                    ))));
                    continue;
                }
                eprintln!(
                    "daemon RSS: {} from {} at {services} Services × {}",
                    mode.label(),
                    source.label(),
                    opts.endpoints
                );
                let mopts = MeasureOptions {
                    binary: opts.binary.clone(),
                    mode,
                    source,
                    cluster: Cluster::new(services, opts.endpoints),
                    timeout: opts.timeout,
                    settle: opts.settle,
                    extra_args: Vec::new(),
                };
                match measure(&mopts) {
                    Ok(m) => {
                        eprintln!(
                            "           VmHWM {:.1} MiB, VmRSS {:.1} MiB, first sync after {:.1} s",
                            m.hwm_mib(),
                            m.rss_mib(),
                            m.first_sync.as_secs_f64()
                        );
                        points.push(DaemonPoint {
                            hwm_mib: Some(m.hwm_mib()),
                            rss_mib: Some(m.rss_mib()),
                            first_sync_s: Some(m.first_sync.as_secs_f64()),
                            ..point(None)
                        });
                    }
                    Err(e) => {
                        eprintln!("           failed: {e}");
                        points.push(point(Some(e.to_string())));
                    }
                }
            }
        }
    }
    points
}

/// The Markdown section of `points` ("Daemon peak RSS, MiB": rows size × source, a column per
/// mode); empty when there are no points.
pub fn markdown(points: &[DaemonPoint]) -> String {
    let mut s = String::new();
    if points.is_empty() {
        return s;
    }
    let mut modes: Vec<&str> = Vec::new();
    let mut rows: Vec<(usize, &str)> = Vec::new();
    for p in points {
        if !modes.contains(&p.mode.as_str()) {
            modes.push(&p.mode);
        }
        if !rows.contains(&(p.services, p.source.as_str())) {
            rows.push((p.services, &p.source));
        }
    }
    let endpoints = points[0].endpoints;
    let _ = writeln!(
        s,
        "## Daemon peak RSS, MiB\n\n\
         The `kube-proxy-rs` daemon itself (Services × {endpoints} endpoints, one EndpointSlice \
         each), one at a time in a fresh network namespace; each cell is `VmHWM` after the \
         first sync / `VmRSS` at steady state (after the first sync and the settle time), from \
         `/proc/PID/status`.\n"
    );
    let _ = write!(s, "| Services | source |");
    for m in &modes {
        let _ = write!(s, " {m} |");
    }
    let _ = write!(s, "\n|---:|---|");
    for _ in &modes {
        let _ = write!(s, "---:|");
    }
    s.push('\n');
    for (services, source) in &rows {
        let _ = write!(s, "| {services} | {source} |");
        for m in &modes {
            let cell = points
                .iter()
                .find(|p| p.services == *services && p.source == *source && p.mode == *m)
                .map(DaemonPoint::cell)
                .unwrap_or_else(|| "–".into());
            let _ = write!(s, " {cell} |");
        }
        s.push('\n');
    }
    // One note per mode and reason, naming the points it concerns.
    let mut notes: Vec<(&str, &str, Vec<String>)> = Vec::new();
    for p in points {
        let Some(e) = &p.error else { continue };
        let reason = e.lines().next().unwrap_or_default();
        let at = format!("{} at {}", p.source, p.services);
        match notes
            .iter_mut()
            .find(|(m, r, _)| *m == p.mode && *r == reason)
        {
            Some((_, _, ats)) => ats.push(at),
            None => notes.push((&p.mode, reason, vec![at])),
        }
    }
    if !notes.is_empty() {
        s.push('\n');
        for (mode, reason, ats) in notes {
            let _ = writeln!(s, "- {mode} ({}): {reason}", ats.join(", "));
        }
    }
    let first_sync: Vec<String> = points
        .iter()
        .filter(|p| p.first_sync_s.is_some())
        .map(|p| {
            format!(
                "{} {} {}: {:.1} s",
                p.services,
                p.source,
                p.mode,
                p.first_sync_s.unwrap_or_default()
            )
        })
        .collect();
    if !first_sync.is_empty() {
        let _ = writeln!(
            s,
            "\nFirst sync completed after (from the daemon's start): {}.",
            first_sync.join("; ")
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn point(mode: &str, source: &str, services: usize, hwm: Option<f64>) -> DaemonPoint {
        DaemonPoint {
            mode: mode.into(),
            source: source.into(),
            services,
            endpoints: 10,
            hwm_mib: hwm,
            rss_mib: hwm.map(|h| h - 10.0),
            first_sync_s: hwm.map(|_| 1.0),
            error: hwm.is_none().then(|| "skipped: no IPVS".to_string()),
        }
    }

    #[test]
    fn the_table_has_a_row_per_size_and_source_and_a_column_per_mode() {
        let md = markdown(&[
            point("iptables-legacy", "manifests", 1000, Some(40.0)),
            point("nftables", "manifests", 1000, Some(35.5)),
            point("iptables-legacy", "api", 1000, Some(30.0)),
            point("ipvs", "api", 1000, None),
        ]);
        assert!(md.contains("## Daemon peak RSS, MiB"), "{md}");
        assert!(
            md.contains("| Services | source | iptables-legacy | nftables | ipvs |"),
            "{md}"
        );
        assert!(
            md.contains("| 1000 | manifests | 40.0 / 30.0 | 35.5 / 25.5 | – |"),
            "{md}"
        );
        assert!(
            md.contains("| 1000 | api | 30.0 / 20.0 | – | skipped |"),
            "{md}"
        );
        assert!(
            md.contains("- ipvs (api at 1000): skipped: no IPVS"),
            "{md}"
        );
    }

    #[test]
    fn no_points_no_section() {
        assert_eq!(markdown(&[]), "");
    }
}
