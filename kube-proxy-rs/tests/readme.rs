//! The README's commands, checked against the workspace: a newcomer copies them verbatim, so
//! each must name what it runs (`cargo run` in a workspace with several binaries needs `--bin`
//! or `-p`), name scripts that exist and are executable, and CI must run the README's test
//! command.

use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// The lines of the README's ```sh blocks.
fn shell_lines(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut inside = false;
    for line in text.lines() {
        let t = line.trim();
        if t.starts_with("```") {
            inside = !inside && t == "```sh";
            continue;
        }
        if inside && !t.is_empty() && !t.starts_with('#') {
            out.push(t.to_string());
        }
    }
    out
}

/// The binaries the workspace builds: `[[bin]]`-less packages with a `src/main.rs` are named
/// after the package.
fn binaries(root: &Path) -> Vec<String> {
    let mut dirs = vec![root.join("kube-proxy-rs")];
    for entry in std::fs::read_dir(root.join("crates")).unwrap() {
        dirs.push(entry.unwrap().path());
    }
    dirs.into_iter()
        .filter(|d| d.join("src/main.rs").exists())
        .map(|d| {
            let manifest = std::fs::read_to_string(d.join("Cargo.toml")).unwrap();
            manifest
                .lines()
                .find_map(|l| l.trim().strip_prefix("name = "))
                .unwrap()
                .trim_matches('"')
                .to_string()
        })
        .collect()
}

#[test]
fn readme_commands_name_what_they_run() {
    let root = root();
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let lines = shell_lines(&readme);
    assert!(!lines.is_empty(), "no ```sh blocks in README.md");
    let several = binaries(&root).len() > 1;
    for line in &lines {
        for command in line.split("&&").map(str::trim) {
            if command.starts_with("cargo run") && several {
                assert!(
                    command.contains("--bin ") || command.contains("-p "),
                    "`{command}` is ambiguous: the workspace builds {:?}; add --bin or -p",
                    binaries(&root)
                );
            }
            if let Some(script) = command.strip_prefix("scripts/") {
                let path = root
                    .join("scripts")
                    .join(script.split_whitespace().next().unwrap());
                let meta =
                    std::fs::metadata(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
                use std::os::unix::fs::PermissionsExt;
                assert!(
                    meta.permissions().mode() & 0o111 != 0,
                    "{} is not executable",
                    path.display()
                );
            }
        }
    }
    assert!(
        lines
            .iter()
            .any(|l| l.contains("--bin kube-proxy-rs -- sandbox")),
        "the README runs the sandbox: {lines:?}"
    );
}

#[test]
fn ci_runs_the_readme_test_command() {
    let root = root();
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let test_command = shell_lines(&readme)
        .into_iter()
        .find(|l| l.starts_with("cargo test"))
        .expect("a cargo test command in the README");
    let ci = std::fs::read_to_string(root.join(".ci/run")).unwrap();
    assert!(
        ci.lines().any(|l| l.trim() == test_command),
        ".ci/run does not run the README's `{test_command}`"
    );
}
