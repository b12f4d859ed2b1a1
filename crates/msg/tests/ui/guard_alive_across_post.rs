// An in-place guard kept across the post (a write into memory the transport reads).
use uroce_msg::{Endpoint, SendPool};

fn misuse(ep: &Endpoint, pool: &SendPool) {
    let mut buf = pool.try_alloc().unwrap();
    let mut bytes = buf.bytes_mut().unwrap();
    let _ = ep.try_send(buf);
    bytes[0] = 1;
}

fn main() {}
