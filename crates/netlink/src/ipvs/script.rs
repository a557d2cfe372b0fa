//! [`scripted_round_trip`]: one fixed sequence of IPVS changes and dumps, run against any
//! [`IpvsOps`], so a test in a guest kernel with IPVS can check the kernel against
//! [`super::FakeIpvs`] (and capture golden bytes with [`super::Ipvs::set_capture`]).

use std::net::{IpAddr, SocketAddr};

use super::{Forward, IpvsOp, IpvsOps, OpError, RealServer, ServiceKey, VirtualServer, dump_all};
use crate::error::Result;
use crate::flow::proto;

/// What one step of [`scripted_round_trip`] observed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoundTripStep {
    /// The step: `flush-before`, `add-services`, `add-dests`, `edit`, `delete`, `flush`.
    pub name: &'static str,
    /// One result per op of the step (none for the flushes).
    pub results: Vec<std::result::Result<(), OpError>>,
    /// The whole table after the step, dumped: services sorted by key, real servers by
    /// address and port, so that the kernel's hash order does not matter.
    pub state: Vec<(VirtualServer, Vec<RealServer>)>,
}

fn sa(s: &str) -> SocketAddr {
    s.parse()
        .unwrap_or_else(|_| SocketAddr::from(([0, 0, 0, 0], 0)))
}

fn key(s: &str, protocol: u8) -> ServiceKey {
    let a = sa(s);
    ServiceKey::new(a.ip(), protocol, a.port())
}

fn rs(s: &str, weight: u32) -> RealServer {
    let a = sa(s);
    RealServer::new(a.ip(), a.port(), weight)
}

fn sorted_state(ops: &mut dyn IpvsOps) -> Result<Vec<(VirtualServer, Vec<RealServer>)>> {
    let mut state = dump_all(ops)?;
    for (_, dests) in &mut state {
        dests.sort_by_key(|d| (d.addr, d.port));
    }
    state.sort_by_key(|(vs, _)| vs.key);
    Ok(state)
}

/// Runs the script on `ops` and returns what each step saw. Expected answers, if `ops`
/// behaves like the kernel (the steps use only the schedulers `rr` and `wrr`):
///
/// 1. `flush-before`: flush; empty table.
/// 2. `add-services`: `TCP 10.96.0.1:443` rr, `UDP 10.96.0.10:53` rr, `TCP [fd00:10:96::1]:443`
///    wrr persistent 10800 succeed; the first again is `EEXIST`; TCP 10.96.0.2:80 with
///    scheduler `nosuch` is `ENOENT`.
/// 3. `add-dests`: two real servers to the first, one to the UDP and one IPv6 to the
///    IPv6 service succeed; a duplicate is `EEXIST`, one for the missing 10.96.0.2:80
///    `ESRCH`, a weight of `u32::MAX` `ERANGE`, an IPv6 masquerading real server on an
///    IPv4 service `EINVAL`.
/// 4. `edit`: the first service to `wrr` and one of its real servers to weight 0
///    succeed; editing a missing real server is `ENOENT`, a missing service `ESRCH`.
/// 5. `delete`: one real server and the UDP service succeed; the same real server again
///    is `ENOENT`, the same service again `ESRCH`.
/// 6. `flush`: flush; empty table.
///
/// # Errors
///
/// The first top-level error of `ops` (a dump, an apply or a flush that failed as a
/// whole).
pub fn scripted_round_trip(ops: &mut dyn IpvsOps) -> Result<Vec<RoundTripStep>> {
    let api = key("10.96.0.1:443", proto::TCP);
    let dns = key("10.96.0.10:53", proto::UDP);
    let v6 = key("[fd00:10:96::1]:443", proto::TCP);
    let missing = key("10.96.0.2:80", proto::TCP);
    let a = rs("192.168.56.10:6443", 1);
    let b = rs("192.168.56.11:6443", 1);

    let mut steps = Vec::new();
    ops.flush()?;
    steps.push(RoundTripStep {
        name: "flush-before",
        results: Vec::new(),
        state: sorted_state(ops)?,
    });

    let batches: [(&'static str, Vec<IpvsOp>); 4] = [
        (
            "add-services",
            vec![
                IpvsOp::AddService(VirtualServer::new(api, "rr")),
                IpvsOp::AddService(VirtualServer::new(dns, "rr")),
                IpvsOp::AddService(VirtualServer::new(v6, "wrr").persistent(10800)),
                IpvsOp::AddService(VirtualServer::new(api, "rr")),
                IpvsOp::AddService(VirtualServer::new(missing, "nosuch")),
            ],
        ),
        (
            "add-dests",
            vec![
                IpvsOp::AddDest(api, a.clone()),
                IpvsOp::AddDest(api, b.clone()),
                IpvsOp::AddDest(dns, rs("10.244.1.5:53", 1)),
                IpvsOp::AddDest(v6, rs("[fd00:10:244::5]:8443", 2)),
                IpvsOp::AddDest(api, a.clone()),
                IpvsOp::AddDest(missing, a.clone()),
                IpvsOp::AddDest(api, rs("192.168.56.12:6443", u32::MAX)),
                IpvsOp::AddDest(
                    api,
                    RealServer {
                        forward: Forward::Masq,
                        ..RealServer::new(IpAddr::V6(std::net::Ipv6Addr::LOCALHOST), 1, 1)
                    },
                ),
            ],
        ),
        (
            "edit",
            vec![
                IpvsOp::EditService(VirtualServer::new(api, "wrr")),
                IpvsOp::EditDest(
                    api,
                    RealServer {
                        weight: 0,
                        ..b.clone()
                    },
                ),
                IpvsOp::EditDest(api, rs("192.168.56.99:6443", 1)),
                IpvsOp::EditService(VirtualServer::new(missing, "rr")),
            ],
        ),
        (
            "delete",
            vec![
                IpvsOp::DelDest(api, a.socket_addr()),
                IpvsOp::DelService(dns),
                IpvsOp::DelDest(api, a.socket_addr()),
                IpvsOp::DelService(dns),
            ],
        ),
    ];
    for (name, batch) in batches {
        let results = ops.apply(&batch)?;
        steps.push(RoundTripStep {
            name,
            results,
            state: sorted_state(ops)?,
        });
    }

    ops.flush()?;
    steps.push(RoundTripStep {
        name: "flush",
        results: Vec::new(),
        state: sorted_state(ops)?,
    });
    Ok(steps)
}

#[cfg(test)]
mod tests {
    use nix::errno::Errno;

    use super::*;
    use crate::ipvs::{FakeIpvs, SVC_F_HASHED, SVC_F_PERSISTENT};

    #[test]
    fn the_script_gets_the_documented_answers_from_the_fake() {
        let mut fake = FakeIpvs::new();
        let steps = scripted_round_trip(&mut fake).unwrap();
        let names: Vec<_> = steps.iter().map(|s| s.name).collect();
        assert_eq!(
            names,
            [
                "flush-before",
                "add-services",
                "add-dests",
                "edit",
                "delete",
                "flush"
            ]
        );
        let codes = |i: usize| -> Vec<Option<Errno>> {
            steps[i]
                .results
                .iter()
                .map(|r| r.as_ref().err().map(OpError::errno))
                .collect()
        };
        assert_eq!(
            codes(1),
            [None, None, None, Some(Errno::EEXIST), Some(Errno::ENOENT)]
        );
        assert_eq!(
            codes(2),
            [
                None,
                None,
                None,
                None,
                Some(Errno::EEXIST),
                Some(Errno::ESRCH),
                Some(Errno::ERANGE),
                Some(Errno::EINVAL)
            ]
        );
        assert_eq!(
            codes(3),
            [None, None, Some(Errno::ENOENT), Some(Errno::ESRCH)]
        );
        assert_eq!(
            codes(4),
            [None, None, Some(Errno::ENOENT), Some(Errno::ESRCH)]
        );
        assert!(steps[0].state.is_empty() && steps[5].state.is_empty());

        let after_delete = &steps[4].state;
        assert_eq!(after_delete.len(), 2);
        let (api, api_dests) = &after_delete[0];
        assert_eq!((api.scheduler.as_str(), api.flags), ("wrr", SVC_F_HASHED));
        assert_eq!(api_dests.len(), 1);
        assert_eq!(api_dests[0].weight, 0);
        let (v6, _) = &after_delete[1];
        assert_eq!(v6.flags, SVC_F_PERSISTENT | SVC_F_HASHED);
        assert_eq!((v6.timeout, v6.netmask), (10800, 128));
    }
}
