//! The database-log transport on SQLite passes the transport conformance suite.

tidings_testkit::database_log_conformance!(tidings_testkit::services::SqliteTestDb);
