//! A simulated payment provider with Stripe's habits: it signs each
//! delivery with the endpoint's secret, delivers events of one payment in
//! whatever order its queue has them (a refund before its capture), sends
//! some deliveries again (it did not see the answer in time), retries
//! those that failed, and now and then someone forges one.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use rand::Rng;
use rand::seq::SliceRandom;
use serde::Serialize;
use tidings_core::secret::Secret;
use tidings_inbox::signature::stripe_header;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use crate::stripe::{Charge, ChargeRefunded, Data, PaymentIntent, PaymentIntentSucceeded};

/// How the provider behaves.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Habits {
    /// Payments to make.
    pub payments: usize,
    /// Fraction of payments refunded (half of them in two partial refunds).
    pub refund_rate: f64,
    /// Fraction of deliveries sent a second time.
    pub redelivery_rate: f64,
    /// Fraction of deliveries someone forges a copy of (a changed amount,
    /// or another secret): each must be refused.
    pub forgery_rate: f64,
    /// Fraction of payments in a currency the ledger has no accounts for.
    pub poison_rate: f64,
    /// Deliveries in flight at once.
    pub concurrency: usize,
    /// Deliveries are shuffled within windows of this many: events of one
    /// payment arrive in any order.
    pub shuffle_window: usize,
}

impl Default for Habits {
    fn default() -> Self {
        Habits {
            payments: 500,
            refund_rate: 0.2,
            redelivery_rate: 0.1,
            forgery_rate: 0.02,
            poison_rate: 0.0,
            concurrency: 8,
            shuffle_window: 8,
        }
    }
}

/// What the provider did and saw: the truth the system is checked against.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ProviderReport {
    /// Payments made.
    pub payments: usize,
    /// Of which in a currency the ledger has no accounts for.
    pub poisoned_payments: usize,
    /// Distinct events (captures and refunds).
    pub events: usize,
    /// Payments with at least one refund.
    pub refunded_payments: usize,
    /// Refund events.
    pub refund_events: usize,
    /// Captured per currency.
    pub captured: BTreeMap<String, i64>,
    /// Refunded per currency.
    pub refunded: BTreeMap<String, i64>,
    /// Genuine deliveries posted, second sendings included (not retries).
    pub deliveries: u64,
    /// Deliveries sent a second time.
    pub redeliveries: u64,
    /// Payments whose refund was sent before their capture.
    pub refunds_before_capture: usize,
    /// Posts retried after an error or a 5xx answer.
    pub retries: u64,
    /// Genuine deliveries answered with a 4xx other than 408 and 429: given up.
    pub rejected: u64,
    /// Forged deliveries sent.
    pub forged: u64,
    /// Forged deliveries refused with 401.
    pub forged_refused: u64,
}

/// One delivery: a body, and whether it is a forgery (and how).
#[derive(Debug, Clone)]
struct Delivery {
    body: Arc<Vec<u8>>,
    forgery: Option<Forgery>,
    /// (payment index, is a refund): for counting refunds sent before their capture.
    of: (usize, bool),
}

#[derive(Debug, Clone, Copy)]
enum Forgery {
    /// The body changed after signing.
    Tampered,
    /// Signed with a secret that is not the endpoint's.
    WrongSecret,
}

/// A Stripe-like id: `prefix_` and 24 characters.
fn id(prefix: &str) -> String {
    format!("{prefix}_{}", &uuid::Uuid::new_v4().simple().to_string()[..24])
}

/// Makes the payments and delivers their events to `url` (the inbox's
/// `POST .../stripe`), signed with `secret`; `delivered` counts posts
/// answered, for progress.
pub async fn deliver(
    url: &str,
    secret: &Secret,
    habits: Habits,
    delivered: Arc<AtomicU64>,
) -> anyhow::Result<ProviderReport> {
    let mut report = ProviderReport {
        payments: habits.payments,
        ..ProviderReport::default()
    };
    let mut deliveries = Vec::new();
    let now = chrono::Utc::now().timestamp();
    {
        let mut rng = rand::rng();
        for i in 0..habits.payments {
            let poisoned = rng.random_bool(habits.poison_rate.clamp(0.0, 1.0));
            let currency = if poisoned {
                report.poisoned_payments += 1;
                // ISO 4217's code for testing: no ledger has accounts in it.
                "xts"
            } else {
                ["eur", "eur", "usd", "gbp"][rng.random_range(0..4)]
            };
            let amount: i64 = rng.random_range(500..50_000);
            let (intent, charge) = (id("pi"), id("ch"));
            let succeeded = PaymentIntentSucceeded {
                id: id("evt"),
                object: "event".into(),
                created: now,
                event_type: "payment_intent.succeeded".into(),
                livemode: false,
                data: Data {
                    object: PaymentIntent {
                        id: intent.clone(),
                        amount,
                        currency: currency.into(),
                        customer: Some(format!("cus_{:06}", rng.random_range(0..1000))),
                        latest_charge: Some(charge.clone()),
                        status: "succeeded".into(),
                    },
                },
            };
            deliveries.push(Delivery {
                body: Arc::new(serde_json::to_vec(&succeeded)?),
                forgery: None,
                of: (i, false),
            });
            report.events += 1;
            *report.captured.entry(currency.into()).or_default() += amount;
            if rng.random_bool(habits.refund_rate.clamp(0.0, 1.0)) {
                report.refunded_payments += 1;
                // Half the refunds in two steps: half, then the rest.
                let totals = if rng.random_bool(0.5) {
                    vec![amount / 2, amount]
                } else {
                    vec![rng.random_range(1..=amount)]
                };
                for (n, total) in totals.iter().enumerate() {
                    let refunded = ChargeRefunded {
                        id: id("evt"),
                        object: "event".into(),
                        created: now + 1 + n as i64,
                        event_type: "charge.refunded".into(),
                        livemode: false,
                        data: Data {
                            object: Charge {
                                id: charge.clone(),
                                payment_intent: intent.clone(),
                                amount,
                                amount_refunded: *total,
                                currency: currency.into(),
                            },
                        },
                    };
                    deliveries.push(Delivery {
                        body: Arc::new(serde_json::to_vec(&refunded)?),
                        forgery: None,
                        of: (i, true),
                    });
                    report.events += 1;
                    report.refund_events += 1;
                }
                *report.refunded.entry(currency.into()).or_default() += totals.last().copied().unwrap_or(0);
            }
        }
        // A queue, not a line: events of one payment come in any order.
        for window in deliveries.chunks_mut(habits.shuffle_window.max(1)) {
            window.shuffle(&mut rng);
        }
        let mut capture_sent = vec![false; habits.payments];
        let mut early = vec![false; habits.payments];
        for d in &deliveries {
            match d.of {
                (i, false) => capture_sent[i] = true,
                (i, true) if !capture_sent[i] => early[i] = true,
                _ => {}
            }
        }
        report.refunds_before_capture = early.iter().filter(|e| **e).count();
        // Sent again later (the first answer was not seen in time), and forged.
        let mut extra = Vec::new();
        for d in &deliveries {
            if rng.random_bool(habits.redelivery_rate.clamp(0.0, 1.0)) {
                extra.push(d.clone());
            }
            if rng.random_bool(habits.forgery_rate.clamp(0.0, 1.0)) {
                let forgery = if rng.random_bool(0.5) {
                    Forgery::Tampered
                } else {
                    Forgery::WrongSecret
                };
                extra.push(Delivery {
                    forgery: Some(forgery),
                    ..d.clone()
                });
            }
        }
        for d in extra {
            let at = rng.random_range(0..=deliveries.len());
            deliveries.insert(at, d);
        }
    }

    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()?;
    let wrong = Secret::new(format!("whsec_{}", uuid::Uuid::new_v4().simple()));
    let slots = Arc::new(Semaphore::new(habits.concurrency.max(1)));
    let mut posts = JoinSet::new();
    let (mut genuine, mut forged) = (0u64, 0u64);
    for d in deliveries {
        match d.forgery {
            Some(_) => forged += 1,
            None => genuine += 1,
        }
        let permit = slots.clone().acquire_owned().await?;
        let (client, url, secret, wrong, delivered) = (
            client.clone(),
            url.to_owned(),
            secret.clone(),
            wrong.clone(),
            delivered.clone(),
        );
        posts.spawn(async move {
            let outcome = post(&client, &url, &secret, &wrong, &d).await;
            delivered.fetch_add(1, Ordering::Relaxed);
            drop(permit);
            outcome
        });
        while let Some(done) = posts.try_join_next() {
            tally(&mut report, done??);
        }
    }
    while let Some(done) = posts.join_next().await {
        tally(&mut report, done??);
    }
    report.deliveries = genuine;
    report.redeliveries = genuine - report.events as u64;
    report.forged = forged;
    Ok(report)
}

/// How one delivery went.
#[derive(Debug, Clone, Copy, Default)]
struct Posted {
    retries: u64,
    rejected: bool,
    forged_refused: bool,
}

fn tally(report: &mut ProviderReport, posted: Posted) {
    report.retries += posted.retries;
    report.rejected += u64::from(posted.rejected);
    report.forged_refused += u64::from(posted.forged_refused);
}

/// Posts one delivery; a genuine one is retried (with backoff, as Stripe
/// does over days) until it is answered with anything but an error or a
/// 408, 429 or 5xx.
async fn post(
    client: &reqwest::Client,
    url: &str,
    secret: &Secret,
    wrong: &Secret,
    d: &Delivery,
) -> anyhow::Result<Posted> {
    let mut posted = Posted::default();
    let mut wait = Duration::from_millis(50);
    loop {
        let timestamp = chrono::Utc::now().timestamp();
        let (signature, body) = match d.forgery {
            None => (stripe_header(secret, timestamp, &d.body), d.body.to_vec()),
            Some(Forgery::WrongSecret) => (stripe_header(wrong, timestamp, &d.body), d.body.to_vec()),
            Some(Forgery::Tampered) => {
                let signature = stripe_header(secret, timestamp, &d.body);
                let tampered = String::from_utf8_lossy(&d.body).replacen("\"amount\":", "\"amount\":1", 1);
                (signature, tampered.into_bytes())
            }
        };
        let answer = client
            .post(url)
            .header("content-type", "application/json")
            .header("stripe-signature", signature)
            .body(body)
            .send()
            .await;
        let status = match answer {
            Ok(answer) => answer.status(),
            Err(e) if d.forgery.is_some() => return Err(e.into()),
            Err(e) => {
                tracing::debug!(error = %e, "delivery failed; retrying");
                posted.retries += 1;
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(Duration::from_secs(2));
                continue;
            }
        };
        if d.forgery.is_some() {
            posted.forged_refused = status == reqwest::StatusCode::UNAUTHORIZED;
            return Ok(posted);
        }
        if status.is_success() {
            return Ok(posted);
        }
        if status.is_server_error()
            || status == reqwest::StatusCode::REQUEST_TIMEOUT
            || status == reqwest::StatusCode::TOO_MANY_REQUESTS
        {
            posted.retries += 1;
            tokio::time::sleep(wait).await;
            wait = (wait * 2).min(Duration::from_secs(2));
            continue;
        }
        tracing::error!(%status, "the endpoint refused a genuine delivery");
        posted.rejected = true;
        return Ok(posted);
    }
}
