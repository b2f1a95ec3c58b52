//! The serving design a first version would ship (system (b) of the
//! benchmark): an axum HTTP/JSON model server whose caller sends the whole
//! sampled neighbourhood with its feature rows in the request body, having
//! fetched the rows from Redis key by key itself. The server parses the
//! JSON and runs the same ONNX model with ONNX Runtime.
//!
//! `POST /predict` with `{"feature_dim", "fanouts", "features", "target_row",
//! "hop1_count", "hop1_rows", "hop2_count", "hop2_rows"}` (flat arrays in
//! the model's input layout) answers `{"logits": [...]}`.
#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::post;
use axum::{Json, Router};
use clap::Parser;
use gnn_worker::model::{Device, InputSlices, Model};
use serde::Deserialize;

#[derive(Debug, Parser)]
struct Args {
    #[arg(long)]
    model: PathBuf,
    #[arg(long)]
    listen: String,
    #[arg(long)]
    onnxruntime_lib: PathBuf,
    /// ONNX Runtime sessions (requests run at once).
    #[arg(long, default_value_t = 2)]
    sessions: usize,
}

#[derive(Debug, Deserialize)]
struct Body {
    feature_dim: usize,
    fanouts: [usize; 2],
    features: Vec<f32>,
    target_row: Vec<i32>,
    hop1_count: Vec<i32>,
    hop1_rows: Vec<i32>,
    hop2_count: Vec<i32>,
    hop2_rows: Vec<i32>,
}

#[derive(Debug)]
struct Pool {
    models: Mutex<Vec<Model>>,
    permits: tokio::sync::Semaphore,
}

async fn predict(
    State(pool): State<Arc<Pool>>,
    Json(body): Json<Body>,
) -> Result<Json<serde_json::Value>, (StatusCode, String)> {
    let _permit = pool
        .permits
        .acquire()
        .await
        .map_err(|e| (StatusCode::SERVICE_UNAVAILABLE, e.to_string()))?;
    let pool2 = pool.clone();
    let logits = tokio::task::spawn_blocking(move || {
        let mut model = pool2
            .models
            .lock()
            .unwrap()
            .pop()
            .expect("a permit, a model");
        let inputs = InputSlices {
            features: &body.features,
            feature_dim: body.feature_dim,
            target_row: &body.target_row,
            hop1_count: &body.hop1_count,
            hop1_rows: &body.hop1_rows,
            hop2_count: &body.hop2_count,
            hop2_rows: &body.hop2_rows,
            fanouts: body.fanouts,
            hop1_h1: &[],
        };
        let out = model.run_slices(&inputs);
        pool2.models.lock().unwrap().push(model);
        out
    })
    .await
    .map_err(|e| (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?
    .map_err(|e| (StatusCode::BAD_REQUEST, e.to_string()))?;
    Ok(Json(serde_json::json!({ "logits": logits })))
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let env = gnn_worker::onnxruntime::init(Some(&args.onnxruntime_lib))?;
    let mut models = Vec::new();
    for _ in 0..args.sessions.max(1) {
        models.push(Model::load(&env, &args.model, Device::Cpu, 1)?);
    }
    let pool = Arc::new(Pool {
        permits: tokio::sync::Semaphore::new(models.len()),
        models: Mutex::new(models),
    });
    let app = Router::new()
        .route("/predict", post(predict))
        .layer(axum::extract::DefaultBodyLimit::max(1 << 30))
        .with_state(pool);
    let listener = tokio::net::TcpListener::bind(&args.listen).await?;
    axum::serve(listener, app).await?;
    Ok(())
}
