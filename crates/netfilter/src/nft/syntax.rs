//! Small pieces of nft syntax: family names, quoted strings, standard chain priorities and
//! the duration format `nft list` prints.

use std::time::Duration;

use crate::iptables::IpVersion;

/// Longest comment nftables accepts, in bytes (the limit knftables enforces too).
pub const COMMENT_MAX: usize = 128;

/// The nft family of an IP version: `ip` or `ip6`.
pub fn family_name(family: IpVersion) -> &'static str {
    match family {
        IpVersion::V4 => "ip",
        IpVersion::V6 => "ip6",
    }
}

/// `text` as an nft quoted string (`"text"`), for comments and interface names.
///
/// nft has no escape sequences inside quotes, so a `"` would end the string and a newline
/// would end the command: both (and every other control character) are replaced, `"` by `'`
/// and control characters by a space. Names coming from the model never contain them; this
/// keeps the payload well-formed whatever the input. Comments longer than [`COMMENT_MAX`]
/// bytes are rejected by the kernel, so the text is cut there (at a character boundary).
pub fn quote(text: &str) -> String {
    let mut out = String::with_capacity(text.len().min(COMMENT_MAX) + 2);
    out.push('"');
    let mut len = 0;
    for c in text.chars() {
        let c = match c {
            '"' => '\'',
            c if c.is_control() => ' ',
            c => c,
        };
        if len + c.len_utf8() > COMMENT_MAX {
            break;
        }
        len += c.len_utf8();
        out.push(c);
    }
    out.push('"');
    out
}

/// The numeric value of a chain priority as `nft list` prints it or a ruleset writes it:
/// a number (`-110`), a standard name (`raw` -300, `mangle` -150, `dstnat` -100, `filter` 0,
/// `security` 50, `srcnat` 100, the values of the `ip`, `ip6` and `inet` families), or a name
/// plus or minus a number (`dstnat - 10`). `None` when not understood.
pub fn priority_value(text: &str) -> Option<i32> {
    let words: Vec<&str> = text.split_whitespace().collect();
    let base = |w: &str| -> Option<i32> {
        match w {
            "raw" => Some(-300),
            "mangle" => Some(-150),
            "dstnat" => Some(-100),
            "filter" => Some(0),
            "security" => Some(50),
            "srcnat" => Some(100),
            n => n.parse().ok(),
        }
    };
    match words.as_slice() {
        [one] => {
            // `dstnat-10` (no spaces) is accepted by nft too.
            if let Some(v) = base(one) {
                return Some(v);
            }
            let split = one
                .char_indices()
                .skip(1)
                .find(|(_, c)| matches!(c, '+' | '-'))
                .map(|(i, _)| i)?;
            let (name, rest) = one.split_at(split);
            let offset: i32 = rest[1..].parse().ok()?;
            let b = base(name)?;
            if rest.starts_with('-') {
                b.checked_sub(offset)
            } else {
                b.checked_add(offset)
            }
        }
        [name, op, n] => {
            let b = base(name)?;
            let offset: i32 = n.parse().ok()?;
            match *op {
                "-" => b.checked_sub(offset),
                "+" => b.checked_add(offset),
                _ => None,
            }
        }
        _ => None,
    }
}

/// Parses a duration as `nft list` prints set timeouts: `3h`, `10m`, `1h30m30s`, `1d`,
/// `500ms`, or a bare number of seconds. `None` when not understood.
pub fn parse_nft_duration(text: &str) -> Option<Duration> {
    let s = text.trim();
    if s.is_empty() {
        return None;
    }
    if let Ok(secs) = s.parse::<u64>() {
        return Some(Duration::from_secs(secs));
    }
    let mut total = Duration::ZERO;
    let mut rest = s;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        if digits == 0 {
            return None;
        }
        let n: u64 = rest[..digits].parse().ok()?;
        rest = &rest[digits..];
        let (unit, len) = if rest.starts_with("ms") {
            (Duration::from_millis(1), 2)
        } else {
            match rest.chars().next()? {
                'd' => (Duration::from_secs(86400), 1),
                'h' => (Duration::from_secs(3600), 1),
                'm' => (Duration::from_secs(60), 1),
                's' => (Duration::from_secs(1), 1),
                _ => return None,
            }
        };
        total = total.checked_add(unit.checked_mul(u32::try_from(n).ok()?)?)?;
        rest = &rest[len..];
    }
    Some(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting_keeps_payloads_well_formed() {
        assert_eq!(quote("default/nginx-svc"), "\"default/nginx-svc\"");
        assert_eq!(quote("a\"b\nc"), "\"a'b c\"");
        let long = "x".repeat(300);
        assert_eq!(quote(&long).len(), COMMENT_MAX + 2);
        // Multi-byte characters are never split.
        let wide = "é".repeat(100);
        let q = quote(&wide);
        assert!(q.len() <= COMMENT_MAX + 2 && q.ends_with('"'));
    }

    #[test]
    fn priorities() {
        assert_eq!(priority_value("dstnat - 10"), Some(-110));
        assert_eq!(priority_value("dstnat-10"), Some(-110));
        assert_eq!(priority_value("srcnat"), Some(100));
        assert_eq!(priority_value("filter"), Some(0));
        assert_eq!(priority_value("-100"), Some(-100));
        assert_eq!(priority_value("mangle + 5"), Some(-145));
        assert_eq!(priority_value("bogus"), None);
        assert_eq!(priority_value("dstnat * 2"), None);
        assert_eq!(priority_value(""), None);
    }

    #[test]
    fn durations() {
        assert_eq!(parse_nft_duration("3h"), Some(Duration::from_secs(10800)));
        assert_eq!(
            parse_nft_duration("1h30m30s"),
            Some(Duration::from_secs(5430))
        );
        assert_eq!(parse_nft_duration("1d"), Some(Duration::from_secs(86400)));
        assert_eq!(parse_nft_duration("10m"), Some(Duration::from_secs(600)));
        assert_eq!(
            parse_nft_duration("1s500ms"),
            Some(Duration::from_millis(1500))
        );
        assert_eq!(parse_nft_duration("42"), Some(Duration::from_secs(42)));
        assert_eq!(parse_nft_duration("h"), None);
        assert_eq!(parse_nft_duration("3x"), None);
        assert_eq!(parse_nft_duration(""), None);
    }
}
