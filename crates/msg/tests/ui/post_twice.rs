// One buffer posted twice.
use uroce_msg::{Endpoint, SendPool};

fn misuse(ep: &Endpoint, pool: &SendPool) {
    let buf = pool.try_alloc().unwrap();
    let _ = ep.try_send(buf);
    let _ = ep.try_send(buf);
}

fn main() {}
