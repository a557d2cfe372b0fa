//! Input handled as upstream kube-proxy handles it: a byte that is not UTF-8 costs only its
//! document, text from a manifest never reaches a log line raw, IPv4 addresses with leading
//! zeros are read as decimal (with a warning), and `service.kubernetes.io/headless` Services
//! are ignored.

use std::net::IpAddr;
use std::path::Path;

use ipnet::IpNet;
use kp_model::{NamespacedName, SourceEvent};

use super::{parse, service_yaml, slice_yaml};
use crate::api::ApiObjectError;
use crate::last_good::LastGood;
use crate::manifests::{ManifestError, ManifestLoader, ObjectKey, load_path, load_path_detailed};

fn ip(s: &str) -> IpAddr {
    s.parse().expect("test IP")
}

fn nn(ns: &str, name: &str) -> NamespacedName {
    NamespacedName::new(ns, name)
}

fn svc(name: &str, cluster_ip: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Service\nmetadata:\n  name: {name}\nspec:\n  clusterIP: \
         {cluster_ip}\n  ports:\n  - port: 80\n"
    )
}

/// `svc(name, ...)` with a label whose value holds the byte 0xFF (line 5 of the document).
fn svc_with_bad_byte(name: &str, cluster_ip: &str) -> Vec<u8> {
    let mut bytes =
        format!("apiVersion: v1\nkind: Service\nmetadata:\n  name: {name}\n  labels: {{team: \"")
            .into_bytes();
    bytes.push(0xff);
    bytes.extend_from_slice(
        format!("\"}}\nspec:\n  clusterIP: {cluster_ip}\n  ports:\n  - port: 80\n").as_bytes(),
    );
    bytes
}

fn join(parts: &[&[u8]]) -> Vec<u8> {
    parts.join(&b"---\n"[..])
}

#[test]
fn a_bad_byte_skips_only_its_document() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("cluster.yaml");
    // Document 1 is lines 1-8, the marker line 9, document 2 lines 10-17 (its bad byte on
    // line 14), document 3 from line 19.
    let a = svc("a", "10.96.0.1");
    let b = svc_with_bad_byte("b", "10.96.0.2");
    let c = svc("c", "10.96.0.3");
    std::fs::write(&file, join(&[a.as_bytes(), &b, c.as_bytes()])).expect("write");

    let (set, errors) = load_path(&file);
    let names: Vec<_> = set.services.keys().map(ToString::to_string).collect();
    assert_eq!(names, ["default/a", "default/c"], "{errors:#?}");
    let errors: Vec<String> = errors.iter().map(ToString::to_string).collect();
    assert_eq!(
        errors,
        [format!(
            "{}:10: document 2: not UTF-8 text: invalid byte 0xFF at line 14; this document \
             (Service default/b) is skipped",
            file.display()
        )]
    );
    // Not understood whole: a watcher keeps what the file defined before.
    let loaded = load_path_detailed(&file);
    assert!(loaded.files[&file].incomplete.is_some());
}

#[test]
fn a_bad_byte_in_a_list_skips_the_whole_list() {
    let mut list = b"apiVersion: v1\nkind: List\nitems:\n- apiVersion: v1\n  kind: Service\n  \
        metadata: {name: a}\n  spec: {clusterIP: 10.96.0.1, ports: [{port: 80}]}\n- apiVersion: \
        v1\n  kind: Service\n  metadata: {name: b, labels: {team: \""
        .to_vec();
    list.push(0xfe);
    list.extend_from_slice(b"\"}}\n  spec: {clusterIP: 10.96.0.2, ports: [{port: 80}]}\n");
    let c = svc("c", "10.96.0.3");
    let mut loader = ManifestLoader::new();
    loader.add_bytes(Path::new("list.yaml"), &join(&[&list, c.as_bytes()]));
    let (set, errors) = loader.finish();
    assert_eq!(
        set.services.keys().collect::<Vec<_>>(),
        [&nn("default", "c")]
    );
    let errors: Vec<String> = errors.iter().map(ToString::to_string).collect();
    assert_eq!(
        errors,
        [
            "list.yaml:1: document 1: not UTF-8 text: invalid byte 0xFE at line 10; this document \
          is a List: the whole List (2 items) is skipped"
        ]
    );
}

#[test]
fn bad_bytes_outside_documents_and_in_whole_files() {
    // In a comment before the first marker: no document is skipped, the file is reported.
    let mut text = b"# generated \xc3\x28 by hand\n---\n".to_vec();
    text.extend_from_slice(svc("a", "10.96.0.1").as_bytes());
    let mut loader = ManifestLoader::new();
    loader.add_bytes(Path::new("t.yaml"), &text);
    let (set, errors) = loader.finish();
    assert_eq!(set.services.len(), 1);
    let errors: Vec<String> = errors.iter().map(ToString::to_string).collect();
    assert_eq!(
        errors,
        ["t.yaml:1: not UTF-8 text: invalid byte 0xC3 outside any document; ignored"]
    );

    // Several bad bytes in one document: one error, counting them; after a byte-order mark.
    let mut text = "\u{feff}".as_bytes().to_vec();
    text.extend_from_slice(&svc_with_bad_byte("b", "10.96.0.2"));
    text.extend_from_slice(b"# \xff\xff more\n");
    let mut loader = ManifestLoader::new();
    loader.add_bytes(Path::new("t.yaml"), &text);
    let (set, errors) = loader.finish();
    assert!(set.is_empty());
    assert_eq!(
        errors[0].to_string(),
        "t.yaml:1: document 1: not UTF-8 text: invalid byte 0xFF at line 5 (and 2 more); this \
         document (Service default/b) is skipped"
    );
}

#[test]
fn a_bad_byte_keeps_the_last_good_version_and_the_rest_updates() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("a.yaml");
    std::fs::write(
        &file,
        format!("{}---\n{}", svc("a", "10.96.0.1"), svc("b", "10.96.0.2")),
    )
    .expect("write");
    let (state, errors, _) = LastGood::first(load_path_detailed(&file));
    assert!(errors.is_empty(), "{errors:?}");

    // a changes; b gets a bad byte: a's change applies, b keeps its last good version.
    let a = svc("a", "10.96.0.11");
    std::fs::write(
        &file,
        join(&[a.as_bytes(), &svc_with_bad_byte("b", "10.96.0.12")]),
    )
    .expect("write");
    let (next, errors, events) = state.merge(load_path_detailed(&file));
    assert_eq!(events.len(), 1, "{events:#?}");
    assert!(
        matches!(&events[0], SourceEvent::ServiceUpsert(s) if s.name == nn("default", "a")
            && s.cluster_ips == [ip("10.96.0.11")])
    );
    // b keeps its last good version: still applied, nothing sent for it.
    assert!(next.holds(&crate::manifests::ObjectKey::Service(nn("default", "b"))));
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(
        errors[0]
            .to_string()
            .ends_with("; keeping every object this file defined at its last good load"),
        "{errors:?}"
    );
}

/// Whether a text could be taken for more than one log line, or carries a terminal escape.
fn has_raw_controls(text: &str) -> bool {
    text.chars().any(char::is_control)
}

#[test]
fn errors_escape_what_the_manifest_wrote() {
    let forged = "apiVersion: v1\nkind: Service\nmetadata:\n  name: \"x\\nERROR forged log \
        line\"\nspec:\n  ports:\n  - port: 80\n";
    let (set, errors) = parse(forged);
    assert!(set.is_empty());
    assert_eq!(errors.len(), 1, "{errors:#?}");
    assert!(!has_raw_controls(&errors[0]), "{:?}", errors[0]);
    assert!(
        errors[0].starts_with(
            "t.yaml:1: Service default/x\\nERROR forged log line: metadata.name: \"x\\nERROR \
             forged log line\" is not valid"
        ),
        "{:?}",
        errors[0]
    );

    // A terminal escape in the namespace, in a map key of the wrong type (the field path) and
    // in a value a parser error quotes.
    let ansi = [
        "apiVersion: v1\nkind: Service\nmetadata:\n  name: web\n  namespace: \"\\e[31mred\"\n"
            .to_string(),
        "apiVersion: v1\nkind: Service\nmetadata:\n  name: web\n  labels:\n    \"\\e[2Jkey\": [1]\n"
            .to_string(),
        service_yaml("  ports:\n  - port: 80\n    protocol: \"\\e[31mTCP\"\n"),
        slice_yaml("endpoints:\n- addresses: [\"10.0.0.1\\e]8;;http://x\\a\"]\n"),
    ];
    for text in ansi {
        let (_, errors) = parse(&text);
        assert_eq!(errors.len(), 1, "{text}: {errors:#?}");
        assert!(!has_raw_controls(&errors[0]), "{:?}", errors[0]);
        assert!(errors[0].contains("\\u{1b}"), "{:?}", errors[0]);
    }
    let (_, errors) = parse(
        "apiVersion: v1\nkind: Service\nmetadata:\n  name: web\n  namespace: \"\\e[31mred\"\n",
    );
    assert!(
        errors[0].starts_with("t.yaml:1: Service \\u{1b}[31mred/web: metadata.namespace:"),
        "{:?}",
        errors[0]
    );

    // A file name with a newline.
    let e = ManifestError {
        file: "evil\nERROR x.yaml".into(),
        line: Some(3),
        object: Some("document 1".into()),
        field: None,
        message: "m".into(),
    };
    assert_eq!(e.to_string(), "evil\\nERROR x.yaml:3: document 1: m");

    // The API source's errors too.
    let e = ApiObjectError {
        object: ObjectKey::Service(nn("default", "x\nERROR forged log line")),
        field: "spec.type\u{1b}[0m".into(),
        message: "\"a\" \u{1b}]0;title\u{7}".into(),
        kept: true,
    };
    let text = e.to_string();
    assert!(!has_raw_controls(&text), "{text:?}");
    assert_eq!(
        text,
        "Service default/x\\nERROR forged log line: spec.type\\u{1b}[0m: \"a\" \
         \\u{1b}]0;title\\u{7}; keeping the last valid version"
    );
}

#[test]
fn leading_zeros_are_read_as_decimal_with_a_warning() {
    let text =
        "apiVersion: v1\nkind: Service\nmetadata:\n  name: web\nspec:\n  type: LoadBalancer\n  \
        clusterIP: 172.30.0.041\n  clusterIPs: [172.30.0.041]\n  externalIPs: [010.1.2.3]\n  \
        loadBalancerSourceRanges: [010.0.0.0/8, ' 192.168.001.000/024 ', 10.0.0.007]\n  \
        ports:\n  - port: 80\n    nodePort: 30080\nstatus:\n  loadBalancer:\n    ingress:\n    \
        - ip: 203.0.113.009\n---\n"
            .to_string()
            + &slice_yaml("endpoints:\n- addresses: [10.180.00.001]\nports:\n- port: 8080\n")
            + "---\napiVersion: v1\nkind: Node\nmetadata:\n  name: n1\nspec:\n  podCIDR: \
           10.244.01.0/24\nstatus:\n  addresses:\n  - type: InternalIP\n    address: \
           192.168.56.010\n";
    let mut loader = ManifestLoader::new();
    loader.add_text(Path::new("t.yaml"), &text);
    let loaded = loader.finish_detailed();
    assert!(loaded.errors.is_empty(), "{:#?}", loaded.errors);

    let svc = &loaded.set.services[&nn("default", "web")];
    assert_eq!(svc.cluster_ips, [ip("172.30.0.41")]);
    assert_eq!(svc.external_ips, [ip("10.1.2.3")]);
    assert_eq!(svc.load_balancer_ingress[0].ip, ip("203.0.113.9"));
    let ranges: Vec<IpNet> = ["10.0.0.0/8", "192.168.1.0/24", "10.0.0.7/32"]
        .iter()
        .map(|r| r.parse().expect("CIDR"))
        .collect();
    assert_eq!(svc.load_balancer_source_ranges, ranges);
    let slice = &loaded.set.slices[&nn("default", "web-abc")];
    assert_eq!(slice.endpoints[0].address, ip("10.180.0.1"));
    let node = &loaded.set.nodes["n1"];
    assert_eq!(
        node.pod_cidrs,
        ["10.244.1.0/24".parse::<IpNet>().expect("CIDR")]
    );
    assert_eq!(node.addresses, [ip("192.168.56.10")]);

    let warnings: Vec<String> = loaded.warnings.iter().map(ToString::to_string).collect();
    let read = "(decimal, as upstream kube-proxy reads it)";
    assert_eq!(
        warnings,
        [
            format!(
                "t.yaml:1: Service default/web: spec.clusterIPs[0]: \"172.30.0.041\" has leading \
                 zeros; read as 172.30.0.41 {read}"
            ),
            format!(
                "t.yaml:1: Service default/web: spec.externalIPs[0]: \"010.1.2.3\" has leading \
                 zeros; read as 10.1.2.3 {read}"
            ),
            format!(
                "t.yaml:1: Service default/web: status.loadBalancer.ingress[0].ip: \
                 \"203.0.113.009\" has leading zeros; read as 203.0.113.9 {read}"
            ),
            format!(
                "t.yaml:1: Service default/web: spec.loadBalancerSourceRanges[0]: \"010.0.0.0/8\" \
                 has leading zeros; read as 10.0.0.0/8 {read}"
            ),
            format!(
                "t.yaml:1: Service default/web: spec.loadBalancerSourceRanges[1]: \" \
                 192.168.001.000/024 \" has leading zeros; read as 192.168.1.0/24 {read}"
            ),
            format!(
                "t.yaml:1: Service default/web: spec.loadBalancerSourceRanges[2]: \"10.0.0.007\" \
                 has leading zeros; read as 10.0.0.7/32 {read}"
            ),
            format!(
                "t.yaml:19: EndpointSlice default/web-abc: endpoints[0].addresses[0]: \
                 \"10.180.00.001\" has leading zeros; read as 10.180.0.1 {read}"
            ),
            format!(
                "t.yaml:32: Node n1: spec.podCIDR: \"10.244.01.0/24\" has leading zeros; read as \
                 10.244.1.0/24 {read}"
            ),
            format!(
                "t.yaml:32: Node n1: status.addresses[0].address: \"192.168.56.010\" has leading \
                 zeros; read as 192.168.56.10 {read}"
            ),
        ]
    );
}

#[test]
fn leading_zeros_edge_cases() {
    let cluster_ip = |text: &str| {
        let (set, errors) = parse(&service_yaml(&format!(
            "  clusterIP: '{text}'\n  ports:\n  - port: 80\n"
        )));
        match set.services.values().next() {
            Some(svc) => Ok(svc.cluster_ips[0]),
            None => Err(errors.join("\n")),
        }
    };
    // Decimal, never octal; any number of zeros; the last 32 bits of an IPv6 address too.
    assert_eq!(cluster_ip("010.010.010.010"), Ok(ip("10.10.10.10")));
    assert_eq!(cluster_ip("0000000010.0.0.08"), Ok(ip("10.0.0.8")));
    assert_eq!(cluster_ip("fd00::10.096.0.010"), Ok(ip("fd00::a60:a")));
    // Still invalid: out of range, too few or too many parts, signs, spaces, mapped IPv6.
    for bad in [
        "10.0.0.256",
        "010.0.0.0256",
        "10.0.01",
        "10.0.0.01.1",
        "10.0.0.+1",
        "10.0.0. 1",
        "10..0.1",
        "::ffff:010.0.0.1",
    ] {
        let e = cluster_ip(bad).expect_err(bad);
        assert!(e.contains("spec.clusterIP"), "{bad}: {e}");
    }
    // A CIDR prefix out of range stays an error.
    let (set, errors) = parse(&service_yaml(
        "  loadBalancerSourceRanges: [010.0.0.0/33]\n  ports:\n  - port: 80\n",
    ));
    assert!(set.is_empty());
    assert!(
        errors[0].contains("\"010.0.0.0/33\" is not a valid CIDR"),
        "{errors:?}"
    );
}

#[test]
fn headless_labelled_services_are_ignored() {
    let labelled = service_yaml("  clusterIP: 10.96.0.5\n  ports:\n  - port: 80\n").replace(
        "metadata:\n",
        "metadata:\n  labels:\n    service.kubernetes.io/headless: \"\"\n",
    );
    let (set, errors) = parse(&labelled);
    assert!(errors.is_empty(), "{errors:?}");
    assert!(set.services.is_empty(), "{set:?}");
    // Through conversion, as the API source sees it.
    let svc: k8s_openapi::api::core::v1::Service = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "web", "labels": {"service.kubernetes.io/headless": "x"}},
        "spec": {"clusterIP": "10.96.0.5", "ports": [{"port": 80}]},
    }))
    .expect("service JSON");
    assert!(matches!(
        crate::convert::service(&svc),
        Ok(crate::convert::Converted::Ignored(why)) if why.contains("service.kubernetes.io/headless")
    ));
}
