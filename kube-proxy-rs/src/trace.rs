//! `kube-proxy-rs trace`: where does this packet go, and why?
//!
//! Loads iptables rules (a dump file, standard input, or this node's live rules), completes a
//! partial dump if needed, and runs the packet through [`kp_trace`]; prints the path for an
//! operator or JSON for tools.

use std::io::Read as _;
use std::net::IpAddr;

use anyhow::{Context, anyhow, bail};
use kp_netfilter::{Backend, ExecIptables, IpVersion, Iptables, complete_partial_save, parse_save};
use kp_proxier::{Host as _, RealHost};
use kp_trace::{Entry, Host, Packet, render_text, trace};

use crate::cli::{TraceArgs, TraceFrom, TraceProto};

/// The comment of upstream's (and our) localnet guard rule; its presence in a dump means
/// the node runs with `route_localnet=1`.
const LOCALNET_GUARD: &str = "block incoming localnet connections";

fn read_rules(args: &TraceArgs, version: IpVersion) -> anyhow::Result<String> {
    if args.live {
        return ExecIptables::new(version, Backend::Default)
            .save(None)
            .map_err(|e| anyhow!("reading this node's rules: {e}"));
    }
    let path = args
        .rules
        .as_ref()
        .ok_or_else(|| anyhow!("pass --rules FILE or --live"))?;
    if path.as_os_str() == "-" {
        let mut s = String::new();
        std::io::stdin()
            .read_to_string(&mut s)
            .context("reading rules from standard input")?;
        Ok(s)
    } else {
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))
    }
}

/// Runs `trace`.
///
/// # Errors
/// Unreadable or unparsable rules, inconsistent addresses, a missing --src for a pod.
pub fn run(args: TraceArgs) -> anyhow::Result<()> {
    let version = match args.dst {
        IpAddr::V4(_) => IpVersion::V4,
        IpAddr::V6(_) => IpVersion::V6,
    };
    let text = read_rules(&args, version)?;
    let rules = match parse_save(&text) {
        Ok(r) => r,
        Err(first) => {
            let (completed, added) = complete_partial_save(&text)
                .map_err(|e| anyhow!("the rules do not parse: {first}; as a partial dump: {e}"))?;
            let r = parse_save(&completed).map_err(|e| anyhow!("the rules do not parse: {e}"))?;
            eprintln!("note: the dump was partial; {added} chain declaration(s) were assumed");
            r
        }
    };

    let mut local: Vec<IpAddr> = args.node_ip.clone();
    if args.live {
        local.extend(
            RealHost
                .local_addresses()
                .context("reading this node's addresses")?,
        );
    }
    let mut host = Host::new(local.iter().copied());
    host.route_localnet = match (args.route_localnet, args.live) {
        (Some(v), _) => v,
        (None, true) => {
            RealHost
                .get_sysctl("net/ipv4/conf/all/route_localnet")
                .as_deref()
                == Some("1")
        }
        (None, false) => text.contains(LOCALNET_GUARD),
    };
    let ipsets = match (&args.ipsets, args.live) {
        (Some(p), _) => {
            Some(std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?)
        }
        (None, true) => std::process::Command::new("ipset")
            .arg("save")
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned()),
        (None, false) => None,
    };
    if let Some(text) = ipsets {
        host.load_ipset_save(&text)
            .map_err(|e| anyhow!("ipsets: {e}"))?;
    }

    let same_family = |ip: &IpAddr| ip.is_ipv4() == args.dst.is_ipv4();
    let src = match (args.src, args.from) {
        (Some(s), _) => s,
        (None, TraceFrom::Pod) => bail!("--from pod needs --src (the pod's IP address)"),
        (None, TraceFrom::External) => {
            if args.dst.is_ipv4() {
                "203.0.113.1".parse()?
            } else {
                "2001:db8::1".parse()?
            }
        }
        (None, TraceFrom::Node) => local
            .iter()
            .copied()
            .find(|ip| same_family(ip) && !ip.is_loopback())
            .unwrap_or(if args.dst.is_ipv4() {
                "127.0.0.1".parse()?
            } else {
                "::1".parse()?
            }),
    };
    if !same_family(&src) {
        bail!(
            "--src {src} and --dst {} are of different IP families",
            args.dst
        );
    }
    let entry = match args.from {
        TraceFrom::Pod => Entry::Pod {
            iface: args.iface.clone(),
        },
        TraceFrom::External => Entry::External {
            iface: args.iface.clone().or_else(|| Some("eth0".to_string())),
        },
        TraceFrom::Node => Entry::Node,
    };
    let packet = match args.proto {
        TraceProto::Icmp => Packet::ping(src, args.dst, entry),
        proto => {
            let dport = args
                .dport
                .ok_or_else(|| anyhow!("--dport is required for {proto:?}"))?;
            let mut p = Packet::tcp(src, args.sport, args.dst, dport, entry);
            p.proto = match proto {
                TraceProto::Udp => kp_trace::Proto::Udp,
                TraceProto::Sctp => kp_trace::Proto::Sctp,
                _ => kp_trace::Proto::Tcp,
            };
            p
        }
    };
    let result = trace(&rules, &host, &packet).map_err(|e| anyhow!("{e}"))?;
    if args.json {
        println!("{}", result.to_json().map_err(|e| anyhow!("{e}"))?);
    } else {
        let text = render_text(&result, &packet);
        print!("{text}");
        if !text.ends_with('\n') {
            println!();
        }
    }
    Ok(())
}
