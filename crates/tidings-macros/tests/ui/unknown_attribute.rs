use tidings_core::Message;

#[derive(Message)]
#[message(event, topic = "orders", aggregate = "order", partition = 3)]
struct OrderPlaced {
    #[message(key)]
    order_id: String,
}

#[derive(Message)]
#[message(event, topic = "orders", aggregate = "order")]
struct OrderShipped {
    #[message(key, skip)]
    order_id: String,
}

fn main() {}
