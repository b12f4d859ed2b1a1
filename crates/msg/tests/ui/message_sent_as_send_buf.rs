// A received message posted as a send (it would put a receive buffer into the send pool).
use uroce_msg::Endpoint;

fn misuse(ep: &Endpoint) {
    let msg = ep.try_recv().unwrap();
    let _ = ep.try_send(msg);
}

fn main() {}
