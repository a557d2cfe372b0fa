//! The README's commands, checked against the workspace: a newcomer copies them verbatim, so
//! each must name what it runs (`cargo run` in a workspace with several binaries needs `--bin`
//! or `-p`), name scripts that exist and are executable, and CI must run the README's test
//! command. And the docs that name what the code has: every flag of `--help` has its row in
//! docs/flags.md, and benchmark reports name `kp-bench`, not a path on one machine.

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

/// The long flags `--help` lists (`--name`, without a value).
fn help_flags(help: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in help.lines() {
        let t = line.trim_start();
        // Option lines start with the flag (`-v, --v <N>` or `--flag <X>`).
        let t = t.strip_prefix("-v, ").unwrap_or(t);
        let Some(rest) = t.strip_prefix("--") else {
            continue;
        };
        let name: String = rest
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '_')
            .collect();
        if !name.is_empty() {
            out.push(format!("--{name}"));
        }
    }
    out
}

#[test]
fn every_flag_in_help_is_in_docs_flags_md() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_kube-proxy-rs"))
        .arg("--help")
        .output()
        .unwrap();
    assert!(out.status.success());
    let help = String::from_utf8(out.stdout).unwrap();
    let flags = help_flags(&help);
    assert!(flags.len() > 40, "too few flags found in --help: {flags:?}");
    let doc = std::fs::read_to_string(root().join("docs/flags.md")).unwrap();
    let missing: Vec<&String> = flags
        .iter()
        .filter(|f| !["--help", "--version"].contains(&f.as_str()))
        .filter(|f| {
            // In a table cell or heading as `--flag`, alone or with a value or a sibling.
            ![
                format!("`{f}`"),
                format!("`{f}="),
                format!("`{f} "),
                format!("`{f},"),
            ]
            .iter()
            .any(|p| doc.contains(p.as_str()))
        })
        .collect();
    assert!(
        missing.is_empty(),
        "flags in --help that docs/flags.md does not describe: {missing:?}"
    );
}

#[test]
fn benchmark_reports_name_kp_bench_not_a_local_path() {
    let dir = root().join("docs/benchmarks");
    let mut reports = Vec::new();
    let mut stack = vec![dir];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let p = entry.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else if p.file_name().is_some_and(|n| n == "results.md") {
                reports.push(p);
            }
        }
    }
    assert!(!reports.is_empty());
    for p in reports {
        let text = std::fs::read_to_string(&p).unwrap();
        for line in text.lines().filter(|l| l.starts_with("Command: ")) {
            assert!(
                line.starts_with("Command: `kp-bench "),
                "{}: {line}",
                p.display()
            );
            let guest = line.split("(in the guest: ").nth(1);
            assert!(
                guest.is_none_or(|g| g.starts_with("kp-bench ")),
                "{}: {line}",
                p.display()
            );
        }
    }
}
