//! Which iptables backend this node uses: [`detect_backend`], the choice behind
//! `--iptables-backend auto`.
//!
//! The two iptables backends (`iptables-nft`, which programs nf_tables, and `iptables-legacy`,
//! the kernel's older xtables) are separate rule sets: a rule written with one is not seen by
//! the other, and both are applied to every packet. A proxy must write its rules with the
//! backend the node's other components (kubelet, the CNI plugin, the firewall) use, or it
//! writes a second copy next to whatever the replaced kube-proxy left in the other one.
//!
//! Upstream's kube-proxy image does not choose itself: its `iptables` is
//! kubernetes-sigs/iptables-wrappers, which at its first run looks at the node and points the
//! `iptables*` links at one backend. [`detect_backend`] makes the same choice, in the same
//! order of checks:
//!
//! 1. kubelet's chains: kubelet (1.17 and later) creates `KUBE-KUBELET-CANARY`, and 1.24 and
//!    later `KUBE-IPTABLES-HINT`, in the mangle table of the backend it uses. They are looked
//!    for in `iptables-nft-save -t mangle` and `ip6tables-nft-save -t mangle` first, then in
//!    the whole of `iptables-legacy-save` and `ip6tables-legacy-save` (the wrapper's order).
//! 2. Without them, the backend that holds more rules (lines starting with `-` in
//!    `iptables-save` and `ip6tables-save` of each backend) wins; legacy only when it holds
//!    strictly more, as the wrapper's last shell version did.
//! 3. Otherwise (no rules at all, or as many in each) nf_tables, the wrapper's default.
//!
//! Only reading commands run, and none that names a legacy table: `iptables-legacy-save
//! -t mangle` (or any `iptables-legacy -t TABLE`) makes the kernel create that table when it
//! did not exist, after which every `iptables-nft-save` on the node prints `# Warning:
//! iptables-legacy tables present`. `iptables-legacy-save` without `-t` lists only the tables
//! that exist, and `iptables-nft-save -t mangle` creates nothing. Outputs are read as they are
//! printed (never held whole), so detection costs no memory on a node with 100,000 rules.
//!
//! A backend whose binaries are missing is not a candidate; errors of the reading commands
//! are kept as notes (the wrapper ignores them) and the detection goes on with what it could
//! read.

use std::fmt;
use std::sync::Arc;

use super::ir::IpVersion;
use super::ir::Table;
use super::runner::{Backend, Exec, ExecIptables, Iptables as _, SystemExec};
use crate::error::Error;

/// kubelet's chains that say which backend kubelet uses: `KUBE-IPTABLES-HINT` (kubelet 1.24
/// and later, created for exactly this purpose) and `KUBE-KUBELET-CANARY` (1.17 and later).
/// Both are kubelet's; kube-proxy-rs never writes or removes them.
pub const KUBELET_HINT_CHAINS: [&str; 2] = ["KUBE-IPTABLES-HINT", "KUBE-KUBELET-CANARY"];

/// Why [`detect_backend`] chose its backend.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DetectReason {
    /// One of [`KUBELET_HINT_CHAINS`] is in the chosen backend's tables of this family
    /// (looked for in its mangle table for iptables-nft, in every table for iptables-legacy).
    KubeletChain {
        /// The chain found.
        chain: &'static str,
        /// The table it is in.
        table: Table,
        /// Where: `iptables-*` (V4) or `ip6tables-*` (V6).
        ip_version: IpVersion,
    },
    /// No kubelet chain in either backend; the rule counts (lines starting with `-` in the
    /// IPv4 and IPv6 `*-save` output of each backend) decided: legacy when it holds more,
    /// else nf_tables.
    RuleCount {
        /// Rules in `iptables-legacy-save` plus `ip6tables-legacy-save`.
        legacy: usize,
        /// Rules in `iptables-nft-save` plus `ip6tables-nft-save`.
        nft: usize,
    },
    /// The other backend's binaries (`iptables-nft` or `iptables-legacy`) are not installed.
    OnlyInstalled,
    /// Neither `iptables-nft` nor `iptables-legacy` is installed: `iptables` as found on
    /// `PATH` (iptables older than 1.8 has no backends).
    NeitherInstalled,
}

/// The result of [`detect_backend`]: the backend to run ([`Backend::Nft`] or
/// [`Backend::Legacy`]; [`Backend::Default`] only when neither is installed), why, and the
/// commands that failed on the way.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackendChoice {
    /// The backend chosen.
    pub backend: Backend,
    /// Why.
    pub reason: DetectReason,
    /// Reading commands that failed (command line and error), in the order they ran. The
    /// detection goes on without what they would have shown.
    pub errors: Vec<String>,
}

impl BackendChoice {
    /// The backend whose leftovers a proxy using this choice should remove: the other of
    /// [`Backend::Nft`] and [`Backend::Legacy`], `None` for [`Backend::Default`].
    pub fn other(&self) -> Option<Backend> {
        self.backend.other()
    }
}

impl fmt::Display for BackendChoice {
    /// One sentence: why this backend, e.g. "kubelet's KUBE-IPTABLES-HINT chain is in the
    /// mangle table of iptables-legacy".
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let chains = KUBELET_HINT_CHAINS.join(" or ");
        match &self.reason {
            DetectReason::KubeletChain {
                chain,
                table,
                ip_version,
            } => {
                let family = match ip_version {
                    IpVersion::V4 => "iptables",
                    IpVersion::V6 => "ip6tables",
                };
                let backend = match self.backend {
                    Backend::Legacy => "legacy",
                    _ => "nft",
                };
                write!(
                    f,
                    "kubelet's {chain} chain is in the {table} table of {family}-{backend}"
                )
            }
            DetectReason::RuleCount { legacy, nft } if legacy > nft => write!(
                f,
                "no kubelet chain ({chains}) in either backend, and iptables-legacy holds more \
                 rules ({legacy}, against {nft} in iptables-nft)"
            ),
            DetectReason::RuleCount { legacy, nft } if legacy == nft => write!(
                f,
                "no kubelet chain ({chains}) in either backend, and neither holds more rules \
                 ({nft} each): nf_tables, the default"
            ),
            DetectReason::RuleCount { legacy, nft } => write!(
                f,
                "no kubelet chain ({chains}) in either backend, and iptables-nft holds more \
                 rules ({nft}, against {legacy} in iptables-legacy)"
            ),
            DetectReason::OnlyInstalled => {
                let missing = match self.backend {
                    Backend::Legacy => "iptables-nft",
                    _ => "iptables-legacy",
                };
                write!(f, "{missing} is not installed")
            }
            DetectReason::NeitherInstalled => write!(
                f,
                "neither iptables-nft nor iptables-legacy is installed: running iptables as \
                 found on PATH"
            ),
        }
    }
}

/// [`detect_backend_with`] running the real binaries.
pub fn detect_backend() -> BackendChoice {
    detect_backend_with(Arc::new(SystemExec::new()))
}

/// Chooses the backend as described in the [module docs](self), running every command
/// through `exec` (an `ip netns exec` prefix in tests, a [`super::ScriptedExec`] in unit
/// tests). Never fails: what cannot be read counts as empty, with the error in
/// [`BackendChoice::errors`].
pub fn detect_backend_with(exec: Arc<dyn Exec>) -> BackendChoice {
    let runner = |v, b| ExecIptables::with_exec(v, b, exec.clone());
    let mut errors = Vec::new();
    let installed = |b, errors: &mut Vec<String>| match runner(IpVersion::V4, b).version() {
        Ok(_) => true,
        Err(Error::BinaryNotFound { .. }) => false,
        // Present but odd (a wrapper, an unparsable version): still a candidate.
        Err(e) => {
            errors.push(e.to_string());
            true
        }
    };
    let (nft, legacy) = (
        installed(Backend::Nft, &mut errors),
        installed(Backend::Legacy, &mut errors),
    );
    let choice = |backend, reason, errors| BackendChoice {
        backend,
        reason,
        errors,
    };
    match (nft, legacy) {
        (false, false) => return choice(Backend::Default, DetectReason::NeitherInstalled, errors),
        (true, false) => return choice(Backend::Nft, DetectReason::OnlyInstalled, errors),
        (false, true) => return choice(Backend::Legacy, DetectReason::OnlyInstalled, errors),
        (true, true) => {}
    }
    let families = [IpVersion::V4, IpVersion::V6];
    // 1a. kubelet's chains in nf_tables' mangle tables.
    for v in families {
        let scan = read(&runner(v, Backend::Nft), Some(Table::Mangle), &mut errors);
        if let Some((chain, table)) = scan.hint {
            let reason = DetectReason::KubeletChain {
                chain,
                table,
                ip_version: v,
            };
            return choice(Backend::Nft, reason, errors);
        }
    }
    // 1b. In the whole legacy ruleset (naming a table would create it), counting its rules.
    let mut legacy_rules = 0;
    for v in families {
        let scan = read(&runner(v, Backend::Legacy), None, &mut errors);
        if let Some((chain, table)) = scan.hint {
            let reason = DetectReason::KubeletChain {
                chain,
                table,
                ip_version: v,
            };
            return choice(Backend::Legacy, reason, errors);
        }
        legacy_rules += scan.rules;
    }
    // 2. The backend with more rules; nf_tables when neither has more.
    let nft_rules: usize = families
        .iter()
        .map(|v| read(&runner(*v, Backend::Nft), None, &mut errors).rules)
        .sum();
    let backend = if legacy_rules > nft_rules {
        Backend::Legacy
    } else {
        Backend::Nft
    };
    let reason = DetectReason::RuleCount {
        legacy: legacy_rules,
        nft: nft_rules,
    };
    choice(backend, reason, errors)
}

/// What one `*-save` run showed.
#[derive(Debug, Default)]
struct Scan {
    /// The first of [`KUBELET_HINT_CHAINS`] declared in it, and its table.
    hint: Option<(&'static str, Table)>,
    /// Its rules: lines starting with `-`.
    rules: usize,
}

/// Reads `ipt`'s `*-save [-t table]` as it is printed. A missing IPv6 binary reads as empty
/// without a note (IPv4-only images); any other failure is noted in `errors`.
fn read(ipt: &ExecIptables, table: Option<Table>, errors: &mut Vec<String>) -> Scan {
    let mut scan = Scan::default();
    let mut current = table.unwrap_or(Table::Filter);
    let result = ipt.save_with(table, &mut |r| {
        let mut line = String::new();
        while r.read_line(&mut line)? > 0 {
            if line.starts_with('-') {
                scan.rules += 1;
            } else if let Some(name) = line.strip_prefix('*') {
                current = Table::from_name(name.trim()).unwrap_or(current);
            } else if scan.hint.is_none()
                && let Some(rest) = line.strip_prefix(':')
            {
                let name = rest.split_whitespace().next().unwrap_or_default();
                scan.hint = KUBELET_HINT_CHAINS
                    .iter()
                    .copied()
                    .find(|c| *c == name)
                    .map(|c| (c, current));
            }
            line.clear();
        }
        Ok(())
    });
    match result {
        Ok(()) | Err(Error::BinaryNotFound { .. }) => {}
        Err(e) => errors.push(e.to_string()),
    }
    scan
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::iptables::runner::{ExecOutput, ScriptedExec};

    /// An exec where `iptables-nft*` and `iptables-legacy*` answer `--version`, and each
    /// `*-save` prints what `saves` holds for its argv (joined with spaces), else nothing.
    fn node(saves: &'static [(&'static str, &'static str)]) -> Arc<ScriptedExec> {
        Arc::new(ScriptedExec::new(move |argv, _| {
            let line = argv.join(" ");
            if line.ends_with("--version") {
                let backend = if argv[0].contains("legacy") {
                    "legacy"
                } else {
                    "nf_tables"
                };
                return ExecOutput::ok(format!("iptables v1.8.9 ({backend})\n"));
            }
            let out = saves
                .iter()
                .find(|(cmd, _)| *cmd == line)
                .map(|(_, text)| *text)
                .unwrap_or("");
            ExecOutput::ok(out)
        }))
    }

    fn argvs(exec: &ScriptedExec) -> Vec<String> {
        exec.calls().iter().map(|c| c.argv.join(" ")).collect()
    }

    const HINT: &str = "*mangle\n:PREROUTING ACCEPT [0:0]\n:KUBE-IPTABLES-HINT - [0:0]\nCOMMIT\n";
    const CANARY: &str = "*filter\n:INPUT ACCEPT [0:0]\n:KUBE-KUBELET-CANARY - [0:0]\n\
                          -A INPUT -j ACCEPT\nCOMMIT\n";

    #[test]
    fn the_hint_in_nft_mangle_wins_and_legacy_is_not_read() {
        let exec = node(&[("iptables-nft-save -t mangle", HINT)]);
        let c = detect_backend_with(exec.clone());
        assert_eq!(c.backend, Backend::Nft);
        assert_eq!(
            c.reason,
            DetectReason::KubeletChain {
                chain: "KUBE-IPTABLES-HINT",
                table: Table::Mangle,
                ip_version: IpVersion::V4
            }
        );
        assert_eq!(
            c.to_string(),
            "kubelet's KUBE-IPTABLES-HINT chain is in the mangle table of iptables-nft"
        );
        assert_eq!(
            argvs(&exec),
            [
                "iptables-nft --version",
                "iptables-legacy --version",
                "iptables-nft-save -t mangle"
            ]
        );
        assert_eq!(c.other(), Some(Backend::Legacy));
    }

    #[test]
    fn the_legacy_hint_is_looked_for_in_the_whole_save_never_naming_a_table() {
        // IPv6 only, and KUBE-KUBELET-CANARY (kubelet 1.17-1.23) in filter.
        let exec = node(&[("ip6tables-legacy-save", CANARY)]);
        let c = detect_backend_with(exec.clone());
        assert_eq!(c.backend, Backend::Legacy);
        assert_eq!(
            c.to_string(),
            "kubelet's KUBE-KUBELET-CANARY chain is in the filter table of ip6tables-legacy"
        );
        let calls = argvs(&exec);
        assert_eq!(
            calls[2..],
            [
                "iptables-nft-save -t mangle",
                "ip6tables-nft-save -t mangle",
                "iptables-legacy-save",
                "ip6tables-legacy-save"
            ]
        );
        assert!(
            !calls
                .iter()
                .any(|c| c.starts_with("iptables-legacy") && c.contains(" -t ")
                    || c.starts_with("ip6tables-legacy") && c.contains(" -t ")),
            "{calls:?}"
        );
    }

    #[test]
    fn without_a_hint_the_backend_with_more_rules_wins_and_nft_on_a_tie() {
        const THREE: &str = "*nat\n:POSTROUTING ACCEPT [0:0]\n-A POSTROUTING -j MASQUERADE\n\
                             -A POSTROUTING -j RETURN\nCOMMIT\n*filter\n-A INPUT -j ACCEPT\nCOMMIT\n";
        const ONE: &str = "*filter\n:INPUT ACCEPT [0:0]\n-A INPUT -j DROP\nCOMMIT\n";
        let c = detect_backend_with(node(&[
            ("iptables-legacy-save", THREE),
            ("iptables-nft-save", ONE),
            ("ip6tables-nft-save", ONE),
        ]));
        assert_eq!(c.backend, Backend::Legacy);
        assert_eq!(c.reason, DetectReason::RuleCount { legacy: 3, nft: 2 });
        assert!(
            c.to_string()
                .contains("iptables-legacy holds more rules (3, against 2")
        );

        let c = detect_backend_with(node(&[
            ("iptables-legacy-save", ONE),
            ("ip6tables-nft-save", THREE),
        ]));
        assert_eq!(c.backend, Backend::Nft);
        assert_eq!(c.reason, DetectReason::RuleCount { legacy: 1, nft: 3 });

        let c = detect_backend_with(node(&[
            ("iptables-legacy-save", ONE),
            ("iptables-nft-save", ONE),
        ]));
        assert_eq!(c.backend, Backend::Nft);
        assert!(
            c.to_string().contains("neither holds more rules (1 each)"),
            "{c}"
        );

        // Nothing anywhere: nf_tables, iptables-wrapper's default.
        let c = detect_backend_with(node(&[]));
        assert_eq!(c.backend, Backend::Nft);
        assert_eq!(c.reason, DetectReason::RuleCount { legacy: 0, nft: 0 });
        assert!(c.errors.is_empty(), "{:?}", c.errors);
    }

    #[test]
    fn a_missing_backend_is_no_candidate_and_failures_are_noted() {
        // A binary that runs but fails (not a missing one) stays a candidate, with the
        // failure noted; so does a save that fails.
        let c = detect_backend_with(Arc::new(ScriptedExec::new(|argv, _| {
            if argv[0] == "iptables-nft" || argv[0] == "ip6tables-legacy-save" {
                return ExecOutput::failed(4, "Another app is currently holding the xtables lock.");
            }
            ExecOutput::ok("iptables v1.8.9 (legacy)\n")
        })));
        assert_eq!(c.backend, Backend::Nft);
        assert_eq!(c.errors.len(), 2, "{:?}", c.errors);
        assert!(
            c.errors[0].contains("`iptables-nft --version` failed"),
            "{:?}",
            c.errors
        );
        assert!(
            c.errors[1].contains("`ip6tables-legacy-save` failed"),
            "{:?}",
            c.errors
        );

        struct Missing(&'static str);
        impl Exec for Missing {
            fn run(&self, argv: &[String], _: Option<&[u8]>) -> Result<ExecOutput, Error> {
                if argv[0].contains(self.0) {
                    return Err(Error::BinaryNotFound {
                        binary: argv[0].clone(),
                        command: argv.join(" "),
                    });
                }
                Ok(ExecOutput::ok(if argv.last().unwrap() == "--version" {
                    "iptables v1.8.9 (legacy)\n"
                } else {
                    ""
                }))
            }
        }
        let c = detect_backend_with(Arc::new(Missing("nft")));
        assert_eq!(
            (c.backend, &c.reason),
            (Backend::Legacy, &DetectReason::OnlyInstalled)
        );
        assert_eq!(c.to_string(), "iptables-nft is not installed");
        let c = detect_backend_with(Arc::new(Missing("legacy")));
        assert_eq!(c.backend, Backend::Nft);
        assert_eq!(c.to_string(), "iptables-legacy is not installed");
        let c = detect_backend_with(Arc::new(Missing("tables")));
        assert_eq!(
            (c.backend, &c.reason),
            (Backend::Default, &DetectReason::NeitherInstalled)
        );
        assert_eq!(c.other(), None);
    }
}
