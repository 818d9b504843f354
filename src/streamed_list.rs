//! One list response, decoded object by object as its body arrives.
//!
//! The API server's watch cache answers a `resourceVersion=0` list with every
//! object at once, whatever the page size asked (Kubernetes 1.36 does, for
//! cached resources). Decoded whole, 50,000 PVs are the raw body plus a vector
//! of 50,000 objects before the first one is filtered: a start-up peak of
//! hundreds of MiB that the cache itself never needs. Here the body is fed
//! to a JSON decoder on a blocking thread as it arrives, and each element of
//! `items` is handed over as soon as it is decoded, through a bounded
//! channel: at any time the process holds a few body chunks and a few
//! hundred decoded objects, never the list.

use std::fmt;
use std::io::Read;

use bytes::Bytes;
use futures_util::AsyncReadExt;
use serde::Deserialize;
use serde::de::{
    DeserializeOwned, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor,
};
use tokio::sync::mpsc;

/// Batches of decoded objects waiting for the consumer: with
/// [`BATCH`], bounds the memory in flight to a few hundred objects.
const ITEMS_IN_FLIGHT: usize = 4;
/// Objects per message: one channel hand-over per object would cost more
/// than decoding it.
const BATCH: usize = 64;
/// Body chunks waiting for the decoder.
const CHUNKS_IN_FLIGHT: usize = 8;
const CHUNK_SIZE: usize = 64 * 1024;

/// What the list yields, in order: its objects, then its end.
#[derive(Debug)]
pub enum Item<K> {
    /// The next objects, in order.
    Objects(Vec<K>),
    /// The list's `metadata`: its resourceVersion and the continue token of
    /// the next page, if any.
    End {
        resource_version: String,
        continue_token: Option<String>,
    },
}

/// Why a list could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ListError {
    #[error(transparent)]
    Request(#[from] kube::Error),
    #[error("decoding the list: {0}")]
    Decode(#[from] serde_json::Error),
    #[error("the list's body ended before the list did")]
    Truncated,
}

/// Sends `request` (a list) and returns its objects as they are decoded.
/// API errors (a non-2xx answer) are returned here; a body that breaks off
/// or does not decode ends the channel with an error.
pub async fn open<K>(
    client: &kube::Client,
    request: http::Request<Vec<u8>>,
) -> Result<mpsc::Receiver<Result<Item<K>, ListError>>, ListError>
where
    K: DeserializeOwned + Send + 'static,
{
    let mut body = client.request_stream(request).await?;
    let (chunks_tx, chunks_rx) = mpsc::channel::<Bytes>(CHUNKS_IN_FLIGHT);
    let (items_tx, items_rx) = mpsc::channel(ITEMS_IN_FLIGHT);
    tokio::spawn(async move {
        let mut buffer = vec![0u8; CHUNK_SIZE];
        loop {
            match body.read(&mut buffer).await {
                Ok(0) => break,
                Ok(n) => {
                    if chunks_tx
                        .send(Bytes::copy_from_slice(&buffer[..n]))
                        .await
                        .is_err()
                    {
                        break;
                    }
                }
                // The decoder sees the body end early and says so.
                Err(e) => {
                    tracing::debug!(error = %e, "list body broke off");
                    break;
                }
            }
        }
    });
    tokio::task::spawn_blocking(move || decode(chunks_rx, &items_tx));
    Ok(items_rx)
}

/// Decodes the list read from `chunks` into `sink` (on a blocking thread),
/// its end or error last.
fn decode<K: DeserializeOwned>(chunks: mpsc::Receiver<Bytes>, sink: &Sink<K>) {
    let reader = ChunkReader {
        chunks,
        current: Bytes::new(),
        position: 0,
    };
    // The JSON decoder reads a byte at a time, and std reads a byte from a
    // `BufReader` inline, from its buffer. From the bare reader each byte
    // was a call and a one-byte copy: a quarter of the sidecar's CPU while
    // it lists 50,000 PVs and claims (docs/benchmarks.md).
    let reader = std::io::BufReader::with_capacity(CHUNK_SIZE, reader);
    let mut decoder = serde_json::Deserializer::from_reader(reader);
    let last = match (ListSeed { sink }).deserialize(&mut decoder) {
        Ok(Some(end)) => Ok(end),
        // The consumer is gone: nothing to tell.
        Ok(None) => return,
        Err(e) if e.is_eof() => Err(ListError::Truncated),
        Err(e) => Err(ListError::Decode(e)),
    };
    let _ = sink.blocking_send(last);
}

/// A `std::io::Read` over the body chunks (on the blocking thread); the
/// decoder reads it through a `BufReader`, a chunk at a time.
struct ChunkReader {
    chunks: mpsc::Receiver<Bytes>,
    current: Bytes,
    position: usize,
}

impl Read for ChunkReader {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        while self.position >= self.current.len() {
            match self.chunks.blocking_recv() {
                Some(chunk) => {
                    self.current = chunk;
                    self.position = 0;
                }
                None => return Ok(0),
            }
        }
        let available = &self.current[self.position..];
        let n = out.len().min(available.len());
        out[..n].copy_from_slice(&available[..n]);
        self.position += n;
        Ok(n)
    }
}

type Sink<K> = mpsc::Sender<Result<Item<K>, ListError>>;

/// The list object: `items` streamed into the sink, `metadata` returned as
/// the end item (`None` when the consumer went away).
struct ListSeed<'a, K> {
    sink: &'a Sink<K>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct ListMeta {
    #[serde(default)]
    resource_version: Option<String>,
    #[serde(default, rename = "continue")]
    continue_token: Option<String>,
}

impl<'de, K: DeserializeOwned> DeserializeSeed<'de> for ListSeed<'_, K> {
    type Value = Option<Item<K>>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_map(self)
    }
}

impl<'de, K: DeserializeOwned> Visitor<'de> for ListSeed<'_, K> {
    type Value = Option<Item<K>>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a list")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut meta = ListMeta::default();
        let mut consumer_gone = false;
        while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
            match key.as_ref() {
                "metadata" => meta = map.next_value()?,
                "items" => consumer_gone = !map.next_value_seed(Items { sink: self.sink })?,
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok((!consumer_gone).then(|| Item::End {
            resource_version: meta.resource_version.unwrap_or_default(),
            continue_token: meta.continue_token.filter(|t| !t.is_empty()),
        }))
    }
}

/// `items`, each sent as decoded; `false` when the consumer went away.
struct Items<'a, K> {
    sink: &'a Sink<K>,
}

impl<'de, K: DeserializeOwned> DeserializeSeed<'de> for Items<'_, K> {
    type Value = bool;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_option(self)
    }
}

impl<'de, K: DeserializeOwned> Visitor<'de> for Items<'_, K> {
    type Value = bool;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a list of objects")
    }
    fn visit_none<E>(self) -> Result<bool, E> {
        Ok(true)
    }
    fn visit_unit<E>(self) -> Result<bool, E> {
        Ok(true)
    }
    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<bool, D::Error> {
        deserializer.deserialize_seq(self)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<bool, A::Error> {
        let mut batch = Vec::with_capacity(BATCH);
        while let Some(object) = seq.next_element::<K>()? {
            batch.push(object);
            if batch.len() == BATCH {
                let full = std::mem::replace(&mut batch, Vec::with_capacity(BATCH));
                if self.sink.blocking_send(Ok(Item::Objects(full))).is_err() {
                    return Ok(false);
                }
            }
        }
        Ok(batch.is_empty() || self.sink.blocking_send(Ok(Item::Objects(batch))).is_ok())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::projection::PersistentVolume;
    use serde_json::json;

    /// Decodes `body` (split into `chunk`-byte pieces) as the blocking
    /// decoder does, collecting what it sends.
    fn decode(body: &[u8], chunk: usize) -> (Vec<String>, Result<Item<PersistentVolume>, String>) {
        let (chunks_tx, chunks_rx) = mpsc::channel(CHUNKS_IN_FLIGHT);
        let (items_tx, mut items_rx) = mpsc::channel(ITEMS_IN_FLIGHT);
        let body = body.to_vec();
        let feeder = std::thread::spawn(move || {
            for piece in body.chunks(chunk) {
                if chunks_tx
                    .blocking_send(Bytes::copy_from_slice(piece))
                    .is_err()
                {
                    break;
                }
            }
        });
        let decoder =
            std::thread::spawn(move || super::decode::<PersistentVolume>(chunks_rx, &items_tx));
        let mut names = Vec::new();
        let mut end = Err("nothing".to_owned());
        while let Some(item) = items_rx.blocking_recv() {
            match item {
                Ok(Item::Objects(pvs)) => names.extend(
                    pvs.into_iter()
                        .map(|pv| pv.metadata.name.unwrap_or_default()),
                ),
                Ok(end_item) => end = Ok(end_item),
                Err(e) => end = Err(e.to_string()),
            }
        }
        feeder.join().expect("feeder");
        decoder.join().expect("decoder");
        (names, end)
    }

    fn list(n: usize, meta: serde_json::Value) -> Vec<u8> {
        let items: Vec<_> = (0..n)
            .map(|i| {
                json!({"metadata": {"name": format!("pv-{i}"),
                "managedFields": [{"manager": "x"}]},
                "spec": {"csi": {"driver": "d", "volumeHandle": format!("h{i}")}}})
            })
            .collect();
        serde_json::to_vec(&json!({"kind": "PersistentVolumeList", "apiVersion": "v1",
            "metadata": meta, "items": items}))
        .expect("json")
    }

    #[test]
    fn every_object_arrives_in_order_whatever_the_chunking() {
        let body = list(1000, json!({"resourceVersion": "42"}));
        for chunk in [1, 7, 4096, body.len()] {
            let (names, end) = decode(&body, chunk);
            assert_eq!(names.len(), 1000, "chunk {chunk}");
            assert_eq!(names[999], "pv-999");
            match end {
                Ok(Item::End {
                    resource_version,
                    continue_token,
                }) => {
                    assert_eq!(resource_version, "42");
                    assert_eq!(continue_token, None);
                }
                other => panic!("chunk {chunk}: {other:?}"),
            }
        }
    }

    #[test]
    fn metadata_after_the_items_and_a_continue_token_are_read() {
        // The API server writes metadata first; nothing here relies on it.
        let body = serde_json::to_vec(&json!({
            "items": [{"metadata": {"name": "a"}}],
            "metadata": {"resourceVersion": "7", "continue": "next"},
            "kind": "PersistentVolumeList",
        }))
        .expect("json");
        let (names, end) = decode(&body, 3);
        assert_eq!(names, ["a"]);
        assert!(
            matches!(end, Ok(Item::End { ref continue_token, .. }) if continue_token.as_deref() == Some("next"))
        );
        let empty =
            serde_json::to_vec(&json!({"metadata": {"resourceVersion": "8"}, "items": null}))
                .expect("json");
        let (names, end) = decode(&empty, 5);
        assert!(names.is_empty());
        assert!(
            matches!(end, Ok(Item::End { ref resource_version, .. }) if resource_version == "8")
        );
    }

    #[test]
    fn a_body_cut_short_ends_with_an_error_after_what_was_decoded() {
        let body = list(200, json!({"resourceVersion": "1"}));
        let cut = &body[..body.len() * 2 / 3];
        let (names, end) = decode(cut, 100);
        // Whole batches before the cut arrived; the rest never will.
        assert!(!names.is_empty() && names.len() < 200, "{}", names.len());
        assert_eq!(names.len() % BATCH, 0);
        assert!(
            end.as_ref().is_err_and(|e| e.contains("ended before")),
            "{end:?}"
        );
    }
}
