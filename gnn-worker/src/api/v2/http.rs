//! The Open Inference Protocol over HTTP/REST on the worker's HTTP port,
//! beside `/v1/predict`: `/v2`, `/v2/health/{live,ready}`,
//! `/v2/models/{name}[/versions/{version}]`, its `/ready` and `/infer`.
//! An inference request is JSON, or (the binary tensor data extension) a
//! JSON header of `Inference-Header-Content-Length` bytes followed by the
//! inputs' raw bytes; outputs asked for with `binary_data` come back the
//! same way. Every error is `{"error": "..."}` with the status of its kind.

use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Path, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get, post};
use axum::Router;
use serde::Deserialize;
use serde_json::{json, Map, Value};

use crate::api::v2::call::{self, Data, Input, V2Error};
use crate::service::Service;

/// The header that says how many leading bytes of a body (request or
/// response) are its JSON; the rest are binary tensors.
pub const HEADER_LENGTH: &str = "inference-header-content-length";

/// The largest inference request body, bytes (as gRPC's default message
/// limit).
pub const MAX_BODY: usize = 4 << 20;

/// The routes, for the worker's HTTP router (which gives them the
/// service).
pub fn routes() -> Router<Service> {
    Router::new()
        .route("/v2", get(server_metadata))
        .route("/v2/health/live", get(live))
        .route("/v2/health/ready", get(ready))
        .route("/v2/models/{name}", get(model_metadata))
        .route(
            "/v2/models/{name}/versions/{version}",
            get(model_metadata_version),
        )
        .route("/v2/models/{name}/ready", get(model_ready))
        .route(
            "/v2/models/{name}/versions/{version}/ready",
            get(model_ready_version),
        )
        .route("/v2/models/{name}/infer", post(infer))
        .route(
            "/v2/models/{name}/versions/{version}/infer",
            post(infer_version),
        )
        // Everything else under /v2: Triton's extensions (what
        // tritonclient's other calls reach), named.
        .route("/v2/{*rest}", any(not_served))
        .layer(DefaultBodyLimit::max(MAX_BODY))
}

/// A path of an extension this server does not implement: 501 and
/// `{"error": ...}` naming the extension (404 for a path of none).
async fn not_served(uri: axum::http::Uri) -> Response {
    let extension = call::http_extension(uri.path());
    let status = match extension {
        Some(_) => StatusCode::NOT_IMPLEMENTED,
        None => StatusCode::NOT_FOUND,
    };
    let message = call::not_served(uri.path(), extension);
    (status, axum::Json(json!({ "error": message }))).into_response()
}

/// `{"error": message}` with the status of the error's kind (overload
/// adds `Retry-After: 1`).
fn error_response(e: V2Error) -> Response {
    // A call's own errors take the native table's status
    // ([`PredictError::http_status`]); the protocol's own, 404 and 400.
    let status = match &e {
        V2Error::NotFound(_) => StatusCode::NOT_FOUND,
        V2Error::Invalid(_) => StatusCode::BAD_REQUEST,
        V2Error::Predict(e) => e.http_status(),
    };
    let mut response = (status, axum::Json(json!({ "error": e.to_string() }))).into_response();
    if matches!(&e, V2Error::Predict(p) if p.retry_after()) {
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    }
    response
}

async fn server_metadata() -> Response {
    axum::Json(json!({
        "name": call::SERVER_NAME,
        "version": env!("CARGO_PKG_VERSION"),
        "extensions": call::EXTENSIONS,
    }))
    .into_response()
}

async fn live() -> Response {
    axum::Json(json!({ "live": true })).into_response()
}

/// 200 `{"ready": true}` exactly when `/readyz` answers 200; else 503
/// with the same reason.
fn readiness(service: &Service, name: Option<&str>) -> Response {
    let mut body = Map::new();
    if let Some(name) = name {
        body.insert("name".into(), name.into());
    }
    match service.readiness() {
        Ok(()) => {
            body.insert("ready".into(), true.into());
            axum::Json(Value::Object(body)).into_response()
        }
        Err(reason) => {
            body.insert("ready".into(), false.into());
            body.insert("error".into(), format!("not ready: {reason}").into());
            (
                StatusCode::SERVICE_UNAVAILABLE,
                axum::Json(Value::Object(body)),
            )
                .into_response()
        }
    }
}

async fn ready(State(service): State<Service>) -> Response {
    readiness(&service, None)
}

fn model_ready_of(service: &Service, name: &str, version: Option<&str>) -> Response {
    match call::model_for(service, name, version) {
        Ok(model) => readiness(service, Some(&model.name)),
        Err(e) => error_response(e),
    }
}

async fn model_ready(State(service): State<Service>, Path(name): Path<String>) -> Response {
    model_ready_of(&service, &name, None)
}

async fn model_ready_version(
    State(service): State<Service>,
    Path((name, version)): Path<(String, String)>,
) -> Response {
    model_ready_of(&service, &name, Some(&version))
}

fn metadata_of(service: &Service, name: &str, version: Option<&str>) -> Response {
    let model = match call::model_for(service, name, version) {
        Ok(model) => model,
        Err(e) => return error_response(e),
    };
    let tensors = |metas: Vec<call::TensorMeta>| -> Vec<Value> {
        metas
            .into_iter()
            .map(|m| json!({ "name": m.name, "datatype": m.datatype, "shape": m.shape }))
            .collect()
    };
    axum::Json(json!({
        "name": model.name,
        "versions": [model.version],
        "platform": call::PLATFORM,
        "inputs": tensors(call::inputs_meta(&model.tensors)),
        "outputs": tensors(call::outputs_meta(&model.tensors)),
    }))
    .into_response()
}

async fn model_metadata(State(service): State<Service>, Path(name): Path<String>) -> Response {
    metadata_of(&service, &name, None)
}

async fn model_metadata_version(
    State(service): State<Service>,
    Path((name, version)): Path<(String, String)>,
) -> Response {
    metadata_of(&service, &name, Some(&version))
}

#[derive(Debug, Deserialize)]
struct InferBody {
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    parameters: Map<String, Value>,
    inputs: Vec<InputJson>,
    #[serde(default)]
    outputs: Vec<OutputJson>,
}

#[derive(Debug, Deserialize)]
struct InputJson {
    name: String,
    shape: Vec<i64>,
    datatype: String,
    #[serde(default)]
    parameters: Map<String, Value>,
    #[serde(default)]
    data: Option<Value>,
}

#[derive(Debug, Deserialize)]
struct OutputJson {
    name: String,
    #[serde(default)]
    parameters: Map<String, Value>,
}

fn invalid(message: impl Into<String>) -> V2Error {
    V2Error::Invalid(message.into())
}

/// A JSON `data` value flattened (the protocol allows nested rows).
fn flatten(value: Value, out: &mut Vec<Value>) {
    match value {
        Value::Array(items) => {
            for item in items {
                flatten(item, out);
            }
        }
        other => out.push(other),
    }
}

/// A boolean parameter, absent: `None`.
fn bool_parameter(parameters: &Map<String, Value>, name: &str) -> Result<Option<bool>, V2Error> {
    match parameters.get(name) {
        None => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(other) => Err(invalid(format!(
            "parameter {name} is {other}, not a boolean"
        ))),
    }
}

/// The body split into its JSON header and its binary tensor data
/// (`header_length`: the `Inference-Header-Content-Length` header's value;
/// `encoding`: `Content-Encoding`'s).
fn split_body<'a>(
    header_length: Option<&[u8]>,
    encoding: Option<&[u8]>,
    body: &'a [u8],
) -> Result<(&'a [u8], &'a [u8]), V2Error> {
    if let Some(encoding) = encoding {
        if encoding != b"identity" {
            return Err(invalid(format!(
                "Content-Encoding {}: send the request uncompressed",
                String::from_utf8_lossy(encoding)
            )));
        }
    }
    let Some(length) = header_length else {
        return Ok((body, &[]));
    };
    let length = std::str::from_utf8(length)
        .ok()
        .and_then(|l| l.trim().parse::<usize>().ok())
        .filter(|&l| l <= body.len())
        .ok_or_else(|| {
            invalid(format!(
                "Inference-Header-Content-Length {:?} is not a byte count within the body's {} \
                 bytes",
                String::from_utf8_lossy(length),
                body.len()
            ))
        })?;
    Ok(body.split_at(length))
}

/// The inputs, each from its JSON `data` or its share of the binary data
/// (`binary_data_size`, in input order).
fn inputs_of(inputs: Vec<InputJson>, mut binary: &[u8]) -> Result<Vec<Input>, V2Error> {
    let mut out = Vec::with_capacity(inputs.len());
    for input in inputs {
        let data = match (input.parameters.get("binary_data_size"), input.data) {
            (Some(size), None) => {
                let size = size
                    .as_u64()
                    .and_then(|s| usize::try_from(s).ok())
                    .filter(|&s| s <= binary.len())
                    .ok_or_else(|| {
                        invalid(format!(
                            "input {}: binary_data_size {size} is more than the {} binary bytes \
                             left",
                            input.name,
                            binary.len()
                        ))
                    })?;
                let (mine, rest) = binary.split_at(size);
                binary = rest;
                Data::Raw(mine.to_vec())
            }
            (None, Some(data)) => {
                let mut values = Vec::new();
                flatten(data, &mut values);
                Data::Json(values)
            }
            (Some(_), Some(_)) => {
                return Err(invalid(format!(
                    "input {}: data and binary_data_size; give one of the two",
                    input.name
                )))
            }
            (None, None) => {
                return Err(invalid(format!(
                    "input {}: no data (give `data`, or binary_data_size with the binary tensor \
                     data extension)",
                    input.name
                )))
            }
        };
        out.push(Input {
            name: input.name,
            datatype: input.datatype,
            shape: input.shape,
            data,
        });
    }
    if !binary.is_empty() {
        return Err(invalid(format!(
            "{} binary bytes after the inputs' binary_data_size: send exactly the inputs' bytes",
            binary.len()
        )));
    }
    Ok(out)
}

async fn infer(
    State(service): State<Service>,
    Path(name): Path<String>,
    headers: HeaderMap,
    body: Result<Bytes, axum::extract::rejection::BytesRejection>,
) -> Response {
    infer_call(service, name, None, headers, body).await
}

async fn infer_version(
    State(service): State<Service>,
    Path((name, version)): Path<(String, String)>,
    headers: HeaderMap,
    body: Result<Bytes, axum::extract::rejection::BytesRejection>,
) -> Response {
    infer_call(service, name, Some(version), headers, body).await
}

async fn infer_call(
    service: Service,
    name: String,
    version: Option<String>,
    headers: HeaderMap,
    body: Result<Bytes, axum::extract::rejection::BytesRejection>,
) -> Response {
    use tracing::Instrument;
    let body = match body {
        Ok(body) => body,
        Err(rejection) => {
            let status = rejection.status();
            let message = if status == StatusCode::PAYLOAD_TOO_LARGE {
                format!(
                    "the request body is over {MAX_BODY} bytes: split the call (at most \
                     max_request_targets node ids each)"
                )
            } else {
                format!(
                    "the request body could not be read: {}",
                    rejection.body_text()
                )
            };
            return (status, axum::Json(json!({ "error": message }))).into_response();
        }
    };
    let span = crate::service::call_span(
        "POST /v2/models/{name}/infer",
        headers.get("traceparent").and_then(|v| v.to_str().ok()),
    );
    infer_body(&service, &name, version.as_deref(), &headers, &body)
        .instrument(span)
        .await
        .unwrap_or_else(error_response)
}

/// An inference request as its body says.
#[derive(Debug)]
pub struct InferRequest {
    pub id: Option<String>,
    /// The `timeout` parameter.
    pub left: Option<std::time::Duration>,
    /// `binary_data_output`: whether outputs not named come back as binary
    /// data.
    pub binary_default: bool,
    /// The outputs asked for, each with whether it comes back as binary
    /// data.
    pub outputs: Vec<(String, bool)>,
    pub inputs: Vec<Input>,
}

/// Parses an inference request's body (`header_length`: the
/// `Inference-Header-Content-Length` header's value; `encoding`:
/// `Content-Encoding`'s).
pub fn parse_infer(
    header_length: Option<&[u8]>,
    encoding: Option<&[u8]>,
    body: &[u8],
) -> Result<InferRequest, V2Error> {
    let (json_part, binary) = split_body(header_length, encoding, body)?;
    let request: InferBody = serde_json::from_slice(json_part).map_err(|e| {
        invalid(format!(
            "the inference request is not the protocol's JSON ({e}): see docs/serving.md, \
             \"The Open Inference Protocol\""
        ))
    })?;
    let left = call::timeout_of(match request.parameters.get(call::TIMEOUT_PARAMETER) {
        None => None,
        Some(v) => Some(v.as_i64().ok_or_else(|| {
            invalid(format!(
                "parameter {} is {v}, not an integer of microseconds",
                call::TIMEOUT_PARAMETER
            ))
        })?),
    })?;
    let binary_default =
        bool_parameter(&request.parameters, "binary_data_output")?.unwrap_or(false);
    let mut outputs = Vec::with_capacity(request.outputs.len());
    for output in &request.outputs {
        if output.parameters.contains_key("classification") {
            return Err(invalid(format!(
                "output {}: the classification extension is not served; ask for label and \
                 logits",
                output.name
            )));
        }
        outputs.push((
            output.name.clone(),
            bool_parameter(&output.parameters, "binary_data")?.unwrap_or(binary_default),
        ));
    }
    Ok(InferRequest {
        id: request.id,
        left,
        binary_default,
        outputs,
        inputs: inputs_of(request.inputs, binary)?,
    })
}

async fn infer_body(
    service: &Service,
    name: &str,
    version: Option<&str>,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<Response, V2Error> {
    let request = parse_infer(
        headers.get(HEADER_LENGTH).map(|v| v.as_bytes()),
        headers.get(header::CONTENT_ENCODING).map(|v| v.as_bytes()),
        body,
    )?;
    let (inputs, left, binary_default) = (&request.inputs, request.left, request.binary_default);
    let binary_of = &request.outputs;
    let names: Vec<String> = binary_of.iter().map(|(n, _)| n.clone()).collect();
    let call::Inferred {
        model,
        outputs,
        degraded,
    } = call::infer(service, name, version, inputs, &names, left).await?;
    let mut tail = Vec::new();
    let mut tensors = Vec::with_capacity(outputs.len());
    for output in outputs {
        let binary = binary_of
            .iter()
            .find(|(n, _)| n == output.name.name())
            .map_or(binary_default, |(_, b)| *b);
        let mut tensor = json!({
            "name": output.name.name(),
            "datatype": output.name.datatype(),
            "shape": output.shape,
        });
        if binary {
            let raw = output.values.raw();
            tensor["parameters"] = json!({ "binary_data_size": raw.len() });
            tail.extend_from_slice(&raw);
        } else {
            tensor["data"] = output.values.json();
        }
        tensors.push(tensor);
    }
    let mut answer = json!({
        "model_name": model.name,
        "model_version": model.version,
        "outputs": tensors,
        "parameters": { "degraded": degraded },
    });
    if let Some(id) = request.id {
        answer["id"] = id.into();
    }
    let mut json_bytes = serde_json::to_vec(&answer).expect("a JSON value serializes");
    if tail.is_empty() {
        return Ok((
            [(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            )],
            json_bytes,
        )
            .into_response());
    }
    let length = json_bytes.len();
    json_bytes.extend_from_slice(&tail);
    Ok((
        [
            (
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/octet-stream"),
            ),
            (
                header::HeaderName::from_static(HEADER_LENGTH),
                HeaderValue::from(length),
            ),
        ],
        json_bytes,
    )
        .into_response())
}
