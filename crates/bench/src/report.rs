//! Outputs of `kp-bench all`: `results.json`, `results.md` (Markdown tables), SVG charts
//! (plotters, SVG backend) and `machine.md` (lscpu, uname, tool versions).
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
    /// Control-plane points.
    pub control: Vec<ControlPoint>,
    /// Datapath points.
    pub datapath: Vec<DatapathPoint>,
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
        let _ = writeln!(
            s,
            "## Control plane (Services × 10 endpoints, medians)\n\n\
             | mode | Services | render (cold) | payload | tool alone (floor) | cold full sync | sync / floor | full resync | iptables-save -t nat | parse (light / full) | peak RSS (state) |\n\
             |---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
        );
        for c in &self.control {
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} ({} lines) | {} | {} | {} | {} | {} | {} / {} | {} |",
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
        let _ = writeln!(
            s,
            "\n## Datapath (background Services × 10 endpoints; probed Service first / last in KUBE-SERVICES)\n\n\
             | mode | Services | position | connect p50 | p90 | p99 | probes (failed) | req/s keepalive | req/s new conn | CPU ms / 1k new conn (sys, softirq) |\n\
             |---|---:|---|---:|---:|---:|---:|---:|---:|---:|"
        );
        for d in &self.datapath {
            if d.positions.is_empty() {
                let _ = writeln!(
                    s,
                    "| {} | {} | – | rules not loaded: {} | | | | | | |",
                    d.mode,
                    d.services,
                    d.load.cell()
                );
            }
            for p in &d.positions {
                let _ = writeln!(
                    s,
                    "| {} | {} | {} | {:.0} µs | {:.0} µs | {:.0} µs | {} ({}) | {} | {:.0} | {:.0} ({:.0}, {:.0}) |",
                    d.mode,
                    d.services,
                    p.position,
                    p.connect.p50_us,
                    p.connect.p90_us,
                    p.connect.p99_us,
                    p.connect.n,
                    p.connect.failed,
                    Num(p.keepalive.rps),
                    p.close.rps,
                    p.close.cpu_ms_per_1k,
                    p.close.cpu_system_ms / (p.close.connections.max(1) as f64) * 1000.0,
                    p.close.cpu_softirq_ms / (p.close.connections.max(1) as f64) * 1000.0,
                );
            }
        }
        s
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
        for (name, title, y, f) in charts() {
            let series = self.series(f);
            let p = dir.join(name);
            line_chart(&p, title, y, &series)?;
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

const COLORS: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
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
    for (i, (label, pts)) in series.iter().enumerate() {
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
