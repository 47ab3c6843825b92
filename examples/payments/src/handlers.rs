//! The three services of the payments system, as Tidings handlers.
//!
//! - [`Intake`] reads Stripe's deliveries and turns them into the
//!   system's own events, in each payment's order, whatever order Stripe
//!   delivered them in: a refund that arrives before its payment's capture
//!   waits in the payment's row and is emitted right after the capture.
//! - [`Ledger`] books each event as balanced double entries, each entry
//!   keyed by Stripe's event id, so that booking an event again (a replay
//!   after its processed marker is gone) books nothing.
//! - [`Notify`] sends the customer one receipt per payment and one notice
//!   per refund, through the effects ledger (`ctx.once`).

use tidings_consumer::{Context, Handler, HandlerError};
use tidings_demo_kit::{ThirdParty, check_step, for_each_database};
use tidings_sql::db::Stmt;

use crate::messages::*;
use crate::sql::PaymentsDialect;
use crate::stripe::{ChargeRefunded, PaymentIntentSucceeded};

/// Turns Stripe's deliveries into [`PaymentCaptured`] and [`PaymentRefunded`].
#[derive(Debug, Clone, Copy)]
pub struct Intake;

/// Books payments in a double-entry ledger.
#[derive(Debug, Clone, Copy)]
pub struct Ledger;

/// Sends receipts and refund notices through a (simulated) notification service.
#[derive(Debug, Clone)]
pub struct Notify {
    /// The notification service: the third party's service `notifications`.
    pub sender: ThirdParty,
}

/// The currencies the ledger has accounts for. A payment in another
/// currency is dead-lettered by the ledger, and the payment's later
/// events wait behind it, until its accounts exist and it is redriven.
pub const CURRENCIES: [&str; 3] = ["eur", "gbp", "usd"];

/// The ledger's accounts.
pub mod account {
    /// What the provider holds for the business (an asset: captures add, refunds take).
    pub const PROVIDER_BALANCE: &str = "provider_balance";
    /// Revenue (credited by captures).
    pub const SALES: &str = "sales";
    /// Refunds given (a contra-revenue account, debited by refunds).
    pub const REFUNDS: &str = "refunds";
}

/// The double entries of a payment event: (account, amount), summing to zero.
pub fn entries(event: &Booking) -> [(&'static str, i64); 2] {
    match event.kind {
        BookingKind::Capture => [
            (account::PROVIDER_BALANCE, event.amount_cents),
            (account::SALES, -event.amount_cents),
        ],
        BookingKind::Refund => [
            (account::REFUNDS, event.amount_cents),
            (account::PROVIDER_BALANCE, -event.amount_cents),
        ],
    }
}

/// A payment event as the ledger books it.
#[derive(Debug, Clone, PartialEq)]
pub struct Booking {
    /// Capture or refund.
    pub kind: BookingKind,
    /// The payment.
    pub payment_id: String,
    /// The amount.
    pub amount_cents: i64,
    /// The currency.
    pub currency: String,
    /// The provider's event, which keys the entries.
    pub provider_event_id: String,
    /// The payment's step.
    pub step: i64,
}

/// What a booking is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BookingKind {
    /// Money in.
    Capture,
    /// Money back.
    Refund,
}

impl Booking {
    fn of(ctx: &Context<'_, impl sqlx::Database>) -> Result<Booking, HandlerError> {
        let e = ctx.envelope();
        match e.message_type.as_str() {
            "PaymentCaptured" => {
                let c: PaymentCaptured =
                    serde_json::from_slice(&e.payload).map_err(HandlerError::permanent)?;
                Ok(Booking {
                    kind: BookingKind::Capture,
                    payment_id: c.payment_id,
                    amount_cents: c.amount_cents,
                    currency: c.currency,
                    provider_event_id: c.provider_event_id,
                    step: c.step,
                })
            }
            "PaymentRefunded" => {
                let r: PaymentRefunded =
                    serde_json::from_slice(&e.payload).map_err(HandlerError::permanent)?;
                Ok(Booking {
                    kind: BookingKind::Refund,
                    payment_id: r.payment_id,
                    amount_cents: r.amount_cents,
                    currency: r.currency,
                    provider_event_id: r.provider_event_id,
                    step: r.step,
                })
            }
            other => Err(HandlerError::permanent(format!("not a payment event: {other}"))),
        }
    }
}

/// A payment's row, read under its lock.
#[derive(Debug, Clone, Default)]
struct PaymentRow {
    captured: Option<i64>,
    refunded: i64,
    pending_refund: i64,
    pending_refund_event: Option<String>,
    refunds: i64,
}

for_each_database! {
    use crate::sql::shared;

    /// The payment's row, created if missing, locked until the handler's
    /// transaction ends: the capture and a refund of one payment arrive
    /// under different keys (the payment intent, the charge) and may be
    /// handled at once.
    async fn lock(ctx: &mut Context<'_, Db>, payment_id: &str) -> Result<PaymentRow, HandlerError> {
        Stmt::<D>::new(D::PAYMENTS.ensure_payment, "recording the payment")
            .bind(payment_id)
            .execute(ctx.tx())
            .await?;
        let row = Stmt::<D>::new(D::PAYMENTS.lock_payment, "reading the payment")
            .bind(payment_id)
            .fetch_one(ctx.tx())
            .await?;
        Ok(PaymentRow {
            captured: row.get(0)?,
            refunded: row.get(1)?,
            pending_refund: row.get(2)?,
            pending_refund_event: row.get(3)?,
            refunds: row.get(4)?,
        })
    }

    /// Emits the refund bringing the payment's refunded total to `total`.
    async fn refund(
        ctx: &mut Context<'_, Db>,
        payment: &PaymentRow,
        payment_id: &str,
        currency: &str,
        total: i64,
        provider_event_id: String,
    ) -> Result<(), HandlerError> {
        Stmt::<D>::new(shared::REFUND, "recording the refund")
            .bind(payment_id)
            .bind(total)
            .execute(ctx.tx())
            .await?;
        ctx.emit(&PaymentRefunded {
            payment_id: payment_id.to_owned(),
            amount_cents: total - payment.refunded,
            currency: currency.to_owned(),
            provider_event_id,
            step: step::REFUNDED + payment.refunds,
        })
        .await
    }

    #[async_trait::async_trait]
    impl Handler<Db> for Intake {
        async fn handle(&self, ctx: &mut Context<'_, Db>) -> Result<(), HandlerError> {
            let message_type = ctx.envelope().message_type.clone();
            match message_type.as_str() {
                "payment_intent.succeeded" => {
                    let e: PaymentIntentSucceeded = ctx.decode()?;
                    let intent = e.data.object;
                    let payment = lock(ctx, &intent.id).await?;
                    if payment.captured.is_some() {
                        // Captured already, by another event of the same payment.
                        return Ok(());
                    }
                    Stmt::<D>::new(shared::CAPTURE, "recording the capture")
                        .bind(intent.id.as_str())
                        .bind(intent.amount)
                        .bind(intent.currency.as_str())
                        .bind(e.id.as_str())
                        .execute(ctx.tx())
                        .await?;
                    ctx.emit(&PaymentCaptured {
                        payment_id: intent.id.clone(),
                        amount_cents: intent.amount,
                        currency: intent.currency.clone(),
                        customer_id: intent.customer,
                        provider_event_id: e.id,
                        step: step::CAPTURED,
                    })
                    .await?;
                    // A refund delivered before this capture follows it now.
                    if let Some(event) = payment.pending_refund_event.clone().filter(|_| payment.pending_refund > payment.refunded) {
                        refund(ctx, &payment, &intent.id, &intent.currency, payment.pending_refund, event).await?;
                    }
                    Ok(())
                }
                "charge.refunded" => {
                    let e: ChargeRefunded = ctx.decode()?;
                    let charge = e.data.object;
                    let payment = lock(ctx, &charge.payment_intent).await?;
                    if payment.captured.is_none() {
                        // Delivered before the capture: it waits for it.
                        Stmt::<D>::new(shared::PEND_REFUND, "keeping the refund for after the capture")
                            .bind(charge.payment_intent.as_str())
                            .bind(charge.amount_refunded)
                            .bind(e.id.as_str())
                            .execute(ctx.tx())
                            .await?;
                        return Ok(());
                    }
                    if charge.amount_refunded <= payment.refunded {
                        // An earlier refund delivered after a later one: the later
                        // one's total counted it already.
                        return Ok(());
                    }
                    refund(ctx, &payment, &charge.payment_intent, &charge.currency, charge.amount_refunded, e.id).await
                }
                other => Err(HandlerError::permanent(format!("the intake takes no Stripe event {other}"))),
            }
        }
    }

    #[async_trait::async_trait]
    impl Handler<Db> for Ledger {
        async fn handle(&self, ctx: &mut Context<'_, Db>) -> Result<(), HandlerError> {
            let booking = Booking::of(ctx)?;
            if !CURRENCIES.contains(&booking.currency.as_str()) {
                return Err(HandlerError::permanent(format!(
                    "the ledger has no accounts in {}: open them, then redrive",
                    booking.currency
                )));
            }
            for (account, amount) in entries(&booking) {
                let entry = format!("{}/{account}", booking.provider_event_id);
                let inserted = Stmt::<D>::new(D::PAYMENTS.entry, "booking an entry")
                    .bind(entry.as_str())
                    .bind(booking.payment_id.as_str())
                    .bind(account)
                    .bind(booking.currency.as_str())
                    .bind(amount)
                    .execute(ctx.tx())
                    .await?;
                // Only the booking that wrote the entry moves the balance.
                if <D as tidings_sql::Dialect>::rows_affected(&inserted) == 1 {
                    Stmt::<D>::new(D::PAYMENTS.balance, "moving a balance")
                        .bind(account)
                        .bind(booking.currency.as_str())
                        .bind(amount)
                        .execute(ctx.tx())
                        .await?;
                }
            }
            let consumer = ctx.consumer().to_owned();
            check_step::<D>(ctx.tx(), &consumer, &booking.payment_id, booking.step).await?;
            Ok(())
        }
    }

    #[async_trait::async_trait]
    impl Handler<Db> for Notify {
        async fn handle(&self, ctx: &mut Context<'_, Db>) -> Result<(), HandlerError> {
            let booking = Booking::of(ctx)?;
            let kind = match booking.kind {
                BookingKind::Capture => "receipt".to_owned(),
                BookingKind::Refund => format!("refund-notice-{}", booking.step),
            };
            let sender = &self.sender;
            let payment_id = booking.payment_id.clone();
            ctx.once("notify", |key| async move {
                sender.call(key.as_str(), &payment_id, &kind).await.map_err(HandlerError::transient)
            })
            .await?;
            let consumer = ctx.consumer().to_owned();
            check_step::<D>(ctx.tx(), &consumer, &booking.payment_id, booking.step).await?;
            Ok(())
        }
    }
}
