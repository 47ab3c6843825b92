//! The database-log transport on MySQL passes the transport conformance suite.

tidings_testkit::database_log_conformance!(tidings_testkit::services::MySqlTestDb);
