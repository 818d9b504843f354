//! Per-object locks. Keys are `v:<volume name>` and `s:<snapshot name>`.
//! Deadlock freedom: keys are always acquired in ascending order — a call
//! that needs several locks either takes them in one [`KeyedLocks::lock`]
//! call (which sorts them) or takes later ones only when they sort after
//! every key it already holds (a snapshot key `s:` before a volume key
//! `v:`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

use tokio::sync::{Mutex as AsyncMutex, OwnedMutexGuard};

#[derive(Default)]
pub(crate) struct KeyedLocks {
    map: Mutex<HashMap<String, Weak<AsyncMutex<()>>>>,
}

/// Held locks; released on drop.
pub(crate) struct Guards {
    _guards: Vec<OwnedMutexGuard<()>>,
}

pub(crate) fn volume_key(name: &str) -> String {
    format!("v:{name}")
}

pub(crate) fn snapshot_key(name: &str) -> String {
    format!("s:{name}")
}

impl KeyedLocks {
    fn mutex(&self, key: &str) -> Arc<AsyncMutex<()>> {
        let mut map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(existing) = map.get(key).and_then(Weak::upgrade) {
            return existing;
        }
        if map.len() >= 1024 {
            map.retain(|_, weak| weak.strong_count() > 0);
        }
        let fresh = Arc::new(AsyncMutex::new(()));
        map.insert(key.to_owned(), Arc::downgrade(&fresh));
        fresh
    }

    /// Acquires all `keys` in ascending order (duplicates once).
    pub(crate) async fn lock(&self, mut keys: Vec<String>) -> Guards {
        keys.sort();
        keys.dedup();
        let mut guards = Vec::with_capacity(keys.len());
        for key in keys {
            guards.push(self.mutex(&key).lock_owned().await);
        }
        Guards { _guards: guards }
    }

    /// Acquires all `keys` if none is held now; `None` (and nothing held)
    /// otherwise.
    pub(crate) fn try_lock(&self, mut keys: Vec<String>) -> Option<Guards> {
        keys.sort();
        keys.dedup();
        let mut guards = Vec::with_capacity(keys.len());
        for key in keys {
            guards.push(self.mutex(&key).try_lock_owned().ok()?);
        }
        Some(Guards { _guards: guards })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn same_key_excludes_other_key_does_not() {
        let locks = Arc::new(KeyedLocks::default());
        let held = locks.lock(vec![volume_key("a")]).await;
        let other = tokio::time::timeout(
            Duration::from_millis(100),
            locks.lock(vec![volume_key("b"), snapshot_key("a")]),
        )
        .await;
        assert!(other.is_ok(), "unrelated keys must not block");
        drop(other);
        let same = tokio::time::timeout(
            Duration::from_millis(100),
            locks.lock(vec![volume_key("a")]),
        )
        .await;
        assert!(same.is_err(), "the same key must block");
        drop(held);
        let again = tokio::time::timeout(
            Duration::from_millis(100),
            locks.lock(vec![volume_key("a"), volume_key("a")]),
        )
        .await;
        assert!(
            again.is_ok(),
            "released key must be free, duplicates taken once"
        );
        drop(again);
        let held = locks.lock(vec![volume_key("b")]).await;
        assert!(
            locks
                .try_lock(vec![volume_key("b"), volume_key("a")])
                .is_none(),
            "a held key fails the try"
        );
        assert!(
            locks.try_lock(vec![volume_key("a")]).is_some(),
            "and the keys it took before are released"
        );
        drop(held);
        assert!(
            locks
                .try_lock(vec![volume_key("a"), volume_key("b")])
                .is_some()
        );
    }
}
