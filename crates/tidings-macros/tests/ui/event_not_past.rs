use tidings_core::Message;

#[derive(Message)]
#[message(event, topic = "orders", aggregate = "order")]
struct PlaceOrder {
    #[message(key)]
    order_id: String,
}

fn main() {}
