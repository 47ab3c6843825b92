use tidings_core::Message;

#[derive(Message)]
#[message(event, aggregate = "order")]
struct OrderPlaced {
    #[message(key)]
    order_id: String,
}

fn main() {}
