//! Tidings in one file, on SQLite (no server): an order and its event
//! committed together, a relay that publishes the event to the database
//! log, and a consumer that sends the receipt once, however often the event
//! is delivered. It runs until Ctrl-C.
//!
//! `cargo run -p tidings-example-quickstart`
use serde::{Deserialize, Serialize};
use tidings::prelude::*;

/// The event: its type says its topic, its kind and its key.
#[derive(Serialize, Deserialize, Message)]
#[message(event, topic = "orders", aggregate = "order")]
struct OrderPlaced {
    #[message(key)]
    order_id: String,
}

/// The service's own table.
const SCHEMA: &str = "CREATE TABLE IF NOT EXISTS orders (id TEXT PRIMARY KEY)";

struct SendReceipt;

#[async_trait]
impl Handler<Sqlite> for SendReceipt {
    async fn handle(&self, ctx: &mut Context<'_, Sqlite>) -> Result<(), HandlerError> {
        let order: OrderPlaced = ctx.decode()?;
        // Once per (consumer, event, effect): a redelivery does not send it again.
        ctx.once("receipt", |key| async move {
            println!("receipt for {} (key {key})", order.order_id);
            Ok(())
        })
        .await?;
        Ok(())
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let store = SqliteStore::connect("sqlite://quickstart.db").await?;
    store.migrate().await?;
    sqlx::raw_sql(SCHEMA).execute(store.pool()).await?;

    // The business write and its event, in one transaction of the service's own.
    let order_id = Uuid::now_v7().to_string();
    let mut tx = store.pool().begin().await?;
    let insert = sqlx::query("INSERT INTO orders (id) VALUES ($1)").bind(&order_id);
    insert.execute(&mut *tx).await?;
    store.enqueue(&mut tx, &OrderPlaced { order_id }).await?;
    store.commit(tx).await?; // and wakes the relay

    // The relay moves committed events to the database log; the consumer reads it.
    // Both run until Ctrl-C, then finish what they hold and hand their leases back.
    let shutdown = shutdown_on_signal()?;
    let relay = Relay::new(store.clone(), store.log_publisher()).run(shutdown.clone());
    let consumer = Consumer::new("receipts", store.clone(), SendReceipt).topic("orders");
    let log = store.log_subscriber(Default::default());
    tokio::try_join!(relay, consumer.run(&log, shutdown))?;
    Ok(())
}
