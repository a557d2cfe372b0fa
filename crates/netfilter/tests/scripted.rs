//! `ExecIptables` through a scripted exec: asserts the exact argv and stdin without
//! running anything; plus `SystemExec` behaviour with harmless real processes (missing
//! binary, early exit with a large stdin, signals).

use std::sync::Arc;

use kp_netfilter::*;

fn version_answer(version: &'static str) -> impl Fn(&[String], Option<&[u8]>) -> ExecOutput {
    move |argv: &[String], _stdin: Option<&[u8]>| {
        if argv.get(1).map(String::as_str) == Some("--version") {
            ExecOutput::ok(format!("{} {version}\n", argv[0]))
        } else if argv[0].ends_with("-save") {
            ExecOutput::ok("*nat\n:PREROUTING ACCEPT [0:0]\nCOMMIT\n")
        } else {
            ExecOutput::ok("")
        }
    }
}

fn argv(call: &ExecCall) -> Vec<&str> {
    call.argv.iter().map(String::as_str).collect()
}

#[test]
fn restore_runs_noflush_counters_wait_with_payload_on_stdin() {
    let exec = Arc::new(ScriptedExec::new(version_answer("v1.8.9 (nf_tables)")));
    let ipt = ExecIptables::with_exec(IpVersion::V4, Backend::Default, exec.clone());
    let payload = b"*nat\n:KUBE-SERVICES - [0:0]\nCOMMIT\n";
    ipt.restore(payload).unwrap();
    ipt.restore(payload).unwrap();
    let calls = exec.calls();
    // The version is asked once (to decide on --wait) and cached.
    assert_eq!(calls.len(), 3);
    assert_eq!(argv(&calls[0]), ["iptables", "--version"]);
    assert_eq!(calls[0].stdin, None);
    for c in &calls[1..] {
        assert_eq!(
            argv(c),
            ["iptables-restore", "--noflush", "--counters", "--wait=5"]
        );
        assert_eq!(c.stdin.as_deref(), Some(&payload[..]));
    }
}

#[test]
fn binaries_follow_family_and_backend() {
    for (v, backend, restore, save, main) in [
        (
            IpVersion::V4,
            Backend::Default,
            "iptables-restore",
            "iptables-save",
            "iptables",
        ),
        (
            IpVersion::V6,
            Backend::Default,
            "ip6tables-restore",
            "ip6tables-save",
            "ip6tables",
        ),
        (
            IpVersion::V4,
            Backend::Nft,
            "iptables-nft-restore",
            "iptables-nft-save",
            "iptables-nft",
        ),
        (
            IpVersion::V6,
            Backend::Legacy,
            "ip6tables-legacy-restore",
            "ip6tables-legacy-save",
            "ip6tables-legacy",
        ),
    ] {
        let exec = Arc::new(ScriptedExec::new(version_answer("v1.8.9 (legacy)")));
        let ipt = ExecIptables::with_exec(v, backend, exec.clone());
        assert_eq!(ipt.ip_version(), v);
        ipt.restore(b"").unwrap();
        ipt.save(None).unwrap();
        ipt.save(Some(Table::Nat)).unwrap();
        let calls = exec.calls();
        assert_eq!(argv(&calls[0]), [main, "--version"]);
        assert_eq!(
            argv(&calls[1]),
            [restore, "--noflush", "--counters", "--wait=5"]
        );
        assert_eq!(argv(&calls[2]), [save]);
        assert_eq!(argv(&calls[3]), [save, "-t", "nat"]);
    }
}

#[test]
fn old_iptables_gets_no_wait_flag() {
    let exec = Arc::new(ScriptedExec::new(version_answer("v1.6.1")));
    let ipt = ExecIptables::with_exec(IpVersion::V4, Backend::Default, exec.clone());
    ipt.restore(b"x").unwrap();
    assert_eq!(
        argv(&exec.calls()[1]),
        ["iptables-restore", "--noflush", "--counters"]
    );
    let v = ipt.version().unwrap();
    assert!(!v.supports_random_fully());
    assert_eq!(v.backend, NetfilterBackend::Legacy);
}

#[test]
fn version_is_parsed() {
    let exec = Arc::new(ScriptedExec::new(version_answer("v1.8.9 (nf_tables)")));
    let ipt = ExecIptables::with_exec(IpVersion::V6, Backend::Default, exec);
    let v = ipt.version().unwrap();
    assert_eq!((v.major, v.minor, v.patch), (1, 8, 9));
    assert_eq!(v.backend, NetfilterBackend::NfTables);
    assert_eq!(v.backend.name(), "nf_tables");
    assert!(v.supports_random_fully());

    let exec = Arc::new(ScriptedExec::new(|_: &[String], _: Option<&[u8]>| {
        ExecOutput::ok("something else\n")
    }));
    let ipt = ExecIptables::with_exec(IpVersion::V4, Backend::Default, exec);
    match ipt.version().unwrap_err() {
        Error::Version {
            command, output, ..
        } => {
            assert_eq!(command, "iptables --version");
            assert_eq!(output, "something else");
        }
        e => panic!("unexpected {e:?}"),
    }
}

#[test]
fn non_zero_exit_is_a_command_error_with_stderr() {
    let exec = Arc::new(ScriptedExec::new(|argv: &[String], _: Option<&[u8]>| {
        if argv[1] == "--version" {
            ExecOutput::ok("iptables v1.8.9 (legacy)")
        } else {
            ExecOutput::failed(1, "iptables-restore: line 3 failed\n")
        }
    }));
    let ipt = ExecIptables::with_exec(IpVersion::V4, Backend::Legacy, exec);
    let err = ipt.restore(b"*nat\nCOMMIT\n").unwrap_err();
    match &err {
        Error::Command {
            command,
            status,
            stderr,
        } => {
            assert_eq!(
                command,
                "iptables-legacy-restore --noflush --counters --wait=5"
            );
            assert_eq!(*status, 1);
            assert_eq!(stderr, "iptables-restore: line 3 failed");
        }
        e => panic!("unexpected {e:?}"),
    }
    assert!(err.to_string().contains("exit status 1"));
    assert!(ipt.save(Some(Table::Filter)).is_err());
}

#[test]
fn save_returns_stdout() {
    let exec = Arc::new(ScriptedExec::new(version_answer("v1.8.9 (nf_tables)")));
    let ipt = ExecIptables::with_exec(IpVersion::V4, Backend::Default, exec);
    let text = ipt.save(Some(Table::Nat)).unwrap();
    let rs = parse_save(&text).unwrap();
    assert!(rs.chain(Table::Nat, "PREROUTING").is_some());
}

#[test]
fn missing_binary_is_named() {
    let ipt = ExecIptables::with_exec(
        IpVersion::V4,
        Backend::Default,
        Arc::new(SystemExec::with_prefix(vec![
            "/nonexistent/kp-netfilter-no-such-binary".into(),
        ])),
    );
    match ipt.version().unwrap_err() {
        Error::BinaryNotFound { binary, command } => {
            assert_eq!(binary, "/nonexistent/kp-netfilter-no-such-binary");
            assert!(command.ends_with("iptables --version"), "{command}");
        }
        e => panic!("unexpected {e:?}"),
    }
    let err = SystemExec::new()
        .run(
            &["kp-netfilter-no-such-binary-restore".to_string()],
            Some(b"x"),
        )
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("kp-netfilter-no-such-binary-restore"),
        "{err}"
    );
}

#[test]
fn child_exiting_early_does_not_hang_and_reports_status() {
    let exec = SystemExec::new();
    // 16 MiB on stdin to a child that never reads it: the write fails with EPIPE,
    // which is ignored in favour of the exit status.
    let big = vec![b'x'; 16 << 20];
    let out = exec
        .run(
            &["sh".into(), "-c".into(), "echo oops >&2; exit 3".into()],
            Some(&big),
        )
        .unwrap();
    assert_eq!(out.status, 3);
    assert_eq!(out.stderr, b"oops\n");
    // A child that reads everything sees all of it.
    let out = exec.run(&["wc".into(), "-c".into()], Some(&big)).unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        (16u32 << 20).to_string()
    );
    // Killed by a signal: 128 + N.
    let out = exec
        .run(&["sh".into(), "-c".into(), "kill -9 $$".into()], None)
        .unwrap();
    assert_eq!(out.status, 137);
}
