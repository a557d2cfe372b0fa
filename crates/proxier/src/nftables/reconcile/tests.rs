//! Payload-level tests of reconciliation (no kernel): what a partial sync writes, shared
//! element claims, and how a full sync treats what it finds in the table.

use std::collections::BTreeSet;
use std::time::Duration;

use kp_model::{IpFamily, NamespacedName, Service, Snapshot};
use kp_netfilter::{BaseChainSpec, SetInfo, TableObjects};
use kp_testkit::builders::{ServiceBuilder, SliceBuilder, snapshot};

use super::*;
use crate::nftables::render::render;

fn web(eps: &[&str]) -> (Service, kp_model::EndpointSlice) {
    let mut slice = SliceBuilder::new("web").port("", 8080);
    for e in eps {
        slice = slice.ready(e, "node-b");
    }
    (
        ServiceBuilder::new("web", "10.96.0.10").tcp("", 80).build(),
        slice.build(),
    )
}

fn snap(services: Vec<(Service, kp_model::EndpointSlice)>) -> Snapshot {
    let (svcs, slices) = services.into_iter().unzip();
    snapshot(IpFamily::V4, "node-a", svcs, slices)
}

fn names(n: &[(&str, &str)]) -> BTreeSet<NamespacedName> {
    n.iter().map(|(a, b)| NamespacedName::new(*a, *b)).collect()
}

fn full(s: &Snapshot) -> State {
    let cfg = RenderConfig::default();
    full_payload(
        IpFamily::V4,
        &cfg,
        &render(s, &cfg, None),
        &TableObjects::default(),
    )
    .1
}

fn partial(s: &Snapshot, changed: &BTreeSet<NamespacedName>, state: &mut State) -> String {
    let cfg = RenderConfig::default();
    partial_payload(
        IpFamily::V4,
        &cfg,
        &render(s, &cfg, Some(changed)),
        changed,
        state,
    )
    .0
}

#[test]
fn an_endpoint_change_rewrites_one_chain_and_its_hairpin_elements() {
    let mut state = full(&snap(vec![web(&["10.0.2.1", "10.0.2.2"])]));
    let changed = names(&[("default", "web")]);
    let payload = partial(
        &snap(vec![web(&["10.0.2.1", "10.0.2.3"])]),
        &changed,
        &mut state,
    );
    assert_eq!(
        payload,
        "flush chain ip kube-proxy service-PFISGYVC-default/web/tcp/\n\
         delete element ip kube-proxy hairpin-connections {\n\t10.0.2.2 . 10.0.2.2 . tcp . 8080\n}\n\
         table ip kube-proxy {\n\
         \tchain service-PFISGYVC-default/web/tcp/ {\n\
         \t\tmeta l4proto tcp dnat ip addr . port to numgen random mod 2 map { 0 : 10.0.2.1 . 8080 , 1 : 10.0.2.3 . 8080 }\n\
         \t}\n\
         }\n\
         add element ip kube-proxy hairpin-connections {\n\t10.0.2.3 . 10.0.2.3 . tcp . 8080\n}\n"
    );
    // No Service changed: nothing to send.
    assert_eq!(
        partial(
            &snap(vec![web(&["10.0.2.1", "10.0.2.3"])]),
            &BTreeSet::new(),
            &mut state
        ),
        ""
    );
}

#[test]
fn losing_all_endpoints_moves_elements_and_deletes_the_chain() {
    let mut state = full(&snap(vec![web(&["10.0.2.1"])]));
    let changed = names(&[("default", "web")]);
    let payload = partial(&snap(vec![web(&[])]), &changed, &mut state);
    assert_eq!(
        payload,
        "flush chain ip kube-proxy service-PFISGYVC-default/web/tcp/\n\
         delete element ip kube-proxy service-ips {\n\t10.96.0.10 . tcp . 80\n}\n\
         delete element ip kube-proxy hairpin-connections {\n\t10.0.2.1 . 10.0.2.1 . tcp . 8080\n}\n\
         delete chain ip kube-proxy service-PFISGYVC-default/web/tcp/\n\
         add element ip kube-proxy no-endpoint-services {\n\t10.96.0.10 . tcp . 80 comment \"default/web\" : goto reject-chain\n}\n"
    );
    assert_eq!(state.service_chains(), 0);
    assert_eq!(state.elements(), 2, "cluster-ips and no-endpoint-services");
}

#[test]
fn shared_claims_follow_the_first_service() {
    let ext = |name: &str, cip: &str| {
        (
            ServiceBuilder::new(name, cip)
                .tcp("", 80)
                .external_ips(&["203.0.113.9"])
                .build(),
            SliceBuilder::new(name)
                .port("", 80)
                .ready("10.0.2.1", "node-b")
                .build(),
        )
    };
    let both = snap(vec![ext("a", "10.96.0.1"), ext("b", "10.96.0.2")]);
    let mut state = full(&both);
    let key: ElemKey = (Container::ServiceIps, Text::from("203.0.113.9 . tcp . 80"));
    assert_eq!(state.elements[&key].len(), 2, "both Services claim it");
    assert!(
        state.elements[&key][0]
            .data
            .value
            .verdict()
            .to_string()
            .contains("default/a/"),
        "a sorts first"
    );
    // `a` goes away: the element now points at b's chain.
    let only_b = snap(vec![ext("b", "10.96.0.2")]);
    let payload = partial(&only_b, &names(&[("default", "a")]), &mut state);
    assert!(payload.contains("delete element ip kube-proxy service-ips {\n\t10.96.0.1 . tcp . 80,\n\t203.0.113.9 . tcp . 80\n}\n"), "{payload}");
    assert!(
        payload.contains(
            "add element ip kube-proxy service-ips {\n\t203.0.113.9 . tcp . 80 : goto external-"
        ),
        "{payload}"
    );
    assert!(payload.contains("default/b/"), "{payload}");
    assert_eq!(state.elements[&key].len(), 1);
}

#[test]
fn an_affinity_timeout_change_recreates_the_sets() {
    let sticky = |t: u32| {
        (
            ServiceBuilder::new("web", "10.96.0.10")
                .tcp("", 80)
                .affinity(t)
                .build(),
            SliceBuilder::new("web")
                .port("", 8080)
                .ready("10.0.2.1", "node-b")
                .build(),
        )
    };
    let mut state = full(&snap(vec![sticky(100)]));
    let payload = partial(
        &snap(vec![sticky(200)]),
        &names(&[("default", "web")]),
        &mut state,
    );
    let delete = payload.find("delete set ip kube-proxy affinity-").unwrap();
    let flush = payload.find("flush chain ip kube-proxy endpoint-").unwrap();
    let add = payload.find("timeout 200s").unwrap();
    assert!(flush < delete && delete < add, "{payload}");
}

#[test]
fn a_full_sync_keeps_matching_objects_and_replaces_the_rest() {
    let s = snap(vec![web(&["10.0.2.1"])]);
    let cfg = RenderConfig::default();
    let mut kernel = TableObjects {
        exists: true,
        ..TableObjects::default()
    };
    kernel.chains.insert(
        "nat-output".into(),
        Some(BaseChainSpec {
            chain_type: "nat".into(),
            hook: "output".into(),
            priority_text: "-100".into(),
            priority: Some(-100),
        }),
    );
    kernel.chains.insert(
        "nat-prerouting".into(),
        Some(BaseChainSpec {
            chain_type: "nat".into(),
            hook: "prerouting".into(),
            priority_text: "filter".into(),
            priority: Some(0),
        }),
    );
    kernel
        .chains
        .insert("service-OLD-default/gone/tcp/".into(), None);
    let (ty, comment) = Container::ServiceIps.type_and_comment(IpFamily::V4);
    kernel.maps.insert(
        "service-ips".into(),
        SetInfo {
            key_type: ty,
            comment: Some(comment.into()),
            ..SetInfo::default()
        },
    );
    kernel.sets.insert(
        "affinity-OLD-default/gone/tcp/__10.0.0.1/80".into(),
        SetInfo {
            timeout: Some(Duration::from_secs(10)),
            ..SetInfo::default()
        },
    );
    let (payload, _, stats) = full_payload(IpFamily::V4, &cfg, &render(&s, &cfg, None), &kernel);
    assert!(payload.contains("delete chain ip kube-proxy nat-prerouting\n"));
    assert!(!payload.contains("delete chain ip kube-proxy nat-output\n"));
    assert!(payload.contains("flush map ip kube-proxy service-ips\n"));
    assert!(!payload.contains("flush map ip kube-proxy no-endpoint-services\n"));
    assert!(payload.contains("delete set ip kube-proxy affinity-OLD"));
    assert!(payload.contains("delete chain ip kube-proxy service-OLD-default/gone/tcp/\n"));
    assert_eq!(
        (
            stats.base_chains_recreated,
            stats.chains_deleted,
            stats.sets_deleted
        ),
        (1, 1, 1)
    );
}

#[test]
fn the_state_shares_its_texts_and_keeps_one_claim_per_unshared_element() {
    let state = full(&snap(vec![web(&["10.0.2.1"])]));
    let fp = &state.services[&NamespacedName::new("default", "web")];
    assert_eq!(fp.elements.len(), 2, "cluster-ips and service-ips");
    // The hairpin-connections element is kept apart, as 20 bytes (no text, no claim).
    assert_eq!(fp.hairpin.len(), 1);
    assert_eq!(state.hairpin.len(), 1);
    for key in fp.elements.iter() {
        let (k, claims) = state.elements.get_key_value(key).unwrap();
        // One allocation for the key, in the map and in the footprint.
        assert!(Arc::ptr_eq(&k.1, &key.1), "{key:?}");
        // One Service claims it: no room for more.
        assert_eq!((claims.len(), claims.capacity()), (1, 1));
    }
    // The `goto` of service-ips is the Service's chain name, not a copy.
    let goto = state
        .elements
        .values()
        .find_map(|c| match &c[0].data.value {
            Value::Goto(t) => Some(t.clone()),
            _ => None,
        })
        .unwrap();
    assert!(fp.chains.iter().any(|c| Arc::ptr_eq(c, &goto)), "{goto}");
}

/// A change of the Service CIDRs alone is a partial sync that rewrites `cluster-ips-check`
/// and nothing else, and leaves the state a full sync of the new Service CIDRs would have.
#[test]
fn a_service_cidr_change_rewrites_cluster_ips_check_only() {
    let s = snap(vec![web(&["10.0.2.1"])]);
    let mut state = full(&s);
    assert!(state.service_cidrs().is_empty());
    let with = |cidrs: &[&str]| RenderConfig {
        service_cidrs: cidrs.iter().map(|c| c.parse().unwrap()).collect(),
        ..RenderConfig::default()
    };
    let none = BTreeSet::new();
    let step = |cfg: &RenderConfig, state: &mut State| {
        let rendered = render(&s, cfg, Some(&none));
        partial_payload(IpFamily::V4, cfg, &rendered, &none, state).0
    };
    let two = with(&["10.0.200.0/24", "10.96.0.0/12"]);
    assert_eq!(fixed_fingerprint(IpFamily::V4, &two), state.fixed());
    assert_eq!(
        step(&two, &mut state),
        "flush chain ip kube-proxy cluster-ips-check\n\
         table ip kube-proxy {\n\
         \tchain cluster-ips-check {\n\
         \t\tip daddr @cluster-ips reject comment \"Reject traffic to invalid ports of ClusterIPs\"\n\
         \t\tip daddr { 10.0.200.0/24, 10.96.0.0/12 } drop comment \"Drop traffic to unallocated ClusterIPs\"\n\
         \t}\n\
         }\n"
    );
    let fresh = |cfg: &RenderConfig| {
        full_payload(
            IpFamily::V4,
            cfg,
            &render(&s, cfg, None),
            &TableObjects::default(),
        )
        .1
    };
    assert_eq!(state, fresh(&two));
    // The same Service CIDRs again: nothing to send.
    assert_eq!(step(&two, &mut state), "");
    // All of them gone: only the reject rule stays.
    let payload = step(&RenderConfig::default(), &mut state);
    assert!(
        payload.starts_with("flush chain ip kube-proxy cluster-ips-check\n"),
        "{payload}"
    );
    assert!(!payload.contains("drop"), "{payload}");
    assert_eq!(state, fresh(&RenderConfig::default()));
}

/// Two Services with the same endpoint share its `hairpin-connections` element: it goes
/// only when the last of them does.
#[test]
fn a_shared_hairpin_element_lives_while_a_service_claims_it() {
    let api = || {
        (
            ServiceBuilder::new("api", "10.96.0.20").tcp("", 80).build(),
            SliceBuilder::new("api")
                .port("", 8080)
                .ready("10.0.2.1", "node-b")
                .build(),
        )
    };
    let mut state = full(&snap(vec![web(&["10.0.2.1"]), api()]));
    let hairpin = "hairpin-connections {\n\t10.0.2.1 . 10.0.2.1 . tcp . 8080\n}";
    let payload = partial(
        &snap(vec![api()]),
        &names(&[("default", "web")]),
        &mut state,
    );
    assert!(!payload.contains(hairpin), "{payload}");
    let payload = partial(&snap(vec![]), &names(&[("default", "api")]), &mut state);
    assert!(
        payload.contains(&format!("delete element ip kube-proxy {hairpin}")),
        "{payload}"
    );
    assert_eq!(state.elements(), 0);
    // And back: added once, by the first Service that claims it again.
    let payload = partial(
        &snap(vec![web(&["10.0.2.1"]), api()]),
        &names(&[("default", "api"), ("default", "web")]),
        &mut state,
    );
    assert_eq!(payload.matches(hairpin).count(), 1, "{payload}");
    assert!(payload.contains(&format!("add element ip kube-proxy {hairpin}")));
}
