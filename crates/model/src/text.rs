//! [`escape`] and [`Escaped`]: text taken from a manifest or the API server, made safe to put
//! in a log line or an error message.
//!
//! A name, an address or a label value that has not been validated yet (it is being rejected,
//! or it is only reported) can hold a line break, a terminal escape sequence or a character
//! that reorders text. Printed raw, `name: "x\nERROR forged log line"` produces a second log
//! line the object's author wrote. Everything such a value brings in is therefore printed
//! through [`escape`]: control characters become Rust escapes (`\n`, `\r`, `\t`, `\u{1b}`),
//! as do the Unicode line and paragraph separators and the bidirectional-text controls. Other
//! text, including every valid Kubernetes name, is left exactly as it is (backslashes are not
//! doubled), so escaping is idempotent and costs nothing for ordinary text.

use std::borrow::Cow;
use std::fmt;

/// Whether `c` must not reach a log line as it is.
fn needs_escape(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{2028}'
                | '\u{2029}'
                | '\u{061c}'
                | '\u{200e}'
                | '\u{200f}'
                | '\u{202a}'..='\u{202e}'
                | '\u{2066}'..='\u{2069}'
        )
}

fn write_escaped(out: &mut impl fmt::Write, text: &str) -> fmt::Result {
    for c in text.chars() {
        if !needs_escape(c) {
            out.write_char(c)?;
            continue;
        }
        match c {
            '\n' => out.write_str("\\n")?,
            '\r' => out.write_str("\\r")?,
            '\t' => out.write_str("\\t")?,
            c => write!(out, "\\u{{{:x}}}", u32::from(c))?,
        }
    }
    Ok(())
}

/// `text` with its control characters, line separators and bidirectional controls escaped
/// (`\n`, `\u{1b}`, `\u{202e}`); borrowed unchanged when there is none.
pub fn escape(text: &str) -> Cow<'_, str> {
    if !text.chars().any(needs_escape) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    // Writing to a String cannot fail.
    let _ = write_escaped(&mut out, text);
    Cow::Owned(out)
}

/// Displays a text through [`escape`] without allocating: `format!("{}", Escaped(name))`.
#[derive(Debug, Clone, Copy)]
pub struct Escaped<'a>(pub &'a str);

impl fmt::Display for Escaped<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_escaped(f, self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_are_escaped() {
        assert_eq!(
            escape("x\nERROR forged log line"),
            "x\\nERROR forged log line"
        );
        assert_eq!(
            escape("a\r\tb\u{1b}[31mred\u{7f}"),
            "a\\r\\tb\\u{1b}[31mred\\u{7f}"
        );
        assert_eq!(
            escape("\u{202e}txt.exe\u{2028}"),
            "\\u{202e}txt.exe\\u{2028}"
        );
        assert_eq!(
            Escaped("x\ny\u{9b}").to_string(),
            "x\\ny\\u{9b}",
            "C1 controls too"
        );
    }

    #[test]
    fn ordinary_text_is_unchanged() {
        for text in ["default/nginx-svc", "10.0.0.1", "a\\nb", "zoné ☃", ""] {
            assert!(
                matches!(escape(text), Cow::Borrowed(t) if t == text),
                "{text}"
            );
            assert_eq!(Escaped(text).to_string(), text);
        }
        // Idempotent.
        let once = escape("x\n\u{1b}").into_owned();
        assert_eq!(escape(&once), once);
    }
}
