//! The packet parser, the ICRC Identification solver and the receive path's GRO splitting,
//! driven by fuzz inputs.

use uroce_socket::socket::gro_pieces;
use uroce_wire::icrc_ident::{identify, IdentSolver};
use uroce_wire::{icrc, PacketRepr};

use crate::input::Input;

/// `PacketRepr::parse`: what parses emits into bytes that parse to the same packet.
pub fn packet_parser(data: &[u8]) {
    if let Ok(p) = PacketRepr::parse(data) {
        let mut out = vec![0u8; p.buffer_len()];
        let n = p.emit(&mut out).expect("a parsed packet emits");
        let again = PacketRepr::parse(&out[..n]).expect("an emitted packet parses");
        assert_eq!(again, p, "parse → emit → parse is stable");
    }
}

/// The Identification solver: a 20-byte IPv4 header, an 8-byte UDP header and the rest
/// as BTH..ICRC. An Identification (and DF flag) it returns makes the ICRC check pass for
/// the header with them, checked by the plain ICRC verification.
pub fn icrc_ident(data: &[u8]) {
    let mut input = Input(data);
    let mut ip = [0u8; 20];
    ip.copy_from_slice(&{
        let b = input.bytes(20);
        let mut h = [0u8; 20];
        h[..b.len()].copy_from_slice(b);
        h
    });
    // IPv4 with a 20-byte header, UDP: what the solver is for.
    ip[0] = 0x45;
    ip[9] = 17;
    let mut udp = [0u8; 8];
    let b = input.bytes(8);
    udp[..b.len()].copy_from_slice(b);
    let roce = input.0;
    let mut solver = IdentSolver::new();
    if let Ok(Some(id)) = identify(&mut solver, &ip, &udp, roce) {
        let mut fixed = ip;
        fixed[4..6].copy_from_slice(&id.identification.to_be_bytes());
        fixed[6] = (fixed[6] & !0x40) | if id.dont_fragment { 0x40 } else { 0 };
        assert!(
            icrc::verify(&fixed, &udp, roce).is_ok(),
            "the solver's Identification {id:?} does not make the ICRC valid"
        );
    }
}

/// The receive path's splitting of a datagram into packets: the pieces start at 0, follow
/// each other without gap or overlap and stay inside the datagram; every piece but the
/// last is a whole segment; at most `room` pieces; an intact datagram with room enough is
/// covered whole by complete pieces.
pub fn gro_split(data: &[u8]) {
    let mut input = Input(data);
    let len = usize::from(input.u16());
    let seg = usize::from(input.u16());
    let segment = (seg != 0).then_some(seg);
    let flags = input.u8();
    let truncated = flags & 1 != 0;
    let room = usize::from(input.u8() % 80);
    let pieces = gro_pieces(len, segment, truncated, room);
    assert!(pieces.len() <= room, "{pieces:?} for room {room}");
    let mut next = 0;
    for (i, &(start, plen, complete)) in pieces.iter().enumerate() {
        assert_eq!(
            start, next,
            "piece {i} starts where the last ended: {pieces:?}"
        );
        next = start + plen;
        assert!(next <= len, "piece {i} beyond the datagram: {pieces:?}");
        if let Some(s) = segment.filter(|s| *s < len) {
            if complete && i + 1 < pieces.len() && pieces[i + 1].2 {
                assert_eq!(plen, s, "piece {i} of a coalesced datagram: {pieces:?}");
            }
        }
    }
    let whole_fits = match segment.filter(|s| *s > 0 && *s < len) {
        Some(s) => len.div_ceil(s) < room,
        None => room > 0,
    };
    if !truncated && whole_fits {
        assert_eq!(next, len, "an intact datagram is covered: {pieces:?}");
        assert!(pieces.iter().all(|p| p.2), "{pieces:?}");
    }
}
