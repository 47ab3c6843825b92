//! The database-log transport on PostgreSQL passes the transport conformance suite.
//!
//! Run with three partitions per topic. Not declared: binary-mode headers
//! (the log stores structured CloudEvents JSON).

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tidings_core::log::LogReaderConfig;
use tidings_core::{Publisher, Subscriber};
use tidings_testkit::conformance::TransportUnderTest;
use tidings_testkit::services::PgTestDb;

struct PgLog(PgTestDb);

#[async_trait]
impl TransportUnderTest for PgLog {
    async fn publisher(&self) -> Arc<dyn Publisher> {
        Arc::new(self.0.store.log_publisher())
    }

    async fn subscriber(&self) -> Arc<dyn Subscriber> {
        Arc::new(
            self.0.store.log_subscriber(
                LogReaderConfig::default()
                    .poll_interval(Duration::from_millis(20))
                    .partitions(3),
            ),
        )
    }

    fn redelivery_wait(&self) -> Duration {
        Duration::ZERO
    }

    async fn teardown(&self) {
        self.0.drop_schema_ref().await;
    }
}

tidings_testkit::transport_conformance!(async { PgLog(PgTestDb::new().await) });
