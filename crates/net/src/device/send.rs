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
    // Singles are gathered (in order) and sent in batches of at most SINGLES, so nothing
    // here allocates: the data path sends with no allocation.
    let mut singles = [(0usize, 0usize, SocketAddr::from(([0, 0, 0, 0], 0))); SINGLES];
    let mut n = 0;
    for piece in plan_runs(pkts) {
        match piece {
            Piece::Train {
                start,
                end,
                seg_len,
                dst,
            } => {
                send_singles(sock, tx, singles.get(..n).unwrap_or_default());
                n = 0;
                if let Some(run) = tx.get_mut(start..end) {
                    send_train_all(sock, SocketAddr::new(dst, port), run, seg_len);
                }
            }
            Piece::Single { start, len, dst } => {
                if n == SINGLES {
                    send_singles(sock, tx, &singles);
                    n = 0;
                }
                if let Some(slot) = singles.get_mut(n) {
                    *slot = (start, len, SocketAddr::new(dst, port));
                    n += 1;
                }
            }
        }
    }
    send_singles(sock, tx, singles.get(..n).unwrap_or_default());
}

/// Single packets sent in one `sendmmsg` batch at most (the socket layer's batch).
const SINGLES: usize = 64;

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
fn plan_runs(pkts: &[TxPacket]) -> Runs<'_> {
    Runs { pkts, i: 0, off: 0 }
}

/// The pieces of [`plan_runs`], one at a time.
struct Runs<'a> {
    pkts: &'a [TxPacket],
    /// The next packet.
    i: usize,
    /// Its offset in the buffer.
    off: usize,
}

impl Iterator for Runs<'_> {
    type Item = Piece;

    fn next(&mut self) -> Option<Piece> {
        let (pkts, i, off) = (self.pkts, self.i, self.off);
        let first = pkts.get(i)?;
        let len = first.len;
        let mut j = i + 1;
        let mut end = off + len;
        // Bounded by the packets left.
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
            self.off = end;
            self.i = j;
            Some(Piece::Train {
                start: off,
                end,
                seg_len: len,
                dst: first.dst,
            })
        } else {
            self.off = off + len;
            self.i = i + 1;
            Some(Piece::Single {
                start: off,
                len,
                dst: first.dst,
            })
        }
    }
}

/// Seals and sends the packets at `(offset, length, destination)` of `tx` in one batch
/// (at most [`SINGLES`]).
fn send_singles(sock: &mut RoceSocket, tx: &mut [u8], singles: &[(usize, usize, SocketAddr)]) {
    if singles.is_empty() {
        return;
    }
    for &(off, len, dst) in singles {
        if let Some(p) = tx.get_mut(off..off + len) {
            // A packet that cannot be sealed (impossible addresses) is not worth sending;
            // the engine retransmits it.
            let _ = sock.seal(dst, p);
        }
    }
    let empty = OutPacket {
        dst: SocketAddr::from(([0, 0, 0, 0], 0)),
        roce: &[],
    };
    let mut out = [empty; SINGLES];
    let mut n = 0;
    for (slot, &(off, len, dst)) in out.iter_mut().zip(singles) {
        if let Some(roce) = tx.get(off..off + len) {
            *slot = OutPacket { dst, roce };
            n += 1;
        }
    }
    let pkts = out.get(..n).unwrap_or_default();
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
            plan_runs(&pkts).collect::<Vec<_>>(),
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
        assert_eq!(plan_runs(&[]).next(), None);
    }
}
