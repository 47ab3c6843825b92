//! Kafka service helpers.

/// The Kafka URL tests use: `KAFKA_URL`, default `kafka://127.0.0.1:9092`
/// (`scripts/test` starts a Tansu broker there).
pub fn kafka_url() -> String {
    std::env::var("KAFKA_URL").unwrap_or_else(|_| "kafka://127.0.0.1:9092".to_owned())
}
