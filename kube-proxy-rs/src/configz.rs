//! `/configz` on the metrics server, as upstream serves it (component-base `configz`):
//! `{"kubeproxy.config.k8s.io": <configuration>}`, where the configuration is the effective
//! one (flags over the `--config` file over the defaults) in the shape of upstream's
//! *internal* `KubeProxyConfiguration` type, which is what `configz` marshals: Go field names
//! (`ClientConnection`, `IPTables`, `SyncPeriod`, ...), no `apiVersion`/`kind`, durations as
//! Go prints them (`30s`, `15m0s`), unset pointers as `null`, and the sections upstream's
//! conversion from `v1alpha1` moves: `Linux` (conntrack, masqueradeAll, oomScoreAdj), the
//! mode's `syncPeriod`/`minSyncPeriod` at the top, `DetectLocal.ClusterCIDRs` from
//! `clusterCIDR`. The `Logging` section keeps its JSON names (component-base's type has
//! them).
//!
//! It is built from the `v1alpha1` document `--write-config-to` writes
//! ([`crate::config::from_args`]), read through its upstream field names.

use serde_json::{Value, json};

use crate::cli::{ProxyArgs, ProxyModeArg};

/// The group `/configz` files the configuration under.
pub const GROUP: &str = "kubeproxy.config.k8s.io";

/// The configuration `/configz` serves for `args` (see the module documentation).
pub fn document(args: &ProxyArgs) -> Value {
    let v1 = serde_json::to_value(crate::config::from_args(args)).unwrap_or(Value::Null);
    let at = |p: &str| v1.pointer(p).cloned().unwrap_or(Value::Null);
    let text = |p: &str| {
        v1.pointer(p)
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string()
    };
    // The mode's section carries the sync periods and masqueradeAll (upstream's conversion).
    let section = match args.proxy_mode {
        ProxyModeArg::Nftables => "/nftables",
        ProxyModeArg::Ipvs => "/ipvs",
        _ => "/iptables",
    };
    let masquerade_section = if args.proxy_mode == ProxyModeArg::Nftables {
        "/nftables"
    } else {
        "/iptables"
    };
    let cluster_cidrs: Vec<String> = text("/clusterCIDR")
        .split(',')
        .map(str::trim)
        .filter(|c| !c.is_empty())
        .map(String::from)
        .collect();
    let node_port_addresses = match at("/nodePortAddresses") {
        Value::Array(a) if !a.is_empty() => Value::Array(a),
        _ => Value::Null,
    };
    let c = args.compat.log_flush_frequency;
    json!({
        "Linux": {
            "Conntrack": {
                "MaxPerCore": at("/conntrack/maxPerCore"),
                "Min": at("/conntrack/min"),
                "TCPEstablishedTimeout": at("/conntrack/tcpEstablishedTimeout"),
                "TCPCloseWaitTimeout": at("/conntrack/tcpCloseWaitTimeout"),
                "TCPBeLiberal": at("/conntrack/tcpBeLiberal"),
                "UDPTimeout": at("/conntrack/udpTimeout"),
                "UDPStreamTimeout": at("/conntrack/udpStreamTimeout"),
            },
            "MasqueradeAll": at(&format!("{masquerade_section}/masqueradeAll")),
            "OOMScoreAdj": at("/oomScoreAdj"),
        },
        "Windows": {"RunAsService": false},
        "FeatureGates": match at("/featureGates") {
            Value::Null => json!({}),
            gates => gates,
        },
        "ClientConnection": {
            "Kubeconfig": at("/clientConnection/kubeconfig"),
            "AcceptContentTypes": at("/clientConnection/acceptContentTypes"),
            "ContentType": at("/clientConnection/contentType"),
            "QPS": at("/clientConnection/qps"),
            "Burst": at("/clientConnection/burst"),
        },
        "Logging": {
            "format": args.compat.logging_format,
            "flushFrequency": crate::config::GoDuration(c).to_string(),
            "verbosity": args.verbosity,
            "options": {
                "text": {"infoBufferSize": "0"},
                "json": {"infoBufferSize": "0"},
            },
        },
        "HostnameOverride": at("/hostnameOverride"),
        "BindAddress": at("/bindAddress"),
        "HealthzBindAddress": at("/healthzBindAddress"),
        "MetricsBindAddress": at("/metricsBindAddress"),
        "BindAddressHardFail": at("/bindAddressHardFail"),
        "EnableProfiling": at("/enableProfiling"),
        "ShowHiddenMetricsForVersion": at("/showHiddenMetricsForVersion"),
        "Mode": at("/mode"),
        "IPTables": {
            "MasqueradeBit": at("/iptables/masqueradeBit"),
            "LocalhostNodePorts": at("/iptables/localhostNodePorts"),
        },
        "IPVS": {
            "Scheduler": at("/ipvs/scheduler"),
            "ExcludeCIDRs": match at("/ipvs/excludeCIDRs") {
                Value::Array(a) if !a.is_empty() => Value::Array(a),
                _ => Value::Null,
            },
            "StrictARP": at("/ipvs/strictARP"),
            "TCPTimeout": at("/ipvs/tcpTimeout"),
            "TCPFinTimeout": at("/ipvs/tcpFinTimeout"),
            "UDPTimeout": at("/ipvs/udpTimeout"),
        },
        "Winkernel": {
            "NetworkName": at("/winkernel/networkName"),
            "SourceVip": at("/winkernel/sourceVip"),
            "EnableDSR": at("/winkernel/enableDSR"),
            "RootHnsEndpointName": at("/winkernel/rootHnsEndpointName"),
            "ForwardHealthCheckVip": at("/winkernel/forwardHealthCheckVip"),
        },
        "NFTables": {"MasqueradeBit": at("/nftables/masqueradeBit")},
        "DetectLocalMode": match text("/detectLocalMode").as_str() {
            "" => "ClusterCIDR".to_string(),
            m => m.to_string(),
        },
        "DetectLocal": {
            "BridgeInterface": at("/detectLocal/bridgeInterface"),
            "ClusterCIDRs": if cluster_cidrs.is_empty() { Value::Null } else { json!(cluster_cidrs) },
            "InterfaceNamePrefix": at("/detectLocal/interfaceNamePrefix"),
        },
        "NodePortAddresses": node_port_addresses,
        "SyncPeriod": at(&format!("{section}/syncPeriod")),
        "MinSyncPeriod": at(&format!("{section}/minSyncPeriod")),
        "ConfigSyncPeriod": at("/configSyncPeriod"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn args(flags: &[&str]) -> ProxyArgs {
        let mut all = vec!["kube-proxy-rs"];
        all.extend(flags);
        crate::cli::Cli::parse_from(all).proxy
    }

    #[test]
    fn the_effective_configuration_in_the_internal_types_shape() {
        let doc = document(&args(&[
            "--cluster-cidr=10.0.0.0/16,fd00::/48",
            "--iptables-sync-period=1h",
            "--hostname-override=k8s-master",
            "-v=2",
            "--logging-format=json",
        ]));
        assert_eq!(doc["Mode"], "iptables");
        assert_eq!(doc["SyncPeriod"], "1h0m0s");
        assert_eq!(doc["MinSyncPeriod"], "1s");
        assert_eq!(doc["ConfigSyncPeriod"], "15m0s");
        assert_eq!(doc["HostnameOverride"], "k8s-master");
        assert_eq!(doc["HealthzBindAddress"], "0.0.0.0:10256");
        assert_eq!(doc["MetricsBindAddress"], "127.0.0.1:10249");
        assert_eq!(doc["DetectLocalMode"], "ClusterCIDR");
        assert_eq!(
            doc["DetectLocal"]["ClusterCIDRs"],
            json!(["10.0.0.0/16", "fd00::/48"])
        );
        assert_eq!(doc["Linux"]["Conntrack"]["MaxPerCore"], 32768);
        assert_eq!(
            doc["Linux"]["Conntrack"]["TCPEstablishedTimeout"],
            "24h0m0s"
        );
        assert_eq!(doc["Linux"]["OOMScoreAdj"], -999);
        assert_eq!(doc["IPTables"]["MasqueradeBit"], 14);
        assert_eq!(doc["IPTables"]["LocalhostNodePorts"], true);
        assert_eq!(doc["NodePortAddresses"], Value::Null);
        assert_eq!(doc["Logging"]["format"], "json");
        assert_eq!(doc["Logging"]["verbosity"], 2);
        assert_eq!(doc["Logging"]["flushFrequency"], "5s");
        assert_eq!(doc["ClientConnection"]["QPS"], 5.0);
        assert!(doc.get("apiVersion").is_none() && doc.get("kind").is_none());

        let nft = document(&args(&["--proxy-mode=nftables", "--masquerade-all"]));
        assert_eq!(nft["Mode"], "nftables");
        assert_eq!(nft["Linux"]["MasqueradeAll"], true);
        assert_eq!(nft["SyncPeriod"], "30s");
    }
}
