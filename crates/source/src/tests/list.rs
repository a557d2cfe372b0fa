//! A `kind: List` whose items are loaded while it is parsed: the same objects, errors, lines
//! and duplicates whatever the order of its keys (`kubectl` prints `kind` after `items`),
//! typed lists whose items take the list's kind, and a List that does not parse or is not a
//! List after all loading nothing of its items.

use std::path::Path;

use kp_model::NamespacedName;

use super::parse;
use crate::manifests::{ManifestLoader, ObjectKey};

fn nn(ns: &str, name: &str) -> NamespacedName {
    NamespacedName::new(ns, name)
}

/// The 1-based line of the only line of `text` that ends with `marker` (a comment).
fn line_of(text: &str, marker: &str) -> usize {
    let lines: Vec<usize> = text
        .lines()
        .enumerate()
        .filter(|(_, l)| l.ends_with(marker))
        .map(|(i, _)| i + 1)
        .collect();
    assert_eq!(lines.len(), 1, "{marker:?} in\n{text}");
    lines[0]
}

/// A document made of `parts` (each a key with its value, one or more whole lines), in order.
fn document(parts: &[&str]) -> String {
    parts.concat()
}

/// Six items, each marked by a comment on its first line: a good Service `a`, a Service `b`
/// with a bad port, a string, an EndpointSlice, a second Service `a`, and a Node.
const ITEMS: &str = "items:
- apiVersion: v1  # a
  kind: Service
  metadata:
    name: a
    namespace: default
  spec:
    clusterIP: 10.96.0.5
    ports:
    - port: 80
- apiVersion: v1  # b
  kind: Service
  metadata: {name: b, namespace: default}
  spec:
    ports:
    - port: 70000
- just a string  # string
- addressType: IPv4  # slice
  apiVersion: discovery.k8s.io/v1
  endpoints:
  - addresses: [10.0.0.1]
  kind: EndpointSlice
  metadata:
    labels: {kubernetes.io/service-name: a}
    name: a-1
    namespace: default
- {apiVersion: v1, kind: Service, metadata: {name: a}, spec: {ports: [{port: 81}]}}  # again
- apiVersion: v1  # node
  kind: Node
  metadata: {name: n1}
";

/// What a List of [`ITEMS`] loads, in any order of its keys: the same objects, and the same
/// errors at the lines of the items concerned.
#[test]
fn a_list_loads_the_same_whatever_the_order_of_its_keys() {
    let api = "apiVersion: v1\n";
    let kind = "kind: List\n";
    let meta = "metadata:\n  resourceVersion: \"\"\n";
    for text in [
        // kubectl's order (keys sorted): kind after items.
        document(&[api, ITEMS, kind, meta]),
        // The API's order: kind and apiVersion first.
        document(&[kind, api, meta, ITEMS]),
        // Items before everything.
        document(&[ITEMS, meta, kind, api]),
        // kind before items, apiVersion after.
        document(&[kind, ITEMS, api]),
    ] {
        let (set, errors) = parse(&text);
        assert_eq!(
            errors,
            [
                format!(
                    "t.yaml:{}: Service default/b: spec.ports[0].port: 70000 is out of range 1-65535",
                    line_of(&text, "# b")
                ),
                format!(
                    "t.yaml:{}: document 1 items[2]: expected a Kubernetes object (a mapping with \
                     apiVersion and kind), found a string",
                    line_of(&text, "# string")
                ),
                format!(
                    "t.yaml:{}: Service default/a: duplicate definition, first defined at t.yaml:{}",
                    line_of(&text, "# again"),
                    line_of(&text, "# a")
                ),
            ],
            "{text}"
        );
        assert_eq!(
            set.services.keys().collect::<Vec<_>>(),
            [&nn("default", "a")]
        );
        assert_eq!(set.services[&nn("default", "a")].ports[0].port, 80);
        assert_eq!(
            set.slices.keys().collect::<Vec<_>>(),
            [&nn("default", "a-1")]
        );
        assert!(set.nodes.contains_key("n1"));
    }
}

/// Items of a typed list (`ServiceList`, as the API prints it) without their own `kind` and
/// `apiVersion` take the list's, also when the list's come after the items; an item that has
/// its own loads as what it is, once.
#[test]
fn a_typed_list_fills_in_its_items_whatever_the_order_of_its_keys() {
    let items = "items:
- apiVersion: v1  # node
  kind: Node
  metadata: {name: n1}
- metadata: {name: a}  # a
  spec:
    ports:
    - port: 80
- metadata: {name: b}  # b
  spec:
    ports:
    - port: 0
- metadata: {name: a}  # again
  spec:
    ports:
    - port: 81
- kind: Service  # own-kind
  metadata: {name: c}
  spec:
    ports:
    - port: 82
";
    let api = "apiVersion: v1\n";
    let kind = "kind: ServiceList\n";
    let meta = "metadata: {resourceVersion: \"1\"}\n";
    for text in [
        document(&[kind, api, meta, items]),
        document(&[api, items, kind, meta]),
        document(&[items, api, kind]),
        document(&[kind, items, api]),
        document(&[api, kind, items]),
    ] {
        let (set, errors) = parse(&text);
        assert_eq!(
            errors,
            [
                format!(
                    "t.yaml:{}: Service default/b: spec.ports[0].port: 0 is out of range 1-65535",
                    line_of(&text, "# b")
                ),
                format!(
                    "t.yaml:{}: Service default/a: duplicate definition, first defined at t.yaml:{}",
                    line_of(&text, "# again"),
                    line_of(&text, "# a")
                ),
            ],
            "{text}"
        );
        assert_eq!(
            set.services.keys().collect::<Vec<_>>(),
            [&nn("default", "a"), &nn("default", "c")],
            "{text}"
        );
        assert_eq!(set.services[&nn("default", "a")].ports[0].port, 80);
        assert_eq!(set.nodes.keys().collect::<Vec<_>>(), ["n1"]);
    }

    // A typed list without apiVersion unpacks nothing, wherever its items are.
    for text in [document(&[kind, items]), document(&[items, kind])] {
        let (set, errors) = parse(&text);
        assert!(set.is_empty(), "{text}");
        assert_eq!(
            errors,
            ["t.yaml:1: document 1: apiVersion: missing in a ServiceList"]
        );
    }
}

/// A List whose text breaks after its items loads none of them (its items are loaded while it
/// is parsed, and undone): one error, the file is not understood whole, and what the file's
/// other documents and other files define is untouched.
#[test]
fn a_list_that_does_not_parse_loads_nothing_of_it() {
    let first =
        "apiVersion: v1\nkind: Service\nmetadata: {name: a}\nspec:\n  ports:\n  - port: 80\n";
    let broken_list = format!(
        "apiVersion: v1\n{}kind: List\nmetadata: {{resourceVersion: [\n",
        ITEMS.replace("name: b,", "name: b2,")
    );
    let mut loader = ManifestLoader::new();
    loader.add_text(
        Path::new("other.yaml"),
        "apiVersion: v1\nkind: Node\nmetadata: {name: n0}\n",
    );
    loader.add_text(Path::new("t.yaml"), &format!("{first}---\n{broken_list}"));
    // Objects the broken List defined (and that were undone) can be defined elsewhere.
    loader.add_text(
        Path::new("later.yaml"),
        "apiVersion: v1\nkind: Node\nmetadata: {name: n1}\n",
    );
    let loaded = loader.finish_detailed();
    let errors: Vec<String> = loaded.errors.iter().map(ToString::to_string).collect();
    assert_eq!(errors.len(), 1, "{errors:#?}");
    assert!(
        errors[0].starts_with("t.yaml:8: document 2: cannot parse YAML: "),
        "{}",
        errors[0]
    );
    assert_eq!(
        loaded.set.services.keys().collect::<Vec<_>>(),
        [&nn("default", "a")]
    );
    assert_eq!(loaded.set.services[&nn("default", "a")].ports[0].port, 80);
    assert!(loaded.set.slices.is_empty());
    assert_eq!(loaded.set.nodes.keys().collect::<Vec<_>>(), ["n0", "n1"]);
    let t = &loaded.files[Path::new("t.yaml")];
    assert_eq!(
        t.objects.iter().collect::<Vec<_>>(),
        [&ObjectKey::Service(nn("default", "a"))]
    );
    assert!(t.rejected.is_empty(), "{:?}", t.rejected);
    assert_eq!(t.incomplete, Some(0));
    assert_eq!(
        loaded.files[Path::new("later.yaml")]
            .objects
            .iter()
            .collect::<Vec<_>>(),
        [&ObjectKey::Node("n1".into())]
    );
    assert!(loaded.warnings.is_empty());
}

/// A document whose `kind`, read after its `items`, is not a list kind is not unpacked: its
/// items load nothing, and the document loads as what it is.
#[test]
fn a_document_that_is_not_a_list_after_all_loads_as_what_it_is() {
    let items = "items:\n- {apiVersion: v1, kind: Node, metadata: {name: n1}}\n- 3\n";
    let (set, errors) = parse(&document(&[
        "apiVersion: v1\n",
        items,
        "kind: ConfigMap\nmetadata: {name: x}\n",
    ]));
    assert!(set.is_empty() && errors.is_empty(), "{set:?} {errors:?}");

    let (set, errors) = parse(&document(&[
        "apiVersion: v1\n",
        items,
        "kind: Service\nmetadata: {name: web}\nspec:\n  ports:\n  - port: 80\n",
    ]));
    assert!(errors.is_empty(), "{errors:?}");
    assert_eq!(
        set.services.keys().collect::<Vec<_>>(),
        [&nn("default", "web")]
    );
    assert!(set.nodes.is_empty());

    // No kind at all, or no apiVersion: the document's own error, nothing of its items.
    let (set, errors) = parse(&document(&["apiVersion: v1\n", items]));
    assert!(set.is_empty());
    assert_eq!(
        errors,
        ["t.yaml:1: document 1: kind: missing; not a Kubernetes object"]
    );
    let (set, errors) = parse(&document(&[items, "kind: List\n"]));
    assert!(set.is_empty());
    assert_eq!(
        errors,
        ["t.yaml:1: document 1: apiVersion: missing in a List"]
    );
}

/// A List inside a List is unpacked as well; its items are located at its own line.
#[test]
fn a_list_inside_a_list() {
    let text = "apiVersion: v1
items:
- apiVersion: v1
  kind: Node
  metadata: {name: n1}
- apiVersion: v1  # inner
  kind: List
  items:
  - {apiVersion: v1, kind: Node, metadata: {name: n2}}
  - {apiVersion: v1, kind: Service, metadata: {name: s}, spec: {ports: [{port: 0}]}}
kind: List
";
    let (set, errors) = parse(text);
    assert_eq!(set.nodes.keys().collect::<Vec<_>>(), ["n1", "n2"]);
    assert_eq!(
        errors,
        [format!(
            "t.yaml:{}: Service default/s: spec.ports[0].port: 0 is out of range 1-65535",
            line_of(text, "# inner")
        )]
    );
}

/// Loads `bytes` as file `path`: from memory with the default limit above which documents
/// are parsed as they are read (so these small ones are parsed from text), and from the file
/// with every document parsed as it is read from the file.
fn both_ways(path: &Path, bytes: &[u8]) -> (crate::manifests::Loaded, crate::manifests::Loaded) {
    std::fs::write(path, bytes).expect("write");
    let mut text = ManifestLoader::new();
    text.add_bytes(path, bytes);
    let mut streamed = ManifestLoader::new();
    streamed.stream_documents_above(0);
    streamed.add_path(path);
    (text.finish_detailed(), streamed.finish_detailed())
}

/// A document parsed as it is read from its file (what a large `kind: List` is) loads exactly
/// what it loads when parsed from text: the same objects, errors (the parser's messages and
/// lines among them), warnings and per-file records, for good and broken documents alike.
#[test]
fn a_document_read_from_its_file_loads_as_one_read_from_text() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("t.yaml");
    let service = "apiVersion: v1\nkind: Service\nmetadata: {name: web}\nspec:\n  clusterIP: \
        10.96.0.010\n  ports:\n  - port: 80\n";
    let mut corpus: Vec<Vec<u8>> = vec![
        document(&["apiVersion: v1\n", ITEMS, "kind: List\n"]).into_bytes(),
        document(&["kind: List\n", ITEMS]).into_bytes(),
        document(&[
            "apiVersion: v1\n",
            "items:\n- metadata: {name: a}\n  spec: {ports: [{port: 80}]}\n",
            "kind: ServiceList\n",
        ])
        .into_bytes(),
        format!("# c\n---\n{service}---\n# only a comment\n---\nkind: [unclosed\n  x: y\n...\n--- {{\"apiVersion\": \"v1\", \"kind\": \"Node\", \"metadata\": {{\"name\": \"n1\"}}}}\n").into_bytes(),
        format!("\u{feff}{service}").into_bytes(),
        format!("{service}\r\n---\r\napiVersion: v1\r\nkind: Node\r\nmetadata: {{name: n2}}\r\n")
            .into_bytes(),
        b"apiVersion: v1\nkind: Service\nmetadata: {name: a}\nspec:\n  ports:\n  - port: 80\n  ports: []\n".to_vec(),
        b"a: b: c\n---\na: *nope\n---\na:\n\t- tab\n---\n\"unterminated\n".to_vec(),
        format!("apiVersion: v1\n{ITEMS}kind: List\nmetadata: {{resourceVersion: [\n").into_bytes(),
        b"just a string\n---\n- 1\n---\nmetadata: {}\n".to_vec(),
    ];
    // Bytes that are not UTF-8: in a List, in a comment between documents.
    let mut bad = document(&["apiVersion: v1\n", ITEMS, "kind: List\n"]).into_bytes();
    bad.splice(15..15, *b"# \xff\n");
    bad.extend_from_slice(b"---\n# \xfe\n---\n");
    bad.extend_from_slice(service.as_bytes());
    corpus.push(bad);
    for bytes in corpus {
        let (text, streamed) = both_ways(&path, &bytes);
        let shown = String::from_utf8_lossy(&bytes);
        assert!(!text.errors.is_empty() || !text.set.is_empty(), "{shown}");
        assert_eq!(streamed.set, text.set, "{shown}");
        assert_eq!(streamed.errors, text.errors, "{shown}");
        assert_eq!(streamed.warnings, text.warnings, "{shown}");
        assert_eq!(streamed.files, text.files, "{shown}");
    }
}
