//! Versions of one event over the store: an older version upcast, an
//! unreadable one dead-lettered, and dual publishing feeding each
//! version's consumers once.

use std::sync::Arc;
use std::time::Duration;

use tidings_consumer::{Consumer, Handler};
use tidings_core::{DeadLetterFilter, Envelope, FailureStore, Kind};

use super::fixtures::{Pipeline, StoreExt, TOPIC, eventually, quick, setup, subscriber};
use crate::services::TestDb;

const WAIT: Duration = Duration::from_secs(30);

/// Version 1 of a customer event: one `name`.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct CustomerRegisteredV1 {
    customer_id: String,
    name: String,
}

impl tidings_core::Message for CustomerRegisteredV1 {
    const TYPE: &'static str = "CustomerRegistered";
    const VERSION: u32 = 1;
    const KIND: Kind = Kind::Event;
    const AGGREGATE: &'static str = "customer";
    const TOPIC: &'static str = TOPIC;
    fn key(&self) -> String {
        self.customer_id.clone()
    }
}

/// Version 2 split the name; its upcaster reads version 1.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
struct CustomerRegistered {
    customer_id: String,
    first_name: String,
    last_name: String,
}

impl tidings_core::Message for CustomerRegistered {
    const TYPE: &'static str = "CustomerRegistered";
    const VERSION: u32 = 2;
    const KIND: Kind = Kind::Event;
    const AGGREGATE: &'static str = "customer";
    // A breaking change gets a topic of its own (see the dual-publishing test).
    const TOPIC: &'static str = "test.events.v2";
    fn key(&self) -> String {
        self.customer_id.clone()
    }

    fn upcast(version: u32, mut payload: serde_json::Value) -> Result<serde_json::Value, String> {
        match version {
            1 => {
                let name = payload["name"]
                    .as_str()
                    .ok_or("a v1 payload without a name")?
                    .to_owned();
                let (first, last) = name.split_once(' ').unwrap_or((&name, ""));
                payload["first_name"] = first.into();
                payload["last_name"] = last.into();
                Ok(payload)
            }
            _ => Err(format!("no upcaster from version {version}")),
        }
    }
}

impl tidings_core::transition::Transition for CustomerRegistered {
    type Previous = CustomerRegisteredV1;
    fn previous(&self) -> CustomerRegisteredV1 {
        CustomerRegisteredV1 {
            customer_id: self.customer_id.clone(),
            name: format!("{} {}", self.first_name, self.last_name),
        }
    }
}

/// A consumer written against one version, `M`.
#[derive(Debug)]
struct Reads<M> {
    seen: Arc<std::sync::Mutex<Vec<M>>>,
}

impl<M> Clone for Reads<M> {
    fn clone(&self) -> Self {
        Reads {
            seen: self.seen.clone(),
        }
    }
}

impl<M> Default for Reads<M> {
    fn default() -> Self {
        Reads { seen: Arc::default() }
    }
}

#[async_trait::async_trait]
impl<DB: sqlx::Database, M: tidings_core::Message + std::fmt::Debug> Handler<DB> for Reads<M> {
    async fn handle(
        &self,
        ctx: &mut tidings_consumer::Context<'_, DB>,
    ) -> Result<(), tidings_consumer::HandlerError> {
        let event: M = ctx.decode()?;
        self.seen.lock().unwrap().push(event);
        Ok(())
    }
}

type ReadsV2 = Reads<CustomerRegistered>;

/// During a transition both versions are published in one transaction; each
/// version's consumer gets its copies once.
pub async fn dual_publishing_feeds_each_version_once<T: TestDb>(db: &T) {
    let store = setup(db).await;
    use tidings_core::transition::{DUAL_OF_HEADER, DualPublish, outgoing};
    let registration = |n: u32| CustomerRegistered {
        customer_id: format!("c-{n}"),
        first_name: "Ada".into(),
        last_name: format!("Lovelace {n}"),
    };
    // During the transition: both versions, in one transaction.
    let dual = DualPublish::new().during::<CustomerRegistered>();
    for n in 1..=3 {
        let out = outgoing("crm", &registration(n), &dual).unwrap();
        assert_eq!(out.len(), 2);
        assert_eq!(
            out[1].envelope.headers[DUAL_OF_HEADER],
            out[0].envelope.id.to_string()
        );
        assert_eq!(out[1].envelope.correlation_id, out[0].envelope.correlation_id);
        store.enqueue_all(&out).await;
    }
    // Transition over: the new version only.
    let out = outgoing("crm", &registration(4), &DualPublish::parse("").unwrap()).unwrap();
    assert_eq!(out.len(), 1);
    store.enqueue_in_tx(&out[0], true).await;

    let (legacy, modern) = (Reads::<CustomerRegisteredV1>::default(), ReadsV2::default());
    let old_consumer = Consumer::new("crm-legacy", store.clone(), legacy.clone())
        .topic(<CustomerRegisteredV1 as tidings_core::Message>::TOPIC)
        .config(quick());
    let new_consumer = Consumer::new("crm-modern", store.clone(), modern.clone())
        .topic(<CustomerRegistered as tidings_core::Message>::TOPIC)
        .config(quick());
    let (old_stats, new_stats) = (old_consumer.stats(), new_consumer.stats());
    let pipeline = Pipeline::start(&store, new_consumer, subscriber(&store));
    let old_task = tokio::spawn({
        let (stop, subscriber) = (pipeline.stop.clone(), subscriber(&store));
        async move { old_consumer.run(&subscriber, stop).await.unwrap() }
    });
    eventually(WAIT, "each version's consumer handled its copies", || async {
        old_stats.handled() == 3 && new_stats.handled() == 4
    })
    .await;
    // Nothing more arrives for either.
    tokio::time::sleep(Duration::from_millis(300)).await;
    pipeline.stop().await;
    old_task.await.unwrap();

    let mut old_seen: Vec<String> = legacy
        .seen
        .lock()
        .unwrap()
        .iter()
        .map(|e| e.name.clone())
        .collect();
    old_seen.sort();
    assert_eq!(old_seen, ["Ada Lovelace 1", "Ada Lovelace 2", "Ada Lovelace 3"]);
    let mut new_seen: Vec<String> = modern
        .seen
        .lock()
        .unwrap()
        .iter()
        .map(|e| e.customer_id.clone())
        .collect();
    new_seen.sort();
    assert_eq!(new_seen, ["c-1", "c-2", "c-3", "c-4"]);
    assert_eq!((old_stats.dead_lettered(), new_stats.dead_lettered()), (0, 0));
    assert_eq!(
        (old_stats.handled(), new_stats.handled()),
        (3, 4),
        "each copy handled once"
    );
}

/// A consumer of version 2 reads version 1 upcast and version 2 with an unknown
/// field; a version it cannot read, or one its upcaster refuses, is dead-lettered.
pub async fn an_older_version_is_upcast_and_an_unreadable_one_dead_lettered<T: TestDb>(db: &T) {
    let store = setup(db).await;
    let out = |envelope: Envelope| tidings_core::OutgoingMessage {
        topic: TOPIC.to_owned(),
        envelope,
    };
    let v1 = Envelope::new(
        "crm",
        &CustomerRegisteredV1 {
            customer_id: "c-1".into(),
            name: "Ada Lovelace".into(),
        },
    )
    .unwrap();
    // Version 2 from a newer producer that already added a field: tolerated.
    let mut v2 = Envelope::new(
        "crm",
        &CustomerRegistered {
            customer_id: "c-2".into(),
            first_name: "Grace".into(),
            last_name: "Hopper".into(),
        },
    )
    .unwrap();
    v2.payload = br#"{"customer_id":"c-2","first_name":"Grace","last_name":"Hopper","tier":"gold"}"#.to_vec();
    // A version this consumer cannot read yet, and a v1 its upcaster refuses.
    let mut v3 = Envelope::new(
        "crm",
        &CustomerRegistered {
            customer_id: "c-3".into(),
            first_name: "Edsger".into(),
            last_name: "Dijkstra".into(),
        },
    )
    .unwrap();
    v3.version = 3;
    let mut nameless = Envelope::new(
        "crm",
        &CustomerRegisteredV1 {
            customer_id: "c-4".into(),
            name: String::new(),
        },
    )
    .unwrap();
    nameless.payload = br#"{"customer_id":"c-4"}"#.to_vec();
    for envelope in [v1, v2, v3.clone(), nameless.clone()] {
        store.enqueue_in_tx(&out(envelope), true).await;
    }

    let reader = ReadsV2::default();
    let consumer = Consumer::new("crm-v2", store.clone(), reader.clone())
        .topic(TOPIC)
        .config(quick());
    let stats = consumer.stats();
    let pipeline = Pipeline::start(&store, consumer, subscriber(&store));
    eventually(WAIT, "two handled and two dead-lettered", || async {
        stats.handled() == 2 && stats.dead_lettered() == 2
    })
    .await;
    pipeline.stop().await;

    let mut seen = reader.seen.lock().unwrap().clone();
    seen.sort_by(|a, b| a.customer_id.cmp(&b.customer_id));
    assert_eq!(
        seen,
        vec![
            CustomerRegistered {
                customer_id: "c-1".into(),
                first_name: "Ada".into(),
                last_name: "Lovelace".into(),
            },
            CustomerRegistered {
                customer_id: "c-2".into(),
                first_name: "Grace".into(),
                last_name: "Hopper".into(),
            },
        ],
        "v1 upcast to v2, v2 with an unknown field read as is"
    );
    assert_eq!(stats.retries(), 0, "an unreadable version is permanent");
    let letters = store
        .dead_letters(&DeadLetterFilter::default().consumer("crm-v2"))
        .await
        .unwrap();
    let error_of = |id| {
        letters
            .iter()
            .find(|l| l.message_id == Some(id))
            .map(|l| l.errors[0].error.clone())
            .expect("dead-lettered")
    };
    assert!(
        error_of(v3.id).contains("CustomerRegistered version 3 is not supported (this code reads version 2)"),
        "{}",
        error_of(v3.id)
    );
    assert!(
        error_of(nameless.id).contains(
            "CustomerRegistered version 1 could not be upcast to version 2: a v1 payload without a name"
        ),
        "{}",
        error_of(nameless.id)
    );
}
