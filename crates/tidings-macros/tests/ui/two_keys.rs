use tidings_core::Message;

#[derive(Message)]
#[message(event, topic = "orders", aggregate = "order")]
struct OrderPlaced {
    #[message(key)]
    order_id: String,
    #[message(key)]
    customer_id: String,
}

fn main() {}
