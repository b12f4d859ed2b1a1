//! CM: the bodies of Communication Management messages (IBA Vol 1 §12.6).
//!
//! A CM message fills the 232 bytes of class data after the 24-byte MAD common header
//! ([`crate::mad`]); offsets here are relative to the start of the CM message (MAD offset
//! − 24). Each message has a view (`Req<T>`, `Rep<T>`, …: typed accessors over a buffer,
//! `new_checked` validates the length once and then no accessor panics) and a repr
//! (`ReqRepr`, …: `parse`, `validate`, `emit`, `parse(emit(x)) == x`). Private data is a
//! fixed-size array: the CM carries no length for it, every message fills its 232 bytes.
//!
//! [`CmMad`] ties a MAD common header and any one message together for a whole 256-byte
//! MAD. [`rdma_cm`] holds what the RDMA CM puts on top: the IP-based service IDs and the
//! 36-byte address header at the start of REQ / SIDR_REQ private data.
//!
//! Bit positions follow the specification's tables, which number bits from the most
//! significant bit of a byte (the layout of IBA Vol 1 Tables 106-120):
//!
//! ```text
//! REQ      0 LocalCommID · 8 ServiceID · 16 LocalCAGUID · 28 LocalQ_Key
//!          32 LocalQPN(24) ResponderResources(8) · 36 LocalEECN(24) InitiatorDepth(8)
//!          40 RemoteEECN(24) · 43 RemoteCMRespTimeout(5) TransportService(2) E2EFC(1)
//!          44 StartingPSN(24) · 47 LocalCMRespTimeout(5) RetryCount(3) · 48 P_Key
//!          50 PathMTU(4) RDCExists(1) RNRRetry(3) · 51 MaxCMRetries(4) SRQ(1) ExtTransport(3)
//!          52 primary path (44 bytes) · 96 alternate path (44 bytes; 139 bit 5 SAP)
//!          140 private data (92)
//! path     +0 LocalLID · +2 RemoteLID · +4 LocalGID · +20 RemoteGID
//!          +36 FlowLabel(20) rsv(6) PacketRate(6) · +40 TrafficClass · +41 HopLimit
//!          +42 SL(4) SubnetLocal(1) · +43 LocalACKTimeout(5)
//! MRA      0 LocalCommID · 4 RemoteCommID · 8 MessageMRAed(2) · 9 ServiceTimeout(5) · 10 PD(222)
//! REJ      0 LocalCommID · 4 RemoteCommID · 8 MessageRejected(2) · 9 RejectInfoLength(7)
//!          10 Reason(16) · 12 ARI(72) · 84 PD(148)
//! REP      0 LocalCommID · 4 RemoteCommID · 8 LocalQ_Key · 12 LocalQPN(24) · 16 LocalEECN(24)
//!          20 StartingPSN(24) · 24 ResponderResources · 25 InitiatorDepth
//!          26 TargetACKDelay(5) FailoverAccepted(2) E2EFC(1) · 27 RNRRetry(3) SRQ(1)
//!          28 LocalCAGUID · 36 PD(196)
//! RTU/DREP 0 LocalCommID · 4 RemoteCommID · 8 PD(224)
//! DREQ     0 LocalCommID · 4 RemoteCommID · 8 RemoteQPN/EECN(24) · 12 PD(220)
//! LAP      0 LocalCommID · 4 RemoteCommID · 12 RemoteQPN/EECN(24) · 15 RemoteCMRespTimeout(5)
//!          20 AltLocalLID · 22 AltRemoteLID · 24 AltLocalGID · 40 AltRemoteGID
//!          56 AltFlowLabel(20) · 59 AltTrafficClass · 60 AltHopLimit · 61 AltPacketRate(6)
//!          62 AltSL(4) AltSubnetLocal(1) · 63 AltLocalACKTimeout(5) · 64 PD(168)
//! APR      0 LocalCommID · 4 RemoteCommID · 8 AdditionalInfoLength · 9 APStatus
//!          12 AdditionalInfo(72) · 84 PD(148)
//! SIDR_REQ 0 RequestID · 4 P_Key · 8 ServiceID · 16 PD(216)
//! SIDR_REP 0 RequestID · 4 Status · 5 AdditionalInfoLength · 8 QPN(24) · 12 ServiceID
//!          20 Q_Key · 24 AdditionalInfo(72) · 96 PD(136)
//! ```

pub mod class_port_info;
mod fields;
pub mod rdma_cm;

pub use class_port_info::{ClassPortInfoRepr, PortInfoTarget, CLASS_PORT_INFO_LEN};

use crate::error::{check_len, HeaderKind, WireError};
use crate::mad::{self, cm_attr};
use fields::*;

/// Length of every CM message body (the MAD class data): 232 bytes.
pub const LEN: usize = mad::DATA_LEN;

/// Private data lengths per message (IBA Vol 1 Tables 106-120).
pub mod private_data_len {
    /// REQ.
    pub const REQ: usize = 92;
    /// MRA.
    pub const MRA: usize = 222;
    /// REJ.
    pub const REJ: usize = 148;
    /// REP.
    pub const REP: usize = 196;
    /// RTU.
    pub const RTU: usize = 224;
    /// DREQ.
    pub const DREQ: usize = 220;
    /// DREP.
    pub const DREP: usize = 224;
    /// LAP.
    pub const LAP: usize = 168;
    /// APR.
    pub const APR: usize = 148;
    /// SIDR_REQ.
    pub const SIDR_REQ: usize = 216;
    /// SIDR_REP.
    pub const SIDR_REP: usize = 136;
}
use private_data_len as pd;

/// Length of the REJ ARI, the APR and SIDR_REP additional information (72 bytes).
pub const INFO_LEN: usize = 72;

/// REJ reason codes (IBA Vol 1 Table 109).
pub mod rej_reason {
    /// No QP available.
    pub const NO_QP: u16 = 1;
    /// No EE context available.
    pub const NO_EEC: u16 = 2;
    /// No resources available.
    pub const NO_RESOURCES: u16 = 3;
    /// Timeout (the REQ's sender gave up waiting).
    pub const TIMEOUT: u16 = 4;
    /// The REQ asked for something not supported.
    pub const UNSUPPORTED: u16 = 5;
    /// Invalid communication ID.
    pub const INVALID_COMM_ID: u16 = 6;
    /// Invalid communication instance.
    pub const INVALID_COMM_INSTANCE: u16 = 7;
    /// No listener on the service ID.
    pub const INVALID_SERVICE_ID: u16 = 8;
    /// Invalid transport service type.
    pub const INVALID_TRANSPORT_TYPE: u16 = 9;
    /// Stale connection.
    pub const STALE_CONN: u16 = 10;
    /// RDC does not exist.
    pub const RDC_NOT_EXIST: u16 = 11;
    /// Invalid GID.
    pub const INVALID_GID: u16 = 12;
    /// Invalid MTU.
    pub const INVALID_MTU: u16 = 26;
    /// Insufficient responder resources.
    pub const INSUFFICIENT_RESP_RESOURCES: u16 = 27;
    /// Consumer defined (the application rejected).
    pub const CONSUMER_DEFINED: u16 = 28;
    /// Invalid RNR retry count.
    pub const INVALID_RNR_RETRY: u16 = 29;
    /// Duplicate local communication ID.
    pub const DUPLICATE_LOCAL_COMM_ID: u16 = 30;
    /// Invalid class version.
    pub const INVALID_CLASS_VERSION: u16 = 31;
}

/// Values of the 2-bit "message MRAed" / "message rejected" fields.
pub mod msg_kind {
    /// The REQ.
    pub const REQ: u8 = 0;
    /// The REP.
    pub const REP: u8 = 1;
    /// Another message (LAP for an MRA).
    pub const OTHER: u8 = 2;
}

/// SIDR_REP status values (IBA Vol 1 Table 121).
pub mod sidr_status {
    /// The service ID was found; QPN and Q_Key are valid.
    pub const SUCCESS: u8 = 0;
    /// No service is listening on the service ID.
    pub const UNSUPPORTED: u8 = 1;
    /// The service rejected the request.
    pub const REJECT: u8 = 2;
    /// No QP available.
    pub const NO_QP: u8 = 3;
    /// Redirect.
    pub const REDIRECT: u8 = 4;
    /// Unsupported class version.
    pub const UNSUPPORTED_VERSION: u8 = 5;
}

/// APR AP status values (IBA Vol 1 §12.8.2).
pub mod apr_status {
    /// Alternate path loaded.
    pub const SUCCESS: u8 = 0;
    /// Invalid communication ID.
    pub const INVALID_COMM_ID: u8 = 1;
    /// Alternate paths are not supported.
    pub const UNSUPPORTED: u8 = 2;
    /// Rejected by the consumer.
    pub const REJECTED: u8 = 3;
}

fn invalid(field: &'static str, value: u64) -> WireError {
    WireError::InvalidField {
        header: HeaderKind::Cm,
        field,
        value,
    }
}

/// `InvalidField` if `value` does not fit `bits` bits.
fn check_bits(field: &'static str, value: u64, bits: u32) -> Result<(), WireError> {
    if bits < 64 && value >> bits != 0 {
        Err(invalid(field, value))
    } else {
        Ok(())
    }
}

/// Defines a view struct over a CM message with its constructor, length check and one
/// getter/setter pair per field: `getter / setter: Type => (read_fn, write_fn)(args..)`.
macro_rules! cm_view {
    (
        $(#[$doc:meta])*
        $name:ident {
            $( $(#[$fdoc:meta])* $get:ident / $set:ident : $ty:ty => ($rd:ident, $wr:ident)($($arg:expr),*) ),* $(,)?
        }
    ) => {
        $(#[$doc])*
        ///
        /// After `new_checked` no accessor panics; over a short buffer made with
        /// `new_unchecked` missing bytes read as zero and writes to them are dropped.
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub struct $name<T: AsRef<[u8]>> {
            buffer: T,
        }

        impl<T: AsRef<[u8]>> $name<T> {
            /// Wraps `buffer` without checking its length.
            pub const fn new_unchecked(buffer: T) -> Self {
                Self { buffer }
            }

            /// Wraps `buffer` after checking that it holds a whole message ([`LEN`] bytes).
            pub fn new_checked(buffer: T) -> Result<Self, WireError> {
                let v = Self::new_unchecked(buffer);
                v.check_len()?;
                Ok(v)
            }

            /// `Truncated { header: Cm, .. }` if the buffer is shorter than [`LEN`].
            pub fn check_len(&self) -> Result<(), WireError> {
                check_len(HeaderKind::Cm, self.buffer.as_ref(), 0, LEN)
            }

            /// The underlying buffer.
            pub fn into_inner(self) -> T {
                self.buffer
            }

            $(
                $(#[$fdoc])*
                pub fn $get(&self) -> $ty {
                    $rd(self.buffer.as_ref(), $($arg),*)
                }
            )*
        }

        impl<T: AsRef<[u8]> + AsMut<[u8]>> $name<T> {
            /// Zeroes the whole message (reserved bits included) before fields are set.
            pub fn clear(&mut self) {
                let buf = self.buffer.as_mut();
                let n = buf.len().min(LEN);
                if let Some(b) = buf.get_mut(..n) {
                    b.fill(0);
                }
            }

            $(
                #[doc = concat!("Sets `", stringify!($get), "` (excess high bits are dropped).")]
                pub fn $set(&mut self, value: $ty) {
                    $wr(self.buffer.as_mut(), $($arg,)* value)
                }
            )*
        }
    };
}

// The messages, one module each (re-exported: the API is `cm::ReqRepr`, …). They come
// after `cm_view!` so that they can use it.
mod lap;
mod mra;
mod path;
mod rej;
mod rep;
mod req;
mod rtu_dreq;
mod sidr;
pub use lap::*;
pub use mra::*;
pub use path::*;
pub use rej::*;
pub use rep::*;
pub use req::*;
pub use rtu_dreq::*;
pub use sidr::*;

// ---------------------------------------------------------------------------------------
// Whole MADs

/// Any CM message body.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CmMessage {
    /// REQ.
    Req(ReqRepr),
    /// MRA.
    Mra(MraRepr),
    /// REJ.
    Rej(RejRepr),
    /// REP.
    Rep(RepRepr),
    /// RTU.
    Rtu(RtuRepr),
    /// DREQ.
    Dreq(DreqRepr),
    /// DREP.
    Drep(DrepRepr),
    /// LAP.
    Lap(LapRepr),
    /// APR.
    Apr(AprRepr),
    /// SIDR_REQ.
    SidrReq(SidrReqRepr),
    /// SIDR_REP.
    SidrRep(SidrRepRepr),
    /// ClassPortInfo (IBA 13.4.8.1), read with Get and answered with GetResp.
    ClassPortInfo(ClassPortInfoRepr),
    /// An attribute this module has no layout for (vendor attributes): kept as raw class
    /// data so that it re-emits unchanged.
    Other {
        /// The MAD AttributeID.
        attribute_id: u16,
        /// The 232 bytes of class data.
        data: [u8; LEN],
    },
}

impl CmMessage {
    /// The MAD AttributeID of this message.
    pub const fn attribute_id(&self) -> u16 {
        match self {
            CmMessage::Req(_) => cm_attr::REQ,
            CmMessage::Mra(_) => cm_attr::MRA,
            CmMessage::Rej(_) => cm_attr::REJ,
            CmMessage::Rep(_) => cm_attr::REP,
            CmMessage::Rtu(_) => cm_attr::RTU,
            CmMessage::Dreq(_) => cm_attr::DREQ,
            CmMessage::Drep(_) => cm_attr::DREP,
            CmMessage::Lap(_) => cm_attr::LAP,
            CmMessage::Apr(_) => cm_attr::APR,
            CmMessage::SidrReq(_) => cm_attr::SIDR_REQ,
            CmMessage::SidrRep(_) => cm_attr::SIDR_REP,
            CmMessage::ClassPortInfo(_) => cm_attr::CLASS_PORT_INFO,
            CmMessage::Other { attribute_id, .. } => *attribute_id,
        }
    }

    /// Parses the 232-byte class data `data` of a MAD with AttributeID `attribute_id`.
    pub fn parse(attribute_id: u16, data: &[u8]) -> Result<CmMessage, WireError> {
        check_len(HeaderKind::Cm, data, mad::LEN, LEN)?;
        Ok(match attribute_id {
            cm_attr::REQ => CmMessage::Req(ReqRepr::parse(&Req::new_unchecked(data))?),
            cm_attr::MRA => CmMessage::Mra(MraRepr::parse(&Mra::new_unchecked(data))?),
            cm_attr::REJ => CmMessage::Rej(RejRepr::parse(&Rej::new_unchecked(data))?),
            cm_attr::REP => CmMessage::Rep(RepRepr::parse(&Rep::new_unchecked(data))?),
            cm_attr::RTU => CmMessage::Rtu(RtuRepr::parse(&Rtu::new_unchecked(data))?),
            cm_attr::DREQ => CmMessage::Dreq(DreqRepr::parse(&Dreq::new_unchecked(data))?),
            cm_attr::DREP => CmMessage::Drep(DrepRepr::parse(&Drep::new_unchecked(data))?),
            cm_attr::LAP => CmMessage::Lap(LapRepr::parse(&Lap::new_unchecked(data))?),
            cm_attr::APR => CmMessage::Apr(AprRepr::parse(&Apr::new_unchecked(data))?),
            cm_attr::SIDR_REQ => {
                CmMessage::SidrReq(SidrReqRepr::parse(&SidrReq::new_unchecked(data))?)
            }
            cm_attr::SIDR_REP => {
                CmMessage::SidrRep(SidrRepRepr::parse(&SidrRep::new_unchecked(data))?)
            }
            cm_attr::CLASS_PORT_INFO => CmMessage::ClassPortInfo(ClassPortInfoRepr::parse(data)?),
            _ => CmMessage::Other {
                attribute_id,
                data: get(data, 0),
            },
        })
    }

    /// `InvalidField` for a value wider than its field.
    pub fn validate(&self) -> Result<(), WireError> {
        match self {
            CmMessage::Req(r) => r.validate(),
            CmMessage::Mra(r) => r.validate(),
            CmMessage::Rej(r) => r.validate(),
            CmMessage::Rep(r) => r.validate(),
            CmMessage::Rtu(r) => r.validate(),
            CmMessage::Dreq(r) => r.validate(),
            CmMessage::Drep(r) => r.validate(),
            CmMessage::Lap(r) => r.validate(),
            CmMessage::Apr(r) => r.validate(),
            CmMessage::SidrReq(r) => r.validate(),
            CmMessage::SidrRep(r) => r.validate(),
            CmMessage::ClassPortInfo(r) => r.validate(),
            CmMessage::Other { .. } => Ok(()),
        }
    }

    /// Writes the 232 bytes of class data into `data` (`BufferTooSmall` if shorter).
    pub fn emit(&self, data: &mut [u8]) -> Result<(), WireError> {
        if data.len() < LEN {
            return Err(WireError::BufferTooSmall {
                needed: LEN,
                available: data.len(),
            });
        }
        match self {
            CmMessage::Req(r) => r.emit(&mut Req::new_unchecked(data)),
            CmMessage::Mra(r) => r.emit(&mut Mra::new_unchecked(data)),
            CmMessage::Rej(r) => r.emit(&mut Rej::new_unchecked(data)),
            CmMessage::Rep(r) => r.emit(&mut Rep::new_unchecked(data)),
            CmMessage::Rtu(r) => r.emit(&mut Rtu::new_unchecked(data)),
            CmMessage::Dreq(r) => r.emit(&mut Dreq::new_unchecked(data)),
            CmMessage::Drep(r) => r.emit(&mut Drep::new_unchecked(data)),
            CmMessage::Lap(r) => r.emit(&mut Lap::new_unchecked(data)),
            CmMessage::Apr(r) => r.emit(&mut Apr::new_unchecked(data)),
            CmMessage::SidrReq(r) => r.emit(&mut SidrReq::new_unchecked(data)),
            CmMessage::SidrRep(r) => r.emit(&mut SidrRep::new_unchecked(data)),
            CmMessage::ClassPortInfo(r) => r.emit(data.get_mut(..LEN).unwrap_or_default()),
            CmMessage::Other { data: raw, .. } => put(data, 0, *raw),
        }
        Ok(())
    }
}

/// A whole 256-byte CM MAD: the common header and the message it carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CmMad {
    /// The MAD common header (its `attribute_id` agrees with `message`).
    pub header: mad::Repr,
    /// The CM message.
    pub message: CmMessage,
}

impl CmMad {
    /// A CM MAD with the standard header (BaseVersion 1, class 0x07, ClassVersion 2,
    /// method Send, status 0) for `message` with transaction ID `tid`.
    pub fn new(transaction_id: u64, message: CmMessage) -> CmMad {
        CmMad {
            header: mad::Repr {
                base_version: mad::BASE_VERSION,
                mgmt_class: mad::MGMT_CLASS_CM,
                class_version: mad::CM_CLASS_VERSION,
                response: false,
                method: mad::METHOD_SEND,
                status: 0,
                class_specific: 0,
                transaction_id,
                attribute_id: message.attribute_id(),
                attribute_modifier: 0,
            },
            message,
        }
    }

    /// Parses a whole MAD. `BadLength` unless it is [`mad::MAD_LEN`] bytes;
    /// `InvalidField` if the management class is not CM (0x07).
    pub fn parse(bytes: &[u8]) -> Result<CmMad, WireError> {
        if bytes.len() != mad::MAD_LEN {
            return Err(WireError::BadLength {
                header: HeaderKind::Mad,
                field: "MAD length",
                value: bytes.len(),
                expected: mad::MAD_LEN,
            });
        }
        let h = mad::Header::new_checked(bytes)?;
        let header = mad::Repr::parse(&h)?;
        if header.mgmt_class != mad::MGMT_CLASS_CM {
            return Err(WireError::InvalidField {
                header: HeaderKind::Mad,
                field: "mgmt_class",
                value: header.mgmt_class.into(),
            });
        }
        let message = CmMessage::parse(header.attribute_id, h.data())?;
        Ok(CmMad { header, message })
    }

    /// `InvalidField` if the header or the message is invalid, or the header's
    /// AttributeID is not the message's.
    pub fn validate(&self) -> Result<(), WireError> {
        self.header.validate()?;
        if self.header.attribute_id != self.message.attribute_id() {
            return Err(WireError::InvalidField {
                header: HeaderKind::Mad,
                field: "attribute_id",
                value: self.header.attribute_id.into(),
            });
        }
        self.message.validate()
    }

    /// The 256 bytes of the MAD.
    pub fn to_bytes(&self) -> [u8; mad::MAD_LEN] {
        let mut out = [0u8; mad::MAD_LEN];
        self.emit(&mut out);
        out
    }

    /// Writes the MAD into `out`.
    pub fn emit(&self, out: &mut [u8; mad::MAD_LEN]) {
        self.header
            .emit(&mut mad::Header::new_unchecked(&mut out[..]));
        if let Some(data) = out.get_mut(mad::LEN..) {
            // Cannot fail: `data` is exactly LEN bytes.
            let _ = self.message.emit(data);
        }
    }
}

#[cfg(test)]
#[path = "../tests/cm.rs"]
mod tests;
