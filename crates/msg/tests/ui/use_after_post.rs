// A buffer written after it was posted.
use uroce_msg::{Endpoint, SendPool};

fn misuse(ep: &Endpoint, pool: &SendPool) {
    let mut buf = pool.try_alloc().unwrap();
    buf.set_len(8);
    let _ = ep.try_send(buf);
    buf.bytes_mut().unwrap()[0] = 1;
}

fn main() {}
