//! `kp-bench`: scale benchmarks that need the kernel (root; everything runs in network
//! namespaces the benchmark creates).
//!
//! ```text
//! kp-bench nft-scale --services 10000 --endpoints 10 --runs 3
//! ```

use std::time::Duration;

use anyhow::bail;
use clap::{Parser, Subcommand};

/// kp-bench: scale benchmarks of kube-proxy-rs.
#[derive(Debug, Parser)]
#[command(name = "kp-bench", about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
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

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
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
