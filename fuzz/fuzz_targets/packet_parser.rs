//! Fuzz target: every uroce-wire parser over arbitrary bytes.
//!
//! Run with `cargo fuzz run packet_parser` (nightly, or `RUSTC_BOOTSTRAP=1`) from `fuzz/`.
//! Beyond "never panics" it checks the round trip: whatever `PacketRepr::parse` accepts,
//! `emit` reproduces and `parse` reads back identically.
#![no_main]

use libfuzzer_sys::fuzz_target;
use uroce_wire::packet::icrc_on_wire;
use uroce_wire::{
    aeth, atomic_ack_eth, atomic_eth, bth, deth, ieth, immdt, mad, reth, xrceth, PacketRepr,
};

macro_rules! header {
    ($m:ident, $data:expr) => {
        if let Ok(h) = $m::Header::new_checked($data) {
            if let Ok(r) = $m::Repr::parse(&h) {
                let mut out = [0u8; $m::LEN];
                r.emit(&mut $m::Header::new_unchecked(&mut out[..]));
                let back = $m::Repr::parse(&$m::Header::new_unchecked(&out[..]));
                assert_eq!(back, Ok(r), "{} header round trip", stringify!($m));
            }
        }
    };
}

fuzz_target!(|data: &[u8]| {
    header!(bth, data);
    header!(reth, data);
    header!(aeth, data);
    header!(atomic_eth, data);
    header!(atomic_ack_eth, data);
    header!(immdt, data);
    header!(ieth, data);
    header!(deth, data);
    header!(xrceth, data);
    header!(mad, data);
    let _ = icrc_on_wire(data);

    if let Ok(packet) = PacketRepr::parse(data) {
        let _ = packet.to_string();
        assert_eq!(packet.buffer_len(), data.len());
        let mut out = vec![0u8; packet.buffer_len()];
        let n = packet
            .emit(&mut out)
            .expect("what parse accepts, emit accepts");
        assert_eq!(n, data.len());
        assert_eq!(PacketRepr::parse(&out), Ok(packet));
    }
});
