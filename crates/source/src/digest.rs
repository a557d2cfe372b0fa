//! [`Digest`]: what a source remembers of an object it delivered, instead of the object.
//!
//! A source must know what it sent to tell a changed object from an unchanged one (a relist,
//! a reloaded manifest file). Keeping the objects for that would hold a second copy of every
//! Service and EndpointSlice beside the tracker's (~20 MiB at 10,000 Services x 10
//! endpoints). A digest is 16 bytes: two 64-bit SipHash-1-3 hashes of the converted object,
//! each after a different prefix byte, so two different objects compare equal (and a change
//! is missed) with probability about 2^-128. Digests are compared within one process only.

use std::hash::{DefaultHasher, Hash, Hasher};

/// A 128-bit digest of an object (see the module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Digest(u64, u64);

impl Digest {
    /// The digest of `object`: equal objects have equal digests.
    pub fn of<T: Hash + ?Sized>(object: &T) -> Digest {
        let half = |prefix: u8| {
            let mut h = DefaultHasher::new();
            prefix.hash(&mut h);
            object.hash(&mut h);
            h.finish()
        };
        Digest(half(0), half(1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_objects_have_equal_digests_and_changes_show() {
        let a = ("default/web", vec![1u8, 2, 3]);
        assert_eq!(Digest::of(&a), Digest::of(&a.clone()));
        assert_ne!(
            Digest::of(&a),
            Digest::of(&("default/web", vec![1u8, 2, 4]))
        );
        let d = Digest::of(&a);
        assert_ne!(d.0, d.1, "the two halves are different hashes");
    }
}
