use tidings_core::Message;

#[derive(Message)]
#[message(event, command, topic = "orders", aggregate = "order")]
struct OrderPlaced {
    #[message(key)]
    order_id: String,
}

#[derive(Message)]
#[message(event, topic = "orders", aggregate = "order", version = 0)]
struct OrderShipped {
    #[message(key)]
    order_id: String,
}

#[derive(Message)]
#[message(event, topic = "", aggregate = "order")]
struct OrderPaid {
    #[message(key)]
    order_id: String,
}

#[derive(Message)]
#[message(event, topic = "orders", topic = "more-orders", aggregate = "order")]
struct OrderCancelled {
    #[message(key)]
    order_id: String,
}

#[derive(Message)]
#[message(event, topic = "orders", aggregate = "order", key_fn = String::new)]
struct OrderReturned {
    #[message(key)]
    order_id: String,
}

fn main() {}
