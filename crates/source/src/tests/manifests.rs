//! Manifest loading: documents, lists, broken documents, directories, duplicates and diffs.

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use kp_model::{NamespacedName, ObjectKind, Protocol, ServiceType, SourceEvent};

use super::{parse, service_yaml, slice_yaml};
use crate::manifests::{
    ManifestError, ManifestLoader, ManifestSet, ObjectKey, load_path, load_path_detailed,
};

fn ip(s: &str) -> IpAddr {
    s.parse().expect("test IP")
}

fn nn(ns: &str, name: &str) -> NamespacedName {
    NamespacedName::new(ns, name)
}

fn seed_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/seed-nginx/cluster.yaml")
}

#[test]
fn seed_nginx_cluster() {
    let (set, errors) = load_path(&seed_path());
    assert!(errors.is_empty(), "{errors:#?}");
    assert_eq!(
        set.nodes.keys().collect::<Vec<_>>(),
        ["k8s-master", "k8s-worker"]
    );
    assert_eq!(set.nodes["k8s-master"].addresses, [ip("192.168.56.10")]);
    assert_eq!(
        set.nodes["k8s-worker"].pod_cidrs[0].to_string(),
        "10.0.1.0/24"
    );

    assert_eq!(set.services.len(), 1);
    let svc = &set.services[&nn("default", "nginx-svc")];
    assert_eq!(svc.service_type, ServiceType::ClusterIp);
    assert_eq!(svc.cluster_ips, [ip("10.96.138.71")]);
    assert_eq!(svc.ports.len(), 1);
    assert_eq!(
        (
            svc.ports[0].name.as_str(),
            svc.ports[0].port,
            svc.ports[0].protocol
        ),
        ("", 8080, Protocol::Tcp)
    );

    assert_eq!(set.slices.len(), 1);
    let slice = &set.slices[&nn("default", "nginx-svc-7xk2p")];
    assert_eq!(slice.service, nn("default", "nginx-svc"));
    let eps: Vec<_> = slice
        .endpoints
        .iter()
        .map(|e| (e.address, e.node_name.as_deref(), e.conditions.ready))
        .collect();
    assert_eq!(
        eps,
        [
            (ip("10.0.0.4"), Some("k8s-master"), true),
            (ip("10.0.1.2"), Some("k8s-worker"), true)
        ]
    );
    assert_eq!(slice.ports.len(), 1);
    assert_eq!(
        (
            slice.ports[0].name.as_str(),
            slice.ports[0].port,
            slice.ports[0].protocol
        ),
        ("", 80, Protocol::Tcp)
    );
}

/// What `kubectl get svc,endpointslices -o yaml` prints.
const KUBECTL_LIST: &str = r#"apiVersion: v1
items:
- apiVersion: v1
  kind: Service
  metadata:
    creationTimestamp: "2024-05-01T10:00:00Z"
    labels:
      component: apiserver
    name: kubernetes
    namespace: default
    resourceVersion: "197"
    uid: 1e0c5bc5-3b1f-4d7e-9d55-2b5e4a0c6a11
  spec:
    clusterIP: 10.96.0.1
    clusterIPs:
    - 10.96.0.1
    internalTrafficPolicy: Cluster
    ipFamilies:
    - IPv4
    ipFamilyPolicy: SingleStack
    ports:
    - name: https
      port: 443
      protocol: TCP
      targetPort: 6443
    sessionAffinity: None
    type: ClusterIP
  status:
    loadBalancer: {}
- addressType: IPv4
  apiVersion: discovery.k8s.io/v1
  endpoints:
  - addresses:
    - 192.168.56.10
    conditions:
      ready: true
      serving: true
      terminating: false
  kind: EndpointSlice
  metadata:
    creationTimestamp: "2024-05-01T10:00:01Z"
    generation: 1
    labels:
      endpointslice.kubernetes.io/skip-mirror: "true"
      kubernetes.io/service-name: kubernetes
    name: kubernetes
    namespace: default
    resourceVersion: "199"
  ports:
  - name: https
    port: 6443
    protocol: TCP
kind: List
metadata:
  resourceVersion: ""
"#;

#[test]
fn kubectl_list_output() {
    let (set, errors) = parse(KUBECTL_LIST);
    assert!(errors.is_empty(), "{errors:#?}");
    assert_eq!(
        set.services[&nn("default", "kubernetes")].ports[0].port,
        443
    );
    let slice = &set.slices[&nn("default", "kubernetes")];
    assert_eq!(slice.endpoints[0].address, ip("192.168.56.10"));
    assert_eq!(slice.ports[0].name, "https");
}

#[test]
fn typed_list_items_without_kind() {
    // The API's own list form: items carry no kind/apiVersion.
    let text = "apiVersion: v1\nkind: ServiceList\nitems:\n- metadata:\n    name: a\n  spec:\n    \
        clusterIP: 10.96.0.5\n    ports:\n    - port: 80\n- metadata:\n    name: b\n  spec:\n    \
        clusterIP: 10.96.0.6\n    ports:\n    - port: 70000\n";
    let (set, errors) = parse(text);
    assert_eq!(
        set.services.keys().collect::<Vec<_>>(),
        [&nn("default", "a")]
    );
    // The error points at the item's first line, not the List's.
    assert_eq!(
        errors,
        ["t.yaml:10: Service default/b: spec.ports[0].port: 70000 is out of range 1-65535"]
    );
    let (set, errors) = parse("apiVersion: v1\nkind: List\nitems: 3\n");
    assert!(set.is_empty());
    assert_eq!(
        errors,
        ["t.yaml:1: document 1: items: expected a list, found a number"]
    );
}

#[test]
fn multi_document_with_broken_document() {
    let text = format!(
        "# leading comment\n---\n{}---\n# only a comment\n---\nkind: [unclosed\n  metadata: x\n---\n\n{}...\n---\n{}",
        service_yaml("  clusterIP: 10.96.0.10\n  ports:\n  - port: 80\n"),
        slice_yaml("endpoints:\n- addresses: [10.0.0.1]\n"),
        service_yaml("  ports:\n  - port: 80\n").replace("name: web", "name: web2"),
    );
    let (set, errors) = parse(&text);
    assert_eq!(
        set.services.keys().collect::<Vec<_>>(),
        [&nn("default", "web"), &nn("default", "web2")]
    );
    assert_eq!(set.slices.len(), 1);
    assert_eq!(errors.len(), 1, "{errors:#?}");
    // The service takes lines 3-11; the broken document is the second non-empty one.
    assert!(
        errors[0].starts_with("t.yaml:15: document 2: cannot parse YAML: "),
        "{}",
        errors[0]
    );
    assert!(!errors[0].contains('\n'));
    // The parser's own line number is the file's line number.
    assert!(errors[0].contains("line 16"), "{}", errors[0]);
}

#[test]
fn bad_ip_among_good_objects() {
    let text = format!(
        "{}---\n{}---\n{}",
        service_yaml("  clusterIP: 10.96.0.10\n  ports:\n  - port: 80\n"),
        service_yaml("  clusterIP: 10.96.0.300\n  ports:\n  - port: 80\n")
            .replace("name: web", "name: bad"),
        slice_yaml("endpoints:\n- addresses: [10.0.0.1]\n"),
    );
    let (set, errors) = parse(&text);
    assert_eq!(
        errors,
        [
            "t.yaml:11: Service default/bad: spec.clusterIP: \"10.96.0.300\" is not a valid IP address"
        ]
    );
    assert_eq!(
        set.services.keys().collect::<Vec<_>>(),
        [&nn("default", "web")]
    );
    assert_eq!(set.slices.len(), 1);
}

#[test]
fn document_level_errors() {
    let (_, errors) = parse("just a string\n---\nmetadata: {}\n---\nkind: Service\n---\n- 1\n");
    assert_eq!(
        errors,
        [
            "t.yaml:1: document 1: expected a Kubernetes object (a mapping with apiVersion and \
             kind), found a string",
            "t.yaml:3: document 2: kind: missing; not a Kubernetes object",
            "t.yaml:5: document 3: apiVersion: missing in a Service",
            "t.yaml:7: document 4: expected a Kubernetes object (a mapping with apiVersion and \
             kind), found a list",
        ]
    );
    // A marker line with content keeps its content; JSON parses as YAML.
    let (set, errors) = parse(
        "--- {\"apiVersion\": \"v1\", \"kind\": \"Node\", \"metadata\": {\"name\": \"n1\"}}\n",
    );
    assert!(errors.is_empty(), "{errors:#?}");
    assert!(set.nodes.contains_key("n1"));
}

#[test]
fn error_display_formats() {
    let e = ManifestError {
        file: "a.yaml".into(),
        line: Some(3),
        object: Some("Service default/x".into()),
        field: Some("spec.ports[0].port".into()),
        message: "70000 is out of range 1-65535".into(),
    };
    assert_eq!(
        e.to_string(),
        "a.yaml:3: Service default/x: spec.ports[0].port: 70000 is out of range 1-65535"
    );
    let e = ManifestError {
        file: "gone.yaml".into(),
        line: None,
        object: None,
        field: None,
        message: "cannot read: x".into(),
    };
    assert_eq!(e.to_string(), "gone.yaml: cannot read: x");
}

#[test]
fn duplicates_keep_the_first() {
    let svc = service_yaml("  clusterIP: 10.96.0.10\n  ports:\n  - port: 80\n");
    let other = service_yaml("  clusterIP: 10.96.0.11\n  ports:\n  - port: 80\n");
    let mut loader = ManifestLoader::new();
    loader.add_text(Path::new("a.yaml"), &svc);
    loader.add_text(
        Path::new("b.yaml"),
        &format!("{}---\n{other}", slice_yaml("endpoints: []\n")),
    );
    let (set, errors) = loader.finish();
    let errors: Vec<String> = errors.iter().map(ToString::to_string).collect();
    assert_eq!(
        errors,
        ["b.yaml:11: Service default/web: duplicate definition, first defined at a.yaml:1"]
    );
    assert_eq!(
        set.services[&nn("default", "web")].cluster_ips,
        [ip("10.96.0.10")]
    );
    assert_eq!(set.slices.len(), 1);
}

#[cfg(unix)]
#[test]
fn directory_loading() {
    use std::os::unix::fs::symlink;
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path();
    let write = |rel: &str, text: &str| {
        let path = root.join(rel);
        std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
        std::fs::write(path, text).expect("write");
    };
    let svc = |name: &str| {
        service_yaml("  ports:\n  - port: 80\n").replace("name: web", &format!("name: {name}"))
    };
    write("b.yaml", &svc("b"));
    write("a/nested.yml", &svc("nested"));
    write(
        "c.json",
        r#"{"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"}}"#,
    );
    write("notes.txt", "not: [yaml");
    write(".hidden.yaml", "not: [yaml");
    write(".git/x.yaml", "not: [yaml");
    // A ConfigMap mount: visible links into ..data, which links to a hidden timestamped dir.
    write(
        "cm/..2024_05_01_10_00_00.123/svc.yaml",
        &svc("from-configmap"),
    );
    symlink("..2024_05_01_10_00_00.123", root.join("cm/..data")).expect("symlink");
    symlink("..data/svc.yaml", root.join("cm/svc.yaml")).expect("symlink");
    // A link loop must not hang.
    symlink("..", root.join("a/loop")).expect("symlink");

    let (set, errors) = load_path(root);
    assert!(errors.is_empty(), "{errors:#?}");
    let names: Vec<&str> = set.services.keys().map(|k| k.name.as_str()).collect();
    assert_eq!(names, ["b", "from-configmap", "nested"]);
    assert!(set.nodes.contains_key("n1"));

    // A file named directly is read whatever its extension.
    write("svc.conf", &svc("conf"));
    let (set, errors) = load_path(&root.join("svc.conf"));
    assert!(errors.is_empty(), "{errors:#?}");
    assert!(set.services.contains_key(&nn("default", "conf")));

    // A missing path is one error naming it.
    let missing = root.join("missing.yaml");
    let (set, errors) = load_path(&missing);
    assert!(set.is_empty());
    assert_eq!(errors.len(), 1);
    assert!(
        errors[0]
            .to_string()
            .starts_with(&format!("{}: cannot read: ", missing.display()))
    );
}

#[test]
fn diff_and_initial_events() {
    let base = format!(
        "{}---\n{}---\napiVersion: v1\nkind: Node\nmetadata:\n  name: n1\n",
        service_yaml("  clusterIP: 10.96.0.10\n  ports:\n  - port: 80\n"),
        slice_yaml("endpoints:\n- addresses: [10.0.0.1]\n- addresses: [10.0.0.2]\n"),
    );
    let (old, errors) = parse(&base);
    assert!(errors.is_empty(), "{errors:#?}");

    let initial = old.initial_events();
    assert_eq!(initial.len(), 6);
    assert!(matches!(initial[0], SourceEvent::ServiceUpsert(_)));
    assert!(matches!(initial[1], SourceEvent::SliceUpsert(_)));
    assert!(matches!(initial[2], SourceEvent::NodeUpsert(_)));
    assert_eq!(
        initial[3..],
        [
            SourceEvent::Synced(ObjectKind::Service),
            SourceEvent::Synced(ObjectKind::EndpointSlice),
            SourceEvent::Synced(ObjectKind::Node),
        ]
    );
    assert!(old.diff(&old).is_empty());
    assert_eq!(ManifestSet::default().initial_events().len(), 3);

    // Remove an endpoint, delete the node, add a Service.
    let newer_text = format!(
        "{}---\n{}---\n{}",
        service_yaml("  clusterIP: 10.96.0.10\n  ports:\n  - port: 80\n"),
        slice_yaml("endpoints:\n- addresses: [10.0.0.1]\n"),
        service_yaml("  ports:\n  - port: 81\n").replace("name: web", "name: web2"),
    );
    let (newer, errors) = parse(&newer_text);
    assert!(errors.is_empty(), "{errors:#?}");
    let events = old.diff(&newer);
    assert_eq!(events.len(), 3, "{events:#?}");
    assert!(matches!(&events[0], SourceEvent::ServiceUpsert(s) if s.name == nn("default", "web2")));
    assert!(matches!(&events[1], SourceEvent::SliceUpsert(s) if s.endpoints.len() == 1));
    assert_eq!(events[2], SourceEvent::NodeDelete("n1".into()));

    let gone = old.diff(&ManifestSet::default());
    assert_eq!(
        gone,
        [
            SourceEvent::ServiceDelete(nn("default", "web")),
            SourceEvent::SliceDelete(nn("default", "web-abc")),
            SourceEvent::NodeDelete("n1".into()),
        ]
    );
}

#[test]
fn list_item_errors_point_at_the_item() {
    // Four items after a comment and a leading document marker; the fourth (items[3]) is a
    // Service with a bad port, the third is not an object, and one item is in flow style.
    let text = "# dump\n---\napiVersion: v1\nkind: List\nmetadata: {}\nitems:\n\
        - apiVersion: v1\n  kind: Node\n  metadata:\n    name: n1\n\
        - {apiVersion: v1, kind: Node, metadata: {name: n2}}\n\
        - just a string\n\
        -\n  apiVersion: v1\n  kind: Service\n  metadata:\n    name: web\n  spec:\n    \
        ports:\n    - port: 0\n";
    let (set, errors) = parse(text);
    assert_eq!(set.nodes.len(), 2);
    assert_eq!(
        errors,
        [
            "t.yaml:12: document 1 items[2]: expected a Kubernetes object (a mapping with \
             apiVersion and kind), found a string",
            "t.yaml:14: Service default/web: spec.ports[0].port: 0 is out of range 1-65535",
        ]
    );
    // Lists keep working when `items` holds something else, or nothing.
    let (set, errors) = parse("apiVersion: v1\nkind: List\nitems:\n");
    assert!(set.is_empty() && errors.is_empty(), "{errors:?}");
    let (_, errors) = parse("apiVersion: v1\nkind: List\nitems: {a: 1}\n");
    assert_eq!(
        errors,
        ["t.yaml:1: document 1: items: expected a list, found a mapping"]
    );
}

#[test]
fn parser_messages_speak_to_operators() {
    let text = service_yaml("  ports:\n  - port: 80\n  ports:\n  - port: 81\n");
    let (_, errors) = parse(&text);
    assert_eq!(
        errors,
        ["t.yaml:1: document 1: cannot parse YAML: duplicate key \"ports\" at line 9, column 3"]
    );
    for (message, wanted) in [
        (
            "duplicate mapping key: a, set DuplicateKeyPolicy in Options if acceptable",
            "duplicate mapping key: a",
        ),
        (
            "cannot deserialize null into string; use Option<String>",
            "cannot deserialize null into string",
        ),
        (
            "!!binary scalar is not valid UTF-8 so cannot be stored into string. If you just \
             use !!binary for documentation/annotation, set ignore_binary_tag_for_string in Options",
            "!!binary scalar is not valid UTF-8 so cannot be stored into string",
        ),
        (
            "invalid type: string \"a, b\", expected u16",
            "invalid type: string \"a, b\", expected u16",
        ),
    ] {
        assert_eq!(crate::manifests::strip_library_hints(message), wanted);
    }
    // No parser message in the usual mistakes carries a library hint.
    for broken in [
        "kind: [unclosed\n",
        "a: b: c\n",
        "a: 1\n a: 2\n",
        "a: *nope\n",
        "a: !!binary 'not base64!'\n",
        "\"unterminated\n",
        "a:\n\t- tab\n",
    ] {
        for e in super::errors_only(broken) {
            assert!(
                !e.contains("Options") && !e.contains("Option<") && !e.contains("Policy"),
                "{e}"
            );
            assert!(!e.contains('\n'), "{e}");
        }
    }
}

#[test]
fn large_list_within_parser_limits() {
    // More nodes than the parser's default limit of 250,000 in one document.
    let mut text = String::from("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: big\ndata: [");
    for _ in 0..260_000 {
        text.push_str("0,");
    }
    text.push_str("0]\n---\napiVersion: v1\nkind: Node\nmetadata:\n  name: n1\n");
    let (set, errors) = parse(&text);
    assert!(errors.is_empty(), "{errors:?}");
    assert!(set.nodes.contains_key("n1"));
}

#[test]
fn detailed_load_tells_what_each_file_defined() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path();
    let svc = |name: &str, port: &str| {
        service_yaml(&format!("  ports:\n  - port: {port}\n"))
            .replace("name: web", &format!("name: {name}"))
    };
    std::fs::write(
        root.join("a.yaml"),
        format!("{}---\n{}", svc("good", "80"), svc("bad", "0")),
    )
    .expect("write");
    std::fs::write(
        root.join("b.yaml"),
        format!("{}---\nkind: [\n", svc("other", "80")),
    )
    .expect("write");
    std::fs::write(
        root.join("c.yaml"),
        "apiVersion: v1\nkind: Service\nmetadata: {}\n",
    )
    .expect("write");
    std::fs::create_dir(root.join("sub")).expect("mkdir");

    let loaded = load_path_detailed(root);
    assert_eq!(loaded.directories, [root.to_path_buf(), root.join("sub")]);
    assert!(loaded.unreadable.is_empty());
    let a = &loaded.files[&root.join("a.yaml")];
    assert_eq!(
        a.objects.iter().collect::<Vec<_>>(),
        [&ObjectKey::Service(nn("default", "good"))]
    );
    assert_eq!(a.rejected.len(), 1);
    assert_eq!(a.rejected[0].0, ObjectKey::Service(nn("default", "bad")));
    assert!(
        loaded.errors[a.rejected[0].1]
            .to_string()
            .contains("port: 0 is out of range")
    );
    assert_eq!(a.incomplete, None);
    let b = &loaded.files[&root.join("b.yaml")];
    assert_eq!(b.objects.len(), 1);
    let position = b.incomplete.expect("b.yaml does not parse");
    assert!(
        loaded.errors[position]
            .message
            .starts_with("cannot parse YAML")
    );
    // An object without a name cannot be identified: its file is incomplete.
    let c = &loaded.files[&root.join("c.yaml")];
    assert!(c.objects.is_empty() && c.rejected.is_empty());
    assert!(c.incomplete.is_some());
    assert_eq!(ObjectKey::Node("n1".into()).to_string(), "Node n1");
    assert_eq!(ObjectKey::Node("n1".into()).kind(), ObjectKind::Node);

    let missing = root.join("missing");
    let loaded = load_path_detailed(&missing);
    assert_eq!(loaded.unreadable, [(missing, 0)]);
    assert!(loaded.files.is_empty() && loaded.directories.is_empty());
}

/// `kind: ServiceCIDR` (`networking.k8s.io/v1`, also in a `ServiceCIDRList`) loads; what the
/// API server refuses is an error naming the object and the field, and only that object is
/// skipped; another `apiVersion` is skipped with a warning, as for the other kinds.
#[test]
fn service_cidrs_load_from_manifests() {
    let text = "apiVersion: networking.k8s.io/v1\nkind: ServiceCIDR\nmetadata:\n  name: kubernetes\n\
                spec:\n  cidrs: [10.96.0.0/12, 'fd00:96::/112']\nstatus:\n  conditions:\n  - type: Ready\n    status: 'True'\n    \
                lastTransitionTime: '2026-01-01T00:00:00Z'\n    reason: ''\n    message: ''\n\
                ---\n\
                apiVersion: networking.k8s.io/v1\nkind: ServiceCIDRList\nitems:\n\
                - metadata:\n    name: extra\n  spec:\n    cidrs: [10.0.200.1/24]\n\
                - metadata:\n    name: three\n  spec:\n    cidrs: [10.1.0.0/16, 10.2.0.0/16, 'fd00::/64']\n\
                - metadata:\n    name: two-v4\n  spec:\n    cidrs: [10.1.0.0/16, 10.2.0.0/16]\n\
                - metadata:\n    name: bad\n  spec:\n    cidrs: [10.1.0.0/33]\n\
                ---\n\
                apiVersion: networking.k8s.io/v1beta1\nkind: ServiceCIDR\nmetadata:\n  name: old\n\
                spec:\n  cidrs: [10.3.0.0/16]\n";
    let (set, errors) = parse(text);
    let cidrs = |name: &str| -> Vec<String> {
        set.service_cidrs[name]
            .cidrs
            .iter()
            .map(ToString::to_string)
            .collect()
    };
    assert_eq!(
        set.service_cidrs.keys().collect::<Vec<_>>(),
        ["extra", "kubernetes"]
    );
    assert_eq!(cidrs("kubernetes"), ["10.96.0.0/12", "fd00:96::/112"]);
    // Host bits are cleared, as Go's ParseCIDR does.
    assert_eq!(cidrs("extra"), ["10.0.200.0/24"]);
    assert_eq!(
        errors,
        [
            "t.yaml:22: ServiceCIDR three: spec.cidrs: 3 CIDRs listed; at most 2 are allowed (one per IP family)",
            "t.yaml:26: ServiceCIDR two-v4: spec.cidrs: 10.1.0.0/16 and 10.2.0.0/16 are of the same IP family; at most one CIDR per family is allowed",
            "t.yaml:30: ServiceCIDR bad: spec.cidrs[0]: \"10.1.0.0/33\" is not a valid CIDR",
        ]
    );
    assert!(set.contains(&ObjectKey::ServiceCidr("extra".into())));

    // Events: an upsert each, no Synced for ServiceCIDRs; a change and a delete.
    let initial = set.initial_events();
    assert!(initial.contains(&SourceEvent::ServiceCidrUpsert(
        set.service_cidrs["kubernetes"].clone()
    )));
    assert!(!initial.contains(&SourceEvent::Synced(ObjectKind::ServiceCidr)));
    let mut newer = set.clone();
    newer.service_cidrs.remove("kubernetes");
    assert_eq!(
        set.diff(&newer),
        [SourceEvent::ServiceCidrDelete("kubernetes".into())]
    );
    assert_eq!(
        ObjectKey::ServiceCidr("a\nb".into()).to_string(),
        "ServiceCIDR a\\nb"
    );
}
