use tidings_core::Message;

#[derive(Message)]
#[message(event, name = "order.place", topic = "orders", aggregate = "order")]
struct OrderPlaced {
    #[message(key)]
    order_id: String,
}

fn main() {}
