//! Per-socket counters.
//!
//! [`Counters`] is shared (`Arc`) between the socket that updates it and whoever reports
//! on it (a stats thread, a CLI); every field is a relaxed atomic, so reading never blocks
//! the data path. [`Counters::snapshot`] copies them into a plain [`CounterSnapshot`]; the
//! fields are read one by one, so a snapshot taken while packets flow may mix values from
//! a few packets apart.

use std::sync::atomic::{AtomicU64, Ordering};

macro_rules! counters {
    ($( $(#[$doc:meta])* $name:ident ),* $(,)?) => {
        /// Live counters of one socket (see the module docs).
        #[derive(Debug, Default)]
        pub struct Counters {
            $( $(#[$doc])* pub(crate) $name: AtomicU64, )*
        }

        /// A copy of a socket's [`Counters`] at one moment.
        #[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Hash)]
        pub struct CounterSnapshot {
            $( $(#[$doc])* pub $name: u64, )*
        }

        impl Counters {
            /// Copies every counter.
            pub fn snapshot(&self) -> CounterSnapshot {
                CounterSnapshot {
                    $( $name: self.$name.load(Ordering::Relaxed), )*
                }
            }
        }

        impl CounterSnapshot {
            /// Every counter as `(name, value)`, in declaration order.
            pub fn fields(&self) -> impl Iterator<Item = (&'static str, u64)> {
                [$( (stringify!($name), self.$name), )*].into_iter()
            }

            /// The counters that grew from `earlier` to `self` (saturating at 0).
            #[must_use]
            pub fn since(&self, earlier: &CounterSnapshot) -> CounterSnapshot {
                CounterSnapshot {
                    $( $name: self.$name.saturating_sub(earlier.$name), )*
                }
            }
        }
    };
}

counters! {
    /// Datagrams the kernel accepted for sending (injected duplicates included,
    /// injected drops not).
    tx_packets,
    /// UDP payload bytes (BTH..ICRC) of `tx_packets`.
    tx_bytes,
    /// Datagrams read from the socket, whatever happened to them afterwards.
    rx_packets,
    /// UDP payload bytes of `rx_packets` (as far as they fitted the buffer).
    rx_bytes,
    /// Packets the kernel refused one by one (e.g. `EMSGSIZE`, unreachable); each was
    /// skipped, as a lossy network would.
    send_errors,
    /// Times a send stopped because the socket buffer was full (`EAGAIN` / `ENOBUFS`).
    eagain,
    /// Received datagrams longer than their buffer (`MSG_TRUNC`); dropped.
    truncated,
    /// Received packets whose ICRC matched the header for IPv4 Identification 0 with DF
    /// (a uroce peer's single datagram) or the IPv6 header: the fast path, one CRC.
    icrc_exact,
    /// Received IPv4 packets whose ICRC matched another Identification with DF set (the
    /// segments of a uroce peer's GSO train, a Linux Soft-RoCE peer); accepted.
    icrc_id_df,
    /// Received IPv4 packets whose ICRC matched some Identification with DF clear;
    /// accepted (not under [`crate::IcrcPolicy::Strict`]).
    icrc_id_no_df,
    /// Received packets whose ICRC matched no header the [`crate::IcrcPolicy`] accepts;
    /// dropped.
    bad_icrc,
    /// Received IPv4 packets whose ICRC matched no header but that were accepted anyway
    /// under [`crate::IcrcPolicy::AcceptUnverified`].
    unverified_icrc,
    /// Received packets whose ICRC could not be computed at all (shorter than a BTH and
    /// an ICRC, unusable addresses); dropped.
    icrc_unverifiable,
    /// Received packets with a good ICRC that are not valid RoCEv2 transport packets
    /// (`uroce_wire::PacketRepr::parse` failed); dropped.
    parse_errors,
    /// Received datagrams without a usable source address; dropped.
    bad_source,
    /// Outgoing packets the fault injector dropped.
    injected_drops,
    /// Outgoing packets the fault injector sent twice.
    injected_dups,
    /// Outgoing packets the fault injector held back to send later.
    injected_reorders,
    /// Outgoing packets in which the fault injector flipped a bit.
    injected_corruptions,
    /// Packets that could not be written to the packet capture.
    capture_errors,
}

impl Counters {
    /// Adds `n` to `counter`.
    pub(crate) fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }
}
