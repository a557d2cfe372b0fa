//! kube-proxy-rs: the binary. Parses kube-proxy's flags, builds the pipeline
//! (manifest source → tracker → sync loop → iptables proxier) and runs it, or runs a
//! subcommand (`sandbox`).

mod cli;
// Wired to --config/--write-config-to together with the API source (issue 5).
#[allow(dead_code)]
mod config;
mod proxy;
mod sandbox;
mod trace;

use std::process::ExitCode;

use clap::Parser;
use tracing_subscriber::EnvFilter;

use cli::{Cli, Command};

fn init_tracing(verbosity: u8) {
    let default = match verbosity {
        0 | 1 => "info",
        2 | 3 => "debug",
        _ => "trace",
    };
    // notify logs an expected "unable to remove watch descriptor" at INFO when a watched
    // directory is deleted; keep the library at WARN.
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new(format!("{default},notify=warn")));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Some(Command::Sandbox(args)) => {
            init_tracing(0);
            sandbox::run(args)
        }
        Some(Command::Trace(args)) => {
            init_tracing(0);
            trace::run(args)
        }
        None => {
            init_tracing(cli.proxy.verbosity);
            proxy::run(cli.proxy)
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e:#}");
            ExitCode::FAILURE
        }
    }
}
