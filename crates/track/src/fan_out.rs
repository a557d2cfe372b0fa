//! [`split_by_family`]: one source batch cut into what each family's tracker needs.
//!
//! A dual-stack node runs one tracker per IP family (upstream's "meta proxier"), and every
//! source event used to reach each of them: all but the last tracker got a copy of every
//! batch, and each dropped what was not of its family (a Service without a ClusterIP of the
//! family, a slice of the other `addressType`). With 10,000 Services in one initial batch that
//! copy was ~9 MiB of the daemon's peak. Here each event goes whole only to the families that
//! keep it; the others get the small event that has the same effect on them.

use kp_model::{IpFamily, SliceAddressType, SourceEvent};

/// Splits `batch` into one batch per entry of `families`, in that order.
///
/// For every tracker, applying its batch has the same effect as applying the whole `batch`
/// (the tracker tests check it): a Service upsert goes whole to the families of its
/// ClusterIPs and as a [`SourceEvent::ServiceDelete`] of its name to the others (a tracker
/// treats an upsert without a ClusterIP of its family as a delete); an EndpointSlice upsert
/// goes whole to its `addressType`'s family and as a [`SourceEvent::SliceDelete`] to the
/// others (the same rule for slices); deletes, Nodes, ServiceCIDRs (each tracker keeps the CIDRs of its family) and `Synced` go to
/// every family. With
/// one family the batch is returned as it is. The events keep their order in each batch.
pub fn split_by_family(batch: Vec<SourceEvent>, families: &[IpFamily]) -> Vec<Vec<SourceEvent>> {
    match families.len() {
        0 => return Vec::new(),
        1 => return vec![batch],
        _ => {}
    }
    let mut out: Vec<Vec<SourceEvent>> = families
        .iter()
        .map(|_| Vec::with_capacity(batch.len()))
        .collect();
    for event in batch {
        match event {
            SourceEvent::ServiceUpsert(svc) => {
                let keeps: Vec<bool> = families
                    .iter()
                    .map(|f| svc.cluster_ips.iter().any(|ip| f.contains(ip)))
                    .collect();
                // The last family that keeps it gets the event itself, the others a copy.
                let last_keeper = keeps.iter().rposition(|k| *k);
                let name = svc.name.clone();
                let mut whole = Some(svc);
                for (i, batch) in out.iter_mut().enumerate() {
                    batch.push(if !keeps[i] {
                        SourceEvent::ServiceDelete(name.clone())
                    } else if Some(i) == last_keeper {
                        SourceEvent::ServiceUpsert(whole.take().expect("the last keeper takes it"))
                    } else {
                        SourceEvent::ServiceUpsert(
                            whole.clone().expect("kept until the last keeper"),
                        )
                    });
                }
            }
            SourceEvent::SliceUpsert(slice) => {
                let family = match slice.address_type {
                    SliceAddressType::V4 => IpFamily::V4,
                    SliceAddressType::V6 => IpFamily::V6,
                };
                let k = families.iter().position(|f| *f == family);
                for (i, batch) in out.iter_mut().enumerate() {
                    if Some(i) != k {
                        batch.push(SourceEvent::SliceDelete(slice.name.clone()));
                    }
                }
                if let Some(i) = k {
                    out[i].push(SourceEvent::SliceUpsert(slice));
                }
            }
            other => {
                let (last, rest) = out.split_last_mut().expect("two families or more");
                for batch in rest {
                    batch.push(other.clone());
                }
                last.push(other);
            }
        }
    }
    out
}
