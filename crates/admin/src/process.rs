//! The standard process metrics every Kubernetes component exposes (Prometheus'
//! `client_golang` process collector, which upstream kube-proxy registers through
//! component-base), read from `/proc` at scrape time:
//!
//! | metric | type | source |
//! |---|---|---|
//! | `process_cpu_seconds_total` | counter | `/proc/self/stat` utime + stime, in `USER_HZ` (100 per second on Linux, as `client_golang`'s procfs assumes) |
//! | `process_open_fds` | gauge | the entries of `/proc/self/fd` |
//! | `process_max_fds` | gauge | `Max open files` (soft limit) in `/proc/self/limits` |
//! | `process_virtual_memory_bytes` | gauge | `/proc/self/stat` vsize |
//! | `process_virtual_memory_max_bytes` | gauge | `Max address space` (soft limit) in `/proc/self/limits`; unlimited is 2⁶⁴ − 1, as Go's `-1` cast to `uint64` |
//! | `process_resident_memory_bytes` | gauge | `VmRSS` in `/proc/self/status` (the resident pages of `/proc/self/stat` × the page size) |
//! | `process_start_time_seconds` | gauge | `/proc/self/stat` starttime (`USER_HZ` after boot) + `btime` of `/proc/stat` |
//! | `process_network_receive_bytes_total`, `process_network_transmit_bytes_total` | counter | the sum over the interfaces of `/proc/self/net/dev` (the process's network namespace), as `client_golang` ≥ 1.20 |
//!
//! A value that cannot be read leaves its metric out of that scrape, as `client_golang` does.
//!
//! Why our own reader: `prometheus-client` has no process collector, and the crates that do
//! (`metrics-process`, the `prometheus` crate's `process` feature) report to other metrics
//! libraries with their own registries; the numbers are a few fields of four `/proc` files.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;

/// `USER_HZ`: the unit of the tick fields of `/proc/<pid>/stat` (fixed at 100 by the Linux
/// ABI; `client_golang`'s procfs uses the same constant).
const USER_HZ: f64 = 100.0;

/// One reading of the process's numbers; `None` for what could not be read.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ProcessStats {
    /// User + system CPU time, in seconds.
    pub cpu_seconds: Option<f64>,
    /// Open file descriptors.
    pub open_fds: Option<u64>,
    /// The soft limit of open files.
    pub max_fds: Option<f64>,
    /// Virtual memory size, in bytes.
    pub virtual_memory_bytes: Option<u64>,
    /// The soft limit of the address space, in bytes (`u64::MAX as f64` when unlimited).
    pub virtual_memory_max_bytes: Option<f64>,
    /// Resident memory, in bytes.
    pub resident_memory_bytes: Option<u64>,
    /// When the process started, in seconds since the Unix epoch.
    pub start_time_seconds: Option<f64>,
    /// Bytes received over every interface of the process's network namespace.
    pub network_receive_bytes: Option<u64>,
    /// Bytes sent likewise.
    pub network_transmit_bytes: Option<u64>,
}

impl ProcessStats {
    /// Reads this process's numbers from `/proc`.
    pub fn read() -> ProcessStats {
        let read = |p: &str| std::fs::read_to_string(p).ok();
        let mut out = ProcessStats::default();
        if let Some(stat) = read("/proc/self/stat") {
            let fields = stat_fields(&stat);
            let field = |n: usize| fields.get(n).and_then(|f| f.parse::<u64>().ok());
            // Numbering of proc(5), from 1; `fields` starts at field 3 (state).
            let at = |n: usize| field(n - 3);
            if let (Some(utime), Some(stime)) = (at(14), at(15)) {
                out.cpu_seconds = Some((utime + stime) as f64 / USER_HZ);
            }
            out.virtual_memory_bytes = at(23);
            let boot = read("/proc/stat").and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("btime "))
                    .and_then(|v| v.trim().parse::<u64>().ok())
            });
            if let (Some(start), Some(boot)) = (at(22), boot) {
                out.start_time_seconds = Some(boot as f64 + start as f64 / USER_HZ);
            }
        }
        out.resident_memory_bytes = read("/proc/self/status").and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
                .map(|kib| kib * 1024)
        });
        out.open_fds = std::fs::read_dir("/proc/self/fd")
            .ok()
            .map(|d| d.count() as u64);
        if let Some(limits) = read("/proc/self/limits") {
            out.max_fds = soft_limit(&limits, "Max open files");
            out.virtual_memory_max_bytes = soft_limit(&limits, "Max address space");
        }
        if let Some((rx, tx)) = read("/proc/self/net/dev").and_then(|d| net_dev_totals(&d)) {
            out.network_receive_bytes = Some(rx);
            out.network_transmit_bytes = Some(tx);
        }
        out
    }
}

/// The fields of `/proc/<pid>/stat` after the command name (which is in parentheses and may
/// hold spaces): the first is the state (field 3).
fn stat_fields(stat: &str) -> Vec<&str> {
    stat.rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace().collect())
        .unwrap_or_default()
}

/// The soft limit of the `/proc/<pid>/limits` row `name`; `unlimited` is `u64::MAX`.
fn soft_limit(limits: &str, name: &str) -> Option<f64> {
    let rest = limits.lines().find_map(|l| l.strip_prefix(name))?;
    match rest.split_whitespace().next()? {
        "unlimited" => Some(u64::MAX as f64),
        v => v.parse::<u64>().ok().map(|v| v as f64),
    }
}

/// Received and sent bytes summed over the interfaces of `/proc/net/dev`.
fn net_dev_totals(dev: &str) -> Option<(u64, u64)> {
    let mut totals = (0u64, 0u64);
    let mut any = false;
    for line in dev.lines().skip(2) {
        let Some((_, numbers)) = line.split_once(':') else {
            continue;
        };
        let n: Vec<u64> = numbers
            .split_whitespace()
            .filter_map(|v| v.parse().ok())
            .collect();
        if n.len() >= 9 {
            totals.0 = totals.0.saturating_add(n[0]);
            totals.1 = totals.1.saturating_add(n[8]);
            any = true;
        }
    }
    any.then_some(totals)
}

/// The collector registered in every mode: reads [`ProcessStats`] at each scrape.
#[derive(Debug)]
pub(crate) struct ProcessCollector;

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let s = ProcessStats::read();
        // Names of counters without `_total` (the encoder appends it); help texts as
        // client_golang's, final period included (a collector's text is written as is).
        if let Some(v) = s.cpu_seconds {
            let m = ConstCounter::new(v);
            let e = encoder.encode_descriptor(
                "process_cpu_seconds",
                "Total user and system CPU time spent in seconds.",
                None,
                m.metric_type(),
            )?;
            m.encode(e)?;
        }
        let gauges: [(&str, &str, Option<f64>); 6] = [
            (
                "process_max_fds",
                "Maximum number of open file descriptors.",
                s.max_fds,
            ),
            (
                "process_open_fds",
                "Number of open file descriptors.",
                s.open_fds.map(|v| v as f64),
            ),
            (
                "process_resident_memory_bytes",
                "Resident memory size in bytes.",
                s.resident_memory_bytes.map(|v| v as f64),
            ),
            (
                "process_start_time_seconds",
                "Start time of the process since unix epoch in seconds.",
                s.start_time_seconds,
            ),
            (
                "process_virtual_memory_bytes",
                "Virtual memory size in bytes.",
                s.virtual_memory_bytes.map(|v| v as f64),
            ),
            (
                "process_virtual_memory_max_bytes",
                "Maximum amount of virtual memory available in bytes.",
                s.virtual_memory_max_bytes,
            ),
        ];
        for (name, help, value) in gauges {
            if let Some(v) = value {
                let m = ConstGauge::new(v);
                let e = encoder.encode_descriptor(name, help, None, m.metric_type())?;
                m.encode(e)?;
            }
        }
        for (name, help, value) in [
            (
                "process_network_receive_bytes",
                "Number of bytes received by the process over the network.",
                s.network_receive_bytes,
            ),
            (
                "process_network_transmit_bytes",
                "Number of bytes sent by the process over the network.",
                s.network_transmit_bytes,
            ),
        ] {
            if let Some(v) = value {
                let m = ConstCounter::new(v as f64);
                let e = encoder.encode_descriptor(name, help, None, m.metric_type())?;
                m.encode(e)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_survive_a_command_name_with_spaces_and_parentheses() {
        let stat = "42 (a b) c) S 1 42 42 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 3 0 1234 10485760 512 18446744073709551615";
        let f = stat_fields(stat);
        assert_eq!(f[0], "S");
        // utime (14) and stime (15), starttime (22), vsize (23), counted from field 3.
        assert_eq!(f[14 - 3], "250");
        assert_eq!(f[15 - 3], "50");
        assert_eq!(f[22 - 3], "1234");
        assert_eq!(f[23 - 3], "10485760");
    }

    #[test]
    fn limits_and_net_dev_parse() {
        let limits = "Limit                     Soft Limit           Hard Limit           Units     \n\
                      Max open files            1048576              1048576              files     \n\
                      Max address space         unlimited            unlimited            bytes     \n";
        assert_eq!(soft_limit(limits, "Max open files"), Some(1_048_576.0));
        assert_eq!(
            soft_limit(limits, "Max address space"),
            Some(u64::MAX as f64)
        );
        let dev = "Inter-|   Receive                                                |  Transmit\n \
                   face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed\n    \
                   lo:    1000      10    0    0    0     0          0         0     1000      10    0    0    0     0       0          0\n  \
                   eth0:    2000      20    0    0    0     0          0         0      300       3    0    0    0     0       0          0\n";
        assert_eq!(net_dev_totals(dev), Some((3000, 1300)));
    }

    #[test]
    fn this_process_has_nonzero_numbers() {
        let s = ProcessStats::read();
        assert!(s.open_fds.unwrap() > 0);
        assert!(s.resident_memory_bytes.unwrap() > 0);
        assert!(s.virtual_memory_bytes.unwrap() > 0);
        assert!(s.max_fds.unwrap() > 0.0);
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        let start = s.start_time_seconds.unwrap();
        assert!(
            start <= now + 1.0 && start > now - 86400.0 * 365.0,
            "{start}"
        );
        assert!(s.cpu_seconds.is_some());
    }
}
