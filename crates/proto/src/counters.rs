//! The counters every transport engine keeps, one set for all (RC, UC, UD, XRC, GSI).
//!
//! Every packet handed to an engine's `handle_packet` counts in `packets_received`;
//! packets that are thrown away count in `dropped_packets` and in one of the `dropped_*`
//! causes. A field a transport has no use for stays 0 on its QPs. Each name is written
//! once, here: [`EngineCounters::fields`] lists them (for printing and publishing) and
//! [`EngineCounters::add`] sums them (a device's totals).

macro_rules! engine_counters {
    ($( $(#[$doc:meta])* $name:ident ),* $(,)?) => {
        /// Per-QP statistics of a transport engine (see the module documentation).
        #[derive(Debug, Default, Clone, PartialEq, Eq)]
        pub struct EngineCounters {
            $( $(#[$doc])* pub $name: u64, )*
        }

        impl EngineCounters {
            /// Every counter as `(name, value)`, in declaration order.
            pub fn fields(&self) -> Vec<(&'static str, u64)> {
                vec![$( (stringify!($name), self.$name), )*]
            }

            /// Adds `other` to these counters, field by field (wrapping never happens in
            /// practice: 2^64 packets).
            pub fn add(&mut self, other: &EngineCounters) {
                $( self.$name = self.$name.wrapping_add(other.$name); )*
            }
        }
    };
}

engine_counters! {
    /// Packets emitted by `poll_transmit`.
    packets_sent,
    /// Packets handed to `handle_packet`.
    packets_received,
    /// Request packets sent again (PSN already sent before).
    retransmitted_packets,
    /// Local ACK timeouts that led to a retry or to RETRY_EXC_ERR.
    timeouts,
    /// Go-back-N retries started (timeouts, sequence NAKs, implicit NAKs).
    retries,
    /// Retransmit timeouts that retransmitted without consuming a retry: they fired late
    /// (this process was not scheduled) or the peer had been heard from since the last one
    /// (see the RC engine's "Retry counting").
    timeouts_excused,
    /// Work requests completed with `RETRY_EXC_ERR`: the transport retries ran out.
    retry_exceeded,
    /// Work requests completed with `RNR_RETRY_EXC_ERR`: the RNR retries ran out.
    rnr_retry_exceeded,
    /// PSN sequence error NAKs we sent.
    seq_naks_sent,
    /// PSN sequence error NAKs we received.
    seq_naks_received,
    /// RNR NAKs we sent.
    rnr_naks_sent,
    /// RNR NAKs we received.
    rnr_naks_received,
    /// Other NAKs (invalid request, access, operational) we sent.
    error_naks_sent,
    /// Other NAKs we received.
    error_naks_received,
    /// ACKs (syndrome ACK) we sent.
    acks_sent,
    /// ACKs (syndrome ACK) we received.
    acks_received,
    /// READ response packets we sent.
    read_responses_sent,
    /// ATOMIC_ACKNOWLEDGE packets we sent.
    atomic_acks_sent,
    /// Implicit NAKs: an ACK or response beyond an unanswered READ/atomic.
    implicit_naks,
    /// Duplicate requests (responder) and late or duplicate responses (completer).
    duplicates_received,
    /// Packets thrown away, all causes.
    dropped_packets,
    /// … because the QP state does not accept them (or their DestQP is not the QP).
    dropped_wrong_state,
    /// … because the BTH P_Key does not match the QP's (IBA 10.9.3: the port's P_Key
    /// violation counter).
    dropped_bad_pkey,
    /// Connected transports (RC, UC, XRC): … because the packet's source address is not
    /// the QP's peer (the address vector's destination GID) or its destination address is
    /// not the QP's own (its source GID): a spoofed or misdirected packet with the right
    /// QPN, executed by nobody.
    dropped_bad_address,
    /// … because the opcode is not an RC opcode, or headers it needs are missing.
    dropped_bad_opcode,
    /// … out-of-sequence requests after the sequence NAK was sent.
    dropped_out_of_sequence,
    /// … responses, ACKs or NAKs for PSNs nothing is waiting for.
    dropped_unexpected_responses,
    /// … duplicate READ, atomic, ATOMIC WRITE or FLUSH requests no responder resource
    /// matches (a FLUSH never has one: it is answered with NAK Invalid Request).
    dropped_unmatched_duplicates,
    /// XRC target: requests whose XRCETH names no XRC SRQ of the QP's domain (each is
    /// answered with NAK Invalid Request; counted here, not in `dropped_packets`).
    bad_xrc_srqn,
    /// Responder output (ACKs, responses) discarded because its queue was full.
    dropped_responses,
    /// Datagram transports (UD, GSI): … because the DETH Q_Key is not the QP's (IBA
    /// 10.2.5; the port's Q_Key violation counter).
    dropped_bad_qkey,
    /// Datagram transports: … because no receive WQE was posted (UD has no RNR NAK).
    dropped_no_receive,
    /// Datagram transports: … because the payload is larger than the path MTU.
    dropped_too_long,
    /// Datagram transports: … because the receive WQE is smaller than the 40-byte GRH area
    /// plus the payload (the WQE completes with `LOC_LEN_ERR`).
    dropped_recv_too_small,
    /// UC: packets of a message being discarded, up to the next FIRST/ONLY: after a PSN
    /// gap, an opcode out of sequence (a MIDDLE/LAST without its FIRST) or an error in an
    /// earlier packet of the message.
    dropped_uc_sequence,
    /// UC: packets with a PSN before the expected one (duplicates or stale packets; never
    /// executed again).
    dropped_duplicates,
    /// UC: a SEND's FIRST/ONLY or a WRITE with immediate's last packet found no receive
    /// WQE (RC answers with an RNR NAK instead).
    dropped_no_recv_wqe,
    /// UC: WRITE packets refused: the QP lacks remote WRITE access, or the R_Key, bounds
    /// or permissions do not allow it.
    dropped_remote_access,
    /// UC: packets violating the length rules: PMTU segmentation, RETH length, a SEND
    /// longer than its receive WQE.
    dropped_length,
    /// UC: incoming messages discarded after part of them had been seen.
    messages_dropped,
}
