use tidings_core::Message;

#[derive(Message)]
#[message(event, topic = "orders", aggregate = "order")]
struct OrderPlaced {
    order_id: String,
}

fn main() {}
