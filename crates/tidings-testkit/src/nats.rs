//! NATS service helpers.

/// The NATS URL tests use: `NATS_URL`, default `nats://127.0.0.1:4222`.
pub fn nats_url() -> String {
    std::env::var("NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".to_owned())
}
