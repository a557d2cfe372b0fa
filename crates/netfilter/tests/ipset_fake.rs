//! ipset without a kernel: entry canonicalisation, the save parser, payload builders,
//! `ExecIpset` over a scripted `Exec`, and the fake's checks and fault injection.

use std::sync::Arc;

use kp_netfilter::ipset::*;
use kp_netfilter::{Error, ExecOutput, ScriptedExec};

#[test]
fn canonical_entries() {
    use SetFamily::*;
    use SetKind::*;
    let c = |k, f, t| canonical_entry(k, f, t);
    assert_eq!(
        c(HashIpPort, Inet, "10.0.0.1,6:80").unwrap(),
        "10.0.0.1,tcp:80"
    );
    assert_eq!(
        c(HashIpPort, Inet, "10.0.0.1,80").unwrap(),
        "10.0.0.1,tcp:80"
    );
    assert_eq!(
        c(HashIpPort, Inet6, "fd00:0::1,udp:53").unwrap(),
        "fd00::1,udp:53"
    );
    assert_eq!(c(HashNet, Inet, "10.1.2.3/16").unwrap(), "10.1.0.0/16");
    assert_eq!(c(HashNet, Inet, "10.1.2.3/32").unwrap(), "10.1.2.3");
    assert_eq!(
        c(HashIpPortNet, Inet6, "fd00::1,sctp:1,fd00::1/128").unwrap(),
        "fd00::1,sctp:1,fd00::1"
    );
    assert_eq!(c(BitmapPort, Inet, "udp:53").unwrap(), "53");
    for (k, f, bad) in [
        (HashIpPort, Inet, "fd00::1,tcp:80"),
        (HashIpPort, Inet, "10.0.0.1"),
        (HashIpPort, Inet, "10.0.0.1,tcp:65536"),
        (HashIpPort, Inet, "10.0.0.1,icmp:8"),
        (HashIpPort, Inet, "10.0.0.1,tcp:http"),
        (HashIp, Inet, "10.0.0.0/30"),
        (HashNet, Inet, "10.0.0.0/0"),
        (HashNet, Inet, "10.0.0.0/33"),
        (BitmapPort, Inet, "sctp:1"),
        (BitmapPort, Inet, "80-81"),
    ] {
        assert!(c(k, f, bad).is_err(), "{k} {bad}");
    }
    let bitmap = SetSpec::bitmap_port("P", (1000, 2000));
    assert!(bitmap.canonical_entry("999").is_err());
    assert_eq!(bitmap.canonical_entry("2000").unwrap(), "2000");
}

#[test]
fn save_parses_and_renders() {
    let text = "create KUBE-CLUSTER-IP hash:ip,port family inet hashsize 1024 maxelem 65536 comment bucketsize 12 initval 0x0f5524ab\n\
                add KUBE-CLUSTER-IP 10.96.0.1,tcp:443 comment \"default/kubernetes:https\"\n\
                create OTHER list:set size 8\nadd OTHER KUBE-CLUSTER-IP\n\
                create KUBE-NODE-PORT-TCP bitmap:port range 0-65535\nadd KUBE-NODE-PORT-TCP 30080\n\
                create KUBE-6 hash:ip family inet6 hashsize 2048 maxelem 10 timeout 0\n";
    let sets = parse_save(text).unwrap();
    assert_eq!(sets.len(), 3, "list:set is skipped");
    assert_eq!(sets[0].spec.kind, SetKind::HashIpPort);
    assert!(sets[0].spec.comment);
    assert_eq!(sets[0].entries.iter().next().unwrap(), "10.96.0.1,tcp:443");
    assert_eq!(sets[1].spec.range, Some((0, 65535)));
    assert_eq!(sets[2].spec.family, SetFamily::Inet6);
    assert_eq!((sets[2].spec.hashsize, sets[2].spec.maxelem), (2048, 10));
    assert_eq!(parse_save(&render_save(&sets)).unwrap(), sets);
    let err = parse_save("create A hash:ip\nadd B 1.1.1.1\n").unwrap_err();
    assert_eq!(err.line, 2);
    assert!(parse_save("bogus\n").is_err());
}

#[test]
fn builder_writes_idempotent_lines() {
    let mut b = RestoreBuilder::new();
    assert!(b.is_empty());
    b.create(&SetSpec::hash(
        "KUBE-A",
        SetKind::HashIpPort,
        SetFamily::Inet6,
    ))
    .create(&SetSpec::bitmap_port("KUBE-P", (0, 65535)))
    .add("KUBE-A", "fd00::1,tcp:80")
    .del("KUBE-A", "fd00::2,tcp:80")
    .flush("KUBE-P")
    .swap("KUBE-A", "KUBE-B")
    .destroy("KUBE-B");
    assert_eq!(b.len(), 7);
    assert_eq!(
        String::from_utf8(b.finish()).unwrap(),
        "create KUBE-A hash:ip,port family inet6 hashsize 1024 maxelem 65536 -exist\n\
         create KUBE-P bitmap:port range 0-65535 -exist\n\
         add KUBE-A fd00::1,tcp:80 -exist\n\
         del KUBE-A fd00::2,tcp:80 -exist\n\
         flush KUBE-P\nswap KUBE-A KUBE-B\ndestroy KUBE-B\n"
    );
}

#[test]
fn diff_is_minimal() {
    let spec = SetSpec::hash("KUBE-A", SetKind::HashIpPort, SetFamily::Inet);
    let current = vec![SetState::with_entries(
        SetSpec {
            hashsize: 4096,
            ..spec.clone()
        },
        ["10.0.0.1,tcp:80", "10.0.0.2,tcp:80"],
    )];
    let desired = vec![SetState::with_entries(
        spec.clone(),
        ["10.0.0.2,6:80", "10.0.0.3,tcp:80"],
    )];
    assert_eq!(
        String::from_utf8(diff(&desired, &current)).unwrap(),
        "del KUBE-A 10.0.0.1,tcp:80 -exist\nadd KUBE-A 10.0.0.3,tcp:80 -exist\n"
    );
    assert!(diff(&current, &current).is_empty());
    // maxelem change: temp + swap; family change: destroy + create.
    let bigger = vec![SetState::with_entries(
        SetSpec {
            maxelem: 10,
            ..spec.clone()
        },
        ["10.0.0.2,tcp:80"],
    )];
    let text = String::from_utf8(diff(&bigger, &current)).unwrap();
    assert!(
        text.starts_with(&format!("create {TEMP_SET_NAME} hash:ip,port")),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "swap {TEMP_SET_NAME} KUBE-A\ndestroy {TEMP_SET_NAME}\n"
        )),
        "{text}"
    );
    let v6 = vec![SetState::new(SetSpec {
        family: SetFamily::Inet6,
        ..spec.clone()
    })];
    let text = String::from_utf8(diff(&v6, &current)).unwrap();
    assert!(
        text.starts_with("destroy KUBE-A\ncreate KUBE-A hash:ip,port family inet6"),
        "{text}"
    );
    // Applying diffs on the fake converges.
    let fake = FakeIpset::new();
    for want in [&current, &desired, &bigger, &v6, &current] {
        fake.restore(&diff(want, &fake.sets())).unwrap();
        assert!(diff(want, &fake.sets()).is_empty());
    }
}

#[test]
fn fake_checks_and_partial_application() {
    let fake = FakeIpset::new();
    fake.restore(b"create A hash:ip\nadd A 1.1.1.1\n").unwrap();
    let err = fake
        .restore(b"add A 1.1.1.2\nadd A 1.1.1.1\nadd A 1.1.1.3\n")
        .unwrap_err();
    assert!(err.to_string().contains("Error in line 2"), "{err}");
    let entries = |f: &FakeIpset| f.set("A").unwrap().entries.into_iter().collect::<Vec<_>>();
    assert_eq!(entries(&fake), ["1.1.1.1", "1.1.1.2"]);
    // A syntax error drops the collected adds not yet sent.
    assert!(fake.restore(b"add A 1.1.1.4\nadd A fd00::1\n").is_err());
    assert_eq!(entries(&fake), ["1.1.1.1", "1.1.1.2"]);
    let Err(Error::Command { status, .. }) = fake.restore(b"nonsense\n") else {
        panic!("unknown command accepted");
    };
    assert_eq!(status, 2);
    assert_eq!(fake.restore_count(), 4);
}

#[test]
fn fake_fault_injection() {
    let fake = FakeIpset::new();
    fake.fail_next_restore("boom");
    assert!(fake.restore(b"create A hash:ip\n").is_err());
    assert!(fake.sets().is_empty());
    fake.fail_next_restore_at_line(3, "Kernel error received: Out of memory");
    let err = fake
        .restore(b"create A hash:ip\nadd A 1.1.1.1\nadd A 1.1.1.2\n")
        .unwrap_err();
    assert!(err.to_string().contains("line 3: Kernel error"), "{err}");
    assert_eq!(fake.set("A").unwrap().entries.len(), 1);
    fake.set_in_use("A", true);
    assert!(fake.restore(b"destroy A\n").is_err());
    assert!(fake.restore(b"destroy\n").is_err());
    fake.set_in_use("A", false);
    fake.restore(b"destroy\n").unwrap();
    fake.fail_next_save("nope");
    assert!(fake.save().is_err());
    assert!(fake.save().unwrap().is_empty());
    assert_eq!(fake.save_count(), 2);
    assert_eq!(fake.last_payload().as_deref(), Some(&b"destroy\n"[..]));
    assert!(fake.version().unwrap().is_supported());
}

#[test]
fn exec_ipset_runs_the_binary() {
    let exec = Arc::new(ScriptedExec::new(|argv, stdin| match argv[1].as_str() {
        "version" => ExecOutput::ok("ipset v7.17, protocol version: 7\n"),
        "save" => ExecOutput::ok(
            "create A hash:ip family inet hashsize 1024 maxelem 65536\nadd A 1.1.1.1\n",
        ),
        "restore" if stdin == Some(b"bad\n") => {
            ExecOutput::failed(1, "ipset v7.17: Error in line 1: boom\n")
        }
        _ => ExecOutput::ok(""),
    }));
    let ipset = ExecIpset::with_exec(exec.clone());
    let v = ipset.version().unwrap();
    assert_eq!((v.major, v.minor, v.protocol), (7, 17, 7));
    assert_eq!(ipset.save().unwrap()[0].entries.len(), 1);
    ipset.restore(b"create B hash:ip\n").unwrap();
    let err = ipset.restore(b"bad\n").unwrap_err();
    let Error::Command {
        command,
        status,
        stderr,
    } = err
    else {
        panic!()
    };
    assert_eq!(
        (command.as_str(), status, stderr.as_str()),
        ("ipset restore", 1, "ipset v7.17: Error in line 1: boom")
    );
    let calls = exec.calls();
    assert_eq!(calls[2].argv, ["ipset", "restore"]);
    assert_eq!(calls[2].stdin.as_deref(), Some(&b"create B hash:ip\n"[..]));
}

#[test]
fn versions() {
    let v = IpsetVersion::parse("ipset v6.38, protocol version: 6").unwrap();
    assert!(v.is_supported());
    assert!(!IpsetVersion::parse("ipset v5.4.1").unwrap().is_supported());
    assert!(IpsetVersion::parse("ipset").is_err());
}
