//! Sending a transmit buffer: runs of equal-length packets as GSO trains, the rest batched.

use super::*;

/// Sends the packets laid back to back in `tx` (length and destination of each in `pkts`)
/// in order, each to its own destination (UDP port `port`). Runs of at least two
/// equal-length packets to one destination (the last of a run may be shorter) go out as
/// trains, with UDP GSO where the socket can (one system call for up to 64 datagrams of
/// many packets each); other packets (ACKs, single-packet messages, datagrams to several
/// destinations) are batched into one `sendmmsg`. Every packet's ICRC is sealed for the
/// header the kernel gives it. A full socket buffer is retried briefly; packets that
/// still do not fit are left to the engines' retransmission.
pub(super) fn send_runs(sock: &mut RoceSocket, port: u16, tx: &mut [u8], pkts: &[TxPacket]) {
    let mut singles: Vec<(usize, usize, SocketAddr)> = Vec::new();
    for piece in plan_runs(pkts) {
        match piece {
            Piece::Train {
                start,
                end,
                seg_len,
                dst,
            } => {
                send_singles(sock, tx, &mut singles);
                if let Some(run) = tx.get_mut(start..end) {
                    send_train_all(sock, SocketAddr::new(dst, port), run, seg_len);
                }
            }
            Piece::Single { start, len, dst } => {
                singles.push((start, len, SocketAddr::new(dst, port)));
            }
        }
    }
    send_singles(sock, tx, &mut singles);
}

/// One part of a transmit batch as [`send_runs`] sends it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Piece {
    /// At least two packets to `dst` at `start..end` of the buffer, all `seg_len` bytes
    /// but the last, which may be shorter: one GSO train.
    Train {
        start: usize,
        end: usize,
        seg_len: usize,
        dst: IpAddr,
    },
    /// One packet (batched with the other singles into a `sendmmsg`).
    Single {
        start: usize,
        len: usize,
        dst: IpAddr,
    },
}

/// Splits the packets of a transmit batch (back to back, in order) into trains and
/// single packets: a train is a maximal run of equal-length packets to one destination,
/// optionally ended by one shorter packet to the same destination.
fn plan_runs(pkts: &[TxPacket]) -> Vec<Piece> {
    let mut out = Vec::new();
    let mut off = 0;
    let mut i = 0;
    // Bounded: every pass consumes at least one packet.
    while let Some(first) = pkts.get(i) {
        let len = first.len;
        let mut j = i + 1;
        let mut end = off + len;
        while let Some(next) = pkts.get(j) {
            if next.len > len || next.dst != first.dst {
                break;
            }
            end += next.len;
            j += 1;
            if next.len < len {
                break;
            }
        }
        if j - i >= 2 {
            out.push(Piece::Train {
                start: off,
                end,
                seg_len: len,
                dst: first.dst,
            });
            off = end;
            i = j;
        } else {
            out.push(Piece::Single {
                start: off,
                len,
                dst: first.dst,
            });
            off += len;
            i += 1;
        }
    }
    out
}

/// Seals and sends the packets at `(offset, length, destination)` of `tx` in one batch.
fn send_singles(
    sock: &mut RoceSocket,
    tx: &mut [u8],
    singles: &mut Vec<(usize, usize, SocketAddr)>,
) {
    if singles.is_empty() {
        return;
    }
    for &(off, len, dst) in singles.iter() {
        if let Some(p) = tx.get_mut(off..off + len) {
            // A packet that cannot be sealed (impossible addresses) is not worth sending;
            // the engine retransmits it.
            let _ = sock.seal(dst, p);
        }
    }
    let pkts: Vec<OutPacket<'_>> = singles
        .iter()
        .filter_map(|&(off, len, dst)| tx.get(off..off + len).map(|roce| OutPacket { dst, roce }))
        .collect();
    let mut done = 0;
    for _attempt in 0..8 {
        let Some(rest) = pkts.get(done..).filter(|r| !r.is_empty()) else {
            break;
        };
        match sock.send_batch(rest) {
            Ok(0) => {
                let _ = sock.wait_writable(Some(Duration::from_millis(1)));
            }
            Ok(n) => done += n,
            Err(_) => break,
        }
    }
    singles.clear();
}

/// `send_train` until everything is sent, the buffer stays full, or the socket fails.
fn send_train_all(sock: &mut RoceSocket, dst: SocketAddr, run: &mut [u8], seg_len: usize) {
    let mut done = 0;
    for _attempt in 0..8 {
        let Some(rest) = run.get_mut(done * seg_len..) else {
            return;
        };
        if rest.is_empty() {
            return;
        }
        match sock.send_train(dst, rest, seg_len) {
            Ok(n) => {
                done += n;
                if n == 0 {
                    let _ = sock.wait_writable(Some(Duration::from_millis(1)));
                }
            }
            Err(_) => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(len: usize, dst: &str) -> TxPacket {
        TxPacket {
            len,
            dst: dst.parse().unwrap(),
        }
    }

    /// Trains never mix destinations; packets to several destinations in a row are
    /// singles; a shorter last packet ends a train to its own destination only.
    #[test]
    fn runs_are_split_by_destination_and_length() {
        let (a, b) = ("127.0.0.2", "::1");
        let pkts = [
            p(100, a),
            p(100, a),
            p(60, a),
            p(100, b),
            p(100, b),
            p(100, a),
            p(30, b),
            p(100, b),
            p(40, a),
        ];
        let ip = |s: &str| -> IpAddr { s.parse().unwrap() };
        assert_eq!(
            plan_runs(&pkts),
            vec![
                Piece::Train {
                    start: 0,
                    end: 260,
                    seg_len: 100,
                    dst: ip(a)
                },
                Piece::Train {
                    start: 260,
                    end: 460,
                    seg_len: 100,
                    dst: ip(b)
                },
                Piece::Single {
                    start: 460,
                    len: 100,
                    dst: ip(a)
                },
                Piece::Single {
                    start: 560,
                    len: 30,
                    dst: ip(b)
                },
                Piece::Single {
                    start: 590,
                    len: 100,
                    dst: ip(b)
                },
                Piece::Single {
                    start: 690,
                    len: 40,
                    dst: ip(a)
                },
            ]
        );
        assert!(plan_runs(&[]).is_empty());
    }
}
