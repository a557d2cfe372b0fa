//! Criterion bench of the nftables render: 10,000 Services × 10 endpoints into a full `nft -f`
//! payload (no kernel), and a one-Service partial payload at that scale.

use std::collections::BTreeSet;

use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
use kp_bench::{render_config, render_fresh, scale_snapshot};
use kp_netfilter::TableObjects;
use kp_proxier::nftables::reconcile;
use kp_proxier::nftables::render::render;

fn bench(c: &mut Criterion) {
    let snap = scale_snapshot(10_000, 10);
    let mut group = c.benchmark_group("nftables");
    group.sample_size(10);
    group.bench_function("render full 10k x 10", |b| {
        b.iter(|| render_fresh(std::hint::black_box(&snap)).0.len())
    });
    let cfg = render_config();
    let (_, state, _) = reconcile::full_payload(
        snap.family,
        &cfg,
        &render(&snap, &cfg, None),
        &TableObjects::default(),
    );
    let changed: BTreeSet<_> = snap
        .services
        .keys()
        .nth(5000)
        .map(|k| k.service.clone())
        .into_iter()
        .collect();
    group.bench_function("partial one Service at 10k x 10", |b| {
        b.iter_batched(
            || state.clone(),
            |mut st| {
                let r = render(&snap, &cfg, Some(&changed));
                let len = reconcile::partial_payload(snap.family, &cfg, &r, &changed, &mut st)
                    .0
                    .len();
                // Returned so that dropping the big state is not timed.
                (len, st)
            },
            BatchSize::LargeInput,
        )
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
