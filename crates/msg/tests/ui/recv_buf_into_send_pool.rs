// A received buffer handed to the send pool.
use uroce_msg::{Endpoint, SendPool};

fn misuse(ep: &Endpoint, pool: &SendPool) {
    let mut msg = ep.try_recv().unwrap();
    let frag = msg.fragments_mut().first_mut().unwrap();
    let buf = std::mem::replace(frag, todo!());
    pool.give_back(buf);
}

fn main() {}
