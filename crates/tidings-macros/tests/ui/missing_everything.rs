use tidings_core::Message;

#[derive(Message)]
#[message(version = 2)]
struct OrderPlaced {
    order_id: String,
}

#[derive(Message)]
struct OrderShipped {
    #[message(key)]
    order_id: String,
}

fn main() {}
