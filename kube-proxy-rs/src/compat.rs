//! Upstream flags around the proxy itself: checking the bind addresses, the deprecated
//! `--healthz-port` / `--metrics-port`, `--feature-gates`, `--bind-address`, and the log
//! line for each flag that is accepted for compatibility but has no effect
//! ([`crate::cli::CompatArgs`]). docs/flags.md lists every upstream flag.

use anyhow::Context;
use tracing::{info, warn};

use crate::cli::{CompatArgs, ProxyArgs};

/// Upstream feature gates that concern kube-proxy (current and recently removed or
/// graduated ones that DaemonSets still pass), plus the generic ones every component knows.
pub const KNOWN_GATES: &[&str] = &[
    "AllAlpha",
    "AllBeta",
    "ComponentFlagz",
    "ComponentStatusz",
    "ContextualLogging",
    "EndpointSliceProxying",
    "EndpointSliceTerminatingCondition",
    "IPTablesOwnershipCleanup",
    "IPv6DualStack",
    "KubeProxyDrainingTerminatingNodes",
    "LoadBalancerIPMode",
    "LoggingAlphaOptions",
    "LoggingBetaOptions",
    "MinimizeIPTablesRestore",
    "MultiCIDRServiceAllocator",
    "NFTablesProxyMode",
    "PreferSameTrafficDistribution",
    "ProxyTerminatingEndpoints",
    "SCTPSupport",
    "ServiceInternalTrafficPolicy",
    "ServiceLBNodePortControl",
    "ServiceLoadBalancerClass",
    "ServiceTopology",
    "ServiceTrafficDistribution",
    "TopologyAwareHints",
    "WinDSR",
    "WinOverlay",
];

/// Checks the healthz and metrics bind addresses, with an error naming the flag. Every run
/// mode calls it, so a typo fails `--dry-run` too.
///
/// # Errors
/// `--healthz-bind-address` or `--metrics-bind-address` is not `IP:port`, `[IPv6]:port`,
/// a bare IP or empty.
pub fn check_bind_addresses(args: &ProxyArgs) -> anyhow::Result<()> {
    kp_admin::parse_bind_address(&args.healthz_bind_address, kp_admin::DEFAULT_HEALTHZ_PORT)
        .context("--healthz-bind-address")?;
    kp_admin::parse_bind_address(&args.metrics_bind_address, kp_admin::DEFAULT_METRICS_PORT)
        .context("--metrics-bind-address")?;
    Ok(())
}

/// Upstream's deprecated `--healthz-port` / `--metrics-port`: 0 disables the server; another
/// port is appended to a bind address that has none.
pub fn apply_deprecated_ports(args: &mut ProxyArgs) {
    fn with_port(addr: &str, port: Option<u16>) -> Option<String> {
        let port = port?;
        if port == 0 {
            return Some(String::new());
        }
        let a = addr.trim();
        let bare = a
            .strip_prefix('[')
            .and_then(|s| s.strip_suffix(']'))
            .unwrap_or(a);
        match bare.parse::<std::net::IpAddr>() {
            Ok(ip) => Some(std::net::SocketAddr::new(ip, port).to_string()),
            Err(_) => None,
        }
    }
    if let Some(a) = with_port(&args.healthz_bind_address, args.healthz_port) {
        args.healthz_bind_address = a;
    }
    if let Some(a) = with_port(&args.metrics_bind_address, args.metrics_port) {
        args.metrics_bind_address = a;
    }
}

/// Logs the feature gates: known ones with an info line, unknown ones with a warning.
/// Returns the unknown names.
pub fn log_feature_gates(gates: &[(String, bool)]) -> Vec<String> {
    let mut unknown = Vec::new();
    for (name, value) in gates {
        if KNOWN_GATES.contains(&name.as_str()) {
            info!(gate = %name, enabled = value, "feature gate set (kube-proxy-rs implements the features it supports regardless)");
        } else {
            warn!(gate = %name, enabled = value, "unrecognized feature gate: ignored");
            unknown.push(name.clone());
        }
    }
    unknown
}

/// Logs what the flags that kube-proxy-rs accepts for compatibility change: nothing.
/// `explicit(id)` tells whether the flag with clap id `id` was given on the command line.
pub fn log_noop_flags(args: &ProxyArgs, explicit: impl Fn(&str) -> bool) {
    for (id, flag) in CompatArgs::FLAGS {
        if explicit(id) {
            info!(
                flag = *flag,
                "flag accepted for compatibility with kube-proxy; it has no effect in kube-proxy-rs"
            );
        }
    }
    if !args.bind_address.is_unspecified() {
        info!(bind_address = %args.bind_address, "--bind-address: this is the node's primary IP of its family, before the Node object's addresses");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn parse(args: &[&str]) -> ProxyArgs {
        let mut all = vec!["kube-proxy-rs"];
        all.extend(args);
        crate::cli::Cli::try_parse_from(all).unwrap().proxy
    }

    #[test]
    fn bind_addresses_are_checked() {
        assert!(check_bind_addresses(&parse(&[])).is_ok());
        let bad = parse(&["--healthz-bind-address=notanaddr"]);
        let e = format!("{:#}", check_bind_addresses(&bad).unwrap_err());
        assert!(e.contains("--healthz-bind-address"), "{e}");
        let bad = parse(&["--metrics-bind-address=1.2.3:4"]);
        let e = format!("{:#}", check_bind_addresses(&bad).unwrap_err());
        assert!(e.contains("--metrics-bind-address"), "{e}");
        assert!(check_bind_addresses(&parse(&["--metrics-bind-address="])).is_ok());
    }

    #[test]
    fn deprecated_ports() {
        let mut a = parse(&[
            "--healthz-port=0",
            "--metrics-bind-address=0.0.0.0",
            "--metrics-port=9999",
        ]);
        apply_deprecated_ports(&mut a);
        assert_eq!(a.healthz_bind_address, "");
        assert_eq!(a.metrics_bind_address, "0.0.0.0:9999");
        let mut a = parse(&["--healthz-port=1234"]);
        apply_deprecated_ports(&mut a);
        assert_eq!(a.healthz_bind_address, "0.0.0.0:10256");
    }

    #[test]
    fn feature_gates() {
        let a = parse(&[
            "--feature-gates=NFTablesProxyMode=true,Bogus=false",
            "--feature-gates",
            "AllAlpha=f",
        ]);
        assert_eq!(
            a.feature_gates,
            [
                ("NFTablesProxyMode".to_string(), true),
                ("Bogus".to_string(), false),
                ("AllAlpha".to_string(), false)
            ]
        );
        assert_eq!(log_feature_gates(&a.feature_gates), ["Bogus"]);
        let bad = crate::cli::Cli::try_parse_from(["kube-proxy-rs", "--feature-gates=X=maybe"]);
        assert!(bad.is_err());
        let bad = crate::cli::Cli::try_parse_from(["kube-proxy-rs", "--feature-gates=X"]);
        assert!(bad.is_err());
    }
}
