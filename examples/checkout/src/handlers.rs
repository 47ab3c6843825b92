//! The five services of the checkout system, as Tidings handlers.
//!
//! Their SQL runs unchanged on PostgreSQL and SQLite, so each handler is
//! written once and implemented for both databases by `for_both_databases!`.

use sqlx::{PgPool, SqlitePool};
use tidings_consumer::{Context, Handler, HandlerError, IdempotencyKey};

use crate::messages::*;

/// Handles checkout's commands: writes the order and emits its events.
#[derive(Debug, Clone, Copy)]
pub struct Checkout;

/// Reserves stock when an order is placed, releases it on cancellation.
/// Orders whose SKU starts with `POISON` make the warehouse fail, forever,
/// until the fix ships (`warehouse_fixed`).
#[derive(Debug, Clone, Copy, Default)]
pub struct Inventory {
    /// The warehouse takes `POISON` SKUs like any other.
    pub warehouse_fixed: bool,
}

/// Sends the confirmation and shipping emails through the effects ledger.
#[derive(Debug, Clone)]
pub struct Email {
    /// The (simulated) email provider.
    pub provider: EmailProvider,
}

/// Counts events by type.
#[derive(Debug, Clone, Copy)]
pub struct Analytics;

/// Credits a point per whole currency unit when an order ships.
#[derive(Debug, Clone, Copy)]
pub struct Loyalty;

/// A stand-in for an email API that honours idempotency keys, as real ones
/// do: it keeps its own table, outside the handler's transaction (in a
/// separate file on SQLite, whose single writer lock the handler holds).
#[derive(Debug, Clone)]
pub enum EmailProvider {
    /// Provider state in PostgreSQL.
    Postgres(PgPool),
    /// Provider state in its own SQLite file.
    Sqlite(SqlitePool),
}

const PROVIDER_SCHEMA: &str = "CREATE TABLE IF NOT EXISTS email_provider (
    idempotency_key TEXT PRIMARY KEY, order_id TEXT NOT NULL, kind TEXT NOT NULL, calls BIGINT NOT NULL)";
const PROVIDER_SEND: &str =
    "INSERT INTO email_provider (idempotency_key, order_id, kind, calls) VALUES ($1, $2, $3, 1)
    ON CONFLICT (idempotency_key) DO UPDATE SET calls = email_provider.calls + 1";
const PROVIDER_TALLY: &str = "SELECT
    (SELECT CAST(count(*) AS BIGINT) FROM email_provider),
    (SELECT CAST(COALESCE(sum(calls), 0) AS BIGINT) FROM email_provider),
    (SELECT CAST(count(*) AS BIGINT) FROM (SELECT order_id, kind FROM email_provider GROUP BY order_id, kind HAVING count(*) > 1) d)";

/// What the email provider saw.
#[derive(Debug, Clone, Copy, Default)]
pub struct ProviderTally {
    /// Distinct emails sent.
    pub sent: i64,
    /// Calls received (a retry with the same key is a call, not an email).
    pub calls: i64,
    /// (order, kind) pairs that got more than one distinct email: duplicated effects.
    pub duplicated: i64,
}

impl EmailProvider {
    /// Creates the provider's table.
    pub async fn setup(&self) -> sqlx::Result<()> {
        match self {
            EmailProvider::Postgres(p) => sqlx::query(PROVIDER_SCHEMA).execute(p).await.map(drop),
            EmailProvider::Sqlite(p) => sqlx::query(PROVIDER_SCHEMA).execute(p).await.map(drop),
        }
    }

    async fn send(&self, key: &IdempotencyKey, order_id: &str, kind: &str) -> Result<(), HandlerError> {
        let (key, order_id) = (key.as_str(), order_id);
        match self {
            EmailProvider::Postgres(p) => sqlx::query(PROVIDER_SEND)
                .bind(key)
                .bind(order_id)
                .bind(kind)
                .execute(p)
                .await
                .map(drop),
            EmailProvider::Sqlite(p) => sqlx::query(PROVIDER_SEND)
                .bind(key)
                .bind(order_id)
                .bind(kind)
                .execute(p)
                .await
                .map(drop),
        }
        .map_err(HandlerError::transient)
    }

    /// Reads what the provider saw.
    pub async fn tally(&self) -> sqlx::Result<ProviderTally> {
        let (sent, calls, duplicated): (i64, i64, i64) = match self {
            EmailProvider::Postgres(p) => sqlx::query_as(PROVIDER_TALLY).fetch_one(p).await?,
            EmailProvider::Sqlite(p) => sqlx::query_as(PROVIDER_TALLY).fetch_one(p).await?,
        };
        Ok(ProviderTally {
            sent,
            calls,
            duplicated,
        })
    }
}

macro_rules! for_both_databases {
    ($($body:tt)*) => {
        mod on_postgres {
            #[allow(unused_imports)]
            use super::*;
            type Db = sqlx::Postgres;
            $($body)*
        }
        mod on_sqlite {
            #[allow(unused_imports)]
            use super::*;
            type Db = sqlx::Sqlite;
            $($body)*
        }
    };
}

for_both_databases! {
    /// Records the order event's step for this consumer, and a violation if
    /// it does not come after the last step this consumer saw for the order.
    async fn check_order(ctx: &mut Context<'_, Db>) -> Result<(), HandlerError> {
        let event: AnyOrderEvent = serde_json::from_slice(&ctx.envelope().payload).map_err(HandlerError::permanent)?;
        let consumer = ctx.consumer().to_owned();
        let last: Option<i64> =
            sqlx::query_scalar("SELECT last_step FROM order_progress WHERE consumer = $1 AND order_id = $2")
                .bind(&consumer)
                .bind(&event.order_id)
                .fetch_optional(ctx.tx())
                .await?;
        if let Some(last) = last.filter(|&last| event.step <= last) {
            tracing::error!(consumer, order_id = %event.order_id, step = event.step, last, "order violation");
            sqlx::query("INSERT INTO order_violations (consumer, order_id, step, last_step) VALUES ($1, $2, $3, $4)")
                .bind(&consumer)
                .bind(&event.order_id)
                .bind(event.step)
                .bind(last)
                .execute(ctx.tx())
                .await?;
        }
        sqlx::query(
            "INSERT INTO order_progress (consumer, order_id, last_step) VALUES ($1, $2, $3)
             ON CONFLICT (consumer, order_id) DO UPDATE SET last_step = excluded.last_step
             WHERE order_progress.last_step < excluded.last_step",
        )
        .bind(&consumer)
        .bind(&event.order_id)
        .bind(event.step)
        .execute(ctx.tx())
        .await?;
        Ok(())
    }

    /// Moves the order to `status`, counts one more event, returns (step, total).
    async fn advance(ctx: &mut Context<'_, Db>, order_id: &str, status: &str) -> Result<(i64, i64), HandlerError> {
        let row: Option<(i64, i64)> = sqlx::query_as(
            "UPDATE checkout_orders SET status = $2, events = events + 1 WHERE order_id = $1
             RETURNING events, total_cents",
        )
        .bind(order_id)
        .bind(status)
        .fetch_optional(ctx.tx())
        .await?;
        row.ok_or_else(|| HandlerError::permanent(format!("unknown order {order_id}")))
    }

    #[async_trait::async_trait]
    impl Handler<Db> for Checkout {
        async fn handle(&self, ctx: &mut Context<'_, Db>) -> Result<(), HandlerError> {
            let message_type = ctx.envelope().message_type.clone();
            match message_type.as_str() {
                "PlaceOrder" => {
                    let c: PlaceOrder = ctx.decode()?;
                    sqlx::query(
                        "INSERT INTO checkout_orders (order_id, customer_id, sku, quantity, total_cents, status, events)
                         VALUES ($1, $2, $3, $4, $5, 'placed', 1)",
                    )
                    .bind(&c.order_id)
                    .bind(&c.customer_id)
                    .bind(&c.sku)
                    .bind(i64::from(c.quantity))
                    .bind(c.total_cents)
                    .execute(ctx.tx())
                    .await?;
                    ctx.emit(&OrderPlaced {
                        order_id: c.order_id,
                        customer_email: Some(format!("{}@customers.example", c.customer_id)),
                        customer_id: c.customer_id,
                        sku: c.sku,
                        quantity: c.quantity,
                        total_cents: c.total_cents,
                        step: 1,
                    })
                    .await
                }
                "CapturePayment" => {
                    let c: CapturePayment = ctx.decode()?;
                    let (step, total) = advance(ctx, &c.order_id, "paid").await?;
                    ctx.emit(&PaymentCaptured { order_id: c.order_id, amount_cents: total, step }).await
                }
                "ShipOrder" => {
                    let c: ShipOrder = ctx.decode()?;
                    let (step, _) = advance(ctx, &c.order_id, "shipped").await?;
                    ctx.emit(&OrderShipped { order_id: c.order_id, step }).await
                }
                "CancelOrder" => {
                    let c: CancelOrder = ctx.decode()?;
                    let (step, _) = advance(ctx, &c.order_id, "cancelled").await?;
                    ctx.emit(&OrderCancelled { order_id: c.order_id, step }).await
                }
                other => Err(HandlerError::permanent(format!("checkout does not handle {other}"))),
            }
        }
    }

    #[async_trait::async_trait]
    impl Handler<Db> for Inventory {
        async fn handle(&self, ctx: &mut Context<'_, Db>) -> Result<(), HandlerError> {
            let message_type = ctx.envelope().message_type.clone();
            let order_id = ctx.envelope().aggregate_key.clone();
            match message_type.as_str() {
                "OrderPlaced" => {
                    let e: OrderPlaced = ctx.decode()?;
                    if e.sku.starts_with("POISON") && !self.warehouse_fixed {
                        // Looks transient, never heals: retried, then dead-lettered.
                        return Err(HandlerError::transient(format!("warehouse rejected sku {}", e.sku)));
                    }
                    sqlx::query(
                        "INSERT INTO inventory_reservations (order_id, sku, quantity, status) VALUES ($1, $2, $3, 'reserved')",
                    )
                    .bind(&e.order_id)
                    .bind(&e.sku)
                    .bind(i64::from(e.quantity))
                    .execute(ctx.tx())
                    .await?;
                }
                "OrderShipped" | "OrderCancelled" => {
                    let status = if message_type == "OrderShipped" { "shipped" } else { "released" };
                    sqlx::query("UPDATE inventory_reservations SET status = $2 WHERE order_id = $1")
                        .bind(&order_id)
                        .bind(status)
                        .execute(ctx.tx())
                        .await?;
                }
                _ => {}
            }
            check_order(ctx).await
        }
    }

    #[async_trait::async_trait]
    impl Handler<Db> for Email {
        async fn handle(&self, ctx: &mut Context<'_, Db>) -> Result<(), HandlerError> {
            let message_type = ctx.envelope().message_type.clone();
            let order_id = ctx.envelope().aggregate_key.clone();
            let kind = match message_type.as_str() {
                "OrderPlaced" => Some("order-confirmation"),
                "OrderShipped" => Some("shipping-notice"),
                _ => None,
            };
            if let Some(kind) = kind {
                let provider = &self.provider;
                ctx.once(kind, |key| async move { provider.send(&key, &order_id, kind).await }).await?;
            }
            check_order(ctx).await
        }
    }

    #[async_trait::async_trait]
    impl Handler<Db> for Analytics {
        async fn handle(&self, ctx: &mut Context<'_, Db>) -> Result<(), HandlerError> {
            let message_type = ctx.envelope().message_type.clone();
            sqlx::query(
                "INSERT INTO analytics_counts (message_type, n) VALUES ($1, 1)
                 ON CONFLICT (message_type) DO UPDATE SET n = analytics_counts.n + 1",
            )
            .bind(message_type)
            .execute(ctx.tx())
            .await?;
            check_order(ctx).await
        }
    }

    #[async_trait::async_trait]
    impl Handler<Db> for Loyalty {
        async fn handle(&self, ctx: &mut Context<'_, Db>) -> Result<(), HandlerError> {
            let message_type = ctx.envelope().message_type.clone();
            let order_id = ctx.envelope().aggregate_key.clone();
            match message_type.as_str() {
                "OrderPlaced" => {
                    let e: OrderPlaced = ctx.decode()?;
                    sqlx::query("INSERT INTO loyalty_pending (order_id, customer_id, points) VALUES ($1, $2, $3)")
                        .bind(&e.order_id)
                        .bind(&e.customer_id)
                        .bind(e.total_cents / 100)
                        .execute(ctx.tx())
                        .await?;
                }
                "OrderShipped" => {
                    let pending: Option<(String, i64)> =
                        sqlx::query_as("DELETE FROM loyalty_pending WHERE order_id = $1 RETURNING customer_id, points")
                            .bind(&order_id)
                            .fetch_optional(ctx.tx())
                            .await?;
                    if let Some((customer, points)) = pending {
                        sqlx::query(
                            "INSERT INTO loyalty_points (customer_id, points) VALUES ($1, $2)
                             ON CONFLICT (customer_id) DO UPDATE SET points = loyalty_points.points + excluded.points",
                        )
                        .bind(customer)
                        .bind(points)
                        .execute(ctx.tx())
                        .await?;
                    }
                }
                "OrderCancelled" => {
                    sqlx::query("DELETE FROM loyalty_pending WHERE order_id = $1").bind(&order_id).execute(ctx.tx()).await?;
                }
                _ => {}
            }
            check_order(ctx).await
        }
    }
}
