//! kube-proxy-rs: the binary. Parses kube-proxy's flags, builds the pipeline
//! (manifest source → tracker → sync loop → iptables proxier) and runs it, or runs a
//! subcommand (`sandbox`).

mod admin;
mod arena;
mod cli;
mod compat;
mod config;
mod config_watch;
mod configz;
mod dry_run;
mod events;
mod ipvs_mode;
mod logging;
mod nfacct;
mod nodesetup;
mod ping;
mod proxy;
mod restclient;
mod sandbox;
mod shutdown;
mod stdout;
mod takeover;
mod trace;
mod userspace_mode;

use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches};

use cli::{Cli, Command};

fn main() -> ExitCode {
    let matches = Cli::command().get_matches();
    let mut cli = match Cli::from_arg_matches(&matches) {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
    // --config: the file is the configuration, as upstream (see config::apply for the flags
    // that still override it); what to log about it waits for the logger.
    if let Some(path) = cli.proxy.config.clone() {
        let explicit =
            |id: &str| matches.value_source(id) == Some(clap::parser::ValueSource::CommandLine);
        match config::KubeProxyConfiguration::load(&path).and_then(|(c, mut loaded)| {
            loaded
                .notes
                .extend(config::apply(&c, &mut cli.proxy, explicit)?);
            Ok(loaded)
        }) {
            Ok(loaded) => cli.proxy.config_loaded = Some(loaded),
            Err(e) => {
                eprintln!("error: {e:#}");
                return ExitCode::FAILURE;
            }
        }
    }
    compat::apply_deprecated_ports(&mut cli.proxy);
    if cli.command.is_none()
        && let Err(e) = compat::check_bind_addresses(&cli.proxy).and_then(|()| {
            // As upstream's validation: before anything else, --write-config-to included.
            proxy::cluster_cidrs(
                "--cluster-cidr",
                cli.proxy.cluster_cidr.iter().map(String::as_str),
            )
            .map(drop)
        })
    {
        eprintln!("error: {e:#}");
        return ExitCode::FAILURE;
    }
    if let Some(path) = cli.proxy.write_config_to.clone() {
        if let Some(loaded) = &cli.proxy.config_loaded {
            for note in &loaded.notes {
                let level = match note {
                    config::Note::NoEffect { .. } => "note",
                    _ => "warning",
                };
                eprintln!(
                    "{level}: --config {}: {note}",
                    kp_model::Escaped(&loaded.path.display().to_string())
                );
            }
        }
        let written = config::from_args(&cli.proxy).to_yaml().and_then(|yaml| {
            std::fs::write(&path, yaml)
                .map_err(|e| anyhow::anyhow!("--write-config-to {}: {e}", path.display()))
        });
        return match written {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("error: {e:#}");
                ExitCode::FAILURE
            }
        };
    }
    let result = match cli.command {
        Some(Command::Sandbox(args)) => {
            logging::init(0, "text");
            sandbox::run(args)
        }
        Some(Command::Trace(args)) => {
            logging::init(0, "text");
            trace::run(args)
        }
        None => {
            // The daemon (and --once) runs with one malloc arena; a dry run writes no rules
            // and keeps glibc's default. No thread exists yet.
            let exec_error = if cli.proxy.dry_run {
                None
            } else {
                arena::one_arena()
            };
            logging::init(cli.proxy.verbosity, &cli.proxy.compat.logging_format);
            if let Some(e) = exec_error {
                tracing::warn!(
                    "cannot re-execute with {}=1 (one malloc arena, a lower peak RSS): {e}",
                    arena::ARENA_MAX
                );
            }
            if let Some(loaded) = &cli.proxy.config_loaded {
                for note in &loaded.notes {
                    note.log(&loaded.path);
                }
            }
            // With --config, a flag the file overrides was noted as ignored just above.
            let with_config = cli.proxy.config.is_some();
            compat::log_noop_flags(&cli.proxy, |id| {
                matches.value_source(id) == Some(clap::parser::ValueSource::CommandLine)
                    && !(with_config && config::FILE_WINS.iter().any(|(i, _, _)| *i == id))
            });
            compat::log_feature_gates(&cli.proxy.feature_gates);
            proxy::run(cli.proxy)
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        // `trace ... | head`: the reader had what it wanted; end quietly.
        Err(e) if stdout::is_closed_stdout(&e) => ExitCode::from(stdout::CLOSED_STDOUT_STATUS),
        Err(e) => {
            tracing::error!("{e:#}");
            ExitCode::FAILURE
        }
    }
}
