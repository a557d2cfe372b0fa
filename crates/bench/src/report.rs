//! Outputs of `kp-bench all`: `results.json`, `results.md` (Markdown tables), SVG charts
//! (plotters, SVG backend) and `machine.md` (lscpu, uname, tool versions).
//!
//! When the run measured bulk throughput, `bulk-throughput.svg` shows it per mode (bars),
//! and `results.md` has a bulk table and, when the [`crate::Mode::Direct`] baseline ran, a
//! table of every mode against it (percent of the direct connection), size by size.
//!
//! A report made in the qemu guest (`kp-bench vm`) says so ([`RunReport::environment`]) and
//! adds two charts of the rule-walking cost against IPVS: `ipvs-vm-datapath.svg` (connect
//! p50) and `ipvs-vm-cpu.svg` (CPU per 1,000 new connections). Reports round-trip through
//! JSON (the guest prints its report on stdout; NaN, written as `null`, reads back as NaN).

use std::fmt::Write as _;
use std::path::Path;
use std::process::Command;

use anyhow::Context;
use plotters::prelude::*;
use serde::{Deserialize, Serialize};

use crate::control::{ControlPoint, fmt_ms};
use crate::datapath::DatapathPoint;

/// What a report made inside the guest says about itself.
pub const GUEST_NOTE: &str = "measured inside the kp_testkit::vm qemu guest (TCG software \
emulation, 1 vCPU, Debian's kernel): absolute numbers are not comparable to the host's; \
compare the modes with each other, within this run";

/// Reads an `f64` that JSON may hold as `null` (how serde_json writes NaN) as NaN.
///
/// # Errors
/// The value is neither a number nor `null`.
pub fn nan_f64<'de, D: serde::Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    Ok(Option::<f64>::deserialize(d)?.unwrap_or(f64::NAN))
}

/// The machine a run happened on.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct MachineInfo {
    /// `uname -a`.
    pub uname: String,
    /// `lscpu`.
    pub lscpu: String,
    /// `MemTotal` from `/proc/meminfo`.
    pub mem_total: String,
    /// `iptables-legacy --version`.
    pub iptables_legacy: String,
    /// `iptables-nft --version`.
    pub iptables_nft: String,
    /// `nft --version`.
    pub nft: String,
}

fn cmd(program: &str, args: &[&str]) -> String {
    Command::new(program)
        .args(args)
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|e| format!("({program}: {e})"))
}

impl MachineInfo {
    /// Reads the machine description (no namespace needed: read-only commands).
    pub fn read() -> MachineInfo {
        MachineInfo {
            uname: cmd("uname", &["-a"]),
            lscpu: cmd("lscpu", &[]),
            mem_total: std::fs::read_to_string("/proc/meminfo")
                .ok()
                .and_then(|m| {
                    m.lines()
                        .find(|l| l.starts_with("MemTotal:"))
                        .map(str::to_string)
                })
                .unwrap_or_default(),
            iptables_legacy: cmd("iptables-legacy", &["--version"]),
            iptables_nft: cmd("iptables-nft", &["--version"]),
            nft: cmd("nft", &["--version"]),
        }
    }

    /// `machine.md`.
    pub fn markdown(&self) -> String {
        format!(
            "# Benchmark machine\n\n- kernel: `{}`\n- memory: `{}`\n- iptables: `{}`, `{}`\n- nft: `{}`\n\n```text\n{}\n```\n",
            self.uname,
            self.mem_total,
            self.iptables_legacy,
            self.iptables_nft,
            self.nft,
            self.lscpu
        )
    }
}

/// Everything one `kp-bench all` run measured.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct RunReport {
    /// The command line.
    pub command: String,
    /// When it started (seconds since the Unix epoch).
    pub started_unix: u64,
    /// Wall time of the whole run, seconds.
    #[serde(deserialize_with = "crate::report::nan_f64")]
    pub duration_s: f64,
    /// Quick mode (CI sizes).
    pub quick: bool,
    /// The machine.
    pub machine: MachineInfo,
    /// Where the run happened, when not directly on the machine ([`GUEST_NOTE`] in the
    /// guest).
    #[serde(default)]
    pub environment: Option<String>,
    /// `/proc/loadavg` when the run started and when it ended (other load on a shared
    /// machine shows here).
    #[serde(default)]
    pub load_average: Option<(String, String)>,
    /// Control-plane points.
    pub control: Vec<ControlPoint>,
    /// Datapath points.
    pub datapath: Vec<DatapathPoint>,
    /// The daemon's own memory ([`crate::daemon`]); absent in runs before it was measured.
    #[serde(default)]
    pub daemon: Vec<crate::daemon::DaemonPoint>,
}

/// `87%`, `–` when unknown.
fn pct(v: Option<f64>) -> String {
    v.map(|v| format!("{:.0}%", v * 100.0))
        .unwrap_or_else(|| "–".into())
}

/// The bulk MB/s of `p` with `streams` connections, if measured.
fn bulk_of(p: &crate::datapath::PositionResult, streams: usize) -> Option<f64> {
    p.bulk
        .iter()
        .find(|b| b.streams == streams)
        .map(|b| b.mb_per_s)
}

/// A number with no decimals, `–` when not measured (NaN).
struct Num(f64);

impl std::fmt::Display for Num {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.0.is_finite() {
            write!(f, "{:.0}", self.0)
        } else {
            f.write_str("–")
        }
    }
}

fn opt_ms(v: Option<f64>) -> String {
    v.map(fmt_ms).unwrap_or_else(|| "–".into())
}

fn bytes(n: usize) -> String {
    if n >= 1 << 20 {
        format!("{:.1} MiB", n as f64 / f64::from(1 << 20))
    } else if n >= 1 << 10 {
        format!("{:.1} KiB", n as f64 / 1024.0)
    } else {
        format!("{n} B")
    }
}

impl RunReport {
    /// The Markdown tables.
    pub fn markdown(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "# kp-bench results\n\nCommand: `{}` ({:.0} s). Machine: see `machine.md`.\n",
            self.command, self.duration_s
        );
        if let Some(env) = &self.environment {
            let _ = writeln!(s, "**Environment: {env}.**\n");
        }
        if let Some((start, end)) = &self.load_average {
            let _ = writeln!(
                s,
                "Load average (`/proc/loadavg`) at the start: `{start}`; at the end: `{end}`.\n"
            );
        }
        if !self.control.is_empty() {
            self.control_markdown(&mut s);
        }
        if !self.datapath.is_empty() {
            self.datapath_markdown(&mut s);
        }
        if !self.daemon.is_empty() {
            if !s.ends_with("\n\n") {
                s.push('\n');
            }
            s.push_str(&crate::daemon::markdown(&self.daemon));
        }
        s
    }

    /// The control-plane and one-Service-change tables.
    fn control_markdown(&self, s: &mut String) {
        let _ = writeln!(
            s,
            "## Control plane (Services × 10 endpoints, medians)\n\n\
             | mode | Services | render (cold) | payload | tool alone (floor) | cold full sync | sync / floor | full resync | full resync, every Service changed | iptables-save -t nat | parse (light / full) | peak RSS (state) |\n\
             |---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
        );
        for c in &self.control {
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} ({} lines) | {} | {} | {} | {} ({}) | {} ({}) | {} | {} / {} | {} |",
                c.mode,
                c.services,
                fmt_ms(c.render_ms),
                bytes(c.payload_bytes),
                c.payload_lines,
                c.floor.cell(),
                c.cold_sync.cell(),
                c.overhead_ratio
                    .map(|r| format!("{r:.2}×"))
                    .unwrap_or_else(|| "–".into()),
                c.resync.cell(),
                bytes(c.resync_bytes),
                c.resync_changed.cell(),
                bytes(c.resync_changed_bytes),
                c.save_tool.cell(),
                opt_ms(c.save_parse_ms),
                opt_ms(c.save_parse_full_ms),
                match (c.peak_rss_mib, c.state_rss_mib) {
                    (Some(p), Some(st)) => format!("{p:.1} MiB ({st:.1})"),
                    _ => "–".into(),
                },
            );
        }
        for c in self.control.iter().filter(|c| c.ipvs_requests.is_some()) {
            let _ = writeln!(
                s,
                "\n{} at {} Services: {} IPVS netlink requests in the cold sync; the floor is `ipset restore` + `ipvsadm --restore` of the same content, the save column `ipvsadm -S -n`.",
                c.mode,
                c.services,
                c.ipvs_requests.unwrap_or_default()
            );
        }
        let _ = writeln!(
            s,
            "\n## One-Service changes (partial syncs)\n\n\
             | mode | Services | change | sync (ours + tool) | ours (render + payload) | bytes sent |\n\
             |---|---:|---|---:|---:|---:|"
        );
        for c in &self.control {
            for ch in &c.changes {
                let _ = writeln!(
                    s,
                    "| {} | {} | {} | {} | {} | {} |",
                    c.mode,
                    c.services,
                    ch.what,
                    ch.sync.cell(),
                    opt_ms(ch.render_ms),
                    bytes(ch.bytes)
                );
            }
        }
    }

    /// The datapath tables (latency, rates, bulk, against direct).
    fn datapath_markdown(&self, s: &mut String) {
        let _ = writeln!(
            s,
            "\n## Datapath (background Services × 10 endpoints; probed Service first / last in KUBE-SERVICES, with {} endpoints; `direct`: the pods, no Service)\n\n\
             | mode | Services | position | connect p50 | p90 | p99 | probes (failed) | request p50 / p99 (new conn) | req/s keepalive | req/s new conn | CPU ms / 1k new conn (sys, softirq) | process CPU ms / 1k | relay CPU ms / 1k |\n\
             |---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
            self.datapath
                .iter()
                .map(|d| d.probe_endpoints)
                .max()
                .unwrap_or(10)
        );
        for d in &self.datapath {
            if d.positions.is_empty() {
                let _ = writeln!(
                    s,
                    "| {} | {} | – | rules not loaded: {} | | | | | | | | | |",
                    d.mode,
                    d.services,
                    d.load.cell()
                );
            }
            for p in &d.positions {
                let _ = writeln!(
                    s,
                    "| {} | {} | {} | {:.0} µs | {:.0} µs | {:.0} µs | {} ({}) | {} / {} µs | {} | {:.0} | {:.0} ({:.0}, {:.0}) | {} | {} |",
                    d.mode,
                    d.services,
                    p.position,
                    p.connect.p50_us,
                    p.connect.p90_us,
                    p.connect.p99_us,
                    p.connect.n,
                    p.connect.failed,
                    Num(p.request.p50_us),
                    Num(p.request.p99_us),
                    Num(p.keepalive.rps),
                    p.close.rps,
                    p.close.cpu_ms_per_1k,
                    p.close.cpu_system_ms / (p.close.connections.max(1) as f64) * 1000.0,
                    p.close.cpu_softirq_ms / (p.close.connections.max(1) as f64) * 1000.0,
                    Num(p.close.per_1k_connections(p.close.process_cpu_ms)),
                    Num(p.close.per_1k_connections(p.close.proxy_cpu_ms)),
                );
            }
        }
        self.bulk_markdown(s);
        self.direct_markdown(s);
    }

    /// The bulk-throughput table, when any was measured.
    fn bulk_markdown(&self, s: &mut String) {
        let any = self
            .datapath
            .iter()
            .any(|d| d.positions.iter().any(|p| !p.bulk.is_empty()));
        if !any {
            return;
        }
        let _ = writeln!(
            s,
            "\n## Bulk throughput (long-lived connections from streaming backends; median of the rounds)\n\n\
             | mode | Services | position | streams | MB/s | Gbit/s | % of direct | rounds (MB/s) | failed | CPU ms / GB (machine) | process CPU ms / GB | relay CPU ms / GB |\n\
             |---|---:|---|---:|---:|---:|---:|---|---:|---:|---:|---:|"
        );
        for d in &self.datapath {
            for p in &d.positions {
                for b in &p.bulk {
                    let _ = writeln!(
                        s,
                        "| {} | {} | {} | {} | {:.0} | {:.2} | {} | {} | {} | {} | {} | {} |",
                        d.mode,
                        d.services,
                        p.position,
                        b.streams,
                        b.mb_per_s,
                        b.mb_per_s * 8.0 / 1000.0,
                        pct(self.of_direct(d.services, |q| bulk_of(q, b.streams), b.mb_per_s)),
                        b.round_mb_per_s
                            .iter()
                            .map(|v| format!("{v:.0}"))
                            .collect::<Vec<_>>()
                            .join(", "),
                        b.failed,
                        Num(b.per_gb(b.cpu_busy_ms)),
                        Num(b.per_gb(b.process_cpu_ms)),
                        Num(b.per_gb(b.proxy_cpu_ms)),
                    );
                }
            }
        }
    }

    /// The direct baseline's value of `f` at `services`, and `v` as a fraction of it.
    fn of_direct(
        &self,
        services: usize,
        f: impl Fn(&crate::datapath::PositionResult) -> Option<f64>,
        v: f64,
    ) -> Option<f64> {
        let base = self
            .datapath
            .iter()
            .find(|d| d.mode == crate::Mode::Direct.label() && d.services == services)?
            .positions
            .first()
            .and_then(f)?;
        (base.is_finite() && base > 0.0 && v.is_finite()).then(|| v / base)
    }

    /// Every mode against the direct baseline, size by size, when the baseline ran.
    fn direct_markdown(&self, s: &mut String) {
        let direct = crate::Mode::Direct.label();
        if !self.datapath.iter().any(|d| d.mode == direct) {
            return;
        }
        let streams: Vec<usize> = {
            let mut v: Vec<usize> = self
                .datapath
                .iter()
                .flat_map(|d| d.positions.iter())
                .flat_map(|p| p.bulk.iter().map(|b| b.streams))
                .collect();
            v.sort_unstable();
            v.dedup();
            v
        };
        let mut head = String::from("| mode | Services | position |");
        let mut rule = String::from("|---|---:|---|");
        for n in &streams {
            let _ = write!(head, " bulk ×{n} MB/s (% direct) |");
            rule.push_str("---:|");
        }
        head.push_str(" req/s keepalive (% direct) | req/s new conn (% direct) | connect p50 / p99 | request p50 / p99 | CPU ms / 1k new conn: machine / process / relay |");
        rule.push_str("---:|---:|---:|---:|---:|");
        let _ = writeln!(
            s,
            "\n## Against a direct connection (same run, same topology; % of the `direct` row of the same size)\n\n{head}\n{rule}"
        );
        for d in &self.datapath {
            for p in &d.positions {
                let mut row = format!("| {} | {} | {} |", d.mode, d.services, p.position);
                for &n in &streams {
                    match bulk_of(p, n) {
                        Some(v) => {
                            let _ = write!(
                                row,
                                " {v:.0} ({}) |",
                                pct(self.of_direct(d.services, |q| bulk_of(q, n), v))
                            );
                        }
                        None => row.push_str(" – |"),
                    }
                }
                let ka = p.keepalive.rps;
                let close = p.close.rps;
                let _ = writeln!(
                    s,
                    "{row} {} ({}) | {} ({}) | {} / {} µs | {} / {} µs | {} / {} / {} |",
                    Num(ka),
                    pct(self.of_direct(d.services, |q| Some(q.keepalive.rps), ka)),
                    Num(close),
                    pct(self.of_direct(d.services, |q| Some(q.close.rps), close)),
                    Num(p.connect.p50_us),
                    Num(p.connect.p99_us),
                    Num(p.request.p50_us),
                    Num(p.request.p99_us),
                    Num(p.close.cpu_ms_per_1k),
                    Num(p.close.per_1k_connections(p.close.process_cpu_ms)),
                    Num(p.close.per_1k_connections(p.close.proxy_cpu_ms)),
                );
            }
        }
    }

    /// Writes `results.json`, `results.md`, `machine.md` and the SVG charts into `dir`.
    ///
    /// # Errors
    /// Writing a file fails.
    pub fn write(&self, dir: &Path) -> anyhow::Result<Vec<std::path::PathBuf>> {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let mut written = Vec::new();
        let mut put = |name: &str, text: String| -> anyhow::Result<()> {
            let p = dir.join(name);
            std::fs::write(&p, text).with_context(|| format!("writing {}", p.display()))?;
            written.push(p);
            Ok(())
        };
        put("results.json", serde_json::to_string_pretty(self)?)?;
        put("results.md", self.markdown())?;
        put("machine.md", self.machine.markdown())?;
        // The charts are of the datapath: none without it (a run of the daemon's memory only).
        for (name, title, y, f) in charts().into_iter().filter(|_| !self.datapath.is_empty()) {
            let series = self.series(f);
            let p = dir.join(name);
            line_chart(&p, title, y, &series)?;
            written.push(p);
        }
        if self.bulk_bars().is_some() {
            let p = dir.join(BULK_CHART);
            self.bulk_chart(&p)?;
            written.push(p);
        }
        if self.environment.is_some() && self.datapath.iter().any(|d| d.mode == "ipvs") {
            for (name, title, y, f) in vm_charts() {
                let series = self.series(f);
                let p = dir.join(name);
                line_chart(&p, title, y, &series)?;
                written.push(p);
            }
        }
        Ok(written)
    }

    /// One line per (mode, position) of `f` over the datapath points, sorted by Services.
    fn series(
        &self,
        f: fn(&crate::datapath::PositionResult) -> f64,
    ) -> Vec<(String, Vec<(f64, f64)>)> {
        let mut out: Vec<(String, Vec<(f64, f64)>)> = Vec::new();
        for d in &self.datapath {
            for p in &d.positions {
                let label = format!("{} ({})", d.mode, p.position);
                let v = f(p);
                if !v.is_finite() {
                    continue;
                }
                match out.iter_mut().find(|(l, _)| *l == label) {
                    Some((_, pts)) => pts.push((d.services as f64, v)),
                    None => out.push((label, vec![(d.services as f64, v)])),
                }
            }
        }
        for (_, pts) in &mut out {
            pts.sort_by(|a, b| a.0.total_cmp(&b.0));
        }
        out
    }
}

/// The bulk-throughput chart's file name.
pub const BULK_CHART: &str = "bulk-throughput.svg";

/// The bars of the bulk chart: the groups (one per mode, in report order) and per group
/// `(series label, MB/s, fraction of direct)`; `None` when nothing was measured.
type BulkBars = (Vec<String>, Vec<Vec<(String, f64, Option<f64>)>>);

impl RunReport {
    /// One group per mode; one bar per (size, streams). A mode measured at both positions
    /// shows the `last` one (bulk throughput does not depend on the rule position: only the
    /// first packet of a connection walks the rules).
    fn bulk_bars(&self) -> Option<BulkBars> {
        let mut groups: Vec<String> = Vec::new();
        let mut bars: Vec<Vec<(String, f64, Option<f64>)>> = Vec::new();
        for d in &self.datapath {
            let Some(p) = d
                .positions
                .iter()
                .filter(|p| !p.bulk.is_empty())
                .max_by_key(|p| p.position == "last")
            else {
                continue;
            };
            let i = match groups.iter().position(|g| *g == d.mode) {
                Some(i) => i,
                None => {
                    groups.push(d.mode.clone());
                    bars.push(Vec::new());
                    groups.len() - 1
                }
            };
            for b in &p.bulk {
                let label = format!(
                    "{} stream{}, {} Services",
                    b.streams,
                    if b.streams == 1 { "" } else { "s" },
                    d.services
                );
                let of = self.of_direct(d.services, |q| bulk_of(q, b.streams), b.mb_per_s);
                bars[i].push((label, b.mb_per_s, of));
            }
        }
        (!groups.is_empty()).then_some((groups, bars))
    }

    /// Draws [`BULK_CHART`]: grouped bars of MB/s per mode, each labelled with its percentage
    /// of the direct connection.
    ///
    /// # Errors
    /// Drawing or writing fails.
    pub fn bulk_chart(&self, path: &Path) -> anyhow::Result<()> {
        let Some((groups, bars)) = self.bulk_bars() else {
            return Ok(());
        };
        let mut series: Vec<String> = Vec::new();
        for g in &bars {
            for (label, _, _) in g {
                if !series.contains(label) {
                    series.push(label.clone());
                }
            }
        }
        let ymax = bars.iter().flatten().map(|b| b.1).fold(1.0f64, f64::max) * 1.45;
        let err = |e: &dyn std::fmt::Display| anyhow::anyhow!("{e}");
        let root = SVGBackend::new(path, (900, 540)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| err(&e))?;
        let n = groups.len();
        let names = groups.clone();
        let mut chart = ChartBuilder::on(&root)
            .caption(
                "Bulk throughput through the Service (keepalive connections)",
                ("sans-serif", 22),
            )
            .margin(12)
            .x_label_area_size(45)
            .y_label_area_size(70)
            .build_cartesian_2d(-0.5f64..(n as f64 - 0.5), 0f64..ymax)
            .map_err(|e| err(&e))?;
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_labels(n)
            .x_label_formatter(&|x| {
                let i = x.round();
                if (x - i).abs() < 1e-6 && i >= 0.0 {
                    names.get(i as usize).cloned().unwrap_or_default()
                } else {
                    String::new()
                }
            })
            .y_desc("MB/s (10^6 bytes per second)")
            .draw()
            .map_err(|e| err(&e))?;
        let width = 0.8 / series.len().max(1) as f64;
        for (k, label) in series.iter().enumerate() {
            let color = COLORS[k % COLORS.len()];
            let mut rects = Vec::new();
            let mut texts = Vec::new();
            for (i, group) in bars.iter().enumerate() {
                let Some((_, v, of)) = group.iter().find(|b| b.0 == *label) else {
                    continue;
                };
                let x0 = i as f64 - 0.4 + k as f64 * width;
                rects.push(Rectangle::new(
                    [(x0 + width * 0.05, 0.0), (x0 + width * 0.95, *v)],
                    color.filled(),
                ));
                let text = match of {
                    Some(f) => format!("{:.0}%", f * 100.0),
                    None => format!("{v:.0}"),
                };
                texts.push(Text::new(
                    text,
                    (x0 + width * 0.1, *v + ymax * 0.045),
                    ("sans-serif", 12),
                ));
            }
            chart
                .draw_series(rects)
                .map_err(|e| err(&e))?
                .label(label.clone())
                .legend(move |(x, y)| {
                    Rectangle::new([(x, y - 5), (x + 14, y + 5)], color.filled())
                });
            chart.draw_series(texts).map_err(|e| err(&e))?;
        }
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .position(SeriesLabelPosition::UpperRight)
            .draw()
            .map_err(|e| err(&e))?;
        root.present().map_err(|e| err(&e))?;
        Ok(())
    }
}

type Chart = (
    &'static str,
    &'static str,
    &'static str,
    fn(&crate::datapath::PositionResult) -> f64,
);

fn charts() -> [Chart; 4] {
    [
        (
            "latency-p50.svg",
            "New-connection latency p50 vs Services",
            "connect p50 (µs)",
            |p| p.connect.p50_us,
        ),
        (
            "latency-p99.svg",
            "New-connection latency p99 vs Services",
            "connect p99 (µs)",
            |p| p.connect.p99_us,
        ),
        (
            "cpu-per-1k-connections.svg",
            "CPU per 1,000 new connections vs Services",
            "CPU ms per 1k connections (machine-wide)",
            |p| p.close.cpu_ms_per_1k,
        ),
        (
            "rps-new-connection.svg",
            "Requests/s, a new connection per request, vs Services",
            "requests per second",
            |p| p.close.rps,
        ),
    ]
}

fn vm_charts() -> [Chart; 2] {
    [
        (
            "ipvs-vm-datapath.svg",
            "In the qemu guest: new-connection latency p50 vs Services",
            "connect p50 (µs, emulated)",
            |p| p.connect.p50_us,
        ),
        (
            "ipvs-vm-cpu.svg",
            "In the qemu guest: CPU per 1,000 new connections vs Services",
            "CPU ms per 1k connections (emulated vCPU)",
            |p| p.close.cpu_ms_per_1k,
        ),
    ]
}

const COLORS: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
];

/// Draws one SVG line chart: x = Services, one line per series.
///
/// # Errors
/// Drawing or writing fails.
pub fn line_chart(
    path: &Path,
    title: &str,
    y_label: &str,
    series: &[(String, Vec<(f64, f64)>)],
) -> anyhow::Result<()> {
    let xmax = series
        .iter()
        .flat_map(|(_, p)| p.iter().map(|x| x.0))
        .fold(1.0f64, f64::max);
    let ymax = series
        .iter()
        .flat_map(|(_, p)| p.iter().map(|x| x.1))
        .fold(1e-9f64, f64::max)
        * 1.1;
    let root = SVGBackend::new(path, (900, 540)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| anyhow::anyhow!("{e}"))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(45)
        .y_label_area_size(70)
        .build_cartesian_2d(0f64..xmax * 1.02, 0f64..ymax)
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    chart
        .configure_mesh()
        .x_desc("background Services (× 10 endpoints)")
        .y_desc(y_label)
        .draw()
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    // One color per mode (the label before " (position)"); the first position is lighter.
    let mut modes: Vec<&str> = Vec::new();
    for (label, pts) in series {
        let mode = label.split(" (").next().unwrap_or(label);
        let i = match modes.iter().position(|m| *m == mode) {
            Some(i) => i,
            None => {
                modes.push(mode);
                modes.len() - 1
            }
        };
        let color = COLORS[i % COLORS.len()];
        let style = if label.contains("(first)") {
            ShapeStyle::from(color.mix(0.6)).stroke_width(1)
        } else {
            ShapeStyle::from(color).stroke_width(2)
        };
        chart
            .draw_series(LineSeries::new(pts.iter().copied(), style))
            .map_err(|e| anyhow::anyhow!("{e}"))?
            .label(label.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], color));
        chart
            .draw_series(pts.iter().map(|p| Circle::new(*p, 3, color.filled())))
            .map_err(|e| anyhow::anyhow!("{e}"))?;
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperLeft)
        .draw()
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    root.present().map_err(|e| anyhow::anyhow!("{e}"))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::datapath::{Bulk, DatapathPoint, Percentiles, PositionResult, Throughput};

    fn position(name: &str, mb_per_s: f64, rps: f64) -> PositionResult {
        let mut t = Throughput::not_measured();
        t.rps = rps;
        t.requests = 10;
        t.connections = 10;
        PositionResult {
            position: name.into(),
            cluster_ip: "10.111.255.2".into(),
            connect: Percentiles::not_measured(),
            request: Percentiles::not_measured(),
            keepalive: t.clone(),
            close: t,
            bulk: vec![Bulk {
                streams: 1,
                failed: 0,
                seconds: 1.0,
                bytes: 1,
                mb_per_s,
                cpu_busy_ms: 1.0,
                process_cpu_ms: 1.0,
                proxy_cpu_ms: f64::NAN,
                round_mb_per_s: vec![mb_per_s],
            }],
        }
    }

    fn report() -> RunReport {
        let point = |mode: &str, p: PositionResult| DatapathPoint {
            mode: mode.into(),
            services: 0,
            probe_endpoints: 10,
            load: crate::control::Timed::Ok { ms: 1.0 },
            sysctl_warnings: Vec::new(),
            positions: vec![p],
        };
        RunReport {
            command: "test".into(),
            started_unix: 0,
            duration_s: 1.0,
            quick: true,
            machine: MachineInfo {
                uname: String::new(),
                lscpu: String::new(),
                mem_total: String::new(),
                iptables_legacy: String::new(),
                iptables_nft: String::new(),
                nft: String::new(),
            },
            environment: None,
            load_average: Some(("1.00 1.00 1.00 1/1 1".into(), "2.00 1.00 1.00 1/1 1".into())),
            control: Vec::new(),
            datapath: vec![
                point("userspace", position("last", 800.0, 300.0)),
                point("direct", position("pod", 1000.0, 1000.0)),
            ],
            daemon: Vec::new(),
        }
    }

    #[test]
    fn sections_without_data_print_no_table() {
        let mut r = report();
        r.datapath.clear();
        let md = r.markdown();
        for header in [
            "## Control plane",
            "## Datapath",
            "## Daemon peak RSS",
            "## One-Service",
        ] {
            assert!(!md.contains(header), "{header} without data:\n{md}");
        }
    }

    #[test]
    fn modes_are_compared_with_the_direct_baseline_of_the_same_size() {
        let md = report().markdown();
        assert!(md.contains("## Bulk throughput"), "{md}");
        assert!(md.contains("## Against a direct connection"), "{md}");
        assert!(md.contains("| userspace | 0 | last | 800 (80%) |"), "{md}");
        assert!(md.contains("300 (30%)"), "keepalive: {md}");
        assert!(md.contains("Load average"), "{md}");
        let r = report();
        assert_eq!(
            r.of_direct(0, |p| bulk_of(p, 1), 500.0),
            Some(0.5),
            "500 of 1000 MB/s"
        );
        assert_eq!(r.of_direct(1000, |p| bulk_of(p, 1), 500.0), None);
    }

    #[test]
    fn the_bulk_chart_has_a_group_per_mode() {
        let r = report();
        let (groups, bars) = r.bulk_bars().expect("bulk measured");
        assert_eq!(groups, ["userspace", "direct"]);
        assert_eq!(bars[0][0].1, 800.0);
        assert_eq!(bars[0][0].2, Some(0.8));
        let dir = tempfile::tempdir().unwrap();
        let files = r.write(dir.path()).unwrap();
        let chart = dir.path().join(BULK_CHART);
        assert!(files.contains(&chart));
        let svg = std::fs::read_to_string(chart).unwrap();
        assert!(svg.contains("<svg") && svg.contains("userspace") && svg.contains("80%"));
        // The JSON reads back (`kp-bench report`).
        let json = std::fs::read_to_string(dir.path().join("results.json")).unwrap();
        let back: RunReport = serde_json::from_str(&json).unwrap();
        assert_eq!(back.datapath.len(), 2);
        assert!(back.datapath[0].positions[0].bulk[0].proxy_cpu_ms.is_nan());
    }
}
