//! The five services of the checkout system, as Tidings handlers.
//!
//! Each handler is written once over the checkout's SQL table
//! ([`CheckoutSql`](crate::sql::CheckoutSql)) and implemented for every
//! database by `for_each_database!`.

use tidings_consumer::{Context, Handler, HandlerError};
use tidings_demo_kit::{ThirdParty, for_each_database};
use tidings_sql::db::Stmt;

use crate::messages::*;
use crate::sql::CheckoutDialect;

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
    /// The (simulated) email provider: its service `email`.
    pub provider: ThirdParty,
}

/// Counts events by type.
#[derive(Debug, Clone, Copy)]
pub struct Analytics;

/// Credits a point per whole currency unit when an order ships.
#[derive(Debug, Clone, Copy)]
pub struct Loyalty;

for_each_database! {
    use crate::sql::shared;

    /// Records the order event's step for this consumer, and a violation if
    /// it does not come after the last step this consumer saw for the order.
    async fn check_order(ctx: &mut Context<'_, Db>) -> Result<(), HandlerError> {
        let event: AnyOrderEvent = serde_json::from_slice(&ctx.envelope().payload).map_err(HandlerError::permanent)?;
        let consumer = ctx.consumer().to_owned();
        let last: Option<i64> = match Stmt::<D>::new(shared::LAST_STEP, "reading the order's last step")
            .bind(consumer.as_str())
            .bind(event.order_id.as_str())
            .fetch_optional(ctx.tx())
            .await?
        {
            Some(row) => Some(row.get(0)?),
            None => None,
        };
        if let Some(last) = last.filter(|&last| event.step <= last) {
            tracing::error!(consumer, order_id = %event.order_id, step = event.step, last, "order violation");
            Stmt::<D>::new(shared::VIOLATION, "recording an order violation")
                .bind(consumer.as_str())
                .bind(event.order_id.as_str())
                .bind(event.step)
                .bind(last)
                .execute(ctx.tx())
                .await?;
        }
        Stmt::<D>::new(D::CHECKOUT.progress, "recording the order's progress")
            .bind(consumer.as_str())
            .bind(event.order_id.as_str())
            .bind(event.step)
            .execute(ctx.tx())
            .await?;
        Ok(())
    }

    /// Moves the order to `status`, counts one more event, returns (step, total).
    async fn advance(ctx: &mut Context<'_, Db>, order_id: &str, status: &str) -> Result<(i64, i64), HandlerError> {
        Stmt::<D>::new(shared::ADVANCE, "moving the order on")
            .bind(order_id)
            .bind(status)
            .execute(ctx.tx())
            .await?;
        let row = Stmt::<D>::new(shared::ORDER_FIGURES, "reading the order")
            .bind(order_id)
            .fetch_optional(ctx.tx())
            .await?
            .ok_or_else(|| HandlerError::permanent(format!("unknown order {order_id}")))?;
        Ok((row.get(0)?, row.get(1)?))
    }

    #[async_trait::async_trait]
    impl Handler<Db> for Checkout {
        async fn handle(&self, ctx: &mut Context<'_, Db>) -> Result<(), HandlerError> {
            let message_type = ctx.envelope().message_type.clone();
            match message_type.as_str() {
                "PlaceOrder" => {
                    let c: PlaceOrder = ctx.decode()?;
                    Stmt::<D>::new(shared::PLACE, "recording the order")
                        .bind(c.order_id.as_str())
                        .bind(c.customer_id.as_str())
                        .bind(c.sku.as_str())
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
                    Stmt::<D>::new(shared::RESERVE, "reserving stock")
                        .bind(e.order_id.as_str())
                        .bind(e.sku.as_str())
                        .bind(i64::from(e.quantity))
                        .execute(ctx.tx())
                        .await?;
                }
                "OrderShipped" | "OrderCancelled" => {
                    let status = if message_type == "OrderShipped" { "shipped" } else { "released" };
                    Stmt::<D>::new(shared::RESERVATION_STATUS, "settling the reservation")
                        .bind(order_id.as_str())
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
                ctx.once(kind, |key| async move {
                    provider.call(key.as_str(), &order_id, kind).await.map_err(HandlerError::transient)
                })
                .await?;
            }
            check_order(ctx).await
        }
    }

    #[async_trait::async_trait]
    impl Handler<Db> for Analytics {
        async fn handle(&self, ctx: &mut Context<'_, Db>) -> Result<(), HandlerError> {
            let message_type = ctx.envelope().message_type.clone();
            Stmt::<D>::new(D::CHECKOUT.count_event, "counting an event")
                .bind(message_type.as_str())
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
                    Stmt::<D>::new(shared::PEND_POINTS, "holding points until shipping")
                        .bind(e.order_id.as_str())
                        .bind(e.customer_id.as_str())
                        .bind(e.total_cents / 100)
                        .execute(ctx.tx())
                        .await?;
                }
                "OrderShipped" => {
                    let pending = Stmt::<D>::new(shared::PENDING_POINTS, "reading the points held")
                        .bind(order_id.as_str())
                        .fetch_optional(ctx.tx())
                        .await?;
                    if let Some(row) = pending {
                        let (customer, points): (String, i64) = (row.get(0)?, row.get(1)?);
                        let dropped = Stmt::<D>::new(shared::DROP_PENDING, "releasing the points held")
                            .bind(order_id.as_str())
                            .execute(ctx.tx())
                            .await?;
                        // Only the run that removed the pending points credits them.
                        if <D as tidings_sql::Dialect>::rows_affected(&dropped) == 1 {
                            Stmt::<D>::new(D::CHECKOUT.credit, "crediting points")
                                .bind(customer.as_str())
                                .bind(points)
                                .execute(ctx.tx())
                                .await?;
                        }
                    }
                }
                "OrderCancelled" => {
                    Stmt::<D>::new(shared::DROP_PENDING, "releasing the points held")
                        .bind(order_id.as_str())
                        .execute(ctx.tx())
                        .await?;
                }
                _ => {}
            }
            check_order(ctx).await
        }
    }
}
