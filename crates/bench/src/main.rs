//! `kp-bench`: scale benchmarks that need the kernel (root; everything runs in network
//! namespaces the benchmark creates).
//!
//! ```text
//! kp-bench all --out docs/benchmarks          # the full suite, every mode, side by side
//! kp-bench all --quick --out /tmp/kp-bench    # the CI sizes
//! kp-bench all --modes iptables-legacy,nftables,userspace,direct --no-control \
//!     --datapath-sizes 0,1000 --out docs/benchmarks/userspace   # userspace vs direct
//! kp-bench vm --out docs/benchmarks/vm        # iptables-legacy, nftables, ipvs in the qemu guest
//! kp-bench report --json docs/benchmarks/userspace/results.json   # tables, charts again
//! kp-bench daemon-rss --sizes 1000,5000,10000 --out docs/benchmarks/daemon   # the daemon's memory
//! kp-bench dump --mode iptables-legacy --services 10000 > payload.txt
//! kp-bench nft-scale --services 10000 --endpoints 10 --runs 3
//! ```

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::{Parser, Subcommand};
use kp_bench::{AllOptions, Mode};

/// kp-bench: scale benchmarks of kube-proxy-rs.
#[derive(Debug, Parser)]
#[command(name = "kp-bench", about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Every benchmark for every mode (iptables-legacy, iptables-nft, iptables-nft-one, iptables-nft-zero,
    /// iptables-legacy-tree, iptables-nft-tree (`--iptables-dispatch tree`),
    /// nftables, userspace, and the direct baseline), side by side: control plane and
    /// datapath. Writes results.json, results.md, machine.md and SVG charts into --out. Needs
    /// root; everything runs in network namespaces it creates.
    All {
        /// Output directory.
        #[arg(long, default_value = "docs/benchmarks")]
        out: PathBuf,
        /// CI sizes: 100 Services, 200 probes, one run.
        #[arg(long)]
        quick: bool,
        /// Modes (comma-separated labels); default every mode this kernel runs except
        /// iptables-nft-one (iptables-nft with one transaction per full sync, the behaviour
        /// before the split; minutes from 2,000 Services on).
        #[arg(long, value_delimiter = ',')]
        modes: Vec<String>,
        /// Control-plane sizes (comma-separated).
        #[arg(long, value_delimiter = ',')]
        control_sizes: Vec<usize>,
        /// Datapath sizes (comma-separated background Services).
        #[arg(long, value_delimiter = ',')]
        datapath_sizes: Vec<usize>,
        /// Control-plane runs per point.
        #[arg(long)]
        runs: Option<usize>,
        /// Latency probes per datapath point and position.
        #[arg(long)]
        probes: Option<usize>,
        /// Endpoints of each probed Service (default 10, one per backend namespace; more
        /// give the backends several pod IPs each, up to 2,540).
        #[arg(long)]
        probe_endpoints: Option<usize>,
        /// Seconds per requests-per-second run.
        #[arg(long)]
        rps_seconds: Option<f64>,
        /// Timeout of each kernel-tool run, seconds.
        #[arg(long)]
        tool_timeout: Option<u64>,
        /// Datapath positions to probe (comma-separated: first, last).
        #[arg(long, value_delimiter = ',')]
        positions: Vec<String>,
        /// No control-plane points (datapath only).
        #[arg(long)]
        no_control: bool,
        /// Skip the keepalive requests-per-second runs.
        #[arg(long)]
        no_keepalive: bool,
        /// Seconds of each bulk-throughput run (0: no bulk runs).
        #[arg(long)]
        bulk_seconds: Option<f64>,
        /// Parallel connections of the bulk-throughput runs (comma-separated; one run each;
        /// default 1,4).
        #[arg(long, value_delimiter = ',')]
        bulk_streams: Vec<usize>,
        /// Datapath rounds: every mode of a size is set up at once, and the probes and
        /// seconds are split into this many rounds, each mode measured in turn per round
        /// (robust against load from elsewhere; default 1).
        #[arg(long)]
        rounds: Option<usize>,
        /// Start from the defaults of `kp-bench vm` (the guest's sizes) instead of the full run.
        #[arg(long)]
        vm_defaults: bool,
        /// Print the report as one JSON line (prefixed `KP-BENCH-REPORT `) on stdout instead
        /// of writing files (how `kp-bench vm` gets the guest's report).
        #[arg(long)]
        json_stdout: bool,
        /// Sizes of the daemon's own memory (as `daemon-rss`; comma-separated Services, or
        /// `none`; default 1000,5000,10000, quick 100).
        #[arg(long, value_delimiter = ',')]
        daemon_sizes: Vec<String>,
        /// Sources of the daemon-memory points (manifests, manifests-list, api; default all).
        #[arg(long, value_delimiter = ',')]
        daemon_sources: Vec<String>,
        /// The kube-proxy-rs binary for the daemon-memory points (default: the one next to
        /// this executable; without one they are not measured).
        #[arg(long)]
        proxy_binary: Option<PathBuf>,
    },
    /// The kube-proxy-rs daemon's own memory: the real binary, run one at a time in a fresh
    /// network namespace on a synthetic cluster (Services × 10 endpoints, one EndpointSlice
    /// each, the Node) from each source, until its first sync; then VmHWM and VmRSS from
    /// /proc/PID/status. Writes results.json, results.md and machine.md into --out. Needs
    /// root. IPVS mode is skipped where the kernel has no IPVS; with --vm everything runs in
    /// the qemu guest of kp_testkit::vm (Debian's kernel, with IPVS), where IPVS mode is
    /// measured.
    DaemonRss {
        /// Output directory.
        #[arg(long, default_value = "docs/benchmarks/daemon")]
        out: PathBuf,
        /// Services (comma-separated).
        #[arg(long, value_delimiter = ',', default_value = "1000,5000,10000")]
        sizes: Vec<usize>,
        /// Endpoints per Service.
        #[arg(long, default_value_t = 10)]
        endpoints: usize,
        /// Modes (iptables-legacy, iptables-nft, nftables, userspace, ipvs; default all).
        #[arg(long, value_delimiter = ',')]
        modes: Vec<String>,
        /// Sources (manifests: a file of documents per namespace; manifests-list: one
        /// `kind: List` file; api: the test API server through --master; default all).
        #[arg(long, value_delimiter = ',')]
        sources: Vec<String>,
        /// The kube-proxy-rs binary (default: the one next to this executable).
        #[arg(long)]
        proxy_binary: Option<PathBuf>,
        /// Seconds one daemon may take to complete its first sync.
        #[arg(long, default_value_t = 600)]
        timeout: u64,
        /// Seconds to wait after the first sync before reading the daemon's memory.
        #[arg(long, default_value_t = 2.0)]
        settle: f64,
        /// Run inside the qemu guest of kp_testkit::vm (one boot for every point; the same
        /// binaries, through the guest's view of this machine's files): IPVS mode needs its
        /// kernel. Needs root and `scripts/install-deps`.
        #[arg(long)]
        vm: bool,
        /// With --vm: the guest's timeout, minutes.
        #[arg(long, default_value_t = 120)]
        vm_timeout_min: u64,
        /// With --vm: the guest's memory, MiB.
        #[arg(long, default_value_t = 3072)]
        vm_memory_mib: u32,
        /// Print the report as one JSON line (prefixed `KP-BENCH-REPORT `) on stdout instead
        /// of writing files (how --vm gets the guest's report).
        #[arg(long)]
        json_stdout: bool,
    },
    /// The modes side by side INSIDE the qemu guest of kp_testkit::vm (a kernel with IPVS):
    /// iptables-legacy, nftables and ipvs by default, so their ratios come from one kernel.
    /// Absolute numbers are emulated and not comparable to the host's. Boots once, runs
    /// `kp-bench all --vm-defaults` there, and writes the report into --out. Needs root and
    /// `scripts/install-deps`.
    Vm {
        /// Output directory.
        #[arg(long, default_value = "docs/benchmarks/vm")]
        out: PathBuf,
        /// Modes (comma-separated labels); default iptables-legacy,nftables,ipvs.
        #[arg(long, value_delimiter = ',')]
        modes: Vec<String>,
        /// Control-plane sizes (comma-separated; default 1000; `none`: datapath only).
        #[arg(long, value_delimiter = ',')]
        control_sizes: Vec<String>,
        /// Datapath sizes (comma-separated background Services; default 0,1000,5000,10000).
        #[arg(long, value_delimiter = ',')]
        datapath_sizes: Vec<usize>,
        /// Control-plane runs per point (default 1).
        #[arg(long)]
        runs: Option<usize>,
        /// Latency probes per datapath point and position (default 300).
        #[arg(long)]
        probes: Option<usize>,
        /// Seconds of the new-connection requests run that measures CPU (default 2).
        #[arg(long)]
        rps_seconds: Option<f64>,
        /// Timeout of each kernel-tool run in the guest, seconds (default 600).
        #[arg(long)]
        tool_timeout: Option<u64>,
        /// Datapath positions (comma-separated; default last).
        #[arg(long, value_delimiter = ',')]
        positions: Vec<String>,
        /// The guest's timeout, minutes.
        #[arg(long, default_value_t = 40)]
        timeout_min: u64,
        /// Guest memory, MiB.
        #[arg(long, default_value_t = 3072)]
        memory_mib: u32,
    },
    /// Rewrites results.md, machine.md and the SVG charts of a run from its results.json
    /// (after a change of the report's tables or charts; nothing is measured).
    Report {
        /// The run's results.json.
        #[arg(long)]
        json: PathBuf,
        /// Output directory (default: the JSON's directory).
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Child process of `all`: builds the tracker state for N Services, runs one full sync
    /// of MODE into a fresh namespace and prints its peak RSS (VmHWM).
    Rss {
        /// Mode label.
        #[arg(long)]
        mode: String,
        /// Services.
        #[arg(long)]
        services: usize,
        /// Endpoints per Service.
        #[arg(long, default_value_t = 10)]
        endpoints: usize,
        /// Timeout of the kernel tool, seconds.
        #[arg(long, default_value_t = 600)]
        tool_timeout: u64,
    },
    /// Prints the cold full payload of a mode (what a fresh node receives), for experiments
    /// with the kernel tools.
    Dump {
        /// Mode label (the iptables modes print the same payload).
        #[arg(long, default_value = "iptables-legacy")]
        mode: String,
        /// Services.
        #[arg(long, default_value_t = 10_000)]
        services: usize,
        /// Endpoints per Service.
        #[arg(long, default_value_t = 10)]
        endpoints: usize,
    },
    /// Render N Services × M endpoints in nftables mode, load them with `nft -f` into a fresh
    /// network namespace, then time a full resync and three one-Service changes (partial
    /// syncs). Prints the median of the runs. Needs root.
    NftScale {
        /// Services (each with one port).
        #[arg(long, default_value_t = 10_000)]
        services: usize,
        /// Endpoints per Service.
        #[arg(long, default_value_t = 10)]
        endpoints: usize,
        /// Runs (a fresh namespace each); medians are printed.
        #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..))]
        runs: u32,
    },
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1e3)
}

fn mode(label: &str) -> anyhow::Result<Mode> {
    Mode::parse(label).with_context(|| {
        format!(
            "unknown mode {label:?} (iptables-legacy, iptables-nft, iptables-nft-one, iptables-nft-zero, nftables, ipvs, userspace, direct)"
        )
    })
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::All {
            out,
            quick,
            modes,
            control_sizes,
            datapath_sizes,
            runs,
            probes,
            probe_endpoints,
            rps_seconds,
            tool_timeout,
            positions,
            no_keepalive,
            bulk_seconds,
            bulk_streams,
            rounds: datapath_rounds,
            no_control,
            vm_defaults,
            json_stdout,
            daemon_sizes,
            daemon_sources,
            proxy_binary,
        } => {
            if !nix_is_root() {
                bail!(
                    "kp-bench all loads rules into network namespaces it creates: run it as root"
                );
            }
            let mut opts = if quick {
                AllOptions::quick()
            } else if vm_defaults {
                AllOptions::vm()
            } else {
                AllOptions::full()
            };
            if !positions.is_empty() {
                opts.positions = positions;
            }
            if no_keepalive {
                opts.keepalive = false;
            }
            if !modes.is_empty() {
                opts.modes = modes
                    .iter()
                    .map(|m| mode(m))
                    .collect::<anyhow::Result<_>>()?;
            }
            if !control_sizes.is_empty() {
                opts.control_sizes = control_sizes;
            }
            if no_control {
                opts.control_sizes.clear();
            }
            if !datapath_sizes.is_empty() {
                opts.datapath_sizes = datapath_sizes;
            }
            opts.runs = runs.unwrap_or(opts.runs);
            opts.probes = probes.unwrap_or(opts.probes);
            opts.probe_endpoints = probe_endpoints.unwrap_or(opts.probe_endpoints);
            opts.rps_seconds = rps_seconds.unwrap_or(opts.rps_seconds);
            opts.bulk_seconds = bulk_seconds.unwrap_or(opts.bulk_seconds);
            opts.rounds = datapath_rounds.unwrap_or(opts.rounds);
            if !bulk_streams.is_empty() {
                opts.bulk_streams = bulk_streams;
            }
            if let Some(t) = tool_timeout {
                opts.tool_timeout = Duration::from_secs(t);
            }
            opts.rss_binary = std::env::current_exe().ok();
            if daemon_sizes.iter().any(|s| s == "none") {
                opts.daemon_sizes.clear();
            } else if !daemon_sizes.is_empty() {
                opts.daemon_sizes = daemon_sizes
                    .iter()
                    .map(|s| {
                        s.parse()
                            .with_context(|| format!("--daemon-sizes: {s:?} is not a number"))
                    })
                    .collect::<anyhow::Result<_>>()?;
            }
            if !daemon_sources.is_empty() {
                opts.daemon_sources = sources(&daemon_sources)?;
            }
            opts.proxy_binary = proxy_binary.or_else(default_proxy_binary);
            if opts.proxy_binary.is_none() && !opts.daemon_sizes.is_empty() {
                eprintln!(
                    "kp-bench: no kube-proxy-rs next to this executable and no --proxy-binary: \
                     the daemon's memory is not measured"
                );
            }
            opts.command = kp_bench::command_line(std::env::args());
            let report = kp_bench::run_all(&opts)?;
            if json_stdout {
                println!(
                    "{REPORT_PREFIX}{}",
                    serde_json::to_string(&report).context("serializing the report")?
                );
                return Ok(());
            }
            for p in report.write(&out)? {
                println!("wrote {}", p.display());
            }
            Ok(())
        }
        Command::Vm {
            out,
            modes,
            control_sizes,
            datapath_sizes,
            runs,
            probes,
            rps_seconds,
            tool_timeout,
            positions,
            timeout_min,
            memory_mib,
        } => {
            let mut args: Vec<String> =
                vec!["all".into(), "--vm-defaults".into(), "--json-stdout".into()];
            let list = |args: &mut Vec<String>, flag: &str, v: Vec<String>| {
                if !v.is_empty() {
                    args.push(format!("--{flag}={}", v.join(",")));
                }
            };
            for m in &modes {
                mode(m)?;
            }
            list(&mut args, "modes", modes);
            if control_sizes.iter().any(|s| s == "none") {
                args.push("--no-control".into());
            } else {
                for s in &control_sizes {
                    s.parse::<usize>()
                        .with_context(|| format!("--control-sizes: {s:?} is not a number"))?;
                }
                list(&mut args, "control-sizes", control_sizes);
            }
            list(
                &mut args,
                "datapath-sizes",
                datapath_sizes.iter().map(ToString::to_string).collect(),
            );
            list(&mut args, "positions", positions);
            for (flag, v) in [
                ("runs", runs.map(|v| v.to_string())),
                ("probes", probes.map(|v| v.to_string())),
                ("rps-seconds", rps_seconds.map(|v| v.to_string())),
                ("tool-timeout", tool_timeout.map(|v| v.to_string())),
            ] {
                if let Some(v) = v {
                    args.push(format!("--{flag}={v}"));
                }
            }
            let report = run_in_guest("vm", &args, timeout_min, memory_mib)?;
            for p in report.write(&out)? {
                println!("wrote {}", p.display());
            }
            Ok(())
        }
        Command::DaemonRss {
            out,
            sizes,
            endpoints,
            modes,
            sources: source_labels,
            proxy_binary,
            timeout,
            settle,
            vm,
            vm_timeout_min,
            vm_memory_mib,
            json_stdout,
        } => {
            if vm {
                // The same command in the guest, without --vm and its settings, reporting on
                // stdout.
                let mut args: Vec<String> = Vec::new();
                let mut skip = false;
                for a in std::env::args().skip(1) {
                    if std::mem::take(&mut skip) {
                        continue;
                    }
                    let name = a.split('=').next().unwrap_or_default();
                    match name {
                        "--vm" | "--json-stdout" => continue,
                        "--vm-timeout-min" | "--vm-memory-mib" | "--out" => {
                            skip = !a.contains('=');
                            continue;
                        }
                        _ => args.push(a),
                    }
                }
                if proxy_binary.is_none() {
                    // The guest finds the same file, through its view of this machine's.
                    let binary = default_proxy_binary()
                        .context("no kube-proxy-rs next to this executable: pass --proxy-binary")?;
                    args.push(format!("--proxy-binary={}", binary.display()));
                }
                args.push("--json-stdout".into());
                let report = run_in_guest("daemon-rss", &args, vm_timeout_min, vm_memory_mib)?;
                for p in report.write(&out)? {
                    println!("wrote {}", p.display());
                }
                return Ok(());
            }
            if !nix_is_root() {
                bail!(
                    "kp-bench daemon-rss runs the daemon in network namespaces it creates: run it as root"
                );
            }
            let binary = proxy_binary.or_else(default_proxy_binary).context(
                "no kube-proxy-rs next to this executable: pass --proxy-binary \
                 (cargo build --release -p kube-proxy-rs)",
            )?;
            let started = std::time::Instant::now();
            let load_start = load_average();
            let mut opts = kp_bench::daemon::DaemonOptions::full(binary);
            opts.sizes = sizes;
            opts.endpoints = endpoints;
            if !modes.is_empty() {
                opts.modes = modes
                    .iter()
                    .map(|m| {
                        kp_testkit::rss::DaemonMode::parse(m).with_context(|| {
                            format!("unknown mode {m:?} (iptables-legacy, iptables-nft, nftables, userspace, ipvs)")
                        })
                    })
                    .collect::<anyhow::Result<_>>()?;
            }
            if !source_labels.is_empty() {
                opts.sources = sources(&source_labels)?;
            }
            opts.timeout = Duration::from_secs(timeout);
            opts.settle = Duration::from_secs_f64(settle);
            let points = kp_bench::daemon::run(&opts);
            let report = kp_bench::report::RunReport {
                command: kp_bench::command_line(std::env::args()),
                started_unix: std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_secs())
                    .unwrap_or_default()
                    .saturating_sub(started.elapsed().as_secs()),
                duration_s: started.elapsed().as_secs_f64(),
                quick: false,
                machine: kp_bench::report::MachineInfo::read(),
                environment: kp_testkit::vm::in_guest()
                    .then(|| kp_bench::report::GUEST_NOTE.to_string()),
                load_average: Some((load_start, load_average())),
                control: Vec::new(),
                datapath: Vec::new(),
                daemon: points,
            };
            if json_stdout {
                println!(
                    "{REPORT_PREFIX}{}",
                    serde_json::to_string(&report).context("serializing the report")?
                );
                return Ok(());
            }
            for p in report.write(&out)? {
                println!("wrote {}", p.display());
            }
            Ok(())
        }
        Command::Report { json, out } => {
            let text = std::fs::read_to_string(&json)
                .with_context(|| format!("reading {}", json.display()))?;
            let report: kp_bench::report::RunReport = serde_json::from_str(&text)
                .with_context(|| format!("parsing {}", json.display()))?;
            let out = out.unwrap_or_else(|| {
                json.parent()
                    .map(PathBuf::from)
                    .unwrap_or_else(|| PathBuf::from("."))
            });
            for p in report.write(&out)? {
                println!("wrote {}", p.display());
            }
            Ok(())
        }
        Command::Rss {
            mode: m,
            services,
            endpoints,
            tool_timeout,
        } => {
            let (state, peak) = kp_bench::control::rss_child(
                mode(&m)?,
                services,
                endpoints,
                Duration::from_secs(tool_timeout),
            )?;
            println!("state_rss_mib={state:.2}");
            println!("peak_rss_mib={peak:.2}");
            Ok(())
        }
        Command::Dump {
            mode: m,
            services,
            endpoints,
        } => {
            let snap = kp_bench::scale_snapshot(services, endpoints);
            let (payload, took) = kp_bench::render_payload(mode(&m)?, &snap);
            eprintln!("rendered {} bytes in {}", payload.len(), ms(took));
            use std::io::Write as _;
            std::io::stdout().lock().write_all(payload.as_bytes())?;
            Ok(())
        }
        Command::NftScale {
            services,
            endpoints,
            runs,
        } => {
            if !nix_is_root() {
                bail!("nft-scale loads rules into a network namespace it creates: run it as root");
            }
            let mut all = Vec::new();
            for i in 0..runs {
                let r = kp_bench::nft_scale(services, endpoints)?;
                eprintln!(
                    "run {}: render {} ({} bytes), load {}, full resync {} ({} bytes), {}",
                    i + 1,
                    ms(r.render),
                    r.payload_bytes,
                    ms(r.load),
                    ms(r.resync),
                    r.resync_bytes,
                    r.changes
                        .iter()
                        .map(|c| format!("{}: {} ({} bytes)", c.what, ms(c.time), c.bytes))
                        .collect::<Vec<_>>()
                        .join(", ")
                );
                all.push(r);
            }
            let m = kp_bench::summarize(&all);
            let Some(first) = all.first() else {
                bail!("no run completed");
            };
            let m = |k: &str| m.get(k).copied().unwrap_or_default();
            println!(
                "nft-scale: {services} Services x {endpoints} endpoints ({} rules), median of {runs} run(s)",
                services * (endpoints + 1)
            );
            println!(
                "  render full ruleset      {:>10}   payload {} bytes",
                ms(m("render")),
                first.payload_bytes
            );
            println!("  nft -f (cold load)       {:>10}", ms(m("load")));
            println!(
                "  full resync (list+render+nft -f) {:>10}   payload {} bytes",
                ms(m("resync")),
                first.resync_bytes
            );
            for c in &first.changes {
                println!(
                    "  {:<24} {:>10}   payload {} bytes",
                    c.what,
                    ms(m(c.what)),
                    c.bytes
                );
            }
            Ok(())
        }
    }
}

/// Runs this executable with `args` in the qemu guest of kp_testkit::vm (its output
/// streamed), and returns the report it prints on stdout (`--json-stdout`), its command line
/// naming both the host's and the guest's. `what` names the subcommand in progress messages.
fn run_in_guest(
    what: &str,
    args: &[String],
    timeout_min: u64,
    memory_mib: u32,
) -> anyhow::Result<kp_bench::report::RunReport> {
    let exe = std::env::current_exe().context("finding this executable")?;
    eprintln!(
        "kp-bench {what}: booting the guest: {} {}",
        exe.display(),
        args.join(" ")
    );
    let guest = kp_testkit::vm::GuestCommand::new(&exe)
        .args(args)
        .timeout(Duration::from_secs(timeout_min * 60))
        .memory_mib(memory_mib)
        .stream(true)
        .run()
        .context("running the benchmark in the qemu guest (see docs/vm.md)")?;
    eprintln!(
        "kp-bench {what}: guest exit code {}; boot {:.1} s, total {:.1} s",
        guest.code,
        guest.boot.as_secs_f64(),
        guest.elapsed.as_secs_f64()
    );
    let text = guest.stdout_text();
    let Some(json) = text.lines().find_map(|l| l.strip_prefix(REPORT_PREFIX)) else {
        bail!(
            "the guest printed no report (exit code {}); its stderr ends:\n{}",
            guest.code,
            tail(&guest.stderr_text(), 3000)
        );
    };
    let mut report: kp_bench::report::RunReport =
        serde_json::from_str(json).context("reading the guest's report")?;
    report.command = format!(
        "{} (in the guest: {})",
        kp_bench::command_line(std::env::args()),
        report.command
    );
    Ok(report)
}

/// Parses `--sources` / `--daemon-sources` labels.
fn sources(labels: &[String]) -> anyhow::Result<Vec<kp_testkit::rss::Source>> {
    labels
        .iter()
        .map(|s| {
            kp_testkit::rss::Source::parse(s)
                .with_context(|| format!("unknown source {s:?} (manifests, manifests-list, api)"))
        })
        .collect()
}

/// The kube-proxy-rs binary next to this executable (same cargo target directory).
fn default_proxy_binary() -> Option<PathBuf> {
    kp_bench::daemon::sibling_proxy_binary(&std::env::current_exe().ok()?)
}

/// `/proc/loadavg`, trimmed (empty when unreadable).
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// The prefix of the report line `all --json-stdout` prints.
const REPORT_PREFIX: &str = "KP-BENCH-REPORT ";

fn tail(s: &str, n: usize) -> &str {
    let start = s.len().saturating_sub(n);
    let start = (start..=s.len())
        .find(|i| s.is_char_boundary(*i))
        .unwrap_or(s.len());
    &s[start..]
}

fn nix_is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Uid:"))
                .and_then(|v| v.split_whitespace().nth(1).map(|e| e == "0"))
        })
        .unwrap_or(false)
}
