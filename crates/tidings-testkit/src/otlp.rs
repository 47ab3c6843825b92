//! An OpenTelemetry collector for tests: accepts OTLP/HTTP JSON on a free
//! loopback port and keeps every span it receives.

use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::Bytes;
use axum::routing::post;
use serde_json::Value;

/// A running collector.
#[derive(Debug, Clone)]
pub struct Collector {
    /// Where to send spans (`http://127.0.0.1:port`; spans go to `/v1/traces`).
    pub endpoint: String,
    spans: Arc<Mutex<Vec<Value>>>,
}

impl Collector {
    /// Starts one on a free port, served until the runtime ends.
    pub async fn start() -> Collector {
        let spans: Arc<Mutex<Vec<Value>>> = Arc::default();
        let kept = spans.clone();
        let app = Router::new().route(
            "/v1/traces",
            post(move |body: Bytes| {
                let kept = kept.clone();
                async move {
                    let doc: Value = serde_json::from_slice(&body).expect("OTLP JSON");
                    let mut kept = kept.lock().expect("spans lock");
                    for resource in doc["resourceSpans"].as_array().into_iter().flatten() {
                        // Each span names its process's service.name as `service`.
                        let service = resource["resource"]["attributes"]
                            .as_array()
                            .into_iter()
                            .flatten()
                            .find(|a| a["key"] == "service.name")
                            .map_or(Value::Null, |a| a["value"]["stringValue"].clone());
                        let spans = resource["scopeSpans"]
                            .as_array()
                            .into_iter()
                            .flatten()
                            .flat_map(|ss| ss["spans"].as_array().into_iter().flatten());
                        for span in spans {
                            let mut span = span.clone();
                            span["service"] = service.clone();
                            kept.push(span);
                        }
                    }
                    "{}"
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("binding the test collector");
        let endpoint = format!("http://{}", listener.local_addr().expect("an address"));
        tokio::spawn(async move { axum::serve(listener, app).await });
        Collector { endpoint, spans }
    }

    /// The spans received so far (OTLP JSON objects: `name`, `traceId`,
    /// `spanId`, `parentSpanId`, `attributes`..., and `service`, the
    /// `service.name` of the process that sent it).
    pub fn spans(&self) -> Vec<Value> {
        self.spans.lock().expect("spans lock").clone()
    }
}
