//! [`FakeIpvs`]: an in-memory IPVS table implementing [`IpvsOps`] with the kernel's
//! answers, so the proxier's sync can be tested without a kernel.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;

use nix::errno::Errno;

use super::wire;
use super::{
    Forward, IpvsInfo, IpvsOp, IpvsOps, IpvsTimeouts, OpError, RealServer, SVC_F_HASHED,
    ServiceKey, TIMEOUT_MAX, VirtualServer,
};
use crate::error::{Error, Result};

/// The schedulers a [`FakeIpvs`] knows unless told otherwise: those of a typical
/// distribution kernel's `ip_vs_*` modules.
pub const DEFAULT_SCHEDULERS: &[&str] = &[
    "rr", "wrr", "lc", "wlc", "lblc", "lblcr", "dh", "sh", "sed", "nq", "fo", "ovf", "mh",
];

/// An in-memory IPVS table answering like `net/netfilter/ipvs/ip_vs_ctl.c`.
///
/// Each op of [`IpvsOps::apply`] is checked in the kernel's order
/// (`ip_vs_genl_set_cmd`): a scheduler name the attribute policy refuses is `EINVAL`; a
/// missing service is `ESRCH` for everything but [`IpvsOp::AddService`], and an existing
/// one `EEXIST` for it; an unknown scheduler is `ENOENT` (add and edit); for real servers
/// another address family than the service's without [`Forward::Tunnel`] is `EINVAL`
/// (not checked for deletes), a weight above `i32::MAX` `ERANGE`, an existing one on add
/// `EEXIST`, a missing one on edit or delete `ENOENT`. A failed op changes nothing and
/// does not stop the batch.
///
/// Dumps list services in key order (the kernel's is its hash order) with
/// [`SVC_F_HASHED`] set as the kernel does, and real servers newest first (the kernel
/// adds to the head of the list). A service that does not exist has no real servers.
///
/// Timeouts start at [`IpvsTimeouts::KERNEL_DEFAULTS`]; setting one to 0 leaves it, a
/// value above [`TIMEOUT_MAX`] is `EINVAL` (and nothing changes), as in
/// `ip_vs_set_timeout`.
///
/// Fault injection: [`FakeIpvs::fail_next_apply`], [`FakeIpvs::fail_next_dump`],
/// [`FakeIpvs::fail_ops_on`]; [`FakeIpvs::unavailable`] behaves like a kernel without
/// IPVS.
#[derive(Debug, Clone)]
pub struct FakeIpvs {
    services: BTreeMap<ServiceKey, (VirtualServer, Vec<RealServer>)>,
    schedulers: BTreeSet<String>,
    info: IpvsInfo,
    timeouts: IpvsTimeouts,
    unavailable: bool,
    fail_apply: Option<i32>,
    fail_dump: Option<i32>,
    failing: BTreeMap<ServiceKey, i32>,
    applied: Vec<IpvsOp>,
    apply_calls: usize,
    dumps: usize,
}

impl Default for FakeIpvs {
    fn default() -> Self {
        FakeIpvs::new()
    }
}

impl FakeIpvs {
    /// An empty table with [`DEFAULT_SCHEDULERS`], version 1.2.1 and 4096 connection
    /// buckets.
    pub fn new() -> FakeIpvs {
        FakeIpvs {
            services: BTreeMap::new(),
            schedulers: DEFAULT_SCHEDULERS.iter().map(|s| (*s).to_owned()).collect(),
            info: IpvsInfo {
                version: (1, 2, 1),
                conn_table_size: 4096,
            },
            timeouts: IpvsTimeouts::KERNEL_DEFAULTS,
            unavailable: false,
            fail_apply: None,
            fail_dump: None,
            failing: BTreeMap::new(),
            applied: Vec::new(),
            apply_calls: 0,
            dumps: 0,
        }
    }

    /// A kernel without IPVS: every call fails with [`Error::IpvsUnavailable`].
    pub fn unavailable() -> FakeIpvs {
        FakeIpvs {
            unavailable: true,
            ..FakeIpvs::new()
        }
    }

    /// Only these schedulers exist (others are `ENOENT`).
    pub fn with_schedulers<I, S>(mut self, schedulers: I) -> FakeIpvs
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.schedulers = schedulers.into_iter().map(Into::into).collect();
        self
    }

    /// What [`IpvsOps::info`] reports.
    pub fn with_info(mut self, info: IpvsInfo) -> FakeIpvs {
        self.info = info;
        self
    }

    /// The table as configured: every virtual server (flags without [`SVC_F_HASHED`])
    /// with its real servers, in key order.
    pub fn state(&self) -> Vec<(VirtualServer, Vec<RealServer>)> {
        self.services.values().cloned().collect()
    }

    /// One virtual server, if it exists.
    pub fn service(&self, key: &ServiceKey) -> Option<&VirtualServer> {
        self.services.get(key).map(|(vs, _)| vs)
    }

    /// The real servers of one virtual server, if it exists (newest first).
    pub fn dests(&self, key: &ServiceKey) -> Option<&[RealServer]> {
        self.services.get(key).map(|(_, d)| d.as_slice())
    }

    /// Sets a real server's connection counters (as traffic would); `false` if there is
    /// no such real server.
    pub fn set_conns(
        &mut self,
        key: &ServiceKey,
        dest: SocketAddr,
        active: u32,
        inactive: u32,
    ) -> bool {
        let Some((_, dests)) = self.services.get_mut(key) else {
            return false;
        };
        match dests.iter_mut().find(|d| d.socket_addr() == dest) {
            Some(d) => {
                d.active_conns = active;
                d.inactive_conns = inactive;
                true
            }
            None => false,
        }
    }

    /// Every op that succeeded, in order.
    pub fn applied(&self) -> &[IpvsOp] {
        &self.applied
    }

    /// How many times [`IpvsOps::apply`] was called (including failed calls).
    pub fn apply_calls(&self) -> usize {
        self.apply_calls
    }

    /// How many dumps ([`IpvsOps::services`], [`IpvsOps::destinations`]) were made.
    pub fn dumps(&self) -> usize {
        self.dumps
    }

    /// Makes the next [`IpvsOps::apply`] fail as a whole with [`Error::Kernel`] carrying
    /// `code` (a positive errno), applying nothing.
    pub fn fail_next_apply(&mut self, code: i32) {
        self.fail_apply = Some(code);
    }

    /// Makes the next dump fail with [`Error::Kernel`] carrying `code`.
    pub fn fail_next_dump(&mut self, code: i32) {
        self.fail_dump = Some(code);
    }

    /// Makes every op on `key` fail with `code` (`Some`) until cleared (`None`): a partial
    /// failure inside a batch.
    pub fn fail_ops_on(&mut self, key: ServiceKey, code: Option<i32>) {
        match code {
            Some(code) => self.failing.insert(key, code),
            None => self.failing.remove(&key),
        };
    }

    fn check_available(&self, op: &str) -> Result<()> {
        if self.unavailable {
            return Err(Error::IpvsUnavailable {
                op: format!("{op} (fake)"),
            });
        }
        Ok(())
    }

    fn dump_check(&mut self, op: &str) -> Result<()> {
        self.check_available(op)?;
        self.dumps += 1;
        if let Some(code) = self.fail_dump.take() {
            return Err(Error::Kernel {
                op: format!("{op} (fake)"),
                code,
            });
        }
        Ok(())
    }

    fn apply_one(&mut self, op: &IpvsOp) -> std::result::Result<(), Errno> {
        wire::check_op(op)?;
        if let Some(code) = self.failing.get(&op.key()) {
            return Err(Errno::from_raw(*code));
        }
        let exists = self.services.contains_key(&op.key());
        match op {
            IpvsOp::AddService(_) if exists => return Err(Errno::EEXIST),
            IpvsOp::AddService(_) => {}
            _ if !exists => return Err(Errno::ESRCH),
            _ => {}
        }
        let key = op.key();
        match op {
            IpvsOp::AddService(vs) | IpvsOp::EditService(vs) => {
                if !self.schedulers.contains(&vs.scheduler) {
                    return Err(Errno::ENOENT);
                }
                let stored = VirtualServer {
                    flags: vs.flags & !SVC_F_HASHED,
                    ..vs.clone()
                };
                match self.services.get_mut(&key) {
                    Some((current, _)) => *current = stored,
                    None => {
                        self.services.insert(key, (stored, Vec::new()));
                    }
                }
            }
            IpvsOp::DelService(_) => {
                self.services.remove(&key);
            }
            IpvsOp::AddDest(_, rs) | IpvsOp::EditDest(_, rs) => {
                if rs.addr.is_ipv4() != key.addr.is_ipv4() && rs.forward != Forward::Tunnel {
                    return Err(Errno::EINVAL);
                }
                if rs.weight > i32::MAX as u32 {
                    return Err(Errno::ERANGE);
                }
                let Some((_, dests)) = self.services.get_mut(&key) else {
                    return Err(Errno::ESRCH);
                };
                let found = dests
                    .iter_mut()
                    .find(|d| d.socket_addr() == rs.socket_addr());
                match (op, found) {
                    (IpvsOp::AddDest(..), Some(_)) => return Err(Errno::EEXIST),
                    (IpvsOp::AddDest(..), None) => dests.insert(
                        0,
                        RealServer {
                            active_conns: 0,
                            inactive_conns: 0,
                            ..rs.clone()
                        },
                    ),
                    (_, Some(d)) => {
                        d.weight = rs.weight;
                        d.forward = rs.forward;
                    }
                    (_, None) => return Err(Errno::ENOENT),
                }
            }
            IpvsOp::DelDest(_, dest) => {
                let Some((_, dests)) = self.services.get_mut(&key) else {
                    return Err(Errno::ESRCH);
                };
                let before = dests.len();
                dests.retain(|d| d.socket_addr() != *dest);
                if dests.len() == before {
                    return Err(Errno::ENOENT);
                }
            }
        }
        Ok(())
    }
}

impl IpvsOps for FakeIpvs {
    fn info(&mut self) -> Result<IpvsInfo> {
        self.check_available("reading IPVS version and table size")?;
        Ok(self.info)
    }

    fn services(&mut self) -> Result<Vec<VirtualServer>> {
        self.dump_check("dumping IPVS virtual servers")?;
        Ok(self
            .services
            .values()
            .map(|(vs, _)| VirtualServer {
                flags: vs.flags | SVC_F_HASHED,
                ..vs.clone()
            })
            .collect())
    }

    fn destinations(&mut self, svc: &ServiceKey) -> Result<Vec<RealServer>> {
        self.dump_check(&format!("dumping the real servers of {svc}"))?;
        Ok(self.dests(svc).map(<[_]>::to_vec).unwrap_or_default())
    }

    fn apply(&mut self, ops: &[IpvsOp]) -> Result<Vec<std::result::Result<(), OpError>>> {
        self.check_available("applying IPVS changes")?;
        self.apply_calls += 1;
        if let Some(code) = self.fail_apply.take() {
            return Err(Error::Kernel {
                op: format!("applying {} IPVS changes (fake)", ops.len()),
                code,
            });
        }
        Ok(ops
            .iter()
            .map(|op| {
                self.apply_one(op)
                    .map_err(|errno| OpError::new(op, errno))?;
                self.applied.push(op.clone());
                Ok(())
            })
            .collect())
    }

    fn flush(&mut self) -> Result<()> {
        self.check_available("flushing the IPVS table")?;
        self.services.clear();
        Ok(())
    }

    fn timeouts(&mut self) -> Result<IpvsTimeouts> {
        self.check_available("reading IPVS timeouts")?;
        Ok(self.timeouts)
    }

    fn set_timeouts(&mut self, timeouts: IpvsTimeouts) -> Result<()> {
        let op = format!(
            "setting IPVS timeouts (like `ipvsadm --set {} {} {}`)",
            timeouts.tcp, timeouts.tcp_fin, timeouts.udp
        );
        self.check_available(&op)?;
        if [timeouts.tcp, timeouts.tcp_fin, timeouts.udp]
            .iter()
            .any(|t| *t > TIMEOUT_MAX)
        {
            return Err(Error::Kernel {
                op: format!("{op} (fake)"),
                code: Errno::EINVAL as i32,
            });
        }
        self.timeouts = self.timeouts.updated_by(timeouts);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::flow::proto;

    fn key(s: &str, protocol: u8) -> ServiceKey {
        let sa: SocketAddr = s.parse().unwrap();
        ServiceKey::new(sa.ip(), protocol, sa.port())
    }

    fn rs(s: &str, weight: u32) -> RealServer {
        let sa: SocketAddr = s.parse().unwrap();
        RealServer::new(sa.ip(), sa.port(), weight)
    }

    fn codes(results: &[std::result::Result<(), OpError>]) -> Vec<Option<Errno>> {
        results
            .iter()
            .map(|r| r.as_ref().err().map(OpError::errno))
            .collect()
    }

    #[test]
    fn services_follow_the_kernel() {
        let mut fake = FakeIpvs::new().with_schedulers(["rr", "wrr"]);
        let k = key("10.96.0.1:443", proto::TCP);
        let other = key("10.96.0.2:443", proto::TCP);
        let results = fake
            .apply(&[
                IpvsOp::AddService(VirtualServer::new(k, "rr")),
                IpvsOp::AddService(VirtualServer::new(k, "rr")),
                IpvsOp::AddService(VirtualServer::new(other, "mh")),
                IpvsOp::EditService(VirtualServer::new(other, "rr")),
                IpvsOp::DelService(other),
                IpvsOp::EditService(VirtualServer::new(k, "nosuch")),
                IpvsOp::EditService(VirtualServer::new(k, "wrr").persistent(10800)),
                IpvsOp::AddService(VirtualServer::new(other, "a-name-too-long-for-ipvs")),
            ])
            .unwrap();
        assert_eq!(
            codes(&results),
            [
                None,
                Some(Errno::EEXIST),
                Some(Errno::ENOENT),
                Some(Errno::ESRCH),
                Some(Errno::ESRCH),
                Some(Errno::ENOENT),
                None,
                Some(Errno::EINVAL),
            ]
        );
        assert_eq!(fake.applied().len(), 2);
        let dumped = fake.services().unwrap();
        assert_eq!(dumped.len(), 1);
        assert_eq!(
            dumped[0].flags,
            super::super::SVC_F_PERSISTENT | SVC_F_HASHED
        );
        assert!(dumped[0].same_config(&VirtualServer::new(k, "wrr").persistent(10800)));
        assert_eq!(fake.state()[0].0.flags, super::super::SVC_F_PERSISTENT);
    }

    #[test]
    fn destinations_follow_the_kernel() {
        let mut fake = FakeIpvs::new();
        let k = key("10.96.0.1:443", proto::TCP);
        let missing = key("10.96.0.9:443", proto::TCP);
        let a = rs("10.0.0.4:6443", 1);
        let b = rs("10.0.0.5:6443", 1);
        let v6 = rs("[fd00::4]:6443", 1);
        let results = fake
            .apply(&[
                IpvsOp::AddService(VirtualServer::new(k, "rr")),
                IpvsOp::AddDest(k, a.clone()),
                IpvsOp::AddDest(k, b.clone()),
                IpvsOp::AddDest(k, a.clone()),
                IpvsOp::AddDest(missing, a.clone()),
                IpvsOp::AddDest(k, rs("10.0.0.6:6443", u32::MAX)),
                IpvsOp::AddDest(k, v6.clone()),
                IpvsOp::EditDest(
                    k,
                    RealServer {
                        weight: 0,
                        ..b.clone()
                    },
                ),
                IpvsOp::EditDest(k, rs("10.0.0.7:1", 1)),
                IpvsOp::DelDest(k, "10.0.0.7:1".parse().unwrap()),
                IpvsOp::DelDest(missing, a.socket_addr()),
                IpvsOp::DelDest(k, a.socket_addr()),
            ])
            .unwrap();
        assert_eq!(
            codes(&results),
            [
                None,
                None,
                None,
                Some(Errno::EEXIST),
                Some(Errno::ESRCH),
                Some(Errno::ERANGE),
                Some(Errno::EINVAL),
                None,
                Some(Errno::ENOENT),
                Some(Errno::ENOENT),
                Some(Errno::ESRCH),
                None,
            ]
        );
        assert_eq!(
            fake.destinations(&k).unwrap(),
            [RealServer {
                weight: 0,
                ..b.clone()
            }]
        );
        assert!(fake.destinations(&missing).unwrap().is_empty());

        // Another family is fine for a tunnel; newest first.
        let tunnel = RealServer {
            forward: Forward::Tunnel,
            ..v6
        };
        assert!(fake.apply(&[IpvsOp::AddDest(k, tunnel.clone())]).unwrap()[0].is_ok());
        assert_eq!(fake.dests(&k).unwrap()[0], tunnel);

        // Counters are kept by edits, and a deleted service takes its real servers along.
        assert!(fake.set_conns(&k, b.socket_addr(), 3, 7));
        fake.apply(&[IpvsOp::EditDest(k, b.clone())]).unwrap();
        let edited = fake.dests(&k).unwrap()[1].clone();
        assert_eq!(
            (edited.weight, edited.active_conns, edited.inactive_conns),
            (1, 3, 7)
        );
        fake.apply(&[IpvsOp::DelService(k)]).unwrap();
        assert!(fake.state().is_empty());
    }

    #[test]
    fn faults_and_flush() {
        let mut fake = FakeIpvs::new();
        let k = key("10.96.0.1:443", proto::TCP);
        let other = key("10.96.0.2:53", proto::UDP);
        fake.fail_next_apply(Errno::EPERM as i32);
        let err = fake
            .apply(&[IpvsOp::AddService(VirtualServer::new(k, "rr"))])
            .unwrap_err();
        assert_eq!(err.code(), Some(Errno::EPERM as i32));
        assert!(fake.state().is_empty());

        fake.fail_ops_on(other, Some(Errno::ENOMEM as i32));
        let results = fake
            .apply(&[
                IpvsOp::AddService(VirtualServer::new(other, "rr")),
                IpvsOp::AddService(VirtualServer::new(k, "rr")),
            ])
            .unwrap();
        assert_eq!(codes(&results), [Some(Errno::ENOMEM), None]);
        fake.fail_ops_on(other, None);
        assert!(
            fake.apply(&[IpvsOp::AddService(VirtualServer::new(other, "rr"))])
                .unwrap()[0]
                .is_ok()
        );
        assert_eq!(fake.apply_calls(), 3);

        fake.fail_next_dump(Errno::EINTR as i32);
        assert!(fake.services().is_err());
        assert_eq!(fake.services().unwrap().len(), 2);
        fake.flush().unwrap();
        assert!(fake.services().unwrap().is_empty());
        assert_eq!(fake.dumps(), 3);
        assert_eq!(fake.info().unwrap().version, (1, 2, 1));

        let mut none = FakeIpvs::unavailable();
        assert!(matches!(none.info(), Err(Error::IpvsUnavailable { .. })));
        assert!(matches!(
            none.apply(&[]),
            Err(Error::IpvsUnavailable { .. })
        ));
    }

    #[test]
    fn usable_as_a_trait_object() {
        let mut boxed: Box<dyn IpvsOps> = Box::new(FakeIpvs::new());
        let k = key("10.96.0.1:443", proto::TCP);
        assert!(
            boxed
                .apply(&[IpvsOp::AddService(VirtualServer::new(k, "rr"))])
                .unwrap()[0]
                .is_ok()
        );
        assert_eq!(super::super::dump_all(&mut *boxed).unwrap().len(), 1);
    }
}
