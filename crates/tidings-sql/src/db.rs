//! What the store needs of a sqlx database, said once.
//!
//! Generic sqlx code has to repeat, on every function, that the database
//! can bind a `&str`, decode an `i64`, execute on a `&mut Connection`...
//! [`SqlDb`] says it once, in the where-clause of one blanket impl: any
//! database sqlx supports with these types is an `SqlDb`, and the store's
//! code asks for nothing else. [`Stmt`] and [`Record`] are the two handles
//! the store uses: a statement with its arguments, and a row read back,
//! each on a [`Dialect`]'s database, whose errors it classifies.

use futures::future::BoxFuture;
use sqlx::error::BoxDynError;
use sqlx::{Arguments, ColumnIndex, Database, Decode, Encode, Executor, IntoArguments, Row, SqlStr, Type};
use tidings_core::Result;
use uuid::Uuid;

use crate::Dialect;
use crate::errors::db_error;
use crate::placeholders::{Placeholders, positional};

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

/// A statement, its arguments, and what it does (named in its errors), on
/// dialect `D`'s database, which classifies its errors.
///
/// The text numbers its parameters (`$1`, `$2`...) on every database; where
/// the database binds by position ([`Placeholders::Positional`]), the
/// arguments are kept until the statement runs, then bound once for each
/// place the text names them.
pub struct Stmt<'t, D: Dialect> {
    sql: SqlStr,
    args: Params<'t, D>,
    what: &'static str,
}

type Args<D> = <<D as Dialect>::Db as Database>::Arguments;
type Connection<D> = <<D as Dialect>::Db as Database>::Connection;
/// An argument kept for a database that binds by position: binds a copy.
type Deferred<'t, D> = Box<dyn Fn(&mut Args<D>) -> std::result::Result<(), BoxDynError> + Send + 't>;

/// A statement's arguments, bound as they come or kept until it runs.
enum Params<'t, D: Dialect> {
    /// Bound as they come; the first that could not be encoded.
    Bound(Args<D>, Option<BoxDynError>),
    /// Kept, with the parameter each `?` of the text stands for.
    Kept(Vec<Deferred<'t, D>>, Vec<usize>),
}

impl<D: Dialect> std::fmt::Debug for Stmt<'_, D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stmt")
            .field("what", &self.what)
            .finish_non_exhaustive()
    }
}

impl<'t, D: Dialect> Stmt<'t, D> {
    /// `sql`, which does `what` (`"claiming an outbox batch"`).
    pub fn new(sql: &'static str, what: &'static str) -> Self {
        Self::dynamic(sqlx::SqlSafeStr::into_sql_str(sql), what)
    }

    /// A statement whose text was put together at run time from trusted parts.
    pub fn dynamic(sql: SqlStr, what: &'static str) -> Self {
        match D::PLACEHOLDERS {
            Placeholders::Numbered => Stmt {
                sql,
                args: Params::Bound(Args::<D>::default(), None),
                what,
            },
            Placeholders::Positional => {
                let (text, order) = positional(sql.as_str());
                Stmt {
                    sql: sqlx::SqlSafeStr::into_sql_str(sqlx::AssertSqlSafe(text)),
                    args: Params::Kept(Vec::new(), order),
                    what,
                }
            }
        }
    }

    /// Binds the next parameter (`$1`, then `$2`...).
    pub fn bind<T>(mut self, value: T) -> Self
    where
        D::Db: Bind<'t, T>,
        T: Clone + Send + 't,
    {
        match &mut self.args {
            Params::Bound(args, bad) => {
                if bad.is_none()
                    && let Err(e) = <D::Db as Bind<'t, T>>::bind(args, value)
                {
                    *bad = Some(e);
                }
            }
            Params::Kept(kept, _) => {
                kept.push(Box::new(move |args: &mut Args<D>| {
                    <D::Db as Bind<'t, T>>::bind(args, value.clone())
                }));
            }
        }
        self
    }

    fn checked(self) -> Result<(SqlStr, Args<D>, &'static str)> {
        let args = match self.args {
            Params::Bound(args, None) => args,
            Params::Bound(_, Some(e)) => return Err(db_error::<D>(self.what)(sqlx::Error::Encode(e))),
            Params::Kept(kept, order) => {
                let mut args = Args::<D>::default();
                for n in order {
                    let bound = match kept.get(n) {
                        Some(bind) => bind(&mut args),
                        None => Err(format!(
                            "the statement names parameter ${} but only {} were bound",
                            n + 1,
                            kept.len()
                        )
                        .into()),
                    };
                    if let Err(e) = bound {
                        return Err(db_error::<D>(self.what)(sqlx::Error::Encode(e)));
                    }
                }
                args
            }
        };
        Ok((self.sql, args, self.what))
    }

    /// Runs it; returns the driver's result (see [`Dialect::rows_affected`]).
    pub async fn execute(self, conn: &mut Connection<D>) -> Result<<D::Db as Database>::QueryResult> {
        let (sql, args, what) = self.checked()?;
        D::Db::run(conn, sql, args).await.map_err(db_error::<D>(what))
    }

    /// Runs it and reads every row.
    pub async fn fetch_all(self, conn: &mut Connection<D>) -> Result<Vec<Record<D>>> {
        let (sql, args, what) = self.checked()?;
        let rows = D::Db::rows(conn, sql, args).await.map_err(db_error::<D>(what))?;
        Ok(rows.into_iter().map(|row| Record { row, what }).collect())
    }

    /// Runs it and reads the first row, if any.
    pub async fn fetch_optional(self, conn: &mut Connection<D>) -> Result<Option<Record<D>>> {
        Ok(self.fetch_all(conn).await?.into_iter().next())
    }

    /// Runs it and reads its one row.
    pub async fn fetch_one(self, conn: &mut Connection<D>) -> Result<Record<D>> {
        let what = self.what;
        match self.fetch_optional(conn).await? {
            Some(record) => Ok(record),
            None => Err(db_error::<D>(what)(sqlx::Error::RowNotFound)),
        }
    }
}

/// A row read by a [`Stmt`].
pub struct Record<D: Dialect> {
    row: <D::Db as Database>::Row,
    what: &'static str,
}

impl<D: Dialect> std::fmt::Debug for Record<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Record")
            .field("what", &self.what)
            .finish_non_exhaustive()
    }
}

impl<D: Dialect> Record<D> {
    /// Column `index`, decoded.
    pub fn get<T>(&self, index: usize) -> Result<T>
    where
        D::Db: Get<T>,
    {
        <D::Db as Get<T>>::get(&self.row, index).map_err(db_error::<D>(self.what))
    }
}
