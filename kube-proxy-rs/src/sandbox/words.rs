//! The words of the sandbox's report: what a request or a ping got, each with its meaning.
//!
//! [`WORDS`] is the one list: the legend the sandbox prints before its report
//! ([`legend`]) and the table in the README are both checked against it by a test, and the
//! report names outcomes only with these words ([`for_error`], the ping line), so a word can
//! neither appear unexplained nor mean different things in different modes. The same cause
//! gets the same word in every mode: a DROP reads `timed out` in iptables and nftables mode
//! alike, because the sandbox gives the node a route to every address it probes (without one,
//! the node's routing answers "no route" before iptables' filter table can drop the packet).

use kp_testkit::ClientError;

/// One word of the report and what it means. `word` is printed as is; a `…` in it stands for
/// a detail filled in at run time (a latency, an error text, an address, a reason).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Word {
    /// The word as the report prints it.
    pub word: &'static str,
    /// Its meaning, one sentence without a trailing full stop.
    pub meaning: &'static str,
}

/// A request refused at once.
pub const REFUSED: Word = Word {
    word: "refused",
    meaning: "the connection was refused at once (a TCP reset or an ICMP port unreachable): a REJECT rule, as for a Service without endpoints, or nothing listening on the backend's port",
};

/// A request without an answer within the timeout.
pub const TIMED_OUT: Word = Word {
    word: "timed out",
    meaning: "no answer within 1 s: a DROP rule, as for a client outside loadBalancerSourceRanges or a NodePort with externalTrafficPolicy: Local and no endpoint on this node",
};

/// An ICMP host or network unreachable.
pub const UNREACHABLE: Word = Word {
    word: "unreachable",
    meaning: "an ICMP host or network unreachable: no route to the address, or no neighbour answering ARP for it",
};

/// Userspace mode's answer when no endpoint takes the connection.
pub const RESET: Word = Word {
    word: "reset",
    meaning: "userspace mode: the proxy accepted the connection, found no endpoint that answered, and closed it; this is userspace mode's word for what the kernel modes answer refused (a Service without endpoints) or timed out (externalTrafficPolicy: Local without an endpoint on this node)",
};

/// A datagram the node's own rules refused to send.
pub const BLOCKED: Word = Word {
    word: "blocked by the node's own rules (EPERM)",
    meaning: "a request sent from the node that the node's own rules drop or reject: the send fails with EPERM, no packet leaves",
};

/// Any other error.
pub const FAILED: Word = Word {
    word: "failed (…)",
    meaning: "any other error, with the system's message",
};

/// Not probed at all.
pub const NOT_PROBED: Word = Word {
    word: "not probed: …",
    meaning: "a Service or address the sandbox does not send to, with the reason: headless and ExternalName Services (kube-proxy programs nothing for them), IPv6 addresses (the sandbox's network is IPv4), load-balancer IPs with ipMode: Proxy, SCTP ports",
};

/// A ping answered.
pub const PING_ANSWERED: Word = Word {
    word: "answered (…)",
    meaning: "ping: an echo reply, after this long; in IPVS mode the ClusterIP is an address of the node's kube-ipvs0 dummy link, so the node's kernel answers",
};

/// A ping without answer.
pub const PING_NO_ANSWER: Word = Word {
    word: "no answer",
    meaning: "ping: no reply within 1 s; in iptables and userspace mode a ClusterIP is no interface's address, only NAT rules for the Service's ports",
};

/// A ping rejected.
pub const PING_UNREACHABLE: Word = Word {
    word: "no answer (…: destination unreachable)",
    meaning: "ping: an ICMP destination unreachable from that address instead of a reply; nftables mode rejects traffic to a ClusterIP's other ports and protocols, as upstream's does",
};

/// Every word the report uses, in the legend's order.
pub const WORDS: &[Word] = &[
    REFUSED,
    TIMED_OUT,
    UNREACHABLE,
    RESET,
    BLOCKED,
    FAILED,
    NOT_PROBED,
    PING_ANSWERED,
    PING_NO_ANSWER,
    PING_UNREACHABLE,
];

/// `word` with its `…` placeholder replaced by `detail`; the word itself when it has none.
pub fn with_detail(word: Word, detail: &str) -> String {
    match word.word.split_once('…') {
        Some((head, tail)) => format!("{head}{detail}{tail}"),
        None => word.word.to_string(),
    }
}

/// The report's word for a failed request.
pub fn for_error(e: &ClientError) -> String {
    match e {
        ClientError::Refused => REFUSED.word.into(),
        ClientError::Timeout => TIMED_OUT.word.into(),
        ClientError::Unreachable => UNREACHABLE.word.into(),
        ClientError::Reset => RESET.word.into(),
        // A datagram from the node itself that the node's own rules drop or reject (e.g. UDP
        // to a Service without endpoints): `send` fails with EPERM, no ICMP involved.
        ClientError::Other(e) if e.raw_os_error() == Some(nix::errno::Errno::EPERM as i32) => {
            BLOCKED.word.into()
        }
        ClientError::Other(e) => with_detail(FAILED, &e.to_string()),
    }
}

/// Width of the legend's lines, in characters.
const LEGEND_WIDTH: usize = 100;

/// The legend printed before the report: `word: meaning` for every word, wrapped at
/// [`LEGEND_WIDTH`] columns, the first line indented by `indent` and the rest four more.
pub fn legend(indent: &str) -> String {
    let rest = format!("{indent}    ");
    let options = textwrap::Options::new(LEGEND_WIDTH)
        .initial_indent(indent)
        .subsequent_indent(&rest);
    let mut out = String::new();
    for w in WORDS {
        for line in textwrap::wrap(&format!("{}: {}", w.word, w.meaning), &options) {
            out.push_str(&line);
            out.push('\n');
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every word is in the legend and in the README's table with its meaning, and the
    /// report's outcomes are words of the table.
    #[test]
    fn every_word_is_in_the_legend_and_the_readme_with_its_meaning() {
        let readme = include_str!("../../../README.md");
        let legend = legend("  ");
        for w in WORDS {
            let flat = |t: &str| t.split_whitespace().collect::<Vec<_>>().join(" ");
            assert!(
                flat(&legend).contains(&flat(&format!("{}: {}", w.word, w.meaning))),
                "{:?} is not in the legend:\n{legend}",
                w.word
            );
            assert!(
                legend
                    .lines()
                    .any(|l| l.starts_with(&format!("  {}: ", w.word))),
                "{:?} does not start a line of the legend:\n{legend}",
                w.word
            );
            let row = format!("| `{}` | {} |", w.word, w.meaning);
            assert!(
                readme.contains(&row),
                "README.md lacks the row\n{row}\n(the sandbox's words table must match kube-proxy-rs/src/sandbox/words.rs)"
            );
        }
        let rows = readme
            .lines()
            .skip_while(|l| !l.starts_with("| word | meaning |"))
            .skip(2)
            .take_while(|l| l.starts_with("| `"))
            .count();
        assert_eq!(rows, WORDS.len(), "README's words table has extra rows");
        let eperm = std::io::Error::from_raw_os_error(nix::errno::Errno::EPERM as i32);
        let other = std::io::Error::from_raw_os_error(nix::errno::Errno::EIO as i32);
        for e in [
            ClientError::Refused,
            ClientError::Timeout,
            ClientError::Unreachable,
            ClientError::Reset,
            ClientError::Other(eperm),
        ] {
            let said = for_error(&e);
            assert!(WORDS.iter().any(|w| w.word == said), "{said:?}");
        }
        assert!(for_error(&ClientError::Other(other)).starts_with("failed ("));
    }

    #[test]
    fn details_fill_the_placeholder() {
        assert_eq!(with_detail(FAILED, "boom"), "failed (boom)");
        assert_eq!(
            with_detail(PING_UNREACHABLE, "192.168.56.10"),
            "no answer (192.168.56.10: destination unreachable)"
        );
        assert_eq!(with_detail(REFUSED, "x"), "refused");
        assert_eq!(with_detail(NOT_PROBED, "SCTP"), "not probed: SCTP");
    }
}
