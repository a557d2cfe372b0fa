//! Criterion benches of the hot paths at 10,000 Services × 10 endpoints (no kernel):
//!
//! - `iptables/render full 10k x 10`: the iptables-mode render of a cold full sync plus the
//!   restore payload for a node without our rules;
//! - `iptables/render full 10k x 10, warm name cache`: the same with the proxier's
//!   [`RenderCache`](kp_proxier::iptables::render::RenderCache) filled by an earlier sync;
//! - `tracker/checkout 10k`: a tracker fed the 10k Services and their EndpointSlices, then
//!   `checkout()` (builds every ServicePortInfo and endpoint list, clones the snapshot);
//! - `tracker+iptables/one-Service change at 10k`: one EndpointSlice update through the
//!   tracker (`apply` + `checkout`), then the iptables partial render and payload;
//! - `tracker+nftables/one-Service change at 10k`: the same change, nftables partial payload.

use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
use kp_bench::{scale_events, scale_objects};
use kp_model::{IpFamily, SourceEvent};
use kp_proxier::iptables::reconcile as ipt_reconcile;
use kp_proxier::iptables::render as ipt_render;
use kp_track::Tracker;

const SERVICES: usize = 10_000;
const ENDPOINTS: usize = 10;

fn iptables_config() -> ipt_render::RenderConfig {
    ipt_render::RenderConfig {
        local: kp_proxier::LocalDetector::Cidrs(vec![
            kp_bench::POD_CIDR.parse().unwrap_or_default(),
        ])
        .for_family(IpFamily::V4, &[]),
        ..ipt_render::RenderConfig::default()
    }
}

fn fed_tracker() -> Tracker {
    let mut t = Tracker::new(IpFamily::V4, kp_bench::NODE);
    for e in scale_events(SERVICES, ENDPOINTS) {
        t.apply(e);
    }
    t
}

fn bench(c: &mut Criterion) {
    let snap = kp_bench::scale_snapshot(SERVICES, ENDPOINTS);
    let cfg = iptables_config();

    let mut group = c.benchmark_group("iptables");
    group.sample_size(10);
    group.bench_function("render full 10k x 10", |b| {
        b.iter(|| {
            let r = ipt_render::render(std::hint::black_box(&snap), &cfg, None);
            let mut r = r;
            ipt_reconcile::full_payload_take(&mut r, None).0.len()
        })
    });
    // A full render with the proxier's name cache filled by an earlier sync (what the hourly
    // resync and the retry after a failure do).
    let mut warm = ipt_render::RenderCache::new();
    let _ = ipt_render::render_cached(&snap, &cfg, None, &mut warm);
    group.bench_function("render full 10k x 10, warm name cache", |b| {
        b.iter(|| {
            let mut r =
                ipt_render::render_cached(std::hint::black_box(&snap), &cfg, None, &mut warm);
            ipt_reconcile::full_payload_take(&mut r, None).0.len()
        })
    });
    group.finish();

    let mut group = c.benchmark_group("tracker");
    group.sample_size(10);
    group.bench_function("checkout 10k", |b| {
        b.iter_batched(
            fed_tracker,
            |mut t| {
                let (snap, _) = t.checkout();
                (snap.services.len(), t)
            },
            BatchSize::LargeInput,
        )
    });
    group.finish();

    // One endpoint of Service 5000 changes: tracker apply + checkout, then partial render.
    let mut tracker = fed_tracker();
    let (first, _) = tracker.checkout();
    let mut cache = ipt_render::RenderCache::new();
    let full = ipt_render::render_cached(&first, &cfg, None, &mut cache);
    let previous = full.active_nat_chains.clone();
    let (_, mut slice) = scale_objects(SERVICES / 2, ENDPOINTS);
    let mut flip = false;
    let mut group = c.benchmark_group("tracker+iptables");
    group.sample_size(20);
    group.bench_function("one-Service change at 10k", |b| {
        b.iter(|| {
            flip = !flip;
            if let Some(e) = slice.endpoints.first_mut() {
                e.address = if flip {
                    "10.255.0.1".parse().unwrap_or(e.address)
                } else {
                    "10.255.0.2".parse().unwrap_or(e.address)
                };
            }
            tracker.apply(SourceEvent::SliceUpsert(slice.clone()));
            let (snap, changes) = tracker.checkout();
            let r = ipt_render::render_cached(&snap, &cfg, Some(&changes.services), &mut cache);
            ipt_reconcile::partial_payload(&r, &previous).0.len()
        })
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
