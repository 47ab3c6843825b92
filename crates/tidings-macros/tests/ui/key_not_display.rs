use serde::{Deserialize, Serialize};
use tidings_core::Message;

#[derive(Serialize, Deserialize)]
struct OrderId(u64);

#[derive(Serialize, Deserialize, Message)]
#[message(event, topic = "orders", aggregate = "order")]
struct OrderPlaced {
    #[message(key)]
    order_id: OrderId,
}

fn main() {}
