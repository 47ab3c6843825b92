//! The SQLite store passes the store conformance suite.

tidings_testkit::store_conformance!(tidings_testkit::services::SqliteTestDb);
