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
