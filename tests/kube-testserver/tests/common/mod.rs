//! Helpers shared by the integration tests: raw requests against the
//! in-process service, reading watch streams line by line.
#![allow(dead_code)]

use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request};
use http_body_util::{BodyExt, Full};
use kube_testserver::{ResponseBody, TestServer};
use serde_json::{Value, json};
use tower::Service;

/// Sends one request to the in-process service and returns (status, JSON body).
pub async fn raw(
    server: &TestServer,
    method: Method,
    path: &str,
    body: Option<Value>,
    content_type: &str,
) -> (u16, Value) {
    let resp = send(server, method, path, body, content_type).await;
    let status = resp.status().as_u16();
    let bytes = resp.into_body().collect().await.expect("body").to_bytes();
    let v =
        serde_json::from_slice(&bytes).unwrap_or_else(|_| json!(String::from_utf8_lossy(&bytes)));
    (status, v)
}

pub async fn send(
    server: &TestServer,
    method: Method,
    path: &str,
    body: Option<Value>,
    content_type: &str,
) -> http::Response<ResponseBody> {
    let body = body.map(|b| Bytes::from(b.to_string())).unwrap_or_default();
    let req = Request::builder()
        .method(method)
        .uri(path)
        .header("content-type", content_type)
        .body(Full::new(body))
        .expect("request");
    server.service().call(req).await.expect("service answered")
}

pub async fn get(server: &TestServer, path: &str) -> (u16, Value) {
    raw(server, Method::GET, path, None, "application/json").await
}

pub async fn post(server: &TestServer, path: &str, body: Value) -> (u16, Value) {
    raw(server, Method::POST, path, Some(body), "application/json").await
}

pub async fn put(server: &TestServer, path: &str, body: Value) -> (u16, Value) {
    raw(server, Method::PUT, path, Some(body), "application/json").await
}

pub async fn patch(server: &TestServer, path: &str, body: Value, ct: &str) -> (u16, Value) {
    raw(server, Method::PATCH, path, Some(body), ct).await
}

pub async fn delete(server: &TestServer, path: &str, body: Option<Value>) -> (u16, Value) {
    raw(server, Method::DELETE, path, body, "application/json").await
}

/// An open watch stream, read event by event.
pub struct WatchReader {
    body: ResponseBody,
    buf: Vec<u8>,
    pub status: u16,
}

impl WatchReader {
    pub async fn open(server: &TestServer, path: &str) -> Self {
        let resp = send(server, Method::GET, path, None, "application/json").await;
        let status = resp.status().as_u16();
        Self {
            body: resp.into_body(),
            buf: Vec::new(),
            status,
        }
    }

    /// Next event, or None when the stream ended or nothing came within `wait`.
    pub async fn next_within(&mut self, wait: Duration) -> Option<Value> {
        loop {
            if let Some(pos) = self.buf.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = self.buf.drain(..=pos).collect();
                return Some(serde_json::from_slice(&line).expect("event line is JSON"));
            }
            let frame = tokio::time::timeout(wait, self.body.frame()).await.ok()??;
            if let Ok(data) = frame.expect("frame").into_data() {
                self.buf.extend_from_slice(&data);
            }
        }
    }

    pub async fn next(&mut self) -> Value {
        self.next_within(Duration::from_secs(5))
            .await
            .expect("an event within 5s")
    }

    /// Next non-BOOKMARK event.
    pub async fn next_event(&mut self) -> Value {
        loop {
            let e = self.next().await;
            if e["type"] != "BOOKMARK" {
                return e;
            }
        }
    }

    /// Asserts nothing but bookmarks arrives within `wait`.
    pub async fn assert_quiet(&mut self, wait: Duration) {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            if left.is_zero() {
                return;
            }
            match self.next_within(left).await {
                Some(e) if e["type"] == "BOOKMARK" => continue,
                Some(e) => panic!("unexpected event {e}"),
                None => return,
            }
        }
    }

    /// Whether the stream has ended (within `wait`), skipping bookmarks.
    pub async fn ended_within(&mut self, wait: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            if left.is_zero() {
                return false;
            }
            match tokio::time::timeout(left, self.body.frame()).await {
                Err(_) => return false,
                Ok(None) => return true,
                Ok(Some(_)) => continue,
            }
        }
    }
}

pub fn pv(name: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "PersistentVolume",
        "metadata": {"name": name},
        "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"], "csi": {"driver": "d", "volumeHandle": name}}
    })
}

pub fn cm(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": {"k": "v"}})
}

pub const PVS: &str = "/api/v1/persistentvolumes";
pub const CMS: &str = "/api/v1/namespaces/default/configmaps";

pub fn rv(obj: &Value) -> u64 {
    obj["metadata"]["resourceVersion"]
        .as_str()
        .expect("rv")
        .parse()
        .expect("numeric rv")
}
