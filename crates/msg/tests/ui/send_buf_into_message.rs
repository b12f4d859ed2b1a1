// No conversion turns a send buffer into a receive buffer.
use uroce_msg::{RecvBuf, SendPool};

fn misuse(pool: &SendPool) {
    let buf = pool.try_alloc().unwrap();
    let _r: RecvBuf = buf.into();
}

fn main() {}
