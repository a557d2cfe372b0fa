//! Golden data: the bundled seed example and the check that a saved ruleset contains
//! expected lines in order.
//!
//! The seed (`examples/seed-nginx/`) is a real cluster's objects (`cluster.yaml`) and the
//! lines upstream kube-proxy printed for them in iptables mode on node `k8s-master` with
//! `--cluster-cidr 10.0.0.0/16` (`expected-iptables-save.txt`).

use std::collections::BTreeMap;

/// The seed cluster's objects, as `kubectl get -o yaml` prints them.
pub const SEED_CLUSTER: &str = include_str!("../../../examples/seed-nginx/cluster.yaml");

/// Lines `iptables-save` printed on the seed's node after upstream kube-proxy programmed it.
pub const SEED_EXPECTED_IPTABLES: &str =
    include_str!("../../../examples/seed-nginx/expected-iptables-save.txt");

/// [`rule_lines`] of [`SEED_EXPECTED_IPTABLES`] in the order kube-proxy leaves them on a node
/// where it creates the jumps to `KUBE-FIREWALL` itself (kubelet 1.28 and later no longer
/// does): first in filter `INPUT` and `OUTPUT`, as upstream's prepend of kubelet's jump
/// chains after its own leaves them. On the seed's node an older kubelet had created them
/// before kube-proxy's first sync, so they are last there; kube-proxy-rs moves such a jump
/// above its own (the localnet drop of CVE-2020-8558 must come before the health-check
/// ACCEPTs and NodePort REJECTs).
pub fn seed_expected_lines() -> Vec<(String, String)> {
    let mut lines = rule_lines(SEED_EXPECTED_IPTABLES);
    for chain in ["INPUT", "OUTPUT"] {
        let jump = format!("-A {chain} -j KUBE-FIREWALL");
        let first_of_chain =
            |l: &(String, String)| l.0 == "filter" && l.1.starts_with(&format!("-A {chain} "));
        if let Some(at) = lines.iter().position(|l| l.0 == "filter" && l.1 == jump) {
            let moved = lines.remove(at);
            let to = lines.iter().position(first_of_chain).unwrap_or(at);
            lines.insert(to, moved);
        }
    }
    lines
}

/// The `-A` lines of an `iptables-save` text, each with the table it belongs to.
pub fn rule_lines(save: &str) -> Vec<(String, String)> {
    let mut table = String::new();
    let mut out = Vec::new();
    for line in save.lines() {
        if let Some(t) = line.strip_prefix('*') {
            table = t.to_string();
        } else if line.starts_with("-A ") {
            out.push((table.clone(), line.to_string()));
        }
    }
    out
}

/// Panics unless every `expected` `(table, line)` is in `saved` (an `iptables-save` text),
/// with the lines of each chain in the same relative order. The message shows what is
/// missing and the whole saved text.
pub fn assert_contains_in_chain_order(saved: &str, expected: &[(String, String)]) {
    let lines = rule_lines(saved);
    let mut last: BTreeMap<(String, String), usize> = BTreeMap::new();
    for (t, line) in expected {
        let pos = lines
            .iter()
            .position(|(lt, l)| lt == t && l == line)
            .unwrap_or_else(|| panic!("missing in *{t}: {line}\n--- iptables-save ---\n{saved}"));
        let chain = line
            .split_whitespace()
            .nth(1)
            .unwrap_or_default()
            .to_string();
        if let Some(prev) = last.insert((t.clone(), chain.clone()), pos) {
            assert!(
                pos > prev,
                "out of order in *{t} {chain}: {line}\n--- iptables-save ---\n{saved}"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seed_lines_parse() {
        let lines = rule_lines(SEED_EXPECTED_IPTABLES);
        assert_eq!(lines.iter().filter(|(t, _)| t == "nat").count(), 15);
        assert_eq!(lines.iter().filter(|(t, _)| t == "filter").count(), 15);
        assert_contains_in_chain_order(SEED_EXPECTED_IPTABLES, &lines);
        // The same lines, the KUBE-FIREWALL jumps first in INPUT and OUTPUT.
        let ours = seed_expected_lines();
        let mut sorted_ours = ours.clone();
        let mut sorted = lines.clone();
        sorted_ours.sort();
        sorted.sort();
        assert_eq!(sorted_ours, sorted);
        for chain in ["INPUT", "OUTPUT"] {
            let first = ours
                .iter()
                .find(|(t, l)| t == "filter" && l.starts_with(&format!("-A {chain} ")))
                .unwrap();
            assert_eq!(first.1, format!("-A {chain} -j KUBE-FIREWALL"));
        }
    }

    #[test]
    #[should_panic(expected = "out of order")]
    fn order_is_checked() {
        let saved = "*nat\n-A X -j A\n-A X -j B\n";
        let expected = vec![
            ("nat".to_string(), "-A X -j B".to_string()),
            ("nat".to_string(), "-A X -j A".to_string()),
        ];
        assert_contains_in_chain_order(saved, &expected);
    }
}
