//! The MySQL store passes the store conformance suite (run on MariaDB here).

tidings_testkit::store_conformance!(tidings_testkit::services::MySqlTestDb);
