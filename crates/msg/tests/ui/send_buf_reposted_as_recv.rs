// A send buffer reposted on the receive queue.
use uroce_msg::{Endpoint, SendPool};

fn misuse(ep: &Endpoint, pool: &SendPool) {
    let buf = pool.try_alloc().unwrap();
    ep.release(buf);
}

fn main() {}
