//! `docs/SCHEMAS.md`: event contracts, from the types to the registry, the
//! guard at publish, upcasting, the secrets lint and dual publishing.

/// A service's message types and its registry (sections 1 and 2): the doc's
/// `my_service`.
pub mod my_service {
    use schemars::JsonSchema;
    use serde::{Deserialize, Serialize};
    use tidings::Message;
    use tidings::schema::Registry;
    use tidings::schema::asyncapi::{Service, Topology};

    // snippet: schemas-types
    /// An order was placed.
    #[derive(Debug, Serialize, Deserialize, JsonSchema, Message)]
    #[message(event, topic = "orders", aggregate = "order")]
    pub struct OrderPlaced {
        #[message(key)]
        pub order_id: String,
        pub total_cents: i64,
        /// A copy of the customer's e-mail address; the customer service owns it.
        #[serde(default)]
        #[schemars(extend("x-tidings-denormalized" = true))]
        pub customer_email: Option<String>,
    }

    pub fn schemas() -> Registry {
        Registry::new().register::<OrderPlaced>().register::<PlaceOrder>()
    }
    // end snippet

    /// A customer asks for an order to be placed.
    #[derive(Debug, Serialize, Deserialize, JsonSchema, Message)]
    #[message(command, topic = "checkout.commands", aggregate = "order")]
    pub struct PlaceOrder {
        #[message(key)]
        pub order_id: String,
        pub sku: String,
    }

    /// Who sends and who receives each message, for the AsyncAPI document.
    pub fn topology() -> Topology {
        Topology::new("Shop", "1.0.0")
            .service(Service::new("web").sends::<PlaceOrder>())
            .service(
                Service::new("checkout")
                    .receives::<PlaceOrder>()
                    .sends::<OrderPlaced>(),
            )
    }
}

/// The service's schema binary (section 2).
pub mod bin {
    use super::my_service;

    // snippet: schemas-bin
    // src/bin/schemas.rs
    fn main() -> std::process::ExitCode {
        tidings::schema::command::main(my_service::schemas(), my_service::topology())
    }
    // end snippet

    /// What `cargo run --bin schemas -- check --dir schemas` runs.
    pub fn run() -> std::process::ExitCode {
        main()
    }
}

/// Validation at publish (section 3).
pub mod guard {
    use std::sync::Arc;

    use tidings::prelude::*;
    use tidings::schema::{Registry, SchemaGuard};
    use tidings::sql::StoreOptions;

    /// A PostgreSQL store whose outbox checks every message.
    pub async fn guarded_store(url: &str) -> Result<PgStore, Box<dyn std::error::Error>> {
        // snippet: schemas-guard
        let guard = SchemaGuard::new(&Registry::load("schemas")?)?;
        let store = PgStore::connect_with(url, StoreOptions::default().guard(Arc::new(guard))).await?;
        // end snippet
        Ok(store)
    }
}

/// Upcasting on read (section 4).
pub mod upcast {
    use serde::{Deserialize, Serialize};
    use serde_json::{Value, json};
    use tidings::Message;

    // snippet: schemas-upcast
    /// Version 2 split `name` into `first_name` and `last_name`.
    #[derive(Debug, Serialize, Deserialize, Message)]
    #[message(event, topic = "customers", aggregate = "customer", version = 2, upcast = upcast_customer)]
    pub struct CustomerRegistered {
        #[message(key)]
        pub customer_id: String,
        pub first_name: String,
        pub last_name: String,
    }

    fn upcast_customer(version: u32, mut payload: Value) -> Result<Value, String> {
        match version {
            1 => {
                let name = payload["name"].as_str().ok_or("v1 without a name")?.to_owned();
                let (first, last) = name.split_once(' ').unwrap_or((&name, ""));
                payload["first_name"] = json!(first);
                payload["last_name"] = json!(last);
                Ok(payload)
            }
            _ => Err(format!("no upcaster from version {version}")),
        }
    }
    // end snippet
}

/// The secrets lint's declared exception (section 5).
pub mod secrets {
    use schemars::JsonSchema;
    use serde::{Deserialize, Serialize};
    use tidings::Message;

    /// A payment was captured.
    #[derive(Debug, Serialize, Deserialize, JsonSchema, Message)]
    #[message(event, topic = "payments", aggregate = "payment")]
    pub struct PaymentCaptured {
        #[message(key)]
        pub payment_id: String,
        pub amount_cents: i64,
        // snippet: schemas-not-a-secret
        #[schemars(extend("x-tidings-not-a-secret" = "the provider's opaque charge reference"))]
        pub charge_token: String,
        // end snippet
    }
}

/// Dual publishing through a breaking change (section 6).
pub mod dual {
    use serde::{Deserialize, Serialize};
    use tidings::prelude::*;
    use tidings::transition::{DualPublish, Transition, outgoing};

    // snippet: schemas-transition
    /// Version 1, on the topic its consumers read.
    #[derive(Debug, Serialize, Deserialize, Message)]
    #[message(event, topic = "customers", aggregate = "customer")]
    #[message(name = "CustomerRegistered")]
    pub struct CustomerRegisteredV1 {
        #[message(key)]
        pub customer_id: String,
        pub name: String,
    }

    /// Version 2 split the name, on a topic of its own.
    #[derive(Debug, Serialize, Deserialize, Message)]
    #[message(event, topic = "customers.v2", aggregate = "customer", version = 2)]
    pub struct CustomerRegistered {
        #[message(key)]
        pub customer_id: String,
        pub first_name: String,
        pub last_name: String,
    }

    impl Transition for CustomerRegistered {
        type Previous = CustomerRegisteredV1;
        fn previous(&self) -> CustomerRegisteredV1 {
            CustomerRegisteredV1 {
                customer_id: self.customer_id.clone(),
                name: format!("{} {}", self.first_name, self.last_name),
            }
        }
    }
    // end snippet

    /// Writes `event`, and its v1 copy while in transition, in one transaction.
    pub async fn register(
        store: &PgStore,
        event: CustomerRegistered,
    ) -> Result<(), Box<dyn std::error::Error>> {
        let mut tx = store.pool().begin().await?;
        // snippet: schemas-dual-publish
        let dual = DualPublish::parse(&std::env::var("DUAL_PUBLISH").unwrap_or_default())?;
        for message in outgoing("crm", &event, &dual)? {
            store.enqueue_outgoing(&mut tx, &message).await?;
        }
        // end snippet
        store.commit(tx).await?;
        Ok(())
    }
}
