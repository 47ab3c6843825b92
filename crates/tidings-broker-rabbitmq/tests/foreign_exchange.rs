//! A topic declared as another team's exchange is never declared by
//! Tidings: an exchange that does not exist is an error naming it, at the
//! group's first subscription, not a silent new exchange nobody writes to;
//! a passing one (the producer may not be deployed yet), so that a
//! consumer waits for it.

use tidings_broker_rabbitmq::{RabbitOptions, RabbitTransport};
use tidings_core::{ErrorClass, Subscriber};
use tidings_testkit::conformance::{fresh_group, fresh_topic};
use tidings_testkit::rabbitmq::amqp_url;

#[tokio::test]
async fn a_foreign_exchange_that_does_not_exist_is_named() {
    let url = amqp_url();
    let topic = fresh_topic();
    let missing = format!("nobody-declared-{}", topic);
    let options = RabbitOptions::default().foreign(&topic, &missing, "#");
    let rabbit = RabbitTransport::connect_with(&url, options)
        .await
        .unwrap_or_else(|e| panic!("RabbitMQ is not reachable (set AMQP_URL): {e}"));
    let group = fresh_group("missing");
    let err = rabbit
        .ensure_group(&group, &topic)
        .await
        .expect_err("a missing foreign exchange is refused");
    assert_eq!(err.class(), ErrorClass::Transient, "{err}");
    let message = err.to_string();
    assert!(
        message.contains(&missing),
        "the error names the exchange: {message}"
    );
    assert!(message.contains("does not exist"), "{message}");
    assert!(
        !rabbit.exchanges().contains(&missing),
        "the exchange was not declared: {:?}",
        rabbit.exchanges()
    );
    // The transport still works for everything else.
    rabbit
        .ensure_group(&group, "own-topic-after-a-refusal")
        .await
        .unwrap();
    rabbit
        .delete_group("own-topic-after-a-refusal", &group)
        .await
        .unwrap();
}
