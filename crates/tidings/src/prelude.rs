//! What a service names to add an outbox and consumers: `use tidings::prelude::*;`.

pub use crate::consumer::{Consumer, ConsumerConfig, Context, Handler, HandlerError};
pub use crate::relay::{Relay, RelayConfig};
pub use crate::{CancellationToken, Uuid, async_trait, shutdown_on_signal, sqlx};
pub use crate::{Envelope, Kind, Message, Outbox, Store};

#[cfg(feature = "postgres")]
pub use crate::postgres::PgStore;
#[cfg(feature = "postgres")]
pub use sqlx::Postgres;

#[cfg(feature = "mysql")]
pub use crate::mysql::MySqlStore;
#[cfg(feature = "mysql")]
pub use sqlx::MySql;

#[cfg(feature = "sqlite")]
pub use crate::sqlite::SqliteStore;
#[cfg(feature = "sqlite")]
pub use sqlx::Sqlite;
