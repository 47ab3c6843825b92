//! `open_store` chooses the database by the URL's scheme, and refuses a URL
//! no database of the build opens, naming the ones it does.

use tidings::{AnyStore, LagSource, open_store, store_schemes, with_store};

#[tokio::test]
async fn a_sqlite_url_opens_the_embedded_store() {
    let path = std::env::temp_dir().join(format!("tidings-open-{}.db", std::process::id()));
    let url = format!("sqlite://{}", path.display());
    let store = open_store(&url).await.expect("a sqlite: URL opens");
    assert!(matches!(store, AnyStore::Sqlite(_)), "{store:?}");
    assert_eq!(store.database(), "SQLite");
    store.migrate().await.unwrap();
    let lag = with_store!(&store, |s| s.lag().await).unwrap();
    assert_eq!(lag.outbox_pending, 0);
    drop(store);
    for suffix in ["", "-wal", "-shm"] {
        std::fs::remove_file(format!("{}{suffix}", path.display())).ok();
    }
}

#[tokio::test]
async fn an_unknown_scheme_is_refused_naming_the_known_ones() {
    let err = open_store("mysql://app:hunter2@db/shop").await.unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("mysql://app:***@db/shop") || text.contains("mysql://app@db/shop"),
        "{text}"
    );
    assert!(
        !text.contains("hunter2"),
        "the password stays out of the error: {text}"
    );
    for scheme in store_schemes() {
        assert!(text.contains(scheme), "{text} names {scheme}");
    }
    assert!(!err.class().is_retryable());
}

/// Built with the `postgres` feature (as the workspace's own tests are):
/// a `postgres://` URL opens PostgreSQL, and one to a closed port fails at
/// once, naming the cause.
#[cfg(feature = "postgres")]
#[tokio::test]
async fn a_postgres_url_opens_postgresql() {
    let url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned());
    let store = open_store(&url)
        .await
        .unwrap_or_else(|e| panic!("PostgreSQL at {url} (set DATABASE_URL): {}", e.report()));
    assert!(matches!(store, AnyStore::Postgres(_)), "{store:?}");
    assert_eq!(store.database(), "PostgreSQL");

    let started = std::time::Instant::now();
    let err = open_store("postgres://postgres@127.0.0.1:1/test")
        .await
        .unwrap_err();
    assert!(
        started.elapsed() < std::time::Duration::from_secs(15),
        "refused at once, not after a pool timeout"
    );
    assert!(
        err.report().to_string().contains("connecting to PostgreSQL"),
        "{}",
        err.report()
    );
}
