//! Records what `kubernetes_build_info` reports about the build: the compiler's version, and,
//! when the build sets them, the commit (`KUBE_PROXY_RS_GIT_COMMIT`), its tree state
//! (`KUBE_PROXY_RS_GIT_TREE_STATE`) and the build date (`SOURCE_DATE_EPOCH`, the
//! reproducible-builds convention). Unset, they are upstream's values for an unknown build
//! (empty, empty, `1970-01-01T00:00:00Z`). No git command runs here: a build from a source
//! tarball (or the image's build context) has no repository.

use std::time::{Duration, UNIX_EPOCH};

fn main() {
    for var in [
        "KUBE_PROXY_RS_GIT_COMMIT",
        "KUBE_PROXY_RS_GIT_TREE_STATE",
        "SOURCE_DATE_EPOCH",
    ] {
        println!("cargo:rerun-if-env-changed={var}");
    }
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let version = std::process::Command::new(rustc)
        .arg("--version")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|v| v.split_whitespace().nth(1).map(str::to_string))
        .unwrap_or_default();
    println!("cargo:rustc-env=KP_RUSTC_VERSION={version}");
    let env = |k: &str| std::env::var(k).unwrap_or_default();
    println!(
        "cargo:rustc-env=KP_GIT_COMMIT={}",
        env("KUBE_PROXY_RS_GIT_COMMIT")
    );
    println!(
        "cargo:rustc-env=KP_GIT_TREE_STATE={}",
        env("KUBE_PROXY_RS_GIT_TREE_STATE")
    );
    let date = env("SOURCE_DATE_EPOCH")
        .trim()
        .parse::<u64>()
        .map(|s| humantime::format_rfc3339_seconds(UNIX_EPOCH + Duration::from_secs(s)).to_string())
        .unwrap_or_else(|_| "1970-01-01T00:00:00Z".into());
    println!("cargo:rustc-env=KP_BUILD_DATE={date}");
}
