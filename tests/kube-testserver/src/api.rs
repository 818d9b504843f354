//! HTTP request handling shared by the in-process service and the HTTP server:
//! routing, faults, verbs, response encoding, request log.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Response, StatusCode, header};
use http_body_util::{BodyExt, Full, StreamBody, combinators::UnsyncBoxBody};
use serde_json::{Value, json};

use crate::discovery;
use crate::error::ApiError;
use crate::observe::{Origin, RequestRecord, Verb};
use crate::openapi;
use crate::ops::{DeleteOptions, DeleteOutcome, Propagation};
use crate::patch::PatchType;
use crate::selectors::{FieldSelector, LabelSelector, Selectors};
use crate::server::Inner;
use crate::table;
use crate::watch::{self, Registered, WatchParams, WatchStart};

/// Response body of the server (a full body or a watch stream).
pub type ResponseBody = UnsyncBoxBody<Bytes, Infallible>;

/// What to do with a request.
pub enum Outcome {
    /// Answer it.
    Respond(Response<ResponseBody>),
    /// Drop it without an answer (network partition).
    Drop,
}

fn full(code: u16, content_type: &str, body: Vec<u8>) -> Response<ResponseBody> {
    let mut r = Response::new(Full::new(Bytes::from(body)).boxed_unsync());
    *r.status_mut() = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    if let Ok(v) = header::HeaderValue::from_str(content_type) {
        r.headers_mut().insert(header::CONTENT_TYPE, v);
    }
    r
}

fn json_response(code: u16, v: &Value) -> Response<ResponseBody> {
    full(code, "application/json", v.to_string().into_bytes())
}

fn error_response(e: &ApiError) -> Response<ResponseBody> {
    json_response(e.code, &e.status_body())
}

fn parse_query(q: Option<&str>) -> HashMap<String, String> {
    let mut out = HashMap::new();
    for pair in q.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let dec = |s: &str| {
            percent_encoding::percent_decode_str(&s.replace('+', " "))
                .decode_utf8_lossy()
                .into_owned()
        };
        out.insert(dec(k), dec(v));
    }
    out
}

/// A request for a served resource.
#[derive(Debug, Clone)]
struct ResourceRequest {
    res: usize,
    namespace: String,
    name: String,
    subresource: String,
    verb: Verb,
}

enum Route {
    NonResource,
    Resource(ResourceRequest),
}

fn verb_for(method: &Method, has_name: bool, watch: bool) -> Option<Verb> {
    Some(match (method, has_name) {
        (&Method::GET, true) => Verb::Get,
        (&Method::GET, false) if watch => Verb::Watch,
        (&Method::GET, false) => Verb::List,
        (&Method::POST, false) => Verb::Create,
        (&Method::PUT, true) => Verb::Update,
        (&Method::PATCH, true) => Verb::Patch,
        (&Method::DELETE, true) => Verb::Delete,
        (&Method::DELETE, false) => Verb::DeleteCollection,
        _ => return None,
    })
}

fn route(inner: &Inner, method: &Method, path: &str, watch: bool) -> Result<Route, ApiError> {
    let segs: Vec<&str> = path
        .trim_matches('/')
        .split('/')
        .filter(|s| !s.is_empty())
        .collect();
    let (group, version, rest) = match segs.as_slice() {
        ["api", v, rest @ ..] => ("", *v, rest),
        ["apis", g, v, rest @ ..] => (*g, *v, rest),
        _ => return Ok(Route::NonResource),
    };
    if rest.is_empty() {
        return Ok(Route::NonResource);
    }
    let reg = &inner.registry;
    let (namespace, tail): (&str, &[&str]) = match rest {
        ["namespaces"] | ["namespaces", _] => ("", rest),
        ["namespaces", _, "status" | "finalize"] if group.is_empty() => ("", rest),
        ["namespaces", ns, tail @ ..] => (*ns, tail),
        _ => ("", rest),
    };
    let (plural, name, sub) = match tail {
        [p] => (*p, "", ""),
        [p, n] => (*p, *n, ""),
        [p, n, s] => (*p, *n, *s),
        _ => return Err(ApiError::path_not_found()),
    };
    let res = reg
        .by_plural(group, version, plural)
        .ok_or_else(ApiError::path_not_found)?;
    let info = reg.get(res).ok_or_else(ApiError::path_not_found)?;
    if !info.namespaced && !namespace.is_empty() {
        return Err(ApiError::path_not_found());
    }
    if info.namespaced && namespace.is_empty() && !name.is_empty() {
        return Err(ApiError::path_not_found());
    }
    let served_subresource = sub.is_empty() || (sub == "status" && info.status_subresource);
    if !served_subresource {
        return Err(ApiError::path_not_found());
    }
    let verb = verb_for(method, !name.is_empty(), watch).ok_or_else(|| {
        ApiError::method_not_allowed(
            "the server does not allow this method on the requested resource",
        )
    })?;
    if !sub.is_empty() && !matches!(verb, Verb::Get | Verb::Update | Verb::Patch) {
        return Err(ApiError::method_not_allowed(
            "the server does not allow this method on the requested resource",
        ));
    }
    Ok(Route::Resource(ResourceRequest {
        res,
        namespace: namespace.to_string(),
        name: name.to_string(),
        subresource: sub.to_string(),
        verb,
    }))
}

fn non_resource(inner: &Inner, path: &str) -> Response<ResponseBody> {
    let segs: Vec<&str> = path
        .trim_matches('/')
        .split('/')
        .filter(|s| !s.is_empty())
        .collect();
    let reg = &inner.registry;
    let doc = match segs.as_slice() {
        ["version"] => Some(discovery::version()),
        ["api"] => Some(discovery::core_versions(&inner.server_address())),
        ["api", v] => discovery::resource_list(reg, "", v),
        ["apis"] => Some(discovery::group_list(reg)),
        ["apis", g] => discovery::group(reg, g),
        ["apis", g, v] => discovery::resource_list(reg, g, v),
        ["openapi", "v3"] => Some(openapi::index(reg)),
        ["openapi", "v3", "api", v] => openapi::group_version(reg, "", v),
        ["openapi", "v3", "apis", g, v] => openapi::group_version(reg, g, v),
        ["healthz"] | ["livez"] | ["readyz"] => {
            return full(200, "text/plain; charset=utf-8", b"ok".to_vec());
        }
        _ => None,
    };
    match doc {
        Some(d) => json_response(200, &d),
        None => error_response(&ApiError::path_not_found()),
    }
}

/// Handles one request: the single code path for both transports.
pub async fn handle(
    inner: Arc<Inner>,
    origin: Origin,
    parts: http::request::Parts,
    body: Bytes,
) -> Outcome {
    let received = inner.receive();
    let received_at = std::time::Instant::now();
    let path = parts.uri.path().to_string();
    let query = parse_query(parts.uri.query());
    let watch = matches!(query.get("watch").map(String::as_str), Some("true" | "1"));
    let routed = route(&inner, &parts.method, &path, watch);
    let (verb, resource, namespace, name) = match &routed {
        Ok(Route::Resource(r)) => {
            let plural = inner.registry.get(r.res).map(|i| i.plural).unwrap_or("");
            let resource = if r.subresource.is_empty() {
                plural.to_string()
            } else {
                format!("{plural}/{}", r.subresource)
            };
            (r.verb, resource, r.namespace.clone(), r.name.clone())
        }
        _ => (
            Verb::NonResource,
            String::new(),
            String::new(),
            String::new(),
        ),
    };
    let record = |status: u16| RequestRecord {
        origin,
        verb,
        resource: resource.clone(),
        namespace: namespace.clone(),
        name: name.clone(),
        status,
        path: path.clone(),
        injected: false,
        received,
        received_at,
    };

    let decision = {
        let mut f = inner.lock_faults();
        if f.partitioned {
            drop(f);
            inner.observe(record(0));
            return Outcome::Drop;
        }
        f.decide(origin, verb, &resource, &namespace, &name)
    };
    if !decision.delay.is_zero() {
        tokio::time::sleep(decision.delay).await;
        if inner.lock_faults().partitioned {
            inner.observe(record(0));
            return Outcome::Drop;
        }
    }
    let response = if let Some(code) = decision.fail {
        error_response(&ApiError::from_code(
            code,
            format!("injected fault: {verb} {resource} {name}"),
        ))
    } else {
        match routed {
            Err(e) => error_response(&e),
            Ok(Route::NonResource) => non_resource(&inner, &path),
            Ok(Route::Resource(r)) => {
                let accept = parts
                    .headers
                    .get(header::ACCEPT)
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("")
                    .to_string();
                let ctype = parts
                    .headers
                    .get(header::CONTENT_TYPE)
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("")
                    .to_string();
                match resource_request(&inner, origin, &r, &query, &accept, &ctype, &body) {
                    Ok(resp) => resp,
                    Err(e) => error_response(&e),
                }
            }
        }
    };
    inner.observe(RequestRecord {
        injected: decision.fail.is_some(),
        ..record(response.status().as_u16())
    });
    Outcome::Respond(response)
}

fn parse_body(body: &[u8]) -> Result<Value, ApiError> {
    serde_json::from_slice(body).or_else(|_| {
        serde_yaml_ng::from_slice(body)
            .map_err(|e| ApiError::bad_request(format!("error decoding request body: {e}")))
    })
}

fn selectors(
    r: &ResourceRequest,
    inner: &Inner,
    q: &HashMap<String, String>,
) -> Result<Selectors, ApiError> {
    let info = inner
        .registry
        .get(r.res)
        .ok_or_else(ApiError::path_not_found)?;
    Ok(Selectors {
        labels: LabelSelector::parse(q.get("labelSelector").map_or("", String::as_str))?,
        fields: FieldSelector::parse(q.get("fieldSelector").map_or("", String::as_str), info)?,
    })
}

fn delete_options(body: &[u8], q: &HashMap<String, String>) -> Result<DeleteOptions, ApiError> {
    let v: Value = if body.iter().all(u8::is_ascii_whitespace) {
        json!({})
    } else {
        parse_body(body)?
    };
    let policy = v
        .get("propagationPolicy")
        .and_then(Value::as_str)
        .map(str::to_string)
        .or_else(|| q.get("propagationPolicy").cloned());
    let propagation = match policy.as_deref() {
        None | Some("") => None,
        Some("Background") => Some(Propagation::Background),
        Some("Foreground") => Some(Propagation::Foreground),
        Some("Orphan") => Some(Propagation::Orphan),
        Some(p) => {
            return Err(ApiError::new(
                422,
                "Invalid",
                format!(
                    "DeleteOptions.meta.k8s.io \"\" is invalid: propagationPolicy: Unsupported value: \"{p}\""
                ),
            ));
        }
    };
    let orphan_dependents = v
        .get("orphanDependents")
        .and_then(Value::as_bool)
        .or_else(|| q.get("orphanDependents").map(|s| s == "true"));
    let pre = v.get("preconditions");
    let pre_field = |f: &str| {
        pre.and_then(|p| p.get(f))
            .and_then(Value::as_str)
            .map(str::to_string)
    };
    Ok(DeleteOptions {
        propagation,
        orphan_dependents,
        precondition_uid: pre_field("uid"),
        precondition_rv: pre_field("resourceVersion"),
    })
}

fn resource_request(
    inner: &Arc<Inner>,
    origin: Origin,
    r: &ResourceRequest,
    q: &HashMap<String, String>,
    accept: &str,
    ctype: &str,
    body: &[u8],
) -> Result<Response<ResponseBody>, ApiError> {
    let info = inner
        .registry
        .get(r.res)
        .cloned()
        .ok_or_else(ApiError::path_not_found)?;
    if r.verb.is_write() && q.get("dryRun").is_some_and(|d| !d.is_empty()) {
        return Err(ApiError::bad_request(
            "dryRun is not supported by kube-testserver",
        ));
    }
    if ctype.starts_with("application/vnd.kubernetes.protobuf") {
        return Err(ApiError::unsupported_media_type(
            "kube-testserver does not decode protobuf request bodies; send application/json",
        ));
    }
    let status_only = r.subresource == "status";
    let want_table = table::wants_table(accept);
    match r.verb {
        Verb::Get => {
            let obj = inner.lock_state().get_one(r.res, &r.namespace, &r.name)?;
            if want_table {
                return Ok(json_response(200, &table::table(&info, &[obj], None, "")));
            }
            Ok(json_response(200, &obj))
        }
        Verb::List => {
            let sel = selectors(r, inner, q)?;
            let limit = q.get("limit").and_then(|l| l.parse::<usize>().ok());
            let ns = (!r.namespace.is_empty()).then_some(r.namespace.as_str());
            let page = inner.lock_state().list(
                r.res,
                ns,
                &sel,
                limit,
                q.get("continue")
                    .map(String::as_str)
                    .filter(|c| !c.is_empty()),
                q.get("resourceVersion").is_some_and(|rv| rv == "0"),
            )?;
            if want_table {
                return Ok(json_response(
                    200,
                    &table::table(
                        &info,
                        &page.items,
                        page.continue_token.as_deref(),
                        &page.rv.to_string(),
                    ),
                ));
            }
            Ok(full(200, "application/json", encode_list(&info, &page)))
        }
        Verb::Watch => watch_request(inner, origin, r, q),
        Verb::Create => {
            let obj = parse_body(body)?;
            let mut st = inner.lock_state();
            let created = st.create(r.res, &r.namespace, obj)?;
            st.reconcile();
            Ok(json_response(201, &created))
        }
        Verb::Update => {
            let obj = parse_body(body)?;
            let mut st = inner.lock_state();
            let updated = st.update(r.res, &r.namespace, &r.name, obj, status_only)?;
            st.reconcile();
            Ok(json_response(200, &updated))
        }
        Verb::Patch => {
            let ptype = PatchType::from_content_type(ctype).ok_or_else(|| {
                ApiError::unsupported_media_type(format!(
                    "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml, application/strategic-merge-patch+json (got {ctype:?})"
                ))
            })?;
            let mut st = inner.lock_state();
            let (obj, created) = st.patch(
                r.res,
                &r.namespace,
                &r.name,
                ptype,
                body,
                status_only,
                q.get("fieldManager").map(String::as_str),
            )?;
            st.reconcile();
            Ok(json_response(if created { 201 } else { 200 }, &obj))
        }
        Verb::Delete => {
            let opts = delete_options(body, q)?;
            let mut st = inner.lock_state();
            let outcome = st.delete(r.res, &r.namespace, &r.name, &opts)?;
            st.reconcile();
            Ok(match outcome {
                DeleteOutcome::Pending(obj) => {
                    let code = if opts.orphan_dependents == Some(false) {
                        202
                    } else {
                        200
                    };
                    json_response(code, &obj)
                }
                DeleteOutcome::Deleted(obj) if info.returns_deleted_object => {
                    json_response(200, &obj)
                }
                DeleteOutcome::Deleted(obj) => {
                    let mut details = json!({
                        "name": r.name,
                        "kind": info.plural,
                        "uid": crate::meta::uid(&obj),
                    });
                    if !info.group.is_empty() {
                        details["group"] = json!(info.group);
                    }
                    json_response(
                        200,
                        &json!({"kind": "Status", "apiVersion": "v1", "metadata": {},
                                "status": "Success", "details": details}),
                    )
                }
            })
        }
        Verb::DeleteCollection => {
            let opts = delete_options(body, q)?;
            let sel = selectors(r, inner, q)?;
            let ns = (!r.namespace.is_empty()).then_some(r.namespace.as_str());
            let mut st = inner.lock_state();
            let page = st.list(r.res, ns, &sel, None, None, false)?;
            let mut deleted = Vec::new();
            for o in &page.items {
                let (ons, oname) = (
                    crate::meta::namespace(o).to_string(),
                    crate::meta::name(o).to_string(),
                );
                match st.delete(r.res, &ons, &oname, &opts) {
                    Ok(DeleteOutcome::Pending(x) | DeleteOutcome::Deleted(x)) => deleted.push(x),
                    Err(e) if e.code == 404 => {}
                    Err(e) => return Err(e),
                }
            }
            st.reconcile();
            let page = crate::ops::ListPage {
                items: deleted,
                rv: st.rv,
                continue_token: None,
                remaining: None,
            };
            Ok(full(200, "application/json", encode_list(&info, &page)))
        }
        Verb::NonResource => Err(ApiError::path_not_found()),
    }
}

/// Serialises a list without copying the items into a new JSON tree.
fn encode_list(info: &crate::resources::ResourceInfo, page: &crate::ops::ListPage) -> Vec<u8> {
    let mut meta = json!({"resourceVersion": page.rv.to_string()});
    if let Some(c) = &page.continue_token {
        meta["continue"] = json!(c);
    }
    if let Some(n) = page.remaining {
        meta["remainingItemCount"] = json!(n);
    }
    let head = json!({"kind": format!("{}List", info.kind), "apiVersion": info.api_version(), "metadata": meta});
    let mut out = head.to_string().into_bytes();
    out.pop(); // the closing brace
    out.extend_from_slice(b",\"items\":[");
    for (i, item) in page.items.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        // Serialising a Value into a Vec cannot fail.
        let _ = serde_json::to_writer(&mut out, item.as_ref());
    }
    out.extend_from_slice(b"]}");
    out
}

fn watch_request(
    inner: &Arc<Inner>,
    origin: Origin,
    r: &ResourceRequest,
    q: &HashMap<String, String>,
) -> Result<Response<ResponseBody>, ApiError> {
    let info = inner
        .registry
        .get(r.res)
        .cloned()
        .ok_or_else(ApiError::path_not_found)?;
    let sel = selectors(r, inner, q)?;
    let rv = q.get("resourceVersion").map(String::as_str).unwrap_or("");
    let start = if q.get("sendInitialEvents").is_some_and(|v| v == "true") {
        WatchStart::InitialEvents
    } else if rv.is_empty() || rv == "0" {
        WatchStart::Current
    } else {
        WatchStart::From(rv.parse::<u64>().map_err(|_| {
            ApiError::bad_request(format!(
                "resourceVersion: Invalid value: \"{rv}\": must be an integer"
            ))
        })?)
    };
    let timeout = q
        .get("timeoutSeconds")
        .and_then(|t| t.parse::<u64>().ok())
        .filter(|t| *t > 0)
        .map_or(Duration::from_secs(1800), Duration::from_secs);
    let params = WatchParams {
        res: r.res,
        namespace: (!r.namespace.is_empty()).then(|| r.namespace.clone()),
        selectors: sel,
        start,
        bookmarks: q.get("allowWatchBookmarks").is_some_and(|v| v == "true"),
        timeout,
        origin,
    };
    let registered = watch::register(&mut inner.lock_state(), &params);
    let body: ResponseBody = match registered {
        Registered::Gone(e) => StreamBody::new(watch::error_stream(&e)).boxed_unsync(),
        Registered::Stream { id, rx } => StreamBody::new(watch::event_stream(
            inner.state.clone(),
            id,
            rx,
            info,
            params.bookmarks,
            *inner
                .bookmark_interval
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
            params.timeout,
        ))
        .boxed_unsync(),
    };
    let mut resp = Response::new(body);
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/json"),
    );
    Ok(resp)
}
