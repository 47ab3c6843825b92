//! The database-log transport of any dialect under the transport
//! conformance suite: `tidings_testkit::database_log_conformance!(PgTestDb);`
//! in a store crate's tests proves its log, with three partitions per topic.
//! Not declared: binary-mode headers (the log stores structured CloudEvents JSON).

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tidings_core::{Publisher, Subscriber};
use tidings_log::LogReaderConfig;

use crate::conformance::TransportUnderTest;
use crate::services::TestDb;

/// The database log of a fresh test database.
#[derive(Debug)]
pub struct DatabaseLog<T>(pub T);

#[async_trait]
impl<T: TestDb> TransportUnderTest for DatabaseLog<T> {
    async fn publisher(&self) -> Arc<dyn Publisher> {
        Arc::new(self.0.store().log_publisher())
    }

    async fn subscriber(&self) -> Arc<dyn Subscriber> {
        let config = LogReaderConfig::default()
            .poll_interval(Duration::from_millis(20))
            .partitions(3);
        Arc::new(self.0.store().log_subscriber(config))
    }

    fn redelivery_wait(&self) -> Duration {
        Duration::ZERO
    }

    async fn teardown(&self) {
        self.0.teardown().await;
    }
}

/// Runs the transport conformance suite over the database log of the
/// test database type `$db` (a [`TestDb`]).
#[macro_export]
macro_rules! database_log_conformance {
    ($db:ty) => {
        $crate::transport_conformance!(async {
            $crate::database_log::DatabaseLog(<$db as $crate::services::TestDb>::create().await)
        });
    };
}
