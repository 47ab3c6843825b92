//! What the fuzz targets share.

use tidings_core::{Envelope, cloudevents};

/// Panics unless `envelope` comes back unchanged through binary mode's
/// headers and body and through structured JSON.
pub fn assert_round_trips(envelope: &Envelope) {
    for binding in [cloudevents::Binding::Standard, cloudevents::Binding::Kafka] {
        let (headers, body) = cloudevents::to_binary(envelope, binding);
        let pairs = headers.iter().map(|(k, v)| (k.as_str(), v.as_str()));
        let again = cloudevents::from_binary(pairs, &body).expect("Tidings' own binary mode decodes");
        assert!(
            again == *envelope,
            "binary mode ({binding:?}) changed {envelope:?} into {again:?}"
        );
    }

    let json = cloudevents::to_json(envelope);
    let again = cloudevents::from_json(&json).expect("Tidings' own JSON decodes");
    assert!(
        again == *envelope,
        "structured mode changed {envelope:?} into {again:?}"
    );
}
