//! Error classes: the dialect says which of its database's errors are
//! worth trying again. A lock held by another transaction is a lost race
//! (transient); a broken constraint is bad data (permanent), whether Tidings'
//! own statement or a handler's `?` met it.

use tidings_consumer::HandlerError;
use tidings_core::{Error, ErrorClass, Outbox};
use tidings_sql::Dialect;
use tidings_sql::db::{SqlDb, Stmt};

use super::fixtures::setup;
use crate::services::TestDb;

/// A statement that waits on another transaction's lock gives up with a
/// transient error; a row that breaks a constraint is a permanent one;
/// a handler's database error gets the same classes from the store.
pub async fn a_lost_race_is_transient_and_bad_data_permanent<T: TestDb>(db: &T) {
    let store = setup(db).await;
    let mut seed = store.conn("seeding").await.unwrap();
    Stmt::<T::Dialect>::new(
        "INSERT INTO test_applied (consumer, k, seq) VALUES ('race', 'k', 1)",
        "seeding",
    )
    .execute(&mut *seed)
    .await
    .unwrap();
    drop(seed);
    let bump = "UPDATE test_applied SET seq = seq + 1 WHERE consumer = 'race'";

    // One transaction holds the row; another, impatient, loses the race.
    let mut holder = store.begin_tx("holding the row").await.unwrap();
    Stmt::<T::Dialect>::new(bump, "holding the row")
        .execute(&mut *holder)
        .await
        .unwrap();
    let mut loser = store.conn("losing the race").await.unwrap();
    loser.close_on_drop();
    Stmt::<T::Dialect>::new(T::GIVE_UP_ON_LOCKS, "giving up on locks at once")
        .execute(&mut *loser)
        .await
        .unwrap();
    let lost = Stmt::<T::Dialect>::new(bump, "losing the race")
        .execute(&mut *loser)
        .await
        .map(drop)
        .expect_err("the row is held by another transaction");
    assert_eq!(
        lost.class(),
        ErrorClass::Transient,
        "a lock wait that gave up: {}",
        lost.report()
    );
    let Error::Database { source, .. } = &lost else {
        panic!("a database error, not {lost:?}");
    };
    assert_eq!(store.error_class(source), ErrorClass::Transient);
    let raw = <<T::Dialect as Dialect>::Db as SqlDb>::run(
        &mut loser,
        sqlx::SqlSafeStr::into_sql_str(bump),
        Default::default(),
    )
    .await
    .map(drop)
    .expect_err("still held");
    let from_handler = HandlerError::from(raw);
    assert_eq!(
        from_handler.class(),
        None,
        "a handler's database error is the store's to classify"
    );
    assert_eq!(
        from_handler.class_with(|e| store.error_class(e)),
        ErrorClass::Transient
    );
    drop(loser);
    holder.rollback().await.unwrap();

    // A row without its key: `test_applied.k` is `NOT NULL`.
    let mut conn = store.conn("breaking a constraint").await.unwrap();
    let broken = Stmt::<T::Dialect>::new(
        "INSERT INTO test_applied (consumer, k, seq) VALUES ($1, $2, 1)",
        "breaking a constraint",
    )
    .bind("race")
    .bind(None::<&str>)
    .execute(&mut *conn)
    .await
    .map(drop)
    .expect_err("k may not be null");
    assert_eq!(
        broken.class(),
        ErrorClass::Permanent,
        "a broken constraint: {}",
        broken.report()
    );
    let Error::Database { source, .. } = &broken else {
        panic!("a database error, not {broken:?}");
    };
    assert_eq!(store.error_class(source), ErrorClass::Permanent);
}
