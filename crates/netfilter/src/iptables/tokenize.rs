//! Splits one line of `iptables-restore` input (or `iptables-save` output) into
//! arguments, following `iptables-restore`'s own quoting rules:
//!
//! * spaces, tabs and newlines separate arguments;
//! * `"` opens a quoted section that continues the current argument (`a"b c"` is one
//!   argument `ab c`); inside it whitespace is literal and `\x` stands for `x` (so `\"`
//!   is a quote and `\\` a backslash);
//! * the closing `"` *ends* the argument, even if more text follows (`"a"b` is two
//!   arguments `a` and `b`; `""` is one empty argument);
//! * outside quotes a backslash is an ordinary character and `'` is not special.
//!
//! An unterminated quote is an error (iptables-restore would swallow the rest of the
//! input into the argument).

/// Tokenizes `line`; the error message says what is wrong (the caller adds the line
/// number).
pub fn tokenize(line: &str) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut in_quote = false;
    let mut escaped = false;
    let mut started = false;
    for c in line.chars() {
        if in_quote {
            if escaped {
                cur.push(c);
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if c == '"' {
                in_quote = false;
                out.push(std::mem::take(&mut cur));
                started = false;
            } else {
                cur.push(c);
            }
            continue;
        }
        match c {
            '"' => {
                in_quote = true;
                started = true;
            }
            ' ' | '\t' | '\n' | '\r' => {
                if started {
                    out.push(std::mem::take(&mut cur));
                    started = false;
                }
            }
            _ => {
                cur.push(c);
                started = true;
            }
        }
    }
    if in_quote {
        return Err("unterminated quoted argument".to_string());
    }
    if started {
        out.push(cur);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::tokenize;

    fn t(s: &str) -> Vec<String> {
        tokenize(s).unwrap()
    }

    #[test]
    fn splits_on_whitespace() {
        assert_eq!(t("  -A  X\t-j ACCEPT \n"), ["-A", "X", "-j", "ACCEPT"]);
        assert!(t("").is_empty());
        assert!(t("   ").is_empty());
    }

    #[test]
    fn quotes_group_and_escape() {
        assert_eq!(
            t(r#"--comment "default/nginx-svc cluster IP" -j X"#),
            ["--comment", "default/nginx-svc cluster IP", "-j", "X"]
        );
        assert_eq!(t(r#""a \"q\" \\ \'""#), [r#"a "q" \ '"#]);
        assert_eq!(t(r#"--comment """#), ["--comment", ""]);
    }

    #[test]
    fn closing_quote_ends_argument() {
        assert_eq!(t(r#""a"b"#), ["a", "b"]);
        assert_eq!(t(r#"a"b c"d"#), ["ab c", "d"]);
    }

    #[test]
    fn backslash_and_single_quote_literal_outside_quotes() {
        assert_eq!(t(r"a\b 'x y'"), [r"a\b", "'x", "y'"]);
    }

    #[test]
    fn unterminated_quote_is_an_error() {
        assert!(tokenize(r#"--comment "abc"#).is_err());
        assert!(tokenize(r#"--comment "abc\""#).is_err());
    }
}
