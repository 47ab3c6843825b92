//! The upload pipeline's four consumers through the idempotency harness
//! on PostgreSQL and on MySQL (MariaDB here): delivered twice, redelivered
//! after a crash on either side of the commit, and reordered across files,
//! each ends in the state of a clean run.

use std::time::Duration;

use tidings_core::{Envelope, Message};
use tidings_demo_kit::dialects::{My, Pg};
use tidings_demo_kit::{SidePool, ThirdParty};
use tidings_example_upload::handlers::{Antivirus, Catalog, FragileSearch, Indexer, Thumbnailer};
use tidings_example_upload::messages::*;
use tidings_example_upload::sql::UploadDialect;
use tidings_example_upload::system::{File, UploadStore};
use tidings_sql::SqlStore;
use tidings_testkit::idempotency::{Harness, OUTBOX, Report, State, joined};
use tidings_testkit::services::{MySqlTestDb, PgTestDb, TestDb};

const FILES: usize = 16;

fn envelope<M: Message>(message: &M) -> Envelope {
    Envelope::new("upload-tests", message).unwrap()
}

fn file_id(i: usize) -> String {
    format!("file-{i:03}")
}

/// Files 3 and 11 are infected, file 6 is no image.
fn file(i: usize) -> File {
    File {
        file_id: file_id(i),
        name: format!("IMG_{i:04}.jpg"),
        bytes: 10_000 + 1_000 * i as i64,
        infected: i == 3 || i == 11,
        corrupt: i == 6,
    }
}

fn clean(i: usize) -> bool {
    !file(i).infected
}

/// A database whose tables the harness compares: (name, query of (key, row)).
trait Tables: UploadDialect {
    const TABLES: &'static [(&'static str, &'static str)];
    fn side(pool: sqlx::Pool<Self::Db>) -> SidePool;
}

impl Tables for Pg {
    const TABLES: &'static [(&'static str, &'static str)] = &[
        ("status", "SELECT file_id, status FROM file_status"),
        ("scan", "SELECT file_id, verdict FROM scans"),
        ("thumbnail", "SELECT file_id, digest FROM thumbnails"),
        (
            "indexed",
            "SELECT subject || '/' || kind, count(*)::text FROM demo_third_party GROUP BY 1",
        ),
        (
            "step",
            "SELECT consumer || '/' || subject, step::text FROM demo_steps",
        ),
        (
            "violations",
            "SELECT 'count', count(*)::text FROM demo_step_violations",
        ),
        ("emitted", OUTBOX),
    ];
    fn side(pool: sqlx::PgPool) -> SidePool {
        SidePool::Postgres(pool)
    }
}

impl Tables for My {
    const TABLES: &'static [(&'static str, &'static str)] = &[
        ("status", "SELECT file_id, status FROM file_status"),
        ("scan", "SELECT file_id, verdict FROM scans"),
        ("thumbnail", "SELECT file_id, digest FROM thumbnails"),
        (
            "indexed",
            "SELECT CONCAT(subject, '/', kind), CAST(count(*) AS CHAR) FROM demo_third_party GROUP BY subject, kind",
        ),
        (
            "step",
            "SELECT CONCAT(consumer, '/', subject), CAST(step AS CHAR) FROM demo_steps",
        ),
        (
            "violations",
            "SELECT 'count', CAST(count(*) AS CHAR) FROM demo_step_violations",
        ),
        ("emitted", OUTBOX),
    ];
    fn side(pool: sqlx::MySqlPool) -> SidePool {
        SidePool::MySql(pool)
    }
}

async fn snapshot<D: Tables>(store: &SqlStore<D>) -> State {
    State::read(store, D::TABLES, joined).await
}

/// Checks `consumer`'s handler on `events` of `topic`, each scenario's
/// store holding the uploaded files (and what their upload queued).
async fn check<T, H>(
    consumer: &str,
    handler: impl Fn(&SqlStore<T::Dialect>) -> H,
    topic: &str,
    events: Vec<Envelope>,
) -> Report
where
    T: TestDb,
    T::Dialect: Tables,
    H: tidings_consumer::Handler<<T::Dialect as tidings_sql::Dialect>::Db>,
{
    let mut dbs = Vec::new();
    let report = Harness::new(consumer, handler)
        .events(topic, events)
        .check(
            async || {
                let db = T::create().await;
                db.store().setup().await.unwrap();
                ThirdParty::new(T::Dialect::side(db.store().pool().clone()), "search")
                    .setup()
                    .await
                    .unwrap();
                for i in 0..FILES {
                    db.store().upload(&file(i)).await.unwrap();
                }
                let store = db.store().clone();
                dbs.push(db);
                store
            },
            async |store: &SqlStore<T::Dialect>| snapshot(store).await,
        )
        .await;
    for db in dbs {
        db.teardown().await;
    }
    println!("{report}");
    report.assert_idempotent();
    report
}

macro_rules! idempotency_checks {
    ($module:ident, $db:ty) => {
        mod $module {
            use super::*;

            #[tokio::test]
            async fn the_catalog_is_idempotent() {
                let mut events = Vec::new();
                for i in 0..FILES {
                    let f = file(i);
                    events.push(envelope(&UploadFinished {
                        file_id: f.file_id.clone(),
                        name: f.name,
                        bytes: f.bytes,
                        step: 1,
                    }));
                    if f.infected {
                        events.push(envelope(&FileQuarantined {
                            file_id: f.file_id,
                            signature: "EICAR".into(),
                            step: 2,
                        }));
                    }
                }
                let report = check::<$db, _>("catalog", |_| Catalog, UPLOADS, events).await;
                assert_eq!(report.scenarios[0].handled, FILES + 2);
            }

            #[tokio::test]
            async fn the_antivirus_is_idempotent() {
                let events = (0..FILES)
                    .map(|i| {
                        envelope(&ScanFile {
                            file_id: file_id(i),
                        })
                    })
                    .collect();
                let report = check::<$db, _>("antivirus", |_| Antivirus, SCAN, events).await;
                assert_eq!(report.scenarios[0].handled, FILES);
            }

            #[tokio::test]
            async fn the_thumbnailer_is_idempotent_and_dead_letters_what_is_no_image() {
                let events = (0..FILES)
                    .filter(|i| clean(*i))
                    .map(|i| {
                        envelope(&MakeThumbnail {
                            file_id: file_id(i),
                        })
                    })
                    .collect();
                let report = check::<$db, _>("thumbnailer", |_| Thumbnailer, THUMBNAIL, events).await;
                assert_eq!(report.scenarios[0].dead_lettered, 1, "{report}");
            }

            #[tokio::test]
            async fn the_indexer_is_idempotent() {
                let events = (0..FILES)
                    .filter(|i| clean(*i) && !file(*i).corrupt)
                    .map(|i| {
                        envelope(&IndexDocument {
                            file_id: file_id(i),
                            thumbnail: format!("{i:016x}"),
                        })
                    })
                    .collect();
                let indexer = |store: &SqlStore<<$db as TestDb>::Dialect>| Indexer {
                    search: FragileSearch {
                        api: ThirdParty::new(
                            <<$db as TestDb>::Dialect as Tables>::side(store.pool().clone()),
                            "search",
                        ),
                        failure_rate: 0.0,
                        spike_rate: 0.0,
                        spike: Duration::ZERO,
                    },
                };
                let report = check::<$db, _>("indexer", indexer, INDEX, events).await;
                assert_eq!(report.scenarios[0].handled, FILES - 3);
            }
        }
    };
}

idempotency_checks!(on_postgres, PgTestDb);
idempotency_checks!(on_mysql, MySqlTestDb);
