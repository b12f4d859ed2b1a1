//! Address handles: the destination of UD sends, and the address vector inside connected
//! QPs' attributes.

use std::fmt;
use std::net::IpAddr;

use uroce_wire::grh_area::{GrhArea, GRH_AREA_LEN};

use crate::context::{dec, try_inc, ContextCore};
use crate::device::{Device, Gid, PORT_NUM};
use crate::error::{AhFromWcError, CreateAhError};
use crate::pd::PdCore;
use crate::sync::Arc;
use crate::wc::{WcFlags, WorkCompletion};

/// An address vector (`struct ibv_ah_attr` with its `ibv_global_route`). On RoCEv2 every
/// address is global: the destination GID is the peer's IP address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AhAttr {
    /// Destination GID (the peer's RoCEv2 GID).
    pub dgid: Gid,
    /// IPv6 flow label (20 bits).
    pub flow_label: u32,
    /// Index of the source GID in the local GID table.
    pub sgid_index: u8,
    /// IP TTL / hop limit.
    pub hop_limit: u8,
    /// IP traffic class (DSCP + ECN byte).
    pub traffic_class: u8,
    /// Service level.
    pub sl: u8,
    /// Static rate (0 = port rate).
    pub static_rate: u8,
    /// Local port (1).
    pub port_num: u8,
    /// Whether the GRH fields are valid (always true on RoCE).
    pub is_global: bool,
}

impl Default for AhAttr {
    /// An all-zero destination on port 1, hop limit 64, global.
    fn default() -> AhAttr {
        AhAttr {
            dgid: Gid::ZERO,
            flow_label: 0,
            sgid_index: 0,
            hop_limit: 64,
            traffic_class: 0,
            sl: 0,
            static_rate: 0,
            port_num: PORT_NUM,
            is_global: true,
        }
    }
}

impl AhAttr {
    /// An address vector towards `dest` using source GID 0 on port 1.
    pub fn to_ip(dest: IpAddr) -> AhAttr {
        AhAttr {
            dgid: Gid::from_ip(dest),
            ..AhAttr::default()
        }
    }

    /// The address vector that answers a received datagram (`ibv_init_ah_from_wc`;
    /// IBA Vol 1 §11.2.8.2): `grh` is the 40-byte GRH area at the start of the receive
    /// buffer, `wc` the receive completion. The reply goes to the datagram's source
    /// address, from the local GID the datagram was sent to, with its hop limit, traffic
    /// class and flow label; `sl` is the completion's. Create the AH with
    /// [`crate::Pd::create_ah`] and send to `wc.src_qp`.
    ///
    /// # Errors
    /// [`AhFromWcError::NoGrh`] when the completion has no GRH (not a UD/GSI receive),
    /// [`AhFromWcError::Grh`] when the area holds no RoCEv2 IP header,
    /// [`AhFromWcError::Multicast`] / [`AhFromWcError::NotLocal`] when the datagram's
    /// destination is no GID of `device`.
    pub fn from_wc(
        device: &Device,
        grh: &[u8; GRH_AREA_LEN],
        wc: &WorkCompletion,
    ) -> Result<AhAttr, AhFromWcError> {
        if !wc.wc_flags.contains(WcFlags::GRH) {
            return Err(AhFromWcError::NoGrh);
        }
        let area = GrhArea::parse(grh)?;
        if area.dst.is_multicast() {
            return Err(AhFromWcError::Multicast(area.dst));
        }
        let local = Gid::from_ip(area.dst);
        let sgid_index = (0..=u8::MAX)
            .find(|&i| device.valid_gid(u32::from(i)) == Some(local))
            .ok_or(AhFromWcError::NotLocal(area.dst))?;
        Ok(AhAttr {
            dgid: Gid::from_ip(area.src),
            flow_label: area.flow_label,
            sgid_index,
            hop_limit: area.hop_limit,
            traffic_class: area.traffic_class,
            sl: wc.sl,
            ..AhAttr::default()
        })
    }

    /// The destination IP address (IPv4 for an IPv4-mapped GID).
    pub fn dest_ip(&self) -> IpAddr {
        self.dgid.to_ip()
    }

    /// Checks the vector against `device` and returns the source GID it uses.
    pub fn validate(&self, device: &Device) -> Result<Gid, CreateAhError> {
        if self.port_num != PORT_NUM {
            return Err(CreateAhError::InvalidPort(self.port_num));
        }
        if self.dgid.is_zero() {
            return Err(CreateAhError::ZeroDgid);
        }
        if self.flow_label > 0x000f_ffff {
            return Err(CreateAhError::FlowLabel(self.flow_label));
        }
        device
            .valid_gid(u32::from(self.sgid_index))
            .ok_or(CreateAhError::InvalidSgidIndex(self.sgid_index))
    }
}

pub(crate) struct AhCore {
    pub(crate) pd: Arc<PdCore>,
    attr: AhAttr,
    sgid: Gid,
}

impl AhCore {
    pub(crate) fn create(pd: &Arc<PdCore>, attr: &AhAttr) -> Result<Ah, CreateAhError> {
        let ctx: &Arc<ContextCore> = &pd.ctx;
        let sgid = attr.validate(&ctx.device)?;
        let max = ctx.attr().max_ah;
        if !try_inc(&ctx.live.ahs, max) {
            return Err(CreateAhError::Limit { max });
        }
        pd.children.ahs.fetch_add(1, crate::sync::Ordering::AcqRel);
        Ok(Ah {
            r: AhRef {
                core: Arc::new(AhCore {
                    pd: pd.clone(),
                    attr: *attr,
                    sgid,
                }),
            },
        })
    }
}

impl Drop for AhCore {
    fn drop(&mut self) {
        dec(&self.pd.children.ahs);
        dec(&self.pd.ctx.live.ahs);
    }
}

/// A counted reference to an address handle (what UD work requests carry). Cheap to clone;
/// the AH stays valid while any reference exists.
#[derive(Clone)]
pub struct AhRef {
    core: Arc<AhCore>,
}

impl AhRef {
    /// The attributes the AH was created with.
    pub fn attr(&self) -> &AhAttr {
        &self.core.attr
    }

    /// The destination IP address.
    pub fn dest_ip(&self) -> IpAddr {
        self.core.attr.dest_ip()
    }

    /// The source IP address (the local GID the vector uses).
    pub fn src_ip(&self) -> IpAddr {
        self.core.sgid.to_ip()
    }

    /// The id of the protection domain the AH belongs to.
    pub fn pd_id(&self) -> u32 {
        self.core.pd.id
    }

    /// Whether the AH belongs to `pd`.
    pub(crate) fn belongs_to(&self, pd: &Arc<PdCore>) -> bool {
        Arc::ptr_eq(&self.core.pd, pd)
    }
}

impl fmt::Debug for AhRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AhRef")
            .field("dest", &self.dest_ip())
            .field("pd", &self.pd_id())
            .finish()
    }
}

/// An address handle (`ibv_ah`), created by [`crate::Pd::create_ah`].
///
/// Destroying (or dropping) the handle while UD work requests still reference the AH is
/// safe: they hold [`AhRef`]s, and the AH is released with the last one.
#[derive(Debug)]
pub struct Ah {
    r: AhRef,
}

impl Ah {
    /// A counted reference for work requests.
    pub fn reference(&self) -> AhRef {
        self.r.clone()
    }

    /// Destroys the AH (`ibv_destroy_ah`); never fails.
    pub fn destroy(self) {
        drop(self);
    }
}

impl std::ops::Deref for Ah {
    type Target = AhRef;
    fn deref(&self) -> &AhRef {
        &self.r
    }
}
