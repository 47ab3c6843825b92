//! What every reference system (`tidings demo <shape>`) shares, so that a
//! shape is its messages, its handlers, its tables and its invariants:
//!
//! - [`Transport`]: the database log or a broker, its resources named after the system;
//! - [`RunOptions`]: what every system is run with (its database, broker, scale, progress);
//! - [`open_store`], [`label`] and [`SidePool`]: the system's database and one beside it;
//! - [`Runner`]: relays and consumers at a [`Scale`], duplicates injected, the wait for the work to drain;
//! - [`Meter`]: progress on stderr ([`Progress`]);
//! - [`replay_and_wait`]: a replay from code, followed to its end;
//! - [`ThirdParty`]: a simulated API that honours idempotency keys;
//! - [`check_step`]: per-key order, checked in each consumer;
//! - [`Work`]: what each consumer handled, dead-lettered and parked;
//! - [`for_each_database!`]: a handler written once over a dialect, implemented for each database.
#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]

mod database;
mod dialect;
mod options;
mod progress;
mod replay;
mod runner;
mod steps;
mod third_party;
mod transport;
mod work;

pub use database::{SidePool, label, open_store};
pub use dialect::{KitDialect, setup_system, system_id};
pub use options::{DEFAULT_DATABASE, RunOptions, counts, outcome};
pub use progress::{Meter, Progress};
pub use replay::replay_and_wait;
pub use runner::{Runner, Scale, consumer_config, transient};
pub use steps::{COUNT_VIOLATIONS, check_step};
pub use third_party::{Calls, ThirdParty};
pub use transport::Transport;
pub use work::Work;

/// The dialects [`for_each_database!`] implements handlers for.
pub mod dialects {
    pub use tidings_store_mysql::My;
    pub use tidings_store_postgres::Pg;
    pub use tidings_store_sqlite::Lite;
}

/// Writes its body three times, in modules `on_postgres`, `on_mysql` and
/// `on_sqlite`, where `D` is the database's dialect and `Db` its sqlx
/// database: handlers are written once over a shape's SQL and implemented
/// for every database.
#[macro_export]
macro_rules! for_each_database {
    ($($body:tt)*) => {
        mod on_postgres {
            #[allow(unused_imports)]
            use super::*;
            type D = $crate::dialects::Pg;
            type Db = sqlx::Postgres;
            $($body)*
        }
        mod on_mysql {
            #[allow(unused_imports)]
            use super::*;
            type D = $crate::dialects::My;
            type Db = sqlx::MySql;
            $($body)*
        }
        mod on_sqlite {
            #[allow(unused_imports)]
            use super::*;
            type D = $crate::dialects::Lite;
            type Db = sqlx::Sqlite;
            $($body)*
        }
    };
}
