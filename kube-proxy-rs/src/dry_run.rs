//! What `--dry-run` prints: one section per family and input, each under a header line
//! `# IPv4: <what>` (which `trace --rules` finds it by), followed by `#` lines that say what
//! the payload needs to load as the daemon loads it.
//!
//! iptables-restore input is exactly what the daemon gives `iptables-restore --noflush` on a
//! node without our rules, and is for that command only, as the header says: it inserts
//! kube-proxy's jumps into the built-in chains (`-I INPUT 1 ...`), and a table can have
//! several `*table ... COMMIT` blocks, consecutive transactions of one restore (the
//! `KUBE-PROXY-CANARY` chains after the rules; on the nf_tables backend a large nat table in
//! parts, docs/iptables.md). Without `--noflush` every block replaces its whole table: a
//! second `*nat` block would wipe what the first loaded, and the tables' other rules (kubelet's,
//! a CNI plugin's) would go. One block per table is not printed because that is not what the
//! daemon sends: on nf_tables, one transaction of a large nat table takes minutes to load.
//!
//! Rules with `-m nfacct --nfacct-name NAME` need the nfacct counter NAME, which the daemon
//! creates (as upstream) before it writes them and a restore does not: the header names the
//! counters and the command that creates them.

use kp_model::IpFamily;

/// The header of a family's IPVS table in IPVS mode's dry run (after `# IPv4`).
pub const IPVS_TABLE_HEADER: &str = ": IPVS table (ipvsadm -S -n)";

/// The header of a family's ipset payload in IPVS mode's dry run (after `# IPv4`).
pub const IPSET_HEADER: &str = ": ipset restore input";

/// The nfacct counters `payload`'s rules name (`--nfacct-name NAME`), sorted, each once.
pub fn nfacct_counters(payload: &str) -> Vec<String> {
    let mut names: Vec<String> = payload
        .lines()
        .filter_map(|l| {
            let mut words = l.split_whitespace();
            words.find(|w| *w == "--nfacct-name")?;
            words.next().map(str::to_string)
        })
        .collect();
    names.sort();
    names.dedup();
    names
}

/// A family's iptables-restore section: its header (`# IPv4: iptables-restore input`), the
/// lines saying it is for `--noflush` and which nfacct counters it needs, and the payload as
/// the daemon writes it.
pub fn iptables_section(family: IpFamily, payload: &str) -> String {
    let tool = match family {
        IpFamily::V4 => "iptables-restore",
        IpFamily::V6 => "ip6tables-restore",
    };
    let mut out = format!(
        "# {family}: {tool} input\n\
         # for `{tool} --noflush` only, the daemon's command: each *table block is a \
         transaction (a table can have several), and the jumps are inserted into the built-in \
         chains; without --noflush every block would replace its whole table, the earlier \
         blocks' rules and other software's included\n"
    );
    let counters = nfacct_counters(payload);
    if !counters.is_empty() {
        let adds: Vec<String> = counters.iter().map(|c| format!("nfacct add {c}")).collect();
        out.push_str(&format!(
            "# needs the nfacct counter(s) {}, which the daemon creates before its first \
             full sync and a restore does not (without them it fails): {}\n",
            counters.join(", "),
            adds.join("; ")
        ));
    }
    out.push_str(payload);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_header_names_noflush_and_the_nfacct_counters() {
        let payload = "*filter\n:KUBE-FORWARD - [0:0]\n-A KUBE-FORWARD -m conntrack --ctstate INVALID -m nfacct --nfacct-name ct_state_invalid_dropped_pkts -j DROP\nCOMMIT\n";
        let s = iptables_section(IpFamily::V4, payload);
        assert!(s.starts_with("# IPv4: iptables-restore input\n"), "{s}");
        assert!(s.contains("`iptables-restore --noflush` only"), "{s}");
        assert!(
            s.ends_with(payload),
            "the payload as the daemon writes it: {s}"
        );
        assert!(
            s.contains("nfacct add ct_state_invalid_dropped_pkts"),
            "{s}"
        );
        let plain = iptables_section(IpFamily::V6, "*nat\nCOMMIT\n");
        assert!(plain.starts_with("# IPv6: ip6tables-restore input\n"));
        assert!(!plain.contains("nfacct"), "{plain}");
    }
}
