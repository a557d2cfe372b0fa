//! The log: `-v` levels and `--logging-format` (`logging.format` in a `--config` file).
//!
//! **Levels.** klog's `-v=N` shows messages logged at `V(N)` and below; upstream kube-proxy
//! logs its start-up and errors at 0, each sync at 2, per-object details at 4 and client-go
//! its requests from 6 on. kube-proxy-rs maps `-v` onto tracing levels the same way, for its
//! own crates and, from 6 on, for the libraries (kube, hyper, rustls: the API client):
//!
//! | `-v` | kube-proxy-rs | libraries |
//! |---|---|---|
//! | 0, 1 | error, warn, info | error, warn, info |
//! | 2, 3 | + debug | error, warn, info |
//! | 4, 5 | + trace | error, warn, info |
//! | 6, 7 | + trace | + debug (each API request) |
//! | 8+ | + trace | + trace |
//!
//! `RUST_LOG` (an `EnvFilter` directive) replaces the table when set.
//!
//! **Formats.** `text` (the default) is tracing-subscriber's human format on stderr. `json`
//! writes one JSON object per line on stderr in klog's JSON shape (component-base
//! `logs/json`), so that log pipelines parsing kube-proxy's JSON logs read these the same:
//!
//! ```json
//! {"ts":1784628000123.456,"caller":"src/proxy.rs:712","msg":"starting kube-proxy-rs","v":0,"node":"k8s-master","mode":"iptables"}
//! {"ts":1784628001000.5,"caller":"src/server.rs:97","msg":"HTTP server failed; retrying","err":"cannot listen on ...","server":"healthz"}
//! ```
//!
//! `ts` is milliseconds since the Unix epoch (a float, as klog's); `caller` the source file
//! (its last two path components) and line; `msg` the message; `v` the verbosity of an
//! info-level message (error: none, as klog's; warn and info: 0; debug: 2; trace: 4, the
//! `-v` that shows it); an error's `error` field is klog's `err`; the event's other fields
//! follow as keys (strings, numbers or booleans; other values as their `Debug` text). Span
//! fields are not written. tracing-subscriber's own JSON formatter is not used because its
//! keys are fixed (`timestamp` as RFC 3339, `level`, `fields.message`, `target`): a pipeline
//! written for kube-proxy would find none of klog's.

use std::fmt::Write as _;

use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

/// The crates of kube-proxy-rs (tracing targets), which `-v` 2-5 opens up.
const OWN_CRATES: [&str; 12] = [
    "kube_proxy_rs",
    "kp_model",
    "kp_source",
    "kp_track",
    "kp_runtime",
    "kp_proxier",
    "kp_netfilter",
    "kp_netlink",
    "kp_admin",
    "kp_relay",
    "kp_trace",
    "kp_testkit",
];

/// The `EnvFilter` directives for `-v=verbosity` (see the module documentation).
pub fn directives(verbosity: u8) -> String {
    let own = match verbosity {
        0 | 1 => "info",
        2 | 3 => "debug",
        _ => "trace",
    };
    let libraries = match verbosity {
        0..=5 => "info",
        6 | 7 => "debug",
        _ => "trace",
    };
    let mut out = libraries.to_string();
    for c in OWN_CRATES {
        let _ = write!(out, ",{c}={own}");
    }
    // notify's inotify backend logs two expected messages when a watched subdirectory is
    // deleted: "unable to remove watch descriptor" at INFO, and "Unable to remove the path
    // from the watches: ... WatchNotFound" at WARN (the parent's DELETE event and the
    // directory's own DELETE_SELF each drop the same watch; the second finds it gone). They
    // are its only messages at those levels, and neither means a change is missed: watch
    // errors reach the source's handler, which reloads and logs them itself.
    out.push_str(",notify=warn,notify::inotify=error");
    // kube-client logs every failed request at ERROR ("failed with error client error
    // (Connect)"), without the server or what was asked; the source logs the same failure
    // as one WARN line naming both and the next retry. Shown from -v=6, with the requests.
    if verbosity < 6 {
        out.push_str(",kube_client::client::builder=off");
    }
    out
}

/// Installs the global subscriber: `-v=verbosity`, `format` `text` or `json`.
pub fn init(verbosity: u8, format: &str) {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(directives(verbosity)));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    if format == "json" {
        builder.event_format(KlogJson).init();
    } else {
        builder
            .with_target(false)
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .init();
    }
}

/// klog's `v` of an info-level message at `level` (`None` for errors, which have none).
pub fn klog_verbosity(level: Level) -> Option<u8> {
    match level {
        Level::ERROR => None,
        Level::WARN | Level::INFO => Some(0),
        Level::DEBUG => Some(2),
        Level::TRACE => Some(4),
    }
}

/// The event formatter of `--logging-format=json` (see the module documentation).
pub struct KlogJson;

/// An event's fields as JSON values, the message apart.
#[derive(Default)]
struct Fields {
    message: String,
    fields: Vec<(String, serde_json::Value)>,
}

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.message = value.to_string();
        } else {
            self.fields.push((field.name().into(), value.into()));
        }
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.fields.push((field.name().into(), value.into()));
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.fields.push((field.name().into(), value.into()));
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.fields.push((field.name().into(), value.into()));
    }

    fn record_f64(&mut self, field: &Field, value: f64) {
        self.fields.push((field.name().into(), value.into()));
    }

    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        self.fields
            .push((field.name().into(), value.to_string().into()));
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        let text = format!("{value:?}");
        if field.name() == "message" {
            self.message = text;
        } else {
            self.fields.push((field.name().into(), text.into()));
        }
    }
}

/// `path`'s last two components (zap's short caller: `app/server.go`).
fn short_path(path: &str) -> &str {
    let mut cut = path.rmatch_indices('/');
    match (cut.next(), cut.next()) {
        (Some(_), Some((i, _))) => &path[i + 1..],
        _ => path,
    }
}

/// One event as a klog JSON line (without the newline); `now_ms` the time in milliseconds
/// since the Unix epoch.
fn klog_line(
    now_ms: f64,
    level: Level,
    file: Option<&str>,
    line: Option<u32>,
    fields: Fields,
) -> String {
    let json = |v: &serde_json::Value| v.to_string();
    let mut out = String::with_capacity(128);
    let _ = write!(out, "{{\"ts\":{}", json(&now_ms.into()));
    if let Some(file) = file {
        let caller = match line {
            Some(l) => format!("{}:{l}", short_path(file)),
            None => short_path(file).to_string(),
        };
        let _ = write!(out, ",\"caller\":{}", json(&caller.into()));
    }
    let _ = write!(out, ",\"msg\":{}", json(&fields.message.into()));
    if let Some(v) = klog_verbosity(level) {
        let _ = write!(out, ",\"v\":{v}");
    }
    for (key, value) in fields.fields {
        let key = if level == Level::ERROR && key == "error" {
            "err".to_string()
        } else {
            key
        };
        let _ = write!(out, ",{}:{}", json(&key.into()), json(&value));
    }
    out.push('}');
    out
}

impl<S, N> FormatEvent<S, N> for KlogJson
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        _ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> std::fmt::Result {
        let meta = event.metadata();
        let mut fields = Fields::default();
        event.record(&mut fields);
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs_f64() * 1e3)
            .unwrap_or(0.0);
        writeln!(
            writer,
            "{}",
            klog_line(now_ms, *meta.level(), meta.file(), meta.line(), fields)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn klog_lines_have_klogs_keys() {
        let fields = Fields {
            message: "starting \"x\"\nnext".into(),
            fields: vec![
                ("node".into(), "k8s-master".into()),
                ("syncs".into(), 3u64.into()),
            ],
        };
        let line = klog_line(
            1_784_628_000_123.5,
            Level::INFO,
            Some("kube-proxy-rs/src/proxy.rs"),
            Some(712),
            fields,
        );
        assert_eq!(
            line,
            r#"{"ts":1784628000123.5,"caller":"src/proxy.rs:712","msg":"starting \"x\"\nnext","v":0,"node":"k8s-master","syncs":3}"#
        );
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(v["msg"], "starting \"x\"\nnext");
        let error = klog_line(
            1.0,
            Level::ERROR,
            Some("server.rs"),
            Some(9),
            Fields {
                message: "failed".into(),
                fields: vec![("error".into(), "boom".into())],
            },
        );
        assert_eq!(
            error,
            r#"{"ts":1.0,"caller":"server.rs:9","msg":"failed","err":"boom"}"#
        );
        assert_eq!(klog_verbosity(Level::DEBUG), Some(2));
        assert_eq!(klog_verbosity(Level::TRACE), Some(4));
    }

    #[test]
    fn verbosity_opens_our_crates_before_the_libraries() {
        assert!(directives(0).starts_with("info,kube_proxy_rs=info"));
        let v2 = directives(2);
        assert!(
            v2.starts_with("info,") && v2.contains("kp_proxier=debug"),
            "{v2}"
        );
        assert!(directives(4).contains("kp_runtime=trace"));
        assert!(directives(6).starts_with("debug,"));
        assert!(directives(9).starts_with("trace,"));
        for v in 0..10 {
            EnvFilter::try_new(directives(v)).unwrap();
        }
    }
}
