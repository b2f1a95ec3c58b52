//! `inference.GRPCInferenceService` (KServe's grpc_predict_v2.proto) on
//! the worker's gRPC port, beside `gnn.v1.Predictor`: the same service
//! (batching, deadlines, overload refusals, the ladder, metrics, traces).
//! Inputs come in `contents` or `raw_input_contents`; outputs always go in
//! `raw_output_contents`, in output order, as Triton answers.

use tonic::{Request, Response, Status};

use crate::api::v2::call::{self, Data, Input, V2Error};
use crate::service::Service;

/// Generated types of `inference`.
#[allow(clippy::all, missing_debug_implementations)]
pub mod pb {
    tonic::include_proto!("inference");
}

/// The encoded descriptors of `inference`, served by gRPC server
/// reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("inference_descriptor");

pub use pb::grpc_inference_service_client::GrpcInferenceServiceClient;
pub use pb::grpc_inference_service_server::GrpcInferenceServiceServer;

/// The gRPC service.
#[derive(Debug, Clone)]
pub struct InferenceService {
    service: Service,
}

impl InferenceService {
    /// The service as the gRPC server mounts it: the protocol's core, and
    /// for the methods of Triton's extensions a status that names them.
    pub fn server(service: Service) -> CoreOnly {
        CoreOnly(GrpcInferenceServiceServer::new(Self { service }))
    }
}

/// `inference.GRPCInferenceService` as tritonclient calls it: Triton's
/// proto has more methods than KServe's (model configuration, statistics,
/// the repository, shared memory, ...); a call of one of them is answered
/// UNIMPLEMENTED with a message naming its extension
/// ([`call::grpc_method`]) instead of an empty one.
#[derive(Debug, Clone)]
pub struct CoreOnly(GrpcInferenceServiceServer<InferenceService>);

impl tonic::server::NamedService for CoreOnly {
    const NAME: &'static str = "inference.GRPCInferenceService";
}

impl tower::Service<http::Request<tonic::body::Body>> for CoreOnly {
    type Response = http::Response<tonic::body::Body>;
    type Error = std::convert::Infallible;
    type Future = futures_util::future::Either<
        <GrpcInferenceServiceServer<InferenceService> as tower::Service<
            http::Request<tonic::body::Body>,
        >>::Future,
        std::future::Ready<Result<Self::Response, Self::Error>>,
    >;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        tower::Service::<http::Request<tonic::body::Body>>::poll_ready(&mut self.0, cx)
    }

    fn call(&mut self, request: http::Request<tonic::body::Body>) -> Self::Future {
        let method = request.uri().path().rsplit('/').next().unwrap_or("");
        match call::grpc_method(method) {
            Ok(()) => {
                futures_util::future::Either::Left(tower::Service::call(&mut self.0, request))
            }
            Err(extension) => {
                let status = Status::unimplemented(call::not_served(method, extension));
                futures_util::future::Either::Right(std::future::ready(Ok(status.into_http())))
            }
        }
    }
}

fn to_status(e: V2Error) -> Status {
    match e {
        V2Error::NotFound(m) => Status::not_found(m),
        V2Error::Invalid(m) => Status::invalid_argument(m),
        V2Error::Predict(e) => crate::api::grpc::to_status(e),
    }
}

fn int64_parameter(
    parameters: &std::collections::HashMap<String, pb::InferParameter>,
    name: &str,
) -> Result<Option<i64>, V2Error> {
    use pb::infer_parameter::ParameterChoice;
    match parameters
        .get(name)
        .and_then(|p| p.parameter_choice.as_ref())
    {
        None => Ok(None),
        Some(ParameterChoice::Int64Param(v)) => Ok(Some(*v)),
        Some(_) => Err(V2Error::Invalid(format!(
            "parameter {name} is not an int64_param"
        ))),
    }
}

/// The request's inputs: all raw, or all in `contents` (taken out of it).
pub fn inputs_of(request: &mut pb::ModelInferRequest) -> Result<Vec<Input>, V2Error> {
    let raw = std::mem::take(&mut request.raw_input_contents);
    if !raw.is_empty() && raw.len() != request.inputs.len() {
        return Err(V2Error::Invalid(format!(
            "{} raw_input_contents for {} inputs: give one per input, in input order (or \
             none, with each input's contents)",
            raw.len(),
            request.inputs.len()
        )));
    }
    let mut raw = raw.into_iter();
    let mut inputs = Vec::with_capacity(request.inputs.len());
    for tensor in std::mem::take(&mut request.inputs) {
        let data = match raw.next() {
            Some(bytes) => {
                if tensor.contents.is_some() {
                    return Err(V2Error::Invalid(format!(
                        "input {}: contents beside raw_input_contents; give one of the two",
                        tensor.name
                    )));
                }
                Data::Raw(bytes)
            }
            None => {
                let contents = tensor.contents.unwrap_or_default();
                match tensor.datatype.as_str() {
                    "FP32" => Data::Fp32(contents.fp32_contents),
                    "BOOL" => Data::Bool(contents.bool_contents),
                    _ => Data::Int64(contents.int64_contents),
                }
            }
        };
        inputs.push(Input {
            name: tensor.name,
            datatype: tensor.datatype,
            shape: tensor.shape,
            data,
        });
    }
    Ok(inputs)
}

#[tonic::async_trait]
impl pb::grpc_inference_service_server::GrpcInferenceService for InferenceService {
    async fn server_live(
        &self,
        _: Request<pb::ServerLiveRequest>,
    ) -> Result<Response<pb::ServerLiveResponse>, Status> {
        Ok(Response::new(pb::ServerLiveResponse { live: true }))
    }

    async fn server_ready(
        &self,
        _: Request<pb::ServerReadyRequest>,
    ) -> Result<Response<pb::ServerReadyResponse>, Status> {
        let ready = self.service.readiness();
        let mut response = Response::new(pb::ServerReadyResponse {
            ready: ready.is_ok(),
        });
        if let Some(value) = ready.err().and_then(|r| r.parse().ok()) {
            response.metadata_mut().insert("x-not-ready-reason", value);
        }
        Ok(response)
    }

    async fn model_ready(
        &self,
        request: Request<pb::ModelReadyRequest>,
    ) -> Result<Response<pb::ModelReadyResponse>, Status> {
        let request = request.into_inner();
        call::model_for(&self.service, &request.name, Some(&request.version)).map_err(to_status)?;
        self.server_ready(Request::new(pb::ServerReadyRequest {}))
            .await
            .map(|r| {
                let (metadata, message, extensions) = r.into_parts();
                Response::from_parts(
                    metadata,
                    pb::ModelReadyResponse {
                        ready: message.ready,
                    },
                    extensions,
                )
            })
    }

    async fn server_metadata(
        &self,
        _: Request<pb::ServerMetadataRequest>,
    ) -> Result<Response<pb::ServerMetadataResponse>, Status> {
        Ok(Response::new(pb::ServerMetadataResponse {
            name: call::SERVER_NAME.into(),
            version: env!("CARGO_PKG_VERSION").into(),
            extensions: call::EXTENSIONS.iter().map(|e| e.to_string()).collect(),
        }))
    }

    async fn model_metadata(
        &self,
        request: Request<pb::ModelMetadataRequest>,
    ) -> Result<Response<pb::ModelMetadataResponse>, Status> {
        let request = request.into_inner();
        let model = call::model_for(&self.service, &request.name, Some(&request.version))
            .map_err(to_status)?;
        let tensor = |m: call::TensorMeta| pb::model_metadata_response::TensorMetadata {
            name: m.name,
            datatype: m.datatype.into(),
            shape: m.shape,
        };
        Ok(Response::new(pb::ModelMetadataResponse {
            name: model.name.clone(),
            versions: vec![model.version.clone()],
            platform: call::PLATFORM.into(),
            inputs: call::inputs_meta(&model.tensors)
                .into_iter()
                .map(tensor)
                .collect(),
            outputs: call::outputs_meta(&model.tensors)
                .into_iter()
                .map(tensor)
                .collect(),
        }))
    }

    async fn model_infer(
        &self,
        request: Request<pb::ModelInferRequest>,
    ) -> Result<Response<pb::ModelInferResponse>, Status> {
        use tracing::Instrument;
        let grpc_timeout = request
            .metadata()
            .get("grpc-timeout")
            .and_then(|v| v.to_str().ok())
            .and_then(crate::ladder::parse_grpc_timeout);
        let grpc_timeout =
            crate::api::grpc_connections::time_left(request.extensions(), grpc_timeout);
        let span = crate::service::call_span(
            "inference.GRPCInferenceService/ModelInfer",
            request
                .metadata()
                .get("traceparent")
                .and_then(|v| v.to_str().ok()),
        );
        let mut request = request.into_inner();
        async move {
            let left = call::earlier(
                grpc_timeout,
                call::timeout_of(int64_parameter(
                    &request.parameters,
                    call::TIMEOUT_PARAMETER,
                )?)?,
            );
            let inputs = inputs_of(&mut request)?;
            if let Some(output) = request
                .outputs
                .iter()
                .find(|o| o.parameters.contains_key("classification"))
            {
                return Err(V2Error::Invalid(format!(
                    "output {}: the classification extension is not served; ask for label and \
                     logits",
                    output.name
                )));
            }
            let names: Vec<String> = request.outputs.iter().map(|o| o.name.clone()).collect();
            let call::Inferred {
                model,
                outputs,
                degraded,
            } = call::infer(
                &self.service,
                &request.model_name,
                Some(&request.model_version),
                &inputs,
                &names,
                left,
            )
            .await?;
            let raw_output_contents = outputs.iter().map(|o| o.values.raw()).collect();
            Ok(pb::ModelInferResponse {
                model_name: model.name.clone(),
                model_version: model.version.clone(),
                id: request.id,
                parameters: [(
                    "degraded".to_string(),
                    pb::InferParameter {
                        parameter_choice: Some(pb::infer_parameter::ParameterChoice::BoolParam(
                            degraded,
                        )),
                    },
                )]
                .into(),
                outputs: outputs
                    .into_iter()
                    .map(|o| pb::model_infer_response::InferOutputTensor {
                        name: o.name.name().into(),
                        datatype: o.name.datatype().into(),
                        shape: o.shape,
                        parameters: Default::default(),
                        contents: None,
                    })
                    .collect(),
                raw_output_contents,
            })
        }
        .instrument(span)
        .await
        .map(Response::new)
        .map_err(to_status)
    }
}
