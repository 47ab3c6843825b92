//! What the store needs of a sqlx database, said once.
//!
//! Generic sqlx code has to repeat, on every function, that the database
//! can bind a `&str`, decode an `i64`, execute on a `&mut Connection`...
//! [`SqlDb`] says it once, in the where-clause of one blanket impl: any
//! database sqlx supports with these types is an `SqlDb`, and the store's
//! code asks for nothing else. [`Stmt`] and [`Record`] are the two handles
//! the store uses: a statement with its arguments, and a row read back.

use futures::future::BoxFuture;
use sqlx::error::BoxDynError;
use sqlx::{Arguments, ColumnIndex, Database, Decode, Encode, Executor, IntoArguments, Row, SqlStr, Type};
use tidings_core::{Error, Result};
use uuid::Uuid;

/// The database can bind a `T` as a statement argument.
pub trait Bind<'t, T>: Database {
    /// Adds `value` to `args`.
    fn bind(args: &mut Self::Arguments, value: T) -> std::result::Result<(), BoxDynError>;
}

impl<'t, DB: Database, T> Bind<'t, T> for DB
where
    T: Encode<'t, DB> + Type<DB>,
{
    fn bind(args: &mut DB::Arguments, value: T) -> std::result::Result<(), BoxDynError> {
        args.add(value)
    }
}

/// The database can decode a `T` from a column.
pub trait Get<T>: Database {
    /// Column `index` of `row`.
    fn get(row: &Self::Row, index: usize) -> std::result::Result<T, sqlx::Error>;
}

impl<DB: Database, T> Get<T> for DB
where
    T: for<'r> Decode<'r, DB> + Type<DB>,
    usize: ColumnIndex<DB::Row>,
{
    fn get(row: &DB::Row, index: usize) -> std::result::Result<T, sqlx::Error> {
        row.try_get(index)
    }
}

/// A sqlx database with every type and ability the store uses.
pub trait SqlDb:
    Database
    + for<'a> Bind<'a, i64>
    + for<'a> Bind<'a, i32>
    + for<'a> Bind<'a, bool>
    + for<'a> Bind<'a, f64>
    + for<'a> Bind<'a, &'a str>
    + for<'a> Bind<'a, Option<&'a str>>
    + for<'a> Bind<'a, &'a [u8]>
    + for<'a> Bind<'a, Uuid>
    + for<'a> Bind<'a, Option<Uuid>>
    + for<'a> Bind<'a, Option<i64>>
    + Get<i64>
    + Get<i32>
    + Get<bool>
    + Get<f64>
    + Get<String>
    + Get<Option<String>>
    + Get<Vec<u8>>
    + Get<Uuid>
    + Get<Option<Uuid>>
    + Get<Option<i64>>
    + Get<Option<f64>>
{
    /// Runs a statement that returns no rows.
    fn run<'c>(
        conn: &'c mut Self::Connection,
        sql: SqlStr,
        args: Self::Arguments,
    ) -> BoxFuture<'c, std::result::Result<Self::QueryResult, sqlx::Error>>;

    /// Runs a query and returns every row.
    fn rows<'c>(
        conn: &'c mut Self::Connection,
        sql: SqlStr,
        args: Self::Arguments,
    ) -> BoxFuture<'c, std::result::Result<Vec<Self::Row>, sqlx::Error>>;

    /// Runs a script of several statements without arguments (a migration).
    fn script<'c>(
        conn: &'c mut Self::Connection,
        sql: SqlStr,
    ) -> BoxFuture<'c, std::result::Result<(), sqlx::Error>>;
}

impl<DB> SqlDb for DB
where
    DB: Database
        + for<'a> Bind<'a, i64>
        + for<'a> Bind<'a, i32>
        + for<'a> Bind<'a, bool>
        + for<'a> Bind<'a, f64>
        + for<'a> Bind<'a, &'a str>
        + for<'a> Bind<'a, Option<&'a str>>
        + for<'a> Bind<'a, &'a [u8]>
        + for<'a> Bind<'a, Uuid>
        + for<'a> Bind<'a, Option<Uuid>>
        + for<'a> Bind<'a, Option<i64>>
        + Get<i64>
        + Get<i32>
        + Get<bool>
        + Get<f64>
        + Get<String>
        + Get<Option<String>>
        + Get<Vec<u8>>
        + Get<Uuid>
        + Get<Option<Uuid>>
        + Get<Option<i64>>
        + Get<Option<f64>>,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    DB::Arguments: IntoArguments<DB>,
{
    fn run<'c>(
        conn: &'c mut DB::Connection,
        sql: SqlStr,
        args: DB::Arguments,
    ) -> BoxFuture<'c, std::result::Result<DB::QueryResult, sqlx::Error>> {
        Box::pin(async move { sqlx::query_with(sql, args).execute(conn).await })
    }

    fn rows<'c>(
        conn: &'c mut DB::Connection,
        sql: SqlStr,
        args: DB::Arguments,
    ) -> BoxFuture<'c, std::result::Result<Vec<DB::Row>, sqlx::Error>> {
        Box::pin(async move { sqlx::query_with(sql, args).fetch_all(conn).await })
    }

    fn script<'c>(
        conn: &'c mut DB::Connection,
        sql: SqlStr,
    ) -> BoxFuture<'c, std::result::Result<(), sqlx::Error>> {
        Box::pin(async move { sqlx::raw_sql(sql).execute(conn).await.map(drop) })
    }
}

/// A statement, its arguments, and what it does (named in its errors).
pub struct Stmt<DB: SqlDb> {
    sql: SqlStr,
    args: DB::Arguments,
    bad_argument: Option<BoxDynError>,
    what: &'static str,
}

impl<DB: SqlDb> std::fmt::Debug for Stmt<DB> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stmt")
            .field("what", &self.what)
            .finish_non_exhaustive()
    }
}

impl<DB: SqlDb> Stmt<DB> {
    /// `sql`, which does `what` (`"claiming an outbox batch"`).
    pub fn new(sql: &'static str, what: &'static str) -> Self {
        Self::dynamic(sqlx::SqlSafeStr::into_sql_str(sql), what)
    }

    /// A statement whose text was put together at run time from trusted parts.
    pub fn dynamic(sql: SqlStr, what: &'static str) -> Self {
        Stmt {
            sql,
            args: DB::Arguments::default(),
            bad_argument: None,
            what,
        }
    }

    /// Binds the next argument.
    pub fn bind<'t, T>(mut self, value: T) -> Self
    where
        DB: Bind<'t, T>,
    {
        if self.bad_argument.is_none()
            && let Err(e) = DB::bind(&mut self.args, value)
        {
            self.bad_argument = Some(e);
        }
        self
    }

    fn checked(self) -> Result<(SqlStr, DB::Arguments, &'static str)> {
        match self.bad_argument {
            Some(e) => Err(Error::Database {
                operation: self.what,
                source: sqlx::Error::Encode(e),
            }),
            None => Ok((self.sql, self.args, self.what)),
        }
    }

    /// Runs it; returns the driver's result (see [`Dialect::rows_affected`](crate::Dialect::rows_affected)).
    pub async fn execute(self, conn: &mut DB::Connection) -> Result<DB::QueryResult> {
        let (sql, args, what) = self.checked()?;
        DB::run(conn, sql, args).await.map_err(Error::db(what))
    }

    /// Runs it and reads every row.
    pub async fn fetch_all(self, conn: &mut DB::Connection) -> Result<Vec<Record<DB>>> {
        let (sql, args, what) = self.checked()?;
        let rows = DB::rows(conn, sql, args).await.map_err(Error::db(what))?;
        Ok(rows.into_iter().map(|row| Record { row, what }).collect())
    }

    /// Runs it and reads the first row, if any.
    pub async fn fetch_optional(self, conn: &mut DB::Connection) -> Result<Option<Record<DB>>> {
        Ok(self.fetch_all(conn).await?.into_iter().next())
    }

    /// Runs it and reads its one row.
    pub async fn fetch_one(self, conn: &mut DB::Connection) -> Result<Record<DB>> {
        let what = self.what;
        self.fetch_optional(conn).await?.ok_or(Error::Database {
            operation: what,
            source: sqlx::Error::RowNotFound,
        })
    }
}

/// A row read by a [`Stmt`].
pub struct Record<DB: Database> {
    row: DB::Row,
    what: &'static str,
}

impl<DB: Database> std::fmt::Debug for Record<DB> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Record")
            .field("what", &self.what)
            .finish_non_exhaustive()
    }
}

impl<DB: Database> Record<DB> {
    /// Column `index`, decoded.
    pub fn get<T>(&self, index: usize) -> Result<T>
    where
        DB: Get<T>,
    {
        DB::get(&self.row, index).map_err(Error::db(self.what))
    }
}
