//! A small read-only map for the string maps that cached objects carry
//! (CSI volume attributes, capacities, storage requests).
//!
//! A `BTreeMap` allocates a whole node (eleven keys and eleven values, 544
//! bytes for strings) for its first entry, and most of these maps have one
//! to three entries: a heap profile of 10,000 of our own PVs and claims
//! showed the maps' nodes as the largest single cost of the caches, more
//! than the objects themselves. A `Map` is one allocation of exactly its
//! entries, sorted by key. It reads like a `BTreeMap` (`get`, `iter`,
//! `contains_key`), so code reading a projection looks the same as code
//! reading the full object; `iter` and `keys` yield keys as `&str`.
//! Keys, and the values of string maps, are [`Shared`]: the same annotation
//! key in ten thousand claims is one string. It is rarely written (a claim
//! built from a template, a copy with one more annotation): an insert
//! copies the entries.

use std::collections::BTreeMap;
use std::fmt;

use serde::de::{Deserializer, MapAccess, Visitor};
use serde::{Deserialize, Serialize, Serializer};

use super::Shared;

/// Sorted `(key, value)` pairs, keys unique.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Map<V = Shared> {
    entries: Box<[(Shared, V)]>,
}

impl<V> Default for Map<V> {
    fn default() -> Self {
        Self {
            entries: Box::default(),
        }
    }
}

impl<V> Map<V> {
    fn position(&self, key: &str) -> Result<usize, usize> {
        self.entries
            .binary_search_by(|(present, _)| present.as_str().cmp(key))
    }

    /// The value of `key`, as `BTreeMap::get` returns it.
    pub fn get(&self, key: &str) -> Option<&V> {
        self.position(key).ok().map(|at| &self.entries[at].1)
    }

    pub fn contains_key(&self, key: &str) -> bool {
        self.position(key).is_ok()
    }

    /// The entries in key order, as `BTreeMap::iter` yields them.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = (&str, &V)> + Clone {
        self.entries.iter().map(|(k, v)| (k.as_str(), v))
    }

    pub fn keys(&self) -> impl ExactSizeIterator<Item = &str> + Clone {
        self.entries.iter().map(|(k, _)| k.as_str())
    }

    pub fn values(&self) -> impl ExactSizeIterator<Item = &V> + Clone {
        self.entries.iter().map(|(_, v)| v)
    }

    /// Sets `key` to `value`, as `BTreeMap::insert` (without the old
    /// value).
    pub fn insert(&mut self, key: impl Into<Shared>, value: impl Into<V>) {
        let (key, value) = (key.into(), value.into());
        match self.position(&key) {
            Ok(at) => self.entries[at].1 = value,
            Err(at) => {
                let mut entries = std::mem::take(&mut self.entries).into_vec();
                entries.insert(at, (key, value));
                self.entries = entries.into_boxed_slice();
            }
        }
    }

    /// Removes `key`, as `BTreeMap::remove`.
    pub fn remove(&mut self, key: &str) -> Option<V> {
        let at = self.position(key).ok()?;
        let mut entries = std::mem::take(&mut self.entries).into_vec();
        let (_, value) = entries.remove(at);
        self.entries = entries.into_boxed_slice();
        Some(value)
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

impl<V: Clone> Map<V> {
    /// The same entries in a `BTreeMap` of owned values (for the full API
    /// types).
    pub fn to_btree<T>(&self) -> BTreeMap<String, T>
    where
        V: Into<T>,
    {
        self.entries
            .iter()
            .map(|(k, v)| (k.as_str().to_owned(), v.clone().into()))
            .collect()
    }
}

impl Map {
    /// The entries as owned strings (for the full API types), moved.
    pub fn into_strings(self) -> BTreeMap<String, String> {
        self.into_iter()
            .map(|(k, v)| (String::from(k), String::from(v)))
            .collect()
    }
}

impl<K: Into<Shared>, T: Into<V>, V> Extend<(K, T)> for Map<V> {
    fn extend<I: IntoIterator<Item = (K, T)>>(&mut self, iter: I) {
        let entries = std::mem::take(&mut self.entries).into_vec();
        let added = iter.into_iter().map(|(k, v)| (k.into(), v.into()));
        *self = entries.into_iter().chain(added).collect();
    }
}

impl<V> std::ops::Index<&str> for Map<V> {
    type Output = V;

    /// As `BTreeMap`'s: panics when `key` is absent.
    fn index(&self, key: &str) -> &V {
        self.get(key).expect("no entry for the key in the Map")
    }
}

impl<K: Into<Shared>, T: Into<V>, V> FromIterator<(K, T)> for Map<V> {
    /// Later entries win over earlier ones with the same key, as with a
    /// `BTreeMap`.
    fn from_iter<I: IntoIterator<Item = (K, T)>>(iter: I) -> Self {
        let mut entries: Vec<(Shared, V)> = Vec::new();
        for (key, value) in iter {
            entries.push((key.into(), value.into()));
        }
        // Stable: equal keys keep their order, so the last one is last.
        entries.sort_by(|a, b| a.0.cmp(&b.0));
        let mut unique: Vec<(Shared, V)> = Vec::with_capacity(entries.len());
        for entry in entries {
            match unique.last_mut() {
                Some(last) if last.0 == entry.0 => *last = entry,
                _ => unique.push(entry),
            }
        }
        Self {
            entries: unique.into_boxed_slice(),
        }
    }
}

impl<T: Into<V>, V> From<BTreeMap<String, T>> for Map<V> {
    fn from(map: BTreeMap<String, T>) -> Self {
        // Already sorted and unique.
        Self {
            entries: map
                .into_iter()
                .map(|(k, v)| (Shared::from(k), v.into()))
                .collect::<Vec<_>>()
                .into_boxed_slice(),
        }
    }
}

impl<K: Into<Shared>, T: Into<V>, V, const N: usize> From<[(K, T); N]> for Map<V> {
    fn from(entries: [(K, T); N]) -> Self {
        entries.into_iter().collect()
    }
}

impl<T: Clone + Into<V>, V> From<&BTreeMap<String, T>> for Map<V> {
    fn from(map: &BTreeMap<String, T>) -> Self {
        Self {
            entries: map
                .iter()
                .map(|(k, v)| (Shared::from(k), v.clone().into()))
                .collect::<Vec<_>>()
                .into_boxed_slice(),
        }
    }
}

impl<'a, V> IntoIterator for &'a Map<V> {
    type Item = (&'a str, &'a V);
    type IntoIter =
        std::iter::Map<std::slice::Iter<'a, (Shared, V)>, fn(&'a (Shared, V)) -> (&'a str, &'a V)>;

    fn into_iter(self) -> Self::IntoIter {
        fn split<V>(entry: &(Shared, V)) -> (&str, &V) {
            (entry.0.as_str(), &entry.1)
        }
        self.entries.iter().map(split)
    }
}

impl<V> IntoIterator for Map<V> {
    type Item = (Shared, V);
    type IntoIter = std::vec::IntoIter<(Shared, V)>;

    fn into_iter(self) -> Self::IntoIter {
        self.entries.into_vec().into_iter()
    }
}

impl<V: fmt::Debug> fmt::Debug for Map<V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

impl<V: Serialize> Serialize for Map<V> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_map(self.iter())
    }
}

impl<'de, V: Deserialize<'de>> Deserialize<'de> for Map<V> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Entries<V>(std::marker::PhantomData<V>);

        impl<'de, V: Deserialize<'de>> Visitor<'de> for Entries<V> {
            type Value = Map<V>;

            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a map")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Map<V>, A::Error> {
                let mut entries = Vec::with_capacity(map.size_hint().unwrap_or(0).min(64));
                while let Some(entry) = map.next_entry::<Shared, V>()? {
                    entries.push(entry);
                }
                Ok(entries.into_iter().collect())
            }
        }

        d.deserialize_map(Entries(std::marker::PhantomData))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> Map {
        pairs.iter().map(|(k, v)| (*k, Shared::from(*v))).collect()
    }

    #[test]
    fn reads_like_a_btree_map() {
        let m = map(&[("b", "2"), ("a", "1"), ("c", "3")]);
        assert_eq!(m.get("a").map(Shared::as_str), Some("1"));
        assert_eq!(m.get("c").map(Shared::as_str), Some("3"));
        assert_eq!(m.get("d"), None);
        assert!(m.contains_key("b"));
        assert!(!m.contains_key(""));
        let keys: Vec<&str> = m.keys().collect();
        assert_eq!(keys, ["a", "b", "c"]);
        assert_eq!(m.len(), 3);
        assert!(Map::<Shared>::default().is_empty());
        assert_eq!(
            m.to_btree(),
            BTreeMap::from([
                ("a".to_owned(), "1".to_owned()),
                ("b".to_owned(), "2".to_owned()),
                ("c".to_owned(), "3".to_owned()),
            ])
        );
    }

    #[test]
    fn insert_keeps_the_keys_sorted_and_unique() {
        let mut m = map(&[("b", "2")]);
        m.insert("c", "3");
        m.insert("a", "1");
        m.insert("b", "two");
        assert_eq!(m, map(&[("a", "1"), ("b", "two"), ("c", "3")]));
    }

    #[test]
    fn a_repeated_key_keeps_its_last_value_as_a_btree_map_does() {
        let m = map(&[("k", "first"), ("a", "x"), ("k", "last")]);
        assert_eq!(m.len(), 2);
        assert_eq!(m.get("k").map(Shared::as_str), Some("last"));
    }

    #[test]
    fn json_round_trip_and_order() {
        let m: Map = serde_json::from_str(r#"{"z":"1","a":"2","m":"3"}"#).unwrap();
        assert_eq!(
            serde_json::to_string(&m).unwrap(),
            r#"{"a":"2","m":"3","z":"1"}"#
        );
        let from_btree = Map::from(m.to_btree::<String>());
        assert_eq!(from_btree, m);
        assert_eq!(format!("{m:?}"), r#"{"a": "2", "m": "3", "z": "1"}"#);
    }

    #[test]
    fn one_allocation_of_exactly_its_entries() {
        // The reason for the type: a BTreeMap's first entry costs a node
        // of eleven. Keys and values are shared, 16 bytes each.
        let m = map(&[("storage", "1Gi")]);
        assert_eq!(std::mem::size_of_val(&*m.entries), 32);
        assert_eq!(std::mem::size_of::<Map>(), 16);
    }
}
