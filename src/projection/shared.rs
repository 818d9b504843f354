//! One copy of each string that many cached objects repeat.
//!
//! Every volume and claim carries the same annotation keys
//! (`pv.kubernetes.io/provisioned-by`, `volume.kubernetes.io/storage-provisioner`,
//! …), the same finalizers, driver, class, namespace, access modes and
//! phase. As owned `String`s they were one heap allocation each, some forty
//! per volume and claim pair: the largest part of what a cached pair still
//! cost after the maps and the metadata were made compact (the heap profile
//! in `docs/benchmarks.md`). A `Shared` is a pointer to one copy held by
//! a process-wide set, so the ten-thousandth copy of a key costs 16 bytes
//! inline and nothing on the heap.
//!
//! Only fields whose values repeat across objects are `Shared`; names,
//! uids and resourceVersions stay `String`s (interning a unique string
//! costs a set entry more than it saves). Strings no cached object holds
//! any more are dropped from the set by [`forget_unused`], which the
//! periodic memory release calls (`src/memory.rs`).

use std::borrow::Borrow;
use std::collections::HashSet;
use std::fmt;
use std::ops::Deref;
use std::sync::{Arc, LazyLock, Mutex, PoisonError};

use serde::de::{Deserializer, Visitor};
use serde::{Deserialize, Serialize, Serializer};

/// An immutable string, one copy per distinct value in the process.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Shared(Arc<str>);

static STRINGS: LazyLock<Mutex<HashSet<Arc<str>>>> = LazyLock::new(Mutex::default);

impl Shared {
    /// The one copy of `value`, added to the set if it is new.
    pub fn new(value: &str) -> Self {
        // A poisoned lock only means a panic elsewhere while the set was
        // held; the set itself is always whole.
        let mut strings = STRINGS.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(present) = strings.get(value) {
            return Shared(Arc::clone(present));
        }
        let added: Arc<str> = Arc::from(value);
        strings.insert(Arc::clone(&added));
        Shared(added)
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Drops from the set every string that no `Shared` refers to any more
/// (the objects that held it were deleted or changed); returns how many.
pub fn forget_unused() -> usize {
    let mut strings = STRINGS.lock().unwrap_or_else(PoisonError::into_inner);
    let before = strings.len();
    // The set's own reference is the only one left.
    strings.retain(|s| Arc::strong_count(s) > 1);
    if strings.capacity() > 2 * strings.len() + 64 {
        strings.shrink_to_fit();
    }
    before - strings.len()
}

/// An optional field converted between `String` and `Shared` (either way),
/// for the conversions between projections and the full API types.
pub(super) fn convert<A: Clone + Into<B>, B>(value: &Option<A>) -> Option<B> {
    value.clone().map(Into::into)
}

/// [`convert`] for a list.
pub(super) fn convert_all<A: Clone + Into<B>, B>(values: &Option<Vec<A>>) -> Option<Vec<B>> {
    values
        .as_ref()
        .map(|all| all.iter().cloned().map(Into::into).collect())
}

impl Default for Shared {
    fn default() -> Self {
        Shared::new("")
    }
}

impl Deref for Shared {
    type Target = str;

    fn deref(&self) -> &str {
        &self.0
    }
}

impl AsRef<str> for Shared {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl Borrow<str> for Shared {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl From<&str> for Shared {
    fn from(value: &str) -> Self {
        Shared::new(value)
    }
}

impl From<String> for Shared {
    fn from(value: String) -> Self {
        Shared::new(&value)
    }
}

impl From<&String> for Shared {
    fn from(value: &String) -> Self {
        Shared::new(value)
    }
}

impl From<Shared> for String {
    fn from(value: Shared) -> Self {
        value.as_str().to_owned()
    }
}

impl From<&Shared> for String {
    fn from(value: &Shared) -> Self {
        value.as_str().to_owned()
    }
}

impl PartialEq<str> for Shared {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}

impl PartialEq<&str> for Shared {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

impl PartialEq<String> for Shared {
    fn eq(&self, other: &String) -> bool {
        self.as_str() == other.as_str()
    }
}

impl PartialEq<Shared> for str {
    fn eq(&self, other: &Shared) -> bool {
        self == other.as_str()
    }
}

impl PartialEq<Shared> for &str {
    fn eq(&self, other: &Shared) -> bool {
        *self == other.as_str()
    }
}

impl PartialEq<Shared> for String {
    fn eq(&self, other: &Shared) -> bool {
        self.as_str() == other.as_str()
    }
}

impl fmt::Debug for Shared {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

impl fmt::Display for Shared {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for Shared {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for Shared {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Interned;

        impl Visitor<'_> for Interned {
            type Value = Shared;

            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_str<E: serde::de::Error>(self, value: &str) -> Result<Shared, E> {
                Ok(Shared::new(value))
            }
        }

        // Borrowed or escaped, the text is read once and never kept: the
        // set's copy is the only one.
        d.deserialize_str(Interned)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_strings_share_one_copy() {
        let a = Shared::new("shared-test/one-copy");
        let b: Shared = serde_json::from_str(r#""shared-test/one-copy""#).unwrap();
        let c = Shared::from("shared-test/one-copy".to_owned());
        assert!(Arc::ptr_eq(&a.0, &b.0));
        assert!(Arc::ptr_eq(&a.0, &c.0));
        assert_eq!(a, "shared-test/one-copy");
        assert_eq!(
            serde_json::to_string(&a).unwrap(),
            r#""shared-test/one-copy""#
        );
        assert_eq!(
            format!("{a} {a:?}"),
            r#"shared-test/one-copy "shared-test/one-copy""#
        );
        // Escapes are decoded before the lookup.
        let escaped: Shared = serde_json::from_str(r#""shared-test\/one-copy""#).unwrap();
        assert!(Arc::ptr_eq(&a.0, &escaped.0));
    }

    #[test]
    fn a_string_nobody_holds_is_forgotten() {
        let kept = Shared::new("shared-test/kept");
        drop(Shared::new("shared-test/dropped"));
        forget_unused();
        let strings = STRINGS.lock().unwrap();
        assert!(strings.contains("shared-test/kept"));
        assert!(!strings.contains("shared-test/dropped"));
        drop(strings);
        drop(kept);
    }

    #[test]
    fn smaller_than_a_string_inline() {
        assert_eq!(std::mem::size_of::<Shared>(), 16);
        assert_eq!(std::mem::size_of::<Option<Shared>>(), 16);
    }
}
