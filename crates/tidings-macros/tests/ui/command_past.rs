use tidings_core::Message;

#[derive(Message)]
#[message(command, topic = "checkout.commands", aggregate = "order")]
struct PlacedOrder {
    #[message(key)]
    order_id: String,
}

fn main() {}
