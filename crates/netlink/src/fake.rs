//! [`FakeConntrack`]: an in-memory conntrack table implementing [`ConntrackOps`] with the
//! kernel's lookup rules, so the proxier's cleanup can be tested without a kernel.

use crate::conntrack::ConntrackOps;
use crate::error::{Error, Result};
use crate::flow::{Family, Flow, Tuple};
use crate::message;

/// An in-memory conntrack table.
///
/// * [`ConntrackOps::dump`] returns the family's flows (optionally of one protocol) in
///   insertion order.
/// * [`ConntrackOps::delete`] behaves like the kernel's `IPCTNL_MSG_CT_DELETE`: the tuple
///   is looked up in both directions of every entry of the same zone (the kernel's hash
///   holds both), an id, if given, must match, and a miss is `Ok(false)` (`ENOENT`).
///   Requests the real handle cannot build are [`Error::Unsupported`] here too.
/// * [`FakeConntrack::fail_next_dump`] / [`FakeConntrack::fail_next_delete`] make the next
///   call fail with a kernel error code, for error-path tests.
#[derive(Debug, Clone, Default)]
pub struct FakeConntrack {
    flows: Vec<Flow>,
    deleted: Vec<Flow>,
    next_id: u32,
    dumps: usize,
    fail_dump: Option<i32>,
    fail_delete: Option<i32>,
}

impl FakeConntrack {
    /// An empty table.
    pub fn new() -> FakeConntrack {
        FakeConntrack::default()
    }

    /// A table holding `flows` (inserted with [`FakeConntrack::insert`]).
    pub fn with_flows(flows: impl IntoIterator<Item = Flow>) -> FakeConntrack {
        let mut fake = FakeConntrack::new();
        for flow in flows {
            fake.insert(flow);
        }
        fake
    }

    /// Adds an entry, like `conntrack -I`; an entry without an id gets the next free one.
    ///
    /// Returns `false` (and changes nothing) when an entry of the same zone already holds
    /// either of its tuples, as the kernel refuses with `EEXIST`.
    pub fn insert(&mut self, mut flow: Flow) -> bool {
        let clash = self.flows.iter().any(|f| {
            f.zone == flow.zone && [flow.original, flow.reply].iter().any(|t| holds(f, t))
        });
        if clash {
            return false;
        }
        if flow.id.is_none() {
            self.next_id = self.next_id.wrapping_add(1);
            flow.id = Some(self.next_id);
        }
        self.flows.push(flow);
        true
    }

    /// The entries in the table, in insertion order.
    pub fn flows(&self) -> &[Flow] {
        &self.flows
    }

    /// Every entry deleted so far, in order.
    pub fn deleted(&self) -> &[Flow] {
        &self.deleted
    }

    /// How many dumps were made (including failed ones).
    pub fn dumps(&self) -> usize {
        self.dumps
    }

    /// Makes the next dump fail with [`Error::Kernel`] carrying `code` (a positive errno).
    pub fn fail_next_dump(&mut self, code: i32) {
        self.fail_dump = Some(code);
    }

    /// Makes the next delete fail with [`Error::Kernel`] carrying `code` (a positive errno).
    pub fn fail_next_delete(&mut self, code: i32) {
        self.fail_delete = Some(code);
    }
}

/// Whether `tuple` is one of `flow`'s two directions.
fn holds(flow: &Flow, tuple: &Tuple) -> bool {
    flow.original == *tuple || flow.reply == *tuple
}

impl ConntrackOps for FakeConntrack {
    fn dump(&mut self, family: Family, proto: Option<u8>) -> Result<Vec<Flow>> {
        self.dumps += 1;
        if let Some(code) = self.fail_dump.take() {
            return Err(Error::Kernel {
                op: format!("dumping {family} conntrack entries (fake)"),
                code,
            });
        }
        Ok(self
            .flows
            .iter()
            .filter(|f| f.family == family && proto.is_none_or(|p| f.original.proto == p))
            .cloned()
            .collect())
    }

    fn delete(&mut self, flow: &Flow) -> Result<bool> {
        let op = || format!("deleting conntrack entry {flow} (fake)");
        message::check_deletable(flow).map_err(|reason| Error::Unsupported { op: op(), reason })?;
        if let Some(code) = self.fail_delete.take() {
            return Err(Error::Kernel { op: op(), code });
        }
        let found = self
            .flows
            .iter()
            .position(|f| f.zone == flow.zone && holds(f, &flow.original));
        match found {
            Some(i) if flow.id.is_none() || flow.id == self.flows[i].id => {
                let removed = self.flows.remove(i);
                self.deleted.push(removed);
                Ok(true)
            }
            _ => Ok(false),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::flow::proto;

    fn flow(client_port: u16, endpoint: &str) -> Flow {
        Flow::udp(
            format!("192.168.56.100:{client_port}").parse().unwrap(),
            "10.96.0.53:53".parse().unwrap(),
            endpoint.parse().unwrap(),
        )
    }

    #[test]
    fn delete_matching_removes_only_selected_flows() {
        let mut v6 = Flow::udp(
            "[fd00::100]:1".parse().unwrap(),
            "[fd00:10:96::35]:53".parse().unwrap(),
            "[fd00:10:244::a]:53".parse().unwrap(),
        );
        v6.id = Some(1000);
        let mut ct = FakeConntrack::with_flows([
            flow(40000, "10.244.1.10:53"),
            flow(40001, "10.244.1.11:53"),
            flow(40002, "10.96.0.53:53"), // created while there were no endpoints
            v6.clone(),
        ]);
        assert_eq!(ct.flows()[0].id, Some(1));
        let keep: std::net::IpAddr = "10.244.1.11".parse().unwrap();
        let deleted = ct
            .delete_matching(Family::V4, |f| {
                f.original_dst() == "10.96.0.53:53".parse().unwrap() && f.reply.src != keep
            })
            .unwrap();
        assert_eq!(deleted, 2);
        assert_eq!(ct.deleted().len(), 2);
        let left: Vec<_> = ct.flows().iter().map(|f| f.original.src_port).collect();
        assert_eq!(left, [40001, 1]);
        assert_eq!(ct.dump(Family::V6, Some(proto::UDP)).unwrap(), vec![v6]);
        assert!(ct.dump(Family::V6, Some(proto::TCP)).unwrap().is_empty());
        assert_eq!(ct.dumps(), 3);
    }

    #[test]
    fn delete_follows_the_kernel() {
        let mut ct = FakeConntrack::new();
        let f = flow(40000, "10.244.1.10:53");
        assert!(ct.insert(f.clone()));
        assert!(!ct.insert(f.clone()), "same tuple: EEXIST");
        let mut zoned = f.clone();
        zoned.zone = 7;
        assert!(ct.insert(zoned.clone()), "other zone");

        // A wrong id misses; the reply tuple finds the entry too; a second delete misses.
        let mut stale_id = f.clone();
        stale_id.id = Some(99);
        assert!(!ct.delete(&stale_id).unwrap());
        let mut by_reply = f.clone();
        by_reply.original = f.reply;
        assert!(ct.delete(&by_reply).unwrap());
        assert!(!ct.delete(&f).unwrap());
        assert_eq!(
            ct.flows(),
            [Flow {
                id: Some(2),
                ..zoned
            }]
        );

        let mut icmp = f.clone();
        icmp.original.proto = proto::ICMP;
        assert!(matches!(ct.delete(&icmp), Err(Error::Unsupported { .. })));
    }

    #[test]
    fn injected_errors() {
        let mut ct = FakeConntrack::with_flows([flow(40000, "10.244.1.10:53")]);
        ct.fail_next_dump(1);
        let err = ct.delete_matching(Family::V4, |_| true).unwrap_err();
        assert_eq!(err.code(), Some(1));
        ct.fail_next_delete(16);
        let err = ct.delete_matching(Family::V4, |_| true).unwrap_err();
        assert_eq!(err.code(), Some(16));
        assert_eq!(ct.delete_matching(Family::V4, |_| true).unwrap(), 1);
        assert!(ct.flows().is_empty());
    }

    #[test]
    fn usable_as_a_trait_object() {
        let mut boxed: Box<dyn ConntrackOps> =
            Box::new(FakeConntrack::with_flows([flow(1, "10.244.1.10:53")]));
        assert_eq!(boxed.delete_matching(Family::V4, |_| true).unwrap(), 1);
    }
}
