//! What the test API server serves besides the list/watch of Services, EndpointSlices,
//! Nodes and ServiceCIDRs: enough of the API for `kubectl apply`, `kubectl get`, `kubectl patch` and
//! `kubectl label` on the objects a deployment consists of.
//!
//! - **Discovery** as a server without aggregated discovery answers it: `/api`, `/api/v1`,
//!   `/apis`, `/apis/GROUP` and `/apis/GROUP/VERSION` ([`RESOURCES`] lists what is served).
//! - **OpenAPI v3**, as much as kubectl reads before `apply` and `create`: `/openapi/v3` and
//!   one document per group version whose `PATCH` operations name their kind and accept
//!   `fieldValidation` and `dryRun`. That tells kubectl the server validates fields itself,
//!   so a plain `kubectl apply -f` sends `fieldValidation=Strict` and checks nothing on its
//!   side (there are no schemas: kubectl's own validation would need OpenAPI v2).
//! - **Objects** of every kind in [`RESOURCES`]: `GET` one object or a list, `POST` to create
//!   (`409 AlreadyExists` when it exists), `PATCH` with a JSON merge patch
//!   (`application/merge-patch+json`, what `kubectl label` and `kubectl patch --type merge`
//!   send), `DELETE`. `dryRun=All` on `POST` and `PATCH` answers as if it had stored the
//!   object and stores nothing (`kubectl apply --dry-run=server`). Services, EndpointSlices,
//!   Nodes and ServiceCIDRs go to the store the watches read (a `PATCH` of a Node reaches its
//!   watchers); the other kinds are kept here. A kind the test stopped serving
//!   (`TestApiServer::set_served`) is `404` here too.
//! - **Strict decoding**, as the real server's `fieldValidation=Strict`: an object is decoded
//!   into its k8s-openapi type and encoded again, and a field that did not survive is
//!   answered `400 BadRequest` `strict decoding error: unknown field "spec.x"`; a field of
//!   the wrong type or a missing required one likewise (with its path). A DaemonSet or Job
//!   whose `spec.selector.matchLabels` do not match its template's labels is `422 Invalid`,
//!   as the real server's validation answers. A strategic merge patch is `415` (this server
//!   does not know the strategies); send a merge patch.

use std::collections::BTreeMap;

use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use super::{ApiKind, Shared, json_response, status};

/// One resource the server serves: group (`""` for the core group), version, plural name,
/// kind, and whether it lives in a namespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Resource {
    /// The API group; `""` is the core group (`/api/v1`).
    pub group: &'static str,
    /// The version (`v1`).
    pub version: &'static str,
    /// The plural resource name in paths (`configmaps`).
    pub plural: &'static str,
    /// The `kind`.
    pub kind: &'static str,
    /// Whether objects live in a namespace.
    pub namespaced: bool,
}

impl Resource {
    /// `apiVersion` of the objects (`v1`, `apps/v1`).
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_string()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    fn watched(&self) -> Option<ApiKind> {
        ApiKind::ALL.into_iter().find(|k| k.kind() == self.kind)
    }
}

const fn res(
    group: &'static str,
    version: &'static str,
    plural: &'static str,
    kind: &'static str,
    namespaced: bool,
) -> Resource {
    Resource {
        group,
        version,
        plural,
        kind,
        namespaced,
    }
}

/// Every resource served: the four the proxy watches, and what `deploy/` and a kubeadm
/// cluster's kube-proxy consist of.
pub const RESOURCES: [Resource; 11] = [
    res("", "v1", "services", "Service", true),
    res("", "v1", "nodes", "Node", false),
    res("", "v1", "configmaps", "ConfigMap", true),
    res("", "v1", "serviceaccounts", "ServiceAccount", true),
    res("", "v1", "namespaces", "Namespace", false),
    res(
        "discovery.k8s.io",
        "v1",
        "endpointslices",
        "EndpointSlice",
        true,
    ),
    res(
        "networking.k8s.io",
        "v1",
        "servicecidrs",
        "ServiceCIDR",
        false,
    ),
    res("apps", "v1", "daemonsets", "DaemonSet", true),
    res("batch", "v1", "jobs", "Job", true),
    res(
        "rbac.authorization.k8s.io",
        "v1",
        "clusterroles",
        "ClusterRole",
        false,
    ),
    res(
        "rbac.authorization.k8s.io",
        "v1",
        "clusterrolebindings",
        "ClusterRoleBinding",
        false,
    ),
];

/// Identity of an object kept here.
type Key = (&'static str, String, String);

/// The objects of the kinds the watches do not serve, by (plural, namespace, name).
#[derive(Default)]
pub(super) struct Objects {
    objects: BTreeMap<Key, Value>,
}

/// A request path taken apart.
struct Target {
    resource: Resource,
    namespace: Option<String>,
    name: Option<String>,
}

fn parse_path(path: &str) -> Option<Target> {
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (group, version, rest) = match parts.as_slice() {
        ["api", version, rest @ ..] => ("", *version, rest),
        ["apis", group, version, rest @ ..] => (*group, *version, rest),
        _ => return None,
    };
    let (namespace, rest) = match rest {
        ["namespaces", ns, rest @ ..] if !rest.is_empty() => (Some(ns.to_string()), rest),
        rest => (None, rest),
    };
    let (plural, name) = match rest {
        [plural] => (*plural, None),
        [plural, name] => (*plural, Some(name.to_string())),
        _ => return None,
    };
    let resource = RESOURCES
        .into_iter()
        .find(|r| r.group == group && r.version == version && r.plural == plural)?;
    if namespace.is_some() && !resource.namespaced {
        return None;
    }
    Some(Target {
        resource,
        namespace,
        name,
    })
}

/// A `Status` answer naming the object, as the real server's (`kubectl` reads `reason`).
fn object_status(code: StatusCode, reason: &str, message: &str, target: &Target) -> Response {
    let mut body = super::status_json(code.as_u16(), reason, message);
    body["details"] = json!({
        "name": target.name.clone().unwrap_or_default(),
        "group": target.resource.group,
        "kind": target.resource.plural,
    });
    (
        code,
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

/// Answers everything the list/watch handler does not: discovery, and the object verbs.
pub(super) fn handle(
    shared: &Shared,
    method: &Method,
    path: &str,
    query: &std::collections::HashMap<String, String>,
    headers: &HeaderMap,
    body: &[u8],
) -> Response {
    if method == Method::GET
        && let Some(doc) = discovery(path)
    {
        return json_response(&doc);
    }
    let Some(target) = parse_path(path) else {
        return super::discovery(path);
    };
    if let Some(kind) = target.resource.watched()
        && shared.lock().unserved.contains(&kind)
    {
        return status(
            StatusCode::NOT_FOUND,
            "NotFound",
            &format!("the server could not find the requested resource ({path})"),
        );
    }
    let dry_run = query.get("dryRun").is_some_and(|v| v == "All");
    // Strict unless the client asks for less (the real server's default is `Warn`).
    let lenient = matches!(
        query.get("fieldValidation").map(String::as_str),
        Some("Ignore" | "Warn")
    );
    match (method.clone(), target.name.is_some()) {
        (Method::GET, true) => get(shared, &target),
        (Method::GET, false) => list(shared, &target),
        (Method::POST, false) => create(shared, &target, body, dry_run, lenient),
        (Method::PATCH, true) => patch(shared, &target, headers, body, dry_run, lenient),
        (Method::DELETE, true) => delete(shared, &target),
        _ => status(
            StatusCode::METHOD_NOT_ALLOWED,
            "MethodNotAllowed",
            &format!("the test API server does not serve {method} {path}"),
        ),
    }
}

/// The current object at `target`, with `apiVersion` and `kind`.
fn current(shared: &Shared, target: &Target) -> Option<Value> {
    let name = target.name.as_deref()?;
    let namespace = target.namespace.clone().unwrap_or_default();
    let mut object = match target.resource.watched() {
        Some(kind) => shared.lock().objects.iter().find_map(|(k, v)| {
            (k.kind == kind && k.name == name && (!kind.namespaced() || k.namespace == namespace))
                .then(|| v.clone())
        })?,
        None => shared
            .lock()
            .others
            .objects
            .get(&(target.resource.plural, namespace, name.to_string()))?
            .clone(),
    };
    if let Some(map) = object.as_object_mut() {
        map.insert("apiVersion".into(), target.resource.api_version().into());
        map.insert("kind".into(), target.resource.kind.into());
    }
    Some(object)
}

fn not_found(target: &Target) -> Response {
    object_status(
        StatusCode::NOT_FOUND,
        "NotFound",
        &format!(
            "{} \"{}\" not found",
            target.resource.plural,
            target.name.as_deref().unwrap_or("")
        ),
        target,
    )
}

fn get(shared: &Shared, target: &Target) -> Response {
    match current(shared, target) {
        Some(object) => json_response(&object),
        None => not_found(target),
    }
}

/// A list of the kinds kept here (the watched kinds' lists are the list/watch handler's).
fn list(shared: &Shared, target: &Target) -> Response {
    let store = shared.lock();
    let rv = store.rv;
    let items: Vec<Value> = store
        .others
        .objects
        .iter()
        .filter(|((plural, ns, _), _)| {
            *plural == target.resource.plural
                && target.namespace.as_ref().is_none_or(|want| want == ns)
        })
        .map(|(_, v)| v.clone())
        .collect();
    json_response(&json!({
        "kind": format!("{}List", target.resource.kind),
        "apiVersion": target.resource.api_version(),
        "metadata": {"resourceVersion": rv.to_string()},
        "items": items,
    }))
}

fn create(shared: &Shared, target: &Target, body: &[u8], dry_run: bool, lenient: bool) -> Response {
    let mut object: Value = match serde_json::from_slice(body) {
        Ok(v) => v,
        Err(e) => {
            return status(
                StatusCode::BAD_REQUEST,
                "BadRequest",
                &format!("cannot decode the body as JSON: {e}"),
            );
        }
    };
    let name = object
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    let target = Target {
        resource: target.resource,
        namespace: if target.resource.namespaced {
            Some(
                object
                    .pointer("/metadata/namespace")
                    .and_then(Value::as_str)
                    .map(str::to_string)
                    .or_else(|| target.namespace.clone())
                    .unwrap_or_else(|| "default".into()),
            )
        } else {
            None
        },
        name: Some(name.clone()),
    };
    if name.is_empty() {
        return object_status(
            StatusCode::UNPROCESSABLE_ENTITY,
            "Invalid",
            &format!(
                "{} is invalid: metadata.name: Required value",
                target.resource.kind
            ),
            &target,
        );
    }
    if let Err(e) = validate(target.resource, &object, lenient) {
        return e.response(&target);
    }
    if current(shared, &target).is_some() {
        return object_status(
            StatusCode::CONFLICT,
            "AlreadyExists",
            &format!("{} \"{name}\" already exists", target.resource.plural),
            &target,
        );
    }
    if let Some(ns) = &target.namespace
        && let Some(meta) = object.get_mut("metadata").and_then(Value::as_object_mut)
    {
        meta.insert("namespace".into(), ns.clone().into());
    }
    store_object(shared, &target, object, dry_run, StatusCode::CREATED)
}

fn patch(
    shared: &Shared,
    target: &Target,
    headers: &HeaderMap,
    body: &[u8],
    dry_run: bool,
    lenient: bool,
) -> Response {
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if !content_type.starts_with("application/merge-patch+json") {
        return status(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "UnsupportedMediaType",
            &format!(
                "the test API server applies JSON merge patches only, not {content_type:?} (kubectl patch --type merge)"
            ),
        );
    }
    let patch: Value = match serde_json::from_slice(body) {
        Ok(v) => v,
        Err(e) => {
            return status(
                StatusCode::BAD_REQUEST,
                "BadRequest",
                &format!("cannot decode the patch: {e}"),
            );
        }
    };
    let Some(mut object) = current(shared, target) else {
        return not_found(target);
    };
    merge_patch(&mut object, &patch);
    if let Err(e) = validate(target.resource, &object, lenient) {
        return e.response(target);
    }
    store_object(shared, target, object, dry_run, StatusCode::OK)
}

fn delete(shared: &Shared, target: &Target) -> Response {
    let Some(object) = current(shared, target) else {
        return not_found(target);
    };
    let name = target.name.clone().unwrap_or_default();
    let namespace = target.namespace.clone().unwrap_or_default();
    match target.resource.watched() {
        Some(kind) => {
            shared.delete(kind, &namespace, &name);
        }
        None => {
            shared
                .lock()
                .others
                .objects
                .remove(&(target.resource.plural, namespace, name));
        }
    }
    json_response(&object)
}

/// [`super::TestApiServer::apply_value`]: stores `object` (of any kind in [`RESOURCES`],
/// found by its `apiVersion` and `kind`) as a create or a replace would, after the same
/// strict validation; `Err` with the message a client would get.
pub(super) fn apply(shared: &Shared, mut object: Value) -> Result<(), String> {
    let api_version = object
        .get("apiVersion")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    let kind = object
        .get("kind")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    let resource = RESOURCES
        .into_iter()
        .find(|r| r.kind == kind && r.api_version() == api_version)
        .ok_or_else(|| format!("the test API server does not serve {api_version} {kind}"))?;
    let name = object
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .filter(|n| !n.is_empty())
        .ok_or_else(|| format!("{kind} is invalid: metadata.name: Required value"))?
        .to_string();
    let namespace = resource.namespaced.then(|| {
        object
            .pointer("/metadata/namespace")
            .and_then(Value::as_str)
            .filter(|n| !n.is_empty())
            .unwrap_or("default")
            .to_string()
    });
    if let (Some(ns), Some(meta)) = (
        &namespace,
        object.get_mut("metadata").and_then(Value::as_object_mut),
    ) {
        meta.insert("namespace".into(), ns.clone().into());
    }
    validate(resource, &object, false).map_err(|e| format!("{kind} {name}: {}", e.message))?;
    let target = Target {
        resource,
        namespace,
        name: Some(name.clone()),
    };
    let response = store_object(shared, &target, object, false, StatusCode::OK);
    if response.status().is_success() {
        Ok(())
    } else {
        Err(format!("{kind} {name}: HTTP {}", response.status()))
    }
}

/// Stores (unless `dry_run`) and answers the object as stored, with `code`.
fn store_object(
    shared: &Shared,
    target: &Target,
    mut object: Value,
    dry_run: bool,
    code: StatusCode,
) -> Response {
    if let Some(map) = object.as_object_mut() {
        map.insert("apiVersion".into(), target.resource.api_version().into());
        map.insert("kind".into(), target.resource.kind.into());
    }
    if target.resource.watched().is_some() {
        if dry_run {
            return with_code(json_response(&object), code);
        }
        if let Err(e) = shared.upsert(object.clone()) {
            return status(StatusCode::BAD_REQUEST, "BadRequest", &e.to_string());
        }
        let stored = current(shared, target).unwrap_or(object);
        return with_code(json_response(&stored), code);
    }
    let mut store = shared.lock();
    let rv = store.rv + 1;
    let key = (
        target.resource.plural,
        target.namespace.clone().unwrap_or_default(),
        target.name.clone().unwrap_or_default(),
    );
    let old_uid = store
        .others
        .objects
        .get(&key)
        .and_then(|o| o.pointer("/metadata/uid"))
        .cloned();
    if let Some(meta) = object.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.insert("resourceVersion".into(), rv.to_string().into());
        meta.insert(
            "uid".into(),
            old_uid.unwrap_or_else(|| format!("uid-{rv}").into()),
        );
        meta.entry("creationTimestamp")
            .or_insert_with(|| super::rfc3339(std::time::SystemTime::now()).into());
    }
    if !dry_run {
        store.rv = rv;
        store.others.objects.insert(key, object.clone());
    }
    with_code(json_response(&object), code)
}

fn with_code(mut response: Response, code: StatusCode) -> Response {
    *response.status_mut() = code;
    response
}

/// RFC 7386: objects merge key by key, `null` removes, anything else replaces.
pub fn merge_patch(target: &mut Value, patch: &Value) {
    let Value::Object(patch) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = json!({});
    }
    let Value::Object(map) = target else {
        return;
    };
    for (k, v) in patch {
        if v.is_null() {
            map.remove(k);
        } else {
            merge_patch(map.entry(k.clone()).or_insert(Value::Null), v);
        }
    }
}

/// Why an object was refused.
#[derive(Debug)]
pub struct Refused {
    /// 400 (decoding) or 422 (validation).
    pub code: StatusCode,
    /// The message, as the real server words it.
    pub message: String,
}

impl Refused {
    fn response(&self, target: &Target) -> Response {
        let reason = if self.code == StatusCode::BAD_REQUEST {
            "BadRequest"
        } else {
            "Invalid"
        };
        object_status(self.code, reason, &self.message, target)
    }
}

/// Decoding (strict unless `lenient`) and the few validations a deployment's objects meet
/// (see the module documentation): `Ok` when the real server would store the object.
///
/// # Errors
/// [`Refused`] naming the field.
pub fn validate(resource: Resource, object: &Value, lenient: bool) -> Result<(), Refused> {
    use k8s_openapi::api::{apps, batch, core, discovery, networking, rbac};
    match resource.kind {
        "Service" => strict::<core::v1::Service>(object, lenient),
        "Node" => strict::<core::v1::Node>(object, lenient),
        "ConfigMap" => strict::<core::v1::ConfigMap>(object, lenient),
        "ServiceAccount" => strict::<core::v1::ServiceAccount>(object, lenient),
        "Namespace" => strict::<core::v1::Namespace>(object, lenient),
        "EndpointSlice" => strict::<discovery::v1::EndpointSlice>(object, lenient),
        "ServiceCIDR" => strict::<networking::v1::ServiceCIDR>(object, lenient),
        "DaemonSet" => strict::<apps::v1::DaemonSet>(object, lenient),
        "Job" => strict::<batch::v1::Job>(object, lenient),
        "ClusterRole" => strict::<rbac::v1::ClusterRole>(object, lenient),
        "ClusterRoleBinding" => strict::<rbac::v1::ClusterRoleBinding>(object, lenient),
        _ => Ok(()),
    }?;
    let kind = object.get("kind").and_then(Value::as_str).unwrap_or("");
    if !kind.is_empty() && kind != resource.kind {
        return Err(Refused {
            code: StatusCode::BAD_REQUEST,
            message: format!("the body is a {kind}, the path names {}", resource.plural),
        });
    }
    if matches!(resource.kind, "DaemonSet" | "Job") {
        let selector = object
            .pointer("/spec/selector/matchLabels")
            .and_then(Value::as_object);
        let labels = object
            .pointer("/spec/template/metadata/labels")
            .and_then(Value::as_object);
        if let Some(selector) = selector {
            for (k, v) in selector {
                if labels.and_then(|l| l.get(k)) != Some(v) {
                    return Err(Refused {
                        code: StatusCode::UNPROCESSABLE_ENTITY,
                        message: format!(
                            "{} is invalid: spec.template.metadata.labels: Invalid value: \
                             `selector` does not match template `labels` ({k}={v})",
                            resource.kind
                        ),
                    });
                }
            }
        } else if resource.kind == "DaemonSet" {
            return Err(Refused {
                code: StatusCode::UNPROCESSABLE_ENTITY,
                message: "DaemonSet is invalid: spec.selector: Required value".into(),
            });
        }
    }
    Ok(())
}

/// Decodes `object` as `T`, encodes it again, and (unless `lenient`) names the first field
/// that was lost.
fn strict<T: DeserializeOwned + Serialize>(object: &Value, lenient: bool) -> Result<(), Refused> {
    let refused = |message: String| Refused {
        code: StatusCode::BAD_REQUEST,
        message,
    };
    let typed: T = serde_json::from_value(object.clone())
        .map_err(|e| refused(format!("strict decoding error: {e}")))?;
    let back = serde_json::to_value(typed).map_err(|e| refused(e.to_string()))?;
    if lenient {
        return Ok(());
    }
    match lost_field(object, &back, "") {
        Some(path) => Err(refused(format!(
            "strict decoding error: unknown field \"{path}\""
        ))),
        None => Ok(()),
    }
}

/// The first field of `input` missing from `output`, as a dotted path (`spec.x`,
/// `spec.containers[0].imagePullPolicyy`); `null`s count as absent.
fn lost_field(input: &Value, output: &Value, at: &str) -> Option<String> {
    match (input, output) {
        (Value::Object(i), Value::Object(o)) => i.iter().find_map(|(k, v)| {
            if v.is_null() {
                return None;
            }
            let path = if at.is_empty() {
                k.clone()
            } else {
                format!("{at}.{k}")
            };
            match o.get(k) {
                None => Some(path),
                Some(ov) => lost_field(v, ov, &path),
            }
        }),
        (Value::Array(i), Value::Array(o)) => i
            .iter()
            .zip(o)
            .enumerate()
            .find_map(|(n, (iv, ov))| lost_field(iv, ov, &format!("{at}[{n}]"))),
        _ => None,
    }
}

/// The discovery documents of the served groups, or `None` for other paths.
/// The real server's short name for a resource (`kubectl get ds`).
fn short_name(plural: &str) -> Option<&'static str> {
    Some(match plural {
        "services" => "svc",
        "nodes" => "no",
        "configmaps" => "cm",
        "serviceaccounts" => "sa",
        "namespaces" => "ns",
        "daemonsets" => "ds",
        _ => return None,
    })
}

fn discovery(path: &str) -> Option<Value> {
    let path = path.trim_end_matches('/');
    let resource_list = |group: &str, version: &str| {
        let resources: Vec<Value> = RESOURCES
            .iter()
            .filter(|r| r.group == group && r.version == version)
            .map(|r| {
                let mut doc = json!({
                    "name": r.plural,
                    "singularName": r.kind.to_lowercase(),
                    "namespaced": r.namespaced,
                    "kind": r.kind,
                    "verbs": ["create", "delete", "get", "list", "patch", "watch"],
                });
                if let Some(short) = short_name(r.plural) {
                    doc["shortNames"] = json!([short]);
                }
                doc
            })
            .collect();
        let group_version = if group.is_empty() {
            version.to_string()
        } else {
            format!("{group}/{version}")
        };
        json!({
            "kind": "APIResourceList",
            "apiVersion": "v1",
            "groupVersion": group_version,
            "resources": resources,
        })
    };
    let group_doc = |group: &str| {
        let gv = json!({"groupVersion": format!("{group}/v1"), "version": "v1"});
        json!({
            "kind": "APIGroup",
            "apiVersion": "v1",
            "name": group,
            "versions": [gv.clone()],
            "preferredVersion": gv,
        })
    };
    let mut groups: Vec<&str> = RESOURCES
        .iter()
        .map(|r| r.group)
        .filter(|g| !g.is_empty())
        .collect();
    groups.dedup();
    let gv_path = |group: &str| {
        if group.is_empty() {
            "api/v1".to_string()
        } else {
            format!("apis/{group}/v1")
        }
    };
    if path == "/openapi/v3" {
        let mut paths = serde_json::Map::new();
        for group in std::iter::once("").chain(groups.iter().copied()) {
            let p = gv_path(group);
            paths.insert(
                p.clone(),
                json!({"serverRelativeURL": format!("/openapi/v3/{p}?hash=kp-testkit")}),
            );
        }
        return Some(json!({"paths": paths}));
    }
    if let Some(gv) = path.strip_prefix("/openapi/v3/") {
        let group = match gv {
            "api/v1" => "",
            _ => gv.strip_prefix("apis/")?.strip_suffix("/v1")?,
        };
        let mut paths = serde_json::Map::new();
        for r in RESOURCES.iter().filter(|r| r.group == group) {
            let item = if r.namespaced {
                format!("/{gv}/namespaces/{{namespace}}/{}/{{name}}", r.plural)
            } else {
                format!("/{gv}/{}/{{name}}", r.plural)
            };
            let param =
                |name: &str| json!({"name": name, "in": "query", "schema": {"type": "string"}});
            paths.insert(
                item,
                json!({"patch": {
                    "x-kubernetes-group-version-kind": {"group": r.group, "version": r.version, "kind": r.kind},
                    "parameters": [param("fieldValidation"), param("dryRun"), param("fieldManager")],
                    "responses": {"200": {"description": "OK"}},
                }}),
            );
        }
        return (!paths.is_empty()).then(|| {
            json!({
                "openapi": "3.0.0",
                "info": {"title": "Kubernetes (kp-testkit)", "version": "v1.35.0"},
                "paths": paths,
            })
        });
    }
    match path {
        "/api/v1" => Some(resource_list("", "v1")),
        "/apis" => Some(json!({
            "kind": "APIGroupList",
            "apiVersion": "v1",
            "groups": groups.iter().map(|g| group_doc(g)).collect::<Vec<_>>(),
        })),
        _ => {
            let rest = path.strip_prefix("/apis/")?;
            match rest.split_once('/') {
                None => groups.contains(&rest).then(|| group_doc(rest)),
                Some((group, "v1")) if groups.contains(&group) => Some(resource_list(group, "v1")),
                Some(_) => None,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strict_decoding_names_an_unknown_field() {
        let ds = json!({
            "apiVersion": "apps/v1", "kind": "DaemonSet",
            "metadata": {"name": "x"},
            "spec": {
                "selector": {"matchLabels": {"a": "b"}},
                "template": {
                    "metadata": {"labels": {"a": "b"}},
                    "spec": {"containers": [{"name": "c", "imagePullPolicyy": "Always"}]},
                },
            },
        });
        let daemonset = RESOURCES
            .into_iter()
            .find(|r| r.kind == "DaemonSet")
            .unwrap();
        let err = validate(daemonset, &ds, false).unwrap_err();
        validate(daemonset, &ds, true).unwrap();
        assert_eq!(
            err.message,
            "strict decoding error: unknown field \"spec.template.spec.containers[0].imagePullPolicyy\""
        );
        let mut ok = ds.clone();
        merge_patch(
            &mut ok,
            &json!({"spec": {"template": {"spec": {"containers": [{"name": "c"}]}}}}),
        );
        validate(daemonset, &ok, false).unwrap();
        let mut mismatch = ok.clone();
        merge_patch(
            &mut mismatch,
            &json!({"spec": {"selector": {"matchLabels": {"a": "c"}}}}),
        );
        assert_eq!(
            validate(daemonset, &mismatch, false).unwrap_err().code,
            StatusCode::UNPROCESSABLE_ENTITY
        );
    }

    #[test]
    fn paths_name_resources() {
        let t = parse_path("/api/v1/namespaces/kube-system/configmaps/kube-proxy").unwrap();
        assert_eq!(t.resource.kind, "ConfigMap");
        assert_eq!(t.namespace.as_deref(), Some("kube-system"));
        assert_eq!(t.name.as_deref(), Some("kube-proxy"));
        let t = parse_path("/apis/rbac.authorization.k8s.io/v1/clusterroles").unwrap();
        assert_eq!(t.resource.kind, "ClusterRole");
        assert!(t.name.is_none());
        assert!(parse_path("/api/v1/namespaces/x/nodes/n").is_none());
        assert!(parse_path("/apis/apps/v1/namespaces/x/deployments").is_none());
    }

    /// With a bearer token required, a client without it gets 401 and one with it is
    /// served; a created ConfigMap is read back, a dry run stores nothing.
    #[tokio::test]
    async fn token_and_objects() {
        use super::super::{ApiServerOptions, TestApiServer};
        use k8s_openapi::api::core::v1::{ConfigMap, Service};
        let server = TestApiServer::start_with(ApiServerOptions {
            tls: None,
            bearer_token: Some("sesame".into()),
        })
        .await
        .unwrap();
        let anonymous: kube::Api<Service> = kube::Api::all(server.client().unwrap());
        let err = anonymous.list(&Default::default()).await.unwrap_err();
        assert!(
            matches!(&err, kube::Error::Api(s) if s.code == 401),
            "{err}"
        );

        let mut config = kube::Config::new(server.url().parse().unwrap());
        config.auth_info.token = Some("sesame".to_string().into());
        config.default_retry = false;
        let client = kube::Client::try_from(config).unwrap();
        let services: kube::Api<Service> = kube::Api::all(client.clone());
        services.list(&Default::default()).await.unwrap();

        let cms: kube::Api<ConfigMap> = kube::Api::namespaced(client, "kube-system");
        let mut cm = ConfigMap::default();
        cm.metadata.name = Some("c".into());
        cm.data = Some([("k".to_string(), "v".to_string())].into());
        let dry = kube::api::PostParams {
            dry_run: true,
            ..Default::default()
        };
        cms.create(&dry, &cm).await.unwrap();
        assert!(
            cms.get_opt("c").await.unwrap().is_none(),
            "a dry run stores nothing"
        );
        cms.create(&Default::default(), &cm).await.unwrap();
        assert_eq!(cms.get("c").await.unwrap().data, cm.data);
        let again = cms.create(&Default::default(), &cm).await.unwrap_err();
        assert!(
            matches!(&again, kube::Error::Api(s) if s.code == 409),
            "{again}"
        );
    }

    /// `kubectl ARGS` against `server` (plain HTTP, no credentials); (success, stdout,
    /// stderr).
    async fn kubectl(server: &str, dir: &std::path::Path, args: &[&str]) -> (bool, String, String) {
        let kubeconfig = dir.join("config");
        std::fs::write(
            &kubeconfig,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: t\n  cluster:\n    server: {server}\n\
                 users:\n- name: u\n  user: {{}}\ncontexts:\n- name: c\n  context:\n    cluster: t\n    user: u\n\
                 current-context: c\n"
            ),
        )
        .unwrap();
        let out = tokio::process::Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .arg("--cache-dir")
            .arg(dir.join("cache"))
            .args(args)
            .output()
            .await
            .unwrap_or_else(|e| {
                panic!("cannot run kubectl (scripts/install-deps installs it): {e}")
            });
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    /// `kubectl apply` of a ServiceCIDR stores it where the ServiceCIDR watch reads it
    /// (`kubectl get servicecidrs` and a kube client's list see it); an unknown field is
    /// refused, naming it; a server that stopped serving ServiceCIDRs answers `404` to the
    /// object's path too.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn kubectl_applies_a_service_cidr() {
        use super::super::TestApiServer;
        use k8s_openapi::api::networking::v1::ServiceCIDR;
        let server = TestApiServer::start().await.unwrap();
        let dir = tempfile::tempdir().unwrap();
        let manifest = dir.path().join("cidr.yaml");
        std::fs::write(
            &manifest,
            "apiVersion: networking.k8s.io/v1\nkind: ServiceCIDR\nmetadata:\n  name: extra\n\
             spec:\n  cidrs: [\"10.200.0.0/24\"]\n",
        )
        .unwrap();
        let file = manifest.to_str().unwrap();
        let (ok, out, err) = kubectl(&server.url(), dir.path(), &["apply", "-f", file]).await;
        assert!(ok, "{err}{out}");
        assert!(
            out.contains("servicecidr.networking.k8s.io/extra created"),
            "{out}"
        );

        let (ok, out, err) = kubectl(
            &server.url(),
            dir.path(),
            &["get", "servicecidrs", "-o", "name"],
        )
        .await;
        assert!(ok, "{err}{out}");
        assert_eq!(out.trim(), "servicecidr.networking.k8s.io/extra");
        let api: kube::Api<ServiceCIDR> = kube::Api::all(server.client().unwrap());
        let listed = api.list(&Default::default()).await.unwrap();
        let cidrs: Vec<_> = listed
            .items
            .iter()
            .map(|c| c.spec.as_ref().and_then(|s| s.cidrs.clone()))
            .collect();
        assert_eq!(cidrs, [Some(vec!["10.200.0.0/24".to_string()])]);

        std::fs::write(
            &manifest,
            "apiVersion: networking.k8s.io/v1\nkind: ServiceCIDR\nmetadata:\n  name: typo\n\
             spec:\n  cidr: [\"10.201.0.0/24\"]\n",
        )
        .unwrap();
        let (ok, out, err) = kubectl(&server.url(), dir.path(), &["apply", "-f", file]).await;
        assert!(!ok, "{out}");
        assert!(err.contains("unknown field \"spec.cidr\""), "{err}");

        server.set_served(ApiKind::ServiceCidr, false);
        let (ok, out, err) =
            kubectl(&server.url(), dir.path(), &["get", "servicecidr", "extra"]).await;
        assert!(!ok && err.contains("NotFound"), "{err}{out}");
    }

    /// `apply_value` stores any served kind, validated as a create is; the same objects are
    /// served on every listener.
    #[tokio::test]
    async fn apply_value_and_two_listeners() {
        use super::super::{ApiServerOptions, TestApiServer};
        use k8s_openapi::api::apps::v1::DaemonSet;
        use k8s_openapi::api::core::v1::{ConfigMap, Node};
        let listeners = vec![
            std::net::TcpListener::bind("127.0.0.1:0").unwrap(),
            std::net::TcpListener::bind("127.0.0.1:0").unwrap(),
        ];
        let server = TestApiServer::start_on(listeners, ApiServerOptions::default())
            .await
            .unwrap();
        assert_eq!(server.addrs().len(), 2);
        assert_ne!(server.addrs()[0], server.addrs()[1]);
        let objects: Vec<Value> = crate::kubeadm::kube_proxy_objects("https://192.168.56.10:6443")
            .split("\n---\n")
            .map(|doc| serde_saphyr::from_str(doc).unwrap())
            .collect();
        for object in objects {
            server.apply_value(object).unwrap();
        }
        server
            .apply_value(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n"}}))
            .unwrap();
        let err = server
            .apply_value(json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}}))
            .unwrap_err()
            .to_string();
        assert!(err.contains("does not serve v1 Pod"), "{err}");
        let err = server
            .apply_value(json!({"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": "c"}, "dta": {}}))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("ConfigMap c: strict decoding error: unknown field \"dta\""),
            "{err}"
        );

        for addr in server.addrs() {
            let config = kube::Config::new(server.url_of(*addr).parse().unwrap());
            let client = kube::Client::try_from(config).unwrap();
            let cm: kube::Api<ConfigMap> = kube::Api::namespaced(client.clone(), "kube-system");
            let data = cm.get("kube-proxy").await.unwrap().data.unwrap();
            assert!(data["kubeconfig.conf"].contains("server: https://192.168.56.10:6443"));
            let ds: kube::Api<DaemonSet> = kube::Api::all(client.clone());
            assert_eq!(ds.list(&Default::default()).await.unwrap().items.len(), 1);
            let nodes: kube::Api<Node> = kube::Api::all(client);
            assert_eq!(
                nodes.list(&Default::default()).await.unwrap().items.len(),
                1
            );
        }
    }

    #[test]
    fn merge_patch_follows_rfc_7386() {
        let mut v = json!({"a": {"b": 1, "c": 2}, "l": [1, 2]});
        merge_patch(&mut v, &json!({"a": {"b": null, "d": 3}, "l": [3]}));
        assert_eq!(v, json!({"a": {"c": 2, "d": 3}, "l": [3]}));
    }
}
