//! The ClassPortInfo attribute (AttributeID 0x0001) of the CM class: IBA Vol 1 13.4.8.1.
//! Every management class has it; a requester reads it with Get (13.4.5) and the class
//! agent answers with GetResp. Its 72 bytes, big-endian, at the start of the MAD's class
//! data (the rest reserved, zero):
//!
//! | offset | field |
//! |---:|---|
//! | 0 | BaseVersion (8) |
//! | 1 | ClassVersion (8) |
//! | 2 | CapabilityMask (16) |
//! | 4 | CapabilityMask2 (27), RespTimeValue (5) |
//! | 8 | RedirectGID (128) |
//! | 24 | RedirectTC (8), RedirectSL (4), RedirectFL (20) |
//! | 28 | RedirectLID (16) |
//! | 30 | RedirectP_Key (16) |
//! | 32 | reserved (8), RedirectQP (24) |
//! | 36 | RedirectQ_Key (32) |
//! | 40 | TrapGID (128) |
//! | 56 | TrapTC (8), TrapSL (4), TrapFL (20) |
//! | 60 | TrapLID (16) |
//! | 62 | TrapP_Key (16) |
//! | 64 | TrapHL (8), TrapQP (24) |
//! | 68 | TrapQ_Key (32) |

use crate::error::field::{get, put};
use crate::error::{HeaderKind, WireError};

/// Bytes of the attribute (the rest of the class data is reserved).
pub const CLASS_PORT_INFO_LEN: usize = 72;

/// A redirect or trap destination: GID, traffic class, service level, flow label, LID,
/// P_Key, QP and Q_Key (with, for traps, the hop limit).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct PortInfoTarget {
    /// GID.
    pub gid: [u8; 16],
    /// Traffic class.
    pub tc: u8,
    /// Service level (4 bits).
    pub sl: u8,
    /// Flow label (20 bits).
    pub fl: u32,
    /// LID.
    pub lid: u16,
    /// P_Key.
    pub pkey: u16,
    /// QP number (24 bits).
    pub qp: u32,
    /// Q_Key.
    pub qkey: u32,
}

/// A parsed ClassPortInfo.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct ClassPortInfoRepr {
    /// BaseVersion of the MADs the class supports.
    pub base_version: u8,
    /// ClassVersion of the class.
    pub class_version: u8,
    /// CapabilityMask (bit 0 IsTrapSupported, bit 1 IsNoticeSupported; 8-15 class
    /// specific).
    pub capability_mask: u16,
    /// CapabilityMask2 (27 bits).
    pub capability_mask2: u32,
    /// RespTimeValue (5 bits): the most the class agent takes to answer is
    /// 4.096 µs × 2^RespTimeValue.
    pub resp_time_value: u8,
    /// Where the class is redirected (all zero: not redirected).
    pub redirect: PortInfoTarget,
    /// Where traps are sent.
    pub trap: PortInfoTarget,
    /// Hop limit of the traps' GRH.
    pub trap_hl: u8,
}

fn invalid(field: &'static str, value: u64) -> WireError {
    WireError::InvalidField {
        header: HeaderKind::Cm,
        field,
        value,
    }
}

fn be32(data: &[u8], at: usize) -> u32 {
    u32::from_be_bytes(get(data, at))
}

fn be16(data: &[u8], at: usize) -> u16 {
    u16::from_be_bytes(get(data, at))
}

fn target_at(data: &[u8], at: usize) -> PortInfoTarget {
    let tcslfl = be32(data, at + 16);
    PortInfoTarget {
        gid: get(data, at),
        tc: (tcslfl >> 24) as u8,
        sl: ((tcslfl >> 20) & 0xF) as u8,
        fl: tcslfl & 0xF_FFFF,
        lid: be16(data, at + 20),
        pkey: be16(data, at + 22),
        qp: be32(data, at + 24) & 0xFF_FFFF,
        qkey: be32(data, at + 28),
    }
}

fn put_target(data: &mut [u8], at: usize, t: &PortInfoTarget, qp_high_byte: u8) {
    put(data, at, t.gid);
    let tcslfl = u32::from(t.tc) << 24 | u32::from(t.sl & 0xF) << 20 | (t.fl & 0xF_FFFF);
    put(data, at + 16, tcslfl.to_be_bytes());
    put(data, at + 20, t.lid.to_be_bytes());
    put(data, at + 22, t.pkey.to_be_bytes());
    let qp = u32::from(qp_high_byte) << 24 | (t.qp & 0xFF_FFFF);
    put(data, at + 24, qp.to_be_bytes());
    put(data, at + 28, t.qkey.to_be_bytes());
}

impl ClassPortInfoRepr {
    /// Parses the class data `data` (`BadLength` if shorter than
    /// [`CLASS_PORT_INFO_LEN`]). The reserved byte before RedirectQP is ignored.
    pub fn parse(data: &[u8]) -> Result<ClassPortInfoRepr, WireError> {
        if data.len() < CLASS_PORT_INFO_LEN {
            return Err(WireError::BadLength {
                header: HeaderKind::Cm,
                field: "ClassPortInfo",
                value: data.len(),
                expected: CLASS_PORT_INFO_LEN,
            });
        }
        let cap2_resp = be32(data, 4);
        Ok(ClassPortInfoRepr {
            base_version: get::<1>(data, 0)[0],
            class_version: get::<1>(data, 1)[0],
            capability_mask: be16(data, 2),
            capability_mask2: cap2_resp >> 5,
            resp_time_value: (cap2_resp & 0x1F) as u8,
            redirect: target_at(data, 8),
            trap: target_at(data, 40),
            trap_hl: get::<1>(data, 64)[0],
        })
    }

    /// `InvalidField` for a value wider than its field.
    pub fn validate(&self) -> Result<(), WireError> {
        if self.capability_mask2 >> 27 != 0 {
            return Err(invalid("capability_mask2", self.capability_mask2.into()));
        }
        if self.resp_time_value >> 5 != 0 {
            return Err(invalid("resp_time_value", self.resp_time_value.into()));
        }
        for t in [&self.redirect, &self.trap] {
            if t.sl >> 4 != 0 {
                return Err(invalid("service level", t.sl.into()));
            }
            if t.fl >> 20 != 0 {
                return Err(invalid("flow label", t.fl.into()));
            }
            if t.qp >> 24 != 0 {
                return Err(invalid("QP number", t.qp.into()));
            }
        }
        Ok(())
    }

    /// Writes the attribute into `data` and zeroes the rest of it (reserved); values
    /// wider than their fields are cut to their widths ([`Self::validate`] refuses them).
    pub fn emit(&self, data: &mut [u8]) {
        data.fill(0);
        put(data, 0, [self.base_version, self.class_version]);
        put(data, 2, self.capability_mask.to_be_bytes());
        let cap2_resp =
            (self.capability_mask2 & 0x07FF_FFFF) << 5 | u32::from(self.resp_time_value & 0x1F);
        put(data, 4, cap2_resp.to_be_bytes());
        put_target(data, 8, &self.redirect, 0);
        put_target(data, 40, &self.trap, self.trap_hl);
    }
}
